//! Fast fsync (ZFS's ZIL, EPRD's barriers): instead of a whole flush and
//! metadata commit, fsync writes what changed since the last fsync (the
//! overlay's `unlogged` keys with their current values and the changed
//! byte ranges of blocks) as one record of the intent log and syncs it: one
//! device write and one cache flush. The next flush commits the same
//! changes and retires the log. At open, the records on top of the last
//! commit are applied to the overlay again and committed.
//!
//! What fsync promises is unchanged, and stronger than POSIX asks: after an
//! fsync returns, a crash keeps every change made before it, in every file
//! (a record holds all that changed, not only the file's). Concurrent
//! fsyncs share records (group commit): each drains everything pending.

use crate::error::{FsError, Result};
use crate::history::snapshot::{Snapshot, SnapshotKind};
use crate::lock_rank::{Rank, Ranked, RankedMutex};
use crate::types::DirEnt;
use crate::vfs::{Fs, State};
use crate::writeback::committing::Committing;
use crate::writeback::flush::Sealed;
use crate::writeback::intent_record::{self as rec, put_bytes, put_opt, put_u32, put_u64};
use crate::writeback::intent_record::{Entry, T_BLOCK, T_DELETE, T_DIRENT, T_INODE, T_ORPHAN};
use crate::writeback::intent_record::{T_PATCH, T_SYMLINK, T_TRUNC, T_XATTR};
use crate::writeback::log_file::{Damage, LogError, LogFile, OnDamage, Place, Record};
use crate::writeback::overlay::{DirKey, Overlay, Unlogged};
use crate::writeback::patch::Patch;
use crate::writeback::tick::Marks;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Changes beyond this many block bytes are committed by a flush instead:
/// logging them would write the data twice for no gain. Not for a
/// snapshot: its record may fill what its region has left (see
/// `snapshot_fits`), because waiting for a commit of that much takes far
/// longer than writing it to the log (4 KiB random writes: about 40 us of
/// commit per block, against 0.3 ms per MiB of log).
pub(crate) const MAX_RECORD_DATA: u64 = 8 << 20;

/// Bytes a snapshot record is assumed to need per change besides the
/// block bytes (keys, inodes, names), when it is checked against the room
/// of the log; a record that turns out larger is refused (`LogError::Full`)
/// and the snapshot is committed instead.
const RECORD_BYTES_PER_CHANGE: u64 = 512;

impl Fs {
    /// Makes every change made so far durable: through the intent log when
    /// the pool has one and the changes are small, else by a flush. A
    /// commit under way does not hold it up: its changes that no record
    /// holds yet go in this record too (`LogFile::seal`).
    pub fn fsync(&self, _ino: u64) -> Result<()> {
        self.check_ok()?;
        let _busy = self.writes.begin();
        self.log_changes()
    }

    /// The work of `fsync`, also a tick's last step (`tick.rs`), which is
    /// no client write for the tier mover.
    pub(crate) fn log_changes(&self) -> Result<()> {
        let Some(log) = &self.intent else {
            return self.flush();
        };
        if self.must_commit.load(Ordering::SeqCst) {
            return self.flush();
        }
        // The log before the shards (the lock order: docs/writeback-and-intent-log.md).
        let mut lg = log.lock();
        while lg.waits_for_commit() {
            // A snapshot ended the region during a commit: the next record
            // goes to the other region once that commit frees it, which is
            // sooner than a flush of our own after it and the snapshot's.
            let waited = self
                .intent_retired
                .wait_for(&mut lg.guard, Duration::from_millis(20));
            self.check_ok()?;
            if waited.timed_out() && lg.waits_for_commit() && !self.flush_lock.is_locked() {
                // No commit under way to wait for (no flusher runs, as in
                // a pool a command opened): the sealed changes are
                // committed here (the flush lock before the log's).
                drop(lg);
                drop(self.flush_guard());
                lg = log.lock();
            }
        }
        // A logged snapshot whose commit just failed stops the filesystem:
        // nothing may be logged after it (see `snapshot_logged`).
        self.check_ok()?;
        if lg.refuses_records() || self.must_commit.load(Ordering::SeqCst) {
            drop(lg);
            return self.flush();
        }
        let mut rec = lg.record_buffer();
        // Every shard: the record is a consistent cut of all changes.
        let mut st = self.lock_all();
        let owed = owed(&lg, &st.flushing);
        let quiet = owed.is_none() && st.shards().all(|s| s.dirty.unlogged.is_empty());
        // Large changes, or a host filesystem without room for the metadata
        // of the commit that must follow: a flush (which spends the reserve
        // or answers ENOSPC, see `flush.rs`).
        if quiet || !self.fits_a_record(&st, owed.as_deref(), MAX_RECORD_DATA) {
            drop(st);
            lg.recycle(rec);
            drop(lg);
            return if quiet { Ok(()) } else { self.flush() };
        }
        encode_pending(&mut st, owed.as_deref(), &self.ticks.marks(), &mut rec);
        let next_ino = self.next_ino();
        drop(st);
        match lg.append_record(next_ino, rec) {
            Ok(()) => {
                lg.settle_sealed();
                if lg.used() > lg.capacity() / 4 * 3 {
                    // Seal before the region fills: a full one makes fsync
                    // wait for a commit. Not much sooner: each seal is a
                    // commit, which takes CPU from the requests.
                    self.kick_flusher();
                }
                Ok(())
            }
            Err(e) => {
                if !matches!(e, LogError::Full) {
                    tracing::warn!("{e}; committing instead");
                }
                drop(lg);
                self.flush()
            }
        }
    }

