//! Snapshot cuts (`Fs::snapshot_cut`): a snapshot names exactly the state
//! at the call, without waiting for the commit that records it; writes go
//! on meanwhile; fsync commits the cut first; a crash before that commit
//! loses the snapshot and only the changes that were never synced.

mod common;

use cairn_fs::{maintenance::check::check_pool, Ctx, Fs, SnapshotKind, ROOT_INO};
use common::{make, noise, reopen};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

fn file(fs: &Fs, name: &str) -> u64 {
    fs.create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)
        .unwrap()
        .ino
}

/// Whether the snapshot is committed (read from the metadata store, which
/// does not finish a cut's commit as `Fs::snapshots` does).
fn committed(fs: &Fs, name: &str) -> bool {
    let r = fs.pool().meta.read().unwrap();
    r.snapshots().unwrap().iter().any(|(n, _)| n == name)
}

fn assert_clean(fs: &Fs) {
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "check: {:?}", rep.problems);
}

#[test]
fn a_cut_names_the_state_at_the_call_and_fsync_commits_it_first() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    let ino = file(&fs, "f");
    let (a, b, c) = (noise(1 << 20, 1), noise(1 << 20, 2), noise(1 << 20, 3));
    fs.write(ino, 0, &a).unwrap();
    fs.flush().unwrap();
    fs.write(ino, 0, &b).unwrap();

    let snap = fs.snapshot_cut("cut", SnapshotKind::Named).unwrap();
    // Not committed yet: the cut returned without a flush.
    assert!(!committed(&fs, "cut"));
    // A second cut of the same name is refused (the first is committed
    // first, under the flush lock).
    assert!(fs.snapshot_cut("cut", SnapshotKind::Named).is_err());
    assert!(committed(&fs, "cut"));

    fs.write(ino, 0, &c).unwrap();
    assert_eq!(fs.read(ino, 0, 1 << 20).unwrap(), c);
    fs.fsync(ino).unwrap();
    let s = fs.snapshot("cut").unwrap();
    assert_eq!(s.tid, snap.tid);
    // Listing a cut finishes its commit first.
    fs.write(ino, 0, &b).unwrap();
    let listed = fs.snapshot_cut("listed", SnapshotKind::Named).unwrap();
    assert!(!committed(&fs, "listed"));
    let names: Vec<String> = fs
        .snapshots()
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert!(names.contains(&"listed".to_string()), "{names:?}");
    assert!(committed(&fs, "listed"));
    assert_eq!(fs.asof_read(ino, listed.tid, 0, 1 << 20).unwrap(), b);
    fs.write(ino, 0, &c).unwrap();
    fs.fsync(ino).unwrap();
    assert_eq!(fs.asof_read(ino, s.tid, 0, 1 << 20).unwrap(), b);
    assert_eq!(fs.asof_read(ino, s.tid - 1, 0, 1 << 20).unwrap(), a);

    // A crash now: the snapshot and the fsynced write after it survive.
    drop(fs);
    let fs = reopen(dir.path());
    assert_eq!(fs.read(ino, 0, 1 << 20).unwrap(), c);
    let s = fs.snapshot("cut").unwrap();
    assert_eq!(fs.asof_read(ino, s.tid, 0, 1 << 20).unwrap(), b);
    assert_clean(&fs);
}

#[test]
fn a_crash_before_the_cut_commits_loses_the_snapshot_and_only_unsynced_changes() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    let ino = file(&fs, "f");
    let (a, b) = (noise(300_000, 4), noise(300_000, 5));
    fs.write(ino, 0, &a).unwrap();
    fs.fsync(ino).unwrap();
    fs.write(ino, 0, &b).unwrap();
    fs.snapshot_cut("lost", SnapshotKind::Named).unwrap();
    assert!(!committed(&fs, "lost"));
    drop(fs);

    let fs = reopen(dir.path());
    assert!(!committed(&fs, "lost"));
    assert_eq!(fs.read(ino, 0, 300_000).unwrap(), a);
    assert_clean(&fs);
    // The name is free again.
    let s = fs.snapshot_create("lost", SnapshotKind::Named).unwrap();
    assert_eq!(fs.asof_read(ino, s.tid, 0, 300_000).unwrap(), a);
}

