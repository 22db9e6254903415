//! The copy between two pools (`cairn mirror copy|stream`): checks that
//! the mirror is one of the source, rolls it back to the newest snapshot
//! both hold when the source pruned past it (`--resync`), reads the
//! source's changes after the mirror's TID with the bytes of only the
//! chunks the mirror lacks, applies them and moves the source's hold. The
//! two pools are reached through `Source` and `Mirror`, which the command
//! implements (a daemon's control socket, a pool it opened, ssh); the
//! stream passes through files in a directory the caller gives.

use crate::error::{CopyError, EndpointError};
use crate::reply::{CopyReply, ReadReply, RoleName, RollbackReply, StatusReply, WriteReply};
use std::path::{Path, PathBuf};

/// What a side of a copy answers with.
pub type EndpointResult<T> = std::result::Result<T, EndpointError>;
pub type Result<T> = std::result::Result<T, CopyError>;

/// The pool a copy reads from.
pub trait Source {
    /// How errors name it.
    fn name(&self) -> String;
    fn status(&self) -> EndpointResult<StatusReply>;
    /// Writes into `out` the hashes of the chunks a stream after `since`
    /// would send.
    fn candidates(&self, since: u64, out: &Path) -> EndpointResult<()>;
    /// Writes the stream after `since` into `out`, with the bytes of only
    /// the chunks listed in the file `lacking`.
    fn read(
        &self,
        since: u64,
        out: &Path,
        lacking: &Path,
        batch_mib: u64,
    ) -> EndpointResult<ReadReply>;
    /// Records that mirror `mirror` (uuid hex, reached at `at`) is at `tid`.
    fn hold(&self, mirror: &str, at: &str, tid: u64) -> EndpointResult<()>;
}

/// The pool a copy writes to.
pub trait Mirror {
    /// Where it is (recorded in the source's hold, named by errors).
    fn name(&self) -> String;
    fn status(&self) -> EndpointResult<StatusReply>;
    /// Writes into `out` which of the hashes in the file `wanted` it lacks.
    fn lacking(&self, wanted: &Path, out: &Path) -> EndpointResult<()>;
    /// Applies the stream in the file `stream`.
    fn write(&self, stream: &Path) -> EndpointResult<WriteReply>;
    /// Rolls it back to its snapshot `snapshot`.
    fn rollback(&self, snapshot: &str) -> EndpointResult<RollbackReply>;
}

/// How a copy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOptions {
    /// Roll the mirror back to a common snapshot when the source pruned
    /// past its TID.
    pub resync: bool,
    /// Chunk data per batch of the stream, in MiB.
    pub batch_mib: u64,
}

impl Default for CopyOptions {
    fn default() -> CopyOptions {
        CopyOptions {
            resync: false,
            batch_mib: 64,
        }
    }
}

/// Brings `dst` up to date with `src`: the changes after the mirror's
/// TID, through files in `dir`.
pub fn copy(src: &dyn Source, dst: &dyn Mirror, o: CopyOptions, dir: &Path) -> Result<CopyReply> {
    let at = dst.status()?;
    let from = src.status()?;
    check_pair(&from, &at, &src.name(), &dst.name())?;
    let mut since = mirror_since(&at);
    let mut rollback = None;
    if o.resync && behind_horizon(&from, since) {
        let name =
            common_snapshot(&from, &at, since).ok_or_else(|| CopyError::NoCommonSnapshot {
                mirror: dst.name(),
                since,
            })?;
        let r = dst.rollback(&name)?;
        debug_assert!(r.to <= since, "a rollback moves a mirror back");
        since = r.to;
        rollback = Some(r);
    }
    let (file, read) =
        read_negotiated(src, since, o.batch_mib, dir, |w, l| Ok(dst.lacking(w, l)?))?;
    let write = dst.write(&file)?;
    // The source keeps the history after the mirror's TID until the next
    // copy moves the hold (`cairn mirror release` drops it).
    src.hold(&at.uuid, &dst.name(), write.upto)?;
    Ok(CopyReply {
        read,
        write,
        rollback,
    })
}

/// Refuses a copy into a pool that is not a mirror, or that mirrors
/// another pool than `from` (`at`: the mirror's status).
pub fn check_pair(from: &StatusReply, at: &StatusReply, src: &str, dst: &str) -> Result<()> {
    if matches!(at.role, RoleName::Promoted | RoleName::Pool) {
        return Err(CopyError::NotAMirror {
            mirror: dst.into(),
            role: at.role.as_str(),
        });
    }
    match &at.source {
        Some(s) if *s != from.uuid => Err(CopyError::OtherSource {
            src: src.into(),
            src_uuid: from.uuid.clone(),
            mirror: dst.into(),
            mirror_source: s.clone(),
        }),
        _ => Ok(()),
    }
}

/// The TID a copy starts after: the mirror's, or 0 for a mirror bound to
/// no source yet.
pub fn mirror_since(at: &StatusReply) -> u64 {
    match at.role {
        RoleName::Unbound => 0,
        _ => at.tid,
    }
}

/// Whether the source (`from`, its status) pruned past TID `since`, where
/// it holds no snapshot: it cannot send the changes after it.
pub fn behind_horizon(from: &StatusReply, since: u64) -> bool {
    let at_snapshot = from.snapshots.iter().any(|s| s.tid == since);
    since > 0 && since < from.pruned_tid && !at_snapshot
}

/// The newest snapshot the source (`from`) and the mirror (`at`) both hold
/// (same name, same TID) at or before the mirror's TID `since`.
pub fn common_snapshot(from: &StatusReply, at: &StatusReply, since: u64) -> Option<String> {
    (from.snapshots.iter())
        .filter(|s| s.tid <= since && at.snapshots.contains(s))
        .max_by_key(|s| s.tid)
        .map(|s| s.name.clone())
}

/// Reads the stream of `src`'s changes after `since` into `dir/stream`
/// with the bytes of only the chunks the mirror lacks: the source lists
/// the hashes it would send (`dir/wanted`), `lacking` writes those the
/// mirror lacks into the second file. Returns the stream file and the
/// read's reply.
pub fn read_negotiated(
    src: &dyn Source,
    since: u64,
    batch_mib: u64,
    dir: &Path,
    lacking: impl FnOnce(&Path, &Path) -> Result<()>,
) -> Result<(PathBuf, ReadReply)> {
    let (file, wanted, lack) = (dir.join("stream"), dir.join("wanted"), dir.join("lacking"));
    src.candidates(since, &wanted)?;
    lacking(&wanted, &lack)?;
    let r = src.read(since, &file, &lack, batch_mib)?;
    Ok((file, r))
}

/// One look of `cairn mirror stream` once the source is at `source_tid`:
/// a copy (with the default options) unless the mirror is there already.
/// Returns the mirror's TID after it and the copy made, if any.
pub fn catch_up(
    src: &dyn Source,
    dst: &dyn Mirror,
    source_tid: u64,
    dir: &Path,
) -> Result<(u64, Option<CopyReply>)> {
    let at = dst.status()?.tid;
    if at == source_tid {
        return Ok((at, None));
    }
    let c = copy(src, dst, CopyOptions::default(), dir)?;
    Ok((c.write.upto, Some(c)))
}

#[cfg(test)]
mod tests;
