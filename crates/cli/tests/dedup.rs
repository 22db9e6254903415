//! Dedup, compression, GC and scrub through a real mount and the `cairn`
//! CLI: a seeded model of the live tree and of every snapshot under random
//! block-level writes (dedup hits within files, across files, against
//! history and snapshots) with prune and exact final accounting; exact
//! `cairn info` numbers for dedup on and off; compression per pool and
//! changed across remounts; `cairn gc` under concurrent writers and readers,
//! background GC, kill -9 during GC; corrupted chunks found by scrub (online
//! and offline, naming every file that uses them), EIO through the mount and
//! `cairn check` failing. Every test ends with `cairn check`.
//! Seeds are printed; reproduce with CAIRN_SEED=<seed>. CAIRN_DEDUP_BATCHES
//! and CAIRN_DEDUP_CRASH_ROUNDS make the randomized tests longer.

mod common;

use common::hist::*;
use common::json::Json;
use common::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Record size of every pool here (the default).
const BLOCK: usize = 64 * KIB;
const B: u64 = BLOCK as u64;
/// Bytes of the header in front of every stored chunk.
const HDR: u64 = 56;

// ------------------------------------------------------------------ helpers

/// A pool on one device file of `size` in the private dir, with extra mkfs
/// arguments and `key = value` config settings, mounted.
fn pool_with(size: &str, mkfs: &[&str], config: &[(&str, &str)]) -> Fs {
    let mut fs = Fs::create();
    let dev = fs.dev("ssd0");
    let spec = format!("ssd:{dev}:{size}");
    let mut args = vec!["--device", spec.as_str()];
    args.extend_from_slice(mkfs);
    fs.mkfs(&args);
    for (k, v) in config {
        fs.set_config(k, v);
    }
    fs.mount();
    fs
}

/// Creates (truncating) `p` with `data`, without fsync.
fn write_file(p: &Path, data: &[u8]) {
    let mut f = File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

/// Writes `data` at `off` in `p` (created if missing, not truncated).
fn write_at(p: &Path, off: u64, data: &[u8]) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)?
        .write_all_at(data, off)
}

/// Checks every file of `want` (paths relative to `root`).
#[track_caller]
fn assert_files_at(root: &Path, want: &Files, ctx: &str) {
    for (p, data) in want {
        assert_file(&root.join(p), data, ctx);
    }
}

/// The space numbers of `cairn info --json`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Space {
    chunks: u64,
    unique: u64,
    referenced: u64,
    stored: u64,
    physical: u64,
    index: u64,
    segments: u64,
    segment_size: u64,
}

impl Space {
    /// Live bytes over the bytes of the segments that hold them.
    fn fill(&self) -> f64 {
        self.physical as f64 / (self.segments.max(1) * self.segment_size) as f64
    }
}

/// `cairn info TARGET --json`, with the invariants that hold for any pool:
/// every stored chunk is referenced at least once, and the ratios are the
/// quotients they are documented to be.
#[track_caller]
fn info(target: &Path) -> (Space, Json) {
    let j = pool_info(target);
    let s = Space {
        chunks: field_u64(&j, "chunks"),
        unique: field_u64(&j, "unique_bytes"),
        referenced: field_u64(&j, "referenced_bytes"),
        stored: field_u64(&j, "stored_bytes"),
        physical: field_u64(&j, "physical_bytes"),
        index: field_u64(&j, "index_entries"),
        segments: field_u64(&j, "segments"),
        segment_size: field_u64(&j, "segment_size"),
    };
    field_u64(&j, "logical_bytes");
    field_u64(&j, "index_ram_bytes");
    field_bool(&j, "dedup_enabled");
    field_str(&j, "compression");
    assert!(
        s.unique <= s.referenced,
        "info: unique_bytes {} > referenced_bytes {}: {j:?}",
        s.unique,
        s.referenced
    );
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
    if s.unique > 0 {
        let d = field_f64(&j, "dedup_ratio");
        assert!(
            close(d, s.referenced as f64 / s.unique as f64),
            "info: dedup_ratio {d} is not referenced/unique: {j:?}"
        );
    }
    if s.stored > 0 {
        let c = field_f64(&j, "compression_ratio");
        assert!(
            close(c, s.unique as f64 / s.stored as f64),
            "info: compression_ratio {c} is not unique/stored: {j:?}"
        );
    }
    (s, j)
}

/// `cairn sync` then the info numbers.
#[track_caller]
fn synced_space(m: &Path) -> Space {
    sync_tid(m);
    info(m).0
}

/// `cairn prune TARGET --keep-history 0 --json`.
#[track_caller]
fn prune0(target: &Path) -> Json {
    let j = cairn_json(&[
        os("prune"),
        target.as_os_str(),
        os("--keep-history"),
        os("0"),
        os("--json"),
    ]);
    field_u64(&j, "chunks_freed");
    j
}

/// `cairn gc TARGET ARGS... --json`, checking the report's fields.
#[track_caller]
fn gc_json(target: &Path, args: &[&str]) -> Json {
    let mut all: Vec<&OsStr> = vec![os("gc"), target.as_os_str()];
    all.extend(args.iter().map(|a| os(a)));
    all.push(os("--json"));
    let j = cairn_json(&all);
    check_gc_report(&j);
    j
}

#[track_caller]
fn check_gc_report(j: &Json) {
    for k in [
        "segments_rewritten",
        "files_rewritten",
        "chunks_moved",
        "bytes_moved",
        "segments_freed",
    ] {
        field_u64(j, k);
    }
    assert_eq!(
        field_u64(j, "files_rewritten"),
        0,
        "gc rewrote files: {j:?}"
    );
    assert!(field_arr(j, "damaged").is_empty(), "gc found damage: {j:?}");
}

/// `cairn scrub TARGET --json`: (exit code, report). The code must be 0
/// without damage and 3 with.
#[track_caller]
fn scrub(target: &Path) -> (i32, Json) {
    let args = [os("scrub"), target.as_os_str(), os("--json")];
    let out = cairn(&args);
    let j = parse_json_out(&args, &out);
    let code = out.status.code().unwrap_or(-1);
    field_u64(&j, "chunks");
    field_u64(&j, "bytes");
    let damaged = field_arr(&j, "damaged").len();
    let want = if damaged == 0 { 0 } else { 3 };
    assert_eq!(
        code,
        want,
        "{}: exit status with {damaged} damaged chunks\n{}",
        shown(&args),
        describe(&out)
    );
    (code, j)
}

/// The `damaged` lines of a scrub report.
fn damaged(j: &Json) -> Vec<String> {
    field_arr(j, "damaged")
        .iter()
        .map(|d| {
            d.as_str()
                .unwrap_or_else(|| panic!("damaged entry is not a string: {j:?}"))
                .to_string()
        })
        .collect()
}

/// Scrub that must find nothing; returns the number of chunks read.
#[track_caller]
fn scrub_clean(target: &Path, ctx: &str) -> u64 {
    let (_, j) = scrub(target);
    assert!(damaged(&j).is_empty(), "{ctx}: scrub found damage: {j:?}");
    field_u64(&j, "chunks")
}

/// Every offset of each needle in the segment slots of the device file
/// at `dev` (not the intent log's copy before them), in one pass (reads
/// 8 MiB at a time, skipping all-zero stretches quickly).
fn find_in_device(dev: &Path, needles: &[&[u8]]) -> Vec<Vec<u64>> {
    let f = File::open(dev).unwrap();
    let len = f.metadata().unwrap().len();
    let nmax = needles.iter().map(|n| n.len()).max().unwrap();
    let step = 8 * MIB;
    let mut buf = vec![0u8; step + nmax];
    let mut hits = vec![Vec::new(); needles.len()];
    // Stored data only (not the intent log's copy before the slots).
    let mut off = data_offset(dev);
    while off < len {
        let n = f.read_at(&mut buf, off).unwrap();
        if buf[..n].iter().any(|b| *b != 0) {
            for (k, needle) in needles.iter().enumerate() {
                let first = needle[0];
                for i in 0..step.min(n) {
                    if buf[i] == first
                        && i + needle.len() <= n
                        && &buf[i..i + needle.len()] == *needle
                    {
                        hits[k].push(off + i as u64);
                    }
                }
            }
        }
        off += step as u64;
    }
    hits
}

/// Inverts the byte at `off` of the file at `dev`.
fn flip_byte(dev: &Path, off: u64) {
    let f = OpenOptions::new().read(true).write(true).open(dev).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    b[0] ^= 0xff;
    f.write_all_at(&b, off).unwrap();
    f.sync_all().unwrap();
}

