//! Files and directories without fine-grained history (HAMMER's `chflags
//! nohistory`), for databases and VM images that rewrite their blocks in
//! place. The switch is the extended attribute `user.cairn.nohistory` with
//! value "1" (an ordinary xattr element, so it is durable, versioned and
//! shows in snapshots); removing it turns history back on from the next
//! commit. Files, directories and other nodes created in a directory that
//! has it get it too.
//!
//! At each commit, the elements of such an object that the commit ended
//! (old inode versions, overwritten or truncated extents, removed xattrs;
//! for a directory, its replaced or removed entries) are removed at once
//! unless a snapshot TID lies in [create TID, end TID): snapshots still see
//! the object exactly, while between snapshots only the current version is
//! kept. The data they alone referenced is released in the same
//! transaction, so overwrites do not grow the pool. An `@@0x<tid>` view at
//! a TID that is not a snapshot does not see such an object's old
//! versions (they are gone, as in HAMMER).

use crate::error::Result;
use crate::history::snapshot::Snapshot;
use crate::vfs::{Fs, State};
use cairn_devices::SlotAddr;
use cairn_meta::{Element, MetaWrite};
use std::collections::{BTreeSet, HashMap};

/// The extended attribute that turns fine-grained history off.
pub const XATTR: &[u8] = b"user.cairn.nohistory";

/// Whether an xattr value turns history off (only "1" does).
pub fn is_on(value: &[u8]) -> bool {
    value == b"1"
}

/// Accepted values of the switch: "1" (a "0" would read as "on" to
/// anyone looking for the attribute, so it is refused; remove it instead).
pub(crate) fn valid(name: &[u8], value: &[u8]) -> bool {
    name != XATTR || is_on(value)
}

impl Fs {
    /// Gives a new node `ino` created in `parent` the switch if `parent`
    /// has it (call with the new inode in the dirty overlay).
    pub(crate) fn inherit_nohistory(&self, st: &mut State, parent: u64, ino: u64) -> Result<()> {
        if let Some(v) = self.xattr(st, parent, XATTR)?.filter(|v| is_on(v)) {
            st.dirty(ino).put_xattr(ino, XATTR.to_vec(), Some(v));
        }
        Ok(())
    }

    /// Which of `ended` (everything the commit at `tid` ended) belong to
    /// nohistory objects and no snapshot sees: those go at once
    /// (`drop_nohistory`). An object counts as nohistory if it has the
    /// switch after the commit, or had it until this commit (deleted, or
    /// the switch just removed).
    pub(crate) fn nohistory_victims(
        &self,
        w: &MetaWrite<'_>,
        tid: u64,
        ended: &[Element],
    ) -> Result<Vec<bool>> {
        let mut victim = vec![false; ended.len()];
        if ended.is_empty() {
            return Ok(victim);
        }
        let mut off: HashMap<u64, bool> = HashMap::new();
        for e in ended {
            if self.names().is_xattr(&e.key, XATTR) && is_on(&e.payload) {
                off.insert(e.key.obj(), true);
            }
        }
        let mut snaps: Option<Vec<u64>> = None;
        for (e, v) in ended.iter().zip(victim.iter_mut()) {
            let obj = e.key.obj();
            let nohist = match off.get(&obj) {
                Some(&b) => b,
                None => {
                    let key = self.names().xattr_key(obj, XATTR);
                    let b = w.get(&key)?.is_some_and(|x| is_on(&x.payload));
                    off.insert(obj, b);
                    b
                }
            };
            if !nohist {
                continue;
            }
            let snaps = match &mut snaps {
                Some(s) => s,
                None => snaps.insert(snapshot_tids(w)?),
            };
            let i = snaps.partition_point(|&t| t < e.create_tid);
            *v = !(i < snaps.len() && snaps[i] < tid);
        }
        Ok(victim)
    }

    /// Removes `victims` (see `nohistory_victims`), noting their ends for
    /// mirror streams, and releases what they referenced.
    pub(crate) fn drop_nohistory(
        &self,
        w: &mut MetaWrite<'_>,
        victims: &[Element],
        touched: &mut BTreeSet<u64>,
        freed: &mut Vec<SlotAddr>,
    ) -> Result<()> {
        if victims.is_empty() {
            return Ok(());
        }
        for v in victims {
            w.remove_ended(v)?;
            w.note_gone(v)?;
        }
        self.release_elements(w, victims, touched, freed)?;
        Ok(())
    }
}

/// The snapshot TIDs, sorted, as this transaction sees them.
fn snapshot_tids(w: &MetaWrite<'_>) -> Result<Vec<u64>> {
    let mut t = w
        .snapshots()?
        .into_iter()
        .map(|(n, b)| Snapshot::decode(&n, &b).map(|s| s.tid))
        .collect::<Result<Vec<u64>>>()?;
    t.sort_unstable();
    Ok(t)
}
