//! `cairn check` on a pool whose metadata store failed its integrity check
//! (`MetaError::Damaged`): the store is opened as a copy in RAM without
//! trusting it, the tree is walked from the root one guarded lookup at a
//! time, and every file whose inode, entries, extents or chunk records cannot
//! be read intact is named by path. A full pass over each table then reports
//! what failed there, since that damage may belong to no file the walk
//! reached. Nothing is written.
//!
//! `cairn mount --salvage` opens such a pool read-only the same way
//! (`open_salvage_pool`): every file whose records read intact is served,
//! the others give EIO, and nothing is written to the pool.

use crate::error::{FsError, Result};
use crate::maintenance::check::CheckReport;
use crate::maintenance::rebuild;
use crate::pool::config::PoolConfig;
use crate::pool::superblock::Superblock;
use crate::pool::{read_superblock, DeviceDesc, Pool, PoolPaths};
use crate::types::ROOT_INO;
use cairn_data::{ChunkRec, ChunkStore, SegmentRec};
use cairn_devices::{Device, DeviceRole, DeviceSet, HostStorage};
use cairn_meta::{MetaRead, MetaStore, PageCache, RecordType};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::Arc;

/// At most this many segment records are looked up one by one when a
/// full pass over the segment table stops at damage.
const MAX_SEGMENT_LOOKUPS: u64 = 1 << 22;

/// Opens, read-only, a pool whose metadata store failed its integrity
/// check (`cairn mount --salvage`): the store as a copy in RAM whose reads
/// are all guarded (its file is never written), the devices to read
/// chunks from and the segment records that can be read. No SSD cache
/// and no background work: nothing is written to the pool's devices.
pub fn open_salvage_pool(
    path: &Path,
    config: PoolConfig,
    secret: Option<&cairn_crypt::Secret>,
) -> Result<Pool> {
    let sb = read_superblock(path)?;
    let unlocked = crate::pool::key::unlock(path, sb.uuid, secret)?;
    let lock = crate::pool::take_lock(path)?;
    let meta = MetaStore::open_salvage(&PoolPaths::meta(path))?;
    if let Some((keys, _)) = &unlocked {
        meta.seal_values(keys.clone());
    }
    let r = meta.read()?;
    let storage = HostStorage::shared();
    let (devices, _) = pool_devices(&r, path, &sb, &config)?;
    let table = readable_segments(&r);
    // Best effort: the stripes that decode restore what they can.
    let stripes: Vec<(u64, cairn_data::StripeRec)> = (r.stripes().unwrap_or_default().iter())
        .filter_map(|(id, raw)| Some((*id, cairn_data::StripeRec::decode(raw).ok()?)))
        .collect();
    let next_segment = (r.counter("next_segment").unwrap_or(0))
        .max(table.iter().map(|(id, _)| id + 1).max().unwrap_or(1));
    drop(r);
    let set = Arc::new(DeviceSet::new(devices)?);
    let mut chunks =
        match ChunkStore::with_stripes(set.clone(), table.clone(), stripes, next_segment) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(
                    "the stripe table does not fit the segments ({e}): read without parity"
                );
                ChunkStore::new(set, table, next_segment)?
            }
        };
    chunks.set_ram_cache(config.read_cache_mib << 20);
    chunks.set_readahead(config.readahead_kib << 10);
    let keys = unlocked.as_ref().map(|(k, _)| k.clone());
    let encryption = unlocked.map(|(keys, info)| {
        chunks.set_codec(cairn_data::ChunkCodec::encrypted(keys));
        info
    });
    Ok(Pool {
        path: path.to_path_buf(),
        sb,
        config,
        meta,
        meta_pages: PageCache::new(),
        meta_home: None,
        chunks,
        mode_warnings: Vec::new(),
        lost: Default::default(),
        storage,
        // A salvage mount replays no intent log.
        log_devices: Vec::new(),
        encryption,
        names: crate::names::Names::of(keys.clone()),
        keys,
        _lock: lock,
    })
}

/// The pool's devices, opened, with their records: as the device table
/// says, or, when it or a record in it cannot be read, every file in the pool directory
/// whose header names this pool (devices elsewhere are then not found).
pub(crate) fn pool_devices(
    r: &MetaRead,
    path: &Path,
    sb: &Superblock,
    config: &PoolConfig,
) -> Result<(Vec<Device>, Vec<DeviceDesc>)> {
    let table = match r.devices() {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!("salvage: the device table cannot be read ({e}); looking for the pool's devices in {}", path.display());
            return devices_in_dir(path, sb);
        }
    };
    let (mut devs, mut descs) = (Vec::new(), Vec::new());
    for (_, raw) in table {
        let opened = DeviceDesc::decode(&raw).and_then(|d| {
            let dev = d.open(path, sb, &*HostStorage::shared(), &config.object_options())?;
            Ok((dev, d))
        });
        match opened {
            Ok((dev, d)) => {
                devs.push(dev);
                descs.push(d);
            }
            Err(e) => {
                tracing::warn!("salvage: a device record is damaged ({e}); looking for the pool's devices in {}", path.display());
                return devices_in_dir(path, sb);
            }
        }
    }
    Ok((devs, descs))
}

