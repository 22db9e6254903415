//! Reading a stream out of a source pool (HAMMER's mirror-read): its
//! changes after a TID in batches cut at TID boundaries, each batch its
//! commit times, the chunks its new extents name (each once per stream,
//! bytes only when the mirror may lack them), its events and a commit
//! frame; the snapshots before the last commit; then the end frame.

use crate::error::Result;
use crate::frame::{FrameWriter, Kind};
use crate::records::*;
use cairn_data::Hash;
use cairn_fs::replica::{ChunkIn, Event};
use cairn_fs::Fs;
use std::collections::HashSet;
use std::io::Write;

/// Where batches are cut (at the next TID boundary after either limit).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Chunk data of a batch (an upper bound: 64 KiB per chunk named).
    pub bytes: u64,
    pub events: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            bytes: 64 << 20,
            events: 100_000,
        }
    }
}

/// What a stream carried (also the reply to `MirrorRead`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReadReport {
    pub since: u64,
    pub upto: u64,
    pub events: u64,
    pub chunks_sent: u64,
    pub chunks_skipped: u64,
    pub chunk_bytes: u64,
    pub batches: u64,
    pub bytes: u64,
}

/// Which chunks the mirror holds, so that their bytes are not sent.
#[derive(Clone, Copy)]
pub enum Held<'a> {
    /// A one-way stream: those that elements visible at `since` name (one
    /// pass over the source's elements).
    AtSince,
    /// A two-way channel: the mirror's answer (`negotiate::lacking`).
    Answered(&'a dyn Fn(&Hash) -> bool),
}

/// Writes the changes of `fs` after `since` to `out`, with the bytes of
/// the chunks the mirror may lack (`held`).
pub fn read_stream(fs: &Fs, since: u64, out: impl Write, held: Held) -> Result<ReadReport> {
    read_stream_limited(fs, since, out, held, Limits::default())
}

/// `read_stream` with batches cut at `limits`.
pub fn read_stream_limited(
    fs: &Fs,
    since: u64,
    out: impl Write,
    held: Held,
    limits: Limits,
) -> Result<ReadReport> {
    let c = fs.changes_since(since)?;
    let at_since = match held {
        Held::AtSince => fs.held_at(since)?,
        Held::Answered(_) => HashSet::new(),
    };
    let held = |h: &Hash| matches!(held, Held::Answered(f) if f(h));
    let mut w = FrameWriter::new(out);
    let header = Header {
        source: fs.pool().sb.uuid,
        since,
        upto: c.upto,
        key_block: key_block(fs)?,
    };
    w.frame(Kind::Header, &header.encode())?;
    let mut rep = ReadReport {
        since,
        upto: c.upto,
        ..ReadReport::default()
    };
    let mut sent: HashSet<u64> = HashSet::new();
    let mut from = since;
    let mut i = 0;
    loop {
        let end = batch_end(&c.events, i, limits);
        let upto = match end == c.events.len() {
            true => c.upto,
            false => c.events[end - 1].tid,
        };
        // Each batch moves on and commits a TID no lower than the last,
        // holding only events after the last and up to its own.
        assert!(
            (end > i || end == c.events.len()) && upto >= from,
            "batch {i}..{end} commits TID {upto:#x} after {from:#x}"
        );
        debug_assert!(c.events[i..end]
            .iter()
            .all(|e| e.tid > from && e.tid <= upto));
        let tids: Vec<(u64, u64)> = c
            .tids
            .iter()
            .filter(|t| t.0 > from && t.0 <= upto)
            .copied()
            .collect();
        w.frame(Kind::Tids, &encode_tids(&tids))?;
        for e in &c.events[i..end] {
            send_chunks(fs, e, &at_since, &held, &mut sent, &mut w, &mut rep)?;
            w.frame(Kind::Event, &encode_event(e))?;
        }
        if end == c.events.len() {
            w.frame(Kind::Snapshots, &encode_snapshots(&c.snapshots))?;
            w.frame(Kind::Orphans, &encode_orphans(&c.orphans))?;
        }
        w.frame(Kind::Commit, &encode_commit(upto, c.next_ino))?;
        rep.events += (end - i) as u64;
        rep.batches += 1;
        (i, from) = (end, upto);
        if end == c.events.len() {
            break;
        }
    }
    let frames = w.count();
    w.frame(Kind::End, &encode_end(c.upto, frames))?;
    w.flush()?;
    rep.bytes = w.bytes;
    Ok(rep)
}

/// The key block a stream of an encrypted pool carries (its changes are
/// sealed by `changes_since`), as stored.
fn key_block(fs: &Fs) -> Result<Option<[u8; cairn_crypt::KEYBLOCK_LEN]>> {
    let Some(b) = fs.stream_key_block()? else {
        return Ok(None);
    };
    let block = b.try_into().map_err(|b: Vec<u8>| {
        crate::error::StreamError::Refused(format!("a key block of {} bytes", b.len()))
    })?;
    Ok(Some(block))
}

/// Where the batch starting at event `i` ends: past enough events or
/// chunk-naming events, at a change of TID.
fn batch_end(events: &[Event], i: usize, limits: Limits) -> usize {
    let mut j = i;
    let mut weight = 0u64;
    while j < events.len() {
        let cut = j - i >= limits.events || weight >= limits.bytes;
        if cut && events[j].tid != events[j - 1].tid {
            break;
        }
        weight += 64 << 10; // an upper bound of one event's chunk data
        if events[j].chunks().map_or(true, |c| c.is_empty()) {
            weight -= 64 << 10;
        }
        j += 1;
    }
    j
}

/// Sends the chunks event `e` names that this stream has not sent yet:
/// with their bytes, unless the mirror holds them.
fn send_chunks<W: Write>(
    fs: &Fs,
    e: &Event,
    held_at_since: &HashSet<u64>,
    held: &dyn Fn(&Hash) -> bool,
    sent: &mut HashSet<u64>,
    w: &mut FrameWriter<W>,
    rep: &mut ReadReport,
) -> Result<()> {
    for id in e.chunks()? {
        if !sent.insert(id) {
            continue;
        }
        let rec = fs.chunk_record(id)?;
        let hash = rec.hash;
        let data = match held_at_since.contains(&id) || held(&hash) {
            true => None,
            false => Some(fs.stored_chunk(&rec)?),
        };
        match &data {
            Some(d) => {
                rep.chunks_sent += 1;
                rep.chunk_bytes += d.stored.len() as u64;
            }
            None => rep.chunks_skipped += 1,
        }
        w.frame(
            Kind::Chunk,
            &encode_chunk(&ChunkIn {
                src: id,
                hash,
                data,
            }),
        )?;
    }
    Ok(())
}
