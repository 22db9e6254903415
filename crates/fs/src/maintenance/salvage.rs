//! `cairn check` on a pool whose metadata store failed its integrity check
//! (`MetaError::Damaged`): the store is opened as a copy in RAM without
//! trusting it, the tree is walked from the root one guarded lookup at a
//! time, and every file whose inode, entries, extents or chunk records cannot
//! be read intact is named by path. A full pass over each table then reports
//! what failed there, since that damage may belong to no file the walk
//! reached. Nothing is written.

use crate::error::Result;
use crate::maintenance::check::CheckReport;
use crate::pool::{read_superblock, PoolPaths};
use crate::types::{split_dirent_subkey, DirEnt, Extent, FileKind, Inode, ROOT_INO};
use cairn_data::ChunkRec;
use cairn_meta::{ElemKey, MetaRead, MetaStore, RecordType};
use std::collections::{HashSet, VecDeque};
use std::path::Path;

/// The report for a pool whose metadata store is damaged: always has at
/// least one problem (the failed integrity check itself).
pub fn salvage_pool(pool: &Path, why: &str) -> Result<CheckReport> {
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

/// Walks the live tree from the root, naming each file whose records fail.
fn walk(r: &MetaRead, rs: u64, rep: &mut CheckReport) {
    let mut q = VecDeque::from([(ROOT_INO, "/".to_string())]);
    let mut seen = HashSet::new();
    while let Some((ino, path)) = q.pop_front() {
        if !seen.insert(ino) {
            continue;
        }
        rep.inodes += 1;
        let inode = match r.get(&ElemKey::new(ino, RecordType::Inode, &[])) {
            Ok(Some(e)) => Inode::decode(ino, &e.payload).map_err(|e| e.to_string()),
            Ok(None) => Err("inode record missing".to_string()),
            Err(e) => Err(e.to_string()),
        };
        let inode = match inode {
            Ok(i) => i,
            Err(why) => {
                rep.problems.push(format!("{path}: DAMAGED: inode: {why}"));
                continue;
            }
        };
        let res = match inode.kind {
            FileKind::Dir => entries(r, ino, &path, &mut q),
            FileKind::File => extents(r, ino, &inode, rs, rep),
            _ => Ok(()),
        };
        if let Err(why) = res {
            rep.problems.push(format!("{path}: DAMAGED: {why}"));
        }
    }
}

fn entries(
    r: &MetaRead,
    dir: u64,
    path: &str,
    q: &mut VecDeque<(u64, String)>,
) -> std::result::Result<(), String> {
    let prefix = ElemKey::prefix(dir, RecordType::DirEntry);
    let ents = r
        .scan(&prefix, None, usize::MAX)
        .map_err(|e| format!("directory entries: {e}"))?;
    for e in ents {
        let (_, name) = split_dirent_subkey(e.key.sub()).map_err(|e| e.to_string())?;
        let name = String::from_utf8_lossy(name).into_owned();
        let d = DirEnt::decode(&e.payload).map_err(|err| format!("entry {name:?}: {err}"))?;
        let base = if path == "/" { "" } else { path };
        q.push_back((d.ino, format!("{base}/{name}")));
    }
    Ok(())
}

/// A file's extents must decode and name chunk records that decode.
fn extents(
    r: &MetaRead,
    ino: u64,
    inode: &Inode,
    rs: u64,
    rep: &mut CheckReport,
) -> std::result::Result<(), String> {
    let prefix = ElemKey::prefix(ino, RecordType::Extent);
    let exts = r
        .scan(&prefix, None, usize::MAX)
        .map_err(|e| format!("extents: {e}"))?;
    for e in exts {
        rep.extents += 1;
        let blk = u64::from_be_bytes(e.key.sub().try_into().unwrap_or([0xff; 8]));
        let at = blk.saturating_mul(rs);
        let x = Extent::decode(&e.payload).map_err(|err| format!("extent at {at}: {err}"))?;
        if at >= inode.size.max(1) {
            return Err(format!("extent at offset {at} beyond end of file"));
        }
        for id in x.chunks() {
            match r.chunk(id) {
                Ok(Some(raw)) => {
                    ChunkRec::decode(&raw)
                        .map_err(|err| format!("offset {at}: chunk record {id}: {err}"))?;
                    rep.chunks += 1;
                }
                Ok(None) => return Err(format!("offset {at}: chunk record {id} missing")),
                Err(err) => return Err(format!("offset {at}: chunk record {id}: {err}")),
            }
        }
    }
    Ok(())
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
