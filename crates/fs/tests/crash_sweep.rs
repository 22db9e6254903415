//! Crash-point sweep (issue 15): the seeded workload of
//! `common/workload.rs` runs once per seed on a two-tier pool opened with
//! a trace storage, which records every write and sync of the devices, the
//! metadata file and the intent log. For many points of that trace, the
//! files are rebuilt as a power loss there would leave them (unsynced
//! writes dropped, a random subset of them kept, or the last one torn at a
//! sector boundary: `cairn_devices::backend::crash`), the pool is opened
//! from them and checked against the model: the tree is exactly one of the
//! states made durable (or being made durable) when the power went, never
//! older than the last one acknowledged; every acknowledged snapshot reads
//! as it was taken; `check` finds no problem.
//!
//! CAIRN_CRASH_POINTS (default 2000) crash points over CAIRN_CRASH_SEEDS
//! seeds (default 8) starting at CAIRN_CRASH_SEED (default 1);
//! `scripts/crash-sweep.sh N` runs N points and reports the rate. Every
//! failure is printed with its seed, point and mode before the test fails.

mod common;

use cairn_devices::backend::{read_images, CrashMode, Images, Replay};
use cairn_devices::backend::{Event, Recorder, TraceStorage};
use cairn_devices::{DeviceClass, DeviceSpec};
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{mkfs, Fs, MkfsOptions, Pool, PoolConfig};
use common::workload::{self, Point, Rng};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

const MIB: u64 = 1 << 20;
/// The metadata reserve file (beside the metadata, in the fast device's
/// directory), relative to the test directory.
const RESERVE: &str = "fast/meta.reserve";

/// A pool of a small nvme and a small hdd device, 1 MiB segments (so gc,
/// reblock and tier moves have segments to work on).
fn make(dir: &Path) {
    let mut o = MkfsOptions {
        segment_size: MIB,
        sparse: true,
        ..MkfsOptions::default()
    };
    for (class, name, size) in [
        (DeviceClass::Nvme, "fast", 8),
        (DeviceClass::Hdd, "slow", 12),
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
        // The smallest log: every crash point copies every file whole.
        intent_log_mib: 32,
        ..PoolConfig::default()
    }
}

fn open(dir: &Path) -> Arc<Fs> {
    Fs::open(Pool::open(&dir.join("pool"), Some(config())).unwrap()).unwrap()
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One seed's run: the files when recording began, the trace and the
/// durability points.
struct Run {
    base: Images,
    trace: Vec<Event>,
    points: Vec<Point>,
}

/// Makes a pool under `dir`, opens and shuts it once (so that the intent
/// log exists), then runs the workload with every write recorded.
fn record(dir: &Path, seed: u64, ops: usize) -> Run {
    make(dir);
    open(dir).shutdown().unwrap();
    let mut base = read_images(dir, &[]).unwrap();
    // Never written through the storage (its blocks only hold room for
    // the metadata): left in place, out of the images.
    base.remove(Path::new(RESERVE));
    let rec = Recorder::new(dir).unwrap();
    let storage = Arc::new(TraceStorage::new(rec.clone()));
    let pool = Pool::open_with(&dir.join("pool"), Some(config()), storage).unwrap();
    let fs = Fs::open(pool).unwrap();
    let points = workload::run(&fs, seed, ops, &|| rec.len());
    drop(fs); // the power goes: nothing after the trace counts
    Run {
        base,
        trace: rec.take(),
        points,
    }
}

/// Where to cut one seed's trace: both ends of every durability point and
/// the event after it, then random events, `n` in all (sorted).
fn crash_points(run: &Run, n: usize, rng: &mut Rng) -> Vec<usize> {
    let from = run.points[0].acked;
    let end = run.trace.len();
    let mut ks = BTreeSet::new();
    for p in &run.points[1..] {
        ks.extend([p.started, p.acked, (p.acked + 1).min(end)]);
    }
    let mut ks: Vec<usize> = ks.into_iter().collect();
    while ks.len() > n {
        ks.remove(rng.below(ks.len() as u64) as usize);
    }
    let mut ks: BTreeSet<usize> = ks.into_iter().collect();
    while ks.len() < n.min(end - from + 1) {
        ks.insert(from + rng.below((end - from + 1) as u64) as usize);
    }
    ks.into_iter().collect()
}

/// Recovers the pool from the crash `images` (after `k` events) and
/// checks it.
fn crash_at(dir: &Path, run: &Run, k: usize, images: &Images) -> Result<(), String> {
    common::restore(dir, images, |rel| rel == Path::new(RESERVE));
    let pool = Pool::open(&dir.join("pool"), Some(config())).map_err(|e| format!("open: {e}"))?;
    let rep = check_pool(&pool).map_err(|e| format!("check: {e}"))?;
    if !rep.problems.is_empty() {
        return Err(format!("check before replay: {:?}", rep.problems));
    }
    let fs = Fs::open(pool).map_err(|e| format!("mount: {e}"))?;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| verify(&fs, &run.points, k)));
    r.unwrap_or_else(|p| Err(format!("panicked: {p:?}")))
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