/// The files in the pool directory that are devices of this pool.
fn devices_in_dir(path: &Path, sb: &Superblock) -> Result<(Vec<Device>, Vec<DeviceDesc>)> {
    let (mut devs, mut descs) = (Vec::new(), Vec::new());
    let dir =
        std::fs::read_dir(path).map_err(|e| FsError::Io(format!("{}: {e}", path.display())))?;
    for e in dir
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
    {
        let storage = HostStorage::shared();
        let Ok(dev) = Device::open_with(&e.path(), sb.uuid, DeviceRole::Tier, None, &*storage)
        else {
            continue;
        };
        descs.push(DeviceDesc {
            version: 1,
            id: dev.id(),
            class: dev.class(),
            path: e.file_name().into(),
            role: DeviceRole::Tier,
            emulate: None,
            domain: None,
            log: (dev.header.log_len > 0).then_some(dev.header.log_len),
        });
        devs.push(dev);
    }
    if devs.is_empty() {
        return Err(FsError::Io(format!(
            "the device table cannot be read and no device of this pool is in {}",
            path.display()
        )));
    }
    Ok((devs, descs))
}

/// The segment records that can be read: a full pass, then, if damage
/// stopped it, a lookup of each other id below `next_segment` (a record
/// past a damaged page is often reachable from the root by another path).
/// Records that fail their checksum are left out (their chunks give EIO).
pub(crate) fn readable_segments(r: &MetaRead) -> Vec<(u64, SegmentRec)> {
    let (mut raw, stopped) = r.segments_until_damage();
    if let Some(e) = stopped {
        tracing::warn!("salvage: the segment table could not be read in one pass ({e}); looking its records up one by one");
        let seen: HashSet<u64> = raw.iter().map(|(id, _)| *id).collect();
        let next = r.counter("next_segment").unwrap_or(0);
        for id in (0..next.min(MAX_SEGMENT_LOOKUPS)).filter(|id| !seen.contains(id)) {
            if let Ok(Some(v)) = r.segment(id) {
                raw.push((id, v));
            }
        }
    }
    let mut bad = 0;
    let table: Vec<(u64, SegmentRec)> = raw
        .into_iter()
        .filter_map(|(id, v)| match SegmentRec::decode(&v) {
            Ok(rec) => Some((id, rec)),
            Err(_) => {
                bad += 1;
                None
            }
        })
        .collect();
    if bad > 0 {
        tracing::warn!(
            "salvage: {bad} segment record(s) fail their checksum; their chunks give EIO"
        );
    }
    table
}

/// The report for a pool whose metadata store is damaged: always has at
/// least one problem (the failed integrity check itself).
pub fn salvage_pool(pool: &Path, why: &str) -> Result<CheckReport> {
    crate::pool::key::refuse_salvage(pool)?;
    let sb = read_superblock(pool)?;
    let mut rep = CheckReport::default();
    rep.problems.push(format!(
        "metadata store {} failed its integrity check: {why}",
        PoolPaths::meta(pool).display()
    ));
    let store = match MetaStore::open_salvage(&PoolPaths::meta(pool)) {
        Ok(s) => s,
        Err(e) => {
            rep.problems.push(format!(
                "metadata store cannot be read at all ({e}): no file can be named"
            ));
            return Ok(rep);
        }
    };
    match store.read() {
        Ok(r) => {
            walk(&r, sb.record_size as u64, &mut rep);
            unattributed(&r, &mut rep);
        }
        Err(e) => rep.problems.push(format!(
            "metadata store cannot be read ({e}): no file can be named"
        )),
    }
    Ok(rep)
}

/// Walks the live tree from the root, naming each file whose records fail
/// (the same test a rebuild keeps a file by: `rebuild::object`).
fn walk(r: &MetaRead, rs: u64, rep: &mut CheckReport) {
    let segs: HashMap<u64, SegmentRec> = readable_segments(r).into_iter().collect();
    let mut chunks = BTreeMap::new();
    let mut q = VecDeque::from([(ROOT_INO, "/".to_string())]);
    let mut seen = HashSet::new();
    while let Some((ino, path)) = q.pop_front() {
        if !seen.insert(ino) {
            continue;
        }
        rep.inodes += 1;
        match rebuild::object(r, ino, rs, &segs, &mut chunks) {
            Ok(k) => {
                rep.extents += (k.elems.iter())
                    .filter(|e| e.key.rtype() == Some(RecordType::Extent))
                    .count() as u64;
                q.extend(rebuild::children(&k, &path));
            }
            Err(why) => rep.problems.push(format!("{path}: DAMAGED: {why}")),
        }
    }
    rep.chunks = chunks.len() as u64;
}

/// Full passes over the tables: failures here may be damage in records
/// that no file the walk reached uses (history, other tables).
fn unattributed(r: &MetaRead, rep: &mut CheckReport) {
    let mut bad = 0u64;
    let passes = [
        ("live elements", r.for_each_live(|_| {})),
        ("history elements", r.for_each_hist(|_| {})),
        (
            "chunk records",
            r.for_each_chunk(|_, raw| bad += ChunkRec::decode(raw).is_err() as u64),
        ),
        ("segment records", r.segments().map(|_| ())),
    ];
    for (table, res) in passes {
        if let Err(e) = res {
            rep.problems.push(format!(
                "{table}: could not be read to the end ({e}); records past that point are not attributed to a file"
            ));
        }
    }
    if bad > 0 {
        rep.problems
            .push(format!("{bad} chunk record(s) fail their checksum"));
    }
    if rep.problems.len() == 1 {
        rep.problems.push(
            "no file's current records are affected: the damage lies in pages that only \
             history, free-space or system tables use"
                .into(),
        );
    }
}
