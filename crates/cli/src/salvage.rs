//! Pools whose metadata store failed its integrity check: `cairn mount
//! --salvage` (a read-only mount from a copy in RAM of the damaged store,
//! serving every file whose records read intact) and `cairn salvage POOL
//! --rebuild` (a new store from what is readable, the damaged one kept
//! aside).

use crate::args::{MountArgs, SalvageArgs};
use anyhow::{bail, Result};
use cairn_fs::maintenance::{rebuild, salvage};
use cairn_fs::{Fs, PoolConfig};
use std::path::Path;

/// The line said when a salvage mount is up (log and stdout).
pub fn mounted_line(pool: &Path, mnt: &Path) -> String {
    format!(
        "SALVAGE: pool {} mounted READ-ONLY on {} from a copy of its damaged metadata store; \
         files whose records are damaged give EIO; nothing is written to the pool. \
         Copy out what you need, or run `cairn salvage {} --rebuild` after unmounting",
        pool.display(),
        mnt.display(),
        pool.display()
    )
}

/// Serves a salvage mount in the foreground until it is unmounted: FUSE
/// only (read-only), no flusher, control socket, NBD or background work,
/// and no shutdown commit.
pub fn serve(
    pool: &Path,
    a: &MountArgs,
    config: PoolConfig,
    ready: &crate::ready::Ready,
) -> Result<()> {
    let p = salvage::open_salvage_pool(pool, config, crate::key::secret_for(pool)?.as_ref())?;
    let fs = Fs::open_salvage(p)?;
    let mnt = a.mountpoint.canonicalize()?;
    let session = cairn_fuse::spawn(fs.clone(), &mnt, a.threads, &a.transport())?;
    tracing::warn!("{}", mounted_line(pool, &mnt));
    ready.ok();
    let m2 = mnt.clone();
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP])?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = std::process::Command::new("fusermount3")
                .arg("-u")
                .arg(&m2)
                .status();
        }
    });
    session.join()?;
    tracing::info!("unmounted {} (salvage)", mnt.display());
    Ok(())
}

/// `cairn salvage POOL [--rebuild]`: what a rebuild keeps and loses, and
/// with --rebuild the rebuild itself.
pub fn run(a: &SalvageArgs) -> Result<()> {
    if crate::daemon::pool_locked(&a.pool) {
        bail!(
            "pool {} is in use (mounted?); unmount it first",
            a.pool.display()
        );
    }
    let rep = rebuild::rebuild_pool(&a.pool, !a.rebuild)?;
    for l in &rep.lost {
        println!("LOST: {l}");
    }
    for p in &rep.adopted {
        println!("FOUND: {p} (outside the tree: under a damaged directory)");
    }
    for s in &rep.snapshots_lost {
        println!("LOST: snapshot {s}");
    }
    if let Some(n) = rep.history_lost.filter(|n| *n > 0) {
        println!("LOST: history: {n} older version(s) of records");
    }
    for f in &rep.set_aside {
        println!("kept aside: {f}");
    }
    let verb = if rep.dry_run { "would keep" } else { "kept" };
    println!(
        "{verb} {} files and directories ({} chunks in {} segments); {} lost",
        rep.kept,
        rep.chunks,
        rep.segments,
        rep.lost.len()
    );
    if rep.dry_run {
        println!("nothing written: run with --rebuild to write the new metadata store");
    }
    Ok(())
}
