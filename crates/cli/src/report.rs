//! `cairn check` and `cairn info`: open the pool, run the library's report,
//! print it for people or as JSON.

use anyhow::{bail, Result};
use cairn_fs::{FsError, Pool};
use std::path::Path;

/// Refuses a mount point given for a pool directory, naming the pool.
fn not_a_mount_point(pool: &Path) -> Result<()> {
    if let Some((mnt, src)) = mount_point_of(pool) {
        bail!(
            "{} is the mount point of Cairn pool {src}, not a pool directory; `cairn check` needs the unmounted pool: `cairn umount {}` then `cairn check {src}`",
            mnt.display(),
            mnt.display()
        );
    }
    Ok(())
}

fn opened(pool: &Path, r: cairn_fs::error::Result<Pool>) -> Result<Pool> {
    match r {
        Err(FsError::Busy) => bail!(
            "pool {} is mounted; unmount it first (`cairn umount MOUNTPOINT`)",
            pool.display()
        ),
        r => Ok(r?),
    }
}

/// The Cairn mount at `path` (mount point, pool), if `path` is not a pool.
fn mount_point_of(path: &Path) -> Option<(std::path::PathBuf, String)> {
    if cairn_fs::pool::PoolPaths::superblock(path).exists() {
        return None;
    }
    let t = path.canonicalize().ok()?;
    crate::daemon::cairn_mounts()
        .ok()?
        .into_iter()
        .find(|(m, _)| *m == t)
}

pub fn check(pool: &Path) -> Result<()> {
    not_a_mount_point(pool)?;
    let rep = match Pool::open(pool, None) {
        Err(e) if e.meta_damage().is_some() => {
            cairn_fs::maintenance::salvage::salvage_pool(pool, e.meta_damage().unwrap_or_default())?
        }
        r => {
            let p = opened(pool, r)?;
            for w in cairn_fs::maintenance::info::mode_warnings(&p) {
                println!("WARNING: {w}");
            }
            cairn_fs::maintenance::check::check_pool(&p)?
        }
    };
    for prob in &rep.problems {
        println!("PROBLEM: {prob}");
    }
    println!(
        "checked {} inodes, {} extents, {} chunks ({} bytes verified): {} problem(s)",
        rep.inodes,
        rep.extents,
        rep.chunks,
        rep.bytes_verified,
        rep.problems.len()
    );
    if !rep.problems.is_empty() {
        std::process::exit(3);
    }
    Ok(())
}

