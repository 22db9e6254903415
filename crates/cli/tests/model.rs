//! Randomized model test: the same random operations (writes at odd offsets,
//! truncates, renames, links, unlinks, mkdir/rmdir, symlinks, I/O through
//! long-lived fds) are applied to a Cairn mount and to a plain directory that
//! serves as the oracle. Every result (data or errno) must agree, and the two
//! trees are compared after each batch and again after a remount.
//! The seed is printed; reproduce with CAIRN_SEED=<seed>; CAIRN_MODEL_BATCHES
//! raises the number of batches for longer soaks.

mod common;

use common::tree_gen::*;
use common::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{symlink, FileExt, MetadataExt};
use std::path::{Path, PathBuf};

const TARGETS: &[&str] = &["a", "../b", "d/e", "nowhere", "./c/../a", "ünï/ß"];
const MAX_FDS: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    Write(String, u64, u64, usize), // path, offset, data seed, length
    Truncate(String, u64),
    Rename(String, String),
    Unlink(String),
    Link(String, String),
    Mkdir(String),
    Rmdir(String),
    Symlink(String, String), // target, path
    Read(String, u64, usize),
    Open(String),
    FdWrite(usize, u64, u64, usize),
    FdRead(usize, u64, usize),
    FdSync(usize),
    Close(usize),
}

/// One side of the comparison: a root directory plus open file descriptors.
struct Side {
    root: PathBuf,
    fds: Vec<File>,
}

impl Side {
    fn apply(&mut self, op: &Op) -> io::Result<Vec<u8>> {
        let p = |s: &str| self.root.join(s);
        let none = |r: io::Result<()>| r.map(|_| Vec::new());
        match op {
            Op::Write(path, off, seed, len) => {
                let f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(p(path))?;
                none(f.write_all_at(&pattern(*seed, *len), *off))
            }
            Op::Truncate(path, len) => {
                none(OpenOptions::new().write(true).open(p(path))?.set_len(*len))
            }
            Op::Rename(a, b) => none(fs::rename(p(a), p(b))),
            Op::Unlink(a) => none(fs::remove_file(p(a))),
            Op::Link(a, b) => none(fs::hard_link(p(a), p(b))),
            Op::Mkdir(a) => none(fs::create_dir(p(a))),
            Op::Rmdir(a) => none(fs::remove_dir(p(a))),
            Op::Symlink(t, a) => none(symlink(t, p(a))),
            Op::Read(a, off, len) => read_full_at(&File::open(p(a))?, *off, *len),
            Op::Open(a) => {
                self.fds
                    .push(OpenOptions::new().read(true).write(true).open(p(a))?);
                Ok(Vec::new())
            }
            Op::FdWrite(i, off, seed, len) => {
                none(self.fds[*i].write_all_at(&pattern(*seed, *len), *off))
            }
            Op::FdRead(i, off, len) => read_full_at(&self.fds[*i], *off, *len),
            Op::FdSync(i) => none(self.fds[*i].sync_data()),
            Op::Close(i) => {
                self.fds.remove(*i);
                Ok(Vec::new())
            }
        }
    }
}

// ------------------------------------------------------------ generator

impl Gen {
    fn op(&mut self, s: &Snap, nfds: usize) -> Op {
        loop {
            let crowded = s.files.len() + s.links.len() > 40;
            let roll = if crowded && self.rng.gen_bool(0.5) {
                45
            } else {
                self.rng.gen_range(0..100)
            };
            if let Some(op) = self.pick(roll, s, nfds) {
                return op;
            }
        }
    }

