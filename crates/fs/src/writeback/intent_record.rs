//! The payload of an intent log record (docs/format/intent-log.md): a
//! list of tagged entries. `intent.rs` writes them from the overlay with
//! the `put_*` helpers; `decode` reads a whole payload back into `Entry`
//! values, every field bounds-checked and every range checked against the
//! record size, before any entry is applied.

use crate::error::{FsError, Result};
use crate::history::snapshot::{check_snapshot_name, Snapshot};
use crate::types::{is_dirent_subkey, DirEnt, Inode};

// Entry tags of a record's payload.
pub(crate) const T_DELETE: u8 = 1;
pub(crate) const T_TRUNC: u8 = 2;
pub(crate) const T_INODE: u8 = 3;
pub(crate) const T_DIRENT: u8 = 4;
pub(crate) const T_SYMLINK: u8 = 5;
pub(crate) const T_XATTR: u8 = 6;
pub(crate) const T_ORPHAN: u8 = 7;
pub(crate) const T_BLOCK: u8 = 8;
pub(crate) const T_PATCH: u8 = 9;
pub(crate) const T_SNAPSHOT: u8 = 10;
pub(crate) const T_STORED: u8 = 11;

/// One decoded entry; byte fields borrow from the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry<'a> {
    Delete(u64),
    Trunc {
        ino: u64,
        first: u64,
    },
    Inode(Inode),
    /// `ent` None: the entry was removed.
    Dirent {
        dir: u64,
        subkey: &'a [u8],
        ent: Option<DirEnt>,
    },
    Symlink {
        ino: u64,
        target: &'a [u8],
    },
    /// `value` None: the attribute was removed.
    Xattr {
        ino: u64,
        name: &'a [u8],
        value: Option<&'a [u8]>,
    },
    Orphan {
        ino: u64,
        open: bool,
    },
    /// The block is `len` bytes long and holds `bytes` at `lo`.
    Block {
        ino: u64,
        blk: u64,
        len: usize,
        lo: usize,
        bytes: &'a [u8],
    },
    /// The whole block is `len` bytes long and its bytes are chunk
    /// `chunk`, which a tick stored ahead of the commit (`tick.rs`).
    Stored {
        ino: u64,
        blk: u64,
        len: usize,
        chunk: u64,
    },
    /// Ranges (offset, bytes) written over the block below.
    Patch {
        ino: u64,
        blk: u64,
        ranges: Vec<(usize, &'a [u8])>,
    },
    /// A snapshot of the state the record's changes (and the records
    /// before it) give (`Fs::snapshot_logged`).
    Snapshot(Snapshot),
}

pub(crate) fn corrupt(why: &str) -> FsError {
    FsError::Io(format!("intent log record is damaged: {why}"))
}

/// Decodes a record's payload for a pool of `record` byte blocks.
pub(crate) fn decode(rec: &[u8], record: u64) -> Result<Vec<Entry<'_>>> {
    let mut r = Reader { b: rec, at: 0 };
    let mut out = Vec::new();
    while !r.done() {
        let e = entry(&mut r, record)?;
        if matches!(out.last(), Some(Entry::Snapshot(_))) && !matches!(e, Entry::Snapshot(_)) {
            return Err(corrupt("a change after a snapshot entry"));
        }
        out.push(e);
    }
    Ok(out)
}

fn entry<'a>(r: &mut Reader<'a>, record: u64) -> Result<Entry<'a>> {
    Ok(match r.u8()? {
        T_DELETE => Entry::Delete(r.u64()?),
        T_TRUNC => Entry::Trunc {
            ino: r.u64()?,
            first: r.u64()?,
        },
        T_INODE => {
            let ino = r.u64()?;
            Entry::Inode(Inode::decode(ino, r.bytes()?)?)
        }
        T_DIRENT => {
            let (dir, subkey) = (r.u64()?, r.bytes()?);
            if !is_dirent_subkey(subkey) {
                return Err(FsError::Io(format!(
                    "damaged directory entry key {subkey:02x?}"
                )));
            }
            let ent = r.opt_bytes()?.map(DirEnt::decode).transpose()?;
            Entry::Dirent { dir, subkey, ent }
        }
        T_SYMLINK => Entry::Symlink {
            ino: r.u64()?,
            target: r.bytes()?,
        },
        T_XATTR => Entry::Xattr {
            ino: r.u64()?,
            name: r.bytes()?,
            value: r.opt_bytes()?,
        },
        T_ORPHAN => Entry::Orphan {
            ino: r.u64()?,
            open: r.u8()? != 0,
        },
        T_BLOCK => block(r, record)?,
        T_PATCH => patch(r, record)?,
        T_STORED => stored(r, record)?,
        T_SNAPSHOT => {
            let name = std::str::from_utf8(r.bytes()?)
                .map_err(|_| corrupt("snapshot name is not UTF-8"))?;
            check_snapshot_name(name).map_err(|_| corrupt("bad snapshot name"))?;
            Entry::Snapshot(Snapshot::decode(name, r.bytes()?)?)
        }
        t => return Err(corrupt(&format!("unknown entry tag {t}"))),
    })
}

