//! The processor itself over one Lambda SQS event, without network: deserialize the event,
//! then the real [`Processor`]'s steps — read each record, admit it, run the registered handler
//! in its own tokio task, decide, and [`plan`](Processor::plan) the batch's effects (DLQ copies,
//! visibility changes, metrics, reports) — and serialize the partial batch response. Only the
//! plan's execution (batched SQS and DynamoDB calls) is left out; on the healthy path (first
//! deliveries that succeed) there is nothing to execute, and [`Bench::process`] runs the whole
//! [`Processor::process`], execution and per-record tracing spans included.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse};
use serde::Deserialize;
use sqs_triage::core::envelope::EnvelopeLimits;
use sqs_triage::core::{Decision, JobError};
use sqs_triage::effects::calls::CallCounter;
use sqs_triage::effects::ledger::AttemptLedger;
use sqs_triage::effects::sqs::Sqs;
use sqs_triage::effects::storage_retry::StorageRetry;
use sqs_triage::processor::registry::{JobContext, Registry};
use sqs_triage::processor::{BatchOutcome, Deadline, Incoming, Plan, Processor, ProcessorConfig, Ran};
use sqs_triage::runtime::lambda::read_records;
use tokio::time::Instant;

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
    event_json_with(records, kind_of)
}

fn event_json_with(records: usize, kind_of: impl Fn(usize) -> Kind) -> String {
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

/// The record handler, the same on both sides of the comparison: decode the payload (the
/// registry does, a payload that does not decode is fatal), fail as the payload says.
async fn handler(email: Email, _ctx: JobContext) -> Result<(), JobError> {
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

/// Nothing listens here: a call would fail, and the call counter would see it.
const UNREACHABLE: &str = "http://127.0.0.1:9";

/// A real processor for `email.send` with the default policies and no breaker store (in a warm
/// environment the breaker state of a batch comes from the store's cache: one lookup per batch
/// and job type), on a current-thread tokio runtime, with the Lambda runtime's tracing level
/// (INFO, lines written nowhere). Its SDK clients count their calls.
pub struct Bench {
    processor: Processor,
    /// How far the invocation deadline is.
    patience: Duration,
    runtime: tokio::runtime::Runtime,
    tracing: tracing::Dispatch,
    /// AWS calls made by the processor's clients.
    pub calls: CallCounter,
}

impl Bench {
    pub fn new() -> Self {
        Self::with_patience(Duration::from_secs(30))
    }

    /// A bench whose invocation deadline is `patience` away, and whose heartbeat ticks no
    /// sooner: under valgrind a pass takes a minute, and a tick would call AWS.
    pub fn with_patience(patience: Duration) -> Self {
        let calls = CallCounter::new();
        let creds = aws_sdk_sqs::config::Credentials::new("bench", "bench", None, None, "bench");
        let sqs = aws_sdk_sqs::Client::from_conf(
            aws_sdk_sqs::Config::builder()
                .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
                .region(aws_sdk_sqs::config::Region::new("us-east-1"))
                .credentials_provider(creds.clone())
                .endpoint_url(UNREACHABLE)
                .interceptor(calls.clone())
                .build(),
        );
        let ddb = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
                .credentials_provider(creds)
                .endpoint_url(UNREACHABLE)
                .interceptor(calls.clone())
                .build(),
        );
        let registry = Registry::default().handle(JOB_TYPE, handler);
        let processor = Processor::new(
            Arc::new(registry),
            Sqs::new(sqs, StorageRetry::default()),
            AttemptLedger::new(ddb, "bench-state", StorageRetry::default()),
            HashMap::new(),
            ProcessorConfig {
                source_queue: "https://sqs.us-east-1.amazonaws.com/123456789012/jobs".into(),
                dlq_url: "https://sqs.us-east-1.amazonaws.com/123456789012/jobs-dlq".into(),
                dlq_max_bytes: DLQ_MAX_BYTES,
                concurrency: 10,
                limits: EnvelopeLimits::default(),
                log_payloads: false,
                receive_limit: None,
                retention: None,
            },
        )
        .with_heartbeat(Some(if patience > Duration::from_secs(30) {
            patience
        } else {
            sqs_triage::processor::DEFAULT_HEARTBEAT
        }));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let tracing = tracing::Dispatch::new(
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::INFO)
                .with_writer(std::io::sink)
                .finish(),
        );
        Self {
            processor,
            patience,
            runtime,
            tracing,
            calls,
        }
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        tracing::dispatcher::with_default(&self.tracing, || self.runtime.block_on(f))
    }

    /// An invocation deadline far enough away for every handler.
    fn deadline(&self) -> Option<Instant> {
        Some(Instant::now() + self.patience)
    }

    /// Steps 1 and 2 of the processor (read, admit, run each handler in its own task): each
    /// record with its final decision.
    pub fn run(&self, records: Vec<Incoming>) -> Vec<Ran> {
        self.block_on(
            self.processor
                .admit_and_run(records, Deadline::new(self.deadline())),
        )
        .0
    }

    /// Step 3 of the processor alone: the plan of a batch that has run.
    pub fn plan(&self, ran: Vec<Ran>, now_ms: u64) -> Plan {
        self.processor.plan(ran, now_ms)
    }

    /// The whole processor, execution and per-record spans included.
    pub fn process(&self, records: Vec<Incoming>) -> BatchOutcome {
        self.block_on(self.processor.process(records, self.deadline()))
    }

    /// The Lambda handler's path on an event: deserialize, the whole [`Processor::process`],
    /// the batch response from its outcome, serialized. Only records that need an AWS call
    /// make one (none on the healthy path).
    pub fn handle_event(&self, raw: &[u8]) -> Tally {
        let records = incoming(raw);
        let mut tally = Tally {
            records: records.len(),
            ..Tally::default()
        };
        let outcome = self.process(records);
        tally.dead_lettered = outcome
            .records
            .iter()
            .filter(|r| matches!(r.decision, Decision::DeadLetter { .. }))
            .count();
        let mut response = SqsBatchResponse::default();
        response.set_failures(outcome.failures());
        tally.failures = response.batch_item_failures.len();
        tally.response_bytes = serde_json::to_vec(&response).map_or(0, |v| v.len());
        tally
    }

    /// The event's pipeline without execution: deserialize, read, admit and run, plan, and
    /// serialize the response the plan gives when every DLQ copy is accepted.
    pub fn process_event(&self, raw: &[u8], now_ms: u64) -> Tally {
        let records = incoming(raw);
        let mut tally = Tally {
            records: records.len(),
            ..Tally::default()
        };
        let plan = self.plan(self.run(records), now_ms);
        let mut response = SqsBatchResponse::default();
        for step in &plan.steps {
            tally.dead_lettered += usize::from(matches!(step.report.decision, Decision::DeadLetter { .. }));
            if !step.effects.settled {
                let mut f = BatchItemFailure::default();
                f.item_identifier = step.report.message_id.clone();
                response.batch_item_failures.push(f);
            }
        }
        tally.failures = response.batch_item_failures.len();
        // The adapter prints the metrics as EMF lines after every batch.
        std::hint::black_box(plan.metrics.emf_lines(now_ms));
        tally.response_bytes = serde_json::to_vec(&response).map_or(0, |v| v.len());
        tally
    }
}

/// The records of a serialized Lambda SQS event, read as the shipped function reads them: the
/// adapter takes the event's bytes as `lambda_runtime` received them, checks they are UTF-8,
/// and reads each record from that text ([`read_records`]).
pub fn incoming(raw: &[u8]) -> Vec<Incoming> {
    let event = std::str::from_utf8(raw).expect("a UTF-8 event");
    read_records(event)
        .expect("an SQS event")
        .into_iter()
        .map(|r| r.expect("a readable record"))
        .collect()
}

/// A Lambda SQS event of `records` first deliveries that all succeed (the healthy path), as
/// JSON.
pub fn healthy_event_json(records: usize) -> String {
    event_json_with(records, |_| Kind::Ok)
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
