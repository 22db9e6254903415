//! The write-back layer: changes not yet committed. Every operation edits
//! the `dirty` overlay in RAM; a flush moves it to `flushing`, writes its
//! blocks and commits it as one transaction with one TID. Reads look at
//! dirty, then flushing, then the committed metadata. Every change is also
//! noted in `unlogged` until an fsync writes it to the intent log
//! (`intent.rs`).

use crate::types::{DirEnt, Inode};
use crate::writeback::patch::Patch;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// A directory entry's subkey (`types::dirent_subkey`: name hash
/// big-endian, length, name) as an overlay's ordered maps keep it: its
/// first 8 bytes also inline, as a number, so that comparisons, nearly all
/// decided by them, read no heap memory (a look-up in a directory of
/// thousands of buffered entries otherwise misses the cache at each
/// step). Orders, and is equal, as the bytes are.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct DirKey {
    /// The first 8 bytes, big-endian (zeros past a shorter key's end).
    lead: u64,
    bytes: Vec<u8>,
}

impl DirKey {
    pub fn new(bytes: Vec<u8>) -> Self {
        let mut lead = [0u8; 8];
        let n = bytes.len().min(8);
        lead[..n].copy_from_slice(&bytes[..n]);
        DirKey {
            lead: u64::from_be_bytes(lead),
            bytes,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The keys of `m` whose first 8 bytes are `lead`, in order.
    pub fn with_lead<V>(m: &BTreeMap<DirKey, V>, lead: u64) -> impl Iterator<Item = (&DirKey, &V)> {
        let from = DirKey::new(lead.to_be_bytes().to_vec());
        m.range(from..).take_while(move |(k, _)| k.lead == lead)
    }
}

/// A buffered file block: the bytes from the block start (the rest of the
/// block up to the record size reads as zeros). Empty means a hole.
pub type Block = Arc<Vec<u8>>;

/// Maps keyed by inode number: numbers Cairn hands out in sequence, not
/// chosen by clients, so a fast hash without DoS resistance serves (every
/// request looks its inode up in up to three overlays).
pub type InoMap<V> = HashMap<u64, V, rustc_hash::FxBuildHasher>;
pub type InoSet = HashSet<u64, rustc_hash::FxBuildHasher>;

#[derive(Default, Clone)]
pub struct Overlay {
    /// None = the inode and every element of it are deleted.
    pub inodes: InoMap<Option<Inode>>,
    /// Per directory: dirent subkey -> entry (None = removed).
    pub dirents: InoMap<BTreeMap<DirKey, Option<DirEnt>>>,
    /// Per file: block index -> data.
    pub blocks: InoMap<BTreeMap<u64, Block>>,
    /// Per file: block index -> bytes written over a block not read
    /// (`patch.rs`); never at an index `blocks` holds.
    pub patches: InoMap<BTreeMap<u64, Patch>>,
    /// Per file: committed blocks from this index on are gone (truncate).
    pub truncs: InoMap<u64>,
    pub symlinks: InoMap<Vec<u8>>,
    /// Per inode: xattr name -> value (None = removed).
    pub xattrs: InoMap<BTreeMap<Vec<u8>, Option<Vec<u8>>>>,
    /// Inodes with no links that are still open.
    pub orphans_add: InoSet,
    pub orphans_del: InoSet,
    /// Bytes of buffered blocks.
    pub bytes: u64,
    /// Bytes of `bytes` held in patches.
    pub patched: u64,
    /// Blocks with a patch (each is a whole block at the flush).
    pub patch_count: u64,
    /// Bytes written by users (a 4 KiB write into a 64 KiB block counts
    /// 4 KiB here and 64 KiB in `bytes`).
    pub written: u64,
    /// Set when any change is recorded.
    pub changed: bool,
    /// What changed since the last fsync wrote the intent log.
    pub unlogged: Unlogged,
}

/// The keys an fsync must write to the intent log: changed since the last
/// record. Values are taken from the overlay when the record is written,
/// except truncations, which are kept in order with their cut points.
/// Sets, not ordered ones: every change inserts into them, and an fsync,
/// which reads them, comes far less often (the order of a record's
/// entries of one kind does not matter: each names its key). Names are
/// chosen by clients, so their sets hash with a random key.
#[derive(Default, Clone)]
pub struct Unlogged {
    pub inodes: InoSet,
    /// (directory, leading 8 bytes of a subkey as `DirKey` keeps them): the
    /// record logs every entry of the directory that starts with them
    /// (more than one only when two names' hashes agree there).
    pub dirents: HashSet<(u64, u64)>,
    pub symlinks: InoSet,
    pub xattrs: HashSet<(u64, Vec<u8>)>,
    pub orphans: InoSet,
    pub truncs: Vec<(u64, u64)>,
    /// (inode, block) -> the byte range changed in it.
    pub blocks: BTreeMap<(u64, u64), (u32, u32)>,
    /// Bytes of changed block ranges (an upper bound).
    pub bytes: u64,
}

impl Unlogged {
    pub fn is_empty(&self) -> bool {
        self.inodes.is_empty()
            && self.dirents.is_empty()
            && self.symlinks.is_empty()
            && self.xattrs.is_empty()
            && self.orphans.is_empty()
            && self.truncs.is_empty()
            && self.blocks.is_empty()
    }

    fn block(&mut self, ino: u64, blk: u64, lo: u32, hi: u32) {
        self.bytes += (hi - lo) as u64;
        let r = self.blocks.entry((ino, blk)).or_insert((lo, hi));
        r.0 = r.0.min(lo);
        r.1 = r.1.max(hi);
    }

    /// Puts `older` (not yet logged when its commit failed) before this.
    fn absorb_older(&mut self, older: Unlogged) {
        self.inodes.extend(older.inodes);
        self.dirents.extend(older.dirents);
        self.symlinks.extend(older.symlinks);
        self.xattrs.extend(older.xattrs);
        self.orphans.extend(older.orphans);
        let newer = std::mem::replace(&mut self.truncs, older.truncs);
        self.truncs.extend(newer);
        for ((ino, blk), (lo, hi)) in older.blocks {
            self.block(ino, blk, lo, hi);
        }
    }
}

/// What the overlays say about one file block.
pub enum BlockState {
    /// Buffered data.
    Data(Block),
    /// Known to be a hole (truncated away or punched).
    Hole,
    /// Not in any overlay: read the committed extent.
    Committed,
    /// Bytes written over the block in the state below (which an overlay
    /// fills in: see `Fs::block_state`).
    Patch(Patch, Box<BlockState>),
}

impl BlockState {
    /// True when reading the block reads the committed one (under a patch
    /// or not).
    pub fn reads_committed(&self) -> bool {
        match self {
            BlockState::Committed => true,
            BlockState::Patch(_, below) => below.reads_committed(),
            BlockState::Data(_) | BlockState::Hole => false,
        }
    }
}

impl Overlay {
    pub fn is_empty(&self) -> bool {
        !self.changed
    }

    /// Bytes the flush will store: patches become whole blocks.
    pub fn flush_bytes(&self, record: u64) -> u64 {
        self.bytes - self.patched + self.patch_count * record
    }

    pub fn block(&self, ino: u64, blk: u64) -> Option<BlockState> {
        if let Some(b) = self.blocks.get(&ino).and_then(|m| m.get(&blk)) {
            return Some(if b.is_empty() {
                BlockState::Hole
            } else {
                BlockState::Data(b.clone())
            });
        }
        if let Some(p) = self.patches.get(&ino).and_then(|m| m.get(&blk)) {
            return Some(BlockState::Patch(
                p.clone(),
                Box::new(BlockState::Committed),
            ));
        }
        if matches!(self.truncs.get(&ino), Some(&t) if blk >= t) {
            return Some(BlockState::Hole);
        }
        None
    }

    /// Buffers a block whose bytes `lo..hi` changed (the rest is as it was,
    /// or zeros past the old end; a shorter block was cut at its length).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within one record (record size <= 1 MiB, check_geometry)"
    )]
    pub fn put_block(&mut self, ino: u64, blk: u64, data: Block, lo: usize, hi: usize) {
        self.changed = true;
        self.unlogged.block(ino, blk, lo as u32, hi.max(lo) as u32);
        self.take_patch(ino, blk);
        let new = data.len() as u64;
        if let Some(old) = self.blocks.entry(ino).or_default().insert(blk, data) {
            debug_assert!(self.bytes >= old.len() as u64, "buffered bytes below zero");
            self.bytes -= old.len() as u64;
        }
        self.bytes += new;
    }

