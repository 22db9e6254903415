//! A file's or directory's own redundancy (`cairn redundancy set PATH
//! POLICY`): the extended attribute `user.cairn.redundancy` holds a layout
//! (`copies=N` or `ec=K+M`) that overrides the tier's for the file's data.
//! Like the nohistory switch it is an ordinary, versioned xattr, and nodes
//! made in a directory that has it get it too. The flush writes each
//! file's new chunks to open segments of its layout (the segment record
//! keeps the layout, `SegmentRec::layout`), and re-replication and
//! striping follow the segment's layout. `set_path_layout` sets the
//! attribute over a whole tree and moves the data already stored into
//! segments of the new layout. A chunk that other files or history share
//! (dedup) is moved only to a layout that survives as many lost devices
//! as the one it has: no file loses protection it asked for.

use crate::error::{FsError, Result};
use crate::ops::ns::XattrMode;
use crate::types::{DirEnt, Extent, FileKind};
use crate::vfs::{Fs, State};
use crate::writeback::overlay::Overlay;
use cairn_data::{ChunkRec, Layout};
use cairn_meta::{ElemKey, Element, MetaRead, RecordType};
use std::collections::HashMap;

/// The extended attribute holding a path's own layout.
pub const XATTR: &[u8] = b"user.cairn.redundancy";

/// The layout an attribute value names, if it names one.
pub(crate) fn parse(value: &[u8]) -> Option<Layout> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The layout `value` names when `name` is the policy's xattr.
pub(crate) fn layout_named(name: &[u8], value: &[u8]) -> Option<Layout> {
    (name == XATTR).then(|| parse(value)).flatten()
}

/// Accepted values of the attribute: a layout `Layout::from_str` reads.
pub(crate) fn valid(name: &[u8], value: &[u8]) -> bool {
    name != XATTR || parse(value).is_some()
}

/// What `set_path_layout` did.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct PathLayoutReport {
    /// Files and directories that got the new policy.
    pub nodes: u64,
    /// Files whose data was looked at.
    pub files: u64,
    pub chunks_moved: u64,
    pub bytes_moved: u64,
    /// Chunks other files or history share, kept at their stronger layout.
    pub shared_kept: u64,
    /// Chunks that could not be read, left where they are.
    pub damaged: Vec<String>,
}

impl Fs {
    /// Gives a new node `ino` made in `parent` the parent's own layout.
    pub(crate) fn inherit_layout(&self, st: &mut State, parent: u64, ino: u64) -> Result<()> {
        if let Some(v) = self.xattr(st, parent, XATTR)?.filter(|v| valid(XATTR, v)) {
            st.dirty(ino).put_xattr(ino, XATTR.to_vec(), Some(v));
        }
        Ok(())
    }

    /// The own layout of each of `inos` as the newest changes have it
    /// (for blocks stored before their flush, `tick.rs`).
    pub(crate) fn own_layouts(
        &self,
        inos: impl Iterator<Item = u64>,
    ) -> Result<HashMap<u64, Option<Layout>>> {
        let mut out = HashMap::new();
        for ino in inos {
            if let std::collections::hash_map::Entry::Vacant(e) = out.entry(ino) {
                let st = self.lock_inos(&[ino]);
                e.insert(self.xattr(&st, ino, XATTR)?.as_deref().and_then(parse));
            }
        }
        Ok(out)
    }

