//! History that follows a path (issue 54), through a real mount and the
//! `cairn` CLI: saves by rename over the name (`sed -i`, `vim` with
//! `backupcopy=no`, a rename loop), delete and create again, directories
//! renamed above the file, the `--inode` view, `undo --tid` of a version
//! of another inode, and history seen through a snapshot or an `@@0x<tid>`
//! view and after prune. Every version listed must read, through
//! `PATH@@0x<tid>`, the bytes it had. Every test ends with `cairn check`.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]
#![allow(
    clippy::cast_possible_truncation,
    reason = "the shared test helpers (common/) cast test sizes and seeds"
)]

mod common;

use common::hist::*;
use common::json::Json;
use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// One listed version: (tid, ended_tid, ino, inode_changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct V {
    tid: u64,
    ended: Option<u64>,
    ino: u64,
    changed: bool,
}

/// `cairn history ARGS --json`, checked for shape and order: TIDs grow,
/// each version ends after it starts and no later than the next starts,
/// only the last may be current, and `inode_changed` says whether the
/// inode differs from the previous version's.
#[track_caller]
fn history_of(p: &Path, extra: &[&str]) -> Vec<V> {
    let mut args = vec![os("history"), p.as_os_str(), os("--json")];
    args.extend(extra.iter().map(|a| os(a)));
    let j = cairn_json(&args);
    let list = j
        .as_array()
        .unwrap_or_else(|| panic!("history is not an array: {j:?}"));
    let mut out: Vec<V> = Vec::new();
    for (i, e) in list.iter().enumerate() {
        field_u64(e, "time_ns");
        field_u64(e, "size");
        let ended = match field(e, "ended_tid") {
            Json::Null => None,
            _ => Some(field_u64(e, "ended_tid")),
        };
        let v = V {
            tid: field_u64(e, "tid"),
            ended,
            ino: field_u64(e, "ino"),
            changed: field_bool(e, "inode_changed"),
        };
        assert!(
            v.ended.is_none_or(|end| end > v.tid),
            "version {i} ends before it starts: {list:?}"
        );
        if let Some(prev) = out.last() {
            let end = prev
                .ended
                .unwrap_or_else(|| panic!("version {} is current but not last: {list:?}", i - 1));
            assert!(
                end <= v.tid,
                "version {i} starts before the last ends: {list:?}"
            );
            assert_eq!(
                v.changed,
                v.ino != prev.ino,
                "inode_changed of version {i}: {list:?}"
            );
        } else {
            assert!(!v.changed, "the first version has inode_changed: {list:?}");
        }
        out.push(v);
    }
    assert!(!out.is_empty(), "empty history for {}", p.display());
    out
}

fn history(p: &Path) -> Vec<V> {
    history_of(p, &[])
}

