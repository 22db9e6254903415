//! Running Cairn as a service: the metrics endpoint (valid Prometheus text
//! per promtool, values that agree with `cairn info --json`, loopback only
//! unless allowed, read-only), the dashboard in headless Chromium
//! (tests/browser), mounting through an fstab line with mount.fuse.cairn and
//! plain umount, and the systemd unit where systemd is PID 1.

use serde_json::Value as Json;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn cairn(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new(CAIRN);
    for a in args {
        c.arg(a);
    }
    run(&mut c)
}

/// A pool in a temp dir with a scan interval of 1 s; unmounted on drop.
struct Pool {
    _dir: tempfile::TempDir,
    pool: PathBuf,
    mnt: PathBuf,
}

impl Pool {
    fn new(extra_config: &str) -> Pool {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let pool = dir.path().join("pool");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let dev = format!("ssd:{}:1G", pool.join("data.0").display());
        cairn(&[&"mkfs", &pool, &"--device", &dev]);
        let cfg = pool.join("cairn.toml");
        let text = std::fs::read_to_string(&cfg).unwrap();
        let mut text: String = text
            .lines()
            .filter(|l| !l.starts_with("metrics_"))
            .map(|l| format!("{l}\n"))
            .collect();
        text.push_str(&format!("metrics_scan_interval_secs = 1\n{extra_config}\n"));
        std::fs::write(&cfg, text).unwrap();
        Pool {
            _dir: dir,
            pool,
            mnt,
        }
    }

    fn mounted(&self) -> bool {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let m = self.mnt.display().to_string();
        info.lines().any(|l| l.split(' ').nth(4) == Some(&m))
    }

