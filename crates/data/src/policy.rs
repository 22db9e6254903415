//! The redundancy policy: the layout of each new segment (`copies=N`, or
//! `ec=K+M`: parity over stripes of K segments, see `stripes.rs`), for the
//! pool and per device class (the class of the segment's first copy), as
//! the admin writes it (`copies=2`, `ssd:copies=2,hdd:ec=4+2`) and as the
//! metadata store keeps it (one counter per entry, `encode`).

use cairn_devices::DeviceClass;
use std::fmt;
use std::str::FromStr;

use crate::layout::parse_layout;
pub use crate::layout::{Layout, PolicyError};

/// The local classes a policy may name (an object store keeps one copy:
/// the store is redundant itself).
const CLASSES: [DeviceClass; 3] = [DeviceClass::Nvme, DeviceClass::Ssd, DeviceClass::Hdd];

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
    use crate::layout::EC_TAG;

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
