//! Flush: turns the dirty overlay into one committed version. Blocks are
//! written sorted by file and offset into the open segment and synced; then
//! one metadata transaction, stamped with a new TID, ends the replaced
//! elements and adds the new ones. A crash before the commit leaves the
//! previous version; after it, the new one. Expired history is pruned in
//! the same transaction and the chunks it alone referenced are released.

use crate::error::{invariant, FsError, Result};
use crate::history::liveness::add_ref;
use crate::history::snapshot::Snapshot;
use crate::types::{Extent, Time};
use crate::vfs::Fs;
use crate::writeback::log_file::LogFile;
use crate::writeback::overlay::{Block, Overlay};
use crate::writeback::tick::TickTake;
use cairn_data::{ChunkRec, Hash, Layout};
use cairn_devices::SlotAddr;
use cairn_meta::{ElemKey, Element, MetaError, MetaRead, MetaWrite, RecordType};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Where a block's bytes went.
enum Stored {
    /// All zeros: no chunk.
    Hole,
    /// A new chunk, written by this flush.
    New(ChunkRec),
    /// Same content as an already committed chunk (dedup).
    Existing(u64),
    /// Same content as the new chunk of an earlier block of this flush
    /// (index into the written list).
    Earlier(usize),
    /// New bytes with this hash, stored by `BlockSink::store_new` (which
    /// makes it New) before the flush commits.
    Pending(Hash),
    /// Same content as new piece `k` of the pieced block at index `i` of
    /// the written list.
    EarlierPiece(usize, usize),
    /// Pieces over the committed extent (`pieces.rs`): the planned extent
    /// and where the bytes of its `NEW_PIECE` pieces went, in order (New,
    /// Existing, Earlier or EarlierPiece).
    Pieced(Extent, Vec<Stored>),
}

/// Whole blocks to write: (inode, block, bytes).
type Wholes = Vec<(u64, u64, Block)>;

/// Patched blocks planned as pieces: (inode, block, planned extent, the
/// patch whose ranges are the new pieces).
type Pieced<'o> = Vec<(u64, u64, Extent, &'o crate::writeback::patch::Patch)>;

/// Which written block a pieced extent is, and the chunk ids of the
/// written blocks before it.
struct PieceAt<'a> {
    n: usize,
    ids: &'a [u64],
}

/// The changes a snapshot cut sealed (`history/snapshot.rs`): the next
/// holder of the flush lock commits them as its own TID, with the
/// snapshots, before anything else (`commit_sealed`).
#[derive(Clone)]
pub(crate) struct Sealed {
    pub(crate) ov: Arc<Overlay>,
    pub(crate) next_ino: u64,
    pub(crate) snaps: Vec<Snapshot>,
    /// The snapshots are in the intent log (`snapshot_logged`): callers
    /// were told they are durable, so a failed commit stops the
    /// filesystem rather than give the changes back without them (the
    /// replay at the next mount takes them).
    pub(crate) logged: bool,
}

/// Counters of the commit of a TID tried again (`LogFile::taken_back`):
/// the TID, and how many of the first intent records on top of it it holds
/// (a replay on top of that TID skips them).
pub(crate) const INTENT_FLOOR_TID: &str = "intent_floor_tid";
pub(crate) const INTENT_FLOOR: &str = "intent_floor";

/// A block ready to commit.
struct Written {
    ino: u64,
    blk: u64,
    len: u32,
    stored: Stored,
}

impl Fs {
    /// Commits everything buffered so far; returns when it is durable.
    pub fn flush(&self) -> Result<()> {
        self.flush_with(false)
    }

    /// Like `flush`, and also prunes all fine-grained history when `prune_all`
    /// (used when the pool runs short of space).
    pub(crate) fn flush_with(&self, prune_all: bool) -> Result<()> {
        self.flush_try(prune_all, true)
    }

    /// One flush; after a failed device write, `retry` tries once more
    /// (placement then prefers the devices without errors).
    fn flush_try(&self, prune_all: bool, retry: bool) -> Result<()> {
        self.check_ok()?;
        let mut last_tid = self.flush_guard();
        // A cut's commit that `flush_guard` made may have stopped it.
        self.check_ok()?;
        let tid = *last_tid + 1;
        let (ov, next_ino) = {
            // The log, then every shard: a consistent cut of all changes.
            let mut lg = self.log_guard();
            let mut st = self.lock_all();
            if st.shards().all(|s| s.dirty.is_empty()) && !prune_all {
                return Ok(());
            }
            (self.seal(&mut st, lg.as_deref_mut(), tid), self.next_ino())
        };
        let e = match self.commit(&ov, tid, next_ino, prune_all, &[]) {
            Ok(freed) => return self.committed(&mut last_tid, tid, &freed),
            Err(e) => e,
        };
        if !self.take_back(&e, ov, tid)? {
            return Err(self.stop(e));
        }
        drop(last_tid);
        if e.failed_device().is_some() {
            return match retry {
                true => self.flush_try(prune_all, false),
                false => Err(e),
            };
        }
        if e.is_no_space() && self.reserve.spend_for(&self.no_space_cause(&e)) {
            // The reserve gave the metadata room: try once more.
            return self.flush_try(prune_all, retry);
        }
        match e.is_no_space() {
            true => Err(FsError::NoSpace),
            false => Err(e),
        }
    }

    /// What ran out of space, for the log and `info`: the pool's devices
    /// (every slot taken), or a host filesystem under them or the metadata.
    fn no_space_cause(&self, e: &FsError) -> String {
        use cairn_data::DataError;
        use cairn_devices::DeviceError;
        match e {
            FsError::NoSpace
            | FsError::Data(DataError::NoSpace)
            | FsError::Data(DataError::Device(DeviceError::NoSpace))
            | FsError::Device(DeviceError::NoSpace) => {
                let (total, free) = self.pool.chunks.devices().slot_totals();
                format!(
                    "the pool's devices are full ({} of {total} segment slots in use, none \
                     free on a device that takes new data)",
                    total - free
                )
            }
            FsError::Data(_) => format!("a host filesystem under a pool device is full ({e})"),
            _ => format!("the filesystem holding the metadata is full ({e})"),
        }
    }

