//! The Lambda side of the chaos run: `triage-lambda` processes, each with its own local
//! Runtime API, fed by a loop that behaves like Lambda's SQS event source mapping.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsBatchResponse;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName};
use serde_json::Value;
use tokio::sync::watch;
use triage::demo::chaos;

use super::support::lambda_event::lambda_event_json;
use super::support::runtime_api::{Outcome, RuntimeApi};
use super::wire::{ESM, WireLog};
use super::{Stack, WorkerProcess, report_note};

/// How long an environment may take to start, or to pick up an event queued behind another.
const START_WITHIN: Duration = Duration::from_secs(120);
/// How long after its deadline an invocation counts as timed out.
const GRACE: Duration = Duration::from_secs(3);
/// How long a poller waits after a failed ReceiveMessage, as the mapping backs off.
const POLL_ERROR_PAUSE: Duration = Duration::from_millis(500);

/// One execution environment: a `triage-lambda` process and the Runtime API it polls.
pub struct LambdaEnv {
    api: RuntimeApi,
    _process: WorkerProcess,
}

/// The environments of one function, replaced when an invocation times out.
pub struct Fleet {
    stack: Arc<Stack>,
    endpoint: String,
    name: String,
    slots: Vec<Mutex<Arc<LambdaEnv>>>,
    started: AtomicU64,
    stdout_files: Mutex<Vec<PathBuf>>,
    /// Where the event source mapping logs its receives, deletes and invocations.
    wire: Arc<WireLog>,
}

impl Fleet {
    /// Starts `n` environments and waits until each polls for its first event.
    pub async fn start(
        stack: Arc<Stack>,
        endpoint: &str,
        name: &str,
        n: usize,
        wire: Arc<WireLog>,
    ) -> Arc<Fleet> {
        let mut fleet = Fleet {
            stack,
            endpoint: endpoint.to_owned(),
            name: name.to_owned(),
            slots: Vec::new(),
            started: AtomicU64::new(0),
            stdout_files: Mutex::new(Vec::new()),
            wire,
        };
        for _ in 0..n {
            let env = fleet.spawn().await;
            assert!(
                env.api.ready(START_WITHIN).await,
                "triage-lambda did not start: {:?}",
                env.api.init_errors()
            );
            fleet.slots.push(Mutex::new(env));
        }
        Arc::new(fleet)
    }

