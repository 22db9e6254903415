//! The workers FUSE ring threads hand requests to (reads and writes of
//! 128 KiB or more, fsync and other requests that may block): Cairn's
//! adaptive pool (`crates/workpool`), which adds workers while handed-off
//! requests wait and lets idle ones go, as the NBD server's does. One pool
//! per process; its counters are shown by `cairn info`.

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

/// The process's pool, started on first use: as many workers kept as the
/// fixed pool it replaces had (two per CPU and two more, at most 32), up
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
                idle_exit: Duration::from_secs(10),
                name: "fuse-work".into(),
            })))
        })
        .clone()
}

/// The pool's counters, if a FUSE mount started it.
pub fn stats() -> Option<Stats> {
    WORKERS.get().map(|w| w.0.stats())
}