    /// Sets (or with None, removes) the own layout of `ino` and of every
    /// node under it, then moves the data they hold into segments of the
    /// layouts they now ask for (re-replication and striping make the
    /// copies and parity in the background).
    pub fn set_path_layout(&self, ino: u64, layout: Option<Layout>) -> Result<PathLayoutReport> {
        // The walk reads committed directories: what was just made first.
        self.flush()?;
        let mut rep = PathLayoutReport::default();
        let mut files = Vec::new();
        let mut stack = vec![ino];
        while let Some(n) = stack.pop() {
            let kind = self.getattr(n)?.kind;
            match layout {
                Some(l) => self.setxattr(n, XATTR, l.to_string().as_bytes(), XattrMode::Any)?,
                None => match self.removexattr(n, XATTR) {
                    Ok(()) | Err(FsError::NoAttr) => {}
                    Err(e) => return Err(e),
                },
            }
            rep.nodes += 1;
            match kind {
                FileKind::Dir => stack.extend(self.subdirs_and_files(n)?),
                FileKind::File => files.push(n),
                _ => {}
            }
        }
        self.flush()?;
        let want = |rec: &ChunkRec| self.chunk_wants(rec, layout);
        for f in files {
            rep.files += 1;
            let ids = self.file_chunks(f)?;
            let mut moving = Vec::new();
            let r = self.meta()?;
            for id in ids {
                let Some(raw) = r.chunk(id)? else { continue };
                let rec = ChunkRec::decode(&raw)?;
                match want(&rec) {
                    Move::No => {}
                    Move::Shared => rep.shared_kept += 1,
                    Move::Yes => moving.push(id),
                }
            }
            for part in moving.chunks(256) {
                let mut r = crate::maintenance::reblock::ReblockReport::default();
                self.move_chunks_as(part, None, Some(layout), &mut r)?;
                rep.chunks_moved += r.chunks_moved;
                rep.bytes_moved += r.bytes_moved;
                rep.damaged.extend(r.damaged);
            }
        }
        self.kick_resilver();
        Ok(rep)
    }

    /// Whether chunk `rec` moves for a file that asks for `layout`.
    fn chunk_wants(&self, rec: &ChunkRec, layout: Option<Layout>) -> Move {
        let chunks = &self.pool.chunks;
        let Some(seg) = chunks.segment(rec.segment) else {
            return Move::No;
        };
        if seg.layout == layout {
            return Move::No;
        }
        let now = chunks.layout_of(&seg);
        let then = chunks.layout_of(&cairn_data::SegmentRec { layout, ..seg });
        match (now, then) {
            (Some(a), Some(b)) if a == b => Move::No,
            // `copies()` counts ec=K+M as M+1: the lost devices survived, plus one.
            (Some(a), Some(b)) if rec.refs > 1 && b.copies() < a.copies() => Move::Shared,
            _ => Move::Yes,
        }
    }

    /// The children of directory `dir` (files and directories).
    fn subdirs_and_files(&self, dir: u64) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        scan_all(
            &self.meta()?,
            &ElemKey::prefix(dir, RecordType::DirEntry),
            |e| {
                let d = DirEnt::decode(&e.payload)?;
                if matches!(d.kind, FileKind::Dir | FileKind::File) {
                    out.push(d.ino);
                }
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// The chunks the committed extents of file `ino` name, each once.
    pub fn file_chunks(&self, ino: u64) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        scan_all(
            &self.meta()?,
            &ElemKey::prefix(ino, RecordType::Extent),
            |e| {
                let x = Extent::decode(&e.payload)?;
                out.extend(x.chunks().filter(|c| seen.insert(*c)));
                Ok(())
            },
        )?;
        Ok(out)
    }
}

/// Whether a chunk moves to a file's layout.
enum Move {
    No,
    Yes,
    /// It would lose protection another user of it may need.
    Shared,
}

/// Every live element under `prefix`, a page at a time.
fn scan_all(r: &MetaRead, prefix: &[u8], mut f: impl FnMut(Element) -> Result<()>) -> Result<()> {
    const PAGE: usize = 1024;
    let mut from: Option<Vec<u8>> = None;
    loop {
        let page = r.scan(prefix, from.as_deref(), PAGE)?;
        let n = page.len();
        if let Some(last) = page.last() {
            let mut next = last.key.as_bytes().to_vec();
            next.push(0);
            from = Some(next);
        }
        page.into_iter().try_for_each(&mut f)?;
        if n < PAGE {
            return Ok(());
        }
    }
}

/// The own layout of each of `inos` as a flush of `ov` writes them: the
/// overlay's attribute when it sets or removes one, else the committed.
pub(crate) fn layouts_in(
    ov: &Overlay,
    r: &MetaRead,
    names: &crate::names::Names,
    inos: impl Iterator<Item = u64>,
) -> Result<HashMap<u64, Option<Layout>>> {
    let mut out = HashMap::new();
    for ino in inos {
        if out.contains_key(&ino) {
            continue;
        }
        let pending = ov.xattrs.get(&ino).and_then(|m| m.get(XATTR)).cloned();
        let value = match pending {
            Some(v) => v,
            None => r.get(&names.xattr_key(ino, XATTR))?.map(|e| e.payload),
        };
        out.insert(ino, value.as_deref().and_then(parse));
    }
    Ok(out)
}
