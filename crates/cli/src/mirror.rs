//! `cairn mirror`: reading streams out of a pool, applying them to a
//! mirror pool, copying between the two, status and promotion. The work
//! runs where the pool is open (the daemon of a mounted pool, or this
//! process: `control::client::call`); streams pass through files or FIFOs
//! in a private temporary directory.

#![allow(
    clippy::cast_possible_truncation,
    clippy::undocumented_unsafe_blocks,
    reason = "left to the mirror protocol change, which rewrites this file"
)]

use crate::args::MirrorCmd;
use crate::control::client::{call, Session};
use crate::control::protocol::Request;
use anyhow::{Context, Result};
use cairn_fs::replica::Role;
use cairn_fs::{Fs, FsError};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub fn run(c: MirrorCmd) -> Result<()> {
    match c {
        MirrorCmd::Read { t, since, output } => {
            let v = match output {
                Some(p) => call(&t.target, read_req(since, &absolute(&p)?))?,
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
        } => copy_cmd(
            &src,
            &dst,
            resync,
            batch_mib,
            json,
            credentials_file.as_deref(),
        ),
        MirrorCmd::Restore {
            bucket,
            pool,
            credentials_file,
            json,
        } => {
            let b = crate::mirror_bucket::open(&bucket, credentials_file.as_deref())?;
            let v = crate::mirror_bucket::restore(&b, &pool)?;
            print(&v, json, crate::mirror_bucket::describe_restore);
            Ok(())
        }
        MirrorCmd::Stream { src, dst, interval } => follow(&src, &dst, interval),
        MirrorCmd::Status(t) => {
            let v = call(&t.target, Request::MirrorStatus)?;
            print(&v, t.json, describe_status);
            Ok(())
        }
        MirrorCmd::Release { t, mirror } => {
            let v = call(&t.target, Request::MirrorRelease { mirror })?;
            print(&v, t.json, |v| match v["released"] == true {
                true => "released: prune no longer keeps history for that mirror".into(),
                false => "that mirror had no hold on this pool".into(),
            });
            Ok(())
        }
        MirrorCmd::Lacking(t) => lacking_cmd(&t),
        MirrorCmd::Rollback { t, snapshot } => {
            let v = call(&t.target, Request::MirrorRollback { snapshot })?;
            print(&v, t.json, describe_rollback);
            Ok(())
        }
        MirrorCmd::Promote(t) => {
            let v = call(&t.target, Request::MirrorPromote)?;
            print(&v, t.json, |v| {
                format!(
                    "promoted: a writable pool at TID {:#x} (mount it again to write)",
                    v["tid"].as_u64().unwrap_or(0)
                )
            });
            Ok(())
        }
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
    let v = call(&t.target, req)?;
    print(&v, t.json, describe_write);
    Ok(())
}

/// `mirror copy`: to a pool here or over ssh, or into a bucket.
fn copy_cmd(
    src: &Path,
    dst: &Path,
    resync: bool,
    batch_mib: u64,
    json: bool,
    credentials_file: Option<&Path>,
) -> Result<()> {
    // What was written before the command is in the copy.
    call(src, Request::Sync)?;
    let v = match cairn_objstore::locator::is_locator(&text(dst)) {
        true => {
            let b = crate::mirror_bucket::open(&text(dst), credentials_file)?;
            crate::mirror_bucket::copy(src, &b, resync, batch_mib)?
        }
        false => {
            let dest = Dest::parse(dst)?;
            let v = copy(src, &dest, resync, batch_mib)?;
            dest.close()?;
            v
        }
    };
    print(&v, json, |v| {
        let second = match v.get("bucket") {
            Some(_) => crate::mirror_bucket::describe_copy(v),
            None => describe_write(&v["write"]),
        };
        format!("{}\n{second}", describe_read(&v["read"]))
    });
    Ok(())
}

/// `mirror lacking`: hashes on stdin; those the pool lacks as hex JSON
/// (for ssh).
fn lacking_cmd(t: &crate::args::TargetArgs) -> Result<()> {
    let dir = private_dir()?;
    let (wanted, out) = (spool_stdin(dir.path())?, dir.path().join("lacking"));
    call(
        &t.target,
        Request::MirrorLacking {
            path: text(&wanted),
            out: text(&out),
        },
    )?;
    let hex: String = std::fs::read(&out)?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("{}", json!({ "lacking": hex }));
    Ok(())
}

/// Where a mirror is: a pool here (directory or mount point; opened once
/// for all the steps of a copy when not mounted), or one reached over ssh
/// (`ssh:[user@]host:POOL`, where `cairn mirror write` runs; no daemon
/// needed there).
enum Dest {
    Local(PathBuf, Session),
    Ssh { host: String, pool: String },
}

impl Dest {
    fn close(self) -> Result<()> {
        match self {
            Dest::Local(_, s) => s.close(),
            Dest::Ssh { .. } => Ok(()),
        }
    }

    fn parse(p: &Path) -> Result<Dest> {
        let s = text(p);
        let Some(rest) = s.strip_prefix("ssh:") else {
            return Ok(Dest::Local(p.to_path_buf(), Session::open(p)?));
        };
        match rest.split_once(':') {
            Some((host, pool)) if !host.is_empty() && !pool.is_empty() => Ok(Dest::Ssh {
                host: host.into(),
                pool: pool.into(),
            }),
            _ => anyhow::bail!("{s}: expected ssh:[user@]host:POOL"),
        }
    }

    fn name(&self) -> String {
        match self {
            Dest::Local(p, _) => absolute(p).map_or(text(p), |p| text(&p)),
            Dest::Ssh { host, pool } => format!("ssh:{host}:{pool}"),
        }
    }

    fn status(&self) -> Result<Value> {
        match self {
            Dest::Local(_, s) => s.call(Request::MirrorStatus),
            Dest::Ssh { .. } => self.remote("status", &[], None),
        }
    }

    fn write(&self, stream: &Path) -> Result<Value> {
        match self {
            Dest::Local(_, s) => s.call(Request::MirrorWrite {
                path: text(stream),
                force: false,
            }),
            Dest::Ssh { .. } => self.remote("write", &[], Some(stream)),
        }
    }

    fn rollback(&self, snapshot: &str) -> Result<Value> {
        let req = Request::MirrorRollback {
            snapshot: snapshot.into(),
        };
        match self {
            Dest::Local(_, s) => s.call(req),
            Dest::Ssh { .. } => self.remote("rollback", &[&quote(snapshot)], None),
        }
    }

    /// Writes into `out` which of the hashes in `wanted` the mirror lacks.
    fn lacking(&self, wanted: &Path, out: &Path) -> Result<()> {
        match self {
            Dest::Local(_, s) => {
                s.call(Request::MirrorLacking {
                    path: text(wanted),
                    out: text(out),
                })?;
            }
            Dest::Ssh { .. } => {
                let v = self.remote("lacking", &[], Some(wanted))?;
                let hex = v["lacking"].as_str().unwrap_or_default();
                std::fs::write(out, decode_hex(hex)?)?;
            }
        }
        Ok(())
    }

    /// Runs `cairn mirror CMD POOL TAIL --json` on the host over ssh
    /// (CAIRN_SSH: the ssh command, default `ssh`; CAIRN_REMOTE: the
    /// remote cairn, default `cairn`; TAIL words already quoted), with
    /// `input` on its stdin.
    fn remote(&self, cmd_name: &str, tail: &[&str], input: Option<&Path>) -> Result<Value> {
        let Dest::Ssh { host, pool } = self else {
            unreachable!("a remote mirror")
        };
        let ssh = std::env::var("CAIRN_SSH").unwrap_or_else(|_| "ssh".into());
        let cairn = std::env::var("CAIRN_REMOTE").unwrap_or_else(|_| "cairn".into());
        let mut words = ssh.split_whitespace();
        let mut cmd = std::process::Command::new(words.next().unwrap_or("ssh"));
        // `--` ends ssh's options: a host is never taken for one.
        cmd.args(words).arg("--").arg(host);
        let remote = format!(
            "{} mirror {cmd_name} {} {} --json",
            quote(&cairn),
            quote(pool),
            tail.join(" ")
        );
        cmd.arg(remote).stderr(std::process::Stdio::inherit());
        cmd.stdin(match input {
            Some(f) => std::process::Stdio::from(std::fs::File::open(f)?),
            None => std::process::Stdio::null(),
        });
        let out = cmd.output().with_context(|| format!("running {ssh}"))?;
        if !out.status.success() {
            anyhow::bail!("cairn mirror {cmd_name} on {host} failed ({})", out.status);
        }
        serde_json::from_slice(&out.stdout).context("the remote cairn's answer")
    }
}

fn decode_hex(s: &str) -> Result<Vec<u8>> {
    let bad = || anyhow::anyhow!("a bad hash list from the mirror");
    if !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| bad()))
        .collect()
}

