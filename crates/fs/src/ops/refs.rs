//! What keeps an inode alive after its last link goes: open handles and the
//! kernel's lookup references (FUSE nlookup: every reply that hands the
//! kernel an entry adds one, FORGET takes them back). An inode without
//! links is kept as an orphan while either is held (the orphan table makes
//! that crash-safe: orphans are deleted at the next mount) and deleted
//! when the last of both goes.

use crate::error::Result;
use crate::types::{Inode, ROOT_INO};
use crate::vfs::{Fs, State};
use std::collections::hash_map::Entry;

impl Fs {
    pub fn open_file(&self, ino: u64) -> Result<Inode> {
        let mut st = self.lock();
        let i = self.inode(&st, ino)?;
        *st.open.entry(ino).or_insert(0) += 1;
        Ok(i)
    }

    /// Closes one open of an inode; an unlinked inode goes with its last
    /// close unless the kernel still holds lookups of it.
    pub fn release(&self, ino: u64) {
        let mut st = self.lock();
        if let Some(n) = st.open.get_mut(&ino) {
            if *n > 1 {
                *n -= 1;
                return;
            }
        }
        st.open.remove(&ino);
        if !st.lookups.contains_key(&ino) {
            Self::delete_unlinked(&mut st, ino);
        }
    }

    /// Looks up `name` in `parent` for the kernel: the answer counts one
    /// lookup reference, taken under the same lock as the lookup so that no
    /// rename or unlink can delete the inode in between.
    pub fn lookup_ref(&self, parent: u64, name: &[u8]) -> Result<Inode> {
        let mut st = self.lock();
        let i = self.lookup_locked(&st, parent, name)?;
        Self::count_lookup(&mut st, i.ino);
        Ok(i)
    }

    /// The attributes of `ino` for an entry handed to the kernel (a
    /// readdirplus entry): counts one lookup reference.
    pub fn getattr_ref(&self, ino: u64) -> Result<Inode> {
        let mut st = self.lock();
        let i = self.inode(&st, ino)?;
        Self::count_lookup(&mut st, ino);
        Ok(i)
    }

    /// Counts one lookup reference to `ino`, an inode just created or
    /// linked, whose entry goes to the kernel (the kernel holds the
    /// directory locked meanwhile: the inode cannot have gone).
    pub fn add_lookup_ref(&self, ino: u64) {
        Self::count_lookup(&mut self.lock(), ino);
    }

    /// The kernel dropped `n` lookup references to `ino` (FORGET).
    pub fn forget(&self, ino: u64, n: u64) {
        Self::drop_lookups(&mut self.lock(), ino, n);
    }

    /// Several FORGETs (BATCH_FORGET) under one lock: (inode, count).
    pub fn forget_many(&self, items: &[(u64, u64)]) {
        let mut st = self.lock();
        for &(ino, n) in items {
            Self::drop_lookups(&mut st, ino, n);
        }
    }

    /// Lookup references the kernel holds to `ino`.
    pub fn lookup_refs(&self, ino: u64) -> u64 {
        self.lock().lookups.get(&ino).copied().unwrap_or(0)
    }

    /// Does something still refer to `ino` (open or looked up)?
    pub(crate) fn referenced(st: &State, ino: u64) -> bool {
        st.open.get(&ino).is_some_and(|&n| n > 0) || st.lookups.contains_key(&ino)
    }

    fn count_lookup(st: &mut State, ino: u64) {
        if ino != ROOT_INO {
            *st.lookups.entry(ino).or_insert(0) += 1;
        }
    }

    fn drop_lookups(st: &mut State, ino: u64, n: u64) {
        let Entry::Occupied(mut e) = st.lookups.entry(ino) else {
            return;
        };
        if *e.get() > n {
            *e.get_mut() -= n;
            return;
        }
        e.remove();
        if !st.open.contains_key(&ino) {
            Self::delete_unlinked(st, ino);
        }
    }

    /// Deletes `ino` if it has no links (it was kept for a reference).
    fn delete_unlinked(st: &mut State, ino: u64) {
        if st.unlinked.remove(&ino) {
            st.dirty.delete_inode(ino);
            st.live_delta -= 1;
        }
    }
}
