//! `FileBackend`: a regular file or a block device on the host. Buffered
//! positional I/O on one descriptor, vectored reads with preadv, and a
//! second descriptor opened with O_DIRECT on first use for aligned reads
//! and writes that bypass the host's page cache.

use super::{open_host, Backend, OpenHow};
use crate::device::DIRECT_ALIGN;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Buffers a vectored read passes on the stack; more take one allocation.
const STACK_IOVS: usize = 16;
/// Buffers per preadv call (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;

#[derive(Debug)]
pub struct FileBackend {
    path: PathBuf,
    file: File,
    is_block: bool,
    /// The same file opened with O_DIRECT (on first use; None if the host
    /// filesystem refuses it).
    direct: OnceLock<Option<File>>,
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "only the low bits matter to the alignment test"
)]
fn aligned(ptr: *const u8, off: u64, len: usize) -> bool {
    (ptr as usize | off as usize | len).is_multiple_of(DIRECT_ALIGN)
}

fn iovec(b: &mut [u8]) -> libc::iovec {
    libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: b.len(),
    }
}

impl FileBackend {
    /// Opens `path` as `how` says.
    pub fn open(path: &Path, how: &OpenHow) -> io::Result<Self> {
        let file = open_host(path, how)?;
        Self::from_file(file, path)
    }

    /// Wraps an open file (read and write) found at `path`.
    pub fn from_file(file: File, path: &Path) -> io::Result<Self> {
        let is_block = file.metadata()?.file_type().is_block_device();
        Ok(FileBackend {
            path: path.to_path_buf(),
            file,
            is_block,
            direct: OnceLock::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn direct_file(&self) -> Option<&File> {
        self.direct
            .get_or_init(|| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&self.path)
                    .ok()
            })
            .as_ref()
    }

    /// One preadv of `group` at `at`; false when it read short or failed.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the caller passes at most IOV_MAX (1024) buffers per call"
    )]
    fn preadv(&self, group: &mut [&mut [u8]], at: u64) -> bool {
        debug_assert!(group.len() <= IOV_MAX, "preadv of {} buffers", group.len());
        let want: usize = group.iter().map(|b| b.len()).sum();
        let mut stack = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; STACK_IOVS];
        let heap: Vec<libc::iovec>;
        let iov: &[libc::iovec] = if group.len() <= STACK_IOVS {
            for (v, b) in stack.iter_mut().zip(group.iter_mut()) {
                *v = iovec(b);
            }
            &stack[..group.len()]
        } else {
            heap = group.iter_mut().map(|b| iovec(b)).collect();
            &heap
        };
        // SAFETY: every iovec points into a live, exclusively borrowed
        // buffer of the given length.
        let n = unsafe {
            libc::preadv(
                self.file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as i32,
                at as libc::off_t,
            )
        };
        n >= 0 && n as usize == want
    }
}

