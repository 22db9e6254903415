//! Tiering, device management and the SSD read cache through a real mount
//! and the `cairn` CLI: placement over sixteen devices of mixed classes
//! (fastest first, spill, ENOSPC only when everything is full), tier mover
//! passes under concurrent readers and writers, kill -9 in the middle of a
//! mover pass (crash-safe moves, no leaked slots), an SSD cache that never
//! serves stale data across overwrite, truncate, delete, snapshots and GC,
//! and online/offline `device add` / `device remove` with their refusals,
//! kill -9 during a removal and a removal racing `cairn gc`. The background
//! mover and GC are off in every pool here (tier_interval_secs = 0,
//! gc_interval_secs = 0): passes are driven with `cairn tier migrate --now`
//! so the outcome is deterministic. Every test that mounts ends with `cairn
//! check`. Seeds are printed; reproduce with CAIRN_SEED=<seed>.

mod common;

use common::hist::*;
use common::json::Json;
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Segment size of every pool here (the default).
const SEG: u64 = 4 << 20;
/// A slow device that still keeps the tests fast.
const SLOW: &str = "latency=1ms:bw=400M";

// ------------------------------------------------------------------ helpers

/// Makes the kernel forget cached pages, so the next reads reach the daemon.
fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").expect("write /proc/sys/vm/drop_caches");
}

/// Sets the config of a test pool: background mover and GC off plus `extra`.
fn configure(fs: &Fs, extra: &[(&str, &str)]) {
    fs.set_config("tier_interval_secs", "0");
    fs.set_config("gc_interval_secs", "0");
    for (k, v) in extra {
        fs.set_config(k, v);
    }
}

/// Makes a pool of `devices` (mkfs specs), configures it (`configure`) and
/// mounts it.
fn mount_pool(fs: &mut Fs, devices: &[String], extra: &[(&str, &str)]) {
    let mut args = Vec::new();
    for d in devices {
        args.extend(["--device", d.as_str()]);
    }
    fs.mkfs(&args);
    configure(fs, extra);
    fs.mount();
}

/// One device as reported by `cairn info --json` or `cairn tier status --json`.
#[derive(Debug, Clone, PartialEq)]
struct Dev {
    id: u64,
    class: String,
    role: String,
    path: String,
    size: u64,
    used: u64,
    segments: u64,
    draining: bool,
    emulated: bool,
}

impl Dev {
    #[track_caller]
    fn parse(j: &Json) -> Dev {
        let emulated = match field(j, "emulated") {
            Json::Null => false,
            Json::Str(_) => true,
            other => panic!("device emulated is neither null nor a string: {other:?}"),
        };
        Dev {
            id: field_u64(j, "id"),
            class: field_str(j, "class").to_string(),
            role: field_str(j, "role").to_string(),
            path: field_str(j, "path").to_string(),
            size: field_u64(j, "size"),
            used: field_u64(j, "used"),
            segments: field_u64(j, "segments"),
            draining: field_bool(j, "draining"),
            emulated,
        }
    }

    fn tier(&self) -> bool {
        self.role == "tier"
    }
}

/// `cairn info TARGET --json` and its devices.
#[track_caller]
fn info(target: &Path) -> (Json, Vec<Dev>) {
    let j = cairn_json(&[os("info"), target.as_os_str(), os("--json")]);
    let devs = field_arr(&j, "devices").iter().map(Dev::parse).collect();
    (j, devs)
}

/// `cairn tier status TARGET --json`: devices with their heat histograms.
#[track_caller]
fn tier_status(target: &Path) -> Vec<(Dev, [u64; 6])> {
    let j = cairn_json(&[os("tier"), os("status"), target.as_os_str(), os("--json")]);
    let arr = j
        .as_array()
        .unwrap_or_else(|| panic!("tier status --json is not an array: {j:?}"));
    arr.iter()
        .map(|d| {
            let h: Vec<u64> = field_arr(d, "heat")
                .iter()
                .map(|x| x.as_u64().expect("heat bucket"))
                .collect();
            let heat: [u64; 6] = h
                .try_into()
                .unwrap_or_else(|h| panic!("heat must have 6 buckets: {h:?}"));
            assert_eq!(
                heat.iter().sum::<u64>(),
                field_u64(d, "segments"),
                "heat histogram does not add up to the segments: {d:?}"
            );
            (Dev::parse(d), heat)
        })
        .collect()
}

/// Counters of one mover pass.
#[derive(Debug, Clone, Copy)]
struct Pass {
    promoted: u64,
    demoted: u64,
    bytes: u64,
    skipped: u64,
}

/// `cairn tier migrate TARGET --now --json`.
#[track_caller]
fn migrate(target: &Path) -> Pass {
    let j = cairn_json(&[
        os("tier"),
        os("migrate"),
        target.as_os_str(),
        os("--now"),
        os("--json"),
    ]);
    let p = Pass {
        promoted: field_u64(&j, "promoted"),
        demoted: field_u64(&j, "demoted"),
        bytes: field_u64(&j, "bytes"),
        skipped: field_u64(&j, "skipped"),
    };
    assert!(
        p.bytes <= (p.promoted + p.demoted) * SEG,
        "migrate copied more than its moves: {j:?}"
    );
    assert!(
        p.promoted + p.demoted == 0 || p.bytes > 0,
        "migrate moved segments without copying: {j:?}"
    );
    p
}

/// Checks what must hold for any quiescent pool (nothing being written or
/// moved): every tier device's used bytes are exactly its segments (no
/// leaked or doubly counted slots), cache devices hold no segments, the
/// devices account for all segments, capacity is the tier devices' size,
/// and `tier status` agrees with `info`. Returns the devices.
#[track_caller]
fn check_accounting(target: &Path, ctx: &str) -> Vec<Dev> {
    // Placement is that of committed data: fsync stops at the intent log.
    common::hist::sync_tid(target);
    let (j, devs) = info(target);
    let mut segs = 0;
    let mut cap = 0;
    for d in &devs {
        assert!(d.used <= d.size, "{ctx}: device used > size: {d:?}");
        assert!(!d.draining, "{ctx}: device still draining: {d:?}");
        if d.tier() {
            assert_eq!(
                d.used,
                d.segments * SEG,
                "{ctx}: device {} ({}) uses {} bytes but holds {} segments: leaked slots?\n{devs:#?}",
                d.id,
                d.path,
                d.used,
                d.segments
            );
            cap += d.size;
        } else {
            assert_eq!(d.role, "cache", "{ctx}: unknown role: {d:?}");
            assert_eq!(d.segments, 0, "{ctx}: cache device holds segments: {d:?}");
        }
        segs += d.segments;
    }
    assert_eq!(
        segs,
        field_u64(&j, "segments"),
        "{ctx}: devices hold {segs} segments, the pool has {}\n{devs:#?}",
        field_u64(&j, "segments")
    );
    assert_eq!(
        field_u64(&j, "capacity_bytes"),
        cap,
        "{ctx}: capacity is not the sum of the tier devices\n{devs:#?}"
    );
    let st: Vec<Dev> = tier_status(target).into_iter().map(|(d, _)| d).collect();
    assert_eq!(st, devs, "{ctx}: tier status and info disagree");
    devs
}

/// Device whose path is `path` (or whose file lies in directory `path`).
#[track_caller]
fn dev_at<'a>(devs: &'a [Dev], path: &str) -> &'a Dev {
    devs.iter()
        .find(|d| d.path == path || Path::new(&d.path).parent() == Some(Path::new(path)))
        .unwrap_or_else(|| panic!("no device at {path}: {devs:#?}"))
}

