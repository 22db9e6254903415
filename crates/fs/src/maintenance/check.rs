//! `cairn check`: verifies an unmounted pool without trusting it. Every
//! element decodes and passes its checksum, every entry names a live inode,
//! link counts match, every extent names a stored chunk, chunk reference
//! counts equal the elements that reference them, segment accounting adds
//! up, and every chunk's bytes match their checksum and content hash.
//! Problems are reported by path and offset.

use crate::error::Result;
use crate::pool::Pool;
use crate::types::{DirEnt, Extent, FileKind, Inode, ROOT_INO};
use cairn_data::ChunkRec;
use cairn_meta::{ElemKey, Element, RecordType};
use std::collections::{BTreeMap, HashMap, VecDeque};

#[derive(Debug, Default, serde::Serialize)]
pub struct CheckReport {
    pub problems: Vec<String>,
    pub inodes: u64,
    pub extents: u64,
    pub chunks: u64,
    pub bytes_verified: u64,
}

#[derive(Default)]
struct Scan {
    /// How the pool's keys hold names.
    names: crate::names::Names,
    inodes: HashMap<u64, Inode>,
    dirents: HashMap<u64, Vec<(Vec<u8>, DirEnt)>>,
    extents: Vec<(u64, u64, Extent, bool)>,
    refs: HashMap<u64, u64>,
    /// References by live elements only.
    live_refs: HashMap<u64, u64>,
    symlinks: HashMap<u64, usize>,
}

fn collect(e: Element, s: &mut Scan, problems: &mut Vec<String>) {
    let live = e.is_live();
    let obj = e.key.obj();
    let res = match e.key.rtype() {
        Some(RecordType::Inode) if live => Inode::decode(obj, &e.payload).map(|i| {
            s.inodes.insert(obj, i);
        }),
        Some(RecordType::DirEntry) if live => DirEnt::decode(&e.payload).and_then(|d| {
            let (_, name) = s.names.dirent_name(obj, e.key.sub())?;
            s.dirents
                .entry(obj)
                .or_default()
                .push((name.into_owned(), d));
            Ok(())
        }),
        Some(RecordType::Extent) => (e.key.extent_block().map_err(crate::error::FsError::from))
            .and_then(|blk| Ok((blk, Extent::decode(&e.payload)?)))
            .map(|(blk, x)| {
                for id in x.chunks() {
                    *s.refs.entry(id).or_default() += 1;
                    if live {
                        *s.live_refs.entry(id).or_default() += 1;
                    }
                }
                s.extents.push((obj, blk, x, live));
            }),
        Some(RecordType::Symlink) if live => {
            s.symlinks.insert(obj, e.payload.len());
            Ok(())
        }
        Some(_) => Ok(()),
        None => {
            problems.push(format!("{}: unknown record type", e.key));
            Ok(())
        }
    };
    if let Err(err) = res {
        problems.push(format!("{}: {err}", e.key));
    }
}

/// Paths of every reachable inode (one per inode), walking from the root.
/// Paths of the current tree by inode (for naming files in reports).
pub(crate) fn live_paths(
    r: &cairn_meta::MetaRead,
    names: &crate::names::Names,
) -> Result<HashMap<u64, String>> {
    let mut s = Scan {
        names: names.clone(),
        ..Scan::default()
    };
    let mut ignored = Vec::new();
    r.for_each_checked(|_, e| match e {
        Ok(e) if e.is_live() && e.key.rtype() == Some(RecordType::DirEntry) => {
            collect(e, &mut s, &mut ignored)
        }
        _ => {}
    })?;
    Ok(paths(&s))
}

