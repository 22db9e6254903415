//! The set of devices of a pool and placement of new segments: the fastest
//! class with a free slot wins, so a full fast device spills to slower ones
//! (local tiers full: to an object-store tier) and ENOSPC only comes when
//! every device is full. A device that failed a
//! write is placed after every device without errors (whatever their
//! speed), and after `FAILING_AFTER` failed writes it is *failing*: it gets
//! new segments only when no other device has a free slot (a pool of one
//! device keeps trying it rather than refusing every write).
//!
//! A segment may have copies (`allocate_copies`): each on a different
//! device of a different failure domain. A device the pool names but that
//! could not be opened is *missing*, one taken out while mounted (it failed
//! too many I/Os) is *faulted*: neither gets new segments, and reads go to
//! another copy first.

use crate::class::DeviceRole;
use crate::device::Device;
use crate::error::{invariant, DeviceError, Result};
use crate::spacemap::SpaceMap;
use parking_lot::RwLock;
use std::sync::Arc;

/// Where a segment lives: a slot on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotAddr {
    pub device: u32,
    pub slot: u64,
}

/// Failed writes after which a device gets no new segments.
pub const FAILING_AFTER: u32 = 3;

/// Failed reads in a row (no read between them succeeded) after which a
/// device is faulted, when another copy can serve its segments.
pub const FAULTED_AFTER_READS: u32 = 8;

/// What a device can do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceState {
    /// Opened and answering.
    Online,
    /// Named by the pool but not opened at mount (gone, unreadable).
    Missing,
    /// Taken out while mounted: too many failed I/Os.
    Faulted,
}

impl std::fmt::Display for DeviceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceState::Online => "online",
            DeviceState::Missing => "missing",
            DeviceState::Faulted => "faulted",
        })
    }
}

/// One member of the set: the device, its slot map, whether it is being
/// drained (no new segments; `cairn device remove` empties it) and how many
/// of its writes failed since the pool was opened.
#[derive(Debug)]
struct Member {
    dev: Arc<Device>,
    map: SpaceMap,
    draining: bool,
    write_errors: u32,
    /// Failed reads since the last read that succeeded.
    read_errors_in_row: u32,
    state: DeviceState,
    /// Its failure domain (its own id when the admin named none).
    domain: String,
}

impl Member {
    /// Takes new segments (not missing, faulted or draining).
    fn takes_segments(&self) -> bool {
        self.dev.role == DeviceRole::Tier && !self.draining && self.state == DeviceState::Online
    }
}

/// The devices of a pool. Devices can be added and removed while the pool
/// is in use; each one is shared as an `Arc` so that an I/O in flight keeps
/// its device open.
#[derive(Debug)]
pub struct DeviceSet {
    members: RwLock<Vec<Member>>,
    segment_size: u64,
}

impl DeviceSet {
    /// The set of a pool's devices. Fails if two have the same id or
    /// their geometry differs.
    pub fn new(devices: Vec<Device>) -> Result<Self> {
        let segment_size = devices.first().map_or(0, |d| d.header.segment_size);
        let set = DeviceSet {
            members: RwLock::new(Vec::new()),
            segment_size,
        };
        for d in devices {
            set.add(d)?;
        }
        Ok(set)
    }

    /// Adds a device (online). Its segment size must match the pool's.
    pub fn add(&self, dev: Device) -> Result<Arc<Device>> {
        if self.segment_size != 0 && dev.header.segment_size != self.segment_size {
            return Err(DeviceError::BadSpec {
                spec: dev.path.display().to_string(),
                why: "segment size differs from the pool's".into(),
            });
        }
        let mut m = self.members.write();
        if m.iter().any(|x| x.dev.id() == dev.id()) {
            return Err(DeviceError::BadSpec {
                spec: dev.path.display().to_string(),
                why: format!("device id {} already in the pool", dev.id()),
            });
        }
        let dev = Arc::new(dev);
        m.push(Member {
            map: SpaceMap::new(dev.header.slot_count()),
            domain: format!("device-{}", dev.id()),
            dev: dev.clone(),
            draining: false,
            write_errors: 0,
            read_errors_in_row: 0,
            state: DeviceState::Online,
        });
        m.sort_by_key(|x| x.dev.id());
        Ok(dev)
    }

