//! A seeded random workload on a small tree, run through the `Fs` API
//! against a model, for the crash-point sweep: create, write (with repeated
//! blocks, so dedup hits), overwrite, truncate, rename, link, unlink,
//! fsync, flush, snapshot, prune, gc, reblock and tier moves. It records
//! the model's state at every point where the filesystem was asked to make
//! its state durable, with where the device trace stood before and after,
//! so that a pool recovered from any crash point can be checked: it must be
//! exactly one of the states that were made durable or being made durable
//! when the crash came, and never older than the last one acknowledged.

#![allow(dead_code)]

use cairn_fs::{Ctx, FileKind, Fs, PrunePolicy, ReblockOptions, RenameFlags, ROOT_INO};
use std::collections::BTreeMap;

/// The model's view of the tree: path -> (content, inode group). Paths
/// that share a group are hard links of one file.
pub type Tree = BTreeMap<String, (Vec<u8>, u32)>;

/// One durability point: `state` was asked to be made durable when the
/// trace had `started` events; the filesystem acknowledged it when the
/// trace had `acked` events. `snapshot` names a snapshot taken of it.
#[derive(Debug, Clone)]
pub struct Point {
    pub started: usize,
    pub acked: usize,
    pub what: &'static str,
    pub state: Tree,
    pub snapshot: Option<String>,
}

const DIRS: [&str; 3] = ["a", "b", "c"];
const NAMES: usize = 6;

/// A tiny seeded generator (xorshift64*), enough for workloads.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The model: files by path, their contents by group.
#[derive(Default)]
struct Model {
    paths: BTreeMap<String, u32>,
    data: BTreeMap<u32, Vec<u8>>,
    next_group: u32,
}

impl Model {
    fn tree(&self) -> Tree {
        self.paths
            .iter()
            .map(|(p, g)| (p.clone(), (self.data[g].clone(), *g)))
            .collect()
    }
}

