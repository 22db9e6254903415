//! Pool configuration: `POOL/cairn.toml`, human-editable. Settings that can
//! change during the pool's life live here; those fixed at mkfs live in the
//! superblock. Mount flags override the file.

use crate::error::{FsError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const CONFIG_FORMAT: u32 = 1;

/// Largest config file read (what Cairn writes is under 4 KiB).
pub const CONFIG_MAX_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Version of this file's layout.
    pub format: u32,
    /// Seconds between automatic commits of buffered writes: what a crash
    /// may lose of writes nobody synced.
    pub commit_interval_secs: f64,
    /// Seconds between commits of the element tree while the intent log
    /// takes the changes in between: at each `commit_interval_secs` that is
    /// not one, a tick stores the buffered blocks where they stay and logs
    /// the changes naming them (`writeback/tick.rs`). At or below
    /// `commit_interval_secs`, every interval commits the tree.
    pub tree_commit_secs: f64,
    /// Buffered (dirty) data that triggers a flush, in MiB. Writers are
    /// throttled at twice this.
    pub dirty_limit_mib: u64,
    /// CPU priority (nice, 0 to 19) of the background threads: the flusher
    /// and its hashing threads, GC, the tier mover. Requests run at the
    /// daemon's own priority and get the cores first; 0 makes them equal.
    pub background_nice: u32,
    /// Fine-grained history is kept at least this long (seconds); older
    /// history is pruned automatically. When the pool runs short of space,
    /// history is pruned earlier so that deleting files frees space.
    pub history_retention_secs: u64,
    /// Page cache of the metadata store, in MiB.
    pub meta_cache_mib: u64,
    /// Size of the intent log file (`POOL/intent.log`, two regions), in
    /// MiB: a snapshot goes through the log when the changes since the last
    /// commit fit a quarter of it (each region keeps two copies of its
    /// records). Applied at an open that finds nothing in the log to replay.
    pub intent_log_mib: u64,
    /// Set for one mount by `cairn mount --discard-damaged-log`, never read
    /// from or written to the file: an intent log damaged in both copies of
    /// a record is replayed up to that record and the rest of its run is
    /// dropped, instead of refusing the mount.
    #[serde(skip)]
    pub discard_damaged_log: bool,
    /// Set for one mount by `cairn mount --degraded`, never read from or
    /// written to the file: a pool whose missing devices hold the only
    /// copy of some data mounts read-only (those files give EIO) instead
    /// of being refused.
    #[serde(skip)]
    pub degraded: bool,
    /// Automatic snapshots (`cairn snapshot auto`) kept by prune: the newest
    /// of each of the last N days, ISO weeks and months (UTC) that have one.
    pub keep_daily: u32,
    pub keep_weekly: u32,
    pub keep_monthly: u32,
    /// How new chunks are compressed: "none", "lz4", "zstd" or "zstd:LEVEL".
    /// Each chunk records its method, so this can change at any time.
    pub compression: String,
    /// Inline dedup: a block whose content is already stored costs only a
    /// reference. Turning it off stops both lookups and indexing.
    pub dedup: bool,
    /// Background GC: every this many seconds (0: off), compact segments
    /// whose live data fell below gc_max_live_pct, copying at most
    /// gc_rate_mib MiB/s.
    pub gc_interval_secs: u64,
    pub gc_max_live_pct: u32,
    pub gc_rate_mib: u64,
    /// RAM read cache for chunks whose home is slower than the fastest tier
    /// (EPRD), in MiB; 0 turns it off.
    pub read_cache_mib: u64,
    /// Read-ahead for sequential reads from hard disks, in KiB (into the
    /// RAM read cache); 0 turns it off.
    pub readahead_kib: u32,
    /// SSD read cache fill limits (swapcache): a burst allowance and a
    /// long-term rate, so the cache device is not worn out.
    pub cache_fill_burst_mib: u64,
    pub cache_fill_rate_mib: u64,
    /// Tier mover: a round every this many seconds (0: off).
    pub tier_interval_secs: u64,
    /// Heat halves every this many seconds.
    pub tier_heat_halflife_secs: u64,
    /// Decayed reads that make a segment on a slower tier hot (promoted).
    pub tier_promote_hits: f64,
    /// A segment not read for this long may be demoted (btier max_age).
    pub tier_demote_idle_secs: u64,
    /// Faster tiers are kept at most this full (percent): demotion makes
    /// room above it and promotion stops at it.
    pub tier_fast_full_pct: u32,
    /// Tier moves copy at most this many MiB/s.
    pub tier_rate_mib: u64,
    /// Re-replication (copies made after a device is lost or replaced, or
    /// the policy raised) copies at most this many MiB/s (0: as fast as
    /// the devices go; it steps aside for client writes either way).
    pub resilver_rate_mib: u64,
    /// Re-replication looks at the segment table at least this often
    /// (seconds), besides whenever something may need it.
    pub resilver_interval_secs: u64,
    /// A write or sync of one copy among several that takes longer than
    /// this (seconds) faults its device and drops the copy, so that a hung
    /// disk does not hold every commit (0: wait forever).
    pub io_timeout_secs: u64,
    /// The mount daemon serves the pool's volumes over NBD on this TCP
    /// address ("" : not on TCP), e.g. "127.0.0.1:10809".
    pub nbd_listen: String,
    /// ... and/or on this Unix socket, created 0600 ("" : not).
    pub nbd_socket: String,
    /// TCP clients must use TLS with the certificates in this directory
    /// (made by `cairn nbd tls-init DIR`; "" : none). TCP NBD needs this or
    /// `nbd_insecure`.
    pub nbd_tls: String,
    /// Serve NBD over TCP without TLS: any local user can then read and
    /// write every volume.
    pub nbd_insecure: bool,
    /// Allows an nbd_listen address that is not loopback (no
    /// authentication, no TLS: only on a trusted network).
    pub nbd_allow_remote: bool,
    /// NBD worker threads: kept when idle, and at most.
    pub nbd_workers_min: usize,
    pub nbd_workers_max: usize,
    /// s3 tier devices: the longest a request to the object store may take,
    /// retries of 5xx and throttling answers included (seconds); a read of
    /// demoted data fails with EIO after it when the store is down.
    pub s3_timeout_secs: u64,
    /// Retries of a failed object-store request within s3_timeout_secs.
    pub s3_retries: usize,
    /// A file (mode 0600 or narrower: a wider one is refused) holding
    /// `aws_access_key_id = ...` and `aws_secret_access_key = ...`; empty:
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the environment.
    pub s3_credentials_file: String,
    /// The mount daemon serves Prometheus metrics (/metrics) and a
    /// read-only dashboard (/) on this TCP address ("" : off, the default),
    /// e.g. "127.0.0.1:9469".
    pub metrics_listen: String,
    /// Allows a metrics_listen address that is not loopback (the figures
    /// and the dashboard are readable without authentication).
    pub metrics_allow_remote: bool,
    /// Seconds between refreshes of the figures that scan the pool (file
    /// counts, logical bytes, dedup and compression ratios); the cheap ones
    /// are read at each scrape.
    pub metrics_scan_interval_secs: u64,
    /// Serves the dashboard's routes that give the pool's and devices'
    /// paths and snapshot names (/api/info, /api/tier, /api/snapshots);
    /// off, they answer 403 and /metrics gives only figures.
    pub metrics_detail: bool,
    /// A file (mode 0600 or narrower: a wider one is refused) holding a
    /// token every metrics and dashboard request must carry
    /// (`Authorization: Bearer TOKEN`, or a browser's login with the token
    /// as password); empty: none.
    pub metrics_token_file: String,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            format: CONFIG_FORMAT,
            commit_interval_secs: 5.0,
            tree_commit_secs: 60.0,
            dirty_limit_mib: 512,
            background_nice: 10,
            history_retention_secs: 86400,
            meta_cache_mib: 256,
            intent_log_mib: 128,
            discard_damaged_log: false,
            degraded: false,
            keep_daily: 7,
            keep_weekly: 4,
            keep_monthly: 6,
            compression: "none".into(),
            dedup: true,
            gc_interval_secs: 60,
            gc_max_live_pct: 50,
            gc_rate_mib: 64,
            read_cache_mib: 256,
            readahead_kib: 1024,
            cache_fill_burst_mib: 1024,
            cache_fill_rate_mib: 16,
            tier_interval_secs: 30,
            tier_heat_halflife_secs: 3600,
            tier_promote_hits: 4.0,
            tier_demote_idle_secs: 600,
            tier_fast_full_pct: 90,
            tier_rate_mib: 64,
            resilver_rate_mib: 0,
            resilver_interval_secs: 60,
            io_timeout_secs: 30,
            nbd_listen: String::new(),
            nbd_socket: String::new(),
            nbd_tls: String::new(),
            nbd_insecure: false,
            nbd_allow_remote: false,
            nbd_workers_min: 2,
            nbd_workers_max: 128,
            s3_timeout_secs: 10,
            s3_retries: 5,
            s3_credentials_file: String::new(),
            metrics_listen: String::new(),
            metrics_allow_remote: false,
            metrics_scan_interval_secs: 30,
            metrics_detail: false,
            metrics_token_file: String::new(),
        }
    }
}