fn paths(s: &Scan) -> HashMap<u64, String> {
    let mut out = HashMap::from([(ROOT_INO, "/".to_string())]);
    let mut q = VecDeque::from([ROOT_INO]);
    while let Some(d) = q.pop_front() {
        for (name, ent) in s.dirents.get(&d).into_iter().flatten() {
            let base = if d == ROOT_INO {
                String::new()
            } else {
                out[&d].clone()
            };
            let p = format!("{base}/{}", String::from_utf8_lossy(name));
            if out.contains_key(&ent.ino) {
                continue;
            }
            out.insert(ent.ino, p);
            if ent.kind == FileKind::Dir {
                q.push_back(ent.ino);
            }
        }
    }
    out
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
fn check_namespace(
    s: &Scan,
    paths: &HashMap<u64, String>,
    orphans: &[u64],
    problems: &mut Vec<String>,
) {
    let mut links: HashMap<u64, u32> = HashMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    for (dir, ents) in &s.dirents {
        let dp = paths
            .get(dir)
            .cloned()
            .unwrap_or(format!("<dir inode {dir}>"));
        if !s.inodes.contains_key(dir) {
            problems.push(format!("{dp}: entries in a directory that does not exist"));
        }
        for (name, e) in ents {
            *links.entry(e.ino).or_default() += 1;
            match s.inodes.get(&e.ino) {
                None => problems.push(format!(
                    "{dp}/{}: entry names missing inode {}",
                    String::from_utf8_lossy(name),
                    e.ino
                )),
                Some(i) if i.kind != e.kind => problems.push(format!(
                    "{dp}/{}: entry type differs from inode type",
                    String::from_utf8_lossy(name)
                )),
                Some(i) if i.kind == FileKind::Dir => *subdirs.entry(*dir).or_default() += 1,
                _ => {}
            }
        }
    }
    for (ino, i) in &s.inodes {
        let p = paths.get(ino).cloned().unwrap_or(format!("<inode {ino}>"));
        let expect = match i.kind {
            FileKind::Dir => 2 + subdirs.get(ino).copied().unwrap_or(0),
            _ => links.get(ino).copied().unwrap_or(0),
        };
        if i.nlink != expect && !(i.nlink == 0 && orphans.contains(ino)) {
            problems.push(format!("{p}: link count {} but {} found", i.nlink, expect));
        }
        if !paths.contains_key(ino) && !orphans.contains(ino) {
            problems.push(format!("{p}: inode not reachable from the root"));
        }
        if i.kind == FileKind::Symlink && s.symlinks.get(ino) != Some(&(i.size as usize)) {
            problems.push(format!("{p}: symlink target missing or of wrong length"));
        }
    }
}

/// Verifies an open (unmounted) pool.
pub fn check_pool(pool: &Pool) -> Result<CheckReport> {
    if pool.meta.is_opaque() {
        return check_sealed(pool);
    }
    // Stored live counts include the decrements that wait (`live_debts`).
    let (r, owed) = pool.meta.read_owing()?;
    let mut rep = CheckReport::default();
    let mut s = Scan {
        names: pool.names.clone(),
        ..Scan::default()
    };
    let mut damaged = Vec::new();
    r.for_each_checked(|key, e| match e {
        Ok(e) => collect(e, &mut s, &mut rep.problems),
        Err(err) => damaged.push((ElemKey(key.to_vec()).obj(), err.to_string())),
    })?;
    let paths = paths(&s);
    for (obj, err) in damaged {
        rep.problems.push(damaged_record(&paths, obj, &err));
    }
    let orphans = r.orphans()?;
    check_namespace(&s, &paths, &orphans, &mut rep.problems);
    check_born_index(&r, &mut rep.problems);
    rep.inodes = s.inodes.len() as u64;
    rep.extents = s.extents.len() as u64;
    let rs = pool.record_size();
    let users = check_extents(&s, &paths, rs, &mut rep.problems);
    let mut chunk_recs = Vec::new();
    r.for_each_chunk(|id, raw| chunk_recs.push((id, ChunkRec::decode(raw))))?;
    check_dedup_index(&r, &mut rep.problems)?;
    check_pieces(&s, &chunk_recs, &paths, rs, &mut rep.problems);
    check_chunks(
        pool,
        &r,
        chunk_recs,
        s,
        &owed,
        &mut rep,
        |id, rec| match pool.chunks.read_chunk(rec, true) {
            Ok(d) => Ok(d.len() as u64),
            Err(err) => Err(unreadable_chunk(id, &err, &users, &paths, rs)),
        },
    )?;
    Ok(rep)
}

/// Every chunk record: its reference counts against those `s` found, its
/// bytes read and verified by `verify` (bytes verified, or the problem);
/// then references to missing chunks, the segments' figures and damaged
/// stripe records.
fn check_chunks(
    pool: &Pool,
    r: &cairn_meta::MetaRead,
    chunk_recs: Vec<(u64, std::result::Result<ChunkRec, cairn_data::DataError>)>,
    mut s: Scan,
    owed: &BTreeMap<u64, u64>,
    rep: &mut CheckReport,
    verify: impl Fn(u64, &ChunkRec) -> std::result::Result<u64, String>,
) -> Result<()> {
    let mut segs = SegCount::default();
    for (id, rec) in chunk_recs {
        rep.chunks += 1;
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                rep.problems.push(format!("chunk {id}: {e}"));
                continue;
            }
        };
        check_chunk_refs(id, &rec, &mut s, owed, &mut segs, &mut rep.problems);
        match verify(id, &rec) {
            Ok(n) => rep.bytes_verified += n,
            Err(why) => rep.problems.push(why),
        }
    }
    for (chunk, n) in &s.refs {
        rep.problems
            .push(format!("{n} element(s) reference missing chunk {chunk}"));
    }
    check_segments(pool, segs, &mut rep.problems);
    rep.problems.extend(damaged_stripes(r)?);
    Ok(())
}

