//! one and one of another pool are all ignored. Each record is written
//! twice, at its place in the region's first half and at the same place in
//! its second half, so that one damaged sector loses no record; a record
//! damaged in both places, with valid ones of its run after it, is damage,
//! not a torn tail: the open refuses (`LogError::Damaged`) unless told to
//! drop the damaged run's rest (scan.rs). Layout in docs/format/intent-log.md
//! ("Intent log"). The file is opened through the pool's storage
//! (`cairn_devices::Storage`).

use cairn_devices::{Backend, OpenHow, Storage};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod scan;

pub const MAGIC: [u8; 8] = *b"CAIRNIL\0";
/// 3: two regions, each record also at its place in its region's second
/// half. Version 2 logs (two regions, one copy) and version 1 logs (one
/// region of the whole file, read in region 0) are read at open.
pub const VERSION: u16 = 3;
const VERSION_UNMIRRORED: u16 = 2;
const VERSION_ONE_REGION: u16 = 1;
pub const HEADER_LEN: usize = 64;
// A record header: magic, version u16, 2 bytes, payload length u32, pool
// uuid, base TID, sequence, inode counter, then 8 bytes whose first 4
// hold the checksum (`checksum`, `append_record`); a payload's length
// fits its u32.
const _: () = assert!(8 + 2 + 2 + 4 + 16 + 8 + 8 + 8 + 8 == HEADER_LEN);
const _: () = assert!(MAX_LOG_SIZE / 2 <= u32::MAX as u64);
/// Regions of a log on devices are whole sectors.
const SECTOR: u64 = 4096;
/// Default size of a log file (`intent_log_mib`): two regions of 64 MiB,
/// so that a snapshot can log the changes of a whole commit interval of
/// steady writing (`Fs::snapshot_logged`); a record that does not fit
/// makes fsync flush.
pub const LOG_SIZE: u64 = 128 << 20;
/// The smallest log, and the size of those made before logs grew (two
/// regions of 16 MiB, or one of the whole file for version 1). A log is
/// read with the regions it has (half its length); with nothing to replay
/// it is made again at the size asked for.
pub const LEGACY_LOG_SIZE: u64 = 32 << 20;
/// How much of each region is written with zeros when the log is made
/// (half at the start of each half: where fsync's records and their copies
/// go), so that those writes overwrite
/// allocated blocks and fdatasync has no file metadata to commit; the rest
/// is allocated by the first record that reaches it (a large snapshot's).
const ZERO_FILLED: u64 = 16 << 20;
/// The largest log (`intent_log_mib` at most 4096).
const MAX_LOG_SIZE: u64 = 4 << 30;

/// One record's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHead {
    pub uuid: [u8; 16],
    /// The last committed TID when the record was written.
    pub base_tid: u64,
    /// 0 for the first record after `base_tid` was committed.
    pub seq: u64,
    /// The inode counter when the record was written.
    pub next_ino: u64,
}

/// A record read back: its header and payload.
pub type Record = (RecordHead, Vec<u8>);

/// How a region's records are laid out, by its first record's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Version 1: one region over the whole file, one copy.
    OneRegion,
    /// Version 2: records in their region, one copy.
    Unmirrored,
    /// Version 3: records in their region's first half, each copied at the
    /// same place in its second half.
    Mirrored,
}

impl Layout {
    fn version(self) -> u16 {
        match self {
            Layout::OneRegion => VERSION_ONE_REGION,
            Layout::Unmirrored => VERSION_UNMIRRORED,
            Layout::Mirrored => VERSION,
        }
    }

    /// How far records may reach from their region's start.
    fn limit(self, region_len: u64) -> u64 {
        match self {
            Layout::OneRegion => 2 * region_len,
            Layout::Unmirrored => region_len,
            Layout::Mirrored => region_len / 2,
        }
    }

    /// Where each record's places are, from its place in the first half
    /// (no allocation: a record write, on fsync's path, asks each time).
    fn copies(self, region_len: u64) -> impl Iterator<Item = u64> {
        let copy = (self == Layout::Mirrored).then_some(region_len / 2);
        std::iter::once(0).chain(copy)
    }
}

/// A run of records that stopped at a record damaged in every place it
/// has, with valid records of the same run after it: the fsync'd changes
/// of the damaged record and of every one after it would be lost.
#[derive(Debug)]
pub struct Damage {
    pub path: PathBuf,
    pub region: u64,
    /// The TID the run applies on top of.
    pub base_tid: u64,
    /// The sequence number of the first record that cannot be read.
    pub first_lost: u64,
    /// The valid records before it.
    pub before: Vec<Record>,
    /// The valid records after it (their changes are lost with it).
    pub after: Vec<Record>,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let last = self.after.last().map_or(self.first_lost, |r| r.0.seq);
        write!(
            f,
            "intent log {}: record {} of region {} (on TID {:#x}) is damaged in every one of \
             its copies, and {} valid record(s) of the same run follow it (up to record {last})",
            self.path.display(),
            self.first_lost,
            self.region,
            self.base_tid,
            self.after.len()
        )
    }
}

/// What an open does with a damaged log (`Damage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDamage {
    /// Refuses: `LogError::Damaged`.
    Refuse,
    /// Replays the records before the damage and drops the rest of that
    /// run (the records are overwritten with zeros); the damage is in
    /// `LogFile::discarded`.
    Discard,
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("intent log {0}: {1}")]
    Io(PathBuf, io::Error),
    #[error("intent log full")]
    Full,
    /// Where the valid records end: what follows is not one.
    #[error("no intent record here: {0}")]
    NoRecord(&'static str),
    #[error("{0}")]
    Damaged(Box<Damage>),
}

/// One copy of the whole log: the pool directory's log file, or the log
/// area of a device (`DeviceSpec::log`).
#[derive(Debug, Clone)]
pub struct Place {
    /// For messages: the file, or the device's path.
    pub name: PathBuf,
    pub io: Arc<dyn Backend>,
    /// A device's area, which shares its file with the device's segments:
    /// each record is made durable by itself (`write_durable_at`), not by
    /// a sync of the whole file.
    pub shared: bool,
}

