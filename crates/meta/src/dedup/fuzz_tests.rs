//! Fuzz tests (issue 15) of the dedup index decoders: the 6-byte entry of
//! `dedup_v2` and the `dedup_v1` value converted at open. Random and
//! damaged values (resealed half of the time) give a typed error or the
//! id that was encoded, never a panic.

use super::*;
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations, prefixes};

fn encode_v1(id: u64) -> Vec<u8> {
    let mut b = vec![1u8];
    b.extend_from_slice(&id.to_le_bytes());
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

fn reseal(b: &mut [u8]) {
    if b.len() >= 13 {
        let crc = crc32c::crc32c(&b[..9]);
        b[9..13].copy_from_slice(&crc.to_le_bytes());
    }
}

fn check_v1(hash: &[u8], b: &[u8]) -> std::result::Result<(), TestCaseError> {
    let (r, used) = metered(|| decode_v1(hash, b));
    prop_assert!(used.largest <= 256, "{used:?}");
    match r {
        Ok(id) => prop_assert_eq!(encode_v1(id), b),
        Err(e) => prop_assert!(matches!(e, MetaError::Corrupt { .. }), "{e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(20000))]

    #[test]
    fn fuzz_dedup_entry(v in any::<[u8; 6]>(), id in 0..MAX_INDEXED_CHUNK) {
        prop_assert!(decode(v) < MAX_INDEXED_CHUNK);
        prop_assert_eq!(encode(decode(v)), v);
        prop_assert_eq!(decode(encode(id)), id);
    }

    #[test]
    fn fuzz_dedup_v1_random_bytes(hash in bytes(40), b in bytes(40)) {
        check_v1(&hash, &b)?;
    }

    #[test]
    fn fuzz_dedup_v1_mutated(
        hash in bytes(40),
        id in any::<u64>(),
        m in mutations(),
        seal in any::<bool>(),
    ) {
        let mut b = apply(&encode_v1(id), &m);
        if seal {
            reseal(&mut b);
        }
        check_v1(&hash, &b)?;
    }

    #[test]
    fn fuzz_dedup_v1_round_trips(hash in bytes(40), id in any::<u64>()) {
        let b = encode_v1(id);
        prop_assert_eq!(decode_v1(&hash, &b).unwrap(), id);
        for p in prefixes(&b) {
            prop_assert!(decode_v1(&hash, p).is_err());
        }
    }
}
