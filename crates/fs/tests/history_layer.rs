//! History at the filesystem layer, without FUSE: as-of reads, snapshots
//! and their hashes, prune with snapshots retained, and reblock (alone and
//! under concurrent writers) with every version read back bit-exact.

use cairn_fs::{
    maintenance::check::check_pool, mkfs, Ctx, Fs, MkfsOptions, Pool, PrunePolicy, ReblockOptions,
    SnapshotKind, ROOT_INO,
};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod common;

fn make(dir: &Path) -> Arc<Fs> {
    let o = MkfsOptions {
        segment_size: 1 << 20,
        sparse: true,
        ..MkfsOptions::default()
    };
    mkfs(&dir.join("pool"), o).unwrap();
    reopen(dir)
}

fn reopen(dir: &Path) -> Arc<Fs> {
    Fs::open(Pool::open(&dir.join("pool"), None).unwrap()).unwrap()
}

fn data(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

const NONE_KEPT: PrunePolicy = PrunePolicy {
    retention_secs: 0,
    keep_daily: 0,
    keep_weekly: 0,
    keep_monthly: 0,
};

/// Four files written block by block in turn (so their chunks interleave),
/// flushed after each round.
fn interleaved(fs: &Fs, rounds: usize, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let block = fs.record_size() as usize;
    let mut files: Vec<(u64, Vec<u8>)> = (0..4)
        .map(|i| {
            let ino = common::file_in_root(fs, &format!("f{i}"));
            (ino, Vec::new())
        })
        .collect();
    for r in 0..rounds {
        for (k, (ino, content)) in files.iter_mut().enumerate() {
            let b = data(block, seed * 1000 + (r * 4 + k) as u64);
            fs.write(*ino, (r * block) as u64, &b).unwrap();
            content.extend_from_slice(&b);
        }
        fs.flush().unwrap();
    }
    files
}

fn read_all(fs: &Fs, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    fs.read(ino, 0, size as u32).unwrap()
}

#[test]
fn asof_snapshot_prune_reblock_keep_every_version() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let v1 = interleaved(&fs, 24, 1);
    let t1 = fs.last_tid();
    let snap = fs.snapshot_create("one", SnapshotKind::Named).unwrap();
    assert_eq!(snap.tid, t1);
    fs.hash_pending_snapshots().unwrap();
    let h1 = fs.snapshot("one").unwrap().hash.expect("hash computed");
    // Overwrite everything twice: the first overwrite is prunable history.
    interleaved(&fs, 24, 2);
    let v3 = interleaved(&fs, 24, 3);
    let before = fs.pool().chunks.free_bytes();
    let rep = fs.prune(&NONE_KEPT, false).unwrap();
    assert!(rep.bytes_freed > 0, "{rep:?}");
    assert!(fs.pool().chunks.free_bytes() > before);
    // What the snapshot sees is still exact, through as-of reads.
    for (ino, want) in &v1 {
        assert_eq!(&fs.asof_read(*ino, t1, 0, want.len() as u32).unwrap(), want);
    }
    // Delete two files: their segments become sparse; reblock compacts.
    fs.unlink(ROOT_INO, b"f0").unwrap();
    fs.unlink(ROOT_INO, b"f1").unwrap();
    fs.prune(&NONE_KEPT, false).unwrap();
    let r = fs.reblock(&ReblockOptions::default(), &|_, _| {}).unwrap();
    assert!(r.chunks_moved > 0 && r.segments_freed > 0, "{r:?}");
    assert!(r.damaged.is_empty());
    for (ino, want) in &v3[2..] {
        assert_eq!(&read_all(&fs, *ino), want);
    }
    for (ino, want) in &v1 {
        assert_eq!(&fs.asof_read(*ino, t1, 0, want.len() as u32).unwrap(), want);
    }
    assert_eq!(fs.tree_hash_verified(t1).unwrap().hash, h1);
    let v = fs.snapshot_verify("one").unwrap();
    assert!(v.matches && v.damaged.is_empty(), "{v:?}");
    // Deleting the snapshot and pruning gives its space back.
    let usage = fs.snapshot_usage().unwrap();
    assert!(usage[0].unique_bytes > 0);
    let before = fs.pool().chunks.free_bytes();
    fs.snapshot_delete("one").unwrap();
    fs.prune(&NONE_KEPT, false).unwrap();
    assert!(fs.pool().chunks.free_bytes() > before);
    assert!(
        fs.asof_read(v1[0].0, t1, 0, 10).is_err(),
        "pruned TID is not readable"
    );
    fs.shutdown().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    for (ino, want) in &v3[2..] {
        assert_eq!(&read_all(&fs, *ino), want);
    }
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn reblock_under_concurrent_writes() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let v = interleaved(&fs, 32, 5);
    fs.unlink(ROOT_INO, b"f1").unwrap();
    fs.unlink(ROOT_INO, b"f3").unwrap();
    fs.prune(&NONE_KEPT, false).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let ino = fs.create(Ctx::ROOT, ROOT_INO, b"w", 0o644).unwrap().ino;
            let mut round = 0u64;
            while !stop.load(Ordering::SeqCst) || round < 5 {
                let b = data(200_000, 100 + round);
                fs.write(ino, 0, &b).unwrap();
                fs.flush().unwrap();
                assert_eq!(fs.read(ino, 0, 200_000).unwrap(), b, "round {round}");
                round += 1;
            }
            round
        })
    };
    let readers: Vec<_> = [0usize, 2]
        .into_iter()
        .map(|k| {
            let (fs, stop, (ino, want)) = (fs.clone(), stop.clone(), v[k].clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    assert_eq!(read_all(&fs, ino), want);
                }
            })
        })
        .collect();
    let r = fs.reblock(&ReblockOptions::default(), &|_, _| {}).unwrap();
    stop.store(true, Ordering::SeqCst);
    assert!(writer.join().unwrap() >= 5);
    for t in readers {
        t.join().unwrap();
    }
    assert!(r.chunks_moved > 0, "{r:?}");
    for k in [0, 2] {
        assert_eq!(read_all(&fs, v[k].0), v[k].1);
    }
    fs.shutdown().unwrap();
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn dedup_refcounts_respect_history_and_prune() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let block = fs.record_size() as usize;
    let body = data(block * 16, 77);
    // Within a file: the same block four times.
    let mut rep4 = Vec::new();
    for _ in 0..4 {
        rep4.extend_from_slice(&body[..block]);
    }
    let mk = |name: &str, content: &[u8]| {
        let i = fs
            .create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)
            .unwrap();
        fs.write(i.ino, 0, content).unwrap();
        fs.release(i.ino);
        i.ino
    };
    let a = mk("a", &body);
    let b = mk("b", &body); // same flush as a
    let r = mk("r", &rep4);
    fs.flush().unwrap();
    let c = mk("c", &body); // a later flush: dedups against committed chunks
    fs.flush().unwrap();
    let info = cairn_fs::maintenance::info::pool_info(fs.pool()).unwrap();
    assert_eq!(info.unique_bytes, body.len() as u64, "{info:?}");
    assert_eq!(
        info.referenced_bytes,
        3 * body.len() as u64 + rep4.len() as u64
    );
    let t = fs.snapshot_create("s", SnapshotKind::Named).unwrap().tid;
    // Drop every current reference: the snapshot still holds the chunks.
    for n in ["a", "b", "c", "r"] {
        fs.unlink(ROOT_INO, n.as_bytes()).unwrap();
    }
    fs.prune(&NONE_KEPT, false).unwrap();
    for ino in [a, b, c] {
        assert_eq!(fs.asof_read(ino, t, 0, body.len() as u32).unwrap(), body);
    }
    assert_eq!(fs.asof_read(r, t, 0, rep4.len() as u32).unwrap(), rep4);
    // New content equal to the snapshot's dedups against history.
    let e = mk("e", &body);
    fs.flush().unwrap();
    let info = cairn_fs::maintenance::info::pool_info(fs.pool()).unwrap();
    assert_eq!(info.unique_bytes, body.len() as u64);
    fs.snapshot_delete("s").unwrap();
    fs.prune(&NONE_KEPT, false).unwrap();
    assert_eq!(read_all(&fs, e), body);
    fs.unlink(ROOT_INO, b"e").unwrap();
    let rep = fs.prune(&NONE_KEPT, false).unwrap();
    assert_eq!(rep.chunks_freed, 16, "{rep:?}");
    let info = cairn_fs::maintenance::info::pool_info(fs.pool()).unwrap();
    assert_eq!((info.unique_bytes, info.index_entries), (0, 0), "{info:?}");
    fs.shutdown().unwrap();
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

