//! The intent log (fast fsync): after an fsync, a crash (the Fs dropped
//! without a flush) keeps exactly the state at that fsync, in every file;
//! fsync does not commit a TID; a log record damaged in one place is read
//! from its copy, and a last record damaged in both is a torn tail. A seeded model test runs random operations with
//! random fsync, flush and crash points (CAIRN_INTENT_SEEDS seeds).

use cairn_fs::{Ctx, FileKind, Fs, SetAttr, XattrMode, ROOT_INO};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;

mod common;
use common::{make, make_file_log, reopen};

#[test]
fn fsync_is_durable_without_a_commit() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"db", 0o644).unwrap();
    fs.write(f.ino, 0, &vec![7u8; 200_000]).unwrap();
    fs.flush().unwrap();
    let tid = fs.last_tid();
    // Small writes into committed blocks, each followed by fsync.
    for n in 0..50u64 {
        fs.write(f.ino, n * 4000 + 17, format!("row {n}").as_bytes())
            .unwrap();
        fs.fsync(f.ino).unwrap();
    }
    let g = fs.create(Ctx::ROOT, ROOT_INO, b"new", 0o600).unwrap();
    fs.write(g.ino, 0, b"hello").unwrap();
    fs.setxattr(g.ino, b"user.k", b"v", XattrMode::Any).unwrap();
    fs.fsync(g.ino).unwrap();
    assert_eq!(fs.last_tid(), tid, "fsync committed a TID");
    let want = fs.read(f.ino, 0, 300_000).unwrap();
    fs.write(g.ino, 0, b"after the last fsync").unwrap();
    drop(fs); // a crash: nothing flushed
    let fs = reopen(d.path());
    let f = fs.lookup(ROOT_INO, b"db").unwrap();
    assert_eq!(fs.read(f.ino, 0, 300_000).unwrap(), want);
    let g = fs.lookup(ROOT_INO, b"new").unwrap();
    assert_eq!(fs.read(g.ino, 0, 100).unwrap(), b"hello");
    assert_eq!(fs.getxattr(g.ino, b"user.k").unwrap(), b"v");
    assert_eq!(g.perm, 0o600);
    // The replay was committed: a second crash changes nothing.
    drop(fs);
    let fs = reopen(d.path());
    let f = fs.lookup(ROOT_INO, b"db").unwrap();
    assert_eq!(fs.read(f.ino, 0, 300_000).unwrap(), want);
}

/// A pool in `dir` whose file "f" was fsynced as "one", then as "two",
/// and left by a crash: its log, and where the second record starts.
fn two_fsyncs(dir: &Path) -> (std::path::PathBuf, usize) {
    let fs = make_file_log(dir);
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    fs.write(f.ino, 0, b"one").unwrap();
    fs.fsync(f.ino).unwrap();
    let log = dir.join("pool/intent.log");
    let first_end = first_record_end(&log) as usize;
    fs.write(f.ino, 0, b"two").unwrap();
    fs.fsync(f.ino).unwrap();
    drop(fs);
    (log, first_end)
}

/// Flips a byte of the log at `p` at each of `places`.
fn flip(p: &Path, places: &[usize]) {
    let mut raw = std::fs::read(p).unwrap();
    for &at in places {
        raw[at] ^= 0xff;
    }
    std::fs::write(p, raw).unwrap();
}

/// A record damaged in one place is read from its copy (the same place in
/// the region's second half); the last record damaged in both is a torn
/// tail: the records before it stay.
#[test]
fn a_damaged_record_is_read_from_its_copy_and_a_torn_last_one_dropped() {
    for (both, want) in [(false, b"two"), (true, b"one")] {
        let d = tempfile::tempdir().unwrap();
        let (log, second) = two_fsyncs(d.path());
        let copy = std::fs::metadata(&log).unwrap().len() as usize / 4;
        let places = [second + 70, copy + second + 70];
        flip(&log, &places[..if both { 2 } else { 1 }]);
        let fs = reopen(d.path());
        let f = fs.lookup(ROOT_INO, b"f").unwrap();
        assert_eq!(fs.read(f.ino, 0, 10).unwrap(), want, "both: {both}");
    }
}

