//! Which segment slots of one device are in use. Rebuilt at mount from the
//! segment table (the single source of truth), so it is never stored.

#[derive(Debug, Clone)]
pub struct SpaceMap {
    used: Vec<u64>,
    slots: u64,
    free: u64,
    /// Search starts here: allocation is next-fit, which keeps new segments
    /// roughly sequential on the device.
    cursor: u64,
}

impl SpaceMap {
    #[allow(
        clippy::cast_possible_truncation,
        reason = "words of a bitmap held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    pub fn new(slots: u64) -> Self {
        SpaceMap {
            used: vec![0; slots.div_ceil(64) as usize],
            slots,
            free: slots,
            cursor: 0,
        }
    }

    pub fn slots(&self) -> u64 {
        self.slots
    }

    pub fn free_slots(&self) -> u64 {
        self.free
    }

    pub fn is_used(&self, slot: u64) -> bool {
        assert!(slot < self.slots, "slot {slot} out of range {}", self.slots);
        self.used[(slot / 64) as usize] & (1 << (slot % 64)) != 0
    }

    /// Marks a slot used. Returns false if it already was (a double use).
    pub fn mark_used(&mut self, slot: u64) -> bool {
        if self.is_used(slot) {
            return false;
        }
        // A clear bit is a free slot the count knows of.
        assert!(self.free > 0, "slot {slot} is free but the free count is 0");
        self.used[(slot / 64) as usize] |= 1 << (slot % 64);
        self.free -= 1;
        true
    }

    /// Frees a used slot. Returns false, changing nothing, if it was free
    /// (a slot freed twice: the caller's bug, which it reports).
    pub fn release(&mut self, slot: u64) -> bool {
        if !self.is_used(slot) {
            return false;
        }
        assert!(
            self.free < self.slots,
            "slot {slot} is used but the free count says none is"
        );
        self.used[(slot / 64) as usize] &= !(1 << (slot % 64));
        self.free += 1;
        true
    }

    /// Allocates a free slot, next-fit from the cursor.
    pub fn allocate(&mut self) -> Option<u64> {
        if self.free == 0 {
            return None;
        }
        for i in 0..self.slots {
            let slot = (self.cursor + i) % self.slots;
            if !self.is_used(slot) {
                let marked = self.mark_used(slot);
                assert!(marked, "slot {slot} was free a moment ago");
                self.cursor = slot + 1;
                return Some(slot);
            }
        }
        unreachable!("free count says a slot is free");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_release_cycle() {
        let mut m = SpaceMap::new(130);
        let mut got = Vec::new();
        while let Some(s) = m.allocate() {
            got.push(s);
        }
        assert_eq!(got.len(), 130);
        assert_eq!(m.free_slots(), 0);
        assert!(m.release(77));
        assert!(!m.release(77), "a slot freed twice is refused");
        assert_eq!(m.free_slots(), 1, "and not counted twice");
        assert_eq!(m.allocate(), Some(77));
        assert!(!m.mark_used(77));
    }
}
