//! Item 2: AWS calls per 1,000 messages, counted on the wire against the local stack by the SDK
//! interceptor every processor client carries (`CallCounter`). A driver plays Lambda's SQS
//! event source mapping: ReceiveMessage (10 at most), the processor, DeleteMessageBatch of
//! the records not reported failed. The driver's own calls are Lambda's, not the function's,
//! and are counted apart.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, SendMessageBatchRequestEntry,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};
use sqs_triage::config::Config;
use sqs_triage::core::breaker::BreakerConfig;
use sqs_triage::core::{Decision, FailureClass, RetryPolicy};
use sqs_triage::effects::calls::{SQS_CHUNK, Units};
use sqs_triage::processor::Incoming;
use sqs_triage::processor::registry::Registry;
use sqs_triage::runtime::env::{build, sdk_config};
use tokio::time::Instant;
use triage::demo::chaos::{self, CHAOS};
use triage::ops::Ctx;

use super::{Options, Section};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// Every message deleted (succeeded or dead-lettered).
    Settled,
    /// Every message delivered at least once (the dependency stays down).
    Seen,
}

struct Workload {
    name: &'static str,
    tag: &'static str,
    /// Share of messages carrying `failing`; the rest succeed.
    share: f64,
    failing: Value,
    breaker: BreakerConfig,
    until: Until,
    /// The job type opts in to a completion marker.
    marker: bool,
}

fn workloads() -> Vec<Workload> {
    // Workloads 1–3 keep the breaker out of the way, so each measures one path; workload 4 runs
    // the default breaker (half of at least 10 executions in 60 s failing opens it for 30 s).
    let quiet = BreakerConfig::builder()
        .min_executions(100_000)
        .build()
        .expect("valid");
    vec![
        Workload {
            name: "all succeed",
            tag: "ok",
            share: 0.0,
            failing: json!({"outcome": "ok"}),
            breaker: quiet,
            until: Until::Settled,
            marker: false,
        },
        Workload {
            name: "10% transient (succeed on the 2nd attempt)",
            tag: "transient",
            share: 0.1,
            failing: json!({"outcome": "transient", "fail_times": 1}),
            breaker: quiet,
            until: Until::Settled,
            marker: false,
        },
        Workload {
            name: "10% fatal",
            tag: "fatal",
            share: 0.1,
            failing: json!({"outcome": "fatal"}),
            breaker: quiet,
            until: Until::Settled,
            marker: false,
        },
        Workload {
            name: "dependency outage, breaker opens (every job transient)",
            tag: "outage",
            share: 1.0,
            failing: json!({"outcome": "transient"}),
            breaker: BreakerConfig::default(),
            until: Until::Seen,
            marker: false,
        },
        Workload {
            name: "all succeed, completion marker on",
            tag: "marker",
            share: 0.0,
            failing: json!({"outcome": "ok"}),
            breaker: quiet,
            until: Until::Settled,
            marker: true,
        },
    ]
}

/// 5 attempts, 1 s × 2 up to 4 s, no jitter: the seed's shape, scaled so retries come back
/// within the run.
fn policy() -> RetryPolicy {
    crate::support::pipeline::fast_policy(5)
}

/// On-demand list prices, us-east-1, looked up on 2026-12-04 (in effect since DynamoDB's
/// on-demand cut of 2024-11-01): US$ per million units or requests.
const PRICE_WRITE_UNIT: f64 = 0.625;
const PRICE_READ_UNIT: f64 = 0.125;
const PRICE_SQS_REQUEST: f64 = 0.40;

/// US$ for read units, write units and billed SQS requests.
fn price(read: f64, write: f64, sqs: f64) -> f64 {
    (read * PRICE_READ_UNIT + write * PRICE_WRITE_UNIT + sqs * PRICE_SQS_REQUEST) / 1e6
}

#[derive(Default, Debug)]
struct Measured {
    calls: BTreeMap<String, u64>,
    units: BTreeMap<String, Units>,
    /// The function's SQS requests as billed (per started 64 KiB).
    sqs_billed: u64,
    /// Lambda's own receives and deletes as billed (a receive per started 64 KiB it returned).
    lambda_billed: u64,
    /// Executions whose outcome was a failure (transient or fatal).
    failed_executions: u64,
    /// Per kind of invocation (redeliveries in it, failures in it): invocations, and the
    /// function's calls by operation.
    by_kind: BTreeMap<(bool, bool), (u64, BTreeMap<String, u64>)>,
    invocations: u64,
    deliveries: u64,
    executions: u64,
    transient_failures: u64,
    retries: u64,
    deferrals: u64,
    releases: u64,
    dead_lettered: u64,
    receives: u64,
    deletes: u64,
    settled: u64,
    seconds: f64,
    /// The SQS calls each invocation's own decisions need (one visibility batch if it retries,
    /// defers or releases anything, one DLQ batch per 10 dead letters), summed.
    per_invocation_lower: u64,
}

