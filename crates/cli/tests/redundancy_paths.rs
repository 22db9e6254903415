//! A directory's own redundancy on real mounts (`cairn redundancy set
//! PATH POLICY`): in a one-copy pool, a directory set to two copies keeps
//! every file in it (those written before, those written after, in
//! subdirectories made after) readable when either device is lost, while
//! the rest of the pool keeps one copy; a directory set to one copy in a
//! two-copy pool takes half the space; bad policies are refused.

mod common;

use common::redundancy::{json, pool_with, slots_used};
use common::*;
use std::path::{Path, PathBuf};

fn device_paths(fs: &Fs) -> Vec<PathBuf> {
    let v = json(&["redundancy", "show", fs.mnt.to_str().unwrap(), "--json"]);
    (v["devices"].as_array().unwrap().iter())
        .map(|d| PathBuf::from(d["path"].as_str().unwrap()))
        .collect()
}

/// The policy `redundancy show PATH` gives (None: the tier's).
fn own_policy(path: &Path) -> Option<String> {
    let v = json(&["redundancy", "show", path.to_str().unwrap(), "--json"]);
    v["policy"].as_str().map(str::to_string)
}

const SAFE: &[(&str, u64, usize)] = &[
    ("safe/before", 11, 6 << 20),
    ("safe/small", 12, 70_000),
    ("safe/sub/after", 13, 5 << 20),
    ("safe/later", 14, 3 << 20),
];

#[test]
fn a_directory_with_two_copies_survives_either_device_in_a_one_copy_pool() {
    let mut fs = pool_with(2, "64M", "copies=1");
    let m = fs.mnt.to_str().unwrap().to_string();
    for d in ["safe", "scratch"] {
        std::fs::create_dir(fs.p(d)).unwrap();
    }
    let write = |fs: &Fs, (name, seed, len): (&str, u64, usize)| {
        std::fs::write(fs.p(name), pattern(seed, len)).unwrap();
    };
    // Written before the directory gets its policy: moved by `set`.
    write(&fs, SAFE[0]);
    write(&fs, SAFE[1]);
    for i in 0..4u64 {
        write(&fs, (&format!("scratch/x{i}"), 20 + i, 4 << 20));
    }
    cairn_ok(&["sync", &m]);
    let safe = fs.p("safe");
    let out = cairn_ok(&["redundancy", "set", safe.to_str().unwrap(), "copies=2"]);
    assert!(out.contains("copies=2"), "{out}");
    let rep = json(&[
        "redundancy",
        "set",
        safe.to_str().unwrap(),
        "copies=2",
        "--json",
    ]);
    assert_eq!(
        rep["chunks_moved"], 0,
        "set again: nothing left to move: {rep}"
    );
    // Made after: inherited.
    std::fs::create_dir(fs.p("safe/sub")).unwrap();
    write(&fs, SAFE[2]);
    write(&fs, SAFE[3]);
    cairn_ok(&["sync", &m]);
    assert_eq!(own_policy(&safe).as_deref(), Some("copies=2"));
    assert_eq!(
        own_policy(&fs.p("safe/sub/after")).as_deref(),
        Some("copies=2")
    );
    assert_eq!(own_policy(&fs.p("scratch/x0")), None);
    assert_eq!(own_policy(&fs.p("scratch")), None);
    cairn_ok(&["redundancy", "rebuild", &m]);
    let st = json(&["redundancy", "show", &m, "--json"]);
    assert_eq!(st["policy"], "copies=1", "the pool's stays: {st}");
    assert_eq!(st["short_segments"], 0, "{st}");
    each_device_lost(&mut fs, SAFE);
    fs.finish();
}

/// With each device lost in turn (mounted --degraded: other files had one
/// copy), every one of `files` reads exact.
fn each_device_lost(fs: &mut Fs, files: &[(&str, u64, usize)]) {
    let devs = device_paths(fs);
    fs.unmount();
    fs.mount_args.push("--degraded".into());
    for dev in &devs {
        let away = dev.with_extension("gone");
        std::fs::rename(dev, &away).unwrap();
        fs.mount();
        for &(name, seed, len) in files {
            let got = std::fs::read(fs.p(name))
                .unwrap_or_else(|e| panic!("{name}, {dev:?} lost: {e}\n{}", fs.daemon_output()));
            assert_bytes_eq(&got, &pattern(seed, len), &format!("{name}, {dev:?} lost"));
        }
        fs.unmount();
        std::fs::rename(&away, dev).unwrap();
    }
    fs.mount_args.clear();
    fs.mount();
}

