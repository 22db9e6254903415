//! Adding and removing devices while the pool is in use. A new tier device
//! adds its capacity at once; a new cache device becomes the SSD read
//! cache. Removing a tier device drains it first: no new segments go there,
//! the open segment is closed, and every segment on it moves to the other
//! devices (the tier mover's segment move), then one transaction drops its
//! record. If the daemon dies meanwhile the device stays in the pool with
//! what is left on it; running the removal again finishes it.

use crate::error::{FsError, Result};
use crate::maintenance::tier::RateLimit;
use crate::pool::{DeviceDesc, PoolPaths};
use crate::vfs::Fs;
use cairn_devices::device::{device_file_path, file_id, in_use, occupant, Occupant};
use cairn_devices::{Device, DeviceRole, DeviceSpec};

use parking_lot::MutexGuard;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct RemoveReport {
    pub device: u32,
    pub segments_moved: u64,
    pub bytes_moved: u64,
}

impl Fs {
    /// Creates and adds a device; returns its id.
    pub fn device_add(&self, spec: &DeviceSpec) -> Result<u32> {
        let set = self.pool.chunks.devices();
        if spec.role == DeviceRole::Cache && self.pool.chunks.ssd_cache().is_some() {
            return Err(FsError::BadRequest(
                "the pool already has a cache device (one per pool)".into(),
            ));
        }
        self.check_log_spec(spec)?;
        let _last = self.flush_guard();
        let id = set.devices().iter().map(|d| d.id() + 1).max().unwrap_or(0);
        if spec.class.is_object_store() {
            return self.object_device_add(spec, id);
        }
        let file = device_file_path(&spec.path, id);
        let key = file_id(&file);
        if let Some(d) = set.devices().iter().find(|d| file_id(&d.path) == key) {
            return Err(FsError::BadRequest(format!(
                "{} is already device {} of this pool",
                file.display(),
                d.id()
            )));
        }
        if in_use(&file)? {
            return Err(FsError::BadRequest(format!(
                "{} is in use by another open pool; refusing to overwrite it",
                file.display()
            )));
        }
        if let Occupant::Cairn { pool_uuid, .. } = occupant(&file)? {
            // Of this pool but none of its devices: made by an add that
            // did not commit (a crash), or removed. Nothing refers to it.
            if pool_uuid != self.pool.sb.uuid {
                return Err(FsError::BadRequest(format!(
                    "{} holds a Cairn device of pool {}; refusing to overwrite it",
                    file.display(),
                    uuid::Uuid::from_bytes(pool_uuid)
                )));
            }
            tracing::warn!(
                "{} holds a device of this pool that is not in it (an add that did not finish, or a removed device): overwriting it",
                file.display()
            );
        }
        if spec.sparse {
            tracing::warn!(
                "device {} is left sparse: the host filesystem may fill under the pool",
                file.display()
            );
        }
        let existed = std::fs::symlink_metadata(&file).is_ok();
        let (uuid, seg) = (self.pool.sb.uuid, self.pool.sb.segment_size);
        let dev =
            Device::create_with(spec, id, uuid, seg, &*self.pool.storage).inspect_err(|_| {
                if !existed {
                    let _ = std::fs::remove_file(&file);
                }
            })?;
        let desc = DeviceDesc::new(&self.pool.path, &dev, spec);
        self.pool.meta.write(|w| {
            w.put_device(id, &desc.encode())?;
            Ok::<_, FsError>(())
        })?;
        let dev = set.add(dev)?;
        self.log_copy_joins(&dev)?;
        if spec.role == DeviceRole::Cache {
            self.pool
                .set_ssd_cache(Some(crate::pool::ssd_cache(&self.pool.config, dev)));
        }
        tracing::info!(
            "device {id} added: {} ({} {})",
            desc.path.display(),
            spec.class,
            spec.role
        );
        Ok(id)
    }

    /// Adds an s3 tier device (the caller holds the flush lock): refused
    /// when the pool already has one on the same store and prefix, or as
    /// the cache device; created through the store (its header object
    /// uploaded), then recorded.
    fn object_device_add(&self, spec: &DeviceSpec, id: u32) -> Result<u32> {
        let set = self.pool.chunks.devices();
        if spec.role != DeviceRole::Tier {
            return Err(FsError::BadRequest(
                "an s3 device is a tier, never the cache".into(),
            ));
        }
        let same = |d: &Arc<Device>| {
            let strip = |p: &Path| {
                let s = p.to_string_lossy().to_string();
                s.split(":size=").next().unwrap_or_default().to_string()
            };
            strip(&d.path) == strip(&spec.path)
        };
        if let Some(d) = set.devices().iter().find(|d| same(d)) {
            return Err(FsError::BadRequest(format!(
                "{} is already device {} of this pool",
                spec.path.display(),
                d.id()
            )));
        }
        let (uuid, seg) = (self.pool.sb.uuid, self.pool.sb.segment_size);
        let opts = self.pool.config.object_options();
        let dev = cairn_devices::objdev::create_object(spec, id, uuid, seg, &opts)?;
        let desc = DeviceDesc::new(&self.pool.path, &dev, spec);
        self.pool.meta.write(|w| {
            w.put_device(id, &desc.encode())?;
            Ok::<_, FsError>(())
        })?;
        set.add(dev)?;
        tracing::info!("device {id} added: {} (s3 tier)", desc.path.display());
        Ok(id)
    }

