//! Tests of the metadata store: versions and as-of reads, prune, scans,
//! the creation index and the batched dedup entries.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]

mod basics {
    use super::super::*;
    use crate::key::RecordType;

    fn store() -> (tempfile::TempDir, MetaStore) {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        (d, s)
    }

    #[test]
    fn versions_and_asof() {
        let (_d, s) = store();
        let k = ElemKey::new(5, RecordType::Extent, &7u64.to_be_bytes());
        for tid in 1..=10u64 {
            s.write(|w| w.put(&k, format!("v{tid}").as_bytes(), tid * 10))
                .unwrap();
        }
        let r = s.read().unwrap();
        assert_eq!(r.get(&k).unwrap().unwrap().payload, b"v10");
        assert_eq!(r.get_asof(&k, 55).unwrap().unwrap().payload, b"v5");
        assert_eq!(r.get_asof(&k, 50).unwrap().unwrap().payload, b"v5");
        assert_eq!(r.get_asof(&k, 49).unwrap().unwrap().payload, b"v4");
        assert!(r.get_asof(&k, 9).unwrap().is_none());
        drop(r);
        s.write(|w| w.end(&k, 200)).unwrap();
        let r = s.read().unwrap();
        assert!(r.get(&k).unwrap().is_none());
        assert_eq!(r.get_asof(&k, 150).unwrap().unwrap().payload, b"v10");
        assert!(r.get_asof(&k, 200).unwrap().is_none());
    }

    /// A view bounds the inodes it can hold by the inode counter of its
    /// snapshot; without the counter (or in a salvage view) it bounds
    /// nothing.
    #[test]
    fn the_inode_counter_bounds_what_a_view_holds() {
        let (d, s) = store();
        assert!(
            s.read().unwrap().may_hold_inode(u64::MAX - 1),
            "no counter yet"
        );
        let k = ElemKey::new(99, RecordType::Inode, &[]);
        s.write(|w| {
            w.put(&k, b"i", 10)?;
            w.set_counter(crate::tables::NEXT_INO, 100)
        })
        .unwrap();
        let r = s.read().unwrap();
        assert_eq!(r.get_of_inode(&k).unwrap().unwrap().payload, b"i");
        let found = r.scan_of_inode(99, &ElemKey::object_prefix(99), None, 10);
        assert_eq!(found.unwrap().len(), 1);
        let past = ElemKey::new(100, RecordType::Inode, &[]);
        assert!(r.get_of_inode(&past).unwrap().is_none());
        assert!(r.may_hold_inode(99));
        assert!(!r.may_hold_inode(100));
        assert!(!r.may_hold_inode(5000));
        s.write(|w| w.set_counter(crate::tables::NEXT_INO, 200))
            .unwrap();
        assert!(
            !r.may_hold_inode(150),
            "an open view keeps its snapshot's bound"
        );
        assert!(s.read().unwrap().may_hold_inode(150));
        drop((r, s));
        let salvage = MetaStore::open_salvage(&d.path().join("m.redb")).unwrap();
        assert!(salvage.read().unwrap().may_hold_inode(5000));
    }

