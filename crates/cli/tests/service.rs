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
        Pool::with("", &[("ssd", "1G")], &[], extra_config)
    }

    /// A pool in `TMP/sub/pool` (its devices `TMP/sub/data.N`, of these
    /// classes and sizes), mounted later on `TMP/mnt`.
    fn with(sub: &str, devices: &[(&str, &str)], mkfs_args: &[&str], extra_config: &str) -> Pool {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let base = dir.path().join(sub);
        std::fs::create_dir_all(&base).unwrap();
        let pool = base.join("pool");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let mut mkfs = Command::new(CAIRN);
        mkfs.arg("mkfs").arg(&pool).args(mkfs_args);
        for (n, (class, size)) in devices.iter().enumerate() {
            let path = base.join(format!("data.{n}"));
            mkfs.arg("--device")
                .arg(format!("{class}:{}:{size}", path.display()));
        }
        run(&mut mkfs);
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
    http_auth(port, method, path, "")
}

/// `http` with these header lines (each ending in CRLF).
fn http_auth(port: u16, method: &str, path: &str, headers: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\n{headers}\r\n"
    )
    .unwrap();
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

/// Every metric family the daemon serves (with an NBD server running).
const FAMILIES: &[&str] = &[
    "cairn_tid",
    "cairn_dirty_bytes",
    "cairn_commit_duration_seconds",
    "cairn_flush_duration_seconds",
    "cairn_commit_metadata_duration_seconds",
    "cairn_committed_bytes_total",
    "cairn_snapshots",
    "cairn_newest_snapshot_age_seconds",
    "cairn_oldest_snapshot_age_seconds",
    "cairn_ram_cache_bytes",
    "cairn_ram_cache_hits_total",
    "cairn_ram_cache_misses_total",
    "cairn_ssd_cache_hits_total",
    "cairn_ssd_cache_misses_total",
    "cairn_ssd_cache_filled_bytes_total",
    "cairn_ssd_cache_entries",
    "cairn_physical_read_bytes_total",
    "cairn_physical_written_bytes_total",
    "cairn_device_read_bytes_total",
    "cairn_device_written_bytes_total",
    "cairn_device_read_errors_total",
    "cairn_device_write_errors_total",
    "cairn_maintenance_runs_total",
    "cairn_maintenance_running",
    "cairn_maintenance_progress_ratio",
    "cairn_maintenance_processed_bytes_total",
    "cairn_maintenance_reclaimed_bytes_total",
    "cairn_scrub_damaged_chunks_total",
    "cairn_tier_promoted_bytes_total",
    "cairn_tier_demoted_bytes_total",
    "cairn_tier_promoted_segments_total",
    "cairn_tier_demoted_segments_total",
    "cairn_device_size_bytes",
    "cairn_device_used_bytes",
    "cairn_device_fill_ratio",
    "cairn_device_segments",
    "cairn_device_hot_segments",
    "cairn_device_heat",
    "cairn_device_segments_by_heat",
    "cairn_scan_age_seconds",
    "cairn_files",
    "cairn_directories",
    "cairn_logical_bytes",
    "cairn_physical_bytes",
    "cairn_capacity_bytes",
    "cairn_referenced_bytes",
    "cairn_unique_bytes",
    "cairn_stored_bytes",
    "cairn_history_only_bytes",
    "cairn_dedup_ratio",
    "cairn_compression_ratio",
    "cairn_chunks",
    "cairn_logical_read_bytes_total",
    "cairn_logical_written_bytes_total",
    "cairn_fuse_read_bytes_total",
    "cairn_fuse_write_bytes_total",
    "cairn_fuse_requests_total",
    "cairn_fuse_request_duration_seconds",
    "cairn_nbd_requests_total",
    "cairn_nbd_bytes_total",
    "cairn_nbd_errors_total",
    "cairn_nbd_connections_open",
    "cairn_nbd_workers",
    "cairn_nbd_queued_jobs",
    "cairn_nbd_queue_wait_seconds",
    "cairn_nbd_workers_busy",
];

