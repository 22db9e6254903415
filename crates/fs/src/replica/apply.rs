//! Applying a batch of a source's changes to a mirror: the chunks it
//! lacks are verified (checksums and content hash) and written as stored,
//! then every event is applied at its own TID in one metadata transaction,
//! with the chunk reference counts, history-only bytes and commit log kept
//! as a commit of the source would keep them. A batch that fails leaves
//! the mirror at its previous TID. A chunk is written in the layout its
//! file asks for (its own redundancy policy, which the stream carries as
//! an xattr), as the source's flush would write it.

use super::changes::{is_extent, Change, Event, StoredChunk};
use crate::error::{FsError, Result};
use crate::history::liveness::add_ref;
use crate::types::Extent;
use crate::vfs::Fs;
use cairn_data::chunk::header_of;
use cairn_data::{ChunkRec, Hash, Layout};
use cairn_devices::SlotAddr;
use cairn_meta::{ElemKey, MetaWrite, RecordType};
use std::collections::{BTreeSet, HashMap};

/// A chunk a batch names: its id on the source, its hash, and its bytes
/// when the mirror may not hold it.
#[derive(Debug, Clone)]
pub struct ChunkIn {
    pub src: u64,
    pub hash: Hash,
    pub data: Option<StoredChunk>,
}

/// The changes of the source's commits up to `upto`.
#[derive(Debug, Default)]
pub struct Batch {
    pub upto: u64,
    pub events: Vec<Event>,
    pub chunks: Vec<ChunkIn>,
    pub tids: Vec<(u64, u64)>,
    pub next_ino: u64,
    /// The source's snapshots, replacing the mirror's (the last batch).
    pub snapshots: Option<Vec<(String, Vec<u8>)>>,
    /// The source's orphans (inodes unlinked while open), replacing the
    /// mirror's (the last batch).
    pub orphans: Option<Vec<u64>>,
    /// A batch of an encrypted pool's stream: its creations are sealed
    /// (`Change::Sealed`), its snapshots as the source stores them, and its
    /// chunks keep the source's ids (sealed extents are not rewritten).
    pub sealed: bool,
}

/// Source chunk ids and where each is on the mirror.
type Locals = Vec<(u64, Local)>;

/// Where a source chunk is on the mirror: already held, or written now.
enum Local {
    Held(u64),
    New(ChunkRec),
}

impl Fs {
    /// Applies `b` on top of the mirror's last TID, with `ids` mapping the
    /// source's chunk ids to the mirror's (kept across the batches of one
    /// stream). Returns the mirror's new TID.
    pub fn apply_batch(&self, b: &Batch, ids: &mut HashMap<u64, u64>) -> Result<u64> {
        let mut last = self.flush_guard();
        if let Some(e) = b.events.iter().find(|e| e.tid <= *last) {
            return Err(FsError::BadRequest(format!(
                "a change at TID {:#x} does not follow the mirror's TID {:#x}",
                e.tid, *last
            )));
        }
        self.check_sealed(b)?;
        let (locals, mut touched) = self.store_chunks(b)?;
        let mut freed = Vec::new();
        let old_orphans = self.meta()?.orphans()?;
        let own = path_layouts(b).into_values().flatten();
        let mut more_copies = false;
        let r = self.pool.meta.write(|w| {
            // Paths given their own layout raise the metadata's copies
            // as on the source (`Fs::note_path_layout`).
            more_copies = crate::redundancy::raise_path_copies(w, own)?;
            self.map_chunks(w, locals, ids, b.sealed)?;
            let ended = apply_events(self, w, &b.events, ids, &mut touched)?;
            for tid in ended {
                self.settle_ended(w, tid, &mut touched, &mut freed)?;
            }
            for (tid, time) in &b.tids {
                w.log_tid(*tid, *time)?;
            }
            let next_ino = w.counter(cairn_meta::tables::NEXT_INO)?.max(b.next_ino);
            w.set_counter(cairn_meta::tables::NEXT_INO, next_ino)?;
            w.set_counter("last_tid", b.upto)?;
            match &b.snapshots {
                Some(snaps) if b.sealed => w.replace_snapshots_stored(snaps)?,
                Some(snaps) => replace_snapshots(w, snaps)?,
                None => {}
            }
            if let Some(orphans) = &b.orphans {
                for ino in old_orphans.iter().filter(|i| !orphans.contains(i)) {
                    w.remove_orphan(*ino)?;
                }
                for ino in orphans {
                    w.add_orphan(*ino)?;
                }
            }
            self.store_segments(w, &touched)
        });
        self.settle_write(r, &freed)?;
        *last = b.upto;
        if more_copies {
            self.raise_meta_copies();
        }
        // What the filesystem keeps of the committed state in RAM.
        self.drop_ns_meta();
        (self.next_ino).fetch_max(b.next_ino, std::sync::atomic::Ordering::SeqCst);
        if b.snapshots.is_some() {
            self.refresh_retained()?;
        }
        Ok(b.upto)
    }

