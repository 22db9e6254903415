//! A damaged intent log never drops fsync'd writes silently (issue 50,
//! item 2). Each record is kept twice (docs/format/intent-log.md), so
//! damage to one place loses nothing; damage to both places of a record
//! with valid records after it makes the mount refuse, naming what would be
//! lost, until the admin says `--discard-damaged-log`. The sweep damages
//! the log of a killed daemon at random (16 to 128 bytes, one place, 50
//! seeds; CAIRN_LOG_DAMAGE_SEEDS for more): every acknowledged write is
//! then present, or the mount refuses and names its file.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Output;

const HEADER_LEN: u64 = 64;
const MAGIC: &[u8; 8] = b"CAIRNIL\0";

/// One record in the log file: where it starts and how long it is.
#[derive(Debug, Clone, Copy)]
struct Rec {
    at: u64,
    len: u64,
}

/// The records of the live region of the log (the region whose run is
/// longest), walked by their headers (FORMAT.md), and the distance from a
/// record to its copy (half a region).
fn live_records(log: &Path) -> (Vec<Rec>, u64) {
    let f = fs::File::open(log).unwrap();
    let region = f.metadata().unwrap().len() / 2;
    let walk = |start: u64| {
        let mut out = Vec::new();
        let mut at = start;
        loop {
            let mut h = [0u8; HEADER_LEN as usize];
            f.read_exact_at(&mut h, at).unwrap();
            let seq = u64::from_le_bytes(h[40..48].try_into().unwrap());
            if &h[..8] != MAGIC || seq != out.len() as u64 {
                return out;
            }
            let len = HEADER_LEN + u32::from_le_bytes(h[12..16].try_into().unwrap()) as u64;
            out.push(Rec { at, len });
            at += len;
        }
    };
    let (a, b) = (walk(0), walk(region));
    (if a.len() >= b.len() { a } else { b }, region / 2)
}

fn damage(log: &Path, at: u64, bytes: &[u8]) {
    let f = fs::OpenOptions::new().write(true).open(log).unwrap();
    f.write_all_at(bytes, at).unwrap();
}

/// A pool that commits only when told, so that fsyncs stay in the log.
fn quiet_pool() -> Fs {
    let mut fs_ = Fs::create();
    fs_.mount_args = vec!["--commit-interval".into(), "3600".into()];
    fs_.mkfs(&["--intent-log", "pool-dir"]);
    fs_.mount();
    fs_
}

/// `cairn mount` in the background with `extra` arguments.
fn try_mount(fs_: &Fs, extra: &[&str]) -> Output {
    let mut args = vec![os("mount"), fs_.pool.as_os_str(), fs_.mnt.as_os_str()];
    args.extend(extra.iter().map(|a| os(a)));
    cairn(&args)
}

fn version(i: usize) -> Vec<u8> {
    let mut v = format!("version {:02}\n", i).into_bytes();
    v.extend(pattern(i as u64, 3000));
    v
}

/// 20 fsync'd versions of one file, the daemon killed: the records of the
/// log (one per fsync, at least).
fn twenty_versions(fs_: &mut Fs) -> Vec<Rec> {
    let p = fs_.p("f");
    for i in 1..=20 {
        write_synced(&p, &version(i));
    }
    fs_.kill9();
    let (recs, _) = live_records(&fs_.pool.join("intent.log"));
    assert!(recs.len() >= 20, "one record per fsync: {recs:?}");
    recs
}

/// The case: 16 bytes of 0xff over the 5th record's payload. The
/// mount takes the record from its copy, and the file is at its last
/// acknowledged version.
#[test]
fn a_damaged_record_is_read_from_its_copy() {
    let mut fs_ = quiet_pool();
    let recs = twenty_versions(&mut fs_);
    damage(
        &fs_.pool.join("intent.log"),
        recs[4].at + HEADER_LEN,
        &[0xff; 16],
    );
    fs_.mount();
    assert_bytes_eq(&fs::read(fs_.p("f")).unwrap(), &version(20), "f");
    fs_.finish();
}

