//! History commands: sync, snapshot, history, undo, prune, reblock. Each
//! sends one control request (see control/) and prints the answer for
//! people or, with --json, as JSON.

use crate::args::{GcArgs, HistoryArgs, PruneArgs, ReblockArgs, SnapshotCmd, TargetArgs, UndoArgs};
use crate::control::client::{call_with_json, resolve_file};
use crate::control::protocol::Request;
use crate::control::replies::{Deleted, SnapshotCreated, SnapshotEntry, SyncReply};
use crate::report::human;
use anyhow::{bail, Context, Result};
use cairn_fs::timefmt::format_utc;
use cairn_fs::{PruneReport, ReblockReport, ScrubReport, VerifyReport, Version};
use serde_json::Value;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

/// `v` as pretty JSON on stdout, in large writes (a history of 10,000
/// versions is 170,000 lines: println! would write each alone).
fn print_json(v: &Value) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    closed_ok((|| {
        serde_json::to_writer_pretty(&mut out, v)?;
        writeln!(out)?;
        out.flush()
    })())
}

/// Success when the reader of stdout went away (`cairn history F | head`),
/// as main.rs makes println! quiet about it.
fn closed_ok(r: std::io::Result<()>) -> Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// One line per entry of a report's "damaged" list.
fn print_damaged(damaged: &[String], label: &str) {
    for d in damaged {
        println!("{label}: {d}");
    }
}

pub fn sync(t: &TargetArgs) -> Result<()> {
    let (r, v): (SyncReply, _) = call_with_json(&t.target, Request::Sync)?;
    if t.json {
        return print_json(&v);
    }
    println!("0x{:016x}", r.tid);
    Ok(())
}

pub fn snapshot(c: SnapshotCmd) -> Result<()> {
    match c {
        SnapshotCmd::Create { t, name, no_wait } => {
            if let Some(why) = cairn_fs::history::snapshot::snapshot_name_problem(&name) {
                bail!("{why}");
            }
            let req = Request::SnapshotCreate {
                name,
                auto: false,
                wait: !no_wait,
            };
            created(&t, req)
        }
        SnapshotCmd::Auto { t } => {
            let req = Request::SnapshotCreate {
                name: String::new(),
                auto: true,
                wait: true,
            };
            created(&t, req)
        }
        SnapshotCmd::List { t } => list(&t),
        SnapshotCmd::Delete { t, name } => {
            let req = Request::SnapshotDelete { name };
            let (r, v): (Deleted, _) = call_with_json(&t.target, req)?;
            if t.json {
                return print_json(&v);
            }
            println!(
                "deleted snapshot {}; run `cairn prune` to free its space now",
                r.deleted
            );
            Ok(())
        }
        SnapshotCmd::Verify { t, name } => verify(&t, name),
    }
}

/// `snapshot verify`: exits with status 3 when the hashes differ.
fn verify(t: &TargetArgs, name: String) -> Result<()> {
    let (r, v): (VerifyReport, _) = call_with_json(&t.target, Request::SnapshotVerify { name })?;
    if t.json {
        print_json(&v)?;
    } else {
        print_damaged(&r.damaged, "DAMAGED");
        println!(
            "snapshot {} (tid 0x{:016x}): {} files, {}: recorded {} computed {}: {}",
            r.name,
            r.tid,
            r.files,
            human(r.bytes),
            r.recorded.as_deref().unwrap_or("(none)"),
            r.computed,
            if r.matches { "OK" } else { "MISMATCH" }
        );
    }
    if !r.matches {
        std::process::exit(3);
    }
    Ok(())
}

fn created(t: &TargetArgs, req: Request) -> Result<()> {
    let (r, v): (SnapshotCreated, _) = call_with_json(&t.target, req)?;
    if t.json {
        return print_json(&v);
    }
    println!(
        "created snapshot {} at tid 0x{:016x} in {:.2} ms",
        r.name, r.tid, r.create_ms
    );
    Ok(())
}

fn list(t: &TargetArgs) -> Result<()> {
    let (list, v): (Vec<SnapshotEntry>, _) = call_with_json(&t.target, Request::SnapshotList)?;
    if t.json {
        return print_json(&v);
    }
    println!(
        "{:<28} {:<18} {:<19} {:<5} {:>10} {:>10}  HASH",
        "NAME", "TID", "TIME (UTC)", "KIND", "DATA", "FREES"
    );
    for s in &list {
        let hash = match &s.hash {
            Some(h) => h.get(..16).unwrap_or(h),
            None => "(computing)",
        };
        println!(
            "{:<28} 0x{:016x} {:<19} {:<5} {:>10} {:>10}  {hash}",
            s.name,
            s.tid,
            format_utc(s.time_ns),
            s.kind,
            human(s.bytes),
            human(s.unique_bytes),
        );
    }
    Ok(())
}