impl Place {
    /// Writes `rec` at each of `offs` and makes it durable: in a device's
    /// area, every copy but the last written back (no flush) and the last
    /// written durably, whose one device flush covers them all.
    fn write_record(&self, rec: &[u8], offs: impl Iterator<Item = u64>) -> io::Result<()> {
        let offs: Vec<u64> = offs.collect();
        let Some((&last, rest)) = offs.split_last() else {
            return Ok(());
        };
        if self.shared {
            for &at in rest {
                self.io.write_at(rec, at)?;
                self.io.write_back_wait(at, rec.len() as u64)?;
            }
            return self.io.write_durable_at(rec, last);
        }
        offs.iter().try_for_each(|&at| self.io.write_at(rec, at))?;
        self.io.sync_data()
    }
}

/// The open log, where the next record goes.
pub struct LogFile {
    /// The log's name in messages: its file, or its first device.
    path: PathBuf,
    /// Where its copies are (at least one; the same bytes at the same
    /// offsets in each).
    places: Vec<Place>,
    uuid: [u8; 16],
    /// The region records go to (0 or 1).
    region: u64,
    /// The TID the region's records apply on top of.
    base_tid: u64,
    /// Where the next record goes, from the region's start.
    pos: u64,
    seq: u64,
    /// How the region's records are laid out: mirrored, or the layout of
    /// an older log found at open (records on it keep its layout).
    layout: Layout,
    /// Size of each region: half the file.
    region_len: u64,
    /// The overlay being committed has changes no record holds: the next
    /// record must hold them too (set by `seal`, see `Fs::fsync`).
    owes_sealed: bool,
    /// How long a record's write to one of several places may take
    /// before that place is dropped as hung (`cairn_data::deadline`).
    pub timeout: Option<std::time::Duration>,
    /// A record write failed after its changes were taken from the
    /// overlays: until the commit of this TID holds them, no fsync may
    /// count on the log (0: none failed).
    broken_until: u64,
    /// A snapshot sealed this TID while the commit of the base TID was
    /// under way (`seal_after_commit`): records wait for that commit,
    /// which frees the other region (0: none).
    pending_seal: u64,
    /// How many records of the region a commit of `base_tid` tried again
    /// holds: a commit of it failed after records went on top of it, and
    /// its changes went back to be sealed again with theirs (`seal`).
    retried: u64,
    /// The last record's buffer, for the next (`record_buffer`).
    spare: Vec<u8>,
    /// An encrypted pool's log key: each record's payload is sealed with
    /// it, bound to the record's header (`record_aad`).
    pub cipher: Option<cairn_crypt::Sealer>,
    /// The damage an open told to discard it found (`OnDamage::Discard`).
    pub discarded: Option<Box<Damage>>,
}

impl LogFile {
    /// Opens the log at `path` (made at `size`, see `make`, when missing
    /// or short; read with the regions it has, half its length, and made
    /// again at `size` when none of its records applies) and returns it
    /// with the records that apply on top of `last_tid`, in order: those
    /// of the region on `last_tid`, then those of the region on
    /// `last_tid + 1` (written while that TID was being committed, which a
    /// crash cut short). New records go after the last.
    pub fn open(
        path: &Path,
        uuid: [u8; 16],
        last_tid: u64,
        storage: &dyn Storage,
        size: u64,
    ) -> Result<(Self, Vec<Record>), LogError> {
        Self::open_with(path, uuid, last_tid, storage, size, OnDamage::Refuse)
    }

    /// `open`, doing `on_damage` with a damaged log (`Damage`).
    pub fn open_with(
        path: &Path,
        uuid: [u8; 16],
        last_tid: u64,
        storage: &dyn Storage,
        size: u64,
        on_damage: OnDamage,
    ) -> Result<(Self, Vec<Record>), LogError> {
        let err = |e| LogError::Io(path.to_path_buf(), e);
        let size = size.clamp(LEGACY_LOG_SIZE, MAX_LOG_SIZE) & !((1 << 20) - 1);
        let file = storage.open(path, &OpenHow::CREATE).map_err(err)?;
        let mut len = file.len().map_err(err)?;
        if len < LEGACY_LOG_SIZE {
            if let Err(e) = make(&*file, size, 0) {
                let _ = std::fs::remove_file(path);
                return Err(err(e));
            }
            len = size;
        }
        let region_len = len.min(MAX_LOG_SIZE) / 2;
        let place = |io| Place {
            name: path.to_path_buf(),
            io,
            shared: false,
        };
        let (log, recs) = Self::read(vec![place(file)], uuid, last_tid, region_len, on_damage)?;
        if recs.is_empty() && log.discarded.is_none() && region_len != size / 2 {
            // Nothing to replay: made again at the size asked for (a log
            // of an older version, or `intent_log_mib` changed).
            let file = log.places[0].io.clone();
            make(&*file, size, region_len * 2).map_err(err)?;
            return Self::read(vec![place(file)], uuid, last_tid, size / 2, on_damage);
        }
        Ok((log, recs))
    }

    /// Opens the log kept in the log areas of devices (`Device::log_area`),
    /// one copy in each, of the length of the shortest, and returns its
    /// records as `open` does. A record is read from whichever copy holds
    /// it intact; a new one goes to every copy.
    pub fn open_places(
        places: Vec<Place>,
        uuid: [u8; 16],
        last_tid: u64,
        on_damage: OnDamage,
    ) -> Result<(Self, Vec<Record>), LogError> {
        assert!(!places.is_empty(), "a log has at least one place");
        let err = |p: &Place, e| LogError::Io(p.name.clone(), e);
        let mut len = u64::MAX;
        for p in &places {
            len = len.min(p.io.len().map_err(|e| err(p, e))?);
        }
        let region_len = (len.min(MAX_LOG_SIZE) / 2) & !(SECTOR - 1);
        if region_len < 2 * HEADER_LEN as u64 {
            return Err(err(&places[0], io::Error::other("log area too small")));
        }
        Self::read(places, uuid, last_tid, region_len, on_damage)
    }

