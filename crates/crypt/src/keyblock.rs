//! The key block, `POOL/key`: the pool's data key wrapped by the
//! administrator's secret, and how to derive the wrapping key again.
//! Written at mkfs and rewritten (never in place: a new file renamed over
//! the old) by `cairn key change`; nothing else depends on the secret.
//!
//! ```text
//! 0   magic "CAIRNKEY"             8
//! 8   format version u32           4   1
//! 12  chunk cipher u8              1   1 = XChaCha20-Poly1305, 2 = XAES-256-GCM
//! 13  key source u8                1   1 = passphrase (Argon2id), 2 = key file of 32 raw bytes
//! 14  reserved u16                 2   0
//! 16  Argon2id memory KiB u32      4   (0 for a raw key)
//! 20  Argon2id passes u32          4
//! 24  Argon2id lanes u32           4
//! 28  salt                         16
//! 44  pool uuid                    16
//! 60  created (unix secs) u64      8
//! 68  key last changed u64         8
//! 76  nonce                        24
//! 100 wrapped data key + tag       48
//! 148 crc32c of bytes 0..148 u32   4
//! ```
//!
//! The wrap's associated data is bytes 0..76, so no parameter, the pool
//! it belongs to, its chunks' cipher nor a date can be changed without the
//! unwrap failing. The chunk cipher is chosen at mkfs (XAES-256-GCM since
//! 2026-12-03; pools made before keep XChaCha20-Poly1305) and kept for the
//! pool's life: a span of a chunk is opened without its header, so the
//! pool, not the chunk, names the cipher. The wrap, element values, names
//! and intent log records are XChaCha20-Poly1305 in both.
//! The checksum tells damage ("the key block is damaged") from a wrong
//! secret ("wrong passphrase or key file").

use crate::aead::{Cipher, Sealer, NONCE_LEN, OVERHEAD};
use crate::error::CryptError;
use crate::keys::DataKey;
use crate::secret::Secret;
use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::OsRng;
use zeroize::Zeroizing;

pub const KEYBLOCK_MAGIC: &[u8; 8] = b"CAIRNKEY";
pub const KEYBLOCK_VERSION: u32 = 1;
pub const KEYBLOCK_LEN: usize = 152;
const CIPHER_XCHACHA: u8 = 1;
const CIPHER_XAES: u8 = 2;
const AAD_END: usize = 76;
const WRAPPED_END: usize = 148;
const _: () = assert!(AAD_END + NONCE_LEN + 32 + OVERHEAD - NONCE_LEN == WRAPPED_END);
const _: () = assert!(WRAPPED_END + 4 == KEYBLOCK_LEN);
/// The context that turns a raw key file into a wrapping key.
const RAW_WRAP_CONTEXT: &str = "cairn 2026-12 key file wrapping key";
/// Argon2id's cost at mkfs: 64 MiB, 3 passes, 1 lane (RFC 9106's second
/// recommendation, with the lanes of a small machine).
const ARGON_MEMORY_KIB: u32 = 64 << 10;
const ARGON_PASSES: u32 = 3;
const ARGON_LANES: u32 = 1;
/// The most memory a key block may ask Argon2id for (a damaged or hostile
/// block must not make `mount` allocate without bound): 1 GiB.
const ARGON_MAX_KIB: u32 = 1 << 20;

/// What wrapped the data key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// A passphrase, stretched with Argon2id.
    Passphrase,
    /// A key file of 32 raw bytes.
    RawKeyFile,
}

impl KeySource {
    fn of(secret: &Secret) -> KeySource {
        match secret {
            Secret::Passphrase(_) => KeySource::Passphrase,
            Secret::RawKey(_) => KeySource::RawKeyFile,
        }
    }

    /// How `cairn info` names it.
    pub fn name(self) -> &'static str {
        match self {
            KeySource::Passphrase => "passphrase (Argon2id)",
            KeySource::RawKeyFile => "key file (32 raw bytes)",
        }
    }
}

/// A decoded key block.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyBlock {
    /// The cipher of the pool's chunks.
    pub cipher: Cipher,
    pub source: KeySource,
    /// Argon2id's (memory KiB, passes, lanes); zeros for a raw key.
    pub argon: (u32, u32, u32),
    salt: [u8; 16],
    pub uuid: [u8; 16],
    pub created: u64,
    pub changed: u64,
    nonce: [u8; NONCE_LEN],
    wrapped: [u8; 48],
}

