//! Tiering at the filesystem layer, without FUSE: a segment move cut short
//! at each step (a crash) rolls back or forward at the next open with no
//! scan; the mover promotes what is read; devices come and go with the data
//! staying bit-exact.

mod common;

use cairn_devices::{DeviceClass, DeviceSpec};
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{mkfs, Ctx, Fs, MkfsOptions, Pool, PoolConfig, ROOT_INO};
use common::noise;
use std::path::Path;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// A pool of a 16 MiB nvme device and a 64 MiB hdd device.
fn make(dir: &Path) -> Arc<Fs> {
    mkfs_tiers(dir, 17, 65);
    open(dir)
}

/// Makes (does not open) a pool of an nvme and an hdd device of these
/// sizes in MiB (one more than the slots they hold).
fn mkfs_tiers(dir: &Path, fast_mib: u64, slow_mib: u64) {
    let mut o = MkfsOptions::default();
    for (class, name, size) in [
        (DeviceClass::Nvme, "fast", fast_mib),
        (DeviceClass::Hdd, "slow", slow_mib),
    ] {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        o.devices
            .push(DeviceSpec::tier(class, dir.join(name), Some(size * MIB)));
    }
    mkfs(&dir.join("pool"), o).unwrap();
}

fn open(dir: &Path) -> Arc<Fs> {
    let mut c = PoolConfig {
        tier_demote_idle_secs: 0,
        tier_promote_hits: 2.0,
        ..PoolConfig::default()
    };
    c.read_cache_mib = 0;
    Fs::open(Pool::open(&dir.join("pool"), Some(c)).unwrap()).unwrap()
}

/// Writes a 30 MiB file (it spills from the 16 MiB fast device).
fn fill(fs: &Fs) -> (u64, Vec<u8>) {
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    let data = noise(30 << 20, 3);
    for (i, part) in data.chunks(1 << 20).enumerate() {
        fs.write(f.ino, (i << 20) as u64, part).unwrap();
    }
    fs.flush().unwrap();
    (f.ino, data)
}

/// (device id, used slots) per device.
fn used(fs: &Fs) -> Vec<(u32, u64)> {
    let set = fs.pool().chunks.devices();
    set.per_device_slots()
        .into_iter()
        .map(|(d, t, f)| (d.id(), t - f))
        .collect()
}

fn on_device(fs: &Fs, dev: u32) -> Vec<u64> {
    let t = fs.pool().chunks.segment_table();
    t.into_iter()
        .filter(|(_, s)| s.device == dev)
        .map(|(id, _)| id)
        .collect()
}

fn assert_intact(fs: &Fs, ino: u64, data: &[u8]) {
    let got = fs.read(ino, 0, data.len() as u32).unwrap();
    assert!(got == data, "file content differs");
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn interrupted_moves_roll_back_before_the_switch_and_forward_after() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let (ino, data) = fill(&fs);
    let before = used(&fs);
    assert!(
        before[1].1 > 0,
        "nothing spilled to the slow device: {before:?}"
    );
    // Crash after copy + sync, before the switch: the copy is garbage.
    fs.shutdown().unwrap();
    drop(fs);
    let fs = open(d.path());
    let seg = on_device(&fs, 1)[0];
    let cs = &fs.pool().chunks;
    // The fast device is full: the copy goes to another slot of the slow one.
    let r = cs.copy_segment(seg, |_, _, _| true).unwrap();
    assert_eq!(r.to.len(), 1);
    assert_eq!(r.to[0].device, 1);
    assert_ne!(r.to[0].slot, r.from[0].slot);
    drop(fs);
    let fs = open(d.path());
    assert_eq!(
        used(&fs),
        before,
        "rolled back: the copy's slot must be free"
    );
    assert_eq!(fs.pool().chunks.segment(seg).unwrap().device, 1);
    assert_intact(&fs, ino, &data);
    // Crash after the switch committed, before the old slot was freed.
    let cs = &fs.pool().chunks;
    let r = cs.copy_segment(seg, |_, _, _| true).unwrap();
    let rec = cs.relocated_record(&r).expect("segment unchanged");
    fs.pool()
        .meta
        .write(|w| {
            w.put_segment(seg, &rec.encode())?;
            Ok::<_, cairn_fs::FsError>(())
        })
        .unwrap();
    drop(fs);
    let fs = open(d.path());
    let now = fs.pool().chunks.segment(seg).unwrap();
    assert_eq!(
        (now.device, now.slot),
        (r.to[0].device, r.to[0].slot),
        "rolled forward"
    );
    assert_eq!(used(&fs), before, "the old slot must be free");
    assert_intact(&fs, ino, &data);
}

