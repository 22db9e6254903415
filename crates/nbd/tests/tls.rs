//! NBD over TCP with TLS (NBD_OPT_STARTTLS, mutual X.509): the real
//! clients (nbdinfo, nbdcopy, qemu-io) connect with the directory that
//! `tls_init_dir` writes and read and write; a client that does not start
//! TLS gets NBD_REP_ERR_TLS_REQD for every option (nbdinfo without TLS
//! fails); a client whose certificate comes from another CA is refused;
//! a server without TLS must be told to allow plain TCP.

mod common;

use cairn_nbd::proto::*;
use cairn_nbd::{ServerConfig, TlsConfig};
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A fresh TLS directory for 127.0.0.1 and localhost.
fn tls_dir(parent: &Path, name: &str) -> PathBuf {
    let d = parent.join(name);
    let names = ["127.0.0.1".to_string(), "localhost".to_string()];
    cairn_nbd::tls_init_dir(&d, &names).expect("tls dir");
    d
}

fn tls_server(dir: &Path) -> cairn_nbd::Server {
    let (_, ex) = disk_exports();
    let cfg = ServerConfig {
        tls: Some(TlsConfig::from_dir(dir).expect("tls config")),
        ..ServerConfig::default()
    };
    start_tcp(ex, cfg)
}

