//! Chunk and segment records, as stored in the metadata store. Each value
//! starts with a format version byte and ends with a crc32c of what precedes.
//!
//! ChunkRec (v1, 64 bytes): ver u8 | segment u64 | offset u32 | len u32 |
//!   raw_len u32 | refs u64 | hash [32] | crc u32   (len includes the header)
//! SegmentRec (v1, 38 bytes): ver u8 | device u32 | slot u64 | used u32 |
//!   live u64 | chunks u64 | flags u8 | crc u32

use crate::chunk::Hash;
use crate::error::{DataError, Result};

const REC_VERSION: u8 = 1;

fn finish(mut b: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

fn check<'a>(what: &'static str, b: &'a [u8], len: usize) -> Result<&'a [u8]> {
    let bad = |why: &str| DataError::BadRecord {
        what,
        why: why.into(),
    };
    if b.len() != len {
        return Err(bad("wrong length"));
    }
    let (body, crc) = b.split_at(len - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
        return Err(bad("checksum mismatch"));
    }
    if body[0] != REC_VERSION {
        return Err(bad("unknown version"));
    }
    Ok(&body[1..])
}

fn rd<const N: usize>(b: &[u8], o: &mut usize) -> [u8; N] {
    let v = b[*o..*o + N].try_into().unwrap();
    *o += N;
    v
}

/// Where a chunk is and how many elements reference it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRec {
    pub segment: u64,
    pub offset: u32,
    /// Bytes on disk including the chunk header.
    pub len: u32,
    pub raw_len: u32,
    pub refs: u64,
    pub hash: Hash,
}

impl ChunkRec {
    pub const ENCODED_LEN: usize = 1 + 8 + 4 + 4 + 4 + 8 + 32 + 4;

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::ENCODED_LEN);
        b.push(REC_VERSION);
        b.extend_from_slice(&self.segment.to_le_bytes());
        b.extend_from_slice(&self.offset.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.raw_len.to_le_bytes());
        b.extend_from_slice(&self.refs.to_le_bytes());
        b.extend_from_slice(&self.hash);
        finish(b)
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let b = check("chunk", b, Self::ENCODED_LEN)?;
        let o = &mut 0;
        Ok(ChunkRec {
            segment: u64::from_le_bytes(rd(b, o)),
            offset: u32::from_le_bytes(rd(b, o)),
            len: u32::from_le_bytes(rd(b, o)),
            raw_len: u32::from_le_bytes(rd(b, o)),
            refs: u64::from_le_bytes(rd(b, o)),
            hash: rd(b, o),
        })
    }
}

/// A segment table entry: where the segment is and how much of it is live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRec {
    pub device: u32,
    pub slot: u64,
    /// Bytes appended (committed) so far.
    pub used: u32,
    /// Bytes of chunks still referenced.
    pub live: u64,
    /// Number of chunks still referenced.
    pub chunks: u64,
    pub flags: u8,
}

impl SegmentRec {
    pub const ENCODED_LEN: usize = 1 + 4 + 8 + 4 + 8 + 8 + 1 + 4;

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::ENCODED_LEN);
        b.push(REC_VERSION);
        b.extend_from_slice(&self.device.to_le_bytes());
        b.extend_from_slice(&self.slot.to_le_bytes());
        b.extend_from_slice(&self.used.to_le_bytes());
        b.extend_from_slice(&self.live.to_le_bytes());
        b.extend_from_slice(&self.chunks.to_le_bytes());
        b.push(self.flags);
        finish(b)
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let b = check("segment", b, Self::ENCODED_LEN)?;
        let o = &mut 0;
        Ok(SegmentRec {
            device: u32::from_le_bytes(rd(b, o)),
            slot: u64::from_le_bytes(rd(b, o)),
            used: u32::from_le_bytes(rd(b, o)),
            live: u64::from_le_bytes(rd(b, o)),
            chunks: u64::from_le_bytes(rd(b, o)),
            flags: rd::<1>(b, o)[0],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrips_and_checksums() {
        let c = ChunkRec {
            segment: 9,
            offset: 1234,
            len: 65592,
            raw_len: 65536,
            refs: 3,
            hash: [5; 32],
        };
        let mut b = c.encode();
        assert_eq!(ChunkRec::decode(&b).unwrap(), c);
        b[10] ^= 1;
        assert!(ChunkRec::decode(&b).is_err());
        let s = SegmentRec {
            device: 2,
            slot: 77,
            used: 4000,
            live: 3000,
            chunks: 2,
            flags: 0,
        };
        assert_eq!(SegmentRec::decode(&s.encode()).unwrap(), s);
    }
}
