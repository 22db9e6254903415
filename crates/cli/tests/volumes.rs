//! Block volumes from the command line and over NBD, end to end: `cairn
//! volume ...` on unmounted and mounted pools, the mount daemon serving
//! NBD on a Unix socket and on TCP to real clients (nbdinfo, nbdcopy,
//! qemu-img, qemu-io, nbdfuse with ext4 on a loop device), `cairn nbd
//! serve`, refusals, and durability of flushed writes across unmount and
//! kill -9. The client tools must be installed (scripts/deps.sh test): a
//! missing one fails the test naming its Debian package.

mod common;
#[path = "../../nbd/tests/common/mod.rs"]
mod nbdc;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// The Debian package of each client tool.
fn package(tool: &str) -> &'static str {
    match tool {
        "nbdinfo" | "nbdcopy" | "nbdfuse" => "libnbd-bin",
        "qemu-img" | "qemu-io" => "qemu-utils",
        "mkfs.ext4" | "fsck.ext4" => "e2fsprogs",
        _ => "util-linux",
    }
}

/// Fails, naming its Debian package, unless `name` is on the PATH.
fn require(name: &str) {
    let path = std::env::var("PATH").unwrap_or_default() + ":/usr/sbin:/sbin";
    if !path.split(':').any(|d| Path::new(d).join(name).exists()) {
        panic!(
            "{name} is not installed: install the Debian package {} (scripts/deps.sh test)",
            package(name)
        );
    }
}

/// Runs a client tool (which must be installed).
fn tool(name: &str, args: &[&str]) -> Output {
    require(name);
    run_timeout(Command::new(name).args(args), Duration::from_secs(300))
}

