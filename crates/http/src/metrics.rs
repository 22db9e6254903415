//! The figures served at `/metrics` (Prometheus text, encoded by
//! prometheus-client) and `/api/metrics` (the same samples as JSON, for the
//! dashboard's charts): the pool's cheap figures read at each request, the
//! scanning ones from the last scan, and the closures' (FUSE, NBD).

use crate::scan::ScanCache;
use cairn_fs::service_stats::ServiceStats;
use cairn_fs::Fs;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Named without `_total`: the encoder adds it.
    Counter,
    Gauge,
    Histogram,
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Value {
    Num(f64),
    /// Cumulative counts per upper bound (seconds), +Inf last.
    Histogram {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
}

/// One time series.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub labels: Vec<(String, String)>,
    pub value: Value,
}

impl Sample {
    pub fn new(name: &str, help: &str, kind: Kind, value: f64) -> Sample {
        Sample {
            name: name.into(),
            help: help.into(),
            kind,
            labels: Vec::new(),
            value: Value::Num(value),
        }
    }

    pub fn label(mut self, k: &str, v: impl ToString) -> Sample {
        self.labels.push((k.into(), v.to_string()));
        self
    }
}

/// Everything, in a stable order (samples of a name next to each other).
pub(crate) fn collect(fs: &Fs, scan: &ScanCache, extra: &[crate::ExtraFn]) -> Vec<Sample> {
    let mut v = Vec::new();
    service(fs, &mut v);
    devices(fs, &mut v);
    scanned(scan, &mut v);
    for f in extra {
        v.extend(f());
    }
    v
}

fn hist(name: &str, help: &str, h: &cairn_fs::service_stats::HistSnapshot) -> Sample {
    Sample {
        value: Value::Histogram {
            sum: h.sum_seconds,
            count: h.count,
            buckets: h.buckets.clone(),
        },
        ..Sample::new(name, help, Kind::Histogram, 0.0)
    }
}

fn service(fs: &Fs, v: &mut Vec<Sample>) {
    let s = match fs.service_stats() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("metrics: {e}");
            return;
        }
    };
    commits(&s, v);
    caches(&s, v);
    device_io(&s, v);
    maintenance(&s, v);
    tier_mover(&s, v);
}

/// The last TID, dirty bytes, commit times and snapshots.
fn commits(s: &ServiceStats, v: &mut Vec<Sample>) {
    use Kind::*;
    let n = Sample::new;
    v.push(n(
        "cairn_tid",
        "The last committed transaction id.",
        Gauge,
        s.current_tid as f64,
    ));
    v.push(n(
        "cairn_dirty_bytes",
        "Buffered (dirty) bytes not yet committed.",
        Gauge,
        s.dirty_bytes as f64,
    ));
    let whole = cairn_fs::service_stats::HistSnapshot {
        count: s.commits,
        sum_seconds: s.commit_seconds_sum,
        buckets: s.commit_buckets.clone(),
    };
    v.push(hist(
        "cairn_commit_duration_seconds",
        "Time each commit (flush of buffered writes and metadata commit) took.",
        &whole,
    ));
    v.push(hist(
        "cairn_flush_duration_seconds",
        "Time each commit spent writing its blocks to segments (the data flush).",
        &s.commit_data,
    ));
    v.push(hist(
        "cairn_commit_metadata_duration_seconds",
        "Time each commit spent committing its metadata transaction.",
        &s.commit_meta,
    ));
    v.push(n(
        "cairn_committed_bytes",
        "Dirty bytes committed since the mount.",
        Counter,
        s.committed_bytes as f64,
    ));
    v.push(n(
        "cairn_snapshots",
        "Snapshots of the pool.",
        Gauge,
        s.snapshots as f64,
    ));
    if let Some(age) = s.newest_snapshot_age_seconds {
        v.push(n(
            "cairn_newest_snapshot_age_seconds",
            "Seconds since the newest snapshot was taken.",
            Gauge,
            age,
        ));
    }
    if let Some(age) = s.oldest_snapshot_age_seconds {
        v.push(n(
            "cairn_oldest_snapshot_age_seconds",
            "Seconds since the oldest snapshot was taken.",
            Gauge,
            age,
        ));
    }
}

