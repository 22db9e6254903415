//! The `s3` tier device's backend: a device's bytes as objects in a
//! bucket (docs/FORMAT.md, "S3 tier devices"). The header area (offsets
//! below the data offset) is the object `PREFIX/cairn-header`; segment
//! slot `n` is the object `PREFIX/cairn-slot-<n, 16 hex digits>`, holding
//! the slot's bytes from its start to the last byte written. Writes are
//! staged in RAM per object; `sync_data` uploads each staged object whole
//! in one PUT and checks it with a HEAD (size, entity tag, MD5), so an
//! object is whole before anyone can point at it. Reads are ranged GETs
//! (one per read call and object). Punching a whole slot drops it: its
//! object is deleted by a background thread (which also probes a store
//! that stopped answering), and an upload to the slot first cancels or
//! waits for that delete, so a late delete never removes newer bytes.
//! While the store does not answer, reads fail at once (EIO) and the
//! background thread probes it every second until it answers again.

use super::s3_readahead::{ReadAhead, Served};
use super::Backend;
use bytes::Bytes;
use cairn_objstore::{ObjError, ObjectClient, StatsSnapshot};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Name of the header object under the prefix.
pub const HEADER_OBJECT: &str = "cairn-header";
/// Slot objects are this followed by the slot number in 16 hex digits.
pub const SLOT_OBJECT: &str = "cairn-slot-";
/// Background read-ahead fetches (`will_need`) at once.
const PREFETCHES: usize = 4;

/// The object behind a byte range of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Header,
    Slot(u64),
}

/// What an object-store device offers beyond positional I/O: its
/// counters, its state, and the slot objects it holds (for GC).
pub trait ObjectTier: Send + Sync + std::fmt::Debug {
    fn stats(&self) -> StatsSnapshot;
    /// False when the last request got no answer.
    fn reachable(&self) -> bool;
    /// The slots that have an object in the store (one LIST).
    fn list_slots(&self) -> io::Result<Vec<u64>>;
    /// Deletes a slot's object in the background.
    fn queue_delete(&self, slot: u64);
    /// Deletes queued and not yet done.
    fn pending_deletes(&self) -> usize;
}

#[derive(Debug, Default)]
struct Deletes {
    pending: BTreeSet<u64>,
    busy: Option<u64>,
}

#[derive(Debug)]
struct Inner {
    client: ObjectClient,
    data_offset: u64,
    segment_size: u64,
    len: AtomicU64,
    staged: Mutex<BTreeMap<Part, Vec<u8>>>,
    ahead: ReadAhead,
    /// Background window fetches running (`will_need`), at most `PREFETCHES`.
    prefetching: AtomicUsize,
    dels: Mutex<Deletes>,
    dels_cv: Condvar,
    stop: AtomicBool,
}

/// A device in a bucket. See the module comment.
#[derive(Debug)]
pub struct S3Backend {
    inner: Arc<Inner>,
}

/// The slot an object name stands for, if it is a slot object.
pub fn slot_of(name: &str) -> Option<u64> {
    let hex = name.strip_prefix(SLOT_OBJECT)?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
}

impl S3Backend {
    /// A backend over `client` (no request is made yet) and its
    /// background deleter.
    pub fn new(client: ObjectClient, data_offset: u64, segment_size: u64) -> Arc<S3Backend> {
        let inner = Arc::new(Inner {
            client,
            data_offset,
            segment_size,
            len: AtomicU64::new(u64::MAX / 4),
            staged: Mutex::new(BTreeMap::new()),
            ahead: ReadAhead::default(),
            prefetching: AtomicUsize::new(0),
            dels: Mutex::new(Deletes::default()),
            dels_cv: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let bg = inner.clone();
        std::thread::Builder::new()
            .name("cairn-s3-gc".into())
            .spawn(move || bg.deleter())
            .expect("spawn s3 deleter");
        Arc::new(S3Backend { inner })
    }

    pub fn client(&self) -> &ObjectClient {
        &self.inner.client
    }

    /// True if the store holds a header object under this prefix.
    pub fn header_exists(&self) -> io::Result<bool> {
        let key = self.inner.key(Part::Header);
        Ok(self
            .inner
            .client
            .head(&key)
            .map_err(io::Error::from)?
            .is_some())
    }
}

impl Drop for S3Backend {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.dels_cv.notify_all();
    }
}

impl Inner {
    fn key(&self, p: Part) -> String {
        let loc = self.client.locator();
        match p {
            Part::Header => loc.key(HEADER_OBJECT),
            Part::Slot(s) => loc.key(&format!("{SLOT_OBJECT}{s:016x}")),
        }
    }

