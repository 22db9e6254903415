//! Faults injected under a mounted pool (a fault storage wraps its files):
//! a read error or corrupted bytes on the data device give EIO for that
//! read through the Fs API, never wrong bytes, and reads work again once
//! the fault is gone; a full host under the metadata file (writes that grow
//! it get ENOSPC) makes the commit fail with the changes kept, and the next
//! flush after the fault is cleared commits them, and so does the flush
//! after a single EIO; a lasting EIO on the metadata file stops the
//! filesystem, and a remount finds the last commit, what was fsynced
//! since, and a clean pool; a commit that fails under a snapshot taken
//! during it stops the filesystem, and a remount keeps both; a tick that
//! meets a full device or a failed metadata write forgets what it stored,
//! falls back to a commit, and loses nothing.

use cairn_data::chunk::CHUNK_MAGIC;
use cairn_data::CHUNK_HEADER_LEN;
use cairn_devices::backend::{Fault, FaultControl, FaultStorage, Ops, When};
use cairn_devices::{DeviceClass, DeviceSpec, HostStorage};
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{mkfs, Ctx, Fs, MkfsOptions, Pool, ROOT_INO};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;
use common::flush_in_background;

/// A pool of one device that keeps one copy of its metadata
/// (`meta_copies: 1`): a fault under `meta.redb` reaches the store, where
/// with two copies the other would take over (see
/// `a_metadata_copy_whose_writes_fail_is_dropped_and_repaired_at_open`).
fn make_pool(dir: &Path) -> PathBuf {
    let pool = dir.join("pool");
    let spec = DeviceSpec::tier(DeviceClass::Ssd, pool.join("data.0"), Some(64 << 20));
    let o = MkfsOptions {
        devices: vec![spec],
        sparse: true,
        meta_copies: 1,
        ..MkfsOptions::default()
    };
    mkfs(&pool, o).unwrap();
    pool
}

fn open_faulty(pool: &Path) -> (Arc<Fs>, Arc<FaultStorage>) {
    let st = Arc::new(FaultStorage::per_file(Arc::new(HostStorage), 7));
    let fs = Fs::open(Pool::open_with(pool, None, st.clone()).unwrap()).unwrap();
    (fs, st)
}

/// Where the first chunk lies in a device file (its header's magic).
fn first_chunk(dev: &Path) -> u64 {
    let raw = std::fs::read(dev).unwrap();
    let from = cairn_devices::header::DATA_OFFSET as usize;
    let i = raw[from..]
        .windows(4)
        .position(|w| w == CHUNK_MAGIC)
        .unwrap();
    (from + i) as u64
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

#[test]
fn device_read_faults_give_eio_not_wrong_bytes() {
    let d = tempfile::tempdir().unwrap();
    let pool = make_pool(d.path());
    let data = pattern(1 << 20);
    {
        let fs = Fs::open(Pool::open(&pool, None).unwrap()).unwrap();
        let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
        fs.write(f.ino, 0, &data).unwrap();
        fs.shutdown().unwrap();
    }
    let (fs, st) = open_faulty(&pool);
    let dev = st.control(&pool.join("data.0"));
    let ino = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    // One byte of a chunk's data flipped (its header left intact).
    let at = first_chunk(&pool.join("data.0")) + CHUNK_HEADER_LEN as u64 + 1000;
    let corrupt = dev.add(Fault::corrupt_reads().in_range(at..at + 1));
    let e = fs.read(ino, 0, 100_000).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "corrupted bytes: {e}");
    assert!(dev.hits(corrupt) > 0);
    dev.clear();
    // Every byte of every read flipped.
    dev.add(Fault::corrupt_reads());
    let e = fs.read(ino, 500_000, 100_000).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "corrupted bytes: {e}");
    dev.clear();
    let eio = dev.add(Fault::eio(Ops::READ));
    let e = fs.read(ino, 300_000, 4096).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(dev.hits(eio) > 0);
    dev.clear();
    assert_eq!(fs.read(ino, 0, 1 << 20).unwrap(), data);
}