pub fn history(a: &HistoryArgs) -> Result<()> {
    if a.off || a.on {
        resolve_file(&a.path, false)?;
        return set_nohistory(&a.path, a.off);
    }
    let (mnt, path) = mount_relative(&a.path)?;
    let req = Request::HistoryPath {
        path,
        inode: a.inode,
    };
    let (list, v): (Vec<Version>, _) =
        call_with_json(&mnt, req).with_context(|| format!("{}", a.path.display()))?;
    if a.json {
        return print_json(&v);
    }
    print_versions(&list)
}

/// The table of `cairn history`: a line per version, marking where the
/// inode changed, and a line where the path was gone.
fn print_versions(list: &[Version]) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    closed_ok(write_versions(&mut out, list).and_then(|()| out.flush()))
}

fn write_versions(out: &mut impl Write, list: &[Version]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<18} {:<19} {:>14} {:<19} {:>10}",
        "TID", "COMMITTED (UTC)", "SIZE", "MTIME (UTC)", "INODE"
    )?;
    for (i, e) in list.iter().enumerate() {
        // Before 1970 shows as 1970, as it always has.
        let mtime = u64::try_from(e.mtime_ns.max(0)).unwrap_or(u64::MAX);
        let mark = match (e.inode_changed, e.ended_tid) {
            (true, None) => "  (new inode, current)",
            (true, Some(_)) => "  (new inode)",
            (false, None) => "  (current)",
            (false, Some(_)) => "",
        };
        writeln!(
            out,
            "0x{:016x} {:<19} {:>14} {:<19} {:>10}{mark}",
            e.tid,
            format_utc(e.time_ns),
            e.size,
            format_utc(mtime),
            e.ino,
        )?;
        let next = list.get(i + 1).map(|n| n.tid);
        match (e.ended_tid, next) {
            (Some(end), None) => writeln!(out, "0x{end:016x} (gone: deleted or renamed away)")?,
            (Some(end), Some(n)) if n != end => writeln!(
                out,
                "0x{end:016x} (no version until the next: deleted, renamed away, or pruned)"
            )?,
            _ => {}
        }
    }
    Ok(())
}

/// PATH as its mount shows it: the mount point and the path from the
/// mount's root, its directories resolved (symlinks followed) and its last
/// name as given (the history of a symlink is the link's own). PATH itself
/// may be gone: a deleted path has a history too.
fn mount_relative(path: &std::path::Path) -> Result<(PathBuf, Vec<u8>)> {
    use std::os::unix::ffi::OsStrExt;
    let (_, mnt) = resolve_file(path, true)?;
    let abs = std::path::absolute(path)?;
    let full = match (abs.parent(), abs.file_name()) {
        (Some(d), Some(n)) => d
            .canonicalize()
            .with_context(|| format!("{}", d.display()))?
            .join(n),
        _ => abs
            .canonicalize()
            .with_context(|| format!("{}", abs.display()))?,
    };
    let rel = full
        .strip_prefix(&mnt)
        .with_context(|| format!("{} is not below {}", full.display(), mnt.display()))?;
    Ok((mnt, rel.as_os_str().as_bytes().to_vec()))
}

/// Copies the old version (read through the mount's historical views) over
/// PATH or into OUTPUT; the change is a new version, history is kept.
pub fn undo(a: &UndoArgs) -> Result<()> {
    let path = std::path::absolute(&a.path)?;
    let (_, mnt) = resolve_file(&path, true)?;
    let src: PathBuf = match (a.tid, &a.snapshot) {
        (Some(tid), _) => {
            let mut s = path.clone().into_os_string();
            s.push(format!("@@0x{tid:016x}"));
            s.into()
        }
        (None, Some(name)) => {
            if let Some(why) = cairn_fs::history::snapshot::snapshot_name_problem(name) {
                bail!("{why}");
            }
            if !mnt.join(".snapshots").join(name).is_dir() {
                bail!(
                    "no such snapshot: {name} (`cairn snapshot list {}` lists them)",
                    mnt.display()
                );
            }
            let rel = path.canonicalize().unwrap_or(path.clone());
            let rel = rel.strip_prefix(&mnt).unwrap_or(&rel).to_path_buf();
            mnt.join(".snapshots").join(name).join(rel)
        }
        (None, None) => bail!("give --tid or --snapshot"),
    };
    let meta =
        std::fs::metadata(&src).with_context(|| format!("no such version: {}", src.display()))?;
    if !meta.is_file() {
        bail!(
            "{} is not a regular file in that version; copy directories with cp -a from it",
            src.display()
        );
    }
    let dst = a.output.clone().unwrap_or(path);
    let mut from = std::fs::File::open(&src)?;
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&dst)
        .with_context(|| format!("{}", dst.display()))?;
    let n = std::io::copy(&mut from, &mut to)?;
    to.sync_all()?;
    restore_mode(&to, &dst, meta.mode() & 0o7777);
    println!(
        "restored {} ({n} bytes) from {}",
        dst.display(),
        src.display()
    );
    Ok(())
}

