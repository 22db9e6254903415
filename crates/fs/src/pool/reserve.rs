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
//!
//! A host filesystem without `fallocate` (FUSE layers, NFSv3) gets the
//! reserve written as zeros instead; one where neither works, or that
//! reports a size of 0, runs without a reserve (said once in the log and
//! in `info`), never short of space for that alone. Only ENOSPC or EDQUOT
//! count as "no room", as in `MetaStore::ensure_headroom`.

use cairn_devices::device::host_space;
use cairn_devices::private::private_options;
use parking_lot::Mutex;
use std::fs::File;
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
    /// Why the pool went short of space (for `info`).
    cause: Mutex<Option<String>>,
    /// Why there is no reserve at all, when there is none (for `info`).
    without: Mutex<Option<String>>,
}

/// What allocating the reserve came to.
#[derive(Debug, PartialEq)]
enum Refill {
    Done,
    /// The host filesystem is full (ENOSPC, EDQUOT).
    NoRoom,
    /// It cannot hold a reserve (no size, no way to allocate): why.
    Without(String),
}

impl Reserve {
    /// The reserve for the store at `meta` (a symlink is followed: the
    /// reserve must be on the filesystem that holds the store's file).
    /// Allocates it if it is missing and the host has room.
    pub fn open(meta: &Path) -> Reserve {
        let real = std::fs::canonicalize(meta).unwrap_or_else(|_| meta.to_path_buf());
        let dir = real.parent().unwrap_or(Path::new("."));
        let bytes = host_space(dir).map_or(MAX_BYTES, |(s, _)| (s / 16).min(MAX_BYTES)) & !4095;
        Self::open_sized(dir.join("meta.reserve"), bytes)
    }

    /// The reserve at `path` of `bytes` bytes, allocated now if it can be.
    fn open_sized(path: PathBuf, bytes: u64) -> Reserve {
        let r = Reserve {
            path,
            bytes,
            short: AtomicBool::new(false),
            cause: Mutex::new(None),
            without: Mutex::new(None),
        };
        match r.refill() {
            Refill::Done => {}
            Refill::NoRoom => {
                let why = format!(
                    "no room on the filesystem holding {} for the metadata reserve ({} bytes)",
                    r.path.display(),
                    r.bytes
                );
                tracing::warn!("{why}: the pool starts short of space");
                *r.cause.lock() = Some(why);
                r.short.store(true, Ordering::SeqCst);
            }
            Refill::Without(why) => r.go_without(why),
        }
        r
    }

    /// No reserve on this host filesystem: said once, and kept for `info`.
    fn go_without(&self, why: String) {
        let mut w = self.without.lock();
        if w.is_none() {
            tracing::warn!(
                "no metadata reserve ({why}): the pool runs without one; if the host \
                 filesystem fills, commits fail for space until it has room again"
            );
            *w = Some(why);
        }
    }

    /// Room to keep allocated past the end of the metadata file before
    /// each commit (as much as the reserve, plus what the commit adds).
    pub fn headroom(&self, changes: u64) -> u64 {
        self.bytes + changes * 512
    }

    pub fn is_short(&self) -> bool {
        self.short.load(Ordering::SeqCst)
    }

    /// What `info` should say about the reserve: why the pool is short of
    /// space, or why it has no reserve. None when all is well.
    pub fn status(&self) -> Option<String> {
        if self.is_short() {
            let cause = self.cause.lock().clone();
            let cause = cause.unwrap_or_else(|| "a filesystem under the pool is full".into());
            return Some(format!(
                "the pool is short of space: {cause}; data writes get ENOSPC until space is \
                 freed (deleting files works)"
            ));
        }
        (self.without.lock().as_ref()).map(|w| format!("no metadata reserve: {w}"))
    }

    /// Gives the reserve back because the filesystem holding it is full,
    /// and marks the pool short of space. Returns false if it was already
    /// spent.
    pub fn spend(&self) -> bool {
        let cause = format!("the filesystem holding {} is full", self.path.display());
        self.spend_for(&cause)
    }

