//! The SSD read cache (swapcache): a device with the role `cache` holds
//! copies of hot blocks whose home is a slower device: data chunks (keyed
//! by segment and offset, see cairn-data) and metadata pages (keyed by
//! `CacheKey::meta`, see cairn-meta). Its capacity is not part of the pool.
//! This module is the ring and its fill policy; it does not know what the
//! copies are: every lookup passes a `verify` that checks the copy against
//! what the caller expects (a content hash, a checksum).
//!
//! The device is a ring: copies are appended at the head, and when the head
//! wraps, the copies it overwrites are dropped from the index (stale entries
//! are recycled oldest first). A copy is the sealed chunk exactly as on its
//! home device, so a read from the cache is verified like any chunk read:
//! header checksum, data checksum, and the header's content hash against the
//! chunk record. A copy that fails (overwritten meanwhile, damaged) is
//! dropped and the read goes to the home device: the cache never serves
//! wrong data, and since chunks are immutable and addressed by never-reused
//! (segment, offset), never stale data after an overwrite or delete.
//!
//! Fill rate is limited as in swapcache: a token bucket with a burst
//! allowance and a long-term rate, so the SSD is not worn out. Copies are
//! written by a background thread; when it is busy or the bucket is empty,
//! the offer is dropped. The index lives in RAM; a clean unmount saves it
//! (POOL/ssdcache, checksummed) and the next mount loads and deletes it, so
//! the cache stays warm across restarts. After a crash there is no file and
//! the cache starts cold. A loaded index cannot make the cache serve wrong
//! data either: every copy is verified when read.

use crate::device::Device;
use crate::error::DeviceError;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::Instant;

/// What a copy is cached under: (segment id, offset in segment) for a data
/// chunk; metadata pages have the top bit of the first half set.
pub type CacheKey = (u64, u32);

/// Keys with this bit set in their first half are metadata pages.
pub const META_KEY_BIT: u64 = 1 << 63;

/// The key of a metadata page: its offset in the metadata store and length.
pub fn meta_key(offset: u64, len: u32) -> CacheKey {
    assert!(offset < META_KEY_BIT, "metadata offset {offset} too large");
    (META_KEY_BIT | offset, len)
}

/// True for the key of a metadata page.
pub fn is_meta_key(key: &CacheKey) -> bool {
    key.0 & META_KEY_BIT != 0
}

/// Fill-rate limits: `burst` bytes at once, `rate` bytes per second.
#[derive(Debug, Clone, Copy)]
pub struct FillLimit {
    pub burst: u64,
    pub rate: u64,
}

struct Bucket {
    limit: FillLimit,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn admit(&mut self, bytes: u64) -> bool {
        let now = Instant::now();
        let dt = now.duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + dt * self.limit.rate as f64).min(self.limit.burst as f64);
        if self.tokens >= bytes as f64 {
            self.tokens -= bytes as f64;
            true
        } else {
            false
        }
    }
}

#[derive(Default)]
struct Ring {
    head: u64,
    /// key -> (device offset, length)
    index: HashMap<CacheKey, (u64, u32)>,
    /// device offset -> key, to find what a write overwrites.
    by_off: BTreeMap<u64, CacheKey>,
}

#[derive(Debug, Default, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub filled_bytes: u64,
    /// Offers refused by the fill-rate limit or a busy writer.
    pub throttled: u64,
    /// Copies that failed verification and were dropped.
    pub dropped: u64,
    pub entries: u64,
    pub capacity: u64,
    /// Of the above, for metadata pages.
    pub meta_hits: u64,
    pub meta_misses: u64,
    pub meta_entries: u64,
}

pub struct SsdCache {
    dev: Arc<Device>,
    start: u64,
    end: u64,
    ring: Arc<Mutex<Ring>>,
    bucket: Mutex<Bucket>,
    tx: SyncSender<(CacheKey, Vec<u8>)>,
    hits: AtomicU64,
    misses: AtomicU64,
    meta_hits: AtomicU64,
    meta_misses: AtomicU64,
    filled: Arc<AtomicU64>,
    throttled: AtomicU64,
    dropped: AtomicU64,
}

