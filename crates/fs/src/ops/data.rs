//! File data operations: read, write, truncate, fallocate, statfs (fsync
//! is in writeback/intent.rs). Writes go to the dirty overlay as whole
//! blocks, or as patches over committed blocks they cover in part
//! (writeback/patch.rs); space is reserved against the pool's free space so a
//! full pool gives ENOSPC to the writer instead of failing a later commit.

use crate::error::{invariant, FsError, Result};
use crate::types::{Extent, FileKind, Inode};
use crate::vfs::{Fs, State};
use crate::writeback::overlay::{Block, BlockState};
use crate::writeback::patch::Patch;
use crate::writeback::pieces::gaps;
use cairn_data::{ChunkRec, CHUNK_HEADER_LEN};
use std::sync::Arc;

/// Records this small (and volume blocks, which are records) make a pool
/// whose commits are mostly metadata: see `Fs::throttle`.
const SMALL_RECORD: u64 = 16 << 10;

pub const FALLOC_KEEP_SIZE: i32 = 0x01;
pub const FALLOC_PUNCH_HOLE: i32 = 0x02;
pub const FALLOC_ZERO_RANGE: i32 = 0x10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

impl Fs {
    /// A block to edit: taken out of the dirty overlay when it is there
    /// (a patch there is put over the block below it), else a copy of the
    /// current bytes.
    pub(crate) fn editable_block(&self, st: &mut State, ino: u64, blk: u64) -> Result<Vec<u8>> {
        if let Some(b) = st.dirty(ino).take_block(ino, blk) {
            return Ok(Arc::try_unwrap(b).unwrap_or_else(|b| (*b).clone()));
        }
        let patch = st.dirty(ino).take_patch(ino, blk);
        let below = self.block_state(st, ino, blk);
        match patch {
            Some(p) => self.resolve(ino, blk, BlockState::Patch(p, Box::new(below))),
            None => self.resolve(ino, blk, below),
        }
    }