    /// Removes a buffered block so that it can be edited in place.
    pub fn take_block(&mut self, ino: u64, blk: u64) -> Option<Block> {
        let b = self.blocks.get_mut(&ino)?.remove(&blk)?;
        self.bytes -= b.len() as u64;
        Some(b)
    }

    /// Writes `data` at `off` of block `blk` without its old bytes (see
    /// `patch.rs`); when the patch covers the block's `valid` bytes it
    /// becomes a whole block.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within one record (record size <= 1 MiB, check_geometry)"
    )]
    pub fn put_patch(&mut self, ino: u64, blk: u64, off: usize, data: &[u8], valid: usize) {
        // A block is buffered whole or patched, never both: the flush
        // would commit two extents for it.
        debug_assert!(
            !self.blocks.get(&ino).is_some_and(|m| m.contains_key(&blk)),
            "inode {ino} block {blk}: a patch over a buffered block"
        );
        self.changed = true;
        self.unlogged
            .block(ino, blk, off as u32, (off + data.len()) as u32);
        let p = self.patches.entry(ino).or_default().entry(blk).or_default();
        let (before, after) = p.write(off, data);
        self.bytes = self.bytes + after as u64 - before as u64;
        self.patched = self.patched + after as u64 - before as u64;
        if before == 0 {
            self.patch_count += 1;
        }
        if let Some(whole) = p.whole(valid).cloned() {
            let n = whole.len();
            self.put_block(ino, blk, Arc::new(whole), 0, n);
        }
    }

    pub fn has_patch(&self, ino: u64, blk: u64) -> bool {
        self.patches.get(&ino).is_some_and(|m| m.contains_key(&blk))
    }

    /// Removes the patch of a block.
    pub fn take_patch(&mut self, ino: u64, blk: u64) -> Option<Patch> {
        let p = self.patches.get_mut(&ino)?.remove(&blk)?;
        debug_assert!(
            self.patch_count > 0 && self.patched >= p.bytes() as u64 && self.bytes >= self.patched,
            "patch accounting below zero"
        );
        self.bytes -= p.bytes() as u64;
        self.patched -= p.bytes() as u64;
        self.patch_count -= 1;
        Some(p)
    }

    /// Drops buffered blocks from index `first` on and records that the
    /// committed ones are gone too.
    pub fn truncate_blocks(&mut self, ino: u64, first: u64) {
        self.changed = true;
        self.unlogged.truncs.push((ino, first));
        if let Some(m) = self.blocks.get_mut(&ino) {
            for (_, b) in m.split_off(&first) {
                self.bytes -= b.len() as u64;
            }
        }
        if let Some(m) = self.patches.get_mut(&ino) {
            for (_, p) in m.split_off(&first) {
                self.bytes -= p.bytes() as u64;
                self.patched -= p.bytes() as u64;
                self.patch_count -= 1;
            }
        }
        let t = self.truncs.entry(ino).or_insert(first);
        *t = (*t).min(first);
    }

    /// Forgets everything buffered for an inode that is being deleted.
    pub fn delete_inode(&mut self, ino: u64) {
        self.changed = true;
        self.unlogged.inodes.insert(ino);
        self.unlogged.orphans.insert(ino);
        if let Some(m) = self.blocks.remove(&ino) {
            self.bytes -= m.values().map(|b| b.len() as u64).sum::<u64>();
        }
        if let Some(m) = self.patches.remove(&ino) {
            let n = m.values().map(|p| p.bytes() as u64).sum::<u64>();
            self.bytes -= n;
            self.patched -= n;
            self.patch_count -= m.len() as u64;
        }
        self.truncs.remove(&ino);
        self.symlinks.remove(&ino);
        self.xattrs.remove(&ino);
        self.dirents.remove(&ino);
        self.orphans_add.remove(&ino);
        self.orphans_del.insert(ino);
        self.inodes.insert(ino, None);
    }

    pub fn put_inode(&mut self, inode: Inode) {
        self.changed = true;
        self.unlogged.inodes.insert(inode.ino);
        self.inodes.insert(inode.ino, Some(inode));
    }

    pub fn put_dirent(&mut self, dir: u64, subkey: Vec<u8>, ent: Option<DirEnt>) {
        self.put_entry(dir, DirKey::new(subkey), ent);
    }

    /// `put_dirent` with the subkey as a look-up made it.
    pub fn put_entry(&mut self, dir: u64, key: DirKey, ent: Option<DirEnt>) {
        self.changed = true;
        self.unlogged.dirents.insert((dir, key.lead));
        self.dirents.entry(dir).or_default().insert(key, ent);
    }

    pub fn put_symlink(&mut self, ino: u64, target: Vec<u8>) {
        self.changed = true;
        self.unlogged.symlinks.insert(ino);
        self.symlinks.insert(ino, target);
    }

    /// Sets (Some) or removes (None) an xattr.
    pub fn put_xattr(&mut self, ino: u64, name: Vec<u8>, value: Option<Vec<u8>>) {
        self.changed = true;
        self.unlogged.xattrs.insert((ino, name.clone()));
        self.xattrs.entry(ino).or_default().insert(name, value);
    }

    /// Records that an inode with no links is (`open`) or is no longer
    /// (`!open`) kept alive by an open handle.
    pub fn set_orphan(&mut self, ino: u64, open: bool) {
        self.changed = true;
        self.unlogged.orphans.insert(ino);
        if open {
            self.orphans_del.remove(&ino);
            self.orphans_add.insert(ino);
        } else {
            self.orphans_add.remove(&ino);
            self.orphans_del.insert(ino);
        }
    }
}

