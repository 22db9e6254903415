//! The crate's error type, and the mapping of an export's I/O errors to
//! the NBD error values sent on the wire.

use std::io;

/// Why a server could not start or a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("refusing to listen on non-loopback address {0} (allow_remote is off)")]
    RemoteRefused(std::net::SocketAddr),
    #[error("socket path {0} is in use by a live server")]
    SocketInUse(std::path::PathBuf),
    #[error("bad magic {0:#x} from client")]
    BadMagic(u64),
    #[error("client sent unknown handshake flags {0:#x}")]
    BadClientFlags(u32),
    #[error("client option data of {0} bytes is over the limit")]
    OptionTooLong(u32),
    #[error("client asked for unknown export {0:?} with NBD_OPT_EXPORT_NAME")]
    UnknownExport(String),
    #[error("write payload of {0} bytes is over the limit; closing")]
    PayloadTooLarge(u32),
    #[error("client aborted the handshake")]
    Aborted,
    #[error("a WRITE payload of {0} bytes did not arrive in time; closing")]
    PayloadTimeout(u32),
    #[error("client did not start TLS (NBD_OPT_STARTTLS), which this server requires")]
    TlsRequired,
    #[error("refusing NBD over TCP without TLS: give a TLS directory, or allow plain TCP explicitly (insecure_tcp)")]
    PlainTcpRefused,
    #[error("TLS: {0}")]
    Tls(String),
    #[error("{path}: {why}")]
    TlsFile {
        path: std::path::PathBuf,
        why: String,
    },
}

/// NBD error values (the wire uses Linux errno numbers).
pub mod errno {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    pub const ENOMEM: u32 = 12;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const EOVERFLOW: u32 = 75;
    pub const ENOTSUP: u32 = 95;
    pub const ESHUTDOWN: u32 = 108;
}

/// The NBD error for an export's I/O error: the few values the protocol
/// names pass through, by raw errno or by kind; anything else is EIO.
pub fn wire_errno(e: &io::Error) -> u32 {
    use errno::*;
    let known = [
        EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN,
    ];
    if let Some(raw) = e.raw_os_error() {
        let raw = raw as u32;
        return if known.contains(&raw) { raw } else { EIO };
    }
    match e.kind() {
        io::ErrorKind::PermissionDenied => EPERM,
        io::ErrorKind::InvalidInput => EINVAL,
        io::ErrorKind::StorageFull => ENOSPC,
        io::ErrorKind::OutOfMemory => ENOMEM,
        io::ErrorKind::Unsupported => ENOTSUP,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_to_wire_values() {
        assert_eq!(wire_errno(&io::Error::other("disk on fire")), errno::EIO);
        assert_eq!(wire_errno(&io::Error::from_raw_os_error(28)), errno::ENOSPC);
        assert_eq!(wire_errno(&io::Error::from_raw_os_error(2)), errno::EIO);
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(wire_errno(&denied), errno::EPERM);
    }
}