    /// Whether an fsync now would most likely be one intent-log write: the
    /// pool has a log that is not broken and no other fsync is writing to,
    /// nothing forces a commit, and the dirty data (with what a commit
    /// under way has that no record holds) fits a record (a larger fsync
    /// commits). A hint for who serves the fsync (the FUSE ring thread
    /// itself, or a worker): the changes to log may still turn out larger
    /// than the dirty data (overwrites of a block being committed), and the
    /// fsync then commits those 8 MiB at most.
    pub fn fsync_is_quick(&self) -> bool {
        let Some(log) = &self.intent else {
            return false;
        };
        if self.must_commit.load(Ordering::Relaxed) {
            return false;
        }
        let Some(lg) = log.try_lock() else {
            return false;
        };
        let owed = owed(&lg, &self.flushing.read()).map_or(0, |o| o.unlogged.bytes);
        !lg.refuses_records() && self.load.bytes() + owed <= MAX_RECORD_DATA
    }

    /// Whether the changes not yet logged (of every shard, and `owed` of
    /// the overlay being committed) fit one record of at most `max` bytes
    /// (`MAX_RECORD_DATA` of block bytes for fsync; a snapshot's counts
    /// `RECORD_BYTES_PER_CHANGE` more per change) and the host filesystem
    /// has room for the commit that must follow (call with every shard
    /// locked).
    fn fits_a_record(&self, st: &State, owed: Option<&Overlay>, max: u64) -> bool {
        let bytes = st.unlogged_bytes() + owed.map_or(0, |o| o.unlogged.bytes);
        let changes = st
            .shards()
            .map(|s| crate::writeback::flush::change_count(&s.dirty))
            .sum();
        bytes <= max && self.commit_fits(changes)
    }

    /// Whether the host filesystem has room for the metadata of committing
    /// `changes` elements: the room is allocated now, for the flush that
    /// follows.
    fn commit_fits(&self, changes: u64) -> bool {
        let need = self.reserve.headroom(changes);
        !matches!(
            self.pool.meta.ensure_headroom(need),
            Err(cairn_meta::MetaError::NoRoom(_))
        )
    }

    /// Opens the intent log and returns the records a crash left on top of
    /// the last commit, for `replay_intent`. Without a log file (the host
    /// filesystem is full, say), fsync flushes.
    pub(crate) fn open_intent_log(&mut self) -> Result<Vec<Record>> {
        let path = crate::pool::PoolPaths::intent(&self.pool.path);
        let last = *self.flush_lock.get_mut();
        let size = self.pool.config.intent_log_mib << 20;
        let floor = self.intent_floor(last)?;
        let on_damage = match self.pool.config.discard_damaged_log {
            true => OnDamage::Discard,
            false => OnDamage::Refuse,
        };
        let storage = &*self.pool.storage;
        let uuid = self.pool.sb.uuid;
        let on_devices = !self.pool.log_devices.is_empty();
        let opened = match self.log_places()? {
            None => LogFile::open_with(&path, uuid, last, storage, size, on_damage),
            Some(places) if places.is_empty() => return self.no_log_device(on_damage),
            Some(places) => LogFile::open_places(places, uuid, last, on_damage),
        };
        match opened {
            Ok((mut log, recs)) => {
                let mut recs = self.opened_records(&mut log, recs)?;
                let t = self.pool.config.io_timeout_secs;
                log.timeout = (t > 0).then(|| std::time::Duration::from_secs(t));
                if let Some(d) = &log.discarded {
                    tracing::error!(
                        "{d}; --discard-damaged-log: replaying the {} record(s) before it and \
                         dropping it and the {} after it",
                        d.first_lost,
                        d.after.len()
                    );
                }
                // Held by the last commit (a retry, see `LogFile::taken_back`).
                recs.retain(|(h, _)| h.base_tid != last || h.seq >= floor);
                self.intent = Some(RankedMutex::new(Rank::INTENT, log));
                let next = self.next_ino.get_mut();
                for (h, _) in &recs {
                    *next = (*next).max(h.next_ino);
                }
                Ok(recs)
            }
            Err(LogError::Damaged(d)) => Err(FsError::DamagedLog(self.refusal(&d))),
            Err(e)
                if (on_devices || path_holds_records(&path)) && on_damage == OnDamage::Refuse =>
            {
                Err(FsError::DamagedLog(format!(
                    "{e}; the intent log may hold fsync'd changes that are not committed. \
                     Mount with --discard-damaged-log to mount without them (the log is made \
                     again)"
                )))
            }
            Err(e) => {
                tracing::warn!("{e}: fsync commits instead of logging");
                Ok(Vec::new())
            }
        }
    }

    /// An encrypted pool's records with their payloads opened, and its log
    /// made to seal new ones. A record that fails authentication (its
    /// checksum holds: changed by someone, not by damage) refuses the
    /// mount as damage does, or with --discard-damaged-log ends the
    /// records replayed.
    fn opened_records(&self, log: &mut LogFile, recs: Vec<Record>) -> Result<Vec<Record>> {
        let Some(keys) = &self.pool.keys else {
            return Ok(recs);
        };
        log.cipher = Some(keys.log.clone());
        let mut out = Vec::with_capacity(recs.len());
        for (h, p) in recs {
            let Ok(plain) = keys
                .log
                .open(&crate::writeback::log_file::record_aad(&h), &p)
            else {
                let why = format!("intent log: record {} (on TID {}) fails authentication: its bytes were changed, or it belongs elsewhere", h.seq, h.base_tid);
                if self.pool.config.discard_damaged_log {
                    tracing::error!("{why}; --discard-damaged-log: replaying the {} record(s) before it and dropping the rest", out.len());
                    break;
                }
                return Err(FsError::DamagedLog(format!("{why}. Nothing was changed. Mount with --discard-damaged-log to replay the records before it and drop the rest")));
            };
            out.push((h, plain));
        }
        Ok(out)
    }

