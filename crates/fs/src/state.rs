//! The lock of the write-back state, split by inode (HAMMER's SMP lesson:
//! no mount-wide lock on the hot paths). The dirty overlay and the
//! reference counts live in `SHARDS` shards, an inode's in shard `ino %
//! SHARDS`; an operation locks the shards of the inodes it touches, in
//! increasing shard order, so operations on different files run in
//! parallel and only those that share a shard serialize. A flush, an fsync
//! and the intent log's replay lock every shard (in the same order), which
//! gives them a consistent cut of all changes. One order for all: no
//! deadlock (docs/writeback-and-intent-log.md, "Locks and their order";
//! `lock_rank.rs` checks it in builds with debug assertions).
//!
//! An operation names the inodes it knows at the start (`Fs::with_inos`);
//! a lookup that finds another one asks for its shard (`State::need`),
//! which ends the attempt with `FsError::Relock` before anything was
//! changed, and the operation runs again with that shard locked too.

use crate::error::{FsError, Result};
use crate::lock_rank::{Held, Rank};
use crate::vfs::Fs;
use crate::writeback::committing::Committing;
use crate::writeback::overlay::{InoMap, InoSet, Overlay};
use parking_lot::MutexGuard;
use smallvec::SmallVec;
use std::sync::atomic::{AtomicI64, Ordering};

/// Shards of the state. A power of two well above the core count, and at
/// most 64: `lock_inos` gathers an operation's shards in a 64-bit mask.
pub(crate) const SHARDS: usize = 64;
const _: () = assert!(SHARDS <= 64 && SHARDS.is_power_of_two());

/// The shards one operation holds with their guards and counters: a few,
/// kept inline (no allocation per operation); a flush holds them all.
type Guards<'a> = SmallVec<[(usize, MutexGuard<'a, Shard>, Load); 4]>;

#[allow(
    clippy::cast_possible_truncation,
    reason = "a remainder of SHARDS, a small constant"
)]
pub(crate) fn shard_of(ino: u64) -> usize {
    (ino % SHARDS as u64) as usize
}

/// One shard: the changes and references of its inodes.
#[derive(Default)]
pub(crate) struct Shard {
    pub dirty: Overlay,
    /// Open handles per inode (`refs.rs`).
    pub open: InoMap<u32>,
    /// Lookup references the kernel holds per inode (FUSE nlookup; never
    /// the root); no entry means none (`refs.rs`).
    pub lookups: InoMap<u64>,
    /// Inodes without links kept alive by an open handle or a lookup
    /// reference: deleted when the last of both goes (`refs.rs`).
    pub unlinked: InoSet,
}

/// Totals over the dirty overlays of all shards, kept up to date when a
/// `State` is dropped (each shard's change since it was locked is added),
/// for the write throttle and the space check without locking all shards.
#[derive(Default)]
pub(crate) struct DirtyLoad {
    pub bytes: AtomicI64,
    pub patched: AtomicI64,
    pub written: AtomicI64,
    pub patch_count: AtomicI64,
}

impl DirtyLoad {
    fn get(v: &AtomicI64) -> u64 {
        v.load(Ordering::Relaxed).max(0) as u64
    }
    pub fn bytes(&self) -> u64 {
        Self::get(&self.bytes)
    }
    pub fn patched(&self) -> u64 {
        Self::get(&self.patched)
    }
    pub fn written(&self) -> u64 {
        Self::get(&self.written)
    }
    /// What the dirty data takes once flushed (`Overlay::flush_bytes`).
    pub fn flush_bytes(&self, record: u64) -> u64 {
        (self.bytes() - self.patched().min(self.bytes())) + Self::get(&self.patch_count) * record
    }
}

/// A shard's counters when it was locked.
#[derive(Clone, Copy)]
struct Load([i64; 4]);

impl Load {
    fn of(o: &Overlay) -> Load {
        Load([
            o.bytes as i64,
            o.patched as i64,
            o.written as i64,
            o.patch_count as i64,
        ])
    }
}

/// The locked shards of one operation. Derefs to nothing: use `dirty(ino)`
/// and `sh(ino)` for an inode's shard, `flushing` for the overlays being
/// committed (they change only with every shard locked, so they are fixed
/// while any is held).
pub(crate) struct State<'a> {
    held: Guards<'a>,
    pub flushing: Committing,
    load: &'a DirtyLoad,
    /// The shards' ranks (`lock_rank.rs`), forgotten after the guards go.
    _ranks: Vec<Held>,
}

impl<'a> State<'a> {
    fn position(&self, ino: u64) -> Option<usize> {
        let s = shard_of(ino);
        if self.held.len() == SHARDS {
            return Some(s);
        }
        self.held.iter().position(|(i, _, _)| *i == s)
    }

    /// Ok if the shard of `ino` is held; else `FsError::Relock`, which
    /// makes `Fs::with_inos` run the operation again with it.
    pub fn need(&self, ino: u64) -> Result<()> {
        match self.position(ino) {
            Some(_) => Ok(()),
            None => Err(FsError::Relock(ino)),
        }
    }

    /// The shard of `ino` (locked: a bug otherwise).
    pub fn sh(&self, ino: u64) -> &Shard {
        let p = self.position(ino).unwrap_or_else(|| unlocked(ino));
        &self.held[p].1
    }

    pub fn sh_mut(&mut self, ino: u64) -> &mut Shard {
        let p = self.position(ino).unwrap_or_else(|| unlocked(ino));
        &mut self.held[p].1
    }