/// Gives the restored file the old version's mode; only its owner (or
/// root) may, so for another user it is a warning: the bytes are restored.
fn restore_mode(f: &std::fs::File, dst: &std::path::Path, mode: u32) {
    let same = f.metadata().is_ok_and(|m| m.mode() & 0o7777 == mode);
    if same {
        return;
    }
    if let Err(e) = f.set_permissions(std::fs::Permissions::from_mode(mode)) {
        eprintln!(
            "cairn: warning: {} is restored, but its mode stays (setting it to {mode:04o}, as in that version, needs its owner or root: {e})",
            dst.display()
        );
    }
}

pub fn prune(a: &PruneArgs) -> Result<()> {
    let req = Request::Prune {
        dry_run: a.dry_run,
        retention_secs: a.keep_history,
        keep_daily: a.keep_daily,
        keep_weekly: a.keep_weekly,
        keep_monthly: a.keep_monthly,
    };
    let (r, v): (PruneReport, _) = call_with_json(&a.t.target, req)?;
    if a.t.json {
        return print_json(&v);
    }
    for s in &r.expired_snapshots {
        println!("expired automatic snapshot {s}");
    }
    println!(
        "{}{} history elements, {} chunks ({}) and {} segments {}; history whole from tid 0x{:016x}",
        if a.dry_run { "dry run: " } else { "" },
        r.elements,
        r.chunks_freed,
        human(r.bytes_freed),
        r.segments_freed,
        if a.dry_run { "would be freed" } else { "freed" },
        r.cutoff_tid,
    );
    Ok(())
}

pub fn reblock(a: &ReblockArgs) -> Result<()> {
    let req = Request::Reblock {
        max_live_pct: a.max_live,
        files: !a.no_files,
    };
    moved(&a.t, req)
}

pub fn gc(a: &GcArgs) -> Result<()> {
    let req = Request::Gc {
        max_live_pct: a.max_live,
    };
    moved(&a.t, req)
}

/// Runs a reblock or gc request and prints its report.
fn moved(t: &TargetArgs, req: Request) -> Result<()> {
    let (r, v): (ReblockReport, _) = call_with_json(&t.target, req)?;
    if t.json {
        return print_json(&v);
    }
    print_damaged(&r.damaged, "DAMAGED (left in place)");
    println!(
        "rewrote {} segments and {} files: {} chunks ({}) moved, {} segments freed",
        r.segments_rewritten,
        r.files_rewritten,
        r.chunks_moved,
        human(r.bytes_moved),
        r.segments_freed,
    );
    Ok(())
}

pub fn scrub(t: &TargetArgs) -> Result<()> {
    let (r, v): (ScrubReport, _) = call_with_json(&t.target, Request::Scrub)?;
    let damaged = r.damaged.len();
    if t.json {
        print_json(&v)?;
    } else {
        print_damaged(&r.damaged, "DAMAGED");
        println!(
            "scrubbed {} chunks ({}): {damaged} damaged",
            r.chunks,
            human(r.bytes)
        );
        let copies = r.meta_copies;
        let (open, read, now) = (
            r.meta_repaired_at_open,
            r.meta_repaired_on_read,
            r.meta_repaired_now,
        );
        println!(
            "metadata: {copies} cop{}; pages repaired from the other copy: {open} when the pool was opened, {read} on reads, {now} by this scrub",
            if copies == 1 { "y" } else { "ies" }
        );
    }
    if damaged > 0 {
        std::process::exit(3);
    }
    Ok(())
}

/// Sets (`off`) or removes the `user.cairn.nohistory` attribute of a path.
fn set_nohistory(path: &std::path::Path, off: bool) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let name = c"user.cairn.nohistory";
    // SAFETY: valid NUL-terminated strings and a 1-byte value.
    let rc = unsafe {
        if off {
            libc::setxattr(p.as_ptr(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0)
        } else {
            libc::removexattr(p.as_ptr(), name.as_ptr())
        }
    };
    let err = std::io::Error::last_os_error();
    let already_on = !off && err.raw_os_error() == Some(libc::ENODATA);
    if rc != 0 && !already_on {
        return Err(err).with_context(|| format!("{}", path.display()));
    }
    println!(
        "{}: fine-grained history {}",
        path.display(),
        if off { "off" } else { "on" }
    );
    Ok(())
}