/// Verifies a mirror of an encrypted pool opened without its key: every
/// element value against its checksum, every chunk's reference counts
/// against the chunk ids its sealed extents carry in the clear, every
/// chunk's stored bytes against their checksums (their authentication
/// needs the key), the segments' figures. Names, the namespace and the
/// file sizes are sealed: checked with the key.
fn check_sealed(pool: &Pool) -> Result<CheckReport> {
    let (r, owed) = pool.meta.read_owing()?;
    let (mut rep, mut s) = (CheckReport::default(), Scan::default());
    r.for_each_checked(|key, e| {
        let e = match e {
            Ok(e) => e,
            Err(err) => {
                return rep
                    .problems
                    .push(format!("{}: {err}", ElemKey(key.to_vec())))
            }
        };
        match crate::history::liveness::extent_chunks(&e, true) {
            Ok(ids) if e.key.rtype() == Some(RecordType::Extent) => {
                rep.extents += 1;
                for id in ids {
                    *s.refs.entry(id).or_default() += 1;
                    *s.live_refs.entry(id).or_default() += e.is_live() as u64;
                }
            }
            Ok(_) => rep.inodes += (e.key.rtype() == Some(RecordType::Inode) && e.is_live()) as u64,
            Err(err) => rep.problems.push(format!("{}: {err}", e.key)),
        }
    })?;
    let mut chunk_recs = Vec::new();
    r.for_each_chunk(|id, raw| chunk_recs.push((id, ChunkRec::decode(raw))))?;
    check_chunks(
        pool,
        &r,
        chunk_recs,
        s,
        &owed,
        &mut rep,
        |id, rec| match pool.chunks.read_stored(rec) {
            Ok((_, stored)) => Ok(stored.len() as u64),
            Err(err) => Err(format!("chunk {id}: {err}")),
        },
    )?;
    Ok(rep)
}

/// "stripe N: DAMAGED record ..." for each stripe record that does not
/// decode (left out at open: its segments have no parity); `check` and
/// scrub report them.
pub(crate) fn damaged_stripes(r: &cairn_meta::MetaRead) -> Result<Vec<String>> {
    let bad = (r.stripes()?.into_iter())
        .filter_map(|(id, raw)| Some((id, cairn_data::StripeRec::decode(&raw).err()?)));
    Ok(bad
        .map(|(id, e)| format!("stripe {id}: DAMAGED record ({e}): its segments have no parity"))
        .collect())
}

/// Which live file blocks use each chunk, for naming the files a damaged
/// chunk hurts; and no live extent past its file's end.
fn check_extents(
    s: &Scan,
    paths: &HashMap<u64, String>,
    rs: u64,
    problems: &mut Vec<String>,
) -> HashMap<u64, Vec<(u64, u64)>> {
    let mut users: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    for (ino, blk, x, live) in &s.extents {
        if !*live {
            continue;
        }
        for id in x.chunks() {
            users.entry(id).or_default().push((*ino, *blk));
        }
        if let Some(i) = s.inodes.get(ino) {
            if blk * rs >= i.size.max(1) {
                problems.push(format!(
                    "{}: extent at offset {} beyond end of file",
                    where_(paths, *ino),
                    blk * rs
                ));
            }
        }
    }
    users
}

/// Every dedup index entry names a stored chunk of that content.
fn check_dedup_index(r: &cairn_meta::MetaRead, problems: &mut Vec<String>) -> Result<()> {
    let mut index = Vec::new();
    r.for_each_dedup(|key, id| index.push((key, id)))?;
    for (key, id) in index {
        let ok = r
            .chunk(id)?
            .and_then(|raw| ChunkRec::decode(&raw).ok())
            .is_some_and(|rec| cairn_meta::dedup::key(&rec.hash) == key);
        if !ok {
            problems.push(format!(
                "dedup index entry {} names chunk {id}, which is missing or holds other content",
                crate::history::snapshot::hex(&key)
            ));
        }
    }
    Ok(())
}

/// What the chunk records say each segment holds: live bytes and chunks,
/// and history-only bytes.
#[derive(Default)]
struct SegCount {
    live: BTreeMap<u64, (u64, u64)>,
    hist: BTreeMap<u64, u64>,
}

