//! Taking a mirror's elements back to an earlier TID (before a resync from
//! a snapshot both pools hold): everything created after it is removed,
//! everything ended after it is live again, and the commit log and the
//! notes of removed ends after it are dropped. Chunk references are the
//! caller's (the filesystem layer's) to settle, from what this returns.

use super::MetaWrite;
use crate::element::{sealed, Element};
use crate::error::Result;
use crate::TID_MAX;

/// What `rollback_to` changed.
#[derive(Debug, Default)]
pub struct RolledBack {
    /// Live elements created after the TID (removed).
    pub removed_live: Vec<Element>,
    /// Ended elements created after the TID (removed from history).
    pub removed_hist: Vec<Element>,
    /// Elements created by the TID and ended after it (live again).
    pub restored: Vec<Element>,
}

impl MetaWrite<'_> {
    /// Takes the elements back to their state at `tid`.
    pub fn rollback_to(&mut self, tid: u64) -> Result<RolledBack> {
        let mut out = RolledBack::default();
        // Entries restored below may be waiting for their removal; the
        // ends removed below must not be needed to redo a decrement.
        self.drain_born()?;
        self.no_live_debts_before(u64::MAX)?;
        for e in super::by_tid::born_after(&self.seal, &self.born, &self.live, tid)? {
            self.remove_live(&e.key)?;
            out.removed_live.push(e);
        }
        for e in
            super::by_tid::ended_after(&self.seal, &self.ends, &self.hist, Some(&self.fresh), tid)?
        {
            let stored = self.take_hist(&e)?;
            if e.create_tid > tid {
                out.removed_hist.push(e);
                continue;
            }
            let k = e.key.as_bytes();
            // A sealed value's seal moves back as it is.
            let value = match stored.and_then(|v| sealed::live_of_hist(k, e.create_tid, &v)) {
                Some(v) => v,
                None => self.seal.encode(k, e.create_tid, &e.payload)?,
            };
            self.live.insert(k, value.as_slice())?;
            self.born.insert((e.create_tid, k), ())?;
            out.restored.push(Element {
                delete_tid: TID_MAX,
                ..e
            });
        }
        let after = tid.saturating_add(1);
        self.tids.retain_in(after.., |_, _| false)?;
        self.gone.retain_in((after, &[][..]).., |_, _| false)?;
        self.set_counter("last_tid", tid)?;
        Ok(out)
    }
}
