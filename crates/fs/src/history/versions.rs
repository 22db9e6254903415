//! Fine-grained history of one file: every stored version of its inode
//! element, each a commit (flush group) that changed it. The history of a
//! path, which follows the name across new inodes, is `path_versions.rs`.

use crate::error::{FsError, Result};
use crate::types::{FileKind, Inode};
use crate::vfs::Fs;
use cairn_meta::{ElemKey, Element, MetaRead, RecordType, TID_MAX};

/// One version of a file.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Version {
    /// The commit that made this version (in a path's history: the first
    /// commit at which the path showed it, so `PATH@@0x<tid>` reads it).
    pub tid: u64,
    /// The commit that replaced it (None for the current version).
    pub ended_tid: Option<u64>,
    /// When that commit happened (unix ns).
    pub time_ns: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub kind: String,
    /// The inode this is a version of.
    #[serde(default)]
    pub ino: u64,
    /// In a path's history: the version before it was of another inode
    /// (a save by rename over the name, or a delete and a new create).
    /// Always false in an inode's own history and for the first version.
    #[serde(default)]
    pub inode_changed: bool,
}

impl Fs {
    /// Every stored version of inode `ino`, oldest first. Buffered changes
    /// are committed first so the list ends with what the file is now.
    pub fn history(&self, ino: u64) -> Result<Vec<Version>> {
        self.flush()?;
        let out = inode_history(&self.meta()?, ino)?;
        if out.is_empty() {
            return Err(FsError::NotFound);
        }
        Ok(out)
    }
}

/// Every stored version of inode `ino`, oldest first.
pub(crate) fn inode_history(r: &MetaRead, ino: u64) -> Result<Vec<Version>> {
    let mut out = Vec::new();
    for e in inode_versions(r, ino)? {
        out.push(version(ino, &e, e.create_tid, e.delete_tid)?);
    }
    assert_ordered(&out);
    with_times(r, out)
}

/// The stored versions of inode `ino`'s element, oldest first.
pub(crate) fn inode_versions(r: &MetaRead, ino: u64) -> Result<Vec<Element>> {
    Ok(r.versions(&ElemKey::new(ino, RecordType::Inode, &[]))?)
}

/// The version that inode element `e` of `ino` was from `from` until `to`
/// (TID_MAX: still current), its time left for `with_times`.
pub(crate) fn version(ino: u64, e: &Element, from: u64, to: u64) -> Result<Version> {
    let i = Inode::decode(ino, &e.payload)?;
    Ok(Version {
        tid: from,
        ended_tid: (to != TID_MAX).then_some(to),
        time_ns: 0,
        size: i.size,
        mtime_ns: i.mtime.as_nanos(),
        kind: kind_name(i.kind).to_string(),
        ino,
        inode_changed: false,
    })
}

/// `v` with each version's commit time (the TID table opened once).
pub(crate) fn with_times(r: &MetaRead, mut v: Vec<Version>) -> Result<Vec<Version>> {
    let tids: Vec<u64> = v.iter().map(|x| x.tid).collect();
    for (x, t) in v.iter_mut().zip(r.tid_times(&tids)?) {
        x.time_ns = t.map_or(0, |(_, t)| t);
    }
    Ok(v)
}

/// What holds of any history: each version ends after it starts, and
/// before (or where) the next one starts; only the last may be current.
pub(crate) fn assert_ordered(v: &[Version]) {
    for (i, x) in v.iter().enumerate() {
        let end = x.ended_tid.unwrap_or(TID_MAX);
        assert!(x.tid < end, "a version ends before it starts: {x:?}");
        if let Some(next) = v.get(i + 1) {
            assert!(
                end <= next.tid,
                "versions out of TID order: {x:?} then {next:?}"
            );
        }
    }
}

pub fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDev => "chardev",
        FileKind::BlockDev => "blockdev",
    }
}
