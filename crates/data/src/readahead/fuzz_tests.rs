//! Fuzz tests (issue 15) of the segment scan: `chunks_in` finds the whole
//! sealed chunks at the start of bytes read from a segment, and a window
//! read unseals each by the hash its own header names (`read_window`).
//! Random bytes, and runs of valid chunks damaged by `cairn_fuzzkit`
//! mutations (each header resealed half of the time). The scan never
//! panics, allocates in proportion to its input, and yields only chunks
//! that lie back to back inside the bytes; an undamaged run is found whole.

use super::*;
use crate::chunk::{hash_block, seal, unseal, MAX_RAW_LEN};
use crate::compress::Compression;
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations};

/// A run of sealed chunks as a segment holds them, and their raw bytes.
fn arb_run() -> impl Strategy<Value = (Vec<u8>, Vec<Vec<u8>>)> {
    let raw = prop_oneof![
        bytes(2048),
        (any::<u8>(), 0usize..4096).prop_map(|(b, n)| vec![b; n])
    ];
    let c = prop_oneof![
        Just(Compression::None),
        Just(Compression::Lz4),
        Just(Compression::Zstd(1))
    ];
    prop::collection::vec((raw, c), 0..6).prop_map(|v| {
        let mut buf = Vec::new();
        for (raw, c) in &v {
            seal(raw, &hash_block(raw), *c, &mut buf);
        }
        (buf, v.into_iter().map(|(r, _)| r).collect())
    })
}

/// Rewrites the header checksum of each chunk the headers' lengths lead to.
fn reseal_headers(b: &mut [u8]) {
    let mut pos = 0;
    while pos + CHUNK_HEADER_LEN <= b.len() {
        let crc = crc32c::crc32c(&b[pos..pos + 52]);
        b[pos + 52..pos + 56].copy_from_slice(&crc.to_le_bytes());
        let stored = u32::from_le_bytes(b[pos + 12..pos + 16].try_into().unwrap());
        pos += CHUNK_HEADER_LEN + stored as usize;
    }
}

fn check_scan(b: &[u8]) -> Result<(), TestCaseError> {
    let (found, used) = metered(|| chunks_in(b));
    let most = b.len() / CHUNK_HEADER_LEN + 1;
    let entry = std::mem::size_of::<(usize, ChunkHeader)>();
    prop_assert!(used.largest <= 2 * most * entry, "{used:?}");
    let mut next = 0;
    for (pos, h) in &found {
        prop_assert_eq!(*pos, next);
        prop_assert_eq!(&ChunkHeader::decode(&b[*pos..]).unwrap(), h);
        next = pos + CHUNK_HEADER_LEN + h.stored_len as usize;
        prop_assert!(next <= b.len());
        let (_, used) = metered(|| unseal(&b[*pos..next], &h.hash, false));
        prop_assert!(used.largest <= (next - pos).max(MAX_RAW_LEN as usize) + 4096);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn fuzz_segment_scan_random_bytes(b in bytes(400)) {
        check_scan(&b)?;
    }

    #[test]
    fn fuzz_segment_scan_mutated((b, _) in arb_run(), m in mutations(), seal in any::<bool>()) {
        let mut b = apply(&b, &m);
        if seal {
            reseal_headers(&mut b);
        }
        check_scan(&b)?;
    }

    #[test]
    fn fuzz_segment_scan_finds_an_undamaged_run((b, raws) in arb_run()) {
        let found = chunks_in(&b);
        prop_assert_eq!(found.len(), raws.len());
        for ((pos, h), raw) in found.iter().zip(&raws) {
            let sealed = &b[*pos..*pos + CHUNK_HEADER_LEN + h.stored_len as usize];
            prop_assert_eq!(&unseal(sealed, &h.hash, true).unwrap(), raw);
        }
    }
}
