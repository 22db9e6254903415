//! The control protocol: a request is one JSON line; the answer is zero or
//! more progress lines `{"progress":[done,total]}` and one final line,
//! `{"ok":<value>}` or `{"err":"message"}`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Commit what is buffered; answers the committed TID.
    Sync,
    /// Pool information (devices, usage, counters).
    Info,
    SnapshotCreate {
        name: String,
        auto: bool,
    },
    SnapshotList,
    SnapshotDelete {
        name: String,
    },
    SnapshotVerify {
        name: String,
    },
    History {
        ino: u64,
    },
    Prune {
        dry_run: bool,
        retention_secs: Option<u64>,
        keep_daily: Option<u32>,
        keep_weekly: Option<u32>,
        keep_monthly: Option<u32>,
    },
    Reblock {
        max_live_pct: u32,
        files: bool,
    },
    Gc {
        max_live_pct: u32,
    },
    Scrub,
    /// Add a device; `spec` as on the command line, its path absolute.
    DeviceAdd {
        spec: String,
    },
    DeviceRemove {
        device: String,
    },
    /// One round of the tier mover.
    Migrate,
    /// Per-device fill and heat histogram.
    TierStatus,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Progress(u64, u64),
    Ok(serde_json::Value),
    Err(String),
}
