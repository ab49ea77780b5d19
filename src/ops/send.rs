//! `triage send`: one job from flags, or many from NDJSON, in batches of up to ten entries and
//! SQS's batch payload cap (split by [`crate::effects::sqs::batches`]).

use std::collections::HashMap;

use futures::stream::{self, StreamExt};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::output::{Report, progress};
use super::{Ctx, ErrorKind, OpsError, OpsResult, is_fifo};
use crate::core::envelope::{self, EnvelopeLimits};
use crate::effects::sqs::{BATCH_LIMIT, Outgoing, Sqs, batches};
use crate::effects::storage_retry::{StorageError, sqs_client};

/// Batches in flight at once.
const CONCURRENCY: usize = 8;
/// SQS's longest per-message delay.
const MAX_DELAY_S: u32 = 900;

/// One job to send: the fields of an NDJSON line, or of the `send` flags.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Job type.
    #[serde(rename = "type")]
    pub job_type: String,
    /// Handler input (any JSON; absent means null).
    #[serde(default)]
    pub payload: Value,
    /// Job id (also the FIFO deduplication id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Delivery delay in seconds (0-900, standard queues only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<u32>,
    /// Message group (required for FIFO queues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl JobSpec {
    /// The envelope body a producer would send.
    pub fn body(&self) -> String {
        let mut obj = serde_json::Map::new();
        obj.insert("type".into(), Value::String(self.job_type.clone()));
        obj.insert("payload".into(), self.payload.clone());
        if let Some(id) = &self.id {
            obj.insert("id".into(), Value::String(id.clone()));
        }
        Value::Object(obj).to_string()
    }

    /// Checks the job against the envelope rules and the target queue's kind.
    pub fn validate(&self, fifo: bool) -> Result<(), String> {
        envelope::parse(&self.body(), None, None, EnvelopeLimits::default()).map_err(|e| e.to_string())?;
        if let Some(d) = self.delay {
            if d > MAX_DELAY_S {
                return Err(format!("delay {d}s is over SQS's {MAX_DELAY_S}s maximum"));
            }
            if fifo && d > 0 {
                return Err("FIFO queues take no per-message delay: drop the delay".into());
            }
        }
        if fifo && self.group.as_deref().is_none_or(str::is_empty) {
            return Err("FIFO queues need a message group: pass --group (or \"group\" in NDJSON)".into());
        }
        Ok(())
    }
}

/// Reads NDJSON jobs (blank lines skipped). Any bad line fails the whole input, naming the
/// line, so nothing is half-sent.
pub fn parse_ndjson(text: &str, fifo: bool) -> OpsResult<Vec<(usize, JobSpec)>> {
    let mut jobs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let spec: JobSpec = serde_json::from_str(line).map_err(|e| {
            OpsError::usage(format!(
                "line {n}: not a job: {e} (expected {{\"type\": \"...\", \"payload\": ..., \"id\": \"...\"}})"
            ))
        })?;
        spec.validate(fifo)
            .map_err(|e| OpsError::usage(format!("line {n}: {e}")))?;
        jobs.push((n, spec));
    }
    if jobs.is_empty() {
        return Err(OpsError::usage(
            "no jobs in the input: give one JSON object per line",
        ));
    }
    Ok(jobs)
}

/// A job SQS accepted.
#[derive(Debug, Clone, Serialize)]
pub struct Sent {
    /// Input line (1 for a single job from flags).
    pub line: usize,
    /// Job id, if given.
    pub id: Option<String>,
    /// SQS message id.
    pub message_id: String,
}

/// A job SQS rejected.
#[derive(Debug, Clone, Serialize)]
pub struct Rejected {
    /// Input line.
    pub line: usize,
    /// Job id, if given.
    pub id: Option<String>,
    /// SQS error code.
    pub code: String,
    /// SQS error message.
    pub message: String,
}

/// What `send` did.
#[derive(Debug, Clone, Serialize)]
pub struct SendReport {
    /// Target queue.
    pub queue_url: String,
    /// Jobs in the input.
    pub requested: usize,
    /// Jobs SQS accepted.
    pub accepted: usize,
    /// Accepted jobs and their message ids, in input order.
    pub sent: Vec<Sent>,
    /// Rejected jobs.
    pub rejected: Vec<Rejected>,
}

impl Report for SendReport {
    fn human(&self) -> String {
        let mut out = format!(
            "sent {} of {} job(s) to {}\n",
            self.accepted, self.requested, self.queue_url
        );
        if self.requested == 1 {
            if let Some(s) = self.sent.first() {
                out.push_str(&format!("message id {}\n", s.message_id));
            }
        }
        for r in &self.rejected {
            out.push_str(&format!(
                "rejected line {}{}: {}: {}\n",
                r.line,
                r.id.as_deref().map(|i| format!(" (id {i})")).unwrap_or_default(),
                r.code,
                r.message
            ));
        }
        out
    }

    fn problem(&self) -> Option<String> {
        (self.accepted < self.requested).then(|| {
            format!(
                "{} of {} job(s) were not accepted (see above)",
                self.requested - self.accepted,
                self.requested
            )
        })
    }
}

