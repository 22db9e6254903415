//! The daemon of a mounted pool, found by its control socket (the pid of
//! the process listening there) and held by a pidfd, so that `cairn
//! umount` waits for that process itself to exit, whatever happens to the
//! pool's lock file meanwhile.

use cairn_fs::pool::PoolPaths;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The daemon serving `pool`: its pid and a pidfd on it.
pub struct Daemon {
    pub pid: i32,
    fd: OwnedFd,
}

impl Daemon {
    /// The process listening on the pool's control socket, if one answers
    /// (and this user may connect).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "pidfd_open returns an fd, a c_int, in a c_long"
    )]
    pub fn of_pool(pool: &Path) -> Option<Daemon> {
        let s = UnixStream::connect(PoolPaths::control(pool)).ok()?;
        let pid = peer_pid(&s)?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the fd was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Some(Daemon { pid, fd })
    }

    /// Waits up to `timeout` for the process to exit; whether it did.
    pub fn wait_exit(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut p = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, ms) };
            if n > 0 {
                return true;
            }
            let interrupted =
                n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
            if !interrupted || left.is_zero() {
                return false;
            }
        }
    }
}

/// The pid of the process at the other end of a Unix socket.
#[allow(
    clippy::cast_possible_truncation,
    reason = "size_of::<ucred>() is 12 bytes"
)]
fn peer_pid(s: &UnixStream) -> Option<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the size given.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid)
}
