//! Live reference decrements of chunk records that wait. When an extent
//! element ends and its history is kept, the chunk it names loses a live
//! reference (`live` in the chunk record, see the filesystem layer's
//! `history/liveness.rs`). That record sits at a random place of
//! `chunks_v1`: a commit of a few thousand random overwrites would rewrite
//! a 4 KiB page of it per overwrite. Instead the decrements wait in RAM,
//! by chunk id, and the filesystem layer makes them sorted, all at once,
//! in the transaction during which `BATCH` of them have gathered, at close,
//! and before anything removes `ends_v1` entries that could redo them
//! (prune near the present, a rollback: both refuse while some wait).
//!
//! This layer keeps the list and the counters; the filesystem layer, which
//! knows the chunk record's encoding, owes (`owe_live`) and makes
//! (`take_live_debts`) the decrements. A stored count is therefore the
//! true count plus what waits for its chunk (`live_owed`); writers change
//! stored counts by their own deltas, so the two commute.
//!
//! After a crash, counter `live_tid` is a TID up to which every end has
//! its decrement made, and counter `live_refs` is 2 while some wait (1
//! when none do). The filesystem layer's open then makes the decrements
//! of the extents in `ends_v1` after `live_tid` again. A release that does
//! not know the batches recounts every live count when `live_refs` is not
//! 1, as it does for a pool made before live counts existed.

use super::MetaWrite;
use crate::error::{invariant, MetaError, Result};
use crate::tables::{LIVE_REFS, LIVE_TID};
use parking_lot::Mutex;
use redb::ReadableTable;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

/// Decrements gathered before a transaction makes them all (some 10 MiB
/// of RAM at most).
pub const BATCH: usize = 1 << 18;

/// Chunk id -> live references it is still to lose.
pub type Debts = BTreeMap<u64, u64>;

/// `live_refs` while decrements wait on disk (1 when none do).
pub const OWING: u64 = 2;

/// The decrements waiting, owed by transactions committed earlier.
pub struct LiveDebts {
    waiting: Mutex<Debts>,
    batch: AtomicUsize,
    /// The store was opened with decrements a crash left waiting, which
    /// the filesystem layer has not made yet (`live_redone`): until then
    /// no transaction may say that none wait.
    unmade: AtomicBool,
}

impl Default for LiveDebts {
    fn default() -> Self {
        LiveDebts {
            waiting: Mutex::default(),
            batch: AtomicUsize::new(BATCH),
            unmade: AtomicBool::new(false),
        }
    }
}

impl LiveDebts {
    /// Changes the batch size (tests).
    pub fn set_batch(&self, n: usize) {
        self.batch.store(n.max(1), Relaxed);
    }

