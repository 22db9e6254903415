//! Small writes into committed blocks without reading them first: the
//! bytes written are kept as a patch (disjoint byte ranges) over the block
//! below, and the committed block is read once, when the flush writes the
//! patched block (sorted by device offset), or when something needs the
//! whole block sooner. A 4 KiB random write into a large file so costs no
//! device read at write time, and many writes into one block cost one.

use std::collections::BTreeMap;

/// Bytes written over a block whose content was not read.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub struct Patch {
    /// Offset in the block -> bytes; disjoint and never adjacent.
    ranges: BTreeMap<u32, Vec<u8>>,
}

impl Patch {
    /// Writes `data` at `off` over what the patch holds. Returns the bytes
    /// held before and after.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within one record (record size <= 1 MiB, check_geometry)"
    )]
    pub fn write(&mut self, off: usize, data: &[u8]) -> (usize, usize) {
        let before = self.bytes();
        let (mut lo, mut hi) = (off, off + data.len());
        let touching: Vec<u32> = self
            .ranges
            .range(..=hi as u32)
            .rev()
            .take_while(|(&k, b)| k as usize + b.len() >= off)
            .map(|(&k, _)| k)
            .collect();
        for &k in &touching {
            lo = lo.min(k as usize);
            hi = hi.max(k as usize + self.ranges[&k].len());
        }
        let mut buf = vec![0u8; hi - lo];
        for k in touching {
            let b = self.ranges.remove(&k).expect("range listed");
            let at = k as usize - lo;
            buf[at..at + b.len()].copy_from_slice(&b);
        }
        buf[off - lo..off - lo + data.len()].copy_from_slice(data);
        self.ranges.insert(lo as u32, buf);
        (before, self.bytes())
    }

    /// Writes every range of `newer` over this one.
    pub fn write_all(&mut self, newer: &Patch) {
        for (&off, b) in &newer.ranges {
            self.write(off as usize, b);
        }
    }

    /// Puts the patch over `base` (the block below), which grows with zeros
    /// where a range starts past its end, as a write past the end does.
    pub fn apply(&self, base: &mut Vec<u8>) {
        for (&off, b) in &self.ranges {
            let (off, end) = (off as usize, off as usize + b.len());
            if base.len() < end {
                base.resize(end, 0);
            }
            base[off..end].copy_from_slice(b);
        }
    }

    /// The whole block when the patch covers its first `valid` bytes (all
    /// that can be read of it): nothing below matters then.
    pub fn whole(&self, valid: usize) -> Option<&Vec<u8>> {
        match self.ranges.first_key_value() {
            Some((0, b)) if b.len() >= valid => Some(b),
            _ => None,
        }
    }

    pub fn bytes(&self) -> usize {
        self.ranges.values().map(Vec::len).sum()
    }

    /// The end of the last range.
    pub fn end(&self) -> usize {
        self.ranges
            .last_key_value()
            .map_or(0, |(&k, b)| k as usize + b.len())
    }

    pub fn ranges(&self) -> impl Iterator<Item = (usize, &[u8])> {
        self.ranges.iter().map(|(&k, b)| (k as usize, b.as_slice()))
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod tests {
    use super::*;

    /// A patch over a base gives what writing each piece in order would.
    #[test]
    fn patches_match_writes_in_order() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for _ in 0..2000 {
            let base: Vec<u8> = (0..rng.gen_range(0..300)).map(|_| rng.gen()).collect();
            let mut want = base.clone();
            let mut p = Patch::default();
            for _ in 0..rng.gen_range(1..8) {
                let off = rng.gen_range(0..400);
                let data: Vec<u8> = (0..rng.gen_range(1..60)).map(|_| rng.gen()).collect();
                if want.len() < off + data.len() {
                    want.resize(off + data.len(), 0);
                }
                want[off..off + data.len()].copy_from_slice(&data);
                let (_, after) = p.write(off, &data);
                assert_eq!(after, p.bytes());
            }
            let mut got = base.clone();
            p.apply(&mut got);
            assert_eq!(got, want);
            let keys: Vec<_> = p.ranges().map(|(o, b)| (o, o + b.len())).collect();
            assert!(keys.windows(2).all(|w| w[0].1 < w[1].0), "{keys:?}");
        }
    }

    #[test]
    fn adjacent_writes_make_one_range_that_covers_the_block() {
        let mut p = Patch::default();
        for n in (0..16).rev() {
            p.write(n * 4096, &[n as u8; 4096]);
        }
        assert_eq!(p.ranges().count(), 1);
        let whole = p.whole(65536).expect("covers");
        assert_eq!(whole.len(), 65536);
        assert!(p.whole(65537).is_none());
    }
}
