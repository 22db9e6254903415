//! Power loss simulated at the device backend: a pool opened with a trace
//! storage records every write and sync of its metadata file, intent log
//! and data device while a seeded workload writes files, fsyncs some and
//! flushes once. Crash images are then built from prefixes of the trace
//! (cairn_devices::backend::crash) and opened from a fresh directory with
//! the host's storage: at the point just after each fsync or flush
//! returned, the files are exactly as they were then (those created later
//! do not exist); at random points in between, and at the end with writes
//! never fsynced, `check` is clean and every file fsynced before the point
//! and not changed after it is exact. Seed: CAIRN_SEED (printed).

use cairn_devices::backend::{crash_images, read_images, write_images, CrashMode, Images};
use cairn_devices::backend::{Event, Recorder, TraceStorage};
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{Ctx, Fs, Pool, SnapshotKind, ROOT_INO};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;
use common::flush_in_background;

/// File name -> content.
type Model = BTreeMap<String, Vec<u8>>;

/// A pool with one 64 MiB sparse device inside its directory (crash
/// images of it fit in memory), opened and shut down once so that the
/// intent log and the metadata reserve exist before recording starts.
fn make_pool(dir: &Path) -> PathBuf {
    settle(common::one_device_pool(dir))
}

/// A pool of two 64 MiB sparse devices inside its directory, each with
/// an area holding a copy of the intent log (as pools made with devices
/// of 128 MiB or more have by default), opened and shut down once.
fn make_pool_log_on_devices(dir: &Path) -> PathBuf {
    use cairn_devices::{DeviceClass, DeviceSpec};
    let pool = dir.join("pool");
    let devices = (0..2)
        .map(|i| {
            let path = pool.join(format!("data.{i}"));
            let mut spec = DeviceSpec::tier(DeviceClass::Ssd, path, Some(64 << 20));
            spec.log = Some(cairn_devices::MIN_LOG_AREA);
            spec
        })
        .collect();
    let o = cairn_fs::MkfsOptions {
        devices,
        sparse: true,
        ..Default::default()
    };
    cairn_fs::mkfs(&pool, o).unwrap();
    let pool = settle(pool);
    assert!(
        !cairn_fs::pool::PoolPaths::intent(&pool).exists(),
        "the log is on the devices, not in the pool directory"
    );
    pool
}

/// Opens and shuts down a new pool once.
fn settle(pool: PathBuf) -> PathBuf {
    let fs = Fs::open(Pool::open(&pool, None).unwrap()).unwrap();
    fs.shutdown().unwrap();
    pool
}

/// A pool made in `dir` and opened with a trace storage: the images
/// before the trace, the recorder and the filesystem. The metadata
/// updates that wait in RAM for a batch (dedup entries, creation index
/// removals, live count decrements) are made every few, so that crashes
/// fall both between batches and in the commits that make them.
fn traced(dir: &Path) -> (Images, Arc<Recorder>, Arc<Fs>) {
    traced_with(dir, make_pool)
}

/// `traced` on the pool `make` makes.
fn traced_with(dir: &Path, make: fn(&Path) -> PathBuf) -> (Images, Arc<Recorder>, Arc<Fs>) {
    let pool = make(dir);
    let base = read_images(&pool, &[]).unwrap();
    let rec = Recorder::new(&pool).unwrap();
    let storage = Arc::new(TraceStorage::new(rec.clone()));
    let fs = Fs::open(Pool::open_with(&pool, None, storage).unwrap()).unwrap();
    let meta = &fs.pool().meta;
    meta.dedup_pending().set_batch(5);
    meta.born_pending().set_batch(5);
    meta.live_debts().set_batch(2);
    meta.hist_waiting().set_batch(4);
    (base, rec, fs)
}

/// The ways a crash image is made, used in turn.
const MODES: [CrashMode; 3] = [
    CrashMode::DropUnsynced,
    CrashMode::TearLast,
    CrashMode::KeepRandomSubset,
];

fn write_file(fs: &Fs, ino: u64, off: u64, data: &[u8]) {
    for (i, piece) in data.chunks(128 << 10).enumerate() {
        fs.write(ino, off + (i as u64) * (128 << 10), piece)
            .unwrap();
    }
}

