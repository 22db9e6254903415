//! Mirrors kept in a bucket, against a real S3 server (s3s-fs on a
//! loopback port): `cairn mirror copy SRC s3:...` stores a mounted pool's
//! streams and chunks as objects, incrementally (a second copy uploads
//! only new chunks, a copy with nothing new uploads nothing) and
//! deduplicated by content hash across copies; `cairn mirror restore`
//! makes a new mirror pool from the bucket with the same tree and the
//! same snapshot hashes, and brings it up to date later; a source pruned
//! past the bucket's chain is refused until `--resync` starts a new chain;
//! damaged objects, a foreign prefix, another pool's bucket, the wrong
//! target pool and a world-readable credentials file are refused with a
//! clear error and change nothing; the secret never reaches an output.

mod common;

use cairn_objstore::testing::{write_credentials, S3Server, TEST_SECRET};
use common::hist::*;
use common::*;
use serde_json::Value;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::Path;

/// Runs `cairn ARGS --credentials-file CREDS`, which must succeed; its
/// output (stdout and stderr) must not show the secret.
fn with_creds(args: &[&OsStr], creds: &Path) -> std::process::Output {
    let mut a: Vec<&OsStr> = args.to_vec();
    a.extend([os("--credentials-file"), creds.as_os_str()]);
    let out = cairn(&a);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(TEST_SECRET), "the secret was printed: {all}");
    out
}

fn ok_json(args: &[&OsStr], creds: &Path) -> Value {
    let mut a: Vec<&OsStr> = args.to_vec();
    a.push(os("--json"));
    let out = with_creds(&a, creds);
    assert!(out.status.success(), "{}", describe(&out));
    serde_json::from_slice(&out.stdout).expect("json")
}

fn copy(src: &Fs, spec: &str, creds: &Path) -> Value {
    ok_json(
        &[os("mirror"), os("copy"), src.mnt.as_os_str(), os(spec)],
        creds,
    )
}

fn restore(spec: &str, pool: &Path, creds: &Path) -> Value {
    ok_json(
        &[os("mirror"), os("restore"), os(spec), pool.as_os_str()],
        creds,
    )
}

