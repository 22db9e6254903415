//! The listener: TCP (loopback unless `allow_remote`; TLS required
//! unless `insecure_tcp`) or a Unix socket created 0600; a thread per
//! connection for the handshake and the request reader; one adaptive
//! worker pool and one memory budget shared by all connections; a
//! shutdown handle that closes the listener and every connection.

use crate::budget::Budget;
use crate::conn::{transmission, FlightLimits, Shared};
use crate::error::NbdError;
use crate::export::Exports;
use crate::handshake::{greet, options, Negotiated, Outcome, TlsMode};
use crate::stats::{Counters, Stats};
use crate::tls::{TlsConfig, TlsStream};
use cairn_workpool::Pool;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How a server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub pool: cairn_workpool::Config,
    /// Allows a TCP address that is not loopback (logged as a warning).
    pub allow_remote: bool,
    /// A client must finish its handshake within this time.
    pub handshake_timeout: Duration,
    /// Each connection's share of the budget.
    pub flight: FlightLimits,
    /// Bytes of READ and WRITE payloads in flight across all connections
    /// (at least one largest request, 32 MiB).
    pub budget: u64,
    /// A WRITE's payload must arrive within this time of its header, and
    /// a reply must be taken by the client within it: else the
    /// connection is closed (its memory given back).
    pub io_timeout: Duration,
    /// TLS for TCP clients (NBD_OPT_STARTTLS, client certificates).
    pub tls: Option<TlsConfig>,
    /// Serves TCP without TLS (any local user can connect). Without it
    /// and without `tls`, `serve_tcp` refuses to start.
    pub insecure_tcp: bool,
    /// Called on a connection's thread after it closed: e.g. to have the
    /// allocator return the pages its buffers held.
    pub after_close: Option<fn()>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            pool: cairn_workpool::Config {
                name: "cairn-nbd".into(),
                ..Default::default()
            },
            allow_remote: false,
            handshake_timeout: Duration::from_secs(30),
            flight: FlightLimits::default(),
            budget: 256 << 20,
            io_timeout: Duration::from_secs(30),
            tls: None,
            insecure_tcp: false,
            after_close: None,
        }
    }
}

/// A connected socket of any kind.
pub(crate) enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(TlsStream),
}

impl Sock {
    fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
            Sock::Tls(s) => Sock::Tls(s.try_clone()?),
        })
    }

    /// Shuts both directions down: blocked reads and writes return.
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
            Sock::Tls(s) => s.tcp().shutdown(Shutdown::Both),
        };
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_read_timeout(t),
            Sock::Unix(s) => s.set_read_timeout(t),
            Sock::Tls(s) => s.tcp().set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_write_timeout(t),
            Sock::Unix(s) => s.set_write_timeout(t),
            Sock::Tls(s) => s.tcp().set_write_timeout(t),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(b),
            Sock::Unix(s) => s.read(b),
            Sock::Tls(s) => s.read(b),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(b),
            Sock::Unix(s) => s.write(b),
            Sock::Tls(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// An open connection: a socket clone to shut it down, and its thread.
type ConnEntry = (Sock, Option<JoinHandle<()>>);

struct Inner {
    exports: Arc<dyn Exports>,
    pool: Pool,
    counters: Arc<Counters>,
    budget: Arc<Budget>,
    config: ServerConfig,
    address: Address,
    stop: AtomicBool,
    next_id: AtomicU64,
    /// The listening socket (a second descriptor of it), shut down to wake
    /// the acceptor.
    listening: std::os::fd::OwnedFd,
    /// Open connections: a socket clone (to shut down) and the thread.
    conns: Mutex<HashMap<u64, ConnEntry>>,
}

/// A running server; dropping it shuts it down.
pub struct Server {
    inner: Arc<Inner>,
    acceptor: Option<JoinHandle<()>>,
}

/// Stops a server from anywhere (a signal handler thread, a test).
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Inner>);

/// Serves `exports` on a TCP address; a non-loopback address is refused
/// unless `config.allow_remote`, plain TCP unless `config.insecure_tcp`
/// (give `config.tls`). Port 0 picks a free port (see `Server::address`).
pub fn serve_tcp(
    addr: SocketAddr,
    exports: Arc<dyn Exports>,
    config: ServerConfig,
) -> Result<Server, NbdError> {
    if config.tls.is_none() && !config.insecure_tcp {
        return Err(NbdError::PlainTcpRefused);
    }
    if !addr.ip().is_loopback() {
        if !config.allow_remote {
            return Err(NbdError::RemoteRefused(addr));
        }
        if config.tls.is_none() {
            tracing::warn!(
                "NBD server listening on non-loopback {addr}: no authentication, no TLS"
            );
        }
    }
    let l = TcpListener::bind(addr)?;
    let bound = l.local_addr()?;
    start(Listener::Tcp(l), Address::Tcp(bound), exports, config)
}

