//! Fuzz tests (issue 15) of the filesystem layer's decoders of bytes read
//! from the pool's files and the metadata store: the superblock, device
//! records, inode, directory entry and extent payloads (v1, and v2 with
//! pieces), directory entry keys and snapshot records. Random bytes, and
//! valid encodings damaged by `cairn_fuzzkit` mutations (checksummed ones
//! resealed half of the time, so the checks behind the checksum are
//! reached). A decode never panics, allocates in proportion to its input,
//! and gives a typed error or a value that encodes back the same; a valid
//! encoding round-trips.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use cairn_devices::{DeviceClass, DeviceRole, Emulation};
use cairn_fs::history::snapshot::{Snapshot, SnapshotKind};
use cairn_fs::pool::superblock::Superblock;
use cairn_fs::pool::DeviceDesc;
use cairn_fs::types::{dirent_subkey, split_dirent_subkey, DirEnt, Extent, Piece};
use cairn_fs::{FileKind, FsError, Inode, Time};
use cairn_fuzzkit::proptest::prelude::*;
use cairn_fuzzkit::{apply, bytes, config, metered, mutations, prefixes, Usage};

fn within(used: Usage, len: usize) -> Result<(), TestCaseError> {
    prop_assert!(used.largest <= 4 * len + 512, "{used:?} for {len} bytes");
    Ok(())
}

/// Rewrites a trailing crc32c over `b[..at]`, stored at `at`.
fn reseal_at(b: &mut [u8], at: usize) {
    if b.len() >= at + 4 {
        let crc = crc32c::crc32c(&b[..at]);
        b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

fn arb_superblock() -> impl Strategy<Value = Superblock> {
    (any::<[u8; 16]>(), 12u32..=20, 0u32..=10, any::<u64>()).prop_map(|(uuid, r, s, created)| {
        Superblock {
            uuid,
            record_size: 1 << r,
            segment_size: (1u64 << (r + 2 + s)).min(1 << 30).max(4 << r),
            created,
        }
    })
}

fn check_superblock(b: &[u8]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| Superblock::decode(b, "sb"));
    within(used, 64)?;
    match r {
        Ok(s) => {
            let rs = s.record_size as u64;
            prop_assert!(rs.is_power_of_two() && (4096..=1 << 20).contains(&rs));
            prop_assert!(s.segment_size.is_power_of_two());
            prop_assert!(s.segment_size >= 4 * rs && s.segment_size <= 1 << 30);
            prop_assert_eq!(Superblock::decode(&s.encode(), "sb").unwrap(), s);
        }
        Err(e) => prop_assert!(
            matches!(e, FsError::NotAPool(_) | FsError::UnknownVersion { .. }),
            "{e}"
        ),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(30000))]

    #[test]
    fn fuzz_superblock_random_bytes(b in bytes(100)) {
        check_superblock(&b)?;
    }

    #[test]
    fn fuzz_superblock_mutated(s in arb_superblock(), m in mutations(), seal in any::<bool>()) {
        let mut b = apply(&s.encode(), &m);
        if seal {
            reseal_at(&mut b, 48);
        }
        check_superblock(&b)?;
    }

    #[test]
    fn fuzz_superblock_round_trips(s in arb_superblock()) {
        let b = s.encode();
        prop_assert_eq!(Superblock::decode(&b, "sb").unwrap(), s);
        for p in prefixes(&b[..52]) {
            prop_assert!(Superblock::decode(p, "sb").is_err());
        }
    }
}

#[test]
fn fuzz_regression_superblock_record_size_zero() {
    // A superblock with good checksum and a record size of 0 decoded, and
    // the layers above divide by the record size.
    let mut b = Superblock {
        uuid: [1; 16],
        record_size: 0,
        segment_size: 4 << 20,
        created: 1,
    }
    .encode();
    reseal_at(&mut b, 48);
    assert!(matches!(
        Superblock::decode(&b, "sb"),
        Err(FsError::NotAPool(_))
    ));
}