/// Writes `len` random bytes at `at` of root file `name` (made if missing),
/// in the filesystem and in `model`.
fn put(fs: &Fs, model: &mut Model, name: &str, at: usize, len: usize, rng: &mut StdRng) {
    let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
    write_file(fs, common::file_in_root(fs, name), at as u64, &data);
    let f = model.entry(name.to_string()).or_default();
    f.resize(f.len().max(at + len), 0);
    f[at..at + len].copy_from_slice(&data);
}

/// Crash points (event count, index of the last point durable there):
/// each point, 5 random events from `from` to the trace's end `len`, and
/// the end.
fn crash_points(
    points: &[(usize, Model)],
    from: usize,
    len: usize,
    rng: &mut StdRng,
) -> Vec<(usize, usize)> {
    let mut ks: Vec<(usize, usize)> = points.iter().enumerate().map(|(i, p)| (p.0, i)).collect();
    for _ in 0..5 {
        let k = rng.gen_range(from..len);
        ks.push((k, points.iter().rposition(|p| p.0 <= k).unwrap()));
    }
    ks.push((len, points.len() - 1));
    ks
}

fn ino_of(fs: &Fs, name: &str) -> u64 {
    fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino
}

/// What the workload left: the trace, and for each durability point (an
/// fsync or flush that returned) its place in the trace and the files then.
struct Run {
    trace: Vec<Event>,
    points: Vec<(usize, Model)>,
    /// Files never changed after they were first made durable, with the
    /// point index from which on they must be exact.
    stable: Vec<(String, usize)>,
    /// Written after the last durability point (never fsynced).
    loose: Model,
}

/// Writes 14 files (one of 9 MiB, whose fsync commits instead of logging),
/// overwrites parts of `f0` now and then, fsyncs or ticks after most steps
/// and flushes once; then writes two files without fsync.
fn workload(fs: &Fs, rec: &Recorder, rng: &mut StdRng) -> Run {
    let mut model = Model::new();
    let mut points = Vec::new();
    let mut stable = Vec::new();
    let mut unsynced: Vec<String> = Vec::new();
    for step in 0..14 {
        let name = format!("f{step}");
        let len = match step {
            3 => 9 << 20,
            s if s % 3 == 0 => rng.gen_range(50_000..300_000),
            _ => rng.gen_range(1..6000),
        };
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let f = fs
            .create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)
            .unwrap();
        write_file(fs, f.ino, 0, &data);
        model.insert(name.clone(), data);
        if step > 0 {
            unsynced.push(name);
        }
        if step > 0 && rng.gen_bool(0.4) {
            let f0 = model.get_mut("f0").unwrap();
            let at = rng.gen_range(0..f0.len());
            let n = rng.gen_range(1..=4000.min(f0.len() - at));
            let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            f0[at..at + n].copy_from_slice(&bytes);
            write_file(fs, ino_of(fs, "f0"), at as u64, &bytes);
        }
        if step == 7 {
            fs.flush().unwrap();
        } else if rng.gen_bool(0.7) {
            // A tick (the flusher's step between tree commits) makes the
            // changes as durable as an fsync, with the blocks in chunks.
            match rng.gen_bool(0.4) {
                true => fs.tick().unwrap(),
                false => fs.fsync(ino_of(fs, "f0")).unwrap(),
            }
        } else {
            continue;
        }
        let point = points.len();
        stable.extend(unsynced.drain(..).map(|n| (n, point)));
        points.push((rec.len(), model.clone()));
    }
    let mut loose = Model::new();
    for name in ["loose-a", "loose-b"] {
        let data: Vec<u8> = (0..rng.gen_range(1..200_000)).map(|_| rng.gen()).collect();
        let f = fs
            .create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)
            .unwrap();
        write_file(fs, f.ino, 0, &data);
        loose.insert(name.into(), data);
    }
    Run {
        trace: rec.take(),
        points,
        stable,
        loose,
    }
}

