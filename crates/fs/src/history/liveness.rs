//! Which data only history references. Every chunk record counts, beside
//! its references (`refs`, live and history elements), its **live**
//! references (`live`: elements with delete TID infinity). A chunk with
//! refs > 0 and live = 0 is history-only: the element that named it was
//! ended (overwritten, truncated, deleted) and is kept only for the
//! fine-grained window or a snapshot. Each segment record sums the bytes of
//! its history-only chunks (`hist`), which the tier mover demotes first.
//!
//! Kept incrementally, at the cost of one chunk record update per extent
//! element a commit creates or ends (the same records `refs` already
//! touches):
//! - a new live extent adds a live reference (`add_ref`; a new chunk starts
//!   with refs = live = 1);
//! - at the end of each transaction that changed extents, `settle_ended`
//!   takes one live reference per extent element ended at its TID (read
//!   from the `ends` index: one range, nothing scanned), before
//!   `nohistory` and prune drop any of that history;
//! - prune and `nohistory` remove history elements: `refs` drops, `live`
//!   does not;
//! - reblock and GC copy `live` with `refs`.
//!
//! Pools made before live counts existed (chunk records v1) are converted
//! once when opened (`convert`): one pass over the live extents and the
//! chunk records, in one transaction.

use crate::error::{invariant, FsError, Result};
use crate::types::Extent;
use crate::vfs::Fs;
use cairn_data::{ChunkRec, SegmentRec};
use cairn_devices::SlotAddr;
use cairn_meta::store::{Debts, OWING};
use cairn_meta::tables::LIVE_REFS;
use cairn_meta::{Element, MetaStore, MetaWrite, RecordType};
use std::collections::{BTreeMap, BTreeSet, HashMap};

impl Fs {
    /// Call once per transaction that created or ended extents, after all
    /// its element changes at `tid`. The extents ended at `tid` lose their
    /// live references: those of nohistory objects at once, before they
    /// are dropped with what they alone referenced; in the chunk records of
    /// the others the decrement waits (`live_debts.rs`) unless a batch has
    /// gathered, when every waiting one is made. Either way a chunk left
    /// with no live reference counts as history-only in its segment at
    /// once. `touched` collects the segments whose records changed, `freed`
    /// the slots of segments left empty.
    pub(crate) fn settle_ended(
        &self,
        w: &mut MetaWrite<'_>,
        tid: u64,
        touched: &mut BTreeSet<u64>,
        freed: &mut Vec<SlotAddr>,
    ) -> Result<()> {
        let ended = w.ended_at(tid)?;
        let victim = self.nohistory_victims(w, tid, &ended)?;
        let of = |dropped: bool| {
            (ended.iter().zip(&victim)).filter_map(move |(e, &v)| (v == dropped).then_some(e))
        };
        let opaque = w.is_opaque();
        let (now, later) = (
            chunk_uses(of(true), opaque)?,
            chunk_uses(of(false), opaque)?,
        );
        let due = w.live_due(later.len());
        for (&id, &n) in &later {
            self.take_live(w, id, n, !due, touched)?;
        }
        for (&id, &n) in &now {
            self.take_live(w, id, n, false, touched)?;
        }
        if due {
            let debts = w.take_live_debts();
            make_decrements(w, &debts)?;
        }
        let victims: Vec<Element> = (ended.into_iter().zip(victim))
            .filter_map(|(e, v)| v.then_some(e))
            .collect();
        self.drop_nohistory(w, &victims, touched, freed)
    }

    /// Takes `n` live references from chunk `id`: in its record now, or
    /// later (`owe`: the decrement waits). A chunk left with none counts as
    /// history-only in its segment at once.
    fn take_live(
        &self,
        w: &mut MetaWrite<'_>,
        id: u64,
        n: u64,
        owe: bool,
        touched: &mut BTreeSet<u64>,
    ) -> Result<()> {
        let mut rec = chunk_rec(w, id, "an ended extent names missing")?;
        let live = true_live(w, id, &rec)?;
        invariant!(
            live >= n,
            "chunk {id}: {n} live references ended, {live} counted"
        );
        if live == n && self.pool.chunks.set_history_only(&rec, true) {
            touched.insert(rec.segment);
        }
        if owe {
            w.owe_live(id, n);
        } else {
            rec.live -= n;
            w.put_chunk(id, &rec.encode())?;
        }
        Ok(())
    }
}

