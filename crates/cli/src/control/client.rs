//! The command side: finds the pool behind a TARGET (a pool directory, or
//! a mount point or any path inside a mount), then sends the request to
//! the mount daemon, or runs it here when the pool is not mounted.

use super::exec::execute;
use super::protocol::{decode_reply, read_line, Reply, Request, MAX_REPLY_LINE};
use crate::daemon::{cairn_mounts, pool_locked};
use anyhow::{anyhow, bail, Context, Result};
use cairn_fs::pool::PoolPaths;
use cairn_fs::Fs;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// A mistake in what the user asked (a path outside any Cairn mount...):
/// the command exits with status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The pool directory and, when mounted, the mount point of a TARGET.
pub fn resolve(target: &Path) -> Result<(PathBuf, Option<PathBuf>)> {
    let t = target
        .canonicalize()
        .with_context(|| format!("{}", target.display()))?;
    // A directory this user may not enter: a pool (mounted or not), unless
    // it lies inside a mount (then its pool is checked below).
    if denied(&t) {
        let mnt = cairn_mounts()?.into_iter().find(|(_, p)| Path::new(p) == t);
        if mnt.is_none() && mount_of(&t)?.is_some() {
            return resolve_in_mount(target, &t);
        }
        return Err(no_access(
            &t,
            mnt.as_ref().map(|(m, _)| m.as_path()),
            mnt.is_some(),
        ));
    }
    if PoolPaths::superblock(&t).exists() {
        let mnt = cairn_mounts()?
            .into_iter()
            .find(|(_, p)| Path::new(p) == t)
            .map(|(m, _)| m);
        return Ok((t, mnt));
    }
    resolve_in_mount(target, &t)
}

/// The pool and mount point of a canonical path `t` inside a Cairn mount.
fn resolve_in_mount(target: &Path, t: &Path) -> Result<(PathBuf, Option<PathBuf>)> {
    match mount_of(t)? {
        Some((m, p)) => Ok((p, Some(m))),
        None => Err(UsageError(format!(
            "{} is neither a Cairn pool nor inside a Cairn mount",
            target.display()
        ))
        .into()),
    }
}

/// Whether this user may not look into `dir` (a pool directory is open
/// to its owner only).
fn denied(dir: &Path) -> bool {
    let e = PoolPaths::superblock(dir).symlink_metadata().err();
    e.is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
}

/// Says who may use a pool this user may not look into: its owner (root
/// as a rule), or the members of its group if the directory is open to
/// them. `mnt` is where it is mounted, if it is; `known`, whether `pool`
/// is known to be a pool.
fn no_access(pool: &Path, mnt: Option<&Path>, known: bool) -> anyhow::Error {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(pool).ok();
    let owner = match meta.as_ref().map(|m| m.uid()) {
        Some(0) | None => "root".to_string(),
        Some(uid) => format!("root or its owner (uid {uid})"),
    };
    let group = match &meta {
        Some(m) if m.mode() & 0o050 == 0o050 => format!(" or the pool's group (gid {})", m.gid()),
        _ => String::new(),
    };
    let what = match (mnt, known) {
        (Some(m), _) => format!("pool {} (mounted on {})", pool.display(), m.display()),
        (None, true) => format!("pool {}", pool.display()),
        (None, false) => format!("{} (if it is a Cairn pool)", pool.display()),
    };
    anyhow!(
        "permission denied: {what} is open to {owner}{group} only; this command needs its control socket {} (or its files, when it is not mounted): run it as root (e.g. with sudo)",
        PoolPaths::control(pool).display()
    )
}

/// The Cairn mount (mount point, pool) that a canonical path lies on: the
/// longest mount point that is a prefix of it, and only if the path is on
/// that mount's device (not on another filesystem mounted below it, nor
/// on the directory under a mount that has gone).
fn mount_of(t: &Path) -> Result<Option<(PathBuf, PathBuf)>> {
    use std::os::unix::fs::MetadataExt;
    let best = cairn_mounts()?
        .into_iter()
        .filter(|(m, _)| t.starts_with(m))
        .max_by_key(|(m, _)| m.as_os_str().len());
    let Some((m, p)) = best else {
        return Ok(None);
    };
    let dev = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.dev()).ok();
    match (dev(t), dev(&m)) {
        (Some(a), Some(b)) if a == b => Ok(Some((m, PathBuf::from(p)))),
        _ => Ok(None),
    }
}

/// For commands about one file (history, undo): the pool and mount point
/// of `path`, which must lie on a Cairn mount (checked by device number
/// before any inode number is sent). `path` itself may be missing when
/// `parent_ok` (undo of a deleted file): then its directory is checked.
pub fn resolve_file(path: &Path, parent_ok: bool) -> Result<(PathBuf, PathBuf)> {
    let abs = std::path::absolute(path)?;
    let (dir, name) = match (abs.parent(), abs.file_name()) {
        (Some(d), Some(n)) => (d, Some(n)),
        _ => (abs.as_path(), None),
    };
    let dir = dir
        .canonicalize()
        .with_context(|| format!("{}", dir.display()))?;
    let full = name.map_or(dir.clone(), |n| dir.join(n));
    let on = match full.symlink_metadata() {
        Ok(_) => full,
        Err(_) if parent_ok => dir,
        Err(e) => return Err(anyhow!(e).context(path.display().to_string())),
    };
    match mount_of(&on)? {
        Some((m, p)) => Ok((p, m)),
        None => Err(UsageError(format!("{} is not inside a Cairn mount", path.display())).into()),
    }
}

fn bar() -> ProgressBar {
    let b = ProgressBar::new(0);
    b.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("template"),
    );
    b
}

