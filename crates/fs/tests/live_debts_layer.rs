//! Live reference decrements that wait (`history/live_debts.rs`): an
//! overwrite kept in history leaves the old chunk's stored live count for
//! a later batch, while its segment counts it as history-only at once;
//! `cairn check` reads the waiting ones with its snapshot; a batch, a
//! prune near the present, a shutdown and the open after a crash make
//! them.

mod common;

use cairn_data::ChunkRec;
use cairn_fs::maintenance::check::check_pool;
use cairn_fs::maintenance::info::pool_info;
use cairn_fs::{Fs, PrunePolicy};
use cairn_meta::tables::{LIVE_REFS, LIVE_TID};
use common::{file_in_root, make, noise, reopen};

/// Four 64 KiB chunks of new data in file `f`, committed.
fn overwrite(fs: &Fs, ino: u64, seed: u64) {
    fs.write(ino, 0, &noise(256 << 10, seed)).unwrap();
    fs.flush().unwrap();
}

fn assert_checks(fs: &Fs) {
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

/// (chunk records with a stored live count, sum of stored live counts).
fn stored_live(fs: &Fs) -> (u64, u64) {
    let r = fs.pool().meta.read().unwrap();
    let (mut n, mut sum) = (0, 0);
    r.for_each_chunk(|_, raw| {
        let c = ChunkRec::decode(raw).unwrap();
        n += u64::from(c.live > 0);
        sum += c.live;
    })
    .unwrap();
    (n, sum)
}

fn history_only_bytes(fs: &Fs) -> u64 {
    let t = fs.pool().chunks.segment_table();
    t.iter().map(|(_, s)| s.hist).sum()
}

fn counter(fs: &Fs, name: &str) -> u64 {
    fs.pool().meta.read().unwrap().counter(name).unwrap()
}

#[test]
fn decrements_wait_and_a_batch_a_shutdown_or_the_open_after_a_crash_makes_them() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    overwrite(&fs, f, 1);
    overwrite(&fs, f, 2);
    overwrite(&fs, f, 3);
    // Two versions of four chunks ended: their decrements wait, the
    // stored counts still name them, their segments count them at once.
    assert_eq!(fs.pool().meta.live_debts().len(), 8);
    assert_eq!(stored_live(&fs), (12, 12));
    assert!(history_only_bytes(&fs) >= 8 * (64 << 10));
    assert_eq!(counter(&fs, LIVE_REFS), 2, "says decrements wait");
    assert_checks(&fs);
    // `cairn info` shows what waits: the live counts of 8 chunks, and
    // the old versions (8 extents and the inode's).
    let w = pool_info(fs.pool()).unwrap().waiting;
    assert_eq!(w.live_count_chunks, 8);
    assert!(w.ended_elements >= 8, "{w:?}");
    assert!(w.dedup_entries >= 12, "{w:?}");
    // A crash: the open makes them from the ends after live_tid.
    drop(fs);
    let fs = reopen(d.path());
    let w = pool_info(fs.pool()).unwrap().waiting;
    assert_eq!(
        (
            w.dedup_entries,
            w.creation_index_removals,
            w.live_count_chunks,
            w.ended_elements
        ),
        (0, 0, 0, 0),
        "the open made or merged every waiting update"
    );
    assert!(fs.pool().meta.live_debts().is_empty());
    assert_eq!(stored_live(&fs), (4, 4));
    assert_eq!(counter(&fs, LIVE_REFS), 1);
    assert_eq!(counter(&fs, LIVE_TID), counter(&fs, "last_tid"));
    assert_checks(&fs);
    // A batch of 6 chunks: the second overwrite gathers it.
    fs.pool().meta.live_debts().set_batch(6);
    overwrite(&fs, f, 4);
    assert_eq!(fs.pool().meta.live_debts().len(), 4);
    overwrite(&fs, f, 5);
    assert!(fs.pool().meta.live_debts().is_empty(), "the batch was made");
    assert_eq!(stored_live(&fs), (4, 4));
    assert_checks(&fs);
    // A crash after a batch and one more overwrite: the open makes only
    // the decrements after the batch.
    fs.pool().meta.live_debts().set_batch(1 << 18);
    overwrite(&fs, f, 6);
    assert_eq!(fs.pool().meta.live_debts().len(), 4);
    drop(fs);
    let fs = reopen(d.path());
    assert_eq!(stored_live(&fs), (4, 4));
    assert_checks(&fs);
    // A shutdown makes what waits.
    overwrite(&fs, f, 7);
    assert_eq!(counter(&fs, LIVE_REFS), 2);
    fs.shutdown().unwrap();
    assert!(fs.pool().meta.live_debts().is_empty());
    assert_eq!((stored_live(&fs), counter(&fs, LIVE_REFS)), ((4, 4), 1));
    drop(fs);
    let fs = reopen(d.path());
    assert_checks(&fs);
    assert_eq!(fs.read(f, 0, 256 << 10).unwrap(), noise(256 << 10, 7));
}

#[test]
fn a_prune_of_the_ends_that_would_redo_them_makes_them_first() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let f = file_in_root(&fs, "f");
    for seed in 1..=3 {
        overwrite(&fs, f, seed);
    }
    assert_eq!(fs.pool().meta.live_debts().len(), 8);
    let all = PrunePolicy {
        retention_secs: 0,
        keep_daily: 0,
        keep_weekly: 0,
        keep_monthly: 0,
    };
    let rep = fs.prune(&all, false).unwrap();
    assert!(rep.bytes_freed >= 8 * (64 << 10), "{rep:?}");
    assert!(fs.pool().meta.live_debts().is_empty());
    assert_eq!(stored_live(&fs), (4, 4));
    assert_eq!(history_only_bytes(&fs), 0);
    assert_checks(&fs);
    // More history, then a crash: nothing the prune removed is redone.
    overwrite(&fs, f, 4);
    drop(fs);
    let fs = reopen(d.path());
    assert_eq!(stored_live(&fs), (4, 4));
    assert_checks(&fs);
}
