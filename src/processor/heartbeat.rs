//! The visibility heartbeat: while a batch's handlers run, every `every` the visibility timeout
//! of each message the batch holds is extended, one `ChangeMessageVisibilityBatch` call per
//! ten messages, so a handler that outlasts the queue's visibility timeout is not delivered
//! to a second consumer meanwhile. It spends no attempt and writes nothing to the ledger.
//!
//! - **What is extended**: every message of the batch, from its read until its record is
//!   finished — the records whose handlers run and, on a FIFO queue, the ones waiting behind
//!   an earlier record of their group (held by this consumer as much as the running one). A
//!   record whose handler ended is finished at the next tick ([`Processor::complete_ended`]),
//!   so its retry or deferral lands before the queue's retention ends; a settled Lambda
//!   record stays extended until the response.
//! - **Never past the retention**: no extension keeps a message hidden past its
//!   `SentTimestamp` + `MessageRetentionPeriod` (SQS deletes it then, hidden or not).
//! - **How far**: [`TICKS_AHEAD`] ticks from now, or the queue's own visibility timeout when
//!   that is longer, so one lost tick does not let a message reappear; cut, for a Lambda
//!   invocation, so a message is visible again no later than [`DEADLINE_SLACK`] after the
//!   invocation's deadline (which may shorten what the receive gave it: a record of an
//!   invocation that times out after the first tick comes back then), and always within
//!   SQS's 12-hour limit counted from the receive. A try retried after throttling asks for
//!   the seconds left until the cap, so it lands by it too.
//! - **Only what moves a message later**: a message's extension is sent only when it ends at
//!   least a tick after the visibility SQS last accepted for it (a worker's receive sets the
//!   first); SQS replaces a visibility timeout, so a worker's message never reappears sooner
//!   than its receive would, and once a Lambda message reached the deadline's slack the later
//!   ticks send nothing for it.
//! - **When it stops**: when the run step ends, before the plan is made: the tick in flight,
//!   if any, is awaited to its answer, never dropped, so no extension can reach SQS after the
//!   execute step set a record's final visibility or deleted it (ordering, not timing). A
//!   tick's call is given up only after as long as its extension lasts (or at the report margin
//!   before the deadline); a request given up then that still reaches SQS late makes its
//!   message come back early, where the early-arrival check defers it without spending an
//!   attempt. A draining worker stops ticking at once, so its batches end by their deadline
//!   as the last accepted tick left it: at most the longer of three ticks and the receive's
//!   visibility timeout after it was asked to stop.
//! - **Probes**: a worker's probe handler (a half-open breaker's permit) is stopped by the
//!   permit's lease, however far the heartbeat moves its batch's deadline, and its outcome is
//!   reported as soon as it ends; the batch's other handlers run on.
//! - **When it fails**: a tick whose call or entries fail (throttling after the storage
//!   retries, a receipt handle SQS no longer knows) is logged; it fails neither the batch nor
//!   the record. A worker's batch deadline moves only with extensions SQS accepted for every
//!   message of the batch, so a handler whose message is no longer held is still stopped in
//!   time.
//!
//! A batch whose handlers all finish before the first tick makes no call at all.
//!
//! Ticks are Tokio timers. The wall clock (SQS's 12-hour limit, the retention's end) is read
//! from the clock of the processor's ledger ([`AttemptLedger::with_clock`]).
//!
//! [`AttemptLedger::with_clock`]: crate::effects::ledger::AttemptLedger::with_clock

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::read::Record;
use super::run::{Finished, Ran};
use super::{Deadline, Early, Processor};
use crate::core::Decision;
use crate::core::decision::{RecordFacts, visibility_limit};

/// Seconds between ticks by default (`TRIAGE_HEARTBEAT_S`): the first tick comes well inside
/// the shortest visibility timeout the worker receives with (10 s) and SQS's default (30 s);
/// a tick costs one call per ten held messages, and only batches with a handler still running
/// after it pay it.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

/// How many ticks ahead an extension reaches: two ticks may be lost (throttled, slow) before
/// a message could reappear.
pub const TICKS_AHEAD: u32 = 3;

