//! History and snapshots through a real mount and the `cairn` CLI: `@@0x<tid>`
//! views and `.snapshots/NAME` checked against recorded trees (randomized,
//! seeded), read-only views (EROFS), snapshot hashes that survive prune,
//! reblock and remounts, prune space accounting and `--dry-run`, file
//! history and undo, reblock under concurrent writers, kill -9 during prune
//! and reblock, and bad input. Every test ends with `cairn check`.
//! Seeds are printed; reproduce with CAIRN_SEED=<seed>. CAIRN_HISTORY_BATCHES
//! and CAIRN_HISTORY_CRASH_ROUNDS make the randomized tests longer.

mod common;

use common::hist::*;
use common::json::Json;
use common::tree_gen::*;
use common::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{symlink, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

// ------------------------------------------------------------------ helpers

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Fresh pool on one device file of `size` (e.g. "1G"), mounted.
fn fs_with_device(size: &str) -> Fs {
    let mut fs = Fs::create();
    let dev = fs.dev("ssd0");
    fs.mkfs(&["--device", &format!("ssd:{dev}:{size}")]);
    fs.mount();
    fs
}

/// fsync of a directory (makes creates/unlinks/renames in it durable).
fn sync_dir(p: &Path) {
    File::open(p)
        .and_then(|d| d.sync_all())
        .unwrap_or_else(|e| panic!("fsync dir {}: {e}", p.display()));
}

/// `cairn prune TARGET ARGS... --json`.
#[track_caller]
fn prune_json(target: &Path, args: &[&str]) -> Json {
    let mut all: Vec<&OsStr> = vec![os("prune"), target.as_os_str()];
    all.extend(args.iter().map(|a| os(a)));
    all.push(os("--json"));
    let j = cairn_json(&all);
    for k in [
        "cutoff_tid",
        "elements",
        "chunks_freed",
        "bytes_freed",
        "segments_freed",
    ] {
        field_u64(&j, k);
    }
    field_arr(&j, "expired_snapshots");
    assert_eq!(
        field_bool(&j, "dry_run"),
        args.contains(&"--dry-run"),
        "prune dry_run field: {j:?}"
    );
    j
}

/// `cairn reblock TARGET ARGS... --json`.
#[track_caller]
fn reblock_json(target: &Path, args: &[&str]) -> Json {
    let mut all: Vec<&OsStr> = vec![os("reblock"), target.as_os_str()];
    all.extend(args.iter().map(|a| os(a)));
    all.push(os("--json"));
    let j = cairn_json(&all);
    for k in [
        "segments_rewritten",
        "files_rewritten",
        "chunks_moved",
        "bytes_moved",
        "segments_freed",
    ] {
        field_u64(&j, k);
    }
    field_arr(&j, "damaged");
    j
}

/// Snapshot verify that must match, returning the computed hash.
#[track_caller]
fn verify_ok(target: &Path, name: &str, ctx: &str) -> String {
    let (code, j) = snapshot_verify(target, name);
    assert!(
        code == 0 && field_bool(&j, "matches"),
        "{ctx}: snapshot verify {name} must match (exit {code}): {j:?}"
    );
    assert!(
        field_arr(&j, "damaged").is_empty(),
        "{ctx}: verify {name} reports damage: {j:?}"
    );
    assert_eq!(field_str(&j, "name"), name, "{ctx}: verify name: {j:?}");
    let computed = field_str(&j, "computed").to_string();
    if let Json::Str(rec) = field(&j, "recorded") {
        assert_eq!(rec, &computed, "{ctx}: matches=true but hashes differ");
    }
    computed
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The list entry of snapshot `name`.
#[track_caller]
fn list_entry(target: &Path, name: &str) -> Json {
    let list = snapshot_list(target);
    list.iter()
        .find(|e| e.get("name").and_then(Json::as_str) == Some(name))
        .unwrap_or_else(|| panic!("snapshot {name} not in list {list:?}"))
        .clone()
}

fn list_names(target: &Path) -> BTreeSet<String> {
    snapshot_list(target)
        .iter()
        .map(|e| field_str(e, "name").to_string())
        .collect()
}

fn open_raw(p: &Path, flags: libc::c_int) -> io::Result<()> {
    let c = cpath(p);
    let fd =
        cvt(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o644) } as libc::c_long)?;
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}

/// Opens `p` with `flags` and writes one byte: the first error, if any. On
/// a view the open itself may succeed (the kernel opens files without
/// asking the daemon, and root passes every permission check), the write
/// may not.
fn open_write_raw(p: &Path, flags: libc::c_int) -> io::Result<()> {
    let c = cpath(p);
    let fd =
        cvt(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o644) } as libc::c_long)?;
    let fd = fd as libc::c_int;
    let r = cvt(unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) } as libc::c_long);
    unsafe { libc::close(fd) };
    r.map(|_| ())
}

fn truncate_raw(p: &Path, len: i64) -> io::Result<()> {
    let c = cpath(p);
    cvt(unsafe { libc::truncate(c.as_ptr(), len) } as libc::c_long).map(|_| ())
}

fn setxattr_raw(p: &Path, name: &str, val: &[u8]) -> io::Result<()> {
    let (c, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    cvt(
        unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), val.as_ptr().cast(), val.len(), 0) }
            as libc::c_long,
    )
    .map(|_| ())
}

fn getxattr_raw(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let (c, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    let len =
        cvt(
            unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }
                as libc::c_long,
        )?;
    buf.truncate(len as usize);
    Ok(buf)
}

/// utimensat(path, now, now): what `touch` does.
fn touch_raw(p: &Path) -> io::Result<()> {
    let c = cpath(p);
    let ts = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
    ];
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) } as libc::c_long)
        .map(|_| ())
}

/// Days since 1970-01-01 -> (year, month, day), proleptic Gregorian (UTC).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

