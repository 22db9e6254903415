//! POSIX behaviour of a real Cairn mount. Real programs (cp -a, diff, tar, git,
//! sqlite3, setfattr/getfattr) plus direct syscalls checking errno values,
//! rename flags, links, special files, metadata, xattrs, truncate/fallocate,
//! sparse files, statfs, inode stability and big directories. Every test owns a
//! fresh pool, ends with a clean unmount and a successful `cairn check`.

mod common;

use common::*;
use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{chown, lchown, PermissionsExt};
use std::os::unix::fs::{symlink, DirEntryExt, FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const MIB: usize = 1 << 20;

// ------------------------------------------------------------ tree helpers

/// Source tree to copy: $CAIRN_TREE, else the toolchain's rust-src, else
/// /usr/share/doc (first one of 50..400 MB, else the first that exists).
fn source_tree() -> PathBuf {
    if let Some(t) = std::env::var_os("CAIRN_TREE") {
        return t.into();
    }
    let mut cands = Vec::new();
    if let Ok(o) = Command::new("rustc").args(["--print", "sysroot"]).output() {
        let root = String::from_utf8_lossy(&o.stdout).trim().to_string();
        cands.push(Path::new(&root).join("lib/rustlib/src/rust/library"));
    }
    cands.push(PathBuf::from("/usr/share/doc"));
    let existing: Vec<PathBuf> = cands.into_iter().filter(|p| p.is_dir()).collect();
    assert!(!existing.is_empty(), "no source tree found; set CAIRN_TREE");
    let mb = |p: &Path| -> u64 {
        let out = sh(
            Path::new("/"),
            &format!("du -sm --apparent-size '{}' | cut -f1", p.display()),
        );
        out.trim().parse().unwrap_or(0)
    };
    let pick = existing
        .iter()
        .find(|p| (50..=400).contains(&mb(p)))
        .unwrap_or(&existing[0]);
    println!("source tree: {} ({} MB)", pick.display(), mb(pick));
    pick.clone()
}

/// One line per entry below `root` (type, mode, owner, nlink, size, mtime,
/// link target), sorted. `ns` selects nanosecond or whole-second mtimes.
fn manifest(root: &Path, ns: bool) -> Vec<String> {
    let mut out = Vec::new();
    walk(root, Path::new(""), ns, &mut out);
    out.sort();
    out
}

fn walk(root: &Path, rel: &Path, ns: bool, out: &mut Vec<String>) {
    let rd = fs::read_dir(root.join(rel))
        .unwrap_or_else(|e| panic!("readdir {}: {e}", root.join(rel).display()));
    for e in rd {
        let r = rel.join(e.unwrap().file_name());
        let md = fs::symlink_metadata(root.join(&r)).unwrap();
        out.push(entry_line(&root.join(&r), &r, &md, ns));
        if md.is_dir() {
            walk(root, &r, ns, out);
        }
    }
}

fn entry_line(path: &Path, rel: &Path, md: &fs::Metadata, ns: bool) -> String {
    let mtime = if ns {
        format!("{}.{:09}", md.mtime(), md.mtime_nsec())
    } else {
        md.mtime().to_string()
    };
    let base = format!(
        "{} mode={:o} own={}:{} nlink={}",
        rel.display(),
        md.mode(),
        md.uid(),
        md.gid(),
        md.nlink()
    );
    if md.file_type().is_symlink() {
        format!("{base} -> {}", fs::read_link(path).unwrap().display())
    } else if md.is_dir() {
        format!("{base} dir mtime={mtime}")
    } else {
        format!("{base} size={} mtime={mtime}", md.len())
    }
}

/// Asserts that two manifests are equal, showing the first differences.
fn assert_manifest_eq(got: &[String], want: &[String], what: &str) {
    if got == want {
        return;
    }
    let g: HashSet<&String> = got.iter().collect();
    let w: HashSet<&String> = want.iter().collect();
    let missing: Vec<_> = want.iter().filter(|l| !g.contains(l)).take(10).collect();
    let extra: Vec<_> = got.iter().filter(|l| !w.contains(l)).take(10).collect();
    panic!("{what}: trees differ ({} vs {} entries)\nexpected but missing: {missing:#?}\nunexpected: {extra:#?}", got.len(), want.len());
}

/// Contents via `diff -r --no-dereference`, metadata via manifests.
fn assert_same_tree(src: &Path, dst: &Path, ns_times: bool) {
    sh(
        Path::new("/"),
        &format!(
            "diff -r --no-dereference '{}' '{}'",
            src.display(),
            dst.display()
        ),
    );
    assert_manifest_eq(
        &manifest(dst, ns_times),
        &manifest(src, ns_times),
        &format!("{}", dst.display()),
    );
}

// ------------------------------------------------------- real programs

#[test]
fn copy_tree_diff_tar_remount() {
    let src = source_tree();
    let mut fs = Fs::new();
    let (m, s, d) = (
        fs.mnt.clone(),
        src.display().to_string(),
        fs.dir.display().to_string(),
    );
    assert!(
        manifest(&src, false).len() > 100,
        "source tree too small to be meaningful"
    );
    sh(&m, &format!("cp -a '{s}/.' copy"));
    assert_same_tree(&src, &fs.p("copy"), true);
    // tar of the source and of the copy must be byte-identical archives
    let tar = "tar --sort=name --format=gnu --numeric-owner";
    sh(&fs.dir, &format!("{tar} -C '{s}' -cf src.tar ."));
    sh(
        &m,
        &format!("{tar} -C copy -cf copy.tar . && cmp copy.tar '{d}/src.tar'"),
    );
    sh(&m, "mkdir x && tar -C x -xpf copy.tar && rm copy.tar");
    assert_same_tree(&src, &fs.p("x"), false);
    fs.unmount();
    fs.check();
    fs.mount();
    assert_same_tree(&src, &fs.p("copy"), true);
    assert_same_tree(&src, &fs.p("x"), false);
    sh(&m, "rm -rf copy x && test -z \"$(ls -A)\"");
    fs.finish();
}

const GIT_SETUP: &str = r#"
export HOME="$PWD/.home" GIT_CONFIG_NOSYSTEM=1
mkdir -p "$HOME"
git config --global user.email test@example.com
git config --global user.name Test
git config --global init.defaultBranch main
"#;

const GIT_WORK: &str = r#"
git init -q repo && cd repo
for i in $(seq 1 200); do echo "line $i" > f$i.txt; done
mkdir -p src/a/b && seq 1 200000 > src/a/b/big.txt
git add -A && git commit -q -m first
sed -i 's/^line 1$/changed/' f1.txt
git rm -q f2.txt && git mv f3.txt moved.txt
git commit -q -am second
test "$(git log --oneline | wc -l)" = 2
test -z "$(git status --porcelain)"
git gc -q && git fsck --full --strict
cd .. && git clone -q repo clone && diff -r --exclude=.git repo clone
"#;

#[test]
fn git_init_commit_log_status() {
    let mut fs = Fs::new();
    let m = fs.mnt.clone();
    sh(&m, &format!("{GIT_SETUP}{GIT_WORK}"));
    fs.remount();
    sh(
        &m,
        r#"export HOME="$PWD/.home" GIT_CONFIG_NOSYSTEM=1
cd repo && git fsck --full --strict
test -z "$(git status --porcelain)"
test "$(git log --oneline | wc -l)" = 2
test "$(head -1 f1.txt)" = changed && test ! -e f2.txt && test -f moved.txt
test "$(git -C ../clone log --oneline | grep -c second)" = 1"#,
    );
    fs.finish();
}

/// SQL script: a table filled by `n` INSERTs inside one transaction.
fn sqlite_script(journal: &str, n: u32) -> String {
    let mut s = format!("PRAGMA journal_mode={journal};\nCREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, b BLOB);\nBEGIN;\n");
    for i in 1..=n {
        s += &format!(
            "INSERT INTO t VALUES({i}, 'row-{i}', randomblob({}));\n",
            1 + i % 2000
        );
    }
    s + "COMMIT;\nCREATE INDEX tv ON t(v);\nDELETE FROM t WHERE id % 7 = 0;\n"
}

/// Expected "count|sum(length(b))" after `sqlite_script(_, n)`.
fn sqlite_expect(n: u32) -> String {
    let kept = (1..=n).filter(|i| i % 7 != 0);
    format!(
        "{}|{}",
        kept.clone().count(),
        kept.map(|i| (1 + i % 2000) as u64).sum::<u64>()
    )
}

fn sqlite_verify(m: &Path, db: &str, n: u32) {
    let out = sh(
        m,
        &format!(
            "sqlite3 {db} 'PRAGMA integrity_check;' 'SELECT count(*), sum(length(b)) FROM t;'"
        ),
    );
    assert_eq!(
        out.trim(),
        format!("ok\n{}", sqlite_expect(n)),
        "sqlite3 {db}"
    );
}

#[test]
fn sqlite_transactions_and_integrity() {
    assert!(
        Path::new("/usr/bin/sqlite3").exists(),
        "/usr/bin/sqlite3 missing (apt-get install sqlite3)"
    );
    let mut fs = Fs::new();
    let m = fs.mnt.clone();
    for (db, journal, n) in [("rollback.db", "DELETE", 4000), ("wal.db", "WAL", 3000)] {
        let script = fs.dir.join(format!("{db}.sql"));
        fs::write(&script, sqlite_script(journal, n)).unwrap();
        sh(
            &m,
            &format!("sqlite3 {db} < '{}' > /dev/null", script.display()),
        );
        sqlite_verify(&m, db, n);
    }
    // many small autocommit transactions: one fsync round trip each
    let small: String = (0..200)
        .map(|i| format!("INSERT INTO s VALUES({i});\n"))
        .collect();
    fs::write(
        fs.dir.join("small.sql"),
        format!("CREATE TABLE s(x);\n{small}"),
    )
    .unwrap();
    sh(
        &m,
        &format!(
            "sqlite3 small.db < '{}'",
            fs.dir.join("small.sql").display()
        ),
    );
    fs.remount();
    sqlite_verify(&m, "rollback.db", 4000);
    sqlite_verify(&m, "wal.db", 3000);
    let out = sh(
        &m,
        "sqlite3 small.db 'PRAGMA integrity_check;' 'SELECT count(*), sum(x) FROM s;'",
    );
    assert_eq!(out.trim(), "ok\n200|19900");
    fs.finish();
}

// ------------------------------------------------------------ errno values

fn mkfile(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

#[test]
fn errno_basic_cases() {
    let fs = Fs::new();
    let d = fs.p("d");
    fs::create_dir(&d).unwrap();
    mkfile(&d.join("f"), b"x");
    expect_errno(fs::remove_dir(&d), libc::ENOTEMPTY, "rmdir non-empty dir");
    expect_errno(fs::create_dir(&d), libc::EEXIST, "mkdir existing dir");
    expect_errno(
        fs::create_dir(d.join("f")),
        libc::EEXIST,
        "mkdir over existing file",
    );
    let excl = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(d.join("f"));
    expect_errno(excl, libc::EEXIST, "O_CREAT|O_EXCL on existing file");
    expect_errno(fs::metadata(fs.p("nope")), libc::ENOENT, "stat missing");
    expect_errno(File::open(fs.p("nope")), libc::ENOENT, "open missing");
    expect_errno(
        fs::remove_file(fs.p("nope")),
        libc::ENOENT,
        "unlink missing",
    );
    expect_errno(fs::remove_dir(fs.p("nope")), libc::ENOENT, "rmdir missing");
    expect_errno(
        fs::create_dir(fs.p("nope/sub")),
        libc::ENOENT,
        "mkdir with missing parent",
    );
    expect_errno(
        fs::rename(fs.p("nope"), fs.p("x")),
        libc::ENOENT,
        "rename missing",
    );
    expect_errno(
        fs::hard_link(fs.p("nope"), fs.p("x")),
        libc::ENOENT,
        "link missing",
    );
    errno_names(&fs);
    errno_types(&fs, &d);
    errno_renames(&fs, &d);
    fs.finish();
}

/// 255-byte names work, 256-byte names give ENAMETOOLONG; symlink loops ELOOP.
fn errno_names(fs: &Fs) {
    let ok = "n".repeat(255);
    mkfile(&fs.p(&ok), b"ok");
    assert_eq!(fs::read(fs.p(&ok)).unwrap(), b"ok");
    assert!(fs::read_dir(&fs.mnt)
        .unwrap()
        .any(|e| e.unwrap().file_name() == ok.as_str()));
    let long = "L".repeat(256);
    expect_errno(
        File::create(fs.p(&long)),
        libc::ENAMETOOLONG,
        "create 256-byte name",
    );
    expect_errno(
        fs::create_dir(fs.p(&long)),
        libc::ENAMETOOLONG,
        "mkdir 256-byte name",
    );
    expect_errno(
        symlink("t", fs.p(&long)),
        libc::ENAMETOOLONG,
        "symlink 256-byte name",
    );
    expect_errno(
        fs::rename(fs.p(&ok), fs.p(&long)),
        libc::ENAMETOOLONG,
        "rename to 256-byte name",
    );
    expect_errno(
        fs::metadata(fs.p(&long)),
        libc::ENAMETOOLONG,
        "stat 256-byte name",
    );
    symlink("loop2", fs.p("loop1")).unwrap();
    symlink("loop1", fs.p("loop2")).unwrap();
    expect_errno(File::open(fs.p("loop1")), libc::ELOOP, "open symlink loop");
    expect_errno(
        fs::metadata(fs.p("loop1")),
        libc::ELOOP,
        "stat symlink loop",
    );
    symlink(ok.as_str(), fs.p("ln")).unwrap();
    let nofollow = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(fs.p("ln"));
    expect_errno(nofollow, libc::ELOOP, "O_NOFOLLOW on symlink");
}

/// EISDIR / ENOTDIR / EPERM for directory hard links.
fn errno_types(fs: &Fs, d: &Path) {
    let f = d.join("f");
    expect_errno(
        OpenOptions::new().write(true).open(d),
        libc::EISDIR,
        "open dir for writing",
    );
    expect_errno(fs::remove_file(d), libc::EISDIR, "unlink a directory");
    expect_errno(
        File::open(f.join("x")),
        libc::ENOTDIR,
        "path through a file",
    );
    expect_errno(
        fs::create_dir(f.join("x")),
        libc::ENOTDIR,
        "mkdir below a file",
    );
    expect_errno(fs::remove_dir(&f), libc::ENOTDIR, "rmdir a file");
    expect_errno(fs::read_dir(&f), libc::ENOTDIR, "opendir a file");
    expect_errno(
        fs::hard_link(d, fs.p("dirlink")),
        libc::EPERM,
        "hard link to a directory",
    );
}

/// rename(2) type mismatches, EINVAL, and EXDEV only across mounts.
fn errno_renames(fs: &Fs, d: &Path) {
    let f = d.join("f");
    fs::create_dir_all(fs.p("e/sub")).unwrap();
    fs::create_dir(fs.p("empty")).unwrap();
    let e = errno_of(
        fs::rename(fs.p("empty"), d),
        "rename dir over non-empty dir",
    );
    assert!(
        e == libc::ENOTEMPTY || e == libc::EEXIST,
        "rename over non-empty dir: {}",
        io::Error::from_raw_os_error(e)
    );
    expect_errno(
        fs::rename(&f, fs.p("empty")),
        libc::EISDIR,
        "rename file over dir",
    );
    expect_errno(
        fs::rename(fs.p("empty"), &f),
        libc::ENOTDIR,
        "rename dir over file",
    );
    expect_errno(
        fs::rename(fs.p("e"), fs.p("e/sub/inner")),
        libc::EINVAL,
        "rename dir below itself",
    );
    // EXDEV only across mounts; within the mount cross-directory moves work
    let outside = fs.dir.join("outside");
    mkfile(&outside, b"o");
    expect_errno(
        fs::rename(&outside, fs.p("in")),
        libc::EXDEV,
        "rename into the mount",
    );
    expect_errno(
        fs::rename(&f, fs.dir.join("out")),
        libc::EXDEV,
        "rename out of the mount",
    );
    expect_errno(
        fs::hard_link(&outside, fs.p("in")),
        libc::EXDEV,
        "link into the mount",
    );
    fs::rename(&f, fs.p("e/sub/f")).unwrap();
    fs::rename(fs.p("empty"), fs.p("e/sub/empty")).unwrap();
    assert_eq!(fs::read(fs.p("e/sub/f")).unwrap(), b"x");
    assert!(!f.exists() && fs.p("e/sub/empty").is_dir());
}

// ------------------------------------------------------------- renames

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let (a, b) = (cpath(from), cpath(to));
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    cvt(r).map(drop)
}

#[test]
fn rename_noreplace_exchange_and_overwrite() {
    let mut fs = Fs::new();
    let (a, b, c) = (fs.p("a"), fs.p("b"), fs.p("c"));
    mkfile(&a, b"AAA");
    mkfile(&b, b"BBBB");
    expect_errno(
        renameat2(&a, &b, libc::RENAME_NOREPLACE),
        libc::EEXIST,
        "RENAME_NOREPLACE onto existing",
    );
    assert_eq!(
        (fs::read(&a).unwrap(), fs::read(&b).unwrap()),
        (b"AAA".to_vec(), b"BBBB".to_vec())
    );
    renameat2(&a, &c, libc::RENAME_NOREPLACE).expect("RENAME_NOREPLACE to a free name");
    assert!(!a.exists());
    renameat2(&c, &b, libc::RENAME_EXCHANGE).expect("RENAME_EXCHANGE file<->file");
    assert_eq!(
        (fs::read(&c).unwrap(), fs::read(&b).unwrap()),
        (b"BBBB".to_vec(), b"AAA".to_vec())
    );
    expect_errno(
        renameat2(&c, &a, libc::RENAME_EXCHANGE),
        libc::ENOENT,
        "RENAME_EXCHANGE with missing target",
    );
    // exchange a file with a directory in another directory
    fs::create_dir_all(fs.p("x/dir")).unwrap();
    mkfile(&fs.p("x/dir/child"), b"child");
    renameat2(&b, &fs.p("x/dir"), libc::RENAME_EXCHANGE).expect("RENAME_EXCHANGE file<->dir");
    assert_eq!(fs::read(fs.p("b/child")).unwrap(), b"child");
    assert_eq!(fs::read(fs.p("x/dir")).unwrap(), b"AAA");
    assert_eq!(
        fs::metadata(fs.p("x")).unwrap().nlink(),
        2,
        "x lost its subdir"
    );
    assert_eq!(
        fs::metadata(&fs.mnt).unwrap().nlink(),
        4,
        "root has b and x as subdirs"
    );
    rename_over_open_file(&fs);
    fs.remount();
    assert_eq!(fs::read(fs.p("b/child")).unwrap(), b"child");
    assert_eq!(fs::read(fs.p("x/dir")).unwrap(), b"AAA");
    assert_eq!(fs::read(fs.p("target")).unwrap(), b"new contents");
    assert!(!c.exists() && !fs.p("src").exists());
    fs.finish();
}

/// rename(2) over an existing file replaces it atomically; an open fd on the
/// old file keeps reading the old data.
fn rename_over_open_file(fs: &Fs) {
    let (src, target) = (fs.p("src"), fs.p("target"));
    mkfile(&target, b"old contents");
    mkfile(&src, b"new contents");
    let old = File::open(&target).unwrap();
    let ino_src = fs::metadata(&src).unwrap().ino();
    fs::rename(&src, &target).unwrap();
    assert_eq!(
        fs::metadata(&target).unwrap().ino(),
        ino_src,
        "rename keeps the inode"
    );
    let mut buf = String::new();
    (&old).read_to_string(&mut buf).unwrap();
    assert_eq!(buf, "old contents", "open fd of the replaced file");
    fs::rename(fs.p("c"), fs.p("c2")).unwrap();
    fs::remove_file(fs.p("c2")).unwrap();
}

// ---------------------------------------------------------- links, unlink

#[test]
fn hard_links_and_nlink_counts() {
    let mut fs = Fs::new();
    let (f, g, h) = (fs.p("f"), fs.p("g"), fs.p("sub/h"));
    fs::create_dir(fs.p("sub")).unwrap();
    mkfile(&f, b"hello");
    fs::hard_link(&f, &g).unwrap();
    fs::hard_link(&g, &h).unwrap();
    let ino = fs::metadata(&f).unwrap().ino();
    for p in [&f, &g, &h] {
        let md = fs::metadata(p).unwrap();
        assert_eq!((md.nlink(), md.ino()), (3, ino), "{}", p.display());
    }
    expect_errno(
        fs::hard_link(&f, &g),
        libc::EEXIST,
        "link onto existing name",
    );
    OpenOptions::new()
        .append(true)
        .open(&g)
        .unwrap()
        .write_all(b" world")
        .unwrap();
    assert_eq!(
        fs::read(&f).unwrap(),
        b"hello world",
        "write via one link, read via another"
    );
    fs::remove_file(&f).unwrap();
    assert_eq!(fs::metadata(&g).unwrap().nlink(), 2);
    fs.remount();
    for p in [&g, &h] {
        let md = fs::metadata(p).unwrap();
        assert_eq!(
            (md.nlink(), md.ino(), md.len()),
            (2, ino, 11),
            "{} after remount",
            p.display()
        );
    }
    fs::remove_file(&g).unwrap();
    assert_eq!(fs::metadata(&h).unwrap().nlink(), 1);
    assert_eq!(fs::read(&h).unwrap(), b"hello world");
    fs.finish();
}

/// Data of an unlinked file stays readable (and writable) through an open fd;
/// after the last close its space comes back: on a 128 MiB device, 80 MiB are
/// unlinked and then 64 MiB must fit (80 + 64 would not).
#[test]
fn unlink_while_open_keeps_data_then_frees_space() {
    let mut fs = Fs::create();
    let dev = fs.dev("ssd0");
    fs.mkfs(&["--device", &format!("ssd:{dev}:128M")]);
    fs.mount();
    let size = 80 * MIB;
    let data = pattern(7, size);
    let path = fs.p("victim");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    (&f).write_all(&data).unwrap();
    f.sync_all().unwrap();
    fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    let listed = fs::read_dir(&fs.mnt).unwrap().count();
    assert_eq!(
        listed, 0,
        "unlinked file still listed (or a hidden file left)"
    );
    let mut buf = vec![0u8; size];
    f.read_exact_at(&mut buf, 0)
        .expect("read unlinked file via fd");
    assert_bytes_eq(&buf, &data, "unlinked-but-open file");
    f.write_all_at(b"still alive", 12345).unwrap();
    let mut small = [0u8; 11];
    f.read_exact_at(&mut small, 12345).unwrap();
    assert_eq!(&small, b"still alive");
    drop((f, buf));
    for i in 0..4u64 {
        let r = write_synced(&fs.p(&format!("new{i}")), 50 + i, 16 * MIB);
        r.unwrap_or_else(|e| panic!("space of the unlinked file did not come back: new{i}: {e}"));
    }
    for i in 0..4u64 {
        check_file(
            &fs.p(&format!("new{i}")),
            &pattern(50 + i, 16 * MIB),
            "file written after the unlink",
        );
    }
    fs.finish();
}

// ----------------------------------------------------- special files

#[test]
fn symlinks_fifos_sockets() {
    let mut fs = Fs::new();
    mkfile(&fs.p("target"), b"0123456789");
    fs::create_dir(fs.p("dir")).unwrap();
    mkfile(&fs.p("dir/inner"), b"inner");
    let targets = symlink_targets();
    for (i, t) in targets.iter().enumerate() {
        symlink(t, fs.p(&format!("l{i}"))).unwrap();
    }
    check_symlinks(&fs, &targets);
    assert_eq!(
        fs::read(fs.p("l0/inner")).unwrap(),
        b"inner",
        "traverse symlink to dir"
    );
    assert_eq!(
        fs::metadata(fs.p("l1")).unwrap().len(),
        10,
        "stat follows symlink"
    );
    make_special_files(&fs);
    fifo_roundtrip(&fs.p("fifo"));
    unix_socket_roundtrip(&fs.p("live.sock"));
    fs.remount();
    check_symlinks(&fs, &targets);
    check_special_types(&fs, &["fifo", "fifo2", "sock", "live.sock"]);
    fifo_roundtrip(&fs.p("fifo"));
    for n in ["fifo", "fifo2", "sock", "live.sock", "l2"] {
        fs::remove_file(fs.p(n)).unwrap();
    }
    fs.finish();
}

fn symlink_targets() -> Vec<String> {
    vec![
        "dir".into(),
        "target".into(),
        "../../outside/nowhere".into(),
        "a/".repeat(500) + "end",
        "with spaces/ünïcode/\u{1F600}".into(),
        "/absolute/path".into(),
    ]
}

fn check_symlinks(fs: &Fs, targets: &[String]) {
    for (i, t) in targets.iter().enumerate() {
        let p = fs.p(&format!("l{i}"));
        assert_eq!(
            fs::read_link(&p).unwrap(),
            Path::new(t),
            "readlink {}",
            p.display()
        );
        let md = fs::symlink_metadata(&p).unwrap();
        assert!(md.file_type().is_symlink(), "{} not a symlink", p.display());
        assert_eq!(md.len(), t.len() as u64, "symlink size = target length");
    }
}

fn make_special_files(fs: &Fs) {
    let mk = |name: &str, mode: libc::mode_t| {
        let c = cpath(&fs.p(name));
        cvt(unsafe { libc::mknod(c.as_ptr(), mode, 0) } as libc::c_long)
            .unwrap_or_else(|e| panic!("mknod {name}: {e}"));
    };
    let c = cpath(&fs.p("fifo"));
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo: {}",
        io::Error::last_os_error()
    );
    mk("fifo2", libc::S_IFIFO | 0o600);
    mk("sock", libc::S_IFSOCK | 0o600);
    check_special_types(fs, &["fifo", "fifo2", "sock"]);
}