#[test]
fn metadata_write_faults_fail_the_commit_and_the_pool_recovers() {
    let d = tempfile::tempdir().unwrap();
    let pool = make_pool(d.path());
    let (fs, st) = open_faulty(&pool);
    let meta = st.control(&pool.join("meta.redb"));
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"a", 0o644).unwrap();
    fs.write(f.ino, 0, b"first").unwrap();
    fs.flush().unwrap();
    // The host holding the metadata file is full: a commit that must grow
    // the file fails (the reserve's retry too), its changes stay buffered.
    let full = meta.add(Fault::full());
    fs.write(f.ino, 0, b"second").unwrap();
    let dir = fs.mkdir(Ctx::ROOT, ROOT_INO, b"many", 0o755).unwrap();
    for i in 0..20_000 {
        let name = format!("file-with-a-long-name-{i:06}");
        fs.create(Ctx::ROOT, dir.ino, name.as_bytes(), 0o644)
            .unwrap();
    }
    let e = fs.flush().unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert!(meta.hits(full) > 0);
    assert_eq!(fs.read(f.ino, 0, 10).unwrap(), b"second");
    meta.clear();
    fs.flush().unwrap();
    fs.write(f.ino, 6, b"+third").unwrap();
    fs.flush().unwrap();
    assert!(fs.lookup(dir.ino, b"file-with-a-long-name-019999").is_ok());
    // One write of the commit fails with EIO: the store is reopened, the
    // changes stay buffered and the next flush commits them.
    let once = meta.add(Fault::eio(Ops::WRITE).when(When::Times(1)));
    fs.write(f.ino, 0, b"Second").unwrap();
    let e = fs.flush().unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert_eq!(meta.hits(once), 1);
    fs.flush().unwrap();
    meta.clear();
    // A lasting I/O error: the store cannot even be reopened, so the
    // filesystem stops; what was fsynced before is in the intent log
    // (another file) and survives a remount.
    fs.write(f.ino, 0, b"SECOND").unwrap();
    fs.fsync(f.ino).unwrap();
    meta.add(Fault::eio(Ops::WRITE));
    fs.write(f.ino, 0, b"lost").unwrap();
    let e = fs.flush().unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(
        fs.write(f.ino, 0, b"x").is_err(),
        "a stopped fs takes writes"
    );
    meta.clear();
    drop(fs);
    let p = Pool::open(&pool, None).unwrap();
    let rep = check_pool(&p).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let fs = Fs::open(p).unwrap();
    let f = fs.lookup(ROOT_INO, b"a").unwrap();
    assert_eq!(fs.read(f.ino, 0, 20).unwrap(), b"SECOND+third");
    let many = fs.lookup(ROOT_INO, b"many").unwrap();
    assert!(fs.lookup(many.ino, b"file-with-a-long-name-000000").is_ok());
}

#[test]
fn a_device_refusing_every_metadata_write_fails_the_commit_and_a_remount_recovers() {
    let d = tempfile::tempdir().unwrap();
    let pool = make_pool(d.path());
    let (fs, st) = open_faulty(&pool);
    let meta = st.control(&pool.join("meta.redb"));
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"a", 0o644).unwrap();
    fs.write(f.ino, 0, b"kept").unwrap();
    fs.flush().unwrap();
    // Thin or copy-on-write storage out of room: overwrites fail too.
    meta.add(Fault::no_space());
    fs.write(f.ino, 0, b"gone").unwrap();
    assert!(fs.flush().is_err());
    meta.clear();
    drop(fs);
    let p = Pool::open(&pool, None).unwrap();
    assert!(check_pool(&p).unwrap().problems.is_empty());
    let fs = Fs::open(p).unwrap();
    let f = fs.lookup(ROOT_INO, b"a").unwrap();
    assert_eq!(fs.read(f.ino, 0, 10).unwrap(), b"kept");
}

#[test]
fn a_failed_data_device_write_is_counted_and_the_flush_retried() {
    let d = tempfile::tempdir().unwrap();
    let pool = make_pool(d.path());
    let (fs, st) = open_faulty(&pool);
    let dev = st.control(&pool.join("data.0"));
    let once = dev.add(Fault::eio(Ops::WRITE).when(When::Times(1)));
    let data = pattern(3 << 20);
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    fs.write(f.ino, 0, &data).unwrap();
    fs.flush().unwrap();
    assert_eq!(dev.hits(once), 1);
    assert_eq!(fs.pool().chunks.devices().write_errors(0), 1);
    drop(fs);
    let p = Pool::open(&pool, None).unwrap();
    assert!(check_pool(&p).unwrap().problems.is_empty());
    let fs = Fs::open(p).unwrap();
    assert_eq!(fs.read(f.ino, 0, 3 << 20).unwrap(), data);
}

