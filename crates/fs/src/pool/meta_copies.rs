//! Where the copies of the metadata store beyond the first live
//! (`PoolPaths::meta_copy` links to each; `cairn_meta::mirror` keeps them
//! equal). The pool keeps as many as it was made with (`--meta-copies`,
//! 2 by default) and never fewer than its most redundant data survives
//! losses plus one (`copies=3` or `ec=4+2`: 3), so that no loss the data
//! survives takes every copy of the metadata. Each copy goes beside a
//! tier device of another directory and failure domain than the copies
//! before it, the fastest first, or, when none is left (a single tier
//! device, or block devices), beside the first copy: like ZFS's ditto
//! blocks it then guards against damaged pages, not against losing the
//! disk. Each open makes a copy that is missing (a pool made before
//! single-device pools kept one, or whose copy's directory is gone) and
//! moves one that shares a directory with another when a device that can
//! hold it was added; raising the redundancy while mounted adds the
//! copies it needs at once (`raise_online`).

use super::{io, DeviceDesc, MkfsOptions, PoolPaths};
use crate::error::{FsError, Result};
use cairn_devices::{DeviceRole, DeviceSpec, OpenHow, Storage};
use cairn_meta::{MetaRead, MetaStore};
use std::path::{Path, PathBuf};

/// The counter (in the metadata store's counters) holding the copies of
/// the metadata the pool was made with: 1 (`--meta-copies 1`: no open
/// adds a second unless the data's redundancy asks for it) to
/// `MAX_META_COPIES`; absent (0) in pools made before the choice existed,
/// which keep two.
pub const META_COPIES: &str = "meta_copies";

/// The counter holding the most copies a file's or directory's own
/// layout asks for (`path_policy`), counted as `Layout::copies`; it never
/// goes down.
pub const PATH_COPIES: &str = "path_layout_copies";

/// The most copies of the metadata a pool keeps (a layout survives at most
/// `MAX_COPIES - 1` lost devices).
pub const MAX_META_COPIES: usize = cairn_data::layout::MAX_COPIES;