fn tls_uri(s: &cairn_nbd::Server, export: &str, dir: &Path) -> String {
    let a = tcp_addr(s);
    format!("nbds://{a}/{export}?tls-certificates={}", dir.display())
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_tls_directory_is_private_and_never_overwritten() {
    let t = tempfile::tempdir().unwrap();
    let d = tls_dir(t.path(), "tls");
    assert_eq!(mode(&d), 0o700);
    for f in [
        "ca-cert.pem",
        "ca-key.pem",
        "server-cert.pem",
        "server-key.pem",
    ] {
        assert_eq!(mode(&d.join(f)), 0o600, "{f}");
    }
    for f in ["client-cert.pem", "client-key.pem"] {
        assert_eq!(mode(&d.join(f)), 0o600, "{f}");
    }
    let before = std::fs::read(d.join("server-key.pem")).unwrap();
    let again = cairn_nbd::tls_init_dir(&d, &["127.0.0.1".into()]);
    assert!(again.is_err(), "a second init must not overwrite");
    assert_eq!(std::fs::read(d.join("server-key.pem")).unwrap(), before);
    // A key others can read is refused.
    std::fs::set_permissions(d.join("server-key.pem"), PermissionsExt::from_mode(0o644)).unwrap();
    let e = TlsConfig::from_dir(&d).unwrap_err().to_string();
    assert!(e.contains("server-key.pem") && e.contains("0600"), "{e}");
}

#[test]
fn plain_tcp_needs_tls_or_an_explicit_insecure() {
    let (_, ex) = disk_exports();
    let addr = "127.0.0.1:0".parse().unwrap();
    let r = cairn_nbd::serve_tcp(addr, std::sync::Arc::new(ex), ServerConfig::default());
    assert!(matches!(r, Err(cairn_nbd::NbdError::PlainTcpRefused)));
}

#[test]
fn nbdinfo_nbdcopy_and_qemu_io_work_over_tls() {
    let t = tempfile::tempdir().unwrap();
    let d = tls_dir(t.path(), "tls");
    let s = tls_server(&d);
    let out = run_ok("nbdinfo", &["--size", &tls_uri(&s, "disk", &d)]);
    assert_eq!(out.trim(), SIZE.to_string());
    let a = tcp_addr(&s);
    let obj = format!("tls-creds-x509,id=tls0,dir={},endpoint=client", d.display());
    let img = format!(
        "driver=nbd,server.type=inet,server.host={},server.port={},export=disk,tls-creds=tls0",
        a.ip(),
        a.port()
    );
    let qemu = |cmd: &str| {
        run_ok(
            "qemu-io",
            &["--object", &obj, "--image-opts", &img, "-c", cmd],
        )
    };
    qemu("write -P 0xab 1M 64k");
    let out = qemu("read -P 0xab 1M 64k");
    assert!(out.contains("read 65536/65536"), "{out}");
    let copy = t.path().join("copy.img");
    run_ok(
        "nbdcopy",
        &[&tls_uri(&s, "disk", &d), copy.to_str().unwrap()],
    );
    let b = std::fs::read(&copy).unwrap();
    assert_eq!(b.len() as u64, SIZE);
    assert!(b[1 << 20..(1 << 20) + 65536].iter().all(|&x| x == 0xab));
    assert!(b[..1 << 20].iter().all(|&x| x == 0));
    // A whole image in (many large writes in flight on several
    // connections), then out again.
    let input = t.path().join("in.img");
    let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    let (i, c) = (input.to_str().unwrap(), copy.to_str().unwrap());
    run_ok("nbdcopy", &["--flush", i, &tls_uri(&s, "disk", &d)]);
    run_ok("nbdcopy", &[&tls_uri(&s, "disk", &d), c]);
    assert!(
        std::fs::read(&copy).unwrap() == data,
        "nbdcopy over TLS in and out"
    );
    assert!(s.stats().command("write").count >= 2);
}

#[test]
fn a_client_without_tls_gets_tls_reqd_for_every_option() {
    let t = tempfile::tempdir().unwrap();
    let d = tls_dir(t.path(), "tls");
    let s = tls_server(&d);
    let mut c = Client::tcp(tcp_addr(&s));
    c.greet();
    for (opt, data) in [
        (OPT_LIST, Vec::new()),
        (OPT_GO, info_data("disk", &[])),
        (OPT_INFO, info_data("disk", &[])),
        (OPT_STRUCTURED_REPLY, Vec::new()),
        (OPT_LIST_META_CONTEXT, meta_data("disk", &[])),
    ] {
        let r = c.option(opt, &data);
        assert_eq!(r.len(), 1, "{opt}: {r:?}");
        assert_eq!(r[0].0, REP_ERR_TLS_REQD, "option {opt}");
    }
    // NBD_OPT_EXPORT_NAME has no error reply: the server closes.
    c.send_option(OPT_EXPORT_NAME, b"disk");
    let mut b = [0u8; 1];
    assert!(matches!(
        std::io::Read::read(&mut c.s, &mut b),
        Ok(0) | Err(_)
    ));
    // Real clients without TLS are refused too.
    let a = tcp_addr(&s);
    let o = run("nbdinfo", &["--list", &format!("nbd://{a}")]);
    assert!(!o.status.success(), "nbdinfo --list without TLS worked");
    let o = run("nbdinfo", &["--size", &format!("nbd://{a}/disk")]);
    assert!(!o.status.success(), "nbdinfo without TLS worked");
    assert_eq!(s.stats().command("read").count, 0);
}

#[test]
fn a_client_certificate_from_another_ca_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let d = tls_dir(t.path(), "tls");
    let other = tls_dir(t.path(), "other");
    // Trusts the server's CA, but holds a client certificate of another.
    let mixed = t.path().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    std::fs::copy(d.join("ca-cert.pem"), mixed.join("ca-cert.pem")).unwrap();
    for f in ["client-cert.pem", "client-key.pem"] {
        std::fs::copy(other.join(f), mixed.join(f)).unwrap();
    }
    let s = tls_server(&d);
    let o = run("nbdinfo", &["--size", &tls_uri(&s, "disk", &mixed)]);
    assert!(!o.status.success(), "a foreign client certificate got in");
    // The same client with the right certificate gets in.
    for f in ["client-cert.pem", "client-key.pem"] {
        std::fs::copy(d.join(f), mixed.join(f)).unwrap();
    }
    run_ok("nbdinfo", &["--size", &tls_uri(&s, "disk", &mixed)]);
    // No client certificate at all: refused.
    std::fs::remove_file(mixed.join("client-cert.pem")).unwrap();
    std::fs::remove_file(mixed.join("client-key.pem")).unwrap();
    let o = run("nbdinfo", &["--size", &tls_uri(&s, "disk", &mixed)]);
    assert!(!o.status.success(), "a client without a certificate got in");
    assert!(s.stats().handshake_failures >= 2);
}
