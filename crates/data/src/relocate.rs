//! Moving and copying whole segments: the tier mover and device removal
//! move a segment to other devices, re-replication adds the copies a
//! segment lacks or replaces one on a lost device, and lowering the copy
//! count drops some. A segment keeps its id, so no chunk record changes:
//! the change is copy -> sync -> one segment-table entry switched by the
//! caller's metadata transaction -> old slots freed. Until the switch
//! commits, the new slots are claimed by nothing on disk, so a crash rolls
//! the change back (mount rebuilds slot maps from the segment table);
//! after it, the old slots are the unclaimed ones, so it is finished. No
//! scan or journal is needed.
//!
//! The bytes are read from any good copy (the one reads go to first; a
//! window that fails there is read from the next), so a copy on a missing
//! device is rebuilt from the others, and each chunk is checked: one that
//! is damaged there is taken from another copy (`verified.rs`).

use crate::error::{invariant, DataError, Result};
use crate::records::SegmentRec;
use crate::store::ChunkStore;
use cairn_devices::{Device, SlotAddr};

/// A change of a segment's copies prepared (the new ones written, and
/// synced unless `copy_changing` was told not to), not yet switched.
#[derive(Debug, Clone)]
pub struct Relocation {
    pub segment: u64,
    /// The segment's copies when the change was prepared.
    pub old: Vec<SlotAddr>,
    /// Copies the change takes away (freed after the switch).
    pub from: Vec<SlotAddr>,
    /// Copies it adds (written; synced once `synced`).
    pub to: Vec<SlotAddr>,
    /// The new copies are on stable storage: only then may a record
    /// naming them commit (`relocated_record`).
    pub(crate) synced: bool,
}

impl Relocation {
    /// The copies after the change: each of `from` replaced in place by
    /// the next of `to` (so a moved first copy stays first), the rest of
    /// `to` after them, a `from` with no `to` left dropped.
    pub fn new_places(&self) -> Vec<SlotAddr> {
        let mut to = self.to.iter().copied();
        let mut out: Vec<SlotAddr> = Vec::with_capacity(self.old.len() + self.to.len());
        for p in &self.old {
            match self.from.contains(p) {
                true => out.extend(to.next()),
                false => out.push(*p),
            }
        }
        out.extend(to);
        // The slots of `from` are freed after the switch: the record must
        // name none of them, and every new copy.
        assert!(
            !out.iter().any(|p| self.from.contains(p)) && self.to.iter().all(|t| out.contains(t)),
            "segment {}: copies {out:?} from {:?} less {:?} plus {:?}",
            self.segment,
            self.old,
            self.from,
            self.to
        );
        out
    }
}

impl ChunkStore {
    /// Moves a sealed segment: all its copies go to new slots, the first on
    /// a device `pick` accepts (the fastest such with room), the others as
    /// many as the policy asks for that device's class. The open segment is
    /// refused.
    pub fn copy_segment(
        &self,
        id: u64,
        pick: impl Fn(&Device, u64, u64) -> bool,
    ) -> Result<Relocation> {
        let rec = self.sealed(id)?;
        let first = self.segs.devices.allocate_move_where(pick)?;
        let class = self.segs.devices.device(first.device)?.class();
        let mut to = vec![first];
        if !class.is_object_store() {
            let want = self
                .segs
                .policy
                .read()
                .segment_layout(class, rec.layout)
                .copies();
            let more = self
                .segs
                .devices
                .allocate_copies(&to, class.rank(), want - 1, |_, _, _| true);
            to.extend(more);
        }
        self.prepare(id, &rec, rec.places(), to, true)
    }

