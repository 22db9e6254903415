//! Filesystem layer: POSIX semantics over Cairn's versioned tree. Inodes,
//! directory entries, symlinks, xattrs and file extents are elements in the
//! metadata store; file blocks are chunks in the data layer. Changes are
//! buffered in RAM (the overlay) and committed in flush groups, one TID per
//! commit. Frontends (FUSE, later NBD) call the `Fs` methods.

pub mod asof;
pub mod check;
mod clone;
pub mod config;
pub mod devices;
pub mod error;
pub mod flush;
pub mod gc;
pub mod history;
pub mod info;
mod inodes;
pub mod ops_data;
pub mod ops_ns;
pub mod overlay;
pub mod perms;
pub mod pool;
pub mod prune;
pub mod readdir;
pub mod reblock;
mod recent;
pub mod reserve;
pub mod salvage;
pub mod scrub;
pub mod snapshot;
mod sparse;
pub mod superblock;
pub mod tier;
pub mod timefmt;
pub mod treehash;
pub mod types;
pub mod vfs;

pub use cairn_data::Compression;
pub use config::PoolConfig;
pub use error::{FsError, Result};
pub use history::Version;
pub use ops_data::Statfs;
pub use ops_ns::{RenameFlags, SetAttr, XattrMode};
pub use pool::{mkfs, MkfsOptions, Pool};
pub use prune::{PrunePolicy, PruneReport};
pub use readdir::DirEntry;
pub use reblock::{ReblockOptions, ReblockReport};
pub use scrub::ScrubReport;
pub use snapshot::{Snapshot, SnapshotKind, SnapshotUsage, VerifyReport};
pub use treehash::TreeSum;
pub use types::{FileKind, Inode, Time, ROOT_INO};
pub use vfs::{Ctx, Fs};
