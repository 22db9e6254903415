//! One connection after its handshake: a reader thread decodes requests
//! (and a WRITE's payload) and hands each to the shared worker pool, so
//! one connection's requests run concurrently; while its requests are
//! quick, a short one runs on the reader itself (see INLINE_MAX). Replies go out
//! whole under the connection's write lock. The reader stops taking requests
//! while too many are in flight, or while the server-wide memory budget
//! (budget.rs) has no room for the request, before reading its payload;
//! a WRITE's payload must then arrive within the server's io_timeout
//! (read in pieces, so a stalled client holds little more than it sent).
//! On NBD_CMD_DISC, a read error or the server's shutdown it waits for
//! its requests before closing.

use crate::budget::Budget;
use crate::command::{check, encode_reply, execute, Reply};
use crate::error::NbdError;
use crate::handshake::Negotiated;
use crate::proto::*;
use crate::server::Sock;
use crate::stats::{command_name, Counters};
use cairn_workpool::Pool;
use parking_lot::{Condvar, Mutex};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A READ, or a WRITE without FUA, of at most this many bytes runs on the
/// reader's thread while the connection's last QUICK_STREAK requests were
/// all quick, even with more requests waiting: handing it to a worker (a
/// wake-up and a thread switch each way) would be most of its latency and
/// of its CPU. 4 KiB random I/O at 32,000 ops/s on 2 cores, served from
/// memory: p50 61 to 71 us inline, 180 to 520 us through the pool. A
/// request that was slow (a disk, an object store, a throttled write)
/// resets the streak, and the next QUICK_STREAK requests go to the pool,
/// which runs slow requests side by side: a slow device holds up the
/// reading for at most one request in QUICK_STREAK + 1.
const INLINE_MAX: u32 = 64 << 10;
/// A request that ran longer than this is slow.
const QUICK: Duration = Duration::from_micros(200);
/// Requests in a row that must have been quick before one runs inline.
const QUICK_STREAK: u32 = 32;

/// A WRITE's payload is read in pieces of at most this many bytes, its
/// buffer growing as they arrive.
const PIECE: usize = 1 << 20;

/// Limits on one connection's requests in flight (its share of the
/// server's budget, `ServerConfig::budget`).
#[derive(Debug, Clone, Copy)]
pub struct FlightLimits {
    pub requests: usize,
    /// Bytes of READ and WRITE payloads (one request is always allowed).
    pub bytes: u64,
}

impl Default for FlightLimits {
    fn default() -> Self {
        FlightLimits {
            requests: 64,
            bytes: 64 << 20,
        }
    }
}

/// What a connection's reader needs from the server.
pub(crate) struct Shared<'a> {
    pub pool: &'a Pool,
    pub counters: Arc<Counters>,
    pub budget: Arc<Budget>,
    pub limits: FlightLimits,
    /// A WRITE's payload must arrive within this time of its header.
    pub io_timeout: Duration,
}

/// What the pool's jobs share with the reader.
struct Conn {
    neg: Negotiated,
    writer: Mutex<Sock>,
    counters: Arc<Counters>,
    budget: Arc<Budget>,
    /// (requests, bytes) in flight.
    flight: Mutex<(usize, u64)>,
    landed: Condvar,
    /// Requests in a row that ran quicker than QUICK (reset by a slow one).
    quick: AtomicU32,
}

/// Serves requests until the client leaves or the socket is shut down.
pub(crate) fn transmission(
    reader: &mut BufReader<Sock>,
    sock: Sock,
    neg: Negotiated,
    sh: &Shared,
) -> Result<(), NbdError> {
    let conn = Arc::new(Conn {
        neg,
        writer: Mutex::new(sock),
        counters: sh.counters.clone(),
        budget: sh.budget.clone(),
        flight: Mutex::new((0, 0)),
        landed: Condvar::new(),
        quick: AtomicU32::new(0),
    });
    let r = read_requests(reader, &conn, sh);
    let mut f = conn.flight.lock();
    while f.0 > 0 {
        conn.landed.wait(&mut f);
    }
    r
}

fn read_requests(
    reader: &mut BufReader<Sock>,
    conn: &Arc<Conn>,
    sh: &Shared,
) -> Result<(), NbdError> {
    loop {
        let mut hdr = [0u8; REQUEST_LEN];
        reader.read_exact(&mut hdr)?;
        let req = Request::decode(&hdr).map_err(|_| {
            let m = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
            NbdError::BadMagic(m as u64)
        })?;
        if req.kind == CMD_DISC {
            conn.counters.note(CMD_DISC, 0, 0);
            return Ok(());
        }
        let is_write = req.kind == CMD_WRITE;
        if is_write && req.length > MAX_PAYLOAD {
            // The payload cannot be skipped safely: close.
            conn.counters
                .note(CMD_WRITE, 0, crate::error::errno::EINVAL);
            return Err(NbdError::PayloadTooLarge(req.length));
        }
        let moved = if matches!(req.kind, CMD_READ | CMD_WRITE) {
            req.length.min(MAX_PAYLOAD) as u64
        } else {
            0
        };
        wait_for_room(conn, sh.limits, moved);
        let payload = if is_write {
            match read_payload(reader, req.length, sh.io_timeout) {
                Ok(p) => p,
                Err(e) => {
                    land(conn, moved);
                    return Err(e);
                }
            }
        } else {
            Vec::new()
        };
        if conn.quick.load(Relaxed) >= QUICK_STREAK && is_short(&req) {
            conn.counters.inline.fetch_add(1, Relaxed);
            run(conn, req, payload);
            land(conn, moved);
            continue;
        }
        let c = conn.clone();
        sh.pool.submit(move || {
            run(&c, req, payload);
            land(&c, moved);
        });
    }
}

