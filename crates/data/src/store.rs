//! The chunk store: the in-memory segment table over the device set, chunk
//! reads with verification, and the single open segment that new chunks are
//! appended to (see writer.rs).

use crate::cache::RamCache;
use crate::chunk::{unseal, CHUNK_HEADER_LEN};
use crate::compress::Compression;
use crate::error::{DataError, Result};
use crate::heat::Heat;
use crate::readahead::Readahead;
use crate::records::{ChunkRec, SegmentRec, SUM_SPAN};
use crate::writer::{OpenSegment, WriteBatch};
use cairn_devices::ssdcache::SsdCache;
use cairn_devices::{Device, DeviceSet, SlotAddr};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct ChunkStore {
    pub(crate) devices: Arc<DeviceSet>,
    pub(crate) segments: RwLock<HashMap<u64, SegmentRec>>,
    pub(crate) open: Mutex<Option<OpenSegment>>,
    /// The segment that reblock and GC append moved chunks to, kept on the
    /// tier the chunks come from (see `batch_on`).
    pub(crate) open_reloc: Mutex<Option<OpenSegment>>,
    pub(crate) next_segment: AtomicU64,
    pub(crate) segment_size: u64,
    /// How new chunks are compressed (the pool setting; changeable).
    pub(crate) compression: RwLock<Compression>,
    /// Free bytes at the end of the open segment, readable while a batch
    /// holds the open segment (writers check space without waiting).
    pub(crate) open_tail: AtomicU64,
    /// Held shared by every device read of a chunk, from locating its
    /// segment to the end of the I/O; taken exclusively before a moved or
    /// dropped segment's old slot is released, so no read in flight can see
    /// the slot reused.
    pub(crate) io_gate: RwLock<()>,
    /// Reads per segment, for the tier mover.
    pub heat: Heat,
    pub(crate) ram_cache: RwLock<Option<RamCache>>,
    pub(crate) ssd_cache: RwLock<Option<Arc<SsdCache>>>,
    pub(crate) readahead: RwLock<Arc<Readahead>>,
}

impl ChunkStore {
    /// Builds the store from the committed segment table. Every segment's
    /// slot is claimed; a slot claimed twice means a corrupt table.
    pub fn new(
        devices: Arc<DeviceSet>,
        table: Vec<(u64, SegmentRec)>,
        next_segment: u64,
    ) -> Result<Self> {
        let mut segments = HashMap::with_capacity(table.len());
        for (id, rec) in table {
            let addr = SlotAddr {
                device: rec.device,
                slot: rec.slot,
            };
            if !devices.claim(addr)? {
                return Err(DataError::BadRecord {
                    what: "segment",
                    why: format!(
                        "segment {id} claims slot {} of device {} twice or out of range",
                        rec.slot, rec.device
                    ),
                });
            }
            assert!(
                id < next_segment,
                "segment id {id} >= next id {next_segment}"
            );
            segments.insert(id, rec);
        }
        let segment_size = devices.segment_size();
        Ok(ChunkStore {
            devices,
            segments: RwLock::new(segments),
            open: Mutex::new(None),
            open_reloc: Mutex::new(None),
            next_segment: AtomicU64::new(next_segment),
            segment_size,
            open_tail: AtomicU64::new(0),
            compression: RwLock::new(Compression::None),
            io_gate: RwLock::new(()),
            heat: Heat::new(segment_size),
            ram_cache: RwLock::new(None),
            ssd_cache: RwLock::new(None),
            readahead: RwLock::new(Arc::new(Readahead::new(0))),
        })
    }

    /// Sets the RAM read cache for chunks on slower tiers (0 turns it off).
    pub fn set_ram_cache(&self, bytes: u64) {
        *self.ram_cache.write() = (bytes > 0).then(|| RamCache::new(bytes));
    }

    pub fn set_ssd_cache(&self, cache: Option<Arc<SsdCache>>) {
        *self.ssd_cache.write() = cache;
    }

    pub fn ssd_cache(&self) -> Option<Arc<SsdCache>> {
        self.ssd_cache.read().clone()
    }

    /// Bytes held by the RAM read cache.
    pub fn ram_cache_bytes(&self) -> u64 {
        self.ram_cache.read().as_ref().map_or(0, |c| c.bytes())
    }

    pub fn set_compression(&self, c: Compression) {
        *self.compression.write() = c;
    }

    pub fn compression(&self) -> Compression {
        *self.compression.read()
    }

