//! `cairn mirror copy SRC s3:...` and `cairn mirror restore s3:... POOL`:
//! a mirror kept in an object-store bucket (`cairn_mirror::bucket`). This
//! opens the bucket and the pools and says what was done; the copy and
//! the restore themselves are `cairn_mirror::bucket::copy`.

use crate::control::client::Session;
use crate::mirror::private_dir;
use crate::mirror_ends::PoolSource;
use anyhow::{bail, Result};
use cairn_mirror::bucket::copy as bucket_copy;
use cairn_mirror::bucket::Bucket;
use cairn_mirror::reply::{BucketCopyReply, RestoreReply};
use cairn_mirror::CopyOptions;
use cairn_objstore::{ClientOptions, Credentials, Locator, ObjectClient};
use std::path::Path;

/// Opens the bucket of `spec` with credentials from `creds_file` or the
/// environment.
pub fn open(spec: &str, creds_file: Option<&Path>) -> Result<Bucket> {
    let loc = Locator::parse(spec)?;
    let creds = Credentials::resolve(creds_file)?;
    let client = ObjectClient::new(&loc, &creds, ClientOptions::default())?;
    Ok(Bucket::new(client))
}

/// Brings the mirror in the bucket up to date with `src`.
pub fn copy(src: &Path, b: &Bucket, o: CopyOptions) -> Result<BucketCopyReply> {
    let dir = private_dir()?;
    let id = rand::random();
    Ok(bucket_copy::copy(&PoolSource(src), b, o, dir.path(), id)?)
}

/// Brings mirror pool `pool` up to date with the mirror in the bucket.
pub fn restore(b: &Bucket, pool: &Path) -> Result<RestoreReply> {
    let m = bucket_copy::restore_manifest(b)?;
    if !cairn_fs::pool::PoolPaths::superblock(pool).exists() && !mounted(pool) {
        bail!(
            "{} is not a pool: make an empty mirror pool first with `cairn mkfs {} --mirror`",
            pool.display(),
            pool.display()
        );
    }
    let dest = crate::mirror_ends::local(pool, Session::open_mirror(pool)?);
    let dir = private_dir()?;
    let r = bucket_copy::restore(b, &m, &dest, dir.path());
    let closed = dest.close();
    let r = r?;
    closed?;
    Ok(r)
}

fn mounted(p: &Path) -> bool {
    crate::control::client::resolve(p).is_ok()
}

pub fn describe_copy(v: &BucketCopyReply) -> String {
    let p = &v.bucket;
    format!(
        "bucket: TIDs {:#x}..{:#x}, {} new chunks ({} bytes), stream object {} bytes, chain of {} streams{}",
        p.since,
        p.upto,
        p.chunks_put,
        p.chunk_bytes,
        p.stream_bytes,
        p.streams,
        match p.resync {
            true => " (a new chain: the source had pruned past the old one)",
            false => "",
        }
    )
}

pub fn describe_restore(v: &RestoreReply) -> String {
    format!(
        "restored: {} streams up to TID {:#x}, {} chunks fetched ({} bytes)",
        v.streams,
        v.upto,
        v.chunks,
        v.chunk_bytes.map_or("0".into(), |b| b.to_string())
    )
}
