//! Redundancy at the filesystem layer: the copies policy as the metadata
//! store keeps it (`load_policy`, `Fs::set_redundancy`), opening a pool
//! with devices missing (`degraded.rs`), and making the copies a segment
//! lacks: re-replication after a device is lost or the policy is raised,
//! and device replacement (`resilver.rs`). The data layer writes the copies
//! and heals reads from them (`cairn_data::{copies, heal, relocate}`).

pub mod degraded;
mod log_copies;
pub mod path_policy;
pub mod resilver;
mod stripes;
mod watchdog;

use crate::error::{FsError, Result};
use crate::vfs::Fs;
use cairn_data::Policy;
use cairn_meta::MetaRead;

/// The policy the metadata store holds (one copy when it holds none).
pub(crate) fn load_policy(r: &MetaRead) -> Result<Policy> {
    let get = |name: &str| r.counter(name).unwrap_or(0);
    Policy::decode(get).map_err(|e| FsError::Io(e.to_string()))
}

impl Fs {
    /// Sets the pool's copies policy (online): new segments follow it at
    /// once, and re-replication brings the existing ones to it (adding
    /// copies, or dropping those beyond it).
    pub fn set_redundancy(&self, p: Policy) -> Result<()> {
        if self.read_only() {
            return Err(FsError::ReadOnly);
        }
        let _last = self.flush_guard();
        self.pool.meta.write(|w| {
            for (name, v) in p.encode() {
                w.set_counter(&name, v)?;
            }
            Ok::<_, FsError>(())
        })?;
        self.pool.chunks.set_policy(p);
        // The open segment was placed for the old policy: new data goes
        // to a new one, and re-replication can then reach the old one.
        self.pool.chunks.close_open_segment();
        tracing::info!("redundancy set to {p}");
        self.raise_meta_copies();
        self.kick_resilver();
        Ok(())
    }

    /// Makes the copies of the metadata the pool's redundancy now asks
    /// for (`meta_copies::raise_online`); one not made now is made at the
    /// next mount.
    pub(crate) fn raise_meta_copies(&self) {
        if let Err(e) = crate::pool::meta_copies::raise_online(&self.pool) {
            tracing::warn!("metadata: copies not raised now ({e}); the next mount raises them");
        }
        if let Some((have, want)) = self.log_copies_short() {
            tracing::warn!("intent log: {have} copies on devices, the redundancy asks for {want}: {ADD_LOG_COPY}");
        }
    }

    /// (copies, copies wanted) of the intent log on devices when it has
    /// fewer than the metadata's wanted copies. A device's log area is
    /// made with the device, so the log gains copies only with devices
    /// added with `:log=SIZE`.
    pub(crate) fn log_copies_short(&self) -> Option<(usize, usize)> {
        if self.pool.log_devices.is_empty() {
            return None;
        }
        let have = self.intent.as_ref()?.lock().copies();
        let read = self.pool.meta.read().ok()?;
        let want = crate::pool::meta_copies::wanted(&read).ok()?;
        (have < want).then_some((have, want))
    }

    /// A file or directory now asks for `layout`: the metadata keeps at
    /// least as many copies as it (`meta_copies::PATH_COPIES`).
    pub(crate) fn note_path_layout(&self, layout: cairn_data::Layout) -> Result<()> {
        use crate::pool::meta_copies::PATH_COPIES;
        let want = layout.copies() as u64;
        if self.pool.meta.read()?.counter(PATH_COPIES)? >= want {
            return Ok(());
        }
        let _last = self.flush_guard();
        if self.pool.meta.write(|w| raise_path_copies(w, [layout]))? {
            self.raise_meta_copies();
        }
        Ok(())
    }
}

/// Raises, in the transaction `w`, the copies of the metadata the paths'
/// own layouts ask for (`meta_copies::PATH_COPIES`, never lowered) to
/// those of `layouts`: a path given a layout here (`note_path_layout`),
/// or by a mirror stream (`apply_batch`). True when it went up: the
/// caller then makes the copies after the commit (`raise_meta_copies`).
pub(crate) fn raise_path_copies(
    w: &mut cairn_meta::MetaWrite<'_>,
    layouts: impl IntoIterator<Item = cairn_data::Layout>,
) -> Result<bool> {
    use crate::pool::meta_copies::PATH_COPIES;
    let had = w.counter(PATH_COPIES)?;
    let want = (layouts.into_iter())
        .map(|l| l.copies() as u64)
        .fold(had, u64::max);
    if want > had {
        w.set_counter(PATH_COPIES, want)?;
    }
    Ok(want > had)
}

/// What to do about an intent log with fewer copies than asked for.
const ADD_LOG_COPY: &str =
    "add a device that holds one (`cairn device add TARGET CLASS:PATH:SIZE:log=64M`)";

/// One device in `redundancy show` and `info`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DeviceRedundancy {
    pub id: u32,
    pub path: String,
    pub class: String,
    /// online, missing or faulted.
    pub state: String,
    pub domain: String,
    pub draining: bool,
    /// Segment copies on it.
    pub copies: u64,
    /// It holds a copy of the intent log that records are written to.
    #[serde(default)]
    pub log: bool,
}

