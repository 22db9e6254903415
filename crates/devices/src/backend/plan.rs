//! A fault plan: faults for a running daemon, written as text in a file
//! that the daemon re-reads whenever it changes (the daemon takes one only
//! when started with CAIRN_FAULT_PLAN=FILE, for tests of a real mount).
//! One fault per line, `#` starts a comment:
//!
//! ```text
//! FILE OPS EFFECT [range=START-END] [when=always|times:N|every:N|p:F]
//! data.1 read eio range=1048576-1052672
//! meta.redb write,sync eio when=times:1
//! data.0 read hang:300ms
//! ```
//!
//! FILE names the pool file the fault applies to by its last path
//! components (`data.0`, `devs/fast`, `meta.redb`); OPS is `all` or a comma
//! list of read, write, sync, set_len, punch; EFFECT is `eio`, `enospc`,
//! `errno:N`, `full` (ENOSPC for writes that grow the file), `hang:DUR`
//! (`300ms`, `2s`) or `corrupt` (reads return flipped bits).

use super::fault::{Fault, FaultStorage, Ops, When};
use super::{path_key, Backend, OpenHow, Storage};
use parking_lot::Mutex;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A plan line that could not be understood.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("fault plan {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("fault plan line {line}: {msg}")]
    Syntax { line: usize, msg: String },
}

/// One fault of a plan and the file it applies to.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRule {
    pub file: PathBuf,
    pub fault: Fault,
}

/// Parses a plan's text.
pub fn parse_plan(text: &str) -> Result<Vec<PlanRule>, PlanError> {
    let mut rules = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let syntax = |msg: String| PlanError::Syntax { line: i + 1, msg };
        rules.push(parse_rule(line).map_err(syntax)?);
    }
    Ok(rules)
}

fn parse_rule(line: &str) -> Result<PlanRule, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let [file, ops, effect, options @ ..] = words.as_slice() else {
        return Err(format!("`{line}`: expected FILE OPS EFFECT [options]"));
    };
    let mut fault = parse_effect(effect, parse_ops(ops)?)?;
    for opt in options {
        fault = match opt.split_once('=') {
            Some(("range", r)) => fault.in_range(parse_range(r)?),
            Some(("when", w)) => fault.when(parse_when(w)?),
            _ => return Err(format!("unknown option `{opt}` (range=, when=)")),
        };
    }
    Ok(PlanRule {
        file: PathBuf::from(file),
        fault,
    })
}

fn parse_ops(s: &str) -> Result<Ops, String> {
    s.split(',')
        .try_fold(None, |acc: Option<Ops>, w| {
            let op = match w {
                "all" => Ops::ALL,
                "read" => Ops::READ,
                "write" => Ops::WRITE,
                "sync" => Ops::SYNC,
                "set_len" => Ops::SET_LEN,
                "punch" => Ops::PUNCH,
                _ => return Err(format!("unknown operation `{w}`")),
            };
            Ok(Some(acc.map_or(op, |a| a | op)))
        })?
        .ok_or_else(|| "no operation".to_string())
}

fn parse_effect(s: &str, ops: Ops) -> Result<Fault, String> {
    let (name, arg) = s.split_once(':').unwrap_or((s, ""));
    Ok(match (name, arg) {
        ("eio", "") => Fault::eio(ops),
        ("enospc", "") => Fault::fail(ops, libc::ENOSPC),
        ("errno", n) => Fault::fail(ops, n.parse().map_err(|_| format!("bad errno `{n}`"))?),
        ("full", "") => Fault {
            ops,
            ..Fault::full()
        },
        ("hang", d) => Fault::hang(ops, parse_duration(d)?),
        ("corrupt", "") => Fault {
            ops,
            ..Fault::corrupt_reads()
        },
        _ => return Err(format!("unknown effect `{s}`")),
    })
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("bad duration `{s}` (e.g. 300ms, 2s)");
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
    let n: u64 = num.parse().map_err(|_| bad())?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(bad()),
    }
}

fn parse_range(s: &str) -> Result<std::ops::Range<u64>, String> {
    let bad = || format!("bad range `{s}` (START-END, bytes)");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if a >= b {
        return Err(bad());
    }
    Ok(a..b)
}

fn parse_when(s: &str) -> Result<When, String> {
    let (name, arg) = s.split_once(':').unwrap_or((s, ""));
    let bad = || format!("bad when `{s}` (always, times:N, every:N, p:F)");
    Ok(match name {
        "always" if arg.is_empty() => When::Always,
        "times" => When::Times(arg.parse().map_err(|_| bad())?),
        "every" => When::EveryNth(arg.parse().ok().filter(|n| *n > 0).ok_or_else(bad)?),
        "p" => When::Probability(arg.parse().map_err(|_| bad())?),
        _ => return Err(bad()),
    })
}

/// Opens files through fault backends whose faults follow a plan file.
#[derive(Debug)]
pub struct PlanStorage {
    faults: FaultStorage,
    plan: PathBuf,
    state: Mutex<PlanState>,
}

