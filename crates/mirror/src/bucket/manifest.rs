//! The manifest of a mirror kept in a bucket (docs/FORMAT.md, "Mirrors in
//! a bucket"): which pool it mirrors, the bucket mirror's own id (its hold
//! on the source), and the chain of streams that rebuild the pool, each
//! with its TID range, size and BLAKE3 hash. It is written last, after
//! every object it names, so a copy cut off anywhere leaves the previous
//! manifest, and the chain it names, whole.

use crate::error::{Result, StreamError};
use crate::frame::Body;

const MAGIC: &[u8; 8] = b"cairn-mb";
/// Format version of manifests written now.
pub const MANIFEST_VERSION: u16 = 1;
/// Streams a chain holds at most (a copy a minute for ten years).
const MAX_STREAMS: usize = 1 << 23;

/// One stream object of the chain: the changes after `since` up to
/// `upto`, `bytes` long, with this BLAKE3 hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub since: u64,
    pub upto: u64,
    pub bytes: u64,
    pub hash: [u8; 32],
}

impl Entry {
    /// The object's name under the bucket prefix.
    pub fn key(&self) -> String {
        stream_key(self.since, self.upto)
    }
}

pub fn stream_key(since: u64, upto: u64) -> String {
    format!("stream-{since:016x}-{upto:016x}")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The bucket mirror's id (the name of its hold on the source).
    pub id: [u8; 16],
    /// The pool it mirrors.
    pub source: [u8; 16],
    /// Chunk objects uploaded so far (how large a LIST of them is).
    pub chunks: u64,
    /// From TID 0, each stream starting where the one before ended.
    pub streams: Vec<Entry>,
}

impl Manifest {
    /// The TID the chain reaches (0 when empty).
    pub fn upto(&self) -> u64 {
        self.streams.last().map_or(0, |e| e.upto)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(48 + 56 * self.streams.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        b.extend_from_slice(&self.id);
        b.extend_from_slice(&self.source);
        b.extend_from_slice(&self.chunks.to_le_bytes());
        b.extend_from_slice(&crate::frame::len32(self.streams.len()));
        for e in &self.streams {
            b.extend_from_slice(&e.since.to_le_bytes());
            b.extend_from_slice(&e.upto.to_le_bytes());
            b.extend_from_slice(&e.bytes.to_le_bytes());
            b.extend_from_slice(&e.hash);
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a manifest: magic, version, checksum, lengths
    /// and an unbroken chain from TID 0.
    pub fn decode(b: &[u8]) -> Result<Manifest> {
        let damaged = |why: &str| StreamError::Damaged(format!("bucket manifest: {why}"));
        let body = super::unseal(b, MAGIC, "bucket manifest", "mirror manifest")?;
        let mut c = Body::new(body, "manifest");
        let v = c.u16()?;
        if v != MANIFEST_VERSION {
            return Err(StreamError::Refused(format!(
                "bucket manifest format version {v}; this cairn reads version {MANIFEST_VERSION}"
            )));
        }
        let id = c.array()?;
        let source = c.array()?;
        let chunks = c.u64()?;
        let n = c.count(56)?;
        if n > MAX_STREAMS {
            return Err(damaged("too many streams"));
        }
        let mut streams: Vec<Entry> = Vec::with_capacity(n);
        for _ in 0..n {
            let e = Entry {
                since: c.u64()?,
                upto: c.u64()?,
                bytes: c.u64()?,
                hash: c.array()?,
            };
            let from = streams.last().map_or(0, |p| p.upto);
            if e.since != from || e.upto <= e.since {
                return Err(damaged(&format!(
                    "a stream {:#x}..{:#x} where the chain is at {from:#x}",
                    e.since, e.upto
                )));
            }
            streams.push(e);
        }
        c.done()?;
        Ok(Manifest {
            id,
            source,
            chunks,
            streams,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let e = |since, upto| Entry {
            since,
            upto,
            bytes: upto * 10,
            hash: [upto.to_le_bytes()[0]; 32],
        };
        Manifest {
            id: [1; 16],
            source: [2; 16],
            chunks: 77,
            streams: vec![e(0, 5), e(5, 9), e(9, 30)],
        }
    }

    #[test]
    fn round_trip_and_every_flipped_byte_is_refused() {
        let m = sample();
        let b = m.encode();
        assert_eq!(Manifest::decode(&b).unwrap(), m);
        assert_eq!(m.upto(), 30);
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x40;
            assert!(Manifest::decode(&d).is_err(), "byte {i} flipped was taken");
        }
        for n in 0..b.len() {
            assert!(Manifest::decode(&b[..n]).is_err(), "{n} bytes were taken");
        }
        // The magic and a few bytes: refused, never a panic.
        for n in 8..12 {
            assert!(Manifest::decode(&b"cairn-mb\0\0\0\0"[..n]).is_err());
        }
    }

    #[test]
    fn a_broken_chain_is_refused_even_with_a_good_checksum() {
        let mut m = sample();
        m.streams[1].since = 6;
        assert!(Manifest::decode(&m.encode()).is_err());
        let mut m = sample();
        m.streams[0].since = 1;
        assert!(Manifest::decode(&m.encode()).is_err());
        let mut m = sample();
        m.streams[2].upto = 9;
        assert!(Manifest::decode(&m.encode()).is_err());
    }
}
