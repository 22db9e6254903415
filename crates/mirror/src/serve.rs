//! The pool side of the mirror requests of the control protocol: what the
//! daemon of a mounted pool (or a command that opened the pool itself)
//! runs for `MirrorRead`, `MirrorWrite`, `MirrorStatus`... Streams and
//! hash lists pass through files the command names (created 0600). Each
//! returns its typed reply (`reply`); errors are the filesystem's, as for
//! every control request.

use crate::reply::{
    CandidatesReply, HoldReply, HoldStatus, LackingReply, PromoteReply, ReadReply, ReleaseReply,
    RoleName, RollbackReply, SnapshotAt, StatusReply, WriteReply,
};
use crate::StreamError;
use cairn_data::Hash;
use cairn_fs::replica::Role;
use cairn_fs::{Fs, FsError};
use std::collections::HashSet;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;

type Result<T> = std::result::Result<T, FsError>;

fn refused(e: StreamError) -> FsError {
    match e {
        StreamError::Fs(e) => e,
        e => FsError::BadRequest(e.to_string()),
    }
}

/// Creates `path` (mode 0600) for writing.
fn create_private(path: &str) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| FsError::BadRequest(format!("{path}: {e}")))
}

fn read_hashes(path: &str) -> Result<Vec<Hash>> {
    let b = std::fs::read(path).map_err(|e| FsError::BadRequest(format!("{path}: {e}")))?;
    crate::negotiate::decode(&b).map_err(refused)
}

fn write_hashes(path: &str, hashes: &[Hash]) -> Result<()> {
    let mut f = create_private(path)?;
    std::io::Write::write_all(&mut f, &crate::negotiate::encode(hashes))
        .map_err(|e| FsError::Io(format!("{path}: {e}")))
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Writes the stream of changes after `since` into `path` (created 0600);
/// with `lacking`, only the chunks listed there travel with their bytes.
pub fn read_to(
    fs: &Arc<Fs>,
    since: u64,
    path: &str,
    lacking: Option<&str>,
    batch_mib: Option<u64>,
) -> Result<ReadReply> {
    let lacking: Option<HashSet<Hash>> = lacking
        .map(read_hashes)
        .transpose()?
        .map(|v| v.into_iter().collect());
    let answered = |h: &Hash| lacking.as_ref().is_some_and(|l| !l.contains(h));
    let held = match lacking.is_some() {
        true => crate::Held::Answered(&answered),
        false => crate::Held::AtSince,
    };
    let out = std::io::BufWriter::with_capacity(1 << 20, create_private(path)?);
    let mut limits = crate::Limits::default();
    if let Some(m) = batch_mib {
        limits.bytes = m.clamp(1, 4096) << 20;
    }
    let r = crate::read_stream_limited(fs, since, out, held, limits).map_err(refused)?;
    Ok(r)
}

/// The hashes a stream after `since` would send bytes for, into `path`.
pub fn candidates_to(fs: &Arc<Fs>, since: u64, path: &str) -> Result<CandidatesReply> {
    let c = crate::negotiate::candidates(fs, since).map_err(refused)?;
    write_hashes(path, &c)?;
    Ok(CandidatesReply {
        hashes: count(c.len()),
    })
}

/// Of the hashes in `path`, those this pool lacks, into `out`.
pub fn lacking_to(fs: &Arc<Fs>, path: &str, out: &str) -> Result<LackingReply> {
    let l = crate::negotiate::lacking(fs, &read_hashes(path)?).map_err(refused)?;
    write_hashes(out, &l)?;
    Ok(LackingReply {
        lacking: count(l.len()),
    })
}

/// Checks the whole stream in `path`, then applies it, reporting the
/// bytes applied so far.
pub fn write_from(
    fs: &Arc<Fs>,
    path: &str,
    force: bool,
    progress: &dyn Fn(u64, u64),
) -> Result<WriteReply> {
    let open = || {
        let f =
            std::fs::File::open(path).map_err(|e| FsError::BadRequest(format!("{path}: {e}")))?;
        Ok::<_, FsError>(std::io::BufReader::with_capacity(1 << 20, f))
    };
    crate::check_streams(open()?)
        .map_err(|e| FsError::BadRequest(format!("{e}; nothing was applied")))?;
    let opts = crate::ApplyOptions { force };
    let total = std::fs::metadata(path).map_or(0, |m| m.len());
    let input = Counting {
        inner: open()?,
        done: 0,
        shown: 0,
        total,
        progress,
    };
    let r = crate::apply_streams(fs, input, opts).map_err(refused)?;
    Ok(r.into())
}

/// A reader that reports how much of `total` it has read (every MiB).
struct Counting<'a, R> {
    inner: R,
    done: u64,
    shown: u64,
    total: u64,
    progress: &'a dyn Fn(u64, u64),
}