fn check_special_types(fs: &Fs, names: &[&str]) {
    for &name in names {
        let fifo = name.starts_with("fifo");
        let md = fs::symlink_metadata(fs.p(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ft = md.file_type();
        assert!(
            if fifo { ft.is_fifo() } else { ft.is_socket() },
            "{name} has type {ft:?}"
        );
        if name != "live.sock" {
            assert_eq!(md.mode() & 0o7777, 0o600, "{name} permissions");
        }
    }
}

fn fifo_roundtrip(p: &Path) {
    let p2 = p.to_path_buf();
    let writer = std::thread::spawn(move || {
        File::options()
            .write(true)
            .open(&p2)
            .unwrap()
            .write_all(b"through the fifo")
    });
    let mut got = String::new();
    File::open(p).unwrap().read_to_string(&mut got).unwrap();
    writer.join().unwrap().unwrap();
    assert_eq!(got, "through the fifo");
}

fn unix_socket_roundtrip(p: &Path) {
    use std::os::unix::net::{UnixListener, UnixStream};
    let _ = fs::remove_file(p);
    let listener = UnixListener::bind(p).expect("bind unix socket in the mount");
    let mut client = UnixStream::connect(p).unwrap();
    client.write_all(b"ping").unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
}

// ------------------------------------------------------------ metadata

fn set_times(p: &Path, at: (i64, i64), mt: (i64, i64), flags: libc::c_int) -> io::Result<()> {
    let c = cpath(p);
    let ts = [
        libc::timespec {
            tv_sec: at.0 as _,
            tv_nsec: at.1 as _,
        },
        libc::timespec {
            tv_sec: mt.0 as _,
            tv_nsec: mt.1 as _,
        },
    ];
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), flags) } as libc::c_long)
        .map(drop)
}

