//! The chunk: the unit of stored data. Each chunk is self-describing, so data
//! can be verified and relocated without the metadata (the lessfs lesson):
//!
//! ```text
//! 0   magic "CHNK"          4
//! 4   format version u8     1
//! 5   compression u8        1   0 = none (1 = lz4, 2 = zstd reserved)
//! 6   reserved u16          2
//! 8   raw length u32        4   bytes after decompression
//! 12  stored length u32     4   bytes that follow the header
//! 16  blake3 hash [32]      32  of the raw bytes
//! 48  data crc32c u32       4   of the stored bytes
//! 52  header crc32c u32     4   of bytes 0..52
//! 56  stored bytes ...
//! ```

use crate::compress::{compress, decompress, Compression};

pub const CHUNK_MAGIC: &[u8; 4] = b"CHNK";
pub const CHUNK_VERSION: u8 = 1;
pub const CHUNK_HEADER_LEN: usize = 56;

pub type Hash = [u8; 32];

/// The most raw bytes a chunk holds: one block of the largest record size.
/// A compressed chunk claiming more is damaged (its raw length sizes the
/// buffer it is expanded into).
pub const MAX_RAW_LEN: u32 = 1 << 20;

// The header's fields, in the order of the table above, fill it exactly.
const _: () = assert!(CHUNK_MAGIC.len() + 1 + 1 + 2 + 4 + 4 + 32 + 4 + 4 == CHUNK_HEADER_LEN);

/// Why a sealed chunk does not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("short header")]
    ShortHeader,
    #[error("bad magic")]
    BadMagic,
    #[error("header checksum mismatch")]
    HeaderChecksum,
    #[error("unknown chunk version {0}")]
    UnknownVersion(u8),
    #[error("chunk holds other content than the metadata expects")]
    OtherContent,
    #[error("stored length beyond chunk")]
    StoredBeyondChunk,
    #[error("data checksum mismatch")]
    DataChecksum,
    #[error("raw length differs from stored length")]
    RawLenMismatch,
    #[error("raw length {0} is more than a chunk holds")]
    RawTooLong(u32),
    #[error("{0}")]
    Decompress(String),
    #[error("content hash mismatch")]
    ContentHash,
    #[error("chunk is compressed, expected raw")]
    NotRaw,
}

pub fn hash_block(data: &[u8]) -> Hash {
    *blake3::hash(data).as_bytes()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkHeader {
    pub compression: u8,
    pub raw_len: u32,
    pub stored_len: u32,
    pub hash: Hash,
    pub data_crc: u32,
}

impl ChunkHeader {
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(CHUNK_MAGIC);
        out.push(CHUNK_VERSION);
        out.push(self.compression);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.raw_len.to_le_bytes());
        out.extend_from_slice(&self.stored_len.to_le_bytes());
        out.extend_from_slice(&self.hash);
        out.extend_from_slice(&self.data_crc.to_le_bytes());
        let crc = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(out.len() - start, CHUNK_HEADER_LEN);
    }

    pub fn decode(b: &[u8]) -> Result<Self, ChunkError> {
        if b.len() < CHUNK_HEADER_LEN {
            return Err(ChunkError::ShortHeader);
        }
        if &b[0..4] != CHUNK_MAGIC {
            return Err(ChunkError::BadMagic);
        }
        let crc = u32::from_le_bytes(
            b[52..56]
                .try_into()
                .expect("slice length matches the array"),
        );
        if crc != crc32c::crc32c(&b[0..52]) {
            return Err(ChunkError::HeaderChecksum);
        }
        if b[4] != CHUNK_VERSION {
            return Err(ChunkError::UnknownVersion(b[4]));
        }
        let u32_at = |o: usize| {
            u32::from_le_bytes(
                b[o..o + 4]
                    .try_into()
                    .expect("slice length matches the array"),
            )
        };
        Ok(ChunkHeader {
            compression: b[5],
            raw_len: u32_at(8),
            stored_len: u32_at(12),
            hash: b[16..48]
                .try_into()
                .expect("slice length matches the array"),
            data_crc: u32_at(48),
        })
    }
}

/// Builds the on-disk form of a block: header + stored bytes. Appends to `out`.
/// Appends a sealed chunk (header + stored bytes) to `out`, compressed
/// with `c` when that saves at least 1/8. Returns the sealed length.
pub fn seal(raw: &[u8], hash: &Hash, c: Compression, out: &mut Vec<u8>) -> usize {
    match compress(c, raw) {
        Some((m, z)) => seal_stored(m, raw.len(), &z, hash, out),
        None => seal_stored(crate::compress::RAW, raw.len(), raw, hash, out),
    }
}

