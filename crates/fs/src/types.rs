//! Payloads of the filesystem's elements: inodes, directory entries and
//! extents. Each payload starts with its own version byte (the metadata
//! layer adds the element version and checksum around it).

use crate::error::{FsError, Result};

pub const ROOT_INO: u64 = 1;
pub const MAX_NAME: usize = 255;
const PAYLOAD_VERSION: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FileKind {
    pub fn to_u8(self) -> u8 {
        match self {
            FileKind::File => 1,
            FileKind::Dir => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDev => 6,
            FileKind::BlockDev => 7,
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDev,
            7 => FileKind::BlockDev,
            _ => return None,
        })
    }

    /// From the S_IFMT bits of a mode.
    pub fn from_mode(mode: u32) -> Option<Self> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// A time as seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Time {
    pub secs: i64,
    pub nsec: u32,
}

impl Time {
    pub fn now() -> Time {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            secs: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }

    pub fn as_nanos(&self) -> i128 {
        self.secs as i128 * 1_000_000_000 + self.nsec as i128
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub kind: FileKind,
    /// Permission bits (07777).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub crtime: Time,
    pub rdev: u32,
    /// Directory that holds this directory (for ".."); 0 for files.
    pub parent: u64,
}

fn put_time(b: &mut Vec<u8>, t: Time) {
    b.extend_from_slice(&t.secs.to_le_bytes());
    b.extend_from_slice(&t.nsec.to_le_bytes());
}

struct Cursor<'a>(&'a [u8], usize);

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self
            .0
            .get(self.1..self.1 + N)
            .ok_or_else(|| FsError::Io("short payload".into()))?;
        self.1 += N;
        Ok(s.try_into().expect("slice length matches the array"))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn time(&mut self) -> Result<Time> {
        Ok(Time {
            secs: i64::from_le_bytes(self.take()?),
            nsec: self.u32()?,
        })
    }
}

fn check_version(b: &[u8], what: &str) -> Result<()> {
    match b.first() {
        Some(&PAYLOAD_VERSION) => Ok(()),
        _ => Err(FsError::Io(format!("unknown {what} payload version"))),
    }
}

impl Inode {
    /// An empty directory `ino` in `parent`, owned by root, made `now`.
    pub fn empty_dir(ino: u64, parent: u64, perm: u16, now: Time) -> Inode {
        Inode {
            ino,
            kind: FileKind::Dir,
            perm,
            uid: 0,
            gid: 0,
            nlink: 2,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            rdev: 0,
            parent,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(96);
        b.push(PAYLOAD_VERSION);
        b.push(self.kind.to_u8());
        b.extend_from_slice(&self.perm.to_le_bytes());
        b.extend_from_slice(&self.uid.to_le_bytes());
        b.extend_from_slice(&self.gid.to_le_bytes());
        b.extend_from_slice(&self.nlink.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        for t in [self.atime, self.mtime, self.ctime, self.crtime] {
            put_time(&mut b, t);
        }
        b.extend_from_slice(&self.rdev.to_le_bytes());
        b.extend_from_slice(&self.parent.to_le_bytes());
        b
    }

    pub fn decode(ino: u64, b: &[u8]) -> Result<Inode> {
        check_version(b, "inode")?;
        let mut c = Cursor(b, 1);
        let kind = FileKind::from_u8(c.take::<1>()?[0])
            .ok_or_else(|| FsError::Io("bad file kind".into()))?;
        Ok(Inode {
            ino,
            kind,
            perm: u16::from_le_bytes(c.take()?),
            uid: c.u32()?,
            gid: c.u32()?,
            nlink: c.u32()?,
            size: c.u64()?,
            atime: c.time()?,
            mtime: c.time()?,
            ctime: c.time()?,
            crtime: c.time()?,
            rdev: c.u32()?,
            parent: c.u64()?,
        })
    }
}

/// A directory entry's target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirEnt {
    pub ino: u64,
    pub kind: FileKind,
}

impl DirEnt {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![PAYLOAD_VERSION, self.kind.to_u8()];
        b.extend_from_slice(&self.ino.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<DirEnt> {
        check_version(b, "dirent")?;
        let mut c = Cursor(b, 1);
        let kind = FileKind::from_u8(c.take::<1>()?[0])
            .ok_or_else(|| FsError::Io("bad file kind".into()))?;
        Ok(DirEnt {
            kind,
            ino: c.u64()?,
        })
    }
}

/// The 63-bit name hash that orders a directory and serves as readdir
/// cookie. Values 0..=2 are left for the start, "." and "..". (An
/// encrypted pool keys it: `Names::dirent_subkey`.)
pub fn name_hash(name: &[u8]) -> u64 {
    hash63(blake3::hash(name).as_bytes())
}

/// A name hash from the first 8 bytes of a 32-byte digest.
pub(crate) fn hash63(digest: &[u8; 32]) -> u64 {
    let h = u64::from_be_bytes(
        digest[0..8]
            .try_into()
            .expect("slice length matches the array"),
    );
    3 + (h >> 1) % ((1u64 << 63) - 3)
}

/// Key of a directory entry: hash (BE) | name length | name. In an
/// encrypted pool the name is sealed, 16 bytes longer than the length
/// says (`Names::dirent_subkey`).
#[allow(
    clippy::cast_possible_truncation,
    reason = "name.len() <= MAX_NAME = 255 (asserted above)"
)]
pub fn dirent_subkey(name: &[u8]) -> Vec<u8> {
    assert!(name.len() <= MAX_NAME);
    let mut k = Vec::with_capacity(9 + name.len());
    k.extend_from_slice(&name_hash(name).to_be_bytes());
    k.push(name.len() as u8);
    k.extend_from_slice(name);
    k
}