fn times_of(md: &fs::Metadata) -> ((i64, i64), (i64, i64)) {
    ((md.atime(), md.atime_nsec()), (md.mtime(), md.mtime_nsec()))
}

const AT: (i64, i64) = (1_000_000_000, 123_456_789);
const MT: (i64, i64) = (1_600_000_000, 987_654_321);

#[test]
fn chmod_chown_and_nanosecond_times() {
    let mut fs = Fs::new();
    let (f, d, l) = (fs.p("f"), fs.p("d"), fs.p("l"));
    mkfile(&f, b"data");
    fs::create_dir(&d).unwrap();
    symlink("f", &l).unwrap();
    check_chmod(&f, &d);
    let root = unsafe { libc::geteuid() } == 0;
    let own = unsafe { (libc::getuid(), libc::getgid()) };
    let ((uid, gid), (luid, lgid)) = if root {
        ((1234, 5678), (4321, 8765))
    } else {
        (own, own)
    };
    chown(&f, Some(uid), Some(gid)).unwrap();
    lchown(&l, Some(luid), Some(lgid)).unwrap_or_else(|e| panic!("lchown: {e}"));
    let (fm, lm) = (fs::metadata(&f).unwrap(), fs::symlink_metadata(&l).unwrap());
    assert_eq!((fm.uid(), fm.gid()), (uid, gid), "chown");
    assert_eq!(
        (lm.uid(), lm.gid()),
        (luid, lgid),
        "lchown changes the link, not the target"
    );
    for p in [&f, &d] {
        set_times(p, AT, MT, 0).unwrap();
        assert_eq!(
            times_of(&fs::metadata(p).unwrap()),
            (AT, MT),
            "utimensat on {}",
            p.display()
        );
    }
    set_times(&l, (5, 1), (7, 999_999_999), libc::AT_SYMLINK_NOFOLLOW).unwrap();
    assert_eq!(
        times_of(&fs::symlink_metadata(&l).unwrap()),
        ((5, 1), (7, 999_999_999))
    );
    check_ctime_and_omit(&f);
    fs.remount();
    let fm = fs::metadata(&f).unwrap();
    assert_eq!(
        (fm.mode() & 0o7777, fm.uid(), fm.gid()),
        (0o4750, uid, gid),
        "after remount"
    );
    assert_eq!(times_of(&fm).1, (MT.0 + 1, 5), "mtime after remount");
    assert_eq!(
        times_of(&fs::metadata(&d).unwrap()),
        (AT, MT),
        "dir times after remount"
    );
    assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o1777);
    fs.finish();
}

