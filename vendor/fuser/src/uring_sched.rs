//! Scheduling policy of FUSE ring threads, added by Cairn.
//!
//! `RingPriority` picks one of three:
//! - `Idle` (the default): ring threads wait for requests at `SCHED_IDLE`
//!   (root only; elsewhere `Normal`, said once in the log).
//! - `Normal`: ring threads run at `SCHED_OTHER` with the process's nice
//!   value, like any other thread, and are never real time.
//! - `Off`: the threads keep whatever policy they inherit; nothing here
//!   touches it (they are still pinned to their queue's CPU).
//!
//! Why `Idle`: a ring thread is pinned to the CPU of its queue, so it runs
//! where its callers run. When its reply wakes the caller, a ring thread at
//! normal priority makes that CPU look busy and the scheduler moves the
//! caller to another CPU, whose queue then serves the next request, and
//! every request crosses CPUs again (on a 2-CPU VM a third of the creates
//! per second of `Idle`). At `SCHED_IDLE` the CPU counts as free and the
//! caller stays.
//!
//! A thread at `SCHED_IDLE` that holds a lock on a CPU other work keeps
//! busy would hold up every request behind it, so requests are handled at
//! `SCHED_OTHER` (`ThreadSched::serve`; the reply is submitted in the next
//! wait, at `SCHED_IDLE` again) unless the monitor found the thread's CPU
//! quiet in the last period: the CPUs not contended (`CpuLoad::busy`) and
//! the thread waiting for its CPU no more than `QUIET_WAIT` a run. On a quiet
//! CPU nothing competes with the thread, and the two `sched_setscheduler`
//! calls per batch would cost over a quarter of the rate of creates.
//!
//! `SCHED_IDLE` must not starve requests when the CPU is busy with other
//! work, so a monitor thread samples each ring thread's run-queue wait
//! (`/proc/self/task/TID/schedstat`) and raises a thread that waited more
//! than `STARVED` in a `PERIOD` for `BOOST`: to `SCHED_FIFO` (the lowest
//! real-time priority), so its requests run as soon as they come, as a
//! kernel filesystem's would (at normal priority, with eight threads
//! reading cached files on each CPU, a raised ring thread still waited
//! 600-800 ms per second for its CPU). Real time is bounded:
//! - never in a cgroup with a CPU limit (`uring_load.rs`): real-time
//!   threads are not held to a cgroup's `cpu.max`, so there a starved
//!   thread is raised to `SCHED_OTHER` only;
//! - at most `RT_STRETCH` at a time, then at least `RT_COOLDOWN` below it;
//! - at most `RT_CPU_BUDGET` of CPU time at real time in any second;
//! - a raised thread that ran more than `HOGGING` in a period, in runs of
//!   `LONG_RUN` or more on average, is doing long work (not short requests,
//!   which run for tens of microseconds and then wait), so it drops to
//!   `SCHED_OTHER`. `SCHED_RESET_ON_FORK` keeps threads it starts normal.
//!
//! The monitor itself runs at `SCHED_FIFO` just above them while they may
//! be real time, so they cannot keep it from lowering them. A boost that
//! ends while the CPUs are contended (`CpuLoad::busy`) is extended. When schedstat cannot be read, starvation cannot be seen:
//! the threads stay at `SCHED_OTHER` and one warning says so.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicI32;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

use log::debug;
use log::info;
use log::warn;

use crate::uring_load::CpuLoad;