/// Bytes for a write: often one of a few fixed blocks (dedup hits, also
/// across files), else fresh bytes from the generator.
fn payload(rng: &mut Rng, len: usize) -> Vec<u8> {
    let fixed = rng.below(3) == 0;
    let seed = if fixed { rng.below(4) } else { rng.next() };
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn split(path: &str) -> (&str, &str) {
    path.split_once('/').expect("dir/name")
}

fn dir_ino(fs: &Fs, dir: &str) -> u64 {
    fs.lookup(ROOT_INO, dir.as_bytes())
        .expect("workload dir")
        .ino
}

fn ino_of(fs: &Fs, path: &str) -> u64 {
    let (d, n) = split(path);
    fs.lookup(dir_ino(fs, d), n.as_bytes())
        .expect("model file")
        .ino
}

/// Runs `ops` seeded operations on `fs` (a fresh pool), calling `trace`
/// for the current length of the device trace, and returns the
/// durability points in order (the first is the empty workload tree,
/// committed before the operations start).
pub fn run(fs: &Fs, seed: u64, ops: usize, trace: &dyn Fn() -> usize) -> Vec<Point> {
    let mut rng = Rng::new(seed);
    let mut m = Model::default();
    for d in DIRS {
        fs.mkdir(Ctx::ROOT, ROOT_INO, d.as_bytes(), 0o755).unwrap();
    }
    fs.flush().unwrap();
    let mut points = vec![Point {
        started: trace(),
        acked: trace(),
        what: "setup",
        state: Tree::new(),
        snapshot: None,
    }];
    let mut snaps = 0;
    for _ in 0..ops {
        let path = format!(
            "{}/f{}",
            DIRS[rng.below(3) as usize],
            rng.below(NAMES as u64)
        );
        let exists = m.paths.contains_key(&path);
        let mut durable = |what: &'static str, f: &mut dyn FnMut(), snapshot: Option<String>| {
            let started = trace();
            f();
            points.push(Point {
                started,
                acked: trace(),
                what,
                state: m.tree(),
                snapshot,
            });
        };
        match rng.below(100) {
            0..=14 if !exists => {
                let (d, n) = split(&path);
                let i = fs
                    .create(Ctx::ROOT, dir_ino(fs, d), n.as_bytes(), 0o644)
                    .unwrap();
                fs.release(i.ino);
                m.next_group += 1;
                m.paths.insert(path, m.next_group);
                m.data.insert(m.next_group, Vec::new());
            }
            0..=39 if exists => {
                let g = m.paths[&path];
                let cur = m.data[&g].len() as u64;
                let off = match rng.below(3) {
                    0 => cur,
                    1 => rng.below(cur + 1),
                    _ => rng.below(4) * 65536 + rng.below(2) * 4096,
                };
                let len = [512, 4096, 8192, 65536, 70000][rng.below(5) as usize];
                let bytes = payload(&mut rng, len);
                fs.write(ino_of(fs, &path), off, &bytes).unwrap();
                let d = m.data.get_mut(&g).unwrap();
                let end = off as usize + len;
                if d.len() < end {
                    d.resize(end, 0);
                }
                d[off as usize..end].copy_from_slice(&bytes);
            }
            40..=46 if exists => {
                let g = m.paths[&path];
                let size = rng.below(200_000);
                let a = cairn_fs::SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                fs.setattr(ino_of(fs, &path), &a).unwrap();
                m.data.get_mut(&g).unwrap().resize(size as usize, 0);
            }
            47..=54 if exists => {
                let to = format!("{}/f{}", DIRS[rng.below(3) as usize], rng.below(6));
                if to != path {
                    let ((d1, n1), (d2, n2)) = (split(&path), split(&to));
                    let (p1, p2) = (dir_ino(fs, d1), dir_ino(fs, d2));
                    fs.rename(p1, n1.as_bytes(), p2, n2.as_bytes(), RenameFlags::default())
                        .unwrap();
                    // Onto another name of the same file (a hard link made
                    // by the case below), POSIX rename does nothing.
                    let g = m.paths[&path];
                    if m.paths.get(&to) != Some(&g) {
                        m.paths.remove(&path);
                        m.paths.insert(to, g);
                        m.forget_orphans();
                    }
                }
            }
            55..=59 if exists => {
                let to = format!("{}/f{}", DIRS[rng.below(3) as usize], rng.below(6));
                if !m.paths.contains_key(&to) {
                    let (d2, n2) = split(&to);
                    fs.link(ino_of(fs, &path), dir_ino(fs, d2), n2.as_bytes())
                        .unwrap();
                    let g = m.paths[&path];
                    m.paths.insert(to, g);
                }
            }
            60..=66 if exists => {
                let (d, n) = split(&path);
                fs.unlink(dir_ino(fs, d), n.as_bytes()).unwrap();
                m.paths.remove(&path);
                m.forget_orphans();
            }
            67..=79 => durable("fsync", &mut || fs.fsync(ROOT_INO).unwrap(), None),
            80..=86 => durable("flush", &mut || fs.flush().unwrap(), None),
            87..=89 => {
                snaps += 1;
                let name = format!("s{snaps}");
                let kind = cairn_fs::SnapshotKind::Named;
                let mut f = || drop(fs.snapshot_create(&name, kind).unwrap());
                durable("snapshot", &mut f, Some(name.clone()));
            }
            90..=91 => durable("prune", &mut || prune(fs), None),
            92..=93 => {
                // gc commits only when it finds something to move.
                let mut f = || {
                    fs.flush().unwrap();
                    drop(fs.gc(90, 0, &|_, _| {}).unwrap());
                };
                durable("gc", &mut f, None);
            }
            94..=95 => {
                let o = ReblockOptions {
                    max_live_pct: 90,
                    files: true,
                    rate_limit: 0,
                };
                durable(
                    "reblock",
                    &mut || drop(fs.reblock(&o, &|_, _| {}).unwrap()),
                    None,
                );
            }
            96..=97 => durable("migrate", &mut || migrate(fs), None),
            _ => {}
        }
    }
    points
}