/// Both copies of the 5th record damaged: the mount refuses, says which
/// record and what it would lose, and changes nothing; with
/// --discard-damaged-log it mounts at the 4 records before the damage.
#[test]
fn a_record_damaged_in_both_copies_refuses_the_mount_until_discarded() {
    let mut fs_ = quiet_pool();
    let recs = twenty_versions(&mut fs_);
    let log = fs_.pool.join("intent.log");
    let (_, copy) = live_records(&log);
    damage(&log, recs[4].at + HEADER_LEN, &[0xff; 16]);
    damage(&log, recs[4].at + copy + 20, &[0xff; 16]);
    let before = fs::read(&log).unwrap();
    let out = try_mount(&fs_, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "mounted a damaged log: {}",
        describe(&out)
    );
    for want in [
        "record 4",
        "damaged",
        "--discard-damaged-log",
        "--salvage",
        "files [/f]",
    ] {
        assert!(err.contains(want), "refusal lacks {want:?}: {err}");
    }
    assert!(
        fs::read(&log).unwrap() == before,
        "a refused mount changed the log"
    );
    // The advice works: a read-only look at the last commit (f was never
    // committed), which leaves the log as it is.
    let out = try_mount(&fs_, &["--salvage"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!fs_.p("f").exists(), "the salvage view replayed the log");
    assert!(cairn_umount(&fs_.mnt).status.success());
    assert!(
        fs::read(&log).unwrap() == before,
        "--salvage changed the log"
    );
    fs_.mount_args.push("--discard-damaged-log".into());
    fs_.mount();
    let got = fs::read(fs_.p("f")).unwrap();
    assert_bytes_eq(&got, &version(4), "f after the discard");
    assert!(fs_.daemon_output().contains("--discard-damaged-log"));
    fs_.mount_args.pop();
    fs_.remount();
    assert_bytes_eq(&fs::read(fs_.p("f")).unwrap(), &version(4), "f");
    fs_.finish();
}

/// The sweep: 30 acknowledged files, the daemon killed, 16 to 128 random
/// bytes over a random place of a random record (or its copy).
#[test]
fn random_log_damage_loses_no_acknowledged_write_silently() {
    let seeds = env_usize("CAIRN_LOG_DAMAGE_SEEDS", 50) as u64;
    let base = seed();
    eprintln!("CAIRN_SEED={base}");
    for s in base..base + seeds {
        one_damage_case(s);
    }
}

fn one_damage_case(s: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(s);
    let mut fs_ = quiet_pool();
    let files: Vec<(String, Vec<u8>)> = (0..30)
        .map(|i| (format!("f{i}"), pattern(s ^ i, rng.gen_range(1..20_000))))
        .collect();
    for (name, data) in &files {
        write_synced(&fs_.p(name), data);
    }
    fs_.kill9();
    let log = fs_.pool.join("intent.log");
    let (recs, copy) = live_records(&log);
    let r = recs[rng.gen_range(0..recs.len())];
    let at = r.at + rng.gen_range(0..r.len) + if rng.gen() { copy } else { 0 };
    let junk: Vec<u8> = (0..rng.gen_range(16..=128)).map(|_| rng.gen()).collect();
    damage(&log, at, &junk);
    let out = try_mount(&fs_, &[]);
    let refusal =
        (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned());
    if let Some(why) = &refusal {
        assert!(why.contains("intent log"), "seed {s}: {}", describe(&out));
        fs_.mount_args.push("--discard-damaged-log".into());
        fs_.mount();
    }
    for (name, data) in &files {
        let ok = fs::read(fs_.p(name)).is_ok_and(|got| &got == data);
        let named = refusal
            .as_ref()
            .is_some_and(|w| w.contains(&format!("/{name},")) || w.contains(&format!("/{name}]")));
        assert!(
            ok || named,
            "seed {s}: {name} lost silently (damage {} bytes at {at}, refusal {refusal:?})",
            junk.len()
        );
    }
    if refusal.is_some() {
        return fs_.finish();
    }
    let out = cairn_umount(&fs_.mnt);
    assert!(out.status.success(), "seed {s}: {}", describe(&out));
    fs_.check();
}
