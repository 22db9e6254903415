//! Typed replies of the control requests whose answer the daemon builds
//! here rather than as a report struct of crates/fs (those, e.g.
//! `PruneReport` or `RedundancyStatus`, are decoded as themselves; the
//! mirror ones are `cairn_mirror::reply`). The daemon serializes these
//! structs and the command decodes them, so a field is named once, and a
//! missing or renamed field is an error, never a silent 0. `--json` still
//! prints the reply as it came.

use cairn_fs::maintenance::info::PoolInfo;
use cairn_fs::redundancy::RedundancyStatus;
use cairn_fs::VolumeInfo;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// For an `Option` field the daemon always sends (a value or null): an
/// absent field is an error, not None (serde's default for `Option`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// `Sync`: the TID committed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SyncReply {
    pub tid: u64,
}

/// `SnapshotDelete` and `VolumeDelete`: the name deleted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deleted {
    pub deleted: String,
}

/// `SnapshotCreate`: the snapshot made, and how long that took.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotCreated {
    pub name: String,
    pub tid: u64,
    pub time_ns: u64,
    pub create_ms: f64,
}

/// One entry of `SnapshotList`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotEntry {
    pub name: String,
    pub tid: u64,
    pub time_ns: u64,
    /// "auto" or "named".
    pub kind: String,
    /// Bytes deleting it would free.
    pub unique_bytes: u64,
    /// The content hash (hex), null while it is being computed.
    #[serde(deserialize_with = "present")]
    pub hash: Option<String>,
    pub files: u64,
    pub bytes: u64,
}

/// `DeviceAdd`: the new device's id, and where the metadata's second
/// copy goes at the next mount (if it does).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceAdded {
    pub device: u32,
    pub meta_mirror_at_next_mount: bool,
    #[serde(deserialize_with = "present")]
    pub meta_mirror_next: Option<String>,
}

/// `VolumeCreate`, `VolumeResize` (with the pool's room), `VolumeClone`
/// and `VolumeRollback` (without).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeChange {
    #[serde(flatten)]
    pub volume: VolumeInfo,
    /// Sent by create and resize only (really optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_capacity: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_available: Option<u64>,
}

/// `VolumeSnapshot`: the pool snapshot cut.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeSnapshotReply {
    pub volume: String,
    pub snapshot: String,
    pub export: String,
    pub tid: u64,
    pub time_ns: u64,
}

/// One NBD server of the daemon in `Info`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NbdServer {
    pub address: String,
    pub queue_wait_mean_us: u64,
    pub queue_wait_p99_us: u64,
    pub stats: cairn_nbd::Stats,
}

/// `Info`: the pool's figures, and in the daemon its frontends' counters.
#[derive(Debug, Serialize, Deserialize)]
pub struct InfoReply {
    #[serde(flatten)]
    pub pool: PoolInfo,
    pub volumes: Vec<VolumeInfo>,
    pub redundancy: RedundancyStatus,
    /// Null when no NBD server runs.
    #[serde(deserialize_with = "present")]
    pub nbd: Option<Vec<NbdServer>>,
    /// Null outside a FUSE mount.
    #[serde(deserialize_with = "present")]
    pub fuse_workers: Option<cairn_workpool::Stats>,
    /// The metrics endpoint's counters (`ServiceStats`), for `--json`
    /// only: kept as JSON, as its +Inf bucket bounds are written as null,
    /// which does not decode as a number.
    pub service: Value,
    /// The FUSE operation counters, when the metrics endpoint is on
    /// (really optional); JSON for the same reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuse: Option<Value>,
    /// Lines the mount daemon could not write to its log (sent by the
    /// daemon only: really optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_lines_dropped: Option<u64>,
    /// The pid of the mount's keeper (`--keep-mount`: `cairn restart`
    /// replaces the daemon under it); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keeper: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::client::decode_as;
    use cairn_fs::PruneReport;

    #[test]
    fn a_volume_reply_missing_a_field_does_not_decode() {
        let ok = r#"{"name":"v","ino":5,"size":4096,"block_size":4096,"created_ns":1,
            "stored_bytes":0,"snapshots":[],"pool_capacity":10,"pool_available":5}"#;
        let v: VolumeChange = serde_json::from_str(ok).expect("decodes");
        assert_eq!((v.volume.size, v.pool_capacity), (4096, Some(10)));
        let no_size = ok.replace(r#""size":4096,"#, "");
        assert!(serde_json::from_str::<VolumeChange>(&no_size).is_err());
        let snap = r#"{"volume":"v","snapshot":"s","export":"v@s","time_ns":1}"#;
        assert!(
            serde_json::from_str::<VolumeSnapshotReply>(snap).is_err(),
            "no tid"
        );
    }

    #[test]
    fn a_snapshot_reply_missing_a_field_does_not_decode() {
        let ok = r#"{"name":"a","tid":7,"time_ns":1,"kind":"auto","unique_bytes":0,
            "hash":null,"files":2,"bytes":3}"#;
        let e: SnapshotEntry = serde_json::from_str(ok).expect("decodes");
        assert_eq!((e.tid, e.hash), (7, None));
        for field in [r#""files":2,"#, r#""hash":null,"#] {
            let short = ok.replace(field, "");
            assert!(
                serde_json::from_str::<SnapshotEntry>(&short).is_err(),
                "without {field}"
            );
        }
        let added = r#"{"device":1,"meta_mirror_at_next_mount":false}"#;
        assert!(serde_json::from_str::<DeviceAdded>(added).is_err());
    }

    #[test]
    fn a_report_missing_a_field_does_not_decode_and_names_the_request() {
        let ok = serde_json::json!({"dry_run": false, "expired_snapshots": [],
            "cutoff_tid": 1, "elements": 2, "chunks_freed": 3, "bytes_freed": 4,
            "segments_freed": 5});
        let r: PruneReport = decode_as("prune", ok.clone()).expect("decodes");
        assert_eq!(r.segments_freed, 5);
        let mut short = ok;
        short.as_object_mut().map(|m| m.remove("chunks_freed"));
        let e = decode_as::<PruneReport>("prune", short).expect_err("no chunks_freed");
        let msg = format!("{e:#}");
        assert!(
            msg.contains("prune") && msg.contains("chunks_freed"),
            "{msg}"
        );
    }
}