impl<R: std::io::Read> std::io::Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += count(n);
        if self.done - self.shown >= 1 << 20 || (n == 0 && self.done > self.shown) {
            self.shown = self.done;
            (self.progress)(self.done, self.total.max(self.done));
        }
        Ok(n)
    }
}

/// `MirrorStatus`: the pool's TID, role, holds and snapshots.
pub fn status(fs: &Arc<Fs>) -> Result<StatusReply> {
    let tid = fs.last_tid();
    let hex = |s: &[u8; 16]| crate::apply::uuid(s);
    let (role, source) = match fs.mirror_role()? {
        Role::Normal => (RoleName::Pool, None),
        Role::Unbound => (RoleName::Unbound, None),
        Role::Mirror { source } => (RoleName::Mirror, Some(hex(&source))),
        Role::Promoted { source } => (RoleName::Promoted, Some(hex(&source))),
    };
    let mirrors = (fs.mirror_holds().into_iter())
        .map(|h| HoldStatus {
            lag_tids: tid.saturating_sub(h.tid),
            mirror: h.mirror,
            at: h.at,
            tid: h.tid,
            time_ns: h.time_ns,
        })
        .collect();
    let r = fs.pool().meta.read().map_err(FsError::from)?;
    let time_ns = r.tid_time(tid).map_err(FsError::from)?.map(|(_, ns)| ns);
    let pruned_tid = r.counter("pruned_tid").map_err(FsError::from)?;
    // Held without its key, a mirror cannot read its snapshots' names.
    let sealed = fs.pool().meta.is_opaque();
    let snapshots = match sealed {
        true => Vec::new(),
        false => (fs.snapshots()?.into_iter())
            .map(|s| SnapshotAt {
                name: s.name,
                tid: s.tid,
            })
            .collect(),
    };
    Ok(StatusReply {
        sealed,
        role,
        tid,
        uuid: hex(&fs.pool().sb.uuid),
        source,
        time_ns,
        mirrors,
        pruned_tid,
        snapshots,
    })
}

/// `MirrorPromote`: a mirror becomes a writable pool.
pub fn promote(fs: &Arc<Fs>) -> Result<PromoteReply> {
    fs.needs_key("promoting a mirror")?;
    match fs.mirror_role()? {
        Role::Mirror { source } => fs.set_mirror_role(Role::Promoted { source })?,
        r => return Err(FsError::BadRequest(format!("not a mirror ({r:?})"))),
    }
    Ok(PromoteReply { tid: fs.last_tid() })
}

/// `MirrorRollback`: a mirror rolled back to its snapshot `snapshot`.
pub fn rollback(fs: &Arc<Fs>, snapshot: &str) -> Result<RollbackReply> {
    fs.rollback_mirror(snapshot)
}

/// `MirrorHold`: mirror `mirror` (reached at `at`) is at `tid` now.
pub fn hold(fs: &Arc<Fs>, mirror: String, at: String, tid: u64) -> Result<HoldReply> {
    let now = cairn_fs::Time::now().as_nanos();
    let h = cairn_fs::replica::Hold {
        mirror,
        at,
        tid,
        time_ns: u64::try_from(now).unwrap_or(0),
    };
    fs.mirror_hold(h)?;
    Ok(HoldReply {})
}

/// `MirrorRelease`: forgets a mirror's hold.
pub fn release(fs: &Arc<Fs>, mirror: &str) -> Result<ReleaseReply> {
    Ok(ReleaseReply {
        released: fs.mirror_release(mirror)?,
    })
}
