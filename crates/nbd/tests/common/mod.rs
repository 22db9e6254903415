//! Shared by the integration tests: servers over MemExports, a raw NBD
//! client (handshake with NBD_OPT_GO, simple and structured replies),
//! and running the external clients, which must be installed
//! (scripts/deps.sh test): a missing tool fails the test, never skips it.
#![allow(dead_code)]

use cairn_nbd::proto::*;
use cairn_nbd::{serve_tcp, Address, MemExport, Server, ServerConfig, StaticExports};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

pub const SIZE: u64 = 64 << 20;

/// A reply slower than this fails the test instead of hanging it.
pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A new pool (sparse devices) at `path`, opened, holding one volume
/// "vol" of SIZE bytes with 4 KiB blocks; returns it and the volume's inode.
pub fn pool_with_volume(path: &Path) -> (Arc<cairn_fs::Fs>, u64) {
    let o = cairn_fs::MkfsOptions {
        sparse: true,
        ..Default::default()
    };
    cairn_fs::mkfs(path, o).unwrap();
    let fs = cairn_fs::Fs::open(cairn_fs::Pool::open(path, None).unwrap()).unwrap();
    let ino = fs.volume_create("vol", SIZE, 4096).unwrap().ino;
    (fs, ino)
}

/// "disk" (writable, 64 MiB) and "disk@snap" (read-only, its snapshot).
pub fn disk_exports() -> (Arc<MemExport>, StaticExports) {
    let disk = Arc::new(MemExport::new(SIZE));
    let snap = Arc::new(disk.snapshot());
    let ex = StaticExports::new()
        .with("disk", "test disk", disk.clone())
        .with("disk@snap", "read-only snapshot", snap);
    (disk, ex)
}

/// A TCP server; plain TCP unless the config gives TLS.
pub fn start_tcp(ex: StaticExports, mut config: ServerConfig) -> Server {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    config.insecure_tcp |= config.tls.is_none();
    serve_tcp(addr, Arc::new(ex), config).expect("server starts")
}

pub fn tcp_addr(s: &Server) -> SocketAddr {
    match s.address() {
        Address::Tcp(a) => *a,
        a => panic!("not TCP: {a:?}"),
    }
}

pub fn uri(s: &Server, name: &str) -> String {
    let a = tcp_addr(s);
    format!("nbd://{}:{}/{}", a.ip(), a.port(), name)
}

/// Runs a tool; a missing tool is a failure with the package to install.
pub fn run(tool: &str, args: &[&str]) -> Output {
    Command::new(tool).args(args).output().unwrap_or_else(|e| {
        panic!("cannot run {tool} ({e}): install the test packages (scripts/deps.sh test)")
    })
}

