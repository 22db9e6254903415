//! Modes of a pool's files: the pool directory is 0700 and every file in it
//! 0600, so no other local user can read the pool's data or hold its lock.
//! Opening a pool tightens modes that were widened (and says so); devices
//! outside the pool directory (block devices, files given by path) are the
//! administrator's: Cairn only warns when other users can read them.

use cairn_devices::private::{readable_by_others, DIR_MODE, FILE_MODE};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A path whose mode lets users other than the owner in.
#[derive(Debug, Clone)]
pub struct Widened {
    pub path: PathBuf,
    pub mode: u32,
    pub want: u32,
}

impl std::fmt::Display for Widened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} has mode {:04o} (should be {:04o}: other users can open it)",
            self.path.display(),
            self.mode,
            self.want
        )
    }
}

fn mode_of(p: &Path) -> Option<u32> {
    std::fs::metadata(p)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}

/// The pool directory and the files in it (symlinks followed: the metadata
/// store may live beside the fastest device), with the mode each should
/// have.
fn pool_entries(pool: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = vec![(pool.to_path_buf(), DIR_MODE)];
    for e in std::fs::read_dir(pool).into_iter().flatten().flatten() {
        let p = e.path();
        let Ok(m) = std::fs::metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            continue;
        }
        let p = if e.file_type().is_ok_and(|t| t.is_symlink()) {
            p.canonicalize().unwrap_or(p)
        } else {
            p
        };
        out.push((p, FILE_MODE));
    }
    out
}

/// Paths of the pool that others may open.
pub fn widened(pool: &Path) -> Vec<Widened> {
    pool_entries(pool)
        .into_iter()
        .filter_map(|(path, want)| {
            let mode = mode_of(&path)?;
            readable_by_others(mode).then_some(Widened { path, mode, want })
        })
        .collect()
}

/// Tightens every widened path of the pool; returns one line per change.
pub fn tighten(pool: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for w in widened(pool) {
        let new = w.mode & 0o700;
        let r = std::fs::set_permissions(&w.path, std::fs::Permissions::from_mode(new));
        out.push(match r {
            Ok(()) => format!(
                "{} had mode {:04o}, readable by other users; tightened to {new:04o}",
                w.path.display(),
                w.mode
            ),
            Err(e) => format!("{w}; could not tighten it: {e}"),
        });
    }
    out
}

/// A warning when a device outside the pool directory (a block device or a
/// file given by path) can be read by other users.
pub fn exposed_device(pool: &Path, dev: &Path) -> Option<String> {
    if dev.starts_with(pool) {
        return None;
    }
    let mode = mode_of(dev)?;
    readable_by_others(mode).then(|| {
        format!(
            "device {} has mode {mode:04o}: other users can read the pool's data on it (chmod 600 it)",
            dev.display()
        )
    })
}
