//! History views (`NAME@@0x<tid>`, `@@0x<tid>/…`, `/.snapshots/NAME/…`)
//! behave as if mounted `nosuid,nodev`: an old version of a set-uid program
//! does not run as its owner, an old device node cannot be opened by a user
//! the live node now refuses, and old file capabilities are not shown (issue
//! 50, item 1). Each check has a control on the live tree first, so the
//! test fails if the mount itself ignored set-id bits or device nodes.

mod common;

use common::*;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

/// Runs `prog args` as user nobody (uid/gid 65534, no groups).
fn as_nobody(prog: &OsStr, args: &[&str]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(prog)
        .args(args);
    run_timeout(&mut cmd, CMD_TIMEOUT)
}

/// The effective uid a copy of `id` at `p` runs with, started by nobody.
fn euid_of_run(p: &Path) -> String {
    let out = as_nobody(p.as_os_str(), &["-u"]);
    assert!(out.status.success(), "{}: {}", p.display(), describe(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether nobody can read a byte of the device node at `p`.
fn nobody_reads(p: &Path) -> bool {
    let out = as_nobody(OsStr::new("head"), &["-c", "1", &p.to_string_lossy()]);
    out.status.success()
}

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

/// A file capability (VFS_CAP_REVISION_2, effective, CAP_NET_BIND_SERVICE
/// permitted) as setfattr takes it.
const CAP_HEX: &str = "0x0100000200040000000000000000000000000000";

fn has_cap_xattr(p: &Path) -> bool {
    let out = Command::new("getfattr")
        .args(["-n", "security.capability", "--only-values"])
        .arg(p)
        .output()
        .unwrap();
    out.status.success()
}

#[test]
fn views_grant_no_setid_devices_or_file_capabilities() {
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root (a second user)");
    let fs_ = Fs::new();
    chmod(&fs_.dir, 0o755);
    let bin = fs_.p("bin");
    fs::create_dir(&bin).unwrap();
    chmod(&bin, 0o755);
    let (myid, dev, capped) = (bin.join("myid"), bin.join("null"), bin.join("capped"));
    fs::copy("/usr/bin/id", &myid).unwrap();
    fs::copy("/usr/bin/id", &capped).unwrap();
    chmod(&myid, 0o4755);
    sh(
        &fs_.dir,
        &format!(
            "mknod {d} c 1 3 && chmod 666 {d} && setfattr -n security.capability -v {CAP_HEX} {c}",
            d = dev.display(),
            c = capped.display()
        ),
    );
    // Controls: the live tree honours all three while they are granted.
    assert_eq!(euid_of_run(&myid), "0", "live set-uid copy of id");
    assert!(nobody_reads(&dev), "live 0666 /dev/null copy");
    assert!(has_cap_xattr(&capped), "live file capability");
    let tid = cairn_ok(&[os("sync"), fs_.mnt.as_os_str()])
        .trim()
        .to_string();
    cairn_ok(&[os("snapshot"), os("create"), fs_.mnt.as_os_str(), os("s1")]);
    chmod(&myid, 0o755);
    chmod(&dev, 0o600);
    sh(
        &fs_.dir,
        &format!("setfattr -x security.capability {}", capped.display()),
    );
    let views = [
        (format!("bin/{{}}@@{tid}"), "file@@T"),
        (format!("@@{tid}/bin/{{}}"), "@@T/…"),
        ("bin/@@TID/{}".replace("TID", &tid), "dir@@T/…"),
        (".snapshots/s1/bin/{}".to_string(), "snapshot"),
    ];
    for (pat, what) in views {
        let at = |name: &str| fs_.mnt.join(pat.replace("{}", name));
        let v = at("myid");
        assert_eq!(fs::metadata(&v).unwrap().mode() & 0o7777, 0o755, "{what}");
        assert_eq!(euid_of_run(&v), "65534", "{what}: set-uid honoured");
        let d = at("null");
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0, "{what}");
        assert_eq!(fs::metadata(&d).unwrap().rdev(), libc::makedev(1, 3));
        assert!(!nobody_reads(&d), "{what}: device node opened by nobody");
        assert!(!has_cap_xattr(&at("capped")), "{what}: file capability");
        let list = xattr_names(&at("capped"));
        assert!(!list.contains("capability"), "{what}: listed: {list}");
    }
    fs_.finish();
}

fn xattr_names(p: &Path) -> String {
    let out = Command::new("getfattr")
        .args(["-m", "-", "--absolute-names"])
        .arg(p)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