/// A file grown by small appends, each fsynced (a database's write-ahead
/// log), logs only the bytes each append wrote: its block's patch grows at
/// every append, and the records before hold the rest of it.
#[test]
fn appends_with_fsync_log_only_the_new_bytes() {
    let d = tempfile::tempdir().unwrap();
    let fs = make_file_log(d.path());
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"wal", 0o644).unwrap();
    // A committed partial last block: the appends land in it as a patch.
    let mut want = vec![3u8; 70_000];
    fs.write(f.ino, 0, &want).unwrap();
    fs.flush().unwrap();
    let frame = 4120;
    for n in 0..40u8 {
        let bytes = vec![n; frame];
        fs.write(f.ino, want.len() as u64, &bytes).unwrap();
        want.extend_from_slice(&bytes);
        fs.fsync(f.ino).unwrap();
    }
    let sizes = record_sizes(&d.path().join("pool/intent.log"));
    assert_eq!(sizes.len(), 40, "one record per fsync: {sizes:?}");
    // The frame, the inode and the entries' headers; the whole patch would
    // be up to 64 KiB.
    let most = *sizes.iter().max().unwrap();
    assert!(most < frame as u64 + 1024, "records of {sizes:?} bytes");
    drop(fs); // a crash
    let fs = reopen(d.path());
    let f = fs.lookup(ROOT_INO, b"wal").unwrap();
    assert_eq!(f.size, want.len() as u64);
    assert!(
        fs.read(f.ino, 0, 1 << 20).unwrap() == want,
        "replayed bytes differ"
    );
}

/// `fsync_is_quick` (FUSE ring threads serve such an fsync themselves)
/// holds while the dirty data fits one record, and not once it does not
/// (that fsync commits, on a worker).
#[test]
fn an_fsync_is_quick_while_the_dirty_data_fits_a_record() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    assert!(fs.fsync_is_quick(), "an idle pool with an intent log");
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    fs.write(f.ino, 0, &vec![1u8; 1 << 20]).unwrap();
    assert!(fs.fsync_is_quick(), "1 MiB dirty");
    fs.write(f.ino, 1 << 20, &vec![2u8; 9 << 20]).unwrap();
    assert!(!fs.fsync_is_quick(), "10 MiB dirty: more than a record");
    fs.fsync(f.ino).unwrap();
    assert!(fs.fsync_is_quick(), "committed by that fsync");
}

/// The records (offset in the file, payload length) of the log region
/// whose first record is on the newest TID: the one fsync writes to.
fn newest_region(log: &Path) -> Vec<(usize, u64)> {
    let raw = std::fs::read(log).unwrap();
    let half = raw.len() / 2;
    let mut best: Option<(u64, Vec<(usize, u64)>)> = None;
    for start in [0, half] {
        let mut at = start;
        let mut recs = Vec::new();
        while at + 64 <= start + half && raw[at..at + 8] == *b"CAIRNIL\0" {
            let len = u32::from_le_bytes(raw[at + 12..at + 16].try_into().unwrap()) as usize;
            recs.push((at, len as u64));
            at += 64 + len;
        }
        let Some(&(first, _)) = recs.first() else {
            continue;
        };
        let base = u64::from_le_bytes(raw[first + 32..first + 40].try_into().unwrap());
        if best.as_ref().is_none_or(|b| base > b.0) {
            best = Some((base, recs));
        }
    }
    best.map(|b| b.1).unwrap_or_default()
}

/// The payload length of each record fsync wrote since the last flush.
fn record_sizes(log: &Path) -> Vec<u64> {
    newest_region(log).into_iter().map(|r| r.1).collect()
}

/// The end of the first record of the region fsync writes to.
fn first_record_end(log: &Path) -> u64 {
    let (at, len) = newest_region(log)[0];
    at as u64 + 64 + len
}

/// What the test expects of the tree: path -> node.
#[derive(Clone, Debug, PartialEq)]
enum Node {
    File {
        data: Vec<u8>,
        xattr: Option<Vec<u8>>,
    },
    Dir,
    Link(Vec<u8>),
}

type Model = BTreeMap<String, Node>;

const NAMES: [&str; 6] = ["a", "b", "c", "d/x", "d/y", "e"];

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn dir_ino(fs: &Fs, dir: &str) -> Option<u64> {
    if dir.is_empty() {
        return Some(ROOT_INO);
    }
    fs.lookup(ROOT_INO, dir.as_bytes()).ok().map(|i| i.ino)
}

fn ino_of(fs: &Fs, path: &str) -> Option<u64> {
    let (dir, name) = split(path);
    fs.lookup(dir_ino(fs, dir)?, name.as_bytes())
        .ok()
        .map(|i| i.ino)
}

