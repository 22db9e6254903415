//! Self-healing reads. When a chunk read fails (an I/O error, or bytes that
//! fail their checksum or hash) and its segment has other copies, the chunk
//! is read from them in turn, fully verified, served from the first good
//! one, and every copy that gave an error or bad bytes on an online device
//! is rewritten in place with the good bytes (and synced). Each repair is
//! logged (segment, offset, device) and counted (`HealStats`); the
//! filesystem layer, which knows the file, logs it with the file's name.
//! Scrub checks every copy of a chunk, not only the one reads go to
//! (`check_copies`). A segment in a stripe (`ec=K+M`) whose copies all
//! fail has the chunk restored from the other members of the stripe
//! (`stripe_read.rs`), and its copy rewritten so.

use crate::chunk::unseal;
use crate::error::{invariant, DataError, Result};
use crate::records::{corrupt, ChunkRec};
use crate::store::ChunkStore;
use cairn_devices::SlotAddr;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a check of every copy of a chunk found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CopyCheck {
    /// Copies that read back good.
    pub good: usize,
    /// Bad copies rewritten from a good one.
    pub repaired: Vec<SlotAddr>,
    /// Bad copies left bad (no good copy, or the rewrite failed).
    pub bad: Vec<SlotAddr>,
    /// No copy was good, and the chunk was restored from its stripe's
    /// parity (then rewritten in `repaired`).
    pub restored: bool,
}

/// Errors another copy may cure: the device's, or the bytes'.
fn curable(e: &DataError) -> bool {
    matches!(e, DataError::Device(_) | DataError::Corrupt { .. })
}

