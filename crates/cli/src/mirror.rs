//! `cairn mirror`: the arguments and what is printed. The work runs where
//! the pool is open (the daemon of a mounted pool, or this process:
//! `control::client::call`); copies are decided in `cairn_mirror::copy`
//! and `cairn_mirror::bucket::copy`, which reach the pools through
//! `mirror_ends`. Streams pass through files or FIFOs in a private
//! temporary directory.

use crate::args::MirrorCmd;
use crate::control::client::{call_as, call_mirror_as};
use crate::control::protocol::Request;
use crate::mirror_ends::{Dest, PoolSource};
use anyhow::{Context, Result};
use cairn_mirror::reply::{
    CopyReply, LackingHexReply, PromoteReply, ReadReply, ReleaseReply, RollbackReply, StatusReply,
    WriteReply,
};
use cairn_mirror::CopyOptions;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub fn run(c: MirrorCmd) -> Result<()> {
    match c {
        MirrorCmd::Read { t, since, output } => {
            let v = match output {
                Some(p) => call_as(&t.target, read_req(since, &absolute(&p)?))?,
                None => read_to_stdout(&t.target, since)?,
            };
            eprintln!("{}", describe_read(&v));
            Ok(())
        }
        MirrorCmd::Write { t, input, force } => write_cmd(&t, input, force),
        MirrorCmd::Copy {
            src,
            dst,
            resync,
            batch_mib,
            json,
            credentials_file,
        } => {
            let o = CopyOptions { resync, batch_mib };
            copy_cmd(&src, &dst, o, json, credentials_file.as_deref())
        }
        MirrorCmd::Restore {
            bucket,
            pool,
            credentials_file,
            json,
        } => {
            let b = crate::mirror_bucket::open(&bucket, credentials_file.as_deref())?;
            let v = crate::mirror_bucket::restore(&b, &pool)?;
            print(&v, json, crate::mirror_bucket::describe_restore)
        }
        MirrorCmd::Stream { src, dst, interval } => follow(&src, &dst, interval),
        c => pool_cmd(c),
    }
}

/// The commands that are one request to one pool.
fn pool_cmd(c: MirrorCmd) -> Result<()> {
    match c {
        MirrorCmd::Status(t) => {
            let v: StatusReply = call_mirror_as(&t.target, Request::MirrorStatus)?;
            print(&v, t.json, describe_status)
        }
        MirrorCmd::Release { t, mirror } => {
            let v: ReleaseReply = call_as(&t.target, Request::MirrorRelease { mirror })?;
            print(&v, t.json, |v| match v.released {
                true => "released: prune no longer keeps history for that mirror".into(),
                false => "that mirror had no hold on this pool".into(),
            })
        }
        MirrorCmd::Lacking(t) => lacking_cmd(&t),
        MirrorCmd::Rollback { t, snapshot } => {
            let v: RollbackReply = call_as(&t.target, Request::MirrorRollback { snapshot })?;
            print(&v, t.json, describe_rollback)
        }
        MirrorCmd::Promote(t) => {
            let v: PromoteReply = call_as(&t.target, Request::MirrorPromote)?;
            print(&v, t.json, |v| {
                format!(
                    "promoted: a writable pool at TID {:#x} (mount it again to write)",
                    v.tid
                )
            })
        }
        _ => anyhow::bail!("not a one-pool mirror command"),
    }
}

/// `mirror write`: applies a stream file, or stdin spooled to a private file.
fn write_cmd(t: &crate::args::TargetArgs, input: Option<PathBuf>, force: bool) -> Result<()> {
    let dir = private_dir()?;
    let path = match input {
        Some(p) => absolute(&p)?,
        None => spool_stdin(dir.path())?,
    };
    let req = Request::MirrorWrite {
        path: text(&path),
        force,
    };
    let v: WriteReply = call_mirror_as(&t.target, req)?;
    print(&v, t.json, describe_write)
}

/// `mirror copy`: to a pool here or over ssh, or into a bucket.
fn copy_cmd(
    src: &Path,
    dst: &Path,
    o: CopyOptions,
    json: bool,
    credentials_file: Option<&Path>,
) -> Result<()> {
    // What was written before the command is in the copy.
    call_as::<serde_json::Value>(src, Request::Sync)?;
    if cairn_objstore::locator::is_locator(&text(dst)) {
        let b = crate::mirror_bucket::open(&text(dst), credentials_file)?;
        let v = crate::mirror_bucket::copy(src, &b, o)?;
        return print(&v, json, |v| {
            let second = crate::mirror_bucket::describe_copy(v);
            format!("{}\n{second}", describe_read(&v.read))
        });
    }
    let dest = Dest::parse(dst)?;
    let dir = private_dir()?;
    let v = cairn_mirror::copy::copy(&PoolSource(src), &dest, o, dir.path())?;
    dest.close()?;
    print(&v, json, |v| {
        format!("{}\n{}", describe_read(&v.read), describe_write(&v.write))
    })
}