    /// The object and offset in it of device byte `off`, and how many
    /// bytes from there belong to the same object.
    fn locate(&self, off: u64) -> (Part, u64, u64) {
        if off < self.data_offset {
            return (Part::Header, off, self.data_offset - off);
        }
        let rel = off - self.data_offset;
        let (slot, within) = (rel / self.segment_size, rel % self.segment_size);
        (Part::Slot(slot), within, self.segment_size - within)
    }

    /// Calls `f(part, offset in part, range of buf)` for each object a
    /// byte range of `len` at `off` covers.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "min with a usize room; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn pieces(
        &self,
        off: u64,
        len: usize,
        mut f: impl FnMut(Part, u64, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut done = 0usize;
        while done < len {
            let (part, within, room) = self.locate(off + done as u64);
            let n = (room.min((len - done) as u64)) as usize;
            f(part, within, done..done + n)?;
            done += n;
        }
        Ok(())
    }

    /// Waits until no delete of `slot` is queued or running.
    fn settle_delete(&self, slot: u64) {
        let mut d = self.dels.lock();
        d.pending.remove(&slot);
        while d.busy == Some(slot) {
            self.dels_cv.wait(&mut d);
        }
    }

    /// An error at once while the store does not answer (see `read_at`).
    fn fail_if_unreachable(&self) -> io::Result<()> {
        if self.client.stats.reachable() {
            return Ok(());
        }
        self.client.stats.errors.fetch_add(1, Ordering::Relaxed);
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "object store {} unreachable: its last request timed out or got no answer \
                 (retried in the background every second)",
                self.client.locator().endpoint
            ),
        ))
    }

    /// Up to `n` bytes of `part` from `from` (fewer at its end): one
    /// ranged GET.
    fn get(&self, part: Part, from: u64, n: u64) -> io::Result<Bytes> {
        match self.client.get_range(&self.key(part), from..from + n) {
            Ok(b) => Ok(b),
            Err(ObjError::NotFound { .. }) => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Err(e) => Err(e.into()),
        }
    }

    /// Uploads one staged object, whole.
    fn upload(&self, part: Part, data: Vec<u8>) -> io::Result<()> {
        if let Part::Slot(s) = part {
            self.settle_delete(s);
            self.ahead.forget(s);
        }
        let key = self.key(part);
        match self.client.put_verified(&key, Bytes::from(data)) {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!("{e}");
                Err(e.into())
            }
        }
    }

    /// The background thread: runs queued deletes (a failed one is kept
    /// and tried again) and, while the store does not answer, probes it
    /// once a second so that its state comes back by itself.
    fn deleter(self: Arc<Self>) {
        while !self.stop.load(Ordering::SeqCst) {
            let next = {
                let mut d = self.dels.lock();
                let next = d.pending.pop_first();
                d.busy = next;
                if next.is_none() {
                    self.dels_cv.wait_for(&mut d, Duration::from_secs(1));
                }
                next
            };
            match next {
                Some(slot) => self.delete_one(slot),
                None if !self.client.stats.reachable() => {
                    let _ = self.client.head(&self.key(Part::Header));
                }
                None => {}
            }
        }
    }

    fn delete_one(&self, slot: u64) {
        let r = self.client.delete(&self.key(Part::Slot(slot)));
        let mut d = self.dels.lock();
        d.busy = None;
        if let Err(e) = r {
            tracing::debug!("deleting slot {slot} object: {e}; will retry");
            d.pending.insert(slot);
            drop(d);
            self.dels_cv.notify_all();
            std::thread::sleep(Duration::from_secs(1));
            return;
        }
        drop(d);
        self.dels_cv.notify_all();
    }
}

impl Backend for S3Backend {
    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within an object held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let inner = &self.inner;
        let len = buf.len();
        inner.pieces(off, len, |part, within, r| {
            let want = r.len() as u64;
            if let Some(staged) = inner.staged.lock().get(&part) {
                let src = staged
                    .get(within as usize..(within + want) as usize)
                    .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
                buf[r].copy_from_slice(src);
                return Ok(());
            }
            // A store that did not answer the last request fails reads at
            // once until the background probe hears from it again: a large
            // read of many chunks costs one time limit, not one per chunk.
            // Checked again before each GET: a read that waited for a
            // read-ahead window whose GET timed out fails then, rather
            // than spending a second time limit of its own.
            inner.fail_if_unreachable()?;
            let get = |from: u64, n: u64| {
                inner.fail_if_unreachable()?;
                inner.get(part, from, n)
            };
            if let Part::Slot(slot) = part {
                if inner.ahead.read(slot, within, &mut buf[r.clone()], get)? == Served::Yes {
                    return Ok(());
                }
            }
            let got = get(within, want)?;
            if got.len() as u64 != want {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            buf[r].copy_from_slice(&got);
            Ok(())
        })
    }