/// How many times the extents among `elements` name each chunk (`opaque`:
/// their payloads are sealed, as a mirror without the key holds them).
pub(crate) fn chunk_uses<'a>(
    elements: impl IntoIterator<Item = &'a Element>,
    opaque: bool,
) -> Result<Debts> {
    let mut uses = Debts::new();
    for e in elements {
        for id in extent_chunks(e, opaque)? {
            *uses.entry(id).or_default() += 1;
        }
    }
    Ok(uses)
}

/// The chunks element `e` names, once per naming (none unless it is an
/// extent): from its payload, or, `opaque` (sealed, without the key), from
/// the chunk ids a sealed extent carries in the clear.
pub(crate) fn extent_chunks(e: &Element, opaque: bool) -> Result<Vec<u64>> {
    if e.key.rtype() != Some(RecordType::Extent) {
        return Ok(Vec::new());
    }
    match opaque {
        false => Ok(Extent::decode(&e.payload)?.chunks().collect()),
        true => {
            (cairn_meta::element::Opaque(&e.payload).chunks(e.key.as_bytes())?).ok_or_else(|| {
                FsError::Io(format!(
                    "{}: a sealed extent without its chunk ids, held without the key",
                    e.key
                ))
            })
        }
    }
}

/// Makes decrements that waited (`debts`: chunk id -> live references to
/// lose) in the stored counts, in id order. Their segments already count
/// them (`take_live`).
pub(crate) fn make_decrements(w: &mut MetaWrite<'_>, debts: &Debts) -> Result<()> {
    for (&id, &n) in debts {
        let mut rec = chunk_rec(w, id, "an ended extent names missing")?;
        invariant!(
            rec.live >= n,
            "chunk {id}: {n} live references ended, {} counted",
            rec.live
        );
        rec.live -= n;
        w.put_chunk(id, &rec.encode())?;
    }
    Ok(())
}

/// The record of chunk `id`, which `what` names (an error if it is gone).
fn chunk_rec(w: &MetaWrite<'_>, id: u64, what: &str) -> Result<ChunkRec> {
    let raw = w
        .chunk(id)?
        .ok_or_else(|| FsError::Io(format!("{what} chunk {id}")))?;
    Ok(ChunkRec::decode(&raw)?)
}

/// A chunk's true live count: the stored one less the decrements that
/// wait for it.
pub(crate) fn true_live(w: &MetaWrite<'_>, id: u64, rec: &ChunkRec) -> Result<u64> {
    let owed = w.live_owed(id);
    invariant!(
        rec.live >= owed,
        "chunk {id}: {} live references stored, {owed} waiting to go",
        rec.live
    );
    Ok(rec.live - owed)
}

/// One more live reference to a stored chunk (dedup, clones); returns its
/// id. A chunk that history alone referenced is live data again.
pub(crate) fn add_ref(
    fs: &Fs,
    w: &mut MetaWrite<'_>,
    id: u64,
    touched: &mut BTreeSet<u64>,
) -> Result<u64> {
    let mut rec = chunk_rec(w, id, "a new reference names missing")?;
    let history_only = rec.refs > 0 && true_live(w, id, &rec)? == 0;
    if history_only && fs.pool.chunks.set_history_only(&rec, false) {
        touched.insert(rec.segment);
    }
    rec.refs += 1;
    rec.live += 1;
    w.put_chunk(id, &rec.encode())?;
    Ok(id)
}

