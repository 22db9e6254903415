//! The HTTP frontend against a real two-tier pool opened in this process:
//! after a workload that runs every maintenance task, `/metrics` holds
//! every family the fs layer provides, with values that agree with the
//! pool's own accounts; `/api/heatmap` has one cell per slot, or bounded
//! cells that cover every slot and segment; the page is served with a
//! content security policy; anything but GET and HEAD is refused.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use cairn_devices::{DeviceClass, DeviceSpec};
use cairn_fs::{mkfs, Ctx, Fs, MkfsOptions, Pool, PoolConfig, ROOT_INO};
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// An nvme device of 17 MiB and an hdd device of 65 MiB (4 and 16 slots
/// of 4 MiB), a RAM read cache, heat that counts from the second read.
fn make(dir: &Path) -> Arc<Fs> {
    let mut o = MkfsOptions {
        sparse: true,
        ..MkfsOptions::default()
    };
    for (class, name, size) in [
        (DeviceClass::Nvme, "fast", 17),
        (DeviceClass::Hdd, "slow", 65),
    ] {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        o.devices
            .push(DeviceSpec::tier(class, dir.join(name), Some(size * MIB)));
    }
    mkfs(&dir.join("pool"), o).unwrap();
    let mut c = PoolConfig {
        tier_demote_idle_secs: 0,
        tier_promote_hits: 2.0,
        ..PoolConfig::default()
    };
    c.read_cache_mib = 16;
    Fs::open(Pool::open(&dir.join("pool"), Some(c)).unwrap()).unwrap()
}

fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// (status, headers, body) of `METHOD path`.
fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "{method} {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
    let status = head.split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The families the fs layer provides (FUSE, NBD and the logical totals
/// come from the binary's closures: tests/service.rs in cairn-cli).
pub const FAMILIES: &[&str] = &[
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
];

/// Every `# TYPE` family of an exposition.
fn families(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(|f| f.to_string())
        .collect()
}

#[test]
fn metrics_heatmap_and_page_of_a_two_tier_pool() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let fs = make(d.path());
    // 30 MiB: spills from the fast device to the slow one.
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    let data = noise(30 << 20, 3);
    for (i, part) in data.chunks(1 << 20).enumerate() {
        fs.write(f.ino, (i << 20) as u64, part).unwrap();
    }
    fs.flush().unwrap();
    fs.snapshot_create("one", cairn_fs::SnapshotKind::Named)
        .unwrap();
    // Overwrite a third (garbage for GC), read everything three times
    // (heat, RAM cache hits), then every task once.
    for (i, part) in noise(10 << 20, 4).chunks(1 << 20).enumerate() {
        fs.write(f.ino, (i << 20) as u64, part).unwrap();
    }
    fs.flush().unwrap();
    fs.snapshot_create("two", cairn_fs::SnapshotKind::Named)
        .unwrap();
    for _ in 0..3 {
        let mut off = 0;
        while off < 30 << 20 {
            let b = fs.read(f.ino, off, 1 << 20).unwrap();
            assert!(!b.is_empty());
            off += b.len() as u64;
        }
    }
    fs.migrate(&|_, _| {}).unwrap();
    fs.gc(90, 0, &|_, _| {}).unwrap();
    fs.scrub(&|_, _| {}).unwrap();
    fs.prune(&fs.prune_policy(), false).unwrap();

    let opts = cairn_http::Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        allow_remote: false,
        scan_interval: Duration::from_secs(3600),
        detail: false,
        token: None,
    };
    let srv = cairn_http::serve(fs.clone(), opts, Vec::new()).unwrap();
    let addr = srv.addr();
    // The first scan runs at start.
    std::thread::sleep(Duration::from_millis(500));
    let (st, _, text) = http(addr, "GET", "/metrics");
    assert_eq!(st, 200);
    let fams = families(&text);
    for f in FAMILIES {
        assert!(fams.iter().any(|x| x == f), "no family {f} in\n{text}");
    }
    let m = parse(&text);
    let s = fs.service_stats().unwrap();
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("no {k} in\n{text}"));
    assert_eq!(get("cairn_snapshots"), 2.0);
    let (hits, misses) = (s.ram_cache_hits.unwrap(), s.ram_cache_misses.unwrap());
    assert!(
        hits > 0 && misses > 0,
        "RAM cache: {hits} hits {misses} misses"
    );
    assert_eq!(get("cairn_ram_cache_hits_total"), hits as f64);
    assert_eq!(get("cairn_ram_cache_misses_total"), misses as f64);
    let written: u64 = s.devices.iter().map(|d| d.written_bytes).sum();
    assert!(written >= 40 << 20, "devices wrote {written}");
    assert_eq!(get("cairn_physical_written_bytes_total"), written as f64);
    let read: u64 = s.devices.iter().map(|d| d.read_bytes).sum();
    assert_eq!(get("cairn_physical_read_bytes_total"), read as f64);
    for d in &s.devices {
        let l = format!(
            "{{device=\"{}\",class=\"{}\",role=\"{}\"}}",
            d.id, d.class, d.role
        );
        assert_eq!(
            get(&format!("cairn_device_written_bytes_total{l}")),
            d.written_bytes as f64
        );
        assert_eq!(get(&format!("cairn_device_read_errors_total{l}")), 0.0);
    }
    for t in ["gc", "reblock", "scrub", "prune", "migrate"] {
        let runs = get(&format!("cairn_maintenance_runs_total{{task=\"{t}\"}}"));
        assert_eq!(runs, if t == "reblock" { 0.0 } else { 1.0 }, "{t}");
        if t != "reblock" {
            let p = get(&format!("cairn_maintenance_progress_ratio{{task=\"{t}\"}}"));
            assert_eq!(p, 1.0, "{t} progress");
        }
    }
    assert!(get("cairn_maintenance_processed_bytes_total{task=\"scrub\"}") > 0.0);
    let moved = s.promoted_bytes + s.demoted_bytes;
    assert_eq!(
        get("cairn_tier_promoted_bytes_total") + get("cairn_tier_demoted_bytes_total"),
        moved as f64
    );
    assert_eq!(
        get("cairn_maintenance_processed_bytes_total{task=\"migrate\"}"),
        moved as f64
    );
    assert!(get("cairn_flush_duration_seconds_count") >= 2.0);
    assert!(get("cairn_commit_metadata_duration_seconds_count") >= 2.0);
    let info = cairn_fs::maintenance::info::pool_info(fs.pool()).unwrap();
    assert_eq!(get("cairn_stored_bytes"), info.stored_bytes as f64);
    assert_eq!(get("cairn_dedup_ratio"), info.dedup_ratio);
    assert_eq!(get("cairn_compression_ratio"), info.compression_ratio);

    // Heat map: one cell per slot by default, every segment in a cell.
    let (st, _, body) = http(addr, "GET", "/api/heatmap");
    assert_eq!(st, 200);
    let hm: Value = serde_json::from_str(&body).unwrap();
    let tiers = fs.tier_status();
    assert_eq!(hm.as_array().unwrap().len(), tiers.len());
    let seg = fs.pool().sb.segment_size;
    for (row, t) in hm.as_array().unwrap().iter().zip(&tiers) {
        let slots = t.device.size / seg;
        assert_eq!(row["slots"].as_u64(), Some(slots));
        assert_eq!(row["slots_per_cell"].as_u64(), Some(1));
        assert_eq!(row["heat"].as_array().unwrap().len() as u64, slots);
        let segs: u64 = row["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .sum();
        assert_eq!(segs, t.device.segments, "device {}", t.device.id);
        let hottest = row["heat"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .fold(0.0, f64::max);
        assert_eq!(hottest > 0.0, t.heat_sum > 0.0);
    }
    // Bounded: at most `cells` cells, covering every slot and segment.
    let (_, _, body) = http(addr, "GET", "/api/heatmap?cells=5");
    let hm: Value = serde_json::from_str(&body).unwrap();
    for (row, t) in hm.as_array().unwrap().iter().zip(&tiers) {
        let slots = t.device.size / seg;
        let per = row["slots_per_cell"].as_u64().unwrap();
        let n = row["heat"].as_array().unwrap().len() as u64;
        assert!(n <= 5, "{n} cells");
        assert_eq!(per, slots.div_ceil(5));
        assert_eq!(n, slots.div_ceil(per));
        let segs: u64 = row["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .sum();
        assert_eq!(segs, t.device.segments);
    }

    // The page: a content security policy (no inline script), no data
    // in its markup.
    let (st, head, body) = http(addr, "GET", "/");
    assert_eq!(st, 200);
    assert!(
        head.contains("Content-Security-Policy: default-src 'none'; script-src 'self'"),
        "{head}"
    );
    assert!(!body.contains("onerror") && !body.contains("<script>"));
    let (_, _, js) = http(addr, "GET", "/dashboard.js");
    for sink in [
        ".innerHTML",
        ".outerHTML",
        "insertAdjacentHTML",
        "document.write",
    ] {
        assert!(!js.contains(sink), "the dashboard script uses {sink}");
    }
    assert_eq!(http(addr, "POST", "/metrics").0, 405);
    assert_eq!(http(addr, "PUT", "/api/heatmap").0, 405);
    srv.shutdown();
    fs.shutdown().unwrap();
}
