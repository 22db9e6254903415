//! Namespace operations: lookup, create, link, unlink, rename, attributes,
//! symlinks, xattrs. Each edits the dirty overlay under the
//! state lock; the flusher commits it.

use crate::error::{invariant, FsError, Result};
use crate::types::{DirEnt, FileKind, Inode, Time};
use crate::vfs::{check_name, Ctx, Fs, State};
use std::sync::atomic::Ordering;

/// Attribute changes of setattr; None leaves a field as it is.
#[derive(Debug, Default, Clone)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
    pub ctime: Option<Time>,
    /// Drop the set-id bits as a truncate by a caller without CAP_FSETID
    /// does (the kernel leaves this to us: FUSE_HANDLE_KILLPRIV_V2).
    pub kill_setid: bool,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

#[derive(Debug, Clone, Copy)]
pub enum XattrMode {
    Any,
    Create,
    Replace,
}

impl Fs {
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Inode> {
        self.with_inos(&[parent], |st| self.lookup_locked(st, parent, name))
    }

    pub(crate) fn lookup_locked(&self, st: &State, parent: u64, name: &[u8]) -> Result<Inode> {
        self.dir_inode(st, parent)?;
        let e = self.dirent(st, parent, name)?.ok_or(FsError::NotFound)?;
        self.inode(st, e.ino)
    }

    pub fn getattr(&self, ino: u64) -> Result<Inode> {
        self.inode(&self.lock_inos(&[ino]), ino)
    }

    pub fn setattr(&self, ino: u64, a: &SetAttr) -> Result<Inode> {
        self.check_ok()?;
        if let Some(size) = a.size {
            self.truncate(ino, size)?;
        }
        let mut st = self.lock_inos(&[ino]);
        let mut i = self.inode(&st, ino)?;
        let now = Self::now();
        if let Some(m) = a.mode {
            i.perm = (m & 0o7777) as u16;
        }
        let chown = a.uid.is_some() || a.gid.is_some();
        if (chown || a.kill_setid) && i.kind != FileKind::Dir && a.mode.is_none() {
            // Like the kernel: chown of a non-directory, and a truncate by
            // a caller without CAP_FSETID, drop the set-id bits.
            i.perm = drop_setid(i.perm);
        }
        i.uid = a.uid.unwrap_or(i.uid);
        i.gid = a.gid.unwrap_or(i.gid);
        if let Some(t) = a.atime {
            i.atime = t;
        }
        if let Some(t) = a.mtime {
            i.mtime = t;
        }
        i.ctime = a.ctime.unwrap_or(now);
        st.put_inode(i.clone());
        Ok(i)
    }

