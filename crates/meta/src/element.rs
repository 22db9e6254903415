//! Element values. A live value is `ver u8 | create_tid u64 | payload | crc`;
//! a history value is `ver u8 | delete_tid u64 | payload | crc` with the
//! create_tid in the history key. The crc32c (version 2) covers the stored
//! key and then everything before it in the value, so a record that moved to
//! another key (a damaged key byte) fails its check like a damaged value.
//! Version 1 values (crc of the value only) are still read.

use crate::error::{MetaError, Result};
use crate::key::ElemKey;
use crate::TID_MAX;
use std::sync::{Arc, OnceLock};

/// Version of values written now: crc32c over key and value.
const VALUE_VERSION: u8 = 2;
/// Older values: crc32c over the value only.
const VALUE_VERSION_V1: u8 = 1;
/// Values of an encrypted pool: the payload sealed (`ValueSeal`), the
/// crc32c over key and value as in version 2.
const VALUE_VERSION_SEALED: u8 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    pub key: ElemKey,
    pub create_tid: u64,
    pub delete_tid: u64,
    pub payload: Vec<u8>,
}

impl Element {
    pub fn is_live(&self) -> bool {
        self.delete_tid == TID_MAX
    }

    /// Visible at `tid`: created at or before it and not yet deleted.
    pub fn visible_at(&self, tid: u64) -> bool {
        self.create_tid <= tid && tid < self.delete_tid
    }
}

/// How element payloads are stored: in the clear, or, in an encrypted
/// pool, sealed with its element key, bound to the live key they belong
/// to and their create TID (value versions 3 to 6, `element/sealed.rs`).
/// Shared by the store and every view of it; set once, before any element
/// is read or written: with the keys when the pool is unlocked
/// (`MetaStore::seal_values`), or opaque for an encrypted mirror opened
/// without its key, whose payloads are the sealed bytes themselves
/// (`MetaStore::keep_sealed`).
#[derive(Clone, Default)]
pub struct ValueSeal(Arc<OnceLock<SealMode>>);

/// How the values of an encrypted pool are handled.
pub(crate) enum SealMode {
    /// Sealed when written, opened when read.
    Keys(Arc<cairn_crypt::PoolKeys>),
    /// Neither: payloads are opaque sealed bytes (`sealed::Opaque`),
    /// stored and moved as they are.
    Opaque,
}

impl std::fmt::Debug for ValueSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.0.get() {
            None => "plain",
            Some(SealMode::Keys(_)) => "sealed",
            Some(SealMode::Opaque) => "opaque",
        };
        write!(f, "ValueSeal({mode})")
    }
}

impl ValueSeal {
    /// Seals the values written from now on with `keys`; false if the mode
    /// was set already.
    pub fn set(&self, keys: Arc<cairn_crypt::PoolKeys>) -> bool {
        self.0.set(SealMode::Keys(keys)).is_ok()
    }

    /// Keeps sealed values as they are (no key here); false if the mode
    /// was set already.
    pub fn set_opaque(&self) -> bool {
        self.0.set(SealMode::Opaque).is_ok()
    }

    /// The pool's keys, when values are sealed and opened here.
    pub(crate) fn keys(&self) -> Option<&cairn_crypt::PoolKeys> {
        match self.0.get() {
            Some(SealMode::Keys(k)) => Some(k.as_ref()),
            _ => None,
        }
    }

    /// True if values are sealed (with or without the key here).
    pub fn is_set(&self) -> bool {
        self.0.get().is_some()
    }

    /// True if sealed payloads are kept as they are (no key here).
    pub fn is_opaque(&self) -> bool {
        matches!(self.0.get(), Some(SealMode::Opaque))
    }

    /// Encodes the live value stored under `key`, created at `tid`.
    pub(crate) fn encode(&self, key: &[u8], tid: u64, payload: &[u8]) -> Result<Vec<u8>> {
        match self.0.get() {
            None => Ok(encode_value(key, tid, payload)),
            Some(SealMode::Keys(k)) => Ok(sealed::seal_live(&k.elements, key, tid, payload)),
            Some(SealMode::Opaque) => sealed::Opaque(payload).live_value(key, tid),
        }
    }

    /// Returns (tid, payload) of the value stored under `key` (a live key,
    /// or a history key with its create TID), checked against its checksum
    /// and, sealed, opened with the element key (or, opaque, as sealed).
    pub(crate) fn decode(&self, key: &[u8], v: &[u8]) -> Result<(u64, Vec<u8>)> {
        let (version, tid, body) = checked_value(key, v)?;
        if version < VALUE_VERSION_SEALED {
            return Ok((tid, body.to_vec()));
        }
        match self.0.get() {
            Some(SealMode::Keys(k)) => sealed::open(&k.elements, version, key, tid, body),
            Some(SealMode::Opaque) => sealed::Opaque::of(version, key, body).map(|p| (tid, p)),
            None => Err(corrupt(
                key,
                "the element is encrypted: the pool's key is needed",
            )),
        }
    }
}

fn corrupt(key: &[u8], why: &str) -> MetaError {
    MetaError::Corrupt {
        key: format!("{:?}", ElemKey(key.to_vec())),
        why: why.into(),
    }
}

/// Encodes the plain (version 2) value stored under `stored_key`.
pub(crate) fn encode_value(stored_key: &[u8], tid: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(13 + payload.len());
    v.push(VALUE_VERSION);
    v.extend_from_slice(&tid.to_le_bytes());
    v.extend_from_slice(payload);
    let crc = crc32c::crc32c_append(crc32c::crc32c(stored_key), &v);
    v.extend_from_slice(&crc.to_le_bytes());
    // `decode_value` finds the TID and the crc by these lengths.
    assert_eq!(v.len(), 1 + 8 + payload.len() + 4);
    v
}

