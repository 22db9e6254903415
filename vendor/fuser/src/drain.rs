//! Draining a session without unmounting (added by Cairn): the /dev/fuse
//! readers wait in `poll` on their descriptor and on an eventfd; `drain`
//! wakes them all and they return without reading another request, so
//! every request the kernel queued after that stays queued for whoever
//! reads the connection next (a daemon that takes the descriptor over).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a reader found when it waited.
pub(crate) enum Ready {
    /// A request may be there (or the connection ended): read.
    Read,
    /// The session is draining: stop reading.
    Drained,
}

#[derive(Debug)]
struct Inner {
    event: OwnedFd,
    draining: AtomicBool,
}

/// Stops a session's readers between requests (see the module comment).
#[derive(Debug, Clone)]
pub struct Drain(Arc<Inner>);

impl PartialEq for Drain {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Drain {}

impl Drain {
    /// A drain not yet asked for.
    pub fn new() -> io::Result<Drain> {
        // SAFETY: eventfd has no memory preconditions; the fd it returns
        // is owned here.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and nobody else owns it.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Drain(Arc::new(Inner {
            event,
            draining: AtomicBool::new(false),
        })))
    }

    /// Asks every reader to stop after the request it is serving.
    pub fn drain(&self) {
        self.0.draining.store(true, Ordering::SeqCst);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        let _ = unsafe {
            libc::write(
                self.0.event.as_raw_fd(),
                (&raw const one).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Whether `drain` was called.
    pub fn is_draining(&self) -> bool {
        self.0.draining.load(Ordering::SeqCst)
    }

    /// Makes `dev` non-blocking, so that a reader woken with others for
    /// one request goes back to waiting instead of blocking in `read`.
    pub(crate) fn prepare(dev: BorrowedFd<'_>) -> io::Result<()> {
        let fd = dev.as_raw_fd();
        // SAFETY: fcntl on a descriptor we hold only changes its flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits until `dev` has a request (or ended) or the drain is asked.
    pub(crate) fn wait(&self, dev: BorrowedFd<'_>) -> io::Result<Ready> {
        loop {
            if self.is_draining() {
                return Ok(Ready::Drained);
            }
            let mut fds = [
                libc::pollfd {
                    fd: dev.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.0.event.as_fd().as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: polls two pollfd entries of a live array.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if fds[1].revents != 0 {
                return Ok(Ready::Drained);
            }
            if fds[0].revents != 0 {
                return Ok(Ready::Read);
            }
        }
    }
}
