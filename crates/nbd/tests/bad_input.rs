//! Bad input from a raw client: a wrong magic closes only that
//! connection, unknown and malformed options are refused but the
//! handshake goes on, bad requests get the documented errors, a client
//! vanishing mid-payload does not disturb the next one, and an export's
//! I/O error reaches the client as EIO.

mod common;

use cairn_nbd::errno::*;
use cairn_nbd::proto::*;
use cairn_nbd::{MemExport, ServerConfig, StaticExports};
use common::*;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

fn server() -> (Arc<MemExport>, cairn_nbd::Server) {
    let (disk, ex) = disk_exports();
    (disk, start_tcp(ex, ServerConfig::default()))
}

/// The connection was closed by the server: EOF (or reset) on read.
fn assert_closed(c: &mut Client) {
    let mut b = [0u8; 1];
    c.s.flush().unwrap();
    match c.s.read(&mut b) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            panic!("connection still open after {TIMEOUT:?}")
        }
        Ok(0) | Err(_) => {}
        Ok(_) => panic!("connection still open"),
    }
}

/// The server still serves a fresh client normally.
fn still_serves(s: &cairn_nbd::Server) {
    let mut c = Client::tcp(tcp_addr(s));
    c.go("disk", false);
    assert_eq!(c.write(0, b"alive"), 0);
    assert_eq!(c.read(0, 5), (0, b"alive".to_vec()));
    c.disconnect();
}

#[test]
fn bad_option_magic_closes_the_connection() {
    let (_, s) = server();
    let mut c = Client::tcp(tcp_addr(&s));
    c.greet();
    c.s.write_all(&[0u8; 16]).unwrap();
    assert_closed(&mut c);
    still_serves(&s);
}

#[test]
fn bad_client_flags_close_the_connection() {
    let (_, s) = server();
    let mut c = Client::tcp(tcp_addr(&s));
    c.u64();
    c.u64();
    c.u16();
    c.s.write_all(&0x8000_0001u32.to_be_bytes()).unwrap();
    assert_closed(&mut c);
    assert_eq!(s.stats().handshake_failures, 1);
}

#[test]
fn unknown_and_malformed_options_leave_the_handshake_usable() {
    let (_, s) = server();
    let mut c = Client::tcp(tcp_addr(&s));
    c.greet();
    assert_eq!(
        c.option(999, b"whatever"),
        vec![(REP_ERR_UNSUP, b"option not supported".to_vec())]
    );
    assert_eq!(c.option(OPT_LIST, b"x")[0].0, REP_ERR_INVALID);
    assert_eq!(c.option(OPT_GO, &[0, 0, 0, 9, b'd'])[0].0, REP_ERR_INVALID);
    assert_eq!(
        c.option(OPT_INFO, &info_data("nope", &[]))[0].0,
        REP_ERR_UNKNOWN
    );
    // Meta contexts before structured replies: refused.
    let r = c.option(OPT_SET_META_CONTEXT, &meta_data("disk", &[BASE_ALLOCATION]));
    assert_eq!(r[0].0, REP_ERR_INVALID);
    let list = c.option(OPT_LIST, &[]);
    assert_eq!(list.len(), 3);
    assert_eq!(&list[0].1[4..8], b"disk");
    c.open("disk", false);
    assert_eq!(c.write(4096, b"ok"), 0);
}