    /// Takes a device out of the set. Refused while it holds segments.
    pub fn remove(&self, id: u32) -> Result<Arc<Device>> {
        let mut m = self.members.write();
        let i = index(&m, id)?;
        let used = m[i].map.slots() - m[i].map.free_slots();
        if used > 0 {
            return Err(DeviceError::InUse { id, segments: used });
        }
        Ok(m.remove(i).dev)
    }

    /// Marks a device as draining (no new segments) or not.
    pub fn set_draining(&self, id: u32, draining: bool) -> Result<()> {
        let mut m = self.members.write();
        let i = index(&m, id)?;
        m[i].draining = draining;
        Ok(())
    }

    pub fn is_draining(&self, id: u32) -> bool {
        let m = self.members.read();
        index(&m, id).is_ok_and(|i| m[i].draining)
    }

    /// Counts a failed write (or sync) of a device; returns its count.
    pub fn note_write_error(&self, id: u32) -> u32 {
        let mut m = self.members.write();
        let Ok(i) = index(&m, id) else { return 0 };
        m[i].write_errors += 1;
        let n = m[i].write_errors;
        if n == FAILING_AFTER {
            tracing::error!(
                "device {id} ({}) failed {n} writes: no new data goes to it",
                m[i].dev.path.display()
            );
        }
        n
    }

    /// Failed writes of a device since the pool was opened.
    pub fn write_errors(&self, id: u32) -> u32 {
        let m = self.members.read();
        index(&m, id).map_or(0, |i| m[i].write_errors)
    }

    /// Failed `FAILING_AFTER` writes or more: out of placement.
    pub fn is_failing(&self, id: u32) -> bool {
        self.write_errors(id) >= FAILING_AFTER
    }

    /// Every device, in id order.
    pub fn devices(&self) -> Vec<Arc<Device>> {
        self.members.read().iter().map(|x| x.dev.clone()).collect()
    }

    pub fn device(&self, id: u32) -> Result<Arc<Device>> {
        let m = self.members.read();
        Ok(m[index(&m, id)?].dev.clone())
    }

    /// Records at mount that a slot holds a committed segment.
    /// Returns false if the slot was already claimed (a corrupt table).
    pub fn claim(&self, addr: SlotAddr) -> Result<bool> {
        let mut m = self.members.write();
        let i = index(&m, addr.device)?;
        if addr.slot >= m[i].map.slots() || m[i].dev.role != DeviceRole::Tier {
            return Ok(false);
        }
        Ok(m[i].map.mark_used(addr.slot))
    }

    /// Allocates a slot for a new segment on the fastest local tier device
    /// that has one; when every local tier is full, on an object-store
    /// device whose store answers (the writer then writes the segment
    /// whole: `cairn_data::WriteBatch`), so the pool holds as much as all
    /// its tiers together.
    pub fn allocate(&self) -> Result<SlotAddr> {
        self.allocate_where(|_, _, _| true).or_else(|_| {
            self.allocate_among(|d, _, _| d.class().is_object_store() && d.is_available())
        })
    }

    /// Allocates a slot on the fastest tier device, not draining, for which
    /// `pick(device, total slots, free slots)` is true; devices that failed
    /// a write come after all others, failing ones last. `pick` runs under
    /// the set's lock: it must not call back into the set. Object-store
    /// devices are never chosen here: new segments are appended to, and
    /// only whole sealed segments go to an object store
    /// (`allocate_move_where`).
    pub fn allocate_where(&self, pick: impl Fn(&Device, u64, u64) -> bool) -> Result<SlotAddr> {
        self.allocate_among(|d, t, f| !d.class().is_object_store() && pick(d, t, f))
    }

    /// A slot for a whole segment moved by the tier mover or a device
    /// removal: as `allocate_where`, object-store devices included when
    /// their store answers (demotion to one that does not waits).
    pub fn allocate_move_where(
        &self,
        pick: impl Fn(&Device, u64, u64) -> bool,
    ) -> Result<SlotAddr> {
        self.allocate_among(|d, t, f| d.is_available() && pick(d, t, f))
    }

