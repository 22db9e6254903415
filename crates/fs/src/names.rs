//! How names sit in metadata keys: a directory entry's subkey (name hash,
//! length, name) and an xattr's (its name). In an encrypted pool the name
//! is sealed (AES-SIV, deterministic so that a lookup computes the key
//! again from the name) and the hash that orders a directory and serves
//! as readdir cookie is keyed, so neither reads nor confirms a name from
//! outside (docs/FORMAT.md, "Encryption"). Everything that builds or reads
//! such a key goes through `Names`.

use crate::error::{FsError, Result};
use crate::types::{
    dirent_subkey, hash63, split_dirent_subkey, split_sealed_dirent_subkey, MAX_NAME,
};
use cairn_crypt::{PoolKeys, NAME_OVERHEAD};
use std::borrow::Cow;
use std::sync::Arc;

/// The names of one pool: plain, or sealed with its keys.
#[derive(Clone, Default)]
pub struct Names(Option<Arc<PoolKeys>>);

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Names(sealed: {})", self.0.is_some())
    }
}

impl Names {
    /// Names of a pool that is not encrypted.
    pub fn plain() -> Names {
        Names(None)
    }

    /// Names of an encrypted pool (None: not encrypted).
    pub fn of(keys: Option<Arc<PoolKeys>>) -> Names {
        Names(keys)
    }

    pub fn is_sealed(&self) -> bool {
        self.0.is_some()
    }

    /// The subkey of entry `name` in directory `dir`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "name.len() <= MAX_NAME = 255 (asserted)"
    )]
    pub fn dirent_subkey(&self, dir: u64, name: &[u8]) -> Vec<u8> {
        let Some(keys) = &self.0 else {
            return dirent_subkey(name);
        };
        assert!(name.len() <= MAX_NAME, "a name of {} bytes", name.len());
        let hash = hash63(&keys.names.hash(&dir.to_le_bytes(), name));
        let mut k = Vec::with_capacity(9 + name.len() + NAME_OVERHEAD);
        k.extend_from_slice(&hash.to_be_bytes());
        k.push(name.len() as u8);
        k.extend_from_slice(&keys.names.seal(&dirent_place(dir, hash), name));
        assert_eq!(k.len(), 9 + name.len() + NAME_OVERHEAD);
        k
    }

    /// (hash, name) of entry subkey `k` of directory `dir`; a damaged one,
    /// or one moved from another directory, is an error.
    pub fn dirent_name<'a>(&self, dir: u64, k: &'a [u8]) -> Result<(u64, Cow<'a, [u8]>)> {
        let Some(keys) = &self.0 else {
            return split_dirent_subkey(k).map(|(h, n)| (h, Cow::Borrowed(n)));
        };
        let (hash, sealed) = split_sealed_dirent_subkey(k)?;
        let name = (keys.names.open(&dirent_place(dir, hash), sealed))
            .map_err(|e| FsError::Io(format!("directory {dir}: an entry's name: {e}")))?;
        Ok((hash, Cow::Owned(name)))
    }

    /// The subkey of xattr `name` of inode `ino`.
    pub fn xattr_subkey<'a>(&self, ino: u64, name: &'a [u8]) -> Cow<'a, [u8]> {
        match &self.0 {
            None => Cow::Borrowed(name),
            Some(keys) => Cow::Owned(keys.names.seal(&xattr_place(ino), name)),
        }
    }

    /// The key of xattr `name` of inode `ino`.
    pub fn xattr_key(&self, ino: u64, name: &[u8]) -> cairn_meta::ElemKey {
        cairn_meta::ElemKey::new(
            ino,
            cairn_meta::RecordType::Xattr,
            &self.xattr_subkey(ino, name),
        )
    }

    /// Whether `key` is the key of xattr `name` (of its inode).
    pub fn is_xattr(&self, key: &cairn_meta::ElemKey, name: &[u8]) -> bool {
        key.rtype() == Some(cairn_meta::RecordType::Xattr)
            && key.sub() == self.xattr_subkey(key.obj(), name).as_ref()
    }

    /// The xattr name that subkey `k` of inode `ino` holds.
    pub fn xattr_name<'a>(&self, ino: u64, k: &'a [u8]) -> Result<Cow<'a, [u8]>> {
        match &self.0 {
            None => Ok(Cow::Borrowed(k)),
            Some(keys) => (keys.names.open(&xattr_place(ino), k))
                .map(Cow::Owned)
                .map_err(|e| FsError::Io(format!("inode {ino}: an xattr's name: {e}"))),
        }
    }
}

/// What a sealed entry name is bound to: its directory and its hash.
fn dirent_place(dir: u64, hash: u64) -> [u8; 17] {
    let mut p = [b'D'; 17];
    p[1..9].copy_from_slice(&dir.to_le_bytes());
    p[9..].copy_from_slice(&hash.to_be_bytes());
    p
}

/// What a sealed xattr name is bound to: its inode.
fn xattr_place(ino: u64) -> [u8; 9] {
    let mut p = [b'X'; 9];
    p[1..].copy_from_slice(&ino.to_le_bytes());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed() -> Names {
        Names::of(Some(Arc::new(PoolKeys::derive(
            &cairn_crypt::DataKey::random(),
            cairn_crypt::Cipher::Xaes256Gcm,
        ))))
    }

    #[test]
    fn plain_names_keep_the_plain_format() {
        let n = Names::plain();
        assert_eq!(n.dirent_subkey(5, b"a.txt"), dirent_subkey(b"a.txt"));
        let k = n.dirent_subkey(5, b"a.txt");
        assert_eq!(n.dirent_name(5, &k).unwrap().1.as_ref(), b"a.txt");
        assert_eq!(n.xattr_subkey(5, b"user.x").as_ref(), b"user.x");
    }

    #[test]
    fn sealed_names_open_only_in_their_place_and_hide_the_name() {
        let n = sealed();
        let k = n.dirent_subkey(5, b"secret-plans.txt");
        assert_eq!(k, n.dirent_subkey(5, b"secret-plans.txt"), "deterministic");
        assert!(!k.windows(6).any(|w| w == b"secret"));
        let (hash, name) = n.dirent_name(5, &k).unwrap();
        assert_eq!(name.as_ref(), b"secret-plans.txt");
        assert_ne!(hash, crate::types::name_hash(b"secret-plans.txt"), "keyed");
        assert!(hash >= 3, "cookies 0..=2 are not names");
        assert!(n.dirent_name(6, &k).is_err(), "moved to another directory");
        assert!(sealed().dirent_name(5, &k).is_err(), "another pool's key");
        let mut other_hash = k.clone();
        other_hash[7] ^= 1;
        assert!(n.dirent_name(5, &other_hash).is_err(), "hash swapped");
        let long = [b'n'; MAX_NAME];
        let k = n.dirent_subkey(1, &long);
        assert_eq!(n.dirent_name(1, &k).unwrap().1.as_ref(), &long[..]);
        let x = n.xattr_subkey(9, b"user.secret");
        assert_eq!(n.xattr_name(9, &x).unwrap().as_ref(), b"user.secret");
        assert!(n.xattr_name(10, &x).is_err());
    }
}
