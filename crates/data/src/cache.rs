//! The RAM read cache (EPRD's RAM cache, for reads): raw bytes of chunks
//! whose home is a device slower than the pool's fastest tier, bounded in
//! bytes (`read_cache_mib`). A chunk is addressed by (segment id, offset in
//! segment); segment ids are never reused and chunks never change in place,
//! so an entry can never be stale: an overwrite writes a new chunk
//! elsewhere. Moving a segment between tiers keeps its id and contents.
//! Each entry keeps the content hash it was verified against, and a lookup
//! names the hash it expects: chunks read ahead (checked against their own
//! headers, not yet against a record) are served only to a matching record.

use crate::Hash;
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

pub use cairn_devices::ssdcache::CacheKey as ChunkKey;

#[derive(Clone)]
struct Bytes;

type Entry = (Hash, Arc<[u8]>);

impl Weighter<ChunkKey, Entry> for Bytes {
    fn weight(&self, _: &ChunkKey, v: &Entry) -> u64 {
        v.1.len() as u64 + 96
    }
}

pub struct RamCache {
    cache: Cache<ChunkKey, Entry, Bytes>,
    /// Lookups answered and not (relaxed counters for the metrics).
    hits: AtomicU64,
    misses: AtomicU64,
}

impl RamCache {
    pub fn new(bytes: u64) -> Self {
        RamCache {
            cache: Cache::with_weighter((bytes / (64 << 10)).max(16) as usize, bytes, Bytes),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The raw bytes cached under `key`, if they have content `hash`.
    pub fn get(&self, key: ChunkKey, hash: &Hash) -> Option<Arc<[u8]>> {
        let r = self.cache.get(&key).filter(|(h, _)| h == hash).map(|e| e.1);
        let c = if r.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        c.fetch_add(1, Relaxed);
        r
    }

    /// (hits, misses) of `get` since the cache was made.
    pub fn hits_misses(&self) -> (u64, u64) {
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }

    /// Caches raw bytes verified to have content `hash`.
    pub fn insert(&self, key: ChunkKey, hash: Hash, raw: Arc<[u8]>) {
        self.cache.insert(key, (hash, raw));
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.cache.weight()
    }
}
