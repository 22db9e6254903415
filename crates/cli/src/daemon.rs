//! Mounting: the foreground server, the background daemon (a child of
//! ourselves with --foreground, detached, logging to POOL/cairn.log) and
//! unmounting (fusermount3 -u, then wait for the daemon to release the pool).

use crate::args::MountArgs;
use anyhow::{bail, Context, Result};
use cairn_devices::backend::PlanStorage;
use cairn_devices::HostStorage;
use cairn_fs::pool::PoolPaths;
use cairn_fs::{Fs, Pool, PoolConfig};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn config_for(a: &MountArgs) -> Result<PoolConfig> {
    let mut c = PoolConfig::load(&PoolPaths::config(&a.pool))?;
    if let Some(s) = a.commit_interval {
        c.commit_interval_secs = s;
    }
    if let Some(d) = a.dirty_limit {
        c.dirty_limit_mib = (d >> 20).max(1);
    }
    if let Some(z) = &a.compression {
        c.compression = z.clone();
    }
    c.discard_damaged_log = a.discard_damaged_log;
    c.degraded = a.degraded;
    crate::nbd::apply(&mut c, &a.nbd)?;
    if let Some(m) = &a.metrics {
        c.metrics_listen = m.clone();
    }
    c.metrics_allow_remote |= a.metrics_allow_remote;
    c.metrics_detail |= a.metrics_detail;
    c.validate()?;
    crate::nbd::tcp_security(&c)?;
    Ok(c)
}

pub fn mount(a: MountArgs) -> Result<()> {
    // A daemon started by `cairn mount` reports its outcome to the parent.
    let ready = crate::ready::Ready::from_env();
    let r = mount_checked(a, &ready);
    if let Err(e) = &r {
        ready.fail(&crate::error_chain(e));
    }
    r
}

fn mount_checked(a: MountArgs, ready: &crate::ready::Ready) -> Result<()> {
    let pool = a
        .pool
        .canonicalize()
        .with_context(|| format!("pool {}", a.pool.display()))?;
    cairn_fs::pool::read_superblock(&pool)?;
    if !a.mountpoint.is_dir() {
        bail!("mount point {} is not a directory", a.mountpoint.display());
    }
    let mnt = a.mountpoint.canonicalize()?;
    refuse_inside_pool(&mnt, &pool)?;
    // A daemon started to take a mount over finds it mounted.
    let resuming =
        crate::keeper::has_keeper() && std::env::var_os(crate::keeper::RESUME_ENV).is_some();
    if !resuming {
        refuse_mount_point(&mnt)?;
    }
    if a.keep_mount && a.io_uring == cairn_fuse::Transport::On {
        return Err(crate::control::client::UsageError(
            "--keep-mount serves from /dev/fuse: not with --io-uring on".into(),
        )
        .into());
    }
    if pool_locked(&pool) {
        let at = cairn_mounts()?
            .into_iter()
            .find(|(_, p)| Path::new(p) == pool)
            .map_or(String::new(), |(m, _)| {
                format!(" (mounted on {})", m.display())
            });
        bail!("pool {} is in use by another process{at}", pool.display());
    }
    config_for(&a)?;
    if a.foreground && a.keep_mount && !crate::keeper::has_keeper() {
        return crate::keeper::run(&pool, &a, ready);
    }
    if a.foreground {
        return serve(&pool, &a, ready);
    }
    spawn_daemon(&pool, &a)
}

/// Refuses a mount point that is the pool directory or inside it: the
/// mount would hide the pool's own files from every later command.
fn refuse_inside_pool(mnt: &Path, pool: &Path) -> Result<()> {
    if !mnt.starts_with(pool) {
        return Ok(());
    }
    let what = match mnt == pool {
        true => "is the pool directory itself".to_string(),
        false => format!("is inside the pool directory {}", pool.display()),
    };
    Err(crate::control::client::UsageError(format!(
        "mount point {} {what}: the mount would hide the pool's own files; mount it on a directory outside the pool",
        mnt.display()
    ))
    .into())
}

