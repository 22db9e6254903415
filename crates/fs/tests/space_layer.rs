//! Pool space at the filesystem layer, without FUSE: a pool of a small
//! local tier and an s3 tier (a real s3s-fs server on loopback) holds more
//! than the local tier, and a pool on a host filesystem without
//! `fallocate` (a real one: bindfs, which does not pass it through) takes
//! writes like any other.

mod common;

use cairn_devices::{DeviceClass, DeviceSpec};
use cairn_fs::{mkfs, Ctx, Fs, MkfsOptions, Pool, PoolConfig, ROOT_INO};
use cairn_objstore::testing::{write_credentials, S3Server};
use common::noise;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// Writes `data` as file `name` in 1 MiB writes, then one flush.
fn write_file(fs: &Fs, name: &str, data: &[u8]) -> cairn_fs::Result<u64> {
    let f = fs.create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)?;
    for (i, part) in data.chunks(MIB).enumerate() {
        fs.write(f.ino, (i * MIB) as u64, part)?;
    }
    fs.flush()?;
    Ok(f.ino)
}

/// Reads file `ino` back whole and compares it with `data`.
fn assert_reads(fs: &Fs, ino: u64, data: &[u8]) {
    for (i, part) in data.chunks(MIB).enumerate() {
        let got = fs.read(ino, (i * MIB) as u64, MIB as u32).unwrap();
        assert!(got == part, "MiB {i} of the file reads back different");
    }
}

/// Segments of the committed table per device id.
fn segments_on(fs: &Fs, dev: u32) -> usize {
    let t = fs.pool().chunks.segment_table();
    t.iter().filter(|(_, s)| s.device == dev).count()
}

fn s3_config(creds: &Path) -> PoolConfig {
    PoolConfig {
        tier_interval_secs: 0,
        gc_interval_secs: 0,
        read_cache_mib: 0,
        s3_timeout_secs: 5,
        s3_credentials_file: creds.display().to_string(),
        ..PoolConfig::default()
    }
}

/// Issue 50 item 5: a 32 MiB nvme device plus an s3 tier takes a 96 MiB
/// file in one flush (the tier mover off: new segments go to the store
/// once the local tier is full), reads it back exactly, and again after
/// the pool is closed and opened; nothing says it is short of space.
#[test]
fn a_pool_with_an_s3_tier_holds_more_than_its_local_tier() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("s3.creds");
    write_credentials(&creds);
    let mut o = MkfsOptions::default();
    o.devices.push(DeviceSpec::tier(
        DeviceClass::Nvme,
        dir.path().join("nvme"),
        Some(33 * MIB as u64),
    ));
    std::fs::create_dir_all(dir.path().join("nvme")).unwrap();
    let pool = dir.path().join("pool");
    mkfs(&pool, o).unwrap();
    let open = || Fs::open(Pool::open(&pool, Some(s3_config(&creds))).unwrap()).unwrap();
    let fs = open();
    let spec: DeviceSpec = s3.spec("big").parse().unwrap();
    let s3_id = fs.device_add(&spec).unwrap();
    let data = noise(96 * MIB, 5);
    let ino = write_file(&fs, "big", &data).expect("96 MiB into 32 MiB of nvme and an s3 tier");
    assert!(
        segments_on(&fs, s3_id) >= 16,
        "the local tier holds 8 segments: the rest is in the store"
    );
    assert_eq!(fs.space_status(), None, "short of space with a bucket");
    assert_reads(&fs, ino, &data);
    fs.shutdown().unwrap();
    drop(fs);
    let fs = open();
    assert_reads(&fs, ino, &data);
    let report = cairn_fs::maintenance::check::check_pool(fs.pool()).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    fs.shutdown().unwrap();
}

/// A bindfs mount of `raw` at `mnt`, unmounted on drop.
struct Bindfs {
    mnt: PathBuf,
}

