//! The pool's counters and its queue-wait histogram (power-of-two
//! microsecond buckets), serialisable for reports.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Buckets of the wait histogram: bucket `i` counts waits below `2^i` µs
/// (the last one everything longer).
pub const WAIT_BUCKETS: usize = 32;

/// What a pool did, as of `Pool::stats`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stats {
    pub min: u64,
    pub max: u64,
    /// Workers alive now.
    pub workers: u64,
    /// Workers running a job now.
    pub busy: u64,
    /// Jobs waiting now.
    pub queued: u64,
    pub submitted: u64,
    pub completed: u64,
    /// Jobs that panicked (counted in `completed` too).
    pub panicked: u64,
    /// Workers ever started (the initial `min` included).
    pub started: u64,
    /// Workers the manager added because work waited.
    pub grown: u64,
    /// Workers that exited after idling.
    pub exited_idle: u64,
    /// Thread creations that failed.
    pub spawn_failures: u64,
    pub peak_workers: u64,
    /// Time spent running jobs, summed over workers.
    pub busy_us: u64,
    pub queue_wait: WaitHistogram,
}

/// Queue waits of the jobs that started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WaitHistogram {
    pub count: u64,
    pub total_us: u64,
    pub max_us: u64,
    pub buckets: [u64; WAIT_BUCKETS],
}

impl Default for WaitHistogram {
    fn default() -> Self {
        WaitHistogram {
            count: 0,
            total_us: 0,
            max_us: 0,
            buckets: [0; WAIT_BUCKETS],
        }
    }
}

impl WaitHistogram {
    pub fn mean_us(&self) -> u64 {
        self.total_us.checked_div(self.count).unwrap_or(0)
    }

    /// An upper bound of the `q` quantile (0 < q <= 1): the top of the
    /// bucket it falls in, capped by the largest wait seen.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "an f64 to u64 `as` saturates; a rank within count"
    )]
    pub fn quantile_us(&self, q: f64) -> u64 {
        let want = ((self.count as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= want && seen > 0 {
                return (1u64 << i).min(self.max_us);
            }
        }
        self.max_us
    }

    pub fn p99_us(&self) -> u64 {
        self.quantile_us(0.99)
    }

    pub(crate) fn note(&mut self, us: u64) {
        self.count += 1;
        self.total_us += us;
        self.max_us = self.max_us.max(us);
        let b = (64 - us.leading_zeros() as usize).min(WAIT_BUCKETS - 1);
        self.buckets[b] += 1;
    }
}

impl Stats {
    pub(crate) fn note_wait(&mut self, d: Duration) {
        self.queue_wait
            .note(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }
}
