//! Cheap figures for a service's metrics: commit counts and durations (kept
//! with relaxed atomics by each commit), maintenance progress (GC, reblock,
//! scrub, prune, the tier mover) and a snapshot of what can be read without
//! scanning the pool (dirty bytes, TID, snapshots, caches, device I/O). The
//! scanning figures (`maintenance::info::pool_info`) are the caller's to
//! compute now and then.

use crate::vfs::Fs;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the commit duration buckets, in milliseconds.
pub const COMMIT_BOUNDS_MS: [u64; 10] = [1, 5, 10, 25, 50, 100, 250, 1_000, 5_000, 30_000];

/// A duration histogram over `COMMIT_BOUNDS_MS` (relaxed atomics).
#[derive(Default)]
pub struct DurationHist {
    sum_ns: AtomicU64,
    buckets: [AtomicU64; COMMIT_BOUNDS_MS.len() + 1],
}

/// A read of a `DurationHist`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct HistSnapshot {
    pub count: u64,
    pub sum_seconds: f64,
    /// Cumulative counts per bucket bound in seconds, +Inf last.
    pub buckets: Vec<(f64, u64)>,
}

impl DurationHist {
    pub(crate) fn note(&self, ns: u64) {
        self.sum_ns.fetch_add(ns, Relaxed);
        let b = COMMIT_BOUNDS_MS.partition_point(|&ub| ub * 1_000_000 < ns);
        self.buckets[b].fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> HistSnapshot {
        let mut acc = 0;
        let mut buckets = Vec::with_capacity(COMMIT_BOUNDS_MS.len() + 1);
        for (i, b) in self.buckets.iter().enumerate() {
            acc += b.load(Relaxed);
            let le = COMMIT_BOUNDS_MS
                .get(i)
                .map_or(f64::INFINITY, |&m| m as f64 / 1e3);
            buckets.push((le, acc));
        }
        HistSnapshot {
            count: acc,
            sum_seconds: self.sum_ns.load(Relaxed) as f64 / 1e9,
            buckets,
        }
    }
}

/// Commits since the pool was opened and how long they took: whole, the
/// data phase (blocks written to segments) and the metadata phase.
#[derive(Default)]
pub struct CommitStats {
    bytes: AtomicU64,
    whole: DurationHist,
    data: DurationHist,
    meta: DurationHist,
}

impl CommitStats {
    /// One commit of `bytes` dirty bytes whose block writes took `data_ns`
    /// and whose metadata commit `meta_ns`.
    pub(crate) fn note(&self, data_ns: u64, meta_ns: u64, bytes: u64) {
        self.bytes.fetch_add(bytes, Relaxed);
        self.whole.note(data_ns + meta_ns);
        self.data.note(data_ns);
        self.meta.note(meta_ns);
    }
}

/// Background and on-demand work whose progress the metrics show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Gc,
    Reblock,
    Scrub,
    Prune,
    Migrate,
    Resilver,
}

impl Task {
    pub const ALL: [Task; 6] = [
        Task::Gc,
        Task::Reblock,
        Task::Scrub,
        Task::Prune,
        Task::Migrate,
        Task::Resilver,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Task::Gc => "gc",
            Task::Reblock => "reblock",
            Task::Scrub => "scrub",
            Task::Prune => "prune",
            Task::Migrate => "migrate",
            Task::Resilver => "resilver",
        }
    }
}

#[derive(Default)]
struct TaskCounters {
    runs: AtomicU64,
    running: AtomicU64,
    done: AtomicU64,
    total: AtomicU64,
    processed_bytes: AtomicU64,
    reclaimed_bytes: AtomicU64,
}

/// Per task: runs, the current (or last) run's progress, bytes processed
/// (moved, verified, freed) and space reclaimed; the mover's promotions
/// and demotions; damaged chunks found by scrubs.
#[derive(Default)]
pub struct MaintStats {
    tasks: [TaskCounters; Task::ALL.len()],
    promoted_bytes: AtomicU64,
    demoted_bytes: AtomicU64,
    promoted_segments: AtomicU64,
    demoted_segments: AtomicU64,
    scrub_damaged: AtomicU64,
}

/// A run in progress: counted as running until dropped.
pub(crate) struct Run<'a> {
    c: &'a TaskCounters,
}

impl Run<'_> {
    /// Progress of the run (`done` of `total`, in the task's unit).
    pub fn progress(&self, done: u64, total: u64) {
        self.c.done.store(done, Relaxed);
        self.c.total.store(total, Relaxed);
    }

    pub fn processed(&self, bytes: u64) {
        self.c.processed_bytes.fetch_add(bytes, Relaxed);
    }

    pub fn reclaimed(&self, bytes: u64) {
        self.c.reclaimed_bytes.fetch_add(bytes, Relaxed);
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        self.c.running.fetch_sub(1, Relaxed);
    }
}

impl MaintStats {
    pub(crate) fn start(&self, t: Task) -> Run<'_> {
        let c = &self.tasks[t as usize];
        c.runs.fetch_add(1, Relaxed);
        c.running.fetch_add(1, Relaxed);
        c.done.store(0, Relaxed);
        c.total.store(0, Relaxed);
        Run { c }
    }

    pub(crate) fn moved(&self, up: bool, bytes: u64) {
        let (b, s) = if up {
            (&self.promoted_bytes, &self.promoted_segments)
        } else {
            (&self.demoted_bytes, &self.demoted_segments)
        };
        b.fetch_add(bytes, Relaxed);
        s.fetch_add(1, Relaxed);
    }

    pub(crate) fn damaged(&self, n: u64) {
        self.scrub_damaged.fetch_add(n, Relaxed);
    }
}