/// How long after a Lambda invocation's deadline an extended message may stay hidden at most:
/// the time the event source mapping needs to delete the records the response settled. A
/// record the invocation did not settle (it timed out or crashed) is visible again by then.
pub const DEADLINE_SLACK: Duration = Duration::from_secs(5);

/// SQS's largest visibility timeout, in seconds.
const MAX_VISIBILITY_S: u64 = 43_200;

/// The visibility timeout, in whole seconds, a tick sets on one message: [`TICKS_AHEAD`] ticks
/// of `every`, or `queue_visibility` when longer; at most `to_deadline` (the time left before
/// the invocation's deadline, when there is one) plus [`DEADLINE_SLACK`], and at most `limit`
/// (what SQS's 12-hour limit leaves). `None`: the message cannot be extended any more.
pub fn extension(
    every: Duration,
    queue_visibility: Option<Duration>,
    to_deadline: Option<Duration>,
    limit: Duration,
) -> Option<i32> {
    let mut ext = every
        .saturating_mul(TICKS_AHEAD)
        .max(queue_visibility.unwrap_or_default());
    if let Some(left) = to_deadline {
        ext = ext.min(left.saturating_add(DEADLINE_SLACK));
    }
    let secs = ext.min(limit).as_secs().min(MAX_VISIBILITY_S);
    (secs > 0).then_some(secs as i32)
}

/// Whether a tick should send `target` for a message SQS makes visible again at `until` (when
/// known): only when that moves it later by at least a tick. A Lambda invocation's extensions
/// all end at its deadline's slack, so after the first one SQS accepted the later ticks send
/// nothing; a worker's never set a message's visibility shorter than its receive did.
fn moves_later(until: Option<Instant>, target: Instant, every: Duration) -> bool {
    until.is_none_or(|u| target >= u + every)
}

/// Whether a record's decision sets its message's visibility (it stays in its queue).
fn sets_visibility(d: &Decision) -> bool {
    matches!(
        d,
        Decision::Retry { .. } | Decision::Defer { .. } | Decision::Release
    )
}

/// The batch's deadline as the heartbeat moves it: a worker's deadline follows the
/// visibility of the messages it holds; a Lambda invocation's stays put.
#[derive(Debug)]
pub(super) struct MovingDeadline(Mutex<Deadline>);

impl MovingDeadline {
    pub(super) fn new(deadline: Deadline) -> Self {
        Self(Mutex::new(deadline))
    }

    /// The deadline now.
    pub(super) fn deadline(&self) -> Deadline {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every message of the batch is hidden until at least `until`.
    fn held_until(&self, until: Instant) {
        let mut d = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *d = d.held_until(until);
    }
}

/// One message the heartbeat keeps hidden.
#[derive(Debug)]
pub(super) struct Held {
    /// Its record's position in the batch.
    index: usize,
    receipt: String,
    /// When the queue's retention period for it ends (`SentTimestamp` +
    /// `MessageRetentionPeriod`): SQS deletes it then, hidden or not, so no extension reaches
    /// past it.
    gone: Option<Instant>,
    facts: RecordFacts,
    /// When SQS makes it visible again, as far as known: a worker knows its receive's end
    /// (it chose the visibility timeout); a Lambda record's receive is not known, until the
    /// first extension SQS accepted. After that, the last accepted extension's end.
    until: Option<Instant>,
    /// Settled at a tick, its delete failed: extended until the batch's end deletes it, but
    /// the batch's deadline does not follow it (its extension may fail for good: it may be
    /// deleted after all).
    delete_failed: bool,
}

impl Processor {
    /// The messages of `records` the heartbeat holds (every one with a receipt handle).
    pub(super) fn held(&self, records: &[Record], deadline: Deadline) -> Vec<Held> {
        let clock = self.clock();
        records
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.inc.receipt_handle.is_empty())
            .map(|(index, r)| Held {
                index,
                receipt: r.inc.receipt_handle.clone(),
                gone: r.retention_ends_ms.map(|ms| clock.instant_at(ms)),
                facts: r.facts,
                until: deadline.visible_until(),
                delete_failed: false,
            })
            .collect()
    }

