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
