//! Faults injected under a real FUSE mount: the daemon is started with
//! CAIRN_FAULT_PLAN naming a plan file (cairn_devices::backend::plan) that
//! the test rewrites while the pool is mounted. A read error on one file's
//! chunk gives EIO for that file only, named in the log and by `cairn
//! scrub`; a data device refusing writes sends the flush to the other
//! device; with no device left the commit fails, is retried, the device is
//! shown failing, and nothing is lost; a metadata file out of room fails
//! `cairn sync` cleanly; a stalling device delays reads but returns the
//! right bytes. Every test ends with a remount, exact contents and a clean
//! `cairn check`.

mod common;

use common::hist::*;
use common::*;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A pool over the given devices (CLASS, name in devs/, size), mounted
/// with an empty fault plan; returns it and the plan's path.
fn mounted(devices: &[(&str, &str, &str)]) -> (Fs, PathBuf) {
    mounted_with(devices, &[])
}

/// `mounted` with more mkfs arguments.
fn mounted_with(devices: &[(&str, &str, &str)], more: &[&str]) -> (Fs, PathBuf) {
    let mut fs = Fs::create();
    let specs: Vec<String> = devices
        .iter()
        .map(|(class, name, size)| format!("{class}:{}:{size}", fs.dev(name)))
        .collect();
    let mut args = vec!["--sparse"];
    for s in &specs {
        args.extend(["--device", s.as_str()]);
    }
    args.extend(more);
    fs.mkfs(&args);
    let plan = fs.mount_with_fault_plan();
    (fs, plan)
}

fn write_synced(path: &Path, data: &[u8]) {
    let mut f = fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// `cairn sync TARGET`: commits now.
fn cairn_sync(target: &Path) -> std::process::Output {
    cairn(&[OsStr::new("sync"), target.as_os_str()])
}

/// Where `needle` lies in the segment slots of the device file at `path`
/// (not in the intent log's copy before them).
fn find_bytes(path: &Path, needle: &[u8]) -> u64 {
    let raw = fs::read(path).unwrap();
    let from = data_offset(path) as usize;
    let at = raw[from..].windows(needle.len()).position(|w| w == needle);
    from as u64 + at.unwrap_or_else(|| panic!("bytes not found in {}", path.display())) as u64
}

/// (write_errors, failing) of device `id` per `cairn info --json`.
fn device_health(target: &Path, id: u64) -> (u64, bool) {
    let j = pool_info(target);
    let d = field_arr(&j, "devices")
        .iter()
        .find(|d| field_u64(d, "id") == id)
        .unwrap_or_else(|| panic!("no device {id}: {j:?}"))
        .clone();
    (field_u64(&d, "write_errors"), field_bool(&d, "failing"))
}

fn remount_and_verify(fs: &mut Fs, plan: &Path, files: &[(&str, &[u8])]) {
    fs::write(plan, "").unwrap();
    fs.remount();
    for (name, data) in files {
        assert_file(&fs.p(name), data, name);
    }
}

#[test]
fn a_read_error_gives_eio_for_that_file_only_and_is_named() {
    let (mut fs, plan) = mounted(&[("ssd", "data", "256M")]);
    let (a, b) = (pattern(1, 1 << 20), pattern(2, 1 << 20));
    write_synced(&fs.p("a"), &a);
    write_synced(&fs.p("b"), &b);
    assert!(cairn_sync(&fs.mnt).status.success());
    let at = find_bytes(Path::new(&fs.dev("data")), &a[600_000..600_064]);
    // A fresh mount (nothing cached) whose device fails reads of a's bytes.
    fs::write(&plan, format!("devs/data read eio range={at}-{}\n", at + 1)).unwrap();
    fs.remount();
    let e = read_uncached(&fs.p("a")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(read_uncached(&fs.p("b")).unwrap(), b, "other files work");
    let ino = fs::metadata(fs.p("a")).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let log = fs.daemon_output();
    assert!(
        log.contains(&format!("read of inode {} bytes", ino.unwrap())),
        "the log names the file\n{log}"
    );
    let out = cairn(&[OsStr::new("scrub"), fs.mnt.as_os_str()]);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("/a") && !report.contains("/b"), "{report}");
    fs.set_fault_plan(&plan, "");
    assert_eq!(read_uncached(&fs.p("a")).unwrap(), a, "the fault is gone");
    remount_and_verify(&mut fs, &plan, &[("a", &a), ("b", &b)]);
    fs.finish();
}

#[test]
fn a_device_refusing_writes_sends_the_flush_to_the_other_device() {
    let (mut fs, plan) = mounted(&[("nvme", "fast", "64M"), ("hdd", "slow", "256M")]);
    fs.set_fault_plan(&plan, "devs/fast write eio\n");
    let files: Vec<(String, Vec<u8>)> = (0..3)
        .map(|i| (format!("f{i}"), pattern(10 + i, 2 << 20)))
        .collect();
    for (name, data) in &files {
        write_synced(&fs.p(name), data);
        let out = cairn_sync(&fs.mnt);
        assert!(out.status.success(), "commit: {}", describe(&out));
    }
    let (errors, _) = device_health(&fs.mnt, 0);
    assert!(errors >= 1, "the fault was not hit");
    let slow = fs::metadata(fs.dev("slow")).unwrap();
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&slow) * 512 >= 6 << 20,
        "the data went to the slow device"
    );
    let list: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
    remount_and_verify(&mut fs, &plan, &list);
    fs.finish();
}

