//! Appending chunks: the write batch. A batch seals blocks straight into
//! the aligned buffer of the open segment (`open_segment.rs`; segments are
//! opened in and accounted in the segment table, `segments.rs`), hands each full
//! buffer (4 MiB) to a writer thread (`wpipe.rs`) and goes on sealing into
//! the next while it is written, opens a new segment when the current one
//! is full, and on `finish` writes the rest, waits for every write and syncs
//! every device it touched. Writes are whole DIRECT_ALIGN blocks with
//! O_DIRECT, so they bypass the page cache, unless the buffer holds mostly
//! small chunks (`CACHED_CHUNK`), whose random reads the page cache then
//! serves (the last, partial block is
//! padded with zeros, carried into the next buffer and written again with
//! what follows it); where direct I/O is refused, each buffered write starts
//! its write-back at once. Only after `finish` may metadata that references
//! the new chunks be committed.
//!
//! A segment placed on an object-store device (the local tiers are full)
//! is kept in its buffer until it is closed and then written whole, in one
//! write: the store takes whole objects only, and any sync of the device
//! (this batch's, the tier mover's) may upload what is staged. `finish`
//! closes such a segment, so no later batch appends to it.

use crate::aligned::cached;
use crate::chunk::{header_of, Hash, CHUNK_HEADER_LEN};
use crate::codec::ChunkCodec;
use crate::compress::Compression;
use crate::copies::{CopyTarget, Dropped};
use crate::error::{invariant, DataError, Result};
use crate::layout::Layout;
pub use crate::open_segment::OpenSegment;
use crate::open_segment::SegBuf;
use crate::records::{ChunkRec, SegmentRec};
use crate::segments::Segments;
use crate::wpipe::WritePipe;
use cairn_devices::{SlotAddr, DIRECT_ALIGN};
use parking_lot::MutexGuard;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Buffered bytes are written out once they reach this size.
const WRITE_CHUNK: usize = 4 << 20;
/// A segment buffer's first capacity (a write, and room for the chunk that
/// crosses it; a larger chunk grows the buffer).
const BUF_CAP: usize = WRITE_CHUNK + (1 << 18);

pub struct WriteBatch<'a> {
    segs: &'a Segments,
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
    /// Bytes of chunks kept in the page cache (`cached`) appended since
    /// the last buffer was handed to the pipe.
    cached_bytes: u64,
    /// Copies whose writes failed (taken out of their segments' records
    /// by `finish`).
    dropped: Arc<Dropped>,
    /// The layout the next chunks' files asked for (None: their class's).
    layout: Option<Layout>,
    /// How new chunks are packed (plain or encrypted).
    codec: ChunkCodec,
}

impl<'a> WriteBatch<'a> {
    pub(crate) fn new(
        segs: &'a Segments,
        open: MutexGuard<'a, Option<OpenSegment>>,
        place: Option<u8>,
        compression: Compression,
        codec: ChunkCodec,
    ) -> Self {
        WriteBatch {
            segs,
            place,
            compression,
            open,
            touched: BTreeSet::new(),
            devices: BTreeSet::new(),
            pipe: WritePipe::new(segs.kept_buffers.clone()),
            spare: None,
            cached_bytes: 0,
            dropped: Arc::default(),
            layout: None,
            codec,
        }
    }

    /// How this batch packs new chunks (the store's codec).
    pub fn codec(&self) -> &ChunkCodec {
        &self.codec
    }

    /// The layout of the chunks appended next (a file's policy; None: the
    /// class's). Chunks of different layouts never share a segment: the
    /// open segment of another layout is parked, written out up to its
    /// last partial block, and taken up again when its layout comes back.
    pub fn set_layout(&mut self, layout: Option<Layout>) {
        self.layout = layout;
    }

