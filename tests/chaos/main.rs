//! The chaos run: thousands of `triage.chaos` jobs through two concurrent workers (and, in
//! other scenarios, through `triage-lambda` processes fed by a loop that behaves like the SQS
//! event source mapping) while storage calls fail, the DLQ refuses sends, a worker process is
//! killed with SIGKILL, Lambda deadlines cut batches short and messages are delivered twice.
//! `breaker-cycle` takes a shared dependency down twice under three `triage-lambda` processes
//! and checks from the breaker item that the breaker opened, closed, reopened and closed;
//! `large-fatal` dead-letters batches of ten 110 KB fatal jobs, over SQS's 1 MiB batch cap
//! (which the fault proxy enforces on every scenario).
//!
//! At the end every job is accounted for from the emulators' own state — the chaos handler's
//! side table of executions, the DLQ's failure records, the messages left in the source
//! queue, the attempt ledger — never from the product's logs. DLQ duplicates, repeated
//! executions, late counts and reruns after a DLQ copy are each bounded, job by job, by the
//! events the wire log ([`wire`]) saw on the job's message: none without an injected fault
//! that can repeat work. See `docs/guarantees.md`.
//!
//! Needs the local stack (`bash infra/local/stack.sh start`, then
//! `eval "$(bash infra/local/stack.sh env)"`). Bounded for CI: `CHAOS_JOBS` (default 1000) jobs
//! in the all-faults worker scenario, `CHAOS_SMALL_JOBS` (default 200) in each single-fault
//! one (`breaker-cycle` included; half of it plus 20 large jobs in `large-fatal`) and twice
//! that in the all-faults Lambda one (`CHAOS_JOBS`, when set, sizes both all-faults
//! scenarios). The full-size proof is `CHAOS_JOBS=5000`; `CHAOS_SCENARIOS`
//! (comma-separated names) runs a subset, `CHAOS_MAX_DEPTH` bounds the source queue (300),
//! `CHAOS_LIMIT_S` overrides the time limit per scenario, `CHAOS_RUST_LOG` the log level of the
//! `triage-lambda` processes (`warn`; their logs are `/tmp/chaos-<scenario>-lambda-<n>.log`). Run with
//! `cargo test --test chaos -- --nocapture` to see the table.

mod lambda;
mod rate;
mod router;
#[path = "../support/mod.rs"]
mod support;
mod wire;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_config::SdkConfig;
use aws_sdk_sqs::types::{Message, QueueAttributeName, SendMessageBatchRequestEntry};
use router::{Router, Tap};
use serde_json::{Value, json};
use sqs_triage::config::Config;
use sqs_triage::core::breaker::Phase;
use sqs_triage::core::failure::FailureClass;
use sqs_triage::effects::breaker_store::BreakerStore;
use sqs_triage::effects::dlq::failure_record;
use sqs_triage::effects::storage_retry::StorageRetry;
use sqs_triage::processor::registry::Registry;
use sqs_triage::runtime::env::{Environment, build};
use sqs_triage::runtime::worker::{Worker, WorkerOptions};
use support::fault_proxy::{Fault, FaultPlan, FaultProxy, FaultRule};
use tokio::sync::watch;
use triage::demo::chaos::{self, Recorder};
use triage::ops::Ctx;
use wire::WireLog;

const MAX_ATTEMPTS: u32 = 5;
/// Visibility timeout of the source queue: how soon a message comes back after a crash.
const QUEUE_VISIBILITY_S: i32 = 8;
/// Max delay of the policy; "parked" jobs ask for it on every attempt, so they are still
/// waiting in the source queue when the run stops.
const MAX_DELAY_MS: u64 = 10_000;

fn policy_vars() -> Vec<(&'static str, String)> {
    vec![
        ("TRIAGE_MAX_ATTEMPTS", MAX_ATTEMPTS.to_string()),
        ("TRIAGE_BASE_DELAY_MS", "1000".into()),
        ("TRIAGE_BACKOFF_MULTIPLIER", "2".into()),
        ("TRIAGE_MAX_DELAY_MS", MAX_DELAY_MS.to_string()),
        ("TRIAGE_JITTER_MAX_MS", "200".into()),
        // The breaker is tested elsewhere; here it must not defer the whole workload.
        ("TRIAGE_BREAKER_MIN_EXECUTIONS", "100000".into()),
    ]
}

/// Attempts of the breaker scenario: far more than two outages can spend (one failure per
/// job in the closed phase before the breaker trips, plus one per failed probe), so the
/// breaker's deferrals, not failures, carry the jobs through.
const BREAKER_MAX_ATTEMPTS: u32 = 20;

/// The policy of the breaker scenario: a breaker that opens when half of at least 5
/// executions within 5 s fail transiently and stays open 3 s, one probe at a time, states cached 1 s.
fn breaker_vars() -> Vec<(&'static str, String)> {
    let mut vars = policy_vars();
    vars.retain(|(k, _)| !matches!(*k, "TRIAGE_MAX_ATTEMPTS" | "TRIAGE_BREAKER_MIN_EXECUTIONS"));
    vars.extend([
        ("TRIAGE_MAX_ATTEMPTS", BREAKER_MAX_ATTEMPTS.to_string()),
        ("TRIAGE_BREAKER_MIN_EXECUTIONS", "5".into()),
        ("TRIAGE_BREAKER_WINDOW_S", "5".into()),
        ("TRIAGE_BREAKER_OPEN_S", "3".into()),
        ("TRIAGE_BREAKER_PROBES", "1".into()),
        ("TRIAGE_BREAKER_CACHE_MS", "1000".into()),
    ]);
    vars
}

/// SQS's cap on one batch call's payload (bodies and attributes), enforced by the fault proxy
/// on every product call (moto counts bodies only).
const BATCH_CAP: usize = 1_048_576;
/// Body size of the large fatal jobs: ten of them (one receive batch) are over [`BATCH_CAP`].
const LARGE_BODY: usize = 110_000;

// ---------------------------------------------------------------- the workload

/// Where a job must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Place {
    Succeeded,
    Dlq,
    Queue,
}

#[derive(Debug, Clone)]
struct Job {
    id: String,
    payload: Value,
    expect: Place,
    /// True for jobs whose designed outcome is "ok" (possibly after failures).
    ok: bool,
    /// Another right place: a parked job may have exhausted its attempts in a long run, and
    /// a job that panics once may succeed on a re-run when the DLQ refused its copy.
    alt: Option<Place>,
    /// False for payloads that do not decode: the handler never starts, so it records nothing.
    decodes: bool,
    /// The exact body sent (instead of the envelope built from `payload`); its DLQ copy must
    /// carry it byte for byte, after exactly one execution.
    exact_body: Option<Arc<String>>,
}

