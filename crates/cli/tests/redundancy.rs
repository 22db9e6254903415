//! Redundancy on real mounts: pools whose data has copies on several
//! devices survive a lost device (mounted read-write, every file exact),
//! get it back with `device replace`, heal bit rot from the good copy, and
//! raise their copies online; a pool whose lost device held the only copy
//! of some data mounts only with --degraded, read-only, with exactly the
//! files that lost nothing readable.

mod common;

use common::redundancy::{json, pool_with, slots_used};
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Files of several sizes (some span many segments), by seed.
const FILES: &[(u64, usize)] = &[
    (1, 3 << 20),
    (2, 100_000),
    (3, 9 << 20),
    (4, 4096),
    (5, 1 << 20),
    (6, 700_000),
    (7, 6 << 20),
];

fn name(seed: u64) -> String {
    format!("f{seed}")
}

fn write_files(fs: &Fs) {
    std::fs::create_dir_all(fs.p("d")).unwrap();
    for &(seed, len) in FILES {
        std::fs::write(fs.p(&format!("d/{}", name(seed))), pattern(seed, len)).unwrap();
    }
    cairn_ok(&["sync", fs.mnt.to_str().unwrap()]);
}

/// Every file reads exact.
fn assert_files(fs: &Fs, when: &str) {
    for &(seed, len) in FILES {
        let got = std::fs::read(fs.p(&format!("d/{}", name(seed))))
            .unwrap_or_else(|e| panic!("{when}: read {}: {e}\n{}", name(seed), fs.daemon_output()));
        assert_bytes_eq(
            &got,
            &pattern(seed, len),
            &format!("{when}: {}", name(seed)),
        );
    }
}

fn redundancy(fs: &Fs) -> Value {
    json(&["redundancy", "show", fs.mnt.to_str().unwrap(), "--json"])
}

/// The pool's devices (id, path, state) per `redundancy show`.
fn devices(fs: &Fs) -> Vec<(u64, PathBuf, String)> {
    let v = redundancy(fs);
    v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let id = d["id"].as_u64().unwrap();
            let path = PathBuf::from(d["path"].as_str().unwrap());
            (id, path, d["state"].as_str().unwrap().to_string())
        })
        .collect()
}

/// Moves a device file away, as a dead disk would be.
fn lose(path: &Path) -> PathBuf {
    let away = path.with_extension("gone");
    std::fs::rename(path, &away).unwrap();
    away
}

#[test]
fn a_four_device_copies_2_pool_survives_losing_each_device_in_turn() {
    let mut fs = pool_with(4, "96M", "copies=2");
    write_files(&fs);
    let st = redundancy(&fs);
    assert_eq!(st["policy"], "copies=2");
    assert_eq!(st["short_segments"], 0, "{st}");
    let total: u64 = devices(&fs).iter().map(|_| 1).sum();
    assert_eq!(total, 4);
    for round in 0..4 {
        let before = devices(&fs);
        let (id, path, _) = before[round].clone();
        fs.unmount();
        lose(&path);
        // Covered by the copies: mounts read-write without --degraded.
        fs.mount();
        let log = fs.daemon_output();
        assert!(
            log.contains("DEGRADED") && log.contains(&format!("device {id} is missing")),
            "{log}"
        );
        let states = devices(&fs);
        assert!(
            states.iter().any(|(i, _, s)| *i == id && s == "missing"),
            "round {round}: {states:?}"
        );
        assert_files(&fs, &format!("round {round}, device {id} missing"));
        // Writes go on while degraded.
        std::fs::write(fs.p("d/while-degraded"), pattern(99, 300_000)).unwrap();
        let new = fs.dev(&format!("r{round}"));
        let m = fs.mnt.to_str().unwrap().to_string();
        cairn_ok(&[
            "device",
            "replace",
            &m,
            &id.to_string(),
            &format!("ssd:{new}:96M"),
        ]);
        let st = redundancy(&fs);
        assert_eq!(st["lost_segments"], 0, "round {round}: {st}");
        let states = devices(&fs);
        assert!(states.iter().all(|(_, _, s)| s == "online"), "{states:?}");
        assert!(
            !states.iter().any(|(i, _, _)| *i == id),
            "the old device left: {states:?}"
        );
        cairn_ok(&["redundancy", "rebuild", &m]);
        let st = redundancy(&fs);
        assert_eq!(st["short_segments"], 0, "round {round}: {st}");
        assert_files(&fs, &format!("round {round}, after replace"));
        fs.unmount();
        let report = fs.check();
        assert!(!report.contains("damaged"), "{report}");
        fs.mount();
    }
    fs.finish();
}

