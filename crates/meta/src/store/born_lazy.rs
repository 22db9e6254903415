//! Removals from the creation index (`born_v1`) that wait. Ending an
//! element removes its (create TID, key) entry, at a random place of the
//! index: a commit of a few thousand random overwrites would rewrite a
//! 4 KiB page of it per overwrite. Instead the removals wait in RAM and are
//! made sorted, all at once, by the transaction during which `BATCH` of
//! them have gathered, by the last transaction at close, and before
//! anything removes the `ends_v1` or `gone_v1` entries that could redo them
//! (prune, `forget_gone`, a rollback). Meanwhile the index also holds
//! entries of ended elements, which readers skip: their live element is
//! gone or was created at another TID (`by_tid::born_after`).
//!
//! After a crash, counter `born_tid` is the last TID after which no
//! removal waited, and `born_inserted` the last TID whose new entries are
//! all in the index. When `born_inserted` is the last TID and `born_tid`
//! is not, the open redoes the removals of the elements that ended after
//! `born_tid`, from `ends_v1` and `gone_v1` (`redo_removals`).

use super::{split_hist_key, MetaWrite};
use crate::error::Result;
use crate::tables::{BORN_INSERTED, BORN_TID};
use parking_lot::Mutex;
use redb::ReadableTable;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Removals gathered before a transaction makes them all (some 10 MiB of
/// RAM with their keys).
pub const BATCH: usize = 1 << 17;

type Entry = (u64, Vec<u8>);

/// The removals waiting, made by transactions committed earlier.
pub struct BornPending {
    waiting: Mutex<Vec<Entry>>,
    batch: AtomicUsize,
}

impl Default for BornPending {
    fn default() -> Self {
        BornPending {
            waiting: Mutex::default(),
            batch: AtomicUsize::new(BATCH),
        }
    }
}

impl BornPending {
    /// Changes the batch size (tests).
    pub fn set_batch(&self, n: usize) {
        self.batch.store(n.max(1), Relaxed);
    }

    pub fn len(&self) -> usize {
        self.waiting.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// After a committed transaction (`MetaStore::write` holds its lock
    /// until this is done, so no other one saw the list meanwhile).
    pub(super) fn settle(&self, out: BornOut) {
        let mut w = self.waiting.lock();
        if out.drained {
            w.clear();
        }
        w.extend(out.kept);
    }
}

/// What the open did to the creation index.
pub enum BornRepair {
    /// The last write transaction left it up to date.
    Kept,
    /// Made this many removals a crash left waiting.
    Redone(u64),
    /// Rebuilt it from `live_v1` with this many entries.
    Rebuilt(u64),
}

/// What a committed transaction leaves of the waiting removals.
pub(super) struct BornOut {
    /// It made those that waited before it.
    drained: bool,
    /// Its own, still to make.
    kept: Vec<Entry>,
}

/// The state of one transaction's removals.
#[derive(Default)]
pub(super) struct BornTxn {
    /// Removals this transaction asked for and has not made.
    gone: Vec<Entry>,
    /// It made the ones waiting before it.
    drained: bool,
    /// Make every removal before the commit (`MetaStore::drain`).
    drain_all: bool,
}

impl MetaWrite<'_> {
    /// The entry of the element created at `create_tid` under `key` is to
    /// go (the element ended).
    pub(super) fn born_gone(&mut self, create_tid: u64, key: &[u8]) {
        self.born_txn.gone.push((create_tid, key.to_vec()));
    }

    /// Whether any removal waits (this transaction's or an earlier one's).
    fn born_waits(&self) -> bool {
        !self.born_txn.gone.is_empty() || (!self.born_txn.drained && !self.born_waiting.is_empty())
    }

    /// Makes every waiting removal now, in key order.
    pub(super) fn drain_born(&mut self) -> Result<()> {
        let mut all = std::mem::take(&mut self.born_txn.gone);
        if !self.born_txn.drained {
            all.extend(self.born_waiting.waiting.lock().iter().cloned());
            self.born_txn.drained = true;
        }
        self.remove_entries(all)?;
        Ok(())
    }

    /// Removes these entries from the index, in key order; returns how
    /// many were there.
    fn remove_entries(&mut self, mut all: Vec<Entry>) -> Result<u64> {
        all.sort_unstable();
        all.dedup();
        let mut n = 0;
        for (tid, key) in &all {
            n += u64::from(self.born.remove((*tid, key.as_slice()))?.is_some());
        }
        Ok(n)
    }

    /// Before `ends_v1` or `gone_v1` entries up to `cutoff` are removed:
    /// if one of them may be what redoes a waiting removal after a crash
    /// (it ended at or after `born_tid`), the removals are made first.
    pub(super) fn drain_born_before(&mut self, cutoff: u64) -> Result<()> {
        if cutoff >= self.counter(BORN_TID)? && self.born_waits() {
            self.drain_born()?;
        }
        Ok(())
    }

    /// Asks for every waiting removal to be made by this transaction.
    pub(super) fn drain_all_born(&mut self) {
        self.born_txn.drain_all = true;
    }

    /// At the end of the transaction: makes the removals when a batch has
    /// gathered (or when asked), and sets the counters.
    pub(super) fn finish_born(&mut self) -> Result<BornOut> {
        let waiting = match self.born_txn.drained {
            true => 0,
            false => self.born_waiting.len(),
        };
        let due = waiting + self.born_txn.gone.len() >= self.born_waiting.batch.load(Relaxed);
        if (due || self.born_txn.drain_all) && self.born_waits() {
            self.drain_born()?;
        }
        let last = self.counter("last_tid")?;
        self.set_counter(BORN_INSERTED, last)?;
        if !self.born_waits() {
            self.set_counter(BORN_TID, last)?;
        }
        Ok(BornOut {
            drained: self.born_txn.drained,
            kept: std::mem::take(&mut self.born_txn.gone),
        })
    }

    /// Brings the index up to date at open, unless the last write
    /// transaction left it so: redoes the removals a crash left waiting,
    /// or rebuilds it from `live_v1` when a release without the index (or
    /// without `born_inserted`) wrote the pool last.
    pub fn ensure_born_index(&mut self) -> Result<BornRepair> {
        let last = self.counter("last_tid")?;
        let clean = self.counters.get(BORN_TID)?.map(|v| v.value());
        if clean == Some(last) {
            return Ok(BornRepair::Kept);
        }
        let inserted = self.counters.get(BORN_INSERTED)?.map(|v| v.value());
        if let (Some(clean), Some(inserted)) = (clean, inserted) {
            if inserted == last && clean < last {
                return Ok(BornRepair::Redone(self.redo_removals(clean)?));
            }
        }
        self.born.retain(|_, _| false)?;
        let mut n = 0;
        for r in self.live.iter()? {
            let (k, v) = r?;
            let create_tid = crate::element::tid_of(k.value(), v.value())?;
            self.born.insert((create_tid, k.value()), ())?;
            n += 1;
        }
        Ok(BornRepair::Rebuilt(n))
    }

    /// At open, after a crash left removals unmade (see the module
    /// comment): makes those of the elements that ended after `clean` (and
    /// at it, to be safe: a removal that is made twice costs nothing).
    /// Returns how many entries went.
    fn redo_removals(&mut self, clean: u64) -> Result<u64> {
        let from = (clean, &[][..]);
        let mut all = Vec::new();
        for r in self.ends.range(from..)?.chain(self.gone.range(from..)?) {
            let (k, _) = r?;
            let (key, create_tid) = split_hist_key(k.value().1)?;
            all.push((create_tid, key.as_bytes().to_vec()));
        }
        self.remove_entries(all)
    }
}

#[cfg(test)]
mod tests {
    use super::super::MetaStore;
    use crate::error::MetaError;
    use crate::key::{ElemKey, RecordType};
    use crate::tables::{BORN, BORN_TID};
    use redb::{ReadableDatabase, ReadableTableMetadata};

    fn k(i: u64) -> ElemKey {
        ElemKey::new(i, RecordType::Inode, &[])
    }

    /// Puts `keys` at `tid`, the new last TID.
    fn put(s: &MetaStore, keys: &[u64], tid: u64) {
        s.write(|w| {
            for &i in keys {
                w.put(&k(i), format!("{i}@{tid}").as_bytes(), tid)?;
            }
            w.set_counter("last_tid", tid)
        })
        .unwrap();
    }

    /// Entries stored in the index, skipped ones included.
    fn stored(s: &MetaStore) -> u64 {
        let db = s.db().unwrap();
        let t = db.begin_read().unwrap();
        t.open_table(BORN).unwrap().len().unwrap()
    }

    /// (create TID, key object) of what readers get.
    fn born(s: &MetaStore) -> Vec<(u64, u64)> {
        let r = s.read().unwrap();
        let v = r.born_after(0).unwrap();
        v.iter().map(|e| (e.create_tid, e.key.obj())).collect()
    }

    /// Drops the store without a drain, as after a crash, and opens it.
    use super::super::tests::dedup_batch_tests::reopen_without_drain as reopen;

    fn clean_tid(s: &MetaStore) -> u64 {
        s.read().unwrap().counter(BORN_TID).unwrap()
    }

    #[test]
    fn removals_wait_readers_skip_their_entries_and_a_batch_makes_them() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        s.born_pending().set_batch(3);
        put(&s, &[1, 2, 3], 1);
        put(&s, &[1, 2], 2);
        assert_eq!(s.born_pending().len(), 2);
        assert_eq!(stored(&s), 5, "two entries wait for their removal");
        assert_eq!(born(&s), vec![(1, 3), (2, 1), (2, 2)]);
        assert_eq!(clean_tid(&s), 1, "removals wait since TID 1");
        put(&s, &[3], 3);
        assert!(s.born_pending().is_empty(), "the third made the batch");
        assert_eq!(stored(&s), 3);
        assert_eq!(born(&s), vec![(2, 1), (2, 2), (3, 3)]);
        assert_eq!(clean_tid(&s), 3);
        // A failed transaction leaves nothing waiting.
        let r = s.write(|w| {
            w.put(&k(1), b"x", 4)?;
            Err::<(), _>(MetaError::Db("test".into()))
        });
        assert!(r.is_err() && s.born_pending().is_empty());
    }

    #[test]
    fn the_open_after_a_crash_makes_the_removals_that_waited() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        put(&s, &[1, 2, 3], 1);
        put(&s, &[1, 2], 2);
        s.write(|w| {
            w.end(&k(3), 3)?;
            w.set_counter("last_tid", 3)
        })
        .unwrap();
        assert_eq!(stored(&s), 5);
        let s = reopen(s, &path);
        assert_eq!(stored(&s), 2, "the three ended elements' entries went");
        assert_eq!(born(&s), vec![(2, 1), (2, 2)]);
        assert_eq!(clean_tid(&s), 3);
    }

    #[test]
    fn removals_are_made_before_prune_or_a_nohistory_drop_forgets_their_ends() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        put(&s, &[1, 2], 1);
        put(&s, &[1, 2], 2);
        // Element 1's old version is pruned: its end goes with it.
        let pruned = s.write(|w| w.prune(0, 2, &[], false)).unwrap();
        assert_eq!(pruned.len(), 2);
        assert_eq!(stored(&s), 2, "made before prune removed the ends");
        // Element 2 ends without history (its end noted in gone_v1), and
        // the notes are forgotten: the removal is made first.
        s.write(|w| {
            let e = w.end(&k(2), 3)?.unwrap();
            w.remove_ended(&e)?;
            w.note_gone(&e)?;
            w.set_counter("last_tid", 3)
        })
        .unwrap();
        assert_eq!(stored(&s), 2, "waits, its end noted");
        let s = reopen(s, &path);
        assert_eq!(stored(&s), 1, "redone from the note");
        put(&s, &[1], 4);
        s.write(|w| w.forget_gone(4)).unwrap();
        assert_eq!(stored(&s), 1);
        assert_eq!(born(&s), vec![(4, 1)]);
    }

    #[test]
    fn a_rollback_keeps_the_entries_it_restores() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        put(&s, &[1], 1);
        put(&s, &[1], 2);
        s.write(|w| w.rollback_to(1).map(|_| ())).unwrap();
        s.drain().unwrap();
        assert_eq!(born(&s), vec![(1, 1)]);
        assert_eq!(stored(&s), 1);
    }
}