fn tool_ok(name: &str, args: &[&str]) -> String {
    let o = tool(name, args);
    assert!(
        o.status.success(),
        "{name} {args:?} failed\n{}",
        describe(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn unix_uri(sock: &Path, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", sock.display())
}

fn sha256(p: &Path) -> String {
    let out = tool_ok("sha256sum", &[p.to_str().unwrap()]);
    out.split_whitespace().next().unwrap().to_string()
}

/// A file of `len` pseudo-random bytes (seeded per run).
fn random_file(p: &Path, len: u64, salt: u64) {
    std::fs::write(p, pattern(seed() ^ salt, len as usize)).unwrap();
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&cairn_ok(args)).expect("JSON output")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A pool mounted with `--nbd-socket DIR/nbd.sock` and `--nbd 127.0.0.1:0
/// --nbd-insecure` (plain TCP; TLS is tested in nbd_hostile.rs).
fn nbd_pool(tcp: bool) -> (Fs, PathBuf) {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    let sock = fs.dir.join("nbd.sock");
    fs.mount_args = vec!["--nbd-socket".into(), s(&sock).into()];
    if tcp {
        let tcp = ["--nbd", "127.0.0.1:0", "--nbd-insecure"];
        fs.mount_args.extend(tcp.map(String::from));
    }
    fs.mount();
    (fs, sock)
}

/// The TCP address the daemon's NBD server listens on (from `info`).
fn tcp_address(target: &Path) -> String {
    let v = json(&["info", s(target), "--json"]);
    let list = v["nbd"].as_array().expect("nbd served").clone();
    let mut a = list.iter().filter_map(|x| x["address"].as_str());
    a.find(|a| !a.starts_with("unix:"))
        .expect("a TCP server")
        .to_string()
}

// ------------------------------------------------------------ commands

/// Every volume command on `target` (a pool directory or mount point),
/// names prefixed with `p`: results, and refusals with clear messages.
fn volume_commands(target: &Path, p: &str) {
    let t = s(target);
    let (a, b) = (format!("{p}-a"), format!("{p}-b"));
    let v = json(&[
        "volume",
        "create",
        t,
        &a,
        "64M",
        "--block-size",
        "16K",
        "--json",
    ]);
    assert_eq!(
        (v["size"].as_u64(), v["block_size"].as_u64()),
        (Some(64 * MIB), Some(16384))
    );
    cairn_err(&["volume", "create", t, &a, "64M"], "already exists");
    cairn_err(&["volume", "create", t, "x", "12Q"], "size suffix");
    cairn_err(
        &["volume", "create", t, "x", "1000"],
        "multiple of the block size",
    );
    cairn_err(&["volume", "create", t, "x", "0"], "nonzero");
    cairn_err(&["volume", "create", t, "a/b", "1M"], "invalid volume");
    cairn_err(
        &["volume", "create", t, ".x", "1M"],
        "must start with a letter",
    );
    cairn_err(
        &["volume", "create", t, "x", "1M", "--block-size", "8K"],
        "4K, 16K, 64K",
    );
    let list = json(&["volume", "list", t, "--json"]);
    let mine: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["name"] == a.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{list}");
    assert!(cairn_ok(&["volume", "list", t]).contains(&a));
    let v = json(&["volume", "snapshot", t, &a, "s1", "--json"]);
    assert_eq!(v["export"], format!("{a}@s1").as_str());
    cairn_err(&["volume", "snapshot", t, &a, "bad@name"], "invalid");
    cairn_err(&["volume", "snapshot", t, "nosuch", "s"], "no volume named");
    let v = json(&["volume", "resize", t, &a, "128M", "--json"]);
    assert_eq!(v["size"].as_u64(), Some(128 * MIB));
    cairn_err(&["volume", "resize", t, &a, "32M"], "--shrink");
    let v = json(&["volume", "resize", t, &a, "32M", "--shrink", "--json"]);
    assert_eq!(v["size"].as_u64(), Some(32 * MIB));
    let v = json(&["volume", "rollback", t, &a, "s1", "--json"]);
    assert_eq!(v["size"].as_u64(), Some(64 * MIB));
    cairn_err(&["volume", "clone", t, &a, &b], "NAME@SNAP");
    cairn_err(
        &["volume", "clone", t, &format!("{a}@nope"), &b],
        "no snapshot named",
    );
    let v = json(&["volume", "clone", t, &format!("{a}@s1"), &b, "--json"]);
    assert_eq!(
        (v["size"].as_u64(), v["block_size"].as_u64()),
        (Some(64 * MIB), Some(16384))
    );
    let snaps = cairn_ok(&["snapshot", "list", t]);
    assert!(snaps.contains(&format!("{a}@s1")), "{snaps}");
    cairn_err(&["volume", "delete", t, &a], "--with-snapshots");
    cairn_ok(&["volume", "delete", t, &a, "--with-snapshots"]);
    cairn_ok(&["volume", "delete", t, &b]);
    cairn_err(&["volume", "delete", t, &b], "no volume named");
    let list = json(&["volume", "list", t, "--json"]);
    assert!(!list.to_string().contains(&format!("\"{p}-")), "{list}");
    assert!(!cairn_ok(&["snapshot", "list", t]).contains(&format!("{a}@")));
}

#[test]
fn volume_commands_unmounted_and_mounted() {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    volume_commands(&fs.pool, "u");
    cairn_ok(&["volume", "create", s(&fs.pool), "kept", "1G"]);
    fs.mount();
    volume_commands(&fs.mnt, "m");
    let ls = sh(&fs.mnt, "ls -a1");
    assert_eq!(
        ls.lines().collect::<Vec<_>>(),
        [".", ".."],
        "volumes must not show"
    );
    let info = json(&["info", s(&fs.mnt), "--json"]);
    assert_eq!(info["volumes"][0]["name"], "kept", "{info}");
    assert!(info["nbd"].is_null(), "not served: {info}");
    let text = cairn_ok(&["info", s(&fs.mnt)]);
    assert!(
        text.contains("kept") && text.contains("not served"),
        "{text}"
    );
    for sub in [
        "create", "list", "resize", "delete", "snapshot", "clone", "rollback",
    ] {
        let h = cairn_ok(&["volume", sub, "--help"]);
        assert!(h.contains("Example: cairn volume"), "{sub}: {h}");
    }
    fs.finish();
}

// ---------------------------------------------------------------- NBD

/// A write to a snapshot export is refused with EPERM (raw client).
fn snapshot_write_refused(c: &mut nbdc::Client, export: &str) {
    c.go(export, false);
    let (err, data) = c.read(0, 4096);
    assert_eq!((err, data.len()), (0, 4096));
    assert_eq!(
        c.write(0, &[7u8; 4096]),
        cairn_nbd::errno::EPERM,
        "write to {export}"
    );
}

fn qemu_checks(sock: &Path, dir: &Path, input: &Path) {
    let q = unix_uri(sock, "q");
    tool_ok(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", s(input), &q],
    );
    let out = dir.join("q.out");
    tool_ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &q, s(&out)],
    );
    assert_eq!(sha256(&out), sha256(input), "qemu-img round trip");
    let w = tool_ok("qemu-io", &["-f", "raw", "-c", "write -P 0xab 1M 64k", &q]);
    assert!(w.contains("wrote 65536/65536"), "{w}");
    let r = tool_ok(
        "qemu-io",
        &["-f", "raw", "-r", "-c", "read -P 0xab 1M 64k", &q],
    );
    assert!(
        r.contains("read 65536/65536") && !r.contains("verification failed"),
        "{r}"
    );
    let r = tool(
        "qemu-io",
        &["-f", "raw", "-r", "-c", "read -P 0xac 1M 64k", &q],
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(
        all.contains("verification failed"),
        "a wrong pattern must fail: {all}"
    );
}

#[test]
fn daemon_serves_nbd_to_real_clients() {
    let (mut fs, sock) = nbd_pool(true);
    let (d, m) = (fs.dir.clone(), s(&fs.mnt).to_string());
    for v in ["v", "q"] {
        cairn_ok(&["volume", "create", &m, v, "64M"]);
    }
    let (input, other) = (d.join("in.bin"), d.join("other.bin"));
    random_file(&input, 64 * MIB, 1);
    random_file(&other, 64 * MIB, 2);
    let v = unix_uri(&sock, "v");
    tool_ok("nbdcopy", &["--flush", s(&input), &v]);
    let out = d.join("out.bin");
    tool_ok("nbdcopy", &[&v, s(&out)]);
    assert_eq!(sha256(&out), sha256(&input), "nbdcopy over the Unix socket");
    let tcp = format!("nbd://{}/v", tcp_address(&fs.mnt));
    tool_ok("nbdcopy", &[&tcp, s(&out)]);
    assert_eq!(sha256(&out), sha256(&input), "nbdcopy over TCP");
    cairn_ok(&["volume", "snapshot", &m, "v", "s1"]);
    let list = tool_ok("nbdinfo", &["--list", &unix_uri(&sock, "")]);
    for e in ["export=\"v\"", "export=\"q\"", "export=\"v@s1\""] {
        assert!(list.contains(e), "{e} not in {list}");
    }
    snapshot_write_refused(&mut nbdc::Client::unix(&sock), "v@s1");
    tool_ok("nbdcopy", &["--flush", s(&other), &v]);
    // A snapshot only cut (--no-wait) is served at once, with its data.
    let cut = json(&["volume", "snapshot", &m, "v", "s2", "--no-wait", "--json"]);
    assert_eq!(cut["export"], "v@s2", "{cut}");
    tool_ok("nbdcopy", &[&unix_uri(&sock, "v@s2"), s(&out)]);
    assert_eq!(sha256(&out), sha256(&other), "the cut snapshot's export");
    tool_ok("nbdcopy", &[&unix_uri(&sock, "v@s1"), s(&out)]);
    assert_eq!(
        sha256(&out),
        sha256(&input),
        "the snapshot export keeps the old data"
    );
    cairn_ok(&["volume", "rollback", &m, "v", "s1"]);
    tool_ok("nbdcopy", &[&v, s(&out)]);
    assert_eq!(sha256(&out), sha256(&input), "rolled back");
    qemu_checks(&sock, &d, &input);
    check_info(&fs.mnt);
    fs.remount();
    tool_ok("nbdcopy", &[&unix_uri(&sock, "v"), s(&out)]);
    assert_eq!(sha256(&out), sha256(&input), "v after remount");
    tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-r",
            "-c",
            "read -P 0xab 1M 64k",
            &unix_uri(&sock, "q"),
        ],
    );
    fs.finish();
}

