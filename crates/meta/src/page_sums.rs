//! The metadata copies' page checksums kept across a clean close
//! (`meta.sums`, beside `meta.redb`): what lets the next open trust the
//! copies without reading them in full (`Mirror::open_known`). Written
//! after the store closed cleanly (every copy written without an error,
//! none dropped, all synced); emptied by the next open before anything is
//! written, so that after a crash it says nothing and the open compares
//! the copies page by page as before. `decode` is the one reader of the
//! format (docs/format/metadata.md, "Page checksums").

use crate::mirror::PAGE;
use cairn_devices::{OpenHow, Storage};
use std::io;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"CAIRNPGS";
const VERSION: u16 = 1;
/// magic 8 | version u16 | page KiB u16 | copies u32 | len u64 | pages u64.
const HEAD: usize = 32;
/// The longest store the file describes: 2^40 bytes (2^28 pages, 1 GiB of
/// checksums); a longer claim is damage, not a store.
const MAX_LEN: u64 = 1 << 40;

/// What a clean close recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageSums {
    /// Copies the store had, all written and synced.
    pub copies: u32,
    /// The store file's length in bytes (every copy's).
    pub len: u64,
    /// crc32c of each 4 KiB page, the last one zero-padded.
    pub sums: Vec<u32>,
}

/// Why a `meta.sums` file is not used (the open then reads every copy).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SumsError {
    #[error("{0} bytes: too short")]
    Short(usize),
    #[error("not a page checksum file")]
    Magic,
    #[error("version {0} (this release reads 1)")]
    Version(u16),
    #[error("pages of {0} KiB (this release uses 4)")]
    Page(u16),
    #[error("a store of {0} bytes, {1} pages, {2} bytes of file: inconsistent")]
    Shape(u64, u64, usize),
    #[error("checksum mismatch")]
    Checksum,
}

/// The file that holds the checksums of the store at `meta`.
pub fn path_for(meta: &Path) -> PathBuf {
    meta.with_extension("sums")
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "copies are at most 4 and a page count at most 2^28: both fit"
)]
impl PageSums {
    pub fn encode(&self) -> Vec<u8> {
        assert_eq!(
            self.sums.len() as u64,
            self.len.div_ceil(PAGE),
            "sums of {} bytes",
            self.len
        );
        assert!(self.len <= MAX_LEN, "a store of {} bytes", self.len);
        let mut b = Vec::with_capacity(HEAD + 4 * self.sums.len() + 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&((PAGE / 1024) as u16).to_le_bytes());
        b.extend_from_slice(&self.copies.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&(self.sums.len() as u64).to_le_bytes());
        for s in &self.sums {
            b.extend_from_slice(&s.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<PageSums, SumsError> {
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if b.len() < HEAD + 4 {
            return Err(SumsError::Short(b.len()));
        }
        if &b[..8] != MAGIC {
            return Err(SumsError::Magic);
        }
        if u16_at(8) != VERSION {
            return Err(SumsError::Version(u16_at(8)));
        }
        if u64::from(u16_at(10)) * 1024 != PAGE {
            return Err(SumsError::Page(u16_at(10)));
        }
        let (copies, len, pages) = (u32_at(12), u64_at(16), u64_at(24));
        let fits = len <= MAX_LEN && pages == len.div_ceil(PAGE);
        if !fits || (b.len() - HEAD - 4) as u64 != pages * 4 {
            return Err(SumsError::Shape(len, pages, b.len()));
        }
        let end = b.len() - 4;
        if crc32c::crc32c(&b[..end]) != u32_at(end) {
            return Err(SumsError::Checksum);
        }
        let sums = (b[HEAD..end].chunks_exact(4))
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Ok(PageSums { copies, len, sums })
    }
}

/// Reads the checksums a clean close left at `path` and empties the file
/// (synced) before returning them: whatever happens next, a later open
/// cannot trust them again. None when there is no file, it is empty or
/// damaged, or it cannot be emptied (the open then reads every copy).
#[allow(
    clippy::cast_possible_truncation,
    reason = "a file checked against MAX_LEN's checksums (1 GiB) before it is read"
)]
pub fn take(storage: &dyn Storage, path: &Path) -> Option<PageSums> {
    let f = match storage.open(path, &OpenHow::EXISTING) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!("{}: {e}; reading every metadata copy", path.display());
            return None;
        }
    };
    let read = || -> io::Result<Vec<u8>> {
        let n = f.len()?;
        let most = (HEAD as u64) + MAX_LEN.div_ceil(PAGE) * 4 + 4;
        let mut b = vec![0u8; n.min(most) as usize];
        f.read_at(&mut b, 0)?;
        Ok(b)
    };
    let bytes = read();
    if let Err(e) = f.set_len(0).and_then(|_| f.sync_data()) {
        tracing::warn!(
            "{}: cannot empty it ({e}); reading every metadata copy",
            path.display()
        );
        return None;
    }
    let decoded = bytes
        .map_err(|e| e.to_string())
        .and_then(|b| match b.is_empty() {
            true => Ok(None),
            false => PageSums::decode(&b).map(Some).map_err(|e| e.to_string()),
        });
    decoded.unwrap_or_else(|e| {
        tracing::warn!("{}: {e}; reading every metadata copy", path.display());
        None
    })
}

/// Writes `sums` to `path` (replacing what was there) and syncs it.
pub fn save(storage: &dyn Storage, path: &Path, sums: &PageSums) -> io::Result<()> {
    let f = storage.open(path, &OpenHow::REPLACE)?;
    f.write_at(&sums.encode(), 0)?;
    f.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_devices::HostStorage;

    fn sample() -> PageSums {
        PageSums {
            copies: 2,
            len: 3 * PAGE + 100,
            sums: vec![1, 2, 3, 0xdead_beef],
        }
    }

    #[test]
    fn what_is_encoded_decodes_and_any_changed_byte_is_refused() {
        let s = sample();
        let b = s.encode();
        assert_eq!(PageSums::decode(&b), Ok(s));
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert!(
                PageSums::decode(&bad).is_err(),
                "byte {i} changed and still read"
            );
        }
        for n in 0..b.len() {
            assert!(
                PageSums::decode(&b[..n]).is_err(),
                "cut to {n} bytes and still read"
            );
        }
    }

    #[test]
    fn a_claim_larger_than_the_file_is_refused_without_reading_past_it() {
        let mut b = sample().encode();
        b[16..24].copy_from_slice(&(MAX_LEN * 2).to_le_bytes());
        assert!(matches!(PageSums::decode(&b), Err(SumsError::Shape(..))));
        let mut b = sample().encode();
        b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(PageSums::decode(&b), Err(SumsError::Shape(..))));
    }

    #[test]
    fn taking_the_sums_empties_the_file_so_they_are_trusted_once() {
        let d = tempfile::tempdir().unwrap();
        let p = path_for(&d.path().join("meta.redb"));
        assert_eq!(p.file_name().unwrap(), "meta.sums");
        let st = HostStorage;
        assert_eq!(take(&st, &p), None, "no file: nothing");
        save(&st, &p, &sample()).unwrap();
        assert_eq!(take(&st, &p), Some(sample()));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0, "emptied");
        assert_eq!(take(&st, &p), None, "taken once");
        std::fs::write(&p, b"not sums at all, and long enough to be read as such").unwrap();
        assert_eq!(take(&st, &p), None, "damaged: not trusted");
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0, "and emptied");
    }
}
