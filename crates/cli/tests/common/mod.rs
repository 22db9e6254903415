//! Shared harness for the Cairn integration tests: temporary pools, foreground
//! mounts as child processes, clean/dirty unmounts, command runners and small
//! helpers (errno checks, deterministic data, statvfs, seeds and environment
//! knobs of randomized tests, fsynced writes). Every `Fs` lives in its
//! own temp dir and its `Drop` always removes the mount, even when a test fails.
#![allow(dead_code)]

pub mod canary;
pub mod cgroup;
pub mod handles;
pub mod hist;
pub mod json;
pub mod redundancy;
pub mod s3;
pub mod tree_gen;

use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The binary under test.
pub const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");
/// How long a foreground mount may take to show up in mountinfo.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);
/// Upper bound for any single external command (cp, diff, tar, cairn check...).
pub const CMD_TIMEOUT: Duration = Duration::from_secs(600);

// ---------------------------------------------------------------- processes

/// Polls `child` until it exits or `timeout` passes.
pub fn wait_until(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return Some(st);
        }
        if t0.elapsed() > timeout {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` (stdin closed), capturing stdout/stderr through anonymous temp
/// files (not pipes: a daemonizing child may keep them open forever).
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let desc = format!("{cmd:?}");
    let mut out = tempfile::tempfile().expect("tempfile");
    let mut err = tempfile::tempfile().expect("tempfile");
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {desc}: {e}"));
    let Some(status) = wait_until(&mut child, timeout) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("timed out after {timeout:?}: {desc}");
    };
    Output {
        status,
        stdout: read_all(&mut out),
        stderr: read_all(&mut err),
    }
}

fn read_all(f: &mut File) -> Vec<u8> {
    let mut v = Vec::new();
    f.rewind().unwrap();
    f.read_to_end(&mut v).unwrap();
    v
}

/// Human-readable summary of a finished command, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        tail(&String::from_utf8_lossy(&out.stdout), 60),
        tail(&String::from_utf8_lossy(&out.stderr), 60)
    )
}

/// Last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs the cairn binary with `args`.
pub fn cairn<S: AsRef<OsStr>>(args: &[S]) -> Output {
    run_timeout(Command::new(CAIRN).args(args), CMD_TIMEOUT)
}

/// Runs the cairn binary and asserts success; returns stdout.
/// `cairn ARGS` with no terminal to type a passphrase at (a new session),
/// stdin closed.
pub fn cairn_no_tty(args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
    cmd.args(args).stdin(std::process::Stdio::null());
    // SAFETY: setsid is async-signal-safe; the child leaves our terminal.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    cmd.output().unwrap()
}

pub fn cairn_ok<S: AsRef<OsStr>>(args: &[S]) -> String {
    let out = cairn(args);
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
    assert!(
        out.status.success(),
        "cairn {shown:?} failed\n{}",
        describe(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cairn ARGS` that must fail: its stderr, which must contain `want`.
pub fn cairn_err(args: &[&str], want: &str) -> String {
    let o = cairn(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success(),
        "cairn {args:?} succeeded\n{}",
        describe(&o)
    );
    assert!(
        err.contains(want),
        "cairn {args:?}: want {want:?}\n{}",
        describe(&o)
    );
    err
}

/// Runs a bash script in `dir` (with `set -euxo pipefail`), asserts success and
/// returns stdout. On failure the script, stdout and stderr are shown.
pub fn sh(dir: &Path, script: &str) -> String {
    let out = sh_output(dir, script);
    assert!(
        out.status.success(),
        "shell command failed in {}:\n{script}\n{}",
        dir.display(),
        describe(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Like `sh` but returns the raw output without asserting.
pub fn sh_output(dir: &Path, script: &str) -> Output {
    let full = format!("set -euxo pipefail\n{script}");
    run_timeout(
        Command::new("bash").arg("-c").arg(full).current_dir(dir),
        CMD_TIMEOUT,
    )
}

// ------------------------------------------------------------------- mounts

/// fstype of the top-most mount at `mnt` according to /proc/self/mountinfo.
pub fn mount_fstype(mnt: &Path) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let want = mnt.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(sep) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        if f.len() > sep + 1 && unescape_mountinfo(f[4]) == want {
            found = Some(f[sep + 1].to_string());
        }
    }
    found
}

/// Undoes the octal escapes (`\040` for space...) used in mountinfo.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let (mut out, mut i) = (Vec::with_capacity(b.len()), 0);
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let oct = std::str::from_utf8(&b[i + 1..i + 4]).unwrap();
            out.push(u8::from_str_radix(oct, 8).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Waits until nothing is mounted at `mnt`; returns false on timeout.
pub fn wait_unmounted(mnt: &Path, timeout: Duration) -> bool {
    let t0 = Instant::now();
    while mount_fstype(mnt).is_some() {
        if t0.elapsed() > timeout {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
    true
}

/// `fusermount3 -u -z MNT`, falling back to `umount -l MNT`. Returns success.
pub fn lazy_unmount(mnt: &Path) -> bool {
    let quiet = |prog: &str, args: &[&str]| {
        Command::new(prog)
            .args(args)
            .arg(mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    quiet("fusermount3", &["-u", "-z"]) || quiet("umount", &["-l"])
}

/// `cairn umount MNT`, retried for up to 3 s while it fails: EBUSY can be
/// transient when a sibling test thread forks a child, which holds copies of
/// our (close-on-exec) fds on this mount until it execs. A real leak of
/// references still fails after the retries.
pub fn cairn_umount(mnt: &Path) -> Output {
    let mut out = cairn(&[OsStr::new("umount"), mnt.as_os_str()]);
    for _ in 0..15 {
        if out.status.success() {
            break;
        }
        thread::sleep(Duration::from_millis(200));
        out = cairn(&[OsStr::new("umount"), mnt.as_os_str()]);
    }
    out
}

/// Mount arguments for FUSE over io_uring, turning the kernel's switch on
/// (tests only: the switch is host-wide).
pub const OVER_IO_URING: [&str; 3] = ["--io-uring", "on", "--enable-uring-module"];

/// A pool plus mount point in a private temp dir, with the daemon as a child.
pub struct Fs {
    /// Private temp dir holding everything below.
    pub dir: PathBuf,
    pub pool: PathBuf,
    pub mnt: PathBuf,
    /// Extra arguments passed to every `cairn mount` (e.g.
    /// `OVER_IO_URING`).
    pub mount_args: Vec<String>,
    /// Extra environment variables of every `cairn mount`.
    pub mount_env: Vec<(String, PathBuf)>,
    /// A program (and its arguments) that runs `cairn mount ...` in its
    /// place, e.g. a shell that joins a cgroup and then execs it.
    pub mount_prefix: Vec<String>,
    child: Option<Child>,
    mounts: u32,
    tmp: Option<tempfile::TempDir>,
}

impl Fs {
    /// Temp dir with an empty mount point; no pool yet.
    pub fn create() -> Fs {
        let tmp = tempfile::Builder::new()
            .prefix("cairn-test-")
            .tempdir_in(std::env::temp_dir())
            .expect("create temp dir");
        let dir = tmp.path().canonicalize().unwrap();
        let (pool, mnt) = (dir.join("pool"), dir.join("mnt"));
        fs::create_dir(&mnt).unwrap();
        fs::create_dir(dir.join("devs")).unwrap();
        let mount_args = Vec::new();
        Fs {
            dir,
            pool,
            mnt,
            mount_args,
            mount_env: Vec::new(),
            mount_prefix: Vec::new(),
            child: None,
            mounts: 0,
            tmp: Some(tmp),
        }
    }

    /// Fresh pool (default mkfs) mounted in the foreground.
    pub fn new() -> Fs {
        Fs::with_mkfs(&[])
    }

    /// Fresh pool created with extra mkfs `args`, mounted.
    pub fn with_mkfs(args: &[&str]) -> Fs {
        let mut fs = Fs::create();
        fs.mkfs(args);
        fs.mount();
        fs
    }

    /// Path for a device file inside the private `devs/` directory.
    pub fn dev(&self, name: &str) -> String {
        self.dir
            .join("devs")
            .join(name)
            .to_str()
            .unwrap()
            .to_string()
    }

    /// `cairn mkfs POOL ARGS...`, asserting success. Without `--device`
    /// the default device (90% of the host's free space) is made sparse:
    /// tests share the host disk and must not reserve it.
    pub fn mkfs(&self, args: &[&str]) {
        let mut all: Vec<&OsStr> = vec!["mkfs".as_ref(), self.pool.as_os_str()];
        all.extend(args.iter().map(OsStr::new));
        if !args
            .iter()
            .any(|a| a.starts_with("--device") || *a == "--sparse")
        {
            all.push("--sparse".as_ref());
        }
        cairn_ok(&all);
    }

    /// Sets `key = value` in POOL/cairn.toml (`value` is a TOML literal,
    /// e.g. `false`, `1` or `"lz4"`), replacing the key's line or appending
    /// one. Takes effect at the next mount.
    pub fn set_config(&self, key: &str, value: &str) {
        let path = self.pool.join("cairn.toml");
        let text =
            fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let line = format!("{key} = {value}");
        let mut found = false;
        let mut out: Vec<String> = text
            .lines()
            .map(|l| {
                let k = l.split('=').next().unwrap_or("").trim();
                if k == key {
                    found = true;
                    line.clone()
                } else {
                    l.to_string()
                }
            })
            .collect();
        if !found {
            out.push(line);
        }
        fs::write(&path, out.join("\n") + "\n")
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// Path of `rel` inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn is_mounted(&self) -> bool {
        self.child.is_some()
    }

    /// Names of the foreground daemon's threads.
    pub fn daemon_threads(&self) -> Vec<String> {
        let pid = self.child.as_ref().expect("not mounted").id();
        let rd = fs::read_dir(format!("/proc/{pid}/task")).expect("daemon tasks");
        rd.flatten()
            .filter_map(|t| fs::read_to_string(t.path().join("comm")).ok())
            .map(|c| c.trim().to_string())
            .collect()
    }

    /// Name and scheduling policy (SCHED_OTHER 0, SCHED_FIFO 1, SCHED_IDLE
    /// 5, ...) of every thread of the foreground daemon.
    pub fn daemon_thread_policies(&self) -> Vec<(String, i32)> {
        let pid = self.child.as_ref().expect("not mounted").id();
        let rd = fs::read_dir(format!("/proc/{pid}/task")).expect("daemon tasks");
        rd.flatten()
            .filter_map(|t| {
                let comm = fs::read_to_string(t.path().join("comm")).ok()?;
                let stat = fs::read_to_string(t.path().join("stat")).ok()?;
                // Field 41 (policy), counted after the ")" that ends comm.
                let policy = stat.rsplit_once(')')?.1.split_whitespace().nth(38)?;
                Some((comm.trim().to_string(), policy.parse().ok()?))
            })
            .collect()
    }

    /// Process id of the foreground daemon.
    pub fn daemon_pid(&self) -> u32 {
        self.child.as_ref().expect("not mounted").id()
    }

    /// Pids of processes (other than us) whose command line mentions this
    /// pool: daemons started by this test, e.g. in daemon (non-foreground) mode.
    pub fn daemon_pids(&self) -> Vec<i32> {
        let needle = self.pool.as_os_str().as_bytes();
        let me = std::process::id() as i32;
        let Ok(rd) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| *pid != me)
            .filter(|pid| {
                let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cmd.windows(needle.len()).any(|w| w == needle)
            })
            .collect()
    }
}

impl Fs {
    /// Spawns `cairn mount POOL MNT --foreground` and waits for the mount.
    pub fn mount(&mut self) {
        assert!(self.child.is_none(), "mount(): already mounted");
        self.mounts += 1;
        let out = File::create(self.out_file()).unwrap();
        let mut cmd = match self.mount_prefix.split_first() {
            Some((prog, args)) => {
                let mut c = Command::new(prog);
                c.args(args).arg(CAIRN);
                c
            }
            None => Command::new(CAIRN),
        };
        let child = cmd
            .arg("mount")
            .arg(&self.pool)
            .arg(&self.mnt)
            .arg("--foreground")
            .args(&self.mount_args)
            .envs(self.mount_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn cairn mount");
        self.child = Some(child);
        self.wait_mounted();
    }

    fn out_file(&self) -> PathBuf {
        self.dir.join(format!("mount-{}.out", self.mounts))
    }

    /// What the current (or last) foreground daemon wrote: its log.
    pub fn daemon_output(&self) -> String {
        fs::read_to_string(self.out_file()).unwrap_or_default()
    }

    fn wait_mounted(&mut self) {
        let t0 = Instant::now();
        loop {
            let fstype = mount_fstype(&self.mnt);
            if matches!(fstype.as_deref(), Some("fuse.cairn") | Some("fuse")) {
                // The mount shows before the daemon has read the kernel's
                // INIT; a stat of the root waits for that handshake (an
                // unmount before it makes the daemon fail the handshake).
                if let Err(e) = fs::metadata(&self.mnt) {
                    panic!(
                        "{} mounted but its root cannot be read: {e}\n{}",
                        self.mnt.display(),
                        self.diagnostics()
                    );
                }
                return;
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "cairn mount exited ({st}) before mounting\n{}",
                    self.diagnostics()
                );
            }
            if t0.elapsed() > MOUNT_TIMEOUT {
                panic!(
                    "{} not mounted as fuse.cairn after {MOUNT_TIMEOUT:?} (fstype now {fstype:?})\n{}",
                    self.mnt.display(),
                    self.diagnostics()
                );
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// Tail of POOL/cairn.log and of the daemon's stdout/stderr.
    pub fn diagnostics(&self) -> String {
        let log =
            fs::read_to_string(self.pool.join("cairn.log")).unwrap_or_else(|e| format!("<{e}>"));
        let out = fs::read_to_string(self.out_file()).unwrap_or_else(|e| format!("<{e}>"));
        format!(
            "--- tail of {}/cairn.log ---\n{}\n--- daemon stdout/stderr ---\n{}",
            self.pool.display(),
            tail(&log, 40),
            tail(&out, 40)
        )
    }

    /// Waits for the daemon child to exit.
    fn wait_child(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let st = wait_until(self.child.as_mut().expect("not mounted"), timeout);
        if st.is_some() {
            self.child = None;
        }
        st
    }
}

impl Fs {
    /// `cairn umount MNT`; the foreground daemon must then exit with success.
    pub fn unmount(&mut self) {
        assert!(self.child.is_some(), "unmount(): not mounted");
        let out = cairn_umount(&self.mnt);
        assert!(
            out.status.success(),
            "cairn umount failed\n{}\n{}",
            describe(&out),
            self.diagnostics()
        );
        let Some(st) = self.wait_child(Duration::from_secs(30)) else {
            panic!(
                "daemon still running 30 s after cairn umount\n{}",
                self.diagnostics()
            );
        };
        assert!(
            st.success(),
            "daemon exited with {st} after umount\n{}",
            self.diagnostics()
        );
        assert!(
            wait_unmounted(&self.mnt, Duration::from_secs(5)),
            "still mounted after cairn umount"
        );
    }

    /// SIGKILL the daemon, then lazily unmount the dead mount.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("kill9(): not mounted");
        child.kill().expect("SIGKILL daemon");
        child.wait().expect("reap daemon");
        assert!(
            lazy_unmount(&self.mnt),
            "fusermount3 -u -z / umount -l failed"
        );
        assert!(
            wait_unmounted(&self.mnt, Duration::from_secs(10)),
            "still mounted after lazy unmount"
        );
    }

    /// Sends `sig` to the daemon (e.g. SIGTERM) without waiting.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = self.child.as_ref().expect("not mounted").id() as libc::pid_t;
        // SAFETY: kill takes plain integers and touches none of our memory.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    /// Waits for the daemon to exit by itself (after a signal); returns status.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match self.wait_child(timeout) {
            Some(st) => st,
            None => panic!(
                "daemon did not exit within {timeout:?}\n{}",
                self.diagnostics()
            ),
        }
    }

    /// Clean unmount followed by a new mount.
    pub fn remount(&mut self) {
        self.unmount();
        self.mount();
    }

    /// `cairn check POOL` on the unmounted pool; must succeed. Returns stdout.
    pub fn check(&self) -> String {
        assert!(self.child.is_none(), "check() needs an unmounted pool");
        let out = cairn(&[OsStr::new("check"), self.pool.as_os_str()]);
        assert!(
            out.status.success(),
            "cairn check reported problems\n{}\n{}",
            describe(&out),
            self.diagnostics()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Unmount and `cairn check`: the normal end of every test.
    pub fn finish(mut self) {
        self.unmount();
        self.check();
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!(
                "[cairn harness] test failed; pool at {}\n{}",
                self.pool.display(),
                self.diagnostics()
            );
        }
        if mount_fstype(&self.mnt).is_some() {
            lazy_unmount(&self.mnt);
        }
        if let Some(mut c) = self.child.take() {
            if wait_until(&mut c, Duration::from_secs(5)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        wait_unmounted(&self.mnt, Duration::from_secs(5));
        if !eventually(Duration::from_secs(5), || self.daemon_pids().is_empty()) {
            for pid in self.daemon_pids() {
                // SAFETY: kill takes plain integers and touches none of our memory.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if std::env::var_os("CAIRN_KEEP").is_some() {
            if let Some(t) = self.tmp.take() {
                eprintln!("[cairn harness] keeping {}", t.keep().display());
            }
        }
    }
}

// ------------------------------------------------------------------ helpers

/// Where the segment slots of the device file at `dev` start (its header's
/// data offset, docs/FORMAT.md): data stored in the pool lies past it, a
/// copy of the intent log (which holds fsync'd bytes too) before it.
pub fn data_offset(dev: &Path) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 8];
    let f = File::open(dev).unwrap_or_else(|e| panic!("{}: {e}", dev.display()));
    f.read_exact_at(&mut b, 56).unwrap();
    u64::from_le_bytes(b)
}

/// The errno of a failed call; panics (with `what`) if it succeeded.
pub fn errno_of<T: std::fmt::Debug>(r: io::Result<T>, what: &str) -> i32 {
    match r {
        Ok(v) => panic!("{what}: expected an error, got Ok({v:?})"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("{what}: non-OS error {e}")),
    }
}

/// Asserts that `r` failed with exactly `want`.
#[track_caller]
pub fn expect_errno<T: std::fmt::Debug>(r: io::Result<T>, want: i32, what: &str) {
    let got = errno_of(r, what);
    assert_eq!(
        got,
        want,
        "{what}: expected {}, got {}",
        io::Error::from_raw_os_error(want),
        io::Error::from_raw_os_error(got)
    );
}

/// setxattr(2) of `name` = `val` on `p` (no flags).
pub fn setxattr(p: &Path, name: &str, val: &[u8]) -> io::Result<()> {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: c and n are NUL-terminated strings, and val is a live buffer
    // of the length passed.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), val.as_ptr().cast(), val.len(), 0) };
    cvt(r as libc::c_long).map(drop)
}

/// getxattr(2) of `name` on `p`: its value (up to 4 KiB).
pub fn getxattr_raw(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    let len = cvt(
        // SAFETY: c and n are NUL-terminated strings, and buf is a live, writable buffer of
        // the length passed.
        unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }
            as libc::c_long,
    )?;
    buf.truncate(len as usize);
    Ok(buf)
}

/// Converts a libc return value (-1 = error) into an io::Result.
pub fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path with NUL")
}

/// Deterministic pseudo-random bytes (splitmix64) for content checks.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// statvfs(2) of `p`.
pub fn statvfs(p: &Path) -> libc::statvfs {
    let c = cpath(p);
    // SAFETY: statvfs is a plain C struct of integers, for which all zero bytes are a valid
    // value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a NUL-terminated path and st a valid, exclusively borrowed out pointer.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(
        r,
        0,
        "statvfs {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
    st
}

/// Bytes in use according to statvfs.
pub fn used_bytes(p: &Path) -> u64 {
    let st = statvfs(p);
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

/// Bytes available to unprivileged users according to statvfs.
pub fn avail_bytes(p: &Path) -> u64 {
    let st = statvfs(p);
    st.f_bavail * st.f_frsize
}

/// Polls `cond` every 200 ms for up to `timeout`; returns whether it held.
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if t0.elapsed() > timeout {
            return false;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// First index where `a` and `b` differ (or the shorter length).
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    Some(
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len())),
    )
}

/// Asserts equal byte contents with a compact message (no giant dumps).
#[track_caller]
pub fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = first_diff(got, want) {
        panic!(
            "{what}: contents differ at byte {i} (len got {} want {}); got {:02x?} want {:02x?}",
            got.len(),
            want.len(),
            &got[i.min(got.len())..(i + 16).min(got.len())],
            &want[i.min(want.len())..(i + 16).min(want.len())]
        );
    }
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("a bound socket's address").port()
}

/// The seed of a randomized test: CAIRN_SEED, or else the clock.
pub fn seed() -> u64 {
    match std::env::var("CAIRN_SEED") {
        Ok(s) => s.parse().expect("CAIRN_SEED must be a u64"),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

/// The integer in environment variable `name`, or `default` when unset.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be an integer"))
    })
}

/// `s` as an `&OsStr`, for mixed argument lists.
pub fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Creates (truncating) `p` with `data` and fsyncs it.
pub fn write_synced(p: &Path, data: &[u8]) {
    let mut f = File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    f.sync_all()
        .unwrap_or_else(|e| panic!("fsync {}: {e}", p.display()));
}

/// Reads up to `len` bytes at `off` (fewer only at the end of the file).
pub fn read_full_at(f: &std::fs::File, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    let mut n = 0;
    while n < len {
        match f.read_at(&mut buf[n..], off + n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    buf.truncate(n);
    Ok(buf)
}

// ---------------------------------------------------------------- fault plans

impl Fs {
    /// Mounts with an empty fault plan (`CAIRN_FAULT_PLAN`, see
    /// cairn_devices::backend::plan); returns the plan's path.
    pub fn mount_with_fault_plan(&mut self) -> PathBuf {
        let plan = self.dir.join("faults.plan");
        fs::write(&plan, "").unwrap();
        self.mount_env
            .push(("CAIRN_FAULT_PLAN".into(), plan.clone()));
        self.mount();
        assert!(
            self.daemon_output().contains("FAULT INJECTION"),
            "the daemon did not take the plan\n{}",
            self.diagnostics()
        );
        plan
    }

    /// Rewrites the fault plan and waits until the daemon applied it.
    pub fn set_fault_plan(&self, plan: &Path, text: &str) {
        let applied = |fs: &Fs| fs.daemon_output().matches("fault plan applied").count();
        let before = applied(self);
        fs::write(plan, text).unwrap();
        assert!(
            eventually(Duration::from_secs(10), || applied(self) > before),
            "plan not applied\n{}",
            self.diagnostics()
        );
    }
}