fn check_chmod(f: &Path, d: &Path) {
    for mode in [0o640, 0o4750, 0o000, 0o777, 0o4750] {
        fs::set_permissions(f, fs::Permissions::from_mode(mode)).unwrap();
        assert_eq!(
            fs::metadata(f).unwrap().mode() & 0o7777,
            mode,
            "chmod {mode:o}"
        );
    }
    fs::set_permissions(d, fs::Permissions::from_mode(0o1777)).unwrap();
    let md = fs::metadata(d).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o1777, "sticky dir");
    assert!(md.is_dir());
}

/// chmod bumps ctime; UTIME_OMIT leaves a time alone; sets mtime for remount.
fn check_ctime_and_omit(f: &Path) {
    let c0 = fs::metadata(f).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    fs::set_permissions(f, fs::Permissions::from_mode(0o4750)).unwrap();
    let c1 = fs::metadata(f).unwrap();
    assert!(
        (c1.ctime(), c1.ctime_nsec()) > (c0.ctime(), c0.ctime_nsec()),
        "chmod did not update ctime"
    );
    set_times(f, (0, libc::UTIME_OMIT), (MT.0 + 1, 5), 0).unwrap();
    assert_eq!(
        times_of(&fs::metadata(f).unwrap()),
        (AT, (MT.0 + 1, 5)),
        "UTIME_OMIT"
    );
}

/// Runs a shell command as nobody (65534), asserting success.
fn sh_as_nobody(script: &str) {
    use std::os::unix::process::CommandExt;
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {}", describe(&out));
}

fn mode_of(p: &Path) -> u32 {
    fs::metadata(p).unwrap().mode() & 0o7777
}

/// Set-id bits go as the kernel drops them: a write or truncate by a caller
/// without CAP_FSETID drops set-user-ID, and set-group-ID when the group
/// may execute; root's writes keep them; chown drops them. Cairn does this
/// itself (FUSE_HANDLE_KILLPRIV_V2), so it is checked here.
#[test]
fn setid_bits_dropped_by_unprivileged_write_truncate_and_chown() {
    if unsafe { libc::geteuid() } != 0 {
        return; // needs a second user
    }
    let mut fs = Fs::new();
    fs::set_permissions(&fs.dir, fs::Permissions::from_mode(0o755)).unwrap();
    let names = ["w", "t", "root", "nox", "chown"];
    let modes = [0o6777, 0o6777, 0o6777, 0o2767, 0o6755];
    for (n, m) in names.iter().zip(modes) {
        mkfile(&fs.p(n), b"data");
        fs::set_permissions(fs.p(n), fs::Permissions::from_mode(m)).unwrap();
    }
    sh_as_nobody(&format!("printf x >> {}", fs.p("w").display()));
    sh_as_nobody(&format!("truncate -s 1 {}", fs.p("t").display()));
    sh_as_nobody(&format!("printf x >> {}", fs.p("nox").display()));
    OpenOptions::new()
        .append(true)
        .open(fs.p("root"))
        .and_then(|mut f| f.write_all(b"x"))
        .unwrap();
    chown(fs.p("chown"), Some(0), Some(0)).unwrap();
    let want = [0o777, 0o777, 0o6777, 0o2767, 0o755];
    for _ in 0..2 {
        for (n, m) in names.iter().zip(want) {
            assert_eq!(mode_of(&fs.p(n)), m, "mode of {n}");
        }
        fs.remount();
    }
    assert_eq!(fs::read(fs.p("w")).unwrap(), b"datax");
    assert_eq!(fs::read(fs.p("t")).unwrap(), b"d");
    fs.finish();
}

// --------------------------------------------------------------- xattrs

fn setx(p: &Path, name: &str, val: &[u8], flags: libc::c_int) -> io::Result<()> {
    let (c, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            val.as_ptr().cast(),
            val.len(),
            flags,
        )
    };
    cvt(r as libc::c_long).map(drop)
}

