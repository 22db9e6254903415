//! Bytes that will not be read again, dropped from the host's page cache.
//! Small chunks are written through the page cache (see `writer.rs`) so
//! that their random reads hit it. A chunk that dies (its last reference
//! goes) or that only history holds any more stays cached as long as a
//! live one, and the host cannot tell them apart: a pool whose clients
//! overwrite at random fills the cache with dead chunks and pushes its live
//! data out, which is then read from the disk. The segment accounting notes
//! each such chunk here; after the metadata commit (`Segments::
//! release_slots`) the notes are merged per device, and the whole pages
//! they cover are dropped (`Device::drop_cached`); a page shared with a
//! live chunk stays. Only a hint: the bytes stay on the
//! device, and a history read of a dropped chunk reads them from there.

use parking_lot::Mutex;

/// Page size of the host's cache: only whole pages are dropped.
const PAGE: u64 = 4096;

/// Notes kept before they are dropped anyway, without waiting for the
/// commit (a prune or a clone of millions of chunks).
pub(crate) const MAX_NOTES: usize = 1 << 16;

/// One chunk's bytes on a device: (device id, slot, offset in the slot,
/// length).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Dead {
    pub device: u32,
    pub slot: u64,
    pub offset: u64,
    pub len: u64,
}

#[derive(Default)]
pub(crate) struct DeadPages(Mutex<Vec<Dead>>);

impl DeadPages {
    /// Notes a chunk's bytes; true when enough notes wait to drop them now.
    pub(crate) fn note(&self, d: Dead) -> bool {
        let mut v = self.0.lock();
        v.push(d);
        v.len() >= MAX_NOTES
    }

    /// Takes the notes, as (device, byte ranges on it) with `slot_offset`
    /// giving a slot's first byte on its device (None: the device is gone,
    /// its notes are skipped).
    pub(crate) fn take(
        &self,
        slot_offset: impl Fn(u32, u64) -> Option<u64>,
    ) -> Vec<(u32, Vec<(u64, u64)>)> {
        let mut notes = std::mem::take(&mut *self.0.lock());
        notes.sort_unstable();
        let mut out: Vec<(u32, Vec<(u64, u64)>)> = Vec::new();
        for d in notes {
            let Some(base) = slot_offset(d.device, d.slot) else {
                continue;
            };
            if out.last().is_none_or(|(dev, _)| *dev != d.device) {
                out.push((d.device, Vec::new()));
            }
            let ranges = &mut out.last_mut().expect("pushed").1;
            ranges.push((base + d.offset, d.len));
        }
        for (_, ranges) in &mut out {
            *ranges = page_ranges(ranges);
        }
        out
    }
}

/// The whole pages of `ranges` (offset, length), as (offset, length):
/// ranges that touch or overlap merged first, then rounded in to whole
/// pages, so that a page a live neighbour shares is kept.
fn page_ranges(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = ranges
        .iter()
        .filter(|(_, len)| *len > 0)
        .map(|&(off, len)| (off, off + len))
        .collect();
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (from, to) in spans {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    merged
        .into_iter()
        .map(|(f, t)| (f.div_ceil(PAGE) * PAGE, t / PAGE * PAGE))
        .filter(|(f, t)| t > f)
        .map(|(f, t)| (f, t - f))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_merged_then_rounded_in_to_whole_pages() {
        // Two chunks of 4,160 bytes back to back (one whole page between
        // them), an empty one, one alone (no whole page of its own); then
        // a page exactly.
        let r = page_ranges(&[(100_000, 0), (4100, 4160), (8260, 4160), (20_000, 4160)]);
        assert_eq!(r, vec![(8192, 4096)]);
        let r = page_ranges(&[(4000, 4160), (8160, 4160), (1 << 20, 4096), (4096, 1)]);
        assert_eq!(r, vec![(4096, 8192), (1 << 20, 4096)]);
    }

    #[test]
    fn notes_are_grouped_by_device_and_placed_by_slot() {
        let d = DeadPages::default();
        let dead = |device, slot, offset| Dead {
            device,
            slot,
            offset,
            len: 4096,
        };
        assert!(!d.note(dead(1, 2, 0)));
        d.note(dead(0, 0, 8192));
        d.note(dead(7, 0, 0)); // a device that is gone
        d.note(dead(1, 0, 4096));
        let got = d.take(|dev, slot| (dev != 7).then_some(slot * (1 << 20)));
        assert_eq!(
            got,
            vec![
                (0, vec![(8192, 4096)]),
                (1, vec![(4096, 4096), (2 << 20, 4096)])
            ]
        );
        assert!(d.take(|_, _| Some(0)).is_empty(), "taken once");
    }

    #[test]
    fn enough_notes_ask_to_be_dropped_before_the_commit() {
        let d = DeadPages::default();
        let one = Dead {
            device: 0,
            slot: 0,
            offset: 0,
            len: 1,
        };
        let asked = (0..MAX_NOTES).filter(|_| d.note(one)).count();
        assert_eq!(asked, 1);
    }
}