    /// TIDs only grow: an element ended at (or before) the TID that made
    /// it, one made at TID_MAX, or a TID logged again, is a violated
    /// invariant, and so is a new chunk recorded over a stored one; the
    /// transaction is not committed.
    #[test]
    fn a_change_out_of_tid_order_is_refused_and_not_committed() {
        let (_d, s) = store();
        let k = ElemKey::new(9, RecordType::Inode, &[]);
        s.write(|w| {
            w.put(&k, b"v1", 5)?;
            w.log_tid(5, 50)
        })
        .unwrap();
        type Change<'a> = &'a dyn Fn(&mut MetaWrite<'_>) -> Result<()>;
        let refused: [Change; 5] = [
            &|w| w.put(&k, b"v2", 5).map(drop),
            &|w| {
                w.put_chunk(3, b"a")?;
                w.put_new_chunk(3, b"b")
            },
            &|w| w.end(&k, 4).map(drop),
            &|w| {
                w.put(&ElemKey::new(10, RecordType::Inode, &[]), b"x", TID_MAX)
                    .map(drop)
            },
            &|w| {
                w.put(&k, b"v2", 6)?;
                w.log_tid(5, 60)
            },
        ];
        for f in refused {
            let e = s.write(|w| f(w)).unwrap_err();
            assert!(e.is_invariant(), "{e}");
            assert!(e.to_string().starts_with("INVARIANT VIOLATED"), "{e}");
        }
        let r = s.read().unwrap();
        let e = r.get(&k).unwrap().unwrap();
        assert_eq!((e.payload.as_slice(), e.create_tid), (&b"v1"[..], 5));
        assert_eq!(r.tids_after(0).unwrap(), vec![(5, 50)]);
        assert!(r.chunk(3).unwrap().is_none());
        drop(r);
        s.write(|w| w.log_tid(6, 60)).unwrap();
    }

    #[test]
    fn prune_respects_retained_tids() {
        let (_d, s) = store();
        let k = ElemKey::new(1, RecordType::Inode, &[]);
        for tid in 1..=5u64 {
            s.write(|w| w.put(&k, &[tid as u8], tid)).unwrap();
        }
        // Versions 1..4 are ended (at 2..5). Keep tid 2 visible.
        let removed = s.write(|w| w.prune(0, 5, &[2], false)).unwrap();
        let mut got: Vec<u64> = removed.iter().map(|e| e.create_tid).collect();
        got.sort();
        assert_eq!(got, vec![1, 3, 4]);
        let r = s.read().unwrap();
        assert_eq!(r.get_asof(&k, 2).unwrap().unwrap().payload, vec![2]);
        assert!(r.get_asof(&k, 3).unwrap().is_none());
        assert_eq!(r.get(&k).unwrap().unwrap().payload, vec![5]);
    }

    #[test]
    fn scan_asof_versions_and_dry_run() {
        let (_d, s) = store();
        let k = |i: u64| ElemKey::new(3, RecordType::DirEntry, &i.to_be_bytes());
        s.write(|w| {
            w.put(&k(1), b"a1", 1)?;
            w.put(&k(2), b"b1", 1)?;
            Ok::<_, MetaError>(())
        })
        .unwrap();
        s.write(|w| w.put(&k(1), b"a2", 2)).unwrap();
        s.write(|w| w.end(&k(2), 3)).unwrap();
        s.write(|w| w.put(&k(3), b"c4", 4)).unwrap();
        let r = s.read().unwrap();
        let at = |t| -> Vec<Vec<u8>> {
            let p = ElemKey::prefix(3, RecordType::DirEntry);
            r.scan_asof(&p, t)
                .unwrap()
                .into_iter()
                .map(|e| e.payload)
                .collect()
        };
        assert_eq!(at(1), vec![b"a1".to_vec(), b"b1".to_vec()]);
        assert_eq!(at(2), vec![b"a2".to_vec(), b"b1".to_vec()]);
        assert_eq!(at(3), vec![b"a2".to_vec()]);
        assert_eq!(at(4), vec![b"a2".to_vec(), b"c4".to_vec()]);
        let v: Vec<(u64, u64)> = r
            .versions(&k(1))
            .unwrap()
            .iter()
            .map(|e| (e.create_tid, e.delete_tid))
            .collect();
        assert_eq!(v, vec![(1, 2), (2, TID_MAX)]);
        drop(r);
        let would = s.write(|w| w.prune(0, 4, &[], true)).unwrap();
        assert_eq!(would.len(), 2);
        assert_eq!(s.read().unwrap().sizes().unwrap().1, 2, "dry run removed");
        let done = s.write(|w| w.prune(0, 4, &[], false)).unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!(s.read().unwrap().sizes().unwrap().1, 0);
    }

    #[test]
    fn current_lookup_cost_is_flat_with_history() {
        // Not a timing test: counts that the live table holds one element per
        // key however many versions exist.
        let (_d, s) = store();
        let k = ElemKey::new(9, RecordType::Inode, &[]);
        s.write(|w| {
            for tid in 1..=1000u64 {
                w.put(&k, b"x", tid)?;
            }
            Ok::<_, MetaError>(())
        })
        .unwrap();
        let (live, hist, _) = s.read().unwrap().sizes().unwrap();
        assert_eq!((live, hist), (1, 999));
    }

    #[test]
    fn scan_prefix() {
        let (_d, s) = store();
        s.write(|w| {
            for i in 0..10u64 {
                w.put(&ElemKey::extent(3, i), b"e", 1)?;
            }
            w.put(&ElemKey::new(3, RecordType::Inode, &[]), b"i", 1)?;
            w.put(&ElemKey::new(4, RecordType::Extent, &[0; 8]), b"o", 1)?;
            Ok::<_, MetaError>(())
        })
        .unwrap();
        let r = s.read().unwrap();
        assert_eq!(
            r.scan(&ElemKey::prefix(3, RecordType::Extent), None, usize::MAX)
                .unwrap()
                .len(),
            10
        );
        assert_eq!(
            r.scan(&ElemKey::object_prefix(3), None, usize::MAX)
                .unwrap()
                .len(),
            11
        );
        let from = ElemKey::new(3, RecordType::Extent, &5u64.to_be_bytes());
        assert_eq!(
            r.scan(
                &ElemKey::prefix(3, RecordType::Extent),
                Some(from.as_bytes()),
                3
            )
            .unwrap()
            .len(),
            3
        );
    }
}

mod born_tests {
    //! The index of live elements by create TID (`born_v1`).
    use super::super::*;
    use crate::key::RecordType;

