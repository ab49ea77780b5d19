//! `triage park JOB_ID [--type T]`: move a job that waits for its next retry to the DLQ now,
//! class `parked`, with the attempts it has used — an operator's "stop retrying this while we
//! fix it".
//!
//! Only a consumer holds the message, so parking is two steps. First, one conditional write
//! marks the job's attempt ledger item parked (`parked_at`, who and why); it must exist and
//! wait for a retry (`next_attempt_at` set, no completion marker). Second, the message is made
//! visible at once with `ChangeMessageVisibility(receipt, 0)`, using the receipt handle and
//! queue the processor stored with the retry's count. Its next delivery reads the ledger,
//! sees the park and dead-letters it without running the handler. The second step is best
//! effort: a stale receipt (the message was received again since, e.g. deferred while a
//! breaker was open) or one never stored (counted by an earlier version) only means the
//! message comes back at its scheduled time and is dead-lettered then.

use serde::Serialize;

use super::audit::{self, AuditEntry, AuditStatus};
use super::output::{Report, Table, age_ms};
use super::{Ctx, ErrorKind, OpsError, OpsResult};
use sqs_triage::clock::now_ms;
use sqs_triage::core::decision::rfc3339_ms;
use sqs_triage::effects::ledger::{LedgerItem, Parked};

/// What to park.
#[derive(Debug, Clone, Default)]
pub struct ParkOptions {
    /// The job id (the envelope `id`, else the SQS message id).
    pub job_id: String,
    /// The job type; needed only when the id has ledgers under several job types.
    pub job_type: Option<String>,
    /// Who parks it (stored on the ledger item and quoted in the failure record).
    pub by: Option<String>,
    /// Why (stored on the ledger item and quoted in the failure record).
    pub reason: Option<String>,
}

/// What `triage park` did.
#[derive(Debug, Clone, Serialize)]
pub struct ParkReport {
    /// The state table.
    pub table: String,
    /// The job id.
    pub job_id: String,
    /// The job type.
    pub job_type: String,
    /// Handler executions counted before the park: the failure record's attempts.
    pub attempts: u32,
    /// When it was parked (epoch ms).
    pub parked_at_ms: u64,
    /// True when it had been parked before (the first park's time is kept).
    pub already_parked: bool,
    /// Who parked it.
    pub parked_by: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// When its retry was due (epoch ms): when it goes to the DLQ if its message could not be
    /// made visible now.
    pub next_attempt_at_ms: Option<u64>,
    /// The queue its message waits in, when the ledger knows it.
    pub queue_url: Option<String>,
    /// True when its message was made visible at once: it goes to the DLQ at its next receive.
    pub released_now: bool,
    /// Why its message could not be made visible now, when it could not.
    pub release_error: Option<String>,
    /// Whether the park was audited (through an auditing context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditStatus>,
}

impl Report for ParkReport {
    fn audit(&self) -> Option<&AuditStatus> {
        self.audit.as_ref()
    }

    fn human(&self) -> String {
        let now = now_ms();
        let mut t = Table::new(["FIELD", "VALUE"]).max_width(200);
        t.row(["job id", self.job_id.as_str()]);
        t.row(["job type", self.job_type.as_str()]);
        t.row(["attempts used".to_owned(), self.attempts.to_string()]);
        t.row([
            "parked at".to_owned(),
            format!(
                "{}{}",
                rfc3339_ms(self.parked_at_ms),
                if self.already_parked {
                    " (already parked)"
                } else {
                    ""
                }
            ),
        ]);
        t.row(["parked by", self.parked_by.as_deref().unwrap_or("-")]);
        t.row(["reason", self.reason.as_deref().unwrap_or("-")]);
        let mut out = t.render();
        let when = match self.next_attempt_at_ms {
            Some(at) if at > now => format!("at its scheduled retry, in {}", age_ms(now, at)),
            _ => "at its next delivery".to_owned(),
        };
        if self.released_now {
            out.push_str(
                "its message was made visible now: the next consumer to receive it moves it to the DLQ (class parked) without running it\n",
            );
        } else {
            out.push_str(&format!(
                "its message could not be made visible now ({}): it moves to the DLQ (class parked) {when}, without running\n",
                self.release_error.as_deref().unwrap_or("no receipt handle stored")
            ));
        }
        out
    }
}

/// A retry due within this long is treated as due (clock skew, the release's own time).
const DUE_MARGIN_MS: u64 = 60_000;

