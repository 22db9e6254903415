//! Damaged metadata never returns wrong bytes. A known tree (files of many
//! sizes, a directory of small files, a symlink, history and a snapshot) is
//! written once in a pool that keeps one copy of its metadata (`mkfs
//! --meta-copies 1`: with the default two, the other copy would repair the
//! damage, see the tests at the end); then, for each of many seeds, a copy
//! of the unmounted pool gets random bytes written into `meta.redb` past
//! its header. The copy must
//! either refuse to mount with an error that says the metadata is damaged,
//! or mount and read every file as its exact content or EIO; `cairn check`
//! must exit 0 (nothing wrong) or 3 (damage named), never panic, and must
//! exit 3 whenever the mount was refused.
//!
//! Knobs: CAIRN_DAMAGE_SEEDS (default 50), CAIRN_SEED (first seed).

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What every file of the tree must hold: relative path -> bytes.
type Tree = Vec<(String, Vec<u8>)>;

/// Writes the known tree, with an overwrite (history) and a snapshot.
fn build_tree(fs_: &Fs) -> Tree {
    let sizes = [0usize, 1, 4095, 65536, 65537, 300_000, 1_048_589, 2_621_440];
    let mut tree = Tree::new();
    for (i, n) in sizes.iter().enumerate() {
        tree.push((format!("f{i}"), pattern(i as u64 + 1, *n)));
    }
    for i in 0..40 {
        tree.push((format!("d/s{i}"), format!("small file {i}\n").into_bytes()));
    }
    fs::create_dir(fs_.p("d")).unwrap();
    for (rel, data) in &tree {
        fs::write(fs_.p(rel), data).unwrap();
    }
    std::os::unix::fs::symlink("f3", fs_.p("link")).unwrap();
    cairn_ok(&[
        os("snapshot"),
        os("create"),
        fs_.mnt.as_os_str(),
        os("before"),
    ]);
    // Overwrite the middle of two files: their old blocks stay in history.
    for idx in [5usize, 7] {
        let (rel, data) = &mut tree[idx];
        let patch = pattern(99 + idx as u64, 70_000);
        data[100_000..170_000].copy_from_slice(&patch);
        let mut f = fs::OpenOptions::new().write(true).open(fs_.p(rel)).unwrap();
        f.seek(SeekFrom::Start(100_000)).unwrap();
        f.write_all(&patch).unwrap();
        f.sync_all().unwrap();
    }
    tree
}

/// Writes `count` runs of `len` random bytes at random offsets past the
/// first 4 KiB page (redb's header) of the file.
fn damage(meta: &Path, rng: &mut rand::rngs::StdRng, count: usize, len: usize) -> String {
    let size = fs::metadata(meta).unwrap().len();
    let mut f = fs::OpenOptions::new().write(true).open(meta).unwrap();
    let mut what = Vec::new();
    for _ in 0..count {
        let off = rng.gen_range(4096..size - len as u64);
        let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        f.seek(SeekFrom::Start(off)).unwrap();
        f.write_all(&bytes).unwrap();
        what.push(format!("{len}@{off}"));
    }
    f.sync_all().unwrap();
    what.join(",")
}

/// Reads a file through the mount: Ok(bytes), or the errno of the failure.
fn read_file(p: &Path) -> Result<Vec<u8>, i32> {
    let mut v = Vec::new();
    let r = fs::File::open(p).and_then(|mut f| f.read_to_end(&mut v));
    r.map(|_| v).map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// Mounts the damaged copy (daemon mode), checks every file, unmounts.
/// Returns false when the mount was refused.
fn mount_and_read(pool: &Path, mnt: &Path, tree: &Tree, what: &str) -> bool {
    let out = cairn(&[os("mount"), pool.as_os_str(), mnt.as_os_str()]);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(
            err.contains("damaged") && err.contains("meta.redb"),
            "{what}: a refused mount must say the metadata is damaged\n{}",
            describe(&out)
        );
        assert!(!is_cairn_mount(mnt), "{what}: refused but mounted");
        return false;
    }
    for (rel, want) in tree {
        match read_file(&mnt.join(rel)) {
            Ok(got) => assert!(
                got == *want,
                "{what}: {rel} read {} bytes that differ from what was written (first difference at {:?})",
                got.len(),
                first_diff(&got, want)
            ),
            Err(e) => assert_eq!(e, libc::EIO, "{what}: {rel} failed with errno {e}, not EIO"),
        }
    }
    let out = cairn_umount(mnt);
    if !out.status.success() {
        lazy_unmount(mnt);
    }
    assert!(wait_unmounted(mnt, std::time::Duration::from_secs(20)));
    true
}

