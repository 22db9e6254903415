//! Filesystem-layer tests without FUSE: operations, flush, reopen, crash
//! consistency of the committed state, ENOSPC and space reclamation.

use cairn_devices::{DeviceClass, DeviceSpec};
use cairn_fs::{mkfs, Ctx, Fs, FsError, MkfsOptions, Pool, RenameFlags, ROOT_INO};
use std::path::Path;
use std::sync::Arc;

fn make(dir: &Path, size: Option<u64>) -> Arc<Fs> {
    // Sparse: the default device is 90% of the host's free space, which
    // tests sharing the host must not reserve.
    let mut o = MkfsOptions {
        sparse: true,
        ..MkfsOptions::default()
    };
    if let Some(s) = size {
        o.devices = vec![DeviceSpec::tier(DeviceClass::Ssd, dir.join("dev"), Some(s))];
    }
    mkfs(&dir.join("pool"), o).unwrap();
    reopen(dir)
}

fn reopen(dir: &Path) -> Arc<Fs> {
    Fs::open(Pool::open(&dir.join("pool"), None).unwrap()).unwrap()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn write_read_across_blocks_and_reopen() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path(), None);
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    let data = pattern(300_000, 7);
    fs.write(f.ino, 1000, &data).unwrap();
    assert_eq!(fs.read(f.ino, 1000, 300_000).unwrap(), data);
    assert_eq!(fs.read(f.ino, 0, 1000).unwrap(), vec![0; 1000]);
    fs.flush().unwrap();
    fs.write(f.ino, 65_530, b"XYZXYZXYZXYZ").unwrap();
    fs.shutdown().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    let i = fs.lookup(ROOT_INO, b"f").unwrap();
    assert_eq!(i.size, 301_000);
    let got = fs.read(i.ino, 0, 400_000).unwrap();
    let mut want = vec![0u8; 1000];
    want.extend_from_slice(&data);
    want[65_530..65_542].copy_from_slice(b"XYZXYZXYZXYZ");
    assert_eq!(got, want);
}

#[test]
fn unflushed_changes_are_lost_but_committed_state_is_consistent() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path(), None);
    let a = fs.create(Ctx::ROOT, ROOT_INO, b"a", 0o644).unwrap();
    fs.write(a.ino, 0, b"durable").unwrap();
    fs.fsync(a.ino).unwrap();
    let b = fs.create(Ctx::ROOT, ROOT_INO, b"b", 0o644).unwrap();
    fs.write(b.ino, 0, b"lost").unwrap();
    fs.write(a.ino, 0, b"DURABLE-but-unsynced").unwrap();
    drop(fs); // no flush: like kill -9
    let fs = reopen(d.path());
    let a = fs.lookup(ROOT_INO, b"a").unwrap();
    assert_eq!(fs.read(a.ino, 0, 100).unwrap(), b"durable");
    assert!(matches!(fs.lookup(ROOT_INO, b"b"), Err(FsError::NotFound)));
}

#[test]
fn namespace_errors_and_rename_flags() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path(), None);
    let dir = fs.mkdir(Ctx::ROOT, ROOT_INO, b"d", 0o755).unwrap();
    fs.create(Ctx::ROOT, dir.ino, b"x", 0o644).unwrap();
    fs.create(Ctx::ROOT, ROOT_INO, b"y", 0o644).unwrap();
    assert!(matches!(fs.rmdir(ROOT_INO, b"d"), Err(FsError::NotEmpty)));
    assert!(matches!(
        fs.mkdir(Ctx::ROOT, ROOT_INO, b"d", 0o755),
        Err(FsError::Exists)
    ));
    assert!(matches!(fs.unlink(ROOT_INO, b"d"), Err(FsError::IsDir)));
    assert!(matches!(
        fs.lookup(ROOT_INO, &[b'n'; 256]),
        Err(FsError::NameTooLong)
    ));
    let nr = RenameFlags {
        noreplace: true,
        exchange: false,
    };
    assert!(matches!(
        fs.rename(ROOT_INO, b"y", dir.ino, b"x", nr),
        Err(FsError::Exists)
    ));
    let ex = RenameFlags {
        noreplace: false,
        exchange: true,
    };
    fs.rename(ROOT_INO, b"y", ROOT_INO, b"d", ex).unwrap();
    assert_eq!(fs.lookup(ROOT_INO, b"y").unwrap().ino, dir.ino);
    assert!(matches!(
        fs.rename(ROOT_INO, b"y", dir.ino, b"sub", RenameFlags::default()),
        Err(FsError::Invalid)
    ));
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 3);
    fs.flush().unwrap();
    let names: Vec<_> = fs
        .readdir(ROOT_INO, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 4, "., .., d, y: {names:?}");
}

/// POSIX: when both names of a rename are links to the same file, rename
/// succeeds and does nothing; both names stay, and so does the link count,
/// after a commit and a reopen too. (The crash sweep's model once removed
/// the source name here, and reported the file as unexpected.)
#[test]
fn rename_onto_another_name_of_the_same_file_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path(), None);
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"a", 0o644).unwrap();
    fs.write(f.ino, 0, b"data").unwrap();
    fs.link(f.ino, ROOT_INO, b"b").unwrap();
    fs.rename(ROOT_INO, b"a", ROOT_INO, b"b", RenameFlags::default())
        .unwrap();
    let check = |fs: &Fs| {
        for name in [&b"a"[..], b"b"] {
            let n = String::from_utf8_lossy(name);
            assert_eq!(fs.lookup(ROOT_INO, name).unwrap().ino, f.ino, "{n}");
        }
        assert_eq!(fs.getattr(f.ino).unwrap().nlink, 2);
    };
    check(&fs);
    fs.flush().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    check(&fs);
    let mut buf = vec![0; 4];
    fs.read_into(f.ino, 0, &mut buf).unwrap();
    assert_eq!(buf, b"data");
}