/// A request quick enough to run on the reader (see INLINE_MAX).
fn is_short(req: &Request) -> bool {
    match req.kind {
        CMD_READ => req.length <= INLINE_MAX,
        CMD_WRITE => req.length <= INLINE_MAX && req.flags & CMD_FLAG_FUA == 0,
        _ => false,
    }
}

/// Waits for room in the connection's share, then in the server's
/// budget (the socket is not read meanwhile: back-pressure).
fn wait_for_room(conn: &Conn, limits: FlightLimits, moved: u64) {
    {
        let mut f = conn.flight.lock();
        while f.0 > 0 && (f.0 >= limits.requests || f.1 + moved > limits.bytes) {
            conn.landed.wait(&mut f);
        }
        f.0 += 1;
        f.1 += moved;
    }
    conn.budget.take(moved);
}

fn land(conn: &Conn, moved: u64) {
    conn.budget.give(moved);
    let mut f = conn.flight.lock();
    // Each request lands once, with the bytes it took.
    debug_assert!(
        f.0 > 0 && f.1 >= moved,
        "flight {f:?} less than a request of {moved}"
    );
    f.0 -= 1;
    f.1 -= moved;
    conn.landed.notify_all();
}

/// Reads a WRITE's payload of `len` bytes, which must all arrive within
/// `timeout`; the buffer grows as pieces arrive (at most doubling, never
/// past `len`), so a client that stalls holds little more than it sent.
fn read_payload(
    reader: &mut BufReader<Sock>,
    len: u32,
    timeout: Duration,
) -> Result<Vec<u8>, NbdError> {
    let len = len as usize;
    let mut v = Vec::new();
    if reader.buffer().len() >= len {
        v.extend_from_slice(&reader.buffer()[..len]);
        reader.consume(len);
        return Ok(v);
    }
    let deadline = Instant::now() + timeout;
    let r = read_pieces(reader, &mut v, len, deadline);
    reader.get_ref().set_read_timeout(None)?;
    r.map(|()| v)
}

fn read_pieces(
    reader: &mut BufReader<Sock>,
    v: &mut Vec<u8>,
    len: usize,
    deadline: Instant,
) -> Result<(), NbdError> {
    while v.len() < len {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NbdError::PayloadTimeout(
                u32::try_from(len).unwrap_or(u32::MAX),
            ));
        }
        reader.get_ref().set_read_timeout(Some(left))?;
        let want = (len - v.len()).min(PIECE);
        if v.capacity() < v.len() + want {
            let cap = (v.capacity() * 2).max(v.len() + want).min(len);
            v.reserve_exact(cap - v.len());
        }
        match reader.by_ref().take(want as u64).read_to_end(v) {
            Ok(n) if n < want => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(NbdError::PayloadTimeout(
                    u32::try_from(len).unwrap_or(u32::MAX),
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Runs one request on a worker and sends its reply.
fn run(conn: &Conn, req: Request, payload: Vec<u8>) {
    let t = Instant::now();
    let reply = match check(&conn.neg, &req) {
        Err(e) => Reply::Err(e, "invalid request".into()),
        Ok(()) => execute(&conn.neg, &req, payload),
    };
    if t.elapsed() < QUICK {
        conn.quick.fetch_add(1, Relaxed);
    } else {
        conn.quick.store(0, Relaxed);
    }
    let bytes = match &reply {
        Reply::Err(..) => 0,
        _ if req.kind == CMD_BLOCK_STATUS || req.kind == CMD_FLUSH => 0,
        _ => req.length as u64,
    };
    let error = match &reply {
        Reply::Err(e, msg) => {
            let (name, at, len) = (command_name(req.kind), req.offset, req.length);
            tracing::debug!("nbd {name} of {len} at {at}: error {e}: {msg}");
            *e
        }
        _ => 0,
    };
    conn.counters.note(req.kind, bytes, error);
    let wire = encode_reply(conn.neg.structured, &req, reply);
    let mut w = conn.writer.lock();
    if w.write_all(&wire).is_err() {
        // The client is gone: make the reader stop too.
        w.shutdown();
    }
}
