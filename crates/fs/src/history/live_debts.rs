//! When the live reference decrements of ended extents are made. An
//! overwrite kept in history takes one live reference from the old chunk's
//! record (`liveness.rs`), at a random place of `chunks_v1`; the metadata
//! layer keeps these decrements waiting (`cairn_meta`'s
//! `store/live_lazy.rs`) and this module makes them, sorted:
//! - in the commit during which a batch of them has gathered
//!   (`settle_ended`);
//! - before a prune that would remove the ends that redo them
//!   (`make_debts_before`), and before a rollback;
//! - at shutdown (`make_all_live_debts`);
//! - at open after a crash, from the ends after counter `live_tid`
//!   (`redo_live_debts`).
//!
//! Meanwhile a stored live count is the true one plus what waits for its
//! chunk (`liveness::true_live`). Segments' history-only bytes follow the
//! true counts at once: the tier mover sees history as it is. `cairn
//! check` reads the waiting decrements with its snapshot.

use crate::error::{FsError, Result};
use crate::history::liveness::{chunk_uses, make_decrements};
use crate::vfs::Fs;
use cairn_meta::store::OWING;
use cairn_meta::tables::{LIVE_REFS, LIVE_TID};
use cairn_meta::{MetaStore, MetaWrite};

impl Fs {
    /// Makes every waiting decrement now, in one transaction.
    pub(crate) fn make_all_live_debts(&self) -> Result<()> {
        if self.pool.meta.live_debts().is_empty() {
            return Ok(());
        }
        let _last = self.flush_guard();
        self.pool.meta.write(|w| {
            let debts = w.take_live_debts();
            make_decrements(w, &debts)
        })
    }

    /// Before the ends up to `cutoff` are removed from history: if one of
    /// them may be what redoes a waiting decrement after a crash, every
    /// waiting decrement is made first, in this transaction.
    pub(crate) fn make_debts_before(&self, w: &mut MetaWrite<'_>, cutoff: u64) -> Result<()> {
        if w.live_waits_before(cutoff)? {
            let debts = w.take_live_debts();
            make_decrements(w, &debts)?;
        }
        Ok(())
    }
}

/// At open, before anything else writes: makes the decrements a crash
/// left waiting (counter `live_refs` says so), those of the extents that
/// ended after `live_tid` and are still in history. Their segments
/// counted them when they were owed. Returns how many chunk records
/// changed.
pub(crate) fn redo_live_debts(meta: &MetaStore) -> Result<u64> {
    let r = meta.read()?;
    if r.counter(LIVE_REFS)? != OWING {
        return Ok(0);
    }
    let since = r.counter(LIVE_TID)?;
    drop(r);
    let n = meta.write(|w| {
        w.live_redone();
        let opaque = w.is_opaque();
        let debts = chunk_uses(&w.ended_after(since)?, opaque)?;
        make_decrements(w, &debts)?;
        Ok::<_, FsError>(debts.len() as u64)
    })?;
    if n > 0 {
        tracing::info!("live reference counts: {n} chunk records brought up to date after a crash");
    }
    Ok(n)
}
