//! Item 8, added billed duration: the time from the event handed to the runtime (`/next`) to
//! its batch response, for one 10-record SQS batch whose handler sleeps 10 ms per record, with
//! 5 ms added to every AWS call on the wire. Three functions take their turns on the same
//! events: the shipped `triage-lambda` (its `triage.chaos` job type, `sleep_ms` 10), a bare
//! `lambda_runtime` function with the same work (`examples/bare_batch.rs`), and Powertools'
//! `BatchProcessor` under awslambdaric (`bench/billed_powertools.py`). Each has its own local
//! Runtime API (`tests/support/runtime_api.rs`), which times the invocation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName, SendMessageBatchRequestEntry};
use serde_json::{Value, json};
use triage::demo::chaos::CHAOS;
use triage::ops::setup::SetupReport;

use super::{Options, Section};
use crate::support;
use crate::support::fault_proxy::{Fault, FaultProxy, FaultRule};
use crate::support::runtime_api::{Outcome, RuntimeApi};

/// Records per batch.
const RECORDS: usize = 10;
/// The handler's work per record.
const SLEEP_MS: u64 = 10;
/// Added to every AWS call, SQS and DynamoDB alike.
const DELAY: Duration = Duration::from_millis(5);

/// Kills the process it holds when dropped (only processes this report started).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The functions measured, in their table order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Triage,
    Bare,
    Powertools,
}

const KINDS: [Kind; 3] = [Kind::Triage, Kind::Bare, Kind::Powertools];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Triage => "sqs-triage: the shipped `triage-lambda` (the bench profile: release)",
            Kind::Bare => {
                "bare `lambda_runtime` + `SqsBatchResponse` (`examples/bare_batch.rs`), records side by side"
            }
            Kind::Powertools => {
                "Powertools `BatchProcessor` (Python, awslambdaric), records one after another"
            }
        }
    }
}

/// A workload: which records fail, and whether one is a redelivery.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    /// Ten first deliveries that succeed.
    Healthy,
    /// Seven first deliveries and one redelivery that succeed, one transient and one fatal
    /// failure on their first delivery.
    Failures,
}

impl Workload {
    fn tag(self) -> &'static str {
        match self {
            Workload::Healthy => "healthy",
            Workload::Failures => "failures",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Workload::Healthy => "healthy: 10 first deliveries, all succeed",
            Workload::Failures => {
                "with failures: 1 transient + 1 fatal (first deliveries), 1 redelivery (receive count 2) and 7 first deliveries that succeed"
            }
        }
    }

    /// The chaos outcome of record `i`.
    fn outcome(self, i: usize) -> &'static str {
        match (self, i) {
            (Workload::Failures, 8) => "transient",
            (Workload::Failures, 9) => "fatal",
            _ => "ok",
        }
    }
}

/// One event and what each function must answer to it.
struct Batch {
    event: String,
    /// The latest receipt handle of each message, to delete them after the round.
    receipts: Vec<String>,
    /// Message ids a function that reports every failure itself lists.
    failed: BTreeSet<String>,
    /// Message ids sqs-triage lists: the transient one (the fatal one's copy is in the DLQ).
    retried: BTreeSet<String>,
}

/// Percentile by nearest rank, of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn run(opts: &Options) -> Section {
    let mut s = Section::new("8. Added billed duration: `/next` to the batch response");
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            s.fail(e.to_string());
            return s;
        }
    };
    if let Err(e) = rt.block_on(measure(opts, &mut s)) {
        s.fail(format!("added billed duration not measured: {e}"));
    }
    s
}

/// Timed invocations per function and workload, and untimed ones before them.
fn sizes(opts: &Options) -> (usize, usize) {
    if opts.quick { (5, 1) } else { (200, 10) }
}

