//! Where the second copy of the metadata store lives (`PoolPaths::meta_mirror`
//! links to it; `cairn_meta::mirror` keeps the two copies equal). mkfs
//! places it beside another tier device than the first copy's, or, when
//! no other device can hold it (a single tier device, or block devices),
//! beside the first copy: like ZFS's ditto blocks it then guards against
//! damaged pages, not against losing the disk. Each open makes a copy that
//! is missing (a pool made before single-device pools kept one, or whose
//! copy's directory is gone) and moves one that sits beside the first copy
//! when a device that can hold it was added, unless the pool was made with
//! `--meta-copies 1` (`META_COPIES`).

use super::{io, DeviceDesc, MkfsOptions, PoolPaths};
use crate::error::{FsError, Result};
use cairn_devices::{DeviceRole, DeviceSpec, OpenHow, Storage};
use cairn_meta::MetaStore;
use std::path::{Path, PathBuf};

/// The counter (in the metadata store's counters) holding the copies of
/// the metadata the pool keeps, as chosen at mkfs: 1 (`--meta-copies 1`:
/// no open adds a second) or 2; absent (0) in pools made before the
/// choice existed, which keep two.
pub const META_COPIES: &str = "meta_copies";

/// Refuses a `--meta-copies` other than 1 or 2, and one copy together with
/// a directory for the second.
pub(super) fn validate(opts: &MkfsOptions) -> Result<()> {
    if !(1..=2).contains(&opts.meta_copies) {
        return Err(FsError::BadRequest(format!(
            "--meta-copies {}: the metadata is kept as 1 or 2 copies",
            opts.meta_copies
        )));
    }
    if let (1, Some(dir)) = (opts.meta_copies, &opts.meta_mirror) {
        return Err(FsError::BadRequest(format!(
            "--meta-copies 1 keeps a single copy of the metadata, but --meta-mirror {} asks for a second: give one or the other",
            dir.display()
        )));
    }
    Ok(())
}

/// The directory the second copy belongs in (see `mirror_home`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MirrorHome {
    pub dir: PathBuf,
    /// Beside another tier device than the first copy's; false: beside
    /// the first copy, on its disk.
    pub beside_device: bool,
}

/// Where the second copy of the metadata goes: beside the fastest tier
/// device other than the one the first copy lives beside (`meta_home`),
/// in its directory (a directory device) or the directory of its file.
/// With a single tier device, or when the others are block devices (no
/// file can live beside them), the first copy's own directory.
pub(super) fn mirror_home(pool: &Path, specs: &[DeviceSpec], home: &Path) -> MirrorHome {
    use std::os::unix::fs::FileTypeExt;
    let home_dir = canonical(home.parent().unwrap_or(pool));
    let mut tiers: Vec<&DeviceSpec> = specs
        .iter()
        .filter(|d| d.role == DeviceRole::Tier && !d.class.is_object_store())
        .collect();
    tiers.sort_by_key(|d| d.class.rank());
    let is_block = |d: &&&DeviceSpec| {
        std::fs::metadata(&d.path).is_ok_and(|m| m.file_type().is_block_device())
    };
    // Not a block device, and its directory there (not a lost disk's).
    let files: Vec<&DeviceSpec> = (tiers.iter())
        .filter(|d| !is_block(d) && dir_of(d).is_dir())
        .copied()
        .collect();
    let other = match tiers.len() {
        0 | 1 => None,
        _ => (files.iter().find(|d| dir_of(d) != home_dir))
            .or_else(|| files.iter().find(|d| !std::ptr::eq(**d, tiers[0]))),
    };
    match other {
        Some(d) => MirrorHome {
            dir: dir_of(d),
            beside_device: true,
        },
        None => MirrorHome {
            dir: home_dir,
            beside_device: false,
        },
    }
}

