//! Server counters: connections, and per command the requests, bytes
//! moved and errors returned; a serialisable snapshot with the worker
//! pool's statistics.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const NAMES: [&str; 9] = [
    "read",
    "write",
    "disc",
    "flush",
    "trim",
    "cache",
    "write_zeroes",
    "block_status",
    "unknown",
];

/// Live counters, shared by the connections and the pool's jobs.
#[derive(Default)]
pub(crate) struct Counters {
    pub connections: AtomicU64,
    pub open: AtomicU64,
    pub handshake_failures: AtomicU64,
    /// Requests run on their connection's reader thread (`conn.rs`).
    pub inline: AtomicU64,
    cmds: [[AtomicU64; 3]; 9],
}

impl Counters {
    fn index(kind: u16) -> usize {
        (kind as usize).min(NAMES.len() - 1)
    }

    /// One request of `kind`, `bytes` moved, failed with `error` (0: ok).
    pub fn note(&self, kind: u16, bytes: u64, error: u32) {
        let c = &self.cmds[Self::index(kind)];
        c[0].fetch_add(1, Relaxed);
        if error == 0 {
            c[1].fetch_add(bytes, Relaxed);
        } else {
            c[2].fetch_add(1, Relaxed);
        }
    }

    pub fn snapshot(&self, pool: cairn_workpool::Stats) -> Stats {
        let commands = NAMES.iter().zip(&self.cmds).map(|(n, c)| {
            let s = CommandStats {
                count: c[0].load(Relaxed),
                bytes: c[1].load(Relaxed),
                errors: c[2].load(Relaxed),
            };
            (n.to_string(), s)
        });
        Stats {
            connections_total: self.connections.load(Relaxed),
            connections_open: self.open.load(Relaxed),
            handshake_failures: self.handshake_failures.load(Relaxed),
            inline: self.inline.load(Relaxed),
            budget: 0,
            bytes_in_flight: 0,
            bytes_in_flight_peak: 0,
            commands: commands.collect(),
            pool,
        }
    }
}

/// Counts of one command.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CommandStats {
    pub count: u64,
    /// Bytes read, written, trimmed, zeroed or described (successes).
    pub bytes: u64,
    pub errors: u64,
}

/// A server's statistics.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stats {
    pub connections_total: u64,
    pub connections_open: u64,
    /// Connections that ended before reaching transmission (aborts too).
    pub handshake_failures: u64,
    /// Requests run on their connection's reader thread, not handed to
    /// the pool: short ones that came alone.
    pub inline: u64,
    /// The server's budget of READ and WRITE payload bytes in flight,
    /// across all connections.
    pub budget: u64,
    /// Payload bytes in flight now (taken from the budget).
    pub bytes_in_flight: u64,
    /// The most ever in flight at once (never above `budget`).
    pub bytes_in_flight_peak: u64,
    /// By command name: read, write, disc, flush, trim, cache,
    /// write_zeroes, block_status, unknown.
    pub commands: BTreeMap<String, CommandStats>,
    pub pool: cairn_workpool::Stats,
}

impl Stats {
    pub fn command(&self, name: &str) -> CommandStats {
        self.commands.get(name).cloned().unwrap_or_default()
    }
}

/// The name of a command, for logs.
pub(crate) fn command_name(kind: u16) -> &'static str {
    NAMES[Counters::index(kind)]
}
