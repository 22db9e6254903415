//! Command-line arguments (clap derive).

use anyhow::Result;
use cairn_devices::{parse_size, DeviceSpec};
use cairn_fs::MkfsOptions;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: a versioned, deduplicating, self-tiering storage pool"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
    /// An encrypted pool's key file (mode 0600: a passphrase line, or
    /// exactly 32 raw bytes), for any command that opens the pool; with
    /// `mkfs --encrypt`, the new pool's. Without it the passphrase is
    /// asked at the terminal (or read from the systemd credential
    /// `cairn-key`).
    #[arg(long, global = true, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Create a pool in a directory.
    Mkfs(MkfsArgs),
    /// An encrypted pool's key.
    #[command(subcommand)]
    Key(KeyCmd),
    /// Mount a pool (in the background unless --foreground).
    Mount(MountArgs),
    /// Flush and unmount a mounted pool.
    Umount(UmountArgs),
    /// Start a new daemon under a mount made with --keep-mount, without
    /// unmounting: requests wait meanwhile, open files and NFS handles
    /// stay valid (an upgrade runs the binary now at the same path).
    Restart(UmountArgs),
    /// Verify every element, reference and chunk of an unmounted pool.
    Check(PoolArg),
    /// A pool whose metadata store is damaged: say what a rebuild keeps
    /// and loses, or (--rebuild) write a new store from what is readable.
    #[command(
        after_help = "Example:\n  cairn salvage /srv/pool             # what a rebuild would keep and lose\n  cairn salvage /srv/pool --rebuild   # the damaged store is kept aside"
    )]
    Salvage(SalvageArgs),
    /// Show devices, usage and counters of a pool (mounted or not).
    Info(InfoArgs),
    /// Commit buffered writes now and print the committed TID.
    Sync(TargetArgs),
    /// Create, list, delete and verify snapshots (named, retained TIDs).
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// List the stored versions of a path (one per commit that changed it),
    /// across saves that replace the file (rename over it, delete and
    /// create again).
    History(HistoryArgs),
    /// Bring back an old version of a file as a new version.
    Undo(UndoArgs),
    /// Apply the retention policy: remove history no retained TID sees.
    Prune(PruneArgs),
    /// Rewrite sparse segments and scattered files (online defragmentation).
    Reblock(ReblockArgs),
    /// Reclaim the space of unreferenced chunks now by compacting segments.
    Gc(GcArgs),
    /// Read every chunk, check checksums and hashes, name damaged files.
    /// Exit 3 if anything is damaged.
    Scrub(TargetArgs),
    /// Add or remove devices (online when mounted).
    #[command(subcommand)]
    Device(DeviceCmd),
    /// Tiering: per-device fill and heat, and running the mover.
    #[command(subcommand)]
    Tier(TierCmd),
    /// Redundancy: copies of data on other devices, and rebuilding them.
    #[command(subcommand)]
    Redundancy(RedundancyCmd),
    /// Mirror streams: incremental copies of a pool with its history.
    #[command(subcommand)]
    Mirror(MirrorCmd),
    /// Block volumes: create, list, resize, delete, snapshot, clone,
    /// roll back (served over NBD by `mount --nbd...` or `nbd serve`).
    #[command(subcommand)]
    Volume(crate::volume::VolumeCmd),
    /// Serve an unmounted pool's volumes over NBD (no FUSE mount).
    #[command(subcommand)]
    Nbd(crate::volume::NbdCmd),
    /// What the systemd units run: mount or snapshot the pool of
    /// /etc/cairn/NAME.toml.
    #[command(subcommand)]
    Service(crate::service::ServiceCmd),
    /// Print the Samba or NFS configuration that shares a mounted pool
    /// with other machines (snapshots as Windows Previous Versions).
    #[command(subcommand)]
    Share(crate::share::ShareCmd),
    /// Print a shell completion script for bash, zsh or fish.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages (cairn.1 and one per subcommand) into a directory.
    Man {
        /// Where to write the pages (created if missing).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
pub enum MirrorCmd {
    /// Write a stream of everything committed after a TID (default: all)
    /// to FILE or stdout.
    Read {
        #[command(flatten)]
        t: TargetArgs,
        /// Only the changes after this TID (0x<hex> or decimal).
        #[arg(long, value_parser = tid_arg, default_value = "0")]
        since: u64,
        /// Write the stream here instead of stdout.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// Apply a stream (FILE or stdin) to a mirror pool; the whole stream is
    /// checked before anything is applied. Streams given one after another
    /// (`cat a.stream b.stream`) are applied in order; bytes after the
    /// last that are not a stream are refused.
    Write {
        #[command(flatten)]
        t: TargetArgs,
        /// Read the stream from here instead of stdin.
        #[arg(short = 'i', long)]
        input: Option<PathBuf>,
        /// Take a stream into a promoted mirror (its own changes are lost).
        #[arg(long)]
        force: bool,
    },
    /// Bring a mirror up to date with its source (read + write).
    Copy {
        /// The source pool (directory or mount point).
        src: PathBuf,
        /// The mirror pool: a directory or mount point here,
        /// ssh:[user@]host:POOL (runs `cairn mirror write` there), or a
        /// bucket: s3:BUCKET[/PREFIX]:endpoint=URL[:region=R] (streams and
        /// chunks as objects; `mirror restore` makes a pool from it).
        dst: PathBuf,
        /// When the source pruned past the mirror's TID: roll the mirror
        /// back to the newest snapshot both hold and copy from there (a
        /// bucket starts a new chain with a full stream).
        #[arg(long)]
        resync: bool,
        /// Chunk data per batch, in MiB: each batch is one transaction on
        /// the mirror, where an interrupted copy resumes.
        #[arg(long, default_value = "64", value_parser = clap::value_parser!(u64).range(1..=4096))]
        batch_mib: u64,
        /// For a bucket: a 0600 file with the store's credentials
        /// (default: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
        #[arg(long)]
        credentials_file: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Make (or bring up to date) a mirror pool from a mirror kept in a
    /// bucket by `mirror copy SRC s3:...`: apply its chain of streams,
    /// fetching only the chunks the pool lacks.
    Restore {
        /// s3:BUCKET[/PREFIX]:endpoint=URL[:region=R]
        bucket: String,
        /// A mirror pool (`cairn mkfs POOL --mirror`), empty or restored
        /// from this bucket before.
        pool: PathBuf,
        /// A 0600 file with the store's credentials (default: the
        /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY variables).
        #[arg(long)]
        credentials_file: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Keep a mirror following its source: copy each new commit as it
    /// comes, retrying after errors (a source or mirror gone for a while),
    /// with a line per step showing the mirror's lag. Stops on a signal.
    Stream {
        /// The source pool (directory or mount point).
        src: PathBuf,
        /// The mirror, as for `copy`.
        dst: PathBuf,
        /// Seconds between looks at the source's TID.
        #[arg(long, default_value = "0.5")]
        interval: f64,
    },
    /// A pool's mirror role, TID, and for a mirror its source.
    Status(TargetArgs),
    /// Make a mirror a normal writable pool (failover).
    Promote(TargetArgs),
    /// (for copies over ssh) Read content hashes on stdin, print those the
    /// pool lacks.
    #[command(hide = true)]
    Lacking(TargetArgs),
    /// Take a mirror back to one of its snapshots, undoing every change
    /// after it (before a resync from that snapshot: `mirror read --since`
    /// its TID on the source).
    Rollback {
        #[command(flatten)]
        t: TargetArgs,
        /// The snapshot (it and the source must both hold it).
        snapshot: String,
    },
    /// Stop keeping a source's history for a mirror given up.
    Release {
        #[command(flatten)]
        t: TargetArgs,
        /// The mirror pool's uuid (as `cairn mirror status` lists it).
        mirror: String,
    },
}

#[derive(Subcommand)]
pub enum TierCmd {
    /// Per device: class, role, fill, and a histogram of segment heat.
    Status {
        #[command(flatten)]
        t: TargetArgs,
    },
    /// Run a pass of the tier mover: promote hot segments, demote cold
    /// ones (the daemon also does this every tier_interval_secs).
    Migrate {
        #[command(flatten)]
        t: TargetArgs,
        /// Run the pass now (required; passes otherwise run on the
        /// daemon's interval).
        #[arg(long, required = true)]
        now: bool,
    },
}

#[derive(Subcommand)]
pub enum DeviceCmd {
    /// Add a device: CLASS:PATH[:SIZE][:role=tier|cache][:latency=DUR][:bw=SIZE]
    /// (latency and bw emulate a slow device, for tests and benchmarks), or
    /// an object-store tier: s3:BUCKET[/PREFIX]:endpoint=URL[:region=R][:size=SIZE]
    /// (credentials from the environment or s3_credentials_file in cairn.toml).
    Add {
        #[command(flatten)]
        t: TargetArgs,
        #[arg(value_parser = parse_device)]
        spec: DeviceSpec,
        /// Leave the device file sparse instead of allocating its blocks.
        #[arg(long)]
        sparse: bool,
    },
    /// Move everything off a device (progress bar), then remove it.
    Remove {
        #[command(flatten)]
        t: TargetArgs,
        /// The device's path (as added) or id.
        device: PathBuf,
    },
    /// Replace a device (online, missing or failing) by a new one: the new
    /// one joins, every copy on the old one is made again on it (from the
    /// old one or the other copies, progress bar), the old one leaves.
    Replace {
        #[command(flatten)]
        t: TargetArgs,
        /// The old device's path (as added) or id.
        old: PathBuf,
        /// The new device, as for `device add`.
        #[arg(value_parser = parse_device)]
        new: DeviceSpec,
    },
}

/// `cairn redundancy`: how many copies (or what parity) data has.
#[derive(Subcommand)]
pub enum RedundancyCmd {
    /// Set the pool's policy (online; TARGET a pool directory or a mount
    /// point): copies=N, ec=K+M (stripes of K segments with M parity
    /// segments), or per device class, e.g. ssd:copies=2,hdd:ec=4+2.
    /// Existing data follows in the background (`redundancy rebuild`
    /// waits for it). With TARGET a file or directory in a mount: its own
    /// policy (copies=N or ec=K+M, over the tier's; `inherit` to drop it),
    /// set on everything under it and inherited by what is made there;
    /// the data it holds is moved to it at once.
    Set {
        #[command(flatten)]
        t: TargetArgs,
        policy: String,
    },
    /// The policy, each device's state and the data short of copies or
    /// lost; for a file or directory in a mount, its own policy.
    Show {
        #[command(flatten)]
        t: TargetArgs,
    },
    /// Make every copy the policy asks for now (progress bar): after a
    /// device was lost or the policy raised.
    Rebuild {
        #[command(flatten)]
        t: TargetArgs,
    },
}

#[derive(Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub t: TargetArgs,
    /// Compact segments whose live data is below this percentage.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_live: u32,
}

#[derive(Subcommand)]
pub enum KeyCmd {
    /// Wrap the pool's data key with a new passphrase or key file (the
    /// current one, from --key-file or typed, must unlock it); no data is
    /// rewritten, and a mounted pool stays mounted.
    Change {
        /// A pool directory, or a mount point.
        target: PathBuf,
        /// The new key file (mode 0600); without it the new passphrase is
        /// typed twice.
        #[arg(long, value_name = "FILE")]
        new_key_file: Option<PathBuf>,
    },
}

#[derive(Args)]
pub struct TargetArgs {
    /// A pool directory, or a mount point (or any path in a mount).
    pub target: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Snapshot the pool's current state under NAME (O(1)).
    Create {
        #[command(flatten)]
        t: TargetArgs,
        name: String,
        /// Return once the snapshot is cut (every write acknowledged before
        /// is in it, none after), without waiting for the commit that
        /// records it; a crash before that commit (started at once) loses
        /// the snapshot with the writes it holds that were never synced.
        #[arg(long)]
        no_wait: bool,
    },
    /// Make an automatic snapshot named auto-YYYYMMDD-HHMMSS (UTC), kept by
    /// the daily/weekly/monthly policy (for cron or a systemd timer).
    Auto {
        #[command(flatten)]
        t: TargetArgs,
    },
    /// List snapshots with the space deleting each would free.
    List {
        #[command(flatten)]
        t: TargetArgs,
    },
    /// Delete a snapshot; its space comes back at the next prune.
    Delete {
        #[command(flatten)]
        t: TargetArgs,
        name: String,
    },
    /// Recompute a snapshot's content hash (reading all its data) and
    /// compare it with the one recorded at creation. Exit 3 on mismatch.
    Verify {
        #[command(flatten)]
        t: TargetArgs,
        name: String,
    },
}

#[derive(Args)]
pub struct HistoryArgs {
    /// A file or directory inside a mounted pool (it may be gone: a
    /// deleted path's versions are listed while history keeps them).
    pub path: PathBuf,
    #[arg(long)]
    pub json: bool,
    /// The versions of the inode PATH names, not of the path: a save by
    /// rename over PATH (`sed -i`, most editors) makes a new inode, whose
    /// history starts at that save.
    #[arg(long, conflicts_with_all = ["off", "on"])]
    pub inode: bool,
    /// Stop keeping fine-grained history of PATH (HAMMER's nohistory:
    /// snapshots still work; nodes created in a directory inherit it). The
    /// same as `setfattr -n user.cairn.nohistory -v 1 PATH`.
    #[arg(long, conflicts_with = "on")]
    pub off: bool,
    /// Keep fine-grained history of PATH again (removes the attribute).
    #[arg(long)]
    pub on: bool,
}

fn tid_arg(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("invalid TID {s:?} (use 0x<hex> or decimal)"))
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("from").required(true).args(["tid", "snapshot"])))]
pub struct UndoArgs {
    /// A file inside a mounted pool.
    pub path: PathBuf,
    /// The version as of this TID (0x<hex> or decimal).
    #[arg(long, value_parser = tid_arg)]
    pub tid: Option<u64>,
    /// The version in this snapshot.
    #[arg(long)]
    pub snapshot: Option<String>,
    /// Write the old version here instead of over PATH.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// "90", "30s", "15m", "1h", "7d", "2w" as seconds.
pub fn duration_arg(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 'h')) => (&s[..i], 3600),
        Some((i, 'd')) => (&s[..i], 86_400),
        Some((i, 'w')) => (&s[..i], 604_800),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("invalid duration {s:?} (e.g. 0, 30s, 15m, 1h, 7d, 2w)"))
}

