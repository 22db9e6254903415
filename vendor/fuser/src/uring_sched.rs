//! Scheduling policy of FUSE ring threads, added by Cairn.
//!
//! A ring thread is pinned to the CPU of its queue, so it runs where its
//! callers run. When it replies it wakes the caller while still running; if
//! it ran at normal priority the scheduler would see that CPU as busy and
//! move the caller to another CPU, whose queue then serves the next request,
//! and every request would cross CPUs again. At `SCHED_IDLE` the CPU counts
//! as free and the caller stays.
//!
//! `SCHED_IDLE` must not starve requests when the CPU is busy with other
//! work, so:
//! - reads and writes of 64 KiB or more (long, bulk work) are served at
//!   normal priority;
//! - a monitor thread samples each ring thread's run-queue wait
//!   (`/proc/self/task/TID/schedstat`) and raises a thread that waited more
//!   than `STARVED` in a `PERIOD` to normal priority for `BOOST`.
//!
//! Leaving `SCHED_IDLE` needs CAP_SYS_NICE (or RLIMIT_NICE), so the idle
//! policy is only used when running as root.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicI32;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

use log::debug;

/// Sampling period of the monitor.
const PERIOD: Duration = Duration::from_millis(100);
/// Run-queue wait within one period that counts as starving.
const STARVED: Duration = Duration::from_millis(20);
/// How long a starved thread keeps normal priority.
const BOOST: Duration = Duration::from_secs(2);

/// True when this process may return a thread from `SCHED_IDLE`.
pub(crate) fn can_leave_idle() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn set_policy(tid: i32, policy: i32) -> bool {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscall; tid 0 is the calling thread.
    unsafe { libc::sched_setscheduler(tid, policy, &p) == 0 }
}

/// One ring thread's scheduling state.
#[derive(Debug, Default)]
pub(crate) struct ThreadSched {
    /// Kernel thread id, 0 until the thread started.
    tid: AtomicI32,
    /// The thread uses the idle policy between requests.
    idle: AtomicBool,
    /// The monitor raised it to normal priority.
    boosted: AtomicBool,
}

impl ThreadSched {
    /// Called by the ring thread itself when it starts.
    pub(crate) fn enter(&self, idle: bool) {
        // SAFETY: gettid has no preconditions.
        self.tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
        if idle && set_policy(0, libc::SCHED_IDLE) {
            self.idle.store(true, Ordering::Relaxed);
        }
    }

    /// Runs one request's handler; bulk requests at normal priority.
    pub(crate) fn serve(&self, bulk: bool, handler: impl FnOnce()) {
        let raise =
            bulk && self.idle.load(Ordering::Relaxed) && !self.boosted.load(Ordering::Relaxed);
        if raise {
            set_policy(0, libc::SCHED_OTHER);
        }
        handler();
        if raise && !self.boosted.load(Ordering::Relaxed) {
            set_policy(0, libc::SCHED_IDLE);
        }
    }

    fn boost(&self, on: bool) {
        let tid = self.tid.load(Ordering::Relaxed);
        if tid == 0 || !self.idle.load(Ordering::Relaxed) {
            return;
        }
        self.boosted.store(on, Ordering::Relaxed);
        let policy = if on {
            libc::SCHED_OTHER
        } else {
            libc::SCHED_IDLE
        };
        if !set_policy(tid, policy) {
            debug!("fuse ring: cannot change the policy of thread {tid}");
        }
    }

    /// Total run-queue wait of the thread so far.
    fn wait_time(&self) -> Option<Duration> {
        let tid = self.tid.load(Ordering::Relaxed);
        if tid == 0 {
            return None;
        }
        let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
        let ns: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
        Some(Duration::from_nanos(ns))
    }
}

/// Something that owns a `ThreadSched` (a ring).
pub(crate) trait HasSched: Send + Sync {
    fn sched(&self) -> &ThreadSched;
}

/// The thread that raises starved ring threads.
#[derive(Debug)]
pub(crate) struct Monitor {
    stop: Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>,
    thread: JoinHandle<()>,
}

impl Monitor {
    pub(crate) fn start(rings: Vec<Arc<dyn HasSched>>) -> std::io::Result<Self> {
        let stop = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("fuse-ring-sched".into())
            .spawn(move || watch(&rings, &s))?;
        Ok(Self { stop, thread })
    }

    pub(crate) fn stop(self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        let _ = self.thread.join();
    }
}

fn watch(rings: &[Arc<dyn HasSched>], stop: &(parking_lot::Mutex<bool>, parking_lot::Condvar)) {
    let mut last: Vec<Option<Duration>> = rings.iter().map(|r| r.sched().wait_time()).collect();
    let mut until: Vec<Option<Instant>> = vec![None; rings.len()];
    loop {
        {
            let mut stopped = stop.0.lock();
            if !*stopped {
                stop.1.wait_for(&mut stopped, PERIOD);
            }
            if *stopped {
                return;
            }
        }
        let now = Instant::now();
        for (i, r) in rings.iter().enumerate() {
            let sched = r.sched();
            let wait = sched.wait_time();
            let waited = match (wait, last[i]) {
                (Some(w), Some(l)) => w.saturating_sub(l),
                _ => Duration::ZERO,
            };
            last[i] = wait;
            if waited > STARVED {
                if until[i].is_none() {
                    debug!("fuse ring thread {i} waited {waited:?} for its CPU: normal priority");
                    sched.boost(true);
                }
                until[i] = Some(now + BOOST);
            } else if until[i].is_some_and(|t| now >= t) {
                until[i] = None;
                sched.boost(false);
            }
        }
    }
}
