//! Dedup index entries not yet written to `dedup_v2`. A commit's new
//! entries wait here, in RAM, and go to the table in one sorted batch once
//! `BATCH` of them have gathered, or when the pool closes
//! (`MetaStore::drain`). Written one commit at a time, each new
//! chunk's entry lands at a random place of the index: a commit of a few
//! thousand random writes then rewrites one 4 KiB page of it per write.
//! Lookups see these entries as they see the table's. A crash loses the
//! waiting entries; the pool indexes their chunks again when it opens
//! (counter `DEDUP_INDEXED`, `MetaStore::reindex_dedup`), since mirror
//! streams find chunks by hash through the index. `cairn check` verifies
//! the table's entries.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Entries gathered before a commit writes them all (about 4 MiB of RAM).
pub const BATCH: usize = 1 << 17;

pub type Entries = BTreeMap<[u8; 6], [u8; 6]>;

pub struct Pending {
    entries: Mutex<Entries>,
    batch: AtomicUsize,
}

impl Default for Pending {
    fn default() -> Self {
        Pending {
            entries: Mutex::default(),
            batch: AtomicUsize::new(BATCH),
        }
    }
}

impl Pending {
    /// Changes the batch size (tests).
    pub fn set_batch(&self, n: usize) {
        self.batch.store(n.max(1), Relaxed);
    }

    pub fn get(&self, key: &[u8; 6]) -> Option<[u8; 6]> {
        self.entries.lock().get(key).copied()
    }

    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a transaction adding `adding` entries writes them all.
    pub fn due(&self, adding: usize) -> bool {
        adding > 0 && self.len() + adding >= self.batch.load(Relaxed)
    }

    /// Every entry waiting, with `gone` (entries of chunks a transaction
    /// removed) left out and `added` on top: what that transaction writes.
    pub fn merged(&self, gone: &[([u8; 6], [u8; 6])], added: &Entries) -> Entries {
        let mut all = self.entries.lock().clone();
        forget(&mut all, gone);
        all.extend(added.iter().map(|(k, v)| (*k, *v)));
        all
    }

    /// After a committed transaction that wrote `written` to the table,
    /// leaving out `gone` (entries of chunks it removed): none of them
    /// waits any more.
    pub fn written(&self, gone: &[([u8; 6], [u8; 6])], written: &Entries) {
        let mut e = self.entries.lock();
        forget(&mut e, gone);
        for (k, v) in written {
            if e.get(k) == Some(v) {
                e.remove(k);
            }
        }
    }

    /// After a committed transaction that wrote none: its entries wait
    /// here, without those of the chunks it removed.
    pub fn keep(&self, gone: &[([u8; 6], [u8; 6])], added: Entries) {
        let mut e = self.entries.lock();
        forget(&mut e, gone);
        e.extend(added);
    }
}

/// Drops the entries of `gone` that still name the same chunk.
fn forget(e: &mut Entries, gone: &[([u8; 6], [u8; 6])]) {
    for (k, v) in gone {
        if e.get(k) == Some(v) {
            e.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_wait_until_a_batch_gathers_and_removals_follow_their_chunk() {
        let p = Pending::default();
        p.set_batch(3);
        assert!(!p.due(0), "nothing to write");
        assert!(!p.due(2));
        p.keep(&[], Entries::from([([1; 6], [10; 6]), ([2; 6], [20; 6])]));
        assert_eq!(p.get(&[1; 6]), Some([10; 6]));
        assert!(p.due(1), "2 waiting + 1 new reach the batch");
        // A removal of another chunk under the same key keeps the entry.
        p.keep(&[([1; 6], [11; 6]), ([2; 6], [20; 6])], Entries::new());
        assert_eq!(p.get(&[1; 6]), Some([10; 6]));
        assert_eq!(p.get(&[2; 6]), None);
        let all = p.merged(&[([1; 6], [10; 6])], &Entries::from([([3; 6], [30; 6])]));
        assert_eq!(all, Entries::from([([3; 6], [30; 6])]));
        // An entry replaced after the batch was taken stays.
        let all = p.merged(&[], &Entries::new());
        p.keep(&[], Entries::from([([1; 6], [12; 6])]));
        p.written(&[], &all);
        assert_eq!(p.get(&[1; 6]), Some([12; 6]));
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn a_batch_that_leaves_out_a_removed_chunk_forgets_its_waiting_entry() {
        let p = Pending::default();
        p.keep(&[], Entries::from([([1; 6], [10; 6]), ([2; 6], [20; 6])]));
        // A transaction removes chunk 10 and writes the batch: the entry
        // is not written, and must not wait for the next batch either.
        let gone = [([1; 6], [10; 6])];
        let all = p.merged(&gone, &Entries::new());
        assert_eq!(all, Entries::from([([2; 6], [20; 6])]));
        p.written(&gone, &all);
        assert_eq!(p.get(&[1; 6]), None);
        assert!(p.is_empty());
    }
}
