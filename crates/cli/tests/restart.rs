//! `cairn mount --keep-mount` and `cairn restart` (issue 55): a new daemon
//! takes the mount over without unmounting it. Across the restart, a
//! process that keeps reading, writing and fsyncing sees no error; open
//! files (also one unlinked while open, and one in a historical view) read
//! on, a held file handle opens the same file, and what was fsynced is
//! there; an encrypted pool's next daemon gets its key (a key file, or a
//! passphrase typed at `cairn mount`); `cairn service
//! restart` (the unit's reload) does the same. A mount without a keeper
//! refuses the restart and goes on; a
//! daemon killed under a keeper ends the mount (callers get ENOTCONN, not
//! a mount that lost their unsynced writes) and its fsynced data is there
//! at the next mount.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]
#![allow(
    clippy::cast_possible_truncation,
    reason = "the shared harness's test sizes: small by construction"
)]

mod common;

use common::handles::*;
use common::*;
use std::fs;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn keeper_mount() -> Fs {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    fs.mount_args = vec!["--keep-mount".into()];
    fs.mount();
    fs
}

/// The daemon under the keeper (the foreground `cairn mount` child).
fn daemon_under(keeper: u32) -> i32 {
    let kids = fs::read_to_string(format!("/proc/{keeper}/task/{keeper}/children")).unwrap();
    let pids: Vec<i32> = kids
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 1, "the keeper runs one daemon: {pids:?}");
    pids[0]
}

/// Writes, fsyncs, reads back and lists files in `dir` until `stop`;
/// counts what failed, and the files it made.
fn busy_client(
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    errors: Arc<AtomicU64>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let p = dir.join(format!("w{n}"));
            let body = format!("client file {n}\n");
            let ok = (|| -> std::io::Result<bool> {
                let mut f = fs::File::create(&p)?;
                f.write_all(body.as_bytes())?;
                f.sync_all()?;
                Ok(fs::read_to_string(&p)? == body && fs::read_dir(&dir)?.count() as u64 > n)
            })();
            if !matches!(ok, Ok(true)) {
                eprintln!("client: w{n}: {ok:?}");
                errors.fetch_add(1, Ordering::SeqCst);
            }
            n += 1;
        }
        n
    })
}

fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

fn restart(mnt: &Path) -> (String, String) {
    let out = cairn_ok(&["restart", mnt.to_str().unwrap()]);
    // "restarted the daemon of POOL on MNT (pid A -> B)"
    let pids = out
        .rsplit_once("(pid ")
        .unwrap()
        .1
        .trim()
        .trim_end_matches(')');
    let (a, b) = pids.split_once(" -> ").unwrap();
    (a.to_string(), b.to_string())
}

