//! Directory listing: committed entries merged with the overlays, in name
//! hash order. The readdir cookie of an entry is its name hash, so a listing
//! resumes correctly while the directory changes (cookies 1 and 2 are "."
//! and ".."). Two names with the same 63-bit hash in one directory could
//! make a resumed listing skip one of them; the chance is negligible.

use crate::error::Result;
use crate::types::{DirEnt, FileKind};
use crate::vfs::{Fs, State};
use crate::writeback::overlay::DirKey;
use cairn_meta::{ElemKey, RecordType};
use std::collections::BTreeMap;

/// Entry keys of a directory, each with its entry or None (removed).
type Merged = BTreeMap<Vec<u8>, Option<DirEnt>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: FileKind,
    /// Pass this back to continue after this entry.
    pub cookie: u64,
}

impl Fs {
    /// Up to `max` entries with a name hash above `after`. Each source
    /// (the committed tree, then each overlay, oldest first) gives at most
    /// `limit` keys; the merge is exact up to the lowest last key of a
    /// source that had more (`cutoff`), so a step costs O(limit) however
    /// many entries wait in the overlays, and a short step tries again
    /// with a larger limit.
    fn entries_after(&self, st: &State, dir: u64, after: u64, max: usize) -> Result<Vec<DirEntry>> {
        st.need(dir)?;
        let mut limit = max.saturating_add(8);
        loop {
            let (merged, cutoff) = self.merged_keys(st, dir, after, limit)?;
            let mut out = Vec::new();
            for (k, v) in merged {
                if cutoff.as_ref().is_some_and(|c| &k > c) {
                    break;
                }
                let Some(d) = v else { continue };
                let (hash, name) = self.names().dirent_name(dir, &k)?;
                if crate::volumes::hidden(dir, &name) {
                    continue;
                }
                out.push(DirEntry {
                    name: name.to_vec(),
                    ino: d.ino,
                    kind: d.kind,
                    cookie: hash,
                });
                if out.len() >= max {
                    return Ok(out);
                }
            }
            if cutoff.is_none() {
                return Ok(out);
            }
            limit = limit.saturating_mul(4);
        }
    }

    /// The entry keys of `dir` above `after`, committed ones overridden by
    /// the overlays', at most `limit` from each source, and the key past
    /// which the result is incomplete (None: complete).
    fn merged_keys(
        &self,
        st: &State,
        dir: u64,
        after: u64,
        limit: usize,
    ) -> Result<(Merged, Option<Vec<u8>>)> {
        let prefix = ElemKey::prefix(dir, RecordType::DirEntry);
        let lo = (after + 1).to_be_bytes().to_vec();
        let from = ElemKey::new(dir, RecordType::DirEntry, &lo);
        let committed =
            (self.ns_meta(st)?).scan_of_inode(dir, &prefix, Some(from.as_bytes()), limit)?;
        let mut cutoff = match committed.last() {
            Some(e) if committed.len() >= limit => Some(e.key.sub().to_vec()),
            _ => None,
        };
        let mut merged = BTreeMap::new();
        for e in committed {
            merged.insert(e.key.sub().to_vec(), Some(DirEnt::decode(&e.payload)?));
        }
        for o in st.oldest_first(dir) {
            let Some(m) = o.dirents.get(&dir) else {
                continue;
            };
            let from = DirKey::new(lo.clone());
            for (taken, (k, v)) in m.range(from..).enumerate() {
                let k = k.as_bytes();
                if cutoff.as_ref().is_some_and(|c| k > c.as_slice()) {
                    break;
                }
                merged.insert(k.to_vec(), *v);
                if taken + 1 >= limit {
                    cutoff = Some(k.to_vec());
                    break;
                }
            }
        }
        Ok((merged, cutoff))
    }

    pub(crate) fn dir_is_empty(&self, st: &State, dir: u64) -> Result<bool> {
        Ok(self.entries_after(st, dir, 2, 1)?.is_empty())
    }

    /// Lists a directory from a cookie (0 = start), with "." and "..".
    pub fn readdir(&self, dir: u64, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        let st = self.lock_inos(&[dir]);
        let d = self.dir_inode(&st, dir)?;
        let mut out = dot_entries(dir, d.parent, cookie);
        let rest = max.saturating_sub(out.len()).max(1);
        out.extend(self.entries_after(&st, dir, cookie.max(2), rest)?);
        // A listing resumes after the last cookie handed out: each entry's
        // must be past the one asked from, in order (else `ls` would loop
        // or skip; equal cookies only from a 63-bit hash collision).
        debug_assert!(
            out.first().is_none_or(|e| e.cookie > cookie)
                && out.windows(2).all(|w| w[0].cookie <= w[1].cookie),
            "readdir of {dir} from cookie {cookie}"
        );
        Ok(out)
    }
}

/// "." and ".." for a listing that starts at `cookie`.
pub(crate) fn dot_entries(dir: u64, parent: u64, cookie: u64) -> Vec<DirEntry> {
    let mut out = Vec::new();
    if cookie < 1 {
        out.push(DirEntry {
            name: b".".to_vec(),
            ino: dir,
            kind: FileKind::Dir,
            cookie: 1,
        });
    }
    if cookie < 2 {
        out.push(DirEntry {
            name: b"..".to_vec(),
            ino: parent.max(1),
            kind: FileKind::Dir,
            cookie: 2,
        });
    }
    out
}
