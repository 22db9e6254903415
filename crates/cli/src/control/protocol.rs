//! The control protocol: a request is one JSON line; the answer is zero or
//! more progress lines `{"progress":[done,total]}` and one final line,
//! `{"ok":<value>}` or `{"err":"message"}`. Lines are read with a bound
//! (`read_line`), so a peer that never sends a newline cannot make the
//! other side buffer without end.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, Read};

/// The longest request line the daemon reads: requests carry names and
/// device specs, never data.
pub const MAX_REQUEST_LINE: usize = 64 << 10;
/// The longest reply line a command reads (a history or a report naming
/// many files is long, but not this long).
pub const MAX_REPLY_LINE: usize = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("control socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("line longer than {0} bytes")]
    TooLong(usize),
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Reads one line (without its newline) of at most `max` bytes; a last
/// line without a newline counts. None at the end of the stream.
pub fn read_line(r: &mut impl BufRead, max: usize) -> Result<Option<Vec<u8>>, ProtocolError> {
    let mut line = Vec::new();
    let n = r.take(max as u64 + 1).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > max {
        return Err(ProtocolError::TooLong(max));
    }
    Ok(Some(line))
}

pub fn decode_request(line: &[u8]) -> Result<Request, ProtocolError> {
    Ok(serde_json::from_slice(line)?)
}

pub fn decode_reply(line: &[u8]) -> Result<Reply, ProtocolError> {
    Ok(serde_json::from_slice(line)?)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Commit what is buffered; answers the committed TID.
    Sync,
    /// Pool information (devices, usage, counters).
    Info,
    /// Hand the mount to a new daemon (a mount with a keeper only).
    Restart,
    SnapshotCreate {
        name: String,
        auto: bool,
        /// Answer once the snapshot is durable (false: once it is cut).
        #[serde(default = "yes")]
        wait: bool,
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
    /// The versions of a path (bytes, relative to the mount root, as the
    /// mount shows it: views included), across the inodes it named;
    /// `inode`: those of the inode it names instead.
    HistoryPath {
        path: Vec<u8>,
        #[serde(default)]
        inode: bool,
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
    /// Replace device `device` (path or id) by a new one (`spec` as for
    /// `DeviceAdd`).
    DeviceReplace {
        device: String,
        spec: String,
    },
    /// Set the copies policy (`copies=N[,CLASS:copies=N]...`).
    RedundancySet {
        policy: String,
    },
    /// Set the own policy of a file or directory and everything under it
    /// (`copies=N`, `ec=K+M`, or `inherit` to follow the tier's again),
    /// and move the data they hold to it.
    RedundancySetPath {
        ino: u64,
        policy: String,
    },
    /// The policy, the devices' states and the data at risk.
    RedundancyShow,
    /// Make every copy the policy asks for now.
    Resilver,
    /// One round of the tier mover.
    Migrate,
    /// Per-device fill and heat histogram.
    TierStatus,
    /// Write the changes after `since` as a mirror stream into the file
    /// (or FIFO) at `path`.
    MirrorRead {
        since: u64,
        path: String,
        /// A file of the hashes the mirror lacks (two-way copies): only
        /// their chunks travel with bytes.
        #[serde(default)]
        lacking: Option<String>,
        /// Chunk data per batch in MiB (default 64).
        #[serde(default)]
        batch_mib: Option<u64>,
    },
    /// Write the hashes of the chunks a stream after `since` would send
    /// into `path`.
    MirrorCandidates {
        since: u64,
        path: String,
    },
    /// Of the hashes in `path`, write those this pool lacks into `out`.
    MirrorLacking {
        path: String,
        out: String,
    },
    /// Apply the mirror stream in the file at `path` (checked first).
    MirrorWrite {
        path: String,
        force: bool,
    },
    MirrorStatus,
    MirrorPromote,
    /// Roll a mirror back to its snapshot `snapshot`.
    MirrorRollback {
        snapshot: String,
    },
    /// Record that mirror `mirror` (uuid hex, reached at `at`) is at `tid`.
    MirrorHold {
        mirror: String,
        at: String,
        tid: u64,
    },
    /// Forget a mirror's hold.
    MirrorRelease {
        mirror: String,
    },
    VolumeCreate {
        name: String,
        size: u64,
        block_size: u32,
    },
    VolumeList,
    VolumeResize {
        name: String,
        size: u64,
        shrink: bool,
    },
    VolumeDelete {
        name: String,
        with_snapshots: bool,
    },
    /// The pool snapshot `name@snap`.
    VolumeSnapshot {
        name: String,
        snap: String,
        #[serde(default = "yes")]
        wait: bool,
    },
    VolumeClone {
        name: String,
        snap: String,
        new: String,
    },
    VolumeRollback {
        name: String,
        snap: String,
    },
}

fn yes() -> bool {
    true
}

impl Request {
    /// The request's `op` (its kind, as sent), as errors name it.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Sync => "sync",
            Request::Info => "info",
            Request::Restart => "restart",
            Request::SnapshotCreate { .. } => "snapshot_create",
            Request::SnapshotList => "snapshot_list",
            Request::SnapshotDelete { .. } => "snapshot_delete",
            Request::SnapshotVerify { .. } => "snapshot_verify",
            Request::History { .. } => "history",
            Request::HistoryPath { .. } => "history_path",
            Request::Prune { .. } => "prune",
            Request::Reblock { .. } => "reblock",
            Request::Gc { .. } => "gc",
            Request::Scrub => "scrub",
            Request::DeviceAdd { .. } => "device_add",
            Request::DeviceRemove { .. } => "device_remove",
            Request::DeviceReplace { .. } => "device_replace",
            Request::RedundancySet { .. } => "redundancy_set",
            Request::RedundancySetPath { .. } => "redundancy_set_path",
            Request::RedundancyShow => "redundancy_show",
            Request::Resilver => "resilver",
            Request::Migrate => "migrate",
            Request::TierStatus => "tier_status",
            r => r.op_mirror_or_volume(),
        }
    }

    fn op_mirror_or_volume(&self) -> &'static str {
        match self {
            Request::MirrorRead { .. } => "mirror_read",
            Request::MirrorCandidates { .. } => "mirror_candidates",
            Request::MirrorLacking { .. } => "mirror_lacking",
            Request::MirrorWrite { .. } => "mirror_write",
            Request::MirrorStatus => "mirror_status",
            Request::MirrorPromote => "mirror_promote",
            Request::MirrorRollback { .. } => "mirror_rollback",
            Request::MirrorHold { .. } => "mirror_hold",
            Request::MirrorRelease { .. } => "mirror_release",
            Request::VolumeCreate { .. } => "volume_create",
            Request::VolumeList => "volume_list",
            Request::VolumeResize { .. } => "volume_resize",
            Request::VolumeDelete { .. } => "volume_delete",
            Request::VolumeSnapshot { .. } => "volume_snapshot",
            Request::VolumeClone { .. } => "volume_clone",
            Request::VolumeRollback { .. } => "volume_rollback",
            _ => "control",
        }
    }

    /// Does it create a snapshot (whose content hash is then computed)?
    pub fn creates_snapshot(&self) -> bool {
        matches!(
            self,
            Request::SnapshotCreate { .. } | Request::VolumeSnapshot { .. }
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Progress(u64, u64),
    Ok(serde_json::Value),
    Err(String),
}

#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_is_the_op_sent() {
        let (n, s) = (String::new, 0u64);
        let reqs = [
            Request::Sync,
            Request::Info,
            Request::Restart,
            Request::SnapshotCreate {
                name: n(),
                auto: false,
                wait: true,
            },
            Request::SnapshotList,
            Request::SnapshotDelete { name: n() },
            Request::SnapshotVerify { name: n() },
            Request::History { ino: s },
            Request::HistoryPath {
                path: Vec::new(),
                inode: false,
            },
            Request::Prune {
                dry_run: true,
                retention_secs: None,
                keep_daily: None,
                keep_weekly: None,
                keep_monthly: None,
            },
            Request::Reblock {
                max_live_pct: 1,
                files: true,
            },
            Request::Gc { max_live_pct: 1 },
            Request::Scrub,
            Request::DeviceAdd { spec: n() },
            Request::DeviceRemove { device: n() },
            Request::DeviceReplace {
                device: n(),
                spec: n(),
            },
            Request::RedundancySet { policy: n() },
            Request::RedundancySetPath {
                ino: s,
                policy: n(),
            },
            Request::RedundancyShow,
            Request::Resilver,
            Request::Migrate,
            Request::TierStatus,
            Request::MirrorRead {
                since: s,
                path: n(),
                lacking: None,
                batch_mib: None,
            },
            Request::MirrorCandidates {
                since: s,
                path: n(),
            },
            Request::MirrorLacking {
                path: n(),
                out: n(),
            },
            Request::MirrorWrite {
                path: n(),
                force: false,
            },
            Request::MirrorStatus,
            Request::MirrorPromote,
            Request::MirrorRollback { snapshot: n() },
            Request::MirrorHold {
                mirror: n(),
                at: n(),
                tid: s,
            },
            Request::MirrorRelease { mirror: n() },
            Request::VolumeCreate {
                name: n(),
                size: s,
                block_size: 4096,
            },
            Request::VolumeList,
            Request::VolumeResize {
                name: n(),
                size: s,
                shrink: false,
            },
            Request::VolumeDelete {
                name: n(),
                with_snapshots: false,
            },
            Request::VolumeSnapshot {
                name: n(),
                snap: n(),
                wait: true,
            },
            Request::VolumeClone {
                name: n(),
                snap: n(),
                new: n(),
            },
            Request::VolumeRollback {
                name: n(),
                snap: n(),
            },
        ];
        for r in reqs {
            let v = serde_json::to_value(&r).expect("serializes");
            assert_eq!(v["op"].as_str(), Some(r.op()), "{r:?}");
        }
    }
}
