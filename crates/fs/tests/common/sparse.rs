//! Reading sparse files (device files of test pools) by their allocated
//! extents, skipping holes: shared by the fs and mirror layer tests.

use std::path::Path;

/// The allocated extents of a (sparse) file: (offset, bytes).
pub fn data_extents(path: &Path) -> Vec<(u64, Vec<u8>)> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as i64;
    let mut out = Vec::new();
    let mut at = 0i64;
    while at < len {
        // SAFETY: plain lseek calls on a file this function owns.
        let start = unsafe { libc::lseek(f.as_raw_fd(), at, libc::SEEK_DATA) };
        if start < 0 {
            break;
        }
        // SAFETY: an fd of a File open here and integer arguments; no pointer is passed.
        let end = unsafe { libc::lseek(f.as_raw_fd(), start, libc::SEEK_HOLE) };
        let mut buf = vec![0u8; (end - start) as usize];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, start as u64).unwrap();
        out.push((start as u64, buf));
        at = end;
    }
    out
}
