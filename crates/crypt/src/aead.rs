//! Authenticated encryption of one value with a random 192-bit nonce per
//! value (from the OS's generator), stored in front of the ciphertext:
//! `nonce (24) | ciphertext | tag (16)`, under one of two ciphers with the
//! same layout: XChaCha20-Poly1305 (every value but an XAES pool's chunks)
//! or XAES-256-GCM (`xaes.rs`; the chunks of pools made since it came,
//! as their key block says). Nonces are never counted, so no crash,
//! restore or copy of a pool can make one repeat; the chance that two of
//! 2^64 random nonces agree is about 2^-65. The associated data binds each
//! value to its place (the caller's: a chunk's id, an element's key and
//! TID), so a value moved elsewhere fails authentication.

use crate::error::CryptError;
use crate::xaes::{XaesKey, KEY_NONCE_LEN};
use chacha20::cipher::consts::U10;
use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::{AeadCore, OsRng};
use chacha20poly1305::XChaCha20Poly1305;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use zeroize::{Zeroize, Zeroizing};

/// Bytes of the nonce in front of each sealed value.
pub const NONCE_LEN: usize = 24;
/// Bytes of the authentication tag after it.
pub const TAG_LEN: usize = 16;
/// Bytes a sealed value has beyond its plaintext.
pub const OVERHEAD: usize = NONCE_LEN + TAG_LEN;

/// The cipher of a sealer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cipher {
    /// XChaCha20-Poly1305: ChaCha20-Poly1305 (RFC 8439) under a subkey,
    /// HChaCha20 of the key and the nonce's first 16 bytes, with the
    /// nonce's last 8 bytes, after four zero bytes, as its 96-bit nonce
    /// (draft-irtf-cfrg-xchacha, section 2.3).
    XChaCha20Poly1305,
    /// XAES-256-GCM: AES-256-GCM under a key derived from the key and the
    /// nonce's first 12 bytes, with its last 12 bytes as the GCM nonce
    /// (c2sp.org/XAES-256-GCM). Two to three times XChaCha20-Poly1305's
    /// speed on CPUs with AES and carry-less multiply instructions.
    Xaes256Gcm,
}

impl Cipher {
    /// How `cairn info` names it.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::XChaCha20Poly1305 => "XChaCha20-Poly1305",
            Cipher::Xaes256Gcm => "XAES-256-GCM",
        }
    }

    /// Bytes at the front of a nonce that derive the subkey.
    fn key_nonce_len(self) -> usize {
        match self {
            Cipher::XChaCha20Poly1305 => 16,
            Cipher::Xaes256Gcm => KEY_NONCE_LEN,
        }
    }
}

/// What derives a subkey from a nonce's first bytes.
#[derive(Clone)]
enum Engine {
    XChaCha(Zeroizing<[u8; 32]>),
    Xaes(Box<XaesKey>),
}

/// Seals and opens values under one key with one cipher. Both ciphers'
/// bulk work is ring's (BoringSSL's vectorized code); the subkey
/// derivations are RustCrypto's HChaCha20 (`chacha20`) and AES (`aes`),
/// and the bytes are the references' (tested against `chacha20poly1305`'s
/// `XChaCha20Poly1305` and XAES-256-GCM's published vectors).
#[derive(Clone)]
pub struct Sealer {
    engine: Engine,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealer({}, ..)", self.cipher().name())
    }
}

/// The subkey last derived, kept while the nonces' key parts agree (the
/// spans of a chunk sealed with XAES-256-GCM share theirs, so a chunk's
/// spans derive one key, sealed or opened in a run).
#[derive(Default)]
pub struct SubkeyCache {
    last: Option<([u8; 16], LessSafeKey)>,
}

impl Sealer {
    /// An XChaCha20-Poly1305 sealer with key `key`.
    pub fn new(key: &Zeroizing<[u8; 32]>) -> Self {
        Sealer::with_cipher(key, Cipher::XChaCha20Poly1305)
    }

    /// A sealer with key `key` and cipher `cipher`.
    pub fn with_cipher(key: &Zeroizing<[u8; 32]>, cipher: Cipher) -> Self {
        let engine = match cipher {
            Cipher::XChaCha20Poly1305 => Engine::XChaCha(key.clone()),
            Cipher::Xaes256Gcm => Engine::Xaes(Box::new(XaesKey::new(key))),
        };
        Sealer { engine }
    }

