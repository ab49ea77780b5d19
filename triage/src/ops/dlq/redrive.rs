//! `dlq redrive`: SQS's own server-side move task (start, status, cancel), with no filter and
//! no attempt ledger reset.

use serde::Serialize;

use super::super::audit::{self, AuditEntry, AuditStatus};
use super::super::output::{Report, Table};
use super::super::{Ctx, ErrorKind, OpsError, OpsResult, queue_arn, resolve_queue};
use super::read::approximate_count;
use sqs_triage::effects::storage_retry::{StorageError, StorageRetry, StorageRetryConfig};

/// A server-side move task (StartMessageMoveTask).
#[derive(Debug, Clone, Serialize)]
pub struct MoveTask {
    /// Handle to cancel it (running tasks only).
    pub task_handle: Option<String>,
    /// RUNNING, COMPLETED, CANCELLING, CANCELLED or FAILED.
    pub status: String,
    /// Source (DLQ) ARN.
    pub source_arn: String,
    /// Destination ARN; absent means each message's original source.
    pub destination_arn: Option<String>,
    /// Messages per second, if limited.
    pub max_per_second: Option<i32>,
    /// Messages moved so far.
    pub moved: i64,
    /// Messages to move in all, when the task started.
    pub to_move: Option<i64>,
    /// Why it failed.
    pub failure_reason: Option<String>,
    /// Start time (epoch ms).
    pub started_at: i64,
}

/// What a `dlq redrive` command did; serialized as `started`, `status` or `cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RedriveAction {
    /// A move task was started.
    Started,
    /// The DLQ's move tasks were read.
    Status,
    /// A move task was cancelled.
    Cancelled,
}

/// The DLQ's recent move tasks.
#[derive(Debug, Clone, Serialize)]
pub struct RedriveReport {
    /// What was done.
    pub action: RedriveAction,
    /// The DLQ.
    pub dlq_url: String,
    /// Task handle (start and cancel).
    pub task_handle: Option<String>,
    /// Messages moved before a cancel.
    pub moved: Option<i64>,
    /// Tasks (status).
    pub tasks: Vec<MoveTask>,
    /// Whether a start or cancel was audited (through an auditing context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditStatus>,
}

impl Report for RedriveReport {
    fn human(&self) -> String {
        match self.action {
            RedriveAction::Started => format!(
                "started a move task on {}: {}\nfollow it with `triage dlq redrive status`\n",
                self.dlq_url,
                self.task_handle.as_deref().unwrap_or("-")
            ),
            RedriveAction::Cancelled => format!(
                "cancelled move task {} after {} message(s)\n",
                self.task_handle.as_deref().unwrap_or("-"),
                self.moved.unwrap_or(0)
            ),
            RedriveAction::Status => {
                if self.tasks.is_empty() {
                    return format!("no move tasks on {}\n", self.dlq_url);
                }
                let mut t =
                    Table::new(["STATUS", "MOVED", "OF", "RATE", "DESTINATION", "HANDLE"]).max_width(100);
                for k in &self.tasks {
                    t.row([
                        k.status.clone(),
                        k.moved.to_string(),
                        k.to_move.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
                        k.max_per_second
                            .map(|n| format!("{n}/s"))
                            .unwrap_or_else(|| "max".into()),
                        k.destination_arn
                            .clone()
                            .unwrap_or_else(|| "original source".into()),
                        k.task_handle.clone().unwrap_or_else(|| "-".into()),
                    ]);
                }
                t.render()
            }
        }
    }

    fn audit(&self) -> Option<&AuditStatus> {
        self.audit.as_ref()
    }
}

/// Move-task calls are tried once: starting a task twice after an unclear answer would
/// fail on the task the first try started, and the operator can run the command again.
fn once() -> StorageRetry {
    StorageRetry::new(StorageRetryConfig {
        max_attempts: 1,
        ..StorageRetryConfig::default()
    })
    .unwrap_or_default()
}

