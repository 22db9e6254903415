//! How the kernel hands requests to the daemon: FUSE over io_uring, with one
//! queue per CPU served by threads pinned to that CPU (Linux 6.14+), or the
//! classic /dev/fuse reads. io_uring keeps a request and its reply on one CPU,
//! which on virtual machines makes small operations several times faster.
//! The kernel only offers it while the `fuse` module's `enable_uring`
//! parameter is on; `auto` turns it on when running as root.

use std::path::Path;
use std::str::FromStr;

/// The module parameter that gates FUSE over io_uring.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// io_uring when the kernel has it (enabling it as root), else /dev/fuse.
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

/// Decides the ring setup for a mount, enabling the kernel side if needed
/// and allowed. `Err` only for `On` when io_uring cannot be had.
pub fn prepare(t: Transport) -> Result<Option<fuser::UringConfig>, String> {
    prepare_at(t, Path::new(ENABLE_URING))
}

fn prepare_at(t: Transport, param: &Path) -> Result<Option<fuser::UringConfig>, String> {
    if t == Transport::Off {
        return Ok(None);
    }
    let unavailable = |why: String| match t {
        Transport::On => Err(why),
        _ => {
            tracing::info!("serving /dev/fuse: {why}");
            Ok(None)
        }
    };
    let Ok(v) = std::fs::read_to_string(param) else {
        return unavailable(format!(
            "this kernel has no FUSE over io_uring ({} missing; needs Linux 6.14+)",
            param.display()
        ));
    };
    if v.trim() != "Y" {
        if let Err(e) = std::fs::write(param, "Y") {
            return unavailable(format!(
                "FUSE over io_uring is off in the kernel and cannot be enabled ({e}); \
                 as root: echo Y > {}",
                param.display()
            ));
        }
        tracing::info!(
            "enabled FUSE over io_uring in the kernel ({})",
            param.display()
        );
    }
    Ok(Some(fuser::UringConfig {
        executor: Some(crate::workers::shared()),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert_eq!("auto".parse(), Ok(Transport::Auto));
        assert_eq!("off".parse(), Ok(Transport::Off));
        assert!("yes".parse::<Transport>().is_err());
    }

    #[test]
    fn missing_parameter_falls_back_unless_required() {
        let p = Path::new("/nonexistent/enable_uring");
        assert_eq!(prepare_at(Transport::Auto, p), Ok(None));
        assert!(prepare_at(Transport::On, p)
            .unwrap_err()
            .contains("no FUSE over io_uring"));
        assert_eq!(prepare_at(Transport::Off, p), Ok(None));
    }

    #[test]
    fn enables_an_off_parameter() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("enable_uring");
        std::fs::write(&p, "N\n").unwrap();
        assert!(prepare_at(Transport::Auto, &p).unwrap().is_some());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "Y");
    }
}
