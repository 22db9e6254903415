//! The server-wide memory budget against hostile clients over real
//! sockets: many connections pipelining 32 MiB WRITEs without reading
//! their replies, and connections that send 31 MiB of a 32 MiB WRITE and
//! stall. The bytes the server holds for requests in flight never exceed
//! the budget, the stalled connections are closed after the io_timeout (5 s),
//! every pipelined write lands, and the budget is whole again after.

mod common;

use cairn_nbd::proto::*;
use cairn_nbd::{FlightLimits, ServerConfig};
use common::*;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u32 = 1 << 20;

/// Sends `n` WRITEs of 32 MiB without reading a reply, then reads them.
fn pipeline(a: std::net::SocketAddr, n: usize, fill: u8) {
    let mut c = Client::tcp(a);
    c.go("disk", false);
    let payload = vec![fill; (32 * MIB) as usize];
    let mut cookies = Vec::new();
    for i in 0..n {
        let off = (i as u64 % 2) * (32 << 20);
        cookies.push(c.send(CMD_WRITE, 0, off, 32 * MIB, &payload));
    }
    for _ in 0..n {
        assert_eq!(c.u32(), SIMPLE_REPLY_MAGIC);
        assert_eq!(c.u32(), 0, "write failed");
        assert!(cookies.contains(&c.u64()));
    }
    c.disconnect();
}

/// Sends 31 MiB of a 32 MiB WRITE and stalls; returns when the server
/// closed the connection (EOF or reset), or panics after `limit`.
fn stall(a: std::net::SocketAddr, limit: Duration) -> Duration {
    let mut c = Client::tcp(a);
    c.go("disk", false);
    let t = Instant::now();
    c.send(CMD_WRITE, 0, 0, 32 * MIB, &vec![7u8; (31 * MIB) as usize]);
    let mut b = [0u8; 16];
    loop {
        match c.s.read(&mut b) {
            Ok(0) | Err(_) if t.elapsed() < limit => return t.elapsed(),
            _ => assert!(t.elapsed() < limit, "stalled connection still open"),
        }
    }
}

#[test]
fn hostile_pipelines_and_stalls_stay_within_the_budget() {
    let budget = 96 << 20;
    let (_, ex) = disk_exports();
    let cfg = ServerConfig {
        budget,
        flight: FlightLimits {
            requests: 64,
            bytes: 64 << 20,
        },
        io_timeout: Duration::from_secs(5),
        ..ServerConfig::default()
    };
    let s = Arc::new(start_tcp(ex, cfg));
    let a = tcp_addr(&s);
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            let mut max = 0;
            while !done.load(SeqCst) {
                max = max.max(s.stats().bytes_in_flight);
                std::thread::sleep(Duration::from_millis(2));
            }
            max
        })
    };
    let stalls: Vec<_> = (0..6)
        .map(|_| std::thread::spawn(move || stall(a, Duration::from_secs(60))))
        .collect();
    let pipes: Vec<_> = (0..8)
        .map(|i| std::thread::spawn(move || pipeline(a, 3, i as u8)))
        .collect();
    for p in pipes {
        p.join().expect("pipelined writes all land");
    }
    for st in stalls {
        let after = st.join().expect("stalled connection closed");
        assert!(after >= Duration::from_secs(5), "closed after {after:?}");
    }
    done.store(true, SeqCst);
    let seen = watcher.join().unwrap();
    let st = s.stats();
    assert_eq!(st.budget, budget);
    assert!(seen <= budget, "{seen} bytes in flight, budget {budget}");
    assert!(
        st.bytes_in_flight_peak <= budget,
        "peak {}",
        st.bytes_in_flight_peak
    );
    assert!(
        st.bytes_in_flight_peak >= 64 << 20,
        "peak {}",
        st.bytes_in_flight_peak
    );
    assert_eq!(st.command("write").count, 24);
    // Every connection gone, every byte given back.
    let t = Instant::now();
    while s.stats().connections_open > 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.stats().connections_open, 0);
    assert_eq!(s.stats().bytes_in_flight, 0);
}