    /// Takes every shard's dirty overlay as the one being committed as
    /// `tid` (every shard locked: a consistent cut); reads find it in
    /// `flushing`, above any sealed before it. The intent log, locked before the shards, is sealed with
    /// it (`LogFile::seal`): fsyncs go on logging while it commits.
    pub(crate) fn seal(
        &self,
        st: &mut crate::vfs::State,
        log: Option<&mut LogFile>,
        tid: u64,
    ) -> Arc<Overlay> {
        if let Some(l) = log {
            l.seal(tid);
        }
        let parts = st.shards_mut().map(|s| std::mem::take(&mut s.dirty));
        let ov = Arc::new(Overlay::merge_disjoint(parts.collect::<Vec<_>>()));
        self.flushing.write().push(ov.clone());
        ov
    }

    /// After the commit of `tid`: the intent log and the overlay it held
    /// (the oldest being committed) are retired, the freed slots go back.
    fn committed(&self, last_tid: &mut u64, tid: u64, freed: &[SlotAddr]) -> Result<()> {
        *last_tid = tid;
        self.must_commit.store(false, Ordering::SeqCst);
        self.retire_intent(tid);
        let st = self.lock_all();
        self.drop_ns_meta();
        self.flushing.write().pop_oldest();
        drop(st);
        // Committed: a slot that cannot be freed safely is a bug that
        // stops the filesystem, as one met during the commit would.
        (self.pool.chunks.release_slots(freed)).map_err(|e| self.stop_on_invariant(e.into()))?;
        self.reserve.recover();
        self.pool.chunks.probe_suspects();
        Ok(())
    }

    /// A commit failed: false when the filesystem cannot survive it (the
    /// caller stops it); otherwise the overlay's changes go back for the
    /// next flush, and a failed device has the error counted.
    fn take_back(&self, e: &FsError, ov: Arc<Overlay>, tid: u64) -> Result<bool> {
        let meta_failed = e.failed_meta_write();
        let device = e.failed_device();
        if e.is_invariant() || (!e.is_no_space() && !meta_failed && device.is_none()) {
            tracing::error!("commit of tid {tid} failed");
            return Ok(false);
        }
        tracing::warn!("commit of tid {tid} failed: {e}; its changes stay buffered");
        if let Err(e2) = self.keep_uncommitted(ov, tid, e) {
            return Err(self.stop(e2));
        }
        Ok(true)
    }

    /// After a failed commit or tick (`e`), nothing names what it wrote:
    /// the data layer's segments in RAM go back to the committed table,
    /// the store is opened again if its write failed (redb fails such a
    /// handle from then on; the cached view goes first, it holds the old
    /// one), and a failed device write counts against its device.
    pub(crate) fn forget_failed_writes(&self, e: &FsError) -> Result<()> {
        self.drop_ns_meta();
        if e.failed_meta_write() {
            self.pool.meta.reopen()?;
        }
        let table = crate::pool::segment_table(&self.meta()?)?;
        self.pool.chunks.rollback(table)?;
        if let Some(dev) = e.failed_device() {
            let n = self.pool.chunks.devices().note_write_error(dev);
            tracing::error!("device {dev}: {n} failed writes");
        }
        Ok(())
    }

    /// Commits the changes a snapshot cut sealed, with its snapshots, as
    /// the next TID. Called with the flush lock held, before anything else
    /// the holder does: no other change may commit before them. A failure
    /// is kept for `snapshot_create` to report; the changes stay buffered
    /// (the snapshot is not taken), unless the snapshot was logged: then
    /// the filesystem stops, and the next mount's replay takes it. The
    /// changes stay in `sealed` until then: a snapshot is not sealed
    /// above them meanwhile (`snapshot_during_commit`).
    /// The oldest cut waiting is committed; returns whether it was taken
    /// from the queue (false: stopped, the next mount's replay takes them).
    pub(crate) fn commit_sealed(&self, last_tid: &mut u64) -> bool {
        let Some(s) = self.sealed.lock().front().cloned() else {
            return false;
        };
        if self.check_ok().is_err() {
            return false; // stopped: the next mount's replay takes them
        }
        let tid = *last_tid + 1;
        let names: Vec<&str> = s.snaps.iter().map(|s| s.name.as_str()).collect();
        let committed = self.commit(&s.ov, tid, s.next_ino, false, &s.snaps);
        self.sealed.lock().pop_front();
        let e = match committed {
            Ok(freed) => {
                let r = self.committed(last_tid, tid, &freed);
                if let Err(e) = r.and_then(|()| self.refresh_retained()) {
                    tracing::warn!("after the commit of snapshot {names:?} (tid {tid}): {e}");
                }
                return true;
            }
            Err(e) => e,
        };
        match s.logged {
            true => tracing::error!(
                "snapshot {names:?} at tid {tid} is in the intent log but its commit failed: {e}; the next mount commits it"
            ),
            false => tracing::error!("snapshot {names:?} at tid {tid} not taken: {e}"),
        }
        *self.sealed_error.lock() = Some(format!("snapshot {names:?} not taken: {e}"));
        match self.take_back(&e, s.ov, tid) {
            Ok(true) if !s.logged => {}
            Err(_) => {}
            Ok(_) => {
                self.stop(e);
            }
        }
        true
    }

    /// Leaves the changes a snapshot sealed as `snap.tid`, with it, for the
    /// next holder of the flush lock to commit (`commit_sealed`); `logged`:
    /// its intent record was written (see `Sealed::logged`).
    pub(crate) fn leave_sealed(
        &self,
        ov: Arc<Overlay>,
        next_ino: u64,
        snap: &Snapshot,
        logged: bool,
    ) {
        *self.sealed_error.lock() = None;
        self.sealed.lock().push_back(Sealed {
            ov,
            next_ino,
            snaps: vec![snap.clone()],
            logged,
        });
    }

    /// Test hook (tests of the invariant path only): the next commit
    /// writes its metadata as the TID before its own, the last committed
    /// one, as a bug in the TID arithmetic would; the metadata store
    /// refuses it (`MetaError::Invariant`) and the filesystem stops.
    pub fn test_hook_repeat_next_tid(&self) {
        self.repeat_tid.store(true, Ordering::Relaxed);
    }

