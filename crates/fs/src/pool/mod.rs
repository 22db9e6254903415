//! A pool on disk: the directory with its superblock, config, metadata store
//! and devices. `mkfs` creates one; `Pool::open` opens one for exclusive use
//! (a lock file keeps a second process out). The superblock, the metadata
//! store, the intent log and the devices are opened through the pool's
//! `Storage` (the host's files unless a test chose a trace or fault
//! storage: `mkfs_with`, `Pool::open_with`). Files whose loss is harmless
//! (heat, the SSD cache index, the metadata reserve, the config, the lock)
//! stay on std::fs.

pub mod config;
pub mod key;
pub mod log_home;
pub mod meta_copies;
pub mod perms;
pub mod reserve;
pub mod superblock;

use crate::error::{FsError, Result};
use crate::pool::config::PoolConfig;
use crate::pool::superblock::{Superblock, SUPERBLOCK_LEN};
use crate::types::{Inode, Time, ROOT_INO};
use cairn_data::{ChunkRec, ChunkStore, SegmentRec};
use cairn_devices::device::{device_file_path, file_id, in_use, occupant, Occupant};
use cairn_devices::private::{private_options, DIR_MODE};
use cairn_devices::{
    Device, DeviceClass, DeviceError, DeviceRole, DeviceSet, DeviceSpec, Emulation, HostStorage,
    OpenHow, SsdCache, Storage,
};
use cairn_meta::{ElemKey, MetaStore, PageCache, RecordType};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const DEFAULT_RECORD_SIZE: u32 = 64 << 10;
pub const DEFAULT_SEGMENT_SIZE: u64 = 4 << 20;

pub struct MkfsOptions {
    pub devices: Vec<DeviceSpec>,
    pub record_size: u32,
    pub segment_size: u64,
    pub force: bool,
    /// Leave every device file sparse (no blocks reserved on the host).
    pub sparse: bool,
    /// A directory (on another disk) for the second copy of the metadata;
    /// by default it goes beside another tier device than the first, or
    /// beside the first copy when no other device can hold it.
    pub meta_mirror: Option<PathBuf>,
    /// Copies of the metadata to keep: 2 (the default) or 1 (recorded in
    /// the store as `meta_copies::META_COPIES`, so that no open adds a
    /// second).
    pub meta_copies: u32,
    /// Make a mirror pool: read-only, filled by mirror streams.
    pub mirror: bool,
    /// How many copies new data gets (`--redundancy`).
    pub redundancy: cairn_data::Policy,
    /// Where the intent log goes (`--intent-log`).
    pub intent_log: log_home::LogHome,
    /// Encrypt the pool, its data key wrapped by this secret (`--encrypt`).
    pub encrypt: Option<cairn_crypt::Secret>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            devices: vec![],
            record_size: DEFAULT_RECORD_SIZE,
            segment_size: DEFAULT_SEGMENT_SIZE,
            force: false,
            sparse: false,
            meta_mirror: None,
            meta_copies: 2,
            mirror: false,
            redundancy: cairn_data::Policy::default(),
            intent_log: log_home::LogHome::default(),
            encrypt: None,
        }
    }
}

/// A device as recorded in the metadata store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceDesc {
    pub version: u32,
    pub id: u32,
    pub class: DeviceClass,
    /// Absolute, or relative to the pool directory.
    pub path: PathBuf,
    #[serde(default)]
    pub role: DeviceRole,
    /// Slow-device emulation (tests and benchmarks only).
    #[serde(default)]
    pub emulate: Option<Emulation>,
    /// The failure domain the admin named (`:domain=NAME`); None: its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Bytes of the device that hold a copy of the intent log
    /// (`DeviceSpec::log`); None: no copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<u64>,
}

impl DeviceDesc {
    /// The record of a newly created device, its path relative to the pool
    /// directory when it lies inside it.
    pub fn new(pool: &Path, dev: &Device, spec: &DeviceSpec) -> Self {
        let path = dev
            .path
            .strip_prefix(pool)
            .map(Path::to_path_buf)
            .unwrap_or(dev.path.clone());
        DeviceDesc {
            version: 1,
            id: dev.id(),
            class: spec.class,
            path,
            role: spec.role,
            emulate: spec.emulate,
            domain: spec.domain.clone(),
            log: spec.log,
        }
    }

    /// True if the record names an s3 tier device (its path is the spec).
    pub fn is_object(&self) -> bool {
        cairn_devices::objdev::is_object_path(&self.path)
    }

    /// Opens the device this record names: through `storage`, or an s3
    /// device through its store (offline when the store does not answer).
    pub fn open(
        &self,
        pool: &Path,
        sb: &Superblock,
        storage: &dyn Storage,
        objects: &cairn_devices::ObjectOptions,
    ) -> Result<Device> {
        if self.is_object() {
            use cairn_devices::objdev;
            let seg = sb.segment_size;
            let expected = objdev::expected_header(&self.path, self.id, sb.uuid, seg)?;
            let dev = objdev::open_object(&self.path, sb.uuid, seg, Some(expected), objects)?;
            return self.check_id(dev);
        }
        let uuid = sb.uuid;
        let p = if self.path.is_absolute() {
            self.path.clone()
        } else {
            pool.join(&self.path)
        };
        let dev = Device::open_with(&p, uuid, self.role, self.emulate, storage)?;
        self.check_id(dev)
    }

