//! The replies of the mirror requests of the control protocol (`cairn
//! mirror ...` and the daemon of a mounted pool), typed: the pool side
//! builds them (`serve`), the command side decodes them, and the JSON
//! both see (and `--json` prints) has these field names. A field missing
//! from a reply is a decoding error, never a silent 0; fields a reply
//! carries beyond these are ignored (a newer daemon may add some).

use serde::{Deserialize, Serialize};

/// `MirrorRead`: the stream read out of the source (the reader's own
/// report, `read::ReadReport`).
pub use crate::read::ReadReport as ReadReply;

/// `MirrorWrite`: the streams applied to the mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReply {
    pub since: u64,
    pub upto: u64,
    pub events: u64,
    pub chunks: u64,
    pub batches: u64,
    pub streams: u64,
}

impl From<crate::ApplyReport> for WriteReply {
    fn from(r: crate::ApplyReport) -> WriteReply {
        WriteReply {
            since: r.since,
            upto: r.upto,
            events: r.events,
            chunks: r.chunks,
            batches: r.batches,
            streams: r.streams,
        }
    }
}

/// `MirrorCandidates`: how many hashes the list holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandidatesReply {
    pub hashes: u64,
}

/// `MirrorLacking`: how many of the hashes the pool lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LackingReply {
    pub lacking: u64,
}

/// `cairn mirror lacking` (run over ssh by a copy): the hashes the mirror
/// lacks, as hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LackingHexReply {
    pub lacking: String,
}

/// What a pool is to mirroring (`cairn_fs::replica::Role`, as a word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoleName {
    /// A pool of its own (not a mirror).
    Pool,
    /// Made to be a mirror, bound to no source yet.
    Unbound,
    Mirror,
    /// A mirror promoted to a writable pool.
    Promoted,
}

impl RoleName {
    pub fn as_str(self) -> &'static str {
        match self {
            RoleName::Pool => "pool",
            RoleName::Unbound => "unbound",
            RoleName::Mirror => "mirror",
            RoleName::Promoted => "promoted",
        }
    }
}

/// A mirror the pool keeps history for (`cairn_fs::replica::Hold`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldStatus {
    pub mirror: String,
    pub at: String,
    pub tid: u64,
    pub time_ns: u64,
    /// Commits the pool made since the mirror's TID.
    pub lag_tids: u64,
}

/// A snapshot as `MirrorStatus` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotAt {
    pub name: String,
    pub tid: u64,
}

/// `MirrorStatus`: where a pool is, what it is and which history it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReply {
    pub role: RoleName,
    pub tid: u64,
    /// The pool's uuid (32 hex digits).
    pub uuid: String,
    /// The source pool's uuid, for a mirror bound to one (null otherwise).
    pub source: Option<String>,
    /// When TID `tid` was committed (unix ns), if known.
    pub time_ns: Option<u64>,
    pub mirrors: Vec<HoldStatus>,
    /// History before this TID is pruned (except at snapshots).
    pub pruned_tid: u64,
    /// Its snapshots (none listed when `sealed`).
    pub snapshots: Vec<SnapshotAt>,
    /// An encrypted mirror opened without its key: its names, snapshots
    /// and history are sealed here.
    #[serde(default)]
    pub sealed: bool,
}

/// `MirrorRollback`: what rolling a mirror back to a snapshot changed
/// (the pool's own report).
pub use cairn_fs::replica::RollbackReport as RollbackReply;

/// `MirrorPromote`: the TID the promoted pool is at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromoteReply {
    pub tid: u64,
}

/// `MirrorRelease`: whether the mirror had a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReply {
    pub released: bool,
}

/// `MirrorHold`: nothing to say (`{}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldReply {}

/// `cairn mirror copy SRC POOL`: the read, the write, and the rollback a
/// resync made first (null when none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyReply {
    pub read: ReadReply,
    pub write: WriteReply,
    pub rollback: Option<RollbackReply>,
}

/// What a copy into a bucket stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketPush {
    pub since: u64,
    pub upto: u64,
    pub chunks_put: u64,
    pub chunk_bytes: u64,
    pub stream_bytes: u64,
    /// Streams in the bucket's chain after the copy.
    pub streams: u64,
    pub streams_deleted: u64,
    /// A new chain was started (the source had pruned past the old one).
    pub resync: bool,
}

/// `cairn mirror copy SRC s3:...`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketCopyReply {
    pub read: ReadReply,
    pub bucket: BucketPush,
    pub requests: cairn_objstore::StatsSnapshot,
}

/// `cairn mirror restore s3:... POOL`. A restore with nothing to do says
/// only `streams`, `upto` and `chunks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreReply {
    pub streams: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    pub upto: u64,
    pub chunks: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<cairn_objstore::StatsSnapshot>,
}