    pub fn devices(&self) -> &Arc<DeviceSet> {
        &self.devices
    }

    pub fn next_segment_id(&self) -> u64 {
        self.next_segment.load(Ordering::SeqCst)
    }

    /// The segment new chunks are appended to, if one is open.
    pub fn open_segment_id(&self) -> Option<u64> {
        self.open.lock().as_ref().map(|o| o.id)
    }

    /// True if chunks may still be appended to this segment (it is the open
    /// segment of new writes or of moved chunks): it must not be moved,
    /// compacted or dropped.
    pub fn is_open(&self, id: u64) -> bool {
        let open = |m: &Mutex<Option<OpenSegment>>| m.lock().as_ref().map(|o| o.id);
        open(&self.open) == Some(id) || open(&self.open_reloc) == Some(id)
    }

    pub fn segment(&self, id: u64) -> Option<SegmentRec> {
        self.segments.read().get(&id).cloned()
    }

    pub fn segment_table(&self) -> Vec<(u64, SegmentRec)> {
        let mut v: Vec<_> = self
            .segments
            .read()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    /// Reads a chunk and returns its raw bytes, verified against its header
    /// checksums, and with `full_hash` against the expected hash and the
    /// record's span sums too (scrub).
    pub fn read_chunk(&self, rec: &ChunkRec, full_hash: bool) -> Result<Vec<u8>> {
        let buf = self.read_sealed(rec)?;
        let raw = unseal(&buf, &rec.hash, full_hash).map_err(|why| corrupt(rec, why))?;
        if raw.len() != rec.raw_len as usize {
            return Err(corrupt(rec, "raw length differs from record".into()));
        }
        if full_hash && !rec.sums.is_empty() && ChunkRec::sums_of(&raw) != rec.sums {
            return Err(corrupt(
                rec,
                "the record's span sums differ from the chunk".into(),
            ));
        }
        Ok(raw)
    }

    /// The device and device offset of a chunk, its record checked against
    /// the segment bounds.
    pub(crate) fn locate(&self, rec: &ChunkRec) -> Result<(Arc<Device>, u64)> {
        let seg = self
            .segment(rec.segment)
            .ok_or(DataError::NoSegment(rec.segment))?;
        if rec.offset as u64 + rec.len as u64 > self.segment_size
            || (rec.len as usize) < CHUNK_HEADER_LEN
        {
            return Err(corrupt(rec, "chunk record out of segment bounds".into()));
        }
        let dev = self.devices.device(seg.device)?;
        let at = dev.slot_offset(seg.slot) + rec.offset as u64;
        Ok((dev, at))
    }

    /// The bytes of a chunk on disk (header + stored), unverified.
    pub(crate) fn read_sealed(&self, rec: &ChunkRec) -> Result<Vec<u8>> {
        let _gate = self.io_gate.read();
        let (dev, at) = self.locate(rec)?;
        let mut buf = vec![0u8; rec.len as usize];
        dev.read_at(&mut buf, at)?;
        Ok(buf)
    }

    /// Reads a chunk as stored, fully verified (checksums, and the hash of
    /// its raw bytes): returns (compression method, stored bytes).
    pub fn read_stored(&self, rec: &ChunkRec) -> Result<(u8, Vec<u8>)> {
        let buf = self.read_sealed(rec)?;
        unseal(&buf, &rec.hash, true).map_err(|why| corrupt(rec, why))?;
        let h = crate::chunk::ChunkHeader::decode(&buf).map_err(|why| corrupt(rec, why))?;
        let end = CHUNK_HEADER_LEN + h.stored_len as usize;
        Ok((h.compression, buf[CHUNK_HEADER_LEN..end].to_vec()))
    }

    /// Reads a chunk's first `dst.len()` raw bytes straight into `dst`
    /// (which must not be longer than the chunk's raw length), verified
    /// against its header checksums and hash. No intermediate copy.
    pub fn read_chunk_into(&self, rec: &ChunkRec, dst: &mut [u8]) -> Result<()> {
        if dst.len() > rec.raw_len as usize {
            return Err(corrupt(rec, "read beyond the chunk's raw length".into()));
        }
        let compressed = rec.len as usize != CHUNK_HEADER_LEN + rec.raw_len as usize;
        if compressed || dst.len() < rec.raw_len as usize {
            // Compressed, or a part: checked by span or whole.
            return self.read_chunk_part_into(rec, 0, dst);
        }
        let mut head = [0u8; CHUNK_HEADER_LEN];
        {
            let _gate = self.io_gate.read();
            let (dev, at) = self.locate(rec)?;
            dev.read_split_at(&mut head, dst, at)?;
        }
        let n =
            crate::chunk::verify_split(&head, dst, &rec.hash).map_err(|why| corrupt(rec, why))?;
        if n != rec.raw_len as usize {
            return Err(corrupt(rec, "raw length differs from record".into()));
        }
        Ok(())
    }

    /// Reads raw bytes `from..from + dst.len()` of a chunk into `dst`,
    /// verified. An uncompressed chunk with sums is read only over the
    /// 4 KiB spans those bytes touch, each checked against its sum; any
    /// other chunk is read and checked whole.
    pub fn read_chunk_part_into(&self, rec: &ChunkRec, from: usize, dst: &mut [u8]) -> Result<()> {
        let end = from + dst.len();
        if end > rec.raw_len as usize {
            return Err(corrupt(rec, "read beyond the chunk's raw length".into()));
        }
        let raw = rec.len as usize == CHUNK_HEADER_LEN + rec.raw_len as usize;
        if !raw || !rec.has_sums() {
            let whole = self.read_chunk(rec, false)?;
            dst.copy_from_slice(&whole[from..end]);
            return Ok(());
        }
        let first = from / SUM_SPAN;
        let lo = first * SUM_SPAN;
        let hi = (end.div_ceil(SUM_SPAN) * SUM_SPAN).min(rec.raw_len as usize);
        let mut spare = Vec::new();
        let buf: &mut [u8] = if (lo, hi) == (from, end) {
            dst
        } else {
            spare.resize(hi - lo, 0);
            &mut spare
        };
        {
            let _gate = self.io_gate.read();
            let (dev, at) = self.locate(rec)?;
            dev.read_at(buf, at + (CHUNK_HEADER_LEN + lo) as u64)?;
        }
        for (k, span) in buf.chunks(SUM_SPAN).enumerate() {
            if crc32c::crc32c(span) != rec.sums[first + k] {
                let at = (first + k) * SUM_SPAN;
                return Err(corrupt(rec, format!("data checksum mismatch at byte {at}")));
            }
        }
        if !spare.is_empty() {
            dst.copy_from_slice(&spare[from - lo..end - lo]);
        }
        Ok(())
    }

    /// Closes the open segments so that the next batches open new ones (on
    /// the devices placement then picks). Call between batches only.
    pub fn close_open_segment(&self) {
        for m in [&self.open, &self.open_reloc] {
            let mut open = m.lock();
            if let Some(o) = open.as_ref() {
                assert!(
                    o.is_flushed(),
                    "closing segment {} with buffered data",
                    o.id
                );
            }
            *open = None;
        }
        self.open_tail.store(0, Ordering::Relaxed);
    }

    /// Starts appending new chunks. Only one batch at a time (it holds the
    /// open segment); the filesystem's flusher is the only writer.
    pub fn batch(&self) -> WriteBatch<'_> {
        WriteBatch::new(self, self.open.lock(), None)
    }