/// Adds `delta` (+1 or -1) to the live references of a stored chunk that
/// keeps its references (an element moved between live and history): with
/// none live it is history-only data, with some it is live data again.
pub(crate) fn add_live(
    fs: &Fs,
    w: &mut MetaWrite<'_>,
    id: u64,
    delta: i64,
    touched: &mut BTreeSet<u64>,
) -> Result<()> {
    let mut rec = chunk_rec(w, id, "an extent names missing")?;
    let was = true_live(w, id, &rec)?;
    let now = was
        .checked_add_signed(delta as _)
        .filter(|&l| l <= rec.refs);
    invariant!(
        now.is_some(),
        "chunk {id}: {was} live of {} references, changed by {delta}",
        rec.refs
    );
    let now = now.unwrap_or(was);
    rec.live = (rec.live - was) + now;
    if (was == 0) != (now == 0) && fs.pool.chunks.set_history_only(&rec, now == 0) {
        touched.insert(rec.segment);
    }
    w.put_chunk(id, &rec.encode())?;
    Ok(())
}

/// Gives a pool made before live counts existed its live counts and
/// history-only bytes (chunk and segment records v2), in one transaction.
/// Returns the number of chunk records rewritten. A pool already converted
/// (or new) costs one counter read.
pub(crate) fn convert(meta: &MetaStore) -> Result<u64> {
    let r = meta.read()?;
    if matches!(r.counter(LIVE_REFS)?, 1 | OWING) {
        return Ok(0);
    }
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut bad = None;
    r.for_each_live(|e| {
        if e.key.rtype() == Some(RecordType::Extent) {
            match Extent::decode(&e.payload) {
                Ok(x) => x.chunks().for_each(|id| *live.entry(id).or_default() += 1),
                Err(err) => bad = Some(err),
            }
        }
    })?;
    if let Some(e) = bad {
        return Err(e);
    }
    let mut chunks = Vec::new();
    let mut failed = None;
    r.for_each_chunk(|id, raw| match ChunkRec::decode(raw) {
        Ok(c) => chunks.push((id, c)),
        Err(e) => failed = Some(e),
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    let mut segs: BTreeMap<u64, SegmentRec> = crate::pool::segment_table(&r)?
        .into_iter()
        .map(|(id, mut s)| {
            s.hist = 0;
            (id, s)
        })
        .collect();
    drop(r);
    let n = chunks.len() as u64;
    meta.write(|w| {
        for (id, mut c) in chunks {
            c.live = live.get(&id).copied().unwrap_or(0).min(c.refs);
            if c.live == 0 {
                if let Some(s) = segs.get_mut(&c.segment) {
                    s.hist += c.len as u64;
                }
            }
            w.put_chunk(id, &c.encode())?;
        }
        for (id, s) in &segs {
            w.put_segment(*id, &s.encode())?;
        }
        w.set_counter(LIVE_REFS, 1)?;
        Ok::<_, FsError>(())
    })?;
    if n > 0 {
        tracing::info!("live reference counts: {n} chunk records converted to version 2");
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Live references never go below zero: decrements of more than a
    /// chunk counts, stored or waiting, are a violated invariant, and the
    /// transaction that met one is not committed.
    #[test]
    fn live_references_below_zero_are_a_violated_invariant() {
        let d = tempfile::tempdir().unwrap();
        let m = MetaStore::create(&d.path().join("m.redb")).unwrap();
        let rec = ChunkRec {
            segment: 1,
            offset: 0,
            len: 100,
            raw_len: 44,
            refs: 2,
            live: 1,
            hash: [5; 32],
            sums: Vec::new(),
        };
        m.write(|w| w.put_chunk(7, &rec.encode())).unwrap();
        let too_many: Debts = [(7, 2)].into();
        let e = m.write(|w| make_decrements(w, &too_many)).unwrap_err();
        assert!(matches!(e, FsError::Invariant { .. }), "{e:?}");
        assert!(e.is_invariant(), "{e}");
        assert!(e.to_string().starts_with("INVARIANT VIOLATED"), "{e}");
        let e = m
            .write(|w| {
                w.owe_live(7, 2);
                true_live(w, 7, &rec).map(drop)
            })
            .unwrap_err();
        assert!(e.is_invariant(), "{e}");
        let stored = m.read().unwrap().chunk(7).unwrap().unwrap();
        assert_eq!(ChunkRec::decode(&stored).unwrap(), rec, "not committed");
        let fine: Debts = [(7, 1)].into();
        m.write(|w| make_decrements(w, &fine)).unwrap();
    }
}