impl PoolConfig {
    pub fn load(path: &Path) -> Result<PoolConfig> {
        let bad = |why: String| FsError::Config(format!("{}: {why}", path.display()));
        let raw = cairn_devices::private::read_small(path, CONFIG_MAX_BYTES)
            .map_err(|e| bad(format!("cannot read: {e}")))?;
        let text = String::from_utf8(raw).map_err(|_| bad("not UTF-8 text".into()))?;
        let c: PoolConfig = toml::from_str(&text).map_err(|e| bad(toml_error(&e, &text)))?;
        if c.format != CONFIG_FORMAT {
            return Err(bad(format!(
                "format = {}: unknown config format (this build reads {CONFIG_FORMAT})",
                c.format
            )));
        }
        c.validate().map_err(|e| bad(e.to_string()))?;
        Ok(c)
    }

    /// Checks every value; the error names the key, its value and what is
    /// allowed.
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, val: &dyn std::fmt::Display, want: &str| {
            Err(FsError::Config(format!("{key} = {val}: {want}")))
        };
        if !(self.commit_interval_secs > 0.0 && self.commit_interval_secs <= 3600.0) {
            return bad(
                "commit_interval_secs",
                &self.commit_interval_secs,
                "must be more than 0 and at most 3600",
            );
        }
        if !(self.tree_commit_secs > 0.0 && self.tree_commit_secs <= 3600.0) {
            return bad(
                "tree_commit_secs",
                &self.tree_commit_secs,
                "must be more than 0 and at most 3600",
            );
        }
        if let Err(e) = self.compression() {
            return bad(
                "compression",
                &format!("{:?}", self.compression),
                &e.to_string(),
            );
        }
        if self.background_nice > 19 {
            return bad("background_nice", &self.background_nice, "must be 0 to 19");
        }
        if !(1..=100).contains(&self.gc_max_live_pct) {
            return bad("gc_max_live_pct", &self.gc_max_live_pct, "must be 1 to 100");
        }
        if !(1..=100).contains(&self.tier_fast_full_pct) {
            return bad(
                "tier_fast_full_pct",
                &self.tier_fast_full_pct,
                "must be 1 to 100",
            );
        }
        if self.tier_promote_hits.is_nan() || self.tier_promote_hits <= 0.0 {
            return bad("tier_promote_hits", &self.tier_promote_hits, "must be > 0");
        }
        if self.readahead_kib > 65536 {
            return bad(
                "readahead_kib",
                &self.readahead_kib,
                "must be at most 65536",
            );
        }
        if !(32..=4096).contains(&self.intent_log_mib) {
            return bad("intent_log_mib", &self.intent_log_mib, "must be 32 to 4096");
        }
        if self.dirty_limit_mib == 0 {
            return bad(
                "dirty_limit_mib",
                &self.dirty_limit_mib,
                "must be more than 0",
            );
        }
        if !(1..=600).contains(&self.s3_timeout_secs) {
            return bad("s3_timeout_secs", &self.s3_timeout_secs, "must be 1 to 600");
        }
        self.validate_memory(machine_memory_mib())?;
        self.validate_nbd()?;
        self.validate_metrics()
    }

    /// The keys that size RAM buffers, against the machine's memory
    /// (`ram_mib`, None: unknown, nothing checked): the dirty limit (writers
    /// buffer up to twice it) and each cache must fit.
    fn validate_memory(&self, ram_mib: Option<u64>) -> Result<()> {
        let Some(ram) = ram_mib else { return Ok(()) };
        let keys = [
            (
                "dirty_limit_mib",
                self.dirty_limit_mib,
                ram / 2,
                " (writers buffer up to twice it)",
            ),
            ("meta_cache_mib", self.meta_cache_mib, ram, ""),
            ("read_cache_mib", self.read_cache_mib, ram, ""),
        ];
        for (key, val, max, why) in keys {
            if val > max {
                return Err(FsError::Config(format!(
                    "{key} = {val}: more than this machine's memory allows ({ram} MiB of RAM: at most {max}{why})"
                )));
            }
        }
        Ok(())
    }

    /// The metrics keys: an address that parses and is loopback unless
    /// allowed; a scan interval of 1 s to a day.
    fn validate_metrics(&self) -> Result<()> {
        let bad = |key: &str, val: &dyn std::fmt::Display, want: &str| {
            Err(FsError::Config(format!("{key} = {val}: {want}")))
        };
        if let Some(a) = self.metrics_address()? {
            if !a.ip().is_loopback() && !self.metrics_allow_remote {
                return bad(
                    "metrics_listen",
                    &format!("{:?}", self.metrics_listen),
                    "is not a loopback address; metrics and the dashboard have no \
                     authentication: allow it with --metrics-allow-remote (or \
                     metrics_allow_remote = true) on a trusted network",
                );
            }
        }
        if !(1..=86400).contains(&self.metrics_scan_interval_secs) {
            return bad(
                "metrics_scan_interval_secs",
                &self.metrics_scan_interval_secs,
                "must be 1 to 86400",
            );
        }
        Ok(())
    }

    /// The TCP address of metrics_listen, None when empty.
    pub fn metrics_address(&self) -> Result<Option<std::net::SocketAddr>> {
        if self.metrics_listen.is_empty() {
            return Ok(None);
        }
        self.metrics_listen.parse().map(Some).map_err(|_| {
            FsError::Config(format!(
                "metrics_listen = {:?}: not an IP address and port (e.g. 127.0.0.1:9469)",
                self.metrics_listen
            ))
        })
    }

    /// How the pool's s3 tier devices reach their store.
    pub fn object_options(&self) -> cairn_devices::ObjectOptions {
        cairn_devices::ObjectOptions {
            client: cairn_objstore::ClientOptions {
                timeout: std::time::Duration::from_secs(self.s3_timeout_secs),
                max_retries: self.s3_retries,
            },
            credentials_file: (!self.s3_credentials_file.is_empty())
                .then(|| std::path::PathBuf::from(&self.s3_credentials_file)),
        }
    }

    /// The NBD keys: an address that parses (and is loopback unless
    /// allowed), worker bounds with 1 <= max, min <= max <= 4096.
    fn validate_nbd(&self) -> Result<()> {
        let bad = |key: &str, val: &dyn std::fmt::Display, want: &str| {
            Err(FsError::Config(format!("{key} = {val}: {want}")))
        };
        if let Some(a) = self.nbd_address()? {
            if !a.ip().is_loopback() && !self.nbd_allow_remote {
                return bad(
                    "nbd_listen",
                    &format!("{:?}", self.nbd_listen),
                    "is not a loopback address; NBD has no authentication: allow it \
                     with --nbd-allow-remote (or nbd_allow_remote = true) on a trusted network",
                );
            }
        }
        if !(1..=4096).contains(&self.nbd_workers_max) {
            return bad(
                "nbd_workers_max",
                &self.nbd_workers_max,
                "must be 1 to 4096",
            );
        }
        if self.nbd_workers_min > self.nbd_workers_max {
            return bad(
                "nbd_workers_min",
                &self.nbd_workers_min,
                &format!("must be at most nbd_workers_max ({})", self.nbd_workers_max),
            );
        }
        Ok(())
    }

    /// The TCP address of nbd_listen, None when empty.
    pub fn nbd_address(&self) -> Result<Option<std::net::SocketAddr>> {
        if self.nbd_listen.is_empty() {
            return Ok(None);
        }
        self.nbd_listen.parse().map(Some).map_err(|_| {
            FsError::Config(format!(
                "nbd_listen = {:?}: not an IP address and port (e.g. 127.0.0.1:10809 or [::1]:10809)",
                self.nbd_listen
            ))
        })
    }

    pub fn compression(&self) -> Result<cairn_data::Compression> {
        self.compression.parse().map_err(FsError::Io)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let text = format!(
            "# Cairn pool configuration (see README). Mount flags override these.\n{}",
            toml::to_string_pretty(self).expect("config serializes")
        );
        cairn_devices::private::write_private(path, text.as_bytes())
            .map_err(|e| FsError::Io(format!("{}: {e}", path.display())))
    }
}

