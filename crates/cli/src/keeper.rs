//! `cairn mount --keep-mount` and `cairn restart`: a keeper process holds
//! the mount's FUSE connection and runs the daemon as its child, so that a
//! daemon can hand the mount to the next one without unmounting it (the
//! mechanism, and the state that crosses, are cairn-fuse's `handover`).
//!
//! The keeper starts a daemon with its end of a link (`CAIRN_KEEPER_FD`);
//! the daemon mounts and sends the connection. On `cairn restart` the
//! daemon stops reading requests, finishes those under way, commits, sends
//! its state and exits; the keeper starts the binary at the same path
//! again with the connection and the state (`CAIRN_KEEPER_RESUME`), which
//! opens the pool and serves the requests that waited. A daemon that dies
//! without handing over ends the mount as it would without a keeper: what
//! it had not committed is gone, and callers must see that (ENOTCONN)
//! rather than a mount that silently lost their writes.

use crate::args::MountArgs;
use anyhow::{bail, Context, Result};
use cairn_fuse::handover::{Handover, Link, Message, Tag};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Set in a daemon started to take a mount over.
pub const RESUME_ENV: &str = "CAIRN_KEEPER_RESUME";

/// The running daemon's drain, for the control socket's `restart`.
static DRAIN: OnceLock<cairn_fuse::Drainer> = OnceLock::new();

/// Runs the keeper of a mount (this process, in the foreground) until the
/// mount ends.
pub fn run(pool: &Path, a: &MountArgs, ready: &crate::ready::Ready) -> Result<()> {
    crate::daemon::init_logging();
    let exe = std::env::current_exe()?;
    let child_pid = std::sync::Arc::new(AtomicI32::new(0));
    forward_signals(child_pid.clone())?;
    // An encrypted pool's key goes to every daemon: its key file, or the
    // secret `cairn mount` piped to us, held here (each daemon holds it
    // anyway).
    let secret = match crate::key::key_file() {
        Some(_) => None,
        None => crate::key::secret_for(pool)?,
    };
    let daemon = Daemon {
        exe,
        pool,
        args: a,
        secret,
    };
    // The first daemon reports to `cairn mount` itself.
    let mut report = ready.pass_on();
    let mut resume: Option<(OwnedFd, Handover)> = None;
    loop {
        let (mut child, link) = daemon.start(resume.is_some(), report.take())?;
        child_pid.store(i32::try_from(child.id()).unwrap_or(0), Ordering::SeqCst);
        deliver_pending(&child_pid);
        let held = match resume.take() {
            Some((fd, h)) => {
                link.send(Tag::Resume, &h.encode(), Some(fd.as_fd()))
                    .context("handing the mount to the new daemon")?;
                Some(fd)
            }
            None => None,
        };
        let (conn, state) = follow(&link, held);
        let status = child.wait()?;
        child_pid.store(0, Ordering::SeqCst);
        match ended(child.id(), status, conn, state)? {
            Some(next) => resume = Some(next),
            None => return Ok(()),
        }
    }
}

/// How the keeper starts each daemon.
struct Daemon<'a> {
    exe: std::path::PathBuf,
    pool: &'a Path,
    args: &'a MountArgs,
    secret: Option<cairn_crypt::Secret>,
}

impl Daemon<'_> {
    /// Starts the binary at `exe` with its end of a new link (told to
    /// take a mount over when `resume`), the pool's key, and `report`, the
    /// status pipe to `cairn mount`, if it is the first.
    fn start(&self, resume: bool, report: Option<std::fs::File>) -> Result<(Child, Link)> {
        let (ours, theirs) = Link::pair()?;
        let mut cmd = crate::daemon::daemon_command_at(&self.exe, self.pool, self.args)?;
        pass_link(&mut cmd, &theirs, resume);
        let _key_pipe = match (crate::key::key_file(), &self.secret) {
            (Some(f), _) => {
                cmd.arg("--key-file").arg(std::path::absolute(f)?);
                None
            }
            (None, Some(s)) => Some(crate::key::pass_to(s, &mut cmd)?),
            (None, None) => None,
        };
        if report.is_none() {
            cmd.env_remove(crate::ready::ENV);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting the daemon {}", self.exe.display()))?;
        Ok((child, ours))
    }
}

