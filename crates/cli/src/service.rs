//! `cairn service mount|snapshot NAME`: what the systemd units run. A pool
//! service is described by /etc/cairn/NAME.toml (the directory can be
//! changed with CAIRN_SERVICE_DIR, for tests):
//!
//!     pool = "/srv/pool"
//!     mountpoint = "/mnt/pool"
//!     options = ["--metrics", "127.0.0.1:9469"]   # extra `cairn mount` flags
//!
//! `mount` runs the daemon in the foreground (systemd supervises it; SIGTERM
//! unmounts cleanly); `restart` starts a new daemon under a mount made with
//! `--keep-mount` (`systemctl reload`); `snapshot` takes an automatic snapshot and prunes on
//! the pool's policy (cairn.toml's keep_* keys).

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(clap::Subcommand)]
pub enum ServiceCmd {
    /// Mount the pool of /etc/cairn/NAME.toml in the foreground (cairn@NAME.service).
    Mount { name: String },
    /// Take an automatic snapshot of it, then prune (cairn-snapshot@NAME.service).
    Snapshot { name: String },
    /// Start a new daemon under its mount (`systemctl reload cairn@NAME`;
    /// its options must hold --keep-mount).
    Restart { name: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceFile {
    pool: PathBuf,
    mountpoint: PathBuf,
    #[serde(default)]
    options: Vec<String>,
}

fn load(name: &str) -> Result<ServiceFile> {
    if name.is_empty() || name.contains('/') {
        bail!("service name {name:?}: must be a file name under /etc/cairn");
    }
    let dir = std::env::var_os("CAIRN_SERVICE_DIR").unwrap_or_else(|| "/etc/cairn".into());
    let path = Path::new(&dir).join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("{}", path.display()))
}

pub fn run(c: ServiceCmd) -> Result<()> {
    let me = std::env::current_exe()?;
    match c {
        ServiceCmd::Mount { name } => {
            let s = load(&name)?;
            std::fs::create_dir_all(&s.mountpoint)?;
            let err = Command::new(me)
                .arg("mount")
                .arg(&s.pool)
                .arg(&s.mountpoint)
                .arg("--foreground")
                .args(&s.options)
                .exec();
            Err(err).context("starting the mount daemon")
        }
        ServiceCmd::Restart { name } => crate::keeper::restart(&load(&name)?.mountpoint),
        ServiceCmd::Snapshot { name } => {
            let s = load(&name)?;
            for args in [["snapshot", "auto"].as_slice(), ["prune"].as_slice()] {
                let st = Command::new(&me).args(args).arg(&s.mountpoint).status()?;
                if !st.success() {
                    bail!("cairn {} {}: {st}", args.join(" "), s.mountpoint.display());
                }
            }
            Ok(())
        }
    }
}