/// Writes `data` to `p` (created/truncated) and fsyncs; returns the error.
fn try_write_synced(p: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = File::create(p)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Name -> (seed, length) of files whose content is `pattern(seed, length)`.
type Known = BTreeMap<String, (u64, usize)>;

/// Reads every known file below `root` (bypassing cached pages) bit-exactly.
#[track_caller]
fn verify_known(root: &Path, files: &Known, ctx: &str) {
    let missing: Vec<&String> = files.keys().filter(|n| !root.join(n).exists()).collect();
    assert!(
        missing.is_empty(),
        "{ctx}: missing {} of {} files: {missing:?}",
        missing.len(),
        files.len()
    );
    for (name, (seed, len)) in files {
        assert_file(&root.join(name), &pattern(*seed, *len), ctx);
    }
}

/// `cairn device add TARGET SPEC`.
fn device_add(target: &Path, spec: &str) -> io::Result<String> {
    let out = cairn(&[os("device"), os("add"), target.as_os_str(), os(spec)]);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(io::Error::other(describe(&out)))
    }
}

/// `cairn device remove TARGET DEV --json`, asserting success.
#[track_caller]
fn device_remove(target: &Path, dev: &str) -> Json {
    cairn_json(&[
        os("device"),
        os("remove"),
        target.as_os_str(),
        os(dev),
        os("--json"),
    ])
}

/// `cairn device remove` that must fail with a message containing `want`
/// (case-insensitive) and leave the pool's devices as they were.
#[track_caller]
fn device_remove_refused(target: &Path, dev: &str, want: &str, ctx: &str) {
    let before = info(target).1;
    let (code, err) = cairn_fails(&[os("device"), os("remove"), target.as_os_str(), os(dev)]);
    assert_ne!(code, 0, "{ctx}");
    assert!(
        err.to_lowercase().contains(&want.to_lowercase()),
        "{ctx}: `device remove {dev}` should say {want:?}, said:\n{err}"
    );
    assert!(!err.contains("panicked"), "{ctx}: cairn panicked:\n{err}");
    let after = info(target).1;
    assert_eq!(after, before, "{ctx}: refused removal changed the devices");
}

// ------------------------------------------------ 1. sixteen devices, spill

/// Writes 4 MiB files `f000`... (fsynced) into `files` until `n` exist.
fn write_until(fs: &Fs, files: &mut Known, n: usize) {
    while files.len() < n {
        let name = format!("f{:03}", files.len());
        let seed = 1000 + files.len() as u64;
        write_known(fs, files, name, seed, 4 * MIB);
    }
}

#[track_caller]
fn used_of(devs: &[Dev], class: &str) -> (u64, u64) {
    devs.iter()
        .filter(|d| d.class == class)
        .fold((0, 0), |(u, s), d| (u + d.used, s + d.size))
}

#[test]
fn sixteen_devices_capacity_and_spill() {
    let mut fs = Fs::create();
    // Classes interleaved (ids do not follow speed); nvme devices are
    // directories (the device file is created inside), the rest files.
    let mut specs = Vec::new();
    let mut want_size = BTreeMap::new();
    for i in 0..6 {
        if i < 4 {
            let d = fs.dir.join(format!("devs/nvme{i}"));
            fs::create_dir(&d).unwrap();
            specs.push(format!("nvme:{}:32M", d.display()));
        }
        specs.push(format!("hdd:{}:64M", fs.dev(&format!("hdd{i}"))));
        specs.push(format!("ssd:{}:32M", fs.dev(&format!("ssd{i}"))));
    }
    for (class, size) in [("nvme", 32u64 << 20), ("ssd", 32 << 20), ("hdd", 64 << 20)] {
        // The device keeps whole segments after a 1 MiB header area.
        want_size.insert(class, (size - MIB as u64) / SEG * SEG);
    }
    mount_pool(&mut fs, &specs, &[]);

    let (j, devs) = info(&fs.mnt);
    assert_eq!(devs.len(), 16, "devices: {devs:#?}");
    for (class, n) in [("nvme", 4), ("ssd", 6), ("hdd", 6)] {
        let got = devs.iter().filter(|d| d.class == class).count();
        assert_eq!(got, n, "{class} devices: {devs:#?}");
    }
    for d in &devs {
        assert_eq!(d.role, "tier", "{d:?}");
        assert_eq!(d.size, want_size[d.class.as_str()], "device size: {d:?}");
        assert_eq!((d.used, d.segments), (0, 0), "fresh pool: {d:?}");
        assert!(Path::new(&d.path).is_file(), "device file missing: {d:?}");
        if d.class == "nvme" {
            let name = Path::new(&d.path).file_name().unwrap().to_string_lossy();
            assert_eq!(name, format!("cairn-dev-{}.img", d.id), "{d:?}");
        }
    }
    let cap: u64 = devs.iter().map(|d| d.size).sum();
    assert_eq!(field_u64(&j, "capacity_bytes"), cap, "capacity: {j:?}");
    assert_eq!(cap, 4 * (28 << 20) + 6 * (28 << 20) + 6 * (60 << 20));
    let st = statvfs(&fs.mnt);
    let total = st.f_blocks * st.f_frsize;
    assert!(
        total <= cap && total >= cap - 2 * SEG,
        "statfs total {total} is not the capacity {cap}"
    );

    // Phase 1: more than the nvme devices hold: they fill, ssd gets the
    // rest, hdd nothing.
    let mut files = Known::new();
    let (_, nvme_size) = used_of(&devs, "nvme");
    write_until(&fs, &mut files, (nvme_size / SEG) as usize + 10);
    let devs = check_accounting(&fs.mnt, "after phase 1");
    for d in devs.iter().filter(|d| d.class == "nvme") {
        assert_eq!(d.used, d.size, "nvme device not filled first: {devs:#?}");
    }
    assert!(
        used_of(&devs, "ssd").0 > 0,
        "nothing spilled to ssd: {devs:#?}"
    );
    assert_eq!(
        used_of(&devs, "hdd").0,
        0,
        "hdd used before ssd was full: {devs:#?}"
    );

    // Phase 2: past nvme + ssd: both full, the rest on hdd.
    let (_, ssd_size) = used_of(&devs, "ssd");
    write_until(&fs, &mut files, ((nvme_size + ssd_size) / SEG) as usize + 6);
    let devs = check_accounting(&fs.mnt, "after phase 2");
    for d in devs.iter().filter(|d| d.class != "hdd") {
        assert_eq!(
            d.used, d.size,
            "{} device not full before hdd: {devs:#?}",
            d.class
        );
    }
    let (hdd_used, hdd_size) = used_of(&devs, "hdd");
    assert!(hdd_used > 0 && hdd_used < hdd_size, "hdd spill: {devs:#?}");

    // Phase 3: fill until the writer gets ENOSPC (never EIO).
    let mut partial = None;
    for _ in 0..400 {
        let name = format!("f{:03}", files.len());
        let seed = 1000 + files.len() as u64;
        match try_write_synced(&fs.p(&name), &pattern(seed, 4 * MIB)) {
            Ok(()) => drop(files.insert(name, (seed, 4 * MIB))),
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                partial = Some(name);
                break;
            }
            Err(e) => panic!("writing {name}: expected success or ENOSPC, got {e}"),
        }
    }
    let partial = partial.expect("no ENOSPC after writing far more than the capacity");
    if fs.p(&partial).exists() {
        fs::remove_file(fs.p(&partial)).unwrap();
    }
    let devs = check_accounting(&fs.mnt, "at ENOSPC");
    let used: u64 = devs.iter().map(|d| d.used).sum();
    assert!(
        cap - used <= 3 * SEG,
        "ENOSPC with {} MiB of {} MiB free\n{devs:#?}",
        (cap - used) >> 20,
        cap >> 20
    );
    assert!(
        files.len() as u64 * 4 * MIB as u64 >= cap - 6 * SEG,
        "only {} files of 4 MiB fitted in {} MiB",
        files.len(),
        cap >> 20
    );
    drop_caches();
    verify_known(&fs.mnt, &files, "full pool");

    // Deleting files makes room again.
    for i in 10..15 {
        let name = format!("f{i:03}");
        fs::remove_file(fs.p(&name)).unwrap();
        files.remove(&name);
    }
    for k in 0..2u64 {
        let name = format!("again{k}");
        try_write_synced(&fs.p(&name), &pattern(77 + k, 4 * MIB))
            .unwrap_or_else(|e| panic!("{name}: no space after deleting 20 MiB: {e}"));
        files.insert(name, (77 + k, 4 * MIB));
    }
    expect_errno(fs::metadata(fs.p("f011")), libc::ENOENT, "deleted file");
    verify_known(&fs.mnt, &files, "after delete and rewrite");
    fs.remount();
    check_accounting(&fs.mnt, "after remount");
    drop_caches();
    verify_known(&fs.mnt, &files, "after remount");
    fs.finish();
}

