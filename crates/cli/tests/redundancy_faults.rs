//! Device faults under a real mount of a pool whose data has two copies
//! (issue 51). The daemon is started with CAIRN_FAULT_PLAN (the plan's
//! format is in cairn_devices::backend::plan) and the test rewrites the
//! plan while a writer thread writes and fsyncs files:
//! - a device that starts failing every write mid-write: writes go on,
//!   the copies there are dropped, the device is faulted once it failed
//!   enough writes, `redundancy rebuild` makes every copy again on the
//!   other devices and none on it, and every fsynced file is exact, then
//!   and after a remount without faults;
//! - a device whose writes stall for less than the I/O timeout: writes
//!   wait for it and go on, nothing is dropped or faulted;
//! - a device whose writes hang past the I/O timeout: it is faulted, its
//!   copies dropped, and writes and fsyncs go on within seconds;
//! - a device whose reads hang past the I/O timeout: the watchdog faults
//!   it and the other reads go on from the other copies;
//! - a device whose reads return flipped bits (bit rot): every file reads
//!   exact from the other copy and the bad copy is rewritten, counted in
//!   `redundancy show`.

mod common;

use common::redundancy::json;
use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A pool of `devs` sparse ssd devices (devs/d0...) of 96 MiB, copies=2,
/// with `mkfs_args` more, commits only when asked (`cairn sync`, or an
/// fsync the intent log cannot take), mounted with an empty fault plan;
/// returns it and the plan's path.
fn mounted(devs: usize, mkfs_args: &[&str]) -> (Fs, PathBuf) {
    let mut fs = Fs::create();
    let mut args: Vec<String> = vec!["--sparse".into(), "--redundancy".into(), "copies=2".into()];
    args.extend(mkfs_args.iter().map(|s| s.to_string()));
    for i in 0..devs {
        args.push("--device".into());
        args.push(format!("ssd:{}:96M", fs.dev(&format!("d{i}"))));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fs.mkfs(&args);
    // The test decides when buffered data reaches the devices.
    fs.set_config("commit_interval_secs", "600.0");
    fs.set_config("tree_commit_secs", "600.0");
    let plan = fs.mount_with_fault_plan();
    (fs, plan)
}

fn redundancy(fs: &Fs) -> Value {
    json(&["redundancy", "show", fs.mnt.to_str().unwrap(), "--json"])
}

/// Device `id` of a `redundancy show` or `info` answer.
fn device(st: &Value, id: u64) -> &Value {
    let devs = st["devices"].as_array().unwrap();
    let d = devs.iter().find(|d| d["id"].as_u64() == Some(id));
    d.unwrap_or_else(|| panic!("no device {id}: {st}"))
}

/// `cairn info --json` of the mounted pool (write errors per device).
fn info(fs: &Fs) -> Value {
    json(&["info", fs.mnt.to_str().unwrap(), "--json"])
}

fn cairn_sync(fs: &Fs) {
    cairn_ok(&["sync", fs.mnt.to_str().unwrap()]);
}

fn count(st: &Value, key: &str) -> u64 {
    st[key].as_u64().unwrap_or_else(|| panic!("no {key}: {st}"))
}

/// A file the writer wrote: its name (under w/), bytes and what its
/// write and fsync returned.
type Written = (String, Vec<u8>, Result<(), String>);

/// Writes w/{prefix}0... under the mount `mnt` (64 KiB to 2 MiB each,
/// seeded) and fsyncs each.
fn write_files(mnt: &Path, prefix: &str, seed: u64, n: usize) -> Vec<Written> {
    let dir = mnt.join("w");
    fs::create_dir_all(&dir).unwrap();
    (0..n)
        .map(|i| {
            let name = format!("{prefix}{i}");
            let len = [64 << 10, 1 << 20, 700_000, 2 << 20, 300_000][i % 5];
            let data = pattern(seed * 1000 + i as u64, len);
            let r = write_fsynced(&dir.join(&name), &data).map_err(|e| e.to_string());
            (name, data, r)
        })
        .collect()
}

fn write_fsynced(p: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = fs::File::create(p)?;
    f.write_all(data)?;
    f.sync_all()
}

/// A writer thread: writes `first` files, says so, waits for the word,
/// then writes `second` more (while the test changes the plan).
struct Writer {
    first_done: mpsc::Receiver<Vec<Written>>,
    go: mpsc::Sender<()>,
    handle: std::thread::JoinHandle<Vec<Written>>,
}

impl Writer {
    fn start(fs: &Fs, first: usize, second: usize) -> Writer {
        let (done_tx, first_done) = mpsc::channel();
        let (go, go_rx) = mpsc::channel::<()>();
        let mnt = fs.mnt.clone();
        let handle = std::thread::spawn(move || {
            done_tx.send(write_files(&mnt, "a", 1, first)).unwrap();
            match go_rx.recv() {
                Ok(()) => write_files(&mnt, "b", 2, second),
                Err(_) => Vec::new(),
            }
        });
        Writer {
            first_done,
            go,
            handle,
        }
    }
}

/// Every file fsynced without error and reads exact.
fn assert_written(fs: &Fs, files: &[Written], when: &str) {
    for (name, data, r) in files {
        assert!(r.is_ok(), "{when}: write or fsync of w/{name}: {r:?}");
        let got = common::hist::read_uncached(&fs.p(&format!("w/{name}")))
            .unwrap_or_else(|e| panic!("{when}: read w/{name}: {e}\n{}", fs.diagnostics()));
        assert_bytes_eq(&got, data, &format!("{when}: w/{name}"));
    }
}

/// Device 1 starts failing every write while a writer writes and fsyncs;
/// the commit that follows writes 1 MiB segments with a copy there (each
/// placed before the batch learns of the failure), so the device fails
/// more than FAILING_AFTER writes in it and is faulted.
#[test]
fn a_device_failing_writes_mid_write_is_faulted_and_rebuilt_around() {
    let (mut fs, plan) = mounted(3, &["--segment-size", "1M"]);
    let w = Writer::start(&fs, 8, 16);
    let mut files = w.first_done.recv().unwrap();
    cairn_sync(&fs);
    let st = redundancy(&fs);
    assert!(
        count(device(&st, 1), "copies") > 0,
        "device 1 holds copies before the fault: {st}"
    );
    w.go.send(()).unwrap();
    fs.set_fault_plan(&plan, "devs/d1 write eio\n");
    files.extend(w.handle.join().expect("writer"));
    cairn_sync(&fs);
    assert_written(&fs, &files, "after the fault");
    let st = redundancy(&fs);
    let i = info(&fs);
    assert!(
        count(device(&i, 1), "write_errors") >= 3,
        "the fault was hit: {i}"
    );
    assert_eq!(device(&st, 1)["state"], "faulted", "{st}\n{i}");
    assert_eq!(count(&st, "lost_segments"), 0, "{st}");
    let log = fs.daemon_output();
    assert!(log.contains("device 1 is FAULTED"), "{log}");
    let m = fs.mnt.to_str().unwrap().to_string();
    cairn_ok(&["redundancy", "rebuild", &m]);
    let st = redundancy(&fs);
    assert_eq!(count(&st, "short_segments"), 0, "{st}");
    assert_eq!(count(&st, "lost_segments"), 0, "{st}");
    assert_eq!(
        count(device(&st, 1), "copies"),
        0,
        "the faulted device is left out: {st}"
    );
    let copies: u64 = (0..3).map(|d| count(device(&st, d), "copies")).sum();
    assert_eq!(copies, 2 * count(&st, "segments"), "two copies each: {st}");
    assert_written(&fs, &files, "after the rebuild");
    fs::write(&plan, "").unwrap();
    fs.remount();
    assert_written(&fs, &files, "after a remount without faults");
    let st = redundancy(&fs);
    assert_eq!(device(&st, 1)["state"], "online", "{st}");
    assert_eq!(count(&st, "short_segments"), 0, "{st}");
    fs.finish();
}

/// The same fault with the writes reaching the devices in small commits,
/// as a running pool does, on two devices (so that device 1 holds a copy
/// of the open segment). The first commit after the fault drops device
/// 1's copy and counts one failed write; the rest of the segment's
/// appends go to device 0 alone, so device 1 would never fail again:
/// each commit probes a device that failed a write (a free slot written
/// and synced, `Segments::probe_suspects`), and a copy re-replication
/// fails to make counts too, so it is faulted within a few commits (once,
/// it stayed "online" with one error while failing every write).
#[test]
fn a_device_failing_every_write_is_faulted_when_the_writes_come_in_small_commits() {
    let (fs, plan) = mounted(2, &[]);
    let mut files = write_files(&fs.mnt, "a", 1, 6);
    cairn_sync(&fs);
    fs.set_fault_plan(&plan, "devs/d1 write eio\n");
    for i in 0..12 {
        files.extend(write_files(&fs.mnt, &format!("b{i}-"), 10 + i, 1));
        cairn_sync(&fs);
    }
    assert_written(&fs, &files, "after the fault");
    let i = info(&fs);
    let st = redundancy(&fs);
    assert_eq!(
        device(&st, 1)["state"],
        "faulted",
        "12 commits after device 1 began failing every write: {}\n{st}",
        device(&i, 1)
    );
    fs.finish();
}

/// Device 1's writes stall (each waits 400 ms, then succeeds): the
/// commits wait for it and every copy is made; nothing is dropped,
/// faulted or short, and every file is exact.
///
/// A stall shorter than the I/O timeout (`io_timeout_secs`, 30 s by
/// default) is waited for: a copy write (`copies.rs`) waits for every
/// copy up to the timeout, so the commit takes as long as the slowest
/// device. One longer than the timeout faults the device (next test).
#[test]
fn a_device_whose_writes_stall_delays_them_and_loses_nothing() {
    let (mut fs, plan) = mounted(3, &[]);
    let mut files = write_files(&fs.mnt, "p", 3, 4);
    cairn_sync(&fs);
    fs.set_fault_plan(&plan, "devs/d1 write hang:400ms\n");
    let w = Writer::start(&fs, 6, 0);
    files.extend(w.first_done.recv().unwrap());
    drop(w.go);
    w.handle.join().expect("writer");
    let t = Instant::now();
    cairn_sync(&fs);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(400),
        "the stall was not hit ({took:?})"
    );
    println!("a commit with stalled copy writes took {took:?}");
    assert_written(&fs, &files, "with device 1 stalling");
    let st = redundancy(&fs);
    let i = info(&fs);
    assert_eq!(count(device(&i, 1), "write_errors"), 0, "{i}");
    assert_eq!(device(&st, 1)["state"], "online", "{st}");
    assert_eq!(count(&st, "short_segments"), 0, "{st}");
    assert!(count(device(&st, 1), "copies") > 0, "{st}");
    fs::write(&plan, "").unwrap();
    fs.remount();
    assert_written(&fs, &files, "after a remount without faults");
    fs.finish();
}

