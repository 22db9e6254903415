//! The `s3` tier device through a real mount, against a real S3 server
//! (s3s-fs on a loopback port, started here; a missing s3s-fs fails the
//! test with how to install it): demotion of cold segments as whole
//! objects and exact read-back, reads through the RAM cache (a second read
//! costs no GET), one ranged GET per 4 KiB random read, promotion of hot
//! data, kill -9 between an object's upload and its table switch and
//! after it (exact data, no orphan object left), GC of orphan objects,
//! the store down or hanging mid-read (EIO within s3_timeout_secs, the
//! mount and local tiers working, demotion paused) and back (reads and
//! demotion resume by themselves), credentials files readable by others
//! refused, and credentials never in logs, `ps` or `info`; the SSD cache
//! answering demoted chunks; s3 devices refused where they do not belong;
//! a pool mounting with its store down (the tier offline, then back). The background
//! mover and GC are off unless a test says otherwise; passes are driven
//! with `cairn tier migrate --now`. Every test ends with `cairn check`.

mod common;

use cairn_objstore::testing::{write_credentials, S3Server, TEST_KEY_ID, TEST_SECRET};
use common::*;
use serde_json::Value;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
const REC: u64 = 64 << 10;

/// Makes the kernel forget cached pages, so the next reads reach the daemon.
fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").expect("write /proc/sys/vm/drop_caches");
}

/// A mounted pool of one 64 MiB ssd device plus an s3 tier on `s3` (prefix
/// `prefix`), with a 0600 credentials file named in cairn.toml. Faster
/// tiers are kept at most 1% full: every sealed segment is demoted by a
/// mover pass.
fn s3_pool(s3: &S3Server, prefix: &str, extra: &[(&str, &str)]) -> Fs {
    let mut fs = Fs::create();
    let dev = format!("ssd:{}:64M", fs.dev("ssd"));
    fs.mkfs(&["--device", &dev]);
    let creds = fs.dir.join("s3.creds");
    write_credentials(&creds);
    for (k, v) in [
        ("tier_interval_secs", "0"),
        ("gc_interval_secs", "0"),
        ("tier_fast_full_pct", "1"),
        ("s3_timeout_secs", "3"),
    ] {
        fs.set_config(k, v);
    }
    fs.set_config(
        "s3_credentials_file",
        &format!("{:?}", creds.display().to_string()),
    );
    for (k, v) in extra {
        fs.set_config(k, v);
    }
    fs.mount();
    cairn_ok(&[
        OsStr::new("device"),
        OsStr::new("add"),
        fs.mnt.as_os_str(),
        OsStr::new(&s3.spec(prefix)),
    ]);
    fs
}

fn info(fs: &Fs) -> Value {
    let target = if fs.is_mounted() { &fs.mnt } else { &fs.pool };
    let out = cairn_ok(&[OsStr::new("info"), target.as_os_str(), OsStr::new("--json")]);
    serde_json::from_str(&out).expect("info json")
}

/// The s3 device of `cairn info --json`.
fn s3_dev(fs: &Fs) -> Value {
    let i = info(fs);
    let devs = i["devices"].as_array().expect("devices").clone();
    devs.into_iter()
        .find(|d| d["class"] == "s3")
        .expect("an s3 device")
}

fn stat(fs: &Fs, key: &str) -> u64 {
    s3_dev(fs)["object_store"][key].as_u64().unwrap_or(0)
}

fn migrate(fs: &Fs) -> Value {
    let out = cairn_ok(&[
        OsStr::new("tier"),
        OsStr::new("migrate"),
        fs.mnt.as_os_str(),
        OsStr::new("--now"),
        OsStr::new("--json"),
    ]);
    serde_json::from_str(&out).expect("migrate json")
}

fn sync(fs: &Fs) {
    cairn_ok(&[OsStr::new("sync"), fs.mnt.as_os_str()]);
}

/// Writes `len` bytes of pattern `seed` to `rel` and fsyncs it.
fn put(fs: &Fs, rel: &str, seed: u64, len: usize) -> Vec<u8> {
    let data = pattern(seed, len);
    let f = fs::File::create(fs.p(rel)).unwrap();
    f.write_all_at(&data, 0).unwrap();
    f.sync_all().unwrap();
    data
}