    fn born(s: &MetaStore, since: u64) -> Vec<(u64, Vec<u8>)> {
        let r = s.read().unwrap();
        let v = r.born_after(since).unwrap();
        v.into_iter().map(|e| (e.create_tid, e.payload)).collect()
    }

    #[test]
    fn the_index_follows_puts_ends_and_removals() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        let k = |i: u64| ElemKey::new(i, RecordType::Inode, &[]);
        s.write(|w| {
            w.put(&k(1), b"a1", 1)?;
            w.put(&k(2), b"b1", 1)?;
            w.set_counter("last_tid", 1)
        })
        .unwrap();
        s.write(|w| {
            w.put(&k(1), b"a2", 2)?;
            w.end(&k(2), 2)?;
            w.put(&k(3), b"c2", 2)?;
            w.set_counter("last_tid", 2)
        })
        .unwrap();
        assert_eq!(born(&s, 0), vec![(2, b"a2".to_vec()), (2, b"c2".to_vec())]);
        assert!(born(&s, 2).is_empty());
        s.write(|w| w.remove_live(&k(3))).unwrap();
        assert_eq!(born(&s, 1), vec![(2, b"a2".to_vec())]);
        let ended = s.read().unwrap().ended_after(1).unwrap();
        let ended: Vec<_> = ended.iter().map(|e| (e.create_tid, e.delete_tid)).collect();
        assert_eq!(ended, vec![(1, 2), (1, 2)]);
    }

    #[test]
    fn a_pool_written_without_the_index_gets_it_rebuilt_at_open() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        let k = ElemKey::new(7, RecordType::Inode, &[]);
        s.write(|w| {
            w.put(&k, b"old", 1)?;
            w.set_counter("last_tid", 1)
        })
        .unwrap();
        // A release without the index writes a new element and a new TID.
        {
            let db = s.db().unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut live = txn.open_table(LIVE).unwrap();
                let k2 = ElemKey::new(8, RecordType::Inode, &[]);
                live.insert(
                    k2.as_bytes(),
                    crate::element::encode_value(k2.as_bytes(), 5, b"new").as_slice(),
                )
                .unwrap();
                live.insert(
                    k.as_bytes(),
                    crate::element::encode_value(k.as_bytes(), 5, b"mod").as_slice(),
                )
                .unwrap();
                let mut c = txn.open_table(COUNTERS).unwrap();
                c.insert("last_tid", 5).unwrap();
            }
            txn.commit().unwrap();
        }
        drop(s);
        let s = MetaStore::open(&path, 1 << 20, PageCache::new()).unwrap();
        assert_eq!(
            born(&s, 0),
            vec![(5, b"mod".to_vec()), (5, b"new".to_vec())]
        );
    }
}

pub(super) mod dedup_batch_tests {
    //! Dedup index entries wait in RAM and reach `dedup_v2` in batches
    //! (`dedup/pending.rs`).
    use super::super::*;

    fn hash(i: u8) -> [u8; 32] {
        [i; 32]
    }