    /// After a metadata write of a mirror's own (a batch, a rollback): the
    /// segments it freed are given back, or, when it failed, the chunk
    /// store's view of the segments is the committed one again.
    pub(super) fn settle_write<T>(&self, r: Result<T>, freed: &[SlotAddr]) -> Result<T> {
        match r {
            Ok(v) => {
                self.pool.chunks.release_slots(freed)?;
                Ok(v)
            }
            Err(e) => {
                let table = crate::pool::segment_table(&self.meta()?)?;
                self.pool.chunks.rollback(table)?;
                Err(e)
            }
        }
    }

    /// Finds each chunk of the batch on the mirror by hash, or verifies
    /// and writes it (as stored: compressed chunks stay compressed).
    fn store_chunks(&self, b: &Batch) -> Result<(Locals, BTreeSet<u64>)> {
        let mut out = Vec::new();
        let layouts = self.chunk_layouts(b)?;
        let mut batch = self.pool.chunks.batch();
        for c in &b.chunks {
            let held = match b.sealed {
                true => self.chunk_at(c.src, &c.hash)?,
                false => self.chunk_by_hash(&c.hash)?,
            };
            if let Some(id) = held {
                out.push((c.src, Local::Held(id)));
                continue;
            }
            let copied = match (&c.data, b.sealed) {
                // Held under another id (the source stored the same bytes
                // again after freeing them): copied, as a sealed extent
                // names the source's id.
                (None, true) => self.stored_by_hash(&c.hash)?,
                _ => None,
            };
            let Some(d) = c.data.as_ref().or(copied.as_ref()) else {
                return Err(FsError::BadRequest(format!(
                    "the stream expects the mirror to hold chunk {} (source id {}), and it does not: the mirror needs a full resync",
                    hex(&c.hash),
                    c.src
                )));
            };
            // Held without the key, a mirror cannot open a sealed chunk:
            // its form and fields are checked here, its bytes by the
            // frame's checksum, its seal when it is read with the key.
            match b.sealed && self.pool.keys.is_none() {
                true => verify_sealed_chunk(d, &c.hash)?,
                false => verify_chunk(batch.codec(), d, &c.hash)?,
            }
            batch.set_layout(layouts.get(&c.src).copied());
            let rec = batch.append_stored(d.method, d.raw_len, &d.stored, &c.hash)?;
            out.push((c.src, Local::New(rec)));
        }
        let segs = batch.finish()?;
        for (id, _) in &segs {
            self.pool.chunks.heat.written(*id);
        }
        Ok((out, segs.into_iter().map(|(id, _)| id).collect()))
    }

    /// The id `id` if the mirror holds that chunk with content hash `hash`
    /// (a sealed stream's chunks keep the source's ids); a record of
    /// other content there is an error (the mirror's ids left its source's).
    fn chunk_at(&self, id: u64, hash: &Hash) -> Result<Option<u64>> {
        let Some(raw) = self.meta()?.chunk(id)? else {
            return Ok(None);
        };
        match ChunkRec::decode(&raw)? {
            rec if rec.hash == *hash => Ok(Some(id)),
            _ => Err(FsError::BadRequest(format!(
                "the stream names chunk {id} with content {}, and the mirror holds other content under that id: it needs a fresh mirror and a full copy",
                hex(hash)
            ))),
        }
    }

    /// The stored bytes of the chunk with content hash `hash`, if the
    /// mirror holds one.
    fn stored_by_hash(&self, hash: &Hash) -> Result<Option<StoredChunk>> {
        match self.chunk_by_hash(hash)? {
            Some(id) => self.stored_chunk(&self.chunk_record(id)?).map(Some),
            None => Ok(None),
        }
    }

    /// A sealed batch goes only into a mirror whose values are sealed
    /// (held with or without the key), and a plain one only into a mirror
    /// whose are not.
    fn check_sealed(&self, b: &Batch) -> Result<()> {
        let sealed_here = self.is_sealed();
        let creations = b.events.iter().filter_map(|e| match &e.change {
            Change::End => None,
            Change::Create(_) => Some(false),
            Change::Sealed(_) => Some(true),
        });
        match (b.sealed == sealed_here, creations.clone().all(|s| s == b.sealed)) {
            (true, true) => Ok(()),
            (true, false) => Err(FsError::BadRequest(
                "a stream mixes sealed and plain changes".into(),
            )),
            (false, _) if b.sealed => Err(FsError::BadRequest(
                "the stream is of an encrypted pool and this mirror holds plain values: a mirror of an encrypted pool takes its source's key with its first stream (make a fresh one with `cairn mkfs --mirror`)".into(),
            )),
            (false, _) => Err(FsError::BadRequest(
                "the stream is of a pool that is not encrypted and this mirror is encrypted: mirror it into a mirror made without --encrypt".into(),
            )),
        }
    }

