//! Rate limit for repeated warnings: the first occurrence of a message is
//! logged, identical ones within the next `WINDOW` are only counted, and
//! the next occurrence after the window logs it again with the count ("N
//! more like this in the last 10 s"). One failing writer can otherwise
//! log a line per request.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

pub const WINDOW: Duration = Duration::from_secs(10);
/// Distinct messages remembered before the table is emptied.
const MAX_KEYS: usize = 4096;

/// Per message: start of its window and occurrences suppressed in it.
static SEEN: LazyLock<Mutex<HashMap<String, (Instant, u64)>>> = LazyLock::new(Default::default);

/// Logs `msg` at WARN unless the same message was logged less than
/// `WINDOW` ago.
pub fn warn(msg: String) {
    if let Some(line) = admit(&SEEN, msg, Instant::now()) {
        tracing::warn!("{line}");
    }
}

/// The line to log for `msg` at `now`, or None when it is suppressed.
fn admit(
    seen: &Mutex<HashMap<String, (Instant, u64)>>,
    msg: String,
    now: Instant,
) -> Option<String> {
    let mut t = seen.lock();
    if t.len() >= MAX_KEYS && !t.contains_key(&msg) {
        t.clear();
    }
    match t.get_mut(&msg) {
        Some((start, n)) if now.duration_since(*start) < WINDOW => {
            *n += 1;
            None
        }
        Some((start, n)) => {
            let line = match *n {
                0 => msg,
                more => format!(
                    "{msg} ({more} more like this in the last {} s)",
                    WINDOW.as_secs()
                ),
            };
            (*start, *n) = (now, 0);
            Some(line)
        }
        None => {
            t.insert(msg.clone(), (now, 0));
            Some(msg)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_then_summary_after_the_window() {
        let seen = Mutex::new(HashMap::new());
        let t0 = Instant::now();
        let m = || "request failed: x".to_string();
        assert_eq!(admit(&seen, m(), t0).as_deref(), Some("request failed: x"));
        for i in 1..=1781 {
            assert_eq!(admit(&seen, m(), t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(admit(&seen, "other".into(), t0).as_deref(), Some("other"));
        let later = t0 + WINDOW + Duration::from_secs(1);
        assert_eq!(
            admit(&seen, m(), later).as_deref(),
            Some("request failed: x (1781 more like this in the last 10 s)")
        );
        assert_eq!(admit(&seen, m(), later), None);
    }
}
