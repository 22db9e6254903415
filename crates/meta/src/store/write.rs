//! Changing metadata: `MetaWrite`, the tables of one write transaction
//! (elements ended into history, chunks, segments, counters, dedup
//! entries, snapshots, devices), committed by `MetaStore::write`.

use super::*;
use crate::error::invariant;

/// The tables of one write transaction.
pub struct MetaWrite<'t> {
    pub(super) live: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) hist: Table<'t, &'static [u8], &'static [u8]>,
    /// Ended elements not yet merged into `hist` (`store/hist_lazy.rs`).
    pub(super) fresh: Table<'t, FreshKey, &'static [u8]>,
    pub(super) fresh_index: &'t FreshIndex,
    /// Merges every waiting ended element (`MetaStore::drain`).
    pub(super) drain_hist: bool,
    pub(super) ends: Table<'t, (u64, &'static [u8]), ()>,
    pub(super) chunks: Table<'t, u64, &'static [u8]>,
    pub(super) segments: Table<'t, u64, &'static [u8]>,
    pub(super) stripes: Table<'t, u64, &'static [u8]>,
    pub(super) counters: Table<'t, &'static str, u64>,
    pub(super) tids: Table<'t, u64, u64>,
    pub(super) ino_epochs: Table<'t, u64, u64>,
    pub(super) orphans: Table<'t, u64, ()>,
    pub(super) devices: Table<'t, u32, &'static [u8]>,
    pub(super) snapshots: Table<'t, &'static str, &'static [u8]>,
    pub(super) dedup: Table<'t, [u8; 6], [u8; 6]>,
    pub(super) gone: Table<'t, (u64, &'static [u8]), ()>,
    pub(super) born: Table<'t, (u64, &'static [u8]), ()>,
    /// The payloads of the elements this transaction ended, by history
    /// key: `ended_at` takes them from here instead of looking each one up
    /// in `hist` again.
    pub(super) ended: HashMap<Vec<u8>, Vec<u8>>,
    /// Dedup entries: those waiting (`dedup/pending.rs`), those this
    /// transaction adds, and those of the chunks it removes.
    pub(super) pending: &'t Pending,
    pub(super) new_dedup: dedup::pending::Entries,
    pub(super) gone_dedup: Vec<([u8; 6], [u8; 6])>,
    /// Writes every waiting entry to the table (`MetaStore::drain`).
    pub(super) drain_dedup: bool,
    /// Creation index removals: those waiting, and this transaction's
    /// (`store/born_lazy.rs`).
    pub(super) born_waiting: &'t BornPending,
    /// How element values are stored (the store's).
    pub(super) seal: ValueSeal,
    pub(super) born_txn: BornTxn,
    /// Live reference decrements: those waiting, and this transaction's
    /// (`store/live_lazy.rs`).
    pub(super) live_waiting: &'t LiveDebts,
    pub(super) live_txn: DebtsTxn,
}

/// What a committed write transaction leaves of the waiting dedup entries.
pub(super) enum DedupOut {
    /// It wrote these to the table, without those of the chunks it
    /// removed (the first list).
    Written(Vec<([u8; 6], [u8; 6])>, dedup::pending::Entries),
    /// It wrote none: its removals and additions wait.
    Kept(Vec<([u8; 6], [u8; 6])>, dedup::pending::Entries),
}