/// A deterministic mix: half plain successes, successes after transient failures or a
/// Retry-After, slow jobs (in flight when a worker dies or a deadline hits), fatal errors,
/// panics, payloads that do not decode, jobs that exhaust their attempts, and a few parked
/// jobs that keep asking for the maximum delay.
fn workload(prefix: &str, n: usize, parked: bool) -> Vec<Job> {
    let mut jobs: Vec<Job> = (0..n)
        .map(|i| {
            let (payload, expect, ok) = match i % 50 {
                0..=24 | 49 => (json!({"outcome": "ok"}), Place::Succeeded, true),
                25 => (json!({"outcome": "ok", "sleep_ms": 1200}), Place::Succeeded, true),
                26..=31 => (
                    json!({"outcome": "transient", "fail_times": 1}),
                    Place::Succeeded,
                    true,
                ),
                32..=34 => (
                    json!({"outcome": "transient", "fail_times": 2}),
                    Place::Succeeded,
                    true,
                ),
                35..=37 => (
                    json!({"outcome": "throttle", "fail_times": 1, "retry_after_ms": 1500}),
                    Place::Succeeded,
                    true,
                ),
                38 => (json!({"outcome": "panic", "fail_times": 1}), Place::Dlq, false),
                39..=41 => (json!({"outcome": "fatal"}), Place::Dlq, false),
                42..=43 => (json!({"outcome": "panic"}), Place::Dlq, false),
                44..=45 => (json!({"outcome": "bogus"}), Place::Dlq, false),
                _ => (json!({"outcome": "transient"}), Place::Dlq, false),
            };
            Job {
                id: format!("{prefix}-{i:05}"),
                alt: (i % 50 == 38).then_some(Place::Succeeded),
                decodes: payload["outcome"] != "bogus",
                payload,
                expect,
                ok,
                exact_body: None,
            }
        })
        .collect();
    // Sent last, so they are still waiting for their next attempt when the run stops (or,
    // in a long run, exhausted and dead-lettered: either place is right for them).
    if parked {
        jobs.extend((0..n.div_ceil(100)).map(|i| Job {
            id: format!("{prefix}-parked-{i:03}"),
            payload: json!({"outcome": "throttle", "retry_after_ms": MAX_DELAY_MS}),
            expect: Place::Queue,
            ok: false,
            alt: Some(Place::Dlq),
            decodes: true,
            exact_body: None,
        }));
    }
    jobs
}

/// The breaker scenario's workload: every job depends on one dependency that is down during
/// `windows` (epoch ms). Nine in ten succeed once it is up, one in ten then fails fatally.
/// With [`BREAKER_MAX_ATTEMPTS`] no job can run out of attempts during the outages, so every
/// "ok" job must succeed and every fatal one must be dead-lettered as `fatal`.
fn breaker_workload(prefix: &str, n: usize, windows: &[[u64; 2]]) -> Vec<Job> {
    (0..n)
        .map(|i| {
            let fatal = i % 10 == 9;
            let outcome = if fatal { "fatal" } else { "ok" };
            Job {
                id: format!("{prefix}-{i:05}"),
                payload: json!({"outcome": outcome, "down_windows_ms": windows}),
                expect: if fatal { Place::Dlq } else { Place::Succeeded },
                ok: !fatal,
                alt: None,
                decodes: true,
                exact_body: None,
            }
        })
        .collect()
}

/// Fatal jobs whose bodies are [`LARGE_BODY`] bytes (padded outside the payload): ten make
/// one receive batch whose DLQ copies are over SQS's batch cap.
fn large_fatal_jobs(prefix: &str, n: usize) -> Vec<Job> {
    (0..n)
        .map(|i| {
            let id = format!("{prefix}-large-{i:03}");
            let payload = json!({"outcome": "fatal"});
            let envelope = |pad: &str| {
                json!({"type": chaos::CHAOS, "id": id, "payload": payload, "pad": pad}).to_string()
            };
            let pad = "p".repeat(LARGE_BODY.saturating_sub(envelope("").len()));
            let body = envelope(&pad);
            assert_eq!(body.len(), LARGE_BODY);
            Job {
                id: id.clone(),
                payload,
                expect: Place::Dlq,
                ok: false,
                alt: None,
                decodes: true,
                exact_body: Some(Arc::new(body)),
            }
        })
        .collect()
}

// ---------------------------------------------------------------- resources

struct Stack {
    sdk: SdkConfig,
    sqs: aws_sdk_sqs::Client,
    ddb: aws_sdk_dynamodb::Client,
    queue_url: String,
    dlq_url: String,
    dlq_name: String,
    table: String,
    record_table: String,
    /// The policy and breaker variables every consumer of this scenario gets.
    vars: Vec<(&'static str, String)>,
}

impl Stack {
    async fn new(prefix: &str, vars: Vec<(&'static str, String)>) -> Stack {
        let sdk = support::sdk_config().await;
        let ctx = Ctx::from_config(&sdk).unwrap();
        let created = support::fresh_resources(prefix, false).await;
        let name = created.table.clone();
        ctx.sqs
            .set_queue_attributes()
            .queue_url(&created.queue_url)
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                QUEUE_VISIBILITY_S.to_string(),
            )
            .send()
            .await
            .unwrap();
        let record_table = format!("{name}-exec");
        sqs_triage::effects::table::create_table(&ctx.ddb, &record_table)
            .await
            .unwrap();
        Stack {
            sdk,
            sqs: ctx.sqs.clone(),
            ddb: ctx.ddb.clone(),
            queue_url: created.queue_url,
            dlq_url: created.dlq_url,
            dlq_name: format!("{name}-dlq"),
            table: created.table,
            record_table,
            vars,
        }
    }

    /// The scenario's attempt limit.
    fn max_attempts(&self) -> u32 {
        self.config().policy.max_attempts()
    }

    fn config(&self) -> Config {
        let vars: HashMap<&str, String> = self.vars.iter().cloned().collect();
        let mut c = Config::from_lookup(&|k| vars.get(k).cloned()).unwrap();
        c.queue_url = Some(self.queue_url.clone());
        c.dlq_url = Some(self.dlq_url.clone());
        c.table = Some(self.table.clone());
        c
    }

    /// A recorder writing straight to DynamoDB Local (the oracle is never faulted).
    fn recorder(&self) -> Recorder {
        Recorder::new(self.ddb.clone(), &self.record_table)
    }

    /// An environment whose every SQS and DynamoDB call goes through `endpoint`.
    async fn environment(&self, endpoint: &str) -> Environment {
        let config = self.config();
        let registry = chaos::register_recording(
            Registry::new(config.policy.clone(), config.breaker),
            config.policy.clone(),
            config.breaker,
            Some(self.recorder()),
        );
        build(&config, registry, &via(&self.sdk, endpoint)).await.unwrap()
    }

    async fn send(&self, jobs: &[Job]) {
        // Batches of at most 10 entries and at most SQS's 1 MiB of bodies.
        let mut chunks: Vec<Vec<SendMessageBatchRequestEntry>> = Vec::new();
        let mut bytes = 0;
        for j in jobs {
            let body = match &j.exact_body {
                Some(b) => b.as_str().to_owned(),
                None => json!({"type": chaos::CHAOS, "id": j.id, "payload": j.payload}).to_string(),
            };
            let full = chunks
                .last()
                .is_none_or(|c| c.len() == 10 || bytes + body.len() > BATCH_CAP);
            if full {
                chunks.push(Vec::new());
                bytes = 0;
            }
            bytes += body.len();
            let chunk = chunks.last_mut().unwrap();
            chunk.push(
                SendMessageBatchRequestEntry::builder()
                    .id(format!("e{}", chunk.len()))
                    .message_body(body)
                    .build()
                    .unwrap(),
            );
        }
        futures::stream::iter(chunks)
            .for_each_concurrent(8, |entries| async move {
                let out = self
                    .sqs
                    .send_message_batch()
                    .queue_url(&self.queue_url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .unwrap();
                assert!(
                    out.failed().is_empty(),
                    "producer send failed: {:?}",
                    out.failed()
                );
            })
            .await;
    }

    /// (visible or delayed, in flight) in a queue.
    async fn depth(&self, url: &str) -> (u64, u64) {
        let d = support::queue_depth(&self.sqs, url).await;
        (d.visible + d.delayed, d.in_flight)
    }

    /// Every message of a queue, read with a long visibility timeout and never deleted.
    async fn read_all(&self, url: &str) -> Vec<Message> {
        support::read_all(&self.sqs, url, 600, 1).await
    }

    async fn scan(&self, table: &str) -> Vec<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .ddb
                .scan()
                .table_name(table)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .unwrap();
            items.extend(out.items.unwrap_or_default());
            start = out.last_evaluated_key;
            if start.is_none() {
                return items;
            }
        }
    }
}

