//! The device header: the first 4 KiB of every device. It names the pool the
//! device belongs to, the device id and class, and the geometry of its
//! segment slots. Layout (little endian), see docs/FORMAT.md:
//!
//! ```text
//! 0   magic "CAIRNDEV"     8
//! 8   format version u32   4
//! 12  device id u32        4
//! 16  pool uuid            16
//! 32  class rank u8        1 (+7 pad)
//! 40  size u64             8   usable bytes of the device
//! 48  segment size u64     8
//! 56  data offset u64      8   byte offset of slot 0
//! 64  crc32c of bytes 0..64           (version 1)
//! 64  log offset u64       8          (version 2: the device holds a
//! 72  log length u64       8           copy of the intent log there)
//! 80  crc32c of bytes 0..80           (version 2)
//! ```
//!
//! A device without a log area is written as version 1, one with as
//! version 2.

use crate::class::DeviceClass;
use crate::error::{DeviceError, Result};
use std::path::Path;

pub const DEVICE_MAGIC: &[u8; 8] = b"CAIRNDEV";
/// 2: a log area (offset, length) before slot 0. Version 1 headers (no log
/// area) are read and still written for devices without one.
pub const DEVICE_FORMAT_VERSION: u32 = 2;
const VERSION_NO_LOG: u32 = 1;
pub const HEADER_LEN: usize = 4096;
/// Slot 0 starts here: leaves room for the header and keeps slots aligned.
pub const DATA_OFFSET: u64 = 1 << 20;
/// The segment sizes a header may name (a pool asks for more: at least 4
/// records).
pub const MIN_SEGMENT_SIZE: u64 = 4096;
pub const MAX_SEGMENT_SIZE: u64 = 1 << 30;

// The header's fields and checksum (84 bytes for version 2) fit in it;
// slot 0 lies past it, and slots start on direct-I/O boundaries.
const _: () = assert!(80 + 4 <= HEADER_LEN);
const _: () = assert!(DATA_OFFSET >= HEADER_LEN as u64);
const _: () = assert!(DATA_OFFSET.is_multiple_of(crate::device::DIRECT_ALIGN as u64));
const _: () = assert!(MIN_SEGMENT_SIZE.is_multiple_of(crate::device::DIRECT_ALIGN as u64));

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHeader {
    pub device_id: u32,
    pub pool_uuid: [u8; 16],
    pub class: DeviceClass,
    pub size: u64,
    pub segment_size: u64,
    pub data_offset: u64,
    /// The intent log's area on this device (`log_len` 0: none), between
    /// the header and slot 0.
    pub log_offset: u64,
    pub log_len: u64,
}