#[test]
fn metrics_are_valid_and_agree_with_info() {
    let p = Pool::new("");
    let port = free_port();
    let sock = p.pool.parent().unwrap().join("nbd.sock");
    let addr = format!("127.0.0.1:{port}");
    cairn(&[
        &"mount",
        &p.pool,
        &p.mnt,
        &"--metrics",
        &addr,
        &"--nbd-socket",
        &sock,
        // The FUSE worker pool's metrics need io_uring: on, if it is off.
        &"--enable-uring-module",
    ]);
    // A known workload: files (one written twice: dedup), snapshots, an
    // NBD volume written with qemu-io, and every maintenance command.
    let bytes = workload(&p.mnt, 5);
    std::fs::copy(p.mnt.join("file0"), p.mnt.join("copy0")).unwrap();
    let copy = std::fs::metadata(p.mnt.join("copy0")).unwrap().len();
    cairn(&[&"sync", &p.mnt]);
    for k in 0..3 {
        cairn(&[&"snapshot", &"create", &p.mnt, &format!("secret-snap{k}")]);
        std::thread::sleep(Duration::from_millis(1100));
    }
    cairn(&[&"volume", &"create", &p.mnt, &"secretvol", &"16M"]);
    let uri = format!("nbd+unix:///secretvol?socket={}", sock.display());
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x5a 0 1M",
        "-c",
        "read -P 0x5a 0 1M",
        &uri,
    ]));
    std::fs::remove_file(p.mnt.join("file4")).unwrap();
    cairn(&[&"sync", &p.mnt]);
    for c in ["scrub", "gc", "reblock", "prune"] {
        cairn(&[&c, &p.mnt]);
    }
    cairn(&[&"sync", &p.mnt]);
    std::thread::sleep(Duration::from_millis(2500));
    let (st, text) = http(port, "GET", "/metrics");
    assert_eq!(st, 200);
    let i = info(&p.mnt);
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
    let fams: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    for f in FAMILIES {
        assert!(fams.contains(f), "no family {f} in\n{text}");
    }
    let m = parse_metrics(&text);
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("no {k} in\n{text}"));
    let u = |v: &Json| {
        v.as_f64()
            .unwrap_or_else(|| panic!("not a number: {v} in {i}"))
    };
    let s = &i["service"];
    assert_eq!(get("cairn_tid"), u(&i["current_tid"]));
    assert_eq!(get("cairn_snapshots"), 3.0);
    assert_eq!(get("cairn_snapshots"), u(&s["snapshots"]));
    let (newest, oldest) = (
        get("cairn_newest_snapshot_age_seconds"),
        get("cairn_oldest_snapshot_age_seconds"),
    );
    assert!(
        oldest >= newest + 2.0,
        "oldest {oldest} s, newest {newest} s"
    );
    assert!((oldest - u(&s["oldest_snapshot_age_seconds"])).abs() < 5.0);
    // The scan: files, bytes, ratios.
    // Five files and the volume (a file of the pool).
    assert_eq!(get("cairn_files"), 6.0);
    assert_eq!(get("cairn_files"), u(&i["files"]));
    assert_eq!(get("cairn_logical_bytes"), u(&i["logical_bytes"]));
    assert_eq!(
        i["logical_bytes"].as_u64(),
        Some(bytes + copy - (1 << 20) - 4 * 4096 - 17 + (16 << 20))
    );
    for k in [
        "stored_bytes",
        "unique_bytes",
        "referenced_bytes",
        "capacity_bytes",
        "physical_bytes",
        "history_only_bytes",
        "chunks",
        "dedup_ratio",
        "compression_ratio",
    ] {
        assert_eq!(get(&format!("cairn_{k}")), u(&i[k]), "{k}");
    }
    assert!(get("cairn_dedup_ratio") > 1.0, "file0 and copy0 dedup");
    // Commits, caches, device I/O and errors, maintenance, tiering.
    assert_eq!(get("cairn_commit_duration_seconds_count"), u(&s["commits"]));
    assert_eq!(
        get("cairn_flush_duration_seconds_count"),
        u(&s["commit_data"]["count"])
    );
    assert_eq!(
        get("cairn_commit_metadata_duration_seconds_count"),
        u(&s["commits"])
    );
    assert_eq!(get("cairn_committed_bytes_total"), u(&s["committed_bytes"]));
    assert_eq!(get("cairn_dirty_bytes"), u(&s["dirty_bytes"]));
    assert_eq!(get("cairn_ram_cache_bytes"), u(&i["ram_cache_bytes"]));
    let ram = |k: &str| s[k].as_f64().unwrap_or(0.0);
    assert_eq!(get("cairn_ram_cache_hits_total"), ram("ram_cache_hits"));
    assert_eq!(get("cairn_ram_cache_misses_total"), ram("ram_cache_misses"));
    let ssd = |k: &str| s["ssd_cache"][k].as_f64().unwrap_or(0.0);
    assert_eq!(get("cairn_ssd_cache_hits_total"), ssd("hits"));
    assert_eq!(get("cairn_ssd_cache_misses_total"), ssd("misses"));
    let (mut pr, mut pw) = (0.0, 0.0);
    for d in s["devices"].as_array().unwrap() {
        let l = format!(
            "{{device=\"{}\",class=\"{}\",role=\"{}\"}}",
            d["id"],
            d["class"].as_str().unwrap(),
            d["role"].as_str().unwrap()
        );
        for (metric, key) in [
            ("cairn_device_read_bytes_total", "read_bytes"),
            ("cairn_device_written_bytes_total", "written_bytes"),
            ("cairn_device_read_errors_total", "read_errors"),
            ("cairn_device_write_errors_total", "write_errors"),
        ] {
            assert_eq!(get(&format!("{metric}{l}")), u(&d[key]), "{metric}{l}");
        }
        pr += u(&d["read_bytes"]);
        pw += u(&d["written_bytes"]);
    }
    assert_eq!(get("cairn_physical_read_bytes_total"), pr);
    assert_eq!(get("cairn_physical_written_bytes_total"), pw);
    assert!(pw >= bytes as f64, "devices wrote {pw} of {bytes}");
    for d in i["devices"].as_array().unwrap() {
        let l = format!(
            "{{device=\"{}\",class=\"{}\",role=\"{}\"}}",
            d["id"],
            d["class"].as_str().unwrap(),
            d["role"].as_str().unwrap()
        );
        for (metric, key) in [
            ("cairn_device_used_bytes", "used"),
            ("cairn_device_size_bytes", "size"),
            ("cairn_device_segments", "segments"),
            ("cairn_device_hot_segments", "hot_segments"),
            ("cairn_device_write_errors_total", "write_errors"),
        ] {
            assert_eq!(get(&format!("{metric}{l}")), u(&d[key]), "{metric}{l}");
        }
        let fill = get(&format!("cairn_device_fill_ratio{l}"));
        assert!((fill - u(&d["used"]) / u(&d["size"])).abs() < 1e-9);
    }
    for t in s["tasks"].as_array().unwrap() {
        let l = format!("{{task=\"{}\"}}", t["task"].as_str().unwrap());
        for (metric, key) in [
            ("cairn_maintenance_runs_total", "runs"),
            ("cairn_maintenance_processed_bytes_total", "processed_bytes"),
            ("cairn_maintenance_reclaimed_bytes_total", "reclaimed_bytes"),
        ] {
            assert_eq!(get(&format!("{metric}{l}")), u(&t[key]), "{metric}{l}");
        }
    }
    for t in ["scrub", "gc", "reblock", "prune"] {
        let l = format!("{{task=\"{t}\"}}");
        assert!(
            get(&format!("cairn_maintenance_runs_total{l}")) >= 1.0,
            "{t}"
        );
        assert_eq!(get(&format!("cairn_maintenance_running{l}")), 0.0, "{t}");
        assert_eq!(
            get(&format!("cairn_maintenance_progress_ratio{l}")),
            1.0,
            "{t}"
        );
    }
    assert!(get("cairn_maintenance_processed_bytes_total{task=\"scrub\"}") >= bytes as f64 / 2.0);
    assert_eq!(get("cairn_scrub_damaged_chunks_total"), 0.0);
    assert_eq!(
        get("cairn_tier_promoted_bytes_total"),
        u(&s["promoted_bytes"])
    );
    assert_eq!(
        get("cairn_tier_demoted_bytes_total"),
        u(&s["demoted_bytes"])
    );
    // Frontends: FUSE and NBD bytes, and their sum as logical bytes.
    let fuse_w = u(&i["fuse"]["write_bytes"]);
    assert_eq!(get("cairn_fuse_write_bytes_total"), fuse_w);
    // (copy0 was made by copy_file_range, not written.)
    assert!(fuse_w >= bytes as f64);
    let nbd = &i["nbd"][0];
    // Servers by index: the address (here a socket's path) is no label.
    let srv = "0";
    let nbd_w = u(&nbd["stats"]["commands"]["write"]["bytes"]);
    assert_eq!(nbd_w, (1 << 20) as f64);
    assert_eq!(
        get(&format!(
            "cairn_nbd_bytes_total{{server=\"{srv}\",command=\"write\"}}"
        )),
        nbd_w
    );
    assert_eq!(get("cairn_logical_written_bytes_total"), fuse_w + nbd_w);
    let nbd_r = u(&nbd["stats"]["commands"]["read"]["bytes"]);
    assert!(get("cairn_logical_read_bytes_total") >= nbd_r + u(&i["fuse"]["read_bytes"]));
    assert_eq!(
        get(&format!("cairn_nbd_workers{{server=\"{srv}\"}}")),
        u(&nbd["stats"]["pool"]["workers"])
    );
    assert!(
        get(&format!(
            "cairn_nbd_queue_wait_seconds_count{{server=\"{srv}\"}}"
        )) >= 2.0
    );
    // Over io_uring, the FUSE worker pool (the kernel here has it, and
    // --enable-uring-module turned it on if it was off).
    let fw = &i["fuse_workers"];
    assert!(fw.is_object(), "no FUSE worker pool in info: {fw}");
    assert_eq!(get("cairn_fuse_workers"), u(&fw["workers"]));
    assert!(get("cairn_fuse_queue_wait_seconds_count") >= 1.0);
    assert!(get("cairn_fuse_requests_total{op=\"write\"}") > 0.0);
    assert!(get("cairn_fuse_request_duration_seconds_count{op=\"write\"}") > 0.0);
    // No path or name of the pool in what anyone may read.
    let tmp = p.pool.parent().unwrap().display().to_string();
    for route in ["/metrics", "/api/metrics", "/api/heatmap"] {
        let (st, body) = http(port, "GET", route);
        assert_eq!(st, 200, "{route}");
        for secret in [tmp.as_str(), "nbd.sock", "secret"] {
            assert!(!body.contains(secret), "{route} gives {secret:?}");
        }
    }
    assert_eq!(http(port, "GET", "/api/info").0, 403);
    // Read-only: other methods are refused.
    assert_eq!(http(port, "POST", "/metrics").0, 405);
    assert_eq!(http(port, "DELETE", "/api/info").0, 405);
    cairn(&[&"umount", &p.mnt]);
}

