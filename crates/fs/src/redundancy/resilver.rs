//! Re-replication: brings every sealed segment to the copies the policy
//! asks for its class. A copy on a missing or faulted device is replaced
//! (read from a good copy), one on a draining device too (device removal
//! and replacement), a segment short of copies (a failed copy write, no
//! room in another failure domain at the time, a raised policy) gets more,
//! and copies beyond the policy (a lowered one) are dropped, slowest first.
//! Only the segments that need it are read, in the order of the device
//! slots being replaced, two at a time (one is read while the new copy of
//! the other is written and synced), and each change is the segment move of
//! `cairn_data::relocate` (copy, sync, commit the new record, free the old
//! slots), so a crash at any point leaves the last committed record right
//! and a new run finishes the work (nothing else to resume). The work runs
//! in a background thread whenever something may need it, at most
//! `resilver_rate_mib` a second, and steps aside for client writes.

use crate::error::{invariant, FsError, Result};
use crate::maintenance::tier::RateLimit;
use crate::vfs::Fs;
use cairn_data::{Relocation, SegmentRec};
use cairn_devices::{Device, DeviceSet, SlotAddr};
use parking_lot::MutexGuard;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Segment changes committed in one metadata transaction.
const BATCH: usize = 16;
/// Threads making new copies at once: two keep the reads of one segment
/// going while the new copy of the one before is written and synced.
const PREPARERS: usize = 2;

/// The fixes of a run not yet taken by a preparing thread, in device
/// order; emptied when the run stops on an error.
struct PrepareQueue(std::vec::IntoIter<Fix>);

impl PrepareQueue {
    fn new(fixes: Vec<Fix>) -> Self {
        PrepareQueue(fixes.into_iter())
    }

    fn next(&mut self) -> Option<Fix> {
        self.0.next()
    }

    fn stop(&mut self) {
        self.0 = Vec::new().into_iter();
    }
}

/// What a run did.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct ResilverReport {
    /// Segments whose copies changed, and the bytes copied.
    pub segments: u64,
    pub bytes: u64,
    /// Copies made and dropped.
    pub copies_made: u64,
    pub copies_dropped: u64,
    /// Segments still short of copies (no room on a device of another
    /// failure domain).
    pub short: u64,
    /// Segments with no readable copy (lost).
    pub lost: u64,
    /// Stripe members made again (lost or leaving devices), stripes made
    /// and stripes dropped (no segment used them).
    #[serde(default)]
    pub members_made: u64,
    #[serde(default)]
    pub stripes_made: u64,
    #[serde(default)]
    pub stripes_dropped: u64,
}

/// What `device_replace` did.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct ReplaceReport {
    pub old: u32,
    pub new: u32,
    /// Segments given a copy on the new device (stripe members counted
    /// as segments), and the bytes copied.
    pub segments: u64,
    pub bytes: u64,
    /// Segments whose only copy was on the old device, which was missing.
    pub lost: u64,
}

/// What one segment needs.
struct Fix {
    segment: u64,
    /// The segment's copies when the fix was planned: a segment that
    /// changed since (another run, the tier mover) is left to the next run.
    places: Vec<SlotAddr>,
    /// Copies that cannot be read (missing, faulted): dropped whatever
    /// happens.
    dead: Vec<SlotAddr>,
    /// Readable copies to take away once replaced (draining device).
    leaving: Vec<SlotAddr>,
    /// Readable copies beyond the policy: dropped.
    extra: Vec<SlotAddr>,
    /// New copies wanted.
    add: usize,
    /// Class rank new copies go to first.
    rank: u8,
    /// Where the first copy being replaced is, for device order.
    order: (u32, u64),
}

