//! What each request gets: the token check (401 on every route when a
//! token is set), GET and HEAD only (405 otherwise), then the route. The
//! routes that give paths and names (`DETAIL`, the history of a path
//! among them) answer 403 unless the admin turned the detailed API on;
//! the others give only figures.

use crate::auth::Token;
use crate::metrics::{collect, text};
use crate::scan::ScanCache;
use crate::ExtraFn;
use cairn_fs::Fs;
use hyper::http::request::Parts;
use hyper::{header, Method};
use serde_json::{json, Value};
use std::sync::Arc;

const INDEX: &str = include_str!("web/index.html");
const SCRIPT: &str = include_str!("web/dashboard.js");
const STYLE: &str = include_str!("web/dashboard.css");
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
/// Routes that give the pool's and devices' paths, snapshot names, and
/// what a path's history says about it.
pub const DETAIL: &[&str] = &["/api/info", "/api/tier", "/api/snapshots", "/api/history"];

/// Everything a request handler reads.
pub(crate) struct Ctx {
    pub fs: Arc<Fs>,
    pub scan: Arc<ScanCache>,
    pub extra: Vec<ExtraFn>,
    pub detail: bool,
    pub token: Option<Token>,
}

/// An answer before headers common to all are added.
pub(crate) struct Reply {
    pub status: u16,
    pub ctype: &'static str,
    pub body: String,
    /// Extra headers (static names and values).
    pub headers: Vec<(&'static str, &'static str)>,
}

impl Reply {
    fn new(status: u16, ctype: &'static str, body: impl Into<String>) -> Reply {
        Reply {
            status,
            ctype,
            body: body.into(),
            headers: Vec::new(),
        }
    }

    pub(crate) fn text(status: u16, body: &str) -> Reply {
        Reply::new(status, "text/plain; charset=utf-8", body)
    }
}

/// The reply to a request (its body is not read: GET and HEAD have none).
pub(crate) fn answer(req: &Parts, ctx: &Ctx) -> Reply {
    if let Some(t) = &ctx.token {
        let auth = req.headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
        if !t.admits(auth) {
            let mut r = Reply::text(401, "a token is required: Authorization: Bearer TOKEN\n");
            r.headers.push((
                "WWW-Authenticate",
                "Basic realm=\"cairn\", charset=\"UTF-8\"",
            ));
            r.headers
                .push(("WWW-Authenticate", "Bearer realm=\"cairn\""));
            return r;
        }
    }
    if req.method != Method::GET && req.method != Method::HEAD {
        let mut r = Reply::text(405, "read-only: GET only\n");
        r.headers.push(("Allow", "GET, HEAD"));
        return r;
    }
    let path = req.uri.path();
    if !ctx.detail && DETAIL.contains(&path) {
        return Reply::text(
            403,
            "the detailed API (paths and names) is off: metrics_detail = true in cairn.toml \
             or --metrics-detail turns it on\n",
        );
    }
    route(path, req.uri.query().unwrap_or(""), ctx)
}

/// The value of `key` in a query string `a=1&b=2`.
fn param<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn route(path: &str, query: &str, ctx: &Ctx) -> Reply {
    let js = |v: Value| Reply::new(200, "application/json", v.to_string());
    match path {
        "/" | "/index.html" => Reply::new(200, "text/html; charset=utf-8", INDEX),
        "/dashboard.js" => Reply::new(200, "text/javascript; charset=utf-8", SCRIPT),
        "/dashboard.css" => Reply::new(200, "text/css; charset=utf-8", STYLE),
        "/metrics" => Reply::new(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            text(collect(&ctx.fs, &ctx.scan, &ctx.extra)),
        ),
        "/api/metrics" => js(json!(collect(&ctx.fs, &ctx.scan, &ctx.extra))),
        "/api/info" => js(info(ctx)),
        "/api/tier" => js(json!(ctx.fs.tier_status())),
        "/api/snapshots" => js(snapshots(&ctx.fs)),
        "/api/history" => history(&ctx.fs, query),
        "/api/heatmap" => {
            let cells = param(query, "cells")
                .and_then(|c| c.parse().ok())
                .unwrap_or(cairn_fs::maintenance::heatmap::DEFAULT_CELLS);
            js(json!(ctx.fs.heat_map(cells)))
        }
        _ => Reply::text(404, "not found\n"),
    }
}

/// `/api/history?path=P[&inode=1]`: the versions of path P (from the
/// mount root, percent-encoded; none: the root), as `cairn history P
/// --json` gives them; 404 with the reason when it has none.
fn history(fs: &Fs, query: &str) -> Reply {
    let Some(path) = percent_decode(param(query, "path").unwrap_or("")) else {
        return Reply::text(400, "path: bad percent-encoding\n");
    };
    let inode = param(query, "inode") == Some("1");
    match fs.path_history(&path, inode) {
        Ok(v) => Reply::new(200, "application/json", json!(v).to_string()),
        Err(e) => Reply::text(404, &format!("{e}\n")),
    }
}

/// A query value's bytes: `%XX` escapes decoded, `+` a space (as forms
/// send it); None for a malformed escape.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut b = s.bytes();
    while let Some(c) = b.next() {
        out.push(match c {
            b'%' => {
                let hi = char::from(b.next()?).to_digit(16)?;
                let lo = char::from(b.next()?).to_digit(16)?;
                u8::try_from(hi * 16 + lo).ok()?
            }
            b'+' => b' ',
            c => c,
        });
    }
    Some(out)
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

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(
            percent_decode("%2Fa%20b+c").as_deref(),
            Some(&b"/a b c"[..])
        );
        assert_eq!(percent_decode("%ff%00").as_deref(), Some(&[0xff, 0][..]));
        assert_eq!(percent_decode("x%2"), None);
        assert_eq!(percent_decode("%+f"), None);
        assert_eq!(percent_decode("%zz"), None);
    }
}
