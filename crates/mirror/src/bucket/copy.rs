//! Copies into a bucket and restores out of one (`cairn mirror copy SRC
//! s3:...`, `cairn mirror restore s3:... POOL`). A copy reads the
//! source's changes after the bucket's chain (with the bytes of only the
//! chunks the bucket lacks), stores them and moves the source's hold; a
//! restore applies the chain, stream by stream, to a mirror pool, fetching
//! only the chunks that pool lacks. The pools are reached through the
//! `copy::Source` and `copy::Mirror` the command implements.

use super::manifest::Manifest;
use super::{objects, Bucket};
use crate::copy::{behind_horizon, read_negotiated, Mirror, Result, Source};
use crate::error::{CopyError, StreamError};
use crate::reply::{BucketCopyReply, BucketPush, RestoreReply, RoleName, StatusReply};
use crate::{negotiate, CopyOptions};
use cairn_data::Hash;
use std::collections::HashSet;
use std::path::Path;

/// The locator as shown to people (no credentials are ever part of it).
pub fn shown(b: &Bucket) -> String {
    let l = b.client.locator();
    format!("s3:{}/{} at {}", l.bucket, l.prefix, l.endpoint)
}

/// Brings the mirror in the bucket up to date with `src`, through files
/// in `dir`. `new_id` names the mirror if the bucket holds none yet.
pub fn copy(
    src: &dyn Source,
    b: &Bucket,
    o: CopyOptions,
    dir: &Path,
    new_id: [u8; 16],
) -> Result<BucketCopyReply> {
    let from = src.status()?;
    let source = uuid_bytes(&from.uuid)?;
    let mut m = match b.manifest()? {
        Some(m) => m,
        None => fresh_manifest(b, source, new_id)?,
    };
    if m.source != source {
        return Err(CopyError::BucketOtherSource {
            bucket: shown(b),
            bucket_source: objects::hex(&m.source),
            src: src.name(),
            src_uuid: from.uuid,
        });
    }
    let (since, restart) = chain_start(&from, m.upto(), o.resync, &src.name())?;
    let (file, read) = read_negotiated(src, since, o.batch_mib, dir, |w, l| {
        let want = negotiate::decode(&std::fs::read(w)?)?;
        let lack = b.lacking(&want, m.chunks)?;
        Ok(std::fs::write(l, negotiate::encode(&lack))?)
    })?;
    let p = b.push(&mut m, &file, restart)?;
    // The source keeps the history after the bucket's chain until the next
    // copy moves the hold (`cairn mirror release` drops it).
    src.hold(&objects::hex(&m.id), &shown(b), m.upto())?;
    let bucket = BucketPush {
        since: p.since,
        upto: p.upto,
        chunks_put: p.chunks_put,
        chunk_bytes: p.chunk_bytes,
        stream_bytes: p.stream_bytes,
        streams: count(m.streams.len()),
        streams_deleted: p.streams_deleted,
        resync: restart,
    };
    let requests = b.client.stats.snapshot();
    Ok(BucketCopyReply {
        read,
        bucket,
        requests,
    })
}

/// Where a copy into a bucket whose chain ends at `upto` starts, and
/// whether it starts a new chain: when the source (`from`) pruned past
/// `upto` it cannot send the changes after it, and only a resync (a new
/// chain from a full stream) goes on.
pub fn chain_start(from: &StatusReply, upto: u64, resync: bool, src: &str) -> Result<(u64, bool)> {
    match (behind_horizon(from, upto), resync) {
        (false, _) => Ok((upto, false)),
        (true, true) => Ok((0, true)),
        (true, false) => Err(CopyError::BucketBehindPrune {
            src: src.into(),
            since: upto,
        }),
    }
}

/// A new mirror in the bucket, refused on a prefix that holds other
/// objects (another pool's tier device, another program's files).
fn fresh_manifest(b: &Bucket, source: [u8; 16], id: [u8; 16]) -> Result<Manifest> {
    let foreign = b.foreign_objects(3)?;
    if !foreign.is_empty() {
        return Err(CopyError::ForeignObjects {
            bucket: shown(b),
            examples: foreign.join(", "),
        });
    }
    Ok(Manifest {
        id,
        source,
        chunks: 0,
        streams: Vec::new(),
    })
}

/// The manifest of the mirror in the bucket, which a restore needs.
pub fn restore_manifest(b: &Bucket) -> Result<Manifest> {
    b.manifest()?
        .ok_or_else(|| CopyError::NoManifest { bucket: shown(b) })
}

/// Brings mirror pool `pool` up to date with the chain of `m` in the
/// bucket, through files in `dir`.
pub fn restore(b: &Bucket, m: &Manifest, pool: &dyn Mirror, dir: &Path) -> Result<RestoreReply> {
    let tid = restore_from(&pool.status()?, m, &pool.name())?;
    let Some(first) = m.streams.iter().position(|e| e.since == tid) else {
        if tid == m.upto() {
            return Ok(RestoreReply {
                streams: 0,
                since: None,
                upto: tid,
                chunks: 0,
                chunk_bytes: None,
                requests: None,
            });
        }
        return Err(CopyError::RestoreOffChain {
            pool: pool.name(),
            tid,
        });
    };
    let (file, hashes, lacking) = (dir.join("stream"), dir.join("hashes"), dir.join("lacking"));
    let mut ask = |want: &[Hash]| -> crate::Result<HashSet<Hash>> {
        std::fs::write(&hashes, negotiate::encode(want))?;
        (pool.lacking(&hashes, &lacking)).map_err(|e| StreamError::Refused(chain(&*e)))?;
        let l = negotiate::decode(&std::fs::read(&lacking)?)?;
        Ok(l.into_iter().collect())
    };
    let (mut chunks, mut chunk_bytes) = (0, 0);
    for e in &m.streams[first..] {
        let f = b.fetch(e, &file, &mut ask)?;
        (chunks, chunk_bytes) = (chunks + f.chunks, chunk_bytes + f.chunk_bytes);
        pool.write(&file)?;
    }
    Ok(RestoreReply {
        streams: count(m.streams.len() - first),
        since: Some(tid),
        upto: m.upto(),
        chunks,
        chunk_bytes: Some(chunk_bytes),
        requests: Some(b.client.stats.snapshot()),
    })
}

/// The TID a restore into the pool of status `at` (named `pool`) starts
/// after: 0 for an unbound mirror, its TID for a mirror of the bucket's
/// source; any other pool is refused.
pub fn restore_from(at: &StatusReply, m: &Manifest, pool: &str) -> Result<u64> {
    let bucket_source = objects::hex(&m.source);
    match (at.role, &at.source) {
        (RoleName::Unbound, _) => Ok(0),
        (RoleName::Mirror, Some(s)) if *s == bucket_source => Ok(at.tid),
        (RoleName::Mirror, s) => Err(CopyError::RestoreOtherSource {
            pool: pool.into(),
            pool_source: s.clone().unwrap_or_else(|| "?".into()),
            bucket_source,
        }),
        (r, _) => Err(CopyError::RestoreNotAMirror {
            pool: pool.into(),
            role: r.as_str(),
        }),
    }
}

/// A pool uuid (32 hex digits) as bytes.
pub fn uuid_bytes(s: &str) -> Result<[u8; 16]> {
    let bad = || CopyError::BadReply(format!("a pool uuid '{s}' from the source"));
    if s.len() != 32 || !s.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// An error and its causes, as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let m = c.to_string();
        if !out.contains(&m) {
            out = format!("{out}: {m}");
        }
        cause = c.source();
    }
    out
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