/// `info` shows both servers, their counters and the worker pool.
fn check_info(mnt: &Path) {
    let v = json(&["info", s(mnt), "--json"]);
    let list = v["nbd"].as_array().expect("nbd").clone();
    assert_eq!(list.len(), 2, "{v}");
    let unix = list
        .iter()
        .find(|x| x["address"].as_str().unwrap().starts_with("unix:"))
        .unwrap();
    let st = &unix["stats"];
    assert!(
        st["commands"]["write"]["count"].as_u64().unwrap() > 0,
        "{st}"
    );
    assert!(
        st["commands"]["flush"]["count"].as_u64().unwrap() > 0,
        "{st}"
    );
    assert_eq!(
        st["commands"]["write"]["errors"].as_u64(),
        Some(1),
        "the EPERM: {st}"
    );
    assert_eq!(
        (st["pool"]["min"].as_u64(), st["pool"]["max"].as_u64()),
        (Some(2), Some(128))
    );
    assert!(unix["queue_wait_p99_us"].is_u64(), "{unix}");
    let text = cairn_ok(&["info", s(mnt)]);
    for want in ["nbd:", "unix:", "127.0.0.1:", "workers:", "queue wait mean"] {
        assert!(text.contains(want), "{want} not in\n{text}");
    }
}

