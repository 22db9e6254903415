//! Fuzz tests (issue 15) of the intent log's record decoding: `parse_head`
//! on random and damaged headers, and `scan` (through `LogFile::open`) on
//! runs of valid records that were damaged (checksums redone half of the
//! time). Neither panics; a header never gives a payload length the log
//! cannot hold; a scan returns the undamaged records before the first bad
//! one, each with the payload that was written, or says the log is
//! damaged when valid records of the run follow a bad one.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]

use super::*;
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations};
use std::os::unix::fs::FileExt;

const UUID: [u8; 16] = [5; 16];
const BASE: u64 = 9;
/// The bytes each scan case writes at the log's start (the rest stays
/// zero).
const AREA: usize = 16 << 10;

fn arb_head() -> impl Strategy<Value = RecordHead> {
    (any::<[u8; 16]>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(uuid, b, s, n)| {
        RecordHead {
            uuid,
            base_tid: b,
            seq: s,
            next_ino: n,
        }
    })
}

/// One record as `append` writes it.
fn record(head: &RecordHead, payload: &[u8]) -> Vec<u8> {
    let mut rec = encode_head(head, payload.len(), VERSION).to_vec();
    let sum = checksum(&rec, payload);
    rec[56..60].copy_from_slice(&sum.to_le_bytes());
    rec.extend_from_slice(payload);
    rec
}

/// Redoes the checksum of each record the headers' lengths lead to.
fn reseal(b: &mut [u8]) {
    let mut pos = 0;
    while pos + HEADER_LEN <= b.len() {
        let len = u32::from_le_bytes(b[pos + 12..pos + 16].try_into().unwrap()) as usize;
        let Some(payload) = b.get(pos + HEADER_LEN..pos + HEADER_LEN + len) else {
            return;
        };
        let sum = checksum(&b[pos..pos + HEADER_LEN], payload);
        b[pos + 56..pos + 60].copy_from_slice(&sum.to_le_bytes());
        pos += HEADER_LEN + len;
    }
}

fn check_head(b: &[u8; HEADER_LEN]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| parse_head(b));
    prop_assert_eq!(used.total, 0);
    match r {
        Ok((h, len, version)) => {
            prop_assert!(len as u64 <= MAX_LOG_SIZE / 2 - HEADER_LEN as u64);
            let again = encode_head(&h, len, version);
            prop_assert_eq!(&again[..10], &b[..10]);
            prop_assert_eq!(&again[12..56], &b[12..56]);
        }
        Err(e) => prop_assert!(matches!(e, LogError::NoRecord(_)), "{e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(50000))]

    #[test]
    fn fuzz_intent_log_head_random_bytes(b in any::<[u8; HEADER_LEN]>()) {
        check_head(&b)?;
    }

    #[test]
    fn fuzz_intent_log_head_mutated(h in arb_head(), len in any::<u32>(), m in mutations()) {
        let mut b = apply(&encode_head(&h, len as usize, VERSION), &m);
        b.resize(HEADER_LEN, 0);
        check_head(&b.try_into().unwrap())?;
    }

    #[test]
    fn fuzz_intent_log_head_round_trips(h in arb_head(), len in 0..=LOG_SIZE - HEADER_LEN as u64) {
        let b = encode_head(&h, len as usize, VERSION);
        prop_assert_eq!(parse_head(&b).unwrap(), (h, len as usize, VERSION));
    }
}

/// One log file for every scan case (made once: 32 MiB, the smallest, since
/// every open searches a region for records after the run it reads).
fn shared_log() -> &'static Path {
    static LOG: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, p) = LOG.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        drop(LogFile::open(&p, UUID, BASE, &cairn_devices::HostStorage, LEGACY_LOG_SIZE).unwrap());
        (d, p)
    });
    p
}

/// Writes `b` at the start of the log at `p` and opens it: its records,
/// or the damage it found.
fn scan_of(p: &Path, b: &[u8]) -> Result<Vec<Record>, Box<Damage>> {
    let mut area = b.to_vec();
    area.resize(AREA, 0);
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(&area, 0).unwrap();
    match LogFile::open(p, UUID, BASE, &cairn_devices::HostStorage, LEGACY_LOG_SIZE) {
        Ok((_, recs)) => Ok(recs),
        Err(LogError::Damaged(d)) => Err(d),
        Err(e) => panic!("{e}"),
    }
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn fuzz_intent_log_scan_mutated(
        payloads in prop::collection::vec(bytes(300), 1..6),
        m in mutations(),
        seal in any::<bool>(),
    ) {
        let p = shared_log();
        let mut run = Vec::new();
        for (seq, pl) in payloads.iter().enumerate() {
            let h = RecordHead { uuid: UUID, base_tid: BASE, seq: seq as u64, next_ino: 7 };
            run.extend_from_slice(&record(&h, pl));
        }
        let whole = scan_of(p, &run).unwrap();
        prop_assert_eq!(whole.iter().map(|r| &r.1).collect::<Vec<_>>(), payloads.iter().collect::<Vec<_>>());
        let mut bad = apply(&run, &m);
        bad.truncate(AREA);
        if seal {
            reseal(&mut bad);
        }
        let got = match scan_of(p, &bad) {
            Ok(got) => got,
            Err(d) => {
                // Damage, not a tail: valid records of the run after it.
                prop_assert!(!d.after.is_empty());
                prop_assert!(d.after.iter().all(|r| r.0.seq > d.first_lost));
                return Ok(());
            }
        };
        // One region's run (the other region is zeros): the base the open
        // asked for, or the next one (records written during its commit).
        let base = got.first().map_or(BASE, |r| r.0.base_tid);
        prop_assert!(base == BASE || base == BASE + 1);
        for (i, (h, pl)) in got.iter().enumerate() {
            prop_assert_eq!((h.uuid, h.base_tid, h.seq), (UUID, base, i as u64));
            prop_assert!(pl.len() <= AREA);
        }
    }
}

#[test]
fn fuzz_regression_intent_log_head_with_a_huge_length() {
    // A header claiming a 4 GiB payload now says so itself instead of
    // leaving the bound to the scan loop.
    let h = RecordHead {
        uuid: UUID,
        base_tid: BASE,
        seq: 0,
        next_ino: 1,
    };
    let b = encode_head(&h, u32::MAX as usize, VERSION);
    assert!(parse_head(&b).is_err());
}