/// `len` bytes at `off` of `p`, read with readahead off and the page cache
/// dropped, so the daemon is asked for exactly this range.
fn pread_uncached(p: &Path, off: u64, len: usize) -> io::Result<Vec<u8>> {
    let f = File::open(p)?;
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
    }
    let mut v = vec![0u8; len];
    let n = f.read_at(&mut v, off)?;
    v.truncate(n);
    Ok(v)
}

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "segment",
    "chunk",
    "header",
    "pool",
    "device",
    "commit",
    "flush",
    "history",
    "snapshot",
    "prune",
    "element",
    "extent",
    "inode",
    "directory",
    "checksum",
    "transaction",
    "reference",
    "count",
    "dedup",
    "index",
    "compression",
    "block",
    "record",
    "daemon",
    "mount",
    "write",
    "read",
    "error",
    "warning",
    "info",
    "debug",
    "moved",
    "freed",
    "bytes",
    "live",
    "sealed",
    "open",
    "slot",
    "class",
    "nvme",
    "ssd",
    "hdd",
    "tid",
    "time",
];

/// Deterministic log-like text: compresses well, never repeats a block.
fn text(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(len + 256);
    let mut line = 0u64;
    while out.len() < len {
        line += 1;
        let lvl = ["INFO", "WARN", "DEBUG", "ERROR"].choose(&mut rng).unwrap();
        write!(out, "{seed:x}-{line:08} {lvl} ").unwrap();
        for _ in 0..rng.gen_range(4..14) {
            out.extend_from_slice(WORDS.choose(&mut rng).unwrap().as_bytes());
            out.push(b' ');
        }
        writeln!(out, "{}", rng.gen_range(0..100_000)).unwrap();
    }
    out.truncate(len);
    out
}

// ================================================ 1. reference count model

const MODEL_DIRS: &[&str] = &["", "d1", "d2/sub"];
const MODEL_NAMES: &[&str] = &["f0", "f1", "f2", "f3", "f4", "f5"];
/// Distinct block contents that full-block writes draw from.
const POOL_BLOCKS: usize = 10;
/// Files stay within this many blocks (plus a little).
const MAX_BLOCKS: u64 = 8;
const MAX_SNAPS: usize = 4;

struct Model {
    rng: StdRng,
    blocks: Vec<Vec<u8>>,
    live: Files,
    snaps: BTreeMap<String, Files>,
    next_snap: usize,
    log: Vec<String>,
    /// How many ops of each kind ran (to show the mix is real).
    stats: BTreeMap<&'static str, usize>,
}

impl Model {
    fn paths() -> Vec<String> {
        let mut v = Vec::new();
        for d in MODEL_DIRS {
            for n in MODEL_NAMES {
                v.push(if d.is_empty() {
                    n.to_string()
                } else {
                    format!("{d}/{n}")
                });
            }
        }
        v
    }

    fn any_path(&mut self) -> String {
        let existing: Vec<String> = self.live.keys().cloned().collect();
        if !existing.is_empty() && self.rng.gen_bool(0.6) {
            existing.choose(&mut self.rng).unwrap().clone()
        } else {
            Model::paths().choose(&mut self.rng).unwrap().clone()
        }
    }

    fn existing(&mut self) -> Option<String> {
        let v: Vec<&String> = self.live.keys().collect();
        v.choose(&mut self.rng).map(|s| s.to_string())
    }

    fn other_path(&mut self, not: &str) -> String {
        loop {
            let p = self.any_path();
            if p != not {
                return p;
            }
        }
    }

    fn note(&mut self, kind: &'static str, what: String) {
        *self.stats.entry(kind).or_default() += 1;
        self.log.push(what);
        if self.log.len() > 25 {
            self.log.remove(0);
        }
    }

    fn recent(&self) -> String {
        self.log.join("\n  ")
    }

    /// One random operation, on the mount and on the model.
    fn step(&mut self, m: &Path, ctx: &str) {
        let roll = self.rng.gen_range(0..100);
        let r = match roll {
            0..=34 => self.write_blocks(m),
            35..=44 => self.write_unaligned(m),
            45..=53 => self.truncate(m),
            54..=63 => self.copy(m),
            64..=71 => self.delete(m),
            72..=79 => self.rename(m),
            80..=85 => {
                self.snapshot_create(m);
                Ok(())
            }
            86..=89 => {
                self.snapshot_delete(m);
                Ok(())
            }
            90..=92 => {
                let j = prune0(m);
                self.note("prune", format!("prune --keep-history 0 -> {j:?}"));
                Ok(())
            }
            93..=94 => {
                // Moves chunks that the index, live files, history and
                // snapshots share: dedup must keep finding them.
                let j = gc_json(m, &["--max-live", "100"]);
                self.note("gc", format!("gc --max-live 100 -> {j:?}"));
                Ok(())
            }
            _ => {
                let tid = sync_tid(m);
                self.note("sync", format!("sync -> {tid:#x}"));
                Ok(())
            }
        };
        if let Err(e) = r {
            panic!(
                "{ctx}: {} failed: {e}\nrecent ops:\n  {}",
                self.log.last().unwrap(),
                self.recent()
            );
        }
    }

    fn write_blocks(&mut self, m: &Path) -> io::Result<()> {
        let p = self.any_path();
        let blk = self.rng.gen_range(0..MAX_BLOCKS);
        let n = self.rng.gen_range(1..=3u64).min(MAX_BLOCKS - blk);
        let ids: Vec<usize> = (0..n).map(|_| self.rng.gen_range(0..POOL_BLOCKS)).collect();
        let data: Vec<u8> = ids.iter().flat_map(|&i| self.blocks[i].clone()).collect();
        let off = blk * B;
        self.note(
            "write-blocks",
            format!("write blocks {ids:?} at block {blk} of {p}"),
        );
        self.write_maybe_synced(&m.join(&p), off, &data)?;
        model_write(self.live.entry(p).or_default(), off, &data);
        Ok(())
    }

    fn write_unaligned(&mut self, m: &Path) -> io::Result<()> {
        let p = self.any_path();
        let size = self.live.get(&p).map_or(0, |v| v.len() as u64);
        let off = self.rng.gen_range(0..=(size + B).min(MAX_BLOCKS * B));
        let len = self.rng.gen_range(1..2 * BLOCK);
        // A slice of two pool blocks: dedups again when it lands aligned.
        let (a, b) = (
            self.rng.gen_range(0..POOL_BLOCKS),
            self.rng.gen_range(0..POOL_BLOCKS),
        );
        let src: Vec<u8> = [self.blocks[a].clone(), self.blocks[b].clone()].concat();
        let s = self.rng.gen_range(0..=src.len() - len);
        let data = src[s..s + len].to_vec();
        self.note(
            "write-unaligned",
            format!("write {len} bytes (blocks {a},{b} from {s}) at {off} of {p}"),
        );
        self.write_maybe_synced(&m.join(&p), off, &data)?;
        model_write(self.live.entry(p).or_default(), off, &data);
        Ok(())
    }