#[test]
fn crash_point_sweep() {
    let total = env("CAIRN_CRASH_POINTS", 2000) as usize;
    let seeds = env("CAIRN_CRASH_SEEDS", 8).max(1);
    let first = env("CAIRN_CRASH_SEED", 1);
    let modes = [
        CrashMode::DropUnsynced,
        CrashMode::KeepRandomSubset,
        CrashMode::TearLast,
    ];
    let t0 = Instant::now();
    let (mut done, mut failures) = (0, Vec::new());
    for seed in first..first + seeds {
        // In RAM when the host has /dev/shm: every point rewrites the files.
        let shm = Path::new("/dev/shm");
        let dir = match shm.is_dir() {
            true => tempfile::tempdir_in(shm).unwrap(),
            false => tempfile::tempdir().unwrap(),
        };
        let t_rec = Instant::now();
        let run = record(dir.path(), seed, 160);
        let t_rec = t_rec.elapsed().as_secs_f64();
        let mut replay = Replay::new(run.base.clone(), &run.trace);
        let mut rng = Rng::new(seed ^ 0x5eed);
        let n = total.div_ceil(seeds as usize);
        let mut ks = crash_points(&run, n, &mut rng);
        if let Some(at) = std::env::var("CAIRN_CRASH_AT")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            ks = vec![at];
            for (i, e) in run
                .trace
                .iter()
                .enumerate()
                .take(at + 3)
                .skip(at.saturating_sub(60))
            {
                let d = match e {
                    Event::Write { off, data, .. } => format!("write {off}+{}", data.len()),
                    Event::Sync { .. } => "sync".into(),
                    Event::SetLen { len, .. } => format!("set_len {len}"),
                    Event::Punch { off, len, .. } => format!("punch {off}+{len}"),
                };
                println!("{i}: {} {d}", e.file().display());
            }
        }
        println!(
            "seed {seed}: {} events, {} durability points (recorded in {t_rec:.1} s), {} crash points",
            run.trace.len(),
            run.points.len(),
            ks.len()
        );
        for (j, &k) in ks.iter().enumerate() {
            let mode = modes[j % 3];
            let mode_seed = seed << 32 | k as u64;
            replay.advance(k);
            let images = replay.images(mode, mode_seed);
            if let Err(e) = crash_at(dir.path(), &run, k, &images) {
                let near: Vec<String> = run
                    .points
                    .iter()
                    .filter(|p| p.acked + 40 >= k && p.started <= k + 40)
                    .map(|p| format!("{} {}..{}", p.what, p.started, p.acked))
                    .collect();
                let e = format!("{e} [points near: {}]", near.join(", "));
                let line = format!(
                    "seed {seed}, crash at event {k} of {}, {mode:?} (mode seed {mode_seed}): {e}",
                    run.trace.len()
                );
                println!("FAILED {line}");
                failures.push(line);
            }
            done += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{done} crash points in {secs:.1} s ({:.1} per second), {} failed",
        done as f64 / secs,
        failures.len()
    );
    assert!(done >= total.min(2000), "only {done} crash points");
    assert!(
        failures.is_empty(),
        "{} crash points failed; first: {}",
        failures.len(),
        failures[0]
    );
}

/// The workload and the checker agree with each other: a run that ends
/// with the process gone (the pool dropped without a shutdown, the host's
/// page cache intact) reopens at its last durability point.
#[test]
fn workload_recovers_at_its_last_durability_point() {
    // Seed 778787368 renames a file onto another of its names (a no-op),
    // which the model once took for a move.
    for seed in [1, 2, 3, 4, 778787368u64] {
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
