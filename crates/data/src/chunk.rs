//! The chunk: the unit of stored data. Each chunk is self-describing, so data
//! can be verified and relocated without the metadata (the lessfs lesson):
//!
//! ```text
//! 0   magic "CHNK"          4
//! 4   format version u8     1   1 = plain, 2 = encrypted, 3 = encrypted
//!                               in spans, 4 = encrypted with XAES-256-GCM
//!                               (whole or in spans)
//! 5   stored form u8        1   compression (0 = none, 1 = lz4, 2 = zstd)
//!                               | 0x80 when encrypted (versions 2 to 4)
//!                               | 0x40 when sealed in spans (3, or 4)
//!                               | 0x20 when XAES-256-GCM (version 4)
//! 6   reserved u16          2
//! 8   raw length u32        4   bytes after decompression
//! 12  stored length u32     4   bytes that follow the header
//! 16  blake3 hash [32]      32  of the raw bytes (keyed when encrypted)
//! 48  data crc32c u32       4   of the stored bytes
//! 52  header crc32c u32     4   of bytes 0..52
//! 56  stored bytes ...
//! ```
//!
//! An encrypted chunk's stored bytes are `nonce (24) | ciphertext | tag
//! (16)` of its (compressed) bytes, sealed with the pool's chunk key and
//! bound to its header's version, form, raw length and hash (`sealed_aad`),
//! so a chunk moved to another id fails authentication (`codec.rs`); the
//! cipher is the pool's (its key block's): XChaCha20-Poly1305 in pools made
//! before XAES-256-GCM came (versions 2 and 3), XAES-256-GCM since (version
//! 4, with the cipher bit in the form, so the header binds it too). An
//! uncompressed chunk of more than one 4 KiB span is sealed span by span
//! instead (version 3): each `SEAL_SPAN` bytes of it as its own `nonce |
//! ciphertext | tag`, bound to the same header fields and to the span's
//! index and the number of spans, so that a small read opens only the
//! spans it touches. The data crc covers the stored bytes as stored, so
//! scrub and copies check them without the key.

use crate::compress::{compress, decompress, Compression};

pub const CHUNK_MAGIC: &[u8; 4] = b"CHNK";
pub const CHUNK_VERSION: u8 = 1;
/// The version of an encrypted chunk's header.
pub const CHUNK_VERSION_ENCRYPTED: u8 = 2;
/// The version of the header of a chunk encrypted span by span.
pub const CHUNK_VERSION_SPANS: u8 = 3;
/// The version of the header of a chunk encrypted with XAES-256-GCM.
pub const CHUNK_VERSION_XAES: u8 = 4;
/// The bit of the stored-form byte that says the stored bytes are
/// encrypted (the rest is the compression method).
pub const ENCRYPTED: u8 = 0x80;
/// The bit of the stored-form byte, with `ENCRYPTED` and no compression,
/// that says each `SEAL_SPAN` of the chunk is sealed alone.
pub const SPANS: u8 = 0x40;
/// The bit of the stored-form byte, with `ENCRYPTED`, that says the
/// cipher is XAES-256-GCM (else XChaCha20-Poly1305).
pub const XAES: u8 = 0x20;
/// The bits of the stored-form byte above the compression method.
pub const FORM_FLAGS: u8 = ENCRYPTED | SPANS | XAES;
/// Raw bytes in each sealed span of a chunk sealed span by span (the last
/// may hold fewer): the span of the plain chunks' checksums (`SUM_SPAN`).
pub const SEAL_SPAN: usize = 4096;
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
    #[error("chunk header version {version} disagrees with its stored form {form:#x}")]
    FormMismatch { version: u8, form: u8 },
    #[error("the chunk is encrypted: the pool's key is needed to read it")]
    NeedsKey,
    #[error("the chunk fails authentication (changed, or moved from another chunk)")]
    Authentication,
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
        out.push(version_of(self.compression));
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
        if !matches!(
            b[4],
            CHUNK_VERSION | CHUNK_VERSION_ENCRYPTED | CHUNK_VERSION_SPANS | CHUNK_VERSION_XAES
        ) {
            return Err(ChunkError::UnknownVersion(b[4]));
        }
        if b[4] != version_of(b[5]) {
            return Err(ChunkError::FormMismatch {
                version: b[4],
                form: b[5],
            });
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

/// The header version of a chunk whose stored-form byte is `form`.
fn version_of(form: u8) -> u8 {
    match (form & ENCRYPTED, form & XAES, form & SPANS) {
        (0, _, _) => CHUNK_VERSION,
        (_, XAES, _) => CHUNK_VERSION_XAES,
        (_, _, 0) => CHUNK_VERSION_ENCRYPTED,
        _ => CHUNK_VERSION_SPANS,
    }
}

/// The associated data an encrypted chunk's stored bytes are bound to:
/// magic, version, stored form, raw length and content hash.
pub fn sealed_aad(form: u8, raw_len: u32, hash: &Hash) -> [u8; 42] {
    let mut a = [0u8; 42];
    a[..4].copy_from_slice(CHUNK_MAGIC);
    a[4] = version_of(form);
    a[5] = form;
    a[6..10].copy_from_slice(&raw_len.to_le_bytes());
    a[10..].copy_from_slice(hash);
    a
}

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

/// Verifies a sealed chunk of a plain pool and returns its raw
/// (decompressed) bytes; an encrypted one is `NeedsKey` (`codec.rs` opens
/// those).
pub fn unseal(buf: &[u8], expected: &Hash, full_hash: bool) -> Result<Vec<u8>, ChunkError> {
    let (h, stored) = checked(buf, expected)?;
    if h.compression & ENCRYPTED != 0 {
        return Err(ChunkError::NeedsKey);
    }
    let raw = expand(h.compression, h.raw_len, stored)?;
    if full_hash && &hash_block(&raw) != expected {
        return Err(ChunkError::ContentHash);
    }
    Ok(raw)
}

/// The header of sealed chunk `buf` and its stored bytes, checked against
/// the header's checksums and `expected`.
pub fn checked<'b>(buf: &'b [u8], expected: &Hash) -> Result<(ChunkHeader, &'b [u8]), ChunkError> {
    let (head, data) = buf.split_at(CHUNK_HEADER_LEN.min(buf.len()));
    let h = check_stored(head, data, expected)?;
    let stored = &data[..h.stored_len as usize];
    Ok((h, stored))
}