    fn table(s: &MetaStore) -> Vec<([u8; 6], u64)> {
        let mut v = Vec::new();
        s.read()
            .unwrap()
            .for_each_dedup(|k, id| v.push((k, id)))
            .unwrap();
        v
    }

    fn found(s: &MetaStore, i: u8) -> Option<u64> {
        s.read().unwrap().dedup(&hash(i)).unwrap()
    }

    fn put(s: &MetaStore, i: u8, chunk: u64) {
        s.write(|w| w.put_dedup(&hash(i), chunk)).unwrap();
    }

    #[test]
    fn entries_are_found_while_they_wait_and_written_in_one_batch() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        s.dedup_pending().set_batch(3);
        put(&s, 1, 10);
        put(&s, 2, 20);
        assert_eq!((found(&s, 1), found(&s, 2)), (Some(10), Some(20)));
        assert!(table(&s).is_empty(), "written before the batch");
        // A failed transaction adds nothing.
        let r = s.write(|w| {
            w.put_dedup(&hash(4), 40)?;
            Err::<(), _>(MetaError::Db("test".into()))
        });
        assert!(r.is_err());
        assert_eq!(found(&s, 4), None);
        // The chunk of a waiting entry is removed: the entry goes.
        s.write(|w| w.remove_dedup(&hash(2), 20)).unwrap();
        assert_eq!(found(&s, 2), None);
        put(&s, 3, 30);
        assert_eq!(s.dedup_pending().len(), 2);
        put(&s, 5, 50);
        let keys = |v: &[u8]| {
            v.iter()
                .map(|&i| (dedup::key(&hash(i)), i as u64 * 10))
                .collect::<Vec<_>>()
        };
        assert_eq!(table(&s), keys(&[1, 3, 5]), "the batch");
        assert!(s.dedup_pending().is_empty());
        // A removal reaches the table too.
        s.write(|w| w.remove_dedup(&hash(3), 30)).unwrap();
        assert_eq!(table(&s), keys(&[1, 5]));
        // Closing writes what waits; a store opened again finds it.
        put(&s, 6, 60);
        s.drain().unwrap();
        assert_eq!(table(&s), keys(&[1, 5, 6]));
        drop(s);
        let s = MetaStore::open(&d.path().join("m.redb"), 1 << 20, PageCache::new()).unwrap();
        assert_eq!(found(&s, 6), Some(60));
    }

    /// Stores chunk `id` with its entry; its record is the hash itself
    /// (what `reindex_dedup`'s reader gives back in these tests).
    fn store_chunk(s: &MetaStore, i: u8, id: u64) {
        s.write(|w| {
            w.put_chunk(id, &hash(i))?;
            w.put_dedup(&hash(i), id)?;
            w.set_counter("next_chunk", id + 1)
        })
        .unwrap();
    }

    fn reindex(s: &MetaStore) -> u64 {
        s.reindex_dedup(|raw| Some(raw.to_vec())).unwrap()
    }

    #[test]
    fn entries_a_crash_lost_are_indexed_again_at_open() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        store_chunk(&s, 1, 10);
        s.drain().unwrap();
        store_chunk(&s, 2, 11);
        store_chunk(&s, 3, 12);
        s.write(|w| {
            w.remove_chunk(12)?;
            w.remove_dedup(&hash(3), 12)
        })
        .unwrap();
        let s = reopen_without_drain(s, &path); // as after a crash
        assert_eq!(found(&s, 1), Some(10), "in the table before the crash");
        assert_eq!(found(&s, 2), None, "lost with the crash");
        assert_eq!(reindex(&s), 1, "chunk 10 was in the table, 12 is gone");
        assert_eq!((found(&s, 2), found(&s, 3)), (Some(11), None));
        let want = |v: &[(u8, u64)]| {
            v.iter()
                .map(|&(i, id)| (dedup::key(&hash(i)), id))
                .collect::<Vec<_>>()
        };
        assert_eq!(table(&s), want(&[(1, 10), (2, 11)]), "written at once");
        assert_eq!(reindex(&s), 0, "nothing left to index");
    }

    #[test]
    fn a_damaged_chunk_record_is_left_out_of_the_reindex() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        store_chunk(&s, 1, 0);
        store_chunk(&s, 2, 1);
        let s = reopen_without_drain(s, &path);
        // The reader gives no hash for record 1 (as ChunkRec::decode fails
        // on a damaged record): it is left out, the other one indexed.
        let n = s
            .reindex_dedup(|raw| (raw != hash(2)).then(|| raw.to_vec()))
            .unwrap();
        assert_eq!(n, 1);
        assert_eq!((found(&s, 1), found(&s, 2)), (Some(0), None));
    }

    pub(in crate::store) fn reopen_without_drain(s: MetaStore, path: &Path) -> MetaStore {
        drop(s);
        MetaStore::open(path, 1 << 20, PageCache::new()).unwrap()
    }

    #[test]
    fn a_store_without_the_counter_was_indexed_in_full() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        store_chunk(&s, 1, 0);
        s.write(|w| {
            w.counters.remove(DEDUP_INDEXED)?;
            Ok::<_, MetaError>(())
        })
        .unwrap();
        assert_eq!(reindex(&s), 0, "an older release wrote every entry");
        let r = s.read().unwrap();
        assert_eq!(r.counter(DEDUP_INDEXED).unwrap(), 1);
    }
}

