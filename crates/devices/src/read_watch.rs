//! Reads in flight on a device, counted so that a watchdog can tell a
//! device that stopped answering (reads waiting, none finishing) from a
//! slow one: each read is counted when it starts and when it ends, even
//! when it fails (`Device::read_at` and the other reads take a guard).

use std::sync::atomic::{AtomicU64, Ordering};

/// Reads started and finished on one device.
#[derive(Debug, Default)]
pub struct ReadWatch {
    started: AtomicU64,
    done: AtomicU64,
}

/// One read in flight: counted finished when dropped.
pub(crate) struct InFlight<'a>(&'a ReadWatch);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.done.fetch_add(1, Ordering::Relaxed);
    }
}

impl ReadWatch {
    pub(crate) fn start(&self) -> InFlight<'_> {
        self.started.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// (reads in flight now, reads finished so far).
    pub fn state(&self) -> (u64, u64) {
        let done = self.done.load(Ordering::Relaxed);
        let started = self.started.load(Ordering::Relaxed);
        (started.saturating_sub(done), done)
    }
}

#[cfg(test)]
mod tests {
    use super::ReadWatch;

    #[test]
    fn counts_reads_in_flight_until_they_end() {
        let w = ReadWatch::default();
        assert_eq!(w.state(), (0, 0));
        let a = w.start();
        let b = w.start();
        assert_eq!(w.state(), (2, 0));
        drop(a);
        assert_eq!(w.state(), (1, 1));
        drop(b);
        assert_eq!(w.state(), (0, 2));
    }
}
