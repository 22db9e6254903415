//! Read-ahead for chunks homed on hard disks. On a disk, a read costs a
//! seek plus its size over the bandwidth, so reading one record at a time
//! from a sequential stream wastes most of the time seeking. When a read
//! misses the caches and starts exactly where the last read of the same
//! segment ended, or at the segment's start (a sequential stream; chunks of
//! a file written together lie back to back in a segment, and go on in the
//! next one), one device read fetches a window of the segment instead: every whole chunk in it is checked against its own
//! header (header checksum, data checksum) and put in the RAM cache under
//! its (segment, offset) with its content hash, where only a record with
//! that hash can find it. Random reads seldom start where the last one
//! ended, so they read one chunk as before.

use crate::chunk::{unseal, ChunkHeader, CHUNK_HEADER_LEN};
use crate::error::Result;
use crate::records::ChunkRec;
use crate::store::ChunkStore;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// One segment's stream: where its reads have reached, and the window
/// being read now, if any.
#[derive(Default, Clone, Copy)]
struct Stream {
    end: u32,
    inflight: Option<(u32, u32)>,
}

/// What a cache miss should do.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// Read just the chunk.
    Single,
    /// Read this many bytes from the chunk on (then call `done`).
    Window(u32),
    /// A window being read covers the chunk: wait for it, then look again.
    Wait,
}

/// Sequential-stream detection per segment.
pub(crate) struct Readahead {
    /// Bytes read at once for a sequential stream (0: off).
    window: u32,
    streams: Mutex<HashMap<u64, Stream>>,
    landed: Condvar,
}

/// Segments tracked at most; beyond, idle streams are forgotten.
const MAX_STREAMS: usize = 4096;

impl Readahead {
    pub(crate) fn new(window: u32) -> Self {
        Readahead {
            window,
            streams: Mutex::new(HashMap::new()),
            landed: Condvar::new(),
        }
    }

    /// Plans the read of `rec` after a cache miss. Requests of one stream
    /// often arrive out of order from several threads (kernel read-ahead),
    /// so a read inside a window in flight waits for it instead of
    /// breaking the stream.
    fn plan(&self, rec: &ChunkRec) -> Plan {
        let mut m = self.streams.lock();
        if m.len() >= MAX_STREAMS {
            m.retain(|_, s| s.inflight.is_some());
        }
        let s = m.entry(rec.segment).or_default();
        match s.inflight {
            Some((a, b)) if (a..b).contains(&rec.offset) => Plan::Wait,
            None if rec.offset == s.end && self.window > rec.len => {
                s.inflight = Some((rec.offset, rec.offset + self.window));
                Plan::Window(self.window)
            }
            Some(_) => Plan::Single,
            None => {
                s.end = rec.offset + rec.len;
                Plan::Single
            }
        }
    }

    /// A window of `segment` was read (or failed); the stream goes on at
    /// `end`, the end of its last whole chunk.
    fn done(&self, segment: u64, end: u32) {
        let mut m = self.streams.lock();
        let s = m.entry(segment).or_default();
        s.inflight = None;
        s.end = end;
        self.landed.notify_all();
    }

    /// Waits (a bounded time) until `segment` has no window in flight.
    fn wait(&self, segment: u64) {
        let mut m = self.streams.lock();
        while m.get(&segment).is_some_and(|s| s.inflight.is_some()) {
            if self
                .landed
                .wait_for(&mut m, Duration::from_secs(5))
                .timed_out()
            {
                return;
            }
        }
    }
}

/// Whole sealed chunks at the start of `buf`: (offset in buf, header).
fn chunks_in(buf: &[u8]) -> Vec<(usize, ChunkHeader)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Ok(h) = ChunkHeader::decode(&buf[pos..]) {
        let len = CHUNK_HEADER_LEN + h.stored_len as usize;
        if pos + len > buf.len() {
            break;
        }
        out.push((pos, h));
        pos += len;
    }
    out
}