fn getx_sized(p: &Path, name: &str, size: usize) -> io::Result<Vec<u8>> {
    let (c, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
    buf.truncate(cvt(r as libc::c_long)? as usize);
    Ok(buf)
}

fn getx(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    getx_sized(p, name, 65536)
}

fn listx(p: &Path) -> Vec<String> {
    let c = cpath(p);
    let mut buf = vec![0u8; 65536];
    let r = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(cvt(r as libc::c_long).expect("listxattr") as usize);
    let mut names: Vec<String> = buf
        .split(|b| *b == 0)
        .filter(|s| s.starts_with(b"user."))
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    names
}

fn removex(p: &Path, name: &str) -> io::Result<()> {
    let (c, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    cvt(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) } as libc::c_long).map(drop)
}

#[test]
fn xattrs_set_get_list_remove() {
    let mut fs = Fs::new();
    let (f, d) = (fs.p("f"), fs.p("d"));
    mkfile(&f, b"x");
    fs::create_dir(&d).unwrap();
    let big = pattern(3, 4000);
    let bin = b"\0\x01zero\0bytes\xff".to_vec();
    setx(&f, "user.a", b"alpha", 0).unwrap();
    setx(&f, "user.big", &big, 0).unwrap();
    setx(&f, "user.bin", &bin, 0).unwrap();
    setx(&f, "user.empty", b"", 0).unwrap();
    setx(&d, "user.dir", b"on a dir", 0).unwrap();
    assert_eq!(listx(&f), ["user.a", "user.big", "user.bin", "user.empty"]);
    assert_eq!(getx(&f, "user.big").unwrap(), big);
    assert_eq!(getx(&f, "user.bin").unwrap(), bin);
    assert_eq!(getx(&f, "user.empty").unwrap(), b"");
    expect_errno(
        setx(&f, "user.a", b"x", libc::XATTR_CREATE),
        libc::EEXIST,
        "XATTR_CREATE existing",
    );
    expect_errno(
        setx(&f, "user.no", b"x", libc::XATTR_REPLACE),
        libc::ENODATA,
        "XATTR_REPLACE missing",
    );
    expect_errno(getx(&f, "user.no"), libc::ENODATA, "getxattr missing");
    expect_errno(removex(&f, "user.no"), libc::ENODATA, "removexattr missing");
    expect_errno(
        getx_sized(&f, "user.a", 2),
        libc::ERANGE,
        "getxattr buffer too small",
    );
    assert_eq!(getx_sized(&f, "user.a", 0).unwrap().len(), 0, "size query");
    setx(&f, "user.a", b"beta", libc::XATTR_REPLACE).unwrap();
    removex(&f, "user.empty").unwrap();
    sh(&fs.mnt, "setfattr -n user.cli -v hello f");
    assert_eq!(sh(&fs.mnt, "getfattr --only-values -n user.cli f"), "hello");
    fs.remount();
    assert_eq!(listx(&f), ["user.a", "user.big", "user.bin", "user.cli"]);
    assert_eq!(getx(&f, "user.a").unwrap(), b"beta");
    assert_eq!(getx(&f, "user.big").unwrap(), big);
    assert_eq!(getx(&d, "user.dir").unwrap(), b"on a dir");
    assert!(sh(&fs.mnt, "getfattr -d f").contains("user.a=\"beta\""));
    fs.finish();
}

// ---------------------------------------------- truncate, fallocate, holes

/// Applies `len` to the model and checks the whole file against it.
fn check_file(p: &Path, model: &[u8], what: &str) {
    let got = fs::read(p).unwrap_or_else(|e| panic!("{what}: read: {e}"));
    assert_bytes_eq(&got, model, what);
}

fn truncate_path(p: &Path, len: u64) {
    let c = cpath(p);
    let r = unsafe { libc::truncate(c.as_ptr(), len as libc::off_t) };
    assert_eq!(
        r,
        0,
        "truncate({}, {len}): {}",
        p.display(),
        io::Error::last_os_error()
    );
}

#[test]
fn truncate_and_ftruncate_grow_shrink() {
    let mut fs = Fs::new();
    let p = fs.p("t");
    let mut model = pattern(1, 200_000);
    mkfile(&p, &model);
    let cached = File::open(&p).unwrap();
    let _ = fs::read(&p).unwrap(); // populate the page cache
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let steps: [(&str, u64); 8] = [
        ("ftruncate", 100),
        ("truncate", 300_000),
        ("ftruncate", 65_537),
        ("truncate", 131_073),
        ("ftruncate", 0),
        ("truncate", 70_000),
        ("ftruncate", 65_536),
        ("truncate", 1_000_000),
    ];
    for (i, (how, len)) in steps.into_iter().enumerate() {
        if how == "ftruncate" {
            f.set_len(len).unwrap()
        } else {
            truncate_path(&p, len)
        }
        model.resize(len as usize, 0);
        check_file(&p, &model, &format!("step {i}: {how} to {len}"));
        let off = (len as usize).saturating_sub(10 + 7 * i);
        let chunk = pattern(100 + i as u64, 20 + 4000 * i);
        f.write_all_at(&chunk, off as u64).unwrap();
        write_model(&mut model, off, &chunk);
        check_file(&p, &model, &format!("step {i}: write at {off}"));
    }
    let mut stale = Vec::new();
    (&cached).read_to_end(&mut stale).unwrap();
    assert_bytes_eq(&stale, &model, "fd opened before the truncates");
    drop((f, cached));
    fs.remount();
    check_file(&p, &model, "after remount");
    fs.finish();
}

fn write_model(model: &mut Vec<u8>, off: usize, data: &[u8]) {
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

fn fallocate(f: &File, mode: libc::c_int, off: u64, len: u64) -> io::Result<()> {
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t) };
    cvt(r as libc::c_long).map(drop)
}

#[test]
fn fallocate_default_and_punch_hole() {
    let mut fs = Fs::new();
    let p = fs.p("fa");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    fallocate(&f, 0, 0, MIB as u64).expect("fallocate mode 0");
    let mut model = vec![0u8; MIB];
    check_file(&p, &model, "after fallocate");
    model = pattern(9, MIB);
    f.write_all_at(&model, 0).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    for (off, len) in [(100_000, 200_000), (5 * 65_536, 2 * 65_536), (MIB - 10, 10)] {
        fallocate(&f, punch, off as u64, len as u64).expect("punch hole");
        model[off..off + len].fill(0);
        check_file(&p, &model, &format!("after punching {off}+{len}"));
    }
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, MIB as u64, MIB as u64).expect("fallocate KEEP_SIZE");
    assert_eq!(
        f.metadata().unwrap().len(),
        MIB as u64,
        "KEEP_SIZE changed the size"
    );
    fallocate(&f, 0, 2 * MIB as u64, 100).expect("fallocate beyond EOF");
    model.resize(2 * MIB + 100, 0);
    check_file(&p, &model, "after extending fallocate");
    drop(f);
    fs.remount();
    check_file(&p, &model, "fallocate file after remount");
    fs.finish();
}

#[test]
fn sparse_file_holes_read_zeros() {
    let mut fs = Fs::new();
    let p = fs.p("sparse");
    let far = 256 * MIB as u64;
    let f = File::create(&p).unwrap();
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(b"tail", far).unwrap();
    f.write_all_at(b"mid", 65_534).unwrap();
    drop(f);
    check_sparse(&p, far);
    fs.remount();
    check_sparse(&p, far);
    fs.unmount();
    let physical = num(&info_json(&fs), "physical_bytes");
    assert!(
        physical < 16 * MIB as u64,
        "256 MiB sparse file stored as {physical} physical bytes"
    );
    fs.check();
}

/// Streams the whole file: only the three written spots may be non-zero.
fn check_sparse(p: &Path, far: u64) {
    assert_eq!(fs::metadata(p).unwrap().len(), far + 4);
    let f = File::open(p).unwrap();
    let mut buf = vec![0u8; 4 * MIB];
    let mut off = 0u64;
    let mut nonzero = Vec::new();
    loop {
        let n = f.read_at(&mut buf, off).unwrap();
        if n == 0 {
            break;
        }
        nonzero.extend(
            buf[..n]
                .iter()
                .enumerate()
                .filter(|(_, b)| **b != 0)
                .map(|(i, b)| (off + i as u64, *b)),
        );
        off += n as u64;
    }
    assert_eq!(off, far + 4, "short read of sparse file");
    let want: Vec<(u64, u8)> = [(0, &b"head"[..]), (65_534, b"mid"), (far, b"tail")]
        .iter()
        .flat_map(|(o, s)| s.iter().enumerate().map(move |(i, b)| (o + i as u64, *b)))
        .collect();
    assert_eq!(nonzero, want, "non-zero bytes of the sparse file");
}