/// Serves `exports` on a Unix socket created with mode 0600. A stale
/// socket file (nobody listening) is replaced; a live one is an error.
pub fn serve_unix(
    path: &Path,
    exports: Arc<dyn Exports>,
    config: ServerConfig,
) -> Result<Server, NbdError> {
    let l = crate::unix::bind_private(path)?;
    let a = Address::Unix(path.to_path_buf());
    start(Listener::Unix(l, path.to_path_buf()), a, exports, config)
}

fn start(
    l: Listener,
    address: Address,
    exports: Arc<dyn Exports>,
    config: ServerConfig,
) -> Result<Server, NbdError> {
    let listening = match &l {
        Listener::Tcp(t) => std::os::fd::OwnedFd::from(t.try_clone()?),
        Listener::Unix(u, _) => std::os::fd::OwnedFd::from(u.try_clone()?),
    };
    let inner = Arc::new(Inner {
        listening,
        exports,
        pool: Pool::new(config.pool.clone()),
        counters: Arc::new(Counters::default()),
        budget: Arc::new(Budget::new(config.budget)),
        config,
        address,
        stop: AtomicBool::new(false),
        next_id: AtomicU64::new(0),
        conns: Mutex::new(HashMap::new()),
    });
    let i = inner.clone();
    let acceptor = std::thread::Builder::new()
        .name("cairn-nbd-accept".into())
        .spawn(move || accept_loop(&i, l))?;
    Ok(Server {
        inner,
        acceptor: Some(acceptor),
    })
}

