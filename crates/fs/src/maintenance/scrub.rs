//! Scrub: reads every stored chunk online, checks its checksums and its
//! content hash, and names the files and offsets (current and in history)
//! that use each damaged chunk. Runs beside normal use: it reads a
//! snapshot of the metadata, and a chunk that reblock moved meanwhile is
//! read again at its new place before it is called damaged. Damaged chunks
//! leave the dedup index, so a restore writes good copies. A chunk whose
//! segment has copies on other devices is checked in every copy, and a
//! bad copy is rewritten from a good one (counted in `data_repaired`);
//! only a chunk with no good copy left is damaged. A chunk of a segment
//! in a stripe that fails its checks is restored from the stripe's parity
//! and rewritten; then each stripe's parity is compared with its data and
//! rewritten where it differs (`parity_repaired`).

use crate::error::Result;
use crate::types::Extent;
use crate::vfs::Fs;
use cairn_data::ChunkRec;
use cairn_meta::RecordType;
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ScrubReport {
    pub chunks: u64,
    pub bytes: u64,
    /// One line per damaged chunk: what is wrong and who uses it.
    pub damaged: Vec<String>,
    /// Copies of the metadata (2 when mirrored, 1 after a copy failed).
    pub meta_copies: u32,
    /// Metadata pages found bad in one copy and rewritten from the other:
    /// when the pool was opened, by reads since, and by this scrub.
    pub meta_repaired_at_open: u64,
    pub meta_repaired_on_read: u64,
    pub meta_repaired_now: u64,
    /// Bad copies of chunks rewritten from a good copy by this scrub, and
    /// bad copies that could not be rewritten (their chunks still read).
    #[serde(default)]
    pub data_repaired: u64,
    #[serde(default)]
    pub data_unrepaired: u64,
    /// Stripes checked, windows of parity that differed from their data
    /// and were rewritten, and those left (a device that is not online,
    /// or a read-only mount).
    #[serde(default)]
    pub stripes: u64,
    #[serde(default)]
    pub parity_repaired: u64,
    #[serde(default)]
    pub parity_unrepaired: u64,
}

impl Fs {
    /// Verifies every chunk; `progress(done, total)` in bytes.
    pub fn scrub(&self, progress: &dyn Fn(u64, u64)) -> Result<ScrubReport> {
        let run = self.maint_stats.start(crate::service_stats::Task::Scrub);
        let progress = |done, total| {
            run.progress(done, total);
            progress(done, total)
        };
        let rep = self.scrub_inner(&progress)?;
        run.processed(rep.bytes);
        self.maint_stats.damaged(rep.damaged.len() as u64);
        Ok(rep)
    }

    fn scrub_inner(&self, progress: &dyn Fn(u64, u64)) -> Result<ScrubReport> {
        let r = self.meta()?;
        let mut recs = Vec::new();
        r.for_each_chunk(|id, raw| recs.push((id, ChunkRec::decode(raw))))?;
        let total: u64 = recs
            .iter()
            .filter_map(|(_, c)| c.as_ref().ok())
            .map(|c| c.len as u64)
            .sum();
        let mut rep = ScrubReport::default();
        let mut bad: BTreeMap<u64, String> = BTreeMap::new();
        let mut bad_hashes = Vec::new();
        for (id, rec) in recs {
            rep.chunks += 1;
            let rec = match rec {
                Ok(rec) => rec,
                Err(e) => {
                    bad.insert(id, e.to_string());
                    continue;
                }
            };
            rep.bytes += rec.len as u64;
            if let Err(e) = self.scrub_chunk(&rec, &mut rep) {
                let moved = self
                    .meta()?
                    .chunk(id)?
                    .and_then(|raw| ChunkRec::decode(&raw).ok());
                let ok_now = match moved {
                    Some(now) if (now.segment, now.offset) != (rec.segment, rec.offset) => {
                        self.pool.chunks.read_chunk(&now, true).is_ok()
                    }
                    // Freed meanwhile: nothing uses it any more.
                    None => true,
                    _ => false,
                };
                if !ok_now {
                    tracing::error!("scrub: chunk {id}: {e}");
                    bad.insert(id, e.to_string());
                    bad_hashes.push((rec.hash, id));
                }
            }
            progress(rep.bytes, total);
        }
        if !bad.is_empty() {
            rep.damaged = self.describe_users(&bad)?;
            self.forget_damaged(&bad_hashes)?;
        }
        rep.damaged.extend(self.damaged_records()?);
        rep.damaged
            .extend(crate::maintenance::check::damaged_stripes(&r)?);
        self.scrub_parity(&mut rep);
        self.scrub_meta(&mut rep)?;
        Ok(rep)
    }

    /// Checks one chunk: every copy when its segment has several (bad
    /// ones repaired), else its one copy. An error when no copy is good.
    fn scrub_chunk(&self, rec: &ChunkRec, rep: &mut ScrubReport) -> cairn_data::error::Result<()> {
        let chunks = &self.pool.chunks;
        let single = |s: &cairn_data::SegmentRec| s.copies.is_empty();
        if chunks
            .segment(rec.segment)
            .is_none_or(|s| single(&s) && !chunks.is_striped(rec.segment))
        {
            return chunks.read_chunk(rec, true).map(|_| ());
        }
        let c = chunks.check_copies(rec)?;
        rep.data_repaired += c.repaired.len() as u64;
        rep.data_unrepaired += c.bad.len() as u64;
        if c.good + c.repaired.len() == 0 && !c.restored {
            return chunks.read_chunk(rec, true).map(|_| ());
        }
        Ok(())
    }

