//! Errors and time limits of an `s3` tier device against a real S3 server
//! (s3s-fs on loopback): a store that hangs costs a read at most one
//! `s3_timeout_secs`, even when the read waited for a read-ahead window
//! whose GET hung, and the error says what happened and where (timed out
//! or unreachable, with the endpoint); a store nobody listens for says
//! "connection refused".

use cairn_devices::objdev::{create_object, open_object};
use cairn_devices::{DeviceSpec, ObjectOptions};
use cairn_objstore::testing::{write_credentials, S3Server};
use cairn_objstore::ClientOptions;
use std::time::{Duration, Instant};

const SEG: u64 = 1 << 20;
const LIMIT: Duration = Duration::from_secs(2);

fn options(creds: &std::path::Path) -> ObjectOptions {
    ObjectOptions {
        client: ClientOptions {
            timeout: LIMIT,
            max_retries: 1,
        },
        credentials_file: Some(creds.to_path_buf()),
    }
}

/// A read that waits for a read-ahead window of a hung store, then would
/// fetch on its own: one time limit in all, and an error naming the
/// endpoint and that the store timed out or is unreachable.
#[test]
fn a_read_from_a_hung_store_takes_one_time_limit_and_says_why() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("creds");
    write_credentials(&creds);
    let spec: DeviceSpec = s3.spec("hung").parse().unwrap();
    let dev = create_object(&spec, 1, [7; 16], SEG, &options(&creds)).unwrap();
    let at = dev.slot_offset(0);
    dev.write_at(&vec![5u8; SEG as usize], at).unwrap();
    dev.sync().unwrap();
    s3.freeze();
    // A read-ahead window over the whole object, its GET hanging.
    dev.will_need(at, SEG);
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let mut buf = vec![0u8; 512 << 10];
    let e = dev.read_at(&mut buf, at + 4096).unwrap_err().to_string();
    let took = t.elapsed();
    s3.thaw();
    assert!(
        took < LIMIT + LIMIT / 2,
        "the read took {took:?} with a {LIMIT:?} limit: {e}"
    );
    assert!(e.contains(&s3.endpoint()), "{e}");
    assert!(e.contains("timed out") || e.contains("unreachable"), "{e}");
}

/// A store whose endpoint refuses connections: the error says so, with
/// the endpoint, not only "I/O error".
#[test]
fn a_refused_connection_is_named() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("creds");
    write_credentials(&creds);
    let spec: DeviceSpec = s3.spec("refused").parse().unwrap();
    let dev = create_object(&spec, 1, [7; 16], SEG, &options(&creds)).unwrap();
    let path = dev.path.clone();
    let header = dev.header.clone();
    drop(dev);
    let endpoint = s3.endpoint();
    drop(s3);
    let e = open_object(&path, [7; 16], SEG, None, &options(&creds))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("connection refused"), "{e}");
    assert!(e.contains(&endpoint), "{e}");
    // With the pool's record standing in, the device opens offline and a
    // read says the same.
    let dev = open_object(&path, [7; 16], SEG, Some(header), &options(&creds)).unwrap();
    let mut buf = vec![0u8; 4096];
    let e = dev
        .read_at(&mut buf, dev.slot_offset(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&endpoint), "{e}");
    assert!(e.contains("unreachable") || e.contains("refused"), "{e}");
    assert!(!e.starts_with("I/O error on device"), "{e}");
}
