//! Ticks (`writeback/tick.rs`): between commits of the element tree, a
//! tick stores the buffered blocks where they stay and logs the changes
//! naming them by chunk. The commit after it takes those chunks instead of
//! writing the blocks again; a block written again, truncated or deleted
//! leaves its tick chunk to be removed; after a crash the replay reads the
//! blocks back from their chunks, and the chunks no record names go.

mod common;

use cairn_data::ChunkRec;
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{Fs, MkfsOptions, Pool, PoolConfig};
use common::{file_in_root, noise};
use std::path::Path;
use std::sync::Arc;

const BLOCK: usize = 64 << 10;

/// Pools without dedup: a block stored again would be a new chunk, so only
/// the tick's mark can make a commit take the chunk it stored.
fn make(dir: &Path) -> Arc<Fs> {
    let o = MkfsOptions {
        sparse: true,
        ..MkfsOptions::default()
    };
    cairn_fs::mkfs(&dir.join("pool"), o).unwrap();
    reopen(dir)
}

fn reopen(dir: &Path) -> Arc<Fs> {
    let config = PoolConfig {
        dedup: false,
        ..PoolConfig::default()
    };
    Fs::open(Pool::open(&dir.join("pool"), Some(config)).unwrap()).unwrap()
}

fn assert_checks(fs: &Fs) {
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

/// (chunk records, those with no reference).
fn chunks(fs: &Fs) -> (u64, u64) {
    let r = fs.pool().meta.read().unwrap();
    let (mut n, mut unreferenced) = (0, 0);
    r.for_each_chunk(|_, raw| {
        n += 1;
        unreferenced += u64::from(ChunkRec::decode(raw).unwrap().refs == 0);
    })
    .unwrap();
    (n, unreferenced)
}

fn counter(fs: &Fs, name: &str) -> u64 {
    fs.pool().meta.read().unwrap().counter(name).unwrap()
}

fn read_all(fs: &Fs, ino: u64, len: usize) -> Vec<u8> {
    fs.read(ino, 0, len as u32).unwrap()
}

#[test]
fn the_commit_after_a_tick_takes_its_chunks_without_writing_the_blocks_again() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    let data = noise(16 * BLOCK, 1);
    fs.write(f, 0, &data).unwrap();
    fs.tick().unwrap();
    // Stored ahead: 16 chunks with no reference yet, one mark each, and
    // the counter that tells the open after a crash where they start.
    assert_eq!(chunks(&fs), (16, 16));
    assert_eq!(fs.ticked(), (16, 0));
    assert!(counter(&fs, "tick_chunks_from") > 0);
    let waiting = |fs: &Fs| {
        let info = cairn_fs::maintenance::info::pool_info(fs.pool()).unwrap();
        info.waiting.stored_ahead_chunks
    };
    assert_eq!(waiting(&fs), 16, "cairn info shows them");
    assert_checks(&fs);
    assert_eq!(read_all(&fs, f, data.len()), data);
    let next = counter(&fs, "next_chunk");
    fs.flush().unwrap();
    // The commit referenced them: no new chunk, none unreferenced.
    assert_eq!(counter(&fs, "next_chunk"), next, "no block written again");
    assert_eq!(chunks(&fs), (16, 0));
    assert_eq!(fs.ticked(), (0, 0));
    assert_eq!(waiting(&fs), 0);
    assert_eq!(counter(&fs, "tick_chunks_from"), 0);
    assert_checks(&fs);
    drop(fs);
    let fs = reopen(d.path());
    assert_eq!(read_all(&fs, f, data.len()), data);
}

#[test]
fn blocks_written_again_or_truncated_after_their_tick_leave_chunks_the_commit_removes() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    let mut data = noise(8 * BLOCK, 2);
    fs.write(f, 0, &data).unwrap();
    fs.tick().unwrap();
    assert_eq!(fs.ticked(), (8, 0));
    // Blocks 0..4 written again, 6..8 cut off.
    let again = noise(4 * BLOCK, 3);
    fs.write(f, 0, &again).unwrap();
    data[..4 * BLOCK].copy_from_slice(&again);
    data.truncate(6 * BLOCK);
    let cut = cairn_fs::SetAttr {
        size: Some(data.len() as u64),
        ..Default::default()
    };
    fs.setattr(f, &cut).unwrap();
    fs.flush().unwrap();
    // Six blocks committed: two tick chunks taken, four new ones; the six
    // tick chunks no block holds are gone.
    assert_eq!(chunks(&fs), (6, 0));
    assert_eq!(fs.ticked(), (0, 0));
    assert_eq!(counter(&fs, "tick_chunks_from"), 0);
    assert_checks(&fs);
    assert_eq!(read_all(&fs, f, 8 * BLOCK), data);
}

