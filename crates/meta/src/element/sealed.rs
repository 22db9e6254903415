//! Sealed element values (an encrypted pool). Every seal is bound to the
//! live key its element belongs to and the element's create TID, so that a
//! value moves between live and history without being opened: ending an
//! element copies its seal into a history value, a mirror without the key
//! stores and ends the elements its source sealed, and a rollback moves
//! them back. The versions (after the version byte, the TID, the body and a
//! crc32c over the stored key and everything before it, as version 2):
//! - 3: live, `seal`, bound to (live key, create TID = the value's TID);
//!   also the history values of pools made before version 4, bound to
//!   (history key, delete TID);
//! - 4: history (the value's TID is the delete TID), `seal` bound to
//!   (live key, create TID), both read from the history key;
//! - 5 and 6: as 3 and 4 for an extent with its chunk ids in the clear
//!   (`count u16 | id u64 LE * count | seal`, the ids bound too): what a
//!   mirror without the key needs to count chunk references.
//!
//! An *opaque* payload is what a store without the key hands out and
//! takes (and what a sealed mirror stream carries): `0 | seal` (versions
//! 3 and 4) or `1 | count | ids | seal` (5 and 6).

use super::{corrupt, split_hist_key, VALUE_VERSION_SEALED};
use crate::error::Result;
use cairn_crypt::Sealer;

/// History value: the seal of a version 3 value, unchanged.
pub(crate) const SEALED_HIST: u8 = 4;
/// Live value of an extent with its chunk ids in the clear.
pub(crate) const SEALED_CHUNKS: u8 = 5;
/// History value of version 5, unchanged.
pub(crate) const SEALED_CHUNKS_HIST: u8 = 6;

/// The opaque payload forms.
const FORM_SEAL: u8 = 0;
const FORM_CHUNKS: u8 = 1;

/// The most chunk ids a value carries in the clear (an extent names at
/// most a few hundred pieces; the count is a u16).
const MAX_CHUNKS: usize = u16::MAX as usize;

/// What a seal is bound to: the live key and the create TID, and the
/// chunk ids carried in the clear (empty for versions 3 and 4).
fn aad(live_key: &[u8], create_tid: u64, ids: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(16 + live_key.len() + ids.len());
    a.extend_from_slice(b"CAIRNEV3");
    a.extend_from_slice(&create_tid.to_le_bytes());
    a.extend_from_slice(live_key);
    a.extend_from_slice(ids);
    a
}

/// A value: version, TID, body, crc32c over the stored key and the rest.
fn value(version: u8, stored_key: &[u8], tid: u64, body: &[&[u8]]) -> Vec<u8> {
    let len: usize = body.iter().map(|b| b.len()).sum();
    let mut v = Vec::with_capacity(13 + len);
    v.push(version);
    v.extend_from_slice(&tid.to_le_bytes());
    for b in body {
        v.extend_from_slice(b);
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(stored_key), &v);
    v.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(v.len(), 13 + len, "a value is its header, body and crc");
    v
}

/// The version 3 value of `payload`, stored live under `key` from `tid`.
pub(crate) fn seal_live(s: &Sealer, key: &[u8], tid: u64, payload: &[u8]) -> Vec<u8> {
    let mut seal = Vec::with_capacity(payload.len() + cairn_crypt::OVERHEAD);
    s.seal_into(&aad(key, tid, &[]), payload, &mut seal);
    value(VALUE_VERSION_SEALED, key, tid, &[&seal])
}

/// (ids in the clear, seal) of a version 5 or 6 body.
fn split_chunks(key: &[u8], body: &[u8]) -> Result<(Vec<u64>, usize)> {
    let bad = || corrupt(key, "chunk ids in the clear that do not fit the value");
    let n = u16::from_le_bytes([
        *body.first().ok_or_else(bad)?,
        *body.get(1).ok_or_else(bad)?,
    ]);
    let end = 2 + 8 * n as usize;
    if body.len() < end + cairn_crypt::OVERHEAD {
        return Err(bad());
    }
    let ids = (body[2..end].chunks_exact(8))
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8 bytes")))
        .collect();
    Ok((ids, end))
}

/// The live key and create TID a seal of `version`, stored under `key`
/// with `tid`, is bound to.
fn bound_to(version: u8, key: &[u8], tid: u64) -> Result<(Vec<u8>, u64)> {
    match version {
        VALUE_VERSION_SEALED | SEALED_CHUNKS => Ok((key.to_vec(), tid)),
        _ => split_hist_key(key).map(|(k, create)| (k.0, create)),
    }
}

