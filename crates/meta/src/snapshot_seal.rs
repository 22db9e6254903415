//! Snapshot names and records in an encrypted pool. The snapshots table
//! is keyed by name, and a snapshot is found by its name, so the stored
//! name is sealed deterministically (AES-SIV, as names in element keys)
//! and kept as `~` and its hex; the record is sealed with the element key
//! and a random nonce, bound to the stored name. A plain pool stores both
//! as they are.

use crate::element::ValueSeal;
use crate::error::{MetaError, Result};

/// What a sealed snapshot name is bound to.
const NAME_PLACE: &[u8] = b"S";
/// The first byte of a sealed record, and its associated data's prefix.
const SEALED_RECORD: u8 = 0xA1;
const RECORD_AAD: &[u8; 8] = b"CAIRNSN1";

fn bad(stored: &str, why: String) -> MetaError {
    MetaError::Corrupt {
        key: format!("snapshot {stored}"),
        why,
    }
}

fn record_aad(stored: &str) -> Vec<u8> {
    [RECORD_AAD.as_slice(), stored.as_bytes()].concat()
}

impl ValueSeal {
    /// The key snapshot `name` is stored under.
    pub(crate) fn snapshot_key(&self, name: &str) -> String {
        let Some(k) = self.keys() else {
            return name.to_string();
        };
        let sealed = k.names.seal(NAME_PLACE, name.as_bytes());
        let mut out = String::with_capacity(1 + 2 * sealed.len());
        out.push('~');
        for b in sealed {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    /// The snapshot name stored as `stored`.
    pub(crate) fn snapshot_name(&self, stored: &str) -> Result<String> {
        let Some(k) = self.keys() else {
            return Ok(stored.to_string());
        };
        let hex = (stored.strip_prefix('~'))
            .filter(|h| h.len() % 2 == 0 && h.is_ascii())
            .ok_or_else(|| bad(stored, "a snapshot name that is not sealed".into()))?;
        let bytes = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|_| bad(stored, "a sealed name that is not hex".into()))?;
        let name = (k.names.open(NAME_PLACE, &bytes)).map_err(|e| bad(stored, e.to_string()))?;
        String::from_utf8(name).map_err(|_| bad(stored, "a name that is not UTF-8".into()))
    }

    /// The record of the snapshot stored as `stored`, as stored.
    pub(crate) fn seal_snapshot(&self, stored: &str, rec: &[u8]) -> Vec<u8> {
        let Some(k) = self.keys() else {
            return rec.to_vec();
        };
        let mut v = vec![SEALED_RECORD];
        k.elements.seal_into(&record_aad(stored), rec, &mut v);
        assert_eq!(v.len(), 1 + rec.len() + cairn_crypt::OVERHEAD);
        v
    }

    /// The record of the snapshot stored as `stored`, opened.
    pub(crate) fn open_snapshot(&self, stored: &str, v: &[u8]) -> Result<Vec<u8>> {
        let Some(k) = self.keys() else {
            return Ok(v.to_vec());
        };
        match v.split_first() {
            Some((&SEALED_RECORD, body)) => (k.elements.open(&record_aad(stored), body))
                .map_err(|e| bad(stored, format!("the record: {e}"))),
            _ => Err(bad(stored, "a record that is not sealed".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn sealed_snapshot_names_and_records_open_only_in_their_place() {
        let seal = ValueSeal::default();
        let keys = cairn_crypt::PoolKeys::derive(
            &cairn_crypt::DataKey::random(),
            cairn_crypt::Cipher::Xaes256Gcm,
        );
        assert!(seal.set(Arc::new(keys)));
        let k = seal.snapshot_key("before-the-secret-merger");
        assert!(k.starts_with('~') && !k.contains("secret"));
        assert_eq!(k, seal.snapshot_key("before-the-secret-merger"));
        assert_eq!(seal.snapshot_name(&k).unwrap(), "before-the-secret-merger");
        assert!(seal.snapshot_name("plain").is_err());
        let rec = seal.seal_snapshot(&k, b"record bytes");
        assert_eq!(seal.open_snapshot(&k, &rec).unwrap(), b"record bytes");
        let other = seal.snapshot_key("other");
        assert!(seal.open_snapshot(&other, &rec).is_err(), "moved record");
        let plain = ValueSeal::default();
        assert_eq!(plain.snapshot_key("a"), "a");
        assert_eq!(plain.open_snapshot("a", b"r").unwrap(), b"r");
    }
}