    /// The log in `places` (regions of `region_len`) and its records on
    /// top of `last_tid` (see `open`).
    fn read(
        places: Vec<Place>,
        uuid: [u8; 16],
        last_tid: u64,
        region_len: u64,
        on_damage: OnDamage,
    ) -> Result<(Self, Vec<Record>), LogError> {
        let path = places[0].name.clone();
        let err = |e| LogError::Io(path.clone(), e);
        let mut log = LogFile {
            path: path.clone(),
            places,
            uuid,
            region: 0,
            base_tid: last_tid,
            pos: 0,
            seq: 0,
            layout: Layout::Mirrored,
            region_len,
            owes_sealed: false,
            broken_until: 0,
            timeout: Some(std::time::Duration::from_secs(30)),
            pending_seal: 0,
            retried: 0,
            spare: Vec::new(),
            cipher: None,
            discarded: None,
        };
        let live = [last_tid, last_tid + 1];
        let mut found = Vec::new();
        for region in 0..2 {
            let s = log.scan(region, &live).map_err(err)?;
            if !s.after.is_empty() {
                log.damaged(region, &s, on_damage)?;
            }
            let base = s.records.first().map(|r| r.0.base_tid);
            if base.is_some_and(|b| live.contains(&b)) {
                found.push((region, s));
            }
        }
        found.sort_by_key(|(_, s)| s.records[0].0.base_tid);
        if let Some((region, s)) = found.last() {
            log.region = *region;
            log.base_tid = s.records[0].0.base_tid;
            log.pos = s.end;
            log.seq = s.records.len() as u64;
            log.layout = s.layout;
        }
        let recs = found.into_iter().flat_map(|(_, s)| s.records).collect();
        Ok((log, recs))
    }

    /// The run `s` of `region` stopped at damage (`Damage`): refused, or
    /// its rest overwritten with zeros in every place (`OnDamage`), so that
    /// its records never count again.
    fn damaged(&mut self, region: u64, s: &scan::Scan, on: OnDamage) -> Result<(), LogError> {
        let base = s.records.first().or(s.after.first()).map(|r| r.0.base_tid);
        let d = Box::new(Damage {
            path: self.path.clone(),
            region,
            base_tid: base.unwrap_or(self.base_tid),
            first_lost: s.records.len() as u64,
            before: s.records.clone(),
            after: s.after.clone(),
        });
        if on == OnDamage::Refuse {
            return Err(LogError::Damaged(d));
        }
        let start = region * self.region_len;
        let limit = s.layout.limit(self.region_len);
        for p in &self.places {
            let err = |e| LogError::Io(p.name.clone(), e);
            for copy in s.layout.copies(self.region_len) {
                zero(&*p.io, start + copy + s.end, start + copy + limit).map_err(err)?;
            }
            p.io.sync_data().map_err(err)?;
        }
        self.discarded = Some(d);
        Ok(())
    }

    /// True when no record is on top of `last_tid`: the region records go
    /// to is empty, or on an older TID (a mirror's commits do not seal the
    /// log); the other one is on an older TID.
    pub fn is_empty_on(&self, last_tid: u64) -> bool {
        self.pos == 0 || self.base_tid < last_tid
    }

    /// Whether records go on top of `tid` (not of a TID sealed after it).
    pub fn is_on(&self, tid: u64) -> bool {
        self.base_tid == tid
    }

    /// The TID records go on top of: the last sealed (being committed, or
    /// committed).
    pub fn base_tid(&self) -> u64 {
        self.base_tid
    }

    /// How many bytes of its region the records on the current base hold.
    pub fn used(&self) -> u64 {
        self.pos
    }

    /// Size of each of the two regions.
    pub fn region_len(&self) -> u64 {
        self.region_len
    }

    /// How many bytes of records the current region can hold.
    pub fn capacity(&self) -> u64 {
        self.layout.limit(self.region_len)
    }

    /// The largest payload the next record can have.
    pub fn room(&self) -> u64 {
        self.capacity().saturating_sub(self.pos + HEADER_LEN as u64)
    }

    /// The changes so far are sealed, to be committed as `tid`, the TID
    /// after the last commit: records from now on go to the other region,
    /// on top of `tid`, and the first of them must also hold what the
    /// sealed changes have that no record does (`owes_sealed`). The region
    /// they leave stays until `tid` is committed. The other region's
    /// records are on an older TID, already committed: the region records
    /// go to is on the last commit, or on `tid` itself when a commit of
    /// `tid` failed and is tried again (then it is kept).
    pub fn seal(&mut self, tid: u64) {
        self.owes_sealed = true;
        if tid == self.base_tid {
            return;
        }
        self.retried = 0;
        self.region ^= 1;
        self.base_tid = tid;
        self.pos = 0;
        self.seq = 0;
        self.layout = Layout::Mirrored;
    }

    /// The commit of `tid` failed and its changes went back to the dirty
    /// overlay, with those of the records on top of it: the commit that
    /// seals them again (`seal` on the same TID) holds what those records
    /// hold (`retried_records`).
    pub fn taken_back(&mut self, tid: u64) {
        if tid == self.base_tid {
            self.retried = self.seq;
        }
    }

    /// How many of the region's first records the commit of `tid` holds:
    /// those written before its changes were taken back after a failed
    /// commit (`taken_back`); 0 for a first try. The commit stores the
    /// count (counter `intent_floor`), so that a replay on top of it skips
    /// them: their changes are older than the commit's.
    pub fn retried_records(&self, tid: u64) -> u64 {
        if tid == self.base_tid {
            self.retried
        } else {
            0
        }
    }