// ------------------------------------------------- statfs, nlink, inodes

#[test]
fn statfs_is_sane() {
    let fs = Fs::new();
    let st = statvfs(&fs.mnt);
    assert!(
        st.f_blocks > 0 && st.f_bsize > 0 && st.f_frsize > 0,
        "statfs sizes: blocks {} bsize {} frsize {}",
        st.f_blocks,
        st.f_bsize,
        st.f_frsize
    );
    assert!(
        st.f_bfree <= st.f_blocks && st.f_bavail <= st.f_bfree,
        "free {} avail {} of {}",
        st.f_bfree,
        st.f_bavail,
        st.f_blocks
    );
    assert!(st.f_namemax >= 255, "f_namemax {}", st.f_namemax);
    let before = used_bytes(&fs.mnt);
    let f = File::create(fs.p("eight")).unwrap();
    (&f).write_all(&pattern(5, 8 * MIB)).unwrap();
    f.sync_all().unwrap();
    let grew = eventually(Duration::from_secs(30), || {
        used_bytes(&fs.mnt) >= before + 4 * MIB as u64
    });
    assert!(
        grew,
        "statfs used {} -> {} after writing 8 MiB",
        before,
        used_bytes(&fs.mnt)
    );
    drop(f);
    assert!(sh(&fs.mnt, "df -P .").contains(fs.mnt.to_str().unwrap()));
    fs.finish();
}

/// Every directory below `root` (and root) has nlink = 2 + its subdirectories.
fn check_dir_nlinks(dir: &Path) {
    let mut subdirs = 0;
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            subdirs += 1;
            check_dir_nlinks(&e.path());
        }
    }
    assert_eq!(
        fs::metadata(dir).unwrap().nlink(),
        2 + subdirs,
        "nlink of {}",
        dir.display()
    );
}

#[test]
fn directory_nlink_is_two_plus_subdirs() {
    let mut fs = Fs::new();
    check_dir_nlinks(&fs.mnt);
    for d in ["d", "d/a", "d/b", "d/c", "d/c/x", "e", "e/y"] {
        fs::create_dir(fs.p(d)).unwrap();
        check_dir_nlinks(&fs.mnt);
    }
    mkfile(&fs.p("d/file"), b"files do not count");
    assert_eq!(fs::metadata(fs.p("d")).unwrap().nlink(), 5);
    fs::remove_dir(fs.p("d/b")).unwrap();
    fs::rename(fs.p("d/c"), fs.p("c")).unwrap(); // across parents
    fs::rename(fs.p("d/a"), fs.p("d/a2")).unwrap(); // same parent
    fs::rename(fs.p("e/y"), fs.p("d/a2/y")).unwrap();
    fs::create_dir(fs.p("empty")).unwrap();
    fs::rename(fs.p("c"), fs.p("empty")).unwrap(); // dir over empty dir
    check_dir_nlinks(&fs.mnt);
    assert_eq!(fs::metadata(fs.p("d")).unwrap().nlink(), 3);
    fs.remount();
    check_dir_nlinks(&fs.mnt);
    fs.finish();
}

/// path -> inode for every entry; also checks readdir's d_ino == stat's ino.
fn inode_map(dir: &Path, map: &mut BTreeMap<PathBuf, u64>) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let md = fs::symlink_metadata(e.path()).unwrap();
        assert_eq!(
            e.ino(),
            md.ino(),
            "d_ino vs st_ino for {}",
            e.path().display()
        );
        map.insert(e.path(), md.ino());
        if md.is_dir() {
            inode_map(&e.path(), map);
        }
    }
}

#[test]
fn inode_numbers_stable_across_remount() {
    let mut fs = Fs::new();
    fs::create_dir_all(fs.p("a/b")).unwrap();
    for f in ["a/f1", "a/b/f2", "top"] {
        mkfile(&fs.p(f), f.as_bytes());
    }
    symlink("top", fs.p("s")).unwrap();
    fs::hard_link(fs.p("a/f1"), fs.p("h")).unwrap();
    let mut before = BTreeMap::new();
    inode_map(&fs.mnt, &mut before);
    let distinct: HashSet<u64> = before.values().copied().collect();
    assert_eq!(
        distinct.len(),
        before.len() - 1,
        "inode numbers not unique: {before:?}"
    );
    assert_eq!(before[&fs.p("h")], before[&fs.p("a/f1")]);
    let ino = before[&fs.p("a/f1")];
    fs::rename(fs.p("a/f1"), fs.p("a/b/moved")).unwrap();
    assert_eq!(
        fs::metadata(fs.p("a/b/moved")).unwrap().ino(),
        ino,
        "rename changed the inode"
    );
    fs::rename(fs.p("a/b/moved"), fs.p("a/f1")).unwrap();
    fs.remount();
    let mut after = BTreeMap::new();
    inode_map(&fs.mnt, &mut after);
    assert_eq!(after, before, "inode numbers changed across remount");
    fs.finish();
}

#[test]
fn readdir_10k_entries_complete_without_duplicates() {
    let mut fs = Fs::new();
    let dir = fs.p("many");
    fs::create_dir(&dir).unwrap();
    let want: HashSet<String> = (0..10_000)
        .map(|i| format!("entry-{i:05}-{}", "x".repeat(i % 40)))
        .collect();
    for n in &want {
        File::create(dir.join(n)).unwrap();
    }
    check_listing(&dir, &want);
    let ls = sh(
        &dir,
        "ls -f | grep -vx '\\.\\.\\?' | sort | uniq -c | awk '$1 != 1' | wc -l",
    );
    assert_eq!(ls.trim(), "0", "ls -f shows duplicates");
    fs.remount();
    check_listing(&dir, &want);
    sh(&fs.mnt, "rm -rf many && test ! -e many");
    fs.finish();
}

fn check_listing(dir: &Path, want: &HashSet<String>) {
    let mut seen = HashSet::new();
    for e in fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(seen.insert(name.clone()), "duplicate readdir entry {name}");
    }
    let missing: Vec<_> = want.difference(&seen).take(5).collect();
    let extra: Vec<_> = seen.difference(want).take(5).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "readdir: missing {missing:?}, extra {extra:?}, got {}",
        seen.len()
    );
}

// ------------------------------------------------------ I/O semantics

#[test]
fn open_flags_append_trunc_pread_coherence() {
    let mut fs = Fs::new();
    let p = fs.p("o");
    mkfile(&p, b"abc");
    OpenOptions::new()
        .append(true)
        .open(&p)
        .unwrap()
        .write_all(b"def")
        .unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"abcdef", "O_APPEND");
    let (w, r) = (
        OpenOptions::new().write(true).open(&p).unwrap(),
        File::open(&p).unwrap(),
    );
    w.write_all_at(b"XY", 1_000_000).unwrap();
    let mut buf = [0u8; 2];
    r.read_exact_at(&mut buf, 1_000_000).unwrap();
    assert_eq!(&buf, b"XY", "write on one fd visible on another");
    assert_eq!(r.read_at(&mut buf, 1_000_002).unwrap(), 0, "read at EOF");
    assert_eq!(fs::metadata(&p).unwrap().len(), 1_000_002);
    let mut hole = vec![1u8; 1000];
    r.read_exact_at(&mut hole, 500_000).unwrap();
    assert!(
        hole.iter().all(|b| *b == 0),
        "gap after pwrite beyond EOF is not zero"
    );
    drop((w, r));
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 0, "O_TRUNC");
    fs.remount();
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
    fs.finish();
}

#[test]
fn mmap_shared_write_then_read() {
    let mut fs = Fs::new();
    let p = fs.p("mapped");
    let len = MIB + 123;
    let data = pattern(11, len);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.set_len(len as u64).unwrap();
    unsafe {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let m = libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(
            m,
            libc::MAP_FAILED,
            "mmap MAP_SHARED: {}",
            io::Error::last_os_error()
        );
        std::ptr::copy_nonoverlapping(data.as_ptr(), m.cast::<u8>(), len);
        assert_eq!(
            libc::msync(m, len, libc::MS_SYNC),
            0,
            "msync: {}",
            io::Error::last_os_error()
        );
        assert_eq!(libc::munmap(m, len), 0);
    }
    drop(f);
    check_file(&p, &data, "file written through mmap");
    fs.remount();
    check_file(&p, &data, "mmap-written file after remount");
    fs.finish();
}

