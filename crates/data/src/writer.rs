//! Appending chunks: the open segment and a write batch. A batch seals
//! blocks straight into the open segment's aligned buffer, hands each full
//! buffer (4 MiB) to a writer thread (`wpipe.rs`) and goes on sealing into
//! the next while it is written, opens a new segment when the current one
//! is full, and on `finish` writes the rest, waits for every write and syncs
//! every device it touched. Writes are whole DIRECT_ALIGN blocks with
//! O_DIRECT, so they bypass the page cache (the last, partial block is
//! padded with zeros, carried into the next buffer and written again with
//! what follows it); where direct I/O is refused, each buffered write starts
//! its write-back at once. Only after `finish` may metadata that references
//! the new chunks be committed.

use crate::aligned::AlignedBuf;
use crate::chunk::{header_of, Hash, CHUNK_HEADER_LEN};
use crate::compress::{compress, Compression};
use crate::error::{DataError, Result};
use crate::records::{ChunkRec, SegmentRec};
use crate::store::ChunkStore;
use crate::wpipe::WritePipe;
use cairn_devices::{SlotAddr, DIRECT_ALIGN};
use parking_lot::MutexGuard;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

/// Buffered bytes are written out once they reach this size.
const WRITE_CHUNK: usize = 4 << 20;
/// A segment buffer's first capacity (a write, and room for the chunk that
/// crosses it; a larger chunk grows the buffer).
const BUF_CAP: usize = WRITE_CHUNK + (1 << 18);

/// The open segment's bytes from `OpenSegment::buf_start` on, in an aligned
/// buffer, so that whole blocks go to the device without another copy.
pub(crate) struct SegBuf {
    buf: AlignedBuf,
    len: usize,
}

impl SegBuf {
    fn new(buf: AlignedBuf) -> Self {
        SegBuf { buf, len: 0 }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Appends `parts` one after another, growing the buffer if needed
    /// (always leaving room to pad to the next DIRECT_ALIGN boundary).
    fn push(&mut self, parts: &[&[u8]]) {
        let n: usize = parts.iter().map(|p| p.len()).sum();
        let need = self.len + n + DIRECT_ALIGN;
        if need > self.buf.capacity() {
            let mut bigger = AlignedBuf::new(need.max(2 * self.buf.capacity()), DIRECT_ALIGN);
            bigger
                .slice_mut(self.len)
                .copy_from_slice(self.buf.slice_mut(self.len));
            self.buf = bigger;
        }
        let all = self.buf.slice_mut(self.len + n);
        for p in parts {
            all[self.len..self.len + p.len()].copy_from_slice(p);
            self.len += p.len();
        }
    }

    /// The bytes from `from` on.
    fn tail(&mut self, from: usize) -> &[u8] {
        &self.buf.slice_mut(self.len)[from..]
    }

    /// The buffer with zeros after the bytes up to `len`, to be written.
    fn padded(mut self, len: usize) -> AlignedBuf {
        assert!(self.len <= len && len <= self.buf.capacity());
        self.buf.slice_mut(len)[self.len..].fill(0);
        self.buf
    }
}

pub struct OpenSegment {
    pub(crate) id: u64,
    pub(crate) addr: SlotAddr,
    /// Bytes appended, including those still in `buf`.
    pub(crate) used: u32,
    /// Segment offset where `buf` starts (a multiple of DIRECT_ALIGN).
    buf_start: u32,
    /// The segment's bytes from `buf_start` to `used`.
    buf: SegBuf,
    /// Bytes up to here are written to the device.
    written: u32,
}

impl OpenSegment {
    /// True when nothing appended is still only in memory.
    pub(crate) fn is_flushed(&self) -> bool {
        self.written == self.used
    }
}

pub struct WriteBatch<'a> {
    store: &'a ChunkStore,
    /// None: new data, placed on the fastest tier with room. Some(rank):
    /// moved data, kept on devices of that class rank or slower.
    place: Option<u8>,
    compression: Compression,
    open: MutexGuard<'a, Option<OpenSegment>>,
    touched: BTreeSet<u64>,
    devices: BTreeSet<u32>,
    /// Writes full buffers while the next one is filled.
    pipe: WritePipe,
    /// The buffer of the last closed segment, for the next one.
    spare: Option<SegBuf>,
}

impl<'a> WriteBatch<'a> {
    pub(crate) fn new(
        store: &'a ChunkStore,
        open: MutexGuard<'a, Option<OpenSegment>>,
        place: Option<u8>,
    ) -> Self {
        WriteBatch {
            store,
            place,
            compression: store.compression(),
            open,
            touched: BTreeSet::new(),
            devices: BTreeSet::new(),
            pipe: WritePipe::default(),
            spare: None,
        }
    }

    /// Appends one block as a new chunk (compressed per the pool setting);
    /// returns its record (refs = 1).
    pub fn append(&mut self, raw: &[u8], hash: &Hash) -> Result<ChunkRec> {
        let packed = compress(self.compression, raw);
        match &packed {
            Some((m, z)) => self.append_stored(*m, raw.len() as u32, z, hash),
            None => self.append_stored(crate::compress::RAW, raw.len() as u32, raw, hash),
        }
    }