    /// Empties a device onto the others and removes it from the pool.
    pub fn device_remove(&self, path: &Path, progress: &dyn Fn(u64, u64)) -> Result<RemoveReport> {
        let set = self.pool.chunks.devices();
        let dev = find_device(self, path)?;
        self.check_log_copy_leaves(&dev)?;
        let id = dev.id();
        let mut rep = RemoveReport {
            device: id,
            ..Default::default()
        };
        if dev.role == DeviceRole::Tier {
            check_can_drain(self, &dev)?;
            set.set_draining(id, true)?;
            let drained = self.drain(id, &mut rep, progress);
            if let Err(e) = drained {
                set.set_draining(id, false)?;
                return Err(e);
            }
        } else {
            self.pool.set_ssd_cache(None);
        }
        self.forget_device(id, &dev)?;
        tracing::info!("device {id} removed: {}", dev.path.display());
        Ok(rep)
    }

    fn drain(&self, id: u32, rep: &mut RemoveReport, progress: &dyn Fn(u64, u64)) -> Result<()> {
        self.flush()?;
        {
            let _last = self.flush_guard();
            self.pool.chunks.close_open_segment();
        }
        let mut rate = RateLimit::new(0);
        // The background re-replication would move this device's
        // segments too (they are leaving): it waits until the drain ends.
        let one = self.resilver_lock.lock();
        loop {
            let left: Vec<u64> = self
                .pool
                .chunks
                .segment_table()
                .into_iter()
                .filter(|(_, s)| s.device == id)
                .map(|(sid, _)| sid)
                .collect();
            if left.is_empty() {
                return self.drain_members(&one, id);
            }
            let total = rep.segments_moved + left.len() as u64;
            let mut copies = 0;
            for sid in left {
                progress(rep.segments_moved, total);
                // A segment with other copies loses only the one here
                // (re-replication makes its replacement, below).
                // So does one in a stripe (the stripe pass remakes its
                // member elsewhere).
                let chunks = &self.pool.chunks;
                let kept = chunks.is_striped(sid);
                if kept || chunks.segment(sid).is_some_and(|s| !s.copies.is_empty()) {
                    copies += 1;
                    continue;
                }
                if let Some(b) = self.move_segment(sid, |d, _, _| d.id() != id)? {
                    rep.segments_moved += 1;
                    rep.bytes_moved += b;
                    rate.spend(b);
                }
            }
            if copies > 0 {
                let r = self.resilver_holding(&one, true, &|d| d.id() != id, &|_, _| {})?;
                if r.segments == 0 {
                    return Err(FsError::NoSpace);
                }
                rep.segments_moved += r.segments;
                rep.bytes_moved += r.bytes;
            }
            progress(rep.segments_moved, total);
        }
    }
}

impl Fs {
    /// Remakes elsewhere the stripe members still on draining device `id`
    /// (parity members, and data members no segment uses any more).
    fn drain_members(&self, one: &MutexGuard<'_, ()>, id: u32) -> Result<()> {
        if self.members_on(id) > 0 {
            self.resilver_holding(one, true, &|d| d.id() != id, &|_, _| {})?;
        }
        match self.members_on(id) {
            0 => Ok(()),
            n => Err(FsError::BadRequest(format!(
                "device {id}: {n} stripe members could not be made again on the other devices (each needs a failure domain its stripe does not use); the device stays in the pool"
            ))),
        }
    }
}

/// The device named by a path (as given at mkfs/add, or its file) or id.
pub(crate) fn find_device(fs: &Fs, path: &Path) -> Result<Arc<Device>> {
    let canon = |p: &Path| p.canonicalize().unwrap_or(p.to_path_buf());
    let want = canon(path);
    let devs = fs.pool.chunks.devices().devices();
    devs.iter()
        .find(|d| {
            canon(&d.path) == want
                || d.path.parent().is_some_and(|p| canon(p) == want)
                || path.to_str() == Some(&d.id().to_string())
        })
        .cloned()
        .ok_or_else(|| {
            FsError::BadRequest(format!("{}: not a device of this pool", path.display()))
        })
}

/// Refuses to drain the metadata's device or the last tier device, or one
/// whose data the others cannot hold.
fn check_can_drain(fs: &Fs, dev: &Device) -> Result<()> {
    let meta = PoolPaths::meta(&fs.pool.path);
    if let Ok(target) = std::fs::read_link(&meta) {
        let named = dev
            .path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("cairn-dev-"));
        if named && target.parent() == dev.path.parent() {
            return Err(FsError::BadRequest(format!(
                "{} holds the pool's metadata ({}); it cannot be removed",
                dev.path.display(),
                target.display()
            )));
        }
    }
    let set = fs.pool.chunks.devices();
    let (mut used, mut free_elsewhere, mut others) = (0, 0, 0);
    for (d, t, f) in set.per_device_slots() {
        if d.role != DeviceRole::Tier || set.is_draining(d.id()) {
            continue;
        }
        if d.id() == dev.id() {
            used = t - f;
        } else {
            free_elsewhere += f;
            others += 1;
        }
    }
    if others == 0 {
        return Err(FsError::BadRequest(
            "it is the pool's only tier device; add another first".into(),
        ));
    }
    if used > free_elsewhere {
        return Err(FsError::BadRequest(format!(
            "the other devices have {free_elsewhere} free segments, {used} needed"
        )));
    }
    Ok(())
}