/// Refuses a mount point that already is one (of any filesystem): a
/// second mount would hide the first.
fn refuse_mount_point(mnt: &Path) -> Result<()> {
    if let Some((fstype, source)) = mount_at(mnt)? {
        return Err(crate::control::client::UsageError(format!(
            "{} is already a mount point ({fstype} from {source}); unmount it first or choose another directory",
            mnt.display()
        ))
        .into());
    }
    Ok(())
}

/// The (type, source) of the mount at `mnt`, if any.
fn mount_at(mnt: &Path) -> Result<Option<(String, String)>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mp = unescape(left.split(' ').nth(4)?);
        let mut r = right.split(' ');
        let (fstype, source) = (r.next()?, r.next().unwrap_or(""));
        (Path::new(&mp) == mnt).then(|| (fstype.to_string(), unescape(source)))
    }))
}

/// Logs to stderr (the pool's log when started by `cairn mount`) through
/// a writer that drops and counts what cannot be written (logging.rs).
/// rustls only from its errors: it warns on every NBD TLS connection from
/// libnbd, which sends the server's IP address as its SNI name.
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CAIRN_LOG")
        .unwrap_or_else(|_| "info,rustls=error".into());
    let stderr = std::os::fd::AsFd::as_fd(&std::io::stderr())
        .try_clone_to_owned()
        .map(std::fs::File::from);
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .log_internal_errors(false);
    match stderr {
        Ok(f) => b.with_writer(crate::logging::SafeLog::new(f)).init(),
        Err(_) => b.with_writer(std::io::sink).init(),
    }
}

/// Opens the pool; through a fault plan's storage when CAIRN_FAULT_PLAN
/// names one (tests of a real mount with injected faults: the plan's
/// format is in cairn_devices::backend::plan).
fn open_pool(pool: &Path, config: PoolConfig) -> Result<Pool> {
    let Some(plan) = std::env::var_os("CAIRN_FAULT_PLAN") else {
        return crate::key::open_pool(pool, Some(config), None);
    };
    let storage = PlanStorage::new(HostStorage::shared(), Path::new(&plan))?;
    tracing::warn!(
        "FAULT INJECTION: faults from {} (CAIRN_FAULT_PLAN) are applied to the pool's files",
        Path::new(&plan).display()
    );
    storage.watch(Duration::from_millis(50));
    crate::key::open_pool(pool, Some(config), Some(storage))
}

/// A pool that cannot open for want of room on its host filesystem: says
/// which filesystem, what it has free and what a mount needs there.
fn no_room_hint(e: anyhow::Error, pool: &Path, config: &PoolConfig) -> anyhow::Error {
    let full = e.chain().any(|c| {
        c.downcast_ref::<cairn_fs::FsError>()
            .is_some_and(|e| e.is_no_space())
            || (c.downcast_ref::<std::io::Error>())
                .is_some_and(|io| io.raw_os_error() == Some(libc::ENOSPC))
    });
    // What a first mount makes there, and some room for the store to grow;
    // with more free, the ENOSPC came from elsewhere (the pool's devices).
    let reserve = cairn_fs::pool::reserve::MAX_BYTES;
    let need = ((config.intent_log_mib + 16) << 20) + reserve;
    let free = match cairn_devices::device::host_space(pool) {
        Some((_, free)) if full && free < need => cairn_devices::size::human(free),
        _ => return e,
    };
    e.context(format!(
        "the filesystem holding {} is full ({free} free): a mount needs room there for the \
         metadata store, its {} MiB intent log and its {} MiB metadata reserve; free space \
         on it and mount again",
        pool.display(),
        config.intent_log_mib,
        reserve >> 20
    ))
}

