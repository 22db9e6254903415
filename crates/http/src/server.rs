//! The listener (tiny_http, one thread) and its routes. Every route only
//! reads; methods other than GET and HEAD are answered 405.

use crate::error::HttpError;
use crate::metrics::{collect, text};
use crate::scan::ScanCache;
use crate::ExtraFn;
use cairn_fs::Fs;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tiny_http::{Header, Method, Request, Response};

const INDEX: &str = include_str!("web/index.html");
const SCRIPT: &str = include_str!("web/dashboard.js");
const STYLE: &str = include_str!("web/dashboard.css");
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Where and how to serve.
pub struct Options {
    pub addr: SocketAddr,
    /// Serve on an address that is not loopback.
    pub allow_remote: bool,
    /// Between scans of the pool (`scan.rs`).
    pub scan_interval: Duration,
}

/// A running server; `shutdown` stops its threads.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    http: Arc<tiny_http::Server>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// The address bound (the port when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn shutdown(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.http.unblock();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Everything a request handler reads.
struct Ctx {
    fs: Arc<Fs>,
    scan: Arc<ScanCache>,
    extra: Vec<ExtraFn>,
}

/// Binds `opts.addr` (refusing one that is not loopback unless allowed)
/// and serves until `shutdown`.
pub fn serve(fs: Arc<Fs>, opts: Options, extra: Vec<ExtraFn>) -> Result<Server, HttpError> {
    if !opts.addr.ip().is_loopback() {
        if !opts.allow_remote {
            return Err(HttpError::NotLoopback(opts.addr));
        }
        tracing::warn!(
            "metrics and dashboard on {}, reachable from other hosts without authentication",
            opts.addr
        );
    }
    let http = tiny_http::Server::http(opts.addr)
        .map_err(|e| HttpError::Bind(opts.addr, e.to_string()))?;
    let addr = http.server_addr().to_ip().unwrap_or(opts.addr);
    let http = Arc::new(http);
    let stop = Arc::new(AtomicBool::new(false));
    let scan = Arc::new(ScanCache::default());
    let t1 = crate::scan::spawn(fs.clone(), scan.clone(), opts.scan_interval, stop.clone())?;
    let ctx = Ctx { fs, scan, extra };
    let (h, s) = (http.clone(), stop.clone());
    let t2 = std::thread::Builder::new()
        .name("cairn-http".into())
        .spawn(move || run(&h, &s, &ctx))?;
    tracing::info!("metrics on http://{addr}/metrics, dashboard on http://{addr}/");
    Ok(Server {
        addr,
        stop,
        http,
        threads: vec![t1, t2],
    })
}

fn run(http: &tiny_http::Server, stop: &AtomicBool, ctx: &Ctx) {
    while !stop.load(Ordering::Relaxed) {
        match http.recv_timeout(Duration::from_millis(500)) {
            Ok(Some(req)) => answer(req, ctx),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!("metrics: accepting a request: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn header(k: &str, v: &str) -> Header {
    Header::from_bytes(k.as_bytes(), v.as_bytes()).expect("a valid header")
}

fn answer(req: Request, ctx: &Ctx) {
    if !matches!(req.method(), Method::Get | Method::Head) {
        let r = Response::from_string("read-only: GET only\n")
            .with_status_code(405)
            .with_header(header("Allow", "GET, HEAD"));
        let _ = req.respond(r);
        return;
    }
    let (path, query) = req.url().split_once('?').unwrap_or((req.url(), ""));
    let (path, query) = (path.to_string(), query.to_string());
    let (status, ctype, body) = route(&path, &query, ctx);
    // The page loads only its own script and style and runs no inline
    // script (a second wall behind the page's text-only insertion of data).
    let r = Response::from_string(body)
        .with_status_code(status)
        .with_header(header("Content-Type", ctype))
        .with_header(header("Cache-Control", "no-store"))
        .with_header(header("X-Content-Type-Options", "nosniff"))
        .with_header(header("Content-Security-Policy", CSP));
    let _ = req.respond(r);
}

/// The value of `key` in a query string `a=1&b=2`.
fn param<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn route(path: &str, query: &str, ctx: &Ctx) -> (u16, &'static str, String) {
    let js = |v: Value| (200, "application/json", v.to_string());
    match path {
        "/" | "/index.html" => (200, "text/html; charset=utf-8", INDEX.into()),
        "/dashboard.js" => (200, "text/javascript; charset=utf-8", SCRIPT.into()),
        "/dashboard.css" => (200, "text/css; charset=utf-8", STYLE.into()),
        "/metrics" => (
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            text(collect(&ctx.fs, &ctx.scan, &ctx.extra)),
        ),
        "/api/metrics" => js(json!(collect(&ctx.fs, &ctx.scan, &ctx.extra))),
        "/api/info" => js(info(ctx)),
        "/api/tier" => js(json!(ctx.fs.tier_status())),
        "/api/snapshots" => js(snapshots(&ctx.fs)),
        "/api/heatmap" => {
            let cells = param(query, "cells")
                .and_then(|c| c.parse().ok())
                .unwrap_or(cairn_fs::maintenance::heatmap::DEFAULT_CELLS);
            js(json!(ctx.fs.heat_map(cells)))
        }
        _ => (404, "text/plain", "not found\n".into()),
    }
}

/// The last scan (`cairn info --json`'s figures) and the cheap figures.
fn info(ctx: &Ctx) -> Value {
    let scan = ctx.scan.get();
    json!({
        "info": scan.as_ref().map(|(_, i)| json!(**i)),
        "scan_age_seconds": scan.map(|(t, _)| t.elapsed().as_secs_f64()),
        "stats": ctx.fs.service_stats().ok(),
    })
}

fn snapshots(fs: &Fs) -> Value {
    let list = fs.snapshots().unwrap_or_default();
    let v: Vec<Value> = list
        .iter()
        .map(|s| {
            json!({
                "name": s.name, "tid": s.tid, "time_ns": s.time_ns,
                "auto": s.kind == cairn_fs::SnapshotKind::Auto,
                "files": s.files, "bytes": s.bytes,
            })
        })
        .collect();
    json!(v)
}
