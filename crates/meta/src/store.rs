//! The metadata store: one redb database holding the versioned element key
//! space and the pool's tables. Reads run in read transactions (snapshots,
//! never blocked by the writer); all changes of one flush group are one write
//! transaction committed with immediate durability.

use crate::dedup;
use crate::dedup::pending::Pending;
use crate::element::{decode_value, encode_value, hist_key, split_hist_key, Element};
use crate::error::{MetaError, Result};
use crate::key::{prefix_end, ElemKey};
use crate::mirror::{Mirror, MirrorStats};
use crate::pagecache::{CachedFile, PageCache};
use crate::tables::*;
use crate::TID_MAX;
use cairn_devices::{Backend, HostStorage, OpenHow, Storage};
use redb::{
    Database, Durability, ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable,
    ReadableTableMetadata, Table,
};
use std::collections::HashMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

mod born_lazy;
mod by_tid;
mod hist_lazy;
mod live_lazy;
mod rollback;
use born_lazy::{BornPending, BornRepair, BornTxn};
pub use hist_lazy::FreshIndex;
use hist_lazy::{ended_value, FreshKey, FreshView};
use live_lazy::DebtsTxn;
pub use live_lazy::{Debts, LiveDebts, OWING};
pub use rollback::RolledBack;

pub struct MetaStore {
    /// Replaced by `reopen` after a failed write (redb refuses every later
    /// operation on a handle whose file write failed); None while closed,
    /// when a reopen failed (every operation then errs).
    db: parking_lot::RwLock<Option<Database>>,
    /// How to open the file again (None for stores not opened from a file).
    reopen: Option<ReopenWith>,
    /// The two copies, when the metadata is mirrored (`mirror.rs`).
    mirror: parking_lot::Mutex<Option<Arc<Mirror>>>,
    /// What `ensure_headroom` last made sure of, to skip the stat and
    /// fallocate while the file cannot have grown since.
    headroom: Headroom,
    /// Dedup index entries not yet in the table (`dedup/pending.rs`).
    pending: Arc<Pending>,
    /// Removals from the creation index not yet made (`born_lazy.rs`).
    born_waiting: BornPending,
    /// Live reference decrements not yet made (`live_lazy.rs`).
    live_waiting: LiveDebts,
    /// Where the ended elements not yet merged into `hist_v1` are
    /// (`hist_lazy.rs`).
    fresh_index: Arc<FreshIndex>,
    /// Held for the whole of `write`, past redb's commit, until the
    /// waiting entries and removals are brought up to date.
    writes: parking_lot::Mutex<()>,
}

/// The file's length changes only inside a write transaction (or a
/// reopen): `changes` is bumped when one starts and when it ends, and
/// `ensured` is the (changes, bytes) of the last headroom made sure of.
#[derive(Default)]
struct Headroom {
    changes: std::sync::atomic::AtomicU64,
    ensured: parking_lot::Mutex<Option<(u64, u64)>>,
}

impl Headroom {
    fn bump(&self) {
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The current change count, and whether `bytes` are known ensured.
    fn known(&self, bytes: u64) -> (u64, bool) {
        let now = self.changes.load(std::sync::atomic::Ordering::SeqCst);
        let ok = matches!(*self.ensured.lock(), Some((c, b)) if c == now && bytes <= b);
        (now, ok)
    }
}

struct ReopenWith {
    path: std::path::PathBuf,
    /// The second copy's file, when mirrored.
    mirror: Option<std::path::PathBuf>,
    cache_bytes: usize,
    pages: Arc<PageCache>,
    storage: Arc<dyn Storage>,
    /// For allocating room ahead of the file's end (`ensure_headroom`).
    file: Arc<dyn Backend>,
}

/// Bumps the headroom's change count when a write transaction ends, however
/// it ends.
struct BumpOnDrop<'a>(&'a Headroom);

impl Drop for BumpOnDrop<'_> {
    fn drop(&mut self) {
        self.0.bump();
    }
}

/// Decodes a stored live element.
fn live_element(key: &[u8], v: &[u8]) -> Result<Element> {
    let (create_tid, payload) = decode_value(key, v)?;
    Ok(Element {
        key: ElemKey(key.to_vec()),
        create_tid,
        delete_tid: TID_MAX,
        payload,
    })
}

/// The newest TID committed at or before `time_ns`, searching from `from`
/// on (TIDs and their commit times both grow).
fn tid_before_time(
    t: &impl ReadableTable<u64, u64>,
    from: u64,
    time_ns: u64,
) -> Result<Option<u64>> {
    let mut best = None;
    for r in t.range(from..)? {
        let (k, v) = r?;
        if v.value() > time_ns {
            break;
        }
        best = Some(k.value());
    }
    Ok(best)
}

/// Decodes a stored history element.
/// The element with this key as it was at `tid`: the live one if it was
/// created by then, else the newest ended one created by then and deleted
/// after it. Two B-tree lookups whatever the history length.
fn get_asof(
    live: &impl ReadableTable<&'static [u8], &'static [u8]>,
    hist: &impl ReadableTable<&'static [u8], &'static [u8]>,
    fresh: &FreshView<'_, impl ReadableTable<FreshKey, &'static [u8]>>,
    key: &ElemKey,
    tid: u64,
) -> Result<Option<Element>> {
    if let Some(v) = live.get(key.as_bytes())? {
        let e = live_element(key.as_bytes(), v.value())?;
        if e.create_tid <= tid {
            return Ok(Some(e));
        }
    }
    let lo = hist_key(key.as_bytes(), 0);
    let hi = hist_key(key.as_bytes(), tid);
    let mut it = hist.range::<&[u8]>(lo.as_slice()..=hi.as_slice())?;
    let merged = match it.next_back() {
        Some(r) => {
            let (k, v) = r?;
            Some(hist_element(k.value(), v.value())?)
        }
        None => None,
    };
    // The newest version created by `tid`, merged or still waiting.
    let waiting = fresh
        .range((Bound::Included(&lo), Bound::Included(&hi)))?
        .pop();
    let newest = [waiting, merged]
        .into_iter()
        .flatten()
        .max_by_key(|e| e.create_tid);
    Ok(newest.filter(|e| tid < e.delete_tid))
}

fn hist_element(k: &[u8], v: &[u8]) -> Result<Element> {
    let (key, create_tid) = split_hist_key(k)?;
    let (delete_tid, payload) = decode_value(k, v)?;
    Ok(Element {
        key,
        create_tid,
        delete_tid,
        payload,
    })
}

/// An I/O error on the store's file, naming it.
fn io_err(path: &Path) -> impl Fn(std::io::Error) -> MetaError + Copy + '_ {
    move |e| MetaError::Db(format!("{}: {e}", path.display()))
}

/// A store that failed its integrity check is `Damaged`, naming the file;
/// other open errors keep their kind.
fn damaged_or(path: &Path, e: redb::DatabaseError) -> MetaError {
    match e {
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(why)) => MetaError::Damaged {
            file: path.display().to_string(),
            why: format!("pages fail their checksums: {why}"),
        },
        e => e.into(),
    }
}

/// Runs a read of the store, turning a panic inside redb (which a damaged
/// page that slipped past the checks can cause) into an error for the one
/// caller instead of killing the thread that serves it.
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(MetaError::Panicked(panic_text(&*p))))
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

fn range_bounds(prefix: &[u8]) -> (Bound<&[u8]>, Option<Vec<u8>>) {
    (Bound::Included(prefix), prefix_end(prefix))
}

impl MetaStore {
    /// Creates a store in a new file of mode 0600 (only its owner may
    /// read the pool's metadata).
    pub fn create(path: &Path) -> Result<Self> {
        Self::create_with(path, &HostStorage)
    }

    /// Creates a store (see `create`) in a file opened through `storage`.
    pub fn create_with(path: &Path, storage: &dyn Storage) -> Result<Self> {
        let file = storage
            .open(path, &OpenHow::REPLACE)
            .map_err(io_err(path))?;
        let backend = CachedFile::new(file, PageCache::new()).map_err(io_err(path))?;
        let db = Database::builder().create_with_backend(backend)?;
        let s = MetaStore {
            db: parking_lot::RwLock::new(Some(db)),
            reopen: None,
            mirror: parking_lot::Mutex::new(None),
            headroom: Headroom::default(),
            pending: Arc::default(),
            born_waiting: BornPending::default(),
            live_waiting: LiveDebts::default(),
            fresh_index: Arc::default(),
            writes: parking_lot::Mutex::default(),
        };
        s.write(|w| {
            w.set_counter("last_tid", 0)?;
            w.set_counter(DEDUP_INDEXED, 0)?;
            Ok::<_, MetaError>(())
        })?;
        s.load_fresh_index()?;
        Ok(s)
    }

    /// Opens an existing store; redb reads its pages through `pages` (the
    /// SSD cache for metadata, when the pool has one).
    pub fn open(path: &Path, cache_bytes: usize, pages: Arc<PageCache>) -> Result<Self> {
        Self::open_with(path, cache_bytes, pages, HostStorage::shared())
    }

