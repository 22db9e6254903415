//! Mirror streams through the Fs API: the crash sweep's seeded workload
//! (creates, overwrites, truncates, renames, links, unlinks, snapshots,
//! prune, gc, reblock, dedup hits) on a source, a full stream to a fresh
//! mirror, then more changes and an incremental stream; after each, the
//! mirror's tree, every snapshot's tree and hash, and the tree at every
//! TID both still hold are the source's. Bad streams (truncated at every
//! frame boundary and inside frames, a flipped byte, another pool's, one
//! applied twice, one that does not start at the mirror's TID) are refused;
//! a truncated one leaves the mirror at its last complete batch, from
//! which the next stream resumes.

#[path = "../../fs/tests/common/workload.rs"]
mod workload;

use cairn_devices::backend::{Fault, FaultStorage, Ops};
use cairn_devices::HostStorage;
use cairn_fs::replica::Role;
use cairn_fs::{mkfs, Ctx, Fs, MkfsOptions, Pool, SnapshotKind, ROOT_INO};
use cairn_mirror::{apply_stream, check_stream, read_stream, ApplyOptions, StreamError};
use std::path::Path;
use std::sync::Arc;

fn pool(dir: &Path, name: &str, mirror: bool) -> Arc<Fs> {
    let p = dir.join(name);
    let o = MkfsOptions {
        sparse: true,
        mirror,
        ..MkfsOptions::default()
    };
    mkfs(&p, o).unwrap();
    Fs::open(Pool::open(&p, None).unwrap()).unwrap()
}

fn stream(src: &Fs, since: u64) -> Vec<u8> {
    let mut out = Vec::new();
    read_stream(src, since, &mut out, cairn_mirror::Held::AtSince).unwrap();
    out
}

/// The mirror equals the source now, at every snapshot, and at every TID
/// after `from` that both can show.
fn assert_mirrors(src: &Fs, dst: &Fs, from: u64) {
    assert_eq!(dst.last_tid(), src.last_tid());
    let (want, got) = (workload::read_tree(src), workload::read_tree(dst));
    assert!(
        workload::same(&want, &got),
        "{}",
        workload::diff(&want, &got)
    );
    let names = |fs: &Fs| -> Vec<(String, u64)> {
        fs.snapshots()
            .unwrap()
            .into_iter()
            .map(|s| (s.name, s.tid))
            .collect()
    };
    assert_eq!(names(src), names(dst));
    for (name, tid) in names(src) {
        let (a, b) = (
            src.snapshot_verify(&name).unwrap(),
            dst.snapshot_verify(&name).unwrap(),
        );
        assert!(a.matches && b.matches, "{name}");
        assert_eq!(a.computed, b.computed, "snapshot {name} hash");
        let (want, got) = (
            workload::read_tree_at(src, tid),
            workload::read_tree_at(dst, tid),
        );
        assert!(
            workload::same(&want, &got),
            "{name}: {}",
            workload::diff(&want, &got)
        );
    }
    for tid in from..=src.last_tid() {
        if src.asof_lookup(ROOT_INO, tid, b"a").is_err() {
            continue;
        }
        let (want, got) = (
            workload::read_tree_at(src, tid),
            workload::read_tree_at(dst, tid),
        );
        assert!(
            workload::same(&want, &got),
            "TID {tid}: {}",
            workload::diff(&want, &got)
        );
    }
}

/// Prunes all history that no snapshot sees.
fn prune_all(fs: &Fs) {
    let policy = cairn_fs::PrunePolicy {
        retention_secs: 0,
        keep_daily: 0,
        keep_weekly: 0,
        keep_monthly: 0,
    };
    fs.prune(&policy, false).unwrap();
}

