//! The worker pool seen through NBD: many clients against a slow export
//! (every call sleeps) make the pool grow past its minimum, never past
//! its maximum, run one connection's requests concurrently, and shrink
//! back once the load is gone; shutdown with clients connected returns.

mod common;

use cairn_nbd::proto::*;
use cairn_nbd::{MemExport, ServerConfig, StaticExports};
use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config(min: usize, max: usize) -> ServerConfig {
    let mut c = ServerConfig::default();
    c.pool.min = min;
    c.pool.max = max;
    c.pool.grow_after = Duration::from_millis(2);
    c.pool.idle_exit = Duration::from_millis(200);
    c
}

#[test]
fn slow_export_grows_the_pool_then_it_shrinks() {
    let slow = Arc::new(MemExport::new(SIZE).with_delay(Duration::from_millis(20)));
    let ex = StaticExports::new().with("slow", "", slow.clone());
    let s = start_tcp(ex, config(1, 8));
    let addr = tcp_addr(&s);
    let clients: Vec<_> = (0..12)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = Client::tcp(addr);
                c.go("slow", false);
                for j in 0..10u64 {
                    let off = (i * 10 + j) * 4096;
                    assert_eq!(c.write(off, &[i as u8; 4096]), 0);
                    assert_eq!(c.read(off, 4096), (0, vec![i as u8; 4096]));
                }
                c.disconnect();
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let st = s.stats();
    assert_eq!(st.pool.peak_workers, 8, "{:?}", st.pool);
    assert!(st.pool.grown >= 7, "{:?}", st.pool);
    assert!(slow.peak_in_flight() > 1 && slow.peak_in_flight() <= 8);
    assert_eq!(st.command("write").count, 120);
    assert_eq!(st.command("read").bytes, 120 * 4096);
    let until = Instant::now() + Duration::from_secs(10);
    while s.stats().pool.workers > 1 {
        assert!(
            Instant::now() < until,
            "pool never shrank: {:?}",
            s.stats().pool
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(s.stats().pool.exited_idle >= 7);
}

#[test]
fn one_connection_requests_run_concurrently() {
    let slow = Arc::new(MemExport::new(SIZE).with_delay(Duration::from_millis(50)));
    let s = start_tcp(
        StaticExports::new().with("slow", "", slow.clone()),
        config(4, 4),
    );
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("slow", false);
    let t = Instant::now();
    let reads: Vec<_> = (0..4).map(|i| (CMD_READ, i * 4096, 4096)).collect();
    let cookies = c.send_many(&reads);
    c.read_replies(&cookies, 4096);
    assert!(
        t.elapsed() < Duration::from_millis(180),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(slow.peak_in_flight(), 4);
}

#[test]
fn shutdown_with_clients_connected_returns() {
    let (_, ex) = disk_exports();
    let s = start_tcp(ex, config(1, 2));
    let handle = s.shutdown_handle();
    let mut idle = Client::tcp(tcp_addr(&s));
    idle.go("disk", false);
    let mut mid_handshake = Client::tcp(tcp_addr(&s));
    mid_handshake.greet();
    assert_eq!(s.stats().connections_open, 2);
    let t = Instant::now();
    handle.shutdown();
    s.shutdown();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(handle.is_shut_down());
}

#[test]
fn remote_addresses_need_allow_remote() {
    let (_, ex) = disk_exports();
    let ex: Arc<dyn cairn_nbd::Exports> = Arc::new(ex);
    let addr = "0.0.0.0:0".parse().unwrap();
    let plain = ServerConfig {
        insecure_tcp: true,
        ..ServerConfig::default()
    };
    let r = cairn_nbd::serve_tcp(addr, ex.clone(), plain.clone());
    assert!(matches!(r, Err(cairn_nbd::NbdError::RemoteRefused(_))));
    let cfg = ServerConfig {
        allow_remote: true,
        ..plain
    };
    let s = cairn_nbd::serve_tcp(addr, ex, cfg).expect("allowed when asked");
    let port = tcp_addr(&s).port();
    let mut c = Client::tcp(([127, 0, 0, 1], port).into());
    c.go("disk", false);
    let json = serde_json::to_value(s.stats()).unwrap();
    assert_eq!(json["connections_open"], 1);
    assert!(json["pool"]["workers"].as_u64().unwrap() >= 1);
}

/// `cairn_nbd`'s inline rule (conn.rs): once a connection's requests have
/// been quick, a short request runs on the reader's thread (no hand-off
/// to a worker); requests to a slow export always go to the pool, so a
/// slow one never holds up the reading.
#[test]
fn lone_quick_requests_run_on_the_reader_and_slow_ones_in_the_pool() {
    let (_, ex) = disk_exports();
    let slow = Arc::new(MemExport::new(SIZE).with_delay(Duration::from_millis(1)));
    let s = start_tcp(ex.with("slow", "", slow), config(1, 4));
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("disk", false);
    for i in 0..100u64 {
        assert_eq!(c.write(i * 4096, &[i as u8; 4096]), 0);
        assert_eq!(c.read(i * 4096, 4096), (0, vec![i as u8; 4096]));
    }
    c.disconnect();
    // A pool job counts as completed just after its reply went out.
    let settled = |n: u64| {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let st = s.stats();
            if st.inline + st.pool.completed >= n || Instant::now() > until {
                return st;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let st = settled(200);
    // The first 32 go to the pool; a request slowed by the machine sends
    // the next 32 there too. Most of the 200 must have run inline.
    assert!(
        st.inline >= 100,
        "inline {} of 200: {:?}",
        st.inline,
        st.pool
    );
    assert_eq!(st.inline + st.pool.completed, 200, "{:?}", st.pool);

    let before = s.stats();
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("slow", false);
    for i in 0..40u64 {
        assert_eq!(c.write(i * 4096, &[7; 4096]), 0);
    }
    c.disconnect();
    let st = settled(240);
    assert_eq!(
        st.inline, before.inline,
        "a slow export's request ran inline"
    );
    assert_eq!(st.pool.completed - before.pool.completed, 40);
}

/// Quick requests sent all at once (a client's queue depth) run inline
/// too, not only lone ones; once one is slow, the next ones go to the
/// pool, side by side, until enough were quick again.
#[test]
fn pipelined_quick_requests_run_inline_until_one_is_slow() {
    let disk = Arc::new(MemExport::new(SIZE));
    let s = start_tcp(
        StaticExports::new().with("disk", "", disk.clone()),
        config(4, 4),
    );
    let mut c = Client::tcp(tcp_addr(&s));
    c.go("disk", false);
    let reads = |n: u64| {
        (0..n)
            .map(|i| (CMD_READ, i * 4096, 4096))
            .collect::<Vec<_>>()
    };
    // Until the streak is there, and whatever the machine does to it:
    // every request quick (in the pool or not) before the test's own.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let before = s.stats();
        let cookies = c.send_many(&reads(64));
        c.read_replies(&cookies, 4096);
        let ran = s.stats().inline - before.inline;
        if ran == 64 {
            break;
        }
        assert!(
            Instant::now() < until,
            "64 requests at once never all ran inline: {ran}"
        );
    }
    // One slow request: it runs inline (its slowness is seen after it),
    // and the 8 after it go to the pool, all at once.
    disk.set_delay(Duration::from_millis(30));
    let before = s.stats();
    let t = Instant::now();
    let cookies = c.send_many(&reads(9));
    c.read_replies(&cookies, 4096);
    let st = s.stats();
    assert_eq!(
        st.inline - before.inline,
        1,
        "only the first slow one inline"
    );
    // 30 ms inline, then 8 side by side in the pool of 4: about 90 ms,
    // not 270.
    assert!(
        t.elapsed() < Duration::from_millis(250),
        "took {:?}",
        t.elapsed()
    );
    c.disconnect();
}
