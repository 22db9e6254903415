//! XAES-256-GCM's key derivation (C2SP, c2sp.org/XAES-256-GCM): AES-256-GCM
//! with a 192-bit nonce, whose first 96 bits derive a fresh AES-256-GCM key
//! through NIST SP 800-108r1's counter KDF over AES-256-CMAC, and whose
//! last 96 bits are that key's GCM nonce. The two block encryptions of the
//! derivation are RustCrypto's `aes` (AES-NI); AES-256-GCM itself is
//! ring's (BoringSSL's vectorized code). Only the derivation is composed
//! here, as the specification writes it; its output is tested against the
//! specification's vectors.
//!
//! ```text
//! L  = AES-256_K(0^128)
//! K1 = L << 1, XORed with 0x87 in its last byte if L's top bit was set
//! M1 = 0x00 0x01 'X' 0x00 | N[..12]      M2 = 0x00 0x02 'X' 0x00 | N[..12]
//! Kx = AES-256_K(M1 ^ K1) | AES-256_K(M2 ^ K1),  Nx = N[12..]
//! ```

use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes256;
use ring::aead::{LessSafeKey, UnboundKey, AES_256_GCM};
use zeroize::{Zeroize, Zeroizing};

/// Bytes of the nonce part that derives the key.
pub const KEY_NONCE_LEN: usize = 12;

/// The key-derivation half of an XAES-256-GCM key: AES-256 under the key,
/// and the CMAC subkey K1 (both wiped when dropped).
#[derive(Clone)]
pub struct XaesKey {
    aes: Aes256,
    k1: Zeroizing<[u8; 16]>,
}

impl XaesKey {
    /// The derivation state of XAES-256-GCM key `key`.
    pub fn new(key: &[u8; 32]) -> XaesKey {
        let aes = Aes256::new(GenericArray::from_slice(key));
        let mut l = GenericArray::from([0u8; 16]);
        aes.encrypt_block(&mut l);
        let mut k1 = Zeroizing::new([0u8; 16]);
        let top = l[0] >> 7;
        for i in 0..16 {
            let carry = if i < 15 { l[i + 1] >> 7 } else { 0 };
            k1[i] = (l[i] << 1) | carry;
        }
        k1[15] ^= 0x87 * top;
        l.as_mut_slice().zeroize();
        XaesKey { aes, k1 }
    }

    /// Kx, the AES-256-GCM key of the nonces that start with `n1`.
    pub fn derive_bytes(&self, n1: &[u8]) -> Zeroizing<[u8; 32]> {
        assert_eq!(n1.len(), KEY_NONCE_LEN, "an XAES key nonce");
        let mut kx = Zeroizing::new([0u8; 32]);
        for (half, counter) in kx.chunks_mut(16).zip([1u8, 2]) {
            let mut m = GenericArray::from([0u8; 16]);
            m[..4].copy_from_slice(&[0, counter, b'X', 0]);
            m[4..].copy_from_slice(n1);
            for (b, k) in m.iter_mut().zip(self.k1.iter()) {
                *b ^= k;
            }
            self.aes.encrypt_block(&mut m);
            half.copy_from_slice(&m);
            m.as_mut_slice().zeroize();
        }
        kx
    }

    /// Kx as ring's AES-256-GCM key.
    pub fn derive(&self, n1: &[u8]) -> LessSafeKey {
        let kx = self.derive_bytes(n1);
        let key = UnboundKey::new(&AES_256_GCM, kx.as_ref()).expect("an AES-256 key is 32 bytes");
        LessSafeKey::new(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::aead::{Aad, Nonce};

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// The two vectors of the specification: one with L's top bit clear,
    /// one with it set (the other branch of the doubling), with their
    /// derived keys and ciphertexts.
    #[test]
    fn the_specifications_vectors() {
        let nonce = b"ABCDEFGHIJKLMNOPQRSTUVWX";
        let cases: [(u8, &[u8], &str, &str); 2] = [
            (
                1,
                b"",
                "c8612c9ed53fe43e8e005b828a1631a0bbcb6ab2f46514ec4f439fcfd0fa969b",
                "ce546ef63c9cc60765923609b33a9a1974e96e52daf2fcf7075e2271",
            ),
            (
                3,
                b"c2sp.org/XAES-256-GCM",
                "e9c621d4cdd9b11b00a6427ad7e559aeedd66b3857646677748f8ca796cb3fd8",
                "986ec1832593df5443a179437fd083bf3fdb41abd740a21f71eb769d",
            ),
        ];
        for (b, aad, kx, ct) in cases {
            let key = XaesKey::new(&[b; 32]);
            assert_eq!(hex(key.derive_bytes(&nonce[..12]).as_ref()), kx);
            let mut data = b"XAES-256-GCM".to_vec();
            let n = Nonce::try_assume_unique_for_key(&nonce[12..]).unwrap();
            let tag = key
                .derive(&nonce[..12])
                .seal_in_place_separate_tag(n, Aad::from(aad), &mut data)
                .unwrap();
            data.extend_from_slice(tag.as_ref());
            assert_eq!(hex(&data), ct);
        }
    }
}