// ------------------------------------- 2. mover passes under concurrent I/O

/// Writer thread of test 2: rewrites and appends to its own files, checking
/// each after every change. Returns the final contents and the op count.
fn churn(
    root: PathBuf,
    mut model: BTreeMap<String, Vec<u8>>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> (BTreeMap<String, Vec<u8>>, u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let names: Vec<String> = model.keys().cloned().collect();
    let mut ops = 0;
    while !stop.load(Ordering::SeqCst) {
        let name = &names[rng.gen_range(0..names.len())];
        let p = root.join(name);
        let cur = model.get_mut(name).unwrap();
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        match rng.gen_range(0..3) {
            0 | 1 if cur.len() < 8 * MIB => {
                // Overwrite a range (possibly extending the file).
                let off = rng.gen_range(0..=cur.len());
                let data = pattern(rng.gen(), rng.gen_range(1..768 * KIB));
                f.write_all_at(&data, off as u64).unwrap();
                if cur.len() < off + data.len() {
                    cur.resize(off + data.len(), 0);
                }
                cur[off..off + data.len()].copy_from_slice(&data);
            }
            0 | 1 => {
                // Too big: cut it down.
                let len = rng.gen_range(0..2 * MIB);
                f.set_len(len as u64).unwrap();
                cur.truncate(len);
            }
            _ => {
                let data = pattern(rng.gen(), rng.gen_range(64 * KIB..MIB));
                f.write_all_at(&data, cur.len() as u64).unwrap();
                cur.extend_from_slice(&data);
            }
        }
        f.sync_all().unwrap();
        drop(f);
        if ops % 4 == 0 {
            drop_caches();
        }
        assert_file(&p, cur, &format!("writer file {name} after op {ops}"));
        ops += 1;
    }
    (model, ops)
}

/// Reader thread of test 2: verifies `files` over and over until `stop`.
fn verify_loop(root: PathBuf, files: Known, stop: Arc<AtomicBool>, reads: Arc<AtomicU64>) {
    while !stop.load(Ordering::SeqCst) {
        for (i, (name, (seed, len))) in files.iter().enumerate() {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            if i % 6 == 0 {
                drop_caches();
            }
            assert_file(
                &root.join(name),
                &pattern(*seed, *len),
                "reader during migration",
            );
            reads.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Joins a test thread, re-raising its panic.
fn join<T>(h: thread::JoinHandle<T>) -> T {
    h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// A mounted pool of a 64 MiB nvme device and a 512 MiB emulated-slow hdd
/// device, with demotion allowed at once and `extra` settings.
fn fast_slow_pool(extra: &[(&str, &str)]) -> Fs {
    let mut fs = Fs::create();
    let (fast, slow) = (fs.dev("fast"), fs.dev("slow"));
    let devices = [
        format!("nvme:{fast}:64M"),
        format!("hdd:{slow}:512M:{SLOW}"),
    ];
    let mut cfg = vec![("tier_demote_idle_secs", "0")];
    cfg.extend_from_slice(extra);
    mount_pool(&mut fs, &devices, &cfg);
    fs
}

/// Writes an fsynced file of pattern(seed, len) and records it in `known`.
fn write_known(fs: &Fs, known: &mut Known, name: String, seed: u64, len: usize) {
    write_synced(&fs.p(&name), &pattern(seed, len));
    known.insert(name, (seed, len));
}

/// Writes `n` fsynced files s00.. of 4 MiB of pattern(seed ^ i).
fn write_files(fs: &Fs, seed: u64, n: u64) -> Known {
    let mut known = Known::new();
    for i in 0..n {
        let name = format!("s{i:02}");
        write_known(fs, &mut known, name, seed ^ i, 4 * MIB);
    }
    known
}

#[test]
fn migration_under_concurrent_io() {
    let seed = seed();
    println!("migration_under_concurrent_io: CAIRN_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fs = fast_slow_pool(&[
        ("tier_promote_hits", "3.0"),
        ("read_cache_mib", "8"),
        ("tier_rate_mib", "256"),
    ]);
    let (fast, slow) = (fs.dev("fast"), fs.dev("slow"));

    // 50 files of 4 MiB: the first ones fill the fast device, the rest (most)
    // land on the slow one.
    let stable = write_files(&fs, seed, 50);
    let mut model = BTreeMap::new();
    for i in 0..4u64 {
        let name = format!("w{i}");
        let data = pattern(seed ^ (100 + i), 2 * MIB);
        write_synced(&fs.p(&name), &data);
        model.insert(name, data);
    }
    let devs = check_accounting(&fs.mnt, "after writing");
    let (f0, s0) = (dev_at(&devs, &fast), dev_at(&devs, &slow));
    assert!(!f0.emulated && s0.emulated, "emulation: {devs:#?}");
    assert_eq!(f0.used, f0.size, "fast device not filled first: {devs:#?}");
    assert!(
        s0.segments > f0.segments,
        "most data should be on slow: {devs:#?}"
    );

    // The hot file is the last one (on the slow device). The reader keeps
    // the fast device's files (the first ones) cold so that they can be
    // demoted.
    let hot = "s49";
    let watched: Known = stable
        .iter()
        .filter(|(n, _)| n.as_str() >= "s16" && n.as_str() < hot)
        .map(|(n, v)| (n.clone(), *v))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let (root, stop, reads) = (fs.mnt.clone(), stop.clone(), reads.clone());
        thread::spawn(move || verify_loop(root, watched, stop, reads))
    };
    let writer = {
        let (root, stop, wseed) = (fs.mnt.clone(), stop.clone(), rng.gen());
        thread::spawn(move || churn(root, model, wseed, stop))
    };

    let mut passes = Vec::new();
    let t0 = Instant::now();
    for round in 0..6 {
        if reader.is_finished() || writer.is_finished() {
            break;
        }
        let (hs, hl) = stable[hot];
        for _ in 0..4 {
            drop_caches();
            assert_file(&fs.p(hot), &pattern(hs, hl), "hot file");
        }
        let p = migrate(&fs.mnt);
        println!("round {round}: {p:?} after {:?}", t0.elapsed());
        passes.push(p);
        thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::SeqCst);
    join(reader);
    let (model, ops) = join(writer);
    println!(
        "passes {passes:?}; {} reader verifications, {ops} writer ops",
        reads.load(Ordering::SeqCst)
    );
    assert!(
        passes.iter().any(|p| p.promoted > 0),
        "no pass promoted anything: {passes:?}"
    );
    assert!(
        passes.iter().any(|p| p.demoted > 0),
        "no pass demoted anything: {passes:?}"
    );
    assert!(ops >= 5, "writer made only {ops} changes: test too weak");
    assert!(
        reads.load(Ordering::SeqCst) >= 10,
        "reader made too few verifications: test too weak"
    );

    // A last pass with nothing else running; the hottest segments must now
    // be on the fast device.
    let (hs, hl) = stable[hot];
    for _ in 0..4 {
        drop_caches();
        assert_file(&fs.p(hot), &pattern(hs, hl), "hot file");
    }
    let p = migrate(&fs.mnt);
    assert_eq!(p.skipped, 0, "a quiet pass gave up moves: {p:?}");
    let st = tier_status(&fs.mnt);
    let top = |path: &str| {
        let (_, h) = st
            .iter()
            .find(|(d, _)| d.path == path)
            .unwrap_or_else(|| panic!("no device {path}: {st:?}"));
        h.iter().rposition(|&n| n > 0)
    };
    assert!(
        top(&fast) >= top(&slow),
        "hotter segments left on the slow device: {st:?}"
    );
    check_accounting(&fs.mnt, "after the passes");
    let writer_files: Vec<(String, Vec<u8>)> = model.into_iter().collect();
    let verify_all = |fs: &Fs, ctx: &str| {
        drop_caches();
        verify_known(&fs.mnt, &stable, ctx);
        for (n, d) in &writer_files {
            assert_file(&fs.p(n), d, ctx);
        }
    };
    verify_all(&fs, "after the passes");
    fs.remount();
    check_accounting(&fs.mnt, "after remount");
    verify_all(&fs, "after remount");
    fs.finish();
}

// ----------------------------------------------- 3. kill -9 during a pass

/// Writer thread of test 3: 1 MiB files in directory `dir`, each fsynced;
/// the acknowledged ones go to `acked`. Stops at the first error (the daemon
/// was killed) and returns when it happened. The directory keeps it from
/// writing into the mount point's own directory once the dead mount is
/// lazily unmounted.
fn acked_writer(
    root: PathBuf,
    dir: String,
    seed: u64,
    acked: Arc<Mutex<Known>>,
) -> Option<(Instant, io::Error)> {
    let made = fs::create_dir(root.join(&dir)).and_then(|_| File::open(&root)?.sync_all());
    if let Err(e) = made {
        return Some((Instant::now(), e));
    }
    for i in 0..200u64 {
        let name = format!("{dir}/{i:03}");
        let s = seed.wrapping_add(i);
        if let Err(e) = try_write_synced(&root.join(&name), &pattern(s, MIB)) {
            return Some((Instant::now(), e));
        }
        acked.lock().unwrap().insert(name, (s, MIB));
        thread::sleep(Duration::from_millis(30));
    }
    None
}

#[test]
fn kill9_during_migration() {
    let seed = seed();
    println!("kill9_during_migration: CAIRN_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fs = fast_slow_pool(&[
        ("tier_promote_hits", "1.5"),
        ("read_cache_mib", "0"),
        // 4 MiB moves at 16 MiB/s: a pass of ~25 moves takes seconds.
        ("tier_rate_mib", "16"),
    ]);
    let (fast, slow) = (fs.dev("fast"), fs.dev("slow"));
    let mut known = write_files(&fs, seed, 30);
    let devs = check_accounting(&fs.mnt, "after writing");
    let f0 = dev_at(&devs, &fast);
    assert_eq!(f0.used, f0.size, "fast device not full: {devs:#?}");

    let delays_ms = [250u64, 800, 1500, 2400];
    let mut killed_mid = 0;
    let mut moved_rounds = 0;
    for (round, base) in delays_ms.iter().enumerate() {
        let ctx = format!("CAIRN_SEED={seed} round {round}");
        // Heat: read the files on the slow device twice (heat is lost at
        // kill -9, so every round makes it again).
        let before = check_accounting(&fs.mnt, &ctx);
        for _ in 0..2 {
            drop_caches();
            for (name, (s, len)) in known.iter().filter(|(n, _)| n.as_str() >= "s15") {
                assert_file(&fs.p(name), &pattern(*s, *len), &ctx);
            }
        }
        // Odd rounds crash with fsynced writes in flight as well.
        let acked = Arc::new(Mutex::new(Known::new()));
        let writing = round % 2 == 1;
        let writer = writing.then(|| {
            let (root, a) = (fs.mnt.clone(), acked.clone());
            let (prefix, wseed) = (format!("c{round}"), rng.gen());
            thread::spawn(move || acked_writer(root, prefix, wseed, a))
        });
        let delay = Duration::from_millis(base + rng.gen_range(0..300));
        let mnt = fs.mnt.clone();
        let args = [
            os("tier"),
            os("migrate"),
            mnt.as_os_str(),
            os("--now"),
            os("--json"),
        ];
        let started = Instant::now();
        let mid = kill_during(&mut fs, &args, delay, &ctx);
        if let Some((when, e)) = writer.and_then(join) {
            assert!(
                when >= started + delay,
                "{ctx}: writer failed before the kill: {e}"
            );
        }
        killed_mid += mid as usize;
        known.extend(acked.lock().unwrap().clone());
        // The crashed pool is consistent as it is...
        fs.check();
        // ... and after recovery: all fsynced data, no leaked slots.
        fs.mount();
        let after = check_accounting(&fs.mnt, &format!("{ctx}: after kill -9"));
        // Without the writer, any change of placement is a committed move.
        let seg_of = |devs: &[Dev]| (dev_at(devs, &fast).segments, dev_at(devs, &slow).segments);
        let moved = !writing && seg_of(&after) != seg_of(&before);
        moved_rounds += moved as usize;
        println!(
            "{ctx}: killed after {delay:?} (pass in flight: {mid}); fast {} -> {} segments, slow {} -> {}",
            dev_at(&before, &fast).segments,
            dev_at(&after, &fast).segments,
            dev_at(&before, &slow).segments,
            dev_at(&after, &slow).segments
        );
        drop_caches();
        verify_known(&fs.mnt, &known, &ctx);
    }
    assert!(
        killed_mid >= 2,
        "the pass had finished before the kill in most rounds: test too weak"
    );
    assert!(
        moved_rounds >= 1,
        "no round committed a move before the kill: test too weak"
    );
    // A complete pass after all this works and keeps everything.
    for _ in 0..2 {
        drop_caches();
        for (name, (s, len)) in known.iter().filter(|(n, _)| n.as_str() >= "s15") {
            assert_file(&fs.p(name), &pattern(*s, *len), "reheat");
        }
    }
    let p = migrate(&fs.mnt);
    println!("final pass: {p:?}");
    check_accounting(&fs.mnt, "after a full pass");
    fs.remount();
    check_accounting(&fs.mnt, "final remount");
    drop_caches();
    verify_known(&fs.mnt, &known, "final");
    fs.finish();
}

// -------------------------------------------------- 4. SSD cache, no stale

/// The `ssd_cache` object of `cairn info` as (hits, misses, entries,
/// dropped), or None when the pool has no cache device.
#[track_caller]
fn cache_stats(target: &Path) -> Option<(u64, u64, u64, u64)> {
    let (j, _) = info(target);
    match field(&j, "ssd_cache") {
        Json::Null => None,
        c => {
            for k in ["filled_bytes", "throttled", "capacity"] {
                field_u64(c, k);
            }
            Some((
                field_u64(c, "hits"),
                field_u64(c, "misses"),
                field_u64(c, "entries"),
                field_u64(c, "dropped"),
            ))
        }
    }
}

/// Makes and mounts a pool of `devices` with no SSD cache fill limit and
/// `extra` set.
fn cache_pool(fs: &mut Fs, devices: &[String], extra: (&str, &str)) {
    let fill = [
        ("cache_fill_burst_mib", "1024"),
        ("cache_fill_rate_mib", "1024"),
        extra,
    ];
    mount_pool(fs, devices, &fill);
}

#[test]
fn ssd_cache_never_stale() {
    let seed = seed();
    println!("ssd_cache_never_stale: CAIRN_SEED={seed}");
    let mut fs = Fs::create();
    let (fast, slow, cache) = (fs.dev("fast"), fs.dev("slow"), fs.dev("cache"));
    let devices = [
        format!("nvme:{fast}:32M"),
        format!("hdd:{slow}:256M:{SLOW}"),
        format!("ssd:{cache}:64M:role=cache"),
    ];
    cache_pool(&mut fs, &devices, ("read_cache_mib", "0"));

    let (j, devs) = info(&fs.mnt);
    let c = dev_at(&devs, &cache);
    assert_eq!(c.role, "cache", "{devs:#?}");
    let tier_sum: u64 = devs.iter().filter(|d| d.tier()).map(|d| d.size).sum();
    assert_eq!(
        field_u64(&j, "capacity_bytes"),
        tier_sum,
        "capacity must count tier devices only: {j:?}"
    );
    assert_eq!(
        tier_sum,
        dev_at(&devs, &fast).size + dev_at(&devs, &slow).size
    );
    let st = statvfs(&fs.mnt);
    assert!(
        st.f_blocks * st.f_frsize <= tier_sum,
        "statfs counts the cache device"
    );
    let cap = field_u64(field(&j, "ssd_cache"), "capacity");
    assert!(
        cap > 48 << 20 && cap <= 64 << 20,
        "ssd_cache capacity {cap}"
    );
    assert_eq!(
        cache_stats(&fs.mnt).unwrap().2,
        0,
        "cache not empty at mount"
    );

    // A filler fills the fast tier so that the rest lives on the slow one.
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (name, s, len) in [
        ("filler", 1, 28 * MIB),
        ("big", 2, 24 * MIB),
        ("trunc", 3, 6 * MIB + 5),
        ("del", 4, 6 * MIB),
    ] {
        let data = pattern(seed ^ s, len);
        write_synced(&fs.p(name), &data);
        files.insert(name.to_string(), data);
    }
    let devs = check_accounting(&fs.mnt, "after writing");
    let (f, s) = (dev_at(&devs, &fast), dev_at(&devs, &slow));
    assert_eq!(f.used, f.size, "fast tier not full: {devs:#?}");
    assert!(
        s.used >= 36 * MIB as u64,
        "slow tier holds too little: {devs:#?}"
    );

    let read_all = |fs: &Fs, files: &BTreeMap<String, Vec<u8>>, ctx: &str| {
        drop_caches();
        for (n, d) in files {
            assert_file(&fs.p(n), d, ctx);
        }
    };
    // Misses fill the cache in the background; later reads hit it.
    read_all(&fs, &files, "first read");
    let filled = eventually(Duration::from_secs(20), || {
        let (_, _, entries, _) = cache_stats(&fs.mnt).unwrap();
        if entries < 100 {
            read_all(&fs, &files, "filling read");
        }
        entries >= 100
    });
    let s1 = cache_stats(&fs.mnt).unwrap();
    assert!(filled, "SSD cache not filled after repeated reads: {s1:?}");
    read_all(&fs, &files, "cached read");
    let s2 = cache_stats(&fs.mnt).unwrap();
    assert!(s2.0 > s1.0, "no cache hits on re-read: {s1:?} -> {s2:?}");
    assert_eq!(s2.3, 0, "cache copies dropped without any change: {s2:?}");

    // The old versions, kept by a snapshot.
    snapshot_create(&fs.mnt, "before");
    let old = files.clone();
    // Overwrite part of big (unaligned), truncate trunc and extend it again
    // (the tail must read as zeros), delete del.
    let off = 5 * MIB + 123;
    let new = pattern(seed ^ 9, 3 * MIB + 1000);
    let f = OpenOptions::new().write(true).open(fs.p("big")).unwrap();
    f.write_all_at(&new, off as u64).unwrap();
    f.sync_all().unwrap();
    drop(f);
    files.get_mut("big").unwrap()[off..off + new.len()].copy_from_slice(&new);
    let f = OpenOptions::new().write(true).open(fs.p("trunc")).unwrap();
    f.set_len(3 * MIB as u64 + 77).unwrap();
    f.set_len(5 * MIB as u64).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let t = files.get_mut("trunc").unwrap();
    t.truncate(3 * MIB + 77);
    t.resize(5 * MIB, 0);
    fs::remove_file(fs.p("del")).unwrap();
    files.remove("del");
    sync_tid(&fs.mnt);

    let snap = fs.mnt.join(".snapshots/before");
    let check_views = |fs: &Fs, files: &BTreeMap<String, Vec<u8>>, ctx: &str| {
        read_all(fs, files, ctx);
        expect_errno(fs::metadata(fs.p("del")), libc::ENOENT, "deleted file");
        assert_eq!(fs::metadata(fs.p("trunc")).unwrap().len(), 5 * MIB as u64);
        for (n, d) in &old {
            assert_file(&snap.join(n), d, &format!("{ctx}: snapshot"));
        }
    };
    for k in 0..3 {
        check_views(&fs, &files, &format!("after changes, read {k}"));
    }
    let s3 = cache_stats(&fs.mnt).unwrap();
    assert!(
        s3.0 > s2.0,
        "old versions not served from the cache: {s2:?} -> {s3:?}"
    );

    // Drop the snapshot and old history, compact, write new data (possibly
    // where the old segments were): reads stay exact.
    cairn_ok(&[
        os("snapshot"),
        os("delete"),
        fs.mnt.as_os_str(),
        os("before"),
    ]);
    cairn_ok(&[
        os("prune"),
        fs.mnt.as_os_str(),
        os("--keep-history"),
        os("0"),
    ]);
    cairn_ok(&[os("gc"), fs.mnt.as_os_str()]);
    for (name, s) in [("fresh1", 11), ("fresh2", 12)] {
        let data = pattern(seed ^ s, 10 * MIB + 3);
        write_synced(&fs.p(name), &data);
        files.insert(name.to_string(), data);
    }
    for k in 0..3 {
        read_all(&fs, &files, &format!("after gc, read {k}"));
    }
    expect_errno(
        fs::metadata(snap.join("big")),
        libc::ENOENT,
        "deleted snapshot",
    );
    let s4 = cache_stats(&fs.mnt).unwrap();
    println!("cache stats (hits, misses, entries, dropped): {s1:?} {s2:?} {s3:?} {s4:?}");

    // A second cache device is refused; the pool is unchanged.
    let before = info(&fs.mnt).1;
    let other = fs.dev("cache2");
    let err = device_add(&fs.mnt, &format!("ssd:{other}:64M:role=cache")).unwrap_err();
    assert!(
        err.to_string().contains("cache device"),
        "second cache device: {err}"
    );
    assert_eq!(info(&fs.mnt).1, before, "refused add changed the devices");

    // Removing the cache device online: reads go to the home devices.
    let r = device_remove(&fs.mnt, &cache);
    assert_eq!(field_u64(&r, "segments_moved"), 0, "{r:?}");
    let (j, devs) = info(&fs.mnt);
    assert!(
        devs.iter().all(|d| d.tier()) && devs.len() == 2,
        "cache device still listed: {devs:#?}"
    );
    assert_eq!(
        field(&j, "ssd_cache"),
        &Json::Null,
        "ssd_cache after removal"
    );
    assert_eq!(field_u64(&j, "capacity_bytes"), tier_sum);
    read_all(&fs, &files, "after removing the cache");
    fs.remount();
    check_accounting(&fs.mnt, "after remount");
    assert!(cache_stats(&fs.mnt).is_none(), "cache back after remount");
    read_all(&fs, &files, "after remount");

    // A cache device added online serves reads at once, adds no capacity,
    // and stays in the pool (cold) across a remount. It is smaller than
    // what is on the slow tier: only "big" is read here, which fits (a ring
    // cache cannot hold a scan larger than itself).
    device_add(&fs.mnt, &format!("ssd:{other}:32M:role=cache")).unwrap();
    let (j, _) = info(&fs.mnt);
    assert_eq!(field_u64(&j, "capacity_bytes"), tier_sum, "{j:?}");
    let big_only = |files: &BTreeMap<String, Vec<u8>>| {
        let mut m = files.clone();
        m.retain(|n, _| n == "big");
        m
    };
    let filled = eventually(Duration::from_secs(20), || {
        read_all(&fs, &big_only(&files), "filling the new cache");
        cache_stats(&fs.mnt).unwrap().2 >= 100
    });
    assert!(
        filled,
        "new cache device not filled: {:?}",
        cache_stats(&fs.mnt)
    );
    let s5 = cache_stats(&fs.mnt).unwrap();
    let f = OpenOptions::new().write(true).open(fs.p("big")).unwrap();
    let new = pattern(seed ^ 10, 700 * KIB + 3);
    f.write_all_at(&new, 123_456).unwrap();
    f.sync_all().unwrap();
    drop(f);
    files.get_mut("big").unwrap()[123_456..123_456 + new.len()].copy_from_slice(&new);
    read_all(&fs, &big_only(&files), "new cache");
    let s6 = cache_stats(&fs.mnt).unwrap();
    assert!(s6.0 > s5.0, "no hits on the new cache: {s5:?} -> {s6:?}");
    read_all(&fs, &files, "new cache, everything");
    read_all(&fs, &big_only(&files), "new cache, big again");
    eventually(Duration::from_secs(5), || {
        cache_stats(&fs.mnt).unwrap().2 >= 100
    });

    // A clean remount keeps the cache warm (its index is saved at unmount).
    fs.remount();
    let devs = check_accounting(&fs.mnt, "after remount with the new cache");
    assert_eq!(dev_at(&devs, &other).role, "cache", "{devs:#?}");
    let w0 = cache_stats(&fs.mnt).unwrap();
    assert!(w0.2 > 0, "cache cold after a clean remount: {w0:?}");
    read_all(&fs, &big_only(&files), "warm cache");
    let w1 = cache_stats(&fs.mnt).unwrap();
    assert!(w1.0 > w0.0, "warm cache gave no hits: {w0:?} -> {w1:?}");
    read_all(&fs, &files, "warm cache, everything");

    // The saved index must not make stale copies come back: change files,
    // unmount (the index still names the old chunks), free their segments
    // offline, write new data (which may reuse what was freed), mount.
    let f = OpenOptions::new().write(true).open(fs.p("big")).unwrap();
    let new = pattern(seed ^ 13, 9 * MIB);
    f.write_all_at(&new, 2 * MIB as u64).unwrap();
    f.sync_all().unwrap();
    drop(f);
    files.get_mut("big").unwrap()[2 * MIB..11 * MIB].copy_from_slice(&new);
    fs::remove_file(fs.p("trunc")).unwrap();
    files.remove("trunc");
    fs.unmount();
    cairn_ok(&[
        os("prune"),
        fs.pool.as_os_str(),
        os("--keep-history"),
        os("0"),
    ]);
    cairn_ok(&[os("gc"), fs.pool.as_os_str()]);
    fs.mount();
    for (name, s) in [("fresh3", 14), ("fresh4", 15)] {
        let data = pattern(seed ^ s, 6 * MIB + 1);
        write_synced(&fs.p(name), &data);
        files.insert(name.to_string(), data);
    }
    for k in 0..2 {
        read_all(&fs, &files, &format!("after offline gc, read {k}"));
    }
    expect_errno(fs::metadata(fs.p("trunc")), libc::ENOENT, "deleted file");
    println!("cache after offline gc: {:?}", cache_stats(&fs.mnt));

    // After a crash the cache starts cold, and reads are still exact.
    fs.kill9();
    fs.check();
    fs.mount();
    let c = cache_stats(&fs.mnt).unwrap();
    assert_eq!(c.2, 0, "cache index survived a crash: {c:?}");
    read_all(&fs, &files, "after kill -9");
    fs.finish();
}

/// Applies a round of random namespace and content changes to both `a`
/// (the mount) and `b` (a plain directory): new files in 40 directories,
/// overwrites, deletes and renames.
fn metadata_churn(a: &Path, b: &Path, rng: &mut StdRng, n: usize) {
    for _ in 0..n {
        let d = format!("d{:02}", rng.gen_range(0..40));
        let f = format!("{d}/f{:04}", rng.gen_range(0..400));
        let op = rng.gen_range(0..10);
        for root in [a, b] {
            fs::create_dir_all(root.join(&d)).unwrap();
        }
        if op < 7 {
            let len = rng.gen_range(0..3000);
            let data = pattern(rng.gen(), len);
            for root in [a, b] {
                fs::write(root.join(&f), &data).unwrap();
            }
        } else if op < 9 {
            for root in [a, b] {
                let _ = fs::remove_file(root.join(&f));
            }
        } else {
            let to = format!("d{:02}/r{:04}", rng.gen_range(0..40), rng.gen_range(0..400));
            for root in [a, b] {
                fs::create_dir_all(root.join(&to).parent().unwrap()).unwrap();
                let _ = fs::rename(root.join(&f), root.join(&to));
            }
        }
    }
}

/// The `ssd_cache` metadata counters of `cairn info`: (hits, misses,
/// entries).
#[track_caller]
fn meta_cache_stats(target: &Path) -> (u64, u64, u64) {
    let (j, _) = info(target);
    let c = field(&j, "ssd_cache");
    let get = |k| field_u64(c, k);
    (get("meta_hits"), get("meta_misses"), get("meta_entries"))
}

/// A pool on a slow device alone with an SSD cache device: metadata pages
/// (its home is the slow device) are cached too, are served from the cache
/// once redb's own RAM cache is cold, and never stale: the tree read back
/// matches a plain-directory model after churn, across a clean remount
/// (where the metadata part starts cold: its checksums are in RAM only) and
/// a kill -9.
#[test]
fn ssd_cache_holds_metadata_of_a_slow_pool() {
    let seed = seed();
    println!("ssd_cache_holds_metadata_of_a_slow_pool: CAIRN_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fs = Fs::create();
    let (slow, cache) = (fs.dev("slow"), fs.dev("cache"));
    let devices = [
        format!("hdd:{slow}:256M:{SLOW}"),
        format!("ssd:{cache}:64M:role=cache"),
    ];
    cache_pool(&mut fs, &devices, ("meta_cache_mib", "0"));
    let model = tempfile::tempdir().unwrap();
    let mnt = fs.mnt.clone();
    let want = |ctx: &str| {
        let t = capture(model.path()).unwrap();
        drop_caches();
        assert_tree_at(&mnt, &t, ctx);
    };
    metadata_churn(&fs.mnt, model.path(), &mut rng, 1200);
    cairn_ok(&[OsStr::new("sync"), fs.mnt.as_os_str()]);
    want("after writing");
    want("second walk");
    let (hits, misses, entries) = meta_cache_stats(&fs.mnt);
    println!("metadata pages: {hits} hits, {misses} misses, {entries} entries");
    assert!(
        hits > 0 && entries > 0,
        "metadata not cached: {hits} hits, {entries} entries"
    );

    for round in 0..2 {
        metadata_churn(&fs.mnt, model.path(), &mut rng, 500);
        want(&format!("round {round}"));
        want(&format!("round {round}, again"));
    }
    fs.remount();
    want("after a clean remount");
    want("after a clean remount, again");
    let (hits2, _, _) = meta_cache_stats(&fs.mnt);
    assert!(hits2 > 0, "no metadata hits after the remount");

    metadata_churn(&fs.mnt, model.path(), &mut rng, 400);
    cairn_ok(&[OsStr::new("sync"), fs.mnt.as_os_str()]);
    fs.kill9();
    let report = fs.check();
    println!("{report}");
    fs.mount();
    want("after kill -9 (all synced)");
    fs.finish();
}

// ----------------------------------------------- 5. device add and remove

/// kill -9 while `device remove` drains a (slow) device: the device stays in
/// the pool with what is left on it, nothing is lost or leaked, and running
/// the removal again finishes it.
#[test]
fn kill9_during_device_remove() {
    let seed = seed();
    println!("kill9_during_device_remove: CAIRN_SEED={seed}");
    let mut fs = Fs::create();
    let (nvme, hdd) = (fs.dev("nvme"), fs.dev("hdd"));
    // The device to remove is the fastest (it gets the data first) but
    // emulated slow, so draining it takes seconds.
    let devices = [
        format!("nvme:{nvme}:64M:latency=1ms:bw=24M"),
        format!("hdd:{hdd}:256M"),
    ];
    mount_pool(&mut fs, &devices, &[]);
    let mut known = Known::new();
    for i in 0..16u64 {
        let name = format!("k{i:02}");
        write_known(&fs, &mut known, name, seed ^ i, 4 * MIB - 1000);
    }
    let devs = check_accounting(&fs.mnt, "after writing");
    let total: u64 = devs.iter().map(|d| d.segments).sum();
    let mut left = dev_at(&devs, &nvme).segments;
    assert!(left >= 12, "{devs:#?}");
    let mut killed_mid = 0;
    for (round, ms) in [300u64, 1200].into_iter().enumerate() {
        let ctx = format!("CAIRN_SEED={seed} round {round}");
        let mnt = fs.mnt.clone();
        let args = [os("device"), os("remove"), mnt.as_os_str(), os(&nvme)];
        killed_mid += kill_during(&mut fs, &args, Duration::from_millis(ms), &ctx) as usize;
        fs.check();
        fs.mount();
        let devs = check_accounting(&fs.mnt, &ctx);
        assert_eq!(
            devs.len(),
            2,
            "{ctx}: device gone before it was empty: {devs:#?}"
        );
        assert_eq!(devs.iter().map(|d| d.segments).sum::<u64>(), total, "{ctx}");
        let now = dev_at(&devs, &nvme).segments;
        println!("{ctx}: killed after {ms} ms; {left} -> {now} segments on the device");
        assert!(now <= left, "{ctx}: segments moved back: {left} -> {now}");
        left = now;
        drop_caches();
        verify_known(&fs.mnt, &known, &ctx);
    }
    assert!(
        killed_mid >= 1,
        "removal finished before every kill: test too weak"
    );
    assert!(
        left > 0,
        "the device was emptied before the last kill: test too weak"
    );
    // Running it again finishes the job.
    let r = device_remove(&fs.mnt, &nvme);
    assert_eq!(field_u64(&r, "segments_moved"), left, "{r:?}");
    let devs = check_accounting(&fs.mnt, "after the removal");
    assert_eq!(devs.len(), 1, "{devs:#?}");
    assert_eq!(devs[0].segments, total, "{devs:#?}");
    drop_caches();
    verify_known(&fs.mnt, &known, "after the removal");
    fs.remount();
    check_accounting(&fs.mnt, "after remount");
    verify_known(&fs.mnt, &known, "after remount");
    fs.finish();
}

#[test]
fn device_remove_evacuates() {
    let seed = seed();
    println!("device_remove_evacuates: CAIRN_SEED={seed}");
    let mut fs = Fs::create();
    // The fastest device is a directory: the metadata lives in it.
    let nvme_dir = fs.dir.join("devs/nvme");
    fs::create_dir(&nvme_dir).unwrap();
    let nvme_dir = nvme_dir.to_str().unwrap().to_string();
    let (ssd, hdd, hdd2) = (fs.dev("ssd"), fs.dev("hdd"), fs.dev("hdd2"));
    let devices = [
        format!("nvme:{nvme_dir}:32M"),
        format!("ssd:{ssd}:64M"),
        format!("hdd:{hdd}:128M"),
    ];
    mount_pool(&mut fs, &devices, &[]);
    let mut known = Known::new();
    for i in 0..24u64 {
        let name = format!("d{i:02}");
        let len = 3 * MIB + (i as usize * 4099);
        write_known(&fs, &mut known, name, seed ^ i, len);
    }
    let devs = check_accounting(&fs.mnt, "after writing");
    assert_eq!(devs.len(), 3);
    let ssd_segs = dev_at(&devs, &ssd).segments;
    assert!(ssd_segs >= 5, "ssd holds too little: {devs:#?}");
    let total_segs: u64 = devs.iter().map(|d| d.segments).sum();
    let cap0: u64 = devs.iter().map(|d| d.size).sum();

    // Bad input first: every refusal leaves the pool as it was.
    device_remove_refused(
        &fs.mnt,
        fs.dir.join("devs/nope").to_str().unwrap(),
        "not a device of this pool",
        "unknown path",
    );
    device_remove_refused(&fs.mnt, "99", "not a device of this pool", "unknown id");
    device_remove_refused(&fs.mnt, &nvme_dir, "metadata", "metadata device");
    for bad in [
        "tape:/x".to_string(),
        format!("ssd:{}:1G:colour=red", fs.dev("x")),
        format!("ssd:{}:lots", fs.dev("x")),
        format!("ssd:{}:64M:role=spare", fs.dev("x")),
        format!("ssd:{}:64M:latency=soon", fs.dev("x")),
        "ssd::64M".to_string(),
        "ssd".to_string(),
    ] {
        let out = cairn(&[os("device"), os("add"), fs.mnt.as_os_str(), os(&bad)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "device add {bad}: expected a usage error\n{}",
            describe(&out)
        );
        assert!(
            err.contains("invalid value") || err.contains("usage") || err.contains("Usage"),
            "device add {bad}: no usage-type message:\n{err}"
        );
        assert!(
            !Path::new(&fs.dev("x")).exists(),
            "device add {bad} created a file"
        );
    }
    assert_eq!(info(&fs.mnt).1, devs, "bad device add changed the pool");
    // Too small a device: a clean error, pool unchanged.
    let tiny = fs.dev("tiny");
    let err = device_add(&fs.mnt, &format!("hdd:{tiny}:2M")).unwrap_err();
    assert!(!err.to_string().contains("panicked"), "{err}");
    assert_eq!(info(&fs.mnt).1, devs, "failed device add changed the pool");

    // Online add: capacity grows at once, new data can go there.
    let out = device_add(&fs.mnt, &format!("hdd:{hdd2}:128M")).unwrap();
    assert!(out.contains("added device"), "device add said: {out}");
    let devs = check_accounting(&fs.mnt, "after device add");
    assert_eq!(devs.len(), 4, "{devs:#?}");
    let added = dev_at(&devs, &hdd2);
    assert_eq!((added.class.as_str(), added.size), ("hdd", 124 << 20));
    let cap1: u64 = devs.iter().map(|d| d.size).sum();
    assert_eq!(cap1, cap0 + added.size);
    drop_caches();
    verify_known(&fs.mnt, &known, "after device add");

    // Remove the ssd, which holds data, while a reader checks files.
    let stop = Arc::new(AtomicBool::new(false));
    let iters = Arc::new(AtomicU64::new(0));
    let reader = {
        let files: Files = known
            .iter()
            .map(|(n, (s, l))| (n.clone(), pattern(*s, *l)))
            .collect();
        let (root, st, it) = (fs.mnt.clone(), stop.clone(), iters.clone());
        thread::spawn(move || check_reads(root, files, seed, st, it, "being evacuated"))
    };
    let r = device_remove(&fs.mnt, &ssd);
    stop.store(true, Ordering::SeqCst);
    join(reader).unwrap_or_else(|e| panic!("reader during device remove: {e}"));
    assert_eq!(
        field_u64(&r, "segments_moved"),
        ssd_segs,
        "remove report: {r:?}"
    );
    assert!(
        field_u64(&r, "bytes_moved") > (ssd_segs - 1) * SEG / 2,
        "remove report: {r:?}"
    );
    let devs = check_accounting(&fs.mnt, "after device remove");
    assert_eq!(devs.len(), 3, "{devs:#?}");
    assert!(
        devs.iter().all(|d| d.path != ssd && d.class != "ssd"),
        "removed device still listed: {devs:#?}"
    );
    assert_eq!(
        devs.iter().map(|d| d.segments).sum::<u64>(),
        total_segs,
        "segments lost or gained by the removal: {devs:#?}"
    );
    let st = tier_status(&fs.mnt);
    assert!(st.iter().all(|(d, _)| d.path != ssd), "tier status: {st:?}");
    drop_caches();
    verify_known(&fs.mnt, &known, "after device remove");
    // Its id is gone too; removing it again fails.
    device_remove_refused(&fs.mnt, &ssd, "not a device of this pool", "removed twice");
    // New writes still work, and land on the remaining devices.
    for i in 24..28u64 {
        let name = format!("d{i:02}");
        write_known(&fs, &mut known, name, seed ^ i, 2 * MIB);
    }
    fs.remount();
    let devs = check_accounting(&fs.mnt, "after remount");
    assert_eq!(devs.len(), 3, "{devs:#?}");
    drop_caches();
    verify_known(&fs.mnt, &known, "after remount");
    fs.finish();
}

/// The refusals that need a small pool: the only tier device, and a device
/// whose data the others have no room for.
#[test]
fn device_remove_refusals() {
    let mut fs = Fs::create();
    let (hdd, ssd) = (fs.dev("hdd"), fs.dev("ssd"));
    fs.mkfs(&["--device", &format!("hdd:{hdd}:64M")]);
    configure(&fs, &[]);
    // Offline (in-process) and online the same answer.
    device_remove_refused(&fs.pool, &hdd, "only tier device", "offline, only device");
    fs.mount();
    device_remove_refused(&fs.mnt, &hdd, "only tier device", "only device");
    device_add(&fs.mnt, &format!("ssd:{ssd}:32M")).unwrap();
    // 40 MiB: the ssd (28 MiB) fills, the rest goes to the hdd.
    let mut known = Known::new();
    for i in 0..10u64 {
        let name = format!("r{i}");
        write_known(&fs, &mut known, name, 500 + i, 4 * MIB);
    }
    let devs = check_accounting(&fs.mnt, "after writing");
    let (d_ssd, d_hdd) = (dev_at(&devs, &ssd), dev_at(&devs, &hdd));
    assert_eq!(d_ssd.used, d_ssd.size, "{devs:#?}");
    assert!(d_hdd.segments > 0, "{devs:#?}");
    // The hdd's segments do not fit on the full ssd.
    device_remove_refused(&fs.mnt, &hdd, "free segments", "others full");
    // The ssd's do fit on the hdd.
    let r = device_remove(&fs.mnt, &ssd);
    assert_eq!(field_u64(&r, "segments_moved"), d_ssd.segments, "{r:?}");
    let devs = check_accounting(&fs.mnt, "after removing the ssd");
    assert_eq!(devs.len(), 1);
    device_remove_refused(&fs.mnt, &hdd, "only tier device", "only device again");
    drop_caches();
    verify_known(&fs.mnt, &known, "after removal");
    // Offline (the command runs in-process): add a device, then empty and
    // remove the one holding everything.
    let on_hdd = dev_at(&check_accounting(&fs.mnt, "before unmount"), &hdd).segments;
    fs.unmount();
    let ssd2 = fs.dev("ssd2");
    device_add(&fs.pool, &format!("ssd:{ssd2}:64M")).unwrap();
    let r = device_remove(&fs.pool, &hdd);
    assert_eq!(field_u64(&r, "segments_moved"), on_hdd, "{r:?}");
    fs.check();
    fs.mount();
    let devs = check_accounting(&fs.mnt, "after offline add and remove");
    assert_eq!(devs.len(), 1, "{devs:#?}");
    assert_eq!(dev_at(&devs, &ssd2).segments, on_hdd, "{devs:#?}");
    drop_caches();
    verify_known(&fs.mnt, &known, "after offline add and remove");
    fs.finish();
}

/// Two devices of a pool can never be the same file: `device add` with the
/// path of a device already in the pool (which would reformat it under the
/// pool's data) is refused and changes nothing.
#[test]
fn device_add_refuses_a_device_already_in_the_pool() {
    let mut fs = Fs::create();
    let (ssd, hdd) = (fs.dev("ssd"), fs.dev("hdd"));
    let devices = [format!("ssd:{ssd}:64M"), format!("hdd:{hdd}:128M")];
    mount_pool(&mut fs, &devices, &[]);
    let mut known = Known::new();
    for i in 0..20u64 {
        let name = format!("e{i:02}");
        write_known(&fs, &mut known, name, 700 + i, 4 * MIB);
    }
    let before = check_accounting(&fs.mnt, "after writing");
    for spec in [
        format!("hdd:{hdd}:32M"),
        format!("ssd:{ssd}:64M"),
        format!("nvme:{ssd}"),
        format!("ssd:{hdd}:64M:role=cache"),
    ] {
        let r = device_add(&fs.mnt, &spec);
        assert!(
            r.is_err(),
            "device add {spec}: a device already in the pool was accepted again"
        );
        let err = r.unwrap_err().to_string();
        assert!(!err.contains("panicked"), "device add {spec}: {err}");
        assert_eq!(
            info(&fs.mnt).1,
            before,
            "refused device add {spec} changed the pool"
        );
        drop_caches();
        verify_known(&fs.mnt, &known, &format!("after device add {spec}"));
    }
    fs.remount();
    check_accounting(&fs.mnt, "after remount");
    verify_known(&fs.mnt, &known, "after remount");
    fs.finish();
}

/// mkfs naming one file as two devices: refused, or else a pool that works.
#[test]
fn mkfs_refuses_one_file_as_two_devices() {
    let fs2 = Fs::create();
    let same = fs2.dev("same");
    let mut all: Vec<&OsStr> = vec![os("mkfs"), fs2.pool.as_os_str()];
    let specs = [format!("ssd:{same}:64M"), format!("hdd:{same}:128M")];
    for s in &specs {
        all.extend([os("--device"), os(s)]);
    }
    let out = cairn(&all);
    let text = describe(&out);
    assert!(!text.contains("panicked"), "mkfs panicked:\n{text}");
    if out.status.success() {
        let out = cairn(&[os("info"), fs2.pool.as_os_str()]);
        assert!(
            out.status.success(),
            "mkfs accepted one file as two devices and made a pool that cannot be opened:\n{}",
            describe(&out)
        );
    }
}

/// `device remove` while `cairn gc` compacts (and frees) segments of the
/// device being drained: the removal must still complete.
#[test]
fn device_remove_during_gc() {
    let mut fs = Fs::create();
    let (nvme, hdd) = (fs.dev("nvme"), fs.dev("hdd"));
    let devices = [
        format!("nvme:{nvme}:64M:latency=1ms:bw=20M"),
        format!("hdd:{hdd}:512M"),
    ];
    mount_pool(&mut fs, &devices, &[]);
    let mut known = Known::new();
    for i in 10..41u64 {
        let name = format!("g{i}");
        write_known(&fs, &mut known, name, 900 + i, 2_000_000);
    }
    // Every other file of the last ones dies: GC quickly compacts and frees
    // the last segments, which the drain reaches only later.
    for i in (28..41).step_by(2) {
        let name = format!("g{i}");
        fs::remove_file(fs.p(&name)).unwrap();
        known.remove(&name);
    }
    cairn_ok(&[
        os("prune"),
        fs.mnt.as_os_str(),
        os("--keep-history"),
        os("0"),
    ]);
    // The drain (slow device) takes seconds; gc starts while it runs.
    let args = [os("device"), os("remove"), fs.mnt.as_os_str(), os(&nvme)];
    let (mut remove, out, err) = spawn_cairn(&args);
    thread::sleep(Duration::from_millis(300));
    cairn_ok(&[os("gc"), fs.mnt.as_os_str()]);
    let st = wait_until(&mut remove, Duration::from_secs(60)).expect("remove still running");
    assert!(
        st.success(),
        "device remove failed while gc ran\nstdout: {}\nstderr: {}",
        read_back(out),
        read_back(err)
    );
    let devs = check_accounting(&fs.mnt, "after device remove");
    assert_eq!(devs.len(), 1, "{devs:#?}");
    drop_caches();
    verify_known(&fs.mnt, &known, "after device remove");
    fs.remount();
    verify_known(&fs.mnt, &known, "after remount");
    fs.finish();
}