fn arb_device_desc() -> impl Strategy<Value = DeviceDesc> {
    let emulate = prop::option::of(any::<(u64, u64)>());
    (
        any::<(u32, u32)>(),
        0u8..3,
        any::<bool>(),
        "[ -~]{0,40}",
        emulate,
        (
            prop::option::of("[a-z0-9._-]{1,12}"),
            prop::option::of(any::<u64>()),
        ),
    )
        .prop_map(
            |((version, id), rank, cache, path, e, (domain, log))| DeviceDesc {
                version,
                id,
                class: DeviceClass::from_rank(rank).unwrap(),
                path: path.into(),
                role: if cache {
                    DeviceRole::Cache
                } else {
                    DeviceRole::Tier
                },
                emulate: e.map(|(latency_us, bytes_per_sec)| Emulation {
                    latency_us,
                    bytes_per_sec,
                }),
                domain,
                log,
            },
        )
}

fn check_device_desc(b: &[u8]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| DeviceDesc::decode(b));
    within(used, b.len())?;
    match r {
        Ok(d) => prop_assert_eq!(
            DeviceDesc::decode(&d.encode()).unwrap().encode(),
            d.encode()
        ),
        Err(e) => prop_assert!(matches!(e, FsError::Io(_)), "{e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn fuzz_device_desc_random_bytes(b in bytes(200)) {
        check_device_desc(&b)?;
    }

    #[test]
    fn fuzz_device_desc_mutated(d in arb_device_desc(), m in mutations()) {
        check_device_desc(&apply(&d.encode(), &m))?;
    }

    #[test]
    fn fuzz_device_desc_round_trips(d in arb_device_desc()) {
        let b = d.encode();
        prop_assert_eq!(DeviceDesc::decode(&b).unwrap().encode(), b.clone());
        for p in prefixes(&b) {
            prop_assert!(DeviceDesc::decode(p).is_err());
        }
    }
}

fn arb_kind() -> impl Strategy<Value = FileKind> {
    (1u8..=7).prop_map(|k| FileKind::from_u8(k).unwrap())
}

fn arb_inode() -> impl Strategy<Value = Inode> {
    let t = any::<(i64, u32)>().prop_map(|(secs, nsec)| Time { secs, nsec });
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

/// An extent with 0 to 5 sorted, disjoint pieces inside its length.
fn arb_extent() -> impl Strategy<Value = Extent> {
    let cuts = prop::collection::vec(any::<(u32, u32, u64, u32)>(), 0..6);
    (any::<u64>(), 1u32..=1 << 20, cuts).prop_map(|(chunk, len, cuts)| {
        let mut pieces = Vec::new();
        let mut at = 0u32;
        for (gap, plen, c, from) in cuts {
            let off = at + gap % 4096;
            let plen = 1 + plen % 8192;
            if off as u64 + plen as u64 > len as u64 {
                break;
            }
            pieces.push(Piece {
                off,
                len: plen,
                chunk: c,
                from,
            });
            at = off + plen;
        }
        Extent { chunk, len, pieces }
    })
}

/// Decodes `b` as each payload and key kind: none panics, each gives a
/// typed error or a value that encodes back the same.
fn check_payloads(b: &[u8]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| Inode::decode(7, b));
    within(used, 0)?;
    if let Ok(i) = r {
        prop_assert_eq!(Inode::decode(7, &i.encode()).unwrap(), i);
    }
    let (r, used) = metered(|| DirEnt::decode(b));
    within(used, 0)?;
    if let Ok(d) = r {
        prop_assert_eq!(DirEnt::decode(&d.encode()).unwrap(), d);
    }
    let (r, used) = metered(|| Extent::decode(b));
    within(used, b.len())?;
    if let Ok(x) = r {
        prop_assert_eq!(&x.encode()[..], b);
        let mut end = 0;
        for p in &x.pieces {
            prop_assert!(p.len > 0 && p.off >= end && p.off as u64 + p.len as u64 <= x.len as u64);
            end = p.off + p.len;
        }
    }
    if let Ok((hash, name)) = split_dirent_subkey(b) {
        prop_assert_eq!(name.len() + 9, b.len());
        prop_assert_eq!(&hash.to_be_bytes()[..], &b[..8]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(10000))]

    #[test]
    fn fuzz_payloads_random_bytes(b in bytes(200)) {
        check_payloads(&b)?;
    }

    #[test]
    fn fuzz_inode_mutated(i in arb_inode(), m in mutations()) {
        check_payloads(&apply(&i.encode(), &m))?;
    }

    #[test]
    fn fuzz_dirent_mutated(ino in any::<u64>(), kind in arb_kind(), m in mutations()) {
        check_payloads(&apply(&DirEnt { ino, kind }.encode(), &m))?;
    }

    #[test]
    fn fuzz_extent_mutated(x in arb_extent(), m in mutations()) {
        check_payloads(&apply(&x.encode(), &m))?;
    }

    #[test]
    fn fuzz_dirent_key_mutated(name in bytes(255), m in mutations()) {
        check_payloads(&apply(&dirent_subkey(&name), &m))?;
    }

    #[test]
    fn fuzz_payloads_round_trip(
        i in arb_inode(),
        ino in any::<u64>(),
        kind in arb_kind(),
        x in arb_extent(),
        name in bytes(255),
    ) {
        let (ib, db, xb) = (i.encode(), DirEnt { ino, kind }.encode(), x.encode());
        prop_assert_eq!(Inode::decode(i.ino, &ib).unwrap(), i);
        prop_assert_eq!(DirEnt::decode(&db).unwrap(), DirEnt { ino, kind });
        prop_assert_eq!(Extent::decode(&xb).unwrap(), x);
        let k = dirent_subkey(&name);
        prop_assert_eq!(split_dirent_subkey(&k).unwrap().1, &name[..]);
        for p in prefixes(&ib) {
            prop_assert!(Inode::decode(1, p).is_err());
        }
        for p in prefixes(&db) {
            prop_assert!(DirEnt::decode(p).is_err());
        }
        for p in prefixes(&xb) {
            prop_assert!(Extent::decode(p).is_err());
        }
        for p in prefixes(&k) {
            prop_assert!(split_dirent_subkey(p).is_err());
        }
    }
}

