//! Typed errors of the devices layer.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("I/O error on device {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a Cairn device (bad magic)")]
    NotADevice { path: PathBuf },
    #[error("{path}: device header checksum mismatch (corrupt header)")]
    BadChecksum { path: PathBuf },
    #[error("{path}: unsupported device format version {found} (this build knows {known})")]
    UnknownVersion {
        path: PathBuf,
        found: u32,
        known: u32,
    },
    #[error("{path}: invalid device header: {why}")]
    BadHeader { path: PathBuf, why: &'static str },
    #[error("SSD cache index: {0}")]
    BadCacheIndex(&'static str),
    #[error("{path}: device belongs to another pool")]
    WrongPool { path: PathBuf },
    #[error("invalid device spec '{spec}': {why}")]
    BadSpec { spec: String, why: String },
    #[error(
        "device {path} is too small: {} asked, the minimum is {} (a 1 MiB header and 4 segment slots)",
        crate::size::human(*size),
        crate::size::human(*min)
    )]
    TooSmall { path: PathBuf, size: u64, min: u64 },
    #[error(
        "device {path} is truncated: its header says {} ({expected} bytes) but it has only {} ({actual} bytes); restore the device file or its full size",
        crate::size::human(*expected),
        crate::size::human(*actual)
    )]
    Truncated {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error(
        "cannot allocate device {path}: {} asked but its host filesystem has only {} free; give a smaller size (CLASS:PATH:SIZE) or free space (--sparse skips the allocation, at the risk of I/O errors when the host fills)",
        crate::size::human(*size),
        crate::size::human(*free)
    )]
    HostNoSpace { path: PathBuf, size: u64, free: u64 },
    #[error("device {path} is in use by an open pool (mounted, or open by a cairn command)")]
    Locked { path: PathBuf },
    #[error("no space left on any device")]
    NoSpace,
    #[error("device {id} still holds {segments} segments")]
    InUse { id: u32, segments: u64 },
    #[error("{path}: {why}")]
    ObjectStore { path: PathBuf, why: String },
    #[error("unknown device id {0}")]
    UnknownDevice(u32),
    /// An I/O a bug asked for (outside the device's data area): refused,
    /// so nothing is written where it does not belong.
    #[error(
        "INVARIANT VIOLATED on device {path}: {what}; the I/O was refused (a bug: keep the log)"
    )]
    Invariant { path: PathBuf, what: String },
}

impl DeviceError {
    /// A violated invariant of device `path` (`what` did not hold): logged
    /// here, once, as the error it returns.
    pub fn invariant(path: &std::path::Path, what: String) -> DeviceError {
        let e = DeviceError::Invariant {
            path: path.to_path_buf(),
            what,
        };
        tracing::error!("{e}");
        e
    }

    /// True for an invariant that did not hold (`DeviceError::Invariant`).
    pub fn is_invariant(&self) -> bool {
        matches!(self, DeviceError::Invariant { .. })
    }
}

pub type Result<T> = std::result::Result<T, DeviceError>;

/// `invariant!(path, cond, "what {}", x)`: when `cond` does not hold (a
/// bug), returns `DeviceError::Invariant` of the device at `path`, logged
/// once, from the enclosing function, before any I/O it guards.
macro_rules! invariant {
    ($path:expr, $cond:expr, $($what:tt)+) => {
        if !$cond {
            return Err($crate::error::DeviceError::invariant($path, format!($($what)+)).into());
        }
    };
}
pub(crate) use invariant;

pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> DeviceError + '_ {
    move |source| DeviceError::Io {
        path: path.to_path_buf(),
        source,
    }
}
