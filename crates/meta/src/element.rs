//! Element values. A live value is `ver u8 | create_tid u64 | payload | crc`;
//! a history value is `ver u8 | delete_tid u64 | payload | crc` with the
//! create_tid in the history key. crc32c covers everything before it.

use crate::error::{MetaError, Result};
use crate::key::ElemKey;
use crate::TID_MAX;

const VALUE_VERSION: u8 = 1;

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

pub(crate) fn encode_value(tid: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(13 + payload.len());
    v.push(VALUE_VERSION);
    v.extend_from_slice(&tid.to_le_bytes());
    v.extend_from_slice(payload);
    let crc = crc32c::crc32c(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

/// Returns (tid, payload) of a stored value after checking it.
pub(crate) fn decode_value(key: &[u8], v: &[u8]) -> Result<(u64, Vec<u8>)> {
    let bad = |why: &str| MetaError::Corrupt {
        key: format!("{:?}", ElemKey(key.to_vec())),
        why: why.into(),
    };
    if v.len() < 13 {
        return Err(bad("value too short"));
    }
    let (body, crc) = v.split_at(v.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
        return Err(bad("checksum mismatch"));
    }
    if body[0] != VALUE_VERSION {
        return Err(bad("unknown element version"));
    }
    let tid = u64::from_le_bytes(body[1..9].try_into().unwrap());
    Ok((tid, body[9..].to_vec()))
}

/// History key: element key followed by the create_tid (BE).
pub(crate) fn hist_key(key: &[u8], create_tid: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 8);
    k.extend_from_slice(key);
    k.extend_from_slice(&create_tid.to_be_bytes());
    k
}

pub(crate) fn split_hist_key(k: &[u8]) -> (ElemKey, u64) {
    let (key, tid) = k.split_at(k.len() - 8);
    (
        ElemKey(key.to_vec()),
        u64::from_be_bytes(tid.try_into().unwrap()),
    )
}