    fn check_id(&self, dev: Device) -> Result<Device> {
        if dev.id() != self.id {
            return Err(FsError::Io(format!(
                "{}: device record {} names a device whose header says id {}",
                dev.path.display(),
                self.id,
                dev.id()
            )));
        }
        Ok(dev)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("json")
    }

    pub fn decode(raw: &[u8]) -> Result<Self> {
        serde_json::from_slice(raw).map_err(|e| FsError::Io(format!("corrupt device record: {e}")))
    }
}

pub struct PoolPaths;

impl PoolPaths {
    pub fn superblock(p: &Path) -> PathBuf {
        p.join("superblock")
    }
    pub fn meta(p: &Path) -> PathBuf {
        p.join("meta.redb")
    }
    /// The second copy of the metadata (a link to it beside another
    /// device, or beside the first copy), when the pool keeps one
    /// (`meta_copies`).
    pub fn meta_mirror(p: &Path) -> PathBuf {
        Self::meta_copy(p, 2)
    }
    /// Copy `n` (2 or more) of the metadata: `meta.mirror` for the second,
    /// as pools made before more copies existed have it, `meta.mirror.N`
    /// for the others.
    pub fn meta_copy(p: &Path, n: usize) -> PathBuf {
        assert!(n >= 2, "copy {n} of the metadata is the store itself");
        match n {
            2 => p.join("meta.mirror"),
            _ => p.join(format!("meta.mirror.{n}")),
        }
    }
    /// The links to the metadata's copies beyond the first that exist, in
    /// order.
    pub fn meta_copies(p: &Path) -> Vec<PathBuf> {
        let copies = (2..=meta_copies::MAX_META_COPIES).map(|n| Self::meta_copy(p, n));
        copies
            .filter(|l| std::fs::symlink_metadata(l).is_ok())
            .collect()
    }
    pub fn config(p: &Path) -> PathBuf {
        p.join("cairn.toml")
    }
    /// An encrypted pool's key block (`key.rs`).
    pub fn key(p: &Path) -> PathBuf {
        p.join("key")
    }
    pub fn heat(p: &Path) -> PathBuf {
        p.join("heat")
    }
    /// The intent log (`writeback/intent.rs`).
    pub fn intent(p: &Path) -> PathBuf {
        p.join("intent.log")
    }
    pub fn ssd_index(p: &Path) -> PathBuf {
        p.join("ssdcache")
    }
    pub fn lock(p: &Path) -> PathBuf {
        p.join("lock")
    }
    pub fn log(p: &Path) -> PathBuf {
        p.join("cairn.log")
    }
    /// The mounted daemon's control socket (mode 0600).
    pub fn control(p: &Path) -> PathBuf {
        p.join("control.sock")
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FsError + '_ {
    move |e| FsError::Io(format!("{}: {e}", path.display()))
}

fn validate(opts: &MkfsOptions) -> Result<()> {
    meta_copies::validate(opts)?;
    let rs = opts.record_size as u64;
    if !rs.is_power_of_two() || !(4096..=(1 << 20)).contains(&rs) {
        return Err(FsError::Io(
            "record size must be a power of two between 4K and 1M".into(),
        ));
    }
    if !opts.segment_size.is_power_of_two()
        || opts.segment_size < 4 * rs
        || opts.segment_size > (1 << 30)
    {
        return Err(FsError::Io(
            "segment size must be a power of two, >= 4 records and <= 1G".into(),
        ));
    }
    Ok(())
}

/// Creates a pool. The superblock is written last, so an interrupted mkfs
/// leaves no pool that looks valid.
pub fn mkfs(pool: &Path, opts: MkfsOptions) -> Result<Superblock> {
    mkfs_report(pool, opts).map(|r| r.superblock)
}

/// `mkfs` writing the pool's files through `storage`.
pub fn mkfs_with(pool: &Path, opts: MkfsOptions, storage: &dyn Storage) -> Result<Superblock> {
    mkfs_report_with(pool, opts, storage).map(|r| r.superblock)
}

/// Creates a pool (see `mkfs`) and returns warnings for the administrator
/// (devices other users can read, devices left sparse). Refuses, whatever
/// `force` says, a pool that is open (its lock is held) and a device that
/// an open pool uses; without `force`, an existing pool and a device that
/// holds a Cairn header or any data in its first MiB. A failed mkfs removes
/// exactly what it created.
pub fn mkfs_report(pool: &Path, opts: MkfsOptions) -> Result<MkfsReport> {
    mkfs_report_with(pool, opts, &HostStorage)
}

/// What `mkfs_report` made, and what the administrator should hear of it.
#[derive(Debug)]
pub struct MkfsReport {
    pub superblock: Superblock,
    pub warnings: Vec<String>,
    /// One line per device made: id, class, role, path, size, and whether
    /// its blocks are reserved.
    pub devices: Vec<String>,
    /// Where the metadata's copies are (`meta_copies::mkfs_line`).
    pub metadata: String,
    /// Where the intent log's copies are (`log_home::mkfs_line`).
    pub log: String,
}

/// `mkfs_report` writing the pool's files through `storage`.
pub fn mkfs_report_with(
    pool: &Path,
    opts: MkfsOptions,
    storage: &dyn Storage,
) -> Result<MkfsReport> {
    validate(&opts)?;
    // A relative pool path ("pool") has an empty parent: work on the
    // absolute one, so every check below names a real directory.
    let pool = &std::path::absolute(pool).map_err(io(pool))?;
    let mut made = Created::default();
    let r = mkfs_in(pool, opts, storage, &mut made);
    if r.is_err() {
        made.undo();
    }
    r
}

/// What a mkfs created, to be removed if it fails (nothing that existed
/// before is ever removed).
#[derive(Default)]
struct Created {
    dirs: Vec<PathBuf>,
    files: Vec<PathBuf>,
}

impl Created {
    /// Records `p` if it does not exist yet (call before creating it).
    fn will_create(&mut self, p: &Path) {
        if std::fs::symlink_metadata(p).is_err() {
            self.files.push(p.to_path_buf());
        }
    }

