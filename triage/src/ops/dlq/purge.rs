//! `dlq purge`: deletes the selected DLQ messages once the operator confirms the plan.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::super::audit::{self, AuditEntry, AuditStatus};
use super::super::output::Report;
use super::super::{Ctx, OpsError, OpsResult};
use super::list::{Group, group};
use super::read::{DlqMessage, Filter, ReadEnd, Sweep, delete, incomplete_problem, release, scan_limit_note};
use sqs_triage::clock::now_ms;

/// What `dlq purge` is about to delete, for the confirmation prompt.
#[derive(Debug, Clone, Serialize)]
pub struct PurgePlan {
    /// The DLQ.
    pub dlq_url: String,
    /// Messages read.
    pub scanned: usize,
    /// Messages selected for deletion, by job type and class.
    pub groups: Vec<Group>,
    /// Messages selected.
    pub selected: usize,
    /// The read stopped at `--max-scan`: messages past them, if any, were not looked at.
    pub scan_limit_reached: bool,
    /// The DLQ was not read to the end (messages kept coming back): messages that match may
    /// not have been read, nor deleted.
    pub incomplete: bool,
}

/// What `dlq purge` did.
#[derive(Debug, Clone, Serialize)]
pub struct PurgeReport {
    /// The plan that was confirmed.
    #[serde(flatten)]
    pub plan: PurgePlan,
    /// Messages deleted.
    pub deleted: usize,
    /// Selected messages that were not deleted (still in the DLQ, unless someone else
    /// deleted them).
    pub failed: usize,
    /// Of those, messages whose hold had expired when the purge was confirmed and that could
    /// not be received again (another reader holds them, or they are gone).
    pub lost_hold: usize,
    /// Whether the purge was audited (purges through an auditing context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditStatus>,
}

impl Report for PurgeReport {
    fn human(&self) -> String {
        format!(
            "deleted {} of {} selected message(s) from {}\n{}",
            self.deleted,
            self.plan.selected,
            self.plan.dlq_url,
            scan_limit_note(self.plan.scan_limit_reached, self.plan.scanned)
        )
    }

    fn problem(&self) -> Option<String> {
        if self.failed == 0 {
            return incomplete_problem(self.plan.incomplete, self.plan.scanned);
        }
        let mut p = format!("{} selected message(s) were not deleted", self.failed);
        if self.lost_hold > 0 {
            p.push_str(&format!(
                " ({} were no longer held when the purge was confirmed and another reader has them or deleted them; run the purge again)",
                self.lost_hold
            ));
        }
        Some(p)
    }

    fn audit(&self) -> Option<&AuditStatus> {
        self.audit.as_ref()
    }
}

impl PurgeReport {
    /// Audits this purge (`dlq.purge` on the DLQ, the count deleted) when `ctx` audits.
    async fn audited(mut self, ctx: &Ctx, opts: &PurgeOptions) -> Self {
        let entry = AuditEntry::new("dlq.purge", &self.plan.dlq_url)
            .count(self.deleted as u64)
            .filter(audit::filter_json(&opts.filter, opts.limit, opts.max_scan))
            .detail(serde_json::json!({
                "scanned": self.plan.scanned,
                "selected": self.plan.selected,
                "failed": self.failed,
                "lost_hold": self.lost_hold,
                "scan_limit_reached": self.plan.scan_limit_reached,
                "incomplete": self.plan.incomplete,
            }));
        self.audit = audit::record_action(ctx, entry).await;
        self
    }
}

impl PurgePlan {
    /// The confirmation question.
    pub fn question(&self) -> String {
        let mut q = format!(
            "delete {} of {} message(s) from {}",
            self.selected, self.scanned, self.dlq_url
        );
        let parts: Vec<String> = self
            .groups
            .iter()
            .map(|g| format!("{} {} × {}", g.count, g.job_type, g.class))
            .collect();
        if !parts.is_empty() {
            q.push_str(&format!(" ({})", parts.join(", ")));
        }
        if self.scan_limit_reached {
            q.push_str(", read up to --max-scan: messages past them, if any, are not included");
        } else if self.incomplete {
            q.push_str(", from a read that did not reach the end of the DLQ");
        }
        q + "? This cannot be undone. [y/N] "
    }
}

