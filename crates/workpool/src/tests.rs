//! The pool's behaviour under blocking load, idleness, stuck jobs and
//! many small jobs, checked against its own statistics.

use super::*;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;

fn config(min: usize, max: usize, idle_exit_ms: u64) -> Config {
    Config {
        min,
        max,
        grow_after: Duration::from_millis(2),
        idle_exit: Duration::from_millis(idle_exit_ms),
        name: "test-pool".into(),
    }
}

/// Polls `f` until it holds or `secs` pass.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    f()
}

/// A gate that blocks jobs until opened.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn wait(&self) {
        let mut open = self.0 .0.lock();
        while !*open {
            self.0 .1.wait(&mut open);
        }
    }
    fn open(&self) {
        *self.0 .0.lock() = true;
        self.0 .1.notify_all();
    }
}

#[test]
fn starts_min_workers() {
    let pool = Pool::new(config(3, 8, 10_000));
    assert!(eventually(5, || pool.stats().workers == 3));
    assert_eq!(pool.stats().grown, 0);
}

#[test]
fn grows_under_blocking_load_up_to_max_then_shrinks_to_min() {
    let pool = Pool::new(config(1, 6, 100));
    let gate = Gate::default();
    let running = Arc::new(AtomicUsize::new(0));
    for _ in 0..20 {
        let (g, r) = (gate.clone(), running.clone());
        pool.submit(move || {
            r.fetch_add(1, Ordering::SeqCst);
            g.wait();
        });
    }
    assert!(
        eventually(10, || pool.stats().workers == 6),
        "never reached max"
    );
    assert!(eventually(5, || running.load(Ordering::SeqCst) == 6));
    // Blocked well past many grow_after periods: still at max.
    std::thread::sleep(Duration::from_millis(100));
    let s = pool.stats();
    assert_eq!((s.workers, s.busy, s.queued), (6, 6, 14), "{s:?}");
    assert_eq!(s.peak_workers, 6);
    assert_eq!(s.grown, 5);
    gate.open();
    assert!(eventually(10, || pool.stats().completed == 20));
    assert!(eventually(10, || pool.stats().workers == 1), "never shrank");
    let s = pool.stats();
    assert_eq!(s.exited_idle, 5, "{s:?}");
    assert_eq!(s.peak_workers, 6);
}

#[test]
fn does_not_grow_while_jobs_are_quick() {
    let pool = Pool::new(Config {
        grow_after: Duration::from_secs(5),
        ..config(2, 16, 10_000)
    });
    let done = Arc::new(AtomicU64::new(0));
    for _ in 0..10_000 {
        let d = done.clone();
        pool.submit(move || {
            d.fetch_add(1, Ordering::Relaxed);
        });
    }
    assert!(eventually(10, || done.load(Ordering::Relaxed) == 10_000));
    let s = pool.stats();
    assert_eq!((s.workers, s.grown), (2, 0), "{s:?}");
}

#[test]
fn stuck_jobs_are_bounded_by_max() {
    let pool = Pool::new(config(0, 3, 50));
    let gate = Gate::default();
    for _ in 0..50 {
        let g = gate.clone();
        pool.submit(move || g.wait());
    }
    std::thread::sleep(Duration::from_millis(300));
    let s = pool.stats();
    assert_eq!((s.workers, s.busy, s.queued, s.peak_workers), (3, 3, 47, 3));
    // More work arriving does not help either.
    for _ in 0..50 {
        pool.submit(|| {});
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(pool.stats().peak_workers, 3);
    gate.open();
    assert!(eventually(10, || pool.stats().completed == 100));
    assert!(eventually(10, || pool.stats().workers == 0));
}

#[test]
fn every_job_runs_exactly_once_and_stats_agree() {
    let pool = Pool::new(config(1, 4, 20));
    let n = 2000usize;
    let hits: Arc<Vec<AtomicUsize>> = Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
    let (tx, rx) = mpsc::channel();
    for i in 0..n {
        let (h, tx) = (hits.clone(), tx.clone());
        pool.submit(move || {
            if i % 100 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            h[i].fetch_add(1, Ordering::SeqCst);
            tx.send(i).unwrap();
        });
    }
    for _ in 0..n {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("a job never ran");
    }
    assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 1));
    assert!(eventually(5, || pool.stats().busy == 0));
    let s = pool.stats();
    assert_eq!(
        (s.submitted, s.completed, s.queued),
        (n as u64, n as u64, 0)
    );
    assert_eq!(s.queue_wait.count, n as u64);
    assert_eq!(s.queue_wait.buckets.iter().sum::<u64>(), n as u64);
    assert!(s.queue_wait.p99_us() <= s.queue_wait.max_us);
    assert!(s.busy_us >= 20 * 5_000, "{} µs busy", s.busy_us);
    assert_eq!(s.started, 1 + s.grown);
    assert!(s.workers <= 4 && s.peak_workers <= 4);
}

#[test]
fn drop_runs_queued_jobs_and_joins() {
    let done = Arc::new(AtomicUsize::new(0));
    {
        let pool = Pool::new(config(1, 1, 10_000));
        for _ in 0..100 {
            let d = done.clone();
            pool.submit(move || {
                std::thread::sleep(Duration::from_micros(100));
                d.fetch_add(1, Ordering::SeqCst);
            });
        }
    }
    assert_eq!(done.load(Ordering::SeqCst), 100);
}

#[test]
fn a_panicking_job_does_not_kill_its_worker() {
    let pool = Pool::new(config(1, 1, 10_000));
    pool.submit(|| panic!("job panics on purpose"));
    let (tx, rx) = mpsc::channel();
    pool.submit(move || tx.send(()).unwrap());
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(eventually(5, || pool.stats().completed == 2));
    let s = pool.stats();
    assert_eq!((s.panicked, s.workers, s.started), (1, 1, 1));
}

#[test]
fn histogram_quantiles() {
    let mut h = WaitHistogram::default();
    for us in [0, 1, 3, 900, 5000] {
        h.note(us);
    }
    assert_eq!(h.count, 5);
    assert_eq!(h.mean_us(), (1 + 3 + 900 + 5000) / 5);
    assert_eq!(h.quantile_us(0.2), 1);
    assert_eq!(h.quantile_us(0.6), 4);
    assert_eq!(h.quantile_us(0.8), 1024);
    assert_eq!(h.p99_us(), 5000);
}

#[test]
fn stats_serialize() {
    let pool = Pool::new(config(1, 2, 10_000));
    let v = serde_json::to_value(pool.stats()).unwrap();
    assert_eq!(v["workers"], 1);
    assert_eq!(v["max"], 2);
    assert!(v["queue_wait"]["buckets"].is_array());
}
