//! Fuzz tests of the mirror stream's decoders (bytes from a file, a pipe
//! or ssh): random bytes, and valid streams damaged by `cairn_fuzzkit`
//! mutations. `check_stream` and every frame-body decoder never panic,
//! never allocate much more than their input holds, and give a typed
//! error; a valid stream checks out. The bucket's manifest and chunk
//! objects (bytes from an object store) and the split/join of a stream
//! get the same treatment.

use cairn_fs::replica::{Change, ChunkIn, Event, StoredChunk};
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations, prefixes};
use cairn_mirror::bucket::manifest::{Entry, Manifest};
use cairn_mirror::bucket::objects;
use cairn_mirror::frame::{FrameWriter, Kind};
use cairn_mirror::records::*;
use cairn_mirror::{check_stream, StreamError};

/// A valid stream: `n` events in TIDs after `since`, a chunk per creation.
fn valid_stream(since: u64, n: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = FrameWriter::new(&mut out);
    let upto = since + n as u64 + 1;
    let header = Header {
        source: [7; 16],
        since,
        upto,
    };
    w.frame(Kind::Header, &header.encode()).unwrap();
    let tids: Vec<(u64, u64)> = (since + 1..=upto).map(|t| (t, t * 1000)).collect();
    w.frame(Kind::Tids, &encode_tids(&tids)).unwrap();
    for i in 0..n as u64 {
        let tid = since + 1 + i;
        let data = StoredChunk {
            hash: [i as u8; 32],
            method: 0,
            raw_len: payload.len() as u32,
            stored: payload.to_vec(),
        };
        let c = ChunkIn {
            src: i,
            hash: [i as u8; 32],
            data: (i % 2 == 0).then_some(data),
        };
        w.frame(Kind::Chunk, &encode_chunk(&c)).unwrap();
        let create = Event {
            tid,
            key: vec![1, 2, i as u8],
            create_tid: tid,
            change: Change::Create(payload.to_vec()),
        };
        w.frame(Kind::Event, &encode_event(&create)).unwrap();
        let end = Event {
            tid: tid + 1,
            key: vec![1, 2, i as u8],
            create_tid: tid,
            change: Change::End,
        };
        w.frame(Kind::Event, &encode_event(&end)).unwrap();
    }
    w.frame(
        Kind::Snapshots,
        &encode_snapshots(&[("s".into(), payload.to_vec())]),
    )
    .unwrap();
    w.frame(Kind::Orphans, &encode_orphans(&[5, 6])).unwrap();
    w.frame(Kind::Commit, &encode_commit(upto, 99)).unwrap();
    let frames = w.count();
    w.frame(Kind::End, &encode_end(upto, frames)).unwrap();
    out
}

fn check(b: &[u8]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| {
        let _ = objects::chunk_hashes(b);
        check_stream(b)
    });
    prop_assert!(
        used.largest <= 2 * b.len() + 256,
        "allocated {used:?} for {} bytes",
        b.len()
    );
    match r {
        Ok(_)
        | Err(StreamError::Damaged(_) | StreamError::Truncated(_) | StreamError::Refused(_)) => {}
        Err(e) => prop_assert!(false, "unexpected error {e}"),
    }
    Ok(())
}

fn bodies(b: &[u8]) -> Result<(), TestCaseError> {
    let (_, used) = metered(|| {
        let _ = Header::decode(b);
        let _ = decode_tids(b);
        let _ = decode_chunk(b);
        let _ = decode_event(b);
        let _ = decode_commit(b);
        let _ = decode_snapshots(b);
        let _ = decode_orphans(b);
        let _ = decode_end(b);
        let _ = Manifest::decode(b);
        let _ = objects::decode_object(b, &[0; 32]);
    });
    prop_assert!(
        used.largest <= b.len() + 256,
        "allocated {used:?} for {} bytes",
        b.len()
    );
    Ok(())
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn fuzz_stream_random_bytes(b in bytes(4096)) {
        check(&b)?;
        bodies(&b)?;
    }

    #[test]
    fn fuzz_stream_mutated(since in 0u64..1000, n in 0u8..6, p in bytes(64), m in mutations()) {
        let b = apply(&valid_stream(since, n, &p), &m);
        check(&b)?;
    }

    #[test]
    fn fuzz_stream_valid_checks_out_and_prefixes_do_not(since in 0u64..1000, n in 0u8..4, p in bytes(32)) {
        let b = valid_stream(since, n, &p);
        prop_assert!(check_stream(&b[..]).is_ok());
        for cut in prefixes(&b) {
            prop_assert!(check_stream(cut).is_err());
        }
    }

    #[test]
    fn fuzz_bucket_manifest_mutated(n in 0u64..6, m in mutations()) {
        let streams = (0..n)
            .map(|i| Entry { since: i * 10, upto: i * 10 + 10, bytes: i, hash: [i as u8; 32] })
            .collect();
        let good = Manifest { id: [1; 16], source: [2; 16], chunks: n, streams };
        let b = apply(&good.encode(), &m);
        let (r, used) = metered(|| Manifest::decode(&b));
        prop_assert!(used.largest <= b.len() + 256, "allocated {used:?}");
        if let Ok(got) = r {
            prop_assert!(b == good.encode() || got.encode() == b, "taken but not what was encoded");
        }
    }

    #[test]
    fn fuzz_stream_split_then_joined_is_the_same_stream(since in 0u64..1000, n in 0u8..6, p in bytes(64)) {
        let b = valid_stream(since, n, &p);
        let mut objs = std::collections::HashMap::new();
        let mut split = Vec::new();
        objects::split_stream(&b[..], &mut split, &mut |h, o| {
            objs.insert(*h, o);
            Ok(())
        })
        .unwrap();
        prop_assert!(check_stream(&split[..]).is_ok());
        let mut joined = Vec::new();
        let mut fetch = |h: &[u8; 32]| match objs.get(h) {
            Some(o) => objects::decode_object(o, h).map(Some),
            None => Ok(None),
        };
        objects::join_stream(&split[..], &mut joined, &mut fetch).unwrap();
        prop_assert_eq!(joined, b);
    }
}
