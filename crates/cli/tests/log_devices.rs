//! The intent log on the devices (issue 51): a new pool keeps fsync's log
//! in an area of its fastest devices, one copy per device (as many as the
//! metadata's copies, on different failure domains), not in the pool
//! directory. A damaged or lost log device then loses no acknowledged
//! write; a device holding the last copy cannot be removed until another
//! holds one; a device replacing a log device holds a copy at once.

mod common;

use common::*;
use serde_json::Value;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Where a device's log area starts (after its 1 MiB header area,
/// docs/FORMAT.md "Device header").
const LOG_AREA_AT: u64 = 1 << 20;

fn version(i: usize) -> Vec<u8> {
    let mut v = format!("version {i:02}\n").into_bytes();
    v.extend(pattern(i as u64, 5000));
    v
}

/// A pool of ssd devices `names` of 512 MiB (sparse) with `policy`,
/// committing only when told, so that fsyncs stay in the log; and what
/// mkfs said.
fn pool(names: &[&str], policy: &str, more: &[&str]) -> (Fs, String) {
    let mut fs = Fs::create();
    fs.mount_args = vec!["--commit-interval".into(), "3600".into()];
    let specs: Vec<String> = (names.iter())
        .map(|n| format!("ssd:{}:512M:sparse", fs.dev(n)))
        .collect();
    let mut args = vec!["mkfs".to_string(), fs.pool.to_str().unwrap().into()];
    args.extend(["--redundancy".into(), policy.into()]);
    for s in specs {
        args.extend(["--device".into(), s]);
    }
    args.extend(more.iter().map(|m| m.to_string()));
    let said = cairn_ok(&args);
    fs.mount();
    (fs, said)
}