    /// Creates `dir` and missing parents with mode 0700, recording each.
    fn create_dirs(&mut self, dir: &Path) -> Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        let missing: Vec<&Path> = dir.ancestors().take_while(|a| !a.exists()).collect();
        for d in missing.into_iter().rev() {
            std::fs::DirBuilder::new()
                .mode(DIR_MODE)
                .create(d)
                .map_err(io(d))?;
            self.dirs.push(d.to_path_buf());
        }
        Ok(())
    }

    fn undo(&self) {
        for f in self.files.iter().rev() {
            let _ = std::fs::remove_file(f);
        }
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "a device id is an index in the list of devices given to mkfs, a handful"
)]
fn mkfs_in(
    pool: &Path,
    mut opts: MkfsOptions,
    storage: &dyn Storage,
    made: &mut Created,
) -> Result<MkfsReport> {
    made.create_dirs(pool)?;
    let pool = &pool.canonicalize().map_err(io(pool))?;
    made.will_create(&PoolPaths::lock(pool));
    let _lock = take_lock(pool).map_err(|e| match e {
        FsError::Busy => FsError::InUse(format!(
            "pool {} is in use (mounted, or open by a cairn command); it is never formatted while in use: unmount it first",
            pool.display()
        )),
        e => e,
    })?;
    if PoolPaths::superblock(pool).exists() && !opts.force {
        return Err(FsError::PoolExists(pool.display().to_string()));
    }
    let cwd = std::env::current_dir().map_err(io(pool))?;
    settle_devices(pool, &cwd, &mut opts)?;
    let files = check_devices(&opts)?;
    check_meta_home(pool, &opts)?;
    let log_warning = log_home::place(&mut opts);
    // Everything is checked: from here on the old pool (with --force) goes.
    if PoolPaths::superblock(pool).exists() {
        std::fs::remove_file(PoolPaths::superblock(pool)).map_err(io(pool))?;
    }
    let _ = std::fs::remove_file(PoolPaths::meta(pool));
    forget_old_mirror(pool);
    let _ = std::fs::remove_file(PoolPaths::intent(pool));
    let _ = std::fs::remove_file(PoolPaths::key(pool));
    let uuid = *uuid::Uuid::new_v4().as_bytes();
    let mut keys = None;
    if let Some(secret) = &opts.encrypt {
        let now = Time::now().secs.max(0) as u64;
        let (block, key) = cairn_crypt::KeyBlock::create(secret, uuid, now)
            .map_err(|e| FsError::Key(e.to_string()))?;
        made.will_create(&PoolPaths::key(pool));
        key::write_key_block(pool, &block)?;
        keys = Some(Arc::new(cairn_crypt::PoolKeys::derive(&key, block.cipher)));
    }
    made.will_create(&PoolPaths::meta(pool));
    let home = meta_home(pool, &opts.devices)?;
    made.will_create(&home);
    let meta = MetaStore::create_with(&home, storage)?;
    if let Some(keys) = &keys {
        meta.seal_values(keys.clone());
    }
    let now = Time::now();
    let mut warnings = Vec::new();
    let mut lines = Vec::new();
    let mut descs = Vec::new();
    for (id, spec) in opts.devices.iter().enumerate() {
        made.will_create(&files[id]);
        let dev = Device::create_with(spec, id as u32, uuid, opts.segment_size, storage)?;
        // A sparse device keeps its blocks unallocated: its log's records
        // allocate theirs as they come (as a log file's do past its start).
        if let Some(area) = dev.log_area().filter(|_| !dev.is_sparse()) {
            crate::writeback::log_file::prepare_area(&*area).map_err(io(&dev.path))?;
        }
        warnings.extend(device_warnings(pool, &dev, spec));
        lines.push(device_line(&dev, spec.size.is_some()));
        descs.push(DeviceDesc::new(pool, &dev, spec));
    }
    write_first_tid(&meta, &descs, now, &opts)?;
    warnings.extend(redundancy_warning(&opts));
    warnings.extend(log_warning);
    drop(meta);
    opts.meta_mirror = opts.meta_mirror.take().map(|d| cwd.join(d));
    let copies = meta_copies::MkfsCopies {
        pool,
        opts: &opts,
        home: &home,
        uuid,
        storage,
    };
    let others = meta_copies::mkfs_copies(&copies, &mut warnings, &mut |p| made.will_create(p))?;
    let metadata = meta_copies::mkfs_line(&home, &others);
    made.will_create(&PoolPaths::config(pool));
    if opts.force || !PoolPaths::config(pool).exists() {
        PoolConfig::default().save(&PoolPaths::config(pool))?;
    }
    let sb = Superblock {
        uuid,
        record_size: opts.record_size,
        segment_size: opts.segment_size,
        created: now.secs as u64,
    };
    crate::pool::perms::tighten(pool);
    let sbp = PoolPaths::superblock(pool);
    made.will_create(&sbp);
    write_superblock(&sbp, &sb, storage).map_err(io(&sbp))?;
    File::open(pool)
        .and_then(|f| f.sync_all())
        .map_err(io(pool))?;
    Ok(MkfsReport {
        superblock: sb,
        warnings,
        devices: lines,
        metadata,
        log: log_home::mkfs_line(&opts),
    })
}

