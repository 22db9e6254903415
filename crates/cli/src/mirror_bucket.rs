//! `cairn mirror copy SRC s3:...` and `cairn mirror restore s3:... POOL`:
//! a mirror kept in an object-store bucket (`cairn_mirror::bucket`). A
//! copy reads the source's changes after the bucket's chain (with the
//! bytes of only the chunks the bucket lacks), stores them and moves the
//! source's hold; a restore applies the chain, stream by stream, to a
//! mirror pool here, fetching only the chunks that pool lacks.

use crate::control::client::{call, Session};
use crate::control::protocol::Request;
use anyhow::{bail, Context, Result};
use cairn_mirror::bucket::manifest::Manifest;
use cairn_mirror::bucket::Bucket;
use cairn_objstore::{ClientOptions, Credentials, Locator, ObjectClient};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::Path;

/// Opens the bucket of `spec` with credentials from `creds_file` or the
/// environment.
pub fn open(spec: &str, creds_file: Option<&Path>) -> Result<Bucket> {
    let loc = Locator::parse(spec)?;
    let creds = Credentials::resolve(creds_file)?;
    let client = ObjectClient::new(&loc, &creds, ClientOptions::default())?;
    Ok(Bucket::new(client))
}

/// The locator as shown to people (no credentials are ever part of it).
fn shown(b: &Bucket) -> String {
    let l = b.client.locator();
    format!("s3:{}/{} at {}", l.bucket, l.prefix, l.endpoint)
}

/// Brings the mirror in the bucket up to date with `src`.
pub fn copy(src: &Path, b: &Bucket, resync: bool, batch_mib: u64) -> Result<Value> {
    let from = call(src, Request::MirrorStatus)?;
    let source = uuid_bytes(from["uuid"].as_str().unwrap_or_default())?;
    let mut m = match b.manifest()? {
        Some(m) => m,
        None => fresh_manifest(b, source)?,
    };
    if m.source != source {
        bail!(
            "{} holds a mirror of pool {}, and {} is pool {}",
            shown(b),
            hex(&m.source),
            src.display(),
            hex(&source)
        );
    }
    let mut since = m.upto();
    let restart = super::mirror::behind_horizon(&from, since);
    if restart && !resync {
        bail!(
            "{} pruned past TID {since:#x}, where the bucket's chain ends: copy with --resync to start a new chain with a full stream (chunks the bucket holds are not uploaded again)",
            src.display()
        );
    }
    if restart {
        since = 0;
    }
    let dir = super::mirror::private_dir()?;
    let (file, r) = super::mirror::read_negotiated(src, since, batch_mib, dir.path(), |w, l| {
        let want = cairn_mirror::negotiate::decode(&std::fs::read(w)?)?;
        let lack = b.lacking(&want, m.chunks)?;
        Ok(std::fs::write(l, cairn_mirror::negotiate::encode(&lack))?)
    })?;
    let p = b.push(&mut m, &file, restart)?;
    // The source keeps the history after the bucket's chain until the next
    // copy moves the hold (`cairn mirror release` drops it).
    let hold = Request::MirrorHold {
        mirror: hex(&m.id),
        at: shown(b),
        tid: m.upto(),
    };
    call(src, hold)?;
    Ok(json!({
        "read": r,
        "bucket": { "since": p.since, "upto": p.upto, "chunks_put": p.chunks_put,
            "chunk_bytes": p.chunk_bytes, "stream_bytes": p.stream_bytes,
            "streams": m.streams.len(), "streams_deleted": p.streams_deleted, "resync": restart },
        "requests": b.client.stats.snapshot(),
    }))
}

/// A new mirror in the bucket, refused on a prefix that holds other
/// objects (another pool's tier device, another program's files).
fn fresh_manifest(b: &Bucket, source: [u8; 16]) -> Result<Manifest> {
    let foreign = b.foreign_objects(3)?;
    if !foreign.is_empty() {
        bail!(
            "{} holds objects that are not a Cairn mirror ({}...): give the mirror a prefix of its own",
            shown(b),
            foreign.join(", ")
        );
    }
    Ok(Manifest {
        id: rand::random(),
        source,
        chunks: 0,
        streams: Vec::new(),
    })
}

