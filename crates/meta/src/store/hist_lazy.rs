//! Ended elements that wait for their place in `hist_v1`. `hist_v1` is
//! keyed by element key and create TID, so the old version of an element
//! written at a random place (a volume block, a file's extent) lands in a
//! random leaf of a table that holds every version of the history window:
//! a commit of a few thousand random overwrites rewrote a 4 KiB page of it
//! per overwrite. Instead an ended element goes to `fresh_v1`, keyed by
//! (delete TID, history key): the newest delete TID, so an append. The
//! transaction during which `BATCH` of them have gathered, and the close,
//! merge them all into `hist_v1`, sorted, and empty `fresh_v1`.
//!
//! Nothing waits in RAM only: `fresh_v1` is in the same transactions as
//! the rest, so a crash leaves it as consistent as `hist_v1`, and every
//! ended element is in exactly one of the two in any snapshot. Paths that
//! know the delete TID (from `ends_v1`: prune, mirror streams, rollback,
//! the liveness pass) look it up by its exact key in either.
//!
//! Key-ordered lookups (`get_asof`, `scan_asof`, `versions`) need
//! `fresh_v1` by history key: `FreshIndex` holds, in RAM, the (history
//! key, delete TID) of every entry a snapshot may still hold, a superset
//! that each reader checks against its own snapshot. It keeps the entries
//! the last merge moved, for readers whose snapshot predates that merge;
//! a reader older than two merges (counter `hist_merges`, read in its own
//! snapshot), or of a store whose `fresh_v1` could not be indexed (a
//! damaged one opened for salvage), scans its snapshot's `fresh_v1`.
//!
//! Each opening merges what a crash left (`MetaStore::open`), so a release
//! that does not know `fresh_v1` finds it empty unless it opens a pool
//! that crashed under this one before this one opened it again.

