//! A real S3 server for tests: s3s-fs (a file-backed S3 server, installed
//! by `scripts/deps.sh test`) on a loopback port, with one bucket. Tests
//! that need it fail with a clear message when it is missing: they never
//! skip silently. The server can be stopped and started again on the
//! same port and directory (the store "down" and "back").

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl S3Server {
    /// Starts s3s-fs with a bucket `TEST_BUCKET`; panics with how to
    /// install it when the binary is missing.
    pub fn start() -> S3Server {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join(TEST_BUCKET)).expect("bucket dir");
        let mut s = S3Server {
            port: free_port(),
            root,
            child: None,
        };
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
        self.root.path().join(TEST_BUCKET)
    }

    /// Starts the server (again) on its port and directory and waits until
    /// it accepts connections.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "s3s-fs already running");
        let bin = s3s_fs_binary();
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", TEST_KEY_ID, "--secret-key", TEST_SECRET])
            .arg(self.root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start the S3 test server {} ({e}): install it with `bash scripts/deps.sh test` \
                     (cargo install s3s-fs --features binary --version 0.14.1 --locked) or set S3S_FS",
                    bin.display()
                )
            });
        self.child = Some(child);
        wait_listening(self.port);
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

fn wait_listening(port: u16) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("s3s-fs did not listen on port {port} within 20 s");
}

impl Drop for S3Server {
    fn drop(&mut self) {
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
