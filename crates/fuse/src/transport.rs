//! How the kernel hands requests to the daemon: FUSE over io_uring, with one
//! queue per CPU served by threads pinned to that CPU (Linux 6.14+), or the
//! classic /dev/fuse reads. io_uring keeps a request and its reply on one CPU,
//! which on virtual machines makes small operations several times faster.
//! The kernel only offers it while the `fuse` module's `enable_uring`
//! parameter is on. That switch is host-wide (it lets every FUSE daemon on
//! the host use io_uring), so a mount only turns it on when the admin asks
//! with `--enable-uring-module`; otherwise `auto` uses io_uring when the
//! switch is already on and /dev/fuse when it is off. Also here: how ring
//! threads are scheduled (`RingPriority`).

use std::path::Path;
use std::str::FromStr;

/// The module parameter that gates FUSE over io_uring.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
/// The mount option that allows writing it.
pub const ENABLE_OPTION: &str = "--enable-uring-module";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// io_uring when the kernel offers it, else /dev/fuse.
    #[default]
    Auto,
    /// io_uring or fail the mount.
    On,
    /// /dev/fuse only.
    Off,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

impl FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            _ => Err(format!("'{s}': expected auto, on or off")),
        }
    }
}

/// How FUSE ring threads are scheduled (vendor/fuser/src/uring_sched.rs).
/// The default is `Idle` (as root; `Normal` otherwise): callers stay on
/// their CPU, which on a 2-CPU VM nearly triples small requests such as
/// creates over `Normal`; a monitor raises a thread its CPU starves, to
/// real time only where no cgroup CPU limit applies and for at most 500 ms
/// at a time. `Normal` keeps them ordinary threads, never real time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RingPriority {
    /// `SCHED_IDLE` while waiting, raised (bounded) while starved.
    #[default]
    Idle,
    /// `SCHED_OTHER` at the daemon's nice value, never real time.
    Normal,
    /// Scheduling left as inherited.
    Off,
}

impl std::fmt::Display for RingPriority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Idle => "idle",
            Self::Normal => "normal",
            Self::Off => "off",
        })
    }
}

impl FromStr for RingPriority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "idle" => Ok(Self::Idle),
            "normal" => Ok(Self::Normal),
            "off" => Ok(Self::Off),
            _ => Err(format!("'{s}': expected idle, normal or off")),
        }
    }
}

impl From<RingPriority> for fuser::RingPriority {
    fn from(p: RingPriority) -> Self {
        match p {
            RingPriority::Idle => fuser::RingPriority::Idle,
            RingPriority::Normal => fuser::RingPriority::Normal,
            RingPriority::Off => fuser::RingPriority::Off,
        }
    }
}

/// A mount's transport options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransportOptions {
    pub io_uring: Transport,
    /// May turn the host-wide `fuse.enable_uring` on.
    pub enable_module: bool,
    pub ring_priority: RingPriority,
}

/// Why the transport asked for cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error(
        "--io-uring on: this kernel has no FUSE over io_uring ({0} missing; needs Linux 6.14+)"
    )]
    NoKernelSupport(String),
    #[error(
        "--io-uring on: io_uring is off on this host (fuse.enable_uring=N); mount with \
         {ENABLE_OPTION} to turn it on (it is host-wide: every FUSE daemon may then use it), \
         or with --io-uring auto to use /dev/fuse threads"
    )]
    ModuleOff,
    #[error("{ENABLE_OPTION}: cannot turn on io_uring in {path}: {reason}")]
    CannotEnable { path: String, reason: String },
    #[error("{ENABLE_OPTION} turns io_uring on, but --io-uring off keeps to /dev/fuse")]
    EnableButOff,
}

/// Decides the ring setup for a mount, turning the kernel side on only if
/// `enable_module` allows. `Err` when `On` cannot be had, or the options
/// contradict each other.
pub fn prepare(o: &TransportOptions) -> Result<Option<fuser::UringConfig>, TransportError> {
    prepare_at(o, Path::new(ENABLE_URING))
}

fn prepare_at(
    o: &TransportOptions,
    param: &Path,
) -> Result<Option<fuser::UringConfig>, TransportError> {
    match o.io_uring {
        Transport::Off if o.enable_module => return Err(TransportError::EnableButOff),
        Transport::Off => return Ok(None),
        _ => {}
    }
    let required = o.io_uring == Transport::On;
    let Ok(v) = std::fs::read_to_string(param) else {
        let missing = param.display().to_string();
        if required {
            return Err(TransportError::NoKernelSupport(missing));
        }
        tracing::info!("serving /dev/fuse: this kernel has no FUSE over io_uring ({missing} missing; needs Linux 6.14+)");
        return Ok(None);
    };
    if v.trim() != "Y" {
        if let Err(e) = turn_on(o, param) {
            if required {
                return Err(e);
            }
            tracing::info!("{}", fallback_line(&e));
            return Ok(None);
        }
    }
    Ok(Some(fuser::UringConfig {
        executor: Some(crate::workers::shared()),
        priority: o.ring_priority.into(),
        ..Default::default()
    }))
}

