//! Metadata pages in the SSD read cache (swapcache caches metadata too).
//!
//! redb reads and writes the metadata file through `CachedFile`, a redb
//! storage backend over the file. When the pool has an SSD cache device
//! faster than the metadata's home, a page read from the file is offered to
//! the cache ring under `meta_key(offset, len)`, and its crc32c is kept here
//! in RAM. A later read of the same range (redb's own RAM cache missed) is
//! served from the SSD only if the copy's crc32c matches the one kept.
//!
//! Staleness: redb rewrites freed pages in place, so every write to the file
//! first drops the checksums of all ranges it overlaps, and a read whose
//! file read raced with any write does not record a checksum. A copy with no
//! checksum, or another one, is never served. The checksums live only in
//! RAM: after a restart the metadata part of the cache starts cold.
//!
//! The backend also charges the home device's slow-device emulation (if
//! any) for every read and write, so an emulated slow pool has slow
//! metadata too.
//!
//! The file's bytes go through a `cairn_devices::Backend` (the host file,
//! or a test backend from the pool's storage). redb's range locks (which
//! keep a second process out of the file) are taken on the host file under
//! it with redb's own file backend over a duplicate descriptor (same open
//! file description, so the same locks); a backend without a host file has
//! none, which redb allows in its default single-writer mode.

use cairn_devices::ssdcache::meta_key;
use cairn_devices::{Backend, Device, SsdCache};
use parking_lot::{Mutex, RwLock};
use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};
use std::collections::BTreeMap;
use std::io::Error as BackendIoError;
use std::ops::Bound;
use std::sync::Arc;

/// Checksums of the ranges whose copies may be served.
#[derive(Default)]
struct Valid {
    /// offset -> (length, crc32c)
    pages: BTreeMap<u64, (u32, u32)>,
    /// The longest range ever recorded (bounds the overlap search).
    max_len: u64,
    /// Count of writes so far: a read that saw it change is not recorded.
    writes: u64,
}

impl Valid {
    /// Drops every range overlapping [start, end).
    fn drop_overlapping(&mut self, start: u64, end: u64) {
        let from = start.saturating_sub(self.max_len);
        let hit: Vec<u64> = self
            .pages
            .range(from..end)
            .filter(|(&o, &(l, _))| o + l as u64 > start)
            .map(|(&o, _)| o)
            .collect();
        for o in hit {
            self.pages.remove(&o);
        }
    }
}

/// The state shared by the metadata store's backend and the pool, which
/// attaches and detaches the SSD cache as devices come and go.
#[derive(Default)]
pub struct PageCache {
    cache: RwLock<Option<Arc<SsdCache>>>,
    home: RwLock<Option<Arc<Device>>>,
    valid: Mutex<Valid>,
}

impl PageCache {
    pub fn new() -> Arc<Self> {
        Arc::new(PageCache::default())
    }

    /// Caches pages on `cache` from now on (None: stop caching). Forgets
    /// every checksum kept for an earlier cache.
    pub fn set_cache(&self, cache: Option<Arc<SsdCache>>) {
        let mut w = self.cache.write();
        let mut v = self.valid.lock();
        v.pages.clear();
        *w = cache;
    }

    pub fn is_caching(&self) -> bool {
        self.cache.read().is_some()
    }

    /// The device the metadata file lives on, whose slow-device emulation
    /// (if any) its I/O is charged to.
    pub fn set_home(&self, dev: Option<Arc<Device>>) {
        *self.home.write() = dev;
    }

    fn charge(&self, bytes: usize) {
        if let Some(d) = self.home.read().as_ref() {
            d.charge_emulated(bytes);
        }
    }

    /// The cache pages go to, if any.
    fn cache(&self) -> Option<Arc<SsdCache>> {
        self.cache.read().clone()
    }

