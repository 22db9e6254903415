//! cgroups for the ring scheduling tests: a child cgroup with a CPU limit
//! that a daemon is started in (cgroup v2 `cpu.max`, or the v1 cpu
//! controller's `cpu.cfs_quota_us` on hosts that still mount it as v1),
//! its CPU use and throttling, whether this process itself runs under a
//! CPU limit, and the scheduling policies of a daemon's ring threads.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// SCHED_OTHER, SCHED_FIFO and SCHED_IDLE as /proc/PID/stat shows them.
pub const SCHED_OTHER: i32 = 0;
pub const SCHED_FIFO: i32 = 1;
pub const SCHED_IDLE: i32 = 5;

/// A child cgroup with a CPU limit, removed on drop (once empty).
pub struct LimitedCgroup {
    /// Every directory the daemon must join (one per hierarchy).
    dirs: Vec<PathBuf>,
    /// Where `cpu.stat` with `nr_throttled` is.
    cpu: PathBuf,
    usage: Usage,
    /// "v2" or "v1": which cgroup version holds the limit.
    pub version: &'static str,
}

/// How to read the cgroup's CPU time.
enum Usage {
    /// cgroup v2 `cpu.stat` `usage_usec`.
    V2(PathBuf),
    /// cgroup v1 `cpuacct.usage` (ns).
    V1(PathBuf),
}

/// (root, mount point, super options) of every cgroup mount.
fn cgroup_mounts(fstype: &str) -> Vec<(String, PathBuf, String)> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut f = left.split(' ').skip(3);
            let (root, point) = (f.next()?, f.next()?);
            let mut r = right.split(' ');
            let (t, _, opts) = (r.next()?, r.next()?, r.next().unwrap_or(""));
            (t == fstype).then(|| (root.to_string(), PathBuf::from(point), opts.to_string()))
        })
        .collect()
}

fn has_word(list: &str, w: &str) -> bool {
    list.split([',', ' ', '\n']).any(|x| x == w)
}

impl LimitedCgroup {
    /// A new cgroup `name` limited to one CPU (100000 of every 100000 us),
    /// or why none can be made here.
    pub fn one_cpu(name: &str) -> Result<LimitedCgroup, String> {
        let v2 = match Self::v2(name) {
            Ok(c) => return Ok(c),
            Err(e) => e,
        };
        Self::v1(name).map_err(|v1| format!("cgroup v2: {v2}; cgroup v1: {v1}"))
    }

    fn v2(name: &str) -> Result<LimitedCgroup, String> {
        let (_, top, _) = cgroup_mounts("cgroup2")
            .into_iter()
            .next()
            .ok_or("no cgroup2 mount")?;
        let ctrl = fs::read_to_string(top.join("cgroup.controllers")).map_err(|e| e.to_string())?;
        if !has_word(&ctrl, "cpu") {
            return Err(format!(
                "the cpu controller is not available in {} (controllers: {:?})",
                top.display(),
                ctrl.trim()
            ));
        }
        let sub = fs::read_to_string(top.join("cgroup.subtree_control")).unwrap_or_default();
        if !has_word(&sub, "cpu") {
            fs::write(top.join("cgroup.subtree_control"), "+cpu")
                .map_err(|e| format!("cannot enable cpu in {}: {e}", top.display()))?;
        }
        let dir = top.join(name);
        make_dir(&dir)?;
        write(&dir.join("cpu.max"), "100000 100000")?;
        Ok(LimitedCgroup {
            dirs: vec![dir.clone()],
            cpu: dir.clone(),
            usage: Usage::V2(dir),
            version: "v2",
        })
    }

    fn v1(name: &str) -> Result<LimitedCgroup, String> {
        let mounts = cgroup_mounts("cgroup");
        let find = |c: &str| {
            let m = mounts.iter().find(|(_, _, o)| has_word(o, c));
            m.map(|(_, p, _)| p.join(name))
        };
        let cpu = find("cpu").ok_or("no v1 cpu controller mounted")?;
        let acct = find("cpuacct").ok_or("no v1 cpuacct controller mounted")?;
        make_dir(&cpu)?;
        let mut dirs = vec![cpu.clone()];
        if acct != cpu {
            make_dir(&acct)?;
            dirs.push(acct.clone());
        }
        let cg = LimitedCgroup {
            dirs,
            cpu: cpu.clone(),
            usage: Usage::V1(acct),
            version: "v1",
        };
        write(&cpu.join("cpu.cfs_period_us"), "100000")?;
        write(&cpu.join("cpu.cfs_quota_us"), "100000")?;
        // With RT group scheduling a child cgroup gets no real-time time,
        // which would refuse SCHED_FIFO whatever the daemon decides: give
        // it some, so that only the daemon keeps its threads off real time.
        let rt = cpu.join("cpu.rt_runtime_us");
        if rt.exists() {
            if let Err(e) = write(&rt, "500000") {
                eprintln!("[ring_cgroup] {e}: SCHED_FIFO may be refused by the kernel there");
            }
        }
        Ok(cg)
    }

