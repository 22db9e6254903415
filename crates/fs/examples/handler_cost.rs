//! What Cairn's request handlers cost without FUSE: the file system layer
//! driven directly with the requests the kernel sends for a postmark-like
//! mail-server mix (negative LOOKUP and MKNOD of a new file, GETXATTR of
//! `security.capability` before each WRITE, GETATTR, READ, UNLINK and
//! FORGET), one thread, on a pool in a temporary directory, with the
//! background flusher committing as a mount's does. Prints the time per
//! request of each kind and in all, the median of the rounds: a figure to
//! compare two builds by (bench/roundtrip.sh measures the same load
//! through FUSE, where the kernel's share hides small changes).
//!
//! Usage: `handler_cost [ROUNDS] [DIR]` (5 rounds; DIR: a work directory
//! on the disk under test, default the system's temporary directory).

#![allow(
    clippy::cast_possible_truncation,
    clippy::unwrap_used,
    reason = "a measuring tool: sizes below 64 KiB; it stops at the first error"
)]

use cairn_fs::{mkfs, Ctx, Fs, FsError, MkfsOptions, Pool, ROOT_INO};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const FILES: usize = 5000;
const TRANSACTIONS: usize = 20_000;
const SUBDIRS: usize = 10;
const WRITE: usize = 4096;

/// A small deterministic generator (the same requests in every round and
/// build).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// Time spent per request kind, and how many.
#[derive(Default)]
struct Clock(BTreeMap<&'static str, (Duration, u64)>);

impl Clock {
    fn time<T>(&mut self, kind: &'static str, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        let e = self.0.entry(kind).or_default();
        e.0 += t.elapsed();
        e.1 += 1;
        r
    }
}

struct Load<'a> {
    fs: &'a Fs,
    rng: Lcg,
    clock: Clock,
    dirs: Vec<u64>,
    /// Live files: (directory, name, inode, size).
    files: Vec<(u64, Vec<u8>, u64, u64)>,
    made: u64,
    buf: Vec<u8>,
}

impl Load<'_> {
    fn create(&mut self) {
        let dir = self.dirs[self.rng.below(self.dirs.len())];
        self.made += 1;
        let name = format!("pm{:08}", self.made).into_bytes();
        let fs = self.fs;
        let miss = self.clock.time("LOOKUP", || fs.lookup_ref(dir, &name));
        assert!(matches!(miss, Err(FsError::NotFound)), "{miss:?}");
        let i = (self.clock)
            .time("MKNOD", || fs.mknod(Ctx::ROOT, dir, &name, 0o100644, 0))
            .unwrap();
        fs.add_lookup_ref(i.ino);
        let size = 500 + self.rng.below(9500) as u64;
        self.append(i.ino, 0, size);
        self.files.push((dir, name, i.ino, size));
    }

    fn append(&mut self, ino: u64, from: u64, len: u64) {
        let fs = self.fs;
        let mut off = from;
        while off < from + len {
            let n = (from + len - off).min(WRITE as u64) as usize;
            let cap = self
                .clock
                .time("GETXATTR", || fs.getxattr(ino, b"security.capability"));
            assert!(matches!(cap, Err(FsError::NoAttr)), "{cap:?}");
            let data = &self.buf[..n];
            self.clock
                .time("WRITE", || fs.write(ino, off, data))
                .unwrap();
            off += n as u64;
        }
        self.clock
            .time("GETATTR", || fs.getattr_blocks(ino))
            .unwrap();
    }

    fn read(&mut self) {
        let (_, _, ino, size) = self.files[self.rng.below(self.files.len())];
        let fs = self.fs;
        self.clock
            .time("GETATTR", || fs.getattr_blocks(ino))
            .unwrap();
        let mut off = 0;
        while off < size {
            let got = self.clock.time("READ", || fs.read(ino, off, WRITE as u32));
            assert!(!got.unwrap().is_empty());
            off += WRITE as u64;
        }
    }

    fn delete(&mut self) {
        let k = self.rng.below(self.files.len());
        let (dir, name, ino, _) = self.files.swap_remove(k);
        let fs = self.fs;
        self.clock.time("UNLINK", || fs.unlink(dir, &name)).unwrap();
        self.clock.time("FORGET", || fs.forget(ino, 1));
    }

    fn transaction(&mut self) {
        if self.rng.below(2) == 0 {
            self.read();
        } else {
            let k = self.rng.below(self.files.len());
            let (_, _, ino, size) = self.files[k];
            let more = 500 + self.rng.below(3500) as u64;
            self.append(ino, size, more);
            self.files[k].3 = size + more;
        }
        if self.rng.below(2) == 0 {
            self.create();
        } else {
            self.delete();
        }
    }
}

/// One round on a new pool: make the files, run the transactions, delete
/// what is left. Returns the clock.
fn round(dir: &std::path::Path) -> Clock {
    let pool = dir.join("pool");
    mkfs(&pool, MkfsOptions::default()).unwrap();
    let fs: Arc<Fs> = Fs::open(Pool::open(&pool, None).unwrap()).unwrap();
    let flusher = fs.spawn_flusher();
    let dirs = (0..SUBDIRS)
        .map(|d| {
            (fs.mkdir(Ctx::ROOT, ROOT_INO, format!("s{d}").as_bytes(), 0o755))
                .unwrap()
                .ino
        })
        .collect();
    let mut l = Load {
        fs: &fs,
        rng: Lcg(20261205),
        clock: Clock::default(),
        dirs,
        files: Vec::new(),
        made: 0,
        buf: vec![0x5a; WRITE],
    };
    for _ in 0..FILES {
        l.create();
    }
    for _ in 0..TRANSACTIONS {
        l.transaction();
    }
    while !l.files.is_empty() {
        l.delete();
    }
    let clock = l.clock;
    fs.shutdown().unwrap();
    flusher.join().unwrap();
    drop(fs);
    std::fs::remove_dir_all(&pool).unwrap();
    clock
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args
        .next()
        .map_or(5, |a| a.parse().expect("ROUNDS: a number"));
    let base = args.next().map_or_else(std::env::temp_dir, Into::into);
    let work = tempfile::tempdir_in(base).unwrap();
    let mut per: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut all = Vec::new();
    for r in 0..rounds {
        let c = round(work.path());
        let (mut t, mut n) = (Duration::ZERO, 0);
        for (k, (d, c)) in &c.0 {
            per.entry(k)
                .or_default()
                .push(d.as_nanos() as f64 / *c as f64);
            t += *d;
            n += c;
        }
        all.push(t.as_nanos() as f64 / n as f64);
        eprintln!(
            "round {}/{rounds}: {n} requests, {:.0} ns each",
            r + 1,
            all[r]
        );
    }
    for (k, v) in per {
        println!("{k:<9} {:>7.0} ns", median(v));
    }
    println!("{:<9} {:>7.0} ns", "all", median(all));
}