fn serve(pool: &Path, a: &MountArgs, ready: &crate::ready::Ready) -> Result<()> {
    init_logging();
    let config = config_for(a)?;
    if a.salvage {
        return crate::salvage::serve(pool, a, config, ready);
    }
    // A bad token file stops the mount before the pool opens.
    let token = crate::metrics::token(&config)?;
    let room = |e| no_room_hint(e, pool, &config);
    let keeper = crate::keeper::daemon_link()?;
    let refs: &[(u64, u64)] = match &keeper {
        Some((_, Some((_, h)))) => &h.refs,
        _ => &[],
    };
    let p = open_pool(pool, config.clone()).map_err(room)?;
    let fs = Fs::open_adopting(p, refs).map_err(|e| room(e.into()))?;
    let flusher = fs.spawn_flusher();
    let sock = PoolPaths::control(pool);
    crate::control::server::spawn(fs.clone(), &sock)
        .with_context(|| format!("control socket {}", sock.display()))?;
    fs.spawn_snapshot_hasher();
    let gc = fs.spawn_gc();
    let mover = fs.spawn_mover();
    let resilver = fs.spawn_resilver();
    let watchdog = Some(fs.spawn_watchdog());
    let mnt = a.mountpoint.canonicalize()?;
    if crate::nbd::wanted(&config) {
        crate::nbd::start(&fs, &config, &a.nbd)?;
    }
    let (session, handing) = mount_session(&fs, &mnt, a, keeper);
    let session = session
        .with_context(|| format!("mounting on {}", mnt.display()))
        .inspect_err(|_| crate::nbd::stop())?;
    let http = crate::metrics::start(&fs, &config, token).inspect_err(|_| crate::nbd::stop())?;
    tracing::info!("pool {} mounted on {}", pool.display(), mnt.display());
    ready.ok();
    // After the mount answers: the count reads the whole inode table,
    // which a cold mount should not wait behind (a `df -i` before it
    // ends waits for it).
    let counter = spawn_inode_count(&fs);
    crate::stop::on_signals(fs.clone(), mnt.clone())?;
    let joined = session.join();
    // A drained session flushed at its end (`destroy`): the state goes to
    // the keeper, which starts the next daemon once this one exits.
    let handed = handing.filter(|(_, h)| h.draining());
    if let Some((link, h)) = &handed {
        link.send(
            cairn_fuse::handover::Tag::State,
            &h.state(&fs).encode(),
            None,
        )?;
    }
    // Clients stop before the pool closes: what they flushed is durable,
    // and nothing writes after the final commit.
    crate::nbd::stop();
    if let Some(h) = http {
        h.shutdown();
    }
    joined?;
    let _ = std::fs::remove_file(&sock);
    fs.shutdown()?;
    let _ = flusher.join();
    for h in [gc, mover, resilver, watchdog, counter]
        .into_iter()
        .flatten()
    {
        let _ = h.join();
    }
    // Closed here, not when the last holder of the pool lets go: threads
    // still running (the control socket's) would keep it open past exit,
    // and redb closes cleanly only with no read of it under way.
    fs.pool().meta.close();
    match handed {
        Some(_) => tracing::info!(
            "committed and handed the mount on {} over to the keeper; exiting",
            mnt.display()
        ),
        None => tracing::info!("unmounted {}", mnt.display()),
    }
    Ok(())
}

/// The FUSE session: a plain mount, or (a daemon under a keeper) one that
/// can be handed over, mounted afresh or taken over from the daemon
/// before; the keeper gets the connection of a fresh one.
fn mount_session(
    fs: &std::sync::Arc<Fs>,
    mnt: &Path,
    a: &MountArgs,
    keeper: Option<crate::keeper::DaemonLink>,
) -> (
    Result<cairn_fuse::BackgroundSession>,
    Option<(cairn_fuse::handover::Link, cairn_fuse::Handing)>,
) {
    let Some((link, resume)) = keeper else {
        let s = cairn_fuse::spawn(fs.clone(), mnt, a.threads, &a.transport());
        return (s.map_err(Into::into), None);
    };
    match cairn_fuse::spawn_handing(fs.clone(), mnt, a.threads, resume) {
        Ok((mut s, h)) => {
            // Unmounting is the kernel's (`cairn umount`) or nobody's.
            s.keep_mounted();
            match crate::keeper::mounted(&link, &h) {
                Ok(()) => (Ok(s), Some((link, h))),
                Err(e) => (Err(e), None),
            }
        }
        Err(e) => (Err(e.into()), None),
    }
}

