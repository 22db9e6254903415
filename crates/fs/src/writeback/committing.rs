//! The overlays sealed and not yet committed, which reads consult between
//! the dirty overlay and the committed metadata: the one a commit is
//! writing, and above it at most one more, that a snapshot sealed while
//! that commit ran (`Fs::snapshot_during_commit`, `Fs::cut_during_commit`).
//! Commits take them oldest first.

use crate::writeback::overlay::Overlay;
use std::sync::Arc;

/// Oldest first; cheap to clone (two `Option<Arc>`, no allocation), as
/// every state lock takes a copy.
#[derive(Clone, Default)]
pub(crate) struct Committing([Option<Arc<Overlay>>; 2]);

impl Committing {
    pub fn is_empty(&self) -> bool {
        self.0[0].is_none()
    }

    pub fn len(&self) -> usize {
        self.0.iter().flatten().count()
    }

    /// The overlays, the newest (nearest the dirty one) first.
    pub fn newest_first(&self) -> impl Iterator<Item = &Overlay> {
        self.0.iter().rev().flatten().map(|o| &**o)
    }

    /// The overlays as shared, in no particular order.
    pub fn shared(&self) -> impl Iterator<Item = &Arc<Overlay>> {
        self.0.iter().flatten()
    }

    /// The overlays, the oldest (nearest the committed metadata) first.
    pub fn oldest_first(&self) -> impl Iterator<Item = &Overlay> {
        self.0.iter().flatten().map(|o| &**o)
    }

    /// The last one sealed.
    pub fn newest(&self) -> Option<&Arc<Overlay>> {
        self.0.iter().rev().flatten().next()
    }

    /// Puts `ov` above the others (a bug when two are there already).
    pub fn push(&mut self, ov: Arc<Overlay>) {
        let free = self.0.iter_mut().find(|o| o.is_none());
        *free.expect("at most two overlays wait for a commit") = Some(ov);
        self.check();
    }

    /// Takes the oldest (its commit is made, or failed).
    pub fn pop_oldest(&mut self) -> Option<Arc<Overlay>> {
        let oldest = self.0[0].take();
        self.0.swap(0, 1);
        self.check();
        oldest
    }

    /// Takes the newest (a cut above a commit that failed).
    pub fn pop_newest(&mut self) -> Option<Arc<Overlay>> {
        let newest = match self.0[1].take() {
            Some(o) => Some(o),
            None => self.0[0].take(),
        };
        self.check();
        newest
    }

    /// The oldest is first, with no gap before a newer one: `is_empty`
    /// looks at the first place only, and `push` fills the first free one.
    fn check(&self) {
        debug_assert!(
            self.0[0].is_some() || self.0[1].is_none(),
            "a committing overlay after a gap"
        );
    }

    /// Bytes the commits still to make will store.
    pub fn flush_bytes(&self, record: u64) -> u64 {
        self.oldest_first().map(|o| o.flush_bytes(record)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ov(ino: u64) -> Arc<Overlay> {
        let mut o = Overlay::default();
        o.put_symlink(ino, b"x".to_vec());
        Arc::new(o)
    }

    fn inos<'a>(it: impl Iterator<Item = &'a Overlay>) -> Vec<u64> {
        it.map(|o| *o.symlinks.keys().next().unwrap()).collect()
    }

    #[test]
    fn commits_take_the_oldest_and_reads_see_the_newest_first() {
        let mut c = Committing::default();
        assert!(c.is_empty());
        c.push(ov(1));
        c.push(ov(2));
        assert_eq!(c.len(), 2);
        assert_eq!(inos(c.newest_first()), [2, 1]);
        assert_eq!(inos(c.oldest_first()), [1, 2]);
        assert!(c.newest().unwrap().symlinks.contains_key(&2));
        assert!(c.pop_oldest().unwrap().symlinks.contains_key(&1));
        assert_eq!(inos(c.newest_first()), [2]);
        c.push(ov(3));
        assert!(c.pop_newest().unwrap().symlinks.contains_key(&3));
        assert_eq!(inos(c.newest_first()), [2]);
        assert!(c.pop_oldest().unwrap().symlinks.contains_key(&2));
        assert!(c.is_empty() && c.pop_oldest().is_none());
    }

    #[test]
    #[should_panic(expected = "at most two")]
    fn a_third_overlay_is_a_bug() {
        let mut c = Committing::default();
        for i in 0..3 {
            c.push(ov(i));
        }
    }
}