impl Bindfs {
    fn mount(raw: &Path, mnt: &Path) -> Bindfs {
        std::fs::create_dir_all(raw).unwrap();
        std::fs::create_dir_all(mnt).unwrap();
        let st = Command::new("bindfs")
            .arg(raw)
            .arg(mnt)
            .status()
            .expect("bindfs is needed for this test (apt-get install bindfs)");
        assert!(
            st.success(),
            "bindfs {} {}: {st}",
            raw.display(),
            mnt.display()
        );
        Bindfs {
            mnt: mnt.to_path_buf(),
        }
    }
}

impl Drop for Bindfs {
    fn drop(&mut self) {
        let _ = Command::new("fusermount").arg("-u").arg(&self.mnt).status();
    }
}

/// fallocate's errno on a file in `dir` (0: it worked).
fn fallocate_errno(dir: &Path) -> i32 {
    use std::os::fd::AsRawFd;
    let p = dir.join("probe");
    let f = std::fs::File::create(&p).unwrap();
    // SAFETY: fallocate on a descriptor we own.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 4096) };
    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    std::fs::remove_file(&p).unwrap();
    if r == 0 {
        0
    } else {
        e
    }
}

/// Issue 50 item 6: a pool on a host filesystem without fallocate (bindfs
/// answers EOPNOTSUPP) takes writes and reads them back; its metadata
/// reserve is written as zeros instead, and `info` has nothing to warn of.
#[test]
fn a_pool_on_a_host_without_fallocate_takes_writes() {
    let dir = tempfile::tempdir().unwrap();
    let host = Bindfs::mount(&dir.path().join("raw"), &dir.path().join("mnt"));
    assert_eq!(
        fallocate_errno(&host.mnt),
        libc::EOPNOTSUPP,
        "this test needs a host filesystem without fallocate"
    );
    let pool = host.mnt.join("pool");
    let mut o = MkfsOptions::default();
    o.devices.push(DeviceSpec::tier(
        DeviceClass::Ssd,
        host.mnt.join("dev"),
        Some(33 * MIB as u64),
    ));
    mkfs(&pool, o).unwrap();
    let fs: Arc<Fs> = Fs::open(Pool::open(&pool, None).unwrap()).unwrap();
    assert_eq!(fs.space_status(), None, "a warning with room to spare");
    let data = noise(4 * MIB, 6);
    let ino = write_file(&fs, "f", &data).expect("writes on a host without fallocate");
    assert_reads(&fs, ino, &data);
    let reserve = std::fs::metadata(pool.join("meta.reserve")).unwrap();
    assert!(
        reserve.len() >= 1 << 20,
        "reserve of {} bytes",
        reserve.len()
    );
    fs.shutdown().unwrap();
    drop(fs);
}

/// Issue 50 item 5, the log's part: when the pool's devices are what ran
/// out (the local tier full, its s3 tier's store down), the pool goes
/// short of space saying so, not that the filesystem holding the
/// metadata reserve is full (the host has room).
#[test]
fn a_pool_out_of_slots_says_so_not_that_the_host_is_full() {
    let mut s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("s3.creds");
    write_credentials(&creds);
    let mut o = MkfsOptions::default();
    o.devices.push(DeviceSpec::tier(
        DeviceClass::Nvme,
        dir.path().join("nvme"),
        Some(33 * MIB as u64),
    ));
    std::fs::create_dir_all(dir.path().join("nvme")).unwrap();
    let pool = dir.path().join("pool");
    mkfs(&pool, o).unwrap();
    let fs = Fs::open(Pool::open(&pool, Some(s3_config(&creds))).unwrap()).unwrap();
    let spec: DeviceSpec = s3.spec("down").parse().unwrap();
    fs.device_add(&spec).unwrap();
    s3.stop();
    let r = write_file(&fs, "big", &noise(64 * MIB, 7));
    assert!(
        r.is_err(),
        "64 MiB stored with 32 MiB of nvme and the store down"
    );
    // The first flushes find the store down; then it counts as such.
    for _ in 0..3 {
        if fs.space_status().is_some() {
            break;
        }
        let _ = fs.flush();
    }
    let st = fs.space_status().expect("short of space, and why");
    assert!(st.contains("the pool's devices are full"), "{st}");
    assert!(!st.contains("meta.reserve"), "{st}");
}