/// Counts the live inodes for `df -i` in the background (one scan of the
/// inode table: joined before the store closes).
fn spawn_inode_count(fs: &std::sync::Arc<Fs>) -> Option<std::thread::JoinHandle<()>> {
    let fs = fs.clone();
    let spawned = std::thread::Builder::new()
        .name("cairn-inodes".into())
        .spawn(move || {
            if let Err(e) = fs.count_inodes() {
                tracing::warn!("counting inodes: {e}");
            }
        });
    spawned.ok()
}

fn spawn_daemon(pool: &Path, a: &MountArgs) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let log = PoolPaths::log(pool);
    let out = cairn_devices::private::private_options()
        .create(true)
        .append(true)
        .open(&log)?;
    let log_start = out.metadata()?.len();
    let mut cmd = daemon_command(pool, a)?;
    // stdout is not needed (the daemon logs through tracing); stderr keeps
    // panics in the log.
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(out);
    let status = crate::ready::StatusPipe::new()?;
    status.pass_to(&mut cmd);
    // An encrypted pool's passphrase is typed here, at the terminal, and
    // handed to the daemon through a pipe (a key file it reads itself).
    let _key_pipe = match crate::key::key_file() {
        Some(f) => {
            cmd.arg("--key-file").arg(std::path::absolute(f)?);
            None
        }
        None => match crate::key::secret_for(pool)? {
            Some(secret) => Some(crate::key::pass_to(&secret, &mut cmd)?),
            None => None,
        },
    };
    // SAFETY: setsid is async-signal-safe; detaches from our terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let mnt = a.mountpoint.canonicalize()?;
    wait_ready(status, &mut child, &log, log_start)?;
    // The daemon says it is mounted: check that the mount is there, is
    // this pool's and answers, and that the daemon still runs.
    let ours = cairn_mounts()?
        .iter()
        .any(|(m, p)| *m == mnt && Path::new(p) == pool);
    let answers = std::fs::metadata(&mnt).is_ok();
    if !ours || !answers || child.try_wait()?.is_some() {
        bail!(
            "the daemon reported a mount on {} that is not there or not answering; its log:\n{}",
            mnt.display(),
            log_since(&log, log_start)
        );
    }
    println!(
        "mounted {} on {} (pid {}, log {})",
        pool.display(),
        mnt.display(),
        child.id(),
        log.display()
    );
    print_warnings(&log, log_start);
    if a.salvage {
        println!("{}", crate::salvage::mounted_line(pool, &mnt));
    }
    Ok(())
}

/// The command line of the daemon: this binary, `mount --foreground`, and
/// the options given to this mount.
fn daemon_command(pool: &Path, a: &MountArgs) -> Result<Command> {
    daemon_command_at(&std::env::current_exe()?, pool, a)
}

