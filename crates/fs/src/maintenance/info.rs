//! Pool information for `cairn info`: devices, usage and counters.

use crate::error::Result;
use crate::pool::superblock::POOL_FORMAT_VERSION;
use crate::pool::Pool;
use crate::types::{FileKind, Inode};
use cairn_meta::RecordType;
use serde::Serialize;

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct DeviceInfo {
    pub id: u32,
    pub class: String,
    /// "tier" (adds capacity) or "cache" (holds copies only).
    pub role: String,
    pub path: String,
    pub size: u64,
    pub used: u64,
    /// Being emptied by `cairn device remove`.
    pub draining: bool,
    /// Writes (or syncs) of it that failed since the pool was opened.
    #[serde(default)]
    pub write_errors: u32,
    /// Failed so many writes that no new data goes to it.
    #[serde(default)]
    pub failing: bool,
    /// online, missing (not opened at mount) or faulted (taken out).
    #[serde(default)]
    pub state: String,
    /// The slow-device emulation it runs with ("latency 8000 us, 100 MiB/s").
    pub emulated: Option<String>,
    /// Segments on it, and how many of them are hot (at least
    /// tier_promote_hits decayed reads).
    pub segments: u64,
    pub hot_segments: u64,
    /// An object-store (s3) device's state ("ok" or "unreachable"),
    /// requests, bytes and errors since the pool was opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_store: Option<crate::maintenance::objects::ObjectInfo>,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct PoolInfo {
    pub pool: String,
    pub uuid: String,
    pub format_version: u32,
    pub record_size: u32,
    pub segment_size: u64,
    pub current_tid: u64,
    pub files: u64,
    pub directories: u64,
    pub logical_bytes: u64,
    pub physical_bytes: u64,
    pub capacity_bytes: u64,
    pub live_elements: u64,
    pub history_elements: u64,
    pub chunks: u64,
    pub segments: u64,
    /// Bytes of data referenced by live files and history, before dedup
    /// and compression (sum over references of each chunk's raw length).
    pub referenced_bytes: u64,
    /// Raw bytes of the stored chunks (after dedup, before compression).
    pub unique_bytes: u64,
    /// Bytes the stored chunks take (after compression, with headers).
    pub stored_bytes: u64,
    /// Of `stored_bytes`, what only history (the fine-grained window and
    /// snapshots) references: chunks no live file uses.
    #[serde(default)]
    pub history_only_bytes: u64,
    /// referenced / unique.
    pub dedup_ratio: f64,
    /// unique / stored.
    pub compression_ratio: f64,
    pub dedup_enabled: bool,
    pub compression: String,
    pub index_entries: u64,
    /// RAM the dedup index takes when all of it is resident in the
    /// metadata cache: the bytes of its B-tree pages. An upper bound: the
    /// cache (meta_cache_mib) keeps only what is hot.
    pub index_ram_bytes: u64,
    pub devices: Vec<DeviceInfo>,
    /// Bytes in the RAM read cache (chunks on slower tiers).
    pub ram_cache_bytes: u64,
    /// The SSD read cache, if the pool has a cache device.
    pub ssd_cache: Option<cairn_devices::CacheStats>,
    /// Files of the pool other users can open now or could when it was
    /// opened (their modes were tightened then), and devices outside the
    /// pool directory that other users can read. Empty when all is private.
    #[serde(default)]
    pub mode_warnings: Vec<String>,
    /// Why the pool refuses data writes (short of space, and what ran
    /// out) or runs without a metadata reserve (filled in by the daemon).
    #[serde(default)]
    pub space_warning: Option<String>,
    /// Lock contention since the mount (filled in by the daemon).
    #[serde(default)]
    pub locks: Vec<crate::contention::LockStats>,
    /// Metadata updates that wait for their sorted batch.
    #[serde(default)]
    pub waiting: WaitingUpdates,
    /// An encrypted pool's cipher, key source and key dates (None: the
    /// pool is not encrypted).
    #[serde(default)]
    pub encryption: Option<crate::pool::key::Encryption>,
    /// A mirror of an encrypted pool opened without its key: its files,
    /// directories and logical bytes are sealed (counted as 0 here).
    #[serde(default)]
    pub sealed: bool,
}

/// Per-write metadata updates that reach their tables in sorted batches
/// (docs/writeback-and-intent-log.md, "Commit", "Sorted batches"): how
/// many wait now. The first three
/// wait in RAM (the open after a crash redoes them); ended elements wait
/// in `fresh_v1`, on disk.
#[derive(Debug, Default, Serialize, serde::Deserialize)]
pub struct WaitingUpdates {
    /// New chunks' dedup index entries.
    pub dedup_entries: u64,
    /// Creation index entries of ended elements, to remove.
    pub creation_index_removals: u64,
    /// Chunks whose live count waits for decrements.
    pub live_count_chunks: u64,
    /// Old versions not yet merged into the history table.
    pub ended_elements: u64,
    /// Chunks a tick stored whose tree commit waits (`writeback/tick.rs`).
    #[serde(default)]
    pub stored_ahead_chunks: u64,
}

fn waiting_updates(pool: &Pool, r: &cairn_meta::MetaRead) -> Result<WaitingUpdates> {
    let m = &pool.meta;
    Ok(WaitingUpdates {
        dedup_entries: m.dedup_pending().len() as u64,
        creation_index_removals: m.born_pending().len() as u64,
        live_count_chunks: m.live_debts().len() as u64,
        ended_elements: r.ended_waiting()?,
        stored_ahead_chunks: stored_ahead(r)?,
    })
}