/// `mirror lacking`: hashes on stdin; those the pool lacks as hex JSON
/// (for ssh).
fn lacking_cmd(t: &crate::args::TargetArgs) -> Result<()> {
    let dir = private_dir()?;
    let (wanted, out) = (spool_stdin(dir.path())?, dir.path().join("lacking"));
    let req = Request::MirrorLacking {
        path: text(&wanted),
        out: text(&out),
    };
    call_mirror_as::<cairn_mirror::reply::LackingReply>(&t.target, req)?;
    let hex: String = std::fs::read(&out)?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!(
        "{}",
        serde_json::to_value(LackingHexReply { lacking: hex })?
    );
    Ok(())
}

/// `mirror stream`: copies whenever the source's TID moves; an error is
/// shown and retried at the next look (a pool being remounted, a mirror
/// disk gone for a while), so the mirror resumes at its own TID.
fn follow(src: &Path, dst: &Path, interval: f64) -> Result<()> {
    if cairn_objstore::locator::is_locator(&text(dst)) {
        anyhow::bail!("a bucket mirror is kept by `cairn mirror copy` (run it from a timer): each copy is a stream object, and a stream per commit would make one per commit");
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [libc::SIGINT, libc::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let pause = std::time::Duration::from_secs_f64(interval.max(0.05));
    let (mut failing, mut known) = (false, None);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let step = follow_step(src, dst, &mut known);
        if step.is_err() {
            known = None;
        }
        match step {
            Ok(Some((s, v))) => {
                failing = false;
                eprintln!("{}", describe_step(&s, &v));
            }
            Ok(None) => failing = false,
            Err(e) if !failing => {
                failing = true;
                eprintln!("cairn: mirror stream: {}; retrying", crate::error_chain(&e));
            }
            Err(_) => {}
        }
        std::thread::sleep(pause);
    }
    Ok(())
}

/// The line of a `mirror stream` copy: when, where the mirror is, and its
/// lag (from the source's commit, `s`, to the mirror having it).
fn describe_step(s: &StatusReply, v: &CopyReply) -> String {
    let now = u64::try_from(cairn_fs::Time::now().as_nanos()).unwrap_or(0);
    let lag = s.time_ns.map(|t| now.saturating_sub(t) as f64 / 1e9);
    format!(
        "{} mirror at TID {:#x}, lag {}: {}",
        cairn_fs::timefmt::format_utc(now),
        v.write.upto,
        lag.map_or("-".into(), |l| format!("{l:.2} s")),
        describe_write(&v.write)
    )
}

/// One look of `mirror stream`: a copy when the source's TID moved past
/// `known` (the mirror's TID after the last copy; None: ask the mirror).
/// The mirror is opened only then, and closed after (so that it can be
/// mounted between copies).
fn follow_step(
    src: &Path,
    dst: &Path,
    known: &mut Option<u64>,
) -> Result<Option<(StatusReply, CopyReply)>> {
    let s: StatusReply = call_as(src, Request::MirrorStatus)?;
    if *known == Some(s.tid) {
        return Ok(None);
    }
    let dest = Dest::parse(dst)?;
    let dir = private_dir()?;
    let r = cairn_mirror::copy::catch_up(&PoolSource(src), &dest, s.tid, dir.path());
    let closed = dest.close();
    let (at, copied) = r?;
    closed?;
    *known = Some(at);
    Ok(copied.map(|c| (s, c)))
}

fn read_req(since: u64, path: &Path) -> Request {
    Request::MirrorRead {
        since,
        lacking: None,
        path: text(path),
        batch_mib: None,
    }
}

/// Reads a stream through a FIFO, copying it to stdout as it comes.
fn read_to_stdout(target: &Path, since: u64) -> Result<ReadReply> {
    let dir = private_dir()?;
    let fifo = dir.path().join("stream");
    let c = std::ffi::CString::new(text(&fifo))?;
    // SAFETY: mkfifo on a NUL-terminated path we own.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(std::io::Error::last_os_error()).context("mkfifo");
    }
    let f2 = fifo.clone();
    let copier = std::thread::spawn(move || -> std::io::Result<u64> {
        let mut f = std::fs::File::open(&f2)?;
        std::io::copy(&mut f, &mut std::io::stdout().lock())
    });
    let r = call_as(target, read_req(since, &fifo));
    if r.is_err() {
        // Unblock the copier if the writer never opened the FIFO.
        let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
    }
    let copied = copier
        .join()
        .map_err(|_| anyhow::anyhow!("copier panicked"))?;
    let v = r?;
    copied.context("writing the stream to stdout")?;
    Ok(v)
}

fn spool_stdin(dir: &Path) -> Result<PathBuf> {
    let p = dir.join("stream");
    let mut f = std::fs::File::create(&p)?;
    std::io::copy(&mut std::io::stdin().lock(), &mut f).context("reading the stream from stdin")?;
    Ok(p)
}