    /// Appends a chunk whose stored bytes are given as they are (already
    /// compressed with `method`, or raw): reblock and GC move chunks so,
    /// without decompressing and compressing again.
    pub fn append_stored(
        &mut self,
        method: u8,
        raw_len: u32,
        stored: &[u8],
        hash: &Hash,
    ) -> Result<ChunkRec> {
        let len = (CHUNK_HEADER_LEN + stored.len()) as u32;
        assert!(
            len as u64 <= self.store.segment_size,
            "block larger than a segment"
        );
        let fits = self
            .open
            .as_ref()
            .is_some_and(|o| o.used as u64 + len as u64 <= self.store.segment_size);
        if !fits {
            self.close_open()?;
            self.open_new()?;
        }
        let o = self.open.as_mut().expect("open segment");
        let offset = o.used;
        let mut head = Vec::with_capacity(CHUNK_HEADER_LEN);
        header_of(method, raw_len as usize, stored, hash).encode(&mut head);
        o.buf.push(&[&head, stored]);
        o.used += len;
        if self.place.is_none() {
            let tail = self.store.segment_size - o.used as u64;
            self.store.open_tail.store(tail, Ordering::Relaxed);
        }
        let id = o.id;
        if (o.used - o.written) as usize >= WRITE_CHUNK {
            self.write_buffer()?;
        }
        let mut segs = self.store.segments.write();
        let s = segs.get_mut(&id).expect("open segment in table");
        s.used = offset + len;
        s.live += len as u64;
        s.chunks += 1;
        self.touched.insert(id);
        Ok(ChunkRec {
            segment: id,
            offset,
            len,
            raw_len,
            refs: 1,
            live: 1,
            hash: *hash,
            sums: if method == crate::compress::RAW {
                ChunkRec::sums_of(stored)
            } else {
                Vec::new()
            },
        })
    }

    /// Hands the buffered bytes to the writer thread (padded to whole
    /// blocks) and carries the partial last block into a fresh buffer, to be
    /// written again when it grows.
    fn write_buffer(&mut self) -> Result<()> {
        let Some(o) = self.open.as_mut() else {
            return Ok(());
        };
        if o.is_flushed() {
            return Ok(());
        }
        let dev = self.store.devices.device(o.addr.device)?;
        let at = dev.slot_offset(o.addr.slot) + o.buf_start as u64;
        let room = (self.store.segment_size - o.buf_start as u64) as usize;
        let len = o.buf.len().next_multiple_of(DIRECT_ALIGN).min(room);
        let keep_from = o.used as usize / DIRECT_ALIGN * DIRECT_ALIGN;
        let mut next = SegBuf::new(self.pipe.take_buffer(BUF_CAP)?);
        next.push(&[o.buf.tail(keep_from - o.buf_start as usize)]);
        let full = std::mem::replace(&mut o.buf, next);
        self.pipe.submit(dev, at, full.padded(len), len)?;
        self.devices.insert(o.addr.device);
        o.written = o.used;
        o.buf_start = keep_from as u32;
        Ok(())
    }

    fn close_open(&mut self) -> Result<()> {
        self.write_buffer()?;
        if let Some(mut o) = self.open.take() {
            o.buf.len = 0;
            self.spare = Some(o.buf);
        }
        if self.place.is_none() {
            self.store.open_tail.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    fn open_new(&mut self) -> Result<()> {
        let devices = &self.store.devices;
        let addr = match self.place {
            None => devices.allocate(),
            Some(rank) => devices
                .allocate_where(|d, _, _| d.class().rank() >= rank)
                .or_else(|_| devices.allocate()),
        }
        .map_err(|_| DataError::NoSpace)?;
        let id = self.store.next_segment.fetch_add(1, Ordering::SeqCst);
        self.store.segments.write().insert(
            id,
            SegmentRec {
                device: addr.device,
                slot: addr.slot,
                used: 0,
                live: 0,
                chunks: 0,
                hist: 0,
                flags: 0,
            },
        );
        *self.open = Some(OpenSegment {
            id,
            addr,
            used: 0,
            buf_start: 0,
            buf: self.new_buffer()?,
            written: 0,
        });
        self.touched.insert(id);
        Ok(())
    }

    /// An empty segment buffer: the last closed segment's, else a new one.
    fn new_buffer(&mut self) -> Result<SegBuf> {
        match self.spare.take() {
            Some(b) => Ok(b),
            None => Ok(SegBuf::new(self.pipe.take_buffer(BUF_CAP)?)),
        }
    }

    /// Writes everything out and syncs the touched devices. Returns the
    /// segment records to commit with the metadata.
    pub fn finish(mut self) -> Result<Vec<(u64, SegmentRec)>> {
        self.write_buffer()?;
        self.pipe.drain()?;
        for d in &self.devices {
            self.store.devices.device(*d)?.sync()?;
        }
        let segs = self.store.segments.read();
        Ok(self
            .touched
            .iter()
            .filter_map(|id| segs.get(id).map(|s| (*id, s.clone())))
            .collect())
    }
}

#[cfg(test)]
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
    fn segment_buffer_pads_over_stale_bytes_and_grows() {
        use super::SegBuf;
        use crate::aligned::AlignedBuf;
        let stale = || {
            let mut b = AlignedBuf::new(32_768, 4096);
            b.slice_mut(32_768).fill(0xff);
            SegBuf::new(b)
        };
        let mut b = stale();
        b.push(&[&[1u8; 5000], &[2u8; 10_000]]);
        assert_eq!(b.len(), 15_000);
        assert_eq!(b.tail(4999)[..2], [1, 2]);
        let mut out = b.padded(16_384);
        let all = out.slice_mut(16_384);
        assert!(all[..5000].iter().all(|&x| x == 1));
        assert!(all[5000..15_000].iter().all(|&x| x == 2));
        assert!(all[15_000..].iter().all(|&x| x == 0), "padding is zeros");
        let mut b = stale();
        b.push(&[&[3u8; 20_000]]);
        b.push(&[&[4u8; 20_000]]); // beyond the capacity: grows, keeps bytes
        assert_eq!(b.len(), 40_000);
        assert!(b.tail(0)[..20_000].iter().all(|&x| x == 3));
        assert!(b.tail(20_000).iter().all(|&x| x == 4));
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
}