impl Measured {
    fn total(&self) -> u64 {
        self.calls.values().sum()
    }

    /// SQS calls the decisions need at 10 entries per call, and nothing in DynamoDB: as if
    /// every decision of the run could share a batch with any other (no function can batch
    /// across invocations; see `per_invocation_lower`).
    fn lower_bound(&self) -> u64 {
        (self.retries + self.deferrals + self.releases).div_ceil(10) + self.dead_lettered.div_ceil(10)
    }

    /// A design that reads and writes state per message and acts per message: per delivery a
    /// GetItem of the job's state and a GetItem of the breaker; per execution a PutItem of the
    /// job's state; per transient failure an UpdateItem of the breaker's counter; per retry or
    /// deferral a ChangeMessageVisibility; per dead letter a SendMessage.
    /// The function's read and write units, and the part of them computed.
    fn units(&self) -> Units {
        let mut t = Units::default();
        for u in self.units.values() {
            t.read += u.read;
            t.write += u.write;
            t.computed += u.computed;
        }
        t
    }

    /// The naive design's units and SQS requests: a strongly consistent read (1 unit, items
    /// under 4 KB) of the job's and of the breaker's state per delivery, a write (1 unit, items
    /// under 1 KB) per execution and per transient failure, one request per message moved.
    fn naive_cost(&self) -> (f64, f64, f64) {
        (
            (2 * self.deliveries) as f64,
            (self.executions + self.transient_failures) as f64,
            (self.retries + self.deferrals + self.releases + self.dead_lettered) as f64,
        )
    }

    fn naive(&self) -> u64 {
        2 * self.deliveries
            + self.executions
            + self.transient_failures
            + self.retries
            + self.deferrals
            + self.releases
            + self.dead_lettered
    }
}

