//! Typed errors of the filesystem layer, each with the errno a frontend
//! should return.

use cairn_data::DataError;
use cairn_devices::DeviceError;
use cairn_meta::MetaError;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("directory not empty")]
    NotEmpty,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("file name too long")]
    NameTooLong,
    #[error("invalid argument")]
    Invalid,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("no space left in the pool")]
    NoSpace,
    #[error("no such attribute")]
    NoAttr,
    #[error("result does not fit the buffer")]
    Range,
    #[error("operation not supported")]
    NotSupported,
    /// lseek(SEEK_DATA/SEEK_HOLE) at or past the end, or no data after it.
    #[error("no data at or after that offset")]
    NoData,
    #[error("too many links")]
    TooManyLinks,
    #[error("read-only")]
    ReadOnly,
    #[error("I/O error: {0}")]
    Io(String),
    #[error("not a Cairn pool: {0}")]
    NotAPool(String),
    /// An encrypted pool's key: missing, wrong, or its key block damaged.
    #[error("{0}")]
    Key(String),
    #[error("unsupported pool format version {found} (this build supports {known})")]
    UnknownVersion { found: u32, known: u32 },
    #[error("pool already exists at {0} (use --force to overwrite)")]
    PoolExists(String),
    #[error("the pool is in use by another process (mounted?)")]
    Busy,
    #[error("{0}")]
    InUse(String),
    #[error("{0}")]
    Config(String),
    #[error("the filesystem stopped after a failed commit: {0}; remount to recover the last committed state")]
    Failed(String),
    /// The intent log holds fsync'd changes it cannot give back (damage in
    /// the middle of it, or a log that cannot be read): the mount refuses.
    #[error("{0}")]
    DamagedLog(String),
    #[error("no snapshot named {0:?}")]
    NoSnapshot(String),
    /// Internal: an operation found inode {0}, whose state shard it does
    /// not hold; `Fs::with_inos` runs it again with that shard locked
    /// (`state.rs`). Never returned to callers.
    #[error("internal: inode {0} used without its state lock")]
    Relock(u64),
    #[error("a snapshot named {0:?} already exists")]
    SnapshotExists(String),
    #[error(
        "TID {0:#018x} is not readable: it is newer than the last commit or its history was pruned"
    )]
    NoSuchTid(u64),
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The filesystem's own state broke an invariant (a bug: a reference
    /// count below zero, an extent past its block): nothing past the
    /// check was written, and the filesystem stops taking changes.
    #[error("INVARIANT VIOLATED in the filesystem: {what}; nothing was written past the check (a bug: keep the log)")]
    Invariant { what: String },
}

impl FsError {
    /// Out of space: the pool's devices, a host filesystem under a sparse
    /// device, or the one holding the metadata store.
    pub fn is_no_space(&self) -> bool {
        self.errno() == libc::ENOSPC
    }

    /// An I/O refused because an invariant did not hold (a bug): the
    /// filesystem stops taking changes rather than risk a misplaced write.
    pub fn is_invariant(&self) -> bool {
        match self {
            FsError::Data(e) => e.is_invariant(),
            FsError::Meta(e) => e.is_invariant(),
            FsError::Device(d) => d.is_invariant(),
            FsError::Invariant { .. } => true,
            _ => false,
        }
    }

    /// A violated invariant of the filesystem (`what` did not hold):
    /// logged here, once, as the error it returns.
    pub fn invariant(what: String) -> FsError {
        let e = FsError::Invariant { what };
        tracing::error!("{e}");
        e
    }

    /// The data device whose write failed, when that is what failed.
    pub fn failed_device(&self) -> Option<u32> {
        match self {
            FsError::Data(e) => e.failed_device(),
            _ => None,
        }
    }

    /// A write to the metadata store failed (for space or I/O): redb
    /// fails the handle from then on, so the store must be opened again.
    pub fn failed_meta_write(&self) -> bool {
        matches!(
            self,
            FsError::Meta(MetaError::NoSpace(_) | MetaError::Io(_))
        )
    }

    /// Why the metadata store was refused at open, if it failed its
    /// integrity check (see `salvage`).
    pub fn meta_damage(&self) -> Option<&str> {
        match self {
            FsError::Meta(MetaError::Damaged { why, .. }) => Some(why),
            _ => None,
        }
    }

    pub fn errno(&self) -> i32 {
        use FsError::*;
        match self {
            NotFound | NoSnapshot(_) | NoSuchTid(_) => libc::ENOENT,
            Exists | PoolExists(_) | SnapshotExists(_) => libc::EEXIST,
            NotEmpty => libc::ENOTEMPTY,
            NotDir => libc::ENOTDIR,
            IsDir => libc::EISDIR,
            NameTooLong => libc::ENAMETOOLONG,
            Invalid | BadRequest(_) => libc::EINVAL,
            NotPermitted => libc::EPERM,
            NoSpace => libc::ENOSPC,
            NoAttr => libc::ENODATA,
            Range => libc::ERANGE,
            NotSupported => libc::EOPNOTSUPP,
            NoData => libc::ENXIO,
            TooManyLinks => libc::EMLINK,
            ReadOnly => libc::EROFS,
            Busy | InUse(_) => libc::EBUSY,
            Config(_) => libc::EINVAL,
            Data(e) if e.is_no_space() => libc::ENOSPC,
            Meta(MetaError::NoSpace(_) | MetaError::NoRoom(_)) => libc::ENOSPC,
            Device(DeviceError::NoSpace) => libc::ENOSPC,
            _ => libc::EIO,
        }
    }
}

pub type Result<T> = std::result::Result<T, FsError>;

/// `invariant!(cond, "what {}", x)`: when `cond` does not hold (a bug),
/// returns `FsError::Invariant`, logged once, from the enclosing function,
/// before the write it guards; a commit that meets one stops the
/// filesystem (`Fs::stop_on_invariant`, the flush's `take_back`).
macro_rules! invariant {
    ($cond:expr, $($what:tt)+) => {
        if !$cond {
            return Err($crate::error::FsError::invariant(format!($($what)+)).into());
        }
    };
}
pub(crate) use invariant;
