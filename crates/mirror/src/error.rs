//! Errors of mirror streams.

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("mirror stream: {0}")]
    Io(#[from] std::io::Error),
    #[error("mirror stream is damaged: {0}")]
    Damaged(String),
    #[error("mirror stream ends after frame {0}, before its end: truncated (nothing after the last complete batch was applied)")]
    Truncated(u64),
    #[error("mirror stream refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Fs(#[from] cairn_fs::FsError),
    #[error("the input holds {streams} complete stream(s), up to TID {upto:#x}, then at byte {at} data that is not a complete mirror stream: {why}")]
    Trailing {
        streams: usize,
        upto: u64,
        at: u64,
        why: Box<StreamError>,
    },
    #[error(
        "{why} (the {streams} stream(s) before it were applied: the mirror is at TID {upto:#x})"
    )]
    AfterApplied {
        streams: u64,
        upto: u64,
        why: Box<StreamError>,
    },
    #[error("mirror bucket: {0}")]
    Store(#[from] cairn_objstore::ObjError),
}

pub type Result<T> = std::result::Result<T, StreamError>;

/// What a side of a copy (the source's or the mirror's daemon, a pool
/// opened by the command, a remote `cairn` over ssh) failed with: the
/// command's own error, carried through unchanged.
pub type EndpointError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of the copy orchestration (`copy`, `bucket_copy`): the
/// decisions it refuses and what the sides or the streams failed with.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{mirror} is not a mirror (role: {role}): a promoted mirror has changes of its own that a copy would overwrite")]
    NotAMirror { mirror: String, role: &'static str },
    #[error("{src} comes from pool {src_uuid}, and {mirror} mirrors pool {mirror_source}")]
    OtherSource {
        src: String,
        src_uuid: String,
        mirror: String,
        mirror_source: String,
    },
    #[error("{mirror} and its source hold no snapshot in common at or before the mirror's TID {since:#x}: it needs a full resync (cairn mkfs --force --mirror, then a full copy)")]
    NoCommonSnapshot { mirror: String, since: u64 },
    #[error("{src} pruned past TID {since:#x}, where the bucket's chain ends: copy with --resync to start a new chain with a full stream (chunks the bucket holds are not uploaded again)")]
    BucketBehindPrune { src: String, since: u64 },
    #[error("{bucket} holds a mirror of pool {bucket_source}, and {src} is pool {src_uuid}")]
    BucketOtherSource {
        bucket: String,
        bucket_source: String,
        src: String,
        src_uuid: String,
    },
    #[error("{bucket} holds objects that are not a Cairn mirror ({examples}...): give the mirror a prefix of its own")]
    ForeignObjects { bucket: String, examples: String },
    #[error("{bucket} holds no Cairn mirror (no manifest)")]
    NoManifest { bucket: String },
    #[error("{pool} mirrors pool {pool_source}, and the bucket holds pool {bucket_source}")]
    RestoreOtherSource {
        pool: String,
        pool_source: String,
        bucket_source: String,
    },
    #[error("{pool} is not a mirror pool (role: {role}): restore into a pool made with `cairn mkfs POOL --mirror`")]
    RestoreNotAMirror { pool: String, role: &'static str },
    #[error("{pool} is at TID {tid:#x}, which no stream of the bucket starts at (the bucket's chain was restarted by a resync): restore into a new mirror pool")]
    RestoreOffChain { pool: String, tid: u64 },
    #[error("a bad reply: {0}")]
    BadReply(String),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error("mirror copy: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
}
