//! Tiering (TIER/btier): the mover promotes hot segments to faster tiers
//! and demotes cold ones to slower tiers, and `cairn device remove` uses the
//! same segment move to empty a device. Policy, per round (every
//! tier_interval_secs, or `cairn migrate` on demand):
//!  1. heat decays by 0.5 per tier_heat_halflife_secs of elapsed time;
//!  2. hot segments are those on slower tiers with at least
//!     tier_promote_hits decayed reads (btier's hit threshold);
//!  3. demote: on each tier device with a slower tier below it, the
//!     coldest segments that are not hot move down: as many as bring it
//!     under tier_fast_full_pct (so new writes find room there), plus, among
//!     those not read for tier_demote_idle_secs (btier's max_age), as many
//!     as the hot segments need room. Segments that hold only history-only
//!     chunks (see history/liveness.rs: data only ended elements, kept for
//!     the fine-grained window or snapshots, reference) are the coldest of
//!     all: they go first, whatever their heat, and need not be idle;
//!  4. promote: hot segments move up, hottest first, while the faster tier
//!     stays under tier_fast_full_pct.
//!
//! Copies are limited to tier_rate_mib MiB/s, except the demotions that
//! bring a device under its cap (new writes are waiting for that room).
//! Before each demotion that brings a tier under its cap, the mover steps
//! aside while client writes are coming in (up to 5 s; `yield_to_writers`),
//! unless a faster tier is short of room (under 1/8 of its slots, or 2,
//! free), so that foreground writes keep the devices and cores to
//! themselves.
//! When a fast tier is nearly full of history all the same, commits prune
//! fine-grained history (writeback/flush.rs `prune_cutoff`). Each move is crash-safe by
//! construction (see cairn_data::relocate). Besides its interval, the
//! mover thread looks every 200 ms whether a faster tier is above
//! tier_fast_full_pct (its high-water mark), or a hot segment waits on a
//! slower tier while the fastest has room, and then runs a round at once
//! (at most one a second), so that new writes keep finding room on the
//! fastest tier and hot data comes back up soon after it is read.

use crate::error::{FsError, Result};
use crate::maintenance::info::{device_infos, DeviceInfo};
use crate::vfs::Fs;
use cairn_data::Relocation;
use cairn_devices::Device;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct MigrateReport {
    pub promoted: u64,
    pub demoted: u64,
    pub bytes: u64,
    /// Moves given up because the segment changed meanwhile.
    pub skipped: u64,
    /// Time the round stepped aside for client writes (`yield_to_writers`).
    #[serde(default)]
    pub yielded_ms: u64,
}

/// The mover steps aside while client writes run or came in the last `QUIET`,
/// for at most `YIELD_MAX` before each demotion that brings a tier under
/// its cap (the bulk of its work; promotions and the demotions that make
/// room for them are few and go at once), unless a faster
/// tier has less than 1/`URGENT_FREE` of its slots (or 2) free: new
/// writes then need the room more than the devices' time.
const QUIET: Duration = Duration::from_millis(200);
const YIELD_MAX: Duration = Duration::from_secs(5);
const URGENT_FREE: u64 = 8;

/// Client writes and syncs under way, and when the last one ended (for
/// the mover to step aside): two atomic adds and a relaxed store per call.
/// A write that waits for a flush (over the dirty limit), and an fsync that
/// flushes, keep the mover aside for as long as they run.
#[derive(Debug)]
pub(crate) struct WriteClock {
    start: Instant,
    /// Milliseconds since `start` of the last write's end, plus one (0: none).
    last_ms: std::sync::atomic::AtomicU64,
    active: std::sync::atomic::AtomicUsize,
}

impl Default for WriteClock {
    fn default() -> Self {
        WriteClock {
            start: Instant::now(),
            last_ms: Default::default(),
            active: Default::default(),
        }
    }
}

/// A client write or sync in progress (`WriteClock::begin`).
pub(crate) struct ClientWrite<'a>(&'a WriteClock);

