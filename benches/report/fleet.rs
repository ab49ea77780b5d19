//! Item 6: a fleet. N environments of one function — tasks in this process, each with its own
//! DynamoDB clients (sharing one connection pool), its own breaker cache and ledger — run
//! invocations against DynamoDB Local, first with the dependency up (steady state), then with
//! it down (an outage). Every call is stamped with the second it was sent in, so the report
//! gives per-second rates: writes to the breaker item, the conditional-check conflicts among
//! them, writes to ledger items, and the calls each environment makes.
//!
//! An invocation is modelled on the processor's storage path, through the real store:
//! `BreakerStore::observe` (cached read) and `view` for the batch; `admit` for a record that
//! would run as a half-open probe; one `BreakerStore::report` per invocation with the batch's
//! aggregate (the processor sends a report that only adds to a counting window as a statement
//! of its batched ledger write instead: the same conditional write on the same item, so the
//! breaker item's writes and conflicts are the same). The handlers take `HANDLER_MS`. Each
//! execution that fails costs the processor one ledger count (a conditional write on that
//! job's own item, in the invocation's batched call): those are counted on the
//! same timeline but not sent, because they go to one item per job, spread over the table's
//! partitions, and DynamoDB Local — one process on the same cores — would spend its whole
//! throughput on them and measure itself instead of the shared breaker item. The SQS calls a
//! failing or deferred record also needs (visibility changes) are left out likewise.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use sqs_triage::clock::now_ms;
use sqs_triage::core::Gate;
use sqs_triage::core::breaker::{Aggregate, BreakerConfig};
use sqs_triage::effects::breaker_store::BreakerStore;
use sqs_triage::effects::storage_retry::StorageRetry;
use tokio::time::Instant;

use super::{Options, Section};

/// The job type every environment runs.
const JOB_TYPE: &str = "fleet.job";
/// Records per invocation (Lambda's default batch size for a standard queue).
const BATCH: usize = 10;
/// How long the handlers of one invocation take.
const HANDLER_MS: u64 = 100;
/// DynamoDB's write limit for one partition, in write units per second; an item under 1 KB
/// (the breaker item is) costs one unit per write, a failed conditional write included.
const PARTITION_WCU: f64 = 1000.0;

/// Per-second counts, shared by every environment's clients.
#[derive(Debug, Default)]
struct Timeline {
    start: Mutex<Option<std::time::Instant>>,
    /// (second, "who.Operation") → count; "who.conflict" for conditional-check failures.
    counts: Mutex<BTreeMap<(u64, String), u64>>,
}

impl Timeline {
    fn second(&self) -> u64 {
        let start = self.start.lock().map(|s| *s).unwrap_or(None);
        start.map_or(0, |s| s.elapsed().as_secs())
    }

    fn add(&self, key: String) {
        let sec = self.second();
        if let Ok(mut m) = self.counts.lock() {
            *m.entry((sec, key)).or_default() += 1;
        }
    }

    fn reset(&self) {
        if let Ok(mut s) = self.start.lock() {
            *s = Some(std::time::Instant::now());
        }
        if let Ok(mut m) = self.counts.lock() {
            m.clear();
        }
    }

    /// Count of `key` in each second of `secs`.
    fn series(&self, key: &str, secs: std::ops::Range<u64>) -> Vec<u64> {
        let m = self.counts.lock().map(|m| m.clone()).unwrap_or_default();
        secs.map(|s| m.get(&(s, key.to_owned())).copied().unwrap_or(0))
            .collect()
    }
}

/// Stamps each request and each conditional-check failure of one kind of client.
#[derive(Debug, Clone)]
struct Stamp {
    who: &'static str,
    timeline: Arc<Timeline>,
}

impl Intercept for Stamp {
    fn name(&self) -> &'static str {
        "FleetStamp"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let op = cfg.load::<Metadata>().map_or("unknown", |m| m.name());
        self.timeline.add(format!("{}.{op}", self.who));
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let conflict = context
            .output_or_error()
            .err()
            .and_then(|e| e.as_operation_error())
            .is_some_and(|e| {
                e.downcast_ref::<PutItemError>()
                    .is_some_and(PutItemError::is_conditional_check_failed_exception)
                    || e.downcast_ref::<UpdateItemError>()
                        .is_some_and(UpdateItemError::is_conditional_check_failed_exception)
            });
        if conflict {
            self.timeline.add(format!("{}.conflict", self.who));
        }
        Ok(())
    }
}

/// What the environments did, summed.
#[derive(Debug, Default)]
struct Tally {
    invocations: AtomicU64,
    executions: AtomicU64,
    failures: AtomicU64,
    deferred: AtomicU64,
    /// Environments that have seen the breaker open since the outage began.
    saw_open: AtomicU64,
}

