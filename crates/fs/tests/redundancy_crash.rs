//! Power loss during changes of the copies of data (issue 51): raising a
//! pool from one copy to two and re-replicating, replacing a lost device,
//! lowering two copies to one, changing one copy to parity (`ec=2+1`:
//! stripes made) and replacing a lost device of a striped pool (stripe
//! members restored from parity). Each change runs on a pool opened with
//! a trace storage (every write, sync, length change and punched hole of
//! the devices, the metadata and the intent log, in order); crash images
//! are built at both sides of every sync of the trace, at its end and at
//! random events, each of the three ways a power loss leaves unsynced
//! writes (`cairn_devices::backend::crash`). For each image the pool must
//! open (a slot claimed twice refuses it), `check` must be clean, every
//! file must read exact, every copy of every chunk on an online device
//! must be good (a copy the table names but that was never written, or
//! whose slot was freed and punched, is caught here: `check` reads only
//! the first), and no segment may have two copies on one device. Then the
//! change is finished the way an admin would (the same command again) and
//! all that is checked once more, with the copies the policy asks for.
//!
//! The data is written and flushed before recording, so every file is
//! owed at every point. CAIRN_REDUNDANCY_POINTS caps the crash points per
//! test (default 60).

mod common;

use cairn_data::{ChunkRec, Policy};
use cairn_devices::backend::{read_images, CrashMode, Images, Replay};
use cairn_devices::backend::{Event, Recorder, TraceStorage};
use cairn_devices::{DeviceClass, DeviceSpec};
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{mkfs, Ctx, Fs, MkfsOptions, Pool, PoolConfig, ROOT_INO};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

const MIB: u64 = 1 << 20;

/// File name -> content.
type Model = BTreeMap<String, Vec<u8>>;

/// The device sizes: the first one small, so that first copies spill to
/// the second and copies land on every device.
const SIZES: [u64; 3] = [12 * MIB, 24 * MIB, 24 * MIB];

/// Never written through the storage (its blocks only hold room for the
/// metadata): left in place, out of the images.
fn is_reserve(rel: &Path) -> bool {
    rel.file_name().is_some_and(|n| n == "meta.reserve")
}

fn config() -> PoolConfig {
    PoolConfig {
        read_cache_mib: 0,
        // The smallest log: every crash point copies every file whole.
        intent_log_mib: 32,
        ..PoolConfig::default()
    }
}

fn pool_dir(dir: &Path) -> PathBuf {
    dir.join("pool")
}

/// The spec of device `i` (a directory dK under `dir`, made if missing).
fn spec(dir: &Path, i: usize, size: u64) -> DeviceSpec {
    let at = dir.join(format!("d{i}"));
    std::fs::create_dir_all(&at).unwrap();
    DeviceSpec::tier(DeviceClass::Ssd, at, Some(size))
}

/// The file of device `i`.
fn device_file(dir: &Path, i: u32) -> PathBuf {
    dir.join(format!("d{i}")).join(format!("cairn-dev-{i}.img"))
}

fn open(dir: &Path) -> Arc<Fs> {
    Fs::open(Pool::open(&pool_dir(dir), Some(config())).unwrap()).unwrap()
}

/// A pool of three ssd devices with 1 MiB segments and `policy`, holding
/// about 20 MiB of files (flushed, the pool shut down); returns them.
fn make(dir: &Path, policy: &str) -> Model {
    let o = MkfsOptions {
        segment_size: MIB,
        sparse: true,
        redundancy: policy.parse().unwrap(),
        devices: (0..3).map(|i| spec(dir, i, SIZES[i])).collect(),
        ..MkfsOptions::default()
    };
    mkfs(&pool_dir(dir), o).unwrap();
    let fs = open(dir);
    let mut model = Model::new();
    let sizes = [2_500_000, 300_000, 1_200_000, 40_000, 3_100_000, 700_000];
    for i in 0..16 {
        let name = format!("f{i}");
        let data = common::noise(sizes[i % sizes.len()], 100 + i as u64);
        let f = fs
            .create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)
            .unwrap();
        for (j, piece) in data.chunks(256 << 10).enumerate() {
            fs.write(f.ino, (j as u64) * (256 << 10), piece).unwrap();
        }
        model.insert(name, data);
    }
    fs.flush().unwrap();
    if policy.starts_with("ec=") {
        let rep = fs.resilver(true, &|_| true, &|_, _| {}).unwrap();
        assert!(rep.stripes_made > 4, "{rep:?}");
    }
    fs.shutdown().unwrap();
    model
}