    async fn spawn(&self) -> Arc<LambdaEnv> {
        let generation = self.started.fetch_add(1, Ordering::Relaxed);
        let api = RuntimeApi::start().await;
        let base = format!("/tmp/chaos-{}-lambda-{generation}", self.name);
        let stdout = PathBuf::from(format!("{base}.out"));
        let s = &self.stack;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_triage-lambda"));
        cmd.env("AWS_LAMBDA_RUNTIME_API", api.address())
            .env("AWS_LAMBDA_FUNCTION_NAME", "triage-local")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", format!("env-{generation}"))
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/triage-local")
            .env("TRIAGE_QUEUE_URL", &s.queue_url)
            .env("TRIAGE_DLQ_URL", &s.dlq_url)
            .env("TRIAGE_TABLE", &s.table)
            .env(chaos::RECORD_TABLE_ENV, &s.record_table)
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env_remove("AWS_ENDPOINT_URL_SQS")
            .env_remove("AWS_ENDPOINT_URL_DYNAMODB")
            .env(
                "RUST_LOG",
                std::env::var("CHAOS_RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(format!("{base}.log")).expect("log file"));
        for (k, v) in &s.vars {
            cmd.env(k, v);
        }
        self.stdout_files.lock().unwrap().push(stdout);
        let process = WorkerProcess::new(cmd.spawn().expect("spawn triage-lambda"));
        Arc::new(LambdaEnv {
            api,
            _process: process,
        })
    }

    fn current(&self, slot: usize) -> Arc<LambdaEnv> {
        self.slots[slot].lock().unwrap().clone()
    }

    /// Lambda's answer to a timeout: the environment is discarded (its process killed once
    /// no invocation holds it) and a fresh one takes its place.
    async fn replace(&self, slot: usize, failed: &Arc<LambdaEnv>) {
        if !Arc::ptr_eq(&self.current(slot), failed) {
            return;
        }
        let fresh = self.spawn().await;
        let mut current = self.slots[slot].lock().unwrap();
        if Arc::ptr_eq(&current, failed) {
            *current = fresh;
        }
    }

    /// Environments started, the first ones included.
    pub fn environments_started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Sums the storage counters of every EMF line the environments printed:
    /// (`StorageRetries`, `StorageFailures`).
    pub fn storage_counters(&self) -> (u64, u64) {
        let mut sums = (0, 0);
        for path in self.stdout_files.lock().unwrap().iter() {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            for line in text.lines() {
                let Ok(v) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                sums.0 += v["StorageRetries"].as_u64().unwrap_or(0);
                sums.1 += v["StorageFailures"].as_u64().unwrap_or(0);
            }
        }
        sums
    }

    /// Sums metric `name` over every EMF line of job type `job_type` the environments printed.
    pub fn metric_sum(&self, name: &str, job_type: &str) -> u64 {
        let mut sum = 0;
        for path in self.stdout_files.lock().unwrap().iter() {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            for line in text.lines() {
                let Ok(v) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                if v["JobType"] == job_type {
                    sum += v[name].as_u64().unwrap_or(0);
                }
            }
        }
        sum
    }
}

#[derive(Default)]
pub struct EsmStats {
    pub invocations: AtomicU64,
    pub short_deadlines: AtomicU64,
    pub duplicated_batches: AtomicU64,
    pub error_responses: AtomicU64,
    pub timeouts: AtomicU64,
    /// Polls the emulator answered with an error (after the SDK's own retries); the poller
    /// polls again, as the real mapping does.
    pub poll_errors: AtomicU64,
    /// The most body bytes in one received batch.
    pub max_batch_bytes: AtomicU64,
}

impl EsmStats {
    pub fn summary(&self, fleet: &Fleet) -> String {
        format!(
            "{} invocations of triage-lambda processes, {} with a short deadline, {} batches \
             delivered twice, {} error responses, {} timed out or not started, {} environments started, \
             {} failed polls",
            self.invocations.load(Ordering::Relaxed),
            self.short_deadlines.load(Ordering::Relaxed),
            self.duplicated_batches.load(Ordering::Relaxed),
            self.error_responses.load(Ordering::Relaxed),
            self.timeouts.load(Ordering::Relaxed),
            fleet.environments_started(),
            self.poll_errors.load(Ordering::Relaxed),
        )
    }
}

/// One poller of a local event source mapping: receive up to 10, invoke environment `me`,
/// delete every record not in `batchItemFailures` (nothing when the invocation failed or
/// timed out: those messages come back when their visibility timeout ends). Every
/// `short_every`-th invocation gets a deadline shorter than its slow jobs; every
/// `dup_every`-th batch is also handed, unchanged, to the next environment at the same time
/// (the same delivery twice).
pub async fn esm_loop(
    fleet: Arc<Fleet>,
    me: usize,
    short_every: u64,
    dup_every: u64,
    stats: Arc<EsmStats>,
    mut stop: watch::Receiver<bool>,
) {
    let stack = fleet.stack.clone();
    let wire = fleet.wire.clone();
    let invoke = |slot: usize, event: String, time_left: Duration, handles: Vec<String>| {
        let fleet = fleet.clone();
        let stats = stats.clone();
        async move {
            let env = fleet.current(slot);
            let outcome = env.api.invoke(event, time_left, START_WITHIN, GRACE).await;
            if !matches!(outcome, Outcome::Response(_)) {
                // No answer: nothing is deleted and the environment may be gone with them.
                fleet.wire.holder_lost(handles.iter().map(String::as_str));
            }
            match &outcome {
                Outcome::TimedOut | Outcome::NotStarted => {
                    stats.timeouts.fetch_add(1, Ordering::Relaxed);
                    report_note(&format!(
                        "{}: environment {slot} {outcome:?}; replacing it",
                        fleet.name
                    ));
                    fleet.replace(slot, &env).await;
                }
                Outcome::Error(_) => {
                    stats.error_responses.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Response(_) => {}
            }
            outcome
        }
    };
    loop {
        if *stop.borrow() {
            return;
        }
        let asked = wire.next_seq();
        let received = tokio::select! {
            r = stack
                .sqs
                .receive_message()
                .queue_url(&stack.queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send() => r,
            _ = stop.changed() => return,
        };
        let messages = match received {
            Ok(r) => r.messages.unwrap_or_default(),
            Err(e) => {
                // An emulator's internal error on ReceiveMessage is not the product's fault
                // and not a message's: the mapping polls again after a pause.
                stats.poll_errors.fetch_add(1, Ordering::Relaxed);
                report_note(&format!(
                    "{}: poller {me}: ReceiveMessage failed: {}",
                    fleet.name,
                    aws_sdk_sqs::error::DisplayErrorContext(&e)
                ));
                tokio::select! {
                    _ = tokio::time::sleep(POLL_ERROR_PAUSE) => continue,
                    _ = stop.changed() => return,
                }
            }
        };
        if messages.is_empty() {
            continue;
        }
        wire.received(
            ESM,
            &stack.queue_url,
            asked,
            messages.iter().map(|m| {
                (
                    m.message_id().unwrap_or_default(),
                    m.receipt_handle().unwrap_or_default(),
                    m.body().unwrap_or_default(),
                )
            }),
        );
        let ids: Vec<&str> = messages.iter().filter_map(|m| m.message_id()).collect();
        let handles: Vec<String> = messages
            .iter()
            .filter_map(|m| m.receipt_handle().map(str::to_owned))
            .collect();
        let bytes: usize = messages.iter().map(|m| m.body().map_or(0, str::len)).sum();
        stats.max_batch_bytes.fetch_max(bytes as u64, Ordering::Relaxed);
        let n = stats.invocations.fetch_add(1, Ordering::Relaxed) + 1;
        let short = n % short_every == 0;
        let time_left = if short {
            stats.short_deadlines.fetch_add(1, Ordering::Relaxed);
            // Start margin is 2 s and handlers stop 1.5 s before the deadline: 0.8 s of work.
            Duration::from_millis(2_300)
        } else {
            Duration::from_secs(30)
        };
        let event = lambda_event_json(&messages, &stack.queue_url).to_string();
        let outcomes = if n % dup_every == 0 {
            stats.duplicated_batches.fetch_add(1, Ordering::Relaxed);
            wire.twice(ids.iter().copied());
            let other = (me + 1) % fleet.slots.len();
            let (a, b) = tokio::join!(
                invoke(me, event.clone(), time_left, handles.clone()),
                invoke(other, event, time_left, handles.clone())
            );
            vec![a, b]
        } else {
            vec![invoke(me, event, time_left, handles.clone()).await]
        };
        for outcome in outcomes {
            let Outcome::Response(body) = outcome else {
                continue;
            };
            let response: SqsBatchResponse =
                serde_json::from_str(&body).expect("the function answers with a batch response");
            let failed: HashSet<&str> = response
                .batch_item_failures
                .iter()
                .map(|f| f.item_identifier.as_str())
                .collect();
            if short {
                // Records a short deadline left unsettled: their count may not have been sent.
                wire.short(failed.iter().copied());
            }
            let entries: Vec<DeleteMessageBatchRequestEntry> = messages
                .iter()
                .enumerate()
                .filter(|(_, m)| !failed.contains(m.message_id().unwrap()))
                .map(|(i, m)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(format!("d{i}"))
                        .receipt_handle(m.receipt_handle().unwrap())
                        .build()
                        .unwrap()
                })
                .collect();
            if entries.is_empty() {
                continue;
            }
            // The mapping's delete is AWS's, not the function's: not faulted. A receipt
            // handle that expired in the meantime fails its entry, as it would in AWS.
            let sent_at = wire.next_seq();
            let by_id: Vec<(String, String)> = entries
                .iter()
                .map(|e| (e.id().to_owned(), e.receipt_handle().to_owned()))
                .collect();
            let deleted = stack
                .sqs
                .delete_message_batch()
                .queue_url(&stack.queue_url)
                .set_entries(Some(entries))
                .send()
                .await;
            let ok: HashSet<&str> = deleted
                .as_ref()
                .map(|out| out.successful().iter().map(|s| s.id()).collect())
                .unwrap_or_default();
            wire.deleted(
                sent_at,
                by_id.iter().map(|(id, h)| (h.clone(), ok.contains(id.as_str()))),
            );
        }
    }
}
