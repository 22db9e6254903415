//! Guards against administrator mistakes and host faults (issue 13, items
//! 1, 2, 5, 6, 7, 10, 12): mkfs never formats a pool or device in use nor,
//! without --force, a device holding data; device files are allocated (or
//! df tells the host's truth when sparse); pool files are private to their
//! owner; a truncated device is refused; errors say what to do.

mod common;

use common::*;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs cairn and asserts it failed without panicking; returns stderr.
#[track_caller]
fn cairn_fails<S: AsRef<OsStr>>(args: &[S], what: &str) -> String {
    let out = cairn(args);
    assert!(
        !out.status.success(),
        "{what}: expected a failure\n{}",
        describe(&out)
    );
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{what}: panicked\n{err}");
    err
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// Runs a command as user nobody (uid/gid 65534, no groups).
fn as_nobody(prog: &str, args: &[&OsStr]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", prog])
        .args(args);
    run_timeout(&mut cmd, CMD_TIMEOUT)
}

/// The pool's UUID as `cairn info --json` reports it.
fn pool_uuid(target: &Path) -> String {
    let out = cairn_ok(&[os("info"), target.as_os_str(), os("--json")]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("info json");
    v["uuid"].as_str().expect("uuid").to_string()
}

fn info_json(target: &Path) -> serde_json::Value {
    let out = cairn_ok(&[os("info"), target.as_os_str(), os("--json")]);
    serde_json::from_str(&out).expect("info json")
}

fn mkfs_args<'a>(pool: &'a Path, rest: &[&'a str]) -> Vec<&'a OsStr> {
    let mut v = vec![os("mkfs"), pool.as_os_str()];
    v.extend(rest.iter().map(|s| os(s)));
    v
}

/// A shared flock held on a file for as long as the value lives.
struct Flock(#[allow(dead_code)] File);

impl Flock {
    fn shared(p: &Path) -> Flock {
        let f = File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
        assert_eq!(
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) },
            0,
            "flock {}",
            p.display()
        );
        Flock(f)
    }
}

// ------------------------------------------------------------ item 1

#[test]
fn mkfs_never_formats_a_pool_in_use() {
    let mut fs = Fs::create();
    let dev = fs.dev("z.dev");
    let spec = format!("ssd:{dev}:64M");
    fs.mkfs(&["--device", &spec]);
    fs.mount();
    write_synced(&fs.p("f"), b"important");
    cairn_ok(&[os("sync"), fs.mnt.as_os_str()]);
    let pool = fs.pool.to_str().unwrap().to_string();
    for extra in [
        vec!["--force", "--device", spec.as_str()],
        vec!["--force", "--sparse"],
        vec![],
    ] {
        let err = cairn_fails(&mkfs_args(&fs.pool, &extra), "mkfs of a mounted pool");
        assert!(
            err.contains(&pool) && err.contains("in use"),
            "mkfs {extra:?} of a mounted pool: error must name the pool and say it is in use: {err}"
        );
    }
    assert_eq!(fs::read(fs.p("f")).unwrap(), b"important");
    fs.remount();
    assert_eq!(
        fs::read(fs.p("f")).unwrap(),
        b"important",
        "pool lost data after a refused mkfs"
    );
    fs.unmount();
    // Open by another cairn process (here: its lock held by the test).
    let held = Flock::shared(&fs.pool.join("lock"));
    let err = cairn_fails(
        &mkfs_args(&fs.pool, &["--force", "--device", &spec]),
        "mkfs of a pool whose lock is held",
    );
    assert!(err.contains("in use"), "{err}");
    drop(held);
    fs.mount();
    assert_eq!(fs::read(fs.p("f")).unwrap(), b"important");
    fs.finish();
}

/// mkfs says what each device got: its size, whether its blocks are
/// reserved, and for a size the administrator did not give, how it was
/// chosen (a default device takes 90% of the host's free space).
#[test]
fn mkfs_says_what_each_device_got() {
    let fs = Fs::create();
    let spec = format!("ssd:{}:64M", fs.dev("a.dev"));
    let out = cairn_ok(&mkfs_args(&fs.pool, &["--device", &spec]));
    let size = info_json(&fs.pool)["devices"][0]["size"]
        .as_u64()
        .expect("device size");
    let line = format!(
        "device 0: ssd tier {}, {} usable (blocks reserved)",
        fs.dev("a.dev"),
        cairn_devices::size::human(size)
    );
    assert!(out.contains(&line), "mkfs output lacks {line:?}:\n{out}");
    assert!(
        !out.contains("90%"),
        "a size given is not explained:\n{out}"
    );
    let other = fs.dir.join("other");
    let out = cairn_ok(&mkfs_args(&other, &["--sparse"]));
    let size = info_json(&other)["devices"][0]["size"].as_u64().unwrap();
    let line = format!(
        "device 0: ssd tier {}, {} usable (sparse: blocks not reserved; 90% of the free space",
        other.join("data.0").display(),
        cairn_devices::size::human(size)
    );
    assert!(out.contains(&line), "mkfs output lacks {line:?}:\n{out}");
}

// ------------------------------------------------------------ item 2

#[test]
fn mkfs_refuses_devices_of_other_pools_and_duplicates() {
    let mut x = Fs::create();
    let xdev = x.dev("x.dev");
    let xspec = format!("ssd:{xdev}:64M");
    x.mkfs(&["--device", &xspec]);
    x.mount();
    write_synced(&x.p("f"), b"pool x data");
    cairn_ok(&[os("sync"), x.mnt.as_os_str()]);
    let uuid = pool_uuid(&x.mnt);
    let y = x.dir.join("ypool");
    for force in [false, true] {
        let mut a = vec!["--device", xspec.as_str()];
        if force {
            a.push("--force");
        }
        let err = cairn_fails(&mkfs_args(&y, &a), "mkfs on a mounted pool's device");
        assert!(
            err.contains(&xdev) && err.contains("in use"),
            "mkfs {a:?} on a mounted pool's device: {err}"
        );
        assert!(!y.exists(), "failed mkfs left {} behind", y.display());
    }
    x.unmount();
    let err = cairn_fails(
        &mkfs_args(&y, &["--device", &xspec]),
        "mkfs without --force on another pool's device",
    );
    assert!(
        err.contains(&uuid) && err.contains("--force"),
        "error must name the owning pool {uuid} and --force: {err}"
    );
    assert!(!y.exists(), "failed mkfs left {} behind", y.display());
    x.mount();
    assert_eq!(fs::read(x.p("f")).unwrap(), b"pool x data");
    x.unmount();
    x.check();

    // Any non-zero data in the first MiB: refused without --force.
    let data = x.dev("data.img");
    fs::write(&data, pattern(7, 2 * MIB as usize)).unwrap();
    let dspec = format!("ssd:{data}:64M");
    let err = cairn_fails(&mkfs_args(&y, &["--device", &dspec]), "mkfs over data");
    assert!(err.contains(&data) && err.contains("data"), "{err}");
    assert_eq!(
        fs::read(&data).unwrap()[..MIB as usize],
        pattern(7, 2 * MIB as usize)[..MIB as usize],
        "refused mkfs changed the data file"
    );
    cairn_ok(&mkfs_args(&y, &["--device", &dspec, "--force"]));

    // One file named twice, through a symlink (before it exists, and after).
    let (e3, link) = (x.dev("e3"), x.dev("e3link"));
    std::os::unix::fs::symlink(&e3, &link).unwrap();
    let z = x.dir.join("zpool");
    for round in 0..2 {
        for force in [false, true] {
            let (s1, s2) = (format!("ssd:{e3}:64M"), format!("hdd:{link}:64M"));
            let mut a = vec!["--device", s1.as_str(), "--device", s2.as_str()];
            if force {
                a.push("--force");
            }
            let err = cairn_fails(&mkfs_args(&z, &a), "mkfs with one file twice");
            assert!(err.contains("same device"), "round {round}: {err}");
            assert!(!z.exists(), "failed mkfs left {} behind", z.display());
        }
        fs::write(&e3, b"").unwrap();
    }
    x.mount();
    x.finish();
}

/// A directory device holds its pool's metadata (DIR/cairn-meta.redb):
/// another pool's mkfs naming that directory must not replace it.
#[test]
fn mkfs_keeps_another_pools_metadata_beside_a_directory_device() {
    let mut x = Fs::create();
    let dir = x.dir.join("devs").join("nvme-x");
    fs::create_dir(&dir).unwrap();
    let dspec = format!("nvme:{}:64M", dir.display());
    x.mkfs(&["--device", &dspec]);
    assert!(dir.join("cairn-meta.redb").exists());
    x.mount();
    write_synced(&x.p("f"), b"x metadata");
    let y = x.dir.join("ypool");
    let ydev = x.dev("y.dev");
    let yspec = format!("ssd:{ydev}:64M");
    let args = ["--device", yspec.as_str(), "--device", dspec.as_str()];
    let err = cairn_fails(
        &mkfs_args(&y, &args),
        "mkfs beside a mounted pool's metadata",
    );
    assert!(err.contains("in use"), "{err}");
    let mut forced = args.to_vec();
    forced.push("--force");
    let err = cairn_fails(&mkfs_args(&y, &forced), "mkfs --force beside it");
    assert!(err.contains("in use"), "{err}");
    x.unmount();
    let err = cairn_fails(&mkfs_args(&y, &args), "mkfs beside another pool's metadata");
    assert!(
        err.contains("cairn-meta.redb") && err.contains("--force"),
        "{err}"
    );
    assert!(!y.exists() && !Path::new(&ydev).exists(), "leftovers");
    x.mount();
    assert_eq!(fs::read(x.p("f")).unwrap(), b"x metadata");
    x.finish();
}

/// A loop block device over a file, detached when dropped.
struct LoopDev(String);

impl LoopDev {
    fn new(file: &Path, size: u64) -> LoopDev {
        File::create(file).unwrap().set_len(size).unwrap();
        let dev = sh(
            Path::new("/"),
            &format!("losetup -f --show {}", file.display()),
        );
        LoopDev(dev.trim().to_string())
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// Block devices: others who can read one are warned about; one given
/// twice (through a symlink) is refused; one in use is never formatted.
#[test]
fn block_devices_are_checked_like_files() {
    let mut fs = Fs::create();
    let lo = LoopDev::new(&fs.dir.join("lo.img"), 64 * MIB);
    chmod(Path::new(&lo.0), 0o644);
    let link = fs.dev("lo-link");
    std::os::unix::fs::symlink(&lo.0, &link).unwrap();
    let spec = format!("ssd:{}", lo.0);
    let out = cairn(&mkfs_args(&fs.pool, &["--device", &spec]));
    assert!(out.status.success(), "mkfs on {}\n{}", lo.0, describe(&out));
    assert!(
        stderr(&out).contains("WARNING") && stderr(&out).contains(&lo.0),
        "mkfs must warn that other users can read {}\n{}",
        lo.0,
        describe(&out)
    );
    let p2 = fs.dir.join("p2");
    let twice = format!("hdd:{link}");
    let err = cairn_fails(
        &mkfs_args(&p2, &["--force", "--device", &spec, "--device", &twice]),
        "one block device twice",
    );
    assert!(err.contains("same device"), "{err}");
    fs.mount();
    write_synced(&fs.p("f"), b"on a block device");
    let err = cairn_fails(
        &mkfs_args(&p2, &["--force", "--device", &twice]),
        "mkfs on a mounted pool's block device",
    );
    assert!(err.contains("in use"), "{err}");
    assert!(!p2.exists(), "failed mkfs left {}", p2.display());
    fs.remount();
    assert_eq!(fs::read(fs.p("f")).unwrap(), b"on a block device");
    fs.finish();
    drop(lo);
}

/// The second metadata copy goes beside a tier device that is not a block
/// device; with none, it goes beside the first copy and mkfs says that it
/// shares the first copy's disk and how to put it on another
/// (--meta-mirror), which then works (the copy beside the first is gone).
#[test]
fn the_metadata_mirror_avoids_block_devices() {
    let fs = Fs::create();
    let lo = LoopDev::new(&fs.dir.join("lo.img"), 64 * MIB);
    let dir = fs.dir.join("slow");
    fs::create_dir(&dir).unwrap();
    let (block, in_dir) = (
        format!("nvme:{}", lo.0),
        format!("hdd:{}:64M", dir.display()),
    );
    let out = cairn(&mkfs_args(
        &fs.pool,
        &["--device", &block, "--device", &in_dir, "--sparse"],
    ));
    assert!(out.status.success(), "{}", describe(&out));
    let target = fs::read_link(fs.pool.join("meta.mirror")).expect("a mirror");
    assert_eq!(target.parent(), Some(dir.as_path()));
    // The block device is the slower one: nowhere beside it for a file.
    let p2 = fs.dir.join("p2");
    let (fast, slow) = (
        format!("nvme:{}:64M", dir.display()),
        format!("hdd:{}", lo.0),
    );
    let out = cairn(&mkfs_args(
        &p2,
        &["--force", "--device", &fast, "--device", &slow, "--sparse"],
    ));
    assert!(out.status.success(), "{}", describe(&out));
    let err = stderr(&out);
    assert!(
        err.contains("same disk") && err.contains("--meta-mirror"),
        "{}",
        describe(&out)
    );
    let beside_first = fs::read_link(p2.join("meta.mirror")).expect("a mirror");
    assert_eq!(beside_first.parent(), Some(dir.as_path()));
    assert!(beside_first.exists());
    let other = fs.dir.join("other-disk");
    fs::create_dir(&other).unwrap();
    let rest = [
        "--force",
        "--device",
        &fast,
        "--device",
        &slow,
        "--sparse",
        "--meta-mirror",
    ];
    let mut args = mkfs_args(&p2, &rest);
    args.push(other.as_os_str());
    let out = cairn(&args);
    assert!(out.status.success(), "{}", describe(&out));
    let target = fs::read_link(p2.join("meta.mirror")).expect("a mirror");
    assert_eq!(target.parent(), Some(other.as_path()));
    assert!(target.exists());
    assert!(!beside_first.exists(), "--force left the old pool's mirror");
    let out = cairn(&[os("check"), p2.as_os_str()]);
    assert!(out.status.success(), "{}", describe(&out));
    drop(lo);
}

// ------------------------------------------------------------ items 6, 7

/// Every path of the pool (dir and files) has a private mode.
#[track_caller]
fn assert_private(pool: &Path, what: &str) {
    assert_eq!(mode(pool), 0o700, "{what}: pool directory mode");
    for e in fs::read_dir(pool).unwrap().flatten() {
        let p = e.path();
        let m = mode(&p);
        assert_eq!(m & 0o077, 0, "{what}: {} has mode {m:04o}", p.display());
    }
}

#[test]
fn pool_files_are_private_and_closed_to_other_users() {
    let mut fs = Fs::create();
    // The test's temp dir is 0700; open it so that only the pool's own
    // modes keep other users out.
    chmod(&fs.dir, 0o755);
    chmod(&fs.dir.join("devs"), 0o755);
    let outside = fs.dev("outside.img");
    File::create(&outside).unwrap().set_len(64 * MIB).unwrap();
    chmod(Path::new(&outside), 0o644);
    let inside = format!("ssd:{}:64M", fs.pool.join("data.0").display());
    let out = cairn(&mkfs_args(
        &fs.pool,
        &[
            "--device",
            &inside,
            "--device",
            &format!("hdd:{outside}:64M"),
        ],
    ));
    assert!(out.status.success(), "mkfs\n{}", describe(&out));
    assert!(
        stderr(&out).contains("WARNING") && stderr(&out).contains(&outside),
        "mkfs must warn that other users can read {outside}\n{}",
        describe(&out)
    );
    assert_private(&fs.pool, "after mkfs");
    fs.mount();
    write_synced(&fs.p("secret"), b"root's secret");
    cairn_ok(&[os("sync"), fs.mnt.as_os_str()]);
    assert!(fs.pool.join("control.sock").exists());
    assert_private(&fs.pool, "while mounted");
    let log = fs.diagnostics();
    assert!(
        log.contains(&outside),
        "the mount must log that {outside} is readable by others\n{log}"
    );
    fs.unmount();
    for f in [
        "superblock",
        "cairn.toml",
        "meta.redb",
        "data.0",
        "lock",
        "heat",
    ] {
        assert!(fs.pool.join(f).exists(), "{f} missing");
    }
    assert_private(&fs.pool, "after unmount");
    // A daemon-mode mount shows the warning too.
    let out = cairn(&[os("mount"), fs.pool.as_os_str(), fs.mnt.as_os_str()]);
    assert!(out.status.success(), "mount\n{}", describe(&out));
    let umounted = cairn_umount(&fs.mnt);
    assert!(
        stderr(&out).contains(&outside) && stderr(&out).contains("WARN"),
        "mount must warn that other users can read {outside}\n{}",
        describe(&out)
    );
    assert!(umounted.status.success(), "umount\n{}", describe(&umounted));
    let lock = fs.pool.join("lock");
    let data = fs.pool.join("data.0");
    let o = as_nobody("flock", &[os("-n"), os("-s"), lock.as_os_str(), os("true")]);
    assert!(
        !o.status.success() && stderr(&o).contains("Permission denied"),
        "user nobody could take the pool's lock\n{}",
        describe(&o)
    );
    let o = as_nobody("head", &[os("-c16"), data.as_os_str()]);
    assert!(
        !o.status.success() && stderr(&o).contains("Permission denied"),
        "user nobody could read the device file\n{}",
        describe(&o)
    );

    // Widened later: info and check say so (and opening tightens them).
    let widen = || {
        chmod(&fs.pool, 0o755);
        for f in ["data.0", "lock", "cairn.toml"] {
            chmod(&fs.pool.join(f), 0o644);
        }
    };
    widen();
    let j = info_json(&fs.pool);
    let warned = j["mode_warnings"].to_string();
    assert!(
        warned.contains("data.0") && warned.contains("lock"),
        "info --json mode_warnings: {warned}"
    );
    assert_private(&fs.pool, "after info tightened the modes");
    widen();
    let out = cairn_ok(&[os("check"), fs.pool.as_os_str()]);
    assert!(
        out.contains("WARNING") && out.contains("cairn.toml"),
        "check must warn about widened modes:\n{out}"
    );
    widen();
    fs.mount();
    assert_private(&fs.pool, "after mount tightened the modes");
    let log = fs.diagnostics();
    assert!(
        log.contains("tightened"),
        "mount must log the tightening\n{log}"
    );
    chmod(&data, 0o640);
    let shown = cairn_ok(&[os("info"), fs.mnt.as_os_str()]);
    assert!(
        shown.contains("WARNING") && shown.contains("data.0"),
        "info of a mounted pool must warn about a widened file:\n{shown}"
    );
    chmod(&data, 0o600);
    fs.finish();
}

// ------------------------------------------------------------ item 10

#[test]
fn truncated_device_is_refused_with_its_sizes() {
    let mut fs = Fs::create();
    let dev = fs.dev("t.dev");
    fs.mkfs(&["--device", &format!("ssd:{dev}:64M")]);
    fs.mount();
    let want = pattern(10, MIB as usize);
    write_synced(&fs.p("f"), &want);
    fs.unmount();
    File::options()
        .write(true)
        .open(&dev)
        .unwrap()
        .set_len(10 * MIB)
        .unwrap();
    let err = cairn_fails(
        &[os("check"), fs.pool.as_os_str()],
        "check of a truncated pool",
    );
    // 64 MiB asked: a 1 MiB header and 15 whole 4 MiB slots.
    for s in [dev.as_str(), "61.0 MiB", "10.0 MiB"] {
        assert!(err.contains(s), "check error must contain {s:?}: {err}");
    }
    let err = cairn_fails(
        &[os("mount"), fs.pool.as_os_str(), fs.mnt.as_os_str()],
        "mount of a truncated pool",
    );
    assert!(
        err.contains(&dev) && err.contains("truncated"),
        "mount error must name the truncated device: {err}"
    );
    assert!(mount_fstype(&fs.mnt).is_none(), "truncated pool mounted");
    File::options()
        .write(true)
        .open(&dev)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    fs.mount();
    assert_bytes_eq(&fs::read(fs.p("f")).unwrap(), &want, "after restoring");
    fs.finish();
}

// ------------------------------------------------------------ item 5

/// A small ext4 filesystem on a loop device, unmounted (lazily, as a
/// daemon may still hold files on it) when dropped.
struct LoopFs {
    mnt: PathBuf,
    _tmp: tempfile::TempDir,
}

impl LoopFs {
    fn new(mib: u64) -> LoopFs {
        let tmp = tempfile::Builder::new()
            .prefix("cairn-host-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        let img = dir.join("host.img");
        let mnt = dir.join("host");
        fs::create_dir(&mnt).unwrap();
        File::create(&img).unwrap().set_len(mib * MIB).unwrap();
        sh(
            &dir,
            &format!(
                "mkfs.ext4 -q -F -m 0 {0}\nmount -o loop {0} {1}",
                img.display(),
                mnt.display()
            ),
        );
        LoopFs { mnt, _tmp: tmp }
    }

    fn path(&self, name: &str) -> String {
        self.mnt.join(name).to_str().unwrap().to_string()
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// Sum of the sizes of the regular files under `dir` (recursive).
fn claimed(dir: &Path) -> u64 {
    let mut n = 0;
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let m = fs::symlink_metadata(e.path()).unwrap();
        if m.is_dir() {
            n += claimed(&e.path());
        } else if m.is_file() {
            n += m.len();
        }
    }
    n
}

#[test]
fn device_files_are_allocated_or_df_tells_the_truth() {
    let host = LoopFs::new(64);
    let mut fs = Fs::create();
    let total = {
        let st = statvfs(&host.mnt);
        st.f_blocks * st.f_frsize
    };
    // 1 GiB on a 64 MiB filesystem: refused, naming device, size and free.
    let p1 = fs.dir.join("p1");
    let d1 = host.path("d1");
    let err = cairn_fails(
        &mkfs_args(&p1, &["--device", &format!("ssd:{d1}:1G")]),
        "mkfs of 1 GiB on 64 MiB",
    );
    for s in [d1.as_str(), "1.0 GiB", "free"] {
        assert!(err.contains(s), "error must contain {s:?}: {err}");
    }
    assert!(!p1.exists() && !Path::new(&d1).exists(), "leftovers");

    // A fitting device is allocated for real.
    let p2 = fs.dir.join("p2");
    let d2 = host.path("d2");
    cairn_ok(&mkfs_args(&p2, &["--device", &format!("ssd:{d2}:24M")]));
    let m = fs::metadata(&d2).unwrap();
    assert!(
        m.blocks() * 512 >= 24 * MIB,
        "device file not allocated: {} of {} bytes",
        m.blocks() * 512,
        m.len()
    );

    // Two default pools on the host: together they claim no more than it has.
    let (pa, pb) = (host.mnt.join("pa"), host.mnt.join("pb"));
    let _ = cairn(&mkfs_args(&pa, &[]));
    let _ = cairn(&mkfs_args(&pb, &[]));
    assert!(
        claimed(&host.mnt) <= total,
        "pools on the host claim {} bytes, it has {total}",
        claimed(&host.mnt)
    );
    for p in [&pa, &pb] {
        if p.exists() {
            fs::remove_dir_all(p).unwrap();
        }
    }

    // Sparse on request, with a warning; then df shows the host's space.
    let d3 = host.path("d3");
    let out = cairn(&mkfs_args(
        &fs.pool,
        &["--sparse", "--device", &format!("ssd:{d3}:1G")],
    ));
    assert!(out.status.success(), "mkfs --sparse\n{}", describe(&out));
    assert!(
        stderr(&out).contains("WARNING") && stderr(&out).contains("sparse"),
        "mkfs --sparse must warn\n{}",
        describe(&out)
    );
    fs.mount();
    let (cairn_avail, host_avail) = (avail_bytes(&fs.mnt), avail_bytes(&host.mnt));
    assert!(
        cairn_avail <= host_avail + 4 * MIB,
        "df on the mount shows {cairn_avail} bytes available, the host has {host_avail}"
    );
    // device add: allocated too, and refused when the host lacks the space.
    let d4 = host.path("d4");
    let err = cairn_fails(
        &[
            os("device"),
            os("add"),
            fs.mnt.as_os_str(),
            os(&format!("hdd:{d4}:1G")),
        ],
        "device add of 1 GiB on a full host",
    );
    assert!(
        err.contains(&d4) && err.contains("free"),
        "device add error: {err}"
    );
    assert!(!Path::new(&d4).exists(), "refused device add left {d4}");
    fs.finish();
    drop(host);
}

// ------------------------------------------------------------ item 12

#[test]
fn snapshot_names_are_explained() {
    let fs = Fs::new();
    let long = "n".repeat(300);
    for bad in [
        "",
        "/",
        "..",
        ".",
        long.as_str(),
        "a/b",
        "x@@y",
        "a\nb",
        "t\tab",
    ] {
        let err = cairn_fails(
            &[os("snapshot"), os("create"), fs.mnt.as_os_str(), os(bad)],
            &format!("snapshot create {bad:?}"),
        );
        assert!(
            err.contains("invalid snapshot name") && err.contains("1 to 255 bytes"),
            "snapshot name {bad:?}: error must say what is wrong and allowed: {err}"
        );
    }
    let list = cairn_ok(&[os("snapshot"), os("list"), fs.mnt.as_os_str()]);
    assert_eq!(
        list.lines().count(),
        1,
        "a refused name was created:\n{list}"
    );
    // The daemon itself explains too (a client that skips the CLI checks).
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(fs.pool.join("control.sock")).unwrap();
    s.write_all(b"{\"op\":\"snapshot_create\",\"name\":\"a\\nb\",\"auto\":false}\n")
        .unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    assert!(
        line.contains("invalid snapshot name") && line.contains("control character"),
        "daemon answer: {line}"
    );
    fs.finish();
}

#[test]
fn undo_names_a_missing_snapshot() {
    let fs = Fs::new();
    write_synced(&fs.p("f"), b"v1");
    let f = fs.p("f");
    let err = cairn_fails(
        &[os("undo"), f.as_os_str(), os("--snapshot"), os("nosuch")],
        "undo from a missing snapshot",
    );
    assert!(err.contains("no such snapshot: nosuch"), "{err}");
    fs.finish();
}

#[test]
fn config_errors_name_file_key_and_problem() {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    let toml = fs.pool.join("cairn.toml");
    let good = fs::read_to_string(&toml).unwrap();
    fs.set_config("commit_interval_secs", "0");
    let err = cairn_fails(&[os("info"), fs.pool.as_os_str()], "info with a bad value");
    for s in [toml.to_str().unwrap(), "commit_interval_secs", "3600"] {
        assert!(err.contains(s), "error must contain {s:?}: {err}");
    }
    assert!(!err.contains("I/O error"), "{err}");
    fs::write(&toml, format!("{good}bogus_key = 1\n")).unwrap();
    let err = cairn_fails(
        &[os("mount"), fs.pool.as_os_str(), fs.mnt.as_os_str()],
        "mount with an unknown key",
    );
    for s in [toml.to_str().unwrap(), "bogus_key", "line"] {
        assert!(err.contains(s), "error must contain {s:?}: {err}");
    }
    assert!(!err.contains("I/O error"), "{err}");
    fs::write(&toml, good).unwrap();
    fs.mount();
    fs.finish();
}

#[test]
fn umount_by_another_user_says_why() {
    let fs = Fs::new();
    chmod(&fs.dir, 0o755);
    let o = as_nobody(CAIRN, &[os("umount"), fs.mnt.as_os_str()]);
    assert!(!o.status.success(), "nobody unmounted root's pool");
    let err = stderr(&o);
    assert!(
        err.contains("fusermount3") && err.contains("root or the user who mounted it"),
        "umount as nobody: {err}"
    );
    assert!(!err.contains("busy?"), "{err}");
    assert!(mount_fstype(&fs.mnt).is_some(), "mount gone");
    fs.finish();
}

#[test]
fn check_of_a_mount_point_names_the_pool() {
    let fs = Fs::new();
    let err = cairn_fails(&[os("check"), fs.mnt.as_os_str()], "check MNT");
    assert!(
        err.contains("mount point") && err.contains(fs.pool.to_str().unwrap()),
        "check MNT: {err}"
    );
    assert!(!err.contains("no superblock"), "{err}");
    fs.finish();
}

#[test]
fn tiny_device_sizes_give_the_minimum() {
    let fs = Fs::create();
    let dev = fs.dev("tiny");
    for size in ["0", "1K"] {
        let err = cairn_fails(
            &mkfs_args(&fs.pool, &["--device", &format!("ssd:{dev}:{size}")]),
            &format!("mkfs with a {size} device"),
        );
        assert!(
            err.contains("minimum is 17.0 MiB") && !err.contains("1048576 bytes"),
            "size {size}: {err}"
        );
        assert!(!fs.pool.exists(), "failed mkfs left the pool directory");
        assert!(
            !Path::new(&dev).exists(),
            "failed mkfs left the device file"
        );
    }
}

#[test]
fn failed_mkfs_removes_only_what_it_created() {
    let fs = Fs::create();
    let d0 = fs.dev("d0");
    let bad = fs.dir.join("no-such-dir").join("d1");
    let args = [
        "--device".to_string(),
        format!("ssd:{d0}:64M"),
        "--device".to_string(),
        format!("hdd:{}:64M", bad.display()),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cairn_fails(
        &mkfs_args(&fs.pool, &args),
        "mkfs with an impossible device",
    );
    assert!(!fs.pool.exists(), "failed mkfs left the pool directory");
    assert!(!Path::new(&d0).exists(), "failed mkfs left {d0}");
    // An existing directory and device file are kept, with their content.
    fs::create_dir(&fs.pool).unwrap();
    fs::write(fs.pool.join("notes.txt"), b"mine").unwrap();
    File::create(&d0).unwrap().set_len(64 * MIB).unwrap();
    cairn_fails(
        &mkfs_args(&fs.pool, &args),
        "mkfs with an impossible device",
    );
    let left: Vec<_> = fs::read_dir(&fs.pool)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["notes.txt"], "what the failed mkfs left in the pool");
    assert_eq!(fs::read(fs.pool.join("notes.txt")).unwrap(), b"mine");
    assert!(
        Path::new(&d0).exists(),
        "failed mkfs deleted an existing file"
    );
}

#[test]
fn mkfs_takes_relative_pool_and_device_paths() {
    // `cairn mkfs pool` from the directory that will hold it (the README's
    // way): a relative pool path has an empty parent, which once failed
    // with "I/O error: : No such file or directory".
    let dir = tempfile::tempdir().unwrap();
    for (pool, dev) in [("p1", "ssd:p1/d0:64M"), ("p2", "ssd:p2-dev:64M")] {
        let out = run_timeout(
            std::process::Command::new(common::CAIRN)
                .current_dir(dir.path())
                .args(["mkfs", pool, "--device", dev]),
            common::CMD_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "mkfs {pool} {dev}\n{}",
            describe(&out)
        );
        assert!(dir.path().join(pool).join("superblock").exists());
    }
}