/// Runs a tool that must succeed; returns its stdout.
pub fn run_ok(tool: &str, args: &[&str]) -> String {
    let o = run(tool, args);
    assert!(
        o.status.success(),
        "{tool} {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn sha256(path: &Path) -> String {
    let out = run_ok("sha256sum", &[path.to_str().unwrap()]);
    out.split_whitespace().next().unwrap().to_owned()
}

/// A stream of either kind.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// A minimal NBD client speaking the raw protocol.
pub struct Client {
    pub s: Box<dyn Stream>,
    pub size: u64,
    pub tflags: u16,
    pub structured: bool,
    cookie: u64,
}

/// One option reply: (reply type, data).
pub type OptReply = (u32, Vec<u8>);

impl Client {
    pub fn tcp(a: SocketAddr) -> Client {
        let s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        Client::raw(Box::new(s))
    }

    pub fn unix(p: &Path) -> Client {
        let s = UnixStream::connect(p).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        Client::raw(Box::new(s))
    }

    fn raw(s: Box<dyn Stream>) -> Client {
        Client {
            s,
            size: 0,
            tflags: 0,
            structured: false,
            cookie: 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        let mut b = [0; 2];
        self.s.read_exact(&mut b).unwrap();
        u16::from_be_bytes(b)
    }
    pub fn u32(&mut self) -> u32 {
        let mut b = [0; 4];
        self.s.read_exact(&mut b).unwrap();
        u32::from_be_bytes(b)
    }
    pub fn u64(&mut self) -> u64 {
        let mut b = [0; 8];
        self.s.read_exact(&mut b).unwrap();
        u64::from_be_bytes(b)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0; n];
        self.s.read_exact(&mut b).unwrap();
        b
    }

    /// Reads the greeting and sends the client flags.
    pub fn greet(&mut self) {
        assert_eq!(self.u64(), NBDMAGIC);
        assert_eq!(self.u64(), IHAVEOPT);
        let f = self.u16();
        assert_eq!(f & FLAG_FIXED_NEWSTYLE, FLAG_FIXED_NEWSTYLE);
        let cf = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
        self.s.write_all(&cf.to_be_bytes()).unwrap();
    }

    pub fn send_option(&mut self, opt: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    pub fn option_reply(&mut self, opt: u32) -> OptReply {
        assert_eq!(self.u64(), OPT_REPLY_MAGIC);
        assert_eq!(self.u32(), opt);
        let kind = self.u32();
        let len = self.u32() as usize;
        (kind, self.bytes(len))
    }

    /// Sends an option and reads replies up to ACK or an error.
    pub fn option(&mut self, opt: u32, data: &[u8]) -> Vec<OptReply> {
        self.send_option(opt, data);
        let mut out = Vec::new();
        loop {
            let r = self.option_reply(opt);
            let last = r.0 == REP_ACK || r.0 & (1 << 31) != 0;
            out.push(r);
            if last {
                return out;
            }
        }
    }

    /// Full handshake: greeting, optional structured replies and
    /// base:allocation, NBD_OPT_GO. Panics unless it succeeds.
    pub fn go(&mut self, name: &str, structured: bool) {
        self.greet();
        self.open(name, structured);
    }

    /// `go` after the greeting.
    pub fn open(&mut self, name: &str, structured: bool) {
        if structured {
            let r = self.option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(r.last().unwrap().0, REP_ACK);
            let r = self.option(OPT_SET_META_CONTEXT, &meta_data(name, &[BASE_ALLOCATION]));
            assert_eq!(r.len(), 2, "{r:?}");
            self.structured = true;
        }
        let r = self.option(OPT_GO, &info_data(name, &[]));
        assert_eq!(r.last().unwrap().0, REP_ACK, "{r:?}");
        let info = &r.iter().find(|x| x.0 == REP_INFO).unwrap().1;
        self.size = u64::from_be_bytes(info[2..10].try_into().unwrap());
        self.tflags = u16::from_be_bytes(info[10..12].try_into().unwrap());
    }

    /// The next request's header, under a new cookie.
    fn next_request(&mut self, kind: u16, flags: u16, offset: u64, length: u32) -> Request {
        self.cookie += 1;
        Request {
            flags,
            kind,
            cookie: self.cookie,
            offset,
            length,
        }
    }

    pub fn send(&mut self, kind: u16, flags: u16, offset: u64, length: u32, data: &[u8]) -> u64 {
        let mut b = self
            .next_request(kind, flags, offset, length)
            .encode()
            .to_vec();
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
        self.cookie
    }

    /// Requests without payload (kind, offset, length), sent in one write,
    /// so that all of them wait in the socket before the server reads the
    /// first; returns their cookies.
    pub fn send_many(&mut self, reqs: &[(u16, u64, u32)]) -> Vec<u64> {
        let mut b = Vec::new();
        let mut cookies = Vec::new();
        for &(kind, offset, length) in reqs {
            let r = self.next_request(kind, 0, offset, length);
            b.extend_from_slice(&r.encode());
            cookies.push(r.cookie);
        }
        self.s.write_all(&b).unwrap();
        cookies
    }

    /// Reads the simple replies of READs of `len` bytes, one per cookie
    /// in any order, and checks that each succeeded.
    pub fn read_replies(&mut self, cookies: &[u64], len: usize) {
        let mut seen = Vec::new();
        for _ in cookies {
            assert_eq!(self.u32(), SIMPLE_REPLY_MAGIC);
            assert_eq!(self.u32(), 0);
            seen.push(self.u64());
            self.bytes(len);
        }
        seen.sort();
        assert_eq!(seen, cookies);
    }

    /// One request with a simple reply: (error, data of a READ).
    pub fn request(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        data: &[u8],
    ) -> (u32, Vec<u8>) {
        assert!(!self.structured);
        let cookie = self.send(kind, flags, offset, length, data);
        assert_eq!(self.u32(), SIMPLE_REPLY_MAGIC);
        let err = self.u32();
        assert_eq!(self.u64(), cookie);
        let data = if kind == CMD_READ && err == 0 {
            self.bytes(length as usize)
        } else {
            Vec::new()
        };
        (err, data)
    }

    /// Reads one structured chunk: (flags, type, cookie, payload).
    pub fn chunk(&mut self) -> (u16, u16, u64, Vec<u8>) {
        assert_eq!(self.u32(), STRUCTURED_REPLY_MAGIC);
        let flags = self.u16();
        let kind = self.u16();
        let cookie = self.u64();
        let len = self.u32() as usize;
        (flags, kind, cookie, self.bytes(len))
    }

    pub fn read(&mut self, off: u64, len: u32) -> (u32, Vec<u8>) {
        self.request(CMD_READ, 0, off, len, &[])
    }

    pub fn write(&mut self, off: u64, data: &[u8]) -> u32 {
        self.request(CMD_WRITE, 0, off, data.len() as u32, data).0
    }

    pub fn disconnect(mut self) {
        self.send(CMD_DISC, 0, 0, 0, &[]);
    }
}

pub fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

pub fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    b
}
