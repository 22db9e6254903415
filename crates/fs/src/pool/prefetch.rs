//! Metadata read-ahead at mount. A cold read of a file needs its extent
//! and its chunk records, each a B-tree page of the metadata store that may
//! not be in any cache after a mount (or a host reboot): one more device
//! read per small read. Right after the pool opens, a background thread
//! asks the host to read the store ahead (posix_fadvise WILLNEED), up to
//! `PREFETCH_LIMIT` bytes, so that small reads soon find their metadata in
//! memory. Nothing waits for it; the host may drop those pages again.

use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// The most of the metadata store read ahead (a store this large holds
/// the records of tens of millions of chunks).
const PREFETCH_LIMIT: u64 = 1 << 30;

/// Starts reading the metadata store at `path` ahead, in the background.
pub(crate) fn prefetch_metadata(path: PathBuf) {
    let spawned = std::thread::Builder::new()
        .name("cairn-meta-ahead".into())
        .spawn(move || {
            let Ok(f) = std::fs::File::open(&path) else {
                return;
            };
            let len = f.metadata().map_or(0, |m| m.len()).min(PREFETCH_LIMIT);
            // SAFETY: an advice call on an open descriptor; no memory is
            // passed.
            let r = unsafe {
                libc::posix_fadvise(f.as_raw_fd(), 0, len as i64, libc::POSIX_FADV_WILLNEED)
            };
            if r != 0 {
                tracing::debug!("metadata read-ahead of {}: error {r}", path.display());
            }
        });
    if let Err(e) = spawned {
        tracing::debug!("metadata read-ahead not started: {e}");
    }
}
