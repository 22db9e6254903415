//! Crash images: the files as a power loss could leave them, built from
//! the files at the start of recording (`read_images`) and a prefix of a
//! trace (`trace.rs`). Pure functions, seeded: one (trace, point, mode,
//! seed) always gives the same images.
//!
//! The model, per file: a change (write, length change, punched hole) is
//! durable once a later sync of the same file completed before the crash
//! point; every other change may or may not have reached the disk, which
//! the mode decides. Length changes follow the same rule as writes (they
//! are metadata that fdatasync also makes durable). A file's existence is
//! taken to be durable as soon as it was opened (directory entries are
//! not modelled). Kept changes apply in trace order.

use super::rng::SplitMix64;
use super::Event;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};

/// Every file's bytes, by the name events use (relative to the pool
/// directory, or absolute for files outside it).
pub type Images = BTreeMap<PathBuf, Vec<u8>>;

/// What happened to the changes no sync covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashMode {
    /// Every one is lost.
    DropUnsynced,
    /// Each is kept or lost independently (even odds): the disk wrote
    /// some of them, in any order.
    KeepRandomSubset,
    /// All are kept but the last write, which is torn at a 512-byte
    /// sector boundary inside it: only a prefix of it reached the disk
    /// (possibly none of it; a write within one sector is all or nothing,
    /// here nothing).
    TearLast,
}

/// Sector size for torn writes.
pub const SECTOR: u64 = 512;

/// The changes among the first `k` events of `trace` that are on disk
/// after a crash there, in order (a torn write as its prefix).
pub fn surviving(trace: &[Event], k: usize, mode: CrashMode, seed: u64) -> Vec<Event> {
    let events = &trace[..k.min(trace.len())];
    let mut last_sync: HashMap<&Path, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if let Event::Sync { file } = e {
            last_sync.insert(file, i);
        }
    }
    let synced = |i: usize, e: &Event| last_sync.get(e.file()).is_some_and(|&s| i < s);
    let mut rng = SplitMix64::new(seed);
    let torn = match mode {
        CrashMode::TearLast => events
            .iter()
            .enumerate()
            .rposition(|(i, e)| matches!(e, Event::Write { .. }) && !synced(i, e)),
        _ => None,
    };
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if matches!(e, Event::Sync { .. }) {
            continue;
        }
        if synced(i, e) {
            out.push(e.clone());
            continue;
        }
        match mode {
            CrashMode::DropUnsynced => {}
            CrashMode::KeepRandomSubset => {
                if rng.chance(0.5) {
                    out.push(e.clone());
                }
            }
            CrashMode::TearLast if Some(i) == torn => out.extend(tear(e, &mut rng)),
            CrashMode::TearLast => out.push(e.clone()),
        }
    }
    out
}

/// The prefix of a write up to a random sector boundary inside it (None:
/// nothing of it).
#[allow(
    clippy::cast_possible_truncation,
    reason = "test backend: offsets within a write's data; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
fn tear(e: &Event, rng: &mut SplitMix64) -> Option<Event> {
    let Event::Write { file, off, data } = e else {
        return Some(e.clone());
    };
    let end = off + data.len() as u64;
    let first = (off / SECTOR + 1) * SECTOR;
    let inside = if first < end {
        (end - 1 - first) / SECTOR + 1
    } else {
        0
    };
    // Cut points: the write's start (nothing kept) and every boundary
    // strictly inside it.
    let pick = rng.below(inside + 1);
    if pick == 0 {
        return None;
    }
    let cut = first + (pick - 1) * SECTOR;
    Some(Event::Write {
        file: file.clone(),
        off: *off,
        data: data[..(cut - off) as usize].to_vec(),
    })
}

/// Applies one change to the images (a file not there starts empty).
#[allow(
    clippy::cast_possible_truncation,
    reason = "test backend: offsets within an in-memory image; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
