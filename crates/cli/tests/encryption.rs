//! Encryption at rest on real mounts (issue 53): an encrypted pool keeps
//! file contents, metadata values (a symlink's target, an xattr's value)
//! and names (of 1,000 files and their xattrs) out of every byte it stores (device files, the SSD cache, the
//! intent log's records, the metadata store and its copy), while an
//! unencrypted pool, the negative control, shows them; a wrong key, a damaged key block and an open key
//! file are refused and change nothing; `key change` rewraps without
//! rewriting data; a changed or moved chunk gives EIO, never other bytes.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]
#![allow(
    clippy::cast_possible_truncation,
    reason = "test sizes and offsets: small by construction"
)]

mod common;

use common::canary::{files_under, hits_in, windows};
use common::*;
use std::collections::HashSet;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

/// The big file, spread over the fast tier and the slow one.
const BIG: (u64, usize) = (11, 48 << 20);
/// The small file fsync'd into the intent log just before a kill -9.
const LOGGED: (u64, usize) = (12, 20_000);
/// A symlink's target and an xattr's value: metadata values, sealed.
const TARGET: &str = "canary/symlink-target-7f3a9c1e";
const XATTR_VALUE: &[u8] = b"canary-xattr-value-91bd44e2";
/// Files with distinctive names, each with an xattr of a distinctive
/// name: names sit in the metadata's keys, sealed; the last `NAMES_LOGGED`
/// are made after the commit, so that their names are only in the log.
const NAMES: usize = 1000;
const NAMES_LOGGED: usize = 10;

/// A snapshot's name (in the snapshots table: sealed too).
const SNAPSHOT: &str = "canary-snapshot-name-7c41d09e2b";

fn file_name(i: usize) -> String {
    format!("canary-file-name-{i:04}-5d2e9b71c3")
}

fn xattr_name(i: usize) -> String {
    format!("user.canary-xattr-name-{i:04}-e8a1")
}

/// Makes the named files `range` in directory `canary-directory-4b1f`.
fn make_named(fs: &Fs, range: std::ops::Range<usize>) {
    let dir = fs.p("canary-directory-4b1f");
    std::fs::create_dir_all(&dir).unwrap();
    for i in range {
        let p = dir.join(file_name(i));
        std::fs::write(&p, b"x").unwrap();
        setxattr(&p, &xattr_name(i), b"v").unwrap();
    }
}

/// The 16-byte windows of every canary name.
fn name_windows() -> HashSet<[u8; 16]> {
    let mut wins = windows(b"canary-directory-4b1f");
    wins.extend(windows(SNAPSHOT.as_bytes()));
    for i in 0..NAMES {
        wins.extend(windows(file_name(i).as_bytes()));
        wins.extend(windows(xattr_name(i).as_bytes()));
    }
    wins
}