    /// The copies of a log kept on devices (`Pool::log_devices`), those
    /// of the devices online; None for a log in the pool directory.
    fn log_places(&self) -> Result<Option<Vec<Place>>> {
        if self.pool.log_devices.is_empty() {
            return Ok(None);
        }
        let set = self.pool.chunks.devices();
        let mut places = Vec::new();
        for &id in &self.pool.log_devices {
            let dev = set.device(id)?;
            match dev.log_area().filter(|_| set.is_online(id)) {
                Some(io) => places.push(Place {
                    name: dev.path.clone(),
                    io,
                    shared: true,
                }),
                None => tracing::warn!(
                    "intent log: the copy on device {id} ({}) is missing; the log is read from \
                     and written to its other copies",
                    dev.path.display()
                ),
            }
        }
        Ok(Some(places))
    }

    /// Every device holding a copy of the log is missing: refused, since
    /// fsync'd changes may be there, unless told to go on without them
    /// (then fsync commits).
    fn no_log_device(&mut self, on_damage: OnDamage) -> Result<Vec<Record>> {
        if on_damage == OnDamage::Refuse {
            return Err(FsError::DamagedLog(format!(
                "every device holding a copy of the intent log (devices {:?}) is missing: \
                 fsync'd changes not yet committed may be there. Bring one back, or mount with \
                 --discard-damaged-log to mount without them",
                self.pool.log_devices
            )));
        }
        tracing::error!(
            "--discard-damaged-log: every device holding a copy of the intent log is missing; \
             mounting without its records, and fsync commits instead of logging"
        );
        Ok(Vec::new())
    }

    /// Why a mount refuses a damaged log, what would be lost and how to go
    /// on.
    fn refusal(&self, d: &Damage) -> String {
        let paths = self
            .meta()
            .and_then(|r| crate::maintenance::check::live_paths(&r, self.names()));
        let paths = paths.unwrap_or_default();
        // An encrypted log's records are read for their names opened.
        let opened = |recs: &[Record]| match &self.pool.keys {
            Some(k) => {
                crate::writeback::log_file::open_records(&k.log, recs.to_vec()).unwrap_or_default()
            }
            None => recs.to_vec(),
        };
        let d = &Damage {
            path: d.path.clone(),
            region: d.region,
            base_tid: d.base_tid,
            first_lost: d.first_lost,
            before: opened(&d.before),
            after: opened(&d.after),
        };
        format!(
            "{d}. Applying the records before it alone would lose the fsync'd changes of \
             record {} (unreadable) and of those after it, which touch {}. Nothing was \
             changed. To see the pool as last committed, read-only and without the log: \
             `cairn mount {pool} MNT --salvage`. To mount it replaying the records before the \
             damage and dropping the rest: `cairn mount {pool} MNT --discard-damaged-log` \
             (keep a copy of {} first if the lost changes matter)",
            d.first_lost,
            touched(d, self.record, &paths, self.names()),
            d.path.display(),
            pool = self.pool.path.display()
        )
    }

    /// How many of the first intent records on top of `last` (the last
    /// committed TID) its commit holds: 0 unless it was a retry.
    fn intent_floor(&self, last: u64) -> Result<u64> {
        use crate::writeback::flush::{INTENT_FLOOR, INTENT_FLOOR_TID};
        let r = self.meta()?;
        Ok(match r.counter(INTENT_FLOOR_TID)? == last {
            true => r.counter(INTENT_FLOOR)?,
            false => 0,
        })
    }

    /// Applies intent records (in order) to the dirty overlay. A record
    /// that ends with a snapshot is committed with it at once, as the next
    /// TID: the records after it are on top of that TID (a record region
    /// ends with a snapshot, see `snapshot_logged`). Records after it on
    /// the same TID (a version 1 log whose snapshot commit failed) are
    /// logged again on top of that commit first. Records on a TID the
    /// crash left uncommitted (written during its commit) come after what
    /// that TID held (the records before them, if any): that is committed
    /// first, as the TID it was, so that a snapshot among them is
    /// committed as the TID it was given (the next region starts on it,
    /// see `snapshot_during_commit`).
    pub(crate) fn replay_intent(&self, records: &[Record]) -> Result<()> {
        let mut lifted = None;
        for (i, (head, rec)) in records.iter().enumerate() {
            if head.base_tid > self.last_tid() && lifted != Some(head.base_tid) {
                // Once: a commit that fails for space leaves it buffered.
                lifted = Some(head.base_tid);
                self.commit_replayed(Vec::new())?;
            }
            let snaps = self.apply_record(&mut self.lock_all(), rec)?;
            if snaps.is_empty() {
                continue;
            }
            let last = self.commit_replayed(snaps)?;
            let same_base = records[i + 1..]
                .iter()
                .take_while(|r| r.0.base_tid == head.base_tid);
            if let Some(log) = &self.intent {
                for (h, later) in same_base {
                    // Failing that, they are still applied below and
                    // committed by the flush that ends the replay.
                    if let Err(e) = log.lock().append(h.next_ino, later) {
                        tracing::warn!("logging a replayed record again on {last}: {e}");
                    }
                }
            }
        }
        Ok(())
    }

    /// Commits the changes applied so far with `snaps` (a logged
    /// snapshot, if any) as the next TID; returns it. Without a snapshot,
    /// a commit that fails for space leaves them buffered, for the flush
    /// that ends the replay.
    fn commit_replayed(&self, snaps: Vec<Snapshot>) -> Result<u64> {
        let mut last = self.flush_guard();
        let tid = *last + 1;
        let snaps: Vec<Snapshot> = snaps.into_iter().map(|s| Snapshot { tid, ..s }).collect();
        let mut lg = self.log_guard();
        let ov = self.seal(&mut self.lock_all(), lg.as_deref_mut(), tid);
        drop(lg);
        self.sealed.lock().push_back(Sealed {
            ov,
            next_ino: self.next_ino(),
            logged: !snaps.is_empty(),
            snaps,
        });
        self.commit_sealed(&mut last);
        drop(last);
        self.check_ok()?;
        Ok(tid)
    }

