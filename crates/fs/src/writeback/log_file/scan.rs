//! Reading one region of the intent log back at open: the run of records
//! from its start, each taken from its own place or, when that is damaged,
//! from its copy in the region's second half (version 3); and, where the
//! run stops, the search that tells a torn tail (nothing valid after it)
//! from damage in the middle of the log (valid records of the same run
//! after it), so that damage is never taken for the end of the log.

use super::{checksum, parse_head, Layout, LogFile, Record, HEADER_LEN, MAGIC};
use std::io;

/// One region's records as `LogFile::scan` read them.
pub(super) struct Scan {
    pub records: Vec<Record>,
    /// Where they end, from the region's start.
    pub end: u64,
    /// How the region's records are laid out (its first record's version).
    pub layout: Layout,
    /// Valid records of the run found after where it stopped: the run
    /// stopped at damage, and these were not read (see `Damage`).
    pub after: Vec<Record>,
}

/// What a record read at a place must continue.
#[derive(Clone, Copy)]
struct Chain {
    /// The run's base TID (its first record's), None for the first record.
    base: Option<u64>,
    seq: u64,
    version: u16,
}

/// Bytes searched at a time for a later record's magic.
const SEARCH_CHUNK: usize = 4 << 20;

impl LogFile {
    /// Reads the valid records of `region` in order from its start (each
    /// of this pool, of the first one's base TID, with the next sequence
    /// number and a good checksum, from its own place or its copy), then,
    /// when the run may be live (`live` holds its base, or it is empty and
    /// the region's start holds no record of an older TID), looks for
    /// valid records of it after where it stopped.
    pub(super) fn scan(&self, region: u64, live: &[u64]) -> io::Result<Scan> {
        let start = region * self.region_len;
        let layout = self.layout_at(start, region)?;
        let mut s = Scan {
            records: Vec::new(),
            end: 0,
            layout,
            after: Vec::new(),
        };
        while let Some((rec, len)) = self.record_at(start, s.end, layout, chain(&s))? {
            s.records.push(rec);
            s.end += len;
        }
        let base = s.records.first().map(|r| r.0.base_tid);
        let may_be_live = match base {
            Some(b) => live.contains(&b),
            None => !self.starts_stale(start, live)?,
        };
        if may_be_live {
            s.after = self.later_records(start, &s, live)?;
        }
        Ok(s)
    }

    /// The layout of the region at `start`: mirrored when its first record
    /// reads as version 3 from either place, else the version its first
    /// header names (1 only in region 0), else mirrored (an empty region).
    fn layout_at(&self, start: u64, region: u64) -> io::Result<Layout> {
        let first = Chain {
            base: None,
            seq: 0,
            version: Layout::Mirrored.version(),
        };
        if self.record_at(start, 0, Layout::Mirrored, first)?.is_some() {
            return Ok(Layout::Mirrored);
        }
        let mut h = [0u8; HEADER_LEN];
        let read = self
            .places
            .iter()
            .find_map(|p| p.io.read_at(&mut h, start).err());
        if let (Some(e), 1) = (read, self.places.len()) {
            return Err(e);
        }
        Ok(match parse_head(&h).ok().map(|(_, _, v)| v) {
            Some(v) if v == Layout::OneRegion.version() && region == 0 => Layout::OneRegion,
            Some(v) if v == Layout::Unmirrored.version() => Layout::Unmirrored,
            _ => Layout::Mirrored,
        })
    }

    /// The record at `pos` of the region at `start` that continues `c`,
    /// from its own place or else its copy, with its length in the log.
    fn record_at(
        &self,
        start: u64,
        pos: u64,
        layout: Layout,
        c: Chain,
    ) -> io::Result<Option<(Record, u64)>> {
        let limit = layout.limit(self.region_len);
        for p in 0..self.places.len() {
            for copy in layout.copies(self.region_len) {
                let at = start + copy + pos;
                if let Some(r) = self.valid_at(p, at, limit.saturating_sub(pos), c)? {
                    return Ok(Some(r));
                }
            }
        }
        Ok(None)
    }

    /// A record at `off` of place `p` (at most `room` bytes long) that
    /// belongs to this pool and continues `c`, with a good checksum. A
    /// place that cannot be read there has none (another may).
    fn valid_at(
        &self,
        p: usize,
        off: u64,
        room: u64,
        c: Chain,
    ) -> io::Result<Option<(Record, u64)>> {
        if room < HEADER_LEN as u64 {
            return Ok(None);
        }
        let io = &self.places[p].io;
        let mut h = [0u8; HEADER_LEN];
        if let Err(e) = io.read_at(&mut h, off) {
            return self.unreadable(p, e);
        }
        let Ok((head, len, version)) = parse_head(&h) else {
            return Ok(None);
        };
        let total = (HEADER_LEN + len) as u64;
        if head.uuid != self.uuid
            || version != c.version
            || c.base.is_some_and(|b| b != head.base_tid)
            || head.seq != c.seq
            || total > room
        {
            return Ok(None);
        }
        let mut payload = vec![0u8; len];
        if let Err(e) = io.read_at(&mut payload, off + HEADER_LEN as u64) {
            return self.unreadable(p, e);
        }
        if checksum(&h, &payload)
            != u32::from_le_bytes(
                h[56..60]
                    .try_into()
                    .expect("slice length matches the array"),
            )
        {
            return Ok(None);
        }
        Ok(Some(((head, payload), total)))
    }

