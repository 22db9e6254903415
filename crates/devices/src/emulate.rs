//! Emulation of a slow device for tests and benchmarks (this machine has no
//! HDD): every I/O occupies the device for a fixed latency plus its length
//! divided by a bandwidth, one I/O at a time, like a single disk head. The
//! emulation is a property of the device record, shown by `cairn info` as
//! "emulated" so results made with it are labelled.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Added cost per I/O: `latency_us` plus bytes / `bytes_per_sec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Emulation {
    pub latency_us: u64,
    /// 0 means no bandwidth cap.
    pub bytes_per_sec: u64,
}

impl Emulation {
    fn cost(&self, bytes: usize) -> Duration {
        let xfer = if self.bytes_per_sec == 0 {
            0
        } else {
            u64::try_from(bytes as u128 * 1_000_000_000 / self.bytes_per_sec as u128)
                .unwrap_or(u64::MAX)
        };
        Duration::from_micros(self.latency_us) + Duration::from_nanos(xfer)
    }
}

impl std::fmt::Display for Emulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "latency {} us", self.latency_us)?;
        if self.bytes_per_sec > 0 {
            write!(f, ", {} MiB/s", self.bytes_per_sec >> 20)?;
        }
        Ok(())
    }
}

/// Serializes the I/Os of one emulated device.
#[derive(Debug)]
pub struct Throttle {
    pub emulation: Emulation,
    busy_until: Mutex<Instant>,
}

impl Throttle {
    pub fn new(emulation: Emulation) -> Self {
        Throttle {
            emulation,
            busy_until: Mutex::new(Instant::now()),
        }
    }

    /// Waits until an I/O of `bytes` issued now would have completed.
    pub fn io(&self, bytes: usize) {
        let done = {
            let mut busy = self.busy_until.lock();
            let start = (*busy).max(Instant::now());
            *busy = start + self.emulation.cost(bytes);
            *busy
        };
        let now = Instant::now();
        if done > now {
            std::thread::sleep(done - now);
        }
    }
}

/// Parses a duration such as `8ms`, `250us`, `1s` or a plain number of
/// microseconds.
pub fn parse_duration_us(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("us") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1_000)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1_000_000)
    } else {
        (s, 1)
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (examples: 250us, 8ms, 1s)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("duration '{s}' overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_us("8ms").unwrap(), 8000);
        assert_eq!(parse_duration_us("250us").unwrap(), 250);
        assert_eq!(parse_duration_us("2s").unwrap(), 2_000_000);
        assert_eq!(parse_duration_us("40").unwrap(), 40);
        assert!(parse_duration_us("fast").is_err());
    }

    #[test]
    fn ios_queue_behind_each_other() {
        let t = Throttle::new(Emulation {
            latency_us: 2000,
            bytes_per_sec: 1 << 20,
        });
        let t0 = Instant::now();
        t.io(0);
        t.io(0);
        t.io(1 << 14); // 2 ms + 15.6 ms
        let e = t0.elapsed();
        assert!(e >= Duration::from_micros(6000 + 15_600), "{e:?}");
    }
}
