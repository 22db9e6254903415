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
    #[error("{path}: device belongs to another pool")]
    WrongPool { path: PathBuf },
    #[error("invalid device spec '{spec}': {why}")]
    BadSpec { spec: String, why: String },
    #[error("device {path} is too small: {size} bytes, need at least {min}")]
    TooSmall { path: PathBuf, size: u64, min: u64 },
    #[error("no space left on any device")]
    NoSpace,
    #[error("device {id} still holds {segments} segments")]
    InUse { id: u32, segments: u64 },
    #[error("unknown device id {0}")]
    UnknownDevice(u32),
}

pub type Result<T> = std::result::Result<T, DeviceError>;

pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> DeviceError + '_ {
    move |source| DeviceError::Io {
        path: path.to_path_buf(),
        source,
    }
}