impl std::fmt::Debug for KeyBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyBlock")
            .field("cipher", &self.cipher)
            .field("source", &self.source)
            .field("argon", &self.argon)
            .field("created", &self.created)
            .field("changed", &self.changed)
            .finish_non_exhaustive()
    }
}

impl KeyBlock {
    /// A new data key, and the key block that wraps it with `secret`, for
    /// the pool `uuid`, whose chunks are sealed with XAES-256-GCM.
    pub fn create(
        secret: &Secret,
        uuid: [u8; 16],
        now: u64,
    ) -> Result<(KeyBlock, DataKey), CryptError> {
        let key = DataKey::random();
        let block = KeyBlock::wrap(&key, secret, (Cipher::Xaes256Gcm, uuid), now, now)?;
        Ok((block, key))
    }

    /// The data key, if `secret` unwraps it.
    pub fn unlock(&self, secret: &Secret) -> Result<DataKey, CryptError> {
        if KeySource::of(secret) != self.source {
            return Err(CryptError::WrongKey);
        }
        let wrapping = self.wrapping_key(secret)?;
        let mut sealed = Vec::with_capacity(NONCE_LEN + 48);
        sealed.extend_from_slice(&self.nonce);
        sealed.extend_from_slice(&self.wrapped);
        let plain = Zeroizing::new(
            Sealer::new(&wrapping)
                .open(&self.encode()[..AAD_END], &sealed)
                .map_err(|_| CryptError::WrongKey)?,
        );
        let mut k = Zeroizing::new([0u8; 32]);
        k.copy_from_slice(&plain);
        Ok(DataKey(k))
    }

    /// This block's data key wrapped with `new` instead of `old` (which
    /// must unlock it); the data key, and so every byte sealed with it,
    /// stays as it is.
    pub fn rewrap(&self, old: &Secret, new: &Secret, now: u64) -> Result<KeyBlock, CryptError> {
        let key = self.unlock(old)?;
        KeyBlock::wrap(&key, new, (self.cipher, self.uuid), self.created, now)
    }

    fn wrap(
        key: &DataKey,
        secret: &Secret,
        (cipher, uuid): (Cipher, [u8; 16]),
        created: u64,
        now: u64,
    ) -> Result<KeyBlock, CryptError> {
        let source = KeySource::of(secret);
        let mut salt = [0u8; 16];
        OsRng.fill_bytes(&mut salt);
        let argon = match source {
            KeySource::Passphrase => (ARGON_MEMORY_KIB, ARGON_PASSES, ARGON_LANES),
            KeySource::RawKeyFile => (0, 0, 0),
        };
        let mut b = KeyBlock {
            cipher,
            source,
            argon,
            salt,
            uuid,
            created,
            changed: now,
            nonce: [0; NONCE_LEN],
            wrapped: [0; 48],
        };
        let wrapping = b.wrapping_key(secret)?;
        let sealed = Sealer::new(&wrapping).seal(&b.encode()[..AAD_END], key.0.as_ref());
        b.nonce.copy_from_slice(&sealed[..NONCE_LEN]);
        b.wrapped.copy_from_slice(&sealed[NONCE_LEN..]);
        Ok(b)
    }