    /// Opens an existing store (see `open`) whose file is opened through
    /// `storage`, now and at every `reopen`.
    pub fn open_with(
        path: &Path,
        cache_bytes: usize,
        pages: Arc<PageCache>,
        storage: Arc<dyn Storage>,
    ) -> Result<Self> {
        // Every step that reads the file runs guarded: a damaged page that
        // the integrity check did not cover must give an error, not a panic.
        Self::open_mirrored(path, None, cache_bytes, pages, storage)
    }

    /// Opens an existing store (see `open_with`) kept as two copies: the
    /// file at `path` and the one at `mirror` (created from it when
    /// missing). Where they differ, the copy that passes the integrity
    /// check wins (the first when both do) and the other is repaired.
    pub fn open_mirrored(
        path: &Path,
        mirror: Option<&Path>,
        cache_bytes: usize,
        pages: Arc<PageCache>,
        storage: Arc<dyn Storage>,
    ) -> Result<Self> {
        // Every step that reads the file runs guarded: a damaged page that
        // the integrity check did not cover must give an error, not a panic.
        let how = ReopenWith {
            path: path.to_path_buf(),
            mirror: mirror.map(Path::to_path_buf),
            cache_bytes,
            pages,
            file: storage
                .open(path, &OpenHow::EXISTING)
                .map_err(io_err(path))?,
            storage,
        };
        guarded(|| Self::open_unguarded(how))
    }

    fn open_unguarded(how: ReopenWith) -> Result<Self> {
        let (db, mirror) = open_db(&how)?;
        let s = MetaStore {
            db: parking_lot::RwLock::new(Some(db)),
            reopen: Some(how),
            mirror: parking_lot::Mutex::new(mirror),
            headroom: Headroom::default(),
            pending: Arc::default(),
            born_waiting: BornPending::default(),
            live_waiting: LiveDebts::default(),
            fresh_index: Arc::default(),
            writes: parking_lot::Mutex::default(),
        };
        let refs = match s.db()?.begin_read()?.open_table(COUNTERS) {
            Ok(t) => t.get(LIVE_REFS)?.map_or(0, |v| v.value()),
            Err(redb::TableError::TableDoesNotExist(_)) => 0,
            Err(e) => return Err(e.into()),
        };
        s.live_waiting.opened_with(refs);
        // Converts tables of an older format, then creates the tables a
        // newer release added (opening them in a write transaction).
        let txn = s.db()?.begin_write()?;
        let moved = dedup::convert_v1(&txn)?;
        txn.commit()?;
        if moved > 0 {
            tracing::info!("converted {moved} dedup index entries to dedup_v2");
        }
        match s.write(|w| w.ensure_born_index())? {
            BornRepair::Kept => {}
            BornRepair::Redone(n) => {
                tracing::info!("made {n} creation index removals a crash left waiting (born_v1)")
            }
            BornRepair::Rebuilt(n) => {
                tracing::info!("indexed {n} live elements by create TID (born_v1)")
            }
        }
        s.load_fresh_index()?;
        // What a crash left waiting goes to `hist_v1` now, so that a
        // release without `fresh_v1` opening the pool next finds it all.
        let waiting = s.fresh_index.len();
        if waiting > 0 {
            // Not `drain`: its dedup batch would mark the chunks a crash
            // left unindexed as indexed before `reindex_dedup` runs.
            s.write(|w| {
                w.drain_hist = true;
                Ok::<_, MetaError>(())
            })?;
            tracing::info!("merged {waiting} ended elements a crash left waiting (fresh_v1)");
        }
        Ok(s)
    }

    /// Indexes the ended elements waiting in `fresh_v1` (`hist_lazy.rs`).
    fn load_fresh_index(&self) -> Result<()> {
        let txn = self.db()?.begin_read()?;
        let merges = match txn.open_table(COUNTERS) {
            Ok(t) => t.get(HIST_MERGES)?.map_or(0, |v| v.value()),
            Err(redb::TableError::TableDoesNotExist(_)) => 0,
            Err(e) => return Err(e.into()),
        };
        match txn.open_table(FRESH) {
            Ok(t) => self.fresh_index.load(&t, merges),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Closes and opens the file again (verifying it, as at mount), after a
    /// write failed, e.g. because the host filesystem was full: redb keeps
    /// failing a handle once a write to its file failed. Read views taken
    /// before keep working until dropped only if they need no more pages.
    pub fn reopen(&self) -> Result<()> {
        let Some(w) = &self.reopen else {
            return Ok(());
        };
        self.headroom.bump();
        let mut db = self.db.write();
        // The old handle must let go of the file (and its lock) first.
        drop(db.take());
        let (new, mirror) = open_db(w)?;
        *db = Some(new);
        drop(db);
        *self.mirror.lock() = mirror;
        guarded(|| self.load_fresh_index())
    }

    /// What the mirror did so far (None: the metadata has one copy).
    pub fn mirror_stats(&self) -> Option<MirrorStats> {
        self.mirror.lock().as_ref().map(|m| m.stats())
    }

    /// Verifies every page of both metadata copies, repairing bad pages
    /// from the good copy; returns the pages repaired (None: one copy).
    pub fn scrub_mirror(&self) -> Result<Option<u64>> {
        let Some(m) = self.mirror.lock().clone() else {
            return Ok(None);
        };
        m.scrub()
            .map(Some)
            .map_err(|e| MetaError::Io(e.to_string()))
    }

    /// Makes sure `bytes` past the end of the store's file are allocated
    /// on the host filesystem (without changing its size), so that the
    /// next commit's writes cannot fail for lack of space there: redb fails
    /// a handle for good once a write to its file failed. `NoRoom` when
    /// the host cannot give them; filesystems without fallocate, and
    /// backends without a host file, pass.
    pub fn ensure_headroom(&self, bytes: u64) -> Result<()> {
        use std::os::fd::AsRawFd;
        let Some((w, file)) = (self.reopen.as_ref()).and_then(|w| Some((w, w.file.host_file()?)))
        else {
            return Ok(());
        };
        let (changes, known) = self.headroom.known(bytes);
        if known {
            return Ok(());
        }
        let len = file
            .metadata()
            .map_err(|e| MetaError::Db(e.to_string()))?
            .len();
        // SAFETY: fallocate on a descriptor we own; KEEP_SIZE leaves the
        // file's length to redb.
        let r = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                len as libc::off_t,
                bytes as libc::off_t,
            )
        };
        if r == 0 {
            *self.headroom.ensured.lock() = Some((changes, bytes));
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Err(MetaError::NoRoom(format!(
                "{}: no room for {bytes} bytes of metadata growth",
                w.path.display()
            ))),
            _ => Ok(()),
        }
    }

    /// The open handle, or an error while the store is closed.
    fn db(&self) -> Result<parking_lot::MappedRwLockReadGuard<'_, Database>> {
        parking_lot::RwLockReadGuard::try_map(self.db.read_recursive(), |d| d.as_ref()).map_err(
            |_| MetaError::Db("the metadata store is closed after a failed write (remount)".into()),
        )
    }
}

impl Drop for MetaStore {
    /// Closing commits redb's allocator state, which reads pages; on a
    /// store that failed its checks (`open_salvage`) that can panic, and a
    /// panic in a drop would abort: it is contained here.
    fn drop(&mut self) {
        if let Some(db) = self.db.get_mut().take() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db)));
        }
    }
}

/// Opens the store's file (and its mirror) through the storage and the
/// page cache, verifying every page.
fn open_db(w: &ReopenWith) -> Result<(Database, Option<Arc<Mirror>>)> {
    let (path, storage) = (&w.path, &*w.storage);
    let io = io_err(path);
    let file = storage.open(path, &OpenHow::EXISTING).map_err(io)?;
    if file.len().map_err(io_err(path))? == 0 {
        return Err(MetaError::Db(format!("{}: empty file", path.display())));
    }
    let (backend, mirror): (Arc<dyn Backend>, _) = match &w.mirror {
        None => (file, None),
        Some(mp) => {
            let copy = match storage.open(mp, &OpenHow::CREATE) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(
                        "metadata mirror {}: {e}; going on with one copy of the metadata",
                        mp.display()
                    );
                    return open_db(&ReopenWith {
                        mirror: None,
                        ..w.clone_parts()
                    });
                }
            };
            let copies = [file, copy];
            let pick = |c: &[Arc<dyn Backend>; 2]| Ok(good_copy(c, path, mp));
            let m = Arc::new(Mirror::open(copies, pick).map_err(io_err(path))?);
            let fixed = m.stats().repaired_at_open;
            if fixed > 0 {
                tracing::warn!(
                    "metadata: {fixed} pages of the copies differed; repaired from the good copy"
                );
            }
            (m.clone(), Some(m))
        }
    };
    // Every page of the committed trees is checked against the checksum
    // its parent holds before the pool is used: a file damaged while the
    // pool was closed is refused here, instead of answering lookups from
    // damaged pages (which can lose elements silently or panic).
    let db = Database::builder()
        .set_cache_size(w.cache_bytes)
        .set_check_integrity_on_open(true)
        .create_with_backend(CachedFile::new(backend, w.pages.clone()).map_err(io_err(path))?)
        .map_err(|e| damaged_or(path, e))?;
    Ok((db, mirror))
}