    pub fn read(&self, ino: u64, off: u64, size: u32) -> Result<Vec<u8>> {
        let mut out = vec![0u8; size as usize];
        let n = self.read_into(ino, off, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// Reads from `off` into `dst` (as many bytes as the file has there, at
    /// most `dst.len()`) and returns the count. Every one of those bytes is
    /// written, holes and unwritten tails as zeros, so `dst` may hold
    /// anything beforehand (the frontend passes its reply buffer).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "end - off is at most dst.len(); u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    pub fn read_into(&self, ino: u64, off: u64, dst: &mut [u8]) -> Result<usize> {
        let rs = self.record;
        let (end, parts, meta) = {
            let st = self.lock_inos(&[ino]);
            let i = self.inode(&st, ino)?;
            if i.kind == FileKind::Dir {
                return Err(FsError::IsDir);
            }
            let end = i.size.min(off.saturating_add(dst.len() as u64));
            if off >= end {
                return Ok(0);
            }
            let parts: Vec<(u64, BlockState)> = (off / rs..end.div_ceil(rs))
                .map(|b| (b, self.block_state(&st, ino, b)))
                .collect();
            // Committed blocks are read through the shared view, which a
            // commit replaces in the lock section that retires its overlay,
            // so it holds every block found committed here. A chunk moved
            // since (GC, reblock) fails its checks and `with_chunk` reads
            // it again through a fresh view.
            let committed = parts.iter().any(|(_, s)| s.reads_committed());
            let meta = committed.then(|| self.ns_meta(&st)).transpose()?;
            (end, parts, meta)
        };
        let out = &mut dst[..(end - off) as usize];
        let mut cover = Cover::new(off);
        let mut run: Vec<(u64, Extent, ChunkRec)> = Vec::new();
        for (blk, state) in parts {
            let data: Block = match state {
                BlockState::Data(d) => d,
                BlockState::Hole => continue,
                BlockState::Patch(p, below) if matches!(*below, BlockState::Committed) => {
                    let r = meta.as_ref().expect("a view for committed blocks");
                    self.read_run(r, ino, off, out, &mut run)?;
                    self.read_patched_part(r, ino, blk, &p, off, out, &mut cover)?;
                    continue;
                }
                p @ BlockState::Patch(..) => Arc::new(self.resolve(ino, blk, p)?),
                BlockState::Committed => {
                    let r: &cairn_meta::MetaRead =
                        meta.as_ref().expect("a view for committed blocks");
                    let Some(ext) = self.committed_extent(r, ino, blk)? else {
                        continue;
                    };
                    cover.claim(out, blk * rs, ext.len as u64);
                    match self.run_member(r, blk, &ext, off, out.len())? {
                        Some(rec) => {
                            let follows = run.last().is_some_and(|(b, _, prev)| {
                                *b + 1 == blk && self.pool.chunks.is_run(prev, &rec)
                            });
                            if !follows {
                                self.read_run(r, ino, off, out, &mut run)?;
                            }
                            run.push((blk, ext, rec));
                        }
                        None => {
                            self.read_run(r, ino, off, out, &mut run)?;
                            self.read_extent_part(r, ino, blk, &ext, off, out)?;
                        }
                    }
                    continue;
                }
            };
            cover.claim(out, blk * rs, data.len() as u64);
            copy_block_part(out, off, blk * rs, &data);
        }
        if let Some(r) = &meta {
            self.read_run(r, ino, off, out, &mut run)?;
        }
        cover.finish(out);
        Ok(out.len())
    }

    /// The chunk record of a block that can join a run read: the whole
    /// chunk is the block's valid bytes (no pieces over it) and lies
    /// inside the read.
    fn run_member(
        &self,
        r: &cairn_meta::MetaRead,
        blk: u64,
        ext: &Extent,
        off: u64,
        len: usize,
    ) -> Result<Option<ChunkRec>> {
        let bstart = blk * self.record;
        if bstart < off || bstart + ext.len as u64 > off + len as u64 {
            return Ok(None);
        }
        let Some(raw) = r.chunk(ext.chunk)? else {
            return Ok(None);
        };
        let rec = ChunkRec::decode(&raw)?;
        Ok((rec.raw_len == ext.len && ext.pieces.is_empty()).then_some(rec))
    }

    /// Reads the blocks of a run (file-consecutive, stored back to back)
    /// into `out` with one device read, or one by one if it is a single
    /// block or the run read fails (moved, damaged: the single reads retry
    /// and report). Empties `run`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "an offset within the output buffer; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn read_run(
        &self,
        r: &cairn_meta::MetaRead,
        ino: u64,
        off: u64,
        out: &mut [u8],
        run: &mut Vec<(u64, Extent, ChunkRec)>,
    ) -> Result<()> {
        let rs = self.record;
        if run.len() > 1 {
            let mut parts: Vec<(ChunkRec, &mut [u8])> = Vec::with_capacity(run.len());
            let mut rest = &mut out[..];
            let mut at = off;
            for (blk, ext, rec) in run.iter() {
                let skip = (blk * rs - at) as usize;
                let (dst, tail) = rest[skip..].split_at_mut(ext.len as usize);
                parts.push((rec.clone(), dst));
                rest = tail;
                at = blk * rs + ext.len as u64;
            }
            if self.pool.chunks.read_run_into(&mut parts).is_ok() {
                run.clear();
                return Ok(());
            }
        }
        for (blk, ext, _) in run.drain(..) {
            self.read_extent_part(r, ino, blk, &ext, off, out)?;
        }
        Ok(())
    }

