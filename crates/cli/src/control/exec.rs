//! Runs a control request against an open filesystem (in the daemon or in
//! this process) and returns its JSON result.

use super::protocol::Request;
use super::replies::{
    Deleted, DeviceAdded, InfoReply, SnapshotCreated, SnapshotEntry, SyncReply, VolumeChange,
    VolumeSnapshotReply,
};
use cairn_fs::history::snapshot::hex;
use cairn_fs::{Fs, FsError, ReblockOptions, SnapshotKind};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// Runs `req`. `progress(done, total)` reports long work.
pub fn execute(fs: &Arc<Fs>, req: Request, progress: &dyn Fn(u64, u64)) -> Result<Value, FsError> {
    match req {
        Request::Sync => {
            fs.flush()?;
            report(SyncReply { tid: fs.last_tid() })
        }
        Request::Info => report(info(fs, None)?),
        Request::SnapshotCreate { .. }
        | Request::SnapshotList
        | Request::SnapshotDelete { .. }
        | Request::SnapshotVerify { .. } => snapshot(fs, req),
        Request::History { .. }
        | Request::HistoryPath { .. }
        | Request::Prune { .. }
        | Request::Reblock { .. }
        | Request::Gc { .. }
        | Request::Scrub => maintenance(fs, req, progress),
        Request::DeviceAdd { .. }
        | Request::DeviceRemove { .. }
        | Request::DeviceReplace { .. }
        | Request::RedundancySet { .. }
        | Request::RedundancySetPath { .. }
        | Request::RedundancyShow
        | Request::Resilver
        | Request::TierStatus
        | Request::Migrate => devices(fs, req, progress),
        Request::MirrorRead { .. }
        | Request::MirrorCandidates { .. }
        | Request::MirrorLacking { .. }
        | Request::MirrorWrite { .. }
        | Request::MirrorStatus
        | Request::MirrorPromote
        | Request::MirrorRollback { .. }
        | Request::MirrorHold { .. }
        | Request::MirrorRelease { .. } => mirror(fs, req, progress),
        r => volume(fs, r),
    }
}

/// A report as JSON (every report type serializes).
pub fn report(r: impl serde::Serialize) -> Result<Value, FsError> {
    Ok(serde_json::to_value(r).expect("report serializes"))
}

fn not_for(family: &str, r: Request) -> Result<Value, FsError> {
    Err(FsError::BadRequest(format!(
        "not a {family} request: {r:?}"
    )))
}

/// `info`: the pool's figures, and in the daemon its frontends' counters
/// and `log_lines_dropped` (the mount daemon's log only).
pub fn info(fs: &Arc<Fs>, log_lines_dropped: Option<u64>) -> Result<InfoReply, FsError> {
    let mut info = cairn_fs::maintenance::info::pool_info(fs.pool())?;
    info.locks = fs.lock_stats();
    info.space_warning = fs.space_status();
    let fuse = match cairn_fuse::metrics::enabled() {
        true => Some(report(cairn_fuse::metrics::snapshot())?),
        false => None,
    };
    Ok(InfoReply {
        pool: info,
        // Held without its key, a mirror's volume records are sealed.
        volumes: match fs.pool().meta.is_opaque() {
            true => Vec::new(),
            false => fs.volumes()?,
        },
        redundancy: fs.redundancy_status(),
        nbd: crate::nbd::servers(),
        fuse_workers: cairn_fuse::workers::stats(),
        // The counters the metrics endpoint serves (mount daemon only).
        service: report(fs.service_stats()?)?,
        fuse,
        log_lines_dropped,
        keeper: crate::keeper::keeper_pid(),
    })
}

