//! `cairn check` and `cairn info`: open the pool, run the library's report,
//! print it for people or as JSON.

use crate::control::protocol::Request;
use crate::control::replies::{InfoReply, NbdServer};
use anyhow::{bail, Result};
use cairn_fs::maintenance::objects::ObjectInfo;
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
    let opened_pool = match crate::key::sealed_mirror(pool)? {
        Some(p) => Ok(p),
        None => {
            let secret = crate::key::secret_for(pool)?;
            let host = cairn_devices::HostStorage::shared();
            Pool::open_keyed(pool, None, host, secret.as_ref())
        }
    };
    let rep = match opened_pool {
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
    // An encrypted mirror answers without its key (its counts sealed).
    let s = crate::control::client::Session::open_sealed_mirror_or_pool(target)?;
    let v = s.call(Request::Info)?;
    s.close()?;
    let r: InfoReply = crate::control::client::decode_ref("info", &v)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let i = &r.pool;
    for w in i.mode_warnings.iter().chain(&i.space_warning) {
        println!("WARNING: {w}");
    }
    print_summary(i);
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
    print_caches(i);
    println!("volumes:");
    crate::volume::print_volume_table(&r.volumes);
    print_nbd(r.nbd.as_deref());
    if let Some(k) = r.keeper {
        println!("kept mount:      keeper pid {k}: `cairn restart` replaces the daemon under it");
    }
    if let Some(fw) = &r.fuse_workers {
        let wait = &fw.queue_wait;
        println!(
            "fuse workers:    {}",
            workers_line(fw, wait.mean_us(), ("max", wait.max_us))
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
    match &i.encryption {
        None if i.sealed => println!(
            "encryption:      a mirror of an encrypted pool, held without its key: files, directories and logical bytes are counted with it (--key-file)"
        ),
        None => println!("encryption:      off"),
        Some(e) => {
            let day = |s: u64| cairn_fs::timefmt::format_utc(s.saturating_mul(1_000_000_000));
            println!("encryption:      {}; key: {}", e.algorithm, e.key_source);
            println!(
                "                 made {}, key last changed {}",
                day(e.created),
                day(e.key_changed)
            );
            println!("                 encrypted: {}", e.covers);
        }
    }
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
            println!("     {}", object_line(o));
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
fn workers_line(
    p: &cairn_workpool::Stats,
    wait_mean_us: u64,
    (tail, wait_us): (&str, u64),
) -> String {
    format!(
        "{} alive ({}..{}), {} busy, {} queued, peak {}; queue wait mean {wait_mean_us} us, {tail} {wait_us} us",
        p.workers, p.min, p.max, p.busy, p.queued, p.peak_workers,
    )
}

/// The NBD servers of the daemon: address, connections, commands, workers.
fn print_nbd(nbd: Option<&[NbdServer]>) {
    let Some(list) = nbd else {
        println!("nbd:             not served");
        return;
    };
    for s in list {
        let st = &s.stats;
        let (read, write) = (st.command("read"), st.command("write"));
        println!(
            "nbd:             {} ({} connections open, {} in all)",
            s.address, st.connections_open, st.connections_total
        );
        println!(
            "  requests:      {} reads ({}), {} writes ({}), {} flushes, {} trims, {} errors",
            read.count,
            human(read.bytes),
            write.count,
            human(write.bytes),
            st.command("flush").count,
            st.command("trim").count,
            st.commands.values().map(|c| c.errors).sum::<u64>()
        );
        let (mean, p99) = (s.queue_wait_mean_us, s.queue_wait_p99_us);
        println!(
            "  workers:       {}",
            workers_line(&st.pool, mean, ("p99", p99))
        );
    }
}

/// One line of an object-store device's state for `info` and `tier
/// status`: "s3 ok: 12 GET, 3 PUT, ... 0 errors".
pub(crate) fn object_line(o: &ObjectInfo) -> String {
    let n = &o.stats;
    format!(
        "object store {}: {} GET, {} PUT, {} HEAD, {} LIST, {} DELETE; {} in, {} out; {} errors ({} timeouts); {} deletes pending",
        n.state,
        n.gets,
        n.puts,
        n.heads,
        n.lists,
        n.deletes,
        human(n.bytes_in),
        human(n.bytes_out),
        n.errors,
        n.timeouts,
        o.pending_deletes,
    )
}
