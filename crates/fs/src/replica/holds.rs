//! History a source keeps for its mirrors (like ZFS holds): every mirror
//! that a copy or a stream brought to TID t holds the source's history
//! after t, so that prune does not remove the ends of elements the mirror
//! still holds live (which would make the next incremental stream
//! impossible). Kept in POOL/mirror-holds.json (0600; losing it only lets
//! prune go on as without mirrors). Space pressure prunes past a hold,
//! with a warning: the writer's room comes before a mirror's increment.

use crate::error::{FsError, Result};
use crate::vfs::Fs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One mirror of this pool, as of its last copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// The mirror pool's uuid (hex).
    pub mirror: String,
    /// Where the mirror was reached (a pool path or `ssh:host:POOL`).
    pub at: String,
    /// The mirror's TID after the copy.
    pub tid: u64,
    /// When (unix ns).
    pub time_ns: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct HoldFile {
    version: u32,
    holds: BTreeMap<String, Hold>,
}

/// The holds of one pool, in RAM and in their file.
#[derive(Debug)]
pub(crate) struct Holds {
    path: PathBuf,
    map: parking_lot::Mutex<BTreeMap<String, Hold>>,
}

impl Holds {
    pub(crate) fn load(pool: &Path) -> Holds {
        let path = pool.join("mirror-holds.json");
        // Bounded and type-checked like the config (`read_small`).
        let map = match cairn_devices::private::read_small(&path, 16 << 20) {
            Ok(b) => match serde_json::from_slice::<HoldFile>(&b) {
                Ok(f) if f.version == 1 => f.holds,
                _ => {
                    tracing::warn!("{}: unreadable; mirror holds dropped", path.display());
                    BTreeMap::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                tracing::warn!("{}: {e}; mirror holds dropped", path.display());
                BTreeMap::new()
            }
        };
        Holds {
            path,
            map: parking_lot::Mutex::new(map),
        }
    }

    fn save(&self, map: &BTreeMap<String, Hold>) -> Result<()> {
        let f = HoldFile {
            version: 1,
            holds: map.clone(),
        };
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&f).expect("holds serialize");
        cairn_devices::private::write_private(&tmp, &bytes)
            .and_then(|_| std::fs::rename(&tmp, &self.path))
            .map_err(|e| FsError::Io(format!("{}: {e}", self.path.display())))
    }

    /// The lowest TID a mirror holds.
    pub(crate) fn floor(&self) -> Option<u64> {
        self.map.lock().values().map(|h| h.tid).min()
    }
}

impl Fs {
    /// Records (or moves) mirror `h.mirror`'s hold.
    pub fn mirror_hold(&self, h: Hold) -> Result<()> {
        let mut map = self.holds.map.lock();
        map.insert(h.mirror.clone(), h);
        self.holds.save(&map)
    }

    /// Drops a mirror's hold (a mirror given up); false if it had none.
    pub fn mirror_release(&self, mirror: &str) -> Result<bool> {
        let mut map = self.holds.map.lock();
        let had = map.remove(mirror).is_some();
        self.holds.save(&map)?;
        Ok(had)
    }

    pub fn mirror_holds(&self) -> Vec<Hold> {
        self.holds.map.lock().values().cloned().collect()
    }

    /// `cutoff` for the automatic prune, lowered to the mirrors' holds.
    pub(crate) fn held_cutoff(&self, cutoff: u64) -> u64 {
        self.holds.floor().map_or(cutoff, |f| cutoff.min(f))
    }
}
