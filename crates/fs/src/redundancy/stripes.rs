//! Stripes at the filesystem layer (`ec=K+M` layouts): each run of
//! re-replication starts by making again the stripe members on lost,
//! faulted or draining devices and gathering sealed segments that wait
//! for a stripe into new ones (their extra copies then freed, and a
//! segment striped so needs no more copies), and ends by dropping the
//! stripes no segment needs any more. Each change is prepared by the data
//! layer (`cairn_data::stripe_build`), committed here in one metadata
//! transaction, then applied; a crash before the commit leaves nothing
//! behind, after it the change is whole.

use super::resilver::ResilverReport;
use crate::error::{FsError, Result};
use crate::maintenance::tier::RateLimit;
use crate::vfs::Fs;
use cairn_data::stripe_build::{MemberMove, NewStripe};
use cairn_data::{DataError, SegmentRec, StripeRec};
use cairn_devices::Device;
use std::sync::atomic::Ordering;

impl Fs {
    /// The start of a re-replication run (see the module comment).
    pub(super) fn stripes_first(
        &self,
        replace_missing: bool,
        pick: &dyn Fn(&Device) -> bool,
        rate: &mut RateLimit,
        rep: &mut ResilverReport,
    ) -> Result<()> {
        self.repair_members(replace_missing, pick, rate, rep)?;
        if !self.stopping.load(Ordering::SeqCst) {
            self.build_stripes(rate, rep)?;
        }
        Ok(())
    }

    /// Makes again every member on a device that is not online (missing
    /// ones only with `replace_missing`) or drains.
    fn repair_members(
        &self,
        replace_missing: bool,
        pick: &dyn Fn(&Device) -> bool,
        rate: &mut RateLimit,
        rep: &mut ResilverReport,
    ) -> Result<()> {
        let chunks = &self.pool.chunks;
        for (id, pos) in chunks.members_to_repair(replace_missing) {
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let mv = match chunks.remake_member(id, pos, |d, _, _| pick(d)) {
                Ok(mv) => mv,
                Err(DataError::NoSpace) => {
                    rep.short += 1;
                    continue;
                }
                Err(DataError::Busy(_)) => continue,
                // One member that cannot be made (more members lost than
                // parity covers, a failing target) stops neither the
                // others nor the rest of the run: counted, said, tried
                // again by the next run.
                Err(e) => {
                    tracing::error!("stripe {id}: its member {pos} could not be made again: {e}");
                    rep.short += 1;
                    continue;
                }
            };
            let len = chunks
                .stripe_table()
                .iter()
                .find(|(s, _)| *s == id)
                .map_or(0, |(_, r)| r.len);
            rate.spend(len as u64);
            if self.commit_move(&mv)? {
                rep.members_made += 1;
                rep.bytes += len as u64;
            }
        }
        Ok(())
    }

    /// Commits a remade member; false when the stripe changed meanwhile.
    fn commit_move(&self, mv: &MemberMove) -> Result<bool> {
        let chunks = &self.pool.chunks;
        let _last = self.flush_guard();
        let Some((stripe, seg)) = chunks.moved_records(mv) else {
            chunks.abandon_move(mv)?;
            return Ok(false);
        };
        if let Err(e) = self.put_stripe(mv.stripe, &stripe, seg.as_slice()) {
            chunks.abandon_move(mv)?;
            return Err(e);
        }
        crate::failpoint::hit("stripe-member-committed");
        chunks.member_moved(mv, seg)?;
        Ok(true)
    }

    /// Writes a stripe's record and its segments' records in one
    /// transaction.
    fn put_stripe(&self, id: u64, stripe: &StripeRec, segs: &[(u64, SegmentRec)]) -> Result<()> {
        self.pool.meta.write(|w| {
            w.put_stripe(id, &stripe.encode())?;
            for (sid, rec) in segs {
                w.put_segment(*sid, &rec.encode())?;
            }
            Ok::<_, FsError>(())
        })
    }