#[test]
fn bit_rot_in_one_copy_is_read_from_the_other_and_repaired() {
    let mut fs = pool_with(2, "96M", "copies=2");
    let data = pattern(42, 2 << 20);
    std::fs::write(fs.p("rot"), &data).unwrap();
    cairn_ok(&["sync", fs.mnt.to_str().unwrap()]);
    let devs = devices(&fs);
    fs.unmount();
    // Damage the first device's copy where the file's bytes are.
    let path = &devs[0].1;
    let mut raw = std::fs::read(path).unwrap();
    let needle = &data[300_000..300_064];
    let at = raw
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the file's bytes on device 0");
    raw[at..at + 64].iter_mut().for_each(|b| *b ^= 0x5a);
    std::fs::write(path, &raw).unwrap();
    fs.mount();
    let got = std::fs::read(fs.p("rot")).unwrap();
    assert_bytes_eq(&got, &data, "read through a rotten copy");
    let st = redundancy(&fs);
    assert!(st["repaired"].as_u64().unwrap() >= 1, "{st}");
    assert!(st["served_from_other_copy"].as_u64().unwrap() >= 1, "{st}");
    assert!(
        fs.daemon_output().contains("repaired the chunk"),
        "{}",
        fs.daemon_output()
    );
    fs.unmount();
    let healed = std::fs::read(path).unwrap();
    assert_eq!(&healed[at..at + 64], needle, "the bad copy was rewritten");
    fs.mount();
    // Scrub checks every copy: damage the second device now.
    fs.unmount();
    let path = &devs[1].1;
    let mut raw = std::fs::read(path).unwrap();
    let at = raw.windows(needle.len()).position(|w| w == needle).unwrap();
    raw[at] ^= 1;
    std::fs::write(path, &raw).unwrap();
    fs.mount();
    let rep = json(&["scrub", fs.mnt.to_str().unwrap(), "--json"]);
    assert!(rep["data_repaired"].as_u64().unwrap() >= 1, "{rep}");
    assert_eq!(rep["damaged"].as_array().unwrap().len(), 0, "{rep}");
    fs.finish();
}