    /// A durable snapshot that costs one log write and one cache flush
    /// instead of a commit: the changes not yet logged and the snapshot go
    /// in one intent record, and the changes are sealed as the next TID
    /// (as a cut, `snapshot_cut`), which the flusher commits with the
    /// snapshot later. The record is the last of its region: later ones go
    /// on top of the snapshot's TID. After a crash, the replay commits the
    /// records up to this one as that TID, with the snapshot
    /// (`replay_intent`).
    ///
    /// None when the log cannot take it, nothing having changed: no log,
    /// nothing buffered, changes too large for a record, no room to commit
    /// them for sure (the commit of a logged snapshot must not fail for
    /// space: a failed one stops the filesystem, see `commit_sealed`).
    pub(crate) fn snapshot_logged(
        &self,
        name: &str,
        kind: SnapshotKind,
    ) -> Result<Option<Snapshot>> {
        let Some(log) = &self.intent else {
            return Ok(None);
        };
        if self.must_commit.load(Ordering::SeqCst) {
            return Ok(None);
        }
        // A commit under way, or a logged snapshot waiting for its own:
        // logged on top of it rather than after it.
        if self.flush_lock.is_locked() || !self.sealed.lock().is_empty() {
            if let Some(snap) = self.snapshot_during_commit(log, name, kind)? {
                return Ok(Some(snap));
            }
        }
        let logged = match self.snapshot_during_tick(log, name, kind)? {
            Some(logged) => Some(logged),
            None => {
                let last = self.flush_guard();
                // Holding the flush lock, after `commit_sealed`: no commit is
                // under way, so every change not logged is in the dirty
                // overlays.
                self.log_snapshot_on(log, name, kind, *last, |_| true)?
            }
        };
        match logged {
            Some((snap, logged)) => self.logged_or_committed(snap, logged),
            None => Ok(None),
        }
    }

    /// `snapshot_logged` while a tick stores blocks ahead of the commit
    /// (`tick.rs`), without waiting for its pass (tens of milliseconds):
    /// the pass holds the flush lock, so no commit runs, as if this held
    /// it, and it lets go of it only after `Ticks::storing_on` says so
    /// under every shard lock, which this holds while it seals. Blocks the
    /// pass stores after the seal are no longer in the dirty overlays: it
    /// leaves their chunks loose, and the snapshot's commit writes them.
    /// None when no pass runs, else as `log_snapshot_on`.
    fn snapshot_during_tick(
        &self,
        log: &RankedMutex<LogFile>,
        name: &str,
        kind: SnapshotKind,
    ) -> Result<Option<(Snapshot, std::result::Result<(), LogError>)>> {
        let Some(last) = self.ticks.storing_on() else {
            return Ok(None);
        };
        // The same pass, or another on the same commit: the names read
        // before the locks are still those committed.
        let same_pass = |st: &State| {
            self.ticks.storing_on() == Some(last)
                && st.flushing.is_empty()
                && self.sealed.lock().is_empty()
        };
        self.log_snapshot_on(log, name, kind, last, same_pass)
    }

    /// A logged snapshot on `last`, the last committed TID, while no commit
    /// can start (the caller holds the flush lock, or saw a tick's pass
    /// hold it), if `still` holds under every shard lock and the log and
    /// the pool can take it (else None): seals the changes as the next TID,
    /// encodes them once the shards' locks are released (`seal_snapshot`),
    /// appends the record and ends the log's region. Returns the snapshot
    /// and how its record went, for `logged_or_committed` (called with
    /// the flush lock released: it may wait for the commit).
    fn log_snapshot_on(
        &self,
        log: &RankedMutex<LogFile>,
        name: &str,
        kind: SnapshotKind,
        last: u64,
        still: impl Fn(&State) -> bool,
    ) -> Result<Option<(Snapshot, std::result::Result<(), LogError>)>> {
        self.check_ok()?;
        self.refuse_taken_name(name)?;
        let room = self.pool.chunks.free_bytes();
        let mut lg = log.lock();
        let mut payload = lg.record_buffer();
        let mut st = self.lock_all();
        // The snapshot's record must end a region on the last commit (a
        // clone whose commit failed left the log sealed for the next TID).
        if !still(&st) || !lg.is_on(last) || !self.snapshot_fits(&st, &lg, room, None) {
            drop(st);
            lg.recycle(payload);
            return Ok(None);
        }
        let snap = Snapshot::new(name, last + 1, kind);
        let t0 = std::time::Instant::now();
        let (next_ino, ov, changes) = self.seal_snapshot(&mut st, snap.tid);
        drop(st);
        let t1 = t0.elapsed();
        encode_snapshot(
            &mut payload,
            (None, &self.ticks.marks()),
            &ov,
            &changes,
            &snap,
        );
        let (t2, bytes) = (t0.elapsed(), payload.len());
        let logged = lg.append_record(next_ino, payload);
        tracing::debug!(
            "snapshot {name}: {bytes} bytes logged; cut in {t1:?}, encoded in {:?}, written in {:?}",
            t2 - t1,
            t0.elapsed() - t2
        );
        lg.seal(snap.tid);
        self.leave_sealed(ov, next_ino, &snap, logged.is_ok());
        Ok(Some((snap, logged)))
    }

