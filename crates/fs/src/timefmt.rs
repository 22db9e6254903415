//! Calendar arithmetic (UTC, proleptic Gregorian) for snapshot names,
//! retention periods and listings.

/// (year, month 1..=12, day 1..=31) of a day number since 1970-01-01.
#[allow(
    clippy::cast_possible_truncation,
    reason = "day 1..=31 and month 1..=12 by the calendar arithmetic"
)]
pub fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

/// "YYYY-MM-DD HH:MM:SS" (UTC) of a unix time in nanoseconds.
pub fn format_utc(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    let (y, m, d) = civil(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// "YYYYMMDD-HHMMSS" (UTC): the name of an automatic snapshot.
pub fn compact_utc(ns: u64) -> String {
    format_utc(ns).replace(['-', ':'], "").replace(' ', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(31), (1970, 2, 1));
        assert_eq!(civil(20779), (2026, 11, 22));
        assert_eq!(civil(-1), (1969, 12, 31));
        assert_eq!(civil(11016), (2000, 2, 29));
        let ns = (20779 * 86_400 + 3723) * 1_000_000_000u64;
        assert_eq!(format_utc(ns), "2026-11-22 01:02:03");
        assert_eq!(compact_utc(ns), "20261122-010203");
    }
}