#[test]
fn a_crash_after_ticks_replays_the_blocks_from_their_chunks() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    let mut data = noise(12 * BLOCK, 4);
    fs.write(f, 0, &data).unwrap();
    fs.tick().unwrap();
    // A second tick: a block written again (its first tick chunk loses
    // its block), a new file, and a small write over a stored block.
    let again = noise(BLOCK, 5);
    fs.write(f, 3 * BLOCK as u64, &again).unwrap();
    data[3 * BLOCK..4 * BLOCK].copy_from_slice(&again);
    fs.write(f, 100, b"small").unwrap();
    data[100..105].copy_from_slice(b"small");
    let g = file_in_root(&fs, "g");
    let gdata = noise(3 * BLOCK + 17, 6);
    fs.write(g, 0, &gdata).unwrap();
    fs.tick().unwrap();
    let next = counter(&fs, "next_chunk");
    // Written after the last tick and never synced: may be lost.
    fs.write(f, 5 * BLOCK as u64, &noise(BLOCK, 7)).unwrap();
    drop(fs); // a crash: no commit since the ticks
    let fs = reopen(d.path());
    assert_eq!(read_all(&fs, f, data.len()), data);
    let g = file_in_root(&fs, "g");
    assert_eq!(read_all(&fs, g, gdata.len()), gdata);
    // The replay's commit took the tick chunks it read the blocks from
    // (block 0 was patched, so it is stored anew) and removed those no
    // block holds.
    assert!(
        counter(&fs, "next_chunk") <= next + 2,
        "blocks were not stored again"
    );
    let (_, unreferenced) = chunks(&fs);
    assert_eq!(unreferenced, 0);
    assert_eq!(counter(&fs, "tick_chunks_from"), 0);
    assert_checks(&fs);
}

#[test]
fn a_file_removed_after_its_tick_leaves_its_chunks_to_history_only() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    fs.write(f, 0, &noise(4 * BLOCK, 8)).unwrap();
    fs.tick().unwrap();
    fs.unlink(cairn_fs::ROOT_INO, b"f").unwrap();
    fs.fsync(0).unwrap();
    drop(fs);
    // The replay commits the blocks by their tick chunks, then removes the
    // file: its versions keep the chunks, every one referenced.
    let fs = reopen(d.path());
    assert_eq!(chunks(&fs), (4, 0));
    assert_eq!(counter(&fs, "tick_chunks_from"), 0);
    assert_checks(&fs);
}

#[test]
fn tick_chunks_no_record_names_after_a_crash_go_at_the_next_commit() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    fs.flush().unwrap();
    fs.write(f, 0, &noise(4 * BLOCK, 9)).unwrap();
    fs.tick().unwrap();
    drop(fs);
    // The records are lost (as if the crash came between the tick's
    // chunk records and its intent record): the chunks wait, named by
    // no record and referenced by nothing, and `check` is clean.
    let log = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path().join("pool/intent.log"))
        .unwrap();
    let half = log.metadata().unwrap().len() / 2;
    for at in [0, half] {
        std::os::unix::fs::FileExt::write_all_at(&log, &vec![0u8; 1 << 20], at).unwrap();
    }
    drop(log);
    let fs = reopen(d.path());
    assert_eq!(chunks(&fs), (4, 4));
    assert_eq!(fs.ticked(), (0, 4));
    assert_checks(&fs);
    // The next commit removes them.
    let g = file_in_root(&fs, "g");
    fs.write(g, 0, b"g").unwrap();
    fs.flush().unwrap();
    assert_eq!(chunks(&fs), (1, 0));
    assert_eq!(fs.ticked(), (0, 0));
    assert_eq!(counter(&fs, "tick_chunks_from"), 0);
    assert_checks(&fs);
}

#[test]
fn writes_to_a_small_record_pool_ask_for_a_tick_before_the_interval() {
    let d = tempfile::tempdir().unwrap();
    let o = MkfsOptions {
        sparse: true,
        record_size: 4096,
        ..MkfsOptions::default()
    };
    cairn_fs::mkfs(&d.path().join("pool"), o).unwrap();
    // No interval falls in the test: only the writes can start a tick.
    let config = PoolConfig {
        dedup: false,
        commit_interval_secs: 3000.0,
        tree_commit_secs: 3600.0,
        ..PoolConfig::default()
    };
    let fs = Fs::open(Pool::open(&d.path().join("pool"), Some(config)).unwrap()).unwrap();
    let f = file_in_root(&fs, "f");
    fs.flush().unwrap();
    fs.spawn_flusher();
    let tid = fs.last_tid();
    // 12 MiB of 4 KiB blocks: past the 8 MiB after which writes ask.
    let data = noise(12 << 20, 10);
    for (i, part) in data.chunks(4096).enumerate() {
        fs.write(f, (i * 4096) as u64, part).unwrap();
    }
    let stored = || {
        let info = cairn_fs::maintenance::info::pool_info(fs.pool()).unwrap();
        info.waiting.stored_ahead_chunks
    };
    let t0 = std::time::Instant::now();
    while stored() == 0 && t0.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        stored() >= 2048,
        "a tick stored the first 8 MiB: {}",
        stored()
    );
    assert_eq!(fs.last_tid(), tid, "a tick, not a tree commit");
    assert_eq!(read_all(&fs, f, data.len()), data);
    fs.shutdown().unwrap();
    assert_eq!(stored(), 0);
    assert_checks(&fs);
}
