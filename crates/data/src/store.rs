//! The chunk store: the segments (`segments.rs`: the segment table over the
//! device set and the open segments that new chunks are appended to, see
//! writer.rs), chunk reads with verification, the pool's compression
//! setting, the read caches and read-ahead settings (used by read.rs), and
//! segment heat.

use crate::aligned::{cached, read_direct};
use crate::cache::RamCache;
use crate::chunk::CHUNK_HEADER_LEN;
use crate::codec::ChunkCodec;
use crate::compress::Compression;
use crate::error::Result;
use crate::heat::Heat;
use crate::readahead::Readahead;
use crate::records::{corrupt, ChunkRec, SegmentRec, SUM_SPAN};
use crate::segments::Segments;
use crate::writer::WriteBatch;
use cairn_devices::ssdcache::SsdCache;
use cairn_devices::{DeviceSet, SlotAddr};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counts of what self-healing did since the pool was opened.
/// (Updated by `heal.rs`.)
#[derive(Debug, Default)]
pub struct HealStats {
    /// Chunks served from another copy after the first failed.
    pub served: AtomicU64,
    /// Chunks restored from their stripe's parity (no copy gave them).
    pub restored: AtomicU64,
    /// Bad copies rewritten from a good one.
    pub repaired: AtomicU64,
    /// Bad copies that could not be rewritten (their device failed the
    /// write, or is missing).
    pub unrepaired: AtomicU64,
}

pub struct ChunkStore {
    /// The segment table, the open segments and the I/O gate.
    pub(crate) segs: Segments,
    /// How new chunks are compressed (the pool setting; changeable).
    pub(crate) compression: RwLock<Compression>,
    /// Reads per segment, for the tier mover.
    pub heat: Heat,
    pub(crate) ram_cache: RwLock<Option<RamCache>>,
    pub(crate) ssd_cache: RwLock<Option<Arc<SsdCache>>>,
    pub(crate) readahead: RwLock<Arc<Readahead>>,
    /// What self-healing reads did (`heal.rs`).
    pub(crate) heal: HealStats,
    /// How blocks become stored chunks and back: plain or encrypted.
    pub(crate) codec: ChunkCodec,
}

impl ChunkStore {
    /// Builds the store from the committed segment table. Every segment's
    /// slot is claimed; a slot claimed twice means a corrupt table.
    pub fn new(
        devices: Arc<DeviceSet>,
        table: Vec<(u64, SegmentRec)>,
        next_segment: u64,
    ) -> Result<Self> {
        Self::with_stripes(devices, table, Vec::new(), next_segment)
    }

    /// `new` with the committed stripe table (`stripes.rs`).
    pub fn with_stripes(
        devices: Arc<DeviceSet>,
        table: Vec<(u64, SegmentRec)>,
        stripes: Vec<(u64, crate::StripeRec)>,
        next_segment: u64,
    ) -> Result<Self> {
        let segs = Segments::new(devices, table, stripes, next_segment)?;
        let segment_size = segs.segment_size;
        Ok(ChunkStore {
            segs,
            compression: RwLock::new(Compression::None),
            heat: Heat::new(segment_size),
            ram_cache: RwLock::new(None),
            ssd_cache: RwLock::new(None),
            readahead: RwLock::new(Arc::new(Readahead::new(0))),
            heal: Default::default(),
            codec: ChunkCodec::default(),
        })
    }

    /// Makes the store read and write chunks with `codec` (an encrypted
    /// pool's, set once at open before any chunk is read).
    pub fn set_codec(&mut self, codec: ChunkCodec) {
        self.codec = codec;
    }

    /// The pool's chunk codec (its content hash, and how blocks are
    /// packed).
    pub fn codec(&self) -> &ChunkCodec {
        &self.codec
    }

    /// Sets how many copies new segments get.
    pub fn set_policy(&self, p: crate::policy::Policy) {
        *self.segs.policy.write() = p;
        self.segs.short.store(true, Ordering::Relaxed);
    }

