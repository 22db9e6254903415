//! Opening a pool with devices missing. A device the pool names that
//! cannot be opened (its file is gone, its disk is dead, its header is
//! unreadable) does not refuse the mount by itself: it joins the set as a
//! missing device (every I/O fails) and reads go to the other copies. What
//! decides is whether the pool's copies cover the loss:
//! - every segment keeps a copy on an online device: the pool mounts
//!   read-write, says loudly which devices are missing, and new data gets
//!   the copies still possible (the rest are made when devices return or
//!   are replaced);
//! - some segment has no other copy: the mount is refused, naming the
//!   devices, the data at risk and the way on (`cairn mount --degraded`,
//!   which mounts read-only: files with lost chunks give EIO, all others
//!   read exact).

use crate::error::{FsError, Result};
use crate::pool::config::PoolConfig;
use crate::pool::superblock::Superblock;
use crate::pool::DeviceDesc;
use cairn_data::{SegmentRec, StripeRec};
use cairn_devices::SlotAddr;
use cairn_devices::{human, Device, DeviceSet, DeviceState, Storage};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// A device that could not be opened.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MissingDevice {
    pub id: u32,
    pub path: PathBuf,
    /// The error its open gave.
    pub why: String,
}

/// The devices a pool could not open and what their loss costs.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Lost {
    pub missing: Vec<MissingDevice>,
    /// Segments with no copy on an online device, and their bytes.
    pub lost_segments: u64,
    pub lost_bytes: u64,
    /// Mounted read-only because data is lost (`--degraded`).
    pub read_only: bool,
}

/// The pool's devices as opened: missing ones stand in as `Device::missing`.
pub(crate) struct Opened {
    pub(crate) devices: Vec<Device>,
    missing: Vec<MissingDevice>,
}

impl Opened {
    pub(crate) fn is_missing(&self, id: u32) -> bool {
        self.missing.iter().any(|m| m.id == id)
    }

    /// The device set, missing devices marked so and failure domains set.
    pub(crate) fn into_set(self, descs: &[DeviceDesc]) -> Result<(DeviceSet, Lost)> {
        let set = DeviceSet::new(self.devices)?;
        for d in descs {
            set.set_domain(d.id, d.domain.clone())?;
        }
        for m in &self.missing {
            set.set_state(m.id, DeviceState::Missing)?;
        }
        let lost = Lost {
            missing: self.missing,
            ..Default::default()
        };
        Ok((set, lost))
    }
}

/// Opens each device of `descs`; one that fails becomes a missing device
/// whose geometry comes from the segment table (the slots it holds).
pub(crate) fn open_devices(
    path: &Path,
    sb: &Superblock,
    descs: &[DeviceDesc],
    table: &[(u64, SegmentRec)],
    stripes: &[(u64, StripeRec)],
    config: &PoolConfig,
    storage: &dyn Storage,
) -> Opened {
    let mut out = Opened {
        devices: Vec::with_capacity(descs.len()),
        missing: Vec::new(),
    };
    for desc in descs {
        match desc.open(path, sb, storage, &config.object_options()) {
            Ok(dev) => out.devices.push(dev),
            Err(e) => {
                let at = desc_path(path, desc);
                let e = with_causes(&e);
                tracing::error!(
                    "device {} ({}) cannot be opened: {e}",
                    desc.id,
                    at.display()
                );
                let slots = slots_used(table, stripes, desc.id);
                let geometry = (sb.segment_size, slots);
                out.devices.push(Device::missing(
                    desc.id,
                    desc.class,
                    desc.role,
                    at.clone(),
                    geometry,
                    format!("{}: {e}", at.display()),
                ));
                out.missing.push(MissingDevice {
                    id: desc.id,
                    path: at,
                    why: e,
                });
            }
        }
    }
    out
}

/// An error with its causes ("I/O error on device X: No such file ...").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.contains(&text) {
            s = format!("{s}: {text}");
        }
        cause = c.source();
    }
    s
}

/// Where a device record's device is (relative paths are in the pool).
fn desc_path(pool: &Path, d: &DeviceDesc) -> PathBuf {
    match d.path.is_absolute() || d.is_object() {
        true => d.path.clone(),
        false => pool.join(&d.path),
    }
}

/// One more than the highest slot of device `id` the tables name.
fn slots_used(table: &[(u64, SegmentRec)], stripes: &[(u64, StripeRec)], id: u32) -> u64 {
    let members = stripes.iter().flat_map(|(_, s)| s.members.iter().copied());
    let slots = table.iter().flat_map(|(_, s)| s.places()).chain(members);
    let top = slots.filter(|p| p.device == id).map(|p| p.slot + 1).max();
    top.unwrap_or(0).max(1)
}

