//! Mirrors kept in an object-store bucket (`cairn mirror copy SRC
//! s3:BUCKET/PREFIX...` and `cairn mirror restore s3:... POOL`): the
//! streams of a pool stored as objects under a prefix, incremental (each
//! copy adds the changes after the last one) and deduplicated by content
//! hash across copies (a chunk is uploaded once, as its own object). The
//! layout under the prefix (docs/FORMAT.md, "Mirrors in a bucket"):
//!
//! - `manifest`: the chain of streams (`manifest`), written last;
//! - `stream-<since>-<upto>`: a stream whose chunk frames carry no bytes;
//! - `chunk-<hash>`: one chunk's stored bytes (`objects`).
//!
//! A bucket holds one writer at a time (the copy that runs); any number
//! of pools may restore from it.

pub mod copy;
pub mod manifest;
pub mod objects;
pub mod prefetch;

use crate::error::{Result, StreamError};
use bytes::Bytes;
use cairn_data::Hash;
use cairn_objstore::ObjectClient;
use manifest::{Entry, Manifest};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

const MANIFEST: &str = "manifest";
/// Chunk objects uploaded at once by a copy.
const UPLOADERS: usize = 16;
/// Chunk objects downloaded at once by a restore, and how many it keeps
/// ahead of the stream it writes (at most one chunk, 64 KiB by default,
/// each).
const DOWNLOADERS: usize = 16;
const FETCH_WINDOW: usize = 64;

/// Checks an object sealed as `magic | body | crc32c of magic and body`
/// (the manifest and chunk objects) and returns its body. Errors name the
/// object (`what`) and, when it is not one at all, its `kind`.
fn unseal<'a>(b: &'a [u8], magic: &[u8; 8], what: &str, kind: &str) -> Result<&'a [u8]> {
    let damaged = |why: String| Err(StreamError::Damaged(format!("{what}: {why}")));
    if b.len() < magic.len() + 4 || !b.starts_with(magic) {
        return damaged(format!("not a Cairn {kind}"));
    }
    let (sealed, crc) = b.split_at(b.len() - 4);
    let crc = crate::frame::Body::new(crc, "object checksum").u32()?;
    if crc32c::crc32c(sealed) != crc {
        return damaged("checksum mismatch".into());
    }
    Ok(&sealed[magic.len()..])
}

/// A bucket prefix that holds (or will hold) a mirror.
pub struct Bucket {
    pub client: ObjectClient,
}

/// What a push to the bucket did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PushReport {
    pub since: u64,
    pub upto: u64,
    pub chunks_put: u64,
    pub chunk_bytes: u64,
    pub stream_bytes: u64,
    /// Stream objects of an earlier chain deleted (after a resync).
    pub streams_deleted: u64,
}

impl Bucket {
    pub fn new(client: ObjectClient) -> Bucket {
        Bucket { client }
    }

    /// The store key of `name` under the prefix.
    fn key(&self, name: &str) -> String {
        self.client.locator().key(name)
    }

