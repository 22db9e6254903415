//! Fuzz tests (issue 15) of the intent record payload decoder: random
//! bytes, and payloads of valid entries damaged by `cairn_fuzzkit`
//! mutations. A decode never panics, allocates in proportion to the
//! payload, and gives a typed error or entries whose ranges fit the record
//! size and that encode back to the same entries; valid entries round-trip.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]

use super::*;
use crate::history::snapshot::SnapshotKind;
use crate::types::{dirent_subkey, FileKind, Time};
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations, prefixes};

const RS: u64 = 64 << 10;

fn arb_kind() -> impl Strategy<Value = FileKind> {
    (1u8..=7).prop_map(|k| FileKind::from_u8(k).unwrap())
}

fn arb_inode() -> impl Strategy<Value = Inode> {
    let t = (any::<i64>(), 0u32..1_000_000_000).prop_map(|(secs, nsec)| Time { secs, nsec });
    let ids = any::<(u64, u16, u32, u32, u32, u64, u32, u64)>();
    (ids, arb_kind(), [t.clone(), t.clone(), t.clone(), t]).prop_map(|(f, kind, [a, m, c, cr])| {
        Inode {
            ino: f.0,
            kind,
            perm: f.1,
            uid: f.2,
            gid: f.3,
            nlink: f.4,
            size: f.5,
            atime: a,
            mtime: m,
            ctime: c,
            crtime: cr,
            rdev: f.6,
            parent: f.7,
        }
    })
}

/// A block entry inside the record size: (len, lo, bytes).
fn arb_block() -> impl Strategy<Value = (usize, usize, Vec<u8>)> {
    (0..=RS as usize, bytes(200)).prop_flat_map(|(len, b)| {
        let b: Vec<u8> = b.into_iter().take(len).collect();
        (Just(len), 0..=len - b.len(), Just(b))
    })
}

fn arb_entry() -> impl Strategy<Value = Entry<'static>> {
    let leak = |b: Vec<u8>| -> &'static [u8] { Box::leak(b.into_boxed_slice()) };
    let blk = 0..u64::MAX / RS;
    prop_oneof![
        any::<u64>().prop_map(Entry::Delete),
        any::<(u64, u64)>().prop_map(|(ino, first)| Entry::Trunc { ino, first }),
        arb_inode().prop_map(Entry::Inode),
        (
            any::<u64>(),
            bytes(255),
            prop::option::of((any::<u64>(), arb_kind()))
        )
            .prop_map(move |(dir, name, e)| Entry::Dirent {
                dir,
                subkey: leak(dirent_subkey(&name)),
                ent: e.map(|(ino, kind)| DirEnt { ino, kind }),
            }),
        (any::<u64>(), bytes(100)).prop_map(move |(ino, t)| Entry::Symlink {
            ino,
            target: leak(t)
        }),
        (any::<u64>(), bytes(40), prop::option::of(bytes(100))).prop_map(move |(ino, n, v)| {
            Entry::Xattr {
                ino,
                name: leak(n),
                value: v.map(leak),
            }
        }),
        any::<(u64, bool)>().prop_map(|(ino, open)| Entry::Orphan { ino, open }),
        (any::<u64>(), blk.clone(), arb_block()).prop_map(move |(ino, blk, (len, lo, b))| {
            Entry::Block {
                ino,
                blk,
                len,
                lo,
                bytes: leak(b),
            }
        }),
        (any::<u64>(), blk.clone(), 1..=RS as usize, any::<u64>()).prop_map(
            |(ino, blk, len, chunk)| Entry::Stored {
                ino,
                blk,
                len,
                chunk
            }
        ),
        (
            any::<u64>(),
            blk,
            prop::collection::vec((0..RS as usize - 100, bytes(100)), 0..4)
        )
            .prop_map(move |(ino, blk, r)| Entry::Patch {
                ino,
                blk,
                ranges: r.into_iter().map(|(o, b)| (o, leak(b))).collect(),
            }),
        (
            "[a-z0-9_.-]{0,8}[a-z0-9_-](@[a-z0-9_-]{1,8})?",
            any::<(u64, u64, bool, Option<[u8; 32]>)>()
        )
            .prop_map(
                |(name, (tid, time_ns, auto, hash))| Entry::Snapshot(Snapshot {
                    name,
                    tid,
                    time_ns,
                    kind: if auto {
                        SnapshotKind::Auto
                    } else {
                        SnapshotKind::Named
                    },
                    hash,
                    files: tid / 3,
                    bytes: time_ns / 7,
                })
            ),
    ]
}

