//! One device: a regular file, a file inside a directory, or a block device.
//! Offers positioned reads and writes (large aligned ones may bypass the
//! page cache: `write_direct_at`) and durability (fdatasync), through the
//! device's backend (`backend/`: the host file, or a test backend).

use crate::backend::{Backend, Emulated, HostStorage, OpenHow, Storage};
use crate::class::{DeviceClass, DeviceRole};
use crate::emulate::{parse_duration_us, Emulation, Throttle};
use crate::error::{invariant, io_err, DeviceError, Result};
use crate::header::{DeviceHeader, DATA_OFFSET, HEADER_LEN};
use std::fs::File;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What the user asked for: `CLASS:PATH[:SIZE][:role=tier|cache]
/// [:domain=NAME][:log=SIZE][:latency=DUR][:bw=SIZE]` (latency and bw
/// emulate a slow device; devices of one failure domain never hold two
/// copies of a segment; `log` gives the device an area of SIZE for a copy
/// of the intent log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    pub class: DeviceClass,
    pub path: PathBuf,
    pub size: Option<u64>,
    pub role: DeviceRole,
    pub emulate: Option<Emulation>,
    /// Leave a device file sparse instead of allocating its blocks (the
    /// host may then run out of space under the pool).
    pub sparse: bool,
    /// The failure domain (a disk, an enclosure, a host): copies of a
    /// segment go to devices of different domains. None: its own.
    pub domain: Option<String>,
    /// Bytes of the device kept for a copy of the intent log, before its
    /// segment slots (None: no log area).
    pub log: Option<u64>,
}

impl DeviceSpec {
    /// A tier device of the given class with no options.
    pub fn tier(class: DeviceClass, path: PathBuf, size: Option<u64>) -> Self {
        DeviceSpec {
            class,
            path,
            size,
            role: DeviceRole::Tier,
            emulate: None,
            sparse: false,
            domain: None,
            log: None,
        }
    }
}

/// The spec in the syntax `FromStr` reads (sizes in bytes, latency in us).
impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.class.is_object_store() {
            return write!(f, "{}", self.path.display());
        }
        write!(f, "{}:{}", self.class, self.path.display())?;
        if let Some(s) = self.size {
            write!(f, ":{s}")?;
        }
        write!(f, ":role={}", self.role)?;
        if let Some(e) = self.emulate {
            write!(f, ":latency={}us:bw={}", e.latency_us, e.bytes_per_sec)?;
        }
        if self.sparse {
            write!(f, ":sparse")?;
        }
        if let Some(d) = &self.domain {
            write!(f, ":domain={d}")?;
        }
        if let Some(l) = self.log {
            write!(f, ":log={l}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = DeviceError;
    fn from_str(spec: &str) -> Result<Self> {
        let bad = |why: &str| DeviceError::BadSpec {
            spec: spec.to_string(),
            why: why.to_string(),
        };
        if cairn_objstore::locator::is_locator(spec) {
            return crate::objdev::parse_s3_spec(spec);
        }
        let mut parts = spec.split(':');
        let class = parts.next().unwrap_or_default();
        let path = parts
            .next()
            .ok_or_else(|| bad("expected CLASS:PATH[:SIZE][:key=value]..."))?;
        if path.is_empty() {
            return Err(bad("empty path"));
        }
        let class: DeviceClass = class.parse().map_err(|e: String| bad(&e))?;
        let mut out = DeviceSpec::tier(class, PathBuf::from(path), None);
        let (mut latency, mut bw) = (None, None);
        for (i, part) in parts.enumerate() {
            match part.split_once('=') {
                None if part == "sparse" => out.sparse = true,
                None if i == 0 => {
                    out.size = Some(crate::size::parse_size(part).map_err(|e| bad(&e))?)
                }
                None => return Err(bad(&format!("'{part}': expected key=value"))),
                Some(("role", v)) => out.role = v.parse().map_err(|e: String| bad(&e))?,
                Some(("domain", v)) => out.domain = Some(parse_domain(v).map_err(|e| bad(&e))?),
                Some(("log", v)) => out.log = Some(parse_log_size(v).map_err(|e| bad(&e))?),
                Some(("latency", v)) => latency = Some(parse_duration_us(v).map_err(|e| bad(&e))?),
                Some(("bw", v)) => bw = Some(crate::size::parse_size(v).map_err(|e| bad(&e))?),
                Some((k, _)) => {
                    return Err(bad(&format!(
                        "unknown option '{k}' (use role, domain, log, latency or bw)"
                    )))
                }
            }
        }
        if latency.is_some() || bw.is_some() {
            out.emulate = Some(Emulation {
                latency_us: latency.unwrap_or(0),
                bytes_per_sec: bw.unwrap_or(0),
            });
        }
        Ok(out)
    }
}

/// The smallest and largest log area on a device.
pub const MIN_LOG_AREA: u64 = 8 << 20;
pub const MAX_LOG_AREA: u64 = 4 << 30;

/// A log area's size: whole MiB, 8 MiB to 4 GiB.
fn parse_log_size(v: &str) -> std::result::Result<u64, String> {
    let n = crate::size::parse_size(v)?;
    if !(MIN_LOG_AREA..=MAX_LOG_AREA).contains(&n) || n % (1 << 20) != 0 {
        return Err(format!("log={v}: use whole MiB from 8M to 4G"));
    }
    Ok(n)
}

/// A failure domain's name: 1 to 64 letters, digits, '-', '_' or '.'.
fn parse_domain(v: &str) -> std::result::Result<String, String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    if v.is_empty() || v.len() > 64 || !v.chars().all(ok) {
        return Err(format!(
            "domain '{v}': use 1 to 64 letters, digits, '-', '_' or '.'"
        ));
    }
    Ok(v.to_string())
}