    /// The changes so far are sealed as `tid` while the commit of the
    /// region's base TID (`tid - 1`) is under way, after a record that
    /// ends the region (a logged snapshot's): the other region is still
    /// needed until that commit is made, so no record is taken until then
    /// (`refuses_records`), and `committed` seals the log for `tid`.
    pub fn seal_after_commit(&mut self, tid: u64) {
        assert_eq!(tid, self.base_tid + 1, "sealed on top of the region's base");
        self.pending_seal = tid;
    }

    /// The seal `seal_after_commit` asked for is not to be made: the
    /// changes it sealed went back to the dirty overlay (the commit under
    /// them failed, see `Fs::keep_uncommitted`).
    pub fn cancel_pending_seal(&mut self) {
        self.pending_seal = 0;
    }

    /// Whether the next record must hold the sealed changes no record holds.
    pub fn owes_sealed(&self) -> bool {
        self.owes_sealed
    }

    /// A record holding the sealed changes was written.
    pub fn settle_sealed(&mut self) {
        self.owes_sealed = false;
    }

    /// Whether a failed record write left changes that only a commit makes
    /// durable (fsync must flush until then).
    pub fn is_broken(&self) -> bool {
        self.broken_until != 0
    }

    /// Whether records wait for a commit to seal the log
    /// (`seal_after_commit`).
    pub fn waits_for_commit(&self) -> bool {
        self.pending_seal != 0
    }

    /// Whether no record may be written now: the log is broken (fsync then
    /// flushes), or waits for a commit to seal it (`seal_after_commit`:
    /// fsync waits for that commit).
    pub fn refuses_records(&self) -> bool {
        self.is_broken() || self.waits_for_commit()
    }

    /// `tid` was committed: it holds the sealed changes, and every change
    /// a failed record write left out if it was the TID they wait for. A
    /// seal that waited for it is made (`seal_after_commit`).
    pub fn committed(&mut self, tid: u64) {
        self.owes_sealed = false;
        if tid >= self.broken_until {
            self.broken_until = 0;
        }
        if self.pending_seal == tid + 1 {
            self.pending_seal = 0;
            self.seal(tid + 1);
        }
    }

    /// A buffer to encode the next record into: `HEADER_LEN` bytes of room
    /// for the header, then the payload is appended (see `append_record`).
    /// It reuses the memory of the last record written, so that a large
    /// record (a snapshot's) is neither a fresh allocation with its page
    /// faults nor copied once more behind a header.
    pub fn record_buffer(&mut self) -> Vec<u8> {
        let mut b = std::mem::take(&mut self.spare);
        b.clear();
        b.resize(HEADER_LEN, 0);
        b
    }

    /// Keeps a buffer from `record_buffer` that was not written, for the next.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if buf.capacity() > self.spare.capacity() {
            self.spare = buf;
        }
    }

    /// Writes one record and makes it durable before returning.
    pub fn append(&mut self, next_ino: u64, payload: &[u8]) -> Result<(), LogError> {
        let mut rec = self.record_buffer();
        rec.extend_from_slice(payload);
        self.append_record(next_ino, rec)
    }

    /// Writes `rec` (from `record_buffer`: header room, then the payload)
    /// as the next record and makes it durable before returning. On
    /// failure the log is broken (`is_broken`) until the commit after the
    /// current base: the caller took the record's changes from the
    /// overlays, so only that commit holds them now.
    pub fn append_record(&mut self, next_ino: u64, mut rec: Vec<u8>) -> Result<(), LogError> {
        assert!(
            rec.len() >= HEADER_LEN,
            "a record buffer starts with header room"
        );
        assert_eq!(self.pending_seal, 0, "no record before a pending seal");
        let head = RecordHead {
            uuid: self.uuid,
            base_tid: self.base_tid,
            seq: self.seq,
            next_ino,
        };
        if let Some(c) = &self.cipher {
            let sealed = c.seal(&record_aad(&head), &rec[HEADER_LEN..]);
            rec.truncate(HEADER_LEN);
            rec.extend_from_slice(&sealed);
        }
        let len = rec.len() as u64;
        if self.pos + len > self.capacity() {
            self.recycle(rec);
            self.broken_until = self.base_tid + 1;
            return Err(LogError::Full);
        }
        let head = encode_head(&head, rec.len() - HEADER_LEN, self.layout.version());
        rec[..HEADER_LEN].copy_from_slice(&head);
        let sum = checksum(&rec[..HEADER_LEN], &rec[HEADER_LEN..]);
        rec[56..60].copy_from_slice(&sum.to_le_bytes());
        let at = self.region * self.region_len + self.pos;
        assert!(
            self.pos + len <= self.capacity() && self.capacity() <= 2 * self.region_len,
            "a record stays inside its region's half"
        );
        let written = self.write_everywhere(&rec, at);
        self.recycle(rec);
        if let Err(e) = written {
            self.broken_until = self.base_tid + 1;
            return Err(e);
        }
        self.pos += len;
        self.seq += 1;
        Ok(())
    }

    /// Writes a record at `at` (and its copy in the region's second half)
    /// in every place, at once when there are several, and makes it
    /// durable. A place whose write fails is dropped (logged) when another
    /// one holds the record: the log goes on with one copy fewer. Fails
    /// only when no place holds it.
    fn write_everywhere(&mut self, rec: &[u8], at: u64) -> Result<(), LogError> {
        let offs = || self.layout.copies(self.region_len).map(|c| at + c);
        let results: Vec<io::Result<()>> = match self.places.as_slice() {
            [one] => vec![one.write_record(rec, offs())],
            // Each place on its own thread, waited for at most the I/O
            // timeout: a hung device is dropped like a failing one.
            many => {
                let (rec, offs): (Arc<Vec<u8>>, Vec<u64>) =
                    (Arc::new(rec.to_vec()), offs().collect());
                let jobs: Vec<Box<dyn FnOnce() -> io::Result<()> + Send>> = (many.iter())
                    .map(|p| {
                        let (p, rec, offs) = (p.clone(), rec.clone(), offs.clone());
                        let job = move || p.write_record(&rec, offs.into_iter());
                        Box::new(job) as Box<dyn FnOnce() -> io::Result<()> + Send>
                    })
                    .collect();
                let done = cairn_data::deadline::all_within(self.timeout, jobs);
                let hung =
                    || io::Error::new(io::ErrorKind::TimedOut, "no answer within the I/O timeout");
                done.into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(hung())))
                    .collect()
            }
        };
        if results.iter().all(|r| r.is_err()) {
            let e = results.into_iter().find_map(|r| r.err()).expect("an error");
            return Err(LogError::Io(self.path.clone(), e));
        }
        let mut i = 0;
        self.places.retain(|p| {
            let r = &results[i];
            i += 1;
            if let Err(e) = r {
                tracing::error!(
                    "intent log: a record could not be written to its copy on {} ({e}); that \
                     copy is no longer written until the next mount",
                    p.name.display()
                );
            }
            r.is_ok()
        });
        assert!(!self.places.is_empty(), "a record written leaves a place");
        Ok(())
    }

    /// How many places the log is written to now.
    pub fn copies(&self) -> usize {
        self.places.len()
    }

    /// Where the log's copies are written now.
    pub fn place_names(&self) -> Vec<PathBuf> {
        self.places.iter().map(|p| p.name.clone()).collect()
    }

    /// Whether a copy of the log is at `name`.
    pub fn has_place(&self, name: &Path) -> bool {
        self.places.iter().any(|p| p.name == name)
    }

    /// A new copy (a device's area, of the same kind and at least as large
    /// as the others): every record from now on goes there too. The
    /// records already written are on the other copies, which the open
    /// reads record by record.
    pub fn add_place(&mut self, p: Place) -> Result<(), String> {
        let len = p.io.len().map_err(|e| e.to_string())?;
        if !p.shared || !self.places[0].shared || len < 2 * self.region_len {
            return Err(format!(
                "{}: a log area of {len} bytes cannot hold a copy of this log (regions of {})",
                p.name.display(),
                self.region_len
            ));
        }
        if !self.has_place(&p.name) {
            self.places.push(p);
        }
        Ok(())
    }

    /// Stops writing the copy at `name` (its device leaves the pool);
    /// true if there was one. The last copy is never dropped.
    pub fn drop_place(&mut self, name: &Path) -> bool {
        let before = self.places.len();
        if before > 1 {
            self.places.retain(|p| p.name != name);
        }
        self.places.len() < before
    }
}

