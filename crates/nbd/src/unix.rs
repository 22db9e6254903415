//! Creating a Unix socket that only its owner can connect to, without a
//! window where it exists with wider permissions: bind inside a fresh
//! 0700 directory next to the target, chmod 0600, rename into place.

use crate::error::NbdError;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Binds a listening socket at `path`, mode 0600. A socket file nobody
/// listens on is replaced; one with a live server is `SocketInUse`.
pub(crate) fn bind_private(path: &Path) -> Result<UnixListener, NbdError> {
    if let Ok(m) = fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists).into());
        }
        if UnixStream::connect(path).is_ok() {
            return Err(NbdError::SocketInUse(path.to_path_buf()));
        }
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or(io::Error::from(io::ErrorKind::InvalidInput))?;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = format!(".{}.{}.{n}.tmp", name.to_string_lossy(), std::process::id());
    let tmp = dir.join(tmp);
    fs::DirBuilder::new().mode(0o700).create(&tmp)?;
    let r = bind_in(&tmp, path);
    let _ = fs::remove_dir(&tmp);
    r
}

fn bind_in(tmp: &Path, path: &Path) -> Result<UnixListener, NbdError> {
    let inner = tmp.join("s");
    let l = UnixListener::bind(&inner)?;
    fs::set_permissions(&inner, fs::Permissions::from_mode(0o600))?;
    if let Err(e) = fs::rename(&inner, path) {
        let _ = fs::remove_file(&inner);
        return Err(e.into());
    }
    Ok(l)
}
