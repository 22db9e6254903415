//! Reading a whole segment for a copy of it (re-replication, device
//! replacement, the tier mover) chunk by chunk, each checked, from
//! whichever copy has it intact: chunks are packed one after another from
//! the segment's start (docs/FORMAT.md, "Chunk"), each header and its
//! stored bytes carry a crc32c, so a segment checks itself without the
//! chunk records. Big windows are read from one copy (the fast path); a
//! chunk that fails its checks there is read alone from the others, so a
//! rotten copy never passes its rot to a new one. A chunk bad in every
//! copy is copied as found (the reads of it keep failing their checks,
//! naming it) and counted. A segment in a stripe has its bytes restored
//! from the other members when no copy gives them.

use crate::chunk::{ChunkHeader, CHUNK_HEADER_LEN};
use crate::error::{invariant, Result};
use crate::records::SegmentRec;
use crate::store::ChunkStore;
use std::sync::atomic::Ordering;

/// Bytes read from one copy at a time: any chunk fits in half a window
/// (a record is at most 1 MiB, stored raw when compression does not pay).
const WINDOW: usize = 4 << 20;

/// What a checked read of a segment found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// Chunks that failed their checks in the first copy and were taken
    /// intact from another.
    pub from_other_copy: u64,
    /// Chunks intact in no copy, or bytes past a header no copy holds
    /// intact (copied as found).
    pub bad_everywhere: u64,
}

/// The length of the intact chunk at the start of `b` (header and stored
/// bytes checked), if `b` holds all of it and it ends by `room`.
fn intact_len(b: &[u8], room: u64) -> Option<usize> {
    let h = ChunkHeader::decode(b).ok()?;
    let total = CHUNK_HEADER_LEN + h.stored_len as usize;
    if total as u64 > room || total > b.len() {
        return None;
    }
    let data = &b[CHUNK_HEADER_LEN..total];
    (crc32c::crc32c(data) == h.data_crc).then_some(total)
}

impl ChunkStore {
    /// Reads the `used` bytes of segment `rec` in order, checked chunk by
    /// chunk, and hands them to `sink` (offset in the segment, bytes) in
    /// pieces of about a window.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets and lengths within a segment slot, read in windows of WINDOW bytes; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    pub(crate) fn read_checked(
        &self,
        id: u64,
        rec: &SegmentRec,
        mut sink: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<Checked> {
        let used = rec.used as u64;
        let mut seen = Checked::default();
        let mut win = vec![0u8; WINDOW.min(used as usize)];
        let (mut win_at, mut win_len) = (0u64, 0usize);
        let mut out: Vec<u8> = Vec::with_capacity(win.len());
        let mut out_at = 0u64;
        let mut pos = 0u64;
        while pos < used {
            let room = used - pos;
            // The window holds the whole chunk at `pos` if it is intact:
            // at least half a window (more than any chunk) or the
            // segment's end is in it.
            let ends = win_at + win_len as u64 == used;
            let o = match pos.checked_sub(win_at).map(|o| o as usize) {
                Some(o) if o < win_len && (win_len - o >= WINDOW / 2 || ends) => o,
                _ => {
                    win_len = (room as usize).min(win.len());
                    win_at = pos;
                    self.read_segment_range(rec, pos, &mut win[..win_len])?;
                    0
                }
            };
            let here = &win[o..win_len];
            let other;
            let bytes: &[u8] = match intact_len(here, room) {
                Some(n) => &here[..n],
                None => match self.intact_chunk_elsewhere(rec, pos, room) {
                    Some(b) => {
                        seen.from_other_copy += 1;
                        tracing::warn!(
                            "segment {id}: the chunk at offset {pos} is damaged in the copy read \
                             first; copied from another copy"
                        );
                        other = b;
                        &other
                    }
                    None => {
                        seen.bad_everywhere += 1;
                        let n = ChunkHeader::decode(here)
                            .map(|h| CHUNK_HEADER_LEN + h.stored_len as usize)
                            .ok()
                            .filter(|n| *n <= here.len())
                            .unwrap_or(here.len());
                        tracing::error!(
                            "segment {id}: the {n} bytes at offset {pos} are damaged in every \
                             copy; copied as found (reads of them fail their checks)"
                        );
                        &here[..n]
                    }
                },
            };
            assert!(!bytes.is_empty(), "a checked read moves on");
            if out.is_empty() {
                out_at = pos;
            }
            out.extend_from_slice(bytes);
            pos += bytes.len() as u64;
            // What goes to the sink is the segment's bytes without a gap
            // or an overlap, and none past its end.
            invariant!(
                out_at + out.len() as u64 == pos && pos <= used,
                "segment {id}: {} bytes from {out_at} handed on at {pos} of {used}",
                out.len()
            );
            if out.len() >= WINDOW / 2 {
                sink(out_at, &out)?;
                out.clear();
            }
        }
        if !out.is_empty() {
            sink(out_at, &out)?;
        }
        let h = &self.heal;
        h.repaired
            .fetch_add(seen.from_other_copy, Ordering::Relaxed);
        h.unrepaired
            .fetch_add(seen.bad_everywhere, Ordering::Relaxed);
        Ok(seen)
    }