/// The second copy mkfs makes, linked from `PoolPaths::meta_mirror` (None
/// with `--meta-copies 1`): in the directory given (`--meta-mirror`), else
/// at `mirror_home`, with a warning when a pool of several tier devices
/// has to keep it on the first copy's disk.
pub(super) fn mkfs_mirror(
    pool: &Path,
    opts: &MkfsOptions,
    home: &Path,
    uuid: [u8; 16],
    warnings: &mut Vec<String>,
) -> Result<Option<PathBuf>> {
    if opts.meta_copies < 2 {
        return Ok(None);
    }
    if let Some(dir) = &opts.meta_mirror {
        return explicit_mirror(pool, dir, home, uuid, warnings).map(Some);
    }
    let at = mirror_home(pool, &opts.devices, home);
    let tiers = (opts.devices.iter())
        .filter(|d| d.role == DeviceRole::Tier)
        .count();
    if !at.beside_device && tiers >= 2 {
        warnings.push(
            "the metadata's second copy is beside the first, on the same disk: no tier device other than the first has a directory to hold it (block devices); give --meta-mirror DIR on another disk to survive losing that disk".into(),
        );
    }
    link_mirror(pool, &at.dir.join(mirror_name(uuid))).map(Some)
}

/// The name of the pool's second copy in any directory. Named by the
/// pool's uuid: pools whose devices share a directory never share (or
/// overwrite) a mirror.
/// The second copy's file in `dir`: by its name, unless that is the first
/// copy itself (a second copy promoted when the first was lost with its
/// disk, `redundancy::degraded::promote_meta_mirror`): then the other name.
fn mirror_file(dir: &Path, uuid: [u8; 16], home: &Path) -> PathBuf {
    let plain = dir.join(mirror_name(uuid));
    match canonical(&plain) == canonical(home) {
        true => dir.join(format!(
            "cairn-meta-mirror-{}.2.redb",
            uuid::Uuid::from_bytes(uuid).simple()
        )),
        false => plain,
    }
}

fn mirror_name(uuid: [u8; 16]) -> String {
    format!(
        "cairn-meta-mirror-{}.redb",
        uuid::Uuid::from_bytes(uuid).simple()
    )
}

/// Points `PoolPaths::meta_mirror` at `target`, replacing the link in one
/// rename (a crash leaves the old link or the new one).
fn link_mirror(pool: &Path, target: &Path) -> Result<PathBuf> {
    let link = PoolPaths::meta_mirror(pool);
    let tmp = pool.join("meta.mirror.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &link).map_err(io(&link))?;
    Ok(target.to_path_buf())
}

/// The mirror in a directory the admin chose (`--meta-mirror`), which must
/// exist; a warning when it shares the first copy's filesystem (it then
/// guards against damage, not against the disk's loss).
fn explicit_mirror(
    pool: &Path,
    dir: &Path,
    home: &Path,
    uuid: [u8; 16],
    warnings: &mut Vec<String>,
) -> Result<PathBuf> {
    let m = std::fs::metadata(dir).map_err(io(dir))?;
    if !m.is_dir() {
        return Err(FsError::BadRequest(format!(
            "--meta-mirror {}: not a directory",
            dir.display()
        )));
    }
    if same_filesystem(home.parent().unwrap_or(pool), dir) {
        warnings.push(format!(
            "--meta-mirror {} is on the same filesystem as the metadata: its copy guards against damage, not against losing that disk",
            dir.display()
        ));
    }
    link_mirror(pool, &dir.join(mirror_name(uuid)))
}

/// True if both paths are on one filesystem (false if either is missing).
fn same_filesystem(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => false,
    }
}

/// mkfs's line on the metadata's copies: where they are and what the
/// second guards against.
pub(super) fn mkfs_line(home: &Path, mirror: Option<&Path>) -> String {
    let Some(m) = mirror else {
        return format!("metadata: 1 copy ({}; --meta-copies 1)", home.display());
    };
    let dir = |p: &Path| p.parent().unwrap_or(Path::new("/")).to_path_buf();
    let guards = match same_filesystem(&dir(home), &dir(m)) {
        true => "on one filesystem: they guard against damaged pages, not against losing its disk",
        false => "on two filesystems",
    };
    format!(
        "metadata: 2 copies, {} and {} ({guards})",
        home.display(),
        m.display()
    )
}

/// What an open does about the second copy of the metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum MirrorPlan {
    /// Make it at this path: the pool has none (it was made before
    /// single-device pools kept one) or its file is gone.
    Make(PathBuf),
    /// Move it from beside the first copy to this path, beside a device
    /// added since.
    Move { from: PathBuf, to: PathBuf },
}