async fn measure(opts: &Options, s: &mut Section) -> Result<(), String> {
    if !opts.lambda_bin.exists() {
        return Err(format!("{} is not built", opts.lambda_bin.display()));
    }
    let py = opts.python();
    if !py.exists() {
        return Err(format!("{} not found", py.display()));
    }
    let bare = build_example(opts, "bare_batch")?;
    let created = support::try_fresh_resources("bench-billed", false).await?;
    // Every AWS call of the functions goes through a proxy that holds it (5 ms), then forwards
    // it to the emulator; the report's own set-up calls go to the emulators directly.
    let sqs_proxy = FaultProxy::start(&support::moto_sqs_endpoint());
    let ddb_proxy = FaultProxy::start(&support::ddb_endpoint());
    let sqs = support::sqs_client_via(&support::moto_sqs_endpoint()).await;
    let (timed, warmup) = sizes(opts);

    s.line(format!(
        "One {RECORDS}-record SQS batch per invocation, its messages sent to and received from the \
         local stack's queue for each round; the handler sleeps {SLEEP_MS} ms per record. Every AWS \
         call a function makes (SQS on moto, DynamoDB Local) goes through a proxy that holds it \
         {} ms first. The three functions take each event in turn, the first rotating, {timed} \
         timed invocations each per workload after {warmup} untimed. Time: the local Runtime \
         API's, from the event handed out (`/next` answered) to the response received.\n",
        DELAY.as_millis()
    ));
    s.header(&[
        "workload",
        "function",
        "p50",
        "p99",
        "p50 − bare",
        "p99 − bare",
        "sqs-triage's AWS calls / invocation (per call: the emulator's own time)",
    ]);
    // The same workload without the delay: the difference of the two, over the delay, is
    // the number of round trips on the invocation's serial path, whatever the emulators take.
    let runs: [(Workload, Duration, &[Kind]); 3] = [
        (Workload::Healthy, DELAY, &KINDS),
        (Workload::Failures, DELAY, &KINDS),
        (Workload::Failures, Duration::ZERO, &[Kind::Triage, Kind::Bare]),
    ];
    for (workload, delay, kinds) in runs {
        for p in [&sqs_proxy, &ddb_proxy] {
            p.clear_faults();
            p.add_rule(FaultRule {
                ops: None,
                body_contains: None,
                fault: Fault::Delay(delay),
                times: None,
            });
        }
        let envs = start_all(opts, &created, kinds, &bare, &sqs_proxy, &ddb_proxy).await?;
        for round in 0..warmup + timed {
            if round == warmup {
                sqs_proxy.reset_counts();
                ddb_proxy.reset_counts();
            }
            let batch = batch(&sqs, &created, workload, round).await?;
            for k in 0..envs.len() {
                envs[(round + k) % envs.len()].invoke(&batch).await?;
            }
            delete_all(&sqs, &created.queue_url, &batch.receipts).await;
        }
        let calls = calls_of(&sqs_proxy, &ddb_proxy);
        let samples: Vec<Vec<f64>> = envs
            .iter()
            .map(|e| {
                let mut xs: Vec<f64> = e
                    .api
                    .served_times()
                    .iter()
                    .skip(warmup)
                    .map(|d| d.as_secs_f64() * 1e3)
                    .collect();
                xs.sort_by(f64::total_cmp);
                xs
            })
            .collect();
        let of = |k: Kind| &samples[kinds.iter().position(|x| *x == k).unwrap_or(0)];
        let bare_at = |p| percentile(of(Kind::Bare), p);
        let label = format!("{}, {} ms per AWS call", workload.tag(), delay.as_millis());
        let tag = format!(
            "{}{}",
            workload.tag(),
            if delay.is_zero() { "_nodelay" } else { "" }
        );
        for (kind, xs) in kinds.iter().zip(&samples) {
            let (p50, p99) = (percentile(xs, 0.5), percentile(xs, 0.99));
            let triage = *kind == Kind::Triage;
            let bold = |x: String| if triage { format!("**{x}**") } else { x };
            let calls_cell = if triage {
                let total: u64 = calls.values().map(|(n, _)| n).sum();
                let per = |n: u64| n as f64 / timed as f64;
                let by_op: Vec<String> = calls
                    .iter()
                    .map(|(op, (n, t))| {
                        format!(
                            "{op} {:.2}, {:.1} ms",
                            per(*n),
                            t.as_secs_f64() * 1e3 / *n.max(&1) as f64
                        )
                    })
                    .collect();
                format!("{:.1} ({})", per(total), by_op.join("; "))
            } else {
                "0".into()
            };
            s.row(&[
                label.clone(),
                kind.name().into(),
                bold(format!("{p50:.2} ms")),
                format!("{p99:.2} ms"),
                bold(format!("{:+.2} ms", p50 - bare_at(0.5))),
                format!("{:+.2} ms", p99 - bare_at(0.99)),
                calls_cell,
            ]);
            let key = |what: &str| format!("billed.{tag}.{kind:?}.{what}").to_lowercase();
            s.value(&key("p50_ms"), p50);
            s.value(&key("p99_ms"), p99);
        }
        let added = |p| percentile(of(Kind::Triage), p) - bare_at(p);
        s.value(&format!("billed.{tag}.added_p50_ms"), added(0.5));
        s.value(&format!("billed.{tag}.added_p99_ms"), added(0.99));
    }
    s.line(String::new());
    for w in [Workload::Healthy, Workload::Failures] {
        s.line(format!("- {}.", w.describe()));
    }
    let v = |k: &str| s.values.get(k).copied().unwrap_or(f64::NAN);
    let (h50, f50, f99) = (
        v("billed.healthy.added_p50_ms"),
        v("billed.failures.added_p50_ms"),
        v("billed.failures.added_p99_ms"),
    );
    let (n50, n99) = (
        v("billed.failures_nodelay.added_p50_ms"),
        v("billed.failures_nodelay.added_p99_ms"),
    );
    let met = |ok: bool| if ok { "met" } else { "**not met**" };
    let rtt = DELAY.as_secs_f64() * 1e3;
    let (serial50, serial99) = ((f50 - n50) / rtt, (f99 - n99) / rtt);
    s.value("billed.failures.serial_round_trips_p50", serial50);
    s.line(format!(
        "\nGoals: a healthy invocation adds at most 1 ms (p50) to the bare function's time: \
         {h50:+.2} ms, {}. An invocation with failures adds at most one injected round trip \
         ({rtt:.0} ms): p50 {f50:+.2} ms, {}; p99 {f99:+.2} ms, {}. Of that, the injected delay \
         accounts for (added with it − added without it) = {:.1} ms at p50, {serial50:.1} round \
         trips on the serial path ({:.1} ms, {serial99:.1} at p99); the rest ({n50:+.2} ms p50 \
         without the delay) is the emulators' own time on that path and the function's work.",
        met(h50 <= 1.0),
        met(f50 <= rtt),
        met(f99 <= rtt),
        f50 - n50,
        f99 - n99,
    ));
    Ok(())
}