/// The files when recording began and the trace of `change`, run on the
/// pool under `dir` opened with a trace storage. The pool is dropped
/// without a shutdown: the power goes when the change returns.
struct Run {
    base: Images,
    trace: Vec<Event>,
}

fn record(dir: &Path, change: impl FnOnce(&Fs)) -> Run {
    let mut base = read_images(dir, &[]).unwrap();
    base.retain(|rel, _| !is_reserve(rel));
    let rec = Recorder::new(dir).unwrap();
    let storage = Arc::new(TraceStorage::new(rec.clone()));
    let pool = Pool::open_with(&pool_dir(dir), Some(config()), storage).unwrap();
    let fs = Fs::open(pool).unwrap();
    change(&fs);
    drop(fs);
    Run {
        base,
        trace: rec.take(),
    }
}

/// Where to cut the trace: just before and just after every sync, and
/// the end; at most `max` of them (a seeded sample), plus 8 random events.
fn crash_points(trace: &[Event], max: usize, seed: u64) -> Vec<usize> {
    let mut ks = BTreeSet::new();
    for (i, e) in trace.iter().enumerate() {
        if matches!(e, Event::Sync { .. }) {
            ks.extend([i, i + 1]);
        }
    }
    ks.insert(trace.len());
    let mut rng = common::workload::Rng::new(seed);
    let mut ks: Vec<usize> = ks.into_iter().collect();
    while ks.len() > max {
        // Keep the end.
        let i = rng.below(ks.len() as u64 - 1) as usize;
        ks.remove(i);
    }
    let mut ks: BTreeSet<usize> = ks.into_iter().collect();
    for _ in 0..8 {
        ks.insert(rng.below(trace.len() as u64 + 1) as usize);
    }
    ks.into_iter().collect()
}

/// What must hold of an opened pool: every file exact, every copy of
/// every chunk on an online device good, at most `most` copies per
/// segment, no two on one device, nothing read from another copy.
fn verify(fs: &Fs, model: &Model, most: usize) -> Result<(), String> {
    for (name, want) in model {
        let f = fs
            .lookup(ROOT_INO, name.as_bytes())
            .map_err(|e| format!("{name}: {e}"))?;
        let got = fs
            .read(f.ino, 0, f.size as u32 + 1)
            .map_err(|e| format!("read {name}: {e}"))?;
        if got != *want {
            return Err(format!(
                "{name} has {} bytes, {} expected{}",
                got.len(),
                want.len(),
                if got.len() == want.len() {
                    " (content differs)"
                } else {
                    ""
                }
            ));
        }
    }
    let chunks = &fs.pool().chunks;
    let set = chunks.devices();
    for (id, s) in chunks.segment_table() {
        let places = s.places();
        let devices: BTreeSet<u32> = places.iter().map(|p| p.device).collect();
        if devices.len() != places.len() || places.len() > most {
            return Err(format!("segment {id} has copies {places:?}"));
        }
    }
    let mut recs = Vec::new();
    let r = fs.pool().meta.read().map_err(|e| e.to_string())?;
    r.for_each_chunk(|id, raw| recs.push((id, ChunkRec::decode(raw))))
        .map_err(|e| e.to_string())?;
    drop(r);
    for (id, rec) in recs {
        let rec = rec.map_err(|e| format!("chunk {id}: {e}"))?;
        let c = chunks
            .check_copies(&rec)
            .map_err(|e| format!("chunk {id}: {e}"))?;
        let bad_online: Vec<_> = (c.bad.iter().chain(&c.repaired))
            .filter(|p| set.is_online(p.device))
            .collect();
        if !bad_online.is_empty() || (c.good == 0 && !c.restored) {
            return Err(format!(
                "chunk {id} (segment {}): bad copies {bad_online:?} on online devices, {} good",
                rec.segment, c.good
            ));
        }
    }
    for (id, _) in chunks.stripe_table() {
        let c = (chunks.check_parity(id, false)).map_err(|e| format!("stripe {id}: {e}"))?;
        if c.differed > 0 {
            return Err(format!("stripe {id}: parity differs from its data: {c:?}"));
        }
    }
    let (served, repaired, _) = chunks.heal_counts();
    if served + repaired > 0 {
        return Err(format!(
            "{served} chunks served from another copy, {repaired} copies repaired"
        ));
    }
    Ok(())
}

