//! Invariants that hold in every build: a device write aimed outside its
//! data area (as a bug in the offsets would aim it; the test aims one with
//! `ChunkStore::misplace_next_write`) is refused by the device, so nothing
//! lands over a header or past the end; a segment write aimed past its
//! segment, into the next slot, which the device cannot tell from a good
//! one (`ChunkStore::test_hook_shift_next_write`), is refused by the data
//! layer; a commit whose metadata goes in as the last committed TID again
//! (`Fs::test_hook_repeat_next_tid`) is refused by the metadata store.
//! Each time the commit fails, the filesystem stops taking changes with a
//! log line naming the invariant, and a remount finds the last commit and
//! what was fsynced since, with a clean check.

use cairn_data::DataError;
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{Fs, FsError, Pool, ROOT_INO};
use cairn_meta::MetaError;

mod common;
use common::{file_in_root, make, noise, reopen};

#[test]
fn a_misplaced_device_write_stops_the_filesystem_and_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "a");
    fs.write(f, 0, &noise(1 << 20, 1)).unwrap();
    fs.flush().unwrap();
    fs.write(f, 0, &noise(1 << 20, 2)).unwrap();
    fs.fsync(f).unwrap();
    fs.pool().chunks.misplace_next_write();
    fs.write(f, 1 << 20, &noise(1 << 20, 3)).unwrap();
    let e = fs.flush().unwrap_err();
    assert!(e.is_invariant(), "{e}");
    assert!(e.to_string().contains("INVARIANT VIOLATED"), "{e}");
    let again = fs.write(f, 0, b"x").unwrap_err();
    assert!(again.to_string().contains("INVARIANT"), "stopped: {again}");
    assert!(fs.flush().is_err(), "no commit after the stop");
    drop(fs);
    let p = Pool::open(&d.path().join("pool"), None).unwrap();
    let rep = check_pool(&p).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    drop(p);
    let fs = reopen(d.path());
    let f = fs.lookup(ROOT_INO, b"a").unwrap().ino;
    assert_eq!(
        fs.read(f, 0, 1 << 20).unwrap(),
        noise(1 << 20, 2),
        "the fsynced bytes"
    );
}

/// Commits file `a` (and `b`, untouched after), fsyncs a change of `a`,
/// arms `aim` and writes more: the flush must fail on the invariant the
/// hook breaks (`is`), stop the filesystem, and leave a pool whose check
/// is clean and whose remount reads the fsynced bytes and `b`.
fn stops_and_loses_nothing(aim: impl Fn(&Fs), is: impl Fn(&FsError) -> bool) {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "a");
    let g = file_in_root(&fs, "b");
    fs.write(g, 0, &noise(1 << 20, 9)).unwrap();
    fs.write(f, 0, &noise(1 << 20, 1)).unwrap();
    fs.flush().unwrap();
    let last = fs.last_tid();
    fs.write(f, 0, &noise(1 << 20, 2)).unwrap();
    fs.fsync(f).unwrap();
    aim(&fs);
    fs.write(f, 1 << 20, &noise(1 << 20, 3)).unwrap();
    let e = fs.flush().unwrap_err();
    assert!(e.is_invariant(), "{e}");
    assert!(is(&e), "{e:?}");
    assert!(e.to_string().starts_with("INVARIANT VIOLATED"), "{e}");
    let again = fs.write(f, 0, b"x").unwrap_err();
    assert!(again.to_string().contains("INVARIANT"), "stopped: {again}");
    assert!(fs.flush().is_err(), "no commit after the stop");
    assert_eq!(fs.last_tid(), last, "nothing committed");
    drop(fs);
    let p = Pool::open(&d.path().join("pool"), None).unwrap();
    let rep = check_pool(&p).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    drop(p);
    let fs = reopen(d.path());
    let f = fs.lookup(ROOT_INO, b"a").unwrap().ino;
    let g = fs.lookup(ROOT_INO, b"b").unwrap().ino;
    assert_eq!(
        fs.read(f, 0, 1 << 20).unwrap(),
        noise(1 << 20, 2),
        "the fsynced bytes"
    );
    assert_eq!(fs.read(g, 0, 1 << 20).unwrap(), noise(1 << 20, 9));
    assert!(fs.last_tid() > last, "the replay commits after the last");
    fs.write(f, 0, b"y").unwrap();
    fs.flush().unwrap();
}

#[test]
fn a_segment_write_past_its_segment_stops_the_filesystem_and_loses_nothing() {
    stops_and_loses_nothing(
        |fs| fs.pool().chunks.test_hook_shift_next_write(),
        |e| matches!(e, FsError::Data(DataError::Invariant { what }) if what.contains("past the segment")),
    );
}

#[test]
fn a_commit_at_the_last_tid_again_stops_the_filesystem_and_loses_nothing() {
    stops_and_loses_nothing(
        |fs| fs.test_hook_repeat_next_tid(),
        |e| matches!(e, FsError::Meta(MetaError::Invariant { what }) if what.contains("TID")),
    );
}
