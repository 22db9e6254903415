//! A daemon in a cgroup limited to one CPU, mounted with `--ring-priority
//! idle` (over io_uring where the kernel offers it), under I/O load from
//! outside the cgroup and busy CPUs: its CPU use stays within the quota and
//! none of its threads is ever SCHED_FIFO (real-time threads escape a
//! cgroup's CPU limit; uring_sched.rs raises starved ring threads to
//! SCHED_OTHER there). The limit is cgroup v2 `cpu.max`, or the v1 cpu
//! controller's quota on hosts that still mount it as v1; where neither
//! can be set up the test says why and passes.

mod common;

use common::cgroup::{LimitedCgroup, SCHED_FIFO};
use common::*;
use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long each phase of the load runs.
const LOAD: Duration = Duration::from_secs(4);

/// `--io-uring on` when the kernel offers io_uring already, else `auto`
/// (this test does not change the host's fuse.enable_uring).
fn io_uring_mode() -> &'static str {
    let p = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring");
    if p.is_ok_and(|v| v.trim() == "Y") {
        "on"
    } else {
        eprintln!("[ring_cgroup] fuse.enable_uring is not Y: mounting with --io-uring auto");
        "auto"
    }
}

/// Writers of 1 MiB blocks with fsync, and small-file creators, on the
/// mount, until `stop`.
fn io_load(fs: &Fs, stop: &Arc<AtomicBool>) -> Vec<JoinHandle<u64>> {
    let mut out = Vec::new();
    for t in 0..4u64 {
        let (stop, dir) = (stop.clone(), fs.mnt.clone());
        out.push(std::thread::spawn(move || {
            let mut n = 0u64;
            if t < 2 {
                let f = std::fs::File::create(dir.join(format!("big{t}"))).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let data = pattern(t * 1000 + n, 1 << 20);
                    f.write_all_at(&data, (n % 16) << 20).unwrap();
                    if n % 4 == 3 {
                        f.sync_all().unwrap();
                    }
                    n += 1;
                }
            } else {
                while !stop.load(Ordering::Relaxed) {
                    let p = dir.join(format!("s{t}-{}", n % 200));
                    std::fs::write(&p, n.to_le_bytes()).unwrap();
                    std::fs::metadata(&p).unwrap();
                    n += 1;
                }
            }
            n
        }));
    }
    out
}

/// One spinning thread per CPU outside the cgroup, until `stop`.
fn hogs(stop: &Arc<AtomicBool>) -> Vec<JoinHandle<u64>> {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    (0..cpus)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
                0
            })
        })
        .collect()
}

/// The threads of the daemon seen at SCHED_FIFO, sampled every 20 ms until
/// `stop`; and how many samples were taken.
fn watch_fifo(fs: &Fs, stop: &Arc<AtomicBool>) -> JoinHandle<(BTreeSet<String>, usize)> {
    let (stop, pid) = (stop.clone(), fs.daemon_pid());
    std::thread::spawn(move || {
        let (mut fifo, mut n) = (BTreeSet::new(), 0);
        while !stop.load(Ordering::Relaxed) {
            for (name, tid, policy) in thread_policies(pid) {
                if policy == SCHED_FIFO {
                    fifo.insert(format!("{name} ({tid})"));
                }
            }
            n += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        (fifo, n)
    })
}

/// (name, tid, policy) of every thread of `pid`.
fn thread_policies(pid: u32) -> Vec<(String, u32, i32)> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let policy = stat.rsplit_once(')')?.1.split_whitespace().nth(38)?;
            let tid = t.file_name().to_str()?.parse().ok()?;
            Some((comm.trim().to_string(), tid, policy.parse().ok()?))
        })
        .collect()
}

fn ring_threads(fs: &Fs) -> usize {
    let names = fs.daemon_threads();
    let rings = names.iter().filter(|t| t.starts_with("fuse-ring-"));
    rings.filter(|t| *t != "fuse-ring-sched").count()
}

/// Runs the I/O load (and with `busy`, spinning threads) for `LOAD`;
/// prints and returns the daemon's CPU use and the wall time.
fn phase(fs: &Fs, cg: &LimitedCgroup, busy: bool) -> (&'static str, Duration, Duration) {
    let what = if busy {
        "I/O and busy CPUs"
    } else {
        "I/O alone"
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (use0, thr0, start) = (cg.usage(), cg.nr_throttled(), Instant::now());
    let mut load = io_load(fs, &stop);
    if busy {
        load.extend(hogs(&stop));
    }
    std::thread::sleep(LOAD);
    stop.store(true, Ordering::Relaxed);
    let ops: u64 = load.into_iter().map(|h| h.join().unwrap()).sum();
    let (used, wall) = (cg.usage() - use0, start.elapsed());
    eprintln!(
        "[ring_cgroup] {what}: {ops} operations in {wall:.2?}; daemon CPU {used:.2?} = {:.3} \
         CPUs (quota 1 CPU); throttled in {} periods",
        used.as_secs_f64() / wall.as_secs_f64(),
        cg.nr_throttled() - thr0
    );
    (what, used, wall)
}

#[test]
fn a_daemon_in_a_one_cpu_cgroup_stays_within_its_quota_and_off_real_time() {
    let name = format!("cairn-ring-test-{}", std::process::id());
    let cg = match LimitedCgroup::one_cpu(&name) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("[ring_cgroup] skipped: no cgroup with a CPU limit can be made here: {why}");
            return;
        }
    };
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    fs.mount_prefix = cg.enter_prefix();
    fs.mount_args = ["--io-uring", io_uring_mode(), "--ring-priority", "idle"]
        .map(String::from)
        .to_vec();
    fs.mount_env
        .push(("CAIRN_LOG".into(), "info,fuser::uring_sched=debug".into()));
    fs.mount();
    let t0 = Instant::now();
    while ring_threads(&fs) < 2 && t0.elapsed() < Duration::from_secs(10) {
        std::fs::metadata(&fs.mnt).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let rings = ring_threads(&fs);
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch_fifo(&fs, &done);
    // The daemon alone on the CPUs (it wants more than its one CPU), then
    // with busy CPUs outside its cgroup too (its ring threads starve).
    let alone = phase(&fs, &cg, false);
    let contended = phase(&fs, &cg, true);
    done.store(true, Ordering::Relaxed);
    let (fifo, samples) = watcher.join().unwrap();
    let log = fs.daemon_output();
    let raised = |to: &str| {
        let to = format!(": {to}");
        let lines = log.lines().filter(|l| l.contains("fuse ring thread"));
        lines.filter(|l| l.contains(&to)).count()
    };
    eprintln!(
        "[ring_cgroup] cgroup {}, {rings} ring threads; raises to Normal {}, to Realtime {}; \
         {samples} policy samples, threads seen at SCHED_FIFO: {}",
        cg.version,
        raised("Normal"),
        raised("Realtime"),
        fifo.len()
    );
    assert!(
        log.contains("CPU limit of 1.00 CPUs") || rings == 0,
        "the daemon did not see its cgroup's CPU limit\n{}",
        fs.diagnostics()
    );
    assert!(fifo.is_empty(), "threads at SCHED_FIFO: {fifo:?}");
    for (what, used, wall) in [alone, contended] {
        assert!(
            used.as_secs_f64() <= 1.05 * wall.as_secs_f64(),
            "{what}: the daemon used {used:?} of CPU in {wall:?} with a one-CPU quota"
        );
    }
    fs.finish();
    drop(cg);
}
