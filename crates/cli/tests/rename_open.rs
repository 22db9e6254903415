//! The atomic-replace pattern on a real mount: one thread writes a temp file
//! and renames it over `dir/article` again and again while readers open and
//! read `dir/article`. The name always exists, so no open may fail (the
//! kernel may open the inode the rename just unlinked: Cairn must keep it
//! while the kernel holds lookups of it), and every read returns one whole
//! version.

mod common;

use common::*;
use std::fs;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Versions the writer publishes (fewer if `MAX_TIME` runs out first).
const VERSIONS: u64 = 4000;
const READERS: usize = 2;
const MAX_TIME: Duration = Duration::from_secs(120);

/// Version `n`: a header naming the version and the length, then bytes
/// derived from both. Lengths vary so a mix of two versions shows.
fn version(n: u64) -> Vec<u8> {
    let len = 64 + (n * 7919 % 20_000) as usize;
    let mut v = format!("version {n:010} length {len:010}\n").into_bytes();
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

/// The version a buffer holds whole, or None.
fn parse(buf: &[u8]) -> Option<u64> {
    let head = std::str::from_utf8(buf.get(..37)?).ok()?;
    let n: u64 = head.strip_prefix("version ")?.get(..10)?.parse().ok()?;
    (version(n) == buf).then_some(n)
}

#[test]
fn open_during_rename_over_never_fails() {
    let mut fs = Fs::new();
    let dir = fs.p("dir");
    fs::create_dir(&dir).unwrap();
    let article = dir.join("article");
    fs::write(&article, version(0)).unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for r in 0..READERS {
        let (done, published, article) = (done.clone(), published.clone(), article.clone());
        readers.push(thread::spawn(move || {
            let mut reads = 0u64;
            let mut buf = Vec::new();
            while !done.load(Ordering::SeqCst) {
                // Versions published before the open are not older than this.
                let floor = published.load(Ordering::SeqCst);
                let mut f = fs::File::open(&article).unwrap_or_else(|e| {
                    panic!("reader {r}: open after {reads} reads, version {floor}: {e}")
                });
                buf.clear();
                f.read_to_end(&mut buf)
                    .unwrap_or_else(|e| panic!("reader {r}: read: {e}"));
                let n = parse(&buf).unwrap_or_else(|| {
                    panic!(
                        "reader {r}: not one whole version ({} bytes, starts {:?})",
                        buf.len(),
                        String::from_utf8_lossy(&buf[..buf.len().min(37)])
                    )
                });
                assert!(
                    n >= floor,
                    "reader {r}: read version {n}, but {floor} was published before the open"
                );
                reads += 1;
            }
            reads
        }));
    }

    let t0 = Instant::now();
    let mut n = 1;
    while n <= VERSIONS && t0.elapsed() < MAX_TIME {
        let tmp = dir.join(format!(".article.tmp{n}"));
        fs::write(&tmp, version(n)).unwrap();
        fs::rename(&tmp, &article).unwrap();
        published.store(n, Ordering::SeqCst);
        n += 1;
    }
    done.store(true, Ordering::SeqCst);
    let reads: Vec<u64> = readers.into_iter().map(|h| h.join().unwrap()).collect();
    println!(
        "{} versions published, reads per reader {reads:?}, {:?}",
        n - 1,
        t0.elapsed()
    );
    assert!(n > 500, "only {} versions in {MAX_TIME:?}", n - 1);
    assert_eq!(parse(&fs::read(&article).unwrap()), Some(n - 1));
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "temp files left");
    fs.unmount();
    fs.check();
}
