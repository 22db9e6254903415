//! Data ahead of the tree commit (the tick). A commit of the element tree
//! costs about one B-tree leaf per block written at a random place (a 4
//! KiB write to a large volume dirties a leaf of its own), so committing
//! less often writes fewer bytes per write, but the commit interval also
//! bounds what a crash loses of writes nobody synced. Between tree commits
//! (`tree_commit_secs`), every `commit_interval_secs` a tick:
//!
//! 1. stores the blocks buffered since the last intent record as chunks,
//!    where they stay (sorted, hashed and compressed as a flush does);
//! 2. records those chunks in a small metadata transaction: chunk records
//!    with no reference yet, new ids at the end of the table (appends);
//! 3. logs, in one intent record, every change since the last record, with
//!    those blocks named by chunk (`T_STORED`) instead of by their bytes.
//!
//! A mark ties the buffered block (its very buffer: a block written again is
//! a new buffer) to its chunk; the commit that takes the block takes the
//! chunk instead of writing the bytes again. A tick's chunk that no buffered
//! block holds any more (written again, truncated, deleted) is removed by
//! the next commit unless something came to reference it (dedup). After a
//! crash, the replay reads a `T_STORED` block back from its chunk, and the
//! open's first commit removes the tick chunks that no record named
//! (counter `tick_chunks_from`: the first id a tick stored while any wait).

use crate::error::Result;
use crate::vfs::Fs;
use crate::writeback::intent_record::{decode, Entry};
use crate::writeback::log_file::Record;
use crate::writeback::overlay::{Block, Overlay};
use cairn_data::{ChunkRec, Hash};
use cairn_devices::SlotAddr;
use cairn_meta::MetaWrite;
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counter: the first chunk id stored by a tick since no tick chunk waited
/// for a commit (0: none waits).
pub(crate) const TICK_CHUNKS_FROM: &str = "tick_chunks_from";

/// Written bytes after which a pool of small records asks for a tick
/// before its interval (`Ticks::wants_tick`), so that a durable snapshot
/// or an fsync logs at most about this much: what one fsync record holds.
/// Each tick's transaction costs about 1 MiB of metadata writes whatever
/// it holds (redb saves its allocator state at every commit, for a quick
/// repair after a crash), so ticks cannot be much more frequent.
const TICK_BYTES: u64 = 8 << 20;

/// How many blocks a tick looks at under a shard lock at a time: each
/// takes a few hundred ns (lookups in large maps), and every request to
/// the shard waits meanwhile (a volume is one inode, so one shard).
const LOCKED_BATCH: usize = 512;

/// How many passes a tick makes at most to store the blocks written while
/// it stored others, and the unlogged bytes that make it stop earlier
/// (half what a record holds: the record's own room is for what comes in
/// meanwhile).
const STORE_PASSES: usize = 3;
const TICK_LOG_BYTES: u64 = crate::writeback::intent::MAX_RECORD_DATA / 2;

/// The least time between two ticks asked for by writes: faster writers
/// (a volume at 32,000 ops/s writes 8 MiB in about 0.2 s) would otherwise
/// tick several times a second, each tick a commit's worth of fsyncs.
const TICK_GAP: Duration = Duration::from_secs(1);

/// Blocks stored ahead of their commit, and when the tree last committed.
#[derive(Default)]
pub(crate) struct Ticks(Mutex<TickState>, TickAsk);

/// Writes asking for a tick before the interval.
struct TickAsk {
    /// Bytes users had written into the dirty overlay at the last tick.
    written: std::sync::atomic::AtomicU64,
    asked: std::sync::atomic::AtomicBool,
    /// Bytes of the blocks marked (`Ticks::stored_bytes`).
    stored: std::sync::atomic::AtomicU64,
    /// The last committed TID while a pass holds the flush lock, else
    /// `NOT_STORING` (`Ticks::storing_on`).
    storing_on: std::sync::atomic::AtomicU64,
}

const NOT_STORING: u64 = u64::MAX;

impl Default for TickAsk {
    fn default() -> Self {
        TickAsk {
            written: Default::default(),
            asked: Default::default(),
            stored: Default::default(),
            storing_on: NOT_STORING.into(),
        }
    }
}

/// A store pass's hold of the flush lock, made known to durable snapshots
/// (`Fs::snapshot_during_tick`). Dropped before the flush lock: it says so
/// under every shard lock, so that a snapshot that saw the pass under them
/// seals while the pass still holds the flush lock.
struct StoringPass<'a>(&'a Fs);

