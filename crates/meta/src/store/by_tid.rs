//! Reading the two TID indexes (see docs/format/metadata.md): `born_v1` (live
//! elements by create TID) and `ends_v1` (ended elements by delete TID),
//! each checked against the table it indexes. Shared by read views and
//! write transactions.

use super::hist_lazy::{ended_value, FreshKey};
use super::{hist_element, live_element};
use crate::element::Element;
use crate::element::ValueSeal;
use crate::error::{MetaError, Result};
use redb::ReadableTable;

type Index = (u64, &'static [u8]);
type Bytes = &'static [u8];

/// The live elements created after `since`, in create TID order. An
/// entry whose element is no longer live, or was created at another TID,
/// is one whose removal waits (`born_lazy.rs`): skipped.
pub(super) fn born_after(
    seal: &ValueSeal,
    born: &impl ReadableTable<Index, ()>,
    live: &impl ReadableTable<Bytes, Bytes>,
    since: u64,
) -> Result<Vec<Element>> {
    let mut out = Vec::new();
    for r in born.range((since.saturating_add(1), &[][..])..)? {
        let (k, _) = r?;
        let (tid, key) = k.value();
        let Some(v) = live.get(key)? else {
            continue;
        };
        let e = live_element(seal, key, v.value())?;
        if e.create_tid == tid {
            out.push(e);
        }
    }
    Ok(out)
}

/// The elements kept in history that ended after `since`, in delete TID
/// order: merged into `hist`, or still waiting in `fresh`.
pub(super) fn ended_after(
    seal: &ValueSeal,
    ends: &impl ReadableTable<Index, ()>,
    hist: &impl ReadableTable<Bytes, Bytes>,
    fresh: Option<&impl ReadableTable<FreshKey, Bytes>>,
    since: u64,
) -> Result<Vec<Element>> {
    let mut out = Vec::new();
    for r in ends.range((since.saturating_add(1), &[][..])..)? {
        let (k, _) = r?;
        let (delete_tid, hk) = k.value();
        let v = ended_value(fresh, hist, delete_tid, hk)?;
        let v = v.ok_or_else(|| MetaError::Corrupt {
            key: format!("{hk:02x?}"),
            why: "ends index names a missing history element".into(),
        })?;
        out.push(hist_element(seal, hk, &v)?);
    }
    Ok(out)
}