impl Drop for ClientWrite<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WriteClock {
    pub(crate) fn begin(&self) -> ClientWrite<'_> {
        self.active.fetch_add(1, Ordering::Relaxed);
        ClientWrite(self)
    }

    fn touch(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// A client write or sync runs, or one ended less than `QUIET` ago.
    pub(crate) fn busy(&self) -> bool {
        self.active.load(Ordering::Relaxed) > 0 || self.since_last().is_some_and(|d| d < QUIET)
    }

    /// How long ago the last write came (None: never).
    fn since_last(&self) -> Option<Duration> {
        let last = self.last_ms.load(Ordering::Relaxed).checked_sub(1)?;
        Some(
            self.start
                .elapsed()
                .saturating_sub(Duration::from_millis(last)),
        )
    }
}

/// Upper bounds of the heat histogram's buckets (decayed segment reads);
/// the last bucket is everything above.
pub const HEAT_BUCKETS: [f64; 5] = [0.0, 1.0, 4.0, 16.0, 64.0];

/// One device in `cairn tier status`: its info and a heat histogram.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TierDevice {
    #[serde(flatten)]
    pub device: DeviceInfo,
    /// Segments per heat bucket: 0, (0,1], (1,4], (4,16], (16,64], >64.
    pub heat: [u64; 6],
    /// Sum of the decayed reads of the device's segments.
    #[serde(default)]
    pub heat_sum: f64,
}

/// Copies at most `rate` bytes per second (0: unlimited).
pub(crate) struct RateLimit {
    rate: u64,
    start: Instant,
    bytes: u64,
}

impl RateLimit {
    pub(crate) fn new(rate: u64) -> Self {
        RateLimit {
            rate,
            start: Instant::now(),
            bytes: 0,
        }
    }

    pub(crate) fn spend(&mut self, bytes: u64) {
        self.bytes += bytes;
        if self.rate == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        if let Some(wait) = due.checked_sub(self.start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
}

/// Per tier device: (id, class rank, total slots, free slots).
fn tier_devices(fs: &Fs) -> Vec<(u32, u8, u64, u64)> {
    let set = fs.pool.chunks.devices();
    set.per_device_slots()
        .into_iter()
        .filter(|(d, _, _)| d.role == cairn_devices::DeviceRole::Tier && !set.is_draining(d.id()))
        .map(|(d, t, f)| (d.id(), d.class().rank(), t, f))
        .collect()
}

/// What a mover round starts from (`Fs::census`).
struct Census {
    /// Closed segments and their devices.
    segs: Vec<(u64, u32)>,
    /// Segments whose every chunk only history references.
    hist_only: HashSet<u64>,
    heat: HashMap<u64, cairn_data::HeatSample>,
    /// Per tier device: (id, class rank, total slots, free slots).
    devs: Vec<(u32, u8, u64, u64)>,
    /// Class rank per tier device.
    rank: HashMap<u32, u8>,
}

/// One planned segment move. Forced moves make room for new writes and are
/// not held to tier_rate_mib (the slower device's own speed is then the
/// limit).
struct Move {
    segment: u64,
    up: bool,
    forced: bool,
}

impl Census {
    /// (decayed reads, idle seconds) of a segment; never read: (0, max).
    fn cold(&self, id: &u64) -> (f64, u64) {
        (self.heat.get(id)).map_or((0.0, u64::MAX), |h| (h.hits, h.idle_secs))
    }

    /// The round's moves: demotions per faster device, then promotions.
    fn plan(&self, c: &crate::pool::config::PoolConfig) -> Vec<Move> {
        let slowest = self.devs.iter().map(|d| d.1).max().unwrap_or(0);
        // Promotion candidates, hottest first (never history-only ones).
        let mut hot: Vec<u64> = (self.segs.iter())
            .filter(|(id, d)| {
                self.rank
                    .get(d)
                    .is_some_and(|&r| self.devs.iter().any(|x| x.1 < r))
                    && self.cold(id).0 >= c.tier_promote_hits
                    && !self.hist_only.contains(id)
            })
            .map(|(id, _)| *id)
            .collect();
        hot.sort_by(|a, b| self.cold(b).0.total_cmp(&self.cold(a).0));
        let mut plan = Vec::new();
        for &(dev, r, total, free) in &self.devs {
            if r != slowest && total != 0 {
                plan.extend(self.demotions(c, dev, total, free, hot.len() as u64));
            }
        }
        let up = |segment| Move {
            segment,
            up: true,
            forced: false,
        };
        plan.extend(hot.into_iter().map(up));
        plan
    }

    /// Demotions from one faster device, coldest first: enough to bring it
    /// under the cap, and to make room for `hot` segments.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "counts of candidates, min with a usize length; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
    )]
    fn demotions(
        &self,
        c: &crate::pool::config::PoolConfig,
        dev: u32,
        total: u64,
        free: u64,
        hot: u64,
    ) -> Vec<Move> {
        let cap = total * c.tier_fast_full_pct as u64 / 100;
        let used = total - free;
        let over = used.saturating_sub(cap);
        let for_hot = hot.saturating_sub(cap.saturating_sub(used));
        let mut cands: Vec<u64> = (self.segs.iter())
            .filter(|(id, d)| {
                *d == dev && (self.hist_only.contains(id) || self.cold(id).0 < c.tier_promote_hits)
            })
            .map(|(id, _)| *id)
            .collect();
        // History-only segments first; then fewest reads first; among
        // equals, the longest idle first.
        cands.sort_by(|a, b| {
            let (x, y) = (self.cold(a), self.cold(b));
            let (ha, hb) = (self.hist_only.contains(a), self.hist_only.contains(b));
            hb.cmp(&ha).then(x.0.total_cmp(&y.0)).then(y.1.cmp(&x.1))
        });
        // Over the cap: the coldest go, however recently read (new writes
        // need the room). Room for hot segments: only those idle for
        // tier_demote_idle_secs.
        let (forced, rest) = cands.split_at((over as usize).min(cands.len()));
        let idle = (rest.iter())
            .filter(|id| self.hist_only.contains(id) || self.cold(id).1 >= c.tier_demote_idle_secs)
            .take(for_hot as usize);
        let down = |forced| {
            move |&segment: &u64| Move {
                segment,
                up: false,
                forced,
            }
        };
        (forced.iter().map(down(true)))
            .chain(idle.map(down(false)))
            .collect()
    }
}

