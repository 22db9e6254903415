//! Stopping a mounted daemon on SIGTERM, SIGINT or SIGHUP: the pool is
//! flushed first (what was written is durable), then unmounted. A mount
//! that is busy (open files, a working directory inside) is aborted and
//! detached, so that the daemon ends its session, makes its final commit
//! and exits. Every signal is logged, also those that come while stopping.

use anyhow::Result;
use cairn_fs::Fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

/// Starts the thread that waits for the stop signals of the daemon.
pub fn on_signals(fs: Arc<Fs>, mnt: PathBuf) -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    std::thread::Builder::new()
        .name("cairn-signals".into())
        .spawn(move || {
            let mut stopper: Option<std::thread::JoinHandle<()>> = None;
            for sig in signals.forever() {
                let name = signal_name(sig);
                if stopper.as_ref().is_some_and(|h| !h.is_finished()) {
                    tracing::info!(
                        "{name} received: already stopping (flushing and unmounting {})",
                        mnt.display()
                    );
                    continue;
                }
                let again = if stopper.is_some() { " again" } else { "" };
                tracing::info!(
                    "{name} received: flushing, then unmounting {}{again}",
                    mnt.display()
                );
                let (fs, mnt) = (fs.clone(), mnt.clone());
                stopper = std::thread::Builder::new()
                    .name("cairn-stop".into())
                    .spawn(move || stop(&fs, &mnt))
                    .inspect_err(|e| tracing::warn!("cannot start the stop thread: {e}"))
                    .ok();
            }
        })?;
    Ok(())
}

fn signal_name(sig: i32) -> String {
    signal_hook::low_level::signal_name(sig).map_or_else(|| format!("signal {sig}"), str::to_owned)
}

/// Flushes, then unmounts; a busy mount is aborted and detached.
fn stop(fs: &Fs, mnt: &Path) {
    if let Err(e) = fs.flush() {
        tracing::warn!("flushing before the unmount: {e}");
    }
    if !still_ours(fs, mnt) {
        tracing::info!(
            "{} is no longer this pool's mount; the daemon exits once the kernel lets go of it",
            mnt.display()
        );
        return;
    }
    let said = match fusermount(&["-u"], mnt) {
        Ok(()) => return,
        Err(said) => said,
    };
    tracing::warn!(
        "unmounting {}: {said}; aborting what still uses it and detaching it",
        mnt.display()
    );
    detach(mnt);
}

/// Whether `mnt` still is this pool's mount (a later signal after a
/// detach must not unmount whatever was mounted there since).
fn still_ours(fs: &Fs, mnt: &Path) -> bool {
    let pool = &fs.pool().path;
    crate::daemon::cairn_mounts()
        .is_ok_and(|m| m.iter().any(|(m, p)| m == mnt && Path::new(p) == pool))
}

/// Runs `fusermount3 ARGS MNT`; its complaint when it fails.
fn fusermount(args: &[&str], mnt: &Path) -> std::result::Result<(), String> {
    let out = Command::new("fusermount3")
        .args(args)
        .arg(mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("running fusermount3: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "fusermount3 says: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Aborts the mount's FUSE connection (a forced unmount does that for
/// FUSE: open files inside then fail with ENOTCONN and the session ends),
/// then detaches the mount point. Forcing needs root; without it the
/// mount is only detached and the daemon exits once it is let go.
fn detach(mnt: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(mnt.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: umount2 with a valid NUL-terminated path.
    let forced = unsafe { libc::umount2(c.as_ptr(), libc::MNT_FORCE) };
    let force_err = std::io::Error::last_os_error();
    // Once a forced unmount succeeded, the path is no longer this mount:
    // nothing is detached then (it could be another mount below).
    // SAFETY: as above.
    let detached = forced == 0
        || unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0
        || fusermount(&["-u", "-z"], mnt).is_ok();
    let aborted = forced == 0 || force_err.raw_os_error() == Some(libc::EBUSY);
    match (aborted, detached) {
        (true, true) => tracing::info!(
            "{}: connection aborted and mount detached; finishing",
            mnt.display()
        ),
        (false, true) => tracing::warn!(
            "{} detached; its connection could not be aborted ({force_err}): the daemon exits when the last file open inside is closed",
            mnt.display()
        ),
        (_, false) => tracing::warn!(
            "{} could not be detached; stop what uses it (`fuser -vm {}`) and send the signal again",
            mnt.display(),
            mnt.display()
        ),
    }
}