/// A cut while the one before it waits for its commit is sealed above it
/// without committing it (each names its own state, neither durable
/// yet); a name waiting in the queue is refused; an fsync after both
/// keeps every change; a crash before their commits loses both cuts and
/// nothing fsynced; without a crash the commits take them in order.
#[test]
fn a_cut_over_one_waiting_for_its_commit_is_sealed_above_it() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    let ino = file(&fs, "f");
    let (a, b, c) = (noise(1 << 20, 31), noise(1 << 20, 32), noise(1 << 20, 33));
    fs.write(ino, 0, &a).unwrap();
    let s1 = fs.snapshot_cut("s1", SnapshotKind::Named).unwrap();
    fs.write(ino, 0, &b).unwrap();
    let s2 = fs.snapshot_cut("s2", SnapshotKind::Named).unwrap();
    assert!(
        !committed(&fs, "s1") && !committed(&fs, "s2"),
        "a cut waited"
    );
    assert_eq!(s2.tid, s1.tid + 1);
    fs.write(ino, 0, &c).unwrap();
    let e = fs.snapshot_cut("s1", SnapshotKind::Named).unwrap_err();
    assert!(e.to_string().contains("s1"), "{e}");
    fs.fsync(ino).unwrap();
    drop(fs); // a crash: the cuts were committed by the fsync, or not
    let fs = reopen(dir.path());
    assert_eq!(fs.read(ino, 0, 1 << 20).unwrap(), c);
    for (s, want) in [(&s1, &a), (&s2, &b)] {
        if let Ok(got) = fs.snapshot(&s.name) {
            assert_eq!(got.tid, s.tid);
            assert_eq!(fs.asof_read(ino, s.tid, 0, 1 << 20).unwrap(), *want);
        }
    }
    assert_clean(&fs);
    let t0 = fs.last_tid();
    fs.write(ino, 0, &a).unwrap();
    let s3 = fs.snapshot_cut("s3", SnapshotKind::Named).unwrap();
    fs.write(ino, 0, &b).unwrap();
    let s4 = fs.snapshot_cut("s4", SnapshotKind::Named).unwrap();
    assert_eq!((s3.tid, s4.tid), (t0 + 1, t0 + 2));
    fs.commit_cuts();
    assert!(committed(&fs, "s3") && committed(&fs, "s4"));
    assert_eq!(fs.asof_read(ino, s3.tid, 0, 1 << 20).unwrap(), a);
    assert_eq!(fs.asof_read(ino, s4.tid, 0, 1 << 20).unwrap(), b);
    assert_clean(&fs);
}

#[test]
fn a_cut_with_nothing_buffered_names_the_last_commit_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    let ino = file(&fs, "f");
    fs.write(ino, 0, b"committed").unwrap();
    fs.flush().unwrap();
    let last = fs.last_tid();
    let s = fs.snapshot_cut("now", SnapshotKind::Named).unwrap();
    assert_eq!(s.tid, last);
    assert!(committed(&fs, "now"));
}

/// A writer numbers its writes while snapshots are cut: each snapshot
/// holds a number between the last write finished before its cut began and
/// the last one started before the cut returned; the flusher commits the
/// cuts while the writer goes on.
#[test]
fn cuts_under_a_running_writer_are_exact_points_in_its_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    fs.spawn_flusher();
    let ino = file(&fs, "counter");
    let started = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (fs, started, done, stop) = (fs.clone(), started.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            let pad = noise(60_000, 9);
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                started.store(n, Ordering::SeqCst);
                fs.write(ino, 0, &n.to_le_bytes()).unwrap();
                // More bytes elsewhere, so that commits have work to do.
                fs.write(ino, 4096 + (n % 64) * 65536, &pad).unwrap();
                done.store(n, Ordering::SeqCst);
            }
        })
    };
    let mut cuts = Vec::new();
    for k in 0..40 {
        std::thread::sleep(std::time::Duration::from_millis(5));
        let lo = done.load(Ordering::SeqCst);
        let s = fs
            .snapshot_cut(&format!("s{k}"), SnapshotKind::Named)
            .unwrap();
        let hi = started.load(Ordering::SeqCst);
        cuts.push((s.name, lo, hi));
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    fs.flush().unwrap();
    for (name, lo, hi) in &cuts {
        let s = fs.snapshot(name).unwrap();
        let v = fs.asof_read(ino, s.tid, 0, 8).unwrap();
        // Empty: cut before the writer's first write.
        let v = match v.is_empty() {
            true => 0,
            false => u64::from_le_bytes(v.try_into().unwrap()),
        };
        assert!(
            (*lo..=*hi).contains(&v),
            "snapshot {name} holds write {v}, outside [{lo}, {hi}]"
        );
    }
    assert_clean(&fs);
    fs.shutdown().unwrap();
}