const NOHIST: &[u8] = b"user.cairn.nohistory";

fn stored_bytes(fs: &Fs) -> u64 {
    cairn_fs::maintenance::info::pool_info(fs.pool())
        .unwrap()
        .stored_bytes
}

fn overwrite(fs: &Fs, ino: u64, content: &[u8]) {
    fs.write(ino, 0, content).unwrap();
    fs.flush().unwrap();
}

#[test]
fn nohistory_files_keep_no_old_versions_and_snapshots_read_exactly() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"vm.img", 0o644).unwrap();
    fs.setxattr(f.ino, NOHIST, b"1", cairn_fs::XattrMode::Any)
        .unwrap();
    // Only "1" is a value of the switch.
    assert!(fs
        .setxattr(f.ino, NOHIST, b"0", cairn_fs::XattrMode::Any)
        .is_err());
    let n = 1 << 20;
    overwrite(&fs, f.ino, &data(n, 1));
    let stored0 = stored_bytes(&fs);
    assert!(stored0 >= n as u64, "{stored0}");
    for k in 2..=5 {
        overwrite(&fs, f.ino, &data(n, k));
        assert_eq!(read_all(&fs, f.ino), data(n, k));
    }
    // No old versions kept, and the overwritten data is gone from the pool.
    let v = fs.history(f.ino).unwrap();
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(stored_bytes(&fs), stored0, "overwrites grew the pool");
    // A snapshot keeps its version: overwrites after it cost one copy.
    let snap = fs.snapshot_create("s1", SnapshotKind::Named).unwrap();
    for k in 6..=8 {
        overwrite(&fs, f.ino, &data(n, k));
    }
    let v = fs.history(f.ino).unwrap();
    assert_eq!(v.len(), 2, "the snapshot's version and the current: {v:?}");
    assert!(v[0].tid <= snap.tid, "{v:?}");
    assert_eq!(stored_bytes(&fs), 2 * stored0);
    let at = fs.asof_read(f.ino, snap.tid, 0, n as u32).unwrap();
    assert!(at == data(n, 5), "snapshot view differs");
    assert_eq!(read_all(&fs, f.ino), data(n, 8));
    let ver = fs.snapshot_verify("s1").unwrap();
    assert!(ver.matches, "{ver:?}");
    // A file with history on keeps every version (the contrast).
    let g = fs.create(Ctx::ROOT, ROOT_INO, b"plain", 0o644).unwrap();
    for k in 10..=12 {
        overwrite(&fs, g.ino, &data(n, k));
    }
    assert_eq!(fs.history(g.ino).unwrap().len(), 3);
    assert_eq!(stored_bytes(&fs), 5 * stored0);
    // Durable: after a restart nothing changed and the counts check out.
    fs.shutdown().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert_eq!(fs.getxattr(f.ino, NOHIST).unwrap(), b"1");
    overwrite(&fs, f.ino, &data(n, 9));
    assert_eq!(stored_bytes(&fs), 5 * stored0);
    let at = fs.asof_read(f.ino, snap.tid, 0, n as u32).unwrap();
    assert!(at == data(n, 5), "snapshot view differs after restart");
    // Deleting the file frees its data at once, except what the snapshot
    // sees, which still reads back.
    fs.unlink(ROOT_INO, b"vm.img").unwrap();
    fs.flush().unwrap();
    assert_eq!(stored_bytes(&fs), 4 * stored0);
    let at = fs.asof_read(f.ino, snap.tid, 0, n as u32).unwrap();
    assert!(at == data(n, 5), "snapshot view differs after the delete");
    // Removing the switch turns history back on.
    fs.removexattr(g.ino, NOHIST).unwrap_err();
    let h = fs.create(Ctx::ROOT, ROOT_INO, b"h", 0o644).unwrap();
    fs.setxattr(h.ino, NOHIST, b"1", cairn_fs::XattrMode::Any)
        .unwrap();
    overwrite(&fs, h.ino, &data(n, 20));
    overwrite(&fs, h.ino, &data(n, 21));
    assert_eq!(fs.history(h.ino).unwrap().len(), 1);
    fs.removexattr(h.ino, NOHIST).unwrap();
    fs.flush().unwrap();
    overwrite(&fs, h.ino, &data(n, 22));
    overwrite(&fs, h.ino, &data(n, 23));
    assert_eq!(fs.history(h.ino).unwrap().len(), 3);
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn nodes_created_in_a_nohistory_directory_inherit_it() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let db = fs.mkdir(Ctx::ROOT, ROOT_INO, b"db", 0o755).unwrap();
    let before = fs.create(Ctx::ROOT, db.ino, b"before", 0o644).unwrap();
    fs.setxattr(db.ino, NOHIST, b"1", cairn_fs::XattrMode::Any)
        .unwrap();
    let f = fs.create(Ctx::ROOT, db.ino, b"table", 0o644).unwrap();
    let sub = fs.mkdir(Ctx::ROOT, db.ino, b"sub", 0o755).unwrap();
    let g = fs.create(Ctx::ROOT, sub.ino, b"deep", 0o644).unwrap();
    let l = fs.symlink(Ctx::ROOT, sub.ino, b"link", b"deep").unwrap();
    let outside = fs.create(Ctx::ROOT, ROOT_INO, b"outside", 0o644).unwrap();
    fs.flush().unwrap();
    for ino in [f.ino, sub.ino, g.ino, l.ino] {
        assert_eq!(fs.getxattr(ino, NOHIST).unwrap(), b"1", "inode {ino}");
    }
    // Only what is created after the switch, and only inside.
    assert!(fs.getxattr(before.ino, NOHIST).is_err());
    assert!(fs.getxattr(outside.ino, NOHIST).is_err());
    // The inherited switch works: no versions kept for the deep file, every
    // version for the one made before the switch.
    let n = 256 << 10;
    for k in 1..=3 {
        overwrite(&fs, g.ino, &data(n, k));
        overwrite(&fs, before.ino, &data(n, 10 + k));
    }
    assert_eq!(fs.history(g.ino).unwrap().len(), 1);
    assert!(fs.history(before.ino).unwrap().len() >= 3);
    // Durable across a restart.
    fs.shutdown().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    let e = fs.create(Ctx::ROOT, sub.ino, b"later", 0o644).unwrap();
    assert_eq!(fs.getxattr(e.ino, NOHIST).unwrap(), b"1");
    assert_eq!(fs.getxattr(g.ino, NOHIST).unwrap(), b"1");
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}
