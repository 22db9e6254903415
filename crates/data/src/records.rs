//! Chunk and segment records, as stored in the metadata store. Each value
//! starts with a format version byte and ends with a crc32c of what precedes.
//!
//! ChunkRec (v3, 74 + 4n bytes): ver u8 | segment u64 | offset u32 |
//!   len u32 | raw_len u32 | refs u64 | live u64 | hash [32] | n u8 |
//!   sums [u32; n] | crc u32   (len includes the header; `sums` are the
//!   crc32c of each 4 KiB of an uncompressed chunk's bytes, none for a
//!   compressed one; n is their count modulo 256, a 1 MiB chunk's 256
//!   sums count 0, and the record's length gives the count; v2, 73 bytes,
//!   had no n and sums; v1, 65 bytes, no `live` either)
//! SegmentRec (v3, 47 + 12n bytes): ver u8 | device u32 | slot u64 |
//!   used u32 | live u64 | chunks u64 | hist u64 | flags u8 | n u8 |
//!   n x (device u32 | slot u64) | crc u32   (the first copy, then n more,
//!   each on another device; v2, 46 bytes, had no n and further copies,
//!   and is still written for a segment with one copy, so that a pool
//!   without redundancy stays readable by older builds; v1, 38 bytes, had
//!   no `hist` either)
//! SegmentRec v4 (51 + 12n bytes, written only for a segment whose files
//!   asked for a layout of their own): as v3 with n from 0, then
//!   layout u32 (`copies=N` as N, `ec=K+M` as 0x10000 | K << 8 | M)
//!   before the crc

use crate::chunk::Hash;
use crate::error::{DataError, Result};
use crate::layout::Layout;
use cairn_devices::SlotAddr;

const REC_VERSION: u8 = 2;
/// Segment records with further copies.
const SEG_COPIES_VERSION: u8 = 3;
/// Segment records with a layout of their own (a file's policy).
const SEG_LAYOUT_VERSION: u8 = 4;
pub use crate::layout::MAX_COPIES;
const CHUNK_REC_VERSION: u8 = 3;

/// The span of each of a chunk record's `sums`.
pub const SUM_SPAN: usize = 4096;
// A small read of an encrypted chunk opens the spans a plain one checks.
const _: () = assert!(SUM_SPAN == crate::chunk::SEAL_SPAN);

/// The most sums a record holds (a chunk of 1 MiB).
const MAX_SUMS: usize = 256;

// The lengths the format (docs/format/metadata.md, "ChunkRec") gives the
// records, which `decode` tells versions apart by; and the sums of the
// largest chunk fit in a record.
const _: () = assert!(ChunkRec::V2_LEN == 73 && ChunkRec::V1_LEN == 65);
const _: () = assert!(SegmentRec::ENCODED_LEN == 46 && SegmentRec::V1_LEN == 38);
const _: () = assert!(MAX_SUMS * SUM_SPAN == crate::chunk::MAX_RAW_LEN as usize);

fn finish(mut b: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Checks a record's length (per version: `lens[v - 1]`) and crc; returns
/// its version and body.
fn check<'a>(what: &'static str, b: &'a [u8], lens: [usize; 2]) -> Result<(u8, &'a [u8])> {
    let bad = |why: &str| DataError::BadRecord {
        what,
        why: why.into(),
    };
    if !lens.contains(&b.len()) {
        return Err(bad("wrong length"));
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32c::crc32c(body)
        != u32::from_le_bytes(crc.try_into().expect("slice length matches the array"))
    {
        return Err(bad("checksum mismatch"));
    }
    let v = body[0];
    if !(1..=REC_VERSION).contains(&v) || lens[v as usize - 1] != b.len() {
        return Err(bad("unknown version"));
    }
    Ok((v, &body[1..]))
}

fn rd<const N: usize>(b: &[u8], o: &mut usize) -> [u8; N] {
    let v = b[*o..*o + N]
        .try_into()
        .expect("slice length matches the array");
    *o += N;
    v
}

/// Where a chunk is and how many elements reference it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRec {
    pub segment: u64,
    pub offset: u32,
    /// Bytes on disk including the chunk header.
    pub len: u32,
    pub raw_len: u32,
    pub refs: u64,
    /// How many of `refs` are live elements (delete TID infinity). A chunk
    /// with refs > 0 and live == 0 is referenced by history only.
    pub live: u64,
    pub hash: Hash,
    /// crc32c of each `SUM_SPAN` bytes of an uncompressed chunk's raw
    /// bytes (the last span may be shorter), so that a part of the chunk
    /// can be read and verified alone; empty when compressed or written
    /// by an older version (then only whole-chunk reads verify).
    pub sums: Vec<u32>,
}

