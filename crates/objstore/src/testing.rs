//! A real S3 server for tests: s3s-fs (a file-backed S3 server, installed
//! by `scripts/deps.sh test`) on a loopback port, with one bucket. Tests
//! that need it fail with a clear message when it is missing: they never
//! skip silently. The server can be stopped and started again on the
//! same port and directory (the store "down" and "back").
//!
//! A server counts as up only when the listening socket on its port is
//! one of its own file descriptors: a test never talks to another test's
//! server that happened to get the same port.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const TEST_KEY_ID: &str = "cairntestkey";
pub const TEST_SECRET: &str = "cairn-test-secret-0123456789";
pub const TEST_BUCKET: &str = "cairn-test";

pub struct S3Server {
    pub port: u16,
    pub root: tempfile::TempDir,
    child: Option<Child>,
}

/// The s3s-fs binary: $S3S_FS, else ~/.cargo/bin/s3s-fs, else on PATH.
pub fn s3s_fs_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("S3S_FS") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let cargo = home.join(".cargo/bin/s3s-fs");
    if cargo.exists() {
        return cargo;
    }
    PathBuf::from("s3s-fs")
}

/// Ports already handed to a server of this process: never handed out
/// twice, so parallel tests (and a stopped server's port) stay apart.
static TAKEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        if TAKEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

impl S3Server {
    /// Starts s3s-fs with a bucket `TEST_BUCKET`; panics with how to
    /// install it when the binary is missing. A server that loses its port
    /// to another process before it binds it is started again on another.
    pub fn start() -> S3Server {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("store").join(TEST_BUCKET)).expect("bucket dir");
        let mut s = S3Server {
            port: free_port(),
            root,
            child: None,
        };
        for _ in 0..4 {
            match s.try_resume() {
                Ok(()) => return s,
                Err(e) => eprintln!("s3s-fs on port {}: {e}; another port", s.port),
            }
            s.port = free_port();
        }
        s.resume();
        s
    }

    /// http://127.0.0.1:PORT
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A device spec for `prefix` in the test bucket.
    pub fn spec(&self, prefix: &str) -> String {
        format!("s3:{TEST_BUCKET}/{prefix}:endpoint={}", self.endpoint())
    }

    /// The directory holding the bucket's objects (s3s-fs keeps each
    /// object as a file named by its key).
    pub fn bucket_dir(&self) -> PathBuf {
        self.store().join(TEST_BUCKET)
    }

    /// The directory s3s-fs serves (one subdirectory per bucket).
    fn store(&self) -> PathBuf {
        self.root.path().join("store")
    }

    /// Starts the server (again) on its port and directory and waits until
    /// it listens there.
    pub fn resume(&mut self) {
        if let Err(e) = self.try_resume() {
            panic!("s3s-fs on port {}: {e}", self.port);
        }
    }

    /// Its log (stderr), kept beside the directory it serves.
    fn log(&self) -> PathBuf {
        self.root.path().join("s3s-fs.log")
    }

    fn try_resume(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "s3s-fs already running");
        let bin = s3s_fs_binary();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .expect("s3s-fs log");
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", TEST_KEY_ID, "--secret-key", TEST_SECRET])
            .arg(self.store())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start the S3 test server {} ({e}): install it with `bash scripts/deps.sh test` \
                     (cargo install s3s-fs --features binary --version 0.14.1 --locked) or set S3S_FS",
                    bin.display()
                )
            });
        self.child = Some(child);
        let up = self.wait_listening();
        if up.is_err() {
            self.stop();
        }
        up
    }

    /// Waits until the socket listening on the port is the child's own;
    /// an error when the child exits first (its log says why) or after
    /// 20 s.
    fn wait_listening(&mut self) -> Result<(), String> {
        let t = Instant::now();
        let child = self.child.as_mut().expect("s3s-fs started");
        while t.elapsed() < Duration::from_secs(20) {
            if let Some(st) = child.try_wait().expect("wait for s3s-fs") {
                let log = std::fs::read_to_string(self.log()).unwrap_or_default();
                return Err(format!("exited ({st}) before it listened: {log}"));
            }
            if listening_socket(self.port).is_some_and(|ino| holds_socket(child.id(), ino)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("did not listen within 20 s".into())
    }

    /// Stops the server (SIGKILL): the store is down.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: a frozen child must run to die of SIGKILL cleanly.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGCONT) };
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes the server (SIGSTOP): connections are accepted by the
    /// kernel but never answered, a store that hangs.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.child.as_ref().expect("s3s-fs not running").id() as libc::pid_t;
        // SAFETY: signals our own child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    /// Keys of the objects under `prefix` in the bucket (read from the
    /// server's directory, not through S3).
    pub fn objects(&self, prefix: &str) -> Vec<String> {
        let dir = self.bucket_dir().join(prefix);
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// The inode of the socket listening on 127.0.0.1:`port`, from
/// /proc/net/tcp (local address in hex, state 0A = LISTEN).
fn listening_socket(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && f[1] == local && f[3] == "0A")
            .then(|| f[9].parse().ok())
            .flatten()
    })
}

/// Whether process `pid` has socket `inode` among its file descriptors.
fn holds_socket(pid: u32, inode: u64) -> bool {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
    })
}

impl Drop for S3Server {
    /// Stops the server; in a failing test, first says whether it was
    /// still running and prints the tail of its log.
    fn drop(&mut self) {
        if std::thread::panicking() {
            let state = match self.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(None)) => "running".to_string(),
                Some(Ok(Some(st))) => format!("exited ({st})"),
                Some(Err(e)) => format!("unknown ({e})"),
                None => "stopped by the test".to_string(),
            };
            let log = std::fs::read(self.log()).unwrap_or_default();
            let tail = String::from_utf8_lossy(&log[log.len().saturating_sub(4000)..]);
            eprintln!("[s3s-fs on port {}: {state}; log tail]\n{tail}", self.port);
        }
        self.stop();
    }
}

/// Writes a 0600 credentials file for the test server's keys.
pub fn write_credentials(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(
        path,
        format!("aws_access_key_id = {TEST_KEY_ID}\naws_secret_access_key = {TEST_SECRET}\n"),
    )
    .expect("credentials file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port some other process listens on does not count as the
    /// server's: the server fails to bind it and that is an error, where
    /// a connect test would have taken the stranger for it.
    #[test]
    fn a_port_held_by_another_listener_is_not_taken_for_the_server() {
        let stranger = TcpListener::bind("127.0.0.1:0").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("store").join(TEST_BUCKET)).unwrap();
        let mut s = S3Server {
            port: stranger.local_addr().unwrap().port(),
            root,
            child: None,
        };
        let err = s
            .try_resume()
            .expect_err("took another listener for the server");
        assert!(err.contains("exited"), "{err}");
        assert!(s.child.is_none());
        // And start() finds a port of its own, where it answers.
        let s = S3Server::start();
        assert!(std::net::TcpStream::connect(("127.0.0.1", s.port)).is_ok());
        assert_ne!(s.port, stranger.local_addr().unwrap().port());
    }
}
