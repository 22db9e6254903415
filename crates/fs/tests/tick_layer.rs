//! Ticks (`writeback/tick.rs`): between commits of the element tree, a
//! tick stores the buffered blocks where they stay and logs the changes
//! naming them by chunk. The commit after it takes those chunks instead of
//! writing the blocks again; a block written again, truncated or deleted
//! leaves its tick chunk to be removed; after a crash the replay reads the
//! blocks back from their chunks, and the chunks no record names go; a
//! chunk the replay cannot read keeps its block (reads of it fail, the pool
//! mounts) unless a logged change needs its bytes (then the mount waits
//! until it reads, and so does a replay with no room to commit it);
//! snapshots taken while ticks run hold their state.

mod common;

use cairn_data::ChunkRec;
use cairn_devices::backend::{Fault, FaultControl, FaultStorage, Ops, When};
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{Fs, MkfsOptions, Pool, PoolConfig};
use common::{file_in_root, noise};
use std::path::Path;
use std::sync::Arc;

const BLOCK: usize = 64 << 10;

/// Pools without dedup: a block stored again would be a new chunk, so only
/// the tick's mark can make a commit take the chunk it stored. The intent
/// log is the pool directory's file, which a test empties.
fn make(dir: &Path) -> Arc<Fs> {
    let o = MkfsOptions {
        sparse: true,
        intent_log: cairn_fs::pool::log_home::LogHome::PoolDir,
        ..MkfsOptions::default()
    };
    cairn_fs::mkfs(&dir.join("pool"), o).unwrap();
    reopen(dir)
}

fn reopen(dir: &Path) -> Arc<Fs> {
    Fs::open(pool_on(dir, Arc::new(cairn_devices::HostStorage))).unwrap()
}

/// The pool in `dir` (without dedup, as `make` wants it) over `storage`.
fn pool_on(dir: &Path, storage: Arc<dyn cairn_devices::Storage>) -> Pool {
    let config = PoolConfig {
        dedup: false,
        ..PoolConfig::default()
    };
    Pool::open_with(&dir.join("pool"), Some(config), storage).unwrap()
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
    // Each region's records and their copies (in its second half).
    let quarter = log.metadata().unwrap().len() / 4;
    for at in [0, quarter, 2 * quarter, 3 * quarter] {
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

/// Flips bytes of `pattern` where a pool's data device holds it (the
/// blocks are noise: stored as they are, whatever the compression).
fn damage_on_device(pool: &Path, pattern: &[u8]) -> (std::path::PathBuf, u64, Vec<u8>) {
    for entry in walk(pool) {
        let name = entry.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("intent") || name.starts_with("meta") {
            continue;
        }
        for (start, raw) in data_extents(&entry) {
            if let Some(i) = raw.windows(pattern.len()).position(|w| w == pattern) {
                let at = start + i as u64;
                let old = pattern.to_vec();
                let bad: Vec<u8> = old.iter().map(|b| !b).collect();
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&entry)
                    .unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, &bad, at).unwrap();
                return (entry, at, old);
            }
        }
    }
    panic!("the block's bytes are on no device file");
}

/// The allocated extents of a (sparse) file: (offset, bytes).
fn data_extents(path: &Path) -> Vec<(u64, Vec<u8>)> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as i64;
    let mut out = Vec::new();
    let mut at = 0i64;
    while at < len {
        // SAFETY: plain lseek calls on a file this function owns.
        let start = unsafe { libc::lseek(f.as_raw_fd(), at, libc::SEEK_DATA) };
        if start < 0 {
            break;
        }
        let end = unsafe { libc::lseek(f.as_raw_fd(), start, libc::SEEK_HOLE) };
        let mut buf = vec![0u8; (end - start) as usize];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, start as u64).unwrap();
        out.push((start as u64, buf));
        at = end;
    }
    out
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        match p.is_dir() {
            true => out.extend(walk(&p)),
            false => out.push(p),
        }
    }
    out
}

