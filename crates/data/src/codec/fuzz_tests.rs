//! Fuzz tests (issue 53) of encrypted chunks: sealed chunks of random
//! bytes, damaged by `cairn_fuzzkit` mutations with their checksums
//! redone half of the time (so that only the encryption can notice), are
//! opened by `ChunkCodec::unseal`: it never panics, allocates in
//! proportion to the chunk, and gives either exactly the bytes sealed or
//! an error, never other bytes.

use super::*;
use crate::chunk::{seal_stored, CHUNK_HEADER_LEN};
use cairn_crypt::DataKey;
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations};

/// Redoes the data and header checksums of the chunk at the start of `b`
/// (as far as its bytes reach).
fn reseal(b: &mut [u8]) {
    if b.len() < CHUNK_HEADER_LEN {
        return;
    }
    let stored = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
    if let Some(data) = b.get(CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + stored) {
        let crc = crc32c::crc32c(data);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b[..52]);
    b[52..56].copy_from_slice(&crc.to_le_bytes());
}

fn arb_compression() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::None),
        Just(Compression::Lz4),
        Just(Compression::Zstd(1))
    ]
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn fuzz_encrypted_chunks_open_exact_or_not_at_all(
        raw in prop_oneof![bytes(4096), (any::<u8>(), 1usize..8192).prop_map(|(b, n)| vec![b; n])],
        c in arb_compression(),
        m in mutations(),
        redo in any::<bool>(),
    ) {
        let codec = ChunkCodec::encrypted(Arc::new(PoolKeys::derive(&DataKey::random(), cairn_crypt::Cipher::Xaes256Gcm)));
        let h = codec.hash(&raw);
        let (form, stored) = codec.pack(c, &raw, &h).unwrap();
        let mut good = Vec::new();
        seal_stored(form, raw.len(), &stored, &h, &mut good);
        prop_assert_eq!(codec.unseal(&good, &h, true).unwrap(), raw.clone());
        let mut bad = apply(&good, &m);
        if redo {
            reseal(&mut bad);
        }
        let (got, used) = metered(|| codec.unseal(&bad, &h, true));
        prop_assert!(used.largest <= bad.len().max(crate::chunk::MAX_RAW_LEN as usize) + 4096, "{used:?}");
        if let Ok(bytes) = got {
            prop_assert_eq!(bytes, raw);
        }
    }
}
