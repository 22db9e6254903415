//! Small overwrites of committed blocks stored as pieces
//! (`writeback/pieces.rs`): random small writes across flushes, crashes
//! and history reads give back exactly what was written; `check` stays
//! clean; the history they leave grows with the bytes overwritten, not by a
//! whole chunk per write; a flush of pieces reads nothing from the devices;
//! a small read of a pieced block reads only the chunk bytes it returns.

use cairn_fs::maintenance::{check::check_pool, info::pool_info};
use cairn_fs::{Ctx, Fs, ROOT_INO};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

mod common;
use common::{make, reopen};

const FILE: usize = 8 << 20;

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.gen()).collect()
}

/// A pool with an 8 MiB file of random bytes, committed.
fn setup(dir: &std::path::Path, rng: &mut StdRng) -> (Arc<Fs>, u64, Vec<u8>) {
    let fs = make(dir);
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"db", 0o644).unwrap();
    let model = random_bytes(rng, FILE);
    fs.write(f.ino, 0, &model).unwrap();
    fs.flush().unwrap();
    (fs, f.ino, model)
}

fn assert_clean(fs: &Fs) {
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "check: {:?}", rep.problems);
}

fn device_reads(fs: &Fs) -> u64 {
    let devs = fs.pool().chunks.devices();
    devs.devices().iter().map(|d| d.read_bytes()).sum()
}

#[test]
fn random_small_overwrites_read_back_exactly() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(1414);
    let (mut fs, ino, mut model) = setup(d.path(), &mut rng);
    let mut versions = Vec::new();
    for round in 0..40 {
        for _ in 0..rng.gen_range(1..30) {
            let len = [1, 512, 4096, 8192, 3000, 20000][rng.gen_range(0..6)];
            let off = rng.gen_range(0..FILE - len);
            let data = random_bytes(&mut rng, len);
            fs.write(ino, off as u64, &data).unwrap();
            model[off..off + len].copy_from_slice(&data);
        }
        match round % 10 {
            // A crash after an fsync: the intent log brings the writes back.
            9 => {
                fs.fsync(ino).unwrap();
                drop(fs);
                fs = reopen(d.path());
            }
            _ => fs.flush().unwrap(),
        }
        versions.push((fs.last_tid(), model.clone()));
        // Small reads at random places, then the whole file.
        for _ in 0..20 {
            let off = rng.gen_range(0..FILE - 5000);
            let n = rng.gen_range(1..5000);
            assert_eq!(
                fs.read(ino, off as u64, n as u32).unwrap(),
                model[off..off + n],
                "round {round}: {n} bytes at {off}"
            );
        }
    }
    assert_eq!(fs.read(ino, 0, FILE as u32).unwrap(), model);
    assert_clean(&fs);
    // Every earlier version reads back as it was (history as of a TID).
    for (tid, want) in versions.iter().step_by(7) {
        let at = format!("@@{tid:#x}");
        let got = fs.asof_read(ino, *tid, 0, FILE as u32).unwrap();
        assert!(got == *want, "the version {at} differs");
    }
    // After a clean restart too.
    fs.shutdown().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    assert_eq!(fs.read(ino, 0, FILE as u32).unwrap(), model);
    assert_clean(&fs);
}

#[test]
fn history_grows_with_the_bytes_overwritten() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(77);
    let (fs, ino, _) = setup(d.path(), &mut rng);
    let before = pool_info(fs.pool()).unwrap();
    assert_eq!(before.history_only_bytes, 0);
    let reads = device_reads(&fs);
    let mut overwritten = 0u64;
    // 8 KiB overwrites at random aligned places, a flush every 10 (the
    // pattern of a database), 400 in all.
    for _ in 0..40 {
        for _ in 0..10 {
            let off = rng.gen_range(0..FILE / 8192) * 8192;
            fs.write(ino, off as u64, &random_bytes(&mut rng, 8192))
                .unwrap();
            overwritten += 8192;
        }
        fs.flush().unwrap();
    }
    let after = pool_info(fs.pool()).unwrap();
    let kept = after.stored_bytes - before.stored_bytes;
    eprintln!(
        "overwritten {overwritten}, pool grew by {kept}, history only {}",
        after.history_only_bytes
    );
    // A whole 64 KiB chunk per 8 KiB write would be 8 times.
    assert!(
        kept <= 3 * overwritten + (2 << 20),
        "{kept} bytes kept for {overwritten} overwritten"
    );
    // The flushes wrote the pieces without reading the blocks below.
    let read = device_reads(&fs) - reads;
    assert!(
        read < overwritten / 4,
        "{read} bytes read by flushes of {overwritten} bytes of overwrites"
    );
    assert_clean(&fs);
}

