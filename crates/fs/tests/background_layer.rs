//! How background work yields to requests: the flusher runs at the lower
//! CPU priority `background_nice` gives it, and a pool with small records
//! starts a flush only once half the dirty limit is buffered (its commits
//! are mostly metadata, cheaper per block in larger groups), while a pool
//! with the default records starts one after an eighth is written.

use cairn_fs::{mkfs, Ctx, Fs, MkfsOptions, Pool, PoolConfig, ROOT_INO};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::noise;

/// The background priority the test pools ask for (not the default, so
/// that the test sees it applied).
const NICE: u32 = 7;

/// A pool with `record` bytes per block, an 8 MiB dirty limit and no timed
/// commits, so that only the write throttle starts a flush.
fn pool(dir: &Path, record: u32) -> Arc<Fs> {
    let o = MkfsOptions {
        sparse: true,
        record_size: record,
        ..MkfsOptions::default()
    };
    mkfs(&dir.join("pool"), o).unwrap();
    let config = PoolConfig {
        dirty_limit_mib: 8,
        commit_interval_secs: 3600.0,
        background_nice: NICE,
        ..PoolConfig::default()
    };
    let fs = Fs::open(Pool::open(&dir.join("pool"), Some(config)).unwrap()).unwrap();
    fs.spawn_flusher();
    fs
}

fn commits(fs: &Fs) -> u64 {
    fs.service_stats().unwrap().commits
}

/// Writes `mib` MiB of whole blocks to a new file named `name`.
fn write_mib(fs: &Fs, name: &str, mib: usize, record: usize) {
    let ino = fs
        .create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)
        .unwrap()
        .ino;
    let data = noise(mib << 20, mib as u64);
    for (i, b) in data.chunks(record).enumerate() {
        fs.write(ino, (i * record) as u64, b).unwrap();
    }
}

/// True once the pool made more than `before` commits within `wait`.
fn committed_within(fs: &Fs, before: u64, wait: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < wait {
        if commits(fs) > before {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_small_record_pool_waits_for_half_the_dirty_limit() {
    let d = tempfile::tempdir().unwrap();
    let fs = pool(d.path(), 4096);
    let c0 = commits(&fs);
    // 2 MiB written: past an eighth of the limit, below half of it.
    write_mib(&fs, "a", 2, 4096);
    assert!(
        !committed_within(&fs, c0, Duration::from_millis(1500)),
        "a 4 KiB-record pool flushed at a quarter of its dirty limit"
    );
    // 3 MiB more: past half of it.
    write_mib(&fs, "b", 3, 4096);
    assert!(
        committed_within(&fs, c0, Duration::from_secs(10)),
        "no flush with more than half the dirty limit buffered"
    );
    fs.shutdown().unwrap();
}

#[test]
fn a_default_record_pool_flushes_after_an_eighth_written() {
    let d = tempfile::tempdir().unwrap();
    let fs = pool(d.path(), 64 << 10);
    let c0 = commits(&fs);
    write_mib(&fs, "a", 2, 64 << 10);
    assert!(
        committed_within(&fs, c0, Duration::from_secs(10)),
        "no flush after a quarter of the dirty limit was written"
    );
    fs.shutdown().unwrap();
}

/// The nice value of this process's thread named `name` (field 19 of
/// /proc/self/task/TID/stat), if there is one.
fn nice_of(name: &str) -> Option<i64> {
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.join("stat")).ok()?;
        // Fields after the command name, which ends with the last ')'.
        let rest = &stat[stat.rfind(')')? + 2..];
        return rest.split(' ').nth(16)?.parse().ok();
    }
    None
}

#[test]
fn the_flusher_runs_at_the_background_priority() {
    let d = tempfile::tempdir().unwrap();
    let fs = pool(d.path(), 64 << 10);
    // SAFETY: getpriority takes plain integers; 0 is the calling thread.
    let base = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) } as i64;
    let want = (base + NICE as i64).min(19);
    let t = Instant::now();
    let mut got = None;
    while t.elapsed() < Duration::from_secs(5) && got != Some(want) {
        got = nice_of("cairn-flush");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(got, Some(want), "the flusher's nice value");
    fs.shutdown().unwrap();
}