/// Writes Y to the module parameter if the admin allowed it.
fn turn_on(o: &TransportOptions, param: &Path) -> Result<(), TransportError> {
    if !o.enable_module {
        return Err(TransportError::ModuleOff);
    }
    std::fs::write(param, "Y").map_err(|e| TransportError::CannotEnable {
        path: param.display().to_string(),
        reason: e.to_string(),
    })?;
    tracing::info!(
        "turned on FUSE over io_uring for this host ({}=Y, asked by {ENABLE_OPTION})",
        param.display()
    );
    Ok(())
}

/// The log line of `auto` when io_uring is off and stays off.
fn fallback_line(e: &TransportError) -> String {
    match e {
        TransportError::ModuleOff => format!(
            "io_uring is off on this host (fuse.enable_uring=N); using /dev/fuse threads; \
             mount with {ENABLE_OPTION} to turn it on"
        ),
        other => format!("using /dev/fuse threads: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(io_uring: Transport, enable_module: bool) -> TransportOptions {
        TransportOptions {
            io_uring,
            enable_module,
            ..Default::default()
        }
    }

    /// A module parameter file holding `v`.
    fn param(v: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("enable_uring");
        std::fs::write(&p, v).unwrap();
        (d, p)
    }

    #[test]
    fn parses_and_rejects() {
        assert_eq!("auto".parse(), Ok(Transport::Auto));
        assert_eq!("off".parse(), Ok(Transport::Off));
        assert!("yes".parse::<Transport>().is_err());
        assert_eq!("idle".parse(), Ok(RingPriority::Idle));
        assert_eq!("normal".parse(), Ok(RingPriority::Normal));
        assert_eq!("off".parse(), Ok(RingPriority::Off));
        assert!("fifo".parse::<RingPriority>().is_err());
        assert_eq!(RingPriority::default().to_string(), "idle");
    }

    #[test]
    fn missing_parameter_falls_back_unless_required() {
        let p = Path::new("/nonexistent/enable_uring");
        assert_eq!(prepare_at(&opts(Transport::Auto, false), p), Ok(None));
        let e = prepare_at(&opts(Transport::On, false), p).unwrap_err();
        assert!(e.to_string().contains("no FUSE over io_uring"), "{e}");
        assert_eq!(prepare_at(&opts(Transport::Off, false), p), Ok(None));
    }

    #[test]
    fn an_off_parameter_is_left_alone_without_permission() {
        let (_d, p) = param("N\n");
        assert_eq!(prepare_at(&opts(Transport::Auto, false), &p), Ok(None));
        let e = prepare_at(&opts(Transport::On, false), &p).unwrap_err();
        assert_eq!(e, TransportError::ModuleOff);
        assert!(e.to_string().contains(ENABLE_OPTION), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "N\n");
        let line = fallback_line(&e);
        assert!(line.starts_with("io_uring is off on this host (fuse.enable_uring=N)"));
    }

    #[test]
    fn enables_an_off_parameter_when_allowed() {
        for t in [Transport::Auto, Transport::On] {
            let (_d, p) = param("N\n");
            assert!(prepare_at(&opts(t, true), &p).unwrap().is_some());
            assert_eq!(std::fs::read_to_string(&p).unwrap(), "Y");
        }
    }

    #[test]
    fn an_on_parameter_is_used_as_it_is() {
        let (_d, p) = param("Y\n");
        for t in [Transport::Auto, Transport::On] {
            assert!(prepare_at(&opts(t, false), &p).unwrap().is_some());
        }
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "Y\n");
    }

    #[test]
    fn enabling_with_io_uring_off_is_refused() {
        let (_d, p) = param("N\n");
        let e = prepare_at(&opts(Transport::Off, true), &p).unwrap_err();
        assert_eq!(e, TransportError::EnableButOff);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "N\n");
    }

    #[test]
    fn a_parameter_that_cannot_be_written_fails_only_when_required() {
        // Readable, not "Y", and not writable even by root.
        let p = Path::new("/proc/version");
        if !p.exists() {
            return;
        }
        assert_eq!(prepare_at(&opts(Transport::Auto, true), p), Ok(None));
        let e = prepare_at(&opts(Transport::On, true), p).unwrap_err();
        assert!(matches!(e, TransportError::CannotEnable { .. }), "{e}");
    }

    #[test]
    fn the_ring_priority_reaches_the_ring_config() {
        let (_d, p) = param("Y\n");
        for (ours, theirs) in [
            (RingPriority::Idle, fuser::RingPriority::Idle),
            (RingPriority::Normal, fuser::RingPriority::Normal),
            (RingPriority::Off, fuser::RingPriority::Off),
        ] {
            let o = TransportOptions {
                ring_priority: ours,
                ..opts(Transport::Auto, false)
            };
            assert_eq!(prepare_at(&o, &p).unwrap().unwrap().priority, theirs);
        }
    }
}
