//! Blocks recently written by flushes, by content hash. A partial write to a
//! block that is only on disk must read the block first (read-modify-write),
//! and it does so holding the state lock; segments are written with O_DIRECT,
//! so the host's page cache does not hold them either. Keeping the last
//! flushed blocks (a bounded FIFO, about half the dirty limit) serves those
//! reads from RAM. Keyed by BLAKE3 of the content, an entry can never be
//! stale: whatever extent names a chunk with that hash has these bytes.

use cairn_data::Hash;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

pub(crate) struct RecentBlocks {
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Hash, Arc<Vec<u8>>>,
    order: VecDeque<Hash>,
    bytes: usize,
}

impl RecentBlocks {
    /// Keeps at most `cap` bytes of blocks.
    pub(crate) fn new(cap: usize) -> Self {
        RecentBlocks {
            cap,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Remembers that `data` has content hash `hash`.
    pub(crate) fn insert(&self, hash: Hash, data: &Arc<Vec<u8>>) {
        if data.len() > self.cap {
            return;
        }
        let mut g = self.inner.lock();
        if g.map.contains_key(&hash) {
            return;
        }
        while g.bytes + data.len() > self.cap {
            let Some(old) = g.order.pop_front() else {
                break;
            };
            if let Some(b) = g.map.remove(&old) {
                g.bytes -= b.len();
            }
        }
        g.bytes += data.len();
        g.order.push_back(hash);
        g.map.insert(hash, data.clone());
        // The FIFO and the map name the same blocks, within the bound.
        debug_assert!(g.bytes <= self.cap && g.map.len() == g.order.len());
    }

    /// The block with content hash `hash`, if kept.
    pub(crate) fn get(&self, hash: &Hash) -> Option<Arc<Vec<u8>>> {
        self.inner.lock().map.get(hash).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_within_the_bound() {
        let r = RecentBlocks::new(250);
        let block = |i: u8| Arc::new(vec![i; 100]);
        for i in 0..5u8 {
            r.insert([i; 32], &block(i));
        }
        // 250 bytes hold two 100-byte blocks: the last two inserted.
        assert!(r.get(&[2; 32]).is_none());
        assert_eq!(r.get(&[3; 32]).unwrap()[0], 3);
        assert_eq!(r.get(&[4; 32]).unwrap()[0], 4);
        r.insert([4; 32], &block(4)); // again: no double count
        r.insert([5; 32], &block(5));
        assert!(r.get(&[3; 32]).is_none());
        assert!(r.get(&[4; 32]).is_some() && r.get(&[5; 32]).is_some());
        assert!(RecentBlocks::new(10).get(&[0; 32]).is_none());
    }
}