/// Changes of every kind after the workload, committed in several TIDs.
fn more_changes(fs: &Fs, round: u8) {
    let a = fs.lookup(ROOT_INO, b"a").unwrap().ino;
    let b = fs.lookup(ROOT_INO, b"b").unwrap().ino;
    let f = fs
        .create(Ctx::ROOT, a, format!("new{round}").as_bytes(), 0o644)
        .unwrap();
    fs.write(f.ino, 0, &vec![round; 200_000]).unwrap();
    fs.flush().unwrap();
    fs.write(f.ino, 70_000, b"patched in place").unwrap();
    fs.link(f.ino, b, format!("link{round}").as_bytes())
        .unwrap();
    fs.flush().unwrap();
    for e in fs
        .readdir(b, 0, 100)
        .unwrap()
        .into_iter()
        .filter(|e| e.name.starts_with(b"f"))
        .take(1)
    {
        fs.unlink(b, &e.name).unwrap();
    }
    fs.snapshot_create(&format!("round{round}"), SnapshotKind::Named)
        .unwrap();
    fs.flush().unwrap();
}

#[test]
fn full_and_incremental_streams_reproduce_the_source_and_its_history() {
    let d = tempfile::tempdir().unwrap();
    let src = pool(d.path(), "src", false);
    workload::run(&src, 11, 150, &|| 0);
    src.flush().unwrap();
    let dst = pool(d.path(), "dst", true);
    let full = stream(&src, 0);
    check_stream(&full[..]).unwrap();
    let rep = apply_stream(&dst, &full[..], ApplyOptions::default()).unwrap();
    assert!(rep.events > 0 && rep.chunks > 0, "{rep:?}");
    assert_eq!(
        dst.mirror_role().unwrap(),
        Role::Mirror {
            source: src.pool().sb.uuid
        }
    );
    assert_mirrors(&src, &dst, 1);
    for round in 1..=3 {
        let since = dst.last_tid();
        more_changes(&src, round);
        let inc = stream(&src, since);
        assert!(
            inc.len() < full.len(),
            "incremental {} >= full {}",
            inc.len(),
            full.len()
        );
        apply_stream(&dst, &inc[..], ApplyOptions::default()).unwrap();
        assert_mirrors(&src, &dst, since);
        // The same stream again does not start where the mirror is now.
        let e = apply_stream(&dst, &inc[..], ApplyOptions::default()).unwrap_err();
        assert!(matches!(e, StreamError::Refused(_)), "{e}");
    }
    // The mirror keeps its own retention: pruning it does not stop it
    // from taking the next increment.
    prune_all(&dst);
    let since = dst.last_tid();
    more_changes(&src, 9);
    apply_stream(&dst, &stream(&src, since)[..], ApplyOptions::default()).unwrap();
    let (want, got) = (workload::read_tree(&src), workload::read_tree(&dst));
    assert!(
        workload::same(&want, &got),
        "{}",
        workload::diff(&want, &got)
    );
    // An unchanged source gives an empty stream that changes nothing.
    let none = stream(&src, dst.last_tid());
    apply_stream(&dst, &none[..], ApplyOptions::default()).unwrap();
    assert_eq!(dst.last_tid(), src.last_tid());
    drop(dst);
    let dst = Fs::open(Pool::open(&d.path().join("dst"), None).unwrap()).unwrap();
    assert!(cairn_fs::maintenance::check::check_pool(dst.pool())
        .unwrap()
        .problems
        .is_empty());
}

