//! Fault injection: `FaultBackend` wraps a backend and consults its
//! `FaultControl`, which a test may change at any time (while the pool is
//! mounted): fail reads, writes, syncs, length changes or hole punches
//! with an errno (EIO, ENOSPC...), hang them for a while, or flip bits in
//! what reads return; always, within a byte range, every Nth time, the
//! first N times, or with a seeded probability. Counts what it injected.
//!
//! A buffered call is decided before it is passed on (a failed write
//! writes nothing). A direct (O_DIRECT) call is decided after the inner
//! backend did it, since it may decline and be retried buffered, which
//! must count once: a failed direct write may so have written its bytes,
//! as a real EIO may have. Decisions of concurrent calls draw from one
//! generator in the order the calls come, so a seed replays exactly only
//! when the calls come in the same order.

use super::rng::SplitMix64;
use super::{path_key, Backend, OpenHow, Storage};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Kinds of calls a fault applies to (combine with `|`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ops(u8);

impl Ops {
    pub const READ: Ops = Ops(1);
    pub const WRITE: Ops = Ops(2);
    pub const SYNC: Ops = Ops(4);
    pub const SET_LEN: Ops = Ops(8);
    pub const PUNCH: Ops = Ops(16);
    pub const ALL: Ops = Ops(31);

    pub fn contains(self, o: Ops) -> bool {
        self.0 & o.0 == o.0
    }
}

impl std::ops::BitOr for Ops {
    type Output = Ops;
    fn bitor(self, o: Ops) -> Ops {
        Ops(self.0 | o.0)
    }
}

/// Which of the matching calls a fault hits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum When {
    Always,
    /// The Nth, 2Nth... matching call.
    EveryNth(u64),
    /// The first N matching calls.
    Times(u64),
    /// Each matching call with this probability (the control's seed).
    Probability(f64),
}

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Effect {
    /// The call fails with this errno (nothing done, see the module note).
    Fail(i32),
    /// The call waits this long, then proceeds.
    Hang(Duration),
    /// A read returns its bytes within the fault's range XORed with this.
    Corrupt(u8),
}

/// One fault: which calls, where, when, and what happens.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub ops: Ops,
    /// Calls touching these bytes (None: anywhere; calls without a range,
    /// syncs, match only faults without one).
    pub range: Option<Range<u64>>,
    pub when: When,
    pub effect: Effect,
    /// Only writes and length changes that grow the file (a full host
    /// refuses new blocks, not overwrites of allocated ones).
    pub growth_only: bool,
}

impl Fault {
    /// `ops` fail with EIO.
    pub fn eio(ops: Ops) -> Fault {
        Fault::fail(ops, libc::EIO)
    }

    /// `ops` fail with `errno`.
    pub fn fail(ops: Ops, errno: i32) -> Fault {
        Fault {
            ops,
            range: None,
            when: When::Always,
            effect: Effect::Fail(errno),
            growth_only: false,
        }
    }

    /// Every write fails with ENOSPC (a thin or copy-on-write device
    /// that ran out of room).
    pub fn no_space() -> Fault {
        Fault::fail(Ops::WRITE | Ops::SET_LEN, libc::ENOSPC)
    }

    /// Writes and length changes that grow the file fail with ENOSPC (a
    /// full host filesystem: overwrites still work).
    pub fn full() -> Fault {
        Fault {
            growth_only: true,
            ..Fault::no_space()
        }
    }

    /// `ops` wait `d` before they proceed.
    pub fn hang(ops: Ops, d: Duration) -> Fault {
        Fault {
            effect: Effect::Hang(d),
            ..Fault::eio(ops)
        }
    }

    /// Reads return their bytes with every bit flipped.
    pub fn corrupt_reads() -> Fault {
        Fault {
            effect: Effect::Corrupt(0xff),
            ..Fault::eio(Ops::READ)
        }
    }

    /// Only for calls touching `r`.
    pub fn in_range(mut self, r: Range<u64>) -> Fault {
        self.range = Some(r);
        self
    }

    pub fn when(mut self, w: When) -> Fault {
        self.when = w;
        self
    }

    fn matches(&self, op: Ops, span: Option<Range<u64>>, grows: &dyn Fn() -> bool) -> bool {
        if !self.ops.contains(op) {
            return false;
        }
        let here = match (&self.range, span) {
            (None, _) => true,
            (Some(r), Some(s)) => r.start < s.end && s.start < r.end,
            (Some(_), None) => false,
        };
        here && (!self.growth_only || grows())
    }
}

