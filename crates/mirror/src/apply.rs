//! Applying a stream to a mirror pool (HAMMER's mirror-write). The header
//! must name the mirror's source (or bind a fresh mirror to it) and start
//! at the mirror's TID; each batch is applied in one transaction when its
//! commit frame arrives, so an interrupted stream leaves the mirror at the
//! TID of its last complete batch, where the next stream resumes.
//! `check_stream` reads a whole stream without applying anything, so that
//! a stream from a file or a pipe is refused before it changes the mirror.

use crate::error::{Result, StreamError};
use crate::frame::{FrameReader, Kind};
use crate::records::*;
use cairn_fs::replica::{Batch, Role};
use cairn_fs::Fs;
use std::collections::HashMap;
use std::io::Read;

/// What applying a stream did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ApplyReport {
    pub since: u64,
    pub upto: u64,
    pub batches: u64,
    pub events: u64,
    pub chunks: u64,
    /// Streams applied (several when streams were given one after another).
    pub streams: u64,
}

/// How a mirror takes a stream.
#[derive(Debug, Default, Clone, Copy)]
pub struct ApplyOptions {
    /// Take a stream from the old source of a promoted mirror.
    pub force: bool,
}

/// Reads every frame of a stream and checks its structure (numbering,
/// checksums, record syntax, TID order, the end frame); returns its
/// header.
pub fn check_stream(input: impl Read) -> Result<Header> {
    check_one(&mut FrameReader::new(input))
}

/// Checks every stream of an input that holds several one after another
/// (`cat a.stream b.stream`), each starting where the one before ends,
/// and refuses bytes after the last that are not a stream; returns their
/// headers.
pub fn check_streams(input: impl Read) -> Result<Vec<Header>> {
    let mut r = FrameReader::new(input);
    let mut headers: Vec<Header> = Vec::new();
    loop {
        let start = r.offset();
        let h = check_one(&mut r).map_err(|e| not_a_stream(e, &headers, start))?;
        if let Some(prev) = headers.last() {
            follows(prev, &h, headers.len() + 1)?;
        }
        headers.push(h);
        if r.at_end()? {
            return Ok(headers);
        }
        r.next_stream();
    }
}

/// An error in a stream after the first: said with what came before.
fn not_a_stream(e: StreamError, before: &[Header], at: u64) -> StreamError {
    match before.last() {
        None => e,
        Some(last) => StreamError::Trailing {
            streams: before.len(),
            upto: last.upto,
            at,
            why: Box::new(e),
        },
    }
}

/// Stream `n` must take up where stream `n - 1` ends, from the same pool.
fn follows(prev: &Header, h: &Header, n: usize) -> Result<()> {
    if h.source == prev.source && h.since == prev.upto {
        return Ok(());
    }
    Err(StreamError::Refused(format!(
        "stream {n} of the input holds the changes of pool {} after TID {:#x}, and stream {} ends at TID {:#x} of pool {}: streams given together must follow each other",
        uuid(&h.source),
        h.since,
        n - 1,
        prev.upto,
        uuid(&prev.source)
    )))
}

fn check_one<R: Read>(r: &mut FrameReader<R>) -> Result<Header> {
    let header = read_header(r)?;
    let mut last = header.since;
    loop {
        let (kind, body) = r.read_frame()?;
        match kind {
            Kind::Tids => drop(decode_tids(&body)?),
            Kind::Chunk => drop(decode_chunk(&body)?),
            Kind::Event => {
                let e = decode_event(&body)?;
                if e.tid <= last {
                    return Err(out_of_order(e.tid, last));
                }
            }
            Kind::Snapshots => drop(decode_snapshots(&body)?),
            Kind::Orphans => drop(decode_orphans(&body)?),
            Kind::Commit => last = check_commit(&body, last, &header)?,
            Kind::End => return check_end(&body, &header, last, r.count() - 1).map(|_| header),
            Kind::Header => return Err(StreamError::Damaged("a second header".into())),
        }
    }
}

/// Applies a stream to `fs`, a mirror pool.
pub fn apply_stream(fs: &Fs, input: impl Read, opts: ApplyOptions) -> Result<ApplyReport> {
    apply_one(fs, &mut FrameReader::new(input), opts)
}

/// Applies the streams of an input that holds several one after another
/// (check them first with `check_streams`); a failure says how many were
/// applied before it.
pub fn apply_streams(fs: &Fs, input: impl Read, opts: ApplyOptions) -> Result<ApplyReport> {
    let mut r = FrameReader::new(input);
    let mut total: Option<ApplyReport> = None;
    loop {
        let rep = apply_one(fs, &mut r, opts).map_err(|e| after_applied(e, total))?;
        total = Some(match total {
            None => rep,
            Some(t) => ApplyReport {
                since: t.since,
                upto: rep.upto,
                batches: t.batches + rep.batches,
                events: t.events + rep.events,
                chunks: t.chunks + rep.chunks,
                streams: t.streams + 1,
            },
        });
        if r.at_end()? {
            return Ok(total.unwrap_or_default());
        }
        r.next_stream();
    }
}

fn after_applied(e: StreamError, done: Option<ApplyReport>) -> StreamError {
    match done {
        None => e,
        Some(d) => StreamError::AfterApplied {
            streams: d.streams,
            upto: d.upto,
            why: Box::new(e),
        },
    }
}

