//! Safety of the FUSE frontend and the daemon (issue 13): sparse files
//! (st_blocks, SEEK_DATA/SEEK_HOLE), copy_file_range as a clone, paths
//! outside any Cairn mount, mounting over a mount and failed daemons, the
//! mount's type and inode counts, and a full host filesystem under the log.

mod common;

use common::*;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const GIB: u64 = 1 << 30;
const REC: u64 = 64 << 10;

// ------------------------------------------------------------------ helpers

/// lseek(fd, off, whence): Ok(offset) or Err(errno).
fn seek(f: &File, off: u64, whence: i32) -> Result<u64, i32> {
    // SAFETY: lseek on an fd we own.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r as u64)
    }
}

fn data_at(f: &File, off: u64) -> Result<u64, i32> {
    seek(f, off, libc::SEEK_DATA)
}

fn hole_at(f: &File, off: u64) -> Result<u64, i32> {
    seek(f, off, libc::SEEK_HOLE)
}

/// copy_file_range of the whole `len` (looping over short copies).
fn copy_range(src: &File, soff: u64, dst: &File, doff: u64, len: u64) -> u64 {
    let (mut so, mut d, mut done) = (soff as i64, doff as i64, 0u64);
    while done < len {
        // SAFETY: valid fds and offset pointers.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut so,
                dst.as_raw_fd(),
                &mut d,
                (len - done) as usize,
                0,
            )
        };
        assert!(
            n >= 0,
            "copy_file_range: {}",
            std::io::Error::last_os_error()
        );
        if n == 0 {
            break;
        }
        done += n as u64;
    }
    done
}

fn blocks(p: &Path) -> u64 {
    fs::metadata(p).unwrap().blocks()
}

fn rw(p: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .unwrap()
}

/// Runs `cairn ARGS` and returns (exit code, stdout, stderr).
fn cairn_rc(args: &[&OsStr]) -> (i32, String, String) {
    let out = cairn(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Mount points equal to `mnt` in /proc/self/mountinfo.
fn mounts_at(mnt: &Path) -> usize {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = mnt.to_str().unwrap();
    info.lines()
        .filter(|l| l.split(' ').nth(4) == Some(want))
        .count()
}

/// (type, source) of the mount at `mnt`.
fn mount_entry(mnt: &Path) -> Option<(String, String)> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = mnt.to_str().unwrap();
    info.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (left.split(' ').nth(4)? == want).then(|| {
            let mut r = right.split(' ');
            (r.next().unwrap().to_string(), r.next().unwrap().to_string())
        })
    })
}

// ------------------------------------------------------------ sparse files

