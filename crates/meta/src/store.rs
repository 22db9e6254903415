//! The metadata store: one redb database holding the versioned element key
//! space and the pool's tables. Reads run in read transactions (snapshots,
//! never blocked by the writer); all changes of one flush group are one write
//! transaction committed with immediate durability.

use crate::dedup;
use crate::dedup::pending::Pending;
use crate::element::{hist_key, split_hist_key, Element, ValueSeal};
use crate::error::{MetaError, Result};
use crate::key::{prefix_end, ElemKey, RecordType};
use crate::mirror::{Mirror, MirrorStats};
use crate::page_sums;
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
mod quiet;
mod read;
mod rollback;
mod write;
use born_lazy::{BornPending, BornRepair, BornTxn};
pub use hist_lazy::FreshIndex;
use hist_lazy::{ended_value, FreshKey, FreshView};
use live_lazy::DebtsTxn;
pub use live_lazy::{Debts, LiveDebts, OWING};
pub use read::MetaRead;
pub use rollback::RolledBack;
use write::DedupOut;
pub use write::MetaWrite;

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
    /// Opened by `open_salvage`: its pages were not verified.
    salvage: bool,
    /// In a salvage store, the live element keys the creation index names
    /// (`born_v1`, as far as it reads), to tell a record the damage hides
    /// from a hole or a missing name.
    named: Arc<BornNames>,
    /// How element values are stored: plain, or sealed (an encrypted pool).
    seal: ValueSeal,
}

