//! Concurrency stress test against a model, with fsync points and a kill -9.
//!
//! THREADS worker threads run mixed operations through one FUSE mount on
//! overlapping files and directories:
//!
//! * Private files (each thread owns PRIVATE of them, living in the shared
//!   directories `d0..d3` next to everybody else's names): random writes
//!   (4 KiB writes into the middle of large files, writes crossing 64 KiB
//!   block boundaries, appends), overwrites, truncates, reads, atomic
//!   replacement by rename of a fsynced temp file (across directories, over
//!   the existing name), link/unlink cycles, xattrs, fsync and fdatasync.
//!   Every read is compared with the exact model content. The model also
//!   keeps every version a file had since its last durability point.
//! * Shared slot files (`shared/s*`): 4 KiB slots, each owned by one thread
//!   (runs of RUN slots, so one write may cross a 64 KiB block boundary).
//!   Every slot written is stamped (file, slot, thread, sequence number, and
//!   a body derived from them), so any reader can tell that a slot holds one
//!   whole stamped write of its owner, that it is not older than the owner's
//!   last completed write nor newer than its last started one, and that the
//!   sequence numbers a reader sees never go backwards.
//! * Shared names: `d*/f*` and `d*/s*/f*` (always files), `d*/s*` (always
//!   directories) are created, renamed (within and across directories, over
//!   existing names), linked, unlinked, made and removed by all threads at
//!   once; every call must succeed or fail with an errno the race allows
//!   (ENOENT, EEXIST, ENOTEMPTY), and every file under such a name is empty
//!   or holds exactly one whole stamp.
//!
//! In the middle of the run the daemon is killed with SIGKILL. The threads
//! stop at their first error, `cairn check` must be clean, and after the
//! remount every private file must be made of its durable content or later
//! versions (checked per 4 KiB page: with the kernel's writeback cache, dirty
//! pages reach the daemon in no particular order, so after a crash a file may
//! legitimately mix pages of the versions written since its last fsync — but
//! never hold a page that no version had, and never be older than its last
//! fsync), every shared slot must be a whole stamped write not older than the
//! owner's last fsync of it (or zeros if never made durable), and the shared
//! names must be consistent. The run then continues on the remounted pool and
//! ends with an exact comparison with the model, a clean unmount, `cairn
//! check`, a remount and the exact comparison once more.
//!
//! Knobs: CAIRN_STRESS_OPS (default 100000 operations in all),
//! CAIRN_STRESS_SEED (printed at the start). The seed fixes each thread's
//! sequence of choices, but not how the threads interleave nor when the kill
//! lands, so a replay is not bit-for-bit identical.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

const THREADS: usize = 8;
const PAGE: usize = 4096;
const BLOCK: usize = 64 << 10;
/// Private files per thread.
const PRIVATE: usize = 4;
/// Private files never grow beyond this (keeps the model small).
const MAX_PRIVATE: usize = 2 << 20;
/// More versions than this since the last durability point force an fsync.
const MAX_VERSIONS: usize = 24;
/// Shared slot files, slots per file and slots per owned run.
const SHARED: usize = 3;
const SLOTS: usize = 192;
const RUN: usize = 3;
/// Shared directories d0..; file names f0.. and directory names s0.. in
/// each; file names f0.. inside every s directory.
const DIRS: usize = 4;
const L1_FILES: usize = 6;
const L1_DIRS: usize = 4;
const L2_FILES: usize = 4;
/// Length of the stamp a shared-name file holds.
const NAME_STAMP: usize = 512;
const MAGIC: u64 = 0x5453_4552_5453_4e43; // "CNSTRESS"

// ------------------------------------------------------------ stamps

fn mix(a: u64, b: u64, c: u64, d: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for x in [a, b, c, d] {
        h = (h ^ x).wrapping_mul(0x100_0000_01b3).rotate_left(29);
    }
    h
}

/// `len` bytes: header (MAGIC, a, b, thread, seq) and a body derived from it.
fn stamp(a: u64, b: u64, t: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    for x in [MAGIC, a, b, t, seq] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.extend_from_slice(&pattern(mix(a, b, t, seq), len - v.len()));
    v
}

/// (a, b, thread, seq) of a whole, intact stamp; None for anything else.
fn parse_stamp(buf: &[u8]) -> Option<(u64, u64, u64, u64)> {
    if buf.len() < 40 {
        return None;
    }
    let w = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap());
    if w(0) != MAGIC {
        return None;
    }
    let (a, b, t, seq) = (w(1), w(2), w(3), w(4));
    (stamp(a, b, t, seq, buf.len()) == buf).then_some((a, b, t, seq))
}

/// A shared-name file is empty or holds exactly one whole stamp.
fn name_content_ok(d: &[u8]) -> bool {
    d.is_empty()
        || (d.len() == NAME_STAMP
            && parse_stamp(d).is_some_and(|(a, _, t, _)| a == u64::MAX && t < THREADS as u64))
}

fn slot_owner(slot: usize) -> usize {
    (slot / RUN) % THREADS
}

// ------------------------------------------------------ content model

fn zero_page() -> Arc<Vec<u8>> {
    static Z: OnceLock<Arc<Vec<u8>>> = OnceLock::new();
    Z.get_or_init(|| Arc::new(vec![0; PAGE])).clone()
}

/// File content as shared 4 KiB pages: cloning a version is cheap. Bytes
/// past `len` in the last page are always zero.
#[derive(Clone, Default)]
struct Content {
    len: usize,
    pages: Vec<Arc<Vec<u8>>>,
}

impl Content {
    fn from_bytes(b: &[u8]) -> Content {
        let mut c = Content::default();
        c.write(0, b);
        c
    }

    fn set_len(&mut self, n: usize) {
        let np = n.div_ceil(PAGE);
        if n < self.len {
            self.pages.truncate(np);
            if !n.is_multiple_of(PAGE) {
                Arc::make_mut(&mut self.pages[np - 1])[n % PAGE..].fill(0);
            }
        } else {
            while self.pages.len() < np {
                self.pages.push(zero_page());
            }
        }
        self.len = n;
    }

    fn write(&mut self, off: usize, data: &[u8]) {
        if off + data.len() > self.len {
            self.set_len(off + data.len());
        }
        let (mut pos, mut i) = (off, 0);
        while i < data.len() {
            let (p, o) = (pos / PAGE, pos % PAGE);
            let n = (PAGE - o).min(data.len() - i);
            Arc::make_mut(&mut self.pages[p])[o..o + n].copy_from_slice(&data[i..i + n]);
            pos += n;
            i += n;
        }
    }

    fn page(&self, p: usize) -> &[u8] {
        self.pages.get(p).map_or(&[0u8; PAGE][..], |v| &v[..])
    }

    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let end = (off + len).min(self.len);
        let mut out = Vec::with_capacity(end.saturating_sub(off));
        let mut pos = off;
        while pos < end {
            let (p, o) = (pos / PAGE, pos % PAGE);
            let n = (PAGE - o).min(end - pos);
            out.extend_from_slice(&self.page(p)[o..o + n]);
            pos += n;
        }
        out
    }

    fn bytes(&self) -> Vec<u8> {
        self.read(0, self.len)
    }
}

// -------------------------------------------------------- syscalls