/// `daemon_command` for the binary at `exe` (a keeper's next daemon).
pub fn daemon_command_at(exe: &Path, pool: &Path, a: &MountArgs) -> Result<Command> {
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(pool)
        .arg(&a.mountpoint)
        .arg("--foreground");
    cmd.arg("--threads").arg(a.threads.to_string());
    cmd.arg("--io-uring").arg(a.io_uring.to_string());
    cmd.arg("--ring-priority").arg(a.ring_priority.to_string());
    if a.enable_uring_module {
        cmd.arg("--enable-uring-module");
    }
    if a.discard_damaged_log {
        cmd.arg("--discard-damaged-log");
    }
    if let Some(s) = a.commit_interval {
        cmd.arg("--commit-interval").arg(s.to_string());
    }
    if let Some(d) = a.dirty_limit {
        cmd.arg("--dirty-limit").arg(d.to_string());
    }
    if let Some(z) = &a.compression {
        cmd.arg("--compression").arg(z);
    }
    nbd_flags(&mut cmd, &a.nbd)?;
    if let Some(m) = &a.metrics {
        cmd.arg("--metrics").arg(m);
    }
    if a.metrics_allow_remote {
        cmd.arg("--metrics-allow-remote");
    }
    if a.metrics_detail {
        cmd.arg("--metrics-detail");
    }
    if a.salvage {
        cmd.arg("--salvage");
    }
    if a.keep_mount {
        cmd.arg("--keep-mount");
    }
    Ok(cmd)
}

/// Waits (at most a minute) for the daemon to say it mounted; its refusal,
/// its early exit or the timeout is the error.
fn wait_ready(
    status: crate::ready::StatusPipe,
    child: &mut std::process::Child,
    log: &Path,
    log_start: u64,
) -> Result<()> {
    match status.wait(Duration::from_secs(60)) {
        Some(Ok(())) => Ok(()),
        Some(Err(why)) => {
            let _ = child.wait();
            bail!("{why}");
        }
        None => {
            if child.try_wait()?.is_none() {
                let _ = child.kill();
                let _ = child.wait();
                bail!("timed out waiting for the mount; see {}", log.display());
            }
            let st = child.wait()?;
            bail!(
                "the daemon exited ({st}) before mounting; its log:\n{}",
                log_since(log, log_start)
            );
        }
    }
}

/// Passes the NBD flags on to the daemon (socket paths made absolute).
fn nbd_flags(cmd: &mut Command, n: &crate::args::NbdArgs) -> Result<()> {
    if let Some(l) = &n.listen {
        cmd.arg("--nbd").arg(l);
    }
    if let Some(s) = &n.socket {
        cmd.arg("--nbd-socket").arg(std::path::absolute(s)?);
    }
    if n.allow_remote {
        cmd.arg("--nbd-allow-remote");
    }
    if let Some(d) = &n.tls {
        cmd.arg("--nbd-tls").arg(std::path::absolute(d)?);
    }
    if n.insecure {
        cmd.arg("--nbd-insecure");
    }
    if let Some(b) = n.budget {
        cmd.arg("--nbd-budget").arg(b.to_string());
    }
    if let Some(t) = n.io_timeout {
        cmd.arg("--nbd-io-timeout").arg(t.to_string());
    }
    if let Some(m) = n.workers_min {
        cmd.arg("--nbd-workers-min").arg(m.to_string());
    }
    if let Some(m) = n.workers_max {
        cmd.arg("--nbd-workers-max").arg(m.to_string());
    }
    Ok(())
}

/// Shows the warnings the daemon logged since `from` (modes tightened,
/// devices other users can read).
fn print_warnings(log: &Path, from: u64) {
    use std::io::{Read, Seek};
    let mut s = Vec::new();
    if let Ok(mut f) = std::fs::File::open(log) {
        let _ = f.seek(std::io::SeekFrom::Start(from));
        let _ = f.read_to_end(&mut s);
    }
    for l in String::from_utf8_lossy(&s)
        .lines()
        .filter(|l| l.contains(" WARN "))
    {
        eprintln!("cairn: {l}");
    }
}