/// The kernel opens and closes files of a live pool without asking the
/// daemon (crates/fuse/src/opens.rs): 50 files made, then each opened ten
/// times to read and once to append, cost at most the one OPEN and the one
/// CREATE that teach the kernel, and no RELEASE at all.
#[test]
fn opens_and_closes_of_a_live_pool_reach_no_daemon() {
    let p = Pool::new("");
    let port = free_port();
    mount_with_metrics(&p, port);
    let d = p.mnt.join("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..50 {
        std::fs::write(d.join(format!("f{i}")), format!("file {i}\n")).unwrap();
    }
    for i in 0..50 {
        let f = d.join(format!("f{i}"));
        for _ in 0..10 {
            assert_eq!(std::fs::read(&f).unwrap(), format!("file {i}\n").as_bytes());
        }
        let mut a = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
        a.write_all(b"more\n").unwrap();
    }
    for i in 0..50 {
        let got = std::fs::read(d.join(format!("f{i}"))).unwrap();
        assert_eq!(got, format!("file {i}\nmore\n").as_bytes(), "f{i}");
    }
    let (st, text) = http(port, "GET", "/metrics");
    assert_eq!(st, 200);
    let m = parse_metrics(&text);
    let n = |op: &str| m[&format!("cairn_fuse_requests_total{{op=\"{op}\"}}")];
    assert!(
        n("open") <= 1.0,
        "{} OPEN requests for 600 opens",
        n("open")
    );
    assert!(n("create") <= 1.0, "{} CREATE requests", n("create"));
    assert_eq!(n("release"), 0.0, "RELEASE requests for 600 closes");
    // The kernel makes each new file with MKNOD (the no-open mode).
    assert!(
        n("mknod") >= 50.0,
        "{} MKNOD requests for 50 new files",
        n("mknod")
    );
    assert!(
        n("write") >= 100.0,
        "{} WRITE requests for 100 writes",
        n("write")
    );
    cairn(&[&"umount", &p.mnt]);
}