impl Overlay {
    /// Puts `older` (an overlay whose commit failed) under this one, so
    /// that committing the result does what committing `older` and then
    /// this one would have done. Nothing a user was told had been written
    /// is lost when a commit fails for lack of space.
    pub fn absorb_older(&mut self, older: Overlay) {
        // Inodes this (newer) overlay deletes: their older changes are moot.
        let gone: HashSet<u64> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.is_none())
            .map(|(ino, _)| *ino)
            .collect();

        for (ino, i) in older.inodes {
            self.inodes.entry(ino).or_insert(i);
        }
        for (ino, mut blocks) in older.blocks {
            if gone.contains(&ino) {
                continue;
            }
            if let Some(&t) = self.truncs.get(&ino) {
                blocks.split_off(&t);
            }
            for (blk, b) in blocks {
                let newer = self.patches.get_mut(&ino).and_then(|m| m.remove(&blk));
                let mine = self.blocks.entry(ino).or_default();
                match newer {
                    // A newer patch over an older whole block: one block.
                    Some(p) => {
                        let mut buf = (*b).clone();
                        p.apply(&mut buf);
                        mine.insert(blk, Arc::new(buf));
                    }
                    None => {
                        mine.entry(blk).or_insert(b);
                    }
                }
            }
        }
        for (ino, mut patches) in older.patches {
            if gone.contains(&ino) {
                continue;
            }
            if let Some(&t) = self.truncs.get(&ino) {
                patches.split_off(&t);
            }
            for (blk, mut p) in patches {
                if self.blocks.get(&ino).is_some_and(|m| m.contains_key(&blk)) {
                    continue;
                }
                let mine = self.patches.entry(ino).or_default();
                if let Some(newer) = mine.get(&blk) {
                    p.write_all(newer);
                }
                mine.insert(blk, p);
            }
        }
        for (ino, t) in older.truncs {
            if !gone.contains(&ino) {
                let cur = self.truncs.entry(ino).or_insert(t);
                *cur = (*cur).min(t);
            }
        }
        for (ino, target) in older.symlinks {
            if !gone.contains(&ino) {
                self.symlinks.entry(ino).or_insert(target);
            }
        }
        merge_maps(&mut self.dirents, older.dirents, |ino| gone.contains(ino));
        merge_maps(&mut self.xattrs, older.xattrs, |ino| gone.contains(ino));
        let (adds, dels) = (&self.orphans_add, &self.orphans_del);
        let add: Vec<u64> = older.orphans_add.difference(dels).copied().collect();
        let del: Vec<u64> = older.orphans_del.difference(adds).copied().collect();
        self.orphans_add.extend(add);
        self.orphans_del.extend(del);
        self.patch_count = self.patches.values().map(|m| m.len() as u64).sum();
        self.patched = self
            .patches
            .values()
            .flat_map(|m| m.values())
            .map(|p| p.bytes() as u64)
            .sum::<u64>();
        self.bytes = self
            .blocks
            .values()
            .flat_map(|m| m.values())
            .map(|b| b.len() as u64)
            .sum::<u64>()
            + self.patched;
        self.written += older.written;
        self.changed |= older.changed;
        self.unlogged.absorb_older(older.unlogged);
    }
}

