//! An in-memory FUSE file system served exactly as Cairn's mounts are
//! (same mount options, INIT capabilities, TTLs, no-open mode, negative
//! entries and transport), whose handlers cost next to nothing. It is the
//! measured FUSE ceiling of bench/roundtrip.sh: what a load costs on this
//! kernel through FUSE alone, so that Cairn's own cost is the difference.
//! Not a file system to keep data in: it holds everything in memory, under
//! one lock, and loses it at unmount.
//!
//! Usage: `memfs MOUNTPOINT [auto|on|off] [LOGFILE]` (FUSE over io_uring,
//! as `cairn mount --io-uring`); serves until unmounted (`fusermount3 -u`).
//! With LOGFILE, every write's bytes also go to that file and it is synced
//! each second (`DiskLog`): the cheapest way a FUSE file system can keep
//! what it is written on disk, the ceiling for loads that write. Start it
//! in a session of its own (`setsid`, as bench/lib.sh does), as `cairn
//! mount` starts Cairn's daemon: under autogroup scheduling a daemon in the
//! load's own session answers each request about 1 us sooner.

#![allow(
    clippy::cast_possible_truncation,
    reason = "offsets below MAX_FILE and FUSE's 1 MiB writes; a 64-bit target (cairn-devices asserts it)"
)]

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// As Cairn's live tree (crates/fuse/src/ops.rs).
const TTL: Duration = Duration::from_secs(60);
const ROOT: u64 = 1;
/// Files are held in memory: larger ones are refused (EFBIG).
const MAX_FILE: u64 = 1 << 30;

enum Body {
    File(Vec<u8>),
    Dir(BTreeMap<Vec<u8>, u64>),
    Symlink(Vec<u8>),
}

struct Node {
    attr: FileAttr,
    body: Body,
    /// The kernel's lookup count.
    lookups: u64,
}

struct State {
    nodes: HashMap<u64, Node>,
    next: u64,
}

struct MemFs {
    state: Mutex<State>,
    log: Option<Arc<DiskLog>>,
}

/// Where a memfs started with a LOGFILE also writes each write's bytes:
/// appended in arrival order, with no index, checksum or copy beyond the
/// page cache's, and synced to disk each second (`sync_each_second`). Never
/// read back. The log wraps at `LOG_WRAP` bytes so that a long run's disk
/// use stays bounded.
struct DiskLog {
    file: std::fs::File,
    /// Bytes appended so far (the next byte's place before wrapping).
    at: AtomicU64,
}

const LOG_WRAP: u64 = 4 << 30;

impl DiskLog {
    fn create(path: &Path) -> std::io::Result<Arc<Self>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)?;
        Ok(Arc::new(DiskLog {
            file,
            at: AtomicU64::new(0),
        }))
    }

    fn append(&self, data: &[u8]) -> std::io::Result<()> {
        let at = self.at.fetch_add(data.len() as u64, Ordering::Relaxed) % LOG_WRAP;
        self.file.write_all_at(data, at)
    }

    /// Syncs the log each second, for the life of the process.
    fn sync_each_second(self: Arc<Self>) {
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            if let Err(e) = self.file.sync_data() {
                eprintln!("memfs: syncing the log: {e}");
            }
        });
    }
}

fn attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 65536,
        flags: 0,
    }
}

fn missing() -> FileAttr {
    let mut a = attr(0, FileType::RegularFile, 0, 0, 0);
    (a.atime, a.mtime, a.ctime, a.crtime) = (UNIX_EPOCH, UNIX_EPOCH, UNIX_EPOCH, UNIX_EPOCH);
    a.nlink = 0;
    a
}

