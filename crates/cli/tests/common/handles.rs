//! File handles as an NFS server takes them (`name_to_handle_at`) and
//! opens them again (`open_by_handle_at`), for the tests of handles.

use super::{cpath, cvt};
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// `struct file_handle` with room for any handle FUSE makes.
#[repr(C)]
pub struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; 128],
}

pub fn handle_of(p: &Path) -> Handle {
    let mut h = Handle {
        bytes: 128,
        kind: 0,
        data: [0; 128],
    };
    let mut mount_id = 0;
    // SAFETY: `h` starts like `struct file_handle` with 128 bytes of room,
    // as `bytes` says; the path is a NUL-terminated string.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            cpath(p).as_ptr(),
            std::ptr::from_mut(&mut h).cast(),
            &mut mount_id,
            0,
        )
    };
    cvt(r.into()).unwrap_or_else(|e| panic!("name_to_handle_at {}: {e}", p.display()));
    h
}

/// Opens the file `h` names in the mount `mnt`.
pub fn open_by(mnt: &Path, h: &mut Handle, flags: i32) -> std::io::Result<fs::File> {
    let root = fs::File::open(mnt)?;
    // SAFETY: `h` came from name_to_handle_at; the descriptor is open.
    let fd =
        unsafe { libc::open_by_handle_at(root.as_raw_fd(), std::ptr::from_mut(h).cast(), flags) };
    cvt(fd.into())?;
    // SAFETY: a descriptor just returned to us and owned by nobody else.
    Ok(fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}