impl DeviceHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        let version = match self.log_len {
            0 => VERSION_NO_LOG,
            _ => DEVICE_FORMAT_VERSION,
        };
        b[0..8].copy_from_slice(DEVICE_MAGIC);
        b[8..12].copy_from_slice(&version.to_le_bytes());
        b[12..16].copy_from_slice(&self.device_id.to_le_bytes());
        b[16..32].copy_from_slice(&self.pool_uuid);
        b[32] = self.class.rank();
        b[40..48].copy_from_slice(&self.size.to_le_bytes());
        b[48..56].copy_from_slice(&self.segment_size.to_le_bytes());
        b[56..64].copy_from_slice(&self.data_offset.to_le_bytes());
        let end = match version {
            VERSION_NO_LOG => 64,
            _ => {
                b[64..72].copy_from_slice(&self.log_offset.to_le_bytes());
                b[72..80].copy_from_slice(&self.log_len.to_le_bytes());
                80
            }
        };
        let crc = crc32c::crc32c(&b[0..end]);
        b[end..end + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8], path: &Path) -> Result<Self> {
        let p = || path.to_path_buf();
        if b.len() < 84 || &b[0..8] != DEVICE_MAGIC {
            return Err(DeviceError::NotADevice { path: p() });
        }
        let version =
            u32::from_le_bytes(b[8..12].try_into().expect("slice length matches the array"));
        let end = match version {
            VERSION_NO_LOG => 64,
            _ => 80,
        };
        let crc = u32::from_le_bytes(
            b[end..end + 4]
                .try_into()
                .expect("slice length matches the array"),
        );
        if crc != crc32c::crc32c(&b[0..end]) {
            return Err(DeviceError::BadChecksum { path: p() });
        }
        if !(VERSION_NO_LOG..=DEVICE_FORMAT_VERSION).contains(&version) {
            return Err(DeviceError::UnknownVersion {
                path: p(),
                found: version,
                known: DEVICE_FORMAT_VERSION,
            });
        }
        let u64_at = |o: usize| {
            u64::from_le_bytes(
                b[o..o + 8]
                    .try_into()
                    .expect("slice length matches the array"),
            )
        };
        let bad = |why| DeviceError::BadHeader { path: p(), why };
        let h = DeviceHeader {
            device_id: u32::from_le_bytes(
                b[12..16]
                    .try_into()
                    .expect("slice length matches the array"),
            ),
            pool_uuid: b[16..32]
                .try_into()
                .expect("slice length matches the array"),
            class: DeviceClass::from_rank(b[32]).ok_or_else(|| bad("unknown device class"))?,
            size: u64_at(40),
            segment_size: u64_at(48),
            data_offset: u64_at(56),
            log_offset: if end == 80 { u64_at(64) } else { 0 },
            log_len: if end == 80 { u64_at(72) } else { 0 },
        };
        h.check_geometry().map_err(bad)?;
        Ok(h)
    }

    /// The geometry `slot_count` and slot offsets rely on: a segment size
    /// that a pool can have (a power of two, 4 KiB to 1 GiB) and slot 0
    /// after the header and inside the device.
    pub(crate) fn check_geometry(&self) -> std::result::Result<(), &'static str> {
        let seg = self.segment_size;
        if !seg.is_power_of_two() || !(MIN_SEGMENT_SIZE..=MAX_SEGMENT_SIZE).contains(&seg) {
            return Err("segment size is not a power of two from 4 KiB to 1 GiB");
        }
        if self.data_offset < HEADER_LEN as u64 || self.data_offset > self.size {
            return Err("data offset is inside the header or past the device end");
        }
        let log_end = self.log_offset.checked_add(self.log_len);
        if self.log_len > 0
            && (self.log_offset < HEADER_LEN as u64 || log_end > Some(self.data_offset))
        {
            return Err("log area is inside the header or over the segment slots");
        }
        Ok(())
    }

    /// Number of whole segment slots that fit on the device.
    pub fn slot_count(&self) -> u64 {
        self.size.saturating_sub(self.data_offset) / self.segment_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DeviceHeader {
        DeviceHeader {
            device_id: 3,
            pool_uuid: [7; 16],
            class: DeviceClass::Hdd,
            size: 1 << 30,
            segment_size: 4 << 20,
            data_offset: DATA_OFFSET,
            log_offset: 0,
            log_len: 0,
        }
    }

    #[test]
    fn roundtrip() {
        let h = sample();
        let b = h.encode();
        assert_eq!(
            u32::from_le_bytes(b[8..12].try_into().expect("slice length matches the array")),
            1
        );
        assert_eq!(DeviceHeader::decode(&b, Path::new("x")).unwrap(), h);
        let with_log = DeviceHeader {
            log_offset: DATA_OFFSET,
            log_len: 16 << 20,
            data_offset: DATA_OFFSET + (16 << 20),
            ..sample()
        };
        let b = with_log.encode();
        assert_eq!(
            u32::from_le_bytes(b[8..12].try_into().expect("slice length matches the array")),
            2
        );
        assert_eq!(DeviceHeader::decode(&b, Path::new("x")).unwrap(), with_log);
        let mut bad = b.clone();
        bad[75] ^= 1;
        assert!(matches!(
            DeviceHeader::decode(&bad, Path::new("x")),
            Err(DeviceError::BadChecksum { .. })
        ));
        let over = DeviceHeader {
            log_len: 32 << 20,
            ..with_log
        };
        assert!(matches!(
            DeviceHeader::decode(&over.encode(), Path::new("x")),
            Err(DeviceError::BadHeader { .. })
        ));
        assert_eq!(h.slot_count(), ((1 << 30) - DATA_OFFSET) / (4 << 20));
    }

    #[test]
    fn detects_corruption_and_foreign_data() {
        let mut b = sample().encode();
        b[45] ^= 1;
        assert!(matches!(
            DeviceHeader::decode(&b, Path::new("x")),
            Err(DeviceError::BadChecksum { .. })
        ));
        let zeros = vec![0u8; HEADER_LEN];
        assert!(matches!(
            DeviceHeader::decode(&zeros, Path::new("x")),
            Err(DeviceError::NotADevice { .. })
        ));
    }
}