    /// Starts appending moved chunks (reblock, GC) to segments on devices of
    /// class rank `rank`, or slower ones if those are full: compaction keeps
    /// data on its tier, and heat alone moves it between tiers. When new
    /// data goes to that tier anyway, the batch shares its open segment
    /// (a single-tier pool has one open segment, as before); otherwise
    /// moved chunks get their own open segment there.
    pub fn batch_on(&self, rank: u8) -> WriteBatch<'_> {
        let rank_of = |a: SlotAddr| self.devices.device(a.device).ok().map(|d| d.class().rank());
        let new_data = self.open.lock();
        let same_tier = match new_data.as_ref() {
            Some(o) => rank_of(o.addr) == Some(rank),
            None => self.devices.fastest_tier_rank() == Some(rank),
        };
        if same_tier {
            // New data goes to this tier anyway: share its open segment.
            return WriteBatch::new(self, new_data, None);
        }
        drop(new_data);
        let mut open = self.open_reloc.lock();
        let elsewhere = open.as_ref().is_some_and(|o| rank_of(o.addr) != Some(rank));
        if elsewhere {
            let o = open.as_ref().expect("checked");
            assert!(
                o.is_flushed(),
                "closing segment {} with buffered data",
                o.id
            );
            *open = None;
        }
        WriteBatch::new(self, open, Some(rank))
    }

    /// A chunk lost its last reference: account it in its segment. Returns
    /// the segment's new record, or None if the segment is now empty and was
    /// dropped from the table (its slot is released by `release_slots` after
    /// the metadata commit).
    pub fn unref_chunk(&self, rec: &ChunkRec) -> Option<SegmentRec> {
        let open = self.is_open(rec.segment);
        let mut segs = self.segments.write();
        let s = segs.get_mut(&rec.segment)?;
        s.live = s.live.saturating_sub(rec.len as u64);
        s.chunks = s.chunks.saturating_sub(1);
        if rec.live == 0 {
            s.hist = s.hist.saturating_sub(rec.len as u64);
        }
        if s.chunks == 0 && !open {
            segs.remove(&rec.segment);
            return None;
        }
        Some(s.clone())
    }

    /// A chunk of this segment became referenced by history only
    /// (`to_history`) or live again: moves its bytes into or out of the
    /// segment's `hist`. Returns false if the segment is unknown.
    pub fn set_history_only(&self, rec: &ChunkRec, to_history: bool) -> bool {
        let mut segs = self.segments.write();
        let Some(s) = segs.get_mut(&rec.segment) else {
            return false;
        };
        let n = rec.len as u64;
        s.hist = if to_history {
            (s.hist + n).min(s.live)
        } else {
            s.hist.saturating_sub(n)
        };
        true
    }

    /// What `unref_chunk` of each of these chunks would leave: per segment
    /// its new record, or None if it would be dropped. Changes nothing.
    pub fn preview_unref(&self, recs: &[ChunkRec]) -> HashMap<u64, Option<SegmentRec>> {
        let open: Vec<u64> = recs
            .iter()
            .map(|r| r.segment)
            .filter(|&s| self.is_open(s))
            .collect();
        let segs = self.segments.read();
        let mut out: HashMap<u64, Option<SegmentRec>> = HashMap::new();
        for rec in recs {
            let Some(cur) = segs.get(&rec.segment) else {
                continue;
            };
            let e = out.entry(rec.segment).or_insert_with(|| Some(cur.clone()));
            if let Some(s) = e {
                s.live = s.live.saturating_sub(rec.len as u64);
                s.chunks = s.chunks.saturating_sub(1);
                if rec.live == 0 {
                    s.hist = s.hist.saturating_sub(rec.len as u64);
                }
                if s.chunks == 0 && !open.contains(&rec.segment) {
                    *e = None;
                }
            }
        }
        out
    }

    /// A flush's metadata commit failed: forgets what that flush did to the
    /// segments in RAM and goes back to the committed table. The open
    /// segments are closed (what they held beyond the commit is unreferenced
    /// and is never read), slots of segments the table does not know are
    /// released, and records a failed prune changed are restored. Segment
    /// ids stay unique (the counter does not go back). Call with no batch
    /// running (under the filesystem's flush lock).
    pub fn rollback(&self, committed: Vec<(u64, SegmentRec)>) -> Result<()> {
        for m in [&self.open, &self.open_reloc] {
            *m.lock() = None;
        }
        self.open_tail.store(0, Ordering::Relaxed);
        let committed: HashMap<u64, SegmentRec> = committed.into_iter().collect();
        let mut segs = self.segments.write();
        let orphans: Vec<SlotAddr> = segs
            .iter()
            .filter(|(id, _)| !committed.contains_key(id))
            .map(|(_, r)| SlotAddr {
                device: r.device,
                slot: r.slot,
            })
            .collect();
        *segs = committed;
        drop(segs);
        self.release_slots(&orphans)
    }

    /// Gives the slots of dropped segments back to their devices. Call only
    /// after the metadata transaction that removed them has committed.
    pub fn release_slots(&self, freed: &[SlotAddr]) -> Result<()> {
        if freed.is_empty() {
            return Ok(());
        }
        drop(self.io_gate.write());
        freed.iter().try_for_each(|a| Ok(self.devices.release(*a)?))
    }

    /// Bytes that new chunks can still use: free slots plus the open
    /// segment's tail.
    pub fn free_bytes(&self) -> u64 {
        let (_, free_slots) = self.devices.slot_totals();
        free_slots * self.segment_size + self.open_tail.load(Ordering::Relaxed)
    }

    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }
}

/// A chunk whose bytes or record do not check out.
pub(crate) fn corrupt(rec: &ChunkRec, why: String) -> DataError {
    DataError::Corrupt {
        segment: rec.segment,
        offset: rec.offset,
        why,
    }
}
