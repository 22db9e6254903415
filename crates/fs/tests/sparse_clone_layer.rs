//! Filesystem-layer tests of sparse files and clones (no FUSE):
//! seek_data_hole over buffered, committed and punched blocks, stored
//! blocks, and copy_range sharing chunks with history and prune intact.

use cairn_fs::ops::data::FALLOC_KEEP_SIZE;
use cairn_fs::ops::data::FALLOC_PUNCH_HOLE;
use cairn_fs::{mkfs, Ctx, Fs, FsError, MkfsOptions, Pool, PrunePolicy, SnapshotKind, ROOT_INO};
use std::path::Path;
use std::sync::Arc;

fn make(dir: &Path) -> Arc<Fs> {
    let opts = MkfsOptions {
        sparse: true,
        ..MkfsOptions::default()
    };
    mkfs(&dir.join("pool"), opts).unwrap();
    Fs::open(Pool::open(&dir.join("pool"), None).unwrap()).unwrap()
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) | 1)
        .collect()
}

const NONE_KEPT: PrunePolicy = PrunePolicy {
    retention_secs: 0,
    keep_daily: 0,
    keep_weekly: 0,
    keep_monthly: 0,
};

#[test]
fn seek_data_and_hole_buffered_committed_punched() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let rs = fs.record_size();
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap().ino;
    fs.write(f, 3 * rs + 10, b"abc").unwrap();
    fs.write(f, 8 * rs, &bytes(2 * rs as usize, 1)).unwrap();
    for stage in ["buffered", "committed"] {
        assert_eq!(fs.seek_data_hole(f, 0, true).unwrap(), 3 * rs, "{stage}");
        assert_eq!(fs.seek_data_hole(f, 3 * rs + 5, true).unwrap(), 3 * rs + 5);
        assert_eq!(fs.seek_data_hole(f, 3 * rs, false).unwrap(), 4 * rs);
        assert_eq!(fs.seek_data_hole(f, 4 * rs, true).unwrap(), 8 * rs);
        assert_eq!(fs.seek_data_hole(f, 8 * rs, false).unwrap(), 10 * rs);
        assert!(matches!(
            fs.seek_data_hole(f, 10 * rs, true),
            Err(FsError::NoData)
        ));
        fs.flush().unwrap();
    }
    fs.fallocate(f, 8 * rs, rs, FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE)
        .unwrap();
    assert_eq!(
        fs.seek_data_hole(f, 4 * rs, true).unwrap(),
        9 * rs,
        "punched"
    );
    fs.flush().unwrap();
    assert_eq!(fs.seek_data_hole(f, 8 * rs, false).unwrap(), 8 * rs);
    assert_eq!(fs.seek_data_hole(f, 4 * rs, true).unwrap(), 9 * rs);
    // Truncated away: no data left after the first block.
    fs.setattr(
        f,
        &cairn_fs::SetAttr {
            size: Some(5 * rs),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        fs.seek_data_hole(f, 4 * rs, true),
        Err(FsError::NoData)
    ));
    assert_eq!(fs.seek_data_hole(f, 3 * rs, false).unwrap(), 4 * rs);
    let blocks = fs.stored_blocks(f);
    assert!((1..=16).contains(&blocks), "st_blocks {blocks}");
}

#[test]
fn clone_shares_chunks_and_survives_prune() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let rs = fs.record_size();
    let src = fs.create(Ctx::ROOT, ROOT_INO, b"src", 0o644).unwrap().ino;
    let data = bytes(5 * rs as usize + 77, 3);
    fs.write(src, 0, &data).unwrap();
    let dst = fs.create(Ctx::ROOT, ROOT_INO, b"dst", 0o644).unwrap().ino;
    let old = bytes(rs as usize, 9);
    fs.write(dst, 0, &old).unwrap();
    let snap = fs.snapshot_create("before", SnapshotKind::Named).unwrap();
    // Durable through the intent log: its commit comes with the next flush.
    fs.flush().unwrap();
    let stored = cairn_fs::maintenance::info::pool_info(fs.pool())
        .unwrap()
        .stored_bytes;
    // Source still buffered: the clone flushes it first.
    fs.write(src, 0, b"HEAD").unwrap();
    let mut want = data.clone();
    want[..4].copy_from_slice(b"HEAD");
    let n = fs.copy_range(src, 0, dst, 0, u64::MAX / 2).unwrap();
    assert_eq!(n, want.len() as u64);
    assert_eq!(fs.read(dst, 0, (8 * rs) as u32).unwrap(), want);
    fs.flush().unwrap();
    let after = cairn_fs::maintenance::info::pool_info(fs.pool())
        .unwrap()
        .stored_bytes;
    assert!(
        after <= stored + 2 * rs,
        "clone stored data: {stored} -> {after}"
    );
    assert_eq!(fs.stored_blocks(dst), fs.stored_blocks(src));
    assert_eq!(fs.asof_read(dst, snap.tid, 0, rs as u32).unwrap(), old);
    fs.unlink(ROOT_INO, b"src").unwrap();
    fs.snapshot_delete("before").unwrap();
    fs.flush().unwrap();
    fs.prune(&NONE_KEPT, false).unwrap();
    assert_eq!(fs.read(dst, 0, (8 * rs) as u32).unwrap(), want);
    fs.shutdown().unwrap();
    drop(fs);
    let fs = Fs::open(Pool::open(&d.path().join("pool"), None).unwrap()).unwrap();
    assert_eq!(fs.read(dst, 0, (8 * rs) as u32).unwrap(), want);
    drop(fs);
    let pool = Pool::open(&d.path().join("pool"), None).unwrap();
    let rep = cairn_fs::maintenance::check::check_pool(&pool).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}
