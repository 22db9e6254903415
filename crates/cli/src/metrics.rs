//! Wires the HTTP frontend (cairn-http: metrics and dashboard) into the
//! mount daemon, with the figures it cannot reach itself: the FUSE
//! frontend's request counters and latency histograms and the NBD
//! servers' per-command counts and worker pools.

use anyhow::{Context, Result};
use cairn_fs::{Fs, PoolConfig};
use cairn_http::{Kind, Sample, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The token of metrics_token_file, when the server runs and has one.
pub fn token(c: &PoolConfig) -> Result<Option<cairn_http::Token>> {
    if c.metrics_address()?.is_none() || c.metrics_token_file.is_empty() {
        return Ok(None);
    }
    let t = cairn_http::Token::from_file(Path::new(&c.metrics_token_file))?;
    Ok(Some(t))
}

/// Starts the server when the config asks for one (metrics_listen), and
/// turns on the FUSE counters.
pub fn start(
    fs: &Arc<Fs>,
    c: &PoolConfig,
    token: Option<cairn_http::Token>,
) -> Result<Option<cairn_http::Server>> {
    let Some(addr) = c.metrics_address()? else {
        return Ok(None);
    };
    cairn_fuse::metrics::enable();
    let opts = cairn_http::Options {
        addr,
        allow_remote: c.metrics_allow_remote,
        scan_interval: Duration::from_secs(c.metrics_scan_interval_secs),
        detail: c.metrics_detail,
        token,
    };
    let extra: Vec<cairn_http::ExtraFn> = vec![
        Box::new(logical_samples),
        Box::new(fuse_samples),
        Box::new(nbd_samples),
        Box::new(fuse_worker_samples),
    ];
    let s = cairn_http::serve(fs.clone(), opts, extra)
        .with_context(|| format!("metrics server on {addr}"))?;
    Ok(Some(s))
}

/// Logical bytes read and written through every frontend (FUSE and NBD).
fn logical_samples() -> Vec<Sample> {
    let f = cairn_fuse::metrics::snapshot();
    let (mut r, mut w) = (f.read_bytes, f.write_bytes);
    for (_, st) in crate::nbd::server_stats() {
        let bytes = |c: &str| st.commands.get(c).map_or(0, |c| c.bytes);
        r += bytes("read");
        w += bytes("write");
    }
    vec![
        Sample::new(
            "cairn_logical_read_bytes",
            "Bytes read by users (FUSE and NBD), before caches and dedup.",
            Kind::Counter,
            r as f64,
        ),
        Sample::new(
            "cairn_logical_written_bytes",
            "Bytes written by users (FUSE and NBD), before dedup and compression.",
            Kind::Counter,
            w as f64,
        ),
    ]
}

fn fuse_samples() -> Vec<Sample> {
    let s = cairn_fuse::metrics::snapshot();
    let mut v = vec![
        Sample::new(
            "cairn_fuse_read_bytes",
            "Bytes read through FUSE (logical).",
            Kind::Counter,
            s.read_bytes as f64,
        ),
        Sample::new(
            "cairn_fuse_write_bytes",
            "Bytes written through FUSE (logical).",
            Kind::Counter,
            s.write_bytes as f64,
        ),
    ];
    for o in &s.ops {
        v.push(
            Sample::new(
                "cairn_fuse_requests",
                "FUSE requests by operation.",
                Kind::Counter,
                o.count as f64,
            )
            .label("op", o.op),
        );
    }
    for o in s.ops {
        let mut h = Sample::new(
            "cairn_fuse_request_duration_seconds",
            "Time to serve a FUSE request, by operation.",
            Kind::Histogram,
            0.0,
        )
        .label("op", o.op);
        h.value = Value::Histogram {
            sum: o.sum_seconds,
            count: o.count,
            buckets: o.buckets,
        };
        v.push(h);
    }
    v
}

/// Per NBD server, labelled by its index in `cairn info`'s list (its
/// address may be a socket's path: not a label anyone may read).
fn nbd_samples() -> Vec<Sample> {
    let servers = crate::nbd::server_stats();
    let mut groups: [Vec<Sample>; 8] = Default::default();
    for (index, (_, st)) in servers.into_iter().enumerate() {
        let s = |name: &str, help: &str, k, x: u64| {
            Sample::new(name, help, k, x as f64).label("server", index)
        };
        for (cmd, c) in &st.commands {
            groups[0].push(
                s(
                    "cairn_nbd_requests",
                    "NBD requests by command.",
                    Kind::Counter,
                    c.count,
                )
                .label("command", cmd),
            );
            groups[1].push(
                s(
                    "cairn_nbd_bytes",
                    "NBD bytes moved by command (successes).",
                    Kind::Counter,
                    c.bytes,
                )
                .label("command", cmd),
            );
            groups[2].push(
                s(
                    "cairn_nbd_errors",
                    "NBD requests answered with an error, by command.",
                    Kind::Counter,
                    c.errors,
                )
                .label("command", cmd),
            );
        }
        groups[3].push(s(
            "cairn_nbd_connections_open",
            "Open NBD connections.",
            Kind::Gauge,
            st.connections_open,
        ));
        groups[4].push(s(
            "cairn_nbd_workers",
            "NBD worker threads alive.",
            Kind::Gauge,
            st.pool.workers,
        ));
        groups[5].push(s(
            "cairn_nbd_queued_jobs",
            "NBD jobs waiting for a worker.",
            Kind::Gauge,
            st.pool.queued,
        ));
        let mut h = s(
            "cairn_nbd_queue_wait_seconds",
            "Time NBD jobs waited for a worker.",
            Kind::Histogram,
            0,
        );
        h.value = queue_wait(&st.pool.queue_wait);
        groups[6].push(h);
        groups[7].push(s(
            "cairn_nbd_workers_busy",
            "NBD worker threads running a job.",
            Kind::Gauge,
            st.pool.busy,
        ));
    }
    groups.into_iter().flatten().collect()
}

/// The adaptive pool FUSE ring threads hand requests to (large reads and
/// writes, fsync), when the mount runs over io_uring.
fn fuse_worker_samples() -> Vec<Sample> {
    let Some(p) = cairn_fuse::workers::stats() else {
        return Vec::new();
    };
    let g = |name: &str, help: &str, x: u64| Sample::new(name, help, Kind::Gauge, x as f64);
    let mut h = Sample::new(
        "cairn_fuse_queue_wait_seconds",
        "Time FUSE requests handed off by ring threads waited for a worker.",
        Kind::Histogram,
        0.0,
    );
    h.value = queue_wait(&p.queue_wait);
    vec![
        g(
            "cairn_fuse_workers",
            "FUSE worker threads alive.",
            p.workers,
        ),
        g(
            "cairn_fuse_workers_busy",
            "FUSE worker threads running a request.",
            p.busy,
        ),
        g(
            "cairn_fuse_queued_jobs",
            "FUSE requests waiting for a worker.",
            p.queued,
        ),
        h,
    ]
}

/// The worker pool's wait histogram (bucket i: waits under 2^i µs) as a
/// Prometheus histogram in seconds.
fn queue_wait(w: &cairn_workpool::WaitHistogram) -> Value {
    let mut acc = 0;
    let n = w.buckets.len();
    let buckets = w
        .buckets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            acc += b;
            let le = if i + 1 == n {
                f64::INFINITY
            } else {
                (1u64 << i) as f64 / 1e6
            };
            (le, acc)
        })
        .collect();
    Value::Histogram {
        sum: w.total_us as f64 / 1e6,
        count: w.count,
        buckets,
    }
}