#[test]
fn a_lost_only_copy_needs_degraded_which_mounts_read_only_with_the_rest_exact() {
    // Small devices: the files fill the first and spill onto the second.
    let mut fs = pool_with(2, "20M", "copies=1");
    write_files(&fs);
    let devs = devices(&fs);
    fs.unmount();
    let away = lose(&devs[1].1);
    let out = cairn(&["mount", fs.pool.to_str().unwrap(), fs.mnt.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        err.contains("--degraded") && err.contains("device 1"),
        "{err}"
    );
    assert_eq!(err.matches("is missing").count(), 1, "said once: {err}");
    fs.mount_args.push("--degraded".into());
    fs.mount();
    assert!(
        fs.daemon_output().contains("READ-ONLY"),
        "{}",
        fs.daemon_output()
    );
    let (mut exact, mut eio) = (0, 0);
    for &(seed, len) in FILES {
        match std::fs::read(fs.p(&format!("d/{}", name(seed)))) {
            Ok(got) => {
                assert_bytes_eq(&got, &pattern(seed, len), "a file that reads is exact");
                exact += 1;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
                eio += 1;
            }
        }
    }
    assert!(eio > 0, "device 1 held some of the data");
    assert!(exact > 0 || eio == FILES.len(), "{exact} exact, {eio} EIO");
    let e = std::fs::write(fs.p("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let st = redundancy(&fs);
    assert!(st["lost_segments"].as_u64().unwrap() > 0, "{st}");
    // Scrub names the files with lost data (and writes nothing).
    let out = cairn(&["scrub", fs.mnt.to_str().unwrap(), "--json"]);
    let rep: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let damaged = rep["damaged"].to_string();
    assert!(damaged.contains("/d/f"), "{}\n{rep}", describe(&out));
    fs.unmount();
    // The device comes back: a normal mount, every file exact.
    std::fs::rename(&away, &devs[1].1).unwrap();
    fs.mount_args.clear();
    fs.mount();
    assert_files(&fs, "device back");
    fs.finish();
}

#[test]
fn copies_are_raised_online_and_then_cover_a_lost_device() {
    let mut fs = pool_with(2, "96M", "copies=1");
    write_files(&fs);
    let m = fs.mnt.to_str().unwrap().to_string();
    cairn_ok(&["redundancy", "set", &m, "copies=2"]);
    cairn_ok(&["redundancy", "rebuild", &m]);
    let st = redundancy(&fs);
    assert_eq!(st["policy"], "copies=2");
    assert_eq!(st["short_segments"], 0, "{st}");
    let devs = devices(&fs);
    fs.unmount();
    lose(&devs[0].1);
    fs.mount();
    assert_files(&fs, "raised to two copies, device 0 lost");
    fs.finish();
}

#[test]
fn an_ec_4_2_pool_loses_any_two_of_six_devices_and_reads_every_file_exact() {
    let mut fs = pool_with(6, "64M", "ec=4+2");
    write_files(&fs);
    let big = pattern(78, 40 << 20);
    std::fs::write(fs.p("big"), &big).unwrap();
    let m = fs.mnt.to_str().unwrap().to_string();
    cairn_ok(&["sync", &m]);
    let before = slots_used(&fs);
    cairn_ok(&["redundancy", "rebuild", &m]);
    let st = redundancy(&fs);
    assert_eq!(st["policy"], "ec=4+2");
    assert!(st["stripes"].as_u64().unwrap() >= 2, "{st}");
    assert_eq!(st["short_segments"], 0, "{st}");
    // Three copies until striped, then 1.5 (the stripe's tail waits).
    let after = slots_used(&fs);
    assert!(
        after * 10 < before * 7,
        "striping frees copies: {before} -> {after}"
    );
    assert_files(&fs, "striped");
    let devs = devices(&fs);
    // Every device is lost once (a pair at a time), so that data members,
    // not only parity, are restored.
    let mut restored = 0;
    for (a, b) in [(1, 4), (0, 5), (2, 3)] {
        fs.unmount();
        let lost = [lose(&devs[a].1), lose(&devs[b].1)];
        // Covered by parity: read-write without --degraded.
        fs.mount();
        let log = fs.daemon_output();
        assert!(
            log.contains("DEGRADED") && !log.contains("READ-ONLY"),
            "{log}"
        );
        assert_files(&fs, &format!("devices {a} and {b} missing"));
        let st = redundancy(&fs);
        assert_eq!(st["lost_segments"], 0, "{st}");
        restored += st["restored_from_parity"].as_u64().unwrap();
        assert_bytes_eq(&std::fs::read(fs.p("big")).unwrap(), &big, "big, two lost");
        fs.unmount();
        for (away, (_, path, _)) in lost.iter().zip([&devs[a], &devs[b]]) {
            std::fs::rename(away, path).unwrap();
        }
        fs.mount();
    }
    assert!(restored > 0, "no chunk was restored from parity");
    // A lost device is replaced: its members are restored from parity.
    fs.unmount();
    lose(&devs[2].1);
    fs.mount();
    std::fs::write(fs.p("d/while-degraded"), pattern(77, 2 << 20)).unwrap();
    let new = fs.dev("r2");
    let id = devs[2].0.to_string();
    cairn_ok(&["device", "replace", &m, &id, &format!("ssd:{new}:64M")]);
    let st = redundancy(&fs);
    assert_eq!(st["lost_segments"], 0, "{st}");
    assert!(devices(&fs).iter().all(|(_, _, s)| s == "online"), "{st}");
    let rep = json(&["scrub", &m, "--json"]);
    assert_eq!(rep["damaged"].as_array().unwrap().len(), 0, "{rep}");
    // The rebuilt members are right: lose two others and read all.
    let devs = devices(&fs);
    fs.unmount();
    lose(&devs[0].1);
    lose(&devs[3].1);
    fs.mount();
    assert_files(&fs, "after the replace, two others lost");
    assert_bytes_eq(&std::fs::read(fs.p("big")).unwrap(), &big, "big, replaced");
    let got = std::fs::read(fs.p("d/while-degraded")).unwrap();
    assert_bytes_eq(&got, &pattern(77, 2 << 20), "written while degraded");
    fs.finish();
}

#[test]
fn bit_rot_in_a_striped_chunk_is_restored_from_parity_and_repaired() {
    let mut fs = pool_with(3, "64M", "ec=2+1");
    let data = pattern(43, 12 << 20);
    std::fs::write(fs.p("rot"), &data).unwrap();
    let m = fs.mnt.to_str().unwrap().to_string();
    cairn_ok(&["sync", &m]);
    cairn_ok(&["redundancy", "rebuild", &m]);
    let st = redundancy(&fs);
    assert!(st["stripes"].as_u64().unwrap() >= 1, "{st}");
    let devs = devices(&fs);
    fs.unmount();
    // Damage every place that holds the bytes (the striped copy, and
    // slots freed when the stripe was made, which keep old bytes).
    let needle = &data[5_000_000..5_000_064];
    let mut damaged = Vec::new();
    for (_, path, _) in &devs {
        let mut raw = std::fs::read(path).unwrap();
        let Some(at) = raw.windows(needle.len()).position(|w| w == needle) else {
            continue;
        };
        raw[at..at + 64].iter_mut().for_each(|b| *b ^= 0x33);
        std::fs::write(path, &raw).unwrap();
        damaged.push((path.clone(), at));
    }
    assert!(!damaged.is_empty(), "the file's bytes are on a device");
    fs.mount();
    let got = std::fs::read(fs.p("rot")).unwrap();
    assert_bytes_eq(&got, &data, "read through a rotten striped chunk");
    let st = redundancy(&fs);
    assert!(st["restored_from_parity"].as_u64().unwrap() >= 1, "{st}");
    assert!(st["repaired"].as_u64().unwrap() >= 1, "{st}");
    fs.unmount();
    let healed: Vec<_> = (damaged.iter())
        .filter(|(p, at)| &std::fs::read(p).unwrap()[*at..at + 64] == needle)
        .collect();
    assert_eq!(
        healed.len(),
        1,
        "the rotten copy was rewritten: {damaged:?}"
    );
    // Scrub: rot again, found and repaired from parity, nothing damaged.
    let (path, at) = healed[0];
    let mut raw = std::fs::read(path).unwrap();
    raw[*at] ^= 1;
    std::fs::write(path, &raw).unwrap();
    fs.mount();
    let rep = json(&["scrub", fs.mnt.to_str().unwrap(), "--json"]);
    assert!(rep["data_repaired"].as_u64().unwrap() >= 1, "{rep}");
    assert_eq!(rep["damaged"].as_array().unwrap().len(), 0, "{rep}");
    assert!(rep["stripes"].as_u64().unwrap() >= 1, "{rep}");
    assert_eq!(rep["parity_repaired"], 0, "{rep}");
    fs.finish();
}

#[test]
fn bad_policies_are_refused_with_a_reason() {
    let fs = Fs::create();
    let pool = fs.pool.to_str().unwrap();
    let e = cairn_err(&["mkfs", pool, "--redundancy", "copies=9"], "give 1 to 4");
    assert!(e.contains("copies=9"), "{e}");
    cairn_err(&["mkfs", pool, "--redundancy", "ec=4"], "expected ec=K+M");
    cairn_err(&["mkfs", pool, "--redundancy", "ec=4+4"], "1 to 3 parity");
    cairn_err(
        &["mkfs", pool, "--redundancy", "s3:copies=2"],
        "keeps one copy",
    );
}

#[test]
fn a_lost_disk_with_the_metadata_on_it_loses_nothing() {
    // Two "disks": a directory each, given as a directory device (the
    // device file is made in it), the first holding the metadata too (its
    // second copy goes beside the other device).
    let mut fs = Fs::create();
    let (a, b) = (fs.dir.join("diska"), fs.dir.join("diskb"));
    for d in [&a, &b] {
        std::fs::create_dir(d).unwrap();
    }
    let spec = |d: &Path| format!("ssd:{}:96M", d.display());
    fs.mkfs(&[
        "--redundancy",
        "copies=2",
        "--device",
        &spec(&a),
        "--device",
        &spec(&b),
    ]);
    let first = std::fs::canonicalize(fs.pool.join("meta.redb")).unwrap();
    assert!(
        first.starts_with(&a),
        "the metadata lives beside the first device: {first:?}"
    );
    assert!(std::fs::symlink_metadata(fs.pool.join("meta.mirror")).is_ok());
    fs.mount();
    write_files(&fs);
    fs.unmount();
    std::fs::remove_dir_all(&a).unwrap();
    fs.mount();
    let log = fs.daemon_output();
    assert!(log.contains("the metadata's first copy"), "{log}");
    assert_files(&fs, "disk a lost");
    let c = fs.dir.join("diskc");
    std::fs::create_dir(&c).unwrap();
    let m = fs.mnt.to_str().unwrap().to_string();
    cairn_ok(&["device", "replace", &m, "0", &spec(&c)]);
    cairn_ok(&["redundancy", "rebuild", &m]);
    let st = redundancy(&fs);
    assert_eq!(
        (st["short_segments"].as_u64(), st["lost_segments"].as_u64()),
        (Some(0), Some(0)),
        "{st}"
    );
    fs.unmount();
    fs.mount();
    assert_files(&fs, "after replace and remount");
    let mirror = std::fs::canonicalize(fs.pool.join("meta.mirror")).unwrap();
    assert!(
        !mirror.starts_with(&a),
        "a new second copy of the metadata: {mirror:?}"
    );
    fs.finish();
}

/// The metadata's copies (the store and each `meta.mirror*` link), as the
/// files they are.
fn meta_copies(fs: &Fs) -> Vec<PathBuf> {
    let mut links: Vec<PathBuf> = std::fs::read_dir(&fs.pool)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n == "meta.redb" || n.starts_with("meta.mirror")
        })
        .collect();
    links.sort();
    links
        .iter()
        .filter_map(|l| std::fs::canonicalize(l).ok())
        .collect()
}

/// A disk of its own per device: device `i` is the directory `disk{i}`.
fn pool_of_disks(n: usize, policy: &str) -> (Fs, Vec<PathBuf>) {
    let mut fs = Fs::create();
    let disks: Vec<PathBuf> = (0..n).map(|i| fs.dir.join(format!("disk{i}"))).collect();
    let mut args = vec!["--redundancy".to_string(), policy.to_string()];
    for d in &disks {
        std::fs::create_dir_all(d).unwrap();
        args.push("--device".into());
        args.push(format!("ssd:{}:64M", d.display()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fs.mkfs(&args);
    fs.mount();
    (fs, disks)
}

/// The disk a file lives on.
fn disk_of(disks: &[PathBuf], file: &Path) -> usize {
    (disks.iter())
        .position(|d| file.starts_with(std::fs::canonicalize(d).unwrap_or(d.clone())))
        .unwrap_or_else(|| panic!("{} is on no disk", file.display()))
}

#[test]
fn an_ec_4_2_pool_keeps_three_metadata_copies_and_survives_losing_two_of_their_disks() {
    let (mut fs, disks) = pool_of_disks(6, "ec=4+2");
    let copies = meta_copies(&fs);
    let on: Vec<usize> = copies.iter().map(|c| disk_of(&disks, c)).collect();
    let mut distinct = on.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        (copies.len(), distinct.len()),
        (3, 3),
        "ec=4+2 survives two lost disks: three metadata copies on three disks: {copies:?}"
    );
    write_files(&fs);
    let m = fs.mnt.to_str().unwrap().to_string();
    cairn_ok(&["sync", &m]);
    cairn_ok(&["redundancy", "rebuild", &m]);
    fs.unmount();
    // The disks of the first two copies die.
    for &i in &on[..2] {
        std::fs::rename(&disks[i], disks[i].with_extension("gone")).unwrap();
    }
    fs.mount();
    let log = fs.daemon_output();
    assert!(
        log.contains("DEGRADED") && !log.contains("READ-ONLY"),
        "{log}"
    );
    assert_files(&fs, "two disks holding metadata copies lost");
    // The copies lost are made anew on the disks left.
    let now = meta_copies(&fs);
    let mut left: Vec<usize> = now.iter().map(|c| disk_of(&disks, c)).collect();
    left.sort();
    left.dedup();
    assert_eq!((now.len(), left.len()), (3, 3), "{now:?}");
    assert!(left.iter().all(|i| !on[..2].contains(i)), "{now:?} {on:?}");
    std::fs::write(fs.p("d/after"), pattern(91, 300_000)).unwrap();
    fs.unmount();
    fs.mount();
    assert_files(&fs, "remounted");
    assert_bytes_eq(
        &std::fs::read(fs.p("d/after")).unwrap(),
        &pattern(91, 300_000),
        "after",
    );
    fs.finish();
}

/// The intent log's copies are areas made with their devices: a raised
/// redundancy that asks for more says so, and how to add one, until a
/// device added with `:log=` holds the copy wanted.
#[test]
fn raising_copies_beyond_the_log_copies_says_how_to_add_one() {
    let (fs, _disks) = pool_of_disks(3, "copies=1");
    let m = fs.mnt.to_str().unwrap().to_string();
    let log_line = || {
        let v: Value =
            serde_json::from_str(&cairn_ok(&["redundancy", "show", &m, "--json"])).unwrap();
        v["intent_log"].as_str().unwrap().to_string()
    };
    let before = log_line();
    assert!(before.starts_with("2 of 2 copies on devices"), "{before}");
    assert!(!before.contains("asks for"), "{before}");
    cairn_ok(&["redundancy", "set", &m, "copies=3"]);
    let short = log_line();
    assert!(
        short.contains("asks for 3") && short.contains(":log="),
        "{short}"
    );
    let extra = fs.dir.join("disk3");
    std::fs::create_dir_all(&extra).unwrap();
    cairn_ok(&[
        "device",
        "add",
        &m,
        &format!("ssd:{}:128M:log=16M", extra.display()),
    ]);
    let after = log_line();
    assert!(after.starts_with("3 of 3 copies on devices"), "{after}");
    assert!(!after.contains("asks for"), "{after}");
    fs.finish();
}

#[test]
fn raising_copies_online_adds_metadata_copies_at_once() {
    let (mut fs, disks) = pool_of_disks(3, "copies=1");
    assert_eq!(meta_copies(&fs).len(), 2, "two copies by default");
    write_files(&fs);
    let m = fs.mnt.to_str().unwrap().to_string();
    cairn_ok(&["redundancy", "set", &m, "copies=3"]);
    let copies = meta_copies(&fs);
    let mut on: Vec<usize> = copies.iter().map(|c| disk_of(&disks, c)).collect();
    on.sort();
    on.dedup();
    assert_eq!((copies.len(), on.len()), (3, 3), "{copies:?}");
    // The new copy holds the store: it alone opens the pool.
    std::fs::write(fs.p("d/later"), pattern(92, 200_000)).unwrap();
    cairn_ok(&["sync", &m]);
    cairn_ok(&["redundancy", "rebuild", &m]);
    fs.unmount();
    let first_two: Vec<usize> = copies[..2].iter().map(|c| disk_of(&disks, c)).collect();
    for &i in &first_two {
        std::fs::rename(&disks[i], disks[i].with_extension("gone")).unwrap();
    }
    fs.mount();
    assert_files(&fs, "the two disks of the first copies lost");
    let got = std::fs::read(fs.p("d/later")).unwrap();
    assert_bytes_eq(&got, &pattern(92, 200_000), "written after the raise");
    fs.finish();
}