    /// Stops the filesystem (`stop`) when `e` is a violated invariant;
    /// for the background tasks, whose other errors are only logged.
    pub(crate) fn stop_on_invariant(&self, e: FsError) -> FsError {
        match e.is_invariant() {
            true => self.stop(e),
            false => e,
        }
    }

    /// A failure that leaves the filesystem unable to commit: it stops
    /// accepting changes (remount to recover the last commit).
    fn stop(&self, e: FsError) -> FsError {
        tracing::error!("{e}; the filesystem stops accepting changes");
        // A stop's own error says why once (check_ok wraps it again).
        let why = match &e {
            FsError::Failed(why) => why.clone(),
            e => e.to_string(),
        };
        *self.failed.lock() = Some(why);
        e
    }

    /// A commit failed (`e`: for lack of space, a metadata or a device
    /// write): its overlay goes back under the changes made since (nothing
    /// users were told was written is lost), and what it wrote is
    /// forgotten (`forget_failed_writes`). The next flush tries again.
    fn keep_uncommitted(&self, ov: Arc<Overlay>, tid: u64, e: &FsError) -> Result<()> {
        self.must_commit.store(true, Ordering::SeqCst);
        let mut lg = self.log_guard();
        let mut st = self.lock_all();
        if let Some(l) = lg.as_deref_mut() {
            l.taken_back(tid);
        }
        // Newest first: a cut sealed above these during their commit goes
        // back too, above them.
        let mut back = Vec::new();
        if st.flushing.len() > 1 {
            // A logged snapshot's changes cannot go back under the dirty
            // ones: its record holds them, and those under it; the replay
            // at the next mount commits both.
            let cut = self.take_back_stacked_cut(lg.as_deref_mut());
            back.push(cut.ok_or_else(|| {
                FsError::Failed("a commit failed under a logged snapshot".into())
            })?);
        }
        drop(lg);
        let flushing = self.flushing.write().pop_oldest();
        back.push(flushing.expect("the failed overlay is flushing"));
        st.flushing = Default::default();
        drop(ov);
        for shared in back {
            let older = Arc::try_unwrap(shared).unwrap_or_else(|shared| (*shared).clone());
            let parts = older.split(crate::state::SHARDS, crate::state::shard_of);
            for (sh, part) in st.shards_mut().zip(parts) {
                sh.dirty.absorb_older(part);
            }
        }
        drop(st);
        self.forget_failed_writes(e)
    }

    /// The overlay of a cut sealed during a commit that failed
    /// (`cut_during_commit`), taken from the queue and from `flushing`
    /// (the log and every shard locked); its snapshot is not taken, and
    /// the log no longer waits to seal it. None when the overlay above
    /// the failed one is not a cut's (a logged snapshot's).
    fn take_back_stacked_cut(&self, lg: Option<&mut LogFile>) -> Option<Arc<Overlay>> {
        let mut q = self.sealed.lock();
        let newest = self.flushing.read().newest().cloned()?;
        let cut = q
            .back()
            .filter(|c| !c.logged && Arc::ptr_eq(&c.ov, &newest))?;
        let names: Vec<&str> = cut.snaps.iter().map(|s| s.name.as_str()).collect();
        let why = format!("snapshot {names:?} not taken: the commit under it failed");
        tracing::error!("{why}");
        *self.sealed_error.lock() = Some(why);
        q.pop_back();
        if let Some(l) = lg {
            l.cancel_pending_seal();
        }
        self.flushing.write().pop_newest()
    }

    pub fn last_tid(&self) -> u64 {
        *self.flush_guard()
    }

    /// Whether sealed changes are being committed (or wait for a commit).
    pub fn committing(&self) -> bool {
        !self.flushing.read().is_empty()
    }