/// How FUSE ring threads are scheduled; `UringConfig::priority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RingPriority {
    /// `SCHED_IDLE` while waiting for requests, raised while starved (root
    /// only; elsewhere `Normal`). See the module documentation.
    #[default]
    Idle,
    /// `SCHED_OTHER` at the process's nice value; never real time.
    Normal,
    /// Leave the threads' scheduling as inherited.
    Off,
}

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
/// Longest stretch a thread stays real time (in periods: 10 s). Each
/// stretch is followed by `RT_COOLDOWN` at `SCHED_OTHER`, where a thread
/// serving a loaded machine starves again (writers waiting on it lose about
/// half their rate meanwhile): with 500 ms stretches and 500 ms cool-downs
/// blogbench's write score was 0.81-0.86 of the build before these bounds,
/// with 10 s and 1 s 0.99 (bench/RESULTS.md, smp.sh).
const RT_STRETCH: u32 = 100;
/// Time below real time after a full stretch (in periods: 1 s).
const RT_COOLDOWN: u32 = 10;
/// CPU time a thread may run at real time within `RT_WINDOW` periods: it
/// leaves at least 40% of its CPU to other work each second. Short requests
/// under the blogbench-style load keep a ring thread busy for over half of
/// each second; a 200 ms budget cut their real time short every second.
const RT_CPU_BUDGET: Duration = Duration::from_millis(600);
/// Periods over which `RT_CPU_BUDGET` counts (one second).
const RT_WINDOW: usize = 10;
/// Periods between looks at the process's cgroup limit (one second).
const LIMIT_RECHECK: u64 = 10;
/// Average run-queue wait per run on the CPU up to which a thread's CPU
/// counts as quiet (with the CPUs not contended): it then handles its next
/// requests at `SCHED_IDLE` too (`ThreadSched::serve`). A wakeup on a free
/// CPU waits a few microseconds (1.7 on average over 25,000 runs of a
/// create load on a 2-CPU VM); behind a busy thread it waits a time slice,
/// milliseconds.
const QUIET_WAIT: Duration = Duration::from_micros(50);

/// True when this process may return a thread from `SCHED_IDLE`.
pub(crate) fn can_leave_idle() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The priority ring threads get: `Idle` only where it can be undone.
pub(crate) fn effective(p: RingPriority) -> RingPriority {
    if p == RingPriority::Idle && !can_leave_idle() {
        info!("fuse ring: idle priority needs root; ring threads run at normal priority");
        return RingPriority::Normal;
    }
    p
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

/// Warns, once per process, that schedstat cannot be read.
fn warn_unreadable(tid: i32, err: &std::io::Error) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        warn!(
            "fuse ring: cannot read /proc/self/task/{tid}/schedstat ({err}), so a starved \
             ring thread cannot be seen: ring threads run at normal priority (SCHED_OTHER) \
             instead of the idle policy"
        );
    }
}

/// Run time, run-queue wait and runs of thread `tid` so far.
fn read_schedstat(tid: i32) -> std::io::Result<Times> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))?;
    parse_schedstat(&s).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("unexpected {s:?}"))
    })
}

fn parse_schedstat(s: &str) -> Option<Times> {
    let mut f = s.split_whitespace().map(|v| v.parse::<u64>().ok());
    let ran = Duration::from_nanos(f.next()??);
    let waited = Duration::from_nanos(f.next()??);
    let runs = f.next()??;
    Some(Times { ran, waited, runs })
}

/// One ring thread's scheduling state, shared by the thread and the
/// monitor without a lock (a lock taken by a thread at `SCHED_IDLE` could
/// hold up the monitor). Their policy changes can race: the monitor
/// applies a raised level again every period, and lowers a thread to
/// `SCHED_IDLE` only while it handles no request (`lower_to_idle`).
#[derive(Debug, Default)]
pub(crate) struct ThreadSched {
    /// Kernel thread id, 0 until the thread started.
    tid: AtomicI32,
    /// The thread uses the idle policy between requests.
    idle: AtomicBool,
    /// The `Level` the monitor set last (as u8; `Idle` until raised).
    level: AtomicU8,
    /// The thread is handling requests (`serve`).
    serving: AtomicBool,
    /// The monitor saw the CPUs uncontended and this thread not waiting
    /// for its CPU in the last period: nothing competes with it, so it
    /// handles requests without leaving `SCHED_IDLE` (false until the
    /// monitor's first look).
    quiet: AtomicBool,
}

/// The policy the monitor keeps a ring thread at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Level {
    /// Not raised: `SCHED_IDLE` between requests, `SCHED_OTHER` in them.
    Idle,
    /// `SCHED_OTHER`: raised, but doing long work, out of real-time
    /// budget, or in a CPU-limited cgroup.
    Normal,
    /// `SCHED_FIFO` at the lowest priority: raised while starved.
    Realtime,
}

