//! Filesystem layer: POSIX semantics over Cairn's versioned tree. Inodes,
//! directory entries, symlinks, xattrs and file extents are elements in the
//! metadata store; file blocks are chunks in the data layer. Changes are
//! buffered in RAM (the overlay) and committed in flush groups, one TID per
//! commit. Frontends (FUSE, later NBD) call the `Fs` methods.
//!
//! The folders say where each mechanism lives:
//! - `pool/`: the pool on disk (superblock, config, modes, metadata reserve);
//! - `vfs.rs`: the `Fs` object and the lookups shared by all;
//! - `state.rs`: the write-back state split by inode, and its locking;
//! - `writeback/`: the dirty overlay, flush groups, commits and the intent log;
//! - `ops/`: POSIX operations (namespace, data, readdir, clones, sparse files);
//! - `history/`: versions, `@@` views, snapshots, prune, tree hashes;
//! - `maintenance/`: GC, reblock, scrub, check, salvage, tiering, devices, info;
//! - `redundancy/`: the copies policy, degraded opens, re-replication and
//!   device replacement;
//! - `volumes/`: block volumes (files outside the POSIX namespace) for NBD.

mod background;
pub mod contention;
pub mod error;
pub mod failpoint;
pub mod history;
mod lock_rank;
pub mod maintenance;
pub mod names;
pub mod ops;
pub mod pool;
pub mod redundancy;
pub mod replica;
pub mod service_stats;
mod state;
pub mod timefmt;
pub mod types;
pub mod vfs;
pub mod volumes;
pub mod writeback;

pub use cairn_data::Compression;
pub use error::{FsError, Result};
pub use history::prune::{PrunePolicy, PruneReport};
pub use history::snapshot::{Snapshot, SnapshotKind, SnapshotUsage, VerifyReport};
pub use history::treehash::TreeSum;
pub use history::versions::Version;
pub use maintenance::reblock::{ReblockOptions, ReblockReport};
pub use maintenance::scrub::ScrubReport;
pub use ops::data::Statfs;
pub use ops::ns::{RenameFlags, SetAttr, XattrMode};
pub use ops::readdir::DirEntry;
pub use pool::config::PoolConfig;
pub use pool::{mkfs, mkfs_with, MkfsOptions, Pool};
pub use types::{FileKind, Inode, Time, ROOT_INO};
pub use vfs::{Ctx, Fs};
pub use volumes::{VolumeInfo, VolumeSnapshot};