/// `s` quoted for a POSIX shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Brings the mirror `dst` up to date with `src`: the changes after the
/// mirror's TID, through a file in a private directory.
fn copy(src: &Path, dest: &Dest, resync: bool, batch_mib: u64) -> Result<Value> {
    let at = dest.status()?;
    let from = call(src, Request::MirrorStatus)?;
    if at["role"] == "promoted" || at["role"] == "pool" {
        anyhow::bail!(
            "{} is not a mirror (role: {}): a promoted mirror has changes of its own that a copy would overwrite",
            dest.name(),
            at["role"].as_str().unwrap_or("?")
        );
    }
    if at["source"].is_string() && at["source"] != from["uuid"] {
        anyhow::bail!(
            "{} comes from pool {}, and {} mirrors pool {}",
            src.display(),
            from["uuid"].as_str().unwrap_or("?"),
            dest.name(),
            at["source"].as_str().unwrap_or("?")
        );
    }
    let mut since = match at["role"] == "unbound" {
        true => 0,
        false => at["tid"].as_u64().unwrap_or(0),
    };
    let mut rolled = Value::Null;
    if resync && behind_horizon(&from, since) {
        let name = common_snapshot(&from, &at, since, &dest.name())?;
        rolled = dest.rollback(&name)?;
        since = rolled["to"].as_u64().unwrap_or(0);
    }
    let dir = private_dir()?;
    let (file, r) = read_negotiated(src, since, batch_mib, dir.path(), |wanted, lacking| {
        dest.lacking(wanted, lacking)
    })?;
    let w = dest.write(&file)?;
    // The source keeps the history after the mirror's TID until the next
    // copy moves the hold (`cairn mirror release` drops it).
    let hold = Request::MirrorHold {
        mirror: at["uuid"].as_str().unwrap_or_default().to_string(),
        at: dest.name(),
        tid: w["upto"].as_u64().unwrap_or(0),
    };
    call(src, hold)?;
    Ok(json!({ "read": r, "write": w, "rollback": rolled }))
}