    /// Reads `buf.len()` bytes at `off` of segment `rec` from the first
    /// copy that gives them (in read order).
    fn read_segment_range(&self, rec: &SegmentRec, off: u64, buf: &mut [u8]) -> Result<()> {
        let mut last = None;
        for p in self.segs.read_order(rec) {
            let dev = self.segs.devices.device(p.device)?;
            match dev.read_at(buf, dev.slot_offset(p.slot) + off) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!("copy on device {}: {e}; reading another", p.device);
                    last = Some(e);
                }
            }
        }
        if let Some((id, pos, stripe)) = self.stripe_of(&rec.places()) {
            tracing::warn!("restoring bytes {off}.. of a member of stripe {id} from its parity");
            return self.restore_range(&stripe, pos, off, buf);
        }
        Err(last.expect("a segment has a copy").into())
    }

    /// The chunk at `pos` of segment `rec` from the first copy that holds
    /// it intact, read alone.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "min(CHUNK_HEADER_LEN); u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn intact_chunk_elsewhere(&self, rec: &SegmentRec, pos: u64, room: u64) -> Option<Vec<u8>> {
        for p in self.segs.read_order(rec) {
            let Ok(dev) = self.segs.devices.device(p.device) else {
                continue;
            };
            let at = dev.slot_offset(p.slot) + pos;
            let mut head = vec![0u8; CHUNK_HEADER_LEN.min(room as usize)];
            if dev.read_at(&mut head, at).is_err() {
                continue;
            }
            let Ok(h) = ChunkHeader::decode(&head) else {
                continue;
            };
            let total = CHUNK_HEADER_LEN + h.stored_len as usize;
            if total as u64 > room {
                continue;
            }
            let mut b = vec![0u8; total];
            if dev.read_at(&mut b, at).is_ok() && intact_len(&b, room) == Some(total) {
                return Some(b);
            }
        }
        self.intact_chunk_from_stripe(rec, pos, room)
    }

    /// The chunk at `pos` of segment `rec` restored from its stripe, if it
    /// is in one and the restored bytes are intact.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "min(CHUNK_HEADER_LEN); u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn intact_chunk_from_stripe(&self, rec: &SegmentRec, pos: u64, room: u64) -> Option<Vec<u8>> {
        let (_, at, stripe) = self.stripe_of(&rec.places())?;
        let mut head = vec![0u8; CHUNK_HEADER_LEN.min(room as usize)];
        self.restore_range(&stripe, at, pos, &mut head).ok()?;
        let h = ChunkHeader::decode(&head).ok()?;
        let total = CHUNK_HEADER_LEN + h.stored_len as usize;
        if total as u64 > room {
            return None;
        }
        let mut b = vec![0u8; total];
        self.restore_range(&stripe, at, pos, &mut b).ok()?;
        (intact_len(&b, room) == Some(total)).then_some(b)
    }
}