impl Fs {
    /// Moves one segment to a device `pick` accepts: copy and sync without
    /// locks, then switch under the flush lock. Returns the bytes copied,
    /// or None if the segment was freed or changed meanwhile (a copy made
    /// is dropped).
    pub fn move_segment(
        &self,
        id: u64,
        pick: impl Fn(&Device, u64, u64) -> bool,
    ) -> Result<Option<u64>> {
        let Some(seg) = self.pool.chunks.segment(id) else {
            return Ok(None);
        };
        let used = seg.used as u64;
        let r: Relocation = match self.pool.chunks.copy_segment(id, pick) {
            Ok(r) => r,
            // Freed meanwhile (GC, prune): nothing left to move.
            Err(cairn_data::DataError::NoSegment(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        crate::failpoint::hit("tier-move-copied");
        let _last = self.flush_guard();
        let Some(rec) = self.pool.chunks.relocated_record(&r)? else {
            self.pool.chunks.abandon(&r)?;
            return Ok(None);
        };
        let committed = self.pool.meta.write(|w| {
            w.put_segment(id, &rec.encode())?;
            Ok::<_, FsError>(())
        });
        if let Err(e) = committed {
            self.pool.chunks.abandon(&r)?;
            return Err(e);
        }
        crate::failpoint::hit("tier-move-committed");
        self.pool.chunks.switch(&r)?;
        Ok(Some(used))
    }

    /// One round of the tier policy.
    pub fn migrate(&self, progress: &dyn Fn(u64, u64)) -> Result<MigrateReport> {
        let run = self.maint_stats.start(crate::service_stats::Task::Migrate);
        let progress = |done, total| {
            run.progress(done, total);
            progress(done, total)
        };
        let rep = self.migrate_inner(&progress)?;
        run.processed(rep.bytes);
        Ok(rep)
    }

    fn migrate_inner(&self, progress: &dyn Fn(u64, u64)) -> Result<MigrateReport> {
        let c = &self.pool.config;
        let mut rep = MigrateReport::default();
        let mut rate = RateLimit::new(c.tier_rate_mib << 20);
        let census = self.census();
        let plan = census.plan(c);
        let full = c.tier_fast_full_pct as u64;
        let total = plan.len() as u64;
        for (n, m) in plan.into_iter().enumerate() {
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            progress(n as u64, total);
            let Some(from) = self
                .pool
                .chunks
                .segment(m.segment)
                .and_then(|s| census.rank.get(&s.device).copied())
            else {
                continue;
            };
            if m.forced {
                rep.yielded_ms +=
                    u64::try_from(self.yield_to_writers().as_millis()).unwrap_or(u64::MAX);
            }
            let moved = if m.up {
                self.move_segment(m.segment, |d, t, f| {
                    d.class().rank() < from && (t - f + 1) * 100 <= t * full
                })
            } else {
                self.move_segment(m.segment, |d, _, _| d.class().rank() > from)
            };
            match moved {
                Ok(Some(bytes)) => {
                    rep.bytes += bytes;
                    self.maint_stats.moved(m.up, bytes);
                    if m.up {
                        rep.promoted += 1
                    } else {
                        rep.demoted += 1
                    }
                    if !m.forced {
                        rate.spend(bytes);
                    }
                }
                Ok(None) => rep.skipped += 1,
                Err(FsError::Data(e)) if e.is_no_space() => continue,
                Err(e) => return Err(e),
            }
        }
        progress(total, total);
        Ok(rep)
    }

    /// What a mover round starts from: the closed segments, their heat and
    /// the tier devices.
    fn census(&self) -> Census {
        let table: Vec<(u64, cairn_data::SegmentRec)> = self
            .pool
            .chunks
            .segment_table()
            .into_iter()
            .filter(|(id, _)| !self.pool.chunks.is_open(*id))
            .collect();
        let devs = tier_devices(self);
        Census {
            segs: table.iter().map(|(id, s)| (*id, s.device)).collect(),
            hist_only: table
                .iter()
                .filter(|(_, s)| s.chunks > 0 && s.live_data() == 0)
                .map(|(id, _)| *id)
                .collect(),
            heat: (self.pool.chunks.heat.samples().into_iter())
                .map(|h| (h.segment, h))
                .collect(),
            rank: devs.iter().map(|d| (d.0, d.1)).collect(),
            devs,
        }
    }

    /// Waits while client writes keep coming (see `QUIET`), at most
    /// `YIELD_MAX`, unless room on a faster tier is short; returns the
    /// time waited.
    fn yield_to_writers(&self) -> Duration {
        let t0 = Instant::now();
        while self.writes.busy()
            && t0.elapsed() < YIELD_MAX
            && !self.stopping.load(Ordering::SeqCst)
        {
            let devs = tier_devices(self);
            let slowest = devs.iter().map(|d| d.1).max().unwrap_or(0);
            let short =
                |&(_, r, t, f): &(u32, u8, u64, u64)| r < slowest && f < (t / URGENT_FREE).max(2);
            if devs.iter().any(short) {
                break;
            }
            std::thread::sleep(QUIET / 4);
        }
        t0.elapsed()
    }

    /// True if a tier device with a slower tier below it is fuller than
    /// tier_fast_full_pct (the mover then runs without waiting).
    pub fn fast_tier_over_high_water(&self) -> bool {
        let devs = tier_devices(self);
        let slowest = devs.iter().map(|d| d.1).max().unwrap_or(0);
        let full = self.pool.config.tier_fast_full_pct as u64;
        devs.iter()
            .any(|&(_, r, t, f)| r < slowest && t > 0 && (t - f) * 100 > t * full)
    }

    /// True if a segment on a slower tier is hot enough to promote and a
    /// faster tier has room under its cap for it: the mover then runs
    /// without waiting for its interval (data a burst of writes left on a
    /// slow tier comes back as soon as it is read).
    pub fn hot_waiting_below(&self) -> bool {
        let devs = tier_devices(self);
        let Some(fastest) = devs.iter().map(|d| d.1).min() else {
            return false;
        };
        let full = self.pool.config.tier_fast_full_pct as u64;
        let room = devs
            .iter()
            .any(|&(_, r, t, f)| r == fastest && t > 0 && (t - f + 1) * 100 <= t * full);
        if !room {
            return false;
        }
        let slow: std::collections::HashSet<u32> =
            devs.iter().filter(|d| d.1 > fastest).map(|d| d.0).collect();
        let c = &self.pool.chunks;
        let hits = self.pool.config.tier_promote_hits;
        c.heat.samples().into_iter().any(|h| {
            h.hits >= hits
                && !c.is_open(h.segment)
                && c.segment(h.segment)
                    .is_some_and(|s| slow.contains(&s.device) && s.live_data() > 0)
        })
    }

    /// True if a tier device with a slower tier below it has under 1/16 of
    /// its slots free and holds at least a segment's worth of history-only
    /// data: the mover (which demotes that data first) is behind the
    /// writes, and the commit prunes fine-grained history to make room
    /// (see `prune_cutoff` in writeback/flush.rs).
    pub(crate) fn fast_tier_history_pressure(&self) -> bool {
        let devs = tier_devices(self);
        let slowest = devs.iter().map(|d| d.1).max().unwrap_or(0);
        let short: Vec<u32> = devs
            .iter()
            .filter(|&&(_, r, t, f)| r < slowest && t > 0 && f < t / 16)
            .map(|d| d.0)
            .collect();
        if short.is_empty() {
            return false;
        }
        let mut hist: HashMap<u32, u64> = HashMap::new();
        for (_, s) in self.pool.chunks.segment_table() {
            *hist.entry(s.device).or_default() += s.hist;
        }
        let seg = self.pool.chunks.segment_size();
        short.iter().any(|d| hist.get(d).is_some_and(|&h| h >= seg))
    }

    /// Per device: fill and a heat histogram of its segments.
    pub fn tier_status(&self) -> Vec<TierDevice> {
        let mut hist: HashMap<u32, ([u64; 6], f64)> = HashMap::new();
        let segs = self.pool.chunks.segment_table();
        let infos = device_infos(&self.pool, &segs, |dev, h| {
            let b = HEAT_BUCKETS.iter().position(|&ub| h <= ub).unwrap_or(5);
            let e = hist.entry(dev).or_default();
            e.0[b] += 1;
            e.1 += h;
        });
        infos
            .into_iter()
            .map(|d| {
                let (heat, heat_sum) = hist.get(&d.id).copied().unwrap_or_default();
                TierDevice {
                    heat,
                    heat_sum,
                    device: d,
                }
            })
            .collect()
    }

    /// Decays heat by the time since the last decay and saves it.
    pub fn decay_heat(&self, elapsed: Duration) {
        let half = self.pool.config.tier_heat_halflife_secs.max(1) as f64;
        let f = 0.5f64.powf(elapsed.as_secs_f64() / half);
        let chunks = &self.pool.chunks;
        chunks.heat.decay(f, |s| chunks.segment(s).is_some());
        if let Err(e) = chunks
            .heat
            .save(&crate::pool::PoolPaths::heat(&self.pool.path))
        {
            tracing::warn!("saving heat table: {e}");
        }
    }

    /// The background mover per the pool config (tier_interval_secs = 0 or
    /// a single tier: off).
    pub fn spawn_mover(self: &Arc<Self>) -> Option<std::thread::JoinHandle<()>> {
        let every = self.pool.config.tier_interval_secs;
        if every == 0 {
            return None;
        }
        let fs = self.clone();
        let h = std::thread::Builder::new()
            .name("cairn-mover".into())
            .spawn(move || {
                let bg = fs.background.enter("tier mover");
                let mut last = Instant::now();
                let mut last_round = Instant::now();
                let mut last_hot_look = Instant::now();
                while !fs.stopping.load(Ordering::SeqCst) {
                    fs.nap(Duration::from_millis(200));
                    // Above the high-water mark, or hot data waiting on a
                    // slower tier with room above: move now (at most one
                    // round a second), not at the next interval.
                    // The hot-data look scans the heat table: once a
                    // second, not at every 200 ms tick.
                    let look_hot = last_hot_look.elapsed() >= Duration::from_secs(1);
                    if look_hot {
                        last_hot_look = Instant::now();
                    }
                    let urgent = last_round.elapsed() >= Duration::from_secs(1)
                        && (fs.fast_tier_over_high_water() || (look_hot && fs.hot_waiting_below()));
                    if !urgent && last.elapsed() < Duration::from_secs(every) {
                        continue;
                    }
                    last_round = Instant::now();
                    fs.decay_heat(last.elapsed());
                    last = Instant::now();
                    bg.lower();
                    match fs.migrate(&|_, _| {}) {
                        Ok(r) if r.promoted + r.demoted > 0 => tracing::info!(
                            "mover: {} promoted, {} demoted, {} bytes",
                            r.promoted,
                            r.demoted,
                            r.bytes
                        ),
                        Ok(_) => {}
                        Err(e) => tracing::error!("mover failed: {}", fs.stop_on_invariant(e)),
                    }
                }
            })
            .expect("spawn mover");
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::config::PoolConfig;

    /// Device 0 fast (rank 0, 10 slots, `free` free), device 1 slow
    /// (rank 2); `segs` are (segment, device, hits, idle seconds,
    /// history-only).
    fn census(free: u64, segs: &[(u64, u32, f64, u64, bool)]) -> Census {
        let devs = vec![(0, 0, 10, free), (1, 2, 100, 100)];
        Census {
            segs: segs.iter().map(|s| (s.0, s.1)).collect(),
            hist_only: segs.iter().filter(|s| s.4).map(|s| s.0).collect(),
            heat: (segs.iter())
                .map(|s| {
                    let h = cairn_data::HeatSample {
                        segment: s.0,
                        hits: s.2,
                        idle_secs: s.3,
                    };
                    (s.0, h)
                })
                .collect(),
            rank: devs.iter().map(|d| (d.0, d.1)).collect(),
            devs,
        }
    }

    fn moves(plan: &[Move]) -> Vec<(u64, bool, bool)> {
        plan.iter().map(|m| (m.segment, m.up, m.forced)).collect()
    }

    #[test]
    fn over_the_cap_history_only_segments_leave_first_then_the_coldest() {
        let c = PoolConfig::default(); // cap 90%: 9 of 10 slots
                                       // All 10 slots used: one segment must go, forced. Segment 3 holds
                                       // history only and was read recently; it still goes before the
                                       // live segment 2, which was never read.
        let segs = [
            (1, 0, 3.0, 5, false),
            (2, 0, 0.0, u64::MAX, false),
            (3, 0, 1.0, 1, true),
        ];
        assert_eq!(moves(&census(0, &segs).plan(&c)), [(3, false, true)]);
        // Two over the cap: then the live one never read.
        let c2 = PoolConfig {
            tier_fast_full_pct: 80,
            ..PoolConfig::default()
        };
        assert_eq!(
            moves(&census(0, &segs).plan(&c2)),
            [(3, false, true), (2, false, true)]
        );
    }

    #[test]
    fn hot_segments_come_up_and_idle_ones_make_room_for_them() {
        let c = PoolConfig::default();
        // Fast device at its cap (1 free of 10: exactly 9 used): no forced
        // move. Segment 9 on the slow device is hot; it needs one slot,
        // which an idle live segment (idle past tier_demote_idle_secs)
        // gives, not a recently read one.
        let segs = [
            (1, 0, 1.0, 5, false),
            (2, 0, 0.5, 10_000, false),
            (9, 1, 10.0, 1, false),
        ];
        assert_eq!(
            moves(&census(1, &segs).plan(&c)),
            [(2, false, false), (9, true, false)]
        );
        // A history-only segment on the slow device is never promoted,
        // however often it was read.
        let segs = [(9, 1, 50.0, 1, true)];
        assert!(census(5, &segs).plan(&c).is_empty());
    }
}
