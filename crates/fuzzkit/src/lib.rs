//! Support for the decoders' fuzz tests (issue 15): proptest on stable, a
//! fixed number of cases per target (`config`, overridden by the standard
//! `PROPTEST_CASES` variable for longer runs), strategies that damage a
//! valid encoding the way a device or a peer might (`mutations`, `apply`),
//! and an allocation meter (`metered`) that tells the largest single
//! allocation a decoder made, so a test can check that it never reserved
//! more than its input justifies.
//!
//! Linking this crate installs its counting allocator as the global one:
//! it is a dev-dependency only, for test binaries.

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub use proptest;

/// The proptest configuration of a fuzz target: `default_cases` cases, or
/// `PROPTEST_CASES` when set; no failure files (a failure prints its
/// minimal input, which becomes a named regression test).
pub fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Random bytes, 0 to `max_len` of them.
pub fn bytes(max_len: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..=max_len)
}

/// One damage done to an encoding. Offsets are taken modulo the length of
/// the bytes they apply to, so every mutation applies to any encoding.
#[derive(Debug, Clone)]
pub enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    SetByte {
        at: usize,
        value: u8,
    },
    /// Keeps `len % (n + 1)` of the `n` bytes.
    Truncate {
        len: usize,
    },
    Extend(Vec<u8>),
    /// Overwrites `width` bytes (1, 2, 4 or 8) at `at` with `value` (little
    /// endian, cut to the width): a length or count field made huge, zero,
    /// or just past a limit.
    Field {
        at: usize,
        width: u8,
        value: u64,
    },
    /// Removes `n` bytes at `at` (a shifted layout).
    Cut {
        at: usize,
        n: usize,
    },
}

/// Values that break length and count fields.
fn field_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u32::MAX as u64),
        Just(u16::MAX as u64),
        Just(u8::MAX as u64),
        Just(i64::MAX as u64),
        Just(i32::MAX as u64 + 1),
        (0u32..64).prop_map(|s| 1u64 << s),
        (0u32..64).prop_map(|s| (1u64 << s) - 1),
        any::<u64>(),
    ]
}

/// One mutation.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        3 => (at, 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        2 => (at, any::<u8>()).prop_map(|(at, value)| Mutation::SetByte { at, value }),
        2 => any::<usize>().prop_map(|len| Mutation::Truncate { len }),
        1 => bytes(64).prop_map(Mutation::Extend),
        3 => (at, prop_oneof![Just(1u8), Just(2), Just(4), Just(8)], field_value())
            .prop_map(|(at, width, value)| Mutation::Field { at, width, value }),
        1 => (at, 1usize..16).prop_map(|(at, n)| Mutation::Cut { at, n }),
    ]
}

/// One to four mutations.
pub fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(mutation(), 1..=4)
}

/// `valid` with the mutations applied in order.
pub fn apply(valid: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = valid.to_vec();
    for m in muts {
        apply_one(&mut b, m);
    }
    b
}

fn apply_one(b: &mut Vec<u8>, m: &Mutation) {
    let n = b.len();
    match m {
        Mutation::Truncate { len } => b.truncate(len % (n + 1)),
        Mutation::Extend(more) => b.extend_from_slice(more),
        _ if n == 0 => {}
        Mutation::FlipBit { at, bit } => b[at % n] ^= 1 << bit,
        Mutation::SetByte { at, value } => b[at % n] = *value,
        Mutation::Field { at, width, value } => {
            let at = at % n;
            let w = (*width as usize).min(n - at);
            b[at..at + w].copy_from_slice(&value.to_le_bytes()[..w]);
        }
        Mutation::Cut { at, n: k } => {
            let at = at % n;
            b.drain(at..(at + k).min(n));
        }
    }
}

/// Every strict prefix of `valid`, shortest first (truncation at every
/// length).
pub fn prefixes(valid: &[u8]) -> impl Iterator<Item = &[u8]> {
    (0..valid.len()).map(move |n| &valid[..n])
}

/// What a metered closure allocated on its thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The largest single allocation (or reallocation's new size).
    pub largest: usize,
    /// The sum of all allocation sizes.
    pub total: usize,
}

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f` and returns what it allocated on this thread.
pub fn metered<R>(f: impl FnOnce() -> R) -> (R, Usage) {
    let before = (LARGEST.with(Cell::take), TOTAL.with(Cell::take));
    let r = f();
    let used = Usage {
        largest: LARGEST.with(Cell::get),
        total: TOTAL.with(Cell::get),
    };
    LARGEST.with(|c| c.set(before.0.max(used.largest)));
    TOTAL.with(|c| c.set(before.1.saturating_add(used.total)));
    (r, used)
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
    let _ = TOTAL.try_with(|c| c.set(c.get().saturating_add(size)));
}

/// The system allocator, counting per thread.
struct Meter;

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged, so Meter keeps System's contract; note() only
// updates thread-locals (try_with: no panic during thread teardown).
unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: the caller upholds GlobalAlloc's contract for these
        // arguments, which are passed on unchanged.
        unsafe { System.alloc(l) }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: the caller upholds GlobalAlloc's contract for these
        // arguments, which are passed on unchanged.
        unsafe { System.alloc_zeroed(l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller upholds GlobalAlloc's contract for these
        // arguments, which are passed on unchanged.
        unsafe { System.realloc(p, l, new_size) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller upholds GlobalAlloc's contract for these
        // arguments, which are passed on unchanged.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static METER: Meter = Meter;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_apply_to_any_length() {
        let m = [
            Mutation::FlipBit { at: 7, bit: 3 },
            Mutation::Field {
                at: 5,
                width: 8,
                value: u64::MAX,
            },
            Mutation::Cut { at: 1, n: 9 },
            Mutation::Truncate { len: 100 },
        ];
        for n in 0..10 {
            let _ = apply(&vec![0u8; n], &m);
        }
        assert_eq!(apply(&[0, 0, 0], &m[..1]), [0, 8, 0]);
        assert_eq!(apply(&[0; 4], &m[1..2]), [0, 255, 255, 255]);
    }

    #[test]
    fn the_meter_sees_a_large_allocation() {
        let (v, u) = metered(|| vec![0u8; 1 << 20]);
        assert_eq!(v.len(), 1 << 20);
        assert!(u.largest >= 1 << 20 && u.total >= 1 << 20);
        let ((), u) = metered(|| ());
        assert_eq!(u, Usage::default());
    }
}