#[test]
fn sparse_file_blocks_and_seek_data_hole() {
    let fs = Fs::new();
    let p = fs.p("sparse");
    let f = rw(&p);
    f.set_len(10 * GIB).unwrap();
    let mid = 5 * GIB;
    f.write_at_all(b"x", mid);
    drop(f);
    // Written and closed: in the daemon's buffer, not committed yet.
    let f = File::open(&p).unwrap();
    let check = |f: &File, when: &str| {
        assert!(
            blocks(&p) <= 2 * REC / 512,
            "{when}: st_blocks {} of a 10 GiB file with one byte",
            blocks(&p)
        );
        assert_eq!(data_at(f, 0), Ok(mid), "{when}: SEEK_DATA from 0");
        assert_eq!(data_at(f, mid), Ok(mid), "{when}: SEEK_DATA at the data");
        assert_eq!(hole_at(f, 0), Ok(0), "{when}: SEEK_HOLE from 0");
        assert_eq!(
            hole_at(f, mid),
            Ok(mid + REC),
            "{when}: SEEK_HOLE after data"
        );
        assert_eq!(
            data_at(f, mid + REC),
            Err(libc::ENXIO),
            "{when}: no data after"
        );
        assert_eq!(
            hole_at(f, 10 * GIB - 1),
            Ok(10 * GIB - 1),
            "{when}: hole at end"
        );
        assert_eq!(data_at(f, 10 * GIB), Err(libc::ENXIO), "{when}: at EOF");
        assert_eq!(hole_at(f, 11 * GIB), Err(libc::ENXIO), "{when}: past EOF");
    };
    check(&f, "buffered");
    f.sync_all().unwrap();
    check(&f, "committed");
    drop(f);
    let du = sh(&fs.mnt, "du -k sparse | cut -f1");
    assert!(du.trim().parse::<u64>().unwrap() <= 128, "du -k says {du}");

    // A dense file with a punched hole in the middle.
    let d = fs.p("dense");
    let data = pattern(1, 16 * REC as usize);
    write_synced(&d, &data);
    let full = blocks(&d);
    assert!(
        (16 * REC / 512..=17 * REC / 512).contains(&full),
        "dense st_blocks {full}"
    );
    let f = rw(&d);
    // SAFETY: fallocate on an fd we own.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            (4 * REC) as i64,
            (2 * REC) as i64,
        )
    };
    assert_eq!(r, 0, "punch hole: {}", std::io::Error::last_os_error());
    assert_eq!(hole_at(&f, 0), Ok(4 * REC), "hole of the punched range");
    assert_eq!(data_at(&f, 4 * REC), Ok(6 * REC), "data after the punch");
    assert_eq!(
        hole_at(&f, 6 * REC),
        Ok(16 * REC),
        "the end is the next hole"
    );
    f.sync_all().unwrap();
    assert_eq!(hole_at(&f, 0), Ok(4 * REC), "committed punch");
    let after = blocks(&d);
    assert!(
        after + 2 * REC / 512 <= full,
        "punch freed no blocks: {full} -> {after}"
    );
    drop(f);
    fs.finish();
}

/// `pwrite` at an offset, whole buffer.
trait WriteAt {
    fn write_at_all(&self, b: &[u8], off: u64);
}

impl WriteAt for File {
    fn write_at_all(&self, b: &[u8], off: u64) {
        std::os::unix::fs::FileExt::write_all_at(self, b, off).unwrap();
    }
}

// ------------------------------------------------------------------ clones

