//! An adaptive worker pool (the knfsd lesson: a fixed pool is too small
//! under blocking load and wasteful when idle). It starts `min` workers,
//! grows by one when every worker is busy and the oldest queued job has
//! waited longer than `grow_after`, and lets a worker exit after sitting
//! idle for `idle_exit`, never going below `min` nor above `max`. A stuck
//! device that blocks every worker forever therefore costs `max` threads,
//! not more: jobs then queue up.
//!
//! A manager thread makes the growth decision (nothing else would notice
//! a queue that stopped moving); the queue, counts and statistics live
//! under one mutex. Dropping the pool runs the jobs still queued and
//! waits for every worker to exit.

mod stats;

pub use stats::{Stats, WaitHistogram};

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A unit of work.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// How a pool sizes itself.
#[derive(Debug, Clone)]
pub struct Config {
    /// Workers kept even when idle (0 is allowed: a worker then starts
    /// as soon as a job arrives).
    pub min: usize,
    /// Workers never exceeded, however long jobs wait (at least 1).
    pub max: usize,
    /// Queue wait of the oldest job, with every worker busy, after which
    /// one more worker starts.
    pub grow_after: Duration,
    /// Idle time after which a worker above `min` exits.
    pub idle_exit: Duration,
    /// Thread name prefix.
    pub name: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            min: 2,
            max: 32,
            grow_after: Duration::from_millis(5),
            idle_exit: Duration::from_secs(10),
            name: "cairn-work".into(),
        }
    }
}

/// The adaptive pool. Submit jobs from any thread (`&self`).
pub struct Pool {
    shared: Arc<Shared>,
    manager: Option<JoinHandle<()>>,
}

struct Shared {
    config: Config,
    state: Mutex<State>,
    /// Workers wait here for jobs.
    work: Condvar,
    /// The manager waits here for queued work (and shutdown).
    manage: Condvar,
    /// Drop waits here for the last worker to exit.
    exited: Condvar,
}

#[derive(Default)]
struct State {
    queue: VecDeque<(Instant, Job)>,
    workers: usize,
    /// Workers started but not yet waiting or working: they count as
    /// idle, so one slow thread start does not trigger a second grow.
    starting: usize,
    busy: usize,
    /// The manager waits without a timeout (nothing was queued): a submit
    /// that leaves more jobs queued than idle workers wakes it. Otherwise
    /// it looks again within a tick on its own, and a submit does not pay
    /// for waking it.
    manager_parked: bool,
    shutdown: bool,
    stats: Stats,
}

impl Pool {
    /// Starts `config.min` workers and the manager thread.
    pub fn new(mut config: Config) -> Pool {
        config.max = config.max.max(1);
        config.min = config.min.min(config.max);
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            manage: Condvar::new(),
            exited: Condvar::new(),
        });
        {
            let mut st = shared.state.lock();
            for _ in 0..shared.config.min {
                spawn_worker(&shared, &mut st);
            }
        }
        let s = shared.clone();
        let manager = std::thread::Builder::new()
            .name(format!("{}-mgr", shared.config.name))
            .spawn(move || manage(&s))
            .expect("spawn the pool manager thread");
        Pool {
            shared,
            manager: Some(manager),
        }
    }

    /// Queues `job`; it runs exactly once on some worker.
    pub fn submit<F: FnOnce() + Send + 'static>(&self, job: F) {
        self.submit_boxed(Box::new(job))
    }

    /// Queues an already boxed job.
    pub fn submit_boxed(&self, job: Job) {
        let sh = &self.shared;
        let mut st = sh.state.lock();
        st.queue.push_back((Instant::now(), job));
        st.stats.submitted += 1;
        if st.workers == 0 {
            spawn_worker(sh, &mut st);
        }
        debug_assert!(
            st.busy <= st.workers,
            "{} busy of {} workers",
            st.busy,
            st.workers
        );
        let wake_manager = st.manager_parked && st.queue.len() > st.workers - st.busy;
        drop(st);
        sh.work.notify_one();
        if wake_manager {
            sh.manage.notify_one();
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let st = self.shared.state.lock();
        let mut s = st.stats.clone();
        s.workers = st.workers as u64;
        s.busy = st.busy as u64;
        s.queued = st.queue.len() as u64;
        s.min = self.shared.config.min as u64;
        s.max = self.shared.config.max as u64;
        s
    }

    /// The configuration in force (min and max clamped).
    pub fn config(&self) -> &Config {
        &self.shared.config
    }
}

