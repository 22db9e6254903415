//! Tuning of the mount's backing-device info (`/sys/class/bdi/MAJ:MIN`).
//! The kernel gives a FUSE mount 128 KiB of read-ahead whatever the
//! daemon asks for in INIT (it keeps the smaller of the two), so a cold
//! sequential read arrives as 128 KiB requests. Raising it after the mount
//! lets reads arrive as 1 MiB requests with more of them in flight. Best
//! effort: it needs root, and a failure only costs speed.

use std::path::Path;

/// Read-ahead of a Cairn mount, KiB.
pub const READAHEAD_KIB: u32 = 4096;

/// Sets the read-ahead of the FUSE mount on `mountpoint`.
pub fn tune(mountpoint: &Path) {
    let Some(dev) = mount_dev(mountpoint) else {
        tracing::debug!("no mountinfo line for {}", mountpoint.display());
        return;
    };
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    if let Err(e) = std::fs::write(&path, READAHEAD_KIB.to_string()) {
        tracing::info!("cannot raise the read-ahead ({path}): {e}");
    }
}

/// The "MAJ:MIN" of the newest mount on `mountpoint`, read from
/// /proc/self/mountinfo (a stat of the mount point would be a request to
/// a session that may not be serving yet).
fn mount_dev(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = escape(&mountpoint.to_string_lossy());
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 4 && f[4] == want).then(|| f[2].to_string())
        })
        .next_back()
}

/// A path as mountinfo shows it (octal escapes for space, tab, newline
/// and backslash).
fn escape(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for c in p.chars() {
        match c {
            ' ' => out.push_str("\\040"),
            '\t' => out.push_str("\\011"),
            '\n' => out.push_str("\\012"),
            '\\' => out.push_str("\\134"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_mountinfo() {
        assert_eq!(escape("/a b\\c\td"), "/a\\040b\\134c\\011d");
    }

    #[test]
    fn finds_the_root_mount() {
        // Every process sees some mount on "/".
        let dev = mount_dev(Path::new("/")).expect("a mount on /");
        let (maj, min) = dev.split_once(':').expect("MAJ:MIN");
        assert!(
            maj.parse::<u32>().is_ok() && min.parse::<u32>().is_ok(),
            "{dev}"
        );
    }
}