/// The RAM and SSD read caches.
fn caches(s: &ServiceStats, v: &mut Vec<Sample>) {
    use Kind::*;
    let n = Sample::new;
    v.push(n(
        "cairn_ram_cache_bytes",
        "Bytes held by the RAM read cache.",
        Gauge,
        s.ram_cache_bytes as f64,
    ));
    v.push(n(
        "cairn_ram_cache_hits",
        "RAM read cache hits (0 without a RAM cache).",
        Counter,
        s.ram_cache_hits.unwrap_or(0) as f64,
    ));
    v.push(n(
        "cairn_ram_cache_misses",
        "RAM read cache misses (0 without a RAM cache).",
        Counter,
        s.ram_cache_misses.unwrap_or(0) as f64,
    ));
    let c = s.ssd_cache.unwrap_or_default();
    v.push(n(
        "cairn_ssd_cache_hits",
        "SSD read cache hits (0 without an SSD cache).",
        Counter,
        c.hits as f64,
    ));
    v.push(n(
        "cairn_ssd_cache_misses",
        "SSD read cache misses (0 without an SSD cache).",
        Counter,
        c.misses as f64,
    ));
    v.push(n(
        "cairn_ssd_cache_filled_bytes",
        "Bytes copied into the SSD read cache.",
        Counter,
        c.filled_bytes as f64,
    ));
    v.push(n(
        "cairn_ssd_cache_entries",
        "Entries in the SSD read cache.",
        Gauge,
        c.entries as f64,
    ));
}

/// Bytes moved and errors, pool-wide and per device.
fn device_io(s: &ServiceStats, v: &mut Vec<Sample>) {
    use Kind::*;
    let n = Sample::new;
    let (pr, pw) = s
        .devices
        .iter()
        .fold((0, 0), |(r, w), d| (r + d.read_bytes, w + d.written_bytes));
    v.push(n(
        "cairn_physical_read_bytes",
        "Bytes read from the pool's devices (all devices).",
        Counter,
        pr as f64,
    ));
    v.push(n(
        "cairn_physical_written_bytes",
        "Bytes written to the pool's devices' data areas (all devices).",
        Counter,
        pw as f64,
    ));
    let mut groups: [Vec<Sample>; 4] = Default::default();
    for d in &s.devices {
        let l = |x: Sample| {
            x.label("device", d.id)
                .label("class", &d.class)
                .label("role", &d.role)
        };
        groups[0].push(l(n(
            "cairn_device_read_bytes",
            "Bytes read from the device.",
            Counter,
            d.read_bytes as f64,
        )));
        groups[1].push(l(n(
            "cairn_device_written_bytes",
            "Bytes written to the device's data area.",
            Counter,
            d.written_bytes as f64,
        )));
        groups[2].push(l(n(
            "cairn_device_read_errors",
            "Failed reads of the device since the mount.",
            Counter,
            d.read_errors as f64,
        )));
        groups[3].push(l(n(
            "cairn_device_write_errors",
            "Failed writes or syncs of the device since the mount.",
            Counter,
            d.write_errors as f64,
        )));
    }
    v.extend(groups.into_iter().flatten());
}

