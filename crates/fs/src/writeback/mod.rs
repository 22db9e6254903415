//! Write-back: the dirty overlay in RAM, flush groups that turn it into one
//! committed TID, and the blocks the last flushes wrote (for read-modify-write).

pub mod flush;
pub mod overlay;
pub(crate) mod recent;