/// The fix segment `id` needs, if any: `want` copies (object-store
/// segments keep one), none on a device that is faulted or drains, and
/// with `replace_missing` none on a missing one (else a missing device's
/// copies wait for it to come back or be replaced).
fn fix_for(
    set: &DeviceSet,
    id: u64,
    s: &SegmentRec,
    want: usize,
    replace_missing: bool,
) -> Option<Fix> {
    let places = s.places();
    let (mut dead, mut leaving, mut good) = (Vec::new(), Vec::new(), Vec::new());
    for p in &places {
        let missing = set.state(p.device) == Some(cairn_devices::DeviceState::Missing);
        match (set.is_online(p.device), set.is_draining(p.device)) {
            (false, _) if missing && !replace_missing => good.push(*p),
            (false, _) => dead.push(*p),
            (true, true) => leaving.push(*p),
            (true, false) => good.push(*p),
        }
    }
    let add = want.saturating_sub(good.len());
    let extra = match good.len() > want {
        true => slowest(set, &good, good.len() - want),
        false => Vec::new(),
    };
    if dead.is_empty() && leaving.is_empty() && add == 0 && extra.is_empty() {
        return None;
    }
    let rank_of = |p: &SlotAddr| set.device(p.device).map_or(u8::MAX, |d| d.class().rank());
    let first = dead.first().or(leaving.first()).unwrap_or(&places[0]);
    Some(Fix {
        segment: id,
        places: places.clone(),
        rank: rank_of(first).min(rank_of(&places[0])),
        order: (first.device, first.slot),
        dead,
        leaving,
        extra,
        add,
    })
}

/// The `n` copies of `good` on the slowest devices.
fn slowest(set: &DeviceSet, good: &[SlotAddr], n: usize) -> Vec<SlotAddr> {
    let mut v = good.to_vec();
    v.sort_by_key(|p| std::cmp::Reverse(set.device(p.device).map_or(0, |d| d.class().rank())));
    v.truncate(n);
    v
}

impl Fs {
    /// The fixes the segment table needs now, in device order (segments
    /// open for appends wait for the next run).
    fn resilver_plan(&self, replace_missing: bool) -> (Vec<Fix>, u64) {
        let chunks = &self.pool.chunks;
        let set = chunks.devices();
        let mut lost = 0;
        let mut fixes: Vec<Fix> = Vec::new();
        for (id, s) in chunks.segment_table() {
            if chunks.is_open(id) {
                continue;
            }
            // A segment in a stripe of its layout is kept by the stripe
            // (`stripes.rs` remakes members on lost devices).
            let layout = chunks.layout_of(&s);
            if layout.and_then(|l| l.ec()).is_some() && chunks.is_striped(id) {
                continue;
            }
            let want = layout.map_or(1, |l| l.copies());
            let Some(fix) = fix_for(set, id, &s, want, replace_missing) else {
                continue;
            };
            let readable = s
                .places()
                .iter()
                .filter(|p| set.is_online(p.device))
                .count();
            if readable == 0 {
                lost += 1;
                continue;
            }
            fixes.push(fix);
        }
        fixes.sort_by_key(|f| f.order);
        (fixes, lost)
    }

    /// One run of re-replication over the whole table (`cairn redundancy
    /// rebuild`, device replacement and removal, which replace the copies
    /// of missing devices too, and the background thread, which leaves
    /// those to come back). `pick` limits where new copies may go. One run
    /// at a time.
    pub fn resilver(
        &self,
        replace_missing: bool,
        pick: &(dyn Fn(&Device) -> bool + Sync),
        progress: &dyn Fn(u64, u64),
    ) -> Result<ResilverReport> {
        // One run at a time (`cairn redundancy rebuild` while the
        // background thread runs): each plans from the table as the
        // runs before it left it.
        let one = self.resilver_lock.lock();
        self.resilver_holding(&one, replace_missing, pick, progress)
    }