#[test]
fn with_no_device_left_the_commit_fails_is_retried_and_the_device_shown_failing() {
    let (mut fs, plan) = mounted(&[("ssd", "data", "256M")]);
    let kept = pattern(3, 300_000);
    write_synced(&fs.p("kept"), &kept);
    assert!(cairn_sync(&fs.mnt).status.success());
    fs.set_fault_plan(&plan, "devs/data write eio\n");
    let data = pattern(4, 1 << 20);
    fs::write(fs.p("f"), &data).unwrap();
    for round in 0..2 {
        let out = cairn_sync(&fs.mnt);
        assert!(!out.status.success(), "round {round}: commit succeeded");
    }
    let e = fs::File::open(fs.p("f")).unwrap().sync_all().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "fsync: {e}");
    let (errors, failing) = device_health(&fs.mnt, 0);
    assert!(errors >= 3 && failing, "{errors} errors, failing {failing}");
    let info = cairn_ok(&[OsStr::new("info"), fs.mnt.as_os_str()]);
    assert!(info.contains("FAILING"), "{info}");
    assert_eq!(read_uncached(&fs.p("f")).unwrap(), data, "still readable");
    fs.set_fault_plan(&plan, "");
    fs::File::open(fs.p("f")).unwrap().sync_all().unwrap();
    remount_and_verify(&mut fs, &plan, &[("kept", &kept), ("f", &data)]);
    fs.finish();
}

#[test]
fn a_metadata_file_out_of_room_fails_the_commit_and_loses_nothing() {
    let (mut fs, plan) = mounted(&[("ssd", "data", "256M")]);
    let (a, b) = (pattern(5, 200_000), pattern(6, 200_000));
    write_synced(&fs.p("a"), &a);
    assert!(cairn_sync(&fs.mnt).status.success());
    // The host filesystem under the metadata file is full: writes that
    // grow it fail with ENOSPC, in both copies (the second lies beside the
    // first on a one-device pool).
    let mirror = fs::read_link(fs.pool.join("meta.mirror")).expect("a second copy");
    let mirror = mirror.file_name().unwrap().to_str().unwrap();
    let full = format!("meta.redb write,set_len full\n{mirror} write,set_len full\n");
    fs.set_fault_plan(&plan, &full);
    fs::write(fs.p("b"), &b).unwrap();
    let out = cairn_sync(&fs.mnt);
    assert!(
        !out.status.success(),
        "commit succeeded: {}",
        describe(&out)
    );
    assert_eq!(read_uncached(&fs.p("b")).unwrap(), b, "changes kept");
    fs.set_fault_plan(&plan, "");
    let out = cairn_sync(&fs.mnt);
    assert!(out.status.success(), "commit after: {}", describe(&out));
    remount_and_verify(&mut fs, &plan, &[("a", &a), ("b", &b)]);
    fs.finish();
}

