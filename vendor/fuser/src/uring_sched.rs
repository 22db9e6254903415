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
//!   than `STARVED` in a `PERIOD` for `BOOST`: to `SCHED_FIFO` (the lowest
//!   real-time priority), so that its requests run as soon as they come, as
//!   a kernel filesystem's would. Normal priority is not enough: with eight
//!   threads reading cached files on each CPU (the blogbench-style load), a
//!   raised ring thread still waited 600-800 ms per second for its CPU, the
//!   writers waiting on it slept half the time, and their score halved
//!   after the first iterations.
//! - A boost that ends while more threads are runnable than there are CPUs
//!   is extended: at real time the thread no longer starves, and dropping
//!   it would cost a starved period before the monitor raised it again.
//! - A raised thread that ran more than `HOGGING` in a period, in runs of
//!   `LONG_RUN` or more on average, is doing long work (an inline flush, a
//!   large copy), not short requests (those run for tens of microseconds
//!   and then wait for the next; under the blogbench-style load one ring
//!   thread served them for over half of each second): it drops to
//!   normal priority for the rest of its boost, so it cannot hold its CPU
//!   from other processes. The kernel's real-time throttling bounds the
//!   rest. `SCHED_RESET_ON_FORK` keeps threads it starts at normal priority.
//!
//! Changing these policies needs CAP_SYS_NICE (or RLIMIT_NICE and
//! RLIMIT_RTPRIO), so the idle policy is only used when running as root; a
//! refused `SCHED_FIFO` falls back to normal priority.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicI32;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

use log::debug;

/// Sampling period of the monitor.
const PERIOD: Duration = Duration::from_millis(100);
/// Run-queue wait within one period that counts as starving.
const STARVED: Duration = Duration::from_millis(20);
/// How long a starved thread stays raised.
const BOOST: Duration = Duration::from_secs(2);
/// Run time within one period above which a raised thread counts as doing
/// long work rather than short requests.
const HOGGING: Duration = Duration::from_millis(50);
/// Average length of a run on the CPU above which a thread's work is long.
const LONG_RUN: Duration = Duration::from_millis(1);

/// True when this process may return a thread from `SCHED_IDLE`.
pub(crate) fn can_leave_idle() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn set_policy(tid: i32, policy: i32) -> bool {
    set_policy_at(tid, policy, 0)
}

/// `policy` at static priority `priority` (0 except for real-time ones).
fn set_policy_at(tid: i32, policy: i32, priority: i32) -> bool {
    let p = libc::sched_param {
        sched_priority: priority,
    };
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
    /// The `Level` the monitor set last (as u8; `Idle` until raised).
    level: AtomicU8,
}

/// The policy the monitor keeps a ring thread at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Level {
    /// `SCHED_IDLE`: between requests, on a CPU nothing else wants.
    Idle,
    /// `SCHED_OTHER`: raised, but doing long work.
    Normal,
    /// `SCHED_FIFO` at the lowest priority: raised while starved.
    Realtime,
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
        let raise = bulk && self.idle.load(Ordering::Relaxed) && !self.raised();
        if raise {
            set_policy(0, libc::SCHED_OTHER);
        }
        handler();
        if raise && !self.raised() {
            set_policy(0, libc::SCHED_IDLE);
        }
    }

    fn level(&self) -> Level {
        match self.level.load(Ordering::Relaxed) {
            l if l == Level::Normal as u8 => Level::Normal,
            l if l == Level::Realtime as u8 => Level::Realtime,
            _ => Level::Idle,
        }
    }

    /// The monitor raised it (to `Level::Realtime` or `Level::Normal`).
    fn raised(&self) -> bool {
        self.level() != Level::Idle
    }

    fn set_level(&self, level: Level) {
        self.level.store(level as u8, Ordering::Relaxed);
        let tid = self.tid.load(Ordering::Relaxed);
        if tid == 0 || !self.idle.load(Ordering::Relaxed) {
            return;
        }
        let ok = match level {
            Level::Idle => set_policy(tid, libc::SCHED_IDLE),
            Level::Normal => set_policy(tid, libc::SCHED_OTHER),
            Level::Realtime => {
                let fifo = libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK;
                set_policy_at(tid, fifo, 1) || set_policy(tid, libc::SCHED_OTHER)
            }
        };
        if !ok {
            debug!("fuse ring: cannot set thread {tid} to {level:?}");
        }
    }

    /// Total time the thread ran and waited in the run queue so far.
    fn times(&self) -> Option<Times> {
        let tid = self.tid.load(Ordering::Relaxed);
        if tid == 0 {
            return None;
        }
        let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
        let mut f = s.split_whitespace().map(|v| v.parse::<u64>().ok());
        let ran = Duration::from_nanos(f.next()??);
        let waited = Duration::from_nanos(f.next()??);
        let runs = f.next()??;
        Some(Times { ran, waited, runs })
    }
}

