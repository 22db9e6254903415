//! How a pool turns blocks into stored chunk bytes and back: its content
//! hash (BLAKE3, keyed with the pool's content key when the pool is
//! encrypted), compression, and for an encrypted pool authenticated
//! encryption of the compressed bytes (`cairn-crypt`), bound to the
//! chunk's header (`chunk::sealed_aad`). Every read of a chunk's raw bytes
//! and every new chunk goes through the pool's codec; copies, moves and
//! mirror streams carry stored bytes as they are.

use crate::chunk::{
    self, expand, sealed_aad, ChunkError, Hash, ENCRYPTED, FORM_FLAGS, SEAL_SPAN, SPANS, XAES,
};
use crate::compress::{compress, Compression, RAW};
use cairn_crypt::{Cipher, PoolKeys, SubkeyCache, OVERHEAD};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The pool's chunk codec: plain, or encrypted with the pool's keys, or
/// encrypted without them (a mirror held without its key: it stores the
/// sealed chunks its source sends, and opens none).
#[derive(Clone, Default, Debug)]
pub struct ChunkCodec {
    keys: Option<Arc<PoolKeys>>,
    /// Encrypted (shared by the codec's clones: a plain mirror taking its
    /// first sealed stream becomes sealed without the key, `seal_here`).
    sealed: Arc<AtomicBool>,
}

impl ChunkCodec {
    /// The codec of an encrypted pool.
    pub fn encrypted(keys: Arc<PoolKeys>) -> Self {
        ChunkCodec {
            keys: Some(keys),
            sealed: Arc::new(AtomicBool::new(true)),
        }
    }

    /// The codec of an encrypted pool held without its key: chunks stored
    /// as they come; a read is refused (`ChunkError::NeedsKey`).
    pub fn sealed_without_key() -> Self {
        ChunkCodec {
            keys: None,
            sealed: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Makes a plain codec (and its clones) that of an encrypted pool held
    /// without its key, from now on (a fresh mirror taking its source's key
    /// block with a sealed stream).
    pub fn seal_here(&self) {
        assert!(self.keys.is_none(), "a codec with keys is sealed already");
        self.sealed.store(true, Ordering::Release);
    }

    /// True if chunks are encrypted.
    pub fn is_encrypted(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }

    /// The content hash of a block: what names its chunk and finds its
    /// duplicates.
    pub fn hash(&self, raw: &[u8]) -> Hash {
        match &self.keys {
            Some(k) => k.content_hash(raw),
            None => chunk::hash_block(raw),
        }
    }

    /// The stored form of a new chunk of `raw` (content hash `hash`):
    /// (form, bytes), compressed with `c` when that saves 1/8 and
    /// encrypted in an encrypted pool. None: `raw` is stored as it is.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a chunk is at most MAX_RAW_LEN (1 MiB)"
    )]
    pub fn pack(&self, c: Compression, raw: &[u8], hash: &Hash) -> Option<(u8, Vec<u8>)> {
        let packed = compress(c, raw);
        let Some(keys) = self.keys.as_ref() else {
            return packed;
        };
        let (method, plain) = match &packed {
            Some((m, z)) => (*m, z.as_slice()),
            None => (RAW, raw),
        };
        assert!(
            method & FORM_FLAGS == 0,
            "a compression method below the flags"
        );
        if let (RAW, Some(len)) = (method, span_sealed_len(raw.len())) {
            let form = spans_form(keys);
            let base = sealed_aad(form, raw.len() as u32, hash);
            let count = raw.len().div_ceil(SEAL_SPAN);
            let mut sealed = Vec::with_capacity(len);
            let aad = |i| span_aad(&base, i, count);
            keys.chunks
                .seal_spans_into(raw, SEAL_SPAN, aad, &mut sealed);
            assert_eq!(sealed.len(), len);
            return Some((form, sealed));
        }
        let form = method | ENCRYPTED | cipher_bit(keys);
        let aad = sealed_aad(form, raw.len() as u32, hash);
        let sealed = keys.chunks.seal(&aad, plain);
        assert_eq!(sealed.len(), plain.len() + OVERHEAD);
        Some((form, sealed))
    }

