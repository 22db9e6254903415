//! History commands: sync, snapshot, history, undo, prune, reblock. Each
//! sends one control request (see control/) and prints the answer for
//! people or, with --json, as JSON.

use crate::args::{GcArgs, HistoryArgs, PruneArgs, ReblockArgs, SnapshotCmd, TargetArgs, UndoArgs};
use crate::control::client::{call, resolve_file};
use crate::control::protocol::Request;
use crate::report::human;
use anyhow::{bail, Context, Result};
use cairn_fs::timefmt::format_utc;
use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).expect("json"));
}

/// One line per entry of a report's "damaged" list.
fn print_damaged(v: &Value, label: &str) {
    for d in v["damaged"].as_array().into_iter().flatten() {
        println!("{label}: {}", d.as_str().unwrap_or(""));
    }
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

pub fn sync(t: &TargetArgs) -> Result<()> {
    let v = call(&t.target, Request::Sync)?;
    if t.json {
        print_json(&v);
    } else {
        println!("0x{:016x}", num(&v, "tid"));
    }
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
            let v = call(&t.target, req)?;
            created(&t, v)
        }
        SnapshotCmd::Auto { t } => {
            let req = Request::SnapshotCreate {
                name: String::new(),
                auto: true,
                wait: true,
            };
            created(&t, call(&t.target, req)?)
        }
        SnapshotCmd::List { t } => list(&t, call(&t.target, Request::SnapshotList)?),
        SnapshotCmd::Delete { t, name } => {
            let v = call(&t.target, Request::SnapshotDelete { name: name.clone() })?;
            if t.json {
                print_json(&v);
            } else {
                println!("deleted snapshot {name}; run `cairn prune` to free its space now");
            }
            Ok(())
        }
        SnapshotCmd::Verify { t, name } => {
            let v = call(&t.target, Request::SnapshotVerify { name })?;
            let ok = v["matches"].as_bool() == Some(true);
            if t.json {
                print_json(&v);
            } else {
                print_damaged(&v, "DAMAGED");
                println!(
                    "snapshot {} (tid 0x{:016x}): {} files, {}: recorded {} computed {}: {}",
                    v["name"].as_str().unwrap_or(""),
                    num(&v, "tid"),
                    num(&v, "files"),
                    human(num(&v, "bytes")),
                    v["recorded"].as_str().unwrap_or("(none)"),
                    v["computed"].as_str().unwrap_or(""),
                    if ok { "OK" } else { "MISMATCH" }
                );
            }
            if !ok {
                std::process::exit(3);
            }
            Ok(())
        }
    }
}

fn created(t: &TargetArgs, v: Value) -> Result<()> {
    if t.json {
        print_json(&v);
    } else {
        println!(
            "created snapshot {} at tid 0x{:016x} in {:.2} ms",
            v["name"].as_str().unwrap_or(""),
            num(&v, "tid"),
            v["create_ms"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}

fn list(t: &TargetArgs, v: Value) -> Result<()> {
    if t.json {
        print_json(&v);
        return Ok(());
    }
    println!(
        "{:<28} {:<18} {:<19} {:<5} {:>10} {:>10}  HASH",
        "NAME", "TID", "TIME (UTC)", "KIND", "DATA", "FREES"
    );
    for s in v.as_array().into_iter().flatten() {
        let hash = s["hash"]
            .as_str()
            .map_or("(computing)".to_string(), |h| h[..16].to_string());
        println!(
            "{:<28} 0x{:016x} {:<19} {:<5} {:>10} {:>10}  {hash}",
            s["name"].as_str().unwrap_or(""),
            num(s, "tid"),
            format_utc(num(s, "time_ns")),
            s["kind"].as_str().unwrap_or(""),
            human(num(s, "bytes")),
            human(num(s, "unique_bytes")),
        );
    }
    Ok(())
}

pub fn history(a: &HistoryArgs) -> Result<()> {
    let (_, mnt) = resolve_file(&a.path, false)?;
    if a.off || a.on {
        return set_nohistory(&a.path, a.off);
    }
    let ino = std::fs::symlink_metadata(&a.path)
        .with_context(|| format!("{}", a.path.display()))?
        .ino();
    let v = call(&mnt, Request::History { ino })?;
    if a.json {
        print_json(&v);
        return Ok(());
    }
    println!(
        "{:<18} {:<19} {:>14} {:<19}",
        "TID", "COMMITTED (UTC)", "SIZE", "MTIME (UTC)"
    );
    for e in v.as_array().into_iter().flatten() {
        let mtime = e["mtime_ns"].as_i64().unwrap_or(0).max(0) as u64;
        println!(
            "0x{:016x} {:<19} {:>14} {:<19}{}",
            num(e, "tid"),
            format_utc(num(e, "time_ns")),
            num(e, "size"),
            format_utc(mtime),
            if e["ended_tid"].is_null() {
                "  (current)"
            } else {
                ""
            }
        );
    }
    Ok(())
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
    let v = call(&a.t.target, req)?;
    if a.t.json {
        print_json(&v);
        return Ok(());
    }
    for s in v["expired_snapshots"].as_array().into_iter().flatten() {
        println!("expired automatic snapshot {}", s.as_str().unwrap_or(""));
    }
    println!(
        "{}{} history elements, {} chunks ({}) and {} segments {}; history whole from tid 0x{:016x}",
        if a.dry_run { "dry run: " } else { "" },
        num(&v, "elements"),
        num(&v, "chunks_freed"),
        human(num(&v, "bytes_freed")),
        num(&v, "segments_freed"),
        if a.dry_run { "would be freed" } else { "freed" },
        num(&v, "cutoff_tid"),
    );
    Ok(())
}

pub fn reblock(a: &ReblockArgs) -> Result<()> {
    let req = Request::Reblock {
        max_live_pct: a.max_live,
        files: !a.no_files,
    };
    moved(&a.t, call(&a.t.target, req)?)
}

pub fn gc(a: &GcArgs) -> Result<()> {
    let req = Request::Gc {
        max_live_pct: a.max_live,
    };
    moved(&a.t, call(&a.t.target, req)?)
}

/// Prints a reblock or gc report.
fn moved(t: &TargetArgs, v: Value) -> Result<()> {
    if t.json {
        print_json(&v);
        return Ok(());
    }
    print_damaged(&v, "DAMAGED (left in place)");
    println!(
        "rewrote {} segments and {} files: {} chunks ({}) moved, {} segments freed",
        num(&v, "segments_rewritten"),
        num(&v, "files_rewritten"),
        num(&v, "chunks_moved"),
        human(num(&v, "bytes_moved")),
        num(&v, "segments_freed"),
    );
    Ok(())
}

pub fn scrub(t: &TargetArgs) -> Result<()> {
    let v = call(&t.target, Request::Scrub)?;
    let damaged = v["damaged"].as_array().map_or(0, |d| d.len());
    if t.json {
        print_json(&v);
    } else {
        print_damaged(&v, "DAMAGED");
        println!(
            "scrubbed {} chunks ({}): {damaged} damaged",
            num(&v, "chunks"),
            human(num(&v, "bytes"))
        );
        let copies = num(&v, "meta_copies");
        let (open, read, now) = (
            num(&v, "meta_repaired_at_open"),
            num(&v, "meta_repaired_on_read"),
            num(&v, "meta_repaired_now"),
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