/// A name looked up and not found in the live tree is remembered by the
/// kernel (a negative entry): asking again for it reaches no daemon, and
/// making it through the mount shows it at once. Names that can appear
/// behind the kernel's back are asked for every time: a snapshot taken
/// after `.snapshots/NAME` was not found is there at once.
#[test]
fn missing_names_of_the_live_tree_are_remembered_by_the_kernel() {
    let p = Pool::new("");
    let port = free_port();
    mount_with_metrics(&p, port);
    let lookups = || {
        let (_, text) = http(port, "GET", "/metrics");
        parse_metrics(&text)["cairn_fuse_requests_total{op=\"lookup\"}"]
    };
    let d = p.mnt.join("d");
    std::fs::create_dir(&d).unwrap();
    let missing = d.join("not-yet");
    let before = lookups();
    for _ in 0..100 {
        let e = std::fs::metadata(&missing).expect_err("a missing name was found");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
    let asked = lookups() - before;
    assert!(
        asked <= 2.0,
        "{asked} LOOKUPs for 100 stats of one missing name"
    );
    std::fs::write(&missing, b"made").unwrap();
    assert_eq!(std::fs::read(&missing).unwrap(), b"made");
    std::fs::rename(&missing, d.join("moved")).unwrap();
    assert!(!missing.exists());
    std::fs::create_dir(&missing).unwrap();
    assert!(missing.is_dir());

    // A view name of a TID not reached yet: missing now, there once the
    // pool has committed that far.
    let tid = info(&p.mnt)["current_tid"].as_u64().expect("current_tid");
    let ahead = d.join(format!("moved@@0x{:x}", tid + 2));
    assert!(!ahead.exists(), "a view of a TID not reached yet");
    for i in 0..10 {
        if info(&p.mnt)["current_tid"].as_u64().unwrap() >= tid + 2 {
            break;
        }
        std::fs::write(d.join(format!("tick{i}")), b"tick").unwrap();
        cairn(&[&"sync", &p.mnt]);
    }
    assert!(
        ahead.is_file(),
        "a view name not found before its TID stays hidden"
    );

    let snap = p.mnt.join(".snapshots").join("later");
    assert!(!snap.exists(), "a snapshot before it was taken");
    let out = cairn(&[&"snapshot", &"create", &p.mnt, &"later"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        snap.join("d").join("moved").is_file(),
        "a snapshot taken after its name was not found stays hidden"
    );
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

/// Markup a pool string could smuggle into the page: shown as text, it
/// runs nothing; parsed as HTML, its handler sets `window.__xss`.
const PAYLOAD: &str = "<img src=x onerror=window.__xss=1>";

#[test]
fn dashboard_in_headless_chromium() {
    let dir = Path::new(ROOT).join("crates/cli/tests/browser");
    // npm ci only when node_modules is not already what the lock file
    // names (playwright-core alone: it downloads no browser).
    let lock = std::fs::read_to_string(dir.join("package-lock.json")).unwrap();
    let installed = std::fs::read_to_string(dir.join("node_modules/.package-lock.json"));
    let same = installed.is_ok_and(|i| {
        let (a, b): (Json, Json) = (
            serde_json::from_str(&i).unwrap_or_default(),
            serde_json::from_str(&lock).unwrap(),
        );
        let want = b["packages"].as_object().unwrap();
        want.iter()
            .filter(|(k, _)| !k.is_empty())
            .all(|(k, v)| a["packages"][k]["integrity"] == v["integrity"])
    });
    if !same {
        run(Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--silent"])
            .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
            .current_dir(&dir));
    }
    // Two tiers (heat map rows); the pool's directory, hence its path and
    // its devices' paths, and a snapshot's name carry the payload. The
    // detailed API on (paths and names), a token the browser logs in with.
    let p = Pool::with(
        PAYLOAD,
        &[("nvme", "64M"), ("hdd", "256M")],
        &[],
        "metrics_detail = true",
    );
    let token = "dashboard-t0ken";
    set_token(&p, token, 0o600);
    let port = free_port();
    mount_with_metrics(&p, port);
    assert_eq!(http(port, "GET", "/").0, 401);
    let bytes = workload(&p.mnt, 4);
    let evil_snap = PAYLOAD.replace("__xss=1", "__xss=2");
    for name in ["snap0", evil_snap.as_str()] {
        cairn(&[&"snapshot", &"create", &p.mnt, &name]);
    }
    cairn(&[&"sync", &p.mnt]);
    std::thread::sleep(Duration::from_millis(2500));
    // The figures the page must show: before the script writes more.
    let i = info(&p.mnt);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&shots).unwrap();
    let out = run(Command::new("node")
        .env("CAIRN_METRICS_TOKEN", token)
        .arg(dir.join("dashboard.mjs"))
        .arg(format!("http://127.0.0.1:{port}/"))
        .arg(&p.mnt)
        .arg(&shots)
        .current_dir(&dir));
    let page: Json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(page["files"].as_u64(), Some(4), "{page}");
    assert_eq!(page["logical"].as_u64(), Some(bytes));
    assert_eq!(page["logical"], i["logical_bytes"]);
    assert_eq!(page["snapshots"].as_u64(), Some(2));
    assert_eq!(page["timeline"].as_u64(), Some(2));
    assert_eq!(page["device0_used"], i["devices"][0]["used"]);
    assert_eq!(page["device0_size"], i["devices"][0]["size"]);
    assert!(page["tid"].as_u64().unwrap() >= i["current_tid"].as_u64().unwrap());
    let (w0, w1) = (
        page["written_before"].as_u64().unwrap(),
        page["written_after"].as_u64().unwrap(),
    );
    assert!(w1 > w0, "the page's written counter did not move: {page}");
    assert!(
        page["points_after"].as_u64() > page["points_before"].as_u64(),
        "{page}"
    );
    // Pool strings shown literally, nothing injected or run.
    let pool_text = page["pool_text"].as_str().unwrap();
    assert!(pool_text.contains(PAYLOAD), "{pool_text}");
    let paths = page["path_cells"].as_array().unwrap();
    assert_eq!(paths.len(), 2);
    for (k, t) in paths.iter().enumerate() {
        let t = t.as_str().unwrap();
        assert!(
            t.contains(PAYLOAD) && t.ends_with(&format!("data.{k}")),
            "{t}"
        );
    }
    // Each device's state (online, missing, faulted) is shown.
    let states = page["state_cells"].as_array().unwrap();
    assert_eq!(states.len(), 2, "{page}");
    assert!(states.iter().all(|s| s == "online"), "{states:?}");
    let names: Vec<&str> = page["snapshot_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(names.contains(&evil_snap.as_str()), "{names:?}");
    assert_eq!(page["injected_imgs"].as_u64(), Some(0), "{page}");
    assert_eq!(page["injected_onerror"].as_u64(), Some(0), "{page}");
    assert!(page["xss"].is_null(), "a payload ran: {page}");
    assert_eq!(page["dialogs"].as_array().unwrap().len(), 0);
    assert_eq!(
        page["page_errors"].as_array().unwrap().len(),
        0,
        "{}",
        page["page_errors"]
    );
    // Heat map: one row per device, one cell per slot (small pool), every
    // segment in a cell.
    let seg = i["segment_size"].as_u64().unwrap();
    let hm = page["heatmap"].as_array().unwrap();
    assert_eq!(hm.len(), 2, "{page}");
    for (row, d) in hm.iter().zip(i["devices"].as_array().unwrap()) {
        let slots = d["size"].as_u64().unwrap() / seg;
        assert_eq!(row["device"], d["id"]);
        assert_eq!(row["slots"].as_u64(), Some(slots));
        assert_eq!(row["per_cell"].as_u64(), Some(1));
        assert_eq!(row["cells"].as_u64(), Some(slots));
        assert_eq!(row["drawn"].as_u64(), Some(slots));
        assert_eq!(row["segments"], d["segments"], "{row} {d}");
        assert_eq!(row["painted"], Json::Bool(true));
    }
    assert!(shots.join("dashboard.png").exists());
    // CAIRN_SAVE_SCREENSHOT=1 refreshes docs/dashboard.png (shown in docs/service.md).
    if std::env::var_os("CAIRN_SAVE_SCREENSHOT").is_some() {
        std::fs::copy(
            shots.join("dashboard.png"),
            Path::new(ROOT).join("docs/dashboard.png"),
        )
        .unwrap();
    }
    cairn(&[&"umount", &p.mnt]);
}

/// Writes `token` to a file beside the pool (mode `mode`) and names it as
/// the pool's metrics_token_file.
fn set_token(p: &Pool, token: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let f = p.pool.parent().unwrap().join("metrics.token");
    std::fs::write(&f, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
    let cfg = p.pool.join("cairn.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let mut text: String = text
        .lines()
        .filter(|l| !l.starts_with("metrics_token_file"))
        .map(|l| format!("{l}\n"))
        .collect();
    text.push_str(&format!(
        "metrics_token_file = {:?}\n",
        f.display().to_string()
    ));
    std::fs::write(&cfg, text).unwrap();
}

#[test]
fn metrics_token_and_detail_switch_of_a_mount() {
    let p = Pool::new("");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let token = "mount-t0ken-4242";
    // A token file others may read: no mount, and the reason.
    set_token(&p, token, 0o644);
    let out = Command::new(CAIRN)
        .arg("mount")
        .arg(&p.pool)
        .arg(&p.mnt)
        .args(["--metrics", &addr])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a token file of mode 644 was accepted"
    );
    assert!(err.contains("chmod 600") && !err.contains(token), "{err}");
    assert!(!p.mounted());
    set_token(&p, token, 0o600);
    cairn(&[
        &"mount",
        &p.pool,
        &p.mnt,
        &"--metrics",
        &addr,
        &"--metrics-detail",
    ]);
    let bearer = format!("Authorization: Bearer {token}\r\n");
    for route in ["/", "/metrics", "/api/metrics", "/api/info"] {
        assert_eq!(http(port, "GET", route).0, 401, "{route}");
        let wrong = http_auth(port, "GET", route, "Authorization: Bearer x\r\n");
        assert_eq!(wrong.0, 401, "{route}");
        assert_eq!(http_auth(port, "GET", route, &bearer).0, 200, "{route}");
    }
    // The detail switch: the pool's path for whoever has the token.
    let (_, body) = http_auth(port, "GET", "/api/info", &bearer);
    let pool = p.pool.display().to_string();
    assert!(body.contains(&pool), "{body}");
    cairn(&[&"umount", &p.mnt]);
    let log = std::fs::read_to_string(p.pool.join("cairn.log")).unwrap();
    assert!(!log.contains(token), "the token is in the log");
}

/// A client with a 4 KiB receive buffer that pipelines `n` GETs of
/// /metrics and never reads (its writes from a thread: they block once
/// the server stops reading). Connected while the value lives.
fn stalled_client(port: u16, n: usize) -> socket2::Socket {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    s.connect(&addr.into()).unwrap();
    let mut w = s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    std::thread::spawn(move || {
        let req = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
        for _ in 0..n {
            if w.write_all(req).is_err() {
                return;
            }
        }
    });
    s
}

#[test]
fn a_metrics_client_that_never_reads_stalls_neither_scrapes_nor_umount() {
    let p = Pool::new("");
    let port = free_port();
    mount_with_metrics(&p, port);
    let bad = stalled_client(port, 2000);
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    let (st, text) = http(port, "GET", "/metrics");
    assert_eq!(st, 200);
    assert!(text.contains("cairn_tid"));
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // umount returns within seconds while the client is still connected.
    let t0 = Instant::now();
    let mut umount = Command::new(CAIRN)
        .arg("umount")
        .arg(&p.mnt)
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(st) = umount.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = umount.kill();
            panic!("cairn umount still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = t0.elapsed();
    assert!(status.success());
    eprintln!("cairn umount took {took:?} with the stalled client connected");
    assert!(took < Duration::from_secs(10), "cairn umount took {took:?}");
    assert!(!p.mounted());
    drop(bad);
}

#[test]
fn heatmap_of_a_big_pool_is_bounded() {
    // 64 GiB sparse: 16384 slots of 4 MiB, more than the page's 4096 cells.
    let p = Pool::with("", &[("ssd", "64G")], &["--sparse"], "");
    let port = free_port();
    mount_with_metrics(&p, port);
    workload(&p.mnt, 2);
    cairn(&[&"sync", &p.mnt]);
    let i = info(&p.mnt);
    let slots = i["devices"][0]["size"].as_u64().unwrap() / i["segment_size"].as_u64().unwrap();
    assert!(slots > 4096, "{slots} slots");
    for cells in [4096u64, 100] {
        let (st, body) = http(port, "GET", &format!("/api/heatmap?cells={cells}"));
        assert_eq!(st, 200);
        let hm: Json = serde_json::from_str(&body).unwrap();
        let row = &hm[0];
        let per = row["slots_per_cell"].as_u64().unwrap();
        let n = row["heat"].as_array().unwrap().len() as u64;
        assert_eq!(per, slots.div_ceil(cells));
        assert!(n <= cells && n * per >= slots, "{n} cells of {per}");
        let segs: u64 = row["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .sum();
        assert_eq!(Some(segs), i["devices"][0]["segments"].as_u64());
    }
    // The answer stays small (a few bytes per cell).
    let (_, body) = http(port, "GET", "/api/heatmap?cells=1000000");
    assert!(body.len() < 1 << 20, "{} bytes", body.len());
    cairn(&[&"umount", &p.mnt]);
}

#[test]
fn install_service_script_into_a_staging_root() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let prefix = "/opt/cairn-staged";
    let out = run(Command::new("bash")
        .arg(Path::new(ROOT).join("scripts/install-service.sh"))
        .env("BIN", CAIRN)
        .env("DESTDIR", r)
        .env("PREFIX", prefix));
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains("installed into"), "{log}");
    assert!(
        !Path::new(prefix).exists(),
        "wrote outside DESTDIR: {prefix}"
    );
    let at = |p: &str| r.join(p.trim_start_matches('/'));
    let exe = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o111
            != 0
    };
    let bin = at(&format!("{prefix}/bin/cairn"));
    assert!(exe(&bin));
    let v = run(Command::new(&bin).arg("--version"));
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("cairn"));
    let helper = at("/sbin/mount.fuse.cairn");
    assert!(exe(&helper));
    let h = std::fs::read_to_string(&helper).unwrap();
    assert!(h.contains(&format!("{prefix}/bin/cairn")), "{h}");
    run(Command::new("sh").arg("-n").arg(&helper));
    let unit = std::fs::read_to_string(at("/etc/systemd/system/cairn@.service")).unwrap();
    assert!(
        unit.contains(&format!("ExecStart={prefix}/bin/cairn service mount %i")),
        "{unit}"
    );
    assert!(unit.contains("ConditionPathExists=/etc/cairn/%i.toml"));
    let snap = std::fs::read_to_string(at("/etc/systemd/system/cairn-snapshot@.service")).unwrap();
    assert!(snap.contains(&format!("ExecStart={prefix}/bin/cairn service snapshot %i")));
    let timer = std::fs::read_to_string(at("/etc/systemd/system/cairn-snapshot@.timer")).unwrap();
    assert!(timer.contains("OnCalendar=") && timer.contains("WantedBy=timers.target"));
    // Man pages: the top page and one per subcommand, valid roff.
    let man = at(&format!("{prefix}/share/man/man1"));
    for page in [
        "cairn.1",
        "cairn-mount.1",
        "cairn-snapshot-create.1",
        "cairn-prune.1",
    ] {
        let t = std::fs::read_to_string(man.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(t.contains(".TH"), "{page}");
    }
    let pages = std::fs::read_dir(&man).unwrap().count();
    assert!(pages > 20, "{pages} man pages");
    if Command::new("man").arg("--version").output().is_ok() {
        let o = run(Command::new("man")
            .args(["-l", "-P", "cat"])
            .arg(man.join("cairn-snapshot-create.1"))
            .env("MANWIDTH", "100"));
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("snapshot"), "{text}");
    }
    // Completions for three shells.
    let bash = at("/etc/bash_completion.d/cairn");
    run(Command::new("bash").arg("-n").arg(&bash));
    let b = std::fs::read_to_string(&bash).unwrap();
    assert!(b.contains("complete") && b.contains("snapshot"));
    let zsh =
        std::fs::read_to_string(at(&format!("{prefix}/share/zsh/site-functions/_cairn"))).unwrap();
    assert!(
        zsh.starts_with("#compdef cairn"),
        "{}",
        &zsh[..40.min(zsh.len())]
    );
    let fish = std::fs::read_to_string(at(&format!(
        "{prefix}/share/fish/vendor_completions.d/cairn.fish"
    )))
    .unwrap();
    assert!(fish.contains("complete -c cairn"));
    assert!(at("/etc/cairn/example.toml.sample").exists());
    // The completion answers: bash completes `cairn snap` to `snapshot`.
    let o = run(Command::new("bash").arg("-c").arg(format!(
        "source {}; COMP_WORDS=(cairn snap); COMP_CWORD=1; COMP_LINE='cairn snap'; COMP_POINT=10; _cairn cairn snap cairn; echo \"${{COMPREPLY[@]}}\"",
        bash.display()
    )));
    let words = String::from_utf8_lossy(&o.stdout);
    assert!(words.split_whitespace().any(|w| w == "snapshot"), "{words}");
}
