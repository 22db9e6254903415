//! POSIX operations on the `Fs`: namespace (ns), file data (data), directory
//! listing (readdir), clones (copy_file_range), sparse files and st_blocks,
//! the references that keep an inode alive (refs: open handles, kernel
//! lookups), lookups by inode number and generations for file handles
//! (handles), the inode counts of statfs, and the case-insensitive lookup
//! Samba asks for (nocase).

pub(crate) mod clone;
pub mod data;
pub(crate) mod handles;
pub(crate) mod inodes;
pub(crate) mod nocase;
pub mod ns;
pub mod readdir;
pub(crate) mod refs;
pub(crate) mod sparse;