/// (hash, name) of a directory entry subkey; one whose length byte does
/// not match the name it holds (only damage makes one) is an error.
pub fn split_dirent_subkey(k: &[u8]) -> Result<(u64, &[u8])> {
    split_subkey(k, 0)
}

/// (hash, sealed name) of an encrypted pool's entry subkey (the name is
/// `NAME_OVERHEAD` longer than its length byte says).
pub(crate) fn split_sealed_dirent_subkey(k: &[u8]) -> Result<(u64, &[u8])> {
    split_subkey(k, cairn_crypt::NAME_OVERHEAD)
}

/// Whether `k` is an entry subkey of either form (for decoders that do
/// not know whether the pool is encrypted).
pub(crate) fn is_dirent_subkey(k: &[u8]) -> bool {
    split_dirent_subkey(k).is_ok() || split_sealed_dirent_subkey(k).is_ok()
}

fn split_subkey(k: &[u8], overhead: usize) -> Result<(u64, &[u8])> {
    match k.get(9..) {
        Some(name) if name.len() == k[8] as usize + overhead => Ok((
            u64::from_be_bytes(k[0..8].try_into().expect("slice length matches the array")),
            name,
        )),
        _ => Err(FsError::Io(format!("damaged directory entry key {k:02x?}"))),
    }
}

/// An extent: one file block mapped to a chunk, and to pieces over it.
/// A small overwrite of a committed block is stored as a piece (its bytes
/// as a chunk of their own) instead of a new whole chunk: the flush writes
/// only the bytes written, and history keeps only those it replaced
/// (`writeback/pieces.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    /// The chunk below the pieces.
    pub chunk: u64,
    /// Valid bytes of the block (the rest up to the record size is zero;
    /// so are bytes past the base chunk's end that no piece covers).
    pub len: u32,
    /// Sorted by offset, disjoint, inside `len`.
    pub pieces: Vec<Piece>,
}

/// Bytes `off..off + len` of a block are bytes `from..from + len` of a
/// chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub off: u32,
    pub len: u32,
    pub chunk: u64,
    pub from: u32,
}

/// Extent payload versions: 1 without pieces, 2 with them.
const EXTENT_PIECES_VERSION: u8 = 2;
const PIECE_LEN: usize = 4 + 4 + 8 + 4;

impl Extent {
    pub fn whole(chunk: u64, len: u32) -> Extent {
        Extent {
            chunk,
            len,
            pieces: Vec::new(),
        }
    }

    /// True if the pieces are what a stored extent may hold (`decode`
    /// refuses others): each non-empty, sorted by offset, disjoint, and
    /// inside the block's valid bytes.
    pub fn pieces_valid(&self) -> bool {
        let mut end = 0u64;
        self.pieces.iter().all(|p| {
            let ok =
                p.len > 0 && p.off as u64 >= end && p.off as u64 + p.len as u64 <= self.len as u64;
            end = p.off as u64 + p.len as u64;
            ok
        })
    }