use super::{hist_element, MetaWrite};
use crate::element::Element;
use crate::error::Result;
use crate::tables::HIST_MERGES;
use parking_lot::RwLock;
use redb::ReadableTable;
use std::collections::BTreeSet;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Ended elements gathered before a transaction merges them (some 20 MiB
/// of RAM for the index at most, twice this many entries).
pub const BATCH: usize = 1 << 17;

/// `fresh_v1`'s key: (delete TID, history key).
pub(super) type FreshKey = (u64, &'static [u8]);
type Bytes = &'static [u8];
/// (history key, delete TID) of an entry of `fresh_v1`.
type Entry = (Vec<u8>, u64);

/// Whether key `hk` lies in `range`.
pub(super) fn in_range(range: &(Bound<&[u8]>, Bound<&[u8]>), hk: &[u8]) -> bool {
    RangeBounds::<[u8]>::contains(range, hk)
}

/// Where the entries of `fresh_v1` are, by history key (see the top).
pub struct FreshIndex {
    inner: RwLock<Inner>,
    batch: AtomicUsize,
}

#[derive(Default)]
struct Inner {
    /// Every entry added since the last merge (and those of transactions
    /// that did not commit, which no snapshot holds).
    now: BTreeSet<Entry>,
    /// The entries the last merge moved to `hist_v1`: snapshots taken
    /// before it still hold them in `fresh_v1`.
    merged: BTreeSet<Entry>,
    /// `hist_merges` after the last merge.
    merges: u64,
    /// Whether `now` holds what the store held when opened (until then,
    /// readers scan).
    loaded: bool,
}

impl Default for FreshIndex {
    fn default() -> Self {
        FreshIndex {
            inner: RwLock::default(),
            batch: AtomicUsize::new(BATCH),
        }
    }
}

impl FreshIndex {
    /// Indexes what `fresh` holds, in a store whose merge counter is
    /// `merges`. Entries indexed before (a reopen after a failed write,
    /// which may or may not have landed) are kept as merged ones.
    pub(super) fn load(
        &self,
        fresh: &impl ReadableTable<FreshKey, Bytes>,
        merges: u64,
    ) -> Result<()> {
        let mut now = BTreeSet::new();
        for r in fresh.iter()? {
            let (k, _) = r?;
            let (delete_tid, hk) = k.value();
            now.insert((hk.to_vec(), delete_tid));
        }
        let mut g = self.inner.write();
        let old = std::mem::replace(&mut g.now, now);
        g.merged.extend(old);
        g.merges = merges;
        g.loaded = true;
        Ok(())
    }

    /// Notes an entry a write transaction adds (before it commits).
    pub(super) fn add(&self, hk: &[u8], delete_tid: u64) {
        self.inner.write().now.insert((hk.to_vec(), delete_tid));
    }

    /// The entries with a history key in `range` that a snapshot whose
    /// merge counter is `merges` may hold, sorted; None when it is older
    /// than what is kept (the caller scans).
    fn candidates(&self, merges: u64, range: &(Bound<&[u8]>, Bound<&[u8]>)) -> Option<Vec<Entry>> {
        let g = self.inner.read();
        if !g.loaded || merges.saturating_add(1) < g.merges {
            return None;
        }
        let from = match range.0 {
            Bound::Included(k) | Bound::Excluded(k) => Bound::Included((k.to_vec(), 0)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let within = |e: &&Entry| in_range(range, &e.0);
        let beyond = |e: &&Entry| match range.1 {
            Bound::Included(k) => e.0.as_slice() > k,
            Bound::Excluded(k) => e.0.as_slice() >= k,
            Bound::Unbounded => false,
        };
        let mut out: Vec<Entry> = [&g.now, &g.merged]
            .iter()
            .flat_map(|set| {
                set.range((from.clone(), Bound::Unbounded))
                    .take_while(move |e| !beyond(e))
                    .filter(within)
                    .cloned()
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        Some(out)
    }

    /// After a merge committed, leaving the counter at `merges`.
    pub(super) fn merged_all(&self, merges: u64) {
        let mut g = self.inner.write();
        g.merged = std::mem::take(&mut g.now);
        g.merges = merges;
    }

    /// Entries added since the last merge.
    pub fn len(&self) -> usize {
        self.inner.read().now.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets how many gather before a merge (tests use small batches).
    pub fn set_batch(&self, n: usize) {
        self.batch.store(n.max(1), Relaxed);
    }

    fn due(&self) -> bool {
        self.len() >= self.batch.load(Relaxed)
    }
}

/// One snapshot's `fresh_v1`, with the index that finds its entries by
/// history key. `table` is None in a store written before `fresh_v1`
/// existed and opened without a write (salvage).
pub(super) struct FreshView<'a, T> {
    pub table: Option<&'a T>,
    pub index: &'a FreshIndex,
    /// How the entries' values are stored (the store's).
    pub seal: &'a crate::element::ValueSeal,
    /// The snapshot's `hist_merges`.
    pub merges: u64,
}

impl<T: ReadableTable<FreshKey, Bytes>> FreshView<'_, T> {
    /// The ended elements waiting in this snapshot whose history key lies
    /// in `range`, in history key order.
    pub fn range(&self, range: (Bound<&[u8]>, Bound<&[u8]>)) -> Result<Vec<Element>> {
        let Some(t) = self.table else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        match self.index.candidates(self.merges, &range) {
            Some(c) => {
                for (hk, delete_tid) in c {
                    if let Some(v) = t.get((delete_tid, hk.as_slice()))? {
                        out.push(hist_element(self.seal, &hk, v.value())?);
                    }
                }
            }
            None => {
                for r in t.iter()? {
                    let (k, v) = r?;
                    let hk = k.value().1;
                    if in_range(&range, hk) {
                        out.push(hist_element(self.seal, hk, v.value())?);
                    }
                }
                out.sort_by(|a, b| (&a.key, a.create_tid).cmp(&(&b.key, b.create_tid)));
            }
        }
        Ok(out)
    }
}

/// The stored value of the ended element (`delete_tid`, `hk`), waiting in
/// `fresh` or merged into `hist`.
pub(super) fn ended_value(
    fresh: Option<&impl ReadableTable<FreshKey, Bytes>>,
    hist: &impl ReadableTable<Bytes, Bytes>,
    delete_tid: u64,
    hk: &[u8],
) -> Result<Option<Vec<u8>>> {
    if let Some(f) = fresh {
        if let Some(v) = f.get((delete_tid, hk))? {
            return Ok(Some(v.value().to_vec()));
        }
    }
    Ok(hist.get(hk)?.map(|v| v.value().to_vec()))
}

impl MetaWrite<'_> {
    /// Keeps an ended element's stored value until the next merge.
    pub(super) fn keep_ended(&mut self, delete_tid: u64, hk: &[u8], value: &[u8]) -> Result<()> {
        self.fresh.insert((delete_tid, hk), value)?;
        self.fresh_index.add(hk, delete_tid);
        Ok(())
    }

    /// Removes an ended element's stored value from whichever table holds
    /// it; returns it.
    pub(super) fn take_ended(&mut self, delete_tid: u64, hk: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self.fresh.remove((delete_tid, hk))? {
            return Ok(Some(v.value().to_vec()));
        }
        Ok(self.hist.remove(hk)?.map(|v| v.value().to_vec()))
    }

    /// This transaction's view of `fresh_v1`.
    pub(super) fn fresh_view(&self) -> Result<FreshView<'_, redb::Table<'_, FreshKey, Bytes>>> {
        Ok(FreshView {
            table: Some(&self.fresh),
            index: self.fresh_index,
            seal: &self.seal,
            merges: self.counter(HIST_MERGES)?,
        })
    }

    /// At the end of a transaction: merges every waiting ended element into
    /// `hist_v1` when a batch has gathered or `drain_hist` asks for it.
    /// Returns the merge counter when it did.
    pub(super) fn finish_hist(&mut self) -> Result<Option<u64>> {
        if self.fresh_index.is_empty() || !(self.drain_hist || self.fresh_index.due()) {
            return Ok(None);
        }
        let mut all = Vec::with_capacity(self.fresh_index.len());
        for r in self.fresh.iter()? {
            let (k, v) = r?;
            all.push((k.value().1.to_vec(), v.value().to_vec()));
        }
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (hk, v) in &all {
            self.hist.insert(hk.as_slice(), v.as_slice())?;
        }
        self.fresh.retain(|_, _| false)?;
        let merges = self.counter(HIST_MERGES)? + 1;
        self.set_counter(HIST_MERGES, merges)?;
        Ok(Some(merges))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::dedup_batch_tests::reopen_without_drain;
    use super::super::MetaStore;
    use crate::element::Element;
    use crate::error::MetaError;
    use crate::key::{ElemKey, RecordType};
    use crate::tables::{FRESH, HIST};
    use redb::{ReadableDatabase, ReadableTableMetadata};

    fn k(i: u64) -> ElemKey {
        ElemKey::extent(7, i)
    }

    /// (entries in `hist_v1`, entries in `fresh_v1`).
    fn tables(s: &MetaStore) -> (u64, u64) {
        let r = s.db().unwrap().begin_read().unwrap();
        let h = r.open_table(HIST).unwrap().len().unwrap();
        (h, r.open_table(FRESH).unwrap().len().unwrap())
    }

    fn put(s: &MetaStore, i: u64, tid: u64) {
        s.write(|w| w.put(&k(i), format!("{i}@{tid}").as_bytes(), tid))
            .unwrap();
    }

    fn payloads(v: Vec<Element>) -> Vec<String> {
        v.into_iter()
            .map(|e| String::from_utf8(e.payload).unwrap())
            .collect()
    }

    /// What every history reader says of keys 1 and 2 as of TID 15 and
    /// of key 1's versions: the same whether the old versions wait or
    /// were merged.
    fn seen(r: &super::super::MetaRead) -> (String, Vec<String>, Vec<String>, usize) {
        let asof = r.get_asof(&k(1), 15).unwrap().unwrap().payload;
        let scan = payloads(
            r.scan_asof(&ElemKey::prefix(7, RecordType::Extent), 15)
                .unwrap(),
        );
        let versions = payloads(r.versions(&k(1)).unwrap());
        let ended = r.ended_after(0).unwrap().len();
        (String::from_utf8(asof).unwrap(), scan, versions, ended)
    }

    fn expected() -> (String, Vec<String>, Vec<String>, usize) {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        (
            "1@10".into(),
            s(&["1@10", "2@11"]),
            s(&["1@10", "1@20", "1@30"]),
            3,
        )
    }

    /// Key 1 at TIDs 10, 20, 30; key 2 at 11 and 21: three ended versions.
    fn three_ended(s: &MetaStore) {
        for (i, tid) in [(1, 10), (2, 11), (1, 20), (2, 21), (1, 30)] {
            put(s, i, tid);
        }
    }

    #[test]
    fn ended_elements_wait_in_fresh_are_found_and_a_batch_merges_them() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        s.hist_waiting().set_batch(4);
        three_ended(&s);
        assert_eq!(tables(&s), (0, 3), "they wait");
        assert_eq!(s.hist_waiting().len(), 3);
        assert_eq!(seen(&s.read().unwrap()), expected());
        let before = s.read().unwrap();
        put(&s, 2, 40); // the fourth: a batch
        assert_eq!(tables(&s), (4, 0), "merged");
        assert!(s.hist_waiting().is_empty());
        let r = s.read().unwrap();
        assert_eq!(seen(&r), (expected().0, expected().1, expected().2, 4));
        assert_eq!(seen(&before), expected(), "a view from before the merge");
        // A write transaction's own view.
        let asof = s.write(|w| w.get_asof(&k(2), 25)).unwrap().unwrap();
        assert_eq!(asof.payload, b"2@21");
    }

    #[test]
    fn a_view_older_than_two_merges_scans_its_own_fresh_table() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        s.hist_waiting().set_batch(2);
        put(&s, 1, 10);
        put(&s, 2, 11);
        put(&s, 1, 20);
        let old = s.read().unwrap();
        for tid in [21, 30, 31, 40, 41] {
            put(&s, 2, tid); // three merges, at 21, 31 and 41
        }
        assert_eq!(tables(&s).1, 0);
        assert_eq!(old.get_asof(&k(1), 15).unwrap().unwrap().payload, b"1@10");
        assert_eq!(payloads(old.versions(&k(1)).unwrap()), ["1@10", "1@20"]);
        let now = s.read().unwrap();
        assert_eq!(payloads(now.versions(&k(2)).unwrap()).len(), 6);
    }

    #[test]
    fn a_crash_keeps_them_and_the_open_merges_them() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        three_ended(&s);
        let s = reopen_without_drain(s, &path);
        assert_eq!(tables(&s), (3, 0));
        assert_eq!(seen(&s.read().unwrap()), expected());
        put(&s, 1, 40);
        assert_eq!(tables(&s), (3, 1));
        s.drain().unwrap();
        assert_eq!(tables(&s), (4, 0), "the close merges");
    }

    #[test]
    fn prune_and_rollback_take_waiting_elements_from_fresh() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        three_ended(&s);
        let pruned = s
            .write(|w| Ok::<_, MetaError>(w.prune(0, 21, &[], false)?.len()))
            .unwrap();
        assert_eq!(pruned, 2, "1@10 and 2@11 ended by 21");
        assert_eq!(tables(&s), (0, 1));
        s.write(|w| w.rollback_to(25)).unwrap();
        let r = s.read().unwrap();
        assert_eq!(r.get(&k(1)).unwrap().unwrap().payload, b"1@20");
        assert_eq!(tables(&s), (0, 0));
    }

    /// Readers on other threads, some holding their view across many
    /// merges, always see every version their snapshot holds: key
    /// `n % KEYS` is written at TID `n`, so the version of key `k` as of
    /// `t` is the largest such `n` up to `t`.
    #[test]
    fn readers_racing_merges_see_every_version_their_snapshot_holds() {
        use std::sync::atomic::{AtomicBool, Ordering};
        const KEYS: u64 = 5;
        const WRITES: u64 = 400;
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        s.hist_waiting().set_batch(3);
        let done = AtomicBool::new(false);
        let expect = |k: u64, t: u64| (1..=t).rev().find(|n| n % KEYS == k);
        std::thread::scope(|sc| {
            for reader in 0..2u64 {
                let (s, done) = (&s, &done);
                sc.spawn(move || {
                    let mut checked = 0u64;
                    while !done.load(Ordering::SeqCst) || checked == 0 {
                        let r = s.read().unwrap();
                        let last = r.counter("last_tid").unwrap();
                        for round in 0..4u64 {
                            for i in 0..KEYS {
                                let t = (last * (round + 1) / 4 + i + reader) % (last + 1);
                                let got = r.get_asof(&k(i), t).unwrap().map(|e| e.payload);
                                let want = expect(i, t).map(|n| format!("{i}@{n}").into_bytes());
                                assert_eq!(got, want, "key {i} as of {t} (view at {last})");
                                let all = r.versions(&k(i)).unwrap().len();
                                let written = (1..=last).filter(|n| n % KEYS == i).count();
                                assert_eq!(all, written, "versions of key {i} (view at {last})");
                            }
                            // Hold the view while merges go on.
                            std::thread::sleep(std::time::Duration::from_millis(reader * 3));
                        }
                        checked += 1;
                    }
                });
            }
            for n in 1..=WRITES {
                let i = n % KEYS;
                s.write(|w| {
                    w.put(&k(i), format!("{i}@{n}").as_bytes(), n)?;
                    w.set_counter("last_tid", n)
                })
                .unwrap();
            }
            done.store(true, Ordering::SeqCst);
        });
        assert!(
            s.read()
                .unwrap()
                .counter(crate::tables::HIST_MERGES)
                .unwrap()
                > 50
        );
    }
}
