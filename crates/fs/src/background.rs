//! Background threads (the flusher, GC, the tier mover) run at a lower CPU
//! priority than the threads that serve requests. On a machine with few
//! cores, a flush that hashes and writes a large flush group on every core
//! would otherwise take the CPU from requests for as long as it runs (4 KiB
//! volume I/O at 32,000 ops/s on 2 cores: requests waited 10 to 25 ms while
//! a flush wrote its data). Threads a background thread starts (a flush's
//! hashing threads) inherit its priority; a writer that flushes itself
//! (throttled, `sync`) keeps its own.
//!
//! A request that must wait for background work (the flush lock, which a
//! commit holds) boosts every background thread back to the daemon's own
//! priority until that thread's next round, so a commit slowed by busy
//! request threads does not hold up an fsync or a throttled writer for
//! longer than it would at full priority.

use parking_lot::Mutex;
use std::cell::Cell;

thread_local! {
    /// Whether the calling thread is a registered background thread.
    static BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

/// The background threads of one pool and the priorities they move between.
pub(crate) struct Background {
    /// How much lower than `base` they run (`background_nice`).
    nice: i32,
    /// The daemon's own nice value, read when the pool was opened.
    base: i32,
    /// Thread ids of the registered threads (each removes its own before it
    /// ends, so no id here can belong to another thread).
    threads: Mutex<Vec<libc::pid_t>>,
}

/// A registered background thread; unregisters it when dropped.
pub(crate) struct Registered<'a> {
    bg: &'a Background,
    tid: libc::pid_t,
    what: &'static str,
}

impl Background {
    /// For a pool opened by the calling thread, whose priority is taken as
    /// the daemon's.
    pub(crate) fn new(nice: u32) -> Background {
        // SAFETY: plain integers; on Linux `who` 0 is the calling thread.
        let base = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        Background {
            nice: nice.min(19) as i32,
            base,
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Registers the calling thread as a background thread for as long as
    /// the guard lives, and lowers its priority.
    pub(crate) fn enter(&self, what: &'static str) -> Registered<'_> {
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        self.threads.lock().push(tid);
        BACKGROUND.with(|b| b.set(true));
        let r = Registered {
            bg: self,
            tid,
            what,
        };
        if let Err(e) = r.set(self.low()) {
            tracing::warn!("{what}: could not lower its CPU priority: {e}");
        }
        r
    }

    fn low(&self) -> i32 {
        (self.base + self.nice).min(19)
    }

    /// The calling thread is about to wait for work a background thread may
    /// be doing: every background thread runs at the daemon's priority until
    /// its next round. Raising a priority needs root (or RLIMIT_NICE);
    /// without that right nothing changes. Not done from a background
    /// thread (it would undo the lowering for no request).
    pub(crate) fn boost(&self) {
        if self.nice == 0 || BACKGROUND.with(|b| b.get()) {
            return;
        }
        for &tid in self.threads.lock().iter() {
            // SAFETY: plain integers; `tid` is a live thread of this process
            // (the lock keeps it registered).
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, self.base) };
        }
    }
}

impl Registered<'_> {
    /// Back to the background priority: called at the start of each round,
    /// after a boost.
    pub(crate) fn lower(&self) {
        if let Err(e) = self.set(self.bg.low()) {
            tracing::debug!("{}: could not lower its CPU priority: {e}", self.what);
        }
    }

    fn set(&self, nice: i32) -> std::io::Result<()> {
        if self.bg.nice == 0 {
            return Ok(());
        }
        // SAFETY: plain integers; `tid` is the calling thread.
        match unsafe { libc::setpriority(libc::PRIO_PROCESS, self.tid as libc::id_t, nice) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.bg.threads.lock().retain(|&t| t != self.tid);
        BACKGROUND.with(|b| b.set(false));
    }
}

#[cfg(test)]
mod tests {
    use super::Background;
    use std::sync::mpsc;

    fn nice_of(tid: libc::pid_t) -> i32 {
        // SAFETY: plain integers.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) }
    }

    #[test]
    fn a_boost_restores_the_daemon_priority_until_the_next_round() {
        let bg = Background::new(7);
        let base = bg.base;
        std::thread::scope(|s| {
            // Made in here, so that a failed assertion drops them and the
            // thread's `recv` ends instead of waiting forever.
            let (to_main, from_thread) = mpsc::channel();
            let (to_thread, from_main) = mpsc::channel::<()>();
            let bg = &bg;
            s.spawn(move || {
                let r = bg.enter("test");
                // SAFETY: no arguments.
                to_main.send(unsafe { libc::gettid() }).unwrap();
                let _ = from_main.recv();
                r.lower();
                let _ = to_main.send(0);
                let _ = from_main.recv();
            });
            let tid = from_thread.recv().unwrap();
            assert_eq!(nice_of(tid), (base + 7).min(19), "lowered when entered");
            bg.boost();
            // SAFETY: no arguments.
            let root = unsafe { libc::geteuid() } == 0;
            let want = if root { base } else { (base + 7).min(19) };
            assert_eq!(nice_of(tid), want, "after a boost (root: {root})");
            to_thread.send(()).unwrap();
            from_thread.recv().unwrap();
            assert_eq!(nice_of(tid), (base + 7).min(19), "lowered again");
            to_thread.send(()).unwrap();
        });
        assert!(bg.threads.lock().is_empty(), "unregistered at its end");
    }
}
