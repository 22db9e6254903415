//! Snapshots: a snapshot is a named, retained TID. Creating one commits the
//! overlay and records (name -> TID) in one small transaction, whatever the
//! size of the tree; when little is buffered, an intent log record makes it
//! durable first and the commit follows (writeback/intent.rs). Its content hash (see treehash.rs) is computed after,
//! from the immutable view at that TID, so creation never waits for a walk.

use crate::error::{FsError, Result};
use crate::types::{Extent, Time};
use crate::vfs::Fs;
use cairn_data::ChunkRec;
use cairn_meta::{MetaRead, RecordType};
use std::collections::HashMap;

const SNAPSHOT_VERSION: u8 = 1;
const SNAPSHOT_LEN: usize = 1 + 8 + 8 + 1 + 1 + 32 + 8 + 8 + 4;

/// Named by the administrator, kept until deleted; or made by
/// `snapshot auto` and kept by the daily/weekly/monthly policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotKind {
    Named,
    Auto,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub name: String,
    pub tid: u64,
    pub time_ns: u64,
    pub kind: SnapshotKind,
    /// Content hash over the tree at `tid`; None while being computed.
    pub hash: Option<[u8; 32]>,
    pub files: u64,
    pub bytes: u64,
}

impl Snapshot {
    /// A snapshot taken now at `tid`, its hash not yet computed.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "nanoseconds since 1970: now is after 1970 and before 2554"
    )]
    pub(crate) fn new(name: &str, tid: u64, kind: SnapshotKind) -> Snapshot {
        Snapshot {
            name: name.to_string(),
            tid,
            time_ns: Time::now().as_nanos() as u64,
            kind,
            hash: None,
            files: 0,
            bytes: 0,
        }
    }

    /// `ver u8 | tid u64 | time u64 | kind u8 | has_hash u8 | hash [32] |
    /// files u64 | bytes u64 | crc32c u32` (little endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(SNAPSHOT_LEN);
        b.push(SNAPSHOT_VERSION);
        b.extend_from_slice(&self.tid.to_le_bytes());
        b.extend_from_slice(&self.time_ns.to_le_bytes());
        b.push(match self.kind {
            SnapshotKind::Named => 0,
            SnapshotKind::Auto => 1,
        });
        b.push(self.hash.is_some() as u8);
        b.extend_from_slice(&self.hash.unwrap_or_default());
        b.extend_from_slice(&self.files.to_le_bytes());
        b.extend_from_slice(&self.bytes.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(b.len(), SNAPSHOT_LEN);
        b
    }

    pub fn decode(name: &str, b: &[u8]) -> Result<Snapshot> {
        let bad = |why: &str| FsError::Io(format!("snapshot {name:?}: {why}"));
        if b.len() != SNAPSHOT_LEN || b[0] != SNAPSHOT_VERSION {
            return Err(bad("unknown record version or length"));
        }
        let (body, crc) = b.split_at(SNAPSHOT_LEN - 4);
        if crc32c::crc32c(body)
            != u32::from_le_bytes(crc.try_into().expect("slice length matches the array"))
        {
            return Err(bad("record checksum mismatch"));
        }
        let u64_at = |o: usize| {
            u64::from_le_bytes(
                b[o..o + 8]
                    .try_into()
                    .expect("slice length matches the array"),
            )
        };
        Ok(Snapshot {
            name: name.to_string(),
            tid: u64_at(1),
            time_ns: u64_at(9),
            kind: if b[17] == 1 {
                SnapshotKind::Auto
            } else {
                SnapshotKind::Named
            },
            hash: (b[18] == 1).then(|| {
                b[19..51]
                    .try_into()
                    .expect("slice length matches the array")
            }),
            files: u64_at(51),
            bytes: u64_at(59),
        })
    }
}

/// A snapshot with the space its deletion would give back.
#[derive(Debug, Clone)]
pub struct SnapshotUsage {
    pub snap: Snapshot,
    /// Bytes of chunks that only this snapshot keeps (among snapshots and
    /// the current tree).
    pub unique_bytes: u64,
}

/// What a snapshot name may be (it is a directory name under .snapshots).
pub const SNAPSHOT_NAME_RULE: &str = "a snapshot name is 1 to 255 bytes, not \".\" or \"..\", without \"/\", \"@@\" or control characters (newline, tab...)";

