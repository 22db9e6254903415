//! Read-ahead for the `s3` tier: sequential reads of a slot object (one
//! segment, 4 MiB by default) are served from windows of up to `WINDOW`
//! bytes, each one ranged GET, instead of one GET per chunk or per 1 MiB
//! read (a cold sequential read of demoted data made ~7,300 to 10,800 GETs
//! per GiB and ran at 35 to 50 MB/s from Garage). A read opens a window
//! when it is large (`LARGE`: the chunk store reads that much only for a
//! sequential stream) or continues a run: it starts at most `SLACK` after
//! (or just before) where an earlier read or window of the same object
//! ended. The kernel reads a file ahead in parallel requests about 1 MiB
//! apart, so an object may have a few runs at once (`RUNS`). Other reads
//! get exactly their bytes, so random 4 KiB reads still cost one GET each.
//! A window being fetched is shared: a read inside it waits for it rather
//! than asking again. Writes and deletes of an object drop its windows,
//! and a window fetched across such a change is not kept.

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use std::io;

/// The bytes a window asks for (fewer at the object's end).
const WINDOW: u64 = 8 << 20;
/// A read at least this large opens a window by itself.
const LARGE: u64 = 256 << 10;
/// How far after (or `BEHIND` before) where a run ended a read may start
/// and still continue it.
const SLACK: u64 = 256 << 10;
const BEHIND: u64 = 64 << 10;
/// Windows kept (fetched or being fetched), least recently used dropped.
const KEEP: usize = 8;
/// Runs remembered per object, and in all.
const RUNS: usize = 4;
const ENDS: usize = 64;

fn continues(end: u64, off: u64) -> bool {
    off + BEHIND >= end && off <= end + SLACK
}

#[derive(Debug)]
struct Window {
    obj: u64,
    start: u64,
    /// Bytes asked for; `data` may be shorter at the object's end.
    want: u64,
    /// None while the GET runs.
    data: Option<Bytes>,
    /// Set when the object changed while the GET ran: not kept after.
    stale: bool,
    used: u64,
}

impl Window {
    fn covers(&self, start: u64, end: u64) -> bool {
        self.start <= start && end <= self.start + self.want
    }
}

#[derive(Debug, Default)]
struct State {
    windows: Vec<Window>,
    /// (object, where a run of reads ended) of recent runs, newest last.
    ends: Vec<(u64, u64)>,
    tick: u64,
}

#[derive(Debug, Default)]
pub struct ReadAhead {
    st: Mutex<State>,
    cv: Condvar,
}

/// What `ReadAhead::read` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Served {
    /// `buf` holds the bytes.
    Yes,
    /// Not a sequential read: the caller reads the bytes itself.
    No,
}

impl ReadAhead {
    /// Serves `buf` at `off` of object `obj` from a window, fetching one
    /// with `fetch(start, len)` (a ranged GET that may return fewer bytes
    /// at the object's end) when the read continues a sequential run.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "an offset within a readahead window held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    pub fn read(
        &self,
        obj: u64,
        off: u64,
        buf: &mut [u8],
        fetch: impl FnOnce(u64, u64) -> io::Result<Bytes>,
    ) -> io::Result<Served> {
        let end = off + buf.len() as u64;
        let mut st = self.st.lock();
        st.tick += 1;
        let tick = st.tick;
        while let Some(w) = (st.windows.iter_mut()).find(|w| w.obj == obj && w.covers(off, end)) {
            let Some(data) = &w.data else {
                self.cv.wait(&mut st);
                continue;
            };
            let from = (off - w.start) as usize;
            let Some(src) = data.get(from..from + buf.len()) else {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            };
            buf.copy_from_slice(src);
            w.used = tick;
            st.note_end(obj, off, end);
            return Ok(Served::Yes);
        }
        if (buf.len() as u64) < LARGE && !st.in_a_run(obj, off) {
            st.note_end(obj, off, end);
            return Ok(Served::No);
        }
        let want = WINDOW.max(buf.len() as u64);
        st.open(obj, off, want, tick);
        st.note_end(obj, off, end);
        drop(st);
        let data = self.fill(obj, off, want, fetch)?;
        let src = data
            .get(..buf.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(Served::Yes)
    }

    /// Opens a window of `obj` at `off` for `prefetch`, unless a window
    /// covers `off` already (false: nothing to fetch). Reads inside it
    /// wait for it from now on, so the caller must call `prefetch`.
    pub fn claim(&self, obj: u64, off: u64) -> bool {
        let mut st = self.st.lock();
        if (st.windows.iter()).any(|w| w.obj == obj && w.covers(off, off + 1)) {
            return false;
        }
        st.tick += 1;
        let tick = st.tick;
        st.open(obj, off, WINDOW, tick);
        true
    }

    /// Fetches the window `claim` opened (read-ahead ahead of any read).
    pub fn prefetch(&self, obj: u64, off: u64, fetch: impl FnOnce(u64, u64) -> io::Result<Bytes>) {
        let _ = self.fill(obj, off, WINDOW, fetch);
    }

    /// Fetches the open window (obj, start, want) and keeps it, unless its
    /// object changed meanwhile; wakes the reads waiting for it.
    fn fill(
        &self,
        obj: u64,
        start: u64,
        want: u64,
        fetch: impl FnOnce(u64, u64) -> io::Result<Bytes>,
    ) -> io::Result<Bytes> {
        let got = fetch(start, want);
        let mut st = self.st.lock();
        let i = (st.windows.iter())
            .position(|w| w.obj == obj && w.start == start && w.data.is_none() && w.want == want);
        let w = i.map(|i| st.windows.swap_remove(i));
        self.cv.notify_all();
        let data = got?;
        if let Some(w) = w.filter(|w| !w.stale) {
            st.windows.push(Window {
                data: Some(data.clone()),
                ..w
            });
        }
        Ok(data)
    }

    /// Drops the windows of `obj` (its object is rewritten or deleted).
    pub fn forget(&self, obj: u64) {
        let mut st = self.st.lock();
        for w in st.windows.iter_mut().filter(|w| w.obj == obj) {
            w.stale = true;
        }
        st.windows.retain(|w| w.obj != obj || w.data.is_none());
        st.ends.retain(|e| e.0 != obj);
    }
}