/// What the administrator should know of a device just made: other users
/// can read it, or its blocks are not reserved.
/// A policy asking for more copies than the pool has failure domains of
/// local tier devices: new data gets what it can until devices are added.
fn redundancy_warning(opts: &MkfsOptions) -> Option<String> {
    let mut domains: Vec<String> = (opts.devices.iter())
        .filter(|d| d.role == DeviceRole::Tier && !d.class.is_object_store())
        .enumerate()
        .map(|(i, d)| d.domain.clone().unwrap_or_else(|| format!("device-{i}")))
        .collect();
    domains.sort();
    domains.dedup();
    let want = opts.redundancy.most_copies();
    let stripes = opts.redundancy.most_domains();
    if want <= domains.len() && stripes > domains.len() {
        return Some(format!(
            "--redundancy {} needs {stripes} failure domains for its stripes but the pool has {}: new data keeps {want} copies until devices are added (`cairn device add`), then it is striped",
            opts.redundancy,
            domains.len()
        ));
    }
    (want > domains.len()).then(|| {
        format!(
            "--redundancy {} asks for {want} copies but the pool has {} failure domain(s): new data gets {} copies until devices are added (`cairn device add`), then the missing ones are made",
            opts.redundancy,
            domains.len(),
            domains.len()
        )
    })
}

fn device_warnings(pool: &Path, dev: &Device, spec: &DeviceSpec) -> Vec<String> {
    let mut w: Vec<String> = crate::pool::perms::exposed_device(pool, &dev.path)
        .into_iter()
        .collect();
    if spec.sparse {
        w.push(format!(
            "device {} is sparse (--sparse): its blocks are not reserved, so writes fail when the host filesystem fills",
            dev.path.display()
        ));
    }
    w
}

/// "device 0: ssd tier /p/data.0, 1.8 GiB (blocks reserved)", and for a
/// size the administrator did not give (`sized`), how Cairn chose it: a
/// file device takes 90% of its filesystem's free space.
fn device_line(dev: &Device, sized: bool) -> String {
    let size = cairn_devices::size::human(dev.header.size - dev.header.data_offset);
    let blocks = match dev.is_sparse() {
        true => "sparse: blocks not reserved",
        false => "blocks reserved",
    };
    let chosen = match sized || !dev.path.is_file() {
        true => "",
        false => "; 90% of the free space on its filesystem: give CLASS:PATH:SIZE to choose",
    };
    format!(
        "device {}: {} {} {}, {size} usable ({blocks}{chosen})",
        dev.id(),
        dev.class(),
        dev.role,
        dev.path.display()
    )
}

/// Makes device paths absolute, adds the default device (a file in the
/// pool) when none is given, and refuses sets a pool cannot start from.
fn settle_devices(pool: &Path, cwd: &Path, opts: &mut MkfsOptions) -> Result<()> {
    for d in &mut opts.devices {
        d.path = cwd.join(&d.path);
        d.sparse |= opts.sparse;
    }
    if opts.devices.is_empty() {
        let mut spec = DeviceSpec::tier(DeviceClass::Ssd, pool.join("data.0"), None);
        spec.sparse = opts.sparse;
        opts.devices.push(spec);
    }
    if !opts.devices.iter().any(|d| d.role == DeviceRole::Tier) {
        return Err(FsError::BadRequest(
            "a pool needs at least one tier device (cache devices add no capacity)".into(),
        ));
    }
    if let Some(d) = opts.devices.iter().find(|d| d.class.is_object_store()) {
        return Err(FsError::BadRequest(format!(
            "{}: an s3 tier is added to a pool with `cairn device add` after mkfs (the pool's first devices hold its metadata)",
            d.path.display()
        )));
    }
    Ok(())
}