#[derive(Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub t: TargetArgs,
    /// Report what would be removed; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Keep all fine-grained history this long (default: pool config).
    #[arg(long, value_parser = duration_arg, value_name = "DURATION")]
    pub keep_history: Option<u64>,
    /// Automatic snapshots kept: newest of each of the last N days.
    #[arg(long)]
    pub keep_daily: Option<u32>,
    /// ... of the last N ISO weeks.
    #[arg(long)]
    pub keep_weekly: Option<u32>,
    /// ... of the last N months.
    #[arg(long)]
    pub keep_monthly: Option<u32>,
}

#[derive(Args)]
pub struct ReblockArgs {
    #[command(flatten)]
    pub t: TargetArgs,
    /// Rewrite segments whose live data is below this percentage.
    #[arg(long, default_value_t = 75, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_live: u32,
    /// Only compact segments; leave scattered files alone.
    #[arg(long)]
    pub no_files: bool,
}

fn parse_device(s: &str) -> Result<DeviceSpec, String> {
    s.parse()
        .map_err(|e: cairn_devices::DeviceError| e.to_string())
}

pub(crate) fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

#[derive(Args)]
pub struct MkfsArgs {
    /// Pool directory (created if missing).
    pub pool: PathBuf,
    /// A device as CLASS:PATH[:SIZE][:role=tier|cache][:latency=DUR][:bw=SIZE],
    /// CLASS one of nvme, ssd, hdd. PATH is a file, a directory (a device
    /// file is made in it) or a block device. Repeat for several devices.
    /// Default: one file inside the pool.
    #[arg(long = "device", value_name = "CLASS:PATH[:SIZE][:OPT=VAL]")]
    pub devices: Vec<String>,
    /// Block size that files are cut into (power of two, 4K..1M).
    #[arg(long, value_parser = size_arg, default_value = "64K")]
    pub record_size: u64,
    /// Size of a segment, the unit of placement on devices.
    #[arg(long, value_parser = size_arg, default_value = "4M")]
    pub segment_size: u64,
    /// Overwrite an existing pool, or devices holding data or another
    /// pool's header (never a pool or device in use).
    #[arg(long)]
    pub force: bool,
    /// Leave device files sparse instead of allocating their blocks: the
    /// host filesystem may then fill under the pool (writes fail).
    #[arg(long)]
    pub sparse: bool,
    /// Compression of new chunks: none, lz4, zstd or zstd:LEVEL (stored in
    /// the pool config; change it there at any time).
    #[arg(long, value_parser = compression_arg)]
    pub compression: Option<String>,
    /// A directory on another disk for the second copy of the metadata
    /// (default: beside another tier device than the first, when there is
    /// one that is not a block device; else beside the first copy).
    #[arg(long, value_name = "DIR")]
    pub meta_mirror: Option<PathBuf>,
    /// Copies of the metadata to keep, 1 to 4: 2 by default, 1 when the
    /// pool directory is already redundant (RAID). Never fewer than the
    /// most redundant data survives losses plus one (copies=3 or ec=K+2:
    /// 3), each beside a device of another disk and failure domain while
    /// one is left; else beside the first copy, where it guards against
    /// damaged pages, not against losing the disk. Recorded in the pool.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub meta_copies: u32,
    /// Make a mirror pool: read-only, filled by `cairn mirror write|copy`.
    #[arg(long)]
    pub mirror: bool,
    /// How many copies new data gets, each on another device (another
    /// failure domain, `:domain=NAME` in a device spec): copies=N, or
    /// parity ec=K+M (any M devices may be lost; K+M failure domains
    /// needed), or per device class, e.g. ssd:copies=2,hdd:ec=4+2. Change
    /// it later with `cairn redundancy set`.
    #[arg(long, value_name = "POLICY", value_parser = policy_arg, default_value = "copies=1")]
    pub redundancy: cairn_data::Policy,
    /// Where fsync's intent log goes: `devices` (the default) keeps a copy
    /// in an area of each of the fastest devices, as many as the
    /// metadata's copies, on different failure domains (or on the devices
    /// whose spec says `:log=SIZE`); `pool-dir` keeps it in the pool
    /// directory's intent.log, one copy on the disk that holds it.
    #[arg(long, value_name = "WHERE", default_value = "devices")]
    pub intent_log: cairn_fs::pool::log_home::LogHome,
    /// Encrypt the pool (XAES-256-GCM contents, XChaCha20-Poly1305
    /// metadata): its random data key is
    /// wrapped by a passphrase (typed twice) or by --key-file FILE.
    #[arg(long)]
    pub encrypt: bool,
}