    /// `snapshot_logged` while a flush commits the changes it sealed,
    /// without waiting for that commit: the record goes on top of the TID
    /// being committed, holds the sealed changes no record holds yet (as
    /// an fsync's would), and ends its region; the changes since are
    /// sealed as the next TID above the ones being committed, and the log
    /// takes no record until that commit frees its other region
    /// (`LogFile::seal_after_commit`: fsync waits for it). The commit
    /// under way (or about to start) may be a flush's or a logged
    /// snapshot's: that snapshot's record ended the other region and its
    /// failed commit stops the filesystem, so the TIDs of the two are
    /// settled either way. None for any other (a cut not logged, a clone's,
    /// maintenance), or when the record cannot be taken (as in
    /// `snapshot_logged`): the caller waits for the commit.
    fn snapshot_during_commit(
        &self,
        log: &RankedMutex<LogFile>,
        name: &str,
        kind: SnapshotKind,
    ) -> Result<Option<Snapshot>> {
        let room = self.pool.chunks.free_bytes();
        let mut lg = log.lock();
        let mut payload = lg.record_buffer();
        let mut st = self.lock_all();
        let owed = owed(&lg, &st.flushing);
        let fits = self.snapshot_fits(&st, &lg, room, owed.as_deref());
        let Some(tid) = self.stack_point(&lg, &st, name, fits, false)? else {
            drop(st);
            lg.recycle(payload);
            return Ok(None);
        };
        let snap = Snapshot::new(name, tid, kind);
        let (next_ino, ov, changes) = self.seal_snapshot(&mut st, snap.tid);
        drop(st);
        encode_snapshot(
            &mut payload,
            (owed.as_deref(), &self.ticks.marks()),
            &ov,
            &changes,
            &snap,
        );
        // The flusher waits for the log to retire the commit under way:
        // nothing commits the sealed changes before `sealed` is set.
        let logged = lg.append_record(next_ino, payload);
        if logged.is_ok() {
            lg.settle_sealed();
        }
        lg.seal_after_commit(tid);
        self.leave_sealed(ov, next_ino, &snap, logged.is_ok());
        drop(lg);
        self.logged_or_committed(snap, logged)
    }

    /// `snapshot_cut` while a commit is under way (or a logged snapshot
    /// waits for its own), without waiting for it: the changes buffered
    /// are sealed as the next TID above it, as `snapshot_during_commit`
    /// does but with no record (the cut is durable with its commit). The
    /// log takes no record until the commit under way is made
    /// (`LogFile::seal_after_commit`); then the first record holds what
    /// the cut sealed that no record holds (`owed`), so an fsync after the
    /// cut keeps every change made before it. Should the commit under way
    /// fail and be taken back, the cut's changes go back with it and the
    /// snapshot is not taken (`keep_uncommitted`). None when it cannot
    /// stack (see `stack_point`, or nothing buffered): the caller waits.
    pub(crate) fn cut_during_commit(
        &self,
        name: &str,
        kind: SnapshotKind,
    ) -> Result<Option<Snapshot>> {
        let Some(log) = &self.intent else {
            return Ok(None);
        };
        let mut lg = log.lock();
        let mut st = self.lock_all();
        let some = !lg.refuses_records() && st.shards().any(|s| !s.dirty.is_empty());
        let Some(tid) = self.stack_point(&lg, &st, name, some, true)? else {
            return Ok(None);
        };
        let snap = Snapshot::new(name, tid, kind);
        let ov = self.seal(&mut st, None, tid);
        lg.seal_after_commit(tid);
        self.leave_sealed(ov, self.next_ino(), &snap, false);
        drop(st);
        drop(lg);
        self.kick_flusher();
        Ok(Some(snap))
    }

    /// The TID a snapshot stacked on the commit under way takes (the log
    /// and every shard locked), or None when it cannot stack: `ok` is
    /// false, or the overlay being committed (or about to be) is not a
    /// flush's or a snapshot's alone. The flusher retires the log
    /// (`retire_intent`) before it releases the overlay it committed, so
    /// with the log held, one overlay being committed and at most one cut
    /// waiting (its own), it is a flush's or that snapshot's, sealed as
    /// the log's base. A cut not logged is stacked on only by another cut
    /// (`cut`): a failed commit of it is taken back, and a logged
    /// snapshot above it could not be. Errors: the filesystem stopped, or
    /// `name` is taken (committed, or waiting in the queue).
    fn stack_point(
        &self,
        lg: &LogFile,
        st: &State,
        name: &str,
        ok: bool,
        cut: bool,
    ) -> Result<Option<u64>> {
        let (waiting, pending_name) = {
            let q = self.sealed.lock();
            let named = q.iter().flat_map(|c| &c.snaps).any(|s| s.name == name);
            let under = q.front().is_some_and(|c| !c.logged && !cut);
            (q.len() > 1 || under, named)
        };
        if !ok || st.flushing.len() != 1 || waiting {
            return Ok(None);
        }
        self.check_ok()?;
        if pending_name {
            return Err(crate::error::FsError::SnapshotExists(name.to_string()));
        }
        self.refuse_taken_name(name)?;
        Ok(Some(lg.base_tid() + 1))
    }

    /// Whether a logged snapshot can take the changes buffered now (the
    /// log and every shard locked): some are, the log takes records, the
    /// reserve is not short, `room` free bytes hold their commit and the
    /// one under way twice over (the commit of a logged snapshot must not
    /// fail for space: a failed one stops the filesystem, see
    /// `commit_sealed`), and they fit a record with what `owed` owes.
    fn snapshot_fits(&self, st: &State, lg: &LogFile, room: u64, owed: Option<&Overlay>) -> bool {
        let to_write = st
            .shards()
            .map(|s| s.dirty.flush_bytes(self.record))
            .sum::<u64>()
            + st.flushing.flush_bytes(self.record);
        !st.shards().all(|s| s.dirty.is_empty())
            && !lg.refuses_records()
            && !self.reserve.is_short()
            && room >= 2 * to_write + 4 * self.pool.chunks.segment_size()
            && self.fits_a_record(st, owed, self.snapshot_record_room(st, lg, owed))
    }

