//! The stream's framing: every frame is `kind u8 | seq u64 | len u32 |
//! body | crc32c u32` (little-endian; the crc covers everything before
//! it). Frames are numbered from 0: a frame out of order, repeated or
//! missing is refused by its number, a damaged one by its crc, and a body
//! longer than `MAX_BODY` before anything is allocated for it.

use crate::error::{Result, StreamError};
use std::io::{Read, Write};

/// The largest frame body (a chunk of at most 1 MiB and its header).
pub const MAX_BODY: u32 = 2 << 20;
const HEAD: usize = 1 + 8 + 4;

// A chunk frame (46 bytes of fields, then a chunk's stored bytes, at most
// its raw length: compression that does not pay is not kept) fits a body.
const _: () = assert!(46 + cairn_data::chunk::MAX_RAW_LEN as u64 <= MAX_BODY as u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Header = 1,
    Tids = 2,
    Chunk = 3,
    Event = 4,
    Commit = 5,
    Snapshots = 6,
    End = 7,
    Orphans = 8,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        use Kind::*;
        [Header, Tids, Chunk, Event, Commit, Snapshots, End, Orphans]
            .into_iter()
            .find(|k| *k as u8 == b)
    }
}

/// `n` as a u16 length field. The encoders' callers keep what they
/// encode within its field (names, keys): a longer one is their bug.
pub fn len16(n: usize) -> [u8; 2] {
    u16::try_from(n)
        .expect("an item longer than its u16 length field")
        .to_le_bytes()
}

/// `n` as a u32 length or count field (as `len16`).
pub fn len32(n: usize) -> [u8; 4] {
    u32::try_from(n)
        .expect("an item longer than its u32 length field")
        .to_le_bytes()
}

/// Writes numbered frames.
pub struct FrameWriter<W: Write> {
    out: W,
    seq: u64,
    /// Bytes written so far.
    pub bytes: u64,
}

impl<W: Write> FrameWriter<W> {
    pub fn new(out: W) -> Self {
        FrameWriter {
            out,
            seq: 0,
            bytes: 0,
        }
    }

    pub fn frame(&mut self, kind: Kind, body: &[u8]) -> Result<()> {
        let len = u32::try_from(body.len()).ok().filter(|n| *n <= MAX_BODY);
        let len = len.expect("frame bodies are built within MAX_BODY");
        let mut head = Vec::with_capacity(HEAD);
        head.push(kind as u8);
        head.extend_from_slice(&self.seq.to_le_bytes());
        head.extend_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head), body);
        self.out.write_all(&head)?;
        self.out.write_all(body)?;
        self.out.write_all(&crc.to_le_bytes())?;
        self.seq += 1;
        self.bytes += (HEAD + body.len() + 4) as u64;
        Ok(())
    }

    /// Frames written so far.
    pub fn count(&self) -> u64 {
        self.seq
    }

    pub fn flush(&mut self) -> Result<()> {
        Ok(self.out.flush()?)
    }
}

/// Reads numbered frames, checking each. Streams may follow each other in
/// one input: `at_end` says whether more bytes follow, `next_stream`
/// starts the numbering again for the next one.
pub struct FrameReader<R: Read> {
    input: R,
    seq: u64,
    /// A byte read by `at_end`, not yet consumed.
    pending: Option<u8>,
    /// Bytes consumed so far.
    pos: u64,
}

impl<R: Read> FrameReader<R> {
    pub fn new(input: R) -> Self {
        FrameReader {
            input,
            seq: 0,
            pending: None,
            pos: 0,
        }
    }

    /// Frames read so far (in this stream).
    pub fn count(&self) -> u64 {
        self.seq
    }

    /// Bytes of the input consumed so far.
    pub fn offset(&self) -> u64 {
        self.pos
    }

    /// Whether the input ends here (reads one byte ahead to know).
    pub fn at_end(&mut self) -> Result<bool> {
        if self.pending.is_some() {
            return Ok(false);
        }
        let mut b = [0u8; 1];
        loop {
            match self.input.read(&mut b) {
                Ok(0) => return Ok(true),
                Ok(_) => {
                    self.pending = Some(b[0]);
                    return Ok(false);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Starts reading the next stream of the input (frames numbered from 0).
    pub fn next_stream(&mut self) {
        self.seq = 0;
    }

    /// The next frame; `Truncated` when the input ends (at or inside a
    /// frame: a stream ends with its End frame, never by itself).
    pub fn read_frame(&mut self) -> Result<(Kind, Vec<u8>)> {
        let mut head = [0u8; HEAD];
        self.fill(&mut head)?;
        let mut fields = Body::new(&head[1..], "frame head");
        let (seq, len) = (fields.u64()?, fields.u32()?);
        if len > MAX_BODY {
            return Err(StreamError::Damaged(format!(
                "frame {} claims {len} bytes (at most {MAX_BODY})",
                self.seq
            )));
        }
        // Read as it comes: a length the input does not hold allocates
        // no more than what the input had.
        let mut body = Vec::new();
        (&mut self.input).take(len as u64).read_to_end(&mut body)?;
        self.pos += body.len() as u64;
        if body.len() < len as usize {
            return Err(StreamError::Truncated(self.seq));
        }
        let mut crc = [0u8; 4];
        self.fill(&mut crc)?;
        if crc32c::crc32c_append(crc32c::crc32c(&head), &body) != u32::from_le_bytes(crc) {
            return Err(StreamError::Damaged(format!(
                "frame {}: checksum mismatch",
                self.seq
            )));
        }
        if seq != self.seq {
            return Err(StreamError::Damaged(format!(
                "frame {seq} where frame {} was due (frames reordered, repeated or missing)",
                self.seq
            )));
        }
        let kind = Kind::from_u8(head[0]).ok_or_else(|| {
            StreamError::Damaged(format!("frame {seq}: unknown kind {}", head[0]))
        })?;
        self.seq += 1;
        Ok((kind, body))
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<()> {
        let mut at = 0;
        if let (Some(first), Some(b)) = (buf.first_mut(), self.pending.take()) {
            *first = b;
            at = 1;
        }
        while at < buf.len() {
            match self.input.read(&mut buf[at..]) {
                Ok(0) => {
                    self.pos += at as u64;
                    return Err(StreamError::Truncated(self.seq));
                }
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.pos += at as u64;
        Ok(())
    }
}

/// A cursor over a frame body that refuses to read past its end.
pub struct Body<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Body<'a> {
    pub fn new(b: &'a [u8], what: &'static str) -> Self {
        Body { b, what }
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.b.len() {
            return Err(StreamError::Damaged(format!(
                "{} frame too short",
                self.what
            )));
        }
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(a)
    }

    /// The next `N` bytes, as an array (ids, hashes, integers).
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16> {
        self.array().map(u16::from_le_bytes)
    }

    pub fn u32(&mut self) -> Result<u32> {
        self.array().map(u32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Result<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// A count of items each at least `min` bytes long, checked against
    /// what is left (no allocation beyond what the body can hold).
    pub fn count(&mut self, min: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.b.len() {
            return Err(StreamError::Damaged(format!(
                "{} frame: bad count {n}",
                self.what
            )));
        }
        Ok(n)
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }

    /// Fails if bytes are left over.
    pub fn done(&self) -> Result<()> {
        match self.b.is_empty() {
            true => Ok(()),
            false => Err(StreamError::Damaged(format!(
                "{} frame too long",
                self.what
            ))),
        }
    }
}