#[test]
fn concurrent_writers() {
    let mut fs = Fs::new();
    let shared = fs.p("shared");
    File::create(&shared).unwrap();
    let chunk = 65_536;
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (own, shared) = (fs.p(&format!("own{t}")), shared.clone());
            std::thread::spawn(move || {
                let o = File::create(&own).unwrap();
                let s = OpenOptions::new().write(true).open(&shared).unwrap();
                for k in 0..64u64 {
                    o.write_all_at(&pattern(t * 1000 + k, chunk), k * chunk as u64)
                        .unwrap();
                    s.write_all_at(&pattern(t * 1000 + k, chunk), (k * 4 + t) * chunk as u64)
                        .unwrap();
                }
                o.sync_all().unwrap();
            })
        })
        .collect();
    threads.into_iter().for_each(|h| h.join().unwrap());
    check_concurrent(&fs, chunk);
    fs.remount();
    check_concurrent(&fs, chunk);
    fs.finish();
}

fn check_concurrent(fs: &Fs, chunk: usize) {
    let shared = fs::read(fs.p("shared")).unwrap();
    assert_eq!(shared.len(), 256 * chunk);
    for t in 0..4u64 {
        let own = fs::read(fs.p(&format!("own{t}"))).unwrap();
        assert_eq!(own.len(), 64 * chunk);
        for k in 0..64u64 {
            let want = pattern(t * 1000 + k, chunk);
            assert_bytes_eq(
                &own[k as usize * chunk..][..chunk],
                &want,
                &format!("own{t} chunk {k}"),
            );
            let off = (k * 4 + t) as usize * chunk;
            assert_bytes_eq(
                &shared[off..off + chunk],
                &want,
                &format!("shared chunk {k} of thread {t}"),
            );
        }
    }
}

// --------------------------------------------------------- CLI contract

fn code(out: &std::process::Output) -> Option<i32> {
    out.status.code()
}

/// Non-zero exit that is a reported error, not a panic or a signal.
fn assert_clean_failure(out: &std::process::Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{what}: unexpectedly succeeded\n{}",
        describe(out)
    );
    assert!(
        code(out).is_some() && code(out) != Some(101),
        "{what}: crashed\n{}",
        describe(out)
    );
    assert!(
        !err.contains("panicked"),
        "{what}: panicked\n{}",
        describe(out)
    );
    assert!(!err.trim().is_empty(), "{what}: no error message on stderr");
}

#[test]
fn cli_wrong_arguments_exit_2_with_usage() {
    let cases: &[&[&str]] = &[
        &[],
        &["frobnicate"],
        &["mkfs"],
        &["mkfs", "/tmp/cairn-never-created", "--no-such-flag"],
        &["mount", "only-pool"],
        &["mount", "a", "b", "c"],
        &["mount", "a", "b", "--commit-interval", "soon"],
        &["umount"],
        &["check"],
        &["info"],
    ];
    for args in cases {
        let out = cairn(args);
        assert_eq!(
            code(&out),
            Some(2),
            "cairn {args:?} should exit 2\n{}",
            describe(&out)
        );
        let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
        // clap prints the usage, or for a bad value a pointer to --help
        assert!(
            err.contains("usage") || err.contains("--help"),
            "cairn {args:?}: no usage on stderr\n{}",
            describe(&out)
        );
        assert!(!err.contains("panicked"), "cairn {args:?} panicked");
    }
    assert!(!Path::new("/tmp/cairn-never-created").exists());
    let help = cairn_ok(&["--help"]);
    for sub in ["mkfs", "mount", "umount", "check", "info"] {
        assert!(help.contains(sub), "--help does not mention {sub}:\n{help}");
    }
    // `cairn completions bash | head -1`: the reader goes away early; cairn
    // stops quietly (it panicked on the broken pipe). Both scripts are
    // larger than a pipe's buffer, so the write does meet a closed pipe.
    for shell in ["bash", "zsh"] {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{CAIRN} completions {shell} | head -c 10 >/dev/null"
            ))
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && err.is_empty(), "{shell}: {err}");
    }
}

/// Reports printed into a pipe whose reader is gone (`cairn info P |
/// head` when head has finished) end quietly: no panic, no backtrace.
#[test]
fn reports_into_a_closed_pipe_end_quietly() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let fs = Fs::create();
    fs.mkfs(&[]);
    let pool = fs.pool.to_str().unwrap();
    for args in [
        vec!["info", pool],
        vec!["info", pool, "--json"],
        vec!["check", pool],
    ] {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors were just made by pipe2 and are ours.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read);
        let out = std::process::Command::new(CAIRN)
            .args(&args)
            .stdout(std::process::Stdio::from(write))
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.is_empty(),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
}

#[test]
fn cli_rejects_bad_values_without_creating_a_pool() {
    let fs = Fs::create();
    let pool = fs.pool.to_str().unwrap().to_string();
    let dev = fs.dev("d0");
    let cases: Vec<Vec<String>> = vec![
        vec!["--device".into(), format!("floppy:{dev}:64M")],
        vec!["--device".into(), "ssd".into()],
        vec!["--device".into(), format!("ssd:{dev}:lots")],
        vec!["--record-size".into(), "banana".into()],
    ];
    for extra in cases {
        let mut args = vec!["mkfs".to_string(), pool.clone()];
        args.extend(extra.iter().cloned());
        assert_clean_failure(&cairn(&args), &format!("cairn {args:?}"));
        let out = cairn(&["check", pool.as_str()]);
        assert!(
            !out.status.success(),
            "rejected mkfs {extra:?} left a valid pool behind"
        );
    }
}

#[test]
fn mkfs_twice_needs_force() {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    fs.mount();
    mkfile(&fs.p("keep"), b"precious");
    fs.unmount();
    let pool = fs.pool.to_str().unwrap().to_string();
    assert_clean_failure(
        &cairn(&["mkfs", pool.as_str()]),
        "second mkfs without --force",
    );
    fs.check();
    fs.mount();
    assert_eq!(
        fs::read(fs.p("keep")).unwrap(),
        b"precious",
        "failed mkfs damaged the pool"
    );
    fs.unmount();
    cairn_ok(&["mkfs", pool.as_str(), "--force", "--sparse"]);
    fs.check();
    fs.mount();
    assert!(
        !fs.p("keep").exists(),
        "mkfs --force did not create a fresh pool"
    );
    fs.finish();
}

#[test]
fn mount_of_non_pool_fails_clearly() {
    let fs = Fs::create();
    let notpool = fs.dir.join("notpool");
    fs::create_dir(&notpool).unwrap();
    mkfile(&notpool.join("random.txt"), b"not a pool");
    let missing = fs.dir.join("missing");
    for src in [&notpool, &missing] {
        for fg in [true, false] {
            let mut cmd = Command::new(CAIRN);
            cmd.arg("mount").arg(src).arg(&fs.mnt);
            if fg {
                cmd.arg("--foreground");
            }
            let out = run_timeout(&mut cmd, Duration::from_secs(30));
            let what = format!("mount {} (foreground={fg})", src.display());
            assert_clean_failure(&out, &what);
            let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
            let name = src.file_name().unwrap().to_str().unwrap();
            assert!(
                err.contains("pool") || err.contains(name),
                "{what}: unclear error\n{}",
                describe(&out)
            );
            assert_eq!(mount_fstype(&fs.mnt), None, "{what}: something got mounted");
        }
    }
    for p in [&notpool, &missing] {
        let out = cairn(&[std::ffi::OsStr::new("check"), p.as_os_str()]);
        assert_clean_failure(&out, &format!("check {}", p.display()));
    }
}

fn info_json(fs: &Fs) -> json::Json {
    let out = cairn_ok(&[
        std::ffi::OsStr::new("info"),
        fs.pool.as_os_str(),
        "--json".as_ref(),
    ]);
    let j =
        json::parse(&out).unwrap_or_else(|e| panic!("cairn info --json is not JSON ({e}):\n{out}"));
    for key in [
        "format_version",
        "current_tid",
        "files",
        "logical_bytes",
        "physical_bytes",
    ] {
        assert!(
            j.get(key).and_then(|v| v.as_u64()).is_some(),
            "info: {key} missing or not an integer:\n{out}"
        );
    }
    assert!(
        j.get("devices").and_then(|d| d.as_array()).is_some(),
        "info: no devices array:\n{out}"
    );
    j
}

fn num(j: &json::Json, key: &str) -> u64 {
    j.get(key)
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("{key} missing in {j:?}"))
}

