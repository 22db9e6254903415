//! Reading committed metadata: `MetaRead`, a consistent read-only view of
//! one committed state (a redb read transaction), and its lookups, scans
//! and as-of reads.

use super::hist_lazy::in_range;
use super::*;

/// A consistent read-only view of the committed metadata.
pub struct MetaRead {
    pub(super) txn: ReadTransaction,
    pub(super) pending: Arc<Pending>,
    pub(super) live: ReadOnlyTable<&'static [u8], &'static [u8]>,
    pub(super) hist: ReadOnlyTable<&'static [u8], &'static [u8]>,
    /// Ended elements not yet merged into `hist` (`hist_lazy.rs`), read
    /// on first need: only history readers want them.
    pub(super) fresh: std::sync::OnceLock<FreshSnap>,
    pub(super) fresh_index: Arc<FreshIndex>,
    pub(super) chunks: ReadOnlyTable<u64, &'static [u8]>,
    /// A view of a damaged store opened for salvage (`open_salvage`):
    /// live elements are checked against history (`not_ended`).
    pub(super) salvage: bool,
    /// In a salvage view, the keys the creation index names.
    pub(super) named: Arc<super::BornNames>,
    /// How element values are stored (the store's).
    pub(super) seal: ValueSeal,
    /// The inode counter of this snapshot, read once (`may_hold_inode`).
    pub(super) ino_bound: std::sync::OnceLock<u64>,
}

/// A read view's `fresh_v1` and its merge counter `hist_merges`.
pub(super) struct FreshSnap {
    /// None in a store that predates the table, opened without a write.
    pub(super) table: Option<ReadOnlyTable<FreshKey, &'static [u8]>>,
    pub(super) merges: u64,
}

impl MetaRead {
    /// Whether this snapshot can hold elements of inode `ino`. A commit
    /// stores the inode counter with the elements it writes (as do a
    /// mirror apply and a rebuild), so an inode numbered at or past the
    /// counter was made after this snapshot and has nothing in it: its
    /// look-ups need no descent of the tree. Always true in a salvage
    /// view (a damaged counter must not hide elements), in a store
    /// without the counter, and when it cannot be read.
    pub fn may_hold_inode(&self, ino: u64) -> bool {
        let bound = *self
            .ino_bound
            .get_or_init(|| match self.counter(crate::tables::NEXT_INO) {
                Ok(n) if n > 0 && !self.salvage => n,
                _ => u64::MAX,
            });
        ino < bound
    }

    /// `get` of an element of inode `key.obj()`: None without a look-up
    /// when this snapshot cannot hold the inode (`may_hold_inode`).
    pub fn get_of_inode(&self, key: &ElemKey) -> Result<Option<Element>> {
        match self.may_hold_inode(key.obj()) {
            true => self.get(key),
            false => Ok(None),
        }
    }