    fn pick(&mut self, roll: u32, s: &Snap, nfds: usize) -> Option<Op> {
        let file = s.files.choose(&mut self.rng).cloned();
        let fd = (nfds > 0).then(|| self.rng.gen_range(0..nfds.max(1)));
        let seed = self.rng.gen();
        Some(match roll {
            0..=24 => match file.filter(|_| self.rng.gen_bool(0.7)) {
                Some((f, size)) => Op::Write(f, self.offset(size), seed, self.length(300_000)),
                None => Op::Write(self.fresh(s), self.offset(0), seed, self.length(300_000)),
            },
            25..=32 => {
                let (f, size) = file?;
                Op::Truncate(f, self.new_len(size))
            }
            33..=44 => Op::Rename(
                s.entries().choose(&mut self.rng)?.clone(),
                self.target(s, 0.4),
            ),
            45..=52 => Op::Unlink(s.nondirs().choose(&mut self.rng)?.clone()),
            53..=58 => Op::Link(
                s.nondirs().choose(&mut self.rng)?.clone(),
                self.target(s, 0.4),
            ),
            59..=63 if s.dirs.len() < 10 => Op::Mkdir(self.target(s, 0.4)),
            64..=67 => Op::Rmdir(s.entries().choose(&mut self.rng)?.clone()),
            68..=72 => Op::Symlink(
                TARGETS.choose(&mut self.rng).unwrap().to_string(),
                self.target(s, 0.4),
            ),
            73..=80 => {
                let (f, size) = file?;
                Op::Read(f, self.offset(size), self.length(300_000))
            }
            81..=84 if nfds < MAX_FDS => Op::Open(file?.0),
            85..=92 => Op::FdWrite(fd?, self.offset(300_000), seed, self.length(300_000)),
            93..=96 => Op::FdRead(fd?, self.offset(300_000), self.length(300_000)),
            97 => Op::FdSync(fd?),
            98..=99 => Op::Close(fd?),
            _ => return None,
        })
    }
}

// ----------------------------------------------------------- comparison

#[derive(Debug, PartialEq)]
enum Ent {
    File {
        mode: u32,
        nlink: u64,
        data: Vec<u8>,
    },
    Dir {
        mode: u32,
        nlink: u64,
    },
    Link(PathBuf),
}

/// Whole tree: path -> entry, plus groups of paths sharing an inode.
fn tree(root: &Path) -> (BTreeMap<String, Ent>, Vec<Vec<String>>) {
    let snap = Snap::of(root);
    let (mut map, mut groups) = (BTreeMap::new(), BTreeMap::<u64, Vec<String>>::new());
    for d in snap.dirs.iter().filter(|d| !d.is_empty()) {
        let md = fs::symlink_metadata(root.join(d)).unwrap();
        map.insert(
            d.clone(),
            Ent::Dir {
                mode: md.mode(),
                nlink: md.nlink(),
            },
        );
    }
    for l in &snap.links {
        map.insert(l.clone(), Ent::Link(fs::read_link(root.join(l)).unwrap()));
    }
    for (f, _) in &snap.files {
        let md = fs::symlink_metadata(root.join(f)).unwrap();
        let data = fs::read(root.join(f)).unwrap();
        assert_eq!(
            data.len() as u64,
            md.len(),
            "{f}: st_size disagrees with the bytes read"
        );
        groups.entry(md.ino()).or_default().push(f.clone());
        map.insert(
            f.clone(),
            Ent::File {
                mode: md.mode(),
                nlink: md.nlink(),
                data,
            },
        );
    }
    let mut groups: Vec<Vec<String>> = groups.into_values().filter(|g| g.len() > 1).collect();
    groups.iter_mut().for_each(|g| g.sort());
    groups.sort();
    (map, groups)
}

fn compare_trees(cairn: &Path, oracle: &Path, ctx: &str) {
    let (got, got_groups) = tree(cairn);
    let (want, want_groups) = tree(oracle);
    let gk: Vec<_> = got.keys().collect();
    let wk: Vec<_> = want.keys().collect();
    assert_eq!(
        gk, wk,
        "{ctx}: different sets of paths (left = cairn, right = oracle)"
    );
    for (path, w) in &want {
        match (&got[path], w) {
            (
                Ent::File {
                    data: gd,
                    mode: gm,
                    nlink: gn,
                },
                Ent::File {
                    data: wd,
                    mode: wm,
                    nlink: wn,
                },
            ) => {
                assert_eq!((gm, gn), (wm, wn), "{ctx}: {path}: (mode, nlink)");
                assert_bytes_eq(gd, wd, &format!("{ctx}: {path}"));
            }
            (g, w) => assert_eq!(g, w, "{ctx}: {path}"),
        }
    }
    assert_eq!(got_groups, want_groups, "{ctx}: hard-link groups");
}

// ----------------------------------------------------------------- driver

fn errno_class(op: &Op, e: &io::Error) -> i32 {
    match (op, e.raw_os_error()) {
        // POSIX allows either for rename over a non-empty directory
        (Op::Rename(..), Some(libc::EEXIST)) => libc::ENOTEMPTY,
        (_, Some(n)) => n,
        (_, None) => -1,
    }
}

fn same_result(op: &Op, a: &io::Result<Vec<u8>>, b: &io::Result<Vec<u8>>) -> bool {
    match (a, b) {
        (Ok(x), Ok(y)) => x == y,
        (Err(x), Err(y)) => errno_class(op, x) == errno_class(op, y),
        _ => false,
    }
}