#[test]
fn bad_streams_are_refused_and_a_cut_one_resumes() {
    let d = tempfile::tempdir().unwrap();
    let src = pool(d.path(), "src", false);
    workload::run(&src, 5, 80, &|| 0);
    src.flush().unwrap();
    let full = stream(&src, 0);
    // Cut anywhere: the check refuses it.
    for cut in (0..full.len()).step_by(full.len() / 97 + 1) {
        assert!(check_stream(&full[..cut]).is_err(), "cut at {cut}");
    }
    // A flipped byte anywhere: refused.
    for at in (0..full.len()).step_by(full.len() / 53 + 1) {
        let mut bad = full.clone();
        bad[at] ^= 0x40;
        assert!(check_stream(&bad[..]).is_err(), "flipped byte {at}");
    }
    // Another pool's stream into a mirror of this one: refused, unchanged.
    let other = pool(d.path(), "other", false);
    let f = other.create(Ctx::ROOT, ROOT_INO, b"x", 0o644).unwrap();
    other.write(f.ino, 0, b"other pool").unwrap();
    other.flush().unwrap();
    let dst = pool(d.path(), "dst", true);
    apply_stream(&dst, &full[..], ApplyOptions::default()).unwrap();
    let at = dst.last_tid();
    let foreign = stream(&other, at.min(other.last_tid()));
    let e = apply_stream(&dst, &foreign[..], ApplyOptions::default()).unwrap_err();
    assert!(e.to_string().contains("comes from pool"), "{e}");
    assert_eq!(dst.last_tid(), at);
    // A normal pool takes no stream.
    let e = apply_stream(&other, &full[..], ApplyOptions::default()).unwrap_err();
    assert!(e.to_string().contains("not a mirror"), "{e}");
    // An incremental stream cut inside: the mirror stops at a complete
    // batch, consistent, and the next stream from there completes it.
    more_changes(&src, 1);
    more_changes(&src, 2);
    let mut inc = Vec::new();
    let small = cairn_mirror::Limits {
        bytes: 1 << 20,
        events: 4,
    };
    let rep =
        cairn_mirror::read_stream_limited(&src, at, &mut inc, cairn_mirror::Held::AtSince, small)
            .unwrap();
    assert!(rep.batches >= 3, "{rep:?}");
    // Cut at several points, each into a copy of the mirror as it was.
    for (k, frac) in [0.2, 0.45, 0.7, 0.93].into_iter().enumerate() {
        let m = pool(d.path(), &format!("cut{k}"), true);
        apply_stream(&m, &full[..], ApplyOptions::default()).unwrap();
        let cut = &inc[..(inc.len() as f64 * frac) as usize];
        let r = apply_stream(&m, cut, ApplyOptions::default());
        assert!(
            matches!(r, Err(StreamError::Truncated(_))),
            "cut {frac}: {r:?}"
        );
        let mid = m.last_tid();
        let (want, got) = (workload::read_tree_at(&src, mid), workload::read_tree(&m));
        assert!(
            workload::same(&want, &got),
            "cut {frac}: {}",
            workload::diff(&want, &got)
        );
        apply_stream(&m, &stream(&src, mid)[..], ApplyOptions::default()).unwrap();
        assert_mirrors(&src, &m, at);
    }
    let cut = &inc[..inc.len() * 2 / 3];
    assert!(matches!(
        apply_stream(&dst, cut, ApplyOptions::default()),
        Err(StreamError::Truncated(_))
    ));
    let mid = dst.last_tid();
    assert!(mid > at && mid < src.last_tid(), "{at} {mid}");
    let (want, got) = (workload::read_tree_at(&src, mid), workload::read_tree(&dst));
    assert!(
        workload::same(&want, &got),
        "{}",
        workload::diff(&want, &got)
    );
    let rest = stream(&src, mid);
    apply_stream(&dst, &rest[..], ApplyOptions::default()).unwrap();
    assert_mirrors(&src, &dst, at);
}

