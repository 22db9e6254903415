//! The redundancy policy: the layout of each new segment (`copies=N`, or
//! `ec=K+M`: parity over stripes of K segments, see `stripes.rs`), for the
//! pool and per device class (the class of the segment's first copy), as
//! the admin writes it (`copies=2`, `ssd:copies=2,hdd:ec=4+2`) and as the
//! metadata store keeps it (one counter per entry, `encode`).

use cairn_devices::DeviceClass;
use std::fmt;
use std::str::FromStr;

use crate::records::MAX_COPIES;
use crate::stripe_rec::{MAX_DATA, MAX_PARITY};

/// The local classes a policy may name (an object store keeps one copy:
/// the store is redundant itself).
const CLASSES: [DeviceClass; 3] = [DeviceClass::Nvme, DeviceClass::Ssd, DeviceClass::Hdd];

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
const EC_TAG: u64 = 1 << 16;

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

/// The layout per class; a class without its own entry takes the pool's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub pool: Layout,
    /// Indexed by class rank (nvme, ssd, hdd).
    pub class: [Option<Layout>; 3],
}

impl Default for Policy {
    /// One copy: what every pool had before copies existed.
    fn default() -> Self {
        Policy {
            pool: Layout::Copies(1),
            class: [None; 3],
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

impl Policy {
    /// The layout of a new segment whose first copy is on a `class`
    /// device (an object store keeps one copy: it is redundant itself).
    pub fn layout_for(&self, class: DeviceClass) -> Layout {
        let own = CLASSES.iter().position(|c| *c == class);
        match own {
            Some(i) => self.class[i].unwrap_or(self.pool),
            None => Layout::Copies(1),
        }
    }

    /// The layout of a segment whose first copy is on a `class` device and
    /// whose record asks for `own` (a file's policy, `SegmentRec::layout`):
    /// `own` when given, except on an object store (one copy there).
    pub fn segment_layout(&self, class: DeviceClass, own: Option<Layout>) -> Layout {
        match own {
            Some(l) if !class.is_object_store() => l,
            _ => self.layout_for(class),
        }
    }

    /// Copies a new segment whose first copy is on a `class` device gets.
    pub fn copies_for(&self, class: DeviceClass) -> usize {
        self.layout_for(class).copies()
    }

    /// (k, m) when segments of `class` go into stripes.
    pub fn ec_for(&self, class: DeviceClass) -> Option<(usize, usize)> {
        self.layout_for(class).ec()
    }

    fn layouts(&self) -> impl Iterator<Item = Layout> + '_ {
        self.class.iter().flatten().copied().chain([self.pool])
    }

    /// The most copies any class asks for, counting an `ec=K+M` layout as
    /// M+1 (it survives M lost devices): metadata keeps at least as many.
    pub fn most_copies(&self) -> usize {
        self.layouts().map(Layout::copies).max().unwrap_or(1)
    }

    /// The most failure domains a layout of the policy needs in full.
    pub fn most_domains(&self) -> usize {
        self.layouts().map(Layout::domains).max().unwrap_or(1)
    }

    /// The entries as the metadata store keeps them: (counter name,
    /// layout), the pool's first.
    pub fn encode(&self) -> Vec<(String, u64)> {
        let mut out = vec![("redundancy".to_string(), self.pool.counter())];
        for (c, n) in CLASSES.iter().zip(self.class) {
            out.push((format!("redundancy.{c}"), n.map_or(0, Layout::counter)));
        }
        out
    }

    /// Back from `encode`'s entries (`get` answers a counter, 0 when it is
    /// absent): a pool that never set one has one copy.
    pub fn decode(get: impl Fn(&str) -> u64) -> Result<Self, PolicyError> {
        let check = |name: &str, v: u64| match v {
            0 => Ok(None),
            _ => Layout::from_counter(v)
                .map(Some)
                .ok_or_else(|| PolicyError {
                    text: format!("{name}={v}"),
                    why: "the metadata store holds an impossible layout".into(),
                }),
        };
        let pool = check("redundancy", get("redundancy"))?.unwrap_or(Layout::Copies(1));
        let mut class = [None; 3];
        for (i, c) in CLASSES.iter().enumerate() {
            let name = format!("redundancy.{c}");
            class[i] = check(&name, get(&name))?;
        }
        Ok(Policy { pool, class })
    }
}

impl FromStr for Policy {
    type Err = PolicyError;
    /// `copies=N`, or entries `[CLASS:]copies=N` separated by commas (the
    /// one without a class is the pool's, 1 when none is given).
    fn from_str(text: &str) -> Result<Self, PolicyError> {
        let bad = |why: String| PolicyError {
            text: text.to_string(),
            why,
        };
        let mut p = Policy::default();
        let mut seen = Vec::new();
        for item in text.split(',').map(str::trim) {
            let (class, layout) = match item.split_once(':') {
                Some((c, l)) => (Some(c.parse::<DeviceClass>().map_err(bad)?), l),
                None => (None, item),
            };
            let n = parse_layout(layout).map_err(bad)?;
            if seen.contains(&class) {
                return Err(bad(format!("'{item}': given twice")));
            }
            seen.push(class);
            match class {
                None => p.pool = n,
                Some(c) => match CLASSES.iter().position(|x| *x == c) {
                    Some(i) => p.class[i] = Some(n),
                    None => {
                        return Err(bad(format!(
                        "'{item}': an {c} tier keeps one copy (the store keeps its own redundancy)"
                    )))
                    }
                },
            }
        }
        Ok(p)
    }
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
fn parse_layout(l: &str) -> Result<Layout, String> {
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

impl fmt::Display for Policy {
    /// The shortest text `from_str` reads back as this policy.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.pool)?;
        for (c, n) in CLASSES.iter().zip(self.class) {
            if let Some(n) = n {
                write!(f, ",{c}:{n}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pool_and_class_entries_and_prints_them_back() {
        let p: Policy = "ssd:copies=2, hdd:copies=1".parse().unwrap();
        assert_eq!(p.copies_for(DeviceClass::Ssd), 2);
        assert_eq!(p.copies_for(DeviceClass::Hdd), 1);
        assert_eq!(p.copies_for(DeviceClass::Nvme), 1, "the pool's default");
        assert_eq!(p.copies_for(DeviceClass::S3), 1);
        assert_eq!(p.most_copies(), 2);
        let q: Policy = p.to_string().parse().unwrap();
        assert_eq!(p, q);
        let r: Policy = "copies=3".parse().unwrap();
        assert_eq!(r.copies_for(DeviceClass::Nvme), 3);
        let entries = r.encode();
        let back = Policy::decode(|k| entries.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| *v))
            .unwrap();
        assert_eq!(back, r);
        assert_eq!(Policy::decode(|_| 0).unwrap(), Policy::default());
        let e: Policy = "ssd:copies=2,hdd:ec=4+2".parse().unwrap();
        assert_eq!(e.ec_for(DeviceClass::Hdd), Some((4, 2)));
        assert_eq!(e.copies_for(DeviceClass::Hdd), 3, "m+1 until striped");
        assert_eq!(e.ec_for(DeviceClass::Ssd), None);
        assert_eq!((e.most_copies(), e.most_domains()), (3, 6));
        assert_eq!(e.to_string(), "copies=1,ssd:copies=2,hdd:ec=4+2");
        let entries = e.encode();
        let back = Policy::decode(|k| entries.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| *v))
            .unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn refuses_what_it_cannot_do_with_a_reason() {
        for (text, why) in [
            ("copies=0", "give 1 to 4"),
            ("copies=5", "give 1 to 4"),
            ("copies=two", "give 1 to 4"),
            ("ec=1+1", "give 2 to 16 data"),
            ("ec=4+4", "1 to 3 parity"),
            ("ec=4", "expected ec=K+M"),
            ("s3:copies=2", "keeps one copy"),
            ("tape:copies=2", "unknown device class"),
            ("copies=2,copies=3", "given twice"),
            ("replicas=2", "expected copies=N or ec=K+M"),
        ] {
            let e = text.parse::<Policy>().unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
        assert!(Policy::decode(|_| 9).is_err());
        assert!(Policy::decode(|_| EC_TAG | 1 << 8 | 9).is_err());
    }
}
