//! Real NBD clients against the in-process server: nbdinfo (list, map),
//! nbdcopy and qemu-img (copies in and out, checksums compared), qemu-io
//! (pattern write and read, EPERM on the read-only export), and nbdfuse
//! with a loop device carrying an ext4 filesystem that fsck finds clean.

mod common;

use cairn_nbd::{Export, MemExport, ServerConfig, StaticExports};
use common::*;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

/// A 64 MiB sparse image with random data at a few offsets.
fn sparse_image(path: &Path, seed: u64) {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut f = std::fs::File::create(path).unwrap();
    f.set_len(SIZE).unwrap();
    for (off, len) in [
        (0u64, 70_000usize),
        (5 << 20, 1 << 20),
        (40 << 20, 12_345),
        (SIZE - 4096, 4096),
    ] {
        let mut b = vec![0u8; len];
        rng.fill_bytes(&mut b);
        f.seek(SeekFrom::Start(off)).unwrap();
        f.write_all(&b).unwrap();
    }
}

#[test]
fn nbdinfo_lists_the_exports() {
    let (_, ex) = disk_exports();
    let s = start_tcp(ex, ServerConfig::default());
    let a = tcp_addr(&s);
    let out = run_ok("nbdinfo", &["--list", "--json", &format!("nbd://{a}")]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let exports = v["exports"].as_array().expect("exports array");
    let names: Vec<&str> = exports
        .iter()
        .map(|e| e["export-name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["disk", "disk@snap"], "{out}");
    assert_eq!(exports[0]["description"], "test disk");
    assert_eq!(exports[0]["export-size"], SIZE);
    assert_eq!(exports[0]["is_read_only"], false);
    assert_eq!(exports[1]["is_read_only"], true);
    assert_eq!(exports[0]["can_multi_conn"], true);
    assert_eq!(exports[0]["block_size_preferred"], 4096, "{out}");
}

/// (offset, length, type) of each extent `nbdinfo --map` prints.
fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, u64)> {
    let out = run_ok("nbdinfo", &["--map", "--json", uri]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let field = |e: &serde_json::Value, k: &str| e[k].as_u64().unwrap();
    let extents = v.as_array().unwrap().iter();
    extents
        .map(|e| (field(e, "offset"), field(e, "length"), field(e, "type")))
        .collect()
}

/// The allocation map of a volume of a real pool: its stored records are
/// data, the rest holes (whole 64 KiB records, committed or buffered).
#[test]
fn nbdinfo_map_of_a_pool_volume() {
    let dir = tempfile::tempdir().unwrap();
    let (fs, ino) = pool_with_volume(&dir.path().join("pool"));
    fs.write(ino, 1 << 20, &[9u8; 65536]).unwrap();
    fs.flush().unwrap();
    fs.write(ino, 8 << 20, &[1u8; 4096]).unwrap();
    let ex = Arc::new(cairn_nbd::PoolExports::new(fs.clone()));
    let addr = "127.0.0.1:0".parse().unwrap();
    let cfg = ServerConfig {
        insecure_tcp: true,
        ..ServerConfig::default()
    };
    let s = cairn_nbd::serve_tcp(addr, ex, cfg).unwrap();
    let r = 65536;
    let want = vec![
        (0, 1 << 20, 3),
        (1 << 20, r, 0),
        ((1 << 20) + r, (7 << 20) - r, 3),
        (8 << 20, r, 0),
        ((8 << 20) + r, SIZE - (8 << 20) - r, 3),
    ];
    assert_eq!(nbdinfo_map(&uri(&s, "vol")), want);
}

#[test]
fn nbdinfo_map_shows_holes_and_data() {
    let (disk, ex) = disk_exports();
    disk.write(1 << 20, &[9u8; 65536], false).unwrap();
    disk.write(8 << 20, &[1u8; 4096], false).unwrap();
    let s = start_tcp(ex, ServerConfig::default());
    let got = nbdinfo_map(&uri(&s, "disk"));
    let want = vec![
        (0, 1 << 20, 3),
        (1 << 20, 65536, 0),
        ((1 << 20) + 65536, (7 << 20) - 65536, 3),
        (8 << 20, 4096, 0),
        ((8 << 20) + 4096, SIZE - (8 << 20) - 4096, 3),
    ];
    assert_eq!(got, want);
    assert!(s.stats().command("block_status").count >= 1);
}

#[test]
fn nbdcopy_in_and_out_keeps_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src.img"), dir.path().join("back.img"));
    sparse_image(&src, 1);
    let (_, ex) = disk_exports();
    let s = start_tcp(ex, ServerConfig::default());
    run_ok("nbdcopy", &[src.to_str().unwrap(), &uri(&s, "disk")]);
    run_ok("nbdcopy", &[&uri(&s, "disk"), back.to_str().unwrap()]);
    assert_eq!(sha256(&src), sha256(&back));
    let st = s.stats();
    assert!(st.command("write").bytes >= (1 << 20) + 70_000, "{st:?}");
    assert_eq!(st.command("write").errors + st.command("read").errors, 0);
}

#[test]
fn qemu_img_convert_in_and_out() {
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src.img"), dir.path().join("back.img"));
    sparse_image(&src, 2);
    let (_, ex) = disk_exports();
    let s = start_tcp(ex, ServerConfig::default());
    let (src_s, back_s) = (src.to_str().unwrap(), back.to_str().unwrap());
    run_ok(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src_s,
            &uri(&s, "disk"),
        ],
    );
    run_ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &uri(&s, "disk"),
            back_s,
        ],
    );
    assert_eq!(sha256(&src), sha256(&back));
}

