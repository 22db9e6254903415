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

    /// The key of file `obj`'s extent at block `blk` (the block number
    /// big-endian, so a file's extents sort by offset).
    pub fn extent(obj: u64, blk: u64) -> Self {
        ElemKey::new(obj, RecordType::Extent, &blk.to_be_bytes())
    }

    /// The block number of an extent key: the one decoder of that key
    /// kind (a key of another kind, or one whose block number is not 8
    /// bytes, which only damage makes, is an error naming the key).
    pub fn extent_block(&self) -> Result<u64, crate::error::MetaError> {
        let bad = |why: &str| crate::error::MetaError::Corrupt {
            key: format!("{self}"),
            why: why.to_string(),
        };
        if self.rtype() != Some(RecordType::Extent) {
            return Err(bad("not an extent key"));
        }
        let b: [u8; 8] = (self.sub().try_into())
            .map_err(|_| bad("an extent key's block number is not 8 bytes"))?;
        Ok(u64::from_be_bytes(b))
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
        Self::rtype_of(&self.0)
    }

    /// The record type of the stored key `k` (None for one too short or
    /// of an unknown type, which only damage makes).
    pub fn rtype_of(k: &[u8]) -> Option<RecordType> {
        k.get(8).and_then(|&t| RecordType::from_u8(t))
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

#[cfg(test)]
mod tests {
    use super::{ElemKey, RecordType};

    #[test]
    fn extent_keys_decode_in_one_place_and_damage_is_an_error() {
        let k = ElemKey::extent(7, 0x0102_0304_0506_0708);
        assert_eq!((k.obj(), k.rtype()), (7, Some(RecordType::Extent)));
        assert_eq!(k.extent_block().unwrap(), 0x0102_0304_0506_0708);
        assert!(
            ElemKey::extent(7, 1) < ElemKey::extent(7, 256),
            "sorted by block"
        );
        // A short or long block number, or another kind of key, is an
        // error that names the key, never a block 0.
        for bad in [
            ElemKey::new(7, RecordType::Extent, &[1, 2, 3]),
            ElemKey::new(7, RecordType::Extent, &[0; 9]),
            ElemKey::new(7, RecordType::Inode, &5u64.to_be_bytes()),
            ElemKey(vec![0, 0, 0, 0, 0, 0, 0, 7]),
        ] {
            let e = bad.extent_block().unwrap_err().to_string();
            assert!(e.contains("obj 7"), "{e}");
        }
    }
}