/// Why `name` cannot name a snapshot, or None if it can.
pub fn snapshot_name_problem(name: &str) -> Option<String> {
    let why = if name.is_empty() {
        "it is empty".to_string()
    } else if name.len() > crate::types::MAX_NAME {
        format!("it is {} bytes long", name.len())
    } else if name == "." || name == ".." {
        "\".\" and \"..\" are reserved".to_string()
    } else if name.contains('/') {
        "it contains \"/\"".to_string()
    } else if name.contains("@@") {
        "it contains \"@@\" (reserved for views of old versions)".to_string()
    } else if let Some(c) = name.chars().find(|c| c.is_control()) {
        format!("it contains the control character {c:?}")
    } else {
        return None;
    };
    Some(format!(
        "invalid snapshot name {name:?}: {why}; {SNAPSHOT_NAME_RULE}"
    ))
}

pub(crate) fn check_snapshot_name(name: &str) -> Result<()> {
    match snapshot_name_problem(name) {
        Some(why) => Err(FsError::BadRequest(why)),
        None => Ok(()),
    }
}

/// All snapshots of a committed view, oldest TID first.
pub(crate) fn read_snapshots(r: &MetaRead) -> Result<Vec<Snapshot>> {
    let mut v = r
        .snapshots()?
        .into_iter()
        .map(|(n, b)| Snapshot::decode(&n, &b))
        .collect::<Result<Vec<_>>>()?;
    v.sort_by_key(|s| (s.tid, s.time_ns));
    Ok(v)
}

impl Fs {
    /// Reloads the snapshot TIDs after snapshots were added or removed.
    pub(crate) fn refresh_retained(&self) -> Result<()> {
        // Without the key a mirror cannot read its snapshots' TIDs (their
        // records are sealed); it prunes nothing (`needs_key`).
        if self.pool.meta.is_opaque() {
            return Ok(());
        }
        let mut tids: Vec<u64> = read_snapshots(&self.meta()?)?
            .iter()
            .map(|s| s.tid)
            .collect();
        tids.sort_unstable();
        *self.retained.write() = tids;
        Ok(())
    }

    /// Names the pool's current state and returns once that is durable.
    /// O(1) in the size of the tree: through the intent log when the
    /// changes buffered are small (`snapshot_logged`: one log write and one
    /// cache flush), else the cut (`snapshot_cut`) and the commit of what
    /// it sealed. The content hash is filled in by `hash_pending_snapshots`.
    pub fn snapshot_create(&self, name: &str, kind: SnapshotKind) -> Result<Snapshot> {
        self.refuse_on_mirror()?;
        check_snapshot_name(name)?;
        self.check_ok()?;
        if let Some(snap) = self.snapshot_logged(name, kind)? {
            return Ok(snap);
        }
        let snap = self.snapshot_cut(name, kind)?;
        self.wait_for_cut(snap)
    }

    /// Waits for the commit of a cut's snapshot; its error if it failed.
    pub(crate) fn wait_for_cut(&self, snap: Snapshot) -> Result<Snapshot> {
        let last = self.flush_guard();
        let taken = self.committed_snapshot(&snap.name);
        drop(last);
        match taken {
            Ok(s) if s.tid == snap.tid => Ok(snap),
            _ => Err(FsError::Io(self.sealed_error.lock().take().unwrap_or_else(
                || {
                    format!(
                        "snapshot {} at tid {} was not committed",
                        snap.name, snap.tid
                    )
                },
            ))),
        }
    }

