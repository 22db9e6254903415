//! Fuzz tests (issue 15) of the devices layer's decoder of bytes read from
//! a device: the device header. Random bytes, and valid headers damaged by
//! `cairn_fuzzkit` mutations (resealed with a good checksum half of the
//! time, so the checks behind the checksum are reached too). A decode
//! never panics, allocates nothing the input does not justify, and gives
//! either a typed error or a header whose geometry the rest of the layer
//! can use; a valid header round-trips.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use cairn_devices::header::{DeviceHeader, DATA_OFFSET, HEADER_LEN};
use cairn_devices::{DeviceClass, DeviceError};
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations, prefixes};
use std::path::Path;

fn arb_header() -> impl Strategy<Value = DeviceHeader> {
    (
        any::<u32>(),
        any::<[u8; 16]>(),
        0u8..3,
        any::<u64>(),
        12u32..=30,
    )
        .prop_map(|(device_id, pool_uuid, rank, size, shift)| DeviceHeader {
            device_id,
            pool_uuid,
            class: DeviceClass::from_rank(rank).unwrap(),
            size: size.max(DATA_OFFSET),
            segment_size: 1 << shift,
            data_offset: DATA_OFFSET,
            log_offset: 0,
            log_len: 0,
        })
}

/// Rewrites the header checksum over whatever the bytes now say.
fn reseal(b: &mut [u8]) {
    if b.len() >= 68 {
        let crc = crc32c::crc32c(&b[0..64]);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
    }
}

fn check(b: &[u8]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| DeviceHeader::decode(b, Path::new("dev")));
    prop_assert!(used.largest <= 64, "allocated {used:?}");
    match r {
        Ok(h) => {
            prop_assert!(h.segment_size.is_power_of_two() && h.segment_size >= 4096);
            prop_assert!(h.data_offset >= HEADER_LEN as u64 && h.data_offset <= h.size);
            let slots = h.slot_count();
            prop_assert!(slots == 0 || h.data_offset + slots * h.segment_size <= h.size);
        }
        Err(
            DeviceError::NotADevice { .. }
            | DeviceError::BadChecksum { .. }
            | DeviceError::UnknownVersion { .. }
            | DeviceError::BadHeader { .. },
        ) => {}
        Err(e) => prop_assert!(false, "unexpected error {e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(50000))]

    #[test]
    fn fuzz_device_header_random_bytes(b in bytes(256)) {
        check(&b)?;
    }

    #[test]
    fn fuzz_device_header_mutated(h in arb_header(), m in mutations(), seal in any::<bool>()) {
        let mut b = apply(&h.encode(), &m);
        if seal {
            reseal(&mut b);
        }
        check(&b)?;
    }

    #[test]
    fn fuzz_device_header_round_trips_and_refuses_prefixes(h in arb_header()) {
        let b = h.encode();
        prop_assert_eq!(DeviceHeader::decode(&b, Path::new("dev")).unwrap(), h);
        for p in prefixes(&b[..68]) {
            prop_assert!(DeviceHeader::decode(p, Path::new("dev")).is_err());
        }
    }
}
