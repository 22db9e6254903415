//! Helpers shared by the fs-layer tests: a pool in a test directory
//! (sparse devices: tests share the host) and reopening it, which after a
//! drop without `shutdown` is what a restart after a crash sees.

#![allow(dead_code)]

pub mod sparse;

use cairn_fs::{mkfs, Ctx, Fs, MkfsOptions, Pool, ROOT_INO};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

/// `POOL` under `dir`, made with one 64 MiB sparse ssd device inside it
/// (`data.0`; crash images of it fit in memory), not opened.
pub fn one_device_pool(dir: &Path) -> std::path::PathBuf {
    use cairn_devices::{DeviceClass, DeviceSpec};
    let pool = dir.join("pool");
    let spec = DeviceSpec::tier(DeviceClass::Ssd, pool.join("data.0"), Some(64 << 20));
    let o = MkfsOptions {
        devices: vec![spec],
        sparse: true,
        ..MkfsOptions::default()
    };
    mkfs(&pool, o).unwrap();
    pool
}

/// Puts every file under `dir` back as the crash `images` have it:
/// written from them, and removed when they do not have it (what an
/// earlier recovery created), except those `keep` names (by path relative
/// to `dir`).
pub fn restore(dir: &Path, images: &cairn_devices::backend::Images, keep: impl Fn(&Path) -> bool) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let t = e.file_type().unwrap();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            if t.is_dir() {
                stack.push(p);
            } else if t.is_file() && !images.contains_key(&rel) && !keep(&rel) {
                std::fs::remove_file(&p).unwrap();
            }
        }
    }
    cairn_devices::backend::write_images(dir, images).unwrap();
}

/// A new pool with default options under `dir`, opened.
pub fn make(dir: &Path) -> Arc<Fs> {
    let o = MkfsOptions {
        sparse: true,
        ..MkfsOptions::default()
    };
    mkfs(&dir.join("pool"), o).unwrap();
    reopen(dir)
}

/// `make` with the intent log in the pool directory's file (as pools made
/// before logs went to devices), for tests that read or damage the file.
pub fn make_file_log(dir: &Path) -> Arc<Fs> {
    let o = MkfsOptions {
        sparse: true,
        intent_log: cairn_fs::pool::log_home::LogHome::PoolDir,
        ..MkfsOptions::default()
    };
    mkfs(&dir.join("pool"), o).unwrap();
    reopen(dir)
}

/// Opens the pool under `dir` again.
pub fn reopen(dir: &Path) -> Arc<Fs> {
    Fs::open(Pool::open(&dir.join("pool"), None).unwrap()).unwrap()
}

/// The inode of file `name` in the root directory, made if missing.
pub fn file_in_root(fs: &Fs, name: &str) -> u64 {
    match fs.lookup(ROOT_INO, name.as_bytes()) {
        Ok(i) => i.ino,
        Err(_) => {
            fs.create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644)
                .unwrap()
                .ino
        }
    }
}

/// Incompressible bytes from a seed.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

pub mod workload;

/// Starts a flush on a thread of `s` and returns once it has sealed the
/// changes it commits (its commit under way); `done` is set when it ends.
/// Joining the handle gives the flush's result.
pub fn flush_in_background<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    fs: &'s Fs,
    done: &'s AtomicBool,
) -> std::thread::ScopedJoinHandle<'s, cairn_fs::Result<()>> {
    let flushed = s.spawn(move || {
        let r = fs.flush();
        done.store(true, SeqCst);
        r
    });
    let t0 = std::time::Instant::now();
    while !fs.committing() {
        assert!(t0.elapsed().as_secs() < 10, "the flush never sealed");
        assert!(!done.load(SeqCst), "the commit ended unseen");
    }
    flushed
}