    /// Writes at `off`; one time in four fsyncs, so that the file's change
    /// is a commit of its own (more versions in history to dedup against).
    fn write_maybe_synced(&mut self, p: &Path, off: u64, data: &[u8]) -> io::Result<()> {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)?;
        f.write_all_at(data, off)?;
        if self.rng.gen_bool(0.25) {
            f.sync_all()?;
        }
        Ok(())
    }

    fn truncate(&mut self, m: &Path) -> io::Result<()> {
        let Some(p) = self.existing() else {
            return self.write_blocks(m);
        };
        let size = self.live[&p].len() as u64;
        let len = match self.rng.gen_range(0..10) {
            0 => 0,
            1..=4 => self.rng.gen_range(0..=MAX_BLOCKS) * B,
            _ => self.rng.gen_range(0..=size + B),
        };
        self.note("truncate", format!("truncate {p} to {len} (was {size})"));
        OpenOptions::new()
            .write(true)
            .open(m.join(&p))?
            .set_len(len)?;
        self.live.get_mut(&p).unwrap().resize(len as usize, 0);
        Ok(())
    }

    fn copy(&mut self, m: &Path) -> io::Result<()> {
        let Some(a) = self.existing() else {
            return self.write_blocks(m);
        };
        let b = self.other_path(&a);
        self.note("copy", format!("copy {a} -> {b}"));
        let data = self.live[&a].clone();
        fs::write(m.join(&b), &data)?;
        self.live.insert(b, data);
        Ok(())
    }

    fn delete(&mut self, m: &Path) -> io::Result<()> {
        let Some(a) = self.existing() else {
            return self.write_blocks(m);
        };
        self.note("delete", format!("delete {a}"));
        fs::remove_file(m.join(&a))?;
        self.live.remove(&a);
        Ok(())
    }

    fn rename(&mut self, m: &Path) -> io::Result<()> {
        let Some(a) = self.existing() else {
            return self.write_blocks(m);
        };
        let b = self.other_path(&a);
        self.note("rename", format!("rename {a} -> {b}"));
        fs::rename(m.join(&a), m.join(&b))?;
        let data = self.live.remove(&a).unwrap();
        self.live.insert(b, data);
        Ok(())
    }

    fn snapshot_create(&mut self, m: &Path) {
        if self.snaps.len() >= MAX_SNAPS {
            let tid = sync_tid(m);
            self.note("sync", format!("sync -> {tid:#x}"));
            return;
        }
        let name = format!("s{}", self.next_snap);
        self.next_snap += 1;
        self.note("snapshot-create", format!("snapshot create {name}"));
        snapshot_create(m, &name);
        self.snaps.insert(name, self.live.clone());
    }

    fn snapshot_delete(&mut self, m: &Path) {
        let names: Vec<&String> = self.snaps.keys().collect();
        let Some(name) = names.choose(&mut self.rng).map(|s| s.to_string()) else {
            return;
        };
        self.note("snapshot-delete", format!("snapshot delete {name}"));
        cairn_ok(&[os("snapshot"), os("delete"), m.as_os_str(), os(&name)]);
        self.snaps.remove(&name);
    }

    /// The live tree and every snapshot view against the model.
    fn verify(&self, m: &Path, ctx: &str) {
        let with_log = |what: &str| format!("{what}\nrecent ops:\n  {}", self.recent());
        let got = contents_at(m, ctx);
        if got != self.live {
            let msg = with_log(&format!("{ctx}: live tree"));
            assert_contents_eq(&got, &self.live, &msg);
        }
        let names: BTreeSet<String> = snapshot_list(m)
            .iter()
            .map(|e| field_str(e, "name").to_string())
            .collect();
        let want: BTreeSet<String> = self.snaps.keys().cloned().collect();
        assert_eq!(names, want, "{ctx}: snapshot list");
        for (name, files) in &self.snaps {
            let got = contents_at(&snap_root(m, name), ctx);
            if &got != files {
                let msg = with_log(&format!("{ctx}: .snapshots/{name}"));
                assert_contents_eq(&got, files, &msg);
            }
        }
    }

    /// Distinct block contents, among the live tree and the snapshots, that
    /// need a stored chunk of a whole block: full blocks whose last byte is
    /// not zero (a shorter chunk cannot produce them).
    fn full_blocks(&self) -> usize {
        let mut set: HashSet<&[u8]> = HashSet::new();
        for files in std::iter::once(&self.live).chain(self.snaps.values()) {
            for data in files.values() {
                for c in data.chunks(BLOCK) {
                    if c.len() == BLOCK && c[BLOCK - 1] != 0 {
                        set.insert(c);
                    }
                }
            }
        }
        set.len()
    }
}

fn model_write(v: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if v.len() < end {
        v.resize(end, 0);
    }
    v[off as usize..end].copy_from_slice(data);
}