/// Identifies a fault added to a control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FaultId(u64);

struct Rule {
    id: FaultId,
    fault: Fault,
    seen: u64,
    hits: u64,
}

struct State {
    rules: Vec<Rule>,
    rng: SplitMix64,
    next_id: u64,
}

/// What to do with one call.
#[derive(Default)]
struct Decision {
    hang: Duration,
    fail: Option<i32>,
    /// (absolute byte range, xor)
    corrupt: Vec<(Range<u64>, u8)>,
}

/// The faults of one or more backends, changed at any time.
pub struct FaultControl {
    /// Any rule present (the fast path reads only this).
    active: AtomicBool,
    state: Mutex<State>,
    injected: AtomicU64,
}

impl std::fmt::Debug for FaultControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultControl({} injected)", self.injected())
    }
}

impl FaultControl {
    pub fn new(seed: u64) -> Arc<FaultControl> {
        Arc::new(FaultControl {
            active: AtomicBool::new(false),
            state: Mutex::new(State {
                rules: Vec::new(),
                rng: SplitMix64::new(seed),
                next_id: 0,
            }),
            injected: AtomicU64::new(0),
        })
    }

    pub fn add(&self, fault: Fault) -> FaultId {
        let mut s = self.state.lock();
        let id = FaultId(s.next_id);
        s.next_id += 1;
        s.rules.push(Rule {
            id,
            fault,
            seen: 0,
            hits: 0,
        });
        self.active.store(true, Ordering::SeqCst);
        id
    }

    pub fn remove(&self, id: FaultId) {
        let mut s = self.state.lock();
        s.rules.retain(|r| r.id != id);
        self.active.store(!s.rules.is_empty(), Ordering::SeqCst);
    }

    /// Removes every fault: calls pass untouched again.
    pub fn clear(&self) {
        let mut s = self.state.lock();
        s.rules.clear();
        self.active.store(false, Ordering::SeqCst);
    }

    /// Faults injected so far (every effect counts, hangs too).
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Times the fault `id` was injected (0 once removed).
    pub fn hits(&self, id: FaultId) -> u64 {
        let s = self.state.lock();
        s.rules.iter().find(|r| r.id == id).map_or(0, |r| r.hits)
    }

    /// `grows` tells whether the call grows the file (asked only of
    /// growth-only faults).
    fn decide(&self, op: Ops, span: Option<Range<u64>>, grows: &dyn Fn() -> bool) -> Decision {
        let mut d = Decision::default();
        if !self.active.load(Ordering::Relaxed) {
            return d;
        }
        let mut s = self.state.lock();
        let State { rules, rng, .. } = &mut *s;
        for r in rules.iter_mut() {
            if !r.fault.matches(op, span.clone(), grows) {
                continue;
            }
            r.seen += 1;
            let hit = match r.fault.when {
                When::Always => true,
                When::EveryNth(n) => n > 0 && r.seen.is_multiple_of(n),
                When::Times(n) => r.seen <= n,
                When::Probability(p) => rng.chance(p),
            };
            if !hit {
                continue;
            }
            r.hits += 1;
            self.injected.fetch_add(1, Ordering::Relaxed);
            match r.fault.effect {
                Effect::Fail(e) => d.fail = d.fail.or(Some(e)),
                Effect::Hang(t) => d.hang += t,
                Effect::Corrupt(x) => {
                    let span = span.clone().unwrap_or(0..0);
                    let r = r.fault.range.clone().unwrap_or(span.clone());
                    d.corrupt
                        .push((r.start.max(span.start)..r.end.min(span.end), x));
                }
            }
        }
        d
    }

    /// Decides a call, waits out its hang, and returns its failure.
    fn enter(&self, op: Ops, span: Option<Range<u64>>) -> io::Result<Decision> {
        self.enter_growing(op, span, &|| false)
    }

    fn enter_growing(
        &self,
        op: Ops,
        span: Option<Range<u64>>,
        grows: &dyn Fn() -> bool,
    ) -> io::Result<Decision> {
        let d = self.decide(op, span, grows);
        if !d.hang.is_zero() {
            std::thread::sleep(d.hang);
        }
        match d.fail {
            Some(e) => Err(io::Error::from_raw_os_error(e)),
            None => Ok(d),
        }
    }
}