#[derive(Debug)]
pub struct Device {
    pub header: DeviceHeader,
    pub path: PathBuf,
    pub role: DeviceRole,
    /// Where the device's bytes go: the host file (or a test backend),
    /// wrapped in the slow-device emulation when there is one.
    io: Arc<dyn Backend>,
    /// The emulation's throttle, also charged with the metadata file's I/O.
    throttle: Option<Arc<Throttle>>,
    /// Device reads issued so far (one per read call, however large).
    read_ops: std::sync::atomic::AtomicU64,
    /// Reads in flight, for the hung-device watchdog.
    reads: crate::read_watch::ReadWatch,
    /// Bytes those reads asked for.
    read_bytes: std::sync::atomic::AtomicU64,
    /// Bytes written (data area) and failed reads since the device was
    /// opened (relaxed counters for the metrics; failed writes are counted
    /// per device by `DeviceSet::note_write_error`).
    write_bytes: std::sync::atomic::AtomicU64,
    read_errors: std::sync::atomic::AtomicU64,
    /// A regular file whose blocks are not all allocated: freed slots may
    /// be punched out. An allocated file keeps its blocks (the host space
    /// stays reserved for the pool).
    sparse: bool,
}

/// Address, offset and length multiple of this: a direct write is allowed.
pub const DIRECT_ALIGN: usize = 4096;

/// Resolves a spec path: a directory holds the device as a file inside it.
pub fn device_file_path(path: &Path, device_id: u32) -> PathBuf {
    if path.is_dir() {
        path.join(format!("cairn-dev-{device_id}.img"))
    } else {
        path.to_path_buf()
    }
}

/// A path that names the same file however it was spelled: canonical when
/// the file exists, else its canonical directory joined with its name.
pub fn file_identity(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => dir
            .canonicalize()
            .unwrap_or_else(|_| dir.to_path_buf())
            .join(name),
        _ => path.to_path_buf(),
    }
}

/// True if the file starts with a Cairn device header's magic.
pub fn is_cairn_device(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|_| &magic == crate::header::DEVICE_MAGIC)
}