#[test]
fn qemu_io_pattern_write_and_read() {
    let (_, ex) = disk_exports();
    let s = start_tcp(ex, ServerConfig::default());
    let u = uri(&s, "disk");
    let out = run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0xab 0 64k",
            "-c",
            "read -P 0xab 0 64k",
            "-c",
            "read -P 0 64k 64k",
            &u,
        ],
    );
    assert!(out.contains("wrote 65536/65536"), "{out}");
    assert_eq!(out.matches("read 65536/65536").count(), 2, "{out}");
    assert!(!out.contains("verification failed"), "{out}");
}

#[test]
fn qemu_io_sees_the_read_only_export_as_read_only() {
    let (_, ex) = disk_exports();
    let s = start_tcp(ex, ServerConfig::default());
    let u = uri(&s, "disk@snap");
    // The export advertises READ_ONLY: qemu refuses a writable open...
    let o = run("qemu-io", &["-f", "raw", "-c", "write -P 0xab 0 4k", &u]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("Permission denied"),
        "{err}"
    );
    // ...reads it read-only, and refuses writes itself.
    let o = run(
        "qemu-io",
        &[
            "-r",
            "-f",
            "raw",
            "-c",
            "read -P 0 0 64k",
            "-c",
            "write 0 4k",
            &u,
        ],
    );
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(out.contains("read 65536/65536"), "{out}");
    assert!(
        !out.contains("wrote") && err.contains("read-only"),
        "{out}{err}"
    );
    assert_eq!(s.stats().command("write").count, 0);
}

/// A writable-looking export whose writes fail with EPERM (as a
/// snapshot's would if a client ignored READ_ONLY).
struct DeniedWrites(MemExport);

impl Export for DeniedWrites {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read(off, buf)
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> io::Result<()> {
        Err(io::ErrorKind::PermissionDenied.into())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, _: u64, _: u64) -> io::Result<()> {
        Err(io::ErrorKind::PermissionDenied.into())
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool) -> io::Result<()> {
        Err(io::ErrorKind::PermissionDenied.into())
    }
    fn block_status(&self, off: u64, len: u32) -> io::Result<Vec<(u32, u32)>> {
        self.0.block_status(off, len)
    }
}

#[test]
fn qemu_io_reports_eperm_from_the_server() {
    let ex = StaticExports::new().with("denied", "", Arc::new(DeniedWrites(MemExport::new(SIZE))));
    let s = start_tcp(ex, ServerConfig::default());
    let o = run(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0xab 0 4k", &uri(&s, "denied")],
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("Operation not permitted"), "{text}");
    let w = s.stats().command("write");
    assert_eq!((w.count, w.errors), (1, 1));
}