impl ChunkStore {
    /// `first` is the outcome of a read of `rec` from the copy reads go to
    /// first; on a curable error, when the segment has other copies, the
    /// chunk comes from a good copy instead (sealed bytes, given to
    /// `from_sealed`) and the bad copies are repaired.
    pub(crate) fn or_heal<T>(
        &self,
        rec: &ChunkRec,
        first: Result<T>,
        from_sealed: impl FnOnce(&[u8]) -> Result<T>,
    ) -> Result<T> {
        let e = match first {
            Ok(v) => return Ok(v),
            Err(e) if curable(&e) && self.has_other_source(rec) => e,
            Err(e) => return Err(e),
        };
        // A device known to be missing or faulted was said once, loudly:
        // each read of its chunks is not news.
        let known = self
            .segment(rec.segment)
            .is_some_and(|s| (s.places().iter()).all(|p| !self.segs.devices.is_online(p.device)));
        match known {
            true => tracing::debug!("{e}: reading another copy or the stripe's parity"),
            false => tracing::warn!("{e}: reading another copy"),
        }
        let (sealed, check) = self.good_copy(rec, &e)?;
        let counter = match check.restored {
            true => &self.heal.restored,
            false => &self.heal.served,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        from_sealed(&sealed)
    }

    /// True if the chunk can come from elsewhere than the copy read
    /// first: another copy, or the stripe of its segment.
    fn has_other_source(&self, rec: &ChunkRec) -> bool {
        self.segment(rec.segment)
            .is_some_and(|s| !s.copies.is_empty() || self.stripe_of(&s.places()).is_some())
    }

    /// Reads `rec` from each copy until one is good; rewrites the bad ones
    /// tried before it. Returns the good sealed bytes and what was done.
    fn good_copy(&self, rec: &ChunkRec, first_err: &DataError) -> Result<(Vec<u8>, CopyCheck)> {
        let seg = self
            .segment(rec.segment)
            .ok_or(DataError::NoSegment(rec.segment))?;
        let mut bad = Vec::new();
        for place in self.segs.read_order(&seg) {
            match self.read_copy(rec, place) {
                Ok(sealed) => {
                    let check = self.repair(rec, &sealed, &format!("device {}", place.device), bad);
                    return Ok((sealed, check));
                }
                Err(e) if !self.segs.devices.is_online(place.device) => {
                    tracing::debug!("copy on device {}: {e}", place.device);
                    bad.push(place);
                }
                Err(e) => {
                    tracing::warn!("copy on device {}: {e}", place.device);
                    bad.push(place);
                }
            }
        }
        if let Some(restored) = self.chunk_from_stripe(rec) {
            let sealed = restored?;
            let online = bad.iter().any(|p| self.segs.devices.is_online(p.device));
            let (seg, off) = (rec.segment, rec.offset);
            match online {
                true => tracing::warn!(
                    "the chunk at segment {seg} offset {off} was restored from its stripe's parity"
                ),
                false => tracing::debug!(
                    "the chunk at segment {seg} offset {off} was restored from its stripe's parity"
                ),
            }
            let mut check = self.repair(rec, &sealed, "the stripe's parity", bad);
            check.restored = true;
            return Ok((sealed, check));
        }
        Err(corrupt(
            rec,
            format!("every copy is bad or unreadable (first: {first_err})"),
        ))
    }

    /// The sealed bytes of `rec` in the copy at `place`, fully verified.
    fn read_copy(&self, rec: &ChunkRec, place: SlotAddr) -> Result<Vec<u8>> {
        let _gate = self.segs.io_gate.read();
        let (dev, at) = self.segs.locate_at(rec, place)?;
        let mut buf = vec![0u8; rec.len as usize];
        let read = dev.read_at(&mut buf, at);
        match read {
            Ok(()) => self.segs.devices.note_read_ok(place.device),
            Err(e) => {
                let n = self.segs.devices.note_read_error(place.device);
                if n >= cairn_devices::set::FAULTED_AFTER_READS {
                    self.segs.fault(place.device);
                }
                return Err(e.into());
            }
        }
        let raw = unseal(&buf, &rec.hash, true).map_err(|why| corrupt(rec, why.to_string()))?;
        if raw.len() != rec.raw_len as usize {
            return Err(corrupt(rec, "raw length differs from record".into()));
        }
        Ok(buf)
    }

    /// Rewrites `rec` in each copy of `bad` (on online devices) with the
    /// good `sealed` bytes (`good` says where they came from).
    fn repair(&self, rec: &ChunkRec, sealed: &[u8], good: &str, bad: Vec<SlotAddr>) -> CopyCheck {
        let mut out = CopyCheck {
            good: 1,
            ..Default::default()
        };
        for place in bad {
            // A copy on a missing or faulted device is not damage to
            // repair here: re-replication makes it anew elsewhere.
            if !self.segs.devices.is_online(place.device) {
                out.bad.push(place);
                continue;
            }
            match self.rewrite(rec, sealed, place) {
                Ok(()) => {
                    tracing::warn!(
                        "repaired the chunk at segment {} offset {} on device {} from {good}",
                        rec.segment,
                        rec.offset,
                        place.device,
                    );
                    self.heal.repaired.fetch_add(1, Ordering::Relaxed);
                    out.repaired.push(place);
                }
                Err(e) => {
                    tracing::error!(
                        "could not repair the chunk at segment {} offset {} on device {}: {e}",
                        rec.segment,
                        rec.offset,
                        place.device
                    );
                    self.heal.unrepaired.fetch_add(1, Ordering::Relaxed);
                    out.bad.push(place);
                }
            }
        }
        out
    }

    /// Writes the good bytes of `rec` over its copy at `place` and syncs.
    fn rewrite(&self, rec: &ChunkRec, sealed: &[u8], place: SlotAddr) -> Result<()> {
        if !self.segs.devices.is_online(place.device) {
            return Err(DataError::Busy(format!(
                "device {} is not online",
                place.device
            )));
        }
        let _gate = self.segs.io_gate.read();
        // Under the gate: a copy moved or dropped since it was read has
        // its slot freed (maybe reused), and must not be written.
        let still = self
            .segment(rec.segment)
            .filter(|s| s.places().contains(&place));
        let Some(seg) = still else {
            return Err(DataError::Busy(format!("segment {} changed", rec.segment)));
        };
        let (dev, at) = self.segs.locate_at(rec, place)?;
        // The repair covers the chunk's bytes and no others: those of the
        // next chunk, or past what the segment holds.
        invariant!(
            sealed.len() == rec.len as usize,
            "a repair of {} bytes for a chunk of {}",
            sealed.len(),
            rec.len
        );
        invariant!(
            rec.offset as u64 + rec.len as u64 <= seg.used as u64,
            "segment {}: a repair at {}+{} past the {} bytes appended",
            rec.segment,
            rec.offset,
            rec.len,
            seg.used
        );
        dev.write_at(sealed, at)
            .and_then(|()| dev.sync())
            .map_err(|e| DataError::of_write(place.device, e))
    }

    /// Scrub: reads `rec` from every copy, fully verified; repairs the bad
    /// ones from a good one. With one copy, a bad one stays bad.
    pub fn check_copies(&self, rec: &ChunkRec) -> Result<CopyCheck> {
        let seg = self
            .segment(rec.segment)
            .ok_or(DataError::NoSegment(rec.segment))?;
        let mut bad = Vec::new();
        let mut good = None;
        for place in self.segs.read_order(&seg) {
            match self.read_copy(rec, place) {
                Ok(sealed) => {
                    if good.is_none() {
                        good = Some((place, sealed));
                    }
                }
                Err(_) => bad.push(place),
            }
        }
        let restored = match good {
            None => self.chunk_from_stripe(rec).and_then(|r| r.ok()),
            Some(_) => None,
        };
        if let Some(sealed) = restored {
            let mut check = self.repair(rec, &sealed, "the stripe's parity", bad);
            check.good = 0;
            check.restored = true;
            return Ok(check);
        }
        let Some((from, sealed)) = good else {
            return Ok(CopyCheck {
                bad,
                ..Default::default()
            });
        };
        let total = 1 + seg.copies.len();
        let mut check = self.repair(rec, &sealed, &format!("device {}", from.device), bad);
        check.good = total - check.repaired.len() - check.bad.len();
        Ok(check)
    }

    /// What self-healing did since the pool was opened: (served from
    /// another copy, repaired, left unrepaired).
    pub fn heal_counts(&self) -> (u64, u64, u64) {
        let h = &self.heal;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (get(&h.served), get(&h.repaired), get(&h.unrepaired))
    }

    /// Chunks restored from their stripe's parity since the pool was
    /// opened.
    pub fn restored_count(&self) -> u64 {
        self.heal.restored.load(Ordering::Relaxed)
    }
}