/// One random operation, applied to the filesystem and the model alike.
fn step(fs: &Fs, m: &mut Model, rng: &mut StdRng) {
    let path = NAMES[rng.gen_range(0..NAMES.len())].to_string();
    let (dir, name) = split(&path);
    let Some(parent) = dir_ino(fs, dir) else {
        fs.mkdir(Ctx::ROOT, ROOT_INO, dir.as_bytes(), 0o755)
            .unwrap();
        m.insert(dir.to_string(), Node::Dir);
        return;
    };
    let existing = m.get(&path).cloned();
    match (rng.gen_range(0..10), existing) {
        (_, None) if rng.gen_bool(0.15) => {
            let target = format!("t{}", rng.gen_range(0..1000)).into_bytes();
            fs.symlink(Ctx::ROOT, parent, name.as_bytes(), &target)
                .unwrap();
            m.insert(path, Node::Link(target));
        }
        (_, None) => {
            fs.create(Ctx::ROOT, parent, name.as_bytes(), 0o644)
                .unwrap();
            m.insert(
                path,
                Node::File {
                    data: vec![],
                    xattr: None,
                },
            );
        }
        (0..=4, Some(Node::File { mut data, xattr })) => {
            let ino = ino_of(fs, &path).unwrap();
            let off = rng.gen_range(0..300_000u64);
            let len = *[1usize, 100, 4096, 70_000]
                .get(rng.gen_range(0..4))
                .unwrap();
            let buf: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            fs.write(ino, off, &buf).unwrap();
            let end = off as usize + len;
            if data.len() < end {
                data.resize(end, 0);
            }
            data[off as usize..end].copy_from_slice(&buf);
            m.insert(path, Node::File { data, xattr });
        }
        (5, Some(Node::File { mut data, xattr })) => {
            let ino = ino_of(fs, &path).unwrap();
            let size = rng.gen_range(0..=data.len() as u64 + 1000);
            let a = SetAttr {
                size: Some(size),
                ..SetAttr::default()
            };
            fs.setattr(ino, &a).unwrap();
            data.resize(size as usize, 0);
            m.insert(path, Node::File { data, xattr });
        }
        (6, Some(Node::File { data, .. })) => {
            let ino = ino_of(fs, &path).unwrap();
            let v = vec![rng.gen::<u8>(); rng.gen_range(1..40)];
            fs.setxattr(ino, b"user.t", &v, XattrMode::Any).unwrap();
            m.insert(
                path,
                Node::File {
                    data,
                    xattr: Some(v),
                },
            );
        }
        (7, Some(node)) => {
            let to = NAMES[rng.gen_range(0..NAMES.len())].to_string();
            let (tdir, tname) = split(&to);
            let (Some(tp), false) = (dir_ino(fs, tdir), m.contains_key(&to)) else {
                return;
            };
            fs.rename(
                parent,
                name.as_bytes(),
                tp,
                tname.as_bytes(),
                Default::default(),
            )
            .unwrap();
            m.remove(&path);
            m.insert(to, node);
        }
        (8..=9, Some(Node::File { .. } | Node::Link(_))) => {
            fs.unlink(parent, name.as_bytes()).unwrap();
            m.remove(&path);
        }
        _ => {}
    }
}

/// The whole tree as the filesystem shows it.
fn capture(fs: &Fs) -> Model {
    let mut out = Model::new();
    let mut dirs = vec![(String::new(), ROOT_INO)];
    while let Some((prefix, dir)) = dirs.pop() {
        for e in fs.readdir(dir, 0, usize::MAX).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let name = String::from_utf8(e.name.clone()).unwrap();
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let node = match e.kind {
                FileKind::Dir => {
                    dirs.push((path.clone(), e.ino));
                    Node::Dir
                }
                FileKind::Symlink => Node::Link(fs.readlink(e.ino).unwrap()),
                _ => {
                    let size = fs.getattr(e.ino).unwrap().size;
                    Node::File {
                        data: fs.read(e.ino, 0, size as u32 + 10).unwrap(),
                        xattr: fs.getxattr(e.ino, b"user.t").ok(),
                    }
                }
            };
            out.insert(path, node);
        }
    }
    out
}

fn run_seed(seed: u64) {
    let d = tempfile::tempdir().unwrap();
    let mut fs = make(d.path());
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model::new();
    let mut durable = Model::new();
    for n in 0..600 {
        step(&fs, &mut model, &mut rng);
        match rng.gen_range(0..20) {
            0..=3 => {
                fs.fsync(ROOT_INO).unwrap();
                durable = model.clone();
            }
            4 => {
                fs.flush().unwrap();
                durable = model.clone();
            }
            5 => {
                drop(fs);
                fs = reopen(d.path());
                let got = capture(&fs);
                assert!(
                    got == durable,
                    "seed {seed} op {n}: after a crash the tree is not the one at the last fsync\n got: {:?}\nwant: {:?}",
                    got.keys().collect::<Vec<_>>(),
                    durable.keys().collect::<Vec<_>>()
                );
                model = durable.clone();
            }
            6 => assert!(
                capture(&fs) == model,
                "seed {seed} op {n}: live tree differs from the model"
            ),
            _ => {}
        }
    }
    let rep = cairn_fs::maintenance::check::check_pool(fs.pool()).unwrap();
    assert!(
        rep.problems.is_empty(),
        "seed {seed}: check: {:?}",
        rep.problems
    );
}

#[test]
fn random_operations_crash_back_to_the_last_fsync() {
    let seeds: u64 = std::env::var("CAIRN_INTENT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    for seed in 0..seeds {
        run_seed(seed);
    }
}
