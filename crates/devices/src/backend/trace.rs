//! The recorder for crash simulation: `TraceBackend` passes every call to
//! the backend it wraps (the real file) and appends what changed the file
//! to its `Recorder`: writes with their bytes, syncs, length changes and
//! punched holes, in one global order for all files of a pool.
//! `crash.rs` turns a prefix of that trace into the files as a power loss
//! at that point could have left them.
//!
//! An event is recorded once its call returned successfully, so the order
//! is the order of completion. A write that completed while a sync of its
//! file was in flight is recorded before the sync and counts as covered by
//! it: the trace may count slightly more as durable than the disk
//! promised, never less. Files are named relative to the recorder's root
//! (the pool directory) when they lie under it, else by their canonical
//! absolute path.

use super::{path_key, Backend, HostStorage, OpenHow, Storage};
use parking_lot::Mutex;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One change to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Write {
        file: Arc<Path>,
        off: u64,
        data: Vec<u8>,
    },
    /// fdatasync: every earlier change of the file is durable.
    Sync {
        file: Arc<Path>,
    },
    SetLen {
        file: Arc<Path>,
        len: u64,
    },
    /// Reads as zeros afterwards; the length stays.
    Punch {
        file: Arc<Path>,
        off: u64,
        len: u64,
    },
}

impl Event {
    pub fn file(&self) -> &Path {
        match self {
            Event::Write { file, .. }
            | Event::Sync { file }
            | Event::SetLen { file, .. }
            | Event::Punch { file, .. } => file,
        }
    }

    pub fn write(file: impl AsRef<Path>, off: u64, data: &[u8]) -> Event {
        Event::Write {
            file: file.as_ref().into(),
            off,
            data: data.to_vec(),
        }
    }

    pub fn sync(file: impl AsRef<Path>) -> Event {
        Event::Sync {
            file: file.as_ref().into(),
        }
    }

    pub fn set_len(file: impl AsRef<Path>, len: u64) -> Event {
        Event::SetLen {
            file: file.as_ref().into(),
            len,
        }
    }

    pub fn punch(file: impl AsRef<Path>, off: u64, len: u64) -> Event {
        Event::Punch {
            file: file.as_ref().into(),
            off,
            len,
        }
    }
}

/// The trace shared by every `TraceBackend` a `TraceStorage` opened.
#[derive(Debug)]
pub struct Recorder {
    root: PathBuf,
    events: Mutex<Vec<Event>>,
    /// Interned file names, so events share them.
    names: Mutex<std::collections::HashMap<PathBuf, Arc<Path>>>,
}

impl Recorder {
    /// A recorder naming files relative to `root` (canonicalized; it must
    /// exist), typically the pool directory.
    pub fn new(root: &Path) -> io::Result<Arc<Recorder>> {
        Ok(Arc::new(Recorder {
            root: root.canonicalize()?,
            events: Mutex::new(Vec::new()),
            names: Mutex::default(),
        }))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The name events use for `path`: relative to the root when under
    /// it, else canonical and absolute.
    pub fn name(&self, path: &Path) -> Arc<Path> {
        let key = path_key(path);
        let key = key.strip_prefix(&self.root).unwrap_or(&key);
        let mut names = self.names.lock();
        if let Some(n) = names.get(key) {
            return n.clone();
        }
        let n: Arc<Path> = key.into();
        names.insert(key.to_path_buf(), n.clone());
        n
    }

    /// Events recorded so far (a crash point counts them).
    pub fn len(&self) -> usize {
        self.events.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the trace.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }

    /// Runs `f` on the trace without copying it (recording waits).
    pub fn with_events<R>(&self, f: impl FnOnce(&[Event]) -> R) -> R {
        f(&self.events.lock())
    }

    /// Empties the trace and returns it.
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut self.events.lock())
    }

    pub fn record(&self, e: Event) {
        self.events.lock().push(e);
    }
}

/// A backend that records every change it passes on.
#[derive(Debug)]
pub struct TraceBackend {
    inner: Arc<dyn Backend>,
    file: Arc<Path>,
    rec: Arc<Recorder>,
}

