//! FUSE over io_uring (Linux 6.14+, `fuse.enable_uring=1`), added by Cairn.
//!
//! The kernel keeps one request queue per CPU and hands a request to the
//! queue of the CPU its caller runs on. Serving each queue from threads pinned
//! to that CPU means a request and its reply never cross CPUs: on virtual
//! machines, where waking an idle CPU costs tens of microseconds, this is what
//! makes small metadata operations fast.
//!
//! Protocol (kernel `fs/fuse/dev_uring.c`): each ring entry is a pair of user
//! buffers registered with `FUSE_IO_URING_CMD_REGISTER` (an `IORING_OP_URING_CMD`
//! on the /dev/fuse fd, 128-byte SQEs). When a request arrives, the entry's
//! command completes with the `fuse_in_header` and the opcode's fixed-size
//! argument in the header buffer and the rest (names, write data) in the
//! payload buffer. The reply goes back into the same buffers and is sent with
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also re-arms the entry.
//! FORGET, INTERRUPT and notifications still use /dev/fuse, so the classic
//! reader threads keep running beside the rings.
//!
//! fuser's parser wants one contiguous request, so the small header and
//! argument are copied to just before the payload, which sits at a fixed,
//! page-aligned offset (`PREFIX`) in its buffer. A reply that would overwrite a
//! payload still borrowed by the running handler is staged and committed when
//! the handler returns.

use std::collections::VecDeque;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::thread::ThreadId;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::info;
use log::warn;
use parking_lot::Mutex;