    /// How many copies new segments get.
    pub fn policy(&self) -> crate::policy::Policy {
        *self.segs.policy.read()
    }

    /// Faults the devices whose reads have waited the I/O timeout with
    /// none finishing (`deadline::ReadStalls`); returns them. Called by the
    /// filesystem's watchdog every half second.
    pub fn fault_stalled_readers(&self) -> Vec<u32> {
        let Some(limit) = self.segs.io_timeout.get() else {
            return Vec::new();
        };
        let set = &self.segs.devices;
        // An object store's client has timeouts and retries of its own.
        let mut devs = set.devices();
        devs.retain(|d| !d.class().is_object_store());
        let mut out = Vec::new();
        for (id, waiting, stuck) in self.segs.read_stalls.stalled(&devs, limit) {
            if !set.is_online(id) {
                continue;
            }
            tracing::error!(
                "device {id}: {waiting} reads have waited {:.1} s with none finishing (I/O timeout {} s): it is taken out, later reads use the other copies",
                stuck.as_secs_f64(),
                limit.as_secs()
            );
            self.segs.fault(id);
            out.push(id);
        }
        out
    }

    /// How segment `s` is to be kept: the layout its files asked for, or
    /// its class's (None when its first device is unknown).
    pub fn layout_of(&self, s: &crate::SegmentRec) -> Option<crate::Layout> {
        self.segs.layout_of(s)
    }

    /// For tests of the invariant path: the next segment write is aimed
    /// past its device's end, as a bug in the offsets would aim it (the
    /// device refuses it, `DeviceError::Invariant`).
    pub fn misplace_next_write(&self) {
        self.segs.misplace.store(true, Ordering::Relaxed);
    }

    /// Test hook (tests of the invariant path only): the next segment
    /// write is aimed one segment further into its device, over the next
    /// slot, as a bug in the segment offsets would aim it; the data
    /// layer refuses it (`DataError::Invariant`) before the device sees
    /// it, since the device cannot tell one slot from the next.
    pub fn test_hook_shift_next_write(&self) {
        self.segs.shift_write.store(true, Ordering::Relaxed);
    }

    /// True (and cleared) when segments may lack copies the policy asks
    /// for (a policy change, a failed copy, no room in another domain).
    pub fn take_short(&self) -> bool {
        self.segs.short.swap(false, Ordering::Relaxed)
    }

    /// Says that segments may lack copies (a device was lost).
    pub fn note_short(&self) {
        self.segs.short.store(true, Ordering::Relaxed);
    }