/// Refuses a `--meta-copies` out of 1..=MAX_META_COPIES, and one copy
/// together with a directory for the second.
#[allow(
    clippy::cast_possible_truncation,
    reason = "MAX_META_COPIES is a small constant"
)]
pub(super) fn validate(opts: &MkfsOptions) -> Result<()> {
    if !(1..=MAX_META_COPIES as u32).contains(&opts.meta_copies) {
        return Err(FsError::BadRequest(format!(
            "--meta-copies {}: the metadata is kept as 1 to {MAX_META_COPIES} copies",
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

/// The copies of the metadata the pool keeps: those it was made with, at
/// least as many as its most redundant data (pool, tier or path policy).
#[allow(
    clippy::cast_possible_truncation,
    reason = "copy counts; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
pub(crate) fn wanted(r: &MetaRead) -> Result<usize> {
    let made = match r.counter(META_COPIES)? {
        0 => 2,
        n => n as usize,
    };
    let policy = crate::redundancy::load_policy(r)?;
    let paths = r.counter(PATH_COPIES)? as usize;
    let want = made.max(policy.most_copies()).max(paths);
    Ok(want.min(MAX_META_COPIES))
}

/// The copies mkfs makes (`wanted` before the store exists), and the
/// intent log's copies on devices (`log_home::place`).
pub(super) fn wanted_at_mkfs(opts: &MkfsOptions) -> usize {
    let want = (opts.meta_copies as usize).max(opts.redundancy.most_copies());
    want.min(MAX_META_COPIES)
}

/// The directory a copy belongs in (see `next_home`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MirrorHome {
    pub dir: PathBuf,
    /// Beside a tier device of its own directory and domain; false:
    /// beside the first copy, on its disk.
    pub beside_device: bool,
}

/// The directories (and the failure domains of the devices in them) that
/// hold a copy already.
struct Taken<'a> {
    specs: &'a [DeviceSpec],
    dirs: Vec<PathBuf>,
    domains: Vec<String>,
}

impl<'a> Taken<'a> {
    fn new(specs: &'a [DeviceSpec], home: &Path, pool: &Path) -> Taken<'a> {
        let mut t = Taken {
            specs,
            dirs: Vec::new(),
            domains: Vec::new(),
        };
        t.take(&canonical(home.parent().unwrap_or(pool)));
        t
    }

    /// The domains of the devices in `dir` (a device without one is its
    /// own, named by its directory).
    fn domains_of(&self, dir: &Path) -> Vec<String> {
        let here = self.specs.iter().filter(|d| dir_of(d) == dir);
        here.map(domain_of).collect()
    }

    fn take(&mut self, dir: &Path) {
        self.domains.extend(self.domains_of(dir));
        self.dirs.push(dir.to_path_buf());
    }

    fn is_free(&self, dir: &Path) -> bool {
        !self.dirs.iter().any(|d| d == dir)
            && !(self.domains_of(dir).iter()).any(|d| self.domains.contains(d))
    }
}

fn domain_of(d: &DeviceSpec) -> String {
    match &d.domain {
        Some(n) => format!("domain {n}"),
        None => format!("dir {}", dir_of(d).display()),
    }
}

/// Where the next copy goes: beside the fastest tier device whose
/// directory and domain hold no copy yet (a file device's directory, or a
/// directory device itself); with none left (block devices: no file can
/// live beside them), or a single tier device (whose disk the pool
/// directory is taken to share), the first copy's own directory.
fn next_home(pool: &Path, specs: &[DeviceSpec], home: &Path, taken: &Taken) -> MirrorHome {
    use std::os::unix::fs::FileTypeExt;
    let mut tiers: Vec<&DeviceSpec> = specs
        .iter()
        .filter(|d| d.role == DeviceRole::Tier && !d.class.is_object_store())
        .collect();
    tiers.sort_by_key(|d| d.class.rank());
    if tiers.len() < 2 {
        tiers.clear();
    }
    let is_block =
        |d: &DeviceSpec| std::fs::metadata(&d.path).is_ok_and(|m| m.file_type().is_block_device());
    // There (not lost with its disk), and not a block device.
    let free =
        (tiers.iter()).find(|d| d.path.exists() && !is_block(d) && taken.is_free(&dir_of(d)));
    match free {
        Some(d) => MirrorHome {
            dir: dir_of(d),
            beside_device: true,
        },
        None => MirrorHome {
            dir: canonical(home.parent().unwrap_or(pool)),
            beside_device: false,
        },
    }
}

/// The second copy's home when it is the only one made (kept for the
/// tests of placement).
#[cfg(test)]
pub(super) fn mirror_home(pool: &Path, specs: &[DeviceSpec], home: &Path) -> MirrorHome {
    next_home(pool, specs, home, &Taken::new(specs, home, pool))
}

/// The copies mkfs makes beyond the first, each linked from
/// `PoolPaths::meta_copy` (none with `--meta-copies 1` and data of one
/// copy): the second in the directory given (`--meta-mirror`), else like
/// the rest where `plan_copies` puts them, with a warning when a pool of
/// several tier devices has to keep one on the first copy's disk. Returns
/// where they are.
pub(super) struct MkfsCopies<'a> {
    pub pool: &'a Path,
    pub opts: &'a MkfsOptions,
    pub home: &'a Path,
    pub uuid: [u8; 16],
    pub storage: &'a dyn Storage,
}

pub(super) fn mkfs_copies(
    m: &MkfsCopies,
    warnings: &mut Vec<String>,
    will_create: &mut dyn FnMut(&Path),
) -> Result<Vec<PathBuf>> {
    let (pool, opts, home, uuid) = (m.pool, m.opts, m.home, m.uuid);
    let want = wanted_at_mkfs(opts);
    let mut made = Vec::new();
    if want < 2 {
        return Ok(made);
    }
    let mut make = |n: usize, to: &Path| -> Result<()> {
        will_create(to);
        will_create(&PoolPaths::meta_copy(pool, n));
        copy_file(home, to, m.storage).map_err(io(to))?;
        link_copy(pool, n, to)
    };
    if let Some(dir) = &opts.meta_mirror {
        let to = explicit_mirror(pool, dir, home, uuid, warnings)?;
        make(2, &to)?;
        made.push(to);
    }
    let plans = plan_copies(pool, &opts.devices, home, uuid, want);
    let tiers = (opts.devices.iter())
        .filter(|d| d.role == DeviceRole::Tier)
        .count();
    for (n, to, beside_device) in makes(plans) {
        if !beside_device && tiers >= n {
            warnings.push(format!(
                "the metadata's {} copy is beside the first, on the same disk: no tier device of another directory or failure domain is left to hold it (block devices); give --meta-mirror DIR on another disk to survive losing that disk",
                ordinal(n)
            ));
        }
        make(n, &to)?;
        made.push(to);
    }
    Ok(made)
}

/// The file name of copy `n` in `dir`, other than every path in `avoid`
/// (the first copy, and the other copies: a copy promoted to first when
/// the first was lost with its disk keeps its name,
/// `redundancy::degraded::promote_meta_mirror`). Named by the pool's
/// uuid: pools whose devices share a directory never share a copy.
fn copy_file_name(dir: &Path, uuid: [u8; 16], n: usize, avoid: &[PathBuf]) -> PathBuf {
    assert!(n >= 2, "copy {n} is the store itself");
    let id = uuid::Uuid::from_bytes(uuid).simple().to_string();
    let names = match n {
        2 => [
            format!("cairn-meta-mirror-{id}.redb"),
            format!("cairn-meta-mirror-{id}.2.redb"),
        ],
        _ => [
            format!("cairn-meta-mirror-{id}.{n}.redb"),
            format!("cairn-meta-mirror-{id}.{n}b.redb"),
        ],
    };
    let free = |p: &PathBuf| !avoid.iter().any(|a| canonical(a) == canonical(p));
    let paths = names.map(|name| dir.join(name));
    paths.iter().find(|p| free(p)).unwrap_or(&paths[1]).clone()
}

/// Whether `name` is one of the pool's copy names (`copy_file_name`).
fn is_copy_name(name: &str, uuid: [u8; 16]) -> bool {
    let id = uuid::Uuid::from_bytes(uuid).simple().to_string();
    name.starts_with(&format!("cairn-meta-mirror-{id}")) && name.ends_with(".redb")
}

/// Points `PoolPaths::meta_copy(pool, n)` at `target`, replacing the link
/// in one rename (a crash leaves the old link or the new one).
fn link_copy(pool: &Path, n: usize, target: &Path) -> Result<()> {
    let link = PoolPaths::meta_copy(pool, n);
    let tmp = pool.join(format!("meta.copy{n}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &link).map_err(io(&link))?;
    Ok(())
}

/// The second copy in a directory the admin chose (`--meta-mirror`),
/// which must exist; a warning when it shares the first copy's filesystem
/// (it then guards against damage, not against the disk's loss).
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
    Ok(copy_file_name(dir, uuid, 2, &[home.to_path_buf()]))
}

/// True if both paths are on one filesystem (false if either is missing).
fn same_filesystem(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => false,
    }
}

/// mkfs's line on the metadata's copies: where they are and what they
/// guard against.
pub(super) fn mkfs_line(home: &Path, others: &[PathBuf]) -> String {
    if others.is_empty() {
        return format!("metadata: 1 copy ({}; --meta-copies 1)", home.display());
    }
    let dir = |p: &Path| p.parent().unwrap_or(Path::new("/")).to_path_buf();
    let shared = (others.iter())
        .filter(|m| same_filesystem(&dir(home), &dir(m)))
        .count();
    let guards = match shared {
        0 => "none on the first copy's filesystem",
        n if n == others.len() => {
            "all on one filesystem: they guard against damaged pages, not against losing its disk"
        }
        _ => "some share the first's filesystem: those guard against damaged pages, not against losing its disk",
    };
    let all: Vec<String> = std::iter::once(home)
        .chain(others.iter().map(PathBuf::as_path))
        .map(|p| p.display().to_string())
        .collect();
    format!(
        "metadata: {} copies, {} ({guards})",
        all.len(),
        all.join(", ")
    )
}

/// What an open (or a raise while mounted) does about copy `n` of the
/// metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum MirrorPlan {
    /// Make it at `to`: the pool has none (it was made before it kept
    /// that many, or its redundancy was raised) or its file is gone.
    Make {
        n: usize,
        to: PathBuf,
        beside_device: bool,
    },
    /// Move it from a directory it shares with another copy to `to`,
    /// beside a device added since.
    Move {
        n: usize,
        from: PathBuf,
        to: PathBuf,
    },
}

/// The copies `plans` make (copy, file, beside a device), leaving out
/// the moves.
fn makes(plans: Vec<MirrorPlan>) -> impl Iterator<Item = (usize, PathBuf, bool)> {
    plans.into_iter().filter_map(|p| match p {
        MirrorPlan::Make {
            n,
            to,
            beside_device,
        } => Some((n, to, beside_device)),
        MirrorPlan::Move { .. } => None,
    })
}

/// The tier devices of the store's device table, as specs.
fn device_specs(pool: &Path, r: &MetaRead) -> Result<Vec<DeviceSpec>> {
    let descs: Vec<DeviceDesc> = (r.devices()?.iter())
        .map(|(_, raw)| DeviceDesc::decode(raw))
        .collect::<Result<_>>()?;
    Ok((descs.iter())
        .filter(|d| !d.is_object())
        .map(|d| DeviceSpec {
            role: d.role,
            domain: d.domain.clone(),
            ..DeviceSpec::tier(d.class, pool.join(&d.path), None)
        })
        .collect())
}

/// What the pool's copies of the metadata need (see `plan_copies`), from
/// the store's device table and `wanted`.
pub(super) fn mirror_plan(
    pool: &Path,
    meta: &MetaStore,
    uuid: [u8; 16],
) -> Result<Vec<MirrorPlan>> {
    let r = meta.read()?;
    let want = wanted(&r)?;
    let specs = device_specs(pool, &r)?;
    drop(r);
    let home = canonical(&PoolPaths::meta(pool));
    Ok(plan_copies(pool, &specs, &home, uuid, want))
}

/// For each copy 2..=`want`: kept where it is when its directory and
/// domain hold no earlier copy; else made (its link or file is missing)
/// or moved (it shares a directory while a free one beside a device
/// exists) to `next_home`. Copies beyond `want` stay.
fn plan_copies(
    pool: &Path,
    specs: &[DeviceSpec],
    home: &Path,
    uuid: [u8; 16],
    want: usize,
) -> Vec<MirrorPlan> {
    assert!(want <= MAX_META_COPIES, "{want} copies of the metadata");
    let mut taken = Taken::new(specs, home, pool);
    let mut files = vec![home.to_path_buf()];
    files.extend(
        (2..=MAX_META_COPIES)
            .filter_map(|n| std::fs::canonicalize(PoolPaths::meta_copy(pool, n)).ok()),
    );
    let mut plans = Vec::new();
    for n in 2..=want {
        // A link to a copy that is gone (its directory removed) is remade.
        let now = std::fs::canonicalize(PoolPaths::meta_copy(pool, n)).ok();
        let now_dir = now.as_ref().and_then(|p| p.parent()).map(canonical);
        if let Some(d) = now_dir.as_ref().filter(|d| taken.is_free(d)) {
            taken.take(d);
            continue;
        }
        let at = next_home(pool, specs, home, &taken);
        let to = copy_file_name(&at.dir, uuid, n, &files);
        taken.take(&at.dir);
        match now {
            None => plans.push(MirrorPlan::Make {
                n,
                to: to.clone(),
                beside_device: at.beside_device,
            }),
            Some(from) if at.beside_device => plans.push(MirrorPlan::Move {
                n,
                from,
                to: to.clone(),
            }),
            Some(_) => continue,
        }
        files.push(to);
    }
    plans
}

/// Carries out `plan` while the store is closed: the first copy is copied
/// to the new place and synced, then the link switched to it (so a crash
/// leaves the old state or the new one, never a linked partial copy), and
/// a moved copy's old file removed. Returns the copy's path.
fn settle_copy(pool: &Path, plan: &MirrorPlan, st: &dyn Storage) -> Result<PathBuf> {
    let home = canonical(&PoolPaths::meta(pool));
    let (n, to) = match plan {
        MirrorPlan::Make { n, to, .. } | MirrorPlan::Move { n, to, .. } => (*n, to),
    };
    if let Err(e) = copy_file(&home, to, st) {
        let _ = std::fs::remove_file(to);
        return Err(io(to)(e));
    }
    link_copy(pool, n, to)?;
    if let MirrorPlan::Move { from, .. } = plan {
        // One left behind is removed by the next open (`forget_moved`).
        let _ = std::fs::remove_file(from);
    }
    sync_dir(pool)?;
    Ok(to.clone())
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io(dir))
}

/// Settles each copy at open (see `settle_copy`) and logs what it did; a
/// failure is logged and the pool goes on as it was.
pub(super) fn settle_logged(pool: &Path, plans: &[MirrorPlan], st: &dyn Storage) {
    for plan in plans {
        match (settle_copy(pool, plan, st), plan) {
            (Ok(to), MirrorPlan::Move { n, from, .. }) => tracing::info!(
                "metadata: {} copy moved from {} (beside another copy) to {}, beside another tier device",
                ordinal(*n),
                from.display(),
                to.display()
            ),
            (Ok(to), MirrorPlan::Make { n, beside_device, .. }) => made_line(*n, &to, *beside_device),
            (Err(e), MirrorPlan::Move { n, .. }) => {
                tracing::warn!("metadata: {} copy not moved ({e}); it stays where it was", ordinal(*n))
            }
            (Err(e), MirrorPlan::Make { n, .. }) => {
                tracing::warn!("metadata: no {} copy ({e}); the pool goes on without it", ordinal(*n));
                let _ = std::fs::remove_file(PoolPaths::meta_copy(pool, *n));
            }
        }
    }
}

/// "second" for copy 2, and so on (copies are 2..=MAX_META_COPIES).
fn ordinal(n: usize) -> &'static str {
    ["first", "second", "third", "fourth"]
        .get(n.wrapping_sub(1))
        .copied()
        .unwrap_or("next")
}