    /// Changes the copies of sealed segment `id`: makes up to `add` new
    /// ones on devices `pick` accepts whose failure domains no copy kept
    /// uses (of class rank `rank` first), and takes away those at `from`
    /// (the caller shrinks `from` if fewer were made than it needed).
    /// NoSpace when copies were asked for and none could be placed; Busy
    /// when a copy of `from` is no longer the segment's (it changed since
    /// the caller looked).
    /// With `sync` false the new copies are written but not synced: the
    /// caller syncs a batch of changes at once (`sync_relocations`, one
    /// sync per device instead of one per segment) before it commits them.
    pub fn copy_changing(
        &self,
        id: u64,
        from: Vec<SlotAddr>,
        add: usize,
        rank: u8,
        pick: impl Fn(&Device, u64, u64) -> bool,
        sync: bool,
    ) -> Result<Relocation> {
        let rec = self.sealed(id)?;
        let places = rec.places();
        // Planned from an older record (the segment moved or got its
        // copies meanwhile): the caller plans again.
        if let Some(f) = from.iter().find(|f| !places.contains(f)) {
            return Err(DataError::Busy(format!(
                "segment {id} changed: its copy on device {} slot {} is gone",
                f.device, f.slot
            )));
        }
        let keep: Vec<SlotAddr> = places
            .iter()
            .copied()
            .filter(|p| !from.contains(p))
            .collect();
        let to = match add {
            0 => Vec::new(),
            n => self.segs.devices.allocate_copies(&keep, rank, n, pick),
        };
        if add > 0 && to.is_empty() {
            return Err(DataError::NoSpace);
        }
        assert!(
            keep.len() + to.len() > 0,
            "segment {id} would be left with no copy"
        );
        self.prepare(id, &rec, from, to, sync)
    }

    /// The record of sealed segment `id` (not the open one).
    fn sealed(&self, id: u64) -> Result<SegmentRec> {
        if self.is_open(id) {
            return Err(DataError::Busy(format!("segment {id} is open for appends")));
        }
        self.segment(id).ok_or(DataError::NoSegment(id))
    }

    /// Writes the segment's bytes to each slot of `to` (and syncs, if
    /// `sync`); on any failure frees them all.
    fn prepare(
        &self,
        id: u64,
        rec: &SegmentRec,
        from: Vec<SlotAddr>,
        to: Vec<SlotAddr>,
        sync: bool,
    ) -> Result<Relocation> {
        let r = Relocation {
            segment: id,
            old: rec.places(),
            from,
            to,
            synced: sync,
        };
        let copied =
            r.to.iter()
                .try_for_each(|t| self.copy_to(id, rec, *t, sync));
        if let Err(e) = copied {
            self.abandon(&r)?;
            self.count_failed_write(&e);
            return Err(e);
        }
        Ok(r)
    }

    /// A copy's write failed on a device: counted against it, as a flush's
    /// are (`writer.rs`), and past `FAILING_AFTER` failures it is faulted,
    /// so that re-replication stops choosing it again and again.
    pub(crate) fn count_failed_write(&self, e: &DataError) {
        if let DataError::WriteFailed { device, .. } = e {
            let n = self.segs.devices.note_write_error(*device);
            if n >= cairn_devices::set::FAILING_AFTER {
                self.segs.fault(*device);
            }
        }
    }

    /// Copies the `used` bytes of segment `id` (`rec`) to slot `to`, each
    /// chunk checked and taken from a copy that holds it intact
    /// (`verified.rs`), and syncs.
    fn copy_to(&self, id: u64, rec: &SegmentRec, to: SlotAddr, sync: bool) -> Result<()> {
        // The new copy goes to a slot claimed for it, never over a copy
        // it is read from.
        invariant!(
            !rec.places().contains(&to),
            "segment {id}: a new copy on device {} slot {}, where a copy of it is",
            to.device,
            to.slot
        );
        let dst = self.segs.devices.device(to.device)?;
        let b = dst.slot_offset(to.slot);
        let failed = |e| DataError::of_write(to.device, e);
        if dst.class().is_object_store() {
            // One write of the whole segment: a sync of the device by
            // someone else then never uploads part of it (`writer.rs`).
            let mut buf = Vec::with_capacity(rec.used as usize);
            self.read_checked(id, rec, |_, bytes| {
                buf.extend_from_slice(bytes);
                Ok(())
            })?;
            dst.write_at(&buf, b).map_err(failed)?;
            return dst.sync().map_err(failed);
        }
        self.read_checked(id, rec, |off, bytes| {
            invariant!(
                off + bytes.len() as u64 <= rec.used as u64,
                "segment {id}: {} bytes copied at {off}, past the {} used",
                bytes.len(),
                rec.used
            );
            // Aligned pieces in an aligned buffer (`read_checked`): past
            // the page cache, the rest (a segment's last piece) through it.
            dst.write_direct_at(bytes, b + off).map_err(failed)
        })?;
        match sync {
            true => dst.sync().map_err(failed),
            false => Ok(()),
        }
    }