impl ChunkStore {
    /// Sets the read-ahead window for sequential reads from hard disks.
    pub fn set_readahead(&self, bytes: u32) {
        *self.readahead.write() = Arc::new(Readahead::new(bytes));
    }

    /// Reads `rec` from a hard disk home, with the chunks after it when it
    /// continues a sequential stream (see the module comment). Returns the
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
            return self.read_sealed(rec).map(Some);
        }
        let window = match ra.plan(rec) {
            Plan::Single => return self.read_sealed(rec).map(Some),
            Plan::Wait => {
                ra.wait(rec.segment);
                return Ok(None);
            }
            Plan::Window(w) => w,
        };
        let got = self.read_window(rec, window, offer);
        let end = got.as_ref().map_or(rec.offset, |(_, end)| *end);
        ra.done(rec.segment, end);
        got.map(|(sealed, _)| Some(sealed))
    }

    /// Reads up to `window` bytes of `rec`'s segment from `rec` on, caches
    /// and offers the chunks after it; returns `rec`'s sealed bytes and
    /// where the last whole chunk read ends.
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
            let _gate = self.io_gate.read();
            let (dev, at) = self.locate(rec)?;
            dev.read_at(&mut buf, at)?;
        }
        let mut end = rec.offset + rec.len;
        for (pos, h) in chunks_in(&buf).into_iter().skip(1) {
            let sealed = &buf[pos..pos + CHUNK_HEADER_LEN + h.stored_len as usize];
            let Ok(raw) = unseal(sealed, &h.hash, false) else {
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
mod tests {
    use super::*;
    use crate::chunk::{hash_block, seal};
    use crate::compress::Compression;

    fn rec(segment: u64, offset: u32, len: u32) -> ChunkRec {
        ChunkRec {
            segment,
            offset,
            len,
            raw_len: len,
            hash: [0; 32],
            refs: 1,
            live: 1,
            sums: Vec::new(),
        }
    }

    #[test]
    fn only_a_read_where_the_last_one_ended_reads_ahead() {
        let ra = Readahead::new(1 << 20);
        let w = Plan::Window(1 << 20);
        assert_eq!(ra.plan(&rec(1, 0, 100)), w, "a segment's start");
        ra.done(1, 100);
        assert_eq!(ra.plan(&rec(1, 500, 100)), Plan::Single, "a jump");
        assert_eq!(ra.plan(&rec(1, 600, 100)), w, "continues");
        // While that window is read, a read inside it waits for it, one
        // beyond it reads alone and does not move the stream.
        assert_eq!(ra.plan(&rec(1, 700, 100)), Plan::Wait);
        assert_eq!(ra.plan(&rec(1, 2 << 20, 100)), Plan::Single);
        // The window's whole chunks ended at 9000: the reads inside it hit
        // the cache, so the stream's next miss is there.
        ra.done(1, 9000);
        ra.wait(1);
        assert_eq!(ra.plan(&rec(1, 9000, 100)), w);
        ra.done(1, 20000);
        assert_eq!(ra.plan(&rec(1, 100, 100)), Plan::Single, "a jump back");
        assert_eq!(ra.plan(&rec(2, 9000, 100)), Plan::Single, "another segment");
        let off = Readahead::new(0);
        assert_eq!(off.plan(&rec(1, 0, 9)), Plan::Single);
        assert_eq!(off.plan(&rec(1, 9, 9)), Plan::Single, "off");
    }

    #[test]
    fn parses_whole_chunks_and_stops_at_a_torn_or_bad_one() {
        let mut buf = Vec::new();
        for i in 0..3u8 {
            let raw = vec![i; 1000 + i as usize];
            seal(&raw, &hash_block(&raw), Compression::None, &mut buf);
        }
        let whole = chunks_in(&buf);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[2].1.raw_len, 1002);
        assert_eq!(chunks_in(&buf[..buf.len() - 1]).len(), 2, "torn last");
        let second = whole[1].0;
        buf[second + 20] ^= 1;
        assert_eq!(chunks_in(&buf).len(), 1, "bad header");
    }
}

#[cfg(test)]
mod store_tests {
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
}
