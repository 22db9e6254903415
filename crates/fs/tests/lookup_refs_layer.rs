//! Kernel lookup references at the filesystem layer: an inode whose last
//! link goes while the kernel still holds lookups of it stays readable by
//! inode number until FORGET, then goes; after a crash nothing of it stays.

use cairn_fs::maintenance::check::check_pool;
use cairn_fs::{Ctx, Fs, FsError, RenameFlags, ROOT_INO};

mod common;
use common::{make, reopen};

/// A closed file `name` in `dir` holding `data`.
fn file(fs: &Fs, dir: u64, name: &[u8], data: &[u8]) -> u64 {
    let i = fs.create(Ctx::ROOT, dir, name, 0o644).unwrap();
    fs.write(i.ino, 0, data).unwrap();
    fs.release(i.ino);
    i.ino
}

fn data(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// Opens `ino` by number and reads it whole, as the kernel does after a
/// lookup.
fn open_read(fs: &Fs, ino: u64) -> Result<Vec<u8>, FsError> {
    let i = fs.open_file(ino)?;
    let r = fs.read(ino, 0, i.size as u32 + 1);
    fs.release(ino);
    r
}

#[test]
fn looked_up_inode_outlives_unlink_until_forget() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let v1 = data(1, 200_000);
    let x = file(&fs, ROOT_INO, b"f", &v1);
    assert_eq!(fs.lookup_ref(ROOT_INO, b"f").unwrap().ino, x);
    assert_eq!(fs.lookup_refs(x), 1);
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert!(matches!(fs.lookup(ROOT_INO, b"f"), Err(FsError::NotFound)));
    assert_eq!(fs.getattr(x).unwrap().nlink, 0);
    assert_eq!(open_read(&fs, x).unwrap(), v1);
    fs.flush().unwrap();
    assert_eq!(open_read(&fs, x).unwrap(), v1, "after a flush");
    fs.forget(x, 1);
    assert_eq!(fs.lookup_refs(x), 0);
    assert!(matches!(fs.getattr(x), Err(FsError::NotFound)));
    assert!(matches!(fs.open_file(x), Err(FsError::NotFound)));

    // Without lookup references an unlink deletes at once, as before.
    let y = file(&fs, ROOT_INO, b"g", b"gone");
    fs.unlink(ROOT_INO, b"g").unwrap();
    assert!(matches!(fs.getattr(y), Err(FsError::NotFound)));

    // The root is never counted, so never forgotten.
    fs.getattr_ref(ROOT_INO).unwrap();
    assert_eq!(fs.lookup_refs(ROOT_INO), 0);
    fs.forget(ROOT_INO, 1);
    fs.getattr(ROOT_INO).unwrap();

    fs.shutdown().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert_eq!(rep.inodes, 1, "only the root is left");
}

#[test]
fn rename_over_a_looked_up_file_keeps_it_for_open() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let dir = fs.mkdir(Ctx::ROOT, ROOT_INO, b"dir", 0o755).unwrap().ino;
    let (old, new) = (data(2, 70_000), data(3, 5_000));
    let a = file(&fs, dir, b"article", &old);
    let b = file(&fs, dir, b"article.tmp", &new);
    // The kernel resolved `article` (a readdirplus entry counts too).
    fs.getattr_ref(a).unwrap();
    fs.lookup_ref(dir, b"article").unwrap();
    assert_eq!(fs.lookup_refs(a), 2);
    fs.rename(dir, b"article.tmp", dir, b"article", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.lookup(dir, b"article").unwrap().ino, b);
    assert_eq!(open_read(&fs, a).unwrap(), old);
    assert_eq!(open_read(&fs, b).unwrap(), new);

    // Open and looked up: the first to go does not delete it.
    let i = fs.open_file(a).unwrap();
    assert_eq!(i.nlink, 0);
    fs.forget_many(&[(a, 1), (b, 5)]);
    assert_eq!(fs.lookup_refs(a), 1);
    fs.forget(a, 1);
    assert_eq!(fs.read(a, 0, 100).unwrap(), old[..100]);
    fs.release(a);
    assert!(matches!(fs.getattr(a), Err(FsError::NotFound)));
    assert_eq!(fs.getattr(b).unwrap().nlink, 1, "b has its name");

    // A removed directory the kernel still holds takes no new entries.
    let sub = fs.mkdir(Ctx::ROOT, dir, b"sub", 0o755).unwrap().ino;
    fs.add_lookup_ref(sub);
    fs.rmdir(dir, b"sub").unwrap();
    assert!(matches!(
        fs.create(Ctx::ROOT, sub, b"x", 0o644),
        Err(FsError::NotFound)
    ));
    assert!(matches!(
        fs.rename(dir, b"article", sub, b"x", RenameFlags::default()),
        Err(FsError::NotFound)
    ));
    assert!(matches!(fs.link(b, sub, b"x"), Err(FsError::NotFound)));
    fs.forget(sub, 1);
    assert!(matches!(fs.getattr(sub), Err(FsError::NotFound)));

    // A link brings a looked-up unlinked file back: FORGET keeps it then.
    let c = file(&fs, dir, b"c", b"relinked");
    fs.lookup_ref(dir, b"c").unwrap();
    fs.unlink(dir, b"c").unwrap();
    fs.link(c, dir, b"c2").unwrap();
    fs.forget(c, 1);
    assert_eq!(open_read(&fs, c).unwrap(), b"relinked");

    fs.shutdown().unwrap();
    drop(fs);
    let fs = reopen(d.path());
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert_eq!(rep.inodes, 4, "root, dir, article and c2");
}

#[test]
fn crash_while_only_looked_up_leaves_nothing() {
    let d = tempfile::tempdir().unwrap();
    let fs = make(d.path());
    let keep = file(&fs, ROOT_INO, b"keep", &data(4, 100_000));
    let x = file(&fs, ROOT_INO, b"victim", &data(5, 300_000));
    fs.flush().unwrap();
    fs.lookup_ref(ROOT_INO, b"victim").unwrap();
    fs.unlink(ROOT_INO, b"victim").unwrap();
    // The orphan is committed; the daemon dies before FORGET.
    fs.flush().unwrap();
    assert_eq!(fs.pool().meta.read().unwrap().orphans().unwrap(), vec![x]);
    assert_eq!(open_read(&fs, x).unwrap(), data(5, 300_000));
    drop(fs); // no shutdown: like kill -9

    let fs = reopen(d.path());
    assert!(matches!(fs.getattr(x), Err(FsError::NotFound)));
    assert!(fs.pool().meta.read().unwrap().orphans().unwrap().is_empty());
    assert_eq!(open_read(&fs, keep).unwrap(), data(4, 100_000));
    let rep = check_pool(fs.pool()).unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert_eq!(rep.inodes, 2, "the root and keep");
}