#[test]
fn flushed_nbd_writes_survive_kill9() {
    let (mut fs, sock) = nbd_pool(false);
    cairn_ok(&["volume", "create", s(&fs.mnt), "k", "64M"]);
    let input = fs.dir.join("in.bin");
    random_file(&input, 64 * MIB, 3);
    tool_ok("nbdcopy", &["--flush", s(&input), &unix_uri(&sock, "k")]);
    fs.kill9();
    fs.mount();
    let out = fs.dir.join("out.bin");
    tool_ok("nbdcopy", &[&unix_uri(&sock, "k"), s(&out)]);
    assert_eq!(sha256(&out), sha256(&input), "flushed data after kill -9");
    fs.finish();
}

#[test]
fn refusals_of_bad_nbd_settings() {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    let (p, m) = (s(&fs.pool).to_string(), s(&fs.mnt).to_string());
    let e = cairn_err(
        &["mount", &p, &m, "--nbd", "0.0.0.0:0"],
        "--nbd-allow-remote",
    );
    assert!(e.contains("not a loopback address"), "{e}");
    cairn_err(
        &["mount", &p, &m, "--nbd", "localhost"],
        "not an IP address and port",
    );
    let e = cairn_err(
        &[
            "mount",
            &p,
            &m,
            "--nbd-socket",
            "/x",
            "--nbd-workers-max",
            "0",
        ],
        "",
    );
    assert!(e.contains("nbd_workers_max"), "{e}");
    fs.set_config("nbd_listen", "\"10.1.2.3:10809\"");
    cairn_err(&["mount", &p, &m], "nbd_allow_remote = true");
    fs.set_config("nbd_listen", "\"\"");
    fs.set_config("nbd_workers_min", "9");
    fs.set_config("nbd_workers_max", "8");
    cairn_err(&["mount", &p, &m], "nbd_workers_min = 9");
    assert!(
        mount_fstype(&fs.mnt).is_none(),
        "nothing mounted after refusals"
    );
    fs.set_config("nbd_workers_min", "8");
    fs.mount_args = ["--nbd", "0.0.0.0:0", "--nbd-allow-remote", "--nbd-insecure"]
        .map(String::from)
        .to_vec();
    fs.mount();
    let a = tcp_address(&fs.mnt);
    assert!(a.starts_with("0.0.0.0:"), "{a}");
    assert!(
        fs.daemon_output().contains("non-loopback"),
        "{}",
        fs.daemon_output()
    );
    let v = json(&["info", &m, "--json"]);
    assert_eq!(v["nbd"][0]["stats"]["pool"]["max"].as_u64(), Some(8), "{v}");
    fs.finish();
}

// ------------------------------------------------------- nbd serve