/// Parks one job: see the module documentation. Errors: no ledger for the id (or under
/// `--type`) is "not found" (exit 3); a job with a ledger that does not wait for a retry, and
/// an id with ledgers under several job types and no `--type`, are usage errors (exit 2).
pub async fn park(ctx: &Ctx, table: &str, opts: &ParkOptions) -> OpsResult<ParkReport> {
    let ledger = ctx.ledger(table);
    let id = opts.job_id.as_str();
    let job_type = match &opts.job_type {
        Some(t) => t.clone(),
        None => {
            let all = ledger
                .show_all_types(id)
                .await
                .map_err(|e| ctx.storage_error(e, table))?;
            match all.as_slice() {
                [] => return Err(no_ledger(id, None)),
                [one] => one.job_type.clone().unwrap_or_default(),
                many => {
                    let types: Vec<String> = many
                        .iter()
                        .map(|i| i.job_type.clone().unwrap_or_else(|| "-".into()))
                        .collect();
                    return Err(OpsError::usage(format!(
                        "job {id} has attempt ledgers under {} job types ({}): pass --type",
                        types.len(),
                        types.join(", ")
                    )));
                }
            }
        }
    };
    let started = now_ms();
    let item = match ledger
        .park(&job_type, id, opts.by.as_deref(), opts.reason.as_deref())
        .await
        .map_err(|e| ctx.storage_error(e, table))?
    {
        Parked::Now(item) => item,
        Parked::NoLedger => return Err(no_ledger(id, Some(&job_type))),
        Parked::NotWaiting(item) => return Err(not_waiting(id, &job_type, &item)),
    };
    let parked_at_ms = item.parked_at_ms.unwrap_or(started);
    // Due, or due within a minute: the clocks of this machine and of the consumer that
    // scheduled the retry may differ, and the release itself takes time.
    let due = item
        .next_attempt_at_ms
        .filter(|&t| t <= now_ms().saturating_add(DUE_MARGIN_MS));
    let (released_now, release_error) = match (&item.receipt_handle, &item.queue_url) {
        // Its retry is due: the message may be running under a newer receipt than the one
        // stored, and making a running message visible would hand it to a second consumer.
        _ if due.is_some() => (
            false,
            Some(format!(
                "its retry was due at {}: it may be running now (if that run succeeds, the job \
                 is done and the park is moot; if it fails, the job goes to the DLQ at its next \
                 delivery), so it was not made visible",
                rfc3339_ms(due.unwrap_or_default())
            )),
        ),
        (Some(receipt), Some(queue)) => match release(ctx, queue, receipt).await {
            Ok(()) => (true, None),
            Err(e) => (false, Some(e.message)),
        },
        _ => (
            false,
            Some("no receipt handle stored with its retry (counted by an earlier version)".to_owned()),
        ),
    };
    let mut report = ParkReport {
        table: table.to_owned(),
        job_id: id.to_owned(),
        job_type,
        attempts: item.attempts,
        parked_at_ms,
        already_parked: parked_at_ms < started,
        parked_by: item.parked_by,
        reason: item.parked_reason,
        next_attempt_at_ms: item.next_attempt_at_ms,
        queue_url: item.queue_url,
        released_now,
        release_error,
        audit: None,
    };
    report.audit = audit::record_action(ctx, park_entry(&report)).await;
    Ok(report)
}

/// The audit entry of a park: `park` on the job type, one job.
fn park_entry(r: &ParkReport) -> AuditEntry {
    AuditEntry::new("park", r.job_type.as_str())
        .count(1)
        .filter(serde_json::json!({ "job_id": r.job_id, "type": r.job_type }))
        .detail(serde_json::json!({
            "attempts": r.attempts,
            "already_parked": r.already_parked,
            "reason": r.reason,
            "queue_url": r.queue_url,
            "released_now": r.released_now,
            "release_error": r.release_error,
        }))
}

/// Makes the waiting message visible now (one `ChangeMessageVisibility`), through a context
/// for the queue's region.
async fn release(ctx: &Ctx, queue: &str, receipt: &str) -> OpsResult<()> {
    let ctx = ctx.for_queue(queue, "the ledger's queue_url")?;
    ctx.sqs_call(
        "ChangeMessageVisibility",
        Some((queue, "the ledger's queue_url")),
        || {
            ctx.sqs
                .change_message_visibility()
                .queue_url(queue)
                .receipt_handle(receipt)
                .visibility_timeout(0)
                .send()
        },
    )
    .await
    .map(|_| ())
}

fn no_ledger(id: &str, job_type: Option<&str>) -> OpsError {
    let of_type = job_type.map(|t| format!(" of type {t}")).unwrap_or_default();
    OpsError::new(
        ErrorKind::NotFound,
        format!(
            "job {id}{of_type} is not waiting for a retry: it has no attempt ledger (it never failed, finished, \
             or was replayed; check the id with `triage attempts show`)"
        ),
    )
}

fn not_waiting(id: &str, job_type: &str, item: &LedgerItem) -> OpsError {
    let why = match item.done_at_ms {
        Some(at) => format!("it completed at {}", rfc3339_ms(at)),
        None => format!(
            "its ledger has {} counted attempt(s) and no retry scheduled: it is running, or on its way to the DLQ",
            item.attempts
        ),
    };
    OpsError::usage(format!(
        "job {id} of type {job_type} is not waiting for a retry: {why}"
    ))
}