#[test]
fn copy_file_range_clones_without_space() {
    // Without dedup, only a clone can make a copy take no space.
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    fs.set_config("dedup", "false");
    fs.mount();
    let size = 24 * REC as usize + 1000;
    let data = pattern(7, size);
    let src = fs.p("src");
    write_synced(&src, &data);
    // Target that exists before the clone, kept by a snapshot.
    let old = pattern(8, 3 * REC as usize);
    write_synced(&fs.p("dst"), &old);
    cairn_ok(&[
        os("snapshot"),
        os("create"),
        fs.mnt.as_os_str(),
        os("before"),
    ]);
    cairn_ok(&[os("sync"), fs.mnt.as_os_str()]);
    let used0 = used_bytes(&fs.mnt);

    let (s, d) = (File::open(&src).unwrap(), rw(&fs.p("dst")));
    assert_eq!(copy_range(&s, 0, &d, 0, size as u64), size as u64);
    drop(d);
    assert_bytes_eq(&fs::read(fs.p("dst")).unwrap(), &data, "cloned file");
    // Plain cp uses copy_file_range too.
    let t0 = std::time::Instant::now();
    sh(
        &fs.mnt,
        "cp src copy && cp --reflink=auto src copy2 && sync",
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
    for n in ["copy", "copy2"] {
        assert_bytes_eq(&fs::read(fs.p(n)).unwrap(), &data, n);
    }
    cairn_ok(&[os("sync"), fs.mnt.as_os_str()]);
    let grew = used_bytes(&fs.mnt).saturating_sub(used0);
    assert!(
        grew < size as u64 / 4,
        "three copies of {size} bytes took {grew} bytes of the pool"
    );
    assert!(
        blocks(&fs.p("copy")) >= size as u64 / 512,
        "st_blocks of a clone"
    );

    // Unaligned ranges: partial blocks copied, whole ones cloned.
    let u = rw(&fs.p("unaligned"));
    assert_eq!(copy_range(&s, 100, &u, 100, 5 * REC), 5 * REC);
    assert_eq!(copy_range(&s, 3, &u, 9 * REC + 7, 3 * REC), 3 * REC);
    drop(u);
    let got = fs::read(fs.p("unaligned")).unwrap();
    assert_bytes_eq(
        &got[100..100 + 5 * REC as usize],
        &data[100..100 + 5 * REC as usize],
        "aligned-mod clone",
    );
    let at = 9 * REC as usize + 7;
    assert_bytes_eq(
        &got[at..at + 3 * REC as usize],
        &data[3..3 + 3 * REC as usize],
        "misaligned copy",
    );
    assert!(got[..100].iter().all(|&b| b == 0));
    drop(s);

    // The snapshot still has the old target; after deleting the source and
    // pruning all history, the clones still read right.
    let snap = fs.mnt.join(".snapshots/before/dst");
    assert_bytes_eq(
        &fs::read(&snap).unwrap(),
        &old,
        "snapshot of the old target",
    );
    fs::remove_file(&src).unwrap();
    cairn_ok(&[
        os("prune"),
        fs.mnt.as_os_str(),
        os("--keep-history"),
        os("0s"),
    ]);
    for n in ["dst", "copy", "copy2"] {
        assert_bytes_eq(&fs::read(fs.p(n)).unwrap(), &data, n);
    }
    fs.remount();
    assert_bytes_eq(
        &fs::read(fs.p("copy")).unwrap(),
        &data,
        "copy after remount",
    );
    assert_bytes_eq(&fs::read(&snap).unwrap(), &old, "snapshot after remount");
    fs.finish();
}

// ------------------------------------------------------- paths and mounts

#[test]
fn paths_outside_a_cairn_mount_are_refused() {
    let fs = Fs::new();
    write_synced(&fs.p("inside"), b"in");
    let outside = fs.dir.join("outside");
    fs::write(&outside, b"out").unwrap();
    let pool = fs.pool.as_os_str();
    for args in [
        vec![os("history"), outside.as_os_str()],
        vec![os("history"), pool],
        vec![os("undo"), outside.as_os_str(), os("--tid"), os("1")],
        vec![os("sync"), fs.dir.as_os_str()],
        vec![os("snapshot"), os("list"), outside.as_os_str()],
    ] {
        let (rc, out, err) = cairn_rc(&args);
        assert_eq!(rc, 2, "{args:?} exit {rc}\nstdout {out}\nstderr {err}");
        assert!(
            err.contains("not inside a Cairn mount") || err.contains("inside a Cairn mount"),
            "{args:?}: {err}"
        );
        assert!(out.is_empty(), "{args:?} printed {out}");
    }
    let h = cairn_ok(&[os("history"), fs.p("inside").as_os_str()]);
    assert!(h.contains("(current)"), "{h}");
    fs.finish();
}

#[test]
fn mount_over_a_mount_and_failed_daemons_are_errors() {
    let fs = Fs::new();
    let other = Fs::create();
    other.mkfs(&[]);
    // The pool again on its own mount, and another pool over it.
    for pool in [&fs.pool, &other.pool] {
        let (rc, out, err) = cairn_rc(&[os("mount"), pool.as_os_str(), fs.mnt.as_os_str()]);
        assert_ne!(rc, 0, "mount over a mount succeeded: {out}");
        assert!(err.contains("already a mount point"), "{err}");
        assert!(!out.contains("mounted"), "{out}");
        assert_eq!(
            mounts_at(&fs.mnt),
            1,
            "a second mount stacked on {:?}",
            fs.mnt
        );
    }
    // The pool in use, on a fresh mount point.
    let (rc, _, err) = cairn_rc(&[os("mount"), fs.pool.as_os_str(), other.mnt.as_os_str()]);
    assert_ne!(rc, 0);
    assert!(err.contains("in use"), "{err}");
    assert_eq!(mounts_at(&other.mnt), 0);

    // A daemon that fails after the spawn: its real error, not old log lines.
    fs::write(other.pool.join("cairn.log"), "OLD LINE FROM BEFORE\n").unwrap();
    let (rc, out, err) = cairn_rc(&[
        os("mount"),
        other.pool.as_os_str(),
        other.mnt.as_os_str(),
        os("--commit-interval"),
        os("0"),
    ]);
    assert_ne!(rc, 0, "failed daemon reported as mounted: {out}");
    assert!(err.contains("commit_interval"), "{err}");
    assert!(!err.contains("OLD LINE"), "{err}");
    assert_eq!(mounts_at(&other.mnt), 0);

    // A good daemon mount: exit 0, mounted, answering.
    let (rc, out, err) = cairn_rc(&[os("mount"), other.pool.as_os_str(), other.mnt.as_os_str()]);
    assert_eq!(rc, 0, "{out}\n{err}");
    assert!(out.contains("mounted"), "{out}");
    assert_eq!(mounts_at(&other.mnt), 1);
    fs::write(other.mnt.join("f"), b"ok").unwrap();
    let out = cairn_umount(&other.mnt);
    assert!(out.status.success(), "{}", describe(&out));
    fs.finish();
}

#[test]
fn mount_type_inode_counts_and_quiet_unmount() {
    let mut fs = Fs::new();
    let (fstype, source) = mount_entry(&fs.mnt).expect("mounted");
    assert_eq!(fstype, "fuse.cairn");
    assert_eq!(Path::new(&source), fs.pool);
    for i in 0..10 {
        fs::write(fs.p(&format!("f{i}")), b"x").unwrap();
    }
    fs::create_dir(fs.p("d")).unwrap();
    fs::remove_file(fs.p("f0")).unwrap();
    let used = |fs: &Fs| {
        let st = statvfs(&fs.mnt);
        assert!(st.f_files < u32::MAX as u64 - 1, "f_files {}", st.f_files);
        assert!(st.f_ffree > 1000, "f_ffree {}", st.f_ffree);
        st.f_files - st.f_ffree
    };
    // root + 9 files + 1 dir
    assert!(
        eventually(Duration::from_secs(5), || used(&fs) == 11),
        "used inodes {}",
        used(&fs)
    );
    cairn_ok(&[os("sync"), fs.mnt.as_os_str()]);
    fs.remount();
    assert!(
        eventually(Duration::from_secs(5), || used(&fs) == 11),
        "after remount {}",
        used(&fs)
    );
    // Unimplemented operations are not warnings; unmount does not warn.
    let _ = Command::new("getfacl").arg(fs.p("f1")).output();
    fs.unmount();
    let out = fs::read_to_string(fs.dir.join("mount-2.out")).unwrap();
    assert!(!out.contains("Unmount failed"), "{out}");
    assert!(!out.contains("WARN"), "{out}");
    fs.check();
}

// ------------------------------------------------- a full host filesystem

/// Runs `f` on a thread and panics if it does not finish within `t` (a
/// hung mount); the harness's drop then kills the daemon, which frees it.
fn within(t: Duration, what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    if let Err(e) = rx.recv_timeout(t) {
        panic!("{what}: not done within {t:?} ({e}): the mount hangs or failed");
    }
}

/// A small ext4 image mounted on a loop device; unmounted on drop.
struct LoopFs {
    dir: PathBuf,
    img: PathBuf,
}

impl LoopFs {
    fn new(parent: &Path, mib: u64) -> LoopFs {
        let (dir, img) = (parent.join("small"), parent.join("small.img"));
        fs::create_dir_all(&dir).unwrap();
        File::create(&img).unwrap().set_len(mib << 20).unwrap();
        sh(parent, &format!("mkfs.ext4 -q -m 0 {}", img.display()));
        let l = LoopFs { dir, img };
        sh(
            parent,
            &format!("mount -o loop {} {}", l.img.display(), l.dir.display()),
        );
        l
    }

    /// Fills it with a filler file until ENOSPC.
    fn fill(&self) {
        let mut f = File::create(self.dir.join("filler")).unwrap();
        let buf = vec![1u8; 1 << 16];
        while f.write_all(&buf).is_ok() {}
        let small = [1u8; 512];
        while f.write_all(&small).is_ok() {}
        while f.write_all(&small[..1]).is_ok() {}
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = fs::remove_file(&self.img);
    }
}

#[test]
fn full_log_filesystem_does_not_stop_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let small = LoopFs::new(tmp.path(), 16);
    let mut fs = Fs::create();
    fs.pool = small.dir.join("pool");
    let devdir = fs.dir.join("devs/dir");
    fs::create_dir_all(&devdir).unwrap();
    let spec = format!("ssd:{}:256M", devdir.display());
    fs.mkfs(&["--device", &spec]);
    // Daemon mode: the daemon's log is POOL/cairn.log on the small fs.
    let mnt = fs.mnt.clone();
    let out = run_timeout(
        Command::new(CAIRN).env("CAIRN_LOG", "debug").args([
            os("mount"),
            fs.pool.as_os_str(),
            mnt.as_os_str(),
        ]),
        CMD_TIMEOUT,
    );
    assert!(out.status.success(), "{}", describe(&out));
    write_synced(&fs.p("before"), b"before");
    small.fill();
    // Debug logging writes a line per request: plenty of failed writes.
    // (Before the fix a serving thread panicked in tracing and its queue
    // hung, or the daemon aborted: bounded by a watchdog.)
    let m = mnt.clone();
    within(
        Duration::from_secs(120),
        "requests with the log full",
        move || {
            for i in 0..30u64 {
                let _ = fs::read_dir(&m).unwrap().count();
                fs::write(m.join(format!("n{i}")), pattern(i, 5000)).unwrap();
                let out = run_timeout(
                    Command::new(CAIRN).args([os("sync"), m.as_os_str()]),
                    Duration::from_secs(60),
                );
                assert!(out.status.success(), "{}", describe(&out));
            }
        },
    );
    assert!(
        !fs.daemon_pids().is_empty(),
        "the daemon died with its log full"
    );
    let data = pattern(99, 300_000);
    let (p, d) = (fs.p("during"), data.clone());
    within(
        Duration::from_secs(60),
        "fsynced write with the log full",
        move || {
            write_synced(&p, &d);
            assert_bytes_eq(&fs::read(&p).unwrap(), &d, "read while full");
        },
    );
    let info = cairn_ok(&[os("info"), mnt.as_os_str(), os("--json")]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert!(
        v["log_lines_dropped"].as_u64().unwrap_or(0) > 0,
        "no dropped log lines counted: {}",
        v["log_lines_dropped"]
    );
    fs::remove_file(small.dir.join("filler")).unwrap();
    cairn_ok(&[os("sync"), mnt.as_os_str()]);
    let log = fs::read_to_string(fs.pool.join("cairn.log")).unwrap();
    assert!(
        log.contains("log line(s) dropped"),
        "no note of the dropped lines"
    );
    let out = cairn_umount(&mnt);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(wait_unmounted(&mnt, Duration::from_secs(10)));
    fs.mount();
    assert_bytes_eq(&fs::read(fs.p("during")).unwrap(), &data, "after remount");
    assert_eq!(fs::read(fs.p("before")).unwrap(), b"before");
    fs.finish();
    drop(small);
}
