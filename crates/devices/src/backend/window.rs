//! A window of another backend: bytes `[start, start + len)` of it seen as
//! an object of `len` bytes. The intent log's area on a device is one
//! (`fs::writeback::log_file`). I/O past the window's end fails; its
//! length cannot change.

use super::{Backend, ObjectTier};
use std::fs::File;
use std::io;
use std::sync::Arc;

#[derive(Debug)]
pub struct Window {
    inner: Arc<dyn Backend>,
    start: u64,
    len: u64,
}

impl Window {
    pub fn new(inner: Arc<dyn Backend>, start: u64, len: u64) -> Window {
        assert!(start.checked_add(len).is_some(), "a window inside u64");
        Window { inner, start, len }
    }

    /// `off` on the backend below, if `[off, off + n)` lies in the window.
    fn at(&self, off: u64, n: usize) -> io::Result<u64> {
        match off.checked_add(n as u64) {
            Some(end) if end <= self.len => Ok(self.start + off),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{n} bytes at {off} reach past the end of a window of {} bytes",
                    self.len
                ),
            )),
        }
    }
}

impl Backend for Window {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let at = self.at(off, buf.len())?;
        self.inner.read_at(buf, at)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let at = self.at(off, buf.len())?;
        self.inner.write_at(buf, at)
    }

    fn write_durable_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let at = self.at(off, buf.len())?;
        self.inner.write_durable_at(buf, at)
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "a length within a mapped window; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn write_back_wait(&self, off: u64, len: u64) -> io::Result<()> {
        let at = self.at(off, len as usize)?;
        self.inner.write_back_wait(at, len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.len)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        match len == self.len {
            true => Ok(()),
            false => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a device window's length is fixed",
            )),
        }
    }

    fn host_file(&self) -> Option<&File> {
        self.inner.host_file()
    }

    fn object_tier(&self) -> Option<&dyn ObjectTier> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::FileBackend;

    #[test]
    fn a_window_maps_offsets_and_refuses_io_past_its_end() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![0u8; 8192]).unwrap();
        let f: Arc<dyn Backend> =
            Arc::new(FileBackend::open(&p, &crate::OpenHow::EXISTING).unwrap());
        let w = Window::new(f.clone(), 4096, 1024);
        w.write_at(b"abc", 10).unwrap();
        w.write_durable_at(b"de", 1022).unwrap();
        let mut b = [0u8; 3];
        f.read_at(&mut b, 4106).unwrap();
        assert_eq!(&b, b"abc");
        f.read_at(&mut b[..2], 4096 + 1022).unwrap();
        assert_eq!(&b[..2], b"de");
        assert!(w.write_at(b"xyz", 1022).is_err());
        assert!(w.read_at(&mut b, u64::MAX - 1).is_err());
        assert_eq!(w.len().unwrap(), 1024);
        assert!(w.set_len(2048).is_err());
        // Nothing written outside the window.
        let all = std::fs::read(&p).unwrap();
        assert!(all[..4096].iter().all(|x| *x == 0));
        assert!(all[4096 + 1024..].iter().all(|x| *x == 0));
    }
}