    /// Writes the overlay's blocks, sorted by file and offset. With dedup
    /// on, a block whose hash is already stored (committed, or earlier in
    /// this flush) is not written again. The committed index is read under
    /// the flush lock: only this flush's own commit can drop a chunk, and it
    /// adds the new references before it prunes. Blocks are hashed a window
    /// per core ahead on other threads while this one seals and dedups.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a block is at most a record (record size <= 1 MiB, check_geometry)"
    )]
    fn write_blocks(&self, ov: &Overlay, take: &TickTake) -> Result<(Vec<Written>, BTreeSet<u64>)> {
        let mut blocks: Vec<(u64, u64, Block)> = ov
            .blocks
            .iter()
            .flat_map(|(&ino, m)| m.iter().map(move |(&b, d)| (ino, b, d.clone())))
            .filter(|(ino, b, _)| !take.taken.contains_key(&(*ino, *b)))
            .collect();
        let (whole, pieced) = self.resolve_patches(ov)?;
        blocks.extend(whole);
        // Files of one layout after another (each goes to open segments
        // of its layout, `path_policy.rs`), then by file and offset.
        let inos = blocks.iter().map(|b| b.0).chain(pieced.iter().map(|p| p.0));
        let layouts =
            crate::redundancy::path_policy::layouts_in(ov, &self.meta()?, self.names(), inos)?;
        let code = |ino: u64| {
            layouts
                .get(&ino)
                .copied()
                .flatten()
                .map_or(0, Layout::counter)
        };
        blocks.sort_unstable_by_key(|&(ino, blk, _)| (code(ino), ino, blk));
        let blocks: Vec<(u64, u64, &Block)> = blocks.iter().map(|(i, b, d)| (*i, *b, d)).collect();
        let windows: Vec<_> = blocks.chunks(HASH_WINDOW).collect();
        let mut sink = BlockSink::new(self, layouts)?;
        let ahead = PackAhead::of(self, &sink)?;
        let ahead = &ahead;
        std::thread::scope(|sc| {
            let spawn = |i: usize| {
                let w = windows.get(i).copied()?;
                Some(sc.spawn(move || {
                    let pack = w.iter().map(|b| b.2.len()).sum::<usize>() <= PACK_AHEAD_BYTES;
                    w.iter()
                        .map(|b| ahead.hash_and_pack(b.2, pack))
                        .collect::<Vec<_>>()
                }))
            };
            // As many windows hashed ahead as there are cores.
            let depth = std::thread::available_parallelism().map_or(2, |n| n.get());
            let mut ahead: std::collections::VecDeque<_> = (0..depth).filter_map(spawn).collect();
            for (i, window) in windows.iter().enumerate() {
                let hashes = ahead.pop_front().expect("window hashed").join();
                let hashes = hashes.map_err(|_| FsError::Io("block hashing panicked".into()))?;
                ahead.extend(spawn(i + depth));
                let mut news = Vec::new();
                for (&(ino, blk, data), (h, packed)) in window.iter().zip(hashes) {
                    if let Some(at) = sink.put(ino, blk, data, h)? {
                        news.push((at, data.as_slice(), packed));
                    }
                }
                sink.store_new(news)?;
            }
            Ok::<_, FsError>(())
        })?;
        for (ino, blk, ext, patch) in pieced {
            sink.put_pieces(ino, blk, ext, patch)?;
        }
        // Blocks a tick stored: their chunks, nothing written again.
        for (&(ino, blk), &id) in &take.taken {
            let len = ov.blocks[&ino][&blk].len() as u32;
            sink.out.push(Written {
                ino,
                blk,
                len,
                stored: Stored::Existing(id),
            });
        }
        // Every buffered block and patch of the overlay is committed, once:
        // one left out would be lost when the overlay retires.
        let want = (ov.blocks.values().map(|m| m.len()))
            .chain(ov.patches.values().map(|m| m.len()))
            .sum::<usize>();
        invariant!(
            sink.out.len() == want,
            "{} blocks to commit for the overlay's {want}",
            sink.out.len()
        );
        sink.finish(self)
    }

    /// What the flush writes for the overlay's patches: a patch over a
    /// committed block that fits as pieces is planned as such (nothing is
    /// read, `pieces.rs`); every other patched block is made whole, each
    /// committed block read once, in device order (see `patch.rs`), by as
    /// many threads as there are cores.
    fn resolve_patches<'o>(&self, ov: &'o Overlay) -> Result<(Wholes, Pieced<'o>)> {
        let r = self.meta()?;
        let mut todo = Vec::new();
        let mut pieced = Vec::new();
        for (&ino, m) in &ov.patches {
            for (&blk, p) in m {
                let ext = self.committed_extent(&r, ino, blk)?;
                let plan = ext
                    .as_ref()
                    .and_then(|e| crate::writeback::pieces::plan(e, p, self.record));
                if let Some(x) = plan {
                    pieced.push((ino, blk, x, p));
                    continue;
                }
                let at = match &ext {
                    Some(e) => r
                        .chunk(e.chunk)?
                        .map(|raw| ChunkRec::decode(&raw))
                        .transpose()?,
                    None => None,
                }
                .map_or((0, 0), |c| (c.segment, c.offset));
                todo.push((at, ino, blk, ext, p));
            }
        }
        pieced.sort_unstable_by_key(|t| (t.0, t.1));
        todo.sort_unstable_by_key(|t| t.0);
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let per = todo.len().div_ceil(threads).max(1);
        let whole = std::thread::scope(|sc| {
            let parts: Vec<_> = todo
                .chunks(per)
                .map(|part| {
                    let r = &r;
                    sc.spawn(move || {
                        part.iter()
                            .map(|(_, ino, blk, ext, p)| {
                                let mut b = match ext {
                                    Some(e) => self.read_extent(r, *ino, *blk, e)?,
                                    None => Vec::new(),
                                };
                                p.apply(&mut b);
                                Ok((*ino, *blk, Arc::new(b)))
                            })
                            .collect::<Result<Vec<_>>>()
                    })
                })
                .collect();
            let mut out = Vec::new();
            for h in parts {
                let part = h
                    .join()
                    .map_err(|_| FsError::Io("patch resolution panicked".into()))?;
                out.extend(part?);
            }
            Ok::<_, FsError>(out)
        })?;
        Ok((whole, pieced))
    }

    fn commit(
        &self,
        ov: &Overlay,
        tid: u64,
        next_ino: u64,
        prune_all: bool,
        snaps: &[Snapshot],
    ) -> Result<Vec<SlotAddr>> {
        let t0 = std::time::Instant::now();
        self.meta_room(ov)?;
        let take = self.tick_take(ov);
        let (written, mut touched) = self.write_blocks(ov, &take)?;
        let t1 = t0.elapsed();
        let r = self.commit_meta(
            ov,
            (tid, next_ino),
            (prune_all, &take),
            snaps,
            &written,
            &mut touched,
        );
        if r.is_ok() {
            self.ticks.retire(&take);
        }
        tracing::debug!(
            "tid {tid}: {} blocks ({} bytes) written in {:?}, committed in {:?}",
            written.len(),
            ov.bytes,
            t1,
            t0.elapsed() - t1
        );
        if r.is_ok() {
            let data_ns = u64::try_from(t1.as_nanos()).unwrap_or(u64::MAX);
            let meta_ns = u64::try_from((t0.elapsed() - t1).as_nanos()).unwrap_or(u64::MAX);
            self.commit_stats.note(data_ns, meta_ns, ov.bytes);
        }
        r
    }

    /// Allocates room for this commit's metadata on the host filesystem
    /// before anything is written, spending the reserve if that is what it
    /// takes (see `reserve.rs`).
    fn meta_room(&self, ov: &Overlay) -> Result<()> {
        let changes = change_count(ov);
        let need = self.reserve.headroom(changes);
        match self.pool.meta.ensure_headroom(need) {
            Err(MetaError::NoRoom(why)) if self.reserve.spend() => {
                tracing::warn!("{why}: spent the metadata reserve");
                Ok(self.pool.meta.ensure_headroom(need)?)
            }
            r => Ok(r?),
        }
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "nanoseconds since 1970: now is after 1970 and before 2554"
    )]
    fn commit_meta(
        &self,
        ov: &Overlay,
        (tid, next_ino): (u64, u64),
        (prune_all, take): (bool, &TickTake),
        snaps: &[Snapshot],
        written: &[Written],
        touched: &mut BTreeSet<u64>,
    ) -> Result<Vec<SlotAddr>> {
        // The TID a bug in the commit's arithmetic would give it (tests
        // of the invariant path only: `test_hook_repeat_next_tid`).
        let tid = match self.repeat_tid.swap(false, Ordering::Relaxed) {
            true => tid - 1,
            false => tid,
        };
        let now = Time::now().as_nanos() as u64;
        let floor = self.log_guard().map_or(0, |l| l.retried_records(tid));
        let retention = self
            .pool
            .config
            .history_retention_secs
            .saturating_mul(1_000_000_000);
        self.pool.meta.write(|w| {
            apply_overlay(w, ov, tid, self.names())?;
            // Names checked free by the cut, under the flush lock.
            for s in snaps {
                // The cut sealed the snapshot's changes as this TID: a
                // snapshot naming another would show another tree.
                invariant!(
                    s.tid == tid,
                    "snapshot {:?} of TID {} committed as TID {tid}",
                    s.name,
                    s.tid
                );
                w.put_snapshot(&s.name, &s.encode())?;
            }
            let mut next_chunk = w.counter("next_chunk")?;
            let mut ids = vec![0u64; written.len()];
            let mut piece_ids: HashMap<(usize, usize), u64> = HashMap::new();
            for (n, wb) in written.iter().enumerate() {
                let key = ElemKey::extent(wb.ino, wb.blk);
                // A block's extent covers its own bytes only: one longer
                // than a record would read over the next block.
                // Reads find the block at `blk * record` (the replay's
                // decoder refuses an index past that arithmetic too).
                invariant!(
                    wb.blk.checked_mul(self.record).is_some(),
                    "inode {} block {}: past the largest file offset",
                    wb.ino,
                    wb.blk
                );
                invariant!(
                    wb.len as u64 <= self.record,
                    "inode {} block {}: an extent of {} bytes in records of {}",
                    wb.ino,
                    wb.blk,
                    wb.len,
                    self.record
                );
                invariant!(
                    !matches!(wb.stored, Stored::Pending(_) | Stored::EarlierPiece(..)),
                    "inode {} block {}: committed with no chunk stored for it",
                    wb.ino,
                    wb.blk
                );
                let id = match &wb.stored {
                    Stored::Hole => {
                        w.end(&key, tid)?;
                        continue;
                    }
                    Stored::New(rec) => {
                        // The chunk holds the block's bytes, no more, no
                        // fewer: the extent's length is what reads expect.
                        invariant!(
                            rec.raw_len == wb.len,
                            "inode {} block {}: a chunk of {} bytes for {}",
                            wb.ino,
                            wb.blk,
                            rec.raw_len,
                            wb.len
                        );
                        let id = next_chunk;
                        next_chunk += 1;
                        self.put_new_chunk(w, id, rec)?;
                        id
                    }
                    Stored::Existing(id) => add_ref(self, w, *id, touched)?,
                    Stored::Earlier(i) => {
                        // An earlier block of this flush, stored new: its
                        // id is known by now.
                        invariant!(
                            *i < n && matches!(written[*i].stored, Stored::New(_)),
                            "inode {} block {}: a duplicate of written block {i} of {n}",
                            wb.ino,
                            wb.blk
                        );
                        add_ref(self, w, ids[*i], touched)?
                    }
                    Stored::Pieced(planned, news) => {
                        let at = PieceAt { n, ids: &ids };
                        let ext = self.commit_pieces(
                            w,
                            at,
                            planned,
                            news,
                            &mut piece_ids,
                            &mut next_chunk,
                            touched,
                        )?;
                        w.put(&key, &ext.encode(), tid)?;
                        continue;
                    }
                    Stored::EarlierPiece(..) => unreachable!("a piece's"),
                    Stored::Pending(_) => unreachable!("stored before the commit"),
                };
                ids[n] = id;
                w.put(&key, &Extent::whole(id, wb.len).encode(), tid)?;
            }
            w.set_counter("next_chunk", next_chunk)?;
            store_ino_counter(w, next_ino)?;
            w.set_counter("last_tid", tid)?;
            if floor > 0 {
                w.set_counter(INTENT_FLOOR_TID, tid)?;
                w.set_counter(INTENT_FLOOR, floor)?;
            }
            w.log_tid(tid, now)?;
            let mut freed = Vec::new();
            self.drop_tick_chunks(w, take, touched, &mut freed)?;
            self.settle_ended(w, tid, touched, &mut freed)?;
            let from = w.counter("pruned_tid")?;
            let aged = w.tid_before_time(from, now.saturating_sub(retention))?;
            let cutoff = self.prune_cutoff(prune_all, from, tid, aged);
            if let Some(cutoff) = cutoff.filter(|&c| c > from) {
                self.prune_in(w, from, cutoff, false, touched, &mut freed)?;
                w.set_counter("pruned_tid", cutoff)?;
            }
            self.store_segments(w, touched)?;
            Ok::<_, FsError>(freed)
        })
    }

    /// How far this commit prunes fine-grained history (None: not at all).
    /// - Short of space (under 1/16 of the pool free), or `prune_all`: all of
    ///   it, at every commit, so that deleted data frees space at once.
    /// - A faster tier short of space with history on it that the mover
    ///   cannot move down fast enough (see `fast_tier_history_pressure`):
    ///   the oldest quarter of what is left, at every commit until that tier has
    ///   room again. New writes then keep landing on the fastest tier,
    ///   instead of spilling to the slow one at its pace; the pool keeps at
    ///   least the history a pool of the fast device alone would keep.
    /// - Otherwise what is older than history_retention_secs (`aged`).
    ///
    /// Mirror holds bound the last two (see replica/holds.rs).
    fn prune_cutoff(&self, prune_all: bool, from: u64, tid: u64, aged: Option<u64>) -> Option<u64> {
        let c = &self.pool.chunks;
        let (slots, _) = c.devices().slot_totals();
        if prune_all || c.free_bytes() < slots * c.segment_size() / 16 {
            return Some(tid);
        }
        let halve = self
            .fast_tier_history_pressure()
            .then(|| from + (tid - from).div_ceil(4));
        aged.max(halve).map(|c| self.held_cutoff(c))
    }

    /// The extent of pieced block `at.n` as committed: each `NEW_PIECE`
    /// piece names the chunk its bytes went to (stored now, or referenced),
    /// and every chunk kept from the committed extent gains a reference.
    #[allow(clippy::too_many_arguments)]
    fn commit_pieces(
        &self,
        w: &mut MetaWrite<'_>,
        at: PieceAt<'_>,
        planned: &Extent,
        news: &[Stored],
        piece_ids: &mut HashMap<(usize, usize), u64>,
        next_chunk: &mut u64,
        touched: &mut BTreeSet<u64>,
    ) -> Result<Extent> {
        let mut ext = planned.clone();
        add_ref(self, w, ext.chunk, touched)?;
        let mut news = news.iter().enumerate();
        for p in &mut ext.pieces {
            if p.chunk != crate::writeback::pieces::NEW_PIECE {
                p.chunk = add_ref(self, w, p.chunk, touched)?;
                continue;
            }
            let (k, s) = news.next().expect("a chunk per new piece");
            p.chunk = match s {
                Stored::New(rec) => {
                    let id = *next_chunk;
                    *next_chunk += 1;
                    self.put_new_chunk(w, id, rec)?;
                    piece_ids.insert((at.n, k), id);
                    id
                }
                Stored::Existing(id) => add_ref(self, w, *id, touched)?,
                Stored::Earlier(i) => add_ref(self, w, at.ids[*i], touched)?,
                Stored::EarlierPiece(i, k) => add_ref(self, w, piece_ids[&(*i, *k)], touched)?,
                Stored::Hole | Stored::Pieced(..) | Stored::Pending(_) => {
                    unreachable!("not where a piece goes")
                }
            };
        }
        invariant!(
            news.next().is_none(),
            "block {}: more chunks stored than the planned extent has new pieces",
            at.n
        );
        // Stored otherwise, the block could not be read back (`decode`).
        invariant!(
            ext.pieces_valid() && ext.len as u64 <= self.record,
            "block {}: pieces {:?} over {} bytes",
            at.n,
            ext.pieces,
            ext.len
        );
        Ok(ext)
    }

    /// Records new chunk `id` and, when the pool dedups, its index entry.
    pub(crate) fn put_new_chunk(
        &self,
        w: &mut MetaWrite<'_>,
        id: u64,
        rec: &ChunkRec,
    ) -> Result<()> {
        w.put_new_chunk(id, &rec.encode())?;
        if self.pool.config.dedup {
            w.put_dedup(&rec.hash, id)?;
        }
        Ok(())
    }

    /// Writes the records of the segments a transaction changed.
    pub(crate) fn store_segments(
        &self,
        w: &mut MetaWrite<'_>,
        touched: &BTreeSet<u64>,
    ) -> Result<()> {
        let size = self.pool.chunks.segment_size();
        for id in touched.iter() {
            match self.pool.chunks.segment(*id) {
                Some(rec) => {
                    invariant!(
                        rec.used as u64 <= size,
                        "segment {id}: {} bytes used of {size}",
                        rec.used
                    );
                    w.put_segment(*id, &rec.encode())?
                }
                None => w.remove_segment(*id)?,
            }
        }
        // Segment ids are never reused: the counter only grows.
        let (next, stored) = (
            self.pool.chunks.next_segment_id(),
            w.counter("next_segment")?,
        );
        invariant!(
            next >= stored,
            "segment counter {next} below the committed {stored}"
        );
        w.set_counter("next_segment", next)?;
        Ok(())
    }

    /// Drops one reference per removed extent element; chunks without
    /// references are deleted and their space given back to the segment.
    /// Returns the number and bytes of chunks deleted.
    pub(crate) fn release_elements(
        &self,
        w: &mut MetaWrite<'_>,
        removed: &[Element],
        touched: &mut BTreeSet<u64>,
        freed: &mut Vec<SlotAddr>,
    ) -> Result<(u64, u64)> {
        let (mut chunks, mut bytes) = (0, 0);
        let mut ids = Vec::new();
        for e in removed {
            let chunks = crate::history::liveness::extent_chunks(e, w.is_opaque())?;
            ids.extend(chunks.into_iter().map(|id| (id, &e.key)));
        }
        for (id, key) in ids {
            let Some(raw) = w.chunk(id)? else {
                return Err(FsError::Io(format!("{key}: chunk {id} already gone")));
            };
            let mut rec = ChunkRec::decode(&raw)?;
            // A chunk with no reference left is removed with its last one.
            invariant!(
                rec.refs > 0,
                "{key}: chunk {id} with no reference left is still stored"
            );
            rec.refs -= 1;
            if rec.refs > 0 {
                w.put_chunk(id, &rec.encode())?;
                continue;
            }
            // Its segment counts it as history-only by its true live count
            // (decrements may wait in the stored one).
            rec.live = crate::history::liveness::true_live(w, id, &rec)?;
            self.remove_chunk(w, id, &rec, touched, freed)?;
            chunks += 1;
            bytes += rec.len as u64;
        }
        Ok((chunks, bytes))
    }

    /// Removes chunk `id` (`rec`, with the live count its segment knows it
    /// by) and its dedup entry, and gives its space back to the segment;
    /// a segment left empty goes to `freed`.
    pub(crate) fn remove_chunk(
        &self,
        w: &mut MetaWrite<'_>,
        id: u64,
        rec: &ChunkRec,
        touched: &mut BTreeSet<u64>,
        freed: &mut Vec<SlotAddr>,
    ) -> Result<()> {
        w.remove_chunk(id)?;
        w.remove_dedup(&rec.hash, id)?;
        let seg = self.pool.chunks.segment(rec.segment);
        touched.insert(rec.segment);
        if self.pool.chunks.unref_chunk(rec)?.is_none() {
            if let Some(s) = seg {
                freed.extend(s.places());
            }
        }
        Ok(())
    }
}

