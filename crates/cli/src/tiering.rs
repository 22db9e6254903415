//! Device and tiering commands: `cairn device add|remove` and `cairn
//! migrate`. Each sends one control request (served by the daemon when the
//! pool is mounted, or run in this process when it is not).

use crate::args::{DeviceCmd, RedundancyCmd, TargetArgs, TierCmd};
use crate::control::client::{call, decode_as, resolve_file, UsageError};
use crate::control::protocol::Request;
use crate::report::human;
use anyhow::{Context, Result};
use cairn_fs::redundancy::RedundancyStatus;
use serde_json::Value;

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).expect("json"));
}

pub fn device(c: DeviceCmd) -> Result<()> {
    match c {
        DeviceCmd::Add {
            t,
            mut spec,
            sparse,
        } => {
            spec.sparse |= sparse;
            if spec.sparse {
                eprintln!(
                    "cairn: warning: {} is left sparse (--sparse): its blocks are not reserved, so writes fail when the host filesystem fills",
                    spec.path.display()
                );
            }
            // The daemon's working directory is not ours (an s3 spec
            // names no local path).
            if !spec.class.is_object_store() {
                let cwd = std::env::current_dir().context("current directory")?;
                spec.path = cwd.join(&spec.path);
            }
            let v = call(
                &t.target,
                Request::DeviceAdd {
                    spec: spec.to_string(),
                },
            )?;
            if t.json {
                print_json(&v);
            } else {
                println!(
                    "added device {} ({} {}) at {}",
                    num(&v, "device"),
                    spec.class,
                    spec.role,
                    spec.path.display()
                );
                if let Some(to) = v["meta_mirror_next"].as_str() {
                    println!("the metadata's second copy goes to {to} at the next mount");
                }
            }
            Ok(())
        }
        DeviceCmd::Remove { t, device } => {
            let name = device_name(device)?;
            let v = call(
                &t.target,
                Request::DeviceRemove {
                    device: name.display().to_string(),
                },
            )?;
            if t.json {
                print_json(&v);
            } else {
                println!(
                    "removed device {}: {} segments ({}) moved to the other devices",
                    num(&v, "device"),
                    num(&v, "segments_moved"),
                    human(num(&v, "bytes_moved"))
                );
            }
            Ok(())
        }
        DeviceCmd::Replace { t, old, new } => replace(t, old, new),
    }
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
    if !new.class.is_object_store() {
        new.path = std::env::current_dir()
            .context("current directory")?
            .join(&new.path);
    }
    let req = Request::DeviceReplace {
        device: device_name(old)?.display().to_string(),
        spec: new.to_string(),
    };
    let v = call(&t.target, req)?;
    if t.json {
        print_json(&v);
        return Ok(());
    }
    println!(
        "replaced device {} by device {}: {} segments ({}) copied",
        num(&v, "old"),
        num(&v, "new"),
        num(&v, "segments"),
        human(num(&v, "bytes"))
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
        RedundancyCmd::Rebuild { t } => {
            let v = call(&t.target, Request::Resilver)?;
            if t.json {
                print_json(&v);
            } else {
                println!(
                    "{} segments changed: {} copies made ({}), {} dropped; {} still short of copies, {} lost",
                    num(&v, "segments"),
                    num(&v, "copies_made"),
                    human(num(&v, "bytes")),
                    num(&v, "copies_dropped"),
                    num(&v, "short"),
                    num(&v, "lost")
                );
                let stripes = ["stripes_made", "members_made", "stripes_dropped"];
                if stripes.iter().any(|k| num(&v, k) > 0) {
                    println!(
                        "stripes: {} made, {} members made again, {} dropped",
                        num(&v, "stripes_made"),
                        num(&v, "members_made"),
                        num(&v, "stripes_dropped")
                    );
                }
            }
            return Ok(());
        }
    };
    let v = call(&t.target, req)?;
    if t.json {
        print_json(&v);
        return Ok(());
    }
    print_redundancy(&decode_as("redundancy", v)?);
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
    let v = call(mnt, req)?;
    if t.json {
        print_json(&v);
        return Ok(());
    }
    println!(
        "{}: {policy} on {} files and directories; of their {} files' data, {} chunks ({}) moved, {} shared chunks kept at a stronger layout",
        t.target.display(),
        num(&v, "nodes"),
        num(&v, "files"),
        num(&v, "chunks_moved"),
        human(num(&v, "bytes_moved")),
        num(&v, "shared_kept")
    );
    for d in v["damaged"].as_array().into_iter().flatten() {
        println!("not moved: {}", d.as_str().unwrap_or("?"));
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
        print_json(&serde_json::json!({ "path": t.target, "policy": own }));
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
    let v = call(&t.target, Request::TierStatus)?;
    if t.json {
        print_json(&v);
        return Ok(());
    }
    println!(
        "{:>3} {:<5} {:<6} {:>10} {:>10} {:>5} {:>6}  heat: {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}  path",
        "id", "class", "role", "used", "size", "fill", "segs", "0", "<=1", "<=4", "<=16", "<=64", ">64"
    );
    for d in v.as_array().into_iter().flatten() {
        let (used, size) = (num(d, "used"), num(d, "size"));
        let heat: Vec<u64> = d["heat"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_u64())
            .collect();
        let mut notes = String::new();
        if d["draining"].as_bool() == Some(true) {
            notes.push_str(" [draining]");
        }
        if d["failing"].as_bool() == Some(true) {
            notes.push_str(" [FAILING]");
        }
        match d["state"].as_str() {
            Some("online") | None => {}
            Some(s) => notes.push_str(&format!(" [{}]", s.to_uppercase())),
        }
        if let Some(e) = d["emulated"].as_str() {
            notes.push_str(&format!(" [emulated slow: {e}]"));
        }
        println!(
            "{:>3} {:<5} {:<6} {:>10} {:>10} {:>4}% {:>6}        {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}  {}{notes}",
            num(d, "id"),
            d["class"].as_str().unwrap_or(""),
            d["role"].as_str().unwrap_or(""),
            human(used),
            human(size),
            (used * 100).checked_div(size).unwrap_or(0),
            num(d, "segments"),
            heat.first().unwrap_or(&0),
            heat.get(1).unwrap_or(&0),
            heat.get(2).unwrap_or(&0),
            heat.get(3).unwrap_or(&0),
            heat.get(4).unwrap_or(&0),
            heat.get(5).unwrap_or(&0),
            d["path"].as_str().unwrap_or(""),
        );
        if d["object_store"].is_object() {
            println!("    {}", crate::report::object_line(&d["object_store"]));
        }
    }
    Ok(())
}

fn migrate(t: &TargetArgs) -> Result<()> {
    let v = call(&t.target, Request::Migrate)?;
    if t.json {
        print_json(&v);
    } else {
        println!(
            "promoted {} and demoted {} segments ({} copied), {} skipped",
            num(&v, "promoted"),
            num(&v, "demoted"),
            human(num(&v, "bytes")),
            num(&v, "skipped")
        );
    }
    Ok(())
}