/// A move-task call the endpoint does not implement (moto answers HTTP 500 without an error
/// code) becomes a pointer to `dlq replay`.
fn move_task_error(ctx: &Ctx, op: &str, err: StorageError, dlq_url: &str) -> OpsError {
    let unimplemented = matches!(
        err.code(),
        None | Some("UnsupportedOperation" | "InvalidAction" | "NotImplemented")
    ) && matches!(err.status, Some(400 | 404 | 500 | 501));
    if unimplemented && ctx.custom_endpoint {
        return OpsError::new(
            ErrorKind::Unsupported,
            format!(
                "the endpoint {} does not support {op} (moto does not implement it): use `triage dlq replay`",
                ctx.sqs_endpoint
            ),
        );
    }
    ctx.sqs_storage_error(&err, Some((dlq_url, "TRIAGE_DLQ_URL")))
}

/// What `dlq redrive` is about to start, for the confirmation prompt.
#[derive(Debug, Clone, Serialize)]
pub struct RedrivePlan {
    /// The DLQ.
    pub dlq_url: String,
    /// The destination queue; absent means each message's original source.
    pub to: Option<String>,
    /// Messages in the DLQ now (SQS's approximate count), when known.
    pub approximate_messages: Option<u64>,
    /// Messages per second, if limited.
    pub rate: Option<i32>,
}

impl RedrivePlan {
    /// The confirmation question.
    pub fn question(&self) -> String {
        let count = self
            .approximate_messages
            .map_or_else(|| "every".to_owned(), |n| format!("all (about {n})"));
        let to = self.to.as_deref().map_or_else(
            || "each message's original source queue".to_owned(),
            str::to_owned,
        );
        let rate = self
            .rate
            .map(|r| format!(" at {r} message(s) per second"))
            .unwrap_or_default();
        format!(
            "move {count} message(s) from {} to {to}{rate}, with no filter and no attempt ledger reset? \
             Prefer `triage dlq replay` for a selection. [y/N] ",
            self.dlq_url
        )
    }
}

/// `dlq redrive`: starts SQS's own move task from the DLQ to each message's source (or `to`).
pub async fn redrive_start(
    ctx: &Ctx,
    dlq_url: &str,
    to: Option<&str>,
    rate: Option<i32>,
) -> OpsResult<RedriveReport> {
    redrive_start_confirmed(ctx, dlq_url, to, rate, |_| true).await
}

/// [`redrive_start`] once `confirm` approves the plan (checked after the queues are, before
/// the task starts).
pub async fn redrive_start_confirmed(
    ctx: &Ctx,
    dlq_url: &str,
    to: Option<&str>,
    rate: Option<i32>,
    confirm: impl FnOnce(&RedrivePlan) -> bool,
) -> OpsResult<RedriveReport> {
    if let Some(r) = rate {
        if !(1..=500).contains(&r) {
            return Err(OpsError::usage(
                "--rate for a move task must be 1 to 500 messages per second",
            ));
        }
    }
    let source_arn = queue_arn(ctx, dlq_url, "TRIAGE_DLQ_URL").await?;
    let (to_url, destination_arn) = match to {
        Some(q) => {
            let url = resolve_queue(ctx, q, "--to").await?;
            let arn = queue_arn(ctx, &url, "--to").await?;
            (Some(url), Some(arn))
        }
        None => (None, None),
    };
    let plan = RedrivePlan {
        dlq_url: dlq_url.to_owned(),
        to: to_url,
        approximate_messages: approximate_count(ctx, dlq_url).await,
        rate,
    };
    if !confirm(&plan) {
        return Err(OpsError::usage("redrive cancelled: no move task was started"));
    }
    let started = once()
        .call("StartMessageMoveTask", None, || {
            ctx.sqs
                .start_message_move_task()
                .source_arn(&source_arn)
                .set_destination_arn(destination_arn.clone())
                .set_max_number_of_messages_per_second(rate)
                .send()
        })
        .await;
    let out = match started {
        Ok(out) => out,
        Err(e) => {
            let uncertain = e.uncertain;
            let err = move_task_error(ctx, "StartMessageMoveTask", e, dlq_url);
            // No clear answer: the task may be running, so it is audited as unclear.
            if !uncertain || err.kind == ErrorKind::Unsupported {
                return Err(err);
            }
            let mut entry = AuditEntry::new("dlq.redrive.start", dlq_url)
                .detail(serde_json::json!({ "to": plan.to, "rate": rate }))
                .outcome("unclear", &err.message);
            entry.count = plan.approximate_messages;
            return Err(audit::failed_action(ctx, entry, err).await);
        }
    };
    // The count of a task just started is SQS's approximate number of messages in the DLQ.
    let mut entry = AuditEntry::new("dlq.redrive.start", dlq_url).detail(serde_json::json!({
        "task_handle": out.task_handle,
        "to": plan.to,
        "rate": rate,
        "count_is": "approximate messages in the DLQ when the task started",
    }));
    entry.count = plan.approximate_messages;
    Ok(RedriveReport {
        action: RedriveAction::Started,
        dlq_url: dlq_url.to_owned(),
        task_handle: out.task_handle,
        moved: None,
        tasks: Vec::new(),
        audit: audit::record_action(ctx, entry).await,
    })
}