/// (size, bytes unprivileged users may still allocate) of the filesystem
/// holding `dir`.
pub fn host_space(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is a plain C struct of integers, for which all zero
    // bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path, st a valid out pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    let frsize = st.f_frsize as u64;
    (rc == 0).then(|| (st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

fn free_space_of(dir: &Path) -> Option<u64> {
    host_space(dir).map(|(_, free)| free)
}

/// The directory whose filesystem holds `path`.
fn host_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// The size a device made from `spec` as device `id` will have, before
/// it is made: the size asked for, else a block device's own, else 90% of
/// the free space where its file goes (what `create_with` gives it).
pub fn planned_size(spec: &DeviceSpec, id: u32) -> Option<u64> {
    use std::os::unix::fs::FileTypeExt;
    if spec.size.is_some() {
        return spec.size;
    }
    let path = device_file_path(&spec.path, id);
    match std::fs::metadata(&path) {
        Ok(m) if m.file_type().is_block_device() => {
            use std::io::{Seek, SeekFrom};
            std::fs::File::open(&path)
                .and_then(|mut f| f.seek(SeekFrom::End(0)))
                .ok()
        }
        _ => free_space_of(host_dir(&path)).map(|f| f / 10 * 9),
    }
}

/// Smallest device for a segment size: the header area and 4 slots.
pub fn min_device_size(segment_size: u64) -> u64 {
    DATA_OFFSET + 4 * segment_size
}

/// Fewer blocks allocated than the file's size (a host file only).
fn is_sparse(io: &dyn Backend) -> bool {
    use std::os::unix::fs::MetadataExt;
    io.host_file()
        .and_then(|f| f.metadata().ok())
        .is_some_and(|m| m.is_file() && m.blocks() * 512 < m.len())
}

/// Sizes the file to `size` bytes and allocates all its blocks, refusing
/// (before writing anything) when its filesystem lacks the space. A
/// backend without a host file is only sized.
fn allocate(io: &dyn Backend, path: &Path, size: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let Some(file) = io.host_file() else {
        return io.set_len(size).map_err(io_err(path));
    };
    let have = file.metadata().map_or(0, |m| m.blocks() * 512);
    let free = free_space_of(host_dir(path)).unwrap_or(u64::MAX);
    let no_space = || DeviceError::HostNoSpace {
        path: path.to_path_buf(),
        size,
        free,
    };
    if size > have.saturating_add(free) {
        return Err(no_space());
    }
    io.set_len(size).map_err(io_err(path))?;
    // SAFETY: posix_fallocate on an fd we own.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) };
    match rc {
        0 => Ok(()),
        libc::ENOSPC => Err(no_space()),
        e => Err(io_err(path)(std::io::Error::from_raw_os_error(e))),
    }
}

/// Takes a shared flock on an open device: held while a pool has it open
/// (backends without a host file have no lock).
fn lock_shared(io: &dyn Backend, path: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let Some(file) = io.host_file() else {
        return Ok(());
    };
    // SAFETY: flock on an fd we own; released when the file is closed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
        return Err(DeviceError::Locked {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// The backend as I/O goes through it: under the emulation's throttle
/// when the device is emulated.
fn emulated(
    io: Arc<dyn Backend>,
    emulate: Option<Emulation>,
) -> (Arc<dyn Backend>, Option<Arc<Throttle>>) {
    match emulate {
        None => (io, None),
        Some(e) => {
            let t = Arc::new(Throttle::new(e));
            (Arc::new(Emulated::new(io, t.clone())), Some(t))
        }
    }
}

/// What a device path holds before it is formatted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Occupant {
    /// Missing, empty, or zeros in its first MiB.
    Empty,
    /// A Cairn device header (of the pool with this UUID).
    Cairn { pool_uuid: [u8; 16], device_id: u32 },
    /// Other non-zero bytes in its first MiB.
    Data,
}

/// Looks at the first MiB of a device path.
#[allow(clippy::cast_possible_truncation, reason = "DATA_OFFSET is 1 MiB")]
pub fn occupant(path: &Path) -> Result<Occupant> {
    use std::io::Read;
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Occupant::Empty),
        Err(e) => return Err(io_err(path)(e)),
    };
    let mut buf = Vec::with_capacity(DATA_OFFSET as usize);
    f.take(DATA_OFFSET)
        .read_to_end(&mut buf)
        .map_err(io_err(path))?;
    if let Ok(h) = DeviceHeader::decode(&buf, path) {
        return Ok(Occupant::Cairn {
            pool_uuid: h.pool_uuid,
            device_id: h.device_id,
        });
    }
    Ok(if buf.iter().all(|&b| b == 0) {
        Occupant::Empty
    } else {
        Occupant::Data
    })
}

/// True when some process has the device open in a pool (it holds the
/// device's shared flock). A missing path is not in use.
pub fn in_use(path: &Path) -> Result<bool> {
    use std::os::fd::AsRawFd;
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(path)(e)),
    };
    // SAFETY: flock on an fd we own; released when `f` is dropped.
    Ok(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0)
}

/// What a path names, however it is spelled (symlinks, `..`): the inode
/// of an existing file, the device number of a block device, else the
/// path made absolute through its canonical directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FileId {
    Inode(u64, u64),
    Block(u64),
    Missing(PathBuf),
}

pub fn file_id(path: &Path) -> FileId {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => FileId::Block(m.rdev()),
        Ok(m) => FileId::Inode(m.dev(), m.ino()),
        Err(_) => FileId::Missing(file_identity(&follow_dangling(path))),
    }
}

/// Where a (possibly dangling) chain of symlinks ends.
fn follow_dangling(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::read_link(&p) {
            Ok(t) => p = p.parent().unwrap_or(Path::new("/")).join(t),
            Err(_) => break,
        }
    }
    p
}