/// Runs `req` on the pool behind `target` and returns its result.
pub fn call(target: &Path, req: Request) -> Result<Value> {
    let s = Session::open(target)?;
    let v = s.call(req)?;
    s.close()?;
    Ok(v)
}

/// Runs `req` on the pool behind `target` and decodes its reply as a `T`
/// (a reply missing one of `T`'s fields is an error).
pub fn call_as<T: serde::de::DeserializeOwned>(target: &Path, req: Request) -> Result<T> {
    let s = Session::open(target)?;
    let v = s.call_as(req)?;
    s.close()?;
    Ok(v)
}

/// `call_as` for a mirror command (`Session::open_mirror`).
pub fn call_mirror_as<T: serde::de::DeserializeOwned>(target: &Path, req: Request) -> Result<T> {
    let s = Session::open_mirror(target)?;
    let v = s.call_as(req)?;
    s.close()?;
    Ok(v)
}

/// `call_as`, with the reply as it came too (what `--json` prints).
pub fn call_with_json<T: serde::de::DeserializeOwned>(
    target: &Path,
    req: Request,
) -> Result<(T, Value)> {
    let op = req.op();
    let v = call(target, req)?;
    Ok((decode_ref(op, &v)?, v))
}

/// `decode_as` from a borrow: a reply may be large (a long history), and
/// its caller keeps it (what `--json` prints).
pub fn decode_ref<T: serde::de::DeserializeOwned>(op: &str, v: &Value) -> Result<T> {
    <T as serde::Deserialize>::deserialize(v)
        .with_context(|| format!("the reply to a {op} request"))
}

/// `v`, the reply to a request of kind `op`, as a `T`.
pub fn decode_as<T: serde::de::DeserializeOwned>(op: &str, v: Value) -> Result<T> {
    serde_json::from_value(v).with_context(|| format!("the reply to a {op} request"))
}

/// A pool that several requests go to: its daemon when it is mounted,
/// else the pool opened once in this process (and closed when done), so
/// that a command of several steps opens and checks it once.
pub struct Session {
    pool: PathBuf,
    open: Option<std::sync::Arc<Fs>>,
}

impl Session {
    pub fn open(target: &Path) -> Result<Session> {
        Self::open_by(target, |p| crate::key::open_pool(p, None, None))
    }

    /// `open` for a mirror command: an encrypted mirror opens without its
    /// key when none is given (`key::open_pool_for_mirror`).
    pub fn open_mirror(target: &Path) -> Result<Session> {
        Self::open_by(target, crate::key::open_pool_for_mirror)
    }

    /// `open` that opens an encrypted mirror without its key when none is
    /// given (`key::sealed_mirror`), any other pool as `open` does.
    pub fn open_sealed_mirror_or_pool(target: &Path) -> Result<Session> {
        Self::open_by(target, |p| match crate::key::sealed_mirror(p)? {
            Some(pool) => Ok(pool),
            None => crate::key::open_pool(p, None, None),
        })
    }

    fn open_by(
        target: &Path,
        open_pool: impl Fn(&Path) -> Result<cairn_fs::Pool>,
    ) -> Result<Session> {
        let (pool, mnt) = resolve(target)?;
        if denied(&pool) {
            return Err(no_access(&pool, mnt.as_deref(), true));
        }
        let open = match pool_locked(&pool) {
            true => None,
            false => Some(Fs::open(open_pool(&pool)?)?),
        };
        Ok(Session { pool, open })
    }

    pub fn call(&self, req: Request) -> Result<Value> {
        let pb = bar();
        let progress = |d: u64, t: u64| {
            pb.set_length(t);
            pb.set_position(d);
        };
        let r = match &self.open {
            None => remote(&self.pool, &req, &progress),
            Some(fs) => here(fs, req, &progress),
        };
        pb.finish_and_clear();
        r
    }

    /// `call`, its reply decoded as a `T`.
    pub fn call_as<T: serde::de::DeserializeOwned>(&self, req: Request) -> Result<T> {
        let op = req.op();
        decode_as(op, self.call(req)?)
    }

    /// Closes a pool opened here (committing what it holds).
    pub fn close(mut self) -> Result<()> {
        match self.open.take() {
            Some(fs) => Ok(fs.shutdown()?),
            None => Ok(()),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(fs) = self.open.take() {
            if let Err(e) = fs.shutdown() {
                eprintln!("cairn: closing {}: {e}", self.pool.display());
            }
        }
    }
}

fn remote(pool: &Path, req: &Request, progress: &dyn Fn(u64, u64)) -> Result<Value> {
    let sock = PoolPaths::control(pool);
    let conn = UnixStream::connect(&sock);
    if conn
        .as_ref()
        .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
    {
        return Err(no_access(pool, None, true));
    }
    let mut s = conn.with_context(|| {
        format!(
            "pool {} is in use but its daemon does not answer on {}",
            pool.display(),
            sock.display()
        )
    })?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut r = BufReader::new(s);
    while let Some(l) = read_line(&mut r, MAX_REPLY_LINE)? {
        match decode_reply(&l)? {
            Reply::Progress(d, t) => progress(d, t),
            Reply::Ok(v) => return Ok(v),
            Reply::Err(e) => return Err(anyhow!(e)),
        }
    }
    bail!("the daemon closed the control connection without an answer (see its log)")
}

fn here(fs: &std::sync::Arc<Fs>, req: Request, progress: &dyn Fn(u64, u64)) -> Result<Value> {
    let creates = req.creates_snapshot();
    let r = execute(fs, req, progress)?;
    if creates {
        fs.hash_pending_snapshots()?;
    }
    Ok(r)
}
