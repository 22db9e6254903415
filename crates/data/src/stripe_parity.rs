//! A stripe's parity, window by window: computed from the data members
//! and written to the parity members (a new stripe, `stripe_build.rs`),
//! or compared with what the parity members hold and rewritten where it
//! differs (scrub, after the data's chunks were checked and repaired, so
//! that parity never takes in rotten data).

use crate::ec;
use crate::error::{invariant, DataError, Result};
use crate::store::ChunkStore;
use crate::stripe_read::MemberBytes;
use crate::stripe_rec::StripeRec;
use cairn_devices::Device;
use std::sync::Arc;

/// Bytes of every member handled at a time.
pub(crate) const WINDOW: u64 = 1 << 20;

/// What a parity check of one stripe found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ParityCheck {
    /// Windows of parity compared, those that differed, and those of them
    /// rewritten.
    pub windows: u64,
    pub differed: u64,
    pub rewritten: u64,
    /// A member is on a device that is not online: nothing was checked.
    pub offline: bool,
}

impl ChunkStore {
    /// Computes the parity of `rec`'s data members and hands each window
    /// to `sink` (offset, parity devices, the window's M parity shards).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "at most WINDOW bytes; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn each_parity_window(
        &self,
        rec: &StripeRec,
        mut sink: impl FnMut(u64, &[Arc<Device>], Vec<Vec<u8>>) -> Result<()>,
    ) -> Result<()> {
        let k = rec.k as usize;
        let devs: Vec<Arc<Device>> = (rec.members.iter())
            .map(|p| self.segs.devices.device(p.device))
            .collect::<std::result::Result<_, _>>()?;
        let mut at = 0u64;
        while at < rec.len as u64 {
            let n = WINDOW.min(rec.len as u64 - at) as usize;
            let data: Vec<MemberBytes> = {
                let _gate = self.segs.io_gate.read();
                let all: Vec<usize> = (0..k).collect();
                let read = self.read_members(rec, &all, at, at + n as u64, true);
                read.into_iter().map(|(_, r)| r).collect::<Result<_>>()?
            };
            let refs: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
            sink(at, &devs[k..], ec::parity(&refs, rec.m as usize)?)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Computes the parity of `rec`'s data members, writes it to the
    /// parity members and syncs them.
    pub(crate) fn write_parity(&self, rec: &StripeRec) -> Result<()> {
        let k = rec.k as usize;
        let parity = &rec.members[k..];
        let seg = self.segs.segment_size;
        self.each_parity_window(rec, |at, devs, shards| {
            // Every parity member gets its shard, and no shard reaches
            // past the bytes the stripe covers (into the next slot).
            invariant!(
                shards.len() == parity.len() && devs.len() == parity.len(),
                "{} parity shards for {} parity members",
                shards.len(),
                parity.len()
            );
            let end = at + shards.first().map_or(0, |s| s.len() as u64);
            invariant!(
                end <= rec.len as u64 && rec.len as u64 <= seg,
                "parity bytes {at}..{end} of a stripe of {} in slots of {seg}",
                rec.len
            );
            for ((d, p), par) in devs.iter().zip(parity).zip(&shards) {
                (d.write_at(par, d.slot_offset(p.slot) + at))
                    .map_err(|e| DataError::of_write(p.device, e))?;
            }
            Ok(())
        })?;
        for p in parity {
            let d = self.segs.devices.device(p.device)?;
            d.sync().map_err(|e| DataError::of_write(p.device, e))?;
        }
        Ok(())
    }

    /// Compares stripe `id`'s parity members with the parity of its data
    /// members; with `repair`, rewrites (and syncs) the windows that
    /// differ. A stripe with a member on a device that is not online is
    /// not checked (`offline`).
    pub fn check_parity(&self, id: u64, repair: bool) -> Result<ParityCheck> {
        let rec = (self.segs.stripes.read().get(id).cloned())
            .ok_or_else(|| DataError::Busy(format!("stripe {id} is gone")))?;
        let parity = rec.members[rec.k as usize..].to_vec();
        let mut out = ParityCheck::default();
        if rec
            .members
            .iter()
            .any(|p| !self.segs.devices.is_online(p.device))
        {
            out.offline = true;
            return Ok(out);
        }
        self.each_parity_window(&rec, |at, devs, shards| {
            for ((d, p), par) in devs.iter().zip(&parity).zip(&shards) {
                out.windows += 1;
                let mut have = vec![0u8; par.len()];
                let read = d.read_at(&mut have, d.slot_offset(p.slot) + at);
                if read.is_ok() && have == *par {
                    continue;
                }
                out.differed += 1;
                tracing::warn!(
                    "stripe {id}: the parity on device {} differs at bytes {at}..{}",
                    p.device,
                    at + par.len() as u64
                );
                if repair {
                    // Under the gate, while the slot is still the
                    // stripe's (else it may be freed and reused).
                    let _gate = self.segs.io_gate.read();
                    let stripes = self.segs.stripes.read();
                    if stripes.get(id).is_none_or(|r| !r.members.contains(p)) {
                        return Err(DataError::Busy(format!("stripe {id} changed")));
                    }
                    (d.write_at(par, d.slot_offset(p.slot) + at)
                        .and_then(|()| d.sync()))
                    .map_err(|e| DataError::of_write(p.device, e))?;
                    out.rewritten += 1;
                }
            }
            Ok(())
        })?;
        Ok(out)
    }
}