/// Adds the entries of `older` that `newer` does not override, skipping
/// objects that `gone` says were deleted since.
fn merge_maps<K: Ord, V>(
    newer: &mut InoMap<BTreeMap<K, V>>,
    older: InoMap<BTreeMap<K, V>>,
    gone: impl Fn(&u64) -> bool,
) {
    for (ino, m) in older {
        if gone(&ino) {
            continue;
        }
        let mine = newer.entry(ino).or_default();
        for (k, v) in m {
            mine.entry(k).or_insert(v);
        }
    }
}

/// Overlays of disjoint inode sets (the state's shards, `state.rs`) as one
/// and back: a flush commits the union of all shards, and a commit that
/// failed goes back to the shards it came from.
impl Overlay {
    /// The union of overlays that touch disjoint inodes.
    pub fn merge_disjoint(parts: impl IntoIterator<Item = Overlay>) -> Overlay {
        let mut m = Overlay::default();
        for p in parts {
            m.inodes.extend(p.inodes);
            m.dirents.extend(p.dirents);
            m.blocks.extend(p.blocks);
            m.patches.extend(p.patches);
            m.truncs.extend(p.truncs);
            m.symlinks.extend(p.symlinks);
            m.xattrs.extend(p.xattrs);
            m.orphans_add.extend(p.orphans_add);
            m.orphans_del.extend(p.orphans_del);
            m.bytes += p.bytes;
            m.patched += p.patched;
            m.patch_count += p.patch_count;
            m.written += p.written;
            m.changed |= p.changed;
            m.unlogged.merge(p.unlogged);
        }
        m
    }