/// Device 1's writes hang for two minutes, far past the I/O timeout
/// (2 s here): the writes and fsyncs go on within seconds (its copies and
/// its intent log copy are dropped, the device is faulted), nothing
/// acknowledged is lost, and after a remount without the fault every file
/// is exact.
#[test]
fn a_device_whose_writes_hang_is_faulted_and_the_writes_go_on() {
    let (mut fs, plan) = mounted(3, &[]);
    fs.set_config("io_timeout_secs", "2");
    fs.remount();
    let mut files = write_files(&fs.mnt, "p", 3, 4);
    cairn_sync(&fs);
    fs.set_fault_plan(&plan, "devs/d1 write hang:120s\n");
    let t = Instant::now();
    files.extend(write_files(&fs.mnt, "h", 5, 6));
    cairn_sync(&fs);
    let took = t.elapsed();
    println!("writes with device 1 hung took {took:?}");
    assert!(
        took < Duration::from_secs(60),
        "held by the hung device: {took:?}"
    );
    assert_written(&fs, &files, "device 1 hung");
    let st = redundancy(&fs);
    assert_eq!(device(&st, 1)["state"], "faulted", "{st}");
    let log = fs.daemon_output();
    assert!(
        log.contains("I/O timeout") || log.contains("within the I/O timeout"),
        "{log}"
    );
    fs::write(&plan, "").unwrap();
    fs.remount();
    assert_written(&fs, &files, "after a remount without faults");
    fs.finish();
}

