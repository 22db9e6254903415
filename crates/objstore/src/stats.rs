//! Request counters of one client: what the store bills (requests by kind,
//! bytes each way), errors, timeouts, and whether it answered last time.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Live counters (relaxed atomics).
#[derive(Debug)]
pub struct ClientStats {
    pub gets: AtomicU64,
    pub puts: AtomicU64,
    pub heads: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub errors: AtomicU64,
    pub timeouts: AtomicU64,
    reachable: AtomicBool,
}

impl Default for ClientStats {
    fn default() -> Self {
        ClientStats {
            gets: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            heads: AtomicU64::new(0),
            lists: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            reachable: AtomicBool::new(true),
        }
    }
}

/// A copy of the counters, for reports (`cairn info`, `tier status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// "ok" or "unreachable" (the last request failed to get an answer).
    pub state: String,
    pub gets: u64,
    pub puts: u64,
    pub heads: u64,
    pub lists: u64,
    pub deletes: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub errors: u64,
    pub timeouts: u64,
}

impl ClientStats {
    pub fn reachable(&self) -> bool {
        self.reachable.load(Relaxed)
    }

    /// Records whether the store answered (any answer, even "not found").
    pub fn set_reachable(&self, yes: bool) {
        let was = self.reachable.swap(yes, Relaxed);
        if was != yes {
            match yes {
                true => tracing::info!("object store reachable again"),
                false => tracing::warn!("object store unreachable"),
            }
        }
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            state: if self.reachable() {
                "ok"
            } else {
                "unreachable"
            }
            .into(),
            gets: self.gets.load(Relaxed),
            puts: self.puts.load(Relaxed),
            heads: self.heads.load(Relaxed),
            lists: self.lists.load(Relaxed),
            deletes: self.deletes.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            errors: self.errors.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
        }
    }
}