#[test]
fn a_restart_keeps_the_mount_its_open_files_and_handles() {
    let fs = keeper_mount();
    let keeper = fs.daemon_pid();
    fs::create_dir(fs.p("busy")).unwrap();
    fs::write(fs.p("kept"), b"kept before the restart").unwrap();
    fs::write(fs.p("log"), b"line 1\n").unwrap();
    let tid = cairn_ok(&["sync", fs.mnt.to_str().unwrap()]);
    assert!(!tid.is_empty());
    fs::write(fs.p("kept"), b"changed after the sync, not synced").unwrap();

    let mut reader = fs::File::open(fs.p("kept")).unwrap();
    let mut appender = fs::OpenOptions::new()
        .append(true)
        .open(fs.p("log"))
        .unwrap();
    fs::write(fs.p("doomed"), b"unlinked while open").unwrap();
    let mut doomed = fs::File::open(fs.p("doomed")).unwrap();
    fs::remove_file(fs.p("doomed")).unwrap();
    let mut handle = handle_of(&fs.p("kept"));
    cairn_ok(&["snapshot", "create", fs.mnt.to_str().unwrap(), "s1"]);
    let mut old_view = fs::File::open(fs.p(".snapshots/s1/log")).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let client = busy_client(fs.p("busy"), stop.clone(), errors.clone());
    std::thread::sleep(Duration::from_millis(300));
    let first = daemon_under(keeper);
    let info = cairn_ok(&["info", fs.mnt.to_str().unwrap(), "--json"]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["keeper"], keeper, "cairn info names the keeper");
    let (a, b) = restart(&fs.mnt);
    assert_eq!(a, first.to_string());
    assert_ne!(a, b);
    let (_, c) = restart(&fs.mnt);
    assert_ne!(b, c, "a second restart starts another daemon");
    assert_eq!(daemon_under(keeper).to_string(), c);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let made = client.join().unwrap();
    assert_eq!(
        errors.load(Ordering::SeqCst),
        0,
        "the client saw errors across the restarts"
    );
    assert!(made > 10, "the client made {made} files");

    // Every request now goes to the new daemon.
    drop_caches();
    let mut s = String::new();
    reader.read_to_string(&mut s).unwrap();
    assert_eq!(s, "changed after the sync, not synced");
    appender.write_all(b"line 2\n").unwrap();
    appender.sync_all().unwrap();
    assert_eq!(fs::read_to_string(fs.p("log")).unwrap(), "line 1\nline 2\n");
    let mut v = Vec::new();
    doomed.read_to_end(&mut v).unwrap();
    assert_eq!(v, b"unlinked while open");
    let mut by_handle = open_by(&fs.mnt, &mut handle, libc::O_RDONLY).unwrap();
    assert_eq!(
        by_handle.metadata().unwrap().ino(),
        fs::metadata(fs.p("kept")).unwrap().ino()
    );
    let mut s = String::new();
    by_handle.read_to_string(&mut s).unwrap();
    assert_eq!(s, "changed after the sync, not synced");
    let mut s = String::new();
    old_view.rewind().unwrap();
    old_view.read_to_string(&mut s).unwrap();
    assert_eq!(s, "line 1\n", "a view opened before the restart");
    for i in 0..made {
        let got = fs::read_to_string(fs.p(&format!("busy/w{i}"))).unwrap();
        assert_eq!(got, format!("client file {i}\n"));
    }
    drop((reader, appender, doomed, by_handle, old_view));
    fs.finish();
}