/// Indexes of the tree's files that `cairn check`'s report does not name:
/// neither they nor a directory above them is DAMAGED.
fn intact_files(tree: &Tree, report: &str) -> Vec<usize> {
    let damaged: Vec<&str> = report
        .lines()
        .filter_map(|l| l.strip_prefix("PROBLEM: "))
        .filter_map(|l| l.split_once(": DAMAGED").map(|(p, _)| p))
        .collect();
    let hit = |p: &str| {
        damaged
            .iter()
            .any(|d| *d == "/" || *d == p || p.starts_with(&format!("{d}/")))
    };
    (0..tree.len())
        .filter(|&i| !hit(&format!("/{}", tree[i].0)))
        .collect()
}

/// A pool refused at mount: `mount --salvage` serves it read-only (every
/// file `check` calls intact reads exact, the rest exact or EIO, nothing
/// written to meta.redb); `cairn salvage --rebuild` then makes it mountable
/// with those files exact and `cairn check` clean. Returns false when the
/// store cannot be read at all (check named no file: nothing to salvage).
fn salvage_and_rebuild(pool: &Path, mnt: &Path, tree: &Tree, report: &str, what: &str) -> bool {
    if report.contains("cannot be read") && !report.contains(": DAMAGED") {
        return false;
    }
    let meta = pool.join("meta.redb");
    let before = fs::read(&meta).unwrap();
    let out = cairn(&[
        os("mount"),
        pool.as_os_str(),
        mnt.as_os_str(),
        os("--salvage"),
    ]);
    // Without a root inode there is nothing to serve: a clear refusal.
    let root_lost = String::from_utf8_lossy(&out.stderr).contains("root directory's inode");
    assert!(
        out.status.success() || (root_lost && report.contains("PROBLEM: /: DAMAGED")),
        "{what}: mount --salvage failed\ncheck said:\n{report}\n{}",
        describe(&out)
    );
    assert!(
        root_lost || String::from_utf8_lossy(&out.stdout).contains("SALVAGE"),
        "{what}: a salvage mount must say so\n{}",
        describe(&out)
    );
    let intact = intact_files(tree, report);
    if out.status.success() {
        read_tree(mnt, tree, &intact, what, "salvage mount");
        assert_eq!(
            fs::write(mnt.join("new-file"), b"x").map_err(|e| e.raw_os_error()),
            Err(Some(libc::EROFS)),
            "{what}: a salvage mount is read-only"
        );
        let out = cairn_umount(mnt);
        if !out.status.success() {
            lazy_unmount(mnt);
        }
        assert!(wait_unmounted(mnt, std::time::Duration::from_secs(20)));
    }
    assert!(
        fs::read(&meta).unwrap() == before,
        "{what}: the salvage mount changed meta.redb"
    );

    let out = cairn(&[os("salvage"), pool.as_os_str(), os("--rebuild")]);
    assert!(
        out.status.success(),
        "{what}: rebuild failed\n{}",
        describe(&out)
    );
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let aside: Vec<_> = fs::read_dir(pool)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("meta.redb.damaged-")
        })
        .collect();
    assert_eq!(
        aside.len(),
        1,
        "{what}: the damaged store must be kept aside\n{said}"
    );
    assert!(
        fs::read(aside[0].path()).unwrap() == before,
        "{what}: the store kept aside changed"
    );
    let out = cairn(&[os("mount"), pool.as_os_str(), mnt.as_os_str()]);
    assert!(
        out.status.success(),
        "{what}: mount after the rebuild\n{said}\n{}",
        describe(&out)
    );
    read_tree(mnt, tree, &intact, what, "after the rebuild");
    let out = cairn_umount(mnt);
    assert!(out.status.success(), "{what}: {}", describe(&out));
    assert!(wait_unmounted(mnt, std::time::Duration::from_secs(20)));
    let out = cairn(&[os("check"), pool.as_os_str()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: check after the rebuild\nrebuild said:\n{said}\n{}",
        describe(&out)
    );
    true
}