    /// Waits until the daemon released the pool (a check can open it).
    fn wait_released(&self) {
        let t0 = Instant::now();
        loop {
            let ok = Command::new(CAIRN)
                .arg("check")
                .arg(&self.pool)
                .output()
                .unwrap();
            if ok.status.success() {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "pool still held: {}",
                String::from_utf8_lossy(&ok.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.mounted() {
            let _ = Command::new("umount").arg(&self.mnt).status();
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// (status, body) of `METHOD path` on 127.0.0.1:port.
fn http(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "{method} {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
    let status = head.split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0);
    (status, body.to_string())
}

/// `name{labels}` -> value of a Prometheus text exposition.
fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn info(target: &Path) -> Json {
    let out = cairn(&[&"info", &target, &"--json"]);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Writes `n` files of distinct random-ish content; returns their total size.
fn workload(mnt: &Path, n: usize) -> u64 {
    let mut total = 0;
    for i in 0..n {
        let len = (1 << 20) + i * 4096 + 17;
        let data: Vec<u8> = (0..len)
            .map(|j| ((j * 31 + i * 7) % 251) as u8 ^ (j >> 12) as u8)
            .collect();
        std::fs::write(mnt.join(format!("file{i}")), &data).unwrap();
        total += len as u64;
    }
    total
}

fn mount_with_metrics(p: &Pool, port: u16) {
    let addr = format!("127.0.0.1:{port}");
    cairn(&[&"mount", &p.pool, &p.mnt, &"--metrics", &addr]);
}

#[test]
fn metrics_are_valid_and_agree_with_info() {
    let p = Pool::new("");
    let port = free_port();
    mount_with_metrics(&p, port);
    let bytes = workload(&p.mnt, 5);
    cairn(&[&"sync", &p.mnt]);
    for k in 0..3 {
        cairn(&[&"snapshot", &"create", &p.mnt, &format!("s{k}")]);
    }
    cairn(&[&"sync", &p.mnt]);
    std::thread::sleep(Duration::from_millis(2500));
    let (st, text) = http(port, "GET", "/metrics");
    assert_eq!(st, 200);
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus: scripts/deps.sh test)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let m = parse_metrics(&text);
    let i = info(&p.mnt);
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("no {k} in\n{text}"));
    assert_eq!(get("cairn_tid"), i["current_tid"].as_u64().unwrap() as f64);
    assert_eq!(get("cairn_snapshots"), 3.0);
    assert_eq!(get("cairn_files"), 5.0);
    assert_eq!(get("cairn_logical_bytes"), bytes as f64);
    assert_eq!(i["logical_bytes"].as_u64(), Some(bytes));
    for k in [
        "stored_bytes",
        "unique_bytes",
        "referenced_bytes",
        "capacity_bytes",
        "physical_bytes",
    ] {
        assert_eq!(
            get(&format!("cairn_{k}")),
            i[k].as_u64().unwrap() as f64,
            "{k}"
        );
    }
    let d0 = &i["devices"][0];
    let used = format!(
        "cairn_device_used_bytes{{device=\"0\",class=\"{}\",role=\"{}\"}}",
        d0["class"].as_str().unwrap(),
        d0["role"].as_str().unwrap()
    );
    assert_eq!(get(&used), d0["used"].as_u64().unwrap() as f64);
    assert!(get("cairn_fuse_write_bytes_total") >= bytes as f64);
    assert!(get("cairn_fuse_requests_total{op=\"write\"}") > 0.0);
    assert!(get("cairn_fuse_request_duration_seconds_count{op=\"write\"}") > 0.0);
    assert!(get("cairn_commit_duration_seconds_count") >= 1.0);
    // Read-only: other methods are refused.
    assert_eq!(http(port, "POST", "/metrics").0, 405);
    assert_eq!(http(port, "DELETE", "/api/info").0, 405);
    cairn(&[&"umount", &p.mnt]);
}

#[test]
fn metrics_refuse_remote_addresses_unless_allowed() {
    let p = Pool::new("");
    let port = free_port();
    let addr = format!("0.0.0.0:{port}");
    let out = Command::new(CAIRN)
        .arg("mount")
        .arg(&p.pool)
        .arg(&p.mnt)
        .args(["--metrics", &addr])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a non-loopback metrics address was accepted"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("loopback"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!p.mounted());
    let q = Pool::new(&format!("metrics_listen = \"{addr}\""));
    let out = Command::new(CAIRN)
        .arg("mount")
        .arg(&q.pool)
        .arg(&q.mnt)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "metrics_listen on 0.0.0.0 was accepted"
    );
    assert!(!q.mounted());
    // Allowed: it serves, with a warning in the log.
    cairn(&[
        &"mount",
        &p.pool,
        &p.mnt,
        &"--metrics",
        &addr,
        &"--metrics-allow-remote",
    ]);
    assert_eq!(http(port, "GET", "/metrics").0, 200);
    let log = std::fs::read_to_string(p.pool.join("cairn.log")).unwrap();
    assert!(
        log.contains("WARN") && log.contains("without authentication"),
        "{log}"
    );
    cairn(&[&"umount", &p.mnt]);
}

/// Installs the mount(8) helper where mount looks for it.
fn install_helper() {
    let src = Path::new(ROOT).join("scripts/service/mount.fuse.cairn");
    run(Command::new("install")
        .args(["-m", "0755"])
        .arg(src)
        .arg("/sbin/mount.fuse.cairn"));
}

#[test]
fn fstab_line_mounts_and_plain_umount_unmounts() {
    install_helper();
    let p = Pool::new("");
    let fstab = p.pool.parent().unwrap().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "{} {} fuse.cairn defaults,noauto,commit_interval=1 0 0\n",
            p.pool.display(),
            p.mnt.display()
        ),
    )
    .unwrap();
    run(Command::new("mount")
        .arg("-T")
        .arg(&fstab)
        .arg(&p.mnt)
        .env("CAIRN_BIN", CAIRN));
    assert!(
        p.mounted(),
        "mount -T {} {} did not mount",
        fstab.display(),
        p.mnt.display()
    );
    std::fs::write(p.mnt.join("hello"), b"from fstab").unwrap();
    run(Command::new("umount").arg(&p.mnt));
    assert!(!p.mounted());
    p.wait_released();
    // mount -t fuse.cairn POOL MNT, then the data is there.
    run(Command::new("mount")
        .args(["-t", "fuse.cairn"])
        .arg(&p.pool)
        .arg(&p.mnt)
        .env("CAIRN_BIN", CAIRN));
    assert_eq!(std::fs::read(p.mnt.join("hello")).unwrap(), b"from fstab");
    run(Command::new("umount").arg(&p.mnt));
    p.wait_released();
    let log = std::fs::read_to_string(p.pool.join("cairn.log")).unwrap();
    assert_eq!(log.matches("cairn::daemon: unmounted").count(), 2, "{log}");
}

#[test]
fn systemd_unit_mounts_and_stops() {
    let state = Command::new("systemctl").arg("is-system-running").output();
    let running = std::path::Path::new("/run/systemd/system").exists();
    if !running {
        let why = state
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|e| e.to_string());
        eprintln!("SKIPPED systemd_unit_mounts_and_stops: systemd is not PID 1 here (/run/systemd/system missing; systemctl is-system-running: {why:?})");
        return;
    }
    let p = Pool::new("");
    let name = format!("cairntest{}", std::process::id());
    std::fs::create_dir_all("/etc/cairn").unwrap();
    std::fs::write(
        format!("/etc/cairn/{name}.toml"),
        format!("pool = {:?}\nmountpoint = {:?}\n", p.pool, p.mnt),
    )
    .unwrap();
    run(Command::new("install").args(["-m", "0755", CAIRN, "/usr/local/bin/cairn"]));
    let unit = Path::new(ROOT).join("scripts/service/cairn@.service");
    run(Command::new("install")
        .args(["-m", "0644"])
        .arg(unit)
        .arg("/etc/systemd/system/cairn@.service"));
    run(Command::new("systemctl").arg("daemon-reload"));
    run(Command::new("systemctl").args(["start", &format!("cairn@{name}")]));
    let t0 = Instant::now();
    while !p.mounted() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(p.mounted());
    run(Command::new("systemctl").args(["stop", &format!("cairn@{name}")]));
    assert!(!p.mounted());
    p.wait_released();
    let _ = std::fs::remove_file(format!("/etc/cairn/{name}.toml"));
}