#[test]
fn a_small_read_of_a_pieced_block_reads_only_its_bytes() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let (fs, ino, mut model) = setup(d.path(), &mut rng);
    let at = 3 * 65536 + 8192;
    let piece = random_bytes(&mut rng, 4096);
    fs.write(ino, at as u64, &piece).unwrap();
    model[at..at + 4096].copy_from_slice(&piece);
    fs.flush().unwrap();
    // Warm the metadata: only chunk bytes should reach the devices below.
    fs.read(ino, 0, 1).unwrap();
    for (off, what) in [(at, "inside the piece"), (3 * 65536 + 32768, "beside it")] {
        let before = device_reads(&fs);
        assert_eq!(
            fs.read(ino, off as u64, 4096).unwrap(),
            model[off..off + 4096]
        );
        let read = device_reads(&fs) - before;
        // A whole piece chunk (with its 56-byte header), or the spans of a
        // chunk, in one direct read of the device blocks around it: at
        // most three 4 KiB blocks, not the 64 KiB block.
        assert!(read <= 3 * 4096, "{read} bytes read for 4 KiB {what}");
    }
}

/// Appends to files whose last block is partial (a log, a mail file)
/// store the appended bytes as pieces: the pool grows with the bytes
/// appended, not a whole block per append; a block truncated in place and
/// appended to shows the new bytes, never the old ones; and everything
/// reads back exactly after a remount.
#[test]
fn appends_store_the_bytes_appended() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let fs = make(d.path());
    let mut files = Vec::new();
    for i in 0..20u8 {
        let f = fs
            .create(Ctx::ROOT, ROOT_INO, format!("log{i}").as_bytes(), 0o644)
            .unwrap();
        let data = random_bytes(&mut rng, 20_000);
        fs.write(f.ino, 0, &data).unwrap();
        files.push((f.ino, data));
    }
    fs.flush().unwrap();
    let before = pool_info(fs.pool()).unwrap();
    let mut appended = 0u64;
    for _ in 0..5 {
        for (ino, data) in files.iter_mut() {
            let more = random_bytes(&mut rng, 1000);
            fs.write(*ino, data.len() as u64, &more).unwrap();
            data.extend_from_slice(&more);
            appended += 1000;
        }
        fs.flush().unwrap();
    }
    let kept = pool_info(fs.pool()).unwrap().stored_bytes - before.stored_bytes;
    // Whole blocks would keep about 20 KiB or more per append.
    assert!(
        kept <= 4 * appended,
        "{kept} bytes kept for {appended} appended"
    );
    // Truncated inside its block, then appended to: the stale bytes of
    // the block below must not show.
    let (ino, data) = &mut files[0];
    let cut = cairn_fs::SetAttr {
        size: Some(10_000),
        ..Default::default()
    };
    fs.setattr(*ino, &cut).unwrap();
    data.truncate(10_000);
    fs.flush().unwrap();
    let more = random_bytes(&mut rng, 3000);
    fs.write(*ino, 10_000, &more).unwrap();
    data.extend_from_slice(&more);
    fs.flush().unwrap();
    assert_clean(&fs);
    drop(fs);
    let fs = reopen(d.path());
    for (ino, data) in &files {
        assert_eq!(&fs.read(*ino, 0, 1 << 20).unwrap(), data);
    }
    assert_clean(&fs);
}

/// Reblock of a scattered file whose extent names one chunk twice (a
/// piece split in two by a later write inside it): the segments' accounts
/// stay right and the bytes read back. (This layout did not reproduce the
/// double move fixed in reblock.rs; the crash sweep's seed-1 workload did:
/// `crash_sweep::workload_recovers_at_its_last_durability_point`.)
#[test]
fn reblock_of_a_scattered_file_with_split_pieces_keeps_its_bytes() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    // 1 MiB segments: the file's chunks lie in several of them.
    let o = cairn_fs::MkfsOptions {
        sparse: true,
        segment_size: 1 << 20,
        ..Default::default()
    };
    cairn_fs::mkfs(&d.path().join("pool"), o).unwrap();
    let fs = reopen(d.path());
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap().ino;
    let g = fs.create(Ctx::ROOT, ROOT_INO, b"g", 0o644).unwrap().ino;
    // 16 blocks, each committed between blocks of another file: one run
    // per block, so reblock takes the file as scattered.
    let mut model = random_bytes(&mut rng, 16 << 16);
    for k in 0..16u64 {
        let at = (k << 16) as usize;
        fs.write(f, k << 16, &model[at..at + 65536]).unwrap();
        fs.write(g, k << 16, &random_bytes(&mut rng, 65536))
            .unwrap();
        fs.flush().unwrap();
    }
    // A 4 KiB piece in block 0, then 1 KiB inside it: two pieces of one
    // chunk.
    for (off, len) in [(8192usize, 4096usize), (9216, 1024)] {
        let b = random_bytes(&mut rng, len);
        fs.write(f, off as u64, &b).unwrap();
        model[off..off + len].copy_from_slice(&b);
        fs.flush().unwrap();
    }
    let opts = cairn_fs::ReblockOptions {
        max_live_pct: 0,
        files: true,
        rate_limit: 0,
    };
    let rep = fs.reblock(&opts, &|_, _| {}).unwrap();
    assert!(rep.chunks_moved >= 16, "{rep:?}");
    assert_clean(&fs);
    assert!(fs.read(f, 0, model.len() as u32).unwrap() == model);
}