    /// Sets how long an I/O of one copy among several may take before its
    /// device is faulted and the copy dropped (zero: no limit).
    pub fn set_io_timeout(&self, d: std::time::Duration) {
        self.segs.io_timeout.set(d);
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

    /// (hits, misses) of the RAM read cache, None without one.
    pub fn ram_cache_hits_misses(&self) -> Option<(u64, u64)> {
        self.ram_cache.read().as_ref().map(|c| c.hits_misses())
    }

    pub fn set_compression(&self, c: Compression) {
        *self.compression.write() = c;
    }

    pub fn compression(&self) -> Compression {
        *self.compression.read()
    }

    /// Probes the devices that failed a write (`Segments::probe_suspects`):
    /// after each commit.
    pub fn probe_suspects(&self) {
        self.segs.probe_suspects();
    }

    pub fn devices(&self) -> &Arc<DeviceSet> {
        &self.segs.devices
    }

    pub fn next_segment_id(&self) -> u64 {
        self.segs.next_segment.load(Ordering::SeqCst)
    }

    /// The segment new chunks are appended to, if one is open.
    pub fn open_segment_id(&self) -> Option<u64> {
        self.segs.open_id()
    }

    /// True if chunks may still be appended to this segment (it is the open
    /// segment of new writes or of moved chunks): it must not be moved,
    /// compacted or dropped.
    pub fn is_open(&self, id: u64) -> bool {
        self.segs.is_open(id)
    }

    pub fn segment(&self, id: u64) -> Option<SegmentRec> {
        self.segs.get(id)
    }

    pub fn segment_table(&self) -> Vec<(u64, SegmentRec)> {
        self.segs.sorted()
    }

    /// Reads a chunk and returns its raw bytes, verified against its header
    /// checksums, and with `full_hash` against the expected hash and the
    /// record's span sums too (scrub).
    pub fn read_chunk(&self, rec: &ChunkRec, full_hash: bool) -> Result<Vec<u8>> {
        let first = self.read_chunk_here(rec, full_hash);
        self.or_heal(rec, first, |sealed| self.raw_of(rec, sealed, full_hash))
    }

    /// `read_chunk` from the copy reads go to first: a chunk the page
    /// cache does not keep (`cached`) with one direct read into this
    /// thread's bounce buffer, opened there (a compressed or encrypted one
    /// is expanded from it: a buffered read of it cost a copy out of the
    /// host's page cache that took half of an encrypted pool's cold read).
    fn read_chunk_here(&self, rec: &ChunkRec, full_hash: bool) -> Result<Vec<u8>> {
        if !cached(rec.raw_len) {
            let _gate = self.segs.io_gate.read();
            let (dev, at) = self.segs.locate(rec)?;
            let direct = read_direct(&dev, at, rec.len as usize, |buf| {
                self.raw_of(rec, buf, full_hash)
            })?;
            if let Some(raw) = direct {
                return Ok(raw);
            }
        }
        let buf = self.segs.read_sealed(rec)?;
        self.raw_of(rec, &buf, full_hash)
    }

    /// The raw bytes of `rec` from its sealed bytes, verified (with
    /// `full_hash`, against its hash and the record's span sums too).
    pub(crate) fn raw_of(&self, rec: &ChunkRec, buf: &[u8], full_hash: bool) -> Result<Vec<u8>> {
        let raw = (self.codec.unseal(buf, &rec.hash, full_hash))
            .map_err(|why| corrupt(rec, why.to_string()))?;
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

    /// Reads a chunk as stored, fully verified (checksums, and the hash of
    /// its raw bytes; held without the key, its checksums only): returns
    /// (compression method, stored bytes).
    pub fn read_stored(&self, rec: &ChunkRec) -> Result<(u8, Vec<u8>)> {
        let first = self.segs.read_sealed(rec);
        let first = first.and_then(|buf| self.stored_of(rec, &buf));
        self.or_heal(rec, first, |sealed| self.stored_of(rec, sealed))
    }

    /// (compression method, stored bytes) of `rec` from its sealed bytes,
    /// fully verified.
    fn stored_of(&self, rec: &ChunkRec, buf: &[u8]) -> Result<(u8, Vec<u8>)> {
        (self.codec.verify(buf, &rec.hash)).map_err(|why| corrupt(rec, why.to_string()))?;
        let h =
            crate::chunk::ChunkHeader::decode(buf).map_err(|why| corrupt(rec, why.to_string()))?;
        let end = CHUNK_HEADER_LEN + h.stored_len as usize;
        Ok((h.compression, buf[CHUNK_HEADER_LEN..end].to_vec()))
    }

    /// Reads a chunk's first `dst.len()` raw bytes straight into `dst`
    /// (which must not be longer than the chunk's raw length), verified
    /// against its header checksums and hash. No intermediate copy.
    pub fn read_chunk_into(&self, rec: &ChunkRec, dst: &mut [u8]) -> Result<()> {
        let first = self.read_chunk_into_here(rec, dst);
        self.or_heal(rec, first, |sealed| {
            let raw = self.raw_of(rec, sealed, false)?;
            dst.copy_from_slice(&raw[..dst.len()]);
            Ok(())
        })
    }

    /// `read_chunk_into` from the copy reads go to first.
    fn read_chunk_into_here(&self, rec: &ChunkRec, dst: &mut [u8]) -> Result<()> {
        if dst.len() > rec.raw_len as usize {
            return Err(corrupt(rec, "read beyond the chunk's raw length".into()));
        }
        let compressed = rec.len as usize != CHUNK_HEADER_LEN + rec.raw_len as usize;
        if compressed || dst.len() < rec.raw_len as usize {
            // Compressed, or a part: checked by span or whole.
            return self.read_chunk_part_here(rec, 0, dst);
        }
        let _gate = self.segs.io_gate.read();
        let (dev, at) = self.segs.locate(rec)?;
        let check = |head: &[u8], raw: &[u8]| {
            let n = crate::chunk::verify_split(head, raw, &rec.hash)
                .map_err(|why| corrupt(rec, why.to_string()))?;
            if n != rec.raw_len as usize {
                return Err(corrupt(rec, "raw length differs from record".into()));
            }
            Ok(())
        };
        let direct = if cached(rec.raw_len) {
            None
        } else {
            read_direct(&dev, at, rec.len as usize, |buf| {
                let (head, raw) = buf.split_at(CHUNK_HEADER_LEN);
                check(head, raw)?;
                dst.copy_from_slice(raw);
                Ok(())
            })?
        };
        if direct.is_none() {
            let mut head = [0u8; CHUNK_HEADER_LEN];
            dev.read_split_at(&mut head, dst, at)?;
            check(&head, dst)?;
        }
        Ok(())
    }

    /// Reads raw bytes `from..from + dst.len()` of a chunk into `dst`,
    /// verified. An uncompressed chunk with sums is read only over the
    /// 4 KiB spans those bytes touch (directly where the device allows),
    /// each checked against its sum, and one sealed span by span only over
    /// those spans, each opened (`span_read.rs`); any other chunk is read
    /// and checked whole.
    pub fn read_chunk_part_into(&self, rec: &ChunkRec, from: usize, dst: &mut [u8]) -> Result<()> {
        let first = self.read_chunk_part_here(rec, from, dst);
        self.or_heal(rec, first, |sealed| {
            let raw = self.raw_of(rec, sealed, false)?;
            dst.copy_from_slice(&raw[from..from + dst.len()]);
            Ok(())
        })
    }

    /// `read_chunk_part_into` from the copy reads go to first.
    fn read_chunk_part_here(&self, rec: &ChunkRec, from: usize, dst: &mut [u8]) -> Result<()> {
        let end = from + dst.len();
        if end > rec.raw_len as usize {
            return Err(corrupt(rec, "read beyond the chunk's raw length".into()));
        }
        if let Some(r) = self.read_spans_here(rec, from, dst) {
            return r;
        }
        let raw = rec.len as usize == CHUNK_HEADER_LEN + rec.raw_len as usize;
        if !raw || !rec.has_sums() {
            let whole = self.read_chunk_here(rec, false)?;
            dst.copy_from_slice(&whole[from..end]);
            return Ok(());
        }
        let first = from / SUM_SPAN;
        let lo = first * SUM_SPAN;
        let hi = (end.div_ceil(SUM_SPAN) * SUM_SPAN).min(rec.raw_len as usize);
        let check = |spans: &[u8]| {
            for (k, span) in spans.chunks(SUM_SPAN).enumerate() {
                if crc32c::crc32c(span) != rec.sums[first + k] {
                    let at = (first + k) * SUM_SPAN;
                    return Err(corrupt(rec, format!("data checksum mismatch at byte {at}")));
                }
            }
            Ok(())
        };
        let _gate = self.segs.io_gate.read();
        let (dev, at) = self.segs.locate(rec)?;
        let at = at + (CHUNK_HEADER_LEN + lo) as u64;
        let direct = if cached(rec.raw_len) {
            None
        } else {
            read_direct(&dev, at, hi - lo, |spans| {
                check(spans)?;
                dst.copy_from_slice(&spans[from - lo..end - lo]);
                Ok(())
            })?
        };
        if direct.is_some() {
            return Ok(());
        }
        let mut spare = Vec::new();
        let buf: &mut [u8] = if (lo, hi) == (from, end) {
            dst
        } else {
            spare.resize(hi - lo, 0);
            &mut spare
        };
        dev.read_at(buf, at)?;
        check(buf)?;
        if !spare.is_empty() {
            dst.copy_from_slice(&spare[from - lo..end - lo]);
        }
        Ok(())
    }

    /// Closes the open segments so that the next batches open new ones (on
    /// the devices placement then picks). Call between batches only.
    pub fn close_open_segment(&self) {
        self.segs.close_open()
    }

    /// Starts appending new chunks. Only one batch at a time (it holds the
    /// open segment); the filesystem's flusher is the only writer.
    pub fn batch(&self) -> WriteBatch<'_> {
        WriteBatch::new(
            &self.segs,
            self.segs.open.lock(),
            None,
            self.compression(),
            self.codec.clone(),
        )
    }

    /// Starts appending moved chunks (reblock, GC) to segments on devices of
    /// class rank `rank`, or slower ones if those are full: compaction keeps
    /// data on its tier, and heat alone moves it between tiers. When new
    /// data goes to that tier anyway, the batch shares its open segment
    /// (a single-tier pool has one open segment, as before); otherwise
    /// moved chunks get their own open segment there.
    pub fn batch_on(&self, rank: u8) -> WriteBatch<'_> {
        let devices = &self.segs.devices;
        let rank_of = |a: SlotAddr| devices.device(a.device).ok().map(|d| d.class().rank());
        let new_data = self.segs.open.lock();
        let same_tier = match new_data.as_ref() {
            Some(o) => rank_of(o.first()) == Some(rank),
            None => devices.fastest_tier_rank() == Some(rank),
        };
        if same_tier {
            // New data goes to this tier anyway: share its open segment.
            return WriteBatch::new(
                &self.segs,
                new_data,
                None,
                self.compression(),
                self.codec.clone(),
            );
        }
        drop(new_data);
        let mut open = self.segs.open_reloc.lock();
        let elsewhere = open
            .as_ref()
            .is_some_and(|o| rank_of(o.first()) != Some(rank));
        if elsewhere {
            let o = open.as_ref().expect("checked");
            assert!(
                o.is_flushed(),
                "closing segment {} with buffered data",
                o.id
            );
            *open = None;
        }
        WriteBatch::new(
            &self.segs,
            open,
            Some(rank),
            self.compression(),
            self.codec.clone(),
        )
    }