#[test]
fn a_tick_chunk_the_replay_cannot_read_fails_reads_of_its_block_only() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    let g = file_in_root(&fs, "g");
    fs.flush().unwrap();
    let data = noise(4 * BLOCK, 11);
    let gdata = noise(2 * BLOCK, 12);
    fs.write(f, 0, &data).unwrap();
    fs.write(g, 0, &gdata).unwrap();
    fs.tick().unwrap();
    drop(fs); // a crash: the blocks are in tick chunks, named by the log
    damage_on_device(&d.path().join("pool"), &data[BLOCK + 1000..BLOCK + 1064]);
    // The pool mounts: the damaged block keeps its chunk and fails its
    // reads (EIO, never other bytes); every other block reads.
    let fs = reopen(d.path());
    let e = fs.read(f, BLOCK as u64, 10).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert_eq!(fs.read(f, 0, BLOCK as u32).unwrap(), data[..BLOCK]);
    let rest = fs.read(f, 2 * BLOCK as u64, 2 * BLOCK as u32).unwrap();
    assert_eq!(rest, data[2 * BLOCK..]);
    assert_eq!(read_all(&fs, g, gdata.len()), gdata);
    assert_eq!(fs.ticked(), (0, 0), "the replay's commit took every chunk");
    let rep = fs.scrub(&|_, _| {}).unwrap();
    assert_eq!(rep.damaged.len(), 1, "{:?}", rep.damaged);
    // Written again, the block reads.
    let again = noise(BLOCK, 13);
    fs.write(f, BLOCK as u64, &again).unwrap();
    fs.flush().unwrap();
    assert_eq!(fs.read(f, BLOCK as u64, BLOCK as u32).unwrap(), again);
    drop(fs);
    let fs = reopen(d.path());
    assert_eq!(fs.read(f, BLOCK as u64, BLOCK as u32).unwrap(), again);
}

#[test]
fn a_logged_change_over_a_tick_chunk_the_replay_cannot_read_refuses_the_mount_until_it_reads() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    fs.flush().unwrap();
    let mut data = noise(4 * BLOCK, 14);
    fs.write(f, 0, &data).unwrap();
    fs.tick().unwrap();
    // A small write over the stored block 1, synced: its record holds
    // only the bytes written, the rest is the tick chunk's.
    fs.write(f, BLOCK as u64 + 10, b"synced").unwrap();
    data[BLOCK + 10..BLOCK + 16].copy_from_slice(b"synced");
    fs.fsync(f).unwrap();
    drop(fs);
    let (file, at, old) =
        damage_on_device(&d.path().join("pool"), &data[BLOCK + 1000..BLOCK + 1064]);
    let config = PoolConfig {
        dedup: false,
        ..PoolConfig::default()
    };
    let pool = Pool::open(&d.path().join("pool"), Some(config)).unwrap();
    let e = Fs::open(pool)
        .err()
        .expect("the replay cannot rebuild block 1");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(e.to_string().contains("cannot be read"), "{e}");
    // Nothing was lost: once the device reads again, the pool mounts with
    // every byte, the synced write included.
    let dev = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&dev, &old, at).unwrap();
    let fs = reopen(d.path());
    assert_eq!(read_all(&fs, f, data.len()), data);
    assert_checks(&fs);
}

#[test]
fn snapshots_taken_while_ticks_run_hold_exactly_their_state_and_survive_a_crash() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    const BLOCKS: u64 = 24;
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    let mut model = noise(BLOCKS as usize * BLOCK, 20);
    fs.write(f, 0, &model).unwrap();
    fs.flush().unwrap();
    let (stop, ticks) = (AtomicBool::new(false), AtomicU64::new(0));
    let mut snaps: Vec<(String, Vec<u8>)> = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(SeqCst) {
                fs.tick().unwrap();
                ticks.fetch_add(1, SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..90u64 {
            for k in 0..4u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x % BLOCKS) as usize * BLOCK;
                let bytes = match k % 2 {
                    0 => noise(BLOCK, 100 + round * 4 + k),
                    _ => noise(100, 100 + round * 4 + k),
                };
                let at = at + if k % 2 == 0 { 0 } else { 333 };
                fs.write(f, at as u64, &bytes).unwrap();
                model[at..at + bytes.len()].copy_from_slice(&bytes);
            }
            if round % 3 == 0 {
                let name = format!("s{round}");
                let kind = cairn_fs::SnapshotKind::Named;
                match round % 2 {
                    0 => fs.snapshot_create(&name, kind).unwrap(),
                    _ => fs.snapshot_cut(&name, kind).unwrap(),
                };
                snaps.push((name, model.clone()));
            }
            if round % 7 == 0 {
                fs.fsync(f).unwrap();
            }
        }
        stop.store(true, SeqCst);
    });
    assert!(ticks.load(SeqCst) >= 5, "the ticks ran");
    fs.fsync(f).unwrap();
    let verify = |fs: &Fs| {
        assert_eq!(read_all(fs, f, model.len()), model);
        for (name, want) in &snaps {
            let s = fs.snapshot(name).unwrap();
            let got = fs.asof_read(f, s.tid, 0, want.len() as u32).unwrap();
            assert!(got == *want, "snapshot {name} differs");
        }
    };
    verify(&fs);
    drop(fs); // a crash
    let fs = reopen(d.path());
    verify(&fs);
    assert_eq!(chunks(&fs).1, 0, "no tick chunk left unreferenced");
    assert_checks(&fs);
}

