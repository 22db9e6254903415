//! Background threads (the flusher, GC, the tier mover) run at a lower CPU
//! priority than the threads that serve requests. On a machine with few
//! cores, a flush that hashes and writes a large flush group on every core
//! would otherwise take the CPU from requests for as long as it runs (4 KiB
//! volume I/O at 32,000 ops/s on 2 cores: requests waited 10 to 25 ms while
//! a flush wrote its data). Threads a background thread starts (a flush's
//! hashing threads) inherit its priority; a writer that flushes itself
//! (throttled, `sync`) keeps its own.

/// Lowers the calling thread's priority to `nice` (0 to 19) above the
/// process's (the calling thread's current one); a failure is only logged.
pub(crate) fn lower_priority(what: &str, nice: u32) {
    if nice == 0 {
        return;
    }
    // SAFETY: getpriority/setpriority/gettid take plain integers; on Linux
    // PRIO_PROCESS with a thread id applies to that thread alone.
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        let base = libc::getpriority(libc::PRIO_PROCESS, 0);
        let to = (base + nice as i32).min(19);
        if libc::setpriority(libc::PRIO_PROCESS, tid, to) != 0 {
            let e = std::io::Error::last_os_error();
            tracing::warn!("{what}: could not lower its CPU priority: {e}");
        }
    }
}
