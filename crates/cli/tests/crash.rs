//! Crash test: in each round a writer thread (in this process) creates files
//! with known pseudo-random contents on the mount, fsyncs some of them and
//! journals what was acknowledged. After a random delay the daemon is killed
//! with SIGKILL, the dead mount is lazily unmounted and the pool remounted.
//! Every fsynced byte must be there; unsynced data may be lost but never
//! garbled (whatever survives is a prefix of what was written). The recovered
//! state is then pinned: later crashes must not change it. Ends with
//! `cairn check`. Seed printed; override with CAIRN_SEED; rounds with
//! CAIRN_CRASH_ROUNDS.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What the writer did to one path (relative to the mount root).
#[derive(Debug, Clone, Default)]
struct Rec {
    /// Every byte ever handed to write(2), in order (a superset of what landed).
    written: Vec<u8>,
    /// Length acknowledged by a successful fsync; None if never fsynced.
    synced: Option<usize>,
    /// Created by rename of a complete, fsynced temp file: all or nothing.
    atomic: bool,
}

#[derive(Default)]
struct Journal {
    files: BTreeMap<String, Rec>,
    /// Round directories, and whether their creation was made durable.
    dirs: BTreeMap<String, bool>,
}

type Shared = Arc<Mutex<Journal>>;

fn with<R>(j: &Shared, f: impl FnOnce(&mut Journal) -> R) -> R {
    f(&mut j.lock().unwrap())
}

// ----------------------------------------------------------------- writer

/// Bytes one round may write (keeps pool size and verification time bounded).
const ROUND_BUDGET: usize = 16 << 20;

/// Writer thread body: returns the first error and when it happened.
fn writer(
    root: PathBuf,
    round: usize,
    seed: u64,
    j: Shared,
    stop: Arc<AtomicBool>,
) -> Option<(Instant, io::Error)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = format!("r{round:02}");
    if let Err(e) = make_round_dir(&root, &dir, &j) {
        return Some((Instant::now(), e));
    }
    for i in 0..300 {
        let bytes = with(&j, |j| {
            j.files
                .iter()
                .filter(|(k, _)| k.starts_with(&dir))
                .map(|(_, r)| r.written.len())
                .sum::<usize>()
        });
        if stop.load(Ordering::SeqCst) || bytes > ROUND_BUDGET {
            return None;
        }
        thread::sleep(Duration::from_millis(rng.gen_range(1..10)));
        let name = format!("{dir}/f{i:03}");
        let res = match rng.gen_range(0..10) {
            0..=5 => plain_file(&root, &name, &mut rng, &j),
            6..=7 => atomic_file(&root, &name, &mut rng, &j),
            _ => small_files(&root, &name, &mut rng, &j),
        };
        if let Err(e) = res {
            return Some((Instant::now(), e));
        }
    }
    None
}

fn make_round_dir(root: &Path, dir: &str, j: &Shared) -> io::Result<()> {
    with(j, |j| j.dirs.insert(dir.to_string(), false));
    fs::create_dir(root.join(dir))?;
    File::open(root)?.sync_all()?;
    with(j, |j| j.dirs.insert(dir.to_string(), true));
    Ok(())
}

/// Create + several appends, each followed by an fsync with probability 1/2.
fn plain_file(root: &Path, name: &str, rng: &mut StdRng, j: &Shared) -> io::Result<()> {
    with(j, |j| j.files.insert(name.to_string(), Rec::default()));
    let mut f = File::create(root.join(name))?;
    for _ in 0..rng.gen_range(1..6) {
        let data = pattern(rng.gen(), rng.gen_range(1..150_000));
        with(j, |j| {
            j.files
                .get_mut(name)
                .unwrap()
                .written
                .extend_from_slice(&data)
        });
        f.write_all(&data)?;
        if rng.gen_bool(0.5) {
            f.sync_all()?;
            with(j, |j| {
                let r = j.files.get_mut(name).unwrap();
                r.synced = Some(r.written.len());
            });
        }
    }
    Ok(())
}