/// The elements committing `ov` changes, roughly (for metadata room).
pub(crate) fn change_count(ov: &Overlay) -> u64 {
    (ov.inodes.len()
        + ov.dirents.values().map(|m| m.len()).sum::<usize>()
        + ov.blocks.values().map(|m| m.len()).sum::<usize>()
        + ov.patches.values().map(|m| m.len()).sum::<usize>()
        + ov.xattrs.values().map(|m| m.len()).sum::<usize>()) as u64
}

/// Blocks hashed per window of the flush's hashing thread.
const HASH_WINDOW: usize = 64;

/// A block's content hash in this pool (`ChunkCodec::hash`), or None if
/// it is all zeros (a hole).
pub(crate) fn content_hash(codec: &cairn_data::ChunkCodec, data: &[u8]) -> Option<Hash> {
    (!data.iter().all(|&b| b == 0)).then(|| codec.hash(data))
}

/// A block's stored form (`ChunkCodec::pack`): None stores it raw.
type Packed = Option<(u8, Vec<u8>)>;

/// The most raw bytes a window may hold for its blocks to be sealed ahead
/// (`PackAhead`): the windows hashed ahead and the one being stored then
/// hold at most three times this in sealed copies besides the blocks
/// themselves (64 blocks of 64 KiB or 128 KiB records are sealed ahead; of
/// larger records, by the flusher, as in a pool without encryption).
const PACK_AHEAD_BYTES: usize = 8 << 20;