/// `cairn nbd serve ARGS` in the background; waits for `lines` "serving"
/// lines on its stdout and returns them.
fn nbd_serve(dir: &Path, args: &[&str], lines: usize) -> (Child, Vec<String>) {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = dir.join(format!("serve-{n}.out"));
    let f = std::fs::File::create(&out).unwrap();
    let mut child = Command::new(CAIRN)
        .args(["nbd", "serve"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let serving: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("serving"))
            .map(String::from)
            .collect();
        if serving.len() >= lines {
            return (child, serving);
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("cairn nbd serve exited ({st}):\n{text}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "nbd serve not ready:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM, then a clean exit within 30 s.
fn stop_serve(mut child: Child) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = wait_until(&mut child, Duration::from_secs(30)).expect("nbd serve stops on SIGTERM");
    assert!(st.success(), "nbd serve exited with {st}");
}

#[test]
fn nbd_serve_on_an_unmounted_pool() {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    let (d, p) = (fs.dir.clone(), s(&fs.pool).to_string());
    cairn_ok(&["volume", "create", &p, "u", "64M"]);
    let sock = d.join("serve.sock");
    let args = [
        "--socket",
        s(&sock),
        "--listen",
        "127.0.0.1:0",
        "--insecure",
        "--workers-max",
        "16",
    ];
    let (child, lines) = nbd_serve(&d, &[&[p.as_str()][..], &args].concat(), 2);
    let tcp = lines
        .iter()
        .find(|l| l.contains("127.0.0.1:"))
        .expect("TCP line");
    let addr = tcp.rsplit(' ').next().unwrap();
    let list = tool_ok("nbdinfo", &["--list", &format!("nbd://{addr}")]);
    assert!(list.contains("export=\"u\""), "{list}");
    let input = d.join("in.bin");
    random_file(&input, 64 * MIB, 4);
    tool_ok("nbdcopy", &["--flush", s(&input), &unix_uri(&sock, "u")]);
    cairn_ok(&["volume", "snapshot", &p, "u", "s"]);
    stop_serve(child);
    assert!(!sock.exists(), "socket removed at exit");
    fs.check();
    let (child, _) = nbd_serve(&d, &[p.as_str(), "--socket", s(&sock)], 1);
    let out = d.join("out.bin");
    tool_ok("nbdcopy", &[&unix_uri(&sock, "u@s"), s(&out)]);
    assert_eq!(
        sha256(&out),
        sha256(&input),
        "after nbd serve stopped and restarted"
    );
    stop_serve(child);
    fs.mount();
    for t in [&fs.pool, &fs.mnt] {
        let e = cairn_err(
            &["nbd", "serve", s(t), "--socket", s(&sock)],
            "needs an unmounted pool",
        );
        assert!(e.contains("mounted on"), "{e}");
    }
    cairn_err(&["nbd", "serve", s(&d)], "not a Cairn pool");
    fs.finish();
}

// ------------------------------------------- nbdfuse + ext4 + snapshot

/// Undoes mounts, loop devices and nbdfuse processes, newest first.
#[derive(Default)]
struct Stack(Vec<Undo>);

enum Undo {
    Mount(PathBuf),
    Loop(String),
    Fuse(PathBuf, Child),
}

impl Stack {
    /// nbdfuse of `uri` on a new dir `name` under `dir`; its file.
    fn nbdfuse(&mut self, dir: &Path, name: &str, uri: &str, ro: bool) -> PathBuf {
        let m = dir.join(name);
        std::fs::create_dir(&m).unwrap();
        let pid = dir.join(format!("{name}.pid"));
        let mut cmd = Command::new("nbdfuse");
        if ro {
            cmd.arg("-r");
        }
        require("nbdfuse");
        let child = cmd
            .args(["-P", s(&pid), s(&m), uri])
            .spawn()
            .expect("spawn nbdfuse");
        self.0.push(Undo::Fuse(m.clone(), child));
        assert!(
            eventually(Duration::from_secs(20), || pid.exists()),
            "nbdfuse did not start"
        );
        m.join("nbd")
    }

    fn losetup(&mut self, file: &Path, ro: bool) -> String {
        let mut a = vec!["--find", "--show"];
        if ro {
            a.push("-r");
        }
        a.push(s(file));
        let dev = tool_ok("losetup", &a).trim().to_string();
        self.0.push(Undo::Loop(dev.clone()));
        dev
    }

    fn mount(&mut self, dev: &str, at: &Path, opts: &str) {
        std::fs::create_dir_all(at).unwrap();
        tool_ok("mount", &["-o", opts, dev, s(at)]);
        self.0.push(Undo::Mount(at.to_path_buf()));
    }

    /// Unmounts the newest mount (it must succeed).
    fn umount(&mut self) {
        let Some(Undo::Mount(m)) = self.0.pop() else {
            panic!("no mount on top")
        };
        tool_ok("umount", &[s(&m)]);
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        while let Some(u) = self.0.pop() {
            match u {
                Undo::Mount(m) => drop(tool("umount", &[s(&m)])),
                Undo::Loop(l) => drop(tool("losetup", &["-d", &l])),
                Undo::Fuse(m, mut c) => {
                    drop(tool("fusermount3", &["-u", s(&m)]));
                    if wait_until(&mut c, Duration::from_secs(10)).is_none() {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                }
            }
        }
    }
}

fn body(d: usize, f: usize, gen: u32) -> String {
    format!("file {f} of dir {d}, generation {gen}\n").repeat(50 * (f + 1))
}

fn write_tree(root: &Path, gen: u32) {
    for d in 0..4 {
        let sub = root.join(format!("dir{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..8 {
            std::fs::write(sub.join(format!("f{f}")), body(d, f, gen)).unwrap();
        }
    }
}

fn check_tree(root: &Path, gen: u32) {
    for d in 0..4 {
        for f in 0..8 {
            let p = root.join(format!("dir{d}/f{f}"));
            let got =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            assert!(
                got == body(d, f, gen),
                "{} is not generation {gen}",
                p.display()
            );
        }
    }
}

#[test]
fn ext4_over_nbdfuse_and_its_snapshot_export() {
    assert!(Path::new("/dev/fuse").exists(), "this test needs /dev/fuse");
    let (fs, sock) = nbd_pool(false);
    let d = fs.dir.clone();
    cairn_ok(&["volume", "create", s(&fs.mnt), "e", "128M"]);
    let mut st = Stack::default();
    let file = st.nbdfuse(&d, "fuse-e", &unix_uri(&sock, "e"), false);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 128 * MIB);
    let dev = st.losetup(&file, false);
    tool_ok("mkfs.ext4", &["-q", "-F", &dev]);
    let (e1, e2) = (d.join("ext4"), d.join("ext4-snap"));
    st.mount(&dev, &e1, "rw");
    write_tree(&e1, 1);
    tool_ok("sync", &[]);
    st.umount();
    let fsck = tool("fsck.ext4", &["-fn", &dev]);
    assert!(fsck.status.success(), "fsck\n{}", describe(&fsck));
    tool_ok("sync", &[]);
    cairn_ok(&["volume", "snapshot", s(&fs.mnt), "e", "clean"]);
    st.mount(&dev, &e1, "rw");
    check_tree(&e1, 1);
    write_tree(&e1, 2);
    std::fs::remove_dir_all(e1.join("dir0")).unwrap();
    tool_ok("sync", &[]);
    let sfile = st.nbdfuse(&d, "fuse-snap", &unix_uri(&sock, "e@clean"), true);
    let sdev = st.losetup(&sfile, true);
    st.mount(&sdev, &e2, "ro,noload");
    check_tree(&e2, 1);
    assert!(!e1.join("dir0").exists(), "the live volume changed");
    drop(st);
    fs.finish();
}

/// A volume chunk whose stored bytes come back damaged (a fault plan makes
/// the device flip bits in its range) answers an NBD READ of that range
/// with EIO, never with other bytes; the rest of the volume and the
/// connection keep working, and the range reads exactly once the device
/// is healthy again.
#[test]
fn a_damaged_volume_chunk_gives_nbd_eio_for_its_range_only() {
    let mut fs = Fs::create();
    let dev = format!("ssd:{}:256M", fs.dev("data"));
    fs.mkfs(&["--sparse", "--device", &dev]);
    let (plan, sock) = (fs.dir.join("faults.plan"), fs.dir.join("nbd.sock"));
    std::fs::write(&plan, "").unwrap();
    fs.mount_env.push(("CAIRN_FAULT_PLAN".into(), plan.clone()));
    fs.mount_args = vec!["--nbd-socket".into(), s(&sock).into()];
    fs.mount();
    cairn_ok(&["volume", "create", s(&fs.mnt), "v", "16M"]);
    let input = fs.dir.join("in.bin");
    random_file(&input, 8 * MIB, 11);
    tool_ok("nbdcopy", &["--flush", s(&input), &unix_uri(&sock, "v")]);
    cairn_ok(&["sync", s(&fs.mnt)]);
    let data = std::fs::read(&input).unwrap();
    let raw = std::fs::read(fs.dev("data")).unwrap();
    let needle = &data[3 * MIB as usize + 1000..3 * MIB as usize + 1064];
    let at = raw.windows(needle.len()).position(|w| w == needle);
    let at = at.expect("the volume's bytes on the device") as u64;
    // A fresh mount (nothing cached) whose device damages that chunk.
    std::fs::write(
        &plan,
        format!("devs/data read corrupt range={at}-{}\n", at + 1),
    )
    .unwrap();
    fs.remount();
    let mut c = nbdc::Client::unix(&sock);
    c.go("v", false);
    let (err, got) = c.read(3 * MIB, 64 * 1024);
    assert_eq!(
        err,
        cairn_nbd::errno::EIO,
        "damaged range: {} bytes",
        got.len()
    );
    let (err, got) = c.read(5 * MIB, 64 * 1024);
    assert_eq!(err, 0, "another range on the same connection");
    assert_eq!(got, &data[5 * MIB as usize..5 * MIB as usize + 65536]);
    // Healthy again: exact bytes.
    std::fs::write(&plan, "").unwrap();
    fs.remount();
    let out = fs.dir.join("out.bin");
    tool_ok("nbdcopy", &[&unix_uri(&sock, "v"), s(&out)]);
    assert_eq!(&std::fs::read(&out).unwrap()[..data.len()], &data[..]);
    fs.finish();
}