impl Model {
    /// Drops the contents of groups no path names any more.
    fn forget_orphans(&mut self) {
        let live: std::collections::BTreeSet<u32> = self.paths.values().copied().collect();
        self.data.retain(|g, _| live.contains(g));
    }
}

/// Drops all fine-grained history (a commit of its own, after a flush).
fn prune(fs: &Fs) {
    let p = PrunePolicy {
        retention_secs: 0,
        keep_daily: 0,
        keep_weekly: 0,
        keep_monthly: 0,
    };
    fs.prune(&p, false).unwrap();
}

/// Commits, then moves every sealed segment to another tier and back
/// (each move a commit of its own).
fn migrate(fs: &Fs) {
    fs.flush().unwrap();
    for (id, _) in fs.pool().chunks.segment_table() {
        let _ = fs.move_segment(id, |d, _, _| d.class() == cairn_devices::DeviceClass::Hdd);
    }
}

/// The tree as the filesystem has it, in the model's terms: groups are
/// numbered by inode, so only which paths share one can be compared.
pub fn read_tree(fs: &Fs) -> Tree {
    let mut out = Tree::new();
    for d in DIRS {
        let dir = fs.lookup(ROOT_INO, d.as_bytes()).expect("workload dir");
        for e in fs.readdir(dir.ino, 0, 1000).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            assert_eq!(e.kind, FileKind::File, "{d}/{:?}", e.name);
            let i = fs.getattr(e.ino).unwrap();
            let data = fs.read(e.ino, 0, i.size as u32 + 1).unwrap();
            assert_eq!(data.len() as u64, i.size, "size of {d}/{:?}", e.name);
            let name = format!("{d}/{}", String::from_utf8_lossy(&e.name));
            out.insert(name, (data, e.ino as u32));
        }
    }
    out
}

/// The same tree as of snapshot `tid`, read through the history.
pub fn read_tree_at(fs: &Fs, tid: u64) -> Tree {
    let mut out = Tree::new();
    for d in DIRS {
        let dir = fs.asof_lookup(ROOT_INO, tid, d.as_bytes()).unwrap();
        for e in fs.asof_readdir(dir.ino, tid, 0, 1000).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let i = fs.asof_lookup(dir.ino, tid, &e.name).unwrap();
            let data = fs.asof_read(e.ino, tid, 0, i.size as u32 + 1).unwrap();
            let name = format!("{d}/{}", String::from_utf8_lossy(&e.name));
            out.insert(name, (data, e.ino as u32));
        }
    }
    out
}

/// True if two trees hold the same paths with the same contents, and the
/// same paths share a file.
pub fn same(a: &Tree, b: &Tree) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut map: BTreeMap<u32, u32> = BTreeMap::new();
    for ((pa, (da, ga)), (pb, (db, gb))) in a.iter().zip(b) {
        if pa != pb || da != db || *map.entry(*ga).or_insert(*gb) != *gb {
            return false;
        }
    }
    // The group map must also be one-to-one.
    let mut seen = std::collections::BTreeSet::new();
    map.values().all(|g| seen.insert(*g))
}

/// A short description of how two trees differ, for failure messages.
pub fn diff(want: &Tree, got: &Tree) -> String {
    let mut out = Vec::new();
    for (p, (d, _)) in want {
        match got.get(p) {
            None => out.push(format!("{p}: missing")),
            Some((g, _)) if g != d => {
                let at = d.iter().zip(g).position(|(x, y)| x != y);
                out.push(format!(
                    "{p}: {} bytes, want {} (first difference at {at:?})",
                    g.len(),
                    d.len()
                ));
            }
            _ => {}
        }
    }
    for p in got.keys().filter(|p| !want.contains_key(*p)) {
        out.push(format!("{p}: not expected"));
    }
    if out.is_empty() {
        out.push("hard links differ".into());
    }
    out.join("; ")
}
