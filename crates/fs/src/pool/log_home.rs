//! Where a new pool's intent log goes: areas of the fastest devices (as
//! many copies as the metadata keeps, on devices of different failure
//! domains), not the pool directory's file, which lies on whatever disk
//! holds the pool directory and has one copy. The admin may name the
//! devices (`:log=SIZE` in their specs) or keep the file (`mkfs
//! --intent-log pool-dir`). The log itself is `writeback/log_file.rs`.

use super::MkfsOptions;
use cairn_devices::{DeviceRole, DeviceSpec, MIN_LOG_AREA};

/// Where `mkfs` puts the intent log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogHome {
    /// Areas of the devices (the default).
    #[default]
    Devices,
    /// The pool directory's `intent.log`, as pools made before.
    PoolDir,
}

impl std::str::FromStr for LogHome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "devices" => Ok(LogHome::Devices),
            "pool-dir" => Ok(LogHome::PoolDir),
            _ => Err(format!("'{s}': use devices or pool-dir")),
        }
    }
}

/// The largest area mkfs gives the log on its own: the default log size.
const MAX_AUTO: u64 = crate::writeback::log_file::LOG_SIZE;

/// The log area mkfs gives a device of `size` bytes: a sixteenth of it,
/// in whole MiB, at most the default log size; None when that is under
/// the smallest area or the size is unknown.
fn auto_area(size: Option<u64>) -> Option<u64> {
    let area = (size? / 16).min(MAX_AUTO) & !((1 << 20) - 1);
    (area >= MIN_LOG_AREA).then_some(area)
}

/// Can hold a copy of the log: a tier device on a local file or disk.
fn eligible(d: &DeviceSpec) -> bool {
    d.role == DeviceRole::Tier && !d.class.is_object_store()
}

/// Gives the log its devices unless the admin named them (`:log=`) or
/// chose the pool directory: the fastest eligible devices, one per failure
/// domain, as many as the metadata's copies (which follow the data's
/// redundancy, `meta_copies::wanted_at_mkfs`). Returns a warning when the
/// log ends up with fewer copies than that.
#[allow(
    clippy::cast_possible_truncation,
    reason = "a device id is an index in the list of devices given to mkfs, a handful"
)]
pub fn place(opts: &mut MkfsOptions) -> Option<String> {
    if opts.intent_log == LogHome::PoolDir
        || opts.mirror
        || opts.devices.iter().any(|d| d.log.is_some())
    {
        return None;
    }
    let sizes: Vec<Option<u64>> = (opts.devices.iter().enumerate())
        .map(|(i, d)| cairn_devices::device::planned_size(d, i as u32))
        .collect();
    let mut order: Vec<usize> = (0..opts.devices.len())
        .filter(|&i| eligible(&opts.devices[i]) && auto_area(sizes[i]).is_some())
        .collect();
    let copies = super::meta_copies::wanted_at_mkfs(opts);
    let want = copies.min(order.len().max(1));
    order.sort_by_key(|&i| opts.devices[i].class.rank());
    let mut domains: Vec<Option<&str>> = Vec::new();
    let mut chosen = Vec::new();
    for i in order {
        let d = opts.devices[i].domain.as_deref();
        if chosen.len() < want && (d.is_none() || !domains.contains(&d)) {
            domains.push(d);
            chosen.push(i);
        }
    }
    for &i in &chosen {
        opts.devices[i].log = auto_area(sizes[i]);
    }
    match chosen.len() {
        0 => Some(
            "no device can hold the intent log (each under 128 MiB): it stays in the pool \
             directory, one copy on the disk that holds it"
                .into(),
        ),
        n if n < want => Some(format!(
            "the intent log has {n} copy on the devices (its devices share one failure \
             domain): losing that domain loses fsync'd changes not yet committed; give a \
             device of another domain :log=SIZE for a second copy"
        )),
        _ => None,
    }
}