    /// The key that wraps the data key: Argon2id of the passphrase, or
    /// BLAKE3's key derivation of the raw key, each with this block's salt.
    fn wrapping_key(&self, secret: &Secret) -> Result<Zeroizing<[u8; 32]>, CryptError> {
        let mut out = Zeroizing::new([0u8; 32]);
        match secret {
            Secret::Passphrase(p) => {
                let (m, t, l) = self.argon;
                let params = argon2::Params::new(m, t, l, Some(32))
                    .map_err(|e| CryptError::Kdf(e.to_string()))?;
                argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
                    .hash_password_into(p, &self.salt, out.as_mut())
                    .map_err(|e| CryptError::Kdf(e.to_string()))?;
            }
            Secret::RawKey(k) => {
                let mut h = blake3::Hasher::new_derive_key(RAW_WRAP_CONTEXT);
                h.update(k.as_ref()).update(&self.salt);
                out.copy_from_slice(h.finalize().as_bytes());
            }
        }
        Ok(out)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(KEYBLOCK_LEN);
        b.extend_from_slice(KEYBLOCK_MAGIC);
        b.extend_from_slice(&KEYBLOCK_VERSION.to_le_bytes());
        b.push(match self.cipher {
            Cipher::XChaCha20Poly1305 => CIPHER_XCHACHA,
            Cipher::Xaes256Gcm => CIPHER_XAES,
        });
        b.push(match self.source {
            KeySource::Passphrase => 1,
            KeySource::RawKeyFile => 2,
        });
        b.extend_from_slice(&[0, 0]);
        for v in [self.argon.0, self.argon.1, self.argon.2] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.salt);
        b.extend_from_slice(&self.uuid);
        b.extend_from_slice(&self.created.to_le_bytes());
        b.extend_from_slice(&self.changed.to_le_bytes());
        assert_eq!(
            b.len(),
            AAD_END,
            "the associated data ends before the nonce"
        );
        b.extend_from_slice(&self.nonce);
        b.extend_from_slice(&self.wrapped);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(b.len(), KEYBLOCK_LEN);
        b
    }

    /// The one decoder of a key block: damage, an unknown version and
    /// parameters out of bounds are errors, never a panic.
    pub fn decode(b: &[u8]) -> Result<KeyBlock, CryptError> {
        let bad = |why: &str| CryptError::DamagedKeyBlock(why.to_string());
        if b.len() != KEYBLOCK_LEN {
            return Err(bad(&format!("{} bytes, not {KEYBLOCK_LEN}", b.len())));
        }
        if &b[..8] != KEYBLOCK_MAGIC {
            return Err(bad("no key block magic"));
        }
        let arr = |o: usize| -> [u8; 8] { core::array::from_fn(|i| b[o + i]) };
        let u32_at = |o: usize| u32::from_le_bytes(core::array::from_fn(|i| b[o + i]));
        if u32_at(WRAPPED_END) != crc32c::crc32c(&b[..WRAPPED_END]) {
            return Err(bad("checksum mismatch"));
        }
        if u32_at(8) != KEYBLOCK_VERSION {
            return Err(CryptError::UnknownVersion(u32_at(8)));
        }
        let cipher = match b[12] {
            CIPHER_XCHACHA => Cipher::XChaCha20Poly1305,
            CIPHER_XAES => Cipher::Xaes256Gcm,
            c => return Err(bad(&format!("unknown cipher {c}"))),
        };
        let source = match b[13] {
            1 => KeySource::Passphrase,
            2 => KeySource::RawKeyFile,
            s => return Err(bad(&format!("unknown key source {s}"))),
        };
        let argon = (u32_at(16), u32_at(20), u32_at(24));
        let sane = match source {
            KeySource::Passphrase => {
                (8..=ARGON_MAX_KIB).contains(&argon.0)
                    && (1..=64).contains(&argon.1)
                    && (1..=16).contains(&argon.2)
            }
            KeySource::RawKeyFile => argon == (0, 0, 0),
        };
        if !sane {
            return Err(bad(&format!(
                "key derivation parameters {argon:?} out of bounds"
            )));
        }
        Ok(KeyBlock {
            cipher,
            source,
            argon,
            salt: core::array::from_fn(|i| b[28 + i]),
            uuid: core::array::from_fn(|i| b[44 + i]),
            created: u64::from_le_bytes(arr(60)),
            changed: u64::from_le_bytes(arr(68)),
            nonce: core::array::from_fn(|i| b[76 + i]),
            wrapped: core::array::from_fn(|i| b[100 + i]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(b: u8) -> Secret {
        Secret::RawKey(Zeroizing::new([b; 32]))
    }

    #[test]
    fn a_key_block_unlocks_with_its_secret_only() {
        let (block, key) = KeyBlock::create(&raw(1), [9; 16], 100).unwrap();
        let back = KeyBlock::decode(&block.encode()).unwrap();
        assert_eq!(back, block);
        assert_eq!(*back.unlock(&raw(1)).unwrap().0, *key.0);
        assert_eq!(back.unlock(&raw(2)).unwrap_err(), CryptError::WrongKey);
        let pass = Secret::passphrase(b"pw").unwrap();
        assert_eq!(back.unlock(&pass).unwrap_err(), CryptError::WrongKey);
    }

    /// New pools seal chunks with XAES-256-GCM; a block of an older pool
    /// (cipher 1) still decodes and unlocks as XChaCha20-Poly1305, keeps
    /// its cipher through a rewrap, and the cipher byte is bound: changed
    /// (checksum redone), the block no longer unlocks.
    #[test]
    fn the_chunk_cipher_is_kept_and_bound() {
        let (block, key) = KeyBlock::create(&raw(5), [4; 16], 9).unwrap();
        assert_eq!(block.cipher, Cipher::Xaes256Gcm);
        let old =
            KeyBlock::wrap(&key, &raw(5), (Cipher::XChaCha20Poly1305, [4; 16]), 9, 9).unwrap();
        let bytes = old.encode();
        assert_eq!(bytes[12], CIPHER_XCHACHA);
        let back = KeyBlock::decode(&bytes).unwrap();
        assert_eq!(back.cipher, Cipher::XChaCha20Poly1305);
        assert_eq!(*back.unlock(&raw(5)).unwrap().0, *key.0);
        let moved = back.rewrap(&raw(5), &raw(6), 10).unwrap();
        assert_eq!(moved.cipher, Cipher::XChaCha20Poly1305);
        let mut b = block.encode();
        b[12] = CIPHER_XCHACHA;
        let crc = crc32c::crc32c(&b[..WRAPPED_END]);
        b[WRAPPED_END..].copy_from_slice(&crc.to_le_bytes());
        let forged = KeyBlock::decode(&b).unwrap();
        assert_eq!(forged.unlock(&raw(5)).unwrap_err(), CryptError::WrongKey);
    }

    #[test]
    fn a_passphrase_rewrap_keeps_the_data_key() {
        let pass = Secret::passphrase(b"old passphrase").unwrap();
        let (block, key) = KeyBlock::create(&pass, [1; 16], 100).unwrap();
        assert_eq!(block.argon, (ARGON_MEMORY_KIB, ARGON_PASSES, ARGON_LANES));
        let new = Secret::passphrase(b"new passphrase").unwrap();
        let changed = block.rewrap(&pass, &new, 200).unwrap();
        assert_eq!((changed.created, changed.changed), (100, 200));
        assert_eq!(*changed.unlock(&new).unwrap().0, *key.0);
        assert_eq!(changed.unlock(&pass).unwrap_err(), CryptError::WrongKey);
        assert_eq!(
            block.rewrap(&new, &pass, 300).unwrap_err(),
            CryptError::WrongKey
        );
    }

    #[test]
    fn damage_is_told_from_a_wrong_key_and_never_panics() {
        let (block, _) = KeyBlock::create(&raw(3), [2; 16], 7).unwrap();
        let good = block.encode();
        for at in 0..good.len() {
            let mut b = good.clone();
            b[at] ^= 0x20;
            assert!(KeyBlock::decode(&b).is_err(), "a flip at byte {at} decoded");
        }
        // A block resealed after a change to its bound fields decodes, but
        // its wrap no longer opens.
        let mut b = good.clone();
        b[60] ^= 1;
        let crc = crc32c::crc32c(&b[..WRAPPED_END]);
        b[WRAPPED_END..].copy_from_slice(&crc.to_le_bytes());
        let moved = KeyBlock::decode(&b).unwrap();
        assert_eq!(moved.unlock(&raw(3)).unwrap_err(), CryptError::WrongKey);
        assert!(KeyBlock::decode(&good[..100]).is_err());
    }

    /// Random bytes with the magic, the version and a valid checksum (so
    /// that the field checks are reached) decode to an error or to a block
    /// whose bounds hold; never a panic.
    #[test]
    fn fuzz_resealed_random_blocks_decode_within_bounds() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut b = [0u8; KEYBLOCK_LEN];
            for byte in b.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *byte = seed.to_le_bytes()[0];
            }
            b[..8].copy_from_slice(KEYBLOCK_MAGIC);
            b[8..12].copy_from_slice(&KEYBLOCK_VERSION.to_le_bytes());
            b[12] = 1 + seed.to_le_bytes()[2] % 2;
            b[13] = 1 + seed.to_le_bytes()[1] % 2;
            let crc = crc32c::crc32c(&b[..WRAPPED_END]);
            b[WRAPPED_END..].copy_from_slice(&crc.to_le_bytes());
            if let Ok(k) = KeyBlock::decode(&b) {
                assert!(k.argon.0 <= ARGON_MAX_KIB, "{k:?}");
                assert_eq!(k.encode(), b.to_vec());
            }
        }
    }
}
