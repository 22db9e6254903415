//! Helpers for the history, snapshot and dedup tests: TIDs and `@@` paths,
//! JSON output of the history commands, whole-tree capture and comparison,
//! file-content comparison, reads that bypass the page cache, pool info, and
//! cairn commands that must fail, run in the background, are timed, or are
//! interrupted by kill -9 of the daemon, and a reader thread that checks
//! files while their chunks are moved.

use super::json::{self, Json};
use super::{assert_bytes_eq, cairn, describe, first_diff, wait_until, Fs, CAIRN, CMD_TIMEOUT};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read, Seek};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// `@@0x<16 hex digits>`: the suffix that names a version of a path.
pub fn tid_suffix(tid: u64) -> String {
    format!("@@0x{tid:016x}")
}

/// `path@@0x<tid>` (the suffix is appended to the last component).
pub fn at_tid(path: &Path, tid: u64) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(tid_suffix(tid));
    PathBuf::from(s)
}

/// `MNT/@@0x<tid>`: the whole tree at `tid`.
pub fn root_at(mnt: &Path, tid: u64) -> PathBuf {
    mnt.join(tid_suffix(tid))
}

/// `MNT/.snapshots/NAME`.
pub fn snap_root(mnt: &Path, name: &str) -> PathBuf {
    mnt.join(".snapshots").join(name)
}

/// Parses `0x` + 16 hex digits (exactly, as `cairn sync` prints it).
pub fn parse_hex_tid(s: &str) -> Option<u64> {
    let h = s.strip_prefix("0x")?;
    if h.len() != 16 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(h, 16).ok()
}

/// Shown arguments of a command line, for messages.
pub fn shown<S: AsRef<OsStr>>(args: &[S]) -> String {
    let v: Vec<_> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    format!("cairn {}", v.join(" "))
}

/// Runs cairn, asserts success and parses stdout as JSON.
#[track_caller]
pub fn cairn_json<S: AsRef<OsStr>>(args: &[S]) -> Json {
    let out = cairn(args);
    assert!(
        out.status.success(),
        "{} failed\n{}",
        shown(args),
        describe(&out)
    );
    parse_json_out(args, &out)
}

/// Parses the stdout of a finished command as JSON (panics with context).
#[track_caller]
pub fn parse_json_out<S: AsRef<OsStr>>(args: &[S], out: &Output) -> Json {
    let text = String::from_utf8_lossy(&out.stdout);
    json::parse(text.trim()).unwrap_or_else(|e| {
        panic!(
            "{}: stdout is not JSON ({e})\n{}",
            shown(args),
            describe(out)
        )
    })
}

/// `cairn sync TARGET`: checks the output format and returns the TID.
#[track_caller]
pub fn sync_tid(target: &Path) -> u64 {
    let args = [OsStr::new("sync"), target.as_os_str()];
    let out = cairn(&args);
    assert!(
        out.status.success(),
        "{} failed\n{}",
        shown(&args),
        describe(&out)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.trim_end_matches('\n');
    assert!(
        !line.contains('\n'),
        "cairn sync must print one line, got {text:?}"
    );
    parse_hex_tid(line)
        .unwrap_or_else(|| panic!("cairn sync must print 0x + 16 hex digits, got {text:?}"))
}

/// Member `key` of a JSON object, panicking with the whole value if absent.
#[track_caller]
pub fn field<'a>(j: &'a Json, key: &str) -> &'a Json {
    j.get(key)
        .unwrap_or_else(|| panic!("JSON has no field {key:?}: {j:?}"))
}

#[track_caller]
pub fn field_u64(j: &Json, key: &str) -> u64 {
    field(j, key)
        .as_u64()
        .unwrap_or_else(|| panic!("JSON field {key:?} is not an unsigned integer: {j:?}"))
}

/// A JSON number (integer or not) as f64.
#[track_caller]
pub fn field_f64(j: &Json, key: &str) -> f64 {
    match field(j, key) {
        Json::Num(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("JSON field {key:?} is not a number: {j:?}")),
        other => panic!("JSON field {key:?} is not a number: {other:?} in {j:?}"),
    }
}

#[track_caller]
pub fn field_str<'a>(j: &'a Json, key: &str) -> &'a str {
    field(j, key)
        .as_str()
        .unwrap_or_else(|| panic!("JSON field {key:?} is not a string: {j:?}"))
}

#[track_caller]
pub fn field_bool(j: &Json, key: &str) -> bool {
    match field(j, key) {
        Json::Bool(b) => *b,
        other => panic!("JSON field {key:?} is not a boolean: {other:?} in {j:?}"),
    }
}

