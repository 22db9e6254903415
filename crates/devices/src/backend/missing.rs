//! `Missing`: the backend of a device that a pool names but that could not
//! be opened at mount (its file is gone, its disk is dead). Every I/O fails
//! with the reason, so a read of a segment that has a copy elsewhere goes
//! to that copy and one that has none gives an error, never bytes.

use super::Backend;
use std::io;

#[derive(Debug)]
pub struct Missing {
    /// Why the device could not be opened, for every error it gives.
    why: String,
}

impl Missing {
    pub fn new(why: String) -> Self {
        Missing { why }
    }

    fn err(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("device missing: {}", self.why),
        )
    }
}

impl Backend for Missing {
    fn read_at(&self, _buf: &mut [u8], _off: u64) -> io::Result<()> {
        Err(self.err())
    }

    fn write_at(&self, _buf: &[u8], _off: u64) -> io::Result<()> {
        Err(self.err())
    }

    fn sync_data(&self) -> io::Result<()> {
        Err(self.err())
    }

    fn len(&self) -> io::Result<u64> {
        Err(self.err())
    }

    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(self.err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_io_fails_with_the_reason() {
        let m = Missing::new("/x/d1: No such file or directory".into());
        let e = m.read_at(&mut [0u8; 4], 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("/x/d1"), "{e}");
        assert!(m.write_at(&[1], 0).is_err());
        assert!(m.sync_data().is_err());
        assert!(m.len().is_err());
    }
}