impl State {
    fn dir(&self, ino: u64) -> Result<&BTreeMap<Vec<u8>, u64>, Errno> {
        match self.nodes.get(&ino).map(|n| &n.body) {
            Some(Body::Dir(d)) => Ok(d),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut BTreeMap<Vec<u8>, u64>, Errno> {
        match self.nodes.get_mut(&ino).map(|n| &mut n.body) {
            Some(Body::Dir(d)) => Ok(d),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn touch(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            let now = SystemTime::now();
            (n.attr.mtime, n.attr.ctime) = (now, now);
        }
    }

    /// Counts a lookup of `ino` and returns its attributes.
    fn found(&mut self, ino: u64) -> Result<FileAttr, Errno> {
        let n = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        n.lookups += 1;
        Ok(n.attr)
    }

    fn make(
        &mut self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        mode: u32,
        body: Body,
    ) -> Result<FileAttr, Errno> {
        let name = name.as_bytes().to_vec();
        if self.dir(parent)?.contains_key(&name) {
            return Err(Errno::EEXIST);
        }
        let kind = match body {
            Body::File(_) => FileType::RegularFile,
            Body::Dir(_) => FileType::Directory,
            Body::Symlink(_) => FileType::Symlink,
        };
        let ino = self.next;
        self.next += 1;
        let mut a = attr(ino, kind, (mode & 0o7777) as u16, req.uid(), req.gid());
        if let Body::Symlink(t) = &body {
            a.size = t.len() as u64;
        }
        self.nodes.insert(
            ino,
            Node {
                attr: a,
                body,
                lookups: 1,
            },
        );
        self.dir_mut(parent)?.insert(name, ino);
        if kind == FileType::Directory {
            self.nodes.get_mut(&parent).expect("parent").attr.nlink += 1;
        }
        self.touch(parent);
        Ok(a)
    }

    /// Drops a link to `ino`; the node goes once neither a name nor the
    /// kernel holds it.
    fn unlinked(&mut self, ino: u64) {
        let Some(n) = self.nodes.get_mut(&ino) else {
            return;
        };
        n.attr.nlink = match n.attr.kind {
            FileType::Directory => 0,
            _ => n.attr.nlink.saturating_sub(1),
        };
        n.attr.ctime = SystemTime::now();
        self.reap(ino);
    }

    fn reap(&mut self, ino: u64) {
        if self
            .nodes
            .get(&ino)
            .is_some_and(|n| n.attr.nlink == 0 && n.lookups == 0)
        {
            self.nodes.remove(&ino);
        }
    }

    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = *self
            .dir(parent)?
            .get(name.as_bytes())
            .ok_or(Errno::ENOENT)?;
        match (&self.nodes[&ino].body, dir) {
            (Body::Dir(d), true) if !d.is_empty() => return Err(Errno::ENOTEMPTY),
            (Body::Dir(_), false) => return Err(Errno::EISDIR),
            (Body::Dir(_), true) => self.nodes.get_mut(&parent).expect("parent").attr.nlink -= 1,
            (_, true) => return Err(Errno::ENOTDIR),
            (_, false) => {}
        }
        self.dir_mut(parent)?.remove(name.as_bytes());
        self.touch(parent);
        self.unlinked(ino);
        Ok(())
    }

    fn rename(
        &mut self,
        p: u64,
        name: &OsStr,
        np: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let ino = *self.dir(p)?.get(name.as_bytes()).ok_or(Errno::ENOENT)?;
        let target = self.dir(np)?.get(newname.as_bytes()).copied();
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            let t = target.ok_or(Errno::ENOENT)?;
            self.dir_mut(p)?.insert(name.as_bytes().to_vec(), t);
            self.dir_mut(np)?.insert(newname.as_bytes().to_vec(), ino);
        } else {
            if let Some(t) = target {
                if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                    return Err(Errno::EEXIST);
                }
                if t != ino {
                    let is_dir = matches!(self.nodes[&t].body, Body::Dir(_));
                    self.remove(np, newname, is_dir)?;
                }
            }
            self.dir_mut(p)?.remove(name.as_bytes());
            self.dir_mut(np)?.insert(newname.as_bytes().to_vec(), ino);
            if matches!(self.nodes[&ino].body, Body::Dir(_)) && p != np {
                self.nodes.get_mut(&p).expect("parent").attr.nlink -= 1;
                self.nodes.get_mut(&np).expect("parent").attr.nlink += 1;
            }
        }
        self.touch(p);
        self.touch(np);
        Ok(())
    }
}