impl State {
    /// Adds a window being fetched (reads inside it wait for it).
    fn open(&mut self, obj: u64, start: u64, want: u64, tick: u64) {
        self.windows.push(Window {
            obj,
            start,
            want,
            data: None,
            stale: false,
            used: tick,
        });
        self.trim();
    }

    /// Notes that a read of `obj` from `off` ended at `end`: it continues
    /// the run that ended near `off`, or starts one.
    fn note_end(&mut self, obj: u64, off: u64, end: u64) {
        self.ends.retain(|&(o, e)| o != obj || !continues(e, off));
        self.ends.push((obj, end));
        // One entry was added: at most one bound is passed, by one.
        if self.ends.iter().filter(|e| e.0 == obj).count() > RUNS {
            let oldest = self
                .ends
                .iter()
                .position(|e| e.0 == obj)
                .expect("more than RUNS entries of obj were just counted");
            self.ends.remove(oldest);
        } else if self.ends.len() > ENDS {
            self.ends.remove(0);
        }
    }

    /// True if a read at `off` of `obj` continues a run or a window.
    fn in_a_run(&self, obj: u64, off: u64) -> bool {
        let window_ends = (self.windows.iter())
            .filter(|w| w.obj == obj)
            .map(|w| w.start + w.want);
        let run_ends = (self.ends.iter()).filter(|e| e.0 == obj).map(|e| e.1);
        window_ends.chain(run_ends).any(|e| continues(e, off))
    }

