//! Heat of segments: how often and how recently each was read, the input of
//! the tier mover. The unit is the segment (4 MiB by default, set at mkfs):
//! it is what the mover can move by changing one segment-table entry, and a
//! log-structured segment holds blocks written together, which tend to be
//! read together. A read costs two relaxed atomic updates under a shared
//! lock, never a metadata write. Hits decay exponentially (the mover calls
//! `decay` each round), so heat reflects both frequency and recency. The
//! table is saved to POOL/heat (versioned, checksummed) at each mover round
//! and at unmount, and loaded at mount; a missing or bad file means cold.
//! One hit is one segment's worth of bytes read: reading a whole segment
//! once counts 1 whatever the block size, so "hot" means re-read, not
//! merely read sequentially once.

use crate::error::{DataError, Result};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

const MAGIC: &[u8; 8] = b"CAIRNHT2";
/// Fixed-point scale of hit counts.
const ONE: u64 = 1 << 16;
const ENTRY: usize = 20;

#[derive(Debug, Default)]
struct SegHeat {
    /// Decayed hit count, in 1/ONE hits.
    hits: AtomicU64,
    /// Unix seconds of the last read.
    last: AtomicU32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeatSample {
    pub segment: u64,
    /// Decayed number of reads.
    pub hits: f64,
    /// Seconds since the last read.
    pub idle_secs: u64,
}

/// A segment with no hits left is forgotten once idle this long.
const FORGET_SECS: u32 = 86_400;

#[derive(Debug)]
pub struct Heat {
    map: RwLock<HashMap<u64, SegHeat>>,
    segment_size: u64,
}

fn now_secs() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
}

impl Heat {
    pub fn new(segment_size: u64) -> Self {
        assert!(segment_size > 0, "segment size 0");
        Heat {
            map: RwLock::new(HashMap::new()),
            segment_size,
        }
    }

    /// Counts a read of `bytes` from a segment.
    pub fn touch(&self, segment: u64, bytes: u64) {
        let now = now_secs();
        let add = (bytes * ONE / self.segment_size).max(1);
        {
            let m = self.map.read();
            if let Some(h) = m.get(&segment) {
                h.hits.fetch_add(add, Ordering::Relaxed);
                h.last.store(now, Ordering::Relaxed);
                return;
            }
        }
        let mut m = self.map.write();
        let h = m.entry(segment).or_default();
        h.hits.fetch_add(add, Ordering::Relaxed);
        h.last.store(now, Ordering::Relaxed);
    }

    /// Notes that new data was just written to a segment: it counts as
    /// accessed now, without a hit.
    pub fn written(&self, segment: u64) {
        let now = now_secs();
        if let Some(h) = self.map.read().get(&segment) {
            h.last.store(now, Ordering::Relaxed);
            return;
        }
        self.map
            .write()
            .entry(segment)
            .or_default()
            .last
            .store(now, Ordering::Relaxed);
    }