impl ReopenWith {
    fn clone_parts(&self) -> ReopenWith {
        ReopenWith {
            path: self.path.clone(),
            mirror: self.mirror.clone(),
            cache_bytes: self.cache_bytes,
            pages: self.pages.clone(),
            storage: self.storage.clone(),
            file: self.file.clone(),
        }
    }
}

/// Which of two differing metadata copies to keep: of those that pass
/// the integrity check (opened from a copy in RAM, so that a damaged file
/// is not changed), the one with more write transactions (a copy dropped
/// after a failed write is behind), the first of equals; the first when
/// neither passes (its open then fails with the damage found).
fn good_copy(copies: &[Arc<dyn Backend>; 2], path: &Path, mirror: &Path) -> usize {
    let writes: Vec<Option<u64>> = copies.iter().map(|c| writes_if_sound(&**c)).collect();
    let pick = match (writes[0], writes[1]) {
        (Some(a), Some(b)) if b > a => 1,
        (None, Some(_)) => 1,
        _ => 0,
    };
    if pick == 1 {
        let why = match writes[0] {
            Some(_) => "is older than",
            None => "failed its check;",
        };
        tracing::error!(
            "metadata {} {why} its mirror {}, which repairs it",
            path.display(),
            mirror.display()
        );
    } else if writes[1].is_some_and(|b| Some(b) < writes[0]) {
        tracing::warn!("metadata mirror {} is older; repaired", mirror.display());
    }
    pick
}

/// The count of write transactions of a copy of the store, if it passes
/// redb's integrity check (every committed page against its parent's
/// checksum), checked in RAM.
fn writes_if_sound(c: &dyn Backend) -> Option<u64> {
    use redb::StorageBackend;
    let len = c.len().ok().filter(|l| *l > 0)?;
    let mut bytes = vec![0u8; len as usize];
    c.read_at(&mut bytes, 0).ok()?;
    let mem = redb::backends::InMemoryBackend::new();
    mem.set_len(len).ok()?;
    mem.write(0, &bytes).ok()?;
    drop(bytes);
    guarded(|| {
        let db = Database::builder()
            .set_check_integrity_on_open(true)
            .create_with_backend(mem)
            .map_err(|e| MetaError::Db(e.to_string()))?;
        let r = db.begin_read()?;
        let t = r.open_table(COUNTERS)?;
        Ok(t.get(WRITES)?.map_or(0, |v| v.value()))
    })
    .ok()
}

impl MetaStore {
    /// Opens a copy in RAM of a store that failed its integrity check, for
    /// `cairn check` to find what can still be read and whom the damage
    /// touches. The file itself is neither trusted nor changed; every read
    /// of the copy is guarded, since its pages were not verified.
    pub fn open_salvage(path: &Path) -> Result<Self> {
        use redb::StorageBackend;
        let io = io_err(path);
        let bytes = std::fs::read(path).map_err(io)?;
        let mem = redb::backends::InMemoryBackend::new();
        mem.set_len(bytes.len() as u64).map_err(io)?;
        mem.write(0, &bytes).map_err(io)?;
        drop(bytes);
        let db = guarded(|| Ok(Database::builder().create_with_backend(mem)?))?;
        let s = MetaStore {
            db: parking_lot::RwLock::new(Some(db)),
            reopen: None,
            mirror: parking_lot::Mutex::new(None),
            headroom: Headroom::default(),
            pending: Arc::default(),
            born_waiting: BornPending::default(),
            live_waiting: LiveDebts::default(),
            fresh_index: Arc::default(),
            writes: parking_lot::Mutex::default(),
        };
        // Without the index (damage in `fresh_v1`), readers scan the table.
        if let Err(e) = guarded(|| s.load_fresh_index()) {
            tracing::warn!("ended elements waiting in fresh_v1 not indexed: {e}");
        }
        Ok(s)
    }

    pub fn read(&self) -> Result<MetaRead> {
        guarded(|| {
            let txn = self.db()?.begin_read()?;
            Ok(MetaRead {
                pending: self.pending.clone(),
                live: txn.open_table(LIVE)?,
                hist: txn.open_table(HIST)?,
                fresh: std::sync::OnceLock::new(),
                fresh_index: self.fresh_index.clone(),
                chunks: txn.open_table(CHUNKS)?,
                txn,
            })
        })
    }

    /// Writes every dedup index entry still waiting to the table, makes
    /// every waiting creation index removal and merges every ended element
    /// waiting in `fresh_v1`, in one transaction (at close: see
    /// `dedup/pending.rs`, `store/born_lazy.rs`, `store/hist_lazy.rs`).
    pub fn drain(&self) -> Result<()> {
        if self.pending.is_empty() && self.born_waiting.is_empty() && self.fresh_index.is_empty() {
            return Ok(());
        }
        self.write(|w| {
            w.drain_dedup = true;
            w.drain_hist = true;
            w.drain_all_born();
            Ok::<_, MetaError>(())
        })
    }

    /// The creation index removals waiting for their batch.
    pub fn born_pending(&self) -> &BornPending {
        &self.born_waiting
    }

    /// The live reference decrements waiting for their batch.
    pub fn live_debts(&self) -> &LiveDebts {
        &self.live_waiting
    }

    /// The ended elements waiting for their merge into `hist_v1`.
    pub fn hist_waiting(&self) -> &FreshIndex {
        &self.fresh_index
    }

    /// A read view and the live reference decrements that wait in it,
    /// taken together (no write transaction commits in between): a chunk
    /// record's true live count is its stored one less what waits.
    pub fn read_owing(&self) -> Result<(MetaRead, Debts)> {
        let _one = self.writes.lock();
        Ok((self.read()?, self.live_waiting.copy()))
    }

    /// Indexes the chunks stored since the last batch of entries reached
    /// the table (counter `DEDUP_INDEXED`), whose entries a crash or a
    /// close without `drain` lost: called when the pool opens, before
    /// anything looks a chunk up by hash (dedup, mirror streams).
    /// `hash_of` reads a chunk record's content hash (the record is the
    /// data layer's encoding). A store without the counter was written by
    /// a release that indexed every chunk at once. Returns the chunks
    /// indexed.
    pub fn reindex_dedup(&self, hash_of: impl Fn(&[u8]) -> Option<Vec<u8>>) -> Result<u64> {
        let (indexed, next) = guarded(|| {
            let t = self.db()?.begin_read()?.open_table(COUNTERS)?;
            let next = t.get("next_chunk")?.map_or(0, |v| v.value());
            Ok((t.get(DEDUP_INDEXED)?.map(|v| v.value()), next))
        })?;
        if indexed == Some(next) {
            return Ok(0); // a clean close, or nothing stored since: no write
        }
        self.write(|w| {
            let next = w.counter("next_chunk")?;
            let from = w.counters.get(DEDUP_INDEXED)?.map_or(next, |v| v.value());
            let mut found = Vec::new();
            for r in w.chunks.range(from..)? {
                let (id, raw) = r?;
                found.extend(hash_of(raw.value()).map(|h| (h, id.value())));
            }
            for (h, id) in &found {
                w.put_dedup(h, *id)?;
            }
            w.drain_dedup = true;
            Ok(found.len() as u64)
        })
    }

    /// The dedup index entries waiting for their batch.
    pub fn dedup_pending(&self) -> &Pending {
        &self.pending
    }

