//! The open segment: a segment chunks are being appended to (by a write
//! batch, `writer.rs`), with its bytes not yet written kept in an aligned
//! buffer (`SegBuf`), so that whole blocks go to the device without another
//! copy.

use crate::aligned::AlignedBuf;
use crate::layout::Layout;
use cairn_devices::{SlotAddr, DIRECT_ALIGN};

/// The open segment's bytes from `OpenSegment::buf_start` on, in an aligned
/// buffer, so that whole blocks go to the device without another copy.
pub(crate) struct SegBuf {
    buf: AlignedBuf,
    len: usize,
}

impl SegBuf {
    pub(crate) fn new(buf: AlignedBuf) -> Self {
        SegBuf { buf, len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Empties the buffer (kept for the next segment).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends `parts` one after another, growing the buffer if needed
    /// (always leaving room to pad to the next DIRECT_ALIGN boundary).
    pub(crate) fn push(&mut self, parts: &[&[u8]]) {
        let n: usize = parts.iter().map(|p| p.len()).sum();
        let need = self.len + n + DIRECT_ALIGN;
        if need > self.buf.capacity() {
            let mut bigger = AlignedBuf::new(need.max(2 * self.buf.capacity()), DIRECT_ALIGN);
            bigger
                .slice_mut(self.len)
                .copy_from_slice(self.buf.slice_mut(self.len));
            self.buf = bigger;
        }
        let all = self.buf.slice_mut(self.len + n);
        for p in parts {
            all[self.len..self.len + p.len()].copy_from_slice(p);
            self.len += p.len();
        }
        // `padded` can always round up to a whole block.
        debug_assert!(self.len + DIRECT_ALIGN <= self.buf.capacity());
    }

    /// The bytes from `from` on.
    pub(crate) fn tail(&mut self, from: usize) -> &[u8] {
        &self.buf.slice_mut(self.len)[from..]
    }

    /// The buffer with zeros after the bytes up to `len`, to be written.
    pub(crate) fn padded(mut self, len: usize) -> AlignedBuf {
        assert!(self.len <= len && len <= self.buf.capacity());
        self.buf.slice_mut(len)[self.len..].fill(0);
        self.buf
    }
}

pub struct OpenSegment {
    pub(crate) id: u64,
    /// Its copies, the first first (one per device; a copy whose write
    /// failed is taken out by the batch).
    pub(crate) places: Vec<SlotAddr>,
    /// Bytes appended, including those still in `buf`.
    pub(crate) used: u32,
    /// Segment offset where `buf` starts (a multiple of DIRECT_ALIGN).
    pub(crate) buf_start: u32,
    /// The segment's bytes from `buf_start` to `used`.
    pub(crate) buf: SegBuf,
    /// Bytes up to here are written to the device.
    pub(crate) written: u32,
    /// On an object-store device: written whole when closed (`writer.rs`).
    pub(crate) whole: bool,
    /// The layout its files asked for (None: its class's).
    pub(crate) layout: Option<Layout>,
}

impl OpenSegment {
    /// Where its first copy is (the class the segment belongs to).
    pub(crate) fn first(&self) -> SlotAddr {
        self.places[0]
    }

    /// True when nothing appended is still only in memory.
    pub(crate) fn is_flushed(&self) -> bool {
        self.written == self.used
    }
}

#[cfg(test)]
mod tests {
    use super::SegBuf;
    use crate::aligned::AlignedBuf;

    #[test]
    fn segment_buffer_pads_over_stale_bytes_and_grows() {
        let stale = || {
            let mut b = AlignedBuf::new(32_768, 4096);
            b.slice_mut(32_768).fill(0xff);
            SegBuf::new(b)
        };
        let mut b = stale();
        b.push(&[&[1u8; 5000], &[2u8; 10_000]]);
        assert_eq!(b.len(), 15_000);
        assert_eq!(b.tail(4999)[..2], [1, 2]);
        let mut out = b.padded(16_384);
        let all = out.slice_mut(16_384);
        assert!(all[..5000].iter().all(|&x| x == 1));
        assert!(all[5000..15_000].iter().all(|&x| x == 2));
        assert!(all[15_000..].iter().all(|&x| x == 0), "padding is zeros");
        let mut b = stale();
        b.push(&[&[3u8; 20_000]]);
        b.push(&[&[4u8; 20_000]]); // beyond the capacity: grows, keeps bytes
        assert_eq!(b.len(), 40_000);
        assert!(b.tail(0)[..20_000].iter().all(|&x| x == 3));
        assert!(b.tail(20_000).iter().all(|&x| x == 4));
    }
}
