//! The command side: finds the pool behind a TARGET (a pool directory, or
//! a mount point or any path inside a mount), then sends the request to
//! the mount daemon, or runs it here when the pool is not mounted.

use super::exec::execute;
use super::protocol::{Reply, Request};
use crate::daemon::{cairn_mounts, pool_locked};
use anyhow::{anyhow, bail, Context, Result};
use cairn_fs::pool::PoolPaths;
use cairn_fs::{Fs, Pool};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The pool directory and, when mounted, the mount point of a TARGET.
pub fn resolve(target: &Path) -> Result<(PathBuf, Option<PathBuf>)> {
    let t = target
        .canonicalize()
        .with_context(|| format!("{}", target.display()))?;
    let mounts = cairn_mounts()?;
    if PoolPaths::superblock(&t).exists() {
        let mnt = mounts
            .into_iter()
            .find(|(_, p)| Path::new(p) == t)
            .map(|(m, _)| m);
        return Ok((t, mnt));
    }
    let best = mounts
        .into_iter()
        .filter(|(m, _)| t.starts_with(m))
        .max_by_key(|(m, _)| m.as_os_str().len());
    match best {
        Some((m, p)) => Ok((PathBuf::from(p), Some(m))),
        None => bail!(
            "{} is neither a Cairn pool nor inside a mounted Cairn pool",
            target.display()
        ),
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
    let (pool, _) = resolve(target)?;
    let pb = bar();
    let progress = |d: u64, t: u64| {
        pb.set_length(t);
        pb.set_position(d);
    };
    let r = if pool_locked(&pool) {
        remote(&pool, &req, &progress)
    } else {
        local(&pool, req, &progress)
    };
    pb.finish_and_clear();
    r
}

fn remote(pool: &Path, req: &Request, progress: &dyn Fn(u64, u64)) -> Result<Value> {
    let sock = PoolPaths::control(pool);
    let mut s = UnixStream::connect(&sock).with_context(|| {
        format!(
            "pool {} is in use but its daemon does not answer on {}",
            pool.display(),
            sock.display()
        )
    })?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line)?;
    for l in BufReader::new(s).lines() {
        match serde_json::from_str::<Reply>(&l?)? {
            Reply::Progress(d, t) => progress(d, t),
            Reply::Ok(v) => return Ok(v),
            Reply::Err(e) => return Err(anyhow!(e)),
        }
    }
    bail!("the daemon closed the control connection without an answer (see its log)")
}

fn local(pool: &Path, req: Request, progress: &dyn Fn(u64, u64)) -> Result<Value> {
    let p = Pool::open(pool, None)?;
    let fs = Fs::open(p)?;
    let creates = matches!(req, Request::SnapshotCreate { .. });
    let r = execute(&fs, req, progress);
    if creates && r.is_ok() {
        fs.hash_pending_snapshots()?;
    }
    fs.shutdown()?;
    Ok(r?)
}
