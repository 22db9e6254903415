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

use crate::aligned::AlignedBuf;
use crate::chunk::{ChunkHeader, CHUNK_HEADER_LEN};
use crate::error::{invariant, Result};
use crate::records::SegmentRec;
use crate::store::ChunkStore;
use cairn_devices::DIRECT_ALIGN;
use std::sync::atomic::Ordering;

/// Bytes read from one copy at a time: any chunk fits in half a window
/// (a record is at most 1 MiB, stored raw when compression does not pay).
const WINDOW: usize = 4 << 20;
/// Room for the bytes handed on next: under half a window, plus what one
/// step adds (a chunk, or at most a window copied as found).
const OUT_ROOM: usize = WINDOW / 2 + WINDOW;

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
    /// pieces of about half a window. Windows are read past the host's
    /// page cache where the device allows, and every piece but the last
    /// starts and ends at a multiple of DIRECT_ALIGN in an aligned buffer,
    /// so the sink can write it past the cache too (`Device::write_direct_at`):
    /// a rebuild then moves no byte through the page cache.
    pub(crate) fn read_checked(
        &self,
        id: u64,
        rec: &SegmentRec,
        mut sink: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<Checked> {
        let (mut win, mut out) = Buffers::take();
        let seen = self.read_checked_with(id, rec, &mut win, &mut out, &mut sink);
        Buffers::give_back(win, out);
        let seen = seen?;
        let h = &self.heal;
        h.repaired
            .fetch_add(seen.from_other_copy, Ordering::Relaxed);
        h.unrepaired
            .fetch_add(seen.bad_everywhere, Ordering::Relaxed);
        Ok(seen)
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets and lengths within a segment slot, read in windows of WINDOW bytes; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn read_checked_with(
        &self,
        id: u64,
        rec: &SegmentRec,
        win: &mut AlignedBuf,
        out: &mut Pending,
        sink: &mut impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<Checked> {
        let used = rec.used as u64;
        let mut seen = Checked::default();
        let (mut win_at, mut win_len) = (0u64, 0usize);
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
                    // From the aligned offset at or before `pos`.
                    win_at = pos - pos % DIRECT_ALIGN as u64;
                    win_len = ((used - win_at) as usize).min(win.capacity());
                    self.read_segment_range(rec, win_at, win, win_len)?;
                    (pos - win_at) as usize
                }
            };
            let here = &win.slice(win_len)[o..];
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
            out.push(bytes);
            pos += bytes.len() as u64;
            // What goes to the sink is the segment's bytes without a gap
            // or an overlap, and none past its end.
            invariant!(
                out.at + out.len as u64 == pos && pos <= used,
                "segment {id}: {} bytes from {} handed on at {pos} of {used}",
                out.len,
                out.at
            );
            if out.len >= WINDOW / 2 {
                out.hand_on_aligned(sink)?;
            }
        }
        if out.len > 0 {
            sink(out.at, out.buf.slice(out.len))?;
        }
        Ok(seen)
    }

    /// Reads `len` bytes at `off` (a multiple of DIRECT_ALIGN) of segment
    /// `rec` into `win` from the first copy that gives them (in read
    /// order): past the page cache where the device allows (the read then
    /// covers whole aligned blocks, within the slot), else buffered.
    fn read_segment_range(
        &self,
        rec: &SegmentRec,
        off: u64,
        win: &mut AlignedBuf,
        len: usize,
    ) -> Result<()> {
        assert!(off.is_multiple_of(DIRECT_ALIGN as u64) && len <= win.capacity());
        let mut last = None;
        for p in self.segs.read_order(rec) {
            let dev = self.segs.devices.device(p.device)?;
            let at = dev.slot_offset(p.slot) + off;
            let whole = len.next_multiple_of(DIRECT_ALIGN);
            let direct = whole as u64 + off <= self.segs.segment_size
                && dev.read_direct_at(win.slice_mut(whole), at, len)?;
            let read = match direct {
                true => Ok(()),
                false => dev.read_at(win.slice_mut(len), at),
            };
            match read {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!("copy on device {}: {e}; reading another", p.device);
                    last = Some(e);
                }
            }
        }
        if let Some((id, pos, stripe)) = self.stripe_of(&rec.places()) {
            tracing::warn!("restoring bytes {off}.. of a member of stripe {id} from its parity");
            return self.restore_range(&stripe, pos, off, win.slice_mut(len));
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

/// The checked bytes of a segment not yet handed on: `len` bytes at
/// segment offset `at` (a multiple of DIRECT_ALIGN), in an aligned buffer.
struct Pending {
    buf: AlignedBuf,
    at: u64,
    len: usize,
}

/// The window and pending buffers of a checked read, kept per thread
/// between segments (a rebuild reads thousands; mapping and zeroing 10 MiB
/// for each costs more than its checks).
struct Buffers;

thread_local! {
    static BUFFERS: std::cell::RefCell<Option<(AlignedBuf, Pending)>> =
        const { std::cell::RefCell::new(None) };
}

impl Buffers {
    /// This thread's buffers (new ones when they are in use or not made).
    fn take() -> (AlignedBuf, Pending) {
        let (win, mut out) = BUFFERS
            .with_borrow_mut(Option::take)
            .unwrap_or_else(|| (AlignedBuf::huge(WINDOW), Pending::new(OUT_ROOM)));
        out.at = 0;
        out.len = 0;
        (win, out)
    }

    fn give_back(win: AlignedBuf, out: Pending) {
        BUFFERS.with_borrow_mut(|b| *b = Some((win, out)));
    }
}

impl Pending {
    fn new(cap: usize) -> Self {
        Pending {
            buf: AlignedBuf::huge(cap),
            at: 0,
            len: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        assert!(
            end <= self.buf.capacity(),
            "checked bytes overflow their buffer"
        );
        self.buf.slice_mut(end)[self.len..].copy_from_slice(bytes);
        self.len = end;
    }

    /// Hands on the whole aligned blocks held (the rest, under one block,
    /// moves to the front and waits for more).
    fn hand_on_aligned(&mut self, sink: &mut impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let whole = self.len - self.len % DIRECT_ALIGN;
        invariant!(
            self.at.is_multiple_of(DIRECT_ALIGN as u64) && whole > 0,
            "checked bytes handed on from {} ({} of {} bytes): not whole aligned blocks",
            self.at,
            whole,
            self.len
        );
        sink(self.at, self.buf.slice(whole))?;
        self.buf.slice_mut(self.len).copy_within(whole.., 0);
        self.at += whole as u64;
        self.len -= whole;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_bytes_go_on_in_whole_aligned_blocks_and_in_order() {
        let mut p = Pending::new(OUT_ROOM);
        let mut seen: Vec<(u64, usize)> = Vec::new();
        let mut got: Vec<u8> = Vec::new();
        let mut want: Vec<u8> = Vec::new();
        let mut sink = |at: u64, b: &[u8]| {
            seen.push((at, b.len()));
            got.extend_from_slice(b);
            Ok(())
        };
        // Chunk-like pieces of odd sizes, as a segment packs them.
        for (i, n) in [70_001usize, 1 << 20, 5, 333_333, 1_048_629, 4096, 77]
            .iter()
            .cycle()
            .take(40)
            .enumerate()
        {
            let bytes: Vec<u8> = (0..*n).map(|k| (k + i).to_le_bytes()[0]).collect();
            p.push(&bytes);
            want.extend_from_slice(&bytes);
            if p.len >= WINDOW / 2 {
                p.hand_on_aligned(&mut sink).unwrap();
                assert!(p.len < DIRECT_ALIGN);
            }
        }
        let (at, len) = (p.at, p.len);
        sink(at, p.buf.slice(len)).unwrap();
        assert_eq!(got, want);
        let (last, whole) = seen.split_last().unwrap();
        let mut next = 0;
        for &(at, len) in whole {
            assert_eq!(at, next);
            assert!(
                at.is_multiple_of(DIRECT_ALIGN as u64)
                    && len.is_multiple_of(DIRECT_ALIGN)
                    && len > 0
            );
            next += len as u64;
        }
        assert_eq!(last.0, next);
    }
}