impl TraceBackend {
    pub fn new(inner: Arc<dyn Backend>, path: &Path, rec: Arc<Recorder>) -> Self {
        TraceBackend {
            inner,
            file: rec.name(path),
            rec,
        }
    }

    fn wrote(&self, buf: &[u8], off: u64) {
        self.rec.record(Event::Write {
            file: self.file.clone(),
            off,
            data: buf.to_vec(),
        });
    }
}

impl Backend for TraceBackend {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.inner.read_at(buf, off)
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], off: u64) -> io::Result<()> {
        self.inner.read_vectored_at(bufs, off)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.inner.write_at(buf, off)?;
        self.wrote(buf, off);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()?;
        self.rec.record(Event::Sync {
            file: self.file.clone(),
        });
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)?;
        self.rec.record(Event::SetLen {
            file: self.file.clone(),
            len,
        });
        Ok(())
    }

    fn punch_hole(&self, off: u64, len: u64) -> io::Result<()> {
        self.inner.punch_hole(off, len)?;
        self.rec.record(Event::Punch {
            file: self.file.clone(),
            off,
            len,
        });
        Ok(())
    }

    fn read_direct_at(&self, buf: &mut [u8], off: u64, need: usize) -> io::Result<bool> {
        self.inner.read_direct_at(buf, off, need)
    }

    fn write_direct_at(&self, buf: &[u8], off: u64) -> io::Result<bool> {
        let done = self.inner.write_direct_at(buf, off)?;
        if done {
            self.wrote(buf, off);
        }
        Ok(done)
    }

    fn start_writeback(&self, off: u64, len: u64) {
        self.inner.start_writeback(off, len)
    }

    fn will_need(&self, off: u64, len: u64) {
        self.inner.will_need(off, len)
    }

    fn drop_cached(&self, off: u64, len: u64) {
        self.inner.drop_cached(off, len)
    }

    fn host_file(&self) -> Option<&File> {
        self.inner.host_file()
    }

    fn object_tier(&self) -> Option<&dyn super::ObjectTier> {
        self.inner.object_tier()
    }
}

/// Opens files through `inner` (the host by default) wrapped in trace
/// backends recording into one recorder. Opening with `truncate` records
/// a `SetLen` to 0.
#[derive(Debug)]
pub struct TraceStorage {
    inner: Arc<dyn Storage>,
    rec: Arc<Recorder>,
}

impl TraceStorage {
    /// Host files, recorded into `rec`.
    pub fn new(rec: Arc<Recorder>) -> Self {
        Self::over(Arc::new(HostStorage), rec)
    }

    /// Files of another storage (a fault storage, say), recorded.
    pub fn over(inner: Arc<dyn Storage>, rec: Arc<Recorder>) -> Self {
        TraceStorage { inner, rec }
    }

    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.rec
    }
}

impl Storage for TraceStorage {
    fn open(&self, path: &Path, how: &OpenHow) -> io::Result<Arc<dyn Backend>> {
        let inner = self.inner.open(path, how)?;
        let b = TraceBackend::new(inner, path, self.rec.clone());
        if how.truncate {
            self.rec.record(Event::SetLen {
                file: b.file.clone(),
                len: 0,
            });
        }
        Ok(Arc::new(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_changes_in_order_under_root_relative_names() {
        let d = tempfile::tempdir().unwrap();
        let rec = Recorder::new(d.path()).unwrap();
        let st = TraceStorage::new(rec.clone());
        let a = st.open(&d.path().join("a"), &OpenHow::CREATE).unwrap();
        let b = st.open(&d.path().join("b"), &OpenHow::REPLACE).unwrap();
        a.write_at(b"xy", 4).unwrap();
        let mut r = [0u8; 2];
        a.read_at(&mut r, 4).unwrap();
        b.set_len(10).unwrap();
        a.sync_data().unwrap();
        b.punch_hole(0, 4096).unwrap();
        assert_eq!(
            rec.events(),
            vec![
                Event::set_len("b", 0),
                Event::write("a", 4, b"xy"),
                Event::set_len("b", 10),
                Event::sync("a"),
                Event::punch("b", 0, 4096),
            ]
        );
        assert_eq!(std::fs::read(d.path().join("a")).unwrap(), b"\0\0\0\0xy");
    }
}
