//! `cairn share smb|nfs TARGET`: the configuration that serves a mounted
//! pool to other machines, printed for the admin to review and install: a
//! Samba share whose automatic snapshots Windows shows as Previous
//! Versions (`shadow_copy2` over `/.snapshots`), and NFS exports for the
//! kernel's server and for nfs-ganesha (FUSE export support keeps their
//! file handles valid across cache drops and remounts: docs/sharing.md).

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum ShareCmd {
    /// Print an smb.conf share section for a mounted pool, with its
    /// automatic snapshots (`cairn snapshot auto`) as Previous Versions.
    #[command(
        after_help = "Example:\n  cairn share smb /mnt/pool >> /etc/samba/smb.conf && smbcontrol smbd reload-config"
    )]
    Smb {
        /// The pool's mount point, or its pool directory (mounted).
        target: PathBuf,
        /// The share's name (default: the mount point's last component).
        #[arg(long)]
        name: Option<String>,
    },
    /// Print NFS exports of a mounted pool: an /etc/exports line for the
    /// kernel's server and an EXPORT block for nfs-ganesha (FSAL VFS).
    #[command(
        after_help = "Example:\n  cairn share nfs /mnt/pool --clients 192.0.2.0/24\n  cairn share nfs /mnt/pool --ganesha-only >> /etc/ganesha/ganesha.conf"
    )]
    Nfs {
        /// The pool's mount point, or its pool directory (mounted).
        target: PathBuf,
        /// Who may mount the export (a host, a network such as
        /// 192.0.2.0/24, or * for anyone); only this host by default.
        #[arg(long, default_value = "127.0.0.1")]
        clients: String,
        /// The export's NFSv4 pseudo path for nfs-ganesha (default:
        /// /NAME, NAME the mount point's last component).
        #[arg(long)]
        pseudo: Option<String>,
        /// Print only the nfs-ganesha EXPORT block.
        #[arg(long)]
        ganesha_only: bool,
    },
}

pub fn run(c: ShareCmd) -> Result<()> {
    match c {
        ShareCmd::Smb { target, name } => {
            let (mnt, _) = mounted(&target)?;
            let name = name.unwrap_or_else(|| default_name(&mnt));
            print!("{}", smb_section(&mnt, &name)?);
        }
        ShareCmd::Nfs {
            target,
            clients,
            pseudo,
            ganesha_only,
        } => {
            let (mnt, pool) = mounted(&target)?;
            let pseudo = pseudo.unwrap_or_else(|| format!("/{}", default_name(&mnt)));
            let fsid = fsid_of(&pool);
            if !ganesha_only {
                print!("{}", exports_line(&mnt, &clients, fsid)?);
            }
            print!("{}", ganesha_export(&mnt, &clients, &pseudo, fsid)?);
        }
    }
    Ok(())
}

/// (mount point, pool directory) of the Cairn mount `target` names: a
/// mount point (or a path in the mount) or a mounted pool's directory.
fn mounted(target: &Path) -> Result<(PathBuf, PathBuf)> {
    let t = (target.canonicalize()).with_context(|| format!("{}", target.display()))?;
    let mounts = crate::daemon::cairn_mounts()?;
    let found = mounts
        .into_iter()
        .find(|(m, src)| *m == t || Path::new(src).canonicalize().is_ok_and(|p| p == t));
    match found {
        Some((m, src)) => Ok((m, PathBuf::from(src))),
        None => bail!(
            "{} is not a mounted Cairn pool nor its mount point; mount it first (`cairn mount POOL MOUNTPOINT`)",
            target.display()
        ),
    }
}

fn default_name(mnt: &Path) -> String {
    (mnt.file_name()).map_or_else(|| "cairn".into(), |n| n.to_string_lossy().into_owned())
}

/// The path as one configuration value: refused when it holds a character
/// the formats cannot carry (a newline, a quote).
fn config_path(mnt: &Path) -> Result<String> {
    let s = (mnt.to_str()).with_context(|| format!("{} is not UTF-8", mnt.display()))?;
    if s.contains(['\n', '"', '\\']) {
        bail!("{s:?} holds a newline, a quote or a backslash: give the mount a plainer path");
    }
    Ok(s.to_string())
}

/// Said with every configuration: a server outlives the daemon's restarts
/// only over a kept mount (docs/sharing.md).
const KEEP: &str = "# (mount the pool with --keep-mount: `cairn restart` then keeps the export up)";