/// A single-device pool with the default two copies of its metadata, both
/// beside each other: when every write to the first copy fails, that copy
/// is dropped and commits go on in the other; the next open (fault gone)
/// makes the first equal to the second again, and nothing is lost.
#[test]
fn a_metadata_copy_whose_writes_fail_is_dropped_and_repaired_at_open() {
    let d = tempfile::tempdir().unwrap();
    let pool = common::one_device_pool(d.path());
    let (fs, st) = open_faulty(&pool);
    assert_eq!(fs.pool().meta.mirror_stats().map(|s| s.copies), Some(2));
    let meta = st.control(&pool.join("meta.redb"));
    let eio = meta.add(Fault::eio(Ops::WRITE));
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"a", 0o644).unwrap();
    fs.write(f.ino, 0, b"kept in the second copy").unwrap();
    fs.flush().unwrap();
    assert!(meta.hits(eio) > 0, "the fault was not hit");
    assert_eq!(fs.pool().meta.mirror_stats().map(|s| s.copies), Some(1));
    meta.clear();
    drop(fs);
    let p = Pool::open(&pool, None).unwrap();
    let stats = p.meta.mirror_stats().expect("two copies");
    assert!(stats.repaired_at_open > 0, "{stats:?}");
    assert_eq!(stats.copies, 2);
    assert!(check_pool(&p).unwrap().problems.is_empty());
    let fs = Fs::open(p).unwrap();
    let f = fs.lookup(ROOT_INO, b"a").unwrap();
    assert_eq!(fs.read(f.ino, 0, 64).unwrap(), b"kept in the second copy");
    drop(fs);
    let mirror = std::fs::canonicalize(pool.join("meta.mirror")).unwrap();
    assert_eq!(
        std::fs::read(pool.join("meta.redb")).unwrap(),
        std::fs::read(mirror).unwrap()
    );
}

/// A second copy that differs from the first (damaged while closed) and
/// cannot be written at open (a full host under it): the pool opens on
/// the first copy alone, every file reads, and the next open (room again)
/// repairs the second.
#[test]
fn a_second_copy_that_cannot_be_repaired_at_open_leaves_the_first_alone() {
    let d = tempfile::tempdir().unwrap();
    let pool = common::one_device_pool(d.path());
    let fs = Fs::open(Pool::open(&pool, None).unwrap()).unwrap();
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"a", 0o644).unwrap();
    fs.write(f.ino, 0, b"in both copies").unwrap();
    fs.shutdown().unwrap();
    drop(fs);
    let mirror = std::fs::canonicalize(pool.join("meta.mirror")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new()
            .write(true)
            .open(&mirror)
            .unwrap(),
        &[0xa5; 4096],
        8192,
    )
    .unwrap();
    let st = Arc::new(FaultStorage::per_file(Arc::new(HostStorage), 7));
    let full = st.control(&mirror).add(Fault::full());
    let eio = st.control(&mirror).add(Fault::eio(Ops::WRITE));
    let fs = Fs::open(Pool::open_with(&pool, None, st.clone()).unwrap()).unwrap();
    assert!(st.control(&mirror).hits(full) + st.control(&mirror).hits(eio) > 0);
    let live = fs.pool().meta.mirror_stats().map_or(1, |s| s.copies);
    assert_eq!(live, 1, "opened with one copy");
    let f = fs.lookup(ROOT_INO, b"a").unwrap();
    assert_eq!(fs.read(f.ino, 0, 64).unwrap(), b"in both copies");
    fs.shutdown().unwrap();
    drop(fs);
    let p = Pool::open(&pool, None).unwrap();
    let stats = p.meta.mirror_stats().expect("two copies again");
    assert!(stats.repaired_at_open > 0, "{stats:?}");
    assert!(check_pool(&p).unwrap().problems.is_empty());
}

/// A pool of two tier devices in directories `a` (nvme) and `b` (ssd).
fn make_two(dir: &Path) -> PathBuf {
    let pool = dir.join("pool");
    let mut devices = Vec::new();
    for (class, name) in [(DeviceClass::Nvme, "a"), (DeviceClass::Ssd, "b")] {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        devices.push(DeviceSpec::tier(class, dir.join(name), Some(64 << 20)));
    }
    let o = MkfsOptions {
        devices,
        sparse: true,
        ..MkfsOptions::default()
    };
    mkfs(&pool, o).unwrap();
    pool
}