/// The pool as a crash after `k` events left it, opened from a fresh
/// directory with the host's storage; `check` must be clean before and
/// after the intent log is replayed.
fn recover(base: &Images, trace: &[Event], k: usize, mode: CrashMode, seed: u64) -> Recovered {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool");
    write_images(&pool, &crash_images(base, trace, k, mode, seed)).unwrap();
    let what = format!(
        "crash at event {k} of {} ({mode:?}, seed {seed})",
        trace.len()
    );
    let p = Pool::open(&pool, None).unwrap_or_else(|e| panic!("{what}: open: {e}"));
    let rep = check_pool(&p).unwrap();
    assert_clean(&rep.problems, &what);
    let committed = p.meta.read().unwrap().counter("last_tid").unwrap();
    let fs = Fs::open(p).unwrap_or_else(|e| panic!("{what}: mount: {e}"));
    Recovered {
        _dir: dir,
        fs,
        what,
        committed,
    }
}

fn assert_clean(problems: &[String], what: &str) {
    let first: Vec<_> = problems.iter().take(5).collect();
    assert!(
        problems.is_empty(),
        "{what}: {} problems: {first:?}",
        problems.len()
    );
}

struct Recovered {
    _dir: tempfile::TempDir,
    fs: Arc<Fs>,
    what: String,
    /// The last committed TID the crash left, before the log's replay.
    committed: u64,
}

impl Recovered {
    fn read(&self, name: &str) -> Option<Vec<u8>> {
        let f = self.fs.lookup(ROOT_INO, name.as_bytes()).ok()?;
        Some(self.fs.read(f.ino, 0, f.size as u32 + 1).unwrap())
    }

    fn expect(&self, name: &str, want: &[u8]) {
        let got = self.read(name);
        let got = got.unwrap_or_else(|| panic!("{}: {name} is missing", self.what));
        assert!(
            got == want,
            "{}: {name} has {} bytes, {} expected{}",
            self.what,
            got.len(),
            want.len(),
            if got.len() == want.len() {
                " (content differs)"
            } else {
                ""
            }
        );
    }

    /// The files of `points[i]`, the last point durable at event `k`; or,
    /// when `k` falls between it and the next point, those of the next: the
    /// write of the record that made them durable may outlive a crash
    /// before its sync.
    fn expect_point(&self, points: &[(usize, Model)], i: usize, k: usize) {
        let holds = |m: &Model| {
            m.iter()
                .all(|(f, want)| self.read(f).as_ref() == Some(want))
        };
        if let Some(next) = points.get(i + 1).filter(|_| points[i].0 < k) {
            if holds(&next.1) {
                return;
            }
        }
        for (name, data) in &points[i].1 {
            self.expect(name, data);
        }
    }

    /// The snapshot `name` exists, at `tid`, and holds exactly `files`.
    fn expect_snapshot(&self, name: &str, tid: u64, files: &Model) {
        let s = self.fs.snapshot(name);
        let s = s.unwrap_or_else(|e| panic!("{}: snapshot {name}: {e}", self.what));
        assert_eq!(s.tid, tid, "{}: snapshot {name}'s TID", self.what);
        let listed = self.fs.asof_readdir(ROOT_INO, tid, 0, 1000).unwrap();
        assert_eq!(
            listed.len(),
            files.len() + 2,
            "{}: files in snapshot {name}",
            self.what
        );
        for (f, want) in files {
            let i = self.fs.asof_lookup(ROOT_INO, tid, f.as_bytes());
            let i = i.unwrap_or_else(|e| panic!("{}: {f} in {name}: {e}", self.what));
            let got = self.fs.asof_read(i.ino, tid, 0, i.size as u32 + 1);
            assert!(
                got.unwrap() == *want,
                "{}: {f} in {name} differs",
                self.what
            );
        }
    }

    /// Flushes what the replay left and checks the pool once more.
    fn finish(self) {
        self.fs.shutdown().unwrap();
        let rep = check_pool(self.fs.pool()).unwrap();
        assert_clean(&rep.problems, &self.what);
    }
}

