//! Helpers shared by the fs-layer tests: a pool in a test directory
//! (sparse devices: tests share the host) and reopening it, which after a
//! drop without `shutdown` is what a restart after a crash sees.

#![allow(dead_code)]

use cairn_fs::{mkfs, Fs, MkfsOptions, Pool};
use std::path::Path;
use std::sync::Arc;

/// A new pool with default options under `dir`, opened.
pub fn make(dir: &Path) -> Arc<Fs> {
    let o = MkfsOptions {
        sparse: true,
        ..MkfsOptions::default()
    };
    mkfs(&dir.join("pool"), o).unwrap();
    reopen(dir)
}

/// Opens the pool under `dir` again.
pub fn reopen(dir: &Path) -> Arc<Fs> {
    Fs::open(Pool::open(&dir.join("pool"), None).unwrap()).unwrap()
}
pub mod workload;
