//! Rolling a mirror back to a snapshot that it and its source both hold.
//! A mirror left behind its source's prune horizon cannot take the changes
//! after its own TID (the source no longer has them all), but the source
//! still has everything a snapshot sees: rolled back to the newest such
//! snapshot, the mirror takes the changes after it, and only those travel
//! (`cairn mirror copy --resync`). The mirror keeps its history up to the
//! snapshot.

use crate::error::{FsError, Result};
use crate::history::liveness::add_live;
use crate::history::snapshot::Snapshot;
use crate::vfs::Fs;
use cairn_meta::Element;
use std::collections::BTreeSet;

/// What a rollback changed (also the reply to `MirrorRollback`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RollbackReport {
    pub from: u64,
    pub to: u64,
    /// Elements created after the snapshot, removed.
    pub removed: u64,
    /// Elements ended after the snapshot, live again.
    pub restored: u64,
    pub snapshots_removed: u64,
    pub chunks_freed: u64,
}

impl Fs {
    /// Takes this mirror back to its snapshot `name`: every change
    /// committed after it is undone, physically, in one transaction.
    /// Refused on a pool that is not a mirror (its own changes would be
    /// lost).
    pub fn rollback_mirror(&self, name: &str) -> Result<RollbackReport> {
        if !self.mirror_role()?.is_mirror() {
            return Err(FsError::BadRequest(
                "only a mirror pool can be rolled back (a pool's or a promoted mirror's own changes would be lost)".into(),
            ));
        }
        self.needs_key("a resync (its snapshots' records are sealed)")?;
        let snap = self.snapshot(name)?;
        let mut last = self.flush_guard();
        let mut rep = RollbackReport {
            from: *last,
            to: snap.tid,
            ..RollbackReport::default()
        };
        let (mut touched, mut freed) = (BTreeSet::new(), Vec::new());
        let r = self.pool.meta.write(|w| {
            // The ends it removes must not be needed to redo a decrement.
            self.make_debts_before(w, u64::MAX)?;
            let rb = w.rollback_to(snap.tid)?;
            // Live again first, so that no chunk they share is freed.
            let opaque = w.is_opaque();
            for id in extent_chunks(&rb.restored, opaque)? {
                add_live(self, w, id, 1, &mut touched)?;
            }
            for id in extent_chunks(&rb.removed_live, opaque)? {
                add_live(self, w, id, -1, &mut touched)?;
            }
            let (n, _) = self.release_elements(w, &rb.removed_live, &mut touched, &mut freed)?;
            let (m, _) = self.release_elements(w, &rb.removed_hist, &mut touched, &mut freed)?;
            rep.chunks_freed = n + m;
            rep.removed = (rb.removed_live.len() + rb.removed_hist.len()) as u64;
            rep.restored = rb.restored.len() as u64;
            for (name, rec) in w.snapshots()? {
                if Snapshot::decode(&name, &rec)?.tid > snap.tid {
                    w.remove_snapshot(&name)?;
                    rep.snapshots_removed += 1;
                }
            }
            self.store_segments(w, &touched)
        });
        self.settle_write(r, &freed)?;
        *last = snap.tid;
        self.drop_ns_meta();
        self.refresh_retained()?;
        tracing::info!(
            "mirror rolled back from TID {:#x} to snapshot {name} (TID {:#x}): {} elements removed, {} live again, {} chunks freed",
            rep.from,
            rep.to,
            rep.removed,
            rep.restored,
            rep.chunks_freed
        );
        Ok(rep)
    }
}

/// The chunks the extents among `elems` name, once per naming.
fn extent_chunks(elems: &[Element], opaque: bool) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for e in elems {
        out.extend(crate::history::liveness::extent_chunks(e, opaque)?);
    }
    Ok(out)
}
