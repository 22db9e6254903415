//! The changes committed after a TID: because every element carries its
//! create and delete TIDs, and the metadata indexes live elements by create
//! TID and ended ones by delete TID, they are two range reads, not a tree
//! walk. Each creation and each ending is an event at its TID; events are
//! sorted by TID, endings first, so that applying them in order passes
//! through every committed state of the source.

use crate::error::{FsError, Result};
use crate::types::Extent;
use crate::vfs::Fs;
use cairn_data::{ChunkRec, Hash};
use cairn_meta::element::Opaque;
use cairn_meta::{Element, RecordType};
use std::collections::HashSet;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The element is created with this payload.
    Create(Vec<u8>),
    /// The element of an encrypted pool is created with this payload,
    /// sealed (`cairn_meta::element::Opaque`: an extent's with its chunk
    /// ids in the clear): what a mirror stream of an encrypted pool
    /// carries, stored by the mirror as it is.
    Sealed(Vec<u8>),
    /// The live element (created at `create_tid`) ends.
    End,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub tid: u64,
    pub key: Vec<u8>,
    pub create_tid: u64,
    pub change: Change,
}

impl Event {
    /// The chunks a created extent names (none for other events).
    pub fn chunks(&self) -> Result<Vec<u64>> {
        match (&self.change, is_extent(&self.key)) {
            (Change::Create(p), true) => Ok(Extent::decode(p)?.chunks().collect()),
            (Change::Sealed(p), true) => Ok((Opaque(p).chunks(&self.key)?).unwrap_or_default()),
            _ => Ok(Vec::new()),
        }
    }
}

pub(crate) fn is_extent(key: &[u8]) -> bool {
    cairn_meta::ElemKey(key.to_vec()).rtype() == Some(RecordType::Extent)
}

/// Everything committed after `since`, up to `upto` (the last commit).
#[derive(Debug, Default)]
pub struct Changes {
    pub since: u64,
    pub upto: u64,
    pub events: Vec<Event>,
    /// (tid, commit time ns) of the commits after `since`.
    pub tids: Vec<(u64, u64)>,
    pub snapshots: Vec<(String, Vec<u8>)>,
    /// Inodes unlinked while open (their elements stay live until closed).
    pub orphans: Vec<u64>,
    pub next_ino: u64,
}

/// A chunk as stored: compressed chunks travel compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredChunk {
    pub hash: Hash,
    pub method: u8,
    pub raw_len: u32,
    pub stored: Vec<u8>,
}

impl Fs {
    /// The changes after `since`. Refused when the pool is behind `since`
    /// or pruned history past it (a mirror that far behind needs a full
    /// resync: its deletions since are gone from the source).
    pub fn changes_since(&self, since: u64) -> Result<Changes> {
        let r = self.meta()?;
        let upto = r.counter("last_tid")?;
        if since > upto {
            return Err(FsError::BadRequest(format!(
                "this pool is at TID {upto:#x}, before the requested {since:#x}: not the source of that mirror, or rolled back"
            )));
        }
        let pruned = r.counter("pruned_tid")?;
        let snaps = crate::history::snapshot::read_snapshots(&r)?;
        // Prune keeps all that a snapshot sees: the changes after a
        // snapshot's TID are all here, whatever the horizon.
        let at_snapshot = snaps.iter().any(|s| s.tid == since);
        if since > 0 && since < pruned && !at_snapshot {
            let from = snaps
                .iter()
                .filter(|s| s.tid <= since)
                .max_by_key(|s| s.tid);
            return Err(FsError::BadRequest(match from {
                Some(s) => format!(
                    "this pool pruned its history up to TID {pruned:#x}, past the mirror's TID {since:#x}: the mirror needs a resync from snapshot {} (TID {:#x}), the newest at or before its TID (cairn mirror copy --resync)",
                    s.name, s.tid
                ),
                None => format!(
                    "this pool pruned its history up to TID {pruned:#x}, past the mirror's TID {since:#x}, and holds no snapshot at or before it: the mirror needs a full resync (cairn mkfs --force --mirror, then a full copy)"
                ),
            }));
        }
        if self.pool.meta.is_opaque() {
            return Err(FsError::BadRequest(
                "this mirror is held without its key: streams are read from it only with the key (give --key-file)".into(),
            ));
        }
        let mut c = Changes {
            since,
            upto,
            tids: r.tids_after(since)?,
            snapshots: match self.pool.keys.is_some() {
                true => r.snapshots_stored()?,
                false => r.snapshots()?,
            },
            orphans: r.orphans()?,
            next_ino: r.counter(cairn_meta::tables::NEXT_INO)?,
            ..Changes::default()
        };
        // Creations of live elements from their index; ended elements (and
        // their creations, when after `since`) from the ends index: reading
        // what changed, not the whole tree.
        for e in r.born_after(since)? {
            c.push_create(e);
        }
        for e in r.ended_after(since)? {
            c.push_end(&e);
            if e.create_tid > since {
                c.push_create(e);
            }
        }
        // Ends of nohistory objects' elements, removed at their commit.
        for (tid, key, create_tid) in r.gone_after(since)? {
            if create_tid <= since {
                c.events.push(Event {
                    tid,
                    key,
                    create_tid,
                    change: Change::End,
                });
            }
        }
        if let Some(keys) = &self.pool.keys {
            seal_events(&keys.elements, &mut c.events)?;
        }
        let end_first = |e: &Event| !matches!(e.change, Change::End);
        c.events.sort_by_key(|e| (e.tid, end_first(e)));
        // One read view: every change is after `since` and up to `upto`,
        // and an element ends after it was made (the mirror applies them
        // as such, `apply_batch`).
        debug_assert!(c
            .events
            .iter()
            .all(|e| { e.tid > since && e.tid <= upto && (e.create_tid < e.tid || end_first(e)) }));
        Ok(c)
    }