    /// This sealer's cipher.
    pub fn cipher(&self) -> Cipher {
        match self.engine {
            Engine::XChaCha(_) => Cipher::XChaCha20Poly1305,
            Engine::Xaes(_) => Cipher::Xaes256Gcm,
        }
    }

    /// The subkey of the nonces starting with `part` (the subkey's bytes
    /// are wiped once ring has it).
    fn subkey_of(&self, part: &[u8]) -> LessSafeKey {
        match &self.engine {
            Engine::XChaCha(key) => {
                let mut sub = chacha20::hchacha::<U10>(
                    key.as_ref().into(),
                    chacha20::cipher::generic_array::GenericArray::from_slice(part),
                );
                let unbound = UnboundKey::new(&CHACHA20_POLY1305, &sub)
                    .expect("a ChaCha20-Poly1305 key is 32 bytes");
                sub.as_mut_slice().zeroize();
                LessSafeKey::new(unbound)
            }
            Engine::Xaes(key) => key.derive(part),
        }
    }

    /// The subkey and 96-bit nonce of the 192-bit nonce `xnonce`, from
    /// `cache` when its key part is the last one's.
    fn subkey<'c>(&self, xnonce: &[u8], cache: &'c mut SubkeyCache) -> (&'c LessSafeKey, Nonce) {
        assert_eq!(xnonce.len(), NONCE_LEN, "a 192-bit nonce");
        let n = self.cipher().key_nonce_len();
        let mut part = [0u8; 16];
        part[..n].copy_from_slice(&xnonce[..n]);
        if cache.last.as_ref().is_none_or(|(p, _)| *p != part) {
            cache.last = Some((part, self.subkey_of(&xnonce[..n])));
        }
        let mut nonce = [0u8; 12];
        nonce[12 - (NONCE_LEN - n)..].copy_from_slice(&xnonce[n..]);
        let key = &cache.last.as_ref().expect("just derived").1;
        (key, Nonce::assume_unique_for_key(nonce))
    }

    /// Appends `nonce | ciphertext | tag` of `plain`, bound to `aad`, to
    /// `out`; returns the bytes appended (`plain.len() + OVERHEAD`).
    pub fn seal_into(&self, aad: &[u8], plain: &[u8], out: &mut Vec<u8>) -> usize {
        let xnonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let start = out.len();
        out.reserve(plain.len() + OVERHEAD);
        self.seal_with(&xnonce, aad, plain, out, &mut SubkeyCache::default());
        assert_eq!(
            out.len() - start,
            plain.len() + OVERHEAD,
            "a tag per sealed value"
        );
        out.len() - start
    }

    /// Seals each `span` bytes of `plain` (the last part may be shorter)
    /// as `seal_into` would, one after another into `out`, part `i` bound
    /// to `aad(i)`; the random nonces are drawn from the OS in one call.
    /// Under XAES-256-GCM the spans share their nonces' key part (one
    /// subkey derived per call) and differ in their 96-bit GCM nonces,
    /// random too: 256 spans' collide with a chance under 2^-80.
    /// Returns the bytes appended.
    pub fn seal_spans_into<A: AsRef<[u8]>>(
        &self,
        plain: &[u8],
        span: usize,
        aad: impl Fn(usize) -> A,
        out: &mut Vec<u8>,
    ) -> usize {
        assert!(span > 0, "spans of some bytes");
        let count = plain.len().div_ceil(span);
        let mut nonces = Zeroizing::new(vec![0u8; count * NONCE_LEN]);
        OsRng.fill_bytes(&mut nonces);
        if self.cipher() == Cipher::Xaes256Gcm {
            let (first, rest) = nonces.split_at_mut(NONCE_LEN);
            for n in rest.chunks_mut(NONCE_LEN) {
                n[..KEY_NONCE_LEN].copy_from_slice(&first[..KEY_NONCE_LEN]);
            }
        }
        let start = out.len();
        out.reserve(plain.len() + count * OVERHEAD);
        let mut cache = SubkeyCache::default();
        for (i, (part, xnonce)) in plain.chunks(span).zip(nonces.chunks(NONCE_LEN)).enumerate() {
            self.seal_with(xnonce, aad(i).as_ref(), part, out, &mut cache);
        }
        assert_eq!(
            out.len() - start,
            plain.len() + count * OVERHEAD,
            "a seal per span"
        );
        out.len() - start
    }

    /// Appends `xnonce | ciphertext | tag` of `plain`, bound to `aad`.
    fn seal_with(
        &self,
        xnonce: &[u8],
        aad: &[u8],
        plain: &[u8],
        out: &mut Vec<u8>,
        cache: &mut SubkeyCache,
    ) {
        let (key, nonce) = self.subkey(xnonce, cache);
        let start = out.len();
        out.extend_from_slice(xnonce);
        out.extend_from_slice(plain);
        let tag = key
            .seal_in_place_separate_tag(nonce, Aad::from(aad), &mut out[start + NONCE_LEN..])
            .expect("both ciphers seal any length a chunk or element has");
        out.extend_from_slice(tag.as_ref());
    }

    /// `nonce | ciphertext | tag` of `plain`, bound to `aad`.
    pub fn seal(&self, aad: &[u8], plain: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plain.len() + OVERHEAD);
        self.seal_into(aad, plain, &mut out);
        out
    }

    /// The plaintext of `sealed` if it authenticates under this key and
    /// `aad`; never any byte of a value that does not.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CryptError> {
        let mut out = Vec::with_capacity(sealed.len().saturating_sub(OVERHEAD));
        self.open_into(aad, sealed, &mut out)?;
        Ok(out)
    }

    /// Appends the plaintext of `sealed` to `out` if it authenticates
    /// under this key and `aad`, and returns its length; on a failure
    /// `out` is as it was (the bytes decrypted are wiped, never kept).
    pub fn open_into(
        &self,
        aad: &[u8],
        sealed: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, CryptError> {
        let (xnonce, ct, tag) = split(sealed)?;
        let start = out.len();
        out.extend_from_slice(ct);
        let opened = self.open_in_place(
            aad,
            xnonce,
            tag,
            &mut out[start..],
            &mut SubkeyCache::default(),
        );
        match opened {
            Ok(()) => Ok(ct.len()),
            Err(e) => {
                out.truncate(start);
                Err(e)
            }
        }
    }

    /// Opens `sealed` into `dst` (exactly its plaintext's length) if it
    /// authenticates under this key and `aad`, with the subkey from
    /// `cache` when the nonce's key part is the last one's (the spans of
    /// one chunk, opened in a run); on a failure `dst` is zeroed, never
    /// left holding decrypted bytes.
    pub fn open_to_slice(
        &self,
        aad: &[u8],
        sealed: &[u8],
        dst: &mut [u8],
        cache: &mut SubkeyCache,
    ) -> Result<(), CryptError> {
        let (xnonce, ct, tag) = split(sealed)?;
        assert_eq!(dst.len(), ct.len(), "room for the plaintext");
        dst.copy_from_slice(ct);
        self.open_in_place(aad, xnonce, tag, dst, cache)
    }

    /// Decrypts ciphertext `buf` in place if it and `aad` authenticate
    /// under `xnonce` and `tag`; on a failure `buf` is zeroed.
    fn open_in_place(
        &self,
        aad: &[u8],
        xnonce: &[u8],
        tag: ring::aead::Tag,
        buf: &mut [u8],
        cache: &mut SubkeyCache,
    ) -> Result<(), CryptError> {
        let (key, nonce) = self.subkey(xnonce, cache);
        if key
            .open_in_place_separate_tag(nonce, Aad::from(aad), tag, buf, 0..)
            .is_err()
        {
            buf.zeroize();
            return Err(CryptError::Authentication);
        }
        Ok(())
    }
}