mod salvage {
    use super::super::*;
    use crate::key::RecordType;

    fn key(i: u64) -> ElemKey {
        ElemKey::new(i, RecordType::Inode, &[])
    }

    /// A store of 3000 elements, one TID per 100, closed: its path.
    fn written() -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        for batch in 0..30u64 {
            s.write(|w| {
                for i in batch * 100..(batch + 1) * 100 {
                    w.put(&key(i), b"LIVEPAYLOAD", batch + 1)?;
                }
                Ok::<_, MetaError>(())
            })
            .unwrap();
        }
        drop(s);
        // Closed as a pool's store is: opened (verified) and closed again.
        drop(MetaStore::open(&path, 1 << 20, crate::PageCache::new()).unwrap());
        (d, path)
    }

    /// Offsets of the 4 KiB pages holding creation index entries (the
    /// create TID, little-endian, right before the element key) of the
    /// elements of TID `tid`, and no live payload.
    fn born_pages(bytes: &[u8], tid: u64) -> Vec<usize> {
        let entry = |i: u64| [&tid.to_le_bytes()[..], key(i).as_bytes()].concat();
        let first = (tid - 1) * 100;
        bytes
            .chunks(4096)
            .enumerate()
            .filter(|(_, p)| !p.windows(11).any(|w| w == b"LIVEPAYLOAD"))
            .filter(|(_, p)| {
                (first..first + 100)
                    .filter(|i| p.windows(entry(*i).len()).any(|w| w == entry(*i)))
                    .count()
                    > 10
            })
            .map(|(n, _)| n * 4096)
            .collect()
    }

    #[test]
    fn a_whole_creation_index_vouches_for_absence() {
        let (_d, path) = written();
        let s = MetaStore::open_salvage(&path).unwrap();
        assert!(s.named.complete);
        assert_eq!(s.named.keys.len(), 3000);
        assert!(s.read().unwrap().vouches_for_absence());
    }

    /// A damaged page of the creation index: the names on both sides of it
    /// are read, and the view no longer calls a key nobody finds absent.
    /// (redb is built without debug assertions in every profile: with them
    /// it reads every page at open, see Cargo.toml.)
    #[test]
    fn a_damaged_creation_index_is_read_from_both_ends_and_vouches_for_nothing() {
        let (_d, path) = written();
        let mut bytes = std::fs::read(&path).unwrap();
        let pages = born_pages(&bytes, 15);
        assert!(!pages.is_empty(), "no leaf of the creation index found");
        bytes[pages[0]..pages[0] + 64].fill(0xa5);
        std::fs::write(&path, &bytes).unwrap();
        let s = MetaStore::open_salvage(&path).unwrap();
        assert!(!s.named.complete, "the damaged page went unnoticed");
        let keys = &s.named.keys;
        assert!(keys.len() < 3000, "{} names", keys.len());
        assert!(keys.contains(key(0).as_bytes()), "the first pass");
        assert!(keys.contains(key(2999).as_bytes()), "the pass back");
        assert!(!s.read().unwrap().vouches_for_absence());
    }
}

/// Sealed values: ended and rolled back without being opened, stored by a
/// store without the key and read by one with it.
mod sealed_values {
    use super::super::*;
    use crate::element::Opaque;
    use crate::key::RecordType;
    use std::sync::Arc;