    /// Every chunk reference the extent holds: the base, then one per
    /// piece (a chunk split into two pieces is named twice, and holds two
    /// references).
    pub fn chunks(&self) -> impl Iterator<Item = u64> + '_ {
        std::iter::once(self.chunk).chain(self.pieces.iter().map(|p| p.chunk))
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "pieces.len() <= u16::MAX (asserted above)"
    )]
    pub fn encode(&self) -> Vec<u8> {
        let ver = match self.pieces.is_empty() {
            true => PAYLOAD_VERSION,
            false => EXTENT_PIECES_VERSION,
        };
        // The count is stored as a u16 (`MAX_PIECES` keeps it far below).
        assert!(
            self.pieces.len() <= u16::MAX as usize,
            "an extent of {} pieces",
            self.pieces.len()
        );
        let mut b = Vec::with_capacity(15 + PIECE_LEN * self.pieces.len());
        b.push(ver);
        b.extend_from_slice(&self.chunk.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        if !self.pieces.is_empty() {
            b.extend_from_slice(&(self.pieces.len() as u16).to_le_bytes());
            for p in &self.pieces {
                b.extend_from_slice(&p.off.to_le_bytes());
                b.extend_from_slice(&p.len.to_le_bytes());
                b.extend_from_slice(&p.chunk.to_le_bytes());
                b.extend_from_slice(&p.from.to_le_bytes());
            }
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Extent> {
        let bad = |why: &str| FsError::Io(format!("extent payload: {why}"));
        let ver = *b.first().ok_or_else(|| bad("empty"))?;
        if ver != PAYLOAD_VERSION && ver != EXTENT_PIECES_VERSION {
            return Err(FsError::Io("unknown extent payload version".into()));
        }
        let mut c = Cursor(b, 1);
        let mut ext = Extent::whole(c.u64()?, c.u32()?);
        if ver == EXTENT_PIECES_VERSION {
            let n = u16::from_le_bytes(c.take()?) as usize;
            if n == 0 || b.len() != c.1 + n * PIECE_LEN {
                return Err(bad("wrong length"));
            }
            for _ in 0..n {
                ext.pieces.push(Piece {
                    off: c.u32()?,
                    len: c.u32()?,
                    chunk: c.u64()?,
                    from: c.u32()?,
                });
            }
            if !ext.pieces_valid() {
                return Err(bad("pieces out of order or out of the block"));
            }
        }
        if c.1 != b.len() {
            return Err(bad("trailing bytes"));
        }
        Ok(ext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_roundtrip() {
        let i = Inode {
            ino: 42,
            kind: FileKind::Dir,
            perm: 0o1755,
            uid: 1000,
            gid: 100,
            nlink: 3,
            size: 12345,
            atime: Time {
                secs: -5,
                nsec: 999_999_999,
            },
            mtime: Time { secs: 1, nsec: 2 },
            ctime: Time { secs: 3, nsec: 4 },
            crtime: Time { secs: 5, nsec: 6 },
            rdev: 0x0801,
            parent: 1,
        };
        assert_eq!(Inode::decode(42, &i.encode()).unwrap(), i);
        assert!(Inode::decode(42, &i.encode()[..20]).is_err());
    }

    #[test]
    fn dirent_keys_group_by_hash() {
        let k = dirent_subkey(b"hello");
        let (h, n) = split_dirent_subkey(&k).unwrap();
        assert_eq!(n, b"hello");
        assert_eq!(h, name_hash(b"hello"));
        assert!(h >= 3);
        let d = DirEnt {
            ino: 7,
            kind: FileKind::Symlink,
        };
        assert_eq!(DirEnt::decode(&d.encode()).unwrap(), d);
        let e = Extent::whole(99, 65536);
        assert_eq!(
            e.encode().len(),
            13,
            "an extent without pieces keeps version 1"
        );
        assert_eq!(Extent::decode(&e.encode()).unwrap(), e);
        let mut p = e.clone();
        p.pieces = vec![
            Piece {
                off: 4096,
                len: 100,
                chunk: 5,
                from: 0,
            },
            Piece {
                off: 8192,
                len: 4096,
                chunk: 5,
                from: 200,
            },
        ];
        assert_eq!(Extent::decode(&p.encode()).unwrap(), p);
        assert_eq!(p.chunks().collect::<Vec<_>>(), [99, 5, 5]);
        let b = p.encode();
        assert!(Extent::decode(&b[..b.len() - 1]).is_err());
        p.pieces.swap(0, 1);
        assert!(Extent::decode(&p.encode()).is_err(), "unsorted pieces");
    }
}
