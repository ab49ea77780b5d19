//! The batch's deadline, carried through every step as one value.

use std::time::Duration;

use tokio::time::Instant;

/// Time kept back before the invocation deadline to report the batch: a handler still
/// running then is stopped and counted as a transient failure.
pub(crate) const REPORT_MARGIN: Duration = Duration::from_millis(1_500);

/// Time kept back from the invocation's deadline for writing the batch response after the
/// last effect.
pub(crate) const EFFECTS_MARGIN: Duration = Duration::from_millis(250);

/// The batch's deadline and the deadlines derived from it, carried through a batch as one
/// value: a Lambda invocation's deadline, fixed; or a worker's, `margin` before its messages'
/// visibility timeout ends, which the visibility heartbeat moves as it extends them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Deadline {
    at: Option<Instant>,
    /// `Some`: the deadline is this long before the batch's messages may be visible again,
    /// and follows them.
    margin: Option<Duration>,
}

impl Deadline {
    /// The invocation must answer by `at` (`None`: no deadline). It does not move.
    pub fn new(at: Option<Instant>) -> Self {
        Self { at, margin: None }
    }

    /// A batch of received messages hidden until `visible_until`, to settle `margin` before
    /// that: when the heartbeat extends every message's visibility, the deadline moves with it.
    pub fn visibility(visible_until: Instant, margin: Duration) -> Self {
        Self {
            at: Some(visible_until.checked_sub(margin).unwrap_or(visible_until)),
            margin: Some(margin),
        }
    }

    /// The deadline itself.
    pub fn at(self) -> Option<Instant> {
        self.at
    }

    /// The invocation's fixed deadline, which no extension may outlast by more than
    /// [`DEADLINE_SLACK`](super::heartbeat::DEADLINE_SLACK) (`None` for a deadline that follows visibility, or no deadline).
    pub fn invocation(self) -> Option<Instant> {
        self.at.filter(|_| self.margin.is_none())
    }

    /// When the batch's messages may be visible again at the earliest, for a deadline that
    /// follows visibility.
    pub fn visible_until(self) -> Option<Instant> {
        self.at.zip(self.margin).map(|(at, m)| at + m)
    }

    /// The deadline once every message is known hidden until `until`: moved later for a
    /// deadline that follows visibility, never earlier; a fixed one stays.
    pub fn held_until(self, until: Instant) -> Self {
        match (self.at, self.margin) {
            (Some(at), Some(m)) => Self {
                at: Some(at.max(until.checked_sub(m).unwrap_or(until))),
                margin: Some(m),
            },
            _ => self,
        }
    }

    /// A deadline that follows visibility, for messages hidden until `until` (a fixed one
    /// stays).
    pub(crate) fn with_visible_until(self, until: Instant) -> Self {
        match self.margin {
            Some(m) => Self::visibility(until, m),
            None => self,
        }
    }

    /// The deadline brought back to `cap` when later (a fixed deadline too).
    pub fn at_most(self, cap: Instant) -> Self {
        Self {
            at: self.at.map(|at| at.min(cap)),
            ..self
        }
    }

    /// The latest moment a call before the handlers may end, and when a handler still running
    /// is stopped: the report margin before the deadline, so a stalled read or probe request
    /// leaves time to settle the batch (its records are then released, unspent).
    pub fn admission(self) -> Option<Instant> {
        self.at.map(|d| d.checked_sub(REPORT_MARGIN).unwrap_or(d))
    }

    /// The latest moment an effect after the handlers may end: the effects margin before the
    /// deadline, so the batch response still goes out in time.
    pub fn effects_end(self) -> Option<Instant> {
        self.at.map(|d| d.checked_sub(EFFECTS_MARGIN).unwrap_or(d))
    }

    /// Time left before the deadline.
    pub fn time_left(self) -> Option<Duration> {
        self.at.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// The deadline in epoch ms, `now_ms` being now: how long a probe permit is held.
    pub fn epoch_ms(self, now_ms: u64) -> Option<u64> {
        self.time_left()
            .map(|left| now_ms.saturating_add(left.as_millis() as u64))
    }
}
