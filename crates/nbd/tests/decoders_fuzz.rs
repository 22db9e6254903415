//! Fuzz tests of the NBD decoders (bytes from an untrusted client):
//! random bytes and valid encodings damaged by `cairn_fuzzkit`
//! mutations, through the request decoder, the option decoders and the
//! whole handshake; none panics or allocates much more than its input,
//! and valid encodings decode back to what was encoded.

use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations, prefixes};
use cairn_nbd::proto::*;
use cairn_nbd::{negotiate, MemExport, StaticExports};
use std::sync::Arc;

fn decoders(b: &[u8]) -> Result<(), TestCaseError> {
    let (_, used) = metered(|| {
        let _ = Request::decode(b);
        let _ = decode_option_header(b);
        let _ = InfoRequest::decode(b);
        let _ = MetaRequest::decode(b);
        let _ = decode_export_name(b);
    });
    // Meta queries become Strings (24 bytes each for 4 bytes of input).
    prop_assert!(
        used.largest <= 8 * b.len() + 256,
        "allocated {used:?} for {} bytes",
        b.len()
    );
    Ok(())
}

fn option(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u32).to_be_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// A client's side of a valid handshake that ends with NBD_OPT_GO.
fn valid_handshake(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut b = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    b.extend(option(OPT_LIST, &[]));
    b.extend(option(OPT_STRUCTURED_REPLY, &[]));
    let mut meta = Vec::new();
    string(&mut meta, name);
    meta.extend_from_slice(&1u32.to_be_bytes());
    string(&mut meta, BASE_ALLOCATION);
    b.extend(option(OPT_LIST_META_CONTEXT, &meta));
    b.extend(option(OPT_SET_META_CONTEXT, &meta));
    let mut go = Vec::new();
    string(&mut go, name);
    go.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    infos
        .iter()
        .for_each(|i| go.extend_from_slice(&i.to_be_bytes()));
    b.extend(option(OPT_INFO, &go));
    b.extend(option(OPT_GO, &go));
    b
}

fn exports() -> StaticExports {
    let e = Arc::new(MemExport::new(1 << 20));
    StaticExports::new()
        .with("disk", "d", e.clone())
        .with("disk@s", "", e)
}

/// Runs the server's handshake over `input`; checks its allocations.
fn handshake(input: &[u8], ex: &StaticExports) -> Result<Option<String>, TestCaseError> {
    let (r, used) = metered(|| {
        let mut out = Vec::new();
        negotiate(&mut &input[..], &mut out, ex).ok()
    });
    prop_assert!(
        used.largest <= 8 * input.len() + 4096,
        "allocated {used:?} for {} bytes",
        input.len()
    );
    Ok(r)
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn fuzz_decoders_random_bytes(b in bytes(512)) {
        decoders(&b)?;
    }

    #[test]
    fn fuzz_request_round_trip_and_mutations(flags: u16, kind: u16, cookie: u64, offset: u64, length: u32, m in mutations()) {
        let r = Request { flags, kind, cookie, offset, length };
        let b = r.encode();
        prop_assert_eq!(Request::decode(&b), Ok(r));
        for cut in prefixes(&b) {
            prop_assert!(Request::decode(cut).is_err());
        }
        decoders(&apply(&b, &m))?;
    }

    #[test]
    fn fuzz_handshake_mutated(infos in prop::collection::vec(0u16..6, 0..4), m in mutations()) {
        let ex = exports();
        let valid = valid_handshake("disk", &infos);
        prop_assert_eq!(handshake(&valid, &ex)?, Some("disk".to_string()));
        let b = apply(&valid, &m);
        decoders(&b)?;
        handshake(&b, &ex)?;
    }

    #[test]
    fn fuzz_handshake_random_bytes(b in bytes(1024)) {
        let mut input = (FLAG_C_FIXED_NEWSTYLE).to_be_bytes().to_vec();
        input.extend_from_slice(&b);
        handshake(&input, &exports())?;
    }
}