fn accept_loop(inner: &Arc<Inner>, l: Listener) {
    loop {
        let sock = match &l {
            Listener::Tcp(t) => t.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Sock::Tcp(s)
            }),
            Listener::Unix(u, _) => u.accept().map(|(s, _)| Sock::Unix(s)),
        };
        if inner.stop.load(SeqCst) {
            break;
        }
        match sock {
            Ok(s) => {
                if let Err(e) = spawn_connection(inner, s) {
                    tracing::warn!("nbd: cannot start a connection: {e}");
                }
            }
            Err(e) => {
                tracing::warn!("nbd: accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    if let Listener::Unix(_, p) = &l {
        let _ = std::fs::remove_file(p);
    }
}

fn spawn_connection(inner: &Arc<Inner>, s: Sock) -> io::Result<()> {
    let id = inner.next_id.fetch_add(1, SeqCst);
    let keep = s.try_clone()?;
    let mut conns = inner.conns.lock();
    let i = inner.clone();
    let t = std::thread::Builder::new()
        .name(format!("cairn-nbd-conn-{id}"))
        .spawn(move || {
            connection(&i, s);
            i.conns.lock().remove(&id);
            if let Some(f) = i.config.after_close {
                f();
            }
        })?;
    conns.insert(id, (keep, Some(t)));
    Ok(())
}

/// One connection, handshake to close.
fn connection(inner: &Inner, s: Sock) {
    let c = &inner.counters;
    c.connections.fetch_add(1, SeqCst);
    c.open.fetch_add(1, SeqCst);
    if let Err(e) = handshake_and_serve(inner, s) {
        tracing::debug!("nbd connection closed: {e}");
    }
    c.open.fetch_sub(1, SeqCst);
}

/// A connection's reader (buffered) and writer.
type Halves = (BufReader<Sock>, Sock);

fn halves(s: &Sock) -> io::Result<Halves> {
    Ok((
        BufReader::with_capacity(256 << 10, s.try_clone()?),
        s.try_clone()?,
    ))
}

fn handshake_and_serve(inner: &Inner, s: Sock) -> Result<(), NbdError> {
    let c = &inner.config;
    s.set_read_timeout(Some(c.handshake_timeout))?;
    s.set_write_timeout(Some(c.handshake_timeout))?;
    let (neg, (mut r, w)) = handshake(inner, &s).inspect_err(|e| {
        inner.counters.handshake_failures.fetch_add(1, SeqCst);
        // Debug only: any local user can make these (counted in
        // handshake_failures), and a log line each would let them fill it.
        if matches!(e, NbdError::Tls(_) | NbdError::TlsRequired) {
            tracing::debug!("nbd: connection refused: {e}");
        }
    })?;
    s.set_read_timeout(None)?;
    s.set_write_timeout(Some(c.io_timeout))?;
    tracing::debug!("nbd client opened export {:?}", neg.name);
    let sh = Shared {
        pool: &inner.pool,
        counters: inner.counters.clone(),
        budget: inner.budget.clone(),
        limits: c.flight,
        io_timeout: c.io_timeout,
    };
    let r = transmission(&mut r, w, neg, &sh);
    s.shutdown();
    r
}

/// The handshake, with TLS first when the server requires it of TCP
/// clients; returns the export and the (maybe TLS) halves to serve it on.
fn handshake(inner: &Inner, s: &Sock) -> Result<(Negotiated, Halves), NbdError> {
    let (mut r, mut w) = halves(s)?;
    let no_zeroes = greet(&mut r, &mut w)?;
    let tls = match (s, &inner.config.tls) {
        (Sock::Tcp(t), Some(cfg)) => Some((t, cfg)),
        _ => None,
    };
    let mode = if tls.is_some() {
        TlsMode::Required
    } else {
        TlsMode::Off
    };
    let ex = &*inner.exports;
    let outcome = options(&mut r, &mut w, ex, no_zeroes, mode)?;
    match (outcome, tls) {
        (Outcome::Go(n), _) => Ok((n, (r, w))),
        (Outcome::StartTls, Some((t, cfg))) => {
            if !r.buffer().is_empty() {
                return Err(NbdError::Tls(
                    "client sent data before the TLS handshake".into(),
                ));
            }
            let t = Sock::Tls(TlsStream::accept(cfg, t.try_clone()?)?);
            let (mut r, mut w) = halves(&t)?;
            match options(&mut r, &mut w, ex, no_zeroes, TlsMode::Started)? {
                Outcome::Go(n) => Ok((n, (r, w))),
                Outcome::StartTls => Err(NbdError::Tls("STARTTLS twice".into())),
            }
        }
        (Outcome::StartTls, None) => Err(NbdError::Tls("STARTTLS while TLS is off".into())),
    }
}

impl Server {
    /// The address listened on (the bound port when 0 was asked for).
    pub fn address(&self) -> &Address {
        &self.inner.address
    }

    pub fn stats(&self) -> Stats {
        let b = &self.inner.budget;
        let mut s = self.inner.counters.snapshot(self.inner.pool.stats());
        (s.budget, s.bytes_in_flight, s.bytes_in_flight_peak) = (b.limit(), b.used(), b.peak());
        s
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.inner.clone())
    }

    /// Stops accepting, closes every connection (after the requests in
    /// flight finish) and waits for the threads.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        ShutdownHandle(self.inner.clone()).shutdown();
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        // Connections the acceptor started while the handle shut the
        // others down are shut down here.
        let threads: Vec<_> = {
            let mut conns = self.inner.conns.lock();
            conns.values().for_each(|(s, _)| s.shutdown());
            conns.values_mut().filter_map(|(_, t)| t.take()).collect()
        };
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

impl ShutdownHandle {
    /// Stops the listener and shuts every connection's socket down;
    /// `Server::shutdown` (or drop) then joins the threads.
    pub fn shutdown(&self) {
        let inner = &self.0;
        if inner.stop.swap(true, SeqCst) {
            return;
        }
        // Wake the acceptor with a connection of our own.
        let _ = match &inner.address {
            Address::Tcp(a) => {
                let mut a = *a;
                if a.ip().is_unspecified() {
                    a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                TcpStream::connect_timeout(&a, Duration::from_secs(1)).map(drop)
            }
            Address::Unix(p) => UnixStream::connect(p).map(drop),
        };
        // That connection cannot reach it when the socket's file is gone
        // (its directory removed); a listening socket shut down wakes its
        // accept as well.
        // SAFETY: shutdown(2) on a descriptor the server owns; no pointers.
        unsafe {
            use std::os::fd::AsRawFd;
            libc::shutdown(inner.listening.as_raw_fd(), libc::SHUT_RDWR);
        }
        for (s, _) in inner.conns.lock().values() {
            s.shutdown();
        }
    }

    pub fn is_shut_down(&self) -> bool {
        self.0.stop.load(SeqCst)
    }
}
