//! `cairn volume ...`: block volumes of a pool, mounted (run by the daemon)
//! or not (run here), through control requests; and `cairn nbd serve`,
//! which serves an unmounted pool's volumes over NBD without FUSE.

use crate::args::{size_arg, NbdArgs};
use crate::control::client::call_with_json;
use crate::control::protocol::Request;
use crate::control::replies::{Deleted, VolumeChange, VolumeSnapshotReply};
use crate::report::human;
use anyhow::{bail, Context, Result};
use cairn_fs::timefmt::format_utc;
use cairn_fs::VolumeInfo;
use clap::{Args, Subcommand};
use serde_json::Value;
use std::path::PathBuf;

#[derive(Args)]
pub struct VolTarget {
    /// A pool directory, or a mount point (or any path in a mount).
    pub target: PathBuf,
    /// Machine-readable output (the volume's JSON).
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum VolumeCmd {
    /// Make an empty volume (all zeros; nothing stored until written).
    #[command(after_help = "Example: cairn volume create /mnt/pool vm1 20G --block-size 4K")]
    Create {
        #[command(flatten)]
        t: VolTarget,
        name: String,
        /// Size in bytes, or with a binary suffix K, M, G, T (e.g. 20G).
        #[arg(value_parser = size_arg)]
        size: u64,
        /// The block size NBD clients are told to use: 4K, 16K or 64K.
        #[arg(long, default_value = "4K", value_parser = block_size_arg)]
        block_size: u32,
    },
    /// List volumes: size, block size, bytes stored, snapshots.
    #[command(after_help = "Example: cairn volume list /mnt/pool --json")]
    List {
        #[command(flatten)]
        t: VolTarget,
    },
    /// Grow a volume, or shrink it with --shrink (the data past the new
    /// end is lost).
    #[command(after_help = "Example: cairn volume resize /mnt/pool vm1 40G")]
    Resize {
        #[command(flatten)]
        t: VolTarget,
        name: String,
        #[arg(value_parser = size_arg)]
        size: u64,
        /// Allow a size smaller than the volume's.
        #[arg(long)]
        shrink: bool,
    },
    /// Delete a volume (its snapshots too with --with-snapshots).
    #[command(after_help = "Example: cairn volume delete /mnt/pool vm1 --with-snapshots")]
    Delete {
        #[command(flatten)]
        t: VolTarget,
        name: String,
        /// Delete the volume's snapshots with it.
        #[arg(long)]
        with_snapshots: bool,
    },
    /// Snapshot a volume in O(1): the pool snapshot NAME@SNAP, served
    /// read-only over NBD as the export NAME@SNAP.
    #[command(after_help = "Example: cairn volume snapshot /mnt/pool vm1 before-upgrade")]
    Snapshot {
        #[command(flatten)]
        t: VolTarget,
        name: String,
        snap: String,
        /// Return once the snapshot is cut (every write acknowledged before
        /// is in it, none after), without waiting for the commit that
        /// records it; a crash before that commit (started at once) loses
        /// the snapshot with the writes it holds that were never synced.
        #[arg(long)]
        no_wait: bool,
    },
    /// Make a new volume from a snapshot, sharing its blocks (no copy).
    #[command(after_help = "Example: cairn volume clone /mnt/pool vm1@before-upgrade vm2")]
    Clone {
        #[command(flatten)]
        t: VolTarget,
        /// The snapshot, as NAME@SNAP.
        source: String,
        new: String,
    },
    /// Put a volume back as it was at one of its snapshots (disconnect
    /// its NBD clients first: they cache the newer data).
    #[command(after_help = "Example: cairn volume rollback /mnt/pool vm1 before-upgrade")]
    Rollback {
        #[command(flatten)]
        t: VolTarget,
        name: String,
        snap: String,
    },
}

#[derive(Subcommand)]
pub enum NbdCmd {
    /// Serve an unmounted pool's volumes (VOL read-write, VOL@SNAP
    /// read-only) in the foreground until SIGINT or SIGTERM, then flush
    /// and close the pool. A mounted pool is served by its daemon instead
    /// (`cairn mount --nbd ADDR` or `--nbd-socket PATH`).
    #[command(
        after_help = "Example: cairn nbd serve /srv/pool --socket /run/cairn-nbd.sock\n         nbdinfo --list 'nbd+unix:///?socket=/run/cairn-nbd.sock'"
    )]
    Serve(NbdServeArgs),
    /// Write a new TLS directory for NBD over TCP: a CA, a server
    /// certificate and key, a client certificate and key (all 0600, the
    /// directory 0700; nothing is overwritten). Serve with `--nbd-tls DIR`
    /// (or `nbd serve --tls DIR`); give clients the directory (or a copy
    /// of ca-cert.pem, client-cert.pem and client-key.pem).
    #[command(
        name = "tls-init",
        after_help = "Example: cairn nbd tls-init /etc/cairn/nbd-tls
         cairn mount /srv/pool /mnt --nbd 127.0.0.1:10809 --nbd-tls /etc/cairn/nbd-tls
         nbdinfo 'nbds://127.0.0.1:10809/VOL?tls-certificates=/etc/cairn/nbd-tls'"
    )]
    TlsInit(NbdTlsInitArgs),
}

