//! The bodies of the stream's frames (docs/FORMAT.md, "Mirror streams"),
//! each with its encoder and a decoder that checks every length.

use crate::error::{Result, StreamError};
use crate::frame::{len16, len32, Body};
use cairn_fs::replica::{Change, ChunkIn, Event, StoredChunk};

/// Format version of the streams of a plain pool.
pub const VERSION: u16 = 1;
/// Format version of the streams of an encrypted pool (sealed end to end):
/// version 1's header followed by the source's key block, and sealed
/// creations (event change 2).
pub const VERSION_SEALED: u16 = 2;
const MAGIC: &[u8; 8] = b"cairn-ms";
const KEYBLOCK_LEN: usize = cairn_crypt::KEYBLOCK_LEN;

/// What the stream is: whose changes, after and up to which TID, and, for
/// an encrypted pool's, its key block (wrapped, as on the source's disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub source: [u8; 16],
    pub since: u64,
    pub upto: u64,
    pub key_block: Option<[u8; KEYBLOCK_LEN]>,
}

impl Header {
    /// True for a stream of an encrypted pool.
    pub fn is_sealed(&self) -> bool {
        self.key_block.is_some()
    }

    pub fn encode(&self) -> Vec<u8> {
        // `decode` refuses a range that ends before it starts.
        assert!(
            self.since <= self.upto,
            "stream header {:#x}..{:#x}",
            self.since,
            self.upto
        );
        let version = match self.key_block {
            Some(_) => VERSION_SEALED,
            None => VERSION,
        };
        let mut b = Vec::with_capacity(42 + KEYBLOCK_LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&self.source);
        b.extend_from_slice(&self.since.to_le_bytes());
        b.extend_from_slice(&self.upto.to_le_bytes());
        if let Some(k) = &self.key_block {
            b.extend_from_slice(k);
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Header> {
        let mut c = Body::new(b, "header");
        if c.bytes(8)? != MAGIC {
            return Err(StreamError::Damaged("not a Cairn mirror stream".into()));
        }
        let v = c.u16()?;
        if v != VERSION && v != VERSION_SEALED {
            return Err(StreamError::Refused(format!(
                "stream format version {v}; this cairn reads versions {VERSION} and {VERSION_SEALED}"
            )));
        }
        let source = c.array::<16>()?;
        let (since, upto) = (c.u64()?, c.u64()?);
        let key_block = match v {
            VERSION_SEALED => Some(c.array::<KEYBLOCK_LEN>()?),
            _ => None,
        };
        c.done()?;
        if since > upto {
            return Err(StreamError::Damaged(format!(
                "TID range {since:#x}..{upto:#x}"
            )));
        }
        Ok(Header {
            source,
            since,
            upto,
            key_block,
        })
    }
}

pub fn encode_tids(tids: &[(u64, u64)]) -> Vec<u8> {
    // The mirror logs each TID once, in order (`MetaWrite::log_tid`).
    debug_assert!(
        tids.windows(2).all(|w| w[0].0 < w[1].0),
        "TIDs out of order"
    );
    let mut b = len32(tids.len()).to_vec();
    for (t, time) in tids {
        b.extend_from_slice(&t.to_le_bytes());
        b.extend_from_slice(&time.to_le_bytes());
    }
    b
}

pub fn decode_tids(b: &[u8]) -> Result<Vec<(u64, u64)>> {
    let mut c = Body::new(b, "tids");
    let n = c.count(16)?;
    let v = (0..n)
        .map(|_| Ok((c.u64()?, c.u64()?)))
        .collect::<Result<_>>()?;
    c.done()?;
    Ok(v)
}

pub fn encode_chunk(c: &ChunkIn) -> Vec<u8> {
    let data = c.data.as_ref();
    let mut b = Vec::with_capacity(46 + data.map_or(0, |d| d.stored.len()));
    b.extend_from_slice(&c.src.to_le_bytes());
    b.extend_from_slice(&c.hash);
    b.push(data.is_some() as u8);
    if let Some(d) = data {
        b.push(d.method);
        b.extend_from_slice(&d.raw_len.to_le_bytes());
        b.extend_from_slice(&d.stored);
    }
    b
}

pub fn decode_chunk(b: &[u8]) -> Result<ChunkIn> {
    let mut c = Body::new(b, "chunk");
    let src = c.u64()?;
    let hash: [u8; 32] = c.array()?;
    let data = match c.u8()? {
        0 => None,
        1 => Some(StoredChunk {
            hash,
            method: c.u8()?,
            raw_len: c.u32()?,
            stored: c.rest().to_vec(),
        }),
        n => return Err(StreamError::Damaged(format!("chunk frame: flag {n}"))),
    };
    c.done()?;
    Ok(ChunkIn { src, hash, data })
}

pub fn encode_event(e: &Event) -> Vec<u8> {
    let (change, payload): (u8, &[u8]) = match &e.change {
        Change::End => (0, &[]),
        Change::Create(p) => (1, p),
        Change::Sealed(p) => (2, p),
    };
    // The key's length is a u16 (`len16` refuses a longer one, which
    // would shift the payload).
    let mut b = Vec::with_capacity(19 + e.key.len() + payload.len());
    b.extend_from_slice(&e.tid.to_le_bytes());
    b.extend_from_slice(&e.create_tid.to_le_bytes());
    b.push(change);
    b.extend_from_slice(&len16(e.key.len()));
    b.extend_from_slice(&e.key);
    b.extend_from_slice(payload);
    b
}

pub fn decode_event(b: &[u8]) -> Result<Event> {
    let mut c = Body::new(b, "event");
    let (tid, create_tid) = (c.u64()?, c.u64()?);
    let create = c.u8()?;
    let key_len = c.u16()? as usize;
    let key = c.bytes(key_len)?.to_vec();
    let change = match create {
        0 => Change::End,
        1 => Change::Create(c.rest().to_vec()),
        2 => Change::Sealed(c.rest().to_vec()),
        n => return Err(StreamError::Damaged(format!("event frame: change {n}"))),
    };
    c.done()?;
    let ordered = match change {
        Change::End => create_tid < tid,
        Change::Create(_) | Change::Sealed(_) => create_tid == tid,
    };
    if !ordered || key.is_empty() {
        return Err(StreamError::Damaged(format!(
            "event at TID {tid:#x} for an element created at {create_tid:#x}"
        )));
    }
    Ok(Event {
        tid,
        key,
        create_tid,
        change,
    })
}

/// A batch ends: the mirror's TID becomes `upto`.
pub fn encode_commit(upto: u64, next_ino: u64) -> Vec<u8> {
    [upto.to_le_bytes(), next_ino.to_le_bytes()].concat()
}

pub fn decode_commit(b: &[u8]) -> Result<(u64, u64)> {
    let mut c = Body::new(b, "commit");
    let v = (c.u64()?, c.u64()?);
    c.done()?;
    Ok(v)
}

pub fn encode_snapshots(snaps: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = len32(snaps.len()).to_vec();
    for (name, rec) in snaps {
        b.extend_from_slice(&len16(name.len()));
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&len32(rec.len()));
        b.extend_from_slice(rec);
    }
    b
}

pub fn decode_snapshots(b: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut c = Body::new(b, "snapshots");
    let n = c.count(6)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let len = c.u16()? as usize;
        let name = String::from_utf8(c.bytes(len)?.to_vec())
            .map_err(|_| StreamError::Damaged("snapshot name is not UTF-8".into()))?;
        let len = c.u32()? as usize;
        v.push((name, c.bytes(len)?.to_vec()));
    }
    c.done()?;
    Ok(v)
}

/// The stream's last frame: its final TID and the number of frames before.
pub fn encode_end(upto: u64, frames: u64) -> Vec<u8> {
    [upto.to_le_bytes(), frames.to_le_bytes()].concat()
}

pub fn decode_end(b: &[u8]) -> Result<(u64, u64)> {
    let mut c = Body::new(b, "end");
    let v = (c.u64()?, c.u64()?);
    c.done()?;
    Ok(v)
}

/// Inodes unlinked while still open on the source.
pub fn encode_orphans(inos: &[u64]) -> Vec<u8> {
    let mut b = len32(inos.len()).to_vec();
    for i in inos {
        b.extend_from_slice(&i.to_le_bytes());
    }
    b
}

pub fn decode_orphans(b: &[u8]) -> Result<Vec<u64>> {
    let mut c = Body::new(b, "orphans");
    let n = c.count(8)?;
    let v = (0..n).map(|_| c.u64()).collect::<Result<_>>()?;
    c.done()?;
    Ok(v)
}