/// Reads the stream of `src`'s changes after `since` into `dir/stream`
/// with the bytes of only the chunks the mirror lacks: the source lists
/// the hashes it would send (a file of hashes), `lacking` writes those the
/// mirror lacks into the second file. Returns the stream file and the
/// read's report.
pub(crate) fn read_negotiated(
    src: &Path,
    since: u64,
    batch_mib: u64,
    dir: &Path,
    lacking: impl FnOnce(&Path, &Path) -> Result<()>,
) -> Result<(PathBuf, Value)> {
    let (file, wanted, lack) = (dir.join("stream"), dir.join("wanted"), dir.join("lacking"));
    call(
        src,
        Request::MirrorCandidates {
            since,
            path: text(&wanted),
        },
    )?;
    lacking(&wanted, &lack)?;
    let read = Request::MirrorRead {
        since,
        path: text(&file),
        lacking: Some(text(&lack)),
        batch_mib: Some(batch_mib),
    };
    let r = call(src, read)?;
    Ok((file, r))
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
                // The lag: from the source's commit to the mirror having it.
                let now = cairn_fs::Time::now().as_nanos() as u64;
                let lag = s["time_ns"]
                    .as_u64()
                    .map(|t| now.saturating_sub(t) as f64 / 1e9);
                eprintln!(
                    "{} mirror at TID {:#x}, lag {}: {}",
                    cairn_fs::timefmt::format_utc(now),
                    v["write"]["upto"].as_u64().unwrap_or(0),
                    lag.map_or("-".into(), |l| format!("{l:.2} s")),
                    describe_write(&v["write"])
                );
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

/// One look of `mirror stream`: a copy when the source's TID moved past
/// `known` (the mirror's TID after the last copy; None: ask the mirror).
/// The mirror is opened only then, and closed after (so that it can be
/// mounted between copies).
fn follow_step(src: &Path, dst: &Path, known: &mut Option<u64>) -> Result<Option<(Value, Value)>> {
    let s = call(src, Request::MirrorStatus)?;
    if known.is_some() && s["tid"].as_u64() == *known {
        return Ok(None);
    }
    let dest = Dest::parse(dst)?;
    let at = dest.status()?["tid"].as_u64();
    let v = match s["tid"].as_u64() == at {
        true => None,
        false => Some(copy(src, &dest, false, 64)?),
    };
    dest.close()?;
    *known = match &v {
        Some(v) => v["write"]["upto"].as_u64(),
        None => at,
    };
    Ok(v.map(|v| (s, v)))
}

/// Whether the source (`from`, its status) pruned past TID `since`, where
/// it holds no snapshot: it cannot send the changes after it.
pub(crate) fn behind_horizon(from: &Value, since: u64) -> bool {
    let pruned = from["pruned_tid"].as_u64().unwrap_or(0);
    let at_snapshot = snapshot_list(from).iter().any(|(_, t)| *t == since);
    since > 0 && since < pruned && !at_snapshot
}

/// The newest snapshot the source (`from`) and the mirror (`at`) both hold
/// (same name, same TID) at or before the mirror's TID `since`.
fn common_snapshot(from: &Value, at: &Value, since: u64, mirror: &str) -> Result<String> {
    let theirs = snapshot_list(at);
    snapshot_list(from)
        .into_iter()
        .filter(|s| s.1 <= since && theirs.contains(s))
        .max_by_key(|s| s.1)
        .map(|s| s.0)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{mirror} and its source hold no snapshot in common at or before the mirror's TID {since:#x}: it needs a full resync (cairn mkfs --force --mirror, then a full copy)"
            )
        })
}

