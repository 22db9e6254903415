//! copy_file_range as a clone: the target's extent elements name the
//! source's chunks, with one more reference each, in one transaction with
//! its own TID (no data read or written). Only whole blocks at the same
//! offset within a block can share a chunk; the bytes of partial blocks at
//! either end are copied through the write-back overlay.

use crate::error::{invariant, FsError, Result};
use crate::types::{FileKind, Inode};
use crate::vfs::Fs;
use cairn_meta::{ElemKey, MetaWrite, RecordType};

/// Bytes copied per read/write of the byte-copy path.
const COPY_PIECE: u64 = 1 << 20;

impl Fs {
    /// Copies `len` bytes of `src` at `src_off` to `dst` at `dst_off`
    /// (stopping at the end of `src`); returns the bytes copied. Whole
    /// blocks are cloned, the rest copied.
    pub fn copy_range(
        &self,
        src: u64,
        src_off: u64,
        dst: u64,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        self.check_ok()?;
        let (s, d) = (self.getattr(src)?, self.getattr(dst)?);
        for i in [&s, &d] {
            match i.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid),
            }
        }
        let len = len.min(s.size.saturating_sub(src_off));
        dst_off.checked_add(len).ok_or(FsError::Invalid)?;
        if src == dst && src_off < dst_off + len && dst_off < src_off + len {
            return Err(FsError::Invalid);
        }
        let rs = self.record;
        if len == 0 {
            return Ok(0);
        }
        if src_off % rs != dst_off % rs {
            return self.copy_bytes(src, src_off, dst, dst_off, len);
        }
        let head = ((rs - src_off % rs) % rs).min(len);
        let first = src_off.div_ceil(rs);
        let end = src_off + len;
        // The last partial block is cloned too when it is the end of the
        // source and nothing of the target follows it.
        let whole_tail = end == s.size && dst_off + len >= d.size;
        let last = if whole_tail {
            end.div_ceil(rs)
        } else {
            end / rs
        };
        if last > first {
            let from = BlockRange {
                ino: src,
                at: None,
                first,
                count: last - first,
            };
            let size = Size::AtLeast(dst_off + len);
            self.clone_blocks(from, dst, (dst_off + head) / rs, size)?;
        } else {
            return self.copy_bytes(src, src_off, dst, dst_off, len);
        }
        self.copy_bytes(src, src_off, dst, dst_off, head)?;
        let tail_at = (last * rs).min(end);
        let delta = dst_off as i64 - src_off as i64;
        let dst_tail = (tail_at as i64 + delta) as u64;
        self.copy_bytes(src, tail_at, dst, dst_tail, end - tail_at)?;
        Ok(len)
    }

    /// Byte copy through read and write.
    fn copy_bytes(&self, src: u64, src_off: u64, dst: u64, dst_off: u64, len: u64) -> Result<u64> {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(COPY_PIECE);
            let data = self.read(src, src_off + done, n as u32)?;
            if data.is_empty() {
                break;
            }
            self.write(dst, dst_off + done, &data)?;
            done += data.len() as u64;
        }
        Ok(done)
    }

    /// Points `from.count` blocks of `dst` from block `to` at the chunks of
    /// the blocks of `from` (holes stay holes) and sets `dst`'s size, in one
    /// commit. Buffered changes are flushed first; the commit holds the
    /// flush lock, so no flush, GC or prune can run between reading the
    /// source's extents and adding the references. With `from.at`, the
    /// source is read as it was at that TID (it must be retained: a
    /// snapshot's); `dst` may then be the source itself (a rollback).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "nanoseconds since 1970: now is after 1970 and before 2554"
    )]
    pub(crate) fn clone_blocks(
        &self,
        from: BlockRange,
        dst: u64,
        to: u64,
        size: Size,
    ) -> Result<()> {
        let src = from.ino;
        let mut tries = 0;
        let mut last_tid = loop {
            tries += 1;
            if tries > 50 {
                return Err(FsError::Busy);
            }
            self.flush()?;
            let g = self.flush_guard();
            let mut lg = self.log_guard();
            let log_empty = lg.as_ref().is_none_or(|l| l.is_empty_on(*g));
            let st = self.lock_inos(&[src, dst]);
            let clean = [src, dst].iter().all(|i| {
                let d = st.dirty_of(*i);
                d.blocks.get(i).is_none_or(|m| m.is_empty())
                    && d.patches.get(i).is_none_or(|m| m.is_empty())
                    && !d.truncs.contains_key(i)
            });
            if clean && st.flushing.is_empty() && log_empty {
                // Records from now on go on top of the clone's TID: its
                // commit must not leave them behind (`LogFile::seal`).
                if let Some(l) = lg.as_deref_mut() {
                    l.seal(*g + 1);
                }
                drop(st);
                break g;
            }
        };
        self.check_ok()?;
        let tid = *last_tid + 1;
        let now = Self::now();
        let mut inode = {
            let st = self.lock_inos(&[dst]);
            self.inode(&st, dst)?
        };
        inode.size = size.apply(inode.size);
        inode.mtime = now;
        inode.ctime = now;
        let time_ns = now.as_nanos() as u64;
        let mut touched = std::collections::BTreeSet::new();
        let mut freed = Vec::new();
        self.pool.meta.write(|w| {
            for n in 0..from.count {
                let (s, d) = ((from.first + n, from.at), to + n);
                clone_block(self, w, src, s, dst, d, tid, &mut touched)?;
            }
            put_inode(w, &inode, tid)?;
            crate::writeback::flush::store_ino_counter(w, self.next_ino())?;
            w.set_counter("last_tid", tid)?;
            w.log_tid(tid, time_ns)?;
            self.settle_ended(w, tid, &mut touched, &mut freed)?;
            self.store_segments(w, &touched)?;
            Ok::<_, FsError>(())
        })?;
        self.pool.chunks.release_slots(&freed)?;
        *last_tid = tid;
        self.retire_intent(tid);
        // Every shard: no lookup holds the view the commit made stale.
        let mut st = self.lock_all();
        self.drop_ns_meta();
        if let Some(Some(i)) = st.dirty_of(dst).inodes.get(&dst).cloned() {
            let mut i = i;
            i.size = size.apply(i.size);
            i.mtime = now;
            i.ctime = now;
            st.put_inode(i);
        }
        drop(st);
        self.forget_stored(dst);
        Ok(())
    }
}