    /// Chunks with decrements waiting.
    pub fn len(&self) -> usize {
        self.waiting.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The decrements waiting for chunk `id` (a reader under the flush
    /// lock, which no transaction that owes or makes them runs without).
    pub fn owed(&self, id: u64) -> u64 {
        self.waiting.lock().get(&id).copied().unwrap_or(0)
    }

    /// A copy of the waiting decrements (`MetaStore::read_owing` takes it
    /// with its snapshot).
    pub(super) fn copy(&self) -> Debts {
        self.waiting.lock().clone()
    }

    /// At open: whether a crash left decrements waiting (`live_refs`).
    pub(super) fn opened_with(&self, live_refs: u64) {
        self.unmade.store(live_refs == OWING, Relaxed);
    }

    /// After a committed transaction (`MetaStore::write` holds its lock
    /// until this is done, so no other one saw the list meanwhile).
    pub(super) fn settle(&self, out: DebtsOut) {
        if out.redone {
            self.unmade.store(false, Relaxed);
        }
        let mut w = self.waiting.lock();
        if out.taken {
            w.clear();
        }
        for id in out.removed {
            w.remove(&id);
        }
        for (id, n) in out.owed {
            *w.entry(id).or_default() += n;
        }
    }
}

/// The state of one transaction's decrements.
#[derive(Default)]
pub(super) struct DebtsTxn {
    /// Decrements this transaction owes and has not made.
    owed: Debts,
    /// It took the ones waiting before it (to make them).
    taken: bool,
    /// Chunk records it removed: whatever waited for them goes too.
    removed: Vec<u64>,
    /// It made the decrements a crash left waiting.
    redone: bool,
}

/// What a committed transaction leaves of the waiting decrements.
pub(super) struct DebtsOut {
    redone: bool,
    taken: bool,
    removed: Vec<u64>,
    owed: Debts,
}

impl MetaWrite<'_> {
    /// `n` live references of chunk `id` are to go, later.
    pub fn owe_live(&mut self, id: u64, n: u64) {
        *self.live_txn.owed.entry(id).or_default() += n;
    }

    /// The decrements of chunk `id` not yet made: its stored live count
    /// less this is its true one.
    pub fn live_owed(&self, id: u64) -> u64 {
        let mine = self.live_txn.owed.get(&id).copied().unwrap_or(0);
        match self.live_txn.taken {
            true => mine,
            false => {
                mine + self
                    .live_waiting
                    .waiting
                    .lock()
                    .get(&id)
                    .copied()
                    .unwrap_or(0)
            }
        }
    }

    /// Whether owing `adding` more chunks' decrements gathers a batch, or
    /// this transaction already took the waiting ones (it must then leave
    /// none waiting): the caller takes them all (`take_live_debts`) and
    /// makes them.
    pub fn live_due(&self, adding: usize) -> bool {
        if self.live_txn.taken {
            return true;
        }
        let total = self.live_waiting.len() + self.live_txn.owed.len() + adding;
        adding > 0 && total >= self.live_waiting.batch.load(Relaxed)
    }

    /// Whether any decrement waits (this transaction's or an earlier one's).
    pub fn live_waits(&self) -> bool {
        !self.live_txn.owed.is_empty() || (!self.live_txn.taken && !self.live_waiting.is_empty())
    }

    /// Every decrement not yet made, this transaction's and the earlier
    /// ones', for the caller to make now, in chunk id order.
    pub fn take_live_debts(&mut self) -> Debts {
        let mut all = std::mem::take(&mut self.live_txn.owed);
        if !self.live_txn.taken {
            for (id, n) in self.live_waiting.waiting.lock().iter() {
                *all.entry(*id).or_default() += n;
            }
            self.live_txn.taken = true;
        }
        all
    }

    /// The elements kept in history that ended after `since` (the open's
    /// redo of the decrements a crash left waiting).
    pub fn ended_after(&self, since: u64) -> Result<Vec<crate::element::Element>> {
        super::by_tid::ended_after(&self.seal, &self.ends, &self.hist, Some(&self.fresh), since)
    }

    /// This transaction makes the decrements a crash left waiting (the
    /// ends after `live_tid`): the counters may say none wait once it
    /// commits.
    pub fn live_redone(&mut self) {
        self.live_txn.redone = true;
    }

    /// Whether the store was opened with decrements a crash left waiting
    /// and no transaction has made them yet.
    pub fn live_unmade(&self) -> bool {
        self.live_waiting.unmade.load(Relaxed) && !self.live_txn.redone
    }

    /// A chunk record was removed: nothing is owed to it any more.
    pub(super) fn forget_live_debts(&mut self, id: u64) {
        self.live_txn.owed.remove(&id);
        if !self.live_txn.taken {
            self.live_txn.removed.push(id);
        }
    }

    /// Whether a decrement waits that one of the `ends_v1` entries up to
    /// `cutoff` could be what redoes after a crash.
    pub fn live_waits_before(&self, cutoff: u64) -> Result<bool> {
        Ok(self.live_waits() && cutoff >= self.counter(LIVE_TID)?)
    }

    /// Refuses to remove `ends_v1` entries up to `cutoff` while a
    /// decrement that one of them would redo after a crash waits (the
    /// filesystem layer makes them first).
    pub(super) fn no_live_debts_before(&self, cutoff: u64) -> Result<()> {
        if self.live_waits_before(cutoff)? {
            return Err(MetaError::Db(format!(
                "live reference decrements wait for ends up to TID {cutoff}: make them first"
            )));
        }
        Ok(())
    }

    /// At the end of the transaction: moves `live_tid` up when nothing
    /// waits, and keeps `live_refs` saying whether something does (a pool
    /// that has live counts only: see `liveness.rs`).
    pub(super) fn finish_live(&mut self) -> Result<DebtsOut> {
        // `live_tid` says which ends have their decrements made: a
        // transaction that made the earlier ones and left its own waiting
        // would leave that untrue.
        invariant!(
            !self.live_txn.taken || self.live_txn.owed.is_empty(),
            "{} live reference decrements owed after the waiting ones were made",
            self.live_txn.owed.len()
        );
        let refs = self.counter(LIVE_REFS)?;
        if self.live_unmade() {
            invariant!(
                !self.live_waits(),
                "live reference decrements owed before those a crash left were made"
            );
        } else if !self.live_waits() {
            let last_end = self.ends.last()?.map_or(0, |(k, _)| k.value().0);
            let upto = self.counter("last_tid")?.max(last_end);
            if self.counter(LIVE_TID)? != upto {
                self.set_counter(LIVE_TID, upto)?;
            }
            if refs == OWING {
                self.set_counter(LIVE_REFS, 1)?;
            }
        } else if refs == 1 {
            self.set_counter(LIVE_REFS, OWING)?;
        }
        Ok(DebtsOut {
            redone: self.live_txn.redone,
            taken: self.live_txn.taken,
            removed: std::mem::take(&mut self.live_txn.removed),
            owed: std::mem::take(&mut self.live_txn.owed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::dedup_batch_tests::reopen_without_drain;
    use super::super::MetaStore;
    use crate::key::{ElemKey, RecordType};
    use crate::tables::{LIVE_REFS, LIVE_TID};

    fn k(i: u64) -> ElemKey {
        ElemKey::new(i, RecordType::Inode, &[])
    }

    fn counter(s: &MetaStore, name: &str) -> u64 {
        s.read().unwrap().counter(name).unwrap()
    }

    /// Ends the old version of element 1 at `tid` and owes chunk 7 a
    /// decrement for it.
    fn overwrite(s: &MetaStore, tid: u64) {
        s.write(|w| {
            w.put(&k(1), b"v", tid)?;
            w.owe_live(7, 1);
            w.set_counter("last_tid", tid)
        })
        .unwrap();
    }

    #[test]
    fn the_counters_say_whether_decrements_wait_and_removing_their_ends_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        s.write(|w| {
            w.put(&k(1), b"v", 1)?;
            w.set_counter(LIVE_REFS, 1)?;
            w.set_counter("last_tid", 1)
        })
        .unwrap();
        assert_eq!(counter(&s, LIVE_TID), 1);
        overwrite(&s, 2);
        overwrite(&s, 3);
        assert_eq!(s.live_debts().owed(7), 2);
        assert_eq!((counter(&s, LIVE_REFS), counter(&s, LIVE_TID)), (2, 1));
        // Prune and rollback would remove ends after live_tid: refused.
        assert!(s.write(|w| w.prune(0, 3, &[], false)).is_err());
        assert!(s.write(|w| w.rollback_to(1)).is_err());
        // A prune of older ends only goes ahead.
        s.write(|w| w.prune(0, 0, &[], false)).unwrap();
        // Owing after taking would make live_tid untrue: refused.
        let r = s.write(|w| {
            w.take_live_debts();
            w.owe_live(8, 1);
            Ok::<_, crate::MetaError>(())
        });
        assert!(r.is_err() && s.live_debts().owed(7) == 2, "nothing changed");
        // A crash: the store opens owing, and only a transaction that
        // redoes the decrements may say none wait.
        let s = reopen_without_drain(s, &path);
        assert!(s.live_debts().is_empty());
        s.write(|w| w.set_counter("other", 1)).unwrap();
        assert_eq!(counter(&s, LIVE_REFS), 2, "not redone yet");
        s.write(|w| {
            assert_eq!(w.ended_after(1)?.len(), 2, "the ends to redo");
            w.live_redone();
            Ok::<_, crate::MetaError>(())
        })
        .unwrap();
        assert_eq!((counter(&s, LIVE_REFS), counter(&s, LIVE_TID)), (1, 3));
        // Taken and made: none wait.
        overwrite(&s, 4);
        let taken = s
            .write(|w| Ok::<_, crate::MetaError>(w.take_live_debts()))
            .unwrap();
        assert_eq!(taken.into_iter().collect::<Vec<_>>(), vec![(7, 1)]);
        assert!(s.live_debts().is_empty());
        assert_eq!((counter(&s, LIVE_REFS), counter(&s, LIVE_TID)), (1, 4));
        s.write(|w| w.rollback_to(3).map(|_| ())).unwrap();
    }
}