/// Writes the files, pushes them out of the open segment with filler,
/// commits, and demotes every sealed segment; returns the segments now on
/// the s3 device.
fn write_and_demote(fs: &Fs, files: &[(&str, u64, usize)]) -> Vec<Vec<u8>> {
    let datas: Vec<Vec<u8>> = files.iter().map(|&(n, s, l)| put(fs, n, s, l)).collect();
    put(
        fs,
        &format!("filler-{}", files[0].1),
        999 + files[0].1,
        5 * MIB,
    );
    sync(fs);
    let m = migrate(fs);
    assert!(m["demoted"].as_u64().unwrap() > 0, "nothing demoted: {m}");
    datas
}

/// Object names of slot objects under `prefix` in the bucket.
fn slot_objects(s3: &S3Server, prefix: &str) -> Vec<String> {
    s3.objects(prefix)
        .into_iter()
        .filter(|n| n.starts_with("cairn-slot-"))
        .collect()
}

/// What the daemon logged: POOL/cairn.log (if any) and its output.
fn logs(fs: &Fs) -> String {
    let log = fs::read_to_string(fs.pool.join("cairn.log")).unwrap_or_default();
    log + &fs.daemon_output()
}

fn read_file(p: &Path) -> std::io::Result<Vec<u8>> {
    fs::read(p)
}

#[test]
fn demoted_segments_read_back_exactly_through_the_ram_cache() {
    let s3 = S3Server::start();
    let fs = s3_pool(&s3, "demote", &[]);
    let datas = write_and_demote(&fs, &[("a", 1, 9 * MIB), ("b", 2, 3 * MIB + 123)]);
    let dev = s3_dev(&fs);
    let segs = dev["segments"].as_u64().unwrap();
    assert!(segs >= 3, "segments on s3: {dev}");
    let objs = slot_objects(&s3, "demote");
    assert_eq!(objs.len() as u64, segs, "one object per demoted segment");
    assert_eq!(
        stat(&fs, "puts"),
        segs + 1,
        "one PUT per segment and the header"
    );
    assert_eq!(dev["object_store"]["state"], "ok");
    // First read: from the store.
    drop_caches();
    let g0 = stat(&fs, "gets");
    assert_eq!(read_file(&fs.p("a")).unwrap(), datas[0]);
    assert_eq!(read_file(&fs.p("b")).unwrap(), datas[1]);
    let g1 = stat(&fs, "gets");
    assert!(g1 > g0, "the first read must GET ({g0} -> {g1})");
    // Sequential: read-ahead windows of whole segments, not a GET per
    // chunk or per 1 MiB (72 GETs before them; 11 with them).
    assert!(g1 - g0 <= 24, "{} GETs for 12 MiB read in order", g1 - g0);
    // Second read (kernel cache dropped): the RAM cache answers.
    drop_caches();
    assert_eq!(read_file(&fs.p("a")).unwrap(), datas[0]);
    assert_eq!(read_file(&fs.p("b")).unwrap(), datas[1]);
    let g2 = stat(&fs, "gets");
    assert_eq!(g2, g1, "second read must cost no GET");
    eprintln!(
        "s3 demote: {segs} segments, first read {} GETs, second read 0",
        g1 - g0
    );
    let mut fs = fs;
    fs.remount();
    drop_caches();
    assert_eq!(read_file(&fs.p("a")).unwrap(), datas[0], "after a remount");
    fs.finish();
}

