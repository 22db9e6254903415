//! FUSE frontend: maps the kernel's requests onto `cairn_fs::Fs`. Mounted
//! with default_permissions (the kernel checks permissions), allow_other when
//! run as root, without OPEN and RELEASE requests (opens.rs), 1 MiB writes,
//! readdirplus and parallel directory operations, served by several threads
//! with cloned fds and, where the kernel has it, by FUSE over io_uring
//! (transport.rs); the mount's read-ahead is raised once it exists (bdi.rs).
//! Requests are counted and timed for the metrics endpoint when enabled
//! (metrics.rs).

mod attr;
mod bdi;
pub mod handover;
pub mod metrics;
mod nocase;
mod opens;
mod ops;
mod ratelimit;
mod transport;
mod views;
pub mod workers;

use cairn_fs::Fs;
use fuser::{Config, MountOption, SessionACL};
use std::path::Path;
use std::sync::Arc;

pub use fuser::BackgroundSession;
pub use ops::{negotiate, CairnFuse};
pub use transport::{RingPriority, Transport, TransportError, TransportOptions};

/// Mount options for a pool.
pub fn config(threads: usize, fsname: &str, uring: Option<fuser::UringConfig>) -> Config {
    config_ro(threads, fsname, uring, false)
}

/// `config`, read-only (EROFS for every change) when `ro`: a mirror pool.
pub fn config_ro(
    threads: usize,
    fsname: &str,
    uring: Option<fuser::UringConfig>,
    ro: bool,
) -> Config {
    let mut c = Config::default();
    c.mount_options = vec![
        MountOption::FSName(fsname.into()),
        MountOption::Subtype("cairn".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        MountOption::Dev,
        MountOption::Suid,
    ];
    if ro {
        c.mount_options.push(MountOption::RO);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        c.acl = SessionACL::All;
    }
    c.n_threads = Some(threads.max(2));
    c.clone_fd = true;
    c.io_uring = uring;
    c
}

/// Mounts and serves until unmounted. Returns after the session ends.
pub fn serve(
    fs: Arc<Fs>,
    mountpoint: &Path,
    threads: usize,
    transport: &TransportOptions,
) -> std::io::Result<()> {
    let cfg = config_ro(threads, &fsname(&fs), prepare(transport)?, fs.read_only());
    let fuse = CairnFuse::new(fs);
    let invalidator = fuse.invalidator();
    let session = fuser::Session::new(fuse, mountpoint, &cfg)?;
    invalidator.set(session.notifier());
    bdi::tune(mountpoint);
    session.run()
}

/// Serves another file system with Cairn's mount options and transport
/// until unmounted: the in-memory file system that measures the FUSE
/// ceiling in bench/roundtrip.sh, so that it crosses the same way.
pub fn serve_other<F: fuser::Filesystem>(
    other: F,
    mountpoint: &Path,
    fsname: &str,
    threads: usize,
    transport: &TransportOptions,
) -> std::io::Result<()> {
    let cfg = config(threads, fsname, prepare(transport)?);
    let session = fuser::Session::new(other, mountpoint, &cfg)?;
    bdi::tune(mountpoint);
    session.run()
}

/// Mounts in background threads; the returned session unmounts on drop.
pub fn spawn(
    fs: Arc<Fs>,
    mountpoint: &Path,
    threads: usize,
    transport: &TransportOptions,
) -> std::io::Result<fuser::BackgroundSession> {
    let cfg = config_ro(threads, &fsname(&fs), prepare(transport)?, fs.read_only());
    let fuse = CairnFuse::new(fs);
    let invalidator = fuse.invalidator();
    let session = fuser::spawn_mount(fuse, mountpoint, &cfg)?;
    invalidator.set(session.notifier());
    bdi::tune(mountpoint);
    Ok(session)
}

/// A mount whose connection another daemon can take over (`cairn
/// restart`): its readers can be drained, and what the kernel holds of it
/// can be handed on (handover/).
pub struct Handing {
    drainer: Drainer,
    views: Arc<views::Views>,
    init: Vec<u8>,
    /// A copy of the connection, for the keeper (a fresh mount only).
    pub connection: Option<std::os::fd::OwnedFd>,
}

/// Stops a handing mount's readers (drain.rs in fuser): each leaves after
/// the request it serves next, and a reader waiting for one is sent a
/// harmless request of our own (a getxattr of the root) until none reads.
#[derive(Clone)]
pub struct Drainer {
    drain: fuser::Drain,
    mountpoint: std::path::PathBuf,
}

impl Drainer {
    /// Starts the drain; the session then ends once the requests under
    /// way are answered, flushing the pool (`destroy`); the mount stays.
    pub fn drain(&self) {
        self.drain.drain();
        let me = self.clone();
        let kicker = std::thread::Builder::new().name("fuse-drain".into());
        let started = kicker.spawn(move || me.wake_readers());
        if let Err(e) = started {
            tracing::error!("draining the FUSE readers: {e}");
        }
    }

    /// Sends requests until every reader has left (at most 30 s). A
    /// request sent as the last reader leaves waits for the next daemon,
    /// which answers it; this thread ends with the process meanwhile.
    fn wake_readers(&self) {
        let root = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes())
            .expect("a mount point has no NUL");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.drain.active() > 0 && std::time::Instant::now() < deadline {
            let mut b = [0u8; 1];
            // SAFETY: getxattr of a NUL-terminated path and name into a
            // buffer of the length given; ENODATA is the answer.
            unsafe {
                libc::getxattr(
                    root.as_ptr(),
                    c"user.cairn.drain".as_ptr(),
                    b.as_mut_ptr().cast(),
                    1,
                )
            };
        }
        if self.drain.active() > 0 {
            tracing::error!(
                "{} FUSE readers did not stop within 30 s",
                self.drain.active()
            );
        }
    }
}