/// What follows a daemon's exit: the mount to hand the next one, or the
/// keeper's end (Ok when the daemon ended the mount, an error when it died
/// without handing over, which ends the mount).
fn ended(
    pid: u32,
    status: std::process::ExitStatus,
    conn: Option<OwnedFd>,
    state: Option<Handover>,
) -> Result<Option<(OwnedFd, Handover)>> {
    let conn = match (conn, state) {
        (Some(conn), Some(h)) => {
            tracing::info!("daemon (pid {pid}) handed the mount over; starting the next");
            return Ok(Some((conn, h)));
        }
        (conn, _) => conn,
    };
    // Dropping the last copy of the connection ends the mount.
    let mounted = conn.is_some();
    drop(conn);
    if status.success() {
        tracing::info!("the daemon ended the mount; the keeper exits");
        return Ok(None);
    }
    let how = match status.signal() {
        Some(s) => format!("was killed by signal {s}"),
        None => format!("exited with {status}"),
    };
    let ends = match mounted {
        true => "; the mount ends (unmount it with `fusermount3 -u -z`, then mount again)",
        false => "",
    };
    bail!("the daemon (pid {pid}) {how} without handing the mount over{ends}");
}

/// Reads the daemon's messages until it closes its end: the connection
/// (or `held`, the one it was given) and the handover state, if it sent
/// one.
fn follow(link: &Link, mut held: Option<OwnedFd>) -> (Option<OwnedFd>, Option<Handover>) {
    let mut state = None;
    loop {
        let m: Message = match link.recv() {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => {
                tracing::warn!("keeper link: {e}");
                break;
            }
        };
        match (m.tag, m.fd) {
            (Tag::Mounted, Some(fd)) => held = Some(fd),
            (Tag::State, _) => match Handover::decode(&m.body) {
                Ok(h) => state = Some(h),
                Err(e) => tracing::error!("the daemon's handover state is refused: {e}"),
            },
            (tag, _) => tracing::warn!("keeper link: unexpected {tag:?} from the daemon"),
        }
    }
    (held, state)
}

/// Lets the child inherit its end of the link and names it.
fn pass_link(cmd: &mut Command, theirs: &Link, resume: bool) {
    let fd = theirs.raw_fd();
    cmd.env(cairn_fuse::handover::link::ENV, fd.to_string());
    if resume {
        cmd.env(RESUME_ENV, "1");
    } else {
        cmd.env_remove(RESUME_ENV);
    }
    // SAFETY: fcntl is async-signal-safe; clears close-on-exec in the
    // child only.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// SIGTERM, SIGINT and SIGHUP to the keeper go to the daemon, which
/// flushes and unmounts (stop.rs); the keeper exits after it.
fn forward_signals(child: std::sync::Arc<AtomicI32>) -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    std::thread::Builder::new()
        .name("keeper-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                PENDING.store(sig, Ordering::SeqCst);
                deliver_pending(&child);
            }
        })?;
    Ok(())
}

/// A daemon's link to its keeper and, when it takes a mount over, the
/// connection and the state it takes.
pub type DaemonLink = (Link, Option<(OwnedFd, Handover)>);

/// A stop signal not yet delivered (0: none): one that comes between two
/// daemons goes to the next as soon as it runs.
static PENDING: AtomicI32 = AtomicI32::new(0);

