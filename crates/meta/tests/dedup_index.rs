//! The dedup index at scale: its size per unique block (the RAM it takes
//! when fully cached) and the conversion of a dedup_v1 index.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use cairn_meta::tables::DEDUP_V1;
use cairn_meta::MetaStore;
use rand::{Rng, SeedableRng};

fn random_hashes(n: usize, seed: u64) -> Vec<[u8; 32]> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let mut h = [0u8; 32];
            rng.fill(&mut h[..]);
            h
        })
        .collect()
}

/// 400k unique blocks inserted in commits of 4096 (the way flushes add
/// them): the whole index must fit in 20 bytes per entry at every size
/// along the way (B-tree fill varies as pages split).
#[test]
fn index_takes_at_most_20_bytes_per_unique_block() {
    let d = tempfile::tempdir().unwrap();
    let m = MetaStore::create(&d.path().join("meta.redb")).unwrap();
    let hashes = random_hashes(400_000, 7);
    let mut worst: f64 = 0.0;
    for (n, batch) in hashes.chunks(4096).enumerate() {
        m.write(|w| {
            for (i, h) in batch.iter().enumerate() {
                w.put_dedup(h, (n * 4096 + i) as u64 + 1)?;
            }
            Ok::<_, cairn_meta::MetaError>(())
        })
        .unwrap();
        if n % 8 == 7 {
            let (e, b) = m.read().unwrap().dedup_size().unwrap();
            worst = worst.max(b as f64 / e as f64);
        }
    }
    let r = m.read().unwrap();
    let (entries, bytes) = r.dedup_size().unwrap();
    assert_eq!(entries, hashes.len() as u64);
    let per = bytes as f64 / entries as f64;
    println!("dedup index: {entries} entries, {bytes} bytes, {per:.2} B/entry, worst {worst:.2}");
    assert!(
        per <= 20.0 && worst <= 20.0,
        "{per:.2} (worst {worst:.2}) bytes per entry"
    );
    for (i, h) in hashes.iter().enumerate().step_by(997) {
        assert_eq!(r.dedup(h).unwrap(), Some(i as u64 + 1));
    }
}

/// A pool written by the first index format opens with its entries moved to
/// dedup_v2 and the old table gone.
#[test]
fn dedup_v1_is_converted_on_open() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("meta.redb");
    let hashes = random_hashes(100, 9);
    drop(MetaStore::create(&path).unwrap());
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(DEDUP_V1).unwrap();
            for (i, h) in hashes.iter().enumerate() {
                let mut v = vec![1u8];
                v.extend_from_slice(&(i as u64 + 5).to_le_bytes());
                let crc = crc32c::crc32c(&v);
                v.extend_from_slice(&crc.to_le_bytes());
                t.insert(&h[..], v.as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
    }
    let m = MetaStore::open(&path, 1 << 20, cairn_meta::PageCache::new()).unwrap();
    let r = m.read().unwrap();
    assert_eq!(r.dedup_size().unwrap().0, 100);
    for (i, h) in hashes.iter().enumerate() {
        assert_eq!(r.dedup(h).unwrap(), Some(i as u64 + 5));
    }
    drop(r);
    drop(m);
    let db = redb::Database::open(&path).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    assert!(txn.open_table(DEDUP_V1).is_err(), "dedup_v1 still present");
}