    /// Ticks every `every` until `done` is set (or dropped), or the processor drains. A tick
    /// is awaited to its end before `done` is looked at again. With `early`, each tick also
    /// finishes the records that ended since the last one ([`Processor::complete_ended`]) and
    /// stops extending their messages. Returns the number of ticks and what the early
    /// finishes came to.
    pub(super) async fn beat(
        &self,
        mut held: Vec<Held>,
        every: Duration,
        hold: &MovingDeadline,
        mut done: watch::Receiver<bool>,
        early: Option<&Finished>,
    ) -> (u32, Vec<Early>) {
        let mut ticks = 0;
        let mut settled = Vec::new();
        if held.is_empty() {
            return (ticks, settled);
        }
        let mut next = Instant::now() + every;
        loop {
            tokio::select! {
                biased;
                _ = done.wait_for(|d| *d) => return (ticks, settled),
                () = tokio::time::sleep_until(next) => {}
            }
            if self.draining.load(std::sync::atomic::Ordering::SeqCst) {
                debug!("heartbeat stopped: draining");
                return (ticks, settled);
            }
            let ended = early.map(Finished::take).unwrap_or_default();
            let patience = Instant::now() + every.saturating_mul(TICKS_AHEAD);
            let (ended, released, deadline) = self.release_held(&mut held, ended, hold.deadline());
            let (_, finished) = tokio::join!(
                self.tick(&mut held, every, hold),
                // Boxed: the execute step's future inside the heartbeat's is too deep a type.
                Box::pin(self.complete_ended(ended, deadline.at_most(patience))),
            );
            // A settled record whose delete failed is deleted again at the batch's end: its
            // message stays hidden until then, or it would run again meanwhile.
            if let Some(e) = &finished {
                let undeleted = e.undeleted();
                held.extend(
                    released
                        .into_iter()
                        .filter(|h| undeleted.contains(&h.index))
                        .map(|h| Held { delete_failed: true, ..h }),
                );
            }
            settled.extend(finished);
            ticks += 1;
            next = Instant::now() + every;
        }
    }

    /// Takes out of `held` the messages of `ended` records that no longer need extending:
    /// every one in a worker's batch (the processor deletes the settled ones); in a Lambda
    /// invocation, those whose visibility their decision sets (a retry, a deferral, a
    /// release). A settled Lambda record stays held until the event source mapping deletes it
    /// after the response. Returns the records, the messages taken out, and the deadline their
    /// effects must meet.
    fn release_held(
        &self,
        held: &mut Vec<Held>,
        ended: Vec<(usize, Ran)>,
        deadline: Deadline,
    ) -> (Vec<(usize, Ran)>, Vec<Held>, Deadline) {
        if ended.is_empty() {
            return (ended, Vec::new(), deadline);
        }
        let deletes = deadline.visible_until().is_some();
        let released: std::collections::HashSet<usize> = ended
            .iter()
            .filter(|(_, r)| deletes || sets_visibility(&r.decision))
            .map(|(i, _)| *i)
            .collect();
        // A worker's effects must land while every one of their messages is still hidden.
        let until = held
            .iter()
            .filter(|h| released.contains(&h.index))
            .filter_map(|h| h.until)
            .min();
        let (out, kept): (Vec<Held>, Vec<Held>) = std::mem::take(held)
            .into_iter()
            .partition(|h| released.contains(&h.index));
        *held = kept;
        let deadline = match until {
            Some(u) if deletes => deadline.with_visible_until(u),
            _ => deadline,
        };
        (ended, out, deadline)
    }