/// Sends the pending stop signal to the daemon, if one runs.
fn deliver_pending(child: &AtomicI32) {
    let pid = child.load(Ordering::SeqCst);
    if pid > 0 {
        let sig = PENDING.swap(0, Ordering::SeqCst);
        if sig != 0 {
            // SAFETY: kill sends a signal to our own child.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

/// The daemon side: the link to its keeper, if it has one, and the state
/// to take over when it was started for that.
pub fn daemon_link() -> Result<Option<DaemonLink>> {
    let Some(link) = Link::from_env() else {
        return Ok(None);
    };
    if std::env::var_os(RESUME_ENV).is_none() {
        return Ok(Some((link, None)));
    }
    let m = link.recv().context("receiving the mount from the keeper")?;
    let (Tag::Resume, Some(fd)) = (m.tag, m.fd) else {
        bail!(
            "the keeper sent {:?} instead of the mount to take over",
            m.tag
        );
    };
    let h = Handover::decode(&m.body)?;
    Ok(Some((link, Some((fd, h)))))
}

/// Registers the drain `restart` uses and gives the keeper the connection.
pub fn mounted(link: &Link, h: &cairn_fuse::Handing) -> Result<()> {
    let _ = DRAIN.set(h.drainer());
    if let Some(c) = &h.connection {
        link.send(Tag::Mounted, &[], Some(c.as_fd()))?;
    }
    Ok(())
}

/// The keeper's pid, in a daemon that has one (`cairn info`).
pub fn keeper_pid() -> Option<u32> {
    DRAIN.get()?;
    // SAFETY: getppid has no preconditions.
    u32::try_from(unsafe { libc::getppid() }).ok()
}

/// The control socket's `restart`: commits what is buffered (a pool that
/// cannot commit now, a full host, keeps its daemon and says why), then
/// asks the session to drain.
pub fn hand_over(fs: &cairn_fs::Fs) -> Result<serde_json::Value, cairn_fs::FsError> {
    let Some(d) = DRAIN.get() else {
        return Err(cairn_fs::FsError::BadRequest(
            "this mount has no keeper: a daemon can be restarted under a mount made with \
             `cairn mount --keep-mount`; unmount and mount again with it"
                .into(),
        ));
    };
    fs.flush().map_err(|e| {
        cairn_fs::FsError::BadRequest(format!(
            "restart refused, this daemon serves on: it cannot commit what is buffered now ({e})"
        ))
    })?;
    tracing::info!("restart asked: finishing the requests under way, then handing the mount over");
    d.drain();
    Ok(serde_json::json!({ "handing_over": true, "pid": std::process::id() }))
}

/// `cairn restart MNT`: asks the daemon to hand over and waits for the
/// next one to answer.
pub fn restart(mnt: &Path) -> Result<()> {
    let mnt = mnt
        .canonicalize()
        .with_context(|| format!("{}", mnt.display()))?;
    let Some((_, pool)) = crate::daemon::cairn_mounts()?
        .into_iter()
        .find(|(m, _)| *m == mnt)
    else {
        bail!("{} is not a mounted Cairn pool", mnt.display());
    };
    let pool = Path::new(&pool);
    let Some(old) = crate::daemon_wait::Daemon::of_pool(pool) else {
        bail!(
            "no daemon answers for {} (is it still starting?)",
            pool.display()
        );
    };
    crate::control::client::call(&mnt, crate::control::protocol::Request::Restart)?;
    let wait = Duration::from_secs(120);
    if !old.wait_exit(wait) {
        bail!(
            "the daemon (pid {}) is still finishing after {} s; see {}",
            old.pid,
            wait.as_secs(),
            cairn_fs::pool::PoolPaths::log(pool).display()
        );
    }
    let deadline = Instant::now() + wait;
    loop {
        if let Some(new) = crate::daemon_wait::Daemon::of_pool(pool) {
            if new.pid != old.pid && std::fs::metadata(&mnt).is_ok() {
                println!(
                    "restarted the daemon of {} on {} (pid {} -> {})",
                    pool.display(),
                    mnt.display(),
                    old.pid,
                    new.pid
                );
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!(
                "no new daemon answers for {} after {} s; see {}",
                pool.display(),
                wait.as_secs(),
                cairn_fs::pool::PoolPaths::log(pool).display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether this process is a daemon run by a keeper.
pub fn has_keeper() -> bool {
    std::env::var_os(cairn_fuse::handover::link::ENV).is_some()
}
