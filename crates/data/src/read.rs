//! Reads on behalf of users (the filesystem's read path): they count as heat
//! for the tier mover and go through the caches. A chunk on a fast home is
//! read straight from it (zero-copy where possible); a chunk homed on a
//! slower tier or a hard disk is looked up in the RAM cache, then the SSD
//! cache (if its home is slower than the cache device), then read from home
//! and offered to both; from a hard disk, a read that continues a
//! sequential stream fetches the chunks after it too (planned by
//! `readahead.rs`, read here: `read_sealed_ahead`).
//! Verification, scrub and moves use the plain reads of store.rs, which
//! bypass all of this.

use crate::aligned::{cached, read_direct};
use crate::chunk::{verify_split, CHUNK_HEADER_LEN};
use crate::error::Result;
use crate::readahead::{chunks_in, Plan, Readahead};
use crate::records::{corrupt, ChunkRec};
use crate::store::ChunkStore;
use cairn_devices::{DeviceClass, SsdCache};
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

    /// Reads raw bytes `from..from + dst.len()` of a chunk into `dst`,
    /// verified: from a fast home, only the 4 KiB spans they touch when
    /// the chunk has sums (`read_chunk_part_into`); from a slow one, the
    /// whole chunk through the caches.
    pub fn read_part_into(&self, rec: &ChunkRec, from: usize, dst: &mut [u8]) -> Result<()> {
        if from == 0 && dst.len() == rec.raw_len as usize {
            return self.read_block_into(rec, dst);
        }
        self.heat.touch(rec.segment, dst.len() as u64);
        if !self.on_slow_tier(rec) {
            return self.read_chunk_part_into(rec, from, dst);
        }
        let raw = self.read_slow(rec)?;
        let src = raw
            .get(from..from + dst.len())
            .ok_or_else(|| corrupt(rec, "read beyond the chunk's raw length".into()))?;
        dst.copy_from_slice(src);
        Ok(())
    }

    /// Reads whole uncompressed chunks stored back to back in one segment
    /// with one device read (a run found by `is_run`), each into its
    /// buffer, verified. On any error nothing is trusted: the caller reads
    /// them one by one (which also handles moved and cached chunks).
    pub fn read_run_into(&self, run: &mut [(ChunkRec, &mut [u8])]) -> Result<()> {
        assert!(!run.is_empty());
        // The chunks lie back to back (`is_run`) and each buffer is its
        // chunk's raw bytes.
        debug_assert!(
            run.windows(2).all(|w| {
                let (a, b) = (&w[0].0, &w[1].0);
                a.segment == b.segment && a.offset as u64 + a.len as u64 == b.offset as u64
            }) && run.iter().all(|(r, d)| d.len() == r.raw_len as usize),
            "a run read of chunks that do not follow each other"
        );
        if self.read_run_direct(run)? {
            return Ok(());
        }
        if self.is_span_sealed(&run[0].0) {
            return self.read_sealed_run(run);
        }
        // One read lands header after data after header: each chunk is
        // stored raw.
        let mut heads = vec![[0u8; CHUNK_HEADER_LEN]; run.len()];
        {
            let _gate = self.segs.io_gate.read();
            let (dev, at) = self.segs.locate(&run[0].0)?;
            let mut bufs: Vec<&mut [u8]> = Vec::with_capacity(run.len() * 2);
            for (h, (_, dst)) in heads.iter_mut().zip(run.iter_mut()) {
                bufs.push(h);
                bufs.push(dst);
            }
            dev.read_iov_at(&mut bufs, at)?;
        }
        for (h, (rec, dst)) in heads.iter().zip(run.iter()) {
            self.check_run_member(rec, h, dst)?;
        }
        Ok(())
    }

    /// Checks one chunk of a run read (its header and raw bytes) against
    /// its record, and counts the read as heat.
    fn check_run_member(&self, rec: &ChunkRec, head: &[u8], raw: &[u8]) -> Result<()> {
        let n = verify_split(head, raw, &rec.hash).map_err(|why| corrupt(rec, why.to_string()))?;
        if n != rec.raw_len as usize {
            return Err(corrupt(rec, "raw length differs from record".into()));
        }
        self.heat.touch(rec.segment, rec.len as u64);
        Ok(())
    }

    /// `read_run_into` with one direct read of the run's aligned byte range
    /// into this thread's bounce buffer, each chunk checked (or opened)
    /// there and its data copied out. False (nothing done) when the device
    /// cannot do direct I/O.
    fn read_run_direct(&self, run: &mut [(ChunkRec, &mut [u8])]) -> Result<bool> {
        if cached(run[0].0.raw_len) {
            return Ok(false);
        }
        let total: usize = run.iter().map(|(r, _)| r.len as usize).sum();
        let _gate = self.segs.io_gate.read();
        let (dev, at) = self.segs.locate(&run[0].0)?;
        let done = read_direct(&dev, at, total, |buf| self.unpack_run(run, buf))?;
        Ok(done.is_some())
    }

    /// Each chunk of `run` from `buf`, the run's stored bytes: checked and
    /// copied out (stored raw), or opened (sealed span by span).
    fn unpack_run(&self, run: &mut [(ChunkRec, &mut [u8])], buf: &[u8]) -> Result<()> {
        let mut p = 0;
        for (rec, dst) in run.iter_mut() {
            let chunk = &buf[p..p + rec.len as usize];
            p += rec.len as usize;
            if self.is_span_sealed(rec) {
                self.open_into(rec, chunk, dst)?;
                continue;
            }
            let (h, raw) = chunk.split_at(CHUNK_HEADER_LEN);
            self.check_run_member(rec, h, raw)?;
            if dst.len() != raw.len() {
                return Err(corrupt(rec, "raw length differs from record".into()));
            }
            dst.copy_from_slice(raw);
        }
        Ok(())
    }

    /// `read_run_into` of chunks sealed span by span, buffered: one read
    /// of the run, each chunk opened from it.
    fn read_sealed_run(&self, run: &mut [(ChunkRec, &mut [u8])]) -> Result<()> {
        let total: usize = run.iter().map(|(r, _)| r.len as usize).sum();
        let mut buf = vec![0u8; total];
        {
            let _gate = self.segs.io_gate.read();
            let (dev, at) = self.segs.locate(&run[0].0)?;
            dev.read_at(&mut buf, at)?;
        }
        self.unpack_run(run, &buf)
    }

    /// True if `next` can follow `prev` in a run for `read_run_into`: both
    /// whole, uncompressed (stored raw, or sealed span by span: both of
    /// one kind), on the fastest tier, and adjacent in a segment.
    pub fn is_run(&self, prev: &ChunkRec, next: &ChunkRec) -> bool {
        // Stored raw (Some(false)), sealed span by span (Some(true)), or
        // neither (None: read alone).
        let kind = |r: &ChunkRec| match r.len as usize == CHUNK_HEADER_LEN + r.raw_len as usize {
            true => Some(false),
            false => self.is_span_sealed(r).then_some(true),
        };
        prev.segment == next.segment
            && prev.offset as u64 + prev.len as u64 == next.offset as u64
            && kind(prev).is_some()
            && kind(prev) == kind(next)
            && !self.on_slow_tier(prev)
            && !self.on_slow_tier(next)
    }

    /// Reads a chunk's raw bytes, verified.
    pub fn read_block(&self, rec: &ChunkRec) -> Result<Vec<u8>> {
        let mut v = vec![0u8; rec.raw_len as usize];
        self.read_block_into(rec, &mut v)?;
        Ok(v)
    }

    /// True if a read of this chunk goes through the caches: its home is
    /// slower than the fastest tier or is a hard disk (RAM cache), or
    /// slower than the SSD cache device.
    fn on_slow_tier(&self, rec: &ChunkRec) -> bool {
        let ram = self.ram_cache.read().is_some();
        let ssd = self
            .ssd_cache
            .read()
            .as_ref()
            .map(|c| c.device().class().rank());
        if !ram && ssd.is_none() {
            return false;
        }
        let Some(rank) = self.home_rank(rec) else {
            return false;
        };
        let fastest = self.segs.devices.fastest_tier_rank().unwrap_or(0);
        (ram && (rank > fastest || rank >= DeviceClass::Hdd.rank()))
            || ssd.is_some_and(|c| rank > c)
    }

    /// Class rank of the device a chunk lives on.
    fn home_rank(&self, rec: &ChunkRec) -> Option<u8> {
        let seg = self.segment(rec.segment)?;
        self.segs
            .devices
            .device(seg.device)
            .ok()
            .map(|d| d.class().rank())
    }

    /// The raw bytes of `rec` from the RAM cache, if there.
    fn in_ram(&self, rec: &ChunkRec) -> Option<Arc<[u8]>> {
        let ram = self.ram_cache.read();
        ram.as_ref()
            .and_then(|c| c.get((rec.segment, rec.offset), &rec.hash))
    }

    fn read_slow(&self, rec: &ChunkRec) -> Result<Arc<[u8]>> {
        let key = (rec.segment, rec.offset);
        if let Some(raw) = self.in_ram(rec) {
            return Ok(raw);
        }
        let ssd = self.ssd_cache.read().clone();
        let cached = ssd
            .as_ref()
            .and_then(|c| c.lookup(key, |buf| self.codec.unseal(buf, &rec.hash, false).ok()));
        let raw: Arc<[u8]> = match cached {
            Some(raw) => raw.into(),
            None => {
                let first = self.read_home(rec, ssd.as_deref());
                self.or_heal(rec, first, |sealed| {
                    Ok(self.raw_of(rec, sealed, false)?.into())
                })?
            }
        };
        if raw.len() != rec.raw_len as usize {
            return Err(corrupt(rec, "raw length differs from record".into()));
        }
        if let Some(c) = self.ram_cache.read().as_ref() {
            c.insert(key, rec.hash, raw.clone());
        }
        Ok(raw)
    }

    /// Reads `rec` from its home device (with read-ahead from a hard disk)
    /// and offers what it read to the SSD cache if the home is slower.
    fn read_home(&self, rec: &ChunkRec, ssd: Option<&SsdCache>) -> Result<Arc<[u8]>> {
        let home = self.home_rank(rec);
        let offer = |r: &ChunkRec, sealed: &[u8]| match ssd {
            Some(c) if home > Some(c.device().class().rank()) => {
                c.offer((r.segment, r.offset), sealed)
            }
            _ => {}
        };
        // Hard disks and object stores: a sequential stream reads a window
        // (one seek, or one ranged GET, per window instead of per chunk).
        let ahead = match home >= Some(DeviceClass::Hdd.rank()) {
            true => self.read_sealed_ahead(rec, &offer)?,
            false => Some(self.segs.read_sealed(rec)?),
        };
        let sealed = match ahead {
            Some(sealed) => sealed,
            None => match self.in_ram(rec) {
                Some(raw) => return Ok(raw),
                None => self.segs.read_sealed(rec)?,
            },
        };
        let raw = (self.codec.unseal(&sealed, &rec.hash, false))
            .map_err(|why| corrupt(rec, why.to_string()))?;
        offer(rec, &sealed);
        Ok(raw.into())
    }
}

