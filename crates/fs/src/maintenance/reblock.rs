//! Reblock (online defragmentation, after HAMMER): copies the live chunks
//! of segments that are mostly dead, and the chunks of files whose blocks
//! are scattered, to the end of the log, so live data is contiguous again
//! and whole segments come free. Extents name chunks by id, so a move is
//! one chunk-record update: history, snapshots and their hashes do not see
//! it. Each step holds the flush lock for at most one segment's worth of
//! copying: copy -> sync -> one transaction -> free the old slots. A crash
//! before the transaction leaves the old copies in force.

use crate::error::{invariant, Result};
use crate::types::Extent;
use crate::vfs::Fs;
use cairn_data::{ChunkRec, Layout};
use cairn_meta::RecordType;
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Debug, Clone, Copy)]
pub struct ReblockOptions {
    /// Rewrite sealed segments whose live bytes are below this percentage
    /// of their used bytes.
    pub max_live_pct: u32,
    /// Also rewrite files whose blocks are scattered.
    pub files: bool,
    /// Copy at most this many bytes per second (0 = no limit).
    pub rate_limit: u64,
}

impl Default for ReblockOptions {
    fn default() -> Self {
        ReblockOptions {
            max_live_pct: 75,
            files: true,
            rate_limit: 0,
        }
    }
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ReblockReport {
    pub segments_rewritten: u64,
    pub files_rewritten: u64,
    pub chunks_moved: u64,
    pub bytes_moved: u64,
    pub segments_freed: u64,
    /// Chunks that failed verification and were left in place.
    pub damaged: Vec<String>,
}

/// Chunks that belong together, moved in the order given.
struct Group {
    chunks: Vec<u64>,
    bytes: u64,
    is_file: bool,
    /// For a cold segment: the class rank of its device, where its
    /// compacted chunks stay. None (a warm segment, a file): new-data
    /// placement.
    place: Option<u8>,
}

/// A chunk copied by reblock: (id, old record, new record).
type Moved = (u64, ChunkRec, ChunkRec);

impl Fs {
    /// Rewrites fragmented segments and files. `progress(done, total)` is
    /// called in bytes to move.
    pub fn reblock(
        &self,
        opts: &ReblockOptions,
        progress: &dyn Fn(u64, u64),
    ) -> Result<ReblockReport> {
        let run = self.maint_stats.start(crate::service_stats::Task::Reblock);
        // Its commits stop the filesystem on a violated invariant, as a
        // flush's do.
        (self.reblock_counted(&run, opts, progress)).map_err(|e| self.stop_on_invariant(e))
    }

    /// `reblock`, counted in the metrics as `run` (of GC or reblock).
    pub(crate) fn reblock_counted(
        &self,
        run: &crate::service_stats::Run<'_>,
        opts: &ReblockOptions,
        progress: &dyn Fn(u64, u64),
    ) -> Result<ReblockReport> {
        let progress = |done, total| {
            run.progress(done, total);
            progress(done, total)
        };
        let rep = self.reblock_inner(opts, &progress)?;
        run.processed(rep.bytes_moved);
        run.reclaimed(rep.segments_freed * self.pool.chunks.segment_size());
        Ok(rep)
    }