/// Write temp file, fsync, rename over the final name, fsync the directory.
fn atomic_file(root: &Path, name: &str, rng: &mut StdRng, j: &Shared) -> io::Result<()> {
    let tmp = format!("{name}.tmp");
    let data = pattern(rng.gen(), rng.gen_range(1..300_000));
    let rec = Rec {
        written: data.clone(),
        ..Rec::default()
    };
    with(j, |j| j.files.insert(tmp.clone(), rec.clone()));
    let mut f = File::create(root.join(&tmp))?;
    f.write_all(&data)?;
    f.sync_all()?;
    drop(f);
    with(j, |j| {
        j.files.insert(
            name.to_string(),
            Rec {
                atomic: true,
                ..rec
            },
        )
    });
    fs::rename(root.join(&tmp), root.join(name))?;
    File::open(root.join(name).parent().unwrap())?.sync_all()?;
    with(j, |j| {
        j.files.remove(&tmp);
        j.files.get_mut(name).unwrap().synced = Some(data.len());
    });
    Ok(())
}

/// A burst of small files, never fsynced.
fn small_files(root: &Path, name: &str, rng: &mut StdRng, j: &Shared) -> io::Result<()> {
    for k in 0..rng.gen_range(5..30) {
        let n = format!("{name}.s{k:02}");
        let data = pattern(rng.gen(), rng.gen_range(0..5000));
        with(j, |j| {
            j.files.insert(
                n.clone(),
                Rec {
                    written: data.clone(),
                    ..Rec::default()
                },
            )
        });
        fs::write(root.join(&n), &data)?;
    }
    Ok(())
}

// --------------------------------------------------------------- verifier

/// Checks one recorded file against what is on the recovered mount; returns
/// the surviving content (None if absent).
fn verify_file(root: &Path, name: &str, r: &Rec, ctx: &str) -> Option<Vec<u8>> {
    let got = match fs::read(root.join(name)) {
        Ok(d) => d,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            assert!(
                r.synced.is_none(),
                "{ctx}: {name} was fsynced ({:?} bytes) but is missing",
                r.synced
            );
            return None;
        }
        Err(e) => panic!("{ctx}: reading {name}: {e}"),
    };
    let (len, max) = (got.len(), r.written.len());
    if let Some(n) = r.synced {
        assert!(len >= n, "{ctx}: {name} has {len} bytes, {n} were fsynced");
    }
    assert!(
        len <= max,
        "{ctx}: {name} has {len} bytes, longer than the {max} ever written"
    );
    if let Some(i) = first_diff(&got, &r.written[..len]) {
        panic!("{ctx}: {name}: byte {i} differs from what was written (len {len} of {max})");
    }
    assert!(
        !r.atomic || len == max,
        "{ctx}: {name} (atomic rename) is partial: {len} of {max}"
    );
    Some(got)
}

/// Per-round numbers, printed so a run shows the crash really hit in-flight data.
#[derive(Default)]
struct Stats {
    present: usize,
    made: usize,
    synced: usize,
    cut: usize,
}

/// Verifies the recovered tree and pins it: what survived is now durable.
fn verify_and_pin(root: &Path, j: &mut Journal, round: usize, ctx: &str) -> Stats {
    let mut st = Stats::default();
    let prefix = format!("r{round:02}/");
    for (dir, durable) in &j.dirs {
        assert!(
            !durable || root.join(dir).is_dir(),
            "{ctx}: durable directory {dir} is missing"
        );
    }
    j.dirs.retain(|d, _| root.join(d).is_dir());
    j.dirs.values_mut().for_each(|v| *v = true);
    let names: Vec<String> = j.files.keys().cloned().collect();
    for name in names {
        let rec = &j.files[&name];
        let got = verify_file(root, &name, rec, ctx);
        if name.starts_with(&prefix) {
            st.made += 1;
            st.synced += rec.synced.is_some() as usize;
            st.cut += got.as_ref().is_none_or(|d| d.len() < rec.written.len()) as usize;
        }
        match got {
            Some(d) => {
                st.present += 1;
                let pinned = Rec {
                    synced: Some(d.len()),
                    written: d,
                    atomic: false,
                };
                j.files.insert(name, pinned);
            }
            None => drop(j.files.remove(&name)),
        }
    }
    check_no_strangers(root, j, ctx);
    st
}