/// What the pool's second copy of the metadata needs at the next open,
/// from the store's device table and `META_COPIES`; None when it is where
/// it belongs or the pool keeps one copy.
pub(super) fn mirror_plan(
    pool: &Path,
    meta: &MetaStore,
    uuid: [u8; 16],
) -> Result<Option<MirrorPlan>> {
    let r = meta.read()?;
    if r.counter(META_COPIES)? == 1 {
        return Ok(None);
    }
    let descs: Vec<DeviceDesc> = (r.devices()?.iter())
        .map(|(_, raw)| DeviceDesc::decode(raw))
        .collect::<Result<_>>()?;
    drop(r);
    let specs: Vec<DeviceSpec> = (descs.iter())
        .filter(|d| !d.is_object())
        .map(|d| DeviceSpec {
            role: d.role,
            ..DeviceSpec::tier(d.class, pool.join(&d.path), None)
        })
        .collect();
    let home = canonical(&PoolPaths::meta(pool));
    let at = mirror_home(pool, &specs, &home);
    let to = mirror_file(&at.dir, uuid, &home);
    // A link to a mirror that is gone (its directory removed) is remade.
    let Ok(now) = std::fs::canonicalize(PoolPaths::meta_mirror(pool)) else {
        return Ok(Some(MirrorPlan::Make(to)));
    };
    let home_dir = home.parent();
    let moves = at.beside_device && Some(at.dir.as_path()) != home_dir;
    Ok((moves && now.parent() == home_dir).then_some(MirrorPlan::Move { from: now, to }))
}

/// Carries out `plan` while the store is closed: the first copy is copied
/// to the new place and synced, then the link switched to it (so a crash
/// leaves the old state or the new one, never a linked partial copy), and
/// a moved copy's old file removed. Returns the second copy's path.
pub(super) fn settle_mirror(pool: &Path, plan: &MirrorPlan, st: &dyn Storage) -> Result<PathBuf> {
    let home = canonical(&PoolPaths::meta(pool));
    let to = match plan {
        MirrorPlan::Make(to) | MirrorPlan::Move { to, .. } => to,
    };
    if let Err(e) = copy_file(&home, to, st) {
        let _ = std::fs::remove_file(to);
        return Err(io(to)(e));
    }
    link_mirror(pool, to)?;
    if let MirrorPlan::Move { from, .. } = plan {
        // One left behind is removed by the next open (`forget_moved`).
        let _ = std::fs::remove_file(from);
    }
    std::fs::File::open(pool)
        .and_then(|f| f.sync_all())
        .map_err(io(pool))?;
    Ok(to.clone())
}

/// Settles the second copy at open (see `settle_mirror`) and logs what it
/// did; a failure is logged and the pool goes on as it was.
pub(super) fn settle_logged(pool: &Path, plan: &MirrorPlan, st: &dyn Storage) {
    let home = canonical(&PoolPaths::meta(pool));
    match (settle_mirror(pool, plan, st), plan) {
        (Ok(to), MirrorPlan::Move { from, .. }) => tracing::info!(
            "metadata: second copy moved from {} (beside the first copy) to {}, beside another tier device",
            from.display(),
            to.display()
        ),
        (Ok(to), MirrorPlan::Make(_)) if to.parent() == home.parent() => tracing::info!(
            "metadata: second copy made at {}, beside the first copy (no other tier device can hold it): it guards against damaged pages, not against losing that disk",
            to.display()
        ),
        (Ok(to), MirrorPlan::Make(_)) => tracing::info!(
            "metadata: second copy made at {}, beside another tier device",
            to.display()
        ),
        (Err(e), MirrorPlan::Move { .. }) => {
            tracing::warn!("metadata: second copy not moved ({e}); it stays beside the first")
        }
        (Err(e), MirrorPlan::Make(_)) => {
            tracing::warn!("metadata: no second copy ({e}); the pool goes on with one");
            let _ = std::fs::remove_file(PoolPaths::meta_mirror(pool));
        }
    }
}