#[derive(Args)]
pub struct NbdTlsInitArgs {
    /// The directory to write (created 0700).
    pub dir: PathBuf,
    /// A host name or IP address clients connect to, besides localhost,
    /// 127.0.0.1 and ::1 (repeat for several).
    #[arg(long = "name", value_name = "NAME")]
    pub names: Vec<String>,
}

#[derive(Args)]
pub struct NbdServeArgs {
    /// The pool directory (not mounted).
    pub target: PathBuf,
    /// TCP address, e.g. 127.0.0.1:10809 (default: the pool's nbd_listen).
    #[arg(long)]
    pub listen: Option<String>,
    /// Unix socket path (default: the pool's nbd_socket).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Allow a TCP address that is not loopback.
    #[arg(long)]
    pub allow_remote: bool,
    /// Require TLS of TCP clients, with the certificates in DIR (made by
    /// `cairn nbd tls-init DIR`).
    #[arg(long, value_name = "DIR")]
    pub tls: Option<PathBuf>,
    /// Serve TCP without TLS: any local user can read and write the volumes.
    #[arg(long)]
    pub insecure: bool,
    /// Bytes of payloads in flight across all connections (default 256M).
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub budget: Option<u64>,
    /// A WRITE's payload must arrive, and a reply be taken, within SECS
    /// (default 30).
    #[arg(long, value_name = "SECS")]
    pub io_timeout: Option<u64>,
    /// Worker threads kept when idle.
    #[arg(long, value_name = "N")]
    pub workers_min: Option<usize>,
    /// Worker threads at most.
    #[arg(long, value_name = "N")]
    pub workers_max: Option<usize>,
}

impl NbdServeArgs {
    pub fn nbd_args(&self) -> NbdArgs {
        NbdArgs {
            listen: self.listen.clone(),
            socket: self.socket.clone(),
            allow_remote: self.allow_remote,
            tls: self.tls.clone(),
            insecure: self.insecure,
            budget: self.budget,
            io_timeout: self.io_timeout,
            workers_min: self.workers_min,
            workers_max: self.workers_max,
        }
    }
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "n is one of 4096, 16384, 65536 (matched)"
)]
fn block_size_arg(s: &str) -> Result<u32, String> {
    let n = size_arg(s)?;
    match n {
        4096 | 16384 | 65536 => Ok(n as u32),
        _ => Err(format!("block size {s} is not one of 4K, 16K, 64K")),
    }
}