/// What the differing 4 KiB at `at` of a read look like, for the message:
/// zeros, or where in the tree those bytes are.
fn where_from(tree: &Tree, got: &[u8], at: Option<usize>) -> String {
    let Some(at) = at else {
        return String::new();
    };
    let piece = &got[at..(at + 4096).min(got.len())];
    if piece.iter().all(|b| *b == 0) {
        return "zeros there".into();
    }
    for (rel, data) in tree {
        if let Some(p) = data.windows(piece.len()).position(|w| w == piece) {
            return format!("those bytes are {rel} at {p}");
        }
    }
    "bytes found nowhere in the tree (an older version?)".into()
}

/// Every file of `intact` reads its exact bytes; every other one its exact
/// bytes, EIO, or is missing.
fn read_tree(mnt: &Path, tree: &Tree, intact: &[usize], what: &str, when: &str) {
    for (i, (rel, want)) in tree.iter().enumerate() {
        match read_file(&mnt.join(rel)) {
            Ok(got) => assert!(
                got == *want,
                "{what} ({when}): {rel} read {} bytes that differ (first difference at {:?}; {})",
                got.len(),
                first_diff(&got, want),
                where_from(tree, &got, first_diff(&got, want))
            ),
            // A file check does not call intact may be missing: after a
            // rebuild (lost), and in a salvage mount when a damaged branch
            // page hides its name from the lookup. Never other bytes.
            Err(e) => assert!(
                !intact.contains(&i) && (e == libc::EIO || e == libc::ENOENT),
                "{what} ({when}): {rel} failed with errno {e} (check called it intact: {})",
                intact.contains(&i)
            ),
        }
    }
}

fn is_cairn_mount(mnt: &Path) -> bool {
    matches!(
        mount_fstype(mnt).as_deref(),
        Some("fuse.cairn") | Some("fuse")
    )
}

/// A mounted pool whose one device lives inside the pool directory, so
/// that copying the directory copies the whole pool, and that keeps one
/// copy of its metadata: damage to it reaches the store's own checks.
fn pool_with_device_inside(size: &str) -> Fs {
    let mut fs_ = Fs::create();
    let dev = fs_.pool.join("dev0");
    let dev = format!("ssd:{}:{size}", dev.display());
    fs_.mkfs(&["--device", &dev, "--meta-copies", "1"]);
    fs_.mount();
    fs_
}

/// Copies the pristine pool directory (sparse device inside it).
fn copy_pool(from: &Path, to: &Path) {
    let _ = fs::remove_dir_all(to);
    let st = Command::new("cp")
        .args(["-a", "--sparse=always"])
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success(), "cp -a {} {}", from.display(), to.display());
}