#[test]
fn mover_promotes_what_is_read_and_demotes_to_make_room() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let (ino, data) = fill(&fs);
    // Read the last 8 MiB (homed on the slow device) three times.
    for _ in 0..3 {
        let tail = fs.read(ino, 22 << 20, 8 << 20).unwrap();
        assert!(tail == data[22 << 20..], "tail differs");
    }
    let hot: Vec<u64> = on_device(&fs, 1)
        .into_iter()
        .filter(|s| fs.pool().chunks.heat.get(*s).hits >= 2.0)
        .collect();
    assert!(!hot.is_empty(), "no hot segment on the slow device");
    let rep = fs.migrate(&|_, _| {}).unwrap();
    assert!(
        rep.promoted >= hot.len() as u64,
        "{rep:?} for {} hot",
        hot.len()
    );
    assert!(
        rep.demoted > 0,
        "the full fast device must make room: {rep:?}"
    );
    for s in hot {
        assert_eq!(
            fs.pool().chunks.segment(s).unwrap().device,
            0,
            "segment {s} not promoted"
        );
    }
    assert_intact(&fs, ino, &data);
    // Heat survives a clean restart.
    fs.shutdown().unwrap();
    drop(fs);
    let fs = open(d.path());
    let warm = on_device(&fs, 0)
        .into_iter()
        .filter(|s| fs.pool().chunks.heat.get(*s).hits >= 2.0)
        .count();
    assert!(warm > 0, "heat table not reloaded");
    assert_intact(&fs, ino, &data);
}

#[test]
fn devices_added_and_removed_online_keep_the_data() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let (ino, data) = fill(&fs);
    let spec = DeviceSpec::tier(DeviceClass::Ssd, d.path().join("mid.img"), Some(65 * MIB));
    let id = fs.device_add(&spec).unwrap();
    assert_eq!(id, 2);
    let moved = fs
        .device_remove(&d.path().join("slow"), &|_, _| {})
        .unwrap();
    assert!(moved.segments_moved > 0, "{moved:?}");
    assert!(on_device(&fs, 1).is_empty());
    assert_eq!(fs.pool().chunks.devices().devices().len(), 2);
    assert_intact(&fs, ino, &data);
    // New writes still work and go to the remaining devices.
    let g = fs.create(Ctx::ROOT, ROOT_INO, b"g", 0o644).unwrap();
    fs.write(g.ino, 0, &noise(5 << 20, 9)).unwrap();
    fs.shutdown().unwrap();
    drop(fs);
    let fs = open(d.path());
    assert_eq!(
        fs.pool().chunks.devices().devices().len(),
        2,
        "removal not durable"
    );
    assert_eq!(fs.read(g.ino, 0, 5 << 20).unwrap(), noise(5 << 20, 9));
    assert_intact(&fs, ino, &data);
    // The last tier device cannot go; the metadata's device cannot either.
    fs.device_remove(&d.path().join("mid.img"), &|_, _| {})
        .unwrap_err();
    let e = fs
        .device_remove(&d.path().join("fast"), &|_, _| {})
        .unwrap_err();
    assert!(e.to_string().contains("metadata"), "{e}");
    assert_intact(&fs, ino, &data);
}