#[test]
fn a_device_failing_every_write_gets_no_data_and_is_marked_failing() {
    let d = tempfile::tempdir().unwrap();
    let pool = make_two(d.path());
    let (fs, st) = open_faulty(&pool);
    let fast = st.control(&d.path().join("a/cairn-dev-0.img"));
    fast.add(Fault::eio(Ops::WRITE));
    let mut files = Vec::new();
    for i in 0..4u8 {
        let name = format!("f{i}");
        let data: Vec<u8> = pattern(1 << 20).iter().map(|b| b ^ i).collect();
        let f = fs
            .create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)
            .unwrap();
        fs.write(f.ino, 0, &data).unwrap();
        // Every flush succeeds: the one that met the error is retried on
        // the other device, and later ones avoid the failing device.
        fs.flush().unwrap();
        files.push((f.ino, data));
    }
    let set = fs.pool().chunks.devices();
    assert!(set.write_errors(0) >= 1, "the fault was not hit");
    set.note_write_error(0);
    set.note_write_error(0);
    assert!(set.is_failing(0));
    let info = cairn_fs::maintenance::info::device_infos(fs.pool(), &[], |_, _| {});
    assert!(info.iter().any(|d| d.id == 0 && d.failing), "{info:?}");
    for (ino, data) in &files {
        assert_eq!(&fs.read(*ino, 0, 1 << 20).unwrap(), data);
    }
    drop(fs);
    let p = Pool::open(&pool, None).unwrap();
    assert!(check_pool(&p).unwrap().problems.is_empty());
    let fs = Fs::open(p).unwrap();
    for (ino, data) in &files {
        assert_eq!(&fs.read(*ino, 0, 1 << 20).unwrap(), data);
    }
}

#[test]
fn with_no_device_left_the_commit_fails_and_its_changes_wait() {
    let d = tempfile::tempdir().unwrap();
    let pool = make_pool(d.path());
    let (fs, st) = open_faulty(&pool);
    let dev = st.control(&pool.join("data.0"));
    let fault = dev.add(Fault::eio(Ops::WRITE));
    let data = pattern(1 << 20);
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    fs.write(f.ino, 0, &data).unwrap();
    let e = fs.flush().unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    let e = fs.fsync(f.ino).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "fsync after a failed commit: {e}");
    // The filesystem did not stop: the data is still there and readable.
    assert_eq!(fs.read(f.ino, 0, 1 << 20).unwrap(), data);
    dev.remove(fault);
    fs.fsync(f.ino).unwrap();
    drop(fs);
    let fs = Fs::open(Pool::open(&pool, None).unwrap()).unwrap();
    assert_eq!(fs.read(f.ino, 0, 1 << 20).unwrap(), data);
    assert!(check_pool(fs.pool()).unwrap().problems.is_empty());
}

#[test]
fn a_device_that_stops_answering_for_a_while_delays_but_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let pool = make_pool(d.path());
    let (fs, st) = open_faulty(&pool);
    let dev = st.control(&pool.join("data.0"));
    let meta = st.control(&std::fs::canonicalize(pool.join("meta.redb")).unwrap());
    let data = pattern(2 << 20);
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    fs.write(f.ino, 0, &data).unwrap();
    // Writes and syncs of the data device, and the metadata commit, each
    // stall for 300 ms (a disk resetting, a path failing over).
    let stall = std::time::Duration::from_millis(300);
    dev.add(Fault::hang(Ops::WRITE, stall).when(When::Times(2)));
    dev.add(Fault::hang(Ops::SYNC, stall).when(When::Times(1)));
    meta.add(Fault::hang(Ops::SYNC, stall).when(When::Times(1)));
    let t = std::time::Instant::now();
    fs.flush().unwrap();
    assert!(t.elapsed() >= stall, "the stall was not hit");
    // Reads stall too (a fresh mount: nothing cached), then return the
    // right bytes.
    drop(fs);
    let (fs, st) = open_faulty(&pool);
    let dev = st.control(&pool.join("data.0"));
    let slow = dev.add(Fault::hang(Ops::READ, stall).when(When::Times(1)));
    let t = std::time::Instant::now();
    assert_eq!(fs.read(f.ino, 0, 2 << 20).unwrap(), data);
    assert_eq!(dev.hits(slow), 1);
    assert!(t.elapsed() >= stall);
    assert!(check_pool(fs.pool()).unwrap().problems.is_empty());
}

