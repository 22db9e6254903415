//! Element keys: object id (u64 BE) | record type (u8) | type-specific key.
//! Big endian so that byte order is numeric order and all elements of one
//! object, then of one record type, are contiguous.

use std::fmt;

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RecordType {
    Inode = 1,
    DirEntry = 2,
    Extent = 3,
    Symlink = 4,
    Xattr = 5,
}

impl RecordType {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => RecordType::Inode,
            2 => RecordType::DirEntry,
            3 => RecordType::Extent,
            4 => RecordType::Symlink,
            5 => RecordType::Xattr,
            _ => return None,
        })
    }
}

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ElemKey(pub Vec<u8>);

impl ElemKey {
    pub fn new(obj: u64, rtype: RecordType, sub: &[u8]) -> Self {
        let mut v = Vec::with_capacity(9 + sub.len());
        v.extend_from_slice(&obj.to_be_bytes());
        v.push(rtype as u8);
        v.extend_from_slice(sub);
        ElemKey(v)
    }

    /// Prefix of every key of one object and record type.
    pub fn prefix(obj: u64, rtype: RecordType) -> Vec<u8> {
        ElemKey::new(obj, rtype, &[]).0
    }

    /// Prefix of every key of one object.
    pub fn object_prefix(obj: u64) -> Vec<u8> {
        obj.to_be_bytes().to_vec()
    }

    /// The object id (a key too short to hold one, which only damage
    /// makes, reads as the bytes it has, zero-padded).
    pub fn obj(&self) -> u64 {
        let mut b = [0u8; 8];
        let n = self.0.len().min(8);
        b[..n].copy_from_slice(&self.0[..n]);
        u64::from_be_bytes(b)
    }

    pub fn rtype(&self) -> Option<RecordType> {
        self.0.get(8).and_then(|&t| RecordType::from_u8(t))
    }

    pub fn sub(&self) -> &[u8] {
        self.0.get(9..).unwrap_or(&[])
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for ElemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "obj {} type {:?} key {:02x?}",
            self.obj(),
            self.rtype(),
            self.sub()
        )
    }
}

impl fmt::Display for ElemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The smallest byte string greater than every string with this prefix.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut v = prefix.to_vec();
    while let Some(last) = v.pop() {
        if last < 0xff {
            v.push(last + 1);
            return Some(v);
        }
    }
    None
}