/// The calls that went through the two proxies since their counts were reset, by operation,
/// and the emulators' time answering them.
fn calls_of(sqs: &FaultProxy, ddb: &FaultProxy) -> BTreeMap<String, (u64, Duration)> {
    let mut all = BTreeMap::new();
    for p in [sqs, ddb] {
        let times = p.upstream_times();
        for (op, n) in p.counts() {
            let e: &mut (u64, Duration) = all.entry(op.clone()).or_default();
            e.0 += n;
            e.1 += times.get(&op).copied().unwrap_or_default();
        }
    }
    all
}

/// One execution environment: a function process polling its own Runtime API.
struct Env {
    kind: Kind,
    api: RuntimeApi,
    _process: Guard,
    log: PathBuf,
}

impl Env {
    /// One invocation of `batch`, checked against what this function must answer.
    async fn invoke(&self, batch: &Batch) -> Result<(), String> {
        let out = self
            .api
            .invoke(
                batch.event.clone(),
                Duration::from_secs(60),
                Duration::from_secs(60),
                Duration::ZERO,
            )
            .await;
        let body = match out {
            Outcome::Response(body) => body,
            other => {
                return Err(format!(
                    "{:?}: no batch response: {other:?}{}",
                    self.kind,
                    self.tail()
                ));
            }
        };
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        let listed: BTreeSet<String> = v["batchItemFailures"]
            .as_array()
            .ok_or_else(|| format!("{:?}: not a batch response: {body}", self.kind))?
            .iter()
            .filter_map(|f| f["itemIdentifier"].as_str().map(str::to_owned))
            .collect();
        let want = if self.kind == Kind::Triage {
            &batch.retried
        } else {
            &batch.failed
        };
        if &listed != want {
            return Err(format!(
                "{:?} listed {listed:?}, expected {want:?}: {body}{}",
                self.kind,
                self.tail()
            ));
        }
        Ok(())
    }