/// A key file of 32 random bytes, mode 0600, in the test's directory.
fn key_file(fs: &Fs, name: &str) -> PathBuf {
    let p = fs.dir.join(name);
    std::fs::write(&p, pattern(seed() ^ name.len() as u64, 32)).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// A pool of a small fast device, a slow one and an SSD cache, with the
/// cache's fill limits off and the RAM cache off (so rereads fill the SSD
/// cache), encrypted with `key` when given, mounted with a long commit
/// interval (so fsync's records stay in the log).
fn pool(key: Option<&Path>) -> Fs {
    let mut fs = Fs::create();
    let devices = [
        format!("nvme:{}:32M", fs.dev("fast")),
        format!("hdd:{}:256M", fs.dev("slow")),
        format!("ssd:{}:64M:role=cache", fs.dev("cache")),
    ];
    let mut args: Vec<String> = Vec::new();
    for d in &devices {
        args.extend(["--device".into(), d.clone()]);
    }
    if let Some(k) = key {
        args.extend([
            "--encrypt".into(),
            "--key-file".into(),
            k.display().to_string(),
        ]);
        fs.mount_args
            .extend(["--key-file".into(), k.display().to_string()]);
    }
    fs.mkfs(&args.iter().map(String::as_str).collect::<Vec<_>>());
    for (k, v) in [
        ("cache_fill_burst_mib", "1024"),
        ("cache_fill_rate_mib", "1024"),
        ("read_cache_mib", "0"),
    ] {
        fs.set_config(k, v);
    }
    fs.mount_args
        .extend(["--commit-interval".into(), "600".into()]);
    fs.mount();
    fs
}

/// Writes the big file (committed), rereads it after a remount (filling
/// the SSD cache), then fsyncs the small one and kills the daemon, so
/// that its record is only in the intent log; the next mount replays it.
fn fill(fs: &mut Fs) {
    std::fs::write(fs.p("big"), pattern(BIG.0, BIG.1)).unwrap();
    std::os::unix::fs::symlink(TARGET, fs.p("link")).unwrap();
    setxattr(&fs.p("big"), "user.canary", XATTR_VALUE).unwrap();
    make_named(fs, 0..NAMES - NAMES_LOGGED);
    cairn_ok(&["snapshot", "create", fs.mnt.to_str().unwrap(), SNAPSHOT]);
    cairn_ok(&["sync", fs.mnt.to_str().unwrap()]);
    fs.remount();
    assert_bytes_eq(
        &std::fs::read(fs.p("big")).unwrap(),
        &pattern(BIG.0, BIG.1),
        "big",
    );
    make_named(fs, NAMES - NAMES_LOGGED..NAMES);
    let mut f = std::fs::File::create(fs.p("logged")).unwrap();
    std::io::Write::write_all(&mut f, &pattern(LOGGED.0, LOGGED.1)).unwrap();
    f.sync_all().unwrap();
    fs.kill9();
}

/// Every file the pool keeps: the pool directory's (symlinks followed:
/// the metadata's copies) and its devices'.
fn stored_files(fs: &Fs) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [fs.pool.clone(), fs.dir.join("devs")] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = std::fs::canonicalize(e.unwrap().path()).unwrap();
            if p.is_file() && !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// (file, hits) for every stored file with any window of the big file's
/// or the logged file's bytes.
fn plaintext_hits(fs: &Fs) -> Vec<(String, usize)> {
    let mut wins = windows(&pattern(BIG.0, BIG.1));
    wins.extend(windows(&pattern(LOGGED.0, LOGGED.1)));
    wins.extend(windows(TARGET.as_bytes()));
    wins.extend(windows(XATTR_VALUE));
    wins.extend(name_windows());
    let logged = windows(&pattern(LOGGED.0, LOGGED.1));
    let mut out = Vec::new();
    for f in stored_files(fs) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let (all, small) = (hits_in(&f, &wins), hits_in(&f, &logged));
        if all > 0 {
            out.push((format!("{name} (of which the fsync'd file: {small})"), all));
        }
    }
    out
}