    fn keys() -> Arc<cairn_crypt::PoolKeys> {
        Arc::new(cairn_crypt::PoolKeys::derive(
            &cairn_crypt::DataKey::random(),
            cairn_crypt::Cipher::Xaes256Gcm,
        ))
    }

    fn reopen(d: &tempfile::TempDir, s: MetaStore) -> MetaStore {
        drop(s);
        MetaStore::open(&d.path().join("m.redb"), 1 << 20, PageCache::new()).unwrap()
    }

    #[test]
    fn history_keeps_the_seal_and_a_keyless_store_moves_it_as_it_is() {
        let d = tempfile::tempdir().unwrap();
        let k = keys();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        assert!(s.keep_sealed());
        let key = ElemKey::new(9, RecordType::Extent, &0u64.to_be_bytes());
        let other = ElemKey::new(9, RecordType::Inode, &[]);
        let v1 = Opaque::seal(&k.elements, key.as_bytes(), 10, b"first", Some(&[4, 5]));
        let v2 = Opaque::seal(&k.elements, key.as_bytes(), 20, b"second", Some(&[6]));
        let ino = Opaque::seal(&k.elements, other.as_bytes(), 10, b"inode", None);
        s.write(|w| {
            w.put_sealed(&key, &v1, 10)?;
            w.put_sealed(&other, &ino, 10)
        })
        .unwrap();
        let ended = s.write(|w| w.put_sealed(&key, &v2, 20)).unwrap().unwrap();
        // Without the key, payloads are the sealed bytes and carry their
        // chunk ids in the clear.
        assert_eq!(ended.payload, v1);
        assert_eq!(
            Opaque(&ended.payload).chunks(key.as_bytes()).unwrap(),
            Some(vec![4, 5])
        );
        let r = s.read().unwrap();
        assert_eq!(r.get(&key).unwrap().unwrap().payload, v2);
        drop(r);
        // Rolled back to TID 15: the first version is live again, as sealed.
        s.write(|w| w.rollback_to(15)).unwrap();
        let s = reopen(&d, s);
        assert!(s.seal_values(k.clone()));
        let r = s.read().unwrap();
        assert_eq!(r.get(&key).unwrap().unwrap().payload, b"first");
        assert_eq!(r.get(&other).unwrap().unwrap().payload, b"inode");
        drop(r);
        // With the key: an end keeps the seal, the history reads opened.
        s.write(|w| w.put(&key, b"third", 30)).unwrap();
        let r = s.read().unwrap();
        assert_eq!(r.get_asof(&key, 25).unwrap().unwrap().payload, b"first");
        assert_eq!(r.get(&key).unwrap().unwrap().payload, b"third");
        drop(r);
        // Another pool's key opens nothing.
        let s = reopen(&d, s);
        assert!(s.seal_values(keys()));
        assert!(s.read().unwrap().get(&other).is_err());
    }

    #[test]
    fn chunk_ids_in_the_clear_are_bound_and_damage_is_refused() {
        let k = keys();
        let key = ElemKey::new(3, RecordType::Extent, &0u64.to_be_bytes());
        let v = Opaque::seal(&k.elements, key.as_bytes(), 7, b"extent", Some(&[11, 12]));
        assert_eq!(
            Opaque(&v).open(&k.elements, key.as_bytes(), 7).unwrap(),
            b"extent"
        );
        // Another id in the clear, TID or key: refused by the seal.
        let mut moved = v.clone();
        moved[3] ^= 1;
        assert!(Opaque(&moved).open(&k.elements, key.as_bytes(), 7).is_err());
        assert!(Opaque(&v).open(&k.elements, key.as_bytes(), 8).is_err());
        let other = ElemKey::new(4, RecordType::Extent, &0u64.to_be_bytes());
        assert!(Opaque(&v).open(&k.elements, other.as_bytes(), 7).is_err());
        // Payloads that are not sealed values are errors, never a panic.
        for bad in [&[][..], &[0][..], &[1, 5, 0][..], &[2; 40][..], &v[..20]] {
            assert!(Opaque(bad).chunks(key.as_bytes()).is_err(), "{bad:?}");
        }
    }
}