#[test]
fn a_damaged_tick_chunk_a_later_tick_superseded_costs_nothing_at_replay() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    fs.flush().unwrap();
    let first = noise(2 * BLOCK, 15);
    fs.write(f, 0, &first).unwrap();
    fs.tick().unwrap();
    // Block 1 written again and stored by a second tick, then a small
    // synced write over it: the replay needs the second chunk only.
    let mut data = first.clone();
    let again = noise(BLOCK, 16);
    fs.write(f, BLOCK as u64, &again).unwrap();
    data[BLOCK..].copy_from_slice(&again);
    fs.tick().unwrap();
    fs.write(f, BLOCK as u64 + 10, b"synced").unwrap();
    data[BLOCK + 10..BLOCK + 16].copy_from_slice(b"synced");
    fs.fsync(f).unwrap();
    drop(fs);
    damage_on_device(&d.path().join("pool"), &first[BLOCK + 1000..BLOCK + 1064]);
    let fs = reopen(d.path());
    assert_eq!(read_all(&fs, f, data.len()), data);
    assert_eq!(fs.ticked(), (0, 0));
}

#[test]
fn with_no_room_to_commit_a_replay_holding_an_unreadable_block_the_open_waits_for_space() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    let g = file_in_root(&fs, "g");
    fs.flush().unwrap();
    let data = noise(2 * BLOCK, 17);
    fs.write(f, 0, &data).unwrap();
    fs.tick().unwrap();
    // Logged by its bytes: the replay's commit must write it.
    let gdata = noise(BLOCK, 18);
    fs.write(g, 0, &gdata).unwrap();
    fs.fsync(g).unwrap();
    drop(fs);
    let (dev, _, _) = damage_on_device(&d.path().join("pool"), &data[BLOCK + 1000..BLOCK + 1064]);
    let st = Arc::new(FaultStorage::per_file(
        Arc::new(cairn_devices::HostStorage),
        7,
    ));
    let pool = pool_on(d.path(), st.clone());
    let full = st.control(&dev).add(Fault::no_space());
    // A placeholder must never be read: no mount with it in RAM.
    let e = Fs::open(pool)
        .err()
        .expect("the replay cannot be committed");
    assert!(e.to_string().contains("no room to commit"), "{e}");
    assert!(st.control(&dev).hits(full) > 0);
    // With room again, the pool mounts: only the damaged block fails.
    let fs = reopen(d.path());
    assert_eq!(read_all(&fs, g, gdata.len()), gdata);
    assert_eq!(fs.read(f, 0, BLOCK as u32).unwrap(), data[..BLOCK]);
    let e = fs.read(f, BLOCK as u64, 10).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
}

/// A pool in `dir` with a file "f", reopened over a fault backend: the
/// filesystem, the file and the faults' control.
fn with_faults(dir: &Path, seed: u64) -> (Arc<Fs>, u64, Arc<FaultControl>) {
    let fs = make(dir);
    let f = file_in_root(&fs, "f");
    fs.flush().unwrap();
    drop(fs);
    let control = FaultControl::new(seed);
    let st = Arc::new(FaultStorage::shared(
        Arc::new(cairn_devices::HostStorage),
        control.clone(),
    ));
    (Fs::open(pool_on(dir, st)).unwrap(), f, control)
}