    /// Appends one block as a new chunk (compressed per the pool setting);
    /// returns its record (refs = 1).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a chunk is at most MAX_RAW_LEN (1 MiB, asserted in header_of)"
    )]
    pub fn append(&mut self, raw: &[u8], hash: &Hash) -> Result<ChunkRec> {
        debug_assert!(
            raw.len() <= crate::chunk::MAX_RAW_LEN as usize,
            "a chunk of {} bytes",
            raw.len()
        );
        let packed = self.codec.pack(self.compression, raw, hash);
        match &packed {
            Some((m, z)) => self.append_stored(*m, raw.len() as u32, z, hash),
            None => self.append_stored(crate::compress::RAW, raw.len() as u32, raw, hash),
        }
    }

    /// Appends a chunk whose stored bytes are given as they are (already
    /// compressed with `method`, or raw): reblock and GC move chunks so,
    /// without decompressing and compressing again.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a chunk is at most MAX_RAW_LEN (1 MiB) plus its header"
    )]
    pub fn append_stored(
        &mut self,
        method: u8,
        raw_len: u32,
        stored: &[u8],
        hash: &Hash,
    ) -> Result<ChunkRec> {
        let len = (CHUNK_HEADER_LEN + stored.len()) as u32;
        assert!(
            len as u64 <= self.segs.segment_size,
            "block larger than a segment"
        );
        // A read refuses a chunk claiming more (`unseal`).
        invariant!(
            raw_len <= crate::chunk::MAX_RAW_LEN,
            "a chunk of {raw_len} raw bytes"
        );
        // An encrypted pool never stores a plain chunk, nor a plain pool
        // one it could not read.
        invariant!(
            self.codec.is_encrypted() == (method & crate::chunk::ENCRYPTED != 0),
            "a chunk of stored form {method:#x} in a pool whose chunks are {}",
            if self.codec.is_encrypted() {
                "encrypted"
            } else {
                "plain"
            }
        );
        if self.open.as_ref().is_some_and(|o| o.layout != self.layout) {
            self.park_open()?;
        }
        let fits = |o: &Option<OpenSegment>| {
            (o.as_ref()).is_some_and(|o| o.used as u64 + len as u64 <= self.segs.segment_size)
        };
        if !fits(&self.open) {
            self.close_open()?;
            *self.open = self.unpark();
            if !fits(&self.open) {
                self.close_open()?;
                self.open_new()?;
            }
        }
        let o = self.open.as_mut().expect("open segment");
        let offset = o.used;
        let seg_size = self.segs.segment_size;
        invariant!(
            offset as u64 + len as u64 <= seg_size,
            "a chunk of {len} bytes at offset {offset} of segment {} (of {seg_size} bytes)",
            o.id
        );
        let mut head = Vec::with_capacity(CHUNK_HEADER_LEN);
        header_of(method, raw_len as usize, stored, hash).encode(&mut head);
        // The record's `len` says where the next chunk starts.
        invariant!(
            head.len() == CHUNK_HEADER_LEN,
            "a chunk header of {} bytes",
            head.len()
        );
        o.buf.push(&[&head, stored]);
        o.used += len;
        if cached(raw_len) {
            self.cached_bytes += len as u64;
        }
        if self.place.is_none() {
            let tail = self.segs.segment_size - o.used as u64;
            self.segs.open_tail.store(tail, Ordering::Relaxed);
        }
        let id = o.id;
        if !o.whole && (o.used - o.written) as usize >= WRITE_CHUNK {
            self.write_buffer()?;
        }
        let mut segs = self.segs.table.write();
        let s = segs.get_mut(&id).expect("open segment in table");
        // The table and the open segment agree on where chunks end: a
        // record naming other bytes would read another chunk's.
        invariant!(
            s.used == offset,
            "segment {id}: the table says {} bytes used, the open segment appends at {offset}",
            s.used
        );
        s.used = offset + len;
        s.live += len as u64;
        s.chunks += 1;
        invariant!(
            s.live <= s.used as u64,
            "segment {id}: {} live bytes of {} appended",
            s.live,
            s.used
        );
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
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within an open segment, whose size is <= 1 GiB (check_geometry); u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn write_buffer(&mut self) -> Result<()> {
        let Some(o) = self.open.as_mut() else {
            return Ok(());
        };
        if o.is_flushed() {
            return Ok(());
        }
        // The buffer holds the segment's bytes from `buf_start` (a block
        // boundary) to `used`: what is written lands where records say.
        invariant!(
            o.buf_start as usize + o.buf.len() == o.used as usize
                && (o.buf_start as usize).is_multiple_of(DIRECT_ALIGN),
            "segment {}: a buffer of {} bytes from {} for {} bytes appended",
            o.id,
            o.buf.len(),
            o.buf_start,
            o.used
        );
        let mut places = Vec::with_capacity(o.places.len());
        for &p in &o.places {
            let dev = self.segs.devices.device(p.device)?;
            let mut base = dev.slot_offset(p.slot);
            if self.segs.misplace.swap(false, Ordering::Relaxed) {
                base += dev.header.size;
            }
            places.push((p, dev.clone(), base));
            self.devices.insert(p.device);
        }
        let target = Arc::new(CopyTarget {
            places,
            dropped: self.dropped.clone(),
            timeout: self.segs.io_timeout.get(),
            segment_size: self.segs.segment_size,
        });
        let mut at = o.buf_start as u64;
        if self.segs.shift_write.swap(false, Ordering::Relaxed) {
            at += self.segs.segment_size;
        }
        let room = (self.segs.segment_size - o.buf_start as u64) as usize;
        let len = o.buf.len().next_multiple_of(DIRECT_ALIGN).min(room);
        invariant!(
            o.buf.len() <= len,
            "segment {}: {} bytes buffered, {len} written",
            o.id,
            o.buf.len()
        );
        let keep_from = o.used as usize / DIRECT_ALIGN * DIRECT_ALIGN;
        let mut next = SegBuf::new(self.pipe.take_buffer(BUF_CAP)?);
        next.push(&[o.buf.tail(keep_from - o.buf_start as usize)]);
        let full = std::mem::replace(&mut o.buf, next);
        // Through the page cache when mostly small chunks (see CACHED_CHUNK);
        // a whole object-store segment in one write, never in pieces.
        let cached = !o.whole && 2 * self.cached_bytes >= (o.used - o.written) as u64;
        self.cached_bytes = 0;
        self.pipe
            .submit(target, at, full.padded(len), len, cached)?;
        o.written = o.used;
        o.buf_start = keep_from as u32;
        Ok(())
    }

    /// Sets the open segment aside for later batches of its layout (one on
    /// an object store is closed instead: it is written whole).
    fn park_open(&mut self) -> Result<()> {
        if self.open.as_ref().is_some_and(|o| o.whole) {
            return self.close_open();
        }
        self.write_buffer()?;
        if let Some(o) = self.open.take() {
            assert!(
                o.is_flushed(),
                "parking segment {} with buffered data",
                o.id
            );
            self.segs.parked.lock().push(o);
        }
        if self.place.is_none() {
            self.segs.open_tail.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A parked segment of the batch's layout on a device its placement
    /// accepts, if there is one.
    fn unpark(&mut self) -> Option<OpenSegment> {
        let devices = &self.segs.devices;
        let rank = |o: &OpenSegment| devices.device(o.first().device).map(|d| d.class().rank());
        let mut parked = self.segs.parked.lock();
        let at = parked.iter().position(|o| {
            o.layout == self.layout
                && match self.place {
                    None => true,
                    Some(r) => rank(o).is_ok_and(|x| x >= r),
                }
        })?;
        let o = parked.swap_remove(at);
        self.touched.insert(o.id);
        Some(o)
    }

    fn close_open(&mut self) -> Result<()> {
        self.write_buffer()?;
        if let Some(mut o) = self.open.take() {
            o.buf.clear();
            self.spare = Some(o.buf);
        }
        if self.place.is_none() {
            self.segs.open_tail.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    fn open_new(&mut self) -> Result<()> {
        let devices = &self.segs.devices;
        let first = match self.place {
            None => devices.allocate(),
            // Chunks of a cold segment stay on its tier; those of one on an
            // object store (which takes no appends) on the slowest local
            // tier with room.
            Some(rank) => devices
                .allocate_where(|d, _, _| d.class().rank() >= rank)
                .or_else(|_| devices.allocate_where(|d, _, _| d.class().rank() >= rank.min(2)))
                .or_else(|_| devices.allocate()),
        }
        .map_err(|_| DataError::NoSpace)?;
        let class = devices.device(first.device)?.class();
        let whole = class.is_object_store();
        let layout = self.segs.policy.read().segment_layout(class, self.layout);
        let want = layout.copies();
        if layout.ec().is_some() {
            // The segment sealed before this one waits for a stripe.
            self.segs.short.store(true, Ordering::Relaxed);
        }
        let mut places = vec![first];
        if want > 1 && !whole {
            let rank = class.rank();
            places.extend(devices.allocate_copies(&[first], rank, want - 1, |_, _, _| true));
            self.segs.note_copies(places.len(), want);
        }
        let id = self.segs.next_segment.fetch_add(1, Ordering::SeqCst);
        let mut rec = SegmentRec::new_at(&places);
        rec.layout = self.layout.filter(|_| !whole);
        let mut table = self.segs.table.write();
        // Segment ids are never reused: a new one over a stored segment
        // would lose every chunk that segment holds.
        invariant!(
            !table.contains_key(&id),
            "new segment {id} over a segment of the table"
        );
        table.insert(id, rec);
        drop(table);
        *self.open = Some(OpenSegment {
            id,
            places,
            used: 0,
            buf_start: 0,
            buf: self.new_buffer()?,
            written: 0,
            whole,
            layout: self.layout,
        });
        self.touched.insert(id);
        Ok(())
    }

    /// Syncs every device the batch wrote to, at once (copies on several
    /// devices cost the slowest sync, not their sum): each one's outcome.
    /// With several, each is waited for at most the I/O timeout (one that
    /// does not answer is `Hung`, see `deadline.rs`).
    fn sync_devices(&mut self) -> Result<Vec<(u32, Result<()>)>> {
        let ids = std::mem::take(&mut self.devices);
        let devs = (ids.iter())
            .map(|d| self.segs.devices.device(*d).map(|dev| (*d, dev)))
            .collect::<cairn_devices::error::Result<Vec<_>>>()?;
        let failed = |d: u32| move |e| DataError::of_write(d, e);
        if devs.len() <= 1 {
            let sync =
                |(d, dev): (u32, Arc<cairn_devices::Device>)| (d, dev.sync().map_err(failed(d)));
            return Ok(devs.into_iter().map(sync).collect());
        }
        let jobs: Vec<(u32, crate::deadline::DeviceJob)> = (devs.iter())
            .map(|(d, dev)| {
                let (d, dev) = (*d, dev.clone());
                let job = move || dev.sync().map_err(failed(d));
                (d, Box::new(job) as crate::deadline::DeviceJob)
            })
            .collect();
        let done = crate::deadline::devices_within(self.segs.io_timeout.get(), jobs);
        Ok(ids.into_iter().zip(done).collect())
    }

    /// A sync of device `d` failed: every copy this batch wrote there is
    /// dropped (an error if one was the last copy of a segment that the
    /// batch's writes or syncs have not dropped already).
    fn drop_device(&mut self, d: u32, e: DataError) -> Result<()> {
        let on_d: Vec<SlotAddr> = {
            let segs = self.segs.table.read();
            (self.touched.iter().filter_map(|id| segs.get(id)))
                .flat_map(|s| s.places())
                .filter(|p| p.device == d)
                .collect()
        };
        let only = {
            let segs = self.segs.table.read();
            (self.touched.iter().filter_map(|id| segs.get(id)))
                .any(|s| (s.places().iter()).all(|p| p.device == d || self.dropped.has(*p)))
        };
        if only {
            return Err(e);
        }
        if matches!(e, DataError::Hung { .. }) {
            self.segs.fault(d);
        }
        for p in on_d {
            self.dropped
                .note_failed(p, DataError::Writer("sync failed"));
        }
        tracing::error!("{e}: the copies written there are dropped and made again elsewhere");
        Ok(())
    }

    /// Takes the dropped copies out of their segments (the open segment's
    /// next writes skip them too), releases their slots and counts the
    /// failure against their devices.
    fn take_dropped(&mut self) -> Result<()> {
        let dropped = self.dropped.take();
        for (addr, why) in &dropped {
            tracing::error!(
                "a copy on device {} failed ({why}): the pool goes on with the other copies",
                addr.device
            );
            let n = self.segs.devices.note_write_error(addr.device);
            if n >= cairn_devices::set::FAILING_AFTER || matches!(why, DataError::Hung { .. }) {
                self.segs.fault(addr.device);
            }
            self.segs.drop_copy(*addr)?;
            if let Some(o) = self.open.as_mut() {
                o.places.retain(|p| p != addr);
            }
            for o in self.segs.parked.lock().iter_mut() {
                o.places.retain(|p| p != addr);
            }
        }
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
    /// segment records to commit with the metadata (without the copies
    /// whose writes or syncs failed, while another copy took them).
    pub fn finish(mut self) -> Result<Vec<(u64, SegmentRec)>> {
        match self.open.as_ref().is_some_and(|o| o.whole) {
            true => self.close_open()?,
            false => self.write_buffer()?,
        }
        self.pipe.drain()?;
        for (d, res) in self.sync_devices()? {
            if let Err(e) = res {
                self.drop_device(d, e)?;
            }
        }
        self.take_dropped()?;
        let segs = self.segs.table.read();
        Ok(self
            .touched
            .iter()
            .filter_map(|id| segs.get(id).map(|s| (*id, s.clone())))
            .collect())
    }
}