fn dedup_id(spec: &JobSpec) -> String {
    match &spec.id {
        Some(id) if id.len() <= 128 => id.clone(),
        _ => format!("{:032x}", rand::rng().random::<u128>()),
    }
}

/// An SQS [`StorageError`] that stopped a whole call, as one operator line: a missing queue
/// (exit 3) or an unreachable endpoint (exit 4) say so; anything else is a plain failure.
pub(crate) fn sqs_storage_error(ctx: &Ctx, e: &StorageError, queue: &str, var: &str) -> OpsError {
    let code = e.code().unwrap_or_default();
    if code.contains("NonExistentQueue") || code.contains("QueueDoesNotExist") {
        return OpsError::new(
            ErrorKind::NotFound,
            format!("queue {queue} does not exist: run `triage setup` or check {var}"),
        );
    }
    if e.code().is_none() && e.status.is_none() && e.is_unavailable() {
        let hint = if ctx.custom_endpoint {
            "is the local stack running (`bash infra/local/stack.sh start`)?"
        } else {
            "check the network, AWS_REGION and AWS_ENDPOINT_URL"
        };
        return OpsError::new(
            ErrorKind::Unreachable,
            format!("cannot reach SQS at {}: {hint}", ctx.sqs_endpoint),
        );
    }
    OpsError::new(ErrorKind::Failed, e.to_string())
}

/// Sends the jobs to `queue_url` (several batches in flight). A job counts as sent only when
/// SQS lists it as successful; the others are reported rejected.
pub async fn send(
    ctx: &Ctx,
    queue_url: &str,
    jobs: Vec<(usize, JobSpec)>,
    show_progress: bool,
) -> OpsResult<SendReport> {
    let fifo = is_fifo(queue_url);
    for (line, spec) in &jobs {
        spec.validate(fifo)
            .map_err(|e| OpsError::usage(format!("line {line}: {e}")))?;
    }
    let requested = jobs.len();
    let outgoing: Vec<Outgoing> = jobs
        .iter()
        .enumerate()
        .map(|(key, (_, spec))| Outgoing {
            key,
            body: spec.body(),
            attributes: HashMap::new(),
            group_id: spec.group.clone(),
            dedup_id: fifo.then(|| dedup_id(spec)),
            delay_seconds: if fifo { None } else { spec.delay.map(|d| d as i32) },
        })
        .collect();

    let sqs = Sqs::new(sqs_client(&ctx.sdk), ctx.storage_retry());
    let bar = progress(show_progress, requested as u64, "sending");
    let results = stream::iter(batches(outgoing, BATCH_LIMIT))
        .map(|batch| {
            let (bar, sqs) = (bar.clone(), &sqs);
            async move {
                let n = batch.len() as u64;
                let r = sqs.send(queue_url, batch, None).await;
                bar.inc(n);
                r
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    bar.finish_and_clear();

    let mut sent = Vec::new();
    let mut rejected = Vec::new();
    let mut error = None;
    for r in results {
        for k in r.accepted {
            let (line, spec) = &jobs[k];
            sent.push(Sent {
                line: *line,
                id: spec.id.clone(),
                message_id: r.message_ids.get(&k).cloned().unwrap_or_default(),
            });
        }
        for (k, why) in r.failed {
            let (line, spec) = &jobs[k];
            rejected.push(Rejected {
                line: *line,
                id: spec.id.clone(),
                code: r.codes.get(&k).cloned().unwrap_or_else(|| "Unconfirmed".into()),
                message: why,
            });
        }
        error = error.or(r.error);
    }
    // Nothing reached SQS because of the queue or the endpoint: one clear line, not a list.
    if let (true, Some(e)) = (sent.is_empty(), &error) {
        let line = sqs_storage_error(ctx, e, queue_url, "TRIAGE_QUEUE_URL");
        if line.kind != ErrorKind::Failed {
            return Err(line);
        }
    }
    sent.sort_by_key(|s| s.line);
    rejected.sort_by_key(|r| r.line);
    Ok(SendReport {
        queue_url: queue_url.to_owned(),
        requested,
        accepted: sent.len(),
        sent,
        rejected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndjson_lines_become_jobs() {
        let jobs = parse_ndjson(
            "{\"type\":\"a\",\"payload\":{\"x\":1},\"id\":\"j1\"}\n\n{\"type\":\"b\"}\n",
            false,
        )
        .unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].0, 1);
        assert_eq!(jobs[1].0, 3);
        assert_eq!(jobs[1].1.payload, Value::Null);
        assert_eq!(jobs[0].1.body(), r#"{"id":"j1","payload":{"x":1},"type":"a"}"#);
    }

    #[test]
    fn bad_lines_name_their_line() {
        let e = parse_ndjson("{\"type\":\"a\"}\n{bad\n", false).unwrap_err();
        assert!(e.message.starts_with("line 2: not a job"), "{}", e.message);
        let e = parse_ndjson("{\"type\":\"\"}\n", false).unwrap_err();
        assert!(e.message.starts_with("line 1: job type"), "{}", e.message);
        let e = parse_ndjson("{\"type\":\"a\"}\n", true).unwrap_err();
        assert!(e.message.contains("--group"), "{}", e.message);
        assert!(parse_ndjson("\n", false).is_err());
    }
}