/// Device 0's reads hang for 25 s, far past the I/O timeout (2 s here):
/// one read waits on it (a read in the kernel cannot be taken back), the
/// watchdog faults the device within seconds, and every other file then
/// reads exact from the other copies without waiting; the waiting read
/// ends exact once the device answers. With /dev/fuse threads.
#[test]
fn a_device_whose_reads_hang_is_faulted_and_reads_go_on() {
    hung_reads_fault_the_device_and_reads_go_on(&["--io-uring", "off"]);
}

/// The same over FUSE io_uring: the ring thread that waits on the hung
/// read holds the requests the kernel queued on its other entries until
/// the rescuer hands them to workers (vendor/fuser/src/uring_rescue.rs).
#[test]
fn a_device_whose_reads_hang_is_faulted_and_reads_go_on_over_io_uring() {
    hung_reads_fault_the_device_and_reads_go_on(&OVER_IO_URING);
}

fn hung_reads_fault_the_device_and_reads_go_on(mount_args: &[&str]) {
    let (mut fs, plan) = mounted(3, &[]);
    fs.set_config("io_timeout_secs", "2");
    fs.mount_args = mount_args.iter().map(|a| a.to_string()).collect();
    fs.remount();
    let files = write_files(&fs.mnt, "r", 7, 10);
    cairn_sync(&fs);
    assert!(count(device(&redundancy(&fs), 0), "copies") > 0);
    // Nothing cached: every read goes to the devices.
    fs.remount();
    fs.set_fault_plan(&plan, "devs/d0 read hang:25s\n");
    // One small read without kernel read-ahead: one request waits.
    let first = fs.p("w/r0");
    let stuck = std::thread::spawn(move || {
        use std::os::unix::fs::FileExt;
        use std::os::unix::io::AsRawFd;
        let f = fs::File::open(&first).unwrap();
        // SAFETY: an open file's descriptor.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        let mut b = vec![0u8; 4096];
        f.read_exact_at(&mut b, 0).map(|()| b)
    });
    let faulted = eventually(Duration::from_secs(15), || {
        device(&redundancy(&fs), 0)["state"] == "faulted"
    });
    assert!(faulted, "device 0 not faulted\n{}", fs.diagnostics());
    assert!(
        fs.daemon_output().contains("with none finishing"),
        "{}",
        fs.diagnostics()
    );
    let t = Instant::now();
    assert_written(&fs, &files[1..], "device 0's reads hung");
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(12),
        "waited for device 0: {took:?}"
    );
    let got = stuck.join().unwrap().expect("the waiting read");
    assert_bytes_eq(&got, &files[0].1[..4096], "the read that waited");
    fs::write(&plan, "").unwrap();
    fs.remount();
    assert_written(&fs, &files, "after a remount without faults");
    fs.finish();
}