    fn allocate_among(&self, pick: impl Fn(&Device, u64, u64) -> bool) -> Result<SlotAddr> {
        let mut m = self.members.write();
        let mut order: Vec<usize> = (0..m.len())
            .filter(|&i| {
                let x = &m[i];
                x.takes_segments() && pick(&x.dev, x.map.slots(), x.map.free_slots())
            })
            .collect();
        order.sort_by_key(|&i| placement_key(&m[i]));
        for i in order {
            if let Some(slot) = m[i].map.allocate() {
                return Ok(SlotAddr {
                    device: m[i].dev.id(),
                    slot,
                });
            }
        }
        Err(DeviceError::NoSpace)
    }

    /// Slots for further copies of a segment whose copies are at `have`:
    /// up to `more`, each on a device of a failure domain that no copy
    /// uses and that `pick` accepts, devices of class rank `rank`
    /// preferred, then the faster.
    /// Fewer (none) when the pool has no such device with room: the
    /// segment then has the copies it can have and the rest are made
    /// later (`cairn_fs`'s re-replication).
    pub fn allocate_copies(
        &self,
        have: &[SlotAddr],
        rank: u8,
        more: usize,
        pick: impl Fn(&Device, u64, u64) -> bool,
    ) -> Vec<SlotAddr> {
        let mut m = self.members.write();
        let mut domains: Vec<String> = (have.iter())
            .filter_map(|a| index(&m, a.device).ok().map(|i| m[i].domain.clone()))
            .collect();
        let mut order: Vec<usize> = (0..m.len())
            .filter(|&i| {
                let x = &m[i];
                x.takes_segments()
                    && !x.dev.class().is_object_store()
                    && pick(&x.dev, x.map.slots(), x.map.free_slots())
            })
            .collect();
        // Within a class, the device with the most free slots first: the
        // first copies fill the fastest device in id order, so further
        // copies spread over the others (none fills while another of
        // the class stays empty, which would leave later data short).
        order.sort_by_key(|&i| {
            let (health, r, id) = placement_key(&m[i]);
            let free = std::cmp::Reverse(m[i].map.free_slots());
            (health, r != rank, r, free, id)
        });
        let mut out = Vec::with_capacity(more);
        for i in order {
            if out.len() == more {
                break;
            }
            if domains.contains(&m[i].domain) {
                continue;
            }
            if let Some(slot) = m[i].map.allocate() {
                domains.push(m[i].domain.clone());
                out.push(SlotAddr {
                    device: m[i].dev.id(),
                    slot,
                });
            }
        }
        out
    }

    /// The failure domain of a device.
    pub fn domain(&self, id: u32) -> Option<String> {
        let m = self.members.read();
        index(&m, id).ok().map(|i| m[i].domain.clone())
    }

    /// Names a device's failure domain (None: its own).
    pub fn set_domain(&self, id: u32, domain: Option<String>) -> Result<()> {
        let mut m = self.members.write();
        let i = index(&m, id)?;
        m[i].domain = domain.unwrap_or_else(|| format!("device-{id}"));
        Ok(())
    }

    /// What a device can do now.
    pub fn state(&self, id: u32) -> Option<DeviceState> {
        let m = self.members.read();
        index(&m, id).ok().map(|i| m[i].state)
    }

    /// True if the device is opened and not faulted.
    pub fn is_online(&self, id: u32) -> bool {
        self.state(id) == Some(DeviceState::Online)
    }

    /// Marks a device missing or faulted (or online again). Returns the
    /// state it had.
    pub fn set_state(&self, id: u32, state: DeviceState) -> Result<DeviceState> {
        let mut m = self.members.write();
        let i = index(&m, id)?;
        Ok(std::mem::replace(&mut m[i].state, state))
    }

    /// Counts a failed read of a device; returns how many failed in a row.
    pub fn note_read_error(&self, id: u32) -> u32 {
        let mut m = self.members.write();
        let Ok(i) = index(&m, id) else { return 0 };
        m[i].read_errors_in_row += 1;
        m[i].read_errors_in_row
    }