/// What reading a thread's schedstat gave.
enum Sample {
    NotStarted,
    Unreadable(std::io::Error),
    /// The thread has ended (its ring stopped: an unmount): no longer
    /// watched, and nothing to warn about.
    Gone,
    Read(Times),
}

impl ThreadSched {
    /// Called by the ring thread itself when it starts.
    pub(crate) fn enter(&self, prio: RingPriority) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        self.tid.store(tid, Ordering::Relaxed);
        match prio {
            RingPriority::Off => {}
            RingPriority::Normal => {
                if !set_policy(0, libc::SCHED_OTHER) {
                    debug!("fuse ring: cannot set thread {tid} to SCHED_OTHER");
                }
            }
            RingPriority::Idle => match read_schedstat(tid) {
                Err(err) => {
                    warn_unreadable(tid, &err);
                    set_policy(0, libc::SCHED_OTHER);
                }
                Ok(_) => {
                    if set_policy(0, libc::SCHED_IDLE) {
                        self.idle.store(true, Ordering::Relaxed);
                    }
                }
            },
        }
    }

    /// Handles a batch of requests (on the ring thread), at `SCHED_OTHER`
    /// or the level the monitor raised it to; at `SCHED_IDLE` only while
    /// the monitor finds the thread's CPU quiet (`quiet`), which saves two
    /// `sched_setscheduler` calls per batch (over a quarter of the rate of
    /// small requests such as creates).
    pub(crate) fn serve<R>(&self, handler: impl FnOnce() -> R) -> R {
        if !self.idle.load(Ordering::Relaxed) {
            return handler();
        }
        if self.quiet.load(Ordering::Relaxed) && self.level() == Level::Idle {
            return handler();
        }
        self.serving.store(true, Ordering::SeqCst);
        if self.level() == Level::Idle {
            set_policy(0, libc::SCHED_OTHER);
        }
        let r = handler();
        self.serving.store(false, Ordering::SeqCst);
        if self.idle.load(Ordering::Relaxed) && self.level() == Level::Idle {
            set_policy(0, libc::SCHED_IDLE);
            // The monitor gave up on idle meanwhile: undo.
            if !self.idle.load(Ordering::Relaxed) {
                set_policy(0, libc::SCHED_OTHER);
            }
        }
        r
    }

    fn level(&self) -> Level {
        match self.level.load(Ordering::Relaxed) {
            l if l == Level::Normal as u8 => Level::Normal,
            l if l == Level::Realtime as u8 => Level::Realtime,
            _ => Level::Idle,
        }
    }

    /// Moves the thread to `level`.
    fn set_level(&self, level: Level) {
        self.level.store(level as u8, Ordering::Relaxed);
        self.apply(level);
    }

    /// Sets the policy of a raised level again (the ring thread may have
    /// overwritten it in a race); nothing for `Idle`.
    fn reapply(&self) {
        match self.level() {
            Level::Idle => {}
            l => self.apply(l),
        }
    }

    fn apply(&self, level: Level) {
        let tid = self.tid.load(Ordering::Relaxed);
        if tid == 0 || !self.idle.load(Ordering::Relaxed) {
            return;
        }
        let ok = match level {
            Level::Idle => self.lower_to_idle(tid),
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

    /// `SCHED_IDLE` unless the thread handles requests, else `SCHED_OTHER`
    /// (it lowers itself after them). Checked again after the change: a
    /// batch that began meanwhile set `SCHED_OTHER` before the change
    /// (`serve`), and must not run on at idle priority.
    fn lower_to_idle(&self, tid: i32) -> bool {
        if self.serving.load(Ordering::SeqCst) {
            return set_policy(tid, libc::SCHED_OTHER);
        }
        let ok = set_policy(tid, libc::SCHED_IDLE);
        if self.serving.load(Ordering::SeqCst) {
            set_policy(tid, libc::SCHED_OTHER);
        }
        ok
    }

    /// Leaves the idle policy for good: the thread stays at `SCHED_OTHER`.
    fn give_up_idle(&self) {
        self.level.store(Level::Normal as u8, Ordering::Relaxed);
        self.apply(Level::Normal);
        self.idle.store(false, Ordering::Relaxed);
    }

    /// Total time the thread ran and waited in the run queue so far.
    fn times(&self) -> Sample {
        match self.tid.load(Ordering::Relaxed) {
            0 => Sample::NotStarted,
            tid => match read_schedstat(tid) {
                Ok(t) => Sample::Read(t),
                // Its /proc entry is gone while the process's are there.
                Err(e)
                    if e.kind() == std::io::ErrorKind::NotFound
                        && std::path::Path::new("/proc/self/task").is_dir() =>
                {
                    Sample::Gone
                }
                Err(e) => Sample::Unreadable(e),
            },
        }
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

/// The level a ring thread moves to after a period in which it ran and
/// waited `last`, being at `now_at` (None: it stays). A starved thread is
/// raised, to real time if `rt_ok` and it did not run long, else to
/// normal; a real-time thread that ran long or may no longer be real time
/// drops to normal. Lowering back to idle when the boost ends is the
/// caller's.
fn next_level(last: Times, now_at: Level, rt_ok: bool) -> Option<Level> {
    let hogging = last.ran > HOGGING && last.ran > LONG_RUN * last.runs.max(1) as u32;
    let rt = rt_ok && !hogging;
    if last.waited > STARVED {
        let want = if rt { Level::Realtime } else { Level::Normal };
        return (want != now_at).then_some(want);
    }
    (!rt && now_at == Level::Realtime).then_some(Level::Normal)
}

/// Whether a thread that ran and waited `last` in a period in which the
/// CPUs were `busy` or not may handle requests at `SCHED_IDLE`.
fn is_quiet(last: Times, busy: bool) -> bool {
    !busy && last.waited <= QUIET_WAIT * u32::try_from(last.runs.max(1)).unwrap_or(u32::MAX)
}

/// How much real time a thread has had lately.
#[derive(Debug, Default)]
struct RtBudget {
    /// CPU time run at real time in each of the last `RT_WINDOW` periods.
    ran: [Duration; RT_WINDOW],
    next: usize,
    /// Consecutive periods at real time.
    stretch: u32,
    /// Periods left below real time after a full stretch.
    cooldown: u32,
}

impl RtBudget {
    /// Counts a period in which the thread ran `ran`, at real time or not.
    fn record(&mut self, at_rt: bool, ran: Duration) {
        self.ran[self.next] = if at_rt { ran } else { Duration::ZERO };
        self.next = (self.next + 1) % RT_WINDOW;
        if at_rt {
            self.stretch += 1;
            if self.stretch >= RT_STRETCH {
                self.cooldown = RT_COOLDOWN;
            }
        } else {
            self.stretch = 0;
            self.cooldown = self.cooldown.saturating_sub(1);
        }
    }

    /// Whether the thread may be (or stay) real time for another period.
    fn allows(&self) -> bool {
        let used: Duration = self.ran.iter().sum();
        self.stretch < RT_STRETCH && self.cooldown == 0 && used < RT_CPU_BUDGET
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

/// Waits a period; true when asked to stop.
fn wait(stop: &(parking_lot::Mutex<bool>, parking_lot::Condvar)) -> bool {
    let mut stopped = stop.0.lock();
    if !*stopped {
        stop.1.wait_for(&mut stopped, PERIOD);
    }
    *stopped
}

/// Says what the cgroup CPU limit means for the ring threads.
fn report_limit(load: &CpuLoad) {
    match load.limit() {
        Some(l) => info!(
            "fuse ring: CPU limit of {:.2} CPUs ({}): starved ring threads are raised \
             to SCHED_OTHER, never SCHED_FIFO",
            l.cpus,
            l.dir.display()
        ),
        None => debug!("fuse ring: no cgroup CPU limit; host run queue decides contention"),
    }
}

/// Sets the monitor's own policy: above the ring threads it bounds while
/// they may be real time (so that they cannot keep it from lowering
/// them), normal otherwise. It runs for microseconds ten times a second.
fn monitor_priority(fifo_ok: bool) {
    let ok = if fifo_ok {
        set_policy_at(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, 2)
    } else {
        set_policy(0, libc::SCHED_OTHER)
    };
    if !ok {
        debug!("fuse ring monitor: cannot set its own priority (real time {fifo_ok})");
    }
}

fn watch(rings: &[Arc<dyn HasSched>], stop: &(parking_lot::Mutex<bool>, parking_lot::Condvar)) {
    let mut load = CpuLoad::detect();
    report_limit(&load);
    monitor_priority(load.limit().is_none());
    let mut threads: Vec<Watched> = rings.iter().map(|_| Watched::default()).collect();
    for tick in 1u64.. {
        if wait(stop) {
            return;
        }
        if tick % LIMIT_RECHECK == 0 {
            let now = CpuLoad::detect();
            if now.limit() != load.limit() {
                report_limit(&now);
                monitor_priority(now.limit().is_none());
                load = now;
            }
        }
        let busy = load.busy();
        let fifo_ok = load.limit().is_none();
        let now = Instant::now();
        for (i, (r, w)) in rings.iter().zip(&mut threads).enumerate() {
            w.step(i, r.sched(), now, busy, fifo_ok);
        }
    }
}

/// The monitor's record of one ring thread.
#[derive(Debug, Default)]
struct Watched {
    last: Option<Times>,
    /// When the thread's boost ends, while raised.
    until: Option<Instant>,
    rt: RtBudget,
    /// Its schedstat could not be read (it stays at normal priority), or
    /// the thread has ended: no longer watched.
    gave_up: bool,
}

impl Watched {
    /// One period of thread `i`: raise, extend, lower or leave it.
    fn step(&mut self, i: usize, sched: &ThreadSched, now: Instant, busy: bool, fifo_ok: bool) {
        if self.gave_up {
            return;
        }
        let times = match sched.times() {
            Sample::NotStarted => return,
            Sample::Gone => {
                debug!("fuse ring thread {i} has ended");
                self.gave_up = true;
                return;
            }
            Sample::Read(t) => t,
            Sample::Unreadable(err) => {
                warn_unreadable(sched.tid.load(Ordering::Relaxed), &err);
                sched.give_up_idle();
                self.gave_up = true;
                return;
            }
        };
        let period = times.since(self.last);
        let quiet = self.last.is_some() && is_quiet(period, busy);
        sched.quiet.store(quiet, Ordering::Relaxed);
        self.last = Some(times);
        let level = sched.level();
        self.rt.record(level == Level::Realtime, period.ran);
        let ended = self.until.is_some_and(|t| now >= t);
        // A raised thread on contended CPUs no longer starves, but
        // dropping it would cost a starved period to raise it again.
        if period.waited > STARVED || (ended && busy) {
            self.until = Some(now + BOOST);
        } else if ended {
            self.until = None;
            sched.set_level(Level::Idle);
            return;
        }
        match next_level(period, level, fifo_ok && self.rt.allows()) {
            Some(l) => {
                debug!(
                    "fuse ring thread {i} ran {:?}, waited {:?}: {l:?}",
                    period.ran, period.waited
                );
                sched.set_level(l);
            }
            None => sched.reapply(),
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
        let next = |t, at| next_level(t, at, true);
        assert_eq!(next(t(5, 80), Level::Idle), Some(Level::Realtime));
        assert_eq!(next(t(5, 80), Level::Normal), Some(Level::Realtime));
        // Already there: no change.
        assert_eq!(next(t(5, 80), Level::Realtime), None);
        // Not starved, not raised: stays idle.
        assert_eq!(next(t(5, 10), Level::Idle), None);
        assert_eq!(next(t(90, 5), Level::Idle), None);
    }

    #[test]
    fn only_a_thread_on_a_quiet_cpu_handles_requests_at_idle_priority() {
        let runs = |mut t: Times, n| {
            t.runs = n;
            t
        };
        assert!(is_quiet(runs(t(30, 0), 0), false));
        assert!(is_quiet(runs(t(30, 3), 1700), false), "short waits");
        assert!(
            !is_quiet(runs(t(30, 3), 10), false),
            "it waited for its CPU"
        );
        assert!(!is_quiet(runs(t(30, 1), 0), false), "a wait without a run");
        assert!(!is_quiet(t(30, 0), true), "the CPUs are contended");
        assert!(!ThreadSched::default().quiet.load(Ordering::Relaxed));
    }

    #[test]
    fn without_real_time_a_starved_thread_goes_normal() {
        let next = |t, at| next_level(t, at, false);
        assert_eq!(next(t(5, 80), Level::Idle), Some(Level::Normal));
        assert_eq!(next(t(5, 80), Level::Normal), None);
        // A real-time thread drops as soon as real time is not allowed.
        assert_eq!(next(t(5, 80), Level::Realtime), Some(Level::Normal));
        assert_eq!(next(t(5, 0), Level::Realtime), Some(Level::Normal));
    }

    #[test]
    fn a_raised_thread_that_runs_long_drops_to_normal() {
        let next = |t, at| next_level(t, at, true);
        assert_eq!(next(t(60, 5), Level::Realtime), Some(Level::Normal));
        // Starved while running long: normal, not real time.
        assert_eq!(next(t(60, 30), Level::Idle), Some(Level::Normal));
        assert_eq!(next(t(60, 30), Level::Realtime), Some(Level::Normal));
        // Short work again while raised: stays where it is until starved.
        assert_eq!(next(t(5, 5), Level::Normal), None);
    }

    #[test]
    fn a_raised_thread_serving_many_short_requests_stays_real_time() {
        // 560 ms in 28,000 runs of 20 us: short requests, however many.
        let busy = Times {
            runs: 28_000,
            ..t(560, 0)
        };
        assert_eq!(next_level(busy, Level::Realtime, true), None);
        let starved = Times {
            runs: 28_000,
            ..t(560, 300)
        };
        assert_eq!(
            next_level(starved, Level::Idle, true),
            Some(Level::Realtime)
        );
    }

    #[test]
    fn real_time_lasts_one_stretch_then_cools_down() {
        let mut b = RtBudget::default();
        let ms = Duration::from_millis;
        let mut at_rt = 0;
        while b.allows() {
            b.record(true, ms(1));
            at_rt += 1;
        }
        assert_eq!(at_rt, RT_STRETCH);
        for _ in 0..RT_COOLDOWN - 1 {
            b.record(false, ms(1));
            assert!(!b.allows());
        }
        b.record(false, ms(1));
        assert!(b.allows());
    }

    #[test]
    fn real_time_cpu_use_is_bounded_per_second() {
        let mut b = RtBudget::default();
        let ms = Duration::from_millis;
        // 90 ms of CPU per period at real time: the seventh period ends it.
        for _ in 0..6 {
            b.record(true, ms(90));
        }
        assert!(b.allows());
        b.record(true, ms(90));
        assert!(!b.allows());
        // It comes back once those periods leave the one-second window.
        for _ in 0..RT_WINDOW - 7 {
            b.record(false, ms(0));
        }
        assert!(!b.allows());
        b.record(false, ms(0));
        assert!(b.allows());
    }

    #[test]
    fn times_since_an_earlier_sample_are_the_difference() {
        assert_eq!(t(30, 50).since(Some(t(10, 20))), t(20, 30));
        assert_eq!(t(30, 50).since(None), Times::default());
    }

    #[test]
    fn a_thread_that_ended_is_no_longer_watched_and_keeps_its_level() {
        let sched = ThreadSched::default();
        let tid = std::thread::spawn(|| {
            // SAFETY: gettid has no preconditions.
            unsafe { libc::gettid() }
        })
        .join()
        .unwrap();
        sched.tid.store(tid, Ordering::Relaxed);
        sched.idle.store(true, Ordering::Relaxed);
        assert!(matches!(sched.times(), Sample::Gone));
        let mut w = Watched::default();
        w.step(0, &sched, Instant::now(), false, true);
        assert!(w.gave_up, "an ended thread is not watched again");
        assert!(
            sched.idle.load(Ordering::Relaxed),
            "an ended thread is not a reason to give up the idle policy"
        );
    }

    #[test]
    fn parses_schedstat() {
        let want = Times {
            ran: Duration::from_nanos(1_000),
            waited: Duration::from_nanos(2_000),
            runs: 3,
        };
        assert_eq!(parse_schedstat("1000 2000 3\n"), Some(want));
        assert_eq!(parse_schedstat("1000 x 3\n"), None);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        if std::path::Path::new("/proc/self/task").exists() {
            assert!(read_schedstat(tid).is_ok());
        }
        assert!(read_schedstat(i32::MAX).is_err());
    }
}
