//! Per-operation counters and latency histograms of the FUSE requests, for
//! the metrics endpoint (cairn-http). Off until `enable()`: then each
//! instrumented request reads the clock twice and adds to three relaxed
//! atomics (count, summed nanoseconds, one histogram bucket); the bytes of
//! reads and writes are counted the same way. Nothing here locks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The operations counted, by name (the `op` label).
pub const OPS: [&str; 20] = [
    "lookup",
    "getattr",
    "setattr",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "open",
    "read",
    "write",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "create",
    "statfs",
    "mknod",
    "getxattr",
    "other",
];

/// Upper bounds of the latency buckets, in microseconds (the last bucket,
/// +Inf, is implied).
pub const BOUNDS_US: [u64; 14] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000, 10_000_000,
];

struct OpStat {
    sum_ns: AtomicU64,
    buckets: [AtomicU64; BOUNDS_US.len() + 1],
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: OpStat = OpStat {
    sum_ns: AtomicU64::new(0),
    buckets: [const { AtomicU64::new(0) }; BOUNDS_US.len() + 1],
};

static STATS: [OpStat; OPS.len()] = [ZERO; OPS.len()];
static ENABLED: AtomicBool = AtomicBool::new(false);
static READ_BYTES: AtomicU64 = AtomicU64::new(0);
static WRITE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Starts counting (the daemon calls this when metrics are served).
pub fn enable() {
    ENABLED.store(true, Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// The operations counted, in the order of `OPS`.
#[derive(Clone, Copy)]
pub(crate) enum Op {
    Lookup,
    Getattr,
    Setattr,
    Mkdir,
    Unlink,
    Rmdir,
    Rename,
    Open,
    Read,
    Write,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Create,
    Statfs,
    Mknod,
    Getxattr,
    Other,
}

/// Times one request of `op` until dropped.
pub(crate) struct Timer(Option<(Op, Instant)>);

pub(crate) fn timer(op: Op) -> Timer {
    if !enabled() {
        return Timer(None);
    }
    Timer(Some((op, Instant::now())))
}

impl Drop for Timer {
    fn drop(&mut self) {
        let Some((i, t0)) = self.0 else { return };
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let s = &STATS[i as usize];
        s.sum_ns.fetch_add(ns, Relaxed);
        let b = BOUNDS_US.partition_point(|&ub| ub * 1000 < ns);
        s.buckets[b].fetch_add(1, Relaxed);
    }
}

pub(crate) fn read_bytes(n: usize) {
    if enabled() {
        READ_BYTES.fetch_add(n as u64, Relaxed);
    }
}

pub(crate) fn write_bytes(n: usize) {
    if enabled() {
        WRITE_BYTES.fetch_add(n as u64, Relaxed);
    }
}

/// One operation's totals: requests, summed seconds and the cumulative
/// count per bucket bound (seconds), +Inf last.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpSnapshot {
    pub op: &'static str,
    pub count: u64,
    pub sum_seconds: f64,
    pub buckets: Vec<(f64, u64)>,
}

/// What has been counted since `enable()`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Snapshot {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub ops: Vec<OpSnapshot>,
}

pub fn snapshot() -> Snapshot {
    let ops = OPS
        .iter()
        .zip(&STATS)
        .map(|(op, s)| {
            let mut acc = 0;
            let mut buckets: Vec<(f64, u64)> = Vec::with_capacity(BOUNDS_US.len() + 1);
            for (i, b) in s.buckets.iter().enumerate() {
                acc += b.load(Relaxed);
                let le = BOUNDS_US.get(i).map_or(f64::INFINITY, |&u| u as f64 / 1e6);
                buckets.push((le, acc));
            }
            OpSnapshot {
                op,
                count: acc,
                sum_seconds: s.sum_ns.load(Relaxed) as f64 / 1e9,
                buckets,
            }
        })
        .collect();
    Snapshot {
        read_bytes: READ_BYTES.load(Relaxed),
        write_bytes: WRITE_BYTES.load(Relaxed),
        ops,
    }
}