#[test]
fn info_and_meta_context_replies() {
    let (_, s) = server();
    let mut c = Client::tcp(tcp_addr(&s));
    c.greet();
    let r = c.option(
        OPT_INFO,
        &info_data("disk@snap", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
    );
    assert_eq!(r.len(), 5, "{r:?}");
    let tflags = u16::from_be_bytes([r[0].1[10], r[0].1[11]]);
    assert_ne!(tflags & TF_READ_ONLY, 0);
    assert_eq!(&r[1].1[2..], b"disk@snap");
    assert_eq!(&r[2].1[2..], b"read-only snapshot");
    assert_eq!(&r[3].1[2..], &[0, 0, 0, 1, 0, 0, 0x10, 0, 2, 0, 0, 0]);
    let l = c.option(OPT_LIST_META_CONTEXT, &meta_data("disk", &[]));
    assert_eq!(
        l[0],
        (
            REP_META_CONTEXT,
            [&[0, 0, 0, 1][..], b"base:allocation"].concat()
        )
    );
    let l = c.option(
        OPT_LIST_META_CONTEXT,
        &meta_data("disk", &["qemu:dirty-bitmap:x"]),
    );
    assert_eq!(l.len(), 1, "no context matched: just the ACK");
}

#[test]
fn unknown_export_name_closes_and_abort_acks() {
    let (_, s) = server();
    let mut c = Client::tcp(tcp_addr(&s));
    c.greet();
    c.send_option(OPT_EXPORT_NAME, b"missing");
    assert_closed(&mut c);
    let mut c = Client::tcp(tcp_addr(&s));
    c.greet();
    assert_eq!(c.option(OPT_ABORT, &[]), vec![(REP_ACK, vec![])]);
    assert_closed(&mut c);
}

#[test]
fn bad_requests_get_their_errors() {
    let (_, s) = server();
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("disk", false);
    assert_eq!(c.request(77, 0, 0, 512, &[]).0, EINVAL, "unknown command");
    assert_eq!(c.read(SIZE - 512, 1024).0, EINVAL, "read past the end");
    assert_eq!(c.read(u64::MAX - 10, 100).0, EINVAL, "offset overflow");
    assert_eq!(c.read(0, (33 << 20) as u32).0, EINVAL, "33 MiB read");
    assert_eq!(
        c.request(CMD_WRITE, 0, SIZE, 2, b"xx").0,
        ENOSPC,
        "write past the end"
    );
    assert_eq!(
        c.request(CMD_TRIM, 0, SIZE, 2, &[]).0,
        EINVAL,
        "trim past the end"
    );
    assert_eq!(
        c.request(CMD_READ, CMD_FLAG_FUA, 0, 2, &[]).0,
        EINVAL,
        "FUA on a read"
    );
    assert_eq!(
        c.request(CMD_FLUSH, 0, 1, 0, &[]).0,
        EINVAL,
        "flush with a range"
    );
    assert_eq!(
        c.request(CMD_BLOCK_STATUS, 0, 0, 512, &[]).0,
        EINVAL,
        "no context"
    );
    // The connection is still fine.
    assert_eq!(c.write(0, b"fine"), 0);
    assert_eq!(c.read(0, 4), (0, b"fine".to_vec()));
    let st = s.stats();
    assert_eq!(st.command("unknown").errors, 1);
    assert_eq!(st.command("read").errors, 4);
}

#[test]
fn writes_to_the_read_only_export_are_eperm() {
    let (_, s) = server();
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("disk@snap", false);
    assert_ne!(c.tflags & TF_READ_ONLY, 0);
    assert_eq!(c.write(0, b"nope"), EPERM);
    assert_eq!(c.request(CMD_TRIM, 0, 0, 4096, &[]).0, EPERM);
    assert_eq!(c.request(CMD_WRITE_ZEROES, 0, 0, 4096, &[]).0, EPERM);
    assert_eq!(c.read(0, 4), (0, vec![0; 4]));
    assert_eq!(c.request(CMD_FLUSH, 0, 0, 0, &[]).0, 0);
}

#[test]
fn an_oversized_write_payload_closes_only_that_connection() {
    let (_, s) = server();
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("disk", false);
    c.send(CMD_WRITE, 0, 0, (33 << 20) as u32, &[0; 4096]);
    assert_closed(&mut c);
    still_serves(&s);
}

#[test]
fn a_client_vanishing_mid_payload_does_not_disturb_others() {
    let (disk, s) = server();
    let mut other = Client::tcp(tcp_addr(&s));
    other.go("disk", false);
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("disk", false);
    c.send(CMD_WRITE, 0, 0, 1 << 20, &[7; 1000]);
    drop(c);
    // A bad magic mid-transmission too.
    let mut bad = TcpStream::connect(tcp_addr(&s)).unwrap();
    bad.write_all(b"garbage that is no greeting reply at all")
        .unwrap();
    drop(bad);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(other.write(8192, &[3; 4096]), 0);
    assert_eq!(other.read(8192, 4096), (0, vec![3; 4096]));
    still_serves(&s);
    let mut b = [1u8; 1000];
    use cairn_nbd::Export;
    disk.read(0, &mut b).unwrap();
    assert_ne!(b, [7; 1000], "the partial write must not have been applied");
}

#[test]
fn export_io_errors_become_eio() {
    let disk = Arc::new(MemExport::new(1 << 20));
    let s = start_tcp(
        StaticExports::new().with("d", "", disk.clone()),
        ServerConfig::default(),
    );
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("d", false);
    disk.set_failing(true);
    assert_eq!(c.read(0, 512).0, EIO);
    assert_eq!(c.write(0, &[1; 512]), EIO);
    assert_eq!(c.request(CMD_FLUSH, 0, 0, 0, &[]).0, EIO);
    disk.set_failing(false);
    assert_eq!(c.read(0, 512), (0, vec![0; 512]));
    // With structured replies the error is an NBD_REPLY_TYPE_ERROR chunk.
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("d", true);
    disk.set_failing(true);
    let cookie = c.send(CMD_READ, 0, 0, 512, &[]);
    let (flags, kind, got, payload) = c.chunk();
    assert_eq!(
        (flags, kind, got),
        (REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie)
    );
    assert_eq!(&payload[..4], &EIO.to_be_bytes());
}

#[test]
fn structured_reads_and_block_status() {
    let (disk, s) = server();
    use cairn_nbd::Export;
    disk.write(4096, &[5; 4096], false).unwrap();
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("disk", true);
    assert_ne!(c.tflags & TF_SEND_DF, 0);
    let cookie = c.send(CMD_READ, 0, 4000, 200, &[]);
    let (flags, kind, got, p) = c.chunk();
    assert_eq!(
        (flags, kind, got, p.len()),
        (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, cookie, 208)
    );
    assert_eq!(&p[..8], &4000u64.to_be_bytes());
    assert_eq!(&p[8..104], &[0; 96][..]);
    assert_eq!(&p[104..], &[5; 104][..]);
    let cookie = c.send(CMD_BLOCK_STATUS, 0, 0, 16384, &[]);
    let (flags, kind, got, p) = c.chunk();
    assert_eq!(
        (flags, kind, got),
        (REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie)
    );
    let words: Vec<u32> = p
        .chunks(4)
        .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
        .collect();
    assert_eq!(words, [BASE_ALLOCATION_ID, 4096, 3, 4096, 0, 8192, 3]);
    c.send(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 16384, &[]);
    assert_eq!(c.chunk().3.len(), 12, "REQ_ONE: one extent");
    c.send(CMD_WRITE, 0, 0, 3, b"abc");
    assert_eq!(c.chunk().1, REPLY_TYPE_NONE);
}

/// A pool volume larger than its pool: writes past the pool's room get
/// ENOSPC (the connection stays usable), and what FUA writes acknowledged
/// before reads back exactly, also after a restart.
#[test]
fn a_full_pool_answers_enospc_and_keeps_what_was_acknowledged() {
    use cairn_devices::{DeviceClass, DeviceSpec};
    use rand::RngCore;
    let dir = tempfile::tempdir().unwrap();
    let (pool, dev) = (dir.path().join("pool"), dir.path().join("dev"));
    std::fs::create_dir_all(&dev).unwrap();
    let mut o = cairn_fs::MkfsOptions::default();
    o.devices
        .push(DeviceSpec::tier(DeviceClass::Nvme, dev, Some(17 << 20)));
    cairn_fs::mkfs(&pool, o).unwrap();
    let fs = cairn_fs::Fs::open(cairn_fs::Pool::open(&pool, None).unwrap()).unwrap();
    fs.volume_create("vol", SIZE, 4096).unwrap();
    let sock = dir.path().join("s");
    let ex = Arc::new(cairn_nbd::PoolExports::new(fs.clone()));
    let server = cairn_nbd::serve_unix(&sock, ex, ServerConfig::default()).unwrap();
    let mut c = Client::unix(&sock);
    c.go("vol", false);
    let mut rng = rand::thread_rng();
    let mut acked = Vec::new();
    let mut refused = None;
    for k in 0..(SIZE >> 20) {
        let mut b = vec![0u8; 1 << 20];
        rng.fill_bytes(&mut b);
        let (err, _) = c.request(CMD_WRITE, CMD_FLAG_FUA, k << 20, 1 << 20, &b);
        if err != 0 {
            refused = Some(err);
            break;
        }
        acked.push(b);
    }
    assert_eq!(refused, Some(ENOSPC), "a 64 MiB volume on a 16 MiB pool");
    assert!(!acked.is_empty());
    for (k, want) in acked.iter().enumerate() {
        let (err, got) = c.read((k as u64) << 20, 1 << 20);
        assert_eq!(err, 0);
        assert!(&got == want, "acknowledged MiB {k} differs");
    }
    c.disconnect();
    drop(server);
    fs.shutdown().unwrap();
    drop(fs);
    let fs = cairn_fs::Fs::open(cairn_fs::Pool::open(&pool, None).unwrap()).unwrap();
    let ino = fs.volume("vol").unwrap().ino;
    for (k, want) in acked.iter().enumerate() {
        let got = fs.read(ino, (k as u64) << 20, 1 << 20).unwrap();
        assert!(&got == want, "MiB {k} after a restart");
    }
}

/// A zero-length request (the protocol allows length 0) gets EINVAL for
/// every command that takes a range, WRITE and READ alike, whatever the
/// offset, and the connection stays usable.
#[test]
fn zero_length_requests_all_answer_einval() {
    let (_, s) = server();
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("disk", false);
    for off in [0, 4096, SIZE] {
        assert_eq!(
            c.request(CMD_WRITE, 0, off, 0, &[]).0,
            EINVAL,
            "write at {off}"
        );
        assert_eq!(c.read(off, 0).0, EINVAL, "read at {off}");
        assert_eq!(c.request(CMD_WRITE_ZEROES, 0, off, 0, &[]).0, EINVAL);
        assert_eq!(c.request(CMD_TRIM, 0, off, 0, &[]).0, EINVAL);
        assert_eq!(c.request(CMD_CACHE, 0, off, 0, &[]).0, EINVAL);
    }
    assert_eq!(c.write(0, b"after"), 0);
    assert_eq!(c.read(0, 5), (0, b"after".to_vec()));
    c.disconnect();
}
