//! Metadata layer: HAMMER-style versioned elements in one ordered key space.
//!
//! An element is (object id, record type, key, create_tid) -> (delete_tid,
//! payload). A change never overwrites: it ends the current element (sets
//! its delete_tid) and adds a new one. The key space is kept in two redb
//! tables, one for live elements (delete_tid = infinity) and one for ended
//! ones, so that lookups at the current TID cost the same however much
//! history accumulates; an index by delete_tid lets prune find what ended
//! before a cutoff without scanning. This crate knows nothing about what the
//! payloads mean: the filesystem layer encodes inodes, entries and extents.

pub mod dedup;
pub mod element;
pub mod error;
pub mod key;
pub mod mirror;
pub mod page_sums;
pub mod pagecache;
mod snapshot_seal;
pub mod store;
pub mod tables;

pub use element::Element;
pub use error::MetaError;
pub use key::{ElemKey, RecordType};
pub use mirror::MirrorStats;
pub use pagecache::PageCache;
pub use store::{MetaRead, MetaStore, MetaWrite, RolledBack};

/// delete_tid of an element that is still live.
pub const TID_MAX: u64 = u64::MAX;
