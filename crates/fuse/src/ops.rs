//! The fuser `Filesystem` implementation: one thin method per request, each
//! calling into cairn-fs and turning its typed errors into errnos. Every
//! reply that hands the kernel an entry of a live inode counts a lookup
//! reference in cairn-fs (view inodes are counted in `views.rs`), and
//! FORGET gives them back: an unlinked inode lives while the kernel may
//! still open it.

use crate::attr::{self, file_attr, file_attr_blocks, from_system, time_or_now};
use crate::metrics::{self, Op};
use crate::nocase;
use crate::opens::Invalidator;
use crate::views::{self, Node, Views, SNAPDIR_INO};
use cairn_fs::{
    Ctx, DirEntry, FileKind, Fs, FsError, Inode, RenameFlags as CRename, SetAttr, XattrMode,
    ROOT_INO,
};
use fuser::*;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Attributes and entries of the live tree may be cached this long: every
/// change to it goes through the kernel, which updates its own cache, so
/// the kernel's view does not go stale (a local filesystem, one writer).
const TTL: Duration = Duration::from_secs(60);
/// `.snapshots` and the views under it change behind the kernel's back
/// (`cairn snapshot create/delete`, prune): they are cached briefly.
const VIEW_TTL: Duration = Duration::from_secs(1);

pub struct CairnFuse {
    fs: Arc<Fs>,
    views: Arc<Views>,
    /// A mirror pool: its tree changes behind the kernel's back (streams),
    /// so everything is cached as briefly as the views, and file pages are
    /// dropped at each open.
    mirror: bool,
    /// The kernel opens files without asking (opens.rs): all but a mirror.
    no_open: bool,
    invalidator: Invalidator,
}

impl CairnFuse {
    pub fn new(fs: Arc<Fs>) -> Self {
        Self::with_views(fs, Arc::default())
    }

    /// Serves `views` (a table taken over from the daemon before: handover).
    pub fn with_views(fs: Arc<Fs>, views: Arc<Views>) -> Self {
        let mirror = fs.mirror_role().is_ok_and(|r| r.is_mirror());
        CairnFuse {
            fs,
            views,
            mirror,
            no_open: !mirror,
            invalidator: Invalidator::default(),
        }
    }

    /// Where the session's notifier goes once the session exists.
    pub fn invalidator(&self) -> Invalidator {
        self.invalidator.clone()
    }