#[track_caller]
pub fn field_arr<'a>(j: &'a Json, key: &str) -> &'a [Json] {
    field(j, key)
        .as_array()
        .unwrap_or_else(|| panic!("JSON field {key:?} is not an array: {j:?}"))
}

/// `cairn info POOL --json` (unmounted pool).
#[track_caller]
pub fn pool_info(pool: &Path) -> Json {
    cairn_json(&[OsStr::new("info"), pool.as_os_str(), OsStr::new("--json")])
}

/// One entry of `cairn snapshot list TARGET --json`, by name.
#[track_caller]
pub fn snapshot_list(target: &Path) -> Vec<Json> {
    let j = cairn_json(&[
        OsStr::new("snapshot"),
        OsStr::new("list"),
        target.as_os_str(),
        OsStr::new("--json"),
    ]);
    j.as_array()
        .unwrap_or_else(|| panic!("snapshot list --json is not an array: {j:?}"))
        .to_vec()
}

/// `cairn snapshot create TARGET NAME --json`: the created snapshot's TID.
#[track_caller]
pub fn snapshot_create(target: &Path, name: &str) -> Json {
    let j = cairn_json(&[
        OsStr::new("snapshot"),
        OsStr::new("create"),
        target.as_os_str(),
        OsStr::new(name),
        OsStr::new("--json"),
    ]);
    assert_eq!(field_str(&j, "name"), name, "snapshot create --json: {j:?}");
    field_u64(&j, "tid");
    j
}

/// Waits until the background hash of snapshot `name` is recorded; returns
/// its list entry.
#[track_caller]
pub fn wait_snapshot_hash(target: &Path, name: &str, timeout: Duration) -> Json {
    let t0 = std::time::Instant::now();
    loop {
        let list = snapshot_list(target);
        let e = list
            .iter()
            .find(|e| e.get("name").and_then(Json::as_str) == Some(name))
            .unwrap_or_else(|| panic!("snapshot {name} not in snapshot list: {list:?}"))
            .clone();
        match field(&e, "hash") {
            Json::Str(_) => return e,
            Json::Null if t0.elapsed() < timeout => std::thread::sleep(Duration::from_millis(100)),
            Json::Null => {
                panic!("snapshot {name}: hash still null after {timeout:?}: {e:?}")
            }
            other => panic!("snapshot {name}: hash is neither a string nor null: {other:?}"),
        }
    }
}

/// `cairn snapshot verify TARGET NAME --json`: (exit code, report).
pub fn snapshot_verify(target: &Path, name: &str) -> (i32, Json) {
    let args = [
        OsStr::new("snapshot"),
        OsStr::new("verify"),
        target.as_os_str(),
        OsStr::new(name),
        OsStr::new("--json"),
    ];
    let out = super::run_timeout(
        std::process::Command::new(super::CAIRN).args(args),
        CMD_TIMEOUT,
    );
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 3,
        "{}: exit status must be 0 or 3\n{}",
        shown(&args),
        describe(&out)
    );
    (code, parse_json_out(&args, &out))
}

/// Asserts that snapshot `name` has the same content hash on two mounted
/// pools (`snapshot verify`, which reads all its data on both).
#[track_caller]
pub fn assert_same_snapshot_hash(a: &Path, b: &Path, name: &str) {
    let (x, y) = (snapshot_verify(a, name).1, snapshot_verify(b, name).1);
    assert_eq!(
        field_str(&x, "computed"),
        field_str(&y, "computed"),
        "snapshot {name}"
    );
}

// ------------------------------------------------------------------ trees

/// One entry of a captured tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    File {
        perm: u32,
        nlink: u64,
        data: Vec<u8>,
    },
    Dir {
        perm: u32,
        nlink: u64,
    },
    Link(PathBuf),
}

/// Relative path -> entry, for everything below a root (the root excluded).
pub type Tree = BTreeMap<String, Node>;

