//! Block volumes (ddsnap, zvols): a volume is a regular file of the pool,
//! so chunks, dedup, compression, tiering, history and scrub apply to it as
//! to any file, kept in a directory no POSIX caller can name: its entry in
//! the root is `"\0volumes"` (a NUL byte cannot be in a name the kernel
//! passes) and listings leave it out. Mirror streams and pool snapshots
//! carry volumes like everything else.
//!
//! - A volume's file is named after the volume and carries the xattr
//!   `user.cairn.volume` (its block size and creation time, versioned and
//!   checksummed, see `record.rs` and docs/format/volumes-and-nbd.md "Volumes").
//! - A volume snapshot is a pool snapshot named `VOLUME@SNAP`: created in
//!   O(1), it keeps what the pool held at its TID (the whole pool, as
//!   HAMMER's snapshots of a PFS do) until deleted.
//! - A clone of `VOLUME@SNAP` is a new volume whose blocks name the
//!   snapshot's chunks (one more reference each; no data copied); a
//!   rollback points the volume's blocks back at the snapshot's the same
//!   way, in one commit.
//!
//! The NBD frontend (crates/nbd) serves volumes through `Fs::read_into`,
//! `write`, `fallocate` and `fsync` on their inodes.

mod record;

use crate::error::{FsError, Result};
use crate::ops::clone::{BlockRange, Size};
use crate::types::{FileKind, ROOT_INO};
use crate::vfs::{Ctx, Fs};
use crate::{Snapshot, SnapshotKind};
use record::VolumeRecord;
use serde::{Deserialize, Serialize};

/// The root entry of the volumes directory.
pub const VOLUMES_DIR: &[u8] = b"\0volumes";
/// The block sizes a volume may have (what NBD clients are told to use).
pub const BLOCK_SIZES: [u32; 3] = [4096, 16384, 65536];
/// Largest volume: 1 EiB (offsets stay far from u64 overflow).
pub const MAX_SIZE: u64 = 1 << 60;

/// True for the entry listings leave out (the volumes directory).
pub(crate) fn hidden(dir: u64, name: &[u8]) -> bool {
    dir == ROOT_INO && name == VOLUMES_DIR
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSnapshot {
    /// SNAP, of the pool snapshot VOLUME@SNAP.
    pub name: String,
    pub tid: u64,
    pub time_ns: u64,
    /// The volume's size at the snapshot.
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeInfo {
    pub name: String,
    pub ino: u64,
    pub size: u64,
    pub block_size: u32,
    pub created_ns: u64,
    /// Bytes stored for its blocks (after compression; shared chunks
    /// count in every volume).
    pub stored_bytes: u64,
    pub snapshots: Vec<VolumeSnapshot>,
}

/// Why `name` cannot name a volume or a volume snapshot, if it cannot.
pub fn volume_name_problem(name: &str) -> Option<String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    let why = if name.is_empty() || name.len() > 64 {
        "it must be 1 to 64 characters long"
    } else if !name.chars().all(ok_char) {
        "only letters, digits, '.', '_' and '-' are allowed"
    } else if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        "it must start with a letter or a digit"
    } else {
        return None;
    };
    Some(format!("invalid volume or snapshot name {name:?}: {why}"))
}

fn check_volume_name(name: &str) -> Result<()> {
    match volume_name_problem(name) {
        Some(why) => Err(FsError::BadRequest(why)),
        None => Ok(()),
    }
}

/// Splits an export name `VOLUME` or `VOLUME@SNAP`.
pub fn split_export(name: &str) -> (&str, Option<&str>) {
    match name.split_once('@') {
        Some((v, s)) => (v, Some(s)),
        None => (name, None),
    }
}