fn clean(problems: &[String]) -> Result<(), String> {
    match problems.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "check: {} problems: {:?}",
            problems.len(),
            &problems[..problems.len().min(5)]
        )),
    }
}

/// Every segment has exactly `n` copies on online devices and the pool
/// says none is short or lost.
fn has_copies(fs: &Fs, n: usize) -> Result<(), String> {
    let chunks = &fs.pool().chunks;
    let set = chunks.devices();
    for (id, s) in chunks.segment_table() {
        let online = s
            .places()
            .iter()
            .filter(|p| set.is_online(p.device))
            .count();
        if online != n || s.places().len() != n {
            return Err(format!("segment {id} has copies {:?}", s.places()));
        }
    }
    let st = fs.redundancy_status();
    if st.short_segments + st.lost_segments > 0 {
        return Err(format!(
            "{} segments short, {} lost",
            st.short_segments, st.lost_segments
        ));
    }
    Ok(())
}

/// Every sealed segment is in a stripe (one copy) but fewer than `k`
/// that wait for one with `m`+1 copies, and nothing is short or lost.
fn has_stripes(fs: &Fs, k: usize, m: usize) -> Result<(), String> {
    let chunks = &fs.pool().chunks;
    let mut waiting = 0;
    for (id, s) in chunks.segment_table() {
        match (chunks.is_striped(id), s.places().len()) {
            (true, 1) => {}
            (false, n) if n == m + 1 => waiting += 1,
            (striped, _) => {
                return Err(format!(
                    "segment {id}: copies {:?}, striped {striped}",
                    s.places()
                ))
            }
        }
    }
    if waiting >= k || chunks.stripe_table().is_empty() {
        return Err(format!("{waiting} segments wait for a stripe"));
    }
    let st = fs.redundancy_status();
    match st.short_segments + st.lost_segments {
        0 => Ok(()),
        _ => Err(format!(
            "{} short, {} lost",
            st.short_segments, st.lost_segments
        )),
    }
}

/// One scenario: the pool under `dir` as `make` left it (and `prepare`
/// changed it), `change` recorded, and at each crash point: open, check,
/// verify (at most `most` copies a segment), `finish`, verify again with
/// at most `want` copies a segment, and what `holds` asks of the layout.
struct Scenario<'a> {
    name: &'a str,
    model: Model,
    most: usize,
    want: usize,
    finish: &'a dyn Fn(&Fs) -> Result<(), String>,
    holds: &'a dyn Fn(&Fs) -> Result<(), String>,
}

fn sweep(dir: &Path, run: &Run, s: &Scenario) {
    let max = std::env::var("CAIRN_REDUNDANCY_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let syncs = (run.trace.iter())
        .filter(|e| matches!(e, Event::Sync { .. }))
        .count();
    let ks = crash_points(&run.trace, max, 0x5eed ^ run.trace.len() as u64);
    println!(
        "{}: {} events, {syncs} syncs, {} crash points",
        s.name,
        run.trace.len(),
        ks.len()
    );
    let modes = [
        CrashMode::DropUnsynced,
        CrashMode::KeepRandomSubset,
        CrashMode::TearLast,
    ];
    let t0 = Instant::now();
    let mut replay = Replay::new(run.base.clone(), &run.trace);
    let mut failures = Vec::new();
    for (j, &k) in ks.iter().enumerate() {
        let mode = modes[j % 3];
        replay.advance(k);
        common::restore(dir, &replay.images(mode, k as u64), is_reserve);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| at_point(dir, s)));
        let r = r.unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(format!("panicked: {}", msg.unwrap_or_default()))
        });
        if let Err(e) = r {
            let line = format!(
                "{}: crash at event {k} of {} ({mode:?}): {e}",
                s.name,
                run.trace.len()
            );
            println!("FAILED {line}");
            failures.push(line);
        }
    }
    println!(
        "{}: {} crash points in {:.1} s, {} failed",
        s.name,
        ks.len(),
        t0.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} crash points failed; first: {}",
        failures.len(),
        ks.len(),
        failures[0]
    );
}