/// The snapshot requests.
fn snapshot(fs: &Arc<Fs>, req: Request) -> Result<Value, FsError> {
    match req {
        Request::SnapshotCreate { name, auto, wait } => {
            let (name, kind) = if auto {
                let now = u64::try_from(cairn_fs::Time::now().as_nanos()).unwrap_or(0);
                (
                    format!("auto-{}", cairn_fs::timefmt::compact_utc(now)),
                    SnapshotKind::Auto,
                )
            } else {
                (name, SnapshotKind::Named)
            };
            let t0 = Instant::now();
            let s = match wait {
                true => fs.snapshot_create(&name, kind)?,
                false => fs.snapshot_cut(&name, kind)?,
            };
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            report(SnapshotCreated {
                name: s.name,
                tid: s.tid,
                time_ns: s.time_ns,
                create_ms: ms,
            })
        }
        Request::SnapshotList => {
            let list: Vec<SnapshotEntry> = fs
                .snapshot_usage()?
                .into_iter()
                .map(|u| {
                    let s = u.snap;
                    let kind = if s.kind == SnapshotKind::Auto {
                        "auto"
                    } else {
                        "named"
                    };
                    SnapshotEntry {
                        name: s.name,
                        tid: s.tid,
                        time_ns: s.time_ns,
                        kind: kind.to_string(),
                        unique_bytes: u.unique_bytes,
                        hash: s.hash.map(|h| hex(&h)),
                        files: s.files,
                        bytes: s.bytes,
                    }
                })
                .collect();
            report(list)
        }
        Request::SnapshotDelete { name } => {
            fs.snapshot_delete(&name)?;
            report(Deleted { deleted: name })
        }
        Request::SnapshotVerify { name } => report(fs.snapshot_verify(&name)?),
        r => not_for("snapshot", r),
    }
}

/// History, prune, reblock, gc and scrub.
fn maintenance(fs: &Arc<Fs>, req: Request, progress: &dyn Fn(u64, u64)) -> Result<Value, FsError> {
    match req {
        Request::History { ino } => report(fs.history(ino)?),
        Request::HistoryPath { path, inode } => report(fs.path_history(&path, inode)?),
        Request::Prune {
            dry_run,
            retention_secs,
            keep_daily,
            keep_weekly,
            keep_monthly,
        } => {
            let mut p = fs.prune_policy();
            p.retention_secs = retention_secs.unwrap_or(p.retention_secs);
            p.keep_daily = keep_daily.unwrap_or(p.keep_daily);
            p.keep_weekly = keep_weekly.unwrap_or(p.keep_weekly);
            p.keep_monthly = keep_monthly.unwrap_or(p.keep_monthly);
            report(fs.prune(&p, dry_run)?)
        }
        Request::Reblock {
            max_live_pct,
            files,
        } => {
            let o = ReblockOptions {
                max_live_pct,
                files,
                rate_limit: 0,
            };
            report(fs.reblock(&o, progress)?)
        }
        Request::Gc { max_live_pct } => report(fs.gc(max_live_pct, 0, progress)?),
        Request::Scrub => report(fs.scrub(progress)?),
        r => not_for("maintenance", r),
    }
}

/// Device add and remove, tier status and the mover.
fn devices(fs: &Arc<Fs>, req: Request, progress: &dyn Fn(u64, u64)) -> Result<Value, FsError> {
    match req {
        Request::DeviceAdd { spec } => {
            let spec: cairn_devices::DeviceSpec = spec
                .parse()
                .map_err(|e: cairn_devices::DeviceError| FsError::BadRequest(e.to_string()))?;
            let id = fs.device_add(&spec)?;
            let next = cairn_fs::pool::meta_copies::next_open_target(fs.pool())?;
            report(DeviceAdded {
                device: id,
                meta_mirror_at_next_mount: next.is_some(),
                meta_mirror_next: next.map(|p| p.display().to_string()),
            })
        }
        Request::DeviceRemove { device } => {
            report(fs.device_remove(std::path::Path::new(&device), progress)?)
        }
        Request::DeviceReplace { device, spec } => {
            let spec: cairn_devices::DeviceSpec = spec
                .parse()
                .map_err(|e: cairn_devices::DeviceError| FsError::BadRequest(e.to_string()))?;
            report(fs.device_replace(std::path::Path::new(&device), &spec, progress)?)
        }
        Request::RedundancySet { policy } => {
            let p: cairn_data::Policy = policy
                .parse()
                .map_err(|e: cairn_data::PolicyError| FsError::BadRequest(e.to_string()))?;
            fs.set_redundancy(p)?;
            report(fs.redundancy_status())
        }
        Request::RedundancySetPath { ino, policy } => {
            let layout = match policy.as_str() {
                "inherit" => None,
                p => Some(p.parse().map_err(|e: cairn_data::PolicyError| {
                    FsError::BadRequest(format!("{e} (or 'inherit')"))
                })?),
            };
            report(fs.set_path_layout(ino, layout)?)
        }
        Request::RedundancyShow => report(fs.redundancy_status()),
        Request::Resilver => report(fs.resilver_now(progress)?),
        Request::TierStatus => report(fs.tier_status()),
        Request::Migrate => report(fs.migrate(progress)?),
        r => not_for("device", r),
    }
}

