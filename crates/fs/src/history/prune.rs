//! Prune: physically removes history that no retained TID can see and gives
//! back the data it alone referenced. Retained TIDs are the snapshots (named
//! ones until deleted, automatic ones by the daily/weekly/monthly policy)
//! and every TID newer than the fine-grained retention window.

use crate::error::{invariant, FsError, Result};
use crate::history::snapshot::{read_snapshots, Snapshot, SnapshotKind};
use crate::types::Time;
use crate::vfs::Fs;
use cairn_data::ChunkRec;
use cairn_devices::SlotAddr;
use cairn_meta::MetaWrite;
use std::collections::{BTreeSet, HashSet};

/// What prune keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrunePolicy {
    /// Keep every TID committed within this many seconds.
    pub retention_secs: u64,
    pub keep_daily: u32,
    pub keep_weekly: u32,
    pub keep_monthly: u32,
}

/// What a prune removed (or, dry, would remove).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct PruneReport {
    pub dry_run: bool,
    /// Automatic snapshots the policy no longer keeps (deleted).
    pub expired_snapshots: Vec<String>,
    /// History is kept from this TID on (and at snapshot TIDs).
    pub cutoff_tid: u64,
    pub elements: u64,
    pub chunks_freed: u64,
    pub bytes_freed: u64,
    pub segments_freed: u64,
}

const DAY_NS: u64 = 86_400 * 1_000_000_000;

/// Maps a time (unix ns) to the number of its day, week or month.
type PeriodOf = fn(u64) -> i64;

/// Names of automatic snapshots the policy drops: for each period kind
/// (day, ISO week, month, in UTC) the newest snapshot of each of the last N
/// periods that have one is kept; so are all named snapshots.
pub fn expired_autos(snaps: &[Snapshot], p: &PrunePolicy) -> Vec<String> {
    let mut autos: Vec<&Snapshot> = snaps
        .iter()
        .filter(|s| s.kind == SnapshotKind::Auto)
        .collect();
    autos.sort_by_key(|s| std::cmp::Reverse((s.time_ns, s.tid)));
    let mut keep: HashSet<&str> = HashSet::new();
    let periods: [(u32, PeriodOf); 3] = [
        (p.keep_daily, |t| (t / DAY_NS) as i64),
        (p.keep_weekly, |t| ((t / DAY_NS) as i64 + 3).div_euclid(7)),
        (p.keep_monthly, |t| {
            let (y, m, _) = crate::timefmt::civil((t / DAY_NS) as i64);
            y * 12 + m as i64
        }),
    ];
    for (n, period) in periods {
        let mut seen = HashSet::new();
        for s in &autos {
            if seen.len() >= n as usize && !seen.contains(&period(s.time_ns)) {
                break;
            }
            if seen.insert(period(s.time_ns)) {
                keep.insert(&s.name);
            }
        }
    }
    autos
        .iter()
        .filter(|s| !keep.contains(s.name.as_str()))
        .map(|s| s.name.clone())
        .collect()
}

/// Counts of one prune step.
#[derive(Default)]
pub(crate) struct Pruned {
    pub elements: u64,
    pub chunks: u64,
    pub bytes: u64,
}

impl Fs {
    pub fn prune_policy(&self) -> PrunePolicy {
        let c = &self.pool.config;
        PrunePolicy {
            retention_secs: c.history_retention_secs,
            keep_daily: c.keep_daily,
            keep_weekly: c.keep_weekly,
            keep_monthly: c.keep_monthly,
        }
    }