/// A pool made under `dir` and opened on a fault storage: its path, the
/// filesystem, and the fault controls of its data device and metadata.
fn faulty_pool(dir: &Path) -> (PathBuf, Arc<Fs>, Arc<FaultControl>, Arc<FaultControl>) {
    let pool = make_pool(dir);
    let (fs, st) = open_faulty(&pool);
    let dev = st.control(&pool.join("data.0"));
    let meta = st.control(&pool.join("meta.redb"));
    (pool, fs, dev, meta)
}

/// Every file of `files` in the root directory reads exactly as written.
fn expect_files(fs: &Fs, files: &Files) {
    for (name, want) in files {
        let i = fs.lookup(ROOT_INO, name).unwrap();
        let got = fs.read(i.ino, 0, want.len() as u32 + 1).unwrap();
        assert!(
            got == *want,
            "{} reads {:?}",
            String::from_utf8_lossy(name),
            String::from_utf8_lossy(&got[..got.len().min(8)])
        );
    }
}

/// Names and contents of the files a test wrote.
type Files = Vec<(&'static [u8], Vec<u8>)>;

/// Writes `data` at `at` into root file `name` (made if missing) and into
/// `files`; returns the inode.
fn put(fs: &Fs, files: &mut Files, name: &'static [u8], at: usize, data: &[u8]) -> u64 {
    let ino = match fs.lookup(ROOT_INO, name) {
        Ok(i) => i.ino,
        Err(_) => fs.create(Ctx::ROOT, ROOT_INO, name, 0o644).unwrap().ino,
    };
    fs.write(ino, at as u64, data).unwrap();
    let i = match files.iter().position(|f| f.0 == name) {
        Some(i) => i,
        None => {
            files.push((name, Vec::new()));
            files.len() - 1
        }
    };
    let f = &mut files[i].1;
    f.resize(f.len().max(at + data.len()), 0);
    f[at..at + data.len()].copy_from_slice(data);
    ino
}

/// A snapshot taken while a flush commits, whose commit then fails (one
/// metadata write fails: alone, a retry would do): the snapshot returned
/// durable, so the filesystem stops rather than put the failed commit's
/// changes back under the snapshot's; an fsync waiting for that commit
/// gets the error, not a success; a remount commits both from the intent
/// log and finds the snapshot at its TID with the files of its moment.
#[test]
fn a_failed_commit_under_a_snapshot_stops_the_fs_and_a_remount_keeps_both() {
    use cairn_fs::SnapshotKind;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let d = tempfile::tempdir().unwrap();
    let (pool, fs, dev, meta) = faulty_pool(d.path());
    let mut files = Files::new();
    let synced = put(&fs, &mut files, b"synced", 0, &pattern(1 << 20));
    fs.fsync(synced).unwrap();
    put(&fs, &mut files, b"unsynced", 0, &pattern(300_000));
    let tid = fs.last_tid();
    // The flush's data sync waits long enough for the snapshot to be taken
    // during its commit, and then one metadata write of the commit fails
    // (alone, a failure the next flush would retry).
    let hang = dev
        .add(Fault::hang(Ops::SYNC, std::time::Duration::from_millis(1500)).when(When::Times(1)));
    let eio = meta.add(Fault::eio(Ops::WRITE).when(When::Times(1)));
    let done = AtomicBool::new(false);
    let (snap, at_snap) = std::thread::scope(|s| {
        let flushed = flush_in_background(s, &fs, &done);
        put(&fs, &mut files, b"during", 0, b"written during the commit");
        put(&fs, &mut files, b"synced", 4096, &[7u8; 5000]);
        let snap = fs.snapshot_create("s", SnapshotKind::Named).unwrap();
        assert!(!done.load(SeqCst), "the snapshot waited for the commit");
        let at_snap = files.clone();
        let after = put(&fs, &mut files, b"after", 0, b"after the snapshot");
        // On a thread of its own, so that a wait that never ends fails the
        // test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fs.clone();
        std::thread::spawn(move || tx.send(f.fsync(after)));
        let r = rx.recv_timeout(std::time::Duration::from_secs(60));
        let r = r.expect("the fsync after the snapshot never returned");
        let e = r.expect_err("the fsync after the snapshot");
        println!("the fsync after the snapshot: {e}");
        assert_eq!(e.to_string().matches("stopped").count(), 1, "{e}");
        let e = flushed.join().unwrap().expect_err("the flush");
        println!("the flush: {e}");
        (snap, at_snap)
    });
    assert_eq!(dev.hits(hang), 1);
    assert_eq!(meta.hits(eio), 1);
    assert_eq!(snap.tid, tid + 2, "on top of the flush's TID");
    assert!(
        fs.write(synced, 0, b"x").is_err(),
        "a stopped fs takes writes"
    );
    meta.clear();
    dev.clear();
    drop(fs);
    let p = Pool::open(&pool, None).unwrap();
    let rep = check_pool(&p).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let fs = Fs::open(p).unwrap();
    assert_eq!(fs.snapshot("s").unwrap().tid, snap.tid);
    assert!(fs.last_tid() >= snap.tid);
    for (name, want) in &at_snap {
        let what = String::from_utf8_lossy(name);
        let i = fs.asof_lookup(ROOT_INO, snap.tid, name).unwrap();
        let got = fs
            .asof_read(i.ino, snap.tid, 0, want.len() as u32 + 1)
            .unwrap();
        assert!(got == *want, "{what} in the snapshot reads wrong");
        let i = fs.lookup(ROOT_INO, name).unwrap();
        let got = fs.read(i.ino, 0, want.len() as u32 + 1).unwrap();
        assert!(got == *want, "{what} reads wrong after the remount");
    }
    assert!(fs.asof_lookup(ROOT_INO, snap.tid, b"after").is_err());
}

/// A cut taken while a flush commits (sealed above it without waiting),
/// whose commit then fails once (one metadata write: a failure the next
/// flush retries): the cut's changes go back with the failed ones, above
/// them, so nothing written is lost and the filesystem goes on; the cut's
/// snapshot is not taken (it was never durable); an fsync after the cut
/// commits everything, and a remount finds every file.
#[test]
fn a_failed_commit_under_a_cut_takes_the_cut_back_and_loses_nothing() {
    failed_commit_under_a_cut(false);
}

/// The same when the commit that fails is another cut's (`low`, cut
/// before the flush and committed by it): both cuts are dropped.
#[test]
fn a_failed_commit_of_a_cut_under_a_cut_takes_both_back() {
    failed_commit_under_a_cut(true);
}

/// The two tests above; `low`: the failed commit is a cut's.
fn failed_commit_under_a_cut(low: bool) {
    use cairn_fs::SnapshotKind;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let d = tempfile::tempdir().unwrap();
    let (pool, fs, dev, meta) = faulty_pool(d.path());
    let mut files = Files::new();
    put(&fs, &mut files, b"before", 0, &pattern(1 << 20));
    let hang = dev
        .add(Fault::hang(Ops::SYNC, std::time::Duration::from_millis(1500)).when(When::Times(1)));
    let eio = meta.add(Fault::eio(Ops::WRITE).when(When::Times(1)));
    if low {
        fs.snapshot_cut("low", SnapshotKind::Named).unwrap();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let flushed = flush_in_background(s, &fs, &done);
        put(&fs, &mut files, b"during", 0, b"written during the commit");
        put(&fs, &mut files, b"before", 4096, &[7u8; 5000]);
        fs.snapshot_cut("s", SnapshotKind::Named).unwrap();
        assert!(!done.load(SeqCst), "the cut waited for the commit");
        let after = put(&fs, &mut files, b"after", 0, b"after the cut");
        match flushed.join().unwrap() {
            // The cut's failed commit is reported to who waits for it;
            // the flush then commits everything.
            Ok(()) => assert!(low, "the flush succeeded"),
            Err(e) => assert_eq!(e.errno(), libc::EIO, "{e}"),
        }
        fs.fsync(after).unwrap();
    });
    assert_eq!((dev.hits(hang), meta.hits(eio)), (1, 1));
    assert!(fs.snapshot("s").is_err(), "the cut's snapshot was taken");
    assert!(
        fs.snapshot("low").is_err(),
        "the failed cut's snapshot was taken"
    );
    expect_files(&fs, &files);
    put(&fs, &mut files, b"later", 0, b"the filesystem goes on");
    fs.snapshot_create("s", SnapshotKind::Named).unwrap();
    meta.clear();
    dev.clear();
    drop(fs);
    let p = Pool::open(&pool, None).unwrap();
    let rep = check_pool(&p).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let fs = Fs::open(p).unwrap();
    expect_files(&fs, &files);
    assert!(fs.snapshot("s").is_ok());
}

