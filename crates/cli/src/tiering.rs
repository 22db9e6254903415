//! Device and tiering commands: `cairn device add|remove` and `cairn
//! migrate`. Each sends one control request (served by the daemon when the
//! pool is mounted, or run in this process when it is not).

use crate::args::{DeviceCmd, TargetArgs, TierCmd};
use crate::control::client::call;
use crate::control::protocol::Request;
use crate::report::human;
use anyhow::{Context, Result};
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
            let cwd = std::env::current_dir().context("current directory")?;
            let name = if device.components().count() == 1
                && device.to_str().is_some_and(|s| s.parse::<u32>().is_ok())
            {
                device
            } else {
                cwd.join(device)
            };
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
    }
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
