//! The pool superblock: `POOL/superblock`, 4 KiB, written once at mkfs.
//!
//! ```text
//! 0   magic "CAIRNPOL"        8
//! 8   format version u32      4
//! 12  record size u32         4
//! 16  pool uuid               16
//! 32  segment size u64        8
//! 40  created (unix secs) u64 8
//! 48  crc32c of bytes 0..48   4
//! ```

use crate::error::{FsError, Result};

pub const POOL_MAGIC: &[u8; 8] = b"CAIRNPOL";
pub const POOL_FORMAT_VERSION: u32 = 1;
pub const SUPERBLOCK_LEN: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub uuid: [u8; 16],
    pub record_size: u32,
    pub segment_size: u64,
    pub created: u64,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_LEN];
        b[0..8].copy_from_slice(POOL_MAGIC);
        b[8..12].copy_from_slice(&POOL_FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.record_size.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.segment_size.to_le_bytes());
        b[40..48].copy_from_slice(&self.created.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..48]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8], what: &str) -> Result<Superblock> {
        if b.len() < 52 || &b[0..8] != POOL_MAGIC {
            return Err(FsError::NotAPool(format!("{what}: no Cairn superblock")));
        }
        if crc32c::crc32c(&b[0..48])
            != u32::from_le_bytes(
                b[48..52]
                    .try_into()
                    .expect("slice length matches the array"),
            )
        {
            return Err(FsError::NotAPool(format!(
                "{what}: superblock checksum mismatch (corrupt)"
            )));
        }
        let version =
            u32::from_le_bytes(b[8..12].try_into().expect("slice length matches the array"));
        if version != POOL_FORMAT_VERSION {
            return Err(FsError::UnknownVersion {
                found: version,
                known: POOL_FORMAT_VERSION,
            });
        }
        let sb = Superblock {
            record_size: u32::from_le_bytes(
                b[12..16]
                    .try_into()
                    .expect("slice length matches the array"),
            ),
            uuid: b[16..32]
                .try_into()
                .expect("slice length matches the array"),
            segment_size: u64::from_le_bytes(
                b[32..40]
                    .try_into()
                    .expect("slice length matches the array"),
            ),
            created: u64::from_le_bytes(
                b[40..48]
                    .try_into()
                    .expect("slice length matches the array"),
            ),
        };
        check_geometry(sb.record_size as u64, sb.segment_size)
            .map_err(|why| FsError::NotAPool(format!("{what}: {why}")))?;
        Ok(sb)
    }
}

/// The sizes mkfs accepts, that the layers above divide and size buffers
/// by: a record size that is a power of two from 4 KiB to 1 MiB and a
/// segment size that is a power of two, at least 4 records and at most
/// 1 GiB.
pub fn check_geometry(
    record_size: u64,
    segment_size: u64,
) -> std::result::Result<(), &'static str> {
    if !record_size.is_power_of_two() || !(4096..=(1 << 20)).contains(&record_size) {
        return Err("record size must be a power of two between 4K and 1M");
    }
    let seg = segment_size;
    if !seg.is_power_of_two() || seg < 4 * record_size || seg > (1 << 30) {
        return Err("segment size must be a power of two, >= 4 records and <= 1G");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_errors() {
        let s = Superblock {
            uuid: [3; 16],
            record_size: 65536,
            segment_size: 4 << 20,
            created: 1_700_000_000,
        };
        let mut b = s.encode();
        assert_eq!(Superblock::decode(&b, "t").unwrap(), s);
        b[8] = 9;
        let crc = crc32c::crc32c(&b[0..48]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Superblock::decode(&b, "t"),
            Err(FsError::UnknownVersion { found: 9, .. })
        ));
        b[20] ^= 1;
        assert!(matches!(
            Superblock::decode(&b, "t"),
            Err(FsError::NotAPool(_))
        ));
        assert!(matches!(
            Superblock::decode(b"hello", "t"),
            Err(FsError::NotAPool(_))
        ));
    }
}
