//! Object-store (s3) tier devices: garbage collection of slot objects no
//! segment holds, and their state for `cairn info` and `tier status`.
//! Orphan objects come from a crash between an upload and the commit of
//! the segment's new table entry, or from deletes that could not run
//! while the store was away; a freed slot's object is deleted when the
//! slot is released (`S3Backend::punch_hole`). GC runs when the pool
//! opens, after the slot maps were rebuilt from the segment table, in the
//! background (a store that does not answer never delays the open): it
//! lists each store's slot objects and queues the delete of the unused
//! ones, retrying every 10 s until one listing succeeded.

use cairn_devices::DeviceSet;
use std::sync::Arc;
use std::time::Duration;

/// Starts the GC of every object-store device of the set (one thread,
/// which ends once each was listed, or with the last `Arc` of the set).
pub fn spawn_gc(set: Arc<DeviceSet>) {
    let ids: Vec<u32> = set
        .devices()
        .iter()
        .filter(|d| d.object_tier().is_some())
        .map(|d| d.id())
        .collect();
    if ids.is_empty() {
        return;
    }
    let weak = Arc::downgrade(&set);
    drop(set);
    let spawned = std::thread::Builder::new()
        .name("cairn-s3-orphans".into())
        .spawn(move || gc_until_done(weak, ids));
    if let Err(e) = spawned {
        tracing::warn!("object-store GC not started: {e}");
    }
}

fn gc_until_done(set: std::sync::Weak<DeviceSet>, mut ids: Vec<u32>) {
    while !ids.is_empty() {
        let Some(s) = set.upgrade() else { return };
        ids.retain(|&id| match collect_garbage(&s, id) {
            Ok(n) => {
                if n > 0 {
                    tracing::info!("device {id}: {n} orphan objects queued for deletion");
                }
                false
            }
            Err(e) => {
                tracing::warn!("device {id}: object-store GC: {e}; trying again in 10 s");
                true
            }
        });
        drop(s);
        if !ids.is_empty() {
            std::thread::sleep(Duration::from_secs(10));
        }
    }
}

/// Lists device `id`'s slot objects and queues the delete of those no
/// segment holds; returns how many.
pub fn collect_garbage(set: &DeviceSet, id: u32) -> std::result::Result<usize, String> {
    let dev = set.device(id).map_err(|e| e.to_string())?;
    let Some(obj) = dev.object_tier() else {
        return Ok(0);
    };
    let listed = obj.list_slots().map_err(|e| e.to_string())?;
    set.collect_object_garbage(id, &listed)
        .map_err(|e| e.to_string())
}

/// What `cairn info` and `tier status` show of an object-store device.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ObjectInfo {
    #[serde(flatten)]
    pub stats: cairn_objstore::StatsSnapshot,
    /// Deletes of freed slots' objects waiting (for the store, or their turn).
    pub pending_deletes: u64,
}

/// The state of an object-store device, None for other devices.
pub fn object_info(dev: &cairn_devices::Device) -> Option<ObjectInfo> {
    let obj = dev.object_tier()?;
    Some(ObjectInfo {
        stats: obj.stats(),
        pending_deletes: obj.pending_deletes() as u64,
    })
}
