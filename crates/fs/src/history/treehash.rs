//! Content hash of the tree at a TID: a BLAKE3 over a depth-first walk in
//! name order of every entry's name, kind, permissions, owner, size, times,
//! symlink target, xattrs and the content hash of each data block. Inode
//! numbers and chunk locations are left out, so reblock, prune and undo
//! cannot change it; nothing in Cairn is updated in place (mtime and atime
//! changes are new element versions), so a snapshot's hash never changes.

use crate::error::Result;
use crate::types::{DirEnt, Extent, FileKind, ROOT_INO};
use crate::vfs::Fs;
use cairn_data::ChunkRec;
use cairn_meta::{ElemKey, MetaRead, RecordType};

/// The hash of a tree with what was counted on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSum {
    pub hash: [u8; 32],
    /// Entries that are not directories.
    pub files: u64,
    /// Sum of file sizes.
    pub bytes: u64,
    /// Blocks whose stored data failed verification (only when the walk
    /// reads data): "path offset N: why".
    pub damaged: Vec<String>,
}

struct Node {
    path: String,
    name: Vec<u8>,
    ino: u64,
    depth: u32,
}

impl Fs {
    /// Hashes the tree at `tid` from metadata (block hashes as recorded).
    pub fn tree_hash(&self, tid: u64) -> Result<TreeSum> {
        self.walk_hash(tid, false)
    }

    /// Hashes the tree at `tid` and also reads every block, checking its
    /// stored checksum and content hash.
    pub fn tree_hash_verified(&self, tid: u64) -> Result<TreeSum> {
        self.walk_hash(tid, true)
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "a name is at most MAX_NAME (255) bytes"
    )]
    fn walk_hash(&self, tid: u64, read_data: bool) -> Result<TreeSum> {
        let r = self.view(tid)?;
        let mut h = blake3::Hasher::new();
        h.update(b"cairn-tree-v1");
        let mut sum = TreeSum {
            hash: [0; 32],
            files: 0,
            bytes: 0,
            damaged: Vec::new(),
        };
        let mut stack = vec![Node {
            path: String::new(),
            name: Vec::new(),
            ino: ROOT_INO,
            depth: 0,
        }];
        while let Some(n) = stack.pop() {
            let Some(e) = r.get_asof(&ElemKey::new(n.ino, RecordType::Inode, &[]), tid)? else {
                continue;
            };
            let i = crate::types::Inode::decode(n.ino, &e.payload)?;
            h.update(&n.depth.to_le_bytes());
            h.update(&(n.name.len() as u32).to_le_bytes());
            h.update(&n.name);
            h.update(&[i.kind.to_u8()]);
            for v in [
                i.perm as u64,
                i.uid as u64,
                i.gid as u64,
                i.nlink as u64,
                i.size,
                i.rdev as u64,
            ] {
                h.update(&v.to_le_bytes());
            }
            for t in [i.mtime, i.ctime] {
                h.update(&t.secs.to_le_bytes());
                h.update(&t.nsec.to_le_bytes());
            }
            for x in r.scan_asof(&ElemKey::prefix(n.ino, RecordType::Xattr), tid)? {
                hash_bytes(&mut h, &self.names().xattr_name(n.ino, x.key.sub())?);
                hash_bytes(&mut h, &x.payload);
            }
            match i.kind {
                FileKind::Dir => push_children(&r, self.names(), &n, tid, &mut stack)?,
                FileKind::Symlink => {
                    let t = r.get_asof(&ElemKey::new(n.ino, RecordType::Symlink, &[]), tid)?;
                    hash_bytes(&mut h, &t.map(|e| e.payload).unwrap_or_default());
                    sum.files += 1;
                }
                _ => {
                    sum.files += 1;
                    sum.bytes += i.size;
                    self.hash_blocks(&r, &n, tid, read_data, &mut h, &mut sum)?;
                }
            }
        }
        sum.hash = *h.finalize().as_bytes();
        Ok(sum)
    }

    fn hash_blocks(
        &self,
        r: &MetaRead,
        n: &Node,
        tid: u64,
        read_data: bool,
        h: &mut blake3::Hasher,
        sum: &mut TreeSum,
    ) -> Result<()> {
        for e in r.scan_asof(&ElemKey::prefix(n.ino, RecordType::Extent), tid)? {
            let blk = e.key.extent_block()?;
            let ext = Extent::decode(&e.payload)?;
            h.update(&blk.to_le_bytes());
            h.update(&ext.len.to_le_bytes());
            for p in &ext.pieces {
                for v in [p.off, p.len, p.from] {
                    h.update(&v.to_le_bytes());
                }
            }
            let offset = blk * self.record;
            for id in ext.chunks() {
                let Some(raw) = r.chunk(id)? else {
                    sum.damaged
                        .push(format!("{} offset {offset}: chunk {id} missing", n.path));
                    continue;
                };
                let rec = ChunkRec::decode(&raw)?;
                h.update(&rec.hash);
                if read_data {
                    if let Err(err) = self.pool.chunks.read_chunk(&rec, true) {
                        sum.damaged
                            .push(format!("{} offset {offset}: {err}", n.path));
                    }
                }
            }
        }
        Ok(())
    }
}

fn hash_bytes(h: &mut blake3::Hasher, b: &[u8]) {
    h.update(&(b.len() as u64).to_le_bytes());
    h.update(b);
}

/// Pushes a directory's entries (as of `tid`) so that they pop in name order.
fn push_children(
    r: &MetaRead,
    names: &crate::names::Names,
    n: &Node,
    tid: u64,
    stack: &mut Vec<Node>,
) -> Result<()> {
    let mut kids = Vec::new();
    for e in r.scan_asof(&ElemKey::prefix(n.ino, RecordType::DirEntry), tid)? {
        let (_, name) = names.dirent_name(n.ino, e.key.sub())?;
        kids.push((name.into_owned(), DirEnt::decode(&e.payload)?.ino));
    }
    kids.sort();
    for (name, ino) in kids.into_iter().rev() {
        stack.push(Node {
            path: format!("{}/{}", n.path, String::from_utf8_lossy(&name)),
            name,
            ino,
            depth: n.depth + 1,
        });
    }
    Ok(())
}
