//! TLS for NBD over TCP (NBD_OPT_STARTTLS): the server's rustls config
//! from a directory of PEM files (X.509, client certificates REQUIRED and
//! checked against the directory's CA: mutual TLS is the access control),
//! `init_dir`, which writes such a directory (a CA, a server and a client
//! certificate with their keys, all 0600 in a 0700 directory, named as
//! libnbd's `tls-certificates=DIR` and qemu's `tls-creds-x509,dir=DIR`
//! expect), and the TLS stream a connection's reader and its workers
//! share (one session under a lock; the socket read without it).

use crate::error::NbdError;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::fs;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const CA_CERT: &str = "ca-cert.pem";
pub const CA_KEY: &str = "ca-key.pem";
pub const SERVER_CERT: &str = "server-cert.pem";
pub const SERVER_KEY: &str = "server-key.pem";
pub const CLIENT_CERT: &str = "client-cert.pem";
pub const CLIENT_KEY: &str = "client-key.pem";

/// The server side of NBD's TLS: who may connect is whoever holds a
/// client certificate signed by the CA.
#[derive(Clone)]
pub struct TlsConfig(Arc<rustls::ServerConfig>);

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsConfig(..)")
    }
}

fn file_err(path: &Path, why: impl ToString) -> NbdError {
    NbdError::TlsFile {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// Reads a PEM file of the directory; a key must not be readable by
/// anyone but its owner.
fn read_pem(dir: &Path, name: &str, secret: bool) -> Result<(PathBuf, Vec<u8>), NbdError> {
    let path = dir.join(name);
    let m = fs::metadata(&path).map_err(|e| file_err(&path, e))?;
    if secret && m.permissions().mode() & 0o077 != 0 {
        let mode = m.permissions().mode() & 0o777;
        return Err(file_err(
            &path,
            format!("mode {mode:o}: a key must be 0600"),
        ));
    }
    let b = fs::read(&path).map_err(|e| file_err(&path, e))?;
    Ok((path, b))
}

impl TlsConfig {
    /// The config of a directory holding ca-cert.pem, server-cert.pem
    /// and server-key.pem (see `init_dir`).
    pub fn from_dir(dir: &Path) -> Result<TlsConfig, NbdError> {
        let (ca_path, ca) = read_pem(dir, CA_CERT, false)?;
        let (cert_path, cert) = read_pem(dir, SERVER_CERT, false)?;
        let (key_path, key) = read_pem(dir, SERVER_KEY, true)?;
        let certs = |p: &Path, b: &[u8]| -> Result<Vec<CertificateDer<'static>>, NbdError> {
            let v: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(b).collect();
            let v = v.map_err(|e| file_err(p, e))?;
            if v.is_empty() {
                return Err(file_err(p, "no certificate in the file"));
            }
            Ok(v)
        };
        let ca = certs(&ca_path, &ca)?;
        let chain = certs(&cert_path, &cert)?;
        let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| file_err(&key_path, e))?;
        Self::new(ca, chain, key)
    }

    /// The config of a CA (whose client certificates are let in), the
    /// server's certificate chain and its key.
    pub fn new(
        ca: Vec<CertificateDer<'static>>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<TlsConfig, NbdError> {
        let tls = |e: &dyn std::fmt::Display| NbdError::Tls(e.to_string());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in ca {
            roots.add(c).map_err(|e| tls(&e))?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| tls(&e))?;
        let c = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| tls(&e))?;
        Ok(TlsConfig(Arc::new(c)))
    }
}

/// Writes a new CA, a server certificate (for `names`: host names and IP
/// addresses the clients connect to) and a client certificate, with their
/// keys, into `dir` (created 0700; every file 0600, written only if
/// absent: an existing file is an error, nothing is overwritten).
pub fn init_dir(dir: &Path, names: &[String]) -> Result<(), NbdError> {
    let gen = crate::tls_gen::generate(names)?;
    fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(dir)
        .map_err(|e| file_err(dir, e))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|e| file_err(dir, e))?;
    for (name, _) in &gen {
        let p = dir.join(name);
        if fs::symlink_metadata(&p).is_ok() {
            return Err(file_err(&p, "already exists (not overwritten)"));
        }
    }
    for (name, pem) in gen {
        let p = dir.join(name);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
            .map_err(|e| file_err(&p, e))?;
        f.write_all(pem.as_bytes()).map_err(|e| file_err(&p, e))?;
        f.sync_all().map_err(|e| file_err(&p, e))?;
    }
    Ok(())
}

/// Bytes read from the socket at most at once.
const RX: usize = 16 << 10;

/// A TLS session over a TCP socket, shared by clones: reads go to the
/// socket without the session's lock (one clone reads), writes encrypt
/// and send under it.
pub(crate) struct TlsStream {
    session: Arc<Mutex<rustls::ServerConnection>>,
    sock: TcpStream,
    /// Bytes read from the socket, `rx_pos..rx_len` not yet given to the
    /// session (it takes them a few KiB at a time, and only while no
    /// decrypted data waits: its buffer has a limit).
    rx: Vec<u8>,
    rx_pos: usize,
    rx_len: usize,
}

impl TlsStream {
    /// Runs the server's side of the TLS handshake on `sock` (bounded by
    /// the socket's timeouts); a client without a good certificate fails.
    pub fn accept(cfg: &TlsConfig, sock: TcpStream) -> Result<TlsStream, NbdError> {
        let mut c = rustls::ServerConnection::new(cfg.0.clone())
            .map_err(|e| NbdError::Tls(e.to_string()))?;
        let mut s = &sock;
        while c.is_handshaking() {
            c.complete_io(&mut s)
                .map_err(|e| NbdError::Tls(format!("handshake: {e}")))?;
        }
        Ok(TlsStream::with(Arc::new(Mutex::new(c)), sock))
    }

    fn with(session: Arc<Mutex<rustls::ServerConnection>>, sock: TcpStream) -> TlsStream {
        TlsStream {
            session,
            sock,
            rx: Vec::new(),
            rx_pos: 0,
            rx_len: 0,
        }
    }

    pub fn try_clone(&self) -> io::Result<TlsStream> {
        Ok(TlsStream::with(
            self.session.clone(),
            self.sock.try_clone()?,
        ))
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.sock
    }

    /// Gives the session some of the bytes read from the socket and
    /// sends what it has to say (alerts, tickets).
    fn feed(&mut self, c: &mut rustls::ServerConnection) -> io::Result<()> {
        let mut rd = &self.rx[self.rx_pos..self.rx_len];
        self.rx_pos += c.read_tls(&mut rd)?;
        if let Err(e) = c.process_new_packets() {
            // Tell the client why (an alert), then fail.
            let _ = c.write_tls(&mut &self.sock);
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        while c.wants_write() {
            c.write_tls(&mut &self.sock)?;
        }
        Ok(())
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let session = self.session.clone();
                let mut c = session.lock();
                match c.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    r => return r,
                }
                if self.rx_pos < self.rx_len {
                    self.feed(&mut c)?;
                    continue;
                }
            }
            // Nothing waits, decrypted or not: read the socket unlocked.
            self.rx.resize(RX, 0);
            let n = (&self.sock).read(&mut self.rx)?;
            if n == 0 {
                return Ok(0);
            }
            (self.rx_pos, self.rx_len) = (0, n);
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut c = self.session.lock();
        let n = c.writer().write(buf)?;
        while c.wants_write() {
            c.write_tls(&mut &self.sock)?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