    /// Block bytes a snapshot record can hold: the room left in the log's
    /// region less `RECORD_BYTES_PER_CHANGE` per change.
    fn snapshot_record_room(&self, st: &State, lg: &LogFile, owed: Option<&Overlay>) -> u64 {
        let changes: u64 = st
            .shards()
            .map(|s| crate::writeback::flush::change_count(&s.dirty))
            .sum::<u64>()
            + owed.map_or(0, crate::writeback::flush::change_count);
        lg.room()
            .saturating_sub(changes.saturating_mul(RECORD_BYTES_PER_CHANGE))
    }

    /// A logged snapshot whose changes were left sealed (`leave_sealed`,
    /// no lock held now): durable if its record was written, the flusher
    /// woken to commit it; else durable once its commit is made, which
    /// this waits for.
    fn logged_or_committed(
        &self,
        snap: Snapshot,
        logged: std::result::Result<(), LogError>,
    ) -> Result<Option<Snapshot>> {
        if let Err(e) = logged {
            tracing::warn!("{e}; committing snapshot {} instead", snap.name);
            return self.wait_for_cut(snap).map(Some);
        }
        self.kick_flusher();
        Ok(Some(snap))
    }

    /// A logged snapshot's cut (every shard locked): takes the changes no
    /// record holds from the dirty overlays and seals those as `tid`.
    /// Returns the inode counter, the sealed overlay and those changes,
    /// which `encode_snapshot` puts in the record once the locks are
    /// released (the sealed overlay no longer changes), so that requests
    /// do not wait for a large record to be copied.
    fn seal_snapshot(&self, st: &mut State, tid: u64) -> (u64, Arc<Overlay>, Unlogged) {
        let mut changes = Unlogged::default();
        for sh in st.shards_mut() {
            changes.merge(std::mem::take(&mut sh.dirty.unlogged));
        }
        (self.next_ino(), self.seal(st, None, tid), changes)
    }

    /// The intent log, locked (taken before the shards), if the pool has one.
    pub(crate) fn log_guard(&self) -> Option<Ranked<parking_lot::MutexGuard<'_, LogFile>>> {
        self.intent.as_ref().map(|l| l.lock())
    }

    /// `tid` was committed (by a flush, or a clone that sealed the log)
    /// and holds what the records before its seal said.
    pub(crate) fn retire_intent(&self, tid: u64) {
        if let Some(mut l) = self.log_guard() {
            l.committed(tid);
            self.intent_retired.notify_all();
        }
    }

    /// Applies one record, decoded and checked whole first (a damaged one
    /// changes nothing); returns the snapshots it ends with.
    fn apply_record(&self, st: &mut State, record: &[u8]) -> Result<Vec<Snapshot>> {
        let mut snaps = Vec::new();
        for e in rec::decode(record, self.record)? {
            match e {
                Entry::Snapshot(s) => snaps.push(s),
                Entry::Delete(ino) => st.dirty(ino).delete_inode(ino),
                Entry::Trunc { ino, first } => st.dirty(ino).truncate_blocks(ino, first),
                Entry::Inode(i) => st.put_inode(i),
                Entry::Dirent { dir, subkey, ent } => {
                    st.dirty(dir).put_dirent(dir, subkey.to_vec(), ent)
                }
                Entry::Symlink { ino, target } => st.dirty(ino).put_symlink(ino, target.to_vec()),
                Entry::Xattr { ino, name, value } => {
                    let v = value.map(<[u8]>::to_vec);
                    st.dirty(ino).put_xattr(ino, name.to_vec(), v)
                }
                Entry::Orphan { ino, open } => st.dirty(ino).set_orphan(ino, open),
                Entry::Block {
                    ino,
                    blk,
                    len,
                    lo,
                    bytes,
                } => self.replay_block(st, ino, blk, len, lo, bytes)?,
                Entry::Patch { ino, blk, ranges } => {
                    for (off, bytes) in ranges {
                        self.replay_patch(st, ino, blk, off, bytes)?;
                    }
                }
                Entry::Stored {
                    ino,
                    blk,
                    len,
                    chunk,
                } => self.replay_stored(st, ino, blk, len, chunk)?,
            }
        }
        Ok(snaps)
    }

    /// A logged block change: the block is `len` bytes long and holds
    /// `bytes` at `lo`; the rest is what it held before (in the overlay, or
    /// committed). The decoder checked the range against the record size.
    fn replay_block(
        &self,
        st: &mut State,
        ino: u64,
        blk: u64,
        len: usize,
        lo: usize,
        bytes: &[u8],
    ) -> Result<()> {
        self.refuse_unread(st, ino, blk, lo == 0 && bytes.len() == len)?;
        let mut buf = self.editable_block(st, ino, blk)?;
        buf.resize(len, 0);
        buf[lo..lo + bytes.len()].copy_from_slice(bytes);
        st.dirty(ino)
            .put_block(ino, blk, Arc::new(buf), lo, lo + bytes.len());
        Ok(())
    }
}

impl Fs {
    /// A logged patch range: written as the write that made it was.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "min(rs), the record size (<= 1 MiB, check_geometry)"
    )]
    fn replay_patch(
        &self,
        st: &mut State,
        ino: u64,
        blk: u64,
        off: usize,
        bytes: &[u8],
    ) -> Result<()> {
        let rs = self.record;
        let size = self.inode(st, ino)?.size;
        let valid = size.saturating_sub(blk * rs).min(rs) as usize;
        self.refuse_unread(st, ino, blk, off == 0 && bytes.len() >= valid)?;
        self.write_part(st, ino, blk, off, bytes, valid)
    }
}

