//! The two-way exchange of `cairn mirror copy|stream`: before a stream is
//! read, the source lists the content hashes of the chunks it would send
//! (`candidates`), the mirror answers with those it lacks (`lacking`), and
//! the stream then carries only their bytes. A one-way stream (a file, a
//! pipe) skips only the chunks the mirror held at its TID
//! (`Held::AtSince`). The lists are files of 32-byte hashes (at most
//! `MAX_HASHES`).

use crate::error::{Result, StreamError};
use crate::frame::Body;
use cairn_data::Hash;
use cairn_fs::Fs;
use std::collections::HashSet;

/// Hashes a list holds at most (a stream of 1 TiB of new 64 KiB chunks).
pub const MAX_HASHES: usize = 1 << 24;

/// The hashes of the chunks a stream after `since` would send the bytes
/// of (named by its new extents; the mirror's answer decides).
pub fn candidates(fs: &Fs, since: u64) -> Result<Vec<Hash>> {
    let c = fs.changes_since(since)?;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for e in &c.events {
        for id in e.chunks()? {
            if seen.insert(id) {
                out.push(fs.chunk_record(id)?.hash);
            }
        }
    }
    Ok(out)
}

/// Of `hashes`, those the pool does not hold.
pub fn lacking(fs: &Fs, hashes: &[Hash]) -> Result<Vec<Hash>> {
    let mut out = Vec::new();
    for h in hashes {
        if fs.chunk_by_hash(h)?.is_none() {
            out.push(*h);
        }
    }
    Ok(out)
}

pub fn encode(hashes: &[Hash]) -> Vec<u8> {
    hashes.concat()
}

pub fn decode(b: &[u8]) -> Result<Vec<Hash>> {
    if !b.len().is_multiple_of(32) || b.len() / 32 > MAX_HASHES {
        return Err(StreamError::Damaged(format!(
            "a hash list of {} bytes",
            b.len()
        )));
    }
    let mut hashes = Body::new(b, "hash list");
    (0..b.len() / 32).map(|_| hashes.array()).collect()
}
