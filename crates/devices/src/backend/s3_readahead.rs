//! Read-ahead for the `s3` tier: sequential reads of a slot object are
//! served from windows fetched by one ranged GET each, growing from
//! `FIRST` to `MAX` bytes, instead of one GET per chunk read (a cold
//! sequential read of demoted data made ~10,800 GETs per GiB and ran at
//! 35 MB/s from Garage). A read is sequential when it starts where an
//! earlier read or window of the same object ended (within `SLACK`, since
//! the kernel's read-ahead sends neighbouring requests at once); a read
//! that is not gets exactly its bytes, so random 4 KiB reads still cost
//! one GET each. A window being fetched is shared: a read inside it waits
//! for it rather than asking again. Writes and deletes of an object drop
//! its windows, and a window fetched across such a change is not kept.

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use std::io;

/// The first window of a sequential run, and the largest.
const FIRST: u64 = 512 << 10;
const MAX: u64 = 8 << 20;
/// How far from where the last read ended a read may start and still
/// count as sequential.
const SLACK: u64 = 256 << 10;
/// Windows kept (fetched or being fetched), least recently used dropped.
const KEEP: usize = 12;
/// Read ends remembered (per object) to notice a sequential run start.
const ENDS: usize = 64;

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
    /// (object, end of its last read) of recent reads, newest last.
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
            st.note_end(obj, end);
            return Ok(Served::Yes);
        }
        let Some(want) = st.next_window(obj, off) else {
            st.note_end(obj, end);
            return Ok(Served::No);
        };
        let want = want.max(buf.len() as u64);
        st.windows.push(Window {
            obj,
            start: off,
            want,
            data: None,
            stale: false,
            used: tick,
        });
        st.note_end(obj, end);
        st.trim();
        drop(st);
        let got = fetch(off, want);
        let mut st = self.st.lock();
        let i = (st.windows.iter())
            .position(|w| w.obj == obj && w.start == off && w.data.is_none() && w.want == want);
        let w = i.map(|i| st.windows.swap_remove(i));
        self.cv.notify_all();
        let data = got?;
        if let Some(w) = w.filter(|w| !w.stale) {
            st.windows.push(Window {
                data: Some(data.clone()),
                ..w
            });
        }
        drop(st);
        let src = data
            .get(..buf.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(Served::Yes)
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
    fn note_end(&mut self, obj: u64, end: u64) {
        self.ends.retain(|e| e.0 != obj);
        self.ends.push((obj, end));
        if self.ends.len() > ENDS {
            self.ends.remove(0);
        }
    }

    /// The size of the window to fetch for a read at `off` of `obj`, if
    /// it continues a run: twice the window it follows, else `FIRST`.
    fn next_window(&self, obj: u64, off: u64) -> Option<u64> {
        let near = |e: u64| e <= off + SLACK && off <= e + SLACK;
        let after = (self.windows.iter())
            .filter(|w| w.obj == obj && near(w.start + w.want))
            .map(|w| w.want)
            .max();
        match after {
            Some(w) => Some((2 * w).min(MAX)),
            None => (self.ends.iter().any(|&(o, e)| o == obj && near(e))).then_some(FIRST),
        }
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
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn object(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// Reads `len` bytes at `off` through `ra` (falling back to an exact
    /// fetch as the backend does), counting fetches.
    fn read(ra: &ReadAhead, obj: &[u8], off: u64, len: usize, gets: &RefCell<Vec<u64>>) -> Vec<u8> {
        let fetch = |s: u64, n: u64| {
            gets.borrow_mut().push(n);
            let e = (s + n).min(obj.len() as u64);
            Ok(Bytes::copy_from_slice(&obj[s as usize..e as usize]))
        };
        let mut buf = vec![0u8; len];
        if ra.read(1, off, &mut buf, fetch).unwrap() == Served::No {
            gets.borrow_mut().push(len as u64);
            buf.copy_from_slice(&obj[off as usize..off as usize + len]);
        }
        buf
    }

    #[test]
    fn a_sequential_read_takes_few_growing_gets_and_right_bytes() {
        let obj = object(64 << 20);
        let (ra, gets) = (ReadAhead::default(), RefCell::new(vec![]));
        let step = 128 << 10;
        for off in (0..obj.len()).step_by(step) {
            let got = read(&ra, &obj, off as u64, step, &gets);
            assert!(got == obj[off..off + step], "bytes at {off}");
        }
        let gets = gets.into_inner();
        // 512 reads: the first exact, then 512K, 1M, 2M, 4M and 8M windows.
        assert!(gets.len() <= 14, "{} GETs: {gets:?}", gets.len());
        assert_eq!(&gets[..4], &[step as u64, FIRST, 2 * FIRST, 4 * FIRST]);
        assert!(gets.iter().all(|&n| n <= MAX));
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
        assert!(gets.len() >= 195, "{}", gets.len());
        assert!(gets.iter().filter(|&&n| n > 4096).count() <= 5);
    }

    #[test]
    fn the_objects_end_and_a_rewrite_are_respected() {
        let obj = object(400 << 10);
        let (ra, gets) = (ReadAhead::default(), RefCell::new(vec![]));
        // Two sequential reads: the second fetches a window (512 KiB) past
        // the end.
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
}
