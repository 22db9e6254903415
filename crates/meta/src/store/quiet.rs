//! Catching redb's panics quietly. A damaged page that slipped past the
//! integrity check can make redb panic; the store's guard turns that into
//! an error (`MetaError::Panicked`) and the report names what was
//! unreadable, so the default hook's "thread '…' panicked at …" text on
//! stderr would only alarm. The hook installed here stays silent while the
//! panicking thread is inside a guard and hands every other panic to the
//! hook that was there before it (unchanged output for real bugs), as it
//! does a panic during unwinding, which aborts the process.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// How many guards this thread is inside (guards nest).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// A guarded panic is unwinding on this thread.
    static UNWINDING: Cell<bool> = const { Cell::new(false) };
}

static HOOK: Once = Once::new();

/// Installs (once per process) the hook that keeps guarded panics quiet.
fn install() {
    HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // A second panic while a guarded one unwinds (a drop
            // panicking) aborts the process: never quiet, so that its
            // cause is seen.
            if !inside() || UNWINDING.with(|u| u.replace(true)) {
                before(info)
            }
        }));
    });
}

/// True while this thread runs inside `catch`.
pub(crate) fn inside() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Leaves the guard however `catch`'s closure ends.
struct Leave;

impl Drop for Leave {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// `catch_unwind` whose panic prints nothing: the caller turns it into an
/// error.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    install();
    DEPTH.with(|d| d.set(d.get() + 1));
    let _leave = Leave;
    let r = catch_unwind(AssertUnwindSafe(f));
    UNWINDING.with(|u| u.set(false));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guarded_panic_is_caught_and_the_depth_unwinds() {
        let r = catch(|| -> u32 { panic!("range start index 9 out of range") });
        assert!(r.is_err());
        assert!(!inside(), "the guard's depth must return to 0");
        let nested = catch(|| catch(|| -> u32 { panic!("inner") }).is_err() && inside());
        assert!(matches!(nested, Ok(true)));
        assert!(!inside());
    }
}
