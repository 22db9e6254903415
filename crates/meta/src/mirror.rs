//! Redundant metadata: the store's file kept as two or more copies on
//! different devices, each page (4 KiB) checked on every read against a
//! crc32c held in RAM. A read whose page does not match is served from
//! another copy (the first that matches) and the bad page is rewritten
//! from it. Writes, length changes and syncs go to every copy, so each has
//! every commit that was acknowledged. A copy whose write fails is dropped
//! (logged, and counted in `MirrorStats`): the pool goes on with the
//! others rather than stopping. A copy can join while the store is in use
//! (`add_copy`: the pool's redundancy was raised).
//!
//! A clean close records the checksums (`page_sums.rs`) and the next open
//! takes them (`Mirror::open_known`) without reading the copies. Otherwise
//! (after a crash, or a copy dropped) `Mirror::open` reads every copy (all
//! at once; pages that the host says are holes in every copy are not read:
//! they are zeros) and makes them equal first. Where they differ, the
//! store's own integrity check (every committed page against its parent's
//! checksum) says which copy is right (`store.rs`), and the others are
//! repaired from it.

use crate::page_sums::PageSums;
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
    /// Copies in use (those opened or added, less those that failed a
    /// write).
    pub copies: u32,
}

/// One copy of the file.
#[derive(Debug)]
struct Copy {
    io: Arc<dyn Backend>,
    /// Dropped after a failed write (never read or written again).
    dropped: AtomicBool,
}

/// Copies of one file, with a checksum per page.
#[derive(Debug)]
pub struct Mirror {
    /// Only grows (`add_copy`), so that an index stays a copy's name.
    copies: RwLock<Vec<Arc<Copy>>>,
    /// Copy 0's file, for `host_file`.
    first: Arc<dyn Backend>,
    /// crc32c of each page of the file (the last one zero-padded).
    sums: RwLock<Vec<u32>>,
    /// Held by writes and length changes, and by a read that found a
    /// page bad, so that it does not mistake a page being written for a
    /// damaged one.
    writing: Mutex<()>,
    /// A write, length change or sync failed, or a page was found
    /// damaged in every copy (`closing_sums`).
    spoiled: AtomicBool,
    repaired_at_open: AtomicU64,
    repaired_on_read: AtomicU64,
    repaired_by_scrub: AtomicU64,
}

/// Copies `buf.len()` bytes at `off` out of `pages` (which start at page
/// `first`); UnexpectedEof when they end before.
#[allow(
    clippy::cast_possible_truncation,
    reason = "page arithmetic on buffers held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
fn copy_out(buf: &mut [u8], off: u64, first: u64, pages: &[u8]) -> io::Result<()> {
    let skip = (off - first * PAGE) as usize;
    let src = pages.get(skip..skip + buf.len());
    buf.copy_from_slice(src.ok_or(io::ErrorKind::UnexpectedEof)?);
    Ok(())
}

/// Where the hole at `at` ends in a copy with data ranges `data` (in
/// order): `at` itself when `at` may hold data or nothing is known.
fn hole_until(data: Option<&[(u64, u64)]>, at: u64) -> u64 {
    let Some(data) = data else {
        return at;
    };
    // The first range that ends after `at`.
    let i = data.partition_point(|&(_, end)| end <= at);
    match data.get(i) {
        Some(&(start, _)) if start <= at => at,
        Some(&(start, _)) => start,
        None => u64::MAX,
    }
}

#[allow(clippy::cast_possible_truncation, reason = "PAGE is 4096")]
fn crc_page(b: &[u8]) -> u32 {
    let mut page = [0u8; PAGE as usize];
    page[..b.len()].copy_from_slice(b);
    crc32c::crc32c(&page)
}