/// Makes `f` a log of `size` bytes with no record: zeros over its first
/// `old` bytes (a log whose records no longer apply) and over the start of
/// each half of each region (`ZERO_FILLED` per region), the rest left to the
/// file system to allocate.
fn make(f: &dyn Backend, size: u64, old: u64) -> io::Result<()> {
    f.set_len(size)?;
    let head = zero_heads(f, size)?;
    zero(f, head, old.min(size))?;
    f.sync_data()
}

/// Readies a device's log area (`Device::log_area`) at mkfs: zeros over
/// the start of each half of each region, as `make` does for a file, so
/// that fsync's records overwrite written blocks (no extent to convert,
/// nothing but the record for a durable write to flush).
pub fn prepare_area(f: &dyn Backend) -> io::Result<()> {
    zero_heads(f, f.len()?)?;
    f.sync_data()
}

/// Zeros over the start of each half of each region of a log of `size`
/// bytes (`ZERO_FILLED` per region); returns the length of each start.
fn zero_heads(f: &dyn Backend, size: u64) -> io::Result<u64> {
    let quarter = size / 4;
    let head = (ZERO_FILLED / 2).min(quarter);
    for q in 0..4 {
        zero(f, q * quarter, q * quarter + head)?;
    }
    Ok(head)
}

/// Copies a device's log area to the new file `to` (mode 0600), then
/// writes zeros over the whole area: its records are set aside, and no
/// open finds them (`salvage --rebuild`).
#[allow(
    clippy::cast_possible_truncation,
    reason = "min with a buffer's length"
)]
pub fn set_aside(f: &dyn Backend, to: &Path) -> io::Result<()> {
    use std::io::Write;
    let mut out = cairn_devices::private::private_options()
        .create_new(true)
        .write(true)
        .open(to)?;
    let len = f.len()?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        f.read_at(&mut buf[..n], at)?;
        out.write_all(&buf[..n])?;
        at += n as u64;
    }
    out.sync_all()?;
    zero(f, 0, len)?;
    f.sync_data()
}

/// Writes zeros over `[from, to)` of `f`.
#[allow(
    clippy::cast_possible_truncation,
    reason = "min with a buffer's length"
)]
fn zero(f: &dyn Backend, from: u64, to: u64) -> io::Result<()> {
    let zeros = vec![0u8; 1 << 20];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        f.write_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// What an encrypted record's payload is bound to: its pool, the TID it
/// applies on and its place in that TID's run, so a record replayed in
/// another place (or another pool's) fails authentication.
pub fn record_aad(h: &RecordHead) -> [u8; 48] {
    let mut a = [0u8; 48];
    a[..8].copy_from_slice(b"CAIRNILR");
    a[8..24].copy_from_slice(&h.uuid);
    a[24..32].copy_from_slice(&h.base_tid.to_le_bytes());
    a[32..40].copy_from_slice(&h.seq.to_le_bytes());
    a[40..48].copy_from_slice(&h.next_ino.to_le_bytes());
    a
}

/// The records of an encrypted log with their payloads opened; the
/// sequence number of the first that fails authentication is the error.
pub fn open_records(cipher: &cairn_crypt::Sealer, recs: Vec<Record>) -> Result<Vec<Record>, u64> {
    (recs.into_iter())
        .map(|(h, p)| match cipher.open(&record_aad(&h), &p) {
            Ok(plain) => Ok((h, plain)),
            Err(_) => Err(h.seq),
        })
        .collect()
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "a payload fits the log (append checks pos + len <= capacity), whose capacity is at most MAX_LOG_SIZE = 4 GiB"
)]
fn encode_head(h: &RecordHead, len: usize, version: u16) -> [u8; HEADER_LEN] {
    debug_assert!(
        len as u64 <= MAX_LOG_SIZE,
        "a record payload of {len} bytes"
    );
    let mut b = Vec::with_capacity(HEADER_LEN);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&(len as u32).to_le_bytes());
    b.extend_from_slice(&h.uuid);
    b.extend_from_slice(&h.base_tid.to_le_bytes());
    b.extend_from_slice(&h.seq.to_le_bytes());
    b.extend_from_slice(&h.next_ino.to_le_bytes());
    b.extend_from_slice(&[0u8; 8]);
    b.try_into()
        .expect("the header fields fill HEADER_LEN bytes")
}

