//! Pieces shared by the randomized tree tests (model.rs, history.rs): a scan
//! of what exists under a plain-directory oracle, and a generator of names,
//! targets, offsets and lengths biased to the cases that break filesystems
//! (EOF, holes, 64 KiB block boundaries, names that exist already).

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::fs;
use std::path::Path;

pub const NAMES: &[&str] = &[
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "g",
    "h",
    "longer-name-0123456789",
    "ünï",
];

/// What exists in the oracle tree right now (relative paths).
#[derive(Default)]
pub struct Snap {
    pub files: Vec<(String, u64)>,
    pub links: Vec<String>,
    pub dirs: Vec<String>, // includes "" (the root)
}

pub fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

fn scan(root: &Path, rel: &str, s: &mut Snap) {
    s.dirs.push(rel.to_string());
    for e in fs::read_dir(root.join(rel)).unwrap() {
        let e = e.unwrap();
        let r = join(rel, e.file_name().to_str().unwrap());
        let md = fs::symlink_metadata(e.path()).unwrap();
        if md.is_dir() {
            scan(root, &r, s);
        } else if md.file_type().is_symlink() {
            s.links.push(r);
        } else {
            s.files.push((r, md.len()));
        }
    }
}

impl Snap {
    pub fn of(root: &Path) -> Snap {
        let mut s = Snap::default();
        scan(root, "", &mut s);
        s
    }
    pub fn exists(&self, p: &str) -> bool {
        self.files.iter().any(|(f, _)| f == p)
            || self.links.iter().any(|l| l == p)
            || self.dirs.iter().any(|d| d == p)
    }
    pub fn entries(&self) -> Vec<String> {
        let files = self.files.iter().map(|(f, _)| f.clone());
        files
            .chain(self.links.iter().cloned())
            .chain(self.dirs.iter().filter(|d| !d.is_empty()).cloned())
            .collect()
    }
    pub fn nondirs(&self) -> Vec<String> {
        let files = self.files.iter().map(|(f, _)| f.clone());
        files.chain(self.links.iter().cloned()).collect()
    }
}

pub struct Gen {
    pub rng: StdRng,
}

impl Gen {
    /// A name that does not exist yet, in a directory at most 3 deep. Never
    /// an existing symlink, so opening it cannot escape the root.
    pub fn fresh(&mut self, s: &Snap) -> String {
        for attempt in 0.. {
            let dir = s.dirs.choose(&mut self.rng).unwrap();
            let dir = if dir.matches('/').count() >= 2 {
                ""
            } else {
                dir.as_str()
            };
            let name = match attempt {
                0..10 => NAMES.choose(&mut self.rng).unwrap().to_string(),
                _ => format!("n{}", self.rng.gen_range(0..1000)),
            };
            let cand = join(dir, &name);
            if !s.exists(&cand) {
                return cand;
            }
        }
        unreachable!()
    }

    /// Destination for rename/link/symlink: fresh, or with probability
    /// `p_existing` an existing entry.
    pub fn target(&mut self, s: &Snap, p_existing: f64) -> String {
        let existing = s.entries();
        if self.rng.gen_bool(p_existing) && !existing.is_empty() {
            existing.choose(&mut self.rng).unwrap().clone()
        } else {
            self.fresh(s)
        }
    }

    /// Offsets biased to 0, EOF, holes and 64 KiB block boundaries.
    pub fn offset(&mut self, size: u64) -> u64 {
        let r = &mut self.rng;
        let mode = if size > 1_500_000 {
            2
        } else {
            r.gen_range(0..6)
        };
        match mode {
            0 => 0,
            1 => size,
            2 => r.gen_range(0..=size),
            3 => (r.gen_range(0..=size / 65_536 + 1) * 65_536 + r.gen_range(0..200))
                .saturating_sub(100),
            4 => size + r.gen_range(1..70_000),
            _ => r.gen_range(0..=size.min(600_000) + 1000),
        }
    }

    /// Write lengths: mostly small, some across blocks, a few large.
    pub fn length(&mut self, max: usize) -> usize {
        match self.rng.gen_range(0..10) {
            0..=4 => self.rng.gen_range(1..4096),
            5..=7 => self.rng.gen_range(4096..70_000),
            _ => self.rng.gen_range(70_000..max),
        }
    }

    /// New sizes for truncate: 0, shrink, grow, block multiples.
    pub fn new_len(&mut self, size: u64) -> u64 {
        match self.rng.gen_range(0..5) {
            0 => 0,
            1 => self.rng.gen_range(0..=size),
            2 => size + self.rng.gen_range(1..200_000),
            3 => self.rng.gen_range(0..8) * 65_536,
            _ => (size / 65_536 * 65_536 + 1).min(2_000_000),
        }
    }
}