fn damaged(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Mirror {
    /// The copies (at least two), with the checksums of every page. Each
    /// is read once; only when they differ does `pick` choose the good one
    /// (an index into `copies`), and the others are made equal to it where
    /// they differ.
    pub fn open(
        copies: Vec<Arc<dyn Backend>>,
        pick: impl FnOnce(&[Arc<dyn Backend>]) -> io::Result<usize>,
    ) -> io::Result<Mirror> {
        let backends = copies.clone();
        let m = Mirror::new(copies, Vec::new());
        let mut n = m.sync_copies(0, false)?;
        if n > 0 {
            let good = pick(&backends)?;
            assert!(good < backends.len(), "picked copy {good}");
            n = m.sync_copies(good, true)?;
        }
        m.repaired_at_open.store(n, Ordering::Relaxed);
        Ok(m)
    }

    /// The copies with the checksums a clean close recorded (`page_sums`),
    /// without reading them: None (the caller opens them with `open`) when
    /// the record is not of these copies: another count or length, or a
    /// first or last page of some copy that does not match it. Every page
    /// is then checked when it is read, as after `open`.
    pub fn open_known(
        copies: Vec<Arc<dyn Backend>>,
        known: PageSums,
    ) -> io::Result<Option<Mirror>> {
        if known.copies as usize != copies.len() {
            return Ok(None);
        }
        for c in &copies {
            if c.len()? != known.len {
                return Ok(None);
            }
        }
        let m = Mirror::new(copies, known.sums);
        let last = m.sums.read().len().saturating_sub(1) as u64;
        for (i, _) in m.live() {
            for p in [0, last] {
                if m.read_checked(i, p * PAGE, 1)?.is_none() {
                    return Ok(None);
                }
            }
        }
        Ok(Some(m))
    }

    fn new(copies: Vec<Arc<dyn Backend>>, sums: Vec<u32>) -> Mirror {
        assert!(copies.len() >= 2, "a mirror of {} copies", copies.len());
        let first = copies[0].clone();
        let copies = (copies.into_iter())
            .map(|io| {
                Arc::new(Copy {
                    io,
                    dropped: AtomicBool::new(false),
                })
            })
            .collect();
        Mirror {
            copies: RwLock::new(copies),
            first,
            sums: RwLock::new(sums),
            writing: Mutex::new(()),
            spoiled: AtomicBool::new(false),
            repaired_at_open: AtomicU64::new(0),
            repaired_on_read: AtomicU64::new(0),
            repaired_by_scrub: AtomicU64::new(0),
        }
    }

    /// The checksums of every page, for `page_sums` at a clean close:
    /// None when a copy was dropped, a write, length change or sync failed
    /// since the open (the copies may then differ from them), or a page
    /// was damaged in every copy.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the pool's metadata copies, at most 4 (meta_copies)"
    )]
    pub fn closing_sums(&self) -> Option<PageSums> {
        let _w = self.writing.lock();
        let all = self.copies.read().len();
        if self.spoiled.load(Ordering::Relaxed) || self.live().len() != all {
            return None;
        }
        let len = self.first.len().ok()?;
        let sums = self.sums.read().clone();
        assert_eq!(
            sums.len() as u64,
            len.div_ceil(PAGE),
            "page checksums of {len} bytes"
        );
        Some(PageSums {
            copies: all as u32,
            len,
            sums,
        })
    }

    /// The error for bytes no copy holds right, logged; the next open
    /// then checks every page (no `closing_sums`), and refuses a store
    /// whose committed pages are among them.
    fn lost(&self, what: String) -> io::Error {
        tracing::error!("{what}: the next open verifies the whole store");
        self.spoiled.store(true, Ordering::Relaxed);
        damaged(what)
    }

    /// Marks the copies as possibly unlike the checksums (see
    /// `closing_sums`) when `r` is an error.
    fn spoil_on_err<T>(&self, r: io::Result<T>) -> io::Result<T> {
        if r.is_err() {
            self.spoiled.store(true, Ordering::Relaxed);
        }
        r
    }

    /// Compares every other copy with copy `good` page by page and
    /// rebuilds the checksums from `good`; with `repair`, rewrites the
    /// pages that differ. Returns how many differed (at least 1 per copy
    /// whose length does).
    fn sync_copies(&self, good: usize, repair: bool) -> io::Result<u64> {
        let all = self.copies.read().clone();
        assert!(good < all.len(), "copy {good} of {}", all.len());
        let src = all[good].io.clone();
        let len = src.len()?;
        let mut differ = 0;
        let mut sums = Vec::new();
        for (j, dst) in all.iter().enumerate().filter(|(j, _)| *j != good) {
            if !repair && dst.io.len()? != len {
                return Ok(1);
            }
            let sized = match repair {
                true => dst.io.set_len(len),
                false => Ok(()),
            };
            let done = sized
                .and_then(|_| Self::compare(&*src, &*dst.io, len, repair))
                .and_then(|(n, s)| match repair && n > 0 {
                    true => dst.io.sync_data().map(|_| (n, s)),
                    false => Ok((n, s)),
                });
            match done {
                Ok((n, s)) => {
                    if repair && n > 0 {
                        tracing::warn!(
                            "metadata copy {j}: {n} pages differed from copy {good}; repaired"
                        );
                    }
                    (differ, sums) = (differ + n, s);
                }
                // A copy that cannot be made equal is dropped while
                // another remains (a full host under it).
                Err(e) if !(repair && self.drop_copy(j, &e)) => return Err(e),
                Err(_) => {}
            }
        }
        if sums.is_empty() && len > 0 {
            sums = Self::compare(&*src, &*src, len, false)?.1;
        }
        *self.sums.write() = sums;
        Ok(differ)
    }

    /// The pages of `dst` (both `len` long) that differ from `src`'s,
    /// rewritten from `src` with `repair`, and the checksums of `src`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "page arithmetic on buffers held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn compare(
        src: &dyn Backend,
        dst: &dyn Backend,
        len: u64,
        repair: bool,
    ) -> io::Result<(u64, Vec<u32>)> {
        let mut sums = Vec::with_capacity(len.div_ceil(PAGE) as usize);
        let mut differ = 0;
        let step = 256 * PAGE;
        let (mut a, mut b) = (vec![0u8; step as usize], vec![0u8; step as usize]);
        // Pages that are holes in both copies read as zeros in both: their
        // checksums are a zero page's, and nothing is read (a store's file
        // grows by doubling, and its unwritten tail is most of a cold
        // open's reading otherwise). Asked before any read: reading ahead
        // into a hole makes the host count it as data.
        let holes = (src.data_ranges()?, dst.data_ranges()?);
        let mut at = 0;
        while at < len {
            let hole_end = hole_until(holes.0.as_deref(), at)
                .min(hole_until(holes.1.as_deref(), at))
                .min(len);
            let pages = hole_end.saturating_sub(at) / PAGE;
            if pages > 0 {
                sums.resize(sums.len() + pages as usize, crc_page(&[0; PAGE as usize]));
                at += pages * PAGE;
                continue;
            }
            let n = step.min(len - at) as usize;
            // Both copies read at once (a cold open waits on both).
            let (ra, rb) = std::thread::scope(|sc| {
                let other = sc.spawn(|| dst.read_at(&mut b[..n], at));
                let mine = src.read_at(&mut a[..n], at);
                (mine, other.join())
            });
            ra?;
            rb.map_err(|_| io::Error::other("a metadata copy's reader panicked"))??;
            let pages = a[..n]
                .chunks(PAGE as usize)
                .zip(b[..n].chunks(PAGE as usize));
            for (k, (pa, pb)) in pages.enumerate() {
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
        Ok((differ, sums))
    }

    /// Adds a copy while the store is in use: with writes held off, it is
    /// made equal to a copy that checks out page by page, synced, and from
    /// then on written with the others. An error leaves the copies as
    /// they were.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "page arithmetic on buffers held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    pub fn add_copy(&self, new: Arc<dyn Backend>) -> io::Result<()> {
        let _w = self.writing.lock();
        let (good, src) = self.live().into_iter().next().expect("a live copy");
        let len = src.len()?;
        new.set_len(len)?;
        let pages = self.sums.read().len() as u64;
        assert_eq!(pages, len.div_ceil(PAGE), "checksums for every page");
        let mut p = 0;
        while p < pages {
            let n = 256.min(pages - p);
            let b = match self.read_checked(good, p * PAGE, (n * PAGE) as usize)? {
                Some((_, b)) => b,
                None => self.read_pages_repaired(p, n)?,
            };
            new.write_at(&b, p * PAGE)?;
            p += n;
        }
        new.sync_data()?;
        let copy = Copy {
            io: new,
            dropped: AtomicBool::new(false),
        };
        self.copies.write().push(Arc::new(copy));
        Ok(())
    }

    /// Pages `first..first + n` as a copy that checks out holds them,
    /// page by page (repairing the others from it).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "page arithmetic on buffers held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn read_pages_repaired(&self, first: u64, n: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity((n * PAGE) as usize);
        for p in first..first + n {
            self.repair_page(p)?;
            let (i, _) = self.live().into_iter().next().expect("a live copy");
            let page = self.read_checked(i, p * PAGE, 1)?;
            let page = page.ok_or_else(|| damaged(format!("metadata page {p} is damaged")))?;
            out.extend_from_slice(&page.1);
        }
        Ok(out)
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "the pool's metadata copies, at most 4 (meta_copies)"
    )]
    pub fn stats(&self) -> MirrorStats {
        MirrorStats {
            repaired_at_open: self.repaired_at_open.load(Ordering::Relaxed),
            repaired_on_read: self.repaired_on_read.load(Ordering::Relaxed),
            repaired_by_scrub: self.repaired_by_scrub.load(Ordering::Relaxed),
            copies: self.live().len() as u32,
        }
    }

    /// The copies still in use, in order.
    fn live(&self) -> Vec<(usize, Arc<dyn Backend>)> {
        let copies = self.copies.read();
        let live = copies.iter().enumerate();
        live.filter(|(_, c)| !c.dropped.load(Ordering::Relaxed))
            .map(|(i, c)| (i, c.io.clone()))
            .collect()
    }

    /// Copy `i`'s file.
    fn copy(&self, i: usize) -> Arc<dyn Backend> {
        self.copies.read()[i].io.clone()
    }

    fn is_dropped(&self, i: usize) -> bool {
        self.copies.read()[i].dropped.load(Ordering::Relaxed)
    }

    /// Drops copy `i` after a failed write, or when it reads wrong
    /// bytes even after a repair, unless it is the last one (the error is
    /// then the caller's).
    fn drop_copy(&self, i: usize, e: &io::Error) -> bool {
        let left = self.live().len();
        if left < 2 {
            return false;
        }
        self.copies.read()[i].dropped.store(true, Ordering::Relaxed);
        tracing::error!(
            "metadata copy {i}: {e}: going on with the other {} copies",
            left - 1
        );
        true
    }

    /// Runs `f` on every live copy; a copy that fails is dropped while
    /// another remains.
    fn each(&self, f: impl Fn(&dyn Backend) -> io::Result<()>) -> io::Result<()> {
        for (i, c) in self.live() {
            if let Err(e) = f(&*c) {
                if !self.drop_copy(i, &e) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Reads the whole pages covering `off..off + len` from copy `i`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "page arithmetic on buffers held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn read_pages(&self, i: usize, off: u64, len: usize) -> io::Result<(u64, Vec<u8>)> {
        let first = off / PAGE;
        let end = (off + len as u64).div_ceil(PAGE) * PAGE;
        let c = self.copy(i);
        let file_len = c.len()?;
        let mut buf = vec![0u8; (end.min(file_len) - first * PAGE) as usize];
        c.read_at(&mut buf, first * PAGE)?;
        Ok((first, buf))
    }

    /// The first page of `pages` (page `first` on) whose checksum is wrong.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "page arithmetic on buffers held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
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
    #[allow(
        clippy::cast_possible_truncation,
        reason = "page arithmetic on buffers held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
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
                    self.copy(j).write_at(page, p * PAGE)?;
                    fixed += 1;
                }
            }
            if fixed > 0 {
                self.copy(j).sync_data()?;
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
        let good = self.live().into_iter().find_map(|(i, _)| {
            let checked = self.read_checked(i, page * PAGE, 1).ok().flatten();
            checked.map(|(_, b)| (i, b))
        });
        let Some((g, good)) = good else {
            return Err(self.lost(format!("metadata page {page} is damaged in every copy")));
        };
        let others = self.live().into_iter().map(|(j, _)| j).filter(|j| *j != g);
        let others: Vec<usize> = others.collect();
        Ok(others
            .into_iter()
            .map(|j| self.rewrite_from(j, page, &good))
            .sum())
    }

    /// Verifies every page of every copy, repairing bad ones from a good
    /// copy; returns the pages repaired. An error names a page no copy
    /// holds right.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "page arithmetic on buffers held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    pub fn scrub(&self) -> io::Result<u64> {
        let _w = self.writing.lock();
        let pages = self.sums.read().len() as u64;
        let mut fixed = 0;
        for (i, _) in self.live() {
            let step = 256;
            let mut p = 0;
            while p < pages {
                let n = step.min(pages - p);
                if self.is_dropped(i) {
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
    #[allow(
        clippy::cast_possible_truncation,
        reason = "page arithmetic on buffers held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn resum(&self, off: u64, len: usize, buf: Option<&[u8]>) -> io::Result<()> {
        let (i, c) = self.live().into_iter().next().expect("a live copy");
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
        let (i, _) = self.live().into_iter().next().expect("a live copy");
        if let Ok(Some((first, pages))) = self.read_checked(i, off, buf.len()) {
            return copy_out(buf, off, first, &pages);
        }
        // Damaged, unreadable, or being written this instant: look in
        // every copy with writes held off; repair the others from the
        // first that checks out.
        let _w = self.writing.lock();
        let mut failed = None;
        for (i, _) in self.live() {
            match self.read_checked(i, off, buf.len()) {
                Ok(Some((first, pages))) => {
                    let others = self.live().into_iter().map(|(j, _)| j);
                    let others: Vec<usize> = others.filter(|j| *j != i).collect();
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
            self.lost(format!(
                "metadata bytes {off}..{end} are damaged in every copy"
            ))
        }))
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let _w = self.writing.lock();
        let r = (self.each(|c| c.write_at(buf, off)))
            .and_then(|_| self.resum(off, buf.len(), Some(buf)));
        self.spoil_on_err(r)
    }

    fn sync_data(&self) -> io::Result<()> {
        let live = self.live();
        // Every copy's cache flush at once: a commit waits for the slowest
        // one, not for the sum of all.
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
                    return self.spoil_on_err(Err(e));
                }
            }
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let (_, c) = self.live().into_iter().next().expect("a live copy");
        c.len()
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "page counts of a file whose checksums are held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn set_len(&self, len: u64) -> io::Result<()> {
        let _w = self.writing.lock();
        self.spoil_on_err(self.each(|c| c.set_len(len)))?;
        let mut sums = self.sums.write();
        let pages = len.div_ceil(PAGE) as usize;
        sums.truncate(pages);
        sums.resize(pages, crc_page(&[]));
        drop(sums);
        if !len.is_multiple_of(PAGE) {
            // The last page's tail is cut off (or zeros added).
            let r = self.resum(len - len % PAGE, (len % PAGE) as usize, None);
            self.spoil_on_err(r)?;
        }
        Ok(())
    }

    fn host_file(&self) -> Option<&std::fs::File> {
        self.first.host_file()
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod tests {
    use super::*;
    use cairn_devices::{HostStorage, OpenHow, Storage};

    fn copies(dir: &Path, n: usize) -> Vec<Arc<dyn Backend>> {
        (0..n)
            .map(|i| {
                let p = dir.join(format!("c{i}"));
                HostStorage::shared().open(&p, &OpenHow::CREATE).unwrap()
            })
            .collect()
    }

    fn bytes(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    fn file(dir: &Path, i: usize) -> std::fs::File {
        let p = dir.join(format!("c{i}"));
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap()
    }

    use std::os::unix::fs::FileExt;
    use std::path::Path;

    #[test]
    fn a_page_damaged_in_two_of_three_copies_is_read_from_the_third_and_repaired() {
        let d = tempfile::tempdir().unwrap();
        let cs = copies(d.path(), 3);
        let m = Mirror::open(cs, |_| Ok(0)).unwrap();
        let data = bytes(3, 10 * PAGE as usize);
        m.write_at(&data, 0).unwrap();
        assert_eq!(m.stats().copies, 3);
        file(d.path(), 0)
            .write_all_at(&[0xee; 100], 2 * PAGE + 7)
            .unwrap();
        file(d.path(), 1)
            .write_all_at(&[0xdd; 100], 2 * PAGE + 7)
            .unwrap();
        let mut got = vec![0u8; data.len()];
        m.read_at(&mut got, 0).unwrap();
        assert!(got == data, "served from the third copy");
        assert_eq!(m.stats().repaired_on_read, 2);
        for i in 0..3 {
            let mut page = vec![0u8; PAGE as usize];
            file(d.path(), i)
                .read_exact_at(&mut page, 2 * PAGE)
                .unwrap();
            assert!(
                page[..] == data[2 * PAGE as usize..3 * PAGE as usize],
                "copy {i}"
            );
        }
        // The same page damaged in all three is an error, never bytes.
        for i in 0..3 {
            file(d.path(), i)
                .write_all_at(&[i as u8; 10], 5 * PAGE)
                .unwrap();
        }
        let e = m.read_at(&mut got[..PAGE as usize], 5 * PAGE).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    /// Two copies holding `data`, closed: what a clean close records.
    fn closed_with(dir: &Path, data: &[u8]) -> PageSums {
        let m = Mirror::open(copies(dir, 2), |_| Ok(0)).unwrap();
        m.write_at(data, 0).unwrap();
        m.sync_data().unwrap();
        m.closing_sums()
            .expect("a clean close records the checksums")
    }

    #[test]
    fn checksums_of_a_clean_close_are_trusted_only_for_the_same_copies() {
        let d = tempfile::tempdir().unwrap();
        let data = bytes(5, 8 * PAGE as usize + 300);
        let sums = closed_with(d.path(), &data);
        assert_eq!((sums.copies, sums.len), (2, data.len() as u64));
        let m = Mirror::open_known(copies(d.path(), 2), sums.clone()).unwrap();
        let m = m.expect("the same copies: trusted");
        let mut got = vec![0u8; data.len()];
        m.read_at(&mut got, 0).unwrap();
        assert!(got == data);
        assert_eq!(m.stats().repaired_at_open, 0);
        // Another count of copies, another length, or a first or last page
        // that is not what was recorded: compared in full instead.
        let more = Mirror::open_known(copies(d.path(), 3), sums.clone()).unwrap();
        assert!(more.is_none(), "three copies trusted two copies' checksums");
        for (what, off) in [("first", 10), ("last", 8 * PAGE + 5)] {
            let d = tempfile::tempdir().unwrap();
            let sums = closed_with(d.path(), &data);
            file(d.path(), 1).write_all_at(&[0xa5], off).unwrap();
            let m = Mirror::open_known(copies(d.path(), 2), sums).unwrap();
            assert!(m.is_none(), "a changed {what} page trusted");
        }
        let d = tempfile::tempdir().unwrap();
        let sums = closed_with(d.path(), &data);
        file(d.path(), 0).set_len(data.len() as u64 + 1).unwrap();
        assert!(Mirror::open_known(copies(d.path(), 2), sums)
            .unwrap()
            .is_none());
    }

    #[test]
    fn damage_after_a_clean_close_is_repaired_where_read_and_never_served() {
        let d = tempfile::tempdir().unwrap();
        let data = bytes(7, 8 * PAGE as usize);
        let sums = closed_with(d.path(), &data);
        file(d.path(), 0)
            .write_all_at(&[0xee; 50], 3 * PAGE + 1)
            .unwrap();
        let m = Mirror::open_known(copies(d.path(), 2), sums)
            .unwrap()
            .unwrap();
        let mut got = vec![0u8; PAGE as usize];
        m.read_at(&mut got, 3 * PAGE).unwrap();
        assert!(
            got[..] == data[3 * PAGE as usize..4 * PAGE as usize],
            "the other copy's page"
        );
        assert_eq!(m.stats().repaired_on_read, 1);
        assert!(m.closing_sums().is_some(), "a repaired page spoils nothing");
        // Damaged in both: an error, and the next open checks everything.
        for i in 0..2 {
            file(d.path(), i)
                .write_all_at(&[i as u8; 9], 6 * PAGE)
                .unwrap();
        }
        let e = m.read_at(&mut got, 6 * PAGE).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert_eq!(
            m.closing_sums(),
            None,
            "damage in every copy recorded as sound"
        );
    }

    #[test]
    fn a_copy_dropped_or_a_failed_write_leaves_nothing_to_trust() {
        use cairn_devices::backend::{Fault, FaultStorage, Ops};
        let d = tempfile::tempdir().unwrap();
        let st = FaultStorage::per_file(HostStorage::shared(), 3);
        let paths: Vec<_> = (0..2).map(|i| d.path().join(format!("c{i}"))).collect();
        let open = || -> Vec<Arc<dyn Backend>> {
            (paths.iter())
                .map(|p| st.open(p, &OpenHow::CREATE).unwrap())
                .collect()
        };
        let m = Mirror::open(open(), |_| Ok(0)).unwrap();
        m.write_at(&bytes(1, 2 * PAGE as usize), 0).unwrap();
        st.control(&paths[1]).add(Fault::eio(Ops::WRITE));
        m.write_at(&bytes(2, PAGE as usize), 0).unwrap();
        assert_eq!(m.stats().copies, 1, "the failing copy is dropped");
        assert_eq!(
            m.closing_sums(),
            None,
            "a dropped copy's checksums recorded"
        );
        st.control(&paths[1]).clear();
        let m = Mirror::open(open(), |_| Ok(0)).unwrap();
        assert!(m.closing_sums().is_some());
        st.control(&paths[0]).add(Fault::eio(Ops::WRITE));
        st.control(&paths[1]).add(Fault::eio(Ops::WRITE));
        assert!(m.write_at(&bytes(3, PAGE as usize), 0).is_err());
        assert_eq!(
            m.closing_sums(),
            None,
            "a failed write's checksums recorded"
        );
    }

    #[test]
    fn a_copy_added_while_in_use_holds_every_page_and_takes_later_writes() {
        let d = tempfile::tempdir().unwrap();
        let mut cs = copies(d.path(), 3);
        let third = cs.pop().unwrap();
        let m = Mirror::open(cs, |_| Ok(0)).unwrap();
        let data = bytes(9, 6 * PAGE as usize + 100);
        m.write_at(&data, 0).unwrap();
        // A page damaged in the first copy is not what the new copy gets.
        file(d.path(), 0).write_all_at(&[1; 8], PAGE).unwrap();
        m.add_copy(third).unwrap();
        assert_eq!(m.stats().copies, 3);
        m.write_at(&[0x42; 50], 3 * PAGE).unwrap();
        let mut want = data.clone();
        want[3 * PAGE as usize..3 * PAGE as usize + 50].fill(0x42);
        let on_disk = std::fs::read(d.path().join("c2")).unwrap();
        assert!(on_disk == want, "the added copy");
        // Open again with all three: they agree.
        let m2 = Mirror::open(copies(d.path(), 3), |_| Ok(2)).unwrap();
        let mut got = vec![0u8; want.len()];
        m2.read_at(&mut got, 0).unwrap();
        assert!(got == want);
    }

    /// Pages that are holes in every copy are not read at open (their
    /// checksums are a zero page's, and reads of them check out); a page
    /// that is a hole in one copy and data in another is compared, and
    /// repaired from the copy picked.
    #[test]
    fn holes_in_every_copy_are_skipped_and_a_hole_in_one_is_repaired() {
        let d = tempfile::tempdir().unwrap();
        let data = bytes(7, PAGE as usize);
        for i in 0..2 {
            let f = std::fs::File::create(d.path().join(format!("c{i}"))).unwrap();
            f.set_len(64 * PAGE).unwrap();
            f.write_all_at(&data, 0).unwrap();
            f.write_all_at(&data, 40 * PAGE).unwrap();
        }
        file(d.path(), 1).write_all_at(&[9; 10], 20 * PAGE).unwrap();
        let cs = copies(d.path(), 2);
        let ranges = cs[0]
            .data_ranges()
            .unwrap()
            .expect("the host says where data lies");
        assert!(
            ranges
                .iter()
                .all(|&(a, b)| b <= 10 * PAGE || a >= 40 * PAGE),
            "pages 10..40 of copy 0 are a hole: {ranges:?}"
        );
        let m = Mirror::open(cs, |_| Ok(0)).unwrap();
        assert_eq!(m.stats().repaired_at_open, 1, "page 20 of copy 1");
        let mut got = vec![0u8; 64 * PAGE as usize];
        m.read_at(&mut got, 0).unwrap();
        let mut want = vec![0u8; 64 * PAGE as usize];
        want[..PAGE as usize].copy_from_slice(&data);
        want[40 * PAGE as usize..41 * PAGE as usize].copy_from_slice(&data);
        assert!(got == want, "holes read as zeros, data as written");
        assert_eq!(m.stats().repaired_on_read, 0, "every page's checksum held");
        assert!(
            std::fs::read(d.path().join("c1")).unwrap() == want,
            "copy 1 repaired"
        );
    }

    #[test]
    fn where_a_hole_ends() {
        let data = [(0, 10), (20, 30)];
        let cases = [
            (0, 0),
            (9, 9),
            (10, 20),
            (15, 20),
            (20, 20),
            (30, u64::MAX),
            (99, u64::MAX),
        ];
        for (at, want) in cases {
            assert_eq!(hole_until(Some(&data), at), want, "at {at}");
        }
        assert_eq!(hole_until(None, 15), 15, "nothing known: data");
        assert_eq!(hole_until(Some(&[]), 15), u64::MAX, "no data at all");
    }

    #[test]
    fn open_repairs_every_copy_from_the_one_picked() {
        let d = tempfile::tempdir().unwrap();
        let data = bytes(5, 4 * PAGE as usize);
        for i in 0..3 {
            let mut b = data.clone();
            if i != 1 {
                b[i * 100] ^= 0xff;
            }
            std::fs::write(d.path().join(format!("c{i}")), &b).unwrap();
        }
        let m = Mirror::open(copies(d.path(), 3), |_| Ok(1)).unwrap();
        assert_eq!(m.stats().repaired_at_open, 2);
        for i in 0..3 {
            assert!(
                std::fs::read(d.path().join(format!("c{i}"))).unwrap() == data,
                "copy {i}"
            );
        }
    }
}
