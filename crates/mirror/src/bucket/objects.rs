//! The objects of a mirror kept in a bucket besides its manifest: chunk
//! objects (`chunk-<hash>`, one chunk's stored bytes, content-addressed so
//! that every copy into the bucket uploads a chunk once), and the
//! transformations between a stream as a pool reads or applies it and a
//! stream as the bucket keeps it, whose chunk frames carry no bytes
//! (`split_stream` on the way in, `join_stream` on the way out).

use crate::error::{Result, StreamError};
use crate::frame::{Body, FrameReader, FrameWriter, Kind};
use crate::records::{decode_chunk, encode_chunk, Header};
use cairn_data::Hash;
use cairn_fs::replica::{ChunkIn, StoredChunk};
use std::io::{Read, Write};

const MAGIC: &[u8; 8] = b"cairn-mc";
/// Format version of chunk objects written now.
pub const CHUNK_OBJECT_VERSION: u16 = 1;

/// The name of the object that holds the chunk with content hash `h`.
pub fn chunk_key(h: &Hash) -> String {
    format!("chunk-{}", hex(h))
}

/// The hash a chunk object's name carries, None for other names.
pub fn hash_of_key(key: &str) -> Option<Hash> {
    let h = key.strip_prefix("chunk-")?;
    if h.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A chunk object: magic, version, method, raw length, hash, the stored
/// bytes, and a crc32c of all that.
pub fn encode_object(c: &StoredChunk) -> Vec<u8> {
    let mut b = Vec::with_capacity(51 + c.stored.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&CHUNK_OBJECT_VERSION.to_le_bytes());
    b.push(c.method);
    b.extend_from_slice(&c.raw_len.to_le_bytes());
    b.extend_from_slice(&c.hash);
    b.extend_from_slice(&c.stored);
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes a chunk object, which must hold the chunk `want` (the content
/// itself is verified against the hash where the chunk is applied).
pub fn decode_object(b: &[u8], want: &Hash) -> Result<StoredChunk> {
    let what = format!("chunk object {}", hex(want));
    let body = super::unseal(b, MAGIC, &what, "chunk object")?;
    let mut c = Body::new(body, "chunk object");
    let v = c.u16()?;
    if v != CHUNK_OBJECT_VERSION {
        return Err(StreamError::Refused(format!(
            "chunk object format version {v}; this cairn reads version {CHUNK_OBJECT_VERSION}"
        )));
    }
    let (method, raw_len) = (c.u8()?, c.u32()?);
    let hash: Hash = c.array()?;
    if &hash != want {
        return Err(StreamError::Damaged(format!(
            "{what}: holds chunk {}",
            hex(&hash)
        )));
    }
    Ok(StoredChunk {
        hash,
        method,
        raw_len,
        stored: c.rest().to_vec(),
    })
}

/// What splitting a stream did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SplitReport {
    pub since: u64,
    pub upto: u64,
    /// Chunks whose bytes the stream carried (handed to `put`).
    pub chunks: u64,
    pub chunk_bytes: u64,
}

/// Copies a stream from `input` to `out`, handing each chunk whose bytes
/// it carries to `put` (as a chunk object) and writing that chunk's frame
/// without its bytes. Every frame is checked as it is read.
pub fn split_stream(
    input: impl Read,
    out: impl Write,
    put: &mut dyn FnMut(&Hash, Vec<u8>) -> Result<()>,
) -> Result<SplitReport> {
    let mut rep = SplitReport::default();
    transform(input, out, &mut rep, &mut |c: ChunkIn, rep| {
        let Some(d) = c.data else {
            return Ok(c);
        };
        rep.chunks += 1;
        rep.chunk_bytes += d.stored.len() as u64;
        put(&c.hash, encode_object(&d))?;
        Ok(ChunkIn {
            src: c.src,
            hash: c.hash,
            data: None,
        })
    })?;
    Ok(rep)
}

/// Copies a stream kept in a bucket from `input` to `out`, giving each
/// chunk frame the bytes `fetch` returns for it (None: the pool the
/// stream is for holds that chunk already).
pub fn join_stream(
    input: impl Read,
    out: impl Write,
    fetch: &mut dyn FnMut(&Hash) -> Result<Option<StoredChunk>>,
) -> Result<SplitReport> {
    let mut rep = SplitReport::default();
    transform(input, out, &mut rep, &mut |mut c: ChunkIn, rep| {
        if c.data.is_none() {
            c.data = fetch(&c.hash)?;
        }
        if let Some(d) = &c.data {
            rep.chunks += 1;
            rep.chunk_bytes += d.stored.len() as u64;
        }
        Ok(c)
    })?;
    Ok(rep)
}

/// The content hashes of the chunk frames of a stream.
pub fn chunk_hashes(input: impl Read) -> Result<Vec<Hash>> {
    let mut out = Vec::new();
    let mut rep = SplitReport::default();
    transform(input, std::io::sink(), &mut rep, &mut |c: ChunkIn, _| {
        out.push(c.hash);
        Ok(c)
    })?;
    Ok(out)
}

/// Reads every frame of a stream up to its End frame and writes it again,
/// chunk frames through `chunk`.
fn transform(
    input: impl Read,
    out: impl Write,
    rep: &mut SplitReport,
    chunk: &mut dyn FnMut(ChunkIn, &mut SplitReport) -> Result<ChunkIn>,
) -> Result<()> {
    let mut r = FrameReader::new(input);
    let mut w = FrameWriter::new(out);
    loop {
        let (kind, body) = r.read_frame()?;
        match kind {
            Kind::Header if r.count() == 1 => {
                let h = Header::decode(&body)?;
                (rep.since, rep.upto) = (h.since, h.upto);
                w.frame(kind, &body)?;
            }
            Kind::Header => return Err(StreamError::Damaged("a second header".into())),
            _ if r.count() == 1 => {
                return Err(StreamError::Damaged(format!(
                    "starts with a {kind:?} frame, not a header"
                )))
            }
            Kind::Chunk => {
                let c = chunk(decode_chunk(&body)?, rep)?;
                w.frame(kind, &encode_chunk(&c))?;
            }
            Kind::End => {
                w.frame(kind, &body)?;
                return w.flush();
            }
            _ => w.frame(kind, &body)?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(n: u8) -> StoredChunk {
        StoredChunk {
            hash: [n; 32],
            method: 0,
            raw_len: 3,
            stored: vec![n, n, n],
        }
    }

    #[test]
    fn chunk_objects_round_trip_and_refuse_damage_or_another_chunk() {
        let c = chunk(7);
        let b = encode_object(&c);
        let d = decode_object(&b, &c.hash).unwrap();
        assert_eq!(
            (d.hash, d.method, d.raw_len, d.stored),
            (c.hash, 0, 3, c.stored.clone())
        );
        assert!(decode_object(&b, &[8; 32]).is_err());
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 1;
            assert!(decode_object(&x, &c.hash).is_err(), "byte {i}");
        }
        assert_eq!(hash_of_key(&chunk_key(&c.hash)), Some(c.hash));
        assert_eq!(hash_of_key("chunk-zz"), None);
        assert_eq!(hash_of_key("manifest"), None);
        // The magic and a few bytes: refused, never a panic.
        for n in 8..12 {
            assert!(decode_object(&b"cairn-mc\0\0\0\0"[..n], &c.hash).is_err());
        }
    }
}