    /// A program and arguments that put themselves in this cgroup, then
    /// exec the rest of the command line (`Fs::mount_prefix`).
    pub fn enter_prefix(&self) -> Vec<String> {
        let joins: Vec<String> = self
            .dirs
            .iter()
            .map(|d| format!("echo $$ > '{}/cgroup.procs'", d.display()))
            .collect();
        let script = format!("{} && exec \"$@\"", joins.join(" && "));
        vec!["sh".into(), "-c".into(), script, "sh".into()]
    }

    /// CPU time used by the cgroup so far.
    pub fn usage(&self) -> Duration {
        match &self.usage {
            Usage::V2(d) => Duration::from_micros(stat_field(&d.join("cpu.stat"), "usage_usec")),
            Usage::V1(d) => {
                let s = fs::read_to_string(d.join("cpuacct.usage")).unwrap();
                Duration::from_nanos(s.trim().parse().unwrap())
            }
        }
    }

    /// Periods in which the cgroup ran out of quota, so far.
    pub fn nr_throttled(&self) -> u64 {
        stat_field(&self.cpu.join("cpu.stat"), "nr_throttled")
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        for d in &self.dirs {
            let gone = crate::common::eventually(Duration::from_secs(10), || {
                fs::remove_dir(d).is_ok() || !d.exists()
            });
            if !gone {
                eprintln!("[ring_cgroup] could not remove {}", d.display());
            }
        }
    }
}

fn make_dir(d: &Path) -> Result<(), String> {
    if d.exists() {
        // Left by an earlier run that was killed: reuse it.
        return Ok(());
    }
    fs::create_dir(d).map_err(|e| format!("cannot create {}: {e}", d.display()))
}

fn write(p: &Path, v: &str) -> Result<(), String> {
    fs::write(p, v).map_err(|e| format!("cannot write {v:?} to {}: {e}", p.display()))
}

/// The value of `key` in a flat keyed file such as cpu.stat (0 if absent).
pub fn stat_field(p: &Path, key: &str) -> u64 {
    let s = fs::read_to_string(p).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// CPUs this process may use by its own cgroups' limits (v2 `cpu.max` or
/// v1 `cpu.cfs_quota_us`, on the way up), or None when unlimited.
pub fn own_cpu_limit() -> Option<f64> {
    let cgroups = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut best: Option<f64> = None;
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        let (fstype, ctrl) = if ctrls.is_empty() {
            ("cgroup2", None)
        } else if has_word(ctrls, "cpu") {
            ("cgroup", Some("cpu"))
        } else {
            continue;
        };
        for (root, point, opts) in cgroup_mounts(fstype) {
            if ctrl.is_some_and(|c| !has_word(&opts, c)) {
                continue;
            }
            let rel = path.strip_prefix(root.as_str()).unwrap_or(path);
            let mut d = point.join(rel.trim_start_matches('/'));
            loop {
                if let Some(l) = dir_limit(&d) {
                    best = Some(best.map_or(l, |b: f64| b.min(l)));
                }
                if d == point || !d.pop() {
                    break;
                }
            }
        }
    }
    best
}

/// The CPU limit set in cgroup directory `d`, if any.
fn dir_limit(d: &Path) -> Option<f64> {
    if let Ok(m) = fs::read_to_string(d.join("cpu.max")) {
        let mut f = m.split_whitespace();
        let (q, p) = (f.next()?, f.next()?);
        if q == "max" {
            return None;
        }
        return Some(q.parse::<f64>().ok()? / p.parse::<f64>().ok()?);
    }
    let q: f64 = fs::read_to_string(d.join("cpu.cfs_quota_us"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let p: f64 = fs::read_to_string(d.join("cpu.cfs_period_us"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (q > 0.0).then_some(q / p)
}

/// (thread id, policy) of each ring thread (`fuse-ring-Q.T`) of `pid`.
pub fn ring_policies(pid: u32) -> Vec<(u32, i32)> {
    let Ok(rd) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|t| {
            let comm = fs::read_to_string(t.path().join("comm")).ok()?;
            let comm = comm.trim();
            if !comm.starts_with("fuse-ring-") || comm == "fuse-ring-sched" {
                return None;
            }
            let stat = fs::read_to_string(t.path().join("stat")).ok()?;
            // Field 41 (policy), counted after the ")" that ends comm.
            let policy = stat.rsplit_once(')')?.1.split_whitespace().nth(38)?;
            Some((t.file_name().to_str()?.parse().ok()?, policy.parse().ok()?))
        })
        .collect()
}