impl Lost {
    /// Decides whether the pool may mount with these devices missing (see
    /// the module comment); with `degraded`, a pool that lost data mounts
    /// read-only instead of being refused.
    /// `writable`: an online tier device is left to take new data.
    pub(crate) fn judge(
        mut self,
        table: &[(u64, SegmentRec)],
        stripes: &[(u64, StripeRec)],
        segment_size: u64,
        writable: bool,
        degraded: bool,
    ) -> Result<Lost> {
        if self.missing.is_empty() {
            return Ok(self);
        }
        let gone: HashSet<u32> = self.missing.iter().map(|m| m.id).collect();
        // Data member slot -> its stripe, built once.
        let by_member: HashMap<SlotAddr, &StripeRec> = (stripes.iter())
            .flat_map(|(_, r)| r.data().iter().map(move |p| (*p, r)))
            .collect();
        let restorable = |s: &SegmentRec| {
            let stripe = s.places().iter().find_map(|p| by_member.get(p).copied());
            stripe.is_some_and(|r| {
                let lost = r
                    .members
                    .iter()
                    .filter(|p| gone.contains(&p.device))
                    .count();
                lost <= r.m as usize
            })
        };
        for (_, s) in table {
            if s.places().iter().all(|p| gone.contains(&p.device)) && !restorable(s) {
                self.lost_segments += 1;
                self.lost_bytes += (s.used as u64).min(segment_size);
            }
        }
        let names = self.names();
        if !writable && !degraded {
            return Err(FsError::BadRequest(format!(
                "{names}; no tier device is left to hold data. Bring the device back, or mount with --degraded to read what is left (read-only)"
            )));
        }
        if self.lost_segments == 0 && writable {
            tracing::error!(
                "DEGRADED: {names}; every segment has a copy on the other devices or can be restored from its stripe's parity, so the pool mounts read-write. Bring the device back, or replace it: `cairn device replace TARGET ID NEW_SPEC`"
            );
            return Ok(self);
        }
        if !degraded {
            return Err(FsError::BadRequest(format!(
                "{names}; {} segments ({}) have no copy on another device. Bring the device back, or mount with --degraded to read what is left (read-only: files with lost data give I/O errors and `cairn check` names them)",
                self.lost_segments,
                human(self.lost_bytes)
            )));
        }
        tracing::error!(
            "DEGRADED, READ-ONLY: {names}; {} segments ({}) are lost: the files that use them give I/O errors (`cairn check` names them), all others read exact",
            self.lost_segments,
            human(self.lost_bytes)
        );
        self.read_only = true;
        Ok(self)
    }

    /// "device 1 is missing (why, which names its path)", for each.
    fn names(&self) -> String {
        let one = |m: &MissingDevice| {
            let shown = m.path.display().to_string();
            match m.why.contains(&shown) {
                true => format!("device {} is missing ({})", m.id, m.why),
                false => format!("device {} ({shown}) is missing ({})", m.id, m.why),
            }
        };
        self.missing.iter().map(one).collect::<Vec<_>>().join("; ")
    }
}

/// The metadata's first copy is gone with its disk (its file, or the
/// directory it lived in, no longer exists) while another copy is there:
/// the first of those becomes the first (`POOL/meta.redb` is linked to
/// it, its own link removed), so the pool opens, and the copy it leaves
/// missing is made anew at this open (`meta_copies::mirror_plan`).
/// Returns whether it did.
pub(crate) fn promote_meta_mirror(pool: &Path) -> Result<bool> {
    use crate::pool::PoolPaths;
    let meta = PoolPaths::meta(pool);
    let first_gone = std::fs::metadata(&meta).is_err() && std::fs::symlink_metadata(&meta).is_ok();
    let there = PoolPaths::meta_copies(pool);
    let mirror = there.into_iter().find(|l| std::fs::metadata(l).is_ok());
    let (true, Some(mirror)) = (first_gone, mirror) else {
        return Ok(false);
    };
    let lost = std::fs::read_link(&meta).unwrap_or_else(|_| meta.clone());
    let second = std::fs::read_link(&mirror)
        .map_err(|e| FsError::Io(format!("{}: {e}", mirror.display())))?;
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e: std::io::Error| FsError::Io(format!("{}: {e}", p.display()))
    };
    let tmp = pool.join("meta.redb.promote");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&second, &tmp).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &meta).map_err(io(&meta))?;
    std::fs::remove_file(&mirror).map_err(io(&mirror))?;
    std::fs::File::open(pool)
        .and_then(|f| f.sync_all())
        .map_err(io(pool))?;
    tracing::error!(
        "DEGRADED: the metadata's first copy {} is gone; its copy {} is now the first, and the copy missing is made anew",
        lost.display(),
        second.display()
    );
    Ok(true)
}
