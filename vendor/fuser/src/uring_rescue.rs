//! Requests queued behind a ring thread that is stuck in one request.
//!
//! The kernel queues a request on any free entry of the caller's CPU
//! queue, including the entries of a ring thread that is serving another
//! request itself. When that request blocks (a device whose reads hang
//! until a watchdog faults it, a lock held for long), the requests on its
//! other entries would wait for it although they need nothing it holds.
//! The rescuer looks at every ring every `TICK`: when its thread has been
//! in one request for `STUCK` or more, the completions it has not handled
//! yet (and those the kernel has posted since) are handed to the worker
//! pool, which serves and commits them from its own threads. A request
//! that is merely slow loses nothing by that: it only runs elsewhere.

use std::io;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

use log::error;
use log::warn;

use crate::Filesystem;
use crate::session::SessionEventLoop;
use crate::uring::Bulk;
use crate::uring::Handoff;
use crate::uring::Ring;

/// How often the rings are looked at.
const TICK: Duration = Duration::from_millis(50);
/// How long a ring thread may serve one request before the requests
/// queued behind it go to workers.
const STUCK_MS: u64 = 200;

/// Milliseconds since the first call, plus one (0 means "not busy").
pub(crate) fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// The rescuer's thread.
#[derive(Debug)]
pub(crate) struct Rescuer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Rescuer {
    /// Starts watching `rings` (each with its thread's session loop);
    /// requests it takes go to `workers`.
    pub(crate) fn start<FS: Filesystem>(
        rings: Vec<(Arc<Ring>, Arc<SessionEventLoop<FS>>)>,
        workers: (Handoff, u32),
    ) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let bulk: Bulk = Some(workers);
        let thread = std::thread::Builder::new()
            .name("fuse-rescue".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    for (ring, se) in &rings {
                        sweep(ring, se, &bulk);
                    }
                }
            })?;
        Ok(Self { stop, thread })
    }

    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// Hands what waits behind `ring`'s thread to workers when that thread
/// has been in one request for `STUCK_MS` or more.
fn sweep<FS: Filesystem>(ring: &Arc<Ring>, se: &Arc<SessionEventLoop<FS>>, bulk: &Bulk) {
    let since = ring.busy_since.load(Ordering::Relaxed);
    let stuck = since != 0 && now_ms().saturating_sub(since) >= STUCK_MS;
    if !stuck {
        return;
    }
    match crate::uring::rescue_pending(ring, se, bulk) {
        Ok(0) => {}
        Ok(n) => warn!(
            "fuse {ring:?}: its thread has served one request for {} ms; {n} queued behind it handed to workers",
            now_ms().saturating_sub(since)
        ),
        Err(err) => error!("fuse {ring:?}: handing queued requests to workers: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_starts_above_zero_and_goes_forward() {
        let a = now_ms();
        assert!(a >= 1, "0 means not busy");
        std::thread::sleep(Duration::from_millis(5));
        assert!(now_ms() >= a + 4);
    }
}
