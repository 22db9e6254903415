//! Reads on behalf of users (the filesystem's read path): they count as heat
//! for the tier mover and go through the caches. A chunk whose home is the
//! pool's fastest tier is read straight from it (zero-copy where possible);
//! a chunk on a slower tier is looked up in the RAM cache, then the SSD
//! cache, then read from home and offered to both. Verification, scrub and
//! moves use the plain reads of store.rs, which bypass all of this.

use crate::chunk::{unseal, verify_split, CHUNK_HEADER_LEN};
use crate::error::Result;
use crate::records::ChunkRec;
use crate::store::{corrupt, ChunkStore};
use std::sync::Arc;

impl ChunkStore {
    /// Reads a chunk's first `dst.len()` raw bytes into `dst`, verified.
    pub fn read_block_into(&self, rec: &ChunkRec, dst: &mut [u8]) -> Result<()> {
        self.heat.touch(rec.segment, rec.len as u64);
        if !self.on_slow_tier(rec) {
            return self.read_chunk_into(rec, dst);
        }
        let raw = self.read_slow(rec)?;
        if dst.len() > raw.len() {
            return Err(corrupt(rec, "read beyond the chunk's raw length".into()));
        }
        dst.copy_from_slice(&raw[..dst.len()]);
        Ok(())
    }

    /// Reads whole uncompressed chunks stored back to back in one segment
    /// with one device read (a run found by `is_run`), each into its
    /// buffer, verified. On any error nothing is trusted: the caller reads
    /// them one by one (which also handles moved and cached chunks).
    pub fn read_run_into(&self, run: &mut [(ChunkRec, &mut [u8])]) -> Result<()> {
        assert!(!run.is_empty());
        let mut heads = vec![[0u8; CHUNK_HEADER_LEN]; run.len()];
        {
            let _gate = self.io_gate.read();
            let (dev, at) = self.locate(&run[0].0)?;
            let mut bufs: Vec<&mut [u8]> = Vec::with_capacity(run.len() * 2);
            for (h, (_, dst)) in heads.iter_mut().zip(run.iter_mut()) {
                bufs.push(h);
                bufs.push(dst);
            }
            dev.read_iov_at(&mut bufs, at)?;
        }
        for (h, (rec, dst)) in heads.iter().zip(run.iter()) {
            let n = verify_split(h, dst, &rec.hash).map_err(|why| corrupt(rec, why))?;
            if n != rec.raw_len as usize {
                return Err(corrupt(rec, "raw length differs from record".into()));
            }
            self.heat.touch(rec.segment, rec.len as u64);
        }
        Ok(())
    }

    /// True if `next` can follow `prev` in a run for `read_run_into`: both
    /// whole, uncompressed, on the fastest tier, and adjacent in a segment.
    pub fn is_run(&self, prev: &ChunkRec, next: &ChunkRec) -> bool {
        let raw = |r: &ChunkRec| r.len as usize == CHUNK_HEADER_LEN + r.raw_len as usize;
        prev.segment == next.segment
            && prev.offset as u64 + prev.len as u64 == next.offset as u64
            && raw(prev)
            && raw(next)
            && !self.on_slow_tier(prev)
            && !self.on_slow_tier(next)
    }

    /// Reads a chunk's raw bytes, verified.
    pub fn read_block(&self, rec: &ChunkRec) -> Result<Vec<u8>> {
        let mut v = vec![0u8; rec.raw_len as usize];
        self.read_block_into(rec, &mut v)?;
        Ok(v)
    }

    /// True if the chunk's home is slower than the fastest tier and a
    /// cache is configured.
    fn on_slow_tier(&self, rec: &ChunkRec) -> bool {
        if self.ram_cache.read().is_none() && self.ssd_cache.read().is_none() {
            return false;
        }
        let Some(seg) = self.segment(rec.segment) else {
            return false;
        };
        self.devices
            .device(seg.device)
            .is_ok_and(|d| Some(d.class().rank()) > self.devices.fastest_tier_rank())
    }

    fn read_slow(&self, rec: &ChunkRec) -> Result<Arc<[u8]>> {
        let key = (rec.segment, rec.offset);
        if let Some(raw) = self.ram_cache.read().as_ref().and_then(|c| c.get(key)) {
            return Ok(raw);
        }
        let ssd = self.ssd_cache.read().clone();
        let cached = ssd
            .as_ref()
            .and_then(|c| c.lookup(key, |buf| unseal(buf, &rec.hash, false).ok()));
        let raw: Arc<[u8]> = match cached {
            Some(raw) => raw.into(),
            None => {
                let sealed = self.read_sealed(rec)?;
                let raw = unseal(&sealed, &rec.hash, false).map_err(|why| corrupt(rec, why))?;
                if let Some(c) = &ssd {
                    if self.home_slower_than(rec, c.device().class().rank()) {
                        c.offer(key, &sealed);
                    }
                }
                raw.into()
            }
        };
        if raw.len() != rec.raw_len as usize {
            return Err(corrupt(rec, "raw length differs from record".into()));
        }
        if let Some(c) = self.ram_cache.read().as_ref() {
            c.insert(key, raw.clone());
        }
        Ok(raw)
    }

    fn home_slower_than(&self, rec: &ChunkRec, rank: u8) -> bool {
        self.segment(rec.segment)
            .and_then(|s| self.devices.device(s.device).ok())
            .is_some_and(|d| d.class().rank() > rank)
    }
}