    /// Starts fetching the window of the slot object at `off` in the
    /// background (the chunk store asks for the next segment of a
    /// sequential stream), unless a window covers it, the object is
    /// staged, the store is not answering or `PREFETCHES` run already.
    fn will_need(&self, off: u64, _len: u64) {
        let inner = &self.inner;
        let (part, within, _) = inner.locate(off);
        let Part::Slot(slot) = part else { return };
        if !inner.client.stats.reachable() || inner.staged.lock().contains_key(&part) {
            return;
        }
        if inner.prefetching.fetch_add(1, Ordering::SeqCst) >= PREFETCHES
            || !inner.ahead.claim(slot, within)
        {
            inner.prefetching.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let bg = inner.clone();
        let spawned = std::thread::Builder::new()
            .name("cairn-s3-ahead".into())
            .spawn(move || {
                bg.ahead.prefetch(slot, within, |f, n| bg.get(part, f, n));
                bg.prefetching.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            // The claimed window must not be left waited for.
            let no_thread = |_, _| Err(io::Error::other("no thread for read-ahead"));
            inner.ahead.prefetch(slot, within, no_thread);
            inner.prefetching.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "offsets within an object held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let inner = &self.inner;
        inner.pieces(off, buf.len(), |part, within, r| {
            if let Part::Slot(slot) = part {
                inner.ahead.forget(slot);
            }
            let mut staged = inner.staged.lock();
            let obj = staged.entry(part).or_default();
            let end = within as usize + r.len();
            if obj.len() < end {
                obj.resize(end, 0);
            }
            obj[within as usize..end].copy_from_slice(&buf[r]);
            Ok(())
        })
    }

    /// Uploads every staged object (each whole, verified); on an error
    /// the object stays staged for the next try.
    fn sync_data(&self) -> io::Result<()> {
        let parts: Vec<Part> = self.inner.staged.lock().keys().copied().collect();
        for part in parts {
            let Some(data) = self.inner.staged.lock().remove(&part) else {
                continue;
            };
            if let Err(e) = self.inner.upload(part, data.clone()) {
                self.inner.staged.lock().entry(part).or_insert(data);
                return Err(e);
            }
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.inner.len.load(Ordering::Relaxed))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.len.store(len, Ordering::Relaxed);
        Ok(())
    }

    /// Drops the slots the range covers whole: staged bytes at once, the
    /// objects in the background.
    fn punch_hole(&self, off: u64, len: u64) -> io::Result<()> {
        let inner = &self.inner;
        let seg = inner.segment_size;
        let first = off.saturating_sub(inner.data_offset).div_ceil(seg);
        let end = (off + len).saturating_sub(inner.data_offset) / seg;
        for slot in first..end {
            inner.staged.lock().remove(&Part::Slot(slot));
            inner.ahead.forget(slot);
            self.queue_delete(slot);
        }
        Ok(())
    }

    fn object_tier(&self) -> Option<&dyn ObjectTier> {
        Some(self)
    }
}

impl ObjectTier for S3Backend {
    fn stats(&self) -> StatsSnapshot {
        self.inner.client.stats.snapshot()
    }

    fn reachable(&self) -> bool {
        self.inner.client.stats.reachable()
    }

    fn list_slots(&self) -> io::Result<Vec<u64>> {
        let names = self
            .inner
            .client
            .list(SLOT_OBJECT)
            .map_err(io::Error::from)?;
        Ok(names.iter().filter_map(|(n, _)| slot_of(n)).collect())
    }

    fn queue_delete(&self, slot: u64) {
        self.inner.dels.lock().pending.insert(slot);
        self.inner.dels_cv.notify_all();
    }

    fn pending_deletes(&self) -> usize {
        let d = self.inner.dels.lock();
        d.pending.len() + d.busy.is_some() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_round_trip() {
        assert_eq!(slot_of("cairn-slot-000000000000002a"), Some(42));
        assert_eq!(slot_of("cairn-slot-2a"), None);
        assert_eq!(slot_of("cairn-header"), None);
        assert_eq!(slot_of("cairn-slot-zzzzzzzzzzzzzzzz"), None);
    }
}
