//! The intent log's file: a preallocated file beside the metadata store
//! that fsync appends records to (one write and one fdatasync each) and
//! that a flush retires as a whole once its commit holds what the records
//! said. Each record names the pool, the TID it applies on top of and its
//! place in the sequence, and carries a checksum, so a torn record, a stale
//! one from before the last commit and one of another pool are all ignored.
//! Layout in docs/FORMAT.md ("Intent log"). The file is opened through the
//! pool's storage (`cairn_devices::Storage`).

use cairn_devices::{Backend, OpenHow, Storage};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const MAGIC: [u8; 8] = *b"CAIRNIL\0";
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 64;
/// Size of the log file; a record that does not fit makes fsync flush.
pub const LOG_SIZE: u64 = 32 << 20;

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

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("intent log {0}: {1}")]
    Io(PathBuf, io::Error),
    #[error("intent log full")]
    Full,
    /// Where the valid records end: what follows is not one.
    #[error("no intent record here: {0}")]
    NoRecord(&'static str),
}

/// The open log, where the next record goes.
pub struct LogFile {
    path: PathBuf,
    file: Arc<dyn Backend>,
    uuid: [u8; 16],
    base_tid: u64,
    pos: u64,
    seq: u64,
    /// The last record's buffer, for the next (`record_buffer`).
    spare: Vec<u8>,
}

impl LogFile {
    /// Opens (creating and zero-filling when missing or short) the log at
    /// `path` and returns it with the payloads of the records that apply on
    /// top of `last_tid`, in order. New records go after those.
    pub fn open(
        path: &Path,
        uuid: [u8; 16],
        last_tid: u64,
        storage: &dyn Storage,
    ) -> Result<(Self, Vec<Record>), LogError> {
        let err = |e| LogError::Io(path.to_path_buf(), e);
        let file = storage.open(path, &OpenHow::CREATE).map_err(err)?;
        if file.len().map_err(err)? < LOG_SIZE {
            // Written once, so that appends overwrite allocated blocks and
            // fdatasync has no file metadata to commit.
            if let Err(e) = zero_fill(&*file) {
                let _ = std::fs::remove_file(path);
                return Err(err(e));
            }
        }
        let mut log = LogFile {
            path: path.to_path_buf(),
            file,
            uuid,
            base_tid: last_tid,
            pos: 0,
            seq: 0,
            spare: Vec::new(),
        };
        let recs = log.scan().map_err(err)?;
        Ok((log, recs))
    }

    /// Reads the valid records in order from the start: each must belong
    /// to this pool and `base_tid`, have the next sequence number and a
    /// good checksum. Leaves `pos` and `seq` after the last one.
    fn scan(&mut self) -> io::Result<Vec<Record>> {
        let mut out = Vec::new();
        loop {
            let mut h = [0u8; HEADER_LEN];
            if self.pos + HEADER_LEN as u64 > LOG_SIZE {
                break;
            }
            self.file.read_at(&mut h, self.pos)?;
            let Ok((head, len)) = parse_head(&h) else {
                break;
            };
            if head.uuid != self.uuid || head.base_tid != self.base_tid || head.seq != self.seq {
                break;
            }
            let end = self.pos + (HEADER_LEN + len) as u64;
            if end > LOG_SIZE {
                break;
            }
            let mut payload = vec![0u8; len];
            self.file
                .read_at(&mut payload, self.pos + HEADER_LEN as u64)?;
            if checksum(&h, &payload) != u32::from_le_bytes(h[56..60].try_into().unwrap()) {
                break;
            }
            out.push((head, payload));
            self.pos = end;
            self.seq += 1;
        }
        Ok(out)
    }

    /// True when no record was written since the last `reset`.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
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
    pub fn append(&mut self, base_tid: u64, next_ino: u64, payload: &[u8]) -> Result<(), LogError> {
        let mut rec = self.record_buffer();
        rec.extend_from_slice(payload);
        self.append_record(base_tid, next_ino, rec)
    }

    /// Writes `rec` (from `record_buffer`: header room, then the payload)
    /// as the next record and makes it durable before returning.
    pub fn append_record(
        &mut self,
        base_tid: u64,
        next_ino: u64,
        mut rec: Vec<u8>,
    ) -> Result<(), LogError> {
        assert!(
            rec.len() >= HEADER_LEN,
            "a record buffer starts with header room"
        );
        if self.pos == 0 {
            self.base_tid = base_tid;
        }
        assert_eq!(base_tid, self.base_tid, "intent record on a stale base");
        let len = rec.len() as u64;
        if self.pos + len > LOG_SIZE {
            self.recycle(rec);
            return Err(LogError::Full);
        }
        let head = RecordHead {
            uuid: self.uuid,
            base_tid,
            seq: self.seq,
            next_ino,
        };
        let head = encode_head(&head, rec.len() - HEADER_LEN);
        rec[..HEADER_LEN].copy_from_slice(&head);
        let sum = checksum(&rec[..HEADER_LEN], &rec[HEADER_LEN..]);
        rec[56..60].copy_from_slice(&sum.to_le_bytes());
        let written = self
            .file
            .write_at(&rec, self.pos)
            .and_then(|()| self.file.sync_data());
        self.recycle(rec);
        written.map_err(|e| LogError::Io(self.path.clone(), e))?;
        self.pos += len;
        self.seq += 1;
        Ok(())
    }