fn status(fs: &Fs) -> Value {
    let out = cairn_ok(&["redundancy", "show", fs.mnt.to_str().unwrap(), "--json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// (id, device file) of each device holding a copy of the log now.
fn log_devices(fs: &Fs) -> Vec<(u64, PathBuf)> {
    let st = status(fs);
    (st["devices"].as_array().unwrap().iter())
        .filter(|d| d["log"] == true)
        .map(|d| {
            (
                d["id"].as_u64().unwrap(),
                d["path"].as_str().unwrap().into(),
            )
        })
        .collect()
}

/// Writes garbage over the whole log area of the device file at `dev`:
/// every record of that copy, in both halves, is gone.
fn wreck_log_area(dev: &Path) {
    let f = (std::fs::OpenOptions::new().read(true).write(true).open(dev)).unwrap();
    let mut h = [0u8; 84];
    f.read_exact_at(&mut h, 0).unwrap();
    assert_eq!(
        u32::from_le_bytes(h[8..12].try_into().unwrap()),
        2,
        "a header with a log area"
    );
    let (at, len) = (
        u64::from_le_bytes(h[64..72].try_into().unwrap()),
        u64::from_le_bytes(h[72..80].try_into().unwrap()),
    );
    assert_eq!(at, LOG_AREA_AT);
    let junk: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
    f.write_all_at(&junk, at).unwrap();
    f.sync_all().unwrap();
}

/// `n` fsync'd versions of file `name` from `first` on, then the daemon
/// killed: the last one is acknowledged and only the log holds it.
fn synced_versions(fs: &mut Fs, name: &str, first: usize, n: usize) {
    for i in first..first + n {
        write_synced(&fs.p(name), &version(i));
        write_synced(&fs.p(&format!("{name}-{i}")), &version(i));
    }
    fs.kill9();
}

fn assert_versions(fs: &Fs, name: &str, upto: usize, when: &str) {
    let got = std::fs::read(fs.p(name)).unwrap();
    assert_bytes_eq(&got, &version(upto), &format!("{when}: {name}"));
    for i in 1..=upto {
        let p = fs.p(&format!("{name}-{i}"));
        let got = std::fs::read(&p).unwrap_or_else(|e| panic!("{when}: {}: {e}", p.display()));
        assert_bytes_eq(&got, &version(i), &format!("{when}: {name}-{i}"));
    }
}

#[test]
fn a_wrecked_or_lost_log_device_loses_no_fsynced_write() {
    let (mut fs, said) = pool(&["d0", "d1"], "copies=2", &[]);
    assert!(said.contains("intent log: 2 copies"), "{said}");
    assert!(
        !fs.pool.join("intent.log").exists(),
        "the log is not in the pool directory"
    );
    let logs = log_devices(&fs);
    assert_eq!(logs.len(), 2, "{}", status(&fs));
    assert!(status(&fs)["intent_log"]
        .as_str()
        .unwrap()
        .contains("2 of 2"));
    // Control: the records are found in the log after a kill.
    synced_versions(&mut fs, "f", 1, 10);
    fs.mount();
    assert!(
        fs.daemon_output()
            .contains("intent log record(s) left by a crash"),
        "{}",
        fs.daemon_output()
    );
    assert_versions(&fs, "f", 10, "after a kill");
    // Every byte of device 0's copy wrecked: device 1's copy holds them.
    synced_versions(&mut fs, "f", 11, 10);
    wreck_log_area(&logs[0].1);
    fs.mount();
    assert_versions(&fs, "f", 20, "device 0's log copy wrecked");
    // Device 1 gone altogether (the data has two copies): device 0's copy.
    synced_versions(&mut fs, "f", 21, 10);
    let away = logs[1].1.with_extension("gone");
    std::fs::rename(&logs[1].1, &away).unwrap();
    fs.mount();
    let out = fs.daemon_output();
    assert!(out.contains("DEGRADED"), "{out}");
    assert!(out.contains("the copy on device 1"), "{out}");
    assert_versions(&fs, "f", 30, "device 1 lost");
    assert!(status(&fs)["intent_log"]
        .as_str()
        .unwrap()
        .contains("1 of 2"));
    // Back: both copies again at the next mount.
    fs.unmount();
    std::fs::rename(&away, &logs[1].1).unwrap();
    fs.mount();
    assert_eq!(log_devices(&fs).len(), 2);
    fs.finish();
}

#[test]
fn the_last_log_copy_stays_until_another_device_holds_one() {
    let mut fs = Fs::create();
    let d0 = format!("ssd:{}:512M:sparse:log=16M", fs.dev("d0"));
    let d1 = format!("ssd:{}:512M:sparse", fs.dev("d1"));
    fs.mkfs(&["--device", &d0, "--device", &d1]);
    fs.mount();
    let m = fs.mnt.to_str().unwrap().to_string();
    let logs = log_devices(&fs);
    assert_eq!(logs.iter().map(|l| l.0).collect::<Vec<_>>(), vec![0]);
    std::fs::write(fs.p("data"), pattern(7, 3 << 20)).unwrap();
    cairn_ok(&["sync", &m]);
    let out = cairn(&["device", "remove", &m, "0"]);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("intent log's only copy"),
        "{}",
        describe(&out)
    );
    let d2 = format!("ssd:{}:512M:sparse:log=16M", fs.dev("d2"));
    cairn_ok(&["device", "add", &m, &d2]);
    assert_eq!(
        log_devices(&fs).iter().map(|l| l.0).collect::<Vec<_>>(),
        vec![0, 2]
    );
    cairn_ok(&["device", "remove", &m, "0"]);
    let logs = log_devices(&fs);
    assert_eq!(logs.iter().map(|l| l.0).collect::<Vec<_>>(), vec![2]);
    // The log now lives on device 2 alone: fsync'd writes come back.
    synced_versions(&mut fs, "g", 1, 5);
    fs.mount();
    assert_versions(&fs, "g", 5, "log on the added device");
    assert_bytes_eq(
        &std::fs::read(fs.p("data")).unwrap(),
        &pattern(7, 3 << 20),
        "data",
    );
    fs.finish();
}

#[test]
fn a_device_replacing_a_log_device_holds_a_copy_at_once() {
    let (mut fs, _) = pool(&["d0", "d1"], "copies=2", &[]);
    std::fs::write(fs.p("data"), pattern(9, 2 << 20)).unwrap();
    let logs = log_devices(&fs);
    fs.unmount();
    std::fs::rename(&logs[0].1, logs[0].1.with_extension("gone")).unwrap();
    fs.mount();
    let m = fs.mnt.to_str().unwrap().to_string();
    let new = format!("ssd:{}:512M:sparse", fs.dev("r0"));
    cairn_ok(&["device", "replace", &m, "0", &new]);
    let now = log_devices(&fs);
    assert_eq!(now.len(), 2, "{}", status(&fs));
    let added = now
        .iter()
        .find(|l| l.0 != logs[1].0)
        .expect("the new device")
        .clone();
    // Records written now are on the new device: wreck the old copy.
    synced_versions(&mut fs, "h", 1, 6);
    wreck_log_area(&logs[1].1);
    fs.mount();
    assert_versions(&fs, "h", 6, "the old log copy wrecked after the replace");
    assert!(log_devices(&fs).contains(&added));
    fs.finish();
}

#[test]
fn a_log_area_on_a_pool_whose_log_is_in_its_directory_is_refused() {
    let (fs, said) = pool(&["d0"], "copies=1", &["--intent-log", "pool-dir"]);
    assert!(said.contains("the pool directory's intent.log"), "{said}");
    let m = fs.mnt.to_str().unwrap().to_string();
    let out = cairn(&[
        "device",
        "add",
        &m,
        &format!("ssd:{}:512M:sparse:log=16M", fs.dev("x")),
    ]);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("leave out :log="),
        "{}",
        describe(&out)
    );
    assert!(log_devices(&fs).is_empty());
    fs.finish();
}