    /// Removes history ended in (from, cutoff] that no snapshot sees, and
    /// drops the references it held. Shared by every commit and by `prune`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prune_in(
        &self,
        w: &mut MetaWrite<'_>,
        from: u64,
        cutoff: u64,
        dry_run: bool,
        touched: &mut BTreeSet<u64>,
        freed: &mut Vec<SlotAddr>,
    ) -> Result<Pruned> {
        let mut retained = w
            .snapshots()?
            .into_iter()
            .map(|(n, b)| Snapshot::decode(&n, &b).map(|s| s.tid))
            .collect::<Result<Vec<u64>>>()?;
        retained.sort_unstable();
        // History is pruned up to a committed TID at most (this commit's
        // own, when it prunes): a cutoff past it is arithmetic gone wrong.
        let last = w.counter("last_tid")?;
        invariant!(
            from <= cutoff && cutoff <= last,
            "prune of TIDs {from}..={cutoff}, the last committed is {last}"
        );
        if !dry_run {
            self.make_debts_before(w, cutoff)?;
        }
        let removed = w.prune(from, cutoff, &retained, dry_run)?;
        if !dry_run {
            w.forget_gone(cutoff)?;
        }
        let mut out = Pruned {
            elements: removed.len() as u64,
            ..Pruned::default()
        };
        if dry_run {
            let drops = crate::history::liveness::chunk_uses(&removed, w.is_opaque())?;
            for (id, n) in drops {
                let raw = w
                    .chunk(id)?
                    .ok_or_else(|| FsError::Io(format!("chunk {id} missing")))?;
                let rec = ChunkRec::decode(&raw)?;
                if rec.refs == n {
                    out.chunks += 1;
                    out.bytes += rec.len as u64;
                }
            }
            return Ok(out);
        }
        let (chunks, bytes) = self.release_elements(w, &removed, touched, freed)?;
        out.chunks = chunks;
        out.bytes = bytes;
        Ok(out)
    }

    /// Applies the retention policy now: expires automatic snapshots, then
    /// removes all history no retained TID sees. Freed space shows at once.
    pub fn prune(&self, policy: &PrunePolicy, dry_run: bool) -> Result<PruneReport> {
        let run = self.maint_stats.start(crate::service_stats::Task::Prune);
        // Its commit stops the filesystem on a violated invariant, as a
        // flush's does.
        let rep = (self.prune_inner(policy, dry_run)).map_err(|e| self.stop_on_invariant(e))?;
        run.progress(1, 1);
        if !rep.dry_run {
            run.processed(rep.bytes_freed);
            run.reclaimed(rep.segments_freed * self.pool.chunks.segment_size());
        }
        Ok(rep)
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "nanoseconds since 1970: now is after 1970 and before 2554"
    )]
    fn prune_inner(&self, policy: &PrunePolicy, dry_run: bool) -> Result<PruneReport> {
        self.needs_key("a prune (which history snapshots keep is sealed)")?;
        self.flush()?;
        let last = self.flush_guard();
        let now = Time::now().as_nanos() as u64;
        let r = self.meta()?;
        let snaps = read_snapshots(&r)?;
        let keep = policy.retention_secs.saturating_mul(1_000_000_000);
        let cutoff = r.tid_before_time(now.saturating_sub(keep))?.unwrap_or(0);
        let cutoff = self.held_cutoff(cutoff);
        drop(r);
        let expired = expired_autos(&snaps, policy);
        let mut touched = BTreeSet::new();
        let mut freed = Vec::new();
        let p = self.pool.meta.write(|w| {
            if !dry_run {
                for name in &expired {
                    w.remove_snapshot(name)?;
                }
            }
            let p = self.prune_in(w, 0, cutoff, dry_run, &mut touched, &mut freed)?;
            if !dry_run {
                w.set_counter("pruned_tid", cutoff.max(w.counter("pruned_tid")?))?;
                self.store_segments(w, &touched)?;
            }
            Ok::<_, FsError>(p)
        })?;
        self.pool.chunks.release_slots(&freed)?;
        drop(last);
        self.refresh_retained()?;
        Ok(PruneReport {
            dry_run,
            expired_snapshots: expired,
            cutoff_tid: cutoff,
            elements: p.elements,
            chunks_freed: p.chunks,
            bytes_freed: p.bytes,
            segments_freed: freed.len() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto(name: &str, day: u64) -> Snapshot {
        Snapshot {
            name: name.into(),
            tid: day + 1,
            time_ns: day * DAY_NS + 3600 * 1_000_000_000,
            kind: SnapshotKind::Auto,
            hash: None,
            files: 0,
            bytes: 0,
        }
    }

    #[test]
    fn policy_keeps_newest_per_period() {
        // 60 consecutive days of autos plus one named snapshot.
        let mut snaps: Vec<Snapshot> = (0..60).map(|d| auto(&format!("a{d}"), 20000 + d)).collect();
        let mut named = auto("keepme", 19000);
        named.kind = SnapshotKind::Named;
        snaps.push(named);
        // Day 20000 is 2024-10-04; day 20059 (2024-12-02) starts ISO week 49.
        let p = PrunePolicy {
            retention_secs: 0,
            keep_daily: 1,
            keep_weekly: 3,
            keep_monthly: 3,
        };
        let gone = expired_autos(&snaps, &p);
        let mut kept: Vec<&str> = snaps
            .iter()
            .map(|s| s.name.as_str())
            .filter(|n| !gone.iter().any(|g| g == n))
            .collect();
        kept.sort();
        // daily: Dec 2; weekly: weeks 49, 48, 47 (Dec 2, Dec 1, Nov 24);
        // monthly: Dec, Nov (Nov 30), Oct (Oct 31).
        assert_eq!(kept, vec!["a27", "a51", "a57", "a58", "a59", "keepme"]);
        let none = PrunePolicy {
            keep_daily: 0,
            keep_weekly: 0,
            keep_monthly: 0,
            ..p
        };
        assert_eq!(expired_autos(&snaps, &none).len(), 60);
    }
}