fn made_line(n: usize, to: &Path, beside_device: bool) {
    match beside_device {
        true => tracing::info!(
            "metadata: {} copy made at {}, beside another tier device",
            ordinal(n),
            to.display()
        ),
        false => tracing::info!(
            "metadata: {} copy made at {}, beside the first copy (no other tier device can hold it): it guards against damaged pages, not against losing that disk",
            ordinal(n),
            to.display()
        ),
    }
}

/// Makes, while the pool is mounted, the copies of the metadata it lacks
/// (its redundancy was just raised): each is filled from the store in use
/// with its writes held off (`MetaStore::add_copy`), then linked. Moves
/// wait for the next open. Returns how many it made; a failure is logged
/// and the next open tries again.
pub fn raise_online(pool: &super::Pool) -> Result<usize> {
    let plans = mirror_plan(&pool.path, &pool.meta, pool.sb.uuid)?;
    let mut made = 0;
    for (n, to, beside_device) in makes(plans) {
        let done = (pool.meta.add_copy(&to).map_err(FsError::from))
            .and_then(|_| link_copy(&pool.path, n, &to))
            .and_then(|_| sync_dir(&pool.path));
        match done {
            Ok(()) => (made += 1, made_line(n, &to, beside_device)).0,
            Err(e) => tracing::warn!(
                "metadata: {} copy not made now ({e}); the next mount makes it",
                ordinal(n)
            ),
        }
    }
    Ok(made)
}