fn print_json(v: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub fn run(c: VolumeCmd) -> Result<()> {
    match c {
        VolumeCmd::Create {
            t,
            name,
            size,
            block_size,
        } => {
            let req = Request::VolumeCreate {
                name,
                size,
                block_size,
            };
            one(&t, "created", req)
        }
        VolumeCmd::List { t } => list(&t),
        VolumeCmd::Resize {
            t,
            name,
            size,
            shrink,
        } => {
            let req = Request::VolumeResize { name, size, shrink };
            one(&t, "resized", req)
        }
        VolumeCmd::Delete {
            t,
            name,
            with_snapshots,
        } => {
            let req = Request::VolumeDelete {
                name,
                with_snapshots,
            };
            let (r, v): (Deleted, _) = call_with_json(&t.target, req)?;
            done(&t, v, &format!("deleted volume {}", r.deleted))
        }
        VolumeCmd::Snapshot {
            t,
            name,
            snap,
            no_wait,
        } => snapshot(&t, name, snap, !no_wait),
        VolumeCmd::Clone { t, source, new } => {
            let Some((name, snap)) = source.split_once('@') else {
                bail!("give the snapshot to clone as NAME@SNAP (got {source:?})");
            };
            let req = Request::VolumeClone {
                name: name.into(),
                snap: snap.into(),
                new,
            };
            one(&t, "cloned", req)
        }
        VolumeCmd::Rollback { t, name, snap } => {
            let req = Request::VolumeRollback { name, snap };
            one(&t, "rolled back", req)
        }
    }
}

fn snapshot(t: &VolTarget, name: String, snap: String, wait: bool) -> Result<()> {
    let req = Request::VolumeSnapshot { name, snap, wait };
    let (r, v): (VolumeSnapshotReply, _) = call_with_json(&t.target, req)?;
    let line = format!(
        "created snapshot {} at tid 0x{:016x} (export {})",
        r.snapshot, r.tid, r.export,
    );
    done(t, v, &line)
}

fn done(t: &VolTarget, v: Value, line: &str) -> Result<()> {
    if t.json {
        return print_json(&v);
    }
    println!("{line}");
    Ok(())
}

/// One volume's line after a change, and a warning when the volume is
/// larger than the pool (volumes are thin: writes fail once it is full).
fn one(t: &VolTarget, what: &str, req: Request) -> Result<()> {
    let (r, v): (VolumeChange, _) = call_with_json(&t.target, req)?;
    let vol = &r.volume;
    if let Some(cap) = r.pool_capacity.filter(|c| vol.size > *c) {
        eprintln!(
            "cairn: warning: volume {} ({}) is larger than the pool's capacity ({}, {} free): volumes are thin-provisioned, so its writes fail with ENOSPC once the pool is full; add a device (`cairn device add`) before it fills",
            vol.name,
            human(vol.size),
            human(cap),
            human(r.pool_available.unwrap_or(0))
        );
    }
    let line = format!(
        "{what} volume {}: {} ({} bytes), block size {}",
        vol.name,
        human(vol.size),
        vol.size,
        vol.block_size
    );
    done(t, v, &line)
}

fn list(t: &VolTarget) -> Result<()> {
    let (vols, v): (Vec<VolumeInfo>, _) = call_with_json(&t.target, Request::VolumeList)?;
    if t.json {
        return print_json(&v);
    }
    print_volume_table(&vols);
    Ok(())
}

/// The table of `volume list` and `info`: a line per volume, one more
/// per snapshot.
pub fn print_volume_table(vols: &[VolumeInfo]) {
    if vols.is_empty() {
        println!("no volumes");
        return;
    }
    println!(
        "{:<24} {:>12} {:>6} {:>12}  SNAPSHOTS",
        "NAME", "SIZE", "BLOCK", "STORED"
    );
    for x in vols {
        println!(
            "{:<24} {:>12} {:>6} {:>12}  {}",
            x.name,
            human(x.size),
            format!("{}K", x.block_size >> 10),
            human(x.stored_bytes),
            x.snapshots.len()
        );
        for s in &x.snapshots {
            println!(
                "  @{:<21} {:>12}  tid 0x{:016x} {} UTC",
                s.name,
                human(s.size),
                s.tid,
                format_utc(s.time_ns)
            );
        }
    }
}

/// `cairn nbd serve`.
pub fn nbd(c: NbdCmd) -> Result<()> {
    match c {
        NbdCmd::Serve(a) => crate::nbd::serve_unmounted(&a).context("nbd serve"),
        NbdCmd::TlsInit(a) => crate::nbd::tls_init(&a).context("nbd tls-init"),
    }
}
