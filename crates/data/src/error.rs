//! Typed errors of the data layer.

use cairn_devices::DeviceError;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("corrupt chunk in segment {segment} at offset {offset}: {why}")]
    Corrupt {
        segment: u64,
        offset: u32,
        why: String,
    },
    #[error("corrupt {what} record: {why}")]
    BadRecord { what: &'static str, why: String },
    #[error("segment {0} is not in the segment table")]
    NoSegment(u64),
    #[error("no space left in the pool")]
    NoSpace,
    #[error("busy: {0}")]
    Busy(String),
    /// A device did not answer an I/O within the pool's I/O timeout while
    /// another copy took it: the device is faulted.
    #[error("device {device} did not answer within {secs} s (I/O timeout)")]
    Hung { device: u32, secs: u64 },
    /// A stripe's parity could not be computed or a member restored.
    #[error("parity: {0}")]
    Parity(String),
    #[error("segment writer: {0}")]
    Writer(&'static str),
    /// A write or sync of a device failed (other than for lack of space):
    /// what was written since its last sync is not trusted.
    #[error("write to device {device} failed: {source}")]
    WriteFailed {
        device: u32,
        #[source]
        source: DeviceError,
    },
    /// The data layer's own state broke an invariant (a bug: a write
    /// outside its segment, a segment's accounting gone wrong): nothing
    /// was written past the check, and the filesystem stops taking changes.
    #[error("INVARIANT VIOLATED in the data layer: {what}; nothing was written past the check (a bug: keep the log)")]
    Invariant { what: String },
}

impl DataError {
    /// Out of space: the pool's devices, or the host filesystem under a
    /// sparse device file (ENOSPC or EDQUOT from a device write).
    pub fn is_no_space(&self) -> bool {
        match self {
            DataError::NoSpace | DataError::Device(DeviceError::NoSpace) => true,
            DataError::Device(DeviceError::Io { source, .. }) => {
                matches!(
                    source.raw_os_error(),
                    Some(libc::ENOSPC) | Some(libc::EDQUOT)
                )
            }
            _ => false,
        }
    }

    /// The device whose write failed, for an I/O error of a write or sync
    /// (not for a write refused as a violated invariant: a bug, not the
    /// device).
    pub fn failed_device(&self) -> Option<u32> {
        match self {
            DataError::WriteFailed { device, source } if !source.is_invariant() => Some(*device),
            _ => None,
        }
    }

    /// An I/O refused because an invariant did not hold (a bug): the
    /// filesystem stops taking changes.
    pub fn is_invariant(&self) -> bool {
        match self {
            DataError::Device(d) | DataError::WriteFailed { source: d, .. } => d.is_invariant(),
            DataError::Invariant { .. } => true,
            _ => false,
        }
    }

    /// A violated invariant of the data layer (`what` did not hold):
    /// logged here, once, as the error it returns.
    pub fn invariant(what: String) -> DataError {
        let e = DataError::Invariant { what };
        tracing::error!("{e}");
        e
    }

    /// Wraps a device's write or sync error: lack of space stays what it
    /// is, anything else names the device.
    pub fn of_write(device: u32, e: DeviceError) -> DataError {
        let e = DataError::Device(e);
        if e.is_no_space() {
            return e;
        }
        let DataError::Device(source) = e else {
            unreachable!()
        };
        DataError::WriteFailed { device, source }
    }
}

pub type Result<T> = std::result::Result<T, DataError>;

/// `invariant!(cond, "what {}", x)`: when `cond` does not hold (a bug),
/// returns `DataError::Invariant`, logged once, from the enclosing
/// function, before the write it guards.
macro_rules! invariant {
    ($cond:expr, $($what:tt)+) => {
        if !$cond {
            return Err($crate::error::DataError::invariant(format!($($what)+)).into());
        }
    };
}
pub(crate) use invariant;