/// An SDK configuration like `base` whose only endpoint is `endpoint`. It carries no
/// service config, so `AWS_ENDPOINT_URL_SQS` / `_DYNAMODB` in the process do not win over it.
fn via(base: &SdkConfig, endpoint: &str) -> SdkConfig {
    let mut b = SdkConfig::builder();
    b.set_region(base.region().cloned());
    b.set_credentials_provider(base.credentials_provider());
    b.set_behavior_version(base.behavior_version());
    b.set_sleep_impl(base.sleep_impl());
    b.set_time_source(base.time_source());
    b.set_http_client(base.http_client());
    b.endpoint_url(endpoint).build()
}

use futures::StreamExt;

// ---------------------------------------------------------------- faults

/// The proxies between the product and the emulators, and the log of what the product's
/// calls came to.
struct Faults {
    sqs: FaultProxy,
    ddb: FaultProxy,
    router: Router,
    wire: Arc<WireLog>,
    /// The last source number given to a process's own router (the shared router is 0).
    sources: AtomicU64,
}

impl Faults {
    fn start() -> Faults {
        let sqs = FaultProxy::start(&support::sqs_endpoint());
        let ddb = FaultProxy::start(&support::ddb_endpoint());
        let wire = WireLog::new();
        let tap = Tap {
            log: wire.clone(),
            source: 0,
        };
        let router = Router::start(&sqs.url(), &ddb.url(), tap);
        // SQS's whole rule on a batch's bytes, which moto does not check.
        sqs.enforce_batch_cap(BATCH_CAP);
        Faults {
            sqs,
            ddb,
            router,
            wire,
            sources: AtomicU64::new(0),
        }
    }

    /// A router of its own for a process that may be killed: the wire log then knows which
    /// deliveries died with it.
    fn process_router(&self) -> (Router, u32) {
        let source = self.sources.fetch_add(1, Ordering::Relaxed) as u32 + 1;
        let tap = Tap {
            log: self.wire.clone(),
            source,
        };
        (Router::start(&self.sqs.url(), &self.ddb.url(), tap), source)
    }

    /// Throttling, 500, 503 and resets on `share` of every SQS and DynamoDB call.
    /// Calls that mention `spare` (the chaos handler's side table, the oracle) are not faulted:
    /// a `triage-lambda` or `triage worker` process reaches it through the same endpoint.
    fn storage(&self, share: f64, spare: &str) {
        let kinds = |throttle: Fault| {
            vec![
                throttle,
                Fault::ThrottlingException,
                Fault::RequestThrottled,
                Fault::Status500,
                Fault::Status503,
                Fault::Reset,
            ]
        };
        self.sqs.set_faults(FaultPlan {
            share,
            kinds: kinds(Fault::Throttle),
            only_ops: None,
            spare_body_containing: None,
            seed: 7,
        });
        self.ddb.set_faults(FaultPlan {
            share,
            kinds: kinds(Fault::Throttle),
            only_ops: None,
            spare_body_containing: Some(spare.to_owned()),
            seed: 11,
        });
    }

    /// The DLQ refuses every send (503) until [`Faults::accept_dlq`].
    fn reject_dlq(&self, dlq_name: &str) {
        self.sqs.add_rule(FaultRule {
            ops: Some(vec!["SendMessageBatch".into(), "SendMessage".into()]),
            body_contains: Some(dlq_name.to_owned()),
            fault: Fault::Status503,
            times: None,
        });
    }

    fn faults(&self) -> BTreeMap<String, u64> {
        let mut all = BTreeMap::new();
        for (svc, p) in [("sqs", &self.sqs), ("ddb", &self.ddb)] {
            for (k, v) in p.faults() {
                *all.entry(format!("{svc}:{k}")).or_default() += v;
            }
        }
        all
    }
}

// ---------------------------------------------------------------- consumers

/// Two in-process workers, each its own environment (clients, caches, retry budget).
async fn start_workers(
    stack: &Stack,
    endpoint: &str,
    n: usize,
    stop: watch::Receiver<bool>,
) -> (Vec<Environment>, Vec<tokio::task::JoinHandle<()>>) {
    let mut envs = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let env = stack.environment(endpoint).await;
        envs.push(env.clone());
        let worker = Worker::new(
            env,
            WorkerOptions {
                wait: Duration::from_secs(1),
                max_messages: 10,
                emf: false,
            },
        );
        // Two pollers per worker share its environment, like a worker with two batches in flight.
        for _ in 0..2 {
            let worker = worker.clone();
            let mut stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                worker.run(shutdown, |_| {}).await.unwrap();
            }));
        }
    }
    (envs, tasks)
}

/// A worker process that is killed if the test ends (or panics) while it still runs.
struct WorkerProcess {
    child: Child,
    /// The router its calls go through, when it has its own, and its source in the wire log.
    router: Option<(Router, u32)>,
}

impl WorkerProcess {
    fn new(child: Child) -> WorkerProcess {
        WorkerProcess { child, router: None }
    }

    /// Kills it with SIGKILL and logs its death in `wire`.
    fn sigkill(&mut self, wire: &WireLog) {
        sigkill(&mut self.child);
        if let Some((_, source)) = &self.router {
            wire.killed(*source);
        }
    }
}

