//! The server-wide memory budget: bytes of READ and WRITE payloads held
//! by requests in flight, across all connections. A connection takes its
//! request's bytes from the budget before it reads a WRITE's payload (or
//! runs a READ) and gives them back when the reply has been sent, so a
//! connection that waits for the budget stops reading its socket and the
//! client feels back-pressure. The peak is kept for the statistics.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub(crate) struct Budget {
    limit: u64,
    used: Mutex<u64>,
    freed: Condvar,
    peak: AtomicU64,
}

impl Budget {
    /// A budget of `limit` bytes; one request of the largest payload
    /// always fits (a smaller limit is raised to it).
    pub fn new(limit: u64) -> Budget {
        Budget {
            limit: limit.max(crate::proto::MAX_PAYLOAD as u64),
            used: Mutex::new(0),
            freed: Condvar::new(),
            peak: AtomicU64::new(0),
        }
    }

    /// Waits until `n` bytes fit, then takes them.
    pub fn take(&self, n: u64) {
        if n == 0 {
            return;
        }
        let mut used = self.used.lock();
        while *used + n > self.limit {
            self.freed.wait(&mut used);
        }
        *used += n;
        self.peak.fetch_max(*used, Relaxed);
    }

    /// Gives back `n` bytes taken before.
    pub fn give(&self, n: u64) {
        if n == 0 {
            return;
        }
        let mut used = self.used.lock();
        debug_assert!(*used >= n, "{n} bytes given back of {} taken", *used);
        *used -= n.min(*used);
        self.freed.notify_all();
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn used(&self) -> u64 {
        *self.used.lock()
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_taker_waits_until_bytes_are_given_back() {
        let b = Arc::new(Budget::new(64 << 20));
        b.take(40 << 20);
        let b2 = b.clone();
        let t = std::thread::spawn(move || b2.take(30 << 20));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!t.is_finished(), "70 MiB in a 64 MiB budget");
        b.give(40 << 20);
        t.join().unwrap();
        assert_eq!(b.used(), 30 << 20);
        assert_eq!(b.peak(), 40 << 20);
    }
}