#[test]
fn gc_keeps_compacted_chunks_on_their_tier() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let (ino, mut data) = fill(&fs);
    // Overwrite every other block of the part on the slow device: its old
    // segments become half garbage once history is pruned.
    for blk in ((18u64 << 4)..(30 << 4)).step_by(2) {
        let at = (blk << 16) as usize;
        if at >= data.len() {
            break;
        }
        let new = noise(1 << 16, blk);
        data[at..at + (1 << 16)].copy_from_slice(&new);
        fs.write(ino, at as u64, &new).unwrap();
    }
    fs.flush().unwrap();
    let mut p = fs.prune_policy();
    p.retention_secs = 0;
    fs.prune(&p, false).unwrap();
    // Room on a fast tier, and no open segment: new data would go there.
    let spec = DeviceSpec::tier(
        DeviceClass::Nvme,
        d.path().join("fast2.img"),
        Some(17 * MIB),
    );
    let extra = fs.device_add(&spec).unwrap();
    fs.pool().chunks.close_open_segment();
    let fast_before = on_device(&fs, 0);
    let rep = fs.gc(90, 0, &|_, _| {}).unwrap();
    assert!(rep.chunks_moved > 0, "gc moved nothing: {rep:?}");
    assert_eq!(on_device(&fs, 0), fast_before);
    assert!(
        on_device(&fs, extra).is_empty(),
        "compacting slow segments must not pull their chunks into a fast tier"
    );
    assert_intact(&fs, ino, &data);
    fs.shutdown().unwrap();
    drop(fs);
    let fs = open(d.path());
    assert_intact(&fs, ino, &data);
}

/// Writes `data` over file `ino` from offset 0, commits, and closes the open
/// segment so that the next commit starts a segment of its own.
fn commit_alone(fs: &Fs, ino: u64, data: &[u8]) -> Vec<u64> {
    let before: Vec<u64> = fs
        .pool()
        .chunks
        .segment_table()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    for (i, part) in data.chunks(1 << 20).enumerate() {
        fs.write(ino, (i << 20) as u64, part).unwrap();
    }
    fs.flush().unwrap();
    fs.pool().chunks.close_open_segment();
    fs.pool()
        .chunks
        .segment_table()
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| !before.contains(id))
        .collect()
}

