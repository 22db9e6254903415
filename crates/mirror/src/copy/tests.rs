//! The decisions of a copy, with fake pools: which snapshot a resync rolls
//! back to, when the source is behind its prune point, which mirrors are
//! refused, and that a reply missing a field does not decode.

use super::*;
use crate::bucket::copy::{chain_start, restore_from, uuid_bytes};
use crate::bucket::manifest::Manifest;
use crate::reply::SnapshotAt;
use std::cell::RefCell;

const SRC: &str = "00112233445566778899aabbccddeeff";

fn status(role: RoleName, tid: u64, snaps: &[(&str, u64)]) -> StatusReply {
    StatusReply {
        role,
        tid,
        uuid: "ffeeddccbbaa99887766554433221100".into(),
        source: None,
        time_ns: None,
        mirrors: Vec::new(),
        pruned_tid: 0,
        snapshots: (snaps.iter())
            .map(|(n, t)| SnapshotAt {
                name: (*n).into(),
                tid: *t,
            })
            .collect(),
        sealed: false,
    }
}

fn source(tid: u64, pruned: u64, snaps: &[(&str, u64)]) -> StatusReply {
    StatusReply {
        uuid: SRC.into(),
        pruned_tid: pruned,
        ..status(RoleName::Pool, tid, snaps)
    }
}

fn mirror_of(src: &str, tid: u64, snaps: &[(&str, u64)]) -> StatusReply {
    StatusReply {
        source: Some(src.into()),
        ..status(RoleName::Mirror, tid, snaps)
    }
}

#[test]
fn the_common_snapshot_is_the_newest_both_hold_at_or_before_the_mirror() {
    let from = source(90, 80, &[("a", 10), ("b", 20), ("c", 30), ("d", 60)]);
    // "c" has another TID on the mirror, "d" is after its TID.
    let at = mirror_of(SRC, 50, &[("a", 10), ("b", 20), ("c", 31), ("d", 60)]);
    assert_eq!(common_snapshot(&from, &at, 50).as_deref(), Some("b"));
    let none = mirror_of(SRC, 50, &[("x", 10), ("c", 31)]);
    assert_eq!(common_snapshot(&from, &none, 50), None);
}

#[test]
fn behind_the_prune_point_only_where_no_snapshot_is() {
    let from = source(90, 40, &[("a", 20)]);
    assert!(behind_horizon(&from, 30));
    assert!(!behind_horizon(&from, 20), "at a snapshot");
    assert!(!behind_horizon(&from, 40), "at the prune point");
    assert!(!behind_horizon(&from, 0), "a full stream");
}

