//! The administrator's secret: a passphrase (typed, or the first line of a
//! key file) or 32 raw bytes (a key file of exactly 32 bytes). Held in
//! memory that is wiped when dropped; never printed (`Debug` says only
//! what kind it is).

use crate::error::CryptError;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use zeroize::Zeroizing;

/// The longest passphrase accepted, in bytes.
pub const MAX_PASSPHRASE: usize = 1024;
/// Bytes of a raw key in a key file.
pub const RAW_KEY_LEN: usize = 32;

/// A secret that unlocks a pool's data key.
pub enum Secret {
    /// A passphrase: stretched with Argon2id.
    Passphrase(Zeroizing<Vec<u8>>),
    /// 32 random bytes from a key file: used as they are.
    RawKey(Zeroizing<[u8; RAW_KEY_LEN]>),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Secret::Passphrase(_) => "Secret::Passphrase(..)",
            Secret::RawKey(_) => "Secret::RawKey(..)",
        })
    }
}

impl Secret {
    /// A raw key of 32 bytes (as a key file of exactly 32 bytes gives).
    pub fn raw_key(key: [u8; RAW_KEY_LEN]) -> Secret {
        Secret::RawKey(Zeroizing::new(key))
    }

    /// A passphrase typed by the administrator (without its newline);
    /// refused when empty or longer than `MAX_PASSPHRASE`.
    pub fn passphrase(p: &[u8]) -> Result<Secret, CryptError> {
        let p = p.strip_suffix(b"\n").unwrap_or(p);
        let p = p.strip_suffix(b"\r").unwrap_or(p);
        if p.is_empty() {
            return Err(CryptError::KeyFile {
                path: "passphrase".into(),
                why: "it is empty".into(),
            });
        }
        if p.len() > MAX_PASSPHRASE {
            return Err(CryptError::KeyFile {
                path: "passphrase".into(),
                why: format!("it is longer than {MAX_PASSPHRASE} bytes"),
            });
        }
        Ok(Secret::Passphrase(Zeroizing::new(p.to_vec())))
    }
}

/// The secret in key file `path`: exactly 32 bytes are a raw key, anything
/// else is a passphrase on its first line. Refused: a file other users
/// can read or write (it must be mode 0600 or narrower), one that is not
/// a regular file, empty or longer than a passphrase.
pub fn read_key_file(path: &Path) -> Result<Secret, CryptError> {
    let refuse = |why: String| CryptError::KeyFile {
        path: path.display().to_string(),
        why,
    };
    let mut f = std::fs::File::open(path).map_err(|e| refuse(e.to_string()))?;
    let md = f.metadata().map_err(|e| refuse(e.to_string()))?;
    if !md.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    if md.mode() & 0o077 != 0 {
        return Err(refuse(format!(
            "mode {:o} lets other users read or change it: make it 0600 (chmod 600 {})",
            md.mode() & 0o777,
            path.display()
        )));
    }
    let limit = (MAX_PASSPHRASE + 2) as u64;
    let mut bytes = Zeroizing::new(Vec::new());
    (&mut f)
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| refuse(e.to_string()))?;
    if bytes.len() as u64 > limit {
        return Err(refuse(format!(
            "longer than a passphrase ({MAX_PASSPHRASE} bytes) or a raw key ({RAW_KEY_LEN} bytes)"
        )));
    }
    if bytes.len() == RAW_KEY_LEN {
        let mut raw = Zeroizing::new([0u8; RAW_KEY_LEN]);
        raw.copy_from_slice(&bytes);
        return Ok(Secret::RawKey(raw));
    }
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or(&[]);
    Secret::passphrase(line).map_err(|e| match e {
        CryptError::KeyFile { why, .. } => refuse(format!("its passphrase line: {why}")),
        e => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn key_file(dir: &Path, bytes: &[u8], mode: u32) -> std::path::PathBuf {
        let p = dir.join("key");
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn a_key_file_is_a_raw_key_or_a_passphrase_line() {
        let d = tempfile::tempdir().unwrap();
        let raw = key_file(d.path(), &[7u8; 32], 0o600);
        assert!(matches!(read_key_file(&raw).unwrap(), Secret::RawKey(k) if *k == [7u8; 32]));
        let line = key_file(d.path(), b"correct horse\nignored\n", 0o400);
        assert!(
            matches!(read_key_file(&line).unwrap(), Secret::Passphrase(p) if **p == *b"correct horse")
        );
    }

    #[test]
    fn open_empty_or_oversized_key_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let open = key_file(d.path(), b"pass\n", 0o644);
        let e = read_key_file(&open).unwrap_err().to_string();
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
        let empty = key_file(d.path(), b"\n", 0o600);
        assert!(read_key_file(&empty)
            .unwrap_err()
            .to_string()
            .contains("empty"));
        let long = key_file(d.path(), &[b'a'; 2000], 0o600);
        assert!(read_key_file(&long)
            .unwrap_err()
            .to_string()
            .contains("longer"));
        let e = read_key_file(d.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_secret_never_prints() {
        let s = Secret::passphrase(b"hunter2\n").unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
