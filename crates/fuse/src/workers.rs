//! The workers FUSE ring threads hand requests to (reads and writes of
//! 128 KiB or more, fsync and other requests that may block): Cairn's
//! adaptive pool (`crates/workpool`), which adds workers while handed-off
//! requests wait, as the NBD server's does, but never lets them go (see
//! `KEEP_WORKERS`). One pool per process; its counters are shown by
//! `cairn info`.

use cairn_workpool::{Config, Pool, Stats};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The pool behind the FUSE rings.
pub struct FuseWorkers(Pool);

impl std::fmt::Debug for FuseWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("FuseWorkers")
            .field(&self.0.stats().workers)
            .finish()
    }
}

impl fuser::Executor for FuseWorkers {
    fn execute(&self, job: Box<dyn FnOnce() + Send>) {
        self.0.submit_boxed(job);
    }
}

static WORKERS: OnceLock<Arc<FuseWorkers>> = OnceLock::new();

/// How long an idle FUSE worker waits before it exits: for good. A worker
/// that replied to a request submitted the ring's next fetch (a FUSE
/// COMMIT_AND_FETCH io_uring command) as its own task, and io_uring cancels
/// a task's pending commands when the task exits: the kernel then ends that
/// entry with ENOTCONN, its ring thread stops, and requests queued on the
/// ring's other entries are never answered (a write's writeback, then its
/// fsync, hung for good under `bench/s3.sh` once the pool had shrunk). So
/// the pool grows while requests wait and keeps what it grew to.
pub const KEEP_WORKERS: Duration = Duration::from_secs(365 * 24 * 3600);

/// The process's pool, started on first use: as many workers as the fixed
/// pool it replaces had (two per CPU and two more, at most 32), growing up
/// to 64 while requests wait more than 2 ms for one.
pub fn shared() -> Arc<FuseWorkers> {
    WORKERS
        .get_or_init(|| {
            let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
            let min = (2 * cpus + 2).min(32);
            Arc::new(FuseWorkers(Pool::new(Config {
                min,
                max: 64,
                grow_after: Duration::from_millis(2),
                idle_exit: KEEP_WORKERS,
                name: "fuse-work".into(),
            })))
        })
        .clone()
}

/// The pool's counters, if a FUSE mount started it.
pub fn stats() -> Option<Stats> {
    WORKERS.get().map(|w| w.0.stats())
}
