//! Scheduling of the FUSE ring threads (vendor/fuser/src/uring_sched.rs):
//! they sit at SCHED_IDLE; when busy threads keep every CPU, a starved one
//! is raised to SCHED_FIFO, so requests are still served at once (at normal
//! priority, eight busy threads per CPU left a raised ring thread waiting
//! 600-800 ms per second); once the CPUs are free again they go back to
//! SCHED_IDLE.

mod common;

use common::*;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SCHED_FIFO: i32 = 1;
const SCHED_IDLE: i32 = 5;

fn ring_policies(fs: &Fs) -> Vec<i32> {
    let all = fs.daemon_thread_policies();
    all.iter()
        .filter(|(n, _)| n.starts_with("fuse-ring-") && n != "fuse-ring-sched")
        .map(|(_, p)| *p)
        .collect()
}

/// One small write, stat and read on the mount: a few requests.
fn touch(fs: &Fs, i: u64) {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(fs.p(&format!("f{}", i % 64)))
        .unwrap();
    f.write_all_at(&i.to_le_bytes(), (i % 8) * 4096 + 100)
        .unwrap();
    f.metadata().unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, (i % 8) * 4096 + 100).unwrap();
    assert_eq!(b, i.to_le_bytes());
}

/// Polls `cond` (doing a few requests between polls) until it holds or
/// `limit` passes; true if it held.
fn poll(fs: &Fs, limit: Duration, mut cond: impl FnMut(&[i32]) -> bool) -> bool {
    let t0 = Instant::now();
    let mut i = 0;
    while t0.elapsed() < limit {
        for _ in 0..20 {
            touch(fs, i);
            i += 1;
        }
        if cond(&ring_policies(fs)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_ring_thread_starved_by_busy_cpus_goes_real_time_and_back_to_idle_after() {
    let fs = Fs::new();
    let idle = |p: &[i32]| p.len() >= 2 && p.iter().all(|&p| p == SCHED_IDLE);
    assert!(
        poll(&fs, Duration::from_secs(10), idle),
        "ring threads not all at SCHED_IDLE on a quiet machine: {:?}",
        fs.daemon_thread_policies()
    );
    // Eight spinning threads per CPU, at the test's own (normal) priority.
    let stop = Arc::new(AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs: Vec<_> = (0..8 * cpus)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            })
        })
        .collect();
    let raised = poll(&fs, Duration::from_secs(15), |p| p.contains(&SCHED_FIFO));
    let during = ring_policies(&fs);
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    assert!(
        raised,
        "no ring thread went to SCHED_FIFO while busy threads held the CPUs: {during:?}"
    );
    // The boost lasts 2 s after the last starved period.
    assert!(
        poll(&fs, Duration::from_secs(15), idle),
        "ring threads did not return to SCHED_IDLE: {:?}",
        ring_policies(&fs)
    );
    fs.finish();
}