    fn reblock_inner(
        &self,
        opts: &ReblockOptions,
        progress: &dyn Fn(u64, u64),
    ) -> Result<ReblockReport> {
        self.flush()?;
        let groups = self.reblock_plan(opts)?;
        let total: u64 = groups.iter().map(|g| g.bytes).sum();
        let mut rep = ReblockReport::default();
        let mut done = 0;
        progress(0, total);
        let step = self.pool.chunks.segment_size();
        let t0 = std::time::Instant::now();
        let pace = |done: u64| {
            if opts.rate_limit > 0 {
                let due = std::time::Duration::from_secs_f64(done as f64 / opts.rate_limit as f64);
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        };
        for g in groups {
            if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            if g.is_file {
                rep.files_rewritten += 1;
            } else {
                rep.segments_rewritten += 1;
            }
            let mut batch = Vec::new();
            for id in g.chunks {
                batch.push(id);
                if batch.len() as u64 * self.record >= step {
                    done += self.move_chunks(&std::mem::take(&mut batch), g.place, &mut rep)?;
                    progress(done.min(total), total);
                    pace(done);
                }
            }
            done += self.move_chunks(&batch, g.place, &mut rep)?;
            progress(done.min(total), total);
            pace(done);
        }
        progress(total, total);
        Ok(rep)
    }

    /// Picks what to move: sparse segments first, then scattered files.
    fn reblock_plan(&self, opts: &ReblockOptions) -> Result<Vec<Group>> {
        let sparse = self.sparse_segments(opts.max_live_pct);
        let r = self.meta()?;
        let mut by_seg: BTreeMap<u64, Vec<(u32, u64, u64)>> = BTreeMap::new();
        let mut recs: HashMap<u64, ChunkRec> = HashMap::new();
        let mut bad = None;
        r.for_each_chunk(|id, raw| match ChunkRec::decode(raw) {
            Ok(rec) => {
                if sparse.contains(&rec.segment) {
                    by_seg
                        .entry(rec.segment)
                        .or_default()
                        .push((rec.offset, id, rec.len as u64));
                }
                recs.insert(id, rec);
            }
            Err(e) => bad = Some(e),
        })?;
        if let Some(e) = bad {
            return Err(e.into());
        }
        // A segment read within tier_demote_idle_secs is warm: its chunks
        // are being copied anyway, so they go where new data goes (the
        // fastest tier with room). A cold one stays on its tier.
        let idle_limit = self.pool.config.tier_demote_idle_secs;
        let rank_of = |seg: u64| {
            if self.pool.chunks.heat.get(seg).idle_secs < idle_limit {
                return None;
            }
            let dev = self.pool.chunks.segment(seg)?.device;
            let d = self.pool.chunks.devices().device(dev).ok()?;
            Some(d.class().rank())
        };
        let mut groups: Vec<Group> = by_seg
            .into_iter()
            .map(|(seg, mut v)| {
                v.sort_unstable();
                Group {
                    bytes: v.iter().map(|x| x.2).sum(),
                    chunks: v.into_iter().map(|x| x.1).collect(),
                    is_file: false,
                    place: rank_of(seg),
                }
            })
            .collect();
        if opts.files {
            let moved: BTreeSet<u64> = groups
                .iter()
                .flat_map(|g| g.chunks.iter().copied())
                .collect();
            groups.extend(self.scattered_files(&r, &recs, &moved)?);
        }
        Ok(groups)
    }

    /// Files whose chunks, in block order, break into more than twice the
    /// runs their size needs (a run is a stretch of chunks that follow one
    /// another in one segment).
    fn scattered_files(
        &self,
        r: &cairn_meta::MetaRead,
        recs: &HashMap<u64, ChunkRec>,
        skip: &BTreeSet<u64>,
    ) -> Result<Vec<Group>> {
        let mut files: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let mut bad = None;
        r.for_each_live(|e| {
            if e.key.rtype() == Some(RecordType::Extent) {
                match Extent::decode(&e.payload) {
                    Ok(x) => files.entry(e.key.obj()).or_default().extend(x.chunks()),
                    Err(x) => bad = Some(x),
                }
            }
        })?;
        if let Some(e) = bad {
            return Err(e);
        }
        let seg = self.pool.chunks.segment_size();
        let mut out = Vec::new();
        for chunks in files.into_values() {
            let rs: Vec<&ChunkRec> = chunks.iter().filter_map(|c| recs.get(c)).collect();
            if rs.len() < 2 {
                continue;
            }
            let bytes: u64 = rs.iter().map(|r| r.len as u64).sum();
            let runs = 1 + rs
                .windows(2)
                .filter(|w| w[0].segment != w[1].segment || w[0].offset + w[0].len != w[1].offset)
                .count() as u64;
            let ideal = bytes.div_ceil(seg).max(1);
            if runs > 2 * ideal + 1 {
                out.push(Group {
                    chunks: chunks.into_iter().filter(|c| !skip.contains(c)).collect(),
                    bytes,
                    is_file: true,
                    place: None,
                });
            }
        }
        Ok(out)
    }

    /// Moves these chunks (those still stored) to the end of the log in one
    /// step, on devices of class rank `place` (or slower) if given. Returns
    /// the bytes looked at, for progress.
    fn move_chunks(&self, ids: &[u64], place: Option<u8>, rep: &mut ReblockReport) -> Result<u64> {
        self.move_chunks_as(ids, place, None, rep)
    }

    /// `move_chunks`, into segments of layout `to` when given (a file's
    /// new policy, `path_policy.rs`); otherwise each chunk keeps the
    /// layout of the segment it leaves.
    pub(crate) fn move_chunks_as(
        &self,
        ids: &[u64],
        place: Option<u8>,
        to: Option<Option<Layout>>,
        rep: &mut ReblockReport,
    ) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let _last = self.flush_guard();
        self.check_ok()?;
        let (moves, looked) = self.copy_chunks(ids, place, to, rep)?;
        // The old segments lose their chunks in memory only after the commit:
        // until then readers with the old records must still find them.
        let debts = self.pool.meta.live_debts();
        let olds: Vec<ChunkRec> = (moves.iter())
            .map(|(id, old, _)| ChunkRec {
                live: old.live.saturating_sub(debts.owed(*id)),
                ..old.clone()
            })
            .collect();
        let after = self.pool.chunks.preview_unref(&olds);
        let new_segs: BTreeSet<u64> = moves.iter().map(|m| m.2.segment).collect();
        self.pool.meta.write(|w| {
            for (id, old, new) in &moves {
                // A moved chunk is the same chunk elsewhere: its record
                // keeps its content and its references.
                invariant!(
                    (new.hash, new.raw_len, new.refs) == (old.hash, old.raw_len, old.refs)
                        && (new.segment, new.offset) != (old.segment, old.offset),
                    "chunk {id} moved from segment {} to {} changed (raw {} -> {}, refs {} -> {})",
                    old.segment,
                    new.segment,
                    old.raw_len,
                    new.raw_len,
                    old.refs,
                    new.refs
                );
                w.put_chunk(*id, &new.encode())?;
            }
            // The segments written to first: one that also loses chunks
            // (the open segment, moved from and appended to) gets the
            // record `after` gives it, which counts both.
            self.store_segments(w, &new_segs)?;
            for (seg, rec) in &after {
                match rec {
                    Some(r) => w.put_segment(*seg, &r.encode())?,
                    None => w.remove_segment(*seg)?,
                }
            }
            Ok::<_, crate::FsError>(())
        })?;
        let freed = self.retire_moved(&moves, &olds)?;
        rep.chunks_moved += moves.len() as u64;
        rep.bytes_moved += moves.iter().map(|m| m.2.len as u64).sum::<u64>();
        rep.segments_freed += freed;
        Ok(looked)
    }

