//! The sharded state lock (`state.rs`) under threads that race on one small
//! tree straight through the `Fs` API (no kernel serializing renames):
//! cross-directory renames in both directions, directory moves that could
//! make loops, create, link, unlink, mkdir, rmdir, writes and fsync, with
//! flushes in between. A watchdog fails the test if the threads stop making
//! progress (a deadlock); afterwards the committed tree must pass `check`,
//! every directory must be reachable from the root, and a reopened pool
//! must show the same tree.

use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{Ctx, FileKind, Fs, RenameFlags, ROOT_INO};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{make, reopen};

const THREADS: u64 = 6;
const NAMES: &[&[u8]] = &[b"a", b"b", b"c", b"d", b"e", b"f"];

/// A random directory of the tree (by walking down from the root).
fn random_dir(fs: &Fs, rng: &mut StdRng) -> u64 {
    let mut dir = ROOT_INO;
    for _ in 0..rng.gen_range(0..4) {
        let name = NAMES[rng.gen_range(0..NAMES.len())];
        match fs.lookup(dir, name) {
            Ok(i) if i.kind == FileKind::Dir => dir = i.ino,
            _ => break,
        }
    }
    dir
}

fn step(fs: &Fs, rng: &mut StdRng) {
    let (d1, d2) = (random_dir(fs, rng), random_dir(fs, rng));
    let n1 = NAMES[rng.gen_range(0..NAMES.len())];
    let n2 = NAMES[rng.gen_range(0..NAMES.len())];
    // Errors are expected (names taken, gone, not empty, loops refused).
    let _ = match rng.gen_range(0..100) {
        0..=29 => fs.rename(d1, n1, d2, n2, RenameFlags::default()),
        30..=39 => fs.rename(
            d1,
            n1,
            d2,
            n2,
            RenameFlags {
                exchange: true,
                ..Default::default()
            },
        ),
        40..=54 => fs.mkdir(Ctx::ROOT, d1, n1, 0o755).map(|_| ()),
        55..=64 => fs.rmdir(d1, n1),
        65..=74 => fs
            .create(Ctx::ROOT, d1, n1, 0o644)
            .map(|i| fs.release(i.ino)),
        75..=81 => fs.unlink(d1, n1),
        82..=87 => fs
            .lookup(d1, n1)
            .and_then(|i| fs.link(i.ino, d2, n2))
            .map(|_| ()),
        88..=95 => fs.lookup(d1, n1).and_then(|i| {
            if i.kind == FileKind::File {
                fs.write(i.ino, rng.gen_range(0..200_000), &[7; 3000])?;
            }
            Ok(())
        }),
        _ => fs.fsync(ROOT_INO),
    };
}

/// Every directory reachable from the root, each once, with ".." right.
fn walk(fs: &Fs) -> Vec<(Vec<u8>, u64, FileKind)> {
    let mut out = Vec::new();
    let mut stack = vec![(b"".to_vec(), ROOT_INO)];
    while let Some((path, dir)) = stack.pop() {
        assert!(out.len() < 100_000, "the tree has a loop");
        for e in fs.readdir(dir, 0, 10_000).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let mut p = path.clone();
            p.push(b'/');
            p.extend_from_slice(&e.name);
            let i = fs.lookup(dir, &e.name).unwrap();
            assert_eq!(i.ino, e.ino);
            out.push((p.clone(), i.ino, i.kind));
            if i.kind == FileKind::Dir {
                assert_eq!(i.parent, dir, "'..' of {}", String::from_utf8_lossy(&p));
                stack.push((p, i.ino));
            }
        }
    }
    out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    out
}

#[test]
fn racing_renames_and_namespace_changes_keep_a_sound_tree() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let ops = std::env::var("CAIRN_SHARD_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60_000u64);
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (fs, done) = (fs.clone(), done.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(0x5eed + t);
                for n in 0..ops / THREADS {
                    step(&fs, &mut rng);
                    if t == 0 && n % 2000 == 1999 {
                        fs.flush().unwrap();
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Watchdog: some operation must finish every 10 s.
    let (mut last, mut since) = (0, Instant::now());
    while done.load(Ordering::Relaxed) < ops / THREADS * THREADS {
        std::thread::sleep(Duration::from_millis(100));
        let now = done.load(Ordering::Relaxed);
        if now != last {
            (last, since) = (now, Instant::now());
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "no operation finished for 10 s after {now}: deadlock"
        );
    }
    for w in workers {
        w.join().expect("a worker panicked");
    }
    let tree = walk(&fs);
    let dirs = tree.iter().filter(|e| e.2 == FileKind::Dir).count();
    eprintln!(
        "{ops} operations; the tree ends with {} names, {dirs} directories",
        tree.len()
    );
    assert!(dirs > 3, "too few directories for the races to matter");
    fs.flush().unwrap();
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "check: {:?}", rep.problems);
    fs.shutdown().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    assert_eq!(walk(&fs), tree, "the tree changed across a remount");
}