/// TID 1: the devices, the empty root directory and the counters (the
/// metadata copies chosen, and the unbound mirror role of a pool made to
/// be a mirror).
#[allow(
    clippy::cast_possible_truncation,
    reason = "nanoseconds since 1970: now is after 1970 and before 2554"
)]
fn write_first_tid(
    meta: &MetaStore,
    descs: &[DeviceDesc],
    now: Time,
    opts: &MkfsOptions,
) -> Result<()> {
    meta.write(|w| {
        for d in descs {
            w.put_device(d.id, &d.encode())?;
        }
        for (name, v) in opts.redundancy.encode() {
            w.set_counter(&name, v)?;
        }
        w.put(
            &ElemKey::new(ROOT_INO, RecordType::Inode, &[]),
            &Inode::empty_dir(ROOT_INO, ROOT_INO, 0o755, now).encode(),
            1,
        )?;
        w.set_counter("last_tid", 1)?;
        w.set_counter(cairn_meta::tables::NEXT_INO, ROOT_INO + 1)?;
        w.set_counter("next_chunk", 1)?;
        w.set_counter("next_segment", 1)?;
        w.set_counter(meta_copies::META_COPIES, opts.meta_copies as u64)?;
        if opts.encrypt.is_some() {
            w.set_counter(key::SEALED_NAMES, 1)?;
        }
        w.log_tid(1, now.as_nanos() as u64)?;
        if opts.mirror {
            crate::replica::Role::Unbound.write(w)?;
        }
        Ok::<_, FsError>(())
    })
}

/// Writes the superblock file (mode 0600) and syncs it.
fn write_superblock(path: &Path, sb: &Superblock, storage: &dyn Storage) -> std::io::Result<()> {
    // What is written is what `Superblock::decode` accepts: a pool that
    // could not be opened again would be lost (mkfs checked the sizes).
    let geometry = superblock::check_geometry(sb.record_size as u64, sb.segment_size);
    assert_eq!(geometry, Ok(()), "superblock {sb:?}");
    let f = storage.open(path, &OpenHow::REPLACE)?;
    if let Some(host) = f.host_file() {
        cairn_devices::private::tighten_file(host)?;
    }
    f.write_at(&sb.encode(), 0)?;
    f.sync_data()
}

/// Checks every device of a mkfs before anything is written; returns the
/// file of each. Refused: two specs naming one file or block device, a
/// device an open pool uses, a size below the minimum, and (without
/// --force) a device holding a Cairn header or other data.
#[allow(
    clippy::cast_possible_truncation,
    reason = "a device id is an index in the list of devices given to mkfs, a handful"
)]
fn check_devices(opts: &MkfsOptions) -> Result<Vec<PathBuf>> {
    let mut seen = std::collections::HashMap::new();
    let mut files = Vec::new();
    let min = cairn_devices::device::min_device_size(opts.segment_size);
    for (id, spec) in opts.devices.iter().enumerate() {
        let file = device_file_path(&spec.path, id as u32);
        if let Some(first) = seen.insert(file_id(&file), file.clone()) {
            return Err(FsError::BadRequest(format!(
                "{} and {} are the same device (one file or block device given twice)",
                first.display(),
                file.display()
            )));
        }
        if in_use(&file)? {
            return Err(DeviceError::Locked { path: file }.into());
        }
        let dir = file.parent().unwrap_or(Path::new("/"));
        if std::fs::symlink_metadata(&file).is_err() && !dir.is_dir() {
            return Err(FsError::BadRequest(format!(
                "{}: directory {} does not exist",
                file.display(),
                dir.display()
            )));
        }
        if let Some(size) = spec.size.filter(|&s| s < min) {
            return Err(DeviceError::TooSmall {
                path: file,
                size,
                min,
            }
            .into());
        }
        match occupant(&file)? {
            _ if opts.force => {}
            Occupant::Empty => {}
            Occupant::Cairn { pool_uuid, device_id } => {
                return Err(FsError::BadRequest(format!(
                    "{} is device {device_id} of Cairn pool {}; use --force to overwrite it (its data is lost)",
                    file.display(),
                    uuid::Uuid::from_bytes(pool_uuid)
                )))
            }
            Occupant::Data => {
                return Err(FsError::BadRequest(format!(
                    "{} holds data (non-zero bytes in its first MiB); use --force to overwrite it",
                    file.display()
                )))
            }
        }
        files.push(file);
    }
    Ok(files)
}

/// Where the metadata store goes: inside the directory of the fastest tier
/// device when that device is a directory (the metadata lives on the
/// fastest device), linked from POOL/meta.redb; else in the pool directory.
fn meta_home(pool: &Path, specs: &[DeviceSpec]) -> Result<PathBuf> {
    let link = PoolPaths::meta(pool);
    let Some(target) = meta_beside_device(pool, specs) else {
        return Ok(link);
    };
    let _ = std::fs::remove_file(&target);
    std::os::unix::fs::symlink(&target, &link).map_err(io(&link))?;
    Ok(target)
}