impl SsdCache {
    pub fn new(dev: Arc<Device>, limit: FillLimit) -> Arc<Self> {
        let start = dev.header.data_offset;
        let end = dev.header.size;
        assert!(end > start, "cache device without a data area");
        let (tx, rx) = sync_channel::<(CacheKey, Vec<u8>)>(64);
        let ring = Arc::new(Mutex::new(Ring {
            head: start,
            ..Default::default()
        }));
        let filled = Arc::new(AtomicU64::new(0));
        let (wdev, wring, wfilled) = (dev.clone(), ring.clone(), filled.clone());
        std::thread::Builder::new()
            .name("cairn-ssdcache".into())
            .spawn(move || {
                for (key, bytes) in rx {
                    if write_copy(&wdev, &wring, start, end, key, &bytes) {
                        wfilled.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    }
                }
            })
            .expect("spawn cache writer");
        Arc::new(SsdCache {
            dev,
            start,
            end,
            ring,
            bucket: Mutex::new(Bucket {
                limit,
                tokens: limit.burst as f64,
                at: Instant::now(),
            }),
            tx,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            meta_hits: AtomicU64::new(0),
            meta_misses: AtomicU64::new(0),
            filled,
            throttled: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// The copy cached under `key`, if any; `verify` checks it against what
    /// the caller expects (and returns what it needs of it). A copy that
    /// fails is dropped.
    pub fn lookup<T>(&self, key: CacheKey, verify: impl FnOnce(&[u8]) -> Option<T>) -> Option<T> {
        let Some((off, len)) = self.ring.lock().index.get(&key).copied() else {
            self.count(&key, false);
            return None;
        };
        let mut buf = vec![0u8; len as usize];
        let got = self
            .dev
            .read_at(&mut buf, off)
            .ok()
            .and_then(|_| verify(&buf));
        self.count(&key, got.is_some());
        if got.is_none() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            self.forget_at(key, off);
        }
        got
    }

    /// Drops the copy of `key` if it still is the one at device offset `off`.
    fn forget_at(&self, key: CacheKey, off: u64) {
        let mut r = self.ring.lock();
        if r.index.get(&key).is_some_and(|&(o, _)| o == off) {
            r.index.remove(&key);
            r.by_off.remove(&off);
        }
    }

    /// Drops the copy of `key`, if any (its content changed at home).
    pub fn forget(&self, key: CacheKey) {
        let mut r = self.ring.lock();
        if let Some((off, _)) = r.index.remove(&key) {
            r.by_off.remove(&off);
        }
    }

    /// Counts a miss for a lookup the caller answered without the ring
    /// (it had nothing to verify a copy against).
    pub fn count_miss(&self, key: &CacheKey) {
        self.count(key, false);
    }

    fn count(&self, key: &CacheKey, hit: bool) {
        let c = match (is_meta_key(key), hit) {
            (false, true) => &self.hits,
            (false, false) => &self.misses,
            (true, true) => &self.meta_hits,
            (true, false) => &self.meta_misses,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Offers a verified copy of what `key` holds at home (a sealed chunk,
    /// a metadata page), read from its home device.
    pub fn offer(&self, key: CacheKey, sealed: &[u8]) {
        // The index keeps u32 lengths (write_copy).
        if sealed.len() as u64 > (self.end - self.start) / 4 || u32::try_from(sealed.len()).is_err()
        {
            return;
        }
        if !self.bucket.lock().admit(sealed.len() as u64)
            || self.tx.try_send((key, sealed.to_vec())).is_err()
        {
            self.throttled.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn stats(&self) -> CacheStats {
        let (entries, meta_entries) = {
            let r = self.ring.lock();
            let meta = r.index.keys().filter(|k| is_meta_key(k)).count();
            (r.index.len() as u64, meta as u64)
        };
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CacheStats {
            hits: load(&self.hits) + load(&self.meta_hits),
            misses: load(&self.misses) + load(&self.meta_misses),
            filled_bytes: self.filled.load(Ordering::Relaxed),
            throttled: load(&self.throttled),
            dropped: load(&self.dropped),
            entries,
            capacity: self.end - self.start,
            meta_hits: load(&self.meta_hits),
            meta_misses: load(&self.meta_misses),
            meta_entries,
        }
    }
}

const INDEX_MAGIC: &[u8; 8] = b"CAIRNSC1";
const INDEX_HEAD_LEN: usize = 8 + 16 + 4 + 8;
const INDEX_ENTRY_LEN: usize = 8 + 4 + 8 + 4;

/// A copy in a saved index: its key, device offset and length.
type SavedCopy = (CacheKey, u64, u32);

/// A saved index, decoded: the ring's head and the data copies, by offset.
#[derive(Debug, Default, PartialEq, Eq)]
struct SavedIndex {
    head: u64,
    copies: Vec<SavedCopy>,
}

impl SsdCache {
    /// Saves the index of the data chunks (see `encode_index`). Metadata
    /// pages are not saved: their checksums live in RAM only, so they
    /// start cold at every mount.
    pub fn save(&self, path: &std::path::Path) -> std::io::Result<()> {
        let r = self.ring.lock();
        let copies = r.index.iter().filter(|(k, _)| !is_meta_key(k));
        let copies = copies.map(|(&key, &(at, len))| (key, at, len));
        let h = &self.dev.header;
        let b = encode_index(&h.pool_uuid, h.device_id, r.head, copies);
        drop(r);
        let tmp = path.with_extension("tmp");
        crate::private::write_private(&tmp, &b)?;
        std::fs::rename(&tmp, path)
    }

    /// Loads an index saved by `save` for this device and deletes the file.
    /// Returns the entries loaded (0 if there was no valid file).
    pub fn load(&self, path: &std::path::Path) -> u64 {
        // Type-checked and bounded (a symlink to /dev/zero is not read on).
        let read = crate::private::read_small(path, 1 << 30);
        let _ = std::fs::remove_file(path);
        let Ok(b) = read else {
            return 0;
        };
        let h = &self.dev.header;
        let saved = match decode_index(&b, &h.pool_uuid, h.device_id, self.start, self.end) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("{}: ignored: {e}", path.display());
                return 0;
            }
        };
        let mut r = self.ring.lock();
        r.head = saved.head;
        for (key, at, len) in saved.copies {
            r.index.insert(key, (at, len));
            r.by_off.insert(at, key);
        }
        r.index.len() as u64
    }
}

/// The index file: magic, pool uuid, device id u32, head u64, then per
/// copy segment u64 | offset u32 | device offset u64 | length u32, then
/// crc32c of all before.
fn encode_index(
    uuid: &[u8; 16],
    device_id: u32,
    head: u64,
    copies: impl Iterator<Item = SavedCopy>,
) -> Vec<u8> {
    let mut b = INDEX_MAGIC.to_vec();
    b.extend_from_slice(uuid);
    b.extend_from_slice(&device_id.to_le_bytes());
    b.extend_from_slice(&head.to_le_bytes());
    for ((seg, off), at, len) in copies {
        b.extend_from_slice(&seg.to_le_bytes());
        b.extend_from_slice(&off.to_le_bytes());
        b.extend_from_slice(&at.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes an index file of the device `(uuid, device_id)` whose ring is
/// `start..end`. Each copy is a hint (a read verifies it), so one that
/// could not be in the ring (outside it, empty or longer than `offer` takes, over
/// the one before it, or a key seen before) is left out, not the file.
fn decode_index(
    b: &[u8],
    uuid: &[u8; 16],
    device_id: u32,
    start: u64,
    end: u64,
) -> Result<SavedIndex, DeviceError> {
    let bad = DeviceError::BadCacheIndex;
    if b.len() < INDEX_HEAD_LEN + 4 || &b[..8] != INDEX_MAGIC {
        return Err(bad("not an index file"));
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(bad("checksum mismatch"));
    }
    if body[8..24] != uuid[..] || body[24..28] != device_id.to_le_bytes() {
        return Err(bad("the index of another device"));
    }
    if !(body.len() - INDEX_HEAD_LEN).is_multiple_of(INDEX_ENTRY_LEN) {
        return Err(bad("wrong length"));
    }
    let u64_at = |e: &[u8], i: usize| {
        u64::from_le_bytes(
            e[i..i + 8]
                .try_into()
                .expect("slice length matches the array"),
        )
    };
    let u32_at = |e: &[u8], i: usize| {
        u32::from_le_bytes(
            e[i..i + 4]
                .try_into()
                .expect("slice length matches the array"),
        )
    };
    let max_len = end.saturating_sub(start) / 4;
    let fits = |&(key, at, len): &SavedCopy| {
        let end_ok = at.checked_add(len as u64).is_some_and(|e| e <= end);
        !is_meta_key(&key) && at >= start && len > 0 && len as u64 <= max_len && end_ok
    };
    let mut copies: Vec<SavedCopy> = body[INDEX_HEAD_LEN..]
        .chunks_exact(INDEX_ENTRY_LEN)
        .map(|e| ((u64_at(e, 0), u32_at(e, 8)), u64_at(e, 12), u32_at(e, 20)))
        .filter(fits)
        .collect();
    copies.sort_by_key(|&(_, at, _)| at);
    let (mut free_from, mut seen) = (start, std::collections::HashSet::new());
    copies.retain(|&(key, at, len)| {
        let keep = at >= free_from && seen.insert(key);
        if keep {
            free_from = at + len as u64;
        }
        keep
    });
    let head = u64_at(body, 28).clamp(start, end);
    Ok(SavedIndex { head, copies })
}

/// Appends one copy at the ring head, recycling what it overwrites.
#[allow(
    clippy::cast_possible_truncation,
    reason = "offer refuses copies of 4 GiB or more"
)]
fn write_copy(
    dev: &Device,
    ring: &Mutex<Ring>,
    start: u64,
    end: u64,
    key: CacheKey,
    bytes: &[u8],
) -> bool {
    let len = bytes.len() as u64;
    let off = {
        let mut r = ring.lock();
        if r.index.contains_key(&key) {
            return false;
        }
        if r.head + len > end {
            r.head = start;
        }
        let off = r.head;
        r.head += len;
        // Drop every copy that starts inside [off, off + len) or covers off.
        let first = r.by_off.range(..off).next_back().map(|(&o, &k)| (o, k));
        if let Some((o, k)) = first {
            if r.index.get(&k).is_some_and(|&(_, l)| o + l as u64 > off) {
                r.index.remove(&k);
                r.by_off.remove(&o);
            }
        }
        let over: Vec<(u64, CacheKey)> = r
            .by_off
            .range(off..off + len)
            .map(|(&o, &k)| (o, k))
            .collect();
        for (o, k) in over {
            r.index.remove(&k);
            r.by_off.remove(&o);
        }
        // The copy lies in the ring (`offer` takes at most a quarter of
        // it), and both maps name the same copies.
        assert!(
            off >= start && off + len <= end,
            "cache copy {off}+{len} outside the ring {start}..{end}"
        );
        debug_assert_eq!(r.index.len(), r.by_off.len(), "cache index maps differ");
        off
    };
    if dev.write_at(bytes, off).is_err() {
        return false;
    }
    let mut r = ring.lock();
    r.index.insert(key, (off, len as u32));
    r.by_off.insert(off, key);
    true
}

#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod tests {
    use super::*;
    use crate::{DeviceClass, DeviceSpec};

    fn cache(dir: &std::path::Path, mib: u64, limit: FillLimit) -> Arc<SsdCache> {
        let spec = DeviceSpec::tier(DeviceClass::Ssd, dir.join("c"), Some((1 + mib) << 20));
        let dev = Device::create(&spec, 0, [0; 16], 1 << 18).unwrap();
        SsdCache::new(Arc::new(dev), limit)
    }

    fn block(seed: u8) -> Vec<u8> {
        (0..200_000u32).map(|i| (i as u8) ^ seed).collect()
    }

    /// A verify that accepts only the expected bytes.
    fn exactly(want: Vec<u8>) -> impl FnOnce(&[u8]) -> Option<Vec<u8>> {
        move |b| (b == want.as_slice()).then(|| b.to_vec())
    }

    fn wait_entries(c: &SsdCache, n: u64) {
        for _ in 0..500 {
            if c.stats().entries >= n {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        panic!("cache has {} entries, want {n}", c.stats().entries);
    }

    const UNLIMITED: FillLimit = FillLimit {
        burst: 1 << 30,
        rate: 1 << 30,
    };

    #[test]
    fn serves_verified_copies_and_recycles_the_oldest() {
        let d = tempfile::tempdir().unwrap();
        let c = cache(d.path(), 1, UNLIMITED);
        c.offer((1, 0), &block(1));
        wait_entries(&c, 1);
        assert!(
            c.lookup((1, 0), exactly(block(1))).is_some(),
            "copy not served"
        );
        // A lookup that expects other content (the key reused with other
        // bytes) is refused and the entry dropped: never stale data.
        assert!(c.lookup((1, 0), exactly(block(2))).is_none());
        assert_eq!(c.stats().dropped, 1);
        assert_eq!(c.stats().entries, 0);
        // 1 MiB ring, 200 KB copies: the sixth copy wraps and recycles.
        for k in 0..6u64 {
            c.offer((10 + k, 0), &block(k as u8));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let s = c.stats();
        assert!(s.entries <= 5 && s.entries >= 4, "{s:?}");
        assert!(c.lookup((10, 0), exactly(block(0))).is_none());
        assert!(c.lookup((15, 0), exactly(block(5))).is_some());
    }

    #[test]
    fn fill_rate_is_limited_by_burst_and_rate() {
        let d = tempfile::tempdir().unwrap();
        let limit = FillLimit {
            burst: 450_000,
            rate: 1,
        };
        let c = cache(d.path(), 4, limit);
        for k in 0..5u64 {
            c.offer((k, 0), &block(k as u8));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let s = c.stats();
        assert_eq!((s.entries, s.throttled), (2, 3), "{s:?}");
    }

    #[test]
    fn metadata_pages_are_counted_apart_and_not_saved() {
        let d = tempfile::tempdir().unwrap();
        let c = cache(d.path(), 2, UNLIMITED);
        let page = meta_key(8192, 4096);
        assert!(is_meta_key(&page) && !is_meta_key(&(8192, 4096)));
        c.offer(page, &block(3)[..4096]);
        c.offer((7, 0), &block(4));
        wait_entries(&c, 2);
        assert!(c.lookup(page, exactly(block(3)[..4096].to_vec())).is_some());
        assert!(c.lookup(meta_key(0, 4096), |_| Some(())).is_none());
        let s = c.stats();
        assert_eq!(
            (s.meta_entries, s.meta_hits, s.meta_misses),
            (1, 1, 1),
            "{s:?}"
        );
        assert_eq!((s.hits, s.misses), (1, 1), "{s:?}");
        c.forget(page);
        assert_eq!(c.stats().meta_entries, 0);
        c.offer(page, &block(3)[..4096]);
        wait_entries(&c, 2);
        let idx = d.path().join("index");
        c.save(&idx).unwrap();
        let again = SsdCache::new(c.device().clone(), UNLIMITED);
        assert_eq!(again.load(&idx), 1, "only the data chunk is saved");
        assert!(again.lookup((7, 0), exactly(block(4))).is_some());
    }
}