/// (name, TID) of the snapshots a `mirror status` lists.
fn snapshot_list(status: &Value) -> Vec<(String, u64)> {
    let list = status["snapshots"].as_array().cloned().unwrap_or_default();
    list.iter()
        .filter_map(|s| Some((s["name"].as_str()?.to_string(), s["tid"].as_u64()?)))
        .collect()
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
fn read_to_stdout(target: &Path, since: u64) -> Result<Value> {
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
    let r = call(target, read_req(since, &fifo));
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

fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(std::path::absolute(p)?)
}

fn text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn print(v: &Value, json: bool, human: impl Fn(&Value) -> String) {
    match json {
        true => println!("{v}"),
        false => println!("{}", human(v)),
    }
}

fn describe_status(v: &Value) -> String {
    let src = v["source"]
        .as_str()
        .map(|s| format!(", source pool {s}"))
        .unwrap_or_default();
    let mut out = format!(
        "pool {}: {}, TID {:#x} ({}){src}",
        v["uuid"].as_str().unwrap_or("?"),
        v["role"].as_str().unwrap_or("?"),
        v["tid"].as_u64().unwrap_or(0),
        v["time_ns"]
            .as_u64()
            .map_or("-".into(), cairn_fs::timefmt::format_utc)
    );
    for m in v["mirrors"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\nmirror {} at {}: TID {:#x}, {} commits behind, last copy {}",
            m["mirror"].as_str().unwrap_or("?"),
            m["at"].as_str().unwrap_or("?"),
            m["tid"].as_u64().unwrap_or(0),
            m["lag_tids"],
            m["time_ns"]
                .as_u64()
                .map_or("-".into(), cairn_fs::timefmt::format_utc)
        ));
    }
    out
}