    /// SnapshotExists if `name` is taken (call with the flush lock held).
    pub(crate) fn refuse_taken_name(&self, name: &str) -> Result<()> {
        match self.committed_snapshot(name) {
            Ok(_) => Err(FsError::SnapshotExists(name.to_string())),
            Err(FsError::NoSnapshot(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Commits what snapshot cuts sealed, if anything (after a commit
    /// under way).
    pub fn commit_cuts(&self) {
        drop(self.flush_guard());
    }

    /// Cuts a snapshot without waiting for its commit: every change made
    /// before the call is in it, none made after. With changes buffered,
    /// they are sealed as the next TID and the snapshot is recorded by
    /// that TID's commit, which the flusher starts at once and anything
    /// needing the flush lock (fsync, sync, a flush) finishes first; a
    /// crash before it loses the snapshot with the changes it sealed, as
    /// it loses any change not yet synced. Writers do not wait for it, nor
    /// does the cut wait for a commit under way (`cut_during_commit`).
    pub fn snapshot_cut(&self, name: &str, kind: SnapshotKind) -> Result<Snapshot> {
        self.refuse_on_mirror()?;
        check_snapshot_name(name)?;
        self.check_ok()?;
        // A commit under way, or a logged snapshot waiting for its own:
        // sealed on top of it rather than after it.
        if self.flush_lock.is_locked() || !self.sealed.lock().is_empty() {
            if let Some(snap) = self.cut_during_commit(name, kind)? {
                return Ok(snap);
            }
        }
        let last = self.flush_guard();
        self.refuse_taken_name(name)?;
        let mut snap = Snapshot::new(name, *last, kind);
        let mut lg = self.log_guard();
        let mut st = self.lock_all();
        if st.shards().all(|s| s.dirty.is_empty()) {
            // Nothing buffered: the last commit is the state to name.
            drop(st);
            drop(lg);
            self.pool
                .meta
                .write(|w| Ok::<_, FsError>(w.put_snapshot(name, &snap.encode())?))?;
            drop(last);
            self.refresh_retained()?;
            return Ok(snap);
        }
        snap.tid = *last + 1;
        let ov = self.seal(&mut st, lg.as_deref_mut(), snap.tid);
        drop(lg);
        self.leave_sealed(ov, self.next_ino(), &snap, false);
        drop(st);
        drop(last);
        self.kick_flusher();
        Ok(snap)
    }

    /// Every snapshot, cuts included (their commit is finished first).
    pub fn snapshots(&self) -> Result<Vec<Snapshot>> {
        self.commit_cuts();
        read_snapshots(&self.meta()?)
    }

    /// The snapshot `name`, a cut included (see `snapshots`).
    pub fn snapshot(&self, name: &str) -> Result<Snapshot> {
        self.commit_cuts();
        self.committed_snapshot(name)
    }

    /// The committed snapshot `name` (callable with the flush lock held).
    fn committed_snapshot(&self, name: &str) -> Result<Snapshot> {
        read_snapshots(&self.meta()?)?
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| FsError::NoSnapshot(name.to_string()))
    }

    /// Forgets a snapshot; the space it alone held comes back at the next
    /// prune (`prune` runs one at once unless `defer_prune`).
    pub fn snapshot_delete(&self, name: &str) -> Result<()> {
        self.refuse_on_mirror()?;
        let _last = self.flush_guard();
        let found = self.pool.meta.write(|w| {
            let found = w.remove_snapshot(name)?;
            // Elements this snapshot alone kept may lie below the prune
            // horizon: the next prune must look at all history again.
            w.set_counter("pruned_tid", 0)?;
            Ok::<_, FsError>(found)
        })?;
        if !found {
            return Err(FsError::NoSnapshot(name.to_string()));
        }
        drop(_last);
        self.refresh_retained()
    }

    /// Every snapshot with the bytes its deletion would free (once the
    /// fine-grained history window has also passed them): a chunk counts for
    /// a snapshot when every element referencing it is visible at no other
    /// snapshot and not current.
    pub fn snapshot_usage(&self) -> Result<Vec<SnapshotUsage>> {
        // Cuts included, as `snapshots` (a snapshot just cut is listed).
        self.commit_cuts();
        let r = self.meta()?;
        let snaps = read_snapshots(&r)?;
        let tids: Vec<u64> = snaps.iter().map(|s| s.tid).collect();
        // chunk -> (snapshot index or None for prunable, count)
        let mut refs: HashMap<u64, (Option<usize>, u64, bool)> = HashMap::new();
        let mut err = None;
        r.for_each_hist(|e| {
            if e.key.rtype() != Some(RecordType::Extent) {
                return;
            }
            let seen: Vec<usize> = (0..tids.len()).filter(|&i| e.visible_at(tids[i])).collect();
            let owner = match seen.as_slice() {
                [] => None,
                [one] => Some(*one),
                _ => return,
            };
            let ext = match Extent::decode(&e.payload) {
                Ok(x) => x,
                Err(x) => {
                    err = Some(x);
                    return;
                }
            };
            for chunk in ext.chunks() {
                let ent = refs.entry(chunk).or_insert((owner, 0, true));
                ent.1 += 1;
                if ent.0.is_none() {
                    ent.0 = owner;
                } else if owner.is_some() && owner != ent.0 {
                    ent.2 = false;
                }
            }
        })?;
        if let Some(e) = err {
            return Err(e);
        }
        let mut unique = vec![0u64; snaps.len()];
        for (chunk, (owner, count, single)) in refs {
            let (Some(i), true) = (owner, single) else {
                continue;
            };
            if let Some(raw) = r.chunk(chunk)? {
                let rec = ChunkRec::decode(&raw)?;
                if rec.refs == count {
                    unique[i] += rec.len as u64;
                }
            }
        }
        Ok(snaps
            .into_iter()
            .zip(unique)
            .map(|(snap, unique_bytes)| SnapshotUsage { snap, unique_bytes })
            .collect())
    }

    /// Starts the background hasher unless it is running: one thread at a
    /// time, at low CPU priority, so back-to-back snapshots and writers are
    /// not slowed by several tree walks at once.
    pub fn spawn_snapshot_hasher(self: &std::sync::Arc<Self>) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.hashing.swap(true, SeqCst) {
            return;
        }
        let fs = self.clone();
        let spawned = std::thread::Builder::new()
            .name("cairn-snaphash".into())
            .spawn(move || {
                // SAFETY: setpriority on this thread (Linux: a tid is a
                // process id for PRIO_PROCESS); no memory is involved.
                unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
                }
                loop {
                    if let Err(e) = fs.hash_pending_snapshots() {
                        tracing::error!("snapshot hash failed: {e}");
                    }
                    fs.hashing.store(false, SeqCst);
                    // A snapshot made after the last look still needs one.
                    let pending = fs
                        .snapshots()
                        .map(|v| v.iter().any(|s| s.hash.is_none()))
                        .unwrap_or(false);
                    if !pending || fs.hashing.swap(true, SeqCst) {
                        return;
                    }
                }
            });
        if spawned.is_err() {
            self.hashing.store(false, SeqCst);
        }
    }

    /// Computes and stores the content hash of every snapshot that lacks
    /// one. Runs from a background thread in the daemon.
    pub fn hash_pending_snapshots(&self) -> Result<usize> {
        let pending: Vec<Snapshot> = self
            .snapshots()?
            .into_iter()
            .filter(|s| s.hash.is_none())
            .collect();
        for s in &pending {
            let sum = self.tree_hash(s.tid)?;
            self.pool.meta.write(|w| {
                // Deleted meanwhile: nothing to store.
                if let Some(raw) = w.snapshot(&s.name)? {
                    let mut cur = Snapshot::decode(&s.name, &raw)?;
                    if cur.tid == s.tid {
                        cur.hash = Some(sum.hash);
                        cur.files = sum.files;
                        cur.bytes = sum.bytes;
                        w.put_snapshot(&s.name, &cur.encode())?;
                    }
                }
                Ok::<_, FsError>(())
            })?;
        }
        Ok(pending.len())
    }
}

/// The outcome of `snapshot verify`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct VerifyReport {
    pub name: String,
    pub tid: u64,
    /// Hash recorded when the snapshot was made (hex); None if it was
    /// still being computed and was recorded by this verify.
    pub recorded: Option<String>,
    pub computed: String,
    pub matches: bool,
    pub files: u64,
    pub bytes: u64,
    /// Blocks whose stored data failed their checksum or hash.
    pub damaged: Vec<String>,
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Fs {
    /// Recomputes a snapshot's content hash, reading every block, and
    /// compares it with the one recorded at creation.
    pub fn snapshot_verify(&self, name: &str) -> Result<VerifyReport> {
        let s = self.snapshot(name)?;
        let sum = self.tree_hash_verified(s.tid)?;
        if s.hash.is_none() {
            self.hash_pending_snapshots()?;
        }
        let recorded = match s.hash {
            Some(h) => Some(h),
            None => self.snapshot(name)?.hash,
        };
        Ok(VerifyReport {
            name: s.name,
            tid: s.tid,
            recorded: s.hash.map(|h| hex(&h)),
            computed: hex(&sum.hash),
            matches: recorded == Some(sum.hash) && sum.damaged.is_empty(),
            files: sum.files,
            bytes: sum.bytes,
            damaged: sum.damaged,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_crc() {
        let s = Snapshot {
            name: "daily".into(),
            tid: 42,
            time_ns: 7,
            kind: SnapshotKind::Auto,
            hash: Some([9; 32]),
            files: 3,
            bytes: 4096,
        };
        let mut b = s.encode();
        assert_eq!(Snapshot::decode("daily", &b).unwrap(), s);
        b[5] ^= 1;
        assert!(Snapshot::decode("daily", &b).is_err());
        assert!(check_snapshot_name("a/b").is_err());
        assert!(check_snapshot_name("").is_err());
        assert!(check_snapshot_name("ok-2026").is_ok());
        for bad in [
            "", ".", "..", "/", "a/b", "x@@y", "a\nb", "t\tab", "d\u{7f}",
        ] {
            let why = snapshot_name_problem(bad).expect(bad);
            assert!(why.contains("1 to 255 bytes"), "{why}");
        }
        let long = "a".repeat(300);
        assert!(snapshot_name_problem(&long).unwrap().contains("300 bytes"));
        assert!(snapshot_name_problem(&"é".repeat(127)).is_none());
    }
}