/// The overlay the log was last sealed with (the newest being committed),
/// when the next record must also hold its changes that no record holds
/// (`LogFile::seal`) and it has some.
fn owed(lg: &LogFile, flushing: &Committing) -> Option<Arc<Overlay>> {
    flushing
        .newest()
        .filter(|o| lg.owes_sealed() && !o.unlogged.is_empty())
        .cloned()
}

/// Appends every change no record holds to `w`: those of `owed` (the
/// overlay being committed, read without changing it, see `owed`), then
/// those of every shard (`encode_unlogged`).
fn encode_pending(st: &mut State, owed: Option<&Overlay>, t: &Marks, w: &mut Vec<u8>) {
    if let Some(ov) = owed {
        encode_entries(ov, &ov.unlogged, t, w);
    }
    encode_unlogged(st, t, w);
}

/// About how many bytes the entries of `u` take in a record (room reserved
/// before encoding).
#[allow(
    clippy::cast_possible_truncation,
    reason = "a byte count of blocks held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
fn encoded_size(u: &Unlogged) -> usize {
    u.bytes as usize + 64 * u.blocks.len() + 256
}

/// A snapshot's record payload: the changes `owed` has that no record holds
/// (the overlay being committed), then `changes` with their values in the
/// overlay `ov` sealed for the snapshot, then the snapshot.
fn encode_snapshot(
    w: &mut Vec<u8>,
    (owed, t): (Option<&Overlay>, &Marks),
    ov: &Overlay,
    changes: &Unlogged,
    snap: &Snapshot,
) {
    w.reserve(encoded_size(changes));
    if let Some(o) = owed {
        encode_entries(o, &o.unlogged, t, w);
    }
    encode_entries(ov, changes, t, w);
    rec::put_snapshot(w, snap);
}

/// Appends the changes not yet logged of every shard to `w` as one record
/// payload (every shard locked: a consistent cut), and clears them.
fn encode_unlogged(st: &mut State, t: &Marks, w: &mut Vec<u8>) {
    let room: usize = st.shards().map(|s| encoded_size(&s.dirty.unlogged)).sum();
    w.reserve(room);
    for sh in st.shards_mut() {
        if !sh.dirty.unlogged.is_empty() {
            encode_record(&mut sh.dirty, t, w);
        }
    }
}

/// Appends the unlogged changes of `ov` to `w` as record entries and
/// clears them. Deletions and truncations come first (in the order they
/// were made), then current values, so that applying the record to the
/// state of the previous record gives the overlay's state now.
fn encode_record(ov: &mut Overlay, t: &Marks, w: &mut Vec<u8>) {
    let u = std::mem::take(&mut ov.unlogged);
    encode_entries(ov, &u, t, w);
}

/// Appends the changes `u` names, with their values in `ov`, to `w` as
/// record entries (see `encode_record`); a block a tick stored is named by
/// its chunk (`tick.rs`).
#[allow(
    clippy::cast_possible_truncation,
    reason = "counts and offsets within one record (record size <= 1 MiB, check_geometry)"
)]
fn encode_entries(ov: &Overlay, u: &Unlogged, t: &Marks, w: &mut Vec<u8>) {
    for &ino in &u.inodes {
        if matches!(ov.inodes.get(&ino), Some(None)) {
            w.push(T_DELETE);
            put_u64(w, ino);
        }
    }
    for &(ino, first) in &u.truncs {
        w.push(T_TRUNC);
        put_u64(w, ino);
        put_u64(w, first);
    }
    encode_values(ov, u, w);
    for (&(ino, blk), &(lo, hi)) in &u.blocks {
        if let Some(p) = ov.patches.get(&ino).and_then(|m| m.get(&blk)) {
            // Only what changed since the last record: the records before
            // this one hold the rest of the patch (a file appended by small
            // writes and fsyncs, a database's log, would otherwise log its
            // whole patch again at every fsync).
            let changed = unlogged_part(p, lo as usize, hi as usize);
            if changed.is_empty() {
                continue;
            }
            w.push(T_PATCH);
            put_u64(w, ino);
            put_u64(w, blk);
            put_u32(w, changed.len() as u32);
            for (off, b) in changed {
                put_u32(w, off as u32);
                put_bytes(w, b);
            }
            continue;
        }
        let Some(b) = ov.blocks.get(&ino).and_then(|m| m.get(&blk)) else {
            continue; // truncated or deleted since: a T_TRUNC/T_DELETE says so
        };
        if let Some(chunk) = t.chunk_of(ino, blk, b) {
            rec::put_stored(w, ino, blk, b.len(), chunk);
            continue;
        }
        let lo = (lo as usize).min(b.len());
        let hi = (hi as usize).clamp(lo, b.len());
        w.push(T_BLOCK);
        put_u64(w, ino);
        put_u64(w, blk);
        put_u32(w, b.len() as u32);
        put_u32(w, lo as u32);
        put_bytes(w, &b[lo..hi]);
    }
}

/// The parts of `p`'s ranges that lie in `lo..hi`, the bytes written
/// since the last record.
fn unlogged_part(p: &Patch, lo: usize, hi: usize) -> Vec<(usize, &[u8])> {
    p.ranges()
        .filter_map(|(off, b)| {
            let (from, to) = (off.max(lo), (off + b.len()).min(hi));
            (from < to).then(|| (from, &b[from - off..to - off]))
        })
        .collect()
}