/// A commit that fails once after an fsync logged changes on top of it
/// (during the commit): the retry commits those changes and newer ones,
/// so a crash right after it must not replay the older record over them.
#[test]
fn a_record_logged_during_a_failed_commit_is_not_replayed_over_its_retry() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let d = tempfile::tempdir().unwrap();
    let (pool, fs, dev, meta) = faulty_pool(d.path());
    let mut files = Files::new();
    let x = put(&fs, &mut files, b"x", 0, b"v0 v0 v0");
    fs.flush().unwrap();
    put(&fs, &mut files, b"big", 0, &pattern(1 << 20));
    dev.add(Fault::hang(Ops::SYNC, std::time::Duration::from_millis(1500)).when(When::Times(1)));
    meta.add(Fault::eio(Ops::WRITE).when(When::Times(1)));
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let flushed = flush_in_background(s, &fs, &done);
        put(&fs, &mut files, b"x", 0, b"v1 v1 v1");
        fs.fsync(x).unwrap();
        assert!(!done.load(SeqCst), "the fsync waited for the commit");
        flushed.join().unwrap().expect_err("the flush");
    });
    put(&fs, &mut files, b"x", 0, b"v2 v2 v2");
    fs.flush().unwrap();
    meta.clear();
    dev.clear();
    drop(fs); // a crash right after the retry's commit
    let fs = Fs::open(Pool::open(&pool, None).unwrap()).unwrap();
    expect_files(&fs, &files);
}

