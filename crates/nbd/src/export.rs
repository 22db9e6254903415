//! What the server serves: the `Export` trait a block volume implements
//! (storage-agnostic: byte offsets, no knowledge of the pool), and
//! `Exports`, the named set a client lists and opens.

use std::io;
use std::sync::Arc;

/// Extent flag of `Export::block_status`: not allocated.
pub const HOLE: u32 = crate::proto::STATE_HOLE;
/// Extent flag of `Export::block_status`: reads as zeroes.
pub const ZERO: u32 = crate::proto::STATE_ZERO;

/// One block device image. Calls arrive concurrently from the worker
/// pool, for one or several connections (the server advertises
/// CAN_MULTI_CONN), always within `0..size()` and, for `read` and
/// `write`, at most 32 MiB at a time.
pub trait Export: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Preferred I/O size (a power of two, 512 to 32 MiB; advertised to
    /// clients, not enforced).
    fn block_size(&self) -> u32;
    /// Write, trim and write_zeroes are then refused with EPERM before
    /// they reach the export.
    fn read_only(&self) -> bool;
    /// Fills `buf` from `off`.
    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at `off`; with `fua`, durable when it returns.
    fn write(&self, off: u64, data: &[u8], fua: bool) -> io::Result<()>;
    /// A barrier over the whole export, not just the calling connection:
    /// every write acknowledged before it was called, on any connection
    /// to any opening of this volume, is durable when it returns. Multi-
    /// connection clients rely on this (CAN_MULTI_CONN).
    fn flush(&self) -> io::Result<()>;
    /// Discards a range; reads of it may return anything until written
    /// (zeroes, in practice, for Cairn and the test export).
    fn trim(&self, off: u64, len: u64) -> io::Result<()>;
    /// Makes a range read as zeroes; `may_trim` allows deallocating it.
    fn write_zeroes(&self, off: u64, len: u64, may_trim: bool, fua: bool) -> io::Result<()>;
    /// A hint to prefetch a range.
    fn cache(&self, _off: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Extents of the `base:allocation` context from `off`, covering at
    /// least one byte and at most `len` (the server trims any excess):
    /// (length, flags of HOLE and ZERO). Lengths must be nonzero.
    fn block_status(&self, off: u64, len: u32) -> io::Result<Vec<(u32, u32)>>;
}

/// The exports a server offers.
pub trait Exports: Send + Sync {
    /// (name, description) of each export, for NBD_OPT_LIST.
    fn list(&self) -> Vec<(String, String)>;
    /// Opens an export by name; what a name means (e.g. "VOL" read-write,
    /// "VOL@SNAP" a read-only snapshot) is the implementer's business.
    fn open(&self, name: &str) -> Option<Arc<dyn Export>>;
    /// The description of an export, for NBD_INFO_DESCRIPTION.
    fn description(&self, name: &str) -> String {
        let list = self.list();
        let found = list.into_iter().find(|(n, _)| n == name);
        found.map(|(_, d)| d).unwrap_or_default()
    }
}

/// A fixed list of exports (tests, and simple setups).
#[derive(Default, Clone)]
pub struct StaticExports {
    entries: Vec<(String, String, Arc<dyn Export>)>,
}

impl StaticExports {
    pub fn new() -> StaticExports {
        StaticExports::default()
    }

    /// Adds an export under `name`.
    pub fn with(mut self, name: &str, description: &str, e: Arc<dyn Export>) -> StaticExports {
        self.entries.push((name.into(), description.into(), e));
        self
    }
}

impl Exports for StaticExports {
    fn list(&self) -> Vec<(String, String)> {
        let e = self.entries.iter();
        e.map(|(n, d, _)| (n.clone(), d.clone())).collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        let e = self.entries.iter().find(|(n, _, _)| n == name);
        e.map(|(_, _, x)| x.clone())
    }
}
