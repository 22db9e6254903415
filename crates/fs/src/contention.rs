//! Lock-contention counters: how often and how long operations waited for
//! the filesystem's shared locks (the state lock over the overlays, the
//! flush lock). `cairn info` shows them, so a change to the locking can be
//! judged by numbers taken from a running pool.

use parking_lot::{Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The counters of one lock.
#[derive(Default)]
pub struct Contention {
    acquired: AtomicU64,
    waited: AtomicU64,
    wait_ns: AtomicU64,
    max_wait_ns: AtomicU64,
}

/// What `cairn info --json` shows of one lock ("locks").
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LockStats {
    pub name: String,
    /// Times the lock was taken.
    pub acquired: u64,
    /// Times it was held by another thread and the taker waited.
    pub waited: u64,
    /// Total and longest wait, in microseconds.
    pub wait_us_total: u64,
    pub wait_us_max: u64,
}

impl Contention {
    /// Takes `m`, counting the wait when another thread holds it.
    pub fn lock<'a, T>(&self, m: &'a Mutex<T>) -> MutexGuard<'a, T> {
        self.acquired.fetch_add(1, Relaxed);
        if let Some(g) = m.try_lock() {
            return g;
        }
        let t = Instant::now();
        let g = m.lock();
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.waited.fetch_add(1, Relaxed);
        self.wait_ns.fetch_add(ns, Relaxed);
        self.max_wait_ns.fetch_max(ns, Relaxed);
        g
    }

    pub fn stats(&self, name: &str) -> LockStats {
        LockStats {
            name: name.to_string(),
            acquired: self.acquired.load(Relaxed),
            waited: self.waited.load(Relaxed),
            wait_us_total: self.wait_ns.load(Relaxed) / 1000,
            wait_us_max: self.max_wait_ns.load(Relaxed) / 1000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waits_are_counted_only_when_the_lock_is_held() {
        let c = Arc::new(Contention::default());
        let m = Arc::new(Mutex::new(0));
        drop(c.lock(&m));
        assert_eq!(c.stats("x").waited, 0);
        let g = m.lock();
        let (c2, m2) = (c.clone(), m.clone());
        let t = std::thread::spawn(move || *c2.lock(&m2) += 1);
        std::thread::sleep(std::time::Duration::from_millis(30));
        drop(g);
        t.join().unwrap();
        let s = c.stats("x");
        assert_eq!((s.acquired, s.waited), (2, 1));
        assert!(s.wait_us_max >= 20_000, "{s:?}");
    }
}
