//! The figures that scan the pool (`maintenance::info::pool_info`: files,
//! logical bytes, dedup and compression ratios), refreshed by a thread
//! every `metrics_scan_interval_secs` rather than at each request, so that
//! a scrape never walks the metadata.

use cairn_fs::maintenance::info::PoolInfo;
use cairn_fs::Fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The last scan and when it was made.
#[derive(Default)]
pub(crate) struct ScanCache {
    last: Mutex<Option<(Instant, Arc<PoolInfo>)>>,
}

impl ScanCache {
    pub fn get(&self) -> Option<(Instant, Arc<PoolInfo>)> {
        self.last.lock().ok()?.clone()
    }

    fn refresh(&self, fs: &Fs) {
        match cairn_fs::maintenance::info::pool_info(fs.pool()) {
            Ok(i) => {
                if let Ok(mut l) = self.last.lock() {
                    *l = Some((Instant::now(), Arc::new(i)));
                }
            }
            Err(e) => tracing::warn!("metrics: scanning the pool: {e}"),
        }
    }
}

/// Scans now, then every `every` until `stop` is set.
pub(crate) fn spawn(
    fs: Arc<Fs>,
    cache: Arc<ScanCache>,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("cairn-http-scan".into())
        .spawn(move || {
            let mut last: Option<Instant> = None;
            while !stop.load(Ordering::Relaxed) {
                if last.is_none_or(|t| t.elapsed() >= every) {
                    cache.refresh(&fs);
                    last = Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
}