/// One task's figures.
#[derive(Debug, Clone, Serialize)]
pub struct TaskStats {
    pub task: &'static str,
    pub runs: u64,
    pub running: bool,
    /// Progress of the current or last run: `done` of `total` (bytes; for
    /// migrate segments, for prune 1 of 1).
    pub done: u64,
    pub total: u64,
    pub processed_bytes: u64,
    pub reclaimed_bytes: u64,
}

/// Device I/O since the pool was opened.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceIo {
    pub id: u32,
    pub class: String,
    pub role: String,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub read_errors: u64,
    pub write_errors: u64,
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
    /// The commits' data phase (blocks to segments) and metadata phase.
    pub commit_data: HistSnapshot,
    pub commit_meta: HistSnapshot,
    pub snapshots: u64,
    /// Seconds since the newest snapshot was taken (None: no snapshot).
    pub newest_snapshot_age_seconds: Option<f64>,
    /// Seconds since the oldest snapshot was taken (None: no snapshot).
    pub oldest_snapshot_age_seconds: Option<f64>,
    pub ram_cache_bytes: u64,
    /// RAM read cache lookups (None: no RAM cache).
    pub ram_cache_hits: Option<u64>,
    pub ram_cache_misses: Option<u64>,
    pub ssd_cache: Option<cairn_devices::CacheStats>,
    pub devices: Vec<DeviceIo>,
    pub tasks: Vec<TaskStats>,
    pub promoted_bytes: u64,
    pub demoted_bytes: u64,
    pub promoted_segments: u64,
    pub demoted_segments: u64,
    pub scrub_damaged_chunks: u64,
    /// Self-healing reads since the mount: chunks served from another
    /// copy, bad copies rewritten, bad copies left bad.
    pub chunks_served_from_copy: u64,
    pub copies_repaired: u64,
    pub copies_unrepaired: u64,
    /// Chunks restored from their stripe's parity since the mount.
    #[serde(default)]
    pub chunks_restored_from_parity: u64,
    /// Devices that are not online (missing or faulted).
    pub devices_not_online: u64,
}

impl Fs {
    /// The cheap figures: no scan of metadata or chunks.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "nanoseconds since 1970: now is after 1970 and before 2554"
    )]
    pub fn service_stats(&self) -> crate::Result<ServiceStats> {
        let c = &self.commit_stats;
        let whole = c.whole.snapshot();
        let snaps = self.snapshots()?;
        let now = crate::types::Time::now().as_nanos() as u64;
        let age = |t: u64| now.saturating_sub(t) as f64 / 1e9;
        let newest = snaps.iter().map(|s| s.time_ns).max();
        let oldest = snaps.iter().map(|s| s.time_ns).min();
        let ram = self.pool.chunks.ram_cache_hits_misses();
        let set = self.pool.chunks.devices();
        let heal = self.pool.chunks.heal_counts();
        let devices = set
            .devices()
            .iter()
            .map(|d| DeviceIo {
                id: d.id(),
                class: d.class().to_string(),
                role: d.role.to_string(),
                read_bytes: d.read_bytes(),
                written_bytes: d.write_bytes(),
                read_errors: d.read_errors(),
                write_errors: set.write_errors(d.id()) as u64,
            })
            .collect();
        let m = &self.maint_stats;
        let tasks = Task::ALL
            .iter()
            .map(|&t| {
                let c = &m.tasks[t as usize];
                TaskStats {
                    task: t.name(),
                    runs: c.runs.load(Relaxed),
                    running: c.running.load(Relaxed) > 0,
                    done: c.done.load(Relaxed),
                    total: c.total.load(Relaxed),
                    processed_bytes: c.processed_bytes.load(Relaxed),
                    reclaimed_bytes: c.reclaimed_bytes.load(Relaxed),
                }
            })
            .collect();
        Ok(ServiceStats {
            current_tid: self.pool.meta.read()?.counter("last_tid")?,
            dirty_bytes: self.load.bytes(),
            commits: whole.count,
            commit_seconds_sum: whole.sum_seconds,
            committed_bytes: c.bytes.load(Relaxed),
            commit_buckets: whole.buckets,
            commit_data: c.data.snapshot(),
            commit_meta: c.meta.snapshot(),
            snapshots: snaps.len() as u64,
            newest_snapshot_age_seconds: newest.map(age),
            oldest_snapshot_age_seconds: oldest.map(age),
            ram_cache_bytes: self.pool.chunks.ram_cache_bytes(),
            ram_cache_hits: ram.map(|r| r.0),
            ram_cache_misses: ram.map(|r| r.1),
            ssd_cache: self.pool.chunks.ssd_cache().map(|c| c.stats()),
            devices,
            tasks,
            promoted_bytes: m.promoted_bytes.load(Relaxed),
            demoted_bytes: m.demoted_bytes.load(Relaxed),
            promoted_segments: m.promoted_segments.load(Relaxed),
            demoted_segments: m.demoted_segments.load(Relaxed),
            scrub_damaged_chunks: m.scrub_damaged.load(Relaxed),
            chunks_served_from_copy: heal.0,
            copies_repaired: heal.1,
            copies_unrepaired: heal.2,
            chunks_restored_from_parity: self.pool.chunks.restored_count(),
            devices_not_online: set.not_online().len() as u64,
        })
    }
}