/// A chunk's reference counts against the elements found, counting it into
/// its segment's figures.
fn check_chunk_refs(
    id: u64,
    rec: &ChunkRec,
    s: &mut Scan,
    owed: &BTreeMap<u64, u64>,
    segs: &mut SegCount,
    problems: &mut Vec<String>,
) {
    let counted = s.refs.remove(&id).unwrap_or(0);
    if counted != rec.refs {
        problems.push(format!(
            "chunk {id}: reference count {} but {counted} elements use it",
            rec.refs
        ));
    }
    let live_refs = s.live_refs.remove(&id).unwrap_or(0);
    let owed = owed.get(&id).copied().unwrap_or(0);
    if live_refs + owed != rec.live {
        problems.push(format!(
            "chunk {id}: live reference count {} ({owed} to go) but {live_refs} live elements use it",
            rec.live
        ));
    }
    let e = segs.hist.entry(rec.segment).or_default();
    // No reference at all: a tick's chunk waiting for its commit
    // (`writeback/tick.rs`), which its segment counts as live data.
    if live_refs == 0 && rec.refs > 0 {
        *e += rec.len as u64;
    }
    let e = segs.live.entry(rec.segment).or_default();
    e.0 += rec.len as u64;
    e.1 += 1;
}

/// A chunk that failed to read or verify, with the files it belongs to.
fn unreadable_chunk(
    id: u64,
    err: &dyn std::fmt::Display,
    users: &HashMap<u64, Vec<(u64, u64)>>,
    paths: &HashMap<u64, String>,
    rs: u64,
) -> String {
    let who: Vec<String> = users
        .get(&id)
        .into_iter()
        .flatten()
        .map(|(ino, blk)| format!("{} offset {}", where_(paths, *ino), blk * rs))
        .collect();
    let who = if who.is_empty() {
        "history only".into()
    } else {
        who.join(", ")
    };
    format!("chunk {id} ({who}): {err}")
}

/// The segment table's accounting against what the chunk records say.
fn check_segments(pool: &Pool, mut segs: SegCount, problems: &mut Vec<String>) {
    for (id, seg) in pool.chunks.segment_table() {
        let (live, n) = segs.live.remove(&id).unwrap_or((0, 0));
        if seg.live != live || seg.chunks != n {
            problems.push(format!(
                "segment {id}: accounts {} bytes in {} chunks, found {live} in {n}",
                seg.live, seg.chunks
            ));
        }
        let hist = segs.hist.remove(&id).unwrap_or(0);
        if seg.hist != hist {
            problems.push(format!(
                "segment {id}: accounts {} history-only bytes, found {hist}",
                seg.hist
            ));
        }
    }
    for id in segs.live.keys() {
        problems.push(format!(
            "chunks stored in segment {id}, which is not in the segment table"
        ));
    }
}

/// The index of live elements by create TID names each live element once,
/// at its create TID (mirror streams read what changed through it).
fn check_born_index(r: &cairn_meta::MetaRead, problems: &mut Vec<String>) {
    let live = r.sizes().map(|s| s.0);
    match (r.born_after(0), live) {
        (Ok(born), Ok(live)) if born.len() as u64 == live => {}
        (Ok(born), Ok(live)) => problems.push(format!(
            "the creation index (born_v1) names {} elements, the live table holds {live}",
            born.len()
        )),
        (Err(e), _) | (_, Err(e)) => problems.push(format!("the creation index (born_v1): {e}")),
    }
}

/// "PATH: DAMAGED metadata record: why" for a record of object `obj`.
pub(crate) fn damaged_record(paths: &HashMap<u64, String>, obj: u64, why: &str) -> String {
    format!("{}: DAMAGED metadata record: {why}", where_(paths, obj))
}

fn where_(paths: &HashMap<u64, String>, ino: u64) -> String {
    paths.get(&ino).cloned().unwrap_or(format!("<inode {ino}>"))
}

/// Every piece of an extent lies inside its chunk.
fn check_pieces(
    s: &Scan,
    recs: &[(u64, std::result::Result<ChunkRec, cairn_data::DataError>)],
    paths: &HashMap<u64, String>,
    rs: u64,
    problems: &mut Vec<String>,
) {
    let raw_len: HashMap<u64, u32> = recs
        .iter()
        .filter_map(|(id, r)| r.as_ref().ok().map(|r| (*id, r.raw_len)))
        .collect();
    for (ino, blk, x, _) in &s.extents {
        for p in &x.pieces {
            let fits = raw_len
                .get(&p.chunk)
                .is_some_and(|&n| p.from as u64 + p.len as u64 <= n as u64);
            if !fits {
                problems.push(format!(
                    "{}: the piece at offset {} names bytes chunk {} does not hold",
                    where_(paths, *ino),
                    blk * rs + p.off as u64,
                    p.chunk
                ));
            }
        }
    }
}
