//! Fuzz tests (issue 15) of the data layer's decoders of bytes read from a
//! device or the metadata store: chunk headers and sealed chunks (`unseal`,
//! `verify_split`), chunk and segment records, and the heat table. Random
//! bytes, and valid encodings damaged by `cairn_fuzzkit` mutations, resealed
//! with good checksums half of the time so that the checks behind them are
//! reached. A decode never panics, allocates no more than its input (or a
//! chunk's largest raw length) justifies, and gives a typed error or a
//! value that encodes back the same; a valid encoding round-trips.

use cairn_data::chunk::{hash_block, seal, unseal, verify_split, ChunkError, MAX_RAW_LEN};
use cairn_data::{
    ChunkHeader, ChunkRec, Compression, DataError, Heat, Layout, SegmentRec, StripeRec,
};
use cairn_data::{Hash, CHUNK_HEADER_LEN as HL};
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations, prefixes};

/// Block contents: noise, runs and repeated text, so that compression
/// applies to some.
fn arb_raw(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        bytes(max),
        (any::<u8>(), 0..=max).prop_map(|(b, n)| vec![b; n]),
        (bytes(16), 0..=max).prop_map(|(p, n)| p.iter().copied().cycle().take(n).collect()),
    ]
}

fn arb_compression() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::None),
        Just(Compression::Lz4),
        (1i32..4).prop_map(Compression::Zstd),
    ]
}

/// A sealed chunk and the raw bytes it holds.
fn arb_sealed(max: usize) -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (arb_raw(max), arb_compression()).prop_map(|(raw, c)| {
        let mut buf = Vec::new();
        seal(&raw, &hash_block(&raw), c, &mut buf);
        (buf, raw)
    })
}

/// Rewrites a chunk's data crc (over the stored length its header says,
/// when that is there) and header crc.
fn reseal_chunk(b: &mut [u8]) {
    if b.len() < HL {
        return;
    }
    let stored = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
    if let Some(data) = b[HL..].get(..stored) {
        let crc = crc32c::crc32c(data);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b[..52]);
    b[52..56].copy_from_slice(&crc.to_le_bytes());
}

/// The hash a chunk's header names (what a segment scan checks it by).
fn named_hash(b: &[u8]) -> Hash {
    b.get(16..48).map_or([0; 32], |h| h.try_into().unwrap())
}