fn refused(args: &[&OsStr], creds: &Path, want: &str) {
    let out = with_creds(args, creds);
    assert!(!out.status.success(), "succeeded: {}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(want), "wanted '{want}' in: {err}");
}

fn tid(target: &Path) -> u64 {
    let st = cairn_json(&[os("mirror"), os("status"), target.as_os_str(), os("--json")]);
    field_u64(&st, "tid")
}

fn n(v: &Value, a: &str, b: &str) -> u64 {
    v[a][b].as_u64().unwrap_or_else(|| panic!("{a}.{b} in {v}"))
}

fn assert_same_snapshot(src: &Fs, dst: &Fs, name: &str) {
    assert_same_snapshot_hash(&src.mnt, &dst.mnt, name);
    let want = capture(&snap_root(&src.mnt, name)).unwrap();
    assert_tree_at(&snap_root(&dst.mnt, name), &want, name);
}

#[test]
fn a_pool_mirrored_to_a_bucket_restores_to_a_new_pool_with_equal_snapshots() {
    let s3 = S3Server::start();
    let src = Fs::new();
    let creds = src.dir.join("s3.creds");
    write_credentials(&creds);
    let spec = s3.spec("backup/pool1");
    mirror_first_tree(&src);
    snapshot_create(&src.mnt, "one");
    let c1 = copy(&src, &spec, &creds);
    // 3 MiB of distinct data: 48 chunks of 64 KiB, and the small file.
    assert!(n(&c1, "bucket", "chunks_put") >= 48, "{c1}");
    let objs = s3.objects("backup/pool1");
    let chunks = objs.iter().filter(|o| o.starts_with("chunk-")).count() as u64;
    assert_eq!(chunks, n(&c1, "bucket", "chunks_put"), "{objs:?}");
    assert!(objs.contains(&"manifest".to_string()), "{objs:?}");
    assert_eq!(objs.iter().filter(|o| o.starts_with("stream-")).count(), 1);

    // More changes: a file whose content the bucket holds costs no upload.
    fs::write(src.p("again"), pattern(1, 3 << 20)).unwrap();
    fs::write(src.p("new"), pattern(2, 1 << 20)).unwrap();
    fs::rename(src.p("docs/deep"), src.p("moved")).unwrap();
    fs::remove_file(src.p("sym")).unwrap();
    snapshot_create(&src.mnt, "two");
    let c2 = copy(&src, &spec, &creds);
    let put = n(&c2, "bucket", "chunks_put");
    assert!(
        (16..24).contains(&put),
        "16 new chunks (1 MiB) expected: {c2}"
    );
    assert_eq!(n(&c2, "bucket", "since"), n(&c1, "bucket", "upto"));
    // Nothing new: nothing uploaded, no stream added.
    let c3 = copy(&src, &spec, &creds);
    assert_eq!(n(&c3, "bucket", "chunks_put"), 0, "{c3}");
    assert_eq!(n(&c3, "bucket", "streams"), 2, "{c3}");
    // The source holds its history for the bucket mirror.
    let st = cairn_json(&[
        os("mirror"),
        os("status"),
        src.mnt.as_os_str(),
        os("--json"),
    ]);
    let holds = field_arr(&st, "mirrors");
    assert_eq!(holds.len(), 1, "{st:?}");
    assert!(!format!("{st:?}").contains(TEST_SECRET));

    // A new pool from the bucket: same TID, tree and snapshots.
    let mut dst = Fs::create();
    dst.mkfs(&["--mirror"]);
    let r = restore(&spec, &dst.pool, &creds);
    assert_eq!(r["streams"], 2, "{r}");
    assert_eq!(tid(&dst.pool), tid(&src.mnt));
    dst.mount();
    assert_tree_at(&dst.mnt, &capture(&src.mnt).unwrap(), "restored pool");
    assert_same_snapshot(&src, &dst, "one");
    assert_same_snapshot(&src, &dst, "two");
    dst.unmount();

    // Later changes reach the restored pool through the bucket.
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(src.p("docs/a.txt"))
        .unwrap();
    f.write_all(b"appended\n").unwrap();
    drop(f);
    snapshot_create(&src.mnt, "three");
    copy(&src, &spec, &creds);
    let r = restore(&spec, &dst.pool, &creds);
    assert_eq!(r["streams"], 1, "only the new stream: {r}");
    assert_eq!(tid(&dst.pool), tid(&src.mnt));
    dst.mount();
    assert_tree_at(&dst.mnt, &capture(&src.mnt).unwrap(), "after the update");
    assert_same_snapshot(&src, &dst, "three");
    dst.finish();
    src.finish();
}

#[test]
fn a_source_pruned_past_the_chain_needs_resync_which_starts_a_new_chain() {
    let s3 = S3Server::start();
    let src = Fs::new();
    let creds = src.dir.join("s3.creds");
    write_credentials(&creds);
    let spec = s3.spec("p");
    mirror_first_tree(&src);
    snapshot_create(&src.mnt, "base");
    copy(&src, &spec, &creds);
    // The chain then ends past the snapshot, at changes prune will drop.
    fs::write(src.p("late"), pattern(5, 200_000)).unwrap();
    fs::remove_file(src.p("hard")).unwrap();
    cairn_ok(&[os("sync"), src.mnt.as_os_str()]);
    copy(&src, &spec, &creds);
    fs::write(src.p("late"), pattern(7, 100_000)).unwrap();
    cairn_ok(&[os("sync"), src.mnt.as_os_str()]);
    // Give up the bucket's hold and prune every unsnapshotted version.
    let st = cairn_json(&[
        os("mirror"),
        os("status"),
        src.mnt.as_os_str(),
        os("--json"),
    ]);
    let id = field_str(&field_arr(&st, "mirrors")[0], "mirror").to_string();
    cairn_ok(&[os("mirror"), os("release"), src.mnt.as_os_str(), os(&id)]);
    fs::write(src.p("later"), pattern(6, 100_000)).unwrap();
    cairn_ok(&[os("sync"), src.mnt.as_os_str()]);
    cairn_ok(&[
        os("prune"),
        src.mnt.as_os_str(),
        os("--keep-history"),
        os("0s"),
    ]);
    let args = [os("mirror"), os("copy"), src.mnt.as_os_str(), os(&spec)];
    refused(&args, &creds, "--resync");
    let mut a = args.to_vec();
    a.push(os("--resync"));
    let c = ok_json(&a, &creds);
    assert_eq!(c["bucket"]["resync"], true, "{c}");
    assert_eq!(n(&c, "bucket", "streams"), 1, "{c}");
    assert_eq!(n(&c, "bucket", "streams_deleted"), 2, "{c}");
    let streams: Vec<_> = (s3.objects("p").into_iter())
        .filter(|o| o.starts_with("stream-"))
        .collect();
    assert_eq!(streams.len(), 1, "{streams:?}");
    let mut dst = Fs::create();
    dst.mkfs(&["--mirror"]);
    restore(&spec, &dst.pool, &creds);
    dst.mount();
    assert_tree_at(&dst.mnt, &capture(&src.mnt).unwrap(), "after a resync");
    assert_same_snapshot(&src, &dst, "base");
    dst.finish();
    src.finish();
}

#[test]
fn bad_buckets_objects_targets_and_credentials_are_refused_and_change_nothing() {
    let mut s3 = S3Server::start();
    let src = Fs::new();
    let creds = src.dir.join("s3.creds");
    write_credentials(&creds);
    mirror_first_tree(&src);
    let spec = s3.spec("m");
    copy(&src, &spec, &creds);
    let pool = Fs::create();
    let mut dst = Fs::create();
    dst.mkfs(&["--mirror"]);
    let restore_args = |p: &Path| {
        [os("mirror"), os("restore"), os(&spec), p.as_os_str()].map(|s| s.to_os_string())
    };
    let r = |p: &Path, want: &str| {
        let a = restore_args(p);
        let a: Vec<&OsStr> = a.iter().map(|s| s.as_os_str()).collect();
        refused(&a, &creds, want)
    };
    // Not a pool, a normal pool, an empty prefix.
    r(&pool.dir.join("nothing"), "mkfs");
    let normal = Fs::create();
    normal.mkfs(&[]);
    r(&normal.pool, "not a mirror pool");
    let empty = s3.spec("none");
    refused(
        &[
            os("mirror"),
            os("restore"),
            os(&empty),
            dst.pool.as_os_str(),
        ],
        &creds,
        "no manifest",
    );
    // A prefix that holds something else is not taken for a mirror.
    let other = s3.bucket_dir().join("other");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("segment-0001"), b"not ours").unwrap();
    refused(
        &[
            os("mirror"),
            os("copy"),
            src.mnt.as_os_str(),
            os(&s3.spec("other")),
        ],
        &creds,
        "not a Cairn mirror",
    );
    // Another pool into this pool's bucket.
    let src2 = Fs::new();
    fs::write(src2.p("x"), b"x").unwrap();
    refused(
        &[os("mirror"), os("copy"), src2.mnt.as_os_str(), os(&spec)],
        &creds,
        "holds a mirror of pool",
    );
    // A world-readable credentials file.
    let loose = src.dir.join("loose.creds");
    write_credentials(&loose);
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&loose, fs::Permissions::from_mode(0o644)).unwrap();
    let a = restore_args(&dst.pool);
    let a: Vec<&OsStr> = a.iter().map(|s| s.as_os_str()).collect();
    refused(&a, &loose, "chmod 600");
    // A damaged stream object, then a damaged chunk object: refused, and
    // the mirror pool stays where it was (fresh).
    let objs = s3.objects("m");
    let find = |p: &str| objs.iter().find(|o| o.starts_with(p)).cloned();
    let stream = find("stream-").unwrap_or_else(|| panic!("no stream object: {objs:?}"));
    let chunk = find("chunk-").unwrap_or_else(|| panic!("no chunk object: {objs:?}"));
    let fresh = tid(&dst.pool);
    for (obj, want) in [(&stream, "hash differ"), (&chunk, "checksum mismatch")] {
        let p = s3.bucket_dir().join("m").join(obj);
        let good = fs::read(&p).unwrap();
        let mut bad = good.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0x10;
        fs::write(&p, &bad).unwrap();
        r(&dst.pool, want);
        assert_eq!(tid(&dst.pool), fresh, "a refused restore changed the pool");
        fs::write(&p, &good).unwrap();
    }
    // The store down: a clear error within the client's time limit.
    s3.stop();
    let t = std::time::Instant::now();
    r(&dst.pool, "bucket");
    assert!(t.elapsed().as_secs() < 60, "took {:?}", t.elapsed());
    s3.resume();
    restore(&spec, &dst.pool, &creds);
    assert_eq!(tid(&dst.pool), tid(&src.mnt));
    dst.mount();
    assert_tree_at(&dst.mnt, &capture(&src.mnt).unwrap(), "restored");
    dst.finish();
    src2.finish();
    src.finish();
}