    /// The raw bytes of spans `first..` of a chunk sealed span by span
    /// (raw length `raw_len`, content hash `hash`), opened from `stored`:
    /// those spans' stored bytes, whole, as `stored_spans` locates them.
    /// Every span is authenticated, at its index, or nothing is returned.
    pub fn open_spans(
        &self,
        raw_len: u32,
        hash: &Hash,
        first: usize,
        stored: &[u8],
    ) -> Result<Vec<u8>, ChunkError> {
        let spans = stored.len().div_ceil(SEAL_SPAN + OVERHEAD);
        let len = stored.len().saturating_sub(spans * OVERHEAD);
        let mut raw = vec![0u8; len];
        self.open_spans_into(raw_len, hash, first, stored, &mut raw)?;
        Ok(raw)
    }

    /// `open_spans` into `dst`, which must be exactly those spans' raw
    /// bytes long (else `RawLenMismatch`); on an error `dst` holds no
    /// decrypted byte.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a chunk is at most MAX_RAW_LEN (1 MiB)"
    )]
    pub fn open_spans_into(
        &self,
        raw_len: u32,
        hash: &Hash,
        first: usize,
        stored: &[u8],
        dst: &mut [u8],
    ) -> Result<(), ChunkError> {
        let keys = self.keys.as_ref().ok_or(ChunkError::NeedsKey)?;
        let count = (raw_len as usize).div_ceil(SEAL_SPAN);
        let base = sealed_aad(spans_form(keys), raw_len, hash);
        let mut cache = SubkeyCache::default();
        let mut at = 0;
        let mut open = |k: usize, span: &[u8]| {
            let i = first + k;
            // The last span is the only short one; one past the count, or
            // a short one before the last, is damage.
            let want = SEAL_SPAN.min(raw_len as usize - (i * SEAL_SPAN).min(raw_len as usize));
            let out = dst.get_mut(at..at + want);
            let (true, Some(out)) = (i < count && span.len() == want + OVERHEAD, out) else {
                return Err(ChunkError::RawLenMismatch);
            };
            let aad = span_aad(&base, i, count);
            (keys.chunks.open_to_slice(&aad, span, out, &mut cache))
                .map_err(|_| ChunkError::Authentication)?;
            at += want;
            Ok(())
        };
        let mut opened = (stored.chunks(SEAL_SPAN + OVERHEAD).enumerate())
            .try_for_each(|(k, span)| open(k, span));
        if opened.is_ok() && at != dst.len() {
            opened = Err(ChunkError::RawLenMismatch);
        }
        if opened.is_err() {
            dst.fill(0);
        }
        opened
    }

    /// Opens whole chunk `buf` straight into `dst` when it is sealed span
    /// by span and `dst` is its raw length: its header checked against
    /// its checksum and `expected`, every span authenticated (the tags
    /// cover every stored byte, so the data checksum is not computed as
    /// well). Ok(false): not such a chunk, nothing done (`unseal` it).
    pub fn open_chunk_into(
        &self,
        buf: &[u8],
        expected: &Hash,
        dst: &mut [u8],
    ) -> Result<bool, ChunkError> {
        let Some(keys) = self.keys.as_ref() else {
            return Ok(false);
        };
        let (h, stored) = chunk::header_and_stored(buf, expected)?;
        if h.compression != spans_form(keys) || h.raw_len as usize != dst.len() {
            return Ok(false);
        }
        self.open_spans_into(h.raw_len, expected, 0, stored, dst)?;
        Ok(true)
    }

    /// The `pack` of each block (with its hash), split across the cores.
    pub fn pack_all(&self, c: Compression, blocks: &[(&[u8], Hash)]) -> Vec<Option<(u8, Vec<u8>)>> {
        if c == Compression::None && !self.is_encrypted() {
            return vec![None; blocks.len()];
        }
        let packed = on_every_core(blocks, |(b, h)| self.pack(c, b, h));
        // Callers zip the packings with the blocks: one left out would
        // leave a block (and every one after it) unstored.
        assert_eq!(packed.len(), blocks.len(), "a packing per block");
        packed
    }

    /// Verifies chunk `buf` as fully as this codec can: opened and its
    /// raw bytes hashed (`unseal`), or, an encrypted chunk held without the
    /// key, its header and checksums only.
    pub fn verify(&self, buf: &[u8], expected: &Hash) -> Result<(), ChunkError> {
        match (self.is_encrypted(), &self.keys) {
            (true, None) => chunk::checked(buf, expected).map(drop),
            _ => self.unseal(buf, expected, true).map(drop),
        }
    }

    /// Verifies sealed chunk `buf` against its checksums and `expected`,
    /// opens it if encrypted, and returns its raw bytes (with `full_hash`
    /// checked against `expected`). Never a byte of a chunk that fails.
    pub fn unseal(
        &self,
        buf: &[u8],
        expected: &Hash,
        full_hash: bool,
    ) -> Result<Vec<u8>, ChunkError> {
        let (h, stored) = chunk::checked(buf, expected)?;
        if let (Some(keys), true) = (&self.keys, h.compression & ENCRYPTED != 0) {
            if h.compression & XAES != cipher_bit(keys) {
                // A chunk of another cipher than the pool's: another
                // pool's, or a forged header.
                return Err(ChunkError::Authentication);
            }
        }
        let raw = match h.compression & ENCRYPTED {
            0 => expand(h.compression, h.raw_len, stored)?,
            _ if h.compression & !XAES == RAW | ENCRYPTED | SPANS => {
                let raw = self.open_spans(h.raw_len, expected, 0, stored)?;
                if raw.len() != h.raw_len as usize {
                    return Err(ChunkError::RawLenMismatch);
                }
                raw
            }
            _ => {
                let keys = self.keys.as_ref().ok_or(ChunkError::NeedsKey)?;
                let aad = sealed_aad(h.compression, h.raw_len, expected);
                let plain =
                    (keys.chunks.open(&aad, stored)).map_err(|_| ChunkError::Authentication)?;
                expand(h.compression & !(ENCRYPTED | XAES), h.raw_len, &plain)?
            }
        };
        if full_hash && &self.hash(&raw) != expected {
            return Err(ChunkError::ContentHash);
        }
        Ok(raw)
    }
}

