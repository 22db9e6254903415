//! `cairn salvage POOL --rebuild`: writes a new metadata store from what a
//! damaged one (failed integrity check) still reads intact, and puts it in
//! the damaged one's place, which is kept beside it under a new name
//! (never deleted). The tree is walked from the root as `salvage.rs` does;
//! every file, directory or symlink whose records all read intact (inode,
//! entries, extents, the chunk records and segment records its extents
//! need) is carried over with its create TIDs; link counts are recounted
//! over what is kept. Chunk reference counts and segment accounting are
//! recomputed from the kept extents (space used only by what is lost is
//! free again). What a pass over the readable part of the live table finds
//! outside the tree (below a damaged directory) goes under /lost+found; a
//! damaged root becomes an empty one. History, snapshots and orphans are
//! not carried over: the report says what was lost.

use crate::error::{FsError, Result};
use crate::pool::{read_superblock, DeviceDesc, PoolPaths};
use crate::replica::Role;
use crate::types::{dirent_subkey, DirEnt, Extent, FileKind, Inode, Time, ROOT_INO};
use cairn_data::{ChunkRec, SegmentRec};
use cairn_meta::tables::{LIVE_REFS, LIVE_TID};
use cairn_meta::{ElemKey, Element, MetaError, MetaRead, MetaStore, PageCache, RecordType};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};

/// What a rebuild kept, lost and set aside.
#[derive(Debug, Default, serde::Serialize)]
pub struct RebuildReport {
    /// Files, directories and symlinks carried over (the root included).
    pub kept: u64,
    /// "PATH: why" for each one left out (with everything below it that
    /// was not found elsewhere).
    pub lost: Vec<String>,
    /// Paths under lost+found of what was found outside the tree.
    pub adopted: Vec<String>,
    /// Snapshots dropped (their history is not carried over).
    pub snapshots_lost: Vec<String>,
    /// Older versions (ended elements) not carried over, when countable.
    pub history_lost: Option<u64>,
    pub chunks: u64,
    pub segments: u64,
    /// Files renamed aside (the damaged store, its mirror, the intent log).
    pub set_aside: Vec<String>,
    /// Nothing was written (`dry_run`).
    pub dry_run: bool,
}

/// One object whose records read intact: its live elements, with its
/// inode decoded.
pub(crate) struct Kept {
    inode: Inode,
    pub(crate) elems: Vec<Element>,
    /// (target, kind) of each entry, for a directory.
    pub(crate) entries: Vec<(u64, FileKind)>,
}

/// What the walk found readable.
#[derive(Default)]
struct Found {
    kept: BTreeMap<u64, Kept>,
    chunks: BTreeMap<u64, ChunkRec>,
    lost: Vec<String>,
    /// Every object the walk looked at, kept or lost.
    visited: HashSet<u64>,
    /// Objects found outside the tree and put under lost+found.
    adopted: Vec<String>,
}

/// Rebuilds the metadata store of the pool at `pool`, which must fail its
/// integrity check (a sound store is refused: rebuilding would only lose
/// its history). With `dry_run`, only says what would be kept and lost.
pub fn rebuild_pool(pool: &Path, dry_run: bool) -> Result<RebuildReport> {
    crate::pool::key::refuse_salvage(pool)?;
    let sb = read_superblock(pool)?;
    let rs = sb.record_size as u64;
    let _lock = crate::pool::take_lock(pool)?;
    let meta = std::fs::canonicalize(PoolPaths::meta(pool))
        .map_err(|e| FsError::Io(format!("{}: {e}", PoolPaths::meta(pool).display())))?;
    refuse_sound(&meta)?;
    let old = MetaStore::open_salvage(&meta)?;
    let r = old.read()?;
    let segs: HashMap<u64, SegmentRec> = crate::maintenance::salvage::readable_segments(&r)
        .into_iter()
        .collect();
    let config = crate::pool::config::PoolConfig::load(&PoolPaths::config(pool))?;
    let (devs, descs) = crate::maintenance::salvage::pool_devices(&r, pool, &sb, &config)?;
    let found = walk(&r, rs, &segs)?;
    let mut rep = RebuildReport {
        kept: found.kept.len() as u64,
        lost: found.lost.clone(),
        adopted: found.adopted.clone(),
        snapshots_lost: r.snapshots().map_or_else(
            |e| vec![format!("(the snapshot table cannot be read: {e})")],
            |s| s.into_iter().map(|(n, _)| n).collect(),
        ),
        history_lost: r.sizes().ok().map(|(_, hist, _)| hist),
        chunks: found.chunks.len() as u64,
        dry_run,
        ..Default::default()
    };
    if dry_run {
        rep.segments = used_segments(&found, &segs).len() as u64;
        return Ok(rep);
    }
    let tmp = sibling(&meta, "rebuilding");
    let _ = std::fs::remove_file(&tmp);
    rep.segments = write_store(&tmp, &r, &descs, &found, &segs)?;
    drop(r);
    drop(old);
    // The new store must pass the same check a mount makes.
    drop(MetaStore::open(&tmp, 16 << 20, PageCache::new())?);
    rep.set_aside = swap_in(pool, &meta, &tmp)?;
    rep.set_aside.extend(log_areas_aside(pool, &devs)?);
    Ok(rep)
}