#[test]
fn a_4k_random_read_of_demoted_data_is_one_ranged_get() {
    let s3 = S3Server::start();
    let mut fs = s3_pool(&s3, "random", &[]);
    let data = write_and_demote(&fs, &[("r", 7, 8 * MIB)]).remove(0);
    fs.remount(); // empty RAM cache
    drop_caches();
    let f = fs::File::open(fs.p("r")).unwrap();
    // SAFETY: fadvise on an fd we own; RANDOM: no kernel read-ahead.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    let (mut gets, mut bytes) = (Vec::new(), Vec::new());
    // Records 3, 17, 31, ...: never adjacent, so none continues a stream.
    for k in 0..8u64 {
        let off = (3 + 14 * k) * REC + 4096 * (k % 4);
        let (g0, b0) = (stat(&fs, "gets"), stat(&fs, "bytes_in"));
        let mut buf = vec![0u8; 4096];
        f.read_exact_at(&mut buf, off).unwrap();
        assert_eq!(buf, data[off as usize..off as usize + 4096], "at {off}");
        gets.push(stat(&fs, "gets") - g0);
        bytes.push(stat(&fs, "bytes_in") - b0);
    }
    eprintln!("s3 4K random reads: GETs {gets:?}, bytes {bytes:?}");
    assert!(
        gets.iter().all(|&g| g == 1),
        "GETs per 4 KiB read: {gets:?}"
    );
    drop(f);
    fs.finish();
}

#[test]
fn hot_data_comes_back_up_and_freed_objects_are_deleted() {
    let s3 = S3Server::start();
    let mut fs = s3_pool(&s3, "promote", &[]);
    let data = write_and_demote(&fs, &[("hot", 3, 8 * MIB)]).remove(0);
    let before = s3_dev(&fs)["segments"].as_u64().unwrap();
    fs.unmount();
    fs.set_config("tier_fast_full_pct", "90");
    fs.set_config("tier_promote_hits", "1");
    fs.mount();
    for _ in 0..3 {
        drop_caches();
        assert_eq!(read_file(&fs.p("hot")).unwrap(), data);
    }
    let m = migrate(&fs);
    assert!(m["promoted"].as_u64().unwrap() > 0, "nothing promoted: {m}");
    let after = s3_dev(&fs)["segments"].as_u64().unwrap();
    assert!(after < before, "s3 segments {before} -> {after}");
    assert!(
        eventually(Duration::from_secs(20), || {
            slot_objects(&s3, "promote").len() as u64 == after
        }),
        "objects of promoted segments not deleted: {:?}, {after} segments on s3",
        slot_objects(&s3, "promote")
    );
    assert!(stat(&fs, "deletes") > 0);
    drop_caches();
    assert_eq!(read_file(&fs.p("hot")).unwrap(), data);
    fs.finish();
}

/// Arms a failpoint, demotes, waits for the daemon to kill itself and
/// cleans up the dead mount.
fn crash_at(fs: &mut Fs, point: &str) {
    fs.unmount();
    fs.mount_env
        .push(("CAIRN_FAILPOINT".into(), PathBuf::from(point)));
    fs.mount();
    let _ = cairn(&[
        OsStr::new("tier"),
        OsStr::new("migrate"),
        fs.mnt.as_os_str(),
        OsStr::new("--now"),
    ]);
    let st = fs.wait_exit(Duration::from_secs(30));
    assert!(!st.success(), "the daemon should have died at {point}");
    assert!(lazy_unmount(&fs.mnt), "lazy unmount");
    assert!(wait_unmounted(&fs.mnt, Duration::from_secs(10)));
    fs.mount_env.clear();
    assert!(
        logs(fs).contains(&format!("failpoint {point}")),
        "the daemon did not die at {point}"
    );
}

#[test]
fn kill_between_upload_and_switch_leaves_exact_data_and_no_orphan() {
    let s3 = S3Server::start();
    let mut fs = s3_pool(&s3, "crash1", &[]);
    let a = put(&fs, "a", 11, 9 * MIB);
    put(&fs, "filler", 12, 5 * MIB);
    sync(&fs);
    crash_at(&mut fs, "tier-move-copied");
    let orphans = slot_objects(&s3, "crash1");
    assert_eq!(orphans.len(), 1, "the uploaded object: {orphans:?}");
    fs.check();
    fs.mount();
    assert_eq!(s3_dev(&fs)["segments"].as_u64().unwrap(), 0, "rolled back");
    assert!(
        eventually(Duration::from_secs(20), || slot_objects(&s3, "crash1")
            .is_empty()),
        "orphan object not deleted: {:?}",
        slot_objects(&s3, "crash1")
    );
    drop_caches();
    assert_eq!(read_file(&fs.p("a")).unwrap(), a);
    fs.finish();
}