/// Every entry on the mount must be a journaled directory or file.
fn check_no_strangers(root: &Path, j: &Journal, ctx: &str) {
    let mut seen = BTreeSet::new();
    for d in fs::read_dir(root).unwrap() {
        let d = d.unwrap().file_name().into_string().unwrap();
        assert!(
            j.dirs.contains_key(&d),
            "{ctx}: unexpected entry {d} in the root"
        );
        for f in fs::read_dir(root.join(&d)).unwrap() {
            let f = format!("{d}/{}", f.unwrap().file_name().into_string().unwrap());
            assert!(j.files.contains_key(&f), "{ctx}: unexpected file {f}");
            seen.insert(f);
        }
    }
    assert_eq!(
        seen.len(),
        j.files.len(),
        "{ctx}: journal and tree disagree"
    );
}

// ------------------------------------------------------------------ driver

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be an integer"))
    })
}

/// Mount options vary by round to crash under different commit behaviour.
fn mount_args(round: usize) -> Vec<String> {
    match round % 3 {
        0 => vec![],
        1 => vec!["--commit-interval".into(), "1".into()],
        _ => vec!["--dirty-limit".into(), "4M".into()],
    }
}

/// One round: write, kill -9 at a random moment, remount, verify and pin.
fn crash_round(fs: &mut Fs, j: &Shared, round: usize, rng: &mut StdRng, seed: u64) -> usize {
    let ctx = format!("CAIRN_SEED={seed} round {round}");
    let stop = Arc::new(AtomicBool::new(false));
    let (root, jj, st, wseed) = (fs.mnt.clone(), j.clone(), stop.clone(), rng.gen());
    let handle = thread::spawn(move || writer(root, round, wseed, jj, st));
    thread::sleep(Duration::from_millis(rng.gen_range(50..1500)));
    let killed_at = Instant::now();
    fs.kill9();
    stop.store(true, Ordering::SeqCst);
    if let Some((when, e)) = handle.join().expect("writer thread panicked") {
        assert!(
            when >= killed_at,
            "{ctx}: writer failed before the crash: {e}"
        );
    }
    fs.mount_args = mount_args(round + 1);
    fs.mount();
    let st = verify_and_pin(&fs.mnt, &mut j.lock().unwrap(), round, &ctx);
    println!(
        "{ctx}: writer made {} files ({} fsynced), {} lost or cut short; {} files in the pool",
        st.made, st.synced, st.cut, st.present
    );
    st.synced
}

#[test]
fn kill9_preserves_fsynced_data() {
    let seed = env_u64("CAIRN_SEED").unwrap_or_else(|| rand::thread_rng().gen());
    let rounds = env_u64("CAIRN_CRASH_ROUNDS").unwrap_or(15) as usize;
    println!("crash test: CAIRN_SEED={seed}, {rounds} rounds");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fs = Fs::create();
    let dev = fs.dev("ssd0");
    fs.mkfs(&["--device", &format!("ssd:{dev}:1G")]);
    fs.mount();
    let j: Shared = Arc::default();
    let mut total_synced = 0;
    for round in 0..rounds {
        total_synced += crash_round(&mut fs, &j, round, &mut rng, seed);
        if round % 5 == 4 {
            fs.unmount();
            fs.check();
            fs.mount();
        }
    }
    assert!(
        total_synced >= rounds,
        "only {total_synced} fsynced files in {rounds} rounds: test too weak"
    );
    fs.unmount();
    fs.check();
}