impl ChunkRec {
    /// Length of a version 2 record (no sums).
    pub const V2_LEN: usize = 1 + 8 + 4 + 4 + 4 + 8 + 8 + 32 + 4;
    /// Version 1 records had no `live` count.
    pub const V1_LEN: usize = Self::V2_LEN - 8;

    /// The sums of raw bytes, one per `SUM_SPAN` (empty beyond `MAX_SUMS`).
    pub fn sums_of(raw: &[u8]) -> Vec<u32> {
        if raw.len() > MAX_SUMS * SUM_SPAN {
            return Vec::new();
        }
        raw.chunks(SUM_SPAN).map(crc32c::crc32c).collect()
    }

    /// True if `raw_len` bytes stored raw carry one sum per span: the
    /// chunk's parts can be read alone.
    pub fn has_sums(&self) -> bool {
        !self.sums.is_empty() && self.sums.len() == (self.raw_len as usize).div_ceil(SUM_SPAN)
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "the count byte holds the number of sums (at most MAX_SUMS = 256, asserted) modulo 256 on purpose: decode_v3 takes the count from the length"
    )]
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.sums.len() <= MAX_SUMS, "too many chunk sums");
        let mut b = Vec::with_capacity(Self::V2_LEN + 1 + 4 * self.sums.len());
        b.push(CHUNK_REC_VERSION);
        b.extend_from_slice(&self.segment.to_le_bytes());
        b.extend_from_slice(&self.offset.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.raw_len.to_le_bytes());
        b.extend_from_slice(&self.refs.to_le_bytes());
        b.extend_from_slice(&self.live.to_le_bytes());
        b.extend_from_slice(&self.hash);
        b.push(self.sums.len() as u8);
        for s in &self.sums {
            b.extend_from_slice(&s.to_le_bytes());
        }
        let b = finish(b);
        // `decode_v3` counts the sums by the length.
        assert_eq!(b.len(), Self::V2_LEN + 1 + 4 * self.sums.len());
        b
    }

    /// Decodes v3, v2 (no sums), or v1 with `live` taken as `refs` (the
    /// pool's one-time liveness conversion sets the real count, see
    /// `is_v1`).
    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.first() == Some(&CHUNK_REC_VERSION) {
            return Self::decode_v3(b);
        }
        let (v, b) = check("chunk", b, [Self::V1_LEN, Self::V2_LEN])?;
        let o = &mut 0;
        let segment = u64::from_le_bytes(rd(b, o));
        let offset = u32::from_le_bytes(rd(b, o));
        let len = u32::from_le_bytes(rd(b, o));
        let raw_len = u32::from_le_bytes(rd(b, o));
        let refs = u64::from_le_bytes(rd(b, o));
        let live = if v == 1 {
            refs
        } else {
            u64::from_le_bytes(rd(b, o))
        };
        Ok(ChunkRec {
            segment,
            offset,
            len,
            raw_len,
            refs,
            live,
            hash: rd(b, o),
            sums: Vec::new(),
        })
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "the count byte holds n modulo 256 on purpose (256 sums are stored as 0)"
    )]
    fn decode_v3(b: &[u8]) -> Result<Self> {
        let bad = |why: &str| DataError::BadRecord {
            what: "chunk",
            why: why.into(),
        };
        // The count byte is the number of sums modulo 256 (a 1 MiB chunk
        // has 256, stored as 0): the length says how many there are.
        let n_mod = *b.get(Self::V2_LEN - 4).ok_or_else(|| bad("wrong length"))?;
        let sums_len = b.len().checked_sub(Self::V2_LEN + 1);
        let n = sums_len
            .filter(|l| l % 4 == 0)
            .map_or(usize::MAX, |l| l / 4);
        if n > MAX_SUMS || n as u8 != n_mod {
            return Err(bad("wrong length"));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body)
            != u32::from_le_bytes(crc.try_into().expect("slice length matches the array"))
        {
            return Err(bad("checksum mismatch"));
        }
        let o = &mut 1;
        let mut rec = ChunkRec {
            segment: u64::from_le_bytes(rd(body, o)),
            offset: u32::from_le_bytes(rd(body, o)),
            len: u32::from_le_bytes(rd(body, o)),
            raw_len: u32::from_le_bytes(rd(body, o)),
            refs: u64::from_le_bytes(rd(body, o)),
            live: u64::from_le_bytes(rd(body, o)),
            hash: rd(body, o),
            sums: Vec::with_capacity(n),
        };
        *o += 1;
        for _ in 0..n {
            rec.sums.push(u32::from_le_bytes(rd(body, o)));
        }
        Ok(rec)
    }

    /// True if this encoded record is version 1 (no live count).
    pub fn is_v1(b: &[u8]) -> bool {
        b.len() == Self::V1_LEN && b.first() == Some(&1)
    }

    /// Referenced by history (or snapshots) only: no live element names it.
    pub fn history_only(&self) -> bool {
        self.refs > 0 && self.live == 0
    }
}