fn seed() -> u64 {
    let seed = std::env::var("CAIRN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("CAIRN_SEED={seed}");
    seed
}

#[test]
fn fsynced_files_survive_simulated_power_loss() {
    power_loss_keeps_fsynced_files(make_pool);
}

/// The same with the intent log's two copies in areas of two devices:
/// records torn or lost in either copy at the crash lose nothing that an
/// fsync acknowledged.
#[test]
fn fsynced_files_survive_power_loss_with_the_log_on_two_devices() {
    power_loss_keeps_fsynced_files(make_pool_log_on_devices);
}

fn power_loss_keeps_fsynced_files(make: fn(&Path) -> PathBuf) {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let d = tempfile::tempdir().unwrap();
    let (base, rec, fs) = traced_with(d.path(), make);
    let run = workload(&fs, &rec, &mut rng);
    drop(fs); // the power goes: nothing after the trace counts
    let at: Vec<usize> = run.points.iter().map(|p| p.0).collect();
    println!("{} events, durable at {at:?}", run.trace.len());
    assert!(run.points.len() >= 3, "too few durability points");
    // Just after each fsync or flush returned: exactly the files then.
    let last = run.points.last().unwrap().1.clone();
    for (i, (k, model)) in run.points.iter().enumerate() {
        let r = recover(&base, &run.trace, *k, MODES[i % 3], seed ^ i as u64);
        for (name, data) in model {
            r.expect(name, data);
        }
        for name in last.keys().filter(|n| !model.contains_key(*n)) {
            assert!(r.read(name).is_none(), "{}: {name} exists", r.what);
        }
        r.finish();
    }
    // Anywhere between them, and after the last: what was durable stays.
    let end = run.trace.len();
    let mut ks: Vec<usize> = (0..6)
        .map(|_| rng.gen_range(run.points[0].0..end))
        .collect();
    ks.push(end);
    for (j, &k) in ks.iter().enumerate() {
        let done = run.points.iter().filter(|(p, _)| *p <= k).count();
        let r = recover(&base, &run.trace, k, MODES[j % 3], seed ^ (k as u64));
        for (name, from) in &run.stable {
            if *from < done {
                r.expect(name, &last[name]);
            }
        }
        for (name, data) in &run.loose {
            if let Some(got) = r.read(name) {
                assert!(data.starts_with(&got), "{}: {name} not a prefix", r.what);
            }
        }
        r.finish();
    }
}

/// fsync while a flush commits (the intent log's second region): files
/// fsynced while the commit is under way are not held up by it, and a
/// power loss at any point (before the commit is made, or after) keeps
/// each of them once its fsync returned, with a file written before the
/// flush and never fsynced itself (an fsync covers every file).
///
/// The run needs at least two fsyncs to return while the commit runs; on
/// a machine so busy that the commit ends first, it is run again (at most
/// three times) rather than checking nothing.
#[test]
fn fsyncs_during_a_commit_survive_power_loss() {
    let seed = seed();
    let ran = (0..3).any(|attempt| fsyncs_during_a_commit(seed ^ attempt));
    assert!(
        ran,
        "in 3 runs, fewer than 2 fsyncs returned while the commit ran"
    );
}

/// One run of `fsyncs_during_a_commit_survive_power_loss`; false when too
/// few fsyncs returned during the commit to check anything.
fn fsyncs_during_a_commit(seed: u64) -> bool {
    let mut rng = StdRng::seed_from_u64(seed);
    let d = tempfile::tempdir().unwrap();
    let (base, rec, fs) = traced(d.path());
    let mut model = Model::new();
    fn add(fs: &Fs, model: &mut Model, name: String, len: usize, rng: &mut StdRng) {
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let f = fs
            .create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)
            .unwrap();
        write_file(fs, f.ino, 0, &data);
        model.insert(name, data);
    }
    // Logged before the flush: the commit has 6 MiB of blocks to write.
    for i in 0..6 {
        add(&fs, &mut model, format!("big{i}"), 1 << 20, &mut rng);
        fs.fsync(ino_of(&fs, &format!("big{i}"))).unwrap();
    }
    // Written before the flush and never fsynced itself.
    add(&fs, &mut model, "unsynced".into(), 50_000, &mut rng);
    let tid = fs.last_tid();
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut points = Vec::new();
    let mut during = 0;
    std::thread::scope(|s| {
        // From the seal on: "unsynced" is in no record, only in the
        // overlay being committed.
        let flushed = flush_in_background(s, &fs, &done);
        for i in 0.. {
            let finished = done.load(std::sync::atomic::Ordering::SeqCst);
            if finished && i >= 4 {
                break;
            }
            let name = format!("small{i}");
            add(
                &fs,
                &mut model,
                name.clone(),
                rng.gen_range(1..3000),
                &mut rng,
            );
            fs.fsync(ino_of(&fs, &name)).unwrap();
            if !done.load(std::sync::atomic::Ordering::SeqCst) {
                during += 1;
            }
            points.push((rec.len(), model.clone()));
        }
        flushed.join().unwrap().unwrap();
    });
    assert_eq!(fs.last_tid(), tid + 1, "one commit");
    // And one after the commit, on top of it.
    add(&fs, &mut model, "after".into(), 700, &mut rng);
    fs.fsync(ino_of(&fs, "after")).unwrap();
    points.push((rec.len(), model.clone()));
    let trace = rec.take();
    drop(fs); // the power goes
    println!(
        "{} events, {during} fsyncs during the commit, durable at {:?}",
        trace.len(),
        points.iter().map(|p| p.0).collect::<Vec<_>>()
    );
    // Waiting for the commit, none would (the first one might, between its
    // end and `done`).
    if during < 2 {
        println!("only {during} fsyncs returned while the commit ran: again");
        return false;
    }
    let mut ks: Vec<(usize, usize)> = points.iter().enumerate().map(|(i, p)| (p.0, i)).collect();
    // And between them: what the fsyncs before made durable stays.
    for _ in 0..4 {
        let k = rng.gen_range(points[0].0..trace.len());
        let i = points.iter().rposition(|p| p.0 <= k).unwrap();
        ks.push((k, i));
    }
    let mut on = BTreeMap::new();
    for (j, &(k, i)) in ks.iter().enumerate() {
        let r = recover(&base, &trace, k, MODES[j % 3], seed ^ k as u64);
        r.expect_point(&points, i, k);
        *on.entry(r.committed).or_insert(0) += 1;
        r.finish();
    }
    // Both replays ran: of the two regions on top of the old TID, and of
    // the second one on top of the commit.
    assert!(
        on.contains_key(&tid) && on.contains_key(&(tid + 1)),
        "crash points by committed TID: {on:?}"
    );
    true
}