/// Blocks of a file to clone from: `count` blocks from block `first` of
/// inode `ino`, as they are now (`at` None) or were at TID `at`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockRange {
    pub ino: u64,
    pub at: Option<u64>,
    pub first: u64,
    pub count: u64,
}

/// The size a clone leaves its target with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Size {
    AtLeast(u64),
    Exactly(u64),
}

impl Size {
    fn apply(self, old: u64) -> u64 {
        match self {
            Size::AtLeast(n) => old.max(n),
            Size::Exactly(n) => n,
        }
    }
}

/// One block of the clone: the source's extent (with a new reference to
/// its chunk) or, for a hole, the end of the target's extent. A target
/// block that already is the source's (a rollback of a block unchanged
/// since) is left alone.
#[allow(clippy::too_many_arguments)]
fn clone_block(
    fs: &Fs,
    w: &mut MetaWrite<'_>,
    src: u64,
    (sblk, at): (u64, Option<u64>),
    dst: u64,
    dblk: u64,
    tid: u64,
    touched: &mut std::collections::BTreeSet<u64>,
) -> Result<()> {
    // The source is a committed state: a TID before this clone's own.
    invariant!(
        at.is_none_or(|t| t < tid),
        "inode {src} block {sblk} cloned as of TID {at:?} into TID {tid}"
    );
    let skey = ElemKey::extent(src, sblk);
    let dkey = ElemKey::extent(dst, dblk);
    let found = match at {
        Some(t) => w.get_asof(&skey, t)?,
        None => w.get(&skey)?,
    };
    if at.is_some() && skey == dkey {
        let now = w.get(&dkey)?;
        if now.as_ref().map(|e| e.create_tid) == found.as_ref().map(|e| e.create_tid) {
            return Ok(());
        }
    }
    match found {
        Some(e) => {
            let ext = crate::types::Extent::decode(&e.payload)?;
            for id in ext.chunks() {
                crate::history::liveness::add_ref(fs, w, id, touched)?;
            }
            w.put(&dkey, &e.payload, tid)?;
        }
        None => {
            w.end(&dkey, tid)?;
        }
    }
    Ok(())
}

fn put_inode(w: &mut MetaWrite<'_>, i: &Inode, tid: u64) -> Result<()> {
    w.put(
        &ElemKey::new(i.ino, RecordType::Inode, &[]),
        &i.encode(),
        tid,
    )?;
    Ok(())
}
