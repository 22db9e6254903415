//! The redundancy policy: how many copies each new segment gets, for the
//! pool and per device class (the class of the segment's first copy), as
//! the admin writes it (`copies=2`, `ssd:copies=2,hdd:copies=1`) and as
//! the metadata store keeps it (one counter per entry, `encode`).

use cairn_devices::DeviceClass;
use std::fmt;
use std::str::FromStr;

use crate::records::MAX_COPIES;

/// The local classes a policy may name (an object store keeps one copy:
/// the store is redundant itself).
const CLASSES: [DeviceClass; 3] = [DeviceClass::Nvme, DeviceClass::Ssd, DeviceClass::Hdd];

/// Copies per class; a class without its own entry takes the pool's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub pool: u8,
    /// Indexed by class rank (nvme, ssd, hdd).
    pub class: [Option<u8>; 3],
}

impl Default for Policy {
    /// One copy: what every pool had before copies existed.
    fn default() -> Self {
        Policy {
            pool: 1,
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
    /// Copies a new segment whose first copy is on a `class` device gets.
    pub fn copies_for(&self, class: DeviceClass) -> usize {
        let own = CLASSES.iter().position(|c| *c == class);
        match own {
            Some(i) => self.class[i].unwrap_or(self.pool) as usize,
            None => 1,
        }
    }

    /// The most copies any class asks for (metadata keeps at least as
    /// many).
    pub fn most_copies(&self) -> usize {
        let classes = self.class.iter().flatten().copied();
        classes.chain([self.pool]).max().unwrap_or(1) as usize
    }

    /// The entries as the metadata store keeps them: (counter name,
    /// copies), the pool's first.
    pub fn encode(&self) -> Vec<(String, u64)> {
        let mut out = vec![("redundancy".to_string(), self.pool as u64)];
        for (c, n) in CLASSES.iter().zip(self.class) {
            out.push((format!("redundancy.{c}"), n.map_or(0, u64::from)));
        }
        out
    }

    /// Back from `encode`'s entries (`get` answers a counter, 0 when it is
    /// absent): a pool that never set one has one copy.
    pub fn decode(get: impl Fn(&str) -> u64) -> Result<Self, PolicyError> {
        let check = |name: &str, v: u64| match v {
            0 => Ok(None),
            1..=4 => Ok(Some(v as u8)),
            _ => Err(PolicyError {
                text: format!("{name}={v}"),
                why: "the metadata store holds an impossible copy count".into(),
            }),
        };
        let pool = check("redundancy", get("redundancy"))?.unwrap_or(1);
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

/// `copies=N` (1 to MAX_COPIES).
fn parse_layout(l: &str) -> Result<u8, String> {
    if let Some(ec) = l.strip_prefix("ec=") {
        return Err(format!(
            "ec={ec}: erasure coding is not available in this version; use copies=N"
        ));
    }
    let n = l
        .strip_prefix("copies=")
        .ok_or_else(|| format!("'{l}': expected copies=N"))?;
    match n.parse::<u8>() {
        Ok(n) if (1..=MAX_COPIES as u8).contains(&n) => Ok(n),
        _ => Err(format!("copies={n}: give 1 to {MAX_COPIES}")),
    }
}

impl fmt::Display for Policy {
    /// The shortest text `from_str` reads back as this policy.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "copies={}", self.pool)?;
        for (c, n) in CLASSES.iter().zip(self.class) {
            if let Some(n) = n {
                write!(f, ",{c}:copies={n}")?;
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
    }

    #[test]
    fn refuses_what_it_cannot_do_with_a_reason() {
        for (text, why) in [
            ("copies=0", "give 1 to 4"),
            ("copies=5", "give 1 to 4"),
            ("copies=two", "give 1 to 4"),
            ("ec=4+2", "erasure coding is not available"),
            ("s3:copies=2", "keeps one copy"),
            ("tape:copies=2", "unknown device class"),
            ("copies=2,copies=3", "given twice"),
            ("replicas=2", "expected copies=N"),
        ] {
            let e = text.parse::<Policy>().unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
        assert!(Policy::decode(|_| 9).is_err());
    }
}