pub fn apply(images: &mut Images, e: &Event) {
    if matches!(e, Event::Sync { .. }) {
        return;
    }
    let img = images.entry(e.file().to_path_buf()).or_default();
    match e {
        Event::Write { off, data, .. } => {
            let (at, end) = (*off as usize, *off as usize + data.len());
            if img.len() < end {
                img.resize(end, 0);
            }
            img[at..end].copy_from_slice(data);
        }
        Event::SetLen { len, .. } => img.resize(*len as usize, 0),
        Event::Punch { off, len, .. } => {
            let at = (*off as usize).min(img.len());
            let end = (*off + *len).min(img.len() as u64) as usize;
            img[at..end].fill(0);
        }
        Event::Sync { .. } => {}
    }
}

/// The files after a crash once `k` events of `trace` had happened,
/// starting from `base` (the files when recording began).
pub fn crash_images(
    base: &Images,
    trace: &[Event],
    k: usize,
    mode: CrashMode,
    seed: u64,
) -> Images {
    let mut images = base.clone();
    for e in trace[..k.min(trace.len())].iter() {
        if !matches!(e, Event::Sync { .. }) {
            images.entry(e.file().to_path_buf()).or_default();
        }
    }
    for e in surviving(trace, k, mode, seed) {
        apply(&mut images, &e);
    }
    images
}

/// Crash images for a series of increasing crash points of one trace,
/// without replaying it from the start for each: the changes a sync made
/// durable are applied once, as the cursor passes the sync. `images`
/// gives exactly what `crash_images` gives for the same point, mode and
/// seed (a crash-point sweep asks for thousands).
pub struct Replay<'t> {
    trace: &'t [Event],
    /// Events passed so far.
    pos: usize,
    /// Every file with the changes a sync before `pos` covered.
    durable: Images,
    /// Per file, the changes since its last sync (trace indices, in order).
    pending: HashMap<PathBuf, Vec<usize>>,
}

impl<'t> Replay<'t> {
    pub fn new(base: Images, trace: &'t [Event]) -> Self {
        Replay {
            trace,
            pos: 0,
            durable: base,
            pending: HashMap::new(),
        }
    }

    /// Moves the crash point to `k` events (never backwards).
    pub fn advance(&mut self, k: usize) {
        let k = k.min(self.trace.len());
        assert!(k >= self.pos, "a replay only moves forward");
        for i in self.pos..k {
            let e = &self.trace[i];
            let file = e.file().to_path_buf();
            if matches!(e, Event::Sync { .. }) {
                for j in self.pending.remove(&file).unwrap_or_default() {
                    apply(&mut self.durable, &self.trace[j]);
                }
            } else {
                self.durable.entry(file.clone()).or_default();
                self.pending.entry(file).or_default().push(i);
            }
        }
        self.pos = k;
    }

    /// The files after a crash at the current point.
    pub fn images(&self, mode: CrashMode, seed: u64) -> Images {
        let mut out = self.durable.clone();
        let mut unsynced: Vec<usize> = self.pending.values().flatten().copied().collect();
        unsynced.sort_unstable();
        let torn = match mode {
            CrashMode::TearLast => unsynced
                .iter()
                .rev()
                .find(|&&i| matches!(self.trace[i], Event::Write { .. }))
                .copied(),
            _ => None,
        };
        let mut rng = SplitMix64::new(seed);
        for i in unsynced {
            let e = &self.trace[i];
            let kept = match mode {
                CrashMode::DropUnsynced => None,
                CrashMode::KeepRandomSubset => rng.chance(0.5).then(|| e.clone()),
                CrashMode::TearLast if Some(i) == torn => tear(e, &mut rng),
                CrashMode::TearLast => Some(e.clone()),
            };
            if let Some(e) = kept {
                apply(&mut out, &e);
            }
        }
        out
    }
}

/// Largest file `read_images` takes into memory.
pub const MAX_IMAGE: u64 = 1 << 30;