    /// A read of a device succeeded: its run of failed reads ends.
    pub fn note_read_ok(&self, id: u32) {
        let m = self.members.read();
        if let Ok(i) = index(&m, id) {
            if m[i].read_errors_in_row == 0 {
                return;
            }
        }
        drop(m);
        let mut m = self.members.write();
        if let Ok(i) = index(&m, id) {
            m[i].read_errors_in_row = 0;
        }
    }

    /// The devices that are not online: (id, state).
    pub fn not_online(&self) -> Vec<(u32, DeviceState)> {
        let m = self.members.read();
        (m.iter().filter(|x| x.state != DeviceState::Online))
            .map(|x| (x.dev.id(), x.state))
            .collect()
    }

    pub fn release(&self, addr: SlotAddr) -> Result<()> {
        let dev = {
            let mut m = self.members.write();
            let i = index(&m, addr.device)?;
            let x = &mut m[i];
            let slots = x.map.slots();
            // A slot freed twice may already hold another segment: its
            // next owner's bytes would be overwritten or punched out.
            let freed = addr.slot < slots && x.map.release(addr.slot);
            invariant!(
                &x.dev.path,
                freed,
                "slot {} of {slots} freed while free (freed twice, or never claimed)",
                addr.slot
            );
            x.dev.clone()
        };
        dev.discard_slot(addr.slot);
        Ok(())
    }

    /// (total slots, free slots) over the tier devices that take new
    /// segments: the pool's capacity (cache devices add none).
    pub fn slot_totals(&self) -> (u64, u64) {
        self.members
            .read()
            .iter()
            .filter(|x| x.takes_segments())
            .fold((0, 0), |(t, f), x| {
                (t + x.map.slots(), f + x.map.free_slots())
            })
    }

    /// The failure domains of the devices that take new segments: the
    /// most copies a new segment can get.
    pub fn segment_domains(&self) -> usize {
        let m = self.members.read();
        let mut domains: Vec<&str> = (m.iter())
            .filter(|x| x.takes_segments())
            .map(|x| x.domain.as_str())
            .collect();
        domains.sort_unstable();
        domains.dedup();
        domains.len()
    }

    /// Per device, in id order: (device, total slots, free slots).
    pub fn per_device_slots(&self) -> Vec<(Arc<Device>, u64, u64)> {
        self.members
            .read()
            .iter()
            .map(|x| (x.dev.clone(), x.map.slots(), x.map.free_slots()))
            .collect()
    }

    /// When a tier device file is sparse, the host filesystems under the
    /// pool may not hold what the pool counts as free: the bytes their
    /// users may still allocate, summed over the distinct host filesystems
    /// of the tier devices. None when every tier device is allocated.
    pub fn host_free_limit(&self) -> Option<u64> {
        let devs: Vec<Arc<Device>> = self
            .members
            .read()
            .iter()
            .filter(|x| x.dev.role == DeviceRole::Tier && !x.draining)
            .map(|x| x.dev.clone())
            .collect();
        if !devs.iter().any(|d| d.is_sparse()) {
            return None;
        }
        let hosts: std::collections::HashMap<u64, u64> =
            devs.iter().filter_map(|d| d.host_free()).collect();
        Some(hosts.values().sum())
    }

    /// Object-store GC: of the slots that have an object on device `id`
    /// (`ObjectTier::list_slots`), queues the delete of those no segment
    /// holds (left by a crash between upload and table switch, or freed
    /// while the store was away). Checked and queued under the set's lock,
    /// so a slot allocated meanwhile is either seen used or its upload
    /// cancels the queued delete. Returns how many were queued.
    pub fn collect_object_garbage(&self, id: u32, listed: &[u64]) -> Result<usize> {
        let m = self.members.read();
        let x = &m[index(&m, id)?];
        let Some(obj) = x.dev.object_tier() else {
            return Ok(0);
        };
        let mut n = 0;
        for &slot in listed {
            if slot >= x.map.slots() || !x.map.is_used(slot) {
                obj.queue_delete(slot);
                n += 1;
            }
        }
        Ok(n)
    }

    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    /// Class rank of the fastest tier device.
    pub fn fastest_tier_rank(&self) -> Option<u8> {
        self.members
            .read()
            .iter()
            .filter(|x| x.dev.role == DeviceRole::Tier)
            .map(|x| x.dev.class().rank())
            .min()
    }

