//! Sparse files: SEEK_DATA/SEEK_HOLE at block granularity and the blocks
//! a file really stores (st_blocks). Both merge the write-back overlays
//! (dirty, then flushing) with the committed extent elements of the file,
//! which lie in one key range. Committed totals are cached per inode and
//! keyed by the create TID of its committed inode element: every commit
//! that changes a file's extents writes its inode too.

use crate::error::{FsError, Result};
use crate::state::State;
use crate::types::{Extent, FileKind, Inode};
use crate::vfs::Fs;
use crate::writeback::overlay::{Block, InoMap, Overlay};
use cairn_data::ChunkRec;
use cairn_meta::{ElemKey, MetaRead, RecordType};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Committed stored bytes of files: ino -> (inode create TID, 512-byte
/// blocks, first block index past the last extent).
#[derive(Default)]
pub(crate) struct StoredCache(parking_lot::Mutex<InoMap<(u64, u64, u64)>>);

/// What a file's st_blocks is computed from (`Fs::stored_parts`).
struct StoredParts {
    buffered: BTreeMap<u64, u64>,
    trunc: Option<u64>,
    tid: u64,
    view: Arc<MetaRead>,
}

/// Entries kept before the cache is emptied.
const CACHE_MAX: usize = 1 << 20;

/// What the overlays say about a file's blocks: per block, data or hole.
struct OverlayView {
    layers: Vec<(BTreeMap<u64, bool>, Option<u64>)>,
}

impl OverlayView {
    /// Some(true) data, Some(false) hole, None: the committed extent says.
    fn decide(&self, blk: u64) -> Option<bool> {
        for (blocks, trunc) in &self.layers {
            if let Some(&d) = blocks.get(&blk) {
                return Some(d);
            }
            if trunc.is_some_and(|t| blk >= t) {
                return Some(false);
            }
        }
        None
    }

    /// Indexes of buffered data blocks from `from` on that no upper layer
    /// overrides (unordered across layers).
    fn data_blocks(&self, from: u64) -> impl Iterator<Item = u64> + '_ {
        self.layers
            .iter()
            .enumerate()
            .flat_map(move |(n, (b, _))| b.range(from..).map(move |(&k, &d)| (n, k, d)))
            .filter(move |&(n, k, d)| d && self.layers[..n].iter().all(|l| layer_silent(l, k)))
            .map(|(_, k, _)| k)
    }
}

fn layer_silent(l: &(BTreeMap<u64, bool>, Option<u64>), blk: u64) -> bool {
    !l.0.contains_key(&blk) && l.1.is_none_or(|t| blk < t)
}

/// A buffered block holds data unless it is empty or all zeros (the flush
/// stores such a block as a hole).
fn is_data(b: &Block) -> bool {
    b.iter().any(|&x| x != 0)
}

fn layer(o: &Overlay, ino: u64) -> (BTreeMap<u64, bool>, Option<u64>) {
    let mut blocks: BTreeMap<u64, bool> = o
        .blocks
        .get(&ino)
        .map(|m| m.iter().map(|(&k, b)| (k, is_data(b))).collect())
        .unwrap_or_default();
    // A patch holds data (what it was written over is data or a hole
    // written over).
    blocks.extend(
        o.patches
            .get(&ino)
            .into_iter()
            .flatten()
            .map(|(&k, _)| (k, true)),
    );
    (blocks, o.truncs.get(&ino).copied())
}

impl Fs {
    /// The overlays' view of a file's blocks plus its size and kind.
    fn overlay_view(&self, ino: u64) -> Result<(OverlayView, u64, FileKind)> {
        let st = self.lock_inos(&[ino]);
        let i = self.inode(&st, ino)?;
        let layers = st.newest_first(ino).map(|o| layer(o, ino)).collect();
        Ok((OverlayView { layers }, i.size, i.kind))
    }

    /// lseek(SEEK_DATA) (`data`) or lseek(SEEK_HOLE): the first offset at
    /// or after `off` in data, or in a hole (the end of the file counts as
    /// a hole). ENXIO when `off` is at or past the end, or no data follows.
    pub fn seek_data_hole(&self, ino: u64, off: u64, data: bool) -> Result<u64> {
        let (ov, size, kind) = self.overlay_view(ino)?;
        if kind == FileKind::Dir {
            return Err(FsError::IsDir);
        }
        if off >= size {
            return Err(FsError::NoData);
        }
        let rs = self.record;
        let r = self.meta()?;
        let found = if data {
            self.next_data(&r, &ov, ino, off / rs)?
        } else {
            self.next_hole(&r, &ov, ino, off / rs, size.div_ceil(rs))?
        };
        match found {
            Some(b) if b * rs < size => Ok((b * rs).max(off)),
            _ if data => Err(FsError::NoData),
            _ => Ok(size),
        }
    }