    /// Runs `f` in one write transaction and commits it durably.
    pub fn write<R, E: From<MetaError>>(
        &self,
        f: impl FnOnce(&mut MetaWrite<'_>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        // The file may grow from here until the end (`ensure_headroom`).
        self.headroom.bump();
        let _grown = BumpOnDrop(&self.headroom);
        // A panic inside redb (a damaged page) aborts the transaction and
        // becomes an error, as in reads.
        let _one = self.writes.lock();
        let run = std::panic::AssertUnwindSafe(|| {
            let db = self.db()?;
            let mut txn = db.begin_write().map_err(MetaError::from)?;
            txn.set_durability(Durability::Immediate)
                .map_err(MetaError::from)?;
            txn.set_quick_repair(true);
            let r = {
                let mut w = MetaWrite {
                    live: txn.open_table(LIVE).map_err(MetaError::from)?,
                    hist: txn.open_table(HIST).map_err(MetaError::from)?,
                    fresh: txn.open_table(FRESH).map_err(MetaError::from)?,
                    fresh_index: &self.fresh_index,
                    drain_hist: false,
                    ends: txn.open_table(ENDS).map_err(MetaError::from)?,
                    chunks: txn.open_table(CHUNKS).map_err(MetaError::from)?,
                    segments: txn.open_table(SEGMENTS).map_err(MetaError::from)?,
                    counters: txn.open_table(COUNTERS).map_err(MetaError::from)?,
                    tids: txn.open_table(TIDS).map_err(MetaError::from)?,
                    orphans: txn.open_table(ORPHANS).map_err(MetaError::from)?,
                    devices: txn.open_table(DEVICES).map_err(MetaError::from)?,
                    snapshots: txn.open_table(SNAPSHOTS).map_err(MetaError::from)?,
                    dedup: txn.open_table(DEDUP).map_err(MetaError::from)?,
                    gone: txn.open_table(GONE).map_err(MetaError::from)?,
                    born: txn.open_table(BORN).map_err(MetaError::from)?,
                    ended: HashMap::new(),
                    pending: &self.pending,
                    new_dedup: Default::default(),
                    gone_dedup: Vec::new(),
                    drain_dedup: false,
                    born_waiting: &self.born_waiting,
                    born_txn: BornTxn::default(),
                    live_waiting: &self.live_waiting,
                    live_txn: DebtsTxn::default(),
                };
                let r = f(&mut w)?;
                let dedup = w.write_dedup()?;
                let born = w.finish_born()?;
                let live = w.finish_live()?;
                let merged = w.finish_hist()?;
                // Counts write transactions: of two metadata copies that
                // both check out, the one with more is the newer.
                let n = w.counter(WRITES)?;
                w.set_counter(WRITES, n + 1)?;
                (r, dedup, born, live, merged)
            };
            txn.commit().map_err(MetaError::from)?;
            let (r, dedup, born, live, merged) = r;
            self.born_waiting.settle(born);
            self.live_waiting.settle(live);
            if let Some(merges) = merged {
                self.fresh_index.merged_all(merges);
            }
            match dedup {
                DedupOut::Written(gone, all) => self.pending.written(&gone, &all),
                DedupOut::Kept(gone, added) => self.pending.keep(&gone, added),
            }
            Ok(r)
        });
        std::panic::catch_unwind(run)
            .unwrap_or_else(|p| Err(MetaError::Panicked(panic_text(&*p)).into()))
    }
}

/// A consistent read-only view of the committed metadata.
pub struct MetaRead {
    txn: ReadTransaction,
    pending: Arc<Pending>,
    live: ReadOnlyTable<&'static [u8], &'static [u8]>,
    hist: ReadOnlyTable<&'static [u8], &'static [u8]>,
    /// Ended elements not yet merged into `hist` (`hist_lazy.rs`), read
    /// on first need: only history readers want them.
    fresh: std::sync::OnceLock<FreshSnap>,
    fresh_index: Arc<FreshIndex>,
    chunks: ReadOnlyTable<u64, &'static [u8]>,
}

/// A read view's `fresh_v1` and its merge counter `hist_merges`.
struct FreshSnap {
    /// None in a store that predates the table, opened without a write.
    table: Option<ReadOnlyTable<FreshKey, &'static [u8]>>,
    merges: u64,
}

impl MetaRead {
    /// This snapshot's `fresh_v1` and merge counter, opened once.
    fn fresh_snap(&self) -> Result<&FreshSnap> {
        if let Some(f) = self.fresh.get() {
            return Ok(f);
        }
        let table = match self.txn.open_table(FRESH) {
            Ok(t) => Some(t),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let merges = self.counter(HIST_MERGES)?;
        Ok(self.fresh.get_or_init(|| FreshSnap { table, merges }))
    }

    /// This snapshot's ended elements that wait for their merge.
    fn fresh_view(&self) -> Result<FreshView<'_, ReadOnlyTable<FreshKey, &'static [u8]>>> {
        let f = self.fresh_snap()?;
        Ok(FreshView {
            table: f.table.as_ref(),
            index: &self.fresh_index,
            merges: f.merges,
        })
    }

    /// Every ended element: merged ones, then waiting ones.
    fn each_ended(&self, mut f: impl FnMut(&[u8], &[u8]) -> Result<()>) -> Result<()> {
        for r in self.hist.iter()? {
            let (k, v) = r?;
            f(k.value(), v.value())?;
        }
        if let Some(t) = &self.fresh_snap()?.table {
            for r in t.iter()? {
                let (k, v) = r?;
                f(k.value().1, v.value())?;
            }
        }
        Ok(())
    }

    /// The live element with this key.
    pub fn get(&self, key: &ElemKey) -> Result<Option<Element>> {
        guarded(|| match self.live.get(key.as_bytes())? {
            Some(v) => live_element(key.as_bytes(), v.value()).map(Some),
            None => Ok(None),
        })
    }

    /// The element with this key as it was at `tid`: the live one if it was
    /// created by then, else the newest ended one created by then and
    /// deleted after it. Two B-tree lookups whatever the history length,
    /// and one for each version of the key waiting for its merge.
    pub fn get_asof(&self, key: &ElemKey, tid: u64) -> Result<Option<Element>> {
        guarded(|| get_asof(&self.live, &self.hist, &self.fresh_view()?, key, tid))
    }

    /// Every element with this prefix that was visible at `tid`, in key
    /// order: the live ones created by then merged with the ended ones that
    /// were alive then. Costs the prefix's live elements plus its history.
    pub fn scan_asof(&self, prefix: &[u8], tid: u64) -> Result<Vec<Element>> {
        guarded(|| {
            let (lo, end) = range_bounds(prefix);
            let hi = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let mut out = Vec::new();
            for r in self.live.range::<&[u8]>((lo, hi))? {
                let (k, v) = r?;
                let e = live_element(k.value(), v.value())?;
                if e.create_tid <= tid {
                    out.push(e);
                }
            }
            for r in self.hist.range::<&[u8]>((lo, hi))? {
                let (k, v) = r?;
                let e = hist_element(k.value(), v.value())?;
                if e.visible_at(tid) {
                    out.push(e);
                }
            }
            let waiting = self.fresh_view()?.range((lo, hi))?;
            out.extend(waiting.into_iter().filter(|e| e.visible_at(tid)));
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
    }

    /// Every version of one element still stored, oldest first (ended ones
    /// from history, then the live one).
    pub fn versions(&self, key: &ElemKey) -> Result<Vec<Element>> {
        guarded(|| {
            let lo = hist_key(key.as_bytes(), 0);
            let hi = hist_key(key.as_bytes(), TID_MAX);
            let mut out = Vec::new();
            for r in self.hist.range::<&[u8]>(lo.as_slice()..=hi.as_slice())? {
                let (k, v) = r?;
                out.push(hist_element(k.value(), v.value())?);
            }
            let waiting = (Bound::Included(&lo[..]), Bound::Included(&hi[..]));
            out.extend(self.fresh_view()?.range(waiting)?);
            out.sort_by_key(|e| e.create_tid);
            out.extend(self.get(key)?);
            Ok(out)
        })
    }

    /// All live elements whose key starts with `prefix`, in key order,
    /// starting at `from` (inclusive) if given.
    pub fn scan(&self, prefix: &[u8], from: Option<&[u8]>, limit: usize) -> Result<Vec<Element>> {
        guarded(|| {
            let (lo, end) = range_bounds(prefix);
            let lo = from.map_or(lo, Bound::Included);
            let hi = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let mut out = Vec::new();
            for r in self.live.range::<&[u8]>((lo, hi))? {
                let (k, v) = r?;
                out.push(live_element(k.value(), v.value())?);
                if out.len() >= limit {
                    break;
                }
            }
            Ok(out)
        })
    }

    /// Every live and ended element, for check and scrub: calls `f` with
    /// each stored key and the element, or the error that decoding it gave
    /// (the walk goes on past damaged records; it stops only where redb
    /// cannot go on).
    pub fn for_each_checked(&self, mut f: impl FnMut(&[u8], Result<Element>)) -> Result<()> {
        guarded(|| {
            for r in self.live.iter()? {
                let (k, v) = r?;
                f(k.value(), live_element(k.value(), v.value()));
            }
            self.each_ended(|k, v| {
                f(k, hist_element(k, v));
                Ok(())
            })
        })
    }

    /// Every ended element (for check): calls `f` on each.
    pub fn for_each_hist(&self, mut f: impl FnMut(Element)) -> Result<()> {
        guarded(|| {
            self.each_ended(|k, v| {
                f(hist_element(k, v)?);
                Ok(())
            })
        })
    }

    /// Every live element (for check): calls `f` on each.
    pub fn for_each_live(&self, mut f: impl FnMut(Element)) -> Result<()> {
        guarded(|| {
            for r in self.live.iter()? {
                let (k, v) = r?;
                f(live_element(k.value(), v.value())?);
            }
            Ok(())
        })
    }

    pub fn chunk(&self, id: u64) -> Result<Option<Vec<u8>>> {
        guarded(|| Ok(self.chunks.get(id)?.map(|v| v.value().to_vec())))
    }

    pub fn for_each_chunk(&self, mut f: impl FnMut(u64, &[u8])) -> Result<()> {
        guarded(|| {
            for r in self.chunks.iter()? {
                let (k, v) = r?;
                f(k.value(), v.value());
            }
            Ok(())
        })
    }

    pub fn segments(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        guarded(|| {
            let t = self.txn.open_table(SEGMENTS)?;
            let mut out = Vec::new();
            for r in t.iter()? {
                let (k, v) = r?;
                out.push((k.value(), v.value().to_vec()));
            }
            Ok(out)
        })
    }

    pub fn counter(&self, name: &str) -> Result<u64> {
        guarded(|| {
            let t = self.txn.open_table(COUNTERS)?;
            Ok(t.get(name)?.map_or(0, |v| v.value()))
        })
    }

    pub fn orphans(&self) -> Result<Vec<u64>> {
        guarded(|| {
            let t = self.txn.open_table(ORPHANS)?;
            let mut out = Vec::new();
            for r in t.iter()? {
                out.push(r?.0.value());
            }
            Ok(out)
        })
    }

    pub fn devices(&self) -> Result<Vec<(u32, Vec<u8>)>> {
        guarded(|| {
            let t = self.txn.open_table(DEVICES)?;
            let mut out = Vec::new();
            for r in t.iter()? {
                let (k, v) = r?;
                out.push((k.value(), v.value().to_vec()));
            }
            Ok(out)
        })
    }

    /// The chunk the index names for this hash: a candidate whose record
    /// the caller must confirm holds the same full hash (see dedup.rs).
    pub fn dedup(&self, hash: &[u8]) -> Result<Option<u64>> {
        if let Some(v) = self.pending.get(&dedup::key(hash)) {
            return Ok(Some(dedup::decode(v)));
        }
        guarded(|| {
            let t = self.txn.open_table(DEDUP)?;
            Ok(t.get(dedup::key(hash))?.map(|v| dedup::decode(v.value())))
        })
    }

    /// Every dedup index entry: (first 7 hash bytes, chunk id).
    pub fn for_each_dedup(&self, mut f: impl FnMut([u8; 6], u64)) -> Result<()> {
        guarded(|| {
            let t = self.txn.open_table(DEDUP)?;
            for r in t.iter()? {
                let (k, v) = r?;
                f(k.value(), dedup::decode(v.value()));
            }
            Ok(())
        })
    }

    /// Entries in the dedup index and the bytes of the pages that hold it
    /// (keys, values, branch pages and free space inside pages): the most
    /// RAM the index takes when all of it is cached.
    pub fn dedup_size(&self) -> Result<(u64, u64)> {
        guarded(|| {
            let t = self.txn.open_table(DEDUP)?;
            let s = t.stats()?;
            let bytes = s.stored_bytes() + s.metadata_bytes() + s.fragmented_bytes();
            Ok((t.len()? + self.pending.len() as u64, bytes))
        })
    }

    /// All snapshots: name -> encoded record.
    pub fn snapshots(&self) -> Result<Vec<(String, Vec<u8>)>> {
        guarded(|| {
            let t = self.txn.open_table(SNAPSHOTS)?;
            let mut out = Vec::new();
            for r in t.iter()? {
                let (k, v) = r?;
                out.push((k.value().to_string(), v.value().to_vec()));
            }
            Ok(out)
        })
    }

    /// The newest TID committed at or before `time_ns`.
    pub fn tid_before_time(&self, time_ns: u64) -> Result<Option<u64>> {
        guarded(|| tid_before_time(&self.txn.open_table(TIDS)?, 0, time_ns))
    }

    /// (tid, commit time ns) of the newest commit at or before `tid`.
    pub fn tid_time(&self, tid: u64) -> Result<Option<(u64, u64)>> {
        guarded(|| {
            let t = self.txn.open_table(TIDS)?;
            let r = t.range(..=tid)?.next_back();
            Ok(match r {
                Some(r) => {
                    let (k, v) = r?;
                    Some((k.value(), v.value()))
                }
                None => None,
            })
        })
    }

    /// (delete_tid, key, create_tid) of the ended elements removed without
    /// history (`note_gone`) that ended after `since`.
    pub fn gone_after(&self, since: u64) -> Result<Vec<(u64, Vec<u8>, u64)>> {
        guarded(|| {
            let t = self.txn.open_table(GONE)?;
            let mut out = Vec::new();
            for r in t.range((since.saturating_add(1), &[][..])..)? {
                let (k, _) = r?;
                let (tid, hk) = k.value();
                let (key, create) = split_hist_key(hk)?;
                out.push((tid, key.0, create));
            }
            Ok(out)
        })
    }

    /// The live elements created after `since` (the `born_v1` index).
    pub fn born_after(&self, since: u64) -> Result<Vec<Element>> {
        guarded(|| by_tid::born_after(&self.txn.open_table(BORN)?, &self.live, since))
    }

    /// The elements kept in history that ended after `since` (the `ends_v1`
    /// index).
    pub fn ended_after(&self, since: u64) -> Result<Vec<Element>> {
        guarded(|| {
            let ends = self.txn.open_table(ENDS)?;
            by_tid::ended_after(&ends, &self.hist, self.fresh_snap()?.table.as_ref(), since)
        })
    }

    /// (tid, commit time ns) of every commit after `since`, in order.
    pub fn tids_after(&self, since: u64) -> Result<Vec<(u64, u64)>> {
        guarded(|| {
            let t = self.txn.open_table(TIDS)?;
            let mut out = Vec::new();
            for r in t.range(since.saturating_add(1)..)? {
                let (k, v) = r?;
                out.push((k.value(), v.value()));
            }
            Ok(out)
        })
    }

    /// Ended elements waiting for their merge into `hist_v1` (of those
    /// `sizes` counts).
    pub fn ended_waiting(&self) -> Result<u64> {
        guarded(|| {
            Ok(self
                .fresh_snap()?
                .table
                .as_ref()
                .map(|t| t.len())
                .transpose()?
                .unwrap_or(0))
        })
    }

    /// Numbers of live elements, ended elements and chunks.
    pub fn sizes(&self) -> Result<(u64, u64, u64)> {
        let waiting = self.ended_waiting()?;
        guarded(|| {
            Ok((
                self.live.len()?,
                self.hist.len()? + waiting,
                self.chunks.len()?,
            ))
        })
    }
}

/// The tables of one write transaction.
pub struct MetaWrite<'t> {
    live: Table<'t, &'static [u8], &'static [u8]>,
    hist: Table<'t, &'static [u8], &'static [u8]>,
    /// Ended elements not yet merged into `hist` (`store/hist_lazy.rs`).
    fresh: Table<'t, FreshKey, &'static [u8]>,
    fresh_index: &'t FreshIndex,
    /// Merges every waiting ended element (`MetaStore::drain`).
    drain_hist: bool,
    ends: Table<'t, (u64, &'static [u8]), ()>,
    chunks: Table<'t, u64, &'static [u8]>,
    segments: Table<'t, u64, &'static [u8]>,
    counters: Table<'t, &'static str, u64>,
    tids: Table<'t, u64, u64>,
    orphans: Table<'t, u64, ()>,
    devices: Table<'t, u32, &'static [u8]>,
    snapshots: Table<'t, &'static str, &'static [u8]>,
    dedup: Table<'t, [u8; 6], [u8; 6]>,
    gone: Table<'t, (u64, &'static [u8]), ()>,
    born: Table<'t, (u64, &'static [u8]), ()>,
    /// The payloads of the elements this transaction ended, by history
    /// key: `ended_at` takes them from here instead of looking each one up
    /// in `hist` again.
    ended: HashMap<Vec<u8>, Vec<u8>>,
    /// Dedup entries: those waiting (`dedup/pending.rs`), those this
    /// transaction adds, and those of the chunks it removes.
    pending: &'t Pending,
    new_dedup: dedup::pending::Entries,
    gone_dedup: Vec<([u8; 6], [u8; 6])>,
    /// Writes every waiting entry to the table (`MetaStore::drain`).
    drain_dedup: bool,
    /// Creation index removals: those waiting, and this transaction's
    /// (`store/born_lazy.rs`).
    born_waiting: &'t BornPending,
    born_txn: BornTxn,
    /// Live reference decrements: those waiting, and this transaction's
    /// (`store/live_lazy.rs`).
    live_waiting: &'t LiveDebts,
    live_txn: DebtsTxn,
}

