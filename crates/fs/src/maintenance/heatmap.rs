//! The heat map of the dashboard: per device, one cell per segment slot
//! coloured by the heat of the segment in it (decayed reads, the heat table
//! the tier mover uses, `cairn_data::heat`). A device with more slots than
//! `max_cells` gets cells of several consecutive slots each: a cell shows
//! the hottest segment among its slots and how many of them hold one, so
//! the answer stays bounded however big the pool. Reads only in-RAM tables
//! (segment table, heat table, space maps): no metadata scan.

use crate::vfs::Fs;
use serde::Serialize;
use std::collections::HashMap;

/// One device's row of the heat map.
#[derive(Debug, Clone, Serialize)]
pub struct HeatMapDevice {
    pub id: u32,
    pub class: String,
    pub role: String,
    /// Segment slots of the device.
    pub slots: u64,
    /// Consecutive slots per cell (1 unless the device has more slots than
    /// the cells asked for).
    pub slots_per_cell: u64,
    /// Per cell: the decayed reads of its hottest segment (0: none read).
    pub heat: Vec<f32>,
    /// Per cell: how many of its slots hold a segment.
    pub segments: Vec<u32>,
}

/// Cells per device when the caller does not say.
pub const DEFAULT_CELLS: usize = 4096;
/// The most cells per device a caller may ask for.
pub const MAX_CELLS: usize = 65_536;

impl Fs {
    /// The heat map with at most `max_cells` cells per device (clamped to
    /// 1..=MAX_CELLS).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a heat for display in f32; cells of a map held in memory, u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    pub fn heat_map(&self, max_cells: usize) -> Vec<HeatMapDevice> {
        let max_cells = max_cells.clamp(1, MAX_CELLS) as u64;
        let chunks = &self.pool.chunks;
        let mut by_slot: HashMap<(u32, u64), f32> = HashMap::new();
        let heat: HashMap<u64, f64> = chunks
            .heat
            .samples()
            .into_iter()
            .map(|h| (h.segment, h.hits))
            .collect();
        for (id, s) in chunks.segment_table() {
            let h = heat.get(&id).copied().unwrap_or(0.0) as f32;
            by_slot.insert((s.device, s.slot), h);
        }
        chunks
            .devices()
            .per_device_slots()
            .into_iter()
            .map(|(d, slots, _free)| {
                let per = slots.div_ceil(max_cells).max(1);
                let n = slots.div_ceil(per) as usize;
                let mut heat = vec![0f32; n];
                let mut segments = vec![0u32; n];
                for (&(dev, slot), &h) in &by_slot {
                    if dev != d.id() || slot >= slots {
                        continue;
                    }
                    let c = (slot / per) as usize;
                    heat[c] = heat[c].max(h);
                    segments[c] += 1;
                }
                HeatMapDevice {
                    id: d.id(),
                    class: d.class().to_string(),
                    role: d.role.to_string(),
                    slots,
                    slots_per_cell: per,
                    heat,
                    segments,
                }
            })
            .collect()
    }
}