/// The line mkfs prints about the log.
pub fn mkfs_line(opts: &MkfsOptions) -> String {
    let on: Vec<String> = (opts.devices.iter().enumerate())
        .filter_map(|(i, d)| d.log.map(|l| format!("device {i} ({} MiB)", l >> 20)))
        .collect();
    match on.len() {
        0 => "intent log: the pool directory's intent.log (one copy, two halves)".into(),
        1 => format!("intent log: 1 copy, on {}", on[0]),
        n => format!("intent log: {n} copies, on {}", on.join(" and ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_devices::DeviceClass;

    fn spec(class: DeviceClass, size: u64, domain: Option<&str>) -> DeviceSpec {
        let mut s = DeviceSpec::tier(class, "/x".into(), Some(size));
        s.domain = domain.map(str::to_string);
        s
    }

    fn logs(opts: &MkfsOptions) -> Vec<Option<u64>> {
        opts.devices.iter().map(|d| d.log).collect()
    }

    #[test]
    fn the_log_goes_to_the_fastest_devices_of_different_domains() {
        let g = 1u64 << 30;
        let mut o = MkfsOptions {
            devices: vec![
                spec(DeviceClass::Hdd, 8 * g, None),
                spec(DeviceClass::Ssd, g, Some("a")),
                spec(DeviceClass::Ssd, g, Some("a")),
                spec(DeviceClass::Ssd, 256 << 20, Some("b")),
            ],
            ..Default::default()
        };
        assert_eq!(place(&mut o), None);
        assert_eq!(logs(&o), vec![None, Some(64 << 20), None, Some(16 << 20)]);
        assert!(mkfs_line(&o).contains("2 copies"), "{}", mkfs_line(&o));
    }

    #[test]
    fn data_that_survives_two_losses_gets_three_log_copies() {
        let g = 1u64 << 30;
        let mut o = MkfsOptions {
            devices: (0..6).map(|_| spec(DeviceClass::Ssd, g, None)).collect(),
            redundancy: "ec=4+2".parse().unwrap(),
            ..Default::default()
        };
        assert_eq!(place(&mut o), None);
        assert_eq!(logs(&o).iter().flatten().count(), 3, "{:?}", logs(&o));
        assert!(mkfs_line(&o).contains("3 copies"), "{}", mkfs_line(&o));
    }

    #[test]
    fn named_devices_the_pool_dir_and_small_devices_are_respected() {
        let g = 1u64 << 30;
        let mut o = MkfsOptions {
            devices: vec![
                spec(DeviceClass::Ssd, g, None),
                spec(DeviceClass::Hdd, g, None),
            ],
            ..Default::default()
        };
        o.devices[1].log = Some(32 << 20);
        assert_eq!(place(&mut o), None);
        assert_eq!(logs(&o), vec![None, Some(32 << 20)]);
        o.devices[1].log = None;
        o.intent_log = LogHome::PoolDir;
        assert_eq!(place(&mut o), None);
        assert_eq!(logs(&o), vec![None, None]);
        let mut small = MkfsOptions {
            devices: vec![spec(DeviceClass::Ssd, 100 << 20, None)],
            ..Default::default()
        };
        assert!(place(&mut small).is_some());
        assert_eq!(logs(&small), vec![None]);
        // One device: one copy (its two halves), nothing to warn of.
        let mut one = MkfsOptions {
            devices: vec![spec(DeviceClass::Ssd, g, None)],
            ..Default::default()
        };
        assert_eq!(place(&mut one), None);
        assert_eq!(logs(&one), vec![Some(64 << 20)]);
        // Two devices of one domain: one copy, and a warning.
        let mut shared = MkfsOptions {
            devices: vec![
                spec(DeviceClass::Ssd, g, Some("x")),
                spec(DeviceClass::Ssd, g, Some("x")),
            ],
            ..Default::default()
        };
        let w = place(&mut shared).expect("one copy of two is worth a warning");
        assert!(w.contains("1 copy"), "{w}");
    }
}
