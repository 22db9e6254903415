//! The filesystem object: POSIX semantics over the versioned tree. It holds
//! the open pool, the write-back overlays and the background flusher. This
//! file has the state and the lookups shared by the operations, which live
//! in ops/ (namespace, file data, listings, references...).

use crate::error::{FsError, Result};
use crate::lock_rank::{Rank, Ranked};
use crate::pool::Pool;
use crate::types::{DirEnt, Extent, FileKind, Inode, Time, MAX_NAME};
use crate::writeback::committing::Committing;
use crate::writeback::overlay::{BlockState, DirKey, Overlay};
use cairn_data::ChunkRec;
use cairn_meta::{ElemKey, MetaError, MetaRead, RecordType};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Who is asking.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
}

impl Ctx {
    pub const ROOT: Ctx = Ctx { uid: 0, gid: 0 };
}

pub(crate) use crate::state::State;

pub struct Fs {
    /// Commit counts and durations for metrics (`service_stats.rs`).
    pub(crate) commit_stats: crate::service_stats::CommitStats,
    /// Progress of GC, reblock, scrub, prune and the mover, for metrics.
    pub(crate) maint_stats: crate::service_stats::MaintStats,
    /// When the last client write came, for the mover (`tier.rs`).
    pub(crate) writes: crate::maintenance::tier::WriteClock,
    pub(crate) pool: Pool,
    /// The write-back state, split by inode (`state.rs`).
    pub(crate) shards: Box<[Mutex<crate::state::Shard>]>,
    /// The overlays sealed and not yet committed (`committing.rs`);
    /// changed only with every shard locked.
    pub(crate) flushing: crate::lock_rank::RankedRwLock<Committing>,
    /// Totals of the dirty overlays (`state.rs`).
    pub(crate) load: crate::state::DirtyLoad,
    pub(crate) next_ino: std::sync::atomic::AtomicU64,
    /// Inodes created less inodes deleted since open (`inodes.rs`).
    pub(crate) live_delta: std::sync::atomic::AtomicI64,
    /// One flush at a time; holds the last committed TID.
    pub(crate) flush_lock: Mutex<u64>,
    /// Changes a snapshot cut sealed, committed by the next holder of the
    /// flush lock (`flush_guard`), and why the last such commit failed.
    /// Snapshot cuts waiting for their commit, oldest first: one, or a
    /// logged snapshot being committed with one logged on top of it
    /// (`snapshot_during_commit`).
    pub(crate) sealed: Mutex<std::collections::VecDeque<crate::writeback::flush::Sealed>>,
    pub(crate) sealed_error: Mutex<Option<String>>,
    pub(crate) failed: Mutex<Option<String>>,
    /// A commit failed and its changes went back into the overlay, where
    /// the intent log no longer sees them as unlogged: until a commit
    /// succeeds, fsync commits instead of logging.
    pub(crate) must_commit: AtomicBool,
    pub(crate) kick: Condvar,
    pub(crate) kick_lock: Mutex<bool>,
    /// Wakes the background threads' naps at shutdown (`nap`).
    stop_wake: Condvar,
    stop_lock: Mutex<()>,
    /// Held by a re-replication run (`redundancy/resilver.rs`).
    pub(crate) resilver_lock: Mutex<()>,
    /// Said once: segments wait for a stripe that the devices cannot give.
    pub(crate) stripes_warned: std::sync::atomic::AtomicBool,
    pub(crate) stopping: AtomicBool,
    pub(crate) record: u64,
    /// Snapshot TIDs (sorted): the history views that prune keeps.
    pub(crate) retained: parking_lot::RwLock<Vec<u64>>,
    /// The background snapshot hasher is running.
    pub(crate) hashing: AtomicBool,
    /// A read view of the committed metadata shared by the namespace
    /// lookups (see `ns_meta`), so that a lookup does not open a read
    /// transaction per element. Dropped at every commit of a flush (with
    /// the state lock held) and at every flusher tick.
    ns_read: Mutex<Option<Arc<MetaRead>>>,
    /// Blocks stored ahead of their commit by a tick (`tick.rs`).
    pub(crate) ticks: crate::writeback::tick::Ticks,
    /// Blocks the last flushes wrote, for read-modify-write (`recent.rs`).
    pub(crate) recent: crate::writeback::recent::RecentBlocks,
    /// Room kept on the metadata's host filesystem (`reserve.rs`).
    pub(crate) reserve: crate::pool::reserve::Reserve,
    /// Committed stored bytes per file, for st_blocks (`sparse.rs`).
    pub(crate) stored: crate::ops::sparse::StoredCache,
    /// Live inodes counted for statfs (`inodes.rs`).
    pub(crate) inode_count: crate::ops::inodes::InodeCount,
    /// The intent log fsync writes (`writeback/intent.rs`); taken before
    /// the shards, and after the flush lock by a holder of that. None when
    /// it could not be opened.
    pub(crate) intent: Option<crate::lock_rank::RankedMutex<crate::writeback::log_file::LogFile>>,
    /// Signalled when a commit retires the intent log (`retire_intent`):
    /// fsyncs waiting for a seal (`LogFile::seal_after_commit`) go on.
    pub(crate) intent_retired: Condvar,
    /// Waits for the state lock and the flush lock (`contention.rs`).
    pub(crate) st_wait: crate::contention::Contention,
    pub(crate) flush_wait: crate::contention::Contention,
    /// History kept for mirrors (`replica/holds.rs`).
    pub(crate) holds: crate::replica::holds::Holds,
    /// The background threads and their CPU priority (`background.rs`).
    pub(crate) background: crate::background::Background,
    /// Opened for salvage: read-only, from a copy in RAM of a damaged
    /// metadata store (`open_salvage`).
    salvage: bool,
    /// Set by `test_hook_repeat_next_tid` (tests of the invariant path
    /// only): the next commit writes its metadata as the TID before its
    /// own.
    pub(crate) repeat_tid: AtomicBool,
    /// Inode number epochs, (first inode number, epoch), for the
    /// generations of file handles (`ops/handles.rs`); set once at open.
    pub(crate) ino_epochs: std::sync::OnceLock<Vec<(u64, u64)>>,
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(FsError::Invalid);
    }
    Ok(())
}