#[test]
fn kill_after_the_switch_commits_keeps_the_object_in_use() {
    let s3 = S3Server::start();
    let mut fs = s3_pool(&s3, "crash2", &[]);
    let a = put(&fs, "a", 21, 9 * MIB);
    put(&fs, "filler", 22, 5 * MIB);
    sync(&fs);
    crash_at(&mut fs, "tier-move-committed");
    assert_eq!(slot_objects(&s3, "crash2").len(), 1);
    fs.check();
    fs.mount();
    assert_eq!(
        s3_dev(&fs)["segments"].as_u64().unwrap(),
        1,
        "rolled forward"
    );
    std::thread::sleep(Duration::from_secs(2)); // GC had its chance
    assert_eq!(
        slot_objects(&s3, "crash2").len(),
        1,
        "the object in use stays"
    );
    drop_caches();
    assert_eq!(read_file(&fs.p("a")).unwrap(), a);
    fs.finish();
}

#[test]
fn gc_deletes_objects_no_segment_holds() {
    let s3 = S3Server::start();
    let mut fs = s3_pool(&s3, "gc", &[]);
    write_and_demote(&fs, &[("a", 31, 6 * MIB)]);
    let real = slot_objects(&s3, "gc");
    assert!(!real.is_empty());
    fs.unmount();
    // Objects of slots nothing holds, as a crash or a lost delete leaves.
    let dir = s3.bucket_dir().join("gc");
    for slot in [0x77u64, 0x3_0000] {
        fs::copy(
            dir.join(&real[0]),
            dir.join(format!("cairn-slot-{slot:016x}")),
        )
        .unwrap();
    }
    assert_eq!(slot_objects(&s3, "gc").len(), real.len() + 2);
    fs.mount();
    assert!(
        eventually(Duration::from_secs(20), || slot_objects(&s3, "gc") == real),
        "orphans left: {:?} (in use: {real:?})",
        slot_objects(&s3, "gc")
    );
    assert!(stat(&fs, "lists") >= 1);
    fs.finish();
}

/// Reads `p` in another thread; returns its result and how long it took.
fn timed_read(p: PathBuf) -> std::thread::JoinHandle<(std::io::Result<Vec<u8>>, Duration)> {
    std::thread::spawn(move || {
        let t = Instant::now();
        let r = read_file(&p);
        (r, t.elapsed())
    })
}

#[test]
fn store_down_or_hanging_is_eio_in_time_local_tiers_work_and_all_resumes() {
    let mut s3 = S3Server::start();
    let mut fs = s3_pool(&s3, "down", &[("s3_timeout_secs", "2")]);
    let data = write_and_demote(&fs, &[("cold", 41, 9 * MIB), ("cold2", 42, 2 * MIB)]);
    fs.remount(); // empty RAM cache
    let local = put(&fs, "local", 43, 2 * MIB);
    // A hanging store: a read of demoted data fails within the limit,
    // while local files are read and written meanwhile.
    s3.freeze();
    drop_caches();
    let reader = timed_read(fs.p("cold"));
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    assert_eq!(read_file(&fs.p("local")).unwrap(), local);
    let more = put(&fs, "local2", 44, MIB);
    sync(&fs);
    let local_ms = t.elapsed().as_millis();
    let (r, took) = reader.join().unwrap();
    let e = r.expect_err("a read of demoted data with the store hanging");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        took < Duration::from_secs(5),
        "EIO after {took:?} (limit 2 s)"
    );
    assert!(local_ms < 1500, "local I/O took {local_ms} ms meanwhile");
    eprintln!("s3 hanging: EIO after {took:?}; local read+write+sync {local_ms} ms");
    let dev = s3_dev(&fs);
    assert_eq!(dev["object_store"]["state"], "unreachable", "{dev}");
    assert!(dev["object_store"]["errors"].as_u64().unwrap() > 0);
    // Demotion pauses: a pass moves nothing to the store and returns.
    let t = Instant::now();
    let m = migrate(&fs);
    assert_eq!(m["demoted"], 0, "{m}");
    assert!(t.elapsed() < Duration::from_secs(10));
    // The store killed outright: EIO again, at once.
    s3.stop();
    drop_caches();
    let t = Instant::now();
    let e = read_file(&fs.p("cold2")).expect_err("store down");
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    eprintln!("s3 down: EIO after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5));
    // Back: reads work again by themselves, and so does demotion.
    s3.resume();
    assert!(
        eventually(Duration::from_secs(15), || s3_dev(&fs)["object_store"]
            ["state"]
            == "ok"),
        "state did not come back"
    );
    drop_caches();
    assert_eq!(read_file(&fs.p("cold")).unwrap(), data[0]);
    assert_eq!(read_file(&fs.p("cold2")).unwrap(), data[1]);
    put(&fs, "filler-late", 45, 5 * MIB);
    sync(&fs);
    let m = migrate(&fs);
    assert!(m["demoted"].as_u64().unwrap() > 0, "demotion resumed: {m}");
    assert_eq!(read_file(&fs.p("local2")).unwrap(), more);
    fs.finish();
}

