//! Unit tests of the wire encoders and decoders against hand-written
//! byte layouts from the protocol document.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]

use super::*;

#[test]
fn request_round_trips_and_has_the_documented_layout() {
    let r = Request {
        flags: CMD_FLAG_FUA,
        kind: CMD_WRITE,
        cookie: 0x0102_0304_0506_0708,
        offset: 4096,
        length: 512,
    };
    let b = r.encode();
    assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
    assert_eq!(&b[4..8], &[0, 1, 0, 1]);
    assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&b[16..24], &[0, 0, 0, 0, 0, 0, 0x10, 0]);
    assert_eq!(&b[24..28], &[0, 0, 2, 0]);
    assert_eq!(Request::decode(&b), Ok(r));
}

#[test]
fn short_or_bad_magic_requests_are_refused() {
    let b = Request {
        flags: 0,
        kind: 0,
        cookie: 1,
        offset: 0,
        length: 1,
    }
    .encode();
    for n in 0..REQUEST_LEN {
        assert!(Request::decode(&b[..n]).is_err(), "{n} bytes");
    }
    let mut bad = b;
    bad[0] ^= 1;
    assert_eq!(
        Request::decode(&bad),
        Err(DecodeError::BadMagic(0x2460_9513))
    );
}

#[test]
fn option_header() {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&9u32.to_be_bytes());
    assert_eq!(decode_option_header(&b), Ok((OPT_GO, 9)));
    assert_eq!(decode_option_header(&b[..15]), Err(DecodeError::Short(15)));
    b[0] = 0;
    assert!(matches!(
        decode_option_header(&b),
        Err(DecodeError::BadMagic(_))
    ));
}

fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

#[test]
fn info_request() {
    let b = info_data("disk", &[INFO_NAME, INFO_BLOCK_SIZE]);
    let r = InfoRequest::decode(&b).unwrap();
    assert_eq!(r.name, "disk");
    assert_eq!(r.infos, vec![INFO_NAME, INFO_BLOCK_SIZE]);
    // A count that disagrees with the bytes, a name longer than the data.
    assert!(InfoRequest::decode(&b[..b.len() - 1]).is_err());
    let mut long = b.clone();
    long[3] = 200;
    assert!(InfoRequest::decode(&long).is_err());
    assert!(InfoRequest::decode(&[]).is_err());
}

#[test]
fn meta_request() {
    let mut b = 4u32.to_be_bytes().to_vec();
    b.extend_from_slice(b"disk");
    b.extend_from_slice(&2u32.to_be_bytes());
    for q in ["base:allocation", "qemu:dirty-bitmap:x"] {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    let r = MetaRequest::decode(&b).unwrap();
    assert_eq!(r.name, "disk");
    assert_eq!(r.queries, vec!["base:allocation", "qemu:dirty-bitmap:x"]);
    assert!(MetaRequest::decode(&b[..b.len() - 1]).is_err());
    let mut extra = b.clone();
    extra.push(0);
    assert!(MetaRequest::decode(&extra).is_err());
    // A huge count with no queries behind it.
    let mut huge = b[..8].to_vec();
    huge.extend_from_slice(&u32::MAX.to_be_bytes());
    assert!(MetaRequest::decode(&huge).is_err());
}

#[test]
fn replies_have_the_documented_layout() {
    let r = option_reply(OPT_LIST, REP_ERR_UNSUP, b"xy");
    assert_eq!(&r[0..8], &OPT_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&r[8..12], &[0, 0, 0, 3]);
    assert_eq!(&r[12..16], &[0x80, 0, 0, 1]);
    assert_eq!(&r[16..22], &[0, 0, 0, 2, b'x', b'y']);
    let s = simple_reply(22, 7);
    assert_eq!(
        &s[..],
        &[0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0, 7]
    );
    let e = error_chunk(7, 5, "bad");
    assert_eq!(&e[0..8], &[0x66, 0x8e, 0x33, 0xef, 0, 1, 0x80, 1]);
    assert_eq!(&e[16..20], &[0, 0, 0, 9]);
    assert_eq!(&e[20..29], &[0, 0, 0, 5, 0, 3, b'b', b'a', b'd']);
    let bs = block_status_chunk(7, 1, &[(4096, 3), (512, 0)]);
    assert_eq!(bs.len(), 20 + 4 + 16);
    assert_eq!(&bs[6..8], &[0, 5]);
    assert_eq!(&bs[20..32], &[0, 0, 0, 1, 0, 0, 0x10, 0, 0, 0, 0, 3]);
    assert_eq!(
        info_export(1 << 20, 3),
        vec![0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 3]
    );
    assert_eq!(info_block_size(1, 4096, MAX_PAYLOAD).len(), 14);
    assert_eq!(rep_server("a", "b"), vec![0, 0, 0, 1, b'a', b'b']);
}

#[test]
fn export_names() {
    assert_eq!(decode_export_name(b"vol@snap").unwrap(), "vol@snap");
    assert!(decode_export_name(&[0xff]).is_err());
    assert!(decode_export_name(&vec![b'a'; MAX_STRING + 1]).is_err());
}
