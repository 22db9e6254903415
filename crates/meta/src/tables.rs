//! The redb tables that make up the metadata store (see docs/format/metadata.md).

use redb::TableDefinition;

/// Live elements: element key -> (create_tid, payload).
pub const LIVE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("live_v1");
/// Ended elements: element key | create_tid -> (delete_tid, payload).
pub const HIST: TableDefinition<&[u8], &[u8]> = TableDefinition::new("hist_v1");
/// Index of ended elements by delete_tid, for prune: (delete_tid, hist key).
pub const ENDS: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("ends_v1");
/// Ended elements not yet merged into `HIST`: (delete_tid, hist key) ->
/// the value `HIST` will hold. An append, where an insert into `HIST` lands
/// at a random place; merged in sorted batches (`store/hist_lazy.rs`).
pub const FRESH: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("fresh_v1");
/// Chunk records (data layer encoding): chunk id -> ChunkRec.
pub const CHUNKS: TableDefinition<u64, &[u8]> = TableDefinition::new("chunks_v1");
/// Segment table (data layer encoding): segment id -> SegmentRec.
pub const SEGMENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("segments_v1");
/// Stripes (data layer encoding): stripe id -> StripeRec (parity over
/// the segments of an `ec=K+M` layout).
pub const STRIPES: TableDefinition<u64, &[u8]> = TableDefinition::new("stripes_v1");
/// Counters: "last_tid", "next_ino", "next_chunk", "next_segment", ...
pub const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters_v1");
/// The counter of inode numbers: above every inode with elements
/// (`MetaRead::may_hold_inode`).
pub const NEXT_INO: &str = "next_ino";
/// Commit log: tid -> unix time of the commit in nanoseconds.
pub const TIDS: TableDefinition<u64, u64> = TableDefinition::new("tids_v1");
/// Inode number epochs: first inode number a writable open could hand out
/// -> that open's epoch (1, 2, ...), the generation of the inodes numbered
/// from there on (FUSE file handles; see `MetaWrite::begin_ino_epoch`).
pub const INO_EPOCHS: TableDefinition<u64, u64> = TableDefinition::new("ino_epochs_v1");
/// Ended elements removed without history (nohistory objects): (delete
/// TID, history key), so that mirror streams still send their ends.
pub const GONE: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("gone_v1");
/// Index of live elements by create TID: (create_tid, element key) -> ().
/// Every element of the live table, so that "created after TID t" is a
/// range (mirror streams), and the entries of elements ended since the last
/// batch of removals, which readers skip (`store/born_lazy.rs`); brought
/// up to date at open when `BORN_TID` is not the last TID.
pub const BORN: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("born_v1");
/// Inodes with no links that were still open: removed at next mount.
pub const ORPHANS: TableDefinition<u64, ()> = TableDefinition::new("orphans_v1");
/// Devices of the pool: device id -> JSON description (versioned).
pub const DEVICES: TableDefinition<u32, &[u8]> = TableDefinition::new("devices_v1");
/// Snapshots: name -> snapshot record (filesystem layer encoding, versioned
/// and checksummed). A snapshot is a retained TID.
pub const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots_v1");
/// Dedup index: the first 6 bytes of a chunk's BLAKE3 -> chunk id (48-bit
/// little-endian). 12 bytes per unique block: an entry is a
/// candidate that the caller confirms against the full hash in the chunk
/// record, so it needs no checksum of its own (redb checksums its pages).
pub const DEDUP: TableDefinition<[u8; 6], [u8; 6]> = TableDefinition::new("dedup_v2");
/// The first dedup index (full hash -> ver | chunk id | crc), converted to
/// dedup_v2 when a pool is opened.
pub const DEDUP_V1: TableDefinition<&[u8], &[u8]> = TableDefinition::new("dedup_v1");

/// The counter of write transactions (in COUNTERS): of two metadata
/// copies that both pass their check, the one with more is the newer.
pub const WRITES: &str = "writes";

/// The counter (in COUNTERS) holding the last TID at the end of the last
/// write transaction that left `BORN` exact: no removal waiting
/// (`store/born_lazy.rs`).
pub const BORN_TID: &str = "born_tid";

/// The counter (in COUNTERS) holding the last TID at the end of the last
/// write transaction that left every new entry in `BORN`.
pub const BORN_INSERTED: &str = "born_inserted";

/// The counter (in COUNTERS) below which every stored chunk has its entry
/// in `DEDUP` (or lost it to a newer chunk sharing its key): entries of
/// newer chunks wait in RAM (`dedup/pending.rs`) and are indexed again at
/// open (`MetaStore::reindex_dedup`).
pub const DEDUP_INDEXED: &str = "dedup_indexed";

/// The counter (in COUNTERS) holding a TID up to which every ended
/// extent's live reference decrement is made (`store/live_lazy.rs`).
pub const LIVE_TID: &str = "live_tid";

/// The counter (in COUNTERS) saying what the chunk records' live counts
/// are: absent or 0 before they existed (recounted at open), 1 exact, 2
/// exact but for the decrements of the ends after `LIVE_TID`.
pub const LIVE_REFS: &str = "live_refs";

/// The counter (in COUNTERS) of merges of `FRESH` into `HIST`: a read
/// view's own value says which merges its snapshot holds
/// (`store/hist_lazy.rs`).
pub const HIST_MERGES: &str = "hist_merges";
