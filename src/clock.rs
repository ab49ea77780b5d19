//! The one wall clock: milliseconds since the Unix epoch. Pure code never reads it; it takes
//! the time as an argument.
//!
//! The stores and the heartbeat read it through a [`Clock`]: the system's by default, or, in
//! tests, a manual one that follows Tokio's clock (paused with `start_paused`, it moves with
//! `tokio::time::advance`) and moves on [`Clock::advance`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Wall-clock milliseconds since the Unix epoch (0 for a clock set before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where time is read: the wall clock (epoch milliseconds) and the monotonic one. Cheap to
/// clone; clones share one clock.
#[derive(Debug, Clone, Default)]
pub struct Clock(Source);

#[derive(Debug, Clone, Default)]
enum Source {
    /// [`SystemTime`] and Tokio's [`Instant`].
    #[default]
    System,
    /// A clock a test sets and moves.
    #[cfg(any(test, feature = "internals"))]
    Manual(std::sync::Arc<std::sync::Mutex<Manual>>),
}

/// A manual clock: it reads `wall_ms` plus the time Tokio's clock has moved since `origin`,
/// and `ahead` on both clocks.
#[cfg(any(test, feature = "internals"))]
#[derive(Debug)]
struct Manual {
    origin: Instant,
    wall_ms: u64,
    ahead: Duration,
}

#[cfg(any(test, feature = "internals"))]
impl Manual {
    /// Time moved since the clock was made, by Tokio's clock and by [`Clock::advance`].
    fn moved(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin) + self.ahead
    }
}

impl Clock {
    /// The system's clocks: [`SystemTime`] for the wall clock, Tokio's [`Instant`] for the
    /// monotonic one.
    pub fn system() -> Self {
        Self(Source::System)
    }

    /// A manual clock whose wall clock reads `at_ms` now. From then on both of its clocks
    /// move as Tokio's does (not at all while it is paused, except by
    /// `tokio::time::advance`), and by [`advance`](Self::advance).
    #[cfg(any(test, feature = "internals"))]
    pub fn manual(at_ms: u64) -> Self {
        Self(Source::Manual(std::sync::Arc::new(std::sync::Mutex::new(Manual {
            origin: Instant::now(),
            wall_ms: at_ms,
            ahead: Duration::ZERO,
        }))))
    }

    /// Wall-clock milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        match &self.0 {
            Source::System => now_ms(),
            #[cfg(any(test, feature = "internals"))]
            Source::Manual(m) => {
                let m = m.lock().unwrap_or_else(|e| e.into_inner());
                m.wall_ms.saturating_add(m.moved().as_millis() as u64)
            }
        }
    }

    /// The monotonic clock, to measure ages with: a manual clock reads Tokio's, plus what
    /// [`advance`](Self::advance) added. Not a time to sleep until (see
    /// [`instant_at`](Self::instant_at)).
    pub fn now(&self) -> Instant {
        match &self.0 {
            Source::System => Instant::now(),
            #[cfg(any(test, feature = "internals"))]
            Source::Manual(m) => Instant::now() + m.lock().unwrap_or_else(|e| e.into_inner()).ahead,
        }
    }

    /// The Tokio instant at which this wall clock reads `epoch_ms` (now, for a time past): a
    /// time to sleep until.
    pub fn instant_at(&self, epoch_ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(epoch_ms.saturating_sub(self.now_ms()))
    }

    /// Moves a manual clock `by`, its wall and monotonic clocks alike, as an environment that
    /// ran that long sees them. Tokio's timers do not move (`tokio::time::advance` moves
    /// them, and this clock with them).
    ///
    /// # Panics
    /// On the system clock.
    #[cfg(any(test, feature = "internals"))]
    pub fn advance(&self, by: Duration) {
        let mut m = self.manual_state("advance");
        m.ahead += by;
    }

    /// Sets a manual clock's wall clock to `at_ms`; its monotonic clock does not move. So an
    /// environment frozen between invocations sees it, or one whose wall clock was stepped.
    ///
    /// # Panics
    /// On the system clock.
    #[cfg(any(test, feature = "internals"))]
    pub fn set_ms(&self, at_ms: u64) {
        let mut m = self.manual_state("set_ms");
        let moved = m.moved().as_millis() as u64;
        m.wall_ms = at_ms.saturating_sub(moved);
    }

    #[cfg(any(test, feature = "internals"))]
    fn manual_state(&self, what: &str) -> std::sync::MutexGuard<'_, Manual> {
        match &self.0 {
            Source::Manual(m) => m.lock().unwrap_or_else(|e| e.into_inner()),
            Source::System => panic!("Clock::{what}: the system clock cannot be moved"),
        }
    }
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

    const T0: u64 = 1_800_000_000_000;

    #[tokio::test(start_paused = true)]
    async fn a_manual_clock_follows_tokios_paused_clock() {
        let clock = Clock::manual(T0);
        let started = clock.now();
        assert_eq!(clock.now_ms(), T0);
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(clock.now_ms(), T0 + 90_000);
        assert_eq!(clock.now() - started, Duration::from_secs(90));
    }

    #[tokio::test(start_paused = true)]
    async fn advancing_a_manual_clock_moves_both_of_its_clocks_and_no_timer() {
        let clock = Clock::manual(T0);
        let (started, tokio_started) = (clock.now(), Instant::now());
        clock.clone().advance(Duration::from_secs(3_600));
        assert_eq!(clock.now_ms(), T0 + 3_600_000, "clones share one clock");
        assert_eq!(clock.now() - started, Duration::from_secs(3_600));
        assert_eq!(Instant::now(), tokio_started);
    }

    #[tokio::test(start_paused = true)]
    async fn setting_a_manual_wall_clock_leaves_its_monotonic_clock_alone() {
        let clock = Clock::manual(T0);
        let started = clock.now();
        clock.set_ms(T0 + 3_600_000);
        assert_eq!(clock.now_ms(), T0 + 3_600_000);
        assert_eq!(clock.now(), started);
        clock.set_ms(T0 - 60_000);
        assert_eq!(clock.now_ms(), T0 - 60_000, "a wall clock may be stepped back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wall_time_is_a_tokio_instant_to_sleep_until() {
        let clock = Clock::manual(T0);
        let start = Instant::now();
        assert_eq!(clock.instant_at(T0 + 1_500), start + Duration::from_millis(1_500));
        assert_eq!(clock.instant_at(T0 - 1_500), start, "a time past is now");
    }

    #[test]
    #[should_panic(expected = "the system clock cannot be moved")]
    fn the_system_clock_cannot_be_advanced() {
        Clock::system().advance(Duration::from_secs(1));
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