impl Backend for FileBackend {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }

    /// One preadv per IOV_MAX buffers; a short read is retried buffer by
    /// buffer (which also names the error).
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], off: u64) -> io::Result<()> {
        let mut at = off;
        for group in bufs.chunks_mut(IOV_MAX) {
            let want: u64 = group.iter().map(|b| b.len() as u64).sum();
            if !self.preadv(group, at) {
                let mut o = at;
                for b in group.iter_mut() {
                    self.file.read_exact_at(b, o)?;
                    o += b.len() as u64;
                }
            }
            at += want;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.file.write_all_at(buf, off)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// pwritev2 with RWF_DSYNC: durable when it returns, as if followed by
    /// an fdatasync of that range only. A kernel without the flag gets a
    /// write and an fdatasync.
    fn write_durable_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let mut done = 0usize;
        while done < buf.len() {
            let iov = libc::iovec {
                iov_base: buf[done..].as_ptr() as *mut libc::c_void,
                iov_len: buf.len() - done,
            };
            let at = (off + done as u64) as libc::off_t;
            // SAFETY: one iovec over the live slice `buf[done..]`.
            let n = unsafe { libc::pwritev2(self.file.as_raw_fd(), &iov, 1, at, libc::RWF_DSYNC) };
            match n {
                n if n > 0 => done += n as usize,
                0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                _ => {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EINTR) => continue,
                        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) if done == 0 => {
                            self.file.write_all_at(buf, off)?;
                            return self.file.sync_data();
                        }
                        _ => return Err(e),
                    }
                }
            }
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        if self.is_block {
            use std::io::{Seek, SeekFrom};
            let mut f = &self.file;
            return f.seek(SeekFrom::End(0));
        }
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    /// `lseek(SEEK_DATA)` and `lseek(SEEK_HOLE)`: the host's file system
    /// says where data lies (ext4 and xfs count blocks allocated but never
    /// written as a hole unless the page cache holds them). Any error, or
    /// an answer out of order, is "not known".
    fn data_ranges(&self) -> io::Result<Option<Vec<(u64, u64)>>> {
        let end = self.file.metadata()?.len();
        let fd = self.file.as_raw_fd();
        let seek = |at: u64, whence: libc::c_int| -> Option<u64> {
            let at = libc::off_t::try_from(at).ok()?;
            // SAFETY: lseek on an fd we own; it moves the offset, which no
            // read or write of this backend uses (all are positioned).
            let rc = unsafe { libc::lseek(fd, at, whence) };
            u64::try_from(rc).ok()
        };
        let (mut ranges, mut at) = (Vec::new(), 0);
        while at < end {
            // No data at or after `at` (ENXIO) ends the list.
            let Some(data) = seek(at, libc::SEEK_DATA) else {
                let no_data = io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
                return Ok(no_data.then_some(ranges));
            };
            let Some(hole) = seek(data, libc::SEEK_HOLE).filter(|&h| h > data && data >= at) else {
                return Ok(None);
            };
            ranges.push((data, hole.min(end)));
            at = hole;
        }
        Ok(Some(ranges))
    }

    fn punch_hole(&self, off: u64, len: u64) -> io::Result<()> {
        // SAFETY: plain fallocate on an fd we own.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn read_direct_at(&self, buf: &mut [u8], off: u64, need: usize) -> io::Result<bool> {
        let ok = aligned(buf.as_ptr(), off, buf.len());
        let Some(direct) = self.direct_file().filter(|_| ok) else {
            return Ok(false);
        };
        assert!(need <= buf.len());
        let mut got = 0;
        while got < need {
            match direct.read_at(&mut buf[got..], off + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && got == 0 => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        if got < need {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(true)
    }

    fn write_direct_at(&self, buf: &[u8], off: u64) -> io::Result<bool> {
        let ok = aligned(buf.as_ptr(), off, buf.len());
        let Some(direct) = self.direct_file().filter(|_| ok) else {
            return Ok(false);
        };
        match direct.write_all_at(buf, off) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            r => r.map(|()| true),
        }
    }

    fn start_writeback(&self, off: u64, len: u64) {
        // SAFETY: plain sync_file_range on an fd we own.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                off as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }

    fn write_back_wait(&self, off: u64, len: u64) -> io::Result<()> {
        let how = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: plain sync_file_range on an fd we own.
        let rc = unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                off as libc::off64_t,
                len as libc::off64_t,
                how,
            )
        };
        match rc {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    fn drop_cached(&self, off: u64, len: u64) {
        // SAFETY: plain posix_fadvise on an fd we own.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                off as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }

    fn host_file(&self) -> Option<&File> {
        Some(&self.file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_and_plain_io() {
        let d = tempfile::tempdir().unwrap();
        let f = FileBackend::open(&d.path().join("f"), &OpenHow::CREATE).unwrap();
        f.write_at(b"hello world", 3).unwrap();
        assert_eq!(f.len().unwrap(), 14);
        let (mut a, mut b) = ([0u8; 5], [0u8; 6]);
        f.read_vectored_at(&mut [&mut a, &mut b], 3).unwrap();
        assert_eq!((&a, &b), (b"hello", b" world"));
        // Many buffers (past the stack array), and a short read that fails.
        let mut bufs: Vec<[u8; 1]> = vec![[0]; 20];
        let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        assert!(f.read_vectored_at(&mut refs, 0).is_err(), "past the end");
        let mut refs: Vec<&mut [u8]> = bufs.iter_mut().take(14).map(|b| &mut b[..]).collect();
        f.read_vectored_at(&mut refs, 0).unwrap();
        assert_eq!(bufs[3..8].concat(), b"hello");
        f.set_len(4).unwrap();
        assert_eq!(f.len().unwrap(), 4);
    }
}
