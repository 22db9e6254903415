//! What mirror streams need from the filesystem (HAMMER's mirror-read and
//! mirror-write): the element changes committed after a TID, as events in
//! TID order (`changes`); chunks as stored; and applying a batch of such
//! changes to a mirror pool at the source's own TIDs, in one transaction
//! (`apply`). A pool's role (source, mirror, promoted mirror) is kept in
//! its metadata (`role`). A mirror left behind its source's prune horizon
//! is rolled back to a snapshot both hold (`rollback`). The stream format
//! and its checks live in the `cairn-mirror` crate, which drives these.

pub mod apply;
pub mod changes;
pub mod holds;
pub mod role;
pub mod rollback;
pub mod sealed;

pub use apply::{Batch, ChunkIn};
pub use changes::{Change, Changes, Event, StoredChunk};
pub use holds::Hold;
pub use role::Role;
pub use rollback::RollbackReport;
