//! What file handles need (an NFS server's, through FUSE export support):
//! finding an inode by number alone, the directory holding a directory,
//! and a generation that tells apart two inodes that got the same number.
//!
//! Inode numbers only grow, but the counter is durable only at a commit
//! (or an fsync's intent-log record): after a crash, numbers the lost run
//! handed out are handed out again. Each writable open therefore starts an
//! epoch (`ino_epochs_v1`: first inode number -> epoch, written before
//! anything is served), and an inode's generation is the epoch whose range
//! holds its number: an inode the crash lost had the old epoch, the new
//! one with its number has the new. Mirror pools take their numbers from
//! their source and use generation 0.

use crate::error::{FsError, Result};
use crate::types::{FileKind, Inode, ROOT_INO};
use crate::vfs::Fs;

impl Fs {
    /// `ino` itself for the kernel, found by number alone (FUSE export
    /// support: a LOOKUP of "." decodes a file handle whose inode the
    /// kernel no longer caches); counts one lookup reference. An inode
    /// without links (deleted, kept only while open) is not found, so a
    /// handle of a deleted file gives ESTALE.
    pub fn lookup_self_ref(&self, ino: u64) -> Result<Inode> {
        let mut st = self.lock_inos(&[ino]);
        let i = self.inode(&st, ino)?;
        if i.nlink == 0 {
            return Err(FsError::NotFound);
        }
        Self::count_lookup(&mut st, ino);
        Ok(i)
    }

    /// The directory that holds directory `ino`, for the kernel (a LOOKUP
    /// of ".." reconnecting a decoded handle); counts one lookup reference.
    /// The root's parent is the root.
    pub fn lookup_parent_ref(&self, ino: u64) -> Result<Inode> {
        let dir = self.getattr(ino)?;
        if dir.kind != FileKind::Dir {
            return Err(FsError::NotDir);
        }
        let parent = match ino {
            ROOT_INO => ROOT_INO,
            _ => dir.parent,
        };
        assert!(parent != 0, "directory {ino} names its parent");
        self.lookup_self_ref(parent)
    }

    /// Loads the inode number epochs; with `begin` (a writable open, after
    /// the intent log's replay and before anything is served) starts a new
    /// one at the next inode number, durably.
    pub(crate) fn load_ino_epochs(&self, begin: bool) -> Result<()> {
        let mut epochs = self.pool.meta.read()?.ino_epochs()?;
        if begin {
            let first = self.next_ino();
            let epoch = self.pool.meta.write(|w| w.begin_ino_epoch(first))?;
            assert!(
                epochs.last().is_none_or(|&(f, e)| f <= first && e < epoch),
                "inode epochs grow"
            );
            epochs.push((first, epoch));
        }
        // Set once per open (a second call finds it set and changes nothing).
        let _ = self.ino_epochs.set(epochs);
        Ok(())
    }

    /// The generation of inode `ino` in a file handle: the epoch of the
    /// open that numbered it (its low 32 bits: the kernel keeps 32); 0 for
    /// inodes numbered before epochs existed.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the kernel keeps 32 bits of a generation; epochs wrap after 2^32 opens"
    )]
    pub fn generation(&self, ino: u64) -> u64 {
        let Some(epochs) = self.ino_epochs.get() else {
            return 0;
        };
        let at = epochs.partition_point(|&(first, _)| first <= ino);
        match at {
            0 => 0,
            n => u64::from(epochs[n - 1].1 as u32),
        }
    }
}
