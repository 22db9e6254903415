//! Inode counts for statfs (`df -i`): the live inodes are counted once
//! from the committed metadata (in the background after mount, or at the
//! first statfs), then followed by the creations and deletions made since
//! the count began. Free inodes are an estimate from the free space: an
//! inode needs no data, so the figure is what the pool could still hold at
//! `BYTES_PER_INODE` each.

use crate::error::Result;
use crate::vfs::Fs;
use cairn_meta::RecordType;

/// Bytes of free space counted per free inode.
pub const BYTES_PER_INODE: u64 = 1024;

/// The committed count and the creation balance when it was taken.
#[derive(Default)]
pub(crate) struct InodeCount(parking_lot::Mutex<Option<(u64, i64)>>);

impl Fs {
    /// Counts the live inodes (once; later calls return at once).
    pub fn count_inodes(&self) -> Result<()> {
        let mut c = self.inode_count.0.lock();
        if c.is_some() {
            return Ok(());
        }
        let balance = self.live_delta().load(std::sync::atomic::Ordering::Relaxed);
        let n = self.meta()?.count_live(RecordType::Inode)?;
        *c = Some((n, balance));
        Ok(())
    }

    /// Used inodes now: the count plus what was created since, less what
    /// was deleted.
    pub(crate) fn used_inodes(&self) -> u64 {
        if let Err(e) = self.count_inodes() {
            tracing::debug!("counting inodes: {e}");
        }
        let base = *self.inode_count.0.lock();
        let now = self.live_delta().load(std::sync::atomic::Ordering::Relaxed);
        let (n, then) = base.unwrap_or((0, 0));
        (n as i64 + now - then).max(1) as u64
    }
}
