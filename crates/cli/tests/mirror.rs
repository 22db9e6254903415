//! Mirror streams through real mounts and the `cairn mirror` commands: a
//! mounted source with files of every kind (hard links, symlinks, xattrs,
//! sparse files, a renamed directory) and snapshots; `cairn mirror copy`
//! into a fresh mirror (`mkfs --mirror`), which mounts read-only (EROFS)
//! and shows the same tree, the same snapshots (same hashes) and the same
//! `@@0x<tid>` views; more changes, and an incremental stream through a
//! pipe (`mirror read | mirror write`); a stream applied twice or into
//! the wrong pool is refused; `promote` makes the mirror writable, and a
//! later copy from the old source is refused.

mod common;

use common::hist::*;
use common::*;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// `cairn mirror status TARGET --json`.
fn status(target: &OsStr) -> common::json::Json {
    cairn_json(&[os("mirror"), os("status"), target, os("--json")])
}

fn mirror_tid(target: &OsStr) -> u64 {
    field_u64(&status(target), "tid")
}

/// A mounted source and an unmounted fresh mirror pool.
fn source_and_mirror() -> (Fs, Fs) {
    let dst = Fs::create();
    dst.mkfs(&["--mirror"]);
    (Fs::new(), dst)
}

/// `cairn mirror read SRC --since SINCE -o TO`, which must succeed.
fn read_into(src: &Path, since: u64, to: &Path) {
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
    assert_private(to);
}

/// The source gives up its hold for mirror `dst` and prunes all the
/// history no snapshot sees: the mirror is left behind its horizon.
fn give_up_and_prune(src: &Fs, dst: &Fs) {
    let st = status(dst.pool.as_os_str());
    let uuid = field_str(&st, "uuid").to_string();
    cairn_ok(&[os("mirror"), os("release"), src.mnt.as_os_str(), os(&uuid)]);
    let prune = [
        os("prune"),
        src.mnt.as_os_str(),
        os("--keep-history"),
        os("0s"),
    ];
    cairn_ok(&prune);
}

/// Files the mirror commands write are the owner's alone.
fn assert_private(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{} has mode {mode:o}", p.display());
}

fn mirror_copy(src: &Path, dst: &Path) -> std::process::Output {
    cairn(&[os("mirror"), os("copy"), src.as_os_str(), dst.as_os_str()])
}

fn second_changes(s: &Fs) {
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(s.p("docs/a.txt"))
        .unwrap();
    f.write_all(b"appended\n").unwrap();
    fs::write(s.p("docs/deep/big"), pattern(2, 1 << 20)).unwrap();
    fs::rename(s.p("docs/deep"), s.p("moved")).unwrap();
    fs::remove_file(s.p("sym")).unwrap();
    // Content the mirror already holds: no new chunk needed.
    fs::write(s.p("again"), pattern(1, 3 << 20)).unwrap();
}

fn xattr(p: &Path) -> String {
    sh(
        p.parent().unwrap(),
        &format!("getfattr --only-values -n user.color {}", p.display()),
    )
}

