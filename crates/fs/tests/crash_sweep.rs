//! Crash-point sweep (issue 15): the seeded workload of
//! `common/workload.rs` runs once per seed on a two-tier pool; the pool is
//! then recovered as a crash would leave it and checked against the model:
//! the tree is exactly one of the states made durable (or being made
//! durable) when the crash came, never older than the last acknowledged
//! one, every acknowledged snapshot reads as it was taken, and `check`
//! finds no problem.

mod common;

use cairn_devices::{DeviceClass, DeviceSpec};
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{mkfs, Fs, MkfsOptions, Pool, PoolConfig};
use common::workload::{self, Point};
use std::path::Path;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// A pool of a small nvme and a small hdd device, 1 MiB segments (so gc,
/// reblock and tier moves have segments to work on).
fn make(dir: &Path) {
    let mut o = MkfsOptions {
        segment_size: MIB,
        sparse: true,
        ..MkfsOptions::default()
    };
    for (class, name, size) in [
        (DeviceClass::Nvme, "fast", 24),
        (DeviceClass::Hdd, "slow", 48),
    ] {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        o.devices
            .push(DeviceSpec::tier(class, dir.join(name), Some(size * MIB)));
    }
    mkfs(&dir.join("pool"), o).unwrap();
}

fn config() -> PoolConfig {
    PoolConfig {
        read_cache_mib: 0,
        ..PoolConfig::default()
    }
}

fn open(dir: &Path) -> Arc<Fs> {
    Fs::open(Pool::open(&dir.join("pool"), Some(config())).unwrap()).unwrap()
}

/// Checks a recovered pool against the points of the run: `crash` is the
/// trace length at the crash. Returns a description of what is wrong.
fn verify(fs: &Fs, points: &[Point], crash: usize) -> Result<(), String> {
    let acked = points.iter().rposition(|p| p.acked <= crash).unwrap_or(0);
    let started = points.iter().rposition(|p| p.started < crash).unwrap_or(0);
    let got = workload::read_tree(fs);
    let candidates = &points[acked..=started.max(acked)];
    if !candidates.iter().any(|p| workload::same(&p.state, &got)) {
        let last = &points[acked];
        return Err(format!(
            "the tree is none of the states of points {acked}..={started} (last acknowledged: {} at {}): {}",
            last.what,
            last.acked,
            workload::diff(&last.state, &got)
        ));
    }
    let snaps = fs.snapshots().map_err(|e| e.to_string())?;
    for p in &points[..=started.max(acked)] {
        let Some(name) = &p.snapshot else { continue };
        let Some(s) = snaps.iter().find(|s| &s.name == name) else {
            if p.acked <= crash {
                return Err(format!("acknowledged snapshot {name} is missing"));
            }
            continue;
        };
        let at = workload::read_tree_at(fs, s.tid);
        if !workload::same(&p.state, &at) {
            return Err(format!(
                "snapshot {name}: {}",
                workload::diff(&p.state, &at)
            ));
        }
    }
    let rep = check_pool(fs.pool()).map_err(|e| e.to_string())?;
    if !rep.problems.is_empty() {
        return Err(format!("check: {:?}", rep.problems));
    }
    Ok(())
}

/// The workload and the checker agree with each other: a run that ends
/// with the process gone (the pool dropped without a shutdown, the host's
/// page cache intact) reopens at its last durability point.
#[test]
fn workload_recovers_at_its_last_durability_point() {
    for seed in 1..=4u64 {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path());
        let fs = open(dir.path());
        let step = std::sync::atomic::AtomicUsize::new(0);
        let trace = || step.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let points = workload::run(&fs, seed, 300, &trace);
        assert!(points.len() > 10, "seed {seed}: {} points", points.len());
        drop(fs);
        let fs = open(dir.path());
        if let Err(e) = verify(&fs, &points, usize::MAX) {
            panic!("seed {seed}: {e}");
        }
    }
}