/// Applies the corruption of `d` to `bufs`, which hold bytes from `off`.
#[allow(
    clippy::cast_possible_truncation,
    reason = "test backend: offsets within the buffer read; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
fn corrupt(d: &Decision, bufs: &mut [&mut [u8]], off: u64) {
    for (r, x) in &d.corrupt {
        let mut at = off;
        for b in bufs.iter_mut() {
            let end = at + b.len() as u64;
            let (s, e) = (r.start.max(at), r.end.min(end));
            if s < e {
                b[(s - at) as usize..(e - at) as usize]
                    .iter_mut()
                    .for_each(|v| *v ^= x);
            }
            at = end;
        }
    }
}

fn span(off: u64, len: usize) -> Option<Range<u64>> {
    Some(off..off + len as u64)
}

/// A backend whose calls go through a `FaultControl` first.
#[derive(Debug)]
pub struct FaultBackend {
    inner: Arc<dyn Backend>,
    control: Arc<FaultControl>,
}

impl FaultBackend {
    pub fn new(inner: Arc<dyn Backend>, control: Arc<FaultControl>) -> Self {
        FaultBackend { inner, control }
    }

    pub fn control(&self) -> &Arc<FaultControl> {
        &self.control
    }
}

impl Backend for FaultBackend {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let d = self.control.enter(Ops::READ, span(off, buf.len()))?;
        self.inner.read_at(buf, off)?;
        corrupt(&d, &mut [buf], off);
        Ok(())
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], off: u64) -> io::Result<()> {
        let len = bufs.iter().map(|b| b.len()).sum();
        let d = self.control.enter(Ops::READ, span(off, len))?;
        self.inner.read_vectored_at(bufs, off)?;
        corrupt(&d, bufs, off);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let end = off + buf.len() as u64;
        let grows = || self.inner.len().is_ok_and(|l| end > l);
        (self.control).enter_growing(Ops::WRITE, span(off, buf.len()), &grows)?;
        self.inner.write_at(buf, off)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.control.enter(Ops::SYNC, None)?;
        self.inner.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let grows = || self.inner.len().is_ok_and(|l| len > l);
        (self.control).enter_growing(Ops::SET_LEN, Some(len..len + 1), &grows)?;
        self.inner.set_len(len)
    }

    fn punch_hole(&self, off: u64, len: u64) -> io::Result<()> {
        self.control.enter(Ops::PUNCH, Some(off..off + len))?;
        self.inner.punch_hole(off, len)
    }

    fn read_direct_at(&self, buf: &mut [u8], off: u64, need: usize) -> io::Result<bool> {
        if !self.inner.read_direct_at(buf, off, need)? {
            return Ok(false);
        }
        let d = self.control.enter(Ops::READ, span(off, buf.len()))?;
        corrupt(&d, &mut [buf], off);
        Ok(true)
    }

    fn write_direct_at(&self, buf: &[u8], off: u64) -> io::Result<bool> {
        let end = off + buf.len() as u64;
        let grew = self.inner.len().is_ok_and(|l| end > l);
        if !self.inner.write_direct_at(buf, off)? {
            return Ok(false);
        }
        (self.control).enter_growing(Ops::WRITE, span(off, buf.len()), &|| grew)?;
        Ok(true)
    }

    fn start_writeback(&self, off: u64, len: u64) {
        self.inner.start_writeback(off, len)
    }

    fn will_need(&self, off: u64, len: u64) {
        self.inner.will_need(off, len)
    }

    fn drop_cached(&self, off: u64, len: u64) {
        self.inner.drop_cached(off, len)
    }

    fn host_file(&self) -> Option<&File> {
        self.inner.host_file()
    }

    fn object_tier(&self) -> Option<&dyn super::ObjectTier> {
        self.inner.object_tier()
    }
}

/// Opens files through `inner` wrapped in fault backends: with one shared
/// control, or one control per file (made on first use, seeded from the
/// storage's seed and the file's name).
#[derive(Debug)]
pub struct FaultStorage {
    inner: Arc<dyn Storage>,
    shared: Option<Arc<FaultControl>>,
    per_file: Mutex<HashMap<PathBuf, Arc<FaultControl>>>,
    seed: u64,
}

