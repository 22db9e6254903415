//! Whether the CPUs this process may use are contended, and whether a
//! cgroup CPU limit applies to it, for the ring thread monitor
//! (`uring_sched.rs`); added by Cairn.
//!
//! In a CPU-limited cgroup (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us`
//! on hosts that still mount the v1 cpu controller) the host-wide run queue
//! says nothing about this process: a container limited to one CPU on a
//! busy 64-CPU host, or an idle one on a quiet host, looks the same. There
//! the process counts as busy when its cgroup was throttled (it used up its
//! quota) or its tasks waited for a CPU more than `PRESSURE` of the time
//! (`cpu.pressure`, PSI, when present). Only without a limit is the host's
//! run queue (`procs_running` of /proc/stat) compared with the host's CPUs,
//! and where the host reports pressure (/proc/pressure/cpu) its tasks must
//! also have waited for a CPU more than `HOST_PRESSURE` of the period: the
//! run queue read at one instant also counts the hand-offs of a load that
//! waits on the daemon (postmark: 13-23% of its periods looked busy, and
//! each cost its ring threads two policy changes per batch), which stall
//! the host 8-15% of the time, where a load that keeps the CPUs busy
//! stalls it close to all of the time.

use std::path::Path;
use std::path::PathBuf;
use std::time::Instant;

/// Share of wall time the cgroup's tasks may wait for a CPU (PSI "some")
/// before the CPUs count as busy.
const PRESSURE: f64 = 0.10;

/// Share of wall time some task of the host must have waited for a CPU
/// (PSI "some" of /proc/pressure/cpu) for a long run queue to count as
/// contended.
const HOST_PRESSURE: f64 = 0.25;

/// The host's CPU pressure file.
const HOST_PSI: &str = "/proc/pressure/cpu";

/// A cgroup CPU limit: `cpus` CPUs' worth of time, set in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Limit {
    pub(crate) dir: PathBuf,
    pub(crate) cpus: f64,
}

/// Counters read at one instant, for the difference to the next.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    /// Microseconds some task of the cgroup waited for a CPU (PSI total).
    stalled_us: Option<u64>,
    /// Periods in which the limiting cgroup was throttled.
    throttled: Option<u64>,
}

/// Where this process's CPU use is limited and measured.
#[derive(Debug)]
pub(crate) struct CpuLoad {
    limit: Option<Limit>,
    /// The process's cgroup v2 directory, for `cpu.pressure`, unless it
    /// is the root cgroup.
    v2_dir: Option<PathBuf>,
    last: Option<Sample>,
}

impl CpuLoad {
    /// Looks up this process's cgroups and the tightest limit on them.
    pub(crate) fn detect() -> Self {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let dirs = CgroupDirs::find(&cgroups, &mounts);
        let limit = dirs.limit();
        // The root cgroup (which alone has no cgroup.type) reports the
        // whole host's pressure, not this process's.
        let v2_dir = dirs.v2.map(|(dir, _)| dir);
        Self {
            limit,
            v2_dir: v2_dir.filter(|d| d.join("cgroup.type").exists()),
            last: None,
        }
    }

    pub(crate) fn limit(&self) -> Option<&Limit> {
        self.limit.as_ref()
    }

    /// True when the CPUs were contended since the last call (the first
    /// call compares with nothing under a limit, and says not busy).
    pub(crate) fn busy(&mut self) -> bool {
        let Some(limit) = &self.limit else {
            let now = Sample {
                at: Instant::now(),
                stalled_us: psi_some_total(Path::new(HOST_PSI)),
                throttled: None,
            };
            let last = self.last.replace(now);
            return host_contended(host_busy(), last, now);
        };
        let now = Sample {
            at: Instant::now(),
            stalled_us: self
                .v2_dir
                .as_deref()
                .and_then(|d| psi_some_total(&d.join("cpu.pressure"))),
            throttled: read_field(&limit.dir.join("cpu.stat"), "nr_throttled"),
        };
        let last = self.last.replace(now);
        last.is_some_and(|l| contended(l, now))
    }
}