    /// `resilver` for a caller that holds the one-run lock already
    /// (device removal holds it for its whole drain, so the background
    /// run does not move the segments it is moving).
    pub(crate) fn resilver_holding(
        &self,
        _one: &MutexGuard<'_, ()>,
        replace_missing: bool,
        pick: &(dyn Fn(&Device) -> bool + Sync),
        progress: &dyn Fn(u64, u64),
    ) -> Result<ResilverReport> {
        if self.read_only() {
            return Err(FsError::ReadOnly);
        }
        let run = self.maint_stats.start(crate::service_stats::Task::Resilver);
        let mut rate = RateLimit::new(self.pool.config.resilver_rate_mib << 20);
        let mut rep = ResilverReport::default();
        // Stripes first: a segment striped now needs no more copies.
        self.stripes_first(replace_missing, pick, &mut rate, &mut rep)?;
        let (fixes, lost) = self.resilver_plan(replace_missing);
        rep.lost = lost;
        let total = fixes.len() as u64;
        let queue = parking_lot::Mutex::new(PrepareQueue::new(fixes));
        let mut ready: Vec<Relocation> = Vec::with_capacity(BATCH);
        let mut failed: Option<FsError> = None;
        std::thread::scope(|s| {
            let rx = self.prepare_in_parallel(s, &queue, pick);
            for (done, got) in rx.into_iter().enumerate() {
                if failed.is_some() {
                    // After a failure, what the other thread made is freed.
                    if let Ok(Some(r)) = got {
                        self.abandon_logged(&r);
                    }
                    continue;
                }
                progress(done as u64, total);
                run.progress(done as u64, total);
                if let Err(e) = self.take_prepared(got, &mut ready, &mut rep, &mut rate) {
                    queue.lock().stop();
                    failed = Some(e);
                }
            }
        });
        if let Some(e) = failed {
            self.commit_fixes(&mut ready, &mut rep)?;
            return Err(e);
        }
        self.commit_fixes(&mut ready, &mut rep)?;
        self.stripes_last(&mut rate, &mut rep)?;
        progress(total, total);
        run.processed(rep.bytes);
        Ok(rep)
    }

