//! Restoring a stripe member's bytes from the other members: the range
//! (widened to `ec::ALIGN`) is read from K other members in parallel,
//! online devices first and data members before parity (a failed read is
//! replaced by the next member), and decoded. Self-healing reads, scrub,
//! checked segment copies and stripe repair use it when no copy of a
//! segment gives its bytes.

use crate::aligned::AlignedBuf;
use crate::ec;
use crate::error::{DataError, Result};
use crate::records::{corrupt, ChunkRec};
use crate::store::ChunkStore;
use crate::stripe_rec::StripeRec;
use cairn_devices::device::DIRECT_ALIGN;
use cairn_devices::SlotAddr;
use std::sync::Arc;

/// Bytes of a member restored at a time (a multiple of `ec::ALIGN`).
const RESTORE_WINDOW: u64 = 1 << 20;

/// A member's bytes as read: in the aligned buffer a direct read filled
/// (not copied out), or in a vector.
pub(crate) enum MemberBytes {
    Direct(AlignedBuf, usize),
    Buffered(Vec<u8>),
}

impl std::ops::Deref for MemberBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            MemberBytes::Direct(buf, n) => buf.slice(*n),
            MemberBytes::Buffered(v) => v,
        }
    }
}

impl ChunkStore {
    /// The stripe whose data member a segment at `places` uses: (stripe
    /// id, position, record).
    pub fn stripe_of(&self, places: &[SlotAddr]) -> Option<(u64, usize, StripeRec)> {
        let stripes = self.segs.stripes.read();
        stripes
            .of_places(places)
            .map(|(id, pos, rec)| (id, pos, rec.clone()))
    }

    /// True if segment `id` is in a stripe.
    pub fn is_striped(&self, id: u64) -> bool {
        self.segment(id)
            .is_some_and(|s| self.stripe_of(&s.places()).is_some())
    }

    /// Bytes `[off, off + buf.len())` of member `pos` of stripe `rec`,
    /// restored from the other members.
    pub(crate) fn restore_range(
        &self,
        rec: &StripeRec,
        pos: usize,
        off: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let got = self.restore_ranges(rec, &[pos], off, buf.len())?;
        buf.copy_from_slice(&got[0]);
        Ok(())
    }