    /// `scan` of elements of inode `ino` (`prefix` within its object):
    /// empty without a look-up when this snapshot cannot hold the inode.
    pub fn scan_of_inode(
        &self,
        ino: u64,
        prefix: &[u8],
        from: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Element>> {
        match self.may_hold_inode(ino) {
            true => self.scan(prefix, from, limit),
            false => Ok(Vec::new()),
        }
    }

    /// This snapshot's `fresh_v1` and merge counter, opened once.
    fn fresh_snap(&self) -> Result<&FreshSnap> {
        if let Some(f) = self.fresh.get() {
            return Ok(f);
        }
        let table = match self.txn.open_table(FRESH) {
            Ok(t) => Some(t),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let merges = self.counter(HIST_MERGES)?;
        Ok(self.fresh.get_or_init(|| FreshSnap { table, merges }))
    }

    /// This snapshot's ended elements that wait for their merge.
    fn fresh_view(&self) -> Result<FreshView<'_, ReadOnlyTable<FreshKey, &'static [u8]>>> {
        let f = self.fresh_snap()?;
        Ok(FreshView {
            table: f.table.as_ref(),
            index: &self.fresh_index,
            seal: &self.seal,
            merges: f.merges,
        })
    }

    /// Every ended element: merged ones, then waiting ones.
    fn each_ended(&self, mut f: impl FnMut(&[u8], &[u8]) -> Result<()>) -> Result<()> {
        for r in self.hist.iter()? {
            let (k, v) = r?;
            f(k.value(), v.value())?;
        }
        if let Some(t) = &self.fresh_snap()?.table {
            for r in t.iter()? {
                let (k, v) = r?;
                f(k.value().1, v.value())?;
            }
        }
        Ok(())
    }

    /// The live element with this key.
    pub fn get(&self, key: &ElemKey) -> Result<Option<Element>> {
        guarded(|| {
            if self.salvage {
                return match self.by_pass(key)? {
                    Some(v) => self
                        .not_ended(live_element(&self.seal, key.as_bytes(), &v)?)
                        .map(Some),
                    None => Ok(None),
                };
            }
            match self.live.get(key.as_bytes())? {
                Some(v) => live_element(&self.seal, key.as_bytes(), v.value()).map(Some),
                None => Ok(None),
            }
        })
    }

    /// In a salvage view, a key is looked up by a pass from the first
    /// record of its object, as `scan` (and so `cairn check`'s
    /// walk) finds it, not by a direct descent: a damaged separator key in
    /// a branch page can mislead a descent to another leaf (a hole read as
    /// zeros, a name missing), and then the mount and check would not agree
    /// on what is intact. A pass that fails is an error.
    fn by_pass(&self, key: &ElemKey) -> Result<Option<Vec<u8>>> {
        let k = key.as_bytes();
        // To the object's end, not to the key: a damaged page can hold a
        // key out of order, which would end a pass bounded by the key.
        let (lo, end) = range_bounds(&k[..k.len().min(8)]);
        let hi = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        for r in self.live.range::<&[u8]>((lo, hi))? {
            let (at, v) = r?;
            if at.value() == k {
                return Ok(Some(v.value().to_vec()));
            }
        }
        self.unreached(std::iter::once(k))?;
        Ok(None)
    }

    /// False in a salvage view whose creation index could not be read
    /// whole: a key no pass finds may be a record the damage hides, so a
    /// hole in a file cannot be vouched for (the reader returns an error).
    pub fn vouches_for_absence(&self) -> bool {
        !self.salvage || self.named.complete
    }

    /// In a salvage view, a key the creation index names that no pass
    /// reached is a record the damage hides: an error, not a hole or a
    /// missing name.
    fn unreached<'k>(&self, mut keys: impl Iterator<Item = &'k [u8]>) -> Result<()> {
        match keys.find(|k| self.named.keys.contains(*k)) {
            Some(k) => Err(MetaError::Corrupt {
                key: ElemKey(k.to_vec()).to_string(),
                why: "named by the creation index but out of reach (a damaged page)".into(),
            }),
            None => Ok(()),
        }
    }

    /// In a store opened for salvage, whose pages were not verified, a
    /// damaged branch page can lead a lookup to a stale leaf of an older
    /// commit, whose records (an overwritten extent...) pass their own
    /// checksums. A live element is served only if one of two other trees
    /// vouches for it and neither says otherwise: history (`hist_v1`,
    /// `fresh_v1`) must not hold its version as ended, and the creation
    /// index (`born_v1`) must hold it. Where neither can be read it is
    /// refused as damaged. (A stale version whose history prune removed and
    /// whose creation entry a crash left cannot be told apart.)
    fn not_ended(&self, e: Element) -> Result<Element> {
        if !self.salvage {
            return Ok(e);
        }
        let stale = |why: &str| MetaError::Corrupt {
            key: e.key.to_string(),
            why: format!("{why} (a stale page of a damaged store)"),
        };
        let ended = guarded(|| self.ended(&e));
        let born = guarded(|| {
            let t = self.txn.open_table(BORN)?;
            Ok(t.get((e.create_tid, e.key.as_bytes()))?.is_some())
        });
        match (ended, born) {
            (Ok(true), _) => Err(stale("a version that history says ended")),
            (_, Ok(false)) => Err(stale("a version the creation index does not hold")),
            (Err(h), Err(_)) => Err(stale(&format!("cannot be verified: {h}"))),
            _ => Ok(e),
        }
    }

    /// True if history holds this version of the element as ended.
    fn ended(&self, e: &Element) -> Result<bool> {
        let hk = hist_key(e.key.as_bytes(), e.create_tid);
        if self.hist.get(hk.as_slice())?.is_some() {
            return Ok(true);
        }
        let waiting = (self.fresh_view()?).range((Bound::Included(&hk), Bound::Included(&hk)))?;
        Ok(!waiting.is_empty())
    }

    /// The element with this key as it was at `tid`: the live one if it was
    /// created by then, else the newest ended one created by then and
    /// deleted after it. Two B-tree lookups whatever the history length,
    /// and one for each version of the key waiting for its merge.
    pub fn get_asof(&self, key: &ElemKey, tid: u64) -> Result<Option<Element>> {
        guarded(|| {
            get_asof(
                &self.seal,
                &self.live,
                &self.hist,
                &self.fresh_view()?,
                key,
                tid,
            )
        })
    }

    /// Every element with this prefix that was visible at `tid`, in key
    /// order: the live ones created by then merged with the ended ones that
    /// were alive then. Costs the prefix's live elements plus its history.
    pub fn scan_asof(&self, prefix: &[u8], tid: u64) -> Result<Vec<Element>> {
        guarded(|| {
            let (lo, end) = range_bounds(prefix);
            let hi = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let mut out = Vec::new();
            for r in self.live.range::<&[u8]>((lo, hi))? {
                let (k, v) = r?;
                let e = live_element(&self.seal, k.value(), v.value())?;
                if e.create_tid <= tid {
                    out.push(e);
                }
            }
            for r in self.hist.range::<&[u8]>((lo, hi))? {
                let (k, v) = r?;
                let e = hist_element(&self.seal, k.value(), v.value())?;
                if e.visible_at(tid) {
                    out.push(e);
                }
            }
            let waiting = self.fresh_view()?.range((lo, hi))?;
            out.extend(waiting.into_iter().filter(|e| e.visible_at(tid)));
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
    }

    /// Every version of one element still stored, oldest first (ended ones
    /// from history, then the live one).
    pub fn versions(&self, key: &ElemKey) -> Result<Vec<Element>> {
        guarded(|| {
            let lo = hist_key(key.as_bytes(), 0);
            let hi = hist_key(key.as_bytes(), TID_MAX);
            let mut out = Vec::new();
            for r in self.hist.range::<&[u8]>(lo.as_slice()..=hi.as_slice())? {
                let (k, v) = r?;
                out.push(hist_element(&self.seal, k.value(), v.value())?);
            }
            let waiting = (Bound::Included(&lo[..]), Bound::Included(&hi[..]));
            out.extend(self.fresh_view()?.range(waiting)?);
            out.sort_by_key(|e| e.create_tid);
            out.extend(self.get(key)?);
            Ok(out)
        })
    }

    /// All live elements whose key starts with `prefix`, in key order,
    /// starting at `from` (inclusive) if given.
    pub fn scan(&self, prefix: &[u8], from: Option<&[u8]>, limit: usize) -> Result<Vec<Element>> {
        guarded(|| {
            let (lo, end) = range_bounds(prefix);
            let lo = from.map_or(lo, Bound::Included);
            let hi = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            // A salvage view starts every pass at its object's first
            // record, as `get` does (`by_pass`), and skips to `lo`.
            let obj = self
                .salvage
                .then(|| range_bounds(&prefix[..prefix.len().min(8)]));
            let (start, stop) = match &obj {
                Some((start, end)) => (
                    *start,
                    end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
                ),
                None => (lo, hi),
            };
            let mut out = Vec::new();
            for r in self.live.range::<&[u8]>((start, stop))? {
                let (k, v) = r?;
                let e = live_element(&self.seal, k.value(), v.value())?;
                if !self.salvage {
                    out.push(e);
                } else if in_range(&(lo, hi), k.value()) {
                    // A salvage pass goes to the object's end and keeps
                    // what lies in the range asked (a damaged page can hold
                    // a key out of order).
                    out.push(self.not_ended(e)?);
                } else {
                    continue;
                }
                if out.len() >= limit {
                    break;
                }
            }
            if self.salvage {
                // Up to the last key returned when the limit cut the scan.
                let last = out.last().filter(|_| out.len() >= limit);
                let hi = last.map_or(hi, |e| Bound::Included(e.key.as_bytes()));
                let got: std::collections::HashSet<&[u8]> =
                    out.iter().map(|e| e.key.as_bytes()).collect();
                let named = self.named.keys.range::<[u8], _>((lo, hi));
                self.unreached(named.map(|k| k.as_slice()).filter(|k| !got.contains(k)))?;
            }
            Ok(out)
        })
    }

    /// Every live and ended element, for check and scrub: calls `f` with
    /// each stored key and the element, or the error that decoding it gave
    /// (the walk goes on past damaged records; it stops only where redb
    /// cannot go on).
    pub fn for_each_checked(&self, mut f: impl FnMut(&[u8], Result<Element>)) -> Result<()> {
        guarded(|| {
            for r in self.live.iter()? {
                let (k, v) = r?;
                f(k.value(), live_element(&self.seal, k.value(), v.value()));
            }
            self.each_ended(|k, v| {
                f(k, hist_element(&self.seal, k, v));
                Ok(())
            })
        })
    }

    /// Every ended element (for check): calls `f` on each.
    pub fn for_each_hist(&self, mut f: impl FnMut(Element)) -> Result<()> {
        guarded(|| {
            self.each_ended(|k, v| {
                f(hist_element(&self.seal, k, v)?);
                Ok(())
            })
        })
    }

    /// Every live element (for check): calls `f` on each.
    /// How many live elements are of record type `t`, from their keys
    /// alone (no value is read or opened: an encrypted pool's inode count
    /// after mount decrypted every element).
    pub fn count_live(&self, t: RecordType) -> Result<u64> {
        guarded(|| {
            let mut n = 0;
            for r in self.live.iter()? {
                let (k, _) = r?;
                n += u64::from(ElemKey::rtype_of(k.value()) == Some(t));
            }
            Ok(n)
        })
    }

    pub fn for_each_live(&self, mut f: impl FnMut(Element)) -> Result<()> {
        guarded(|| {
            for r in self.live.iter()? {
                let (k, v) = r?;
                f(live_element(&self.seal, k.value(), v.value())?);
            }
            Ok(())
        })
    }

    pub fn chunk(&self, id: u64) -> Result<Option<Vec<u8>>> {
        guarded(|| Ok(self.chunks.get(id)?.map(|v| v.value().to_vec())))
    }

    pub fn for_each_chunk(&self, mut f: impl FnMut(u64, &[u8])) -> Result<()> {
        guarded(|| {
            for r in self.chunks.iter()? {
                let (k, v) = r?;
                f(k.value(), v.value());
            }
            Ok(())
        })
    }

    pub fn segments(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        guarded(|| {
            let t = self.txn.open_table(SEGMENTS)?;
            let mut out = Vec::new();
            for r in t.iter()? {
                let (k, v) = r?;
                out.push((k.value(), v.value().to_vec()));
            }
            Ok(out)
        })
    }

    /// The stripe records (none in a store made before stripes).
    pub fn stripes(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        guarded(|| {
            let t = match self.txn.open_table(STRIPES) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut out = Vec::new();
            for r in t.iter()? {
                let (k, v) = r?;
                out.push((k.value(), v.value().to_vec()));
            }
            Ok(out)
        })
    }

    /// One segment record, looked up alone: in a damaged store (salvage)
    /// a record can often be reached this way when a full pass stops at a
    /// damaged page before it.
    pub fn segment(&self, id: u64) -> Result<Option<Vec<u8>>> {
        guarded(|| {
            let t = self.txn.open_table(SEGMENTS)?;
            Ok(t.get(id)?.map(|v| v.value().to_vec()))
        })
    }

    /// The segment records a full pass reads before damage stops it, and
    /// what stopped it (None: the pass reached the end). For salvage.
    pub fn segments_until_damage(&self) -> (Vec<(u64, Vec<u8>)>, Option<MetaError>) {
        let mut out = Vec::new();
        let r = guarded(|| {
            let t = self.txn.open_table(SEGMENTS)?;
            for r in t.iter()? {
                let (k, v) = r?;
                out.push((k.value(), v.value().to_vec()));
            }
            Ok(())
        });
        (out, r.err())
    }

    pub fn counter(&self, name: &str) -> Result<u64> {
        guarded(|| {
            let t = self.txn.open_table(COUNTERS)?;
            Ok(t.get(name)?.map_or(0, |v| v.value()))
        })
    }

    /// Every inode number epoch, (first inode number, epoch) in order;
    /// none in a pool made before epochs (or never opened writable since).
    pub fn ino_epochs(&self) -> Result<Vec<(u64, u64)>> {
        guarded(|| {
            let t = match self.txn.open_table(INO_EPOCHS) {
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                t => t?,
            };
            let mut out = Vec::new();
            for r in t.iter()? {
                let (f, e) = r?;
                out.push((f.value(), e.value()));
            }
            Ok(out)
        })
    }

    pub fn orphans(&self) -> Result<Vec<u64>> {
        guarded(|| {
            let t = self.txn.open_table(ORPHANS)?;
            let mut out = Vec::new();
            for r in t.iter()? {
                out.push(r?.0.value());
            }
            Ok(out)
        })
    }

    pub fn devices(&self) -> Result<Vec<(u32, Vec<u8>)>> {
        guarded(|| {
            let t = self.txn.open_table(DEVICES)?;
            let mut out = Vec::new();
            for r in t.iter()? {
                let (k, v) = r?;
                out.push((k.value(), v.value().to_vec()));
            }
            Ok(out)
        })
    }

    /// The chunk the index names for this hash: a candidate whose record
    /// the caller must confirm holds the same full hash (see dedup.rs).
    pub fn dedup(&self, hash: &[u8]) -> Result<Option<u64>> {
        if let Some(v) = self.pending.get(&dedup::key(hash)) {
            return Ok(Some(dedup::decode(v)));
        }
        guarded(|| {
            let t = self.txn.open_table(DEDUP)?;
            Ok(t.get(dedup::key(hash))?.map(|v| dedup::decode(v.value())))
        })
    }

    /// Every dedup index entry: (first 7 hash bytes, chunk id).
    pub fn for_each_dedup(&self, mut f: impl FnMut([u8; 6], u64)) -> Result<()> {
        guarded(|| {
            let t = self.txn.open_table(DEDUP)?;
            for r in t.iter()? {
                let (k, v) = r?;
                f(k.value(), dedup::decode(v.value()));
            }
            Ok(())
        })
    }

    /// Entries in the dedup index and the bytes of the pages that hold it
    /// (keys, values, branch pages and free space inside pages): the most
    /// RAM the index takes when all of it is cached.
    pub fn dedup_size(&self) -> Result<(u64, u64)> {
        guarded(|| {
            let t = self.txn.open_table(DEDUP)?;
            let s = t.stats()?;
            let bytes = s.stored_bytes() + s.metadata_bytes() + s.fragmented_bytes();
            Ok((t.len()? + self.pending.len() as u64, bytes))
        })
    }

    /// All snapshots: name -> encoded record.
    /// The snapshots as stored (names and records sealed in an encrypted
    /// pool): what a sealed mirror stream carries.
    pub fn snapshots_stored(&self) -> Result<Vec<(String, Vec<u8>)>> {
        guarded(|| {
            let t = self.txn.open_table(SNAPSHOTS)?;
            let mut out = Vec::new();
            for r in t.iter()? {
                let (k, v) = r?;
                out.push((k.value().to_string(), v.value().to_vec()));
            }
            Ok(out)
        })
    }

    pub fn snapshots(&self) -> Result<Vec<(String, Vec<u8>)>> {
        guarded(|| {
            let t = self.txn.open_table(SNAPSHOTS)?;
            let mut out = Vec::new();
            for r in t.iter()? {
                let (k, v) = r?;
                let stored = k.value();
                out.push((
                    self.seal.snapshot_name(stored)?,
                    self.seal.open_snapshot(stored, v.value())?,
                ));
            }
            Ok(out)
        })
    }

    /// The newest TID committed at or before `time_ns`.
    pub fn tid_before_time(&self, time_ns: u64) -> Result<Option<u64>> {
        guarded(|| tid_before_time(&self.txn.open_table(TIDS)?, 0, time_ns))
    }

    /// (tid, commit time ns) of the newest commit at or before `tid`.
    pub fn tid_time(&self, tid: u64) -> Result<Option<(u64, u64)>> {
        guarded(|| tid_time(&self.txn.open_table(TIDS)?, tid))
    }

    /// `tid_time` of each of `tids`, in their order, with the table opened
    /// once (a history of many versions asks for each one's time).
    pub fn tid_times(&self, tids: &[u64]) -> Result<Vec<Option<(u64, u64)>>> {
        guarded(|| {
            let t = self.txn.open_table(TIDS)?;
            tids.iter().map(|&tid| tid_time(&t, tid)).collect()
        })
    }

    /// (delete_tid, key, create_tid) of the ended elements removed without
    /// history (`note_gone`) that ended after `since`.
    pub fn gone_after(&self, since: u64) -> Result<Vec<(u64, Vec<u8>, u64)>> {
        guarded(|| {
            let t = self.txn.open_table(GONE)?;
            let mut out = Vec::new();
            for r in t.range((since.saturating_add(1), &[][..])..)? {
                let (k, _) = r?;
                let (tid, hk) = k.value();
                let (key, create) = split_hist_key(hk)?;
                out.push((tid, key.0, create));
            }
            Ok(out)
        })
    }

    /// The live elements created after `since` (the `born_v1` index).
    pub fn born_after(&self, since: u64) -> Result<Vec<Element>> {
        guarded(|| by_tid::born_after(&self.seal, &self.txn.open_table(BORN)?, &self.live, since))
    }

    /// The elements kept in history that ended after `since` (the `ends_v1`
    /// index).
    pub fn ended_after(&self, since: u64) -> Result<Vec<Element>> {
        guarded(|| {
            let ends = self.txn.open_table(ENDS)?;
            by_tid::ended_after(
                &self.seal,
                &ends,
                &self.hist,
                self.fresh_snap()?.table.as_ref(),
                since,
            )
        })
    }

    /// (tid, commit time ns) of every commit after `since`, in order.
    pub fn tids_after(&self, since: u64) -> Result<Vec<(u64, u64)>> {
        guarded(|| {
            let t = self.txn.open_table(TIDS)?;
            let mut out = Vec::new();
            for r in t.range(since.saturating_add(1)..)? {
                let (k, v) = r?;
                out.push((k.value(), v.value()));
            }
            Ok(out)
        })
    }

    /// Ended elements waiting for their merge into `hist_v1` (of those
    /// `sizes` counts).
    pub fn ended_waiting(&self) -> Result<u64> {
        guarded(|| {
            Ok(self
                .fresh_snap()?
                .table
                .as_ref()
                .map(|t| t.len())
                .transpose()?
                .unwrap_or(0))
        })
    }

    /// Numbers of live elements, ended elements and chunks.
    pub fn sizes(&self) -> Result<(u64, u64, u64)> {
        let waiting = self.ended_waiting()?;
        guarded(|| {
            Ok((
                self.live.len()?,
                self.hist.len()? + waiting,
                self.chunks.len()?,
            ))
        })
    }
}

/// (tid, commit time ns) of the newest commit at or before `tid` in the
/// TID table.
fn tid_time(t: &impl ReadableTable<u64, u64>, tid: u64) -> Result<Option<(u64, u64)>> {
    Ok(match t.range(..=tid)?.next_back() {
        Some(r) => {
            let (k, v) = r?;
            Some((k.value(), v.value()))
        }
        None => None,
    })
}