/// The checks at one crash point, then the change finished and checked.
fn at_point(dir: &Path, s: &Scenario) -> Result<(), String> {
    let pool = Pool::open(&pool_dir(dir), Some(config())).map_err(|e| format!("open: {e}"))?;
    clean(
        &check_pool(&pool)
            .map_err(|e| format!("check: {e}"))?
            .problems,
    )?;
    let fs = Fs::open(pool).map_err(|e| format!("mount: {e}"))?;
    verify(&fs, &s.model, s.most).map_err(|e| format!("after the crash: {e}"))?;
    (s.finish)(&fs).map_err(|e| format!("finishing: {e}"))?;
    verify(&fs, &s.model, s.want).map_err(|e| format!("finished: {e}"))?;
    (s.holds)(&fs).map_err(|e| format!("finished: {e}"))?;
    fs.shutdown().map_err(|e| format!("shutdown: {e}"))?;
    clean(&check_pool(fs.pool()).map_err(|e| e.to_string())?.problems)
        .map_err(|e| format!("finished: {e}"))
}

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

/// Sets the policy and re-replicates: what `cairn redundancy set` and
/// `rebuild` do.
fn set_and_rebuild(fs: &Fs, p: &str) -> Result<(), String> {
    fs.set_redundancy(policy(p)).map_err(|e| e.to_string())?;
    let rep = fs
        .resilver(true, &|_| true, &|_, _| {})
        .map_err(|e| e.to_string())?;
    if rep.short + rep.lost > 0 {
        return Err(format!("resilver left {rep:?}"));
    }
    Ok(())
}

fn shm_dir() -> tempfile::TempDir {
    // In RAM when the host has /dev/shm: every point rewrites the files.
    let shm = Path::new("/dev/shm");
    match shm.is_dir() {
        true => tempfile::tempdir_in(shm).unwrap(),
        false => tempfile::tempdir().unwrap(),
    }
}

#[test]
fn power_loss_while_copies_are_raised_to_two() {
    let d = shm_dir();
    let model = make(d.path(), "copies=1");
    let run = record(d.path(), |fs| {
        fs.set_redundancy(policy("copies=2")).unwrap();
        let rep = fs.resilver(true, &|_| true, &|_, _| {}).unwrap();
        assert!(rep.copies_made > 16, "{rep:?}");
        assert_eq!((rep.short, rep.lost), (0, 0), "{rep:?}");
        has_copies(fs, 2).unwrap();
    });
    let s = Scenario {
        name: "copies 1 -> 2",
        model,
        most: 2,
        want: 2,
        finish: &|fs| set_and_rebuild(fs, "copies=2"),
        holds: &|fs| has_copies(fs, 2),
    };
    sweep(d.path(), &run, &s);
}

#[test]
fn power_loss_while_copies_are_lowered_to_one() {
    let d = shm_dir();
    let model = make(d.path(), "copies=2");
    let run = record(d.path(), |fs| {
        has_copies(fs, 2).unwrap();
        fs.set_redundancy(policy("copies=1")).unwrap();
        let rep = fs.resilver(true, &|_| true, &|_, _| {}).unwrap();
        assert!(rep.copies_dropped > 16, "{rep:?}");
        has_copies(fs, 1).unwrap();
    });
    let s = Scenario {
        name: "copies 2 -> 1",
        model,
        most: 2,
        want: 1,
        finish: &|fs| set_and_rebuild(fs, "copies=1"),
        holds: &|fs| has_copies(fs, 1),
    };
    sweep(d.path(), &run, &s);
}