#[test]
fn damaged_metadata_reads_exact_or_eio_and_check_never_panics() {
    let mut base = pool_with_device_inside("256M");
    let tree = build_tree(&base);
    base.unmount();
    base.check();

    let seeds = env_usize("CAIRN_DAMAGE_SEEDS", 50) as u64;
    let first = std::env::var("CAIRN_SEED").map_or(1, |s| s.parse().expect("CAIRN_SEED"));
    let copy: PathBuf = base.dir.join("copy");
    let (mut refused, mut mounted, mut flagged, mut salvaged) = (0, 0, 0, 0);
    for seed in first..first + seeds {
        copy_pool(&base.pool, &copy);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // The three shapes of damage the issue reproduced.
        let (count, len) = [(3, 16), (4, 32), (30, 64)][seed as usize % 3];
        let what = format!(
            "seed {seed}: {}",
            damage(&copy.join("meta.redb"), &mut rng, count, len)
        );
        let ok = mount_and_read(&copy, &base.mnt, &tree, &what);
        let out = cairn(&[os("check"), copy.as_os_str()]);
        let code = out.status.code();
        assert!(
            matches!(code, Some(0) | Some(3)),
            "{what}: cairn check must exit 0 or 3\n{}",
            describe(&out)
        );
        // The guard around redb's reads catches its panics; none may print.
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("panicked"),
            "{what}: cairn check printed a panic\n{}",
            describe(&out)
        );
        if !ok {
            assert_eq!(
                code,
                Some(3),
                "{what}: refused mount but check found nothing"
            );
            refused += 1;
            let report = String::from_utf8_lossy(&out.stdout).into_owned();
            salvaged += salvage_and_rebuild(&copy, &base.mnt, &tree, &report, &what) as u32;
        } else {
            mounted += 1;
        }
        flagged += (code == Some(3)) as u32;
    }
    eprintln!(
        "{seeds} damaged copies: {refused} refused ({salvaged} salvaged and rebuilt), {mounted} mounted, {flagged} flagged by check"
    );
    assert!(
        refused > 0,
        "no seed damaged a page in use: the sweep tested nothing"
    );
    assert!(
        salvaged > 0,
        "no refused pool was salvaged: the sweep tested nothing"
    );
    let _ = fs::remove_dir_all(&copy);
}

#[test]
fn check_names_the_file_whose_extents_are_damaged() {
    // One file of many blocks among small ones: damage to the live table's
    // leaf holding its extents must be attributed to it by path.
    let mut fs_ = pool_with_device_inside("128M");
    let big = pattern(7, 64 * 65536 * 4);
    fs::write(fs_.p("big"), &big).unwrap();
    fs::write(fs_.p("small"), b"x").unwrap();
    fs_.unmount();
    // Find the extent values by their layout (value version 2, create_tid,
    // payload version 1, chunk id, valid length 65536, crc) and change a
    // byte of every chunk id, stale page copies included: the page and
    // element checksums both fail, and check must name /big.
    let meta = fs_.pool.join("meta.redb");
    let mut bytes = fs::read(&meta).unwrap();
    let mut hits = 0;
    for i in 0..bytes.len().saturating_sub(26) {
        let v = &bytes[i..i + 26];
        let extent = v[0] == 2
            && v[5..9] == [0; 4]
            && v[9] == 1
            && v[14..18] == [0; 4]
            && v[18..22] == 65536u32.to_le_bytes();
        if extent {
            bytes[i + 10] ^= 0x5a;
            hits += 1;
        }
    }
    assert!(hits >= 64, "found only {hits} extent values in meta.redb");
    fs::write(&meta, &bytes).unwrap();
    let out = cairn(&[os("check"), fs_.pool.as_os_str()]);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("integrity check"), "{text}");
    assert!(text.contains("/big"), "check must name /big\n{text}");
    assert!(!text.contains("/small"), "check blamed /small\n{text}");
    let m = cairn(&[os("mount"), fs_.pool.as_os_str(), fs_.mnt.as_os_str()]);
    assert!(
        !m.status.success(),
        "mounted a damaged store\n{}",
        describe(&m)
    );
    if is_cairn_mount(&fs_.mnt) {
        cairn_umount(&fs_.mnt);
    }
}

