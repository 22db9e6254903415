//! Fine-grained history of one file: every stored version of its inode
//! element, each a commit (flush group) that changed it.

use crate::error::{FsError, Result};
use crate::types::{FileKind, Inode};
use crate::vfs::Fs;
use cairn_meta::{ElemKey, RecordType};

/// One version of a file.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Version {
    /// The commit that made this version.
    pub tid: u64,
    /// The commit that replaced it (None for the current version).
    pub ended_tid: Option<u64>,
    /// When that commit happened (unix ns).
    pub time_ns: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub kind: String,
}

impl Fs {
    /// Every stored version of inode `ino`, oldest first. Buffered changes
    /// are committed first so the list ends with what the file is now.
    pub fn history(&self, ino: u64) -> Result<Vec<Version>> {
        self.flush()?;
        let r = self.meta()?;
        let mut out = Vec::new();
        for e in r.versions(&ElemKey::new(ino, RecordType::Inode, &[]))? {
            let i = Inode::decode(ino, &e.payload)?;
            let time_ns = r.tid_time(e.create_tid)?.map_or(0, |(_, t)| t);
            out.push(Version {
                tid: e.create_tid,
                ended_tid: (!e.is_live()).then_some(e.delete_tid),
                time_ns,
                size: i.size,
                mtime_ns: i.mtime.as_nanos(),
                kind: kind_name(i.kind).to_string(),
            });
        }
        if out.is_empty() {
            return Err(FsError::NotFound);
        }
        Ok(out)
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