/// What a committed write transaction leaves of the waiting dedup entries.
enum DedupOut {
    /// It wrote these to the table, without those of the chunks it
    /// removed (the first list).
    Written(Vec<([u8; 6], [u8; 6])>, dedup::pending::Entries),
    /// It wrote none: its removals and additions wait.
    Kept(Vec<([u8; 6], [u8; 6])>, dedup::pending::Entries),
}

impl MetaWrite<'_> {
    pub fn get(&self, key: &ElemKey) -> Result<Option<Element>> {
        match self.live.get(key.as_bytes())? {
            Some(v) => live_element(key.as_bytes(), v.value()).map(Some),
            None => Ok(None),
        }
    }

    /// The element with this key as it was at `tid` (see
    /// `MetaRead::get_asof`).
    pub fn get_asof(&self, key: &ElemKey, tid: u64) -> Result<Option<Element>> {
        get_asof(&self.live, &self.hist, &self.fresh_view()?, key, tid)
    }

    /// Ends the live element with this key at `tid` (moves it to history).
    /// Returns it, with its delete_tid set.
    pub fn end(&mut self, key: &ElemKey, tid: u64) -> Result<Option<Element>> {
        let Some(old) = self.live.remove(key.as_bytes())? else {
            return Ok(None);
        };
        let (create_tid, payload) = decode_value(key.as_bytes(), old.value())?;
        drop(old);
        self.move_to_history(key, create_tid, payload, tid)
            .map(Some)
    }

    /// Moves an element just taken out of `live` to history, ended at `tid`.
    fn move_to_history(
        &mut self,
        key: &ElemKey,
        create_tid: u64,
        payload: Vec<u8>,
        tid: u64,
    ) -> Result<Element> {
        self.born_gone(create_tid, key.as_bytes());
        assert!(
            create_tid < tid,
            "element {key} created at {create_tid} ended at {tid}"
        );
        let hk = hist_key(key.as_bytes(), create_tid);
        self.keep_ended(tid, &hk, &encode_value(&hk, tid, &payload))?;
        self.ends.insert((tid, hk.as_slice()), ())?;
        self.ended.insert(hk, payload.clone());
        Ok(Element {
            key: key.clone(),
            create_tid,
            delete_tid: tid,
            payload,
        })
    }

    /// Removes the live element under `key` without keeping it in history
    /// (a mirror replacing its own first elements with its source's).
    pub fn remove_live(&mut self, key: &ElemKey) -> Result<bool> {
        let Some(old) = self.live.remove(key.as_bytes())? else {
            return Ok(false);
        };
        let (create_tid, _) = decode_value(key.as_bytes(), old.value())?;
        drop(old);
        self.born.remove((create_tid, key.as_bytes()))?;
        Ok(true)
    }

    /// Adds a new live element created at `tid`, ending the current one.
    /// Returns the ended element, if any. One insert into `live` replaces
    /// the current element and hands it back (no separate remove).
    pub fn put(&mut self, key: &ElemKey, payload: &[u8], tid: u64) -> Result<Option<Element>> {
        let value = encode_value(key.as_bytes(), tid, payload);
        let old = match self.live.insert(key.as_bytes(), value.as_slice())? {
            Some(v) => Some(decode_value(key.as_bytes(), v.value())?),
            None => None,
        };
        let ended = match old {
            Some((create_tid, payload)) => {
                Some(self.move_to_history(key, create_tid, payload, tid)?)
            }
            None => None,
        };
        self.born.insert((tid, key.as_bytes()), ())?;
        Ok(ended)
    }

    /// Physically removes ended elements that no retained TID can see: an
    /// element is kept if some tid in `retained` (sorted) lies in
    /// [create_tid, delete_tid). Considers elements with delete_tid <=
    /// `cutoff` and above `from` (elements ended at or before `from` were
    /// looked at by an earlier prune with the same or more retained TIDs).
    /// With `dry_run` nothing is removed. Returns what was (or would be)
    /// removed, for the caller to release chunks.
    pub fn prune(
        &mut self,
        from: u64,
        cutoff: u64,
        retained: &[u64],
        dry_run: bool,
    ) -> Result<Vec<Element>> {
        debug_assert!(retained.windows(2).all(|w| w[0] <= w[1]));
        let mut victims = Vec::new();
        if from >= cutoff {
            return Ok(Vec::new());
        }
        let lo = (from + 1, &[][..]);
        for r in self.ends.range(lo..=(cutoff, &[0xffu8; 64][..]))? {
            let (k, _) = r?;
            let (delete_tid, hk) = k.value();
            let (key, create_tid) = split_hist_key(hk)?;
            let i = retained.partition_point(|&t| t < create_tid);
            let seen = i < retained.len() && retained[i] < delete_tid;
            if !seen {
                victims.push((delete_tid, hk.to_vec(), key, create_tid));
            }
        }
        let mut removed = Vec::with_capacity(victims.len());
        if dry_run {
            for (delete_tid, hk, key, create_tid) in victims {
                let payload = match ended_value(Some(&self.fresh), &self.hist, delete_tid, &hk)? {
                    Some(v) => decode_value(&hk, &v)?.1,
                    None => Vec::new(),
                };
                removed.push(Element {
                    key,
                    create_tid,
                    delete_tid,
                    payload,
                });
            }
            return Ok(removed);
        }
        self.drain_born_before(cutoff)?;
        if !victims.is_empty() {
            self.no_live_debts_before(cutoff)?;
        }
        for (delete_tid, hk, key, create_tid) in victims {
            self.ends.remove((delete_tid, hk.as_slice()))?;
            let v = self
                .take_ended(delete_tid, &hk)?
                .ok_or_else(|| MetaError::Corrupt {
                    key: key.to_string(),
                    why: "ends index names a missing history element".into(),
                })?;
            let (_, payload) = decode_value(&hk, &v)?;
            removed.push(Element {
                key,
                create_tid,
                delete_tid,
                payload,
            });
        }
        Ok(removed)
    }

    /// The elements this transaction (or any commit at `tid`) ended at
    /// `tid`, from the `ends` index: one range, no scan of history. The
    /// payloads this transaction ended are handed over from RAM (once; a
    /// second call reads them from `hist`).
    pub fn ended_at(&mut self, tid: u64) -> Result<Vec<Element>> {
        let mut out = Vec::new();
        for r in self.ends.range((tid, &[][..])..=(tid, &[0xffu8; 64][..]))? {
            let (k, _) = r?;
            let (delete_tid, hk) = k.value();
            let (key, create_tid) = split_hist_key(hk)?;
            let payload = match self.ended.remove(hk) {
                Some(p) => p,
                None => {
                    let v = ended_value(Some(&self.fresh), &self.hist, delete_tid, hk)?;
                    let v = v.ok_or_else(|| MetaError::Corrupt {
                        key: key.to_string(),
                        why: "ends index names a missing history element".into(),
                    })?;
                    decode_value(hk, &v)?.1
                }
            };
            out.push(Element {
                key,
                create_tid,
                delete_tid,
                payload,
            });
        }
        Ok(out)
    }

    /// Physically removes one ended element (and its `ends` entry), as
    /// prune does; returns false if it was not stored.
    pub fn remove_ended(&mut self, e: &Element) -> Result<bool> {
        let hk = hist_key(e.key.as_bytes(), e.create_tid);
        self.ends.remove((e.delete_tid, hk.as_slice()))?;
        Ok(self.take_ended(e.delete_tid, &hk)?.is_some())
    }

    /// Notes that ended element `e` was removed before the prune horizon
    /// (no history kept for it): mirror streams still send its end.
    pub fn note_gone(&mut self, e: &Element) -> Result<()> {
        let hk = hist_key(e.key.as_bytes(), e.create_tid);
        self.gone.insert((e.delete_tid, hk.as_slice()), ())?;
        Ok(())
    }

    /// Forgets the notes of elements that ended at or before `cutoff`
    /// (streams from before it are refused anyway: the prune horizon).
    pub fn forget_gone(&mut self, cutoff: u64) -> Result<()> {
        self.drain_born_before(cutoff)?;
        let upto = (cutoff.saturating_add(1), &[][..]);
        Ok(self.gone.retain_in(..upto, |_, _| false)?)
    }

    /// Live elements with this prefix (for deleting a whole object).
    pub fn scan(&self, prefix: &[u8]) -> Result<Vec<Element>> {
        let (lo, end) = range_bounds(prefix);
        let hi = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let mut out = Vec::new();
        for r in self.live.range::<&[u8]>((lo, hi))? {
            let (k, v) = r?;
            out.push(live_element(k.value(), v.value())?);
        }
        Ok(out)
    }

    pub fn chunk(&self, id: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.chunks.get(id)?.map(|v| v.value().to_vec()))
    }

    pub fn put_chunk(&mut self, id: u64, rec: &[u8]) -> Result<()> {
        self.chunks.insert(id, rec)?;
        Ok(())
    }

    pub fn remove_chunk(&mut self, id: u64) -> Result<()> {
        self.chunks.remove(id)?;
        self.forget_live_debts(id);
        Ok(())
    }

    pub fn put_segment(&mut self, id: u64, rec: &[u8]) -> Result<()> {
        self.segments.insert(id, rec)?;
        Ok(())
    }

    pub fn remove_segment(&mut self, id: u64) -> Result<()> {
        self.segments.remove(id)?;
        Ok(())
    }

    pub fn counter(&self, name: &str) -> Result<u64> {
        Ok(self.counters.get(name)?.map_or(0, |v| v.value()))
    }

    pub fn set_counter(&mut self, name: &str, v: u64) -> Result<()> {
        self.counters.insert(name, v)?;
        Ok(())
    }

    pub fn log_tid(&mut self, tid: u64, time_ns: u64) -> Result<()> {
        self.tids.insert(tid, time_ns)?;
        Ok(())
    }

    /// The newest TID committed at or before `time_ns`, searching from
    /// `from` on (TIDs and their times both grow).
    pub fn tid_before_time(&self, from: u64, time_ns: u64) -> Result<Option<u64>> {
        tid_before_time(&self.tids, from, time_ns)
    }

    pub fn add_orphan(&mut self, ino: u64) -> Result<()> {
        self.orphans.insert(ino, ())?;
        Ok(())
    }

    pub fn remove_orphan(&mut self, ino: u64) -> Result<()> {
        self.orphans.remove(ino)?;
        Ok(())
    }

    /// The candidate chunk for this hash (see MetaRead::dedup): this
    /// transaction's entries, then those waiting, then the table's.
    pub fn dedup(&self, hash: &[u8]) -> Result<Option<u64>> {
        let key = dedup::key(hash);
        if let Some(v) = self.new_dedup.get(&key).copied().or(self.pending.get(&key)) {
            return Ok(Some(dedup::decode(v)));
        }
        Ok(self.dedup.get(key)?.map(|v| dedup::decode(v.value())))
    }

    /// Indexes `chunk` under `hash`. An entry of another chunk whose hash
    /// shares the first 6 bytes is replaced (that content loses dedup only).
    /// The entry waits with others and reaches the table in a batch
    /// (`dedup/pending.rs`).
    pub fn put_dedup(&mut self, hash: &[u8], chunk: u64) -> Result<()> {
        if chunk < dedup::MAX_INDEXED_CHUNK {
            self.new_dedup
                .insert(dedup::key(hash), dedup::encode(chunk));
        }
        Ok(())
    }

    /// Removes the index entry of `hash` if it names `chunk`, wherever it
    /// is (this transaction's, waiting, or in the table).
    pub fn remove_dedup(&mut self, hash: &[u8], chunk: u64) -> Result<()> {
        if chunk >= dedup::MAX_INDEXED_CHUNK {
            return Ok(());
        }
        let (key, val) = (dedup::key(hash), dedup::encode(chunk));
        if self.new_dedup.get(&key) == Some(&val) {
            self.new_dedup.remove(&key);
        }
        if self.pending.get(&key) == Some(val) {
            self.gone_dedup.push((key, val));
        }
        if self.dedup.get(key)?.map(|v| v.value()) == Some(val) {
            self.dedup.remove(key)?;
        }
        Ok(())
    }

    /// At the end of the transaction: writes the waiting entries and this
    /// transaction's to the table, sorted, when a batch has gathered (or
    /// on `drain_dedup`); otherwise they wait. What to do with the waiting
    /// entries once the transaction is committed.
    fn write_dedup(&mut self) -> Result<DedupOut> {
        let new = std::mem::take(&mut self.new_dedup);
        let gone = std::mem::take(&mut self.gone_dedup);
        if !self.drain_dedup && !self.pending.due(new.len()) {
            return Ok(DedupOut::Kept(gone, new));
        }
        let all = self.pending.merged(&gone, &new);
        for (k, v) in &all {
            self.dedup.insert(*k, *v)?;
        }
        // Every chunk stored so far has its entry in the table now.
        let next = self.counter("next_chunk")?;
        self.set_counter(DEDUP_INDEXED, next)?;
        Ok(DedupOut::Written(gone, all))
    }

    pub fn put_snapshot(&mut self, name: &str, rec: &[u8]) -> Result<()> {
        self.snapshots.insert(name, rec)?;
        Ok(())
    }

    pub fn remove_snapshot(&mut self, name: &str) -> Result<bool> {
        Ok(self.snapshots.remove(name)?.is_some())
    }

    pub fn snapshots(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        for r in self.snapshots.iter()? {
            let (k, v) = r?;
            out.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(out)
    }

    pub fn snapshot(&self, name: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.snapshots.get(name)?.map(|v| v.value().to_vec()))
    }

    pub fn remove_device(&mut self, id: u32) -> Result<()> {
        self.devices.remove(id)?;
        Ok(())
    }

    pub fn put_device(&mut self, id: u32, desc: &[u8]) -> Result<()> {
        self.devices.insert(id, desc)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::RecordType;

    fn store() -> (tempfile::TempDir, MetaStore) {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        (d, s)
    }

    #[test]
    fn versions_and_asof() {
        let (_d, s) = store();
        let k = ElemKey::new(5, RecordType::Extent, &7u64.to_be_bytes());
        for tid in 1..=10u64 {
            s.write(|w| w.put(&k, format!("v{tid}").as_bytes(), tid * 10))
                .unwrap();
        }
        let r = s.read().unwrap();
        assert_eq!(r.get(&k).unwrap().unwrap().payload, b"v10");
        assert_eq!(r.get_asof(&k, 55).unwrap().unwrap().payload, b"v5");
        assert_eq!(r.get_asof(&k, 50).unwrap().unwrap().payload, b"v5");
        assert_eq!(r.get_asof(&k, 49).unwrap().unwrap().payload, b"v4");
        assert!(r.get_asof(&k, 9).unwrap().is_none());
        drop(r);
        s.write(|w| w.end(&k, 200)).unwrap();
        let r = s.read().unwrap();
        assert!(r.get(&k).unwrap().is_none());
        assert_eq!(r.get_asof(&k, 150).unwrap().unwrap().payload, b"v10");
        assert!(r.get_asof(&k, 200).unwrap().is_none());
    }

    #[test]
    fn prune_respects_retained_tids() {
        let (_d, s) = store();
        let k = ElemKey::new(1, RecordType::Inode, &[]);
        for tid in 1..=5u64 {
            s.write(|w| w.put(&k, &[tid as u8], tid)).unwrap();
        }
        // Versions 1..4 are ended (at 2..5). Keep tid 2 visible.
        let removed = s.write(|w| w.prune(0, 5, &[2], false)).unwrap();
        let mut got: Vec<u64> = removed.iter().map(|e| e.create_tid).collect();
        got.sort();
        assert_eq!(got, vec![1, 3, 4]);
        let r = s.read().unwrap();
        assert_eq!(r.get_asof(&k, 2).unwrap().unwrap().payload, vec![2]);
        assert!(r.get_asof(&k, 3).unwrap().is_none());
        assert_eq!(r.get(&k).unwrap().unwrap().payload, vec![5]);
    }

    #[test]
    fn scan_asof_versions_and_dry_run() {
        let (_d, s) = store();
        let k = |i: u64| ElemKey::new(3, RecordType::DirEntry, &i.to_be_bytes());
        s.write(|w| {
            w.put(&k(1), b"a1", 1)?;
            w.put(&k(2), b"b1", 1)?;
            Ok::<_, MetaError>(())
        })
        .unwrap();
        s.write(|w| w.put(&k(1), b"a2", 2)).unwrap();
        s.write(|w| w.end(&k(2), 3)).unwrap();
        s.write(|w| w.put(&k(3), b"c4", 4)).unwrap();
        let r = s.read().unwrap();
        let at = |t| -> Vec<Vec<u8>> {
            let p = ElemKey::prefix(3, RecordType::DirEntry);
            r.scan_asof(&p, t)
                .unwrap()
                .into_iter()
                .map(|e| e.payload)
                .collect()
        };
        assert_eq!(at(1), vec![b"a1".to_vec(), b"b1".to_vec()]);
        assert_eq!(at(2), vec![b"a2".to_vec(), b"b1".to_vec()]);
        assert_eq!(at(3), vec![b"a2".to_vec()]);
        assert_eq!(at(4), vec![b"a2".to_vec(), b"c4".to_vec()]);
        let v: Vec<(u64, u64)> = r
            .versions(&k(1))
            .unwrap()
            .iter()
            .map(|e| (e.create_tid, e.delete_tid))
            .collect();
        assert_eq!(v, vec![(1, 2), (2, TID_MAX)]);
        drop(r);
        let would = s.write(|w| w.prune(0, 4, &[], true)).unwrap();
        assert_eq!(would.len(), 2);
        assert_eq!(s.read().unwrap().sizes().unwrap().1, 2, "dry run removed");
        let done = s.write(|w| w.prune(0, 4, &[], false)).unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!(s.read().unwrap().sizes().unwrap().1, 0);
    }

    #[test]
    fn current_lookup_cost_is_flat_with_history() {
        // Not a timing test: counts that the live table holds one element per
        // key however many versions exist.
        let (_d, s) = store();
        let k = ElemKey::new(9, RecordType::Inode, &[]);
        s.write(|w| {
            for tid in 1..=1000u64 {
                w.put(&k, b"x", tid)?;
            }
            Ok::<_, MetaError>(())
        })
        .unwrap();
        let (live, hist, _) = s.read().unwrap().sizes().unwrap();
        assert_eq!((live, hist), (1, 999));
    }

    #[test]
    fn scan_prefix() {
        let (_d, s) = store();
        s.write(|w| {
            for i in 0..10u64 {
                w.put(
                    &ElemKey::new(3, RecordType::Extent, &i.to_be_bytes()),
                    b"e",
                    1,
                )?;
            }
            w.put(&ElemKey::new(3, RecordType::Inode, &[]), b"i", 1)?;
            w.put(&ElemKey::new(4, RecordType::Extent, &[0; 8]), b"o", 1)?;
            Ok::<_, MetaError>(())
        })
        .unwrap();
        let r = s.read().unwrap();
        assert_eq!(
            r.scan(&ElemKey::prefix(3, RecordType::Extent), None, usize::MAX)
                .unwrap()
                .len(),
            10
        );
        assert_eq!(
            r.scan(&ElemKey::object_prefix(3), None, usize::MAX)
                .unwrap()
                .len(),
            11
        );
        let from = ElemKey::new(3, RecordType::Extent, &5u64.to_be_bytes());
        assert_eq!(
            r.scan(
                &ElemKey::prefix(3, RecordType::Extent),
                Some(from.as_bytes()),
                3
            )
            .unwrap()
            .len(),
            3
        );
    }
}