fn policy_arg(s: &str) -> Result<cairn_data::Policy, String> {
    s.parse()
        .map_err(|e: cairn_data::PolicyError| e.to_string())
}

fn compression_arg(s: &str) -> Result<String, String> {
    s.parse::<cairn_fs::Compression>().map(|c| c.to_string())
}

impl MkfsArgs {
    pub fn options(&self) -> Result<MkfsOptions> {
        let devices = self
            .devices
            .iter()
            .map(|s| s.parse::<DeviceSpec>())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MkfsOptions {
            devices,
            record_size: u32::try_from(self.record_size)?,
            segment_size: self.segment_size,
            force: self.force,
            sparse: self.sparse,
            meta_mirror: self.meta_mirror.clone(),
            meta_copies: self.meta_copies,
            mirror: self.mirror,
            redundancy: self.redundancy,
            intent_log: self.intent_log,
            encrypt: None,
        })
    }
}

#[derive(Args)]
pub struct MountArgs {
    /// Pool directory.
    pub pool: PathBuf,
    /// Where to mount it.
    pub mountpoint: PathBuf,
    /// Stay in the foreground (logs go to stderr).
    #[arg(long)]
    pub foreground: bool,
    /// Seconds between automatic commits (overrides the pool config).
    #[arg(long)]
    pub commit_interval: Option<f64>,
    /// Buffered data that triggers a flush, e.g. 512M (overrides the config).
    #[arg(long, value_parser = size_arg)]
    pub dirty_limit: Option<u64>,
    /// Compression of new chunks (overrides the config).
    #[arg(long, value_parser = compression_arg)]
    pub compression: Option<String>,
    /// FUSE worker threads reading /dev/fuse.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// FUSE over io_uring (per-CPU queues): auto uses it when the kernel
    /// offers it (fuse.enable_uring=Y) and /dev/fuse threads otherwise, on
    /// requires it, off uses /dev/fuse only. Neither changes the host's
    /// fuse.enable_uring; see --enable-uring-module.
    #[arg(long, default_value = "auto", value_parser = transport_arg)]
    pub io_uring: cairn_fuse::Transport,
    /// Turn on FUSE over io_uring in the kernel when it is off (write Y to
    /// /sys/module/fuse/parameters/enable_uring; needs root). This is a
    /// host-wide switch: it lets every FUSE daemon on the host use
    /// io_uring. Not with --io-uring off.
    #[arg(long)]
    pub enable_uring_module: bool,
    /// Scheduling of the io_uring ring threads: idle (default; as root,
    /// else normal) has them wait at SCHED_IDLE so callers stay on their
    /// CPU (several times the rate of small requests on a VM), and raises
    /// a thread its CPU starves: to SCHED_FIFO for at most 10 s at a time
    /// and 600 ms of CPU per second, and never above SCHED_OTHER in a
    /// cgroup with a CPU limit (cpu.max); normal keeps them ordinary
    /// SCHED_OTHER threads at the daemon's nice value, never real time;
    /// off leaves their scheduling as inherited.
    #[arg(long, value_name = "POLICY", default_value = "idle", value_parser = ring_priority_arg)]
    pub ring_priority: cairn_fuse::RingPriority,
    /// Mount a pool whose intent log is damaged in the middle (a record
    /// unreadable in both of its copies, valid ones after it): replay the
    /// records before the damage and drop the rest, losing their fsync'd
    /// changes. Without it such a mount is refused, naming what is lost.
    #[arg(long)]
    pub discard_damaged_log: bool,
    /// Mount a pool whose missing devices held the only copy of some data:
    /// read-only, files with lost data give I/O errors (`cairn check`
    /// names them), all others read exact. A pool whose copies cover the
    /// missing devices mounts read-write without it.
    #[arg(long)]
    pub degraded: bool,
    #[command(flatten)]
    pub nbd: NbdArgs,
    /// Serve Prometheus metrics (/metrics) and the read-only dashboard (/)
    /// on this TCP address, e.g. 127.0.0.1:9469 (overrides metrics_listen).
    #[arg(long = "metrics", value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Allow a metrics address that is not loopback (no authentication).
    #[arg(long = "metrics-allow-remote")]
    pub metrics_allow_remote: bool,
    /// Serve the dashboard's routes that give paths and snapshot names
    /// (/api/info, /api/tier, /api/snapshots; sets metrics_detail).
    #[arg(long = "metrics-detail")]
    pub metrics_detail: bool,
    /// Mount a pool whose metadata store fails its integrity check,
    /// read-only: files whose records read intact are served, the others
    /// give EIO; nothing is written to the pool.
    #[arg(long)]
    pub salvage: bool,
    /// A keeper process holds the mount's FUSE connection, so that `cairn
    /// restart` can start a new daemon under the mount without unmounting
    /// it (NFS and SMB servers exporting it stay up). Served from
    /// /dev/fuse, not io_uring. A daemon that dies still ends the mount.
    #[arg(long, conflicts_with = "salvage")]
    pub keep_mount: bool,
}