impl Device {
    /// Creates (formats) a device on the host (`create_with`).
    pub fn create(
        spec: &DeviceSpec,
        device_id: u32,
        pool_uuid: [u8; 16],
        segment_size: u64,
    ) -> Result<Device> {
        Self::create_with(spec, device_id, pool_uuid, segment_size, &HostStorage)
    }

    /// Creates (formats) a device, opening its file through `storage`. A
    /// regular file is created (mode 0600) with the given size, or 90% of
    /// the free space of its filesystem by default, and its blocks are
    /// allocated unless the spec says sparse.
    pub fn create_with(
        spec: &DeviceSpec,
        device_id: u32,
        pool_uuid: [u8; 16],
        segment_size: u64,
        storage: &dyn Storage,
    ) -> Result<Device> {
        if spec.class.is_object_store() {
            return Err(DeviceError::BadSpec {
                spec: spec.to_string(),
                why: "an s3 device is created with its object-store options".into(),
            });
        }
        let path = device_file_path(&spec.path, device_id);
        let is_block = std::fs::metadata(&path)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        let how = if is_block {
            OpenHow::EXISTING
        } else {
            OpenHow::CREATE
        };
        let io = storage.open(&path, &how).map_err(io_err(&path))?;
        lock_shared(&*io, &path)?;
        let log_len = spec.log.unwrap_or(0);
        let data_offset = DATA_OFFSET + log_len;
        let min = min_device_size(segment_size) + log_len;
        let size = if is_block {
            let real = io.len().map_err(io_err(&path))?;
            spec.size.map_or(real, |s| s.min(real))
        } else {
            let size = spec
                .size
                .unwrap_or_else(|| free_space_of(host_dir(&path)).unwrap_or(0) / 10 * 9);
            if size < min {
                return Err(DeviceError::TooSmall { path, size, min });
            }
            if spec.sparse {
                io.set_len(size).map_err(io_err(&path))?;
            } else {
                allocate(&*io, &path, size)?;
            }
            size
        };
        let size = data_offset + (size.saturating_sub(data_offset) / segment_size) * segment_size;
        if size < min {
            return Err(DeviceError::TooSmall { path, size, min });
        }
        let header = DeviceHeader {
            device_id,
            pool_uuid,
            class: spec.class,
            size,
            segment_size,
            data_offset,
            log_offset: if log_len > 0 { DATA_OFFSET } else { 0 },
            log_len,
        };
        // What is written is what `open` accepts: whole slots, aligned.
        assert_eq!(header.check_geometry(), Ok(()), "{}", path.display());
        assert!(
            (size - data_offset).is_multiple_of(segment_size)
                && data_offset.is_multiple_of(DIRECT_ALIGN as u64),
            "{}: slots of {segment_size} from {data_offset} to {size}",
            path.display()
        );
        io.write_at(&header.encode(), 0).map_err(io_err(&path))?;
        io.sync_data().map_err(io_err(&path))?;
        let sparse = !is_block && is_sparse(&*io);
        let (io, throttle) = emulated(io, spec.emulate);
        Ok(Device {
            header,
            path,
            role: spec.role,
            io,
            throttle,
            read_ops: Default::default(),
            reads: Default::default(),
            read_bytes: Default::default(),
            write_bytes: Default::default(),
            read_errors: Default::default(),
            sparse,
        })
    }

    /// Opens an existing device on the host (`open_with`).
    pub fn open(
        path: &Path,
        pool_uuid: [u8; 16],
        role: DeviceRole,
        emulate: Option<Emulation>,
    ) -> Result<Device> {
        Self::open_with(path, pool_uuid, role, emulate, &HostStorage)
    }

