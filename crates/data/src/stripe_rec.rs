//! The stripe record, as the metadata store keeps it (table `stripes_v1`,
//! stripe id -> record): K data members (slots that segments use or used)
//! and M parity members (slots of Reed–Solomon parity over the first `len`
//! bytes of the data members, `ec.rs`), each on its own device.
//!
//! StripeRec (v1, 8 + 12(k+m) bytes): ver u8 | k u8 | m u8 | len u32 |
//!   (k+m) x (device u32 | slot u64) | crc u32   (data members first).

use crate::error::{DataError, Result};
use cairn_devices::SlotAddr;

const STRIPE_VERSION: u8 = 1;
pub use crate::layout::{MAX_DATA, MAX_PARITY};

/// Where a stripe's members are and how much of each parity covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeRec {
    pub k: u8,
    pub m: u8,
    /// Bytes of each member that parity covers (from the slot's start; a
    /// multiple of `ec::ALIGN`).
    pub len: u32,
    /// K data members, then M parity members.
    pub members: Vec<SlotAddr>,
}

impl StripeRec {
    const HEAD: usize = 1 + 1 + 1 + 4;

    /// The data members.
    pub fn data(&self) -> &[SlotAddr] {
        &self.members[..self.k as usize]
    }

    /// The position of `at` among the members.
    pub fn position(&self, at: SlotAddr) -> Option<usize> {
        self.members.iter().position(|p| *p == at)
    }

    /// Why `k`, `m`, `len` and `members` cannot be a stripe, if they
    /// cannot.
    fn invalid(&self) -> Option<&'static str> {
        let (k, m) = (self.k as usize, self.m as usize);
        if !(2..=MAX_DATA).contains(&k) || !(1..=MAX_PARITY).contains(&m) {
            return Some("impossible data or parity count");
        }
        if self.members.len() != k + m {
            return Some("member count differs from k + m");
        }
        if self.len == 0 || !(self.len as u64).is_multiple_of(crate::ec::ALIGN) {
            return Some("length not a positive multiple of 64");
        }
        let mut devices: Vec<u32> = self.members.iter().map(|p| p.device).collect();
        devices.sort_unstable();
        devices.dedup();
        (devices.len() != k + m).then_some("two members on one device")
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.invalid().is_none(), "encoding a bad stripe {self:?}");
        let mut b = Vec::with_capacity(Self::HEAD + 12 * self.members.len() + 4);
        b.extend_from_slice(&[STRIPE_VERSION, self.k, self.m]);
        b.extend_from_slice(&self.len.to_le_bytes());
        for p in &self.members {
            b.extend_from_slice(&p.device.to_le_bytes());
            b.extend_from_slice(&p.slot.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        // `decode` counts the members by the length.
        assert_eq!(b.len(), Self::HEAD + 12 * self.members.len() + 4);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let bad = |why: &str| DataError::BadRecord {
            what: "stripe",
            why: why.into(),
        };
        if b.len() < Self::HEAD + 4 || !(b.len() - Self::HEAD - 4).is_multiple_of(12) {
            return Err(bad("wrong length"));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body)
            != u32::from_le_bytes(crc.try_into().expect("slice length matches the array"))
        {
            return Err(bad("checksum mismatch"));
        }
        if body[0] != STRIPE_VERSION {
            return Err(bad("unknown version"));
        }
        let members = body[Self::HEAD..]
            .chunks_exact(12)
            .map(|c| SlotAddr {
                device: u32::from_le_bytes(
                    c[..4].try_into().expect("slice length matches the array"),
                ),
                slot: u64::from_le_bytes(
                    c[4..].try_into().expect("slice length matches the array"),
                ),
            })
            .collect();
        let rec = StripeRec {
            k: body[1],
            m: body[2],
            len: u32::from_le_bytes(
                body[3..7]
                    .try_into()
                    .expect("slice length matches the array"),
            ),
            members,
        };
        match rec.invalid() {
            Some(why) => Err(bad(why)),
            None => Ok(rec),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrips_and_refuses_damage_and_nonsense() {
        let at = |device, slot| SlotAddr { device, slot };
        let s = StripeRec {
            k: 4,
            m: 2,
            len: 1 << 20,
            members: (0..6).map(|d| at(d, 10 + d as u64)).collect(),
        };
        let b = s.encode();
        assert_eq!(b.len(), 7 + 6 * 12 + 4);
        let back = StripeRec::decode(&b).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.data().len(), 4);
        assert_eq!(back.position(at(5, 15)), Some(5));
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 0x04;
            assert!(StripeRec::decode(&x).is_err(), "flip at {i}");
        }
        assert!(StripeRec::decode(&b[..b.len() - 12]).is_err());
        assert!(StripeRec::decode(&[]).is_err());
        // Checksummed but impossible: refused by what it says.
        let reseal = |mut r: Vec<u8>| {
            let n = r.len() - 4;
            let crc = crc32c::crc32c(&r[..n]);
            r[n..].copy_from_slice(&crc.to_le_bytes());
            r
        };
        let mut two_on_one = b.clone();
        two_on_one[7..11].copy_from_slice(&1u32.to_le_bytes());
        let e = StripeRec::decode(&reseal(two_on_one)).unwrap_err();
        assert!(e.to_string().contains("two members on one device"), "{e}");
        let mut k_wrong = b.clone();
        k_wrong[1] = 5;
        assert!(StripeRec::decode(&reseal(k_wrong)).is_err());
    }
}