#[test]
fn a_tick_that_meets_a_full_device_or_a_failed_metadata_write_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let pool = make_pool(d.path());
    let (fs, st) = open_faulty(&pool);
    let dev = st.control(&pool.join("data.0"));
    let meta = st.control(&pool.join("meta.redb"));
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    let mut data = pattern(2 << 20);
    fs.write(f.ino, 0, &data).unwrap();
    fs.flush().unwrap();
    // The device is full: the tick cannot store the blocks, nor can the
    // commit it falls back to; the changes stay buffered and readable.
    let full = dev.add(Fault::no_space());
    let second: Vec<u8> = pattern(1 << 20).iter().map(|b| b ^ 0x5a).collect();
    fs.write(f.ino, 0, &second).unwrap();
    data[..second.len()].copy_from_slice(&second);
    let e = fs.tick().unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert!(dev.hits(full) > 0);
    assert_eq!(fs.ticked(), (0, 0), "no block marked with a chunk");
    assert_eq!(fs.read(f.ino, 0, 2 << 20).unwrap(), data);
    dev.clear();
    fs.flush().unwrap();
    // The tick's metadata transaction fails once: the store is opened
    // again and the commit the tick falls back to makes the changes.
    let once = meta.add(Fault::eio(Ops::WRITE).when(When::Times(1)));
    let third: Vec<u8> = pattern(1 << 20).iter().map(|b| b ^ 0xa5).collect();
    fs.write(f.ino, 1 << 20, &third).unwrap();
    data[1 << 20..].copy_from_slice(&third);
    fs.tick().unwrap();
    assert_eq!(meta.hits(once), 1);
    assert_eq!(fs.ticked(), (0, 0));
    assert_eq!(fs.read(f.ino, 0, 2 << 20).unwrap(), data);
    // A tick that works, then a crash: everything is there.
    fs.write(f.ino, 0, b"ticked").unwrap();
    data[..6].copy_from_slice(b"ticked");
    fs.tick().unwrap();
    drop(fs);
    let p = Pool::open(&pool, None).unwrap();
    let rep = check_pool(&p).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let fs = Fs::open(p).unwrap();
    assert_eq!(fs.read(f.ino, 0, 2 << 20).unwrap(), data);
}