/// Segments after a sequential stream's that its home is asked to fetch.
const AHEAD_SEGMENTS: u64 = 2;

/// Read-ahead from hard disks (the planner is `readahead.rs`).
impl ChunkStore {
    /// Sets the read-ahead window for sequential reads from hard disks.
    pub fn set_readahead(&self, bytes: u32) {
        *self.readahead.write() = Arc::new(Readahead::new(bytes));
    }

    /// Reads `rec` from a hard disk home, with the chunks after it when it
    /// continues a sequential stream (see readahead.rs). Returns the
    /// sealed chunk of `rec`, unverified (the caller verifies it against
    /// the record); the others are in the RAM cache and offered to `offer`.
    /// None: a window that covered `rec` was just read by another thread;
    /// look in the RAM cache again.
    pub(crate) fn read_sealed_ahead(
        &self,
        rec: &ChunkRec,
        offer: &dyn Fn(&ChunkRec, &[u8]),
    ) -> Result<Option<Vec<u8>>> {
        let ra = self.readahead.read().clone();
        if self.ram_cache.read().is_none() {
            return self.segs.read_sealed(rec).map(Some);
        }
        let window = match ra.plan(rec) {
            Plan::Single => return self.segs.read_sealed(rec).map(Some),
            Plan::Wait => {
                ra.wait(rec.segment);
                return Ok(None);
            }
            Plan::Window(w) => w,
        };
        if rec.offset > 0 {
            self.hint_next_segment(rec.segment);
        }
        let got = self.read_window(rec, window, offer);
        let end = got.as_ref().map_or(rec.offset, |(_, end)| *end);
        ra.done(rec.segment, end);
        got.map(|(sealed, _)| Some(sealed))
    }