/// Removes, for mkfs --force, the old pool's links to its copies of the
/// metadata beyond the first and the copies (when they have a copy's
/// name): the new pool must never take them for its own.
fn forget_old_mirror(pool: &Path) {
    for link in (2..=meta_copies::MAX_META_COPIES).map(|n| PoolPaths::meta_copy(pool, n)) {
        if let Ok(old) = std::fs::read_link(&link) {
            let named = old.file_name().map(|n| n.to_string_lossy().into_owned());
            if named.is_some_and(|n| n.starts_with("cairn-meta-mirror-")) {
                let _ = std::fs::remove_file(pool.join(old));
            }
        }
        let _ = std::fs::remove_file(link);
    }
}

/// `DIR/cairn-meta.redb` when the fastest tier device is a directory DIR
/// outside the pool (see `meta_home`).
fn meta_beside_device(pool: &Path, specs: &[DeviceSpec]) -> Option<PathBuf> {
    specs
        .iter()
        .filter(|d| d.role == DeviceRole::Tier)
        .min_by_key(|d| d.class.rank())
        .filter(|d| d.path.is_dir() && !d.path.starts_with(pool))
        .map(|d| d.path.join("cairn-meta.redb"))
}

/// Refuses to replace another pool's metadata store beside a directory
/// device: always while a device in that directory is in use by an open
/// pool, and without --force when the store exists.
fn check_meta_home(pool: &Path, opts: &MkfsOptions) -> Result<()> {
    let Some(target) = meta_beside_device(pool, &opts.devices) else {
        return Ok(());
    };
    if std::fs::symlink_metadata(&target).is_err() {
        return Ok(());
    }
    let dir = target.parent().unwrap_or(Path::new("/"));
    for e in std::fs::read_dir(dir).map_err(io(dir))?.flatten() {
        let name = e.file_name();
        if name.to_string_lossy().starts_with("cairn-dev-") && in_use(&e.path())? {
            return Err(FsError::BadRequest(format!(
                "{} belongs to a pool in use ({} is open); refusing to replace it",
                target.display(),
                e.path().display()
            )));
        }
    }
    if !opts.force {
        return Err(FsError::BadRequest(format!(
            "{} holds another pool's metadata; use --force to overwrite it",
            target.display()
        )));
    }
    Ok(())
}

/// The device the metadata store lives on: the directory device holding it
/// (see `meta_home`), else the fastest tier device (the pool directory is
/// taken to be as fast as the pool's fastest device).
fn meta_device(pool: &Path, set: &DeviceSet) -> Option<Arc<Device>> {
    let devs = set.devices();
    let dir = std::fs::read_link(PoolPaths::meta(pool))
        .ok()
        .and_then(|t| t.parent().map(|p| p.to_path_buf()));
    let tiers = devs
        .iter()
        .filter(|d| d.role == DeviceRole::Tier && !d.class().is_object_store());
    let in_dir = dir.and_then(|dir| tiers.clone().find(|d| d.path.parent() == Some(&dir)));
    in_dir
        .or_else(|| tiers.min_by_key(|d| d.class().rank()))
        .cloned()
}

pub fn read_superblock(pool: &Path) -> Result<Superblock> {
    let p = PoolPaths::superblock(pool);
    // A superblock is SUPERBLOCK_LEN bytes: read no more than one byte past.
    let b = cairn_devices::private::read_small(&p, SUPERBLOCK_LEN as u64 + 1).map_err(|e| {
        FsError::NotAPool(format!(
            "{}: {}",
            pool.display(),
            if e.kind() == std::io::ErrorKind::NotFound {
                "no superblock (not a pool; create one with `cairn mkfs`)".to_string()
            } else {
                format!("superblock: {e}")
            }
        ))
    })?;
    if b.len() != SUPERBLOCK_LEN {
        return Err(FsError::NotAPool(format!(
            "{}: superblock has wrong size",
            pool.display()
        )));
    }
    Superblock::decode(&b, &pool.display().to_string())
}

/// An open pool, held exclusively by this process.
pub struct Pool {
    pub path: PathBuf,
    pub sb: Superblock,
    pub config: PoolConfig,
    pub meta: MetaStore,
    /// The metadata store's pages in the SSD cache (see `set_ssd_cache`).
    pub meta_pages: Arc<PageCache>,
    /// The device the metadata store lives on (see `meta_device`).
    pub meta_home: Option<Arc<Device>>,
    pub chunks: ChunkStore,
    /// Modes tightened at open and devices other users can read (shown by
    /// `cairn check` and `cairn info`).
    pub mode_warnings: Vec<String>,
    /// How the pool's files are opened (the host's, or a test storage).
    pub storage: Arc<dyn Storage>,
    /// Devices that could not be opened and what their loss costs.
    pub lost: crate::redundancy::degraded::Lost,
    /// The devices that hold a copy of the intent log (none: the log is
    /// the pool directory's file), online or not.
    pub log_devices: Vec<u32>,
    /// An encrypted pool's key (None: not encrypted).
    pub encryption: Option<key::Encryption>,
    /// An encrypted pool's keys (None: not encrypted).
    pub keys: Option<Arc<cairn_crypt::PoolKeys>>,
    /// How names sit in metadata keys (sealed when encrypted).
    pub names: crate::names::Names,
    pub(crate) _lock: File,
}

