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
    #[error("mirror bucket: {0}")]
    Store(#[from] cairn_objstore::ObjError),
}

pub type Result<T> = std::result::Result<T, StreamError>;