/// Runs the model on a fresh pool with `config`: batches of random ops,
/// each batch checked against the model and `cairn info`; a remount every
/// fourth batch; at the end check, scrub, and deleting everything must leave
/// nothing stored.
fn run_model(label: &str, config: &[(&str, &str)]) {
    let seed = seed();
    let batches = env_usize("CAIRN_DEDUP_BATCHES", 24).max(4);
    println!("{label}: CAIRN_SEED={seed}, {batches} batches");
    let mut config = config.to_vec();
    config.push(("gc_interval_secs", "0"));
    let mut fs = pool_with("2G", &[], &config);
    let m = fs.mnt.clone();
    for d in MODEL_DIRS.iter().filter(|d| !d.is_empty()) {
        fs::create_dir_all(m.join(d)).unwrap();
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let blocks = (0..POOL_BLOCKS)
        .map(|_| pattern(rng.gen(), BLOCK))
        .collect();
    let mut model = Model {
        rng,
        blocks,
        live: Files::new(),
        snaps: BTreeMap::new(),
        next_snap: 0,
        log: Vec::new(),
        stats: BTreeMap::new(),
    };
    for b in 0..batches {
        let ctx = format!("{label}: CAIRN_SEED={seed} batch {b}");
        for _ in 0..40 {
            model.step(&m, &ctx);
        }
        model.verify(&m, &ctx);
        let s = synced_space(&m);
        assert_eq!(
            s.index, s.chunks,
            "{ctx}: with dedup always on, every stored chunk is indexed once \
             (otherwise equal content is stored twice): {s:?}"
        );
        let need = model.full_blocks() as u64;
        // Each distinct block needs a chunk of its own (a block overwritten
        // in part is its old chunk with pieces over it, so distinct blocks
        // can share bytes: unique bytes may be below need * B).
        assert!(
            s.chunks >= need,
            "{ctx}: the live tree and snapshots hold {need} distinct full blocks, \
             but info shows {s:?}"
        );
        if b % 4 == 3 {
            fs.remount();
            model.verify(&m, &format!("{ctx}, after remount"));
            assert_eq!(info(&m).0, s, "{ctx}: info changed across a remount");
        }
    }
    println!("{label}: op mix: {:?}", model.stats);
    for kind in [
        "write-blocks",
        "copy",
        "snapshot-create",
        "snapshot-delete",
        "prune",
        "rename",
        "gc",
    ] {
        assert!(
            model.stats.get(kind).copied().unwrap_or(0) > 0,
            "{label}: CAIRN_SEED={seed}: no {kind} op ran: {:?}",
            model.stats
        );
    }
    let ctx = format!("{label}: CAIRN_SEED={seed} end");
    fs.unmount();
    fs.check();
    fs.mount();
    model.verify(&m, &format!("{ctx}, after check and remount"));
    scrub_clean(&m, &ctx);

    // Delete everything, every snapshot, all history: nothing stays stored.
    for p in model.live.keys() {
        fs::remove_file(m.join(p)).unwrap();
    }
    for name in model.snaps.keys() {
        cairn_ok(&[os("snapshot"), os("delete"), m.as_os_str(), os(name)]);
    }
    prune0(&m);
    let s = synced_space(&m);
    assert_eq!(
        (s.chunks, s.unique, s.referenced, s.index),
        (0, 0, 0, 0),
        "{ctx}: after deleting all files and snapshots and pruning all history, \
         chunks/unique/referenced/index_entries must be 0: {s:?}"
    );
    assert_eq!(
        (s.stored, s.physical),
        (0, 0),
        "{ctx}: stored/physical bytes left after everything was freed: {s:?}"
    );
    fs.finish();
}

#[test]
fn refcount_model_with_snapshots_and_prune() {
    run_model("refcount model", &[]);
}

/// Every commit prunes the history it ends (retention 0), in the same
/// transaction that adds dedup references to the same chunks.
#[test]
fn refcount_model_with_retention_0() {
    run_model(
        "refcount model, history_retention_secs = 0",
        &[("history_retention_secs", "0")],
    );
}

// ======================================== 2. dedup accounting, on and off

/// Asserts chunks, unique, referenced and stored/physical (raw chunks).
#[track_caller]
fn expect_space(s: &Space, chunks: u64, unique: u64, referenced: u64, what: &str) {
    let stored = unique + chunks * HDR;
    assert_eq!(
        (s.chunks, s.unique, s.referenced, s.stored, s.physical),
        (chunks, unique, referenced, stored, stored),
        "{what}: (chunks, unique, referenced, stored, physical) of {s:?}"
    );
}

#[test]
fn dedup_across_files_within_files_history_and_snapshots() {
    let fs = pool_with("1G", &["--compression", "none"], &[]);
    let m = fs.mnt.clone();
    fs::create_dir(m.join("d1")).unwrap();
    let (_, j) = info(&m);
    assert!(
        field_bool(&j, "dedup_enabled"),
        "dedup is on by default: {j:?}"
    );
    assert_eq!(field_str(&j, "compression"), "none", "{j:?}");
    let s = synced_space(&m);
    expect_space(&s, 0, 0, 0, "empty pool");
    assert_eq!(s.index, 0, "empty pool: {s:?}");

    let a = pattern(1, 16 * BLOCK);
    let x = pattern(2, BLOCK);
    let y = pattern(3, BLOCK);
    let (z, w) = (pattern(4, BLOCK), pattern(5, BLOCK));
    let t = pattern(6, 100_000);
    let t_tail = (100_000 - BLOCK) as u64;

    // One file: everything is new.
    write_file(&m.join("a"), &a);
    let s = synced_space(&m);
    expect_space(&s, 16, 16 * B, 16 * B, "a");
    assert_eq!(s.index, 16, "a: one index entry per chunk: {s:?}");

    // Across files: a copy costs references only.
    write_file(&m.join("b"), &a);
    let s = synced_space(&m);
    expect_space(&s, 16, 16 * B, 32 * B, "b = copy of a");
    assert_eq!(s.index, 16, "{s:?}");

    // Within a file: one block repeated 32 times is stored once.
    write_file(&m.join("d1/c"), &x.repeat(32));
    let s = synced_space(&m);
    expect_space(&s, 17, 17 * B, 64 * B, "d1/c = x * 32");

    // Mixed, in one commit: blocks of a, x twice, and one new block.
    let e = [&a[0..BLOCK], &x, &a[5 * BLOCK..6 * BLOCK], &x, &y].concat();
    write_file(&m.join("e"), &e);
    let s = synced_space(&m);
    expect_space(&s, 18, 18 * B, 69 * B, "e = a0 x a5 x y");

    // A file with a partial last block, twice: both blocks dedup.
    write_file(&m.join("t1"), &t);
    write_file(&m.join("d1/t2"), &t);
    let s = synced_space(&m);
    let (mut unique, mut refd) = (19 * B + t_tail, 69 * B + 200_000);
    expect_space(&s, 20, unique, refd, "t1, d1/t2 (100000 bytes each)");
    assert_eq!(s.index, 20, "{s:?}");

    // Against history: z is overwritten (kept by history), then written
    // again elsewhere.
    write_file(&m.join("f"), &z);
    let s = synced_space(&m);
    unique += B;
    refd += B;
    expect_space(&s, 21, unique, refd, "f = z");
    OpenOptions::new()
        .write(true)
        .open(m.join("f"))
        .unwrap()
        .write_all_at(&w, 0)
        .unwrap();
    let s = synced_space(&m);
    unique += B;
    refd += B;
    expect_space(&s, 22, unique, refd, "f overwritten with w (z in history)");
    write_file(&m.join("g"), &z);
    let s = synced_space(&m);
    refd += B;
    expect_space(&s, 22, unique, refd, "g = z, only in history until now");
    prune0(&m);
    let s = synced_space(&m);
    refd -= B;
    expect_space(&s, 22, unique, refd, "after prune: z kept by g alone");
    assert_file(&m.join("g"), &z, "g");
    assert_file(&m.join("f"), &w, "f");

    // Against snapshots: x, y and z remain only in snapshot s1; writing
    // them again costs nothing.
    snapshot_create(&m, "s1");
    for f in ["d1/c", "e", "g"] {
        fs::remove_file(m.join(f)).unwrap();
    }
    prune0(&m);
    let s = synced_space(&m);
    expect_space(&s, 22, unique, refd, "s1 keeps d1/c, e, g after prune");
    write_file(&m.join("h"), &[&x[..], &z].concat());
    let s = synced_space(&m);
    refd += 2 * B;
    expect_space(&s, 22, unique, refd, "h = x z (held only by s1 until now)");
    let snap = snap_root(&m, "s1");
    assert_file(&snap.join("d1/c"), &x.repeat(32), ".snapshots/s1/d1/c");
    assert_file(&snap.join("e"), &e, ".snapshots/s1/e");
    assert_file(&snap.join("g"), &z, ".snapshots/s1/g");
    // Deleting the snapshot frees what only it used (y); x and z stay for h.
    cairn_ok(&[os("snapshot"), os("delete"), m.as_os_str(), os("s1")]);
    prune0(&m);
    let s = synced_space(&m);
    unique -= B;
    refd -= 32 * B + 5 * B + B;
    expect_space(&s, 21, unique, refd, "s1 deleted and pruned");
    assert_eq!(s.index, 21, "{s:?}");

    let want: Files = [
        ("a", a.clone()),
        ("b", a.clone()),
        ("t1", t.clone()),
        ("d1/t2", t.clone()),
        ("f", w.clone()),
        ("h", [&x[..], &z].concat()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_contents_eq(&contents_at(&m, "end"), &want, "dedup pool at the end");
    fs.finish();
}

#[test]
fn dedup_off_stores_every_copy() {
    let fs = pool_with("1G", &["--compression", "none"], &[("dedup", "false")]);
    let m = fs.mnt.clone();
    let (_, j) = info(&m);
    assert!(
        !field_bool(&j, "dedup_enabled"),
        "dedup = false in cairn.toml: {j:?}"
    );
    let a = pattern(11, 16 * BLOCK);
    write_file(&m.join("a"), &a);
    let s = synced_space(&m);
    expect_space(&s, 16, 16 * B, 16 * B, "dedup off: a");
    write_file(&m.join("b"), &a);
    let s = synced_space(&m);
    expect_space(&s, 32, 32 * B, 32 * B, "dedup off: b = copy of a");
    let x = pattern(12, BLOCK);
    write_file(&m.join("c"), &x.repeat(8));
    let s = synced_space(&m);
    expect_space(&s, 40, 40 * B, 40 * B, "dedup off: c = x * 8");
    assert_eq!(s.index, 0, "dedup off: nothing is indexed: {s:?}");
    let (_, j) = info(&m);
    assert!(
        (field_f64(&j, "dedup_ratio") - 1.0).abs() < 1e-9,
        "dedup off: ratio must be 1: {j:?}"
    );
    assert_file(&m.join("a"), &a, "a");
    assert_file(&m.join("b"), &a, "b");
    assert_file(&m.join("c"), &x.repeat(8), "c");
    fs.finish();
}

// ============================================================ 3. compression

/// Bytes written and what they cost: (raw delta, stored delta, chunk delta).
fn cost(before: &Space, after: &Space) -> (u64, u64, u64) {
    (
        after.unique - before.unique,
        after.stored - before.stored,
        after.chunks - before.chunks,
    )
}

/// Writes `data` to `p`, commits, and returns (raw, stored, chunks) it added.
fn write_cost(m: &Path, p: &str, data: &[u8]) -> (u64, u64, u64) {
    let before = synced_space(m);
    write_file(&m.join(p), data);
    let after = synced_space(m);
    cost(&before, &after)
}

/// Random blocks whose first `zeros` bytes are zero.
fn partly_zero(seed: u64, blocks: usize, zeros: usize) -> Vec<u8> {
    (0..blocks)
        .flat_map(|b| {
            let mut v = pattern(seed * 100 + b as u64, BLOCK);
            v[..zeros].fill(0);
            v
        })
        .collect()
}

#[test]
fn compression_none_lz4_zstd() {
    let mut ratios = BTreeMap::new();
    for method in ["none", "lz4", "zstd"] {
        let ctx = format!("--compression {method}");
        let fs = pool_with("1G", &["--compression", method], &[]);
        let m = fs.mnt.clone();
        let (_, j) = info(&m);
        let shown = field_str(&j, "compression");
        assert!(
            shown == method || (method == "zstd" && shown.starts_with("zstd")),
            "{ctx}: info compression {shown:?}"
        );
        let corpus = text(1, 4 * MIB);
        let random = pattern(2, 2 * MIB);
        // 4 KiB of zeros in 64: saves ~6%, less than 1/8: stored raw.
        let barely = partly_zero(3, 8, 4 * KIB);
        // 24 KiB of zeros: saves ~37%: compressed unless "none".
        let some = partly_zero(4, 8, 24 * KIB);
        let (raw, stored, n) = write_cost(&m, "corpus.txt", &corpus);
        assert_eq!((raw, n), (4 * MIB as u64, 64), "{ctx}: corpus");
        let ratio = raw as f64 / stored as f64;
        ratios.insert(method, ratio);
        if method == "none" {
            assert_eq!(stored, raw + n * HDR, "{ctx}: corpus stored raw");
        } else {
            assert!(
                ratio > 1.5,
                "{ctx}: text compresses {ratio:.2}x ({raw} -> {stored})"
            );
        }
        // Dedup works on raw content, whatever the stored form.
        let copy = write_cost(&m, "corpus-copy.txt", &corpus);
        assert_eq!(
            copy,
            (0, 0, 0),
            "{ctx}: a copy of the corpus must cost nothing"
        );
        let (raw, stored, n) = write_cost(&m, "random.bin", &random);
        assert_eq!(
            (raw, stored, n),
            (2 * MIB as u64, 2 * MIB as u64 + 32 * HDR, 32),
            "{ctx}: random data must be stored raw (1.0x)"
        );
        let (raw, stored, n) = write_cost(&m, "barely.bin", &barely);
        assert_eq!(
            (raw, stored, n),
            (8 * B, 8 * (B + HDR), 8),
            "{ctx}: blocks that shrink by less than 1/8 must be stored raw"
        );
        let (raw, stored, n) = write_cost(&m, "some.bin", &some);
        assert_eq!((raw, n), (8 * B, 8), "{ctx}: some.bin");
        if method == "none" {
            assert_eq!(stored, raw + n * HDR, "{ctx}: some.bin stored raw");
        } else {
            assert!(
                stored < 8 * (B * 7 / 8 + HDR),
                "{ctx}: blocks that shrink by 3/8 must be compressed ({raw} -> {stored})"
            );
        }
        let (s, j) = info(&m);
        let overall = field_f64(&j, "compression_ratio");
        if method == "none" {
            assert!(
                (0.99..=1.0).contains(&overall),
                "{ctx}: compression_ratio {overall}: {j:?}"
            );
        } else {
            assert!(overall > 1.2, "{ctx}: compression_ratio {overall}: {j:?}");
        }
        let want: Files = [
            ("corpus-copy.txt", corpus.clone()),
            ("corpus.txt", corpus),
            ("random.bin", random),
            ("barely.bin", barely),
            ("some.bin", some),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_contents_eq(&contents_at(&m, &ctx), &want, &ctx);
        assert_eq!(scrub_clean(&m, &ctx), s.chunks, "{ctx}: scrub chunk count");
        fs.finish();
    }
    println!("text compression ratios: {ratios:?}");
    assert!(
        ratios["zstd"] >= ratios["lz4"],
        "zstd should compress this text at least as well as lz4: {ratios:?}"
    );
}

#[test]
fn compression_changes_across_remounts() {
    let mut fs = pool_with("1G", &["--compression", "none"], &[]);
    let m = fs.mnt.clone();
    let mut want = Files::new();
    let mut ratios = Vec::new();
    // (how the setting is made, what info shows)
    let phases: [(&str, &str); 4] = [
        ("mkfs --compression none", "none"),
        ("mount --compression lz4", "lz4"),
        ("cairn.toml compression = \"zstd:9\"", "zstd:9"),
        ("cairn.toml compression = \"none\"", "none"),
    ];
    for (i, (how, shown)) in phases.iter().enumerate() {
        let ctx = format!("phase {i} ({how})");
        match i {
            0 => {}
            1 => {
                fs.unmount();
                fs.mount_args = vec!["--compression".into(), "lz4".into()];
                fs.mount();
            }
            _ => {
                fs.unmount();
                fs.mount_args.clear();
                fs.set_config("compression", &format!("\"{shown}\""));
                fs.mount();
            }
        }
        let (_, j) = info(&m);
        assert_eq!(field_str(&j, "compression"), *shown, "{ctx}: {j:?}");
        // Everything written before reads back exact, whatever its method.
        assert_contents_eq(&contents_at(&m, &ctx), &want, &format!("{ctx}: old files"));
        let t = text(100 + i as u64, 2 * MIB);
        let (raw, stored, n) = write_cost(&m, &format!("p{i}.txt"), &t);
        want.insert(format!("p{i}.txt"), t);
        let ratio = raw as f64 / stored as f64;
        ratios.push((shown.to_string(), ratio));
        if *shown == "none" {
            assert_eq!(stored, raw + n * HDR, "{ctx}: text stored raw");
        } else {
            assert!(ratio > 1.5, "{ctx}: text compresses only {ratio:.2}x");
        }
        let r = pattern(200 + i as u64, MIB);
        let (raw, stored, n) = write_cost(&m, &format!("p{i}.bin"), &r);
        assert_eq!(stored, raw + n * HDR, "{ctx}: random data stored raw");
        want.insert(format!("p{i}.bin"), r);
        if i == 2 {
            // Half of the raw text of phase 0 rewritten: one file, two methods.
            let half = text(300, MIB);
            let f = OpenOptions::new()
                .write(true)
                .open(m.join("p0.txt"))
                .unwrap();
            f.write_all_at(&half, 0).unwrap();
            drop(f);
            want.get_mut("p0.txt").unwrap()[..MIB].copy_from_slice(&half);
        }
        sync_tid(&m);
        assert_contents_eq(&contents_at(&m, &ctx), &want, &format!("{ctx}: all files"));
    }
    println!("text compression by phase: {ratios:?}");
    assert!(
        ratios[2].1 > ratios[1].1,
        "zstd:9 should compress text better than lz4: {ratios:?}"
    );
    fs.unmount();
    fs.check();
    fs.mount();
    assert_contents_eq(
        &contents_at(&m, "final remount"),
        &want,
        "after the final remount",
    );
    let (s, _) = info(&m);
    assert_eq!(scrub_clean(&m, "final"), s.chunks, "scrub chunk count");
    fs.finish();
}

/// Text and random files alternately in one commit (so they share
/// segments); returns the text files.
fn text_and_random(m: &Path, from: usize, to: usize) -> Files {
    let mut texts = Files::new();
    for i in from..to {
        let t = text(500 + i as u64, 256 * KIB);
        write_file(&m.join(format!("t{i:02}")), &t);
        write_file(
            &m.join(format!("r{i:02}")),
            &pattern(600 + i as u64, 256 * KIB),
        );
        texts.insert(format!("t{i:02}"), t);
    }
    sync_tid(m);
    texts
}

fn remove_random(m: &Path, from: usize, to: usize) {
    for i in from..to {
        fs::remove_file(m.join(format!("r{i:02}"))).unwrap();
    }
    prune0(m);
}

/// GC moves chunks: their content and their stored (compressed) form stay,
/// also after the pool's compression setting changed.
#[test]
fn gc_moves_compressed_chunks_as_stored() {
    let mut fs = pool_with(
        "1G",
        &["--compression", "zstd"],
        &[("gc_interval_secs", "0")],
    );
    let m = fs.mnt.clone();
    // Same setting as the chunks were written with.
    let mut texts = text_and_random(&m, 0, 16);
    remove_random(&m, 0, 16);
    let before = synced_space(&m);
    let j = gc_json(&m, &["--max-live", "100"]);
    assert!(field_u64(&j, "chunks_moved") > 0, "gc moved nothing: {j:?}");
    let after = synced_space(&m);
    assert_eq!(
        (after.chunks, after.unique, after.stored),
        (before.chunks, before.unique, before.stored),
        "gc (same compression setting) changed the stored chunks: {before:?} -> {after:?}: {j:?}"
    );
    assert!(after.segments < before.segments, "{before:?} -> {after:?}");
    assert_contents_eq(&contents_at(&m, "after gc"), &texts, "after gc");
    // Setting changed to none: gc must not inflate zstd chunks it moves.
    texts.extend(text_and_random(&m, 16, 32));
    remove_random(&m, 16, 32);
    fs.unmount();
    fs.set_config("compression", "\"none\"");
    fs.mount();
    let before = synced_space(&m);
    let j = gc_json(&m, &["--max-live", "100"]);
    assert!(field_u64(&j, "chunks_moved") > 0, "gc moved nothing: {j:?}");
    let after = synced_space(&m);
    assert_contents_eq(
        &contents_at(&m, "after gc"),
        &texts,
        "after gc, setting none",
    );
    scrub_clean(&m, "after gc, setting none");
    assert_eq!(
        (after.chunks, after.unique),
        (before.chunks, before.unique),
        "{before:?} -> {after:?}"
    );
    assert!(
        after.stored <= before.stored,
        "gc with compression = none stored the zstd chunks it moved uncompressed: \
         stored_bytes {} -> {} ({before:?} -> {after:?}; gc: {j:?})",
        before.stored,
        after.stored
    );
    fs.finish();
}

// ========================================================= 4. GC under load

/// Writes `files` files of `blocks` blocks in `dir`, one block of every
/// file per commit, so that each segment mixes all files. Returns the
/// contents (paths relative to the mount).
fn build_interleaved(m: &Path, dir: &str, files: usize, blocks: usize, salt: u64) -> Files {
    fs::create_dir_all(m.join(dir)).unwrap();
    let name = |i: usize| format!("{dir}/f{i:03}");
    let block = |i: usize, b: usize| pattern(salt ^ (((i * 1000 + b) as u64) << 20), BLOCK);
    for b in 0..blocks {
        for i in 0..files {
            write_at(&m.join(name(i)), (b * BLOCK) as u64, &block(i, b))
                .unwrap_or_else(|e| panic!("write {}: {e}", name(i)));
        }
        sync_tid(m);
    }
    (0..files)
        .map(|i| (name(i), (0..blocks).flat_map(|b| block(i, b)).collect()))
        .collect()
}

/// Deletes every file of `all` whose index is not a multiple of `keep_every`
/// and returns the survivors.
fn delete_most(m: &Path, all: &Files, keep_every: usize) -> Files {
    let mut kept = Files::new();
    for (i, (p, d)) in all.iter().enumerate() {
        if i % keep_every == 0 {
            kept.insert(p.clone(), d.clone());
        } else {
            fs::remove_file(m.join(p)).unwrap();
        }
    }
    kept
}

/// Writer thread: rewrites files in `w/`, fsyncs and reads each back
/// (uncached). Returns the final content of its files.
fn gc_writer(
    root: PathBuf,
    seed: u64,
    stop: Arc<AtomicBool>,
    iters: Arc<AtomicU64>,
) -> Result<Files, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut mine = Files::new();
    while !stop.load(Ordering::SeqCst) {
        let name = format!("w/f{}", rng.gen_range(0..8));
        let data = pattern(rng.gen(), rng.gen_range(1..400_000));
        let p = root.join(&name);
        let res = (|| -> io::Result<()> {
            let mut f = File::create(&p)?;
            f.write_all(&data)?;
            f.sync_all()
        })();
        res.map_err(|e| format!("writing {name}: {e}"))?;
        mine.insert(name.clone(), data.clone());
        let got = read_uncached(&p).map_err(|e| format!("reading {name}: {e}"))?;
        if let Some(i) = first_diff(&got, &data) {
            return Err(format!(
                "{name} read back wrong at byte {i} (len {} vs {})",
                got.len(),
                data.len()
            ));
        }
        iters.fetch_add(1, Ordering::SeqCst);
    }
    Ok(mine)
}

/// Scrubs (online, JSON) until `stop`; any damage or failure is an error.
/// Returns the number of complete scrubs.
fn scrub_loop(root: PathBuf, stop: Arc<AtomicBool>) -> Result<u64, String> {
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let args = [os("scrub"), root.as_os_str(), os("--json")];
        let out = cairn(&args);
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || text.contains("corrupt") {
            return Err(format!("scrub #{n} reported damage\n{}", describe(&out)));
        }
        n += 1;
    }
    Ok(n)
}

#[test]
fn gc_compacts_under_concurrent_writes() {
    let seed = seed();
    println!("gc test: CAIRN_SEED={seed}");
    let mut fs = pool_with(
        "1G",
        &["--compression", "none"],
        &[("gc_interval_secs", "0")],
    );
    let m = fs.mnt.clone();
    fs::create_dir(m.join("w")).unwrap();
    let all = build_interleaved(&m, "sp", 96, 8, seed);
    let survivors = delete_most(&m, &all, 3);
    let p = prune0(&m);
    assert!(
        field_u64(&p, "bytes_freed") >= (all.len() - survivors.len()) as u64 * 8 * B,
        "prune freed too little: {p:?}"
    );
    snapshot_create(&m, "survivors");
    let before = synced_space(&m);
    assert!(
        before.fill() < 0.45,
        "segments should be about 1/3 live before gc: {before:?} (fill {:.2})",
        before.fill()
    );
    // Nothing is below 10% live: gc with --max-live 10 does nothing.
    let j = gc_json(&m, &["--max-live", "10"]);
    assert_eq!(field_u64(&j, "chunks_moved"), 0, "gc --max-live 10: {j:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let (w_iters, r_iters) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (root, st, it) = (m.clone(), stop.clone(), w_iters.clone());
        thread::spawn(move || gc_writer(root, seed, st, it))
    };
    let reader = {
        let (root, files, st, it) = (m.clone(), survivors.clone(), stop.clone(), r_iters.clone());
        thread::spawn(move || check_reads(root, files, seed ^ 1, st, it, "being moved by gc"))
    };
    // Online scrub beside gc: a chunk moved under it is not damage.
    let scrubber = {
        let (root, st) = (m.clone(), stop.clone());
        thread::spawn(move || scrub_loop(root, st))
    };
    thread::sleep(Duration::from_millis(300));
    let (w0, r0) = (
        w_iters.load(Ordering::SeqCst),
        r_iters.load(Ordering::SeqCst),
    );
    let args = [os("gc"), m.as_os_str(), os("--json")];
    let t0 = Instant::now();
    let out = run_timeout(Command::new(CAIRN).args(args), CMD_TIMEOUT);
    let took = t0.elapsed();
    let w_during = w_iters.load(Ordering::SeqCst) - w0;
    let r_during = r_iters.load(Ordering::SeqCst) - r0;
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::SeqCst);
    let mine = writer.join().expect("writer panicked");
    let read = reader.join().expect("reader panicked");
    let scrubs = scrubber.join().expect("scrubber panicked");
    assert!(out.status.success(), "gc failed\n{}", describe(&out));
    let scrubs = scrubs.unwrap_or_else(|e| panic!("scrub during gc: {e}"));
    assert!(scrubs > 0, "no scrub completed during the gc phase");
    let r = parse_json_out(&args, &out);
    println!("gc took {took:?}; meanwhile {w_during} writes and {r_during} reads: {r:?}");
    let mine = mine.unwrap_or_else(|e| panic!("writer during gc: {e}"));
    read.unwrap_or_else(|e| panic!("reader during gc: {e}"));
    check_gc_report(&r);
    assert!(field_u64(&r, "chunks_moved") > 0, "gc moved nothing: {r:?}");
    assert!(field_u64(&r, "bytes_moved") > 0, "{r:?}");
    assert!(field_u64(&r, "segments_rewritten") > 0, "{r:?}");
    assert!(
        field_u64(&r, "segments_freed") > 0,
        "gc freed no segment: {r:?}"
    );
    assert!(
        w_during > 0 && r_during > 0,
        "writer/reader made no progress while gc ran ({took:?})"
    );
    let after = synced_space(&m);
    println!(
        "before gc {before:?} (fill {:.2}); after {after:?} (fill {:.2})",
        before.fill(),
        after.fill()
    );
    // The writer adds data meanwhile, so compare density, not counts: from
    // about 1/3 live to nearly as few segments as the live bytes need.
    let needed = after.physical.div_ceil(after.segment_size);
    assert!(
        after.fill() > 0.6 && after.segments <= needed + 2,
        "gc did not compact ({needed} segments would do): before {before:?} (fill {:.2}), after {after:?} (fill {:.2})",
        before.fill(),
        after.fill()
    );
    // With the writer stopped, one more gc compacts what was still the open
    // segment during the first one; after that there is nothing left to do
    // (gc must not churn dense segments).
    let j2 = gc_json(&m, &[]);
    let j3 = gc_json(&m, &[]);
    assert_eq!(
        field_u64(&j3, "chunks_moved"),
        0,
        "third gc with nothing new to compact: {j3:?} (second gc: {j2:?})"
    );

    let mut want = survivors.clone();
    want.extend(mine);
    let check_all = |m: &Path, want: &Files, ctx: &str| {
        assert_contents_eq(&contents_at(m, ctx), want, ctx);
        assert_contents_eq(
            &contents_at(&snap_root(m, "survivors"), ctx),
            &survivors,
            &format!("{ctx}: .snapshots/survivors"),
        );
    };
    check_all(&m, &want, "after gc");
    // The moved chunks are still found by dedup: a copy costs nothing.
    let (name, data) = survivors.iter().next().unwrap();
    let s0 = synced_space(&m);
    write_file(&m.join("copy-of-survivor"), data);
    let s1 = synced_space(&m);
    assert_eq!(
        (s1.chunks, s1.unique, s1.stored),
        (s0.chunks, s0.unique, s0.stored),
        "a copy of {name} (moved by gc) was stored again: {s0:?} -> {s1:?}"
    );
    assert_file(&m.join("copy-of-survivor"), data, "copy of a moved file");
    want.insert("copy-of-survivor".into(), data.clone());
    fs.unmount();
    fs.check();
    fs.mount();
    check_all(&m, &want, "after gc + remount");
    fs.finish();
}

#[test]
fn background_gc_compacts_sparse_segments() {
    let seed = seed();
    println!("background gc test: CAIRN_SEED={seed}");
    let mut fs = pool_with(
        "1G",
        &["--compression", "none"],
        &[("gc_interval_secs", "0")],
    );
    let m = fs.mnt.clone();
    let all = build_interleaved(&m, "sp", 64, 6, seed);
    let survivors = delete_most(&m, &all, 4);
    prune0(&m);
    let before = synced_space(&m);
    assert!(
        before.fill() < 0.35,
        "segments should be about 1/4 live: {before:?} (fill {:.2})",
        before.fill()
    );
    // With background GC off, nothing changes by itself.
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(synced_space(&m), before, "gc_interval_secs = 0 must be off");
    fs.unmount();
    fs.set_config("gc_interval_secs", "1");
    fs.mount();
    let t0 = Instant::now();
    let mut now = before;
    let compacted = eventually(Duration::from_secs(20), || {
        now = info(&m).0;
        now.segments < before.segments
    });
    assert!(
        compacted,
        "background gc (gc_interval_secs = 1) did not compact within 20 s: before {before:?}, now {now:?}"
    );
    println!(
        "background gc compacted after {:?}: {before:?} -> {now:?}",
        t0.elapsed()
    );
    // Let it finish, then the data is intact and the numbers unchanged.
    eventually(Duration::from_secs(10), || info(&m).0.fill() > 0.6);
    let after = info(&m).0;
    assert!(
        after.fill() > 0.6,
        "background gc left segments sparse: {after:?} (fill {:.2})",
        after.fill()
    );
    assert_eq!(
        (after.chunks, after.unique, after.stored, after.physical),
        (before.chunks, before.unique, before.stored, before.physical),
        "gc must move chunks, not change them: {before:?} -> {after:?}"
    );
    assert_contents_eq(
        &contents_at(&m, "after background gc"),
        &survivors,
        "background gc",
    );
    fs.unmount();
    fs.check();
    fs.mount();
    assert_contents_eq(&contents_at(&m, "remount"), &survivors, "after remount");
    fs.finish();
}

/// Unmount while a slow background GC (1 MiB/s) is in the middle of its
/// work: the daemon stops promptly and cleanly, and the pool checks clean.
#[test]
fn unmount_during_background_gc() {
    let seed = seed();
    println!("unmount during gc test: CAIRN_SEED={seed}");
    let mut fs = pool_with(
        "1G",
        &["--compression", "none"],
        &[("gc_interval_secs", "0")],
    );
    let m = fs.mnt.clone();
    let all = build_interleaved(&m, "sp", 64, 8, seed);
    let survivors = delete_most(&m, &all, 4);
    prune0(&m);
    let before = synced_space(&m);
    fs.unmount();
    fs.set_config("gc_interval_secs", "1");
    fs.set_config("gc_rate_mib", "1");
    fs.mount();
    let mut now = before;
    let started = eventually(Duration::from_secs(20), || {
        now = info(&m).0;
        now.segments < before.segments
    });
    assert!(
        started,
        "background gc did not start within 20 s: {before:?} -> {now:?}"
    );
    let t0 = Instant::now();
    fs.unmount();
    let took = t0.elapsed();
    println!("unmounted during gc in {took:?} ({before:?} -> {now:?})");
    assert!(
        took < Duration::from_secs(15),
        "unmount waited {took:?} for the background gc"
    );
    fs.check();
    fs.set_config("gc_interval_secs", "0");
    fs.mount();
    assert_contents_eq(
        &contents_at(&m, "after remount"),
        &survivors,
        "after remount",
    );
    let j = gc_json(&m, &["--max-live", "50"]);
    println!("gc finishing the job: {j:?}");
    assert_contents_eq(&contents_at(&m, "after gc"), &survivors, "after gc");
    fs.finish();
}

// ================================================== 5. kill -9 during GC

#[test]
fn kill9_during_gc() {
    let seed = seed();
    let rounds = env_usize("CAIRN_DEDUP_CRASH_ROUNDS", 10);
    println!("gc crash test: CAIRN_SEED={seed}, {rounds} rounds");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fs = pool_with(
        "2G",
        &["--compression", "none"],
        &[("gc_interval_secs", "0")],
    );
    let m = fs.mnt.clone();
    let gc_args = [os("gc"), m.as_os_str(), os("--json")];
    let mut model = Files::new();
    let mut snap = Files::new();
    let mut d_gc = Duration::ZERO;
    let mut max_us = 2000;
    let (mut hits, mut partial) = (0, 0);
    for round in 0..=rounds {
        let ctx = format!("CAIRN_SEED={seed} round {round}");
        let all = build_interleaved(&m, &format!("r{round:02}"), 96, 8, rng.gen());
        // Everything is committed by the syncs; fsync a few files as well.
        for p in all.keys().take(4) {
            File::open(m.join(p)).unwrap().sync_all().unwrap();
        }
        let kept = delete_most(&m, &all, 4);
        model.extend(kept);
        if round == 0 {
            snapshot_create(&m, "base");
            snap = model.clone();
        }
        if round == 1 {
            // The snapshot alone keeps this one now.
            let first = model.keys().next().unwrap().clone();
            fs::remove_file(m.join(&first)).unwrap();
            model.remove(&first);
        }
        prune0(&m);
        if round == 0 {
            let (d, out) = timed(&gc_args);
            d_gc = d;
            let j = common::json::parse(out.trim()).expect("gc --json output");
            assert!(field_u64(&j, "chunks_moved") > 0, "{ctx}: gc: {j:?}");
            println!("{ctx}: gc took {d_gc:?}: {j:?}");
            max_us = (d_gc.as_micros() as u64 * 3 / 4).max(2000);
            continue;
        }
        // Most kills land while gc runs (round 0 timed it whole, with the
        // CLI start); a few after it, which tests a finished gc too. A gc
        // that finished before its kill took less than that delay, so the
        // next delays are drawn below it (gc times vary with the machine).
        let delay = Duration::from_micros(rng.gen_range(0..max_us));
        let pre = info(&m).0;
        let hit = kill_during(&mut fs, &gc_args, delay, &ctx);
        hits += hit as usize;
        if !hit {
            max_us = (delay.as_micros() as u64).max(2000);
        }
        fs.check();
        fs.mount();
        let post = info(&m).0;
        // Segments changed: gc had committed some of its steps.
        let moved = post.segments != pre.segments;
        partial += (hit && moved) as usize;
        println!(
            "{ctx}: killed the daemon {delay:?} after starting gc (took {d_gc:?} unkilled); \
             it was {}; segments {} -> {}",
            if hit { "still running" } else { "already done" },
            pre.segments,
            post.segments
        );
        assert_eq!(
            (post.chunks, post.unique, post.referenced),
            (pre.chunks, pre.unique, pre.referenced),
            "{ctx}: gc (killed) changed the chunks, not just their places"
        );
        let c = format!("{ctx} after kill -9");
        assert_contents_eq(&contents_at(&m, &c), &model, &c);
        assert_contents_eq(
            &contents_at(&snap_root(&m, "base"), &c),
            &snap,
            &format!("{c}: .snapshots/base"),
        );
    }
    assert!(
        hits * 3 >= rounds,
        "only {hits} of {rounds} kills hit a running gc: test too weak"
    );
    assert!(
        partial > 0,
        "no kill landed after gc had committed part of its work: test too weak"
    );
    // An unkilled gc completes on the recovered pool.
    let j = gc_json(&m, &[]);
    println!("final gc: {j:?}");
    assert_contents_eq(&contents_at(&m, "final"), &model, "final");
    fs.unmount();
    fs.check();
    fs.mount();
    assert_contents_eq(&contents_at(&m, "final remount"), &model, "final remount");
    assert_contents_eq(
        &contents_at(&snap_root(&m, "base"), "final"),
        &snap,
        "final: .snapshots/base",
    );
    fs.finish();
}

// ============================================================ 6. corruption

/// 64 bytes from the middle of block `blk` of `data` (unique content).
fn needle(data: &[u8], blk: usize) -> &[u8] {
    let at = blk * BLOCK + BLOCK / 2;
    &data[at..at + 64]
}

#[test]
fn scrub_finds_corruption_reads_give_eio() {
    let mut fs = pool_with(
        "256M",
        &["--compression", "none"],
        &[("gc_interval_secs", "0")],
    );
    let m = fs.mnt.clone();
    let dev = PathBuf::from(fs.dev("ssd0"));
    fs::create_dir_all(m.join("dir/sub")).unwrap();
    let victim = pattern(21, 3 * BLOCK);
    let shared = pattern(22, 2 * BLOCK);
    let old = pattern(23, BLOCK);
    let new = pattern(24, BLOCK);
    let header_victim = pattern(25, 2 * BLOCK);
    let others: Files = (0..4)
        .map(|i| (format!("other{i}"), pattern(30 + i, 200_000)))
        .collect();
    write_synced(&m.join("dir/victim"), &victim);
    write_synced(&m.join("shared1"), &shared);
    write_synced(&m.join("dir/sub/shared2"), &shared);
    write_synced(&m.join("hist"), &old);
    write_synced(&m.join("hdr"), &header_victim);
    for (p, d) in &others {
        write_synced(&m.join(p), d);
    }
    sync_tid(&m);
    // "hist" gets new content: its old chunk is only in history.
    write_synced(&m.join("hist"), &new);
    let tid_new = sync_tid(&m);
    let clean_chunks = scrub_clean(&m, "before corruption");
    assert_eq!(clean_chunks, info(&m).0.chunks, "scrub reads every chunk");

    // Corrupt: the middle of victim's block 1; shared block 1 (one chunk,
    // two files); the old version of hist; a header byte of hdr's block 0.
    let needles = [
        needle(&victim, 1),
        needle(&shared, 1),
        needle(&old, 0),
        &header_victim[..64],
    ];
    let hits = find_in_device(&dev, &needles);
    for (k, h) in hits.iter().enumerate() {
        assert_eq!(
            h.len(),
            1,
            "needle {k} must be stored exactly once: {hits:?}"
        );
    }
    flip_byte(&dev, hits[0][0] + 7);
    flip_byte(&dev, hits[1][0] + 7);
    flip_byte(&dev, hits[2][0] + 7);
    // The chunk data of hdr's block 0 starts at the needle; its header is
    // the 56 bytes before (hit a byte of the stored hash).
    flip_byte(&dev, hits[3][0] - HDR + 24);

    let expect_report = |j: &Json, ctx: &str| {
        let d = damaged(j);
        assert_eq!(d.len(), 4, "{ctx}: 4 damaged chunks expected: {d:#?}");
        let find = |what: &str| -> &String {
            d.iter()
                .find(|l| l.contains(what))
                .unwrap_or_else(|| panic!("{ctx}: no damaged line names {what:?}: {d:#?}"))
        };
        find("/dir/victim offset 65536 (current)");
        let s = find("/shared1 offset 65536 (current)");
        assert!(
            s.contains("/dir/sub/shared2 offset 65536 (current)"),
            "{ctx}: the shared chunk must name both files: {s}"
        );
        let h = find("/hist offset 0 (tids 0x");
        assert!(
            h.contains(&format!("..{tid_new:#x})")),
            "{ctx}: the history chunk should name the TID range ending at {tid_new:#x}: {h}"
        );
        find("/hdr offset 0 (current)");
        assert!(
            !d.iter().any(|l| l.contains("other")),
            "{ctx}: healthy files named: {d:#?}"
        );
        assert_eq!(field_u64(j, "chunks"), clean_chunks, "{ctx}: chunks read");
    };

    // Online.
    let (code, j) = scrub(&m);
    assert_eq!(code, 3, "online scrub must exit 3: {j:?}");
    println!("online scrub: {j:?}");
    expect_report(&j, "online scrub");

    // Reads through the mount: EIO exactly where the damage is.
    let vp = m.join("dir/victim");
    expect_errno(read_uncached(&vp), libc::EIO, "read all of dir/victim");
    // The daemon's log names the file (by inode) and the range that failed.
    let ino = std::fs::metadata(&vp).map(|md| md.ino()).unwrap();
    let want = format!("read of inode {ino} bytes ");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !fs.diagnostics().contains(&want) {
        assert!(
            std::time::Instant::now() < deadline,
            "no '{want}...' line in the daemon's log:\n{}",
            fs.diagnostics()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The damaged byte is at BLOCK / 2 + 7 in block 1: a read of the block
    // stops short before the damaged 4 KiB span (the spans before it
    // verify on their own) or fails; a read inside that span fails; a
    // small read in another span of the block gives its bytes.
    let b1 = B as usize;
    match pread_uncached(&vp, B, BLOCK) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "read block 1: {e}"),
        Ok(got) => {
            assert!(
                got.len() <= BLOCK / 2,
                "read block 1 of dir/victim returned {} bytes, past the damage",
                got.len()
            );
            assert_bytes_eq(
                &got,
                &victim[b1..b1 + got.len()],
                "block 1 up to the damage",
            );
        }
    }
    expect_errno(
        pread_uncached(&vp, B + BLOCK as u64 / 2, 10),
        libc::EIO,
        "read 10 bytes of the damaged span of dir/victim",
    );
    let got = pread_uncached(&vp, B + 100, 10).unwrap();
    assert_bytes_eq(
        &got,
        &victim[b1 + 100..b1 + 110],
        "10 bytes of an undamaged span",
    );
    for blk in [0usize, 2] {
        let got = pread_uncached(&vp, (blk * BLOCK) as u64, BLOCK)
            .unwrap_or_else(|e| panic!("block {blk} of dir/victim (undamaged): {e}"));
        assert_bytes_eq(
            &got,
            &victim[blk * BLOCK..(blk + 1) * BLOCK],
            &format!("dir/victim block {blk}"),
        );
    }
    for p in ["shared1", "dir/sub/shared2"] {
        expect_errno(read_uncached(&m.join(p)), libc::EIO, p);
        let got = pread_uncached(&m.join(p), 0, BLOCK).unwrap();
        assert_bytes_eq(&got, &shared[..BLOCK], &format!("{p} block 0"));
    }
    // hdr's damage is in a chunk header, not in its data: a read of the
    // whole chunk checks the header and fails; a read of part of it checks
    // only the data spans it reads against the record's sums. Either an
    // error or the bytes written, never others.
    match read_uncached(&m.join("hdr")) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "hdr: {e}"),
        Ok(got) => assert_bytes_eq(&got, &header_victim, "hdr (data intact)"),
    }
    expect_errno(
        read_uncached(&at_tid(&m.join("hist"), tid_new - 1)),
        libc::EIO,
        "hist@@(old version)",
    );
    assert_file(&m.join("hist"), &new, "hist (current version is intact)");
    assert_files_at(&m, &others, "undamaged files");

    // Offline: the same report; check fails.
    fs.unmount();
    let (code, j) = scrub(&fs.pool);
    assert_eq!(code, 3, "offline scrub must exit 3: {j:?}");
    expect_report(&j, "offline scrub");
    let out = cairn(&[os("check"), fs.pool.as_os_str()]);
    assert!(
        !out.status.success(),
        "cairn check must fail on a corrupted pool\n{}",
        describe(&out)
    );
    println!("check: {}", describe(&out));

    // Deleting the damaged files and their history makes the pool clean.
    fs.mount();
    for p in ["dir/victim", "shared1", "dir/sub/shared2", "hist", "hdr"] {
        fs::remove_file(m.join(p)).unwrap();
    }
    prune0(&m);
    scrub_clean(&m, "after deleting the damaged files and pruning");
    assert_files_at(&m, &others, "undamaged files at the end");
    fs.finish();
}