/// Tick chunks with no reference yet: from `tick_chunks_from` on.
fn stored_ahead(r: &cairn_meta::MetaRead) -> Result<u64> {
    let from = r.counter(crate::writeback::tick::TICK_CHUNKS_FROM)?;
    if from == 0 {
        return Ok(0);
    }
    let mut n = 0;
    for id in from..r.counter("next_chunk")? {
        if let Some(raw) = r.chunk(id)? {
            n += u64::from(cairn_data::ChunkRec::decode(&raw)?.refs == 0);
        }
    }
    Ok(n)
}

/// Every device with its fill; `each_segment(heat)` sees the decayed hits
/// of each segment as they are counted (for histograms).
pub fn device_infos(
    pool: &Pool,
    segs: &[(u64, cairn_data::SegmentRec)],
    mut each_segment: impl FnMut(u32, f64),
) -> Vec<DeviceInfo> {
    let seg = pool.sb.segment_size;
    let set = pool.chunks.devices();
    let hot_at = pool.config.tier_promote_hits;
    set.per_device_slots()
        .into_iter()
        .map(|(d, slots, free)| {
            let (mut segments, mut hot) = (0, 0);
            for (id, _) in segs.iter().filter(|(_, s)| s.on_device(d.id())) {
                let hits = pool.chunks.heat.get(*id).hits;
                segments += 1;
                hot += (hits >= hot_at) as u64;
                each_segment(d.id(), hits);
            }
            DeviceInfo {
                id: d.id(),
                class: d.class().to_string(),
                role: d.role.to_string(),
                path: d.path.display().to_string(),
                size: slots * seg,
                used: (slots - free) * seg,
                draining: set.is_draining(d.id()),
                write_errors: set.write_errors(d.id()),
                failing: set.is_failing(d.id()),
                state: set.state(d.id()).map_or(String::new(), |s| s.to_string()),
                emulated: d.emulation().map(|e| e.to_string()),
                segments,
                hot_segments: hot,
                object_store: crate::maintenance::objects::object_info(&d),
            }
        })
        .collect()
}

pub fn pool_info(pool: &Pool) -> Result<PoolInfo> {
    let r = pool.meta.read()?;
    let (live, hist, chunks) = r.sizes()?;
    let (index_entries, index_ram_bytes) = r.dedup_size()?;
    let (mut files, mut dirs, mut logical) = (0, 0, 0);
    // Held without its key, a mirror's inodes are sealed: not scanned.
    let sealed = pool.meta.is_opaque();
    if !sealed {
        r.for_each_live(|e| {
            if e.key.rtype() == Some(RecordType::Inode) {
                if let Ok(i) = Inode::decode(e.key.obj(), &e.payload) {
                    match i.kind {
                        FileKind::File => {
                            files += 1;
                            logical += i.size;
                        }
                        FileKind::Dir => dirs += 1,
                        _ => {}
                    }
                }
            }
        })?;
    }
    let (mut referenced, mut unique, mut stored) = (0u64, 0u64, 0u64);
    r.for_each_chunk(|_, raw| {
        if let Ok(c) = cairn_data::ChunkRec::decode(raw) {
            referenced += c.raw_len as u64 * c.refs;
            unique += c.raw_len as u64;
            stored += c.len as u64;
        }
    })?;
    let ratio = |a: u64, b: u64| if b == 0 { 1.0 } else { a as f64 / b as f64 };
    let segs = pool.chunks.segment_table();
    let physical = segs.iter().map(|(_, s)| s.live).sum();
    let history_only = segs.iter().map(|(_, s)| s.hist).sum();
    let seg = pool.sb.segment_size;
    let set = pool.chunks.devices();
    let devices = device_infos(pool, &segs, |_, _| {});
    Ok(PoolInfo {
        pool: pool.path.display().to_string(),
        uuid: uuid::Uuid::from_bytes(pool.sb.uuid).to_string(),
        format_version: POOL_FORMAT_VERSION,
        record_size: pool.sb.record_size,
        segment_size: seg,
        current_tid: r.counter("last_tid")?,
        files,
        directories: dirs,
        logical_bytes: logical,
        physical_bytes: physical,
        capacity_bytes: set.slot_totals().0 * seg,
        live_elements: live,
        history_elements: hist,
        chunks,
        segments: segs.len() as u64,
        referenced_bytes: referenced,
        unique_bytes: unique,
        stored_bytes: stored,
        history_only_bytes: history_only,
        dedup_ratio: ratio(referenced, unique),
        compression_ratio: ratio(unique, stored),
        dedup_enabled: pool.config.dedup,
        compression: pool.chunks.compression().to_string(),
        index_entries,
        index_ram_bytes,
        devices,
        ram_cache_bytes: pool.chunks.ram_cache_bytes(),
        ssd_cache: pool.chunks.ssd_cache().map(|c| c.stats()),
        mode_warnings: mode_warnings(pool),
        space_warning: None,
        locks: Vec::new(),
        waiting: waiting_updates(pool, &r)?,
        encryption: pool.encryption.clone(),
        sealed,
    })
}

/// What `PoolInfo::mode_warnings` says: what opening the pool found and
/// what has been widened since.
pub fn mode_warnings(pool: &Pool) -> Vec<String> {
    let mut v = pool.mode_warnings.clone();
    v.extend(
        crate::pool::perms::widened(&pool.path)
            .iter()
            .map(|w| w.to_string()),
    );
    v
}