#[cfg(test)]
mod born_tests {
    //! The index of live elements by create TID (`born_v1`).
    use super::*;
    use crate::key::RecordType;

    fn born(s: &MetaStore, since: u64) -> Vec<(u64, Vec<u8>)> {
        let r = s.read().unwrap();
        let v = r.born_after(since).unwrap();
        v.into_iter().map(|e| (e.create_tid, e.payload)).collect()
    }

    #[test]
    fn the_index_follows_puts_ends_and_removals() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        let k = |i: u64| ElemKey::new(i, RecordType::Inode, &[]);
        s.write(|w| {
            w.put(&k(1), b"a1", 1)?;
            w.put(&k(2), b"b1", 1)?;
            w.set_counter("last_tid", 1)
        })
        .unwrap();
        s.write(|w| {
            w.put(&k(1), b"a2", 2)?;
            w.end(&k(2), 2)?;
            w.put(&k(3), b"c2", 2)?;
            w.set_counter("last_tid", 2)
        })
        .unwrap();
        assert_eq!(born(&s, 0), vec![(2, b"a2".to_vec()), (2, b"c2".to_vec())]);
        assert!(born(&s, 2).is_empty());
        s.write(|w| w.remove_live(&k(3))).unwrap();
        assert_eq!(born(&s, 1), vec![(2, b"a2".to_vec())]);
        let ended = s.read().unwrap().ended_after(1).unwrap();
        let ended: Vec<_> = ended.iter().map(|e| (e.create_tid, e.delete_tid)).collect();
        assert_eq!(ended, vec![(1, 2), (1, 2)]);
    }

    #[test]
    fn a_pool_written_without_the_index_gets_it_rebuilt_at_open() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        let k = ElemKey::new(7, RecordType::Inode, &[]);
        s.write(|w| {
            w.put(&k, b"old", 1)?;
            w.set_counter("last_tid", 1)
        })
        .unwrap();
        // A release without the index writes a new element and a new TID.
        {
            let db = s.db().unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut live = txn.open_table(LIVE).unwrap();
                let k2 = ElemKey::new(8, RecordType::Inode, &[]);
                live.insert(
                    k2.as_bytes(),
                    encode_value(k2.as_bytes(), 5, b"new").as_slice(),
                )
                .unwrap();
                live.insert(
                    k.as_bytes(),
                    encode_value(k.as_bytes(), 5, b"mod").as_slice(),
                )
                .unwrap();
                let mut c = txn.open_table(COUNTERS).unwrap();
                c.insert("last_tid", 5).unwrap();
            }
            txn.commit().unwrap();
        }
        drop(s);
        let s = MetaStore::open(&path, 1 << 20, PageCache::new()).unwrap();
        assert_eq!(
            born(&s, 0),
            vec![(5, b"mod".to_vec()), (5, b"new".to_vec())]
        );
    }
}