    /// A chunk lost its last reference: account it in its segment. Returns
    /// the segment's new record, or None if the segment is now empty and was
    /// dropped from the table (its slot is released by `release_slots` after
    /// the metadata commit).
    /// An invariant error if the segment counts no chunk left to lose.
    pub fn unref_chunk(&self, rec: &ChunkRec) -> Result<Option<SegmentRec>> {
        self.segs.unref_chunk(rec)
    }

    /// A chunk of this segment became referenced by history only
    /// (`to_history`) or live again: moves its bytes into or out of the
    /// segment's `hist`. Returns false if the segment is unknown.
    pub fn set_history_only(&self, rec: &ChunkRec, to_history: bool) -> bool {
        self.segs.set_history_only(rec, to_history)
    }

    /// What `unref_chunk` of each of these chunks would leave: per segment
    /// its new record, or None if it would be dropped. Changes nothing.
    pub fn preview_unref(&self, recs: &[ChunkRec]) -> HashMap<u64, Option<SegmentRec>> {
        self.segs.preview_unref(recs)
    }

    /// A flush's metadata commit failed: forgets what that flush did to the
    /// segments in RAM and goes back to the committed table. The open
    /// segments are closed (what they held beyond the commit is unreferenced
    /// and is never read), slots of segments the table does not know are
    /// released, and records a failed prune changed are restored. Segment
    /// ids stay unique (the counter does not go back). Call with no batch
    /// running (under the filesystem's flush lock).
    pub fn rollback(&self, committed: Vec<(u64, SegmentRec)>) -> Result<()> {
        self.segs.rollback(committed)
    }

