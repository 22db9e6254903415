//! The metadata reserve: a file allocated beside `meta.redb` on the host
//! filesystem that holds it. When that filesystem fills and a commit fails
//! for lack of room, the reserve is given back and the commit is tried
//! again, so the changes users were told had been written are committed,
//! and the pool goes *short of space*: data writes get ENOSPC while
//! deletes, truncations and snapshot deletions (which free space) keep
//! committing. Once the host has room for the reserve again, it is
//! allocated anew and writes are taken again.
//!
//! Before every commit, room for the commit's growth is also allocated past
//! the end of the metadata file (`MetaStore::ensure_headroom`), so the host
//! running full shows as ENOSPC here, before redb writes anything: redb
//! fails its handle for good once a write to its file failed.

use cairn_devices::device::host_space;
use cairn_devices::private::private_options;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Largest reserve; smaller on small host filesystems (1/16 of their size).
pub const MAX_BYTES: u64 = 64 << 20;

pub struct Reserve {
    path: PathBuf,
    bytes: u64,
    /// The pool is short of space: the reserve was spent.
    short: AtomicBool,
}

impl Reserve {
    /// The reserve for the store at `meta` (a symlink is followed: the
    /// reserve must be on the filesystem that holds the store's file).
    /// Allocates it if it is missing and the host has room.
    pub fn open(meta: &Path) -> Reserve {
        let real = std::fs::canonicalize(meta).unwrap_or_else(|_| meta.to_path_buf());
        let dir = real.parent().unwrap_or(Path::new("."));
        let bytes = host_space(dir).map_or(MAX_BYTES, |(s, _)| (s / 16).min(MAX_BYTES)) & !4095;
        let r = Reserve {
            path: dir.join("meta.reserve"),
            bytes,
            short: AtomicBool::new(false),
        };
        if !r.refill() {
            tracing::warn!(
                "no room for the metadata reserve {} ({} bytes): the pool starts short of space",
                r.path.display(),
                r.bytes
            );
            r.short.store(true, Ordering::SeqCst);
        }
        r
    }

    /// Room to keep allocated past the end of the metadata file before
    /// each commit (as much as the reserve, plus what the commit adds).
    pub fn headroom(&self, changes: u64) -> u64 {
        self.bytes + changes * 512
    }

    pub fn is_short(&self) -> bool {
        self.short.load(Ordering::SeqCst)
    }

    /// Gives the reserve back to the host filesystem and marks the pool
    /// short of space. Returns false if it was already spent.
    pub fn spend(&self) -> bool {
        let was_short = self.short.swap(true, Ordering::SeqCst);
        let freed = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .and_then(|f| f.set_len(0))
            .is_ok();
        if !was_short {
            tracing::warn!(
                "the filesystem holding {} is full: metadata reserve released; \
                 writes get ENOSPC until space is freed (deleting files works)",
                self.path.display()
            );
        }
        freed && !was_short
    }

    /// If short of space, tries to allocate the reserve again; true when
    /// the pool is no longer short.
    pub fn recover(&self) -> bool {
        if !self.is_short() {
            return true;
        }
        if self.refill() {
            self.short.store(false, Ordering::SeqCst);
            tracing::info!("space is back: metadata reserve allocated, writes accepted again");
            return true;
        }
        false
    }

    /// Allocates the reserve's blocks for real (fallocate). False if the
    /// host lacks the room; a partial allocation is given back.
    fn refill(&self) -> bool {
        let f = match private_options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(_) => return false,
        };
        // SAFETY: fallocate on a descriptor we own.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, self.bytes as libc::off_t) };
        if r != 0 {
            let _ = f.set_len(0);
            return false;
        }
        true
    }
}
