//! `Emulated`: a slow device over any backend. Every read, write and sync
//! waits on the device's `Throttle` (latency plus size over bandwidth, one
//! I/O at a time) before it is passed on. The throttle is shared with the
//! `Device`, which charges the metadata file's I/O to it too.

use super::Backend;
use crate::emulate::Throttle;
use std::fs::File;
use std::io;
use std::sync::Arc;

#[derive(Debug)]
pub struct Emulated {
    inner: Arc<dyn Backend>,
    throttle: Arc<Throttle>,
}

impl Emulated {
    pub fn new(inner: Arc<dyn Backend>, throttle: Arc<Throttle>) -> Self {
        Emulated { inner, throttle }
    }
}

impl Backend for Emulated {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.throttle.io(buf.len());
        self.inner.read_at(buf, off)
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], off: u64) -> io::Result<()> {
        self.throttle.io(bufs.iter().map(|b| b.len()).sum());
        self.inner.read_vectored_at(bufs, off)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.throttle.io(buf.len());
        self.inner.write_at(buf, off)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.throttle.io(0);
        self.inner.sync_data()
    }

    fn write_durable_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.throttle.io(buf.len());
        self.inner.write_durable_at(buf, off)
    }

    fn write_back_wait(&self, off: u64, len: u64) -> io::Result<()> {
        self.inner.write_back_wait(off, len)
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }

    fn punch_hole(&self, off: u64, len: u64) -> io::Result<()> {
        self.inner.punch_hole(off, len)
    }

    /// Charged once the inner backend did it (else the buffered retry is).
    fn read_direct_at(&self, buf: &mut [u8], off: u64, need: usize) -> io::Result<bool> {
        let done = self.inner.read_direct_at(buf, off, need)?;
        if done {
            self.throttle.io(buf.len());
        }
        Ok(done)
    }

    fn write_direct_at(&self, buf: &[u8], off: u64) -> io::Result<bool> {
        let done = self.inner.write_direct_at(buf, off)?;
        if done {
            self.throttle.io(buf.len());
        }
        Ok(done)
    }

    fn start_writeback(&self, off: u64, len: u64) {
        self.inner.start_writeback(off, len)
    }

    fn will_need(&self, off: u64, len: u64) {
        self.inner.will_need(off, len)
    }

    fn drop_cached(&self, off: u64, len: u64) {
        self.inner.drop_cached(off, len)
    }

    fn host_file(&self) -> Option<&File> {
        self.inner.host_file()
    }

    fn object_tier(&self) -> Option<&dyn super::ObjectTier> {
        self.inner.object_tier()
    }
}