    /// A sequential stream goes on in `segment` (a window that continues
    /// it): chunks written together fill segments in order, so the stream
    /// most likely goes on in the next one. Its home is asked to start
    /// fetching it (an object store fetches the next object while this one
    /// is read; other homes ignore the hint).
    fn hint_next_segment(&self, segment: u64) {
        for next in segment + 1..=segment + AHEAD_SEGMENTS {
            if self.segs.is_open(next) {
                return;
            }
            let Some(seg) = self.segment(next) else {
                return;
            };
            let Ok(dev) = self.segs.devices.device(seg.device) else {
                return;
            };
            if dev.class().rank() >= DeviceClass::Hdd.rank() {
                dev.will_need(dev.slot_offset(seg.slot), seg.used as u64);
            }
        }
    }

    /// Reads up to `window` bytes of `rec`'s segment from `rec` on, caches
    /// and offers the chunks after it; returns `rec`'s sealed bytes and
    /// where the last whole chunk read ends.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "positions and lengths within a window of a segment, which is at most a u32 in size (read into a buffer of a u32 length)"
    )]
    fn read_window(
        &self,
        rec: &ChunkRec,
        window: u32,
        offer: &dyn Fn(&ChunkRec, &[u8]),
    ) -> Result<(Vec<u8>, u32)> {
        let used = self.segment(rec.segment).map_or(0, |s| s.used);
        let len = window.min(used.saturating_sub(rec.offset)).max(rec.len);
        let mut buf = vec![0u8; len as usize];
        {
            let _gate = self.segs.io_gate.read();
            let (dev, at) = self.segs.locate(rec)?;
            dev.read_at(&mut buf, at)?;
        }
        let mut end = rec.offset + rec.len;
        for (pos, h) in chunks_in(&buf).into_iter().skip(1) {
            let sealed = &buf[pos..pos + CHUNK_HEADER_LEN + h.stored_len as usize];
            let Ok(raw) = self.codec.unseal(sealed, &h.hash, false) else {
                break;
            };
            let next = ChunkRec {
                offset: rec.offset + pos as u32,
                len: sealed.len() as u32,
                raw_len: h.raw_len,
                hash: h.hash,
                sums: Vec::new(),
                ..rec.clone()
            };
            if let Some(c) = self.ram_cache.read().as_ref() {
                c.insert((next.segment, next.offset), h.hash, raw.into());
            }
            offer(&next, sealed);
            end = next.offset + next.len;
        }
        buf.truncate(rec.len as usize);
        Ok((buf, end))
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod tests {
    use crate::chunk::hash_block;
    use crate::compress::Compression;
    use crate::records::ChunkRec;
    use crate::{ChunkStore, DataError};
    use cairn_devices::{Device, DeviceClass, DeviceSet, DeviceSpec};
    use std::sync::Arc;

    /// A store on one SSD (no caches) holding a 64 KiB block of random
    /// bytes and a compressible one.
    fn store(dir: &std::path::Path) -> (ChunkStore, Vec<u8>, ChunkRec, ChunkRec) {
        let spec = DeviceSpec::tier(DeviceClass::Ssd, dir.join("d"), Some(33 << 20));
        let d = Device::create(&spec, 0, [0; 16], 4 << 20).unwrap();
        let s = ChunkStore::new(Arc::new(DeviceSet::new(vec![d]).unwrap()), vec![], 1).unwrap();
        s.set_compression(Compression::Lz4);
        let mut x = 0x9e3779b97f4a7c15u64;
        let random: Vec<u8> = (0..65536)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let plain = vec![7u8; 65536];
        let mut b = s.batch();
        let r = b.append(&random, &hash_block(&random)).unwrap();
        let p = b.append(&plain, &hash_block(&plain)).unwrap();
        b.finish().unwrap();
        (s, random, r, p)
    }

    fn read_bytes(s: &ChunkStore) -> u64 {
        s.devices().devices().iter().map(|d| d.read_bytes()).sum()
    }

    fn part(
        s: &ChunkStore,
        rec: &ChunkRec,
        from: usize,
        len: usize,
    ) -> crate::error::Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        s.read_part_into(rec, from, &mut v).map(|_| v)
    }

    #[test]
    fn a_small_read_reads_and_verifies_only_its_spans() {
        let dir = tempfile::tempdir().unwrap();
        let (s, random, r, p) = store(dir.path());
        assert!(r.has_sums(), "a raw chunk carries sums");
        assert!(p.sums.is_empty(), "a compressed one does not");
        for (from, len) in [(8192, 4096), (8292, 3000), (61440, 4096), (100, 5000)] {
            let before = read_bytes(&s);
            assert_eq!(part(&s, &r, from, len).unwrap(), random[from..from + len]);
            // The spans touched, widened to whole device blocks (a chunk's
            // bytes start 56 bytes into a block) for a direct read.
            let read = read_bytes(&s) - before;
            assert!(read <= 8192 + 4096, "{read} bytes read for {len} at {from}");
        }
        assert_eq!(part(&s, &p, 1000, 4096).unwrap(), vec![7u8; 4096]);
        // A record without sums (written by an older version) reads whole.
        let old = ChunkRec {
            sums: Vec::new(),
            ..r.clone()
        };
        let before = read_bytes(&s);
        assert_eq!(part(&s, &old, 8192, 4096).unwrap(), random[8192..12288]);
        assert!(read_bytes(&s) - before >= 65536);
    }

    #[test]
    fn a_damaged_span_fails_its_reads_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let (s, random, r, _) = store(dir.path());
        let seg = s.segment(r.segment).unwrap();
        let dev = s.devices().device(seg.device).unwrap();
        let at = dev.slot_offset(seg.slot) + r.offset as u64;
        // Byte 40000 of the raw bytes lies in span 9.
        let bad = at + crate::CHUNK_HEADER_LEN as u64 + 40000;
        dev.write_at(&[random[40000] ^ 0x20], bad).unwrap();
        assert_eq!(part(&s, &r, 8192, 4096).unwrap(), random[8192..12288]);
        assert_eq!(part(&s, &r, 40960, 4096).unwrap(), random[40960..45056]);
        for (from, len) in [(36864, 4096), (39000, 2000), (30000, 12000)] {
            let e = part(&s, &r, from, len).unwrap_err();
            assert!(matches!(e, DataError::Corrupt { .. }), "{e}");
        }
        assert!(s.read_block(&r).is_err(), "the whole chunk fails too");
        assert!(part(&s, &r, 60000, 6000).is_err(), "beyond the chunk");
    }

    /// A store of an encrypted pool holding four 64 KiB random blocks
    /// written back to back (each sealed span by span).
    fn encrypted_store(dir: &std::path::Path) -> (ChunkStore, Vec<Vec<u8>>, Vec<ChunkRec>) {
        use cairn_crypt::{DataKey, PoolKeys};
        let spec = DeviceSpec::tier(DeviceClass::Ssd, dir.join("d"), Some(33 << 20));
        let d = Device::create(&spec, 0, [0; 16], 4 << 20).unwrap();
        let mut s = ChunkStore::new(Arc::new(DeviceSet::new(vec![d]).unwrap()), vec![], 1).unwrap();
        let keys = Arc::new(PoolKeys::derive(
            &DataKey::random(),
            cairn_crypt::Cipher::Xaes256Gcm,
        ));
        s.set_codec(crate::ChunkCodec::encrypted(keys));
        let mut x = 0x2545f4914f6cdd1du64;
        let blocks: Vec<Vec<u8>> = (0..4)
            .map(|_| {
                (0..65536)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x.to_le_bytes()[0]
                    })
                    .collect()
            })
            .collect();
        let mut b = s.batch();
        let recs: Vec<ChunkRec> = (blocks.iter())
            .map(|x| b.append(x, &s.codec.hash(x)).unwrap())
            .collect();
        b.finish().unwrap();
        (s, blocks, recs)
    }

    #[test]
    fn span_sealed_chunks_read_in_runs_and_in_parts_and_damage_fails_only_its_span() {
        let dir = tempfile::tempdir().unwrap();
        let (s, blocks, recs) = encrypted_store(dir.path());
        assert!(recs.windows(2).all(|w| s.is_run(&w[0], &w[1])), "one run");
        let read_run = |s: &ChunkStore| {
            let mut out = vec![vec![0u8; 65536]; 4];
            let mut run: Vec<(ChunkRec, &mut [u8])> = (recs.iter().cloned())
                .zip(out.iter_mut().map(Vec::as_mut_slice))
                .collect();
            s.read_run_into(&mut run).map(|()| out)
        };
        assert_eq!(read_run(&s).unwrap(), blocks);
        assert_eq!(
            part(&s, &recs[2], 5000, 100).unwrap(),
            blocks[2][5000..5100]
        );
        // A bit of chunk 2's span 3 flipped: the run read fails (its
        // caller then reads chunk by chunk), and so do the reads of that
        // span; the chunk's other spans and the other chunks read exact.
        let seg = s.segment(recs[2].segment).unwrap();
        let dev = s.devices().device(seg.device).unwrap();
        let span3 = 3 * (4096 + cairn_crypt::OVERHEAD) + 100;
        let at = dev.slot_offset(seg.slot)
            + (recs[2].offset as usize + crate::CHUNK_HEADER_LEN + span3) as u64;
        let mut byte = [0u8];
        dev.read_at(&mut byte, at).unwrap();
        dev.write_at(&[byte[0] ^ 0x01], at).unwrap();
        assert!(read_run(&s).is_err(), "a run with a damaged chunk");
        let e = part(&s, &recs[2], 3 * 4096 + 10, 50).unwrap_err();
        assert!(matches!(e, DataError::Corrupt { .. }), "{e}");
        assert_eq!(
            part(&s, &recs[2], 8192, 4096).unwrap(),
            blocks[2][8192..12288]
        );
        assert_eq!(s.read_block(&recs[1]).unwrap(), blocks[1]);
        assert!(s.read_block(&recs[2]).is_err(), "the whole chunk fails");
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod readahead_tests {
    use crate::chunk::hash_block;
    use crate::compress::Compression;
    use crate::records::ChunkRec;
    use crate::ChunkStore;
    use cairn_devices::{Device, DeviceClass, DeviceSet, DeviceSpec};
    use std::sync::Arc;

    /// A store on one hard disk (4 MiB segments) with a RAM cache and
    /// 1 MiB read-ahead, holding 48 blocks of 64 KiB written in order (every
    /// third one compressible); returns the store, blocks and records.
    fn disk_store(dir: &std::path::Path) -> (ChunkStore, Vec<Vec<u8>>, Vec<ChunkRec>) {
        let spec = DeviceSpec::tier(DeviceClass::Hdd, dir.join("d"), Some(33 << 20));
        let d = Device::create(&spec, 0, [0; 16], 4 << 20).unwrap();
        let s = ChunkStore::new(Arc::new(DeviceSet::new(vec![d]).unwrap()), vec![], 1).unwrap();
        s.set_compression(Compression::Lz4);
        let blocks: Vec<Vec<u8>> = (0..48u32)
            .map(|i| {
                (0..65536u32)
                    .map(|j| {
                        if i % 3 == 0 {
                            (j / 512) as u8
                        } else {
                            (j.wrapping_mul(2654435761) ^ i) as u8
                        }
                    })
                    .collect()
            })
            .collect();
        let mut b = s.batch();
        let recs = blocks
            .iter()
            .map(|x| b.append(x, &hash_block(x)).unwrap())
            .collect();
        b.finish().unwrap();
        s.set_ram_cache(64 << 20);
        s.set_readahead(1 << 20);
        (s, blocks, recs)
    }

    fn reads(s: &ChunkStore) -> u64 {
        s.devices().devices().iter().map(|d| d.read_ops()).sum()
    }

    #[test]
    fn sequential_reads_fetch_windows_random_reads_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let (s, blocks, recs) = disk_store(dir.path());
        let before = reads(&s);
        for (x, r) in blocks.iter().zip(&recs) {
            assert_eq!(&s.read_block(r).unwrap(), x);
        }
        let seq = reads(&s) - before;
        // 48 x 64 KiB over 1 MiB windows: one read to start each segment's
        // stream, then about one per 16 chunks.
        assert!(seq <= 10, "{seq} device reads for a sequential pass");

        s.set_ram_cache(64 << 20);
        let before = reads(&s);
        for (x, r) in blocks.iter().zip(&recs).rev() {
            assert_eq!(&s.read_block(r).unwrap(), x);
        }
        assert_eq!(
            reads(&s) - before,
            48,
            "a backward pass reads chunk by chunk"
        );
    }

    #[test]
    fn a_bad_chunk_inside_a_window_is_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let (s, blocks, recs) = disk_store(dir.path());
        let bad = &recs[5];
        let seg = s.segment(bad.segment).unwrap();
        let dev = s.devices().device(seg.device).unwrap();
        let at = dev.slot_offset(seg.slot) + bad.offset as u64 + 200;
        dev.write_at(&[0x5a], at).unwrap();
        for (i, (x, r)) in blocks.iter().zip(&recs).enumerate() {
            match s.read_block(r) {
                Ok(got) => assert!(i != 5 && &got == x, "block {i}"),
                Err(e) => assert!(i == 5 && matches!(e, crate::DataError::Corrupt { .. })),
            }
        }
    }

    /// A host file that records the `will_need` hints it gets.
    #[derive(Debug)]
    struct Hinted {
        file: cairn_devices::backend::FileBackend,
        hints: Arc<parking_lot::Mutex<Vec<u64>>>,
    }

    impl cairn_devices::Backend for Hinted {
        fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
            self.file.read_at(buf, off)
        }
        fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
            self.file.write_at(buf, off)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.file.sync_data()
        }
        fn len(&self) -> std::io::Result<u64> {
            self.file.len()
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.file.set_len(len)
        }
        fn host_file(&self) -> Option<&std::fs::File> {
            self.file.host_file()
        }
        fn will_need(&self, off: u64, _len: u64) {
            self.hints.lock().push(off);
        }
    }

    #[derive(Debug, Default)]
    struct HintStorage(Arc<parking_lot::Mutex<Vec<u64>>>);

    impl cairn_devices::Storage for HintStorage {
        fn open(
            &self,
            path: &std::path::Path,
            how: &cairn_devices::OpenHow,
        ) -> std::io::Result<Arc<dyn cairn_devices::Backend>> {
            let file = cairn_devices::backend::FileBackend::open(path, how)?;
            Ok(Arc::new(Hinted {
                file,
                hints: self.0.clone(),
            }))
        }
    }

    #[test]
    fn a_sequential_stream_asks_for_the_next_segments_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let storage = HintStorage::default();
        let spec = DeviceSpec::tier(DeviceClass::Hdd, dir.path().join("d"), Some(33 << 20));
        let d = Device::create_with(&spec, 0, [0; 16], 4 << 20, &storage).unwrap();
        let s = ChunkStore::new(Arc::new(DeviceSet::new(vec![d]).unwrap()), vec![], 1).unwrap();
        // Four segments of 24 blocks of 64 KiB, written in order.
        let mut segs = Vec::new();
        for n in 0..4u32 {
            let mut b = s.batch();
            let recs: Vec<ChunkRec> = (0..24u32)
                .map(|i| {
                    let x: Vec<u8> = (0..65536u32)
                        .map(|j| (j ^ i ^ n).wrapping_mul(7) as u8)
                        .collect();
                    b.append(&x, &hash_block(&x)).unwrap()
                })
                .collect();
            b.finish().unwrap();
            s.close_open_segment();
            segs.push(recs);
        }
        s.set_ram_cache(64 << 20);
        s.set_readahead(1 << 20);
        let start = |recs: &[ChunkRec]| {
            let seg = s.segment(recs[0].segment).unwrap();
            s.devices()
                .device(seg.device)
                .unwrap()
                .slot_offset(seg.slot)
        };
        // One chunk at a segment's start is no stream yet: no hint.
        s.read_block(&segs[0][0]).unwrap();
        assert!(storage.0.lock().is_empty());
        // Going on in order: the next two segments are asked for.
        for r in &segs[0][1..] {
            s.read_block(r).unwrap();
        }
        let hints = storage.0.lock().clone();
        assert!(hints.contains(&start(&segs[1])), "{hints:?}");
        assert!(hints.contains(&start(&segs[2])), "{hints:?}");
        assert!(
            !hints.contains(&start(&segs[3])),
            "only two ahead: {hints:?}"
        );
        // Random reads in the last segment (no stream) ask for nothing.
        storage.0.lock().clear();
        for i in [20, 3, 11, 7] {
            s.read_block(&segs[3][i]).unwrap();
        }
        assert!(storage.0.lock().is_empty());
    }
}