/// The regular files under `root` (recursively, by path relative to it;
/// symlinks, sockets and other special files are skipped) and the files
/// `extra` names (devices outside the root, by absolute canonical path,
/// or relative when under it), as recording starts. Files above
/// `MAX_IMAGE` are refused: give test devices a size.
pub fn read_images(root: &Path, extra: &[PathBuf]) -> io::Result<Images> {
    let root = root.canonicalize()?;
    let mut out = Images::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let p = entry?.path();
            let t = std::fs::symlink_metadata(&p)?.file_type();
            if t.is_dir() {
                dirs.push(p);
            } else if t.is_file() {
                out.insert(
                    p.strip_prefix(&root)
                        .expect("read_dir of a directory under root")
                        .to_path_buf(),
                    read_one(&p)?,
                );
            }
        }
    }
    for p in extra {
        let key = super::path_key(p);
        let name = key.strip_prefix(&root).unwrap_or(&key).to_path_buf();
        out.insert(name, read_one(p)?);
    }
    Ok(out)
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "test backend: the length of a file image held in memory; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
fn read_one(p: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(p)?;
    let len = f.seek_end()?;
    if len > MAX_IMAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: {len} bytes is too large for a crash image",
                p.display()
            ),
        ));
    }
    let mut v = Vec::with_capacity(len as usize);
    f.read_to_end(&mut v)?;
    Ok(v)
}

trait SeekEnd {
    fn seek_end(&mut self) -> io::Result<u64>;
}

impl SeekEnd for std::fs::File {
    /// Length (block devices too), leaving the position at the start.
    fn seek_end(&mut self) -> io::Result<u64> {
        use std::io::{Seek, SeekFrom};
        let n = self.seek(SeekFrom::End(0))?;
        self.seek(SeekFrom::Start(0))?;
        Ok(n)
    }
}

/// Writes the images as files under `dir` (directories made as needed,
/// mode 0700; files 0600), leaving all-zero 4 KiB blocks as holes. Names
/// must be relative: an absolute one (a device outside the pool) is
/// refused, place it with `write_image`.
pub fn write_images(dir: &Path, images: &Images) -> io::Result<()> {
    for (name, bytes) in images {
        if name.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: absolute image name (use write_image)", name.display()),
            ));
        }
        let p = dir.join(name);
        if let Some(parent) = p.parent() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(crate::private::DIR_MODE)
                .create(parent)?;
        }
        write_image(&p, bytes)?;
    }
    Ok(())
}