/// Device 1 of a two-copy pool is lost (its file gone; the pool opens
/// degraded, read-write) and replaced by a new device 3; finishing is
/// running the same replace again.
#[test]
fn power_loss_while_a_lost_device_is_replaced() {
    let d = shm_dir();
    let model = make(d.path(), "copies=2");
    std::fs::remove_file(device_file(d.path(), 1)).unwrap();
    let new = spec(d.path(), 3, 24 * MIB);
    let old = device_file(d.path(), 1);
    let run = record(d.path(), |fs| {
        let st = fs.redundancy_status();
        assert!(st.short_segments > 0, "device 1 held copies: {st:?}");
        let rep = fs.device_replace(&old, &new, &|_, _| {}).unwrap();
        assert_eq!((rep.old, rep.new, rep.lost), (1, 3, 0), "{rep:?}");
        has_copies(fs, 2).unwrap();
    });
    let s = Scenario {
        name: "replace lost device 1",
        model,
        most: 2,
        want: 2,
        finish: &|fs| replace_again(fs, &old, &new),
        holds: &|fs| has_copies(fs, 2),
    };
    sweep(d.path(), &run, &s);
}

/// Finishes a replace of device 1 by device 3 (the same command again
/// while device 1 is still in the pool).
fn replace_again(fs: &Fs, old: &Path, new: &DeviceSpec) -> Result<(), String> {
    let set = fs.pool().chunks.devices();
    if set.device(1).is_ok() {
        let rep = fs
            .device_replace(old, new, &|_, _| {})
            .map_err(|e| format!("replace again: {e}"))?;
        if rep.lost > 0 {
            return Err(format!("{rep:?}"));
        }
    }
    let ids: Vec<u32> = set.devices().iter().map(|d| d.id()).collect();
    match ids == [0, 2, 3] {
        true => Ok(()),
        false => Err(format!("devices {ids:?} after the replace")),
    }
}

#[test]
fn power_loss_while_one_copy_becomes_parity() {
    let d = shm_dir();
    let model = make(d.path(), "copies=1");
    let run = record(d.path(), |fs| {
        fs.set_redundancy(policy("ec=2+1")).unwrap();
        let rep = fs.resilver(true, &|_| true, &|_, _| {}).unwrap();
        assert!(rep.stripes_made > 4, "{rep:?}");
        assert_eq!((rep.short, rep.lost), (0, 0), "{rep:?}");
        has_stripes(fs, 2, 1).unwrap();
    });
    let s = Scenario {
        name: "copies=1 -> ec=2+1",
        model,
        most: 2,
        want: 2,
        finish: &|fs| set_and_rebuild(fs, "ec=2+1"),
        holds: &|fs| has_stripes(fs, 2, 1),
    };
    sweep(d.path(), &run, &s);
}

/// Device 1 of an `ec=2+1` pool is lost and replaced: its stripe members
/// are restored from the others onto the new device 3.
#[test]
fn power_loss_while_a_lost_device_of_a_striped_pool_is_replaced() {
    let d = shm_dir();
    let model = make(d.path(), "ec=2+1");
    std::fs::remove_file(device_file(d.path(), 1)).unwrap();
    let new = spec(d.path(), 3, 24 * MIB);
    let old = device_file(d.path(), 1);
    let run = record(d.path(), |fs| {
        let st = fs.redundancy_status();
        assert!(st.short_segments > 0, "device 1 held members: {st:?}");
        let rep = fs.device_replace(&old, &new, &|_, _| {}).unwrap();
        assert_eq!((rep.old, rep.new, rep.lost), (1, 3, 0), "{rep:?}");
        has_stripes(fs, 2, 1).unwrap();
    });
    let s = Scenario {
        name: "replace lost device 1 of ec=2+1",
        model,
        most: 2,
        want: 2,
        finish: &|fs| replace_again(fs, &old, &new),
        holds: &|fs| has_stripes(fs, 2, 1),
    };
    sweep(d.path(), &run, &s);
}