impl<'a> StoringPass<'a> {
    fn begin(fs: &'a Fs, last: u64) -> Self {
        fs.ticks
            .1
            .storing_on
            .store(last, std::sync::atomic::Ordering::SeqCst);
        StoringPass(fs)
    }
}

impl Drop for StoringPass<'_> {
    fn drop(&mut self) {
        let _st = self.0.lock_all();
        let on = &self.0.ticks.1.storing_on;
        on.store(NOT_STORING, std::sync::atomic::Ordering::SeqCst);
    }
}

#[derive(Default)]
struct TickState {
    /// (inode, block) -> the buffered block a tick stored, and its chunk.
    marks: HashMap<(u64, u64), Mark>,
    /// Tick chunks no block is marked with (the block changed while the
    /// tick stored it, or a crash left them): the next commit removes the
    /// ones nothing references.
    loose: BTreeSet<u64>,
    /// When the element tree was last committed (None: not since open).
    last_commit: Option<Instant>,
    /// When the last tick ran.
    last_tick: Option<Instant>,
}

/// A buffered block (that very buffer) and the tick chunk it is stored as.
#[derive(Clone)]
struct Mark {
    block: Block,
    chunk: u64,
    /// The replay could not read the chunk back (a damaged or unreadable
    /// device): `block` is a placeholder, never read; the commit takes the
    /// chunk as it is, so reads of the block fail until it is written
    /// again.
    unread: bool,
}

/// What one commit does with the tick chunks: the blocks of its overlay
/// that take a chunk, and the chunks it removes if nothing references them.
#[derive(Default)]
pub(crate) struct TickTake {
    pub taken: HashMap<(u64, u64), u64>,
    pub dropped: Vec<u64>,
    /// No tick chunk waits once this commit is made.
    pub none_left: bool,
}

/// The marks, locked once for a pass over many blocks rather than once
/// per block (the passes run under shard locks, which requests wait for),
/// with the count of their bytes.
pub(crate) struct Marks<'a>(
    parking_lot::MutexGuard<'a, TickState>,
    &'a std::sync::atomic::AtomicU64,
);

impl Marks<'_> {
    /// The chunk a tick stored `b` (at `ino`, `blk`) as, if it is that very
    /// buffer.
    pub(crate) fn chunk_of(&self, ino: u64, blk: u64, b: &Block) -> Option<u64> {
        let m = self.0.marks.get(&(ino, blk))?;
        Arc::ptr_eq(&m.block, b).then_some(m.chunk)
    }

    fn mark(&mut self, ino: u64, blk: u64, block: Block, chunk: u64, unread: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        self.1.fetch_add(block.len() as u64, Relaxed);
        let m = Mark {
            block,
            chunk,
            unread,
        };
        if let Some(old) = self.0.marks.insert((ino, blk), m) {
            self.1.fetch_sub(old.block.len() as u64, Relaxed);
            self.0.loose.insert(old.chunk);
        }
    }
}

