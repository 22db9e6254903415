//! The segments: the in-memory segment table over the device set, the open
//! segments that chunks are appended to (`open_segment.rs`, filled by
//! `writer.rs`), the segment id counter and the I/O gate, with the table's
//! accounting (chunks unreferenced, history-only bytes, rollback, freed
//! slots). The chunk store (`store.rs`) holds one and delegates to it.

use crate::chunk::CHUNK_HEADER_LEN;
use crate::dead_pages::{Dead, DeadPages};
use crate::error::{invariant, DataError, Result};
use crate::open_segment::OpenSegment;
use crate::policy::Policy;
use crate::records::{corrupt, ChunkRec, SegmentRec};
use crate::stripe_rec::StripeRec;
use crate::stripes::Stripes;
use cairn_devices::{Device, DeviceSet, SlotAddr};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// How long freeing slots waits for the reads in flight (new reads wait
/// meanwhile) before it leaves them for a later call.
const GATE_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

pub(crate) struct Segments {
    pub(crate) devices: Arc<DeviceSet>,
    /// The segment table: segment id -> record.
    pub(crate) table: RwLock<HashMap<u64, SegmentRec>>,
    pub(crate) open: Mutex<Option<OpenSegment>>,
    /// The segment that reblock and GC append moved chunks to, kept on the
    /// tier the chunks come from (see `ChunkStore::batch_on`).
    pub(crate) open_reloc: Mutex<Option<OpenSegment>>,
    /// Open segments of other layouts than the batch's at the moment
    /// (files with a policy of their own, `WriteBatch::set_layout`), each
    /// written out up to its last partial block.
    pub(crate) parked: Mutex<Vec<OpenSegment>>,
    pub(crate) next_segment: AtomicU64,
    pub(crate) segment_size: u64,
    /// Free bytes at the end of the open segment, readable while a batch
    /// holds the open segment (writers check space without waiting).
    pub(crate) open_tail: AtomicU64,
    /// Held shared by every device read of a chunk, from locating its
    /// segment to the end of the I/O; taken exclusively before a moved or
    /// dropped segment's old slot is released, so no read in flight can see
    /// the slot reused.
    pub(crate) io_gate: RwLock<()>,
    /// Slots freed while reads held the gate past `GATE_WAIT`: freed by
    /// the next `release_slots` (the watchdog calls it every half second).
    unreleased: Mutex<Vec<SlotAddr>>,
    /// Chunks that died or went to history only, to drop from the host's
    /// page cache after the commit (`release_slots`).
    dead: DeadPages,
    /// How many copies new segments get.
    pub(crate) policy: RwLock<Policy>,
    /// Set when a segment got fewer copies than the policy asks (no
    /// device of another failure domain had room, or a copy's write
    /// failed): the filesystem's re-replication has work.
    pub(crate) short: AtomicBool,
    /// Set by `ChunkStore::misplace_next_write` (tests of the invariant
    /// path only): the next segment write goes past its device's end.
    pub(crate) misplace: AtomicBool,
    /// Set by `ChunkStore::test_hook_shift_next_write` (tests of the
    /// invariant path only): the next segment write goes one segment
    /// further into its device, over the next slot.
    pub(crate) shift_write: AtomicBool,
    /// The stripes (parity over segments of an `ec=K+M` layout); their
    /// member slots are theirs, not the segments' (`stripes.rs`).
    pub(crate) stripes: RwLock<Stripes>,
    /// How long an I/O of one copy among several may take (`deadline.rs`).
    pub(crate) io_timeout: crate::deadline::IoTimeout,
    /// Devices whose reads stopped finishing (`deadline.rs`).
    pub(crate) read_stalls: crate::deadline::ReadStalls,
    /// Chunks restored from parity last (`stripes.rs`).
    pub(crate) restored: crate::stripes::Restored,
    /// Segment buffers kept from one write batch to the next (`wpipe.rs`).
    pub(crate) kept_buffers: Arc<crate::wpipe::KeptBuffers>,
}