fn check_chunk(b: &[u8]) -> Result<(), TestCaseError> {
    let hash = named_hash(b);
    let _ = ChunkHeader::decode(b);
    let (r, used) = metered(|| unseal(b, &hash, true));
    let limit = b.len().max(MAX_RAW_LEN as usize) + 4096;
    prop_assert!(used.largest <= limit, "{used:?} for {} bytes", b.len());
    if let Ok(raw) = r {
        prop_assert_eq!(hash_block(&raw), hash);
    }
    let (head, data) = b.split_at(HL.min(b.len()));
    if let Ok(n) = verify_split(head, data, &hash) {
        prop_assert!(n <= data.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn fuzz_chunk_random_bytes(b in bytes(300)) {
        check_chunk(&b)?;
    }

    #[test]
    fn fuzz_chunk_mutated((b, _) in arb_sealed(8192), m in mutations(), seal in any::<bool>()) {
        let mut b = apply(&b, &m);
        if seal {
            reseal_chunk(&mut b);
        }
        check_chunk(&b)?;
    }

    #[test]
    fn fuzz_chunk_round_trips((b, raw) in arb_sealed(8192)) {
        let h = hash_block(&raw);
        prop_assert_eq!(unseal(&b, &h, true).unwrap(), raw.clone());
        let head = ChunkHeader::decode(&b).unwrap();
        prop_assert_eq!(head.raw_len as usize, raw.len());
        if head.compression == cairn_data::compress::RAW {
            prop_assert_eq!(verify_split(&b[..HL], &b[HL..], &h).unwrap(), raw.len());
        }
    }
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn fuzz_chunk_refuses_every_prefix((b, raw) in arb_sealed(600)) {
        let h = hash_block(&raw);
        for p in prefixes(&b) {
            prop_assert!(unseal(p, &h, true).is_err());
        }
    }
}

#[test]
fn fuzz_regression_chunk_compressed_raw_length_is_bounded() {
    // A compressed chunk whose header (checksums good) claims 4 GiB of raw
    // bytes: unseal allocated that much before decompressing.
    let raw = vec![1u8; 4096];
    let mut b = Vec::new();
    seal(&raw, &hash_block(&raw), Compression::Lz4, &mut b);
    b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal_chunk(&mut b);
    let (r, used) = metered(|| unseal(&b, &hash_block(&raw), false));
    assert_eq!(r, Err(ChunkError::RawTooLong(u32::MAX)));
    assert!(used.largest < 1 << 20, "{used:?}");
}

fn arb_chunk_rec() -> impl Strategy<Value = ChunkRec> {
    let sums = prop_oneof![
        prop::collection::vec(any::<u32>(), 0..=4),
        prop::collection::vec(any::<u32>(), 250..=256),
    ];
    (any::<(u64, u32, u32, u32, u64, u64)>(), any::<Hash>(), sums).prop_map(|(f, hash, sums)| {
        ChunkRec {
            segment: f.0,
            offset: f.1,
            len: f.2,
            raw_len: f.3,
            refs: f.4,
            live: f.5,
            hash,
            sums,
        }
    })
}

/// A record in any version: v3 as written now, or v2 / v1 as older
/// versions wrote them.
fn encode_chunk_rec(c: &ChunkRec, version: u8) -> Vec<u8> {
    let v3 = c.encode();
    let mut b = vec![version];
    match version {
        3 => return v3,
        2 => b.extend_from_slice(&v3[1..ChunkRec::V2_LEN - 4]),
        _ => {
            b.extend_from_slice(&v3[1..29]);
            b.extend_from_slice(&v3[37..69]);
        }
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

fn arb_segment_rec() -> impl Strategy<Value = SegmentRec> {
    let copies = prop::collection::vec(any::<u64>(), 0..3);
    let layouts = prop_oneof![
        Just(None),
        (1u8..=4).prop_map(|n| Some(Layout::Copies(n))),
        (2u8..=16, 1u8..=3).prop_map(|(k, m)| Some(Layout::Ec { k, m })),
    ];
    let f = any::<(u32, u64, u32, u64, u64, u64, u8)>();
    (f, copies, layouts).prop_map(|(f, more, layout)| SegmentRec {
        device: f.0,
        slot: f.1,
        // Further copies on devices other than the first's and each other's.
        copies: (more.iter().enumerate())
            .map(|(i, &slot)| cairn_devices::SlotAddr {
                device: f.0.wrapping_add(1 + i as u32),
                slot,
            })
            .collect(),
        used: f.2,
        live: f.3,
        chunks: f.4,
        hist: f.5,
        flags: f.6,
        layout,
    })
}

/// Rewrites a record's trailing crc over what precedes it.
fn reseal_rec(b: &mut [u8]) {
    if b.len() >= 4 {
        let n = b.len() - 4;
        let crc = crc32c::crc32c(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
    }
}

fn check_records(b: &[u8]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| ChunkRec::decode(b));
    prop_assert!(used.largest <= b.len() + 64, "{used:?}");
    match r {
        Ok(c) => {
            prop_assert!(c.sums.len() <= 256);
            prop_assert_eq!(ChunkRec::decode(&c.encode()).unwrap(), c);
        }
        Err(e) => prop_assert!(matches!(e, DataError::BadRecord { .. }), "{e}"),
    }
    match SegmentRec::decode(b) {
        Ok(s) => prop_assert_eq!(SegmentRec::decode(&s.encode()).unwrap(), s),
        Err(e) => prop_assert!(matches!(e, DataError::BadRecord { .. }), "{e}"),
    }
    match StripeRec::decode(b) {
        Ok(s) => prop_assert_eq!(StripeRec::decode(&s.encode()).unwrap(), s),
        Err(e) => prop_assert!(matches!(e, DataError::BadRecord { .. }), "{e}"),
    }
    Ok(())
}

fn arb_stripe_rec() -> impl Strategy<Value = StripeRec> {
    (2u8..=16, 1u8..=3, 1u32..1 << 20, any::<u64>()).prop_map(|(k, m, len, slot)| StripeRec {
        k,
        m,
        len: len * 64,
        // Each member on its own device.
        members: (0..(k + m) as u32)
            .map(|d| cairn_devices::SlotAddr {
                device: d * 3,
                slot: slot.wrapping_add(d as u64),
            })
            .collect(),
    })
}

proptest! {
    #![proptest_config(config(20000))]

    #[test]
    fn fuzz_records_random_bytes(b in bytes(1200)) {
        check_records(&b)?;
    }

    #[test]
    fn fuzz_chunk_rec_mutated(
        c in arb_chunk_rec(),
        v in 1u8..=3,
        m in mutations(),
        seal in any::<bool>(),
    ) {
        let mut b = apply(&encode_chunk_rec(&c, v), &m);
        if seal {
            reseal_rec(&mut b);
        }
        check_records(&b)?;
    }

    #[test]
    fn fuzz_chunk_rec_round_trips(c in arb_chunk_rec(), v in 1u8..=3) {
        let b = encode_chunk_rec(&c, v);
        let d = ChunkRec::decode(&b).unwrap();
        let want = match v {
            3 => c.clone(),
            2 => ChunkRec { sums: Vec::new(), ..c.clone() },
            _ => ChunkRec { sums: Vec::new(), live: c.refs, ..c.clone() },
        };
        prop_assert_eq!(d, want);
        for p in prefixes(&b) {
            prop_assert!(ChunkRec::decode(p).is_err());
        }
    }

    #[test]
    fn fuzz_stripe_rec_mutated(s in arb_stripe_rec(), m in mutations(), seal in any::<bool>()) {
        let b = s.encode();
        prop_assert_eq!(StripeRec::decode(&b).unwrap(), s);
        for p in prefixes(&b) {
            prop_assert!(StripeRec::decode(p).is_err());
        }
        let mut b = apply(&b, &m);
        if seal {
            reseal_rec(&mut b);
        }
        check_records(&b)?;
    }

    #[test]
    fn fuzz_segment_rec_mutated(s in arb_segment_rec(), m in mutations(), seal in any::<bool>()) {
        let mut b = apply(&s.encode(), &m);
        if seal {
            reseal_rec(&mut b);
        }
        check_records(&b)?;
    }

    #[test]
    fn fuzz_segment_rec_round_trips(s in arb_segment_rec()) {
        let b = s.encode();
        prop_assert_eq!(SegmentRec::decode(&b).unwrap(), s);
        for p in prefixes(&b) {
            prop_assert!(SegmentRec::decode(p).is_err());
        }
    }
}

#[test]
fn fuzz_regression_chunk_rec_with_256_sums_round_trips() {
    // A 1 MiB uncompressed chunk has 256 sums; the count byte wrapped to 0
    // and the decoder refused the record as "wrong length", so every such
    // chunk written with a 1 MiB record size became unreadable.
    let raw = vec![7u8; 1 << 20];
    let c = ChunkRec {
        segment: 1,
        offset: 0,
        len: (HL + raw.len()) as u32,
        raw_len: raw.len() as u32,
        refs: 1,
        live: 1,
        hash: hash_block(&raw),
        sums: ChunkRec::sums_of(&raw),
    };
    assert_eq!(c.sums.len(), 256);
    assert_eq!(ChunkRec::decode(&c.encode()).unwrap(), c);
}

/// A heat table as `Heat::encode` writes it (entries in any order).
fn encode_heat(entries: &[(u64, u64, u32)]) -> Vec<u8> {
    let mut b = b"CAIRNHT2".to_vec();
    for &(s, hits, last) in entries {
        b.extend_from_slice(&s.to_le_bytes());
        b.extend_from_slice(&hits.to_le_bytes());
        b.extend_from_slice(&last.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

fn arb_heat() -> impl Strategy<Value = Vec<(u64, u64, u32)>> {
    prop::collection::vec(any::<(u64, u64, u32)>(), 0..50)
}

fn check_heat(b: &[u8]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| Heat::decode(b, 1 << 20));
    prop_assert!(used.largest <= 8 * b.len() + 1024, "{used:?}");
    match r {
        Ok(h) => {
            let again = Heat::decode(&h.encode(), 1 << 20).unwrap();
            prop_assert_eq!(again.samples().len(), h.samples().len());
        }
        Err(e) => prop_assert!(matches!(e, DataError::BadRecord { .. }), "{e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(10000))]

    #[test]
    fn fuzz_heat_random_bytes(b in bytes(300)) {
        check_heat(&b)?;
    }

    #[test]
    fn fuzz_heat_mutated(e in arb_heat(), m in mutations(), seal in any::<bool>()) {
        let mut b = apply(&encode_heat(&e), &m);
        if seal {
            reseal_rec(&mut b);
        }
        check_heat(&b)?;
    }

    #[test]
    fn fuzz_heat_round_trips(e in arb_heat()) {
        let b = encode_heat(&e);
        let h = Heat::decode(&b, 1 << 20).unwrap();
        let mut want: std::collections::BTreeMap<u64, f64> = Default::default();
        for &(s, hits, _) in &e {
            want.insert(s, hits as f64 / 65536.0);
        }
        let mut got: Vec<_> = h.samples().iter().map(|s| (s.segment, s.hits)).collect();
        got.sort_by_key(|g| g.0);
        prop_assert_eq!(got, want.into_iter().collect::<Vec<_>>());
        for p in prefixes(&b) {
            prop_assert!(Heat::decode(p, 1 << 20).is_err());
        }
    }
}