/// A durable snapshot with little buffered goes through the intent log:
/// `snapshot_create` returns before any commit, and a crash right after
/// keeps the snapshot (the replay commits it as the TID it names) with
/// exactly the state at the call; what was written after it and never
/// synced is lost, as after any crash.
#[test]
fn a_created_snapshot_is_durable_through_the_log_before_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    let ino = file(&fs, "f");
    let (a, b, c) = (noise(300_000, 7), noise(300_000, 8), noise(300_000, 9));
    fs.write(ino, 0, &a).unwrap();
    fs.flush().unwrap();
    fs.write(ino, 0, &b).unwrap();
    let other = file(&fs, "created-before");
    let s = fs.snapshot_create("logged", SnapshotKind::Named).unwrap();
    assert!(!committed(&fs, "logged"), "through the log, not a commit");
    fs.write(ino, 0, &c).unwrap();
    drop(fs);

    let fs = reopen(dir.path());
    assert!(committed(&fs, "logged"), "the replay commits the snapshot");
    let got = fs.snapshot("logged").unwrap();
    assert_eq!(got.tid, s.tid, "at the TID it was given");
    assert_eq!(fs.asof_read(ino, s.tid, 0, 300_000).unwrap(), b);
    assert!(fs.asof_lookup(ROOT_INO, s.tid, b"created-before").is_ok());
    assert_eq!(fs.read(ino, 0, 300_000).unwrap(), b, "c was never synced");
    assert!(fs.getattr(other).is_ok());
    assert_clean(&fs);
    // The name is taken; new snapshots go on from there.
    assert!(fs.snapshot_create("logged", SnapshotKind::Named).is_err());
    fs.write(ino, 0, &c).unwrap();
    let t = fs.snapshot_create("next", SnapshotKind::Named).unwrap();
    assert!(t.tid > s.tid);
    fs.flush().unwrap();
    assert_eq!(fs.asof_read(ino, t.tid, 0, 300_000).unwrap(), c);
    assert_eq!(fs.asof_read(ino, s.tid, 0, 300_000).unwrap(), b);
}

/// Without a crash, the next commit records the logged snapshot at its
/// TID, before the changes made after it; an fsync after the snapshot
/// does not wait for that commit (it logs on top of the snapshot's TID).
#[test]
fn a_logged_snapshot_is_committed_before_later_changes() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    let ino = file(&fs, "f");
    let (a, b) = (noise(200_000, 10), noise(200_000, 11));
    fs.write(ino, 0, &a).unwrap();
    let s = fs.snapshot_create("s", SnapshotKind::Named).unwrap();
    assert!(!committed(&fs, "s"));
    fs.write(ino, 0, &b).unwrap();
    fs.fsync(ino).unwrap();
    assert!(!committed(&fs, "s"), "the fsync was one log write");
    fs.commit_cuts();
    assert!(committed(&fs, "s"));
    assert_eq!(fs.asof_read(ino, s.tid, 0, 200_000).unwrap(), a);
    drop(fs);
    let fs = reopen(dir.path());
    assert_eq!(fs.read(ino, 0, 200_000).unwrap(), b, "fsynced after it");
    assert_eq!(fs.asof_read(ino, s.tid, 0, 200_000).unwrap(), a);
    assert_clean(&fs);
}

/// A crash after a logged snapshot and an fsync on top of it, neither
/// committed: the replay commits the snapshot as its TID from the first
/// log region, then applies the fsync's record from the second.
#[test]
fn an_fsync_after_a_logged_snapshot_survives_a_crash_before_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    let ino = file(&fs, "f");
    let (a, b) = (noise(200_000, 12), noise(200_000, 13));
    fs.write(ino, 0, &a).unwrap();
    let s = fs.snapshot_create("s", SnapshotKind::Named).unwrap();
    fs.write(ino, 0, &b).unwrap();
    let later = file(&fs, "later");
    fs.fsync(ino).unwrap();
    assert!(!committed(&fs, "s"));
    drop(fs); // a crash
    let fs = reopen(dir.path());
    assert!(committed(&fs, "s"));
    assert_eq!(fs.snapshot("s").unwrap().tid, s.tid);
    assert_eq!(fs.asof_read(ino, s.tid, 0, 200_000).unwrap(), a);
    assert!(fs.asof_lookup(ROOT_INO, s.tid, b"later").is_err());
    assert_eq!(fs.read(ino, 0, 200_000).unwrap(), b, "fsynced after it");
    assert!(fs.getattr(later).is_ok());
    assert_clean(&fs);
    // A second crash changes nothing.
    drop(fs);
    let fs = reopen(dir.path());
    assert_eq!(fs.read(ino, 0, 200_000).unwrap(), b);
    assert_eq!(fs.asof_read(ino, s.tid, 0, 200_000).unwrap(), a);
}