/// Rewrites, through redb itself (so every page checksum stays right), the
/// live extent value of `(ino, block)`: `edit` gets the stored value.
fn edit_extent(meta: &Path, ino: u64, block: u64, edit: impl FnOnce(&mut Vec<u8>)) {
    use redb::ReadableTable;
    const LIVE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("live_v1");
    let db = redb::Database::open(meta).unwrap();
    let mut key = ino.to_be_bytes().to_vec();
    key.push(3); // record type: extent
    key.extend_from_slice(&block.to_be_bytes());
    let txn = db.begin_write().unwrap();
    {
        let mut t = txn.open_table(LIVE).unwrap();
        let mut v = t
            .get(key.as_slice())
            .unwrap()
            .expect("extent")
            .value()
            .to_vec();
        edit(&mut v);
        t.insert(key.as_slice(), v.as_slice()).unwrap();
    }
    txn.commit().unwrap();
}

#[test]
fn a_damaged_record_in_a_sound_store_gives_eio_and_is_named() {
    let mut fs_ = pool_with_device_inside("128M");
    let big = pattern(3, 8 * 65536);
    let other = pattern(4, 4 * 65536);
    fs::write(fs_.p("big"), &big).unwrap();
    fs::write(fs_.p("other"), &other).unwrap();
    let (ino_big, ino_other) = {
        use std::os::unix::fs::MetadataExt;
        (
            fs::metadata(fs_.p("big")).unwrap().ino(),
            fs::metadata(fs_.p("other")).unwrap().ino(),
        )
    };
    fs_.unmount();
    let meta = fs_.pool.join("meta.redb");
    // big's block 2: one bit of its chunk id flips (value damaged).
    edit_extent(&meta, ino_big, 2, |v| v[10] ^= 1);
    // other's block 1 gets big's block 3 value verbatim (a record under
    // the wrong key): its crc covers the key, so it must not read big's bytes.
    let mut moved = Vec::new();
    edit_extent(&meta, ino_big, 3, |v| moved = v.clone());
    edit_extent(&meta, ino_other, 1, |v| *v = moved.clone());

    fs_.mount();
    let err = fs::read(fs_.p("big")).expect_err("damaged extent read");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "big: {err}");
    let mut f = fs::File::open(fs_.p("big")).unwrap();
    let mut head = vec![0u8; 2 * 65536];
    f.read_exact(&mut head).unwrap();
    assert_bytes_eq(&head, &big[..2 * 65536], "big before the damaged block");
    drop(f);
    let err = fs::read(fs_.p("other")).expect_err("record under the wrong key read");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "other: {err}");
    let scrub = cairn(&[os("scrub"), fs_.mnt.as_os_str()]);
    let text = String::from_utf8_lossy(&scrub.stdout).into_owned();
    assert_eq!(
        scrub.status.code(),
        Some(3),
        "scrub must report the damage\n{}",
        describe(&scrub)
    );
    assert!(
        text.contains("/big") && text.contains("/other"),
        "scrub must name both\n{text}"
    );
    fs_.unmount();
    let out = cairn(&[os("check"), fs_.pool.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    assert!(
        text.contains("/big: DAMAGED") && text.contains("/other: DAMAGED"),
        "{text}"
    );
}

/// Redundant metadata, end to end: with two devices the pool keeps two
/// copies of its metadata. 1 MiB of random bytes over the middle of one
/// copy while unmounted; the pool mounts, every file reads exact, `cairn
/// scrub` reports the pages repaired, `cairn check` is clean.
#[test]
fn a_damaged_metadata_copy_is_repaired_from_the_other() {
    // "added": the second device is added to a mounted one-device pool
    // (whose second copy lies beside the first), and the next mount moves
    // the second copy beside it; "chosen": one device, the second copy in
    // a directory given to mkfs (--meta-mirror).
    for (which, how) in [
        ("meta.redb", "two"),
        ("meta.mirror", "two"),
        ("meta.redb", "added"),
        ("meta.redb", "chosen"),
    ] {
        let mut fs_ = Fs::create();
        for name in ["fast", "slow", "other-disk"] {
            fs::create_dir(fs_.dir.join(name)).unwrap();
        }
        let fast = format!("nvme:{}:256M", fs_.dir.join("fast").display());
        let slow = format!("hdd:{}:256M", fs_.dir.join("slow").display());
        let chosen = fs_.dir.join("other-disk");
        match how {
            "two" => fs_.mkfs(&["--device", &fast, "--device", &slow, "--sparse"]),
            "added" => fs_.mkfs(&["--device", &fast, "--sparse"]),
            _ => fs_.mkfs(&["--device", &fast, "--meta-mirror", chosen.to_str().unwrap()]),
        }
        fs_.mount();
        if how == "chosen" {
            let target = fs::read_link(fs_.pool.join("meta.mirror")).unwrap();
            assert_eq!(target.parent(), Some(chosen.as_path()));
        }
        if how == "added" {
            let fast_dir = fs_.dir.join("fast");
            let before = fs::read_link(fs_.pool.join("meta.mirror")).unwrap();
            assert_eq!(before.parent(), Some(fast_dir.as_path()));
            let add = [
                os("device"),
                os("add"),
                fs_.mnt.as_os_str(),
                os(&slow),
                os("--sparse"),
            ];
            let out = cairn_ok(&add);
            let slow_dir = fs_.dir.join("slow");
            assert!(
                out.contains("second copy goes to") && out.contains(slow_dir.to_str().unwrap()),
                "{out}"
            );
            fs_.remount();
            assert!(
                fs_.daemon_output().contains("second copy moved"),
                "{}",
                fs_.diagnostics()
            );
            let after = fs::read_link(fs_.pool.join("meta.mirror")).unwrap();
            assert_eq!(after.parent(), Some(slow_dir.as_path()));
            assert!(!before.exists(), "the copy beside the first stayed");
        }
        // Enough files for a metadata file of several MiB.
        let mut tree = Tree::new();
        for d in 0..6 {
            fs::create_dir(fs_.p(&format!("d{d}"))).unwrap();
            for i in 0..1000 {
                let rel = format!("d{d}/a-file-with-a-longer-name-{i:05}");
                let data = pattern((d * 1000 + i) as u64, i % 700);
                fs::write(fs_.p(&rel), &data).unwrap();
                tree.push((rel, data));
            }
        }
        fs_.unmount();
        let copy = fs::canonicalize(fs_.pool.join(which)).unwrap();
        let len = fs::metadata(&copy).unwrap().len();
        assert!(len >= 2 << 20, "{which}: {len} bytes, too small");
        let mut rng = rand::rngs::StdRng::seed_from_u64(len);
        let junk: Vec<u8> = (0..1 << 20).map(|_| rng.gen()).collect();
        let mut f = fs::OpenOptions::new().write(true).open(&copy).unwrap();
        f.seek(SeekFrom::Start(len / 2 - (1 << 19))).unwrap();
        f.write_all(&junk).unwrap();
        f.sync_all().unwrap();
        drop(f);
        fs_.mount();
        for (rel, want) in &tree {
            assert_eq!(&fs::read(fs_.p(rel)).unwrap(), want, "{which}: {rel}");
        }
        let at_open = scrub_repaired_at_open(&fs_.mnt, &format!("{which} ({how})"));
        assert!(
            at_open >= 200,
            "{which} ({how}): {at_open} pages repaired at open"
        );
        fs_.unmount();
        fs_.check();
    }
}

/// `cairn scrub MNT`: the metadata pages it says were repaired from the
/// other copy when the pool was opened (its line "metadata: 2 copies;
/// pages repaired from the other copy: N when the pool was opened, ...").
fn scrub_repaired_at_open(mnt: &Path, what: &str) -> u64 {
    let out = cairn_ok(&[os("scrub"), mnt.as_os_str()]);
    let repaired = out
        .lines()
        .find(|l| l.starts_with("metadata: 2 copies"))
        .unwrap_or_else(|| panic!("{what}: scrub says\n{out}"));
    repaired
        .split(": ")
        .nth(2)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{what}: {repaired}"))
}

/// The pages the daemon's log says differed between the copies and were
/// repaired when the pool was opened ("metadata: N pages of the copies
/// differed; repaired from the good copy"), if it says so.
fn logged_repairs(log: &str) -> Option<u64> {
    let line = log
        .lines()
        .find(|l| l.contains("pages of the copies differed"))?;
    let n = line.split("metadata: ").nth(1)?.split(' ').next()?;
    n.parse().ok()
}

/// Writes `len` random bytes (from `seed`) at `off` of `file`.
fn overwrite_random(file: &Path, off: u64, len: usize, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let junk: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
    let mut f = fs::OpenOptions::new().write(true).open(file).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(&junk).unwrap();
    f.sync_all().unwrap();
}

/// `dirs` directories of `per_dir` small files each, written through the
/// mount: enough for a metadata file of a few hundred KiB per 1,000.
fn small_files(fs_: &Fs, dirs: usize, per_dir: usize) -> Tree {
    let mut tree = Tree::new();
    for d in 0..dirs {
        fs::create_dir(fs_.p(&format!("d{d}"))).unwrap();
        for i in 0..per_dir {
            let rel = format!("d{d}/a-file-with-a-longer-name-{i:05}");
            let data = pattern((d * per_dir + i) as u64, i % 700);
            fs::write(fs_.p(&rel), &data).unwrap();
            tree.push((rel, data));
        }
    }
    tree
}

/// Ditto metadata: a pool of one device (default mkfs) keeps a second copy
/// of its metadata beside the first (`POOL/meta.mirror`). 64 KiB of random
/// bytes over the middle of the first copy, then over its first page (the
/// header), while unmounted: each time the pool mounts, every file reads
/// exact, the log and `cairn scrub` count the pages repaired at open, and
/// `cairn check` is clean.
#[test]
fn a_single_device_pool_repairs_damaged_metadata_from_its_second_copy() {
    let mut fs_ = Fs::create();
    fs_.mkfs(&[]);
    let mirror = fs::read_link(fs_.pool.join("meta.mirror")).expect("a second copy");
    assert_eq!(
        mirror.parent(),
        Some(fs_.pool.as_path()),
        "beside the first"
    );
    fs_.mount();
    let tree = small_files(&fs_, 3, 1000);
    fs_.unmount();
    let meta = fs_.pool.join("meta.redb");
    let len = fs::metadata(&meta).unwrap().len();
    assert!(len >= 512 << 10, "{len} bytes of metadata: too small");
    let middle = (len / 2 - (32 << 10)) / 4096 * 4096;
    for (what, off, n) in [
        ("64 KiB in the middle", middle, 64 << 10),
        ("the first page", 0, 4096),
    ] {
        overwrite_random(&meta, off, n, off + 1);
        fs_.mount();
        for (rel, want) in &tree {
            assert_eq!(&fs::read(fs_.p(rel)).unwrap(), want, "{what}: {rel}");
        }
        let pages = n as u64 / 4096;
        let log = fs_.daemon_output();
        let logged = logged_repairs(&log);
        assert!(
            logged.is_some_and(|l| l >= pages),
            "{what}: the log must count at least {pages} pages repaired\n{}",
            fs_.diagnostics()
        );
        let at_open = scrub_repaired_at_open(&fs_.mnt, what);
        assert_eq!(Some(at_open), logged, "{what}: scrub and the log disagree");
        fs_.unmount();
        fs_.check();
        let second = fs::read(&mirror).unwrap();
        assert!(fs::read(&meta).unwrap() == second, "{what}: copies differ");
    }
}

/// A single-device pool made before single-device pools kept two copies
/// (no `meta.mirror`, no `meta_copies` counter) gets its second copy,
/// beside the first, at the next mount, and says so.
#[test]
fn an_older_single_device_pool_gets_its_second_copy_at_mount() {
    let mut fs_ = Fs::create();
    fs_.mkfs(&[]);
    fs_.mount();
    let tree = small_files(&fs_, 1, 200);
    fs_.unmount();
    let link = fs_.pool.join("meta.mirror");
    fs::remove_file(fs::read_link(&link).unwrap()).unwrap();
    fs::remove_file(&link).unwrap();
    forget_counter(&fs_.pool.join("meta.redb"), "meta_copies");
    fs_.mount();
    let log = fs_.daemon_output();
    assert!(
        log.contains("second copy made at") && log.contains("beside the first copy"),
        "{}",
        fs_.diagnostics()
    );
    let mirror = fs::read_link(&link).expect("a second copy");
    assert_eq!(mirror.parent(), Some(fs_.pool.as_path()));
    for (rel, want) in &tree {
        assert_eq!(&fs::read(fs_.p(rel)).unwrap(), want, "{rel}");
    }
    fs_.unmount();
    fs_.check();
    assert!(fs::read(fs_.pool.join("meta.redb")).unwrap() == fs::read(&mirror).unwrap());
}

/// Removes a counter from the store's counters (through redb itself, so
/// every page checksum stays right), as a release before it left it.
fn forget_counter(meta: &Path, name: &str) {
    const COUNTERS: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("counters_v1");
    let db = redb::Database::open(meta).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut t = txn.open_table(COUNTERS).unwrap();
        assert!(t.remove(name).unwrap().is_some(), "no counter {name}");
    }
    txn.commit().unwrap();
}

