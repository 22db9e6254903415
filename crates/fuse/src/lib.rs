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

pub use ops::CairnFuse;
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

/// The mount's source name: the pool path, so tools can find the pool.
fn fsname(fs: &Fs) -> String {
    fs.pool().path.display().to_string()
}

fn prepare(t: &TransportOptions) -> std::io::Result<Option<fuser::UringConfig>> {
    transport::prepare(t).map_err(std::io::Error::other)
}