#[test]
fn history_only_segments_leave_a_full_fast_tier_first() {
    let d = tempfile::tempdir().unwrap();
    mkfs_tiers(d.path(), 17, 65);
    // Fast device: 4 slots, at most 2 of them used (50%); segments are only
    // demoted to make room, never for being idle.
    let c = PoolConfig {
        tier_demote_idle_secs: 1 << 30,
        tier_promote_hits: 1000.0,
        tier_fast_full_pct: 50,
        read_cache_mib: 0,
        ..PoolConfig::default()
    };
    let fs = Fs::open(Pool::open(&d.path().join("pool"), Some(c)).unwrap()).unwrap();
    let a = fs.create(Ctx::ROOT, ROOT_INO, b"live", 0o644).unwrap();
    let b = fs.create(Ctx::ROOT, ROOT_INO, b"rewritten", 0o644).unwrap();
    let a_data = noise(3 << 20, 1);
    let b_old = noise(3 << 20, 2);
    let b_new = noise(3 << 20, 3);
    // Oldest first: the live file's segment is the one written longest ago
    // (the coldest by heat alone).
    let seg_a = commit_alone(&fs, a.ino, &a_data);
    let seg_old = commit_alone(&fs, b.ino, &b_old);
    let seg_new = commit_alone(&fs, b.ino, &b_new);
    assert_eq!((seg_a.len(), seg_old.len(), seg_new.len()), (1, 1, 1));
    let (seg_a, seg_old, seg_new) = (seg_a[0], seg_old[0], seg_new[0]);
    let cs = &fs.pool().chunks;
    for s in [seg_a, seg_old, seg_new] {
        assert_eq!(cs.segment(s).unwrap().device, 0, "segment {s} not on fast");
    }
    // The overwritten version is history (kept for the fine-grained window):
    // its whole segment is history-only; the others hold live data only.
    let old = cs.segment(seg_old).unwrap();
    assert!(old.live > 0 && old.hist == old.live, "{old:?}");
    assert_eq!(cs.segment(seg_a).unwrap().hist, 0);
    assert_eq!(cs.segment(seg_new).unwrap().hist, 0);
    assert!(fs.fast_tier_over_high_water(), "3 of 4 slots used, cap 50%");
    let rep = fs.migrate(&|_, _| {}).unwrap();
    assert_eq!((rep.demoted, rep.promoted), (1, 0), "{rep:?}");
    assert_eq!(
        cs.segment(seg_old).unwrap().device,
        1,
        "the history-only segment must be demoted first"
    );
    assert_eq!(cs.segment(seg_a).unwrap().device, 0, "live data stays fast");
    assert_eq!(
        cs.segment(seg_new).unwrap().device,
        0,
        "live data stays fast"
    );
    assert!(!fs.fast_tier_over_high_water());
    // New writes find room on the fast tier.
    let c2 = fs.create(Ctx::ROOT, ROOT_INO, b"new", 0o644).unwrap();
    let fresh = commit_alone(&fs, c2.ino, &noise(1 << 20, 4));
    assert_eq!(cs.segment(fresh[0]).unwrap().device, 0);
    // The history still reads back (from the slow tier), and the counts
    // check out (check compares live references and history-only bytes).
    assert_intact(&fs, b.ino, &b_new);
    assert_intact(&fs, a.ino, &a_data);
    let v = fs.history(b.ino).unwrap();
    assert!(v.len() >= 3, "{v:?}");
    let then = v[v.len() - 2].tid;
    let got = fs.asof_read(b.ino, then, 0, b_old.len() as u32).unwrap();
    assert!(got == b_old, "the old version differs");
    // Live counts survive a restart (records v2).
    fs.shutdown().unwrap();
    drop(fs);
    let fs = open(d.path());
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert_eq!(fs.pool().chunks.segment(seg_old).unwrap().hist, old.hist);
}

/// A fast tier filled with history faster than the mover moves it down
/// (here the mover does not run at all): commits prune the oldest
/// fine-grained history until the fast tier has room, so that every new
/// version lands on the fast tier instead of spilling to the slow one, and
/// the newest versions are still kept.
#[test]
fn a_fast_tier_full_of_history_the_mover_cannot_drain_keeps_new_writes_fast() {
    let d = tempfile::tempdir().unwrap();
    // Fast: 16 slots, so under 1/16 free means full.
    mkfs_tiers(d.path(), 65, 129);
    let c = PoolConfig {
        tier_interval_secs: 0,
        read_cache_mib: 0,
        ..PoolConfig::default()
    };
    let fs = Fs::open(Pool::open(&d.path().join("pool"), Some(c)).unwrap()).unwrap();
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"db", 0o644).unwrap();
    let cs = &fs.pool().chunks;
    let mut last = Vec::new();
    for round in 0..40u64 {
        last = noise(3 << 20, round);
        let segs = commit_alone(&fs, f.ino, &last);
        assert_eq!(segs.len(), 1);
        let dev = cs.segment(segs[0]).unwrap().device;
        assert_eq!(dev, 0, "version {round} spilled to the slow tier");
    }
    // 40 versions of 3 MiB do not fit in 16 slots: history was pruned, but
    // only the oldest of it.
    let kept = fs.history(f.ino).unwrap();
    assert!(kept.len() >= 6, "only {} versions kept", kept.len());
    assert!(kept.len() < 30, "{} versions kept", kept.len());
    let then = kept[kept.len() - 2].tid;
    let got = fs.asof_read(f.ino, then, 0, 3 << 20).unwrap();
    assert!(got == noise(3 << 20, 38), "the previous version differs");
    assert!(
        on_device(&fs, 1).is_empty(),
        "nothing was written to the slow tier"
    );
    assert_intact(&fs, f.ino, &last);
}