/// The form bit of the pool's chunk cipher: `XAES`, or 0 for
/// XChaCha20-Poly1305.
fn cipher_bit(keys: &PoolKeys) -> u8 {
    match keys.chunks.cipher() {
        Cipher::Xaes256Gcm => XAES,
        Cipher::XChaCha20Poly1305 => 0,
    }
}

/// The stored form of the pool's chunks sealed span by span.
fn spans_form(keys: &PoolKeys) -> u8 {
    RAW | ENCRYPTED | SPANS | cipher_bit(keys)
}

/// The associated data of span `i` of `count` of a chunk sealed span by
/// span: the chunk's (`sealed_aad`), the span's index and the count, so a
/// span moved, swapped or dropped fails authentication.
#[allow(
    clippy::cast_possible_truncation,
    reason = "a chunk of at most 1 MiB has at most 256 spans"
)]
fn span_aad(base: &[u8; 42], i: usize, count: usize) -> [u8; 50] {
    let mut a = [0u8; 50];
    a[..42].copy_from_slice(base);
    a[42..46].copy_from_slice(&(i as u32).to_le_bytes());
    a[46..].copy_from_slice(&(count as u32).to_le_bytes());
    a
}

/// The stored length of an uncompressed chunk of `raw_len` bytes in an
/// encrypted pool when it is sealed span by span (more than one span):
/// its raw bytes and a seal's overhead per span. None: it is sealed
/// whole (one overhead; a compressed one is shorter than raw).
pub fn span_sealed_len(raw_len: usize) -> Option<usize> {
    (raw_len > SEAL_SPAN).then(|| raw_len + raw_len.div_ceil(SEAL_SPAN) * OVERHEAD)
}

/// Where raw bytes `from..end` of a chunk sealed span by span (raw length
/// `raw_len`) are: (the first span they touch, the offset of its stored
/// bytes after the chunk's header, the stored bytes of every span they
/// touch, the offset of `from` in those spans' raw bytes).
pub fn stored_spans(raw_len: usize, from: usize, end: usize) -> (usize, usize, usize, usize) {
    assert!(
        from < end && end <= raw_len,
        "bytes {from}..{end} of {raw_len}"
    );
    let (first, last) = (from / SEAL_SPAN, (end - 1) / SEAL_SPAN);
    let at = first * (SEAL_SPAN + OVERHEAD);
    let raw_end = ((last + 1) * SEAL_SPAN).min(raw_len);
    let len = raw_end - first * SEAL_SPAN + (last + 1 - first) * OVERHEAD;
    (first, at, len, from - first * SEAL_SPAN)
}