    /// The chunk of record `rec` as stored, fully verified.
    pub fn stored_chunk(&self, rec: &ChunkRec) -> Result<StoredChunk> {
        let (method, stored) = self.pool.chunks.read_stored(rec)?;
        Ok(StoredChunk {
            hash: rec.hash,
            method,
            raw_len: rec.raw_len,
            stored,
        })
    }

    /// The id of the chunk whose content hash is `hash`, if the pool
    /// holds one (the dedup index, confirmed against the chunk record).
    pub fn chunk_by_hash(&self, hash: &Hash) -> Result<Option<u64>> {
        let r = self.meta()?;
        let Some(id) = r.dedup(hash)? else {
            return Ok(None);
        };
        let rec = r.chunk(id)?.map(|raw| ChunkRec::decode(&raw)).transpose()?;
        Ok(rec.filter(|c| &c.hash == hash && c.refs > 0).map(|_| id))
    }
}

/// Seals each creation's payload for a stream of an encrypted pool,
/// bound to its key and create TID as the pool's own values are, with an
/// extent's chunk ids in the clear (the mirror counts references from
/// them without the key).
fn seal_events(s: &cairn_crypt::Sealer, events: &mut [Event]) -> Result<()> {
    for e in events {
        if let Change::Create(p) = &e.change {
            let ids: Option<Vec<u64>> = match is_extent(&e.key) {
                true => Some(Extent::decode(p)?.chunks().collect()),
                false => None,
            };
            e.change = Change::Sealed(Opaque::seal(s, &e.key, e.tid, p, ids.as_deref()));
        }
    }
    Ok(())
}

impl Changes {
    fn push_create(&mut self, e: Element) {
        self.events.push(Event {
            tid: e.create_tid,
            key: e.key.0,
            create_tid: e.create_tid,
            change: Change::Create(e.payload),
        });
    }

    fn push_end(&mut self, e: &Element) {
        self.events.push(Event {
            tid: e.delete_tid,
            key: e.key.0.clone(),
            create_tid: e.create_tid,
            change: Change::End,
        });
    }
}

impl Fs {
    /// The chunks that elements visible at `since` name: a mirror at
    /// `since` holds them, so a one-way stream need not carry their bytes
    /// (a two-way one asks the mirror instead). One pass over all elements.
    pub fn held_at(&self, since: u64) -> Result<HashSet<u64>> {
        let r = self.meta()?;
        let mut held = HashSet::new();
        let mut fail = None;
        let mut each = |e: Element| {
            let seen = e.create_tid <= since && e.delete_tid > since;
            if seen && is_extent(e.key.as_bytes()) {
                match Extent::decode(&e.payload) {
                    Ok(x) => held.extend(x.chunks()),
                    Err(x) => {
                        fail.get_or_insert(x);
                    }
                }
            }
        };
        r.for_each_live(&mut each)?;
        r.for_each_hist(&mut each)?;
        match fail {
            Some(e) => Err(e),
            None => Ok(held),
        }
    }
}

impl Fs {
    /// The record of chunk `id`.
    pub fn chunk_record(&self, id: u64) -> Result<ChunkRec> {
        let raw = self.meta()?.chunk(id)?;
        let raw = raw.ok_or_else(|| FsError::Io(format!("chunk {id} has no record")))?;
        Ok(ChunkRec::decode(&raw)?)
    }
}