#[test]
fn fuzz_regression_dirent_key_shorter_than_its_header() {
    // A damaged directory entry key of fewer than 9 bytes: readdir, as-of
    // views, tree hashes, check and salvage sliced it at 9 and panicked.
    assert!(split_dirent_subkey(b"short").is_err());
}

fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
    let f = any::<(u64, u64, bool, Option<[u8; 32]>, u64, u64)>();
    ("[a-z0-9-]{1,20}", f).prop_map(|(name, f)| Snapshot {
        name,
        tid: f.0,
        time_ns: f.1,
        kind: if f.2 {
            SnapshotKind::Auto
        } else {
            SnapshotKind::Named
        },
        hash: f.3,
        files: f.4,
        bytes: f.5,
    })
}

fn check_snapshot(b: &[u8]) -> Result<(), TestCaseError> {
    let (r, used) = metered(|| Snapshot::decode("s", b));
    within(used, 64)?;
    match r {
        Ok(s) => prop_assert_eq!(Snapshot::decode("s", &s.encode()).unwrap(), s),
        Err(e) => prop_assert!(matches!(e, FsError::Io(_)), "{e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(20000))]

    #[test]
    fn fuzz_snapshot_random_bytes(b in bytes(120)) {
        check_snapshot(&b)?;
    }

    #[test]
    fn fuzz_snapshot_mutated(s in arb_snapshot(), m in mutations(), seal in any::<bool>()) {
        let mut b = apply(&s.encode(), &m);
        if seal && b.len() >= 4 {
            let n = b.len() - 4;
            reseal_at(&mut b, n);
        }
        check_snapshot(&b)?;
    }

    #[test]
    fn fuzz_snapshot_round_trips(s in arb_snapshot()) {
        let b = s.encode();
        prop_assert_eq!(Snapshot::decode(&s.name, &b).unwrap(), s);
        for p in prefixes(&b) {
            prop_assert!(Snapshot::decode("s", p).is_err());
        }
    }
}