    /// How long the kernel may cache the attributes and entry of `ino`.
    fn ttl(&self, ino: u64) -> &'static Duration {
        if ino >= SNAPDIR_INO || self.mirror {
            &VIEW_TTL
        } else {
            &TTL
        }
    }

    /// How an open file's cached pages are treated.
    fn open_flags(&self) -> FopenFlags {
        match self.mirror {
            true => FopenFlags::empty(),
            false => FopenFlags::FOPEN_KEEP_CACHE,
        }
    }

    /// True if any of these inodes is a historical view (read-only).
    fn in_view(&self, inos: &[INodeNo]) -> bool {
        inos.iter().any(|i| i.0 >= SNAPDIR_INO)
    }

    /// True if entry `name` of `parent` cannot be created, changed or
    /// removed: the directory is a view, or the name is a view name.
    fn fixed_name(&self, parent: INodeNo, name: &OsStr) -> bool {
        self.in_view(&[parent]) || self.views.is_view_name(parent.0, name.as_bytes())
    }

    /// Whether the kernel may remember that `name` is missing from
    /// `parent`: in the live tree of a live pool every name is made through
    /// this mount, which replaces the kernel's negative entry. A view,
    /// `.snapshots` and `@@` names gain entries behind the kernel's back (a
    /// snapshot taken later), and so does a mirror pool's whole tree.
    fn missing_is_cacheable(&self, parent: INodeNo, name: &OsStr) -> bool {
        !self.mirror && !self.fixed_name(parent, name)
    }

    /// Attributes of any inode, real or view.
    fn attr_of(&self, ino: u64) -> Result<Inode, FsError> {
        match self.views.node(ino)? {
            Node::Real(i) => self.fs.getattr(i),
            Node::SnapDir => Views::snapdir_inode(&self.fs),
            Node::View { ino, tid } => self
                .fs
                .asof_getattr(ino, tid)
                .map(|i| self.views.present(i, tid, false)),
        }
    }

    fn lookup_any(&self, parent: u64, name: &[u8]) -> Result<Inode, FsError> {
        if name == b"." || name == b".." {
            return self.lookup_by_number(parent, name == b"..");
        }
        match self.views.node(parent)? {
            Node::Real(p) => match self.views.lookup_special(&self.fs, p, name) {
                Some(r) => r,
                None => self.fs.lookup_ref(p, name),
            },
            Node::SnapDir => {
                let name = std::str::from_utf8(name).map_err(|_| FsError::NotFound)?;
                let s = self.fs.snapshot(name)?;
                let i = self.fs.asof_getattr(ROOT_INO, s.tid)?;
                Ok(self.views.present(i, s.tid, true))
            }
            Node::View { ino, tid } => self
                .fs
                .asof_lookup(ino, tid, name)
                .map(|i| self.views.present(i, tid, true)),
        }
    }

    /// The kernel's LOOKUPs of "." and ".." (sent only with export support,
    /// to decode an NFS file handle whose inode it no longer caches, and to
    /// find a decoded directory's parent): `ino` itself, or the directory
    /// holding it. A view inode's "." works while the kernel holds the view
    /// (a handle from an earlier mount fails on its generation); its ".."
    /// is not found, so a view directory whose dentry was evicted cannot be
    /// reconnected and gives ESTALE (docs/sharing.md).
    fn lookup_by_number(&self, ino: u64, parent: bool) -> Result<Inode, FsError> {
        match (self.views.node(ino)?, parent) {
            (Node::Real(i), false) => self.fs.lookup_self_ref(i),
            (Node::Real(i), true) => self.fs.lookup_parent_ref(i),
            (Node::SnapDir, false) => Views::snapdir_inode(&self.fs),
            (Node::SnapDir, true) => self.fs.lookup_self_ref(ROOT_INO),
            (Node::View { ino, tid }, false) => {
                (self.fs.asof_getattr(ino, tid)).map(|i| self.views.present(i, tid, true))
            }
            (Node::View { .. }, true) => Err(FsError::NotFound),
        }
    }

    /// A directory listing of any directory; entries of views carry view
    /// inode numbers when `looked_up` (readdirplus counts as a lookup).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a directory cookie is an index we gave out; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn list_any(
        &self,
        dir: u64,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<(DirEntry, Option<Inode>)>, FsError> {
        match self.views.node(dir)? {
            Node::Real(d) => Ok(self
                .fs
                .readdir(d, cookie, max)?
                .into_iter()
                .map(|e| (e, None))
                .collect()),
            Node::SnapDir => {
                let snaps = self.fs.snapshots()?;
                let mut out = Vec::new();
                for (n, name) in [&b"."[..], b".."]
                    .into_iter()
                    .enumerate()
                    .skip(cookie as usize)
                {
                    let e = DirEntry {
                        name: name.to_vec(),
                        ino: if n == 0 { SNAPDIR_INO } else { ROOT_INO },
                        kind: FileKind::Dir,
                        cookie: n as u64 + 1,
                    };
                    out.push((e, None));
                }
                for (n, s) in snaps
                    .iter()
                    .enumerate()
                    .skip((cookie as usize).saturating_sub(2))
                {
                    let i = self.fs.asof_getattr(ROOT_INO, s.tid)?;
                    let e = DirEntry {
                        name: s.name.as_bytes().to_vec(),
                        ino: i.ino,
                        kind: FileKind::Dir,
                        cookie: n as u64 + 3,
                    };
                    out.push((e, Some(i)));
                    if out.len() >= max {
                        break;
                    }
                }
                Ok(out)
            }
            Node::View { ino, tid } => {
                let mut out = Vec::new();
                for e in self.fs.asof_readdir(ino, tid, cookie, max)? {
                    let i = self.fs.asof_getattr(e.ino, tid)?;
                    out.push((e, Some(i)));
                }
                Ok(out)
            }
        }
    }

    /// FUSE attributes; st_blocks of live regular files from the blocks
    /// they really store (views: from the size).
    fn fattr(&self, i: &Inode) -> FileAttr {
        if i.kind == FileKind::File && i.ino < SNAPDIR_INO {
            file_attr_blocks(i, self.fs.stored_blocks_of(i))
        } else {
            file_attr(i)
        }
    }

    /// Counts the lookup reference of a new entry (create, mkdir, mknod,
    /// symlink, link) about to be sent to the kernel.
    fn counted(&self, r: Result<Inode, FsError>) -> Result<Inode, FsError> {
        if let Ok(i) = &r {
            self.fs.add_lookup_ref(i.ino);
        }
        r
    }

    /// The generation of `ino` in file handles (NFS export): a view's is
    /// this mount's (`Views::generation`), a real inode's the epoch of the
    /// open that numbered it (`Fs::generation`).
    fn generation(&self, ino: u64) -> Generation {
        match ino >= SNAPDIR_INO {
            true => Generation(self.views.generation(ino)),
            false => Generation(self.fs.generation(ino)),
        }
    }

    fn entry(&self, reply: ReplyEntry, r: Result<Inode, FsError>) {
        match r {
            Ok(i) => {
                let generation = self.generation(i.ino);
                reply.entry(self.ttl(i.ino), &self.fattr(&i), generation)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// The tid of a view inode's entries (for presenting them).
    fn view_tid(&self, dir: u64) -> Option<u64> {
        match self.views.node(dir) {
            Ok(Node::View { tid, .. }) => Some(tid),
            _ => None,
        }
    }
}

fn errno(e: FsError) -> Errno {
    if matches!(
        e,
        FsError::Io(_)
            | FsError::Meta(_)
            | FsError::Data(_)
            | FsError::Device(_)
            | FsError::Failed(_)
    ) {
        crate::ratelimit::warn(format!("request failed: {e}"));
    }
    Errno::from_i32(e.errno())
}

/// The errno of a failed read. An I/O error (a device that failed the
/// read, or a chunk whose checksum does not match) is logged with the file
/// and the range it hit, rate-limited; `cairn scrub` lists damaged chunks
/// with the files that use them.
fn read_failed(ino: u64, offset: u64, size: u32, e: FsError) -> Errno {
    if e.errno() != libc::EIO {
        return errno(e);
    }
    let end = offset.saturating_add(size as u64);
    crate::ratelimit::warn(format!(
        "read of inode {ino} bytes {offset}..{end} failed: {e}"
    ));
    Errno::from_i32(libc::EIO)
}

fn ctx(req: &Request) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

/// What the mount asks of the kernel at INIT: capabilities and sizes
/// (also the in-memory file system of bench/roundtrip.sh, so that its
/// ceiling is measured with the same requests).
pub fn negotiate(config: &mut KernelConfig) {
    // No FUSE_WRITEBACK_CACHE: without OPEN, a refused write to a view
    // must fail in write(2) itself (opens.rs); and it makes small-file
    // loads slower, not faster (a SETATTR of the times at each close
    // and unlink: docs/transport.md, "The round-trip floor").
    for cap in [
        InitFlags::FUSE_DO_READDIRPLUS,
        InitFlags::FUSE_READDIRPLUS_AUTO,
        InitFlags::FUSE_PARALLEL_DIROPS,
        InitFlags::FUSE_ASYNC_READ,
        InitFlags::FUSE_BIG_WRITES,
        InitFlags::FUSE_MAX_PAGES,
        InitFlags::FUSE_CACHE_SYMLINKS,
        // File handles that survive the kernel's caches, a remount and
        // a restart, for NFS servers (LOOKUPs of "." and "..").
        InitFlags::FUSE_EXPORT_SUPPORT,
        // We drop set-id bits on write/truncate/chown ourselves; in
        // return the kernel may skip the GETXATTR(security.capability)
        // of a write(2) and a GETATTR per chown. It skips it only while
        // the inode has S_NOSEC, which every reply carrying attributes
        // clears (fuse_change_attributes): under postmark on 6.18, one
        // GETXATTR still came per WRITE.
        InitFlags::FUSE_HANDLE_KILLPRIV_V2,
    ] {
        if config.add_capabilities(cap).is_err() {
            tracing::info!("kernel lacks FUSE capability {cap:?}");
        }
    }
    let _ = config.set_max_write(1 << 20);
    let _ = config.set_max_readahead(1 << 20);
    let _ = config.set_max_background(64);
}

impl Filesystem for CairnFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        negotiate(config);
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.fs.shutdown() {
            tracing::error!("final flush at unmount failed: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = metrics::timer(Op::Lookup);
        let r = self.lookup_any(parent.0, name.as_bytes());
        if matches!(r, Err(FsError::NotFound)) && self.missing_is_cacheable(parent, name) {
            // A negative entry (node 0): the kernel answers this name
            // itself for the TTL, or until it makes the name through us.
            return reply.entry(&TTL, &attr::missing(), Generation(0));
        }
        self.entry(reply, r);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if ino.0 > SNAPDIR_INO {
            self.views.forget(ino.0, nlookup);
        } else if ino.0 < SNAPDIR_INO {
            self.fs.forget(ino.0, nlookup);
        }
    }

    fn batch_forget(&self, _req: &Request, nodes: &[ForgetOne]) {
        let mut live = Vec::with_capacity(nodes.len());
        for n in nodes {
            let (ino, count) = (n.nodeid().0, n.nlookup());
            if ino > SNAPDIR_INO {
                self.views.forget(ino, count);
            } else if ino < SNAPDIR_INO {
                live.push((ino, count));
            }
        }
        self.fs.forget_many(&live);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = metrics::timer(Op::Getattr);
        if ino.0 < SNAPDIR_INO {
            // A live inode: its attributes and st_blocks under one lock.
            return match self.fs.getattr_blocks(ino.0) {
                Ok((i, blocks)) => reply.attr(self.ttl(i.ino), &file_attr_blocks(&i, blocks)),
                Err(e) => reply.error(errno(e)),
            };
        }
        match self.attr_of(ino.0) {
            Ok(i) => reply.attr(self.ttl(i.ino), &self.fattr(&i)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _t = metrics::timer(Op::Setattr);
        if self.in_view(&[ino]) {
            return reply.error(Errno::EROFS);
        }
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(from_system),
            // fuser does not pass FATTR_KILL_SUIDGID, which the kernel sets
            // on a truncate by a caller without CAP_FSETID: non-root it is.
            kill_setid: size.is_some() && req.uid() != 0,
        };
        match self.fs.setattr(ino.0, &a) {
            Ok(i) => reply.attr(self.ttl(i.ino), &self.fattr(&i)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _t = metrics::timer(Op::Other);
        let r = match self.views.node(ino.0) {
            Ok(Node::View { ino, tid }) => self.fs.asof_readlink(ino, tid),
            Ok(_) => self.fs.readlink(ino.0),
            Err(e) => Err(e),
        };
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _t = metrics::timer(Op::Mknod);
        if self.fixed_name(parent, name) {
            return reply.error(Errno::EROFS);
        }
        self.entry(
            reply,
            self.counted(
                self.fs
                    .mknod(ctx(req), parent.0, name.as_bytes(), mode & !umask, rdev),
            ),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _t = metrics::timer(Op::Mkdir);
        if self.fixed_name(parent, name) {
            return reply.error(Errno::EROFS);
        }
        self.entry(
            reply,
            self.counted(
                self.fs
                    .mkdir(ctx(req), parent.0, name.as_bytes(), mode & !umask),
            ),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = metrics::timer(Op::Unlink);
        if self.fixed_name(parent, name) {
            return reply.error(Errno::EROFS);
        }
        empty(reply, self.fs.unlink(parent.0, name.as_bytes()));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = metrics::timer(Op::Rmdir);
        if self.fixed_name(parent, name) {
            return reply.error(Errno::EROFS);
        }
        empty(reply, self.fs.rmdir(parent.0, name.as_bytes()));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _t = metrics::timer(Op::Other);
        if self.fixed_name(parent, link_name) {
            return reply.error(Errno::EROFS);
        }
        let t = target.as_os_str().as_bytes();
        self.entry(
            reply,
            self.counted(self.fs.symlink(ctx(req), parent.0, link_name.as_bytes(), t)),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _t = metrics::timer(Op::Rename);
        if self.fixed_name(parent, name) || self.fixed_name(newparent, newname) {
            return reply.error(Errno::EROFS);
        }
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let f = CRename {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        empty(
            reply,
            self.fs.rename(
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                f,
            ),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _t = metrics::timer(Op::Other);
        if self.in_view(&[ino]) || self.fixed_name(newparent, newname) {
            return reply.error(Errno::EROFS);
        }
        let r = self.fs.link(ino.0, newparent.0, newname.as_bytes());
        self.entry(reply, self.counted(r));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = metrics::timer(Op::Open);
        if self.in_view(&[ino]) {
            let writes = flags.0 & (libc::O_ACCMODE | libc::O_TRUNC) != libc::O_RDONLY;
            return match self.attr_of(ino.0) {
                Ok(_) if writes => reply.error(Errno::EROFS),
                Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
                Err(e) => reply.error(errno(e)),
            };
        }
        if self.no_open {
            // The kernel opens by itself from now on, and sends no RELEASE.
            return reply.error(Errno::ENOSYS);
        }
        match self.fs.open_file(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), self.open_flags()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _t = metrics::timer(Op::Read);
        let r = match self.views.node(ino.0) {
            Ok(Node::View { ino, tid }) => self.fs.asof_read(ino, tid, offset, size),
            Ok(Node::SnapDir) => Err(FsError::IsDir),
            // Straight into the reply buffer (the ring's, over io_uring).
            Ok(Node::Real(i)) => {
                let fs = &self.fs;
                return reply.data_with(size as usize, |buf| {
                    fs.read_into(i, offset, buf)
                        .inspect(|&n| metrics::read_bytes(n))
                        .map_err(|e| read_failed(i, offset, size, e))
                });
            }
            Err(e) => Err(e),
        };
        match r {
            Ok(d) => {
                // The kernel takes no more than it asked for.
                debug_assert!(
                    d.len() <= size as usize,
                    "a read of {size} answered {}",
                    d.len()
                );
                reply.data(&d)
            }
            Err(e) => reply.error(read_failed(ino.0, offset, size, e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = metrics::timer(Op::Write);
        if self.in_view(&[ino]) {
            reply.error(Errno::EROFS);
            return self.invalidator.drop_pages_after_reply(ino.0);
        }
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.fs.kill_setid(ino.0) {
                return reply.error(errno(e));
            }
        }
        match self.fs.write(ino.0, offset, data) {
            Ok(n) => {
                // A short count would tell the writer part of its write
                // did not happen.
                debug_assert_eq!(n as usize, data.len(), "a write answered short");
                metrics::write_bytes(n as usize);
                reply.written(n)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// close(2) needs nothing from us (durability is fsync's), so FLUSH is
    /// answered ENOSYS: the kernel then stops sending it, which saves a
    /// round trip per close. Every write(2) has reached us before its call
    /// returned (no writeback cache), with its error.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = metrics::timer(Op::Other);
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _t = metrics::timer(Op::Release);
        if !self.in_view(&[ino]) {
            self.fs.release(ino.0);
        }
        reply.ok();
    }

    fn fsync_is_quick(&self) -> bool {
        self.fs.fsync_is_quick()
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = metrics::timer(Op::Fsync);
        if self.in_view(&[ino]) {
            return reply.ok();
        }
        empty(reply, self.fs.fsync(ino.0));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = metrics::timer(Op::Opendir);
        match self.attr_of(ino.0) {
            Ok(i) if i.kind == cairn_fs::FileKind::Dir => {
                reply.opened(FileHandle(0), FopenFlags::empty())
            }
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _t = metrics::timer(Op::Readdir);
        match self.list_any(ino.0, offset, 256) {
            Ok(ents) => {
                for (e, i) in ents {
                    // Views report their inode numbers only via lookups and
                    // readdirplus (which the kernel counts and forgets).
                    let ino = i.map_or(e.ino, |i| i.ino);
                    if reply.add(
                        INodeNo(ino),
                        e.cookie,
                        crate::attr::kind(e.kind),
                        OsStr::from_bytes(&e.name),
                    ) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _t = metrics::timer(Op::Readdirplus);
        let tid = self.view_tid(ino.0);
        match self.list_any(ino.0, offset, 128) {
            Ok(ents) => {
                for (e, i) in ents {
                    let dots = e.name == b"." || e.name == b"..";
                    let i = match (i, tid) {
                        (Some(i), Some(tid)) => self.views.present(i, tid, !dots),
                        (Some(i), None) => {
                            // Snapshot roots listed in the snapshots dir.
                            let s = self.fs.snapshot(std::str::from_utf8(&e.name).unwrap_or(""));
                            match s {
                                Ok(s) => self.views.present(i, s.tid, true),
                                Err(_) => continue,
                            }
                        }
                        // The kernel counts a lookup per entry but the dots.
                        (None, _) if dots => match self.attr_of(e.ino) {
                            Ok(i) => i,
                            Err(_) => continue,
                        },
                        (None, _) => match self.fs.getattr_ref(e.ino) {
                            Ok(i) => i,
                            Err(_) => continue,
                        },
                    };
                    let name = OsStr::from_bytes(&e.name);
                    if reply.add(
                        INodeNo(i.ino),
                        e.cookie,
                        name,
                        self.ttl(i.ino),
                        &self.fattr(&i),
                        self.generation(i.ino),
                    ) {
                        // Not sent: the kernel did not count this lookup.
                        if i.ino > SNAPDIR_INO && !dots {
                            self.views.forget(i.ino, 1);
                        } else if i.ino < SNAPDIR_INO && !dots {
                            self.fs.forget(i.ino, 1);
                        }
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = metrics::timer(Op::Other);
        empty(reply, self.fs.fsync(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = metrics::timer(Op::Statfs);
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _t = metrics::timer(Op::Other);
        if self.in_view(&[ino]) {
            return reply.error(Errno::EROFS);
        }
        if nocase::asked(name.as_bytes()).is_some() {
            // Its getxattr is a lookup (nocase.rs): a stored one would never be read.
            return reply.error(Errno::EOPNOTSUPP);
        }
        let mode = if flags & libc::XATTR_CREATE != 0 {
            XattrMode::Create
        } else if flags & libc::XATTR_REPLACE != 0 {
            XattrMode::Replace
        } else {
            XattrMode::Any
        };
        empty(reply, self.fs.setxattr(ino.0, name.as_bytes(), value, mode));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = metrics::timer(Op::Getxattr);
        if let Some(n) = nocase::asked(name.as_bytes()) {
            let r = match self.views.node(ino.0) {
                Ok(Node::Real(i)) => nocase::answer(&self.fs, i, n),
                Ok(_) => Err(FsError::NotSupported),
                Err(e) => Err(e),
            };
            return xattr_reply(reply, size, r);
        }
        let r = match self.views.node(ino.0) {
            Ok(Node::View { .. }) if views::hides_xattr(name.as_bytes()) => Err(FsError::NoAttr),
            Ok(Node::View { ino, tid }) => self.fs.asof_getxattr(ino, tid, name.as_bytes()),
            Ok(Node::SnapDir) => Err(FsError::NoAttr),
            Ok(Node::Real(i)) => self.fs.getxattr(i, name.as_bytes()),
            Err(e) => Err(e),
        };
        xattr_reply(reply, size, r);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = metrics::timer(Op::Other);
        let r = match self.views.node(ino.0) {
            Ok(Node::View { ino, tid }) => self
                .fs
                .asof_listxattr(ino, tid)
                .map(views::without_hidden_xattrs),
            Ok(Node::SnapDir) => Ok(Vec::new()),
            Ok(Node::Real(i)) => self.fs.listxattr(i),
            Err(e) => Err(e),
        };
        xattr_reply(reply, size, r);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = metrics::timer(Op::Other);
        if self.in_view(&[ino]) {
            return reply.error(Errno::EROFS);
        }
        empty(reply, self.fs.removexattr(ino.0, name.as_bytes()));
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        let _t = metrics::timer(Op::Other);
        empty(reply, self.attr_of(ino.0).map(|_| ()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let _t = metrics::timer(Op::Create);
        if self.no_open {
            // The kernel makes the file with MKNOD and opens it by itself.
            return reply.error(Errno::ENOSYS);
        }
        if self.fixed_name(parent, name) {
            return reply.error(Errno::EROFS);
        }
        match self
            .fs
            .create(ctx(req), parent.0, name.as_bytes(), mode & !umask)
        {
            Ok(i) => {
                self.fs.add_lookup_ref(i.ino);
                reply.created(
                    &TTL,
                    &file_attr(&i),
                    self.generation(i.ino),
                    FileHandle(0),
                    FopenFlags::FOPEN_KEEP_CACHE,
                )
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _t = metrics::timer(Op::Other);
        if self.in_view(&[ino]) {
            return reply.error(Errno::EROFS);
        }
        empty(reply, self.fs.fallocate(ino.0, offset, length, mode));
    }

    /// SEEK_DATA and SEEK_HOLE (the kernel handles the other whences).
    /// Views report their whole size as data.
    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _t = metrics::timer(Op::Other);
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(off) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        let r = if self.in_view(&[ino]) {
            self.attr_of(ino.0)
                .and_then(|i| match (off < i.size, data) {
                    (false, _) => Err(FsError::NoData),
                    (true, true) => Ok(off),
                    (true, false) => Ok(i.size),
                })
        } else {
            self.fs.seek_data_hole(ino.0, off, data)
        };
        match r {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// A clone where blocks line up (the target shares the source's
    /// chunks), a copy of the bytes elsewhere.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "n <= len, which is clamped to u32::MAX above"
    )]
    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _t = metrics::timer(Op::Other);
        if self.in_view(&[ino_out]) {
            return reply.error(Errno::EROFS);
        }
        if self.in_view(&[ino_in]) {
            // No clone out of history: let the kernel copy the bytes.
            return reply.error(Errno::EXDEV);
        }
        // The reply counts in 32 bits; keep whole records.
        let rs = self.fs.record_size();
        let len = len.min(u32::MAX as u64 / rs * rs);
        match self
            .fs
            .copy_range(ino_in.0, offset_in, ino_out.0, offset_out, len)
        {
            Ok(n) => {
                debug_assert!(n <= len, "copied {n} of {len} bytes asked");
                reply.written(n as u32)
            }
            Err(e) => reply.error(errno(e)),
        }
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, r: Result<Vec<u8>, FsError>) {
    match r {
        Ok(v) if size == 0 => match u32::try_from(v.len()) {
            Ok(n) => reply.size(n),
            Err(_) => reply.error(Errno::E2BIG),
        },
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(e)),
    }
}
