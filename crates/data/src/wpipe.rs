//! Background device writes for a write batch (`writer.rs`): the batch
//! fills one aligned buffer while a thread writes the one before, so sealing
//! blocks (hash, checksum, copy) overlaps with the disk instead of taking
//! turns with it. Writes run one at a time in submission order, so a block
//! written again (the open segment's partial last block) lands in order. The
//! first failed write is reported by the next `take_buffer`, `submit` or
//! `drain`; nothing may be committed that references chunks of a batch whose
//! writes were not all drained without error.

use crate::aligned::AlignedBuf;
use crate::error::{DataError, Result};
use cairn_devices::{Device, DIRECT_ALIGN};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Buffers submitted and not yet written back, at most.
const DEPTH: usize = 2;

/// Where a pipe's writes go: a device (or a test's fault injector).
/// `cached`: write through the host's page cache (small chunks, which
/// reads then find there; see `crate::CACHED_CHUNK`), else past it.
/// The buffer is shared (`Arc`) so that a target writing several copies
/// hands it to a thread per copy without copying it.
pub(crate) trait WriteTarget: Send + Sync {
    fn write(&self, buf: &Arc<AlignedBuf>, len: usize, at: u64, cached: bool) -> Result<()>;
}

/// Writes through the page cache go in pieces of at most this size, each
/// with its writeback started. A kernel without preemption (the default
/// `preempt=none`) does not take the CPU from a write(2) into the page
/// cache: a 4 MiB one holds it for milliseconds, and a request thread
/// woken meanwhile waits for it (its latency tail). Each piece's return to
/// user space is a point where the scheduler can run that thread.
const CACHED_PIECE: usize = 256 << 10;

impl WriteTarget for Device {
    fn write(&self, buf: &Arc<AlignedBuf>, len: usize, at: u64, cached: bool) -> Result<()> {
        write_device(self, buf.slice(len), at, cached)
    }
}

/// Writes `buf` at byte `at` of `dev` (a copy's thread writes so too).
pub(crate) fn write_device(dev: &Device, buf: &[u8], at: u64, cached: bool) -> Result<()> {
    let failed = |e| DataError::of_write(dev.id(), e);
    if !cached {
        dev.write_direct_at(buf, at).map_err(failed)?;
        dev.start_writeback(at, buf.len() as u64);
        return Ok(());
    }
    let mut off = at;
    for piece in buf.chunks(CACHED_PIECE) {
        dev.write_at(piece, off).map_err(failed)?;
        dev.start_writeback(off, piece.len() as u64);
        off += piece.len() as u64;
    }
    Ok(())
}

/// One write: the first `len` bytes of `buf` at byte `at`, through the
/// page cache if `cached`.
struct Job {
    dev: Arc<dyn WriteTarget>,
    at: u64,
    buf: AlignedBuf,
    len: usize,
    cached: bool,
}

/// A written buffer coming back (unless a copy's thread that did not
/// answer in time still holds it), with the write's outcome.
type Done = (Option<AlignedBuf>, Result<()>);

struct Worker {
    jobs: SyncSender<Job>,
    done: Receiver<Done>,
    thread: JoinHandle<()>,
}

/// Buffers a store keeps between write batches, at most.
const KEPT: usize = DEPTH + 1;

/// Written buffers kept from one write batch to the next. Every flush
/// writes out the open segment's partial buffer and starts a new one; a
/// newly allocated 4 MiB buffer faults its pages in as it fills (a fifth of
/// the flusher's time under a small-file load), a kept one is already
/// mapped.
#[derive(Default)]
pub(crate) struct KeptBuffers(parking_lot::Mutex<Vec<AlignedBuf>>);

impl KeptBuffers {
    fn take(&self, cap: usize) -> Option<AlignedBuf> {
        let mut kept = self.0.lock();
        let i = kept.iter().position(|b| b.capacity() >= cap)?;
        Some(kept.swap_remove(i))
    }

    fn keep(&self, bufs: impl IntoIterator<Item = AlignedBuf>) {
        let mut kept = self.0.lock();
        for b in bufs {
            if kept.len() >= KEPT {
                break;
            }
            kept.push(b);
        }
    }
}

pub(crate) struct WritePipe {
    /// Started by the first `submit`.
    worker: Option<Worker>,
    in_flight: usize,
    free: Vec<AlignedBuf>,
    /// The store's buffers: taken from when `free` has none, given the
    /// written ones back at the end.
    kept: Arc<KeptBuffers>,
}

impl WritePipe {
    pub(crate) fn new(kept: Arc<KeptBuffers>) -> Self {
        WritePipe {
            worker: None,
            in_flight: 0,
            free: Vec::new(),
            kept,
        }
    }

    /// An aligned buffer of at least `cap` bytes for the next write: a
    /// written one if any, else a kept or new one while fewer than `DEPTH`
    /// are out; otherwise waits for the oldest write.
    pub(crate) fn take_buffer(&mut self, cap: usize) -> Result<AlignedBuf> {
        self.collect(false)?;
        if self.free.is_empty() && self.in_flight >= DEPTH {
            self.collect(true)?;
        }
        Ok(match self.free.pop() {
            Some(b) if b.capacity() >= cap => b,
            _ => self
                .kept
                .take(cap)
                .unwrap_or_else(|| AlignedBuf::new(cap, DIRECT_ALIGN)),
        })
    }