/// Opens a sealed value's body (version 3 to 6) stored under `key`.
pub(crate) fn open(
    s: &Sealer,
    version: u8,
    key: &[u8],
    tid: u64,
    body: &[u8],
) -> Result<(u64, Vec<u8>)> {
    let (live, create) = bound_to(version, key, tid)?;
    let (ids, seal) = match version {
        VALUE_VERSION_SEALED | SEALED_HIST => (&body[..0], body),
        _ => {
            let (_, at) = split_chunks(key, body)?;
            body.split_at(at)
        }
    };
    let aad = aad(&live, create, &ids[ids.len().min(2)..]);
    (s.open(&aad, seal).map(|p| (tid, p))).map_err(|_| {
        corrupt(
            key,
            "the element fails authentication (changed, or moved from another key)",
        )
    })
}

/// An opaque payload: a sealed value's body with its form in front.
pub struct Opaque<'a>(pub &'a [u8]);

impl Opaque<'_> {
    /// The opaque payload of a sealed value's body (version 3 to 6).
    pub(crate) fn of(version: u8, key: &[u8], body: &[u8]) -> Result<Vec<u8>> {
        let form = match version {
            VALUE_VERSION_SEALED | SEALED_HIST => FORM_SEAL,
            _ => {
                split_chunks(key, body)?;
                FORM_CHUNKS
            }
        };
        Ok([&[form], body].concat())
    }

    /// (form, body), checked.
    fn split(&self, key: &[u8]) -> Result<(u8, &[u8])> {
        let bad = || corrupt(key, "an opaque payload that is not a sealed value");
        let (&form, body) = self.0.split_first().ok_or_else(bad)?;
        match form {
            FORM_SEAL if body.len() >= cairn_crypt::OVERHEAD => Ok((form, body)),
            FORM_CHUNKS => split_chunks(key, body).map(|_| (form, body)),
            _ => Err(bad()),
        }
    }

    /// The live value (version 3 or 5) of this payload under `key` at `tid`.
    pub(crate) fn live_value(&self, key: &[u8], tid: u64) -> Result<Vec<u8>> {
        let (form, body) = self.split(key)?;
        let version = match form {
            FORM_SEAL => VALUE_VERSION_SEALED,
            _ => SEALED_CHUNKS,
        };
        Ok(value(version, key, tid, &[body]))
    }

    /// The chunk ids an extent's payload carries in the clear (None: a
    /// payload without them).
    pub fn chunks(&self, key: &[u8]) -> Result<Option<Vec<u64>>> {
        match self.split(key)? {
            (FORM_CHUNKS, body) => split_chunks(key, body).map(|(ids, _)| Some(ids)),
            _ => Ok(None),
        }
    }

    /// Seals `payload` of the element under live key `key` created at
    /// `tid` into an opaque payload, with `chunks` in the clear if given.
    pub fn seal(
        s: &Sealer,
        key: &[u8],
        tid: u64,
        payload: &[u8],
        chunks: Option<&[u64]>,
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(3 + payload.len() + cairn_crypt::OVERHEAD);
        let ids: Vec<u8> = chunks
            .unwrap_or(&[])
            .iter()
            .flat_map(|i| i.to_le_bytes())
            .collect();
        match chunks {
            None => out.push(FORM_SEAL),
            Some(c) => {
                assert!(c.len() <= MAX_CHUNKS, "{} chunk ids in one extent", c.len());
                out.push(FORM_CHUNKS);
                let n = u16::try_from(c.len()).expect("at most MAX_CHUNKS ids");
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&ids);
            }
        }
        s.seal_into(&aad(key, tid, &ids), payload, &mut out);
        out
    }

    /// Opens this payload of the element under live key `key` created at
    /// `tid`.
    pub fn open(&self, s: &Sealer, key: &[u8], tid: u64) -> Result<Vec<u8>> {
        let version = match self.split(key)?.0 {
            FORM_SEAL => VALUE_VERSION_SEALED,
            _ => SEALED_CHUNKS,
        };
        open(s, version, key, tid, &self.0[1..]).map(|(_, p)| p)
    }
}

/// The history value, under history key `hk` ended at `delete_tid`, of a
/// sealed live value (version 3 or 5: its seal copied, not opened); None
/// for a plain one.
pub(crate) fn hist_of_live(hk: &[u8], delete_tid: u64, live: &[u8]) -> Option<Vec<u8>> {
    let version = match *live.first()? {
        VALUE_VERSION_SEALED => SEALED_HIST,
        SEALED_CHUNKS => SEALED_CHUNKS_HIST,
        _ => return None,
    };
    Some(value(version, hk, delete_tid, &[&live[9..live.len() - 4]]))
}

/// The live value, under `key` created at `create_tid`, of a history
/// value of version 4 or 6 (its seal copied); None for any other (plain,
/// or a version 3 history value of an older pool, bound to its place in
/// history: opened and sealed again).
pub(crate) fn live_of_hist(key: &[u8], create_tid: u64, hist: &[u8]) -> Option<Vec<u8>> {
    let version = match *hist.first()? {
        SEALED_HIST => VALUE_VERSION_SEALED,
        SEALED_CHUNKS_HIST => SEALED_CHUNKS,
        _ => return None,
    };
    Some(value(version, key, create_tid, &[&hist[9..hist.len() - 4]]))
}