/// Removes the file a move left beside the first copy when a crash came
/// between switching the link and removing it.
pub(super) fn forget_moved(pool: &Path, uuid: [u8; 16]) {
    let home = canonical(&PoolPaths::meta(pool));
    let Some(old) = home.parent().map(|d| d.join(mirror_name(uuid))) else {
        return;
    };
    let now = std::fs::canonicalize(PoolPaths::meta_mirror(pool)).ok();
    if now.is_some_and(|n| n != old) && std::fs::remove_file(&old).is_ok() {
        tracing::info!(
            "metadata: removed {}, a second copy left behind by a move",
            old.display()
        );
    }
}

/// `p` with symlinks resolved, or as given when it cannot be.
fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The directory a device's files live in: itself for a directory, else
/// its file's directory (symlinks resolved, so that directories compare).
fn dir_of(d: &DeviceSpec) -> PathBuf {
    canonical(match d.path.is_dir() {
        true => &d.path,
        false => d.path.parent().unwrap_or(Path::new("/")),
    })
}

/// Copies a file through the storage and syncs the copy.
pub(super) fn copy_file(from: &Path, to: &Path, storage: &dyn Storage) -> std::io::Result<()> {
    let src = storage.open(from, &OpenHow::EXISTING)?;
    let dst = storage.open(to, &OpenHow::REPLACE)?;
    let len = src.len()?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = (buf.len() as u64).min(len - at) as usize;
        src.read_at(&mut buf[..n], at)?;
        dst.write_at(&buf[..n], at)?;
        at += n as u64;
    }
    dst.sync_data()
}

/// Where the next open makes or moves the pool's second copy of the
/// metadata (after `cairn device add`), if it does.
pub fn next_open_target(pool: &super::Pool) -> Result<Option<PathBuf>> {
    let plan = mirror_plan(&pool.path, &pool.meta, pool.sb.uuid)?;
    Ok(plan.map(|p| match p {
        MirrorPlan::Make(to) | MirrorPlan::Move { to, .. } => to,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_devices::DeviceClass;

    fn opts(meta_copies: u32, meta_mirror: Option<&str>) -> MkfsOptions {
        MkfsOptions {
            meta_copies,
            meta_mirror: meta_mirror.map(PathBuf::from),
            ..MkfsOptions::default()
        }
    }

    #[test]
    fn only_one_or_two_copies_and_one_copy_has_no_mirror_dir() {
        assert!(validate(&opts(2, None)).is_ok());
        assert!(validate(&opts(1, None)).is_ok());
        assert!(validate(&opts(2, Some("/x"))).is_ok());
        for n in [0, 3, 7] {
            let e = validate(&opts(n, None)).unwrap_err().to_string();
            assert!(e.contains("1 or 2"), "{e}");
        }
        let e = validate(&opts(1, Some("/x"))).unwrap_err().to_string();
        assert!(
            e.contains("--meta-copies 1") && e.contains("--meta-mirror"),
            "{e}"
        );
    }

    #[test]
    fn the_second_copy_goes_beside_another_device_or_beside_the_first() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        let (pool, fast, slow) = (root.join("pool"), root.join("fast"), root.join("slow"));
        for p in [&pool, &fast, &slow] {
            std::fs::create_dir(p).unwrap();
        }
        let home = pool.join("meta.redb");
        let one = [DeviceSpec::tier(DeviceClass::Ssd, fast.join("dev"), None)];
        let at = mirror_home(&pool, &one, &home);
        assert_eq!(
            (at.dir.as_path(), at.beside_device),
            (pool.as_path(), false)
        );
        let two = [
            DeviceSpec::tier(DeviceClass::Nvme, fast.clone(), None),
            DeviceSpec::tier(DeviceClass::Hdd, slow.clone(), None),
        ];
        let at = mirror_home(&pool, &two, &fast.join("cairn-meta.redb"));
        assert_eq!((at.dir.as_path(), at.beside_device), (slow.as_path(), true));
        // A cache device holds no copy.
        let mut cached = two.clone();
        cached[1].role = DeviceRole::Cache;
        let at = mirror_home(&pool, &cached, &fast.join("cairn-meta.redb"));
        assert_eq!(
            (at.dir.as_path(), at.beside_device),
            (fast.as_path(), false)
        );
    }
}
