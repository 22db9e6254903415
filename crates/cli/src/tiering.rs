//! Device and tiering commands: `cairn device add|remove` and `cairn
//! migrate`. Each sends one control request (served by the daemon when the
//! pool is mounted, or run in this process when it is not).

use crate::args::{DeviceCmd, RedundancyCmd, TargetArgs, TierCmd};
use crate::control::client::{call_with_json, resolve_file, UsageError};
use crate::control::protocol::Request;
use crate::control::replies::DeviceAdded;
use crate::report::human;
use anyhow::{Context, Result};
use cairn_fs::maintenance::devices::RemoveReport;
use cairn_fs::maintenance::tier::{MigrateReport, TierDevice};
use cairn_fs::redundancy::path_policy::PathLayoutReport;
use cairn_fs::redundancy::resilver::{ReplaceReport, ResilverReport};
use cairn_fs::redundancy::RedundancyStatus;
use serde_json::Value;

fn print_json(v: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub fn device(c: DeviceCmd) -> Result<()> {
    match c {
        DeviceCmd::Add { t, spec, sparse } => add(&t, spec, sparse),
        DeviceCmd::Remove { t, device } => {
            let name = device_name(device)?;
            let req = Request::DeviceRemove {
                device: name.display().to_string(),
            };
            let (r, v): (RemoveReport, _) = call_with_json(&t.target, req)?;
            if t.json {
                return print_json(&v);
            }
            println!(
                "removed device {}: {} segments ({}) moved to the other devices",
                r.device,
                r.segments_moved,
                human(r.bytes_moved)
            );
            Ok(())
        }
        DeviceCmd::Replace { t, old, new } => replace(t, old, new),
    }
}

/// `cairn device add`.
fn add(t: &TargetArgs, mut spec: cairn_devices::DeviceSpec, sparse: bool) -> Result<()> {
    spec.sparse |= sparse;
    if spec.sparse {
        eprintln!(
            "cairn: warning: {} is left sparse (--sparse): its blocks are not reserved, so writes fail when the host filesystem fills",
            spec.path.display()
        );
    }
    absolute_path(&mut spec)?;
    let req = Request::DeviceAdd {
        spec: spec.to_string(),
    };
    let (r, v): (DeviceAdded, _) = call_with_json(&t.target, req)?;
    if t.json {
        return print_json(&v);
    }
    println!(
        "added device {} ({} {}) at {}",
        r.device,
        spec.class,
        spec.role,
        spec.path.display()
    );
    if let Some(to) = r.meta_mirror_next {
        println!("the metadata's second copy goes to {to} at the next mount");
    }
    Ok(())
}

/// Makes a device spec's path absolute: the daemon's working directory is
/// not ours (an s3 spec names no local path).
fn absolute_path(spec: &mut cairn_devices::DeviceSpec) -> Result<()> {
    if !spec.class.is_object_store() {
        let cwd = std::env::current_dir().context("current directory")?;
        spec.path = cwd.join(&spec.path);
    }
    Ok(())
}

/// A device named on the command line: its id as given, a path made
/// absolute (the daemon's working directory is not ours).
fn device_name(device: std::path::PathBuf) -> Result<std::path::PathBuf> {
    let is_id = device.components().count() == 1
        && device.to_str().is_some_and(|s| s.parse::<u32>().is_ok());
    if is_id {
        return Ok(device);
    }
    Ok(std::env::current_dir()
        .context("current directory")?
        .join(device))
}

/// `cairn device replace`.
fn replace(
    t: TargetArgs,
    old: std::path::PathBuf,
    mut new: cairn_devices::DeviceSpec,
) -> Result<()> {
    absolute_path(&mut new)?;
    let req = Request::DeviceReplace {
        device: device_name(old)?.display().to_string(),
        spec: new.to_string(),
    };
    let (r, v): (ReplaceReport, _) = call_with_json(&t.target, req)?;
    if t.json {
        return print_json(&v);
    }
    println!(
        "replaced device {} by device {}: {} segments ({}) copied",
        r.old,
        r.new,
        r.segments,
        human(r.bytes)
    );
    Ok(())
}

/// `cairn redundancy set|show|rebuild`.
pub fn redundancy(c: RedundancyCmd) -> Result<()> {
    let (t, req) = match c {
        RedundancyCmd::Set { t, policy } => match path_in_mount(&t.target)? {
            Some(mnt) => return set_path_policy(&t, &mnt, &policy),
            None => {
                let p: cairn_data::Policy = (policy.parse())
                    .map_err(|e: cairn_data::PolicyError| UsageError(e.to_string()))?;
                let policy = p.to_string();
                (t, Request::RedundancySet { policy })
            }
        },
        RedundancyCmd::Show { t } => match path_in_mount(&t.target)? {
            Some(_) => return show_path_policy(&t),
            None => (t, Request::RedundancyShow),
        },
        RedundancyCmd::Rebuild { t } => return rebuild(&t),
    };
    let (r, v): (RedundancyStatus, _) = call_with_json(&t.target, req)?;
    if t.json {
        return print_json(&v);
    }
    print_redundancy(&r);
    Ok(())
}

/// `cairn redundancy rebuild`.
fn rebuild(t: &TargetArgs) -> Result<()> {
    let (r, v): (ResilverReport, _) = call_with_json(&t.target, Request::Resilver)?;
    if t.json {
        return print_json(&v);
    }
    println!(
        "{} segments changed: {} copies made ({}), {} dropped; {} still short of copies, {} lost",
        r.segments,
        r.copies_made,
        human(r.bytes),
        r.copies_dropped,
        r.short,
        r.lost
    );
    if r.stripes_made + r.members_made + r.stripes_dropped > 0 {
        println!(
            "stripes: {} made, {} members made again, {} dropped",
            r.stripes_made, r.members_made, r.stripes_dropped
        );
    }
    Ok(())
}

/// The mount `t` lies in, when `t` is a file or directory in it (not the
/// mount point itself, which names the pool).
fn path_in_mount(t: &std::path::Path) -> Result<Option<std::path::PathBuf>> {
    let Ok((_, mnt)) = resolve_file(t, false) else {
        return Ok(None);
    };
    let here = t.canonicalize().with_context(|| t.display().to_string())?;
    Ok((here != mnt.canonicalize()?).then_some(mnt))
}

/// `cairn redundancy set PATH POLICY`.
fn set_path_policy(t: &TargetArgs, mnt: &std::path::Path, policy: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if policy != "inherit" {
        let _: cairn_data::Layout = (policy.parse())
            .map_err(|e: cairn_data::PolicyError| UsageError(format!("{e} (or 'inherit')")))?;
    }
    let ino = std::fs::symlink_metadata(&t.target)
        .with_context(|| t.target.display().to_string())?
        .ino();
    let req = Request::RedundancySetPath {
        ino,
        policy: policy.to_string(),
    };
    let (r, v): (PathLayoutReport, _) = call_with_json(mnt, req)?;
    if t.json {
        return print_json(&v);
    }
    println!(
        "{}: {policy} on {} files and directories; of their {} files' data, {} chunks ({}) moved, {} shared chunks kept at a stronger layout",
        t.target.display(),
        r.nodes,
        r.files,
        r.chunks_moved,
        human(r.bytes_moved),
        r.shared_kept
    );
    for d in &r.damaged {
        println!("not moved: {d}");
    }
    Ok(())
}

/// `cairn redundancy show PATH`: the path's own policy.
fn show_path_policy(t: &TargetArgs) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(t.target.as_os_str().as_bytes())?;
    let mut buf = [0u8; 64];
    // SAFETY: a NUL-terminated path and name, and a buffer of its length.
    let n = unsafe {
        let name = c"user.cairn.redundancy";
        libc::getxattr(
            p.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let own = match n {
        n if n >= 0 => Some(String::from_utf8_lossy(&buf[..n as usize]).into_owned()),
        _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENODATA) => None,
        _ => {
            let e = std::io::Error::last_os_error();
            return Err(e).with_context(|| t.target.display().to_string());
        }
    };
    if t.json {
        print_json(&serde_json::json!({ "path": t.target, "policy": own }))?;
    } else {
        match own {
            Some(p) => println!("{}: {p} (its own)", t.target.display()),
            None => println!("{}: its tier's policy", t.target.display()),
        }
    }
    Ok(())
}

/// The redundancy status for people.
fn print_redundancy(v: &RedundancyStatus) {
    println!("policy: {}", v.policy);
    println!(
        "{:>3} {:<5} {:<8} {:<14} {:>8} {:<3}  path",
        "id", "class", "state", "domain", "copies", "log"
    );
    for d in &v.devices {
        let mut state = d.state.clone();
        if d.draining {
            state.push('*');
        }
        println!(
            "{:>3} {:<5} {:<8} {:<14} {:>8} {:<3}  {}",
            d.id,
            d.class,
            state,
            d.domain,
            d.copies,
            if d.log { "yes" } else { "-" },
            d.path
        );
    }
    println!("intent log: {}", v.intent_log);
    println!(
        "{} segments; {} short of copies ({} at risk); {} lost ({})",
        v.segments,
        v.short_segments,
        human(v.bytes_at_risk),
        v.lost_segments,
        human(v.lost_bytes)
    );
    if v.stripes + v.waiting_for_stripe > 0 {
        println!(
            "{} stripes holding {} segments; {} segments wait for a stripe (keeping their copies meanwhile)",
            v.stripes, v.striped_segments, v.waiting_for_stripe
        );
    }
    println!(
        "since mount: {} reads served from another copy, {} restored from parity, {} copies repaired, {} left bad",
        v.served_from_other_copy, v.restored_from_parity, v.repaired, v.unrepaired
    );
}

pub fn tier(c: TierCmd) -> Result<()> {
    match c {
        TierCmd::Status { t } => status(&t),
        TierCmd::Migrate { t, now: _ } => migrate(&t),
    }
}

fn status(t: &TargetArgs) -> Result<()> {
    let (list, v): (Vec<TierDevice>, _) = call_with_json(&t.target, Request::TierStatus)?;
    if t.json {
        return print_json(&v);
    }
    println!(
        "{:>3} {:<5} {:<6} {:>10} {:>10} {:>5} {:>6}  heat: {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}  path",
        "id", "class", "role", "used", "size", "fill", "segs", "0", "<=1", "<=4", "<=16", "<=64", ">64"
    );
    for td in &list {
        let d = &td.device;
        let h = &td.heat;
        println!(
            "{:>3} {:<5} {:<6} {:>10} {:>10} {:>4}% {:>6}        {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}  {}{}",
            d.id,
            d.class,
            d.role,
            human(d.used),
            human(d.size),
            (d.used * 100).checked_div(d.size).unwrap_or(0),
            d.segments,
            h[0],
            h[1],
            h[2],
            h[3],
            h[4],
            h[5],
            d.path,
            status_notes(d),
        );
        if let Some(o) = &d.object_store {
            println!("    {}", crate::report::object_line(o));
        }
    }
    Ok(())
}

/// The notes after a device's line in `tier status`: draining, failing,
/// not online (an older daemon sends no state: online), emulated slow.
fn status_notes(d: &cairn_fs::maintenance::info::DeviceInfo) -> String {
    let mut notes = String::new();
    if d.draining {
        notes.push_str(" [draining]");
    }
    if d.failing {
        notes.push_str(" [FAILING]");
    }
    if !d.state.is_empty() && d.state != "online" {
        notes.push_str(&format!(" [{}]", d.state.to_uppercase()));
    }
    if let Some(e) = &d.emulated {
        notes.push_str(&format!(" [emulated slow: {e}]"));
    }
    notes
}

fn migrate(t: &TargetArgs) -> Result<()> {
    let (r, v): (MigrateReport, _) = call_with_json(&t.target, Request::Migrate)?;
    if t.json {
        return print_json(&v);
    }
    println!(
        "promoted {} and demoted {} segments ({} copied), {} skipped",
        r.promoted,
        r.demoted,
        human(r.bytes),
        r.skipped
    );
    Ok(())
}