    /// Puts the part of a committed block that falls in `out` (which starts
    /// at file offset `off`) in place, straight from the device: only the
    /// 4 KiB spans of the chunk that part touches are read when the chunk
    /// has sums, so a small random read reads about that much.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within one record (record size <= 1 MiB, check_geometry) and the output buffer"
    )]
    pub(crate) fn read_extent_part(
        &self,
        r: &cairn_meta::MetaRead,
        ino: u64,
        blk: u64,
        ext: &Extent,
        off: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let bstart = blk * self.record;
        let lo = off.max(bstart);
        let hi = (off + out.len() as u64).min(bstart + ext.len as u64);
        if lo >= hi {
            return Ok(());
        }
        let dst = &mut out[(lo - off) as usize..(hi - off) as usize];
        let from = (lo - bstart) as usize;
        // The base chunk is read only where no piece lies over it.
        let pieces = ext.pieces.iter().map(|p| (p.off, p.off + p.len));
        for (a, b) in gaps(from as u32, (from + dst.len()) as u32, pieces) {
            let (a, b) = (a as usize, b as usize);
            let part = &mut dst[a - from..b - from];
            self.with_chunk(r, ino, blk, ext.chunk, |rec| {
                // Bytes past the chunk's end and inside the valid length
                // read as zeros.
                let have = (rec.raw_len as usize).saturating_sub(a).min(part.len());
                let (data, zeros) = part.split_at_mut(have);
                zeros.fill(0);
                if data.is_empty() {
                    return Ok(());
                }
                self.pool.chunks.read_part_into(rec, a, data)
            })?;
        }
        self.read_pieces(r, ino, blk, ext, from, dst)
    }

    /// Puts a committed block with a buffered patch over it (an append or
    /// an edit not flushed yet) in place in `out`, without building the
    /// whole block: the committed bytes from the device, zeros past them up
    /// to the patch's end, then the patch's ranges.
    #[allow(
        clippy::too_many_arguments,
        reason = "the read's view, file, block, patch, output buffer and its cover: all needed, none derivable"
    )]
    fn read_patched_part(
        &self,
        r: &cairn_meta::MetaRead,
        ino: u64,
        blk: u64,
        patch: &Patch,
        off: u64,
        out: &mut [u8],
        cover: &mut Cover,
    ) -> Result<()> {
        let bstart = blk * self.record;
        let ext = self.committed_extent(r, ino, blk)?;
        let base = ext.as_ref().map_or(0, |e| u64::from(e.len));
        let len = base.max(patch.end() as u64);
        invariant!(
            len <= self.record,
            "inode {ino} block {blk}: {len} bytes under a patch, more than the record size"
        );
        cover.claim(out, bstart, len);
        if let Some(ext) = &ext {
            self.read_extent_part(r, ino, blk, ext, off, out)?;
        }
        zero_block_part(out, off, bstart + base, bstart + len);
        for (at, bytes) in patch.ranges() {
            copy_block_part(out, off, bstart + at as u64, bytes);
        }
        Ok(())
    }

    /// Bytes the dirty data may still grow by before the pool is full.
    fn space_available(&self, flushing: &crate::writeback::committing::Committing) -> u64 {
        let c = &self.pool.chunks;
        let free = c.free_bytes();
        let seg = c.segment_size();
        let waste = seg + (free / seg) * (self.record + CHUNK_HEADER_LEN as u64);
        let rs = self.record;
        let pending = self.load.flush_bytes(rs) + flushing.flush_bytes(rs);
        let pending = pending + pending / 64;
        free.saturating_sub(waste).saturating_sub(pending)
    }

    pub fn write(&self, ino: u64, off: u64, data: &[u8]) -> Result<u32> {
        if data.is_empty() {
            return Ok(0);
        }
        off.checked_add(data.len() as u64).ok_or(FsError::Invalid)?;
        let n = u32::try_from(data.len()).map_err(|_| FsError::Invalid)?;
        self.check_room()?;
        let _busy = self.writes.begin();
        let mut reclaimed = 0;
        loop {
            self.check_ok()?;
            let mut st = self.lock_inos(&[ino]);
            if self.space_available(&st.flushing) < data.len() as u64 + self.record {
                drop(st);
                self.reclaim(reclaimed)?;
                reclaimed += 1;
                continue;
            }
            // A write that met a violated invariant stops the filesystem
            // as a commit that met one does.
            (self.write_locked(&mut st, ino, off, data)).map_err(|e| self.stop_on_invariant(e))?;
            st.dirty(ino).written += data.len() as u64;
            drop(st);
            let l = &self.load;
            let (dirty, written) = (l.bytes(), l.written());
            let whole = dirty.saturating_sub(l.patched());
            self.throttle(dirty, whole, written)?;
            return Ok(n);
        }
    }

    /// A writer is short of space: step 0 commits and drops fine-grained
    /// history, step 1 drops the stripes whose segments all died (their
    /// slots stay held until then) and compacts segments holding garbage
    /// (GC, best effort: it needs a little room itself), and after that
    /// the answer is ENOSPC.
    fn reclaim(&self, step: u32) -> Result<()> {
        match step {
            0 => self.flush_with(true),
            1 => {
                if let Err(e) = self.drop_unneeded_stripes() {
                    tracing::warn!("dropping unused stripes for a writer short of space: {e}");
                }
                if let Err(e) = self.gc(95, 0, &|_, _| {}) {
                    tracing::warn!("compaction for a writer short of space: {e}");
                }
                Ok(())
            }
            _ => Err(FsError::NoSpace),
        }
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within one record (record size <= 1 MiB, check_geometry) or within data"
    )]
    fn write_locked(&self, st: &mut State, ino: u64, off: u64, data: &[u8]) -> Result<()> {
        let rs = self.record;
        let mut i = self.inode(st, ino)?;
        if i.kind != FileKind::File {
            return Err(if i.kind == FileKind::Dir {
                FsError::IsDir
            } else {
                FsError::Invalid
            });
        }
        let end = off + data.len() as u64;
        for blk in off / rs..end.div_ceil(rs) {
            let bstart = blk * rs;
            let lo = (off.max(bstart) - bstart) as usize;
            let hi = (end.min(bstart + rs) - bstart) as usize;
            let valid = i.size.saturating_sub(bstart).min(rs) as usize;
            let src = (bstart + lo as u64 - off) as usize;
            self.write_part(st, ino, blk, lo, &data[src..src + (hi - lo)], valid)?;
        }
        let now = Self::now();
        i.size = i.size.max(end);
        i.mtime = now;
        i.ctime = now;
        st.put_inode(i);
        Ok(())
    }

    /// Writes `src` at `lo` of block `blk`, whose first `valid` bytes can
    /// be read: a whole new block when it covers them, an edit of a block
    /// in memory, or a patch over a block that would have to be read.
    pub(crate) fn write_part(
        &self,
        st: &mut State,
        ino: u64,
        blk: u64,
        lo: usize,
        src: &[u8],
        valid: usize,
    ) -> Result<()> {
        let hi = lo + src.len();
        // The bytes land inside their block: past the record size they
        // would be another block's, and the extent would say so.
        invariant!(
            hi as u64 <= self.record && valid as u64 <= self.record,
            "inode {ino} block {blk}: bytes {lo}..{hi} (valid {valid}) in records of {}",
            self.record
        );
        let mut buf = if lo == 0 && hi >= valid {
            st.dirty(ino).take_block(ino, blk);
            st.dirty(ino).take_patch(ino, blk);
            Vec::with_capacity(hi)
        } else if let Some(b) = st.dirty(ino).take_block(ino, blk) {
            Arc::try_unwrap(b).unwrap_or_else(|b| (*b).clone())
        } else if st.dirty(ino).has_patch(ino, blk) {
            // Checked first: `block_state` would copy the patch.
            st.dirty(ino).put_patch(ino, blk, lo, src, valid);
            return Ok(());
        } else {
            match self.block_state(st, ino, blk) {
                BlockState::Committed | BlockState::Patch(..) => {
                    st.dirty(ino).put_patch(ino, blk, lo, src, valid);
                    return Ok(());
                }
                below => self.resolve(ino, blk, below)?,
            }
        };
        put_part(&mut buf, lo, src);
        st.dirty(ino).put_block(ino, blk, Arc::new(buf), lo, hi);
        Ok(())
    }

    /// Kicks the flusher once users wrote an eighth of the dirty limit in
    /// whole blocks (`whole` bytes of `dirty`), so that flushing overlaps
    /// with writing, or once the buffered bytes take half of it. Small
    /// writes into committed blocks are patches, which cost a read each at
    /// the flush: waiting lets later writes land in the same blocks, so they
    /// count only towards half the limit. So do all writes of a pool with
    /// small records (`SMALL_RECORD`): each of its blocks costs more to
    /// commit (elements, chunk record, dedup entry in random places of the
    /// metadata tree) than to write, and a commit that batches more blocks
    /// rewrites fewer metadata pages per block (4 KiB random volume writes:
    /// about 48 us of commit per block at an eighth, 24 at half). Writers
    /// wait for a flush above twice the limit. Blocks a tick stored count
    /// only towards the whole limit (RAM): committing them is one reference
    /// each, and a tree committed less often writes fewer metadata pages
    /// per block (`tick.rs`).
    fn throttle(&self, dirty: u64, whole: u64, written: u64) -> Result<()> {
        let limit = self.pool.config.dirty_limit_mib << 20;
        let load = Buffered {
            dirty,
            whole,
            written,
            stored: self.ticks.stored_bytes(),
        };
        match load.wants(limit, self.record > SMALL_RECORD) {
            Wants::Flush => self.flush()?,
            Wants::Commit => self.kick_flusher(),
            Wants::Nothing => {
                let small = self.record <= SMALL_RECORD;
                if self.ticks_on() && self.ticks.wants_tick(small, written) {
                    self.ask_tick();
                }
            }
        }
        Ok(())
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "size % rs is below the record size (<= 1 MiB, check_geometry)"
    )]
    pub(crate) fn truncate(&self, ino: u64, size: u64) -> Result<()> {
        let rs = self.record;
        let mut st = self.lock_inos(&[ino]);
        let i = self.inode(&st, ino)?;
        match i.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(FsError::IsDir),
            _ => return Err(FsError::Invalid),
        }
        if size < i.size {
            let tail = (size % rs) as usize;
            if tail != 0 {
                let mut b = self.editable_block(&mut st, ino, size / rs)?;
                b.truncate(tail);
                st.dirty(ino)
                    .put_block(ino, size / rs, Arc::new(b), tail, tail);
            }
            st.dirty(ino).truncate_blocks(ino, size.div_ceil(rs));
        }
        self.set_size(&mut st, i, size);
        Ok(())
    }

    fn set_size(&self, st: &mut State, mut i: Inode, size: u64) {
        let now = Self::now();
        i.size = size;
        i.mtime = now;
        i.ctime = now;
        st.put_inode(i);
    }

    pub fn fallocate(&self, ino: u64, off: u64, len: u64, mode: i32) -> Result<()> {
        self.check_ok()?;
        let end = off.checked_add(len).ok_or(FsError::Invalid)?;
        if len == 0 {
            return Err(FsError::Invalid);
        }
        let keep = mode & FALLOC_KEEP_SIZE != 0;
        let zero = mode & (FALLOC_PUNCH_HOLE | FALLOC_ZERO_RANGE) != 0;
        if mode & !(FALLOC_KEEP_SIZE | FALLOC_PUNCH_HOLE | FALLOC_ZERO_RANGE) != 0
            || (mode & FALLOC_PUNCH_HOLE != 0 && !keep)
        {
            return Err(FsError::NotSupported);
        }
        let mut st = self.lock_inos(&[ino]);
        let i = self.inode(&st, ino)?;
        if i.kind != FileKind::File {
            return Err(if i.kind == FileKind::Dir {
                FsError::IsDir
            } else {
                FsError::NotSupported
            });
        }
        if zero {
            self.zero_range(&mut st, ino, off, end.min(i.size))?;
        }
        if !keep && end > i.size {
            self.set_size(&mut st, i, end);
        } else if zero {
            self.set_size(&mut st, i.clone(), i.size);
        }
        Ok(())
    }

    /// Makes [off, end) read as zeros: whole blocks become holes.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within one record (record size <= 1 MiB, check_geometry)"
    )]
    fn zero_range(&self, st: &mut State, ino: u64, off: u64, end: u64) -> Result<()> {
        let rs = self.record;
        if off >= end {
            return Ok(());
        }
        for blk in off / rs..end.div_ceil(rs) {
            let bstart = blk * rs;
            let lo = (off.max(bstart) - bstart) as usize;
            let hi = (end.min(bstart + rs) - bstart) as usize;
            let mut b = if lo == 0 && hi as u64 == rs {
                Vec::new()
            } else {
                self.editable_block(st, ino, blk)?
            };
            if lo < b.len() {
                let h = hi.min(b.len());
                b[lo..h].fill(0);
            }
            st.dirty(ino).put_block(ino, blk, Arc::new(b), lo, hi);
        }
        Ok(())
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "bsize is 4096; MAX_NAME is 255"
    )]
    pub fn statfs(&self) -> Statfs {
        let bsize = 4096u64;
        let (total, _) = self.pool.chunks.devices().slot_totals();
        let seg = self.pool.chunks.segment_size();
        let host = self.pool.chunks.devices().host_free_limit();
        let flushing = self.flushing.read().clone();
        let avail_bytes = self
            .space_available(&flushing)
            .min(host.unwrap_or(u64::MAX));
        let avail = avail_bytes / bsize;
        let ffree = avail_bytes / crate::ops::inodes::BYTES_PER_INODE;
        Statfs {
            blocks: total * seg / bsize,
            bfree: avail,
            bavail: avail,
            files: self.used_inodes() + ffree,
            ffree,
            bsize: bsize as u32,
            namelen: crate::types::MAX_NAME as u32,
        }
    }
}

