//! Making, repairing and dissolving stripes. Each change is prepared here
//! (bytes written and synced to slots no record names yet), committed by
//! the caller's metadata transaction, then applied in memory; a crash
//! before the commit leaves the new slots unclaimed at the next mount, so
//! nothing needs a journal (as `relocate.rs`).
//! - Making: K sealed segments of an `ec=K+M` layout, not yet in a
//!   stripe, each with a copy on its own failure domain, get M parity
//!   members on M other domains; the commit writes the stripe record and
//!   leaves each segment only the copy that is its member (its other
//!   copies are freed).
//! - Repairing: a member on a lost, faulted or draining device is made
//!   again on another device (copied when it still reads, else restored
//!   from the other members), and the stripe (and the segment that uses
//!   it) point at the new slot.
//! - Dissolving: a stripe none of whose data members a segment uses any
//!   more is dropped and its slots freed.

use crate::ec;
use crate::error::{invariant, DataError, Result};
use crate::records::SegmentRec;
use crate::store::ChunkStore;
use crate::stripe_rec::StripeRec;
use cairn_devices::{Device, SlotAddr};
use std::collections::HashMap;

use crate::stripe_parity::WINDOW;

/// Sealed segments waiting for a stripe, by the (k, m) of their layout.
pub type Candidates = Vec<((usize, usize), Vec<(u64, SegmentRec)>)>;

/// A stripe whose parity is written and synced, not yet committed.
#[derive(Debug, Clone)]
pub struct NewStripe {
    pub id: u64,
    pub rec: StripeRec,
    /// Each data member's segment: (segment id, its copies when planned,
    /// the copy that is the member).
    pub members: Vec<(u64, Vec<SlotAddr>, SlotAddr)>,
}

/// A stripe member made again elsewhere, not yet committed.
#[derive(Debug, Clone)]
pub struct MemberMove {
    pub stripe: u64,
    pub pos: usize,
    pub from: SlotAddr,
    pub to: SlotAddr,
}

impl ChunkStore {
    /// Every stripe, by id.
    pub fn stripe_table(&self) -> Vec<(u64, StripeRec)> {
        self.segs.stripes.read().sorted()
    }

    /// The sealed segments that wait for a stripe, grouped by the (k, m)
    /// of their class's layout, by id.
    pub fn stripe_candidates(&self) -> Candidates {
        let mut groups: Candidates = Vec::new();
        for (id, s) in self.segment_table() {
            let Some(km) = self.layout_of(&s).and_then(|l| l.ec()) else {
                continue;
            };
            if self.is_open(id) || s.used == 0 || self.stripe_of(&s.places()).is_some() {
                continue;
            }
            match groups.iter_mut().find(|(g, _)| *g == km) {
                Some((_, v)) => v.push((id, s)),
                None => groups.push((km, vec![(id, s)])),
            }
        }
        groups
    }