/// The machine's memory in MiB (sysinfo), None if unknown.
fn machine_memory_mib() -> Option<u64> {
    // SAFETY: sysinfo is a plain C struct of integers (and padding), for
    // which all zero bytes are a valid value.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: sysinfo fills the struct we own through a valid pointer.
    if unsafe { libc::sysinfo(&mut si) } != 0 || si.totalram == 0 {
        return None;
    }
    Some((si.totalram as u64).saturating_mul(si.mem_unit.max(1) as u64) >> 20)
}

/// A TOML error on one line: where, and what is wrong (toml's message
/// names the key, e.g. "unknown field `x`, expected one of ...").
fn toml_error(e: &toml::de::Error, text: &str) -> String {
    let what = e.message().trim();
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let src = text.lines().nth(line - 1).unwrap_or("").trim();
            format!("line {line} `{src}`: {what}")
        }
        None => format!("invalid config: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::PoolConfig;

    /// `cairn.toml` pointing at something endless or blocking (a FIFO,
    /// `/dev/zero`) or grown huge is refused with an error naming it, at
    /// once, with bounded memory (each load runs in a thread the test
    /// gives 10 s).
    #[test]
    fn a_config_that_is_not_a_small_regular_file_is_refused() {
        use std::time::Duration;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("cairn.toml");
        let load = |p: &std::path::Path| {
            let p = p.to_path_buf();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(PoolConfig::load(&p).map_err(|e| e.to_string()));
            });
            rx.recv_timeout(Duration::from_secs(10))
                .expect("loading the config hung")
        };
        let mut big = String::from("format = 1\n");
        big.push_str(&"# padding\n".repeat(200_000));
        std::fs::write(&p, big).unwrap();
        let e = load(&p).unwrap_err();
        assert!(e.contains("cairn.toml") && e.contains("larger than"), "{e}");
        std::fs::remove_file(&p).unwrap();
        let fifo = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = load(&p).unwrap_err();
        assert!(e.contains("not a regular file (a FIFO)"), "{e}");
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
        let e = load(&p).unwrap_err();
        assert!(e.contains("character device"), "{e}");
    }

    /// RAM-sized keys beyond the machine's memory are refused, naming the
    /// key, the value and the memory; the defaults pass on this machine.
    #[test]
    fn ram_sized_keys_are_bounded_by_the_machines_memory() {
        PoolConfig::default().validate().unwrap();
        for (c, key, val) in [
            (
                PoolConfig {
                    dirty_limit_mib: 100_000_000,
                    ..PoolConfig::default()
                },
                "dirty_limit_mib",
                "100000000",
            ),
            (
                PoolConfig {
                    meta_cache_mib: 99_999_999,
                    ..PoolConfig::default()
                },
                "meta_cache_mib",
                "99999999",
            ),
        ] {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("{key} = {val}")), "{e}");
            assert!(e.contains("MiB of RAM"), "{e}");
        }
        let small = PoolConfig {
            dirty_limit_mib: 600,
            ..PoolConfig::default()
        };
        let e = small.validate_memory(Some(1024)).unwrap_err().to_string();
        assert!(e.contains("1024 MiB of RAM: at most 512"), "{e}");
        small.validate_memory(Some(2048)).unwrap();
    }

    #[test]
    fn background_nice_is_a_nice_value() {
        for (nice, ok) in [(0, true), (19, true), (20, false)] {
            let c = PoolConfig {
                background_nice: nice,
                ..PoolConfig::default()
            };
            assert_eq!(c.validate().is_ok(), ok, "background_nice {nice}");
        }
    }

    #[test]
    fn intent_log_mib_is_32_to_4096() {
        for (mib, ok) in [
            (0, false),
            (31, false),
            (32, true),
            (4096, true),
            (4097, false),
        ] {
            let c = PoolConfig {
                intent_log_mib: mib,
                ..PoolConfig::default()
            };
            let r = c.validate();
            assert_eq!(r.is_ok(), ok, "intent_log_mib {mib}");
            if let Err(e) = r {
                assert!(e.to_string().contains("intent_log_mib"), "{e}");
            }
        }
    }
}