fn describe_read(v: &Value) -> String {
    format!(
        "stream: TIDs {:#x}..{:#x}, {} changes, {} chunks sent ({} bytes), {} chunks the mirror holds, {} bytes",
        v["since"].as_u64().unwrap_or(0),
        v["upto"].as_u64().unwrap_or(0),
        v["events"], v["chunks_sent"], v["chunk_bytes"], v["chunks_skipped"], v["bytes"]
    )
}

fn describe_rollback(v: &Value) -> String {
    format!(
        "mirror rolled back from TID {:#x} to TID {:#x}: {} elements removed, {} live again, {} snapshots removed, {} chunks freed",
        v["from"].as_u64().unwrap_or(0),
        v["to"].as_u64().unwrap_or(0),
        v["removed"].as_u64().unwrap_or(0),
        v["restored"].as_u64().unwrap_or(0),
        v["snapshots_removed"].as_u64().unwrap_or(0),
        v["chunks_freed"].as_u64().unwrap_or(0)
    )
}

fn describe_write(v: &Value) -> String {
    let streams = match v["streams"].as_u64() {
        Some(n) if n > 1 => format!(" of {n} streams"),
        _ => String::new(),
    };
    format!(
        "mirror: TID {:#x} -> {:#x}: {} changes, {} new chunks, in {} batches{streams}",
        v["since"].as_u64().unwrap_or(0),
        v["upto"].as_u64().unwrap_or(0),
        v["events"],
        v["chunks"],
        v["batches"]
    )
}

fn refused(e: cairn_mirror::StreamError) -> FsError {
    match e {
        cairn_mirror::StreamError::Fs(e) => e,
        e => FsError::BadRequest(e.to_string()),
    }
}

/// Creates `path` (mode 0600) for writing.
fn create_private(path: &str) -> Result<std::fs::File, FsError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode_private()
        .open(path)
        .map_err(|e| FsError::BadRequest(format!("{path}: {e}")))
}

fn read_hashes(path: &str) -> Result<Vec<cairn_data::Hash>, FsError> {
    let b = std::fs::read(path).map_err(|e| FsError::BadRequest(format!("{path}: {e}")))?;
    cairn_mirror::negotiate::decode(&b).map_err(refused)
}

/// Writes the stream of changes after `since` into `path` (created 0600);
/// with `lacking`, only the chunks listed there travel with their bytes.
pub fn read_to(
    fs: &Arc<Fs>,
    since: u64,
    path: &str,
    lacking: Option<&str>,
    batch_mib: Option<u64>,
) -> Result<Value, FsError> {
    let lacking: Option<std::collections::HashSet<cairn_data::Hash>> = lacking
        .map(read_hashes)
        .transpose()?
        .map(|v| v.into_iter().collect());
    let answered = |h: &cairn_data::Hash| lacking.as_ref().is_some_and(|l| !l.contains(h));
    let held = match lacking.is_some() {
        true => cairn_mirror::Held::Answered(&answered),
        false => cairn_mirror::Held::AtSince,
    };
    let out = std::io::BufWriter::with_capacity(1 << 20, create_private(path)?);
    let mut limits = cairn_mirror::Limits::default();
    if let Some(m) = batch_mib {
        limits.bytes = m.clamp(1, 4096) << 20;
    }
    let r = cairn_mirror::read_stream_limited(fs, since, out, held, limits).map_err(refused)?;
    Ok(
        json!({ "since": r.since, "upto": r.upto, "events": r.events, "chunks_sent": r.chunks_sent,
        "chunks_skipped": r.chunks_skipped, "chunk_bytes": r.chunk_bytes, "batches": r.batches, "bytes": r.bytes }),
    )
}

/// The hashes a stream after `since` would send bytes for, into `path`.
pub fn candidates_to(fs: &Arc<Fs>, since: u64, path: &str) -> Result<Value, FsError> {
    let c = cairn_mirror::negotiate::candidates(fs, since).map_err(refused)?;
    let mut f = create_private(path)?;
    std::io::Write::write_all(&mut f, &cairn_mirror::negotiate::encode(&c))
        .map_err(|e| FsError::Io(format!("{path}: {e}")))?;
    Ok(json!({ "hashes": c.len() }))
}