    /// One tick: extends every held message, in batches of ten; moves a worker's deadline to
    /// what SQS accepted for all of them.
    async fn tick(&self, held: &mut [Held], every: Duration, hold: &MovingDeadline) {
        let sent = Instant::now();
        let now = self.clock().now_ms();
        let deadline = hold.deadline();
        let to_deadline = deadline.invocation().map(|d| d.saturating_duration_since(sent));
        // Each message is visible again by its cap at the latest, however late a try lands.
        let slack = deadline.invocation().map(|d| d + DEADLINE_SLACK);
        let entries: Vec<(usize, String, i32, Option<Instant>)> = held
            .iter()
            .enumerate()
            .filter_map(|(k, h)| {
                let by = match (slack, h.gone) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let limit = visibility_limit(h.facts, now).min(
                    h.gone
                        .map_or(Duration::MAX, |g| g.saturating_duration_since(sent)),
                );
                extension(every, self.visibility, to_deadline, limit)
                    .filter(|&secs| moves_later(h.until, sent + Duration::from_secs(secs as u64), every))
                    .map(|secs| (k, h.receipt.clone(), secs, by))
            })
            .collect();
        if entries.is_empty() {
            return;
        }
        // A slow tick is waited for as long as its extension would last (the next tick waits
        // for it), but not past the report margin before the deadline, so the batch still
        // settles in time. One abandoned then may still reach SQS later: its message then
        // comes back before its retry delay and the early-arrival check defers it, unspent.
        let patience = sent + every.saturating_mul(TICKS_AHEAD);
        let call_deadline = deadline.admission().map_or(patience, |s| s.min(patience));
        let secs: std::collections::HashMap<usize, (i32, Option<Instant>)> =
            entries.iter().map(|e| (e.0, (e.2, e.3))).collect();
        let asked = entries.len();
        let answer = self
            .sqs
            .change_visibility_by(&self.source_queue, entries, Some(call_deadline))
            .await;
        for k in &answer.accepted {
            if let (Some(h), Some(&(s, by))) = (held.get_mut(*k), secs.get(k)) {
                // SQS counts the timeout from when it took the call: no sooner than it was
                // sent, and no later than the entry's cap. It replaces the visibility the
                // message had, longer or not.
                let until = sent + Duration::from_secs(s as u64);
                h.until = Some(by.map_or(until, |b| until.min(b)));
            }
        }
        if let Some((_, why)) = answer.failed.first() {
            warn!(
                extended = answer.accepted.len(),
                failed = answer.failed.len(),
                error = %why,
                "heartbeat: visibility not extended for some records; they run on, and may be delivered again if they outlast their visibility timeout"
            );
        } else {
            debug!(extended = asked, "heartbeat: visibility extended");
        }
        // A worker's deadline follows the message hidden the shortest time.
        let until: Option<Vec<Instant>> = held.iter().filter(|h| !h.delete_failed).map(|h| h.until).collect();
        if let Some(until) = until.and_then(|u| u.into_iter().min()) {
            hold.held_until(until);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;
    const LONG: Duration = Duration::from_secs(40_000);

    #[test]
    fn an_extension_reaches_three_ticks_or_the_queue_timeout() {
        assert_eq!(extension(S(5), None, None, LONG), Some(15));
        assert_eq!(extension(S(5), Some(S(8)), None, LONG), Some(15));
        // Never sooner than a plain receive would make it reappear.
        assert_eq!(extension(S(5), Some(S(300)), None, LONG), Some(300));
        assert_eq!(extension(S(2), Some(S(8)), None, LONG), Some(8));
    }

    #[test]
    fn an_extension_ends_shortly_after_the_invocation_deadline() {
        assert_eq!(extension(S(5), Some(S(300)), Some(S(60)), LONG), Some(65));
        assert_eq!(extension(S(5), None, Some(S(3)), LONG), Some(8));
        assert_eq!(
            extension(S(5), None, Some(Duration::from_millis(2_900)), LONG),
            Some(7),
            "whole seconds, rounded down: never past the deadline's slack"
        );
        assert_eq!(extension(S(5), None, Some(Duration::ZERO), LONG), Some(5));
    }

    #[test]
    fn a_tick_sends_only_what_moves_a_message_later_by_a_tick() {
        let now = Instant::now();
        assert!(moves_later(None, now, S(5)), "nothing known: sent");
        assert!(moves_later(Some(now), now + S(5), S(5)));
        assert!(!moves_later(Some(now), now + Duration::from_millis(4_999), S(5)));
        assert!(
            !moves_later(Some(now + S(10)), now + S(3), S(1)),
            "never shorter than what SQS has"
        );
    }

    #[test]
    fn an_extension_stays_within_sqs_limits() {
        assert_eq!(extension(S(5), None, None, S(10)), Some(10));
        assert_eq!(extension(S(5), None, None, Duration::from_millis(999)), None);
        assert_eq!(extension(S(5), None, None, Duration::ZERO), None);
        assert_eq!(extension(S(3_600), Some(S(50_000)), None, LONG), Some(40_000));
        assert_eq!(
            extension(S(3_600), Some(S(50_000)), None, S(90_000)),
            Some(43_200)
        );
    }
}