/// What the hash workers of a flush do beside hashing: in an encrypted
/// pool they also seal each block that the pool's dedup index does not
/// hold (it will most likely be stored), so that sealing runs on the
/// workers, ahead, instead of on the flusher between its windows. A block
/// packed ahead that turns out a duplicate (of another in the same flush)
/// wastes its sealing; one not packed ahead is packed by the flusher.
struct PackAhead<'a> {
    codec: &'a cairn_data::ChunkCodec,
    /// The index to look duplicates up in, and the compression to pack
    /// with, when blocks are packed ahead.
    pack: Option<(Option<MetaRead>, cairn_data::Compression)>,
}

impl<'a> PackAhead<'a> {
    fn of(fs: &'a Fs, sink: &BlockSink<'_>) -> Result<PackAhead<'a>> {
        let codec = fs.pool.chunks.codec();
        let pack = match codec.is_encrypted() {
            true => Some((sink.dedup.then(|| fs.meta()).transpose()?, sink.compression)),
            false => None,
        };
        Ok(PackAhead { codec, pack })
    }

    /// The block's content hash (None: a hole) and, when packed ahead
    /// (`pack`, and the pool packs ahead), its stored form.
    fn hash_and_pack(&self, data: &[u8], pack: bool) -> (Option<Hash>, Option<Packed>) {
        let h = content_hash(self.codec, data);
        let packed = match (&self.pack, h) {
            (Some((index, c)), Some(h)) if pack => {
                let known = index
                    .as_ref()
                    .is_some_and(|r| indexed_chunk(r, &h).ok().flatten().is_some());
                (!known).then(|| self.codec.pack(*c, data, &h))
            }
            _ => None,
        };
        (h, packed)
    }
}