    /// The own layout of the file each chunk of `b` belongs to (by source
    /// id), as the batch leaves the file's policy attribute, else as the
    /// mirror holds it; chunks of files without one are absent (their
    /// tier's policy applies).
    fn chunk_layouts(&self, b: &Batch) -> Result<HashMap<u64, Layout>> {
        use crate::redundancy::path_policy::{parse, XATTR};
        let set = path_layouts(b);
        let mut file_of: HashMap<u64, u64> = HashMap::new();
        for e in &b.events {
            let key = ElemKey(e.key.clone());
            if let (Some(RecordType::Extent), Change::Create(p)) = (key.rtype(), &e.change) {
                for id in Extent::decode(p)?.chunks() {
                    file_of.entry(id).or_insert(key.obj());
                }
            }
        }
        let r = self.meta()?;
        let mut held: HashMap<u64, Option<Layout>> = HashMap::new();
        let mut out = HashMap::new();
        for (src, ino) in file_of {
            let layout = match set.get(&ino) {
                Some(l) => *l,
                None => match held.get(&ino) {
                    Some(l) => *l,
                    None => {
                        let key = ElemKey::new(ino, RecordType::Xattr, XATTR);
                        let l = r.get(&key)?.and_then(|e| parse(&e.payload));
                        *held.entry(ino).or_insert(l)
                    }
                },
            };
            if let Some(l) = layout {
                out.insert(src, l);
            }
        }
        Ok(out)
    }

    /// Records the batch's new chunks (their references are counted as the
    /// events name them) and maps every source id to a mirror id.
    fn map_chunks(
        &self,
        w: &mut MetaWrite<'_>,
        locals: Locals,
        ids: &mut HashMap<u64, u64>,
        sealed: bool,
    ) -> Result<()> {
        let mut next = w.counter("next_chunk")?;
        for (src, local) in locals {
            let id = match local {
                Local::Held(id) => id,
                // A sealed stream's chunk keeps the source's id; the dedup
                // index keeps the first id of each content.
                Local::New(mut rec) if sealed => {
                    (rec.refs, rec.live) = (0, 0);
                    w.put_new_chunk(src, &rec.encode())?;
                    if w.dedup(&rec.hash)?.is_none() {
                        w.put_dedup(&rec.hash, src)?;
                    }
                    next = next.max(src + 1);
                    src
                }
                Local::New(mut rec) => {
                    (rec.refs, rec.live) = (0, 0);
                    w.put_new_chunk(next, &rec.encode())?;
                    w.put_dedup(&rec.hash, next)?;
                    next += 1;
                    next - 1
                }
            };
            ids.insert(src, id);
        }
        w.set_counter("next_chunk", next)?;
        Ok(())
    }
}

/// Per inode, the own layout (redundancy policy attribute) of the paths
/// whose attribute `b` sets or removes, as the batch leaves it (None:
/// removed, or a value that names no layout).
fn path_layouts(b: &Batch) -> HashMap<u64, Option<Layout>> {
    use crate::redundancy::path_policy::{parse, XATTR};
    let mut set = HashMap::new();
    for e in &b.events {
        let key = ElemKey(e.key.clone());
        match (key.rtype(), &e.change) {
            (Some(RecordType::Xattr), Change::Create(v)) if key.sub() == XATTR => {
                set.insert(key.obj(), parse(v));
            }
            (Some(RecordType::Xattr), Change::End) if key.sub() == XATTR => {
                set.entry(key.obj()).or_insert(None);
            }
            _ => {}
        }
    }
    set
}

