//! The queue rules that make SQS's redrive, not its retention, end a message no consumer
//! settles. A consumer that crashes, runs out of memory or is killed at its timeout leaves
//! the message hidden until its hold ends; after `maxReceiveCount` such receives SQS moves it
//! to the DLQ. Retention must not delete it first, and the DLQ must not delete it on arrival.

use std::time::Duration;

use thiserror::Error;

/// The share of the source queue's retention that `maxReceiveCount` unsettled holds may take,
/// as numerator and denominator: three quarters. The last quarter is left for the time the
/// message waits in the queue before and between its receives (a backlog, a consumer outage).
pub const HOLDS_SHARE: (u64, u64) = (3, 4);

/// How much longer than its source's the DLQ's retention must be, on a standard queue: SQS
/// keeps a moved message's first enqueue time there, so the DLQ keeps it only for the
/// difference. A day leaves an operator a day to act on the oldest job SQS moves.
pub const DLQ_RETENTION_MARGIN: Duration = Duration::from_secs(24 * 3600);

/// A queue setting under which SQS's redrive cannot keep a message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RedriveError {
    /// The unsettled holds take more than [`HOLDS_SHARE`] of the retention.
    #[error(
        "maxReceiveCount ({max_receive}) x the hold of one unsettled receive ({hold_s} s, the \
         VisibilityTimeout or the heartbeat's reach) = {holds_s} s, above 3/4 of MessageRetentionPeriod \
         ({retention_s} s, so at most {bound_s} s): a message no consumer settles (a crash, out of \
         memory, a timeout) would be deleted by retention before SQS moves it to the DLQ; use a \
         maxReceiveCount of at most {most}, a shorter visibility timeout or a longer retention",
        hold_s = hold.as_secs(),
        holds_s = u64::from(*max_receive) * hold.as_secs(),
        retention_s = retention.as_secs(),
        bound_s = holds_bound(*retention).as_secs(),
        most = most_receives(*hold, *retention),
    )]
    HoldsOutliveRetention {
        /// The redrive policy's `maxReceiveCount`.
        max_receive: u32,
        /// How long one unsettled receive keeps the message hidden.
        hold: Duration,
        /// The source queue's `MessageRetentionPeriod`.
        retention: Duration,
    },
    /// The DLQ does not keep messages a day longer than its source.
    #[error(
        "the DLQ's MessageRetentionPeriod ({dlq_s} s) is not at least a day longer than the source \
         queue's ({source_s} s): SQS keeps a moved message's first enqueue time, so the DLQ would \
         delete what SQS's redrive moves into it within {kept_s} s; give the DLQ a retention of at \
         least {least_s} s (14 days, 1209600 s, is the longest) or shorten the source's",
        dlq_s = dlq.as_secs(),
        source_s = source_queue.as_secs(),
        kept_s = dlq.saturating_sub(*source_queue).as_secs(),
        least_s = (*source_queue + DLQ_RETENTION_MARGIN).as_secs(),
    )]
    DlqRetentionTooShort {
        /// The source queue's `MessageRetentionPeriod`.
        source_queue: Duration,
        /// The DLQ's `MessageRetentionPeriod`.
        dlq: Duration,
    },
}

/// The longest time `maxReceiveCount` unsettled holds may take under `retention`.
pub fn holds_bound(retention: Duration) -> Duration {
    Duration::from_secs(retention.as_secs().saturating_mul(HOLDS_SHARE.0) / HOLDS_SHARE.1)
}

/// The largest `maxReceiveCount` whose holds of `hold` fit [`holds_bound`] of `retention`.
pub fn most_receives(hold: Duration, retention: Duration) -> u64 {
    holds_bound(retention).as_secs() / hold.as_secs().max(1)
}

/// How long one receive that is never settled keeps its message hidden: the visibility timeout
/// it was received with, or, when a heartbeat extended it before the consumer died, what the
/// heartbeat's last tick set (`ticks_ahead` ticks of `heartbeat`), whichever is longer.
pub fn unsettled_hold(visibility: Duration, heartbeat: Option<Duration>, ticks_ahead: u32) -> Duration {
    heartbeat.map_or(visibility, |every| {
        visibility.max(every.saturating_mul(ticks_ahead))
    })
}

/// Refuses a redrive policy whose `max_receive` unsettled holds of `hold` take more than
/// [`HOLDS_SHARE`] of `retention`.
pub fn check_holds(max_receive: u32, hold: Duration, retention: Duration) -> Result<(), RedriveError> {
    let holds = hold.saturating_mul(max_receive);
    if holds > holds_bound(retention) {
        return Err(RedriveError::HoldsOutliveRetention {
            max_receive,
            hold,
            retention,
        });
    }
    Ok(())
}

/// Refuses a standard queue's DLQ that does not keep messages [`DLQ_RETENTION_MARGIN`] longer
/// than its source. A FIFO DLQ gives a moved message a new enqueue time: nothing to check.
pub fn check_dlq_retention(source: Duration, dlq: Duration, fifo: bool) -> Result<(), RedriveError> {
    if !fifo && dlq < source + DLQ_RETENTION_MARGIN {
        return Err(RedriveError::DlqRetentionTooShort {
            source_queue: source,
            dlq,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 24 * 3600;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn holds_may_take_three_quarters_of_the_retention() {
        // The templates' old defaults with a 900 s function: 100 x 5400 s over 4 days.
        let e = check_holds(100, s(5400), s(4 * DAY)).unwrap_err();
        let text = e.to_string();
        for part in [
            "maxReceiveCount (100)",
            "5400 s",
            "540000 s",
            "MessageRetentionPeriod (345600 s",
            "259200 s",
            "at most 48",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        assert_eq!(most_receives(s(5400), s(4 * DAY)), 48);
        check_holds(48, s(5400), s(4 * DAY)).unwrap();
        assert!(check_holds(49, s(5400), s(4 * DAY)).is_err());
        // Exactly three quarters is allowed, one second more is not.
        check_holds(3, s(1), s(4)).unwrap();
        assert!(check_holds(4, s(1), s(4)).is_err());
        assert_eq!(holds_bound(s(7)), s(5));
        assert_eq!(holds_bound(s(60)), s(45));
        // A zero visibility timeout holds nothing.
        check_holds(1000, s(0), s(60)).unwrap();
    }

    #[test]
    fn a_heartbeat_that_reaches_further_than_the_visibility_timeout_is_the_hold() {
        assert_eq!(unsettled_hold(s(30), Some(s(5)), 3), s(30));
        assert_eq!(unsettled_hold(s(10), Some(s(5)), 3), s(15));
        assert_eq!(unsettled_hold(s(10), None, 3), s(10));
    }

    #[test]
    fn a_standard_dlq_keeps_messages_a_day_longer_than_its_source() {
        check_dlq_retention(s(4 * DAY), s(14 * DAY), false).unwrap();
        check_dlq_retention(s(13 * DAY), s(14 * DAY), false).unwrap();
        let e = check_dlq_retention(s(14 * DAY), s(14 * DAY), false).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("MessageRetentionPeriod (1209600 s)") && text.contains("within 0 s"),
            "{text}"
        );
        assert!(check_dlq_retention(s(13 * DAY + 1), s(14 * DAY), false).is_err());
        // FIFO: the move gives the message a new enqueue time.
        check_dlq_retention(s(14 * DAY), s(DAY), true).unwrap();
    }
}