fn ino_of(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

/// Each version of `p` reads, through `p@@0x<tid>`, the bytes in `want`
/// (oldest first), and was of the inode in `inos`.
#[track_caller]
fn assert_versions(p: &Path, h: &[V], want: &[&[u8]], inos: &[u64]) {
    assert_eq!(h.len(), want.len(), "versions of {}: {h:?}", p.display());
    for (i, v) in h.iter().enumerate() {
        let what = format!("version {i} of {} ({v:?})", p.display());
        assert_file(&at_tid(p, v.tid), want[i], &what);
        assert_eq!(v.ino, inos[i], "{what}: inode");
    }
}

/// `sed -i`, then `vim` with backupcopy=no, then a rename-over loop, each
/// save committed: every save is a version of the path, of a new inode;
/// `--inode` lists only the current inode's; `undo --tid` brings back the
/// first version's bytes as a new version of the current inode.
#[test]
fn saves_by_rename_are_versions_of_the_path() {
    let fs = Fs::new();
    let m = fs.mnt.clone();
    let f = m.join("f");
    let mut want: Vec<Vec<u8>> = Vec::new();
    let mut inos = Vec::new();
    let mut step = |script: &str, bytes: &[u8]| {
        sh(&m, script);
        sync_tid(&m);
        assert_file(&f, bytes, script);
        want.push(bytes.to_vec());
        inos.push(ino_of(&f));
    };
    step("printf 'a\\n' > f", b"a\n");
    step("sed -i s/a/b/ f", b"b\n");
    step("sed -i s/b/c/ f", b"c\n");
    // backupskip's default holds /tmp/*, where the test's mount is: with
    // it, vim writes in place (no backup, no rename).
    step(
        "vim -n -i NONE -u NONE -E -s -c 'set backupcopy=no backupskip=' -c '%s/c/d/' -c wq f",
        b"d\n",
    );
    step("printf 'e\\n' >> f", b"d\ne\n");
    for i in 0..12 {
        let s = format!("printf 'loop {i}\\n' > f.tmp && mv f.tmp f");
        step(&s, format!("loop {i}\n").as_bytes());
    }
    for w in inos.windows(2).take(3) {
        assert_ne!(w[0], w[1], "a save by rename kept the inode: {inos:?}");
    }
    assert_eq!(inos[4], inos[3], "an append made a new inode: {inos:?}");
    let h = history(&f);
    let refs: Vec<&[u8]> = want.iter().map(Vec::as_slice).collect();
    assert_versions(&f, &h, &refs, &inos);
    assert!(h.last().unwrap().ended.is_none(), "not current: {h:?}");
    for (i, v) in h.iter().enumerate().skip(1) {
        assert_eq!(v.changed, i != 4, "inode_changed of version {i}: {h:?}");
        // vim renames the file away, then writes a new one: a commit
        // could fall between. Every other save leaves no gap.
        if i != 3 {
            assert_eq!(h[i - 1].ended, Some(v.tid), "gap before version {i}: {h:?}");
        }
    }

    // The inode's own history: the last save's inode only.
    let hi = history_of(&f, &["--inode"]);
    assert_eq!(hi.len(), 1, "--inode: {hi:?}");
    assert_eq!(hi[0].ino, *inos.last().unwrap(), "--inode: {hi:?}");
    assert_eq!(hi[0].tid, h.last().unwrap().tid, "--inode: {hi:?} vs {h:?}");

    // The table marks where the inode changed.
    let table = cairn_ok(&[os("history"), f.as_os_str()]);
    assert_eq!(table.lines().count(), 1 + h.len(), "{table}");
    assert_eq!(table.matches("(new inode").count(), 15, "{table}");
    assert!(table.contains("(new inode, current)"), "{table}");

    // undo of a version of another inode.
    cairn_ok(&[
        os("undo"),
        f.as_os_str(),
        os("--tid"),
        os(&format!("{:#x}", h[0].tid)),
    ]);
    assert_file(&f, b"a\n", "f after undo to version 0");
    let h2 = history(&f);
    assert!(h2.len() > h.len(), "undo adds a version: {h2:?}");
    assert_eq!(&h2[..h.len() - 1], &h[..h.len() - 1], "{h2:?}");
    let last = h2.last().unwrap();
    assert!(!last.changed && last.ino == *inos.last().unwrap(), "{h2:?}");
    assert_file(&at_tid(&f, last.tid), b"a\n", "the undone version");
    fs.finish();
}

/// A path deleted and created again has a gap between its versions; a
/// deleted path keeps its history and `undo` brings it back; renaming the
/// directories above it keeps its history (their inodes stay).
#[test]
fn delete_recreate_and_renamed_directories() {
    let fs = Fs::new();
    let m = fs.mnt.clone();
    fs::create_dir_all(m.join("a/d")).unwrap();
    let f = m.join("a/d/f");
    fs::write(&f, b"one").unwrap();
    let i1 = ino_of(&f);
    sync_tid(&m);
    fs::remove_file(&f).unwrap();
    let gone = sync_tid(&m);
    fs::write(&f, b"two").unwrap();
    let i2 = ino_of(&f);
    sync_tid(&m);
    let h = history(&f);
    assert_versions(&f, &h, &[b"one", b"two"], &[i1, i2]);
    assert_eq!(
        h[0].ended,
        Some(gone),
        "deleted at the sync after rm: {h:?}"
    );
    assert!(h[1].tid > gone && h[1].changed, "{h:?}");
    let table = cairn_ok(&[os("history"), f.as_os_str()]);
    assert!(
        table.contains("no version until the next"),
        "the gap is shown: {table}"
    );

    // Deleted: the history stays, and undo brings the path back.
    fs::remove_file(&f).unwrap();
    let gone2 = sync_tid(&m);
    let hd = history(&f);
    assert_eq!(&hd[..1], &h[..1], "{hd:?} vs {h:?}");
    assert_eq!(hd[1].ended, Some(gone2), "{hd:?}");
    cairn_ok(&[
        os("undo"),
        f.as_os_str(),
        os("--tid"),
        os(&hd[1].tid.to_string()),
    ]);
    assert_file(&f, b"two", "a/d/f after undo of the deleted path");
    let i3 = ino_of(&f);
    sync_tid(&m);

    // Rename both directories above it: same history under the new path.
    fs::rename(m.join("a/d"), m.join("a/e")).unwrap();
    fs::rename(m.join("a"), m.join("b")).unwrap();
    sync_tid(&m);
    let moved = m.join("b/e/f");
    let hm = history(&moved);
    assert_versions(&moved, &hm, &[b"one", b"two", b"two"], &[i1, i2, i3]);
    assert_eq!(&hm[..2], &hd[..], "{hm:?} vs {hd:?}");
    // undo through the new path reads the version made under the old one.
    let out = fs.dir.join("first");
    let first = hm[0].tid.to_string();
    cairn_ok(&[
        os("undo"),
        moved.as_os_str(),
        os("--tid"),
        os(&first),
        os("-o"),
        out.as_os_str(),
    ]);
    assert_file(&out, b"one", "undo -o of b/e/f's first version");
    // The old path's directories are gone with it.
    let (_, err) = cairn_fails(&[os("history"), m.join("a/d/f").as_os_str()]);
    assert!(err.contains("a/d"), "{err}");
    // The mount root has no entry: its history is its inode's.
    let root = history(&m);
    assert!(root.iter().all(|v| v.ino == 1 && !v.changed), "{root:?}");
    fs.finish();
}

/// History seen through a snapshot and an `@@0x<tid>` view is the history
/// as it was then; prune keeps the versions a snapshot sees, so they stay
/// listed (and readable through the snapshot), and drops the others.
#[test]
fn snapshots_views_and_prune() {
    let mut fs = Fs::new();
    let m = fs.mnt.clone();
    let f = m.join("f");
    let save = |bytes: &[u8]| {
        fs::write(m.join("f.tmp"), bytes).unwrap();
        fs::rename(m.join("f.tmp"), &f).unwrap();
        sync_tid(&m)
    };
    save(b"v1");
    let t2 = save(b"v2");
    let snap = field_u64(&snapshot_create(&m, "s"), "tid");
    save(b"v3");
    save(b"v4");
    let h = history(&f);
    assert_eq!(h.len(), 4, "{h:?}");

    // Through the snapshot: v1 and v2, v2 current then.
    let hs = history(&snap_root(&m, "s").join("f"));
    assert_eq!(hs.len(), 2, "history in .snapshots/s: {hs:?}");
    assert_eq!(hs[0], h[0], "{hs:?} vs {h:?}");
    assert_eq!((hs[1].tid, hs[1].ended), (h[1].tid, None), "{hs:?}");
    // Through `f@@0x<t2>` and `@@0x<t2>/f`: the same two.
    assert_eq!(history(&at_tid(&f, t2)), hs, "f@@t2");
    assert_eq!(history(&root_at(&m, t2).join("f")), hs, "@@t2/f");

    // Prune all history no snapshot sees: v2 (seen by "s") and v4 stay.
    cairn_ok(&[os("prune"), m.as_os_str(), os("--keep-history"), os("0")]);
    fs.remount();
    let hp = history(&f);
    let kept: Vec<u64> = hp.iter().map(|v| v.ino).collect();
    assert_eq!(
        kept,
        vec![h[1].ino, h[3].ino],
        "after prune: {hp:?} of {h:?}"
    );
    assert!(hp[0].tid <= snap && hp[0].ended.unwrap() > snap, "{hp:?}");
    assert!(hp[1].changed, "{hp:?}");
    assert_file(&snap_root(&m, "s").join("f"), b"v2", "f in the snapshot");
    assert_file(&f, b"v4", "f after prune");
    assert_eq!(
        history(&snap_root(&m, "s").join("f")).len(),
        1,
        "in s after prune"
    );
    fs.finish();
}

/// `history` of a name never used fails, naming the path; `--inode` goes
/// with neither `--off` nor `--on`.
#[test]
fn bad_input() {
    let fs = Fs::new();
    let m = fs.mnt.clone();
    let missing = m.join("never");
    let (_, err) = cairn_fails(&[os("history"), missing.as_os_str()]);
    assert!(err.contains("never"), "{err}");
    let x = m.join("x");
    fs::write(&x, b"x").unwrap();
    let (code, _) = cairn_fails(&[os("history"), x.as_os_str(), os("--inode"), os("--off")]);
    assert_eq!(code, 2, "a usage error");
    fs.finish();
}