/// The Samba share: `shadow_copy2` finds the snapshots under
/// `/.snapshots` by the names `cairn snapshot auto` gives them (UTC);
/// `glusterfs_fuse` (last, as its manual asks) has the daemon answer
/// Samba's case-insensitive name checks instead of a directory listing
/// per new file (crates/fuse/src/nocase.rs).
fn smb_section(mnt: &Path, name: &str) -> Result<String> {
    let path = config_path(mnt)?;
    if name.contains([']', '\n']) || name.is_empty() {
        bail!("{name:?} cannot name an SMB share");
    }
    Ok(format!(
        "# Cairn pool mounted on {path}: `cairn snapshot auto` snapshots are\n\
         # shown as Previous Versions (shadow_copy2 over {path}/.snapshots);\n\
         # glusterfs_fuse lets Cairn answer Samba's case-insensitive lookups.\n\
         {KEEP}\n\
         [{name}]\n\
         \x20   path = {path}\n\
         \x20   read only = no\n\
         \x20   vfs objects = shadow_copy2 glusterfs_fuse\n\
         \x20   shadow:snapdir = .snapshots\n\
         \x20   shadow:format = auto-%Y%m%d-%H%M%S\n\
         \x20   shadow:localtime = no\n\
         \x20   shadow:sort = desc\n"
    ))
}

/// An /etc/exports line: FUSE has no device number of its own to build
/// file handles on, so the kernel's server needs `fsid=`.
fn exports_line(mnt: &Path, clients: &str, fsid: u32) -> Result<String> {
    let path = config_path(mnt)?.replace(' ', "\\040");
    Ok(format!(
        "# /etc/exports (kernel nfsd), then `exportfs -ra`:\n\
         {KEEP}\n\
         {path} {clients}(rw,sync,no_subtree_check,fsid={fsid})\n"
    ))
}

fn ganesha_export(mnt: &Path, clients: &str, pseudo: &str, fsid: u32) -> Result<String> {
    let path = config_path(mnt)?;
    if !pseudo.starts_with('/') || pseudo.contains(['"', '\n']) {
        bail!("{pseudo:?}: a pseudo path starts with / and holds no quote or newline");
    }
    Ok(format!(
        "# nfs-ganesha (/etc/ganesha/ganesha.conf), NFSv4:\n\
         {KEEP}\n\
         EXPORT {{\n\
         \x20   Export_Id = {id};\n\
         \x20   Path = \"{path}\";\n\
         \x20   Pseudo = \"{pseudo}\";\n\
         \x20   Protocols = 4;\n\
         \x20   Access_Type = RW;\n\
         \x20   Squash = Root_Squash;\n\
         \x20   SecType = sys;\n\
         \x20   Filesystem_Id = {fsid}.0;\n\
         \x20   CLIENT {{ Clients = {clients}; Access_Type = RW; }}\n\
         \x20   FSAL {{ Name = VFS; }}\n\
         }}\n",
        id = fsid % 65_000 + 1,
    ))
}

/// A number for the export that stays the same while the pool stays where
/// it is (the first 31 bits of the BLAKE3 hash of its directory's path).
fn fsid_of(pool: &Path) -> u32 {
    let path = pool.canonicalize().unwrap_or_else(|_| pool.to_path_buf());
    let h = blake3::hash(path.as_os_str().as_encoded_bytes());
    let b = h.as_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smb_section_shows_auto_snapshots_as_previous_versions() {
        let s = smb_section(Path::new("/mnt/pool"), "pool").unwrap();
        assert!(s.contains("[pool]\n    path = /mnt/pool\n"), "{s}");
        assert!(s.contains("shadow:format = auto-%Y%m%d-%H%M%S"), "{s}");
        assert!(s.contains("shadow:localtime = no"), "{s}");
        // glusterfs_fuse last: its manual asks for it.
        assert!(
            s.contains("vfs objects = shadow_copy2 glusterfs_fuse\n"),
            "{s}"
        );
        assert!(smb_section(Path::new("/mnt/pool"), "a]b").is_err());
        assert!(smb_section(Path::new("/mnt/po\"ol"), "p").is_err());
    }

    #[test]
    fn nfs_exports_carry_an_fsid_and_escape_spaces() {
        let s = exports_line(Path::new("/mnt/my pool"), "10.0.0.0/8", 42).unwrap();
        assert!(s.ends_with("/mnt/my\\040pool 10.0.0.0/8(rw,sync,no_subtree_check,fsid=42)\n"));
        let g = ganesha_export(Path::new("/mnt/p"), "127.0.0.1", "/p", 42).unwrap();
        assert!(
            g.contains("Path = \"/mnt/p\";") && g.contains("Pseudo = \"/p\";"),
            "{g}"
        );
        assert!(g.contains("Filesystem_Id = 42.0;"), "{g}");
        assert!(ganesha_export(Path::new("/mnt/p"), "*", "p", 1).is_err());
        assert_eq!(
            fsid_of(Path::new("/nonexistent/a")),
            fsid_of(Path::new("/nonexistent/a"))
        );
        assert_ne!(
            fsid_of(Path::new("/nonexistent/a")),
            fsid_of(Path::new("/nonexistent/b"))
        );
    }
}
