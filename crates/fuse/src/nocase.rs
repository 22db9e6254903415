//! Samba's case-insensitive lookup through an extended attribute. Samba
//! checks every name a client creates or opens against the directory with
//! case ignored; by default it lists the whole directory to do so, which
//! over FUSE costs several requests per new file and grows with the
//! directory. Its `glusterfs_fuse` VFS module (shipped with Samba, made
//! for FUSE mounts) asks the file system instead, with a getxattr on the
//! directory of `glusterfs.get_real_filename:NAME`: the answer is the name
//! as stored, NUL-terminated, or ENODATA when no entry matches (Samba
//! then knows the name is free); EOPNOTSUPP sends Samba back to its own
//! listing, which is what a view (`@@`, `/.snapshots`) answers.

use cairn_fs::{Fs, FsError};

/// The attribute name's prefix; the rest is the name asked for.
const PREFIX: &[u8] = b"glusterfs.get_real_filename:";

/// The name asked for, if `attr` is such a lookup.
pub(crate) fn asked(attr: &[u8]) -> Option<&[u8]> {
    attr.strip_prefix(PREFIX)
}

/// The attribute's value for `name` in the live directory `dir`.
pub(crate) fn answer(fs: &Fs, dir: u64, name: &[u8]) -> Result<Vec<u8>, FsError> {
    match fs.find_name_nocase(dir, name)? {
        Some(mut found) => {
            found.push(0);
            Ok(found)
        }
        None => Err(FsError::NoAttr),
    }
}

#[cfg(test)]
mod tests {
    use super::asked;

    #[test]
    fn only_the_prefix_asks() {
        assert_eq!(
            asked(b"glusterfs.get_real_filename:Doc.txt"),
            Some(&b"Doc.txt"[..])
        );
        assert_eq!(asked(b"glusterfs.get_real_filename:"), Some(&b""[..]));
        assert_eq!(asked(b"user.glusterfs.get_real_filename:x"), None);
        assert_eq!(asked(b"user.comment"), None);
    }
}