/// Removes the copies' files a move or make left in the first copy's
/// directory when a crash came before its link was switched: any file of
/// a copy's name that no link points at.
pub(super) fn forget_moved(pool: &Path, uuid: [u8; 16]) {
    let home = canonical(&PoolPaths::meta(pool));
    let Some(dir) = home.parent() else {
        return;
    };
    let linked: Vec<PathBuf> = (2..=MAX_META_COPIES)
        .filter_map(|n| std::fs::canonicalize(PoolPaths::meta_copy(pool, n)).ok())
        .collect();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let (path, name) = (e.path(), e.file_name().to_string_lossy().into_owned());
        let live = canonical(&path) == home || linked.contains(&canonical(&path));
        if is_copy_name(&name, uuid) && !live && std::fs::remove_file(&path).is_ok() {
            tracing::info!(
                "metadata: removed {}, a copy left behind by a move",
                path.display()
            );
        }
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
#[allow(
    clippy::cast_possible_truncation,
    reason = "min with a buffer's length"
)]
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

/// Where the next open makes or moves the pool's copies of the metadata
/// (after `cairn device add`), if it does.
pub fn next_open_target(pool: &super::Pool) -> Result<Option<PathBuf>> {
    let plans = mirror_plan(&pool.path, &pool.meta, pool.sb.uuid)?;
    Ok(plans.into_iter().next().map(|p| match p {
        MirrorPlan::Make { to, .. } | MirrorPlan::Move { to, .. } => to,
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
    fn one_to_four_copies_and_one_copy_has_no_mirror_dir() {
        assert!(validate(&opts(2, None)).is_ok());
        assert!(validate(&opts(1, None)).is_ok());
        assert!(validate(&opts(4, None)).is_ok());
        assert!(validate(&opts(2, Some("/x"))).is_ok());
        for n in [0, 5, 7] {
            let e = validate(&opts(n, None)).unwrap_err().to_string();
            assert!(e.contains("1 to 4"), "{e}");
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

    #[test]
    fn each_copy_takes_a_directory_and_domain_of_its_own_while_one_is_left() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        let dirs: Vec<PathBuf> = (0..4).map(|i| root.join(format!("disk{i}"))).collect();
        let pool = root.join("pool");
        for p in dirs.iter().chain([&pool]) {
            std::fs::create_dir(p).unwrap();
        }
        let mut specs: Vec<DeviceSpec> = (dirs.iter())
            .map(|p| DeviceSpec::tier(DeviceClass::Ssd, p.clone(), None))
            .collect();
        // disk1 and disk2 are one enclosure: only one of them holds a copy.
        specs[1].domain = Some("shelf".into());
        specs[2].domain = Some("shelf".into());
        let home = dirs[0].join("cairn-meta.redb");
        let uuid = [7u8; 16];
        let made = |plans: Vec<MirrorPlan>| -> Vec<(usize, PathBuf, bool)> {
            (plans.into_iter())
                .map(|p| match p {
                    MirrorPlan::Make {
                        n,
                        to,
                        beside_device,
                    } => (n, to.parent().unwrap().to_path_buf(), beside_device),
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let plans = made(plan_copies(&pool, &specs, &home, uuid, 3));
        assert_eq!(
            plans,
            vec![(2, dirs[1].clone(), true), (3, dirs[3].clone(), true)]
        );
        // A fourth copy finds no free domain: beside the first.
        let plans = made(plan_copies(&pool, &specs, &home, uuid, 4));
        assert_eq!(plans[2], (4, dirs[0].clone(), false));
        // A lost disk (its directory gone) holds no new copy.
        std::fs::remove_dir(&dirs[1]).unwrap();
        let plans = made(plan_copies(&pool, &specs, &home, uuid, 3));
        assert_eq!(
            plans,
            vec![(2, dirs[2].clone(), true), (3, dirs[3].clone(), true)]
        );
    }
}