/// A record's header fields, payload length (at most what the log can
/// hold after the header) and version (1 or 2).
fn parse_head(b: &[u8; HEADER_LEN]) -> Result<(RecordHead, usize, u16), LogError> {
    let u64_at = |o: usize| {
        u64::from_le_bytes(
            b[o..o + 8]
                .try_into()
                .expect("slice length matches the array"),
        )
    };
    let version = u16::from_le_bytes([b[8], b[9]]);
    if b[..8] != MAGIC || !(VERSION_ONE_REGION..=VERSION).contains(&version) {
        return Err(LogError::NoRecord("no record magic or version"));
    }
    let len = u32::from_le_bytes(
        b[12..16]
            .try_into()
            .expect("slice length matches the array"),
    ) as usize;
    if len as u64 > MAX_LOG_SIZE / 2 - HEADER_LEN as u64 {
        return Err(LogError::NoRecord("payload longer than the log"));
    }
    let head = RecordHead {
        uuid: b[16..32]
            .try_into()
            .expect("slice length matches the array"),
        base_tid: u64_at(32),
        seq: u64_at(40),
        next_ino: u64_at(48),
    };
    Ok((head, len, version))
}

/// crc32c of the header (checksum field as zeros) and the payload.
fn checksum(head: &[u8], payload: &[u8]) -> u32 {
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(&head[..HEADER_LEN]);
    h[56..60].fill(0);
    crc32c::crc32c_append(crc32c::crc32c(&h), payload)
}

