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
    #[error("metadata store failed on a damaged page: {0}")]
    Panicked(String),
    #[error("metadata store is already open (is the pool mounted by another process?)")]
    AlreadyOpen,
}

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
    redb::Error,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

impl From<redb::DatabaseError> for MetaError {
    fn from(e: redb::DatabaseError) -> Self {
        match e {
            redb::DatabaseError::DatabaseAlreadyOpen => MetaError::AlreadyOpen,
            e => MetaError::Db(e.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, MetaError>;