impl MetaWrite<'_> {
    /// True if element payloads are handed out sealed (an encrypted
    /// mirror opened without its key).
    pub fn is_opaque(&self) -> bool {
        self.seal.is_opaque()
    }

    pub fn get(&self, key: &ElemKey) -> Result<Option<Element>> {
        match self.live.get(key.as_bytes())? {
            Some(v) => live_element(&self.seal, key.as_bytes(), v.value()).map(Some),
            None => Ok(None),
        }
    }

    /// The element with this key as it was at `tid` (see
    /// `MetaRead::get_asof`).
    pub fn get_asof(&self, key: &ElemKey, tid: u64) -> Result<Option<Element>> {
        get_asof(
            &self.seal,
            &self.live,
            &self.hist,
            &self.fresh_view()?,
            key,
            tid,
        )
    }

    /// Ends the live element with this key at `tid` (moves it to history).
    /// Returns it, with its delete_tid set.
    pub fn end(&mut self, key: &ElemKey, tid: u64) -> Result<Option<Element>> {
        let old = match self.live.remove(key.as_bytes())? {
            Some(v) => v.value().to_vec(),
            None => return Ok(None),
        };
        self.move_to_history(key, &old, tid).map(Some)
    }

    /// Moves an element just taken out of `live` (its stored value `old`)
    /// to history, ended at `tid`. A sealed value's seal moves as it is.
    fn move_to_history(&mut self, key: &ElemKey, old: &[u8], tid: u64) -> Result<Element> {
        let (create_tid, payload) = self.seal.decode(key.as_bytes(), old)?;
        // An element ends at a TID after the one that made it (and never
        // at infinity, which marks it live): else history would hold a
        // version no TID ever saw, and prune would misjudge it.
        invariant!(
            create_tid < tid && tid < TID_MAX,
            "element {key} created at TID {create_tid} ended at TID {tid}"
        );
        self.born_gone(create_tid, key.as_bytes());
        let hk = hist_key(key.as_bytes(), create_tid);
        let value = match crate::element::sealed::hist_of_live(&hk, tid, old) {
            Some(v) => v,
            None => crate::element::encode_value(&hk, tid, &payload),
        };
        self.keep_ended(tid, &hk, &value)?;
        self.ends.insert((tid, hk.as_slice()), ())?;
        self.ended.insert(hk, payload.clone());
        Ok(Element {
            key: key.clone(),
            create_tid,
            delete_tid: tid,
            payload,
        })
    }

    /// Removes the live element under `key` without keeping it in history
    /// (a mirror replacing its own first elements with its source's).
    pub fn remove_live(&mut self, key: &ElemKey) -> Result<bool> {
        let Some(old) = self.live.remove(key.as_bytes())? else {
            return Ok(false);
        };
        let (create_tid, _) = self.seal.decode(key.as_bytes(), old.value())?;
        drop(old);
        self.born.remove((create_tid, key.as_bytes()))?;
        Ok(true)
    }

    /// Adds a new live element created at `tid`, ending the current one.
    /// Returns the ended element, if any. One insert into `live` replaces
    /// the current element and hands it back (no separate remove).
    pub fn put(&mut self, key: &ElemKey, payload: &[u8], tid: u64) -> Result<Option<Element>> {
        let value = self.seal.encode(key.as_bytes(), tid, payload)?;
        self.put_value(key, &value, tid)
    }

    /// `put` of an element sealed elsewhere (a sealed mirror stream's
    /// opaque payload, `element::Opaque`), stored as it is whether or not
    /// this store holds the key.
    pub fn put_sealed(
        &mut self,
        key: &ElemKey,
        opaque: &[u8],
        tid: u64,
    ) -> Result<Option<Element>> {
        let value = crate::element::Opaque(opaque).live_value(key.as_bytes(), tid)?;
        self.put_value(key, &value, tid)
    }

    fn put_value(&mut self, key: &ElemKey, value: &[u8], tid: u64) -> Result<Option<Element>> {
        // TID_MAX is the delete TID of a live element, no commit's TID.
        invariant!(tid < TID_MAX, "element {key} made at TID {tid}");
        let old = (self.live.insert(key.as_bytes(), value)?).map(|v| v.value().to_vec());
        let ended = match old {
            Some(old) => Some(self.move_to_history(key, &old, tid)?),
            None => None,
        };
        self.born.insert((tid, key.as_bytes()), ())?;
        Ok(ended)
    }

    /// Physically removes ended elements that no retained TID can see: an
    /// element is kept if some tid in `retained` (sorted) lies in
    /// [create_tid, delete_tid). Considers elements with delete_tid <=
    /// `cutoff` and above `from` (elements ended at or before `from` were
    /// looked at by an earlier prune with the same or more retained TIDs).
    /// With `dry_run` nothing is removed. Returns what was (or would be)
    /// removed, for the caller to release chunks.
    pub fn prune(
        &mut self,
        from: u64,
        cutoff: u64,
        retained: &[u64],
        dry_run: bool,
    ) -> Result<Vec<Element>> {
        debug_assert!(retained.windows(2).all(|w| w[0] <= w[1]));
        let mut victims = Vec::new();
        if from >= cutoff {
            return Ok(Vec::new());
        }
        let lo = (from + 1, &[][..]);
        for r in self.ends.range(lo..=(cutoff, &[0xffu8; 64][..]))? {
            let (k, _) = r?;
            let (delete_tid, hk) = k.value();
            let (key, create_tid) = split_hist_key(hk)?;
            let i = retained.partition_point(|&t| t < create_tid);
            let seen = i < retained.len() && retained[i] < delete_tid;
            if !seen {
                victims.push((delete_tid, hk.to_vec(), key, create_tid));
            }
        }
        let mut removed = Vec::with_capacity(victims.len());
        if dry_run {
            for (delete_tid, hk, key, create_tid) in victims {
                let payload = match ended_value(Some(&self.fresh), &self.hist, delete_tid, &hk)? {
                    Some(v) => self.seal.decode(&hk, &v)?.1,
                    None => Vec::new(),
                };
                removed.push(Element {
                    key,
                    create_tid,
                    delete_tid,
                    payload,
                });
            }
            return Ok(removed);
        }
        self.drain_born_before(cutoff)?;
        if !victims.is_empty() {
            self.no_live_debts_before(cutoff)?;
        }
        for (delete_tid, hk, key, create_tid) in victims {
            self.ends.remove((delete_tid, hk.as_slice()))?;
            let v = self
                .take_ended(delete_tid, &hk)?
                .ok_or_else(|| MetaError::Corrupt {
                    key: key.to_string(),
                    why: "ends index names a missing history element".into(),
                })?;
            let (_, payload) = self.seal.decode(&hk, &v)?;
            removed.push(Element {
                key,
                create_tid,
                delete_tid,
                payload,
            });
        }
        Ok(removed)
    }

    /// The elements this transaction (or any commit at `tid`) ended at
    /// `tid`, from the `ends` index: one range, no scan of history. The
    /// payloads this transaction ended are handed over from RAM (once; a
    /// second call reads them from `hist`).
    pub fn ended_at(&mut self, tid: u64) -> Result<Vec<Element>> {
        let mut out = Vec::new();
        for r in self.ends.range((tid, &[][..])..=(tid, &[0xffu8; 64][..]))? {
            let (k, _) = r?;
            let (delete_tid, hk) = k.value();
            let (key, create_tid) = split_hist_key(hk)?;
            let payload = match self.ended.remove(hk) {
                Some(p) => p,
                None => {
                    let v = ended_value(Some(&self.fresh), &self.hist, delete_tid, hk)?;
                    let v = v.ok_or_else(|| MetaError::Corrupt {
                        key: key.to_string(),
                        why: "ends index names a missing history element".into(),
                    })?;
                    self.seal.decode(hk, &v)?.1
                }
            };
            out.push(Element {
                key,
                create_tid,
                delete_tid,
                payload,
            });
        }
        Ok(out)
    }

    /// Physically removes one ended element (and its `ends` entry), as
    /// prune does; returns false if it was not stored.
    pub fn remove_ended(&mut self, e: &Element) -> Result<bool> {
        Ok(self.take_hist(e)?.is_some())
    }

    /// `remove_ended`, returning the stored history value.
    pub(super) fn take_hist(&mut self, e: &Element) -> Result<Option<Vec<u8>>> {
        let hk = hist_key(e.key.as_bytes(), e.create_tid);
        self.ends.remove((e.delete_tid, hk.as_slice()))?;
        self.take_ended(e.delete_tid, &hk)
    }

    /// Notes that ended element `e` was removed before the prune horizon
    /// (no history kept for it): mirror streams still send its end.
    pub fn note_gone(&mut self, e: &Element) -> Result<()> {
        let hk = hist_key(e.key.as_bytes(), e.create_tid);
        self.gone.insert((e.delete_tid, hk.as_slice()), ())?;
        Ok(())
    }

    /// Forgets the notes of elements that ended at or before `cutoff`
    /// (streams from before it are refused anyway: the prune horizon).
    pub fn forget_gone(&mut self, cutoff: u64) -> Result<()> {
        self.drain_born_before(cutoff)?;
        let upto = (cutoff.saturating_add(1), &[][..]);
        Ok(self.gone.retain_in(..upto, |_, _| false)?)
    }

    /// Live elements with this prefix (for deleting a whole object).
    pub fn scan(&self, prefix: &[u8]) -> Result<Vec<Element>> {
        let (lo, end) = range_bounds(prefix);
        let hi = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let mut out = Vec::new();
        for r in self.live.range::<&[u8]>((lo, hi))? {
            let (k, v) = r?;
            out.push(live_element(&self.seal, k.value(), v.value())?);
        }
        Ok(out)
    }

    pub fn chunk(&self, id: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.chunks.get(id)?.map(|v| v.value().to_vec()))
    }

    pub fn put_chunk(&mut self, id: u64, rec: &[u8]) -> Result<()> {
        self.chunks.insert(id, rec)?;
        Ok(())
    }

    /// Records a new chunk under a fresh id: one that replaced a stored
    /// record would leave that chunk's references naming other bytes.
    pub fn put_new_chunk(&mut self, id: u64, rec: &[u8]) -> Result<()> {
        let replaced = self.chunks.insert(id, rec)?.is_some();
        invariant!(
            !replaced,
            "new chunk {id} recorded over a stored chunk record"
        );
        Ok(())
    }

    pub fn remove_chunk(&mut self, id: u64) -> Result<()> {
        self.chunks.remove(id)?;
        self.forget_live_debts(id);
        Ok(())
    }

    pub fn put_segment(&mut self, id: u64, rec: &[u8]) -> Result<()> {
        self.segments.insert(id, rec)?;
        Ok(())
    }

    pub fn remove_segment(&mut self, id: u64) -> Result<()> {
        self.segments.remove(id)?;
        Ok(())
    }

    pub fn put_stripe(&mut self, id: u64, rec: &[u8]) -> Result<()> {
        self.stripes.insert(id, rec)?;
        Ok(())
    }

    pub fn remove_stripe(&mut self, id: u64) -> Result<()> {
        self.stripes.remove(id)?;
        Ok(())
    }

    pub fn counter(&self, name: &str) -> Result<u64> {
        Ok(self.counters.get(name)?.map_or(0, |v| v.value()))
    }

    pub fn set_counter(&mut self, name: &str, v: u64) -> Result<()> {
        self.counters.insert(name, v)?;
        Ok(())
    }

    /// Starts a new inode number epoch at `first` (the next inode number
    /// this open hands out) and returns it: one more than the last. After
    /// a crash the counter may hand out again numbers the lost run handed
    /// out; their epoch, the generation in a file handle, tells them apart.
    pub fn begin_ino_epoch(&mut self, first: u64) -> Result<u64> {
        let last = self.ino_epochs.last()?.map(|(f, e)| (f.value(), e.value()));
        let (last_first, last_epoch) = last.unwrap_or((0, 0));
        invariant!(
            first >= last_first,
            "an inode epoch starts at {first}, below the last one's start {last_first}"
        );
        let epoch = last_epoch + 1;
        self.ino_epochs.insert(first, epoch)?;
        Ok(epoch)
    }

    /// Records that `tid` was committed at `time_ns`: once per TID, each
    /// above the TIDs recorded before it (the commit's TID order).
    pub fn log_tid(&mut self, tid: u64, time_ns: u64) -> Result<()> {
        let last = self.tids.last()?.map(|(t, _)| t.value());
        invariant!(
            last.is_none_or(|l| tid > l),
            "TID {tid} committed after TID {} (TIDs only grow)",
            last.unwrap_or(0)
        );
        self.tids.insert(tid, time_ns)?;
        Ok(())
    }

    /// Forgets the commit times of the TIDs after `tid` (a fresh mirror
    /// gives its own up for those its source streams).
    pub fn forget_tids_after(&mut self, tid: u64) -> Result<()> {
        let after = tid.saturating_add(1);
        Ok(self.tids.retain_in(after.., |_, _| false)?)
    }

    /// The newest TID committed at or before `time_ns`, searching from
    /// `from` on (TIDs and their times both grow).
    pub fn tid_before_time(&self, from: u64, time_ns: u64) -> Result<Option<u64>> {
        tid_before_time(&self.tids, from, time_ns)
    }

    pub fn add_orphan(&mut self, ino: u64) -> Result<()> {
        self.orphans.insert(ino, ())?;
        Ok(())
    }

    pub fn remove_orphan(&mut self, ino: u64) -> Result<()> {
        self.orphans.remove(ino)?;
        Ok(())
    }

    /// The candidate chunk for this hash (see MetaRead::dedup): this
    /// transaction's entries, then those waiting, then the table's.
    pub fn dedup(&self, hash: &[u8]) -> Result<Option<u64>> {
        let key = dedup::key(hash);
        if let Some(v) = self.new_dedup.get(&key).copied().or(self.pending.get(&key)) {
            return Ok(Some(dedup::decode(v)));
        }
        Ok(self.dedup.get(key)?.map(|v| dedup::decode(v.value())))
    }

    /// Indexes `chunk` under `hash`. An entry of another chunk whose hash
    /// shares the first 6 bytes is replaced (that content loses dedup only).
    /// The entry waits with others and reaches the table in a batch
    /// (`dedup/pending.rs`).
    pub fn put_dedup(&mut self, hash: &[u8], chunk: u64) -> Result<()> {
        if chunk < dedup::MAX_INDEXED_CHUNK {
            self.new_dedup
                .insert(dedup::key(hash), dedup::encode(chunk));
        }
        Ok(())
    }

    /// Removes the index entry of `hash` if it names `chunk`, wherever it
    /// is (this transaction's, waiting, or in the table).
    pub fn remove_dedup(&mut self, hash: &[u8], chunk: u64) -> Result<()> {
        if chunk >= dedup::MAX_INDEXED_CHUNK {
            return Ok(());
        }
        let (key, val) = (dedup::key(hash), dedup::encode(chunk));
        if self.new_dedup.get(&key) == Some(&val) {
            self.new_dedup.remove(&key);
        }
        if self.pending.get(&key) == Some(val) {
            self.gone_dedup.push((key, val));
        }
        if self.dedup.get(key)?.map(|v| v.value()) == Some(val) {
            self.dedup.remove(key)?;
        }
        Ok(())
    }

    /// At the end of the transaction: writes the waiting entries and this
    /// transaction's to the table, sorted, when a batch has gathered (or
    /// on `drain_dedup`); otherwise they wait. What to do with the waiting
    /// entries once the transaction is committed.
    pub(super) fn write_dedup(&mut self) -> Result<DedupOut> {
        let new = std::mem::take(&mut self.new_dedup);
        let gone = std::mem::take(&mut self.gone_dedup);
        if !self.drain_dedup && !self.pending.due(new.len()) {
            return Ok(DedupOut::Kept(gone, new));
        }
        let all = self.pending.merged(&gone, &new);
        for (k, v) in &all {
            self.dedup.insert(*k, *v)?;
        }
        // Every chunk stored so far has its entry in the table now.
        let next = self.counter("next_chunk")?;
        self.set_counter(DEDUP_INDEXED, next)?;
        Ok(DedupOut::Written(gone, all))
    }

    pub fn put_snapshot(&mut self, name: &str, rec: &[u8]) -> Result<()> {
        let stored = self.seal.snapshot_key(name);
        let v = self.seal.seal_snapshot(&stored, rec);
        self.snapshots.insert(stored.as_str(), v.as_slice())?;
        Ok(())
    }

    pub fn remove_snapshot(&mut self, name: &str) -> Result<bool> {
        let stored = self.seal.snapshot_key(name);
        Ok(self.snapshots.remove(stored.as_str())?.is_some())
    }

    pub fn snapshots(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        for r in self.snapshots.iter()? {
            let (k, v) = r?;
            let stored = k.value();
            out.push((
                self.seal.snapshot_name(stored)?,
                self.seal.open_snapshot(stored, v.value())?,
            ));
        }
        Ok(out)
    }

    pub fn snapshot(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let stored = self.seal.snapshot_key(name);
        (self.snapshots.get(stored.as_str())?)
            .map(|v| self.seal.open_snapshot(&stored, v.value()))
            .transpose()
    }

    /// The snapshots as stored (names and records sealed in an encrypted
    /// pool): what a sealed mirror stream carries.
    pub fn snapshots_stored(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        for r in self.snapshots.iter()? {
            let (k, v) = r?;
            out.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Replaces the snapshots with `snaps`, as stored (see
    /// `snapshots_stored`).
    pub fn replace_snapshots_stored(&mut self, snaps: &[(String, Vec<u8>)]) -> Result<()> {
        self.snapshots.retain(|_, _| false)?;
        for (name, rec) in snaps {
            self.snapshots.insert(name.as_str(), rec.as_slice())?;
        }
        Ok(())
    }

    pub fn remove_device(&mut self, id: u32) -> Result<()> {
        self.devices.remove(id)?;
        Ok(())
    }

    pub fn put_device(&mut self, id: u32, desc: &[u8]) -> Result<()> {
        self.devices.insert(id, desc)?;
        Ok(())
    }
}