const STRIPED: &[(&str, u64, usize)] = &[
    ("par/a", 61, 9 << 20),
    ("par/b", 62, 7 << 20),
    ("par/c", 63, 300_000),
];

#[test]
fn a_directory_with_parity_is_striped_and_survives_any_device_in_a_one_copy_pool() {
    let mut fs = pool_with(3, "64M", "copies=1");
    let m = fs.mnt.to_str().unwrap().to_string();
    std::fs::create_dir(fs.p("par")).unwrap();
    std::fs::create_dir(fs.p("plain")).unwrap();
    cairn_ok(&["redundancy", "set", fs.p("par").to_str().unwrap(), "ec=2+1"]);
    for &(name, seed, len) in STRIPED {
        std::fs::write(fs.p(name), pattern(seed, len)).unwrap();
    }
    std::fs::write(fs.p("plain/x"), pattern(70, 6 << 20)).unwrap();
    cairn_ok(&["sync", &m]);
    // Sealed segments are striped; the open one waits with two copies.
    cairn_ok(&["redundancy", "rebuild", &m]);
    let st = json(&["redundancy", "show", &m, "--json"]);
    assert!(st["stripes"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(st["short_segments"], 0, "{st}");
    each_device_lost(&mut fs, STRIPED);
    fs.finish();
}

#[test]
fn a_directory_with_one_copy_in_a_two_copy_pool_takes_half_the_space() {
    let fs = pool_with(2, "96M", "copies=2");
    let m = fs.mnt.to_str().unwrap().to_string();
    for d in ["one", "two"] {
        std::fs::create_dir(fs.p(d)).unwrap();
    }
    let one = fs.p("one");
    cairn_ok(&["redundancy", "set", one.to_str().unwrap(), "copies=1"]);
    let used0 = slots_used(&fs);
    for i in 0..4u64 {
        std::fs::write(fs.p(&format!("one/f{i}")), pattern(40 + i, 4 << 20)).unwrap();
    }
    cairn_ok(&["sync", &m]);
    let used1 = slots_used(&fs);
    for i in 0..4u64 {
        std::fs::write(fs.p(&format!("two/f{i}")), pattern(50 + i, 4 << 20)).unwrap();
    }
    cairn_ok(&["sync", &m]);
    let used2 = slots_used(&fs);
    let (a, b) = (used1 - used0, used2 - used1);
    assert!(
        a > 0 && b as f64 >= 1.6 * a as f64,
        "16 MiB at one copy took {a} bytes, at two {b}"
    );
    // Back to the pool's policy: the data moves into two-copy segments.
    cairn_ok(&["redundancy", "set", one.to_str().unwrap(), "inherit"]);
    cairn_ok(&["redundancy", "rebuild", &m]);
    assert_eq!(own_policy(&fs.p("one/f0")), None);
    let st = json(&["redundancy", "show", &m, "--json"]);
    assert_eq!(st["short_segments"], 0, "{st}");
    for i in 0..4u64 {
        let got = std::fs::read(fs.p(&format!("one/f{i}"))).unwrap();
        assert_bytes_eq(&got, &pattern(40 + i, 4 << 20), "after inherit");
    }
    fs.finish();
}

#[test]
fn bad_path_policies_are_refused_and_change_nothing() {
    let fs = pool_with(2, "64M", "copies=1");
    std::fs::create_dir(fs.p("d")).unwrap();
    let d = fs.p("d");
    let d = d.to_str().unwrap();
    for bad in ["copies=9", "ec=4", "ssd:copies=2", "two"] {
        let out = cairn(&["redundancy", "set", d, bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", describe(&out));
        assert!(!describe(&out).contains("panicked"), "{}", describe(&out));
    }
    assert_eq!(own_policy(&fs.p("d")), None);
    // Set by hand, the attribute must name a layout too.
    let err = set_xattr(&fs.p("d"), "user.cairn.redundancy", b"copies=7").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    set_xattr(&fs.p("d"), "user.cairn.redundancy", b"ec=2+1").unwrap();
    assert_eq!(own_policy(&fs.p("d")).as_deref(), Some("ec=2+1"));
    fs.finish();
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name, a value of its length.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}
