//! Encryption at rest in a bucket (issue 53): an encrypted pool whose cold
//! segments are demoted to an s3 tier (s3s-fs on a loopback port, started
//! here) leaves no byte of its files in any object of the bucket, and
//! reads them back exact with the key; the same steps on a pool without
//! encryption (the negative control) find them there.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]
#![allow(
    clippy::cast_possible_truncation,
    reason = "the shared harness's seeds and sizes: small by construction"
)]

mod common;

use cairn_objstore::testing::S3Server;
use common::canary::{files_under, hits_in, windows};
use common::s3::configure_s3_tier;
use common::*;
use std::os::unix::fs::PermissionsExt;

const DATA: (u64, usize) = (41, 8 << 20);

/// A mounted pool of one 64 MiB ssd device plus an s3 tier, encrypted
/// with a key file when `encrypt` (`configure_s3_tier`: a mover pass
/// demotes every sealed segment).
fn bucket_pool(s3: &S3Server, encrypt: bool) -> Fs {
    let mut fs = Fs::create();
    let dev = format!("ssd:{}:64M", fs.dev("ssd"));
    let mut args = vec!["--device".to_string(), dev];
    if encrypt {
        let key = fs.dir.join("key");
        std::fs::write(&key, pattern(seed() ^ 77, 32)).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let key = key.display().to_string();
        args.extend(["--encrypt".into(), "--key-file".into(), key.clone()]);
        fs.mount_args.extend(["--key-file".into(), key]);
    }
    fs.mkfs(&args.iter().map(String::as_str).collect::<Vec<_>>());
    configure_s3_tier(&fs, &[("read_cache_mib", "0")]);
    fs.mount();
    let mnt = fs.mnt.to_str().unwrap().to_string();
    cairn_ok(&["device", "add", &mnt, &s3.spec("pool")]);
    fs
}

/// Writes the canary file and a filler, commits, and demotes.
fn write_and_demote(fs: &Fs) {
    std::fs::write(fs.p("canary"), pattern(DATA.0, DATA.1)).unwrap();
    std::fs::write(fs.p("filler"), pattern(DATA.0 + 1, 5 << 20)).unwrap();
    let mnt = fs.mnt.to_str().unwrap();
    cairn_ok(&["sync", mnt]);
    let out = cairn_ok(&["tier", "migrate", mnt, "--now", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["demoted"].as_u64().unwrap() > 0, "nothing demoted: {v}");
}

/// (object file, hits) for every object of the bucket holding a window
/// of the canary file, and how many objects there are.
fn bucket_hits(s3: &S3Server) -> (Vec<(String, usize)>, usize) {
    let wins = windows(&pattern(DATA.0, DATA.1));
    let objects = files_under(&s3.bucket_dir());
    let hits = (objects.iter())
        .map(|f| (f.display().to_string(), hits_in(f, &wins)))
        .filter(|(_, n)| *n > 0)
        .collect();
    (hits, objects.len())
}

#[test]
fn an_encrypted_pool_leaves_no_plaintext_in_its_bucket() {
    let s3 = S3Server::start();
    let mut fs = bucket_pool(&s3, true);
    write_and_demote(&fs);
    // A mirror in the same bucket: its stream and chunk objects are sealed.
    let creds = fs.dir.join("s3.cred");
    cairn_objstore::testing::write_credentials(&creds);
    let creds = creds.display().to_string();
    let spec = s3.spec("mirror");
    let mnt = fs.mnt.display().to_string();
    cairn_ok(&["mirror", "copy", &mnt, &spec, "--credentials-file", &creds]);
    let (hits, objects) = bucket_hits(&s3);
    assert!(objects > 0, "no object in the bucket");
    assert!(hits.is_empty(), "plaintext in the bucket: {hits:?}");
    // Read back from the bucket after a remount (no cache holds it).
    fs.remount();
    assert_bytes_eq(
        &std::fs::read(fs.p("canary")).unwrap(),
        &pattern(DATA.0, DATA.1),
        "canary read back from the bucket",
    );
    fs.unmount();
    let key = fs.dir.join("key").display().to_string();
    let pool = fs.pool.display().to_string();
    let out = cairn(&["check", &pool, "--key-file", &key]);
    assert!(out.status.success(), "check: {}", describe(&out));
    restored_without_the_key(&spec, &creds, &key);
}

/// The bucket's mirror restored into a mirror pool without the key (no
/// terminal, no key file), then promoted and mounted with it: exact.
fn restored_without_the_key(spec: &str, creds: &str, key: &str) {
    let mut dst = Fs::create();
    dst.mkfs(&["--mirror"]);
    let pool = dst.pool.display().to_string();
    let out = cairn_no_tty(&[
        "mirror",
        "restore",
        spec,
        &pool,
        "--credentials-file",
        creds,
    ]);
    assert!(out.status.success(), "restore: {}", describe(&out));
    let out = cairn_no_tty(&["--key-file", key, "mirror", "promote", &pool]);
    assert!(out.status.success(), "promote: {}", describe(&out));
    dst.mount_args.extend(["--key-file".into(), key.into()]);
    dst.mount();
    assert_bytes_eq(
        &std::fs::read(dst.p("canary")).unwrap(),
        &pattern(DATA.0, DATA.1),
        "canary restored from the bucket's mirror",
    );
    dst.unmount();
}

/// The negative control: the same steps without encryption find the
/// canary's bytes in the bucket's objects.
#[test]
fn the_scan_finds_the_data_in_the_bucket_of_a_plain_pool() {
    let s3 = S3Server::start();
    let fs = bucket_pool(&s3, false);
    write_and_demote(&fs);
    let (hits, _) = bucket_hits(&s3);
    let total: usize = hits.iter().map(|(_, n)| n).sum();
    assert!(
        total > (1 << 20) / 16,
        "the canary was not found in the bucket: {hits:?}"
    );
    fs.finish();
}