fn block<'a>(r: &mut Reader<'a>, record: u64) -> Result<Entry<'a>> {
    let (ino, blk) = (r.u64()?, r.u64()?);
    let (len, lo) = (r.u32()? as usize, r.u32()? as usize);
    let bytes = r.bytes()?;
    if len as u64 > record || lo + bytes.len() > len || blk.checked_mul(record).is_none() {
        return Err(corrupt("block entry out of range"));
    }
    Ok(Entry::Block {
        ino,
        blk,
        len,
        lo,
        bytes,
    })
}

fn stored<'a>(r: &mut Reader<'a>, record: u64) -> Result<Entry<'a>> {
    let (ino, blk) = (r.u64()?, r.u64()?);
    let (len, chunk) = (r.u32()? as usize, r.u64()?);
    if len == 0 || len as u64 > record || blk.checked_mul(record).is_none() {
        return Err(corrupt("stored block entry out of range"));
    }
    Ok(Entry::Stored {
        ino,
        blk,
        len,
        chunk,
    })
}

/// Writes a stored block entry (see `Entry::Stored`).
#[allow(
    clippy::cast_possible_truncation,
    reason = "len <= u32::MAX (asserted)"
)]
pub(crate) fn put_stored(w: &mut Vec<u8>, ino: u64, blk: u64, len: usize, chunk: u64) {
    // `stored` refuses an empty block: a replay would fail on it.
    assert!(
        len > 0 && len <= u32::MAX as usize,
        "inode {ino} block {blk}: a stored entry of {len} bytes"
    );
    w.push(T_STORED);
    put_u64(w, ino);
    put_u64(w, blk);
    put_u32(w, len as u32);
    put_u64(w, chunk);
}

fn patch<'a>(r: &mut Reader<'a>, record: u64) -> Result<Entry<'a>> {
    let (ino, blk) = (r.u64()?, r.u64()?);
    if blk.checked_mul(record).is_none() {
        return Err(corrupt("patch entry out of range"));
    }
    // No capacity from the count: each range takes at least 8 bytes, so
    // the ranges grow only with the payload.
    let mut ranges = Vec::new();
    for _ in 0..r.u32()? {
        let (off, bytes) = (r.u32()? as usize, r.bytes()?);
        if (off + bytes.len()) as u64 > record {
            return Err(corrupt("patch entry out of range"));
        }
        ranges.push((off, bytes));
    }
    Ok(Entry::Patch { ino, blk, ranges })
}

pub(crate) fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "b.len() <= u32::MAX (asserted)"
)]
pub(crate) fn put_bytes(w: &mut Vec<u8>, b: &[u8]) {
    // The length is a u32: a longer value would shift every entry after
    // it, and the replay would refuse the record.
    assert!(
        b.len() <= u32::MAX as usize,
        "a record value of {} bytes",
        b.len()
    );
    put_u32(w, b.len() as u32);
    w.extend_from_slice(b);
}

/// Writes a snapshot entry.
pub(crate) fn put_snapshot(w: &mut Vec<u8>, snap: &Snapshot) {
    w.push(T_SNAPSHOT);
    put_bytes(w, snap.name.as_bytes());
    put_bytes(w, &snap.encode());
}

pub(crate) fn put_opt(w: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            w.push(1);
            put_bytes(w, b);
        }
        None => w.push(0),
    }
}

/// Reads a payload; every read is bounds-checked (a damaged record gives
/// an error, never a panic).
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.at >= self.b.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| corrupt("truncated entry"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?
                .try_into()
                .expect("slice length matches the array"),
        ))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?
                .try_into()
                .expect("slice length matches the array"),
        ))
    }

    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>> {
        match self.u8()? {
            0 => Ok(None),
            _ => self.bytes().map(Some),
        }
    }
}

#[cfg(test)]
mod fuzz_tests;
