//! Cheap figures for a service's metrics: commit counts and durations (kept
//! with relaxed atomics by each commit) and a snapshot of what can be read
//! without scanning the pool (dirty bytes, TID, snapshots, caches). The
//! scanning figures (`maintenance::info::pool_info`) are the caller's to
//! compute now and then.

use crate::vfs::Fs;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the commit duration buckets, in milliseconds.
pub const COMMIT_BOUNDS_MS: [u64; 10] = [1, 5, 10, 25, 50, 100, 250, 1_000, 5_000, 30_000];

/// Commits since the pool was opened and how long they took.
#[derive(Default)]
pub struct CommitStats {
    sum_ns: AtomicU64,
    bytes: AtomicU64,
    buckets: [AtomicU64; COMMIT_BOUNDS_MS.len() + 1],
}

impl CommitStats {
    /// One commit of `bytes` dirty bytes that took `ns`.
    pub(crate) fn note(&self, ns: u64, bytes: u64) {
        self.sum_ns.fetch_add(ns, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
        let b = COMMIT_BOUNDS_MS.partition_point(|&ub| ub * 1_000_000 < ns);
        self.buckets[b].fetch_add(1, Relaxed);
    }
}

/// A snapshot of the cheap figures.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceStats {
    pub current_tid: u64,
    pub dirty_bytes: u64,
    pub commits: u64,
    pub commit_seconds_sum: f64,
    pub committed_bytes: u64,
    /// Cumulative commits per bucket bound in seconds, +Inf last.
    pub commit_buckets: Vec<(f64, u64)>,
    pub snapshots: u64,
    /// Seconds since the newest snapshot was taken (None: no snapshot).
    pub newest_snapshot_age_seconds: Option<f64>,
    pub ram_cache_bytes: u64,
    pub ssd_cache: Option<cairn_devices::CacheStats>,
}

impl Fs {
    /// The cheap figures: no scan of metadata or chunks.
    pub fn service_stats(&self) -> crate::Result<ServiceStats> {
        let c = &self.commit_stats;
        let mut acc = 0;
        let mut commit_buckets = Vec::with_capacity(COMMIT_BOUNDS_MS.len() + 1);
        for (i, b) in c.buckets.iter().enumerate() {
            acc += b.load(Relaxed);
            let le = COMMIT_BOUNDS_MS
                .get(i)
                .map_or(f64::INFINITY, |&m| m as f64 / 1e3);
            commit_buckets.push((le, acc));
        }
        let snaps = self.snapshots()?;
        let now = crate::types::Time::now().as_nanos() as u64;
        let newest = snaps.iter().map(|s| s.time_ns).max();
        Ok(ServiceStats {
            current_tid: self.pool.meta.read()?.counter("last_tid")?,
            dirty_bytes: self.load.bytes(),
            commits: acc,
            commit_seconds_sum: c.sum_ns.load(Relaxed) as f64 / 1e9,
            committed_bytes: c.bytes.load(Relaxed),
            commit_buckets,
            snapshots: snaps.len() as u64,
            newest_snapshot_age_seconds: newest.map(|t| now.saturating_sub(t) as f64 / 1e9),
            ram_cache_bytes: self.pool.chunks.ram_cache_bytes(),
            ssd_cache: self.pool.chunks.ssd_cache().map(|c| c.stats()),
        })
    }
}