impl Fs {
    /// The volumes directory's inode, made on first use.
    fn volumes_dir(&self, create: bool) -> Result<Option<u64>> {
        match self.lookup(ROOT_INO, VOLUMES_DIR) {
            Ok(i) => Ok(Some(i.ino)),
            Err(FsError::NotFound) if create => {
                let d = FileKind::Dir;
                let i = self.create_node_unchecked(Ctx::ROOT, ROOT_INO, VOLUMES_DIR, d, 0o700, 0);
                match i {
                    Ok(i) => Ok(Some(i.ino)),
                    Err(FsError::Exists) => self.volumes_dir(false),
                    Err(e) => Err(e),
                }
            }
            Err(FsError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn no_volume(name: &str) -> FsError {
        FsError::BadRequest(format!(
            "no volume named {name:?} (cairn volume list shows them)"
        ))
    }

    /// The inode of volume `name`.
    fn volume_ino(&self, name: &str) -> Result<u64> {
        check_volume_name(name)?;
        let dir = self
            .volumes_dir(false)?
            .ok_or_else(|| Self::no_volume(name))?;
        match self.lookup(dir, name.as_bytes()) {
            Ok(i) => Ok(i.ino),
            Err(FsError::NotFound) => Err(Self::no_volume(name)),
            Err(e) => Err(e),
        }
    }

    /// Makes an empty (all-zero, nothing stored) volume.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "nanoseconds since 1970: now is after 1970 and before 2554"
    )]
    pub fn volume_create(&self, name: &str, size: u64, block_size: u32) -> Result<VolumeInfo> {
        self.refuse_on_mirror()?;
        check_volume_name(name)?;
        check_size(size, block_size)?;
        let dir = self.volumes_dir(true)?.expect("made");
        let f = FileKind::File;
        let i = match self.create_node(Ctx::ROOT, dir, name.as_bytes(), f, 0o600, 0) {
            Err(FsError::Exists) => {
                return Err(FsError::BadRequest(format!(
                    "a volume named {name:?} already exists"
                )))
            }
            r => r?,
        };
        let rec = VolumeRecord {
            block_size,
            created_ns: Self::now().as_nanos() as u64,
        };
        self.setxattr(
            i.ino,
            record::XATTR,
            &rec.encode(),
            crate::XattrMode::Create,
        )?;
        self.truncate(i.ino, size)?;
        self.fsync(i.ino)?;
        self.volume(name)
    }

    /// Every volume, by name.
    pub fn volumes(&self) -> Result<Vec<VolumeInfo>> {
        let Some(dir) = self.volumes_dir(false)? else {
            return Ok(Vec::new());
        };
        let snaps = self.snapshots()?;
        let mut out = Vec::new();
        let mut cookie = 0;
        loop {
            let ents = self.readdir(dir, cookie, 256)?;
            let Some(last) = ents.last() else { break };
            cookie = last.cookie;
            for e in ents.iter().filter(|e| e.cookie > 2) {
                let name = String::from_utf8_lossy(&e.name).into_owned();
                out.push(self.volume_info(&name, e.ino, &snaps)?);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub fn volume(&self, name: &str) -> Result<VolumeInfo> {
        let ino = self.volume_ino(name)?;
        self.volume_info(name, ino, &self.snapshots()?)
    }

    fn volume_info(&self, name: &str, ino: u64, snaps: &[Snapshot]) -> Result<VolumeInfo> {
        let rec = VolumeRecord::decode(&self.getxattr(ino, record::XATTR)?)?;
        let prefix = format!("{name}@");
        let mut snapshots = Vec::new();
        for s in snaps.iter().filter(|s| s.name.starts_with(&prefix)) {
            snapshots.push(VolumeSnapshot {
                name: s.name[prefix.len()..].to_string(),
                tid: s.tid,
                time_ns: s.time_ns,
                size: self.asof_getattr(ino, s.tid).map_or(0, |i| i.size),
            });
        }
        Ok(VolumeInfo {
            name: name.to_string(),
            ino,
            size: self.getattr(ino)?.size,
            block_size: rec.block_size,
            created_ns: rec.created_ns,
            stored_bytes: self.stored_blocks(ino) * 512,
            snapshots,
        })
    }

    /// Grows or shrinks a volume (shrinking drops the data past the new
    /// end, so it must be asked for).
    pub fn volume_resize(&self, name: &str, size: u64, shrink: bool) -> Result<VolumeInfo> {
        self.refuse_on_mirror()?;
        let v = self.volume(name)?;
        check_size(size, v.block_size)?;
        if size < v.size && !shrink {
            return Err(FsError::BadRequest(format!(
                "{size} bytes is smaller than volume {name:?} ({} bytes): the data past it \
                 would be lost; pass --shrink to do it anyway",
                v.size
            )));
        }
        self.truncate(v.ino, size)?;
        self.fsync(v.ino)?;
        self.volume(name)
    }

    /// Deletes a volume. Its snapshots must go with it (`with_snapshots`),
    /// or be deleted first.
    pub fn volume_delete(&self, name: &str, with_snapshots: bool) -> Result<()> {
        self.refuse_on_mirror()?;
        let v = self.volume(name)?;
        if !v.snapshots.is_empty() && !with_snapshots {
            let names: Vec<String> = v.snapshots.iter().map(|s| s.name.clone()).collect();
            return Err(FsError::BadRequest(format!(
                "volume {name:?} has snapshots ({}): delete them first, or pass \
                 --with-snapshots",
                names.join(", ")
            )));
        }
        for s in &v.snapshots {
            self.snapshot_delete(&format!("{name}@{}", s.name))?;
        }
        let dir = self
            .volumes_dir(false)?
            .ok_or_else(|| Self::no_volume(name))?;
        self.unlink(dir, name.as_bytes())?;
        self.flush()
    }

    /// Snapshots a volume: the pool snapshot `VOLUME@SNAP`, durable on
    /// return, or only cut unless `wait` (see `snapshot_cut`).
    pub fn volume_snapshot(&self, name: &str, snap: &str, wait: bool) -> Result<Snapshot> {
        self.volume_ino(name)?;
        check_volume_name(snap)?;
        let full = format!("{name}@{snap}");
        match wait {
            true => self.snapshot_create(&full, SnapshotKind::Named),
            false => self.snapshot_cut(&full, SnapshotKind::Named),
        }
    }

    /// Resolves `VOLUME@SNAP` to the volume and the snapshot.
    pub fn volume_at(&self, name: &str, snap: &str) -> Result<(VolumeInfo, VolumeSnapshot)> {
        let v = self.volume(name)?;
        let s = v.snapshots.iter().find(|s| s.name == snap).cloned();
        let s = s.ok_or_else(|| {
            FsError::BadRequest(format!("volume {name:?} has no snapshot named {snap:?}"))
        })?;
        Ok((v, s))
    }

    /// A new volume `new` with the content of `name@snap`, sharing its
    /// chunks (no data copied).
    pub fn volume_clone(&self, name: &str, snap: &str, new: &str) -> Result<VolumeInfo> {
        let (v, s) = self.volume_at(name, snap)?;
        let made = self.volume_create(new, s.size, v.block_size)?;
        let from = BlockRange {
            ino: v.ino,
            at: Some(s.tid),
            first: 0,
            count: s.size.div_ceil(self.record),
        };
        if let Err(e) = self.clone_blocks(from, made.ino, 0, Size::Exactly(s.size)) {
            let _ = self.volume_delete(new, false);
            return Err(e);
        }
        self.volume(new)
    }

    /// Puts a volume back as it was at snapshot `snap` (size included), in
    /// one commit; blocks unchanged since are left alone. Clients of the
    /// volume should disconnect first: their caches hold the newer data.
    pub fn volume_rollback(&self, name: &str, snap: &str) -> Result<VolumeInfo> {
        self.refuse_on_mirror()?;
        let (v, s) = self.volume_at(name, snap)?;
        let from = BlockRange {
            ino: v.ino,
            at: Some(s.tid),
            first: 0,
            count: v.size.max(s.size).div_ceil(self.record),
        };
        self.clone_blocks(from, v.ino, 0, Size::Exactly(s.size))?;
        self.volume(name)
    }
}

fn check_size(size: u64, block_size: u32) -> Result<()> {
    if !BLOCK_SIZES.contains(&block_size) {
        return Err(FsError::BadRequest(format!(
            "block size {block_size} is not one of 4096, 16384, 65536"
        )));
    }
    if size == 0 || !size.is_multiple_of(block_size as u64) || size > MAX_SIZE {
        return Err(FsError::BadRequest(format!(
            "volume size {size} must be a nonzero multiple of the block size \
             ({block_size}) and at most 1 EiB"
        )));
    }
    Ok(())
}