/// `mkfs --meta-copies 1` keeps one copy: no `meta.mirror` (a pool it
/// replaces with --force loses its own), and no mount adds one. Counts
/// other than 1 to 4, and one copy with `--meta-mirror`, are refused.
#[test]
fn a_pool_made_with_one_metadata_copy_never_gets_a_second() {
    let mut fs_ = Fs::create();
    let pool = fs_.pool.to_str().unwrap().to_string();
    for bad in ["0", "5"] {
        cairn_err(&["mkfs", &pool, "--meta-copies", bad], "1 to 4 copies");
    }
    let dir = fs_.dir.to_str().unwrap().to_string();
    let both = ["mkfs", &pool, "--meta-copies", "1", "--meta-mirror", &dir];
    cairn_err(&both, "--meta-mirror");
    assert!(!fs_.pool.exists(), "a refused mkfs made the pool directory");
    fs_.mkfs(&[]);
    let old = fs::read_link(fs_.pool.join("meta.mirror")).expect("two copies by default");
    let out = cairn_ok(&["mkfs", &pool, "--force", "--sparse", "--meta-copies", "1"]);
    assert!(out.contains("metadata: 1 copy"), "{out}");
    let pool_dir = fs_.pool.clone();
    let no_mirror = |when: &str| {
        assert!(
            fs::symlink_metadata(pool_dir.join("meta.mirror")).is_err(),
            "{when}: a meta.mirror"
        );
        let copies: Vec<_> = (fs::read_dir(&pool_dir).unwrap().flatten())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("cairn-meta-mirror-")
            })
            .map(|e| e.path())
            .collect();
        assert!(copies.is_empty(), "{when}: {copies:?}");
    };
    no_mirror("after mkfs --force --meta-copies 1");
    assert!(!old.exists(), "--force left the old pool's second copy");
    fs_.mount();
    fs::write(fs_.p("f"), b"one copy").unwrap();
    fs_.remount();
    assert!(
        !fs_.daemon_output().contains("second copy"),
        "{}",
        fs_.diagnostics()
    );
    assert_eq!(fs::read(fs_.p("f")).unwrap(), b"one copy");
    fs_.unmount();
    fs_.check();
    no_mirror("after two mounts and a check");
}