pub fn run(opts: &Options) -> Section {
    let mut s = Section::new("2. AWS calls per 1,000 messages");
    let n = opts.messages;
    s.line(format!(
        "{n} messages per workload (sent with SendMessageBatch to a fresh queue, DLQ and table), \
         delivered in batches of 10 as Lambda's event source mapping does; calls counted on the \
         wire by the SDK interceptor on the function's clients, retries included, scaled to 1,000 \
         messages. Retry policy: 5 attempts, 1 s × 2 (scaled down so retries return within the run)."
    ));
    s.line(String::new());
    s.header(&[
        "workload",
        "sqs-triage calls",
        "calls by operation",
        "what happened",
        "lower bound: per invocation / global",
        "naive per-message design",
        "Lambda's own (receive + delete)",
    ]);
    if std::env::var_os("AWS_ENDPOINT_URL_SQS").is_none() {
        s.fail(
            "the local stack's variables are not set (`eval \"$(bash infra/local/stack.sh env)\"`)".into(),
        );
        return s;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            s.fail(format!("no tokio runtime: {e}"));
            return s;
        }
    };
    let scale = 1_000.0 / n as f64;
    let per_k = |x: u64| format!("{:.0}", x as f64 * scale);
    let mut done: Vec<(Workload, Measured)> = Vec::new();
    for w in workloads() {
        eprintln!("report:   {}", w.name);
        match rt.block_on(measure(&w, n, opts.quick)) {
            Ok(m) => {
                let ops = m
                    .calls
                    .iter()
                    .map(|(k, v)| format!("{} {}", short(k), per_k(*v)))
                    .collect::<Vec<_>>()
                    .join(", ");
                let happened = [
                    (m.deliveries, "deliveries"),
                    (m.retries, "retries"),
                    (m.deferrals, "deferrals"),
                    (m.releases, "releases"),
                    (m.dead_lettered, "DLQ"),
                ]
                .iter()
                .filter(|(v, _)| *v > 0)
                .map(|(v, k)| format!("{} {k}", per_k(*v)))
                .collect::<Vec<_>>()
                .join(", ");
                s.row(&[
                    w.name.into(),
                    format!("**{}**", per_k(m.total())),
                    if ops.is_empty() { "none".into() } else { ops },
                    happened,
                    format!("{} / {}", per_k(m.per_invocation_lower), per_k(m.lower_bound())),
                    per_k(m.naive()),
                    format!("{} + {}", per_k(m.receives), per_k(m.deletes)),
                ]);
                s.value(&format!("calls.{}", w.tag), m.total() as f64 * scale);
                s.value(&format!("calls.{}.lower", w.tag), m.lower_bound() as f64 * scale);
                s.value(
                    &format!("calls.{}.lower_inv", w.tag),
                    m.per_invocation_lower as f64 * scale,
                );
                s.value(&format!("calls.{}.naive", w.tag), m.naive() as f64 * scale);
                done.push((w, m));
            }
            Err(e) => {
                s.row(&[
                    w.name.into(),
                    "n/a".into(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
                s.fail(format!("{}: {e}", w.name));
            }
        }
    }
    cost_table(&mut s, &done, scale);
    goals_line(&mut s, &done, scale);
    if let Some((_, m)) = done.iter().find(|(w, _)| w.tag == "transient") {
        kinds_table(&mut s, m, scale);
    }
    s
}

/// The request-cost goals, against this run.
fn goals_line(s: &mut Section, done: &[(Workload, Measured)], scale: f64) {
    let of = |tag: &str| done.iter().find(|(w, _)| w.tag == tag).map(|(_, m)| m);
    let mut parts = Vec::new();
    if let Some(m) = of("transient") {
        parts.push(format!(
            "at 10% transient at most 150 calls per 1,000 messages: {:.0}; at most 1.1 write units \
             per failing execution: {:.2}",
            m.total() as f64 * scale,
            m.units().write / m.failed_executions.max(1) as f64
        ));
    }
    if let Some(m) = of("outage") {
        parts.push(format!(
            "in an outage at most 1.3× the per-invocation lower bound: {:.2}×",
            m.total() as f64 / m.per_invocation_lower.max(1) as f64
        ));
    }
    if !parts.is_empty() {
        s.line(String::new());
        s.line(format!("Goals, this run: {}.", parts.join("; ")));
    }
}

/// Where the 10%-transient workload's calls go, per kind of invocation.
fn kinds_table(s: &mut Section, m: &Measured, scale: f64) {
    s.line(String::new());
    s.line(
        "Where the 10%-transient calls go, per kind of invocation (start-up's breaker read and \
         the cached breaker reads fall in whichever invocation made them), per 1,000 messages:"
            .into(),
    );
    s.line(String::new());
    s.header(&["invocation", "invocations", "calls", "calls by operation"]);
    for ((redelivered, failing), (n, ops)) in &m.by_kind {
        let name = match (redelivered, failing) {
            (false, false) => "first deliveries only, all succeed",
            (false, true) => "first deliveries only, some fail",
            (true, false) => "with redeliveries, all succeed",
            (true, true) => "with redeliveries, some fail",
        };
        let total: u64 = ops.values().sum();
        let by_op = ops
            .iter()
            .map(|(k, v)| format!("{} {:.0}", short(k), *v as f64 * scale))
            .collect::<Vec<_>>()
            .join(", ");
        s.row(&[
            name.into(),
            format!("{:.0}", *n as f64 * scale),
            format!("{:.0}", total as f64 * scale),
            if by_op.is_empty() { "none".into() } else { by_op },
        ]);
    }
}

fn short(op: &str) -> &str {
    op.rsplit('.').next().unwrap_or(op)
}

/// The same runs in what they are billed: DynamoDB units, SQS requests, and the price.
fn cost_table(s: &mut Section, done: &[(Workload, Measured)], scale: f64) {
    s.line(String::new());
    s.line(format!(
        "The same runs, billed. DynamoDB's units as its answers report them (`ReturnConsumedCapacity=TOTAL` \
         on every call); where DynamoDB Local answers none (every PartiQL batch, a refused conditional \
         write) they are computed by DynamoDB's rules (1 write unit per started KB, 1 strongly consistent \
         read unit per started 4 KB, a refused conditional write still consumes) and shown as computed. \
         SQS requests as billed: one per started 64 KiB of a request. Price at on-demand list prices, \
         us-east-1, in effect since DynamoDB's on-demand cut of 2024-11-01 and looked up on 2026-12-04: US$ {PRICE_WRITE_UNIT} per million write units, \
         {PRICE_READ_UNIT} per million read units, {PRICE_SQS_REQUEST} per million SQS requests \
         (standard queue; free tiers left out). The naive design is costed from the same run: 1 read unit \
         per read and 1 write unit per write of the table above, one SQS request per message moved."
    ));
    s.line(String::new());
    s.header(&[
        "workload",
        "read units",
        "write units (computed)",
        "write units by operation",
        "write units per failing execution",
        "SQS requests (billed)",
        "price per 1,000 messages",
        "Lambda's own receive + delete",
        "naive per-message design",
    ]);
    let us = |x: f64| format!("${:.6}", x * scale);
    for (w, m) in done {
        let u = m.units();
        let by_op = m
            .units
            .iter()
            .filter(|(_, v)| v.write > 0.0)
            .map(|(k, v)| format!("{} {:.0}", short(k), v.write * scale))
            .collect::<Vec<_>>()
            .join(", ");
        let per_failing = if m.failed_executions == 0 {
            "no failures".to_owned()
        } else {
            format!("{:.2}", u.write / m.failed_executions as f64)
        };
        let mine = price(u.read, u.write, m.sqs_billed as f64);
        let lambda = price(0.0, 0.0, m.lambda_billed as f64);
        let (nr, nw, nq) = m.naive_cost();
        let naive = price(nr, nw, nq);
        s.row(&[
            w.name.into(),
            format!("{:.0}", u.read * scale),
            format!("{:.0} ({:.0})", u.write * scale, u.computed * scale),
            if by_op.is_empty() { "none".into() } else { by_op },
            per_failing,
            format!("{:.0}", m.sqs_billed as f64 * scale),
            format!("**{}**", us(mine)),
            format!("{:.0} requests, {}", m.lambda_billed as f64 * scale, us(lambda)),
            format!(
                "{:.0} read, {:.0} write units, {:.0} SQS requests: {}",
                nr * scale,
                nw * scale,
                nq * scale,
                us(naive)
            ),
        ]);
        s.value(&format!("units.{}.read", w.tag), u.read * scale);
        s.value(&format!("units.{}.write", w.tag), u.write * scale);
        s.value(&format!("units.{}.price", w.tag), mine * scale);
        s.value(&format!("units.{}.lambda_price", w.tag), lambda * scale);
        s.value(&format!("units.{}.naive_price", w.tag), naive * scale);
        if m.failed_executions > 0 {
            s.value(
                &format!("units.{}.write_per_failing", w.tag),
                u.write / m.failed_executions as f64,
            );
        }
    }
}

async fn measure(w: &Workload, n: usize, quick: bool) -> Result<Measured, String> {
    let sdk = sdk_config().await;
    let ctx = Ctx::from_config(&sdk).map_err(|e| e.to_string())?;
    let created = crate::support::try_fresh_resources(&format!("bench-{}", w.tag), false).await?;
    let mut config = Config::from_lookup(&|_| None).map_err(|e| e.to_string())?;
    config.queue_url = Some(created.queue_url.clone());
    config.dlq_url = Some(created.dlq_url.clone());
    config.table = Some(created.table.clone());
    // As the stacks configure the function: start-up reads no queue, and its one call (the
    // breakers' read, which the first batch would otherwise make) is counted below.
    config.dlq_max_bytes = Some(1_048_576);
    config.source_queue = Some(sqs_triage::config::QueueFacts {
        // SQS's default retention, which `triage setup` keeps.
        retention: Duration::from_secs(345_600),
        visibility: Duration::from_secs(created.visibility_timeout_s.into()),
        max_receive: Some(created.max_receive_count),
    });
    let p = policy();
    let registry = chaos::register(Registry::new(p.clone(), w.breaker), p, w.breaker);
    let registry = if w.marker {
        registry.done_marker(CHAOS, Duration::from_secs(86_400))
    } else {
        registry
    };
    let env = build(&config, registry, &sdk)
        .await
        .map_err(|e| format!("build: {e}"))?;
    let sqs = ctx.sqs.clone();
    let queue = created.queue_url.clone();

    // Which messages fail: a seeded draw of `share` of them.
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut SmallRng::seed_from_u64(42));
    let failing: HashSet<usize> = order[..((n as f64 * w.share).round() as usize)]
        .iter()
        .copied()
        .collect();
    let bodies: Vec<String> = (0..n)
        .map(|i| {
            let payload = if failing.contains(&i) {
                w.failing.clone()
            } else {
                json!({"outcome": "ok"})
            };
            json!({"type": CHAOS, "id": format!("{}-{i}", w.tag), "payload": payload}).to_string()
        })
        .collect();
    for (c, chunk) in bodies.chunks(10).enumerate() {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, b)| {
                SendMessageBatchRequestEntry::builder()
                    .id(format!("m{c}-{i}"))
                    .message_body(b)
                    .build()
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let out = sqs
            .send_message_batch()
            .queue_url(&queue)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| format!("SendMessageBatch: {e}"))?;
        if !out.failed().is_empty() {
            return Err(format!("SendMessageBatch refused {} entries", out.failed().len()));
        }
    }

    let mut m = Measured::default();
    let mut seen: HashSet<String> = HashSet::new();
    let started = Instant::now();
    let limit = Duration::from_secs(if quick { 120 } else { 300 });
    loop {
        let done = match w.until {
            Until::Settled => m.settled >= n as u64,
            Until::Seen => seen.len() >= n,
        };
        if done {
            break;
        }
        if started.elapsed() > limit {
            return Err(format!(
                "not finished after {limit:?}: {} settled, {} seen of {n}",
                m.settled,
                seen.len()
            ));
        }
        let batch = sqs
            .receive_message()
            .queue_url(&queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| format!("ReceiveMessage: {e}"))?
            .messages
            .unwrap_or_default();
        m.receives += 1;
        let returned: usize = batch
            .iter()
            .map(|b| b.body().map_or(0, str::len) + b.receipt_handle().map_or(0, str::len))
            .sum();
        m.lambda_billed += returned.div_ceil(SQS_CHUNK).max(1) as u64;
        if batch.is_empty() {
            continue;
        }
        m.invocations += 1;
        let handles: Vec<(String, String)> = batch
            .iter()
            .map(|b| {
                (
                    b.message_id().unwrap_or_default().to_owned(),
                    b.receipt_handle().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        seen.extend(handles.iter().map(|(id, _)| id.clone()));
        let redelivered = batch.iter().any(|b| {
            b.attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                .is_some_and(|c| c != "1")
        });
        let before = env.calls.snapshot();
        let records = batch.into_iter().map(Incoming::from_sdk).collect();
        let outcome = env
            .processor
            .process(records, Some(Instant::now() + Duration::from_secs(60)))
            .await;
        let (mut moved, mut dead) = (0u64, 0u64);
        for r in &outcome.records {
            moved += u64::from(matches!(
                r.decision,
                Decision::Retry { .. } | Decision::Defer { .. } | Decision::Release
            ));
            dead += u64::from(matches!(r.decision, Decision::DeadLetter { .. }));
            m.deliveries += 1;
            m.executions += u64::from(r.executed);
            m.failed_executions += u64::from(r.executed && !matches!(r.decision, Decision::Done { .. }));
            match &r.decision {
                Decision::Retry { .. } => {
                    m.retries += 1;
                    m.transient_failures += 1;
                }
                Decision::Defer { .. } => m.deferrals += 1,
                Decision::Release => m.releases += 1,
                Decision::DeadLetter { class, .. } => {
                    m.dead_lettered += 1;
                    m.transient_failures += u64::from(*class == FailureClass::Exhausted);
                }
                _ => {}
            }
        }
        m.per_invocation_lower += moved.div_ceil(10) + dead.div_ceil(10);
        let failing = outcome
            .records
            .iter()
            .any(|r| r.executed && !matches!(r.decision, Decision::Done { .. }));
        let kind = m.by_kind.entry((redelivered, failing)).or_default();
        kind.0 += 1;
        for (op, v) in env.calls.snapshot() {
            let d = v - before.get(&op).copied().unwrap_or(0);
            if d > 0 {
                *kind.1.entry(op).or_default() += d;
            }
        }
        let failed: HashSet<String> = outcome.failures().into_iter().collect();
        let delete: Vec<DeleteMessageBatchRequestEntry> = handles
            .iter()
            .enumerate()
            .filter(|(_, (id, _))| !failed.contains(id))
            .filter_map(|(i, (_, rh))| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(format!("d{i}"))
                    .receipt_handle(rh)
                    .build()
                    .ok()
            })
            .collect();
        if !delete.is_empty() {
            m.settled += delete.len() as u64;
            sqs.delete_message_batch()
                .queue_url(&queue)
                .set_entries(Some(delete))
                .send()
                .await
                .map_err(|e| format!("DeleteMessageBatch: {e}"))?;
            m.deletes += 1;
            m.lambda_billed += 1;
        }
    }
    m.calls = env.calls.snapshot();
    m.units = env.calls.units();
    m.sqs_billed = env.calls.sqs_billed().values().sum();
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}