/// Appends header + `stored` (already compressed with `method`, or raw).
pub fn seal_stored(
    method: u8,
    raw_len: usize,
    stored: &[u8],
    hash: &Hash,
    out: &mut Vec<u8>,
) -> usize {
    out.reserve(CHUNK_HEADER_LEN + stored.len());
    header_of(method, raw_len, stored, hash).encode(out);
    out.extend_from_slice(stored);
    CHUNK_HEADER_LEN + stored.len()
}

/// The header that seals `stored` (its data crc computed here).
#[allow(
    clippy::cast_possible_truncation,
    reason = "a chunk is at most MAX_RAW_LEN (1 MiB) raw, and stored only if compressed smaller (or raw)"
)]
pub fn header_of(method: u8, raw_len: usize, stored: &[u8], hash: &Hash) -> ChunkHeader {
    debug_assert!(
        raw_len <= MAX_RAW_LEN as usize,
        "a chunk of {raw_len} bytes"
    );
    ChunkHeader {
        compression: method,
        raw_len: raw_len as u32,
        stored_len: stored.len() as u32,
        hash: *hash,
        data_crc: crc32c::crc32c(stored),
    }
}

/// Verifies a sealed chunk and returns its raw (decompressed) bytes.
pub fn unseal(buf: &[u8], expected: &Hash, full_hash: bool) -> Result<Vec<u8>, ChunkError> {
    let (head, data) = buf.split_at(CHUNK_HEADER_LEN.min(buf.len()));
    let h = check_stored(head, data, expected)?;
    let stored = &data[..h.stored_len as usize];
    let raw = if h.compression == crate::compress::RAW {
        if h.raw_len != h.stored_len {
            return Err(ChunkError::RawLenMismatch);
        }
        stored.to_vec()
    } else {
        if h.raw_len > MAX_RAW_LEN {
            return Err(ChunkError::RawTooLong(h.raw_len));
        }
        let mut raw = vec![0u8; h.raw_len as usize];
        decompress(h.compression, stored, &mut raw).map_err(ChunkError::Decompress)?;
        raw
    };
    if full_hash && &hash_block(&raw) != expected {
        return Err(ChunkError::ContentHash);
    }
    Ok(raw)
}

/// Checks the header and the stored bytes' checksum.
fn check_stored(head: &[u8], data: &[u8], expected: &Hash) -> Result<ChunkHeader, ChunkError> {
    let h = ChunkHeader::decode(head)?;
    if &h.hash != expected {
        return Err(ChunkError::OtherContent);
    }
    let Some(stored) = data.get(..h.stored_len as usize) else {
        return Err(ChunkError::StoredBeyondChunk);
    };
    if crc32c::crc32c(stored) != h.data_crc {
        return Err(ChunkError::DataChecksum);
    }
    Ok(h)
}

/// Checks an uncompressed chunk read as header + data in place; returns
/// the raw length.
pub fn verify_split(head: &[u8], data: &[u8], expected: &Hash) -> Result<usize, ChunkError> {
    let h = check_stored(head, data, expected)?;
    if h.compression != crate::compress::RAW || h.raw_len != h.stored_len {
        return Err(ChunkError::NotRaw);
    }
    Ok(h.stored_len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_unseal_roundtrip() {
        let raw = b"some block data".repeat(100);
        let h = hash_block(&raw);
        let mut buf = Vec::new();
        seal(&raw, &h, Compression::None, &mut buf);
        assert_eq!(buf.len(), CHUNK_HEADER_LEN + raw.len());
        assert_eq!(unseal(&buf, &h, true).unwrap(), raw);
    }

    #[test]
    fn detects_flipped_bits_anywhere() {
        let raw = vec![0xabu8; 4096];
        let h = hash_block(&raw);
        let mut buf = Vec::new();
        seal(&raw, &h, Compression::None, &mut buf);
        for pos in [0, 5, 9, 20, 50, CHUNK_HEADER_LEN, CHUNK_HEADER_LEN + 4000] {
            let mut b = buf.clone();
            b[pos] ^= 0x10;
            assert!(unseal(&b, &h, false).is_err(), "flip at {pos} not detected");
        }
        let other = hash_block(b"x");
        assert!(unseal(&buf, &other, false).is_err());
    }
}