#[test]
fn a_bucket_behind_the_prune_point_is_refused_without_resync() {
    let from = source(90, 40, &[]);
    let e = chain_start(&from, 30, false, "SRC").unwrap_err();
    assert!(
        matches!(e, CopyError::BucketBehindPrune { since: 30, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("--resync"), "{e}");
    assert_eq!(chain_start(&from, 30, true, "SRC").unwrap(), (0, true));
    assert_eq!(chain_start(&from, 50, false, "SRC").unwrap(), (50, false));
}

#[test]
fn a_reply_missing_a_field_does_not_decode() {
    let full = serde_json::to_value(source(7, 3, &[("a", 2)])).unwrap();
    let back: StatusReply = serde_json::from_value(full.clone()).unwrap();
    assert_eq!(back.pruned_tid, 3);
    let mut missing = full.clone();
    missing.as_object_mut().unwrap().remove("pruned_tid");
    let e = serde_json::from_value::<StatusReply>(missing).unwrap_err();
    assert!(e.to_string().contains("pruned_tid"), "{e}");
    let mut renamed = full;
    let m = renamed.as_object_mut().unwrap();
    let t = m.remove("tid").unwrap();
    m.insert("tid_renamed".into(), t);
    assert!(serde_json::from_value::<StatusReply>(renamed).is_err());
    let w = r#"{"since":1,"upto":2,"events":3,"chunks":4,"batches":5}"#;
    assert!(serde_json::from_str::<WriteReply>(w).is_err(), "no streams");
}

#[test]
fn replies_keep_their_json_shape() {
    let s = serde_json::to_value(mirror_of(SRC, 5, &[])).unwrap();
    assert_eq!(s["role"], "mirror");
    assert_eq!(s["source"], SRC);
    assert!(s["time_ns"].is_null() && s["mirrors"].is_array());
    let c = CopyReply {
        read: fake_read(1, 2),
        write: fake_write(1, 2),
        rollback: None,
    };
    let v = serde_json::to_value(c).unwrap();
    assert!(v["rollback"].is_null(), "{v}");
    assert_eq!(v["write"]["upto"], 2);
    assert_eq!(v["read"]["chunks_sent"], 0);
}

fn fake_read(since: u64, upto: u64) -> ReadReply {
    ReadReply {
        since,
        upto,
        events: 1,
        chunks_sent: 0,
        chunks_skipped: 0,
        chunk_bytes: 0,
        batches: 1,
        bytes: 10,
    }
}

fn fake_write(since: u64, upto: u64) -> WriteReply {
    WriteReply {
        since,
        upto,
        events: 1,
        chunks: 0,
        batches: 1,
        streams: 1,
    }
}

/// A source that records what it was asked.
struct FakeSource {
    status: StatusReply,
    calls: RefCell<Vec<String>>,
}

impl Source for FakeSource {
    fn name(&self) -> String {
        "SRC".into()
    }
    fn status(&self) -> EndpointResult<StatusReply> {
        Ok(self.status.clone())
    }
    fn candidates(&self, since: u64, _: &Path) -> EndpointResult<()> {
        self.calls.borrow_mut().push(format!("candidates {since}"));
        Ok(())
    }
    fn read(&self, since: u64, _: &Path, _: &Path, _: u64) -> EndpointResult<ReadReply> {
        self.calls.borrow_mut().push(format!("read {since}"));
        Ok(fake_read(since, self.status.tid))
    }
    fn hold(&self, mirror: &str, at: &str, tid: u64) -> EndpointResult<()> {
        self.calls
            .borrow_mut()
            .push(format!("hold {mirror} {at} {tid}"));
        Ok(())
    }
}

/// A mirror that records what it was asked.
struct FakeMirror {
    status: StatusReply,
    calls: RefCell<Vec<String>>,
}

impl Mirror for FakeMirror {
    fn name(&self) -> String {
        "DST".into()
    }
    fn status(&self) -> EndpointResult<StatusReply> {
        Ok(self.status.clone())
    }
    fn lacking(&self, _: &Path, _: &Path) -> EndpointResult<()> {
        self.calls.borrow_mut().push("lacking".into());
        Ok(())
    }
    fn write(&self, _: &Path) -> EndpointResult<WriteReply> {
        self.calls.borrow_mut().push("write".into());
        Ok(fake_write(self.status.tid, 90))
    }
    fn rollback(&self, snapshot: &str) -> EndpointResult<RollbackReply> {
        self.calls.borrow_mut().push(format!("rollback {snapshot}"));
        let to = (self.status.snapshots.iter()).find(|s| s.name == snapshot);
        Ok(RollbackReply {
            from: self.status.tid,
            to: to.map_or(0, |s| s.tid),
            removed: 0,
            restored: 0,
            snapshots_removed: 0,
            chunks_freed: 0,
        })
    }
}

fn pair(from: StatusReply, at: StatusReply) -> (FakeSource, FakeMirror) {
    let s = FakeSource {
        status: from,
        calls: RefCell::new(Vec::new()),
    };
    let m = FakeMirror {
        status: at,
        calls: RefCell::new(Vec::new()),
    };
    (s, m)
}

fn run(s: &FakeSource, m: &FakeMirror, resync: bool) -> Result<CopyReply> {
    let o = CopyOptions {
        resync,
        batch_mib: 64,
    };
    copy(s, m, o, Path::new("/nonexistent"))
}

#[test]
fn a_copy_reads_after_the_mirror_and_moves_the_hold() {
    let (s, m) = pair(source(90, 0, &[]), mirror_of(SRC, 50, &[]));
    let r = run(&s, &m, false).unwrap();
    assert_eq!((r.read.since, r.write.upto, r.rollback), (50, 90, None));
    let hold = format!("hold {} DST 90", m.status.uuid);
    assert_eq!(*s.calls.borrow(), ["candidates 50", "read 50", &hold]);
    assert_eq!(*m.calls.borrow(), ["lacking", "write"]);
    let (s, m) = pair(source(90, 0, &[]), status(RoleName::Unbound, 7, &[]));
    assert_eq!(run(&s, &m, false).unwrap().read.since, 0, "unbound: all");
}

#[test]
fn a_resync_rolls_back_to_the_common_snapshot() {
    let snaps = [("a", 10), ("b", 20)];
    let (s, m) = pair(source(90, 60, &snaps), mirror_of(SRC, 50, &snaps));
    let r = run(&s, &m, true).unwrap();
    assert_eq!(r.rollback.map(|r| r.to), Some(20));
    assert_eq!(r.read.since, 20);
    assert_eq!(m.calls.borrow()[0], "rollback b");
    // Without --resync the copy goes on from the mirror's TID (the
    // source refuses what it cannot send).
    let (s, m) = pair(source(90, 60, &snaps), mirror_of(SRC, 50, &snaps));
    assert_eq!(run(&s, &m, false).unwrap().read.since, 50);
    let (s, m) = pair(source(90, 60, &snaps), mirror_of(SRC, 50, &[("c", 20)]));
    let e = run(&s, &m, true).unwrap_err();
    assert!(
        matches!(e, CopyError::NoCommonSnapshot { since: 50, .. }),
        "{e}"
    );
    assert!(m.calls.borrow().is_empty(), "nothing done: {:?}", m.calls);
}

#[test]
fn promoted_pools_and_mirrors_of_another_pool_are_refused() {
    let promoted = StatusReply {
        source: Some(SRC.into()),
        ..status(RoleName::Promoted, 50, &[])
    };
    let (s, m) = pair(source(90, 0, &[]), promoted);
    assert!(matches!(
        run(&s, &m, false),
        Err(CopyError::NotAMirror {
            role: "promoted",
            ..
        })
    ));
    let (s, m) = pair(source(90, 0, &[]), status(RoleName::Pool, 50, &[]));
    assert!(matches!(
        run(&s, &m, false),
        Err(CopyError::NotAMirror { role: "pool", .. })
    ));
    let other = mirror_of("0123456789abcdef0123456789abcdef", 50, &[]);
    let (s, m) = pair(source(90, 0, &[]), other);
    assert!(matches!(
        run(&s, &m, false),
        Err(CopyError::OtherSource { .. })
    ));
    assert!(s.calls.borrow().is_empty(), "nothing read: {:?}", s.calls);
}

#[test]
fn a_stream_look_copies_only_when_the_mirror_is_behind() {
    let (s, m) = pair(source(90, 0, &[]), mirror_of(SRC, 90, &[]));
    let (at, c) = catch_up(&s, &m, 90, Path::new("/nonexistent")).unwrap();
    assert_eq!((at, c), (90, None));
    let (s, m) = pair(source(90, 0, &[]), mirror_of(SRC, 50, &[]));
    let (at, c) = catch_up(&s, &m, 90, Path::new("/nonexistent")).unwrap();
    assert_eq!(at, 90);
    assert!(c.is_some());
}

#[test]
fn a_restore_goes_only_into_a_mirror_of_the_buckets_source() {
    let m = Manifest {
        id: [1; 16],
        source: uuid_bytes(SRC).unwrap(),
        chunks: 0,
        streams: Vec::new(),
    };
    assert_eq!(
        restore_from(&status(RoleName::Unbound, 3, &[]), &m, "P").unwrap(),
        0
    );
    assert_eq!(restore_from(&mirror_of(SRC, 40, &[]), &m, "P").unwrap(), 40);
    let other = mirror_of("0123456789abcdef0123456789abcdef", 40, &[]);
    assert!(matches!(
        restore_from(&other, &m, "P"),
        Err(CopyError::RestoreOtherSource { .. })
    ));
    let pool = status(RoleName::Pool, 40, &[]);
    assert!(matches!(
        restore_from(&pool, &m, "P"),
        Err(CopyError::RestoreNotAMirror { .. })
    ));
    assert!(uuid_bytes("0011").is_err() && uuid_bytes(&"é".repeat(16)).is_err());
}