/// The `raw_len` raw bytes of a chunk from its plain (decrypted) stored
/// bytes, decompressed per `method` (the stored form without `ENCRYPTED`).
pub fn expand(method: u8, raw_len: u32, stored: &[u8]) -> Result<Vec<u8>, ChunkError> {
    Ok(if method == crate::compress::RAW {
        if raw_len as usize != stored.len() {
            return Err(ChunkError::RawLenMismatch);
        }
        stored.to_vec()
    } else {
        if raw_len > MAX_RAW_LEN {
            return Err(ChunkError::RawTooLong(raw_len));
        }
        let mut raw = vec![0u8; raw_len as usize];
        decompress(method, stored, &mut raw).map_err(ChunkError::Decompress)?;
        raw
    })
}

/// Checks the header and the stored bytes' checksum.
fn check_stored(head: &[u8], data: &[u8], expected: &Hash) -> Result<ChunkHeader, ChunkError> {
    let (h, stored) = header_checked(head, data, expected)?;
    if crc32c::crc32c(stored) != h.data_crc {
        return Err(ChunkError::DataChecksum);
    }
    Ok(h)
}

/// The header of a chunk (`head`, its data following in `data`) checked
/// against its own checksum and `expected`, and its stored bytes; not the
/// stored bytes' checksum (a caller that authenticates them checks more).
fn header_checked<'d>(
    head: &[u8],
    data: &'d [u8],
    expected: &Hash,
) -> Result<(ChunkHeader, &'d [u8]), ChunkError> {
    let h = ChunkHeader::decode(head)?;
    if &h.hash != expected {
        return Err(ChunkError::OtherContent);
    }
    let Some(stored) = data.get(..h.stored_len as usize) else {
        return Err(ChunkError::StoredBeyondChunk);
    };
    Ok((h, stored))
}

/// `checked` without the stored bytes' checksum, for a chunk whose stored
/// bytes are then authenticated (every byte under a seal's tag).
pub fn header_and_stored<'b>(
    buf: &'b [u8],
    expected: &Hash,
) -> Result<(ChunkHeader, &'b [u8]), ChunkError> {
    let (head, data) = buf.split_at(CHUNK_HEADER_LEN.min(buf.len()));
    header_checked(head, data, expected)
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