    /// Drops the least recently used fetched windows past `KEEP`.
    fn trim(&mut self) {
        while self.windows.len() > KEEP {
            let Some(i) = (self.windows.iter().enumerate())
                .filter(|(_, w)| w.data.is_some())
                .min_by_key(|(_, w)| w.used)
                .map(|(i, _)| i)
            else {
                return;
            };
            self.windows.swap_remove(i);
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn object(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// Reads `len` bytes at `off` through `ra` (falling back to an exact
    /// fetch as the backend does), counting fetches.
    fn read(ra: &ReadAhead, obj: &[u8], off: u64, len: usize, gets: &RefCell<Vec<u64>>) -> Vec<u8> {
        read_obj(ra, 1, obj, off, len, gets)
    }

    /// `read` of object number `id`.
    fn read_obj(
        ra: &ReadAhead,
        id: u64,
        obj: &[u8],
        off: u64,
        len: usize,
        gets: &RefCell<Vec<u64>>,
    ) -> Vec<u8> {
        let fetch = |s: u64, n: u64| {
            gets.borrow_mut().push(n);
            let e = (s + n).min(obj.len() as u64);
            Ok(Bytes::copy_from_slice(&obj[s as usize..e as usize]))
        };
        let mut buf = vec![0u8; len];
        if ra.read(id, off, &mut buf, fetch).unwrap() == Served::No {
            gets.borrow_mut().push(len as u64);
            buf.copy_from_slice(&obj[off as usize..off as usize + len]);
        }
        buf
    }

    #[test]
    fn a_sequential_read_takes_one_get_per_window_and_right_bytes() {
        let obj = object(64 << 20);
        let (ra, gets) = (ReadAhead::default(), RefCell::new(vec![]));
        let step = 128 << 10;
        for off in (0..obj.len()).step_by(step) {
            let got = read(&ra, &obj, off as u64, step, &gets);
            assert!(got == obj[off..off + step], "bytes at {off}");
        }
        let gets = gets.into_inner();
        // 512 reads of 128 KiB: the first exact, then 8 MiB windows.
        assert_eq!(gets.len(), 9, "{gets:?}");
        assert_eq!(gets[0], step as u64);
        assert!(gets[1..].iter().all(|&n| n == WINDOW), "{gets:?}");
    }

    #[test]
    fn runs_started_at_once_share_windows_and_large_reads_open_one() {
        let obj = object(16 << 20);
        let (ra, gets) = (ReadAhead::default(), RefCell::new(vec![]));
        let step = 64 << 10;
        // Four runs 1 MiB apart, interleaved as parallel requests come.
        for i in 0..16u64 {
            for run in 0..4u64 {
                let off = run * (1 << 20) + i * step;
                let got = read(&ra, &obj, off, step as usize, &gets);
                assert!(got == obj[off as usize..(off + step) as usize]);
            }
        }
        let n = gets.borrow().len();
        assert!(n <= 6, "{:?}", gets.borrow());
        // A 1 MiB read (the chunk store's own read-ahead) opens a window.
        let off = 9 << 20;
        assert!(read(&ra, &obj, off, 1 << 20, &gets) == obj[off as usize..][..1 << 20]);
        assert_eq!(gets.borrow()[n], WINDOW);
        assert!(read(&ra, &obj, off + (1 << 20), 4096, &gets)[..] == obj[(10 << 20)..][..4096]);
        assert_eq!(gets.borrow().len(), n + 1, "served from the window");
    }

    #[test]
    fn random_reads_cost_one_exact_get_each() {
        let obj = object(64 << 20);
        let (ra, gets) = (ReadAhead::default(), RefCell::new(vec![]));
        let mut x = 12345u64;
        for _ in 0..200 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (x >> 33) % (60 << 20) / 4096 * 4096;
            assert!(read(&ra, &obj, off, 4096, &gets) == obj[off as usize..off as usize + 4096]);
        }
        let gets = gets.into_inner();
        let windows = gets.iter().filter(|&&n| n > 4096).count();
        assert!(
            windows <= 8,
            "{windows} of 200 random reads opened a window"
        );
    }

    #[test]
    fn the_objects_end_and_a_rewrite_are_respected() {
        let obj = object(400 << 10);
        let (ra, gets) = (ReadAhead::default(), RefCell::new(vec![]));
        // Two sequential reads: the second fetches a window past the end.
        read(&ra, &obj, 0, 4096, &gets);
        assert!(read(&ra, &obj, 4096, 4096, &gets) == obj[4096..8192]);
        // Inside the window, up to the object's end: served from it.
        let n = gets.borrow().len();
        let tail = obj.len() - 8192;
        assert!(read(&ra, &obj, 8192, tail, &gets) == obj[8192..]);
        assert_eq!(gets.borrow().len(), n);
        // Past the end inside the window: an error, never made-up bytes.
        let mut buf = vec![0u8; 8192];
        let r = ra.read(1, obj.len() as u64 - 4096, &mut buf, |_, _| unreachable!());
        assert!(r.is_err());
        // The object is rewritten: its windows go, new bytes are read.
        let new = vec![9u8; 400 << 10];
        ra.forget(1);
        assert!(read(&ra, &new, 8192, 4096, &gets) == new[8192..12288]);
    }

    #[test]
    fn a_prefetched_window_serves_reads_and_a_failed_one_lets_them_fetch() {
        let obj = object(4 << 20);
        let (ra, gets) = (ReadAhead::default(), RefCell::new(vec![]));
        assert!(ra.claim(1, 0));
        assert!(!ra.claim(1, 1 << 20), "covered by the claimed window");
        // A read inside the claimed window waits for it (here on another
        // thread) and then is served from it, with no fetch of its own.
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut buf = vec![0u8; 4096];
                let r = ra.read(1, 1 << 20, &mut buf, |_, _| unreachable!("waits"));
                (r.unwrap(), buf)
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            ra.prefetch(1, 0, |s, n| {
                gets.borrow_mut().push(n);
                Ok(Bytes::copy_from_slice(&obj[s as usize..]))
            });
            let (served, buf) = reader.join().unwrap();
            assert_eq!(served, Served::Yes);
            assert!(buf == obj[1 << 20..][..4096]);
        });
        assert_eq!(gets.borrow().len(), 1);
        // A window whose fetch failed is gone: a read fetches for itself.
        assert!(ra.claim(2, 0));
        ra.prefetch(2, 0, |_, _| Err(io::Error::other("store down")));
        assert!(read_obj(&ra, 2, &obj, 8192, 4096, &gets) == obj[8192..][..4096]);
        assert_eq!(gets.borrow().len(), 2, "one exact fetch");
        // A rewrite while the prefetch runs: its bytes are not kept.
        assert!(ra.claim(3, 0));
        ra.prefetch(3, 0, |s, _| {
            ra.forget(3);
            Ok(Bytes::copy_from_slice(&obj[s as usize..]))
        });
        assert!(ra.claim(3, 0), "no window kept");
    }
}
