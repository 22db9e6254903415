//! NBD wire constants, request and option decoders, reply encoders. The
//! decoders take bytes already read, never panic, and allocate at most
//! what those bytes hold (counts from the wire are never trusted for
//! capacity). Numbers are big-endian, as on the wire.

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) | 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) | 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) | 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;

/// NBD_INFO types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flags and chunk types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

/// Block status flags of base:allocation.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The one meta context served, and the id it is given.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Largest READ or WRITE payload served (the protocol's usual limit).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest NBD string (export names, context queries).
pub const MAX_STRING: usize = 4096;
/// Largest option data accepted; more closes the connection.
pub const MAX_OPTION: u32 = 64 << 10;
/// Size of a request header.
pub const REQUEST_LEN: usize = 28;
/// Size of an option header (magic, option, length).
pub const OPTION_HEADER_LEN: usize = 16;

// The wire layouts the decoders and encoders below cut: a request is
// magic u32, flags u16, type u16, cookie u64, offset u64, length u32; an
// option header magic u64, option u32, length u32. A structured READ
// reply says its payload length (the data plus an 8-byte offset) in a u32.
const _: () = assert!(REQUEST_LEN == 4 + 2 + 2 + 8 + 8 + 4);
const _: () = assert!(OPTION_HEADER_LEN == 8 + 4 + 4);
const _: () = assert!(MAX_PAYLOAD as u64 + 8 <= u32::MAX as u64);

/// Why bytes are not a valid request or option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{0} bytes are too short")]
    Short(usize),
    #[error("bad magic {0:#x}")]
    BadMagic(u64),
    #[error("malformed option data: {0}")]
    Malformed(&'static str),
}

/// A transmission-phase request header (a WRITE's payload follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// A big-endian reader over a slice that fails instead of panicking.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_be_bytes(a))
    }
    /// A u32 length then that many bytes of UTF-8, at most MAX_STRING.
    fn string(&mut self) -> Result<String, DecodeError> {
        let n = self.u32().ok_or(DecodeError::Malformed("string length"))? as usize;
        if n > MAX_STRING {
            return Err(DecodeError::Malformed("string too long"));
        }
        let b = self.take(n).ok_or(DecodeError::Malformed("string bytes"))?;
        let s = std::str::from_utf8(b).map_err(|_| DecodeError::Malformed("not UTF-8"))?;
        Ok(s.to_owned())
    }
}

impl Request {
    /// Decodes a 28-byte request header (longer input: the rest is ignored).
    pub fn decode(b: &[u8]) -> Result<Request, DecodeError> {
        let mut c = Cursor(b);
        let short = DecodeError::Short(b.len());
        let magic = c.u32().ok_or(short.clone())?;
        if magic != REQUEST_MAGIC {
            return Err(DecodeError::BadMagic(magic as u64));
        }
        let (flags, kind) = (c.u16(), c.u16());
        let (cookie, offset, length) = (c.u64(), c.u64(), c.u32());
        Ok(Request {
            flags: flags.ok_or(short.clone())?,
            kind: kind.ok_or(short.clone())?,
            cookie: cookie.ok_or(short.clone())?,
            offset: offset.ok_or(short.clone())?,
            length: length.ok_or(short)?,
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// Decodes an option header: (option, data length).
pub fn decode_option_header(b: &[u8]) -> Result<(u32, u32), DecodeError> {
    let mut c = Cursor(b);
    let magic = c.u64().ok_or(DecodeError::Short(b.len()))?;
    if magic != IHAVEOPT {
        return Err(DecodeError::BadMagic(magic));
    }
    match (c.u32(), c.u32()) {
        (Some(opt), Some(len)) => Ok((opt, len)),
        _ => Err(DecodeError::Short(b.len())),
    }
}

/// The data of NBD_OPT_INFO and NBD_OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub infos: Vec<u16>,
}

impl InfoRequest {
    pub fn decode(b: &[u8]) -> Result<InfoRequest, DecodeError> {
        let mut c = Cursor(b);
        let name = c.string()?;
        let n = c.u16().ok_or(DecodeError::Malformed("info count"))? as usize;
        if c.0.len() != n * 2 {
            return Err(DecodeError::Malformed("info count does not match"));
        }
        let infos =
            c.0.chunks_exact(2)
                .map(|p| u16::from_be_bytes([p[0], p[1]]));
        Ok(InfoRequest {
            name,
            infos: infos.collect(),
        })
    }
}

/// The data of NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub name: String,
    pub queries: Vec<String>,
}

impl MetaRequest {
    pub fn decode(b: &[u8]) -> Result<MetaRequest, DecodeError> {
        let mut c = Cursor(b);
        let name = c.string()?;
        let n = c.u32().ok_or(DecodeError::Malformed("query count"))?;
        let mut queries = Vec::new();
        for _ in 0..n {
            queries.push(c.string()?);
        }
        if !c.0.is_empty() {
            return Err(DecodeError::Malformed("bytes after the queries"));
        }
        Ok(MetaRequest { name, queries })
    }
}

/// An export name sent with NBD_OPT_EXPORT_NAME (the whole option data).
pub fn decode_export_name(b: &[u8]) -> Result<String, DecodeError> {
    if b.len() > MAX_STRING {
        return Err(DecodeError::Malformed("export name too long"));
    }
    std::str::from_utf8(b)
        .map(str::to_owned)
        .map_err(|_| DecodeError::Malformed("export name not UTF-8"))
}

/// An option reply: header and data.
#[allow(
    clippy::cast_possible_truncation,
    reason = "option reply data is built by the server: names and strings of at most MAX_STRING (4 KiB) and fixed-size info"
)]
pub fn option_reply(opt: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// NBD_INFO_EXPORT data.
pub fn info_export(size: u64, tflags: u16) -> Vec<u8> {
    let mut b = INFO_EXPORT.to_be_bytes().to_vec();
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&tflags.to_be_bytes());
    b
}