    /// Gives `to` the share `fraction` of `from`'s hits (chunks moved by
    /// reblock or GC keep their heat in their new segment).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "an f64 to u64 `as` saturates; hits times a fraction in 0..=1"
    )]
    pub fn carry(&self, from: u64, to: u64, fraction: f64) {
        let mut m = self.map.write();
        let Some(src) = m.get(&from) else {
            return;
        };
        let add = (src.hits.load(Ordering::Relaxed) as f64 * fraction.clamp(0.0, 1.0)) as u64;
        let last = src.last.load(Ordering::Relaxed);
        if add == 0 {
            return;
        }
        let dst = m.entry(to).or_default();
        dst.hits.fetch_add(add, Ordering::Relaxed);
        dst.last.fetch_max(last, Ordering::Relaxed);
    }

    /// Multiplies every hit count by `factor` (0..=1) and forgets segments
    /// that no longer exist or cooled to nothing and were not accessed for
    /// `FORGET_SECS`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "an f64 to u64 `as` saturates; hits times a decay factor below 1"
    )]
    pub fn decay(&self, factor: f64, exists: impl Fn(u64) -> bool) {
        assert!((0.0..=1.0).contains(&factor), "decay factor {factor}");
        let now = now_secs();
        let mut m = self.map.write();
        m.retain(|&seg, h| {
            let v = (h.hits.load(Ordering::Relaxed) as f64 * factor) as u64;
            h.hits.store(v, Ordering::Relaxed);
            let idle = now.saturating_sub(h.last.load(Ordering::Relaxed));
            (v > 0 || idle < FORGET_SECS) && exists(seg)
        });
    }

    pub fn get(&self, segment: u64) -> HeatSample {
        let m = self.map.read();
        sample(segment, m.get(&segment), now_secs())
    }

    /// Every segment with heat.
    pub fn samples(&self) -> Vec<HeatSample> {
        let now = now_secs();
        let m = self.map.read();
        m.iter().map(|(&s, h)| sample(s, Some(h), now)).collect()
    }

    /// Saves the table (`encode`), replacing the file atomically.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        cairn_devices::private::write_private(&tmp, &self.encode())?;
        std::fs::rename(&tmp, path)
    }

    /// The saved table: magic, entries of segment u64 | hits u64 (1/65536
    /// units) | last read u32 unix secs, crc32c.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        for (&s, h) in self.map.read().iter() {
            b.extend_from_slice(&s.to_le_bytes());
            b.extend_from_slice(&h.hits.load(Ordering::Relaxed).to_le_bytes());
            b.extend_from_slice(&h.last.load(Ordering::Relaxed).to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Loads a saved table; a missing or damaged file gives an empty one.
    pub fn load(path: &Path, segment_size: u64) -> Heat {
        // Type-checked and bounded (a symlink to /dev/zero is not read on).
        let b = match cairn_devices::private::read_small(path, 1 << 30) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Heat::new(segment_size),
            Err(e) => {
                tracing::warn!("{}: ignored: {e}", path.display());
                return Heat::new(segment_size);
            }
        };
        Heat::decode(&b, segment_size).unwrap_or_else(|e| {
            tracing::warn!("{}: ignored: {e}", path.display());
            Heat::new(segment_size)
        })
    }

    /// Decodes a table `encode` wrote.
    pub fn decode(b: &[u8], segment_size: u64) -> Result<Heat> {
        let bad = |why: &str| DataError::BadRecord {
            what: "heat table",
            why: why.into(),
        };
        if b.len() < 12 || &b[..8] != MAGIC || !(b.len() - 12).is_multiple_of(ENTRY) {
            return Err(bad("not a heat table, or a torn one"));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body).to_le_bytes() != crc {
            return Err(bad("checksum mismatch"));
        }
        let heat = Heat::new(segment_size);
        let mut m = heat.map.write();
        for e in body[8..].chunks_exact(ENTRY) {
            let seg =
                u64::from_le_bytes(e[..8].try_into().expect("slice length matches the array"));
            let h = SegHeat::default();
            h.hits.store(
                u64::from_le_bytes(e[8..16].try_into().expect("slice length matches the array")),
                Ordering::Relaxed,
            );
            h.last.store(
                u32::from_le_bytes(e[16..].try_into().expect("slice length matches the array")),
                Ordering::Relaxed,
            );
            m.insert(seg, h);
        }
        drop(m);
        Ok(heat)
    }
}

fn sample(segment: u64, h: Option<&SegHeat>, now: u32) -> HeatSample {
    match h {
        Some(h) => HeatSample {
            segment,
            hits: h.hits.load(Ordering::Relaxed) as f64 / ONE as f64,
            idle_secs: now.saturating_sub(h.last.load(Ordering::Relaxed)) as u64,
        },
        None => HeatSample {
            segment,
            hits: 0.0,
            idle_secs: u64::MAX,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touch_decay_save_load() {
        let h = Heat::new(1 << 20);
        for _ in 0..40 {
            h.touch(5, 256 << 10);
        }
        h.touch(6, 1);
        assert_eq!(h.get(5).hits, 10.0, "40 quarter-segment reads are 10 hits");
        assert!(h.get(5).idle_secs < 2);
        assert_eq!(h.get(7).hits, 0.0);
        h.carry(5, 8, 0.25);
        assert_eq!(h.get(8).hits, 2.5, "a quarter of segment 5's heat moved");
        h.carry(7, 9, 1.0);
        assert_eq!(h.get(9).hits, 0.0, "a cold segment carries nothing");
        h.written(10);
        assert_eq!((h.get(10).hits, h.get(10).idle_secs < 2), (0.0, true));
        h.decay(0.5, |s| s != 6 && s != 8);
        assert!(h.get(10).idle_secs < 2, "a segment just written is kept");
        assert_eq!(h.get(5).hits, 5.0);
        assert_eq!(h.get(6).hits, 0.0, "segment 6 no longer exists");
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("heat");
        h.save(&p).unwrap();
        assert_eq!(Heat::load(&p, 1 << 20).get(5).hits, 5.0);
        let mut b = std::fs::read(&p).unwrap();
        b[9] ^= 1;
        std::fs::write(&p, b).unwrap();
        assert_eq!(
            Heat::load(&p, 1 << 20).get(5).hits,
            0.0,
            "damaged file must load cold"
        );
    }
}
