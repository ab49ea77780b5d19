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
    humantime::format_rfc3339_seconds(instant(at_ms)).to_string()
}

/// `at_ms` as RFC 3339 in UTC, to the millisecond; clamped as [`rfc3339_seconds`].
pub fn rfc3339_millis(at_ms: u64) -> String {
    humantime::format_rfc3339_millis(instant(at_ms)).to_string()
}

fn instant(at_ms: u64) -> SystemTime {
    UNIX_EPOCH + std::time::Duration::from_millis(at_ms.min(LAST_RFC3339_MS))
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
}
