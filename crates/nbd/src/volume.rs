//! Cairn's volumes as NBD exports: `VOLUME` is served read-write through
//! the `Fs` calls on the volume's inode, `VOLUME@SNAP` read-only as of the
//! snapshot's TID. FLUSH and FUA go to `Fs::fsync`, which makes every
//! change in the pool durable (through the intent log when small), so a
//! flush on one connection covers writes acknowledged on all of them.

use crate::export::{Export, Exports, HOLE, ZERO};
use cairn_fs::ops::data::{FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE, FALLOC_ZERO_RANGE};
use cairn_fs::volumes::split_export;
use cairn_fs::{Fs, FsError};
use std::io;
use std::sync::Arc;

/// Bytes handed to `Fs::write` at a time (NBD writes go up to 32 MiB).
const WRITE_PIECE: usize = 1 << 20;
/// At most this many extents per BLOCK_STATUS reply.
const MAX_EXTENTS: usize = 1024;

fn io_err(e: FsError) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}

/// The volumes of a pool, and their snapshots.
pub struct PoolExports {
    fs: Arc<Fs>,
}

impl PoolExports {
    pub fn new(fs: Arc<Fs>) -> PoolExports {
        PoolExports { fs }
    }
}

impl Exports for PoolExports {
    fn list(&self) -> Vec<(String, String)> {
        let vols = match self.fs.volumes() {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("listing volumes for NBD: {e}");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for v in vols {
            let desc = format!("Cairn volume, {} bytes", v.size);
            out.push((v.name.clone(), desc));
            for s in &v.snapshots {
                let desc = format!("snapshot of {} at TID {:#x} (read-only)", v.name, s.tid);
                out.push((format!("{}@{}", v.name, s.name), desc));
            }
        }
        out
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        let opened = match split_export(name) {
            (vol, None) => self.fs.volume(vol).map(|v| VolumeExport {
                fs: self.fs.clone(),
                ino: v.ino,
                size: v.size,
                block_size: v.block_size,
                at: None,
            }),
            (vol, Some(snap)) => self.fs.volume_at(vol, snap).map(|(v, s)| VolumeExport {
                fs: self.fs.clone(),
                ino: v.ino,
                size: s.size,
                block_size: v.block_size,
                at: Some(s.tid),
            }),
        };
        match opened {
            Ok(e) => Some(Arc::new(e)),
            Err(e) => {
                tracing::info!("NBD export {name:?} not opened: {e}");
                None
            }
        }
    }
}

/// One volume, live (`at` None) or as of a snapshot's TID (read-only).
pub struct VolumeExport {
    fs: Arc<Fs>,
    ino: u64,
    size: u64,
    block_size: u32,
    at: Option<u64>,
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.size
    }

    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn read_only(&self) -> bool {
        self.at.is_some()
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let got = match self.at {
            None => self.fs.read_into(self.ino, off, buf).map_err(io_err)?,
            Some(tid) => {
                let n = u32::try_from(buf.len())
                    .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
                let data = self.fs.asof_read(self.ino, tid, off, n).map_err(io_err)?;
                buf[..data.len()].copy_from_slice(&data);
                data.len()
            }
        };
        // Past the file's end (a shrink raced with the read): zeroes.
        buf[got..].fill(0);
        Ok(())
    }

    fn write(&self, off: u64, data: &[u8], fua: bool) -> io::Result<()> {
        // `check` keeps writes inside the volume: past it one would grow
        // the volume's file.
        debug_assert!(
            off + data.len() as u64 <= self.size,
            "a write past the volume"
        );
        let mut at = off;
        for piece in data.chunks(WRITE_PIECE) {
            self.fs.write(self.ino, at, piece).map_err(io_err)?;
            at += piece.len() as u64;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.fs.fsync(self.ino).map_err(io_err)
    }

    fn trim(&self, off: u64, len: u64) -> io::Result<()> {
        let mode = FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE;
        self.fs.fallocate(self.ino, off, len, mode).map_err(io_err)
    }

    fn write_zeroes(&self, off: u64, len: u64, may_trim: bool, fua: bool) -> io::Result<()> {
        let mode = if may_trim {
            FALLOC_PUNCH_HOLE
        } else {
            FALLOC_ZERO_RANGE
        };
        let r = self
            .fs
            .fallocate(self.ino, off, len, mode | FALLOC_KEEP_SIZE);
        r.map_err(io_err)?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "the distance to the next hole or data within a request, whose length is a u32"
    )]
    fn block_status(&self, off: u64, len: u32) -> io::Result<Vec<(u32, u32)>> {
        let end = off + len as u64;
        if self.at.is_some() {
            // Snapshots: no allocation map as of a TID; all data (always
            // a correct answer).
            return Ok(vec![(len, 0)]);
        }
        let mut out = Vec::new();
        let mut pos = off;
        while pos < end && out.len() < MAX_EXTENTS {
            let data = match self.fs.seek_data_hole(self.ino, pos, true) {
                Ok(d) => d.min(end),
                Err(FsError::NoData) => end,
                Err(e) => return Err(io_err(e)),
            };
            if data > pos {
                out.push(((data - pos) as u32, HOLE | ZERO));
                pos = data;
                continue;
            }
            let hole = match self.fs.seek_data_hole(self.ino, pos, false) {
                Ok(h) => h.min(end),
                Err(FsError::NoData) => end,
                Err(e) => return Err(io_err(e)),
            };
            let hole = hole.max(pos + 1);
            out.push(((hole - pos) as u32, 0));
            pos = hole;
        }
        Ok(out)
    }
}