/// Where `write_blocks` puts hashed blocks: dedup, then a chunk batch.
struct BlockSink<'a> {
    dedup: bool,
    meta: MetaRead,
    seen: HashMap<Hash, usize>,
    compression: cairn_data::Compression,
    /// New pieces of this flush by content: (written index, piece).
    piece_seen: HashMap<Hash, (usize, usize)>,
    out: Vec<Written>,
    batch: cairn_data::WriteBatch<'a>,
    recent: &'a crate::writeback::recent::RecentBlocks,
    /// Each file's own layout (`path_policy.rs`).
    layouts: HashMap<u64, Option<Layout>>,
}

impl<'a> BlockSink<'a> {
    fn new(fs: &'a Fs, layouts: HashMap<u64, Option<Layout>>) -> Result<Self> {
        Ok(BlockSink {
            dedup: fs.pool.config.dedup,
            meta: fs.meta()?,
            seen: HashMap::new(),
            compression: fs.pool.chunks.compression(),
            piece_seen: HashMap::new(),
            out: Vec::new(),
            batch: fs.pool.chunks.batch(),
            recent: &fs.recent,
            layouts,
        })
    }

    /// Sends the next chunks to segments of file `ino`'s layout.
    fn layout_of(&mut self, ino: u64) {
        let l = self.layouts.get(&ino).copied().flatten();
        self.batch.set_layout(l);
    }

    /// Where content `h` is stored already, with dedup on: a block or a
    /// piece written earlier in this flush, or a committed chunk. None
    /// when it is new (or dedup is off). Blocks are put before pieces, so
    /// a block never finds a piece.
    fn duplicate(&self, h: &Hash) -> Result<Option<Stored>> {
        if !self.dedup {
            return Ok(None);
        }
        Ok(match (self.seen.get(h), self.piece_seen.get(h)) {
            (Some(&i), _) => Some(Stored::Earlier(i)),
            (None, Some(&(i, k))) => Some(Stored::EarlierPiece(i, k)),
            (None, None) => indexed_chunk(&self.meta, h)?.map(Stored::Existing),
        })
    }

