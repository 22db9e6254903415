//! The entry of a directory whose name equals a given one when case is
//! ignored: what Samba asks before it creates or opens a name (its
//! `get_real_filename`), which it otherwise answers by listing the whole
//! directory through the kernel, a listing per new file. Here the daemon
//! looks the name up as given first, then compares the folded names of
//! the directory's entries without leaving the process. Folding: Unicode
//! lower case for names in UTF-8 (each character by `char::to_lowercase`),
//! ASCII for other names; Samba's own folding maps a few characters
//! differently (e.g. 'ß'), which only decides whether such a name counts
//! as taken.

use crate::error::{FsError, Result};
use crate::vfs::Fs;

/// Entries read from the directory per step of the scan.
const SCAN_STEP: usize = 1024;

impl Fs {
    /// The name of the entry of `dir` that equals `name` when case is
    /// ignored: `name` itself when it exists as given, else the first
    /// match in listing order, or None when there is none.
    pub fn find_name_nocase(&self, dir: u64, name: &[u8]) -> Result<Option<Vec<u8>>> {
        crate::vfs::check_name(name)?;
        match self.lookup(dir, name) {
            Ok(_) if !crate::volumes::hidden(dir, name) => return Ok(Some(name.to_vec())),
            Ok(_) | Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        let want = fold(name);
        let mut cookie = 2;
        loop {
            let page = self.readdir(dir, cookie, SCAN_STEP)?;
            let Some(last) = page.last() else {
                return Ok(None);
            };
            cookie = last.cookie;
            if let Some(e) = page.iter().find(|e| fold(&e.name) == want) {
                return Ok(Some(e.name.clone()));
            }
            if page.len() < SCAN_STEP {
                return Ok(None);
            }
        }
    }
}

/// `name` with case folded away (see the module's comment).
fn fold(name: &[u8]) -> Vec<u8> {
    match std::str::from_utf8(name) {
        Ok(s) if !s.is_ascii() => s
            .chars()
            .flat_map(char::to_lowercase)
            .collect::<String>()
            .into(),
        _ => name.to_ascii_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::fold;

    #[test]
    fn folding_ignores_case_in_utf8_and_ascii_elsewhere() {
        assert_eq!(fold(b"Doc.TXT"), fold(b"doc.txt"));
        assert_eq!(fold("ÄRGER".as_bytes()), fold("ärger".as_bytes()));
        assert_ne!(fold(b"doc1"), fold(b"doc2"));
        assert_eq!(fold(b"A\xff"), fold(b"a\xff"));
        assert_ne!(fold(b"A\xff"), fold(b"a\xfe"));
    }
}