/// Puts `part` at offset `lo` of a block buffer, zero-filling any gap; an
/// append is a plain copy (no zeroing of bytes about to be overwritten).
fn put_part(buf: &mut Vec<u8>, lo: usize, part: &[u8]) {
    if buf.len() < lo {
        buf.resize(lo, 0);
    }
    let hi = lo + part.len();
    if buf.len() == lo {
        buf.extend_from_slice(part);
    } else {
        if buf.len() < hi {
            buf.resize(hi, 0);
        }
        buf[lo..hi].copy_from_slice(part);
    }
}

/// Zeroes what no block writes in a read buffer, so that it may start with
/// any contents: blocks claim their byte ranges in file order, and the gaps
/// between claims (holes, tails past a block's valid length) and after the
/// last one are zeroed.
struct Cover {
    /// File offset of the buffer's first byte.
    off: u64,
    /// Buffer bytes already claimed or zeroed.
    done: usize,
}

impl Cover {
    fn new(off: u64) -> Self {
        Cover { off, done: 0 }
    }

    /// A block at file offset `start` will write its first `len` bytes
    /// (clipped to the buffer): zero the gap before them.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within the claimed buffer; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn claim(&mut self, out: &mut [u8], start: u64, len: u64) {
        let end = self.off + out.len() as u64;
        let lo = start.max(self.off).min(end);
        let hi = (start + len).min(end).max(lo);
        let (lo, hi) = ((lo - self.off) as usize, (hi - self.off) as usize);
        assert!(lo >= self.done, "read blocks claimed out of order");
        out[self.done..lo].fill(0);
        self.done = hi;
    }

    /// Zeroes the rest of the buffer after the last claim.
    fn finish(self, out: &mut [u8]) {
        out[self.done..].fill(0);
    }
}

