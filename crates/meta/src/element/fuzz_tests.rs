//! Fuzz tests (issue 15) of the element value and history key decoders:
//! values and keys as the store's file holds them, random or damaged
//! (values resealed half of the time so that a damaged field behind a
//! good checksum is reached). A decode never panics, allocates in
//! proportion to its input, and gives a typed error or what was encoded.

use super::*;
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations, prefixes};

/// A value as version 2 (crc over key and value) or version 1 wrote it.
fn encode(version: u8, key: &[u8], tid: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = encode_value(key, tid, payload);
    if version == VALUE_VERSION_V1 {
        v.truncate(v.len() - 4);
        v[0] = VALUE_VERSION_V1;
        let crc = crc32c::crc32c(&v);
        v.extend_from_slice(&crc.to_le_bytes());
    }
    v
}

/// Rewrites the value's crc as its version byte says it is computed.
fn reseal(key: &[u8], v: &mut [u8]) {
    if v.len() < 5 {
        return;
    }
    let n = v.len() - 4;
    let crc = match v[0] {
        VALUE_VERSION_V1 => crc32c::crc32c(&v[..n]),
        _ => crc32c::crc32c_append(crc32c::crc32c(key), &v[..n]),
    };
    v[n..].copy_from_slice(&crc.to_le_bytes());
}

fn check(key: &[u8], v: &[u8]) -> std::result::Result<(), TestCaseError> {
    let (r, used) = metered(|| decode_value(key, v));
    // The payload copy, or an error that names the key (in hex).
    prop_assert!(used.largest <= v.len() + 8 * key.len() + 256, "{used:?}");
    match r {
        Ok((tid, payload)) => {
            prop_assert_eq!(payload.len(), v.len() - 13);
            prop_assert_eq!(
                decode_value(key, &encode_value(key, tid, &payload)).unwrap(),
                (tid, payload)
            );
        }
        Err(e) => prop_assert!(matches!(e, MetaError::Corrupt { .. }), "{e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(20000))]

    #[test]
    fn fuzz_element_value_random_bytes(key in bytes(40), v in bytes(100)) {
        check(&key, &v)?;
    }

    #[test]
    fn fuzz_element_value_mutated(
        key in bytes(40),
        tid in any::<u64>(),
        payload in bytes(200),
        version in 1u8..=2,
        m in mutations(),
        seal in any::<bool>(),
    ) {
        let mut v = apply(&encode(version, &key, tid, &payload), &m);
        if seal {
            reseal(&key, &mut v);
        }
        check(&key, &v)?;
    }

    #[test]
    fn fuzz_element_value_round_trips(
        key in bytes(40),
        tid in any::<u64>(),
        payload in bytes(200),
        version in 1u8..=2,
    ) {
        let v = encode(version, &key, tid, &payload);
        prop_assert_eq!(decode_value(&key, &v).unwrap(), (tid, payload));
        for p in prefixes(&v) {
            prop_assert!(decode_value(&key, p).is_err());
        }
    }

    #[test]
    fn fuzz_history_key_split(k in bytes(40), key in bytes(40), tid in any::<u64>()) {
        match split_hist_key(&k) {
            Ok((e, t)) => prop_assert_eq!(hist_key(e.as_bytes(), t), k),
            Err(e) => prop_assert!(k.len() < 8 && matches!(e, MetaError::Corrupt { .. }), "{e}"),
        }
        let (e, t) = split_hist_key(&hist_key(&key, tid)).unwrap();
        prop_assert_eq!((e.0, t), (key, tid));
    }
}

#[test]
fn fuzz_regression_history_key_shorter_than_a_tid() {
    // A damaged key of the `ends` index shorter than 8 bytes: prune and
    // ended_at split it with `k.len() - 8`, which panicked.
    assert!(split_hist_key(b"abc").is_err());
}
