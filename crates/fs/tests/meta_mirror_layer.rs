//! Redundant metadata (issue 15): a pool of two tier devices keeps a second
//! copy of its metadata beside the other device, a pool of one beside the
//! first copy. With 1 MiB of random bytes written over the middle of either
//! copy while the pool is closed, it opens, every file reads exact, scrub
//! reports the repaired pages and check is clean; damage at the same place
//! in both copies is refused at open, never read as data. A one-device
//! pool that gains a device has its second copy moved beside it at the
//! next open; one made with `meta_copies: 1` never gets a second.

use cairn_devices::{DeviceClass, DeviceSpec};
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::pool::PoolPaths;
use cairn_fs::{mkfs, Ctx, Fs, MkfsOptions, Pool, ROOT_INO};
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// A pool of one tier device, the directory `fast`.
fn make_single(dir: &Path, meta_copies: u32) -> Arc<Fs> {
    std::fs::create_dir_all(dir.join("fast")).unwrap();
    let fast = DeviceSpec::tier(DeviceClass::Nvme, dir.join("fast"), Some(64 * MIB));
    let o = MkfsOptions {
        sparse: true,
        devices: vec![fast],
        meta_copies,
        ..MkfsOptions::default()
    };
    mkfs(&dir.join("pool"), o).unwrap();
    open(dir)
}

/// A pool of two tier devices, the directories `fast` and `slow`.
fn make(dir: &Path) -> Arc<Fs> {
    let mut o = MkfsOptions {
        sparse: true,
        ..MkfsOptions::default()
    };
    for (class, name) in [(DeviceClass::Nvme, "fast"), (DeviceClass::Hdd, "slow")] {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        o.devices
            .push(DeviceSpec::tier(class, dir.join(name), Some(64 * MIB)));
    }
    mkfs(&dir.join("pool"), o).unwrap();
    open(dir)
}

fn open(dir: &Path) -> Arc<Fs> {
    Fs::open(Pool::open(&dir.join("pool"), None).unwrap()).unwrap()
}

/// Enough small files for a metadata file of several MiB.
fn fill(fs: &Fs) -> BTreeMap<String, Vec<u8>> {
    let mut model = BTreeMap::new();
    for d in 0..8 {
        let dname = format!("d{d}");
        let dir = fs
            .mkdir(Ctx::ROOT, ROOT_INO, dname.as_bytes(), 0o755)
            .unwrap();
        for i in 0..1000 {
            let name = format!("file-with-a-longish-name-{i:05}");
            let f = fs
                .create(Ctx::ROOT, dir.ino, name.as_bytes(), 0o644)
                .unwrap();
            let data = format!("{dname}/{name} {}", "x".repeat(i % 300)).into_bytes();
            fs.write(f.ino, 0, &data).unwrap();
            fs.release(f.ino);
            model.insert(format!("{dname}/{name}"), data);
        }
    }
    fs.flush().unwrap();
    model
}

fn check_files(fs: &Fs, model: &BTreeMap<String, Vec<u8>>) {
    for (path, want) in model {
        let (d, n) = path.split_once('/').unwrap();
        let dir = fs.lookup(ROOT_INO, d.as_bytes()).unwrap();
        let f = fs.lookup(dir.ino, n.as_bytes()).unwrap();
        assert_eq!(&fs.read(f.ino, 0, 1 << 16).unwrap(), want, "{path}");
    }
}

/// Writes 1 MiB of random bytes over the middle of `file` (or its middle
/// half, if smaller than 2 MiB).
fn damage(file: &Path, seed: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    let len = f.metadata().unwrap().len();
    let n = MIB.min(len / 2);
    let mut x = seed | 1;
    let junk: Vec<u8> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    f.write_all_at(&junk, (len - n) / 2).unwrap();
    f.sync_all().unwrap();
}

/// The two copies' files, checked to lie beside different devices.
fn copies(dir: &Path) -> (PathBuf, PathBuf) {
    let (primary, mirror) = copies_anywhere(dir);
    assert_ne!(
        primary.parent(),
        mirror.parent(),
        "the copies share a device"
    );
    (primary, mirror)
}

/// The two copies' files, with the second's mode checked.
fn copies_anywhere(dir: &Path) -> (PathBuf, PathBuf) {
    let pool = dir.join("pool");
    let primary = std::fs::canonicalize(PoolPaths::meta(&pool)).unwrap();
    let mirror = std::fs::canonicalize(PoolPaths::meta_mirror(&pool)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&mirror).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the mirror is readable by other users");
    (primary, mirror)
}

/// Damages copy `which` of a closed pool of two devices (or of one device,
/// `single`: both copies beside it), then checks the open repairs it.
fn damaged_copy_is_repaired(which: usize, single: bool) {
    let d = tempfile::tempdir().unwrap();
    let fs = match single {
        true => make_single(d.path(), 2),
        false => make(d.path()),
    };
    let model = fill(&fs);
    fs.shutdown().unwrap();
    drop(fs);
    let (primary, mirror) = match single {
        true => copies_anywhere(d.path()),
        false => copies(d.path()),
    };
    if single {
        assert_eq!(primary.parent(), mirror.parent(), "beside each other");
    }
    let len = std::fs::metadata(&primary).unwrap().len();
    assert!(
        len >= 2 * MIB,
        "metadata of {len} bytes: too small to damage 1 MiB"
    );
    damage([&primary, &mirror][which], 7 + which as u64);
    let fs = open(d.path());
    check_files(&fs, &model);
    let rep = fs.scrub(&|_, _| {}).unwrap();
    assert_eq!(rep.meta_copies, 2);
    assert!(
        rep.meta_repaired_at_open >= 200,
        "copy {which}: {} pages repaired at open",
        rep.meta_repaired_at_open
    );
    assert!(rep.damaged.is_empty(), "{:?}", rep.damaged);
    assert_eq!(rep.meta_repaired_now, 0, "both copies equal after open");
    let c = check_pool(fs.pool()).unwrap();
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    fs.shutdown().unwrap();
    drop(fs);
    assert_eq!(
        std::fs::read(&primary).unwrap(),
        std::fs::read(&mirror).unwrap(),
        "the copies are equal again"
    );
}

