//! Element values. A live value is `ver u8 | create_tid u64 | payload | crc`;
//! a history value is `ver u8 | delete_tid u64 | payload | crc` with the
//! create_tid in the history key. The crc32c (version 2) covers the stored
//! key and then everything before it in the value, so a record that moved to
//! another key (a damaged key byte) fails its check like a damaged value.
//! Version 1 values (crc of the value only) are still read.

use crate::error::{MetaError, Result};
use crate::key::ElemKey;
use crate::TID_MAX;

/// Version of values written now: crc32c over key and value.
const VALUE_VERSION: u8 = 2;
/// Older values: crc32c over the value only.
const VALUE_VERSION_V1: u8 = 1;

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

/// Encodes the value stored under `stored_key` (the live key, or the
/// history key with its create_tid).
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

/// Returns (tid, payload) of the value stored under `key` after checking
/// it against its checksum (which covers the key from version 2 on).
pub(crate) fn decode_value(key: &[u8], v: &[u8]) -> Result<(u64, Vec<u8>)> {
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
        VALUE_VERSION => crc32c::crc32c_append(crc32c::crc32c(key), body),
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
    Ok((tid, body[9..].to_vec()))
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
