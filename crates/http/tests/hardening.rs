//! What the HTTP frontend gives to a local user who is not the admin, and
//! what one bad client can do to it: a client that pipelines thousands of
//! GETs through a tiny receive buffer and never reads stalls neither other
//! scrapes nor `Server::shutdown`; `/metrics` and the public routes carry
//! no path or name of the pool; the routes that do are off without the
//! detail switch, and every route wants the token when one is set.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use cairn_devices::{DeviceClass, DeviceSpec};
use cairn_fs::{mkfs, Ctx, Fs, MkfsOptions, Pool, PoolConfig, ROOT_INO};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// In the pool's directory name and in a snapshot's name.
const SECRET_DIR: &str = "secret-pool-dir";
const SECRET_SNAP: &str = "secret-snapshot-name";

/// A one-device pool under `dir/SECRET_DIR`, with a file and a snapshot.
fn make(dir: &Path) -> Arc<Fs> {
    let base = dir.join(SECRET_DIR);
    std::fs::create_dir_all(base.join("dev")).unwrap();
    let mut o = MkfsOptions {
        sparse: true,
        ..MkfsOptions::default()
    };
    o.devices.push(DeviceSpec::tier(
        DeviceClass::Ssd,
        base.join("dev"),
        Some(64 * MIB),
    ));
    mkfs(&base.join("pool"), o).unwrap();
    let fs =
        Fs::open(Pool::open(&base.join("pool"), Some(PoolConfig::default())).unwrap()).unwrap();
    let f = fs.create(Ctx::ROOT, ROOT_INO, b"f", 0o644).unwrap();
    fs.write(f.ino, 0, &[7u8; 1 << 20]).unwrap();
    fs.flush().unwrap();
    fs.snapshot_create(SECRET_SNAP, cairn_fs::SnapshotKind::Named)
        .unwrap();
    fs
}

fn opts(detail: bool, token: Option<cairn_http::Token>) -> cairn_http::Options {
    cairn_http::Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        allow_remote: false,
        scan_interval: Duration::from_secs(3600),
        detail,
        token,
    }
}

/// (status, head, body) of `GET path` with these extra header lines, or
/// an error when the server does not answer within `limit`.
fn get(
    addr: SocketAddr,
    path: &str,
    auth: &str,
    limit: Duration,
) -> std::io::Result<(u16, String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, limit)?;
    s.set_read_timeout(Some(limit))?;
    s.set_write_timeout(Some(limit))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n{auth}\r\n")?;
    let mut r = Vec::new();
    s.read_to_end(&mut r)?;
    let r = String::from_utf8_lossy(&r).to_string();
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
    let status = head.split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0);
    Ok((status, head.to_string(), body.to_string()))
}

fn get_ok(addr: SocketAddr, path: &str, auth: &str) -> (u16, String, String) {
    get(addr, path, auth, Duration::from_secs(10)).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// A client with a 4 KiB receive buffer that pipelines `n` GETs of
/// /metrics (from a thread: its writes block once the server stops
/// reading) and never reads an answer. Kept open while the value lives.
fn stalled_client(addr: SocketAddr, n: usize) -> socket2::Socket {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.connect(&addr.into()).unwrap();
    let mut w = s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    std::thread::spawn(move || {
        let req = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
        for _ in 0..n {
            if w.write_all(req).is_err() {
                return;
            }
        }
    });
    s
}

#[test]
fn a_client_that_never_reads_stalls_neither_scrapes_nor_shutdown() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let fs = make(d.path());
    let srv = cairn_http::serve(fs.clone(), opts(false, None), Vec::new()).unwrap();
    let addr = srv.addr();
    let bad = stalled_client(addr, 2000);
    // Let the server fill the bad client's window and block on it.
    std::thread::sleep(Duration::from_secs(2));
    for k in 0..5 {
        let t0 = Instant::now();
        let r = get(addr, "/metrics", "", Duration::from_secs(3));
        let (st, _, body) = r.unwrap_or_else(|e| panic!("scrape {k} while a client stalls: {e}"));
        assert_eq!(st, 200);
        assert!(body.contains("cairn_tid"), "{body}");
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "scrape {k} took {:?}",
            t0.elapsed()
        );
    }
    // Shutdown returns while the bad client is still connected.
    let (tx, rx) = std::sync::mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        srv.shutdown();
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(5)).is_ok(),
        "Server::shutdown still blocked after 5 s by a client that does not read"
    );
    eprintln!("shutdown took {:?} with the client connected", t0.elapsed());
    drop(bad);
    fs.shutdown().unwrap();
}

