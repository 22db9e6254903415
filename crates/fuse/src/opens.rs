//! How opens reach the daemon: mostly, they do not. A live pool answers the
//! first OPEN (and CREATE) with ENOSYS, which tells the kernel to open files
//! by itself from then on and to send no RELEASE at close (FUSE's no-open
//! mode, Linux 4.19+). A small-file workload crosses into the daemon about
//! half as often: under the blogbench-style load three requests in four
//! were an OPEN or a RELEASE. Nothing needed them:
//!
//! * an unlinked file lives while the kernel holds lookups of it, and an
//!   open file pins its inode in the kernel, so the lookup count alone
//!   keeps it (refs.rs in cairn-fs);
//! * permissions are the kernel's (default_permissions), O_TRUNC comes as
//!   a SETATTR, and pages are kept across opens (the live tree changes only
//!   through this mount).
//!
//! Historical views are read-only, and without OPEN the kernel lets root
//! open a view file for writing. That is why the mount has no writeback
//! cache: every write(2) is a WRITE request, refused with EROFS before the
//! call returns, and the kernel drops the pages it filled for it. A page of
//! a view that root dirties through a shared mapping is refused the same
//! way when the kernel writes it back (msync, or within the dirty expiry),
//! and `Invalidator` then drops it from the kernel's cache; until that
//! write-back, readers of the page see what the mapping holds. A mirror
//! pool keeps OPEN: its tree changes behind the kernel's back and each open
//! drops the file's cached pages.

use fuser::{INodeNo, Notifier};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

/// Drops the kernel's cached pages of view inodes whose write was refused.
#[derive(Clone, Default)]
pub struct Invalidator {
    notifier: Arc<OnceLock<Notifier>>,
    /// Inodes with a drop under way (one per inode at a time).
    pending: Arc<Mutex<HashSet<u64>>>,
}

impl Invalidator {
    /// The session's notifier, once the session exists.
    pub fn set(&self, n: Notifier) {
        let _ = self.notifier.set(n);
    }

    /// Drops all cached pages of `ino` once the refused request's reply is
    /// out: the kernel waits for the pages' write-back, which waits for that
    /// reply, so the drop runs on a thread of its own.
    pub fn drop_pages_after_reply(&self, ino: u64) {
        let Some(n) = self.notifier.get().cloned() else {
            return;
        };
        if !self.pending.lock().insert(ino) {
            return;
        }
        let pending = self.pending.clone();
        std::thread::spawn(move || {
            // ENOENT: the kernel no longer holds the inode, nor its pages.
            if let Err(e) = n.inval_inode(INodeNo(ino), 0, 0) {
                tracing::debug!("dropping cached pages of view inode {ino:#x}: {e}");
            }
            pending.lock().remove(&ino);
        });
    }
}
