//! The stripe table in memory: every stripe of the committed table, and
//! for each member slot the stripe that owns it. A member slot belongs to
//! its stripe, not to the segment that uses it: it is claimed once at
//! mount, and a segment that dies or moves away leaves its slot held
//! (parity still covers its bytes) until no segment uses any data member
//! of the stripe, when the whole stripe is dissolved and its slots freed.

use crate::error::{DataError, Result};
use crate::stripe_rec::StripeRec;
use cairn_devices::SlotAddr;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

#[derive(Debug, Default)]
pub(crate) struct Stripes {
    recs: HashMap<u64, StripeRec>,
    /// Member slot -> (stripe id, position in its members).
    by_slot: HashMap<SlotAddr, (u64, usize)>,
}

impl Stripes {
    /// The committed stripes; a slot in two stripes means a corrupt table.
    pub(crate) fn new(list: Vec<(u64, StripeRec)>) -> Result<Self> {
        let mut s = Stripes::default();
        for (id, rec) in list {
            s.insert(id, rec)?;
        }
        Ok(s)
    }

    pub(crate) fn insert(&mut self, id: u64, rec: StripeRec) -> Result<()> {
        if self.recs.contains_key(&id) {
            return Err(bad(format!("stripe {id} given twice")));
        }
        for (i, p) in rec.members.iter().enumerate() {
            if let Some((other, _)) = self.by_slot.insert(*p, (id, i)) {
                return Err(bad(format!(
                    "slot {} of device {} is in stripes {other} and {id}",
                    p.slot, p.device
                )));
            }
        }
        self.recs.insert(id, rec);
        Ok(())
    }

    /// Takes stripe `id` out; its members are no longer held.
    pub(crate) fn remove(&mut self, id: u64) -> Option<StripeRec> {
        let rec = self.recs.remove(&id)?;
        for p in &rec.members {
            let owner = self.by_slot.remove(p);
            assert_eq!(owner.map(|o| o.0), Some(id), "a member is its stripe's");
        }
        Some(rec)
    }

    /// Member `pos` of stripe `id` moves from its slot to `to`.
    pub(crate) fn move_member(&mut self, id: u64, pos: usize, to: SlotAddr) {
        let rec = self
            .recs
            .get_mut(&id)
            .expect("moving a member of a known stripe");
        let from = rec.members[pos];
        assert_ne!(from, to, "a member moves to another slot");
        assert!(
            !self.by_slot.contains_key(&to),
            "a member moves to a free slot"
        );
        rec.members[pos] = to;
        assert_eq!(self.by_slot.remove(&from), Some((id, pos)));
        self.by_slot.insert(to, (id, pos));
    }

    pub(crate) fn get(&self, id: u64) -> Option<&StripeRec> {
        self.recs.get(&id)
    }

    /// The stripe owning slot `at` and the slot's position in it.
    pub(crate) fn owner(&self, at: SlotAddr) -> Option<(u64, usize)> {
        self.by_slot.get(&at).copied()
    }

    /// The stripe a segment at `places` belongs to: the first place that
    /// is a data member (id, position, the stripe).
    pub(crate) fn of_places(&self, places: &[SlotAddr]) -> Option<(u64, usize, &StripeRec)> {
        places.iter().find_map(|p| {
            let (id, pos) = self.owner(*p)?;
            let rec = &self.recs[&id];
            (pos < rec.k as usize).then_some((id, pos, rec))
        })
    }