fn apply_one<R: Read>(fs: &Fs, r: &mut FrameReader<R>, opts: ApplyOptions) -> Result<ApplyReport> {
    let header = read_header(r)?;
    bind(fs, &header, opts)?;
    let mut rep = ApplyReport {
        since: header.since,
        upto: header.since,
        streams: 1,
        ..ApplyReport::default()
    };
    let mut ids = HashMap::new();
    let new_batch = || Batch {
        sealed: header.is_sealed(),
        ..Batch::default()
    };
    let mut batch = new_batch();
    loop {
        let (kind, body) = r.read_frame()?;
        match kind {
            Kind::Tids => batch.tids.extend(decode_tids(&body)?),
            Kind::Chunk => batch.chunks.push(decode_chunk(&body)?),
            Kind::Event => batch.events.push(decode_event(&body)?),
            Kind::Snapshots => batch.snapshots = Some(decode_snapshots(&body)?),
            Kind::Orphans => batch.orphans = Some(decode_orphans(&body)?),
            Kind::Commit => {
                batch.upto = check_commit(&body, rep.upto, &header)?;
                batch.next_ino = decode_commit(&body)?.1;
                rep.events += batch.events.len() as u64;
                rep.chunks += batch.chunks.iter().filter(|c| c.data.is_some()).count() as u64;
                rep.upto = fs.apply_batch(&std::mem::replace(&mut batch, new_batch()), &mut ids)?;
                rep.batches += 1;
            }
            Kind::End => {
                check_end(&body, &header, rep.upto, r.count() - 1)?;
                return Ok(rep);
            }
            Kind::Header => return Err(StreamError::Damaged("a second header".into())),
        }
    }
}

fn read_header<R: Read>(r: &mut FrameReader<R>) -> Result<Header> {
    match r.read_frame()? {
        (Kind::Header, body) => Header::decode(&body),
        (k, _) => Err(StreamError::Damaged(format!(
            "starts with a {k:?} frame, not a header"
        ))),
    }
}

/// Checks that the stream is for this mirror and starts where it ends;
/// binds a fresh mirror to the stream's source.
fn bind(fs: &Fs, h: &Header, opts: ApplyOptions) -> Result<()> {
    let at = fs.last_tid();
    let refuse = |why: String| Err(StreamError::Refused(why));
    let role = fs.mirror_role()?;
    match role {
        Role::Normal => {
            return refuse("the target is not a mirror pool (make one with `cairn mkfs --mirror`)".into())
        }
        Role::Mirror { source } | Role::Promoted { source } if source != h.source => {
            return refuse(format!(
                "the stream comes from pool {}, and the target mirrors pool {}",
                uuid(&h.source),
                uuid(&source)
            ))
        }
        Role::Promoted { .. } if !opts.force => {
            return refuse("the target was promoted from a mirror of this source to a pool of its own; a stream would overwrite its own changes (--force to allow)".into())
        }
        Role::Unbound if h.since != 0 => {
            return refuse("a fresh mirror takes a full stream first (--since 0)".into())
        }
        Role::Unbound => {
            fs.clear_fresh_mirror()?;
            take_key(fs, h, true)?;
        }
        _ if h.since != at => {
            return refuse(format!(
                "the stream holds the changes after TID {:#x}, and the mirror is at TID {at:#x}: read one with --since {at:#x}",
                h.since
            ))
        }
        _ => take_key(fs, h, false)?,
    }
    if role != (Role::Mirror { source: h.source }) {
        fs.set_mirror_role(Role::Mirror { source: h.source })?;
    }
    Ok(())
}

/// A sealed stream goes only into a mirror whose values are sealed or a
/// fresh one (which takes the source's key block with it), a plain stream
/// only into a plain mirror; a sealed stream's key block replaces the
/// mirror's when the source changed its key since.
fn take_key(fs: &Fs, h: &Header, fresh: bool) -> Result<()> {
    match (h.key_block, fs.is_sealed()) {
        (Some(k), sealed) if sealed || fresh => Ok(fs.take_key_block(&k)?),
        (Some(_), _) => Err(StreamError::Refused(
            "the stream is of an encrypted pool and this mirror holds a plain pool's changes: mirror it into a fresh mirror (cairn mkfs --mirror), which takes the source's key block".into(),
        )),
        (None, false) => Ok(()),
        (None, true) => Err(StreamError::Refused(
            "the stream is of a pool that is not encrypted and this mirror holds an encrypted pool's changes: mirror it into a mirror made without --encrypt".into(),
        )),
    }
}

fn check_commit(body: &[u8], last: u64, h: &Header) -> Result<u64> {
    let (upto, _) = decode_commit(body)?;
    if upto < last || upto > h.upto {
        return Err(StreamError::Damaged(format!(
            "a batch ends at TID {upto:#x}, after TID {last:#x}, in a stream up to {:#x}",
            h.upto
        )));
    }
    Ok(upto)
}

fn check_end(body: &[u8], h: &Header, last: u64, frames: u64) -> Result<()> {
    let (upto, n) = decode_end(body)?;
    if upto != h.upto || last != h.upto || n != frames {
        return Err(StreamError::Damaged(format!(
            "the end frame says TID {upto:#x} after {n} frames; the stream reached TID {last:#x} after {frames}"
        )));
    }
    Ok(())
}

fn out_of_order(tid: u64, last: u64) -> StreamError {
    StreamError::Damaged(format!(
        "a change at TID {tid:#x} after a batch up to {last:#x}"
    ))
}

pub fn uuid(b: &[u8; 16]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