/// `dlq redrive status`: the DLQ's recent move tasks.
pub async fn redrive_status(ctx: &Ctx, dlq_url: &str) -> OpsResult<RedriveReport> {
    let source_arn = queue_arn(ctx, dlq_url, "TRIAGE_DLQ_URL").await?;
    let out = once()
        .call("ListMessageMoveTasks", None, || {
            ctx.sqs
                .list_message_move_tasks()
                .source_arn(&source_arn)
                .max_results(10)
                .send()
        })
        .await
        .map_err(|e| move_task_error(ctx, "ListMessageMoveTasks", e, dlq_url))?;
    let tasks = out
        .results
        .unwrap_or_default()
        .into_iter()
        .map(|t| MoveTask {
            task_handle: t.task_handle,
            status: t.status.unwrap_or_default(),
            source_arn: t.source_arn.unwrap_or_default(),
            destination_arn: t.destination_arn,
            max_per_second: t.max_number_of_messages_per_second,
            moved: t.approximate_number_of_messages_moved,
            to_move: t.approximate_number_of_messages_to_move,
            failure_reason: t.failure_reason,
            started_at: t.started_timestamp,
        })
        .collect();
    Ok(RedriveReport {
        action: RedriveAction::Status,
        dlq_url: dlq_url.to_owned(),
        task_handle: None,
        moved: None,
        tasks,
        audit: None,
    })
}

/// `dlq redrive cancel [HANDLE]`: cancels the given task, or the DLQ's running one.
pub async fn redrive_cancel(ctx: &Ctx, dlq_url: &str, handle: Option<&str>) -> OpsResult<RedriveReport> {
    let handle = match handle {
        Some(h) => h.to_owned(),
        None => redrive_status(ctx, dlq_url)
            .await?
            .tasks
            .into_iter()
            .find(|t| t.status == "RUNNING")
            .and_then(|t| t.task_handle)
            .ok_or_else(|| {
                OpsError::new(ErrorKind::NotFound, format!("no running move task on {dlq_url}"))
            })?,
    };
    let cancelled = once()
        .call("CancelMessageMoveTask", None, || {
            ctx.sqs.cancel_message_move_task().task_handle(&handle).send()
        })
        .await;
    let out = match cancelled {
        Ok(out) => out,
        Err(e) => {
            let uncertain = e.uncertain;
            let err = move_task_error(ctx, "CancelMessageMoveTask", e, dlq_url);
            if !uncertain || err.kind == ErrorKind::Unsupported {
                return Err(err);
            }
            let entry = AuditEntry::new("dlq.redrive.cancel", dlq_url)
                .detail(serde_json::json!({ "task_handle": handle }))
                .outcome("unclear", &err.message);
            return Err(audit::failed_action(ctx, entry, err).await);
        }
    };
    let moved = out.approximate_number_of_messages_moved;
    let entry = AuditEntry::new("dlq.redrive.cancel", dlq_url)
        .count(u64::try_from(moved).unwrap_or(0))
        .detail(serde_json::json!({ "task_handle": handle }));
    Ok(RedriveReport {
        action: RedriveAction::Cancelled,
        dlq_url: dlq_url.to_owned(),
        task_handle: Some(handle),
        moved: Some(moved),
        tasks: Vec::new(),
        audit: audit::record_action(ctx, entry).await,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_serialize_as_their_names() {
        for (action, name) in [
            (RedriveAction::Started, "started"),
            (RedriveAction::Status, "status"),
            (RedriveAction::Cancelled, "cancelled"),
        ] {
            assert_eq!(serde_json::to_value(action).unwrap(), serde_json::json!(name));
        }
    }
}