    /// Every stripe, by id.
    pub(crate) fn sorted(&self) -> Vec<(u64, StripeRec)> {
        let mut v: Vec<_> = self.recs.iter().map(|(k, r)| (*k, r.clone())).collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    /// An id no stripe has.
    pub(crate) fn next_id(&self) -> u64 {
        self.recs.keys().max().map_or(1, |m| m + 1)
    }
}

/// The member windows restored from parity last, so that the chunks of a
/// lost member read one after another (a sequential read) are restored
/// with one read of each other member per window, not one per chunk.
/// The bytes of a member never change while its stripe holds it; the
/// cache is emptied when a stripe changes (a member moved, a stripe
/// dropped), so an entry never outlives what it copies.
/// A window asked for while another reader restores it waits for that
/// restore rather than doing it again.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    state: Mutex<RestoredState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct RestoredState {
    kept: VecDeque<(RestoredKey, Arc<Vec<u8>>)>,
    /// Windows being restored.
    pending: Vec<RestoredKey>,
}

/// (stripe id, member slot, window start).
pub(crate) type RestoredKey = (u64, SlotAddr, u64);

/// Windows kept (32 MiB at most): a stripe's lost data members, restored
/// together, stay until a sequential read gets to them.
const RESTORED_KEPT: usize = 32;

impl Restored {
    /// The window `key`: kept, or restored by `restore` (once, however
    /// many readers ask at the same time).
    pub(crate) fn get_or_restore(
        &self,
        key: RestoredKey,
        restore: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<Arc<Vec<u8>>> {
        let mut st = self.state.lock();
        loop {
            if let Some((_, v)) = st.kept.iter().find(|(k, _)| *k == key) {
                return Ok(v.clone());
            }
            if !st.pending.contains(&key) {
                st.pending.push(key);
                break;
            }
            self.done.wait(&mut st);
        }
        drop(st);
        let r = restore().map(Arc::new);
        let mut st = self.state.lock();
        st.pending.retain(|k| *k != key);
        if let Ok(b) = &r {
            Self::push(&mut st, key, b.clone());
        }
        self.done.notify_all();
        r
    }

    /// Keeps window `key`, restored along with another.
    pub(crate) fn keep(&self, key: RestoredKey, bytes: Arc<Vec<u8>>) {
        let mut st = self.state.lock();
        if !st.kept.iter().any(|(k, _)| *k == key) {
            Self::push(&mut st, key, bytes);
        }
    }

    fn push(st: &mut RestoredState, key: RestoredKey, bytes: Arc<Vec<u8>>) {
        if st.kept.len() >= RESTORED_KEPT {
            st.kept.pop_front();
        }
        st.kept.push_back((key, bytes));
    }

    /// Forgets every window (a stripe changed).
    pub(crate) fn clear(&self) {
        self.state.lock().kept.clear();
    }
}

fn bad(why: String) -> DataError {
    DataError::BadRecord {
        what: "stripe",
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(device: u32, slot: u64) -> SlotAddr {
        SlotAddr { device, slot }
    }

    fn stripe(base: u64) -> StripeRec {
        StripeRec {
            k: 2,
            m: 1,
            len: 4096,
            members: (0..3).map(|d| at(d, base)).collect(),
        }
    }

    #[test]
    fn members_are_owned_moved_and_freed_with_their_stripe() {
        let mut s = Stripes::new(vec![(1, stripe(5)), (2, stripe(6))]).unwrap();
        assert_eq!(s.owner(at(1, 5)), Some((1, 1)));
        assert_eq!(
            s.of_places(&[at(9, 9), at(1, 6)]).map(|x| (x.0, x.1)),
            Some((2, 1))
        );
        assert!(
            s.of_places(&[at(2, 5)]).is_none(),
            "a parity member is no segment's"
        );
        s.move_member(1, 2, at(7, 1));
        assert_eq!(s.owner(at(7, 1)), Some((1, 2)));
        assert_eq!(s.owner(at(2, 5)), None);
        assert_eq!(s.next_id(), 3);
        let gone = s.remove(1).unwrap();
        assert_eq!(gone.members[2], at(7, 1));
        assert_eq!(s.owner(at(0, 5)), None);
        assert_eq!(s.sorted().len(), 1);
        assert!(Stripes::new(vec![(1, stripe(5)), (2, stripe(5))]).is_err());
    }
}