    /// Bytes `[off, off + len)` of members `wants` of stripe `rec`, in
    /// that order, restored together from one read of K other members
    /// (past the host's page cache where the device allows: a file read
    /// reads the surviving data members' chunks directly too, and a
    /// buffered read of them cost a fifth of a degraded sequential read's
    /// time in page-cache copies).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "an offset within a window of a member; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn restore_ranges(
        &self,
        rec: &StripeRec,
        wants: &[usize],
        off: u64,
        len: usize,
    ) -> Result<Vec<Vec<u8>>> {
        let (k, m) = (rec.k as usize, rec.m as usize);
        let end = off + len as u64;
        if end > rec.len as u64 {
            return Err(DataError::Parity(format!(
                "bytes {off}..{end} are beyond the {} bytes parity covers",
                rec.len
            )));
        }
        let (a, e) = ec::aligned(off, len as u64, rec.len as u64);
        let mut order: Vec<usize> = (0..k + m).filter(|i| !wants.contains(i)).collect();
        order.sort_by_key(|i| (!self.segs.devices.is_online(rec.members[*i].device), *i));
        let mut have: Vec<(usize, MemberBytes)> = Vec::with_capacity(k);
        let mut next = order.into_iter();
        let _gate = self.segs.io_gate.read();
        while have.len() < k {
            let batch: Vec<usize> = next.by_ref().take(k - have.len()).collect();
            if batch.is_empty() {
                break;
            }
            for (i, r) in self.read_members(rec, &batch, a, e, false) {
                match r {
                    Ok(b) => have.push((i, b)),
                    Err(err) => tracing::warn!(
                        "stripe member on device {}: {err}; reading another",
                        rec.members[i].device
                    ),
                }
            }
        }
        let refs: Vec<(usize, &[u8])> = have.iter().map(|(i, b)| (*i, &**b)).collect();
        let restored = ec::restore_many(k, m, &refs, wants)?;
        let from = (off - a) as usize;
        Ok((restored.into_iter())
            .map(|r| match (from, r.len() == len) {
                (0, true) => r,
                _ => r[from..from + len].to_vec(),
            })
            .collect())
    }

    /// The window at `w` of member `pos` of stripe `id`, restored (or
    /// found restored).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a window of a stripe, at most a segment; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn restored_window(
        &self,
        stripe: &StripeRec,
        id: u64,
        pos: usize,
        w: u64,
    ) -> Result<Arc<Vec<u8>>> {
        let key = (id, stripe.members[pos], w);
        // The other data members whose devices are gone need this window
        // too (a sequential read goes through them all): restored from the
        // same read of the survivors, and kept.
        let set = &self.segs.devices;
        let gone = (0..stripe.k as usize)
            .filter(|i| *i != pos && !set.is_online(stripe.members[*i].device));
        let wants: Vec<usize> = std::iter::once(pos).chain(gone).collect();
        self.segs.restored.get_or_restore(key, || {
            let len = RESTORE_WINDOW.min((stripe.len as u64).saturating_sub(w));
            let mut got = self.restore_ranges(stripe, &wants, w, len as usize)?;
            let first = got.remove(0);
            for (i, b) in wants[1..].iter().zip(got) {
                let key = (id, stripe.members[*i], w);
                self.segs.restored.keep(key, Arc::new(b));
            }
            Ok(first)
        })
    }

    /// Bytes `[a, e)` of the members of `rec` at positions `which`, read
    /// at once (a thread each), with what each read gave.
    pub(crate) fn read_members(
        &self,
        rec: &StripeRec,
        which: &[usize],
        a: u64,
        e: u64,
        cached: bool,
    ) -> Vec<(usize, Result<MemberBytes>)> {
        std::thread::scope(|s| {
            let jobs: Vec<_> = (which.iter())
                .map(|&i| {
                    let at = rec.members[i];
                    (i, s.spawn(move || self.read_member(at, a, e, cached)))
                })
                .collect();
            let died = || Err(DataError::Parity("a stripe member's reader died".into()));
            let joined = jobs.into_iter();
            joined
                .map(|(i, j)| (i, j.join().unwrap_or_else(|_| died())))
                .collect()
        })
    }

    /// Bytes `[a, e)` of the slot at `at`: unless `cached`, past the
    /// host's page cache when the device allows (the bytes are read once,
    /// to restore another member; left in the aligned buffer), else
    /// buffered.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a range within a member slot; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn read_member(&self, at: SlotAddr, a: u64, e: u64, cached: bool) -> Result<MemberBytes> {
        let dev = self.segs.devices.device(at.device)?;
        assert!(
            at.slot < dev.header.slot_count(),
            "a member is in its device"
        );
        let (off, n) = (dev.slot_offset(at.slot) + a, (e - a) as usize);
        if !cached && off.is_multiple_of(DIRECT_ALIGN as u64) {
            let cap = n.next_multiple_of(DIRECT_ALIGN);
            let mut direct = AlignedBuf::new(cap, DIRECT_ALIGN);
            if dev.read_direct_at(direct.slice_mut(cap), off, n)? {
                return Ok(MemberBytes::Direct(direct, n));
            }
        }
        let mut b = vec![0u8; n];
        dev.read_at(&mut b, off)?;
        Ok(MemberBytes::Buffered(b))
    }

    /// The sealed bytes of chunk `rec` restored from the stripe of its
    /// segment, fully verified; None when the segment is in no stripe.
    pub(crate) fn chunk_from_stripe(&self, rec: &ChunkRec) -> Option<Result<Vec<u8>>> {
        let seg = self.segment(rec.segment)?;
        let (id, pos, stripe) = self.stripe_of(&seg.places())?;
        Some(self.restore_chunk(rec, id, pos, &stripe))
    }

    /// Restores chunk `rec` of member `pos` of stripe `id`: from the
    /// restored windows that hold it, restoring those it lacks.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within the restored bytes; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn restore_chunk(
        &self,
        rec: &ChunkRec,
        id: u64,
        pos: usize,
        stripe: &StripeRec,
    ) -> Result<Vec<u8>> {
        let (start, end) = (rec.offset as u64, rec.offset as u64 + rec.len as u64);
        let mut buf = Vec::with_capacity(rec.len as usize);
        let mut w = start - start % RESTORE_WINDOW;
        while w < end {
            let bytes = self.restored_window(stripe, id, pos, w)?;
            let (a, b) = (start.max(w) - w, end.min(w + bytes.len() as u64) - w);
            if a >= b {
                return Err(corrupt(
                    rec,
                    "beyond the bytes its stripe's parity covers".into(),
                ));
            }
            buf.extend_from_slice(&bytes[a as usize..b as usize]);
            w += RESTORE_WINDOW;
        }
        let raw = (self.codec.unseal(&buf, &rec.hash, true))
            .map_err(|why| corrupt(rec, format!("restored from stripe {id}, still bad: {why}")))?;
        if raw.len() != rec.raw_len as usize {
            return Err(corrupt(rec, "raw length differs from record".into()));
        }
        Ok(buf)
    }
}