    /// The first data block at or after `from`.
    fn next_data(
        &self,
        r: &MetaRead,
        ov: &OverlayView,
        ino: u64,
        from: u64,
    ) -> Result<Option<u64>> {
        let buffered = ov.data_blocks(from).min();
        let mut at = from;
        loop {
            let batch = committed_blocks(r, ino, at, 1024)?;
            for &(b, _) in &batch {
                if buffered.is_some_and(|x| x <= b) {
                    return Ok(buffered);
                }
                if ov.decide(b).is_none() {
                    return Ok(Some(b));
                }
            }
            match batch.last() {
                Some(&(b, _)) if batch.len() == 1024 => at = b + 1,
                _ => return Ok(buffered),
            }
        }
    }

    /// The first hole block in [from, end), if any.
    fn next_hole(
        &self,
        r: &MetaRead,
        ov: &OverlayView,
        ino: u64,
        from: u64,
        end: u64,
    ) -> Result<Option<u64>> {
        let mut blk = from;
        let mut batch = committed_blocks(r, ino, blk, 1024)?.into_iter().peekable();
        while blk < end {
            while batch.peek().is_some_and(|&(b, _)| b < blk) {
                batch.next();
            }
            if batch.peek().is_none() {
                batch = committed_blocks(r, ino, blk, 1024)?.into_iter().peekable();
            }
            let committed = batch.peek().is_some_and(|&(b, _)| b == blk);
            if !ov.decide(blk).unwrap_or(committed) {
                return Ok(Some(blk));
            }
            blk += 1;
        }
        Ok(None)
    }

    /// st_blocks of a file: 512-byte units really stored. Committed blocks
    /// count their chunk's stored length (after compression; a chunk shared
    /// by dedup or a clone counts in every file, as du expects), buffered
    /// blocks their length. Other kinds: their size. Errors fall back to
    /// the size.
    pub fn stored_blocks(&self, ino: u64) -> u64 {
        self.getattr_blocks(ino).map_or(0, |(_, blocks)| blocks)
    }

    /// st_blocks of an inode already read (a reply that carries it).
    pub fn stored_blocks_of(&self, i: &Inode) -> u64 {
        if let Some(blocks) = blocks_from_inode(i) {
            return blocks;
        }
        let parts = self.stored_parts(&self.lock_inos(&[i.ino]), i.ino, None);
        self.blocks_from_parts(i, parts)
    }

    /// The inode and its st_blocks, with its shard locked once (a GETATTR
    /// asks for both).
    pub fn getattr_blocks(&self, ino: u64) -> Result<(Inode, u64)> {
        let (i, known) = {
            let st = self.lock_inos(&[ino]);
            let (i, tid) = self.inode_and_tid(&st, ino)?;
            // Err: the parts to look the blocks up from, gathered now.
            let known = blocks_from_inode(&i).ok_or_else(|| self.stored_parts(&st, ino, tid));
            (i, known)
        };
        let blocks = known.unwrap_or_else(|parts| self.blocks_from_parts(&i, parts));
        Ok((i, blocks))
    }

    /// st_blocks of a non-empty regular file from its gathered parts; an
    /// error falls back to the size.
    fn blocks_from_parts(&self, i: &Inode, parts: Result<StoredParts>) -> u64 {
        parts
            .and_then(|p| self.stored_total(i.ino, p))
            .unwrap_or_else(|e| {
                tracing::debug!("st_blocks of inode {}: {e}", i.ino);
                i.size.div_ceil(512)
            })
    }

    /// What st_blocks needs from under the shard lock: the overlays'
    /// buffered blocks, the smallest truncate among them, the create TID of
    /// the committed inode element (0: never committed) and the shared
    /// namespace view (a chunk's stored length does not change when
    /// reblock or GC moves it, and the view is dropped at every flush
    /// commit and at clones). `tid`: that create TID when the caller read
    /// the committed inode element under this same lock.
    fn stored_parts(&self, st: &State, ino: u64, tid: Option<u64>) -> Result<StoredParts> {
        let view = self.ns_meta(st)?;
        let tid = match tid {
            Some(t) => t,
            None => view
                .get_of_inode(&ElemKey::new(ino, RecordType::Inode, &[]))?
                .map_or(0, |e| e.create_tid),
        };
        let mut buffered: BTreeMap<u64, u64> = BTreeMap::new();
        let mut trunc: Option<u64> = None;
        for o in st.oldest_first(ino) {
            if let Some(&t) = o.truncs.get(&ino) {
                trunc = Some(trunc.map_or(t, |x: u64| x.min(t)));
                buffered.retain(|&b, _| b < t);
            }
            for (&b, d) in o.blocks.get(&ino).into_iter().flatten() {
                buffered.insert(b, d.len() as u64);
            }
            for (&b, p) in o.patches.get(&ino).into_iter().flatten() {
                let e = buffered.entry(b).or_insert(0);
                *e = (*e).max(p.end() as u64);
            }
        }
        Ok(StoredParts {
            buffered,
            trunc,
            tid,
            view,
        })
    }