/// CPU time a thread ran, and spent runnable but waiting for its CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Times {
    ran: Duration,
    waited: Duration,
    /// Times the thread was put on its CPU.
    runs: u64,
}

impl Times {
    fn since(self, before: Option<Times>) -> Times {
        match before {
            Some(b) => Times {
                ran: self.ran.saturating_sub(b.ran),
                waited: self.waited.saturating_sub(b.waited),
                runs: self.runs.saturating_sub(b.runs),
            },
            None => Times::default(),
        }
    }
}

/// True when more threads are runnable than there are CPUs (`procs_running`
/// of /proc/stat, less the monitor itself): the CPUs are contended.
fn busy_cpus() -> bool {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return false;
    };
    let running = stat
        .lines()
        .find_map(|l| l.strip_prefix("procs_running "))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    running.is_some_and(|r| r.saturating_sub(1) > cpus)
}

/// The level a ring thread moves to after a period in which it ran and
/// waited `last`, being at `now_at` (None: it stays). A starved thread is
/// raised, to real time unless it ran long; a real-time thread that ran
/// long drops to normal. Lowering back to idle when the boost ends is the
/// caller's.
fn next_level(last: Times, now_at: Level) -> Option<Level> {
    let hogging = last.ran > HOGGING && last.ran > LONG_RUN * last.runs.max(1) as u32;
    if last.waited > STARVED {
        let want = if hogging {
            Level::Normal
        } else {
            Level::Realtime
        };
        return (want != now_at).then_some(want);
    }
    (hogging && now_at == Level::Realtime).then_some(Level::Normal)
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
    let mut last: Vec<Option<Times>> = rings.iter().map(|r| r.sched().times()).collect();
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
            let times = sched.times();
            let period = times.map_or(Times::default(), |t| t.since(last[i]));
            last[i] = times;
            let ended = until[i].is_some_and(|t| now >= t);
            // A raised thread on contended CPUs no longer starves, but
            // dropping it would cost a starved period to raise it again.
            if period.waited > STARVED || (ended && busy_cpus()) {
                until[i] = Some(now + BOOST);
            } else if ended {
                until[i] = None;
                sched.set_level(Level::Idle);
                continue;
            }
            if let Some(l) = next_level(period, sched.level()) {
                debug!(
                    "fuse ring thread {i} ran {:?}, waited {:?}: {l:?}",
                    period.ran, period.waited
                );
                sched.set_level(l);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ran and waited that many ms, in runs of 5 ms (long work).
    fn t(ran_ms: u64, waited_ms: u64) -> Times {
        Times {
            ran: Duration::from_millis(ran_ms),
            waited: Duration::from_millis(waited_ms),
            runs: ran_ms / 5,
        }
    }

    #[test]
    fn a_starved_thread_serving_short_requests_goes_real_time() {
        assert_eq!(next_level(t(5, 80), Level::Idle), Some(Level::Realtime));
        assert_eq!(next_level(t(5, 80), Level::Normal), Some(Level::Realtime));
        // Already there: no change.
        assert_eq!(next_level(t(5, 80), Level::Realtime), None);
        // Not starved, not raised: stays idle.
        assert_eq!(next_level(t(5, 10), Level::Idle), None);
        assert_eq!(next_level(t(90, 5), Level::Idle), None);
    }

    #[test]
    fn a_raised_thread_that_runs_long_drops_to_normal() {
        assert_eq!(next_level(t(60, 5), Level::Realtime), Some(Level::Normal));
        // Starved while running long: normal, not real time.
        assert_eq!(next_level(t(60, 30), Level::Idle), Some(Level::Normal));
        assert_eq!(next_level(t(60, 30), Level::Realtime), Some(Level::Normal));
        // Short work again while raised: stays where it is until starved.
        assert_eq!(next_level(t(5, 5), Level::Normal), None);
    }

    #[test]
    fn a_raised_thread_serving_many_short_requests_stays_real_time() {
        // 560 ms in 28,000 runs of 20 us: short requests, however many.
        let busy = Times {
            runs: 28_000,
            ..t(560, 0)
        };
        assert_eq!(next_level(busy, Level::Realtime), None);
        let starved = Times {
            runs: 28_000,
            ..t(560, 300)
        };
        assert_eq!(next_level(starved, Level::Idle), Some(Level::Realtime));
    }

    #[test]
    fn times_since_an_earlier_sample_are_the_difference() {
        assert_eq!(t(30, 50).since(Some(t(10, 20))), t(20, 30));
        assert_eq!(t(30, 50).since(None), Times::default());
    }
}