impl Fs {
    /// Opens the filesystem of a pool and finishes what a crash left behind
    /// (the intent log's records, orphaned inodes). No scan of the pool is
    /// needed.
    pub fn open(pool: Pool) -> Result<Arc<Fs>> {
        Fs::open_adopting(pool, &[])
    }

    /// `open` for a daemon that takes a mount over from the one before it
    /// (cairn-fuse's handover): `refs` are the lookup references the
    /// kernel still holds, (inode, count), so that an inode unlinked while
    /// open stays until the kernel forgets it instead of being removed as
    /// a crash's orphan.
    pub fn open_adopting(pool: Pool, refs: &[(u64, u64)]) -> Result<Arc<Fs>> {
        if pool.lost.read_only {
            return Fs::open_lost(pool);
        }
        let mut fs = Fs::with_pool(pool)?;
        let logged = fs.open_intent_log()?;
        let fs = Arc::new(fs);
        fs.refresh_retained()?;
        fs.load_tick_chunks(&logged)?;
        if !logged.is_empty() {
            fs.replay_left_intent(&logged)?;
        }
        fs.adopt_kernel_refs(refs);
        fs.remove_orphans()?;
        // A mirror's inode numbers are its source's: no epochs of its own.
        let mirror = fs.mirror_role().is_ok_and(|r| r.is_mirror());
        fs.load_ino_epochs(!mirror)?;
        Ok(fs)
    }