    /// This overlay cut in `n` by the shard `shard(ino)` of each inode (the
    /// counters recomputed per part; `written` and `changed` go to part 0,
    /// which matters only for throttling).
    pub fn split(self, n: usize, shard: impl Fn(u64) -> usize) -> Vec<Overlay> {
        let mut parts: Vec<Overlay> = (0..n).map(|_| Overlay::default()).collect();
        for (ino, v) in self.inodes {
            parts[shard(ino)].inodes.insert(ino, v);
        }
        for (ino, v) in self.dirents {
            parts[shard(ino)].dirents.insert(ino, v);
        }
        for (ino, v) in self.blocks {
            let p = &mut parts[shard(ino)];
            p.bytes += v.values().map(|b| b.len() as u64).sum::<u64>();
            p.blocks.insert(ino, v);
        }
        for (ino, v) in self.patches {
            let p = &mut parts[shard(ino)];
            let bytes: u64 = v.values().map(|x| x.bytes() as u64).sum();
            p.bytes += bytes;
            p.patched += bytes;
            p.patch_count += v.len() as u64;
            p.patches.insert(ino, v);
        }
        for (ino, v) in self.truncs {
            parts[shard(ino)].truncs.insert(ino, v);
        }
        for (ino, v) in self.symlinks {
            parts[shard(ino)].symlinks.insert(ino, v);
        }
        for (ino, v) in self.xattrs {
            parts[shard(ino)].xattrs.insert(ino, v);
        }
        for ino in self.orphans_add {
            parts[shard(ino)].orphans_add.insert(ino);
        }
        for ino in self.orphans_del {
            parts[shard(ino)].orphans_del.insert(ino);
        }
        for (k, u) in self.unlogged.split(n, &shard).into_iter().enumerate() {
            let p = &mut parts[k];
            p.unlogged = u;
            p.changed = self.changed && (p.holds_any() || !p.unlogged.is_empty());
        }
        parts[0].written = self.written;
        parts
    }
}

