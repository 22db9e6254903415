//! The pool's data key and the keys derived from it, one per purpose
//! (BLAKE3 `derive_key` with a context string per purpose): what seals
//! chunks, and the key of the content hash that names chunks for dedup
//! (keyed BLAKE3, so that equal plaintext can be found inside the pool but
//! not confirmed from outside it).

use crate::aead::{Cipher, Sealer};
use crate::names::NameSealer;
use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::OsRng;
use zeroize::Zeroizing;

/// The context of each derived key. Changing one makes every pool
/// unreadable: they are part of the format (docs/FORMAT.md).
const CHUNK_CONTEXT: &str = "cairn 2026-12 chunk sealing key";
const CONTENT_HASH_CONTEXT: &str = "cairn 2026-12 chunk content hash key";
const LOG_CONTEXT: &str = "cairn 2026-12 intent log record key";
const ELEMENT_CONTEXT: &str = "cairn 2026-12 metadata element value key";
const NAME_CONTEXT: &str = "cairn 2026-12 metadata name sealing key";
const NAME_HASH_CONTEXT: &str = "cairn 2026-12 metadata name hash key";

/// The pool's 256-bit data key: random at mkfs, kept on disk only wrapped.
pub struct DataKey(pub(crate) Zeroizing<[u8; 32]>);

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(..)")
    }
}

impl DataKey {
    /// A new random data key from the OS's generator.
    pub fn random() -> DataKey {
        let mut k = Zeroizing::new([0u8; 32]);
        OsRng.fill_bytes(k.as_mut());
        assert!(k.iter().any(|&b| b != 0), "the OS generator gave zeros");
        DataKey(k)
    }

    fn derive(&self, context: &str) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(blake3::derive_key(context, self.0.as_ref()))
    }

    /// A 64-byte key (AES-SIV takes two 256-bit keys) from BLAKE3's
    /// extendable output.
    fn derive_long(&self, context: &str) -> Zeroizing<[u8; 64]> {
        let mut out = Zeroizing::new([0u8; 64]);
        let mut h = blake3::Hasher::new_derive_key(context);
        h.update(self.0.as_ref());
        h.finalize_xof().fill(out.as_mut());
        out
    }
}

/// The keys an open encrypted pool works with.
pub struct PoolKeys {
    /// Seals every chunk's stored bytes, with the pool's chunk cipher.
    pub chunks: Sealer,
    /// Seals the payload of every intent log record.
    pub log: Sealer,
    /// Seals the payload of every metadata element value.
    pub elements: Sealer,
    /// Seals the names in metadata keys (entries, xattr names).
    pub names: NameSealer,
    content_key: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for PoolKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolKeys(..)")
    }
}

impl PoolKeys {
    /// The keys derived from `key`, chunks sealed with `chunks` (the key
    /// block's cipher; everything else with XChaCha20-Poly1305).
    pub fn derive(key: &DataKey, chunks: Cipher) -> PoolKeys {
        PoolKeys {
            chunks: Sealer::with_cipher(&key.derive(CHUNK_CONTEXT), chunks),
            log: Sealer::new(&key.derive(LOG_CONTEXT)),
            elements: Sealer::new(&key.derive(ELEMENT_CONTEXT)),
            names: NameSealer::new(key.derive_long(NAME_CONTEXT), key.derive(NAME_HASH_CONTEXT)),
            content_key: key.derive(CONTENT_HASH_CONTEXT),
        }
    }

    /// The content hash of `data` in this pool: BLAKE3 keyed with the
    /// pool's content key.
    pub fn content_hash(&self, data: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&self.content_key, data).as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_purpose_has_its_own_key_and_the_content_hash_is_keyed() {
        let k = DataKey::random();
        let keys = PoolKeys::derive(&k, Cipher::Xaes256Gcm);
        let contexts = [
            CHUNK_CONTEXT,
            CONTENT_HASH_CONTEXT,
            LOG_CONTEXT,
            ELEMENT_CONTEXT,
            NAME_CONTEXT,
            NAME_HASH_CONTEXT,
        ];
        let derived: std::collections::HashSet<[u8; 32]> =
            contexts.iter().map(|c| *k.derive(c)).collect();
        assert_eq!(derived.len(), contexts.len(), "a key per purpose");
        let data = b"the same bytes";
        assert_ne!(keys.content_hash(data), *blake3::hash(data).as_bytes());
        assert_eq!(keys.content_hash(data), keys.content_hash(data));
        let other = PoolKeys::derive(&DataKey::random(), Cipher::Xaes256Gcm);
        assert_ne!(keys.content_hash(data), other.content_hash(data));
        let sealed = keys.chunks.seal(b"id", data);
        assert!(other.chunks.open(b"id", &sealed).is_err());
    }
}