use crate::Errno;
use crate::Filesystem;
use crate::channel::ChannelSender;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// Size of `struct fuse_in_header`.
const IN_HEADER: usize = 40;
/// Size of `struct fuse_out_header`.
const OUT_HEADER: usize = 16;
/// Size of the header buffer's per-opcode argument area.
const OP_IN: usize = 128;
/// Room before the payload where a request is made contiguous again.
const PREFIX: usize = 4096;
const OP_READ: u32 = 15;
const OP_WRITE: u32 = 16;
const OP_FSYNC: u32 = 20;
const OP_FSYNCDIR: u32 = 30;
const OP_SETLKW: u32 = 33;
/// `user_data` of the eventfd poll that stops a ring thread.
const STOP: u64 = u64::MAX;
/// user_data of a no-op that wakes the ring thread to look at `pending`.
const WAKE: u64 = u64::MAX - 1;

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
struct EntInOut {
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`, page-aligned like libfuse allocates it.
#[repr(C, align(4096))]
struct ReqHeader {
    in_out: [u8; 128],
    op_in: [u8; OP_IN],
    ent: EntInOut,
}

/// Runs the jobs ring threads hand off (large reads and writes, requests
/// that may block): a worker pool of the filesystem's choosing.
pub trait Executor: Send + Sync + std::fmt::Debug {
    /// Runs `job` on some other thread, soon.
    fn execute(&self, job: Box<dyn FnOnce() + Send>);
}

/// How the rings are set up; see `Config::io_uring`.
#[derive(Debug, Clone)]
pub struct UringConfig {
    /// Threads (each with its own ring and one entry) per CPU queue. More
    /// than one keeps a CPU's queue moving while a handler blocks.
    pub threads_per_queue: usize,
    /// How ring threads are scheduled: `Normal` (the default) leaves them
    /// at `SCHED_OTHER`; `Idle` (root only) has them wait for requests at
    /// `SCHED_IDLE`, so the scheduler sees their CPU as free when a reply
    /// wakes the caller and keeps the caller there, and raises a thread
    /// that waits for its CPU for a while; `Off` leaves their policy alone
    /// (see `uring_sched.rs`).
    pub priority: crate::uring_sched::RingPriority,
    /// Entries registered per thread: requests it can hold at once (those
    /// handed to workers keep theirs until they reply).
    pub entries_per_thread: usize,
    /// READs and WRITEs of at least this many bytes are served by unpinned
    /// worker threads, so that copying their data runs on another CPU than
    /// the caller's (which it needs for its own copy); so are requests that
    /// may block for long (fsync unless `Filesystem::fsync_is_quick`,
    /// waiting locks), so they do not hold up the requests queued behind
    /// them on the ring. 0 serves everything on the ring threads.
    pub bulk_read_min: u32,
    /// Where those requests run: None starts a fixed pool of unpinned
    /// threads (two per CPU and two more, at most 32).
    pub executor: Option<Arc<dyn Executor>>,
}

/// Equal settings; executors are equal when they are the same one.
impl PartialEq for UringConfig {
    fn eq(&self, o: &Self) -> bool {
        let same_executor = match (&self.executor, &o.executor) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        (
            self.threads_per_queue,
            self.priority,
            self.entries_per_thread,
        ) == (o.threads_per_queue, o.priority, o.entries_per_thread)
            && self.bulk_read_min == o.bulk_read_min
            && same_executor
    }
}

impl Eq for UringConfig {}

impl Default for UringConfig {
    fn default() -> Self {
        Self {
            threads_per_queue: 2,
            priority: crate::uring_sched::RingPriority::default(),
            entries_per_thread: 4,
            bulk_read_min: 128 * 1024,
            executor: None,
        }
    }
}

/// A page-aligned payload buffer: `PREFIX` bytes, then the kernel's payload.
struct Payload {
    ptr: *mut u8,
    /// Bytes mapped at `ptr`.
    size: usize,
    /// Bytes after the prefix registered with the kernel.
    len: usize,
}

impl Payload {
    /// In 2 MiB huge pages where the kernel allows (transparent huge pages
    /// on madvise): the kernel pins the buffer for every reply it copies,
    /// one page per 2 MiB instead of one per 4 KiB. Mapped and advised
    /// before anything touches it, since a page faulted in small stays small.
    fn new(payload_size: usize) -> Self {
        const HUGE: usize = 2 << 20;
        let size = (PREFIX + payload_size).next_multiple_of(HUGE);
        let len = size + HUGE;
        // SAFETY: a fresh private anonymous mapping; we own all of it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            p != libc::MAP_FAILED,
            "out of memory for a FUSE ring buffer"
        );
        let start = (p as usize).next_multiple_of(HUGE);
        let head = start - p as usize;
        // SAFETY: the unaligned head and the tail beyond `size` are ours and
        // unused; refused advice only loses the speedup.
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            if len - head > size {
                libc::munmap((start + size) as *mut libc::c_void, len - head - size);
            }
            libc::madvise(start as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
        }
        Self {
            ptr: start as *mut u8,
            size,
            len: payload_size,
        }
    }

    fn kernel_part(&self) -> (*mut u8, usize) {
        // SAFETY: PREFIX + len <= size.
        (unsafe { self.ptr.add(PREFIX) }, self.len)
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this size.
        unsafe { libc::munmap(self.ptr.cast(), self.size) };
    }
}

/// What a ring entry is doing; guarded by `Entry::state`.
#[derive(Default)]
struct EntryState {
    /// The kernel's id of the request being served (its `unique`).
    commit_id: u64,
    /// The running handler borrows the payload area the reply goes to.
    payload_borrowed: bool,
    /// A reply sent while the payload was borrowed.
    staged: Option<Vec<u8>>,
}

/// One registered pair of buffers.
struct Entry {
    header: *mut ReqHeader,
    payload: Payload,
    iov: Box<[libc::iovec; 2]>,
    state: Mutex<EntryState>,
}

// SAFETY: the raw buffers are only touched under `state` or by the ring
// thread while the kernel owns no command for the entry.
unsafe impl Send for Entry {}
// SAFETY: as above.
unsafe impl Sync for Entry {}

impl Entry {
    fn new(payload_size: usize) -> Self {
        let header = Box::into_raw(Box::new(ReqHeader {
            in_out: [0; 128],
            op_in: [0; OP_IN],
            ent: EntInOut {
                flags: 0,
                commit_id: 0,
                payload_sz: 0,
                padding: 0,
                reserved: 0,
            },
        }));
        let payload = Payload::new(payload_size);
        let (p, n) = payload.kernel_part();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.cast(),
                iov_len: size_of::<ReqHeader>(),
            },
            libc::iovec {
                iov_base: p.cast(),
                iov_len: n,
            },
        ]);
        Self {
            header,
            payload,
            iov,
            state: Mutex::new(EntryState::default()),
        }
    }

    /// Copies a reply (out header, then arguments) into the buffers.
    ///
    /// # Safety
    /// The kernel must not own the entry and no live borrow may cover the
    /// payload's kernel part.
    unsafe fn write_reply(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let total: usize = data.iter().map(|d| d.len()).sum();
        let (payload, cap) = self.payload.kernel_part();
        if total < OUT_HEADER || total - OUT_HEADER > cap {
            return Err(io::Error::other(format!(
                "FUSE reply of {total} bytes does not fit the ring buffer ({cap})"
            )));
        }
        let mut off = 0usize;
        for part in data {
            // The bytes before OUT_HEADER go to the header, the rest to the payload.
            let (head, body) = part.split_at(OUT_HEADER.saturating_sub(off).min(part.len()));
            // SAFETY: caller guarantees exclusive access; the header part ends
            // at OUT_HEADER < 128 and the body at total - OUT_HEADER <= cap.
            unsafe {
                let h = (*self.header).in_out.as_mut_ptr().add(off.min(OUT_HEADER));
                std::ptr::copy_nonoverlapping(head.as_ptr(), h, head.len());
                let at = (off + head.len()).saturating_sub(OUT_HEADER);
                std::ptr::copy_nonoverlapping(body.as_ptr(), payload.add(at), body.len());
            }
            off += part.len();
        }
        // SAFETY: exclusive access as above.
        unsafe { (*self.header).ent.payload_sz = (total - OUT_HEADER) as u32 };
        Ok(())
    }
    /// Lets `fill` write up to `max` bytes of reply data straight into the
    /// payload, then writes the out header (or an error header if `fill`
    /// fails); gives `fill` back when the payload is borrowed or too small.
    ///
    /// # Safety
    /// The kernel must not own the entry; `st` is its locked state.
    unsafe fn fill_reply<F>(
        &self,
        st: &EntryState,
        unique: u64,
        max: usize,
        fill: F,
    ) -> Result<(), F>
    where
        F: FnOnce(&mut [u8]) -> Result<usize, Errno>,
    {
        let (payload, cap) = self.payload.kernel_part();
        if st.payload_borrowed || max > cap {
            return Err(fill);
        }
        // SAFETY: caller guarantees exclusive access; the handler borrows
        // none of the payload; max <= cap.
        let buf = unsafe { std::slice::from_raw_parts_mut(payload, max) };
        let (hdr, n) = match fill(buf) {
            Ok(n) => {
                assert!(n <= max, "filled {n} bytes into a {max}-byte reply");
                (out_header(unique, 0, n), n)
            }
            Err(errno) => (error_header(unique, errno.code()), 0),
        };
        // SAFETY: exclusive access as above.
        unsafe {
            let h = &mut *self.header;
            h.in_out[..OUT_HEADER].copy_from_slice(&hdr);
            h.ent.payload_sz = n as u32;
        }
        Ok(())
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // SAFETY: created by Box::into_raw in `new`.
        drop(unsafe { Box::from_raw(self.header) });
    }
}

/// One io_uring with its entries, served by one pinned thread.
pub(crate) struct Ring {
    io: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Serializes pushes onto the submission queue.
    sq: Mutex<()>,
    dev_fd: RawFd,
    qid: u16,
    entries: Vec<Entry>,
    stop: OwnedFd,
    /// The thread serving this ring (set when it starts).
    owner: OnceLock<ThreadId>,
    sched: crate::uring_sched::ThreadSched,
    /// Serializes reading the completion queue: the ring thread reads it,
    /// and so does the rescuer while the ring thread is stuck in one
    /// request (`uring_rescue.rs`).
    cq: Mutex<()>,
    /// Completions read and not yet handled, in order: the ring thread
    /// takes them one at a time, so those behind a request that blocks
    /// can be handed to workers by the rescuer.
    pending: Mutex<VecDeque<(u64, i32)>>,
    /// When the ring thread started the request it serves itself
    /// (`uring_rescue::now_ms`), 0 while it serves none.
    pub(crate) busy_since: AtomicU64,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ring(qid {})", self.qid)
    }
}

fn cmd_req(qid: u16, commit_id: u64) -> [u8; 80] {
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 pad[6]; }
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

/// Sets an SQE's `len` field, which io-uring's `UringCmd80` builder leaves at 0.
fn with_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: Entry128 is repr(C) over the 128-byte io_uring_sqe, in which
    // every bit pattern is valid; `len` is the u32 at offset 24.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

impl Ring {
    fn new(dev_fd: RawFd, qid: u16, payload_size: usize, depth: usize) -> io::Result<Self> {
        let entries = (0..depth.max(1))
            .map(|_| Entry::new(payload_size))
            .collect();
        let sqes = (depth as u32 + 1).next_power_of_two().max(8);
        let io = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(sqes)?;
        // SAFETY: plain eventfd creation.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            io,
            sq: Mutex::new(()),
            dev_fd,
            qid,
            entries,
            // SAFETY: efd is a fresh descriptor we own.
            stop: unsafe { OwnedFd::from_raw_fd(efd) },
            owner: OnceLock::new(),
            sched: crate::uring_sched::ThreadSched::default(),
            cq: Mutex::new(()),
            pending: Mutex::new(VecDeque::new()),
            busy_since: AtomicU64::new(0),
        })
    }

    /// Moves the completions the kernel has posted to `pending`.
    fn reap(&self) {
        let _cq = self.cq.lock();
        // SAFETY: readers of the completion queue are serialized by `cq`.
        let done = unsafe { self.io.completion_shared() };
        self.pending
            .lock()
            .extend(done.map(|c| (c.user_data(), c.result())));
    }

    /// The next completion to handle.
    fn next_pending(&self) -> Option<(u64, i32)> {
        self.pending.lock().pop_front()
    }

    /// Puts back a completion only the ring thread may handle, and wakes
    /// it (it may be waiting for the kernel, which will post nothing more
    /// for what the rescuer read).
    fn give_back(&self, c: (u64, i32)) -> io::Result<()> {
        self.pending.lock().push_front(c);
        let nop = opcode::Nop::new().build().user_data(WAKE);
        self.push(&squeue::Entry128::from(nop))?;
        self.io.submit().map(|_| ())
    }

    fn push(&self, sqe: &squeue::Entry128) -> io::Result<()> {
        let _guard = self.sq.lock();
        loop {
            // SAFETY: pushes are serialized by `sq`; only the ring thread reads
            // the completion queue.
            let pushed = unsafe { self.io.submission_shared().push(sqe).is_ok() };
            if pushed {
                return Ok(());
            }
            self.io.submit()?;
        }
    }

    fn register(&self, idx: usize) -> io::Result<()> {
        let e = &self.entries[idx];
        let sqe = opcode::UringCmd80::new(types::Fd(self.dev_fd), CMD_REGISTER)
            .cmd(cmd_req(self.qid, 0))
            .addr(Some(e.iov.as_ptr() as u64))
            .build()
            .user_data(idx as u64);
        self.push(&with_len(sqe, 2))
    }

    fn commit(&self, idx: usize, commit_id: u64) -> io::Result<()> {
        let mine = self.owner.get() == Some(&std::thread::current().id());
        let mut sqe = opcode::UringCmd80::new(types::Fd(self.dev_fd), CMD_COMMIT_AND_FETCH)
            .cmd(cmd_req(self.qid, commit_id))
            .build()
            .user_data(idx as u64);
        if !mine {
            // A worker's commit copies a large reply into the page cache; the
            // kernel would do that holding the ring's lock, serializing every
            // worker on it. Run it on the ring's async workers instead.
            sqe = sqe.flags(squeue::Flags::ASYNC);
        }
        self.push(&sqe)?;
        // The ring thread submits in its next wait; anyone else submits now.
        if !mine {
            self.io.submit()?;
        }
        Ok(())
    }

    /// Replies to the entry's request (from any thread).
    fn send(&self, idx: usize, data: &[IoSlice<'_>]) -> io::Result<()> {
        let e = &self.entries[idx];
        let mut st = e.state.lock();
        if st.payload_borrowed {
            let mut v = Vec::with_capacity(data.iter().map(|d| d.len()).sum());
            for d in data {
                v.extend_from_slice(d);
            }
            st.staged = Some(v);
            return Ok(());
        }
        // SAFETY: the kernel handed us this entry and nothing borrows the
        // payload's kernel part any more (or the request had no payload).
        let res = unsafe { e.write_reply(data) };
        if let Err(err) = res {
            error!("{err}");
            // Answer EIO instead, so the caller is not left hanging.
            let hdr = error_header(st.commit_id, libc::EIO);
            // SAFETY: as above.
            unsafe { e.write_reply(&[IoSlice::new(&hdr)])? };
        }
        self.commit(idx, st.commit_id)
    }

    /// Replies with up to `max` bytes that `fill` writes straight into the
    /// entry's payload buffer (sparing a copy), when the running request
    /// borrows none of it and `max` fits; gives `fill` back otherwise.
    fn send_filled<F>(
        &self,
        idx: usize,
        unique: u64,
        max: usize,
        fill: F,
    ) -> Result<io::Result<()>, F>
    where
        F: FnOnce(&mut [u8]) -> Result<usize, Errno>,
    {
        let e = &self.entries[idx];
        let st = e.state.lock();
        // SAFETY: the kernel owns no command for the entry until we commit.
        unsafe { e.fill_reply(&st, unique, max, fill)? };
        Ok(self.commit(idx, st.commit_id))
    }

    /// After the handler returns: commit a reply it staged.
    fn finish_dispatch(&self, idx: usize) -> io::Result<()> {
        let e = &self.entries[idx];
        let staged = {
            let mut st = e.state.lock();
            st.payload_borrowed = false;
            st.staged.take()
        };
        match staged {
            Some(v) => self.send(idx, &[IoSlice::new(&v)]),
            None => Ok(()),
        }
    }

    fn arm_stop(&self) -> io::Result<()> {
        let sqe = opcode::PollAdd::new(types::Fd(self.stop.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(STOP);
        self.push(&squeue::Entry128::from(sqe))
    }

    fn wake_to_stop(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes to our own eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

fn error_header(unique: u64, errno: i32) -> [u8; OUT_HEADER] {
    out_header(unique, errno, 0)
}

/// A `fuse_out_header` for a reply of `payload` bytes after it.
fn out_header(unique: u64, errno: i32, payload: usize) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[0..4].copy_from_slice(&((OUT_HEADER + payload) as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

/// The reply path for a request that came through a ring.
#[derive(Clone, Debug)]
pub(crate) struct UringSender {
    ring: Arc<Ring>,
    idx: usize,
    /// /dev/fuse, for the ioctls that have no ring command (passthrough).
    pub(crate) dev: ChannelSender,
}

impl UringSender {
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        self.ring.send(self.idx, data)
    }

    pub(crate) fn send_filled<F>(
        &self,
        unique: u64,
        max: usize,
        fill: F,
    ) -> Result<io::Result<()>, F>
    where
        F: FnOnce(&mut [u8]) -> Result<usize, Errno>,
    {
        self.ring.send_filled(self.idx, unique, max, fill)
    }
}

/// Running ring threads; `stop` ends them.
#[derive(Debug)]
pub(crate) struct Rings {
    rings: Vec<Arc<Ring>>,
    threads: Vec<JoinHandle<()>>,
    monitor: Option<crate::uring_sched::Monitor>,
    bulk: Option<BulkPool>,
    rescuer: Option<crate::uring_rescue::Rescuer>,
}

impl Rings {
    pub(crate) fn stop(self) {
        if let Some(m) = self.monitor {
            m.stop();
        }
        if let Some(r) = self.rescuer {
            r.stop();
        }
        for r in &self.rings {
            r.wake_to_stop();
        }
        for t in self.threads {
            let _ = t.join();
        }
        if let Some(b) = self.bulk {
            b.stop();
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Unpinned threads at normal priority that serve large reads and writes
/// and requests that may block.
#[derive(Debug)]
struct BulkPool {
    tx: std::sync::mpsc::Sender<Job>,
    threads: Vec<JoinHandle<()>>,
}

impl BulkPool {
    fn start(n: usize) -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let rx = rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("fuse-bulk-{i}"))
                    .spawn(move || {
                        loop {
                            let job = rx.lock().recv();
                            match job {
                                Ok(job) => job(),
                                Err(_) => return,
                            }
                        }
                    })?,
            );
        }
        Ok(Self { tx, threads })
    }

    fn stop(self) {
        drop(self.tx);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// A request's bytes, kept in its entry's buffer until the reply commits,
/// and whether they reach into the payload area a reply is written to.
struct RequestBytes(*const u8, usize, bool);

// SAFETY: the bytes stay valid and unchanged until the entry is committed,
// which only the holder of this value does (through its reply).
unsafe impl Send for RequestBytes {}

/// The kernel keeps one queue per *possible* CPU and uses the rings only
/// once every queue has an entry, so this must match its count.
fn possible_cpus() -> usize {
    let listed = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| last_cpu_in_list(&s));
    if let Some(last) = listed {
        return last + 1;
    }
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.max(1) as usize
}

/// The highest CPU in a kernel CPU list such as "0-3,8-11".
fn last_cpu_in_list(s: &str) -> Option<usize> {
    s.trim()
        .split(',')
        .filter_map(|part| part.rsplit('-').next()?.trim().parse().ok())
        .max()
}

/// Entries per ring thread: the configured number, fewer on machines with
/// many CPUs so that all rings together hold at most about 64 entries
/// (each has a 2 MiB payload buffer), but at least one.
fn entries_per_thread(cfg: &UringConfig, cpus: usize) -> usize {
    let threads = cpus * cfg.threads_per_queue.max(1);
    cfg.entries_per_thread.min(64 / threads).max(1)
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays in bounds for cpu < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!(
                "fuse ring: cannot pin to cpu {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// Starts `threads_per_queue` pinned ring threads for every possible CPU.
/// The kernel switches to the rings once every queue has an entry.
pub(crate) fn start<FS: Filesystem>(
    cfg: UringConfig,
    dev_fd: RawFd,
    payload_size: usize,
    make_loop: impl Fn(String) -> SessionEventLoop<FS>,
) -> io::Result<Rings> {
    let cpus = possible_cpus();
    let depth = entries_per_thread(&cfg, cpus);
    let prio = crate::uring_sched::effective(cfg.priority);
    let mut rings = Rings {
        rings: Vec::new(),
        threads: Vec::new(),
        monitor: None,
        bulk: None,
        rescuer: None,
    };
    let mut loops = Vec::new();
    let bulk = match (cfg.bulk_read_min, &cfg.executor) {
        (0, _) => None,
        (min, Some(e)) => Some((Handoff::Executor(e.clone()), min)),
        (min, None) => {
            let pool = BulkPool::start((2 * cpus + 2).min(32))?;
            let tx = pool.tx.clone();
            rings.bulk = Some(pool);
            Some((Handoff::Pool(tx), min))
        }
    };
    for qid in 0..cpus {
        for t in 0..cfg.threads_per_queue.max(1) {
            let ring = Ring::new(dev_fd, qid as u16, payload_size, depth);
            let ring = match ring {
                Ok(r) => Arc::new(r),
                Err(err) => {
                    rings.stop();
                    return Err(err);
                }
            };
            let name = format!("fuse-ring-{qid}.{t}");
            let se = Arc::new(make_loop(name.clone()));
            loops.push((ring.clone(), se.clone()));
            let (r, b) = (ring.clone(), bulk.clone());
            let spawned = std::thread::Builder::new()
                .name(name)
                .spawn(move || serve(r, se, prio, b));
            match spawned {
                Ok(h) => rings.threads.push(h),
                Err(err) => {
                    rings.stop();
                    return Err(err);
                }
            }
            rings.rings.push(ring);
        }
    }
    if let Some(b) = &bulk {
        match crate::uring_rescue::Rescuer::start(loops, b.clone()) {
            Ok(r) => rings.rescuer = Some(r),
            Err(err) => {
                rings.stop();
                return Err(err);
            }
        }
    }
    if prio == crate::uring_sched::RingPriority::Idle {
        let scheds = rings
            .rings
            .iter()
            .map(|r| r.clone() as Arc<dyn crate::uring_sched::HasSched>);
        rings.monitor = Some(crate::uring_sched::Monitor::start(scheds.collect())?);
    }
    info!(
        "FUSE over io_uring: {cpus} queues x {} threads x {} entries, ring priority {prio:?}",
        cfg.threads_per_queue, depth
    );
    Ok(rings)
}

impl crate::uring_sched::HasSched for Ring {
    fn sched(&self) -> &crate::uring_sched::ThreadSched {
        &self.sched
    }
}

/// Where a ring thread sends large reads, and from what size.
/// Where ring threads hand requests off, and from what READ/WRITE size.
pub(crate) type Bulk = Option<(Handoff, u32)>;

#[derive(Debug, Clone)]
pub(crate) enum Handoff {
    Pool(std::sync::mpsc::Sender<Job>),
    Executor(Arc<dyn Executor>),
}

impl Handoff {
    /// False when the workers are gone.
    fn hand(&self, job: Job) -> bool {
        match self {
            Handoff::Pool(tx) => tx.send(job).is_ok(),
            Handoff::Executor(e) => {
                e.execute(job);
                true
            }
        }
    }
}

fn serve<FS: Filesystem>(
    ring: Arc<Ring>,
    se: Arc<SessionEventLoop<FS>>,
    prio: crate::uring_sched::RingPriority,
    bulk: Bulk,
) {
    let _ = ring.owner.set(std::thread::current().id());
    pin_to_cpu(ring.qid as usize);
    ring.sched.enter(prio);

    let setup = (0..ring.entries.len())
        .try_for_each(|i| ring.register(i))
        .and_then(|()| ring.arm_stop());
    if let Err(err) = setup {
        error!("fuse ring {}: setup failed: {err}", ring.qid);
        return;
    }
    if let Err(err) = ring_loop(&ring, &se, &bulk) {
        error!("fuse ring {}: {err}", ring.qid);
    }
}

fn ring_loop<FS: Filesystem>(
    ring: &Arc<Ring>,
    se: &Arc<SessionEventLoop<FS>>,
    bulk: &Bulk,
) -> io::Result<()> {
    loop {
        match ring.io.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
            Err(e) => return Err(e),
        }
        ring.reap();
        // Never at idle priority (uring_sched.rs): requests take locks
        // other threads wait for (the entry's, the ring's, the workers'
        // queue, the filesystem's). Their replies are submitted in this
        // thread's next wait.
        if !ring.sched.serve(|| handle_pending(ring, se, bulk))? {
            return Ok(());
        }
    }
}

/// Handles the completions read, one at a time (the rescuer may take
/// those behind one that blocks); false when the ring is done.
fn handle_pending<FS: Filesystem>(
    ring: &Arc<Ring>,
    se: &Arc<SessionEventLoop<FS>>,
    bulk: &Bulk,
) -> io::Result<bool> {
    while let Some((ud, res)) = ring.next_pending() {
        match ud {
            STOP => return Ok(false),
            WAKE => continue,
            _ => {}
        }
        let idx = ud as usize;
        match -res {
            0 => serve_request(ring, idx, se, bulk, false)?,
            libc::EAGAIN | libc::EINTR => ring.register(idx)?,
            libc::ENOTCONN | libc::ENODEV | libc::ECANCELED => return Ok(false),
            libc::EOPNOTSUPP => {
                warn!("fuse ring: the kernel refused io_uring; using /dev/fuse");
                return Ok(false);
            }
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    }
    Ok(true)
}

/// Hands the requests read but not yet handled to workers, while the
/// ring thread is stuck in one (`uring_rescue.rs`); returns how many. A
/// stop, or an error the ring thread must see, is left for it.
pub(crate) fn rescue_pending<FS: Filesystem>(
    ring: &Arc<Ring>,
    se: &Arc<SessionEventLoop<FS>>,
    bulk: &Bulk,
) -> io::Result<usize> {
    ring.reap();
    let mut handed = 0;
    while let Some((ud, res)) = ring.next_pending() {
        match (ud, -res) {
            (WAKE, _) => {}
            (_, 0) if ud != STOP => {
                serve_request(ring, ud as usize, se, bulk, true)?;
                handed += 1;
            }
            (_, libc::EAGAIN | libc::EINTR) if ud != STOP => {
                ring.register(ud as usize)?;
                ring.io.submit()?;
            }
            // A stop, or an error that ends the ring: its thread's.
            _ => {
                ring.give_back((ud, res))?;
                break;
            }
        }
    }
    Ok(handed)
}

/// Rebuilds the request the kernel put in entry `idx` and dispatches it,
/// here or (large reads and writes, requests that may block, and with
/// `to_workers` every one) on a worker.
fn serve_request<FS: Filesystem>(
    ring: &Arc<Ring>,
    idx: usize,
    se: &Arc<SessionEventLoop<FS>>,
    bulk: &Bulk,
    to_workers: bool,
) -> io::Result<()> {
    let e = &ring.entries[idx];
    // SAFETY: the kernel completed the command: the buffers are ours to read.
    let hdr = unsafe { &*e.header };
    let len = u32::from_ne_bytes(hdr.in_out[0..4].try_into().unwrap()) as usize;
    let opcode = u32::from_ne_bytes(hdr.in_out[4..8].try_into().unwrap());
    let unique = u64::from_ne_bytes(hdr.in_out[8..16].try_into().unwrap());
    let payload_sz = hdr.ent.payload_sz as usize;
    let (payload, cap) = e.payload.kernel_part();
    e.state.lock().commit_id = hdr.ent.commit_id;
    let op_size = len.checked_sub(IN_HEADER + payload_sz);
    let Some(op_size) = op_size.filter(|&n| n <= OP_IN && payload_sz <= cap) else {
        error!("fuse ring: malformed request (len {len}, payload {payload_sz})");
        return ring.send(idx, &[IoSlice::new(&error_header(unique, libc::EIO))]);
    };
    let start = PREFIX - op_size - IN_HEADER;
    // SAFETY: start..PREFIX lies in the prefix area, which only the entry's
    // current owner writes; the header is ours until we commit.
    let bytes = unsafe {
        let base = e.payload.ptr;
        std::ptr::copy_nonoverlapping(hdr.in_out.as_ptr(), base.add(start), IN_HEADER);
        std::ptr::copy_nonoverlapping(hdr.op_in.as_ptr(), base.add(start + IN_HEADER), op_size);
        debug_assert_eq!(base.add(PREFIX), payload);
        RequestBytes(base.add(start), len, payload_sz > 0)
    };
    // fuse_read_in.size and fuse_write_in.size: the u32 at byte 16.
    let size = u32::from_ne_bytes(hdr.op_in[16..20].try_into().unwrap());
    let to_worker = |min: u32| match opcode {
        _ if to_workers => true,
        OP_READ | OP_WRITE => size >= min,
        OP_FSYNC | OP_FSYNCDIR => !se
            .filesystem
            .fs
            .as_ref()
            .is_some_and(|f| f.fsync_is_quick()),
        OP_SETLKW => true,
        _ => false,
    };
    if let Some((tx, _)) = bulk.as_ref().filter(|(_, min)| to_worker(*min)) {
        let (r, s) = (ring.clone(), se.clone());
        let job: Job = Box::new(move || {
            if let Err(err) = dispatch(&r, idx, &s, bytes) {
                error!("fuse ring {}: {err}", r.qid);
            }
        });
        if tx.hand(job) {
            return Ok(());
        }
        error!("fuse ring {}: bulk workers gone", ring.qid);
        return ring.send(idx, &[IoSlice::new(&error_header(unique, libc::EIO))]);
    }
    ring.busy_since
        .store(crate::uring_rescue::now_ms(), Ordering::Relaxed);
    let r = dispatch(ring, idx, se, bytes);
    ring.busy_since.store(0, Ordering::Relaxed);
    r
}

/// Parses and dispatches a rebuilt request, then commits a staged reply.
fn dispatch<FS: Filesystem>(
    ring: &Arc<Ring>,
    idx: usize,
    se: &SessionEventLoop<FS>,
    bytes: RequestBytes,
) -> io::Result<()> {
    // SAFETY: see RequestBytes; we are the entry's owner until the commit.
    let data = unsafe { std::slice::from_raw_parts(bytes.0, bytes.1) };
    let sender = ReplySender::Uring(UringSender {
        ring: ring.clone(),
        idx,
        dev: se.ch.sender(),
    });
    let unique = u64::from_ne_bytes(data[8..16].try_into().unwrap());
    let Some(req) = RequestWithSender::new(sender, data) else {
        return ring.send(idx, &[IoSlice::new(&error_header(unique, libc::EIO))]);
    };
    {
        let mut st = ring.entries[idx].state.lock();
        st.payload_borrowed = bytes.2;
        st.staged = None;
    }
    req.dispatch(se);
    drop(req);
    ring.finish_dispatch(idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_back(e: &Entry) -> (Vec<u8>, Vec<u8>) {
        // SAFETY: test-only reads of buffers no one else uses.
        unsafe {
            let n = (*e.header).ent.payload_sz as usize;
            let (p, _) = e.payload.kernel_part();
            (
                (&(*e.header).in_out)[..OUT_HEADER].to_vec(),
                std::slice::from_raw_parts(p, n).to_vec(),
            )
        }
    }

    #[test]
    fn reply_splits_into_header_and_payload_across_slices() {
        let e = Entry::new(64);
        let bytes: Vec<u8> = (0..40u8).collect();
        // The out header straddles the first two slices.
        let parts = [
            IoSlice::new(&bytes[..10]),
            IoSlice::new(&bytes[10..25]),
            IoSlice::new(&bytes[25..]),
        ];
        // SAFETY: no kernel and no borrow involved.
        unsafe { e.write_reply(&parts).unwrap() };
        let (h, p) = read_back(&e);
        assert_eq!(h, bytes[..16]);
        assert_eq!(p, bytes[16..]);
    }

    #[test]
    fn reply_larger_than_the_buffer_is_refused() {
        let e = Entry::new(8);
        let big = vec![1u8; OUT_HEADER + 9];
        // SAFETY: as above.
        assert!(unsafe { e.write_reply(&[IoSlice::new(&big)]) }.is_err());
        let short = [0u8; 4];
        assert!(unsafe { e.write_reply(&[IoSlice::new(&short)]) }.is_err());
    }

    #[test]
    fn cpu_lists_and_ring_depth() {
        assert_eq!(last_cpu_in_list("0-1\n"), Some(1));
        assert_eq!(last_cpu_in_list("0-3,8-11"), Some(11));
        assert_eq!(last_cpu_in_list("0"), Some(0));
        assert_eq!(last_cpu_in_list(""), None);
        let cfg = UringConfig::default();
        assert_eq!(entries_per_thread(&cfg, 2), 4);
        assert_eq!(entries_per_thread(&cfg, 16), 2);
        assert_eq!(entries_per_thread(&cfg, 256), 1);
    }

    /// True if `fill_reply` took `f` (wrote a reply for request 9).
    fn fills(
        e: &Entry,
        borrowed: bool,
        max: usize,
        f: impl FnOnce(&mut [u8]) -> Result<usize, Errno>,
    ) -> bool {
        let st = EntryState {
            payload_borrowed: borrowed,
            ..Default::default()
        };
        // SAFETY: no kernel involved; `st` stands for the locked state.
        unsafe { e.fill_reply(&st, 9, max, f) }.is_ok()
    }

    #[test]
    fn filled_reply_is_written_in_place_or_handed_back() {
        let e = Entry::new(64);
        let hello = |b: &mut [u8]| {
            b[..5].copy_from_slice(b"hello");
            Ok(5)
        };
        assert!(fills(&e, false, 64, hello));
        assert_eq!(
            read_back(&e),
            (out_header(9, 0, 5).to_vec(), b"hello".to_vec())
        );
        assert!(fills(&e, false, 64, |_| Err(Errno::ENOENT)));
        assert_eq!(
            read_back(&e),
            (error_header(9, libc::ENOENT).to_vec(), vec![])
        );
        // Too large for the buffer, or the payload is the request's: handed back.
        assert!(!fills(&e, false, 65, hello));
        assert!(!fills(&e, true, 8, hello));
    }

    #[test]
    fn error_header_is_a_negative_errno() {
        let h = error_header(77, libc::EIO);
        assert_eq!(i32::from_ne_bytes(h[4..8].try_into().unwrap()), -libc::EIO);
        assert_eq!(u64::from_ne_bytes(h[8..16].try_into().unwrap()), 77);
    }
}