/// A chunk whose bytes or record do not check out.
pub(crate) fn corrupt(rec: &ChunkRec, why: String) -> DataError {
    DataError::Corrupt {
        segment: rec.segment,
        offset: rec.offset,
        why,
    }
}

/// A segment table entry: where the segment is (its first copy, and its
/// further copies on other devices) and how much of it is live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRec {
    pub device: u32,
    pub slot: u64,
    /// Further copies, each on a device no other copy uses.
    pub copies: Vec<SlotAddr>,
    /// Bytes appended (committed) so far.
    pub used: u32,
    /// Bytes of chunks still referenced.
    pub live: u64,
    /// Number of chunks still referenced.
    pub chunks: u64,
    /// Bytes (part of `live`) of chunks that only history or snapshots
    /// reference: the coldest data, demoted first.
    pub hist: u64,
    pub flags: u8,
    /// The layout a file's policy asked for (`user.cairn.redundancy`);
    /// None: its class's layout (`Policy::segment_layout`).
    pub layout: Option<Layout>,
}

impl SegmentRec {
    pub const ENCODED_LEN: usize = 1 + 4 + 8 + 4 + 8 + 8 + 8 + 1 + 4;
    /// Version 1 records had no `hist`.
    pub const V1_LEN: usize = Self::ENCODED_LEN - 8;

    /// Bytes of chunks that some live element references.
    pub fn live_data(&self) -> u64 {
        self.live.saturating_sub(self.hist)
    }

    /// A new segment's record: at `places` (its first copy first), empty.
    pub fn new_at(places: &[SlotAddr]) -> Self {
        assert!(
            (1..=MAX_COPIES).contains(&places.len()),
            "a segment has 1 to {MAX_COPIES} copies, not {}",
            places.len()
        );
        // `decode` refuses a record with two copies on one device.
        assert!(
            (places.iter().enumerate())
                .all(|(i, p)| places[..i].iter().all(|q| q.device != p.device)),
            "two copies of a segment on one device: {places:?}"
        );
        SegmentRec {
            device: places[0].device,
            slot: places[0].slot,
            copies: places[1..].to_vec(),
            used: 0,
            live: 0,
            chunks: 0,
            hist: 0,
            flags: 0,
            layout: None,
        }
    }

    /// Where every copy is: the first, then the further ones.
    pub fn places(&self) -> Vec<SlotAddr> {
        let first = SlotAddr {
            device: self.device,
            slot: self.slot,
        };
        std::iter::once(first)
            .chain(self.copies.iter().copied())
            .collect()
    }

    /// Sets where the copies are (the first becomes `device`/`slot`).
    pub fn set_places(&mut self, places: &[SlotAddr]) {
        let fresh = Self::new_at(places);
        (self.device, self.slot, self.copies) = (fresh.device, fresh.slot, fresh.copies);
    }