/// Runs, progress and work of gc, reblock, scrub, prune and migrate.
fn maintenance(s: &ServiceStats, v: &mut Vec<Sample>) {
    use Kind::*;
    let n = Sample::new;
    let mut groups: [Vec<Sample>; 5] = Default::default();
    for t in &s.tasks {
        let l = |x: Sample| x.label("task", t.task);
        groups[0].push(l(n(
            "cairn_maintenance_runs",
            "Runs of a maintenance task (gc, reblock, scrub, prune, migrate, resilver) since the mount.",
            Counter,
            t.runs as f64,
        )));
        groups[1].push(l(n(
            "cairn_maintenance_running",
            "1 while the task runs.",
            Gauge,
            t.running as u8 as f64,
        )));
        let ratio = if t.total > 0 {
            t.done as f64 / t.total as f64
        } else {
            (t.runs > 0 && !t.running) as u8 as f64
        };
        groups[2].push(l(n(
            "cairn_maintenance_progress_ratio",
            "Progress of the task's current or last run, 0 to 1.",
            Gauge,
            ratio,
        )));
        groups[3].push(l(n(
            "cairn_maintenance_processed_bytes",
            "Bytes the task moved (gc, reblock, migrate), verified (scrub) or freed (prune).",
            Counter,
            t.processed_bytes as f64,
        )));
        groups[4].push(l(n(
            "cairn_maintenance_reclaimed_bytes",
            "Device space the task gave back (freed segments).",
            Counter,
            t.reclaimed_bytes as f64,
        )));
    }
    v.extend(groups.into_iter().flatten());
    v.push(n(
        "cairn_scrub_damaged_chunks",
        "Damaged chunks found by scrubs since the mount.",
        Counter,
        s.scrub_damaged_chunks as f64,
    ));
    v.push(n(
        "cairn_chunks_served_from_copy",
        "Chunk reads served from another copy after the first failed, since the mount.",
        Counter,
        s.chunks_served_from_copy as f64,
    ));
    v.push(n(
        "cairn_chunks_restored_from_parity",
        "Chunk reads restored from their stripe's parity (no copy gave them), since the mount.",
        Counter,
        s.chunks_restored_from_parity as f64,
    ));
    v.push(n(
        "cairn_copies_repaired",
        "Bad chunk copies rewritten from a good copy, since the mount.",
        Counter,
        s.copies_repaired as f64,
    ));
    v.push(n(
        "cairn_copies_unrepaired",
        "Bad chunk copies that could not be rewritten, since the mount.",
        Counter,
        s.copies_unrepaired as f64,
    ));
    v.push(n(
        "cairn_devices_not_online",
        "Devices missing or faulted.",
        Gauge,
        s.devices_not_online as f64,
    ));
}

/// What the tier mover moved.
fn tier_mover(s: &ServiceStats, v: &mut Vec<Sample>) {
    use Kind::*;
    let n = Sample::new;
    v.push(n(
        "cairn_tier_promoted_bytes",
        "Bytes the tier mover promoted to faster tiers.",
        Counter,
        s.promoted_bytes as f64,
    ));
    v.push(n(
        "cairn_tier_demoted_bytes",
        "Bytes the tier mover demoted to slower tiers.",
        Counter,
        s.demoted_bytes as f64,
    ));
    v.push(n(
        "cairn_tier_promoted_segments",
        "Segments the tier mover promoted.",
        Counter,
        s.promoted_segments as f64,
    ));
    v.push(n(
        "cairn_tier_demoted_segments",
        "Segments the tier mover demoted.",
        Counter,
        s.demoted_segments as f64,
    ));
}

/// Per device: size, fill, segments by heat (the segment table and heat
/// table, no scan of metadata).
fn devices(fs: &Fs, v: &mut Vec<Sample>) {
    use Kind::*;
    let tiers = fs.tier_status();
    let mut groups: [Vec<Sample>; 7] = Default::default();
    for t in &tiers {
        let d = &t.device;
        let s = |name: &str, help: &str, k, x: f64| {
            Sample::new(name, help, k, x)
                .label("device", d.id)
                .label("class", &d.class)
                .label("role", &d.role)
        };
        groups[0].push(s(
            "cairn_device_size_bytes",
            "Device capacity.",
            Gauge,
            d.size as f64,
        ));
        groups[1].push(s(
            "cairn_device_used_bytes",
            "Device bytes in use (whole segments).",
            Gauge,
            d.used as f64,
        ));
        groups[2].push(s(
            "cairn_device_fill_ratio",
            "Used / size of the device, 0 to 1.",
            Gauge,
            if d.size > 0 {
                d.used as f64 / d.size as f64
            } else {
                0.0
            },
        ));
        groups[3].push(s(
            "cairn_device_segments",
            "Segments stored on the device.",
            Gauge,
            d.segments as f64,
        ));
        groups[4].push(s(
            "cairn_device_hot_segments",
            "Segments read at least tier_promote_hits times (decayed).",
            Gauge,
            d.hot_segments as f64,
        ));
        groups[5].push(s(
            "cairn_device_heat",
            "Sum of the decayed reads of the device's segments (the tier mover's heat).",
            Gauge,
            t.heat_sum,
        ));
        for (i, n) in t.heat.iter().enumerate() {
            let le = cairn_fs::maintenance::tier::HEAT_BUCKETS
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            groups[6].push(
                s(
                    "cairn_device_segments_by_heat",
                    "Segments per decayed-heat bucket (upper bound `heat_le`, not cumulative).",
                    Gauge,
                    *n as f64,
                )
                .label("heat_le", le),
            );
        }
    }
    v.extend(groups.into_iter().flatten());
}