/// A snapshot taken while a flush commits (`snapshot_during_commit`): it
/// returns before that commit ends, with files changed both before the
/// seal and after it, and a crash at any point from its return on keeps
/// it, at the TID it was given, with exactly the files of that moment;
/// the fsyncs after it keep theirs. Reads meanwhile see the newest of the
/// three overlays (dirty, the snapshot's, the one being committed).
#[test]
fn a_snapshot_during_a_commit_survives_power_loss() {
    snapshot_during_a_commit(true);
}

/// The same with no fsync before the flush (a volume written without
/// FLUSH): the snapshot's record is the only one, in the region on the TID
/// being committed, and holds all that TID's changes too.
#[test]
fn a_snapshot_during_the_commit_of_unlogged_changes_survives_power_loss() {
    snapshot_during_a_commit(false);
}

/// The two tests above; `fsync_first`: the files the flush commits were
/// fsynced before it (their records are in the other region).
fn snapshot_during_a_commit(fsync_first: bool) {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let d = tempfile::tempdir().unwrap();
    let (base, rec, fs) = traced(d.path());
    let mut model = Model::new();
    let expect_all = |fs: &Fs, model: &Model| {
        for (name, want) in model {
            let i = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
            assert!(
                fs.read(i.ino, 0, i.size as u32 + 1).unwrap() == *want,
                "{name} reads wrong"
            );
        }
    };
    // Before the flush: its commit has 6 MiB of blocks to write.
    for i in 0..6 {
        put(&fs, &mut model, &format!("big{i}"), 0, 1 << 20, &mut rng);
        if fsync_first {
            fs.fsync(ino_of(&fs, &format!("big{i}"))).unwrap();
        }
    }
    put(&fs, &mut model, "unsynced", 0, 50_000, &mut rng);
    let tid = fs.last_tid();
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut points = Vec::new();
    let (snap, snap_files, snap_at) = std::thread::scope(|s| {
        let flushed = flush_in_background(s, &fs, &done);
        // After the seal: a new file, and overwrites of blocks the commit
        // holds (a whole one, and a part of one).
        put(
            &fs,
            &mut model,
            "during",
            0,
            rng.gen_range(1..5000),
            &mut rng,
        );
        put(&fs, &mut model, "big0", 0, 64 << 10, &mut rng);
        put(&fs, &mut model, "big1", 1000, 3000, &mut rng);
        let snap = fs.snapshot_create("s", SnapshotKind::Named).unwrap();
        assert!(
            !done.load(std::sync::atomic::Ordering::SeqCst),
            "the snapshot waited for the commit"
        );
        let snap_at = rec.len();
        let snap_files = model.clone();
        points.push((snap_at, model.clone()));
        // Above the snapshot, while that commit may still run.
        put(&fs, &mut model, "big1", 2000, 3000, &mut rng);
        put(&fs, &mut model, "after", 0, 700, &mut rng);
        expect_all(&fs, &model);
        fs.fsync(ino_of(&fs, "after")).unwrap();
        points.push((rec.len(), model.clone()));
        flushed.join().unwrap().unwrap();
        (snap, snap_files, snap_at)
    });
    assert_eq!(snap.tid, tid + 2, "on top of the flush's TID");
    // And once both commits are made, on top of them.
    // (The fsync above logs, or flushes when the log still waited for the
    // first commit.)
    fs.commit_cuts();
    assert!(fs.last_tid() >= tid + 2);
    put(&fs, &mut model, "big2", 5, 10, &mut rng);
    fs.fsync(ino_of(&fs, "big2")).unwrap();
    points.push((rec.len(), model.clone()));
    expect_all(&fs, &model);
    let trace = rec.take();
    drop(fs); // the power goes
    let ks = crash_points(&points, snap_at, trace.len(), &mut rng);
    let mut on = BTreeMap::new();
    for (j, &(k, i)) in ks.iter().enumerate() {
        let r = recover(&base, &trace, k, MODES[j % 3], seed ^ k as u64);
        r.expect_point(&points, i, k);
        r.expect_snapshot("s", snap.tid, &snap_files);
        *on.entry(r.committed).or_insert(0) += 1;
        r.finish();
    }
    // The crash points cut both commits short, and neither.
    assert!(
        on.contains_key(&tid) && on.contains_key(&(tid + 2)),
        "crash points by committed TID: {on:?}"
    );
}

