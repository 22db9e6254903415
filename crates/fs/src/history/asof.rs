//! Read-only views of the tree as it was at a committed TID (HAMMER's
//! `@@0x<tid>`, and snapshots). Every lookup is an as-of lookup in the
//! element key space; nothing here takes the state lock or touches the
//! overlays, and nothing can change what a view shows.

use crate::error::{FsError, Result};
use crate::ops::readdir::DirEntry;
use crate::types::{DirEnt, Extent, FileKind, Inode, MAX_NAME};
use crate::vfs::Fs;
use cairn_meta::{ElemKey, MetaRead, RecordType};

/// The directory at the mount root that holds the snapshots' trees.
pub const SNAPSHOTS_DIR: &[u8] = b".snapshots";

/// Splits `NAME@@0x<hex>` into (NAME, tid). HAMMER writes 16 hex digits;
/// fewer are accepted.
pub fn parse_asof(name: &[u8]) -> Option<(&[u8], u64)> {
    let pos = name.windows(4).rposition(|w| w == b"@@0x")?;
    let hex = std::str::from_utf8(&name[pos + 4..]).ok()?;
    if hex.is_empty() || hex.len() > 16 {
        return None;
    }
    let tid = u64::from_str_radix(hex, 16).ok()?;
    Some((&name[..pos], tid))
}

impl Fs {
    /// A read of the committed metadata that can serve views at `tid`: the
    /// TID must be committed and its history whole (not older than the
    /// prune horizon unless a snapshot keeps it).
    pub(crate) fn view(&self, tid: u64) -> Result<MetaRead> {
        let r = self.meta()?;
        let whole =
            tid >= r.counter("pruned_tid")? || self.retained.read().binary_search(&tid).is_ok();
        if tid == 0 || tid > r.counter("last_tid")? || !whole {
            return Err(FsError::NoSuchTid(tid));
        }
        Ok(r)
    }

    fn inode_at(r: &MetaRead, ino: u64, tid: u64) -> Result<Inode> {
        let e = r.get_asof(&ElemKey::new(ino, RecordType::Inode, &[]), tid)?;
        e.map(|e| Inode::decode(ino, &e.payload))
            .transpose()?
            .ok_or(FsError::NotFound)
    }

    pub fn asof_getattr(&self, ino: u64, tid: u64) -> Result<Inode> {
        Self::inode_at(&self.view(tid)?, ino, tid)
    }

    pub fn asof_lookup(&self, dir: u64, tid: u64, name: &[u8]) -> Result<Inode> {
        if name.len() > MAX_NAME {
            return Err(FsError::NameTooLong);
        }
        let r = self.view(tid)?;
        if Self::inode_at(&r, dir, tid)?.kind != FileKind::Dir {
            return Err(FsError::NotDir);
        }
        let key = ElemKey::new(
            dir,
            RecordType::DirEntry,
            &self.names().dirent_subkey(dir, name),
        );
        let e = r.get_asof(&key, tid)?.ok_or(FsError::NotFound)?;
        Self::inode_at(&r, DirEnt::decode(&e.payload)?.ino, tid)
    }

    /// Lists a directory as it was at `tid`, from a cookie (as `readdir`).
    pub fn asof_readdir(
        &self,
        dir: u64,
        tid: u64,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<DirEntry>> {
        let r = self.view(tid)?;
        let d = Self::inode_at(&r, dir, tid)?;
        if d.kind != FileKind::Dir {
            return Err(FsError::NotDir);
        }
        let mut out = crate::ops::readdir::dot_entries(dir, d.parent, cookie);
        let all = r.scan_asof(&ElemKey::prefix(dir, RecordType::DirEntry), tid)?;
        for e in all {
            let (hash, name) = self.names().dirent_name(dir, e.key.sub())?;
            if hash <= cookie.max(2) || crate::volumes::hidden(dir, &name) {
                continue;
            }
            let de = DirEnt::decode(&e.payload)?;
            out.push(DirEntry {
                name: name.to_vec(),
                ino: de.ino,
                kind: de.kind,
                cookie: hash,
            });
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "end - off is at most a u32 length asked; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    pub fn asof_read(&self, ino: u64, tid: u64, off: u64, size: u32) -> Result<Vec<u8>> {
        let r = self.view(tid)?;
        let i = Self::inode_at(&r, ino, tid)?;
        if i.kind == FileKind::Dir {
            return Err(FsError::IsDir);
        }
        let end = i.size.min(off.saturating_add(size as u64));
        if off >= end {
            return Ok(Vec::new());
        }
        let rs = self.record;
        let mut out = vec![0u8; (end - off) as usize];
        for blk in off / rs..end.div_ceil(rs) {
            let key = ElemKey::extent(ino, blk);
            let Some(e) = r.get_asof(&key, tid)? else {
                continue;
            };
            self.read_extent_part(&r, ino, blk, &Extent::decode(&e.payload)?, off, &mut out)?;
        }
        Ok(out)
    }

    pub fn asof_readlink(&self, ino: u64, tid: u64) -> Result<Vec<u8>> {
        let r = self.view(tid)?;
        if Self::inode_at(&r, ino, tid)?.kind != FileKind::Symlink {
            return Err(FsError::Invalid);
        }
        let e = r.get_asof(&ElemKey::new(ino, RecordType::Symlink, &[]), tid)?;
        e.map(|e| e.payload).ok_or(FsError::Invalid)
    }

    pub fn asof_getxattr(&self, ino: u64, tid: u64, name: &[u8]) -> Result<Vec<u8>> {
        let r = self.view(tid)?;
        Self::inode_at(&r, ino, tid)?;
        let key = ElemKey::new(
            ino,
            RecordType::Xattr,
            &self.names().xattr_subkey(ino, name),
        );
        let e = r.get_asof(&key, tid)?;
        e.map(|e| e.payload).ok_or(FsError::NoAttr)
    }

    /// Names, each followed by a NUL, as listxattr(2) returns them.
    pub fn asof_listxattr(&self, ino: u64, tid: u64) -> Result<Vec<u8>> {
        let r = self.view(tid)?;
        Self::inode_at(&r, ino, tid)?;
        let mut out = Vec::new();
        for e in r.scan_asof(&ElemKey::prefix(ino, RecordType::Xattr), tid)? {
            out.extend_from_slice(&self.names().xattr_name(ino, e.key.sub())?);
            out.push(0);
        }
        Ok(out)
    }
}
