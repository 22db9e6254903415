//! Fuzz tests (issue 15) of the control protocol as read from a socket:
//! `read_line` on random streams (a peer that never sends a newline
//! included), and `decode_request` / `decode_reply` on random and damaged
//! JSON lines. Nothing panics; a line is never buffered past its bound;
//! a decode gives a typed error or a message that encodes back the same;
//! every valid message round-trips through a line.

use super::*;
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations, prefixes};
use std::io::{BufReader, Cursor};

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9-]{0,20}", any::<String>()]
}

fn arb_request() -> impl Strategy<Value = Request> {
    let opt32 = prop::option::of(any::<u32>());
    prop_oneof![
        Just(Request::Sync),
        Just(Request::Info),
        Just(Request::Restart),
        (arb_name(), any::<bool>(), any::<bool>())
            .prop_map(|(name, auto, wait)| Request::SnapshotCreate { name, auto, wait }),
        Just(Request::SnapshotList),
        arb_name().prop_map(|name| Request::SnapshotDelete { name }),
        arb_name().prop_map(|name| Request::SnapshotVerify { name }),
        any::<u64>().prop_map(|ino| Request::History { ino }),
        (prop::collection::vec(any::<u8>(), 0..64), any::<bool>())
            .prop_map(|(path, inode)| Request::HistoryPath { path, inode }),
        (
            any::<bool>(),
            prop::option::of(any::<u64>()),
            opt32.clone(),
            opt32.clone(),
            opt32
        )
            .prop_map(|(dry_run, r, d, w, m)| Request::Prune {
                dry_run,
                retention_secs: r,
                keep_daily: d,
                keep_weekly: w,
                keep_monthly: m,
            }),
        (any::<u32>(), any::<bool>()).prop_map(|(max_live_pct, files)| Request::Reblock {
            max_live_pct,
            files
        }),
        any::<u32>().prop_map(|max_live_pct| Request::Gc { max_live_pct }),
        Just(Request::Scrub),
        arb_name().prop_map(|spec| Request::DeviceAdd { spec }),
        arb_name().prop_map(|device| Request::DeviceRemove { device }),
        (arb_name(), arb_name()).prop_map(|(device, spec)| Request::DeviceReplace { device, spec }),
        arb_name().prop_map(|policy| Request::RedundancySet { policy }),
        Just(Request::RedundancyShow),
        (any::<u64>(), arb_name())
            .prop_map(|(ino, policy)| Request::RedundancySetPath { ino, policy }),
        Just(Request::Resilver),
        Just(Request::Migrate),
        Just(Request::TierStatus),
    ]
}

fn arb_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(Into::into),
        any::<u64>().prop_map(Into::into),
        any::<i64>().prop_map(Into::into),
        arb_name().prop_map(Into::into),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Into::into),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        any::<(u64, u64)>().prop_map(|(d, t)| Reply::Progress(d, t)),
        arb_value().prop_map(Reply::Ok),
        arb_name().prop_map(Reply::Err),
    ]
}

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// The largest single allocation a decode may make: its strings and
/// arrays, or one fixed-size piece (a B-tree node of an object, an error
/// message listing the request kinds).
fn alloc_bound(len: usize) -> usize {
    4 * len + 2048
}

fn check_line(b: &[u8]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| decode_request(b));
    prop_assert!(used.largest <= alloc_bound(b.len()), "{used:?}");
    match r {
        Ok(q) => prop_assert_eq!(json(&decode_request(&json(&q)).unwrap()), json(&q)),
        Err(e) => prop_assert!(matches!(e, ProtocolError::Malformed(_)), "{e}"),
    }
    let (r, used) = metered(|| decode_reply(b));
    prop_assert!(used.largest <= alloc_bound(b.len()), "{used:?}");
    match r {
        Ok(a) => prop_assert_eq!(json(&decode_reply(&json(&a)).unwrap()), json(&a)),
        Err(e) => prop_assert!(matches!(e, ProtocolError::Malformed(_)), "{e}"),
    }
    Ok(())
}

/// Reads every line of `stream` with the bound `max`.
fn lines(stream: &[u8], max: usize) -> Result<Vec<Vec<u8>>, TestCaseError> {
    let mut r = BufReader::with_capacity(64, Cursor::new(stream));
    let mut out = Vec::new();
    loop {
        let (l, used) = metered(|| read_line(&mut r, max));
        prop_assert!(used.largest <= 2 * (max + 1) + 64, "{used:?}");
        match l {
            Ok(Some(l)) => {
                prop_assert!(l.len() <= max && !l.contains(&b'\n'));
                out.push(l);
            }
            Ok(None) => return Ok(out),
            Err(ProtocolError::TooLong(m)) => {
                prop_assert_eq!(m, max);
                return Ok(out);
            }
            Err(e) => prop_assert!(false, "{e}"),
        }
    }
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn fuzz_control_line_random_bytes(b in bytes(200)) {
        check_line(&b)?;
    }

    #[test]
    fn fuzz_control_request_mutated(q in arb_request(), m in mutations()) {
        check_line(&apply(&json(&q), &m))?;
    }

    #[test]
    fn fuzz_control_reply_mutated(a in arb_reply(), m in mutations()) {
        check_line(&apply(&json(&a), &m))?;
    }

    #[test]
    fn fuzz_control_read_line_random_stream(b in bytes(600), max in 0usize..100) {
        lines(&b, max)?;
    }

    #[test]
    fn fuzz_control_messages_round_trip(qs in prop::collection::vec(arb_request(), 1..4), a in arb_reply()) {
        let mut stream = Vec::new();
        for q in &qs {
            stream.extend_from_slice(&json(q));
            stream.push(b'\n');
        }
        stream.extend_from_slice(&json(&a));
        let got = lines(&stream, MAX_REQUEST_LINE)?;
        prop_assert_eq!(got.len(), qs.len() + 1);
        for (l, q) in got.iter().zip(&qs) {
            prop_assert_eq!(json(&decode_request(l).unwrap()), json(q));
        }
        prop_assert_eq!(json(&decode_reply(&got[qs.len()]).unwrap()), json(&a));
        let q = json(&qs[0]);
        for p in prefixes(&q) {
            prop_assert!(decode_request(p).is_err());
        }
    }
}

#[test]
fn fuzz_regression_control_line_without_newline() {
    // A peer that sends 1 GiB without a newline: the daemon's read_line
    // into a String buffered all of it; now the read stops past the bound.
    let endless = std::io::repeat(b'{').take(1 << 30);
    let mut r = BufReader::new(endless);
    let (res, used) = metered(|| read_line(&mut r, MAX_REQUEST_LINE));
    assert!(matches!(res, Err(ProtocolError::TooLong(_))));
    assert!(
        used.largest <= 2 * MAX_REQUEST_LINE + (16 << 10),
        "{used:?}"
    );
}

#[test]
fn fuzz_regression_control_reply_float_round_trips() {
    // Found by fuzz_control_reply_mutated: serde_json's fast float parser
    // read 1.6834289071541465e22 back as ...463e22, so a reply did not
    // decode to what was sent; parsing is now exact (float_roundtrip).
    let line = br#"{"ok":{"_aa___":{"a":1.6834289071541465e22}}}"#;
    let a = decode_reply(line).unwrap();
    assert_eq!(json(&decode_reply(&json(&a)).unwrap()), json(&a));
    let Reply::Ok(v) = a else {
        panic!("not an ok reply")
    };
    assert_eq!(v["_aa___"]["a"].as_f64(), Some(1.6834289071541465e22));
}