/// NBD_INFO_NAME or NBD_INFO_DESCRIPTION data.
pub fn info_text(kind: u16, text: &str) -> Vec<u8> {
    let mut b = kind.to_be_bytes().to_vec();
    b.extend_from_slice(text.as_bytes());
    b
}

/// NBD_INFO_BLOCK_SIZE data.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut b = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for v in [min, preferred, max] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b
}

/// NBD_REP_SERVER data: name length, name, description.
#[allow(
    clippy::cast_possible_truncation,
    reason = "an export name is at most MAX_STRING (4 KiB)"
)]
pub fn rep_server(name: &str, description: &str) -> Vec<u8> {
    debug_assert!(
        name.len() <= MAX_STRING,
        "an export name of {} bytes",
        name.len()
    );
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(description.as_bytes());
    b
}

/// NBD_REP_META_CONTEXT data: id, name.
pub fn rep_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut b = id.to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b
}

/// A simple reply header (a successful READ's data follows it).
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk header; `len` bytes of payload follow.
pub fn chunk_header(flags: u16, kind: u16, cookie: u64, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// A final NBD_REPLY_TYPE_ERROR chunk with a message.
#[allow(
    clippy::cast_possible_truncation,
    reason = "msg is cut to 512 bytes first"
)]
pub fn error_chunk(cookie: u64, error: u32, msg: &str) -> Vec<u8> {
    let msg = &msg.as_bytes()[..msg.len().min(512)];
    let len = 6 + msg.len() as u32;
    let mut b = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, len).to_vec();
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg);
    // The client reads as many bytes as the header says: the stream
    // stays in step.
    debug_assert_eq!(b.len(), 20 + len as usize, "error chunk length");
    b
}

/// A final NBD_REPLY_TYPE_BLOCK_STATUS chunk.
#[allow(
    clippy::cast_possible_truncation,
    reason = "the extents of one request, bounded by its u32 length"
)]
pub fn block_status_chunk(cookie: u64, context: u32, extents: &[(u32, u32)]) -> Vec<u8> {
    let len = 4 + 8 * extents.len() as u32;
    let mut b = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, len).to_vec();
    b.extend_from_slice(&context.to_be_bytes());
    for (length, flags) in extents {
        b.extend_from_slice(&length.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
    }
    debug_assert_eq!(b.len(), 20 + len as usize, "block status chunk length");
    b
}

#[cfg(test)]
mod tests;
