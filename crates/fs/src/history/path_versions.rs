//! History that follows a path (issue 54). Editors and tools save by
//! writing a temporary file and renaming it over the name, so each save is
//! a new inode and the inode's own history (`versions.rs`) shows only the
//! last one. A directory entry is an element of its own, keyed by (parent
//! directory, name): its versions say which inode the name held from when
//! to when, and within each such span the inode's versions are the path's.
//! A directory renamed keeps its inode, so the entries in it keep theirs.

use super::asof::{parse_asof, SNAPSHOTS_DIR};
use super::versions::{
    assert_ordered, inode_history, inode_versions, version, with_times, Version,
};
use crate::error::{FsError, Result};
use crate::types::{DirEnt, FileKind, MAX_NAME, ROOT_INO};
use crate::vfs::Fs;
use cairn_meta::{ElemKey, Element, MetaRead, RecordType};
use std::collections::HashMap;

/// Where a path relative to a mount's root leads: the name `name` in
/// directory `dir` (None: `dir` itself, for the root or a view of a whole
/// directory, `@@0x<tid>`), seen through the view at `tid` (None: the live
/// tree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathAt {
    pub dir: u64,
    pub name: Option<Vec<u8>>,
    pub tid: Option<u64>,
}

impl Fs {
    /// The versions of a path relative to the mount root, as the mount
    /// shows it (`.snapshots/NAME/...` and `NAME@@0x<tid>` are views: the
    /// history as it was at their TID), oldest first. `inode_only`: the
    /// versions of the inode the path names instead. Buffered changes are
    /// committed first.
    pub fn path_history(&self, rel: &[u8], inode_only: bool) -> Result<Vec<Version>> {
        self.flush()?;
        let at = self.resolve_view_path(rel)?;
        let r = self.meta()?;
        let mut v = match (&at.name, inode_only) {
            (Some(name), false) => name_versions(&r, self.names(), at.dir, name)?,
            (Some(name), true) => inode_history(&r, self.ino_at(at.dir, name, at.tid)?)?,
            (None, _) => inode_history(&r, at.dir)?,
        };
        if let Some(t) = at.tid {
            as_of(&mut v, t);
        }
        if v.is_empty() {
            return Err(FsError::NotFound);
        }
        Ok(v)
    }

    /// Follows `rel` from the root: live lookups until a view
    /// (`.snapshots/NAME` at the root, `NAME@@0x<tid>` or `@@0x<tid>`), and
    /// as-of lookups at its TID after it, as the mount resolves them.
    pub fn resolve_view_path(&self, rel: &[u8]) -> Result<PathAt> {
        let mut at = PathAt {
            dir: ROOT_INO,
            name: None,
            tid: None,
        };
        let mut comps = rel
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".");
        while let Some(c) = comps.next() {
            if let Some(n) = at.name.take() {
                at.dir = self.dir_at(at.dir, &n, at.tid)?;
            }
            if c == b".." {
                return Err(FsError::Invalid);
            }
            if at.dir == ROOT_INO && at.tid.is_none() && c == SNAPSHOTS_DIR {
                let snap = comps.next().ok_or(FsError::Invalid)?;
                let snap = std::str::from_utf8(snap).map_err(|_| FsError::Invalid)?;
                at.tid = Some(self.snapshot(snap)?.tid);
                continue;
            }
            match parse_asof(c) {
                Some((base, t)) => {
                    at.tid = Some(t);
                    at.name = (!base.is_empty()).then(|| base.to_vec());
                }
                None => at.name = Some(c.to_vec()),
            }
        }
        if let Some(t) = at.tid {
            self.view(t)?;
        }
        Ok(at)
    }

    /// The inode `name` in `dir` names now (tid None) or at `tid`.
    fn ino_at(&self, dir: u64, name: &[u8], tid: Option<u64>) -> Result<u64> {
        Ok(match tid {
            None => self.lookup(dir, name)?.ino,
            Some(t) => self.asof_lookup(dir, t, name)?.ino,
        })
    }

    /// The directory `name` in `dir` names now (tid None) or at `tid`.
    fn dir_at(&self, dir: u64, name: &[u8], tid: Option<u64>) -> Result<u64> {
        let i = match tid {
            None => self.lookup(dir, name)?,
            Some(t) => self.asof_lookup(dir, t, name)?,
        };
        if i.kind != FileKind::Dir {
            return Err(FsError::NotDir);
        }
        Ok(i.ino)
    }
}

/// Every version of the name `name` in directory `dir`, oldest first: for
/// each version of its directory entry, the versions of the inode it named
/// while it named it. Each inode's versions are read once.
pub(crate) fn name_versions(
    r: &MetaRead,
    names: &crate::names::Names,
    dir: u64,
    name: &[u8],
) -> Result<Vec<Version>> {
    if name.len() > MAX_NAME {
        return Err(FsError::NameTooLong);
    }
    let key = ElemKey::new(dir, RecordType::DirEntry, &names.dirent_subkey(dir, name));
    let mut inodes: HashMap<u64, Vec<Element>> = HashMap::new();
    let mut out: Vec<Version> = Vec::new();
    for d in r.versions(&key)? {
        let ino = DirEnt::decode(&d.payload)?.ino;
        let elems = match inodes.entry(ino) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(inode_versions(r, ino)?),
        };
        for e in elems.iter() {
            if e.create_tid >= d.delete_tid || e.delete_tid <= d.create_tid {
                continue;
            }
            let (from, to) = (
                e.create_tid.max(d.create_tid),
                e.delete_tid.min(d.delete_tid),
            );
            let mut v = version(ino, e, from, to)?;
            v.inode_changed = out.last().is_some_and(|p| p.ino != ino);
            out.push(v);
        }
    }
    assert_ordered(&out);
    with_times(r, out)
}

/// The history as it was at `tid`: versions made by then, the one current
/// then shown as current.
fn as_of(v: &mut Vec<Version>, tid: u64) {
    v.retain(|x| x.tid <= tid);
    for x in v.iter_mut() {
        if x.ended_tid.is_some_and(|e| e > tid) {
            x.ended_tid = None;
        }
    }
}
