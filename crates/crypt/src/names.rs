//! Names in metadata keys (directory entries, xattr names): sealed with a
//! deterministic authenticated cipher (AES-256-SIV, RFC 5297), because a
//! key must be computed again from the name to look it up, and ordered by
//! a keyed hash, so that a name can neither be read nor confirmed from
//! outside the pool. The associated data binds each sealed name to its
//! place (the directory or inode and the kind of key), so that equal names
//! in two directories look unrelated and a sealed name moved elsewhere
//! fails authentication.

use crate::error::CryptError;
use aes_siv::siv::Aes256Siv;
use aes_siv::KeyInit;
use zeroize::Zeroizing;

/// What sealing adds to a name: the synthetic IV, which is also its tag.
pub const NAME_OVERHEAD: usize = 16;

/// Seals and opens names, and hashes them with a key.
pub struct NameSealer {
    siv: Zeroizing<[u8; 64]>,
    hash: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for NameSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NameSealer(..)")
    }
}

impl NameSealer {
    /// A sealer from a 64-byte SIV key (MAC half, cipher half) and a
    /// 32-byte hash key.
    pub fn new(siv: Zeroizing<[u8; 64]>, hash: Zeroizing<[u8; 32]>) -> NameSealer {
        assert!(
            siv.iter().any(|&b| b != 0) && hash.iter().any(|&b| b != 0),
            "a name key of zeros"
        );
        NameSealer { siv, hash }
    }

    fn cipher(&self) -> Aes256Siv {
        Aes256Siv::new(self.siv.as_ref().into())
    }

    /// `name` sealed, bound to `place`: always the same bytes for the same
    /// name and place, `NAME_OVERHEAD` longer than the name.
    pub fn seal(&self, place: &[u8], name: &[u8]) -> Vec<u8> {
        let out =
            (self.cipher().encrypt([place], name)).expect("AES-SIV takes any name with one header");
        assert_eq!(out.len(), name.len() + NAME_OVERHEAD);
        out
    }

    /// The name `sealed` holds, if it was sealed at `place` with this key.
    pub fn open(&self, place: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CryptError> {
        if sealed.len() < NAME_OVERHEAD {
            return Err(CryptError::Short(sealed.len()));
        }
        (self.cipher().decrypt([place], sealed)).map_err(|_| CryptError::Authentication)
    }

    /// BLAKE3 of `place | name`, keyed: what orders sealed names.
    pub fn hash(&self, place: &[u8], name: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.hash);
        h.update(&(place.len() as u64).to_le_bytes());
        h.update(place);
        h.update(name);
        *h.finalize().as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(b: u8) -> NameSealer {
        NameSealer::new(Zeroizing::new([b; 64]), Zeroizing::new([b; 32]))
    }

    #[test]
    fn a_name_seals_the_same_way_at_one_place_and_differently_elsewhere() {
        let s = sealer(7);
        let a = s.seal(b"dir 1", b"secret-plans.txt");
        assert_eq!(a, s.seal(b"dir 1", b"secret-plans.txt"));
        assert_ne!(a, s.seal(b"dir 2", b"secret-plans.txt"));
        assert!(!a.windows(6).any(|w| w == b"secret"));
        assert_eq!(s.open(b"dir 1", &a).unwrap(), b"secret-plans.txt");
        assert_eq!(s.open(b"dir 2", &a), Err(CryptError::Authentication));
        assert_eq!(
            sealer(8).open(b"dir 1", &a),
            Err(CryptError::Authentication)
        );
        let mut flipped = a.clone();
        flipped[3] ^= 1;
        assert_eq!(s.open(b"dir 1", &flipped), Err(CryptError::Authentication));
        assert_eq!(s.open(b"dir 1", &a[..15]), Err(CryptError::Short(15)));
        assert_eq!(s.open(b"dir 1", &s.seal(b"dir 1", b"")).unwrap(), b"");
    }

    #[test]
    fn the_hash_is_keyed_and_bound_to_its_place() {
        let s = sealer(7);
        assert_eq!(s.hash(b"d", b"n"), s.hash(b"d", b"n"));
        assert_ne!(s.hash(b"d", b"n"), s.hash(b"e", b"n"));
        assert_ne!(s.hash(b"d", b"n"), sealer(8).hash(b"d", b"n"));
        assert_ne!(s.hash(b"d", b"n"), *blake3::hash(b"n").as_bytes());
        // The place's length is hashed: "ab"|"c" is not "a"|"bc".
        assert_ne!(s.hash(b"ab", b"c"), s.hash(b"a", b"bc"));
    }
}