/// Reads a file with its page cache dropped first, so the data comes from
/// the daemon and not from pages cached before (e.g. before a reblock).
pub fn read_uncached(p: &Path) -> io::Result<Vec<u8>> {
    let mut f = File::open(p)?;
    // SAFETY: posix_fadvise on the fd of a File open here; it takes no pointer.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

/// Captures the tree below `root` (contents, permissions, link counts,
/// symlink targets). Any error is returned with the path that caused it.
pub fn capture(root: &Path) -> Result<Tree, String> {
    let mut t = Tree::new();
    capture_dir(root, "", &mut t)?;
    Ok(t)
}

fn capture_dir(root: &Path, rel: &str, t: &mut Tree) -> Result<(), String> {
    let dir = root.join(rel);
    let err = |p: &Path, e: io::Error| format!("{}: {e}", p.display());
    let rd = fs::read_dir(&dir).map_err(|e| err(&dir, e))?;
    for e in rd {
        let e = e.map_err(|e| err(&dir, e))?;
        let name = e.file_name().into_string().expect("utf-8 names");
        let r = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let p = root.join(&r);
        let md = fs::symlink_metadata(&p).map_err(|e| err(&p, e))?;
        let perm = md.mode() & 0o7777;
        if md.file_type().is_symlink() {
            let target = fs::read_link(&p).map_err(|e| err(&p, e))?;
            t.insert(r, Node::Link(target));
        } else if md.is_dir() {
            t.insert(
                r.clone(),
                Node::Dir {
                    perm,
                    nlink: md.nlink(),
                },
            );
            capture_dir(root, &r, t)?;
        } else {
            let data = read_uncached(&p).map_err(|e| err(&p, e))?;
            if data.len() as u64 != md.len() {
                return Err(format!(
                    "{}: st_size {} but {} bytes read",
                    p.display(),
                    md.len(),
                    data.len()
                ));
            }
            t.insert(
                r,
                Node::File {
                    perm,
                    nlink: md.nlink(),
                    data,
                },
            );
        }
    }
    Ok(())
}

/// Compact description of a node for messages.
pub fn node_desc(n: &Node) -> String {
    match n {
        Node::File { perm, nlink, data } => format!(
            "file perm={perm:o} nlink={nlink} len={} fnv={:016x}",
            data.len(),
            fnv(data)
        ),
        Node::Dir { perm, nlink } => format!("dir perm={perm:o} nlink={nlink}"),
        Node::Link(t) => format!("symlink -> {}", t.display()),
    }
}

fn fnv(d: &[u8]) -> u64 {
    d.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Asserts two trees are equal, listing the first differences.
#[track_caller]
pub fn assert_tree_eq(got: &Tree, want: &Tree, ctx: &str) {
    if got == want {
        return;
    }
    let mut diffs = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => diffs.push(format!("missing {p} ({})", node_desc(w))),
            Some(g) if g != w => {
                let mut d = format!("{p}: got {} want {}", node_desc(g), node_desc(w));
                if let (Node::File { data: gd, .. }, Node::File { data: wd, .. }) = (g, w) {
                    if let Some(i) = super::first_diff(gd, wd) {
                        d.push_str(&format!(" (first differing byte {i})"));
                    }
                }
                diffs.push(d);
            }
            _ => {}
        }
    }
    for (p, g) in got {
        if !want.contains_key(p) {
            diffs.push(format!("unexpected {p} ({})", node_desc(g)));
        }
    }
    let n = diffs.len();
    diffs.truncate(15);
    panic!(
        "{ctx}: trees differ ({n} differences, {} vs {} entries got/want):\n  {}",
        got.len(),
        want.len(),
        diffs.join("\n  ")
    );
}

/// Captures `root` and compares it with `want`.
#[track_caller]
pub fn assert_tree_at(root: &Path, want: &Tree, ctx: &str) {
    let got = capture(root).unwrap_or_else(|e| panic!("{ctx}: reading the tree failed: {e}"));
    assert_tree_eq(&got, want, ctx);
}

/// Just the file contents of a tree (path -> bytes).
pub fn contents(t: &Tree) -> BTreeMap<String, Vec<u8>> {
    t.iter()
        .filter_map(|(p, n)| match n {
            Node::File { data, .. } => Some((p.clone(), data.clone())),
            _ => None,
        })
        .collect()
}

/// Captures the view at `root` and compares it with `want`: a view shows
/// the tree exactly as it was, modes included (changes get EROFS).
#[track_caller]
pub fn assert_view_at(root: &Path, want: &Tree, ctx: &str) {
    assert_tree_at(root, want, ctx);
}

/// Path -> content of regular files.
pub type Files = BTreeMap<String, Vec<u8>>;

/// Reads `p` (bypassing cached pages) and compares with `want`.
#[track_caller]
pub fn assert_file(p: &Path, want: &[u8], what: &str) {
    let got = read_uncached(p).unwrap_or_else(|e| panic!("{what}: read {}: {e}", p.display()));
    assert_bytes_eq(&got, want, &format!("{what} ({})", p.display()));
}

/// Contents of all regular files below `root`, failing on anything else.
#[track_caller]
pub fn contents_at(root: &Path, ctx: &str) -> Files {
    let t = capture(root).unwrap_or_else(|e| panic!("{ctx}: reading the tree failed: {e}"));
    contents(&t)
}