/// The live element keys a salvage view's creation index names, and
/// whether every page of the index was read: where one was not, a key that
/// no pass reaches cannot be told absent (a hole, a missing name) from
/// lost.
#[derive(Default)]
pub(crate) struct BornNames {
    pub(crate) keys: std::collections::BTreeSet<Vec<u8>>,
    pub(crate) complete: bool,
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
    /// The other copies' files, when mirrored (grows by `add_copy`).
    mirrors: parking_lot::Mutex<Vec<std::path::PathBuf>>,
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
fn live_element(seal: &ValueSeal, key: &[u8], v: &[u8]) -> Result<Element> {
    let (create_tid, payload) = seal.decode(key, v)?;
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
    seal: &ValueSeal,
    live: &impl ReadableTable<&'static [u8], &'static [u8]>,
    hist: &impl ReadableTable<&'static [u8], &'static [u8]>,
    fresh: &FreshView<'_, impl ReadableTable<FreshKey, &'static [u8]>>,
    key: &ElemKey,
    tid: u64,
) -> Result<Option<Element>> {
    if let Some(v) = live.get(key.as_bytes())? {
        let e = live_element(seal, key.as_bytes(), v.value())?;
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
            Some(hist_element(seal, k.value(), v.value())?)
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

fn hist_element(seal: &ValueSeal, k: &[u8], v: &[u8]) -> Result<Element> {
    let (key, create_tid) = split_hist_key(k)?;
    let (delete_tid, payload) = seal.decode(k, v)?;
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
    quiet::catch(f).unwrap_or_else(|p| Err(MetaError::Panicked(panic_text(&*p))))
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
            salvage: false,
            named: Arc::default(),
            seal: ValueSeal::default(),
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
        Self::open_mirrored(path, &[], cache_bytes, pages, storage)
    }

    /// Opens an existing store (see `open_with`) kept as several copies:
    /// the file at `path` and those at `mirrors` (each created from it
    /// when missing). Where they differ, the copy that passes the
    /// integrity check with the most commits wins (the first of equals)
    /// and the others are repaired from it.
    pub fn open_mirrored(
        path: &Path,
        mirrors: &[std::path::PathBuf],
        cache_bytes: usize,
        pages: Arc<PageCache>,
        storage: Arc<dyn Storage>,
    ) -> Result<Self> {
        // Every step that reads the file runs guarded: a damaged page that
        // the integrity check did not cover must give an error, not a panic.
        let how = ReopenWith {
            path: path.to_path_buf(),
            mirrors: parking_lot::Mutex::new(mirrors.to_vec()),
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
            salvage: false,
            named: Arc::default(),
            seal: ValueSeal::default(),
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

    /// Adds a copy of the store at `path` while it is in use (made from a
    /// copy that checks out, then written with the others); every later
    /// open must be given it too. Refused when the store is kept as one
    /// copy (a mirror is only set up by an open).
    pub fn add_copy(&self, path: &Path) -> Result<()> {
        let (Some(w), Some(m)) = (&self.reopen, self.mirror.lock().clone()) else {
            return Err(MetaError::Io(format!(
                "{}: the metadata is kept as one copy; the copy is made at the next open",
                path.display()
            )));
        };
        let io = io_err(path);
        let file = w.storage.open(path, &OpenHow::REPLACE).map_err(&io)?;
        m.add_copy(file).map_err(io)?;
        w.mirrors.lock().push(path.to_path_buf());
        Ok(())
    }

    /// Verifies every page of every metadata copy, repairing bad pages
    /// from a good copy; returns the pages repaired (None: one copy).
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
    /// panic in a drop would abort: it is contained here. A salvage store
    /// (a copy in RAM, never written back) is not closed at all: a panic
    /// while redb unwinds from another one in its destructors cannot be
    /// caught (it aborts the process), and closing it keeps nothing.
    fn drop(&mut self) {
        if let Some(db) = self.db.get_mut().take() {
            if self.salvage {
                std::mem::forget(db);
                return;
            }
            if quiet::catch(move || drop(db)).is_ok() {
                self.save_page_sums();
            }
        }
    }
}

impl MetaStore {
    /// Closes the store for good (as dropping it does, while other
    /// holders of the pool may still run: they get "closed" errors), so
    /// that the next open finds it closed cleanly.
    pub fn close(&self) {
        if self.salvage {
            return;
        }
        let db = self.db.write().take();
        if db.is_some_and(|db| quiet::catch(move || drop(db)).is_ok()) {
            self.save_page_sums();
        }
    }

    /// After a clean close, the copies' page checksums for the next open
    /// (`page_sums`); nothing when a copy failed or was dropped.
    fn save_page_sums(&self) {
        let (Some(w), Some(m)) = (&self.reopen, self.mirror.lock().clone()) else {
            return;
        };
        let Some(sums) = m.sync_data().ok().and_then(|_| m.closing_sums()) else {
            return;
        };
        let path = page_sums::path_for(&w.path);
        if let Err(e) = page_sums::save(&*w.storage, &path, &sums) {
            tracing::warn!(
                "{}: {e}; the next open reads every metadata copy",
                path.display()
            );
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
    let paths = w.mirrors.lock().clone();
    // Taken (and emptied) at every open, before anything is written.
    let known = page_sums::take(storage, &page_sums::path_for(path));
    let mut trusted = false;
    let (backend, mirror): (Arc<dyn Backend>, _) = match paths.is_empty() {
        true => (file, None),
        false => {
            // The first copy alone (verified by the open below); the next
            // open tries the others again.
            let one_copy = |e: &dyn std::fmt::Display| {
                tracing::error!("metadata copies: {e}; going on with one copy of the metadata");
                open_db(&ReopenWith {
                    mirrors: parking_lot::Mutex::new(Vec::new()),
                    ..w.clone_parts()
                })
            };
            let (mut copies, mut names) = (vec![file], vec![path.clone()]);
            for mp in &paths {
                match storage.open(mp, &OpenHow::CREATE) {
                    Ok(c) => (copies.push(c), names.push(mp.clone())),
                    Err(e) => {
                        tracing::error!("metadata copy {}: {e}; going on without it", mp.display());
                        continue;
                    }
                };
            }
            if copies.len() < 2 {
                return one_copy(&"no other copy opens");
            }
            let picked = std::cell::Cell::new(None);
            let pick = |c: &[Arc<dyn Backend>]| {
                picked.set(Some(good_copy(c, &names)));
                Ok(picked.get().unwrap_or(0))
            };
            // After a clean close the copies are equal to the checksums it
            // recorded: nothing is read now, each page is checked when read.
            let known = known.and_then(|k| Mirror::open_known(copies.clone(), k).ok().flatten());
            trusted = known.is_some();
            let m = match known.map_or_else(|| Mirror::open(copies, pick), Ok) {
                Ok(m) => Arc::new(m),
                // The first copy was the good one, but no other could be
                // made equal to it (a full host under them).
                Err(e) if picked.get() == Some(0) => return one_copy(&e),
                Err(e) => return Err(io_err(path)(e)),
            };
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
    // damaged pages (which can lose elements silently or panic). Copies
    // opened from the checksums of a clean close need not be: every page
    // read is checked against what was written, and one damaged in every
    // copy is an error for the read that meets it.
    tracing::debug!(
        "metadata: opened {} copies trusting the last clean close: {trusted}",
        paths.len() + 1
    );
    let db = Database::builder()
        .set_cache_size(w.cache_bytes)
        .set_check_integrity_on_open(!trusted)
        .create_with_backend(CachedFile::new(backend, w.pages.clone()).map_err(io_err(path))?)
        .map_err(|e| damaged_or(path, e))?;
    Ok((db, mirror))
}

impl ReopenWith {
    fn clone_parts(&self) -> ReopenWith {
        ReopenWith {
            path: self.path.clone(),
            mirrors: parking_lot::Mutex::new(self.mirrors.lock().clone()),
            cache_bytes: self.cache_bytes,
            pages: self.pages.clone(),
            storage: self.storage.clone(),
            file: self.file.clone(),
        }
    }
}

/// Which of differing metadata copies to keep: of those that pass the
/// integrity check (opened from a copy in RAM, so that a damaged file is
/// not changed), the one with the most write transactions (a copy dropped
/// after a failed write is behind), the first of equals; the first when
/// none passes (its open then fails with the damage found).
fn good_copy(copies: &[Arc<dyn Backend>], names: &[std::path::PathBuf]) -> usize {
    let writes: Vec<Option<u64>> = copies.iter().map(|c| writes_if_sound(&**c)).collect();
    let best = writes.iter().flatten().max().copied();
    let pick = best.map_or(0, |b| {
        writes.iter().position(|w| *w == Some(b)).unwrap_or(0)
    });
    for (i, w) in writes.iter().enumerate().filter(|(i, _)| *i != pick) {
        let why = match w {
            None => "failed its check;",
            Some(n) if Some(*n) < best => "is older than",
            Some(_) => continue,
        };
        let name = names
            .get(i)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let good = names
            .get(pick)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        match i {
            0 => tracing::error!("metadata {name} {why} its mirror {good}, which repairs it"),
            _ => tracing::warn!("metadata copy {name} {why} {good}, which repairs it"),
        }
    }
    pick
}

/// The count of write transactions of a copy of the store, if it passes
/// redb's integrity check (every committed page against its parent's
/// checksum), checked in RAM.
#[allow(
    clippy::cast_possible_truncation,
    reason = "a probe length; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
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
            salvage: true,
            named: Arc::default(),
            seal: ValueSeal::default(),
        };
        // Without the index (damage in `fresh_v1`), readers scan the table.
        if let Err(e) = guarded(|| s.load_fresh_index()) {
            tracing::warn!("ended elements waiting in fresh_v1 not indexed: {e}");
        }
        let mut s = s;
        s.named = Arc::new(s.born_names());
        Ok(s)
    }

    /// The element keys `born_v1` names: a pass from its start and, when
    /// damage stops that one, a pass back from its end to the damage.
    fn born_names(&self) -> BornNames {
        let mut keys = std::collections::BTreeSet::new();
        let mut pass = |back: bool| {
            guarded(|| {
                let t = self.db()?.begin_read()?.open_table(BORN)?;
                let mut add = |e: std::result::Result<_, redb::StorageError>| -> Result<()> {
                    let e: (redb::AccessGuard<(u64, &[u8])>, _) = e?;
                    keys.insert(e.0.value().1.to_vec());
                    Ok(())
                };
                match back {
                    false => t.iter()?.try_for_each(&mut add),
                    true => t.iter()?.rev().try_for_each(&mut add),
                }
            })
        };
        let complete = match pass(false) {
            Ok(()) => true,
            Err(e) => {
                let back = pass(true)
                    .err()
                    .map_or(String::new(), |e| format!(" ({e})"));
                tracing::warn!(
                    "salvage: the creation index could not be read whole ({e}); read back from \
                     its end to the damage{back}: a block no record is found for reads as an \
                     error, not as a hole"
                );
                false
            }
        };
        BornNames { keys, complete }
    }

    /// Seals the element values (and snapshot names and records) written
    /// from now on with `keys` and opens sealed ones (an encrypted pool, unlocked): called at open, before
    /// any element is read or written. False if they were sealed already.
    pub fn seal_values(&self, keys: std::sync::Arc<cairn_crypt::PoolKeys>) -> bool {
        self.seal.set(keys)
    }

    /// Keeps sealed element values as they are, without opening them (an
    /// encrypted mirror opened without its key: `element/sealed.rs`).
    /// False if the values' mode was set already.
    pub fn keep_sealed(&self) -> bool {
        self.seal.set_opaque()
    }

    /// True if element payloads are handed out sealed (`keep_sealed`).
    pub fn is_opaque(&self) -> bool {
        self.seal.is_opaque()
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
                salvage: self.salvage,
                named: self.named.clone(),
                seal: self.seal.clone(),
                ino_bound: std::sync::OnceLock::new(),
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
                    stripes: txn.open_table(STRIPES).map_err(MetaError::from)?,
                    counters: txn.open_table(COUNTERS).map_err(MetaError::from)?,
                    tids: txn.open_table(TIDS).map_err(MetaError::from)?,
                    ino_epochs: txn.open_table(INO_EPOCHS).map_err(MetaError::from)?,
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
                    seal: self.seal.clone(),
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
        quiet::catch(run).unwrap_or_else(|p| Err(MetaError::Panicked(panic_text(&*p)).into()))
    }
}

#[cfg(test)]
mod tests;