    /// Gives the slots of dropped segments back to their devices. Call only
    /// after the metadata transaction that removed them has committed.
    pub fn release_slots(&self, freed: &[SlotAddr]) -> Result<()> {
        self.segs.release_slots(freed)
    }

    /// Bytes that new chunks can still use: free slots plus the open
    /// segment's tail.
    pub fn free_bytes(&self) -> u64 {
        self.segs.free_bytes()
    }

    pub fn segment_size(&self) -> u64 {
        self.segs.segment_size
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod tests {
    use crate::chunk::hash_block;
    use crate::ChunkStore;
    use cairn_devices::{Device, DeviceClass, DeviceSet, DeviceSpec};
    use std::sync::Arc;

    fn store(dir: &std::path::Path, slots: u64) -> ChunkStore {
        let spec = DeviceSpec::tier(
            DeviceClass::Ssd,
            dir.to_path_buf(),
            Some((1 << 20) + slots * (1 << 20)),
        );
        let d = Device::create(&spec, 0, [0; 16], 1 << 20).unwrap();
        ChunkStore::new(Arc::new(DeviceSet::new(vec![d]).unwrap()), vec![], 1).unwrap()
    }

    #[test]
    fn append_read_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 8);
        let blocks: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 100_000]).collect();
        let mut b = s.batch();
        let recs: Vec<_> = blocks
            .iter()
            .map(|x| b.append(x, &hash_block(x)).unwrap())
            .collect();
        let segs = b.finish().unwrap();
        assert!(segs.len() >= 4, "40 x 100 KB spans several 1 MiB segments");
        for (x, r) in blocks.iter().zip(&recs) {
            assert_eq!(&s.read_chunk(r, true).unwrap(), x);
            let mut direct = vec![0u8; x.len()];
            s.read_chunk_into(r, &mut direct).unwrap();
            assert_eq!(&direct, x);
            let mut part = vec![0u8; 1000];
            s.read_chunk_into(r, &mut part).unwrap();
            assert_eq!(&part[..], &x[..1000]);
        }
    }

    #[test]
    fn full_pool_reports_no_space() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 4);
        let x = vec![1u8; 500_000];
        let mut b = s.batch();
        let mut n = 0;
        let err = loop {
            match b.append(&x, &hash_block(&x)) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
        };
        assert!(err.is_no_space());
        assert_eq!(n, 8, "two 500 KB chunks per 1 MiB segment, 4 segments");
    }

    #[test]
    fn corrupt_chunk_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 4);
        let x = vec![9u8; 4096];
        let mut b = s.batch();
        let r = b.append(&x, &hash_block(&x)).unwrap();
        b.finish().unwrap();
        let seg = s.segment(r.segment).unwrap();
        let dev = s.devices().device(seg.device).unwrap();
        let off = dev.slot_offset(seg.slot) + r.offset as u64 + 100;
        dev.write_at(&[0x55], off).unwrap();
        assert!(matches!(
            s.read_chunk(&r, false),
            Err(crate::DataError::Corrupt { .. })
        ));
        let mut direct = vec![0u8; x.len()];
        assert!(matches!(
            s.read_chunk_into(&r, &mut direct),
            Err(crate::DataError::Corrupt { .. })
        ));
    }

    /// A segment write aimed past its segment (`test_hook_shift_next_write`:
    /// into the next slot, inside the device) is refused by the data layer
    /// as a violated invariant, and the next slot keeps its bytes.
    #[test]
    fn a_write_past_its_segment_is_refused_and_the_next_slot_keeps_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 4);
        let x = vec![7u8; 300_000];
        let mut b = s.batch();
        let first = b.append(&x, &hash_block(&x)).unwrap();
        b.finish().unwrap();
        s.close_open_segment();
        let seg = s.segment(first.segment).unwrap();
        let dev = s.devices().device(seg.device).unwrap();
        let others = |d: &cairn_devices::Device| -> Vec<Vec<u8>> {
            (0..d.header.slot_count())
                .filter(|&n| n != seg.slot)
                .map(|n| {
                    let mut b = vec![0u8; 1 << 20];
                    d.read_at(&mut b, d.slot_offset(n)).unwrap();
                    b
                })
                .collect()
        };
        let before = others(&dev);
        // The next batch opens a new segment on the free slot after the
        // first: the shifted write would land one slot further.
        s.test_hook_shift_next_write();
        let y = vec![8u8; 300_000];
        let mut b = s.batch();
        let e = b
            .append(&y, &hash_block(&y))
            .and_then(|_| b.finish().map(drop))
            .unwrap_err();
        assert!(e.is_invariant(), "{e}");
        assert!(matches!(e, crate::DataError::Invariant { .. }), "{e:?}");
        assert!(e.to_string().starts_with("INVARIANT VIOLATED"), "{e}");
        assert!(e.to_string().contains("past the segment"), "{e}");
        assert!(before == others(&dev), "nothing landed on another slot");
        assert_eq!(s.read_chunk(&first, true).unwrap(), x);
    }

    /// A chunk unreferenced twice: the second finds its segment counting
    /// no chunk, and is refused rather than free the slot under others.
    #[test]
    fn a_chunk_unreferenced_twice_is_a_violated_invariant() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 4);
        let x = vec![3u8; 4096];
        let mut b = s.batch();
        let r = b.append(&x, &hash_block(&x)).unwrap();
        b.finish().unwrap();
        // Still the open segment: it stays in the table with no chunk.
        let left = s.unref_chunk(&r).unwrap().expect("the open segment stays");
        assert_eq!(left.chunks, 0);
        let e = s.unref_chunk(&r).unwrap_err();
        assert!(e.is_invariant(), "{e}");
        assert!(e.to_string().contains("counts no chunk"), "{e}");
        assert_eq!(s.segment(r.segment).unwrap(), left, "nothing changed");
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod page_cache_tests {
    use crate::chunk::hash_block;
    use crate::{ChunkRec, ChunkStore};
    use cairn_devices::{Device, DeviceClass, DeviceSet, DeviceSpec};
    use std::os::fd::AsRawFd;
    use std::path::Path;
    use std::sync::Arc;

    /// Pages of `path`'s bytes `at..at + len` in the host's page cache, of
    /// all of them (mincore over a shared read-only mapping).
    fn resident(path: &Path, at: u64, len: usize) -> (usize, usize) {
        let f = std::fs::File::open(path).unwrap();
        let page = 4096;
        let (start, end) = (
            at as usize / page * page,
            (at as usize + len).div_ceil(page) * page,
        );
        let n = (end - start) / page;
        let mut v = vec![0u8; n];
        // SAFETY: a fresh read-only mapping of the open file, unmapped
        // below; mincore writes one byte per page into `v`.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                end - start,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                start as libc::off_t,
            );
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(libc::mincore(p, end - start, v.as_mut_ptr()), 0);
            libc::munmap(p, end - start);
        }
        (v.iter().filter(|b| *b & 1 == 1).count(), n)
    }

    /// A store over one 96 MiB file device with 16 MiB segments, and the
    /// file's path.
    fn file_store(dir: &Path) -> (ChunkStore, std::path::PathBuf) {
        let path = dir.join("d");
        let spec = DeviceSpec::tier(DeviceClass::Ssd, path.clone(), Some(96 << 20));
        let d = Device::create(&spec, 0, [0; 16], 16 << 20).unwrap();
        let s = ChunkStore::new(Arc::new(DeviceSet::new(vec![d]).unwrap()), vec![], 1).unwrap();
        (s, path)
    }

    /// Appends `n` distinct blocks of `size` bytes in one batch; returns
    /// their records.
    fn append_blocks(s: &ChunkStore, n: u32, size: usize, seed: u32) -> Vec<ChunkRec> {
        let mut b = s.batch();
        let recs = (0..n)
            .map(|i| {
                let x: Vec<u8> = (0..size as u32)
                    .map(|j| (j.wrapping_mul(2654435761) ^ (i + seed)) as u8)
                    .collect();
                b.append(&x, &hash_block(&x)).unwrap()
            })
            .collect();
        b.finish().unwrap();
        recs
    }

    /// The device byte range of `recs`, written one after the other into
    /// one segment of device 0.
    fn span(s: &ChunkStore, recs: &[ChunkRec]) -> (u64, usize) {
        let (first, last) = (&recs[0], &recs[recs.len() - 1]);
        assert_eq!(first.segment, last.segment, "one segment");
        let (dev, at) = s.segs.locate(first).unwrap();
        assert_eq!(dev.id(), 0);
        (at, (last.offset + last.len - first.offset) as usize)
    }

    /// Writes `n` distinct blocks of `size` bytes in one batch; returns the
    /// device byte range they landed in.
    fn write_blocks(s: &ChunkStore, n: u32, size: usize, seed: u32) -> (u64, usize) {
        span(s, &append_blocks(s, n, size, seed))
    }

    /// Small chunks (volume blocks) are written through the page cache and
    /// read back from it; large ones go past it (O_DIRECT), so sequential
    /// file data is not cached twice.
    #[test]
    fn small_chunks_are_written_through_the_page_cache_large_ones_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let (s, path) = file_store(dir.path());

        let (at, len) = write_blocks(&s, 512, 4096, 0);
        let (hot, all) = resident(&path, at, len);
        assert!(
            hot * 10 >= all * 9,
            "4 KiB chunks: {hot} of {all} pages cached"
        );

        s.close_open_segment();
        let (at, len) = write_blocks(&s, 64, 64 << 10, 1000);
        let (hot, all) = resident(&path, at, len);
        assert!(
            hot * 10 <= all,
            "64 KiB chunks: {hot} of {all} pages cached"
        );
    }

    /// Chunks that die or go to history only leave the page cache once
    /// their commit is made (`release_slots`), so that they do not push
    /// live chunks out of it; the live ones stay.
    #[test]
    fn dead_and_history_only_chunks_leave_the_page_cache_after_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (s, path) = file_store(dir.path());
        let recs = append_blocks(&s, 512, 4096, 0);
        let cached = |r: std::ops::Range<usize>| {
            let (at, len) = span(&s, &recs[r]);
            resident(&path, at, len)
        };
        for r in &recs[..128] {
            s.unref_chunk(r).unwrap();
        }
        for r in &recs[128..256] {
            assert!(s.set_history_only(r, true));
        }
        let (hot, all) = cached(0..256);
        assert!(
            hot * 10 >= all * 9,
            "before the commit: {hot} of {all} cached"
        );
        s.release_slots(&[]).unwrap();
        // All but the page shared with the first live chunk (and the rest
        // of a large folio of the host's cache that it ends in).
        let (hot, all) = cached(0..256);
        assert!(
            hot * 20 <= all,
            "dead and history-only chunks: {hot} of {all} pages cached"
        );
        let (hot, all) = cached(256..512);
        assert!(
            hot * 10 >= all * 9,
            "live chunks: {hot} of {all} pages cached"
        );
        assert_eq!(s.read_chunk(&recs[300], true).unwrap().len(), 4096);
        assert_eq!(
            s.read_chunk(&recs[0], true).unwrap().len(),
            4096,
            "still on the device"
        );
    }
}