    /// Compares every stripe's parity with its data (after the chunks were
    /// checked and repaired), rewriting what differs unless read-only.
    fn scrub_parity(&self, rep: &mut ScrubReport) {
        let chunks = &self.pool.chunks;
        for (id, _) in chunks.stripe_table() {
            match chunks.check_parity(id, !self.read_only()) {
                Ok(c) => {
                    rep.stripes += 1;
                    rep.parity_repaired += c.rewritten;
                    rep.parity_unrepaired += c.differed - c.rewritten;
                }
                Err(cairn_data::DataError::Busy(_)) => {}
                // A member that does not read (a missing device): the
                // data still reads (the chunks were checked above).
                Err(e) => {
                    tracing::warn!("scrub: stripe {id}: its parity cannot be checked: {e}");
                    rep.parity_unrepaired += 1;
                }
            }
        }
    }

    /// Verifies both metadata copies page by page, when mirrored,
    /// repairing one from the other.
    fn scrub_meta(&self, rep: &mut ScrubReport) -> Result<()> {
        rep.meta_copies = 1;
        let fixed = match self.pool.meta.scrub_mirror() {
            Ok(fixed) => fixed,
            Err(e) => {
                rep.damaged.push(format!("metadata: {e}"));
                return Ok(());
            }
        };
        if let (Some(fixed), Some(st)) = (fixed, self.pool.meta.mirror_stats()) {
            rep.meta_copies = st.copies;
            rep.meta_repaired_at_open = st.repaired_at_open;
            rep.meta_repaired_on_read = st.repaired_on_read;
            rep.meta_repaired_now = fixed;
        }
        Ok(())
    }

    /// Metadata records that fail their checksum, each named by the file
    /// it belongs to: "PATH: DAMAGED metadata record: why".
    fn damaged_records(&self) -> Result<Vec<String>> {
        let r = self.meta()?;
        let mut bad = Vec::new();
        r.for_each_checked(|key, e| {
            if let Err(err) = e {
                bad.push((cairn_meta::ElemKey(key.to_vec()).obj(), err.to_string()));
            }
        })?;
        if bad.is_empty() {
            return Ok(Vec::new());
        }
        let paths = crate::maintenance::check::live_paths(&r, self.names())?;
        Ok(bad
            .into_iter()
            .map(|(ino, why)| {
                let line = crate::maintenance::check::damaged_record(&paths, ino, &why);
                tracing::error!("scrub: {line}");
                line
            })
            .collect())
    }

    /// Takes damaged chunks out of the dedup index, so that writing the
    /// same content again (restoring from a good copy) stores a fresh chunk
    /// instead of referencing the damaged one.
    fn forget_damaged(&self, damaged: &[([u8; 32], u64)]) -> Result<()> {
        if self.read_only() {
            // Nothing is written to a read-only mount (a degraded one
            // lists its lost chunks here).
            return Ok(());
        }
        let _last = self.flush_guard();
        self.pool.meta.write(|w| {
            for (hash, id) in damaged {
                w.remove_dedup(hash, *id)?;
            }
            Ok::<_, crate::FsError>(())
        })
    }

    /// "chunk N (why): used by <inode I> offset O (current), ..." lines.
    fn describe_users(&self, bad: &BTreeMap<u64, String>) -> Result<Vec<String>> {
        let r = self.meta()?;
        let paths = crate::maintenance::check::live_paths(&r, self.names())?;
        let mut users: HashMap<u64, Vec<String>> = HashMap::new();
        let rs = self.record;
        let mut note = |e: cairn_meta::Element| {
            if e.key.rtype() != Some(RecordType::Extent) {
                return;
            }
            let Ok(x) = Extent::decode(&e.payload) else {
                return;
            };
            let bad_ones: Vec<u64> = x.chunks().filter(|c| bad.contains_key(c)).collect();
            for chunk in bad_ones {
                let at = match e.key.extent_block() {
                    Ok(blk) => format!("offset {}", blk * rs),
                    Err(_) => format!("a damaged extent key {:02x?}", e.key.sub()),
                };
                let ino = e.key.obj();
                let name = paths.get(&ino).cloned().unwrap_or(format!("<inode {ino}>"));
                let when = if e.is_live() {
                    "current".to_string()
                } else {
                    format!("tids {:#x}..{:#x}", e.create_tid, e.delete_tid)
                };
                users
                    .entry(chunk)
                    .or_default()
                    .push(format!("{name} {at} ({when})"));
            }
        };
        r.for_each_live(&mut note)?;
        r.for_each_hist(&mut note)?;
        Ok(bad
            .iter()
            .map(|(id, why)| {
                let who = users.remove(id).unwrap_or_default();
                format!(
                    "chunk {id}: {why}; used by {}",
                    if who.is_empty() {
                        "nothing".into()
                    } else {
                        who.join(", ")
                    }
                )
            })
            .collect())
    }
}