    /// Syncs the devices the new copies of `rs` went to, once each, and
    /// marks them synced. On a failure none is marked: the caller
    /// abandons them.
    pub fn sync_relocations(&self, rs: &mut [Relocation]) -> Result<()> {
        let mut devices: Vec<u32> = (rs.iter())
            .filter(|r| !r.synced)
            .flat_map(|r| r.to.iter().map(|t| t.device))
            .collect();
        devices.sort_unstable();
        devices.dedup();
        for id in devices {
            let synced = self.segs.devices.device(id)?.sync();
            if let Err(e) = synced.map_err(|e| DataError::of_write(id, e)) {
                self.count_failed_write(&e);
                return Err(e);
            }
        }
        rs.iter_mut().for_each(|r| r.synced = true);
        Ok(())
    }

    /// The segment's record as it will be after the change, or None if
    /// the segment changed since it was prepared (dropped, or moved by
    /// someone else): then the caller gives up with `abandon`.
    pub fn relocated_record(&self, r: &Relocation) -> Result<Option<SegmentRec>> {
        // A record naming copies that a crash could still lose would
        // point reads at stale bytes.
        invariant!(
            r.synced,
            "segment {}: its new copies would commit before they are synced",
            r.segment
        );
        let Some(mut rec) = self.segment(r.segment) else {
            return Ok(None);
        };
        if rec.places() != r.old {
            return Ok(None);
        }
        rec.set_places(&r.new_places());
        Ok(Some(rec))
    }

    /// Frees the new copies of a change that will not be switched.
    pub fn abandon(&self, r: &Relocation) -> Result<()> {
        self.release_new_slots(&r.to)
    }

    /// Frees slots claimed for a change that will not be committed (no
    /// record names them, so no read can be at them).
    pub(crate) fn release_new_slots(&self, slots: &[SlotAddr]) -> Result<()> {
        slots
            .iter()
            .try_for_each(|a| Ok(self.segs.devices.release(*a)?))
    }

    /// After the transaction with the new record committed: points reads at
    /// the new copies, waits for reads in flight at the old ones, frees
    /// them.
    pub fn switch(&self, r: &Relocation) -> Result<()> {
        {
            let mut segs = self.segs.table.write();
            let s = segs
                .get_mut(&r.segment)
                .ok_or(DataError::NoSegment(r.segment))?;
            // The caller's transaction committed `relocated_record`, made
            // from these places under the flush lock.
            invariant!(
                s.places() == r.old,
                "segment {} changed during its move: {:?}, not {:?}",
                r.segment,
                s.places(),
                r.old
            );
            s.set_places(&r.new_places());
        }
        // A copy on a missing device has no slot to give back there
        // beyond the in-memory map, which `release` updates.
        self.release_slots(&r.from)
    }
}

#[cfg(test)]
mod tests {
    use super::Relocation;
    use cairn_devices::SlotAddr;

    #[test]
    fn new_places_replace_in_position_add_after_and_drop() {
        let at = |device, slot| SlotAddr { device, slot };
        let r = |old: Vec<SlotAddr>, from, to| Relocation {
            segment: 1,
            old,
            from,
            to,
            synced: true,
        };
        let old = vec![at(0, 1), at(1, 2)];
        let moved = r(old.clone(), vec![at(0, 1)], vec![at(2, 5)]);
        assert_eq!(moved.new_places(), vec![at(2, 5), at(1, 2)]);
        let added = r(old.clone(), vec![], vec![at(3, 7)]);
        assert_eq!(added.new_places(), vec![at(0, 1), at(1, 2), at(3, 7)]);
        let dropped = r(old.clone(), vec![at(0, 1)], vec![]);
        assert_eq!(dropped.new_places(), vec![at(1, 2)]);
        let whole = r(old, vec![at(0, 1), at(1, 2)], vec![at(4, 0)]);
        assert_eq!(whole.new_places(), vec![at(4, 0)]);
    }
}