    /// True if a copy lives on device `id`.
    pub fn on_device(&self, id: u32) -> bool {
        self.device == id || self.copies.iter().any(|c| c.device == id)
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "copies.len() < MAX_COPIES = 4 (asserted) and a layout counter below 2^32 (EC_TAG | k << 8 | m, asserted to round-trip)"
    )]
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.copies.len() < MAX_COPIES, "too many segment copies");
        let mut b = Vec::with_capacity(Self::ENCODED_LEN + 1 + 12 * self.copies.len());
        let version = match (self.layout, self.copies.is_empty()) {
            (Some(_), _) => SEG_LAYOUT_VERSION,
            (None, true) => REC_VERSION,
            (None, false) => SEG_COPIES_VERSION,
        };
        b.push(version);
        b.extend_from_slice(&self.device.to_le_bytes());
        b.extend_from_slice(&self.slot.to_le_bytes());
        b.extend_from_slice(&self.used.to_le_bytes());
        b.extend_from_slice(&self.live.to_le_bytes());
        b.extend_from_slice(&self.chunks.to_le_bytes());
        b.extend_from_slice(&self.hist.to_le_bytes());
        b.push(self.flags);
        if version != REC_VERSION {
            b.push(self.copies.len() as u8);
            for c in &self.copies {
                b.extend_from_slice(&c.device.to_le_bytes());
                b.extend_from_slice(&c.slot.to_le_bytes());
            }
        }
        if let Some(l) = self.layout {
            // `decode` takes the layout back from this value, or refuses
            // the record.
            assert_eq!(
                Layout::from_counter(l.counter()),
                Some(l),
                "segment layout {l:?}"
            );
            b.extend_from_slice(&(l.counter() as u32).to_le_bytes());
        }
        let b = finish(b);
        // The length `decode` checks for this version.
        let tail = 4 * self.layout.is_some() as usize;
        assert_eq!(
            b.len(),
            match version {
                REC_VERSION => Self::ENCODED_LEN,
                _ => Self::ENCODED_LEN + 1 + 12 * self.copies.len() + tail,
            }
        );
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        match b.first() {
            Some(&SEG_COPIES_VERSION) => return Self::decode_v3(b, false),
            Some(&SEG_LAYOUT_VERSION) => return Self::decode_v3(b, true),
            _ => {}
        }
        let (v, b) = check("segment", b, [Self::V1_LEN, Self::ENCODED_LEN])?;
        Ok(Self::decode_body(v, b, &mut 0))
    }

    /// The fields up to `flags` of a checked record body of version `v`.
    fn decode_body(v: u8, b: &[u8], o: &mut usize) -> Self {
        SegmentRec {
            device: u32::from_le_bytes(rd(b, o)),
            slot: u64::from_le_bytes(rd(b, o)),
            copies: Vec::new(),
            used: u32::from_le_bytes(rd(b, o)),
            live: u64::from_le_bytes(rd(b, o)),
            chunks: u64::from_le_bytes(rd(b, o)),
            hist: if v == 1 {
                0
            } else {
                u64::from_le_bytes(rd(b, o))
            },
            flags: rd::<1>(b, o)[0],
            layout: None,
        }
    }

    /// A version 3 record: a version 2 body, then the further copies; a
    /// version 4 one (`with_layout`) may have none, and ends with a layout.
    fn decode_v3(b: &[u8], with_layout: bool) -> Result<Self> {
        let bad = |why: &str| DataError::BadRecord {
            what: "segment",
            why: why.into(),
        };
        let n = *b
            .get(Self::ENCODED_LEN - 4)
            .ok_or_else(|| bad("wrong length"))? as usize;
        let tail = if with_layout { 4 } else { 0 };
        let none_ok = with_layout && n == 0;
        if (n == 0 && !none_ok)
            || n >= MAX_COPIES
            || b.len() != Self::ENCODED_LEN + 1 + 12 * n + tail
        {
            return Err(bad("wrong length"));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body)
            != u32::from_le_bytes(crc.try_into().expect("slice length matches the array"))
        {
            return Err(bad("checksum mismatch"));
        }
        let o = &mut 1;
        let mut rec = Self::decode_body(SEG_COPIES_VERSION, body, o);
        *o += 1;
        for _ in 0..n {
            let device = u32::from_le_bytes(rd(body, o));
            let slot = u64::from_le_bytes(rd(body, o));
            rec.copies.push(SlotAddr { device, slot });
        }
        if with_layout {
            let v = u32::from_le_bytes(rd(body, o)) as u64;
            rec.layout = Some(Layout::from_counter(v).ok_or_else(|| bad("unknown layout"))?);
        }
        let mut devices: Vec<u32> = rec.places().iter().map(|p| p.device).collect();
        devices.sort_unstable();
        devices.dedup();
        if devices.len() != n + 1 {
            return Err(bad("two copies on one device"));
        }
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrips_and_checksums() {
        let c = ChunkRec {
            segment: 9,
            offset: 1234,
            len: 65592,
            raw_len: 65536,
            refs: 3,
            live: 1,
            hash: [5; 32],
            sums: ChunkRec::sums_of(&[7u8; 65536]),
        };
        assert!(c.has_sums());
        let mut b = c.encode();
        assert_eq!(b.len(), ChunkRec::V2_LEN + 1 + 16 * 4);
        assert_eq!(ChunkRec::decode(&b).unwrap(), c);
        for at in [10, 80, b.len() - 1] {
            b[at] ^= 1;
            assert!(ChunkRec::decode(&b).is_err(), "flip at {at}");
            b[at] ^= 1;
        }
        assert!(ChunkRec::decode(&b[..b.len() - 4]).is_err());
        // Version 2 records (no sums) still decode.
        let mut v2 = vec![2u8];
        v2.extend_from_slice(&b[1..ChunkRec::V2_LEN - 4]);
        let crc = crc32c::crc32c(&v2);
        v2.extend_from_slice(&crc.to_le_bytes());
        let old = ChunkRec::decode(&v2).unwrap();
        assert_eq!(old.sums, Vec::<u32>::new());
        assert!(!old.has_sums());
        assert_eq!((old.refs, old.live, old.hash), (c.refs, c.live, c.hash));
        let s = SegmentRec {
            device: 2,
            slot: 77,
            copies: Vec::new(),
            used: 4000,
            live: 3000,
            chunks: 2,
            hist: 1000,
            flags: 0,
            layout: None,
        };
        assert_eq!(SegmentRec::decode(&s.encode()).unwrap(), s);
        // Version 1 records still decode.
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&s.encode()[1..33]);
        v1.push(0);
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        let old = SegmentRec::decode(&v1).unwrap();
        assert_eq!((old.live, old.chunks, old.hist), (3000, 2, 0));
    }

    #[test]
    fn segment_copies_roundtrip_and_bad_ones_are_refused() {
        let at = |device, slot| SlotAddr { device, slot };
        let mut s = SegmentRec::new_at(&[at(0, 5), at(3, 9)]);
        s.used = 100;
        let b = s.encode();
        assert_eq!(b[0], SEG_COPIES_VERSION);
        assert_eq!(b.len(), SegmentRec::ENCODED_LEN + 1 + 12);
        let back = SegmentRec::decode(&b).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.places(), vec![at(0, 5), at(3, 9)]);
        assert!(back.on_device(3) && !back.on_device(1));
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 0x10;
            assert!(SegmentRec::decode(&x).is_err(), "flip at {i}");
        }
        assert!(SegmentRec::decode(&b[..b.len() - 1]).is_err());
        // One copy: still a version 2 record.
        let one = SegmentRec::new_at(&[at(1, 2)]);
        assert_eq!(one.encode()[0], REC_VERSION);
        // Two copies on one device are refused.
        let mut twice = s.clone();
        twice.copies[0].device = 0;
        let mut raw = twice.encode();
        let n = raw.len();
        let crc = crc32c::crc32c(&raw[..n - 4]);
        raw[n - 4..].copy_from_slice(&crc.to_le_bytes());
        assert!(SegmentRec::decode(&raw).is_err());
    }

    #[test]
    fn segment_layout_roundtrips_and_bad_ones_are_refused() {
        let at = |device, slot| SlotAddr { device, slot };
        for (places, layout) in [
            (vec![at(0, 5)], Layout::Copies(1)),
            (vec![at(0, 5), at(2, 1), at(3, 7)], Layout::Copies(3)),
            (vec![at(4, 4), at(1, 1)], Layout::Ec { k: 4, m: 1 }),
        ] {
            let mut s = SegmentRec::new_at(&places);
            s.layout = Some(layout);
            let b = s.encode();
            assert_eq!(b[0], SEG_LAYOUT_VERSION);
            assert_eq!(
                b.len(),
                SegmentRec::ENCODED_LEN + 1 + 12 * (places.len() - 1) + 4
            );
            assert_eq!(SegmentRec::decode(&b).unwrap(), s);
            for i in 0..b.len() {
                let mut x = b.clone();
                x[i] ^= 0x10;
                assert!(SegmentRec::decode(&x).is_err(), "flip at {i}");
            }
            assert!(SegmentRec::decode(&b[..b.len() - 4]).is_err());
        }
        // A layout no policy has is refused, its crc right or not.
        let mut s = SegmentRec::new_at(&[at(0, 1)]);
        s.layout = Some(Layout::Copies(2));
        let mut raw = s.encode();
        let n = raw.len();
        raw[n - 8..n - 4].copy_from_slice(&9u32.to_le_bytes());
        let crc = crc32c::crc32c(&raw[..n - 4]);
        raw[n - 4..].copy_from_slice(&crc.to_le_bytes());
        assert!(SegmentRec::decode(&raw).is_err());
    }
}
