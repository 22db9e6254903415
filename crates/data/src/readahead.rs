//! Read-ahead planning for chunks homed on hard disks. On a disk, a read
//! costs a seek plus its size over the bandwidth, so reading one record at
//! a time from a sequential stream wastes most of the time seeking. When a
//! read misses the caches and starts exactly where the last read of the
//! same segment ended, or at the segment's start (a sequential stream;
//! chunks of a file written together lie back to back in a segment, and go
//! on in the next one), one device read fetches a window of the segment
//! instead: every whole chunk in it is checked against its own header
//! (header checksum, data checksum) and put in the RAM cache under its
//! (segment, offset) with its content hash, where only a record with that
//! hash can find it. Random reads seldom start where the last one ended, so
//! they read one chunk as before. This module holds the planner (stream
//! detection per segment, `Readahead::plan`) and the parsing of the whole
//! chunks in a window (`chunks_in`); read.rs reads the windows.

use crate::chunk::{ChunkHeader, CHUNK_HEADER_LEN};
use crate::records::ChunkRec;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
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
pub(crate) enum Plan {
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
    pub(crate) fn plan(&self, rec: &ChunkRec) -> Plan {
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
    pub(crate) fn done(&self, segment: u64, end: u32) {
        let mut m = self.streams.lock();
        let s = m.entry(segment).or_default();
        s.inflight = None;
        s.end = end;
        self.landed.notify_all();
    }

    /// Waits (a bounded time) until `segment` has no window in flight.
    pub(crate) fn wait(&self, segment: u64) {
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
pub(crate) fn chunks_in(buf: &[u8]) -> Vec<(usize, ChunkHeader)> {
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

#[cfg(test)]
mod fuzz_tests;

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