    /// st_blocks of a regular file from its gathered parts, reading
    /// committed extents only when the cache cannot answer.
    fn stored_total(&self, ino: u64, p: StoredParts) -> Result<u64> {
        let StoredParts {
            buffered,
            trunc,
            tid,
            view: r,
        } = p;
        let hit = trunc
            .is_none()
            .then(|| self.cached_total(ino, tid))
            .flatten();
        if let Some((total, end)) = hit {
            if buffered.keys().all(|&b| b >= end) {
                // The common case (a stat of an unchanged file): no read
                // transaction at all.
                return Ok(total + buffered.values().map(|l| l.div_ceil(512)).sum::<u64>());
            }
        }
        let (total, end) = match (hit, trunc) {
            (Some(h), _) => h,
            // Never committed (a file made since the last flush commit):
            // no committed extents, so no read of them.
            (None, _) if tid == 0 => (0, 0),
            (None, Some(t)) => committed_total(&r, ino, t)?,
            (None, None) => {
                let (total, end) = committed_total(&r, ino, u64::MAX)?;
                self.cache_total(ino, tid, total, end);
                (total, end)
            }
        };
        let mut blocks = total;
        for (&b, &len) in &buffered {
            if b < end {
                blocks -= stored_of(&r, ino, b)?.min(blocks);
            }
            blocks += len.div_ceil(512);
        }
        Ok(blocks)
    }

    /// The cached committed total of a file if its inode element is still
    /// the one the entry was computed for.
    fn cached_total(&self, ino: u64, tid: u64) -> Option<(u64, u64)> {
        match self.stored.0.lock().get(&ino) {
            Some(&(t, total, end)) if t == tid && tid != 0 => Some((total, end)),
            _ => None,
        }
    }

    fn cache_total(&self, ino: u64, tid: u64, total: u64, end: u64) {
        let mut c = self.stored.0.lock();
        if c.len() >= CACHE_MAX {
            c.clear();
        }
        c.insert(ino, (tid, total, end));
    }

    /// Forgets the cached total of a file (its extents changed outside a
    /// flush that rewrote its inode).
    pub(crate) fn forget_stored(&self, ino: u64) {
        self.stored.0.lock().remove(&ino);
    }
}

/// st_blocks when the inode alone says it: other kinds count their size,
/// an empty file stores nothing (a new file, a truncated one); None for a
/// regular file with bytes, whose blocks must be looked up.
fn blocks_from_inode(i: &Inode) -> Option<u64> {
    match i.kind {
        FileKind::File if i.size > 0 => None,
        FileKind::File => Some(0),
        _ => Some(i.size.div_ceil(512)),
    }
}

/// Committed extents of a file from block `from`: (block, extent), at most
/// `limit`.
fn committed_blocks(r: &MetaRead, ino: u64, from: u64, limit: usize) -> Result<Vec<(u64, Extent)>> {
    let prefix = ElemKey::prefix(ino, RecordType::Extent);
    let start = ElemKey::extent(ino, from);
    r.scan(&prefix, Some(start.as_bytes()), limit)?
        .into_iter()
        .map(|e| {
            let blk = e.key.extent_block()?;
            Ok((blk, Extent::decode(&e.payload)?))
        })
        .collect()
}

/// 512-byte blocks stored for the committed extents below block `below`,
/// and the block index past the last one.
fn committed_total(r: &MetaRead, ino: u64, below: u64) -> Result<(u64, u64)> {
    let (mut total, mut end, mut at) = (0, 0, 0);
    loop {
        let batch = committed_blocks(r, ino, at, 4096)?;
        for (b, ext) in batch.iter().filter(|(b, _)| *b < below) {
            total += chunk_blocks(r, ext)?;
            end = b + 1;
        }
        match batch.last() {
            Some(&(b, _)) if batch.len() == 4096 && b + 1 < below => at = b + 1,
            _ => return Ok((total, end)),
        }
    }
}

/// 512-byte blocks of one committed block of a file (0 for a hole).
fn stored_of(r: &MetaRead, ino: u64, blk: u64) -> Result<u64> {
    let key = ElemKey::extent(ino, blk);
    match r.get(&key)? {
        Some(e) => chunk_blocks(r, &Extent::decode(&e.payload)?),
        None => Ok(0),
    }
}

/// The base chunk's stored size, and each piece's bytes.
fn chunk_blocks(r: &MetaRead, ext: &Extent) -> Result<u64> {
    let pieces: u64 = ext.pieces.iter().map(|p| p.len as u64).sum();
    Ok(pieces.div_ceil(512)
        + match r.chunk(ext.chunk)? {
            Some(raw) => (ChunkRec::decode(&raw)?.len as u64).div_ceil(512),
            None => (ext.len as u64).div_ceil(512),
        })
}