#[cfg(test)]
mod dedup_batch_tests {
    //! Dedup index entries wait in RAM and reach `dedup_v2` in batches
    //! (`dedup/pending.rs`).
    use super::*;

    fn hash(i: u8) -> [u8; 32] {
        [i; 32]
    }

    fn table(s: &MetaStore) -> Vec<([u8; 6], u64)> {
        let mut v = Vec::new();
        s.read()
            .unwrap()
            .for_each_dedup(|k, id| v.push((k, id)))
            .unwrap();
        v
    }

    fn found(s: &MetaStore, i: u8) -> Option<u64> {
        s.read().unwrap().dedup(&hash(i)).unwrap()
    }

    fn put(s: &MetaStore, i: u8, chunk: u64) {
        s.write(|w| w.put_dedup(&hash(i), chunk)).unwrap();
    }

    #[test]
    fn entries_are_found_while_they_wait_and_written_in_one_batch() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        s.dedup_pending().set_batch(3);
        put(&s, 1, 10);
        put(&s, 2, 20);
        assert_eq!((found(&s, 1), found(&s, 2)), (Some(10), Some(20)));
        assert!(table(&s).is_empty(), "written before the batch");
        // A failed transaction adds nothing.
        let r = s.write(|w| {
            w.put_dedup(&hash(4), 40)?;
            Err::<(), _>(MetaError::Db("test".into()))
        });
        assert!(r.is_err());
        assert_eq!(found(&s, 4), None);
        // The chunk of a waiting entry is removed: the entry goes.
        s.write(|w| w.remove_dedup(&hash(2), 20)).unwrap();
        assert_eq!(found(&s, 2), None);
        put(&s, 3, 30);
        assert_eq!(s.dedup_pending().len(), 2);
        put(&s, 5, 50);
        let keys = |v: &[u8]| {
            v.iter()
                .map(|&i| (dedup::key(&hash(i)), i as u64 * 10))
                .collect::<Vec<_>>()
        };
        assert_eq!(table(&s), keys(&[1, 3, 5]), "the batch");
        assert!(s.dedup_pending().is_empty());
        // A removal reaches the table too.
        s.write(|w| w.remove_dedup(&hash(3), 30)).unwrap();
        assert_eq!(table(&s), keys(&[1, 5]));
        // Closing writes what waits; a store opened again finds it.
        put(&s, 6, 60);
        s.drain().unwrap();
        assert_eq!(table(&s), keys(&[1, 5, 6]));
        drop(s);
        let s = MetaStore::open(&d.path().join("m.redb"), 1 << 20, PageCache::new()).unwrap();
        assert_eq!(found(&s, 6), Some(60));
    }

    /// Stores chunk `id` with its entry; its record is the hash itself
    /// (what `reindex_dedup`'s reader gives back in these tests).
    fn store_chunk(s: &MetaStore, i: u8, id: u64) {
        s.write(|w| {
            w.put_chunk(id, &hash(i))?;
            w.put_dedup(&hash(i), id)?;
            w.set_counter("next_chunk", id + 1)
        })
        .unwrap();
    }

    fn reindex(s: &MetaStore) -> u64 {
        s.reindex_dedup(|raw| Some(raw.to_vec())).unwrap()
    }

    #[test]
    fn entries_a_crash_lost_are_indexed_again_at_open() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        store_chunk(&s, 1, 10);
        s.drain().unwrap();
        store_chunk(&s, 2, 11);
        store_chunk(&s, 3, 12);
        s.write(|w| {
            w.remove_chunk(12)?;
            w.remove_dedup(&hash(3), 12)
        })
        .unwrap();
        let s = reopen_without_drain(s, &path); // as after a crash
        assert_eq!(found(&s, 1), Some(10), "in the table before the crash");
        assert_eq!(found(&s, 2), None, "lost with the crash");
        assert_eq!(reindex(&s), 1, "chunk 10 was in the table, 12 is gone");
        assert_eq!((found(&s, 2), found(&s, 3)), (Some(11), None));
        let want = |v: &[(u8, u64)]| {
            v.iter()
                .map(|&(i, id)| (dedup::key(&hash(i)), id))
                .collect::<Vec<_>>()
        };
        assert_eq!(table(&s), want(&[(1, 10), (2, 11)]), "written at once");
        assert_eq!(reindex(&s), 0, "nothing left to index");
    }

    #[test]
    fn a_damaged_chunk_record_is_left_out_of_the_reindex() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.redb");
        let s = MetaStore::create(&path).unwrap();
        store_chunk(&s, 1, 0);
        store_chunk(&s, 2, 1);
        let s = reopen_without_drain(s, &path);
        // The reader gives no hash for record 1 (as ChunkRec::decode fails
        // on a damaged record): it is left out, the other one indexed.
        let n = s
            .reindex_dedup(|raw| (raw != hash(2)).then(|| raw.to_vec()))
            .unwrap();
        assert_eq!(n, 1);
        assert_eq!((found(&s, 1), found(&s, 2)), (Some(0), None));
    }

    pub(super) fn reopen_without_drain(s: MetaStore, path: &Path) -> MetaStore {
        drop(s);
        MetaStore::open(path, 1 << 20, PageCache::new()).unwrap()
    }

    #[test]
    fn a_store_without_the_counter_was_indexed_in_full() {
        let d = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&d.path().join("m.redb")).unwrap();
        store_chunk(&s, 1, 0);
        s.write(|w| {
            w.counters.remove(DEDUP_INDEXED)?;
            Ok::<_, MetaError>(())
        })
        .unwrap();
        assert_eq!(reindex(&s), 0, "an older release wrote every entry");
        let r = s.read().unwrap();
        assert_eq!(r.counter(DEDUP_INDEXED).unwrap(), 1);
    }
}