/// Brings mirror pool `pool` up to date with the mirror in the bucket.
pub fn restore(b: &Bucket, pool: &Path) -> Result<Value> {
    let m = b
        .manifest()?
        .with_context(|| format!("{} holds no Cairn mirror (no manifest)", shown(b)))?;
    if !cairn_fs::pool::PoolPaths::superblock(pool).exists() && !mounted(pool) {
        bail!(
            "{} is not a pool: make an empty mirror pool first with `cairn mkfs {} --mirror`",
            pool.display(),
            pool.display()
        );
    }
    let s = Session::open(pool)?;
    let r = restore_in(b, &m, &s, pool);
    s.close()?;
    r
}

fn restore_in(b: &Bucket, m: &Manifest, s: &Session, pool: &Path) -> Result<Value> {
    let at = s.call(Request::MirrorStatus)?;
    let tid = match at["role"].as_str() {
        Some("unbound") => 0,
        Some("mirror") if at["source"] == hex(&m.source) => at["tid"].as_u64().unwrap_or(0),
        Some("mirror") => bail!(
            "{} mirrors pool {}, and the bucket holds pool {}",
            pool.display(),
            at["source"].as_str().unwrap_or("?"),
            hex(&m.source)
        ),
        r => bail!(
            "{} is not a mirror pool (role: {}): restore into a pool made with `cairn mkfs POOL --mirror`",
            pool.display(),
            r.unwrap_or("?")
        ),
    };
    let Some(first) = m.streams.iter().position(|e| e.since == tid) else {
        if tid == m.upto() {
            return Ok(json!({ "streams": 0, "upto": tid, "chunks": 0 }));
        }
        bail!(
            "{} is at TID {tid:#x}, which no stream of the bucket starts at (the bucket's chain was restarted by a resync): restore into a new mirror pool",
            pool.display()
        );
    };
    let dir = super::mirror::private_dir()?;
    let (file, hashes, lacking) = (
        dir.path().join("stream"),
        dir.path().join("hashes"),
        dir.path().join("lacking"),
    );
    let mut ask = |want: &[cairn_data::Hash]| -> cairn_mirror::Result<HashSet<cairn_data::Hash>> {
        std::fs::write(&hashes, cairn_mirror::negotiate::encode(want))?;
        let req = Request::MirrorLacking {
            path: text(&hashes),
            out: text(&lacking),
        };
        s.call(req)
            .map_err(|e| cairn_mirror::StreamError::Refused(crate::error_chain(&e)))?;
        let l = cairn_mirror::negotiate::decode(&std::fs::read(&lacking)?)?;
        Ok(l.into_iter().collect())
    };
    let (mut chunks, mut chunk_bytes) = (0, 0);
    for e in &m.streams[first..] {
        let f = b.fetch(e, &file, &mut ask)?;
        (chunks, chunk_bytes) = (chunks + f.chunks, chunk_bytes + f.chunk_bytes);
        s.call(Request::MirrorWrite {
            path: text(&file),
            force: false,
        })?;
    }
    Ok(
        json!({ "streams": m.streams.len() - first, "since": tid, "upto": m.upto(),
        "chunks": chunks, "chunk_bytes": chunk_bytes, "requests": b.client.stats.snapshot() }),
    )
}

fn mounted(p: &Path) -> bool {
    crate::control::client::resolve(p).is_ok()
}

fn text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn hex(b: &[u8]) -> String {
    cairn_mirror::bucket::objects::hex(b)
}

fn uuid_bytes(s: &str) -> Result<[u8; 16]> {
    let bad = || anyhow::anyhow!("a pool uuid '{s}' from the source");
    if s.len() != 32 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

pub fn describe_copy(v: &Value) -> String {
    let p = &v["bucket"];
    format!(
        "bucket: TIDs {:#x}..{:#x}, {} new chunks ({} bytes), stream object {} bytes, chain of {} streams{}",
        p["since"].as_u64().unwrap_or(0),
        p["upto"].as_u64().unwrap_or(0),
        p["chunks_put"],
        p["chunk_bytes"],
        p["stream_bytes"],
        p["streams"],
        match p["resync"] == true {
            true => " (a new chain: the source had pruned past the old one)",
            false => "",
        }
    )
}

pub fn describe_restore(v: &Value) -> String {
    format!(
        "restored: {} streams up to TID {:#x}, {} chunks fetched ({} bytes)",
        v["streams"],
        v["upto"].as_u64().unwrap_or(0),
        v["chunks"],
        v["chunk_bytes"]
    )
}
