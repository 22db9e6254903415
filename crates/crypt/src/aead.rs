//! Authenticated encryption of one value: XChaCha20-Poly1305 with a
//! random 192-bit nonce per value (from the OS's generator), stored in
//! front of the ciphertext: `nonce (24) | ciphertext | tag (16)`. Nonces
//! are never counted or derived, so no crash, restore or copy of a pool
//! can make one repeat; the chance that two of 2^64 random nonces agree is
//! about 2^-65. The associated data binds each value to its place (the
//! caller's: a chunk's id, an element's key and TID), so a value moved
//! elsewhere fails authentication.

use crate::error::CryptError;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

/// Bytes of the nonce in front of each sealed value.
pub const NONCE_LEN: usize = 24;
/// Bytes of the authentication tag after it.
pub const TAG_LEN: usize = 16;
/// Bytes a sealed value has beyond its plaintext.
pub const OVERHEAD: usize = NONCE_LEN + TAG_LEN;

/// Seals and opens values under one key.
#[derive(Clone)]
pub struct Sealer {
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    /// A sealer with key `key`.
    pub fn new(key: &Zeroizing<[u8; 32]>) -> Self {
        Sealer {
            cipher: XChaCha20Poly1305::new(key.as_ref().into()),
        }
    }

    /// Appends `nonce | ciphertext | tag` of `plain`, bound to `aad`, to
    /// `out`; returns the bytes appended (`plain.len() + OVERHEAD`).
    pub fn seal_into(&self, aad: &[u8], plain: &[u8], out: &mut Vec<u8>) -> usize {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let ct = (self.cipher)
            .encrypt(&nonce, Payload { msg: plain, aad })
            .expect("XChaCha20-Poly1305 seals any length a chunk or element has");
        assert_eq!(ct.len(), plain.len() + TAG_LEN, "a tag per sealed value");
        out.reserve(NONCE_LEN + ct.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        NONCE_LEN + ct.len()
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
        if sealed.len() < OVERHEAD {
            return Err(CryptError::Short(sealed.len()));
        }
        let (nonce, ct) = sealed.split_at(NONCE_LEN);
        (self.cipher)
            .decrypt(XNonce::from_slice(nonce), Payload { msg: ct, aad })
            .map_err(|_| CryptError::Authentication)
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