impl MemFs {
    fn new(log: Option<Arc<DiskLog>>) -> Self {
        // SAFETY: getuid and getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let root = Node {
            attr: attr(ROOT, FileType::Directory, 0o755, uid, gid),
            body: Body::Dir(BTreeMap::new()),
            lookups: 1,
        };
        MemFs {
            state: Mutex::new(State {
                nodes: HashMap::from([(ROOT, root)]),
                next: ROOT + 1,
            }),
            log,
        }
    }

    fn entry(reply: ReplyEntry, r: Result<FileAttr, Errno>) {
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl fuser::Filesystem for MemFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        cairn_fuse::negotiate(config);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut s = self.state.lock();
        let found = s.dir(parent.0).map(|d| d.get(name.as_bytes()).copied());
        match found {
            Ok(Some(ino)) => Self::entry(reply, s.found(ino)),
            // A negative entry, as Cairn's live tree answers.
            Ok(None) => reply.entry(&TTL, &missing(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut s = self.state.lock();
        if let Some(n) = s.nodes.get_mut(&ino.0) {
            n.lookups = n.lookups.saturating_sub(nlookup);
            s.reap(ino.0);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state.lock().nodes.get(&ino.0) {
            Some(n) => reply.attr(&TTL, &n.attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.state.lock();
        let Some(n) = s.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let time = |t: TimeOrNow| match t {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => SystemTime::now(),
        };
        if let Some(m) = mode {
            n.attr.perm = (m & 0o7777) as u16;
        }
        n.attr.uid = uid.unwrap_or(n.attr.uid);
        n.attr.gid = gid.unwrap_or(n.attr.gid);
        if let Some(len) = size {
            if len > MAX_FILE {
                return reply.error(Errno::EFBIG);
            }
            let Body::File(data) = &mut n.body else {
                return reply.error(Errno::EISDIR);
            };
            data.resize(len as usize, 0);
            (n.attr.size, n.attr.blocks) = (len, len.div_ceil(512));
            n.attr.mtime = SystemTime::now();
        }
        if let Some(t) = atime {
            n.attr.atime = time(t);
        }
        if let Some(t) = mtime {
            n.attr.mtime = time(t);
        }
        n.attr.ctime = SystemTime::now();
        reply.attr(&TTL, &n.attr);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.state.lock().nodes.get(&ino.0).map(|n| &n.body) {
            Some(Body::Symlink(t)) => reply.data(t),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let r = self
            .state
            .lock()
            .make(req, parent.0, name, mode & !umask, Body::File(Vec::new()));
        Self::entry(reply, r);
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
        let r = self.state.lock().make(
            req,
            parent.0,
            name,
            mode & !umask,
            Body::Dir(BTreeMap::new()),
        );
        Self::entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.state.lock().remove(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.state.lock().remove(parent.0, name, true));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let body = Body::Symlink(target.as_os_str().as_bytes().to_vec());
        let r = self.state.lock().make(req, parent.0, name, 0o777, body);
        Self::entry(reply, r);
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
        empty(
            reply,
            self.state
                .lock()
                .rename(parent.0, name, newparent.0, newname, flags),
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
        let mut s = self.state.lock();
        let r = (|| {
            let name = newname.as_bytes().to_vec();
            if s.dir(newparent.0)?.contains_key(&name) {
                return Err(Errno::EEXIST);
            }
            s.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?.attr.nlink += 1;
            s.dir_mut(newparent.0)?.insert(name, ino.0);
            s.touch(newparent.0);
            s.found(ino.0)
        })();
        Self::entry(reply, r);
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // As Cairn: the kernel opens by itself from now on, no RELEASE.
        reply.error(Errno::ENOSYS);
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
        match self.state.lock().nodes.get(&ino.0).map(|n| &n.body) {
            Some(Body::File(d)) => {
                let from = (offset as usize).min(d.len());
                let to = from.saturating_add(size as usize).min(d.len());
                reply.data(&d[from..to]);
            }
            Some(_) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = self.state.lock();
        let Some(n) = s.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let Body::File(d) = &mut n.body else {
            return reply.error(Errno::EISDIR);
        };
        if offset.saturating_add(data.len() as u64) > MAX_FILE {
            return reply.error(Errno::EFBIG);
        }
        let end = offset as usize + data.len();
        if d.len() < end {
            d.resize(end, 0);
        }
        d[offset as usize..end].copy_from_slice(data);
        let len = d.len() as u64;
        (n.attr.size, n.attr.blocks) = (len, len.div_ceil(512));
        let now = SystemTime::now();
        (n.attr.mtime, n.attr.ctime) = (now, now);
        drop(s);
        if let Some(Err(e)) = self.log.as_ref().map(|l| l.append(data)) {
            eprintln!("memfs: writing the log: {e}");
            return reply.error(Errno::EIO);
        }
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let s = self.state.lock();
        let d = match s.dir(ino.0) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        for (i, (name, child)) in d.iter().enumerate().skip(offset as usize) {
            let kind = s
                .nodes
                .get(child)
                .map_or(FileType::RegularFile, |n| n.attr.kind);
            if reply.add(INodeNo(*child), i as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut s = self.state.lock();
        let entries: Vec<(Vec<u8>, u64)> = match s.dir(ino.0) {
            Ok(d) => d
                .iter()
                .skip(offset as usize)
                .take(128)
                .map(|(n, i)| (n.clone(), *i))
                .collect(),
            Err(e) => return reply.error(e),
        };
        for (k, (name, child)) in entries.into_iter().enumerate() {
            let Ok(a) = s.found(child) else { continue };
            if reply.add(
                INodeNo(child),
                offset + k as u64 + 1,
                OsStr::from_bytes(&name),
                &TTL,
                &a,
                Generation(0),
            ) {
                // Not sent: the kernel did not count this lookup.
                s.nodes.get_mut(&child).expect("found").lookups -= 1;
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.state.lock().nodes.len() as u64;
        reply.statfs(
            1 << 24,
            1 << 23,
            1 << 23,
            files + (1 << 20),
            1 << 20,
            4096,
            255,
            4096,
        );
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENODATA);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        match size {
            0 => reply.size(0),
            _ => reply.data(&[]),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let Some(mnt) = args.next() else {
        eprintln!("usage: memfs MOUNTPOINT [auto|on|off] [LOGFILE]");
        std::process::exit(2);
    };
    let io_uring = match args.next().as_deref().map(|a| a.as_bytes()) {
        None | Some(b"auto") => cairn_fuse::Transport::Auto,
        Some(b"on") => cairn_fuse::Transport::On,
        Some(b"off") => cairn_fuse::Transport::Off,
        Some(_) => {
            eprintln!("memfs: the transport is auto, on or off");
            std::process::exit(2);
        }
    };
    let log = args
        .next()
        .map(|p| DiskLog::create(Path::new(&p)))
        .transpose()?;
    if let Some(l) = &log {
        l.clone().sync_each_second();
    }
    let transport = cairn_fuse::TransportOptions {
        io_uring,
        ..Default::default()
    };
    cairn_fuse::serve_other(MemFs::new(log), Path::new(&mnt), "memfs", 4, &transport)
}
