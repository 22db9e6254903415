//! The watchdog: every half second it asks the chunk store for devices
//! whose reads have waited the I/O timeout with none finishing, and those
//! are faulted (`ChunkStore::fault_stalled_readers`): later reads go to
//! the other copies or the stripe, and re-replication makes their copies
//! elsewhere. It also frees the slots that a read in flight held back
//! (`Segments::release_slots`). It runs on read-only (degraded) mounts too.

use crate::vfs::Fs;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How often the watchdog looks.
const EVERY: Duration = Duration::from_millis(500);

impl Fs {
    pub fn spawn_watchdog(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        let fs = self.clone();
        std::thread::Builder::new()
            .name("cairn-watchdog".into())
            .spawn(move || {
                while !fs.stopping.load(Ordering::SeqCst) {
                    fs.nap(EVERY);
                    // Slots left for later while a read held them back.
                    if let Err(e) = fs.pool.chunks.release_slots(&[]) {
                        tracing::warn!("freeing slots: {e}");
                    }
                    if !fs.pool.chunks.fault_stalled_readers().is_empty() {
                        fs.kick_resilver();
                    }
                }
            })
            .expect("spawn watchdog")
    }
}