    /// Names under the prefix that are not a mirror's objects (the prefix
    /// holds something else: a tier device's segments, another program's
    /// files), at most `n` of them.
    pub fn foreign_objects(&self, n: usize) -> Result<Vec<String>> {
        let ours = |k: &str| {
            k == MANIFEST || objects::hash_of_key(k).is_some() || k.starts_with("stream-")
        };
        let listed = self.client.list("")?;
        Ok(listed
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| !ours(k))
            .take(n)
            .collect())
    }

    /// The manifest, None where the prefix holds no mirror yet.
    pub fn manifest(&self) -> Result<Option<Manifest>> {
        match self.client.get(&self.key(MANIFEST)) {
            Ok(b) => Manifest::decode(&b).map(Some),
            Err(cairn_objstore::ObjError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Of `want`, the hashes whose chunk objects the bucket lacks: one
    /// HEAD each when they are fewer than the pages (1,000 keys each) of
    /// a LIST of the `known` chunk objects, else one LIST.
    pub fn lacking(&self, want: &[Hash], known: u64) -> Result<Vec<Hash>> {
        if (want.len() as u64) < known / 1000 {
            let mut out = Vec::new();
            for h in want {
                if self
                    .client
                    .head(&self.key(&objects::chunk_key(h)))?
                    .is_none()
                {
                    out.push(*h);
                }
            }
            return Ok(out);
        }
        let listed = self.client.list("chunk-")?;
        let held: HashSet<Hash> = listed
            .iter()
            .filter_map(|(k, _)| objects::hash_of_key(k))
            .collect();
        Ok(want
            .iter()
            .filter(|h| !held.contains(*h))
            .copied()
            .collect())
    }

    /// Stores the stream in file `stream` (as a pool read it, with the
    /// bytes of the chunks the bucket lacks) after the chain of `m`: its
    /// chunks as chunk objects, the rest as a stream object, then the
    /// manifest that names it. `restart` begins a new chain (the stream is
    /// a full one, read after the source pruned past the old chain's end);
    /// the old chain's stream objects are deleted once the new manifest
    /// is written.
    pub fn push(&self, m: &mut Manifest, stream: &Path, restart: bool) -> Result<PushReport> {
        let dir = stream.parent().unwrap_or(Path::new("."));
        let split = dir.join("split");
        let mut uploaded = HashSet::new();
        let s = self.uploading(|send| {
            let input = BufReader::with_capacity(1 << 20, std::fs::File::open(stream)?);
            let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(&split)?);
            let mut put = |h: &Hash, obj: Vec<u8>| match uploaded.insert(*h) {
                true => send(self.key(&objects::chunk_key(h)), Bytes::from(obj)),
                false => Ok(()),
            };
            let s = objects::split_stream(input, &mut out, &mut put)?;
            out.flush()?;
            Ok(s)
        })?;
        let from = if restart { 0 } else { m.upto() };
        if s.since != from {
            return Err(StreamError::Refused(format!(
                "the stream holds the changes after TID {:#x}, and the bucket's chain ends at {from:#x}",
                s.since
            )));
        }
        let mut rep = PushReport {
            since: s.since,
            upto: s.upto,
            chunks_put: uploaded.len() as u64,
            chunk_bytes: s.chunk_bytes,
            ..PushReport::default()
        };
        if s.upto == s.since {
            return Ok(rep);
        }
        let body = Bytes::from(std::fs::read(&split)?);
        let entry = Entry {
            since: s.since,
            upto: s.upto,
            bytes: body.len() as u64,
            hash: *blake3::hash(&body).as_bytes(),
        };
        rep.stream_bytes = entry.bytes;
        self.client.put_verified(&self.key(&entry.key()), body)?;
        let old = match restart {
            true => std::mem::take(&mut m.streams),
            false => Vec::new(),
        };
        m.streams.push(entry);
        m.chunks += rep.chunks_put;
        self.client
            .put_verified(&self.key(MANIFEST), Bytes::from(m.encode()))?;
        for e in old.iter().filter(|e| e.key() != entry.key()) {
            self.client.delete(&self.key(&e.key()))?;
            rep.streams_deleted += 1;
        }
        Ok(rep)
    }

    /// Runs `work`, which hands objects to upload to the `send` it is
    /// given; `UPLOADERS` threads upload them (each a verified PUT) as
    /// they come, at most twice that many waiting. Returns once every
    /// upload is done; the first failed upload fails the whole.
    fn uploading<T>(
        &self,
        work: impl FnOnce(&mut dyn FnMut(String, Bytes) -> Result<()>) -> Result<T>,
    ) -> Result<T> {
        let failed: Mutex<Option<StreamError>> = Mutex::new(None);
        let (tx, rx) = std::sync::mpsc::sync_channel::<(String, Bytes)>(2 * UPLOADERS);
        let rx = Mutex::new(rx);
        let out = std::thread::scope(|scope| {
            for _ in 0..UPLOADERS {
                scope.spawn(|| loop {
                    let next = rx.lock().recv();
                    let Ok((key, body)) = next else { return };
                    if let Err(e) = self.client.put_verified(&key, body) {
                        failed.lock().get_or_insert(e.into());
                    }
                });
            }
            let mut send = |key: String, body: Bytes| {
                if failed.lock().is_some() {
                    return Err(StreamError::Refused("an upload failed".into()));
                }
                tx.send((key, body))
                    .map_err(|_| StreamError::Refused("the uploaders stopped".into()))
            };
            let out = work(&mut send);
            drop(tx);
            out
        });
        match failed.into_inner() {
            Some(e) => Err(e),
            None => out,
        }
    }

    /// Downloads stream `e` of the chain into file `out` as a pool applies
    /// it: its hash checked against the manifest, and each chunk the pool
    /// lacks (`lacking`, asked once for all of the stream's chunks) given
    /// its bytes from its chunk object.
    pub fn fetch(
        &self,
        e: &Entry,
        out: &Path,
        lacking: &mut dyn FnMut(&[Hash]) -> Result<HashSet<Hash>>,
    ) -> Result<objects::SplitReport> {
        let body = self.client.get(&self.key(&e.key()))?;
        if body.len() as u64 != e.bytes || blake3::hash(&body).as_bytes() != &e.hash {
            return Err(StreamError::Damaged(format!(
                "stream object {}: not the {} bytes the manifest names (size or hash differ)",
                e.key(),
                e.bytes
            )));
        }
        let hashes = objects::chunk_hashes(&body[..])?;
        let need = lacking(&hashes)?;
        // The lacking chunks in the order the stream names them, each once.
        let mut seen = HashSet::new();
        let order: Vec<Hash> = (hashes.iter())
            .filter(|h| need.contains(*h) && seen.insert(**h))
            .copied()
            .collect();
        let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(out)?);
        let get = |h: &Hash| self.chunk(h);
        let rep = prefetch::in_order(&order, DOWNLOADERS, FETCH_WINDOW, get, |take| {
            let mut given = HashSet::new();
            let mut fetch = |h: &Hash| {
                if !need.contains(h) {
                    return Ok(None);
                }
                if !given.insert(*h) {
                    // A second frame of one chunk: fetched again.
                    return self.chunk(h).map(Some);
                }
                match take() {
                    Some(Ok(c)) if &c.hash == h => Ok(Some(c)),
                    Some(Err(err)) => Err(err),
                    _ => Err(StreamError::Damaged(format!(
                        "stream object {}: its chunk frames came in another order on a second reading",
                        e.key()
                    ))),
                }
            };
            objects::join_stream(&body[..], &mut w, &mut fetch)
        })?;
        w.flush()?;
        if (rep.since, rep.upto) != (e.since, e.upto) {
            return Err(StreamError::Damaged(format!(
                "stream object {} holds TIDs {:#x}..{:#x}",
                e.key(),
                rep.since,
                rep.upto
            )));
        }
        Ok(rep)
    }

    /// Downloads and decodes the chunk object of `h`.
    fn chunk(&self, h: &Hash) -> Result<cairn_fs::replica::StoredChunk> {
        let b = self.client.get(&self.key(&objects::chunk_key(h)))?;
        objects::decode_object(&b, h)
    }
}
