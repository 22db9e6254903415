//! Private files: every file Cairn creates is readable by its owner only
//! (mode 0600) and a pool directory is 0700, so other local users can
//! neither read a pool's data nor hold its lock. Files are created with
//! their final mode (no window where they are wider), and a rewrite
//! tightens a file that was widened.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every file Cairn creates.
pub const FILE_MODE: u32 = 0o600;
/// Mode of a pool directory.
pub const DIR_MODE: u32 = 0o700;

/// Open options that create a file with mode 0600 (the umask can only
/// narrow it).
pub fn private_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Creates or replaces `path` with `bytes`, mode 0600 (an existing file
/// that was wider is tightened).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = private_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    tighten_file(&f)?;
    f.write_all(bytes)
}

/// Makes an open file 0600 if group or others had any access.
pub fn tighten_file(f: &File) -> std::io::Result<()> {
    let mode = f.metadata()?.permissions().mode();
    if mode & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(mode & 0o700))?;
    }
    Ok(())
}

/// Reads a small file Cairn keeps (the pool's config and superblock, a
/// credentials file): refused unless it is a regular file once symlinks
/// are followed (a FIFO, `/dev/zero` or a directory gets a clear error,
/// not a hang), and never more than `limit` bytes are read, so a file
/// that is or becomes endless cannot fill the memory.
pub fn read_small(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    // O_NONBLOCK: opening a FIFO does not wait for a writer.
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let t = f.metadata()?.file_type();
    if !t.is_file() {
        let kind = match () {
            _ if t.is_dir() => "a directory",
            _ if t.is_char_device() => "a character device",
            _ if t.is_block_device() => "a block device",
            _ if t.is_fifo() => "a FIFO",
            _ if t.is_socket() => "a socket",
            _ => "not a file",
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file ({kind})"),
        ));
    }
    let mut buf = Vec::new();
    f.take(limit + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes: not a file Cairn wrote"),
        ));
    }
    Ok(buf)
}

/// True when users other than the owner may read the file (or, for a
/// directory, list or enter it).
pub fn readable_by_others(mode: u32) -> bool {
    mode & 0o077 != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_and_rewritten_private() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        write_private(&p, b"x").unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&p, b"y").unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(readable_by_others(0o640) && !readable_by_others(0o600));
    }

    #[test]
    fn small_files_are_read_with_a_limit_and_a_type_check() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read_small(&p, 10).unwrap(), b"0123456789");
        let e = read_small(&p, 9).unwrap_err().to_string();
        assert!(e.contains("larger than 9 bytes"), "{e}");
        let e = read_small(Path::new("/dev/zero"), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("character device"), "{e}");
        let e = read_small(dir.path(), 1 << 20).unwrap_err().to_string();
        assert!(e.contains("directory"), "{e}");
    }
}
