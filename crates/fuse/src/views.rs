//! Historical views in the mount: `NAME@@0x<tid>` (HAMMER's syntax) names
//! a file or directory as it was at a TID, `@@0x<tid>` alone the directory
//! itself, and `/.snapshots/NAME` the root of a snapshot. The kernel needs
//! an inode number per (inode, TID) pair: view inodes are numbered from
//! VIEW_BASE up, counted by lookups and dropped when the kernel forgets
//! them. Everything under a view is read-only.

use cairn_fs::{FileKind, Fs, FsError, Inode, Result, ROOT_INO};
use parking_lot::Mutex;
use std::collections::HashMap;

/// Real inode numbers stay below this; view inodes are above.
pub const SNAPDIR_INO: u64 = 1 << 62;
const VIEW_BASE: u64 = SNAPDIR_INO + 1;
/// The snapshots directory at the mount root.
pub const SNAPDIR_NAME: &[u8] = cairn_fs::history::asof::SNAPSHOTS_DIR;

/// What a FUSE inode number stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    Real(u64),
    SnapDir,
    View { ino: u64, tid: u64 },
}

#[derive(Default)]
struct Table {
    by_key: HashMap<(u64, u64), u64>,
    /// view inode -> (inode, tid, kernel lookup count)
    by_vino: HashMap<u64, (u64, u64, u64)>,
    next: u64,
}

pub struct Views {
    t: Mutex<Table>,
    /// The generation of this mount's view inodes in file handles (see
    /// `generation`), picked when the views are made.
    gen: u32,
}

impl Default for Views {
    /// Views with a generation of their own, for this mount.
    fn default() -> Self {
        Self {
            t: Mutex::default(),
            gen: fresh_generation(),
        }
    }
}

/// Set-uid and set-gid bits of files (not directories, where set-gid only
/// steers new files' groups).
const SET_ID: u16 = 0o6000;
/// Every permission bit of a device node.
const ALL_PERMS: u16 = 0o7777;

/// Views behave as if mounted `nosuid,nodev`, whatever the live tree's
/// options: an old version must not keep granting what the live tree took
/// back (a set-uid bit since removed, a device node since tightened). The
/// kernel honours set-id bits and opens device nodes from the attributes we
/// give it, so a view's file loses its set-id bits and a view's device node
/// every permission bit (with default_permissions no user but root can open
/// it, and root can open the device itself anyway). File capabilities are
/// hidden as well (`hides_xattr`).
pub fn nosuid_nodev(i: &mut Inode) {
    match i.kind {
        FileKind::CharDev | FileKind::BlockDev => i.perm &= !ALL_PERMS,
        FileKind::Dir => {}
        _ => i.perm &= !SET_ID,
    }
}

/// Extended attributes a view does not show: `security.capability` would
/// grant file capabilities at exec, which a `nosuid` mount ignores.
pub fn hides_xattr(name: &[u8]) -> bool {
    name == b"security.capability"
}

/// `list` (NUL-terminated names, as listxattr gives them) without the names
/// that `hides_xattr` hides.
pub fn without_hidden_xattrs(list: Vec<u8>) -> Vec<u8> {
    list.split_inclusive(|&b| b == 0)
        .filter(|n| !hides_xattr(n.strip_suffix(&[0]).unwrap_or(n)))
        .flatten()
        .copied()
        .collect()
}

pub use cairn_fs::history::asof::parse_asof;

/// A generation for this mount's view inodes: nonzero, and different from
/// one mount to the next (std's per-process random hash keys over the
/// clock; the kernel keeps 32 bits of a generation).
#[allow(
    clippy::cast_possible_truncation,
    reason = "32 bits of a 64-bit hash are kept on purpose"
)]
fn fresh_generation() -> u32 {
    use std::hash::BuildHasher;
    let keys = std::collections::hash_map::RandomState::new();
    let g = keys.hash_one(std::time::SystemTime::now()) as u32;
    g.max(1)
}

impl Views {
    /// The table as handed to the next daemon (handover).
    pub fn export(&self) -> crate::handover::ViewTable {
        let t = self.t.lock();
        let entries = t.by_vino.iter().map(|(&v, &(i, tid, n))| (v, i, tid, n));
        crate::handover::ViewTable {
            generation: self.gen,
            next: t.next,
            entries: entries.collect(),
        }
    }

    /// Views that go on numbering as the daemon before did: the kernel
    /// still holds those view inodes, and handles carry the generation.
    pub fn adopt(h: &crate::handover::ViewTable) -> Views {
        let mut t = Table {
            next: h.next,
            ..Table::default()
        };
        for &(vino, ino, tid, n) in &h.entries {
            // Numbers below `next` only: the next view must not reuse one.
            assert!(
                vino >= VIEW_BASE && vino - VIEW_BASE < h.next,
                "view inode {vino:#x} out of range"
            );
            t.by_vino.insert(vino, (ino, tid, n));
            t.by_key.insert((ino, tid), vino);
        }
        Views {
            t: Mutex::new(t),
            gen: h.generation.max(1),
        }
    }