    /// Whether the region at `start` begins with a valid record of a TID
    /// that is not live: a run on a live TID would have overwritten it.
    fn starts_stale(&self, start: u64, live: &[u64]) -> io::Result<bool> {
        for p in 0..self.places.len() {
            let mut h = [0u8; HEADER_LEN];
            if self.places[p].io.read_at(&mut h, start).is_err() {
                continue;
            }
            let Ok((head, _, version)) = parse_head(&h) else {
                continue;
            };
            let c = Chain {
                base: Some(head.base_tid),
                seq: 0,
                version,
            };
            if self.valid_at(p, start, self.region_len, c)?.is_some() {
                return Ok(head.uuid == self.uuid && !live.contains(&head.base_tid));
            }
        }
        Ok(false)
    }

    /// A read error in one of several places: that place has no record
    /// there (logged); with one place, the error.
    fn unreadable<T>(&self, p: usize, e: io::Error) -> io::Result<Option<T>> {
        if self.places.len() == 1 {
            return Err(e);
        }
        tracing::warn!(
            "intent log: the copy on {} cannot be read ({e}); reading the others",
            self.places[p].name.display()
        );
        Ok(None)
    }

    /// Valid records that continue the run `s` stopped at (same pool and
    /// version, its base or, for an empty run, a live base, and a later
    /// sequence number) found anywhere after its end, in either place:
    /// the first such record and those that follow it.
    fn later_records(&self, start: u64, s: &Scan, live: &[u64]) -> io::Result<Vec<Record>> {
        let limit = s.layout.limit(self.region_len);
        let n = s.records.len() as u64;
        let base = s.records.first().map(|r| r.0.base_tid);
        let mut first: Option<(u64, super::RecordHead)> = None;
        for p in 0..self.places.len() {
            for copy in s.layout.copies(self.region_len) {
                let found = self.search(p, start + copy, s.end + 1, limit, |h, v| {
                    h.uuid == self.uuid
                        && v == s.layout.version()
                        && h.seq > n
                        && base.map_or(live.contains(&h.base_tid), |b| b == h.base_tid)
                })?;
                // The earliest anywhere (another copy may be damaged there).
                if found.is_some_and(|f| first.is_none_or(|b| f.1.seq < b.1.seq)) {
                    first = found;
                }
            }
        }
        match first {
            Some((pos, head)) => self.run_from(start, pos, s.layout, head),
            None => Ok(Vec::new()),
        }
    }

    /// The records from the one at `pos` (whose header is `head`) on.
    fn run_from(
        &self,
        start: u64,
        mut pos: u64,
        layout: Layout,
        head: super::RecordHead,
    ) -> io::Result<Vec<Record>> {
        let mut c = Chain {
            base: Some(head.base_tid),
            seq: head.seq,
            version: layout.version(),
        };
        let mut out = Vec::new();
        while let Some((rec, len)) = self.record_at(start, pos, layout, c)? {
            out.push(rec);
            pos += len;
            c.seq += 1;
        }
        Ok(out)
    }

    /// The first place in `[from, to)` of the area at `at` of place `p`
    /// holding a record header `wanted` accepts whose record is valid, by
    /// its offset from `at`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "min with SEARCH_CHUNK, a usize"
    )]
    fn search(
        &self,
        p: usize,
        at: u64,
        from: u64,
        to: u64,
        wanted: impl Fn(&super::RecordHead, u16) -> bool,
    ) -> io::Result<Option<(u64, super::RecordHead)>> {
        let mut buf = vec![0u8; SEARCH_CHUNK];
        let mut pos = from;
        while pos + HEADER_LEN as u64 <= to {
            let len = (SEARCH_CHUNK as u64).min(to - pos) as usize;
            if let Err(e) = self.places[p].io.read_at(&mut buf[..len], at + pos) {
                return self.unreadable(p, e);
            }
            for i in memchr::memmem::find_iter(&buf[..len], &MAGIC) {
                let o = pos + i as u64;
                let mut h = [0u8; HEADER_LEN];
                if let Err(e) = self.places[p].io.read_at(&mut h, at + o) {
                    return self.unreadable(p, e);
                }
                let Ok((head, _, v)) = parse_head(&h) else {
                    continue;
                };
                let c = Chain {
                    base: Some(head.base_tid),
                    seq: head.seq,
                    version: v,
                };
                if wanted(&head, v) && self.valid_at(p, at + o, to - o, c)?.is_some() {
                    return Ok(Some((o, head)));
                }
            }
            // Overlap by a magic's length, so none is cut in two.
            pos += (len as u64).saturating_sub(MAGIC.len() as u64 - 1).max(1);
        }
        Ok(None)
    }
}

/// What the next record of `s` must continue.
fn chain(s: &Scan) -> Chain {
    Chain {
        base: s.records.first().map(|r| r.0.base_tid),
        seq: s.records.len() as u64,
        version: s.layout.version(),
    }
}