#[test]
fn background_mover_pauses_while_the_store_is_down_and_resumes() {
    let mut s3 = S3Server::start();
    let mut fs = s3_pool(&s3, "mover", &[("s3_timeout_secs", "2")]);
    fs.unmount();
    fs.set_config("tier_interval_secs", "1");
    fs.mount();
    s3.stop();
    let a = put(&fs, "a", 51, 9 * MIB);
    put(&fs, "filler", 52, 5 * MIB);
    sync(&fs);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        s3_dev(&fs)["segments"],
        0,
        "nothing can go to a store that is down"
    );
    assert_eq!(read_file(&fs.p("a")).unwrap(), a, "local data readable");
    s3.resume();
    assert!(
        eventually(Duration::from_secs(30), || s3_dev(&fs)["segments"]
            .as_u64()
            .unwrap_or(0)
            > 0),
        "the mover did not resume demotion\n{}",
        fs.diagnostics()
    );
    drop_caches();
    assert_eq!(read_file(&fs.p("a")).unwrap(), a);
    fs.finish();
}

#[test]
fn credentials_readable_by_others_are_refused_and_never_shown() {
    use std::os::unix::fs::PermissionsExt;
    let s3 = S3Server::start();
    let mut fs = Fs::create();
    fs.mkfs(&["--device", &format!("ssd:{}:64M", fs.dev("ssd"))]);
    let creds = fs.dir.join("s3.creds");
    write_credentials(&creds);
    fs::set_permissions(&creds, fs::Permissions::from_mode(0o644)).unwrap();
    fs.set_config(
        "s3_credentials_file",
        &format!("{:?}", creds.display().to_string()),
    );
    fs.set_config("tier_interval_secs", "0");
    fs.mount_env
        .push(("CAIRN_LOG".into(), PathBuf::from("debug")));
    fs.mount();
    let add = |fs: &Fs| {
        cairn(&[
            OsStr::new("device"),
            OsStr::new("add"),
            fs.mnt.as_os_str(),
            OsStr::new(&s3.spec("creds")),
        ])
    };
    let out = add(&fs);
    assert!(
        !out.status.success(),
        "a 0644 credentials file must be refused"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mode 644"), "{err}");
    fs::set_permissions(&creds, fs::Permissions::from_mode(0o600)).unwrap();
    let out = add(&fs);
    assert!(out.status.success(), "{}", describe(&out));
    put(&fs, "a", 61, 9 * MIB);
    put(&fs, "filler", 62, 5 * MIB);
    sync(&fs);
    fs.unmount();
    fs.set_config("tier_fast_full_pct", "1");
    // Credentials from the environment this time (no file).
    fs.set_config("s3_credentials_file", "\"\"");
    fs.mount_env
        .push(("AWS_ACCESS_KEY_ID".into(), TEST_KEY_ID.into()));
    fs.mount_env
        .push(("AWS_SECRET_ACCESS_KEY".into(), TEST_SECRET.into()));
    fs.mount();
    assert!(migrate(&fs)["demoted"].as_u64().unwrap() > 0);
    let ps = sh(&fs.dir, "ps -eo args");
    let info_text = cairn_ok(&[OsStr::new("info"), fs.mnt.as_os_str(), OsStr::new("--json")]);
    let status = cairn_ok(&[OsStr::new("tier"), OsStr::new("status"), fs.mnt.as_os_str()]);
    fs.unmount();
    let log = logs(&fs);
    for (what, text) in [
        ("ps", &ps),
        ("cairn.log", &log),
        ("info", &info_text),
        ("tier status", &status),
        ("daemon output", &fs.daemon_output()),
    ] {
        for secret in [TEST_SECRET, TEST_KEY_ID] {
            let cairn_lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.contains("s3s-fs"))
                .filter(|l| l.contains(secret))
                .collect();
            assert!(
                cairn_lines.is_empty(),
                "{what} shows a credential: {cairn_lines:?}"
            );
        }
    }
    assert!(status.contains("object store ok"), "{status}");
    // An unmounted pool's commands find credentials the same way.
    let out = cairn(&[OsStr::new("check"), fs.pool.as_os_str()]);
    assert!(
        !out.status.success(),
        "no credentials, no check of an s3 pool"
    );
    fs.set_config(
        "s3_credentials_file",
        &format!("{:?}", creds.display().to_string()),
    );
    fs.check();
}