impl std::ops::Deref for WorkerProcess {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for WorkerProcess {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `triage worker` binary, its calls through a router of its own, recording executions.
fn spawn_worker_process(stack: &Stack, faults: &Faults, log: &str) -> WorkerProcess {
    let (router, source) = faults.process_router();
    let endpoint = router.url();
    let stderr = std::fs::File::create(log).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_triage"));
    cmd.args(["worker", "--demo-handlers"])
        .env("TRIAGE_QUEUE_URL", &stack.queue_url)
        .env("TRIAGE_DLQ_URL", &stack.dlq_url)
        .env("TRIAGE_TABLE", &stack.table)
        .env(chaos::RECORD_TABLE_ENV, &stack.record_table)
        .env("AWS_ENDPOINT_URL", &endpoint)
        .env_remove("AWS_ENDPOINT_URL_SQS")
        .env_remove("AWS_ENDPOINT_URL_DYNAMODB")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    for (k, v) in &stack.vars {
        cmd.env(k, v);
    }
    WorkerProcess {
        child: cmd.spawn().expect("spawn triage worker"),
        router: Some((router, source)),
    }
}

fn sigkill(child: &mut Child) {
    // `Child::kill` sends SIGKILL on Unix: no shutdown hook, no drain, no delete.
    child.kill().unwrap();
    child.wait().unwrap();
}

fn sigterm(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    sigkill(child);
}

// ---------------------------------------------------------------- accounting

#[derive(Debug, Default)]
struct Execs {
    /// (attempt, result) per execution.
    runs: Vec<(u32, String)>,
}

#[derive(Debug, Default)]
struct Report {
    name: String,
    jobs: usize,
    secs: f64,
    faults: BTreeMap<String, u64>,
    storage_retries: u64,
    storage_failures: u64,
    succeeded: usize,
    dlq: usize,
    queue: usize,
    lost: usize,
    multi_place: usize,
    /// Jobs in the DLQ and in a second place because their message came back after the copy.
    rerun_after_dlq: usize,
    misplaced: usize,
    ok_in_dlq: usize,
    executions: usize,
    repeated: usize,
    repeated_jobs: usize,
    dlq_duplicates: usize,
    over_limit: usize,
    max_attempt: u32,
    max_executions: usize,
    ledger_mismatch: usize,
    record_mismatch: usize,
    /// Jobs whose count is above the highest attempt number seen (a count that landed late).
    counted_late: usize,
    /// Jobs sent with an exact body ([`large_fatal_jobs`]) that are not in the DLQ exactly
    /// once, with a `fatal` record of 1 attempt and their body byte for byte, after exactly one
    /// execution.
    exact_mismatch: usize,
    /// The breaker scenario's observations ([`BreakerCheck`]).
    breaker: Option<BreakerCheck>,
    /// The largest receive batch the event source mapping handed to an environment (bytes of
    /// bodies).
    max_batch_bytes: u64,
    /// The scenario injects a fault that can make work repeat: storage faults, a SIGKILL, short
    /// deadlines or duplicate deliveries. Without one, every bound below is 0.
    injects: bool,
    /// Bounds on `dlq_duplicates`, `counted_late`, `repeated` and `rerun_after_dlq`: the sum,
    /// over the jobs, of the events the wire log saw on each job that can cause them.
    dup_bound: usize,
    late_bound: usize,
    repeated_bound: usize,
    rerun_bound: usize,
    /// Jobs with more duplicates, repeats or a late count or rerun than their own events allow.
    unexplained: usize,
    notes: Vec<String>,
}

/// What the breaker scenario saw of the breaker item and the environments' metrics.
#[derive(Debug, Default, Clone)]
struct BreakerCheck {
    /// Periods in which the item was open or half-open, each begun from a stored `closed`
    /// phase (the initial missing item counts as closed) and ended by one.
    cycles: usize,
    /// Open periods that began after a `closed` phase the poller saw stored after an earlier
    /// open period: a reopening across a real close.
    reopened_after_close: usize,
    /// The phase as stored at the end.
    closed_at_end: bool,
    /// Sum of the `BreakerOpened` EMF metric of `triage.chaos` over every environment.
    emf_opened: u64,
}

async fn account(stack: &Stack, jobs: &[Job], report: &mut Report, wire: &WireLog) {
    let max_attempts = stack.max_attempts();
    let witnesses = wire.witnesses(&stack.queue_url, &stack.dlq_name, &stack.record_table);
    report.notes.push(wire.summary(&witnesses));
    let exact: HashMap<&str, &str> = jobs
        .iter()
        .filter_map(|j| Some((j.id.as_str(), j.exact_body.as_deref()?.as_str())))
        .collect();
    // Exact-body jobs whose DLQ copy carried their body byte for byte.
    let mut exact_ok: HashSet<String> = HashSet::new();
    // The DLQ: every copy, with its failure record.
    let mut dlq: HashMap<String, Vec<(FailureClass, u32)>> = HashMap::new();
    for m in stack.read_all(&stack.dlq_url).await {
        let attrs = m.message_attributes().cloned().unwrap_or_default();
        let rec = failure_record(&attrs)
            .expect("every DLQ copy carries a failure record")
            .expect("the failure record parses");
        let body: Value = serde_json::from_str(m.body().unwrap()).unwrap();
        assert_eq!(
            body["id"].as_str(),
            Some(rec.job_id.as_str()),
            "the body travels unchanged"
        );
        if let Some(sent) = exact.get(rec.job_id.as_str()) {
            if m.body() == Some(*sent) {
                exact_ok.insert(rec.job_id.clone());
            } else {
                report.notes.push(format!(
                    "DLQ copy of {} has a body of {} bytes, not the {} sent",
                    rec.job_id,
                    m.body().map_or(0, str::len),
                    sent.len()
                ));
            }
        }
        dlq.entry(rec.job_id.clone())
            .or_default()
            .push((rec.class, rec.attempts));
    }
    // The source queue: wait until nothing is in flight, then read everything left. A receive
    // a stopped consumer gave up may still be answered by the emulator (a long poll outlives
    // its caller), hiding what it took for its visibility timeout: read again until nothing
    // but what this read holds is in flight.
    wire.mark("accounting waits for the source queue");
    let until = Instant::now() + Duration::from_millis(MAX_DELAY_MS + 15_000);
    let mut read: HashMap<String, String> = HashMap::new();
    loop {
        while stack.depth(&stack.queue_url).await.1 > read.len() as u64 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        wire.mark("accounting reads the source queue");
        for m in stack.read_all(&stack.queue_url).await {
            let body: Value = serde_json::from_str(m.body().unwrap()).unwrap();
            read.insert(
                m.message_id().unwrap().to_owned(),
                body["id"].as_str().unwrap().to_owned(),
            );
        }
        if stack.depth(&stack.queue_url).await.1 <= read.len() as u64 || Instant::now() >= until {
            break;
        }
    }
    let mut queue: HashMap<String, usize> = HashMap::new();
    for id in read.into_values() {
        *queue.entry(id).or_default() += 1;
    }
    // Executions recorded by the chaos handler.
    let mut execs: HashMap<String, Execs> = HashMap::new();
    for item in stack.scan(&stack.record_table).await {
        let s = |k: &str| {
            item.get(k)
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default()
        };
        let attempt = item
            .get("attempt")
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        execs
            .entry(s("job_id"))
            .or_default()
            .runs
            .push((attempt, s("result")));
    }
    // The attempt ledger.
    let mut ledger: HashMap<String, u32> = HashMap::new();
    for item in stack.scan(&stack.table).await {
        // Ledger items carry the full job id (their key may be a digest of it).
        let is_ledger = item
            .get("sk")
            .and_then(|v| v.as_s().ok())
            .is_some_and(|sk| sk.starts_with("ledger"));
        let id = item.get("job_id").and_then(|v| v.as_s().ok());
        if let (true, Some(id)) = (is_ledger, id) {
            let n = item
                .get("attempts")
                .and_then(|v| v.as_n().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            ledger.insert(id.to_owned(), n);
        }
    }

    report.jobs = jobs.len();
    for job in jobs {
        let e = execs.get(&job.id);
        let runs = e.map_or(&[][..], |e| &e.runs[..]);
        let succeeded = runs.iter().any(|(_, r)| r == "ok");
        let in_dlq = dlq.get(&job.id);
        let in_queue = queue.get(&job.id).copied().unwrap_or(0);
        let places: Vec<Place> = [
            succeeded.then_some(Place::Succeeded),
            in_dlq.map(|_| Place::Dlq),
            (in_queue > 0).then_some(Place::Queue),
        ]
        .into_iter()
        .flatten()
        .collect();
        // A job dead-lettered, then delivered again because the delete of its message was
        // lost (its visibility timeout ran out first): the ledger was closed with the DLQ copy,
        // so the rerun starts again at the copy's attempt number. A job whose failure was not
        // deterministic can then succeed (or wait for a retry) beside its DLQ copy: the
        // documented at-least-once limit, told apart from a real double placement by the
        // repeated attempt number.
        let rerun_after_dlq = places.len() == 2
            && in_dlq.is_some_and(|copies| {
                copies
                    .iter()
                    .any(|(_, a)| runs.iter().filter(|(n, _)| n == a).count() > 1)
            });
        // A slow job whose every execution was stopped at an invocation's deadline (its
        // record never got past `started`) used up its attempts and is dead-lettered as the
        // product promises: the workload expected a success, the run dealt it only deadlines
        // (rare: each short deadline is one invocation in seven).
        let stopped_out = in_dlq.is_some()
            && !runs.is_empty()
            && runs.iter().all(|(_, r)| r == "started")
            && runs.iter().map(|(a, _)| *a).max().unwrap_or(0) >= max_attempts;
        if stopped_out {
            report.notes.push(format!(
                "stopped at a deadline on every attempt, so exhausted: {}: {runs:?}",
                job.id
            ));
        }
        match places.as_slice() {
            [] => {
                report.lost += 1;
                report
                    .notes
                    .push(format!("LOST {}: {runs:?}; {}", job.id, wire.trace(&job.id)));
            }
            [p] => {
                match p {
                    Place::Succeeded => report.succeeded += 1,
                    Place::Dlq => report.dlq += 1,
                    Place::Queue => report.queue += 1,
                }
                if *p != job.expect && Some(*p) != job.alt && !stopped_out {
                    report.misplaced += 1;
                    report.notes.push(format!(
                        "misplaced {} ({:?}, expected {:?}): {runs:?}",
                        job.id, p, job.expect
                    ));
                }
            }
            many if rerun_after_dlq => {
                report.rerun_after_dlq += 1;
                report.notes.push(format!(
                    "rerun after its DLQ copy: {} in {many:?}: {runs:?} dlq={in_dlq:?}",
                    job.id
                ));
            }
            many => {
                report.multi_place += 1;
                report
                    .notes
                    .push(format!("{} in {many:?}: {runs:?} dlq={in_dlq:?}", job.id));
            }
        }
        if job.ok && in_dlq.is_some() && !stopped_out {
            report.ok_in_dlq += 1;
        }
        if let Some(copies) = in_dlq {
            report.dlq_duplicates += copies.len() - 1;
        }
        report.executions += runs.len();
        let distinct: HashSet<u32> = runs.iter().map(|(a, _)| *a).collect();
        let repeated = runs.len() - distinct.len();
        report.repeated += repeated;
        report.repeated_jobs += usize::from(repeated > 0);
        let max_attempt = distinct.iter().copied().max().unwrap_or(0);
        report.max_attempt = report.max_attempt.max(max_attempt);
        report.max_executions = report.max_executions.max(runs.len());
        // Attempt numbers never pass the limit. A skipped number must be explained by a
        // repeat: a process killed after sending its ledger write (which still lands) makes the
        // next delivery read a stale count and show a number again; the count of executions
        // stays exact, so the following attempt skips ahead.
        let gaps = (max_attempt as usize).saturating_sub(distinct.len());
        if max_attempt > max_attempts || gaps > repeated {
            report.over_limit += 1;
            report.notes.push(format!("attempts of {}: {runs:?}", job.id));
        }
        // The count the ledger holds (for a job still waiting) or the DLQ record carries is the
        // highest attempt number the handler saw, plus at most one per repeated execution: an
        // execution whose count landed after the next delivery read the ledger (a killed
        // process, or a visibility timeout that ran out while the count was being retried)
        // shows an attempt number twice and is still counted.
        let explained =
            |count: u32| count >= max_attempt && count as usize <= max_attempt as usize + repeated;
        if in_queue > 0 && !explained(ledger.get(&job.id).copied().unwrap_or(0)) {
            report.ledger_mismatch += 1;
            report.notes.push(format!(
                "ledger of {} = {:?}, executions {runs:?}",
                job.id,
                ledger.get(&job.id)
            ));
        }
        // A DLQ record's attempts follow the same rule (a payload that does not decode fails
        // fatally before the chaos handler can record anything, so it is left out).
        // With several copies (a delivery dead-lettered, then seen again because its delete
        // or its visibility timeout was lost), the newest carries that count and each older
        // one an attempt number its handler saw.
        if let (Some(copies), true) = (in_dlq, job.decodes) {
            let newest = copies.iter().map(|(_, a)| *a).max().unwrap_or(0);
            let seen = |a: u32| distinct.contains(&a) || explained(a);
            if !(explained(newest) || rerun_after_dlq) || copies.iter().any(|(_, a)| !seen(*a)) {
                report.record_mismatch += 1;
                report
                    .notes
                    .push(format!("record of {}: {copies:?}, executions {runs:?}", job.id));
            }
        }
        // (A payload that never decodes is dead-lettered before the handler can record it.)
        if job.exact_body.is_some() {
            let once = in_dlq.is_some_and(|c| c.as_slice() == [(FailureClass::Fatal, 1)])
                && exact_ok.contains(&job.id)
                && runs.len() == 1
                && in_queue == 0;
            if !once {
                report.exact_mismatch += 1;
                report.notes.push(format!(
                    "large {}: dlq={in_dlq:?} body ok={} executions {runs:?}",
                    job.id,
                    exact_ok.contains(&job.id)
                ));
            }
        }
        let late = job.decodes
            && (in_dlq.is_some_and(|c| c.iter().any(|(_, a)| *a > max_attempt))
                || (in_queue > 0 && ledger.get(&job.id).copied().unwrap_or(0) > max_attempt));
        report.counted_late += usize::from(late);
        // What may repeat for this job, from the events on its message. A scenario that
        // injects nothing able to repeat work keeps only the queue's own duplicate deliveries.
        let mut w = witnesses.get(&job.id).copied().unwrap_or_default();
        if !report.injects {
            w = wire::Witness {
                handed_twice: w.handed_twice,
                ..wire::Witness::default()
            };
        }
        let copies = in_dlq.map_or(0, Vec::len);
        // Deliveries while another holder had the message, or after it died or lost its delete.
        let returns = w.handed_twice + w.came_back;
        // A second DLQ copy needs the message again after an accepted copy (a return, or the
        // batch handed to two environments) or a copy sent again after a lost answer.
        let dup_allowed = (returns + w.twice + w.unsure_sends) as usize;
        // A count lands late only when the next delivery reads the ledger first: a return, or
        // a count's write faulted or unanswered.
        let late_allowed = (returns + w.unsure_counts) as usize;
        // An attempt number repeats once per execution not counted before the next read (a
        // batch handed to two environments, a count faulted or cut by a short deadline, a
        // return). A return that may follow the ledger's close (a success or an accepted DLQ
        // copy: the previous holder deleted the message or died holding it, or the queue
        // handed it out twice) may start again from attempt 1.
        let closing = w.handed_twice + w.came_back_closed;
        let per_close = if succeeded || copies > 0 { max_attempts } else { 1 } as usize;
        let repeated_allowed = (returns - closing) as usize
            + closing as usize * per_close
            + (w.twice + w.unsure_counts + w.short) as usize;
        if copies > 0 {
            report.dup_bound += dup_allowed;
            report.rerun_bound += usize::from(dup_allowed > 0);
        }
        if job.decodes && (in_dlq.is_some() || in_queue > 0) {
            report.late_bound += usize::from(late_allowed > 0);
        }
        report.repeated_bound += repeated_allowed;
        let rerun = rerun_after_dlq;
        if copies.saturating_sub(1) > dup_allowed
            || (late && late_allowed == 0)
            || repeated > repeated_allowed
            || (rerun && dup_allowed == 0)
        {
            report.unexplained += 1;
            report.notes.push(format!(
                "unexplained {}: {copies} DLQ copies, late {late}, {repeated} repeated, rerun {rerun}; \
                 on the wire {w:?}; executions {runs:?} dlq={in_dlq:?}; {}",
                job.id,
                wire.trace(&job.id)
            ));
        }
    }
}

// ---------------------------------------------------------------- scenarios

#[derive(Debug, Clone, Copy, Default)]
struct Scenario {
    name: &'static str,
    jobs: usize,
    /// Share of storage calls that fail (0 = none).
    storage_faults: f64,
    /// The DLQ rejects sends for this long from the start.
    dlq_reject: Option<Duration>,
    /// Kill a `triage worker` process with SIGKILL after this long, then restart it.
    kill_after: Option<Duration>,
    /// Run through `triage-lambda` processes and a local event source mapping instead of workers.
    lambda: bool,
    /// Lambda: every n-th invocation gets a deadline shorter than its slow jobs (0 = never).
    short_every: u64,
    /// Lambda: every n-th batch is delivered to two environments at once (0 = never).
    dup_every: u64,
    /// Include parked jobs (still in the queue at the end).
    parked: bool,
    /// The breaker cycle: a breaker that opens after a few failures, and a workload whose
    /// dependency goes down twice ([`breaker_workload`], [`BREAKER_WINDOWS`]), fed at a
    /// steady pace over [`BREAKER_SPAN`] instead of the usual mix.
    breaker_cycle: bool,
    /// Fatal jobs with [`LARGE_BODY`]-byte bodies, in the queue before the consumers start
    /// (so ten make one receive batch), besides `jobs` of the usual mix.
    large_fatal: usize,
}

/// The breaker scenario's outages, in seconds after the first job is sent: down, up, down, up.
const BREAKER_WINDOWS: [[u64; 2]; 2] = [[6, 18], [30, 42]];
/// How long the breaker scenario's producer takes to send its jobs, evenly spread.
const BREAKER_SPAN: Duration = Duration::from_secs(48);

/// The producer: sends the jobs in order, keeping at most `max_depth` messages in the source
/// queue (visible, in flight or delayed), as a steady producer does. moto's cost per call
/// grows with the messages a queue holds, so a queue filled with the whole workload up front
/// would measure the emulator, not the product. Returns when every job is sent.
/// With `pace`, it instead sends the jobs evenly spread over that time. Jobs before `from`
/// were sent already.
async fn feed(
    stack: Arc<Stack>,
    jobs: Arc<Vec<Job>>,
    from: usize,
    max_depth: u64,
    pace: Option<Duration>,
    sent: Arc<AtomicU64>,
) {
    let mut next = from;
    sent.store(next as u64, Ordering::Relaxed);
    let started = Instant::now();
    if let Some(span) = pace {
        while next < jobs.len() {
            let share = started.elapsed().as_secs_f64() / span.as_secs_f64();
            let due = from + ((jobs.len() - from) as f64 * share).ceil() as usize;
            let due = due.min(jobs.len());
            if due > next {
                stack.send(&jobs[next..due]).await;
                next = due;
                sent.store(next as u64, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        return;
    }
    while next < jobs.len() {
        let (visible, in_flight) = stack.depth(&stack.queue_url).await;
        let room = max_depth.saturating_sub(visible + in_flight) as usize;
        let left = jobs.len() - next;
        // Whole batches of 10, except for the last few jobs.
        let take = if room >= left { left } else { room / 10 * 10 };
        if take == 0 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        stack.send(&jobs[next..next + take]).await;
        next += take;
        sent.store(next as u64, Ordering::Relaxed);
    }
}

/// How long a scenario may take to settle: the CI sizes need a few minutes on a busy
/// 2-core machine; bigger runs scale with their job count.
fn time_limit(jobs: usize) -> Duration {
    let default = Duration::from_secs(900).max(Duration::from_millis(jobs as u64 * 600));
    std::env::var("CHAOS_LIMIT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(default)
}

/// Reads the breaker item of `triage.chaos` every 200 ms until `stop`, straight from
/// DynamoDB Local: each change of stored (phase, generation), with when it was seen.
async fn watch_breaker(
    stack: Arc<Stack>,
    started: Instant,
    mut stop: watch::Receiver<bool>,
) -> Vec<(Duration, Phase, u64)> {
    let store = BreakerStore::new(stack.ddb.clone(), &stack.table, StorageRetry::default());
    let mut seen: Vec<(Duration, Phase, u64)> = vec![(Duration::ZERO, Phase::Closed, 0)];
    loop {
        let done = *stop.borrow();
        let state = store.read(chaos::CHAOS).await.expect("the breaker item reads");
        if seen.last().map(|(_, p, g)| (*p, *g)) != Some((state.phase, state.generation)) {
            seen.push((started.elapsed(), state.phase, state.generation));
        }
        if done {
            return seen;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.changed() => {}
        }
    }
}

/// The breaker's open periods in `seen` (phase changes as stored): (periods ended by a stored
/// `closed` phase, periods that began from a `closed` phase stored after an earlier open
/// period, closed at the end), and the periods as text.
fn breaker_cycles(seen: &[(Duration, Phase, u64)]) -> (usize, usize, bool, String) {
    let (mut closes, mut reopened) = (0, 0);
    let mut periods = Vec::new();
    let mut open_since: Option<Duration> = None;
    let mut was_opened = false;
    for (at, phase, _) in seen {
        match (open_since, *phase == Phase::Closed) {
            (None, false) => {
                open_since = Some(*at);
                reopened += usize::from(was_opened);
                was_opened = true;
            }
            (Some(from), true) => {
                closes += 1;
                periods.push(format!("{:.1}–{:.1} s", from.as_secs_f64(), at.as_secs_f64()));
                open_since = None;
            }
            _ => {}
        }
    }
    if let Some(from) = open_since {
        periods.push(format!("{:.1} s–end", from.as_secs_f64()));
    }
    (closes, reopened, open_since.is_none(), periods.join(", "))
}

async fn run(s: Scenario) -> Report {
    let started = Instant::now();
    let vars = if s.breaker_cycle {
        breaker_vars()
    } else {
        policy_vars()
    };
    let stack = Arc::new(Stack::new(&format!("chaos-{}", s.name), vars).await);
    let faults = Faults::start();
    let endpoint = faults.router.url();
    // The large jobs wait in the queue before anyone polls it, so they come out ten at a time.
    let large = large_fatal_jobs(s.name, s.large_fatal);
    stack.send(&large).await;
    let (stop_tx, stop_rx) = watch::channel(false);

    let mut envs: Vec<Environment> = Vec::new();
    let mut tasks = Vec::new();
    let esm = Arc::new(lambda::EsmStats::default());
    let mut fleet = None;
    if s.lambda {
        let f = lambda::Fleet::start(stack.clone(), &endpoint, s.name, 3, faults.wire.clone()).await;
        for me in 0..3 {
            tasks.push(tokio::spawn(lambda::esm_loop(
                f.clone(),
                me,
                if s.short_every == 0 {
                    u64::MAX
                } else {
                    s.short_every
                },
                if s.dup_every == 0 { u64::MAX } else { s.dup_every },
                esm.clone(),
                stop_rx.clone(),
            )));
        }
        fleet = Some(f);
    } else {
        let (e, t) = start_workers(&stack, &endpoint, 2, stop_rx.clone()).await;
        envs = e;
        tasks = t;
    }
    let mut child = s
        .kill_after
        .map(|_| spawn_worker_process(&stack, &faults, &format!("/tmp/chaos-{}-worker-1.log", s.name)));
    report_note(&format!("{}: consumers up at {:?}", s.name, started.elapsed()));
    // Faults start once the consumers are up (start-up checks are tested elsewhere).
    if s.storage_faults > 0.0 {
        faults.storage(s.storage_faults, &stack.record_table);
    }
    if s.dlq_reject.is_some() {
        faults.reject_dlq(&stack.dlq_name);
    }
    let started = Instant::now();
    // The breaker scenario's outages are set by the clock, from the first job sent.
    let t0 = sqs_triage::clock::now_ms();
    let windows: Vec<[u64; 2]> = BREAKER_WINDOWS
        .iter()
        .map(|[a, b]| [t0 + a * 1000, t0 + b * 1000])
        .collect();
    let mut all = large;
    let from = all.len();
    all.extend(if s.breaker_cycle {
        breaker_workload(s.name, s.jobs, &windows)
    } else {
        workload(s.name, s.jobs, s.parked)
    });
    let jobs = Arc::new(all);
    let parked = jobs.iter().filter(|j| j.expect == Place::Queue).count() as u64;
    let breaker_watch = s
        .breaker_cycle
        .then(|| tokio::spawn(watch_breaker(stack.clone(), started, stop_rx.clone())));
    let sent = Arc::new(AtomicU64::new(0));
    let producer = tokio::spawn(feed(
        stack.clone(),
        jobs.clone(),
        from,
        max_depth(),
        s.breaker_cycle.then_some(BREAKER_SPAN),
        sent.clone(),
    ));

    let mut killed = false;
    let mut dlq_open = s.dlq_reject.is_none();
    let mut quiet = 0;
    let mut last_note = Instant::now();
    let limit = time_limit(jobs.len());
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let elapsed = started.elapsed();
        if let (Some(after), Some(c)) = (s.kill_after, child.as_mut()) {
            if !killed && elapsed >= after {
                c.sigkill(&faults.wire);
                killed = true;
                report_note(&format!(
                    "{}: worker process killed with SIGKILL at {elapsed:?}",
                    s.name
                ));
                child = Some(spawn_worker_process(
                    &stack,
                    &faults,
                    &format!("/tmp/chaos-{}-worker-2.log", s.name),
                ));
            }
        }
        if let Some(d) = s.dlq_reject {
            if !dlq_open && elapsed >= d {
                faults.sqs.clear_faults();
                if s.storage_faults > 0.0 {
                    faults.storage(s.storage_faults, &stack.record_table);
                }
                dlq_open = true;
            }
        }
        let all_sent = producer.is_finished();
        let (visible, in_flight) = stack.depth(&stack.queue_url).await;
        if last_note.elapsed() >= Duration::from_secs(60) {
            last_note = Instant::now();
            report_note(&format!(
                "{}: {elapsed:.0?}: sent {}/{}, visible {visible}, in flight {in_flight}",
                s.name,
                sent.load(Ordering::Relaxed),
                jobs.len()
            ));
        }
        // Done when only parked jobs are left (none visible, at most the parked in flight).
        if all_sent && dlq_open && visible == 0 && in_flight <= parked && (s.kill_after.is_none() || killed) {
            quiet += 1;
            if quiet >= 3 {
                break;
            }
        } else {
            quiet = 0;
        }
        assert!(
            elapsed < limit,
            "{}: not settled after {limit:?} (sent {}/{}, visible {visible}, in flight {in_flight})",
            s.name,
            sent.load(Ordering::Relaxed),
            jobs.len()
        );
    }
    producer.await.unwrap();
    report_note(&format!("{}: settled at {:?}", s.name, started.elapsed()));
    faults.wire.mark("settled");
    stop_tx.send(true).unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    faults.wire.mark("consumers stopped");
    let breaker_seen = match breaker_watch {
        Some(w) => w.await.unwrap(),
        None => Vec::new(),
    };
    if let Some(c) = child.as_mut() {
        sigterm(c);
        faults.wire.mark("worker process stopped");
    }
    let secs = started.elapsed().as_secs_f64();
    let mut report = Report {
        name: s.name.to_owned(),
        secs,
        faults: faults.faults(),
        // A DLQ refusal (503 or over the batch cap) is a definite answer: nothing to repeat.
        injects: s.storage_faults > 0.0 || s.kill_after.is_some() || s.short_every > 0 || s.dup_every > 0,
        ..Report::default()
    };
    if let Some(f) = &fleet {
        report.notes.push(esm.summary(f));
        (report.storage_retries, report.storage_failures) = f.storage_counters();
        report.max_batch_bytes = esm.max_batch_bytes.load(Ordering::Relaxed);
    }
    if s.breaker_cycle {
        let (cycles, reopened_after_close, closed_at_end, periods) = breaker_cycles(&breaker_seen);
        let emf_opened = fleet
            .as_ref()
            .map_or(0, |f| f.metric_sum("BreakerOpened", chaos::CHAOS));
        report.notes.push(format!(
            "breaker open or half-open {periods} (dependency down {}); {} phase changes seen, \
             {emf_opened} BreakerOpened",
            BREAKER_WINDOWS
                .iter()
                .map(|[a, b]| format!("{a}–{b} s"))
                .collect::<Vec<_>>()
                .join(", "),
            breaker_seen.len() - 1,
        ));
        report.breaker = Some(BreakerCheck {
            cycles,
            reopened_after_close,
            closed_at_end,
            emf_opened,
        });
    }
    if s.large_fatal > 0 {
        report.notes.push(format!(
            "{} fatal jobs of {LARGE_BODY} bytes; largest receive batch {} bytes of bodies",
            s.large_fatal, report.max_batch_bytes
        ));
    }
    for env in &envs {
        let st = env.processor.sqs().retry().stats();
        report.storage_retries += st.retries;
        report.storage_failures += st.failures;
    }
    drop(fleet);
    faults.sqs.clear_faults();
    faults.ddb.clear_faults();
    account(&stack, &jobs, &mut report, &faults.wire).await;
    report_note(&format!("{}: accounted at {:?}", s.name, started.elapsed()));
    report.secs = secs;
    report
}

/// The most messages the producer keeps in the source queue (`CHAOS_MAX_DEPTH`).
fn max_depth() -> u64 {
    jobs_env("CHAOS_MAX_DEPTH", 300) as u64
}

fn report_note(s: &str) {
    eprintln!("[chaos] {s}");
}

fn print_table(reports: &[Report]) {
    let mut out = String::new();
    out.push_str(
        "\n| scenario | jobs | secs | faults injected | storage retries (failed calls) | succeeded | DLQ | queue | lost | in 2 places | DLQ, then rerun ≤ bound | misplaced | ok in DLQ | executions | repeated (jobs) ≤ bound | DLQ dup copies ≤ bound | max attempt | max executions | counted late ≤ bound | ledger≠ | record≠ |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in reports {
        let faults = if r.faults.is_empty() {
            "-".to_owned()
        } else {
            r.faults
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} ({}) | {} | {} | {} | {} | {} | {} ≤ {} | {} | {} | {} | {} ({}) ≤ {} | {} ≤ {} | {} | {} | {} ≤ {} | {} | {} |\n",
            r.name,
            r.jobs,
            r.secs,
            faults,
            r.storage_retries,
            r.storage_failures,
            r.succeeded,
            r.dlq,
            r.queue,
            r.lost,
            r.multi_place,
            r.rerun_after_dlq,
            r.rerun_bound,
            r.misplaced,
            r.ok_in_dlq,
            r.executions,
            r.repeated,
            r.repeated_jobs,
            r.repeated_bound,
            r.dlq_duplicates,
            r.dup_bound,
            r.max_attempt,
            r.max_executions,
            r.counted_late,
            r.late_bound,
            r.ledger_mismatch,
            r.record_mismatch,
        ));
    }
    for r in reports {
        for n in r.notes.iter().take(20) {
            out.push_str(&format!("  {}: {n}\n", r.name));
        }
    }
    println!("{out}");
    if let Ok(path) = std::env::var("CHAOS_TABLE") {
        std::fs::write(path, &out).unwrap();
    }
}

fn jobs_env(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn scenarios() -> Vec<Scenario> {
    let big = jobs_env("CHAOS_JOBS", 1_000);
    let small = jobs_env("CHAOS_SMALL_JOBS", 200);
    // The Lambda all-faults scenario is smaller in CI; `CHAOS_JOBS` sizes both.
    let big_lambda = std::env::var("CHAOS_JOBS").map_or(small * 2, |_| big);
    let all = vec![
        Scenario {
            name: "baseline",
            jobs: small,
            ..Scenario::default()
        },
        Scenario {
            name: "storage-faults",
            jobs: small,
            storage_faults: 0.08,
            ..Scenario::default()
        },
        Scenario {
            name: "dlq-rejects",
            jobs: small,
            dlq_reject: Some(Duration::from_secs(6)),
            ..Scenario::default()
        },
        Scenario {
            name: "sigkill",
            jobs: small,
            kill_after: Some(Duration::from_secs(4)),
            ..Scenario::default()
        },
        Scenario {
            name: "lambda-deadlines",
            jobs: small,
            lambda: true,
            short_every: 4,
            ..Scenario::default()
        },
        Scenario {
            name: "lambda-duplicates",
            jobs: small,
            lambda: true,
            dup_every: 3,
            ..Scenario::default()
        },
        Scenario {
            name: "breaker-cycle",
            jobs: small,
            lambda: true,
            breaker_cycle: true,
            ..Scenario::default()
        },
        Scenario {
            name: "large-fatal",
            jobs: small / 2,
            lambda: true,
            large_fatal: 20,
            ..Scenario::default()
        },
        Scenario {
            name: "all-workers",
            jobs: big,
            storage_faults: 0.08,
            dlq_reject: Some(Duration::from_secs(8)),
            kill_after: Some(Duration::from_secs(8)),
            parked: true,
            ..Scenario::default()
        },
        Scenario {
            name: "all-lambda",
            jobs: big_lambda,
            storage_faults: 0.08,
            dlq_reject: Some(Duration::from_secs(8)),
            lambda: true,
            short_every: 7,
            dup_every: 5,
            parked: true,
            ..Scenario::default()
        },
    ];
    match std::env::var("CHAOS_SCENARIOS") {
        Ok(names) if !names.trim().is_empty() => {
            let wanted: Vec<&str> = names.split(',').map(str::trim).collect();
            all.into_iter().filter(|s| wanted.contains(&s.name)).collect()
        }
        _ => all,
    }
}

/// Every scenario in turn, then the table; any lost job, job in two places, "ok" job in the
/// DLQ, attempt beyond the limit or ledger disagreement fails the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_job_ends_in_exactly_one_place() {
    // The chaos handler's panics are expected (caught per record); keep them out of the output.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("");
        if !msg.starts_with("chaos: panic") {
            default_hook(info);
        }
    }));
    let mut reports = Vec::new();
    for s in scenarios() {
        eprintln!("[chaos] {} ({} jobs) ...", s.name, s.jobs);
        let r = run(s).await;
        eprintln!("[chaos] {} done in {:.0} s", r.name, r.secs);
        print_table(std::slice::from_ref(&r));
        reports.push(r);
    }
    reports.extend(rate::run_all().await);
    print_table(&reports);
    for r in &reports {
        assert_eq!(r.lost, 0, "{}: lost jobs", r.name);
        assert_eq!(r.multi_place, 0, "{}: jobs in two places", r.name);
        assert_eq!(r.ok_in_dlq, 0, "{}: ok jobs in the DLQ", r.name);
        assert_eq!(r.misplaced, 0, "{}: jobs in the wrong place", r.name);
        assert_eq!(r.over_limit, 0, "{}: attempts beyond the limit", r.name);
        assert_eq!(
            r.ledger_mismatch, 0,
            "{}: ledger disagrees with executions",
            r.name
        );
        assert_eq!(
            r.record_mismatch, 0,
            "{}: DLQ records disagree with executions",
            r.name
        );
        // Each bound is 0 in a scenario without a fault that can repeat work (a DLQ refusal is
        // a definite answer); otherwise it sums, job by job, the events on the wire that can
        // cause it, so a job's surplus over its own events is `unexplained`.
        // A DLQ duplicate needs a lost send answer, or the message back after an accepted copy.
        assert!(
            r.dlq_duplicates <= r.dup_bound,
            "{}: {} DLQ duplicates, at most {} explained",
            r.name,
            r.dlq_duplicates,
            r.dup_bound
        );
        // A late count needs the next delivery to read the ledger before the count lands.
        assert!(
            r.counted_late <= r.late_bound,
            "{}: {} counted late, at most {} explained",
            r.name,
            r.counted_late,
            r.late_bound
        );
        // A repeated attempt number needs an execution not counted before the next read.
        assert!(
            r.repeated <= r.repeated_bound,
            "{}: {} repeated executions, at most {} explained",
            r.name,
            r.repeated,
            r.repeated_bound
        );
        // A rerun after a DLQ copy needs the message back after the copy was accepted.
        assert!(
            r.rerun_after_dlq <= r.rerun_bound,
            "{}: {} reruns after a DLQ copy, at most {} explained",
            r.name,
            r.rerun_after_dlq,
            r.rerun_bound
        );
        // The same, job by job.
        assert_eq!(
            r.unexplained, 0,
            "{}: jobs with more duplicates, repeats, late counts or reruns than their events",
            r.name
        );
        assert_eq!(
            r.exact_mismatch, 0,
            "{}: large fatal jobs not dead-lettered once, byte for byte, after one execution",
            r.name
        );
        if let Some(b) = &r.breaker {
            assert!(
                b.cycles >= 2 && b.reopened_after_close >= 1 && b.closed_at_end,
                "{}: the breaker did not open, close, reopen and close again: {b:?}",
                r.name
            );
            assert!(
                b.emf_opened >= 2,
                "{}: the environments reported BreakerOpened {} times",
                r.name,
                b.emf_opened
            );
        }
    }
    for r in reports.iter().filter(|r| r.name == "large-fatal") {
        assert!(
            r.max_batch_bytes > BATCH_CAP as u64,
            "{}: no receive batch was over SQS's batch cap ({} bytes at most)",
            r.name,
            r.max_batch_bytes
        );
    }
}
