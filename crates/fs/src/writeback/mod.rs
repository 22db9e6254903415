//! Write-back: the dirty overlay in RAM, flush groups that turn it into one
//! committed TID, the intent log that makes fsync cheap, small overwrites
//! stored as pieces, and the blocks the last flushes wrote (for
//! read-modify-write).

pub(crate) mod committing;
pub mod flush;
pub(crate) mod intent;
pub(crate) mod intent_record;
pub mod log_file;
pub mod overlay;
pub mod patch;
pub mod pieces;
pub(crate) mod recent;
pub(crate) mod tick;