#[test]
fn a_stalling_device_delays_reads_but_returns_the_right_bytes() {
    let (mut fs, plan) = mounted(&[("ssd", "data", "256M")]);
    let a = pattern(7, 1 << 20);
    write_synced(&fs.p("a"), &a);
    assert!(cairn_sync(&fs.mnt).status.success());
    fs.remount();
    fs.set_fault_plan(&plan, "devs/data read hang:400ms when=times:1\n");
    let t = Instant::now();
    assert_eq!(read_uncached(&fs.p("a")).unwrap(), a);
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "the stall was not hit"
    );
    fs.set_fault_plan(&plan, "devs/data write,sync hang:300ms when=times:2\n");
    let b = pattern(8, 1 << 20);
    write_synced(&fs.p("b"), &b);
    assert!(cairn_sync(&fs.mnt).status.success());
    remount_and_verify(&mut fs, &plan, &[("a", &a), ("b", &b)]);
    fs.finish();
}

#[test]
fn a_metadata_copy_returning_corrupt_bytes_is_outvoted_by_the_other() {
    let (mut fs, plan) = mounted(&[("nvme", "fast", "64M"), ("hdd", "slow", "256M")]);
    let files: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| (format!("f{i}"), pattern(20 + i, 5_000 * i as usize)))
        .collect();
    for (name, data) in &files {
        fs::write(fs.p(name), data).unwrap();
    }
    assert!(cairn_sync(&fs.mnt).status.success());
    // Every read of the primary copy returns flipped bits.
    fs::write(&plan, "meta.redb read corrupt\n").unwrap();
    fs.remount();
    for (name, data) in &files {
        assert_eq!(&read_uncached(&fs.p(name)).unwrap(), data, "{name}");
    }
    // Changes committed now reach only the good copy (an unlink is not
    // in the intent log: only the metadata has it).
    let extra = pattern(99, 70_000);
    write_synced(&fs.p("extra"), &extra);
    fs::remove_file(fs.p("f0")).unwrap();
    assert!(cairn_sync(&fs.mnt).status.success());
    let out = cairn_ok(&[OsStr::new("scrub"), fs.mnt.as_os_str()]);
    // The copy that reads wrong even after its repair was dropped.
    assert!(out.contains("metadata: 1 copy;"), "{out}");
    let mut list: Vec<(&str, &[u8])> = files[1..]
        .iter()
        .map(|(n, d)| (n.as_str(), &d[..]))
        .collect();
    list.push(("extra", &extra));
    // The next mount keeps the newer copy, and repairs the older one.
    remount_and_verify(&mut fs, &plan, &list);
    assert!(!fs.p("f0").exists(), "the older copy was kept");
    assert!(
        fs.daemon_output().contains("is older than its mirror"),
        "{}",
        fs.diagnostics()
    );
    fs.finish();
}

#[test]
fn an_intent_log_that_fails_its_syncs_makes_fsync_commit_instead() {
    let (mut fs, plan) = mounted_with(&[("ssd", "data", "256M")], &["--intent-log", "pool-dir"]);
    // The log's writes land but its syncs fail (the record may or may not
    // be durable): fsync must make the data durable another way.
    fs.set_fault_plan(&plan, "intent.log sync eio\n");
    let files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("f{i}"), pattern(40 + i, 3000 + 5000 * i as usize)))
        .collect();
    for (name, data) in &files {
        write_synced(&fs.p(name), data);
    }
    assert!(
        fs.daemon_output().contains("committing instead"),
        "the fault was not hit\n{}",
        fs.diagnostics()
    );
    // The daemon dies: no unmount, no flush.
    fs.kill9();
    fs::write(&plan, "").unwrap();
    fs.mount();
    for (name, data) in &files {
        assert_file(&fs.p(name), data, name);
    }
    fs.finish();
}
