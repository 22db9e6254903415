//! Administrator commands against a hostile or careless world (issue 50,
//! items 7, 12-16): SIGTERM on a busy mount, a mount point inside its own
//! pool, commands run by a user who may not use the pool, a lock file
//! removed under a mounted pool, concatenated or padded mirror streams,
//! a volume larger than its pool and a missing device at mount.

mod common;

use common::*;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs a command as user nobody (uid/gid 65534, no groups).
fn as_nobody(prog: &str, args: &[&OsStr]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", prog])
        .args(args);
    run_timeout(&mut cmd, CMD_TIMEOUT)
}

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

// ------------------------------------------------------------ item 7

/// A process with its working directory in the mount, holding a file
/// open there and appending to it every 50 ms until killed.
fn busy_writer(mnt: &Path) -> std::process::Child {
    Command::new("bash")
        .arg("-c")
        .arg("exec 3>>held; while :; do echo line >&3 || true; sleep 0.05; done")
        .current_dir(mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the busy writer")
}

#[test]
fn sigterm_on_a_busy_mount_flushes_unmounts_and_exits() {
    let mut fs = Fs::new();
    let synced = pattern(7, 1 << 20);
    write_synced(&fs.p("synced"), &synced);
    let written = pattern(8, 300_000);
    fs::write(fs.p("written"), &written).unwrap();
    let mut writer = busy_writer(&fs.mnt);
    assert!(
        eventually(Duration::from_secs(10), || fs::metadata(fs.p("held"))
            .is_ok_and(|m| m.len() > 0)),
        "the busy writer never wrote"
    );
    // A second signal while stopping (systemd's SIGINT-after-SIGTERM, an
    // impatient ^C) is logged, not lost.
    fs.signal(libc::SIGTERM);
    fs.signal(libc::SIGINT);
    let st = fs.wait_exit(Duration::from_secs(30));
    let _ = writer.kill();
    let _ = writer.wait();
    assert!(
        st.success(),
        "daemon exited with {st}\n{}",
        fs.diagnostics()
    );
    assert!(
        wait_unmounted(&fs.mnt, Duration::from_secs(5)),
        "{} is still a mount after the daemon exited",
        fs.mnt.display()
    );
    let log = fs.daemon_output();
    assert!(log.contains("SIGTERM received"), "{log}");
    assert!(log.contains("SIGINT received"), "{log}");
    fs.mount();
    assert_bytes_eq(&fs::read(fs.p("synced")).unwrap(), &synced, "synced");
    assert_bytes_eq(&fs::read(fs.p("written")).unwrap(), &written, "written");
    fs.finish();
}

// ------------------------------------------------------------ item 12

#[test]
fn a_mount_point_in_the_pool_is_refused() {
    let fs = Fs::create();
    fs.mkfs(&[]);
    let inner = fs.pool.join("inner");
    fs::create_dir(&inner).unwrap();
    for mnt in [&fs.pool, &inner] {
        let out = cairn(&[os("mount"), fs.pool.as_os_str(), mnt.as_os_str()]);
        let mounted = mount_fstype(mnt).is_some();
        if mounted {
            cairn_umount(mnt);
            lazy_unmount(mnt);
        }
        assert!(!mounted, "mounted on {}\n{}", mnt.display(), describe(&out));
        assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
        let err = stderr(&out);
        assert!(
            err.contains("pool directory") && err.contains("outside the pool"),
            "{err}"
        );
    }
    let info = cairn_ok(&[os("info"), fs.pool.as_os_str()]);
    assert!(info.contains("pool:"), "{info}");
}

// ------------------------------------------------------------ item 13

#[test]
fn another_user_is_told_the_pool_needs_root() {
    let fs = Fs::new();
    chmod(&fs.dir, 0o755);
    fs::write(fs.p("f"), b"some text").unwrap();
    chmod(&fs.p("f"), 0o644);
    cairn_ok(&[os("sync"), fs.mnt.as_os_str()]);
    let f = fs.p("f");
    let cases: [&[&OsStr]; 4] = [
        &[os("info"), fs.mnt.as_os_str()],
        &[os("info"), fs.pool.as_os_str()],
        &[os("history"), f.as_os_str()],
        &[os("sync"), fs.mnt.as_os_str()],
    ];
    for args in cases {
        let o = as_nobody(CAIRN, args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} as nobody: {}", describe(&o));
        assert!(
            err.contains("run it as root") && err.contains("control socket"),
            "{args:?} as nobody: {err}"
        );
        assert!(!err.contains("not a Cairn pool"), "{args:?}: {err}");
        assert!(!err.contains("neither a Cairn pool"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    undo_by_another_user_restores_the_bytes(&fs);
    fs.finish();
}

/// `undo` reads through the mount, not the control socket: a user who may
/// write a file gets its old bytes back, and a warning that its mode (set
/// by its owner only) stays.
fn undo_by_another_user_restores_the_bytes(fs: &Fs) {
    let g = fs.p("g");
    fs::write(&g, b"old version").unwrap();
    chmod(&g, 0o644);
    cairn_ok(&[os("sync"), fs.mnt.as_os_str()]);
    chmod(&g, 0o666);
    fs::write(&g, b"new version, longer").unwrap();
    cairn_ok(&[os("sync"), fs.mnt.as_os_str()]);
    let out = cairn_ok(&[os("history"), g.as_os_str(), os("--json")]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let old = v.as_array().unwrap().iter().find(|e| e["size"] == 11);
    let tid = old.expect("the old version")["tid"].as_u64().unwrap();
    let tid = format!("{tid:#x}");
    let o = as_nobody(CAIRN, &[os("undo"), g.as_os_str(), os("--tid"), os(&tid)]);
    assert!(o.status.success(), "undo as nobody: {}", describe(&o));
    assert!(stderr(&o).contains("mode stays"), "{}", describe(&o));
    assert_eq!(fs::read(&g).unwrap(), b"old version");
}

// ------------------------------------------------------------ item 14

#[test]
fn umount_waits_for_the_daemon_without_its_lock_file() {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    fs.mount_args = ["--commit-interval", "600", "--dirty-limit", "1G"]
        .map(String::from)
        .to_vec();
    fs.mount();
    let data = pattern(14, 96 << 20);
    fs::write(fs.p("big"), &data).unwrap();
    fs::remove_file(fs.pool.join("lock")).unwrap();
    let out = cairn_umount(&fs.mnt);
    assert!(out.status.success(), "{}", describe(&out));
    let left = fs.daemon_pids();
    assert!(
        left.is_empty(),
        "`cairn umount` returned while the daemon (pids {left:?}) still ran\n{}",
        describe(&out)
    );
    let st = fs.wait_exit(Duration::from_secs(5));
    assert!(st.success(), "daemon exited with {st}");
    fs.mount();
    assert_bytes_eq(&fs::read(fs.p("big")).unwrap(), &data, "big");
    fs.finish();
}

// ------------------------------------------------------------ item 15

/// `cairn mirror read SRC --since SINCE -o TO`; the TID it reached.
fn read_stream(src: &Path, since: u64, to: &Path) -> u64 {
    let since = since.to_string();
    let args = [
        os("mirror"),
        os("read"),
        src.as_os_str(),
        os("--since"),
        os(&since),
        os("-o"),
        to.as_os_str(),
    ];
    let out = cairn(&args);
    assert!(out.status.success(), "{}", describe(&out));
    // "stream: TIDs 0x..0x<upto>, ..."
    let err = stderr(&out);
    let upto = err
        .split("..0x")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("no TID range in {err}"));
    u64::from_str_radix(upto, 16).unwrap()
}

fn mirror_tid(target: &Path) -> u64 {
    let out = cairn_ok(&[os("mirror"), os("status"), target.as_os_str(), os("--json")]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["tid"].as_u64().unwrap()
}

#[test]
fn mirror_write_applies_streams_in_sequence_and_refuses_junk_after_them() {
    let src = Fs::new();
    let (a, b) = (src.dir.join("a.stream"), src.dir.join("b.stream"));
    write_synced(&src.p("one"), b"first");
    cairn_ok(&[os("sync"), src.mnt.as_os_str()]);
    let mid = read_stream(&src.mnt, 0, &a);
    write_synced(&src.p("two"), b"second");
    cairn_ok(&[os("sync"), src.mnt.as_os_str()]);
    let end = read_stream(&src.mnt, mid, &b);
    assert!(end > mid, "{mid:#x} {end:#x}");
    fs::write(src.dir.join("junk"), b"this is not a stream\n").unwrap();

    let both = Fs::create();
    both.mkfs(&["--mirror"]);
    let script = format!(
        "cat a.stream b.stream | {CAIRN} mirror write {}",
        both.pool.display()
    );
    let said = sh(&src.dir, &script);
    assert_eq!(mirror_tid(&both.pool), end, "{said}");

    let padded = Fs::create();
    padded.mkfs(&["--mirror"]);
    let before = mirror_tid(&padded.pool);
    let script = format!(
        "cat a.stream junk | {CAIRN} mirror write {}",
        padded.pool.display()
    );
    let out = sh_output(&src.dir, &script);
    assert!(!out.status.success(), "junk accepted: {}", describe(&out));
    let err = stderr(&out);
    assert!(
        err.contains("not a complete mirror stream") && err.contains("nothing was applied"),
        "{err}"
    );
    assert_eq!(mirror_tid(&padded.pool), before, "{err}");
    src.finish();
}

// ------------------------------------------------------------ item 16

#[test]
fn a_volume_larger_than_its_pool_is_said_to_be_thin() {
    let fs = Fs::create();
    let dev = fs.dev("d0");
    fs.mkfs(&["--device", &format!("ssd:{dev}:512M")]);
    let out = cairn(&[
        os("volume"),
        os("create"),
        fs.pool.as_os_str(),
        os("huge"),
        os("100T"),
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning") && err.contains("thin") && err.contains("capacity"),
        "{err}"
    );
    let small = cairn(&[
        os("volume"),
        os("create"),
        fs.pool.as_os_str(),
        os("small"),
        os("64M"),
    ]);
    assert!(small.status.success(), "{}", describe(&small));
    assert!(!stderr(&small).contains("warning"), "{}", stderr(&small));
}

#[test]
fn a_missing_device_is_said_once_at_mount() {
    let fs = Fs::create();
    let dev = fs.dev("d0");
    fs.mkfs(&["--device", &format!("ssd:{dev}:256M")]);
    fs::remove_file(&dev).unwrap();
    let out = cairn(&[os("mount"), fs.pool.as_os_str(), fs.mnt.as_os_str()]);
    assert!(!out.status.success(), "{}", describe(&out));
    let err = stderr(&out);
    let name = "d0";
    assert_eq!(err.matches(name).count(), 1, "said more than once: {err}");
    assert!(err.ends_with('\n'), "no newline at the end: {err:?}");
}