/// A cut taken while a flush commits (`cut_during_commit`) returns before
/// that commit ends, sealed as the TID above it, with files changed both
/// before the seal and after it. An fsync after it keeps every change
/// made before it. A crash keeps the cut, with exactly the files of its
/// moment, once its own commit is made, and none before.
#[test]
fn a_cut_during_a_commit_is_kept_once_its_commit_is_made() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let d = tempfile::tempdir().unwrap();
    let (base, rec, fs) = traced(d.path());
    let mut model = Model::new();
    for i in 0..6 {
        put(&fs, &mut model, &format!("big{i}"), 0, 1 << 20, &mut rng);
    }
    let tid = fs.last_tid();
    let done = std::sync::atomic::AtomicBool::new(false);
    // Nothing synced yet: no file is owed before the first fsync.
    let mut points = vec![(rec.len(), Model::new())];
    let (snap, snap_files, snap_at) = std::thread::scope(|s| {
        let flushed = flush_in_background(s, &fs, &done);
        put(
            &fs,
            &mut model,
            "during",
            0,
            rng.gen_range(1..5000),
            &mut rng,
        );
        put(&fs, &mut model, "big0", 0, 64 << 10, &mut rng);
        put(&fs, &mut model, "big1", 1000, 3000, &mut rng);
        let snap = fs.snapshot_cut("s", SnapshotKind::Named).unwrap();
        assert!(
            !done.load(std::sync::atomic::Ordering::SeqCst),
            "the cut waited for the commit"
        );
        let snap_at = rec.len();
        let snap_files = model.clone();
        put(&fs, &mut model, "big1", 2000, 3000, &mut rng);
        put(&fs, &mut model, "after", 0, 700, &mut rng);
        fs.fsync(ino_of(&fs, "after")).unwrap();
        points.push((rec.len(), model.clone()));
        flushed.join().unwrap().unwrap();
        (snap, snap_files, snap_at)
    });
    assert_eq!(snap.tid, tid + 2, "on top of the flush's TID");
    fs.commit_cuts();
    assert_eq!(fs.snapshot("s").unwrap().tid, snap.tid);
    put(&fs, &mut model, "big2", 5, 10, &mut rng);
    fs.fsync(ino_of(&fs, "big2")).unwrap();
    points.push((rec.len(), model.clone()));
    let trace = rec.take();
    drop(fs); // the power goes
    let ks = crash_points(&points, snap_at, trace.len(), &mut rng);
    let mut on = BTreeMap::new();
    for (j, &(k, i)) in ks.iter().enumerate() {
        let r = recover(&base, &trace, k, MODES[j % 3], seed ^ k as u64);
        r.expect_point(&points, i, k);
        if r.committed >= snap.tid {
            r.expect_snapshot("s", snap.tid, &snap_files);
        } else {
            assert!(
                r.fs.snapshot("s").is_err(),
                "{}: a cut not committed",
                r.what
            );
        }
        *on.entry(r.committed).or_insert(0) += 1;
        r.finish();
    }
    assert!(
        on.keys().any(|&t| t < snap.tid) && on.contains_key(&snap.tid),
        "crash points by committed TID: {on:?}"
    );
}

