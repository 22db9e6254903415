//! The FUSE worker pool (large reads and writes, fsync) under a burst of
//! large writes with fsync from many threads: it grows while requests
//! wait, and after a quiet spell longer than an idle worker once lived
//! (10 s) it still has every worker it grew, and large writes with fsync
//! still complete. A worker that exits takes with it the io_uring fetch it
//! submitted for its ring entry: the kernel ends that entry, its ring
//! thread stops, and the requests queued on that ring were never answered
//! (writeback, then fsync, hung for good).

mod common;

use common::*;
use serde_json::Value;
use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn workers(fs: &Fs) -> Value {
    let out = cairn_ok(&[OsStr::new("info"), fs.mnt.as_os_str(), OsStr::new("--json")]);
    let v: Value = serde_json::from_str(&out).expect("info json");
    assert!(v["fuse_workers"].is_object(), "no FUSE worker pool: {v}");
    v["fuse_workers"].clone()
}

/// `threads` writers, each writing 2 MiB with fsync to its own file for
/// `secs`; fails if they are not all done `limit` after the end.
fn burst(fs: &Fs, tag: &str, threads: usize, secs: f64, limit: Duration) {
    let (tx, rx) = mpsc::channel();
    for t in 0..threads {
        let (tx, path) = (tx.clone(), fs.p(&format!("{tag}-{t}")));
        std::thread::spawn(move || {
            let data = pattern(t as u64, 2 << 20);
            let f = std::fs::File::create(&path).unwrap();
            let start = Instant::now();
            let mut n = 0u64;
            loop {
                f.write_all_at(&data, (n % 4) * (2 << 20)).unwrap();
                f.sync_all().unwrap();
                n += 1;
                if start.elapsed().as_secs_f64() >= secs {
                    break;
                }
            }
            tx.send(n).unwrap();
        });
    }
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs_f64(secs) + limit;
    for i in 0..threads {
        let left = deadline.saturating_duration_since(Instant::now());
        rx.recv_timeout(left).unwrap_or_else(|_| {
            panic!("{tag}: writer {i} of {threads} never finished a write with fsync (hung)")
        });
    }
}

#[test]
fn the_fuse_worker_pool_keeps_what_it_grew_and_writes_never_hang() {
    // The pool serves io_uring's hand-offs: turn io_uring on if it is off.
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    fs.mount_args = vec![
        "--io-uring".into(),
        "on".into(),
        "--enable-uring-module".into(),
    ];
    fs.mount();
    burst(&fs, "grow", 32, 3.0, Duration::from_secs(60));
    let grown = workers(&fs);
    assert!(
        grown["grown"].as_u64().unwrap() >= 1,
        "the burst did not grow the pool: {grown}"
    );
    std::thread::sleep(Duration::from_secs(12));
    let after = workers(&fs);
    assert_eq!(after["exited_idle"], 0, "workers exited: {after}");
    assert_eq!(after["workers"], grown["workers"], "{after}");
    burst(&fs, "after", 8, 1.0, Duration::from_secs(30));
    fs.finish();
}