    /// Queues the write of `buf`'s first `len` bytes at byte `at` of `dev`
    /// (through the page cache if `cached`).
    pub(crate) fn submit(
        &mut self,
        dev: Arc<dyn WriteTarget>,
        at: u64,
        buf: AlignedBuf,
        len: usize,
        cached: bool,
    ) -> Result<()> {
        assert!(len <= buf.capacity());
        let w = self.worker.get_or_insert_with(start_worker);
        let job = Job {
            dev,
            at,
            buf,
            len,
            cached,
        };
        if w.jobs.send(job).is_err() {
            // The thread only ends when `jobs` closes: it panicked.
            return Err(DataError::Writer("thread died"));
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Waits for every submitted write; the first error, if any.
    pub(crate) fn drain(&mut self) -> Result<()> {
        let mut first = Ok(());
        while self.in_flight > 0 {
            if let Err(e) = self.collect(true) {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Takes back written buffers: all that are done, or (`wait`) at least
    /// one. Fails with the first failed write among them.
    fn collect(&mut self, wait: bool) -> Result<()> {
        let Some(w) = &self.worker else {
            return Ok(());
        };
        let mut next = if wait && self.in_flight > 0 {
            match w.done.recv() {
                Ok(d) => Some(d),
                Err(_) => {
                    // The thread ended with writes out: it panicked.
                    self.in_flight = 0;
                    return Err(DataError::Writer("thread died"));
                }
            }
        } else {
            w.done.try_recv().ok()
        };
        let mut first = Ok(());
        while let Some((buf, res)) = next {
            self.in_flight -= 1;
            self.free.extend(buf);
            first = first.and(res);
            next = w.done.try_recv().ok();
        }
        first
    }
}

impl Drop for WritePipe {
    /// Lets queued writes finish (a batch dropped on an error path must not
    /// leave a thread writing into a slot that may be reused).
    fn drop(&mut self) {
        if let Some(w) = self.worker.take() {
            drop(w.jobs);
            let _ = w.thread.join();
            self.free
                .extend(w.done.try_iter().filter_map(|(buf, _)| buf));
        }
        self.kept.keep(self.free.drain(..));
    }
}

fn start_worker() -> Worker {
    let (jobs, rx) = sync_channel::<Job>(DEPTH);
    let (tx, done) = channel::<Done>();
    let thread = std::thread::Builder::new()
        .name("cairn-segwrite".into())
        .spawn(move || write_jobs(rx, tx))
        .expect("spawn segment writer");
    Worker { jobs, done, thread }
}

fn write_jobs(rx: Receiver<Job>, tx: Sender<Done>) {
    for job in rx {
        let buf = Arc::new(job.buf);
        let res = job.dev.write(&buf, job.len, job.at, job.cached);
        if tx.send((Arc::into_inner(buf), res)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    /// Records (offset, first byte) of each write; fails writes at `bad`.
    #[derive(Default)]
    struct Log {
        writes: Mutex<Vec<(u64, u8)>>,
        bad: Option<u64>,
    }

    impl WriteTarget for Log {
        fn write(&self, buf: &Arc<AlignedBuf>, len: usize, at: u64, _: bool) -> Result<()> {
            let buf = buf.slice(len);
            std::thread::sleep(std::time::Duration::from_millis(2));
            if self.bad == Some(at) {
                return Err(DataError::Writer("injected write failure"));
            }
            self.writes.lock().push((at, buf[0]));
            Ok(())
        }
    }

    fn write_all(pipe: &mut WritePipe, log: &Arc<Log>, n: u8) -> Result<()> {
        for i in 0..n {
            let mut b = pipe.take_buffer(8192)?;
            b.slice_mut(8192).fill(i);
            pipe.submit(log.clone(), i as u64 * 4096, b, 8192, false)?;
        }
        pipe.drain()
    }

    #[test]
    fn writes_land_in_order_and_buffers_are_reused() {
        let log = Arc::new(Log::default());
        let mut pipe = WritePipe::new(Arc::default());
        write_all(&mut pipe, &log, 20).unwrap();
        let want: Vec<(u64, u8)> = (0..20u8).map(|i| (i as u64 * 4096, i)).collect();
        assert_eq!(*log.writes.lock(), want);
        assert!(pipe.free.len() <= DEPTH + 1, "{} buffers", pipe.free.len());
        assert_eq!(pipe.in_flight, 0);
    }

    #[test]
    fn written_buffers_outlive_their_pipe_for_the_next_one() {
        let log = Arc::new(Log::default());
        let kept = Arc::new(KeptBuffers::default());
        let mut pipe = WritePipe::new(kept.clone());
        write_all(&mut pipe, &log, 6).unwrap();
        drop(pipe);
        let addr = |b: &AlignedBuf| b.slice(1).as_ptr() as usize;
        let before: Vec<usize> = kept.0.lock().iter().map(addr).collect();
        assert!(!before.is_empty() && before.len() <= KEPT, "{before:?}");
        let mut next = WritePipe::new(kept.clone());
        let b = next.take_buffer(8192).unwrap();
        assert!(
            before.contains(&addr(&b)),
            "a new buffer while one was kept"
        );
        // A kept buffer too small for the need is not handed out.
        let big = next.take_buffer(1 << 20).unwrap();
        assert!(big.capacity() >= 1 << 20);
        assert!(!before.contains(&addr(&big)));
    }

    #[test]
    fn a_failed_write_fails_the_batch() {
        let log = Arc::new(Log {
            bad: Some(5 * 4096),
            ..Default::default()
        });
        let mut pipe = WritePipe::new(Arc::default());
        let err = write_all(&mut pipe, &log, 20).unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
        drop(pipe); // joins the thread (writes may still be queued)
        assert!(log.writes.lock().iter().all(|&(at, _)| at != 5 * 4096));
    }
}
