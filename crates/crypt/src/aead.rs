//! Authenticated encryption of one value: XChaCha20-Poly1305 with a
//! random 192-bit nonce per value (from the OS's generator), stored in
//! front of the ciphertext: `nonce (24) | ciphertext | tag (16)`. Nonces
//! are never counted or derived, so no crash, restore or copy of a pool
//! can make one repeat; the chance that two of 2^64 random nonces agree is
//! about 2^-65. The associated data binds each value to its place (the
//! caller's: a chunk's id, an element's key and TID), so a value moved
//! elsewhere fails authentication.

use crate::error::CryptError;
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

/// Seals and opens values under one key.
///
/// XChaCha20-Poly1305 is ChaCha20-Poly1305 (RFC 8439) under a subkey:
/// HChaCha20 of the key and the nonce's first 16 bytes gives the subkey,
/// and the nonce's last 8 bytes, after four zero bytes, are the 96-bit
/// nonce (draft-irtf-cfrg-xchacha, section 2.3). Here HChaCha20 is
/// RustCrypto's (`chacha20`) and ChaCha20-Poly1305 ring's (BoringSSL's
/// vectorized code), about twice as fast as RustCrypto's whole
/// construction on this project's machines; the bytes are the same
/// (tested against `chacha20poly1305`'s `XChaCha20Poly1305`).
#[derive(Clone)]
pub struct Sealer {
    key: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    /// A sealer with key `key`.
    pub fn new(key: &Zeroizing<[u8; 32]>) -> Self {
        Sealer { key: key.clone() }
    }

    /// The ChaCha20-Poly1305 key and nonce of the XChaCha20-Poly1305
    /// nonce `xnonce` (the subkey's bytes are wiped once ring has it).
    fn subkey(&self, xnonce: &[u8]) -> (LessSafeKey, Nonce) {
        assert_eq!(xnonce.len(), NONCE_LEN, "an XChaCha20 nonce");
        let mut sub = chacha20::hchacha::<U10>(
            self.key.as_ref().into(),
            chacha20::cipher::generic_array::GenericArray::from_slice(&xnonce[..16]),
        );
        let key =
            UnboundKey::new(&CHACHA20_POLY1305, &sub).expect("a ChaCha20-Poly1305 key is 32 bytes");
        sub.as_mut_slice().zeroize();
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&xnonce[16..]);
        (LessSafeKey::new(key), Nonce::assume_unique_for_key(nonce))
    }

    /// Appends `nonce | ciphertext | tag` of `plain`, bound to `aad`, to
    /// `out`; returns the bytes appended (`plain.len() + OVERHEAD`).
    pub fn seal_into(&self, aad: &[u8], plain: &[u8], out: &mut Vec<u8>) -> usize {
        let xnonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let start = out.len();
        out.reserve(plain.len() + OVERHEAD);
        self.seal_with(&xnonce, aad, plain, out);
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
        let start = out.len();
        out.reserve(plain.len() + count * OVERHEAD);
        for (i, (part, xnonce)) in plain.chunks(span).zip(nonces.chunks(NONCE_LEN)).enumerate() {
            self.seal_with(xnonce, aad(i).as_ref(), part, out);
        }
        assert_eq!(
            out.len() - start,
            plain.len() + count * OVERHEAD,
            "a seal per span"
        );
        out.len() - start
    }

    /// Appends `xnonce | ciphertext | tag` of `plain`, bound to `aad`.
    fn seal_with(&self, xnonce: &[u8], aad: &[u8], plain: &[u8], out: &mut Vec<u8>) {
        let (key, nonce) = self.subkey(xnonce);
        let start = out.len();
        out.extend_from_slice(xnonce);
        out.extend_from_slice(plain);
        let tag = key
            .seal_in_place_separate_tag(nonce, Aad::from(aad), &mut out[start + NONCE_LEN..])
            .expect("ChaCha20-Poly1305 seals any length a chunk or element has");
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
        if sealed.len() < OVERHEAD {
            return Err(CryptError::Short(sealed.len()));
        }
        let (xnonce, ct) = sealed.split_at(NONCE_LEN);
        let (key, nonce) = self.subkey(xnonce);
        let start = out.len();
        out.extend_from_slice(ct);
        let n = match key.open_in_place(nonce, Aad::from(aad), &mut out[start..]) {
            Ok(plain) => plain.len(),
            Err(_) => {
                out[start..].zeroize();
                out.truncate(start);
                return Err(CryptError::Authentication);
            }
        };
        assert_eq!(n + TAG_LEN, ct.len(), "the tag is all that is dropped");
        out.truncate(start + n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(b: u8) -> Sealer {
        Sealer::new(&Zeroizing::new([b; 32]))
    }

    #[test]
    fn a_value_opens_only_with_its_key_and_place() {
        let (s, other) = (sealer(1), sealer(2));
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

    #[test]
    fn spans_sealed_together_open_alone_with_their_own_nonces() {
        let s = sealer(6);
        let plain: Vec<u8> = (0..10_000u32).map(|i| i.to_le_bytes()[0]).collect();
        let mut out = vec![0xee];
        let n = s.seal_spans_into(&plain, 4096, |i| [i.to_le_bytes()[0]; 3], &mut out);
        assert_eq!(n, plain.len() + 3 * OVERHEAD);
        assert_eq!(out[0], 0xee, "appended after what was there");
        let sealed: Vec<&[u8]> = out[1..].chunks(4096 + OVERHEAD).collect();
        let nonces: std::collections::HashSet<&[u8]> =
            sealed.iter().map(|p| &p[..NONCE_LEN]).collect();
        assert_eq!(nonces.len(), 3, "a nonce of its own per span");
        for (i, (part, want)) in sealed.iter().zip(plain.chunks(4096)).enumerate() {
            let aad = [i.to_le_bytes()[0]; 3];
            assert_eq!(s.open(&aad, part).unwrap(), want, "span {i}");
            let other = [(i + 1).to_le_bytes()[0]; 3];
            assert_eq!(s.open(&other, part), Err(CryptError::Authentication));
        }
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let s = sealer(3);
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
        let s = sealer(4);
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
