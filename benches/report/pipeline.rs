//! The in-process pipeline over one Lambda SQS event, without network: deserialize the event,
//! read each record, parse its envelope, run an equivalent handler, classify its error, decide
//! (before and after the handler), build the DLQ copy of dead-lettered records, count the
//! metrics, and serialize the partial batch response. What the real processor adds on top is
//! I/O (batched SQS and DynamoDB calls), a tokio task per record and tracing spans.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use rand::RngCore;
use serde::Deserialize;
use sqs_triage::core::envelope::{self, EnvelopeLimits};
use sqs_triage::core::failure::FailureRecord;
use sqs_triage::core::{
    Decision, Execution, Gate, Inputs, JobError, Ledger, RecordFacts, RetryPolicy, decide,
};
use sqs_triage::effects::dlq::dlq_copy;
use sqs_triage::effects::metrics::{Metrics, UNREGISTERED};
use sqs_triage::processor::Incoming;

/// The one job type of the generated event.
pub const JOB_TYPE: &str = "email.send";
/// SQS's default maximum message size, used for the DLQ copies.
const DLQ_MAX_BYTES: usize = 262_144;

/// What one record of the generated event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The handler succeeds.
    Ok,
    /// The handler fails with a transient error.
    Transient,
    /// The handler fails with a fatal error (a payload bug).
    Fatal,
    /// The body is not JSON.
    Malformed,
}

/// The mix of the event: per 100 records, 5 transient, 3 fatal, 2 malformed, 90 succeed.
pub fn kind_of(i: usize) -> Kind {
    match i % 100 {
        0..=4 => Kind::Transient,
        5..=7 => Kind::Fatal,
        8..=9 => Kind::Malformed,
        _ => Kind::Ok,
    }
}

/// A Lambda SQS event of `records` first deliveries with the mix of [`kind_of`], as JSON.
pub fn event_json(records: usize) -> String {
    let mut out = String::with_capacity(records * 1_100 + 32);
    out.push_str("{\"Records\":[");
    for i in 0..records {
        if i > 0 {
            out.push(',');
        }
        let body = match kind_of(i) {
            Kind::Malformed => format!("{{not json {i}"),
            k => {
                let outcome = match k {
                    Kind::Transient => "transient",
                    Kind::Fatal => "fatal",
                    _ => "ok",
                };
                serde_json::json!({
                    "type": JOB_TYPE,
                    "id": format!("job-{i:05}"),
                    "payload": {"to": format!("user{i}@example.com"), "template": "welcome", "outcome": outcome},
                })
                .to_string()
            }
        };
        let sent = 1_700_000_000_000u64 + i as u64;
        let record = serde_json::json!({
            "messageId": format!("{:08x}-0000-4000-8000-{:012x}", i, i),
            // Real receipt handles are opaque strings of a few hundred bytes.
            "receiptHandle": format!("AQEB{}{i:08}", "x".repeat(180)),
            "body": body,
            "attributes": {
                "ApproximateReceiveCount": "1",
                "SentTimestamp": sent.to_string(),
                "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                "ApproximateFirstReceiveTimestamp": (sent + 5).to_string(),
            },
            "messageAttributes": {},
            "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:jobs",
            "awsRegion": "us-east-1",
        });
        let _ = write!(out, "{record}");
    }
    out.push_str("]}");
    out
}

/// The handler's payload type.
#[derive(Deserialize)]
struct Email {
    to: String,
    template: String,
    #[serde(default)]
    outcome: Option<String>,
}

/// The record handler, the same on both sides of the comparison: decode the payload, fail as
/// the payload says.
fn handler(payload: serde_json::Value) -> Result<(), JobError> {
    let email: Email = serde_json::from_value(payload).map_err(|e| JobError::payload_decode(&e))?;
    if email.to.is_empty() || email.template.is_empty() {
        return Err(JobError::fatal("recipient or template missing"));
    }
    match email.outcome.as_deref() {
        Some("transient") => Err(JobError::transient("smtp timeout")),
        Some("fatal") => Err(JobError::fatal("recipient rejected")),
        _ => Ok(()),
    }
}