/// Checks the devices array against (class, path, size) and returns total used.
fn check_devices(j: &json::Json, want: &[(&str, &str, u64)]) -> u64 {
    let devs = j.get("devices").unwrap().as_array().unwrap();
    assert_eq!(devs.len(), want.len(), "devices: {devs:?}");
    let mut used = 0;
    for (class, path, size) in want {
        let d = devs
            .iter()
            .find(|d| d.get("class").and_then(|c| c.as_str()) == Some(class));
        let d = d.unwrap_or_else(|| panic!("no {class} device in {devs:?}"));
        let p = d.get("path").and_then(|p| p.as_str()).expect("device path");
        assert_eq!(
            Path::new(p).canonicalize().unwrap(),
            Path::new(path).canonicalize().unwrap()
        );
        let (sz, u) = (num(d, "size"), num(d, "used"));
        assert!(
            sz <= *size && sz >= size / 10 * 9,
            "{class} size {sz}, expected about {size}"
        );
        assert!(u <= sz, "{class} used {u} > size {sz}");
        used += u;
    }
    used
}

#[test]
fn info_json_reports_devices_and_usage() {
    let mut fs = Fs::create();
    let (a, b) = (fs.dev("nvme0"), fs.dev("hdd0"));
    fs.mkfs(&[
        "--device",
        &format!("nvme:{a}:64M"),
        "--device",
        &format!("hdd:{b}:256M"),
    ]);
    let want = [
        ("nvme", a.as_str(), 64 << 20),
        ("hdd", b.as_str(), 256 << 20),
    ];
    let j0 = info_json(&fs);
    let used0 = check_devices(&j0, &want);
    fs.mount();
    let f = File::create(fs.p("ten")).unwrap();
    (&f).write_all(&pattern(2, 10 * MIB)).unwrap();
    f.sync_all().unwrap();
    drop(f);
    for i in 0..3 {
        mkfile(&fs.p(&format!("small{i}")), b"small");
    }
    fs.unmount();
    let j1 = info_json(&fs);
    let used1 = check_devices(&j1, &want);
    assert!(num(&j1, "files") >= 4, "files: {j1:?}");
    assert!(
        num(&j1, "logical_bytes") >= 10 * MIB as u64,
        "logical_bytes: {j1:?}"
    );
    assert!(
        num(&j1, "physical_bytes") >= 9 * MIB as u64,
        "physical_bytes (random data): {j1:?}"
    );
    assert!(
        num(&j1, "current_tid") > num(&j0, "current_tid"),
        "tid did not advance"
    );
    assert!(
        used1 >= used0 + 9 * MIB as u64,
        "device used {used0} -> {used1}"
    );
    let plain = cairn_ok(&[std::ffi::OsStr::new("info"), fs.pool.as_os_str()]);
    assert!(!plain.trim().is_empty(), "cairn info printed nothing");
    fs.check();
}

#[test]
fn check_detects_corruption() {
    let mut fs = Fs::create();
    let dev = fs.dev("ssd0");
    fs.mkfs(&["--device", &format!("ssd:{dev}:64M")]);
    fs.mount();
    let f = File::create(fs.p("victim")).unwrap();
    (&f).write_all(&pattern(4, 24 * MIB)).unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs.unmount();
    fs.check();
    let d = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
        .unwrap();
    let len = d.metadata().unwrap().len();
    let mut off = MIB as u64;
    while off + 4096 <= len {
        let mut buf = [0u8; 64];
        d.read_exact_at(&mut buf, off).unwrap();
        buf.iter_mut().for_each(|b| *b ^= 0x5a);
        d.write_all_at(&buf, off).unwrap();
        off += 256 * 1024 + 4096;
    }
    d.sync_all().unwrap();
    let out = cairn(&[std::ffi::OsStr::new("check"), fs.pool.as_os_str()]);
    assert!(
        !out.status.success(),
        "cairn check missed corruption of {dev}\n{}",
        describe(&out)
    );
    assert!(
        code(&out) != Some(101),
        "cairn check panicked\n{}",
        describe(&out)
    );
    assert!(
        !out.stdout.is_empty() || !out.stderr.is_empty(),
        "check printed no problems"
    );
}

// ---------------------------------------------------------- full device

fn write_synced(p: &Path, seed: u64, len: usize) -> io::Result<()> {
    let mut f = File::create(p)?;
    f.write_all(&pattern(seed, len))?;
    f.sync_all()
}

/// Writes 4 MiB files until ENOSPC; returns the (name, seed) of complete ones.
fn fill_until_enospc(fs: &Fs) -> Vec<(String, u64)> {
    let mut done = Vec::new();
    for i in 0..64u64 {
        let name = format!("fill{i:02}");
        match write_synced(&fs.p(&name), i, 4 * MIB) {
            Ok(()) => done.push((name, i)),
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return done,
            Err(e) => panic!("writing {name}: expected success or ENOSPC, got {e}"),
        }
    }
    panic!("no ENOSPC after writing 256 MiB to a 64 MiB device");
}

fn verify_fill(fs: &Fs, files: &[(String, u64)]) {
    for (name, seed) in files {
        check_file(&fs.p(name), &pattern(*seed, 4 * MIB), name);
    }
}

#[test]
fn full_device_enospc_then_space_freed() {
    let mut fs = Fs::create();
    let dev = fs.dev("ssd0");
    fs.mkfs(&["--device", &format!("ssd:{dev}:64M")]);
    fs.mount_args = vec!["--commit-interval".into(), "1".into()];
    fs.mount();
    let st = statvfs(&fs.mnt);
    assert!(
        st.f_blocks * st.f_frsize <= 64 << 20,
        "statfs total larger than the 64 MiB device"
    );
    let files = fill_until_enospc(&fs);
    assert!(
        files.len() >= 4,
        "ENOSPC after only {} MiB on a 64 MiB device",
        files.len() * 4
    );
    verify_fill(&fs, &files);
    fs.unmount();
    fs.check();
    fs.mount();
    verify_fill(&fs, &files);
    for e in fs::read_dir(&fs.mnt).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().starts_with("fill") {
            fs::remove_file(e.path()).unwrap();
        }
    }
    // all but one of the files that fitted before must fit again
    let again: Vec<u64> = (1..files.len() as u64).map(|i| 100 + i).collect();
    for seed in &again {
        let r = write_synced(&fs.p(&format!("again{seed}")), *seed, 4 * MIB);
        r.unwrap_or_else(|e| panic!("space not freed after deleting everything: again{seed}: {e}"));
    }
    for seed in &again {
        check_file(
            &fs.p(&format!("again{seed}")),
            &pattern(*seed, 4 * MIB),
            "rewritten file",
        );
    }
    fs.finish();
}

// ------------------------------------------------ daemon mode, signals

#[test]
fn daemon_mode_mount_returns_once_mounted() {
    let mut fs = Fs::create();
    fs.mkfs(&[]);
    let out = cairn(&[
        std::ffi::OsStr::new("mount"),
        fs.pool.as_os_str(),
        fs.mnt.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "daemon mount failed\n{}",
        describe(&out)
    );
    // fusermount3 records the type as "fuse" (the subtype is not kept).
    assert!(
        matches!(
            mount_fstype(&fs.mnt).as_deref(),
            Some("fuse.cairn") | Some("fuse")
        ),
        "not mounted when `cairn mount` returned"
    );
    mkfile(&fs.p("hello"), b"from the daemon");
    let out = cairn_umount(&fs.mnt);
    assert!(
        out.status.success(),
        "cairn umount of the daemon mount\n{}",
        describe(&out)
    );
    assert!(
        wait_unmounted(&fs.mnt, Duration::from_secs(10)),
        "still mounted after cairn umount"
    );
    assert!(
        fs.pool.join("cairn.log").is_file(),
        "no POOL/cairn.log from the daemon"
    );
    let gone = eventually(Duration::from_secs(20), || fs.daemon_pids().is_empty());
    assert!(
        gone,
        "daemon still running 20 s after cairn umount\n{}",
        fs.diagnostics()
    );
    fs.mount();
    assert_eq!(fs::read(fs.p("hello")).unwrap(), b"from the daemon");
    fs.finish();
}

#[test]
fn sigterm_and_sigint_unmount_cleanly() {
    let mut fs = Fs::new();
    for (i, sig) in [libc::SIGTERM, libc::SIGINT].into_iter().enumerate() {
        let data = pattern(i as u64, 3 * MIB);
        mkfile(&fs.p(&format!("f{i}")), &data); // no fsync: the clean exit must flush
        fs.signal(sig);
        let st = fs.wait_exit(Duration::from_secs(30));
        assert!(
            st.success(),
            "daemon exit status {st} after signal {sig}\n{}",
            fs.diagnostics()
        );
        assert!(
            wait_unmounted(&fs.mnt, Duration::from_secs(10)),
            "signal {sig} left the mount behind"
        );
        fs.check();
        fs.mount();
        check_file(
            &fs.p(&format!("f{i}")),
            &data,
            &format!("file written before signal {sig}"),
        );
    }
    fs.finish();
}
