//! Redundant metadata: the store's file kept as two copies on different
//! devices, each page (4 KiB) checked on every read against a crc32c held
//! in RAM. A read whose page does not match is served from the other copy
//! (if that one matches) and the bad page is rewritten from it. Writes,
//! length changes and syncs go to both copies, so each has every commit
//! that was acknowledged. A copy whose write fails is dropped (logged, and
//! counted in `MirrorStats`): the pool goes on with one copy rather than
//! stopping.
//!
//! The checksums are not stored: `Mirror::open` reads both copies and
//! makes them equal first. Where they differ, the store's own integrity
//! check (every committed page against its parent's checksum) says which
//! copy is right (`store.rs`), and the other is repaired from it.

use cairn_devices::Backend;
use parking_lot::{Mutex, RwLock};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The unit of checking and repair.
pub const PAGE: u64 = 4096;

/// Counts of what the mirror did since the pool was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MirrorStats {
    /// Pages rewritten from the other copy when the pool was opened.
    pub repaired_at_open: u64,
    /// Pages rewritten from the other copy when a read found them bad.
    pub repaired_on_read: u64,
    /// Pages rewritten by `scrub`.
    pub repaired_by_scrub: u64,
    /// Copies in use (2, or 1 after a copy failed a write).
    pub copies: u32,
}

/// Two copies of one file, with a checksum per page.
#[derive(Debug)]
pub struct Mirror {
    copies: [Arc<dyn Backend>; 2],
    /// A copy dropped after a failed write (never read or written again).
    dropped: [AtomicBool; 2],
    /// crc32c of each page of the file (the last one zero-padded).
    sums: RwLock<Vec<u32>>,
    /// Held by writes and length changes, and by a read that found a
    /// page bad, so that it does not mistake a page being written for a
    /// damaged one.
    writing: Mutex<()>,
    repaired_at_open: AtomicU64,
    repaired_on_read: AtomicU64,
    repaired_by_scrub: AtomicU64,
}

/// Copies `buf.len()` bytes at `off` out of `pages` (which start at page
/// `first`); UnexpectedEof when they end before.
fn copy_out(buf: &mut [u8], off: u64, first: u64, pages: &[u8]) -> io::Result<()> {
    let skip = (off - first * PAGE) as usize;
    let src = pages.get(skip..skip + buf.len());
    buf.copy_from_slice(src.ok_or(io::ErrorKind::UnexpectedEof)?);
    Ok(())
}

fn crc_page(b: &[u8]) -> u32 {
    let mut page = [0u8; PAGE as usize];
    page[..b.len()].copy_from_slice(b);
    crc32c::crc32c(&page)
}

