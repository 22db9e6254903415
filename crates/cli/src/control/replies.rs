//! Typed replies of the volume requests, whose fields `cairn volume`
//! reads (the mirror ones are `cairn_mirror::reply`): decoded from the
//! JSON the pool sends, so that a missing or renamed field is an error,
//! never a silent 0. `--json` still prints the reply as it came.

use cairn_fs::VolumeInfo;
use serde::Deserialize;

/// `VolumeCreate`, `VolumeResize` (with the pool's room), `VolumeClone`
/// and `VolumeRollback` (without).
#[derive(Debug, Clone, Deserialize)]
pub struct VolumeChange {
    #[serde(flatten)]
    pub volume: VolumeInfo,
    #[serde(default)]
    pub pool_capacity: Option<u64>,
    #[serde(default)]
    pub pool_available: Option<u64>,
}

/// `VolumeSnapshot`: the pool snapshot cut (the fields the command
/// shows; the reply also names the volume and the snapshot's time).
#[derive(Debug, Clone, Deserialize)]
pub struct VolumeSnapshotReply {
    pub snapshot: String,
    pub export: String,
    pub tid: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
