//! The device backend: positional I/O on one file-like object, behind one
//! trait so that every byte Cairn writes to a pool (data devices, the
//! metadata file, the intent log, the superblock) can go through a real
//! file, an emulated slow device, or the test backends that record a trace
//! for crash simulation and inject faults. A `Storage` says how files are
//! opened; a pool is opened or created with one (the host by default).
//!
//! Implementations: `FileBackend` (regular file or block device, O_DIRECT
//! and preadv), `Emulated` (slow device: latency and bandwidth), `Missing`
//! (a device that could not be opened: every I/O fails), `TraceBackend`
//! (records writes and syncs for `crash` images) and `FaultBackend` (EIO,
//! ENOSPC, hangs, corrupted reads on demand) and `S3Backend` (a device as
//! objects in a bucket: the `s3` tier).

pub mod crash;
pub mod emulated;
pub mod fault;
pub mod file;
pub mod missing;
pub mod plan;
pub mod rng;
pub mod s3;
mod s3_readahead;
pub mod trace;
pub mod window;

pub use crash::{crash_images, read_images, surviving, write_images, CrashMode, Images, Replay};
pub use emulated::Emulated;
pub use fault::{Fault, FaultBackend, FaultControl, FaultStorage, Ops, When};
pub use file::FileBackend;
pub use missing::Missing;
pub use plan::{parse_plan, PlanError, PlanRule, PlanStorage};
pub use s3::{ObjectTier, S3Backend};
pub use trace::{Event, Recorder, TraceBackend, TraceStorage};
pub use window::Window;

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Positional I/O on one file-like object. Reads and writes are exact
/// (all bytes or an error); data is durable only after `sync_data`.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `off` (UnexpectedEof past the end).
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;

    /// Reads consecutive bytes at `off` into the buffers in order.
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], off: u64) -> io::Result<()> {
        let mut at = off;
        for b in bufs.iter_mut() {
            self.read_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }

    /// Writes all of `buf` at `off`, growing the object if needed.
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()>;

    /// Makes every completed write (and length change) durable.
    fn sync_data(&self) -> io::Result<()>;

    /// Writes all of `buf` at `off` and makes those bytes durable before
    /// returning; other writes need not be (a host file: one write with
    /// RWF_DSYNC, which waits for that range alone, not for every dirty
    /// page of a device file). By default a write and `sync_data`.
    fn write_durable_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.write_at(buf, off)?;
        self.sync_data()
    }

    /// The object's size in bytes (a block device's capacity).
    fn len(&self) -> io::Result<u64>;

    /// True when the object holds no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Truncates or extends (with zeros) to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Gives the blocks of a byte range back (they read as zeros), keeping
    /// the size. Best effort: backends that cannot do nothing.
    fn punch_hole(&self, _off: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }

    /// The byte ranges (start, end) that may hold data, in order; every
    /// byte outside them reads as zero without being stored (a hole, or
    /// blocks allocated and never written). None: not known, every byte
    /// may hold data. Asked before reading, since a read can change the
    /// answer (a host file's cached pages count as data).
    fn data_ranges(&self) -> io::Result<Option<Vec<(u64, u64)>>> {
        Ok(None)
    }

    /// Reads into `buf` at `off` past the host's page cache when the
    /// backend can (buffer address, `off` and length multiples of
    /// `DIRECT_ALIGN`). `Ok(false)`: nothing was read, read buffered
    /// instead. A direct read may end early at the end of the object;
    /// `Ok(true)` means at least `need` bytes arrived.
    fn read_direct_at(&self, _buf: &mut [u8], _off: u64, _need: usize) -> io::Result<bool> {
        Ok(false)
    }

    /// Writes all of `buf` at `off` past the host's page cache when the
    /// backend can. `Ok(false)`: nothing needs to have been written, write
    /// buffered instead (`write_at`).
    fn write_direct_at(&self, _buf: &[u8], _off: u64) -> io::Result<bool> {
        Ok(false)
    }

    /// Hint: start writing `len` bytes at `off` back to the disk without
    /// waiting (sync_file_range). Failures show at `sync_data`.
    fn start_writeback(&self, _off: u64, _len: u64) {}

    /// Writes `len` bytes at `off` back to the disk and waits, without a
    /// cache flush: the flush of a later `write_durable_at` of the same
    /// object then makes them durable too (one device flush for both).
    /// A backend whose `write_durable_at` syncs everything does nothing
    /// here (the default).
    fn write_back_wait(&self, _off: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }

    /// Hint: `len` bytes at `off` will likely be read soon; a backend with
    /// slow reads may start fetching them in the background. Never fails
    /// (a failed fetch shows, if at all, at the read).
    fn will_need(&self, _off: u64, _len: u64) {}

    /// Hint: `len` bytes at `off` will not be read again (a chunk that died
    /// or that only history holds); a backend over the host's page cache
    /// drops them from it, so that they do not push out live data. Never
    /// fails, and the bytes stay on the device.
    fn drop_cached(&self, _off: u64, _len: u64) {}

    /// The host file under this backend, for what only a host file has
    /// (flock, fstatvfs, fallocate, block device checks). Wrappers pass
    /// it through; I/O must not bypass the backend through it.
    fn host_file(&self) -> Option<&File> {
        None
    }

    /// The object store under this backend (an `s3` tier device): its
    /// counters, state and slot objects. Wrappers pass it through.
    fn object_tier(&self) -> Option<&dyn ObjectTier> {
        None
    }
}

/// How a file is opened: always for reading and writing; files created
/// get mode 0600 (`private::FILE_MODE`; the umask can only narrow it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenHow {
    /// Create the file when it does not exist.
    pub create: bool,
    /// Cut an existing file to length 0.
    pub truncate: bool,
}

impl OpenHow {
    /// An existing file (or block device).
    pub const EXISTING: OpenHow = OpenHow {
        create: false,
        truncate: false,
    };
    /// Created when missing, kept when present.
    pub const CREATE: OpenHow = OpenHow {
        create: true,
        truncate: false,
    };
    /// Created when missing, emptied when present.
    pub const REPLACE: OpenHow = OpenHow {
        create: true,
        truncate: true,
    };
}

/// How the files of a pool are opened: the host's files, or a test
/// storage that wraps them.
pub trait Storage: Send + Sync + std::fmt::Debug {
    fn open(&self, path: &Path, how: &OpenHow) -> io::Result<Arc<dyn Backend>>;
}

/// The host's files and block devices (`FileBackend`).
#[derive(Debug, Default, Clone, Copy)]
pub struct HostStorage;

impl HostStorage {
    /// The default storage, shared.
    pub fn shared() -> Arc<dyn Storage> {
        Arc::new(HostStorage)
    }
}

impl Storage for HostStorage {
    fn open(&self, path: &Path, how: &OpenHow) -> io::Result<Arc<dyn Backend>> {
        Ok(Arc::new(FileBackend::open(path, how)?))
    }
}

/// Opens a host file as `how` says (read and write, mode 0600 if created).
pub fn open_host(path: &Path, how: &OpenHow) -> io::Result<File> {
    crate::private::private_options()
        .read(true)
        .write(true)
        .create(how.create)
        .truncate(how.truncate)
        .open(path)
}

/// The key a trace or a fault storage files a path under: canonical, so
/// one file spelled two ways is one file.
pub fn path_key(path: &Path) -> std::path::PathBuf {
    crate::device::file_identity(path)
}
