//! Encoding of the dedup index (table dedup_v2) and the conversion of the
//! first index format (dedup_v1).
//!
//! An entry is 12 bytes: the first 6 bytes of a chunk's BLAKE3 as the key and
//! a 48-bit chunk id as the value, about 17 bytes per unique block with the
//! B-tree's pages (measured by tests/dedup_index.rs). An entry is a
//! candidate, never trusted alone: the filesystem layer confirms it against
//! the full hash in the chunk record before it references the chunk. Two
//! contents whose hashes share 6 bytes (expected about 18 such pairs among
//! 10^8 unique blocks) only cost a missed dedup for one of them.

use crate::error::{MetaError, Result};
use crate::tables::{DEDUP, DEDUP_V1};
use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};

/// Chunk ids at or above this do not fit an entry and are not indexed
/// (2^48 chunks is 16 EiB of 64 KiB blocks, so this is a guard only).
pub const MAX_INDEXED_CHUNK: u64 = 1 << 48;

/// Bytes of the hash that key the index.
pub const KEY_LEN: usize = 6;

/// The index key of a content hash.
pub fn key(hash: &[u8]) -> [u8; KEY_LEN] {
    assert!(
        hash.len() >= KEY_LEN,
        "dedup key needs {KEY_LEN} hash bytes"
    );
    hash[..KEY_LEN]
        .try_into()
        .expect("slice length matches the array")
}

pub fn encode(chunk: u64) -> [u8; 6] {
    assert!(chunk < MAX_INDEXED_CHUNK, "chunk id {chunk} too large");
    let b = chunk.to_le_bytes();
    [b[0], b[1], b[2], b[3], b[4], b[5]]
}

pub fn decode(v: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&v);
    u64::from_le_bytes(b)
}

/// Decodes a dedup_v1 value: ver 1 | chunk id u64 | crc32c.
fn decode_v1(hash: &[u8], b: &[u8]) -> Result<u64> {
    let ok = b.len() == 13 && b[0] == 1 && crc32c::crc32c(&b[..9]).to_le_bytes() == b[9..13];
    if !ok {
        return Err(MetaError::Corrupt {
            key: format!("dedup_v1 {:02x?}", &hash[..4.min(hash.len())]),
            why: "bad dedup index entry (version or checksum)".into(),
        });
    }
    Ok(u64::from_le_bytes(
        b[1..9].try_into().expect("slice length matches the array"),
    ))
}

/// Moves every dedup_v1 entry into dedup_v2 and deletes dedup_v1, inside
/// the caller's transaction (so a crash leaves one format or the other).
pub fn convert_v1(txn: &WriteTransaction) -> Result<u64> {
    let mut moved = 0;
    {
        let old = match txn.open_table(DEDUP_V1) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        if old.is_empty()? {
            drop(old);
            txn.delete_table(DEDUP_V1)?;
            return Ok(0);
        }
        let mut new = txn.open_table(DEDUP)?;
        for r in old.iter()? {
            let (k, v) = r?;
            let id = decode_v1(k.value(), v.value())?;
            // A stored key is input: one too short is damage, not a panic
            // of `key`.
            if k.value().len() < KEY_LEN {
                return Err(MetaError::Corrupt {
                    key: format!("dedup_v1 {:02x?}", k.value()),
                    why: "dedup index key shorter than its hash prefix".into(),
                });
            }
            if id < MAX_INDEXED_CHUNK {
                new.insert(key(k.value()), encode(id))?;
                moved += 1;
            }
        }
    }
    txn.delete_table(DEDUP_V1)?;
    Ok(moved)
}

pub mod pending;

#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trips_48_bit_ids() {
        for id in [0, 1, 0x1234_5678_9abc, MAX_INDEXED_CHUNK - 1] {
            assert_eq!(decode(encode(id)), id);
        }
    }

    #[test]
    fn key_is_the_first_six_bytes() {
        let mut h = [0u8; 32];
        h[0] = 0x80;
        h[5] = 1;
        h[6] = 0xff;
        assert_eq!(key(&h), [0x80, 0, 0, 0, 0, 1]);
    }
}