/// The last scan's figures, with its age.
fn scanned(scan: &ScanCache, v: &mut Vec<Sample>) {
    use Kind::*;
    let Some((at, i)) = scan.get() else { return };
    let n = |name: &str, help: &str, x: f64| Sample::new(name, help, Gauge, x);
    v.push(n(
        "cairn_scan_age_seconds",
        "Seconds since the figures that scan the pool were computed.",
        at.elapsed().as_secs_f64(),
    ));
    v.push(n(
        "cairn_files",
        "Regular files in the live tree.",
        i.files as f64,
    ));
    v.push(n(
        "cairn_directories",
        "Directories in the live tree.",
        i.directories as f64,
    ));
    v.push(n(
        "cairn_logical_bytes",
        "Sum of the sizes of the live files.",
        i.logical_bytes as f64,
    ));
    v.push(n(
        "cairn_physical_bytes",
        "Live bytes in segments (after dedup and compression).",
        i.physical_bytes as f64,
    ));
    v.push(n(
        "cairn_capacity_bytes",
        "Capacity of the tier devices.",
        i.capacity_bytes as f64,
    ));
    v.push(n(
        "cairn_referenced_bytes",
        "Bytes referenced by files and history, before dedup and compression.",
        i.referenced_bytes as f64,
    ));
    v.push(n(
        "cairn_unique_bytes",
        "Raw bytes of the stored chunks (after dedup).",
        i.unique_bytes as f64,
    ));
    v.push(n(
        "cairn_stored_bytes",
        "Bytes the stored chunks take (after compression).",
        i.stored_bytes as f64,
    ));
    v.push(n(
        "cairn_history_only_bytes",
        "Stored bytes only history references.",
        i.history_only_bytes as f64,
    ));
    v.push(n(
        "cairn_dedup_ratio",
        "Referenced bytes / unique bytes.",
        i.dedup_ratio,
    ));
    v.push(n(
        "cairn_compression_ratio",
        "Unique bytes / stored bytes.",
        i.compression_ratio,
    ));
    v.push(n("cairn_chunks", "Stored chunks.", i.chunks as f64));
    let _ = Counter;
}

/// Encodes samples for prometheus-client at each scrape.
#[derive(Debug)]
pub(crate) struct Samples(pub Vec<Sample>);

impl Collector for Samples {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut i = 0;
        while i < self.0.len() {
            let first = &self.0[i];
            let end = i + self.0[i..]
                .iter()
                .take_while(|s| s.name == first.name)
                .count();
            let t = match first.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut m = enc.encode_descriptor(&first.name, &first.help, None, t)?;
            for s in &self.0[i..end] {
                if s.labels.is_empty() {
                    one(&mut m, s)?;
                } else {
                    one(&mut m.encode_family(&s.labels)?, s)?;
                }
            }
            i = end;
        }
        Ok(())
    }
}

fn one(m: &mut MetricEncoder, s: &Sample) -> Result<(), std::fmt::Error> {
    match (&s.value, s.kind) {
        (Value::Num(x), Kind::Counter) => m.encode_counter::<NoLabelSet, _, f64>(x, None),
        (Value::Num(x), _) => m.encode_gauge(x),
        (
            Value::Histogram {
                sum,
                count,
                buckets,
            },
            _,
        ) => {
            // The encoder accumulates: it takes each bucket's own count.
            let mut below = 0;
            let own: Vec<(f64, u64)> = buckets
                .iter()
                .map(|&(le, cum)| {
                    let n = cum.saturating_sub(below);
                    below = cum;
                    (le, n)
                })
                .collect();
            m.encode_histogram::<NoLabelSet>(*sum, *count, &own, None)
        }
    }
}

/// The Prometheus text exposition of `samples`.
pub(crate) fn text(samples: Vec<Sample>) -> String {
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register_collector(Box::new(Samples(samples)));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &reg) {
        tracing::warn!("metrics: encoding: {e}");
    }
    out
}
