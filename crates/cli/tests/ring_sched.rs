//! Scheduling of the FUSE ring threads with `--ring-priority idle`
//! (vendor/fuser/src/uring_sched.rs): they wait at SCHED_IDLE; when busy
//! threads keep every CPU, a starved one is raised to SCHED_FIFO (to
//! SCHED_OTHER where this test itself runs under a cgroup CPU limit), so
//! requests are still served at once (at normal priority, eight busy
//! threads per CPU left a raised ring thread waiting 600-800 ms per
//! second); no thread stays real time for more than a stretch of 500 ms;
//! once the CPUs are free again they go back to SCHED_IDLE (on a host kept
//! busy by other work, raised threads may stay at SCHED_OTHER). With the
//! default `--ring-priority normal` they stay at SCHED_OTHER throughout.

mod common;

use common::cgroup::{own_cpu_limit, ring_policies, SCHED_FIFO, SCHED_IDLE, SCHED_OTHER};
use common::*;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Mounts a fresh pool over io_uring with `--ring-priority prio`, turning
/// io_uring on in the kernel if it is off (this test needs it).
fn mount(prio: &str) -> Fs {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    fs.mount_args = [
        "--io-uring",
        "on",
        "--enable-uring-module",
        "--ring-priority",
        prio,
    ]
    .map(String::from)
    .to_vec();
    fs.mount();
    fs
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

fn policies(fs: &Fs) -> Vec<i32> {
    ring_policies(fs.daemon_pid())
        .into_iter()
        .map(|(_, p)| p)
        .collect()
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
        if cond(&policies(fs)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Spinning threads, `per_cpu` per CPU, at this test's (normal) priority,
/// until the returned flag is set.
fn hogs(per_cpu: usize) -> (Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = (0..per_cpu * cpus)
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
    (stop, threads)
}

/// When, and (thread id, policy) of each ring thread then.
type Sample = (Instant, Vec<(u32, i32)>);

/// Ring thread policies every 10 ms, from a thread at SCHED_FIFO (so the
/// hogs cannot hold up the sampling), until `stop` is set.
fn sampler(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<Sample>> {
    std::thread::spawn(move || {
        let p = libc::sched_param { sched_priority: 3 };
        // SAFETY: plain syscall on the calling thread.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) };
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            out.push((Instant::now(), ring_policies(pid)));
            std::thread::sleep(Duration::from_millis(10));
        }
        out
    })
}

/// The longest time any one thread was seen at SCHED_FIFO without a break
/// (samples further apart than 100 ms end a stretch: unknown between).
fn longest_fifo_stretch(samples: &[Sample]) -> Duration {
    let mut start: std::collections::HashMap<u32, Instant> = Default::default();
    let mut longest = Duration::ZERO;
    let mut prev: Option<Instant> = None;
    for (at, threads) in samples {
        if prev.is_some_and(|p| *at - p > Duration::from_millis(100)) {
            start.clear();
        }
        prev = Some(*at);
        for &(tid, policy) in threads {
            if policy == SCHED_FIFO {
                let s = *start.entry(tid).or_insert(*at);
                longest = longest.max(*at - s);
            } else {
                start.remove(&tid);
            }
        }
    }
    longest
}

/// All of at least two ring threads at SCHED_IDLE.
fn all_idle(p: &[i32]) -> bool {
    p.len() >= 2 && p.iter().all(|&p| p == SCHED_IDLE)
}

/// Busy CPUs (eight spinning threads per CPU, at this test's normal
/// priority) for a while, with requests: whether a ring thread reached
/// policy `raised_to`, and the policies sampled meanwhile.
fn starve(fs: &Fs, raised_to: i32) -> (bool, Vec<Sample>) {
    let done = Arc::new(AtomicBool::new(false));
    let samples = sampler(fs.daemon_pid(), done.clone());
    let (stop, threads) = hogs(8);
    let raised = poll(fs, Duration::from_secs(15), |p| p.contains(&raised_to));
    // Keep the load a while longer: the stretch limit must show.
    let t0 = Instant::now();
    let mut i = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        touch(fs, i);
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|h| h.join().unwrap());
    done.store(true, Ordering::Relaxed);
    (raised, samples.join().unwrap())
}

/// The ring threads go back to SCHED_IDLE: 2 s after the last starved
/// period, longer while the host stays busy (here that can be other work
/// than this test's), when raised threads may stay at SCHED_OTHER.
fn assert_back_to_idle(fs: &Fs) {
    let mut busy_polls = 0;
    let back = poll(fs, Duration::from_secs(15), |p| {
        busy_polls += usize::from(host_busy());
        all_idle(p)
    });
    if back {
        return;
    }
    let p = policies(fs);
    assert!(
        busy_polls > 0,
        "ring threads did not return to SCHED_IDLE on a quiet host: {p:?}"
    );
    assert!(
        p.iter().all(|&x| x == SCHED_IDLE || x == SCHED_OTHER),
        "ring threads not back from real time on a busy host: {p:?}"
    );
    eprintln!(
        "other work kept the host busy ({busy_polls} polls): \
         ring threads stay raised at SCHED_OTHER: {p:?}"
    );
}

#[test]
fn a_ring_thread_starved_by_busy_cpus_is_raised_briefly_and_back_to_idle_after() {
    let limited = own_cpu_limit();
    // Under a cgroup CPU limit a starved thread is raised to SCHED_OTHER.
    let raised_to = if limited.is_some() {
        SCHED_OTHER
    } else {
        SCHED_FIFO
    };
    let fs = mount("idle");
    assert!(
        poll(&fs, Duration::from_secs(10), all_idle),
        "ring threads not all at SCHED_IDLE on a quiet machine: {:?}",
        fs.daemon_thread_policies()
    );
    let (raised, samples) = starve(&fs, raised_to);
    let fifo_seen = samples
        .iter()
        .any(|(_, t)| t.iter().any(|&(_, p)| p == SCHED_FIFO));
    let stretch = longest_fifo_stretch(&samples);
    eprintln!(
        "cgroup CPU limit {limited:?}; {} samples, SCHED_FIFO seen: {fifo_seen}, \
         longest SCHED_FIFO stretch {stretch:?}",
        samples.len()
    );
    assert!(
        raised,
        "no ring thread went to policy {raised_to} while busy threads held the CPUs"
    );
    if limited.is_some() {
        assert!(!fifo_seen, "SCHED_FIFO under a cgroup CPU limit");
    }
    // 500 ms, plus the monitor's period and the sampling's granularity.
    assert!(
        stretch <= Duration::from_millis(800),
        "a ring thread stayed SCHED_FIFO for {stretch:?}"
    );
    assert_back_to_idle(&fs);
    fs.finish();
}

/// More threads runnable host-wide than there are CPUs (the monitor's
/// test for extending a boost where no cgroup CPU limit applies).
fn host_busy() -> bool {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let running = stat
        .lines()
        .find_map(|l| l.strip_prefix("procs_running "))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    running.saturating_sub(1) > cpus
}

#[test]
fn ring_threads_stay_normal_by_default_even_on_busy_cpus() {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    fs.mount_args = OVER_IO_URING.map(String::from).to_vec();
    fs.mount();
    let normal = |p: &[i32]| p.len() >= 2 && p.iter().all(|&p| p == SCHED_OTHER);
    assert!(
        poll(&fs, Duration::from_secs(10), normal),
        "ring threads not at SCHED_OTHER: {:?}",
        fs.daemon_thread_policies()
    );
    let (stop, threads) = hogs(4);
    let changed = poll(&fs, Duration::from_secs(4), |p| !normal(p));
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|h| h.join().unwrap());
    assert!(
        !changed,
        "a ring thread left SCHED_OTHER: {:?}",
        policies(&fs)
    );
    assert!(
        !fs.daemon_threads().iter().any(|t| t == "fuse-ring-sched"),
        "a scheduling monitor runs under --ring-priority normal"
    );
    fs.finish();
}
