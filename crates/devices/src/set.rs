//! The set of devices of a pool and placement of new segments: the fastest
//! class with a free slot wins, so a full fast device spills to slower ones
//! and ENOSPC only comes when every device is full.

use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::spacemap::SpaceMap;
use parking_lot::Mutex;

/// Where a segment lives: a slot on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotAddr {
    pub device: u32,
    pub slot: u64,
}

#[derive(Debug)]
pub struct DeviceSet {
    devices: Vec<Device>,
    maps: Mutex<Vec<SpaceMap>>,
}

impl DeviceSet {
    pub fn new(mut devices: Vec<Device>) -> Self {
        devices.sort_by_key(|d| d.id());
        let maps = devices
            .iter()
            .map(|d| SpaceMap::new(d.header.slot_count()))
            .collect();
        DeviceSet {
            devices,
            maps: Mutex::new(maps),
        }
    }

    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    fn index(&self, id: u32) -> Result<usize> {
        self.devices
            .binary_search_by_key(&id, |d| d.id())
            .map_err(|_| DeviceError::UnknownDevice(id))
    }

    pub fn device(&self, id: u32) -> Result<&Device> {
        Ok(&self.devices[self.index(id)?])
    }

    /// Records at mount that a slot holds a committed segment.
    /// Returns false if the slot was already claimed (a corrupt table).
    pub fn claim(&self, addr: SlotAddr) -> Result<bool> {
        let i = self.index(addr.device)?;
        let mut maps = self.maps.lock();
        if addr.slot >= maps[i].slots() {
            return Ok(false);
        }
        Ok(maps[i].mark_used(addr.slot))
    }

    /// Allocates a slot on the fastest device that has one.
    pub fn allocate(&self) -> Result<SlotAddr> {
        let mut maps = self.maps.lock();
        let mut order: Vec<usize> = (0..self.devices.len()).collect();
        order.sort_by_key(|&i| (self.devices[i].class().rank(), self.devices[i].id()));
        for i in order {
            if let Some(slot) = maps[i].allocate() {
                return Ok(SlotAddr {
                    device: self.devices[i].id(),
                    slot,
                });
            }
        }
        Err(DeviceError::NoSpace)
    }

    pub fn release(&self, addr: SlotAddr) -> Result<()> {
        let i = self.index(addr.device)?;
        self.maps.lock()[i].release(addr.slot);
        self.devices[i].discard_slot(addr.slot);
        Ok(())
    }

    /// (total slots, free slots) over all devices.
    pub fn slot_totals(&self) -> (u64, u64) {
        let maps = self.maps.lock();
        maps.iter()
            .fold((0, 0), |(t, f), m| (t + m.slots(), f + m.free_slots()))
    }

    /// Per device: (total slots, free slots), in device order.
    pub fn per_device_slots(&self) -> Vec<(u64, u64)> {
        self.maps
            .lock()
            .iter()
            .map(|m| (m.slots(), m.free_slots()))
            .collect()
    }

    pub fn segment_size(&self) -> u64 {
        self.devices.first().map_or(0, |d| d.header.segment_size)
    }

    pub fn sync_all(&self) -> Result<()> {
        self.devices.iter().try_for_each(|d| d.sync())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeviceClass, DeviceSpec};

    #[test]
    fn fastest_first_then_spill() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |id: u32, class, name: &str| {
            let spec = DeviceSpec {
                class,
                path: dir.path().join(name),
                size: Some((1 << 20) + 4 * (1 << 20)),
            };
            Device::create(&spec, id, [0; 16], 1 << 20).unwrap()
        };
        let set = DeviceSet::new(vec![
            mk(0, DeviceClass::Hdd, "a"),
            mk(1, DeviceClass::Ssd, "b"),
        ]);
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
}