    /// Copies the chunks still stored to new places (each once), with their
    /// counts; a chunk that cannot be read stays where it is, named in the
    /// report. Returns (id, old record, new record) per copy, and the bytes
    /// looked at.
    fn copy_chunks(
        &self,
        ids: &[u64],
        place: Option<u8>,
        to: Option<Option<Layout>>,
        rep: &mut ReblockReport,
    ) -> Result<(Vec<Moved>, u64)> {
        let r = self.meta()?;
        let mut moves = Vec::new();
        let mut looked = 0;
        let mut batch = match place {
            Some(rank) => self.pool.chunks.batch_on(rank),
            None => self.pool.chunks.batch(),
        };
        // A file's extents can name one chunk more than once (a piece
        // split in two by a later write): move it once, or its old
        // segment would lose it twice and the first copy would leak.
        let mut seen = std::collections::HashSet::new();
        for &id in ids {
            if !seen.insert(id) {
                continue;
            }
            let Some(raw) = r.chunk(id)? else { continue };
            let old = ChunkRec::decode(&raw)?;
            looked += old.len as u64;
            let (method, stored) = match self.pool.chunks.read_stored(&old) {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!("reblock: chunk {id} left in place: {e}");
                    rep.damaged.push(format!("chunk {id}: {e}"));
                    continue;
                }
            };
            let own = || self.pool.chunks.segment(old.segment).and_then(|s| s.layout);
            batch.set_layout(to.unwrap_or_else(own));
            let mut new = batch.append_stored(method, old.raw_len, &stored, &old.hash)?;
            new.refs = old.refs;
            new.live = old.live;
            // Segments count history-only chunks by their true live
            // count: the stored one less the decrements that wait.
            let owed = self.pool.meta.live_debts().owed(id);
            if new.refs > 0 && new.live == owed {
                self.pool.chunks.set_history_only(&new, true);
            }
            moves.push((id, old, new));
        }
        batch.finish()?;
        Ok((moves, looked))
    }

    /// After the commit: heat follows the chunks, the old segments lose
    /// them, and emptied segments give their slots back. Returns the
    /// segments freed.
    fn retire_moved(&self, moves: &[Moved], olds: &[ChunkRec]) -> Result<u64> {
        let heat = &self.pool.chunks.heat;
        for (_, old, new) in moves {
            if let Some(s) = self.pool.chunks.segment(old.segment) {
                heat.carry(
                    old.segment,
                    new.segment,
                    old.len as f64 / s.used.max(1) as f64,
                );
            }
        }
        let mut freed = Vec::new();
        for old in olds {
            let seg = self.pool.chunks.segment(old.segment);
            if self.pool.chunks.unref_chunk(old)?.is_none() {
                freed.extend(seg.iter().flat_map(|s| s.places()));
            }
        }
        self.pool.chunks.release_slots(&freed)?;
        Ok(freed.len() as u64)
    }
}
