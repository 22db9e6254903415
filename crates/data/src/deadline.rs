//! Device I/O that must not hold the pool forever: a write or sync of one
//! copy among several runs on its own thread, and the caller waits for it
//! at most the pool's I/O timeout (`io_timeout_secs`). A device I/O in the
//! kernel cannot be cancelled: one that does not answer in time keeps its
//! thread (its outcome is dropped when it comes), its device is faulted
//! and the copy it was making is dropped (its slot stays claimed until the
//! next mount, so a late write lands nowhere that matters).
//!
//! Reads are not given threads (they are the hot path): a watchdog asks
//! `ReadStalls` every half second which devices have had reads waiting,
//! none of them finishing, for the I/O timeout; those are faulted, so
//! that later reads go to the other copies (the read already waiting
//! waits until the device answers).

use cairn_devices::Device;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Per device: the reads finished when the watchdog last saw one finish,
/// and since when none has.
#[derive(Debug, Default)]
pub(crate) struct ReadStalls(Mutex<HashMap<u32, (u64, Instant)>>);

impl ReadStalls {
    /// The devices among `devs` whose reads have waited `limit` or more
    /// with none finishing: (device, reads waiting, for how long).
    pub(crate) fn stalled(
        &self,
        devs: &[Arc<Device>],
        limit: Duration,
    ) -> Vec<(u32, u64, Duration)> {
        let now = Instant::now();
        let mut seen = self.0.lock();
        seen.retain(|id, _| devs.iter().any(|d| d.id() == *id));
        let mut out = Vec::new();
        for d in devs {
            let (waiting, done) = d.read_watch();
            let e = seen.entry(d.id()).or_insert((done, now));
            if waiting == 0 || done != e.0 {
                *e = (done, now);
                continue;
            }
            let stuck = now.duration_since(e.1);
            if stuck >= limit {
                out.push((d.id(), waiting, stuck));
            }
        }
        out
    }
}

/// The I/O timeout, in milliseconds (0: wait forever).
#[derive(Debug)]
pub struct IoTimeout(AtomicU64);

impl Default for IoTimeout {
    fn default() -> Self {
        IoTimeout(AtomicU64::new(30_000))
    }
}

impl IoTimeout {
    pub fn set(&self, d: Duration) {
        self.0.store(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

/// Runs each job on its own thread and collects the outcomes: `Some` for
/// those that answered within `limit` (all of them, however long they
/// take, when `limit` is None), `None` for the others, in job order.
pub fn all_within<T: Send + 'static>(
    limit: Option<Duration>,
    jobs: Vec<Box<dyn FnOnce() -> T + Send>>,
) -> Vec<Option<T>> {
    let n = jobs.len();
    let (tx, rx) = mpsc::channel();
    for (i, job) in jobs.into_iter().enumerate() {
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .name("cairn-copy-io".into())
            .spawn(move || {
                let _ = tx.send((i, job()));
            });
        assert!(spawned.is_ok(), "a copy I/O thread could not start");
    }
    drop(tx);
    let end = limit.map(|l| Instant::now() + l);
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let got = match end {
            None => rx.recv().ok(),
            Some(end) => rx
                .recv_timeout(end.saturating_duration_since(Instant::now()))
                .ok(),
        };
        let Some((i, v)) = got else { break };
        out[i] = Some(v);
    }
    out
}

/// A job of one device's I/O.
pub(crate) type DeviceJob = Box<dyn FnOnce() -> crate::error::Result<()> + Send>;

/// `all_within` for I/O of several devices: each job's outcome, a job
/// that did not answer in time `Hung` (naming its device).
pub(crate) fn devices_within(
    limit: Option<Duration>,
    jobs: Vec<(u32, DeviceJob)>,
) -> Vec<crate::error::Result<()>> {
    let secs = limit.map_or(0, |t| t.as_secs());
    let (devices, jobs): (Vec<u32>, Vec<DeviceJob>) = jobs.into_iter().unzip();
    let done = all_within(limit, jobs).into_iter().zip(devices);
    done.map(|(r, device)| r.unwrap_or(Err(crate::error::DataError::Hung { device, secs })))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_that_does_not_answer_in_time_is_left_behind() {
        let jobs: Vec<Box<dyn FnOnce() -> u32 + Send>> = vec![
            Box::new(|| 1),
            Box::new(|| {
                std::thread::sleep(Duration::from_secs(5));
                2
            }),
            Box::new(|| 3),
        ];
        let t = Instant::now();
        let got = all_within(Some(Duration::from_millis(200)), jobs);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(got, vec![Some(1), None, Some(3)]);
        let jobs: Vec<Box<dyn FnOnce() -> u32 + Send>> = vec![Box::new(|| {
            std::thread::sleep(Duration::from_millis(300));
            7
        })];
        assert_eq!(all_within(None, jobs), vec![Some(7)], "no limit: waits");
    }
}