/// Reads of device 0, which holds the first copy of every segment,
/// return flipped bits: every file reads exact (from device 1's copy),
/// the bad copies are rewritten, and `redundancy show` counts both;
/// scrub then finds every copy on device 0 bad and repairs it, and names
/// no damaged file.
#[test]
fn bit_rot_on_a_device_is_read_around_and_repaired() {
    let (mut fs, plan) = mounted(3, &[]);
    let files = write_files(&fs.mnt, "a", 5, 10);
    cairn_sync(&fs);
    let st = redundancy(&fs);
    assert!(count(device(&st, 0), "copies") > 0, "{st}");
    // Nothing cached: every read goes to the devices.
    fs.remount();
    fs.set_fault_plan(&plan, "devs/d0 read corrupt\n");
    assert_written(&fs, &files, "device 0 rotten");
    let st = redundancy(&fs);
    let chunks_read = files.iter().map(|(_, d, _)| d.len() as u64).sum::<u64>() / (1 << 20);
    assert!(
        count(&st, "served_from_other_copy") >= chunks_read,
        "every chunk came from device 1: {st}"
    );
    assert!(count(&st, "repaired") >= chunks_read, "{st}");
    assert_eq!(count(&st, "unrepaired"), 0, "{st}");
    assert!(
        fs.daemon_output().contains("repaired the chunk"),
        "{}",
        fs.diagnostics()
    );
    let rep = json(&["scrub", fs.mnt.to_str().unwrap(), "--json"]);
    assert!(count(&rep, "data_repaired") >= chunks_read, "{rep}");
    assert_eq!(rep["damaged"].as_array().unwrap().len(), 0, "{rep}");
    fs::write(&plan, "").unwrap();
    fs.remount();
    assert_written(&fs, &files, "after a remount without faults");
    let st = redundancy(&fs);
    assert_eq!(
        count(&st, "served_from_other_copy"),
        0,
        "no bad copy left: {st}"
    );
    fs.finish();
}