/// Returns (tid, payload) of a plain value stored under `key` after
/// checking it against its checksum (which covers the key from version 2
/// on); a sealed one is refused (`ValueSeal::decode` opens those).
#[cfg(test)]
pub(crate) fn decode_value(key: &[u8], v: &[u8]) -> Result<(u64, Vec<u8>)> {
    ValueSeal::default().decode(key, v)
}

/// The TID of the value stored under `key` (a plain or a sealed one),
/// checked against its checksum; its payload is not opened.
pub(crate) fn tid_of(key: &[u8], v: &[u8]) -> Result<u64> {
    checked_value(key, v).map(|(_, tid, _)| tid)
}

/// (tid, the bytes between it and the crc) of the value stored under
/// `key`, checked against its checksum.
fn checked_value<'v>(key: &[u8], v: &'v [u8]) -> Result<(u8, u64, &'v [u8])> {
    let bad = |why: &str| MetaError::Corrupt {
        key: format!("{:?}", ElemKey(key.to_vec())),
        why: why.into(),
    };
    if v.len() < 13 {
        return Err(bad("value too short"));
    }
    let (body, crc) = v.split_at(v.len() - 4);
    let want = u32::from_le_bytes(crc.try_into().expect("slice length matches the array"));
    let got = match body[0] {
        VALUE_VERSION | VALUE_VERSION_SEALED..=sealed::SEALED_CHUNKS_HIST => {
            crc32c::crc32c_append(crc32c::crc32c(key), body)
        }
        VALUE_VERSION_V1 => crc32c::crc32c(body),
        _ => return Err(bad("unknown element version")),
    };
    if got != want {
        return Err(bad("checksum mismatch"));
    }
    let tid = u64::from_le_bytes(
        body[1..9]
            .try_into()
            .expect("slice length matches the array"),
    );
    Ok((body[0], tid, &body[9..]))
}

/// History key: element key followed by the create_tid (BE).
pub(crate) fn hist_key(key: &[u8], create_tid: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 8);
    k.extend_from_slice(key);
    k.extend_from_slice(&create_tid.to_be_bytes());
    k
}

/// (element key, create_tid) of a history key; one too short to hold a
/// TID (only damage makes one) is an error.
pub(crate) fn split_hist_key(k: &[u8]) -> Result<(ElemKey, u64)> {
    let Some(at) = k.len().checked_sub(8) else {
        return Err(MetaError::Corrupt {
            key: format!("{k:02x?}"),
            why: "history key too short".into(),
        });
    };
    let (key, tid) = k.split_at(at);
    Ok((
        ElemKey(key.to_vec()),
        u64::from_be_bytes(tid.try_into().expect("slice length matches the array")),
    ))
}

#[cfg(test)]
mod fuzz_tests;
pub(crate) mod sealed;
pub use sealed::Opaque;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_checksum_covers_key_and_value() {
        let v = encode_value(b"key-a", 7, b"payload");
        assert_eq!(
            decode_value(b"key-a", &v).unwrap(),
            (7, b"payload".to_vec())
        );
        // The same value found under another key is damage, not data.
        assert!(decode_value(b"key-b", &v).is_err());
        for i in 0..v.len() {
            let mut d = v.clone();
            d[i] ^= 0x10;
            assert!(decode_value(b"key-a", &d).is_err(), "flip at {i}");
        }
    }

    /// A seal with a key of its own.
    fn sealed() -> ValueSeal {
        let seal = ValueSeal::default();
        let keys = cairn_crypt::PoolKeys::derive(
            &cairn_crypt::DataKey::random(),
            cairn_crypt::Cipher::Xaes256Gcm,
        );
        assert!(seal.set(Arc::new(keys)));
        seal
    }

    #[test]
    fn sealed_values_open_only_under_their_key_tid_and_pool_key() {
        let seal = sealed();
        let v = seal.encode(b"key-a", 7, b"a symlink target").unwrap();
        assert_eq!(v[0], VALUE_VERSION_SEALED);
        assert!(!v.windows(6).any(|w| w == b"target"), "plaintext in {v:?}");
        assert_eq!(
            seal.decode(b"key-a", &v).unwrap(),
            (7, b"a symlink target".to_vec())
        );
        // Damage is caught by the checksum, a value resealed under another
        // key (checksum redone) by the authentication.
        assert!(seal.decode(b"key-b", &v).is_err());
        let mut moved = v[..v.len() - 4].to_vec();
        let crc = crc32c::crc32c_append(crc32c::crc32c(b"key-b"), &moved);
        moved.extend_from_slice(&crc.to_le_bytes());
        let e = seal.decode(b"key-b", &moved).unwrap_err().to_string();
        assert!(e.contains("fails authentication"), "{e}");
        // Another pool's key, or none, opens nothing.
        assert!(sealed().decode(b"key-a", &v).is_err());
        let e = decode_value(b"key-a", &v).unwrap_err().to_string();
        assert!(e.contains("the pool's key is needed"), "{e}");
        // Plain values still read in a sealed store.
        assert_eq!(
            seal.decode(b"k", &encode_value(b"k", 1, b"old")).unwrap(),
            (1, b"old".to_vec())
        );
    }

    #[test]
    fn version_1_values_still_read() {
        let mut v = vec![VALUE_VERSION_V1];
        v.extend_from_slice(&9u64.to_le_bytes());
        v.extend_from_slice(b"old");
        let crc = crc32c::crc32c(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_value(b"any", &v).unwrap(), (9, b"old".to_vec()));
    }
}
