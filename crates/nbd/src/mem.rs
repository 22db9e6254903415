//! `MemExport`: a sparse in-memory export for tests and examples, 4 KiB
//! pages allocated on first write and freed by trim, with knobs a test
//! needs: read-only, a delay per request (a slow device), injected I/O
//! errors, and counters of flushes and concurrent calls.

use crate::export::{Export, HOLE, ZERO};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

const PAGE: u64 = 4096;

/// A sparse in-memory block device.
pub struct MemExport {
    size: u64,
    block_size: u32,
    read_only: bool,
    /// Sleep per call, in microseconds (`set_delay`).
    delay_us: AtomicU64,
    pages: RwLock<BTreeMap<u64, Box<[u8]>>>,
    fail: AtomicBool,
    flushes: AtomicU64,
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
}

/// Counts a call in flight while alive.
struct Busy<'a>(&'a MemExport);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

impl MemExport {
    /// An empty (all holes) writable export of `size` bytes.
    #[allow(clippy::cast_possible_truncation, reason = "PAGE is 4096")]
    pub fn new(size: u64) -> MemExport {
        MemExport {
            size,
            block_size: PAGE as u32,
            read_only: false,
            delay_us: AtomicU64::new(0),
            pages: RwLock::new(BTreeMap::new()),
            fail: AtomicBool::new(false),
            flushes: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            peak_in_flight: AtomicU64::new(0),
        }
    }

    /// The same export, read-only.
    pub fn read_only(mut self) -> MemExport {
        self.read_only = true;
        self
    }

    /// The same export, sleeping `d` in every call (a slow device).
    pub fn with_delay(self, d: Duration) -> MemExport {
        self.set_delay(d);
        self
    }

    /// From now on every call sleeps `d` (zero: none).
    pub fn set_delay(&self, d: Duration) {
        self.delay_us
            .store(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), SeqCst);
    }

    /// A read-only copy of the current contents (a snapshot).
    pub fn snapshot(&self) -> MemExport {
        let copy = MemExport::new(self.size).read_only();
        *copy.pages.write() = self.pages.read().clone();
        copy
    }

    /// From now on every call fails with an I/O error (or works again).
    pub fn set_failing(&self, fail: bool) {
        self.fail.store(fail, SeqCst);
    }

    pub fn flushes(&self) -> u64 {
        self.flushes.load(SeqCst)
    }

    /// The most calls that were ever running at once.
    pub fn peak_in_flight(&self) -> u64 {
        self.peak_in_flight.load(SeqCst)
    }

    /// Pages allocated.
    pub fn allocated_pages(&self) -> usize {
        self.pages.read().len()
    }

    fn enter(&self) -> io::Result<Busy<'_>> {
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.peak_in_flight.fetch_max(now, SeqCst);
        let busy = Busy(self);
        let delay = self.delay_us.load(SeqCst);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        if self.fail.load(SeqCst) {
            return Err(io::Error::other("injected I/O error"));
        }
        Ok(busy)
    }

    /// Calls `f(page, range within page, range within the request)` for
    /// each page overlapping `off..off + len`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within a PAGE-sized page, or within the request's buffer"
    )]
    fn each_page(off: u64, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut pos = off;
        while pos < off + len {
            let page = pos / PAGE;
            let within = (pos % PAGE) as usize;
            let n = (PAGE - pos % PAGE).min(off + len - pos) as usize;
            f(page, within, n, (pos - off) as usize);
            pos += n as u64;
        }
    }

    fn zero_range(&self, off: u64, len: u64) {
        let mut pages = self.pages.write();
        Self::each_page(off, len, |p, at, n, _| {
            if n as u64 == PAGE {
                pages.remove(&p);
            } else if let Some(page) = pages.get_mut(&p) {
                page[at..at + n].fill(0);
            }
        });
    }
}

impl Export for MemExport {
    fn size(&self) -> u64 {
        self.size
    }

    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let _busy = self.enter()?;
        let pages = self.pages.read();
        Self::each_page(off, buf.len() as u64, |p, at, n, i| match pages.get(&p) {
            Some(page) => buf[i..i + n].copy_from_slice(&page[at..at + n]),
            None => buf[i..i + n].fill(0),
        });
        Ok(())
    }

    #[allow(clippy::cast_possible_truncation, reason = "PAGE is 4096")]
    fn write(&self, off: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        let _busy = self.enter()?;
        let mut pages = self.pages.write();
        Self::each_page(off, data.len() as u64, |p, at, n, i| {
            let page = pages
                .entry(p)
                .or_insert_with(|| vec![0; PAGE as usize].into());
            page[at..at + n].copy_from_slice(&data[i..i + n]);
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let _busy = self.enter()?;
        self.flushes.fetch_add(1, SeqCst);
        Ok(())
    }

    fn trim(&self, off: u64, len: u64) -> io::Result<()> {
        let _busy = self.enter()?;
        self.zero_range(off, len);
        Ok(())
    }

    #[allow(clippy::cast_possible_truncation, reason = "PAGE is 4096")]
    fn write_zeroes(&self, off: u64, len: u64, may_trim: bool, _fua: bool) -> io::Result<()> {
        let _busy = self.enter()?;
        if may_trim {
            self.zero_range(off, len);
            return Ok(());
        }
        let mut pages = self.pages.write();
        Self::each_page(off, len, |p, at, n, _| {
            let page = pages
                .entry(p)
                .or_insert_with(|| vec![0; PAGE as usize].into());
            page[at..at + n].fill(0);
        });
        Ok(())
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "extents of a request, whose length is a u32"
    )]
    fn block_status(&self, off: u64, len: u32) -> io::Result<Vec<(u32, u32)>> {
        let _busy = self.enter()?;
        let pages = self.pages.read();
        let mut out: Vec<(u32, u32)> = Vec::new();
        Self::each_page(off, len as u64, |p, _, n, _| {
            let flags = if pages.contains_key(&p) {
                0
            } else {
                HOLE | ZERO
            };
            match out.last_mut() {
                Some((l, f)) if *f == flags => *l += n as u32,
                _ => out.push((n as u32, flags)),
            }
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_reads_writes_trims_and_extents() {
        let m = MemExport::new(64 << 10);
        m.write(5000, &[7; 5000], false).unwrap();
        let mut b = vec![1u8; 12000];
        m.read(0, &mut b).unwrap();
        assert!(b[..5000].iter().all(|&x| x == 0));
        assert!(b[5000..10000].iter().all(|&x| x == 7));
        assert!(b[10000..].iter().all(|&x| x == 0));
        assert_eq!(m.allocated_pages(), 2);
        let map = m.block_status(0, 64 << 10).unwrap();
        assert_eq!(map, vec![(4096, 3), (8192, 0), (53248, 3)]);
        m.trim(4096, 4096).unwrap();
        assert_eq!(m.allocated_pages(), 1);
        m.trim(9000, 100).unwrap();
        m.read(0, &mut b).unwrap();
        assert!(b[..8192].iter().all(|&x| x == 0));
        assert!(b[8192..9000].iter().all(|&x| x == 7));
        assert!(b[9000..9100].iter().all(|&x| x == 0));
        assert!(b[9100..10000].iter().all(|&x| x == 7));
        m.write_zeroes(0, 4096, false, false).unwrap();
        assert_eq!(m.block_status(0, 100).unwrap(), vec![(100, 0)]);
        m.set_failing(true);
        assert!(m.read(0, &mut b).is_err());
    }
}