impl Segments {
    /// The segments of the committed segment and stripe tables. Every
    /// stripe member's slot is claimed, then every segment's slot that is
    /// no stripe's; a slot claimed twice means a corrupt table, and so
    /// does a segment on a parity member.
    pub(crate) fn new(
        devices: Arc<DeviceSet>,
        table: Vec<(u64, SegmentRec)>,
        stripes: Vec<(u64, StripeRec)>,
        next_segment: u64,
    ) -> Result<Self> {
        let stripes = Stripes::new(stripes)?;
        for (id, rec) in stripes.sorted() {
            claim(&devices, &format!("stripe {id}"), &rec.members)?;
        }
        let mut segments = HashMap::with_capacity(table.len());
        for (id, rec) in table {
            // Stored tables are input: a bad one is an error, not a panic.
            if id >= next_segment {
                return Err(DataError::BadRecord {
                    what: "segment",
                    why: format!("segment id {id} >= next id {next_segment}"),
                });
            }
            let (held, own): (Vec<SlotAddr>, Vec<SlotAddr>) =
                (rec.places().into_iter()).partition(|p| stripes.owner(*p).is_some());
            if let Some(p) = held.iter().find(|p| stripes.of_places(&[**p]).is_none()) {
                return Err(DataError::BadRecord {
                    what: "segment",
                    why: format!(
                        "segment {id} is on slot {} of device {}, a parity member",
                        p.slot, p.device
                    ),
                });
            }
            claim(&devices, &format!("segment {id}"), &own)?;
            segments.insert(id, rec);
        }
        let segment_size = devices.segment_size();
        Ok(Segments {
            devices,
            table: RwLock::new(segments),
            open: Mutex::new(None),
            open_reloc: Mutex::new(None),
            parked: Mutex::new(Vec::new()),
            next_segment: AtomicU64::new(next_segment),
            segment_size,
            open_tail: AtomicU64::new(0),
            io_gate: RwLock::new(()),
            unreleased: Mutex::new(Vec::new()),
            dead: DeadPages::default(),
            policy: RwLock::new(Policy::default()),
            short: AtomicBool::new(false),
            misplace: AtomicBool::new(false),
            shift_write: AtomicBool::new(false),
            stripes: RwLock::new(stripes),
            restored: Default::default(),
            io_timeout: Default::default(),
            read_stalls: Default::default(),
            kept_buffers: Default::default(),
        })
    }

    pub(crate) fn get(&self, id: u64) -> Option<SegmentRec> {
        self.table.read().get(&id).cloned()
    }