/// The routes anyone on the host may read.
const PUBLIC: &[&str] = &[
    "/",
    "/dashboard.js",
    "/dashboard.css",
    "/metrics",
    "/api/metrics",
    "/api/heatmap",
];
/// The routes that give paths and names.
const DETAIL: &[&str] = &["/api/info", "/api/tier", "/api/snapshots", "/api/history"];

#[test]
fn public_routes_carry_no_path_or_name_and_detail_is_off_by_default() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let fs = make(d.path());
    let srv = cairn_http::serve(fs.clone(), opts(false, None), Vec::new()).unwrap();
    let addr = srv.addr();
    std::thread::sleep(Duration::from_millis(500));
    let tmp = d.path().display().to_string();
    for p in PUBLIC {
        let (st, _, body) = get_ok(addr, p, "");
        assert_eq!(st, 200, "{p}");
        for secret in [SECRET_DIR, SECRET_SNAP, tmp.as_str()] {
            assert!(!body.contains(secret), "{p} gives {secret:?}:\n{body}");
        }
    }
    for p in DETAIL {
        let (st, _, body) = get_ok(addr, p, "");
        assert_eq!(st, 403, "{p} without the detail switch: {body}");
        assert!(body.contains("metrics_detail"), "{body}");
        assert!(!body.contains(SECRET_DIR) && !body.contains(SECRET_SNAP));
    }
    srv.shutdown();
    // With the switch: the dashboard's details are there.
    let srv = cairn_http::serve(fs.clone(), opts(true, None), Vec::new()).unwrap();
    let addr = srv.addr();
    std::thread::sleep(Duration::from_millis(500));
    assert!(get_ok(addr, "/api/info", "").2.contains(SECRET_DIR));
    assert!(get_ok(addr, "/api/tier", "").2.contains(SECRET_DIR));
    assert!(get_ok(addr, "/api/snapshots", "").2.contains(SECRET_SNAP));
    // The history of a path, percent-encoded from the mount root.
    let (st, _, body) = get_ok(addr, "/api/history?path=%2Ff", "");
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("\"inode_changed\":false"), "{body}");
    assert_eq!(get_ok(addr, "/api/history?path=nothing", "").0, 404);
    assert_eq!(get_ok(addr, "/api/history?path=%zz", "").0, 400);
    srv.shutdown();
    fs.shutdown().unwrap();
}

fn token_file(dir: &Path, mode: u32, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(format!("token.{mode:o}"));
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

#[test]
fn every_route_wants_the_token_when_one_is_set() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let fs = make(d.path());
    // A token file others may read is refused, and so is an empty one;
    // the errors do not carry the token.
    let secret = "s3cr3t-t0ken-value";
    let wide = token_file(d.path(), 0o644, secret);
    let e = cairn_http::Token::from_file(&wide).unwrap_err().to_string();
    assert!(e.contains("chmod 600") && !e.contains(secret), "{e}");
    let empty = token_file(d.path(), 0o600, " \n");
    let e = cairn_http::Token::from_file(&empty)
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty"), "{e}");
    let ok = token_file(d.path(), 0o400, &format!("{secret}\n"));
    let token = cairn_http::Token::from_file(&ok).unwrap();
    assert!(!format!("{token:?}").contains(secret));
    let srv = cairn_http::serve(fs.clone(), opts(true, Some(token)), Vec::new()).unwrap();
    let addr = srv.addr();
    let basic = |user: &str, pass: &str| {
        use base64::Engine;
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        format!("Authorization: Basic {b}\r\n")
    };
    for p in PUBLIC.iter().chain(DETAIL) {
        for bad in [
            String::new(),
            "Authorization: Bearer wrong\r\n".to_string(),
            format!("Authorization: Bearer {secret}x\r\n"),
            format!("Authorization: Bearer {}\r\n", &secret[1..]),
            format!("Authorization: Token {secret}\r\n"),
            basic("cairn", "wrong"),
        ] {
            let (st, head, body) = get_ok(addr, p, &bad);
            assert_eq!(st, 401, "{p} with {bad:?}");
            assert!(
                head.to_ascii_lowercase()
                    .contains("www-authenticate: basic"),
                "{head}"
            );
            assert!(!body.contains(secret) && !body.contains(SECRET_DIR));
        }
        let (st, _, _) = get_ok(addr, p, &format!("Authorization: Bearer {secret}\r\n"));
        assert_eq!(st, 200, "{p} with the token");
        // A browser's prompt: any user name, the token as password.
        assert_eq!(get_ok(addr, p, &basic("admin", secret)).0, 200, "{p}");
    }
    srv.shutdown();
    fs.shutdown().unwrap();
}