#[test]
fn file_contents_are_in_no_stored_byte_of_an_encrypted_pool() {
    let probe = Fs::create();
    let key = key_file(&probe, "key");
    let mut fs = pool(Some(&key));
    fill(&mut fs);
    let hits = plaintext_hits(&fs);
    assert!(hits.is_empty(), "plaintext in an encrypted pool: {hits:?}");
    // The log's record replays: the fsync'd file is back, exact.
    fs.mount();
    assert_bytes_eq(
        &std::fs::read(fs.p("logged")).unwrap(),
        &pattern(LOGGED.0, LOGGED.1),
        "logged after kill -9",
    );
    assert_bytes_eq(
        &std::fs::read(fs.p("big")).unwrap(),
        &pattern(BIG.0, BIG.1),
        "big after kill -9",
    );
    // Every name reads back, the logged ones replayed from the log.
    for i in [0, 7, NAMES - NAMES_LOGGED - 1, NAMES - 1] {
        let p = fs.p("canary-directory-4b1f").join(file_name(i));
        assert_eq!(std::fs::read(&p).unwrap(), b"x", "{}", p.display());
        let names = xattr_names(&p);
        assert!(names.contains(&xattr_name(i)), "{names:?}");
    }
    let listed = std::fs::read_dir(fs.p("canary-directory-4b1f"))
        .unwrap()
        .count();
    assert_eq!(listed, NAMES);
    let snaps = cairn_ok(&["snapshot", "list", fs.mnt.to_str().unwrap()]);
    assert!(snaps.contains(SNAPSHOT), "{snaps}");
    let seen = fs
        .mnt
        .join(".snapshots")
        .join(SNAPSHOT)
        .join("canary-directory-4b1f");
    assert_eq!(std::fs::read(seen.join(file_name(3))).unwrap(), b"x");
    let info = cairn_ok(&["info", fs.mnt.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    let enc = &v["encryption"];
    assert_eq!(enc["key_source"], "key file (32 raw bytes)", "{enc}");
    let algorithm = enc["algorithm"].as_str().unwrap();
    assert!(
        algorithm.starts_with("XAES-256-GCM chunks; XChaCha20-Poly1305 metadata"),
        "a new pool seals chunks with XAES-256-GCM: {enc}"
    );
    fs.unmount();
    let out = checked(&fs, Some(&key));
    assert!(
        out.status.success(),
        "check of the encrypted pool: {}",
        describe(&out)
    );
}

/// The xattr names of `p`.
fn xattr_names(p: &Path) -> Vec<String> {
    let path = cpath(p);
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: the path is NUL-terminated; the buffer is live and of the
    // length given.
    let n = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "listxattr: {}", std::io::Error::last_os_error());
    buf.truncate(n as usize);
    (buf.split(|&b| b == 0))
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

/// The negative control: the same steps on a pool without encryption find
/// the contents in the device files, the SSD cache and the intent log.
#[test]
fn the_scan_finds_contents_in_an_unencrypted_pool() {
    let mut fs = pool(None);
    fill(&mut fs);
    let hits = plaintext_hits(&fs);
    let named = |n: &str| hits.iter().any(|(f, _)| f.starts_with(n));
    assert!(named("fast") && named("slow") && named("cache"), "{hits:?}");
    // The symlink target and the xattr value are in the metadata store.
    let meta = std::fs::canonicalize(fs.pool.join("meta.redb")).unwrap();
    let values: HashSet<[u8; 16]> = windows(TARGET.as_bytes())
        .into_iter()
        .chain(windows(XATTR_VALUE))
        .collect();
    assert!(
        hits_in(&meta, &values) >= 2,
        "the metadata values were not found in {}",
        meta.display()
    );
    // So are the names (entries and xattr names), in its keys.
    let names = hits_in(&meta, &name_windows());
    assert!(
        names >= 2 * (NAMES - NAMES_LOGGED),
        "{names} names found in {}",
        meta.display()
    );
    // The logged file is in the log areas of the devices only.
    let in_log = hits
        .iter()
        .any(|(f, _)| !f.ends_with("(of which the fsync'd file: 0)"));
    assert!(in_log, "the fsync'd record was not found: {hits:?}");
    fs.mount();
    fs.finish();
}

/// `cairn check POOL [--key-file K]` without a terminal.
fn checked(fs: &Fs, key: Option<&Path>) -> Output {
    let mut args = vec!["check".to_string(), fs.pool.display().to_string()];
    if let Some(k) = key {
        args.extend(["--key-file".into(), k.display().to_string()]);
    }
    cairn_no_tty(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Asserts `out` failed and its stderr says `want`.
fn refused(out: &Output, want: &str, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(want),
        "{what}: {}",
        describe(out)
    );
}

#[test]
fn wrong_keys_damaged_key_blocks_and_open_key_files_are_refused_and_change_nothing() {
    let probe = Fs::create();
    let key = key_file(&probe, "key");
    let mut fs = pool(Some(&key));
    std::fs::write(fs.p("f"), pattern(3, 300_000)).unwrap();
    fs.unmount();
    let before: Vec<(PathBuf, Vec<u8>)> = (stored_files(&fs).into_iter())
        .filter(|p| !p.ends_with("cairn.log"))
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();
    let pool = fs.pool.display().to_string();
    let mnt = fs.mnt.display().to_string();
    let other = key_file(&probe, "other-key");
    let other_s = other.display().to_string();
    refused(
        &cairn_no_tty(&["mount", &pool, &mnt, "--key-file", &other_s]),
        "wrong passphrase or key file",
        "another key",
    );
    refused(
        &checked(&fs, Some(&other)),
        "wrong passphrase or key file",
        "check with another key",
    );
    refused(
        &cairn_no_tty(&["mount", &pool, &mnt]),
        "give --key-file",
        "no key and no terminal",
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused(
        &checked(&fs, Some(&key)),
        "chmod 600",
        "a key file others can read",
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let block = fs.pool.join("key");
    let good = std::fs::read(&block).unwrap();
    let mut bad = good.clone();
    bad[100] ^= 0x01;
    std::fs::write(&block, &bad).unwrap();
    refused(
        &checked(&fs, Some(&key)),
        "key block is damaged",
        "a damaged key block",
    );
    std::fs::write(&block, &good).unwrap();
    // A key file for a pool that is not encrypted names the wrong pool.
    let plain = Fs::create();
    plain.mkfs(&[]);
    let plain_pool = plain.pool.display().to_string();
    let key_s = key.display().to_string();
    refused(
        &cairn_no_tty(&["check", &plain_pool, "--key-file", &key_s]),
        "is not encrypted",
        "a key for a plain pool",
    );
    for (p, bytes) in &before {
        assert!(
            std::fs::read(p).unwrap() == *bytes,
            "{} changed by a refused command",
            p.display()
        );
    }
    fs.mount();
    assert_bytes_eq(
        &std::fs::read(fs.p("f")).unwrap(),
        &pattern(3, 300_000),
        "f after the refusals",
    );
    fs.unmount();
    assert!(checked(&fs, Some(&key)).status.success());
}

#[test]
fn key_change_rewraps_the_key_and_the_old_one_stops_working() {
    let probe = Fs::create();
    let key = key_file(&probe, "key");
    let mut fs = pool(Some(&key));
    std::fs::write(fs.p("f"), pattern(4, 1 << 20)).unwrap();
    let new = probe.dir.join("passphrase");
    std::fs::write(&new, "a long passphrase for the new key\n").unwrap();
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (key_s, new_s) = (key.display().to_string(), new.display().to_string());
    let mnt = fs.mnt.display().to_string();
    // Online: the mounted pool goes on, only the key block changes.
    let out = cairn_no_tty(&[
        "key",
        "change",
        &mnt,
        "--key-file",
        &key_s,
        "--new-key-file",
        &new_s,
    ]);
    assert!(out.status.success(), "key change: {}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no data was rewritten"));
    std::fs::write(fs.p("g"), pattern(5, 70_000)).unwrap();
    fs.unmount();
    refused(
        &checked(&fs, Some(&key)),
        "wrong passphrase or key file",
        "the old key",
    );
    let out = cairn_no_tty(&[
        "key",
        "change",
        &fs.pool.display().to_string(),
        "--key-file",
        &key_s,
        "--new-key-file",
        &key_s,
    ]);
    refused(
        &out,
        "wrong passphrase or key file",
        "a change with the old key",
    );
    fs.mount_args = vec!["--key-file".into(), new_s.clone()];
    fs.mount();
    assert_bytes_eq(
        &std::fs::read(fs.p("f")).unwrap(),
        &pattern(4, 1 << 20),
        "f",
    );
    assert_bytes_eq(&std::fs::read(fs.p("g")).unwrap(), &pattern(5, 70_000), "g");
    let info = cairn_ok(&["info", &mnt, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(
        v["encryption"]["key_source"], "passphrase (Argon2id)",
        "{info}"
    );
    fs.unmount();
    assert!(checked(&fs, Some(&new)).status.success());
}

/// The places of the encrypted chunks (version 2 headers: sealed whole;
/// 3: sealed span by span; 4: XAES-256-GCM, either) in `dev`.
fn encrypted_chunks(dev: &[u8]) -> Vec<usize> {
    (0..dev.len().saturating_sub(56))
        .filter(|&i| &dev[i..i + 4] == b"CHNK" && matches!(dev[i + 4], 2..=4))
        .collect()
}

/// The stored length of the chunk at `at` (its header's).
fn stored_len(dev: &[u8], at: usize) -> usize {
    u32::from_le_bytes(dev[at + 12..at + 16].try_into().unwrap()) as usize
}

/// Makes the checksums of the chunk at `at` agree with its bytes again,
/// so only the encryption's authentication can notice a change.
fn reseal_checksums(dev: &mut [u8], at: usize) {
    let stored = stored_len(dev, at);
    let crc = crc32c::crc32c(&dev[at + 56..at + 56 + stored]);
    dev[at + 48..at + 52].copy_from_slice(&crc.to_le_bytes());
    let head = crc32c::crc32c(&dev[at..at + 52]);
    dev[at + 52..at + 56].copy_from_slice(&head.to_le_bytes());
}

#[test]
fn a_changed_or_moved_chunk_gives_eio_never_other_bytes() {
    let probe = Fs::create();
    let key = key_file(&probe, "key");
    let mut fs = pool(Some(&key));
    // Two files of one 64 KiB block each, with different contents.
    std::fs::write(fs.p("a"), pattern(21, 65_536)).unwrap();
    std::fs::write(fs.p("b"), pattern(22, 65_536)).unwrap();
    fs.unmount();
    let dev_path = fs.dir.join("devs").join("fast");
    let clean = std::fs::read(&dev_path).unwrap();
    let chunks = encrypted_chunks(&clean);
    assert_eq!(chunks.len(), 2, "two encrypted chunks on the fast device");
    let read_both = |fs: &mut Fs, what: &str| {
        fs.mount();
        let got: Vec<std::io::Result<Vec<u8>>> =
            ["a", "b"].iter().map(|n| std::fs::read(fs.p(n))).collect();
        fs.unmount();
        for (r, (n, seed)) in got.iter().zip([("a", 21), ("b", 22)]) {
            if let Ok(bytes) = r {
                assert_bytes_eq(bytes, &pattern(seed, 65_536), &format!("{what}: {n} read"));
            }
        }
        got.iter()
            .filter(|r| {
                r.as_ref()
                    .is_err_and(|e| e.raw_os_error() == Some(libc::EIO))
            })
            .count()
    };
    // The device with chunk `at`'s checksums redone (so only the
    // encryption's authentication can notice the change), then both read.
    let damaged = |fs: &mut Fs, mut dev: Vec<u8>, at: usize, what: &str| {
        reseal_checksums(&mut dev, at);
        std::fs::write(&dev_path, &dev).unwrap();
        let eio = read_both(fs, what);
        assert_eq!(eio, 1, "{what}: {}", fs.daemon_output());
    };
    // A flipped bit: authentication refuses it.
    let mut dev = clean.clone();
    dev[chunks[0] + 56 + 24 + 1000] ^= 0x04;
    damaged(&mut fs, dev, chunks[0], "a flipped bit");
    // A 64 KiB block is sealed in 4 KiB spans: a small read opens only
    // the spans it touches, so a flipped bit fails the reads of its span
    // and no other (and the whole file's read, above).
    fs.mount();
    let a = std::fs::File::open(fs.p("a")).unwrap();
    let mut span = vec![0u8; 4096];
    let flipped = a.read_exact_at(&mut span, 1000);
    let elsewhere = a.read_exact_at(&mut span, 8192);
    drop(a);
    fs.unmount();
    assert_eq!(flipped.unwrap_err().raw_os_error(), Some(libc::EIO));
    elsewhere.expect("a span without damage reads");
    assert_bytes_eq(&span, &pattern(21, 65_536)[8192..12_288], "a's third span");
    // Two spans of a chunk swapped, checksums redone: refused.
    let mut dev = clean.clone();
    let (s0, s1) = (chunks[0] + 56, chunks[0] + 56 + 4096 + 40);
    let first = dev[s0..s1].to_vec();
    dev.copy_within(s1..s1 + 4096 + 40, s0);
    dev[s1..s1 + 4096 + 40].copy_from_slice(&first);
    damaged(&mut fs, dev, chunks[0], "two spans swapped");
    // One chunk's sealed bytes under the other's header: refused too.
    let mut dev = clean.clone();
    let len = stored_len(&dev, chunks[0]);
    assert_eq!(len, 65_536 + 16 * (24 + 16), "16 spans, each sealed");
    let (a, b) = (chunks[0] + 56, chunks[1] + 56);
    let moved = dev[a..a + len].to_vec();
    dev[b..b + len].copy_from_slice(&moved);
    damaged(&mut fs, dev, chunks[1], "a moved chunk");
    std::fs::write(&dev_path, &clean).unwrap();
    assert_eq!(read_both(&mut fs, "restored"), 0);
}

#[test]
fn dedup_and_compression_work_inside_an_encrypted_pool() {
    let mut fs = Fs::create();
    let key = key_file(&fs, "key");
    let key_s = key.display().to_string();
    fs.mkfs(&["--encrypt", "--key-file", &key_s, "--compression", "lz4"]);
    fs.mount_args.extend(["--key-file".into(), key_s]);
    fs.mount();
    let text: Vec<u8> = (0..4 << 20)
        .map(|i: u32| b"encrypted, compressed, deduplicated "[(i % 36) as usize])
        .collect();
    std::fs::write(fs.p("one"), &text).unwrap();
    std::fs::write(fs.p("two"), &text).unwrap();
    cairn_ok(&["sync", fs.mnt.to_str().unwrap()]);
    // A third copy in a later flush: its blocks are found in the dedup
    // index (the flush's hash workers seal only blocks the index lacks).
    std::fs::write(fs.p("three"), &text).unwrap();
    cairn_ok(&["sync", fs.mnt.to_str().unwrap()]);
    let v: serde_json::Value =
        serde_json::from_str(&cairn_ok(&["info", fs.mnt.to_str().unwrap(), "--json"])).unwrap();
    let (dedup, compression) = (
        v["dedup_ratio"].as_f64().unwrap(),
        v["compression_ratio"].as_f64().unwrap(),
    );
    assert!(dedup > 2.85, "dedup ratio {dedup}");
    assert!(compression > 4.0, "compression ratio {compression}");
    fs.remount();
    assert_bytes_eq(&std::fs::read(fs.p("two")).unwrap(), &text, "two");
    assert_bytes_eq(&std::fs::read(fs.p("three")).unwrap(), &text, "three");
    fs.unmount();
    assert!(checked(&fs, Some(&key)).status.success());
}

/// A mirror of an encrypted pool takes its streams without the key (no
/// terminal, no key file): full, then incremental; holds none of the data
/// in the clear; says it is sealed; refuses a mount and a promote without
/// the key; promoted and mounted with it, reads every file exact.
#[test]
fn a_mirror_takes_an_encrypted_pools_streams_without_its_key() {
    let mut src = Fs::create();
    let key = key_file(&src, "key");
    let key_s = key.display().to_string();
    src.mkfs(&["--encrypt", "--key-file", &key_s]);
    src.mount_args.extend(["--key-file".into(), key_s.clone()]);
    src.mount();
    let (one, two) = (pattern(31, 3 << 20), pattern(32, 200_000));
    std::fs::write(src.p("one"), &one).unwrap();
    let smnt = src.mnt.to_str().unwrap().to_string();
    cairn_ok(&["sync", &smnt]);
    let mut dst = Fs::create();
    let dev = format!("ssd:{}:128M:sparse", dst.dev("d0"));
    dst.mkfs(&["--mirror", "--device", &dev]);
    let dpool = dst.pool.to_str().unwrap().to_string();
    let copied = |what: &str| {
        let out = cairn_no_tty(&["mirror", "copy", &smnt, &dpool]);
        assert!(out.status.success(), "{what}: {}", describe(&out));
    };
    copied("a full copy without the mirror's key");
    std::fs::write(src.p("two"), &two).unwrap();
    cairn_ok(&["sync", &smnt]);
    copied("an incremental copy");
    let status = cairn_no_tty(&["mirror", "status", &dpool]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("held without its key"),
        "{}",
        describe(&status)
    );
    let info = cairn_no_tty(&["info", &dpool]);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        text.contains("held without its key"),
        "info: {}",
        describe(&info)
    );
    let wins: HashSet<[u8; 16]> = windows(&one).union(&windows(&two)).copied().collect();
    let hits: Vec<(PathBuf, usize)> = (files_under(&dst.dir).into_iter())
        .map(|f| (f.clone(), hits_in(&f, &wins)))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(hits.is_empty(), "plaintext in the mirror: {hits:?}");
    let out = cairn_no_tty(&["check", &dpool]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(" 0 problem(s)"),
        "a check without the key: {}",
        describe(&out)
    );
    let dmnt = dst.mnt.to_str().unwrap().to_string();
    refused(
        &cairn_no_tty(&["mount", &dpool, &dmnt]),
        "encrypted",
        "a mount without the key",
    );
    refused(
        &cairn_no_tty(&["mirror", "promote", &dpool]),
        "encrypted",
        "a promote without the key",
    );
    let out = cairn_no_tty(&["--key-file", &key_s, "mirror", "promote", &dpool]);
    assert!(out.status.success(), "promote: {}", describe(&out));
    dst.mount_args.extend(["--key-file".into(), key_s]);
    dst.mount();
    assert_bytes_eq(&std::fs::read(dst.p("one")).unwrap(), &one, "one");
    assert_bytes_eq(&std::fs::read(dst.p("two")).unwrap(), &two, "two");
    std::fs::write(dst.p("three"), b"written after the promote").unwrap();
    dst.unmount();
    assert!(checked(&dst, Some(&key)).status.success());
    src.unmount();
    assert!(checked(&src, Some(&key)).status.success());
}

/// Names sealed in keys still make a history that follows a path: a file
/// saved by rename over it twice lists its three versions, each a new
/// inode, and its first version reads back through `@@0x<tid>`.
#[test]
fn history_follows_a_path_in_an_encrypted_pool() {
    let mut fs = Fs::create();
    let key = key_file(&fs, "key");
    let key_s = key.display().to_string();
    fs.mkfs(&["--encrypt", "--key-file", &key_s]);
    fs.mount_args.extend(["--key-file".into(), key_s]);
    fs.mount();
    let mnt = fs.mnt.to_str().unwrap().to_string();
    for v in ["one\n", "two\n", "three\n"] {
        std::fs::write(fs.p("saved.tmp"), v).unwrap();
        std::fs::rename(fs.p("saved.tmp"), fs.p("saved")).unwrap();
        cairn_ok(&["sync", &mnt]);
    }
    let out = cairn_ok(&["history", fs.p("saved").to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let versions = v.as_array().unwrap();
    assert_eq!(versions.len(), 3, "{out}");
    let inos: HashSet<u64> = versions
        .iter()
        .map(|x| x["ino"].as_u64().unwrap())
        .collect();
    assert_eq!(inos.len(), 3, "each save is a new inode: {out}");
    let first = versions[0]["tid"].as_u64().unwrap();
    let old = fs.mnt.join(format!("saved@@{first:#x}"));
    assert_eq!(std::fs::read(&old).unwrap(), b"one\n");
    fs.unmount();
    assert!(checked(&fs, Some(&key)).status.success());
}

/// A pool encrypted by the build before XAES-256-GCM (made by `78e30bd`:
/// chunks sealed with XChaCha20-Poly1305, key block cipher 1; a 64 MiB
/// device, a 70,000-byte file, a small one with an xattr, a symlink),
/// kept as a fixture and unpacked at the path it was made at (a pool
/// names its devices by absolute path). It mounts with its key file,
/// reads exact, takes a write whose chunks stay in its own cipher
/// (versions 2 and 3, never 4), says so in `cairn info`, and checks clean.
#[test]
fn a_pool_encrypted_before_xaes_still_reads_and_writes() {
    let at = Path::new("/var/tmp/cairn-fixture-xchacha");
    let _ = std::fs::remove_dir_all(at);
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/xchacha-pool.tar.gz"
    );
    let untar = std::process::Command::new("tar")
        .args(["-xzf", fixture, "-C", "/var/tmp"])
        .status()
        .unwrap();
    assert!(untar.success(), "unpacking {fixture}");
    let (pool, key, mnt) = (at.join("pool"), at.join("key"), at.join("m"));
    std::fs::create_dir_all(&mnt).unwrap();
    let s = |p: &Path| p.display().to_string();
    cairn_ok(&["mount", &s(&pool), &s(&mnt), "--key-file", &s(&key)]);
    let old: Vec<u8> = (0..70_000u32)
        .map(|i| ((i * 7 + i / 251) % 256) as u8)
        .collect();
    assert_bytes_eq(
        &std::fs::read(mnt.join("big.bin")).unwrap(),
        &old,
        "big.bin",
    );
    assert_eq!(
        std::fs::read_to_string(mnt.join("small.txt")).unwrap(),
        "written by the build before XAES-256-GCM\n"
    );
    assert_eq!(
        std::fs::read_link(mnt.join("link")).unwrap(),
        Path::new("small.txt")
    );
    assert_eq!(
        xattr_names(&mnt.join("small.txt")),
        vec!["user.note".to_string()]
    );
    let new = pattern(41, 200_000);
    std::fs::write(mnt.join("new.bin"), &new).unwrap();
    cairn_ok(&["sync", &s(&mnt)]);
    let info = cairn_ok(&["info", &s(&mnt), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    let algorithm = v["encryption"]["algorithm"].as_str().unwrap().to_string();
    assert!(
        algorithm.starts_with("XChaCha20-Poly1305 chunks"),
        "{algorithm}"
    );
    cairn_ok(&["umount", &s(&mnt)]);
    let dev = std::fs::read(pool.join("data.0")).unwrap();
    let versions: std::collections::BTreeSet<u8> =
        encrypted_chunks(&dev).iter().map(|&i| dev[i + 4]).collect();
    assert_eq!(
        versions,
        [2, 3].into(),
        "the old pool's chunks stay in its cipher"
    );
    assert!(
        encrypted_chunks(&dev).len() >= 5,
        "the new file's chunks are there too"
    );
    cairn_ok(&["mount", &s(&pool), &s(&mnt), "--key-file", &s(&key)]);
    assert_bytes_eq(
        &std::fs::read(mnt.join("new.bin")).unwrap(),
        &new,
        "new.bin",
    );
    cairn_ok(&["umount", &s(&mnt)]);
    let out = cairn_no_tty(&["check", &s(&pool), "--key-file", &s(&key)]);
    assert!(out.status.success(), "check: {}", describe(&out));
    std::fs::remove_dir_all(at).unwrap();
}