    /// Opens, read-only, a pool whose missing devices held the only copy
    /// of some data (`cairn mount --degraded`): nothing is written, so the
    /// intent log (if a crash left one) waits for a mount with every
    /// device, and so do orphaned inodes.
    fn open_lost(pool: Pool) -> Result<Arc<Fs>> {
        let fs = Arc::new(Fs::with_pool(pool)?);
        fs.refresh_retained()?;
        fs.load_ino_epochs(false)?;
        Ok(fs)
    }

    /// Opens the filesystem of a pool opened for salvage
    /// (`maintenance::salvage::open_salvage_pool`) to be mounted read-only:
    /// no intent log, no orphan removal, nothing committed. Counters and
    /// snapshots that cannot be read are logged and done without.
    pub fn open_salvage(pool: Pool) -> Result<Arc<Fs>> {
        let r = pool.meta.read()?;
        let counter = |name: &str| {
            r.counter(name).unwrap_or_else(|e| {
                tracing::warn!("salvage: counter {name} cannot be read: {e}");
                0
            })
        };
        let (next_ino, last_tid) = (counter(cairn_meta::tables::NEXT_INO), counter("last_tid"));
        let root = ElemKey::new(crate::types::ROOT_INO, RecordType::Inode, &[]);
        let why = match r.get(&root) {
            Ok(Some(_)) => None,
            Ok(None) => Some("missing".to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = why {
            return Err(FsError::Io(format!(
                "salvage: the root directory's inode cannot be read ({why}): nothing can be \
                 served; `cairn salvage POOL --rebuild` puts what it finds under lost+found"
            )));
        }
        drop(r);
        let mut fs = Fs::with_counters(pool, next_ino, last_tid);
        fs.salvage = true;
        let fs = Arc::new(fs);
        if let Err(e) = fs.refresh_retained() {
            tracing::warn!("salvage: the snapshot table cannot be read: {e}");
        }
        Ok(fs)
    }

    /// True when mounted for salvage (`open_salvage`) or a mirror: every
    /// change is refused (a read-only mount).
    pub fn read_only(&self) -> bool {
        self.salvage || self.pool.lost.read_only || self.mirror_role().is_ok_and(|r| r.is_mirror())
    }

    /// The in-memory state of a pool just opened: nothing buffered yet.
    fn with_pool(pool: Pool) -> Result<Fs> {
        let r = pool.meta.read()?;
        let next_ino = r.counter(cairn_meta::tables::NEXT_INO)?;
        let last_tid = r.counter("last_tid")?;
        drop(r);
        Ok(Fs::with_counters(pool, next_ino, last_tid))
    }

    /// `with_pool` with the counters read.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a dirty limit in bytes from a MiB count; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn with_counters(pool: Pool, next_ino: u64, last_tid: u64) -> Fs {
        let record = pool.record_size();
        let recent = crate::writeback::recent::RecentBlocks::new(
            (pool.config.dirty_limit_mib << 20) as usize / 2,
        );
        let reserve =
            crate::pool::reserve::Reserve::open(&crate::pool::PoolPaths::meta(&pool.path));
        let holds = crate::replica::holds::Holds::load(&pool.path);
        let background = crate::background::Background::new(pool.config.background_nice);
        Fs {
            pool,
            salvage: false,
            shards: (0..crate::state::SHARDS)
                .map(|_| Mutex::new(Default::default()))
                .collect(),
            flushing: Default::default(),
            load: Default::default(),
            next_ino: next_ino.into(),
            live_delta: Default::default(),
            flush_lock: Mutex::new(last_tid),
            sealed: Mutex::new(std::collections::VecDeque::new()),
            sealed_error: Mutex::new(None),
            failed: Mutex::new(None),
            must_commit: AtomicBool::new(false),
            kick: Condvar::new(),
            kick_lock: Mutex::new(false),
            stop_wake: Condvar::new(),
            stop_lock: Mutex::new(()),
            resilver_lock: Mutex::new(()),
            stripes_warned: Default::default(),
            stopping: AtomicBool::new(false),
            record,
            retained: parking_lot::RwLock::new(Vec::new()),
            hashing: AtomicBool::new(false),
            ns_read: Mutex::new(None),
            recent,
            ticks: Default::default(),
            reserve,
            stored: Default::default(),
            inode_count: Default::default(),
            intent: None,
            intent_retired: Condvar::new(),
            st_wait: Default::default(),
            flush_wait: Default::default(),
            holds,
            background,
            commit_stats: Default::default(),
            maint_stats: Default::default(),
            writes: Default::default(),
            repeat_tid: AtomicBool::new(false),
            ino_epochs: std::sync::OnceLock::new(),
        }
    }

    /// Applies and commits the intent log records a crash left.
    fn replay_left_intent(&self, logged: &[crate::writeback::log_file::Record]) -> Result<()> {
        tracing::info!(
            "applying {} intent log record(s) left by a crash",
            logged.len()
        );
        self.replay_intent(logged)?;
        // Without room to commit them now (a full host), the changes
        // stay buffered and logged; the flusher tries again.
        match self.flush() {
            Err(e) if e.is_no_space() => {
                tracing::warn!("the intent log's changes wait for space: {e}")
            }
            r => r?,
        }
        if self.ticks.unread_waiting() {
            // Its placeholders must never be read: the pool mounts
            // once the commit took their chunks.
            return Err(FsError::Failed(
                "no room to commit the intent log's replay, which holds blocks whose data \
                 cannot be read (see the log): free space on the host and mount again"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Removes the inodes a crash left unlinked but not yet freed.
    fn remove_orphans(&self) -> Result<()> {
        let orphans = self.meta()?.orphans()?;
        // A mirror's orphans are its source's (still open there): they go
        // when the source's stream ends them, never by a commit here.
        if !orphans.is_empty() && !self.mirror_role()?.is_mirror() {
            let mut st = self.lock_all();
            let (mut removed, mut kept) = (0, 0);
            for ino in orphans {
                // Still open through a mount taken over: kept (refs.rs).
                if Self::referenced(&st, ino) {
                    st.sh_mut(ino).unlinked.insert(ino);
                    kept += 1;
                    continue;
                }
                st.dirty(ino).delete_inode(ino);
                removed += 1;
            }
            drop(st);
            tracing::info!(
                "removed {removed} orphaned inode(s) left by a crash or an unmount; kept {kept} \
                 still open through the mount taken over"
            );
            self.flush()?;
        }
        Ok(())
    }

    /// How names sit in this pool's metadata keys.
    pub fn names(&self) -> &crate::names::Names {
        &self.pool.names
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn record_size(&self) -> u64 {
        self.record
    }

    /// Takes the flush lock (one flush, clone or maintenance commit at a
    /// time; it holds the last committed TID). Changes a snapshot cut
    /// sealed are committed first, so that the holder finds every change
    /// not committed in the dirty overlays, as without a cut.
    pub(crate) fn flush_guard(&self) -> Ranked<MutexGuard<'_, u64>> {
        if self.flush_lock.is_locked() {
            // Probably a background commit: at full speed while we wait.
            self.background.boost();
        }
        let mut g = Ranked::acquire(Rank::FLUSH, || self.flush_wait.lock(&self.flush_lock));
        // One after the other: a snapshot logged on top of the one being
        // committed may join the queue until that commit is retired.
        while !self.sealed.lock().is_empty() && self.commit_sealed(&mut g) {}
        g
    }

    /// How often and how long operations waited for the shared locks.
    pub fn lock_stats(&self) -> Vec<crate::contention::LockStats> {
        vec![
            self.st_wait.stats("state shards"),
            self.flush_wait.stats("flush"),
        ]
    }

    /// For operations that add data: ENOSPC while the pool is short of
    /// space (see `reserve.rs`), unless the space came back.
    pub(crate) fn check_room(&self) -> Result<()> {
        self.check_ok()?;
        if self.reserve.is_short() && !self.reserve.recover() {
            return Err(FsError::NoSpace);
        }
        Ok(())
    }

    /// Why the pool refuses data writes (short of space) or runs without
    /// a metadata reserve, for `info`; None when neither.
    pub fn space_status(&self) -> Option<String> {
        self.reserve.status()
    }

    pub(crate) fn check_ok(&self) -> Result<()> {
        match &*self.failed.lock() {
            Some(why) => Err(FsError::Failed(why.clone())),
            None => Ok(()),
        }
    }

    pub(crate) fn meta(&self) -> Result<MetaRead> {
        Ok(self.pool.meta.read()?)
    }

    /// The committed metadata under the overlays, for inodes, directory
    /// entries, symlinks and xattrs (the caller holds the state lock: `_st`).
    /// The view is shared until the next flush commits: live elements of
    /// those kinds change only in flush commits, and a commit drops the view
    /// in the same state-lock section that retires its `flushing` overlay,
    /// so a lookup never sees a view older than the overlays assume. Also
    /// for the extents of a read (`read_into`): GC and reblock move chunks
    /// between flushes, so a chunk record from this view may be out of
    /// date; the read then fails its checks and `with_chunk` retries
    /// through a fresh view.
    pub(crate) fn ns_meta(&self, _st: &State) -> Result<Arc<MetaRead>> {
        let mut c = self.ns_read.lock();
        if let Some(r) = &*c {
            return Ok(r.clone());
        }
        let r = Arc::new(self.meta()?);
        *c = Some(r.clone());
        Ok(r)
    }

    /// Forgets the shared view; the next lookup opens a new one.
    pub(crate) fn drop_ns_meta(&self) {
        *self.ns_read.lock() = None;
    }

    /// The current inode: overlays first, then committed metadata.
    pub(crate) fn inode(&self, st: &State, ino: u64) -> Result<Inode> {
        self.inode_and_tid(st, ino).map(|(i, _)| i)
    }

    /// The inode, and the create TID of its committed element when it was
    /// read from the store (None: an overlay holds a newer one).
    pub(crate) fn inode_and_tid(&self, st: &State, ino: u64) -> Result<(Inode, Option<u64>)> {
        st.need(ino)?;
        let from = |o: &Overlay| o.inodes.get(&ino).cloned();
        let found = st.newest(ino, from);
        match found {
            Some(Some(i)) => Ok((i, None)),
            Some(None) => Err(FsError::NotFound),
            None => {
                let e = (self.ns_meta(st)?)
                    .get_of_inode(&ElemKey::new(ino, RecordType::Inode, &[]))?
                    .ok_or(FsError::NotFound)?;
                Ok((Inode::decode(ino, &e.payload)?, Some(e.create_tid)))
            }
        }
    }

    pub(crate) fn dir_inode(&self, st: &State, ino: u64) -> Result<Inode> {
        let i = self.inode(st, ino)?;
        if i.kind != FileKind::Dir {
            return Err(FsError::NotDir);
        }
        Ok(i)
    }

    /// The entry `name` of directory `dir`, if any.
    pub(crate) fn dirent(&self, st: &State, dir: u64, name: &[u8]) -> Result<Option<DirEnt>> {
        self.dirent_keyed(st, dir, name).map(|(_, e)| e)
    }

    /// The entry `name` of directory `dir`, if any, and its subkey (for a
    /// change of the entry that follows: a name is hashed, and in an
    /// encrypted pool sealed, once).
    pub(crate) fn dirent_keyed(
        &self,
        st: &State,
        dir: u64,
        name: &[u8],
    ) -> Result<(DirKey, Option<DirEnt>)> {
        if name.len() > MAX_NAME {
            return Err(FsError::NameTooLong);
        }
        st.need(dir)?;
        let sk = DirKey::new(self.names().dirent_subkey(dir, name));
        let e = self.dirent_at(st, dir, &sk)?;
        Ok((sk, e))
    }

    /// The entry of directory `dir` with subkey `sk`, if any.
    fn dirent_at(&self, st: &State, dir: u64, sk: &DirKey) -> Result<Option<DirEnt>> {
        let from = |o: &Overlay| o.dirents.get(&dir).and_then(|m| m.get(sk)).cloned();
        if let Some(e) = st.newest(dir, from) {
            return Ok(e);
        }
        let e = (self.ns_meta(st)?).get_of_inode(&ElemKey::new(
            dir,
            RecordType::DirEntry,
            sk.as_bytes(),
        ))?;
        e.map(|e| DirEnt::decode(&e.payload)).transpose()
    }

    pub(crate) fn symlink_target(&self, st: &State, ino: u64) -> Result<Vec<u8>> {
        st.need(ino)?;
        let from = |o: &Overlay| o.symlinks.get(&ino).cloned();
        if let Some(t) = st.newest(ino, from) {
            return Ok(t);
        }
        let e = self
            .ns_meta(st)?
            .get(&ElemKey::new(ino, RecordType::Symlink, &[]))?;
        e.map(|e| e.payload).ok_or(FsError::Invalid)
    }

    pub(crate) fn xattr(&self, st: &State, ino: u64, name: &[u8]) -> Result<Option<Vec<u8>>> {
        st.need(ino)?;
        let from = |o: &Overlay| o.xattrs.get(&ino).and_then(|m| m.get(name)).cloned();
        if let Some(v) = st.newest(ino, from) {
            return Ok(v);
        }
        let e = (self.ns_meta(st)?).get_of_inode(&self.names().xattr_key(ino, name))?;
        Ok(e.map(|e| e.payload))
    }

    /// Names of all xattrs of an inode (committed merged with overlays).
    pub(crate) fn xattr_names(&self, st: &State, ino: u64) -> Result<Vec<Vec<u8>>> {
        st.need(ino)?;
        let prefix = ElemKey::prefix(ino, RecordType::Xattr);
        let mut m = std::collections::BTreeMap::new();
        for e in (self.ns_meta(st)?).scan_of_inode(ino, &prefix, None, usize::MAX)? {
            let name = self.names().xattr_name(ino, e.key.sub())?;
            m.insert(name.into_owned(), true);
        }
        for o in st.oldest_first(ino) {
            for (k, v) in o.xattrs.get(&ino).into_iter().flatten() {
                m.insert(k.clone(), v.is_some());
            }
        }
        Ok(m.into_iter()
            .filter(|(_, live)| *live)
            .map(|(k, _)| k)
            .collect())
    }

    /// What the overlays say about a block: the dirty one first, then those
    /// being committed, newest first; a patch carries the state below it.
    pub(crate) fn block_state(&self, st: &State, ino: u64, blk: u64) -> BlockState {
        stacked_block(st.newest_first(ino), ino, blk)
    }

    /// The whole bytes of a block in `state` (empty for a hole), reading
    /// the committed block when the state needs it.
    pub(crate) fn resolve(&self, ino: u64, blk: u64, state: BlockState) -> Result<Vec<u8>> {
        match state {
            BlockState::Data(b) => Ok(Arc::try_unwrap(b).unwrap_or_else(|b| (*b).clone())),
            BlockState::Hole => Ok(Vec::new()),
            BlockState::Committed => Ok(self
                .committed_block(&self.meta()?, ino, blk)?
                .unwrap_or_default()),
            BlockState::Patch(p, below) => {
                let mut b = self.resolve(ino, blk, *below)?;
                p.apply(&mut b);
                Ok(b)
            }
        }
    }

    /// Reads a committed block; None if it is a hole.
    pub(crate) fn committed_block(
        &self,
        r: &MetaRead,
        ino: u64,
        blk: u64,
    ) -> Result<Option<Vec<u8>>> {
        match self.committed_extent(r, ino, blk)? {
            Some(ext) => self.read_extent(r, ino, blk, &ext).map(Some),
            None => Ok(None),
        }
    }

    /// The committed extent of a block; None if it is a hole.
    pub(crate) fn committed_extent(
        &self,
        r: &MetaRead,
        ino: u64,
        blk: u64,
    ) -> Result<Option<Extent>> {
        let key = ElemKey::extent(ino, blk);
        match r.get(&key)? {
            Some(e) => Extent::decode(&e.payload).map(Some),
            // A damaged store (salvage) whose creation index was not read
            // whole cannot tell a hole from a record its damage hides.
            None if !r.vouches_for_absence() => Err(MetaError::Corrupt {
                key: key.to_string(),
                why: "no record, and the damaged creation index cannot tell a hole from lost data"
                    .into(),
            }
            .into()),
            None => Ok(None),
        }
    }

    /// The whole valid bytes of a committed block: its base chunk with its
    /// pieces laid over it.
    pub(crate) fn read_extent(
        &self,
        r: &MetaRead,
        ino: u64,
        blk: u64,
        ext: &Extent,
    ) -> Result<Vec<u8>> {
        let mut data = self.with_chunk(r, ino, blk, ext.chunk, |rec| {
            match self.recent.get(&rec.hash) {
                Some(b) if b.len() == rec.raw_len as usize => Ok((*b).clone()),
                _ => self.pool.chunks.read_block(rec),
            }
        })?;
        data.truncate(ext.len as usize);
        if !ext.pieces.is_empty() {
            data.resize(ext.len as usize, 0);
            self.read_pieces(r, ino, blk, ext, 0, &mut data)?;
        }
        Ok(data)
    }

    /// Lays the pieces of `ext` that fall in `dst` (bytes `from..` of the
    /// block) over it, each read from its chunk.
    pub(crate) fn read_pieces(
        &self,
        r: &MetaRead,
        ino: u64,
        blk: u64,
        ext: &Extent,
        from: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let end = from + dst.len();
        for p in &ext.pieces {
            let (lo, hi) = ((p.off as usize).max(from), (p.off + p.len) as usize);
            let hi = hi.min(end);
            if lo >= hi {
                continue;
            }
            let at = p.from as usize + (lo - p.off as usize);
            let part = &mut dst[lo - from..hi - from];
            self.with_chunk(r, ino, blk, p.chunk, |rec| {
                self.pool.chunks.read_part_into(rec, at, part)
            })?;
        }
        Ok(())
    }

    /// Runs a chunk read; when it fails, reads the chunk's record once more
    /// (reblock may have moved it after `r` was taken) and retries there
    /// before calling the chunk damaged (EIO, logged with file and offset).
    pub(crate) fn with_chunk<T>(
        &self,
        r: &MetaRead,
        ino: u64,
        blk: u64,
        chunk: u64,
        mut read: impl FnMut(&ChunkRec) -> std::result::Result<T, cairn_data::DataError>,
    ) -> Result<T> {
        let offset = blk * self.record;
        let raw = r.chunk(chunk)?.ok_or_else(|| {
            FsError::Io(format!(
                "inode {ino} offset {offset}: extent names missing chunk {chunk}"
            ))
        })?;
        let rec = ChunkRec::decode(&raw)?;
        let mut res = read(&rec);
        if res.is_err() {
            if let Some(now) = self.meta()?.chunk(chunk)? {
                let now = ChunkRec::decode(&now)?;
                if (now.segment, now.offset) != (rec.segment, rec.offset) {
                    res = read(&now);
                }
            }
        }
        res.map_err(|e| {
            tracing::error!("read error: inode {ino} offset {offset}: {e}");
            FsError::Io(format!("inode {ino} offset {offset}: {e}"))
        })
    }

    /// Background flusher: commits every interval, or sooner when kicked.
    pub fn spawn_flusher(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        let fs = self.clone();
        std::thread::Builder::new()
            .name("cairn-flush".into())
            .spawn(move || fs.flusher_loop())
            .expect("spawn flusher")
    }

    fn flusher_loop(&self) {
        let bg = self.background.enter("flusher");
        let c = &self.pool.config;
        let interval = Duration::from_secs_f64(c.commit_interval_secs);
        let tree = Duration::from_secs_f64(c.tree_commit_secs);
        let ticks = self.ticks_on();
        while !self.stopping.load(Ordering::SeqCst) {
            let kicked = {
                let mut k = self.kick_lock.lock();
                if !*k && !self.ticks.asked() {
                    self.kick.wait_for(&mut k, interval);
                }
                std::mem::replace(&mut *k, false)
            };
            self.ticks.take_asked();
            // Bounds how long the shared view pins old pages of the store
            // when nothing is flushed (GC and the mover still commit).
            self.drop_ns_meta();
            bg.lower();
            // A kick wants a commit (the dirty limit, a full log, a
            // snapshot); the interval alone, a tick unless the tree is due.
            let r = match ticks && !kicked && !self.ticks.tree_due(tree) {
                true => self.tick(),
                false => self.flush(),
            };
            if let Err(e) = r {
                tracing::error!("background flush failed: {e}");
            }
        }
    }

    /// Sleeps `d`, or less when the filesystem stops meanwhile: the
    /// background threads' pause between rounds, so that a shutdown (an
    /// unmount, a restart under the mount) does not wait out their sleep.
    pub(crate) fn nap(&self, d: std::time::Duration) {
        let mut g = self.stop_lock.lock();
        if !self.stopping.load(Ordering::SeqCst) {
            self.stop_wake.wait_for(&mut g, d);
        }
    }

    pub(crate) fn kick_flusher(&self) {
        *self.kick_lock.lock() = true;
        self.kick.notify_one();
    }

    /// Whether the flusher ticks between tree commits (`tick.rs`): the
    /// pool has an intent log and commits its tree less often than its
    /// commit interval.
    pub(crate) fn ticks_on(&self) -> bool {
        let c = &self.pool.config;
        self.intent.is_some() && c.tree_commit_secs > c.commit_interval_secs
    }

    /// Wakes the flusher for a tick (`Ticks::wants_tick`), not a commit.
    pub(crate) fn ask_tick(&self) {
        let _k = self.kick_lock.lock();
        self.kick.notify_one();
    }

    /// Flushes and stops the background flusher.
    pub fn shutdown(&self) -> Result<()> {
        {
            let _g = self.stop_lock.lock();
            self.stopping.store(true, Ordering::SeqCst);
            self.stop_wake.notify_all();
        }
        self.kick_flusher();
        let r = self.flush();
        if let Err(e) = self.make_all_live_debts() {
            tracing::warn!("making the waiting live reference decrements: {e}");
        }
        if let Err(e) = self.pool.meta.drain() {
            tracing::warn!(
                "writing the waiting dedup index entries and creation index removals: {e}"
            );
        }
        let path = crate::pool::PoolPaths::heat(&self.pool.path);
        if let Err(e) = self.pool.chunks.heat.save(&path) {
            tracing::warn!("saving heat table: {e}");
        }
        if let Some(c) = self.pool.chunks.ssd_cache() {
            let path = crate::pool::PoolPaths::ssd_index(&self.pool.path);
            if let Err(e) = c.save(&path) {
                tracing::warn!("saving the SSD cache index: {e}");
            }
        }
        r
    }

    pub(crate) fn now() -> Time {
        Time::now()
    }
}

/// What `layers` (newest first) say about a block: the first that knows
/// it, with the state of those below under a patch.
fn stacked_block<'o>(
    mut layers: impl Iterator<Item = &'o Overlay>,
    ino: u64,
    blk: u64,
) -> BlockState {
    let Some(top) = layers.next() else {
        return BlockState::Committed;
    };
    match top.block(ino, blk) {
        Some(BlockState::Patch(p, _)) => {
            BlockState::Patch(p, Box::new(stacked_block(layers, ino, blk)))
        }
        Some(s) => s,
        None => stacked_block(layers, ino, blk),
    }
}