/// How `dlq purge` runs.
#[derive(Debug, Clone)]
pub struct PurgeOptions {
    /// Which messages.
    pub filter: Filter,
    /// Delete at most this many.
    pub limit: Option<usize>,
    /// Read at most this many DLQ messages.
    pub max_scan: usize,
    /// How long the selection is held invisible while the operator reads the question
    /// (default 15 minutes).
    pub hold: Duration,
    /// Set (e.g. on Ctrl-C) while the DLQ is read to stop the read: what was read is made
    /// visible again and nothing is deleted. Not looked at once the question is asked.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Default for PurgeOptions {
    fn default() -> Self {
        Self {
            filter: Filter::default(),
            limit: None,
            max_scan: 100_000,
            hold: Duration::from_secs(900),
            stop: None,
        }
    }
}

/// `dlq purge`: deletes the selected DLQ messages once `confirm` approves the plan.
pub async fn purge(
    ctx: &Ctx,
    dlq_url: &str,
    filter: &Filter,
    limit: Option<usize>,
    max_scan: usize,
    confirm: impl FnOnce(&PurgePlan) -> bool,
) -> OpsResult<PurgeReport> {
    let opts = PurgeOptions {
        filter: filter.clone(),
        limit,
        max_scan,
        ..PurgeOptions::default()
    };
    purge_with(ctx, dlq_url, &opts, confirm).await
}

/// [`purge`] with every option.
pub async fn purge_with(
    ctx: &Ctx,
    dlq_url: &str,
    opts: &PurgeOptions,
    confirm: impl FnOnce(&PurgePlan) -> bool,
) -> OpsResult<PurgeReport> {
    opts.filter.validate()?;
    // Long holds: the selection must stay ours while the operator reads the question.
    let mut sweep = Sweep::new(ctx, dlq_url, opts.hold, opts.max_scan);
    let now = now_ms();
    let mut read = PurgeRead::default();
    if let Err(e) = read.select(opts, &mut sweep, now).await {
        let count = read.held.len();
        return Err(give_back(ctx, dlq_url, e, read.held, count).await);
    }
    let PurgeRead {
        held,
        selected,
        scanned,
    } = read;
    let end = sweep.end();
    let plan = PurgePlan {
        dlq_url: dlq_url.to_owned(),
        scanned,
        groups: group(&selected, now),
        selected: selected.len(),
        scan_limit_reached: end == ReadEnd::ScanLimit,
        incomplete: end == ReadEnd::CutShort,
    };
    // Only the selection waits for the answer: the rest goes back now, not after the
    // question (which may wait up to the hold, or be interrupted).
    let chosen: HashSet<&str> = selected.iter().map(|m| m.message_id.as_str()).collect();
    let (held, others): (HashMap<_, _>, HashMap<_, _>) =
        held.into_iter().partition(|(id, _)| chosen.contains(id.as_str()));
    let count = held.len() + others.len();
    release(ctx, dlq_url, handles(others)).await;
    // A stop while the others were given back: the selection goes back too, before any question.
    if stopped(opts) {
        return Err(give_back(ctx, dlq_url, interrupted(), held, count).await);
    }
    if plan.selected == 0 {
        let report = PurgeReport {
            plan,
            deleted: 0,
            failed: 0,
            lost_hold: 0,
            audit: None,
        };
        return Ok(report.audited(ctx, opts).await);
    }
    if !confirm(&plan) {
        release(ctx, dlq_url, handles(held)).await;
        return Err(OpsError::usage("purge cancelled: nothing was deleted"));
    }
    let (deleted, lost_hold) = delete_selected(ctx, dlq_url, opts, &selected, held).await;
    let report = PurgeReport {
        deleted,
        failed: plan.selected - deleted,
        lost_hold,
        plan,
        audit: None,
    };
    Ok(report.audited(ctx, opts).await)
}

/// Message id → (receipt handle, when the receive that gave it was asked for).
type HeldHandles = HashMap<String, (String, Instant)>;

/// What a purge read of the DLQ: every message it holds, the selection, how many it read.
#[derive(Default)]
struct PurgeRead {
    held: HeldHandles,
    selected: Vec<DlqMessage>,
    scanned: usize,
}