impl Overlay {
    fn holds_any(&self) -> bool {
        !(self.inodes.is_empty()
            && self.dirents.is_empty()
            && self.blocks.is_empty()
            && self.patches.is_empty()
            && self.truncs.is_empty()
            && self.symlinks.is_empty()
            && self.xattrs.is_empty()
            && self.orphans_add.is_empty()
            && self.orphans_del.is_empty())
    }
}

impl Unlogged {
    pub(crate) fn merge(&mut self, mut o: Unlogged) {
        // The blocks' `append` takes the other map whole when this one is
        // empty (a seal under every shard lock merges 64 shards, most
        // empty, one a volume's with thousands of blocks); `merge_set`
        // does the same for the sets.
        merge_set(&mut self.inodes, o.inodes);
        merge_set(&mut self.dirents, o.dirents);
        merge_set(&mut self.symlinks, o.symlinks);
        merge_set(&mut self.xattrs, o.xattrs);
        merge_set(&mut self.orphans, o.orphans);
        self.truncs.extend(o.truncs);
        self.blocks.append(&mut o.blocks);
        self.bytes += o.bytes;
    }

    fn split(self, n: usize, shard: &impl Fn(u64) -> usize) -> Vec<Unlogged> {
        let mut parts: Vec<Unlogged> = (0..n).map(|_| Unlogged::default()).collect();
        for ino in self.inodes {
            parts[shard(ino)].inodes.insert(ino);
        }
        for k in self.dirents {
            parts[shard(k.0)].dirents.insert(k);
        }
        for ino in self.symlinks {
            parts[shard(ino)].symlinks.insert(ino);
        }
        for k in self.xattrs {
            parts[shard(k.0)].xattrs.insert(k);
        }
        for ino in self.orphans {
            parts[shard(ino)].orphans.insert(ino);
        }
        for t in self.truncs {
            parts[shard(t.0)].truncs.push(t);
        }
        for (k, r) in self.blocks {
            let p = &mut parts[shard(k.0)];
            p.bytes += (r.1 - r.0) as u64;
            p.blocks.insert(k, r);
        }
        parts
    }
}

/// Adds `from` to `to`, inserting the smaller set into the larger (a seal
/// under every shard lock merges 64 shards' sets, most of them empty).
fn merge_set<T: Eq + std::hash::Hash, S: std::hash::BuildHasher>(
    to: &mut HashSet<T, S>,
    mut from: HashSet<T, S>,
) {
    if to.len() < from.len() {
        std::mem::swap(to, &mut from);
    }
    to.extend(from);
}
