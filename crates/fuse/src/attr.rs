//! Conversions between cairn-fs types and FUSE attributes.

use cairn_fs::{FileKind, Inode, Time};
use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

pub fn to_system(t: Time) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(t.nsec as u64)
    }
}

pub fn from_system(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time {
            secs: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                Time { secs: -s, nsec: 0 }
            } else {
                Time {
                    secs: -s - 1,
                    nsec: 1_000_000_000 - n,
                }
            }
        }
    }
}

pub fn time_or_now(t: TimeOrNow) -> Time {
    match t {
        TimeOrNow::SpecificTime(t) => from_system(t),
        TimeOrNow::Now => Time::now(),
    }
}

/// Attributes with st_blocks computed from the size (views, new files).
pub fn file_attr(i: &Inode) -> FileAttr {
    file_attr_blocks(i, i.size.div_ceil(512))
}

/// The attributes of a negative entry: node 0 tells the kernel the name
/// does not exist; the rest is never read.
pub fn missing() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 65536,
        flags: 0,
    }
}

/// Attributes with st_blocks given (512-byte units really stored).
pub fn file_attr_blocks(i: &Inode, blocks: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(i.ino),
        size: i.size,
        blocks,
        atime: to_system(i.atime),
        mtime: to_system(i.mtime),
        ctime: to_system(i.ctime),
        crtime: to_system(i.crtime),
        kind: kind(i.kind),
        perm: i.perm,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: i.rdev,
        blksize: 65536,
        flags: 0,
    }
}