/// A snapshot taken while the commit of a logged one runs is logged on top
/// of it without waiting for that commit (`snapshot_during_commit`, a
/// logged snapshot's commit under way); every crash point keeps both
/// snapshots with their states, and what was fsynced.
#[test]
fn a_snapshot_during_the_commit_of_a_logged_snapshot_survives_power_loss() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let d = tempfile::tempdir().unwrap();
    let (base, rec, fs) = traced(d.path());
    let mut model = Model::new();
    for i in 0..6 {
        put(&fs, &mut model, &format!("big{i}"), 0, 1 << 20, &mut rng);
    }
    let tid = fs.last_tid();
    let s1 = fs.snapshot_create("s1", SnapshotKind::Named).unwrap();
    let s1_files = model.clone();
    let mut points = vec![(rec.len(), model.clone())];
    let done = std::sync::atomic::AtomicBool::new(false);
    let (s2, s2_files, s2_at) = std::thread::scope(|s| {
        s.spawn(|| {
            fs.commit_cuts();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        put(&fs, &mut model, "big0", 0, 64 << 10, &mut rng);
        put(
            &fs,
            &mut model,
            "during",
            0,
            rng.gen_range(1..5000),
            &mut rng,
        );
        let s2 = fs.snapshot_create("s2", SnapshotKind::Named).unwrap();
        assert!(
            !done.load(std::sync::atomic::Ordering::SeqCst),
            "the second snapshot waited for the first one's commit"
        );
        points.push((rec.len(), model.clone()));
        let s2_files = model.clone();
        let s2_at = rec.len();
        put(&fs, &mut model, "after", 0, 700, &mut rng);
        fs.fsync(ino_of(&fs, "after")).unwrap();
        points.push((rec.len(), model.clone()));
        (s2, s2_files, s2_at)
    });
    assert_eq!((s1.tid, s2.tid), (tid + 1, tid + 2));
    fs.commit_cuts();
    assert!(fs.last_tid() >= tid + 2);
    let trace = rec.take();
    drop(fs); // the power goes
    let ks = crash_points(&points, s2_at, trace.len(), &mut rng);
    for (j, &(k, i)) in ks.iter().enumerate() {
        let r = recover(&base, &trace, k, MODES[j % 3], seed ^ k as u64);
        r.expect_point(&points, i, k);
        r.expect_snapshot("s1", s1.tid, &s1_files);
        if k >= s2_at {
            r.expect_snapshot("s2", s2.tid, &s2_files);
        }
        r.finish();
    }
}