    /// Retires every record: `tid` is committed and holds them. Nothing is
    /// written; the next record starts at offset 0 on top of `tid`, and the
    /// old ones beyond it name an older TID.
    pub fn reset(&mut self, tid: u64) {
        self.base_tid = tid;
        self.pos = 0;
        self.seq = 0;
    }
}

fn zero_fill(f: &dyn Backend) -> io::Result<()> {
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < LOG_SIZE {
        f.write_at(&zeros, at)?;
        at += zeros.len() as u64;
    }
    f.sync_data()
}

fn encode_head(h: &RecordHead, len: usize) -> [u8; HEADER_LEN] {
    let mut b = Vec::with_capacity(HEADER_LEN);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
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

/// A record's header fields and payload length (at most what the log
/// can hold after the header).
fn parse_head(b: &[u8; HEADER_LEN]) -> Result<(RecordHead, usize), LogError> {
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    if b[..8] != MAGIC || u16::from_le_bytes([b[8], b[9]]) != VERSION {
        return Err(LogError::NoRecord("no record magic or version"));
    }
    let len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
    if len as u64 > LOG_SIZE - HEADER_LEN as u64 {
        return Err(LogError::NoRecord("payload longer than the log"));
    }
    let head = RecordHead {
        uuid: b[16..32].try_into().unwrap(),
        base_tid: u64_at(32),
        seq: u64_at(40),
        next_ino: u64_at(48),
    };
    Ok((head, len))
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
mod tests {
    use super::*;
    use cairn_devices::HostStorage;
    use std::os::unix::fs::FileExt;

    #[test]
    fn records_survive_reopen_until_reset_and_torn_ones_are_dropped() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let uuid = [7u8; 16];
        let (mut log, recs) = LogFile::open(&p, uuid, 5, &HostStorage).unwrap();
        assert!(recs.is_empty());
        log.append(5, 100, b"first").unwrap();
        log.append(5, 101, b"second").unwrap();
        drop(log);
        let (mut log, recs) = LogFile::open(&p, uuid, 5, &HostStorage).unwrap();
        let got: Vec<_> = recs
            .iter()
            .map(|(h, p)| (h.seq, h.next_ino, p.clone()))
            .collect();
        assert_eq!(
            got,
            vec![(0, 100, b"first".to_vec()), (1, 101, b"second".to_vec())]
        );
        // Appends go after the replayed records.
        log.append(5, 102, b"third").unwrap();
        let end = log.pos;
        drop(log);
        // Another pool, or a later TID, sees none of them.
        assert!(LogFile::open(&p, [8u8; 16], 5, &HostStorage)
            .unwrap()
            .1
            .is_empty());
        assert!(LogFile::open(&p, uuid, 6, &HostStorage)
            .unwrap()
            .1
            .is_empty());
        // A torn last record: the ones before it stay.
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(b"X", end - 2).unwrap();
        let (mut log, recs) = LogFile::open(&p, uuid, 5, &HostStorage).unwrap();
        assert_eq!(recs.len(), 2);
        // After a reset on TID 6, the old records are stale.
        log.reset(6);
        log.append(6, 103, b"new").unwrap();
        drop(log);
        let recs = LogFile::open(&p, uuid, 6, &HostStorage).unwrap().1;
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].1, b"new");
        assert!(LogFile::open(&p, uuid, 5, &HostStorage)
            .unwrap()
            .1
            .is_empty());
    }

    #[test]
    fn record_buffers_are_reused_and_read_back_like_appends() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let (mut log, _) = LogFile::open(&p, [3; 16], 2, &HostStorage).unwrap();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut rec = log.record_buffer();
        assert_eq!(rec, vec![0u8; HEADER_LEN], "header room, no payload");
        rec.extend_from_slice(&big);
        log.append_record(2, 10, rec).unwrap();
        // The next buffer is the last one's memory, emptied.
        let rec = log.record_buffer();
        assert_eq!(rec.len(), HEADER_LEN);
        assert!(rec.capacity() >= HEADER_LEN + big.len());
        log.recycle(rec);
        log.append(2, 11, b"small").unwrap();
        drop(log);
        let recs = LogFile::open(&p, [3; 16], 2, &HostStorage).unwrap().1;
        let got: Vec<_> = recs.iter().map(|(h, p)| (h.seq, h.next_ino, p)).collect();
        assert_eq!(got, vec![(0, 10, &big), (1, 11, &b"small".to_vec())]);
    }

    #[test]
    fn a_record_that_does_not_fit_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFile::open(&d.path().join("log"), [1; 16], 1, &HostStorage).unwrap();
        let big = vec![1u8; LOG_SIZE as usize];
        assert!(matches!(log.append(1, 1, &big), Err(LogError::Full)));
        assert!(log.is_empty());
    }
}
