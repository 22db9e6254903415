//! The whole stack a user would build: nbdfuse presents the export as a
//! file, a loop device over it carries a fresh ext4 filesystem that is
//! mounted, filled with a small tree, unmounted and checked clean by
//! `fsck.ext4 -fn`. Needs root, /dev/fuse and loop devices.

mod common;

use cairn_nbd::ServerConfig;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Undoes what was set up, in reverse, even when the test fails.
#[derive(Default)]
struct Cleanup {
    mounted: Option<PathBuf>,
    loopdev: Option<String>,
    fuse: Option<(PathBuf, Child)>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            let _ = run("umount", &[m.to_str().unwrap()]);
        }
        if let Some(l) = self.loopdev.take() {
            let _ = run("losetup", &["-d", &l]);
        }
        if let Some((m, mut child)) = self.fuse.take() {
            let _ = run("fusermount3", &["-u", m.to_str().unwrap()]);
            let _ = child.wait();
        }
    }
}

fn wait_for(path: &Path) {
    let until = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(Instant::now() < until, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ext4_on_a_loop_device_over_nbdfuse_checks_clean() {
    assert!(Path::new("/dev/fuse").exists(), "this test needs /dev/fuse");
    let (disk, ex) = disk_exports();
    let s = start_tcp(ex, ServerConfig::default());
    let dir = tempfile::tempdir().unwrap();
    let (fmnt, emnt) = (dir.path().join("fuse"), dir.path().join("ext4"));
    std::fs::create_dir(&fmnt).unwrap();
    std::fs::create_dir(&emnt).unwrap();
    let pidfile = dir.path().join("nbdfuse.pid");
    let mut c = Cleanup::default();
    let child = Command::new("nbdfuse")
        .args([
            "-P",
            pidfile.to_str().unwrap(),
            fmnt.to_str().unwrap(),
            &uri(&s, "disk"),
        ])
        .spawn()
        .expect("nbdfuse (package libnbd-bin) must be installed");
    c.fuse = Some((fmnt.clone(), child));
    wait_for(&pidfile);
    let file = fmnt.join("nbd");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), SIZE);
    let dev = run_ok("losetup", &["--find", "--show", file.to_str().unwrap()]);
    let dev = dev.trim().to_owned();
    c.loopdev = Some(dev.clone());
    run_ok("mkfs.ext4", &["-q", "-F", &dev]);
    run_ok("mount", &[&dev, emnt.to_str().unwrap()]);
    c.mounted = Some(emnt.clone());
    for d in 0..5 {
        let sub = emnt.join(format!("dir{d}"));
        std::fs::create_dir(&sub).unwrap();
        for f in 0..10 {
            let body = format!("file {f} of dir {d}\n").repeat(100 * (f + 1));
            std::fs::write(sub.join(format!("f{f}")), body).unwrap();
        }
    }
    run_ok("sync", &[]);
    let m = c.mounted.take().unwrap();
    run_ok("umount", &[m.to_str().unwrap()]);
    let fsck = run("fsck.ext4", &["-fn", &dev]);
    assert!(
        fsck.status.success(),
        "fsck: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    drop(c);
    assert!(disk.allocated_pages() > 0);
    let st = s.stats();
    assert!(
        st.command("write").count > 0 && st.command("flush").count > 0,
        "{st:?}"
    );
    let errors: u64 = st.commands.values().map(|c| c.errors).sum();
    assert_eq!(errors, 0, "{st:?}");
}
