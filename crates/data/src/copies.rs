//! Writing one segment's copies: a write target (`wpipe.rs`) that puts each
//! buffer at the same segment offset in every copy of the open segment,
//! in parallel (the copies are on different devices, so the write takes
//! as long as the slowest one, not their sum). A copy whose write fails is
//! dropped, noted in `Dropped`, and the write succeeds while one copy took
//! it: the batch then records the segment without that copy
//! (`writer.rs`), the pool says which device failed, and the missing copy
//! is made again later. Only when every copy fails does the write fail.
//! A copy whose device does not answer within the I/O timeout while
//! another copy took the write is dropped so too, and its device faulted
//! (`deadline.rs`): a hung disk does not hold the pool's commits.

use crate::aligned::AlignedBuf;
use crate::deadline::{devices_within, DeviceJob};
use crate::error::{invariant, DataError, Result};
use crate::wpipe::{write_device, WriteTarget};
use cairn_devices::{Device, SlotAddr};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// Copies whose writes failed, shared by a batch and its targets.
#[derive(Debug, Default)]
pub(crate) struct Dropped(Mutex<Vec<(SlotAddr, DataError)>>);

impl Dropped {
    pub(crate) fn note_failed(&self, at: SlotAddr, e: DataError) {
        let mut v = self.0.lock();
        if !v.iter().any(|(a, _)| *a == at) {
            v.push((at, e));
        }
    }

    /// True if the copy at `at` was dropped.
    pub(crate) fn has(&self, at: SlotAddr) -> bool {
        self.0.lock().iter().any(|(a, _)| *a == at)
    }

    /// The dropped copies, and why, emptied.
    pub(crate) fn take(&self) -> Vec<(SlotAddr, DataError)> {
        std::mem::take(&mut *self.0.lock())
    }
}

/// The copies of one segment a write goes to: each device with the byte
/// offset of its slot.
pub(crate) struct CopyTarget {
    pub(crate) places: Vec<(SlotAddr, Arc<Device>, u64)>,
    pub(crate) dropped: Arc<Dropped>,
    /// How long a copy's write may take while another copy took it.
    pub(crate) timeout: Option<Duration>,
    /// The slots' size: no write may reach past a segment's end.
    pub(crate) segment_size: u64,
}

impl CopyTarget {
    /// Writes `buf`'s first `n` bytes at `at` of each copy of `many` on its
    /// own thread, each waited for at most the timeout; one that did not
    /// answer is `Hung` (its thread keeps its share of the buffer).
    fn write_each(
        &self,
        many: &[&(SlotAddr, Arc<Device>, u64)],
        buf: &Arc<AlignedBuf>,
        n: usize,
        at: u64,
        cached: bool,
    ) -> Vec<Result<()>> {
        let jobs: Vec<(u32, DeviceJob)> = (many.iter())
            .map(|(addr, dev, base)| {
                let (dev, own, to) = (dev.clone(), buf.clone(), base + at);
                let job = move || write_device(&dev, own.slice(n), to, cached);
                (addr.device, Box::new(job) as DeviceJob)
            })
            .collect();
        devices_within(self.timeout, jobs)
    }
}

impl WriteTarget for CopyTarget {
    /// `at` is the offset in the segment.
    fn write(&self, buf: &Arc<AlignedBuf>, n: usize, at: u64, cached: bool) -> Result<()> {
        // The device refuses writes outside its data area, but cannot
        // tell one slot from the next: this write would land on the
        // segment after this one.
        let end = at.checked_add(n as u64);
        invariant!(
            end.is_some_and(|e| e <= self.segment_size),
            "a segment write of {n} bytes at offset {at}, past the segment's {} bytes",
            self.segment_size
        );
        let live: Vec<_> = (self.places.iter())
            .filter(|(a, _, _)| !self.dropped.has(*a))
            .collect();
        assert!(!self.places.is_empty(), "a write with no copy to go to");
        let results: Vec<Result<()>> = match live.as_slice() {
            [] => return Err(DataError::Writer("every copy of the segment failed")),
            [(_, dev, base)] => vec![write_device(dev, buf.slice(n), base + at, cached)],
            many => self.write_each(many, buf, n, at, cached),
        };
        let mut first_err = None;
        let mut ok = 0;
        for ((addr, _, _), r) in live.iter().zip(results) {
            match r {
                Ok(()) => ok += 1,
                // A bug, not the device: the batch fails whatever the
                // other copies did.
                Err(e) if e.is_invariant() => return Err(e),
                Err(e) if live.len() > 1 => self.dropped.note_failed(*addr, e),
                Err(e) => first_err = Some(e),
            }
        }
        match (ok, first_err) {
            (0, Some(e)) => Err(e),
            (0, None) => Err(DataError::Writer("every copy of the segment failed")),
            _ => Ok(()),
        }
    }
}