    /// The table, sorted by segment id.
    pub(crate) fn sorted(&self) -> Vec<(u64, SegmentRec)> {
        let mut v: Vec<_> = self
            .table
            .read()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    /// The segment new chunks are appended to, if one is open.
    pub(crate) fn open_id(&self) -> Option<u64> {
        self.open.lock().as_ref().map(|o| o.id)
    }

    /// True if chunks may still be appended to this segment (it is the open
    /// segment of new writes or of moved chunks).
    pub(crate) fn is_open(&self, id: u64) -> bool {
        let open = |m: &Mutex<Option<OpenSegment>>| m.lock().as_ref().map(|o| o.id);
        open(&self.open) == Some(id)
            || open(&self.open_reloc) == Some(id)
            || self.parked.lock().iter().any(|o| o.id == id)
    }

    /// The device and device offset of a chunk, its record checked against
    /// the segment bounds: on the copy reads go to first (`read_order`).
    pub(crate) fn locate(&self, rec: &ChunkRec) -> Result<(Arc<Device>, u64)> {
        let seg = self
            .get(rec.segment)
            .ok_or(DataError::NoSegment(rec.segment))?;
        let first = self.read_order(&seg)[0];
        self.locate_at(rec, first)
    }

    /// The device and device offset of a chunk in the copy at `place`.
    pub(crate) fn locate_at(&self, rec: &ChunkRec, place: SlotAddr) -> Result<(Arc<Device>, u64)> {
        if rec.offset as u64 + rec.len as u64 > self.segment_size
            || (rec.len as usize) < CHUNK_HEADER_LEN
        {
            return Err(corrupt(rec, "chunk record out of segment bounds".into()));
        }
        let dev = self.devices.device(place.device)?;
        assert!(
            place.slot < dev.header.slot_count(),
            "slot {} beyond device {}'s {} slots",
            place.slot,
            place.device,
            dev.header.slot_count()
        );
        let at = dev.slot_offset(place.slot) + rec.offset as u64;
        Ok((dev, at))
    }

    /// A segment's copies in the order reads try them: online devices
    /// before missing or faulted ones, then the fastest class (never
    /// empty: a record has its first copy).
    pub(crate) fn read_order(&self, seg: &SegmentRec) -> Vec<SlotAddr> {
        let mut places = seg.places();
        if places.len() > 1 {
            places.sort_by_key(|p| {
                let rank = self
                    .devices
                    .device(p.device)
                    .map_or(u8::MAX, |d| d.class().rank());
                (!self.devices.is_online(p.device), rank)
            });
        }
        places
    }

    /// The bytes of a chunk on disk (header + stored), unverified.
    pub(crate) fn read_sealed(&self, rec: &ChunkRec) -> Result<Vec<u8>> {
        let _gate = self.io_gate.read();
        let (dev, at) = self.locate(rec)?;
        let mut buf = vec![0u8; rec.len as usize];
        dev.read_at(&mut buf, at)?;
        Ok(buf)
    }

    /// Copies a new segment whose first copy is on a `class` device gets.
    /// How segment `s` is to be kept: its own layout, or its class's
    /// (None when its first device is unknown).
    pub(crate) fn layout_of(&self, s: &SegmentRec) -> Option<crate::layout::Layout> {
        let class = self.devices.device(s.device).ok()?.class();
        Some(self.policy.read().segment_layout(class, s.layout))
    }

    /// A new segment got `got` of the `want` copies the policy asks: said
    /// once per shortage, and the re-replication is told.
    pub(crate) fn note_copies(&self, got: usize, want: usize) {
        if got < want && !self.short.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "new data gets {got} of {want} copies: no device of another failure domain has room or is online; the missing copies are made when one is"
            );
        }
    }

    /// Takes device `id` out (faulted): it failed too many I/Os while other
    /// copies can serve its segments. Re-replication makes them again. A
    /// missing device (never opened) stays missing.
    pub(crate) fn fault(&self, id: u32) {
        if !self.devices.is_online(id) {
            return;
        }
        let was = self
            .devices
            .set_state(id, cairn_devices::DeviceState::Faulted);
        if was.is_ok_and(|s| s == cairn_devices::DeviceState::Online) {
            tracing::error!(
                "device {id} is FAULTED (too many failed I/Os): no new data goes to it and reads use the other copies; replace it with `cairn device replace`"
            );
            self.short.store(true, Ordering::Relaxed);
        }
    }

    /// A device that failed a write (fewer than `FAILING_AFTER`) comes
    /// last in placement, so it may never be written again, never fail
    /// again and never be faulted while it fails every write. After each
    /// commit each such device gets one probe: 4 KiB written to a free
    /// slot claimed for it, synced, then freed. A failure counts, so a
    /// device failing every write is faulted within a few commits; one
    /// that recovered passes and stays.
    pub(crate) fn probe_suspects(&self) {
        use cairn_devices::set::FAILING_AFTER;
        for dev in self.devices.devices() {
            let id = dev.id();
            let errors = self.devices.write_errors(id);
            if errors == 0 || errors >= FAILING_AFTER || !self.devices.is_online(id) {
                continue;
            }
            let Ok(slot) = self.devices.allocate_where(|d, _, _| d.id() == id) else {
                continue;
            };
            assert_eq!(slot.device, id, "a probe's slot is on the device probed");
            let probe = vec![0u8; 4096];
            let r = (dev.write_at(&probe, dev.slot_offset(slot.slot))).and_then(|()| dev.sync());
            let _ = self.devices.release(slot);
            if let Err(e) = r {
                let n = self.devices.note_write_error(id);
                tracing::error!("device {id}: a probe write failed ({e}): {n} failed writes");
                if n >= FAILING_AFTER {
                    self.fault(id);
                }
            }
        }
    }

    /// Takes the copy at `addr` out of its segment's record (its write
    /// failed). Its slot stays claimed until the next mount: the record
    /// committed last may still name it, so it must not be reused.
    pub(crate) fn drop_copy(&self, addr: SlotAddr) -> Result<()> {
        let mut segs = self.table.write();
        let hit = segs.iter_mut().find(|(_, s)| s.places().contains(&addr));
        if let Some((id, s)) = hit {
            let left: Vec<SlotAddr> = s.places().into_iter().filter(|p| *p != addr).collect();
            // The batch fails rather than drop a segment's last copy.
            invariant!(
                !left.is_empty(),
                "segment {id}: its last copy (device {} slot {}) dropped",
                addr.device,
                addr.slot
            );
            s.set_places(&left);
            self.short.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Closes the open segments so that the next batches open new ones.
    /// Call between batches only.
    pub(crate) fn close_open(&self) {
        for m in [&self.open, &self.open_reloc] {
            let mut open = m.lock();
            if let Some(o) = open.as_ref() {
                assert!(
                    o.is_flushed(),
                    "closing segment {} with buffered data",
                    o.id
                );
            }
            *open = None;
        }
        let mut parked = self.parked.lock();
        for o in parked.iter() {
            assert!(
                o.is_flushed(),
                "closing parked segment {} with buffered data",
                o.id
            );
        }
        parked.clear();
        self.open_tail.store(0, Ordering::Relaxed);
    }

    /// A chunk lost its last reference: see `ChunkStore::unref_chunk`.
    pub(crate) fn unref_chunk(&self, rec: &ChunkRec) -> Result<Option<SegmentRec>> {
        let open = self.is_open(rec.segment);
        let mut segs = self.table.write();
        let Some(s) = segs.get_mut(&rec.segment) else {
            return Ok(None);
        };
        // A segment that counts no chunk was dropped (or is an open one
        // emptied): a chunk unreferenced again would free its slot while
        // other chunks still live there.
        invariant!(
            s.chunks > 0,
            "segment {}: chunk at offset {} unreferenced, but the segment counts no chunk",
            rec.segment,
            rec.offset
        );
        invariant!(
            rec.offset as u64 + rec.len as u64 <= s.used as u64,
            "segment {}: chunk {}+{} unreferenced past the {} bytes appended",
            rec.segment,
            rec.offset,
            rec.len,
            s.used
        );
        s.live = s.live.saturating_sub(rec.len as u64);
        s.chunks = s.chunks.saturating_sub(1);
        if rec.live == 0 {
            s.hist = s.hist.saturating_sub(rec.len as u64);
        }
        let dead = self.dead_chunk(s, rec);
        let left = match s.chunks == 0 && !open {
            true => segs.remove(&rec.segment).and(None),
            false => Some(s.clone()),
        };
        drop(segs);
        self.note_dead(dead);
        Ok(left)
    }

    /// Where the bytes of `rec` (in segment `s`) lie, for `note_dead`, if
    /// its I/O goes through the page cache (larger chunks bypass it).
    fn dead_chunk(&self, s: &SegmentRec, rec: &ChunkRec) -> Option<Dead> {
        crate::aligned::cached(rec.raw_len).then_some(Dead {
            device: s.device,
            slot: s.slot,
            offset: rec.offset as u64,
            len: rec.len as u64,
        })
    }

    /// Notes bytes no client reads again (see `dead_pages.rs`): dropped
    /// from the page cache after the commit, or now if many wait.
    fn note_dead(&self, d: Option<Dead>) {
        if d.is_some_and(|d| self.dead.note(d)) {
            self.drop_dead_pages();
        }
    }

    /// Drops the noted bytes from the host's page cache.
    fn drop_dead_pages(&self) {
        let base = |dev: u32, slot: u64| {
            let d = self.devices.device(dev).ok()?;
            (slot < d.header.slot_count()).then(|| d.slot_offset(slot))
        };
        for (dev, ranges) in self.dead.take(base) {
            let Ok(d) = self.devices.device(dev) else {
                continue;
            };
            for (off, len) in ranges {
                d.drop_cached(off, len);
            }
        }
    }

    /// Moves a chunk's bytes into or out of its segment's `hist`: see
    /// `ChunkStore::set_history_only`.
    pub(crate) fn set_history_only(&self, rec: &ChunkRec, to_history: bool) -> bool {
        let mut segs = self.table.write();
        let Some(s) = segs.get_mut(&rec.segment) else {
            return false;
        };
        let n = rec.len as u64;
        s.hist = if to_history {
            (s.hist + n).min(s.live)
        } else {
            s.hist.saturating_sub(n)
        };
        let dead = self.dead_chunk(s, rec).filter(|_| to_history);
        drop(segs);
        self.note_dead(dead);
        true
    }

    /// What `unref_chunk` of each of these chunks would leave: see
    /// `ChunkStore::preview_unref`.
    pub(crate) fn preview_unref(&self, recs: &[ChunkRec]) -> HashMap<u64, Option<SegmentRec>> {
        let open: Vec<u64> = recs
            .iter()
            .map(|r| r.segment)
            .filter(|&s| self.is_open(s))
            .collect();
        let segs = self.table.read();
        let mut out: HashMap<u64, Option<SegmentRec>> = HashMap::new();
        for rec in recs {
            let Some(cur) = segs.get(&rec.segment) else {
                continue;
            };
            let e = out.entry(rec.segment).or_insert_with(|| Some(cur.clone()));
            if let Some(s) = e {
                s.live = s.live.saturating_sub(rec.len as u64);
                s.chunks = s.chunks.saturating_sub(1);
                if rec.live == 0 {
                    s.hist = s.hist.saturating_sub(rec.len as u64);
                }
                if s.chunks == 0 && !open.contains(&rec.segment) {
                    *e = None;
                }
            }
        }
        out
    }

    /// Goes back to the committed table: see `ChunkStore::rollback`.
    pub(crate) fn rollback(&self, committed: Vec<(u64, SegmentRec)>) -> Result<()> {
        for m in [&self.open, &self.open_reloc] {
            *m.lock() = None;
        }
        self.parked.lock().clear();
        self.open_tail.store(0, Ordering::Relaxed);
        let committed: HashMap<u64, SegmentRec> = committed.into_iter().collect();
        let mut segs = self.table.write();
        let orphans: Vec<SlotAddr> = segs
            .iter()
            .filter(|(id, _)| !committed.contains_key(id))
            .flat_map(|(_, r)| r.places())
            .collect();
        *segs = committed;
        drop(segs);
        self.release_slots(&orphans)
    }

    /// Gives the slots of dropped segments back to their devices, after
    /// waiting for reads in flight (the I/O gate).
    pub(crate) fn release_slots(&self, freed: &[SlotAddr]) -> Result<()> {
        self.drop_dead_pages();
        // A stripe's member stays held by its stripe (`stripes.rs`).
        let freed: Vec<SlotAddr> = {
            let stripes = self.stripes.read();
            (freed.iter().copied())
                .filter(|a| stripes.owner(*a).is_none())
                .collect()
        };
        let mut waiting = self.unreleased.lock();
        waiting.extend(freed);
        if waiting.is_empty() {
            return Ok(());
        }
        // Reads in flight may still be at these slots: they are freed once
        // none is. A read that does not come back (a device that hangs)
        // holds them back for a later call, not the caller (a commit, or
        // re-replication) and every read queued behind its wait.
        let Some(gate) = self.io_gate.try_write_for(GATE_WAIT) else {
            tracing::debug!("{} freed slots wait for reads in flight", waiting.len());
            return Ok(());
        };
        drop(gate);
        let now = std::mem::take(&mut *waiting);
        // A slot goes back only when no segment names it any more: one
        // still named would be reused under its chunks. One pass over the
        // table per commit that frees slots.
        let set: std::collections::HashSet<SlotAddr> = now.iter().copied().collect();
        let named = (self.table.read().iter()).find_map(|(id, s)| {
            let first = SlotAddr {
                device: s.device,
                slot: s.slot,
            };
            let mut places = std::iter::once(&first).chain(&s.copies);
            places.find(|p| set.contains(p)).map(|p| (*id, *p))
        });
        invariant!(
            named.is_none(),
            "slot {:?} freed while segment {} names it",
            named.map(|n| n.1),
            named.map_or(0, |n| n.0)
        );
        now.iter().try_for_each(|a| Ok(self.devices.release(*a)?))
    }

    /// Bytes that new chunks can still use: the free slots shared among
    /// the copies a new segment gets (the policy's most, at most one per
    /// failure domain: an `ec` layout's M+1 until its stripe is made),
    /// plus the open segment's tail. Counting every free slot once would
    /// let writes (and fsyncs) take bytes no flush can store.
    pub(crate) fn free_bytes(&self) -> u64 {
        let (_, free_slots) = self.devices.slot_totals();
        // Counting the failure domains walks the devices: only a policy
        // with copies needs it (a write's space check asks every time).
        let copies = match self.policy.read().most_copies() {
            0 | 1 => 1,
            c => c.min(self.devices.segment_domains()).max(1) as u64,
        };
        free_slots / copies * self.segment_size + self.open_tail.load(Ordering::Relaxed)
    }
}

/// Claims the slots `places` of `owner` (a segment or stripe of the
/// committed tables).
fn claim(devices: &DeviceSet, owner: &str, places: &[SlotAddr]) -> Result<()> {
    for addr in places {
        if !devices.claim(*addr)? {
            return Err(DataError::BadRecord {
                what: "segment",
                why: format!(
                    "{owner} claims slot {} of device {} twice or out of range",
                    addr.slot, addr.device
                ),
            });
        }
    }
    Ok(())
}
