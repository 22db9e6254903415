//! Draining a session without unmounting (added by Cairn): once `drain`
//! is called, each /dev/fuse reader returns after the request it serves
//! next, without reading another, so every request the kernel queues after
//! that stays queued for whoever reads the connection next (a daemon that
//! takes the descriptor over). Readers block in `read` as usual (one wakes
//! per request, no cost per request); a reader waiting there leaves once
//! some request reaches it, so the caller sends harmless requests of its
//! own until `active` is zero.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

#[derive(Debug, Default)]
struct Inner {
    draining: AtomicBool,
    active: AtomicUsize,
}

/// Stops a session's readers between requests (see the module comment).
#[derive(Debug, Clone, Default)]
pub struct Drain(Arc<Inner>);

impl PartialEq for Drain {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Drain {}

/// Counts a reader while it runs.
pub(crate) struct Reader(Drain);

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drain {
    /// A drain not yet asked for.
    pub fn new() -> Drain {
        Drain::default()
    }

    /// Asks every reader to stop after the request it serves next.
    pub fn drain(&self) {
        self.0.draining.store(true, Ordering::SeqCst);
    }

    /// Whether `drain` was called.
    pub fn is_draining(&self) -> bool {
        self.0.draining.load(Ordering::SeqCst)
    }

    /// Readers still reading.
    pub fn active(&self) -> usize {
        self.0.active.load(Ordering::SeqCst)
    }

    pub(crate) fn reader(&self) -> Reader {
        self.0.active.fetch_add(1, Ordering::SeqCst);
        Reader(self.clone())
    }
}