/// Applies the events in order; returns the TIDs at which extents ended
/// (their live references are settled after).
fn apply_events(
    fs: &Fs,
    w: &mut MetaWrite<'_>,
    events: &[Event],
    ids: &HashMap<u64, u64>,
    touched: &mut BTreeSet<u64>,
) -> Result<BTreeSet<u64>> {
    let mut ended = BTreeSet::new();
    for e in events {
        let key = ElemKey(e.key.clone());
        match &e.change {
            Change::End => {
                let old = w.end(&key, e.tid)?;
                if old.as_ref().map(|o| o.create_tid) != Some(e.create_tid) {
                    return Err(FsError::BadRequest(format!(
                        "the stream ends element {key} (created at TID {:#x}) at TID {:#x}, and the mirror does not hold it live",
                        e.create_tid, e.tid
                    )));
                }
                if is_extent(&e.key) {
                    ended.insert(e.tid);
                }
            }
            Change::Create(payload) => {
                let payload = match is_extent(&e.key) {
                    true => remap_extent(fs, w, payload, ids, touched)?,
                    false => payload.clone(),
                };
                w.put(&key, &payload, e.tid)?;
            }
            Change::Sealed(payload) => {
                for id in e.chunks()? {
                    // Sent (or held) in this stream, under its own id.
                    if ids.get(&id) != Some(&id) {
                        return Err(FsError::BadRequest(format!(
                            "the stream names chunk {id} without sending it"
                        )));
                    }
                    add_ref(fs, w, id, touched)?;
                }
                w.put_sealed(&key, payload, e.tid)?;
            }
        }
    }
    Ok(ended)
}

/// The extent with the mirror's chunk ids, each gaining a reference.
fn remap_extent(
    fs: &Fs,
    w: &mut MetaWrite<'_>,
    payload: &[u8],
    ids: &HashMap<u64, u64>,
    touched: &mut BTreeSet<u64>,
) -> Result<Vec<u8>> {
    let mut ext = Extent::decode(payload)?;
    let map = |src: u64| {
        ids.get(&src).copied().ok_or_else(|| {
            FsError::BadRequest(format!("the stream names chunk {src} without sending it"))
        })
    };
    ext.chunk = map(ext.chunk)?;
    for p in &mut ext.pieces {
        p.chunk = map(p.chunk)?;
    }
    for id in ext.chunks().collect::<Vec<_>>() {
        add_ref(fs, w, id, touched)?;
    }
    Ok(ext.encode())
}

fn replace_snapshots(w: &mut MetaWrite<'_>, snaps: &[(String, Vec<u8>)]) -> Result<()> {
    for (name, _) in w.snapshots()? {
        if !snaps.iter().any(|(n, _)| *n == name) {
            w.remove_snapshot(&name)?;
        }
    }
    for (name, rec) in snaps {
        w.put_snapshot(name, rec)?;
    }
    Ok(())
}

/// Checks stored bytes against their checksum and the content hash (an
/// encrypted chunk: its authentication, with the pool's key).
fn verify_chunk(codec: &cairn_data::ChunkCodec, d: &StoredChunk, hash: &Hash) -> Result<()> {
    if d.hash != *hash {
        return Err(FsError::BadRequest(
            "a chunk's hash does not match its frame".into(),
        ));
    }
    let encrypted = d.method & cairn_data::chunk::ENCRYPTED != 0;
    if encrypted != codec.is_encrypted() {
        return Err(FsError::BadRequest(match encrypted {
            true => "the stream is of an encrypted pool and this mirror is not encrypted: its chunks are kept only in a mirror that holds the source's key (mirrors of encrypted pools are not supported yet)".into(),
            false => "the stream is of a pool that is not encrypted and this mirror is encrypted: mirror it into a mirror made without --encrypt".into(),
        }));
    }
    let mut buf = Vec::with_capacity(cairn_data::CHUNK_HEADER_LEN + d.stored.len());
    header_of(d.method, d.raw_len as usize, &d.stored, hash).encode(&mut buf);
    buf.extend_from_slice(&d.stored);
    (codec.unseal(&buf, hash, true))
        .map(drop)
        .map_err(|e| FsError::BadRequest(format!("chunk {}: {e}", hex(hash))))
}

/// Checks a sealed stream's chunk without the key: its form says it is
/// sealed and its header's fields hold (lengths, form, hash); its bytes
/// came under the frame's checksum, and its seal is checked when it is
/// read with the key.
fn verify_sealed_chunk(d: &StoredChunk, hash: &Hash) -> Result<()> {
    if d.hash != *hash || d.method & cairn_data::chunk::ENCRYPTED == 0 {
        return Err(FsError::BadRequest(format!(
            "chunk {} of a sealed stream is not sealed, or not the one its frame names",
            hex(hash)
        )));
    }
    let mut buf = Vec::with_capacity(cairn_data::CHUNK_HEADER_LEN + d.stored.len());
    header_of(d.method, d.raw_len as usize, &d.stored, hash).encode(&mut buf);
    buf.extend_from_slice(&d.stored);
    (cairn_data::chunk::checked(&buf, hash).map(drop))
        .map_err(|e| FsError::BadRequest(format!("chunk {}: {e}", hex(hash))))
}

fn hex(h: &[u8]) -> String {
    h.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