/// More buffered than an fsync's record takes (8 MiB) but less than a log
/// region (64 MiB): the snapshot still goes through the log (one write,
/// not a commit of every block), and a crash right after keeps it whole.
#[test]
fn a_snapshot_over_more_than_an_fsync_record_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    let ino = file(&fs, "big");
    let big = noise(20 << 20, 12);
    fs.write(ino, 0, &big).unwrap();
    let s = fs.snapshot_create("big", SnapshotKind::Named).unwrap();
    assert!(!committed(&fs, "big"), "through the log, not a commit");
    drop(fs); // a crash
    let fs = reopen(dir.path());
    assert!(committed(&fs, "big"), "the replay commits the snapshot");
    assert_eq!(fs.asof_read(ino, s.tid, 0, 20 << 20).unwrap(), big);
    assert_eq!(fs.read(ino, 0, 20 << 20).unwrap(), big);
    assert_clean(&fs);
}

/// More buffered than a log region holds: the snapshot is made by a
/// commit, done when `snapshot_create` returns.
#[test]
fn a_snapshot_over_more_than_a_log_region_commits_instead() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    let ino = file(&fs, "big");
    let big = noise(70 << 20, 14);
    fs.write(ino, 0, &big).unwrap();
    let s = fs.snapshot_create("big", SnapshotKind::Named).unwrap();
    assert!(committed(&fs, "big"), "committed before returning");
    drop(fs);
    let fs = reopen(dir.path());
    assert_eq!(fs.asof_read(ino, s.tid, 0, 70 << 20).unwrap(), big);
}

/// A snapshot taken while the one before it still waits for its commit
/// goes through the log too, on top of it (one region each), instead of
/// waiting for that commit; its name cannot be taken twice meanwhile. A
/// crash before either commit keeps both, each with its own state.
#[test]
fn a_snapshot_over_one_waiting_for_its_commit_is_logged_on_top_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let fs = make(dir.path());
    let ino = file(&fs, "f");
    let (a, b, c) = (noise(3 << 20, 21), noise(3 << 20, 22), noise(3 << 20, 23));
    fs.write(ino, 0, &a).unwrap();
    let s1 = fs.snapshot_create("s1", SnapshotKind::Named).unwrap();
    fs.write(ino, 0, &b).unwrap();
    let later = file(&fs, "later");
    let s2 = fs.snapshot_create("s2", SnapshotKind::Named).unwrap();
    assert!(
        !committed(&fs, "s1") && !committed(&fs, "s2"),
        "both through the log"
    );
    assert_eq!(s2.tid, s1.tid + 1);
    assert!(fs.snapshot_create("s1", SnapshotKind::Named).is_err());
    fs.write(ino, 0, &c).unwrap();
    drop(fs); // a crash
    let fs = reopen(dir.path());
    assert!(committed(&fs, "s1") && committed(&fs, "s2"));
    assert_eq!(fs.snapshot("s2").unwrap().tid, s2.tid);
    assert_eq!(fs.asof_read(ino, s1.tid, 0, 3 << 20).unwrap(), a);
    assert_eq!(fs.asof_read(ino, s2.tid, 0, 3 << 20).unwrap(), b);
    assert!(fs.asof_lookup(ROOT_INO, s1.tid, b"later").is_err());
    assert!(fs.asof_lookup(ROOT_INO, s2.tid, b"later").is_ok());
    assert_eq!(fs.read(ino, 0, 3 << 20).unwrap(), b, "c was never synced");
    assert!(fs.getattr(later).is_ok());
    assert_clean(&fs);
    // Without a crash, the commits take both in order.
    fs.write(ino, 0, &c).unwrap();
    let s3 = fs.snapshot_create("s3", SnapshotKind::Named).unwrap();
    fs.write(ino, 0, &a).unwrap();
    let s4 = fs.snapshot_create("s4", SnapshotKind::Named).unwrap();
    fs.commit_cuts();
    assert!(committed(&fs, "s3") && committed(&fs, "s4"));
    assert_eq!(fs.asof_read(ino, s3.tid, 0, 3 << 20).unwrap(), c);
    assert_eq!(fs.asof_read(ino, s4.tid, 0, 3 << 20).unwrap(), a);
    fs.flush().unwrap();
    assert_clean(&fs);
}
