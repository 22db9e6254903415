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
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Create a pool in a directory.
    Mkfs(MkfsArgs),
    /// Mount a pool (in the background unless --foreground).
    Mount(MountArgs),
    /// Flush and unmount a mounted pool.
    Umount(UmountArgs),
    /// Verify every element, reference and chunk of an unmounted pool.
    Check(PoolArg),
    /// Show devices, usage and counters of an unmounted pool.
    Info(InfoArgs),
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

#[derive(Args)]
pub struct MkfsArgs {
    /// Pool directory (created if missing).
    pub pool: PathBuf,
    /// A device as CLASS:PATH[:SIZE], CLASS one of nvme, ssd, hdd. PATH is a
    /// file, a directory (a device file is made in it) or a block device.
    /// Repeat for several devices. Default: one file inside the pool.
    #[arg(long = "device", value_name = "CLASS:PATH[:SIZE]")]
    pub devices: Vec<String>,
    /// Block size that files are cut into (power of two, 4K..1M).
    #[arg(long, value_parser = size_arg, default_value = "64K")]
    pub record_size: u64,
    /// Size of a segment, the unit of placement on devices.
    #[arg(long, value_parser = size_arg, default_value = "4M")]
    pub segment_size: u64,
    /// Overwrite an existing pool.
    #[arg(long)]
    pub force: bool,
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
    /// FUSE worker threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
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
    pub pool: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}