    /// Serves `out` from `cache` if a verified copy is there.
    fn lookup(&self, cache: &SsdCache, offset: u64, out: &mut [u8]) -> bool {
        // A read of 4 GiB or more is never cached (fill skips it).
        let Ok(len) = u32::try_from(out.len()) else {
            return false;
        };
        let want = self.valid.lock().pages.get(&offset).copied();
        let key = meta_key(offset, len);
        let Some((_, crc)) = want.filter(|&(l, _)| l == len) else {
            cache.count_miss(&key);
            return false;
        };
        cache
            .lookup(key, |b| {
                (crc32c::crc32c(b) == crc).then(|| out.copy_from_slice(b))
            })
            .is_some()
    }

    /// Records a range just read from the file (unless a write ran
    /// meanwhile) and offers it to `cache`.
    fn fill(&self, cache: &SsdCache, offset: u64, bytes: &[u8], writes_before: u64) {
        let Ok(len) = u32::try_from(bytes.len()) else {
            return;
        };
        let key = meta_key(offset, len);
        {
            let mut v = self.valid.lock();
            if v.writes != writes_before {
                return;
            }
            v.pages.insert(offset, (len, crc32c::crc32c(bytes)));
            v.max_len = v.max_len.max(bytes.len() as u64);
        }
        cache.forget(key);
        cache.offer(key, bytes);
    }

    fn writes(&self) -> u64 {
        self.valid.lock().writes
    }

    /// Called before the file changes over [start, end).
    fn invalidate(&self, start: u64, end: u64) {
        let mut v = self.valid.lock();
        v.writes += 1;
        v.drop_overlapping(start, end);
    }
}

/// redb's storage backend: the metadata file, read through the page cache.
#[derive(Debug)]
pub struct CachedFile {
    file: Arc<dyn Backend>,
    /// redb's file backend on the host file, for its range locks only.
    locks: Option<FileBackend>,
    pages: Arc<PageCache>,
}

impl std::fmt::Debug for PageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PageCache(caching: {})", self.is_caching())
    }
}

impl CachedFile {
    pub fn new(file: Arc<dyn Backend>, pages: Arc<PageCache>) -> std::io::Result<Self> {
        let locks = match file.host_file() {
            #[allow(clippy::unnecessary_fallible_conversions)]
            Some(f) => Some(
                FileBackend::new(f.try_clone()?).expect("FileBackend::new does not fail on 4.x"),
            ),
            None => None,
        };
        Ok(CachedFile { file, locks, pages })
    }

    fn locks(&self) -> Result<&FileBackend, BackendError> {
        self.locks.as_ref().ok_or(BackendError::Unsupported)
    }
}

impl StorageBackend for CachedFile {
    fn len(&self) -> Result<u64, BackendIoError> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
        let Some(cache) = self.pages.cache() else {
            self.pages.charge(out.len());
            return self.file.read_at(out, offset);
        };
        if self.pages.lookup(&cache, offset, out) {
            return Ok(());
        }
        let writes = self.pages.writes();
        self.pages.charge(out.len());
        self.file.read_at(out, offset)?;
        self.pages.fill(&cache, offset, out, writes);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
        self.pages.invalidate(len.min(self.file.len()?), u64::MAX);
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), BackendIoError> {
        self.pages.charge(0);
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendIoError> {
        self.pages.invalidate(offset, offset + data.len() as u64);
        self.pages.charge(data.len());
        self.file.write_at(data, offset)
    }

    fn close(&self) -> Result<(), BackendIoError> {
        self.locks.as_ref().map_or(Ok(()), |l| l.close())
    }

    fn try_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.locks()?.try_lock_range(s, e)
    }

    fn try_lock_shared_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.locks()?.try_lock_shared_range(s, e)
    }

    fn lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), BackendError> {
        self.locks()?.lock_range(s, e)
    }

    fn lock_shared_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), BackendError> {
        self.locks()?.lock_shared_range(s, e)
    }

    fn unlock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), BackendError> {
        self.locks()?.unlock_range(s, e)
    }

    fn query_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, BackendError> {
        self.locks()?.query_lock_range(s, e)
    }
}