/// Hot data on the slow tier while the fast one has room is brought up by
/// the mover thread within seconds, not at its next interval (an hour
/// here).
#[test]
fn the_mover_brings_hot_data_up_without_waiting_for_its_interval() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    drop(fs);
    let mut c = PoolConfig {
        tier_interval_secs: 3600,
        tier_promote_hits: 2.0,
        ..PoolConfig::default()
    };
    c.read_cache_mib = 0;
    let fs = Fs::open(Pool::open(&d.path().join("pool"), Some(c)).unwrap()).unwrap();
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"hot", 0o644).unwrap();
    let data = noise(3 << 20, 9);
    let seg = commit_alone(&fs, f.ino, &data)[0];
    let moved = fs.move_segment(seg, |d, _, _| d.id() == 1);
    assert!(moved.unwrap().is_some());
    assert_eq!(fs.pool().chunks.segment(seg).unwrap().device, 1);
    assert!(!fs.hot_waiting_below(), "not read yet");
    for _ in 0..3 {
        assert_eq!(fs.read(f.ino, 0, data.len() as u32).unwrap(), data);
    }
    assert!(fs.hot_waiting_below());
    let mover = fs.spawn_mover().expect("the mover runs");
    let t0 = std::time::Instant::now();
    while fs.pool().chunks.segment(seg).unwrap().device != 0 {
        assert!(
            t0.elapsed().as_secs() < 15,
            "hot segment still on the slow tier"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_intact(&fs, f.ino, &data);
    fs.shutdown().unwrap();
    mover.join().unwrap();
}

/// Writes 4 KiB blocks to a new file `name` from another thread until
/// `stop` is set.
fn writer(
    fs: &Arc<Fs>,
    name: &'static [u8],
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let (fs, stop) = (fs.clone(), stop.clone());
    std::thread::spawn(move || {
        let f = fs.create(Ctx::ROOT, ROOT_INO, name, 0o644).unwrap();
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            fs.write(f.ino, (n % 256) * 4096, &[n as u8; 4096]).unwrap();
            n += 1;
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        n
    })
}

#[test]
fn the_mover_steps_aside_for_client_writes_unless_room_is_short() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::time::{Duration, Instant};
    let d = tempfile::tempdir().unwrap();
    // 64 slots fast, capped at 10%: a 12 MiB file is over the cap, and
    // the fast tier is far from short of room.
    mkfs_tiers(d.path(), 65, 65);
    let mut c = PoolConfig {
        tier_fast_full_pct: 10,
        tier_demote_idle_secs: 0,
        ..PoolConfig::default()
    };
    c.read_cache_mib = 0;
    let fs = Fs::open(Pool::open(&d.path().join("pool"), Some(c)).unwrap()).unwrap();
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    let data = noise(12 << 20, 5);
    fs.write(f.ino, 0, &data).unwrap();
    fs.flush().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let w = writer(&fs, b"w", &stop);
    std::thread::sleep(Duration::from_millis(100));
    let stopper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            stop.store(true, SeqCst);
        })
    };
    let t0 = Instant::now();
    let rep = fs.migrate(&|_, _| {}).unwrap();
    let took = t0.elapsed();
    stopper.join().unwrap();
    assert!(w.join().unwrap() > 100, "the writer wrote");
    assert!(rep.demoted > 0, "{rep:?}");
    assert!(
        rep.yielded_ms >= 1000 && took >= Duration::from_millis(1000),
        "the demotion must wait for the writes to stop: {rep:?} in {took:?}"
    );
    assert_intact(&fs, f.ino, &data);
    drop(fs);

    // A fast tier short of room: the mover does not wait.
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let (ino, data) = fill(&fs);
    let stop = Arc::new(AtomicBool::new(false));
    let w = writer(&fs, b"w", &stop);
    std::thread::sleep(Duration::from_millis(100));
    let rep = fs.migrate(&|_, _| {}).unwrap();
    stop.store(true, SeqCst);
    w.join().unwrap();
    assert!(rep.demoted > 0, "{rep:?}");
    assert!(rep.yielded_ms < 500, "no room: no waiting ({rep:?})");
    assert_intact(&fs, ino, &data);
}
