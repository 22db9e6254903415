//! The volume record: the xattr `user.cairn.volume` on a volume's file,
//! `ver u8 (1) | block_size u32 | created_ns u64 | crc32c u32` (little
//! endian; the checksum covers the bytes before it).

use crate::error::{FsError, Result};

pub(crate) const XATTR: &[u8] = b"user.cairn.volume";
const VERSION: u8 = 1;
const LEN: usize = 1 + 4 + 8 + 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VolumeRecord {
    pub block_size: u32,
    pub created_ns: u64,
}

impl VolumeRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(LEN);
        b.push(VERSION);
        b.extend_from_slice(&self.block_size.to_le_bytes());
        b.extend_from_slice(&self.created_ns.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<VolumeRecord> {
        let bad = |why: &str| FsError::Io(format!("volume record: {why}"));
        if b.len() != LEN {
            return Err(bad(&format!("{} bytes, expected {LEN}", b.len())));
        }
        let (body, crc) = b.split_at(LEN - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(bad("checksum mismatch"));
        }
        if body[0] != VERSION {
            return Err(bad(&format!("unknown version {}", body[0])));
        }
        Ok(VolumeRecord {
            block_size: u32::from_le_bytes(body[1..5].try_into().expect("4 bytes")),
            created_ns: u64::from_le_bytes(body[5..13].try_into().expect("8 bytes")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_damage_is_refused() {
        let r = VolumeRecord {
            block_size: 16384,
            created_ns: 1_700_000_000_123,
        };
        let b = r.encode();
        assert_eq!(VolumeRecord::decode(&b).unwrap(), r);
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert!(VolumeRecord::decode(&d).is_err(), "byte {i} flipped");
        }
        assert!(VolumeRecord::decode(&b[..LEN - 1]).is_err());
    }
}
