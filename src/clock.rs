//! The one wall clock: milliseconds since the Unix epoch. Pure code never reads it; it takes
//! the time as an argument.

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the Unix epoch (0 for a clock set before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z).
const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

/// `at_ms` as RFC 3339 in UTC, to the second. A time past year 9999 (a stored value no clock
/// wrote) is shown as the last one RFC 3339 can write, never a panic.
pub fn rfc3339_seconds(at_ms: u64) -> String {
    let (date, time, _) = utc(at_ms);
    format!("{date}T{time}Z")
}

/// `at_ms` as RFC 3339 in UTC, to the millisecond; clamped as [`rfc3339_seconds`].
#[cfg(any(test, feature = "internals"))]
pub fn rfc3339_millis(at_ms: u64) -> String {
    let (date, time, ms) = utc(at_ms);
    format!("{date}T{time}.{ms:03}Z")
}

/// The UTC date (`YYYY-MM-DD`), time of day (`HH:MM:SS`) and millisecond of `at_ms`, clamped
/// to year 9999. Written out (Hinnant's days-to-civil) so the library needs no date crate.
fn utc(at_ms: u64) -> (String, String, u64) {
    let at_ms = at_ms.min(LAST_RFC3339_MS);
    let (secs, ms) = (at_ms / 1000, at_ms % 1000);
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    // Days since 0000-03-01, so a year's leap day is its last; an era is 400 years.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let (h, m, s) = (day_secs / 3_600, day_secs / 60 % 60, day_secs % 60);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!("{h:02}:{m:02}:{s:02}"),
        ms,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_no_clock_wrote_are_clamped_not_a_panic() {
        assert_eq!(rfc3339_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_millis(1_500), "1970-01-01T00:00:01.500Z");
        assert_eq!(rfc3339_seconds(u64::MAX), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339_millis(LAST_RFC3339_MS + 1), "9999-12-31T23:59:59.999Z");
    }

    /// Leap days, century rules and month ends, against dates computed independently.
    #[test]
    fn calendar_dates_are_the_gregorian_ones() {
        let cases = [
            (951_782_400_000, "2000-02-29T00:00:00Z"),
            (4_107_542_399_000, "2100-02-28T23:59:59Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00Z"),
            (1_704_067_199_000, "2023-12-31T23:59:59Z"),
            (1_709_208_000_000, "2024-02-29T12:00:00Z"),
            (1_735_689_599_000, "2024-12-31T23:59:59Z"),
        ];
        for (ms, want) in cases {
            assert_eq!(rfc3339_seconds(ms), want, "{ms}");
        }
        assert_eq!(rfc3339_millis(1_709_208_000_007), "2024-02-29T12:00:00.007Z");
    }

    proptest::proptest! {
        /// Every instant RFC 3339 can write is written as humantime writes it.
        #[test]
        fn the_same_text_as_humantime(at_ms in 0..=LAST_RFC3339_MS) {
            let at = UNIX_EPOCH + std::time::Duration::from_millis(at_ms);
            proptest::prop_assert_eq!(
                rfc3339_seconds(at_ms),
                humantime::format_rfc3339_seconds(at).to_string()
            );
            proptest::prop_assert_eq!(
                rfc3339_millis(at_ms),
                humantime::format_rfc3339_millis(at).to_string()
            );
        }
    }
}