impl Drop for Pool {
    /// Runs what is queued, then waits for every worker to exit. A job
    /// that never returns makes this wait forever.
    fn drop(&mut self) {
        let sh = &self.shared;
        sh.state.lock().shutdown = true;
        sh.work.notify_all();
        sh.manage.notify_all();
        if let Some(m) = self.manager.take() {
            let _ = m.join();
        }
        let mut st = sh.state.lock();
        while st.workers > 0 {
            sh.exited.wait(&mut st);
        }
    }
}

fn spawn_worker(sh: &Arc<Shared>, st: &mut State) {
    // The manager grows the pool below `max` only; a submit starts the
    // first worker of an empty pool (and `max` is at least 1).
    debug_assert!(st.workers < sh.config.max, "a worker past the pool's max");
    st.workers += 1;
    st.starting += 1;
    st.stats.started += 1;
    st.stats.peak_workers = st.stats.peak_workers.max(st.workers as u64);
    let s = sh.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("{}-{}", sh.config.name, st.stats.started))
        .spawn(move || worker(&s));
    if spawned.is_err() {
        // Out of threads: carry on with the workers there are.
        st.workers -= 1;
        st.starting -= 1;
        st.stats.spawn_failures += 1;
    }
}

/// The manager: while jobs are queued and nobody is idle, checks the
/// oldest job's wait against `grow_after` and adds one worker.
fn manage(sh: &Arc<Shared>) {
    let cfg = &sh.config;
    let tick = (cfg.grow_after / 4).max(Duration::from_micros(200));
    let mut st = sh.state.lock();
    while !st.shutdown {
        let Some(&(oldest, _)) = st.queue.front() else {
            st.manager_parked = true;
            sh.manage.wait(&mut st);
            st.manager_parked = false;
            continue;
        };
        debug_assert!(
            st.busy <= st.workers,
            "{} busy of {} workers",
            st.busy,
            st.workers
        );
        let idle = st.workers - st.busy; // includes starting workers
        if idle == 0 && st.workers < cfg.max && oldest.elapsed() >= cfg.grow_after {
            spawn_worker(sh, &mut st);
            st.stats.grown += 1;
            continue;
        }
        sh.manage.wait_for(&mut st, tick);
    }
}

fn worker(sh: &Arc<Shared>) {
    let cfg = &sh.config;
    let mut st = sh.state.lock();
    debug_assert!(st.starting > 0, "a worker started that nobody counted");
    st.starting -= 1;
    let mut idle_since = Instant::now();
    loop {
        if let Some((queued_at, job)) = st.queue.pop_front() {
            st.busy += 1;
            st.stats.note_wait(queued_at.elapsed());
            drop(st);
            let began = Instant::now();
            let ok = catch_unwind(AssertUnwindSafe(job)).is_ok();
            let spent = began.elapsed();
            st = sh.state.lock();
            st.busy -= 1;
            st.stats.completed += 1;
            st.stats.panicked += u64::from(!ok);
            st.stats.busy_us += u64::try_from(spent.as_micros()).unwrap_or(u64::MAX);
            idle_since = Instant::now();
            continue;
        }
        if st.shutdown {
            break;
        }
        let timeout = cfg.idle_exit.saturating_sub(idle_since.elapsed());
        if timeout.is_zero() && st.workers > cfg.min {
            st.stats.exited_idle += 1;
            break;
        }
        if timeout.is_zero() {
            idle_since = Instant::now();
            continue;
        }
        sh.work.wait_for(&mut st, timeout);
    }
    st.workers -= 1;
    drop(st);
    sh.exited.notify_all();
}

#[cfg(test)]
mod tests;
