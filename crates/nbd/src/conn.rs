//! One connection after its handshake: a reader thread decodes requests
//! (and a WRITE's payload) and hands each to the shared worker pool, so
//! one connection's requests run concurrently; while its requests are
//! quick, a short one runs on the reader itself (see INLINE_MAX). Replies go out
//! whole under the connection's write lock. The reader stops taking requests
//! while too many are in flight, and on NBD_CMD_DISC, a read error or
//! the server's shutdown it waits for its requests before closing.

use crate::command::{check, encode_reply, execute, Reply};
use crate::error::NbdError;
use crate::handshake::{read_bounded, Negotiated};
use crate::proto::*;
use crate::server::Sock;
use crate::stats::{command_name, Counters};
use cairn_workpool::Pool;
use parking_lot::{Condvar, Mutex};
use std::io::{BufReader, Read, Write};
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

/// Limits on one connection's requests in flight.
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
            bytes: 128 << 20,
        }
    }
}

/// What the pool's jobs share with the reader.
struct Conn {
    neg: Negotiated,
    writer: Mutex<Sock>,
    counters: Arc<Counters>,
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
    pool: &Pool,
    counters: Arc<Counters>,
    limits: FlightLimits,
) -> Result<(), NbdError> {
    let conn = Arc::new(Conn {
        neg,
        writer: Mutex::new(sock),
        counters,
        flight: Mutex::new((0, 0)),
        landed: Condvar::new(),
        quick: AtomicU32::new(0),
    });
    let r = read_requests(reader, &conn, pool, limits);
    let mut f = conn.flight.lock();
    while f.0 > 0 {
        conn.landed.wait(&mut f);
    }
    r
}

fn read_requests(
    reader: &mut BufReader<Sock>,
    conn: &Arc<Conn>,
    pool: &Pool,
    limits: FlightLimits,
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
        wait_for_room(conn, limits, moved);
        let payload = if is_write {
            match read_bounded(reader, req.length) {
                Ok(p) => p,
                Err(e) => {
                    land(conn, moved);
                    return Err(e.into());
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
        pool.submit(move || {
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

fn wait_for_room(conn: &Conn, limits: FlightLimits, moved: u64) {
    let mut f = conn.flight.lock();
    while f.0 > 0 && (f.0 >= limits.requests || f.1 + moved > limits.bytes) {
        conn.landed.wait(&mut f);
    }
    f.0 += 1;
    f.1 += moved;
}

fn land(conn: &Conn, moved: u64) {
    let mut f = conn.flight.lock();
    f.0 -= 1;
    f.1 -= moved;
    conn.landed.notify_all();
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