impl Handing {
    /// A handle on the drain, for whoever asks for it later.
    pub fn drainer(&self) -> Drainer {
        self.drainer.clone()
    }

    /// Whether the session ended by a drain (not an unmount).
    pub fn draining(&self) -> bool {
        self.drainer.drain.is_draining()
    }

    /// What the next daemon needs, once the session has ended.
    pub fn state(&self, fs: &Fs) -> handover::Handover {
        handover::Handover {
            init: self.init.clone(),
            refs: fs.kernel_refs(),
            views: self.views.export(),
        }
    }
}

/// `spawn` for a mount that can be handed over: mounts afresh, or takes
/// over `resume`'s connection (the INIT it carries runs `init` again; the
/// kernel gets no reply). Served from /dev/fuse only: FUSE over io_uring
/// keeps requests in the dead process's ring entries.
pub fn spawn_handing(
    fs: Arc<Fs>,
    mountpoint: &Path,
    threads: usize,
    resume: Option<(std::os::fd::OwnedFd, handover::Handover)>,
) -> std::io::Result<(fuser::BackgroundSession, Handing)> {
    let mut cfg = config_ro(threads, &fsname(&fs), None, fs.read_only());
    let drain = fuser::Drain::new();
    cfg.drain = Some(drain.clone());
    let views = Arc::new(match &resume {
        Some((_, h)) => views::Views::adopt(&h.views),
        None => views::Views::default(),
    });
    let fuse = CairnFuse::with_views(fs, views.clone());
    let inval = fuse.invalidator();
    let (session, connection) = match resume {
        Some((fd, h)) => (fuser::Session::resume(fuse, fd, &cfg, &h.init)?, None),
        None => {
            let s = fuser::Session::new(fuse, mountpoint, &cfg)?;
            let dup = std::os::fd::AsFd::as_fd(&s).try_clone_to_owned()?;
            (s, Some(dup))
        }
    };
    inval.set(session.notifier());
    let init = session.init_request().unwrap_or_default().to_vec();
    let bg = session.spawn()?;
    bdi::tune(mountpoint);
    let drainer = Drainer {
        drain,
        mountpoint: mountpoint.to_path_buf(),
    };
    Ok((
        bg,
        Handing {
            drainer,
            views,
            init,
            connection,
        },
    ))
}

/// The mount's source name: the pool path, so tools can find the pool.
fn fsname(fs: &Fs) -> String {
    fs.pool().path.display().to_string()
}

fn prepare(t: &TransportOptions) -> std::io::Result<Option<fuser::UringConfig>> {
    transport::prepare(t).map_err(std::io::Error::other)
}