#[test]
fn copy_and_pipe_streams_make_an_exact_read_only_mirror_that_can_be_promoted() {
    let (mut src, mut dst) = source_and_mirror();
    mirror_first_tree(&src);
    sync_tid(&src.mnt);
    snapshot_create(&src.mnt, "one");
    snapshot_create(&src.mnt, "short-lived");
    let out = mirror_copy(&src.mnt, &dst.pool);
    assert!(out.status.success(), "{}", describe(&out));
    let tid1 = sync_tid(&src.mnt);
    // The source holds history for its mirror, and lists it.
    let st = status(src.mnt.as_os_str());
    let mirrors = field_arr(&st, "mirrors");
    let dst_st = status(dst.pool.as_os_str());
    assert_eq!(mirrors.len(), 1, "{st:?}");
    assert_eq!(field_str(&mirrors[0], "mirror"), field_str(&dst_st, "uuid"));
    assert_eq!(field_u64(&mirrors[0], "tid"), field_u64(&dst_st, "tid"));
    dst.mount();
    let want = capture(&src.mnt).unwrap();
    assert_tree_at(&dst.mnt, &want, "after the full copy");
    assert_eq!(xattr(&dst.p("docs/a.txt")), "blue");
    assert_eq!(snapshot_list(&dst.mnt).len(), 2, "one and short-lived");
    let e = fs::write(dst.p("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_tree_at(
        &root_at(&dst.mnt, tid1),
        &capture(&root_at(&src.mnt, tid1)).unwrap(),
        "@@ view",
    );
    let (a, b) = (
        snapshot_verify(&src.mnt, "one").1,
        snapshot_verify(&dst.mnt, "one").1,
    );
    assert_eq!(
        field_str(&a, "computed"),
        field_str(&b, "computed"),
        "snapshot hash"
    );
    dst.unmount();
    // Incremental, through a pipe.
    second_changes(&src);
    snapshot_create(&src.mnt, "two");
    cairn_ok(&[
        os("snapshot"),
        os("delete"),
        src.mnt.as_os_str(),
        os("short-lived"),
    ]);
    let at = mirror_tid(dst.pool.as_os_str());
    let cairn_bin = env!("CARGO_BIN_EXE_cairn");
    let pipe = format!(
        "{cairn_bin} mirror read {} --since {at} | {cairn_bin} mirror write {}",
        src.mnt.display(),
        dst.pool.display()
    );
    sh(&dst.dir, &pipe);
    // The same stream again: refused, it does not start at the mirror's TID.
    let again = dst.dir.join("again.stream");
    let out = cairn(&[
        os("mirror"),
        os("read"),
        src.mnt.as_os_str(),
        os("--since"),
        os(&at.to_string()),
        os("-o"),
        again.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let (code, err) = cairn_fails(&[
        os("mirror"),
        os("write"),
        dst.pool.as_os_str(),
        os("-i"),
        again.as_os_str(),
    ]);
    assert!(code != 0 && err.contains("mirror is at TID"), "{err}");
    dst.mount();
    assert_tree_at(
        &dst.mnt,
        &capture(&src.mnt).unwrap(),
        "after the incremental stream",
    );
    let names = |t: &Path| -> Vec<String> {
        snapshot_list(t)
            .iter()
            .map(|j| field_str(j, "name").to_string())
            .collect()
    };
    assert_eq!(names(&dst.mnt), ["one", "two"], "snapshots on the mirror");
    for name in ["one", "two"] {
        assert_same_snapshot_hash(&src.mnt, &dst.mnt, name);
    }
    dst.unmount();
    // Another pool's stream: refused.
    let other = Fs::new();
    let (code, err) = cairn_fails(&[
        os("mirror"),
        os("copy"),
        other.mnt.as_os_str(),
        dst.pool.as_os_str(),
    ]);
    assert!(code != 0 && err.contains("comes from pool"), "{err}");
    other.finish();
    // Failover: the mirror becomes a pool of its own.
    cairn_ok(&[os("mirror"), os("promote"), dst.pool.as_os_str()]);
    dst.mount();
    fs::write(dst.p("after-promotion"), b"writable").unwrap();
    dst.unmount();
    let out = mirror_copy(&src.mnt, &dst.pool);
    assert!(!out.status.success(), "a copy into a promoted mirror");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("promoted"),
        "{}",
        describe(&out)
    );
    src.unmount();
    src.check();
    dst.check();
}

/// `cairn mirror stream` keeps a mounted mirror following a mounted
/// source: each commit shows on the mirror's mount within seconds, and a
/// mirror remounted meanwhile (the stream's copies fail for a moment)
/// catches up after.
#[test]
fn a_stream_keeps_a_mounted_mirror_following_its_source() {
    let (src, mut dst) = source_and_mirror();
    dst.mount();
    let (mut child, _out, err) = spawn_cairn(&[
        os("mirror"),
        os("stream"),
        src.mnt.as_os_str(),
        dst.mnt.as_os_str(),
        os("--interval"),
        os("0.2"),
    ]);
    for round in 0..4u64 {
        let name = format!("f{round}");
        let data = pattern(round + 7, 100_000 * round as usize + 10);
        fs::write(src.p(&name), &data).unwrap();
        if round == 2 {
            fs::remove_file(src.p("f0")).unwrap();
        }
        sync_tid(&src.mnt);
        let seen = eventually(std::time::Duration::from_secs(5), || {
            fs::read(dst.p(&name)).is_ok_and(|d| d == data)
        });
        assert!(
            seen,
            "round {round}: not on the mirror\n{}",
            dst.diagnostics()
        );
        if round == 1 {
            dst.remount();
        }
    }
    assert!(eventually(std::time::Duration::from_secs(5), || !dst
        .p("f0")
        .exists()));
    // A file the mirror's kernel has cached, overwritten on the source.
    let _cached = fs::read(dst.p("f1")).unwrap();
    let new = pattern(99, 100_010);
    fs::write(src.p("f1"), &new).unwrap();
    sync_tid(&src.mnt);
    let seen = eventually(std::time::Duration::from_secs(5), || {
        fs::read(dst.p("f1")).is_ok_and(|d| d == new)
    });
    assert!(seen, "an overwrite did not show on the mirror");
    assert_tree_at(&dst.mnt, &capture(&src.mnt).unwrap(), "followed");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    let said = read_back(err);
    assert!(st.success(), "stream exited {st}: {said}");
    // A line per copy, with the mirror's lag behind the source's commit.
    let lags: Vec<f64> = said
        .lines()
        .filter_map(|l| l.split("lag ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(lags.len() >= 4, "{said}");
    assert!(lags.iter().all(|l| *l < 10.0), "{said}");
    // Under light load a commit reaches the mirror within a second (the
    // copy after the mirror's remount may take longer: the median).
    let mut sorted = lags.clone();
    sorted.sort_by(f64::total_cmp);
    assert!(sorted[sorted.len() / 2] < 1.0, "median lag: {said}");
    dst.finish();
    src.finish();
}

/// `mirror copy SRC ssh:host:POOL` runs `cairn mirror write` on the other
/// side over ssh (here a stand-in that parses its arguments as OpenSSH
/// does: options, `--`, the host, then the command; it runs the command
/// locally and notes the host).
#[test]
fn copy_over_ssh_runs_mirror_write_on_the_far_side() {
    let (src, mut dst) = source_and_mirror();
    fs::write(src.p("a"), pattern(3, 500_000)).unwrap();
    sync_tid(&src.mnt);
    let fake = dst.dir.join("fake-ssh");
    let hosts = dst.dir.join("hosts");
    let script = format!(
        "#!/bin/sh\n[ \"$1\" = -- ] && shift\necho \"$1\" >> {}\nshift\nexec sh -c \"$*\"\n",
        hosts.display()
    );
    fs::write(&fake, script).unwrap();
    sh(&dst.dir, &format!("chmod 755 {}", fake.display()));
    let target = format!("ssh:backup@box:{}", dst.pool.display());
    let copy_with = |extra: &[&str]| {
        let out = std::process::Command::new(CAIRN)
            .args([os("mirror"), os("copy"), src.mnt.as_os_str(), os(&target)])
            .args(extra)
            .env("CAIRN_SSH", &fake)
            .env("CAIRN_REMOTE", CAIRN)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", describe(&out));
    };
    let copy = || copy_with(&[]);
    copy();
    fs::write(src.p("b"), b"second day").unwrap();
    snapshot_create(&src.mnt, "day two");
    copy();
    // Left behind the source's prune horizon, the far mirror is rolled
    // back to the snapshot both hold (over ssh too) and copied from there.
    fs::write(src.p("c"), pattern(4, 100_000)).unwrap();
    sync_tid(&src.mnt);
    copy();
    fs::write(src.p("c"), b"rewritten").unwrap();
    sync_tid(&src.mnt);
    give_up_and_prune(&src, &dst);
    copy_with(&["--resync"]);
    assert!(fs::read_to_string(&hosts)
        .unwrap()
        .lines()
        .all(|h| h == "backup@box"));
    let st = status(src.mnt.as_os_str());
    assert_eq!(field_str(&field_arr(&st, "mirrors")[0], "at"), target);
    dst.mount();
    assert_tree_at(&dst.mnt, &capture(&src.mnt).unwrap(), "over ssh");
    dst.finish();
    src.finish();
}

/// The backup box: ten "days" of changes to a source, each ending with a
/// snapshot and a mirror copy; at the end every snapshot has the same
/// hash on both sides, and every day's snapshot reads the same.
#[test]
fn ten_days_of_backups_keep_every_snapshot_equal() {
    let (src, mut dst) = source_and_mirror();
    fs::create_dir(src.p("home")).unwrap();
    for day in 0..10u64 {
        for i in 0..5 {
            let name = format!("home/d{day}-f{i}");
            fs::write(
                src.p(&name),
                pattern(day * 10 + i, 20_000 * (i as usize + 1)),
            )
            .unwrap();
        }
        if day > 0 {
            let prev = format!("home/d{}-f0", day - 1);
            let mut f = fs::OpenOptions::new()
                .append(true)
                .open(src.p(&prev))
                .unwrap();
            f.write_all(&pattern(day, 3000)).unwrap();
            fs::rename(
                src.p(&format!("home/d{}-f1", day - 1)),
                src.p(&format!("home/renamed-{day}")),
            )
            .unwrap();
            fs::remove_file(src.p(&format!("home/d{}-f2", day - 1))).unwrap();
        }
        snapshot_create(&src.mnt, &format!("day-{day}"));
        let out = mirror_copy(&src.mnt, &dst.pool);
        assert!(out.status.success(), "day {day}: {}", describe(&out));
        let s = status(src.mnt.as_os_str());
        let d = status(dst.pool.as_os_str());
        assert_eq!(field_u64(&s, "tid"), field_u64(&d, "tid"), "day {day}");
    }
    dst.mount();
    for day in 0..10 {
        let name = format!("day-{day}");
        let (a, b) = (
            snapshot_verify(&src.mnt, &name).1,
            snapshot_verify(&dst.mnt, &name).1,
        );
        assert_eq!(
            field_str(&a, "computed"),
            field_str(&b, "computed"),
            "{name}"
        );
        let want = capture(&snap_root(&src.mnt, &name)).unwrap();
        assert_tree_at(&snap_root(&dst.mnt, &name), &want, &name);
    }
    dst.finish();
    src.finish();
}

/// The frames of a stream, as byte ranges (13-byte head, body, crc).
fn frames(b: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 13 <= b.len() {
        let len = u32::from_le_bytes(b[at + 9..at + 13].try_into().unwrap()) as usize;
        out.push(at..at + 13 + len + 4);
        at += 13 + len + 4;
    }
    out
}

/// Every kind of bad stream given to `cairn mirror write`: refused with a
/// message saying why, and the mirror unchanged (same TID, same tree).
#[test]
fn bad_streams_are_refused_and_change_nothing() {
    let (src, mut dst) = source_and_mirror();
    fs::write(src.p("a"), pattern(1, 300_000)).unwrap();
    sync_tid(&src.mnt);
    assert!(mirror_copy(&src.mnt, &dst.pool).status.success());
    let at = mirror_tid(dst.pool.as_os_str());
    for i in 0..3 {
        fs::write(src.p(&format!("n{i}")), pattern(10 + i, 100_000)).unwrap();
        sync_tid(&src.mnt);
    }
    let dir = dst.dir.clone();
    let file = |name: &str| dir.join(name);
    let read = |since: u64, to: &Path| read_into(&src.mnt, since, to);
    read(at, &file("good"));
    read(0, &file("full"));
    read(at + 1, &file("late"));
    let good = fs::read(file("good")).unwrap();
    let f = frames(&good);
    assert!(f.len() >= 6, "{} frames", f.len());
    let mut flipped = good.clone();
    flipped[f[3].start + 20] ^= 1;
    let mut reordered = good[..f[2].start].to_vec();
    reordered.extend_from_slice(&good[f[3].clone()]);
    reordered.extend_from_slice(&good[f[2].clone()]);
    reordered.extend_from_slice(&good[f[3].end..]);
    let mut dropped = good[..f[2].start].to_vec();
    dropped.extend_from_slice(&good[f[3].start..]);
    let other = Fs::new();
    fs::write(other.p("x"), b"another pool").unwrap();
    let other_tid = sync_tid(&other.mnt);
    read_into(&other.mnt, at.min(other_tid), &file("foreign"));
    other.finish();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() - 30].to_vec(), "truncated"),
        ("flipped byte", flipped, "checksum"),
        ("reordered", reordered, "reordered"),
        ("frame missing", dropped, "missing"),
        ("empty", Vec::new(), "truncated"),
        (
            "full stream again",
            fs::read(file("full")).unwrap(),
            "mirror is at TID",
        ),
        (
            "starts after the mirror",
            fs::read(file("late")).unwrap(),
            "mirror is at TID",
        ),
        (
            "another pool's",
            fs::read(file("foreign")).unwrap(),
            "comes from pool",
        ),
    ];
    dst.mount();
    let before = capture(&dst.mnt).unwrap();
    dst.unmount();
    for (what, bytes, says) in cases {
        fs::write(file("bad"), &bytes).unwrap();
        let (code, err) = cairn_fails(&[
            os("mirror"),
            os("write"),
            dst.pool.as_os_str(),
            os("-i"),
            file("bad").as_os_str(),
        ]);
        assert!(
            code != 0 && err.contains(says),
            "{what}: exit {code}: {err}"
        );
        let now = mirror_tid(dst.pool.as_os_str());
        assert_eq!(now, at, "{what} changed the mirror");
    }
    dst.mount();
    assert_tree_at(&dst.mnt, &before, "after the bad streams");
    dst.unmount();
    // The good one still applies.
    cairn_ok(&[
        os("mirror"),
        os("write"),
        dst.pool.as_os_str(),
        os("-i"),
        file("good").as_os_str(),
    ]);
    dst.mount();
    assert_tree_at(
        &dst.mnt,
        &capture(&src.mnt).unwrap(),
        "after the good stream",
    );
    dst.finish();
    src.finish();
}

/// A two-way copy asks the mirror which chunks it lacks: a file brought
/// back from history (`cairn undo`) sends no chunk bytes by `copy`, where a
/// one-way stream of the same change carries them.
#[test]
fn a_copy_sends_only_the_chunks_the_mirror_lacks() {
    let (src, mut dst) = source_and_mirror();
    let data = pattern(5, 1 << 20);
    fs::write(src.p("f"), &data).unwrap();
    let old = sync_tid(&src.mnt);
    assert!(mirror_copy(&src.mnt, &dst.pool).status.success());
    fs::remove_file(src.p("f")).unwrap();
    sync_tid(&src.mnt);
    assert!(mirror_copy(&src.mnt, &dst.pool).status.success());
    // Back from history: its chunks are on the mirror, in its history.
    cairn_ok(&[
        os("undo"),
        src.p("f").as_os_str(),
        os("--tid"),
        os(&old.to_string()),
    ]);
    sync_tid(&src.mnt);
    assert_eq!(fs::read(src.p("f")).unwrap(), data);
    let at = mirror_tid(dst.pool.as_os_str());
    let one_way = dst.dir.join("one-way");
    let since = at.to_string();
    let out = cairn(&[
        os("mirror"),
        os("read"),
        src.mnt.as_os_str(),
        os("--since"),
        os(&since),
        os("-o"),
        one_way.as_os_str(),
    ]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && !said.contains("(0 bytes)"),
        "one-way: {said}"
    );
    let v = cairn_json(&[
        os("mirror"),
        os("copy"),
        src.mnt.as_os_str(),
        dst.pool.as_os_str(),
        os("--json"),
    ]);
    assert_eq!(field_u64(field(&v, "read"), "chunk_bytes"), 0, "{v:?}");
    assert!(field_u64(field(&v, "read"), "chunks_skipped") > 0, "{v:?}");
    dst.mount();
    assert_eq!(fs::read(dst.p("f")).unwrap(), data);
    dst.finish();
    src.finish();
}

/// A mirror whose source pruned past its TID (the source gave up its hold)
/// is told to resync from the newest snapshot both hold; `copy --resync`
/// rolls it back to that snapshot and copies from there, and the mirror
/// then equals the source, the snapshot included.
#[test]
fn a_mirror_behind_the_prune_horizon_resyncs_from_a_common_snapshot() {
    let (src, mut dst) = source_and_mirror();
    mirror_first_tree(&src);
    snapshot_create(&src.mnt, "base");
    let out = mirror_copy(&src.mnt, &dst.pool);
    assert!(out.status.success(), "{}", describe(&out));
    // The mirror takes changes past the snapshot that the source then
    // rewrites, deletes and prunes.
    fs::write(src.p("late"), pattern(5, 200_000)).unwrap();
    fs::write(src.p("docs/a.txt"), b"rewritten\n").unwrap();
    fs::remove_file(src.p("hard")).unwrap();
    cairn_ok(&[os("sync"), src.mnt.as_os_str()]);
    let out = mirror_copy(&src.mnt, &dst.pool);
    assert!(out.status.success(), "{}", describe(&out));
    assert_private(&src.pool.join("mirror-holds.json"));
    let behind = mirror_tid(dst.pool.as_os_str());
    fs::write(src.p("late"), pattern(6, 100_000)).unwrap();
    fs::remove_file(src.p("docs/deep/big")).unwrap();
    cairn_ok(&[os("sync"), src.mnt.as_os_str()]);
    give_up_and_prune(&src, &dst);
    let out = mirror_copy(&src.mnt, &dst.pool);
    assert!(!out.status.success(), "a copy past the horizon succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resync from snapshot base"), "{err}");
    assert_eq!(
        mirror_tid(dst.pool.as_os_str()),
        behind,
        "a refused copy changed the mirror"
    );
    let out = cairn(&[
        os("mirror"),
        os("copy"),
        src.mnt.as_os_str(),
        dst.pool.as_os_str(),
        os("--resync"),
        os("--json"),
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("chunks_freed"), "no rollback in {text}");
    let now = field_u64(&status(src.mnt.as_os_str()), "tid");
    assert_eq!(mirror_tid(dst.pool.as_os_str()), now);
    dst.mount();
    let want = capture(&src.mnt).unwrap();
    assert_tree_at(&dst.mnt, &want, "the mirror after the resync");
    let (a, b) = (
        snapshot_verify(&src.mnt, "base").1,
        snapshot_verify(&dst.mnt, "base").1,
    );
    assert_eq!(field_str(&a, "computed"), field_str(&b, "computed"));
    dst.finish();
    src.finish();
}

/// `cairn mirror copy` killed (SIGKILL) at random moments, again and again,
/// while it applies a stream of many small batches to an unmounted mirror
/// (the apply runs in the killed process): each time the mirror opens
/// consistent at a TID no later than the source's, the next copy resumes
/// from there, and the mirror ends equal to the source with a clean check.
#[test]
fn a_copy_killed_at_random_points_resumes_where_it_stopped() {
    let (src, mut dst) = source_and_mirror();
    for i in 0..64u64 {
        fs::write(src.p(&format!("f{i}")), pattern(i, 1 << 20)).unwrap();
        if i % 4 == 3 {
            sync_tid(&src.mnt);
        }
    }
    let top = sync_tid(&src.mnt);
    let tmp = dst.dir.join("tmp");
    fs::create_dir(&tmp).unwrap();
    let copy = |to: &Path| {
        std::process::Command::new(CAIRN)
            .args([
                os("mirror"),
                os("copy"),
                src.mnt.as_os_str(),
                to.as_os_str(),
            ])
            .args(["--batch-mib", "1"])
            .env("TMPDIR", &tmp)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    // How long a whole copy takes here: the kills land within that.
    let probe = Fs::create();
    probe.mkfs(&["--mirror"]);
    let t0 = std::time::Instant::now();
    assert!(copy(&probe.pool).wait().unwrap().success());
    let whole = t0.elapsed().as_millis() as u64;
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed {seed}, a whole copy {whole} ms");
    let mut rng = seed;
    let mut next = |n: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % n.max(1)
    };
    let (mut kills, mut seen) = (0, Vec::new());
    for attempt in 0..10 {
        let mut child = copy(&dst.pool);
        // The first kill early enough that the copy cannot have finished.
        let at = match attempt {
            0 => whole / 10 + next(whole / 2),
            _ => whole / 5 + next(whole * 7 / 10),
        };
        std::thread::sleep(Duration::from_millis(at));
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "copy exited {st}");
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        let tid = mirror_tid(dst.pool.as_os_str());
        assert!(tid <= top, "mirror at {tid:#x}, source at {top:#x}");
        seen.push(tid);
    }
    assert!(kills > 0, "no copy was killed (seed {seed})");
    let out = mirror_copy(&src.mnt, &dst.pool);
    assert!(out.status.success(), "seed {seed}: {}", describe(&out));
    assert_eq!(mirror_tid(dst.pool.as_os_str()), top, "seed {seed}");
    eprintln!("killed {kills} times, the mirror at {seen:x?}");
    dst.check();
    dst.mount();
    assert_tree_at(&dst.mnt, &capture(&src.mnt).unwrap(), "after the kills");
    dst.finish();
    src.finish();
}