/// What the log got since `start` (this daemon's lines), at most 40 lines.
fn log_since(log: &Path, start: u64) -> String {
    let s = std::fs::read(log).unwrap_or_default();
    let s = String::from_utf8_lossy(
        s.get(usize::try_from(start).unwrap_or(usize::MAX)..)
            .unwrap_or_default(),
    );
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Mount entries of Cairn: (mount point, pool) from /proc/self/mountinfo.
pub fn cairn_mounts() -> Result<Vec<(PathBuf, String)>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut out = Vec::new();
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut r = right.split(' ');
        let (fstype, source) = (r.next().unwrap_or(""), r.next().unwrap_or(""));
        // fusermount3 may record the type as plain "fuse"; the source is
        // the pool directory, which holds a Cairn superblock.
        let ours = fstype == "fuse.cairn" || (fstype == "fuse" && is_pool_dir(&unescape(source)));
        if ours {
            let mp = left.split(' ').nth(4).unwrap_or("");
            out.push((PathBuf::from(unescape(mp)), unescape(source)));
        }
    }
    Ok(out)
}

/// Holds a superblock, or is a directory this user may not look into (a
/// pool directory is 0700: to other users it is opaque).
fn is_pool_dir(source: &str) -> bool {
    match std::fs::symlink_metadata(Path::new(source).join("superblock")) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::PermissionDenied,
    }
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

pub fn umount(mnt: &Path) -> Result<()> {
    let mnt = mnt
        .canonicalize()
        .with_context(|| format!("{}", mnt.display()))?;
    let Some((_, pool)) = cairn_mounts()?.into_iter().find(|(m, _)| *m == mnt) else {
        bail!("{} is not a mounted Cairn pool", mnt.display());
    };
    let daemon = crate::daemon_wait::Daemon::of_pool(Path::new(&pool));
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .stdin(Stdio::null())
        .output()
        .context("running fusermount3")?;
    if !out.status.success() {
        bail!("{}", umount_failure(&mnt, &pool, &out.stderr));
    }
    // The daemon flushes after the kernel lets go; wait until it exits.
    let wait = Duration::from_secs(120);
    let exited = match &daemon {
        Some(d) => d.wait_exit(wait),
        None => wait_unlocked(Path::new(&pool), wait),
    };
    if !exited {
        let pid = daemon.map_or(String::new(), |d| format!(" (pid {})", d.pid));
        bail!(
            "{} is unmounted, but its daemon{pid} is still flushing after {} s; it finishes by itself (see {})",
            mnt.display(),
            wait.as_secs(),
            PoolPaths::log(Path::new(&pool)).display()
        );
    }
    println!("unmounted {}", mnt.display());
    Ok(())
}

/// Waits for the pool's lock to be released (when no daemon answered on
/// the control socket); whether it was.
fn wait_unlocked(pool: &Path, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    while pool_locked(pool) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Why `fusermount3 -u` failed, in its own words, and what to do.
fn umount_failure(mnt: &Path, pool: &str, stderr: &[u8]) -> String {
    let said = String::from_utf8_lossy(stderr).trim().to_string();
    let low = said.to_lowercase();
    let hint = if low.contains("busy") {
        format!(
            "a process still uses it (open files or a working directory inside): find them with `fuser -vm {}`, close them and retry",
            mnt.display()
        )
    } else if low.contains("permission")
        || low.contains("not permitted")
        // SAFETY: geteuid has no preconditions.
        || unsafe { libc::geteuid() } != 0
    {
        "only root or the user who mounted it can unmount it: run `cairn umount` as that user or with sudo".to_string()
    } else {
        format!(
            "check that {} is still mounted (`findmnt {}`)",
            mnt.display(),
            mnt.display()
        )
    };
    format!(
        "could not unmount {} (pool {pool}): fusermount3 says: {}; {hint}",
        mnt.display(),
        if said.is_empty() { "(nothing)" } else { &said }
    )
}

/// Is some process holding the pool's lock (a daemon still running)?
pub fn pool_locked(pool: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(PoolPaths::lock(pool)) else {
        return false;
    };
    // SAFETY: flock on an fd we own; the lock is dropped with the file.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}