pub fn human(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

/// Info works on a mounted pool too (answered by the daemon).
pub fn info(target: &Path, json: bool) -> Result<()> {
    let v = crate::control::client::call(target, crate::control::protocol::Request::Info)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let (vols, nbd, fw) = (
        v["volumes"].clone(),
        v["nbd"].clone(),
        v["fuse_workers"].clone(),
    );
    let i: cairn_fs::maintenance::info::PoolInfo = serde_json::from_value(v)?;
    for w in i.mode_warnings.iter().chain(&i.space_warning) {
        println!("WARNING: {w}");
    }
    print_summary(&i);
    for l in &i.locks {
        println!(
            "lock {:<10} taken {}, waited {} times ({:.1} ms in all, {:.1} ms at most)",
            l.name,
            l.acquired,
            l.waited,
            l.wait_us_total as f64 / 1000.0,
            l.wait_us_max as f64 / 1000.0
        );
    }
    print_devices(&i.devices);
    print_caches(&i);
    println!("volumes:");
    crate::volume::print_volume_table(&vols)?;
    print_nbd(&nbd);
    if fw.is_object() {
        let wait = &fw["queue_wait"];
        let mean =
            wait["total_us"].as_u64().unwrap_or(0) / wait["count"].as_u64().unwrap_or(0).max(1);
        println!(
            "fuse workers:    {}",
            workers_line(&fw, mean, ("max", wait["max_us"].as_u64().unwrap_or(0)))
        );
    }
    Ok(())
}

/// Identity, sizes, dedup, compression and batched work of `info`.
fn print_summary(i: &cairn_fs::maintenance::info::PoolInfo) {
    println!("pool:            {} ({})", i.pool, i.uuid);
    println!("format version:  {}", i.format_version);
    println!("record size:     {}", human(i.record_size as u64));
    println!("current tid:     0x{:016x}", i.current_tid);
    println!("files / dirs:    {} / {}", i.files, i.directories);
    println!("logical bytes:   {}", human(i.logical_bytes));
    println!("physical bytes:  {}", human(i.physical_bytes));
    println!("capacity:        {}", human(i.capacity_bytes));
    println!(
        "elements:        {} live, {} history; {} chunks in {} segments",
        i.live_elements, i.history_elements, i.chunks, i.segments
    );
    println!(
        "data:            {} referenced, {} unique, {} stored ({} for history only)",
        human(i.referenced_bytes),
        human(i.unique_bytes),
        human(i.stored_bytes),
        human(i.history_only_bytes)
    );
    println!(
        "dedup:           {} ({:.2}x, {} index entries, {} index RAM at most, {:.1} B/entry)",
        if i.dedup_enabled { "on" } else { "off" },
        i.dedup_ratio,
        i.index_entries,
        human(i.index_ram_bytes),
        i.index_ram_bytes as f64 / i.index_entries.max(1) as f64
    );
    println!(
        "compression:     {} ({:.2}x)",
        i.compression, i.compression_ratio
    );
    let w = &i.waiting;
    println!(
        "batched updates: {} dedup entries, {} creation index removals, {} live counts, {} old versions waiting; {} chunks stored ahead of their tree commit",
        w.dedup_entries, w.creation_index_removals, w.live_count_chunks, w.ended_elements, w.stored_ahead_chunks
    );
}

/// The device table of `info`.
fn print_devices(devices: &[cairn_fs::maintenance::info::DeviceInfo]) {
    println!("devices:");
    for d in devices {
        let mut notes = String::new();
        if d.draining {
            notes.push_str(" [draining]");
        }
        if !d.state.is_empty() && d.state != "online" {
            notes.push_str(&format!(" [{}]", d.state.to_uppercase()));
        }
        if d.failing {
            notes.push_str(&format!(
                " [FAILING: {} write errors, no new data]",
                d.write_errors
            ));
        } else if d.write_errors > 0 {
            notes.push_str(&format!(" [{} write errors]", d.write_errors));
        }
        if let Some(e) = &d.emulated {
            notes.push_str(&format!(" [emulated slow: {e}]"));
        }
        println!(
            "  {:>2} {:<4} {:<5} {:>10} used of {:>10}, {:>6} segments ({} hot)  {}{notes}",
            d.id,
            d.class,
            d.role,
            human(d.used),
            human(d.size),
            d.segments,
            d.hot_segments,
            d.path
        );
        if let Some(o) = &d.object_store {
            println!(
                "     {}",
                object_line(&serde_json::to_value(o).expect("serializes"))
            );
        }
    }
}

/// The RAM and SSD read caches of `info`.
fn print_caches(i: &cairn_fs::maintenance::info::PoolInfo) {
    println!("RAM read cache:  {}", human(i.ram_cache_bytes));
    if let Some(c) = &i.ssd_cache {
        println!(
            "SSD read cache:  {} entries, {} hits, {} misses, {} filled, {} throttled, {} dropped",
            c.entries,
            c.hits,
            c.misses,
            human(c.filled_bytes),
            c.throttled,
            c.dropped
        );
        println!(
            "  of which metadata pages: {} entries, {} hits, {} misses",
            c.meta_entries, c.meta_hits, c.meta_misses
        );
    }
}

/// An adaptive worker pool's state (crates/workpool `Stats`), and its
/// queue wait.
fn workers_line(p: &serde_json::Value, wait_mean_us: u64, (tail, wait_us): (&str, u64)) -> String {
    let n = |k: &str| p[k].as_u64().unwrap_or(0);
    format!(
        "{} alive ({}..{}), {} busy, {} queued, peak {}; queue wait mean {wait_mean_us} us, {tail} {wait_us} us",
        n("workers"),
        n("min"),
        n("max"),
        n("busy"),
        n("queued"),
        n("peak_workers"),
    )
}

/// The NBD servers of the daemon: address, connections, commands, workers.
fn print_nbd(nbd: &serde_json::Value) {
    let Some(list) = nbd.as_array() else {
        println!("nbd:             not served");
        return;
    };
    let n = |x: &serde_json::Value, k: &str| x[k].as_u64().unwrap_or(0);
    for s in list {
        let st = &s["stats"];
        let (c, p) = (&st["commands"], &st["pool"]);
        println!(
            "nbd:             {} ({} connections open, {} in all)",
            s["address"].as_str().unwrap_or(""),
            n(st, "connections_open"),
            n(st, "connections_total")
        );
        println!(
            "  requests:      {} reads ({}), {} writes ({}), {} flushes, {} trims, {} errors",
            n(&c["read"], "count"),
            human(n(&c["read"], "bytes")),
            n(&c["write"], "count"),
            human(n(&c["write"], "bytes")),
            n(&c["flush"], "count"),
            n(&c["trim"], "count"),
            c.as_object()
                .map_or(0, |m| m.values().map(|x| n(x, "errors")).sum::<u64>())
        );
        let (mean, p99) = (n(s, "queue_wait_mean_us"), n(s, "queue_wait_p99_us"));
        println!("  workers:       {}", workers_line(p, mean, ("p99", p99)));
    }
}

/// One line of an object-store device's state for `info` and `tier
/// status`: "s3 ok: 12 GET, 3 PUT, ... 0 errors".
pub(crate) fn object_line(o: &serde_json::Value) -> String {
    let n = |k: &str| o[k].as_u64().unwrap_or(0);
    format!(
        "object store {}: {} GET, {} PUT, {} HEAD, {} LIST, {} DELETE; {} in, {} out; {} errors ({} timeouts); {} deletes pending",
        o["state"].as_str().unwrap_or("?"),
        n("gets"),
        n("puts"),
        n("heads"),
        n("lists"),
        n("deletes"),
        human(n("bytes_in")),
        human(n("bytes_out")),
        n("errors"),
        n("timeouts"),
        n("pending_deletes"),
    )
}