impl FaultStorage {
    /// One control per file.
    pub fn per_file(inner: Arc<dyn Storage>, seed: u64) -> Self {
        FaultStorage {
            inner,
            shared: None,
            per_file: Mutex::default(),
            seed,
        }
    }

    /// One control for every file.
    pub fn shared(inner: Arc<dyn Storage>, control: Arc<FaultControl>) -> Self {
        FaultStorage {
            inner,
            shared: Some(control),
            per_file: Mutex::default(),
            seed: 0,
        }
    }

    /// The control of the file at `path` (however spelled), made if the
    /// file was not opened yet; the shared one if there is one.
    pub fn control(&self, path: &Path) -> Arc<FaultControl> {
        if let Some(c) = &self.shared {
            return c.clone();
        }
        let key = path_key(path);
        let seed = self.seed ^ crc32c::crc32c(key.as_os_str().as_encoded_bytes()) as u64;
        self.per_file
            .lock()
            .entry(key)
            .or_insert_with(|| FaultControl::new(seed))
            .clone()
    }
}

impl Storage for FaultStorage {
    fn open(&self, path: &Path, how: &OpenHow) -> io::Result<Arc<dyn Backend>> {
        let inner = self.inner.open(path, how)?;
        Ok(Arc::new(FaultBackend::new(inner, self.control(path))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::HostStorage;

    fn setup() -> (tempfile::TempDir, FaultStorage, Arc<dyn Backend>) {
        let d = tempfile::tempdir().unwrap();
        let st = FaultStorage::per_file(Arc::new(HostStorage), 1);
        let f = st.open(&d.path().join("f"), &OpenHow::CREATE).unwrap();
        f.write_at(&[0u8; 8192], 0).unwrap();
        (d, st, f)
    }

    #[test]
    fn errors_in_range_every_nth_and_cleared() {
        let (d, st, f) = setup();
        let c = st.control(&d.path().join("f"));
        let id = c.add(Fault::eio(Ops::READ).in_range(4096..4097));
        let mut b = [0u8; 512];
        f.read_at(&mut b, 0).unwrap();
        let e = f.read_at(&mut b, 3700).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert_eq!(c.hits(id), 1);
        c.clear();
        f.read_at(&mut b, 3700).unwrap();
        c.add(Fault::no_space().when(When::EveryNth(3)));
        let r: Vec<bool> = (0..6).map(|_| f.write_at(b"x", 0).is_ok()).collect();
        assert_eq!(r, [true, true, false, true, true, false]);
        c.add(Fault::eio(Ops::SYNC).when(When::Times(1)));
        assert!(f.sync_data().is_err() && f.sync_data().is_ok());
        assert_eq!(c.injected(), 4);
        c.clear();
        c.add(Fault::full());
        f.write_at(b"overwrite", 8000).unwrap();
        assert!(f.write_at(b"grow", 8190).is_err());
        assert!(f.set_len(8193).is_err());
        f.set_len(100).unwrap();
        assert_eq!(f.len().unwrap(), 100);
    }

    #[test]
    fn corrupt_reads_flip_bits_in_range_only() {
        let (d, st, f) = setup();
        f.write_at(b"abcdef", 100).unwrap();
        st.control(&d.path().join("f"))
            .add(Fault::corrupt_reads().in_range(102..104));
        let (mut a, mut b) = ([0u8; 3], [0u8; 3]);
        f.read_vectored_at(&mut [&mut a, &mut b], 100).unwrap();
        assert_eq!((&a, &b), (b"ab\x9c", b"\x9bef"));
    }

    #[test]
    fn probability_is_seeded_and_hang_waits() {
        let pattern = |seed| {
            let c = FaultControl::new(seed);
            c.add(Fault::eio(Ops::WRITE).when(When::Probability(0.5)));
            (0..64)
                .map(|_| c.enter(Ops::WRITE, span(0, 1)).is_err())
                .collect::<Vec<_>>()
        };
        assert_eq!(pattern(9), pattern(9));
        assert_ne!(pattern(9), pattern(10));
        let c = FaultControl::new(0);
        c.add(Fault::hang(Ops::SYNC, Duration::from_millis(30)));
        let t = std::time::Instant::now();
        assert!(c.enter(Ops::SYNC, None).is_ok());
        assert!(t.elapsed() >= Duration::from_millis(30));
    }
}
