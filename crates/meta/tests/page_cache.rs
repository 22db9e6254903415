//! The metadata store read through the SSD cache: under churn (redb frees
//! and rewrites pages in place) every read matches a model of what was
//! written, and reads are served from the cache device.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use cairn_devices::{Device, DeviceClass, DeviceSpec, FillLimit, SsdCache};
use cairn_meta::{MetaStore, PageCache};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;

fn ssd_cache(dir: &std::path::Path) -> Arc<SsdCache> {
    let spec = DeviceSpec::tier(DeviceClass::Ssd, dir.join("cache.img"), Some(64 << 20));
    let dev = Device::create(&spec, 0, [0; 16], 1 << 20).unwrap();
    let unlimited = FillLimit {
        burst: 1 << 40,
        rate: 1 << 40,
    };
    SsdCache::new(Arc::new(dev), unlimited)
}

/// Checks every key of the model (and some absent ones) against the store.
fn verify(m: &MetaStore, model: &BTreeMap<u64, Vec<u8>>, round: usize) {
    let r = m.read().unwrap();
    for id in 0..KEYS {
        let got = r.chunk(id).unwrap();
        assert_eq!(got.as_ref(), model.get(&id), "round {round}: chunk {id}");
    }
}

const KEYS: u64 = 6000;

#[test]
fn pages_from_the_cache_are_never_stale() {
    let seed: u64 = std::env::var("CAIRN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("CAIRN_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("meta.redb");
    drop(MetaStore::create(&path).unwrap());
    let cache = ssd_cache(d.path());
    let pages = PageCache::new();
    pages.set_cache(Some(cache.clone()));
    // No RAM page cache in redb: every page read goes to the backend.
    let m = MetaStore::open(&path, 0, pages.clone()).unwrap();
    let mut model = BTreeMap::new();
    for round in 0..12 {
        m.write(|w| {
            for _ in 0..1500 {
                let id = rng.gen_range(0..KEYS);
                if rng.gen_bool(0.25) {
                    w.remove_chunk(id)?;
                    model.remove(&id);
                } else {
                    let len = rng.gen_range(20..300);
                    let v: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                    w.put_chunk(id, &v)?;
                    model.insert(id, v);
                }
            }
            Ok::<_, cairn_meta::MetaError>(())
        })
        .unwrap();
        verify(&m, &model, round);
        // Let the cache writer store what the reads offered, then read
        // again, now mostly from the cache.
        std::thread::sleep(std::time::Duration::from_millis(50));
        verify(&m, &model, round);
    }
    let s = cache.stats();
    println!("{s:?}");
    assert!(
        s.meta_hits > 1000,
        "metadata pages not served from the cache: {s:?}"
    );
    assert!(s.meta_entries > 0 && s.entries == s.meta_entries, "{s:?}");
    // Detached, the store still reads right, without the cache.
    pages.set_cache(None);
    verify(&m, &model, 99);
    assert_eq!(cache.stats().meta_hits, s.meta_hits);
}