/// Replaces the file at `path` by `bytes`, sparse where they are zero.
pub fn write_image(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    const BLOCK: usize = 4096;
    let f = super::open_host(path, &super::OpenHow::REPLACE)?;
    f.set_len(bytes.len() as u64)?;
    let mut run: Option<usize> = None;
    for (i, b) in bytes.chunks(BLOCK).enumerate() {
        let zero = b.iter().all(|&x| x == 0);
        match (zero, run) {
            (false, None) => run = Some(i * BLOCK),
            (true, Some(start)) => {
                f.write_all_at(&bytes[start..i * BLOCK], start as u64)?;
                run = None;
            }
            _ => {}
        }
    }
    if let Some(start) = run {
        f.write_all_at(&bytes[start..], start as u64)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod tests {
    use super::*;

    fn base() -> Images {
        Images::from([(PathBuf::from("a"), vec![1u8; 8])])
    }

    fn img<'a>(i: &'a Images, f: &str) -> &'a [u8] {
        &i[Path::new(f)]
    }

    #[test]
    fn synced_changes_are_kept_and_unsynced_ones_dropped() {
        let t = vec![
            Event::write("a", 0, b"xy"),
            Event::write("b", 0, b"bb"),
            Event::sync("a"),
            Event::write("a", 4, b"zz"),
            Event::set_len("a", 2),
            Event::sync("b"),
        ];
        let all = crash_images(&base(), &t, t.len(), CrashMode::DropUnsynced, 0);
        assert_eq!(img(&all, "a"), b"xy\x01\x01\x01\x01\x01\x01");
        assert_eq!(img(&all, "b"), b"bb");
        // Before b's sync: b exists (it was opened) but holds nothing.
        let early = crash_images(&base(), &t, 5, CrashMode::DropUnsynced, 0);
        assert_eq!(img(&early, "b"), b"");
        // Before a's sync: a is as it was.
        let none = crash_images(&base(), &t, 2, CrashMode::DropUnsynced, 0);
        assert_eq!(img(&none, "a"), &[1u8; 8]);
        // A sync of the file completes the length change too.
        let mut t2 = t.clone();
        t2.push(Event::sync("a"));
        let cut = crash_images(&base(), &t2, t2.len(), CrashMode::DropUnsynced, 0);
        assert_eq!(img(&cut, "a"), b"xy");
    }

    #[test]
    fn random_subset_is_seeded_and_varies() {
        let mut t = vec![Event::write("a", 0, b"s"), Event::sync("a")];
        for i in 0..16u64 {
            t.push(Event::write("a", 1 + i, &[b'A' + i as u8]));
        }
        let base = Images::from([(PathBuf::from("a"), vec![1u8; 32])]);
        let run = |seed| crash_images(&base, &t, t.len(), CrashMode::KeepRandomSubset, seed);
        assert_eq!(run(3), run(3), "same seed, same images");
        let outcomes: std::collections::HashSet<Vec<u8>> =
            (0..20).map(|s| img(&run(s), "a").to_vec()).collect();
        assert!(outcomes.len() > 10, "subsets vary with the seed");
        for o in &outcomes {
            assert_eq!(o[0], b's', "the synced write is always there");
            for (i, &b) in o.iter().enumerate().skip(1) {
                assert!(b == 1 || b == b'A' + (i - 1) as u8, "{o:?}");
            }
        }
    }

    #[test]
    fn tear_keeps_a_sector_prefix_of_the_last_write() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8 + 1).collect();
        let t = vec![
            Event::write("f", 0, &[9u8; 100]),
            Event::write("f", 1000, &data),
        ];
        let mut cuts = std::collections::HashSet::new();
        for seed in 0..200 {
            let i = crash_images(&Images::new(), &t, 2, CrashMode::TearLast, seed);
            let f = img(&i, "f");
            assert_eq!(&f[..100], &[9u8; 100], "earlier unsynced writes are kept");
            let kept = f.len().saturating_sub(1000);
            assert!(kept < 4096, "torn");
            let end = 1000 + kept as u64;
            assert!(
                kept == 0 || end.is_multiple_of(SECTOR),
                "cut at a sector boundary: {end}"
            );
            assert_eq!(&f[1000.min(f.len())..], &data[..kept]);
            cuts.insert(kept);
        }
        // Boundaries at 1024..4608 step 512 (8) plus "nothing".
        assert_eq!(cuts.len(), 9, "{cuts:?}");
        let again = |s| crash_images(&Images::new(), &t, 2, CrashMode::TearLast, s);
        assert_eq!(again(5), again(5));
    }

    #[test]
    fn images_round_trip_through_files_sparsely() {
        let d = tempfile::tempdir().unwrap();
        let mut big = vec![0u8; 64 << 10];
        big[5000] = 7;
        big[60 << 10] = 8;
        let imgs = Images::from([
            (PathBuf::from("x/y/big"), big.clone()),
            (PathBuf::from("small"), b"abc".to_vec()),
            (PathBuf::from("empty"), vec![]),
        ]);
        write_images(d.path(), &imgs).unwrap();
        let back = read_images(d.path(), &[]).unwrap();
        assert_eq!(back, imgs);
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(d.path().join("x/y/big")).unwrap();
        assert!(m.blocks() * 512 < 64 << 10, "zero blocks left as holes");
        let abs = Images::from([(PathBuf::from("/abs"), vec![1])]);
        assert!(write_images(d.path(), &abs).is_err());
    }

    #[test]
    fn replay_gives_what_crash_images_gives() {
        let mut rng = SplitMix64::new(7);
        let files = ["a", "b", "c"];
        let mut t = Vec::new();
        for _ in 0..300 {
            let f = files[rng.below(3) as usize];
            t.push(match rng.below(6) {
                0 => Event::sync(f),
                1 => Event::set_len(f, rng.below(3000)),
                2 => Event::punch(f, rng.below(2000), rng.below(700)),
                _ => {
                    let n = 1 + rng.below(1500) as usize;
                    let data: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                    Event::write(f, rng.below(2500), &data)
                }
            });
        }
        let mut replay = Replay::new(base(), &t);
        for k in (0..=t.len()).step_by(7) {
            replay.advance(k);
            for mode in [
                CrashMode::DropUnsynced,
                CrashMode::KeepRandomSubset,
                CrashMode::TearLast,
            ] {
                let want = crash_images(&base(), &t, k, mode, k as u64);
                assert!(replay.images(mode, k as u64) == want, "{mode:?} at {k}");
            }
        }
    }
}