#[test]
fn ends_of_objects_without_history_reach_the_mirror() {
    let d = tempfile::tempdir().unwrap();
    let src = pool(d.path(), "src", false);
    let dir = src.mkdir(Ctx::ROOT, ROOT_INO, b"db", 0o755).unwrap();
    let nohist = cairn_fs::history::nohistory::XATTR;
    src.setxattr(dir.ino, nohist, b"1", cairn_fs::XattrMode::Any)
        .unwrap();
    let f = src.create(Ctx::ROOT, dir.ino, b"table", 0o644).unwrap();
    src.write(f.ino, 0, &[7u8; 300_000]).unwrap();
    let g = src.create(Ctx::ROOT, dir.ino, b"log", 0o644).unwrap();
    src.write(g.ino, 0, b"first").unwrap();
    src.flush().unwrap();
    let dst = pool(d.path(), "dst", true);
    apply_stream(&dst, &stream(&src, 0)[..], ApplyOptions::default()).unwrap();
    // Overwrite one file, delete the other: their old elements are
    // removed from the source at once (no history).
    let since = dst.last_tid();
    src.write(f.ino, 65_536, &[9u8; 70_000]).unwrap();
    src.unlink(dir.ino, b"log").unwrap();
    src.flush().unwrap();
    apply_stream(&dst, &stream(&src, since)[..], ApplyOptions::default()).unwrap();
    let mdir = dst.lookup(ROOT_INO, b"db").unwrap().ino;
    assert!(
        dst.lookup(mdir, b"log").is_err(),
        "a deleted file stayed on the mirror"
    );
    let mf = dst.lookup(mdir, b"table").unwrap().ino;
    assert_eq!(
        dst.read(mf, 0, 400_000).unwrap(),
        src.read(f.ino, 0, 400_000).unwrap()
    );
    let names: Vec<Vec<u8>> = dst
        .readdir(mdir, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    drop(dst);
    let dst = Fs::open(Pool::open(&d.path().join("dst"), None).unwrap()).unwrap();
    let problems = cairn_fs::maintenance::check::check_pool(dst.pool())
        .unwrap()
        .problems;
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn a_hold_keeps_the_history_an_incremental_stream_needs() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("src");
    let o = MkfsOptions {
        sparse: true,
        ..MkfsOptions::default()
    };
    mkfs(&p, o).unwrap();
    // No fine-grained history: every commit prunes what came before it.
    let config = cairn_fs::PoolConfig {
        history_retention_secs: 0,
        ..Default::default()
    };
    let src = Fs::open(Pool::open(&p, Some(config)).unwrap()).unwrap();
    for name in [&b"a"[..], b"b", b"c"] {
        let f = src.create(Ctx::ROOT, ROOT_INO, name, 0o644).unwrap();
        src.write(f.ino, 0, name).unwrap();
    }
    src.flush().unwrap();
    let (dst, held) = (pool(d.path(), "dst", true), pool(d.path(), "held", true));
    for m in [&dst, &held] {
        apply_stream(m, &stream(&src, 0)[..], ApplyOptions::default()).unwrap();
    }
    let hold = cairn_fs::replica::Hold {
        mirror: "held".into(),
        at: String::new(),
        tid: held.last_tid(),
        time_ns: 0,
    };
    src.mirror_hold(hold).unwrap();
    let since = dst.last_tid();
    src.unlink(ROOT_INO, b"a").unwrap();
    src.flush().unwrap();
    let f = src.create(Ctx::ROOT, ROOT_INO, b"d", 0o644).unwrap();
    src.write(f.ino, 0, b"d").unwrap();
    src.flush().unwrap();
    // The held mirror gets its increment, deletion included.
    apply_stream(&held, &stream(&src, since)[..], ApplyOptions::default()).unwrap();
    assert!(held.lookup(ROOT_INO, b"a").is_err() && held.lookup(ROOT_INO, b"d").is_ok());
    // Once released, prune goes on, and a mirror left behind is told so.
    assert!(src.mirror_release("held").unwrap());
    src.write(f.ino, 0, b"e").unwrap();
    src.flush().unwrap();
    let e = read_stream(&src, since, &mut Vec::new(), cairn_mirror::Held::AtSince).unwrap_err();
    assert!(e.to_string().contains("full resync"), "{e}");
}

/// The events of the changes after `since` found by reading every element
/// (what the creation and ends indexes must reproduce), sorted.
fn changes_by_scan(fs: &Fs, since: u64) -> Vec<(u64, Vec<u8>, u64, bool)> {
    let r = fs.pool().meta.read().unwrap();
    let mut out = Vec::new();
    let mut each = |e: cairn_meta::Element| {
        let key = e.key.as_bytes().to_vec();
        if e.create_tid > since {
            out.push((e.create_tid, key.clone(), e.create_tid, true));
        }
        if e.delete_tid != cairn_meta::TID_MAX && e.delete_tid > since {
            out.push((e.delete_tid, key, e.create_tid, false));
        }
    };
    r.for_each_live(&mut each).unwrap();
    r.for_each_hist(&mut each).unwrap();
    for (tid, key, create_tid) in r.gone_after(since).unwrap() {
        if create_tid <= since {
            out.push((tid, key, create_tid, false));
        }
    }
    out.sort();
    out
}

#[test]
fn the_changes_after_every_tid_are_those_a_scan_of_all_elements_finds() {
    let d = tempfile::tempdir().unwrap();
    let src = pool(d.path(), "src", false);
    workload::run(&src, 5, 120, &|| 0);
    for round in 1..=2 {
        more_changes(&src, round);
    }
    prune_all(&src);
    more_changes(&src, 3);
    assert_changes_are_a_scans(&src);
}

/// The same across a crash while creation index removals and dedup index
/// entries wait in RAM (they go to their tables in batches): the open
/// redoes them, and every TID's changes still match a scan.
#[test]
fn the_changes_after_a_crash_are_those_a_scan_finds() {
    let d = tempfile::tempdir().unwrap();
    let src = pool(d.path(), "src", false);
    workload::run(&src, 5, 120, &|| 0);
    more_changes(&src, 1);
    let waiting = src.pool().meta.born_pending().len();
    assert!(waiting > 0, "no creation index removal waits");
    drop(src); // no close: as after kill -9
    let src = Fs::open(Pool::open(&d.path().join("src"), None).unwrap()).unwrap();
    assert!(src.pool().meta.born_pending().is_empty());
    more_changes(&src, 2);
    prune_all(&src);
    more_changes(&src, 3);
    assert_changes_are_a_scans(&src);
}

/// For every TID a stream can start from, the changes after it are those
/// a scan of all elements finds; and `cairn check` finds no problem.
fn assert_changes_are_a_scans(src: &Fs) {
    let pruned = src
        .pool()
        .meta
        .read()
        .unwrap()
        .counter("pruned_tid")
        .unwrap();
    let mut compared = 0;
    for since in 0..=src.last_tid() {
        if since > 0 && since < pruned {
            continue;
        }
        let c = src.changes_since(since).unwrap();
        let mut got: Vec<_> = c
            .events
            .into_iter()
            .map(|e| {
                let create = matches!(e.change, cairn_fs::replica::Change::Create(_));
                (e.tid, e.key, e.create_tid, create)
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            changes_by_scan(src, since),
            "changes after TID {since}"
        );
        compared += 1;
    }
    assert!(compared > 3, "compared {compared} TIDs");
    assert!(cairn_fs::maintenance::check::check_pool(src.pool())
        .unwrap()
        .problems
        .is_empty());
}

/// Changes after the last snapshot: a new file, an old file overwritten in
/// place and another one unlinked, in two commits.
fn late_changes(fs: &Fs, tag: &[u8]) {
    let b = fs.lookup(ROOT_INO, b"b").unwrap().ino;
    let f = fs.create(Ctx::ROOT, ROOT_INO, tag, 0o644).unwrap();
    fs.write(f.ino, 0, &vec![7u8; 150_000]).unwrap();
    fs.flush().unwrap();
    let files = fs.readdir(b, 0, 100).unwrap().into_iter();
    let regular = |n: &[u8]| {
        fs.lookup(b, n)
            .is_ok_and(|a| a.kind == cairn_fs::FileKind::File)
    };
    let files: Vec<_> = files.filter(|e| regular(&e.name)).collect();
    let old = fs.lookup(b, &files[0].name).unwrap().ino;
    fs.write(old, 0, &tag.repeat(5000)).unwrap();
    fs.unlink(b, &files[1].name).unwrap();
    fs.flush().unwrap();
}

#[test]
fn a_mirror_behind_the_prune_horizon_resyncs_from_a_snapshot_both_hold() {
    let d = tempfile::tempdir().unwrap();
    let src = pool(d.path(), "src", false);
    workload::run(&src, 7, 120, &|| 0);
    more_changes(&src, 1);
    let dst = pool(d.path(), "dst", true);
    apply_stream(&dst, &stream(&src, 0)[..], ApplyOptions::default()).unwrap();
    more_changes(&src, 2);
    let at = src.snapshot("round2").unwrap().tid;
    late_changes(&src, b"late");
    let since = dst.last_tid();
    apply_stream(&dst, &stream(&src, since)[..], ApplyOptions::default()).unwrap();
    // The source goes on and prunes everything no snapshot sees.
    late_changes(&src, b"later");
    prune_all(&src);
    let behind = dst.last_tid();
    let e = read_stream(&src, behind, &mut Vec::new(), cairn_mirror::Held::AtSince).unwrap_err();
    assert!(e.to_string().contains("resync from snapshot round2"), "{e}");
    // A pool that is not a mirror is never rolled back.
    let e = src.rollback_mirror("round2").unwrap_err();
    assert!(e.to_string().contains("only a mirror"), "{e}");
    // A snapshot the mirror does not hold: refused, nothing changed.
    let e = dst.rollback_mirror("no such snapshot").unwrap_err();
    assert!(e.to_string().contains("no such snapshot"), "{e}");
    assert_eq!(dst.last_tid(), behind);
    // A rollback whose metadata writes fail (an I/O error, in both copies
    // of the metadata) changes nothing.
    let before = workload::read_tree(&dst);
    drop(dst);
    let path = d.path().join("dst");
    let st = Arc::new(FaultStorage::per_file(Arc::new(HostStorage), 3));
    let dst = Fs::open(Pool::open_with(&path, None, st.clone()).unwrap()).unwrap();
    let meta = st.control(&path.join("meta.redb"));
    let second = std::fs::canonicalize(path.join("meta.mirror")).unwrap();
    let second = st.control(&second);
    let eio = meta.add(Fault::eio(Ops::WRITE));
    second.add(Fault::eio(Ops::WRITE));
    assert!(dst.rollback_mirror("round2").is_err());
    assert!(meta.hits(eio) > 0, "the fault was never met");
    meta.clear();
    second.clear();
    drop(dst);
    let dst = Fs::open(Pool::open(&path, None).unwrap()).unwrap();
    assert_eq!(dst.last_tid(), behind, "a failed rollback moved the mirror");
    let got = workload::read_tree(&dst);
    assert!(
        workload::same(&before, &got),
        "{}",
        workload::diff(&before, &got)
    );
    let problems = cairn_fs::maintenance::check::check_pool(dst.pool())
        .unwrap()
        .problems;
    assert!(problems.is_empty(), "after a failed rollback: {problems:?}");
    let rep = dst.rollback_mirror("round2").unwrap();
    assert_eq!((rep.from, rep.to), (behind, at));
    assert!(rep.removed > 0 && rep.restored > 0, "{rep:?}");
    assert_eq!(dst.last_tid(), at);
    let (want, got) = (workload::read_tree_at(&src, at), workload::read_tree(&dst));
    assert!(
        workload::same(&want, &got),
        "{}",
        workload::diff(&want, &got)
    );
    let problems = cairn_fs::maintenance::check::check_pool(dst.pool())
        .unwrap()
        .problems;
    assert!(problems.is_empty(), "after the rollback: {problems:?}");
    // From the snapshot, the source sends all it still has.
    apply_stream(&dst, &stream(&src, at)[..], ApplyOptions::default()).unwrap();
    assert_mirrors(&src, &dst, at);
    drop(dst);
    let dst = Fs::open(Pool::open(&d.path().join("dst"), None).unwrap()).unwrap();
    let problems = cairn_fs::maintenance::check::check_pool(dst.pool())
        .unwrap()
        .problems;
    assert!(problems.is_empty(), "after the resync: {problems:?}");
}

/// Volumes (files outside the namespace) and their snapshots travel in the
/// stream like everything else: the mirror lists them with the same
/// content, now and at the snapshot.
#[test]
fn volumes_and_their_snapshots_reach_the_mirror() {
    let d = tempfile::tempdir().unwrap();
    let src = pool(d.path(), "src", false);
    let v = src.volume_create("vm", 8 << 20, 4096).unwrap();
    let old: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    src.write(v.ino, 4096, &old).unwrap();
    src.volume_snapshot("vm", "s1", true).unwrap();
    src.write(v.ino, 8192, &[0x5a; 4096]).unwrap();
    src.flush().unwrap();
    let dst = pool(d.path(), "dst", true);
    apply_stream(&dst, &stream(&src, 0)[..], ApplyOptions::default()).unwrap();
    let (a, b) = (src.volumes().unwrap(), dst.volumes().unwrap());
    assert_eq!(a, b);
    let read = |fs: &Fs, tid: Option<u64>| -> Vec<u8> {
        let ino = fs.volume("vm").unwrap().ino;
        match tid {
            None => fs.read(ino, 0, 2 << 20).unwrap(),
            Some(t) => fs.asof_read(ino, t, 0, 2 << 20).unwrap(),
        }
    };
    assert_eq!(read(&src, None), read(&dst, None));
    let (_, s) = dst.volume_at("vm", "s1").unwrap();
    let then = read(&dst, Some(s.tid));
    assert_eq!(&then[4096..4096 + old.len()], &old[..]);
    assert_eq!(then, read(&src, Some(s.tid)));
    let (x, y) = (
        src.snapshot_verify("vm@s1").unwrap(),
        dst.snapshot_verify("vm@s1").unwrap(),
    );
    assert!(x.matches && y.matches);
    assert_eq!(x.computed, y.computed, "the snapshot's tree hash");
}

/// A pool of two 64 MiB device files, so that chunks can have two copies.
fn two_device_pool(dir: &Path, name: &str, mirror: bool) -> Arc<Fs> {
    use cairn_devices::{DeviceClass, DeviceSpec};
    let p = dir.join(name);
    let devices = (0..2)
        .map(|i| {
            DeviceSpec::tier(
                DeviceClass::Ssd,
                dir.join(format!("{name}.d{i}")),
                Some(64 << 20),
            )
        })
        .collect();
    let o = MkfsOptions {
        sparse: true,
        mirror,
        devices,
        ..MkfsOptions::default()
    };
    mkfs(&p, o).unwrap();
    Fs::open(Pool::open(&p, None).unwrap()).unwrap()
}

/// The layouts of the segments file `path` (under the root) has its
/// chunks in, and their copies.
fn layouts_of(fs: &Fs, dir: &[u8], name: &[u8]) -> Vec<(Option<cairn_data::Layout>, usize)> {
    let d = fs.lookup(ROOT_INO, dir).unwrap().ino;
    let f = fs.lookup(d, name).unwrap().ino;
    let r = fs.pool().meta.read().unwrap();
    let mut out = Vec::new();
    for id in fs.file_chunks(f).unwrap() {
        let rec = cairn_data::ChunkRec::decode(&r.chunk(id).unwrap().unwrap()).unwrap();
        let seg = fs.pool().chunks.segment(rec.segment).unwrap();
        out.push((seg.layout, 1 + seg.copies.len()));
    }
    out.sort_by_key(|(l, n)| (l.map(|l| l.to_string()), *n));
    out.dedup();
    out
}

#[test]
fn a_directory_with_its_own_copies_keeps_them_on_the_mirror() {
    let d = tempfile::tempdir().unwrap();
    let src = two_device_pool(d.path(), "src", false);
    let keep = src.mkdir(Ctx::ROOT, ROOT_INO, b"keep", 0o755).unwrap().ino;
    let plain = src.mkdir(Ctx::ROOT, ROOT_INO, b"plain", 0o755).unwrap().ino;
    src.set_path_layout(keep, Some("copies=2".parse().unwrap()))
        .unwrap();
    let data = |seed: u8| -> Vec<u8> { (0..3u32 << 20).map(|i| (i * 7) as u8 ^ seed).collect() };
    for (dir, seed) in [(keep, 1u8), (plain, 2u8)] {
        let f = src.create(Ctx::ROOT, dir, b"f", 0o644).unwrap().ino;
        src.write(f, 0, &data(seed)).unwrap();
    }
    src.flush().unwrap();
    let two = vec![(Some("copies=2".parse().unwrap()), 2)];
    assert_eq!(layouts_of(&src, b"keep", b"f"), two, "the source");
    let dst = two_device_pool(d.path(), "dst", true);
    apply_stream(&dst, &stream(&src, 0)[..], ApplyOptions::default()).unwrap();
    for (dir, seed) in [(&b"keep"[..], 1u8), (&b"plain"[..], 2u8)] {
        let d = dst.lookup(ROOT_INO, dir).unwrap().ino;
        let f = dst.lookup(d, b"f").unwrap().ino;
        assert!(dst.read(f, 0, 3 << 20).unwrap() == data(seed), "{dir:?}");
    }
    assert_eq!(layouts_of(&dst, b"keep", b"f"), two, "the mirror");
    let one = layouts_of(&dst, b"plain", b"f");
    assert!(one.iter().all(|(l, n)| l.is_none() && *n == 1), "{one:?}");
}