    /// Syncs every online device (a missing or faulted one has nothing
    /// of ours to make durable).
    pub fn sync_all(&self) -> Result<()> {
        let online: Vec<Arc<Device>> = (self.members.read().iter())
            .filter(|x| x.state == DeviceState::Online)
            .map(|x| x.dev.clone())
            .collect();
        online.iter().try_for_each(|d| d.sync())
    }
}

/// The order placement tries devices in: clean before those that failed
/// a write, failing ones last; then the fastest class; then by id.
fn placement_key(x: &Member) -> (u8, u8, u32) {
    let errors = x.write_errors;
    let health = (errors >= FAILING_AFTER) as u8 + (errors > 0) as u8;
    (health, x.dev.class().rank(), x.dev.id())
}

fn index(m: &[Member], id: u32) -> Result<usize> {
    m.binary_search_by_key(&id, |x| x.dev.id())
        .map_err(|_| DeviceError::UnknownDevice(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeviceClass, DeviceSpec};

    /// A tier device of `mib` MiB (1 MiB segments) in `dir`.
    fn device(dir: &std::path::Path, id: u32, class: DeviceClass, name: &str, mib: u64) -> Device {
        let spec = DeviceSpec::tier(class, dir.join(name), Some(mib << 20));
        Device::create(&spec, id, [0; 16], 1 << 20).unwrap()
    }

    #[test]
    fn fastest_first_then_spill() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |id, class, name: &str| device(dir.path(), id, class, name, 5);
        let set = DeviceSet::new(vec![
            mk(0, DeviceClass::Hdd, "a"),
            mk(1, DeviceClass::Ssd, "b"),
        ])
        .unwrap();
        for _ in 0..4 {
            assert_eq!(set.allocate().unwrap().device, 1);
        }
        for _ in 0..4 {
            assert_eq!(set.allocate().unwrap().device, 0);
        }
        assert!(matches!(set.allocate(), Err(DeviceError::NoSpace)));
        set.release(SlotAddr { device: 1, slot: 2 }).unwrap();
        assert_eq!(set.allocate().unwrap(), SlotAddr { device: 1, slot: 2 });
    }

    /// A slot freed twice (or never claimed, or past the device's end)
    /// is refused as a violated invariant: it may already hold another
    /// segment. The free count is not touched.
    #[test]
    fn a_slot_freed_twice_is_a_violated_invariant() {
        let dir = tempfile::tempdir().unwrap();
        let set = DeviceSet::new(vec![device(dir.path(), 0, DeviceClass::Ssd, "a", 5)]).unwrap();
        let a = set.allocate().unwrap();
        set.release(a).unwrap();
        let free = set.slot_totals().1;
        for bad in [
            a,
            SlotAddr {
                device: 0,
                slot: 99,
            },
        ] {
            let e = set.release(bad).unwrap_err();
            assert!(e.is_invariant(), "{e}");
            assert!(e.to_string().starts_with("INVARIANT VIOLATED"), "{e}");
            assert!(e.to_string().contains("freed while free"), "{e}");
        }
        assert_eq!(set.slot_totals().1, free);
    }

    #[test]
    fn add_drain_remove() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |id, class, name: &str| device(dir.path(), id, class, name, 5);
        let set = DeviceSet::new(vec![mk(0, DeviceClass::Hdd, "a")]).unwrap();
        let a = set.allocate().unwrap();
        set.add(mk(1, DeviceClass::Nvme, "b")).unwrap();
        assert!(set.add(mk(1, DeviceClass::Nvme, "c")).is_err());
        assert_eq!(set.allocate().unwrap().device, 1);
        assert_eq!(set.slot_totals(), (8, 6));
        set.set_draining(1, true).unwrap();
        assert_eq!(set.allocate().unwrap().device, 0);
        assert!(matches!(set.remove(0), Err(DeviceError::InUse { .. })));
        set.release(a).unwrap();
        assert!(set.remove(1).is_err());
        set.release(SlotAddr { device: 1, slot: 0 }).unwrap();
        set.remove(1).unwrap();
        assert_eq!(set.devices().len(), 1);
    }

    #[test]
    fn copies_go_to_other_domains_same_class_first_and_never_to_missing_devices() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |id, class, name: &str| device(dir.path(), id, class, name, 8);
        let set = DeviceSet::new(vec![
            mk(0, DeviceClass::Ssd, "a"),
            mk(1, DeviceClass::Hdd, "b"),
            mk(2, DeviceClass::Ssd, "c"),
            mk(3, DeviceClass::Ssd, "d"),
        ])
        .unwrap();
        let first = set.allocate().unwrap();
        assert_eq!(first.device, 0);
        let ssd = DeviceClass::Ssd.rank();
        let more = set.allocate_copies(&[first], ssd, 1, |_, _, _| true);
        assert_eq!(more.len(), 1);
        assert_eq!(more[0].device, 2, "same class first");
        // Devices 0 and 2 share a domain: the copy goes to device 3.
        set.set_domain(2, Some("shelf".into())).unwrap();
        set.set_domain(0, Some("shelf".into())).unwrap();
        let more = set.allocate_copies(&[first], ssd, 1, |_, _, _| true);
        assert_eq!(more[0].device, 3);
        // Device 3 missing: the hdd is the only other domain left.
        set.set_state(3, DeviceState::Missing).unwrap();
        let more = set.allocate_copies(&[first], ssd, 2, |_, _, _| true);
        assert_eq!(more.iter().map(|a| a.device).collect::<Vec<_>>(), vec![1]);
        assert_eq!(set.not_online(), vec![(3, DeviceState::Missing)]);
        assert!(set.sync_all().is_ok());
    }

    #[test]
    fn a_missing_device_takes_no_segments_and_fails_every_io() {
        let dir = tempfile::tempdir().unwrap();
        let spec = DeviceSpec::tier(DeviceClass::Ssd, dir.path().join("a"), Some(8 << 20));
        let a = Device::create(&spec, 0, [0; 16], 1 << 20).unwrap();
        let gone = Device::missing(
            1,
            DeviceClass::Nvme,
            DeviceRole::Tier,
            dir.path().join("gone"),
            (1 << 20, 4),
            "gone: No such file".into(),
        );
        assert_eq!(gone.header.slot_count(), 4);
        assert!(gone.read_at(&mut [0u8; 8], gone.slot_offset(1)).is_err());
        let set = DeviceSet::new(vec![a, gone]).unwrap();
        set.set_state(1, DeviceState::Missing).unwrap();
        assert!(set.claim(SlotAddr { device: 1, slot: 3 }).unwrap());
        for _ in 0..7 {
            assert_eq!(set.allocate().unwrap().device, 0, "never the missing nvme");
        }
        assert!(matches!(set.allocate(), Err(DeviceError::NoSpace)));
    }

    #[test]
    fn a_device_that_failed_a_write_goes_after_clean_ones_and_failing_last() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |id, class, name: &str| device(dir.path(), id, class, name, 8);
        let set = DeviceSet::new(vec![
            mk(0, DeviceClass::Hdd, "a"),
            mk(1, DeviceClass::Nvme, "b"),
        ])
        .unwrap();
        assert_eq!(set.allocate().unwrap().device, 1);
        assert_eq!(set.note_write_error(1), 1);
        assert!(!set.is_failing(1));
        assert_eq!(
            set.allocate().unwrap().device,
            0,
            "the slower clean device first"
        );
        let (_, _, free) = set.per_device_slots()[0];
        for _ in 0..free {
            assert_eq!(set.allocate().unwrap().device, 0);
        }
        assert_eq!(
            set.allocate().unwrap().device,
            1,
            "then the one with an error"
        );
        set.note_write_error(1);
        set.note_write_error(1);
        assert!(set.is_failing(1));
        assert_eq!(set.write_errors(1), FAILING_AFTER);
        set.release(SlotAddr { device: 0, slot: 0 }).unwrap();
        set.release(SlotAddr { device: 1, slot: 0 }).unwrap();
        assert_eq!(
            set.allocate().unwrap().device,
            0,
            "a failing device comes last"
        );
        assert_eq!(
            set.allocate().unwrap().device,
            1,
            "but is used when nothing else is left"
        );
    }
}
