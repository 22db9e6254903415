//! Fuzz tests (issue 15) of the SSD cache index decoder (`decode_index`):
//! random bytes and damaged valid indexes (resealed half of the time, so
//! the checks behind the checksum are reached). A decode never panics,
//! allocates at most what the file's entries justify, and gives a typed
//! error or copies that fit the ring without overlapping; a valid index
//! round-trips.

use super::*;
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations, prefixes};

const UUID: [u8; 16] = [9; 16];
const ID: u32 = 3;
const START: u64 = 1 << 20;
const END: u64 = 1 << 30;

/// Disjoint data copies inside the ring, in offset order.
fn arb_copies() -> impl Strategy<Value = Vec<SavedCopy>> {
    let copy = (any::<u64>(), any::<u32>(), 1u32..=1 << 20, 0u64..1 << 16);
    prop::collection::vec(copy, 0..40).prop_map(|v| {
        let mut at = START;
        let mut out = Vec::new();
        for (seg, off, len, gap) in v {
            at += gap;
            if at + len as u64 > END {
                break;
            }
            out.push(((seg & !META_KEY_BIT, off), at, len));
            at += len as u64;
        }
        out.sort_by_key(|c| c.0);
        out.dedup_by_key(|c| c.0);
        out.sort_by_key(|c| c.1);
        out
    })
}

fn reseal(b: &mut [u8]) {
    if b.len() >= 4 {
        let n = b.len() - 4;
        let crc = crc32c::crc32c(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
    }
}

fn check(b: &[u8]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| decode_index(b, &UUID, ID, START, END));
    // The copies' vector (32 bytes per 24-byte entry) and a key set.
    prop_assert!(used.largest <= 64 + 4 * b.len(), "{used:?} for {}", b.len());
    match r {
        Ok(s) => {
            prop_assert!((START..=END).contains(&s.head));
            let mut free_from = START;
            for &(key, at, len) in &s.copies {
                prop_assert!(!is_meta_key(&key) && at >= free_from && len > 0);
                let end = at.checked_add(len as u64);
                prop_assert!(end.is_some_and(|e| e <= END) && len as u64 <= (END - START) / 4);
                free_from = at + len as u64;
            }
        }
        Err(DeviceError::BadCacheIndex(_)) => {}
        Err(e) => prop_assert!(false, "unexpected error {e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(10000))]

    #[test]
    fn fuzz_ssd_cache_index_random_bytes(b in bytes(300)) {
        check(&b)?;
    }

    #[test]
    fn fuzz_ssd_cache_index_mutated(
        c in arb_copies(),
        head in any::<u64>(),
        m in mutations(),
        seal in any::<bool>(),
    ) {
        let mut b = apply(&encode_index(&UUID, ID, head, c.into_iter()), &m);
        if seal {
            reseal(&mut b);
        }
        check(&b)?;
    }

    #[test]
    fn fuzz_ssd_cache_index_round_trips(c in arb_copies(), head in START..END) {
        let b = encode_index(&UUID, ID, head, c.iter().copied());
        let s = decode_index(&b, &UUID, ID, START, END).unwrap();
        prop_assert_eq!(s, SavedIndex { head, copies: c });
        prop_assert!(decode_index(&b, &[0; 16], ID, START, END).is_err());
        for p in prefixes(&b) {
            prop_assert!(decode_index(p, &UUID, ID, START, END).is_err());
        }
    }
}

#[test]
fn fuzz_regression_ssd_cache_index_copy_past_u64_end() {
    // A copy whose end overflows u64: `at + len` panicked (overflow
    // checks) or wrapped to a small offset and was taken as inside the
    // ring.
    let at = u64::MAX - 10;
    let b = encode_index(&UUID, ID, START, [((1, 0), at, 20)].into_iter());
    let s = decode_index(&b, &UUID, ID, START, END).unwrap();
    assert!(s.copies.is_empty());
}