    /// Drops the set-id bits of a file as a write by a caller without
    /// CAP_FSETID does (FUSE_WRITE_KILL_SUIDGID; see `SetAttr::kill_setid`).
    pub fn kill_setid(&self, ino: u64) -> Result<()> {
        self.check_ok()?;
        let mut st = self.lock_inos(&[ino]);
        let mut i = self.inode(&st, ino)?;
        let perm = drop_setid(i.perm);
        if perm != i.perm && i.kind == FileKind::File {
            i.perm = perm;
            i.ctime = Self::now();
            st.put_inode(i);
        }
        Ok(())
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "S_ISGID is 0o2000, a permission bit"
    )]
    fn new_inode(
        ino: u64,
        ctx: Ctx,
        parent: &Inode,
        kind: FileKind,
        mode: u32,
        rdev: u32,
    ) -> Inode {
        let now = Self::now();
        let mut perm = (mode & 0o7777) as u16;
        let setgid_dir = parent.perm & libc::S_ISGID as u16 != 0;
        let gid = if setgid_dir { parent.gid } else { ctx.gid };
        if setgid_dir && kind == FileKind::Dir {
            perm |= libc::S_ISGID as u16;
        }
        Inode {
            ino,
            kind,
            perm,
            uid: ctx.uid,
            gid,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            rdev,
            parent: if kind == FileKind::Dir { parent.ino } else { 0 },
        }
    }

    /// Creates an inode of any kind under `parent` with the name `name`.
    pub(crate) fn create_node(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
    ) -> Result<Inode> {
        check_name(name)?;
        self.create_node_unchecked(ctx, parent, name, kind, mode, rdev)
    }

    /// `create_node` for names no POSIX caller can give (the hidden
    /// directory of volumes, see volumes/mod.rs).
    pub(crate) fn create_node_unchecked(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
    ) -> Result<Inode> {
        self.check_ok()?;
        let ino = self.alloc_ino();
        self.with_inos(&[parent, ino], |st| {
            let mut p = self.dir_inode(st, parent)?;
            if p.nlink == 0 {
                return Err(FsError::NotFound);
            }
            let (key, found) = self.dirent_keyed(st, parent, name)?;
            if found.is_some() {
                return Err(FsError::Exists);
            }
            self.inherit_nohistory(st, parent, ino)?;
            self.inherit_layout(st, parent, ino)?;
            let i = Self::new_inode(ino, ctx, &p, kind, mode, rdev);
            st.put_inode(i.clone());
            (st.dirty(parent)).put_entry(parent, key, Some(DirEnt { ino: i.ino, kind }));
            p.mtime = i.mtime;
            p.ctime = i.mtime;
            if kind == FileKind::Dir {
                p.nlink += 1;
            }
            st.put_inode(p);
            self.live_delta().fetch_add(1, Ordering::Relaxed);
            Ok(i)
        })
    }

    pub fn mknod(&self, ctx: Ctx, parent: u64, name: &[u8], mode: u32, rdev: u32) -> Result<Inode> {
        let kind = FileKind::from_mode(mode).ok_or(FsError::Invalid)?;
        if kind == FileKind::Dir || kind == FileKind::Symlink {
            return Err(FsError::Invalid);
        }
        self.create_node(ctx, parent, name, kind, mode, rdev)
    }

    pub fn mkdir(&self, ctx: Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Inode> {
        self.create_node(ctx, parent, name, FileKind::Dir, mode, 0)
    }

    /// Creates and opens a regular file.
    pub fn create(&self, ctx: Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Inode> {
        let i = self.create_node(ctx, parent, name, FileKind::File, mode, 0)?;
        let mut st = self.lock_inos(&[i.ino]);
        *st.sh_mut(i.ino).open.entry(i.ino).or_insert(0) += 1;
        Ok(i)
    }

    pub fn symlink(&self, ctx: Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Inode> {
        if target.is_empty() || target.len() > 4095 {
            return Err(if target.is_empty() {
                FsError::NotFound
            } else {
                FsError::NameTooLong
            });
        }
        let mut i = self.create_node(ctx, parent, name, FileKind::Symlink, 0o777, 0)?;
        let mut st = self.lock_inos(&[i.ino]);
        i.size = target.len() as u64;
        st.put_inode(i.clone());
        st.dirty(i.ino).put_symlink(i.ino, target.to_vec());
        Ok(i)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let st = self.lock_inos(&[ino]);
        if self.inode(&st, ino)?.kind != FileKind::Symlink {
            return Err(FsError::Invalid);
        }
        self.symlink_target(&st, ino)
    }

    pub fn link(&self, ino: u64, parent: u64, name: &[u8]) -> Result<Inode> {
        self.check_ok()?;
        check_name(name)?;
        self.with_inos(&[ino, parent], |st| self.link_locked(st, ino, parent, name))
    }

    fn link_locked(&self, st: &mut State, ino: u64, parent: u64, name: &[u8]) -> Result<Inode> {
        let mut i = self.inode(st, ino)?;
        if i.kind == FileKind::Dir {
            return Err(FsError::NotPermitted);
        }
        if i.nlink >= 65000 {
            return Err(FsError::TooManyLinks);
        }
        let mut p = self.dir_inode(st, parent)?;
        if p.nlink == 0 {
            return Err(FsError::NotFound);
        }
        if self.dirent(st, parent, name)?.is_some() {
            return Err(FsError::Exists);
        }
        let now = Self::now();
        if i.nlink == 0 {
            st.sh_mut(ino).unlinked.remove(&ino);
            st.dirty(ino).set_orphan(ino, false);
        }
        i.nlink += 1;
        i.ctime = now;
        p.mtime = now;
        p.ctime = now;
        st.dirty(parent).put_dirent(
            parent,
            self.names().dirent_subkey(parent, name),
            Some(DirEnt { ino, kind: i.kind }),
        );
        st.put_inode(i.clone());
        st.put_inode(p);
        Ok(i)
    }

    /// Drops one link of an inode; deletes it when it has no links left and
    /// nothing refers to it (no open handle, no kernel lookup: `refs.rs`).
    fn drop_link(&self, st: &mut State, mut i: Inode, now: Time) {
        i.nlink = if i.kind == FileKind::Dir {
            0
        } else {
            i.nlink.saturating_sub(1)
        };
        i.ctime = now;
        if i.nlink > 0 {
            st.put_inode(i);
        } else if Self::referenced(st, i.ino) {
            st.sh_mut(i.ino).unlinked.insert(i.ino);
            st.dirty(i.ino).set_orphan(i.ino, true);
            st.put_inode(i);
        } else {
            st.dirty(i.ino).delete_inode(i.ino);
            self.live_delta().fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_entry(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(FsError::Invalid);
        }
        if name == b".." {
            return Err(FsError::NotEmpty);
        }
        self.remove_entry(parent, name, true)
    }

    fn remove_entry(&self, parent: u64, name: &[u8], dir: bool) -> Result<()> {
        self.check_ok()?;
        self.with_inos(&[parent], |st| self.remove_locked(st, parent, name, dir))
    }

    fn remove_locked(&self, st: &mut State, parent: u64, name: &[u8], dir: bool) -> Result<()> {
        let mut p = self.dir_inode(st, parent)?;
        let (key, e) = self.dirent_keyed(st, parent, name)?;
        let e = e.ok_or(FsError::NotFound)?;
        let i = self.inode(st, e.ino)?;
        match (dir, i.kind == FileKind::Dir) {
            (true, false) => return Err(FsError::NotDir),
            (false, true) => return Err(FsError::IsDir),
            (true, true) if !self.dir_is_empty(st, i.ino)? => return Err(FsError::NotEmpty),
            _ => {}
        }
        // Link counts never go below what the entries make them (a
        // directory: 2 and one per subdirectory; a file: one per entry),
        // checked before anything changes.
        invariant!(
            !dir || p.nlink > 2,
            "directory {parent}: a subdirectory removed from a link count of {}",
            p.nlink
        );
        invariant!(
            dir || i.nlink > 0,
            "inode {}: an entry removed from a link count of 0",
            i.ino
        );
        let now = Self::now();
        st.dirty(parent).put_entry(parent, key, None);
        if dir {
            p.nlink -= 1;
        }
        p.mtime = now;
        p.ctime = now;
        st.put_inode(p);
        self.drop_link(st, i, now);
        Ok(())
    }

    /// Is `anc` the directory `ino` or one of its ancestors?
    fn is_ancestor(&self, st: &State, anc: u64, mut ino: u64) -> Result<bool> {
        for _ in 0..100_000 {
            if ino == anc {
                return Ok(true);
            }
            let i = self.inode(st, ino)?;
            if i.parent == ino || i.parent == 0 {
                return Ok(false);
            }
            ino = i.parent;
        }
        Err(FsError::Io(
            "directory parent chain too long (loop?)".into(),
        ))
    }

    pub fn rename(&self, p1: u64, n1: &[u8], p2: u64, n2: &[u8], flags: RenameFlags) -> Result<()> {
        self.check_ok()?;
        check_name(n2)?;
        if flags.noreplace && flags.exchange {
            return Err(FsError::Invalid);
        }
        self.with_inos(&[p1, p2], |st| {
            self.rename_locked(st, p1, n1, p2, n2, flags)
        })
    }

    fn rename_locked(
        &self,
        st: &mut State,
        p1: u64,
        n1: &[u8],
        p2: u64,
        n2: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.dir_inode(st, p1)?;
        if self.dir_inode(st, p2)?.nlink == 0 {
            return Err(FsError::NotFound);
        }
        let src = self.dirent(st, p1, n1)?.ok_or(FsError::NotFound)?;
        let dst = self.dirent(st, p2, n2)?;
        // Every inode the rename changes, before it changes anything.
        st.need(src.ino)?;
        if let Some(d) = dst {
            st.need(d.ino)?;
        }
        if src.kind == FileKind::Dir && p1 != p2 && self.is_ancestor(st, src.ino, p2)? {
            return Err(FsError::Invalid);
        }
        if flags.exchange {
            let dst = dst.ok_or(FsError::NotFound)?;
            if dst.kind == FileKind::Dir && p1 != p2 && self.is_ancestor(st, dst.ino, p1)? {
                return Err(FsError::Invalid);
            }
            return self.exchange(st, (p1, n1, src), (p2, n2, dst));
        }
        if let Some(d) = dst {
            if flags.noreplace {
                return Err(FsError::Exists);
            }
            if d.ino == src.ino {
                return Ok(());
            }
            let di = self.inode(st, d.ino)?;
            match (src.kind == FileKind::Dir, di.kind == FileKind::Dir) {
                (true, false) => return Err(FsError::NotDir),
                (false, true) => return Err(FsError::IsDir),
                (true, true) if !self.dir_is_empty(st, di.ino)? => return Err(FsError::NotEmpty),
                _ => {}
            }
            self.check_unlinks(st, p1, p2, src, &di)?;
            if di.kind == FileKind::Dir {
                let mut pp = self.inode(st, p2)?;
                pp.nlink -= 1;
                st.put_inode(pp);
            }
            self.drop_link(st, di, Self::now());
        } else {
            self.check_unlinks(st, p1, p2, src, &self.inode(st, src.ino)?)?;
        }
        self.move_entry(st, p1, n1, p2, n2, src)
    }

    /// Before a rename changes anything: the link counts it lowers are
    /// above what the entries make them (the source directory's, when a
    /// directory leaves it; the replaced inode's, `gone`, and its parent's
    /// when it is a directory).
    fn check_unlinks(&self, st: &State, p1: u64, p2: u64, src: DirEnt, gone: &Inode) -> Result<()> {
        if src.kind == FileKind::Dir && p1 != p2 {
            let a = self.inode(st, p1)?;
            invariant!(
                a.nlink > 2,
                "directory {p1}: a subdirectory moved out of a link count of {}",
                a.nlink
            );
        }
        if gone.ino == src.ino {
            return Ok(());
        }
        match gone.kind {
            FileKind::Dir => {
                let pp = self.inode(st, p2)?;
                invariant!(
                    pp.nlink > 2,
                    "directory {p2}: a subdirectory replaced in a link count of {}",
                    pp.nlink
                );
            }
            _ => invariant!(
                gone.nlink > 0,
                "inode {}: replaced by a rename with a link count of 0",
                gone.ino
            ),
        }
        Ok(())
    }

    fn move_entry(
        &self,
        st: &mut State,
        p1: u64,
        n1: &[u8],
        p2: u64,
        n2: &[u8],
        src: DirEnt,
    ) -> Result<()> {
        let now = Self::now();
        st.dirty(p1)
            .put_dirent(p1, self.names().dirent_subkey(p1, n1), None);
        st.dirty(p2)
            .put_dirent(p2, self.names().dirent_subkey(p2, n2), Some(src));
        let mut i = self.inode(st, src.ino)?;
        i.ctime = now;
        let is_dir = i.kind == FileKind::Dir;
        if is_dir {
            i.parent = p2;
        }
        st.put_inode(i);
        let mut a = self.inode(st, p1)?;
        a.mtime = now;
        a.ctime = now;
        if is_dir && p1 != p2 {
            a.nlink -= 1;
        }
        st.put_inode(a);
        let mut b = self.inode(st, p2)?;
        b.mtime = now;
        b.ctime = now;
        if is_dir && p1 != p2 {
            b.nlink += 1;
        }
        st.put_inode(b);
        Ok(())
    }

    fn exchange(
        &self,
        st: &mut State,
        a: (u64, &[u8], DirEnt),
        b: (u64, &[u8], DirEnt),
    ) -> Result<()> {
        let delta = (a.2.kind == FileKind::Dir) as i64 - (b.2.kind == FileKind::Dir) as i64;
        if a.0 != b.0 {
            for (p, d) in [(a.0, -delta), (b.0, delta)] {
                let n = self.inode(st, p)?.nlink as i64 + d;
                invariant!(
                    n >= 2,
                    "directory {p}: a link count of {n} after an exchange"
                );
            }
        }
        let now = Self::now();
        st.dirty(a.0)
            .put_dirent(a.0, self.names().dirent_subkey(a.0, a.1), Some(b.2));
        st.dirty(b.0)
            .put_dirent(b.0, self.names().dirent_subkey(b.0, b.1), Some(a.2));
        for (ent, new_parent) in [(a.2, b.0), (b.2, a.0)] {
            let mut i = self.inode(st, ent.ino)?;
            i.ctime = now;
            if i.kind == FileKind::Dir {
                i.parent = new_parent;
            }
            st.put_inode(i);
        }
        if a.0 != b.0 {
            for (p, d) in [(a.0, -delta), (b.0, delta)] {
                let mut pi = self.inode(st, p)?;
                pi.nlink = u32::try_from(i64::from(pi.nlink) + d).map_err(|_| {
                    FsError::invariant(format!("directory {p}: link count {} {d:+}", pi.nlink))
                })?;
                pi.mtime = now;
                pi.ctime = now;
                st.put_inode(pi);
            }
        } else {
            let mut pi = self.inode(st, a.0)?;
            pi.mtime = now;
            pi.ctime = now;
            st.put_inode(pi);
        }
        Ok(())
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        self.check_ok()?;
        if name.is_empty() || name.len() > 255 {
            return Err(if name.is_empty() {
                FsError::Invalid
            } else {
                FsError::Range
            });
        }
        if value.len() > 65536 {
            return Err(FsError::Range);
        }
        if !crate::history::nohistory::valid(name, value)
            || !crate::redundancy::path_policy::valid(name, value)
        {
            return Err(FsError::Invalid);
        }
        if name.starts_with(b"system.posix_acl_") {
            // POSIX ACLs are not supported: storing them as plain xattrs
            // would show an ACL whose rights the kernel never applies.
            return Err(FsError::NotSupported);
        }
        let mut st = self.lock_inos(&[ino]);
        let mut i = self.inode(&st, ino)?;
        let exists = self.xattr(&st, ino, name)?.is_some();
        match mode {
            XattrMode::Create if exists => return Err(FsError::Exists),
            XattrMode::Replace if !exists => return Err(FsError::NoAttr),
            _ => {}
        }
        st.dirty(ino)
            .put_xattr(ino, name.to_vec(), Some(value.to_vec()));
        i.ctime = Self::now();
        st.put_inode(i);
        drop(st);
        match crate::redundancy::path_policy::layout_named(name, value) {
            Some(layout) => self.note_path_layout(layout),
            None => Ok(()),
        }
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let st = self.lock_inos(&[ino]);
        self.inode(&st, ino)?;
        self.xattr(&st, ino, name)?.ok_or(FsError::NoAttr)
    }

    /// Names, each followed by a NUL, as listxattr(2) returns them.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let st = self.lock_inos(&[ino]);
        self.inode(&st, ino)?;
        let mut out = Vec::new();
        for n in self.xattr_names(&st, ino)? {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.check_ok()?;
        let mut st = self.lock_inos(&[ino]);
        let mut i = self.inode(&st, ino)?;
        if self.xattr(&st, ino, name)?.is_none() {
            return Err(FsError::NoAttr);
        }
        st.dirty(ino).put_xattr(ino, name.to_vec(), None);
        i.ctime = Self::now();
        st.put_inode(i);
        Ok(())
    }
}

/// Permission bits without set-user-ID, and without set-group-ID when the
/// group may execute (without group execute, S_ISGID marks mandatory
/// locking and stays), as the kernel drops them.
#[allow(
    clippy::cast_possible_truncation,
    reason = "S_ISUID and S_ISGID are permission bits below 0o10000"
)]
fn drop_setid(perm: u16) -> u16 {
    let mut p = perm & !(libc::S_ISUID as u16);
    if p & 0o010 != 0 {
        p &= !(libc::S_ISGID as u16);
    }
    p
}
