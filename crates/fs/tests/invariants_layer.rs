//! Invariants that hold in every build: a device write aimed outside its
//! data area (as a bug in the offsets would aim it; the test aims one with
//! `ChunkStore::misplace_next_write`) is refused by the device, so nothing
//! lands over a header or past the end; the commit fails, the filesystem
//! stops taking changes with a log line naming the invariant, and a
//! remount finds the last commit and what was fsynced since, with a clean
//! check.

use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{Pool, ROOT_INO};

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