#[derive(Args)]
pub struct SalvageArgs {
    /// Pool directory (unmounted).
    pub pool: PathBuf,
    /// Write a new metadata store from what is readable; the damaged one
    /// is renamed aside (meta.redb.damaged-TIME), never deleted.
    #[arg(long)]
    pub rebuild: bool,
}

/// Where and how the daemon serves volumes over NBD (each overrides the
/// pool config's nbd_* key).
#[derive(Args, Clone, Default)]
pub struct NbdArgs {
    /// Serve the pool's volumes over NBD on this TCP address, e.g.
    /// 127.0.0.1:10809 (port 0: any free port; `cairn info` shows it).
    #[arg(long = "nbd", value_name = "ADDR")]
    pub listen: Option<String>,
    /// Serve the volumes over NBD on this Unix socket (created 0600).
    #[arg(long = "nbd-socket", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Allow a TCP address that is not loopback.
    #[arg(long = "nbd-allow-remote")]
    pub allow_remote: bool,
    /// Require TLS of TCP clients, with the certificates in DIR (made by
    /// `cairn nbd tls-init DIR`): a client needs DIR's client certificate.
    #[arg(long = "nbd-tls", value_name = "DIR")]
    pub tls: Option<PathBuf>,
    /// Serve NBD over TCP without TLS: any local user can then read and
    /// write every volume.
    #[arg(long = "nbd-insecure")]
    pub insecure: bool,
    /// Bytes of NBD payloads in flight across all connections (default
    /// 256M); a client that asks for more waits.
    #[arg(long = "nbd-budget", value_name = "SIZE", value_parser = size_arg)]
    pub budget: Option<u64>,
    /// A WRITE's payload must arrive, and a reply be taken, within SECS
    /// (default 30), else the connection is closed.
    #[arg(long = "nbd-io-timeout", value_name = "SECS")]
    pub io_timeout: Option<u64>,
    /// NBD worker threads kept when idle.
    #[arg(long = "nbd-workers-min", value_name = "N")]
    pub workers_min: Option<usize>,
    /// NBD worker threads at most (more start while requests wait).
    #[arg(long = "nbd-workers-max", value_name = "N")]
    pub workers_max: Option<usize>,
}

fn transport_arg(s: &str) -> Result<cairn_fuse::Transport, String> {
    s.parse()
}

fn ring_priority_arg(s: &str) -> Result<cairn_fuse::RingPriority, String> {
    s.parse()
}

impl MountArgs {
    /// How the mount reaches the kernel: the transport options above.
    pub fn transport(&self) -> cairn_fuse::TransportOptions {
        cairn_fuse::TransportOptions {
            io_uring: self.io_uring,
            enable_module: self.enable_uring_module,
            ring_priority: self.ring_priority,
        }
    }
}

#[derive(Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
}

#[derive(Args)]
pub struct PoolArg {
    pub pool: PathBuf,
}

#[derive(Args)]
pub struct InfoArgs {
    /// A pool directory or a mount point.
    pub pool: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}
