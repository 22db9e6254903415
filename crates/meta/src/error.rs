//! Typed errors of the metadata layer.

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("metadata store: {0}")]
    Db(String),
    #[error("corrupt metadata element {key}: {why}")]
    Corrupt { key: String, why: String },
    #[error(
        "metadata store {file} is damaged ({why}); the pool was not opened. \
         `cairn check POOL` lists the files it can attribute the damage to"
    )]
    Damaged { file: String, why: String },
    /// A write of the store's file failed for lack of space (the handle
    /// must be reopened).
    #[error("no space left for the metadata store: {0}")]
    NoSpace(String),
    /// A read or write of the store's file failed (the handle must be
    /// reopened).
    #[error("metadata store I/O error: {0}")]
    Io(String),
    /// Room for a commit could not be allocated; nothing was written.
    #[error("no room on the host filesystem: {0}")]
    NoRoom(String),
    #[error("metadata store failed on a damaged page: {0}")]
    Panicked(String),
    #[error("metadata store is already open (is the pool mounted by another process?)")]
    AlreadyOpen,
    /// A change broke an invariant of the metadata (a bug: an element
    /// ended before it was made, a TID that does not follow the last):
    /// the transaction is not committed, and the filesystem stops taking
    /// changes.
    #[error("INVARIANT VIOLATED in the metadata store: {what}; the transaction was not committed (a bug: keep the log)")]
    Invariant { what: String },
}

impl MetaError {
    /// A violated invariant of the metadata layer (`what` did not hold):
    /// logged here, once, as the error it returns.
    pub fn invariant(what: String) -> MetaError {
        let e = MetaError::Invariant { what };
        tracing::error!("{e}");
        e
    }

    /// True for an invariant that did not hold (`MetaError::Invariant`).
    pub fn is_invariant(&self) -> bool {
        matches!(self, MetaError::Invariant { .. })
    }
}

/// `invariant!(cond, "what {}", x)`: when `cond` does not hold (a bug),
/// returns `MetaError::Invariant`, logged once, from the enclosing
/// function; the write transaction it is in is not committed.
macro_rules! invariant {
    ($cond:expr, $($what:tt)+) => {
        if !$cond {
            return Err($crate::error::MetaError::invariant(format!($($what)+)).into());
        }
    };
}
pub(crate) use invariant;

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for MetaError {
            fn from(e: $t) -> Self {
                MetaError::Db(e.to_string())
            }
        }
    )*};
}
from_redb!(
    redb::TransactionError,
    redb::TableError,
    redb::SetDurabilityError
);

/// ENOSPC or EDQUOT from the file under the store: the host filesystem
/// that holds it is full.
pub fn no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

impl From<redb::StorageError> for MetaError {
    fn from(e: redb::StorageError) -> Self {
        match e {
            redb::StorageError::Io(io) if no_space(&io) => MetaError::NoSpace(io.to_string()),
            redb::StorageError::Io(io) => MetaError::Io(io.to_string()),
            e => MetaError::Db(e.to_string()),
        }
    }
}

impl From<redb::CommitError> for MetaError {
    fn from(e: redb::CommitError) -> Self {
        match e {
            redb::CommitError::Storage(s) => s.into(),
            e => MetaError::Db(e.to_string()),
        }
    }
}

impl From<redb::Error> for MetaError {
    fn from(e: redb::Error) -> Self {
        match e {
            redb::Error::Io(io) if no_space(&io) => MetaError::NoSpace(io.to_string()),
            redb::Error::Io(io) => MetaError::Io(io.to_string()),
            e => MetaError::Db(e.to_string()),
        }
    }
}

impl From<redb::DatabaseError> for MetaError {
    fn from(e: redb::DatabaseError) -> Self {
        match e {
            redb::DatabaseError::DatabaseAlreadyOpen => MetaError::AlreadyOpen,
            e => MetaError::Db(e.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, MetaError>;