/// The mirror-stream requests (`cairn_mirror::serve`, typed replies).
fn mirror(fs: &Arc<Fs>, req: Request, progress: &dyn Fn(u64, u64)) -> Result<Value, FsError> {
    use cairn_mirror::serve;
    match req {
        Request::MirrorRead {
            since,
            path,
            lacking,
            batch_mib,
        } => report(serve::read_to(
            fs,
            since,
            &path,
            lacking.as_deref(),
            batch_mib,
        )?),
        Request::MirrorCandidates { since, path } => {
            report(serve::candidates_to(fs, since, &path)?)
        }
        Request::MirrorLacking { path, out } => report(serve::lacking_to(fs, &path, &out)?),
        Request::MirrorWrite { path, force } => {
            report(serve::write_from(fs, &path, force, progress)?)
        }
        Request::MirrorStatus => report(serve::status(fs)?),
        Request::MirrorPromote => report(serve::promote(fs)?),
        Request::MirrorRollback { snapshot } => report(serve::rollback(fs, &snapshot)?),
        Request::MirrorHold { mirror, at, tid } => report(serve::hold(fs, mirror, at, tid)?),
        Request::MirrorRelease { mirror } => report(serve::release(fs, &mirror)?),
        r => not_for("mirror", r),
    }
}

/// A volume's reply with the pool's capacity and free space (volumes are
/// thin: the client warns of one larger than the pool).
fn with_room(fs: &Arc<Fs>, volume: cairn_fs::VolumeInfo) -> Result<Value, FsError> {
    let st = fs.statfs();
    report(VolumeChange {
        volume,
        pool_capacity: Some(st.blocks * u64::from(st.bsize)),
        pool_available: Some(st.bavail * u64::from(st.bsize)),
    })
}

/// The volume requests.
fn volume(fs: &Arc<Fs>, req: Request) -> Result<Value, FsError> {
    match req {
        Request::VolumeCreate {
            name,
            size,
            block_size,
        } => with_room(fs, fs.volume_create(&name, size, block_size)?),
        Request::VolumeList => report(fs.volumes()?),
        Request::VolumeResize { name, size, shrink } => {
            with_room(fs, fs.volume_resize(&name, size, shrink)?)
        }
        Request::VolumeDelete {
            name,
            with_snapshots,
        } => {
            fs.volume_delete(&name, with_snapshots)?;
            report(Deleted { deleted: name })
        }
        Request::VolumeSnapshot { name, snap, wait } => {
            let s = fs.volume_snapshot(&name, &snap, wait)?;
            report(VolumeSnapshotReply {
                volume: name,
                snapshot: snap,
                export: s.name,
                tid: s.tid,
                time_ns: s.time_ns,
            })
        }
        Request::VolumeClone { name, snap, new } => report(fs.volume_clone(&name, &snap, &new)?),
        Request::VolumeRollback { name, snap } => report(fs.volume_rollback(&name, &snap)?),
        r => not_for("volume", r),
    }
}