/// Of the hashes in `path`, those this pool lacks, into `out`.
pub fn lacking_to(fs: &Arc<Fs>, path: &str, out: &str) -> Result<Value, FsError> {
    let l = cairn_mirror::negotiate::lacking(fs, &read_hashes(path)?).map_err(refused)?;
    let mut f = create_private(out)?;
    std::io::Write::write_all(&mut f, &cairn_mirror::negotiate::encode(&l))
        .map_err(|e| FsError::Io(format!("{out}: {e}")))?;
    Ok(json!({ "lacking": l.len() }))
}

/// Checks the whole stream in `path`, then applies it, reporting the
/// bytes applied so far.
pub fn write_from(
    fs: &Arc<Fs>,
    path: &str,
    force: bool,
    progress: &dyn Fn(u64, u64),
) -> Result<Value, FsError> {
    let open = || {
        let f =
            std::fs::File::open(path).map_err(|e| FsError::BadRequest(format!("{path}: {e}")))?;
        Ok::<_, FsError>(std::io::BufReader::with_capacity(1 << 20, f))
    };
    cairn_mirror::check_streams(open()?)
        .map_err(|e| FsError::BadRequest(format!("{e}; nothing was applied")))?;
    let opts = cairn_mirror::ApplyOptions { force };
    let total = std::fs::metadata(path).map_or(0, |m| m.len());
    let input = Counting {
        inner: open()?,
        done: 0,
        shown: 0,
        total,
        progress,
    };
    let r = cairn_mirror::apply_streams(fs, input, opts).map_err(refused)?;
    Ok(
        json!({ "since": r.since, "upto": r.upto, "events": r.events, "chunks": r.chunks, "batches": r.batches, "streams": r.streams }),
    )
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
        self.done += n as u64;
        if self.done - self.shown >= 1 << 20 || (n == 0 && self.done > self.shown) {
            self.shown = self.done;
            (self.progress)(self.done, self.total.max(self.done));
        }
        Ok(n)
    }
}

pub fn status(fs: &Arc<Fs>) -> Result<Value, FsError> {
    let tid = fs.last_tid();
    let hex = |s: &[u8; 16]| cairn_mirror::apply::uuid(s);
    let uuid = hex(&fs.pool().sb.uuid);
    let (role, source) = match fs.mirror_role()? {
        Role::Normal => ("pool", None),
        Role::Unbound => ("unbound", None),
        Role::Mirror { source } => ("mirror", Some(hex(&source))),
        Role::Promoted { source } => ("promoted", Some(hex(&source))),
    };
    let mirrors: Vec<Value> = (fs.mirror_holds().into_iter())
        .map(|h| json!({ "mirror": h.mirror, "at": h.at, "tid": h.tid, "time_ns": h.time_ns, "lag_tids": tid.saturating_sub(h.tid) }))
        .collect();
    let r = fs.pool().meta.read().map_err(FsError::from)?;
    let time_ns = r.tid_time(tid).map_err(FsError::from)?.map(|(_, ns)| ns);
    let pruned_tid = r.counter("pruned_tid").map_err(FsError::from)?;
    let snapshots: Vec<Value> = (fs.snapshots()?.into_iter())
        .map(|s| json!({ "name": s.name, "tid": s.tid }))
        .collect();
    Ok(
        json!({ "role": role, "tid": tid, "uuid": uuid, "source": source, "time_ns": time_ns,
        "mirrors": mirrors, "pruned_tid": pruned_tid, "snapshots": snapshots }),
    )
}

pub fn promote(fs: &Arc<Fs>) -> Result<Value, FsError> {
    match fs.mirror_role()? {
        Role::Mirror { source } => fs.set_mirror_role(Role::Promoted { source })?,
        r => return Err(FsError::BadRequest(format!("not a mirror ({r:?})"))),
    }
    Ok(json!({ "tid": fs.last_tid() }))
}

trait Private {
    fn mode_private(&mut self) -> &mut Self;
}

impl Private for std::fs::OpenOptions {
    fn mode_private(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
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
