//! Devices layer: the bottom of Cairn. A pool stores its data on devices
//! (regular files, directories or block devices), each with a speed class.
//! This crate owns the device backend trait (how bytes reach a file: the
//! host, an emulated slow device, the crash-recording and fault-injecting
//! test backends), the per-device header, positioned I/O on a device, the
//! map of segment slots in use, placement (which device gets the next
//! segment), slow-device emulation and the SSD cache ring. It knows nothing
//! about chunks, files or metadata.

// Offsets and lengths are u64 on disk and index buffers in memory as usize:
// Cairn builds for 64-bit targets only, where `u64 as usize` is lossless
// (the lint baseline's allows of cast_possible_truncation rely on it).
const _: () = assert!(usize::BITS == 64, "Cairn needs a 64-bit target");

pub mod backend;
pub mod class;
pub mod device;
pub mod emulate;
pub mod error;
pub mod header;
pub mod objdev;
pub mod private;
pub mod read_watch;
pub mod set;
pub mod size;
pub mod spacemap;
pub mod ssdcache;

pub use backend::{Backend, HostStorage, OpenHow, Storage};
pub use class::{DeviceClass, DeviceRole};
pub use device::{Device, DeviceSpec, DIRECT_ALIGN, MAX_LOG_AREA, MIN_LOG_AREA};
pub use emulate::Emulation;
pub use error::DeviceError;
pub use header::DeviceHeader;
pub use objdev::ObjectOptions;
pub use set::{DeviceSet, DeviceState, SlotAddr};
pub use size::{human, parse_size};
pub use spacemap::SpaceMap;
pub use ssdcache::{CacheStats, FillLimit, SsdCache};