#[test]
fn history_is_kept_and_current_lookup_ignores_it() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path(), None);
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    for i in 0..50u8 {
        fs.write(f.ino, 0, &[i; 100]).unwrap();
        fs.flush().unwrap();
    }
    let r = fs.pool().meta.read().unwrap();
    let (_, hist, _) = r.sizes().unwrap();
    assert!(
        hist >= 49 * 2,
        "each flush ended the old extent and inode: {hist}"
    );
    assert_eq!(fs.read(f.ino, 0, 100).unwrap(), vec![49; 100]);
}

#[test]
fn full_pool_gives_enospc_and_delete_frees_space() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path(), Some(48 << 20));
    // Distinct content everywhere, so dedup cannot make it fit.
    let unique = |seed: u64| {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>()
    };
    let chunk = unique(1000);
    let mut n = 0u32;
    let err = loop {
        let f = fs
            .create(Ctx::ROOT, ROOT_INO, format!("f{n}").as_bytes(), 0o644)
            .unwrap();
        let r = fs
            .write(f.ino, 0, &unique(n as u64))
            .and_then(|_| fs.fsync(f.ino));
        fs.release(f.ino);
        match r {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 100, "a 48 MiB pool cannot hold 100 MiB");
    };
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(n >= 30, "only {n} MiB fit in a 48 MiB pool");
    for i in 0..n {
        fs.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    fs.flush().unwrap();
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"again", 0o644).unwrap();
    for k in 0..20u64 {
        fs.write(f.ino, k << 20, &unique(2000 + k)).unwrap();
    }
    fs.write(f.ino, 5 << 20, &chunk).unwrap();
    fs.fsync(f.ino).unwrap();
    assert_eq!(fs.read(f.ino, 5 << 20, 1 << 20).unwrap(), chunk);
    fs.release(f.ino);
    fs.shutdown().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    let rep = cairn_fs::maintenance::check::check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn compression_switched_mid_life_reads_back_exact() {
    use cairn_fs::Compression;
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path(), None);
    let text: Vec<u8> = b"compressible line of text, again and again\n".repeat(20_000);
    let noise = pattern(500_000, 3);
    let mut files = Vec::new();
    for (i, c) in [
        Compression::None,
        Compression::Lz4,
        Compression::Zstd(3),
        Compression::Zstd(19),
    ]
    .into_iter()
    .enumerate()
    {
        fs.pool().chunks.set_compression(c);
        for (k, body) in [&text, &noise].into_iter().enumerate() {
            let name = format!("f{i}-{k}");
            let f = fs
                .create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)
                .unwrap();
            fs.write(f.ino, 0, body).unwrap();
            files.push((name, body.clone()));
        }
        fs.flush().unwrap();
    }
    let info = cairn_fs::maintenance::info::pool_info(fs.pool()).unwrap();
    assert!(
        info.physical_bytes < info.logical_bytes * 3 / 4,
        "text compressed: {} physical of {} logical",
        info.physical_bytes,
        info.logical_bytes
    );
    fs.shutdown().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    assert_eq!(fs.pool().chunks.compression(), Compression::None);
    for (name, body) in &files {
        let i = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
        assert_eq!(
            &fs.read(i.ino, 0, body.len() as u32).unwrap(),
            body,
            "{name}"
        );
        // A read that starts inside a block goes through the copy path.
        assert_eq!(fs.read(i.ino, 1000, 5000).unwrap(), body[1000..6000]);
    }
    let rep = cairn_fs::maintenance::check::check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

/// `read_into` is handed the frontend's reply buffer, which may still hold
/// another file's bytes: every byte it reports must be written (holes,
/// punched ranges and tails past a block's valid bytes as zeros), whether
/// the blocks are committed, dirty, runs or parts.
#[test]
fn read_into_overwrites_whatever_the_buffer_held() {
    use cairn_fs::ops::data::{FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE};
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path(), None);
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    let mut model = vec![0u8; 0];
    let put = |model: &mut Vec<u8>, off: usize, data: &[u8]| {
        fs.write(f.ino, off as u64, data).unwrap();
        if model.len() < off + data.len() {
            model.resize(off + data.len(), 0);
        }
        model[off..off + data.len()].copy_from_slice(data);
    };
    put(&mut model, 0, &pattern(300_000, 1)); // a run of whole blocks
    put(&mut model, 500_000, &pattern(1_000, 2)); // after a hole, short block
    fs.flush().unwrap();
    put(&mut model, 70_000, &pattern(5_000, 3)); // dirty inside committed
    put(&mut model, 700_000, &pattern(10, 4)); // dirty, alone
    fs.fallocate(f.ino, 120_000, 70_000, FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE)
        .unwrap();
    model[120_000..190_000].fill(0);
    let grow = cairn_fs::SetAttr {
        size: Some(900_000),
        ..Default::default()
    };
    fs.setattr(f.ino, &grow).unwrap();
    model.resize(900_000, 0);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for round in 0..300 {
        if round == 150 {
            fs.flush().unwrap(); // the second half reads all of it committed
        }
        let off = next(950_000) as usize;
        let len = 1 + next(1 << 20) as usize;
        let mut buf = vec![0xa5u8; len];
        let n = fs.read_into(f.ino, off as u64, &mut buf).unwrap();
        let want = &model[off.min(model.len())..(off + len).min(model.len())];
        assert_eq!(n, want.len(), "round {round}: count at {off}+{len}");
        assert!(buf[..n] == *want, "round {round}: bytes at {off}+{len}");
        assert!(
            buf[n..].iter().all(|&b| b == 0xa5),
            "round {round}: past the end"
        );
    }
}