    /// Opens an existing device through `storage` and checks that it
    /// belongs to the pool and is as large as its header says. Role and
    /// emulation come from the pool's device record. The device stays
    /// flock'ed (shared) while open, so `mkfs` can tell it is in use.
    pub fn open_with(
        path: &Path,
        pool_uuid: [u8; 16],
        role: DeviceRole,
        emulate: Option<Emulation>,
        storage: &dyn Storage,
    ) -> Result<Device> {
        let io = storage
            .open(path, &OpenHow::EXISTING)
            .map_err(io_err(path))?;
        lock_shared(&*io, path)?;
        let mut buf = vec![0u8; HEADER_LEN];
        io.read_at(&mut buf, 0).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => DeviceError::NotADevice {
                path: path.to_path_buf(),
            },
            _ => io_err(path)(e),
        })?;
        let header = DeviceHeader::decode(&buf, path)?;
        if header.pool_uuid != pool_uuid {
            return Err(DeviceError::WrongPool {
                path: path.to_path_buf(),
            });
        }
        let actual = io.len().map_err(io_err(path))?;
        if actual < header.size {
            return Err(DeviceError::Truncated {
                path: path.to_path_buf(),
                expected: header.size,
                actual,
            });
        }
        let sparse = is_sparse(&*io);
        let (io, throttle) = emulated(io, emulate);
        Ok(Device {
            header,
            path: path.to_path_buf(),
            role,
            io,
            throttle,
            read_ops: Default::default(),
            reads: Default::default(),
            read_bytes: Default::default(),
            write_bytes: Default::default(),
            read_errors: Default::default(),
            sparse,
        })
    }

    /// A device over a backend that is already open and checked (the
    /// object-store devices of `objdev.rs`).
    pub(crate) fn from_parts(
        header: DeviceHeader,
        path: PathBuf,
        role: DeviceRole,
        io: Arc<dyn Backend>,
    ) -> Device {
        Device {
            header,
            path,
            role,
            io,
            throttle: None,
            read_ops: Default::default(),
            reads: Default::default(),
            read_bytes: Default::default(),
            write_bytes: Default::default(),
            read_errors: Default::default(),
            sparse: false,
        }
    }

    /// A device the pool names but that could not be opened (`why`): its
    /// header as the pool knows it (`slots` slots of `segment_size`), and
    /// a backend on which every I/O fails (`backend::Missing`).
    pub fn missing(
        id: u32,
        class: DeviceClass,
        role: DeviceRole,
        path: PathBuf,
        geometry: (u64, u64),
        why: String,
    ) -> Device {
        let (segment_size, slots) = geometry;
        assert!(
            segment_size > 0,
            "a missing device needs the pool's segment size"
        );
        let header = DeviceHeader {
            device_id: id,
            pool_uuid: [0; 16],
            class,
            size: DATA_OFFSET + slots * segment_size,
            segment_size,
            data_offset: DATA_OFFSET,
            log_offset: 0,
            log_len: 0,
        };
        // Slot offsets are computed from it as from any header read.
        assert_eq!(header.check_geometry(), Ok(()), "{}", path.display());
        let io: Arc<dyn Backend> = Arc::new(crate::backend::Missing::new(why));
        Device::from_parts(header, path, role, io)
    }

    /// The device's intent log area as an object of its own, if it has
    /// one (`DeviceSpec::log`).
    pub fn log_area(&self) -> Option<Arc<dyn Backend>> {
        let h = &self.header;
        // The log area lies between the header and slot 0: a record
        // written there never lands on a segment.
        assert!(
            h.log_len == 0
                || (h.log_offset >= HEADER_LEN as u64
                    && h.log_offset.checked_add(h.log_len) <= Some(h.data_offset)),
            "{}: log area {}+{} over the header or the slots",
            self.path.display(),
            h.log_offset,
            h.log_len
        );
        (h.log_len > 0).then(|| {
            let w = crate::backend::Window::new(self.io.clone(), h.log_offset, h.log_len);
            Arc::new(w) as Arc<dyn Backend>
        })
    }

    /// The object store under this device (an `s3` tier), if any.
    pub fn object_tier(&self) -> Option<&dyn crate::backend::ObjectTier> {
        self.io.object_tier()
    }

    /// False for an object-store device whose store does not answer (no
    /// segment is moved to it meanwhile); true for every other device.
    pub fn is_available(&self) -> bool {
        self.object_tier().is_none_or(|o| o.reachable())
    }

    /// The backend the device's I/O goes through.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.io
    }

    /// A regular device file whose blocks are not all allocated.
    pub fn is_sparse(&self) -> bool {
        self.sparse
    }

    /// (host filesystem id, bytes its unprivileged users may still
    /// allocate) for the filesystem holding this device's file.
    pub fn host_free(&self) -> Option<(u64, u64)> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let file = self.io.host_file()?;
        let dev = file.metadata().ok()?.dev();
        // SAFETY: statvfs is a plain C struct of integers, for which all
        // zero bytes are a valid value.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: fstatvfs on an fd we own into a valid out pointer.
        let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) };
        (rc == 0).then(|| (dev, st.f_bavail as u64 * st.f_frsize as u64))
    }

    pub fn id(&self) -> u32 {
        self.header.device_id
    }

    /// The slow-device emulation this device runs with, if any.
    pub fn emulation(&self) -> Option<Emulation> {
        self.throttle.as_ref().map(|t| t.emulation)
    }

    /// Charges an I/O of `bytes` done on this device's file system outside
    /// this handle (the metadata store beside it) to its emulation, if any.
    pub fn charge_emulated(&self, bytes: usize) {
        if let Some(t) = &self.throttle {
            t.io(bytes);
        }
    }

    /// Device reads issued since the device was opened.
    /// (reads in flight now, reads finished so far).
    pub fn read_watch(&self) -> (u64, u64) {
        self.reads.state()
    }

    pub fn read_ops(&self) -> u64 {
        self.read_ops.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes read from the device since it was opened.
    pub fn read_bytes(&self) -> u64 {
        self.read_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes written to the device since it was opened.
    pub fn write_bytes(&self) -> u64 {
        self.write_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Failed reads of the device since it was opened.
    pub fn read_errors(&self) -> u64 {
        self.read_errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn read_error(&self, e: std::io::Error) -> DeviceError {
        self.read_errors
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.io_error(e)
    }

    /// An I/O error of this device: for an object store, what the store
    /// did (timed out, refused, unreachable, with its endpoint: the
    /// client's message), else the host's error.
    fn io_error(&self, e: std::io::Error) -> DeviceError {
        match self.object_tier() {
            Some(_) => DeviceError::ObjectStore {
                path: self.path.clone(),
                why: e.to_string(),
            },
            None => io_err(&self.path)(e),
        }
    }

    fn wrote(&self, bytes: usize) {
        self.write_bytes
            .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
    }

    fn read_op(&self, bytes: usize) {
        self.read_ops
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.read_bytes
            .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn class(&self) -> DeviceClass {
        self.header.class
    }

    /// Byte offset on the device of a segment slot.
    pub fn slot_offset(&self, slot: u64) -> u64 {
        assert!(
            slot < self.header.slot_count(),
            "slot {slot} beyond device end"
        );
        self.header.data_offset + slot * self.header.segment_size
    }

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check_in_data_area("read", offset, buf.len())?;
        let _watch = self.reads.start();
        self.read_op(buf.len());
        self.io.read_at(buf, offset).map_err(|e| self.read_error(e))
    }

    /// Reads `head` then `body` from consecutive bytes at `offset` with one
    /// system call (two on a short read), so data lands where the caller
    /// wants it without a copy.
    pub fn read_split_at(&self, head: &mut [u8], body: &mut [u8], offset: u64) -> Result<()> {
        self.check_in_data_area("read", offset, head.len() + body.len())?;
        let _watch = self.reads.start();
        self.read_op(head.len() + body.len());
        self.io
            .read_vectored_at(&mut [head, body], offset)
            .map_err(|e| self.read_error(e))
    }

    /// Reads consecutive bytes at `offset` into the buffers in order, with
    /// one system call per IOV_MAX buffers (a short read is retried
    /// buffer by buffer).
    pub fn read_iov_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        self.check_in_data_area("read", offset, bufs.iter().map(|b| b.len()).sum())?;
        let _watch = self.reads.start();
        self.read_op(bufs.iter().map(|b| b.len()).sum());
        self.io
            .read_vectored_at(bufs, offset)
            .map_err(|e| self.read_error(e))
    }

    /// Reads into `buf` at `offset` past the page cache (O_DIRECT) when the
    /// buffer's address, `offset` and length are multiples of DIRECT_ALIGN
    /// and the host filesystem allows it: the device's bytes land in `buf`
    /// without a page-cache copy, and do not fill the host's page cache with
    /// a second copy of what the FUSE page cache already holds. Returns
    /// false, having read nothing, when direct I/O is not possible (the
    /// caller reads buffered). A read may end early at the end of the file;
    /// `Ok(true)` means at least `need` bytes arrived.
    pub fn read_direct_at(&self, buf: &mut [u8], offset: u64, need: usize) -> Result<bool> {
        // The buffer may reach past the end (a read ends there): `need`
        // bytes must lie inside.
        self.check_in_data_area("read", offset, need)?;
        let _watch = self.reads.start();
        let r = self.io.read_direct_at(buf, offset, need);
        if !matches!(r, Ok(false)) {
            self.read_op(buf.len());
        }
        r.map_err(|e| self.read_error(e))
    }

    /// Refuses (and logs) an I/O of `len` bytes at `offset` that is not
    /// inside the data area: a bug computed it, and a write there would
    /// overwrite the header, the intent log area or another device's
    /// bytes past the end.
    fn check_in_data_area(&self, what: &str, offset: u64, len: usize) -> Result<()> {
        let h = &self.header;
        let end = offset.checked_add(len as u64);
        invariant!(
            &self.path,
            offset >= h.data_offset && end.is_some_and(|e| e <= h.size),
            "a {what} of {len} bytes at offset {offset}, outside the data area {}..{}",
            h.data_offset,
            h.size
        );
        Ok(())
    }

    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_in_data_area("write", offset, buf.len())?;
        self.io
            .write_at(buf, offset)
            .map_err(|e| self.write_error(e))?;
        self.wrote(buf.len());
        Ok(())
    }

    /// Writes like `write_at`, but past the page cache (O_DIRECT) when the
    /// buffer's address, `offset` and length are multiples of DIRECT_ALIGN
    /// and the host filesystem allows it: the bytes are not copied into the
    /// page cache, which costs more CPU than the rest of a flush. Durable
    /// only after `sync`, like any write. Falls back to `write_at`.
    pub fn write_direct_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_in_data_area("write", offset, buf.len())?;
        match self.io.write_direct_at(buf, offset) {
            Ok(true) => {
                self.wrote(buf.len());
                Ok(())
            }
            Ok(false) => self.write_at(buf, offset),
            Err(e) => Err(self.write_error(e)),
        }
    }

    fn write_error(&self, e: std::io::Error) -> DeviceError {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            DeviceError::NoSpace
        } else {
            self.io_error(e)
        }
    }

    /// Starts writing `len` bytes at `offset` to the disk without waiting
    /// (sync_file_range WRITE), so that the disk works while the caller
    /// prepares the next buffer and the final `sync` finds most of it done.
    /// Best effort: a failure here shows up at `sync`.
    pub fn start_writeback(&self, offset: u64, len: u64) {
        self.io.start_writeback(offset, len);
    }

    /// Hint that `len` bytes at `offset` will likely be read soon (see
    /// `Backend::will_need`).
    pub fn will_need(&self, offset: u64, len: u64) {
        self.io.will_need(offset, len);
    }

    /// Hint that `len` bytes at `offset` will not be read again (see
    /// `Backend::drop_cached`).
    pub fn drop_cached(&self, offset: u64, len: u64) {
        self.io.drop_cached(offset, len);
    }

    pub fn sync(&self) -> Result<()> {
        self.io.sync_data().map_err(io_err(&self.path))
    }

    /// Gives a freed slot's blocks back to the host filesystem (best
    /// effort), unless the device file was allocated: its blocks stay
    /// reserved so that the host cannot run out of space under the pool.
    pub fn discard_slot(&self, slot: u64) {
        let host_file = self.io.host_file().and_then(|f| f.metadata().ok());
        if !self.sparse && host_file.is_some_and(|m| m.is_file()) {
            return;
        }
        let off = self.slot_offset(slot);
        let _ = self.io.punch_hole(off, self.header.segment_size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_spec() {
        let s: DeviceSpec = "ssd:/tmp/x:64M".parse().unwrap();
        assert_eq!(s.class, DeviceClass::Ssd);
        assert_eq!(s.path, PathBuf::from("/tmp/x"));
        assert_eq!(s.size, Some(64 << 20));
        assert!("tape:/x".parse::<DeviceSpec>().is_err());
        assert!("ssd".parse::<DeviceSpec>().is_err());
        assert!("ssd:/x:12Q".parse::<DeviceSpec>().is_err());
        let s: DeviceSpec = "hdd:/d:1G:latency=8ms:bw=100M".parse().unwrap();
        assert_eq!((s.size, s.role), (Some(1 << 30), DeviceRole::Tier));
        assert_eq!(
            s.emulate,
            Some(Emulation {
                latency_us: 8000,
                bytes_per_sec: 100 << 20
            })
        );
        let s: DeviceSpec = "ssd:/c:role=cache".parse().unwrap();
        assert_eq!((s.size, s.role, s.emulate), (None, DeviceRole::Cache, None));
        assert!("ssd:/x:1G:colour=red".parse::<DeviceSpec>().is_err());
        for text in [
            "hdd:/d:1G:latency=8ms:bw=100M",
            "ssd:/c:role=cache",
            "nvme:/n",
        ] {
            let s: DeviceSpec = text.parse().unwrap();
            assert_eq!(s.to_string().parse::<DeviceSpec>().unwrap(), s);
        }
        assert!("ssd:/x:1G:2G".parse::<DeviceSpec>().is_err());
    }

    /// `:log=SIZE`: whole MiB from 8M to 4G, kept through a round trip;
    /// the device gets the area before its slots, in a version 2 header.
    #[test]
    fn a_log_area_is_asked_for_checked_and_made() {
        let s: DeviceSpec = "ssd:/x:1G:log=64M".parse().unwrap();
        assert_eq!(s.log, Some(64 << 20));
        assert_eq!(s.to_string().parse::<DeviceSpec>().unwrap(), s);
        for bad in ["log=4M", "log=8G", "log=9000K", "log=x"] {
            let text = format!("ssd:/x:1G:{bad}");
            assert!(text.parse::<DeviceSpec>().is_err(), "{text}");
        }
        let dir = tempfile::tempdir().unwrap();
        let mut spec = DeviceSpec::tier(DeviceClass::Ssd, dir.path().join("d"), Some(64 << 20));
        spec.log = Some(8 << 20);
        let d = Device::create(&spec, 0, [1; 16], 1 << 20).unwrap();
        assert_eq!(
            (d.header.log_offset, d.header.log_len),
            (DATA_OFFSET, 8 << 20)
        );
        assert_eq!(d.header.data_offset, DATA_OFFSET + (8 << 20));
        assert_eq!(d.log_area().unwrap().len().unwrap(), 8 << 20);
        let again = Device::open(&d.path, [1; 16], DeviceRole::Tier, None).unwrap();
        assert_eq!(again.header, d.header);
    }

    #[test]
    fn file_id_sees_through_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let (f, l) = (dir.path().join("f"), dir.path().join("l"));
        std::os::unix::fs::symlink("f", &l).unwrap();
        assert_eq!(file_id(&f), file_id(&l), "dangling link");
        std::fs::write(&f, b"x").unwrap();
        assert_eq!(file_id(&f), file_id(&l));
        assert_ne!(file_id(&f), file_id(&dir.path().join("g")));
    }

    #[test]
    fn create_open_io() {
        let dir = tempfile::tempdir().unwrap();
        let spec = DeviceSpec::tier(DeviceClass::Nvme, dir.path().to_path_buf(), Some(32 << 20));
        let d = Device::create(&spec, 0, [1; 16], 1 << 20).unwrap();
        assert_eq!(d.header.slot_count(), 31);
        let off = d.slot_offset(2);
        d.write_at(b"hello", off).unwrap();
        d.sync().unwrap();
        let d2 = Device::open(&d.path, [1; 16], DeviceRole::Tier, None).unwrap();
        let mut b = [0u8; 5];
        d2.read_at(&mut b, off).unwrap();
        assert_eq!(&b, b"hello");
        assert!(matches!(
            Device::open(&d.path, [2; 16], DeviceRole::Tier, None),
            Err(DeviceError::WrongPool { .. })
        ));
    }

    /// An I/O outside the data area (over the header, or past the end)
    /// is refused as a violated invariant, and the header stays intact.
    #[test]
    fn io_outside_the_data_area_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let spec = DeviceSpec::tier(DeviceClass::Ssd, dir.path().to_path_buf(), Some(16 << 20));
        let d = Device::create(&spec, 0, [1; 16], 1 << 20).unwrap();
        let (start, end) = (d.header.data_offset, d.header.size);
        let junk = [0xabu8; 4096];
        for (off, len) in [
            (0, 4096),
            (start - 1, 2),
            (end - 100, 4096),
            (u64::MAX - 10, 4096),
        ] {
            let e = d.write_at(&junk[..len], off).unwrap_err();
            assert!(e.is_invariant(), "write at {off}: {e}");
            assert!(d
                .write_direct_at(&junk[..len], off)
                .unwrap_err()
                .is_invariant());
            let mut b = vec![0u8; len];
            assert!(
                d.read_at(&mut b, off).unwrap_err().is_invariant(),
                "read at {off}"
            );
            assert!(e.to_string().contains("INVARIANT VIOLATED"), "{e}");
        }
        d.write_at(&junk, start).unwrap();
        d.write_at(&junk[..100], end - 100).unwrap();
        d.sync().unwrap();
        assert!(
            Device::open(&d.path, [1; 16], DeviceRole::Tier, None).is_ok(),
            "header intact"
        );
    }

    #[test]
    fn emulated_device_io_waits_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = DeviceSpec::tier(DeviceClass::Hdd, dir.path().join("d"), Some(8 << 20));
        spec.emulate = Some(Emulation {
            latency_us: 20_000,
            bytes_per_sec: 0,
        });
        let d = Device::create(&spec, 0, [1; 16], 1 << 20).unwrap();
        assert_eq!(d.emulation(), spec.emulate);
        let off = d.slot_offset(0);
        let t = std::time::Instant::now();
        d.write_at(b"slow", off).unwrap();
        d.sync().unwrap();
        let mut b = [0u8; 4];
        let (head, body) = b.split_at_mut(1);
        d.read_split_at(head, body, off).unwrap();
        assert_eq!(&b, b"slow");
        assert!(t.elapsed() >= std::time::Duration::from_millis(60));
        assert_eq!((d.read_ops(), d.read_bytes()), (1, 4));
    }
}