/// Compares path -> bytes maps, listing the first differences.
#[track_caller]
pub fn assert_contents_eq(got: &Files, want: &Files, ctx: &str) {
    if got == want {
        return;
    }
    let mut d = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => d.push(format!("missing {p} ({} bytes)", w.len())),
            Some(g) => {
                if let Some(i) = first_diff(g, w) {
                    d.push(format!(
                        "{p}: differs at byte {i} (len got {} want {})",
                        g.len(),
                        w.len()
                    ));
                }
            }
        }
    }
    for (p, g) in got {
        if !want.contains_key(p) {
            d.push(format!("unexpected {p} ({} bytes)", g.len()));
        }
    }
    let n = d.len();
    d.truncate(15);
    panic!("{ctx}: {n} differences:\n  {}", d.join("\n  "));
}

/// Asserts that a cairn command fails; returns (exit code, stderr).
#[track_caller]
pub fn cairn_fails<S: AsRef<OsStr>>(args: &[S]) -> (i32, String) {
    let out = cairn(args);
    assert!(
        !out.status.success(),
        "{} should have failed\n{}",
        shown(args),
        describe(&out)
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Spawns cairn with `args` without waiting (output to anonymous files).
pub fn spawn_cairn<S: AsRef<OsStr>>(args: &[S]) -> (Child, File, File) {
    let out = tempfile::tempfile().unwrap();
    let err = tempfile::tempfile().unwrap();
    let child = Command::new(CAIRN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .spawn()
        .expect("spawn cairn");
    (child, out, err)
}

/// Everything written to an anonymous output file of `spawn_cairn`.
pub fn read_back(mut f: File) -> String {
    let mut s = String::new();
    f.rewind().unwrap();
    f.read_to_string(&mut s).unwrap();
    s
}

/// Runs `cairn ARGS` to completion (blocking wait, so the time is exact)
/// and returns how long it took and its stdout.
pub fn timed(args: &[&OsStr]) -> (Duration, String) {
    let t0 = Instant::now();
    let out = Command::new(CAIRN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run cairn");
    let took = t0.elapsed();
    assert!(
        out.status.success(),
        "{} failed\n{}",
        shown(args),
        describe(&out)
    );
    (took, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Starts `cairn ARGS`, kills the daemon after `delay`, and reports whether
/// the command was still running at that moment.
pub fn kill_during(fs: &mut Fs, args: &[&OsStr], delay: Duration, ctx: &str) -> bool {
    let (mut child, out, err) = spawn_cairn(args);
    thread::sleep(delay);
    let in_flight = child.try_wait().unwrap().is_none();
    fs.kill9();
    let st = wait_until(&mut child, Duration::from_secs(30));
    let Some(st) = st else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{ctx}: `{}` still running 30 s after the daemon was killed",
            shown(args)
        );
    };
    if !in_flight {
        assert!(
            st.success(),
            "{ctx}: `{}` failed before the kill\nstdout: {}\nstderr: {}",
            shown(args),
            read_back(out),
            read_back(err)
        );
    }
    in_flight
}

/// Reader thread: reads random files of `files` below `root` (uncached)
/// until `stop` while something (`doing`, e.g. "being reblocked") moves
/// their chunks; every read must return the right bytes. Counts reads in
/// `iters`.
pub fn check_reads(
    root: PathBuf,
    files: Files,
    seed: u64,
    stop: Arc<AtomicBool>,
    iters: Arc<AtomicU64>,
    doing: &str,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let names: Vec<&String> = files.keys().collect();
    while !stop.load(Ordering::SeqCst) {
        let s = names[rng.gen_range(0..names.len())];
        let got = read_uncached(&root.join(s)).map_err(|e| format!("reading {s}: {e}"))?;
        if let Some(i) = first_diff(&got, &files[s]) {
            return Err(format!("{s} ({doing}) read wrong at byte {i}"));
        }
        iters.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}

/// The tree the mirror tests (mirror.rs, mirror_s3.rs) start from: a
/// directory, a 3 MiB file, a hard link, a symlink, a sparse file with
/// bytes in the middle, and an xattr.
pub fn mirror_first_tree(s: &Fs) {
    std::fs::create_dir_all(s.p("docs/deep")).unwrap();
    std::fs::write(s.p("docs/a.txt"), b"alpha\n").unwrap();
    std::fs::write(s.p("docs/deep/big"), super::pattern(1, 3 << 20)).unwrap();
    std::fs::hard_link(s.p("docs/a.txt"), s.p("hard")).unwrap();
    std::os::unix::fs::symlink("docs/a.txt", s.p("sym")).unwrap();
    let sparse = std::fs::File::create(s.p("sparse")).unwrap();
    sparse.set_len(10 << 20).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(s.p("sparse"))
        .unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(5 << 20)).unwrap();
    std::io::Write::write_all(&mut f, b"in the middle").unwrap();
    super::sh(&s.mnt, "setfattr -n user.color -v blue docs/a.txt");
}
