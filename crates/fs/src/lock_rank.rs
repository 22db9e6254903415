//! The lock order, checked. Each of the filesystem's ordered locks has a
//! rank (docs/writeback-and-intent-log.md, "Locks and their order"): the
//! flush lock, then the intent log, then the state shards in increasing
//! order, then the list of overlays being committed (`flushing`). In builds
//! with debug assertions (tests and the suite), each thread keeps the ranks
//! it holds, and taking a lock whose rank is not above every one it holds
//! panics, naming both, before it waits: a cycle of waits that could
//! deadlock in production fails the first test that takes that path.
//! Release builds keep nothing and check nothing.

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::ops::{Deref, DerefMut};

/// A lock's place in the order: lower ranks are taken first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rank(u32);

impl Rank {
    pub(crate) const FLUSH: Rank = Rank(10);
    pub(crate) const INTENT: Rank = Rank(20);
    /// Shard `i` is `SHARD0 + i`: shards are taken in increasing order.
    const SHARD0: u32 = 100;
    pub(crate) const FLUSHING: Rank = Rank(1000);

    #[allow(clippy::cast_possible_truncation, reason = "i < 512 (asserted)")]
    pub(crate) fn shard(i: usize) -> Rank {
        assert!(i < 512, "shard {i}");
        Rank(Self::SHARD0 + i as u32)
    }

    #[cfg(debug_assertions)]
    fn name(self) -> String {
        match self {
            Rank::FLUSH => "the flush lock".into(),
            Rank::INTENT => "the intent log".into(),
            Rank::FLUSHING => "the committing overlays (flushing)".into(),
            Rank(r) => format!("state shard {}", r - Self::SHARD0),
        }
    }
}

#[cfg(debug_assertions)]
thread_local! {
    static HELD: std::cell::RefCell<Vec<Rank>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One ranked lock this thread holds (or is about to wait for).
#[derive(Debug)]
pub(crate) struct Held {
    #[cfg(debug_assertions)]
    rank: Rank,
}

impl Held {
    /// Notes that this thread takes a lock of `rank`: panics if it holds
    /// one of the same or a higher rank.
    pub(crate) fn take(rank: Rank) -> Held {
        Self::note(rank, true)
    }

    /// Notes a lock of `rank` taken without waiting (`try_lock`), which
    /// cannot close a cycle of waits: not checked against those held.
    fn untimed(rank: Rank) -> Held {
        Self::note(rank, false)
    }

    fn note(rank: Rank, check: bool) -> Held {
        #[cfg(debug_assertions)]
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            let top = h.iter().max().copied().filter(|top| check && *top >= rank);
            if let Some(top) = top {
                drop(h);
                panic!(
                    "lock order: {} taken while holding {} (the order is in docs/ARCHITECTURE.md, \"Locks and their order\")",
                    rank.name(),
                    top.name()
                );
            }
            h.push(rank);
        });
        #[cfg(not(debug_assertions))]
        let _ = (rank, check);
        Held {
            #[cfg(debug_assertions)]
            rank,
        }
    }
}

#[cfg(debug_assertions)]
impl Drop for Held {
    fn drop(&mut self) {
        // try_with: a guard dropped while the thread's storage is torn
        // down has nothing left to update.
        let _ = HELD.try_with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|r| *r == self.rank) {
                h.remove(i);
            }
        });
    }
}

/// A lock guard with its rank noted; derefs to what the guard guards.
/// The guard is released before the rank is forgotten (field order).
pub(crate) struct Ranked<G> {
    pub(crate) guard: G,
    _held: Held,
}

impl<G> Ranked<G> {
    /// Notes `rank`, then takes the lock (`lock`).
    pub(crate) fn acquire(rank: Rank, lock: impl FnOnce() -> G) -> Self {
        let held = Held::take(rank);
        Ranked {
            guard: lock(),
            _held: held,
        }
    }
}

impl<G: Deref> Deref for Ranked<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: DerefMut> DerefMut for Ranked<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

/// A mutex of a fixed rank.
#[derive(Debug)]
pub(crate) struct RankedMutex<T> {
    rank: Rank,
    inner: Mutex<T>,
}

impl<T> RankedMutex<T> {
    pub(crate) fn new(rank: Rank, value: T) -> Self {
        RankedMutex {
            rank,
            inner: Mutex::new(value),
        }
    }

    pub(crate) fn lock(&self) -> Ranked<MutexGuard<'_, T>> {
        Ranked::acquire(self.rank, || self.inner.lock())
    }

    /// The lock if it is free (no wait, so in any order).
    pub(crate) fn try_lock(&self) -> Option<Ranked<MutexGuard<'_, T>>> {
        let guard = self.inner.try_lock()?;
        Some(Ranked {
            guard,
            _held: Held::untimed(self.rank),
        })
    }
}

/// A read-write lock of a fixed rank.
#[derive(Debug, Default)]
pub(crate) struct RankedRwLock<T> {
    inner: RwLock<T>,
}

impl<T> RankedRwLock<T> {
    /// Its rank (one lock of this type: `flushing`).
    const RANK: Rank = Rank::FLUSHING;

    pub(crate) fn read(&self) -> Ranked<RwLockReadGuard<'_, T>> {
        Ranked::acquire(Self::RANK, || self.inner.read())
    }

    pub(crate) fn write(&self) -> Ranked<RwLockWriteGuard<'_, T>> {
        Ranked::acquire(Self::RANK, || self.inner.write())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_order_pass_and_released_ranks_are_forgotten() {
        let flush = RankedMutex::new(Rank::FLUSH, 0u64);
        let log = RankedMutex::new(Rank::INTENT, ());
        let flushing: RankedRwLock<u32> = RankedRwLock::default();
        {
            let _f = flush.lock();
            let _l = log.lock();
            let _a = Held::take(Rank::shard(3));
            let _b = Held::take(Rank::shard(9));
            *flushing.write() += 1;
        }
        // Everything released: any order again.
        let _l = log.lock();
        drop(_l);
        let _f = flush.lock();
    }

    // The checks exist in builds with debug assertions only (tests and
    // the suite have them), and so do these tests.
    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "lock order: the flush lock taken while holding state shard 5")]
    fn a_lock_taken_out_of_order_panics_in_checked_builds() {
        let flush = RankedMutex::new(Rank::FLUSH, 0u64);
        let _shard = Held::take(Rank::shard(5));
        let _f = flush.lock();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "lock order: state shard 2 taken while holding state shard 7")]
    fn shards_taken_in_decreasing_order_panic() {
        let _a = Held::take(Rank::shard(7));
        let _b = Held::take(Rank::shard(2));
    }
}
