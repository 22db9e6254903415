//! Crash points for whole-system tests: a daemon started with
//! `CAIRN_FAILPOINT=NAME` kills itself (SIGKILL, as `kill -9` would) the
//! first time it reaches the point of that name. Points:
//! `tier-move-copied` (a segment's copy is written and synced, e.g. its
//! object uploaded, its table entry not yet switched) and
//! `tier-move-committed` (the new table entry committed, the old slot not
//! yet freed). Unset (always, outside tests): one cached lookup.

use std::sync::OnceLock;

fn armed() -> Option<&'static str> {
    static NAME: OnceLock<Option<String>> = OnceLock::new();
    NAME.get_or_init(|| {
        std::env::var("CAIRN_FAILPOINT")
            .ok()
            .filter(|s| !s.is_empty())
    })
    .as_deref()
}

/// Dies here (SIGKILL) when this point is the armed one.
pub fn hit(name: &str) {
    if armed() == Some(name) {
        tracing::error!("failpoint {name}: killing the process");
        // SAFETY: signals our own process.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