impl PurgeRead {
    /// Reads the DLQ to its end (or the scan limit), holding everything and selecting what
    /// the filter matches, up to the limit. A stop is an error: nothing is deleted.
    async fn select(&mut self, opts: &PurgeOptions, sweep: &mut Sweep<'_>, now: u64) -> OpsResult<()> {
        loop {
            if stopped(opts) {
                return Err(interrupted());
            }
            let asked = Instant::now();
            let Some((new, again)) = sweep.next().await? else {
                break;
            };
            self.scanned += new.len();
            for m in again {
                self.held
                    .insert(m.message_id.clone(), (m.receipt_handle.clone(), asked));
            }
            for m in new {
                self.held
                    .insert(m.message_id.clone(), (m.receipt_handle.clone(), asked));
                if opts.limit.is_none_or(|l| self.selected.len() < l) && opts.filter.matches(&m, now) {
                    self.selected.push(m);
                }
            }
        }
        // A stop during the last receive counts too.
        if stopped(opts) {
            return Err(interrupted());
        }
        Ok(())
    }
}

fn stopped(opts: &PurgeOptions) -> bool {
    opts.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst))
}

fn interrupted() -> OpsError {
    OpsError::usage("purge interrupted while reading the DLQ: nothing was deleted")
}

fn handles(held: HeldHandles) -> impl Iterator<Item = String> {
    held.into_values().map(|(h, _)| h)
}

/// Gives back what is held, and says so in `e` (`read`: how many messages were read).
async fn give_back(ctx: &Ctx, dlq_url: &str, e: OpsError, held: HeldHandles, read: usize) -> OpsError {
    let not_released = release(ctx, dlq_url, handles(held)).await;
    match not_released {
        _ if read == 0 => e,
        0 => OpsError::new(
            e.kind,
            format!("{}; the {read} message(s) read are visible again", e.message),
        ),
        n => OpsError::new(
            e.kind,
            format!(
                "{}; {n} of the {read} message(s) read could not be made visible again and come back when their hold ends",
                e.message
            ),
        ),
    }
}

/// Deletes the confirmed selection; returns how many were deleted and how many could not be
/// found again once their hold was over.
///
/// A receipt handle only deletes while its hold lasts: after it expires, another reader may
/// have received the message (SQS then accepts the stale handle and deletes nothing). So a
/// handle whose hold is over, or nearly, is never used: the message is received again by
/// id, and what cannot be found again is reported, not counted as deleted.
async fn delete_selected(
    ctx: &Ctx,
    dlq_url: &str,
    opts: &PurgeOptions,
    selected: &[DlqMessage],
    mut held: HeldHandles,
) -> (usize, usize) {
    let margin = (opts.hold / 4).min(Duration::from_secs(30));
    let confirmed = Instant::now();
    let holds = |asked: Instant| confirmed + margin < asked + opts.hold;
    let mut targets: Vec<(String, String)> = Vec::new();
    let mut stale: HashSet<String> = HashSet::new();
    for m in selected {
        match held.remove(&m.message_id) {
            Some((h, asked)) if holds(asked) => targets.push((m.message_id.clone(), h)),
            _ => {
                stale.insert(m.message_id.clone());
            }
        }
    }
    if !stale.is_empty() {
        let found = receive_again(ctx, dlq_url, &mut stale, opts.max_scan).await;
        targets.extend(found);
    }
    let failed_ids = delete(ctx, dlq_url, &targets).await;
    (targets.len() - failed_ids.len(), stale.len())
}

/// Receives the DLQ again looking for the messages in `wanted` (by message id), to delete them
/// with fresh receipt handles. Returns `(message id, handle)` of those found and removes them
/// from `wanted`; every other message received is made visible again.
async fn receive_again(
    ctx: &Ctx,
    dlq_url: &str,
    wanted: &mut HashSet<String>,
    max_scan: usize,
) -> Vec<(String, String)> {
    let mut sweep = Sweep::new(ctx, dlq_url, Duration::from_secs(60), max_scan);
    let mut found = Vec::new();
    let mut others: HashMap<String, String> = HashMap::new();
    while !wanted.is_empty() {
        let Ok(Some((new, again))) = sweep.next().await else {
            break;
        };
        for m in new.into_iter().chain(again) {
            if wanted.remove(&m.message_id) {
                found.push((m.message_id, m.receipt_handle));
            } else {
                others.insert(m.message_id, m.receipt_handle);
            }
        }
    }
    release(ctx, dlq_url, others.into_values()).await;
    found
}