#[derive(Debug, Default)]
struct PlanState {
    /// The plan's text as last applied.
    text: Option<String>,
    rules: Vec<PlanRule>,
    opened: Vec<PathBuf>,
}

impl PlanStorage {
    /// Storage over `inner` with the faults of the plan at `plan` (which
    /// must exist and parse).
    pub fn new(inner: Arc<dyn Storage>, plan: &Path) -> Result<Arc<PlanStorage>, PlanError> {
        let s = Arc::new(PlanStorage {
            faults: FaultStorage::per_file(inner, 0x5eed),
            plan: plan.to_path_buf(),
            state: Mutex::default(),
        });
        s.reload()?;
        Ok(s)
    }

    /// Re-reads the plan; when its text changed, replaces every file's
    /// faults. Returns the number of rules when it did.
    pub fn reload(&self) -> Result<Option<usize>, PlanError> {
        let text = std::fs::read_to_string(&self.plan).map_err(|source| PlanError::Read {
            path: self.plan.clone(),
            source,
        })?;
        let mut st = self.state.lock();
        if st.text.as_deref() == Some(text.as_str()) {
            return Ok(None);
        }
        st.rules = parse_plan(&text)?;
        st.text = Some(text);
        for path in &st.opened {
            self.apply(&st.rules, path);
        }
        Ok(Some(st.rules.len()))
    }

    /// Re-reads the plan every `every` on a thread, logging each change.
    pub fn watch(self: &Arc<Self>, every: Duration) {
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("fault-plan".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                match me.reload() {
                    Ok(Some(n)) => tracing::warn!("fault plan applied: {n} faults"),
                    Ok(None) => {}
                    Err(e) => tracing::error!("{e} (previous faults kept)"),
                }
            });
        if let Err(e) = spawned {
            tracing::error!("fault plan watcher: {e}");
        }
    }

    /// Sets the faults of the file at `path` to the rules naming it (as
    /// spelled, or its real path when `path` is a symlink).
    fn apply(&self, rules: &[PlanRule], path: &Path) {
        let control = self.faults.control(path);
        control.clear();
        let real = path_key(path);
        let names = |r: &&PlanRule| path.ends_with(&r.file) || real.ends_with(&r.file);
        for r in rules.iter().filter(names) {
            control.add(r.fault.clone());
        }
    }
}

impl Storage for PlanStorage {
    fn open(&self, path: &Path, how: &OpenHow) -> io::Result<Arc<dyn Backend>> {
        let backend = self.faults.open(path, how)?;
        let mut st = self.state.lock();
        if !st.opened.iter().any(|p| p == path) {
            self.apply(&st.rules, path);
            st.opened.push(path.to_path_buf());
        }
        Ok(backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::HostStorage;

    #[test]
    fn plans_parse_and_bad_lines_are_named() {
        let rules = parse_plan(
            "# comment\n data.1 read eio range=10-20 when=times:2\n\
             meta.redb write,sync hang:300ms\nx all errno:28 when=p:0.5\n",
        )
        .unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(
            rules[0].fault,
            Fault::eio(Ops::READ).in_range(10..20).when(When::Times(2))
        );
        assert_eq!(
            rules[1].fault,
            Fault::hang(Ops::WRITE | Ops::SYNC, Duration::from_millis(300))
        );
        assert_eq!(rules[2].fault.when, When::Probability(0.5));
        for bad in [
            "f read",
            "f jump eio",
            "f read eio range=5-1",
            "f read zap",
            "f read eio when=every:0",
        ] {
            let e = parse_plan(&format!("\n{bad}\n")).unwrap_err();
            assert!(
                e.to_string().starts_with("fault plan line 2:"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_changed_plan_replaces_the_faults_of_open_files() {
        let d = tempfile::tempdir().unwrap();
        let plan = d.path().join("plan");
        std::fs::write(&plan, "devs/a read eio\n").unwrap();
        let st = PlanStorage::new(Arc::new(HostStorage), &plan).unwrap();
        let a = st.open(&d.path().join("devs/a"), &OpenHow::CREATE);
        assert!(a.is_err(), "devs/ does not exist");
        std::fs::create_dir(d.path().join("devs")).unwrap();
        let a = st.open(&d.path().join("devs/a"), &OpenHow::CREATE).unwrap();
        let b = st.open(&d.path().join("b"), &OpenHow::CREATE).unwrap();
        a.write_at(b"abc", 0).unwrap();
        b.write_at(b"abc", 0).unwrap();
        let mut buf = [0u8; 3];
        assert!(a.read_at(&mut buf, 0).is_err());
        b.read_at(&mut buf, 0).unwrap();
        assert_eq!(st.reload().unwrap(), None, "unchanged plan");
        std::fs::write(&plan, "b write enospc\n").unwrap();
        assert_eq!(st.reload().unwrap(), Some(1));
        a.read_at(&mut buf, 0).unwrap();
        let e = b.write_at(b"x", 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        std::fs::write(&plan, "b write bogus\n").unwrap();
        assert!(st.reload().is_err());
        assert!(b.write_at(b"x", 0).is_err(), "a bad plan keeps the faults");
    }
}
