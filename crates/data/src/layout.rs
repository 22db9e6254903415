//! A segment's layout: `copies=N` (N copies, each on its own device) or
//! `ec=K+M` (Reed-Solomon parity over stripes of K segments), as the admin
//! writes it and as the metadata store and segment records keep it (one
//! number, `Layout::counter`), and the limits of both.

use std::fmt;
use std::str::FromStr;

/// The most copies a segment has (its first and the further ones).
pub const MAX_COPIES: usize = 4;
/// The most data members a stripe has.
pub const MAX_DATA: usize = 16;
/// The most parity members: a segment not yet in a stripe keeps one copy
/// more than the parity members it will get, within `MAX_COPIES`.
pub const MAX_PARITY: usize = MAX_COPIES - 1;

/// How a segment is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// N copies, each on its own device (and failure domain).
    Copies(u8),
    /// Reed–Solomon parity: stripes of `k` segments with `m` parity
    /// members, any `m` of the k+m lost without loss. Until its stripe is
    /// made, a segment keeps m+1 copies (the same protection).
    Ec { k: u8, m: u8 },
}

/// A counter value with this bit holds `ec` (k << 8 | m) rather than a
/// copy count.
pub(crate) const EC_TAG: u64 = 1 << 16;

impl Layout {
    /// Copies a new segment gets (an `ec` one until it is in a stripe).
    pub fn copies(self) -> usize {
        match self {
            Layout::Copies(n) => n as usize,
            Layout::Ec { m, .. } => m as usize + 1,
        }
    }

    /// (k, m) of an `ec` layout.
    pub fn ec(self) -> Option<(usize, usize)> {
        match self {
            Layout::Ec { k, m } => Some((k as usize, m as usize)),
            Layout::Copies(_) => None,
        }
    }

    /// Devices of distinct failure domains the layout needs in full.
    pub fn domains(self) -> usize {
        match self {
            Layout::Copies(n) => n as usize,
            Layout::Ec { k, m } => (k + m) as usize,
        }
    }

    /// The layout as a counter value (also a segment record's `layout`).
    pub fn counter(self) -> u64 {
        match self {
            Layout::Copies(n) => n as u64,
            Layout::Ec { k, m } => EC_TAG | (k as u64) << 8 | m as u64,
        }
    }

    /// Back from `counter`; None for a value no layout has.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "v is 1..=4 or EC_TAG with k and m in its low 16 bits (matched above)"
    )]
    pub(crate) fn from_counter(v: u64) -> Option<Self> {
        match v {
            1..=4 => Some(Layout::Copies(v as u8)),
            _ if v & !0xffff == EC_TAG => {
                let l = Layout::Ec {
                    k: (v >> 8) as u8,
                    m: v as u8,
                };
                check_ec(l).ok().map(|()| l)
            }
            _ => None,
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Copies(n) => write!(f, "copies={n}"),
            Layout::Ec { k, m } => write!(f, "ec={k}+{m}"),
        }
    }
}

/// A policy the admin wrote that Cairn cannot follow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("redundancy '{text}': {why}")]
pub struct PolicyError {
    pub text: String,
    pub why: String,
}

impl FromStr for Layout {
    type Err = PolicyError;
    /// `copies=N` or `ec=K+M` (a file's or directory's policy).
    fn from_str(text: &str) -> Result<Self, PolicyError> {
        parse_layout(text.trim()).map_err(|why| PolicyError {
            text: text.to_string(),
            why,
        })
    }
}

/// `copies=N` (1 to MAX_COPIES) or `ec=K+M`.
#[allow(clippy::cast_possible_truncation, reason = "MAX_COPIES is 4")]
pub(crate) fn parse_layout(l: &str) -> Result<Layout, String> {
    if let Some(ec) = l.strip_prefix("ec=") {
        let parsed = ec
            .split_once('+')
            .and_then(|(k, m)| Some((k.parse::<u8>().ok()?, m.parse::<u8>().ok()?)));
        let Some((k, m)) = parsed else {
            return Err(format!("ec={ec}: expected ec=K+M, e.g. ec=4+2"));
        };
        let layout = Layout::Ec { k, m };
        check_ec(layout)?;
        return Ok(layout);
    }
    let n = l
        .strip_prefix("copies=")
        .ok_or_else(|| format!("'{l}': expected copies=N or ec=K+M"))?;
    match n.parse::<u8>() {
        Ok(n) if (1..=MAX_COPIES as u8).contains(&n) => Ok(Layout::Copies(n)),
        _ => Err(format!("copies={n}: give 1 to {MAX_COPIES}")),
    }
}

/// K from 2 to MAX_DATA, M from 1 to MAX_PARITY.
#[allow(
    clippy::cast_possible_truncation,
    reason = "MAX_DATA and MAX_PARITY are below 256"
)]
fn check_ec(l: Layout) -> Result<(), String> {
    let Layout::Ec { k, m } = l else {
        return Ok(());
    };
    if !(2..=MAX_DATA as u8).contains(&k) || !(1..=MAX_PARITY as u8).contains(&m) {
        return Err(format!(
            "{l}: give 2 to {MAX_DATA} data and 1 to {MAX_PARITY} parity members"
        ));
    }
    Ok(())
}