#[test]
fn a_damaged_primary_copy_is_repaired_from_the_mirror() {
    damaged_copy_is_repaired(0, false);
}

#[test]
fn a_damaged_mirror_copy_is_repaired_from_the_primary() {
    damaged_copy_is_repaired(1, false);
}

#[test]
fn a_one_device_pool_repairs_its_damaged_primary_from_the_copy_beside_it() {
    damaged_copy_is_repaired(0, true);
}

#[test]
fn a_page_damaged_while_mounted_is_served_from_the_other_copy() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let model = fill(&fs);
    fs.shutdown().unwrap();
    drop(fs);
    let (primary, _) = copies(d.path());
    // Open with a tiny metadata cache, then damage the primary under it:
    // reads that miss the cache find bad pages and repair them.
    let mut c = cairn_fs::PoolConfig::load(&PoolPaths::config(&d.path().join("pool"))).unwrap();
    c.meta_cache_mib = 0;
    let fs = Fs::open(Pool::open(&d.path().join("pool"), Some(c)).unwrap()).unwrap();
    damage(&primary, 99);
    // The host's page cache still holds the old pages: drop it.
    let f = std::fs::File::open(&primary).unwrap();
    unsafe {
        use std::os::fd::AsRawFd;
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    check_files(&fs, &model);
    let rep = fs.scrub(&|_, _| {}).unwrap();
    assert!(
        rep.meta_repaired_on_read + rep.meta_repaired_now > 0,
        "nothing repaired: {rep:?}"
    );
    let again = fs.scrub(&|_, _| {}).unwrap();
    assert_eq!(
        again.meta_repaired_now, 0,
        "the scrub left both copies good"
    );
}

#[test]
fn damage_in_both_copies_is_refused_at_open() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    fill(&fs);
    fs.shutdown().unwrap();
    drop(fs);
    let (primary, mirror) = copies(d.path());
    damage(&primary, 5);
    damage(&mirror, 6);
    let e = Pool::open(&d.path().join("pool"), None).err();
    assert!(e.is_some(), "a pool with both copies damaged opened");
}

/// A one-device pool's second copy lies beside the first; after a device
/// is added, the next open moves it beside that device (the old file
/// goes), and every file reads exact. A copy a crash left beside the first
/// after the move (the link already switched) is removed at open.
#[test]
fn an_added_device_takes_the_second_copy_at_the_next_open() {
    let d = tempfile::tempdir().unwrap();
    let fs = make_single(d.path(), 2);
    let (primary, before) = copies_anywhere(d.path());
    assert_eq!(primary.parent(), before.parent(), "beside each other");
    std::fs::create_dir_all(d.path().join("slow")).unwrap();
    let slow = DeviceSpec::tier(DeviceClass::Hdd, d.path().join("slow"), Some(64 * MIB));
    fs.device_add(&slow).unwrap();
    let model = fill(&fs);
    fs.shutdown().unwrap();
    drop(fs);
    let fs = open(d.path());
    let (_, after) = copies(d.path());
    let slow_dir = std::fs::canonicalize(d.path().join("slow")).unwrap();
    assert_eq!(after.parent(), Some(slow_dir.as_path()));
    assert!(!before.exists(), "the copy beside the first stayed");
    check_files(&fs, &model);
    assert_eq!(fs.pool().meta.mirror_stats().map(|s| s.copies), Some(2));
    fs.shutdown().unwrap();
    drop(fs);
    assert_eq!(
        std::fs::read(&primary).unwrap(),
        std::fs::read(&after).unwrap()
    );
    std::fs::write(&before, b"left by a crash").unwrap();
    let fs = open(d.path());
    assert!(!before.exists(), "the left-behind copy stayed");
    assert_eq!(copies(d.path()).1, after);
    drop(fs);
}

/// A pool made with `meta_copies: 1` has no second copy, and no open (nor
/// an added device) gives it one.
#[test]
fn a_pool_made_with_one_copy_never_gets_a_second() {
    let d = tempfile::tempdir().unwrap();
    let fs = make_single(d.path(), 1);
    let pool = d.path().join("pool");
    assert!(std::fs::symlink_metadata(PoolPaths::meta_mirror(&pool)).is_err());
    assert_eq!(fs.pool().meta.mirror_stats(), None);
    std::fs::create_dir_all(d.path().join("slow")).unwrap();
    let slow = DeviceSpec::tier(DeviceClass::Hdd, d.path().join("slow"), Some(64 * MIB));
    fs.device_add(&slow).unwrap();
    fs.shutdown().unwrap();
    drop(fs);
    let fs = open(d.path());
    assert!(std::fs::symlink_metadata(PoolPaths::meta_mirror(&pool)).is_err());
    assert_eq!(fs.pool().meta.mirror_stats(), None);
}