fn damaged(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Mirror {
    /// The two copies, with the checksums of every page. Both are read
    /// once; only when they differ does `pick` choose the good one (0 or
    /// 1), and the other is made equal to it where it differs.
    pub fn open(
        copies: [Arc<dyn Backend>; 2],
        pick: impl FnOnce(&[Arc<dyn Backend>; 2]) -> io::Result<usize>,
    ) -> io::Result<Mirror> {
        let m = Mirror {
            copies,
            dropped: [AtomicBool::new(false), AtomicBool::new(false)],
            sums: RwLock::new(Vec::new()),
            writing: Mutex::new(()),
            repaired_at_open: AtomicU64::new(0),
            repaired_on_read: AtomicU64::new(0),
            repaired_by_scrub: AtomicU64::new(0),
        };
        let mut n = m.sync_copies(0, false)?;
        if n > 0 {
            let good = pick(&m.copies)?;
            n = m.sync_copies(good, true)?;
        }
        m.repaired_at_open.store(n, Ordering::Relaxed);
        Ok(m)
    }

    /// Compares the other copy with copy `good` page by page and rebuilds
    /// the checksums from `good`; with `repair`, rewrites the pages that
    /// differ. Returns how many differed (at least 1 when the lengths do).
    fn sync_copies(&self, good: usize, repair: bool) -> io::Result<u64> {
        let (src, dst) = (&self.copies[good], &self.copies[1 - good]);
        let len = src.len()?;
        if dst.len()? != len {
            if !repair {
                return Ok(1);
            }
            dst.set_len(len)?;
        }
        let mut sums = Vec::with_capacity(len.div_ceil(PAGE) as usize);
        let mut differ = 0;
        let step = 256 * PAGE;
        let (mut a, mut b) = (vec![0u8; step as usize], vec![0u8; step as usize]);
        let mut at = 0;
        while at < len {
            let n = step.min(len - at) as usize;
            src.read_at(&mut a[..n], at)?;
            dst.read_at(&mut b[..n], at)?;
            for (k, (pa, pb)) in a[..n]
                .chunks(PAGE as usize)
                .zip(b[..n].chunks(PAGE as usize))
                .enumerate()
            {
                sums.push(crc_page(pa));
                if pa != pb {
                    if repair {
                        dst.write_at(pa, at + k as u64 * PAGE)?;
                    }
                    differ += 1;
                }
            }
            at += n as u64;
        }
        if repair && differ > 0 {
            dst.sync_data()?;
        }
        *self.sums.write() = sums;
        Ok(differ)
    }

    pub fn stats(&self) -> MirrorStats {
        MirrorStats {
            repaired_at_open: self.repaired_at_open.load(Ordering::Relaxed),
            repaired_on_read: self.repaired_on_read.load(Ordering::Relaxed),
            repaired_by_scrub: self.repaired_by_scrub.load(Ordering::Relaxed),
            copies: self.live().count() as u32,
        }
    }

    /// The copies still in use, in order.
    fn live(&self) -> impl Iterator<Item = (usize, &Arc<dyn Backend>)> {
        self.copies
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.dropped[*i].load(Ordering::Relaxed))
    }

    /// Drops copy `i` after a failed write, or when it reads wrong
    /// bytes even after a repair, unless it is the last one (the error is
    /// then the caller's).
    fn drop_copy(&self, i: usize, e: &io::Error) -> bool {
        if self.live().count() < 2 {
            return false;
        }
        self.dropped[i].store(true, Ordering::Relaxed);
        tracing::error!("metadata copy {i}: {e}: going on with the other copy only");
        true
    }

    /// Runs `f` on every live copy; a copy that fails is dropped while
    /// another remains.
    fn each(&self, f: impl Fn(&dyn Backend) -> io::Result<()>) -> io::Result<()> {
        for (i, c) in self.live().collect::<Vec<_>>() {
            if let Err(e) = f(&**c) {
                if !self.drop_copy(i, &e) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Reads the whole pages covering `off..off + len` from copy `i`.
    fn read_pages(&self, i: usize, off: u64, len: usize) -> io::Result<(u64, Vec<u8>)> {
        let first = off / PAGE;
        let end = (off + len as u64).div_ceil(PAGE) * PAGE;
        let file_len = self.copies[i].len()?;
        let mut buf = vec![0u8; (end.min(file_len) - first * PAGE) as usize];
        self.copies[i].read_at(&mut buf, first * PAGE)?;
        Ok((first, buf))
    }

    /// The first page of `pages` (page `first` on) whose checksum is wrong.
    fn bad_page(&self, first: u64, pages: &[u8]) -> Option<u64> {
        let sums = self.sums.read();
        pages
            .chunks(PAGE as usize)
            .enumerate()
            .find(|(k, p)| sums.get(first as usize + k) != Some(&crc_page(p)))
            .map(|(k, _)| first + k as u64)
    }

    /// The pages covering `off..off + len` of copy `i` (from page
    /// `first`), if every one matches its checksum.
    fn read_checked(&self, i: usize, off: u64, len: usize) -> io::Result<Option<(u64, Vec<u8>)>> {
        let (first, pages) = self.read_pages(i, off, len)?;
        Ok(self
            .bad_page(first, &pages)
            .is_none()
            .then_some((first, pages)))
    }

    /// Makes copy `j`'s pages from `first` on equal to `good` where they
    /// differ (or cannot be read), then reads them back: a copy that still
    /// reads wrong (or fails) is dropped. Returns the pages rewritten.
    fn rewrite_from(&self, j: usize, first: u64, good: &[u8]) -> u64 {
        let theirs = self.read_pages(j, first * PAGE, good.len());
        let theirs = theirs.map(|(_, b)| b).unwrap_or_default();
        let mut fixed = 0;
        let mut fix = || -> io::Result<()> {
            for (k, page) in good.chunks(PAGE as usize).enumerate() {
                let at = k * PAGE as usize;
                if theirs.get(at..at + page.len()) != Some(page) {
                    let p = first + k as u64;
                    tracing::warn!(
                        "metadata copy {j}: page {p} was damaged; rewritten from the other copy"
                    );
                    self.copies[j].write_at(page, p * PAGE)?;
                    fixed += 1;
                }
            }
            if fixed > 0 {
                self.copies[j].sync_data()?;
                let (_, again) = self.read_pages(j, first * PAGE, good.len())?;
                if again != good {
                    return Err(damaged("still reads wrong bytes after a repair".into()));
                }
            }
            Ok(())
        };
        if let Err(e) = fix() {
            self.drop_copy(j, &e);
        }
        fixed
    }

    /// Checks page `page` of every live copy; a bad one is rewritten from
    /// a good one. Returns the pages rewritten; an error if no copy holds
    /// it right.
    fn repair_page(&self, page: u64) -> io::Result<u64> {
        let good = self.live().find_map(|(i, _)| {
            let checked = self.read_checked(i, page * PAGE, 1).ok().flatten();
            checked.map(|(_, b)| (i, b))
        });
        let Some((g, good)) = good else {
            return Err(damaged(format!(
                "metadata page {page} is damaged in every copy"
            )));
        };
        let others: Vec<usize> = self.live().map(|(j, _)| j).filter(|j| *j != g).collect();
        Ok(others
            .into_iter()
            .map(|j| self.rewrite_from(j, page, &good))
            .sum())
    }

    /// Verifies every page of every copy, repairing bad ones from a good
    /// copy; returns the pages repaired. An error names a page no copy
    /// holds right.
    pub fn scrub(&self) -> io::Result<u64> {
        let _w = self.writing.lock();
        let pages = self.sums.read().len() as u64;
        let mut fixed = 0;
        for (i, _) in self.live().collect::<Vec<_>>() {
            let step = 256;
            let mut p = 0;
            while p < pages {
                let n = step.min(pages - p);
                if self.dropped[i].load(Ordering::Relaxed) {
                    break;
                }
                // A range the copy cannot read is checked page by page.
                let b = (self.read_pages(i, p * PAGE, (n * PAGE) as usize))
                    .map_or_else(|_| vec![0xa5; (n * PAGE) as usize], |(_, b)| b);
                for (k, pg) in b.chunks(PAGE as usize).enumerate() {
                    if self.bad_page(p + k as u64, pg).is_some() {
                        fixed += self.repair_page(p + k as u64)?;
                    }
                }
                p += n;
            }
        }
        self.repaired_by_scrub.fetch_add(fixed, Ordering::Relaxed);
        Ok(fixed)
    }

    /// Recomputes the checksums of the pages covering `off..off + len`
    /// after `buf` was written there (None: a length change): whole pages
    /// from the bytes written, partial ones read back from the first live
    /// copy.
    fn resum(&self, off: u64, len: usize, buf: Option<&[u8]>) -> io::Result<()> {
        let (i, c) = self.live().next().expect("a live copy");
        let file_len = c.len()?;
        let (first, end) = (off / PAGE, (off + len as u64).div_ceil(PAGE));
        let mut sums = self.sums.write();
        sums.resize(file_len.div_ceil(PAGE) as usize, crc_page(&[]));
        for p in first..end.min(sums.len() as u64) {
            let (a, b) = (p * PAGE, ((p + 1) * PAGE).min(file_len));
            let whole = buf.filter(|_| a >= off && b <= off + len as u64 && b - a == PAGE);
            sums[p as usize] = match whole {
                Some(w) => crc_page(&w[(a - off) as usize..(b - off) as usize]),
                None => crc_page(&self.read_pages(i, a, (b - a) as usize)?.1),
            };
        }
        Ok(())
    }
}

impl Backend for Mirror {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let (i, _) = self.live().next().expect("a live copy");
        if let Ok(Some((first, pages))) = self.read_checked(i, off, buf.len()) {
            return copy_out(buf, off, first, &pages);
        }
        // Damaged, unreadable, or being written this instant: look in
        // every copy with writes held off; repair the others from the
        // first that checks out.
        let _w = self.writing.lock();
        let mut failed = None;
        for (i, _) in self.live().collect::<Vec<_>>() {
            match self.read_checked(i, off, buf.len()) {
                Ok(Some((first, pages))) => {
                    let others: Vec<usize> =
                        self.live().map(|(j, _)| j).filter(|j| *j != i).collect();
                    let fixed: u64 = others
                        .into_iter()
                        .map(|j| self.rewrite_from(j, first, &pages))
                        .sum();
                    self.repaired_on_read.fetch_add(fixed, Ordering::Relaxed);
                    return copy_out(buf, off, first, &pages);
                }
                Ok(None) => {}
                Err(e) => failed = Some(e),
            }
        }
        let end = off + buf.len() as u64;
        Err(failed.unwrap_or_else(|| {
            damaged(format!(
                "metadata bytes {off}..{end} are damaged in every copy"
            ))
        }))
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let _w = self.writing.lock();
        self.each(|c| c.write_at(buf, off))?;
        self.resum(off, buf.len(), Some(buf))
    }

    fn sync_data(&self) -> io::Result<()> {
        let live: Vec<(usize, Arc<dyn Backend>)> =
            self.live().map(|(i, c)| (i, c.clone())).collect();
        // Both copies' cache flushes at once: a commit waits for the slower
        // one, not for the sum of both.
        let results: Vec<(usize, io::Result<()>)> = std::thread::scope(|s| {
            let hs: Vec<_> = live
                .iter()
                .map(|(i, c)| (*i, s.spawn(move || c.sync_data())))
                .collect();
            hs.into_iter()
                .map(|(i, h)| {
                    (
                        i,
                        h.join()
                            .unwrap_or_else(|_| Err(io::Error::other("sync panicked"))),
                    )
                })
                .collect()
        });
        for (i, r) in results {
            if let Err(e) = r {
                if !self.drop_copy(i, &e) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let (_, c) = self.live().next().expect("a live copy");
        c.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let _w = self.writing.lock();
        self.each(|c| c.set_len(len))?;
        let mut sums = self.sums.write();
        let pages = len.div_ceil(PAGE) as usize;
        sums.truncate(pages);
        sums.resize(pages, crc_page(&[]));
        drop(sums);
        if !len.is_multiple_of(PAGE) {
            // The last page's tail is cut off (or zeros added).
            self.resum(len - len % PAGE, (len % PAGE) as usize, None)?;
        }
        Ok(())
    }

    fn host_file(&self) -> Option<&std::fs::File> {
        self.copies[0].host_file()
    }
}