#[test]
fn the_ssd_cache_serves_demoted_chunks_without_gets() {
    let s3 = S3Server::start();
    let mut fs = Fs::create();
    let tier = format!("nvme:{}:64M", fs.dev("nvme"));
    let cache = format!("ssd:{}:64M:role=cache", fs.dev("cache"));
    fs.mkfs(&["--device", &tier, "--device", &cache]);
    let creds = fs.dir.join("s3.creds");
    write_credentials(&creds);
    for (k, v) in [
        ("tier_interval_secs", "0"),
        ("gc_interval_secs", "0"),
        ("tier_fast_full_pct", "1"),
        ("read_cache_mib", "0"),
    ] {
        fs.set_config(k, v);
    }
    fs.set_config(
        "s3_credentials_file",
        &format!("{:?}", creds.display().to_string()),
    );
    fs.mount();
    cairn_ok(&[
        OsStr::new("device"),
        OsStr::new("add"),
        fs.mnt.as_os_str(),
        OsStr::new(&s3.spec("ssdcache")),
    ]);
    let data = write_and_demote(&fs, &[("a", 71, 6 * MIB)]).remove(0);
    drop_caches();
    let g0 = stat(&fs, "gets");
    assert_eq!(read_file(&fs.p("a")).unwrap(), data);
    let g1 = stat(&fs, "gets");
    assert!(g1 > g0);
    let filled = || info(&fs)["ssd_cache"]["entries"].as_u64().unwrap_or(0);
    assert!(
        eventually(Duration::from_secs(20), || filled() >= 90),
        "SSD cache not filled: {} entries",
        filled()
    );
    drop_caches();
    assert_eq!(read_file(&fs.p("a")).unwrap(), data);
    assert_eq!(stat(&fs, "gets"), g1, "the SSD cache answers, no GET");
    fs.finish();
}

