//! A pool's mirror role, kept in the metadata counters: a normal pool, a
//! mirror not yet bound to a source (made by `mkfs --mirror`), a mirror
//! of one source pool (read-only, follows its streams), or a promoted
//! mirror (writable; streams from its old source refused unless forced).

use crate::error::{FsError, Result};
use crate::vfs::Fs;
use cairn_meta::{ElemKey, MetaRead, RecordType};

const ROLE: &str = "mirror_role";
const SOURCE_HI: &str = "mirror_source_hi";
const SOURCE_LO: &str = "mirror_source_lo";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Normal,
    /// Made to be a mirror; the first stream binds it to its source.
    Unbound,
    Mirror {
        source: [u8; 16],
    },
    Promoted {
        source: [u8; 16],
    },
}

impl Role {
    /// True for a pool that takes no writes but streams (EROFS).
    pub fn is_mirror(&self) -> bool {
        matches!(self, Role::Unbound | Role::Mirror { .. })
    }

    pub(crate) fn read(r: &MetaRead) -> Result<Role> {
        let hi = r.counter(SOURCE_HI)?.to_be_bytes();
        let lo = r.counter(SOURCE_LO)?.to_be_bytes();
        let mut source = [0u8; 16];
        source[..8].copy_from_slice(&hi);
        source[8..].copy_from_slice(&lo);
        Ok(match r.counter(ROLE)? {
            0 => Role::Normal,
            1 => Role::Unbound,
            2 => Role::Mirror { source },
            3 => Role::Promoted { source },
            n => return Err(FsError::Io(format!("unknown mirror role {n}"))),
        })
    }

    pub(crate) fn write(&self, w: &mut cairn_meta::MetaWrite<'_>) -> Result<()> {
        let (n, source) = match *self {
            Role::Normal => (0, [0u8; 16]),
            Role::Unbound => (1, [0u8; 16]),
            Role::Mirror { source } => (2, source),
            Role::Promoted { source } => (3, source),
        };
        w.set_counter(ROLE, n)?;
        w.set_counter(
            SOURCE_HI,
            u64::from_be_bytes(
                source[..8]
                    .try_into()
                    .expect("slice length matches the array"),
            ),
        )?;
        w.set_counter(
            SOURCE_LO,
            u64::from_be_bytes(
                source[8..]
                    .try_into()
                    .expect("slice length matches the array"),
            ),
        )?;
        Ok(())
    }
}

impl Fs {
    pub fn mirror_role(&self) -> Result<Role> {
        Role::read(&self.meta()?)
    }

    /// Sets the pool's role (no TID: the tree does not change).
    pub fn set_mirror_role(&self, role: Role) -> Result<()> {
        let _last = self.flush_guard();
        self.pool.meta.write(|w| role.write(w))
    }

    /// Empties a fresh mirror (made by mkfs: its root alone, at TID 1) for
    /// its first stream, which brings the source's root at the same TID.
    pub fn clear_fresh_mirror(&self) -> Result<()> {
        let mut last = self.flush_guard();
        let r = self.meta()?;
        let (live, hist, _) = r.sizes()?;
        if *last > 1 || live > 1 || hist > 0 {
            return Err(FsError::BadRequest(
                "the mirror is not empty: a full stream goes into a fresh mirror pool".into(),
            ));
        }
        drop(r);
        self.pool.meta.write(|w| {
            w.remove_live(&ElemKey::new(
                crate::types::ROOT_INO,
                RecordType::Inode,
                &[],
            ))?;
            w.set_counter("last_tid", 0)?;
            // The stream logs TID 1 again, with the source's time: each
            // TID is logged once (`MetaWrite::log_tid`).
            w.forget_tids_after(0)?;
            Ok::<_, FsError>(())
        })?;
        *last = 0;
        Ok(())
    }

    /// Refuses `what` on a mirror held without its key (its values sealed).
    pub fn needs_key(&self, what: &str) -> Result<()> {
        match self.pool.meta.is_opaque() {
            true => Err(FsError::Key(format!(
                "{what} needs the pool's key: this mirror was opened without it (give --key-file)"
            ))),
            false => Ok(()),
        }
    }

    /// Fails with EROFS on a mirror: its tree changes only by streams.
    pub fn refuse_on_mirror(&self) -> Result<()> {
        match self.mirror_role()?.is_mirror() {
            true => Err(FsError::ReadOnly),
            false => Ok(()),
        }
    }
}
