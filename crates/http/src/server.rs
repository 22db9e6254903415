//! The listener: hyper (HTTP/1.1) on a current-thread tokio runtime of
//! its own thread, so that a slow or stalled client costs a task, not the
//! server. Each connection has a header-read timeout, a bounded buffer (a
//! client that pipelines without reading stops being read) and a lifetime
//! cap; at most `MAX_CONNECTIONS` are open (more are closed at once).
//! Requests are answered on at most two blocking threads (they read the
//! pool). `shutdown` drops every connection, whatever its client does.

use crate::auth::Token;
use crate::error::HttpError;
use crate::routes::{answer, Ctx, Reply, CSP};
use crate::scan::ScanCache;
use crate::ExtraFn;
use bytes::Bytes;
use cairn_fs::Fs;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::{oneshot, Semaphore};

/// Connections served at once; more are closed when accepted.
const MAX_CONNECTIONS: usize = 64;
/// Time a client has to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a connection may stay open, whatever it does (keep-alive
/// clients reconnect).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// Read and write buffer of a connection: pipelined requests beyond it
/// wait until the client reads the answers.
const MAX_BUF: usize = 64 << 10;
/// Time `shutdown` gives requests being answered.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Where and how to serve.
pub struct Options {
    pub addr: SocketAddr,
    /// Serve on an address that is not loopback.
    pub allow_remote: bool,
    /// Between scans of the pool (`scan.rs`).
    pub scan_interval: Duration,
    /// Serve the routes that give paths and names (`/api/info`,
    /// `/api/tier`, `/api/snapshots`); off: 403.
    pub detail: bool,
    /// Required on every route when set (401 without it).
    pub token: Option<Token>,
}

/// A running server; `shutdown` stops its threads.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    quit: Option<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// The address bound (the port when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving: open connections are dropped, not waited for.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(q) = self.quit.take() {
            let _ = q.send(());
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Refuses an address that is not loopback unless allowed.
fn check_addr(opts: &Options) -> Result<(), HttpError> {
    if opts.addr.ip().is_loopback() {
        return Ok(());
    }
    if !opts.allow_remote {
        return Err(HttpError::NotLoopback(opts.addr));
    }
    if opts.token.is_none() {
        tracing::warn!(
            "metrics and dashboard on {}, reachable from other hosts without authentication",
            opts.addr
        );
    }
    Ok(())
}

/// Binds `opts.addr` (refusing one that is not loopback unless allowed)
/// and serves until `shutdown`.
pub fn serve(fs: Arc<Fs>, opts: Options, extra: Vec<ExtraFn>) -> Result<Server, HttpError> {
    check_addr(&opts)?;
    let bind = |e: std::io::Error| HttpError::Bind(opts.addr, e.to_string());
    let listener = std::net::TcpListener::bind(opts.addr).map_err(bind)?;
    listener.set_nonblocking(true).map_err(bind)?;
    let addr = listener.local_addr().map_err(bind)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(2)
        .thread_name("cairn-http-req")
        .build()?;
    let (detail, token) = (opts.detail, opts.token.is_some());
    let stop = Arc::new(AtomicBool::new(false));
    let scan = Arc::new(ScanCache::default());
    let t1 = crate::scan::spawn(fs.clone(), scan.clone(), opts.scan_interval, stop.clone())?;
    let ctx = Arc::new(Ctx {
        fs,
        scan,
        extra,
        detail: opts.detail,
        token: opts.token,
    });
    let (quit, quit_rx) = oneshot::channel();
    let t2 = std::thread::Builder::new()
        .name("cairn-http".into())
        .spawn(move || run(rt, listener, ctx, quit_rx))?;
    tracing::info!(
        "metrics on http://{addr}/metrics, dashboard on http://{addr}/ (detailed API {}, token {})",
        if detail { "on" } else { "off" },
        if token { "required" } else { "none" }
    );
    Ok(Server {
        addr,
        stop,
        quit: Some(quit),
        threads: vec![t1, t2],
    })
}

/// The server thread: accepts until told to quit, then drops the runtime
/// and with it every connection (requests being answered get a grace).
fn run(
    rt: tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    ctx: Arc<Ctx>,
    quit: oneshot::Receiver<()>,
) {
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("metrics: listening: {e}");
                return;
            }
        };
        tokio::select! {
            _ = accept(listener, ctx) => {}
            _ = quit => {}
        }
    });
    rt.shutdown_timeout(SHUTDOWN_GRACE);
}

async fn accept(listener: tokio::net::TcpListener, ctx: Arc<Ctx>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::warn!("metrics: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!("metrics: {MAX_CONNECTIONS} connections open, closing one from {peer}");
            continue;
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            connection(stream, ctx).await;
            drop(slot);
        });
    }
}

/// Serves one connection until its client closes it, a timeout, or its
/// lifetime is over.
async fn connection(stream: tokio::net::TcpStream, ctx: Arc<Ctx>) {
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |req| handle(req, ctx.clone()));
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .title_case_headers(true)
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_BUF)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("metrics: connection: {e}"),
        Err(_) => tracing::debug!("metrics: a connection reached its lifetime, closed"),
    }
}

/// Answers on a blocking thread (the routes read the pool).
async fn handle(
    req: Request<Incoming>,
    ctx: Arc<Ctx>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, _body) = req.into_parts();
    let reply = tokio::task::spawn_blocking(move || answer(&parts, &ctx)).await;
    let reply = reply.unwrap_or_else(|e| {
        tracing::warn!("metrics: answering a request: {e}");
        Reply::text(500, "internal error\n")
    });
    Ok(response(reply))
}

/// The HTTP response of a reply, with the headers every answer has. The
/// page loads only its own script and style and runs no inline script (a
/// second wall behind the page's text-only insertion of data).
fn response(r: Reply) -> Response<Full<Bytes>> {
    let mut b = Response::builder()
        .status(r.status)
        .header("Content-Type", r.ctype)
        .header("Cache-Control", "no-store")
        .header("X-Content-Type-Options", "nosniff")
        .header("Content-Security-Policy", CSP);
    for (k, v) in r.headers {
        b = b.header(k, v);
    }
    b.body(Full::new(Bytes::from(r.body))).unwrap_or_else(|e| {
        tracing::warn!("metrics: building a response: {e}");
        let mut resp = Response::new(Full::new(Bytes::from_static(b"internal error\n")));
        *resp.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        resp
    })
}