#[test]
fn s3_devices_are_refused_where_they_do_not_belong() {
    let s3 = S3Server::start();
    // mkfs: an s3 tier is added afterwards.
    let scratch = Fs::create();
    let out = cairn(&[
        OsStr::new("mkfs"),
        scratch.pool.as_os_str(),
        OsStr::new("--device"),
        OsStr::new(&s3.spec("mkfs")),
    ]);
    assert!(!out.status.success(), "mkfs with an s3 device");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cairn device add"));
    // Never the cache, never a spec with credentials in it.
    for bad in [
        format!("{}:role=cache", s3.spec("x")),
        format!(
            "s3:{}/x:endpoint=http://k:s@127.0.0.1:{}",
            "cairn-test", s3.port
        ),
    ] {
        let out = cairn(&[
            OsStr::new("device"),
            OsStr::new("add"),
            scratch.dir.as_os_str(),
            OsStr::new(&bad),
        ]);
        assert!(!out.status.success(), "{bad} accepted");
    }
    // The same store and prefix twice in one pool, or in a second pool.
    let fs = s3_pool(&s3, "shared", &[]);
    let again = cairn(&[
        OsStr::new("device"),
        OsStr::new("add"),
        fs.mnt.as_os_str(),
        OsStr::new(&s3.spec("shared")),
    ]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already device"));
    let mut other = Fs::create();
    other.mkfs(&["--device", &format!("ssd:{}:64M", other.dev("ssd"))]);
    let creds = other.dir.join("s3.creds");
    write_credentials(&creds);
    other.set_config(
        "s3_credentials_file",
        &format!("{:?}", creds.display().to_string()),
    );
    other.mount();
    let out = cairn(&[
        OsStr::new("device"),
        OsStr::new("add"),
        other.mnt.as_os_str(),
        OsStr::new(&s3.spec("shared")),
    ]);
    assert!(!out.status.success(), "another pool's prefix accepted");
    assert!(String::from_utf8_lossy(&out.stderr).contains("already holds a Cairn device header"));
    other.finish();
    fs.finish();
}

#[test]
fn a_pool_mounts_with_its_store_down_and_the_tier_comes_back() {
    let mut s3 = S3Server::start();
    let mut fs = s3_pool(&s3, "offline", &[("s3_timeout_secs", "2")]);
    let data = write_and_demote(&fs, &[("cold", 81, 6 * MIB)]).remove(0);
    let local = put(&fs, "local", 82, MIB);
    fs.unmount();
    s3.stop();
    let t = Instant::now();
    fs.mount();
    let mount_time = t.elapsed();
    eprintln!("s3 offline: mounted in {mount_time:?} with the store down");
    assert!(
        mount_time < Duration::from_secs(15),
        "mount took {mount_time:?}"
    );
    assert_eq!(s3_dev(&fs)["object_store"]["state"], "unreachable");
    assert_eq!(read_file(&fs.p("local")).unwrap(), local);
    let e = read_file(&fs.p("cold")).expect_err("store down");
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    s3.resume();
    assert!(
        eventually(Duration::from_secs(15), || s3_dev(&fs)["object_store"]
            ["state"]
            == "ok"),
        "state did not come back"
    );
    drop_caches();
    assert_eq!(read_file(&fs.p("cold")).unwrap(), data);
    fs.finish();
}

/// Issue 50 item 5, as reported: a pool of a 64 MiB device and an s3 tier
/// takes 256 MiB (the mover off: new segments go to the store once the
/// local tier is full); `cairn sync` succeeds, the data reads back exactly
/// after a remount, most of it is in the bucket, and `info` has no
/// short-of-space warning.
#[test]
fn a_pool_with_an_s3_tier_takes_more_than_its_local_device() {
    let s3 = S3Server::start();
    let mut fs = s3_pool(&s3, "big", &[]);
    let data = pattern(91, 256 * MIB);
    let f = fs::File::create(fs.p("big")).unwrap();
    for (i, part) in data.chunks(8 * MIB).enumerate() {
        f.write_all_at(part, (i * 8 * MIB) as u64)
            .unwrap_or_else(|e| panic!("write at {} MiB: {e}\n{}", i * 8, fs.diagnostics()));
    }
    drop(f);
    let out = cairn(&[OsStr::new("sync"), fs.mnt.as_os_str()]);
    assert!(
        out.status.success(),
        "cairn sync: {out:?}\n{}",
        fs.diagnostics()
    );
    let objects = s3.objects("big").len();
    assert!(objects >= 48, "{objects} objects in the bucket for 256 MiB");
    let i = info(&fs);
    assert!(i["space_warning"].is_null(), "{}", i["space_warning"]);
    fs.remount();
    drop_caches();
    assert_bytes_eq(&read_file(&fs.p("big")).unwrap(), &data, "big");
    fs.finish();
}
