//! The socket between a mount's keeper and its daemon: framed messages,
//! each a tag, a length and a body, with at most one descriptor passed
//! alongside (SCM_RIGHTS). The daemon sends `MOUNTED` with the /dev/fuse
//! connection once mounted and `STATE` with the handover state when it
//! gives the mount up; the keeper sends `RESUME` with both to the next.

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The environment variable naming a daemon's end of the link.
pub const ENV: &str = "CAIRN_KEEPER_FD";
/// A larger body is refused (some 30 million lookup references).
const MAX_BODY: usize = 512 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Tag {
    /// Daemon to keeper: mounted; the descriptor is the connection.
    Mounted = 1,
    /// Daemon to keeper: the mount is given up; the body is the state.
    State = 2,
    /// Keeper to daemon: take the mount over (descriptor and state).
    Resume = 3,
}

impl Tag {
    fn from_u8(b: u8) -> io::Result<Tag> {
        match b {
            1 => Ok(Tag::Mounted),
            2 => Ok(Tag::State),
            3 => Ok(Tag::Resume),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("keeper link: unknown message {b}"),
            )),
        }
    }
}

/// One message as received.
pub struct Message {
    pub tag: Tag,
    pub body: Vec<u8>,
    pub fd: Option<OwnedFd>,
}

pub struct Link(UnixStream);

impl Link {
    /// Two connected ends, close-on-exec (the daemon's end is made
    /// inheritable by whoever starts the daemon).
    pub fn pair() -> io::Result<(Link, Link)> {
        let (a, b) = UnixStream::pair()?;
        Ok((Link(a), Link(b)))
    }

    /// The daemon's end, when its keeper named one in the environment.
    pub fn from_env() -> Option<Link> {
        let fd: RawFd = std::env::var(ENV).ok()?.parse().ok()?;
        // SAFETY: the keeper passed this descriptor for the link alone; it
        // is taken over once and made close-on-exec so helpers do not
        // inherit it.
        unsafe {
            if fd <= 2 || libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) != 0 {
                return None;
            }
            Some(Link(UnixStream::from_raw_fd(fd)))
        }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    pub fn send(&self, tag: Tag, body: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let len = u32::try_from(body.len())
            .ok()
            .filter(|&l| l as usize <= MAX_BODY)
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "keeper link: body too large")
            })?;
        let mut head = [0u8; 5];
        head[0] = tag as u8;
        head[1..].copy_from_slice(&len.to_le_bytes());
        let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
        let sent = sendmsg::<()>(
            self.0.as_raw_fd(),
            &[IoSlice::new(&head)],
            cmsgs,
            MsgFlags::empty(),
            None,
        )?;
        (&self.0).write_all(&head[sent..])?;
        (&self.0).write_all(body)
    }

    pub fn recv(&self) -> io::Result<Message> {
        let mut head = [0u8; 5];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let mut iov = [IoSliceMut::new(&mut head)];
        let msg = recvmsg::<()>(
            self.0.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let got = msg.bytes;
        let mut fd = None;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for f in fds {
                    // SAFETY: the kernel just installed this descriptor
                    // for us; nobody else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(f) };
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
        }
        if got == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "keeper link closed",
            ));
        }
        (&self.0).read_exact(&mut head[got..])?;
        let tag = Tag::from_u8(head[0])?;
        let len = u32::from_le_bytes(head[1..].try_into().expect("4 bytes")) as usize;
        if len > MAX_BODY {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "keeper link: body too large",
            ));
        }
        let mut body = vec![0u8; len];
        (&self.0).read_exact(&mut body)?;
        Ok(Message { tag, body, fd })
    }
}