#[test]
fn a_mount_without_a_keeper_refuses_a_restart() {
    let fs = Fs::new();
    fs::write(fs.p("f"), b"still here").unwrap();
    let info = cairn_ok(&["info", fs.mnt.to_str().unwrap(), "--json"]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert!(info.get("keeper").is_none(), "no keeper: {info}");
    let err = cairn_err(&["restart", fs.mnt.to_str().unwrap()], "--keep-mount");
    assert!(err.contains("no keeper"), "{err}");
    assert_eq!(fs::read(fs.p("f")).unwrap(), b"still here");
    cairn_err(
        &["restart", fs.dir.to_str().unwrap()],
        "not a mounted Cairn pool",
    );
    fs.finish();
}

#[test]
fn a_daemon_killed_under_its_keeper_ends_the_mount() {
    let mut fs = keeper_mount();
    let mut f = fs::File::create(fs.p("synced")).unwrap();
    f.write_all(b"fsynced before the kill").unwrap();
    f.sync_all().unwrap();
    let daemon = daemon_under(fs.daemon_pid());
    // SAFETY: kill takes plain integers.
    assert_eq!(unsafe { libc::kill(daemon, libc::SIGKILL) }, 0);
    let st = fs.wait_exit(Duration::from_secs(20));
    assert!(!st.success(), "the keeper exits with an error: {st}");
    let out = fs.daemon_output();
    assert!(
        out.contains("killed by signal 9 without handing the mount over"),
        "{out}"
    );
    // Callers are told, not kept waiting or served by a daemon that lost
    // what it had not committed.
    let mut stat = std::process::Command::new("stat");
    stat.arg(fs.p("never-looked-up"));
    let r = run_timeout(&mut stat, Duration::from_secs(20));
    assert!(
        !r.status.success(),
        "stat through the dead mount: {}",
        describe(&r)
    );
    assert!(describe(&r).contains("not connected"), "{}", describe(&r));
    assert!(lazy_unmount(&fs.mnt));
    assert!(wait_unmounted(&fs.mnt, Duration::from_secs(10)));
    fs.mount_args.clear();
    fs.mount();
    assert_eq!(
        fs::read(fs.p("synced")).unwrap(),
        b"fsynced before the kill"
    );
    fs.finish();
}

/// `systemctl reload cairn@NAME` runs `cairn service restart NAME`: the
/// mount of /etc/cairn/NAME.toml (here CAIRN_SERVICE_DIR) gets a new
/// daemon.
#[test]
fn the_service_reload_restarts_a_kept_mount() {
    let fs = keeper_mount();
    fs::write(fs.p("f"), b"served across the reload").unwrap();
    let etc = fs.dir.join("etc");
    fs::create_dir(&etc).unwrap();
    let toml = format!(
        "pool = {:?}\nmountpoint = {:?}\noptions = [\"--keep-mount\"]\n",
        fs.pool, fs.mnt
    );
    fs::write(etc.join("tank.toml"), toml).unwrap();
    let before = daemon_under(fs.daemon_pid());
    let mut cmd = std::process::Command::new(CAIRN);
    cmd.args(["service", "restart", "tank"])
        .env("CAIRN_SERVICE_DIR", &etc);
    let out = run_timeout(&mut cmd, CMD_TIMEOUT);
    assert!(out.status.success(), "{}", describe(&out));
    assert_ne!(daemon_under(fs.daemon_pid()), before);
    drop_caches();
    assert_eq!(fs::read(fs.p("f")).unwrap(), b"served across the reload");
    fs.finish();
}

/// An encrypted pool's next daemon gets the key as the first did (here a
/// key file, passed again by the keeper).
#[test]
fn an_encrypted_pool_restarts_with_its_key() {
    use std::os::unix::fs::PermissionsExt;
    let mut fs = Fs::create();
    let key = fs.dir.join("pool.key");
    fs::write(&key, b"a passphrase for the restart test\n").unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    let k = key.to_str().unwrap();
    fs.mkfs(&["--encrypt", "--key-file", k]);
    fs.mount_args = vec!["--keep-mount".into(), "--key-file".into(), k.into()];
    fs.mount();
    fs::write(fs.p("secret"), b"sealed, and served across the restart").unwrap();
    let (a, b) = restart(&fs.mnt);
    assert_ne!(a, b);
    drop_caches();
    assert_eq!(
        fs::read(fs.p("secret")).unwrap(),
        b"sealed, and served across the restart"
    );
    fs.unmount();
    cairn_ok(&["check", fs.pool.to_str().unwrap(), "--key-file", k]);
}

/// A passphrase typed at `cairn mount` (at a terminal: `script` gives it
/// one) goes to the keeper, which hands it to every daemon it starts.
#[test]
fn a_typed_passphrase_reaches_every_daemon() {
    let fs = Fs::create();
    let pass = "typed for the keeper\n";
    let run_tty = |cmd: String, input: String| {
        let mut c = std::process::Command::new("script");
        c.args(["-qec", &cmd, "/dev/null"])
            .stdin(std::process::Stdio::piped());
        let mut child = c
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{cmd}: {}", describe(&out));
    };
    let (pool, mnt) = (fs.pool.display(), fs.mnt.display());
    let dev = format!("ssd:{}:256M", fs.dev("d0"));
    run_tty(
        format!("{CAIRN} mkfs {pool} --encrypt --device {dev}"),
        pass.repeat(2),
    );
    run_tty(
        format!("{CAIRN} mount {pool} {mnt} --keep-mount"),
        pass.to_string(),
    );
    fs::write(fs.p("f"), b"behind a typed passphrase").unwrap();
    let (a, b) = restart(&fs.mnt);
    assert_ne!(a, b);
    drop_caches();
    assert_eq!(fs::read(fs.p("f")).unwrap(), b"behind a typed passphrase");
    cairn_ok(&["umount", fs.mnt.to_str().unwrap()]);
    assert!(wait_unmounted(&fs.mnt, Duration::from_secs(10)));
}