/// A sealed value's nonce, ciphertext and tag; `Short` when it is shorter
/// than its nonce and tag.
fn split(sealed: &[u8]) -> Result<(&[u8], &[u8], ring::aead::Tag), CryptError> {
    if sealed.len() < OVERHEAD {
        return Err(CryptError::Short(sealed.len()));
    }
    let (xnonce, rest) = sealed.split_at(NONCE_LEN);
    let (ct, tag) = rest.split_at(rest.len() - TAG_LEN);
    let tag = ring::aead::Tag::try_from(tag).expect("a 16-byte tag");
    Ok((xnonce, ct, tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CIPHERS: [Cipher; 2] = [Cipher::XChaCha20Poly1305, Cipher::Xaes256Gcm];

    /// A sealer of each cipher with key `b`.
    fn sealers(b: u8) -> [Sealer; 2] {
        CIPHERS.map(|c| Sealer::with_cipher(&Zeroizing::new([b; 32]), c))
    }

    #[test]
    fn a_value_opens_only_with_its_key_place_and_cipher() {
        for (s, other) in sealers(1).into_iter().zip(sealers(2)) {
            opens_only_with_its_key_and_place(&s, &other);
        }
        let [chacha, xaes] = sealers(1);
        let sealed = xaes.seal(b"chunk 7", b"secret bytes");
        assert_eq!(
            chacha.open(b"chunk 7", &sealed),
            Err(CryptError::Authentication)
        );
        let sealed = chacha.seal(b"chunk 7", b"secret bytes");
        assert_eq!(
            xaes.open(b"chunk 7", &sealed),
            Err(CryptError::Authentication)
        );
    }

    fn opens_only_with_its_key_and_place(s: &Sealer, other: &Sealer) {
        let sealed = s.seal(b"chunk 7", b"secret bytes");
        assert_eq!(sealed.len(), 12 + OVERHEAD);
        assert_eq!(s.open(b"chunk 7", &sealed).unwrap(), b"secret bytes");
        assert_eq!(s.open(b"chunk 8", &sealed), Err(CryptError::Authentication));
        assert_eq!(
            other.open(b"chunk 7", &sealed),
            Err(CryptError::Authentication)
        );
        assert_eq!(
            s.open(b"", &sealed[..OVERHEAD - 1]),
            Err(CryptError::Short(39))
        );
    }

    #[test]
    fn the_bytes_are_xchacha20_poly1305s() {
        use chacha20poly1305::aead::{Aead, KeyInit, Payload};
        let key = Zeroizing::new([9u8; 32]);
        let (s, reference) = (
            Sealer::new(&key),
            XChaCha20Poly1305::new(key.as_ref().into()),
        );
        for len in [0, 1, 63, 64, 65, 4096, 65_536 + 7] {
            let plain: Vec<u8> = (0..len)
                .map(|i: usize| (i * 7 + len).to_le_bytes()[0])
                .collect();
            let sealed = s.seal(b"place", &plain);
            let (nonce, ct) = sealed.split_at(NONCE_LEN);
            let msg = Payload {
                msg: plain.as_slice(),
                aad: b"place",
            };
            let theirs = reference.encrypt(nonce.into(), msg).unwrap();
            assert_eq!(ct, theirs.as_slice(), "{len} bytes sealed differently");
            let back = Payload {
                msg: ct,
                aad: b"place",
            };
            assert_eq!(reference.decrypt(nonce.into(), back).unwrap(), plain);
            assert_eq!(s.open(b"place", &sealed).unwrap(), plain);
        }
        // And a value sealed by the reference opens here.
        let nonce = [5u8; NONCE_LEN];
        let theirs = reference
            .encrypt((&nonce).into(), &b"from elsewhere"[..])
            .unwrap();
        let sealed = [nonce.as_slice(), &theirs].concat();
        assert_eq!(s.open(b"", &sealed).unwrap(), b"from elsewhere");
    }

    /// XAES-256-GCM's published vectors, sealed and opened through a
    /// sealer (the nonce split into key part and GCM nonce as specified).
    #[test]
    fn the_bytes_are_xaes_256_gcms() {
        let nonce = b"ABCDEFGHIJKLMNOPQRSTUVWX";
        for (b, aad, ct) in [
            (
                1,
                &b""[..],
                "ce546ef63c9cc60765923609b33a9a1974e96e52daf2fcf7075e2271",
            ),
            (
                3,
                b"c2sp.org/XAES-256-GCM",
                "986ec1832593df5443a179437fd083bf3fdb41abd740a21f71eb769d",
            ),
        ] {
            let s = &sealers(b)[1];
            let mut out = Vec::new();
            s.seal_with(
                nonce,
                aad,
                b"XAES-256-GCM",
                &mut out,
                &mut SubkeyCache::default(),
            );
            let hex: String = out[NONCE_LEN..]
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect();
            assert_eq!((&out[..NONCE_LEN], hex.as_str()), (&nonce[..], ct));
            assert_eq!(s.open(aad, &out).unwrap(), b"XAES-256-GCM");
        }
    }

    #[test]
    fn spans_sealed_together_open_alone_with_their_own_nonces() {
        for s in sealers(6) {
            spans_open_alone(&s);
        }
    }

    fn spans_open_alone(s: &Sealer) {
        let plain: Vec<u8> = (0..10_000u32).map(|i| i.to_le_bytes()[0]).collect();
        let mut out = vec![0xee];
        let n = s.seal_spans_into(&plain, 4096, |i| [i.to_le_bytes()[0]; 3], &mut out);
        assert_eq!(n, plain.len() + 3 * OVERHEAD);
        assert_eq!(out[0], 0xee, "appended after what was there");
        let sealed: Vec<&[u8]> = out[1..].chunks(4096 + OVERHEAD).collect();
        let nonces: std::collections::HashSet<&[u8]> =
            sealed.iter().map(|p| &p[..NONCE_LEN]).collect();
        assert_eq!(nonces.len(), 3, "a nonce of its own per span");
        let tails: std::collections::HashSet<&[u8]> = sealed
            .iter()
            .map(|p| &p[KEY_NONCE_LEN..NONCE_LEN])
            .collect();
        assert_eq!(tails.len(), 3, "a GCM nonce of its own per span");
        let keys: std::collections::HashSet<&[u8]> =
            sealed.iter().map(|p| &p[..KEY_NONCE_LEN]).collect();
        let shared = s.cipher() == Cipher::Xaes256Gcm;
        assert_eq!(keys.len(), if shared { 1 } else { 3 }, "{s:?}");
        let (mut cache, mut run) = (SubkeyCache::default(), vec![0u8; plain.len()]);
        for (i, (part, want)) in sealed.iter().zip(plain.chunks(4096)).enumerate() {
            let aad = [i.to_le_bytes()[0]; 3];
            assert_eq!(s.open(&aad, part).unwrap(), want, "span {i}");
            let at = i * 4096;
            (s.open_to_slice(&aad, part, &mut run[at..at + want.len()], &mut cache)).unwrap();
            let mut dst = vec![0u8; want.len()];
            s.open_to_slice(&aad, part, &mut dst, &mut cache).unwrap();
            assert_eq!(dst, want, "span {i} opened into a slice");
            let other = [(i + 2).to_le_bytes()[0]; 3];
            assert!(s.open_to_slice(&other, part, &mut dst, &mut cache).is_err());
            assert!(dst.iter().all(|&b| b == 0), "nothing kept of a failed open");
            let other = [(i + 1).to_le_bytes()[0]; 3];
            assert_eq!(s.open(&other, part), Err(CryptError::Authentication));
        }
        assert_eq!(run, plain, "opened in a run with one cache");
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        for s in sealers(3) {
            flips_refused(&s);
        }
    }

    fn flips_refused(s: &Sealer) {
        let sealed = s.seal(b"aad", &[0x5a; 100]);
        for byte in 0..sealed.len() {
            for bit in 0..8 {
                let mut b = sealed.clone();
                b[byte] ^= 1 << bit;
                assert!(
                    s.open(b"aad", &b).is_err(),
                    "flip of bit {bit} of byte {byte}"
                );
            }
        }
    }

    #[test]
    fn the_same_plaintext_sealed_twice_differs_and_nonces_do_not_repeat() {
        for s in sealers(4) {
            never_repeats(&s);
        }
    }

    fn never_repeats(s: &Sealer) {
        let mut nonces = std::collections::HashSet::new();
        let mut bodies = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let sealed = s.seal(b"same place", b"same plaintext");
            assert!(
                nonces.insert(sealed[..NONCE_LEN].to_vec()),
                "a nonce repeated"
            );
            assert!(
                bodies.insert(sealed[NONCE_LEN..].to_vec()),
                "a ciphertext repeated"
            );
        }
    }
}
