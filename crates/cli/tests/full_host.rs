//! A full host filesystem under the pool. The pool directory (metadata
//! store, log, reserve) and its device live on a small loop-mounted ext4;
//! a filler file takes every free block. Then: fsynced writes fail with
//! ENOSPC (never EIO) and nothing fsynced before is lost; the mount keeps
//! answering; deleting a file commits; once the filler is gone, writes work
//! again without a remount; a kill -9 while full loses nothing committed;
//! after a remount every file whose fsync succeeded reads back exactly,
//! the deleted file stays deleted and `cairn check` is clean. A first
//! mount on a host with no byte free fails, naming the full filesystem.

mod common;

use common::*;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop-mounted ext4 image in a temp dir, unmounted on drop.
struct LoopFs {
    mnt: PathBuf,
    _tmp: tempfile::TempDir,
}

impl LoopFs {
    fn new(mib: u64) -> LoopFs {
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("img");
        let mnt = tmp.path().join("host");
        fs::create_dir(&mnt).unwrap();
        fs::File::create(&img).unwrap().set_len(mib << 20).unwrap();
        sh(tmp.path(), "mkfs.ext4 -q -F img && mount -o loop img host");
        LoopFs { mnt, _tmp: tmp }
    }

    /// A tmpfs of `mib` MiB instead: no delayed allocation, so a filler
    /// leaves no byte free.
    fn tmpfs(mib: u64) -> LoopFs {
        let tmp = tempfile::tempdir().unwrap();
        let mnt = tmp.path().join("host");
        fs::create_dir(&mnt).unwrap();
        sh(
            tmp.path(),
            &format!("mount -t tmpfs -o size={mib}M tmpfs host"),
        );
        LoopFs { mnt, _tmp: tmp }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// Writes and fsyncs a file: Ok, or the errno of the first failure.
fn write_fsync(p: &Path, data: &[u8]) -> Result<(), i32> {
    let r = fs::File::create(p).and_then(|mut f| {
        f.write_all(data)?;
        f.sync_all()
    });
    r.map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// Fills the filesystem at `dir` with a file `name` until ENOSPC.
fn fill(dir: &Path, name: &str) {
    let mut f = fs::File::create(dir.join(name)).unwrap();
    let block = vec![0x5au8; 1 << 16];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
}

#[test]
fn full_host_gives_enospc_keeps_fsynced_data_and_recovers_without_remount() {
    let host = LoopFs::new(128);
    let mut fs_ = Fs::create();
    fs_.pool = host.mnt.join("pool");
    let dev = fs_.pool.join("dev0");
    fs_.mkfs(&["--device", &format!("ssd:{}:60M", dev.display())]);
    // The device's blocks are the pool's own; only the host's are filled.
    sh(&host.mnt, &format!("fallocate -l 60M {}", dev.display()));
    fs_.mount();
    let a = pattern(1, 5_000_000);
    write_synced(&fs_.p("a"), &a);

    fill(&host.mnt, "filler");
    fill(&host.mnt, "filler2");
    let mut kept = Vec::new();
    let mut first_err = None;
    for i in 0..4000 {
        let data = pattern(100 + i, 3000 + (i as usize % 5000));
        match write_fsync(&fs_.p(&format!("f{i}")), &data) {
            Ok(()) => kept.push((format!("f{i}"), data)),
            Err(e) => {
                first_err = Some((i, e));
                break;
            }
        }
    }
    let (at, errno) = first_err.expect("4000 fsynced files fit on a full host filesystem");
    assert_eq!(
        errno,
        libc::ENOSPC,
        "file {at}: a full host must give ENOSPC, not errno {errno}"
    );
    eprintln!(
        "{} files fsynced after the host filled; file {at} got ENOSPC",
        kept.len()
    );

    // Still serving: reads, a second try (still ENOSPC), a delete.
    assert_bytes_eq(&fs::read(fs_.p("a")).unwrap(), &a, "a while full");
    assert_eq!(write_fsync(&fs_.p("again"), b"x"), Err(libc::ENOSPC));
    fs::remove_file(fs_.p("a")).unwrap();
    fs::remove_file(fs_.p("again")).unwrap();
    cairn_ok(&[os("sync"), fs_.mnt.as_os_str()]);

    // A crash while short of space loses nothing that was committed, and
    // the new daemon, with the host still full, refuses new data too.
    fs_.kill9();
    fs_.mount();
    assert!(
        !fs_.p("a").exists(),
        "the synced delete was undone by a crash"
    );
    for (name, data) in &kept {
        assert_bytes_eq(&fs::read(fs_.p(name)).unwrap(), data, name);
    }
    assert_eq!(write_fsync(&fs_.p("again"), b"x"), Err(libc::ENOSPC));
    fs::remove_file(fs_.p("again")).unwrap();

    // Space comes back: writes work again, no remount.
    fs::remove_file(host.mnt.join("filler")).unwrap();
    let after = pattern(7, 200_000);
    assert!(
        eventually(std::time::Duration::from_secs(10), || write_fsync(
            &fs_.p("after"),
            &after
        )
        .is_ok()),
        "writes still refused after space was freed\n{}",
        fs_.diagnostics()
    );

    fs_.remount();
    assert!(
        !fs_.p("a").exists(),
        "the delete committed on a full host was undone"
    );
    assert_bytes_eq(&fs::read(fs_.p("after")).unwrap(), &after, "after");
    for (name, data) in &kept {
        let got = fs::read(fs_.p(name))
            .unwrap_or_else(|e| panic!("{name} was fsynced: {e}\n{}", fs_.diagnostics()));
        assert_bytes_eq(&got, data, name);
    }
    let log = fs::read_to_string(fs_.dir.join("mount-1.out")).unwrap();
    assert!(
        log.contains("metadata reserve released"),
        "{}",
        tail(&log, 30)
    );
    fs_.finish();
}

/// A pool whose host filesystem has no byte left cannot even open its
/// metadata store for a first mount (with a little room it mounts, short
/// of its reserve and intent log, and logs warnings). The mount fails
/// saying which filesystem is full and what to do, and mounts once space
/// is freed.
#[test]
fn a_mount_on_a_full_host_says_which_filesystem_to_free() {
    let host = LoopFs::tmpfs(128);
    let mut fs_ = Fs::create();
    fs_.pool = host.mnt.join("pool");
    let dev = fs_.pool.join("dev0");
    fs_.mkfs(&["--device", &format!("ssd:{}:32M", dev.display())]);
    fill(&host.mnt, "filler");
    let out = cairn(&[os("mount"), fs_.pool.as_os_str(), fs_.mnt.as_os_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted on a full host: {err}");
    let want = format!("the filesystem holding {} is full", fs_.pool.display());
    assert!(
        err.contains(&want) && err.contains("free space on it and mount again"),
        "{err}"
    );
    assert!(!fs_.is_mounted(), "a failed mount left a mount behind");
    fs::remove_file(host.mnt.join("filler")).unwrap();
    fs_.mount();
    write_synced(&fs_.p("x"), b"after");
    assert_eq!(fs::read(fs_.p("x")).unwrap(), b"after");
    fs_.finish();
}