/// Prefix of the stream directories in the temporary directory.
const STREAM_DIR_PREFIX: &str = "cairn-mirror-";
/// The file in a stream directory that names the process using it.
const OWNER_FILE: &str = "owner.pid";

/// A temporary directory only we can enter (0700), for streams (files
/// in it then stay private whatever their own mode). It names this
/// process, so that the next mirror command removes it if this one was
/// killed (a stream may take gigabytes).
pub(crate) fn private_dir() -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    remove_abandoned_stream_dirs(&std::env::temp_dir());
    let d = tempfile::Builder::new()
        .prefix(STREAM_DIR_PREFIX)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()?;
    std::fs::write(d.path().join(OWNER_FILE), std::process::id().to_string())?;
    Ok(d)
}

/// Removes the stream directories in `tmp` that belong to this user and
/// name a process that no longer runs (a mirror command killed before it
/// could clean up). Best effort: a directory it cannot judge stays.
fn remove_abandoned_stream_dirs(tmp: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    // SAFETY: geteuid takes nothing and cannot fail.
    let uid = unsafe { libc::geteuid() };
    for e in entries.flatten() {
        let path = e.path();
        let ours = e
            .file_name()
            .to_string_lossy()
            .starts_with(STREAM_DIR_PREFIX)
            && std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        let owner = std::fs::read_to_string(path.join(OWNER_FILE)).ok();
        let Some(pid) = owner.and_then(|p| p.trim().parse::<u32>().ok()) else {
            continue;
        };
        if ours && !Path::new(&format!("/proc/{pid}")).exists() {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::info!("removed {} (its mirror command was killed)", path.display())
                }
                Err(e) => tracing::warn!("removing {}: {e}", path.display()),
            }
        }
    }
}

pub(crate) fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(std::path::absolute(p)?)
}

pub(crate) fn text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Prints reply `v`: as JSON (with `--json`) or as `human` says it.
fn print<T: Serialize>(v: &T, json: bool, human: impl Fn(&T) -> String) -> Result<()> {
    match json {
        true => println!("{}", serde_json::to_value(v)?),
        false => println!("{}", human(v)),
    }
    Ok(())
}

fn describe_status(v: &StatusReply) -> String {
    let src = (v.source.as_ref())
        .map(|s| format!(", source pool {s}"))
        .unwrap_or_default();
    let mut out = format!(
        "pool {}: {}, TID {:#x} ({}){src}",
        v.uuid,
        v.role.as_str(),
        v.tid,
        v.time_ns.map_or("-".into(), cairn_fs::timefmt::format_utc)
    );
    if v.sealed {
        out.push_str(
            ", held without its key (sealed: names, snapshots and history are read with the key)",
        );
    }
    for m in &v.mirrors {
        out.push_str(&format!(
            "\nmirror {} at {}: TID {:#x}, {} commits behind, last copy {}",
            m.mirror,
            m.at,
            m.tid,
            m.lag_tids,
            cairn_fs::timefmt::format_utc(m.time_ns)
        ));
    }
    out
}

pub(crate) fn describe_read(v: &ReadReply) -> String {
    format!(
        "stream: TIDs {:#x}..{:#x}, {} changes, {} chunks sent ({} bytes), {} chunks the mirror holds, {} bytes",
        v.since, v.upto, v.events, v.chunks_sent, v.chunk_bytes, v.chunks_skipped, v.bytes
    )
}

fn describe_rollback(v: &RollbackReply) -> String {
    format!(
        "mirror rolled back from TID {:#x} to TID {:#x}: {} elements removed, {} live again, {} snapshots removed, {} chunks freed",
        v.from, v.to, v.removed, v.restored, v.snapshots_removed, v.chunks_freed
    )
}

fn describe_write(v: &WriteReply) -> String {
    let streams = match v.streams {
        n if n > 1 => format!(" of {n} streams"),
        _ => String::new(),
    };
    format!(
        "mirror: TID {:#x} -> {:#x}: {} changes, {} new chunks, in {} batches{streams}",
        v.since, v.upto, v.events, v.chunks, v.batches
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_stream_directory_is_private() {
        let d = super::private_dir().unwrap();
        let mode = std::fs::metadata(d.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "mode {mode:o}");
    }

    #[test]
    fn directories_of_killed_commands_go_and_others_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = |name: &str, owner: Option<String>| {
            let p = tmp.path().join(name);
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("stream"), b"data").unwrap();
            if let Some(o) = owner {
                std::fs::write(p.join(super::OWNER_FILE), o).unwrap();
            }
            p
        };
        // A process that ran and ended: its pid names no process now.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let abandoned = dir("cairn-mirror-dead", Some(dead.to_string()));
        let live = dir("cairn-mirror-live", Some(std::process::id().to_string()));
        let unknown = dir("cairn-mirror-old", None);
        let other = dir("something-else", Some(dead.to_string()));
        super::remove_abandoned_stream_dirs(tmp.path());
        assert!(!abandoned.exists());
        assert!(live.exists() && unknown.exists() && other.exists());
    }
}
