//! The status pipe between `cairn mount` and the daemon it starts: the
//! daemon writes `OK` once the mount is up, or `ERR message` when it
//! fails, so the parent exits 0 only for a working mount and prints the
//! daemon's real error. The pipe's write end reaches the daemon as the fd
//! named by `CAIRN_READY_FD`.

use anyhow::Result;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

pub const ENV: &str = "CAIRN_READY_FD";

/// The daemon's end: reports once, then closes.
pub struct Ready(std::sync::Mutex<Option<File>>);

impl Ready {
    /// The pipe named in the environment, if this process has one.
    pub fn from_env() -> Ready {
        let fd = std::env::var(ENV).ok().and_then(|v| v.parse::<i32>().ok());
        // SAFETY: fcntl on an fd number only inspects or flags it; the fd
        // is taken over only if it is open, and it was passed to us for
        // this purpose. It is made close-on-exec so that helpers we start
        // (fusermount3) do not hold the pipe open.
        let file = fd.filter(|&fd| fd > 2).and_then(|fd| unsafe {
            (libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) == 0).then(|| File::from_raw_fd(fd))
        });
        Ready(std::sync::Mutex::new(file))
    }

    /// Gives the pipe up to a child started next (a keeper's first daemon
    /// reports on it, keeper.rs): inheritable until the returned copy, this
    /// process's, is dropped after the spawn.
    pub fn pass_on(&self) -> Option<File> {
        let f = self.0.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        // SAFETY: clears close-on-exec of a descriptor we own.
        let ok = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, 0) } == 0;
        ok.then_some(f)
    }

    pub fn ok(&self) {
        self.send("OK\n");
    }

    pub fn fail(&self, why: &str) {
        self.send(&format!("ERR {}\n", why.replace('\n', " / ")));
    }

    fn send(&self, msg: &str) {
        if let Some(mut f) = self.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = f.write_all(msg.as_bytes());
        }
    }
}

/// The parent's end.
pub struct StatusPipe {
    read: File,
    write: Option<OwnedFd>,
}

impl StatusPipe {
    pub fn new() -> Result<StatusPipe> {
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 fills two fds we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: both fds were just created and are owned by nobody else.
        let (r, w) = unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(StatusPipe {
            read: r,
            write: Some(w),
        })
    }

    /// Lets the child inherit the write end (close-on-exec is cleared in
    /// the child only) and names it in its environment.
    pub fn pass_to(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let fd = self.write.as_ref().expect("write end").as_raw_fd();
        cmd.env(ENV, fd.to_string());
        // SAFETY: fcntl is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Waits for the daemon's word: Some(Ok) mounted, Some(Err(message))
    /// failed, None if it closed the pipe without a word (it died) or
    /// `timeout` passed. Closes our copy of the write end first.
    pub fn wait(mut self, timeout: Duration) -> Option<std::result::Result<(), String>> {
        self.write = None;
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.contains(&b'\n') {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !readable(&self.read, left) {
                return None;
            }
            match self.read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let s = String::from_utf8_lossy(&got);
        let line = s.lines().next()?;
        match line.strip_prefix("ERR ") {
            Some(why) => Some(Err(why.replace(" / ", "\n"))),
            None if line == "OK" => Some(Ok(())),
            None => None,
        }
    }
}

/// Waits up to `timeout` for data or EOF on `f`.
fn readable(f: &File, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}