/// The pool's redundancy as it stands.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RedundancyStatus {
    pub policy: String,
    pub devices: Vec<DeviceRedundancy>,
    pub segments: u64,
    /// Segments with fewer copies on online devices than the policy asks
    /// (re-replication works on them), and their bytes: at risk.
    pub short_segments: u64,
    pub bytes_at_risk: u64,
    /// Segments with no copy on an online device, and their bytes: lost
    /// unless a missing device comes back.
    pub lost_segments: u64,
    pub lost_bytes: u64,
    /// Chunks served from another copy, bad copies repaired, and bad
    /// copies left bad, since the pool was opened.
    pub served_from_other_copy: u64,
    pub repaired: u64,
    pub unrepaired: u64,
    /// Mounted read-only because data is lost (`--degraded`).
    pub read_only: bool,
    /// Stripes (`ec=K+M`), the segments in them, and sealed segments of
    /// an `ec` layout that wait for one (they keep M+1 copies meanwhile).
    #[serde(default)]
    pub stripes: u64,
    /// Chunks restored from their stripe's parity since the pool was
    /// opened.
    #[serde(default)]
    pub restored_from_parity: u64,
    #[serde(default)]
    pub striped_segments: u64,
    #[serde(default)]
    pub waiting_for_stripe: u64,
    /// Where fsync's intent log is written: "N copies on devices", "the
    /// pool directory", or "none" (fsync commits).
    #[serde(default)]
    pub intent_log: String,
}

impl Fs {
    /// The policy, each device's state and the data at risk or lost.
    pub fn redundancy_status(&self) -> RedundancyStatus {
        let chunks = &self.pool.chunks;
        let set = chunks.devices();
        let policy = chunks.policy();
        let table = chunks.segment_table();
        let mut st = RedundancyStatus {
            policy: policy.to_string(),
            segments: table.len() as u64,
            read_only: self.pool.lost.read_only,
            ..Default::default()
        };
        (st.served_from_other_copy, st.repaired, st.unrepaired) = chunks.heal_counts();
        st.restored_from_parity = chunks.restored_count();
        let stripes = chunks.stripe_table();
        st.stripes = stripes.len() as u64;
        // Per stripe: its data members and how many members are offline.
        let offline = |r: &cairn_data::StripeRec| {
            r.members
                .iter()
                .filter(|p| !set.is_online(p.device))
                .count()
        };
        for (id, s) in &table {
            let online = s
                .places()
                .iter()
                .filter(|p| set.is_online(p.device))
                .count();
            let layout = chunks.layout_of(s);
            let mut want = layout.map_or(1, |l| l.copies());
            if let Some((_, _, r)) = chunks.stripe_of(&s.places()) {
                st.striped_segments += 1;
                want = 1;
                let down = offline(&r);
                if down > 0 && down <= r.m as usize {
                    st.short_segments += 1;
                    st.bytes_at_risk += s.used as u64;
                    continue;
                }
            } else if layout.and_then(|l| l.ec()).is_some() && !chunks.is_open(*id) {
                st.waiting_for_stripe += 1;
            }
            if online == 0 {
                st.lost_segments += 1;
                st.lost_bytes += s.used as u64;
            } else if online < want {
                st.short_segments += 1;
                st.bytes_at_risk += s.used as u64;
            }
        }
        // Taken and let go before the device set's locks.
        let log = (self.intent.as_ref()).map(|l| l.lock().place_names());
        for d in set.devices() {
            let id = d.id();
            st.devices.push(DeviceRedundancy {
                id,
                path: d.path.display().to_string(),
                class: d.class().to_string(),
                state: set.state(id).map_or("unknown".into(), |s| s.to_string()),
                domain: set.domain(id).unwrap_or_default(),
                draining: set.is_draining(id),
                copies: table.iter().filter(|(_, s)| s.on_device(id)).count() as u64
                    + (stripes.iter())
                        .flat_map(|(_, r)| r.members[r.k as usize..].iter())
                        .filter(|p| p.device == id)
                        .count() as u64,
                log: log.as_ref().is_some_and(|l| l.contains(&d.path)),
            });
        }
        // The devices made with a log area: those the pool opened with
        // (missing ones included) and those added since.
        let mut holders = self.pool.log_devices.clone();
        holders.extend(
            (set.devices().iter())
                .filter(|d| d.header.log_len > 0)
                .map(|d| d.id()),
        );
        holders.sort_unstable();
        holders.dedup();
        st.intent_log = match &log {
            None => "none (fsync commits)".into(),
            Some(_) if self.pool.log_devices.is_empty() => "the pool directory".into(),
            Some(l) => format!("{} of {} copies on devices", l.len(), holders.len()),
        };
        if let Some((_, want)) = self.log_copies_short() {
            st.intent_log += &format!("; the redundancy asks for {want}: {ADD_LOG_COPY}");
        }
        st
    }
}