impl Ticks {
    pub(crate) fn marks(&self) -> Marks<'_> {
        Marks(self.0.lock(), &self.1.stored)
    }

    /// The last committed TID, while a tick's store pass holds the flush
    /// lock (no commit can run); read it under every shard lock to rely on
    /// it (see `StoringPass`).
    pub(crate) fn storing_on(&self) -> Option<u64> {
        let on = self.1.storing_on.load(std::sync::atomic::Ordering::SeqCst);
        (on != NOT_STORING).then_some(on)
    }

    /// Bytes of the buffered blocks a tick stored whose commit waits: they
    /// cost RAM until it, but nothing more to commit than a reference, so
    /// the dirty limit counts them apart (`Fs::throttle`). Each mark holds
    /// its buffer, also one written again since, so this counts those too.
    pub(crate) fn stored_bytes(&self) -> u64 {
        self.1.stored.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The chunk `b` (at `ino`, `blk`) is a placeholder for, if the replay
    /// could not read it (see `Mark::unread`).
    pub(crate) fn is_unread(&self, ino: u64, blk: u64, b: &Block) -> Option<u64> {
        let t = self.0.lock();
        let m = t.marks.get(&(ino, blk))?;
        (m.unread && Arc::ptr_eq(&m.block, b)).then_some(m.chunk)
    }

    /// Whether a placeholder still waits for the commit that takes it.
    pub(crate) fn unread_waiting(&self) -> bool {
        self.0.lock().marks.values().any(|m| m.unread)
    }

    fn loosen(&self, ids: impl IntoIterator<Item = u64>) {
        self.0.lock().loose.extend(ids);
    }

    /// Whether writes (`written` bytes in the dirty overlay now) should
    /// ask for a tick now: in a pool of small records (each block costs
    /// more to commit than to write, so its tree commits wait longest),
    /// once `TICK_BYTES` were written since the last tick, at most every
    /// `TICK_GAP`. Notes the ask.
    pub(crate) fn wants_tick(&self, small_records: bool, written: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let since = written.saturating_sub(self.1.written.load(Relaxed));
        if !small_records || since < TICK_BYTES || self.1.asked.load(Relaxed) {
            return false;
        }
        let t = self.0.lock();
        if t.last_tick.is_some_and(|l| l.elapsed() < TICK_GAP) {
            return false;
        }
        !self.1.asked.swap(true, Relaxed)
    }

    /// Whether writes asked for a tick that has not run yet.
    pub(crate) fn asked(&self) -> bool {
        self.1.asked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the writes' ask (the flusher, before it acts on it: a failed
    /// round does not make it spin).
    pub(crate) fn take_asked(&self) -> bool {
        self.1
            .asked
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// A tick starts with `written` bytes in the dirty overlay.
    fn note_tick(&self, written: u64) {
        self.1
            .written
            .store(written, std::sync::atomic::Ordering::Relaxed);
        self.0.lock().last_tick = Some(Instant::now());
    }

    /// Whether the tree is due for a commit (`every` since the last one).
    pub(crate) fn tree_due(&self, every: Duration) -> bool {
        let mut t = self.0.lock();
        let last = *t.last_commit.get_or_insert_with(Instant::now);
        last.elapsed() >= every
    }

    /// After the commit that took `take`: its marks and dropped chunks go
    /// (every mark when none is left: the flush lock kept ticks from making
    /// new ones since `tick_take`).
    pub(crate) fn retire(&self, take: &TickTake) {
        let mut t = self.0.lock();
        for id in &take.dropped {
            t.loose.remove(id);
        }
        if take.none_left {
            t.marks.clear();
        } else {
            let dropped: HashSet<u64> = take.dropped.iter().copied().collect();
            t.marks
                .retain(|k, m| !take.taken.contains_key(k) && !dropped.contains(&m.chunk));
        }
        let left = t.marks.values().map(|m| m.block.len() as u64).sum();
        self.1
            .stored
            .store(left, std::sync::atomic::Ordering::Relaxed);
        t.last_commit = Some(Instant::now());
        // The overlay's written count starts again from 0.
        self.1
            .written
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Fs {
    /// Buffered blocks a tick stored whose commit waits, and tick chunks
    /// that no block holds any more (the next commit removes them).
    pub fn ticked(&self) -> (usize, usize) {
        let t = self.ticks.0.lock();
        (t.marks.len(), t.loose.len())
    }

    /// What the commit of `ov` does with the tick chunks (called with the
    /// flush lock held, before its transaction): the blocks it takes as
    /// their chunks, and the chunks no buffered block holds any more. A
    /// block only ever leaves the overlays (a commit takes it, a write
    /// replaces it) under the flush lock or for good, so a chunk found
    /// held by none now is never needed again.
    pub(crate) fn tick_take(&self, ov: &Overlay) -> TickTake {
        let t = self.ticks.0.lock();
        if t.marks.is_empty() && t.loose.is_empty() {
            return TickTake {
                none_left: true,
                ..Default::default()
            };
        }
        let marks: Vec<((u64, u64), Mark)> = t.marks.iter().map(|(k, v)| (*k, v.clone())).collect();
        let mut dropped: Vec<u64> = t.loose.iter().copied().collect();
        drop(t);
        let held_in = |o: &Overlay, ino: u64, blk: u64, b: &Block| {
            o.blocks
                .get(&ino)
                .and_then(|m| m.get(&blk))
                .is_some_and(|x| Arc::ptr_eq(x, b))
        };
        // The overlay to commit is sealed: no lock needed to look in it.
        let (mut taken, mut rest) = (HashMap::new(), Vec::new());
        for ((ino, blk), m) in &marks {
            if held_in(ov, *ino, *blk, &m.block) {
                taken.insert((*ino, *blk), m.chunk);
            } else {
                rest.push(((*ino, *blk), m));
            }
        }
        let mut gone = 0;
        if !rest.is_empty() {
            let mut st = self.lock_all();
            // Each a moment (`sealed` is a leaf lock): the overlays sealed
            // and being committed, which only the flush lock's holder
            // changes.
            let mut others: Vec<Arc<Overlay>> =
                self.sealed.lock().iter().map(|s| s.ov.clone()).collect();
            others.extend(self.flushing.read().shared().cloned());
            for ((ino, blk), m) in rest {
                let b = &m.block;
                let elsewhere = held_in(st.dirty(ino), ino, blk, b)
                    || others.iter().any(|o| held_in(o, ino, blk, b));
                if !elsewhere {
                    dropped.push(m.chunk);
                    gone += 1;
                }
            }
        }
        let none_left = taken.len() + gone == marks.len();
        TickTake {
            taken,
            dropped,
            none_left,
        }
    }

    /// In the commit's transaction: removes the dropped tick chunks that
    /// nothing came to reference, and clears `tick_chunks_from` when none
    /// waits any more.
    pub(crate) fn drop_tick_chunks(
        &self,
        w: &mut MetaWrite<'_>,
        take: &TickTake,
        touched: &mut BTreeSet<u64>,
        freed: &mut Vec<SlotAddr>,
    ) -> Result<()> {
        for &id in &take.dropped {
            let Some(raw) = w.chunk(id)? else { continue };
            let rec = ChunkRec::decode(&raw)?;
            if rec.refs == 0 {
                // Its segment counts it as live data (never history-only).
                self.remove_chunk(w, id, &ChunkRec { live: 1, ..rec }, touched, freed)?;
            }
        }
        if take.none_left && w.counter(TICK_CHUNKS_FROM)? != 0 {
            w.set_counter(TICK_CHUNKS_FROM, 0)?;
        }
        Ok(())
    }

    /// A tick (see the top of this file): stores the buffered blocks no
    /// record holds, then logs every change as an fsync does, those blocks
    /// by chunk. Without an intent log it is a flush.
    pub fn tick(&self) -> Result<()> {
        if self.intent.is_none() || self.must_commit.load(std::sync::atomic::Ordering::SeqCst) {
            return self.flush();
        }
        // Blocks written while a pass stored others are stored by another
        // (fewer each time): logged by their bytes instead, a slow pass
        // would leave more than a record holds, and the log would commit
        // the tree, long before it is due.
        for pass in 0..STORE_PASSES {
            if pass > 0 && self.lock_all().unlogged_bytes() <= TICK_LOG_BYTES {
                break;
            }
            if let Err(e) = self.store_ahead() {
                tracing::warn!(
                    "storing buffered blocks ahead of the commit: {e}; committing instead"
                );
                return self.flush();
            }
        }
        self.log_changes()
    }

    /// Steps 1 and 2 of a tick, under the flush lock (no commit runs
    /// meanwhile, and each commit before this one's chunks took them).
    fn store_ahead(&self) -> Result<()> {
        let guard = self.flush_guard();
        self.check_ok()?;
        let _pass = StoringPass::begin(self, *guard);
        self.ticks.note_tick(self.load.written());
        let todo = self.unstored_blocks();
        if todo.is_empty() {
            return Ok(());
        }
        let done = self.store_blocks(&todo).and_then(|stored| {
            let ids = match stored.is_empty() {
                true => Vec::new(),
                false => self.record_tick_chunks(&stored)?,
            };
            Ok((stored, ids))
        });
        let (stored, ids) = match done {
            Ok(x) => x,
            Err(e) => {
                self.forget_failed_writes(&e)?;
                return Err(e);
            }
        };
        let mut loose = Vec::new();
        let stored: Vec<(usize, u64)> = stored.iter().map(|(n, _)| *n).zip(ids).collect();
        for batch in stored.chunks(LOCKED_BATCH) {
            let inos: Vec<u64> = batch.iter().map(|(n, _)| todo[*n].0).collect();
            let mut st = self.lock_inos(&inos);
            let mut marks = self.ticks.marks();
            for &(n, id) in batch {
                let (ino, blk, b) = &todo[n];
                let ov = st.dirty(*ino);
                let held = ov.blocks.get(ino).and_then(|m| m.get(blk));
                match held.is_some_and(|x| Arc::ptr_eq(x, b)) {
                    true => {
                        // Logged by chunk from now on: its bytes no longer
                        // count against a record's data.
                        if let Some(&(lo, hi)) = ov.unlogged.blocks.get(&(*ino, *blk)) {
                            ov.unlogged.bytes = ov.unlogged.bytes.saturating_sub((hi - lo) as u64);
                        }
                        marks.mark(*ino, *blk, b.clone(), id, false);
                    }
                    false => loose.push(id),
                }
            }
        }
        self.ticks.loosen(loose);
        Ok(())
    }

    /// The whole buffered blocks changed since the last record that no
    /// tick stored yet, sorted by file and block (patches are logged as
    /// they are: small writes over committed blocks). Not a cut: a block
    /// written during the pass may be missed (the record logs its bytes).
    fn unstored_blocks(&self) -> Vec<(u64, u64, Block)> {
        let mut todo = Vec::new();
        for shard in 0..crate::state::SHARDS {
            let mut from = (0, 0);
            while let Some(next) = self.unstored_in(shard, from, &mut todo) {
                from = next;
            }
        }
        todo.sort_unstable_by_key(|t| (t.0, t.1));
        todo
    }

    /// Adds to `todo` the unstored blocks of `shard` from key `from`, at
    /// most `LOCKED_BATCH` looked at under its lock; returns the key to go
    /// on from, if any.
    fn unstored_in(
        &self,
        shard: usize,
        from: (u64, u64),
        todo: &mut Vec<(u64, u64, Block)>,
    ) -> Option<(u64, u64)> {
        let st = self.lock_shard(shard);
        let marks = self.ticks.marks();
        let ov = &st.shards().next().expect("the shard is held").dirty;
        let mut keys = ov.unlogged.blocks.range(from..).map(|(k, _)| *k);
        for (ino, blk) in keys.by_ref().take(LOCKED_BATCH) {
            let Some(b) = ov.blocks.get(&ino).and_then(|m| m.get(&blk)) else {
                continue;
            };
            if !b.is_empty() && marks.chunk_of(ino, blk, b).is_none() {
                todo.push((ino, blk, b.clone()));
            }
        }
        keys.next()
    }

    /// Stores the blocks with new content (not zeros, not a chunk the pool
    /// holds already, not earlier in `todo`), compressed on every core, and
    /// syncs them; returns (index in `todo`, chunk record) of each.
    fn store_blocks(&self, todo: &[(u64, u64, Block)]) -> Result<Vec<(usize, ChunkRec)>> {
        let hashes = hash_all(self.pool.chunks.codec(), todo);
        let r = self.meta()?;
        let dedup = self.pool.config.dedup;
        let mut seen: HashSet<Hash> = HashSet::new();
        let mut news = Vec::new();
        for (n, h) in hashes.into_iter().enumerate() {
            let Some(h) = h else { continue };
            if dedup
                && (!seen.insert(h) || crate::writeback::flush::indexed_chunk(&r, &h)?.is_some())
            {
                continue;
            }
            news.push((n, h));
        }
        drop(r);
        let raws: Vec<(&[u8], Hash)> = (news.iter())
            .map(|(n, h)| (todo[*n].2.as_slice(), *h))
            .collect();
        let chunks = &self.pool.chunks;
        let packed = chunks.codec().pack_all(chunks.compression(), &raws);
        let layouts = self.own_layouts(news.iter().map(|(n, _)| todo[*n].0))?;
        let mut batch = self.pool.chunks.batch();
        let mut out = Vec::with_capacity(news.len());
        for ((n, h), z) in news.into_iter().zip(packed) {
            batch.set_layout(layouts.get(&todo[n].0).copied().flatten());
            // For read-modify-write after the commit, as a flush keeps them.
            self.recent.insert(h, &todo[n].2);
            let rec = crate::writeback::flush::append_block(&mut batch, &todo[n].2, z, &h)?;
            out.push((n, rec));
        }
        for (id, _) in batch.finish()? {
            self.pool.chunks.heat.written(id);
        }
        Ok(out)
    }

    /// Step 2: the chunk records, with no reference yet, and the segments
    /// they went to, in one transaction; returns their ids.
    fn record_tick_chunks(&self, stored: &[(usize, ChunkRec)]) -> Result<Vec<u64>> {
        let touched: BTreeSet<u64> = stored.iter().map(|(_, c)| c.segment).collect();
        let ids = self.pool.meta.write(|w| {
            let first = w.counter("next_chunk")?;
            if w.counter(TICK_CHUNKS_FROM)? == 0 {
                w.set_counter(TICK_CHUNKS_FROM, first)?;
            }
            let mut ids = Vec::with_capacity(stored.len());
            for (k, (_, rec)) in stored.iter().enumerate() {
                let id = first + k as u64;
                let rec = ChunkRec {
                    refs: 0,
                    live: 0,
                    ..rec.clone()
                };
                self.put_new_chunk(w, id, &rec)?;
                ids.push(id);
            }
            w.set_counter("next_chunk", first + stored.len() as u64)?;
            self.store_segments(w, &touched)?;
            Ok::<_, crate::error::FsError>(ids)
        })?;
        Ok(ids)
    }
}

impl Fs {
    /// Replays a `T_STORED` entry: the block's bytes are read back from its
    /// chunk (verified whole) and buffered, marked with that chunk, so that
    /// the commit after the replay takes the chunk as it is.
    pub(crate) fn replay_stored(
        &self,
        st: &mut crate::vfs::State,
        ino: u64,
        blk: u64,
        len: usize,
        chunk: u64,
    ) -> Result<()> {
        let r = self.meta()?;
        if r.chunk(chunk)?.is_none() {
            return Err(crate::writeback::intent_record::corrupt(&format!(
                "inode {ino} block {blk}: the record names chunk {chunk}, which is missing"
            )));
        }
        let read = self.with_chunk(&r, ino, blk, chunk, |rec| {
            self.pool.chunks.read_chunk(rec, true)
        });
        let (b, unread): (Block, bool) = match read {
            Ok(bytes) if bytes.len() == len => (Arc::new(bytes), false),
            Ok(bytes) => {
                return Err(crate::writeback::intent_record::corrupt(&format!(
                    "inode {ino} block {blk}: chunk {chunk} holds {} bytes, the record says {len}",
                    bytes.len()
                )))
            }
            Err(e) => {
                // The block keeps its chunk as it is: reads of it fail
                // (EIO) until it is written again, and the rest of the pool
                // mounts. A placeholder holds its place, never read.
                tracing::error!(
                    "inode {ino} block {blk}: its logged data (chunk {chunk}) cannot be read: \
                     {e}; the block keeps that chunk, and reads of it fail until it is written again"
                );
                (Arc::new(vec![0; len]), true)
            }
        };
        st.dirty(ino).put_block(ino, blk, b.clone(), 0, len);
        self.ticks.marks().mark(ino, blk, b, chunk, unread);
        Ok(())
    }

    /// Refuses a replayed change that needs the bytes of a block the
    /// replay could not read back (see `Mark::unread`), unless it
    /// replaces the whole block (`whole`).
    pub(crate) fn refuse_unread(
        &self,
        st: &mut crate::vfs::State,
        ino: u64,
        blk: u64,
        whole: bool,
    ) -> Result<()> {
        let Some(b) = st.dirty(ino).blocks.get(&ino).and_then(|m| m.get(&blk)) else {
            return Ok(());
        };
        match self.ticks.is_unread(ino, blk, b) {
            Some(chunk) if !whole => Err(crate::error::FsError::Io(format!(
                "inode {ino} block {blk}: a logged change needs the block's bytes, and its \
                 chunk {chunk} cannot be read; the intent log cannot be replayed until the \
                 device holding it reads again"
            ))),
            _ => Ok(()),
        }
    }

    /// At open, before the replay: the chunks ticks stored since the last
    /// commit that left none waiting, less those the intent records to
    /// replay name, are loose (the next commit removes the unreferenced).
    pub(crate) fn load_tick_chunks(&self, records: &[Record]) -> Result<()> {
        let mut named = HashSet::new();
        for (_, rec) in records {
            // A damaged record names none (the replay refuses it).
            for e in decode(rec, self.record).unwrap_or_default() {
                if let Entry::Stored { chunk, .. } = e {
                    named.insert(chunk);
                }
            }
        }
        let r = self.meta()?;
        let from = r.counter(TICK_CHUNKS_FROM)?;
        if from == 0 {
            return Ok(());
        }
        let next = r.counter("next_chunk")?;
        self.ticks
            .loosen((from..next).filter(|id| !named.contains(id)));
        Ok(())
    }
}

/// The content hash of each block (None: all zeros), on every core.
fn hash_all(codec: &cairn_data::ChunkCodec, todo: &[(u64, u64, Block)]) -> Vec<Option<Hash>> {
    cairn_data::codec::on_every_core(todo, |t| crate::writeback::flush::content_hash(codec, &t.2))
}