/// What one pass over the event did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Records in the event.
    pub records: usize,
    /// Reported in `batchItemFailures` (retried).
    pub failures: usize,
    /// Dead-lettered (fatal or invalid), with a DLQ copy built.
    pub dead_lettered: usize,
    /// Bytes of the serialized batch response.
    pub response_bytes: usize,
}

/// Runs the pipeline over one serialized event and returns the serialized response's tally.
pub fn process_event(raw: &[u8], policy: &RetryPolicy, now_ms: u64, rng: &mut dyn RngCore) -> Tally {
    let event: SqsEvent = serde_json::from_slice(raw).expect("a valid SQS event");
    let mut metrics = Metrics::default();
    let mut tally = Tally {
        records: event.records.len(),
        ..Tally::default()
    };
    let mut response = SqsBatchResponse::default();
    for m in event.records {
        let inc = Incoming::from_lambda(m);
        let parsed = envelope::parse(
            &inc.body,
            inc.job_type_attribute(),
            inc.job_id_attribute(),
            EnvelopeLimits::default(),
        );
        let (job, invalid) = match parsed {
            Ok(j) if j.job_type == JOB_TYPE => (Some(j), None),
            Ok(j) => (None, Some(format!("no handler for job type `{}`", j.job_type))),
            Err(e) => (None, Some(e.to_string())),
        };
        let job_id = job
            .as_ref()
            .and_then(|j| j.id.clone())
            .unwrap_or_else(|| inc.message_id.clone());
        let inputs = Inputs {
            record: RecordFacts {
                receive_count: inc.receive_count,
                received_at_ms: now_ms,
                receive_limit: None,
                expires_at_ms: None,
            },
            invalid: invalid.as_deref(),
            ledger: Ledger::FirstDelivery,
            gate: Gate::Closed,
            time_left: Some(Duration::from_secs(30)),
            execution: Execution::NotRun,
            policy,
            now_ms,
        };
        let decision = match (decide(&inputs, rng), job) {
            (Decision::Execute { .. }, Some(job)) => {
                // The processor runs each handler in its own task so a panic fails one record.
                let outcome = catch_unwind(AssertUnwindSafe(|| handler(job.payload)))
                    .unwrap_or_else(|p| Err(JobError::panic(p.as_ref())))
                    .map_err(|e| e.reclassified(policy.rules()));
                decide(
                    &Inputs {
                        execution: Execution::Ran(&outcome),
                        ..inputs
                    },
                    rng,
                )
            }
            (d, _) => d,
        };
        metrics.decision(if invalid.is_some() { UNREGISTERED } else { JOB_TYPE }, &decision);
        match decision {
            Decision::Done { .. } => {}
            Decision::DeadLetter {
                class,
                attempts,
                error,
            } => {
                let record = FailureRecord {
                    class,
                    error,
                    attempts,
                    job_type: invalid.is_none().then(|| JOB_TYPE.to_owned()),
                    job_id,
                    source_queue: "arn:aws:sqs:us-east-1:123456789012:jobs".to_owned(),
                    original_message_id: inc.message_id.clone(),
                    first_received_at: inc.first_received_at_ms.unwrap_or(now_ms),
                    failed_at: now_ms,
                };
                let copy = dlq_copy(&inc.body, &inc.attributes, &record, DLQ_MAX_BYTES);
                tally.dead_lettered += usize::from(copy.is_ok());
            }
            _ => {
                let mut f = BatchItemFailure::default();
                f.item_identifier = inc.message_id;
                response.batch_item_failures.push(f);
            }
        }
    }
    tally.failures = response.batch_item_failures.len();
    // The adapter prints the metrics as EMF lines after every batch.
    std::hint::black_box(metrics.emf_lines(now_ms));
    tally.response_bytes = serde_json::to_vec(&response).map_or(0, |v| v.len());
    tally
}

/// Per record kind, how many records of the first `records` have it.
pub fn mix(records: usize) -> HashMap<&'static str, usize> {
    let mut m = HashMap::new();
    for i in 0..records {
        let k = match kind_of(i) {
            Kind::Ok => "ok",
            Kind::Transient => "transient",
            Kind::Fatal => "fatal",
            Kind::Malformed => "malformed",
        };
        *m.entry(k).or_default() += 1;
    }
    m
}
