//! The RAM read cache (EPRD's RAM cache, for reads): raw bytes of chunks
//! whose home is a device slower than the pool's fastest tier, bounded in
//! bytes (`read_cache_mib`). A chunk is addressed by (segment id, offset in
//! segment); segment ids are never reused and chunks never change in place,
//! so an entry can never be stale: an overwrite writes a new chunk
//! elsewhere. Moving a segment between tiers keeps its id and contents.

use quick_cache::sync::Cache;
use quick_cache::Weighter;
use std::sync::Arc;

pub use cairn_devices::ssdcache::CacheKey as ChunkKey;

#[derive(Clone)]
struct Bytes;

impl Weighter<ChunkKey, Arc<[u8]>> for Bytes {
    fn weight(&self, _: &ChunkKey, v: &Arc<[u8]>) -> u64 {
        v.len() as u64 + 64
    }
}

pub struct RamCache {
    cache: Cache<ChunkKey, Arc<[u8]>, Bytes>,
}

impl RamCache {
    pub fn new(bytes: u64) -> Self {
        RamCache {
            cache: Cache::with_weighter((bytes / (64 << 10)).max(16) as usize, bytes, Bytes),
        }
    }

    pub fn get(&self, key: ChunkKey) -> Option<Arc<[u8]>> {
        self.cache.get(&key)
    }

    pub fn insert(&self, key: ChunkKey, raw: Arc<[u8]>) {
        self.cache.insert(key, raw);
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.cache.weight()
    }
}
