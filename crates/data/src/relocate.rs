//! Moving a whole segment to another device (the tier mover and device
//! removal). A segment keeps its id, so no chunk record changes: the move is
//! copy -> sync -> one segment-table entry switched by the caller's metadata
//! transaction -> old slot freed. Until the switch commits, the copy's slot
//! is claimed by nothing on disk, so a crash rolls the move back (mount
//! rebuilds slot maps from the segment table); after it, the old slot is the
//! unclaimed one, so the move is finished. No scan or journal is needed.

use crate::error::{DataError, Result};
use crate::records::SegmentRec;
use crate::store::ChunkStore;
use cairn_devices::{Device, SlotAddr};

/// A copy made, not yet switched.
#[derive(Debug, Clone, Copy)]
pub struct Relocation {
    pub segment: u64,
    pub from: SlotAddr,
    pub to: SlotAddr,
}

const COPY_STEP: usize = 1 << 20;

impl ChunkStore {
    /// Copies a sealed segment to a new slot on a device `pick` accepts (the
    /// fastest such with room) and syncs it. The open segment is refused.
    pub fn copy_segment(
        &self,
        id: u64,
        pick: impl Fn(&Device, u64, u64) -> bool,
    ) -> Result<Relocation> {
        if self.is_open(id) {
            return Err(DataError::Busy(format!("segment {id} is open for appends")));
        }
        let rec = self.segment(id).ok_or(DataError::NoSegment(id))?;
        let from = SlotAddr {
            device: rec.device,
            slot: rec.slot,
        };
        let to = self.segs.devices.allocate_move_where(pick)?;
        let copied = self.copy_slot(from, to, rec.used as usize);
        if let Err(e) = copied {
            self.segs.devices.release(to)?;
            return Err(e);
        }
        Ok(Relocation {
            segment: id,
            from,
            to,
        })
    }

    fn copy_slot(&self, from: SlotAddr, to: SlotAddr, used: usize) -> Result<()> {
        let src = self.segs.devices.device(from.device)?;
        let dst = self.segs.devices.device(to.device)?;
        let (a, b) = (src.slot_offset(from.slot), dst.slot_offset(to.slot));
        if dst.class().is_object_store() {
            // One write of the whole segment: a sync of the device by
            // someone else then never uploads part of it (`writer.rs`).
            let mut buf = vec![0u8; used];
            src.read_at(&mut buf, a)?;
            dst.write_at(&buf, b)
                .map_err(|e| DataError::of_write(to.device, e))?;
            return dst.sync().map_err(|e| DataError::of_write(to.device, e));
        }
        let mut buf = vec![0u8; COPY_STEP];
        let mut done = 0;
        while done < used {
            let n = COPY_STEP.min(used - done);
            src.read_at(&mut buf[..n], a + done as u64)?;
            dst.write_at(&buf[..n], b + done as u64)
                .map_err(|e| DataError::of_write(to.device, e))?;
            done += n;
        }
        dst.sync().map_err(|e| DataError::of_write(to.device, e))?;
        Ok(())
    }

    /// The segment's record as it will be after the move, or None if the
    /// segment changed since the copy (dropped or moved by someone else):
    /// then the caller gives up with `abandon`.
    pub fn relocated_record(&self, r: &Relocation) -> Option<SegmentRec> {
        let cur = self.segment(r.segment)?;
        if (cur.device, cur.slot) != (r.from.device, r.from.slot) {
            return None;
        }
        let mut rec = cur;
        rec.device = r.to.device;
        rec.slot = r.to.slot;
        Some(rec)
    }

    /// Frees the copy of a move that will not be switched.
    pub fn abandon(&self, r: &Relocation) -> Result<()> {
        Ok(self.segs.devices.release(r.to)?)
    }

    /// After the transaction with the new record committed: points reads at
    /// the copy, waits for reads in flight at the old slot, frees it.
    pub fn switch(&self, r: &Relocation) -> Result<()> {
        {
            let mut segs = self.segs.table.write();
            let s = segs
                .get_mut(&r.segment)
                .ok_or(DataError::NoSegment(r.segment))?;
            assert_eq!(
                (s.device, s.slot),
                (r.from.device, r.from.slot),
                "segment {} changed during its move",
                r.segment
            );
            s.device = r.to.device;
            s.slot = r.to.slot;
        }
        self.release_slots(&[r.from])
    }
}
