//! What one daemon hands the next when it gives up a mount without
//! unmounting it (`cairn restart`): the kernel's INIT request (the new
//! daemon runs its `init` on it, since the kernel sends INIT once per
//! mount), the lookup references the kernel holds to live inodes and the
//! view inode table (the kernel keeps using those numbers). Encoded and
//! decoded here only; the layout is in docs/format/handover.md.
//!
//! ```text
//! magic "CRNHOVR\0" | version u32 | init len u32, bytes
//! | refs count u64, (ino u64, count u64)* | view generation u32,
//! | next view u64, views count u64, (vino u64, ino u64, tid u64, count u64)*
//! | crc32c of everything before u32
//! ```
//! Little-endian throughout.

use thiserror::Error;

const MAGIC: &[u8; 8] = b"CRNHOVR\0";
const VERSION: u32 = 1;
/// An INIT request is 64 bytes on today's kernels; this bounds a damaged
/// length field.
const MAX_INIT: usize = 4096;

/// One view inode the kernel knows: (view inode, inode, TID, lookups).
pub type ViewEntry = (u64, u64, u64, u64);

/// The view inode table as handed over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewTable {
    pub generation: u32,
    pub next: u64,
    pub entries: Vec<ViewEntry>,
}

/// The state handed from one daemon to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handover {
    /// The kernel's INIT request, as read.
    pub init: Vec<u8>,
    /// (inode, lookup references) of live inodes.
    pub refs: Vec<(u64, u64)>,
    pub views: ViewTable,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum HandoverError {
    #[error("handover state: not one (bad magic)")]
    Magic,
    #[error("handover state: version {0}, this daemon reads version {VERSION}")]
    Version(u32),
    #[error("handover state: checksum mismatch")]
    Checksum,
    #[error("handover state: truncated or malformed ({0})")]
    Malformed(&'static str),
}

impl Handover {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.init.len() + 16 * self.refs.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        let init_len = u32::try_from(self.init.len()).expect("INIT request fits u32");
        b.extend_from_slice(&init_len.to_le_bytes());
        b.extend_from_slice(&self.init);
        b.extend_from_slice(&(self.refs.len() as u64).to_le_bytes());
        for &(ino, n) in &self.refs {
            b.extend_from_slice(&ino.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
        }
        let v = &self.views;
        b.extend_from_slice(&v.generation.to_le_bytes());
        b.extend_from_slice(&v.next.to_le_bytes());
        b.extend_from_slice(&(v.entries.len() as u64).to_le_bytes());
        for &(vino, ino, tid, n) in &v.entries {
            for x in [vino, ino, tid, n] {
                b.extend_from_slice(&x.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Handover, HandoverError> {
        let body_len = b
            .len()
            .checked_sub(4)
            .ok_or(HandoverError::Malformed("shorter than its checksum"))?;
        let (body, crc) = b.split_at(body_len);
        let mut r = Reader(body);
        if r.take(8)? != MAGIC {
            return Err(HandoverError::Magic);
        }
        let version = r.u32()?;
        if version != VERSION {
            return Err(HandoverError::Version(version));
        }
        if crc32c::crc32c(body).to_le_bytes() != crc {
            return Err(HandoverError::Checksum);
        }
        let init_len = r.u32()? as usize;
        if init_len > MAX_INIT {
            return Err(HandoverError::Malformed("INIT request too long"));
        }
        let init = r.take(init_len)?.to_vec();
        let refs = r.list(16, |r| {
            let (ino, n) = (r.u64()?, r.u64()?);
            match n > 0 && ino != 1 {
                true => Ok((ino, n)),
                false => Err(HandoverError::Malformed(
                    "a reference of the root or of none",
                )),
            }
        })?;
        let (generation, next) = (r.u32()?, r.u64()?);
        let entries = r.list(32, |r| Ok((r.u64()?, r.u64()?, r.u64()?, r.u64()?)))?;
        if !r.0.is_empty() {
            return Err(HandoverError::Malformed("bytes after the view table"));
        }
        Ok(Handover {
            init,
            refs,
            views: ViewTable {
                generation,
                next,
                entries,
            },
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HandoverError> {
        if self.0.len() < n {
            return Err(HandoverError::Malformed("ends early"));
        }
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, HandoverError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, HandoverError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A count, then that many items of `size` bytes each (the count is
    /// checked against what is left before anything is allocated).
    fn list<T>(
        &mut self,
        size: usize,
        mut item: impl FnMut(&mut Self) -> Result<T, HandoverError>,
    ) -> Result<Vec<T>, HandoverError> {
        let n = usize::try_from(self.u64()?).map_err(|_| HandoverError::Malformed("count"))?;
        if n.checked_mul(size).is_none_or(|bytes| bytes > self.0.len()) {
            return Err(HandoverError::Malformed("a count larger than the state"));
        }
        (0..n).map(|_| item(self)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Handover {
        Handover {
            init: vec![7; 64],
            refs: vec![(2, 1), (99, 4)],
            views: ViewTable {
                generation: 0xdead,
                next: 3,
                entries: vec![((1 << 62) + 1, 5, 9, 2)],
            },
        }
    }

    #[test]
    fn round_trips() {
        let h = sample();
        assert_eq!(Handover::decode(&h.encode()).unwrap(), h);
        let empty = Handover::default();
        assert_eq!(Handover::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn refuses_damage_without_panicking() {
        let b = sample().encode();
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x40;
            assert!(Handover::decode(&d).is_err(), "flip at byte {i} accepted");
        }
        for n in 0..b.len() {
            assert!(Handover::decode(&b[..n]).is_err(), "{n} bytes accepted");
        }
        let mut v2 = b.clone();
        v2[8] = 2;
        assert_eq!(Handover::decode(&v2), Err(HandoverError::Version(2)));
    }
}