    /// Makes a stripe of `k` of `cands` (each member a copy on a failure
    /// domain no other member uses) with `m` parity members on other
    /// domains, parity written and synced. None when the candidates or
    /// the devices do not reach that many domains.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "k <= MAX_DATA = 16 and m <= MAX_PARITY = 3 (a segment layout's, debug-asserted); len is at most a segment, whose size is <= 1 GiB (check_geometry)"
    )]
    pub fn make_stripe(
        &self,
        k: usize,
        m: usize,
        cands: &[(u64, SegmentRec)],
    ) -> Result<Option<NewStripe>> {
        debug_assert!(
            k <= crate::layout::MAX_DATA && m <= crate::layout::MAX_PARITY,
            "a stripe of {k}+{m}"
        );
        let set = &self.segs.devices;
        let usable = |p: &SlotAddr| set.is_online(p.device) && !set.is_draining(p.device);
        let mut domains: Vec<Option<String>> = Vec::new();
        let mut members = Vec::with_capacity(k);
        for (id, s) in cands {
            let places = s.places();
            let pick = places
                .iter()
                .find(|p| usable(p) && !domains.contains(&set.domain(p.device)));
            if let Some(p) = pick {
                domains.push(set.domain(p.device));
                members.push((*id, places.clone(), *p));
            }
            if members.len() == k {
                break;
            }
        }
        if members.len() < k {
            return Ok(None);
        }
        let data: Vec<SlotAddr> = members.iter().map(|m| m.2).collect();
        let rank = set.device(data[0].device)?.class().rank();
        let parity = set.allocate_copies(&data, rank, m, |_, _, _| true);
        let used = (members.iter())
            .map(|(id, _, _)| {
                self.segment(*id)
                    .map_or(self.segs.segment_size, |s| s.used as u64)
            })
            .max();
        let len = used.unwrap_or(0).div_ceil(ec::ALIGN) * ec::ALIGN;
        let rec = StripeRec {
            k: k as u8,
            m: m as u8,
            len: len.min(self.segs.segment_size) as u32,
            members: data.into_iter().chain(parity.iter().copied()).collect(),
        };
        let new = NewStripe {
            id: self.segs.stripes.read().next_id(),
            rec,
            members,
        };
        if parity.len() < m {
            self.release_new_slots(&parity)?;
            return Ok(None);
        }
        assert!(new.rec.len > 0, "a stripe covers the bytes of its members");
        // Parity covers every byte a member holds: a byte past `len`
        // could not be restored.
        invariant!(
            new.rec.len as u64 >= used.unwrap_or(0),
            "stripe {}: parity over {} bytes of members holding {:?}",
            new.id,
            new.rec.len,
            used
        );
        let checked =
            (new.members.iter()).try_for_each(|(id, _, kept)| self.verify_kept(*id, *kept));
        if let Err(e) = checked.and_then(|()| self.write_parity(&new.rec)) {
            self.release_new_slots(&parity)?;
            self.count_failed_write(&e);
            return Err(e);
        }
        Ok(Some(new))
    }

    /// Makes sure the copy `kept` of segment `id` is intact before its
    /// other copies go: the segment is read checked (`verified.rs`: a
    /// chunk damaged in one copy is taken from another) and each piece
    /// that differs in `kept` is written there.
    fn verify_kept(&self, id: u64, kept: SlotAddr) -> Result<()> {
        let rec = self.segment(id).ok_or(DataError::NoSegment(id))?;
        let dev = self.segs.devices.device(kept.device)?;
        let base = dev.slot_offset(kept.slot);
        let mut wrote = 0;
        self.read_checked(id, &rec, |off, bytes| {
            let mut have = vec![0u8; bytes.len()];
            if dev.read_at(&mut have, base + off).is_ok() && have == bytes {
                return Ok(());
            }
            // Under the gate, and only while the copy is still the
            // segment's (else its slot may be reused).
            let _gate = self.segs.io_gate.read();
            if !self.segment(id).is_some_and(|s| s.places().contains(&kept)) {
                return Err(DataError::Busy(format!("segment {id} changed")));
            }
            wrote += bytes.len();
            dev.write_at(bytes, base + off)
                .map_err(|e| DataError::of_write(kept.device, e))
        })?;
        if wrote > 0 {
            dev.sync()
                .map_err(|e| DataError::of_write(kept.device, e))?;
            tracing::warn!(
                "segment {id}: {wrote} damaged bytes of its copy on device {} rewritten before it joined a stripe",
                kept.device
            );
        }
        Ok(())
    }

    /// The segment records once `s` is committed (each keeps its member
    /// copy only), or None when one of them changed since (dropped,
    /// moved): then the caller gives the stripe up with `abandon_stripe`.
    pub fn striped_records(&self, s: &NewStripe) -> Option<Vec<(u64, SegmentRec)>> {
        let table = self.segs.table.read();
        let mut out = Vec::with_capacity(s.members.len());
        for (id, planned, member) in &s.members {
            let mut rec = table.get(id)?.clone();
            if rec.places() != *planned {
                return None;
            }
            rec.set_places(&[*member]);
            out.push((*id, rec));
        }
        Some(out)
    }

    /// Frees the parity slots of a stripe that will not be committed.
    pub fn abandon_stripe(&self, s: &NewStripe) -> Result<()> {
        self.release_new_slots(&s.rec.members[s.rec.k as usize..])
    }

    /// After the transaction with the stripe and `records` (from
    /// `striped_records`) committed: the stripe holds its members, the
    /// segments keep their member copies, their other copies are freed.
    pub fn stripe_committed(&self, s: &NewStripe, records: Vec<(u64, SegmentRec)>) -> Result<()> {
        let mut freed = Vec::new();
        {
            let mut table = self.segs.table.write();
            let mut stripes = self.segs.stripes.write();
            stripes.insert(s.id, s.rec.clone())?;
            for ((id, planned, member), (rid, rec)) in s.members.iter().zip(records) {
                invariant!(
                    *id == rid,
                    "stripe {}: record of {rid} for member {id}",
                    s.id
                );
                let cur = table.get_mut(id).ok_or(DataError::NoSegment(*id))?;
                // The committed records were made from these places
                // (`striped_records`): the other copies freed here are
                // named by no record.
                invariant!(
                    cur.places() == *planned,
                    "segment {id} changed under stripe {}: {:?}, not {:?}",
                    s.id,
                    cur.places(),
                    planned
                );
                *cur = rec;
                freed.extend(planned.iter().filter(|p| *p != member));
            }
        }
        self.release_slots(&freed)
    }

    /// Stripes no segment needs: none uses a data member, or each that
    /// does has the copies its class's layout asks for on online devices
    /// (a policy lowered from `ec` after re-replication made the copies,
    /// or a thinned stripe, `thin_stripes`).
    pub fn unneeded_stripes(&self) -> Vec<u64> {
        let set = &self.segs.devices;
        let table = self.segs.table.read();
        let users: HashMap<SlotAddr, &SegmentRec> = (table.values())
            .flat_map(|s| s.places().into_iter().map(move |p| (p, s)))
            .collect();
        let covered = |s: &SegmentRec| {
            let Some(layout) = self.segs.layout_of(s) else {
                return false;
            };
            let online = s
                .places()
                .iter()
                .filter(|p| set.is_online(p.device))
                .count();
            online >= layout.copies()
        };
        let stripes = self.segs.stripes.read();
        let unneeded = |r: &StripeRec| {
            r.data()
                .iter()
                .all(|p| users.get(p).is_none_or(|s| covered(s)))
        };
        (stripes.sorted().into_iter())
            .filter(|(_, r)| unneeded(r))
            .map(|(id, _)| id)
            .collect()
    }

    /// Stripes with all members online whose data members are used by at
    /// most half as many segments as they have (GC and the tier mover
    /// moved the others' chunks away): their dead members and parity hold
    /// space for little. Each with the segments that use it.
    pub fn thin_stripes(&self) -> Vec<(u64, Vec<u64>)> {
        let set = &self.segs.devices;
        let table = self.segs.table.read();
        let users: HashMap<SlotAddr, u64> = (table.iter())
            .flat_map(|(id, s)| s.places().into_iter().map(move |p| (p, *id)))
            .collect();
        let stripes = self.segs.stripes.read();
        let mut out = Vec::new();
        for (id, r) in stripes.sorted() {
            let used: Vec<u64> = r
                .data()
                .iter()
                .filter_map(|p| users.get(p).copied())
                .collect();
            let online = r.members.iter().all(|p| set.is_online(p.device));
            if online && !used.is_empty() && used.len() * 2 <= r.k as usize {
                out.push((id, used));
            }
        }
        out
    }

    /// After the transaction that removed stripes `ids` committed: the
    /// members no segment uses are freed (those in use become their
    /// segments' own slots).
    pub fn stripes_dissolved(&self, ids: &[u64]) -> Result<()> {
        let mut freed = Vec::new();
        {
            let table = self.segs.table.read();
            let used: std::collections::HashSet<SlotAddr> =
                table.values().flat_map(|s| s.places()).collect();
            let mut stripes = self.segs.stripes.write();
            self.segs.restored.clear();
            for id in ids {
                let members = stripes.remove(*id).map(|r| r.members).unwrap_or_default();
                freed.extend(members.into_iter().filter(|p| !used.contains(p)));
            }
        }
        self.release_slots(&freed)
    }

    /// Members on devices that are not online or are draining (with
    /// `replace_missing`, missing ones too, else those wait for their
    /// device): (stripe, position), in device order.
    pub fn members_to_repair(&self, replace_missing: bool) -> Vec<(u64, usize)> {
        let set = &self.segs.devices;
        let mut out: Vec<(SlotAddr, u64, usize)> = Vec::new();
        for (id, rec) in self.stripe_table() {
            for (pos, p) in rec.members.iter().enumerate() {
                let missing = set.state(p.device) == Some(cairn_devices::DeviceState::Missing);
                let bad = !set.is_online(p.device) || set.is_draining(p.device);
                if bad && (replace_missing || !missing) {
                    out.push((*p, id, pos));
                }
            }
        }
        out.sort_by_key(|(p, _, _)| (p.device, p.slot));
        out.into_iter().map(|(_, id, pos)| (id, pos)).collect()
    }

    /// Makes member `pos` of stripe `id` again on a device `pick` accepts
    /// whose failure domain no other member uses: copied when it still
    /// reads, else restored from the others; synced.
    pub fn remake_member(
        &self,
        id: u64,
        pos: usize,
        pick: impl Fn(&Device, u64, u64) -> bool,
    ) -> Result<MemberMove> {
        let rec = (self.segs.stripes.read().get(id).cloned())
            .ok_or_else(|| DataError::Busy(format!("stripe {id} is gone")))?;
        let from = rec.members[pos];
        let others: Vec<SlotAddr> = (rec.members.iter().copied())
            .filter(|p| *p != from)
            .collect();
        let rank = (self.segs.devices.device(from.device)).map_or(0, |d| d.class().rank());
        let to = (self
            .segs
            .devices
            .allocate_copies(&others, rank, 1, pick)
            .pop())
        .ok_or(DataError::NoSpace)?;
        let mv = MemberMove {
            stripe: id,
            pos,
            from,
            to,
        };
        if let Err(e) = self.fill_member(&rec, &mv) {
            self.release_new_slots(&[to])?;
            self.count_failed_write(&e);
            return Err(e);
        }
        Ok(mv)
    }

    /// Writes member `mv.pos`'s bytes at `mv.to` and syncs.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "at most WINDOW bytes; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn fill_member(&self, rec: &StripeRec, mv: &MemberMove) -> Result<()> {
        // The new slot is no member's: writing it destroys nothing the
        // restore reads.
        invariant!(
            rec.position(mv.to).is_none(),
            "stripe {}: member {} remade over member {:?}",
            mv.stripe,
            mv.pos,
            rec.position(mv.to)
        );
        let src = self.segs.devices.device(mv.from.device)?;
        let dst = self.segs.devices.device(mv.to.device)?;
        let readable = self.segs.devices.is_online(mv.from.device);
        let mut at = 0u64;
        while at < rec.len as u64 {
            let mut b = vec![0u8; WINDOW.min(rec.len as u64 - at) as usize];
            let direct = readable && {
                let _gate = self.segs.io_gate.read();
                src.read_at(&mut b, src.slot_offset(mv.from.slot) + at)
                    .is_ok()
            };
            if !direct {
                self.restore_range(rec, mv.pos, at, &mut b)?;
            }
            (dst.write_at(&b, dst.slot_offset(mv.to.slot) + at))
                .map_err(|e| DataError::of_write(mv.to.device, e))?;
            at += b.len() as u64;
        }
        dst.sync().map_err(|e| DataError::of_write(mv.to.device, e))
    }

    /// The stripe record, and the record of the segment that uses the
    /// member (if any), once `mv` is committed; None when the stripe
    /// changed since (the caller gives the move up with `abandon_move`).
    pub fn moved_records(&self, mv: &MemberMove) -> Option<(StripeRec, Option<(u64, SegmentRec)>)> {
        let mut rec = self.segs.stripes.read().get(mv.stripe)?.clone();
        if rec.members[mv.pos] != mv.from {
            return None;
        }
        rec.members[mv.pos] = mv.to;
        let table = self.segs.table.read();
        let user = table.iter().find(|(_, s)| s.places().contains(&mv.from));
        let seg = user.map(|(sid, s)| {
            let mut s = s.clone();
            let places: Vec<SlotAddr> = (s.places().into_iter())
                .map(|p| if p == mv.from { mv.to } else { p })
                .collect();
            s.set_places(&places);
            (*sid, s)
        });
        Some((rec, seg))
    }

    /// Frees the new slot of a move that will not be committed.
    pub fn abandon_move(&self, mv: &MemberMove) -> Result<()> {
        self.release_new_slots(&[mv.to])
    }

    /// After the transaction with `moved_records`' records committed: the
    /// stripe and the segment point at the new slot, the old one is freed.
    pub fn member_moved(&self, mv: &MemberMove, seg: Option<(u64, SegmentRec)>) -> Result<()> {
        {
            let mut table = self.segs.table.write();
            let mut stripes = self.segs.stripes.write();
            self.segs.restored.clear();
            stripes.move_member(mv.stripe, mv.pos, mv.to);
            if let Some((sid, rec)) = seg {
                let cur = table.get_mut(&sid).ok_or(DataError::NoSegment(sid))?;
                assert!(cur.places().contains(&mv.from), "segment {sid} changed");
                *cur = rec;
            }
        }
        self.release_slots(&[mv.from])
    }
}
