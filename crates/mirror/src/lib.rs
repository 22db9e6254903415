//! Mirror streams (HAMMER's mirror-read / mirror-write): a pool's changes
//! after a TID, read as a versioned, framed and checksummed stream bound
//! to the source pool and its TID range, and applied to a mirror pool at
//! the source's own TIDs, batch by batch. The filesystem layer gives the
//! changes and applies them (`cairn_fs::replica`); this crate is the
//! stream: its format (`frame`, `records`), reading it out of a source
//! (`read`) and applying it to a mirror (`apply`). It also holds what
//! the `cairn mirror` commands do with streams: the typed replies of the
//! mirror control requests (`reply`), their pool side (`serve`), and the
//! copies between two pools (`copy`) and through a bucket
//! (`bucket::copy`), which reach the pools through traits the command
//! implements.

pub mod apply;
pub mod bucket;
pub mod copy;
pub mod error;
pub mod frame;
pub mod negotiate;
pub mod read;
pub mod records;
pub mod reply;
pub mod serve;

pub use apply::{
    apply_stream, apply_streams, check_stream, check_streams, ApplyOptions, ApplyReport,
};
pub use copy::{CopyOptions, Mirror, Source};
pub use error::{CopyError, EndpointError, Result, StreamError};
pub use read::{read_stream, read_stream_limited, Held, Limits, ReadReport};