/// Once scrub has found a chunk damaged, writing the same content again
/// (restoring the file from a good copy) must store a good copy: dedup must
/// not point the new file at the chunk known to be bad.
#[test]
fn rewrite_after_scrub_does_not_dedup_to_damaged_chunk() {
    let fs = pool_with(
        "256M",
        &["--compression", "none"],
        &[("gc_interval_secs", "0")],
    );
    let m = fs.mnt.clone();
    let dev = PathBuf::from(fs.dev("ssd0"));
    let data = pattern(41, 4 * BLOCK);
    write_synced(&m.join("file"), &data);
    // fsync made it durable in the intent log; a commit puts it in segments.
    sync_tid(&m);
    let hits = find_in_device(&dev, &[needle(&data, 2)]).remove(0);
    assert_eq!(hits.len(), 1, "block 2 stored once: {hits:?}");
    flip_byte(&dev, hits[0] + 3);
    let (code, j) = scrub(&m);
    assert_eq!(code, 3, "scrub must find the damage: {j:?}");
    expect_errno(read_uncached(&m.join("file")), libc::EIO, "damaged file");
    // Restore from the good copy, as a user would.
    write_synced(&m.join("restored"), &data);
    sync_tid(&m);
    let got = read_uncached(&m.join("restored"));
    let s = info(&m).0;
    match got {
        Ok(got) => assert_bytes_eq(&got, &data, "restored copy"),
        Err(e) => panic!(
            "the restored copy is unreadable ({e}): dedup referenced the damaged chunk that \
             scrub had reported instead of storing the good data ({s:?}; scrub: {j:?})"
        ),
    }
    // The damaged original is still damaged; drop it and its history.
    fs::remove_file(m.join("file")).unwrap();
    prune0(&m);
    scrub_clean(&m, "after removing the damaged file");
    assert_file(&m.join("restored"), &data, "restored copy at the end");
    fs.finish();
}
