//! The daemon's log: POOL/cairn.log through a writer that never fails. A
//! write the host filesystem refuses (full, I/O error) is dropped and
//! counted instead of reaching tracing, whose fmt layer would print to
//! stderr (the same full file) and abort the daemon. Once writes succeed
//! again, one line says how many were lost; `cairn info --json` on a
//! mounted pool reports the count (`log_lines_dropped`).

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tracing_subscriber::fmt::MakeWriter;

/// Log lines dropped since the daemon started.
static DROPPED: AtomicU64 = AtomicU64::new(0);

pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// A log file shared by every event; see the module comment.
#[derive(Clone)]
pub struct SafeLog {
    file: Arc<Mutex<File>>,
    /// Lines dropped since the last one that was written.
    pending: Arc<AtomicU64>,
}

impl SafeLog {
    pub fn new(file: File) -> SafeLog {
        SafeLog {
            file: Arc::new(Mutex::new(file)),
            pending: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Writes one event; a failure is counted, never returned.
    fn put(&self, buf: &[u8]) {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let lost = self.pending.load(Ordering::Relaxed);
        if lost > 0 {
            let note =
                format!("(cairn: {lost} log line(s) dropped: the log could not be written)\n");
            if f.write_all(note.as_bytes()).is_err() {
                return self.drop_one();
            }
            self.pending.store(0, Ordering::Relaxed);
        }
        if f.write_all(buf).is_err() {
            self.drop_one();
        }
    }

    fn drop_one(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// One event's writer: buffers the formatted event, writes it on drop.
pub struct EventWriter {
    log: SafeLog,
    buf: Vec<u8>,
}

impl Write for EventWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.log.put(&self.buf);
        }
    }
}

impl<'a> MakeWriter<'a> for SafeLog {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter {
            log: self.clone(),
            buf: Vec::with_capacity(256),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_device_drops_and_counts() {
        let Ok(f) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            return;
        };
        let log = SafeLog::new(f);
        let before = dropped();
        for _ in 0..3 {
            let mut w = log.make_writer();
            assert_eq!(w.write(b"hello\n").unwrap(), 6);
        }
        assert_eq!(dropped() - before, 3);
        assert_eq!(log.pending.load(Ordering::Relaxed), 3);
    }
}