/// The payload `intent.rs` writes for these entries.
fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut w = Vec::new();
    for e in entries {
        match e {
            Entry::Delete(ino) => {
                w.push(T_DELETE);
                put_u64(&mut w, *ino);
            }
            Entry::Trunc { ino, first } => {
                w.push(T_TRUNC);
                put_u64(&mut w, *ino);
                put_u64(&mut w, *first);
            }
            Entry::Inode(i) => {
                w.push(T_INODE);
                put_u64(&mut w, i.ino);
                put_bytes(&mut w, &i.encode());
            }
            Entry::Dirent { dir, subkey, ent } => {
                w.push(T_DIRENT);
                put_u64(&mut w, *dir);
                put_bytes(&mut w, subkey);
                put_opt(&mut w, ent.map(|e| e.encode()).as_deref());
            }
            Entry::Symlink { ino, target } => {
                w.push(T_SYMLINK);
                put_u64(&mut w, *ino);
                put_bytes(&mut w, target);
            }
            Entry::Xattr { ino, name, value } => {
                w.push(T_XATTR);
                put_u64(&mut w, *ino);
                put_bytes(&mut w, name);
                put_opt(&mut w, *value);
            }
            Entry::Orphan { ino, open } => {
                w.push(T_ORPHAN);
                put_u64(&mut w, *ino);
                w.push(*open as u8);
            }
            Entry::Block {
                ino,
                blk,
                len,
                lo,
                bytes,
            } => {
                w.push(T_BLOCK);
                put_u64(&mut w, *ino);
                put_u64(&mut w, *blk);
                put_u32(&mut w, *len as u32);
                put_u32(&mut w, *lo as u32);
                put_bytes(&mut w, bytes);
            }
            Entry::Patch { ino, blk, ranges } => {
                w.push(T_PATCH);
                put_u64(&mut w, *ino);
                put_u64(&mut w, *blk);
                put_u32(&mut w, ranges.len() as u32);
                for (off, b) in ranges {
                    put_u32(&mut w, *off as u32);
                    put_bytes(&mut w, b);
                }
            }
            Entry::Stored {
                ino,
                blk,
                len,
                chunk,
            } => put_stored(&mut w, *ino, *blk, *len, *chunk),
            Entry::Snapshot(snap) => put_snapshot(&mut w, snap),
        }
    }
    w
}

fn check(b: &[u8]) -> std::result::Result<(), TestCaseError> {
    let (r, used) = metered(|| decode(b, RS));
    // Each entry takes at least 9 payload bytes, each patch range 8.
    let most = 2 * (b.len() / 8 + 1) * std::mem::size_of::<Entry>() + 4096;
    prop_assert!(used.largest <= most && used.total <= 4 * most, "{used:?}");
    match r {
        Ok(entries) => {
            for e in &entries {
                match e {
                    Entry::Block { len, lo, bytes, .. } => {
                        prop_assert!(*len as u64 <= RS && lo + bytes.len() <= *len)
                    }
                    Entry::Patch { ranges, .. } => {
                        for (off, b) in ranges {
                            prop_assert!((off + b.len()) as u64 <= RS);
                        }
                    }
                    Entry::Stored { len, .. } => prop_assert!(*len > 0 && *len as u64 <= RS),
                    _ => {}
                }
            }
            let again = encode(&entries);
            prop_assert_eq!(decode(&again, RS).unwrap(), entries);
        }
        Err(e) => prop_assert!(matches!(e, FsError::Io(_)), "{e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(10000))]

    #[test]
    fn fuzz_intent_record_random_bytes(b in bytes(300)) {
        check(&b)?;
    }

    #[test]
    fn fuzz_intent_record_mutated(e in prop::collection::vec(arb_entry(), 1..6), m in mutations()) {
        check(&apply(&encode(&e), &m))?;
    }

    #[test]
    fn fuzz_intent_record_round_trips(mut e in prop::collection::vec(arb_entry(), 0..6)) {
        // Snapshot entries end a record (as `snapshot_logged` writes it).
        e.sort_by_key(|x| matches!(x, Entry::Snapshot(_)));
        let b = encode(&e);
        prop_assert_eq!(decode(&b, RS).unwrap(), e);
        for p in prefixes(&b).skip(1) {
            // A payload cut inside an entry is refused; one cut between
            // two entries is a shorter valid payload.
            if let Ok(d) = decode(p, RS) {
                prop_assert_eq!(encode(&d), p);
            }
        }
    }
}

#[test]
fn a_change_after_a_snapshot_entry_is_refused() {
    let snap = Snapshot {
        name: "s".into(),
        tid: 7,
        time_ns: 1,
        kind: SnapshotKind::Named,
        hash: None,
        files: 0,
        bytes: 0,
    };
    let ok = [Entry::Delete(5), Entry::Snapshot(snap.clone())];
    assert_eq!(decode(&encode(&ok), RS).unwrap(), ok);
    let bad = [Entry::Snapshot(snap), Entry::Delete(5)];
    assert!(decode(&encode(&bad), RS).is_err());
}

#[test]
fn fuzz_regression_intent_patch_with_a_huge_count() {
    // A patch entry whose range count says 4 billion and whose ranges are
    // not there: an error once the payload runs out, nothing reserved.
    let mut b = vec![T_PATCH];
    put_u64(&mut b, 1);
    put_u64(&mut b, 0);
    put_u32(&mut b, u32::MAX);
    let (r, used) = metered(|| decode(&b, RS));
    assert!(r.is_err() && used.largest < 4096, "{used:?}");
}
