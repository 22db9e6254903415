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
//! clear error and change nothing; the secret never reaches an output; a
//! copy killed (SIGKILL) while it uploads loses nothing: the manifest
//! still names the chain before it, and the next copy uploads only the
//! chunks the killed one had not.

mod common;

use cairn_objstore::testing::{write_credentials, S3Server, TEST_SECRET};
use common::hist::*;
use common::*;
use serde_json::Value;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// How many objects under `prefix` are chunk objects.
fn chunk_objects(s3: &S3Server, prefix: &str) -> u64 {
    let objs = s3.objects(prefix);
    objs.iter().filter(|o| o.starts_with("chunk-")).count() as u64
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

/// `cairn mirror copy SRC s3:...` killed (SIGKILL) while it uploads the
/// chunk objects of an increment: the manifest is the one the copy before
/// wrote, so a restore gives that copy's state (its snapshot, not the new
/// one) and the source still holds its history from there; the next copy
/// succeeds, uploading only the chunks the killed one had not, and a
/// restore then brings the pool up to date with every snapshot.
#[test]
fn a_copy_killed_while_it_uploads_loses_nothing_and_the_next_one_completes_it() {
    let s3 = S3Server::start();
    let src = Fs::new();
    let creds = src.dir.join("s3.creds");
    write_credentials(&creds);
    let prefix = "killed";
    let spec = s3.spec(prefix);
    mirror_first_tree(&src);
    snapshot_create(&src.mnt, "one");
    let c1 = copy(&src, &spec, &creds);
    let first_upto = n(&c1, "bucket", "upto");
    let first_tree = capture(&src.mnt).unwrap();
    let before = chunk_objects(&s3, prefix);
    let manifest = s3.bucket_dir().join(prefix).join("manifest");
    let first_manifest = fs::read(&manifest).unwrap();

    // 64 MiB of new incompressible data: 1,024 chunks of 64 KiB, whose
    // upload takes long enough to be killed in the middle.
    const NEW: u64 = 1024;
    fs::create_dir(src.p("new")).unwrap();
    for i in 0..4 {
        fs::write(src.p(&format!("new/f{i}")), pattern(100 + i, 16 << 20)).unwrap();
    }
    snapshot_create(&src.mnt, "two");
    // Its temporary files (the stream, which SIGKILL leaves behind) in the
    // source's test directory.
    let tmp = src.dir.join("tmp");
    fs::create_dir(&tmp).unwrap();
    let err = src.dir.join("killed-copy.err");
    let mut child = Command::new(CAIRN)
        .args([os("mirror"), os("copy"), src.mnt.as_os_str(), os(&spec)])
        .args([os("--credentials-file"), creds.as_os_str()])
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()
        .expect("spawn cairn mirror copy");
    // The chunk objects go up before the stream object and the manifest:
    // killed once a few of the new ones are in the bucket.
    const KILL_AT: u64 = 8;
    let t0 = Instant::now();
    let mut seen = 0;
    while seen < KILL_AT {
        if let Some(st) = child.try_wait().unwrap() {
            panic!(
                "the copy ended ({st}) after {:?} with {seen} of the {NEW} new chunk objects seen, before it could be killed in the middle of its upload (too little data?)\n{}",
                t0.elapsed(),
                fs::read_to_string(&err).unwrap_or_default()
            );
        }
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the copy uploaded {seen} new chunk objects in 120 s");
        }
        std::thread::sleep(Duration::from_millis(5));
        seen = chunk_objects(&s3, prefix) - before;
    }
    child.kill().unwrap();
    let st = child.wait().unwrap();
    let killed_after = t0.elapsed();
    let said = fs::read_to_string(&err).unwrap();
    assert!(
        !said.contains(TEST_SECRET),
        "the secret was printed: {said}"
    );
    assert_eq!(
        st.signal(),
        Some(libc::SIGKILL),
        "the copy ended ({st}) before it was killed\n{said}"
    );
    let held = chunk_objects(&s3, prefix) - before;
    eprintln!("killed after {killed_after:?}, {held} of the {NEW} new chunk objects uploaded");
    assert!(
        held < NEW,
        "the copy was killed after it had uploaded every new chunk ({held}): kill it earlier"
    );
    assert_eq!(
        fs::read(&manifest).unwrap(),
        first_manifest,
        "the killed copy changed the manifest"
    );
    // The source still holds its history for the bucket from the first
    // copy's end.
    let status = cairn_json(&[
        os("mirror"),
        os("status"),
        src.mnt.as_os_str(),
        os("--json"),
    ]);
    let holds = field_arr(&status, "mirrors");
    assert_eq!(holds.len(), 1, "{status:?}");
    assert_eq!(field_u64(&holds[0], "tid"), first_upto, "{status:?}");

    // A new pool from the bucket is the first copy's state.
    let mut dst = Fs::create();
    dst.mkfs(&["--mirror"]);
    let r = restore(&spec, &dst.pool, &creds);
    assert_eq!(r["streams"], 1, "{r}");
    assert_eq!(tid(&dst.pool), first_upto);
    dst.mount();
    assert_tree_at(&dst.mnt, &first_tree, "restored after the killed copy");
    assert_same_snapshot(&src, &dst, "one");
    let names: Vec<String> = (snapshot_list(&dst.mnt).iter())
        .map(|s| field_str(s, "name").to_string())
        .collect();
    assert_eq!(names, ["one"], "snapshots restored after the killed copy");
    dst.unmount();

    // The next copy completes the increment, uploading exactly the chunks
    // the bucket lacks (PUTs in flight at the kill may have ended since).
    let present = chunk_objects(&s3, prefix) - before;
    let t1 = Instant::now();
    let c2 = copy(&src, &spec, &creds);
    let took = t1.elapsed();
    let put = n(&c2, "bucket", "chunks_put");
    let total = chunk_objects(&s3, prefix) - before;
    eprintln!("the next copy uploaded {put} of the {total} new chunk objects ({present} there) in {took:?}");
    assert!(
        total >= NEW,
        "{total} new chunk objects in the bucket: {c2}"
    );
    assert!(
        put < total,
        "the copy after the killed one uploaded every new chunk: {c2}"
    );
    assert_eq!(
        put + present,
        total,
        "{put} uploaded, and the bucket held {present} of the {total}: {c2}"
    );
    assert_eq!(n(&c2, "bucket", "since"), first_upto, "{c2}");
    assert_eq!(n(&c2, "bucket", "streams"), 2, "{c2}");
    let r = restore(&spec, &dst.pool, &creds);
    assert_eq!(r["streams"], 1, "only the new stream: {r}");
    assert!(r["chunks"].as_u64().is_some_and(|c| c >= NEW), "{r}");
    assert_eq!(tid(&dst.pool), tid(&src.mnt));
    dst.mount();
    assert_tree_at(&dst.mnt, &capture(&src.mnt).unwrap(), "after the next copy");
    assert_same_snapshot(&src, &dst, "one");
    assert_same_snapshot(&src, &dst, "two");
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