/// Copies the part of a block (starting at file offset `bstart`) that lies
/// in the output buffer (starting at file offset `off`).
#[allow(
    clippy::cast_possible_truncation,
    reason = "offsets within one record (record size <= 1 MiB, check_geometry)"
)]
pub(crate) fn copy_block_part(out: &mut [u8], off: u64, bstart: u64, data: &[u8]) {
    let Some(dst) = out_span(off, out.len(), bstart, bstart + data.len() as u64) else {
        return;
    };
    let src = (off + dst.start as u64 - bstart) as usize;
    out[dst.clone()].copy_from_slice(&data[src..src + dst.len()]);
}

/// Zeroes file bytes `lo..hi` where they lie in the output buffer
/// (starting at file offset `off`).
fn zero_block_part(out: &mut [u8], off: u64, lo: u64, hi: u64) {
    if let Some(dst) = out_span(off, out.len(), lo, hi) {
        out[dst].fill(0);
    }
}

/// Where file bytes `lo..hi` lie in an output buffer of `len` bytes that
/// starts at file offset `off`; None when they lie outside it.
#[allow(
    clippy::cast_possible_truncation,
    reason = "offsets within the output buffer; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
fn out_span(off: u64, len: usize, lo: u64, hi: u64) -> Option<std::ops::Range<usize>> {
    let (lo, hi) = (lo.max(off), hi.min(off + len as u64));
    (lo < hi).then(|| (lo - off) as usize..(hi - off) as usize)
}