/// Share of the wall time between two samples in which some task waited
/// for a CPU; None without pressure in either.
fn stall_share(a: Sample, b: Sample) -> Option<f64> {
    let stalled = b.stalled_us?.saturating_sub(a.stalled_us?);
    let wall_us = b.at.duration_since(a.at).as_micros().max(1) as f64;
    Some(stalled as f64 / wall_us)
}

/// Whether the cgroup was throttled, or stalled more than `PRESSURE`,
/// between two samples.
fn contended(a: Sample, b: Sample) -> bool {
    let grew = |x: Option<u64>, y: Option<u64>| match (x, y) {
        (Some(x), Some(y)) => y.saturating_sub(x),
        _ => 0,
    };
    grew(a.throttled, b.throttled) > 0 || stall_share(a, b).is_some_and(|s| s > PRESSURE)
}

/// Whether the host's CPUs count as contended: its run queue was longer
/// than its CPUs (`run_queue_long`) and, where the host reports pressure,
/// its tasks waited for a CPU more than `HOST_PRESSURE` of the time since
/// the last sample.
fn host_contended(run_queue_long: bool, last: Option<Sample>, now: Sample) -> bool {
    run_queue_long
        && last
            .and_then(|l| stall_share(l, now))
            .is_none_or(|s| s > HOST_PRESSURE)
}

/// True when more threads are runnable host-wide than the host has online
/// CPUs (`procs_running` of /proc/stat, less the monitor itself).
fn host_busy() -> bool {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return false;
    };
    let running = stat
        .lines()
        .find_map(|l| l.strip_prefix("procs_running "))
        .and_then(|v| v.trim().parse::<usize>().ok());
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    running.is_some_and(|r| r.saturating_sub(1) > cpus)
}