    /// Starts `PREPARERS` threads in `s` that take fixes from `queue` in
    /// order and make their new copies (one reads a segment while another
    /// writes and syncs the one before); what each made comes out of the
    /// receiver, at most `PREPARERS` ahead of the committer.
    fn prepare_in_parallel<'s>(
        &'s self,
        s: &'s std::thread::Scope<'s, '_>,
        queue: &'s parking_lot::Mutex<PrepareQueue>,
        pick: &'s (dyn Fn(&Device) -> bool + Sync),
    ) -> std::sync::mpsc::Receiver<cairn_data::error::Result<Option<Relocation>>> {
        let (tx, rx) = std::sync::mpsc::sync_channel(PREPARERS);
        for _ in 0..PREPARERS {
            let tx = tx.clone();
            s.spawn(move || loop {
                let next = queue.lock().next();
                let Some(fix) = next.filter(|_| !self.stopping.load(Ordering::SeqCst)) else {
                    return;
                };
                if tx.send(self.prepare_fix(&fix, pick)).is_err() {
                    return;
                }
            });
        }
        rx
    }

    /// Takes what a preparing thread made of one fix: a change joins
    /// `ready` (committed `BATCH` at a time), a segment without room is
    /// counted short; an error stops the run.
    fn take_prepared(
        &self,
        got: cairn_data::error::Result<Option<Relocation>>,
        ready: &mut Vec<Relocation>,
        rep: &mut ResilverReport,
        rate: &mut RateLimit,
    ) -> Result<()> {
        match got {
            Ok(Some(r)) => {
                let used = (self.pool.chunks.segment(r.segment)).map_or(0, |s| s.used as u64);
                rate.spend(used * r.to.len() as u64);
                rep.bytes += used * r.to.len() as u64;
                ready.push(r);
                if ready.len() >= BATCH {
                    self.commit_fixes(ready, rep)?;
                    self.writes_yield();
                }
                Ok(())
            }
            Ok(None) | Err(cairn_data::DataError::Busy(_)) => Ok(()),
            Err(cairn_data::DataError::NoSpace) => {
                rep.short += 1;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Frees the new copies of a change that will not be committed; a
    /// failure only keeps their slots claimed until the next mount.
    fn abandon_logged(&self, r: &Relocation) {
        if let Err(e) = self.pool.chunks.abandon(r) {
            tracing::warn!("segment {}: its new copies stay claimed: {e}", r.segment);
        }
    }

    /// Makes the new copies of one fix; the relocation to commit, None if
    /// the segment went away meanwhile.
    fn prepare_fix(
        &self,
        fix: &Fix,
        pick: &dyn Fn(&Device) -> bool,
    ) -> cairn_data::error::Result<Option<Relocation>> {
        let from: Vec<SlotAddr> = (fix.dead.iter().chain(&fix.leaving).chain(&fix.extra))
            .copied()
            .collect();
        let r = match self.change(fix, from, fix.add, pick) {
            Err(cairn_data::DataError::NoSpace)
                if !fix.dead.is_empty() || !fix.extra.is_empty() =>
            {
                // No room for a new copy: still drop the dead and extra
                // ones (the segment stays short and is counted so).
                let from = fix.dead.iter().chain(&fix.extra).copied().collect();
                return self.change(fix, from, 0, &|_| false);
            }
            r => r?,
        };
        let Some(mut r) = r else { return Ok(None) };
        // A leaving copy goes only when a new one took its place.
        let spare =
            r.to.len()
                .saturating_sub(fix.add.saturating_sub(fix.leaving.len()));
        let kept: Vec<SlotAddr> = fix.leaving.iter().skip(spare).copied().collect();
        r.from.retain(|p| !kept.contains(p));
        Ok(Some(r))
    }

    /// `copy_changing` for `fix`; None when its segment went away or
    /// changed since the plan (another run made its copies, the tier
    /// mover moved it): the fix no longer fits it, and the next run plans
    /// it as it is.
    fn change(
        &self,
        fix: &Fix,
        from: Vec<SlotAddr>,
        add: usize,
        pick: &dyn Fn(&Device) -> bool,
    ) -> cairn_data::error::Result<Option<Relocation>> {
        // Synced a batch at a time, before the commit (`commit_fixes`).
        let sync = false;
        let changed = (self.pool.chunks).copy_changing(
            fix.segment,
            from,
            add,
            fix.rank,
            |d, _, _| pick(d),
            sync,
        );
        let r = match changed {
            Ok(r) => r,
            Err(cairn_data::DataError::NoSegment(_) | cairn_data::DataError::Busy(_)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        if r.old != fix.places {
            self.pool.chunks.abandon(&r)?;
            return Ok(None);
        }
        Ok(Some(r))
    }

    /// Commits the prepared changes in one transaction and switches them;
    /// a change whose segment moved meanwhile is abandoned.
    pub(super) fn commit_fixes(
        &self,
        ready: &mut Vec<Relocation>,
        rep: &mut ResilverReport,
    ) -> Result<()> {
        if ready.is_empty() {
            return Ok(());
        }
        // The batch's new copies reach stable storage with one sync per
        // device, before any record names them.
        if let Err(e) = self.pool.chunks.sync_relocations(ready) {
            ready.drain(..).for_each(|r| self.abandon_logged(&r));
            return Err(e.into());
        }
        let _last = self.flush_guard();
        let mut recs: Vec<(Relocation, SegmentRec)> = Vec::with_capacity(ready.len());
        for r in ready.drain(..) {
            match self.pool.chunks.relocated_record(&r)? {
                Some(rec) => recs.push((r, rec)),
                None => self.pool.chunks.abandon(&r)?,
            }
        }
        let committed = self.pool.meta.write(|w| {
            for (r, rec) in &recs {
                w.put_segment(r.segment, &rec.encode())?;
            }
            Ok::<_, FsError>(())
        });
        if let Err(e) = committed {
            for (r, _) in &recs {
                self.pool.chunks.abandon(r)?;
            }
            return Err(e);
        }
        crate::failpoint::hit("resilver-committed");
        for (r, _) in recs {
            self.pool.chunks.switch(&r)?;
            rep.segments += 1;
            rep.copies_made += r.to.len() as u64;
            rep.copies_dropped += r.from.len() as u64;
        }
        Ok(())
    }

    /// `cairn redundancy rebuild`: commits what is buffered and closes the
    /// open segment (so that it is reached too), then one run.
    pub fn resilver_now(&self, progress: &dyn Fn(u64, u64)) -> Result<ResilverReport> {
        self.flush()?;
        {
            let _last = self.flush_guard();
            self.pool.chunks.close_open_segment();
        }
        self.resilver(true, &|_| true, progress)
    }

    /// Steps aside while client writes come in (the tier mover's rule).
    pub(super) fn writes_yield(&self) {
        let t0 = std::time::Instant::now();
        while self.writes.busy() && t0.elapsed() < Duration::from_secs(2) {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Replaces device `old` (online, missing or faulted) by a new device
    /// `spec`: the new one joins the pool, every copy on the old one is
    /// made again on it (read from the old one when it answers, else from
    /// the other copies), and the old one leaves the pool. Segments whose
    /// only copy was on a missing old device are lost: then the old device
    /// stays in the pool (missing) so that `cairn check` names the files,
    /// and the answer says so.
    pub fn device_replace(
        &self,
        old: &std::path::Path,
        spec: &cairn_devices::DeviceSpec,
        progress: &dyn Fn(u64, u64),
    ) -> Result<ReplaceReport> {
        if self.read_only() {
            return Err(FsError::ReadOnly);
        }
        let old = crate::maintenance::devices::find_device(self, old)?;
        let (old_id, set) = (old.id(), self.pool.chunks.devices().clone());
        if old.role != cairn_devices::DeviceRole::Tier {
            return Err(FsError::BadRequest(format!(
                "device {old_id} is a cache device: remove it and add the new one"
            )));
        }
        let mut spec = spec.clone();
        self.inherit_log_area(&old, &mut spec);
        let new_id = self.replacement(old_id, &spec)?;
        set.set_draining(old_id, true)?;
        let mut rep = ReplaceReport {
            old: old_id,
            new: new_id,
            ..Default::default()
        };
        let only_new = |d: &Device| d.id() == new_id;
        let moved = self.replace_single_copies(old_id, new_id, &mut rep, progress);
        let r = moved.and_then(|()| self.resilver(true, &only_new, progress));
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                set.set_draining(old_id, false)?;
                return Err(e);
            }
        };
        rep.segments += r.segments + r.members_made;
        rep.bytes += r.bytes;
        rep.lost = self.segments_only_on(old_id);
        let left = self
            .pool
            .chunks
            .segment_table()
            .iter()
            .filter(|(_, s)| s.on_device(old_id))
            .count()
            + self.members_on(old_id);
        if left > 0 {
            return Err(FsError::BadRequest(format!(
                "device {old_id}: {left} segments still have a copy there ({} of them their only one, lost with the device); it stays in the pool, draining, so that `cairn check` names the files that use them",
                rep.lost
            )));
        }
        self.forget_device(old_id, &old)?;
        tracing::info!(
            "device {old_id} replaced by device {new_id}: {} segments, {} bytes",
            rep.segments,
            rep.bytes
        );
        Ok(rep)
    }

    /// The id of the device `spec` names: added now, or already in the
    /// pool when a replace that did not finish (a crash, an error) added
    /// it (the file an add of it makes is that device's), so that the same
    /// command finishes the work.
    fn replacement(&self, old: u32, spec: &cairn_devices::DeviceSpec) -> Result<u32> {
        use cairn_devices::device::{device_file_path, file_id};
        let devices = self.pool.chunks.devices().devices();
        let added = (devices.into_iter())
            .find(|d| file_id(&d.path) == file_id(&device_file_path(&spec.path, d.id())));
        let Some(dev) = added else {
            return self.device_add(spec);
        };
        if dev.id() == old || dev.class() != spec.class || dev.role != spec.role {
            return Err(FsError::BadRequest(format!(
                "{} is already device {} of this pool ({} {})",
                spec.path.display(),
                dev.id(),
                dev.class(),
                dev.role
            )));
        }
        tracing::info!(
            "device {} ({}) is already in the pool: the replacement goes on with it",
            dev.id(),
            dev.path.display()
        );
        Ok(dev.id())
    }

    /// Moves the single-copy segments of device `old` (when it answers) to
    /// device `new`.
    fn replace_single_copies(
        &self,
        old: u32,
        new: u32,
        rep: &mut ReplaceReport,
        progress: &dyn Fn(u64, u64),
    ) -> Result<()> {
        if !self.pool.chunks.devices().is_online(old) {
            return Ok(());
        }
        let single: Vec<u64> = (self.pool.chunks.segment_table().into_iter())
            .filter(|(_, s)| s.copies.is_empty() && s.device == old)
            .map(|(id, _)| id)
            // A striped segment's copy is a stripe member: remade by the
            // stripe pass, so that its stripe stays whole.
            .filter(|id| !self.pool.chunks.is_striped(*id))
            .collect();
        let total = single.len() as u64;
        for (i, sid) in single.into_iter().enumerate() {
            progress(i as u64, total);
            if let Some(b) = self.move_segment(sid, |d, _, _| d.id() == new)? {
                rep.segments += 1;
                rep.bytes += b;
            }
        }
        Ok(())
    }

    /// Segments whose every copy is on device `id` (and in no stripe).
    fn segments_only_on(&self, id: u32) -> u64 {
        let chunks = &self.pool.chunks;
        let only = |sid: u64, s: &SegmentRec| {
            s.places().iter().all(|p| p.device == id) && !chunks.is_striped(sid)
        };
        let table = chunks.segment_table();
        table.iter().filter(|(sid, s)| only(*sid, s)).count() as u64
    }

    /// Takes an emptied device out of the set and the device table.
    pub(crate) fn forget_device(&self, id: u32, dev: &Device) -> Result<()> {
        let _last = self.flush_guard();
        self.device_unnamed(id)
            .map_err(|e| self.stop_on_invariant(e))?;
        self.log_copy_leaves(dev);
        self.pool.chunks.devices().remove(id)?;
        self.pool.meta.write(|w| {
            w.remove_device(id)?;
            Ok::<_, FsError>(())
        })?;
        if dev.path.starts_with(&self.pool.path) {
            let _ = std::fs::remove_file(&dev.path);
        }
        Ok(())
    }

    /// Before device `id` leaves the pool: no segment or stripe names it
    /// any more (its slot map, which `DeviceSet::remove` checks, and the
    /// tables agree), else their copies there would be lost with it.
    fn device_unnamed(&self, id: u32) -> Result<()> {
        let c = &self.pool.chunks;
        let seg = c.segment_table().into_iter().find(|(_, s)| s.on_device(id));
        invariant!(
            seg.is_none(),
            "device {id} removed while segment {:?} has a copy on it",
            seg.map(|s| s.0)
        );
        let stripe =
            (c.stripe_table().into_iter()).find(|(_, r)| r.members.iter().any(|m| m.device == id));
        invariant!(
            stripe.is_none(),
            "device {id} removed while stripe {:?} has a member on it",
            stripe.map(|s| s.0)
        );
        Ok(())
    }

    /// Asks the background re-replication to look at the table.
    pub fn kick_resilver(&self) {
        self.pool.chunks.note_short();
    }

    /// The background re-replication: runs when something may need it
    /// (a policy change, a lost or faulted device, a short segment) and
    /// every `resilver_interval_secs` to catch what was left short.
    pub fn spawn_resilver(self: &Arc<Self>) -> Option<std::thread::JoinHandle<()>> {
        if self.read_only() {
            return None;
        }
        let fs = self.clone();
        let every = Duration::from_secs(self.pool.config.resilver_interval_secs.max(1));
        let h = std::thread::Builder::new()
            .name("cairn-resilver".into())
            .spawn(move || {
                let bg = fs.background.enter("re-replication");
                let mut last = std::time::Instant::now();
                while !fs.stopping.load(Ordering::SeqCst) {
                    fs.nap(Duration::from_millis(500));
                    let due = last.elapsed() >= every;
                    if !fs.pool.chunks.take_short() && !due {
                        continue;
                    }
                    last = std::time::Instant::now();
                    bg.lower();
                    match fs.resilver(false, &|_| true, &|_, _| {}) {
                        Ok(r) if r.segments > 0 || r.lost > 0 => tracing::info!(
                            "re-replication: {} segments changed ({} copies made, {} dropped, {} bytes); {} short, {} lost",
                            r.segments, r.copies_made, r.copies_dropped, r.bytes, r.short, r.lost
                        ),
                        Ok(_) => {}
                        Err(e) => {
                            let e = fs.stop_on_invariant(e);
                            tracing::error!("re-replication failed: {e}")
                        }
                    }
                }
            })
            .expect("spawn re-replication");
        Some(h)
    }
}