#[test]
fn dashboard_in_headless_chromium() {
    let dir = Path::new(ROOT).join("crates/cli/tests/browser");
    run(Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--silent"])
        .current_dir(&dir));
    let p = Pool::new("");
    let port = free_port();
    mount_with_metrics(&p, port);
    let bytes = workload(&p.mnt, 4);
    for k in 0..2 {
        cairn(&[&"snapshot", &"create", &p.mnt, &format!("snap{k}")]);
    }
    cairn(&[&"sync", &p.mnt]);
    std::thread::sleep(Duration::from_millis(2500));
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&shots).unwrap();
    let out = run(Command::new("node")
        .arg(dir.join("dashboard.mjs"))
        .arg(format!("http://127.0.0.1:{port}/"))
        .arg(&p.mnt)
        .arg(&shots)
        .current_dir(&dir));
    let page: Json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let i = info(&p.mnt);
    assert_eq!(page["files"].as_u64(), Some(4), "{page}");
    assert_eq!(page["logical"].as_u64(), Some(bytes));
    assert_eq!(page["logical"], i["logical_bytes"]);
    assert_eq!(page["snapshots"].as_u64(), Some(2));
    assert_eq!(page["timeline"].as_u64(), Some(2));
    assert_eq!(page["device0_used"], i["devices"][0]["used"]);
    assert_eq!(page["device0_size"], i["devices"][0]["size"]);
    assert!(page["tid"].as_u64().unwrap() <= i["current_tid"].as_u64().unwrap());
    let (w0, w1) = (
        page["written_before"].as_u64().unwrap(),
        page["written_after"].as_u64().unwrap(),
    );
    assert!(w1 > w0, "the page's written counter did not move: {page}");
    assert!(
        page["points_after"].as_u64() > page["points_before"].as_u64(),
        "{page}"
    );
    assert!(shots.join("dashboard.png").exists());
    cairn(&[&"umount", &p.mnt]);
}
