//! One transmission-phase command: validation (flags, range, size,
//! read-only, negotiated contexts) into an NBD error value, execution
//! against the export, and the reply's encoding, simple or structured.

use crate::error::errno::*;
use crate::error::wire_errno;
use crate::handshake::Negotiated;
use crate::proto::*;

/// The outcome of one request.
pub(crate) enum Reply {
    Ok,
    /// A READ's data, after `room` bytes left for the reply header.
    Data {
        buf: Vec<u8>,
        room: usize,
    },
    Extents(Vec<(u32, u32)>),
    Err(u32, String),
}

/// The flags each command accepts.
fn allowed_flags(kind: u16, structured: bool) -> Option<u16> {
    Some(match kind {
        CMD_READ if structured => CMD_FLAG_DF,
        CMD_READ | CMD_FLUSH | CMD_CACHE => 0,
        CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        _ => return None,
    })
}

/// Checks a request before it reaches the export; `Err` is the NBD error.
pub(crate) fn check(neg: &Negotiated, r: &Request) -> Result<(), u32> {
    let allowed = allowed_flags(r.kind, neg.structured).ok_or(EINVAL)?;
    if r.flags & !allowed != 0 {
        return Err(EINVAL);
    }
    if r.kind == CMD_FLUSH {
        return if r.offset == 0 && r.length == 0 {
            Ok(())
        } else {
            Err(EINVAL)
        };
    }
    let writes = matches!(r.kind, CMD_WRITE | CMD_WRITE_ZEROES);
    // A zero length is an invalid argument for every command that takes
    // a range (EINVAL, the same for a READ and a WRITE); only a range
    // past the end is ENOSPC for the commands that write.
    if r.length == 0 {
        return Err(EINVAL);
    }
    let end = r.offset.checked_add(r.length as u64);
    if end.is_none_or(|end| end > neg.export.size()) {
        return Err(if writes { ENOSPC } else { EINVAL });
    }
    if r.kind == CMD_READ && r.length > MAX_PAYLOAD {
        return Err(EINVAL);
    }
    if neg.export.read_only() && (writes || r.kind == CMD_TRIM) {
        return Err(EPERM);
    }
    if r.kind == CMD_BLOCK_STATUS && !neg.base_allocation {
        return Err(EINVAL);
    }
    Ok(())
}

/// Runs a checked request against the export.
pub(crate) fn execute(neg: &Negotiated, r: &Request, payload: Vec<u8>) -> Reply {
    let e = &*neg.export;
    let (off, len) = (r.offset, r.length as u64);
    let fua = r.flags & CMD_FLAG_FUA != 0;
    let done = match r.kind {
        CMD_READ => {
            let room = if neg.structured { 28 } else { 16 };
            let mut buf = vec![0u8; room + r.length as usize];
            e.read(off, &mut buf[room..])
                .map(|()| Reply::Data { buf, room })
        }
        CMD_WRITE => {
            // The reader read as many bytes as the header says.
            debug_assert_eq!(payload.len() as u64, len, "WRITE payload length");
            e.write(off, &payload, fua).map(|()| Reply::Ok)
        }
        CMD_FLUSH => e.flush().map(|()| Reply::Ok),
        CMD_TRIM => e.trim(off, len).map(|()| Reply::Ok),
        CMD_CACHE => e.cache(off, len).map(|()| Reply::Ok),
        CMD_WRITE_ZEROES => {
            let may_trim = r.flags & CMD_FLAG_NO_HOLE == 0;
            e.write_zeroes(off, len, may_trim, fua).map(|()| Reply::Ok)
        }
        CMD_BLOCK_STATUS => match e.block_status(off, r.length) {
            Ok(x) => Ok(clip_extents(x, r.length, r.flags & CMD_FLAG_REQ_ONE != 0)),
            Err(err) => Err(err),
        },
        _ => return Reply::Err(EINVAL, "unknown command".into()),
    };
    done.unwrap_or_else(|err| Reply::Err(wire_errno(&err), err.to_string()))
}

/// Drops empty extents, cuts the list at `len` bytes, keeps only the
/// first with REQ_ONE; none left is the export's fault (EIO).
fn clip_extents(x: Vec<(u32, u32)>, len: u32, one: bool) -> Reply {
    let mut out = Vec::new();
    let mut left = len;
    for (l, flags) in x.into_iter().filter(|e| e.0 > 0) {
        if left == 0 || (one && !out.is_empty()) {
            break;
        }
        let l = l.min(left);
        out.push((l, flags & (STATE_HOLE | STATE_ZERO)));
        left -= l;
    }
    if out.is_empty() {
        return Reply::Err(EIO, "export returned no extents".into());
    }
    // No extent reaches past the request (the protocol forbids it).
    debug_assert!(out.iter().map(|e| e.0 as u64).sum::<u64>() <= len as u64);
    Reply::Extents(out)
}

/// The bytes of a reply.
#[allow(
    clippy::cast_possible_truncation,
    reason = "a READ reply carries the request's u32 length (asserted above)"
)]
pub(crate) fn encode_reply(structured: bool, r: &Request, reply: Reply) -> Vec<u8> {
    let cookie = r.cookie;
    match (structured, reply) {
        (false, Reply::Err(e, _)) => simple_reply(e, cookie).to_vec(),
        (false, Reply::Data { mut buf, room }) => {
            // The client reads exactly the length it asked for.
            debug_assert_eq!(buf.len() - room, r.length as usize, "READ reply length");
            buf[room - 16..room].copy_from_slice(&simple_reply(0, cookie));
            buf.drain(..room - 16);
            buf
        }
        // Block status needs structured replies (checked before).
        (false, _) => simple_reply(0, cookie).to_vec(),
        (true, Reply::Err(e, msg)) => error_chunk(cookie, e, &msg),
        (true, Reply::Ok) => chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0).to_vec(),
        (true, Reply::Data { mut buf, room }) => {
            debug_assert_eq!(buf.len() - room, r.length as usize, "READ reply length");
            let n = (buf.len() - room) as u32 + 8;
            let h = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, cookie, n);
            buf[room - 28..room - 8].copy_from_slice(&h);
            buf[room - 8..room].copy_from_slice(&r.offset.to_be_bytes());
            buf.drain(..room - 28);
            buf
        }
        (true, Reply::Extents(x)) => block_status_chunk(cookie, BASE_ALLOCATION_ID, &x),
    }
}