#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod tests {
    use super::*;
    use cairn_devices::HostStorage;
    use std::os::unix::fs::FileExt;

    fn payloads(p: &Path, uuid: [u8; 16], tid: u64) -> Vec<(u64, u64, Vec<u8>)> {
        let recs = LogFile::open(p, uuid, tid, &HostStorage, LOG_SIZE)
            .unwrap()
            .1;
        recs.into_iter()
            .map(|(h, p)| (h.base_tid, h.seq, p))
            .collect()
    }

    #[test]
    fn records_survive_reopen_until_committed_and_torn_ones_are_dropped() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let uuid = [7u8; 16];
        let (mut log, recs) = LogFile::open(&p, uuid, 5, &HostStorage, LOG_SIZE).unwrap();
        assert!(recs.is_empty());
        log.append(100, b"first").unwrap();
        log.append(101, b"second").unwrap();
        drop(log);
        let (mut log, recs) = LogFile::open(&p, uuid, 5, &HostStorage, LOG_SIZE).unwrap();
        let got: Vec<_> = recs
            .iter()
            .map(|(h, p)| (h.seq, h.next_ino, p.clone()))
            .collect();
        assert_eq!(
            got,
            vec![(0, 100, b"first".to_vec()), (1, 101, b"second".to_vec())]
        );
        // Appends go after the replayed records.
        log.append(102, b"third").unwrap();
        let end = log.pos;
        drop(log);
        // Another pool, or a TID committed on top of them, sees none.
        assert!(payloads(&p, [8u8; 16], 5).is_empty());
        assert!(payloads(&p, uuid, 6).is_empty());
        // A torn last record (in both of its places): the ones before it
        // stay.
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(b"X", end - 2).unwrap();
        f.write_all_at(b"X", end - 2 + LOG_SIZE / 4).unwrap();
        let (mut log, recs) = LogFile::open(&p, uuid, 5, &HostStorage, LOG_SIZE).unwrap();
        assert_eq!(recs.len(), 2);
        // Sealed as TID 6: later records go to the other region, on 6.
        log.seal(6);
        assert!(log.owes_sealed());
        log.append(103, b"new").unwrap();
        drop(log);
        // Before 6 is committed, both regions apply, in order; after, only
        // the second.
        let seqs =
            |v: Vec<(u64, u64, Vec<u8>)>| v.into_iter().map(|r| (r.0, r.1)).collect::<Vec<_>>();
        assert_eq!(seqs(payloads(&p, uuid, 5)), vec![(5, 0), (5, 1), (6, 0)]);
        assert_eq!(payloads(&p, uuid, 6), vec![(6, 0, b"new".to_vec())]);
        assert!(payloads(&p, uuid, 7).is_empty());
        // Sealed as 7 once 6 is committed: back to the first region, whose
        // old records are on 5.
        let (mut log, _) = LogFile::open(&p, uuid, 6, &HostStorage, LOG_SIZE).unwrap();
        log.seal(7);
        log.append(104, b"later").unwrap();
        drop(log);
        assert_eq!(seqs(payloads(&p, uuid, 6)), vec![(6, 0), (7, 0)]);
        assert_eq!(payloads(&p, uuid, 7), vec![(7, 0, b"later".to_vec())]);
    }

    #[test]
    fn sealing_the_same_tid_again_keeps_the_region() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let (mut log, _) = LogFile::open(&p, [2; 16], 3, &HostStorage, LOG_SIZE).unwrap();
        log.append(1, b"a").unwrap();
        log.seal(4);
        log.append(1, b"b").unwrap();
        log.committed(4);
        assert!(!log.owes_sealed());
        // A commit of 4 that failed is tried again: nothing is lost.
        log.seal(4);
        log.append(1, b"c").unwrap();
        drop(log);
        let got = payloads_of(&p, [2; 16], 3);
        assert_eq!(got, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    }

    /// A commit of 4 fails after two records went on top of it: its retry
    /// holds them (`taken_back`), and only they count; a first try, a
    /// failure of another TID, and the next region count none.
    #[test]
    fn a_retried_commit_counts_the_records_on_top_of_its_failed_try() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let (mut log, _) = LogFile::open(&p, [4; 16], 3, &HostStorage, LOG_SIZE).unwrap();
        log.seal(4);
        log.append(1, b"a").unwrap();
        log.append(1, b"b").unwrap();
        assert_eq!(log.retried_records(4), 0, "a first try");
        log.taken_back(3);
        assert_eq!(log.retried_records(4), 0, "another TID failed");
        log.taken_back(4);
        log.seal(4);
        assert_eq!(log.retried_records(4), 2);
        assert_eq!(log.retried_records(5), 0);
        log.committed(4);
        log.append(1, b"c").unwrap();
        log.seal(5);
        assert_eq!(log.retried_records(5), 0, "a new region");
    }

    /// A snapshot sealed 6 while 5 was being committed: the log takes no
    /// record until 5 is committed, then goes to the other region, on 6.
    #[test]
    fn a_seal_after_a_commit_waits_for_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let uuid = [5; 16];
        let (mut log, _) = LogFile::open(&p, uuid, 3, &HostStorage, LOG_SIZE).unwrap();
        log.append(1, b"on 3").unwrap();
        log.seal(4);
        log.committed(4);
        log.seal(5);
        log.append(1, b"on 5").unwrap();
        log.seal_after_commit(6);
        assert!(log.refuses_records() && !log.is_broken());
        log.committed(4); // not the one it waits for
        assert!(log.refuses_records() && log.is_on(5));
        log.committed(5);
        assert!(!log.refuses_records() && log.is_on(6) && log.owes_sealed());
        log.append(1, b"on 6").unwrap();
        drop(log);
        // 5's region is kept until 6 is committed; 3's was overwritten.
        assert_eq!(
            payloads_of(&p, uuid, 5),
            vec![b"on 5".to_vec(), b"on 6".to_vec()]
        );
        assert_eq!(payloads_of(&p, uuid, 6), vec![b"on 6".to_vec()]);
    }

    #[test]
    #[should_panic(expected = "no record before a pending seal")]
    fn a_record_before_a_pending_seal_is_a_bug() {
        let d = tempfile::tempdir().unwrap();
        let (mut log, _) =
            LogFile::open(&d.path().join("log"), [6; 16], 3, &HostStorage, LOG_SIZE).unwrap();
        log.seal_after_commit(4);
        let _ = log.append(1, b"x");
    }

    #[test]
    fn record_buffers_are_reused_and_read_back_like_appends() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let (mut log, _) = LogFile::open(&p, [3; 16], 2, &HostStorage, LOG_SIZE).unwrap();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut rec = log.record_buffer();
        assert_eq!(rec, vec![0u8; HEADER_LEN], "header room, no payload");
        rec.extend_from_slice(&big);
        log.append_record(10, rec).unwrap();
        // The next buffer is the last one's memory, emptied.
        let rec = log.record_buffer();
        assert_eq!(rec.len(), HEADER_LEN);
        assert!(rec.capacity() >= HEADER_LEN + big.len());
        log.recycle(rec);
        log.append(11, b"small").unwrap();
        drop(log);
        let recs = LogFile::open(&p, [3; 16], 2, &HostStorage, LOG_SIZE)
            .unwrap()
            .1;
        let got: Vec<_> = recs.iter().map(|(h, p)| (h.seq, h.next_ino, p)).collect();
        assert_eq!(got, vec![(0, 10, &big), (1, 11, &b"small".to_vec())]);
    }

    #[test]
    fn a_record_that_does_not_fit_is_refused_and_breaks_the_log_until_a_commit() {
        let d = tempfile::tempdir().unwrap();
        let (mut log, _) =
            LogFile::open(&d.path().join("log"), [1; 16], 1, &HostStorage, LOG_SIZE).unwrap();
        let big = vec![1u8; log.region_len() as usize];
        assert!(matches!(log.append(1, &big), Err(LogError::Full)));
        assert!(log.is_empty_on(1));
        assert!(log.is_broken(), "its changes are in no record");
        log.seal(2);
        log.committed(2);
        assert!(!log.is_broken(), "the commit holds them");
    }

    /// A log written by version 1 (one region over the whole file) and
    /// left by a crash is read whole, past the middle of the file.
    #[test]
    fn a_version_1_log_is_read() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let uuid = [4; 16];
        drop(LogFile::open(&p, uuid, 8, &HostStorage, LOG_SIZE).unwrap());
        let mut raw = Vec::new();
        // Longer than a region of a legacy log (16 MiB).
        let payloads = [vec![5u8; (LEGACY_LOG_SIZE / 2) as usize], b"tail".to_vec()];
        for (seq, pl) in payloads.iter().enumerate() {
            let h = RecordHead {
                uuid,
                base_tid: 8,
                seq: seq as u64,
                next_ino: 9,
            };
            let mut rec = encode_head(&h, pl.len(), VERSION_ONE_REGION).to_vec();
            rec.extend_from_slice(pl);
            let sum = checksum(&rec[..HEADER_LEN], pl);
            rec[56..60].copy_from_slice(&sum.to_le_bytes());
            raw.extend_from_slice(&rec);
        }
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&raw, 0).unwrap();
        let got: Vec<_> = payloads_of(&p, uuid, 8);
        assert_eq!(got, payloads.to_vec());
    }

    /// A log made before logs grew (32 MiB, regions of 16 MiB) is read
    /// with that layout while it has records to replay, its second region
    /// included; once none applies, opening it makes it again at the size
    /// asked for, and records then go to regions of half that.
    #[test]
    fn a_legacy_log_is_read_as_it_is_and_grown_once_it_has_nothing_to_replay() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let uuid = [9; 16];
        let legacy = LEGACY_LOG_SIZE / 2;
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(LEGACY_LOG_SIZE).unwrap();
        // Region 0 on TID 3 (committed since), region 1 on TID 4.
        for (region, base, pl) in [(0, 3, b"old".as_slice()), (1, 4, b"on 4".as_slice())] {
            let h = RecordHead {
                uuid,
                base_tid: base,
                seq: 0,
                next_ino: 2,
            };
            let mut rec = encode_head(&h, pl.len(), VERSION_UNMIRRORED).to_vec();
            rec.extend_from_slice(pl);
            let sum = checksum(&rec[..HEADER_LEN], pl);
            rec[56..60].copy_from_slice(&sum.to_le_bytes());
            f.write_all_at(&rec, region * legacy).unwrap();
        }
        drop(f);
        let (log, recs) = LogFile::open(&p, uuid, 4, &HostStorage, LOG_SIZE).unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].1, b"on 4");
        assert_eq!((log.region_len(), log.region), (legacy, 1));
        drop(log);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), LEGACY_LOG_SIZE);
        // TID 4 committed: nothing applies, the log grows.
        let (mut log, recs) = LogFile::open(&p, uuid, 4 + 1, &HostStorage, LOG_SIZE).unwrap();
        assert!(recs.is_empty());
        assert_eq!(log.region_len(), LOG_SIZE / 2);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), LOG_SIZE);
        let big = vec![7u8; (legacy + (1 << 20)) as usize];
        log.append(3, &big).unwrap();
        log.seal(6);
        log.append(3, b"after").unwrap();
        drop(log);
        let got = payloads_of(&p, uuid, 5);
        assert_eq!(got, vec![big, b"after".to_vec()]);
        // A smaller size asked for (`intent_log_mib` lowered): made again at
        // that size too, once nothing applies.
        let (log, _) = LogFile::open(&p, uuid, 7, &HostStorage, LEGACY_LOG_SIZE).unwrap();
        assert_eq!(log.region_len(), legacy);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), LEGACY_LOG_SIZE);
    }

    /// A log on TID 5 holding records "r0".."r4" (each 66 bytes in the
    /// log), and where each starts in the file.
    fn five_records(p: &Path) -> Vec<u64> {
        let (mut log, _) = LogFile::open(p, [7; 16], 5, &HostStorage, LOG_SIZE).unwrap();
        let mut at = Vec::new();
        for i in 0..5 {
            at.push(log.region * log.region_len + log.pos);
            log.append(1, format!("r{i}").as_bytes()).unwrap();
        }
        at
    }

    fn damage(p: &Path, at: u64) {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(&[0xff; 16], at).unwrap();
    }

    fn open_on_5(p: &Path, on: OnDamage) -> Result<(LogFile, Vec<Record>), LogError> {
        LogFile::open_with(p, [7; 16], 5, &HostStorage, LOG_SIZE, on)
    }

    /// Each record is also at its place in the region's second half: damage
    /// to one place (payload or header) loses nothing.
    #[test]
    fn a_record_damaged_in_one_place_is_read_from_its_copy() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let at = five_records(&p);
        let half = LOG_SIZE / 4;
        damage(&p, at[1] + HEADER_LEN as u64);
        damage(&p, at[2] + 8);
        damage(&p, at[3] + half + 40);
        let recs = open_on_5(&p, OnDamage::Refuse).unwrap().1;
        let got: Vec<_> = recs.iter().map(|r| r.1.clone()).collect();
        let want: Vec<_> = (0..5).map(|i| format!("r{i}").into_bytes()).collect();
        assert_eq!(got, want);
    }

    /// A record damaged in both places with valid records after it is
    /// damage, not a torn tail: the open refuses, naming the record; told
    /// to discard, it gives the records before and wipes the rest, so that
    /// a later open finds a clean log.
    #[test]
    fn damage_in_both_places_before_valid_records_refuses_or_is_discarded() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let at = five_records(&p);
        let half = LOG_SIZE / 4;
        damage(&p, at[2] + HEADER_LEN as u64);
        damage(&p, at[2] + half);
        let Err(LogError::Damaged(dmg)) = open_on_5(&p, OnDamage::Refuse) else {
            panic!("damage taken for a torn tail");
        };
        assert_eq!((dmg.first_lost, dmg.base_tid, dmg.region), (2, 5, 0));
        let after: Vec<_> = dmg.after.iter().map(|r| r.0.seq).collect();
        assert_eq!(after, vec![3, 4]);
        assert!(dmg.to_string().contains("record 2"), "{dmg}");
        let (log, recs) = open_on_5(&p, OnDamage::Discard).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(log.discarded.as_ref().map(|d| d.first_lost), Some(2));
        assert_eq!((log.pos, log.seq), (at[2], 2));
        drop(log);
        let (log, recs) = open_on_5(&p, OnDamage::Refuse).unwrap();
        assert_eq!((recs.len(), log.discarded.is_none()), (2, true));
    }

    /// The first record damaged in both places, others after it: damage.
    /// The last one damaged in both places: a torn tail, not damage.
    #[test]
    fn the_first_record_damaged_is_damage_and_the_last_a_torn_tail() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let at = five_records(&p);
        let half = LOG_SIZE / 4;
        damage(&p, at[4] + HEADER_LEN as u64);
        damage(&p, at[4] + half + HEADER_LEN as u64);
        assert_eq!(open_on_5(&p, OnDamage::Refuse).unwrap().1.len(), 4);
        damage(&p, at[0]);
        damage(&p, at[0] + half);
        let Err(LogError::Damaged(dmg)) = open_on_5(&p, OnDamage::Refuse) else {
            panic!("damage of the first record taken for an empty log");
        };
        assert_eq!((dmg.first_lost, dmg.after.len()), (0, 3));
    }

    fn payloads_of(p: &Path, uuid: [u8; 16], tid: u64) -> Vec<Vec<u8>> {
        payloads(p, uuid, tid).into_iter().map(|r| r.2).collect()
    }
}