/// `f` of each item, in order, the items split across the cores.
pub fn on_every_core<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let per = items.len().div_ceil(cores).max(1);
    let f = &f;
    std::thread::scope(|sc| {
        let parts: Vec<_> = (items.chunks(per))
            .map(|part| sc.spawn(move || part.iter().map(f).collect::<Vec<_>>()))
            .collect();
        (parts.into_iter())
            .flat_map(|h| h.join().expect("a worker does not panic"))
            .collect()
    })
}

#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::{seal_stored, CHUNK_HEADER_LEN};
    use cairn_crypt::DataKey;
    use cairn_crypt::OVERHEAD;

    fn encrypted() -> ChunkCodec {
        with_cipher(&DataKey::random(), Cipher::Xaes256Gcm)
    }

    fn with_cipher(key: &DataKey, c: Cipher) -> ChunkCodec {
        ChunkCodec::encrypted(Arc::new(PoolKeys::derive(key, c)))
    }

    /// A codec of a pool of each chunk cipher: XChaCha20-Poly1305 (pools
    /// made before XAES-256-GCM) and XAES-256-GCM.
    fn codecs() -> [ChunkCodec; 2] {
        [Cipher::XChaCha20Poly1305, Cipher::Xaes256Gcm].map(|c| with_cipher(&DataKey::random(), c))
    }

    /// The header versions of `codec`'s chunks sealed whole and in spans.
    fn versions(codec: &ChunkCodec) -> (u8, u8) {
        match cipher_bit(codec.keys.as_ref().unwrap()) {
            XAES => (chunk::CHUNK_VERSION_XAES, chunk::CHUNK_VERSION_XAES),
            _ => (chunk::CHUNK_VERSION_ENCRYPTED, chunk::CHUNK_VERSION_SPANS),
        }
    }

    fn sealed(codec: &ChunkCodec, c: Compression, raw: &[u8]) -> (Hash, Vec<u8>) {
        let h = codec.hash(raw);
        let (form, stored) = codec
            .pack(c, raw, &h)
            .expect("an encrypted pool packs every block");
        let mut buf = Vec::new();
        seal_stored(form, raw.len(), &stored, &h, &mut buf);
        (h, buf)
    }

    #[test]
    fn an_encrypted_chunk_reads_back_and_holds_no_plaintext() {
        for (codec, c) in codecs().iter().flat_map(|k| {
            [Compression::None, Compression::Lz4, Compression::Zstd(3)].map(|c| (k, c))
        }) {
            let raw = b"a distinctive sentence of plaintext ".repeat(100);
            let (h, buf) = sealed(codec, c, &raw);
            assert_eq!(buf[4], versions(codec).0);
            assert_eq!(codec.unseal(&buf, &h, true).unwrap(), raw);
            assert!(
                !buf.windows(16).any(|w| raw.windows(16).any(|r| r == w)),
                "plaintext in {c}"
            );
            assert_eq!(chunk::unseal(&buf, &h, false), Err(ChunkError::NeedsKey));
            assert_eq!(
                ChunkCodec::default().unseal(&buf, &h, false),
                Err(ChunkError::NeedsKey)
            );
        }
    }

    #[test]
    fn a_flipped_bit_or_a_chunk_under_another_id_is_refused() {
        let codec = encrypted();
        let (h, buf) = sealed(&codec, Compression::None, &[0x42; 4096]);
        for at in [
            0,
            5,
            9,
            20,
            50,
            CHUNK_HEADER_LEN,
            CHUNK_HEADER_LEN + 30,
            buf.len() - 1,
        ] {
            let mut b = buf.clone();
            b[at] ^= 0x08;
            assert!(codec.unseal(&b, &h, false).is_err(), "flip at {at} read");
        }
        // The same bytes under another id, header and checksums redone:
        // the encryption's binding refuses them.
        let other = codec.hash(b"other content");
        let mut moved = Vec::new();
        seal_stored(buf[5], 4096, &buf[CHUNK_HEADER_LEN..], &other, &mut moved);
        assert_eq!(
            codec.unseal(&moved, &other, false),
            Err(ChunkError::Authentication)
        );
        // And a key of another pool opens nothing.
        assert_eq!(
            encrypted().unseal(&buf, &h, false),
            Err(ChunkError::Authentication)
        );
    }

    /// A chunk of `len` raw bytes sealed span by span: its hash, the
    /// sealed chunk, and its stored bytes.
    fn span_sealed(codec: &ChunkCodec, len: usize) -> (Vec<u8>, Hash, Vec<u8>) {
        let raw: Vec<u8> = (0..len).map(|i| (i % 251).to_le_bytes()[0]).collect();
        let (h, buf) = sealed(codec, Compression::None, &raw);
        assert_eq!(buf[4], versions(codec).1, "{len} bytes");
        (raw, h, buf)
    }

    #[test]
    fn chunks_of_more_than_a_span_are_sealed_span_by_span_and_read_in_parts() {
        for codec in codecs() {
            spans_read_in_parts(&codec);
        }
    }

    fn spans_read_in_parts(codec: &ChunkCodec) {
        // One span or less: sealed whole, as before.
        let (h, buf) = sealed(codec, Compression::None, &[7; SEAL_SPAN]);
        assert_eq!(buf[4], versions(codec).0);
        assert_eq!(codec.unseal(&buf, &h, true).unwrap(), vec![7; SEAL_SPAN]);
        for len in [SEAL_SPAN + 1, 3 * SEAL_SPAN, 65_536, 65_536 + 100] {
            let (raw, h, buf) = span_sealed(codec, len);
            let count = len.div_ceil(SEAL_SPAN);
            assert_eq!(buf.len(), CHUNK_HEADER_LEN + len + count * OVERHEAD);
            assert_eq!(codec.unseal(&buf, &h, true).unwrap(), raw);
            let stored = &buf[CHUNK_HEADER_LEN..];
            for (from, end) in [
                (0, 1),
                (0, len),
                (4095, 4097),
                (len - 1, len),
                (len / 2, len),
            ] {
                let (first, at, n, skip) = stored_spans(len, from, end);
                let got = codec
                    .open_spans(u32::try_from(len).unwrap(), &h, first, &stored[at..at + n])
                    .unwrap();
                assert_eq!(
                    &got[skip..skip + end - from],
                    &raw[from..end],
                    "{from}..{end} of {len}"
                );
            }
        }
    }

    #[test]
    fn a_large_chunk_sealed_whole_before_version_3_still_opens() {
        let codec = with_cipher(&DataKey::random(), Cipher::XChaCha20Poly1305);
        let raw: Vec<u8> = (0..65_536u32).map(|i| (i % 241).to_le_bytes()[0]).collect();
        let h = codec.hash(&raw);
        let form = RAW | ENCRYPTED;
        let aad = sealed_aad(form, 65_536, &h);
        let whole = codec.keys.as_ref().unwrap().chunks.seal(&aad, &raw);
        let mut buf = Vec::new();
        seal_stored(form, raw.len(), &whole, &h, &mut buf);
        assert_eq!(buf[4], chunk::CHUNK_VERSION_ENCRYPTED);
        assert_eq!(codec.unseal(&buf, &h, true).unwrap(), raw);
        // Its length is not a span-sealed chunk's, so reads open it whole.
        assert_ne!(whole.len(), raw.len() + 16 * OVERHEAD);
    }

    #[test]
    fn a_span_changed_swapped_dropped_or_moved_is_refused() {
        for codec in codecs() {
            changed_spans_refused(&codec);
        }
    }

    /// A chunk sealed under the other cipher with the same data key (a
    /// forged header, or another pool's) is refused, whole or in spans.
    #[test]
    fn a_chunk_of_the_other_cipher_is_refused() {
        let key = DataKey::random();
        let [chacha, xaes] =
            [Cipher::XChaCha20Poly1305, Cipher::Xaes256Gcm].map(|c| with_cipher(&key, c));
        for (from, to) in [(&chacha, &xaes), (&xaes, &chacha)] {
            for len in [100, 4 * SEAL_SPAN] {
                let raw: Vec<u8> = (0..len).map(|i| i.to_le_bytes()[0]).collect();
                let (h, buf) = sealed(from, Compression::None, &raw);
                assert_eq!(to.unseal(&buf, &h, false), Err(ChunkError::Authentication));
                let stored = &buf[CHUNK_HEADER_LEN..];
                if len > SEAL_SPAN {
                    let raw_len = u32::try_from(len).unwrap();
                    assert!(from.open_spans(raw_len, &h, 0, stored).is_ok());
                    assert_eq!(
                        to.open_spans(raw_len, &h, 0, stored),
                        Err(ChunkError::Authentication)
                    );
                }
            }
        }
    }

    /// A whole chunk sealed span by span opens straight into a buffer of
    /// its raw length; any other chunk or buffer is left to `unseal`, and
    /// a damaged span leaves the buffer zeroed.
    #[test]
    fn a_chunk_opens_into_its_buffer_or_not_at_all() {
        for codec in codecs() {
            let (raw, h, buf) = span_sealed(&codec, 3 * SEAL_SPAN + 5);
            let mut dst = vec![0xaa; raw.len()];
            assert_eq!(codec.open_chunk_into(&buf, &h, &mut dst), Ok(true));
            assert_eq!(dst, raw);
            let mut short = vec![0u8; raw.len() - 1];
            assert_eq!(codec.open_chunk_into(&buf, &h, &mut short), Ok(false));
            let keyless = ChunkCodec::sealed_without_key();
            assert_eq!(keyless.open_chunk_into(&buf, &h, &mut dst), Ok(false));
            let (small_h, small) = sealed(&codec, Compression::None, &[3; 100]);
            let mut out = vec![0u8; 100];
            assert_eq!(codec.open_chunk_into(&small, &small_h, &mut out), Ok(false));
            let mut bad = buf.clone();
            let last = bad.len() - 3;
            bad[last] ^= 1;
            assert_eq!(
                codec.open_chunk_into(&bad, &h, &mut dst),
                Err(ChunkError::Authentication)
            );
            assert!(dst.iter().all(|&b| b == 0), "nothing of a failed open kept");
            assert_eq!(
                codec.open_chunk_into(&buf, &small_h, &mut dst),
                Err(ChunkError::OtherContent)
            );
        }
    }

    fn changed_spans_refused(codec: &ChunkCodec) {
        let (_, h, buf) = span_sealed(codec, 4 * SEAL_SPAN);
        let stored = &buf[CHUNK_HEADER_LEN..];
        let span = SEAL_SPAN + OVERHEAD;
        let open = |first: usize, b: &[u8]| {
            codec.open_spans(u32::try_from(4 * SEAL_SPAN).unwrap(), &h, first, b)
        };
        // Each span opens at its own index only.
        assert!(open(1, &stored[span..2 * span]).is_ok());
        assert_eq!(
            open(2, &stored[span..2 * span]),
            Err(ChunkError::Authentication)
        );
        // Two spans swapped.
        let swapped = [&stored[span..2 * span], &stored[..span]].concat();
        assert_eq!(open(0, &swapped), Err(ChunkError::Authentication));
        // Any flipped bit of a span.
        for at in [0, 23, 24, 500, span - 17, span - 1] {
            let mut b = stored[..span].to_vec();
            b[at] ^= 0x20;
            assert_eq!(open(0, &b), Err(ChunkError::Authentication), "flip at {at}");
        }
        // The last span dropped, or a short span: refused, never read.
        let mut cut = buf.clone();
        cut.truncate(buf.len() - span);
        assert!(codec.unseal(&cut, &h, false).is_err());
        assert_eq!(
            open(3, &stored[3 * span..4 * span - 1]),
            Err(ChunkError::RawLenMismatch)
        );
        // A span of another chunk with the same layout, or another pool's.
        let (_, h2, other) = span_sealed(codec, 4 * SEAL_SPAN + 1);
        let theirs = &other[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + span];
        assert_eq!(open(0, theirs), Err(ChunkError::Authentication));
        assert_ne!(h, h2);
        let elsewhere = with_cipher(
            &DataKey::random(),
            codec.keys.as_ref().unwrap().chunks.cipher(),
        );
        let (_, _, elsewhere) = span_sealed(&elsewhere, 4 * SEAL_SPAN);
        assert_eq!(
            open(0, &elsewhere[CHUNK_HEADER_LEN..][..span]),
            Err(ChunkError::Authentication)
        );
    }

    #[test]
    fn a_plain_pool_is_unchanged() {
        let plain = ChunkCodec::default();
        let raw = vec![9u8; 8192];
        let h = plain.hash(&raw);
        assert_eq!(h, chunk::hash_block(&raw));
        assert!(plain.pack(Compression::None, &raw, &h).is_none());
        let (form, z) = plain
            .pack(Compression::Lz4, &raw, &h)
            .expect("zeros shrink");
        assert_eq!(form, crate::compress::LZ4, "a plain pool compresses");
        assert!(z.len() < raw.len() / 8);
        let mut buf = Vec::new();
        chunk::seal(&raw, &h, Compression::Lz4, &mut buf);
        assert_eq!(plain.unseal(&buf, &h, true).unwrap(), raw);
        assert_ne!(encrypted().hash(&raw), h);
    }
}