/// `auto-YYYYMMDD-HHMMSS` for a unix time in seconds (UTC).
fn auto_name(secs: u64) -> String {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "auto-{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

// ============================================================ 1. model test

const LINK_TARGETS: &[&str] = &["a", "../b", "d/e", "nowhere", "ünï/ß"];
const FILE_MODES: &[u32] = &[0o644, 0o600, 0o755, 0o640, 0o444];
const DIR_MODES: &[u32] = &[0o755, 0o700, 0o750, 0o1777];

#[derive(Debug, Clone)]
enum Op {
    Write(String, u64, u64, usize), // path, offset, data seed, length
    Truncate(String, u64),
    Rename(String, String),
    Unlink(String),
    Mkdir(String),
    Rmdir(String),
    Chmod(String, u32),
    Symlink(String, String), // target, path
    Link(String, String),
}

fn apply(root: &Path, op: &Op) -> io::Result<()> {
    let p = |s: &str| root.join(s);
    match op {
        Op::Write(f, off, seed, len) => OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(p(f))?
            .write_all_at(&pattern(*seed, *len), *off),
        Op::Truncate(f, len) => OpenOptions::new().write(true).open(p(f))?.set_len(*len),
        Op::Rename(a, b) => fs::rename(p(a), p(b)),
        Op::Unlink(a) => fs::remove_file(p(a)),
        Op::Mkdir(a) => fs::create_dir(p(a)),
        Op::Rmdir(a) => fs::remove_dir(p(a)),
        Op::Chmod(a, m) => fs::set_permissions(p(a), Permissions::from_mode(*m)),
        Op::Symlink(t, a) => symlink(t, p(a)),
        Op::Link(a, b) => fs::hard_link(p(a), p(b)),
    }
}

impl Gen {
    fn op(&mut self, s: &Snap) -> Op {
        loop {
            let crowded = s.files.len() + s.links.len() > 30;
            let roll = if crowded && self.rng.gen_bool(0.4) {
                55
            } else {
                self.rng.gen_range(0..100)
            };
            if let Some(op) = self.pick(roll, s) {
                return op;
            }
        }
    }

    fn pick(&mut self, roll: u32, s: &Snap) -> Option<Op> {
        let file = s.files.choose(&mut self.rng).cloned();
        let seed = self.rng.gen();
        Some(match roll {
            0..=29 => match file.filter(|_| self.rng.gen_bool(0.7)) {
                Some((f, size)) => Op::Write(f, self.offset(size), seed, self.length(250_000)),
                None => Op::Write(self.fresh(s), self.offset(0), seed, self.length(250_000)),
            },
            30..=39 => {
                let (f, size) = file?;
                let len = match self.rng.gen_range(0..4) {
                    0 => 0,
                    1 => self.rng.gen_range(0..=size),
                    2 => size + self.rng.gen_range(1..100_000),
                    _ => self.rng.gen_range(0..8) * 65_536,
                };
                Op::Truncate(f, len)
            }
            40..=51 => Op::Rename(
                s.entries().choose(&mut self.rng)?.clone(),
                self.target(s, 0.3),
            ),
            52..=61 => Op::Unlink(s.nondirs().choose(&mut self.rng)?.clone()),
            62..=68 if s.dirs.len() < 9 => Op::Mkdir(self.fresh(s)),
            69..=72 => Op::Rmdir(s.entries().choose(&mut self.rng)?.clone()),
            73..=80 => {
                if self.rng.gen_bool(0.7) {
                    Op::Chmod(file?.0, *FILE_MODES.choose(&mut self.rng).unwrap())
                } else {
                    let d = s.dirs.iter().filter(|d| !d.is_empty());
                    let d = d.collect::<Vec<_>>().choose(&mut self.rng)?.to_string();
                    Op::Chmod(d, *DIR_MODES.choose(&mut self.rng).unwrap())
                }
            }
            81..=87 => Op::Symlink(
                LINK_TARGETS.choose(&mut self.rng).unwrap().to_string(),
                self.target(s, 0.3),
            ),
            88..=93 => Op::Link(file?.0, self.fresh(s)),
            _ => return None,
        })
    }
}

fn errno_class(op: &Op, e: &io::Error) -> i32 {
    match (op, e.raw_os_error()) {
        (Op::Rename(..), Some(libc::EEXIST)) => libc::ENOTEMPTY,
        (_, Some(n)) => n,
        (_, None) => -1,
    }
}

/// Runs `n` random ops on the mount and on the oracle; results must agree.
fn run_ops(g: &mut Gen, mnt: &Path, oracle: &Path, n: usize, ctx: &str) {
    let mut recent: Vec<String> = Vec::new();
    for i in 0..n {
        let op = g.op(&Snap::of(oracle));
        let (got, want) = (apply(mnt, &op), apply(oracle, &op));
        recent.push(format!("#{i} {op:?} -> {want:?}"));
        let same = match (&got, &want) {
            (Ok(()), Ok(())) => true,
            (Err(a), Err(b)) => errno_class(&op, a) == errno_class(&op, b),
            _ => false,
        };
        if !same {
            let r = recent[recent.len().saturating_sub(12)..].join("\n");
            panic!("{ctx} op #{i} {op:?}: cairn {got:?} vs oracle {want:?}\nrecent ops:\n{r}");
        }
    }
}

/// One recorded point in time: a TID and the tree it must show.
struct Rec {
    label: String,
    tid: u64,
    tree: Tree,
    /// Inode numbers (on the mount) of the directories of `tree`.
    dir_inos: BTreeMap<String, u64>,
}

fn dir_inos(mnt: &Path, t: &Tree) -> BTreeMap<String, u64> {
    t.iter()
        .filter(|(_, n)| matches!(n, Node::Dir { .. }))
        .map(|(p, _)| (p.clone(), fs::metadata(mnt.join(p)).unwrap().ino()))
        .collect()
}

/// Every `@@` root view and every `.snapshots/NAME` against its record.
fn check_views(mnt: &Path, recs: &[Rec], snaps: &[(String, usize)], ctx: &str) {
    for r in recs {
        let what = format!("{ctx}: {} = MNT/{}", r.label, tid_suffix(r.tid));
        assert_view_at(&root_at(mnt, r.tid), &r.tree, &what);
    }
    for (name, i) in snaps {
        let what = format!("{ctx}: .snapshots/{name} (= {})", recs[*i].label);
        assert_view_at(&snap_root(mnt, name), &recs[*i].tree, &what);
    }
}

/// `path@@0x<tid>` for recorded entries whose parent directory is, right now,
/// the same directory (inode) that held them at that TID; returns how many
/// paths were checked.
fn check_path_versions(mnt: &Path, recs: &[Rec], now: &BTreeMap<String, u64>, ctx: &str) -> usize {
    let mut checked = 0;
    for r in recs {
        let mut files = 0;
        for (p, node) in &r.tree {
            let parent = p.rsplit_once('/').map_or("", |(d, _)| d);
            let same_dir = now.get(parent).is_some() && now.get(parent) == r.dir_inos.get(parent);
            if !parent.is_empty() && !same_dir {
                continue;
            }
            let ap = at_tid(&mnt.join(p), r.tid);
            let what = format!(
                "{ctx}: {} ({}): {p}{}",
                r.label,
                node_desc(node),
                tid_suffix(r.tid)
            );
            match node {
                Node::File { data, perm, .. } => {
                    files += 1;
                    if files > 10 {
                        continue;
                    }
                    let md =
                        fs::symlink_metadata(&ap).unwrap_or_else(|e| panic!("{what}: stat: {e}"));
                    assert_eq!(md.mode() & 0o7777, *perm, "{what}: permissions");
                    assert_file(&ap, data, &what);
                }
                Node::Dir { .. } => {
                    let mut want: Vec<String> = r
                        .tree
                        .keys()
                        .filter(|k| k.rsplit_once('/').map_or("", |(d, _)| d) == p)
                        .map(|k| k.rsplit_once('/').unwrap().1.to_string())
                        .collect();
                    let mut got: Vec<String> = fs::read_dir(&ap)
                        .unwrap_or_else(|e| panic!("{what}: readdir: {e}"))
                        .map(|e| e.unwrap().file_name().into_string().unwrap())
                        .collect();
                    want.sort();
                    got.sort();
                    assert_eq!(got, want, "{what}: directory listing");
                }
                Node::Link(t) => {
                    let got =
                        fs::read_link(&ap).unwrap_or_else(|e| panic!("{what}: readlink: {e}"));
                    assert_eq!(&got, t, "{what}: symlink target");
                }
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn model_views_match_recorded_trees() {
    let seed = seed();
    let batches = env_usize("CAIRN_HISTORY_BATCHES", 12).max(8);
    println!("history model test: CAIRN_SEED={seed}, {batches} batches");
    let mut fs = Fs::new();
    let oracle = fs.dir.join("oracle");
    fs::create_dir(&oracle).unwrap();
    let mut g = Gen {
        rng: StdRng::seed_from_u64(seed),
    };
    let mut recs: Vec<Rec> = Vec::new();
    let mut snaps: Vec<(String, usize)> = Vec::new();
    for b in 0..batches {
        let ctx = format!("CAIRN_SEED={seed} batch {b}");
        run_ops(&mut g, &fs.mnt, &oracle, 60, &ctx);
        if b == batches / 2 {
            // Uncommitted changes are in the daemon now: older views must
            // not see them.
            check_views(
                &fs.mnt,
                &recs,
                &snaps,
                &format!("{ctx} (with uncommitted changes)"),
            );
        }
        let tree = capture(&oracle).unwrap();
        assert_tree_at(&fs.mnt, &tree, &format!("{ctx}: live mount vs oracle"));
        // Usually `cairn sync`; in one batch the snapshot itself commits.
        let (label, tid) = if b == 5 {
            let j = snapshot_create(&fs.mnt, "commit-by-snapshot");
            snaps.push(("commit-by-snapshot".into(), recs.len()));
            (
                "snapshot commit-by-snapshot".to_string(),
                field_u64(&j, "tid"),
            )
        } else {
            (format!("batch {b}"), sync_tid(&fs.mnt))
        };
        if let Some(prev) = recs.last() {
            assert!(
                tid >= prev.tid,
                "{ctx}: TID went backwards: {tid:#x} after {:#x}",
                prev.tid
            );
            assert!(
                tid > prev.tid || tree == prev.tree,
                "{ctx}: the tree changed but the commit TID {tid:#x} did not"
            );
        }
        let dir_inos = dir_inos(&fs.mnt, &tree);
        recs.push(Rec {
            label,
            tid,
            tree,
            dir_inos,
        });
        if b == 2 || b == 7 {
            let name = format!("after-batch-{b}");
            let j = snapshot_create(&fs.mnt, &name);
            let stid = field_u64(&j, "tid");
            assert!(
                stid >= tid,
                "{ctx}: snapshot {name} has TID {stid:#x}, older than the last sync {tid:#x}"
            );
            snaps.push((name, recs.len() - 1));
        }
        if b == 3 {
            let j = cairn_json(&[os("snapshot"), os("auto"), fs.mnt.as_os_str(), os("--json")]);
            snaps.push((field_str(&j, "name").to_string(), recs.len() - 1));
        }
    }
    // The snapshot list agrees with what was created.
    let list = snapshot_list(&fs.mnt);
    let got: BTreeSet<String> = list
        .iter()
        .map(|e| field_str(e, "name").to_string())
        .collect();
    let want: BTreeSet<String> = snaps.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(got, want, "snapshot list names");
    let ctx = format!("CAIRN_SEED={seed} end");
    check_views(&fs.mnt, &recs, &snaps, &ctx);
    let now = dir_inos(&fs.mnt, &capture(&oracle).unwrap());
    let n = check_path_versions(&fs.mnt, &recs, &now, &ctx);
    assert!(
        n >= recs.len(),
        "{ctx}: only {n} path@@tid lookups were checkable"
    );
    fs.remount();
    let ctx = format!("CAIRN_SEED={seed} after remount");
    assert_tree_at(&fs.mnt, &capture(&oracle).unwrap(), &format!("{ctx}: live"));
    check_views(&fs.mnt, &recs, &snaps, &ctx);
    let m = check_path_versions(&fs.mnt, &recs, &now, &ctx);
    assert_eq!(m, n, "{ctx}: inode numbers changed across the remount");
    println!(
        "{} TIDs, {} snapshots and {n} path@@tid lookups checked (twice)",
        recs.len(),
        snaps.len()
    );

    // Prune all fine-grained history: snapshots stay exact, other TIDs
    // before the cutoff are gone; reblock changes nothing visible.
    let retained: BTreeSet<u64> = list.iter().map(|e| field_u64(e, "tid")).collect();
    let p = prune_json(&fs.mnt, &["--keep-history", "0"]);
    let cutoff = field_u64(&p, "cutoff_tid");
    let last = recs.last().unwrap().tid;
    assert!(
        cutoff >= last,
        "cutoff {cutoff:#x} before the last commit {last:#x}: {p:?}"
    );
    reblock_json(&fs.mnt, &["--max-live", "100"]);
    let ctx = format!("CAIRN_SEED={seed} after prune --keep-history 0 + reblock");
    assert_tree_at(&fs.mnt, &capture(&oracle).unwrap(), &format!("{ctx}: live"));
    let mut gone = 0;
    for r in &recs {
        let view = root_at(&fs.mnt, r.tid);
        if retained.contains(&r.tid) || r.tid >= cutoff {
            let what = format!("{ctx}: {} = MNT/{}", r.label, tid_suffix(r.tid));
            assert_view_at(&view, &r.tree, &what);
        } else {
            let what = format!("{ctx}: pruned {} = MNT/{}", r.label, tid_suffix(r.tid));
            expect_errno(fs::symlink_metadata(&view), libc::ENOENT, &what);
            gone += 1;
        }
    }
    assert!(gone > 0, "{ctx}: no recorded TID was pruned");
    for (name, i) in &snaps {
        let what = format!("{ctx}: .snapshots/{name} (= {})", recs[*i].label);
        assert_view_at(&snap_root(&fs.mnt, name), &recs[*i].tree, &what);
        verify_ok(&fs.mnt, name, &ctx);
    }
    fs.finish();
}

// ========================================================= 2. read-only views

/// Collects every mutating call that did not fail with EROFS, so that one
/// run shows all of them.
#[derive(Default)]
struct Ro {
    failures: Vec<String>,
    checked: usize,
}

impl Ro {
    fn expect<T: std::fmt::Debug>(&mut self, r: io::Result<T>, allowed: &[i32], what: &str) {
        self.checked += 1;
        match r {
            Ok(v) => self.failures.push(format!("{what}: succeeded ({v:?})")),
            Err(e) if e.raw_os_error().is_some_and(|n| allowed.contains(&n)) => {}
            Err(e) => self.failures.push(format!("{what}: {e}")),
        }
    }

    fn erofs<T: std::fmt::Debug>(&mut self, r: io::Result<T>, what: &str) {
        self.expect(r, &[libc::EROFS], what);
    }
}

/// Every mutating call on paths inside a historical view fails with EROFS.
fn view_read_only(ro: &mut Ro, view: &Path, live: &Path, what: &str) {
    let p = |s: &str| view.join(s);
    let ctx = |op: &str| format!("{what}: {op}");
    // Sanity first: the view is there and readable, so EROFS below is not
    // an artefact of a missing path.
    assert_file(&p("top"), b"top v1", &ctx("read top"));
    assert_file(&p("d/f"), &pattern(1, 100_000), &ctx("read d/f"));
    assert!(p("e").is_dir(), "{}", ctx("empty dir e missing"));
    ro.erofs(
        open_write_raw(&p("top"), libc::O_WRONLY),
        &ctx("open(top, O_WRONLY) + write"),
    );
    ro.erofs(
        open_write_raw(&p("top"), libc::O_RDWR),
        &ctx("open(top, O_RDWR) + write"),
    );
    ro.erofs(
        open_write_raw(&p("top"), libc::O_WRONLY | libc::O_APPEND),
        &ctx("open(top, O_WRONLY|O_APPEND) + write"),
    );
    ro.erofs(
        open_write_raw(&p("d/f"), libc::O_WRONLY | libc::O_TRUNC),
        &ctx("open(d/f, O_WRONLY|O_TRUNC) + write"),
    );
    ro.erofs(
        open_raw(&p("new"), libc::O_WRONLY | libc::O_CREAT),
        &ctx("create new"),
    );
    ro.erofs(
        open_raw(&p("d/new"), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL),
        &ctx("create d/new (O_EXCL)"),
    );
    ro.erofs(fs::create_dir(p("newdir")), &ctx("mkdir newdir"));
    ro.erofs(fs::create_dir(p("d/newdir")), &ctx("mkdir d/newdir"));
    ro.erofs(fs::remove_file(p("top")), &ctx("unlink top"));
    ro.erofs(fs::remove_file(p("d/f")), &ctx("unlink d/f"));
    ro.erofs(fs::remove_dir(p("e")), &ctx("rmdir e (empty)"));
    ro.erofs(fs::rename(p("top"), p("top2")), &ctx("rename top -> top2"));
    ro.erofs(fs::rename(p("top"), p("d/f")), &ctx("rename top -> d/f"));
    ro.erofs(fs::rename(p("d"), p("d2")), &ctx("rename dir d -> d2"));
    ro.erofs(
        fs::set_permissions(p("top"), Permissions::from_mode(0o600)),
        &ctx("chmod top"),
    );
    ro.erofs(
        fs::set_permissions(p("d"), Permissions::from_mode(0o700)),
        &ctx("chmod d"),
    );
    ro.erofs(truncate_raw(&p("top"), 0), &ctx("truncate(top, 0)"));
    ro.erofs(touch_raw(&p("top")), &ctx("utimensat(top, now)"));
    ro.erofs(symlink("x", p("sl")), &ctx("symlink sl"));
    ro.erofs(fs::hard_link(p("top"), p("hl")), &ctx("link top -> hl"));
    ro.erofs(
        setxattr_raw(&p("top"), "user.test", b"x"),
        &ctx("setxattr top"),
    );
    // Renames across the boundary between the live tree and the view.
    let cross = [libc::EROFS, libc::EXDEV];
    ro.expect(
        fs::rename(live.join("live-file"), p("d/moved-in")),
        &cross,
        &ctx("rename live-file -> view (EROFS or EXDEV)"),
    );
    ro.expect(
        fs::rename(p("top"), live.join("moved-out")),
        &cross,
        &ctx("rename view/top -> live (EROFS or EXDEV)"),
    );
    // The refused writes left no trace, not even in the kernel's cache.
    assert_file(&p("top"), b"top v1", &ctx("read top after the refusals"));
    assert_file(&p("d/f"), &pattern(1, 100_000), &ctx("read d/f after"));
}

#[test]
fn history_views_are_read_only() {
    let fs = Fs::new();
    let m = fs.mnt.clone();
    fs::create_dir(m.join("d")).unwrap();
    fs::create_dir(m.join("e")).unwrap();
    fs::write(m.join("top"), b"top v1").unwrap();
    fs::write(m.join("d/f"), pattern(1, 100_000)).unwrap();
    fs::write(m.join("live-file"), b"live").unwrap();
    let tid = sync_tid(&m);
    snapshot_create(&m, "s1");
    snapshot_create(&m, "s2");
    // Change the live tree so that the views differ from it.
    fs::write(m.join("top"), b"top v2, longer").unwrap();
    fs::remove_file(m.join("d/f")).unwrap();
    fs::remove_dir(m.join("e")).unwrap();
    sync_tid(&m);

    // `.snapshots` is not listed in the root, but can be looked up.
    let root_names: Vec<String> = fs::read_dir(&m)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        !root_names
            .iter()
            .any(|n| n == ".snapshots" || n.contains("@@")),
        "the root listing shows virtual entries: {root_names:?}"
    );
    let sd = m.join(".snapshots");
    assert!(sd.is_dir(), ".snapshots cannot be looked up");
    let mut snap_names: Vec<String> = fs::read_dir(&sd)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    snap_names.sort();
    assert_eq!(snap_names, ["s1", "s2"], ".snapshots listing");

    let mut ro = Ro::default();
    let view = format!("MNT/{}", tid_suffix(tid));
    view_read_only(&mut ro, &root_at(&m, tid), &m, &view);
    view_read_only(&mut ro, &snap_root(&m, "s1"), &m, "MNT/.snapshots/s1");

    // A single file or directory version: `top@@0x..` and `d@@0x..`.
    let top = at_tid(&m.join("top"), tid);
    assert_file(&top, b"top v1", "top@@tid");
    ro.erofs(
        open_write_raw(&top, libc::O_WRONLY),
        "open(top@@tid, O_WRONLY) + write",
    );
    ro.erofs(truncate_raw(&top, 0), "truncate(top@@tid)");
    ro.erofs(
        fs::set_permissions(&top, Permissions::from_mode(0o600)),
        "chmod top@@tid",
    );
    ro.erofs(touch_raw(&top), "utimensat(top@@tid)");
    ro.erofs(fs::remove_file(&top), "unlink top@@tid");
    ro.erofs(fs::rename(&top, m.join("top3")), "rename top@@tid -> top3");
    let d = at_tid(&m.join("d"), tid);
    assert_file(&d.join("f"), &pattern(1, 100_000), "d@@tid/f");
    ro.erofs(
        open_raw(&d.join("g"), libc::O_WRONLY | libc::O_CREAT),
        "create d@@tid/g",
    );
    ro.erofs(fs::create_dir(d.join("sub")), "mkdir d@@tid/sub");
    ro.erofs(fs::remove_file(d.join("f")), "unlink d@@tid/f");
    ro.erofs(fs::remove_dir(&d), "rmdir d@@tid");
    // The whole-root view itself and the .snapshots directory.
    ro.erofs(
        fs::set_permissions(root_at(&m, tid), Permissions::from_mode(0o700)),
        "chmod MNT/@@tid",
    );
    ro.erofs(fs::create_dir(sd.join("new")), "mkdir .snapshots/new");
    ro.erofs(
        open_raw(&sd.join("newfile"), libc::O_WRONLY | libc::O_CREAT),
        "create .snapshots/newfile",
    );
    ro.erofs(
        fs::rename(sd.join("s1"), sd.join("s3")),
        "rename .snapshots/s1 -> .snapshots/s3",
    );
    ro.erofs(fs::remove_dir(sd.join("s2")), "rmdir .snapshots/s2");
    // readdir of the virtual directories has `.` and `..` like any other.
    for dir in [".snapshots", ".snapshots/s1"] {
        let ls = sh(&m, &format!("ls -a {dir}"));
        let names: Vec<&str> = ls.lines().collect();
        if !names.contains(&".") || !names.contains(&"..") {
            ro.failures.push(format!(
                "readdir {dir} lacks . or ..: ls -a shows {names:?}"
            ));
        }
    }
    println!("{} refused mutations checked", ro.checked);
    assert!(
        ro.failures.is_empty(),
        "{} problems with read-only views ({} mutations checked, all must fail with EROFS):\n  {}",
        ro.failures.len(),
        ro.checked,
        ro.failures.join("\n  ")
    );

    // Nothing changed anywhere.
    assert_file(&m.join("top"), b"top v2, longer", "live top");
    assert_file(&m.join("live-file"), b"live", "live-file");
    for gone in ["top2", "top3", "moved-out"] {
        assert!(!m.join(gone).exists(), "{gone} was created");
    }
    assert_eq!(
        list_names(&m),
        ["s1", "s2"].map(String::from).into(),
        "snapshots"
    );
    let view = capture(&snap_root(&m, "s2")).unwrap();
    let names: Vec<&String> = view.keys().collect();
    assert_eq!(
        names,
        ["d", "d/f", "e", "live-file", "top"],
        ".snapshots/s2 entries"
    );
    verify_ok(&m, "s1", "after the refused writes");
    fs.finish();
}

/// Root may map a view file shared and writable (the kernel opens files
/// without asking the daemon), but the page it dirties is refused when it
/// is written back, and then dropped from the kernel's cache: no reader of
/// the view sees the byte, even while the writer keeps its mapping.
#[test]
fn a_view_written_through_a_shared_mapping_keeps_its_bytes() {
    let fs = Fs::new();
    let m = fs.mnt.clone();
    let data = pattern(7, 10_000);
    fs::write(m.join("f"), &data).unwrap();
    let tid = sync_tid(&m);
    fs::write(m.join("f"), b"changed").unwrap();
    let view = at_tid(&m.join("f"), tid);
    assert_file(&view, &data, "f@@tid before");

    // The kernel no longer asks the daemon about opens (opens.rs).
    let f = OpenOptions::new().read(true).write(true).open(&view);
    let f = f.expect("open f@@tid read-write");
    use std::os::fd::AsRawFd;
    let len = 4096;
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
    unsafe { *(p as *mut u8) = data[0] ^ 0xff };
    let synced = unsafe { libc::msync(p, len, libc::MS_SYNC) };
    assert_eq!(synced, -1, "msync of a dirtied view page succeeded");
    let t0 = Instant::now();
    loop {
        let got = fs::read(&view).unwrap();
        if got == data {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the refused page is still served 10 s later (first byte {:#x}, want {:#x})",
            got[0],
            data[0]
        );
        thread::sleep(Duration::from_millis(20));
    }
    unsafe { libc::munmap(p, len) };
    drop(f);
    assert_file(&view, &data, "f@@tid after the mapping is gone");
    assert_file(&m.join("f"), b"changed", "live f");
    fs.finish();
}

// ================================================ 3. snapshot hash stability

/// Finds every occurrence of `needle` in the file at `dev` (sparse-aware
/// enough: reads 8 MiB at a time).
fn find_in_file(dev: &Path, needle: &[u8]) -> Vec<u64> {
    let f = File::open(dev).unwrap();
    let len = f.metadata().unwrap().len();
    let step = 8 * MIB;
    let mut buf = vec![0u8; step + needle.len()];
    let mut hits = Vec::new();
    let mut off = 0u64;
    while off < len {
        let n = f.read_at(&mut buf, off).unwrap();
        if n < needle.len() {
            break;
        }
        if buf[..n].iter().any(|b| *b != 0) {
            for (i, w) in buf[..n].windows(needle.len()).enumerate() {
                if w == needle && i < step {
                    hits.push(off + i as u64);
                }
            }
        }
        off += step as u64;
    }
    hits
}

#[test]
fn snapshot_hash_survives_changes_prune_reblock_remount() {
    let mut fs = fs_with_device("512M");
    let m = fs.mnt.clone();
    fs::create_dir_all(m.join("d1")).unwrap();
    fs::create_dir_all(m.join("d2/sub")).unwrap();
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("d1/a", pattern(31, 300_000)),
        ("d1/b", pattern(32, MIB + 17)),
        ("d1/c", Vec::new()),
        ("d2/sub/x", pattern(33, 5000)),
        ("d2/sub/y", pattern(34, 64 * KIB)),
        ("top", pattern(35, 200_000)),
    ];
    for (p, d) in &files {
        fs::write(m.join(p), d).unwrap();
    }
    setxattr_raw(&m.join("top"), "user.k", b"v1").unwrap();
    fs::set_permissions(m.join("d2/sub/x"), Permissions::from_mode(0o640)).unwrap();
    let before = sync_tid(&m);
    let t0 = now_ns();
    let j = snapshot_create(&m, "s");
    let tid = field_u64(&j, "tid");
    assert!(
        tid >= before,
        "snapshot TID {tid:#x} older than the sync before it {before:#x}"
    );
    let time_ns = field_u64(&j, "time_ns");
    assert!(
        time_ns + 60_000_000_000 > t0 && time_ns < now_ns() + 60_000_000_000,
        "snapshot time_ns {time_ns} is not now ({t0})"
    );
    assert!(field_f64(&j, "create_ms") >= 0.0, "create_ms: {j:?}");
    let want = capture(&m).unwrap();
    let nbytes: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();

    let e = wait_snapshot_hash(&m, "s", Duration::from_secs(30));
    let hash = field_str(&e, "hash").to_string();
    assert!(is_hex64(&hash), "hash is not 64 hex digits: {e:?}");
    assert_eq!(field_str(&e, "kind"), "named", "{e:?}");
    assert_eq!(field_u64(&e, "tid"), tid, "list tid: {e:?}");
    assert_eq!(field_u64(&e, "time_ns"), time_ns, "list time_ns: {e:?}");
    assert_eq!(
        field_u64(&e, "files"),
        files.len() as u64,
        "list files: {e:?}"
    );
    assert_eq!(field_u64(&e, "bytes"), nbytes, "list bytes: {e:?}");
    field_u64(&e, "unique_bytes");

    let (code, v) = snapshot_verify(&m, "s");
    assert_eq!(code, 0, "first verify: {v:?}");
    assert!(field_bool(&v, "matches"), "first verify: {v:?}");
    assert_eq!(field_str(&v, "recorded"), hash, "recorded hash: {v:?}");
    assert_eq!(field_str(&v, "computed"), hash, "computed hash: {v:?}");
    assert_eq!(field_u64(&v, "tid"), tid, "verify tid: {v:?}");
    assert_eq!(
        field_u64(&v, "files"),
        files.len() as u64,
        "verify files: {v:?}"
    );
    assert_eq!(field_u64(&v, "bytes"), nbytes, "verify bytes: {v:?}");
    assert!(field_arr(&v, "damaged").is_empty(), "{v:?}");

    // Change the live tree in every way the hash covers.
    fs::write(m.join("d1/a"), pattern(41, 250_000)).unwrap();
    fs::write(m.join("d1/b"), pattern(42, 2 * MIB)).unwrap();
    thread::sleep(Duration::from_millis(20));
    touch_raw(&m.join("top")).unwrap();
    touch_raw(&m.join("d1")).unwrap();
    fs::set_permissions(m.join("d2/sub/x"), Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(m.join("d1"), Permissions::from_mode(0o700)).unwrap();
    setxattr_raw(&m.join("top"), "user.k", b"v2").unwrap();
    fs::remove_file(m.join("d2/sub/y")).unwrap();
    fs::remove_file(m.join("d1/c")).unwrap();
    fs::rename(m.join("d2/sub"), m.join("d2/sub2")).unwrap();
    fs::write(m.join("new"), b"new file").unwrap();
    // Data that only history holds, so that prune has something to free.
    fs::write(m.join("scratch"), pattern(43, 3 * MIB)).unwrap();
    sync_tid(&m);
    fs::write(m.join("scratch"), pattern(44, 3 * MIB)).unwrap();
    sync_tid(&m);
    fs::remove_file(m.join("scratch")).unwrap();
    sync_tid(&m);
    let h = verify_ok(&m, "s", "after changing the live tree");
    assert_eq!(h, hash, "hash changed after live changes");
    assert_view_at(
        &snap_root(&m, "s"),
        &want,
        ".snapshots/s after live changes",
    );
    assert_eq!(
        getxattr_raw(&snap_root(&m, "s").join("top"), "user.k").unwrap(),
        b"v1",
        "xattr in the snapshot"
    );

    let p = prune_json(&m, &["--keep-history", "0"]);
    assert!(
        field_u64(&p, "bytes_freed") > 0,
        "prune freed nothing: {p:?}"
    );
    let h = verify_ok(&m, "s", "after prune");
    assert_eq!(h, hash, "hash changed after prune");
    let r = reblock_json(&m, &["--max-live", "100"]);
    println!("reblock: {r:?}");
    let h = verify_ok(&m, "s", "after reblock");
    assert_eq!(h, hash, "hash changed after reblock");
    assert_view_at(
        &snap_root(&m, "s"),
        &want,
        ".snapshots/s after prune + reblock",
    );

    fs.remount();
    let h = verify_ok(&m, "s", "after remount");
    assert_eq!(h, hash, "hash changed after remount");
    let e = list_entry(&m, "s");
    assert_eq!(field_str(&e, "hash"), hash, "listed hash after remount");
    assert_view_at(&snap_root(&m, "s"), &want, ".snapshots/s after remount");

    // Offline: the CLI opens the pool itself.
    fs.unmount();
    let h = verify_ok(&fs.pool, "s", "unmounted pool");
    assert_eq!(h, hash, "hash changed (unmounted pool)");
    assert_eq!(field_str(&list_entry(&fs.pool, "s"), "hash"), hash);
    fs.check();

    // Damage: flip one byte of the old d1/b, which only the snapshot keeps.
    let old_b = pattern(32, MIB + 17);
    let needle = &old_b[700_000..700_064];
    let dev = PathBuf::from(fs.dev("ssd0"));
    let hits = find_in_file(&dev, needle);
    assert!(
        !hits.is_empty(),
        "old content of d1/b not found in the device file"
    );
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
        .unwrap();
    for off in &hits {
        let mut b = [0u8; 1];
        f.read_at(&mut b, off + 10).unwrap();
        f.write_all_at(&[b[0] ^ 0x55], off + 10).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let (code, v) = snapshot_verify(&fs.pool, "s");
    assert_eq!(code, 3, "verify of a damaged snapshot must exit 3: {v:?}");
    assert!(
        !field_bool(&v, "matches"),
        "damaged snapshot matches: {v:?}"
    );
    assert!(
        !field_arr(&v, "damaged").is_empty(),
        "no damage reported: {v:?}"
    );
    println!("damage reported: {:?}", field_arr(&v, "damaged"));
    let out = cairn(&[os("check"), fs.pool.as_os_str()]);
    assert!(
        !out.status.success(),
        "cairn check missed the damaged chunk\n{}",
        describe(&out)
    );
}

// ============================================================= 4. prune

const PRUNE_FILES: usize = 8;
const PRUNE_FILE_LEN: usize = 2 * MIB;

fn version_data(v: u64, i: usize) -> Vec<u8> {
    pattern(1000 * v + i as u64, PRUNE_FILE_LEN)
}

/// Writes version `v` of all files (path -> bytes), closing each.
fn write_version(m: &Path, v: u64) -> BTreeMap<String, Vec<u8>> {
    (0..PRUNE_FILES)
        .map(|i| {
            let name = format!("f{i}");
            let data = version_data(v, i);
            fs::write(m.join(&name), &data).unwrap();
            (name, data)
        })
        .collect()
}

/// The numbers of `cairn info --json` that prune may change.
fn space_numbers(info: &Json) -> [u64; 4] {
    ["physical_bytes", "chunks", "segments", "history_elements"].map(|k| field_u64(info, k))
}

#[track_caller]
fn assert_enoent(p: &Path, what: &str) {
    expect_errno(
        fs::symlink_metadata(p),
        libc::ENOENT,
        &format!("stat {what}"),
    );
    expect_errno(fs::read(p), libc::ENOENT, &format!("read {what}"));
}

#[test]
fn prune_frees_space_and_keeps_retained_versions() {
    let mut fs = Fs::new();
    let m = fs.mnt.clone();
    let logical = (PRUNE_FILES * PRUNE_FILE_LEN) as u64;
    let v0 = write_version(&m, 0);
    let base = snapshot_create(&m, "base");
    let base_tid = field_u64(&base, "tid");
    let v1 = write_version(&m, 1);
    let t1 = sync_tid(&m);
    let v2 = write_version(&m, 2);
    let t2 = sync_tid(&m);
    let v3 = write_version(&m, 3);
    let t3 = sync_tid(&m);
    assert!(
        base_tid < t1 && t1 < t2 && t2 < t3,
        "TIDs: {base_tid} {t1} {t2} {t3}"
    );
    assert_contents_eq(
        &contents_at(&root_at(&m, t1), "v1"),
        &v1,
        "@@t1 before prune",
    );
    assert_contents_eq(
        &contents_at(&root_at(&m, t2), "v2"),
        &v2,
        "@@t2 before prune",
    );

    // History younger than an hour is kept by --keep-history 1h.
    let p = prune_json(&m, &["--keep-history", "1h"]);
    for k in ["chunks_freed", "bytes_freed", "segments_freed"] {
        assert_eq!(
            field_u64(&p, k),
            0,
            "prune --keep-history 1h freed {k}: {p:?}"
        );
    }
    assert_file(
        &at_tid(&m.join("f0"), t1),
        &v1["f0"],
        "f0@@t1 after prune --keep-history 1h",
    );

    fs.unmount();
    let info0 = pool_info(&fs.pool);
    fs.mount();
    let avail0 = avail_bytes(&m);

    // --dry-run: reports what would go, changes nothing.
    let d1 = prune_json(&m, &["--dry-run", "--keep-history", "0"]);
    let d2 = prune_json(&m, &["--dry-run", "--keep-history", "0"]);
    let dry_bytes = field_u64(&d1, "bytes_freed");
    // v1 and v2 are prunable: 2 x 16 MiB (+ chunk headers).
    let expect = 2 * logical;
    assert!(
        dry_bytes >= expect * 9 / 10 && dry_bytes <= expect * 12 / 10,
        "dry run reports {dry_bytes} bytes_freed, expected about {expect}: {d1:?}"
    );
    for k in ["elements", "chunks_freed", "bytes_freed"] {
        assert_eq!(
            field_u64(&d1, k),
            field_u64(&d2, k),
            "second dry run differs in {k}: {d1:?} vs {d2:?}"
        );
    }
    assert!(field_u64(&d1, "elements") > 0, "{d1:?}");
    assert_eq!(
        avail_bytes(&m),
        avail0,
        "statvfs free space changed after --dry-run"
    );
    assert_contents_eq(
        &contents_at(&root_at(&m, t1), "v1"),
        &v1,
        "@@t1 after --dry-run",
    );
    fs.unmount();
    let info1 = pool_info(&fs.pool);
    assert_eq!(
        space_numbers(&info1),
        space_numbers(&info0),
        "[physical_bytes, chunks, segments, history_elements] changed after prune --dry-run"
    );
    fs.mount();

    // The real prune frees v1 and v2, and exactly what the dry run said.
    let p = prune_json(&m, &["--keep-history", "0"]);
    println!("dry run: {d1:?}\nprune: {p:?}");
    assert_eq!(
        field_u64(&p, "bytes_freed"),
        dry_bytes,
        "prune vs dry run: {p:?} {d1:?}"
    );
    assert_eq!(
        field_u64(&p, "chunks_freed"),
        field_u64(&d1, "chunks_freed"),
        "chunks_freed"
    );
    assert!(
        field_u64(&p, "segments_freed") > 0,
        "no segment freed: {p:?}"
    );
    assert!(
        field_u64(&p, "cutoff_tid") >= t3,
        "cutoff_tid below the last commit {t3}: {p:?}"
    );
    assert!(field_arr(&p, "expired_snapshots").is_empty(), "{p:?}");
    let avail1 = avail_bytes(&m);
    assert!(
        avail1 >= avail0 + expect * 3 / 4,
        "statvfs free space grew by {} after freeing {dry_bytes} bytes",
        avail1 as i64 - avail0 as i64
    );
    assert_enoent(&root_at(&m, t1), "MNT/@@t1 after prune");
    assert_enoent(&root_at(&m, t2), "MNT/@@t2 after prune");
    assert_enoent(&at_tid(&m.join("f0"), t1), "f0@@t1 after prune");
    assert_contents_eq(
        &contents_at(&snap_root(&m, "base"), "base"),
        &v0,
        ".snapshots/base after prune",
    );
    assert_contents_eq(
        &contents_at(&root_at(&m, base_tid), "base"),
        &v0,
        "@@base_tid after prune",
    );
    assert_contents_eq(&contents_at(&m, "live"), &v3, "live tree after prune");
    // What the snapshot list says deleting `base` would free: v0.
    let unique = field_u64(&list_entry(&m, "base"), "unique_bytes");
    assert!(
        unique >= logical * 9 / 10 && unique <= logical * 12 / 10,
        "unique_bytes of base is {unique}, expected about {logical}"
    );
    let again = prune_json(&m, &["--keep-history", "0"]);
    assert_eq!(
        field_u64(&again, "bytes_freed"),
        0,
        "second prune freed more: {again:?}"
    );

    fs.unmount();
    let info2 = pool_info(&fs.pool);
    println!(
        "physical bytes: before {} after dry run {} after prune {}",
        field_u64(&info0, "physical_bytes"),
        field_u64(&info1, "physical_bytes"),
        field_u64(&info2, "physical_bytes")
    );
    let phys = |i: &Json| field_u64(i, "physical_bytes");
    assert!(
        phys(&info2) + expect * 9 / 10 <= phys(&info0),
        "physical bytes {} -> {} after pruning {expect} bytes of history",
        phys(&info0),
        phys(&info2)
    );
    assert!(field_u64(&info2, "history_elements") < field_u64(&info0, "history_elements"));
    fs.check();

    // Offline: delete the snapshot and prune through the pool directory.
    cairn_ok(&[
        os("snapshot"),
        os("delete"),
        fs.pool.as_os_str(),
        os("base"),
    ]);
    assert!(
        snapshot_list(&fs.pool).is_empty(),
        "snapshot list after delete"
    );
    let p = prune_json(&fs.pool, &["--keep-history", "0"]);
    let freed = field_u64(&p, "bytes_freed");
    assert!(
        freed >= logical * 9 / 10 && freed <= logical * 12 / 10,
        "prune after deleting the snapshot freed {freed}, expected about {logical}: {p:?}"
    );
    assert!(
        freed.abs_diff(unique) <= unique / 20,
        "deleting base freed {freed} bytes but snapshot list promised {unique}"
    );
    let info3 = pool_info(&fs.pool);
    assert!(
        phys(&info3) + logical * 9 / 10 <= phys(&info2),
        "physical bytes {} -> {} after deleting the snapshot",
        phys(&info2),
        phys(&info3)
    );
    assert!(
        phys(&info3) <= logical * 11 / 10,
        "only {logical} bytes are live but {} are physical",
        phys(&info3)
    );
    fs.check();
    fs.mount();
    assert_contents_eq(&contents_at(&m, "live"), &v3, "live tree at the end");
    assert_enoent(&snap_root(&m, "base"), ".snapshots/base after delete");
    assert_enoent(&root_at(&m, base_tid), "@@base_tid after delete + prune");
    fs.finish();
}

// ====================================================== 5. history and undo

/// `cairn history PATH --json`, checked for shape and order.
#[track_caller]
fn history(p: &Path) -> Vec<Json> {
    let j = cairn_json(&[os("history"), p.as_os_str(), os("--json")]);
    let v = j
        .as_array()
        .unwrap_or_else(|| panic!("history is not an array: {j:?}"))
        .to_vec();
    assert!(!v.is_empty(), "empty history for {}", p.display());
    for (i, e) in v.iter().enumerate() {
        for k in ["tid", "time_ns", "size"] {
            field_u64(e, k);
        }
        field_f64(e, "mtime_ns");
        assert_eq!(field_str(e, "kind"), "file", "{e:?}");
        let last = i + 1 == v.len();
        match (field(e, "ended_tid"), last) {
            (Json::Null, true) => {}
            (Json::Num(_), false) => {
                let end = field_u64(e, "ended_tid");
                assert!(
                    end > field_u64(e, "tid"),
                    "version ends before it starts: {e:?}"
                );
                assert_eq!(
                    end,
                    field_u64(&v[i + 1], "tid"),
                    "version {i} does not end where the next begins: {v:?}"
                );
            }
            _ => panic!("ended_tid must be null exactly for the current (last) version: {v:?}"),
        }
        if i > 0 {
            assert!(
                field_u64(e, "tid") > field_u64(&v[i - 1], "tid"),
                "history not oldest first: {v:?}"
            );
            assert!(
                field_u64(e, "time_ns") >= field_u64(&v[i - 1], "time_ns"),
                "time_ns goes back: {v:?}"
            );
        }
    }
    v
}

/// The version of a history that was current at `tid`.
fn version_at(h: &[Json], tid: u64) -> &Json {
    h.iter()
        .rev()
        .find(|e| field_u64(e, "tid") <= tid)
        .unwrap_or_else(|| panic!("no version at or before {tid:#x} in {h:?}"))
}

fn perm_of(p: &Path) -> u32 {
    fs::metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn history_lists_versions_and_undo_restores_them() {
    let mut fs = Fs::new();
    let m = fs.mnt.clone();
    let f = m.join("doc");
    let (v1, v2, v3) = (
        pattern(51, 100_000),
        pattern(52, 200_000),
        pattern(53, 50_000),
    );
    fs::write(&f, &v1).unwrap();
    fs::set_permissions(&f, Permissions::from_mode(0o640)).unwrap();
    let t1 = sync_tid(&m);
    fs::write(&f, &v2).unwrap();
    fs::set_permissions(&f, Permissions::from_mode(0o600)).unwrap();
    let t2 = sync_tid(&m);
    fs::write(&f, &v3).unwrap(); // not synced: history commits first
    let h = history(&f);
    assert!(h.len() >= 3, "expected at least 3 versions: {h:?}");
    assert_eq!(
        field_u64(version_at(&h, t1), "size"),
        100_000,
        "size at t1: {h:?}"
    );
    assert_eq!(
        field_u64(version_at(&h, t2), "size"),
        200_000,
        "size at t2: {h:?}"
    );
    let cur = h.last().unwrap();
    assert_eq!(field_u64(cur, "size"), 50_000, "current size: {h:?}");
    assert!(
        field_u64(cur, "tid") > t2,
        "current version not after t2: {h:?}"
    );
    assert_file(&at_tid(&f, t1), &v1, "doc@@t1");
    assert_file(&at_tid(&f, t2), &v2, "doc@@t2");
    // Every listed TID can be opened and has the listed size.
    for e in &h {
        let tid = field_u64(e, "tid");
        let md =
            fs::metadata(at_tid(&f, tid)).unwrap_or_else(|e| panic!("stat doc@@{tid:#x}: {e}"));
        assert_eq!(
            md.len(),
            field_u64(e, "size"),
            "size of doc@@{tid:#x} vs history"
        );
    }

    // undo --tid (hex): content and mode of v1 come back as a new version.
    let n = h.len();
    cairn_ok(&[
        os("undo"),
        f.as_os_str(),
        os("--tid"),
        os(&format!("0x{t1:016x}")),
    ]);
    assert_file(&f, &v1, "doc after undo --tid t1");
    assert_eq!(perm_of(&f), 0o640, "mode after undo to t1");
    let h2 = history(&f);
    assert!(h2.len() > n, "undo did not add a version: {h2:?}");
    assert!(field_u64(h2.last().unwrap(), "tid") > field_u64(cur, "tid"));
    assert_eq!(field_u64(h2.last().unwrap(), "size"), 100_000, "{h2:?}");
    assert_file(&at_tid(&f, t2), &v2, "doc@@t2 after undo");
    let cur_tid = field_u64(cur, "tid");
    assert_file(
        &at_tid(&f, cur_tid),
        &v3,
        "v3 is still in history after undo",
    );

    // undo -o (decimal TID): old content to another file, doc unchanged.
    let out_in = m.join("restored-v2");
    cairn_ok(&[
        os("undo"),
        f.as_os_str(),
        os("--tid"),
        os(&t2.to_string()),
        os("-o"),
        out_in.as_os_str(),
    ]);
    assert_file(&out_in, &v2, "undo -o inside the mount");
    let out_ext = fs.dir.join("restored-v3");
    cairn_ok(&[
        os("undo"),
        f.as_os_str(),
        os("--tid"),
        os(&cur_tid.to_string()),
        os("-o"),
        out_ext.as_os_str(),
    ]);
    assert_file(&out_ext, &v3, "undo -o outside the mount");
    assert_file(&f, &v1, "doc after undo -o");
    assert_eq!(
        history(&f).len(),
        h2.len(),
        "undo -o changed the history of doc"
    );

    // undo --snapshot.
    let v4 = pattern(54, 333_333);
    fs::write(&f, &v4).unwrap();
    fs::set_permissions(&f, Permissions::from_mode(0o644)).unwrap();
    snapshot_create(&m, "before-v5");
    fs::write(&f, pattern(55, 10)).unwrap();
    fs::set_permissions(&f, Permissions::from_mode(0o600)).unwrap();
    cairn_ok(&[os("undo"), f.as_os_str(), os("--snapshot"), os("before-v5")]);
    assert_file(&f, &v4, "doc after undo --snapshot");
    assert_eq!(perm_of(&f), 0o644, "mode after undo --snapshot");
    // In a subdirectory, with -o and a snapshot.
    fs::create_dir(m.join("sub")).unwrap();
    fs::write(m.join("sub/g"), b"g one").unwrap();
    snapshot_create(&m, "g1");
    fs::write(m.join("sub/g"), b"g two, longer").unwrap();
    cairn_ok(&[
        os("undo"),
        m.join("sub/g").as_os_str(),
        os("--snapshot"),
        os("g1"),
        os("-o"),
        m.join("sub/g.old").as_os_str(),
    ]);
    assert_file(&m.join("sub/g.old"), b"g one", "sub/g.old");
    assert_file(&m.join("sub/g"), b"g two, longer", "sub/g after undo -o");

    // Undone versions are real, committed versions.
    fs.remount();
    assert_file(&f, &v4, "doc after remount");
    assert_eq!(perm_of(&f), 0o644, "mode after remount");
    assert_file(&out_in, &v2, "restored-v2 after remount");
    let h3 = history(&f);
    assert!(h3.len() >= h2.len() + 2, "{h3:?}");
    fs.finish();
}

// ================================================ 6. reblock under writers

const FRAG_FILES: usize = 16;
const FRAG_BLOCKS: usize = 32;
const BLOCK: usize = 64 * KIB;

fn frag_block(i: usize, b: usize) -> Vec<u8> {
    pattern((i * 1000 + b) as u64, BLOCK)
}

/// Writer thread: rewrites files in `w/`, some fsynced, reading each back
/// (uncached). Returns the final content of its files.
fn reblock_writer(
    root: PathBuf,
    seed: u64,
    stop: Arc<AtomicBool>,
    iters: Arc<AtomicU64>,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut mine = BTreeMap::new();
    while !stop.load(Ordering::SeqCst) {
        let name = format!("w/f{}", rng.gen_range(0..8));
        let data = pattern(rng.gen(), rng.gen_range(1..400_000));
        let p = root.join(&name);
        let res = (|| -> io::Result<()> {
            let mut f = File::create(&p)?;
            f.write_all(&data)?;
            if rng.gen_bool(0.3) {
                f.sync_all()?;
            }
            Ok(())
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

#[test]
fn reblock_under_concurrent_writes() {
    let seed = seed();
    println!("reblock test: CAIRN_SEED={seed}");
    let mut fs = Fs::new();
    let m = fs.mnt.clone();
    fs::create_dir(m.join("frag")).unwrap();
    fs::create_dir(m.join("w")).unwrap();
    // One block of every file per commit: each file ends up scattered.
    let handles: Vec<File> = (0..FRAG_FILES)
        .map(|i| File::create(m.join(format!("frag/f{i:02}"))).unwrap())
        .collect();
    drop(handles);
    for b in 0..FRAG_BLOCKS {
        for i in 0..FRAG_FILES {
            let f = OpenOptions::new()
                .write(true)
                .open(m.join(format!("frag/f{i:02}")))
                .unwrap();
            f.write_all_at(&frag_block(i, b), (b * BLOCK) as u64)
                .unwrap();
        }
        sync_tid(&m);
    }
    let all: BTreeMap<String, Vec<u8>> = (0..FRAG_FILES)
        .map(|i| {
            let d: Vec<u8> = (0..FRAG_BLOCKS).flat_map(|b| frag_block(i, b)).collect();
            (format!("frag/f{i:02}"), d)
        })
        .collect();
    assert_contents_eq(
        &contents_at(&m.join("frag"), "frag")
            .into_iter()
            .map(|(k, v)| (format!("frag/{k}"), v))
            .collect(),
        &all,
        "fragmented files",
    );
    // Delete every other file and drop its history: segments become sparse.
    for i in (1..FRAG_FILES).step_by(2) {
        fs::remove_file(m.join(format!("frag/f{i:02}"))).unwrap();
    }
    let survivors: BTreeMap<String, Vec<u8>> = (0..FRAG_FILES)
        .step_by(2)
        .map(|i| format!("frag/f{i:02}"))
        .map(|k| (k.clone(), all[&k].clone()))
        .collect();
    let p = prune_json(&m, &["--keep-history", "0"]);
    assert!(
        field_u64(&p, "bytes_freed") >= (FRAG_FILES / 2 * FRAG_BLOCKS * BLOCK) as u64 * 9 / 10,
        "prune: {p:?}"
    );
    snapshot_create(&m, "survivors");
    let snap_tree = capture(&m).unwrap();

    // Options: with --max-live 1 --no-files nothing qualifies (segments are about half live).
    let r0 = reblock_json(&m, &["--max-live", "1", "--no-files"]);
    assert_eq!(
        field_u64(&r0, "chunks_moved"),
        0,
        "reblock --max-live 1 --no-files moved chunks: {r0:?}"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let (w_iters, r_iters) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (root, st, it) = (m.clone(), stop.clone(), w_iters.clone());
        thread::spawn(move || reblock_writer(root, seed, st, it))
    };
    let reader = {
        let (root, surv, st, it) = (m.clone(), survivors.clone(), stop.clone(), r_iters.clone());
        thread::spawn(move || check_reads(root, surv, seed ^ 1, st, it, "being reblocked"))
    };
    thread::sleep(Duration::from_millis(200));
    let (w0, r0) = (
        w_iters.load(Ordering::SeqCst),
        r_iters.load(Ordering::SeqCst),
    );
    let t0 = Instant::now();
    let args = [os("reblock"), m.as_os_str(), os("--json")];
    let out = run_timeout(Command::new(CAIRN).args(args), CMD_TIMEOUT);
    let took = t0.elapsed();
    let w_during = w_iters.load(Ordering::SeqCst) - w0;
    let r_during = r_iters.load(Ordering::SeqCst) - r0;
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::SeqCst);
    let mine = writer.join().expect("writer panicked");
    let read = reader.join().expect("reader panicked");
    assert!(out.status.success(), "reblock failed\n{}", describe(&out));
    let r = parse_json_out(&args, &out);
    println!(
        "reblock took {took:?}; meanwhile {w_during} writes and {r_during} reads of reblocked files: {r:?}"
    );
    let mine = mine.unwrap_or_else(|e| panic!("writer during reblock: {e}"));
    read.unwrap_or_else(|e| panic!("reader during reblock: {e}"));
    assert!(
        field_u64(&r, "chunks_moved") > 0,
        "reblock moved no chunks: {r:?}"
    );
    assert!(field_u64(&r, "bytes_moved") > 0, "{r:?}");
    assert!(
        field_u64(&r, "segments_freed") > 0,
        "reblock freed no segment: {r:?}"
    );
    assert!(field_arr(&r, "damaged").is_empty(), "{r:?}");
    assert!(
        w_during > 0 && r_during > 0,
        "writer/reader made no progress while reblock ran ({took:?})"
    );

    let mut want = survivors.clone();
    want.extend(mine);
    let check_all = |m: &Path, ctx: &str| {
        let mut got = contents_at(&m.join("frag"), ctx)
            .into_iter()
            .map(|(k, v)| (format!("frag/{k}"), v))
            .collect::<BTreeMap<_, _>>();
        got.extend(
            contents_at(&m.join("w"), ctx)
                .into_iter()
                .map(|(k, v)| (format!("w/{k}"), v)),
        );
        assert_contents_eq(&got, &want, ctx);
        assert_view_at(
            &snap_root(m, "survivors"),
            &snap_tree,
            &format!("{ctx}: .snapshots/survivors"),
        );
    };
    check_all(&m, "after reblock");
    verify_ok(&m, "survivors", "after reblock");
    fs.unmount();
    fs.check();
    fs.mount();
    check_all(&m, "after reblock + remount");
    fs.finish();
}

// ================================== 7. kill -9 during prune and reblock

/// Files of the crash test: path -> content, all fsynced.
type Model = BTreeMap<String, Vec<u8>>;

const BIG_FILES: usize = 12;
const SMALL_FILES: usize = 400;

/// One round of changes: rewrite half of the big files in four pieces, one
/// commit per piece, so that segments mix files and become sparse once the
/// old versions are pruned; replace the previous round's small files (many
/// elements for prune). Everything is fsynced.
fn crash_round_writes(m: &Path, model: &mut Model, round: usize, rng: &mut StdRng) {
    let mut pick: Vec<usize> = (0..BIG_FILES).collect();
    pick.shuffle(rng);
    let new: Vec<(String, Vec<u8>)> = pick[..BIG_FILES / 2]
        .iter()
        .map(|i| {
            let len = rng.gen_range(768 * KIB..1536 * KIB);
            (format!("big/f{i:02}"), pattern(rng.gen(), len))
        })
        .collect();
    for (n, _) in &new {
        File::create(m.join(n)).unwrap();
    }
    for piece in 0..4 {
        for (n, d) in &new {
            let (a, b) = (d.len() * piece / 4, d.len() * (piece + 1) / 4);
            let f = OpenOptions::new().write(true).open(m.join(n)).unwrap();
            f.write_all_at(&d[a..b], a as u64).unwrap();
            if piece == 3 {
                f.sync_all().unwrap();
            }
        }
        sync_tid(m);
    }
    model.extend(new);
    if round > 0 {
        let old = m.join(format!("small{}", round - 1));
        for k in 0..SMALL_FILES {
            let n = format!("small{}/s{k:03}", round - 1);
            fs::remove_file(m.join(&n)).unwrap();
            model.remove(&n);
        }
        fs::remove_dir(&old).unwrap();
    }
    let dir = m.join(format!("small{round}"));
    fs::create_dir(&dir).unwrap();
    for k in 0..SMALL_FILES {
        let n = format!("small{round}/s{k:03}");
        let data = pattern(rng.gen(), rng.gen_range(0..6000));
        fs::write(m.join(&n), &data).unwrap();
        model.insert(n, data);
    }
    sync_dir(&dir);
    sync_dir(m);
}

/// Live tree, every kept snapshot (content and verify) and the snapshot list.
fn crash_verify(fs: &Fs, model: &Model, snaps: &BTreeMap<String, Model>, ctx: &str) {
    let m = &fs.mnt;
    assert_contents_eq(&contents_at(m, ctx), model, &format!("{ctx}: live tree"));
    let names: BTreeSet<String> = snaps.keys().cloned().collect();
    assert_eq!(list_names(m), names, "{ctx}: snapshot list");
    for (name, want) in snaps {
        let got = contents_at(&snap_root(m, name), ctx);
        assert_contents_eq(&got, want, &format!("{ctx}: .snapshots/{name}"));
        verify_ok(m, name, ctx);
    }
}

#[test]
fn kill9_during_prune_and_reblock() {
    let seed = seed();
    let rounds = env_usize("CAIRN_HISTORY_CRASH_ROUNDS", 10);
    println!("prune/reblock crash test: CAIRN_SEED={seed}, {rounds} rounds");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fs = fs_with_device("1G");
    let m = fs.mnt.clone();
    fs::create_dir(m.join("big")).unwrap();
    let mut model = Model::new();
    for i in 0..BIG_FILES {
        let name = format!("big/f{i:02}");
        let data = pattern(rng.gen(), 1024 * KIB);
        write_synced(&m.join(&name), &data);
        model.insert(name, data);
    }
    let prune_args = [os("prune"), m.as_os_str(), os("--keep-history"), os("0")];
    let reblock_args = [os("reblock"), m.as_os_str(), os("--max-live"), os("90")];
    let mut snaps: BTreeMap<String, Model> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    // Round 0 measures how long prune and reblock take on this workload;
    // later rounds kill the daemon at a random point of that time.
    let (mut d_prune, mut d_reblock) = (Duration::ZERO, Duration::ZERO);
    let mut hits = 0;
    for round in 0..=rounds {
        let ctx = format!("CAIRN_SEED={seed} round {round}");
        crash_round_writes(&m, &mut model, round, &mut rng);
        let name = format!("c{round:02}");
        snapshot_create(&m, &name);
        snaps.insert(name.clone(), model.clone());
        order.push(name);
        if order.len() > 3 {
            let old = order.remove(0);
            cairn_ok(&[os("snapshot"), os("delete"), m.as_os_str(), os(&old)]);
            snaps.remove(&old);
        }
        if round == 0 {
            d_prune = timed(&prune_args).0;
            d_reblock = timed(&reblock_args).0;
            println!("{ctx}: prune took {d_prune:?}, reblock {d_reblock:?}");
            continue;
        }
        let reblock = round % 2 == 0;
        if reblock {
            // Make segments sparse first, then kill during the reblock.
            d_prune = timed(&prune_args).0;
        }
        let (args, d) = if reblock {
            (&reblock_args, d_reblock)
        } else {
            (&prune_args, d_prune)
        };
        let max = (d.as_micros() as u64 * 6 / 5).max(2000);
        let delay = Duration::from_micros(rng.gen_range(0..max));
        let hit = kill_during(&mut fs, args, delay, &ctx);
        hits += hit as usize;
        println!(
            "{ctx}: killed the daemon {delay:?} after starting {} (took {d:?} unkilled); it was {}",
            if reblock { "reblock" } else { "prune" },
            if hit { "still running" } else { "already done" }
        );
        // The pool as the crash left it must be consistent.
        fs.check();
        fs.mount();
        crash_verify(&fs, &model, &snaps, &format!("{ctx} after kill -9"));
    }
    assert!(
        hits * 3 >= rounds,
        "only {hits} of {rounds} kills hit a running prune/reblock: test too weak"
    );
    // Unkilled prune + reblock still work on the recovered pool.
    prune_json(&m, &["--keep-history", "0"]);
    reblock_json(&m, &[]);
    crash_verify(&fs, &model, &snaps, "final");
    fs.unmount();
    fs.check();
    fs.mount();
    crash_verify(&fs, &model, &snaps, "final, after remount");
    fs.finish();
}

// ============================================ 8. CLI output and bad input

#[test]
fn cli_output_and_bad_input() {
    let mut fs = Fs::new();
    let m = fs.mnt.clone();
    // sync: one line, 0x + 16 hex digits, monotonic.
    let ta = sync_tid(&m);
    fs::write(m.join("file"), b"one").unwrap();
    let tb = sync_tid(&m);
    assert!(
        tb > ta,
        "sync after a write must commit a newer TID: {ta:#x} -> {tb:#x}"
    );
    let tc = sync_tid(&m);
    assert!(tc >= tb, "TID went backwards: {tb:#x} -> {tc:#x}");

    // snapshot create: JSON and human output.
    let t0 = now_ns();
    let j = snapshot_create(&m, "s1");
    assert!(field_u64(&j, "tid") >= tc, "{j:?}");
    let ts = field_u64(&j, "time_ns");
    assert!(
        ts + 60_000_000_000 > t0 && ts < now_ns() + 60_000_000_000,
        "time_ns {ts}: {j:?}"
    );
    assert!(field_f64(&j, "create_ms") >= 0.0, "{j:?}");
    let human = cairn_ok(&[os("snapshot"), os("create"), m.as_os_str(), os("s2")]);
    assert!(
        human.contains("s2"),
        "human output of snapshot create: {human:?}"
    );
    // Through the pool directory while mounted (the daemon does it).
    snapshot_create(&fs.pool, "via-pool");
    assert!(
        snap_root(&m, "via-pool").join("file").is_file(),
        ".snapshots/via-pool/file"
    );

    // snapshot auto: auto-YYYYMMDD-HHMMSS (UTC) of its creation time.
    let a = cairn_json(&[os("snapshot"), os("auto"), m.as_os_str(), os("--json")]);
    let aname = field_str(&a, "name").to_string();
    let secs = field_u64(&a, "time_ns") / 1_000_000_000;
    let near: Vec<String> = [secs - 1, secs, secs + 1].map(auto_name).into();
    assert!(
        near.contains(&aname),
        "auto snapshot name {aname:?}, expected one of {near:?}"
    );
    let human = cairn_ok(&[os("snapshot"), os("list"), m.as_os_str()]);
    assert!(
        human.contains("s1") && human.contains(&aname),
        "human snapshot list: {human:?}"
    );

    // snapshot list: every field, right kinds.
    let list = snapshot_list(&m);
    assert_eq!(list.len(), 4, "{list:?}");
    for e in &list {
        let name = field_str(e, "name");
        for k in ["tid", "time_ns", "unique_bytes", "files", "bytes"] {
            field_u64(e, k);
        }
        let kind = field_str(e, "kind");
        assert_eq!(
            kind,
            if name == aname { "auto" } else { "named" },
            "kind of {name}"
        );
        match field(e, "hash") {
            Json::Null => {}
            Json::Str(h) => assert!(is_hex64(h), "hash of {name}: {h:?}"),
            other => panic!("hash of {name} is {other:?}"),
        }
    }

    // Existing name: non-zero exit, message names the snapshot.
    let (_, err) = cairn_fails(&[os("snapshot"), os("create"), m.as_os_str(), os("s1")]);
    assert!(
        err.contains("s1") && err.to_lowercase().contains("exist"),
        "duplicate snapshot name: unclear message {err:?}"
    );
    // Unknown names.
    let (_, err) = cairn_fails(&[os("snapshot"), os("delete"), m.as_os_str(), os("nosuch")]);
    assert!(err.contains("nosuch"), "delete unknown: message {err:?}");
    let out = cairn(&[os("snapshot"), os("verify"), m.as_os_str(), os("nosuch")]);
    assert!(
        !out.status.success(),
        "verify of an unknown snapshot succeeded\n{}",
        describe(&out)
    );
    assert_ne!(
        out.status.code(),
        Some(3),
        "verify unknown must not look like a mismatch\n{}",
        describe(&out)
    );
    cairn_fails(&[os("snapshot"), os("create"), m.as_os_str(), os("a/b")]);
    cairn_fails(&[os("snapshot"), os("create"), m.as_os_str(), os("")]);
    expect_errno(
        fs::metadata(snap_root(&m, "nosuch")),
        libc::ENOENT,
        ".snapshots/nosuch",
    );
    expect_errno(
        fs::metadata(snap_root(&m, "a")),
        libc::ENOENT,
        ".snapshots/a (no such snapshot)",
    );

    // TIDs in the future: ENOENT.
    let last = sync_tid(&m);
    assert!(root_at(&m, last).is_dir(), "MNT/@@<last TID> must exist");
    assert_file(&at_tid(&m.join("file"), last), b"one", "file@@<last>");
    for fut in [last + 1, last + 1000, u64::MAX >> 1] {
        expect_errno(
            fs::metadata(root_at(&m, fut)),
            libc::ENOENT,
            &format!("MNT/@@{fut:#x} (future)"),
        );
        expect_errno(
            fs::metadata(at_tid(&m.join("file"), fut)),
            libc::ENOENT,
            &format!("file@@{fut:#x} (future)"),
        );
    }
    fs::write(m.join("file"), b"two").unwrap();

    // undo: usage errors (exit 2) and failures that change nothing.
    let f = m.join("file");
    let code = cairn(&[os("undo"), f.as_os_str()]).status.code();
    assert_eq!(
        code,
        Some(2),
        "undo without --tid/--snapshot must be a usage error"
    );
    let out = cairn(&[
        os("undo"),
        f.as_os_str(),
        os("--tid"),
        os(&tb.to_string()),
        os("--snapshot"),
        os("s1"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "undo with both --tid and --snapshot\n{}",
        describe(&out)
    );
    cairn_fails(&[
        os("undo"),
        f.as_os_str(),
        os("--tid"),
        os(&format!("{:#x}", last + 1000)),
    ]);
    cairn_fails(&[os("undo"), f.as_os_str(), os("--tid"), os("0xnothex")]);
    cairn_fails(&[os("undo"), f.as_os_str(), os("--snapshot"), os("nosuch")]);
    assert_file(&f, b"two", "file after failed undos");
    cairn_ok(&[
        os("undo"),
        f.as_os_str(),
        os("--tid"),
        os(&format!("{tb:#x}")),
    ]);
    assert_file(&f, b"one", "file after undo --tid 0x<short hex>");

    // history: paths outside a Cairn mount, missing paths.
    let outside = fs.dir.join("not-cairn");
    fs::write(&outside, b"x").unwrap();
    cairn_fails(&[os("history"), outside.as_os_str()]);
    cairn_fails(&[os("history"), m.join("missing").as_os_str()]);
    // prune: bad duration.
    cairn_fails(&[os("prune"), m.as_os_str(), os("--keep-history"), os("soon")]);
    assert_eq!(
        list_names(&m).len(),
        4,
        "failed commands changed the snapshot list"
    );

    // Offline, through the pool directory.
    fs.unmount();
    let offline = sync_tid(&fs.pool);
    assert!(
        offline > last,
        "sync on the unmounted pool: {offline:#x} <= {last:#x}"
    );
    assert_eq!(snapshot_list(&fs.pool).len(), 4, "offline snapshot list");
    let (_, err) = cairn_fails(&[os("snapshot"), os("create"), fs.pool.as_os_str(), os("s2")]);
    assert!(err.contains("s2"), "offline duplicate: {err:?}");
    cairn_fails(&[
        os("snapshot"),
        os("delete"),
        fs.pool.as_os_str(),
        os("nosuch"),
    ]);
    fs.check();
}