fn setxattr(p: &Path, name: &str, val: &[u8]) -> io::Result<()> {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), val.as_ptr().cast(), val.len(), 0) };
    cvt(r as libc::c_long).map(drop)
}

/// Ok(None) for ENODATA.
fn getxattr(p: &Path, name: &str) -> io::Result<Option<Vec<u8>>> {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    match cvt(r as libc::c_long) {
        Ok(n) => {
            buf.truncate(n as usize);
            Ok(Some(buf))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Drops the file's clean cached pages (and starts writeback of dirty
/// ones), so that later reads go to the daemon.
fn evict(f: &File) -> io::Result<()> {
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

fn fsync_dir(p: &Path) -> io::Result<()> {
    File::open(p)?.sync_all()
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

// ------------------------------------------------------ shared state

/// Per shared slot: the owner's last started and completed write and the
/// newest write an fsync made durable (sequence numbers; 0 = none).
#[derive(Default)]
struct Slot {
    started: AtomicU64,
    done: AtomicU64,
    durable: AtomicU64,
}

struct Shared {
    root: PathBuf,
    seed: u64,
    /// Operations started so far, and where this phase stops.
    issued: AtomicUsize,
    limit: AtomicUsize,
    /// Set just before the daemon gets SIGKILL: errors now end a thread.
    killing: AtomicBool,
    /// A thread failed: the others stop.
    failed: AtomicBool,
    slots: Vec<Vec<Slot>>,
    stats: Stats,
}

#[derive(Default)]
struct Stats {
    fsyncs: AtomicUsize,
    expected_errors: AtomicUsize,
    torn_retries: AtomicUsize,
    stale_nlink: AtomicUsize,
    slot_writes: AtomicUsize,
    slot_reads: AtomicUsize,
    private_checks: AtomicUsize,
}

/// Why a thread stopped early.
#[derive(Debug)]
struct Stop;

type R<T> = Result<T, Stop>;

// ------------------------------------------------------ private files

struct Private {
    /// Path relative to the root: d{i % DIRS}/t{t}_{i}.
    rel: String,
    cur: Content,
    /// Every content the file may show after a crash: the durable one and
    /// all later versions (including the one of an operation in flight).
    versions: Vec<Content>,
    /// Whether the name's binding to the current inode is durable (false
    /// after a rename until the directory is fsynced).
    binding_durable: bool,
    /// Sequence number of the last durability point.
    durable_seq: u64,
    xattr: Option<Vec<u8>>,
    fd: Option<File>,
}

impl Private {
    fn push(&mut self, c: &Content) {
        self.versions.push(c.clone());
    }

    fn made_durable(&mut self, seq: u64) {
        self.versions = vec![self.cur.clone()];
        self.durable_seq = seq;
    }
}

// ------------------------------------------------------------ worker

struct Worker {
    t: usize,
    rng: StdRng,
    seq: u64,
    privs: Vec<Private>,
    shared_fds: Vec<Option<File>>,
    /// Own xattr value on each shared file.
    shared_x: Vec<Option<Vec<u8>>>,
    /// Newest sequence number seen per (shared file, slot).
    seen: HashMap<(usize, usize), u64>,
    log: VecDeque<String>,
    ops: usize,
}

impl Worker {
    fn new(t: usize, seed: u64) -> Worker {
        Worker {
            t,
            rng: StdRng::seed_from_u64(mix(seed, t as u64, 1, 2)),
            seq: 0,
            privs: Vec::new(),
            shared_fds: (0..SHARED).map(|_| None).collect(),
            shared_x: vec![None; SHARED],
            seen: HashMap::new(),
            log: VecDeque::new(),
            ops: 0,
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn note(&mut self, s: String) {
        if self.log.len() == 20 {
            self.log.pop_front();
        }
        self.log.push_back(s);
    }

    /// Panics with the context needed to understand a failure.
    #[track_caller]
    fn fail(&self, sh: &Shared, msg: String) -> ! {
        sh.failed.store(true, SeqCst);
        let recent: Vec<&str> = self.log.iter().map(String::as_str).collect();
        panic!(
            "CAIRN_STRESS_SEED={} thread {}: {msg}\nthis thread's recent ops:\n  {}",
            sh.seed,
            self.t,
            recent.join("\n  ")
        );
    }

    /// An unexpected error fails the test unless the daemon is being killed.
    #[track_caller]
    fn ok<T>(&self, sh: &Shared, r: io::Result<T>, what: &str) -> R<T> {
        match r {
            Ok(v) => Ok(v),
            Err(_) if sh.killing.load(SeqCst) => Err(Stop),
            Err(e) => self.fail(sh, format!("{what}: unexpected error {e}")),
        }
    }

    /// Ok(true) on success, Ok(false) for an errno the race allows.
    #[track_caller]
    fn racy(&self, sh: &Shared, r: io::Result<()>, allowed: &[i32], what: &str) -> R<bool> {
        match r {
            Ok(()) => Ok(true),
            Err(_) if sh.killing.load(SeqCst) => Err(Stop),
            Err(e) if allowed.contains(&errno(&e)) => {
                sh.stats.expected_errors.fetch_add(1, SeqCst);
                Ok(false)
            }
            Err(e) => self.fail(sh, format!("{what}: unexpected error {e}")),
        }
    }

    fn run(&mut self, sh: &Shared) {
        loop {
            if sh.killing.load(SeqCst) || sh.failed.load(SeqCst) {
                return;
            }
            if sh.issued.fetch_add(1, SeqCst) >= sh.limit.load(SeqCst) {
                return;
            }
            self.ops += 1;
            let roll = self.rng.gen_range(0..100);
            let r = if roll < 50 {
                self.private_op(sh)
            } else if roll < 75 {
                self.slot_op(sh)
            } else {
                self.name_op(sh)
            };
            if r.is_err() {
                self.privs.iter_mut().for_each(|p| p.fd = None);
                self.shared_fds.iter_mut().for_each(|f| *f = None);
                return;
            }
        }
    }

    // -------------------------------------------------- private ops

    fn priv_fd(&mut self, sh: &Shared, i: usize) -> R<&File> {
        if self.privs[i].fd.is_none() {
            let p = sh.root.join(&self.privs[i].rel);
            let f = OpenOptions::new().read(true).write(true).open(&p);
            let f = self.ok(sh, f, &format!("open {}", self.privs[i].rel))?;
            self.privs[i].fd = Some(f);
        }
        Ok(self.privs[i].fd.as_ref().unwrap())
    }

    /// An offset/length pair of one of the interesting kinds.
    fn write_range(&mut self, size: usize) -> (usize, usize) {
        let rng = &mut self.rng;
        let (off, len) = match rng.gen_range(0..4) {
            // 4 KiB into the middle of a (large) file
            0 if size >= 3 * PAGE => (rng.gen_range(1..size / PAGE - 1) * PAGE, PAGE),
            // across a 64 KiB block boundary
            1 => {
                let b = rng.gen_range(1..=(size / BLOCK).max(1) + 1) * BLOCK;
                (b - rng.gen_range(1..9000), rng.gen_range(2..20_000))
            }
            // small, unaligned
            2 => (rng.gen_range(0..size + 3000), rng.gen_range(1..3000)),
            _ => (rng.gen_range(0..size + 70_000), rng.gen_range(1..100_000)),
        };
        if off + len > MAX_PRIVATE {
            (rng.gen_range(0..MAX_PRIVATE / 2), len.min(MAX_PRIVATE / 2))
        } else {
            (off, len)
        }
    }

    fn private_op(&mut self, sh: &Shared) -> R<()> {
        let i = self.rng.gen_range(0..PRIVATE);
        if self.privs[i].versions.len() > MAX_VERSIONS {
            return self.priv_fsync(sh, i, true);
        }
        match self.rng.gen_range(0..100) {
            0..=29 => self.priv_write(sh, i),
            30..=49 => self.priv_read(sh, i),
            50..=55 => self.priv_append(sh, i),
            56..=61 => self.priv_truncate(sh, i),
            62..=63 => self.priv_overwrite(sh, i),
            64..=65 => self.priv_fsync(sh, i, true),
            66 => self.priv_fsync(sh, i, false),
            67..=70 => self.priv_stat(sh, i),
            71..=73 => self.priv_replace(sh, i),
            74..=77 => self.priv_link_cycle(sh, i),
            78..=83 => self.priv_xattr(sh, i),
            84..=87 => {
                self.note(format!("evict {}", self.privs[i].rel));
                let f = self.priv_fd(sh, i)?;
                let r = evict(f);
                self.ok(sh, r, "fadvise(DONTNEED)")
            }
            _ => self.priv_stat(sh, i),
        }
    }

    fn priv_write(&mut self, sh: &Shared, i: usize) -> R<()> {
        let (off, len) = self.write_range(self.privs[i].cur.len);
        let data = pattern(self.rng.gen(), len);
        self.note(format!("pwrite {} off {off} len {len}", self.privs[i].rel));
        let mut next = self.privs[i].cur.clone();
        next.write(off, &data);
        self.privs[i].push(&next);
        let f = self.priv_fd(sh, i)?;
        let r = f.write_all_at(&data, off as u64);
        self.ok(sh, r, "pwrite private")?;
        self.privs[i].cur = next;
        Ok(())
    }

    fn priv_append(&mut self, sh: &Shared, i: usize) -> R<()> {
        let mut len = self.rng.gen_range(1..80_000);
        if self.privs[i].cur.len + len > MAX_PRIVATE {
            len = 0;
        }
        let data = pattern(self.rng.gen(), len);
        let rel = self.privs[i].rel.clone();
        self.note(format!("append {rel} len {len}"));
        let mut next = self.privs[i].cur.clone();
        next.write(next.len, &data);
        self.privs[i].push(&next);
        let f = OpenOptions::new().append(true).open(sh.root.join(&rel));
        let mut f = self.ok(sh, f, "open O_APPEND")?;
        let r = f.write_all(&data);
        self.ok(sh, r, "append")?;
        self.privs[i].cur = next;
        Ok(())
    }

    fn priv_truncate(&mut self, sh: &Shared, i: usize) -> R<()> {
        let size = self.privs[i].cur.len;
        let n = match self.rng.gen_range(0..4) {
            0 => 0,
            1 => self.rng.gen_range(0..=size),
            2 => (size + self.rng.gen_range(0..200_000)).min(MAX_PRIVATE),
            _ => self.rng.gen_range(0..8) * BLOCK + self.rng.gen_range(0..3) * PAGE,
        };
        self.note(format!("truncate {} {size} -> {n}", self.privs[i].rel));
        let mut next = self.privs[i].cur.clone();
        next.set_len(n);
        self.privs[i].push(&next);
        let f = self.priv_fd(sh, i)?;
        let r = f.set_len(n as u64);
        self.ok(sh, r, "ftruncate")?;
        self.privs[i].cur = next;
        Ok(())
    }

    /// open(O_TRUNC) and write a whole new content.
    fn priv_overwrite(&mut self, sh: &Shared, i: usize) -> R<()> {
        let len = self.rng.gen_range(0..300_000);
        let data = pattern(self.rng.gen(), len);
        let rel = self.privs[i].rel.clone();
        self.note(format!("overwrite {rel} len {len}"));
        let next = Content::from_bytes(&data);
        self.privs[i].push(&Content::default());
        self.privs[i].push(&next);
        let f = File::create(sh.root.join(&rel));
        let mut f = self.ok(sh, f, "open O_TRUNC")?;
        self.privs[i].cur = Content::default();
        let r = f.write_all(&data);
        self.ok(sh, r, "overwrite")?;
        self.privs[i].cur = next;
        Ok(())
    }

    fn priv_fsync(&mut self, sh: &Shared, i: usize, full: bool) -> R<()> {
        let what = if full { "fsync" } else { "fdatasync" };
        self.note(format!("{what} {}", self.privs[i].rel));
        let f = self.priv_fd(sh, i)?;
        let r = if full { f.sync_all() } else { f.sync_data() };
        self.ok(sh, r, what)?;
        sh.stats.fsyncs.fetch_add(1, SeqCst);
        let p = &self.privs[i];
        if !p.binding_durable && full {
            let dir = sh.root.join(&p.rel).parent().unwrap().to_path_buf();
            let r = fsync_dir(&dir);
            self.ok(sh, r, "fsync directory")?;
            self.privs[i].binding_durable = true;
        }
        if self.privs[i].binding_durable {
            let seq = self.next_seq();
            self.privs[i].made_durable(seq);
        }
        Ok(())
    }

    fn priv_read(&mut self, sh: &Shared, i: usize) -> R<()> {
        sh.stats.private_checks.fetch_add(1, SeqCst);
        let size = self.privs[i].cur.len;
        let rel = self.privs[i].rel.clone();
        if self.rng.gen_bool(0.15) {
            self.note(format!("read whole {rel}"));
            let r = fs::read(sh.root.join(&rel));
            let got = self.ok(sh, r, "read whole private file")?;
            return self.compare(sh, &got, 0, size, &rel);
        }
        let off = self.rng.gen_range(0..size + 5000);
        let len = match self.rng.gen_range(0..3) {
            0 => PAGE,
            1 => self.rng.gen_range(1..20_000),
            _ => self.rng.gen_range(1..300_000),
        };
        let off = if len == PAGE { off / PAGE * PAGE } else { off };
        self.note(format!("pread {rel} off {off} len {len}"));
        let f = self.priv_fd(sh, i)?;
        let r = read_full_at(f, off as u64, len);
        let got = self.ok(sh, r, "pread private")?;
        self.compare(sh, &got, off, len, &rel)
    }

    fn compare(&self, sh: &Shared, got: &[u8], off: usize, len: usize, rel: &str) -> R<()> {
        let p = self.privs.iter().find(|p| p.rel == rel).unwrap();
        let want = p.cur.read(off, len);
        if let Some(d) = first_diff(got, &want) {
            self.fail(
                sh,
                format!(
                    "read of {rel} at {off} (len {len}, file size {}): byte {} differs \
                     (got {} bytes, model {}); got {:02x?} want {:02x?}",
                    p.cur.len,
                    off + d,
                    got.len(),
                    want.len(),
                    &got[d.min(got.len())..(d + 8).min(got.len())],
                    &want[d.min(want.len())..(d + 8).min(want.len())]
                ),
            );
        }
        Ok(())
    }

    fn priv_stat(&mut self, sh: &Shared, i: usize) -> R<()> {
        let rel = self.privs[i].rel.clone();
        self.note(format!("stat {rel}"));
        let r = fs::symlink_metadata(sh.root.join(&rel));
        let md = self.ok(sh, r, "stat private")?;
        let want = (self.privs[i].cur.len as u64, 1, true);
        if (md.len(), md.nlink(), md.is_file()) != want {
            self.fail(
                sh,
                format!(
                    "stat {rel}: (size, nlink, is_file) = {:?}, model {want:?}",
                    (md.len(), md.nlink(), md.is_file())
                ),
            );
        }
        Ok(())
    }

    /// Write a temp file in a random directory, fsync it, rename it over
    /// the private file; sometimes fsync the directory.
    fn priv_replace(&mut self, sh: &Shared, i: usize) -> R<()> {
        let t = self.t;
        let tmp = format!("d{}/t{t}_tmp", self.rng.gen_range(0..DIRS));
        let len = self.rng.gen_range(0..200_000);
        let data = pattern(self.rng.gen(), len);
        let rel = self.privs[i].rel.clone();
        self.note(format!("replace {rel} by {tmp} len {len}"));
        let mut f = self.ok(sh, File::create(sh.root.join(&tmp)), "create temp")?;
        self.ok(sh, f.write_all(&data), "write temp")?;
        self.ok(sh, f.sync_all(), "fsync temp")?;
        drop(f);
        let next = Content::from_bytes(&data);
        self.privs[i].push(&next);
        self.privs[i].binding_durable = false;
        let r = fs::rename(sh.root.join(&tmp), sh.root.join(&rel));
        self.ok(sh, r, "rename temp over private file")?;
        self.privs[i].cur = next;
        self.privs[i].fd = None;
        self.privs[i].xattr = None; // a new inode
        if self.rng.gen_bool(0.5) {
            let dir = sh.root.join(&rel).parent().unwrap().to_path_buf();
            self.ok(sh, fsync_dir(&dir), "fsync directory after rename")?;
            self.privs[i].binding_durable = true;
            let seq = self.next_seq();
            self.privs[i].made_durable(seq);
        }
        Ok(())
    }

    fn priv_link_cycle(&mut self, sh: &Shared, i: usize) -> R<()> {
        let t = self.t;
        let link = format!("d{}/t{t}_{i}.l", self.rng.gen_range(0..DIRS));
        let rel = self.privs[i].rel.clone();
        self.note(format!("link {rel} {link}, check, unlink"));
        let (p, l) = (sh.root.join(&rel), sh.root.join(&link));
        let mut r = fs::hard_link(&p, &l);
        if r.as_ref().is_err_and(|e| errno(e) == libc::ENOENT) {
            // the same kernel race: link(2) refuses an inode whose cached
            // count is 0; a stat refreshes it
            sh.stats.stale_nlink.fetch_add(1, SeqCst);
            let md = self.ok(sh, fs::metadata(&p), "stat before retrying link")?;
            if md.nlink() != 1 {
                self.fail(sh, format!("link: ENOENT and nlink {}", md.nlink()));
            }
            r = fs::hard_link(&p, &l);
        }
        self.ok(sh, r, "link private file")?;
        let md = self.ok(sh, fs::metadata(&p), "stat after link")?;
        let mdl = self.ok(sh, fs::metadata(&l), "stat link")?;
        if md.nlink() != 2 || md.ino() != mdl.ino() {
            self.fail(
                sh,
                format!(
                    "after link: nlink {} (want 2), ino {} vs link's {}",
                    md.nlink(),
                    md.ino(),
                    mdl.ino()
                ),
            );
        }
        let got = self.ok(sh, fs::read(&l), "read through link")?;
        self.compare(sh, &got, 0, self.privs[i].cur.len, &rel)?;
        self.ok(sh, fs::remove_file(&l), "unlink link")?;
        let md = self.ok(sh, fs::metadata(&p), "stat after unlink")?;
        if md.nlink() != 1 {
            // Known kernel FUSE race (not Cairn's): a LOOKUP/READDIRPLUS
            // reply carrying the post-unlink count (1) can be applied before
            // the kernel handles the UNLINK reply, which then drops its
            // cached count once more, to 0. The next stat refreshes it.
            sh.stats.stale_nlink.fetch_add(1, SeqCst);
            let mut again = self.ok(sh, fs::metadata(&p), "stat again after unlink")?;
            for _ in 0..100 {
                if again.nlink() == 1 {
                    break;
                }
                thread::sleep(Duration::from_millis(10));
                again = self.ok(sh, fs::metadata(&p), "stat again after unlink")?;
            }
            if again.nlink() != 1 || md.nlink() != 0 {
                self.fail(
                    sh,
                    format!(
                        "after unlinking the link: nlink {}, then {} (ino {})",
                        md.nlink(),
                        again.nlink(),
                        again.ino()
                    ),
                );
            }
        }
        Ok(())
    }

    fn priv_xattr(&mut self, sh: &Shared, i: usize) -> R<()> {
        let rel = self.privs[i].rel.clone();
        let p = sh.root.join(&rel);
        if self.rng.gen_bool(0.5) {
            let len = self.rng.gen_range(1..300);
            let v = pattern(self.rng.gen(), len);
            self.note(format!("setxattr {rel} len {len}"));
            self.ok(sh, setxattr(&p, "user.stress", &v), "setxattr private")?;
            self.privs[i].xattr = Some(v);
        }
        self.note(format!("getxattr {rel}"));
        let got = self.ok(sh, getxattr(&p, "user.stress"), "getxattr private")?;
        if got != self.privs[i].xattr {
            self.fail(
                sh,
                format!(
                    "getxattr {rel}: {:?} bytes, model {:?} bytes (or different bytes)",
                    got.as_ref().map(Vec::len),
                    self.privs[i].xattr.as_ref().map(Vec::len)
                ),
            );
        }
        Ok(())
    }

    // -------------------------------------------------- shared slots

    fn shared_fd(&mut self, sh: &Shared, f: usize) -> R<&File> {
        if self.shared_fds[f].is_none() || self.rng.gen_bool(0.02) {
            let p = sh.root.join(format!("shared/s{f}"));
            let r = OpenOptions::new().read(true).write(true).open(p);
            self.shared_fds[f] = Some(self.ok(sh, r, "open shared file")?);
        }
        Ok(self.shared_fds[f].as_ref().unwrap())
    }

    fn slot_op(&mut self, sh: &Shared) -> R<()> {
        let f = self.rng.gen_range(0..SHARED);
        match self.rng.gen_range(0..100) {
            0..=44 => self.slot_write(sh, f),
            45..=89 => self.slot_read(sh, f),
            90..=93 => self.slot_fsync(sh, f),
            94..=97 => self.shared_xattr(sh, f),
            _ => {
                self.note(format!("evict shared/s{f}"));
                let fd = self.shared_fd(sh, f)?;
                let r = evict(fd);
                self.ok(sh, r, "fadvise shared")
            }
        }
    }

    fn slot_write(&mut self, sh: &Shared, f: usize) -> R<()> {
        let runs: Vec<usize> = (0..SLOTS / RUN).filter(|r| r % THREADS == self.t).collect();
        let run = runs[self.rng.gen_range(0..runs.len())];
        let a = run * RUN + self.rng.gen_range(0..RUN);
        let b = self.rng.gen_range(a + 1..=run * RUN + RUN);
        let seq = self.next_seq();
        self.note(format!("write shared/s{f} slots {a}..{b} seq {seq}"));
        let mut buf = Vec::with_capacity((b - a) * PAGE);
        for s in a..b {
            buf.extend_from_slice(&stamp(f as u64, s as u64, self.t as u64, seq, PAGE));
            sh.slots[f][s].started.store(seq, SeqCst);
        }
        let fd = self.shared_fd(sh, f)?;
        let r = fd.write_all_at(&buf, (a * PAGE) as u64);
        self.ok(sh, r, "pwrite shared slots")?;
        for s in a..b {
            sh.slots[f][s].done.store(seq, SeqCst);
        }
        sh.stats.slot_writes.fetch_add(1, SeqCst);
        Ok(())
    }

    /// Checks one slot read between `lo` (owner's completed write before
    /// the read) and `hi` (owner's started write after it); None if good.
    fn slot_problem(&self, f: usize, s: usize, data: &[u8], lo: u64, hi: u64) -> Option<String> {
        if data.iter().all(|b| *b == 0) {
            return (lo != 0).then(|| format!("zeros, but write {lo} had completed"));
        }
        let Some((a, b, t, seq)) = parse_stamp(data) else {
            return Some("not one whole stamped write".into());
        };
        if (a, b, t) != (f as u64, s as u64, slot_owner(s) as u64) {
            return Some(format!("stamp of file {a} slot {b} thread {t}"));
        }
        if seq < lo || seq > hi {
            return Some(format!("seq {seq} outside [{lo}, {hi}]"));
        }
        None
    }

    fn slot_read(&mut self, sh: &Shared, f: usize) -> R<()> {
        let a = self.rng.gen_range(0..SLOTS);
        let n = self.rng.gen_range(1..=(SLOTS - a).min(40));
        self.note(format!("read shared/s{f} slots {a}..{}", a + n));
        let lo: Vec<u64> = (a..a + n)
            .map(|s| sh.slots[f][s].done.load(SeqCst))
            .collect();
        let fd = self.shared_fd(sh, f)?;
        let r = read_full_at(fd, (a * PAGE) as u64, n * PAGE);
        let got = self.ok(sh, r, "pread shared slots")?;
        if got.len() != n * PAGE {
            self.fail(sh, format!("short read of shared/s{f}: {}", got.len()));
        }
        for k in 0..n {
            let s = a + k;
            let hi = sh.slots[f][s].started.load(SeqCst);
            let mut data = got[k * PAGE..(k + 1) * PAGE].to_vec();
            let (mut lo_s, mut hi_s) = (lo[k], hi);
            let mut tries = 0;
            // A read racing the owner's write of the same page may see part
            // of it (Linux does not make buffered read(2) atomic against
            // write(2)); re-read the slot: a real tear does not go away.
            while let Some(why) = self.slot_problem(f, s, &data, lo_s, hi_s) {
                tries += 1;
                if tries > 5 {
                    self.fail(sh, format!("shared/s{f} slot {s}: {why}"));
                }
                sh.stats.torn_retries.fetch_add(1, SeqCst);
                thread::sleep(Duration::from_millis(1));
                lo_s = sh.slots[f][s].done.load(SeqCst);
                let fd = self.shared_fd(sh, f)?;
                let r = read_full_at(fd, (s * PAGE) as u64, PAGE);
                data = self.ok(sh, r, "re-read shared slot")?;
                hi_s = sh.slots[f][s].started.load(SeqCst);
            }
            if let Some((_, _, _, seq)) = parse_stamp(&data) {
                let last = self.seen.entry((f, s)).or_insert(0);
                if seq < *last {
                    let last = *last;
                    self.fail(
                        sh,
                        format!("shared/s{f} slot {s}: seq went back from {last} to {seq}"),
                    );
                }
                *last = seq;
            }
        }
        sh.stats.slot_reads.fetch_add(1, SeqCst);
        Ok(())
    }

    fn slot_fsync(&mut self, sh: &Shared, f: usize) -> R<()> {
        let mine: Vec<(usize, u64)> = (0..SLOTS)
            .filter(|s| slot_owner(*s) == self.t)
            .map(|s| (s, sh.slots[f][s].done.load(SeqCst)))
            .collect();
        let full = self.rng.gen_bool(0.5);
        self.note(format!(
            "{} shared/s{f}",
            if full { "fsync" } else { "fdatasync" }
        ));
        let fd = self.shared_fd(sh, f)?;
        let r = if full { fd.sync_all() } else { fd.sync_data() };
        self.ok(sh, r, "fsync shared")?;
        sh.stats.fsyncs.fetch_add(1, SeqCst);
        for (s, done) in mine {
            sh.slots[f][s].durable.fetch_max(done, SeqCst);
        }
        Ok(())
    }

    fn shared_xattr(&mut self, sh: &Shared, f: usize) -> R<()> {
        let p = sh.root.join(format!("shared/s{f}"));
        let t = self.t;
        let seq = self.next_seq();
        let len = self.rng.gen_range(40..200);
        let v = stamp(f as u64, u64::MAX - 1, t as u64, seq, len);
        self.note(format!("setxattr shared/s{f} user.t{t} seq {seq}"));
        self.ok(
            sh,
            setxattr(&p, &format!("user.t{t}"), &v),
            "setxattr shared",
        )?;
        self.shared_x[f] = Some(v);
        let other = self.rng.gen_range(0..THREADS);
        let got = self.ok(sh, getxattr(&p, &format!("user.t{other}")), "getxattr")?;
        let good = match (&got, other == t) {
            (_, true) => got == self.shared_x[f],
            (None, false) => true,
            (Some(v), false) => parse_stamp(v)
                .is_some_and(|(a, b, tt, _)| (a, b, tt) == (f as u64, u64::MAX - 1, other as u64)),
        };
        if !good {
            self.fail(sh, format!("getxattr shared/s{f} user.t{other}: bad value"));
        }
        Ok(())
    }

    // -------------------------------------------------- shared names

    /// A level-1 file (d/f), level-2 file (d/s/f) or directory (d/s) name.
    fn file_name(&mut self) -> String {
        let d = self.rng.gen_range(0..DIRS);
        if self.rng.gen_bool(0.5) {
            format!("d{d}/f{}", self.rng.gen_range(0..L1_FILES))
        } else {
            let s = self.rng.gen_range(0..L1_DIRS);
            format!("d{d}/s{s}/f{}", self.rng.gen_range(0..L2_FILES))
        }
    }

    fn dir_name(&mut self) -> String {
        let d = self.rng.gen_range(0..DIRS);
        format!("d{d}/s{}", self.rng.gen_range(0..L1_DIRS))
    }

    fn name_op(&mut self, sh: &Shared) -> R<()> {
        use libc::{EEXIST, ENOENT, ENOTEMPTY};
        let p = |s: &str| sh.root.join(s);
        let roll = self.rng.gen_range(0..100);
        let (a, b) = if (50..70).contains(&roll) {
            (self.dir_name(), self.dir_name())
        } else {
            (self.file_name(), self.file_name())
        };
        match roll {
            0..=9 => {
                let seq = self.next_seq();
                self.note(format!("create {a} seq {seq}"));
                let r = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(p(&a))
                    .and_then(|mut f| {
                        f.write_all(&stamp(u64::MAX, 0, self.t as u64, seq, NAME_STAMP))
                    });
                self.racy(sh, r, &[EEXIST, ENOENT], &format!("create {a}"))?;
            }
            10..=14 => {
                let seq = self.next_seq();
                self.note(format!("rewrite {a} seq {seq}"));
                let r = OpenOptions::new().write(true).open(p(&a)).and_then(|f| {
                    f.write_all_at(&stamp(u64::MAX, 0, self.t as u64, seq, NAME_STAMP), 0)
                });
                self.racy(sh, r, &[ENOENT], &format!("rewrite {a}"))?;
            }
            15..=24 => {
                self.note(format!("read {a}"));
                for tries in 0.. {
                    let mut got = Vec::new();
                    let r = fs::read(p(&a)).map(|d| got = d);
                    if !self.racy(sh, r, &[ENOENT], &format!("read {a}"))? {
                        break;
                    }
                    if name_content_ok(&got) {
                        break;
                    }
                    if tries == 5 {
                        self.fail(sh, format!("{a}: {} bytes, not one whole stamp", got.len()));
                    }
                    sh.stats.torn_retries.fetch_add(1, SeqCst);
                    thread::sleep(Duration::from_millis(1));
                }
            }
            25..=39 => {
                self.note(format!("rename {a} {b}"));
                let r = fs::rename(p(&a), p(&b));
                self.racy(sh, r, &[ENOENT], &format!("rename {a} {b}"))?;
            }
            40..=46 => {
                self.note(format!("link {a} {b}"));
                let r = fs::hard_link(p(&a), p(&b));
                self.racy(sh, r, &[ENOENT, EEXIST], &format!("link {a} {b}"))?;
            }
            47..=49 => {
                self.note(format!("setxattr {a}"));
                let r = setxattr(&p(&a), "user.n", b"x");
                self.racy(sh, r, &[ENOENT], &format!("setxattr {a}"))?;
            }
            50..=55 => {
                self.note(format!("rename dir {a} {b}"));
                let r = fs::rename(p(&a), p(&b));
                let allowed = [ENOENT, ENOTEMPTY, EEXIST];
                self.racy(sh, r, &allowed, &format!("rename {a} {b}"))?;
            }
            56..=62 => {
                self.note(format!("mkdir {a}"));
                let r = fs::create_dir(p(&a));
                self.racy(sh, r, &[EEXIST], &format!("mkdir {a}"))?;
            }
            63..=69 => {
                self.note(format!("rmdir {a}"));
                let r = fs::remove_dir(p(&a));
                let allowed = [ENOENT, ENOTEMPTY, EEXIST];
                self.racy(sh, r, &allowed, &format!("rmdir {a}"))?;
            }
            70..=89 => {
                self.note(format!("unlink {a}"));
                let r = fs::remove_file(p(&a));
                self.racy(sh, r, &[ENOENT], &format!("unlink {a}"))?;
            }
            _ => {
                let d = format!("d{}", self.rng.gen_range(0..DIRS));
                self.note(format!("list {d}"));
                self.list_live(sh, &d)?;
            }
        }
        Ok(())
    }

    /// readdir + lstat of every entry while others change the directory:
    /// names and types must fit, entries may vanish.
    fn list_live(&mut self, sh: &Shared, d: &str) -> R<()> {
        let r = fs::read_dir(sh.root.join(d)).and_then(|rd| rd.collect::<io::Result<Vec<_>>>());
        let ents = self.ok(sh, r, "readdir")?;
        for e in ents {
            let name = e.file_name().into_string().unwrap();
            let Some(want_dir) = kind_of_name(&name, 1) else {
                self.fail(sh, format!("unexpected name {d}/{name}"));
            };
            match fs::symlink_metadata(e.path()) {
                Ok(md) if md.is_dir() != want_dir || !(md.is_dir() || md.is_file()) => {
                    self.fail(sh, format!("{d}/{name} has the wrong type"))
                }
                // nlink 0: removed by another thread between the listing
                // and the lstat, which then saw the inode the kernel still
                // held (as a native filesystem's stat can).
                Ok(md) if md.is_dir() && md.nlink() != 2 && md.nlink() != 0 => {
                    self.fail(sh, format!("{d}/{name}: nlink {} (no subdirs)", md.nlink()))
                }
                Ok(_) => {}
                Err(e) => {
                    self.racy(sh, Err(e), &[libc::ENOENT], "lstat listed entry")?;
                }
            }
        }
        Ok(())
    }
}

/// Whether `name` at `level` (1 = in d*, 2 = in d*/s*) is a directory;
/// None if nobody ever makes such a name there.
fn kind_of_name(name: &str, level: usize) -> Option<bool> {
    let num = |pre: &str, max: usize| {
        name.strip_prefix(pre)
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n < max && name == format!("{pre}{n}"))
    };
    if level == 2 {
        return num("f", L2_FILES).then_some(false);
    }
    if num("f", L1_FILES) {
        return Some(false);
    }
    if num("s", L1_DIRS) {
        return Some(true);
    }
    // private names: t{t}_{i}, t{t}_{i}.l, t{t}_tmp
    let rest = name.strip_prefix('t')?;
    let (t, tail) = rest.split_once('_')?;
    let t: usize = t.parse().ok()?;
    let i = tail.strip_suffix(".l").unwrap_or(tail);
    let ok = t < THREADS && (tail == "tmp" || i.parse::<usize>().is_ok_and(|i| i < PRIVATE));
    ok.then_some(false)
}

// ------------------------------------------------------------ checks

/// Walks the shared directories while nothing runs: every entry resolves
/// and has the right type and content; directory link counts add up.
/// Returns (files, dirs) under shared names.
fn check_names(root: &Path, ctx: &str) -> (usize, usize) {
    let (mut files, mut dirs) = (0, 0);
    let check_file = |p: &Path| {
        let d = fs::read(p).unwrap_or_else(|e| panic!("{ctx}: read {}: {e}", p.display()));
        assert!(
            name_content_ok(&d),
            "{ctx}: {}: {} bytes, not empty nor one whole stamp",
            p.display(),
            d.len()
        );
    };
    for k in 0..DIRS {
        let d = root.join(format!("d{k}"));
        let mut subdirs = 0;
        for e in fs::read_dir(&d).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            let p = d.join(&name);
            let want_dir = kind_of_name(&name, 1)
                .unwrap_or_else(|| panic!("{ctx}: unexpected name d{k}/{name}"));
            let md = fs::symlink_metadata(&p)
                .unwrap_or_else(|e| panic!("{ctx}: listed d{k}/{name} does not resolve: {e}"));
            assert_eq!(md.is_dir(), want_dir, "{ctx}: type of d{k}/{name}");
            if !want_dir {
                assert!(md.is_file(), "{ctx}: d{k}/{name} is not a regular file");
                if name.starts_with('f') {
                    files += 1;
                    check_file(&p);
                }
                continue;
            }
            subdirs += 1;
            dirs += 1;
            assert_eq!(md.nlink(), 2, "{ctx}: nlink of d{k}/{name}");
            for e in fs::read_dir(&p).unwrap() {
                let n2 = e.unwrap().file_name().into_string().unwrap();
                assert_eq!(
                    kind_of_name(&n2, 2),
                    Some(false),
                    "{ctx}: unexpected entry d{k}/{name}/{n2}"
                );
                let md = fs::symlink_metadata(p.join(&n2))
                    .unwrap_or_else(|e| panic!("{ctx}: d{k}/{name}/{n2} does not resolve: {e}"));
                assert!(md.is_file(), "{ctx}: d{k}/{name}/{n2} is not a file");
                files += 1;
                check_file(&p.join(&n2));
            }
        }
        let md = fs::metadata(&d).unwrap();
        assert_eq!(md.nlink(), 2 + subdirs, "{ctx}: nlink of d{k}");
    }
    (files, dirs)
}

/// Exact comparison with the model (everything completed, nothing lost).
fn check_exact(root: &Path, workers: &[Worker], sh: &Shared, ctx: &str) {
    for w in workers {
        for p in &w.privs {
            let path = root.join(&p.rel);
            let got = fs::read(&path).unwrap_or_else(|e| panic!("{ctx}: read {}: {e}", p.rel));
            assert_bytes_eq(&got, &p.cur.bytes(), &format!("{ctx}: {}", p.rel));
            let md = fs::metadata(&path).unwrap();
            assert_eq!(md.nlink(), 1, "{ctx}: nlink of {}", p.rel);
            let x = getxattr(&path, "user.stress").unwrap();
            assert!(x == p.xattr, "{ctx}: xattr of {} differs", p.rel);
        }
    }
    for f in 0..SHARED {
        let path = root.join(format!("shared/s{f}"));
        let data = fs::read(&path).unwrap();
        assert_eq!(data.len(), SLOTS * PAGE, "{ctx}: size of shared/s{f}");
        for s in 0..SLOTS {
            let done = sh.slots[f][s].done.load(SeqCst);
            let want = if done == 0 {
                vec![0; PAGE]
            } else {
                stamp(f as u64, s as u64, slot_owner(s) as u64, done, PAGE)
            };
            let got = &data[s * PAGE..(s + 1) * PAGE];
            assert!(
                got == &want[..],
                "{ctx}: shared/s{f} slot {s}: want seq {done} of thread {}, got {:?}",
                slot_owner(s),
                parse_stamp(got)
            );
        }
        for w in workers {
            let x = getxattr(&path, &format!("user.t{}", w.t)).unwrap();
            assert!(x == w.shared_x[f], "{ctx}: shared/s{f} user.t{}", w.t);
        }
    }
    check_names(root, ctx);
}

/// After the kill -9 and remount: durable data is there, nothing is made
/// up. Then the model takes the recovered state as its new starting point.
/// Returns (private files that lost unsynced changes, shared slots behind
/// their last completed write).
fn check_after_crash(root: &Path, workers: &mut [Worker], sh: &Shared) -> (usize, usize) {
    let ctx = format!("CAIRN_STRESS_SEED={} after kill -9", sh.seed);
    let mut lost = 0;
    for w in workers.iter_mut() {
        // leftovers of interrupted replace and link cycles
        for k in 0..DIRS {
            let _ = fs::remove_file(root.join(format!("d{k}/t{}_tmp", w.t)));
            for i in 0..PRIVATE {
                let _ = fs::remove_file(root.join(format!("d{k}/t{}_{i}.l", w.t)));
            }
        }
        for p in w.privs.iter_mut() {
            let path = root.join(&p.rel);
            let got = fs::read(&path)
                .unwrap_or_else(|e| panic!("{ctx}: {} (durable name) is gone: {e}", p.rel));
            let lens = p.versions.iter().map(|v| v.len);
            let (min, max) = (lens.clone().min().unwrap(), lens.max().unwrap());
            assert!(
                (min..=max).contains(&got.len()),
                "{ctx}: {} has {} bytes; the durable version (seq {}) and later ones \
                 have {min}..={max}",
                p.rel,
                got.len(),
                p.durable_seq
            );
            for (k, page) in got.chunks(PAGE).enumerate() {
                let ok = p.versions.iter().any(|v| &v.page(k)[..page.len()] == page);
                assert!(
                    ok,
                    "{ctx}: {} page {k} (bytes {}..) matches neither its durable content \
                     (seq {}) nor any of the {} later versions",
                    p.rel,
                    k * PAGE,
                    p.durable_seq,
                    p.versions.len() - 1
                );
            }
            let md = fs::metadata(&path).unwrap();
            assert_eq!(md.nlink(), 1, "{ctx}: nlink of {}", p.rel);
            let cur = Content::from_bytes(&got);
            lost += (got != p.cur.bytes()) as usize;
            p.cur = cur;
            p.made_durable(0);
            p.binding_durable = true;
            p.xattr = getxattr(&path, "user.stress").unwrap();
            p.fd = None;
        }
        w.seen.clear();
        w.shared_fds.iter_mut().for_each(|f| *f = None);
    }
    let mut behind = 0;
    for f in 0..SHARED {
        let data = fs::read(root.join(format!("shared/s{f}"))).unwrap();
        assert_eq!(data.len(), SLOTS * PAGE, "{ctx}: size of shared/s{f}");
        for s in 0..SLOTS {
            let slot = &sh.slots[f][s];
            let (durable, started) = (slot.durable.load(SeqCst), slot.started.load(SeqCst));
            let got = &data[s * PAGE..(s + 1) * PAGE];
            let seq = if got.iter().all(|b| *b == 0) {
                assert_eq!(
                    durable, 0,
                    "{ctx}: shared/s{f} slot {s} is zeros, write {durable} was fsynced"
                );
                0
            } else {
                let (a, b, t, seq) = parse_stamp(got).unwrap_or_else(|| {
                    panic!("{ctx}: shared/s{f} slot {s} is not one whole stamped write")
                });
                assert_eq!(
                    (a, b, t),
                    (f as u64, s as u64, slot_owner(s) as u64),
                    "{ctx}: shared/s{f} slot {s} holds another slot's stamp"
                );
                assert!(
                    (durable..=started).contains(&seq),
                    "{ctx}: shared/s{f} slot {s}: seq {seq}, fsynced {durable}, last started {started}"
                );
                seq
            };
            behind += (seq < slot.done.load(SeqCst)) as usize;
            slot.started.store(seq, SeqCst);
            slot.done.store(seq, SeqCst);
            slot.durable.store(seq, SeqCst);
        }
        for w in workers.iter_mut() {
            w.shared_x[f] = getxattr(
                &root.join(format!("shared/s{f}")),
                &format!("user.t{}", w.t),
            )
            .unwrap();
        }
    }
    check_names(root, &ctx);
    (lost, behind)
}

// ------------------------------------------------------------ driver

fn setup(root: &Path, workers: &mut [Worker]) {
    for k in 0..DIRS {
        fs::create_dir(root.join(format!("d{k}"))).unwrap();
    }
    fs::create_dir(root.join("shared")).unwrap();
    for f in 0..SHARED {
        let file = File::create(root.join(format!("shared/s{f}"))).unwrap();
        file.set_len((SLOTS * PAGE) as u64).unwrap();
        file.sync_all().unwrap();
    }
    for w in workers.iter_mut() {
        for i in 0..PRIVATE {
            let rel = format!("d{}/t{}_{i}", i % DIRS, w.t);
            let len = w.rng.gen_range(0..600_000);
            let data = pattern(w.rng.gen(), len);
            write_synced(&root.join(&rel), &data);
            let cur = Content::from_bytes(&data);
            w.privs.push(Private {
                rel,
                versions: vec![cur.clone()],
                cur,
                binding_durable: true,
                durable_seq: 0,
                xattr: None,
                fd: None,
            });
        }
    }
    for k in 0..DIRS {
        fsync_dir(&root.join(format!("d{k}"))).unwrap();
    }
    fsync_dir(&root.join("shared")).unwrap();
    fsync_dir(root).unwrap();
}

/// Runs all workers until `sh.limit` operations were issued, or, with
/// `kill` = Some(n), until n were issued and the daemon has been killed.
fn run_phase(
    fs: &mut Fs,
    sh: &Arc<Shared>,
    workers: Vec<Worker>,
    kill: Option<usize>,
) -> Vec<Worker> {
    let handles: Vec<_> = workers
        .into_iter()
        .map(|mut w| {
            let sh = sh.clone();
            thread::Builder::new()
                .name(format!("stress-{}", w.t))
                .spawn(move || {
                    w.run(&sh);
                    w
                })
                .unwrap()
        })
        .collect();
    let t0 = Instant::now();
    let mut shown = 0;
    let at = kill.unwrap_or(usize::MAX);
    while sh.issued.load(SeqCst) < at
        && !sh.failed.load(SeqCst)
        && !handles.iter().all(|h| h.is_finished())
    {
        thread::sleep(Duration::from_millis(2));
        if t0.elapsed().as_secs() >= shown + 10 {
            shown += 10;
            println!("  {shown} s: {} ops issued", sh.issued.load(SeqCst));
        }
    }
    if kill.is_some() && !sh.failed.load(SeqCst) {
        sh.killing.store(true, SeqCst);
        fs.kill9();
    }
    let mut out = Vec::new();
    let mut panic = None;
    for h in handles {
        match h.join() {
            Ok(mut w) => {
                // open files would keep the mount busy
                w.privs.iter_mut().for_each(|p| p.fd = None);
                w.shared_fds.iter_mut().for_each(|f| *f = None);
                out.push(w)
            }
            Err(p) => panic = panic.or(Some(p)),
        }
    }
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
    out
}

#[test]
fn concurrent_ops_with_fsync_and_kill9() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: this test needs FUSE and must not be skipped"
    );
    let seed = std::env::var("CAIRN_STRESS_SEED").map_or_else(
        |_| rand::thread_rng().gen(),
        |s| s.parse().expect("CAIRN_STRESS_SEED must be a u64"),
    );
    let total = env_usize("CAIRN_STRESS_OPS", 100_000);
    println!(
        "concurrency stress: CAIRN_STRESS_SEED={seed} CAIRN_STRESS_OPS={total}, {THREADS} threads"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let kill_at = rng.gen_range(total * 2 / 5..=total * 3 / 5);

    let mut fs = Fs::new();
    let mut workers: Vec<Worker> = (0..THREADS).map(|t| Worker::new(t, seed)).collect();
    setup(&fs.mnt, &mut workers);
    let sh = Arc::new(Shared {
        root: fs.mnt.clone(),
        seed,
        issued: AtomicUsize::new(0),
        limit: AtomicUsize::new(total),
        killing: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        slots: (0..SHARED)
            .map(|_| (0..SLOTS).map(|_| Slot::default()).collect())
            .collect(),
        stats: Stats::default(),
    });

    let t0 = Instant::now();
    let workers = run_phase(&mut fs, &sh, workers, Some(kill_at));
    let done1 = sh.issued.load(SeqCst).min(total);
    let t1 = t0.elapsed();
    assert!(sh.killing.load(SeqCst), "phase 1 ended without the kill");
    println!(
        "phase 1: {done1} ops in {:.1} s ({:.0} ops/s), then kill -9",
        t1.as_secs_f64(),
        done1 as f64 / t1.as_secs_f64()
    );
    let mut workers = workers;
    fs.check();
    fs.mount();
    let (lost, behind) = check_after_crash(&fs.mnt, &mut workers, &sh);
    println!(
        "after kill -9: check clean; {lost} of {} private files lost unsynced changes, \
         {behind} shared slots fell back to an older write",
        THREADS * PRIVATE
    );

    sh.killing.store(false, SeqCst);
    sh.issued.store(done1, SeqCst);
    let t2 = Instant::now();
    let workers = run_phase(&mut fs, &sh, workers, None);
    let ops2 = total - done1;
    let el2 = t2.elapsed();
    println!(
        "phase 2: {ops2} ops in {:.1} s ({:.0} ops/s)",
        el2.as_secs_f64(),
        ops2 as f64 / el2.as_secs_f64()
    );

    let ctx = format!("CAIRN_STRESS_SEED={seed} end of run");
    check_exact(&fs.mnt, &workers, &sh, &ctx);
    fs.unmount();
    fs.check();
    fs.mount();
    check_exact(&fs.mnt, &workers, &sh, &format!("{ctx}, after remount"));
    let (files, dirs) = check_names(&fs.mnt, &ctx);
    fs.finish();
    let st = &sh.stats;
    let ops: usize = workers.iter().map(|w| w.ops).sum();
    let el = t0.elapsed();
    println!(
        "done: {ops} ops in {:.1} s ({:.0} ops/s overall); {} fsyncs, {} slot writes, \
         {} slot reads, {} private reads checked, {} expected errnos, {} torn-read retries, {} stale kernel nlinks; \
         {files} shared-name files and {dirs} dirs left",
        el.as_secs_f64(),
        ops as f64 / el.as_secs_f64(),
        st.fsyncs.load(SeqCst),
        st.slot_writes.load(SeqCst),
        st.slot_reads.load(SeqCst),
        st.private_checks.load(SeqCst),
        st.expected_errors.load(SeqCst),
        st.torn_retries.load(SeqCst),
        st.stale_nlink.load(SeqCst),
    );
}

/// Over io_uring, the FUSE requests ring threads hand off (large writes,
/// fsync) run on the adaptive worker pool, whose counters `cairn info`
/// shows: jobs completed, the workers kept, and the bound it may grow to.
#[test]
fn fuse_handoffs_run_on_the_adaptive_worker_pool() {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    fs.mount_args = OVER_IO_URING.map(String::from).to_vec();
    fs.mount();
    let path = fs.p("big");
    let mut f = std::fs::File::create(&path).unwrap();
    // 12 writes for 8 hand-offs: the first requests after the mount may
    // still come through /dev/fuse, before the rings are registered.
    for i in 0..12u8 {
        std::io::Write::write_all(&mut f, &vec![i; 1 << 20]).unwrap();
        f.sync_all().unwrap();
    }
    drop(f);
    // A job counts as completed just after its reply is out, so the last
    // one may still be counting when the write returns.
    let t0 = std::time::Instant::now();
    let info = loop {
        let info = common::hist::pool_info(&fs.mnt);
        let w = common::hist::field(&info, "fuse_workers");
        if common::hist::field_u64(w, "completed") >= 8 || t0.elapsed().as_secs() >= 5 {
            break info;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let w = common::hist::field(&info, "fuse_workers");
    let n = |k: &str| common::hist::field_u64(w, k);
    assert!(n("completed") >= 8, "handed-off requests: {w:?}");
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!((n("min"), n("max")), ((2 * cpus + 2).min(32), 64), "{w:?}");
    assert!(n("workers") >= n("min"), "{w:?}");
    fs.finish();
}
