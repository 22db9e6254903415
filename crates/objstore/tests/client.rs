//! The client against a real S3 server (s3s-fs on a loopback port): every
//! call, its counters, verified uploads, and a server that is down (an
//! error within the time limit, the state unreachable) and back.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use cairn_objstore::testing::{S3Server, TEST_KEY_ID, TEST_SECRET};
use cairn_objstore::{ClientOptions, Credentials, Locator, ObjError, ObjectClient};
use std::time::{Duration, Instant};

fn client(s: &S3Server, timeout: Duration) -> ObjectClient {
    let loc = Locator::parse(&s.spec("p/q")).unwrap();
    let creds = Credentials {
        key_id: TEST_KEY_ID.into(),
        secret: TEST_SECRET.into(),
        token: None,
    };
    ObjectClient::new(
        &loc,
        &creds,
        ClientOptions {
            timeout,
            max_retries: 3,
        },
    )
    .unwrap()
}

#[test]
fn put_get_list_delete_and_counters() {
    let s = S3Server::start();
    let c = client(&s, Duration::from_secs(5));
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let key = c.locator().key("obj-1");
    let info = c.put_verified(&key, data.clone().into()).unwrap();
    assert_eq!(info.size, data.len() as u64);
    let got = c.get_range(&key, 4096..8192).unwrap();
    assert_eq!(&got[..], &data[4096..8192]);
    assert_eq!(c.head(&c.locator().key("nope")).unwrap(), None);
    c.put_verified(&c.locator().key("obj-2"), vec![1u8; 10].into())
        .unwrap();
    let mut names: Vec<String> = c.list("obj-").unwrap().into_iter().map(|x| x.0).collect();
    names.sort();
    assert_eq!(names, ["obj-1", "obj-2"]);
    c.delete(&key).unwrap();
    c.delete(&key).unwrap();
    assert!(matches!(
        c.get_range(&key, 0..10),
        Err(ObjError::NotFound { .. })
    ));
    let st = c.stats.snapshot();
    assert_eq!((st.puts, st.gets, st.lists, st.deletes), (2, 2, 1, 2));
    assert_eq!(st.heads, 3, "two verifying HEADs and one asked for");
    assert_eq!(st.state, "ok");
    assert_eq!(st.bytes_out, data.len() as u64 + 10);
}

#[test]
fn a_stopped_server_is_an_error_within_the_time_limit_then_works_again() {
    let mut s = S3Server::start();
    let c = client(&s, Duration::from_secs(2));
    let key = c.locator().key("k");
    c.put_verified(&key, vec![9u8; 4096].into()).unwrap();
    s.stop();
    let t = Instant::now();
    let e = c.get_range(&key, 0..4096).unwrap_err();
    let took = t.elapsed();
    assert!(e.is_unreachable(), "{e}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert_eq!(c.stats.snapshot().state, "unreachable");
    s.resume();
    assert_eq!(&c.get_range(&key, 0..4).unwrap()[..], &[9u8; 4]);
    assert_eq!(c.stats.snapshot().state, "ok");
}

#[test]
fn wrong_credentials_are_refused_not_unreachable() {
    let s = S3Server::start();
    let loc = Locator::parse(&s.spec("x")).unwrap();
    let creds = Credentials {
        key_id: TEST_KEY_ID.into(),
        secret: "wrong".into(),
        token: None,
    };
    let c = ObjectClient::new(&loc, &creds, ClientOptions::default()).unwrap();
    let e = c.put_verified(&loc.key("k"), vec![1u8].into()).unwrap_err();
    assert!(!e.to_string().contains("wrong"), "{e}");
}
