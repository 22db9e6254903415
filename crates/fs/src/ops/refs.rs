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
        let mut st = self.lock_inos(&[ino]);
        let i = self.inode(&st, ino)?;
        *st.sh_mut(ino).open.entry(ino).or_insert(0) += 1;
        Ok(i)
    }

    /// Closes one open of an inode; an unlinked inode goes with its last
    /// close unless the kernel still holds lookups of it.
    pub fn release(&self, ino: u64) {
        let mut st = self.lock_inos(&[ino]);
        let sh = st.sh_mut(ino);
        if let Some(n) = sh.open.get_mut(&ino) {
            if *n > 1 {
                *n -= 1;
                return;
            }
        }
        sh.open.remove(&ino);
        if !sh.lookups.contains_key(&ino) {
            self.delete_unlinked(&mut st, ino);
        }
    }

    /// Looks up `name` in `parent` for the kernel: the answer counts one
    /// lookup reference, taken under the same lock as the lookup so that no
    /// rename or unlink can delete the inode in between.
    pub fn lookup_ref(&self, parent: u64, name: &[u8]) -> Result<Inode> {
        self.with_inos(&[parent], |st| {
            let i = self.lookup_locked(st, parent, name)?;
            Self::count_lookup(st, i.ino);
            Ok(i)
        })
    }

    /// The attributes of `ino` for an entry handed to the kernel (a
    /// readdirplus entry): counts one lookup reference.
    pub fn getattr_ref(&self, ino: u64) -> Result<Inode> {
        let mut st = self.lock_inos(&[ino]);
        let i = self.inode(&st, ino)?;
        Self::count_lookup(&mut st, ino);
        Ok(i)
    }

    /// Counts one lookup reference to `ino`, an inode just created or
    /// linked, whose entry goes to the kernel (the kernel holds the
    /// directory locked meanwhile: the inode cannot have gone).
    pub fn add_lookup_ref(&self, ino: u64) {
        Self::count_lookup(&mut self.lock_inos(&[ino]), ino);
    }

    /// The kernel dropped `n` lookup references to `ino` (FORGET).
    pub fn forget(&self, ino: u64, n: u64) {
        self.drop_lookups(&mut self.lock_inos(&[ino]), ino, n);
    }

    /// Several FORGETs (BATCH_FORGET) under one lock: (inode, count).
    pub fn forget_many(&self, items: &[(u64, u64)]) {
        let inos: Vec<u64> = items.iter().map(|i| i.0).collect();
        let mut st = self.lock_inos(&inos);
        for &(ino, n) in items {
            self.drop_lookups(&mut st, ino, n);
        }
    }

    /// Every lookup reference the kernel holds, (inode, count), for the
    /// daemon that takes the mount over (`Fs::open_adopting`).
    pub fn kernel_refs(&self) -> Vec<(u64, u64)> {
        let st = self.lock_all();
        let refs = st
            .shards()
            .flat_map(|s| s.lookups.iter().map(|(&i, &n)| (i, n)));
        refs.collect()
    }

    /// Counts the references a mount taken over still holds.
    pub(crate) fn adopt_kernel_refs(&self, refs: &[(u64, u64)]) {
        if refs.is_empty() {
            return;
        }
        let mut st = self.lock_all();
        for &(ino, n) in refs {
            assert!(n > 0 && ino != ROOT_INO, "adopted reference {ino}: {n}");
            *st.sh_mut(ino).lookups.entry(ino).or_insert(0) += n;
        }
    }

    /// Lookup references the kernel holds to `ino`.
    pub fn lookup_refs(&self, ino: u64) -> u64 {
        let st = self.lock_inos(&[ino]);
        st.sh(ino).lookups.get(&ino).copied().unwrap_or(0)
    }

    /// Does something still refer to `ino` (open or looked up)?
    pub(crate) fn referenced(st: &State, ino: u64) -> bool {
        let sh = st.sh(ino);
        sh.open.get(&ino).is_some_and(|&n| n > 0) || sh.lookups.contains_key(&ino)
    }

    pub(crate) fn count_lookup(st: &mut State, ino: u64) {
        if ino != ROOT_INO {
            *st.sh_mut(ino).lookups.entry(ino).or_insert(0) += 1;
        }
    }

    fn drop_lookups(&self, st: &mut State, ino: u64, n: u64) {
        let Entry::Occupied(mut e) = st.sh_mut(ino).lookups.entry(ino) else {
            return;
        };
        if *e.get() > n {
            *e.get_mut() -= n;
            return;
        }
        e.remove();
        if !st.sh(ino).open.contains_key(&ino) {
            self.delete_unlinked(st, ino);
        }
    }

    /// Deletes `ino` if it has no links (it was kept for a reference).
    fn delete_unlinked(&self, st: &mut State, ino: u64) {
        if st.sh_mut(ino).unlinked.remove(&ino) {
            st.dirty(ino).delete_inode(ino);
            self.live_delta()
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