pub(crate) fn take_lock(pool: &Path) -> Result<File> {
    use std::os::fd::AsRawFd;
    let p = PoolPaths::lock(pool);
    let f = private_options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(io(&p))?;
    // A process forked by this one while it held the lock (a test's
    // nbdkit, a helper) holds it too until it execs and its close-on-exec
    // copy goes: a few tries before the pool counts as in use.
    for _ in 0..LOCK_TRIES {
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(f);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(FsError::Busy)
}

/// How many times `take_lock` tries, 20 ms apart.
const LOCK_TRIES: usize = 10;

/// The committed segment table, decoded.
pub(crate) fn segment_table(r: &cairn_meta::MetaRead) -> Result<Vec<(u64, SegmentRec)>> {
    r.segments()?
        .into_iter()
        .map(|(id, raw)| Ok((id, SegmentRec::decode(&raw)?)))
        .collect()
}

/// The stripe table (`ec=K+M` layouts), without the records that do not
/// decode (a failed checksum): each is logged naming the stripe, and its
/// segments are read from their own copies, without parity (their
/// parity slots, which no record names now, are free); `check` names it
/// too. A damaged record must not refuse the whole pool.
pub(crate) fn stripe_table(r: &cairn_meta::MetaRead) -> Result<Vec<(u64, cairn_data::StripeRec)>> {
    let mut out = Vec::new();
    for (id, raw) in r.stripes()? {
        match cairn_data::StripeRec::decode(&raw) {
            Ok(rec) => out.push((id, rec)),
            Err(e) => tracing::error!(
                "DAMAGED stripe record: stripe {id} ({e}): its segments are read without its parity"
            ),
        }
    }
    Ok(out)
}

/// How an open finds an encrypted pool's key.
#[derive(Clone, Copy)]
enum Unlock<'a> {
    /// With this secret (None: the pool must not be encrypted).
    With(Option<&'a cairn_crypt::Secret>),
    /// Without: an encrypted mirror whose values stay sealed.
    Without,
}

impl Pool {
    pub fn open(path: &Path, config: Option<PoolConfig>) -> Result<Pool> {
        Self::open_with(path, config, HostStorage::shared())
    }

    /// Opens the pool with its files (metadata store, devices, intent
    /// log) opened through `storage`.
    pub fn open_with(
        path: &Path,
        config: Option<PoolConfig>,
        storage: Arc<dyn Storage>,
    ) -> Result<Pool> {
        Self::open_keyed(path, config, storage, None)
    }

    /// `open_with` for a pool that may be encrypted: `secret` unlocks its
    /// key (refused, with nothing changed, when it does not; and given
    /// for a pool that is not encrypted).
    pub fn open_keyed(
        path: &Path,
        config: Option<PoolConfig>,
        storage: Arc<dyn Storage>,
        secret: Option<&cairn_crypt::Secret>,
    ) -> Result<Pool> {
        Self::open_inner(path, config, storage, Unlock::With(secret))
    }

    /// Opens an encrypted mirror without its key (a backup host keeping
    /// the sealed streams of its source): element values stay sealed, and
    /// only what needs no key works (taking streams, their questions, the
    /// mirror's status). Refused for a pool that is not a mirror.
    pub fn open_sealed(
        path: &Path,
        config: Option<PoolConfig>,
        storage: Arc<dyn Storage>,
    ) -> Result<Pool> {
        Self::open_inner(path, config, storage, Unlock::Without)
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "a cache size in MiB from the config; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn open_inner(
        path: &Path,
        config: Option<PoolConfig>,
        storage: Arc<dyn Storage>,
        how: Unlock<'_>,
    ) -> Result<Pool> {
        let sb = read_superblock(path)?;
        let unlocked = match how {
            Unlock::With(secret) => key::unlock(path, sb.uuid, secret)?,
            Unlock::Without => None,
        };
        // Opened without the key: an encrypted pool's values and chunks
        // stay sealed (a plain pool opens as it is).
        let keyless = matches!(how, Unlock::Without) && key::is_encrypted(path)?;
        let mut mode_warnings = crate::pool::perms::tighten(path);
        let lock = take_lock(path)?;
        let config = match config {
            Some(c) => c,
            None => PoolConfig::load(&PoolPaths::config(path))?,
        };
        crate::redundancy::degraded::promote_meta_mirror(path)?;
        let meta_pages = PageCache::new();
        let open_meta = || -> Result<MetaStore> {
            let m = MetaStore::open_mirrored(
                &PoolPaths::meta(path),
                &PoolPaths::meta_copies(path),
                (config.meta_cache_mib as usize) << 20,
                meta_pages.clone(),
                storage.clone(),
            )?;
            match &unlocked {
                Some((keys, _)) => drop(m.seal_values(keys.clone())),
                None if keyless => drop(m.keep_sealed()),
                None => {}
            }
            Ok(m)
        };
        let mut meta = open_meta()?;
        if let Some((_, info)) = &unlocked {
            key::require_sealed_names(&meta)?;
            key::check_owner(path, info, crate::replica::Role::read(&meta.read()?)?)?;
        }
        if keyless {
            key::open_without_key(path, &meta)?;
        }
        crate::history::live_debts::redo_live_debts(&meta)?;
        crate::history::liveness::convert(&meta)?;
        // A second copy missing, or beside the first while an added device
        // can hold it: made (or moved) with the store closed.
        let plans = meta_copies::mirror_plan(path, &meta, sb.uuid)?;
        if !plans.is_empty() {
            drop(meta);
            meta_copies::settle_logged(path, &plans, &*storage);
            meta = open_meta()?;
        }
        meta_copies::forget_moved(path, sb.uuid);
        let descs: Vec<DeviceDesc> = (meta.read()?.devices()?.iter())
            .map(|(_, raw)| DeviceDesc::decode(raw))
            .collect::<Result<_>>()?;
        let hash_of = |raw: &[u8]| ChunkRec::decode(raw).ok().map(|r| r.hash.to_vec());
        let indexed = meta.reindex_dedup(hash_of)?;
        if indexed > 0 {
            tracing::info!("indexed {indexed} chunks stored after the last dedup index batch");
        }
        let r = meta.read()?;
        let table = segment_table(&r)?;
        let stripes = stripe_table(&r)?;
        let next_segment = r.counter("next_segment")?;
        let policy = crate::redundancy::load_policy(&r)?;
        drop(r);
        let opened = crate::redundancy::degraded::open_devices(
            path, &sb, &descs, &table, &stripes, &config, &*storage,
        );
        for dev in &opened.devices {
            if !opened.is_missing(dev.id()) {
                mode_warnings.extend(crate::pool::perms::exposed_device(path, &dev.path));
            }
        }
        for w in &mode_warnings {
            tracing::warn!("{w}");
        }
        let (devices, lost) = opened.into_set(&descs)?;
        let set = Arc::new(devices);
        let writable = (set.devices().iter()).any(|d| {
            d.role == DeviceRole::Tier && !d.class().is_object_store() && set.is_online(d.id())
        });
        let lost = lost.judge(&table, &stripes, sb.segment_size, writable, config.degraded)?;
        let mut chunks = ChunkStore::with_stripes(set.clone(), table, stripes, next_segment)?;
        chunks.set_policy(policy);
        let keys = unlocked.as_ref().map(|(k, _)| k.clone());
        let encryption = unlocked.map(|(keys, info)| {
            chunks.set_codec(cairn_data::ChunkCodec::encrypted(keys));
            info
        });
        if keyless {
            chunks.set_codec(cairn_data::ChunkCodec::sealed_without_key());
        }
        crate::maintenance::objects::spawn_gc(set.clone());
        chunks.set_compression(config.compression()?);
        chunks.set_ram_cache(config.read_cache_mib << 20);
        chunks.set_readahead(config.readahead_kib << 10);
        chunks.set_io_timeout(std::time::Duration::from_secs(config.io_timeout_secs));
        chunks.heat = cairn_data::Heat::load(&PoolPaths::heat(path), sb.segment_size);
        let meta_home = meta_device(path, &set);
        meta_pages.set_home(meta_home.clone());
        let cache = set
            .devices()
            .into_iter()
            .find(|d| d.role == DeviceRole::Cache && set.is_online(d.id()));
        let cache = cache.map(|d| ssd_cache(&config, d));
        if let Some(c) = &cache {
            let n = c.load(&PoolPaths::ssd_index(path));
            tracing::info!("SSD cache: {n} copies from the last clean unmount");
        }
        let pool = Pool {
            path: path.to_path_buf(),
            sb,
            config,
            meta,
            meta_pages,
            meta_home,
            chunks,
            mode_warnings,
            storage,
            lost,
            log_devices: (descs.iter())
                .filter(|d| d.log.is_some())
                .map(|d| d.id)
                .collect(),
            encryption,
            names: crate::names::Names::of(keys.clone()),
            keys,
            _lock: lock,
        };
        pool.set_ssd_cache(cache);
        Ok(pool)
    }

    /// Attaches (or with None detaches) the SSD read cache: for data chunks
    /// homed slower than it, and for metadata pages when the metadata's
    /// device is slower than it.
    pub fn set_ssd_cache(&self, cache: Option<Arc<SsdCache>>) {
        let home = self.meta_home.as_ref().map(|d| d.class().rank());
        let for_meta = cache
            .clone()
            .filter(|c| home.is_some_and(|h| c.device().class().rank() < h));
        self.meta_pages.set_cache(for_meta);
        self.chunks.set_ssd_cache(cache);
    }

    pub fn record_size(&self) -> u64 {
        self.sb.record_size as u64
    }
}

/// The SSD read cache on a cache device, with the pool's fill limits.
pub(crate) fn ssd_cache(c: &PoolConfig, dev: Arc<Device>) -> Arc<SsdCache> {
    SsdCache::new(
        dev,
        cairn_devices::FillLimit {
            burst: c.cache_fill_burst_mib << 20,
            rate: c.cache_fill_rate_mib << 20,
        },
    )
}
