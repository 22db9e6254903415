//! Garbage collection: the space of chunks nobody references any more is
//! inside segments that still hold live chunks. GC compacts those segments
//! (the segment half of reblock: copy live chunks, switch, free) in the
//! background at a limited rate, and on demand (`cairn gc`).

use crate::error::Result;
use crate::maintenance::reblock::{ReblockOptions, ReblockReport};
use crate::service_stats::Task;
use crate::vfs::Fs;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Fs {
    /// Ids of sealed segments whose live bytes are below `max_live_pct` of
    /// what they hold; cheap (in-RAM segment table).
    pub fn sparse_segments(&self, max_live_pct: u32) -> BTreeSet<u64> {
        let pct = max_live_pct as u64;
        let chunks = &self.pool.chunks;
        chunks
            .segment_table()
            .into_iter()
            .filter(|(id, s)| {
                !chunks.is_open(*id) && s.used > 0 && s.live * 100 < s.used as u64 * pct
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// Compacts segments below `max_live_pct` live, at most `rate_limit`
    /// bytes copied per second (0: no limit).
    pub fn gc(
        &self,
        max_live_pct: u32,
        rate_limit: u64,
        progress: &dyn Fn(u64, u64),
    ) -> Result<ReblockReport> {
        let run = self.maint_stats.start(Task::Gc);
        if self.sparse_segments(max_live_pct).is_empty() {
            return Ok(ReblockReport::default());
        }
        let o = ReblockOptions {
            max_live_pct,
            files: false,
            rate_limit,
        };
        self.reblock_counted(&run, &o, progress)
    }

    /// Background GC per the pool config (gc_interval_secs = 0: off).
    pub fn spawn_gc(self: &Arc<Self>) -> Option<std::thread::JoinHandle<()>> {
        let c = &self.pool.config;
        if c.gc_interval_secs == 0 {
            return None;
        }
        let (every, pct, rate) = (
            Duration::from_secs(c.gc_interval_secs),
            c.gc_max_live_pct,
            c.gc_rate_mib << 20,
        );
        let fs = self.clone();
        let h = std::thread::Builder::new()
            .name("cairn-gc".into())
            .spawn(move || {
                let bg = fs.background.enter("gc");
                let mut slept = Duration::ZERO;
                while !fs.stopping.load(Ordering::SeqCst) {
                    fs.nap(Duration::from_millis(200));
                    slept += Duration::from_millis(200);
                    if slept < every {
                        continue;
                    }
                    slept = Duration::ZERO;
                    bg.lower();
                    match fs.gc(pct, rate, &|_, _| {}) {
                        Ok(r) if r.chunks_moved > 0 => tracing::info!(
                            "gc: {} chunks moved, {} segments freed",
                            r.chunks_moved,
                            r.segments_freed
                        ),
                        Ok(_) => {}
                        Err(e) => tracing::error!("gc failed: {}", fs.stop_on_invariant(e)),
                    }
                }
            })
            .expect("spawn gc");
        Some(h)
    }
}