    /// Notes a hashed block: a hole, or a duplicate (dedup), or new bytes
    /// to store. For new bytes returns the index `store_new` fills in.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a block is at most a record (record size <= 1 MiB, check_geometry)"
    )]
    fn put(
        &mut self,
        ino: u64,
        blk: u64,
        data: &Block,
        hash: Option<Hash>,
    ) -> Result<Option<usize>> {
        if let Some(h) = hash {
            self.recent.insert(h, data);
        }
        let at = self.out.len();
        let stored = match hash {
            None => Stored::Hole,
            Some(h) => match self.duplicate(&h)? {
                Some(s) => s,
                None => {
                    self.seen.insert(h, at);
                    Stored::Pending(h)
                }
            },
        };
        let new = matches!(stored, Stored::Pending(_));
        self.out.push(Written {
            ino,
            blk,
            len: data.len() as u32,
            stored,
        });
        Ok(new.then_some(at))
    }

    /// Stores the new blocks of a window, in order, compressed (when the
    /// pool compresses) on every core first.
    fn store_new(&mut self, mut news: Vec<(usize, &[u8], Option<Packed>)>) -> Result<()> {
        // Blocks the hash workers did not pack (they looked like
        // duplicates, or the pool packs nothing ahead) are packed here.
        let hashed: Vec<(&[u8], Hash)> = (news.iter())
            .filter(|n| n.2.is_none())
            .map(|&(at, raw, _)| match self.out[at].stored {
                Stored::Pending(h) => (raw, h),
                _ => unreachable!("a new block is pending"),
            })
            .collect();
        let mut here = self
            .batch
            .codec()
            .pack_all(self.compression, &hashed)
            .into_iter();
        let packed: Vec<Packed> = (news.iter_mut())
            .map(|n| {
                n.2.take()
                    .or_else(|| here.next())
                    .expect("a packing per new block")
            })
            .collect();
        assert!(here.next().is_none(), "every packing made here is used");
        for (&(at, raw, _), z) in news.iter().zip(packed) {
            let Stored::Pending(h) = self.out[at].stored else {
                unreachable!("a new block is pending");
            };
            self.layout_of(self.out[at].ino);
            self.out[at].stored = Stored::New(append_block(&mut self.batch, raw, z, &h)?);
        }
        Ok(())
    }

    /// Writes the ranges of `patch` as the new pieces of `ext`, with dedup
    /// like whole blocks (a piece can name a committed chunk, a block or a
    /// piece written earlier in this flush).
    fn put_pieces(
        &mut self,
        ino: u64,
        blk: u64,
        ext: Extent,
        patch: &crate::writeback::patch::Patch,
    ) -> Result<()> {
        let mut news = Vec::new();
        self.layout_of(ino);
        for (k, (_, b)) in patch.ranges().enumerate() {
            let h = self.batch.codec().hash(b);
            news.push(match self.duplicate(&h)? {
                Some(s) => s,
                None => {
                    self.piece_seen.insert(h, (self.out.len(), k));
                    Stored::New(self.batch.append(b, &h)?)
                }
            });
        }
        self.out.push(Written {
            ino,
            blk,
            len: ext.len,
            stored: Stored::Pieced(ext, news),
        });
        Ok(())
    }

    /// Writes out and syncs the batch; the blocks and the touched segments.
    fn finish(self, fs: &Fs) -> Result<(Vec<Written>, BTreeSet<u64>)> {
        let segs = self.batch.finish()?;
        for (id, _) in &segs {
            // New data is as recent as a read: the mover demotes what was
            // neither read nor written for longest first.
            fs.pool.chunks.heat.written(*id);
        }
        Ok((self.out, segs.into_iter().map(|(id, _)| id).collect()))
    }
}

/// Appends a block with content hash `h` to `batch`: as `compress_all`
/// packed it (`z`), or raw.
#[allow(
    clippy::cast_possible_truncation,
    reason = "a block is at most a record (record size <= 1 MiB, check_geometry)"
)]
pub(crate) fn append_block(
    batch: &mut cairn_data::WriteBatch<'_>,
    raw: &[u8],
    z: Option<(u8, Vec<u8>)>,
    h: &Hash,
) -> Result<ChunkRec> {
    let n = raw.len() as u32;
    Ok(match z {
        Some((method, z)) => batch.append_stored(method, n, &z, h)?,
        None => batch.append_stored(cairn_data::compress::RAW, n, raw, h)?,
    })
}

/// The stored chunk with content hash `h`: the index gives a candidate by
/// the hash's first 6 bytes, and the chunk record's full hash confirms it.
pub(crate) fn indexed_chunk(r: &MetaRead, h: &Hash) -> Result<Option<u64>> {
    let Some(id) = r.dedup(h)? else {
        return Ok(None);
    };
    let Some(raw) = r.chunk(id)? else {
        return Ok(None);
    };
    Ok((ChunkRec::decode(&raw)?.hash == *h).then_some(id))
}

/// Writes the namespace part of an overlay: deletions, truncations, inodes,
/// entries, symlinks, xattrs and orphans.
fn apply_overlay(
    w: &mut MetaWrite<'_>,
    ov: &Overlay,
    tid: u64,
    names: &crate::names::Names,
) -> Result<()> {
    for (&ino, i) in &ov.inodes {
        if i.is_none() {
            for e in w.scan(&ElemKey::object_prefix(ino))? {
                w.end(&e.key, tid)?;
            }
            w.remove_orphan(ino)?;
        }
    }
    for (&ino, &first) in &ov.truncs {
        if matches!(ov.inodes.get(&ino), Some(None)) {
            continue;
        }
        for e in w.scan(&ElemKey::prefix(ino, RecordType::Extent))? {
            let blk = e.key.extent_block()?;
            if blk >= first {
                w.end(&e.key, tid)?;
            }
        }
    }
    for i in ov.inodes.values().flatten() {
        w.put(
            &ElemKey::new(i.ino, RecordType::Inode, &[]),
            &i.encode(),
            tid,
        )?;
    }
    for (&dir, ents) in &ov.dirents {
        for (sk, ent) in ents {
            let key = ElemKey::new(dir, RecordType::DirEntry, sk.as_bytes());
            match ent {
                Some(d) => w.put(&key, &d.encode(), tid)?,
                None => w.end(&key, tid)?,
            };
        }
    }
    for (&ino, target) in &ov.symlinks {
        w.put(&ElemKey::new(ino, RecordType::Symlink, &[]), target, tid)?;
    }
    for (&ino, xs) in &ov.xattrs {
        for (name, v) in xs {
            let key = names.xattr_key(ino, name);
            match v {
                Some(v) => w.put(&key, v, tid)?,
                None => w.end(&key, tid)?,
            };
        }
    }
    for &ino in &ov.orphans_add {
        w.add_orphan(ino)?;
    }
    for &ino in &ov.orphans_del {
        if !ov.orphans_add.contains(&ino) {
            w.remove_orphan(ino)?;
        }
    }
    Ok(())
}

/// Stores the inode counter in a transaction that writes inode elements:
/// it stays above every inode with elements (`MetaRead::may_hold_inode`),
/// and only grows, so inode numbers are never given twice.
pub(crate) fn store_ino_counter(w: &mut MetaWrite<'_>, next_ino: u64) -> Result<()> {
    let stored = w.counter(cairn_meta::tables::NEXT_INO)?;
    invariant!(
        next_ino >= stored,
        "inode counter {next_ino} below the committed {stored}"
    );
    w.set_counter(cairn_meta::tables::NEXT_INO, next_ino)?;
    Ok(())
}