    /// The end of the function's stderr, for an error.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(2_000);
        let start = (start..=text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        format!("\n--- {}\n{}", self.log.display(), &text[start..])
    }
}

/// Starts the three functions and waits until each polls for its first event.
async fn start_all(
    opts: &Options,
    created: &SetupReport,
    kinds: &[Kind],
    bare: &Path,
    sqs_proxy: &FaultProxy,
    ddb_proxy: &FaultProxy,
) -> Result<Vec<Env>, String> {
    let dir = opts.work_dir().join("billed");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut envs = Vec::new();
    for &kind in kinds {
        let api = RuntimeApi::start().await;
        let log = dir.join(format!("{kind:?}.log").to_lowercase());
        let stderr = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut cmd = match kind {
            Kind::Triage => {
                let mut c = Command::new(&opts.lambda_bin);
                c.env("TRIAGE_QUEUE_URL", &created.queue_url)
                    .env("TRIAGE_DLQ_URL", &created.dlq_url)
                    .env("TRIAGE_DLQ_MAX_BYTES", "1048576")
                    .env("TRIAGE_QUEUE_RETENTION_S", "345600")
                    .env(
                        "TRIAGE_QUEUE_VISIBILITY_S",
                        created.visibility_timeout_s.to_string(),
                    )
                    .env("TRIAGE_QUEUE_MAX_RECEIVE", created.max_receive_count.to_string())
                    .env("TRIAGE_TABLE", &created.table)
                    .env_remove("TRIAGE_CHAOS_RECORD_TABLE");
                c
            }
            Kind::Bare => Command::new(bare),
            Kind::Powertools => {
                let mut c = Command::new(opts.python());
                c.args(["-m", "awslambdaric", "billed_powertools.handler"])
                    .current_dir(opts.manifest_dir.join("bench"))
                    .env("PYTHONPATH", opts.manifest_dir.join("bench"))
                    .env_remove("AWS_LAMBDA_MAX_CONCURRENCY");
                c
            }
        };
        cmd.env("AWS_LAMBDA_RUNTIME_API", api.address())
            .env("AWS_LAMBDA_FUNCTION_NAME", "triage-bench")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
            .env("AWS_ENDPOINT_URL_SQS", sqs_proxy.url())
            .env("AWS_ENDPOINT_URL_DYNAMODB", ddb_proxy.url())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child =
            support::spawn_lambda_binary(&mut cmd).map_err(|e| format!("cannot start {kind:?}: {e}"))?;
        let env = Env {
            kind,
            api,
            _process: Guard(child),
            log,
        };
        if !env.api.ready(Duration::from_secs(60)).await {
            return Err(format!(
                "{kind:?} did not poll for an event within 60 s{}",
                env.tail()
            ));
        }
        envs.push(env);
    }
    Ok(envs)
}

/// Receives until `want` messages came, with every attribute, held for an hour.
async fn receive(sqs: &aws_sdk_sqs::Client, queue_url: &str, want: usize) -> Result<Vec<Message>, String> {
    let mut got = Vec::new();
    for _ in 0..50 {
        if got.len() >= want {
            break;
        }
        let out = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages((want - got.len()).min(10) as i32)
            .visibility_timeout(3_600)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| format!("receive: {e}"))?;
        got.extend(out.messages.unwrap_or_default());
    }
    if got.len() != want {
        return Err(format!("received {} of {want} messages", got.len()));
    }
    Ok(got)
}