    /// The generation the kernel puts in a file handle of view inode
    /// `ino` (NFS export): this mount's own, since view inode numbers are
    /// handed out afresh at each mount, so that a handle of a view from an
    /// earlier mount gives ESTALE instead of naming whatever view got its
    /// number (0 for the snapshots directory, whose number is fixed).
    pub fn generation(&self, ino: u64) -> u64 {
        match ino > SNAPDIR_INO {
            true => u64::from(self.gen),
            false => 0,
        }
    }

    pub fn node(&self, ino: u64) -> Result<Node> {
        if ino < SNAPDIR_INO {
            return Ok(Node::Real(ino));
        }
        if ino == SNAPDIR_INO {
            return Ok(Node::SnapDir);
        }
        match self.t.lock().by_vino.get(&ino) {
            Some(&(ino, tid, _)) => Ok(Node::View { ino, tid }),
            None => Err(FsError::NotFound),
        }
    }

    /// The view inode of (ino, tid); `looked_up` counts one kernel lookup.
    pub fn vino(&self, ino: u64, tid: u64, looked_up: bool) -> u64 {
        // Real inode numbers stay below the views' (`node` tells them
        // apart by number alone).
        debug_assert!(ino < SNAPDIR_INO, "a view of inode {ino}");
        let mut t = self.t.lock();
        let t = &mut *t;
        let v = *t.by_key.entry((ino, tid)).or_insert_with(|| {
            let v = VIEW_BASE + t.next;
            t.next += 1;
            t.by_vino.insert(v, (ino, tid, 0));
            v
        });
        if looked_up {
            t.by_vino.get_mut(&v).expect("view in table").2 += 1;
        }
        debug_assert_eq!(t.by_key.len(), t.by_vino.len(), "view maps differ");
        v
    }

    /// The kernel dropped `n` lookups of a view inode.
    pub fn forget(&self, vino: u64, n: u64) {
        let mut t = self.t.lock();
        let Some(e) = t.by_vino.get_mut(&vino) else {
            return;
        };
        e.2 = e.2.saturating_sub(n);
        if e.2 == 0 {
            let (ino, tid, _) = *e;
            t.by_vino.remove(&vino);
            t.by_key.remove(&(ino, tid));
        }
    }

    /// An inode as seen through a view: its number is the view inode; its
    /// mode is the one it had (as ZFS and HAMMER show it: every change
    /// gets EROFS anyway, and `cp -a` out of a view keeps the modes), less
    /// what a `nosuid,nodev` mount would refuse (`nosuid_nodev`).
    pub fn present(&self, mut i: Inode, tid: u64, looked_up: bool) -> Inode {
        i.ino = self.vino(i.ino, tid, looked_up);
        nosuid_nodev(&mut i);
        i
    }

    /// Is `name` in real directory `parent` a view (`NAME@@0x<tid>`, or
    /// `.snapshots` at the root)? Such names cannot be changed.
    pub fn is_view_name(&self, parent: u64, name: &[u8]) -> bool {
        (parent == ROOT_INO && name == SNAPDIR_NAME) || parse_asof(name).is_some()
    }

    /// The synthetic snapshots directory.
    pub fn snapdir_inode(fs: &Fs) -> Result<Inode> {
        let mut i = fs.getattr(ROOT_INO)?;
        i.ino = SNAPDIR_INO;
        i.perm = 0o555;
        i.nlink = 2;
        i.uid = 0;
        i.gid = 0;
        i.size = 0;
        Ok(i)
    }

    /// Resolves `name` in a real directory when it is a view name.
    pub fn lookup_special(&self, fs: &Fs, parent: u64, name: &[u8]) -> Option<Result<Inode>> {
        if parent == ROOT_INO && name == SNAPDIR_NAME {
            return Some(Self::snapdir_inode(fs));
        }
        let (base, tid) = parse_asof(name)?;
        let r = if base.is_empty() {
            fs.asof_getattr(parent, tid)
        } else {
            fs.asof_lookup(parent, tid, base)
        };
        Some(r.map(|i| self.present(i, tid, true)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asof_names() {
        assert_eq!(
            parse_asof(b"file@@0x0000000000000012"),
            Some((&b"file"[..], 0x12))
        );
        assert_eq!(parse_asof(b"@@0x1f"), Some((&b""[..], 0x1f)));
        assert_eq!(parse_asof(b"a@@0xzz"), None);
        assert_eq!(parse_asof(b"a@@0x00000000000000001"), None);
        assert_eq!(parse_asof(b"plain"), None);
    }

    #[test]
    fn view_inodes_are_counted_and_forgotten() {
        let v = Views::default();
        let a = v.vino(5, 9, true);
        assert_eq!(v.vino(5, 9, true), a);
        assert_ne!(v.vino(5, 10, true), a);
        assert_eq!(v.node(a).unwrap(), Node::View { ino: 5, tid: 9 });
        v.forget(a, 1);
        assert!(v.node(a).is_ok());
        v.forget(a, 1);
        assert!(v.node(a).is_err());
        assert_eq!(v.node(3).unwrap(), Node::Real(3));
    }
}