/// The copies of the intent log on devices name the damaged store's state,
/// as the pool directory's log does (`swap_in`): each is copied to a file
/// beside the pool's, then emptied (zeros over the whole area), so that no
/// mount replays it onto the rebuilt store.
fn log_areas_aside(pool: &Path, devs: &[cairn_devices::Device]) -> Result<Vec<String>> {
    let secs = Time::now().secs;
    let mut out = Vec::new();
    for dev in devs {
        let Some(area) = dev.log_area() else {
            continue;
        };
        let to = pool.join(format!("intent.log.damaged-{secs}.device{}", dev.id()));
        crate::writeback::log_file::set_aside(&*area, &to)
            .map_err(|e| FsError::Io(format!("{}: {e}", dev.path.display())))?;
        out.push(to.display().to_string());
    }
    Ok(out)
}

/// A store that passes its integrity check is not rebuilt.
fn refuse_sound(meta: &Path) -> Result<()> {
    match MetaStore::open(meta, 16 << 20, PageCache::new()) {
        Ok(_) => Err(FsError::BadRequest(format!(
            "metadata store {} passes its integrity check: nothing to rebuild (`cairn check POOL` verifies the rest)",
            meta.display()
        ))),
        Err(MetaError::Damaged { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Walks the live tree from the root, keeping each object whose records
/// all read intact. A root that cannot be read is replaced by an empty
/// one; objects found outside the tree go under lost+found (`adopt`).
fn walk(r: &MetaRead, rs: u64, segs: &HashMap<u64, SegmentRec>) -> Result<Found> {
    let mut f = Found::default();
    walk_from(r, rs, segs, &mut f, vec![(ROOT_INO, "/".to_string())]);
    let tid = r.counter("last_tid").unwrap_or(1).max(1);
    (f.kept.entry(ROOT_INO)).or_insert_with(|| new_dir(ROOT_INO, ROOT_INO, 0o755, tid));
    adopt(r, rs, segs, &mut f, tid);
    Ok(f)
}

/// Walks from each (object, path) of `start`, keeping what reads intact.
fn walk_from(
    r: &MetaRead,
    rs: u64,
    segs: &HashMap<u64, SegmentRec>,
    f: &mut Found,
    start: Vec<(u64, String)>,
) {
    let mut q = VecDeque::from(start);
    while let Some((ino, path)) = q.pop_front() {
        if !f.visited.insert(ino) {
            continue;
        }
        match object(r, ino, rs, segs, &mut f.chunks) {
            Ok(k) => {
                q.extend(children(&k, &path));
                f.kept.insert(ino, k);
            }
            Err(why) => f.lost.push(format!("{path}: {why}")),
        }
    }
}

/// An empty directory `ino` in `parent`, created at `tid`.
fn new_dir(ino: u64, parent: u64, perm: u16, tid: u64) -> Kept {
    let inode = Inode::empty_dir(ino, parent, perm, Time::now());
    Kept {
        elems: vec![live(
            ElemKey::new(ino, RecordType::Inode, &[]),
            inode.encode(),
            tid,
        )],
        inode,
        entries: Vec::new(),
    }
}

fn live(key: ElemKey, payload: Vec<u8>, tid: u64) -> Element {
    Element {
        key,
        create_tid: tid,
        delete_tid: cairn_meta::TID_MAX,
        payload,
    }
}

/// Adds the entry `name` -> `ino` (of `kind`) to the kept directory `dir`.
fn link(f: &mut Found, dir: u64, name: &str, ino: u64, kind: FileKind, tid: u64) {
    let key = ElemKey::new(dir, RecordType::DirEntry, &dirent_subkey(name.as_bytes()));
    let d = f.kept.get_mut(&dir).expect("kept directory");
    d.elems.push(live(key, DirEnt { ino, kind }.encode(), tid));
    d.entries.push((ino, kind));
}

/// The inodes a pass over the readable part of the live table finds that
/// the walk did not reach (below a damaged directory, or a damaged root):
/// each that reads intact, with what is below it, goes under a new
/// directory /lost+found (or lost+found.INO if the root has that name)
/// as #INO.
fn adopt(r: &MetaRead, rs: u64, segs: &HashMap<u64, SegmentRec>, f: &mut Found, tid: u64) {
    let mut found = BTreeSet::new();
    let _ = r.for_each_checked(|key, _| {
        let k = ElemKey(key.to_vec());
        if k.rtype() == Some(RecordType::Inode) {
            found.insert(k.obj());
        }
    });
    // Unlinked files that were still open: a mount would remove them.
    for o in r.orphans().unwrap_or_default() {
        found.remove(&o);
    }
    let fresh: Vec<u64> = (found.iter())
        .filter(|i| !f.visited.contains(i))
        .copied()
        .collect();
    let mut ok = BTreeMap::new();
    for ino in &fresh {
        let mut chunks = BTreeMap::new();
        if let Ok(k) = object(r, *ino, rs, segs, &mut chunks) {
            ok.insert(*ino, k.inode);
        }
    }
    if ok.is_empty() {
        return;
    }
    let top = |i: &Inode| i.kind != FileKind::Dir || !ok.contains_key(&i.parent);
    let mut order: Vec<&Inode> = ok.values().collect();
    // Directories whose parent is not found first, then what they did
    // not reach.
    order.sort_by_key(|i| (!(i.kind == FileKind::Dir && top(i)), i.ino));
    let seen_max = found
        .iter()
        .chain(&f.visited)
        .max()
        .copied()
        .unwrap_or(ROOT_INO);
    let lf = r
        .counter(cairn_meta::tables::NEXT_INO)
        .unwrap_or(0)
        .max(seen_max + 1);
    let name = match root_has(f, "lost+found") {
        true => format!("lost+found.{lf}"),
        false => "lost+found".to_string(),
    };
    f.kept.insert(lf, new_dir(lf, ROOT_INO, 0o700, tid));
    link(f, ROOT_INO, &name, lf, FileKind::Dir, tid);
    f.visited.insert(lf);
    for i in order {
        if f.visited.contains(&i.ino) || !(top(i) || i.kind != FileKind::Dir) {
            continue;
        }
        let path = format!("/{name}/#{}", i.ino);
        walk_from(r, rs, segs, f, vec![(i.ino, path.clone())]);
        if let Some(k) = f.kept.get_mut(&i.ino) {
            // ".." of an adopted directory is lost+found.
            k.inode.parent = lf;
            link(f, lf, &format!("#{}", i.ino), i.ino, i.kind, tid);
            f.adopted.push(path);
        }
    }
}

/// True when the kept root has an entry named `name`.
fn root_has(f: &Found, name: &str) -> bool {
    f.kept.get(&ROOT_INO).is_some_and(|k| {
        (k.elems.iter()).any(|e| {
            e.key.rtype() == Some(RecordType::DirEntry)
                && crate::types::split_dirent_subkey(e.key.sub())
                    .is_ok_and(|(_, n)| n == name.as_bytes())
        })
    })
}

/// (inode, path) of each entry of the directory `k` at `path`.
pub(crate) fn children(k: &Kept, path: &str) -> Vec<(u64, String)> {
    let names = (k.elems.iter())
        .filter(|e| e.key.rtype() == Some(RecordType::DirEntry))
        .map(|e| crate::types::split_dirent_subkey(e.key.sub()).map(|(_, n)| n.to_vec()));
    let base = if path == "/" { "" } else { path };
    (k.entries.iter().zip(names))
        .map(|((ino, _), n)| {
            let n = String::from_utf8_lossy(&n.unwrap_or_default()).into_owned();
            (*ino, format!("{base}/{n}"))
        })
        .collect()
}

/// Every live element of object `ino`, if all read intact and agree with
/// each other (what `cairn check` verifies of one object): the inode
/// decodes; entries decode; a symlink has its target; extents decode, lie
/// inside the file and name chunk records that decode, hold their pieces
/// and lie in a readable segment (added to `chunks`). Shared by the
/// rebuild and by `cairn check` on a damaged store (`salvage.rs`), so that
/// what check calls intact is what a rebuild keeps.
pub(crate) fn object(
    r: &MetaRead,
    ino: u64,
    rs: u64,
    segs: &HashMap<u64, SegmentRec>,
    chunks: &mut BTreeMap<u64, ChunkRec>,
) -> std::result::Result<Kept, String> {
    let elems = r
        .scan(&ino.to_be_bytes(), None, usize::MAX)
        .map_err(|e| format!("records: {e}"))?;
    let mut inode: Option<Inode> = None;
    let mut entries = Vec::new();
    let mut mine = BTreeMap::new();
    let mut target = None;
    for e in &elems {
        match e.key.rtype() {
            Some(RecordType::Inode) => {
                inode = Some(Inode::decode(ino, &e.payload).map_err(|e| format!("inode: {e}"))?)
            }
            Some(RecordType::DirEntry) => {
                let d = DirEnt::decode(&e.payload).map_err(|e| format!("entry: {e}"))?;
                crate::types::split_dirent_subkey(e.key.sub()).map_err(|e| e.to_string())?;
                entries.push((d.ino, d.kind));
            }
            Some(RecordType::Extent) => {
                let size = inode.as_ref().ok_or("inode record missing")?.size;
                extent(r, e, size, rs, segs, &mut mine)?;
            }
            Some(RecordType::Symlink) => target = Some(e.payload.len() as u64),
            Some(_) => {}
            None => return Err(format!("{}: unknown record type", e.key)),
        }
    }
    let inode = inode.ok_or("inode record missing")?;
    if inode.kind == FileKind::Symlink && target != Some(inode.size) {
        return Err("symlink target missing or of wrong length".into());
    }
    if inode.kind == FileKind::File && !r.vouches_for_absence() {
        holes_vouched(&elems, inode.size, rs)?;
    }
    chunks.extend(mine);
    Ok(Kept {
        inode,
        elems,
        entries,
    })
}

/// In a store whose creation index could not be read whole, a block of a
/// file with no extent record may be data the damage hides: such a file
/// is not called intact (a rebuild would turn the lost block into zeros).
fn holes_vouched(elems: &[Element], size: u64, rs: u64) -> std::result::Result<(), String> {
    let found: BTreeSet<u64> = elems
        .iter()
        .filter(|e| e.key.rtype() == Some(RecordType::Extent))
        .filter_map(|e| e.key.extent_block().ok())
        .collect();
    match (0..size.div_ceil(rs)).find(|b| !found.contains(b)) {
        Some(b) => Err(format!(
            "no record for offset {}, and the damaged creation index cannot tell a hole from \
             lost data",
            b * rs
        )),
        None => Ok(()),
    }
}

/// One extent element: decodes, lies inside the file (of `size` bytes),
/// and every chunk it names reads intact and holds its piece.
fn extent(
    r: &MetaRead,
    e: &Element,
    size: u64,
    rs: u64,
    segs: &HashMap<u64, SegmentRec>,
    mine: &mut BTreeMap<u64, ChunkRec>,
) -> std::result::Result<(), String> {
    let blk = e.key.extent_block().map_err(|err| err.to_string())?;
    let at = blk.saturating_mul(rs);
    let x = Extent::decode(&e.payload).map_err(|err| format!("extent at {at}: {err}"))?;
    if at >= size.max(1) {
        return Err(format!("extent at offset {at} beyond end of file"));
    }
    for id in x.chunks() {
        let rec = chunk(r, id, segs).map_err(|why| format!("offset {at}: {why}"))?;
        mine.insert(id, rec);
    }
    for p in &x.pieces {
        if p.from as u64 + p.len as u64 > mine[&p.chunk].raw_len as u64 {
            return Err(format!(
                "offset {}: a piece names bytes chunk {} does not hold",
                at + p.off as u64,
                p.chunk
            ));
        }
    }
    Ok(())
}

/// Chunk record `id`, which must decode and lie in a readable segment.
fn chunk(
    r: &MetaRead,
    id: u64,
    segs: &HashMap<u64, SegmentRec>,
) -> std::result::Result<ChunkRec, String> {
    let raw = r
        .chunk(id)
        .map_err(|e| format!("chunk record {id}: {e}"))?
        .ok_or(format!("chunk record {id} missing"))?;
    let rec = ChunkRec::decode(&raw).map_err(|e| format!("chunk record {id}: {e}"))?;
    if !segs.contains_key(&rec.segment) {
        return Err(format!(
            "chunk {id}: its segment {} cannot be read",
            rec.segment
        ));
    }
    Ok(rec)
}

/// The live count of each chunk (one per reference by a kept extent).
fn chunk_uses(found: &Found) -> HashMap<u64, u64> {
    let mut uses = HashMap::new();
    for k in found.kept.values() {
        for e in &k.elems {
            if e.key.rtype() == Some(RecordType::Extent) {
                if let Ok(x) = Extent::decode(&e.payload) {
                    x.chunks().for_each(|id| *uses.entry(id).or_default() += 1);
                }
            }
        }
    }
    uses
}

/// The segments the kept chunks lie in, their accounting recomputed.
fn used_segments(found: &Found, segs: &HashMap<u64, SegmentRec>) -> BTreeMap<u64, SegmentRec> {
    let mut out: BTreeMap<u64, SegmentRec> = BTreeMap::new();
    for c in found.chunks.values() {
        let s = out.entry(c.segment).or_insert_with(|| SegmentRec {
            live: 0,
            chunks: 0,
            hist: 0,
            ..segs[&c.segment].clone()
        });
        s.live += c.len as u64;
        s.chunks += 1;
    }
    out
}

/// The links to each kept object from kept directories, and the kept
/// subdirectories of each directory.
fn link_counts(found: &Found) -> (HashMap<u64, u32>, HashMap<u64, u32>) {
    let (mut links, mut subdirs) = (HashMap::new(), HashMap::new());
    for (dir, k) in &found.kept {
        for (child, kind) in &k.entries {
            if target_ok(found, *child, *kind) {
                *links.entry(*child).or_default() += 1;
                if *kind == FileKind::Dir {
                    *subdirs.entry(*dir).or_default() += 1;
                }
            }
        }
    }
    (links, subdirs)
}

/// Writes the new store at `path` in one transaction; returns the number
/// of segments it holds.
#[allow(
    clippy::cast_possible_truncation,
    reason = "nanoseconds since 1970: now is after 1970 and before 2554"
)]
fn write_store(
    path: &Path,
    r: &MetaRead,
    devices: &[DeviceDesc],
    found: &Found,
    segs: &HashMap<u64, SegmentRec>,
) -> Result<u64> {
    let role = Role::read(r).unwrap_or(Role::Normal);
    let old = |name: &str| r.counter(name).unwrap_or(0);
    let uses = chunk_uses(found);
    let segments = used_segments(found, segs);
    let (links, subdirs) = link_counts(found);
    let max_tid = (found.kept.values().flat_map(|k| &k.elems))
        .map(|e| e.create_tid)
        .max()
        .unwrap_or(1);
    let last_tid = old("last_tid").max(max_tid);
    let next = |name: &str, at_least: u64| old(name).max(at_least);
    let next_ino = next(
        cairn_meta::tables::NEXT_INO,
        found.kept.keys().max().map_or(2, |i| i + 1),
    );
    let next_chunk = next("next_chunk", found.chunks.keys().max().map_or(1, |c| c + 1));
    let next_segment = next("next_segment", segments.keys().max().map_or(1, |s| s + 1));
    let store = MetaStore::create(path)?;
    store.write(|w| {
        for d in devices {
            w.put_device(d.id, &d.encode())?;
        }
        for (ino, k) in &found.kept {
            let nlink = match k.inode.kind {
                FileKind::Dir => 2 + subdirs.get(ino).copied().unwrap_or(0),
                _ => links.get(ino).copied().unwrap_or(0),
            };
            for e in &k.elems {
                let payload = match e.key.rtype() {
                    Some(RecordType::Inode) => Inode { nlink, ..k.inode }.encode(),
                    Some(RecordType::DirEntry) if !entry_kept(e, found) => continue,
                    _ => e.payload.clone(),
                };
                w.put(&e.key, &payload, e.create_tid)?;
            }
        }
        for (id, c) in &found.chunks {
            let n = uses.get(id).copied().unwrap_or(0);
            let rec = ChunkRec {
                refs: n,
                live: n,
                ..c.clone()
            };
            w.put_chunk(*id, &rec.encode())?;
        }
        for (id, s) in &segments {
            w.put_segment(*id, &s.encode())?;
        }
        w.set_counter("last_tid", last_tid)?;
        w.set_counter(cairn_meta::tables::NEXT_INO, next_ino)?;
        w.set_counter("next_chunk", next_chunk)?;
        w.set_counter("next_segment", next_segment)?;
        w.set_counter(LIVE_REFS, 1)?;
        w.set_counter(LIVE_TID, last_tid)?;
        w.log_tid(last_tid, Time::now().as_nanos() as u64)?;
        role.write(w)?;
        Ok::<_, FsError>(())
    })?;
    Ok(segments.len() as u64)
}

/// A directory entry is kept when its target is, of the kind it says.
fn entry_kept(e: &Element, found: &Found) -> bool {
    DirEnt::decode(&e.payload).is_ok_and(|d| target_ok(found, d.ino, d.kind))
}

fn target_ok(found: &Found, ino: u64, kind: FileKind) -> bool {
    found.kept.get(&ino).is_some_and(|k| k.inode.kind == kind)
}

/// `FILE.WHAT` beside `file`.
fn sibling(file: &Path, what: &str) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{what}"));
    file.with_file_name(name)
}

/// Renames the damaged store (and its mirror and the intent log, which
/// belong to it) aside and the new store into its place. Returns the
/// names set aside.
fn swap_in(pool: &Path, meta: &Path, new: &Path) -> Result<Vec<String>> {
    let secs = Time::now().secs;
    let tag = format!("damaged-{secs}");
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e: std::io::Error| FsError::Io(format!("{}: {e}", p.display()))
    };
    let mut aside = Vec::new();
    let mut move_aside = |p: &Path| -> Result<()> {
        let to = sibling(p, &tag);
        std::fs::rename(p, &to).map_err(io(p))?;
        aside.push(to.display().to_string());
        Ok(())
    };
    move_aside(meta)?;
    std::fs::rename(new, meta).map_err(io(meta))?;
    // The other copies hold the damaged store's pages: the next mount
    // makes new ones from the rebuilt store.
    for link in PoolPaths::meta_copies(pool) {
        if let Ok(m) = std::fs::canonicalize(link) {
            move_aside(&m)?;
        }
    }
    // Its records name the damaged store's state.
    if PoolPaths::intent(pool).exists() {
        move_aside(&PoolPaths::intent(pool))?;
    }
    for dir in [meta.parent(), Some(pool)].into_iter().flatten() {
        std::fs::File::open(dir)
            .and_then(|f| f.sync_all())
            .map_err(io(dir))?;
    }
    Ok(aside)
}