/// A real batch for `workload`: sent, received (the redelivery received twice), as Lambda's
/// event source mapping hands it over.
async fn batch(
    sqs: &aws_sdk_sqs::Client,
    created: &SetupReport,
    workload: Workload,
    round: usize,
) -> Result<Batch, String> {
    let q = &created.queue_url;
    let entries: Vec<SendMessageBatchRequestEntry> = (0..RECORDS)
        .map(|i| {
            let body = json!({
                "type": CHAOS,
                "id": format!("billed-{round}-{i}"),
                "payload": {"outcome": workload.outcome(i), "sleep_ms": SLEEP_MS},
            });
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(body.to_string())
                .build()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    sqs.send_message_batch()
        .queue_url(q)
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut got = receive(sqs, q, RECORDS).await?;
    let outcome_of = |m: &Message| -> String {
        serde_json::from_str::<Value>(m.body().unwrap_or_default())
            .ok()
            .and_then(|b| b["payload"]["outcome"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    if workload == Workload::Failures {
        // A job that failed once is back: its message visible again, received a second time.
        let at = got
            .iter()
            .position(|m| outcome_of(m) == "ok")
            .ok_or("no message to redeliver")?;
        let m = got.remove(at);
        sqs.change_message_visibility()
            .queue_url(q)
            .receipt_handle(m.receipt_handle().unwrap_or_default())
            .visibility_timeout(0)
            .send()
            .await
            .map_err(|e| format!("change visibility: {e}"))?;
        let again = receive(sqs, q, 1).await?;
        let count = again[0]
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
            .cloned()
            .unwrap_or_default();
        if again[0].message_id() != m.message_id() || count != "2" {
            return Err(format!(
                "the redelivery came back as {:?}, count {count}",
                again[0].message_id()
            ));
        }
        got.extend(again);
    }
    let ids_with = |outcomes: &[&str]| -> BTreeSet<String> {
        got.iter()
            .filter(|m| outcomes.contains(&outcome_of(m).as_str()))
            .filter_map(|m| m.message_id().map(str::to_owned))
            .collect()
    };
    Ok(Batch {
        event: support::lambda_event::lambda_event_json(&got, q).to_string(),
        receipts: got
            .iter()
            .filter_map(|m| m.receipt_handle().map(str::to_owned))
            .collect(),
        failed: ids_with(&["transient", "fatal"]),
        retried: ids_with(&["transient"]),
    })
}

/// Deletes the round's messages, as the event source mapping deletes a batch's successes, so
/// the next round receives only its own.
async fn delete_all(sqs: &aws_sdk_sqs::Client, queue_url: &str, receipts: &[String]) {
    let entries: Vec<_> = receipts
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(r)
                .build()
                .ok()
        })
        .collect();
    let _ = sqs
        .delete_message_batch()
        .queue_url(queue_url)
        .set_entries(Some(entries))
        .send()
        .await;
}

/// Builds `examples/NAME.rs` with the profile `triage-lambda` was built with, in the same
/// target directory (cargo releases its lock while a bench runs).
fn build_example(opts: &Options, name: &str) -> Result<PathBuf, String> {
    let dir = opts.lambda_bin.parent().ok_or("triage-lambda has no directory")?;
    let target = dir.parent().ok_or("triage-lambda is not in a target directory")?;
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["build", "--quiet", "--example", name, "--target-dir"])
        .arg(target)
        .current_dir(&opts.manifest_dir)
        .stdout(Stdio::null());
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let st = cmd
        .status()
        .map_err(|e| format!("cargo build --example {name}: {e}"))?;
    if !st.success() {
        return Err(format!("cargo build --example {name} failed"));
    }
    Ok(dir.join("examples").join(name))
}