    /// Gives the reserve back and marks the pool short of space, `cause`
    /// saying why (logged once, shown by `info`). Returns false if it was
    /// already spent.
    pub fn spend_for(&self, cause: &str) -> bool {
        let was_short = self.short.swap(true, Ordering::SeqCst);
        let freed = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .and_then(|f| f.set_len(0))
            .is_ok();
        if !was_short {
            tracing::warn!(
                "{cause}: metadata reserve released; \
                 writes get ENOSPC until space is freed (deleting files works)"
            );
            *self.cause.lock() = Some(cause.to_string());
        }
        freed && !was_short
    }

    /// If short of space, tries to allocate the reserve again; true when
    /// the pool is no longer short.
    pub fn recover(&self) -> bool {
        if !self.is_short() {
            return true;
        }
        let back = match self.refill() {
            Refill::Done => true,
            Refill::NoRoom => false,
            Refill::Without(why) => {
                self.go_without(why);
                true
            }
        };
        if back {
            self.short.store(false, Ordering::SeqCst);
            *self.cause.lock() = None;
            tracing::info!("space is back: metadata reserve allocated, writes accepted again");
        }
        back
    }

    /// Allocates the reserve's blocks for real: fallocate, else (a host
    /// filesystem without it: EOPNOTSUPP, ENOSYS, EINVAL) by writing
    /// zeros. A partial allocation is given back.
    fn refill(&self) -> Refill {
        if self.bytes == 0 {
            return Refill::Without(format!(
                "the filesystem holding {} reports a size of 0 bytes",
                self.path.display()
            ));
        }
        let f = match private_options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(e) if cairn_meta::error::no_space(&e) => return Refill::NoRoom,
            Err(e) => return Refill::Without(format!("{}: {e}", self.path.display())),
        };
        // SAFETY: fallocate on a descriptor we own.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, self.bytes as libc::off_t) };
        let e = match r {
            0 => return Refill::Done,
            _ => std::io::Error::last_os_error(),
        };
        let done = match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) => {
                self.write_zeros(&f)
            }
            _ => Err(e),
        };
        match done {
            Ok(()) => Refill::Done,
            Err(e) => {
                let _ = f.set_len(0);
                match cairn_meta::error::no_space(&e) {
                    true => Refill::NoRoom,
                    false => Refill::Without(format!("{}: {e}", self.path.display())),
                }
            }
        }
    }

    /// The reserve written as zeros and synced (so that a full host says
    /// so now), unless its blocks are already there.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "min with a buffer's length"
    )]
    fn write_zeros(&self, f: &File) -> std::io::Result<()> {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let m = f.metadata()?;
        if m.len() >= self.bytes && m.blocks() * 512 >= self.bytes {
            return Ok(());
        }
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < self.bytes {
            let n = (zeros.len() as u64).min(self.bytes - at) as usize;
            f.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        f.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host filesystem that reports a size of 0 (statfs) makes a
    /// reserve of 0 bytes: the pool runs without one, not short of space
    /// forever, and says so.
    #[test]
    fn a_host_of_size_zero_runs_without_a_reserve_not_short() {
        let d = tempfile::tempdir().unwrap();
        let r = Reserve::open_sized(d.path().join("meta.reserve"), 0);
        assert!(!r.is_short(), "short of space for a 0-byte reserve");
        let s = r.status().expect("info says there is no reserve");
        assert!(
            s.contains("no metadata reserve") && s.contains("size of 0"),
            "{s}"
        );
        assert!(r.recover());
    }

    /// A pool short of space for lack of slots says so, not "the
    /// filesystem is full", and gets its reserve back.
    #[test]
    fn the_cause_of_a_shortage_is_the_one_given() {
        let d = tempfile::tempdir().unwrap();
        let r = Reserve::open_sized(d.path().join("meta.reserve"), 1 << 20);
        assert_eq!(r.status(), None);
        assert!(r.spend_for("the pool's devices are full"));
        let s = r.status().unwrap();
        assert!(
            s.contains("short of space: the pool's devices are full"),
            "{s}"
        );
        assert!(r.recover() && r.status().is_none());
    }
}
