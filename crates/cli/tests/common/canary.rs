//! Canary scans for the encryption tests: the 16-byte windows of known
//! data, and how many places of a stored file hold one.

use std::collections::HashSet;
use std::path::Path;

/// The 16-byte windows of `data` at offsets that are multiples of 16:
/// any 31 contiguous bytes of `data` hold one of them.
pub fn windows(data: &[u8]) -> HashSet<[u8; 16]> {
    data.chunks_exact(16)
        .map(|w| w.try_into().unwrap())
        .collect()
}

/// How many places of `file` hold a window of `wins` (4 KiB blocks of
/// zeros skipped: device files are mostly unwritten).
pub fn hits_in(file: &Path, wins: &HashSet<[u8; 16]>) -> usize {
    let bytes = std::fs::read(file).unwrap();
    let mut hits = 0;
    let mut at = 0;
    while at + 16 <= bytes.len() {
        let block_end = (at / 4096 + 1) * 4096;
        if at % 4096 == 0
            && bytes[at..block_end.min(bytes.len())]
                .iter()
                .all(|&b| b == 0)
        {
            at = block_end;
            continue;
        }
        let w: &[u8; 16] = bytes[at..at + 16].try_into().unwrap();
        if wins.contains(w) {
            hits += 1;
            at += 16;
        } else {
            at += 1;
        }
    }
    hits
}

/// Every file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else if p.is_file() {
            out.push(p);
        }
    }
    out
}