/// The `total=` of the "some" line of a CPU pressure file.
fn psi_some_total(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let line = s.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The value of `key` in a flat keyed file such as cpu.stat.
fn read_field(path: &Path, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    s.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// CPUs allowed by a cgroup v2 `cpu.max` ("max 100000" or "50000 100000").
pub(crate) fn parse_cpu_max(s: &str) -> Option<f64> {
    let mut f = s.split_whitespace();
    let quota = f.next()?;
    let period: f64 = f.next().map_or(Some(100_000.0), |p| p.parse().ok())?;
    if quota == "max" || period <= 0.0 {
        return None;
    }
    Some(quota.parse::<f64>().ok()? / period)
}

/// CPUs allowed by cgroup v1 `cpu.cfs_quota_us` (-1: none) and period.
fn parse_cfs(quota: &str, period: &str) -> Option<f64> {
    let q: i64 = quota.trim().parse().ok()?;
    let p: i64 = period.trim().parse().ok()?;
    (q > 0 && p > 0).then(|| q as f64 / p as f64)
}

/// This process's cgroup directories: v2, and v1's cpu controller, each
/// with the mount point of its hierarchy (where walking up stops).
#[derive(Debug, Default, PartialEq)]
struct CgroupDirs {
    v2: Option<(PathBuf, PathBuf)>,
    v1_cpu: Option<(PathBuf, PathBuf)>,
}

impl CgroupDirs {
    /// From the text of /proc/self/cgroup and /proc/self/mountinfo.
    fn find(cgroups: &str, mountinfo: &str) -> Self {
        let mut dirs = Self::default();
        for line in cgroups.lines() {
            let mut f = line.splitn(3, ':');
            let (Some(hier), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            if hier == "0" && ctrls.is_empty() {
                let mount = find_mount(mountinfo, |fstype, _| fstype == "cgroup2")
                    .or_else(|| Some(("/".into(), "/sys/fs/cgroup".into())));
                dirs.v2 = mount.map(|m| join_cgroup(m, path));
            } else if ctrls.split(',').any(|c| c == "cpu") {
                let mount = find_mount(mountinfo, |fstype, opts| {
                    fstype == "cgroup" && opts.split(',').any(|o| o == "cpu")
                });
                dirs.v1_cpu = mount.map(|m| join_cgroup(m, path));
            }
        }
        dirs
    }

    /// The tightest CPU limit on the way from the process's cgroups up to
    /// the root of their hierarchies.
    fn limit(&self) -> Option<Limit> {
        let v2 = self.v2.as_ref().and_then(|(dir, top)| {
            tightest(dir, top, |d| {
                parse_cpu_max(&std::fs::read_to_string(d.join("cpu.max")).ok()?)
            })
        });
        let v1 = self.v1_cpu.as_ref().and_then(|(dir, top)| {
            tightest(dir, top, |d| {
                let q = std::fs::read_to_string(d.join("cpu.cfs_quota_us")).ok()?;
                let p = std::fs::read_to_string(d.join("cpu.cfs_period_us")).ok()?;
                parse_cfs(&q, &p)
            })
        });
        [v2, v1]
            .into_iter()
            .flatten()
            .min_by(|a, b| a.cpus.total_cmp(&b.cpus))
    }
}

/// The (root, mount point) of the first mount in `mountinfo` whose file
/// system type and super options `want` accepts.
fn find_mount(mountinfo: &str, want: impl Fn(&str, &str) -> bool) -> Option<(String, String)> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut l = left.split(' ').skip(3);
        let (root, point) = (l.next()?, l.next()?);
        let mut r = right.split(' ');
        let (fstype, _source, opts) = (r.next()?, r.next()?, r.next().unwrap_or(""));
        want(fstype, opts).then(|| (unescape(root), unescape(point)))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out + rest
}

/// The directory of cgroup `path` (as /proc/self/cgroup names it) in a
/// hierarchy mounted at `point` from its `root`, and that mount point.
fn join_cgroup((root, point): (String, String), path: &str) -> (PathBuf, PathBuf) {
    let rel = path.strip_prefix(root.as_str()).unwrap_or(path);
    let dir = Path::new(&point).join(rel.trim_start_matches('/'));
    (dir, PathBuf::from(point))
}

/// The smallest limit `read` finds in `dir` or its parents up to `top`.
fn tightest(dir: &Path, top: &Path, read: impl Fn(&Path) -> Option<f64>) -> Option<Limit> {
    let mut best: Option<Limit> = None;
    let mut d = Some(dir);
    while let Some(cur) = d.filter(|c| c.starts_with(top)) {
        if let Some(cpus) = read(cur) {
            if best.as_ref().is_none_or(|b| cpus < b.cpus) {
                best = Some(Limit {
                    dir: cur.to_path_buf(),
                    cpus,
                });
            }
        }
        d = cur.parent();
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MOUNTS: &str = "\
30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
32 25 0:28 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
";

    #[test]
    fn finds_the_v2_and_v1_cpu_directories() {
        let cg = "4:cpuset:/\n3:cpu,cpuacct:/docker/abc\n0::/user.slice/x.scope\n";
        let d = CgroupDirs::find(cg, MOUNTS);
        assert_eq!(
            d.v2,
            Some((
                "/sys/fs/cgroup/unified/user.slice/x.scope".into(),
                "/sys/fs/cgroup/unified".into()
            ))
        );
        assert_eq!(
            d.v1_cpu,
            Some((
                "/sys/fs/cgroup/cpu,cpuacct/docker/abc".into(),
                "/sys/fs/cgroup/cpu,cpuacct".into()
            ))
        );
    }

    #[test]
    fn a_mount_of_a_sub_hierarchy_is_not_joined_twice() {
        // A container that sees its own cgroup mounted as the root.
        let m = "40 1 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let d = CgroupDirs::find("0::/docker/abc\n", m);
        assert_eq!(
            d.v2,
            Some(("/sys/fs/cgroup".into(), "/sys/fs/cgroup".into()))
        );
        // No mountinfo: /sys/fs/cgroup is assumed for v2.
        let d = CgroupDirs::find("0::/a\n", "");
        assert_eq!(
            d.v2,
            Some(("/sys/fs/cgroup/a".into(), "/sys/fs/cgroup".into()))
        );
        assert_eq!(d.v1_cpu, None);
    }

    #[test]
    fn parses_limits() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("100000 100000\n"), Some(1.0));
        assert_eq!(parse_cpu_max("50000 100000"), Some(0.5));
        assert_eq!(parse_cpu_max("garbage"), None);
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs("200000\n", "100000\n"), Some(2.0));
    }

    #[test]
    fn the_tightest_limit_on_the_way_up_wins() {
        let t = tempfile::tempdir().unwrap();
        let leaf = t.path().join("a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(t.path().join("a/cpu.max"), "50000 100000\n").unwrap();
        std::fs::write(leaf.join("cpu.max"), "max 100000\n").unwrap();
        std::fs::write(t.path().join("cpu.max"), "400000 100000\n").unwrap();
        let read = |d: &Path| parse_cpu_max(&std::fs::read_to_string(d.join("cpu.max")).ok()?);
        let l = tightest(&leaf, t.path(), read).unwrap();
        assert_eq!((l.dir, l.cpus), (t.path().join("a"), 0.5));
        // Nothing above the hierarchy's mount point counts.
        assert_eq!(tightest(&leaf, &leaf, read), None);
    }

    #[test]
    fn throttling_or_pressure_counts_as_contended() {
        let at = Instant::now();
        let s = |ms: u64, stalled_us: u64, throttled: u64| Sample {
            at: at + Duration::from_millis(ms),
            stalled_us: Some(stalled_us),
            throttled: Some(throttled),
        };
        assert!(!contended(s(0, 0, 3), s(100, 5_000, 3)));
        assert!(contended(s(0, 0, 3), s(100, 20_000, 3)));
        assert!(contended(s(0, 0, 3), s(100, 0, 4)));
        let none = Sample {
            stalled_us: None,
            throttled: None,
            ..s(100, 0, 0)
        };
        assert!(!contended(s(0, 0, 0), none));
    }

    #[test]
    fn a_long_host_run_queue_is_contended_only_under_pressure() {
        let at = Instant::now();
        let s = |ms: u64, stalled_us: Option<u64>| Sample {
            at: at + Duration::from_millis(ms),
            stalled_us,
            throttled: None,
        };
        // Hand-offs of a load waiting on the daemon: 12% stalled.
        assert!(!host_contended(
            true,
            Some(s(0, Some(0))),
            s(100, Some(12_000))
        ));
        // CPUs kept busy: stalled most of the time.
        assert!(host_contended(
            true,
            Some(s(0, Some(0))),
            s(100, Some(90_000))
        ));
        // Pressure without a long run queue (one CPU of many contended).
        assert!(!host_contended(
            false,
            Some(s(0, Some(0))),
            s(100, Some(90_000))
        ));
        // No pressure reported, or nothing to compare with: the run queue.
        assert!(host_contended(true, Some(s(0, None)), s(100, None)));
        assert!(host_contended(true, None, s(100, Some(5))));
        assert!(!host_contended(false, None, s(100, None)));
    }

    #[test]
    fn reads_psi_and_keyed_files() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(
            t.path().join("cpu.pressure"),
            "some avg10=0.33 avg60=0.95 avg300=4.96 total=13674\nfull avg10=0.00 total=0\n",
        )
        .unwrap();
        assert_eq!(psi_some_total(&t.path().join("cpu.pressure")), Some(13674));
        assert_eq!(psi_some_total(&t.path().join("missing")), None);
        std::fs::write(t.path().join("cpu.stat"), "nr_periods 9\nnr_throttled 4\n").unwrap();
        assert_eq!(
            read_field(&t.path().join("cpu.stat"), "nr_throttled"),
            Some(4)
        );
        assert_eq!(read_field(&t.path().join("cpu.stat"), "nope"), None);
        assert_eq!(unescape("/a\\040b"), "/a b");
    }
}