    /// The dirty overlay that holds the changes of `ino`.
    pub fn dirty(&mut self, ino: u64) -> &mut Overlay {
        &mut self.sh_mut(ino).dirty
    }

    /// The dirty overlay of `ino`, to read.
    pub fn dirty_of(&self, ino: u64) -> &Overlay {
        &self.sh(ino).dirty
    }

    /// The overlays over the committed state of `ino`: its dirty one, then
    /// those being committed, the newest first.
    pub fn newest_first(&self, ino: u64) -> impl Iterator<Item = &Overlay> {
        std::iter::once(self.dirty_of(ino)).chain(self.flushing.newest_first())
    }

    /// The same, the oldest first (to apply them in order).
    pub fn oldest_first(&self, ino: u64) -> impl Iterator<Item = &Overlay> {
        self.flushing
            .oldest_first()
            .chain(std::iter::once(self.dirty_of(ino)))
    }

    /// What the newest overlay of `ino` that knows it (`from` gives Some)
    /// says.
    pub fn newest<T>(&self, ino: u64, from: impl Fn(&Overlay) -> Option<T>) -> Option<T> {
        self.newest_first(ino).find_map(from)
    }

    /// Puts an inode in its shard's dirty overlay.
    pub fn put_inode(&mut self, i: crate::types::Inode) {
        self.dirty(i.ino).put_inode(i)
    }

    /// Every held shard, in order.
    pub fn shards_mut(&mut self) -> impl Iterator<Item = &mut Shard> + use<'_, 'a> {
        self.held.iter_mut().map(|(_, g, _)| &mut **g)
    }

    pub fn shards(&self) -> impl Iterator<Item = &Shard> {
        self.held.iter().map(|(_, g, _)| &**g)
    }

    /// Bytes of block changes in the held shards that no intent record
    /// holds yet (what the next record would log by their bytes).
    pub fn unlogged_bytes(&self) -> u64 {
        self.shards().map(|s| s.dirty.unlogged.bytes).sum()
    }
}

fn unlocked(ino: u64) -> ! {
    panic!("the state shard of inode {ino} is used without its lock")
}

impl Drop for State<'_> {
    fn drop(&mut self) {
        let totals = [
            &self.load.bytes,
            &self.load.patched,
            &self.load.written,
            &self.load.patch_count,
        ];
        for (_, g, before) in &self.held {
            let now = Load::of(&g.dirty);
            for (k, t) in totals.iter().enumerate() {
                let d = now.0[k] - before.0[k];
                if d != 0 {
                    t.fetch_add(d, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Fs {
    /// Locks the shards of `inos` (in shard order).
    pub(crate) fn lock_inos(&self, inos: &[u64]) -> State<'_> {
        let mask = inos.iter().fold(0u64, |m, &i| m | 1 << shard_of(i));
        // The set bits, lowest first: the shards in increasing order.
        let idx = std::iter::successors((mask != 0).then_some(mask), |m| {
            let rest = m & (m - 1);
            (rest != 0).then_some(rest)
        })
        .map(|m| m.trailing_zeros() as usize);
        self.lock_shards(idx, mask.count_ones() as usize)
    }

    /// Locks shard `i` alone.
    pub(crate) fn lock_shard(&self, i: usize) -> State<'_> {
        assert!(i < SHARDS, "shard {i} of {SHARDS}");
        self.lock_shards(std::iter::once(i), 1)
    }

    /// Locks every shard (in order): a consistent cut of all changes.
    pub(crate) fn lock_all(&self) -> State<'_> {
        self.lock_shards(0..SHARDS, SHARDS)
    }

    /// Locks the `n` shards `idx` (in increasing order).
    fn lock_shards(&self, idx: impl Iterator<Item = usize>, n: usize) -> State<'_> {
        let mut ranks = Vec::with_capacity(n);
        let held: Guards<'_> = idx
            .map(|i| {
                ranks.push(Held::take(Rank::shard(i)));
                let g = self.st_wait.lock(&self.shards[i]);
                let l = Load::of(&g.dirty);
                (i, g, l)
            })
            .collect();
        assert_eq!(held.len(), n, "shards locked");
        State {
            held,
            flushing: self.flushing.read().clone(),
            load: &self.load,
            _ranks: ranks,
        }
    }

    /// Runs `op` with the shards of `inos` locked, and again with more
    /// locked each time it asks for another inode's (`State::need`), until
    /// it finishes. `op` must ask before it changes anything.
    pub(crate) fn with_inos<T>(
        &self,
        inos: &[u64],
        mut op: impl FnMut(&mut State<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut inos: SmallVec<[u64; 4]> = SmallVec::from_slice(inos);
        loop {
            let mut st = if inos.len() > SHARDS / 2 {
                self.lock_all()
            } else {
                self.lock_inos(&inos)
            };
            match op(&mut st) {
                Err(FsError::Relock(ino)) => {
                    assert!(!inos.contains(&ino), "inode {ino} asked for twice");
                    inos.push(ino);
                }
                r => return r,
            }
        }
    }

    /// A new inode number (never reused).
    pub(crate) fn alloc_ino(&self) -> u64 {
        self.next_ino.fetch_add(1, Ordering::SeqCst)
    }

    /// The next inode number that would be handed out.
    pub(crate) fn next_ino(&self) -> u64 {
        self.next_ino.load(Ordering::SeqCst)
    }

    /// Inodes created less inodes deleted since open (`inodes.rs`).
    pub(crate) fn live_delta(&self) -> &AtomicI64 {
        &self.live_delta
    }
}