/// A tick in a thread whose first device write (its first pass's data)
/// waits 1.5 s, holding the flush lock; returns once that write began.
fn tick_held(
    fs: &Arc<Fs>,
    control: &FaultControl,
) -> std::thread::JoinHandle<cairn_fs::Result<()>> {
    let slow = Fault::hang(Ops::WRITE, std::time::Duration::from_millis(1500));
    let hang = control.add(slow.when(When::Times(1)));
    let ticker = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.tick())
    };
    while control.hits(hang) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    ticker
}

#[test]
fn blocks_written_while_a_tick_stores_others_are_stored_by_another_pass_not_a_tree_commit() {
    let d = tempfile::tempdir().unwrap();
    let (fs, f, control) = with_faults(d.path(), 3);
    let mut data = noise(4 * BLOCK, 21);
    fs.write(f, 0, &data).unwrap();
    let tid = counter(&fs, "last_tid");
    // The first pass's data write waits long enough for a writer to buffer
    // more than one intent record holds (8 MiB) meanwhile.
    let ticker = tick_held(&fs, &control);
    let more = noise(192 * BLOCK, 22);
    fs.write(f, data.len() as u64, &more).unwrap();
    data.extend_from_slice(&more);
    ticker.join().unwrap().unwrap();
    // Stored by a second pass and logged by chunk: the tree is not
    // committed before it is due.
    assert_eq!(counter(&fs, "last_tid"), tid, "the tick committed the tree");
    assert_eq!(fs.ticked(), (196, 0));
    drop(fs); // a crash
    let fs = reopen(d.path());
    assert_eq!(read_all(&fs, f, data.len()), data);
    assert_eq!(chunks(&fs).1, 0);
    assert_checks(&fs);
}

#[test]
fn a_durable_snapshot_taken_while_a_tick_stores_does_not_wait_for_it_and_holds_its_state() {
    use std::time::{Duration, Instant};
    let d = tempfile::tempdir().unwrap();
    let (fs, f, control) = with_faults(d.path(), 5);
    let mut data = noise(4 * BLOCK, 31);
    fs.write(f, 0, &data).unwrap();
    // The pass holds the flush lock while its data write waits.
    let ticker = tick_held(&fs, &control);
    // A block the pass is storing, written again, and a new one.
    let b = noise(2 * BLOCK, 32);
    fs.write(f, 3 * BLOCK as u64, &b).unwrap();
    data.truncate(3 * BLOCK);
    data.extend_from_slice(&b);
    let t = Instant::now();
    let s = fs
        .snapshot_create("s", cairn_fs::SnapshotKind::Named)
        .unwrap();
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(1000),
        "the snapshot waited {took:?} for the tick's pass"
    );
    assert!(!ticker.is_finished(), "the pass was still held up");
    // After the snapshot, over blocks the pass stores.
    let mut now = data.clone();
    let c = noise(BLOCK, 33);
    fs.write(f, BLOCK as u64, &c).unwrap();
    now[BLOCK..2 * BLOCK].copy_from_slice(&c);
    // The same name again while the pass runs: refused (once the pass and
    // the first snapshot's commit are done), and the first one kept.
    let e = fs
        .snapshot_create("s", cairn_fs::SnapshotKind::Named)
        .unwrap_err();
    assert!(matches!(e, cairn_fs::FsError::SnapshotExists(_)), "{e}");
    ticker.join().unwrap().unwrap();
    fs.fsync(f).unwrap();
    let check = |fs: &Fs| {
        // Its commit made first (`snapshot` waits for it).
        assert_eq!(fs.snapshot("s").unwrap().tid, s.tid);
        assert_eq!(fs.asof_read(f, s.tid, 0, data.len() as u32).unwrap(), data);
        assert_eq!(read_all(fs, f, now.len()), now);
    };
    check(&fs);
    drop(fs); // a crash
    let fs = reopen(d.path());
    check(&fs);
    fs.flush().unwrap();
    assert_eq!(chunks(&fs).1, 0, "a tick chunk left unreferenced");
    assert_checks(&fs);
}