struct Env {
    breaker: BreakerStore,
    timeline: Arc<Timeline>,
}

fn client(sdk: &aws_config::SdkConfig, who: &'static str, timeline: &Arc<Timeline>) -> Client {
    let conf = aws_sdk_dynamodb::config::Builder::from(sdk)
        .interceptor(Stamp {
            who,
            timeline: timeline.clone(),
        })
        .build();
    Client::from_conf(conf)
}

/// One environment's invocations until `stop`; `down` says whether the dependency is down.
async fn environment(env: Arc<Env>, down: Arc<AtomicBool>, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let mut seen_open = false;
    while !stop.load(Ordering::Relaxed) {
        let now = now_ms();
        let state = env.breaker.observe(JOB_TYPE, None).await;
        let seen = env.breaker.view(&state, now);
        let failing = down.load(Ordering::Relaxed);
        let mut agg = Aggregate {
            generation: seen.generation,
            ..Aggregate::default()
        };
        let mut ran = 0u32;
        let mut failed = 0u64;
        // Half-open: the batch's first record asks for a probe permit (one slot by default);
        // the others wait for its outcome.
        let mut asked = false;
        for _ in 0..BATCH {
            let admission = if matches!(seen.gate, Gate::ProbeBusy { .. }) && !asked {
                asked = true;
                env.breaker
                    .admit(JOB_TYPE, &seen, now, Some(now + 60_000), None)
                    .await
            } else {
                seen.clone()
            };
            match admission.gate {
                Gate::Closed => {
                    ran += 1;
                    if failing {
                        agg.transient_failures += 1;
                        failed += 1;
                    }
                }
                Gate::Probe => {
                    ran += 1;
                    if let Some(lease) = &admission.permit {
                        agg.leases.push(lease.id.clone());
                        agg.generation = lease.generation;
                    }
                    if failing {
                        agg.probe_failures += 1;
                    } else {
                        agg.probe_successes += 1;
                    }
                }
                Gate::Open { .. } | Gate::ProbeBusy { .. } => {
                    tally.deferred.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if failing && !seen_open && !matches!(seen.gate, Gate::Closed) {
            seen_open = true;
            tally.saw_open.fetch_add(1, Ordering::Relaxed);
        }
        // The handlers' time; an invocation whose records were all deferred takes as long
        // (receiving its batch and changing its visibility are left out).
        tokio::time::sleep(Duration::from_millis(HANDLER_MS)).await;
        // As the processor executes a plan: one ledger count per failed execution (counted
        // here, not sent; see the module's comment) beside the breaker report.
        for _ in 0..failed {
            env.timeline.add("ledger.UpdateItem".into());
        }
        let _ = env.breaker.report(JOB_TYPE, &agg, now_ms(), None).await;
        tally.invocations.fetch_add(1, Ordering::Relaxed);
        tally.executions.fetch_add(u64::from(ran), Ordering::Relaxed);
        tally.failures.fetch_add(failed, Ordering::Relaxed);
    }
}

/// One fleet size's figures.
#[derive(Debug, Default, Clone)]
struct Figures {
    n: usize,
    steady_secs: u64,
    outage_secs: u64,
    steady_invocations_per_s: f64,
    steady_breaker_writes_per_s: f64,
    steady_breaker_reads_per_s: f64,
    steady_calls_per_env_s: f64,
    outage_invocations: u64,
    outage_breaker_writes: u64,
    outage_breaker_writes_peak: u64,
    outage_conflicts: u64,
    outage_conflicts_peak: u64,
    outage_breaker_reads_peak: u64,
    outage_ledger_writes: u64,
    outage_ledger_writes_peak: u64,
    outage_calls_per_env_s: f64,
    executions_failed: u64,
    envs_saw_open: u64,
    /// Seconds from the outage's start until every environment had seen the breaker open.
    all_saw_open_s: Option<f64>,
    outage_curve: Vec<(u64, u64, u64, u64)>,
}

fn sum_ops(t: &Timeline, who: &str, ops: &[&str], secs: std::ops::Range<u64>) -> Vec<u64> {
    let mut total = vec![0u64; (secs.end - secs.start) as usize];
    for op in ops {
        for (i, v) in t.series(&format!("{who}.{op}"), secs.clone()).iter().enumerate() {
            total[i] += v;
        }
    }
    total
}

async fn measure(n: usize, steady: Duration, outage_max: Duration) -> Result<Figures, String> {
    let sdk = crate::support::sdk_config().await;
    let created = crate::support::try_fresh_resources("bench-fleet", false).await?;
    let timeline = Arc::new(Timeline::default());
    let breaker_client = client(&sdk, "breaker", &timeline);
    let down = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        // Clones of one client share its connection pool and interceptor; each environment
        // has its own stores, and so its own breaker cache.
        let env = Arc::new(Env {
            breaker: BreakerStore::new(
                breaker_client.clone(),
                created.table.clone(),
                StorageRetry::default(),
            )
            .with_config(BreakerConfig::default()),
            timeline: timeline.clone(),
        });
        tasks.push(tokio::spawn(environment(
            env,
            down.clone(),
            stop.clone(),
            tally.clone(),
        )));
    }
    // Steady state: its first half is the fleet's start-up (every cache empty, every
    // environment's first read); the rates are from its second half.
    timeline.reset();
    let t0 = Instant::now();
    tokio::time::sleep(steady).await;
    let steady_secs = steady.as_secs();
    let inv_before = tally.invocations.load(Ordering::Relaxed);
    down.store(true, Ordering::Relaxed);
    let outage_start = Instant::now();
    let outage_first_sec = t0.elapsed().as_secs();
    let mut all_saw_open_s = None;
    while outage_start.elapsed() < outage_max {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if all_saw_open_s.is_none() && tally.saw_open.load(Ordering::Relaxed) >= n as u64 {
            all_saw_open_s = Some(outage_start.elapsed().as_secs_f64());
            // Two more seconds of the open breaker's steady deferrals, then stop.
            tokio::time::sleep(Duration::from_secs(2)).await;
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    // The measurement ends here: calls still queued at the emulator are not waited for.
    let end_sec = t0.elapsed().as_secs();
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    let inv_after = tally.invocations.load(Ordering::Relaxed);

    let writes = ["PutItem", "UpdateItem"];
    let steady_range = steady_secs / 2..steady_secs.max(2);
    let steady_len = (steady_range.end - steady_range.start) as f64;
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / steady_len;
    let all_ops = [
        "GetItem",
        "PutItem",
        "UpdateItem",
        "BatchGetItem",
        "BatchWriteItem",
    ];
    let steady_calls: u64 = sum_ops(&timeline, "breaker", &all_ops, steady_range.clone())
        .iter()
        .chain(sum_ops(&timeline, "ledger", &all_ops, steady_range.clone()).iter())
        .sum();
    let outage_range = outage_first_sec..end_sec.max(outage_first_sec + 1);
    let ob = sum_ops(&timeline, "breaker", &writes, outage_range.clone());
    let oc = timeline.series("breaker.conflict", outage_range.clone());
    let or = sum_ops(&timeline, "breaker", &["GetItem"], outage_range.clone());
    let ol = sum_ops(&timeline, "ledger", &writes, outage_range.clone());
    let outage_len = (outage_range.end - outage_range.start) as f64;
    let outage_calls: u64 = sum_ops(&timeline, "breaker", &all_ops, outage_range.clone())
        .iter()
        .chain(sum_ops(&timeline, "ledger", &all_ops, outage_range.clone()).iter())
        .sum();
    let steady_inv = {
        // Invocations in the steady seconds after the first, estimated from the whole phase.
        inv_before as f64 / steady.as_secs_f64()
    };
    Ok(Figures {
        n,
        steady_secs,
        outage_secs: outage_range.end - outage_range.start,
        steady_invocations_per_s: steady_inv,
        steady_breaker_writes_per_s: mean(&sum_ops(&timeline, "breaker", &writes, steady_range.clone())),
        steady_breaker_reads_per_s: mean(&sum_ops(&timeline, "breaker", &["GetItem"], steady_range.clone())),
        steady_calls_per_env_s: steady_calls as f64 / steady_len / n as f64,
        outage_invocations: inv_after - inv_before,
        outage_breaker_writes: ob.iter().sum(),
        outage_breaker_writes_peak: ob.iter().copied().max().unwrap_or(0),
        outage_conflicts: oc.iter().sum(),
        outage_conflicts_peak: oc.iter().copied().max().unwrap_or(0),
        outage_breaker_reads_peak: or.iter().copied().max().unwrap_or(0),
        outage_ledger_writes: ol.iter().sum(),
        outage_ledger_writes_peak: ol.iter().copied().max().unwrap_or(0),
        outage_calls_per_env_s: outage_calls as f64 / outage_len / n as f64,
        executions_failed: tally.failures.load(Ordering::Relaxed),
        envs_saw_open: tally.saw_open.load(Ordering::Relaxed),
        all_saw_open_s,
        outage_curve: (0..ob.len()).map(|i| (i as u64, ob[i], oc[i], ol[i])).collect(),
    })
}

pub fn run(opts: &Options) -> Section {
    let mut s = Section::new("6. A fleet: N environments sharing one breaker");
    let (steady, outage_max) = if opts.quick {
        (Duration::from_secs(2), Duration::from_secs(5))
    } else {
        (Duration::from_secs(10), Duration::from_secs(40))
    };
    s.line(format!(
        "N environments (tasks in one process, each with its own breaker cache and stores; \
         their DynamoDB clients share one connection pool) against DynamoDB Local, one job \
         type, {BATCH} records per invocation, handlers taking {HANDLER_MS} ms, the default \
         breaker (50% of at least 10 executions in 60 s failing opens it for 30 s; reads cached 5 s). Steady \
         state for {} s (every job succeeds; rates from its second half, after every cache \
         was filled), then an outage (every execution fails transiently) until every environment has \
         seen the breaker open, plus 2 s, at most {} s. Calls are stamped on the wire per \
         second; a write is a `PutItem` or `UpdateItem`, a conflict a write refused by its \
         condition. Ledger counts (one per failed execution, each on its own job's item) are \
         counted, not sent, so that the emulator's throughput goes to the shared breaker item.",
        steady.as_secs(),
        outage_max.as_secs()
    ));
    s.line(String::new());
    s.header(&[
        "environments",
        "steady: invocations/s",
        "steady: breaker writes/s",
        "steady: breaker reads/s",
        "steady: calls per environment per s",
        "outage: breaker writes (peak/s)",
        "outage: conflicts (peak/s)",
        "outage: breaker reads, peak/s",
        "outage: ledger writes (peak/s)",
        "outage: executions failed",
        "every environment saw it open after",
        "outage: calls per environment per s",
    ]);
    if std::env::var_os("AWS_ENDPOINT_URL_DYNAMODB").is_none() {
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
    let mut largest: Option<Figures> = None;
    for &n in &opts.fleet {
        eprintln!("report:   {n} environments");
        match rt.block_on(measure(n, steady, outage_max)) {
            Ok(f) => {
                s.row(&[
                    format!("{n}"),
                    format!("{:.0}", f.steady_invocations_per_s),
                    format!("{:.1}", f.steady_breaker_writes_per_s),
                    format!("{:.1}", f.steady_breaker_reads_per_s),
                    format!("{:.2}", f.steady_calls_per_env_s),
                    format!("{} ({})", f.outage_breaker_writes, f.outage_breaker_writes_peak),
                    format!("{} ({})", f.outage_conflicts, f.outage_conflicts_peak),
                    format!("{}", f.outage_breaker_reads_peak),
                    format!("{} ({})", f.outage_ledger_writes, f.outage_ledger_writes_peak),
                    format!("{} in {} invocations", f.executions_failed, f.outage_invocations),
                    f.all_saw_open_s.map_or_else(
                        || format!("not within {} s ({} of {n})", f.outage_secs, f.envs_saw_open),
                        |x| format!("{x:.1} s"),
                    ),
                    format!("{:.2}", f.outage_calls_per_env_s),
                ]);
                let tag = format!("fleet.{n}");
                s.value(
                    &format!("{tag}.breaker_writes_peak"),
                    f.outage_breaker_writes_peak as f64,
                );
                s.value(&format!("{tag}.breaker_writes"), f.outage_breaker_writes as f64);
                s.value(&format!("{tag}.conflicts"), f.outage_conflicts as f64);
                s.value(&format!("{tag}.steady_writes"), f.steady_breaker_writes_per_s);
                if let Some(x) = f.all_saw_open_s {
                    s.value(&format!("{tag}.open_s"), x);
                }
                if largest.as_ref().is_none_or(|l| l.n < n) {
                    largest = Some(f);
                }
            }
            Err(e) => {
                s.fail(format!("{n} environments: {e}"));
            }
        }
    }
    if let Some(f) = largest {
        s.line(String::new());
        s.line(format!(
            "The outage second by second at {} environments (second 0 is the outage's first):",
            f.n
        ));
        s.line(String::new());
        s.header(&[
            "second",
            "breaker writes",
            "of them conflicts",
            "ledger writes",
            "breaker writes ÷ one partition's limit",
        ]);
        for (sec, w, c, l) in &f.outage_curve {
            s.row(&[
                format!("{sec}"),
                format!("{w}"),
                format!("{c}"),
                format!("{l}"),
                format!("{:.2}", *w as f64 / PARTITION_WCU),
            ]);
        }
        s.value("fleet.max_n", f.n as f64);
        s.value(
            "fleet.max_n.breaker_writes_peak",
            f.outage_breaker_writes_peak as f64,
        );
    }
    s
}