fn encode_values(ov: &Overlay, u: &Unlogged, w: &mut Vec<u8>) {
    for &ino in &u.inodes {
        if let Some(Some(i)) = ov.inodes.get(&ino) {
            w.push(T_INODE);
            put_u64(w, ino);
            put_bytes(w, &i.encode());
        }
    }
    for &ino in &u.symlinks {
        if let Some(t) = ov.symlinks.get(&ino) {
            w.push(T_SYMLINK);
            put_u64(w, ino);
            put_bytes(w, t);
        }
    }
    for &(dir, lead) in &u.dirents {
        let Some(m) = ov.dirents.get(&dir) else {
            continue;
        };
        for (sk, e) in DirKey::with_lead(m, lead) {
            w.push(T_DIRENT);
            put_u64(w, dir);
            put_bytes(w, sk.as_bytes());
            put_opt(w, e.as_ref().map(DirEnt::encode).as_deref());
        }
    }
    for (ino, name) in &u.xattrs {
        if let Some(v) = ov.xattrs.get(ino).and_then(|m| m.get(name)) {
            w.push(T_XATTR);
            put_u64(w, *ino);
            put_bytes(w, name);
            put_opt(w, v.as_deref());
        }
    }
    for &ino in &u.orphans {
        let open = ov.orphans_add.contains(&ino);
        if open || ov.orphans_del.contains(&ino) {
            w.push(T_ORPHAN);
            put_u64(w, ino);
            w.push(open as u8);
        }
    }
}

/// Whether the log file at `path` exists with a log's length: records it
/// may hold are not to be dropped for an error reading it.
fn path_holds_records(path: &std::path::Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() >= crate::writeback::log_file::LEGACY_LOG_SIZE)
}

/// What the records of a damaged run after the damage touch, for a
/// person: the paths of the inodes they change or name, from the
/// committed tree (`paths`) and the entries the run's records make, or
/// their numbers.
fn touched(
    d: &Damage,
    record_size: u64,
    paths: &HashMap<u64, String>,
    names: &crate::names::Names,
) -> String {
    let mut paths = paths.clone();
    let all = d.before.iter().chain(&d.after);
    for e in all.flat_map(|(_, rec)| rec::decode(rec, record_size).unwrap_or_default()) {
        if let Entry::Dirent {
            dir,
            subkey,
            ent: Some(ent),
        } = e
        {
            let name = names
                .dirent_name(dir, subkey)
                .map_or(std::borrow::Cow::Borrowed(subkey), |k| k.1);
            let dir = paths
                .get(&dir)
                .map_or(format!("inode {dir}"), |p| p.clone());
            let p = format!(
                "{}/{}",
                dir.trim_end_matches('/'),
                String::from_utf8_lossy(&name)
            );
            paths.entry(ent.ino).or_insert(p);
        }
    }
    let mut out = std::collections::BTreeSet::new();
    for (h, rec) in &d.after {
        let Ok(entries) = rec::decode(rec, record_size) else {
            out.insert(format!("(record {}: undecodable)", h.seq));
            continue;
        };
        out.extend(entries.iter().filter_map(entry_ino).map(|ino| {
            paths
                .get(&ino)
                .cloned()
                .unwrap_or_else(|| format!("inode {ino}"))
        }));
    }
    let list: Vec<String> = out.into_iter().collect();
    format!("the files [{}]", list.join(", "))
}

/// The inode an intent entry changes (a directory entry's: the one it
/// names).
fn entry_ino(e: &Entry) -> Option<u64> {
    Some(match e {
        Entry::Dirent { ent: Some(ent), .. } => ent.ino,
        Entry::Dirent { dir, .. } => *dir,
        Entry::Inode(i) => i.ino,
        Entry::Block { ino, .. } | Entry::Patch { ino, .. } | Entry::Stored { ino, .. } => *ino,
        Entry::Trunc { ino, .. } | Entry::Symlink { ino, .. } | Entry::Xattr { ino, .. } => *ino,
        Entry::Delete(ino) | Entry::Orphan { ino, .. } => *ino,
        Entry::Snapshot(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{dirent_subkey, FileKind};

    /// A record names changed entries by their directory and the first 8
    /// bytes of their subkey: two entries that share them (names whose
    /// hashes agree there) are both logged, with their own values, and an
    /// entry that did not change is not.
    #[test]
    fn entries_that_share_a_leading_hash_are_all_logged() {
        let mut ov = Overlay::default();
        let twin = |name: &[u8]| {
            let mut k = dirent_subkey(b"a");
            k.truncate(8);
            k.push(u8::try_from(name.len()).unwrap());
            k.extend_from_slice(name);
            k
        };
        let ent = |ino| {
            Some(DirEnt {
                ino,
                kind: FileKind::File,
            })
        };
        ov.put_dirent(7, dirent_subkey(b"quiet"), ent(40));
        ov.unlogged = Unlogged::default();
        ov.put_dirent(7, twin(b"a"), ent(41));
        ov.put_dirent(7, twin(b"b"), None);
        ov.put_dirent(8, twin(b"c"), ent(43));
        assert_eq!(ov.unlogged.dirents.len(), 2, "one per directory and lead");
        let mut w = Vec::new();
        encode_values(&ov, &ov.unlogged, &mut w);
        let mut got: Vec<(u64, Vec<u8>, Option<u64>)> = rec::decode(&w, 1 << 17)
            .unwrap()
            .into_iter()
            .map(|e| match e {
                Entry::Dirent { dir, subkey, ent } => (dir, subkey.to_vec(), ent.map(|d| d.ino)),
                _ => panic!("not an entry"),
            })
            .collect();
        got.sort();
        let want = vec![
            (7, twin(b"a"), Some(41)),
            (7, twin(b"b"), None),
            (8, twin(b"c"), Some(43)),
        ];
        assert_eq!(got, want);
    }
}