    /// Gathers the sealed segments that wait for a stripe into stripes,
    /// as many as their failure domains and the devices' room allow.
    fn build_stripes(&self, rate: &mut RateLimit, rep: &mut ResilverReport) -> Result<()> {
        let chunks = &self.pool.chunks;
        for ((k, m), mut cands) in chunks.stripe_candidates() {
            while cands.len() >= k && !self.stopping.load(Ordering::SeqCst) {
                let made = match chunks.make_stripe(k, m, &cands) {
                    Err(DataError::Busy(_)) => break,
                    // A failing read or parity write: the segments keep
                    // their copies; the rest of the run goes on.
                    Err(e) => {
                        tracing::error!("ec={k}+{m}: a stripe could not be made: {e}");
                        break;
                    }
                    Ok(made) => made,
                };
                let Some(new) = made else {
                    if !self.stripes_warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "ec={k}+{m}: {} segments wait for a stripe, but fewer than {} failure domains have room; they keep {} copies meanwhile",
                            cands.len(),
                            k + m,
                            m + 1
                        );
                    }
                    break;
                };
                cands.retain(|(id, _)| !new.members.iter().any(|(s, _, _)| s == id));
                rate.spend(new.rec.len as u64 * m as u64);
                if self.commit_stripe(&new)? {
                    rep.stripes_made += 1;
                    rep.bytes += new.rec.len as u64 * m as u64;
                }
                self.writes_yield();
            }
        }
        Ok(())
    }

    /// Commits a new stripe; false when one of its segments changed.
    fn commit_stripe(&self, new: &NewStripe) -> Result<bool> {
        let chunks = &self.pool.chunks;
        let _last = self.flush_guard();
        let Some(records) = chunks.striped_records(new) else {
            chunks.abandon_stripe(new)?;
            return Ok(false);
        };
        if let Err(e) = self.put_stripe(new.id, &new.rec, &records) {
            chunks.abandon_stripe(new)?;
            return Err(e);
        }
        crate::failpoint::hit("stripe-committed");
        chunks.stripe_committed(new, records)?;
        Ok(true)
    }

    /// The end of a re-replication run: segments that got copies in it
    /// may now reach the failure domains a stripe needs; stripes no
    /// segment needs go.
    pub(super) fn stripes_last(
        &self,
        rate: &mut RateLimit,
        rep: &mut ResilverReport,
    ) -> Result<()> {
        if !self.stopping.load(Ordering::SeqCst) {
            self.thin_stripes(rate, rep)?;
            self.build_stripes(rate, rep)?;
        }
        self.dissolve_stripes(rep)
    }

    /// A stripe most of whose data members no segment uses holds their
    /// slots and its parity for little: each segment still in it gets the
    /// copies its layout asks for outside a stripe (M+1 for `ec=K+M`),
    /// after which the stripe is dropped (`dissolve_stripes`, below) and
    /// the segments wait for a new stripe with others.
    fn thin_stripes(&self, rate: &mut RateLimit, rep: &mut ResilverReport) -> Result<()> {
        let chunks = &self.pool.chunks;
        let set = chunks.devices();
        let mut ready = Vec::new();
        for (_, users) in chunks.thin_stripes() {
            for sid in users {
                let Some(s) = chunks.segment(sid) else {
                    continue;
                };
                let Ok(dev) = set.device(s.device) else {
                    continue;
                };
                let want = chunks.layout_of(&s).map_or(1, |l| l.copies());
                let add = want.saturating_sub(s.places().len());
                if add == 0 {
                    continue;
                }
                let rank = dev.class().rank();
                match chunks.copy_changing(sid, Vec::new(), add, rank, |_, _, _| true, true) {
                    Ok(r) => {
                        rate.spend(s.used as u64 * add as u64);
                        rep.bytes += s.used as u64 * add as u64;
                        ready.push(r);
                    }
                    Err(DataError::NoSpace | DataError::Busy(_) | DataError::NoSegment(_)) => {}
                    Err(e) => {
                        self.commit_fixes(&mut ready, rep)?;
                        return Err(e.into());
                    }
                }
            }
        }
        self.commit_fixes(&mut ready, rep)
    }

    /// Drops the stripes no segment needs and frees the members no
    /// segment uses.
    fn dissolve_stripes(&self, rep: &mut ResilverReport) -> Result<()> {
        if self.pool.chunks.stripe_table().is_empty() {
            return Ok(());
        }
        let _last = self.flush_guard();
        let idle = self.pool.chunks.unneeded_stripes();
        if idle.is_empty() {
            return Ok(());
        }
        self.pool.meta.write(|w| {
            for id in &idle {
                w.remove_stripe(*id)?;
            }
            Ok::<_, FsError>(())
        })?;
        self.pool.chunks.stripes_dissolved(&idle)?;
        rep.stripes_dropped += idle.len() as u64;
        Ok(())
    }

    /// Drops the stripes no segment needs (their segments all died), for
    /// a writer short of space (`Fs::reclaim`): their slots are free at
    /// once, without waiting for the next re-replication run. Returns how
    /// many went.
    pub(crate) fn drop_unneeded_stripes(&self) -> Result<u64> {
        let mut rep = ResilverReport::default();
        self.dissolve_stripes(&mut rep)?;
        Ok(rep.stripes_dropped)
    }

    /// Stripe members on device `id`.
    pub(crate) fn members_on(&self, id: u32) -> usize {
        let stripes = self.pool.chunks.stripe_table();
        let on = |r: &cairn_data::StripeRec| r.members.iter().filter(|p| p.device == id).count();
        stripes.iter().map(|(_, r)| on(r)).sum()
    }
}