fn show(r: &io::Result<Vec<u8>>) -> String {
    match r {
        Ok(v) => format!("Ok({} bytes)", v.len()),
        Err(e) => format!("Err({e})"),
    }
}

/// Runs one batch of `n` ops on both sides, checking every result.
fn run_batch(generator: &mut Gen, cairn: &mut Side, oracle: &mut Side, n: usize, ctx: &str) {
    let mut history: Vec<String> = Vec::new();
    let mut failed = 0;
    for i in 0..n {
        let snap = Snap::of(&oracle.root);
        let op = generator.op(&snap, oracle.fds.len());
        let (got, want) = (cairn.apply(&op), oracle.apply(&op));
        history.push(format!("#{i} {op:?} -> {}", show(&want)));
        failed += want.is_err() as usize;
        if !same_result(&op, &got, &want) {
            let recent = history[history.len().saturating_sub(15)..].join("\n");
            panic!(
                "{ctx} op #{i} {op:?}: cairn {} vs oracle {}\nrecent ops:\n{recent}",
                show(&got),
                show(&want)
            );
        }
    }
    let snap = Snap::of(&oracle.root);
    let (f, l, d) = (snap.files.len(), snap.links.len(), snap.dirs.len());
    println!("{ctx}: {n} ops ({failed} failed as expected); now {f} files, {l} symlinks, {d} dirs");
}

/// Number of batches: `default`, or CAIRN_MODEL_BATCHES for longer soaks.
fn batches(default: usize) -> usize {
    std::env::var("CAIRN_MODEL_BATCHES")
        .map_or(default, |v| v.parse().expect("CAIRN_MODEL_BATCHES"))
}

fn run_model(mut fs: Fs, seed: u64, batches: usize, ops: usize) {
    println!("model test: CAIRN_SEED={seed}");
    let oracle_root = fs.dir.join("oracle");
    fs::create_dir(&oracle_root).unwrap();
    let mut generator = Gen {
        rng: StdRng::seed_from_u64(seed),
    };
    let mut oracle = Side {
        root: oracle_root,
        fds: Vec::new(),
    };
    for b in 0..batches {
        let ctx = format!("CAIRN_SEED={seed} batch {b}");
        let mut cairn = Side {
            root: fs.mnt.clone(),
            fds: Vec::new(),
        };
        run_batch(&mut generator, &mut cairn, &mut oracle, ops, &ctx);
        compare_trees(&fs.mnt, &oracle.root, &format!("{ctx} (live)"));
        drop(cairn);
        oracle.fds.clear();
        fs.remount();
        compare_trees(&fs.mnt, &oracle.root, &format!("{ctx} (after remount)"));
    }
    fs.finish();
}

/// Mounts a default pool with the given `--io-uring` mode (turning
/// io_uring on in the kernel for `on`, which needs it).
fn pool_with_transport(mode: &str) -> Fs {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    fs.mount_args = vec!["--io-uring".into(), mode.into()];
    if mode == "on" {
        fs.mount_args.push("--enable-uring-module".into());
    }
    fs.mount();
    fs
}

/// Requests served through FUSE over io_uring (this kernel has it: 6.14+).
#[test]
fn model_default_pool() {
    let fs = pool_with_transport("on");
    // The rings start right after the kernel's INIT, which follows the mount.
    let ring_threads = || {
        let t = fs.daemon_threads();
        t.iter().filter(|t| t.starts_with("fuse-ring-")).count()
    };
    let t0 = std::time::Instant::now();
    while ring_threads() < 2 && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        ring_threads() >= 2,
        "no FUSE ring threads: {:?}",
        fs.daemon_threads()
    );
    run_model(fs, seed(), batches(12), 300);
}

/// The same through classic /dev/fuse reads.
#[test]
fn model_over_dev_fuse() {
    let fs = pool_with_transport("off");
    assert!(!fs
        .daemon_threads()
        .iter()
        .any(|t| t.starts_with("fuse-ring")));
    run_model(fs, seed().wrapping_add(2), batches(6), 300);
}

#[test]
fn model_tiered_devices_small_records() {
    let mut fs = Fs::create();
    let (a, b) = (fs.dev("nvme0"), fs.dev("hdd0"));
    fs.mkfs(&[
        "--device",
        &format!("nvme:{a}:256M"),
        "--device",
        &format!("hdd:{b}:1G"),
        "--record-size",
        "16K",
    ]);
    fs.mount();
    run_model(fs, seed().wrapping_add(1), batches(8), 300);
}