/// What a writer's throttle sees (bytes; see `Fs::throttle`).
struct Buffered {
    dirty: u64,
    whole: u64,
    written: u64,
    /// Of `dirty`, in blocks a tick stored (`Ticks::stored_bytes`).
    stored: u64,
}

/// What the buffered writes want of the flusher.
#[derive(Debug, PartialEq)]
enum Wants {
    /// The writer flushes itself (above twice the limit).
    Flush,
    /// The flusher commits.
    Commit,
    Nothing,
}

impl Buffered {
    fn wants(&self, limit: u64, big_records: bool) -> Wants {
        let early = big_records && self.written > limit / 8 && self.whole > limit / 8;
        let unstored = self.dirty.saturating_sub(self.stored);
        if self.dirty > 2 * limit {
            Wants::Flush
        } else if early || unstored > limit / 2 || self.dirty > limit {
            Wants::Commit
        } else {
            Wants::Nothing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Buffered, Wants};

    const MIB: u64 = 1 << 20;

    fn small_pool(dirty: u64, stored: u64) -> Wants {
        let b = Buffered {
            dirty: dirty * MIB,
            whole: dirty * MIB,
            written: dirty * MIB,
            stored: stored * MIB,
        };
        b.wants(512 * MIB, false)
    }

    #[test]
    fn blocks_a_tick_stored_count_only_towards_the_whole_dirty_limit() {
        // Half the limit not stored: a commit, as before ticks.
        assert_eq!(small_pool(257, 0), Wants::Commit);
        assert_eq!(small_pool(255, 0), Wants::Nothing);
        // Stored by ticks: up to the whole limit before a commit.
        assert_eq!(small_pool(500, 300), Wants::Nothing);
        assert_eq!(small_pool(500, 200), Wants::Commit);
        assert_eq!(small_pool(513, 513), Wants::Commit);
        // Above twice the limit the writer flushes, stored or not.
        assert_eq!(small_pool(1025, 1025), Wants::Flush);
    }

    #[test]
    fn pools_of_large_records_commit_after_an_eighth_of_whole_blocks() {
        let b = |whole: u64| Buffered {
            dirty: 100 * MIB,
            whole: whole * MIB,
            written: 100 * MIB,
            stored: 0,
        };
        assert_eq!(b(65).wants(512 * MIB, true), Wants::Commit);
        assert_eq!(b(63).wants(512 * MIB, true), Wants::Nothing);
        assert_eq!(b(65).wants(512 * MIB, false), Wants::Nothing);
    }
}
