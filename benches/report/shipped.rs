//! Item 8, the shipped binary end to end: `triage-lambda` as built, on `lambda_runtime`'s own
//! runtime, against Powertools' `BatchProcessor` under awslambdaric, both served by the
//! project's local Runtime API (`tests/support/runtime_api.rs`) and seen from outside: wall time
//! from the event handed over to the response received, the process's CPU time from
//! `/proc/PID/stat`, and instructions of the whole process under callgrind.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use triage::demo::chaos::CHAOS;
use triage::ops::setup::SetupReport;

use super::{Options, Section, median};
use crate::support::runtime_api::{Outcome, RuntimeApi};

/// Records of the small event the per-record instructions subtract (as section 1 does).
const BASELINE_RECORDS: usize = 100;
/// Records of one invocation in the per-invocation rows: a Lambda batch's default size.
pub const BATCH: usize = 10;

/// The two functions measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The release `triage-lambda`, the built-in `triage.chaos` job type.
    Triage,
    /// awslambdaric, Powertools' `BatchProcessor`, `bench/shipped_powertools.py`.
    Powertools,
}

impl Side {
    fn tag(self) -> &'static str {
        match self {
            Side::Triage => "triage",
            Side::Powertools => "powertools",
        }
    }
}

/// One execution environment: its Runtime API and its process (killed when dropped, if it
/// has not exited).
struct Env {
    api: Option<RuntimeApi>,
    child: Child,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Env {
    fn api(&self) -> &RuntimeApi {
        self.api
            .as_ref()
            .expect("the Runtime API is served until the environment is closed")
    }

    /// Hands `event` over and checks the answer: a batch response in which no record failed.
    async fn invoke(&self, event: &str, within: Duration) -> Result<(), String> {
        let out = self
            .api()
            .invoke(event.to_owned(), within, within, Duration::ZERO)
            .await;
        let body = match out {
            Outcome::Response(body) => body,
            other => return Err(format!("no batch response: {other:?}")),
        };
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        match v["batchItemFailures"].as_array() {
            Some(f) if f.is_empty() => Ok(()),
            _ => Err(format!(
                "a record failed: {}",
                body.chars().take(300).collect::<String>()
            )),
        }
    }

    /// The process's CPU time so far (user + system, every thread, dead ones included).
    fn cpu_s(&self, ticks_per_s: f64) -> Result<f64, String> {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
        // Fields after the command's closing parenthesis; utime and stime are the 14th and
        // 15th of the line, the 12th and 13th after it.
        let rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .ok_or("unreadable /proc stat")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let tick = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .ok_or("unreadable /proc stat")
        };
        Ok((tick(11)? + tick(12)?) as f64 / ticks_per_s)
    }

    /// Stops serving the Runtime API: the runtime's next poll fails and the process exits
    /// (what a callgrind profile needs to be written). Waits at most `within`.
    async fn close(mut self, within: Duration) -> Result<(), String> {
        drop(self.api.take());
        let start = Instant::now();
        while start.elapsed() < within {
            if self.child.try_wait().map_err(|e| e.to_string())?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!(
            "the process did not exit within {within:?} of its Runtime API closing"
        ))
    }
}

/// A healthy Lambda SQS event for `queue_url`'s queue: `records` first deliveries of the
/// built-in `triage.chaos` job type that succeed.
pub fn event_json(records: usize, queue_url: &str) -> String {
    // The queue's ARN as Lambda writes it: the account and name from the URL's path, so the
    // records come from the queue the function serves.
    let mut path = queue_url.trim_end_matches('/').rsplit('/');
    let name = path.next().unwrap_or("jobs");
    let account = path.next().unwrap_or("000000000000");
    let arn = format!("arn:aws:sqs:us-east-1:{account}:{name}");
    let records: Vec<serde_json::Value> = (0..records)
        .map(|i| {
            let sent = 1_700_000_000_000u64 + i as u64;
            json!({
                "messageId": format!("{:08x}-0000-4000-8000-{:012x}", i, i),
                "receiptHandle": format!("AQEB{}{i:08}", "x".repeat(180)),
                "body": json!({"type": CHAOS, "id": format!("job-{i:05}"), "payload": {"outcome": "ok"}}).to_string(),
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": sent.to_string(),
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "ApproximateFirstReceiveTimestamp": (sent + 5).to_string(),
                },
                "messageAttributes": {},
                "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
                "eventSource": "aws:sqs",
                "eventSourceARN": arn,
                "awsRegion": "us-east-1",
            })
        })
        .collect();
    json!({ "Records": records }).to_string()
}

/// Starts `side`'s process on a Runtime API of its own, under callgrind when `profile` is
/// given; returns once it polls for its first event.
async fn start(
    opts: &Options,
    created: &SetupReport,
    side: Side,
    profile: Option<&Path>,
    log: &Path,
    within: Duration,
) -> Result<Env, String> {
    let api = RuntimeApi::start().await;
    let program: Vec<std::ffi::OsString> = match side {
        Side::Triage => vec![opts.lambda_bin.clone().into()],
        Side::Powertools => vec![
            opts.python().into(),
            "-m".into(),
            "awslambdaric".into(),
            "shipped_powertools.handler".into(),
        ],
    };
    let mut cmd = match profile {
        Some(out) => {
            let mut c = Command::new("valgrind");
            c.arg("--tool=callgrind")
                .arg(format!("--callgrind-out-file={}", out.display()))
                .args(&program);
            c
        }
        None => {
            let mut c = Command::new(&program[0]);
            c.args(&program[1..]);
            c
        }
    };
    let file = |suffix: &str| {
        std::fs::File::create(log.with_extension(suffix)).map_err(|e| format!("{}: {e}", log.display()))
    };
    cmd.current_dir(opts.manifest_dir.join("bench"))
        .env("PYTHONPATH", opts.manifest_dir.join("bench"))
        .env_remove("AWS_LAMBDA_MAX_CONCURRENCY")
        .env("AWS_LAMBDA_RUNTIME_API", api.address())
        .env("AWS_LAMBDA_FUNCTION_NAME", "triage-bench")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
        .env("TRIAGE_QUEUE_URL", &created.queue_url)
        .env("TRIAGE_DLQ_URL", &created.dlq_url)
        .env("TRIAGE_DLQ_MAX_BYTES", "1048576")
        .env("TRIAGE_QUEUE_RETENTION_S", "345600")
        .env(
            "TRIAGE_QUEUE_VISIBILITY_S",
            created.visibility_timeout_s.to_string(),
        )
        .env("TRIAGE_QUEUE_MAX_RECEIVE", created.max_receive_count.to_string())
        .env("TRIAGE_TABLE", &created.table)
        .stdin(Stdio::null())
        .stdout(file("out")?)
        .stderr(file("log")?);
    let child = match side {
        Side::Triage => crate::support::spawn_lambda_binary(&mut cmd),
        Side::Powertools => cmd.spawn(),
    }
    .map_err(|e| format!("cannot start {side:?}: {e}"))?;
    let env = Env {
        api: Some(api),
        child,
    };
    if !env.api().ready(within).await {
        let tail = std::fs::read_to_string(log.with_extension("log")).unwrap_or_default();
        let tail: String = tail.lines().rev().take(5).collect::<Vec<_>>().join(" / ");
        return Err(format!(
            "{side:?} did not poll for an event within {within:?}: {tail}"
        ));
    }
    Ok(env)
}

/// Wall and CPU time of one side.
#[derive(Debug, Default)]
struct Times {
    wall_s: Vec<f64>,
    cpu_s: f64,
}

/// The timed figures of both sides, taken in turn.
struct Timed {
    big: [Times; 2],
    batch: [Times; 2],
}

fn ticks_per_s() -> f64 {
    super::output(Command::new("getconf").arg("CLK_TCK"))
        .and_then(|t| t.parse().ok())
        .unwrap_or(100.0)
}

async fn timed(opts: &Options, created: &SetupReport, big: &str, batch: &str) -> Result<Timed, String> {
    let dir = opts.work_dir();
    let ticks = ticks_per_s();
    let mut envs = Vec::new();
    for side in [Side::Triage, Side::Powertools] {
        let log = dir.join(format!("shipped-{}", side.tag()));
        envs.push(start(opts, created, side, None, &log, Duration::from_secs(60)).await?);
    }
    let within = Duration::from_secs(120);
    // Warm-up: one large event and a few batches each.
    for env in &envs {
        env.invoke(big, within).await?;
        for _ in 0..5 {
            env.invoke(batch, within).await?;
        }
    }
    let mut out = Timed {
        big: Default::default(),
        batch: Default::default(),
    };
    let reps = if opts.quick { 1 } else { 10 };
    for _ in 0..reps {
        for (env, t) in envs.iter().zip(out.big.iter_mut()) {
            let c0 = env.cpu_s(ticks)?;
            let w0 = Instant::now();
            env.invoke(big, within).await?;
            t.wall_s.push(w0.elapsed().as_secs_f64());
            t.cpu_s += env.cpu_s(ticks)? - c0;
        }
    }
    for _ in 0..invocations(opts) {
        for (env, t) in envs.iter().zip(out.batch.iter_mut()) {
            let c0 = env.cpu_s(ticks)?;
            let w0 = Instant::now();
            env.invoke(batch, within).await?;
            t.wall_s.push(w0.elapsed().as_secs_f64());
            t.cpu_s += env.cpu_s(ticks)? - c0;
        }
    }
    Ok(out)
}

/// The 10-record invocations timed per side (and counted under callgrind, after the first).
fn invocations(opts: &Options) -> usize {
    if opts.quick { 5 } else { 2_000 }
}

/// Invocations after the first in the per-invocation instruction count.
const COUNTED_INVOCATIONS: usize = 100;

/// The instructions of one fresh process of `side` under callgrind that serves `events` in
/// turn and exits.
async fn counted(
    opts: &Options,
    created: &SetupReport,
    side: Side,
    name: &str,
    events: &[&str],
) -> Result<u64, String> {
    let dir = opts.work_dir();
    let out = dir.join(format!("callgrind.shipped-{}-{name}.out", side.tag()));
    let log = dir.join(format!("shipped-{}-{name}", side.tag()));
    let within = Duration::from_secs(600);
    let env = start(opts, created, side, Some(&out), &log, within).await?;
    for e in events {
        env.invoke(e, within).await?;
    }
    env.close(within).await?;
    let profile = std::fs::read_to_string(&out).map_err(|e| format!("cannot read {}: {e}", out.display()))?;
    profile
        .lines()
        .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no totals in {}", out.display()))
}

/// Instructions per record on the large event and per 10-record invocation, of one side.
#[derive(Debug, Clone, Copy)]
struct Counted {
    per_record: f64,
    per_invocation: f64,
}

async fn count(
    opts: &Options,
    created: &SetupReport,
    side: Side,
    big: &str,
    small: &str,
    batch: &str,
) -> Result<Counted, String> {
    let one = counted(opts, created, side, "batch-1", &[batch]).await?;
    let many: Vec<&str> = std::iter::repeat_n(batch, 1 + COUNTED_INVOCATIONS).collect();
    let many = counted(opts, created, side, "batch-many", &many).await?;
    let small = counted(opts, created, side, "small", &[batch, small]).await?;
    let big = counted(opts, created, side, "big", &[batch, big]).await?;
    Ok(Counted {
        per_record: big.saturating_sub(small) as f64 / (opts.records - BASELINE_RECORDS) as f64,
        per_invocation: many.saturating_sub(one) as f64 / COUNTED_INVOCATIONS as f64,
    })
}

pub fn run(opts: &Options) -> Section {
    let mut s = Section::new("9. The shipped binary per record, end to end");
    if std::env::var_os("AWS_ENDPOINT_URL_SQS").is_none() {
        s.fail(
            "the local stack's variables are not set (`eval \"$(bash infra/local/stack.sh env)\"`)".into(),
        );
        return s;
    }
    if !opts.python().exists() {
        s.fail(format!(
            "{} not found (run `bash infra/local/stack.sh start`)",
            opts.python().display()
        ));
        return s;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            s.fail(format!("no tokio runtime: {e}"));
            return s;
        }
    };
    if let Err(e) = std::fs::create_dir_all(opts.work_dir()) {
        s.fail(format!("cannot create {}: {e}", opts.work_dir().display()));
        return s;
    }
    rt.block_on(measure(opts, &mut s));
    s
}

async fn measure(opts: &Options, s: &mut Section) {
    let created = match crate::support::try_fresh_resources("bench-shipped", false).await {
        Ok(c) => c,
        Err(e) => {
            s.fail(e);
            return;
        }
    };
    let big = event_json(opts.records, &created.queue_url);
    let small = event_json(BASELINE_RECORDS, &created.queue_url);
    let batch = event_json(BATCH, &created.queue_url);
    let pt = format!(
        "Powertools {} `BatchProcessor` under awslambdaric",
        opts.powertools_version()
    );
    s.line(format!(
        "Both functions run as Lambda runs them, each in its own process polling the project's \
         local Runtime API, the local stack's variables set: the `triage-lambda` binary \
         (`{}`) and {pt} (Python {}, `bench/shipped_powertools.py`). Every record is a first \
         delivery of a `triage.chaos` job that succeeds; each side parses the body, checks the \
         job type and reads the payload, and no record makes an AWS call. Wall time is from \
         the event handed over to the response received; CPU time is the process's, user and \
         system, every thread (`/proc/PID/stat`, {} ms resolution per reading).",
        bin_name(&opts.lambda_bin),
        opts.python_version(),
        (1_000.0 / ticks_per_s()) as u64,
    ));
    s.line(String::new());
    let timed = match timed(opts, &created, &big, &batch).await {
        Ok(t) => Some(t),
        Err(e) => {
            s.fail(format!("timing: {e}"));
            None
        }
    };
    let skip_count = opts.quick || opts.records <= BASELINE_RECORDS;
    let valgrind = super::output(Command::new("valgrind").arg("--version")).is_some();
    let mut counts: [Option<Counted>; 2] = [None, None];
    if !skip_count && valgrind {
        for (i, side) in [Side::Triage, Side::Powertools].into_iter().enumerate() {
            eprintln!("report:   callgrind, {side:?}");
            match count(opts, &created, side, &big, &small, &batch).await {
                Ok(c) => counts[i] = Some(c),
                Err(e) => s.fail(format!("instructions of {side:?}: {e}")),
            }
        }
    }
    s.header(&[
        "measurement",
        "sqs-triage (`triage-lambda`)",
        "Powertools",
        "Powertools ÷ sqs-triage",
    ]);
    let row = |s: &mut Section, what: String, key: &str, t: Option<f64>, p: Option<f64>, digits: usize| {
        let show = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.digits$}"));
        let ratio = match (t, p) {
            (Some(t), Some(p)) if t > 0.0 => {
                s.value(&format!("shipped.{key}.ratio"), p / t);
                format!("**{:.1}×**", p / t)
            }
            _ => "n/a".into(),
        };
        if let Some(t) = t {
            s.value(&format!("shipped.{key}"), t);
        }
        if let Some(p) = p {
            s.value(&format!("shipped.{key}.powertools"), p);
        }
        s.row(&[what, show(t), show(p), ratio]);
    };
    let records = opts.records as f64;
    if let Some(t) = &timed {
        let reps = t.big[0].wall_s.len();
        let wall = |x: &Times| median(&mut x.wall_s.clone()) * 1e6;
        let cpu = |x: &Times| x.cpu_s * 1e6 / x.wall_s.len().max(1) as f64;
        row(
            s,
            format!(
                "wall µs per record, {}-record event (median of {reps})",
                opts.records
            ),
            "wall_us",
            Some(wall(&t.big[0]) / records),
            Some(wall(&t.big[1]) / records),
            2,
        );
        row(
            s,
            format!("CPU µs per record, same event (total of the {reps} ÷ their records)"),
            "cpu_us",
            Some(cpu(&t.big[0]) / records),
            Some(cpu(&t.big[1]) / records),
            2,
        );
        let n = t.batch[0].wall_s.len();
        row(
            s,
            format!("wall µs per {BATCH}-record invocation (median of {n})"),
            "batch_wall_us",
            Some(wall(&t.batch[0])),
            Some(wall(&t.batch[1])),
            0,
        );
        row(
            s,
            format!("CPU µs per {BATCH}-record invocation (total of the {n} ÷ {n})"),
            "batch_cpu_us",
            Some(cpu(&t.batch[0])),
            Some(cpu(&t.batch[1])),
            0,
        );
    }
    if skip_count {
        s.line(String::new());
        s.line(format!(
            "*Instructions: not counted with `--quick` or {BASELINE_RECORDS} records or fewer.*"
        ));
    } else if !valgrind {
        s.fail("instructions: `valgrind` not found (Debian: `apt-get install valgrind`)".into());
    } else {
        row(
            s,
            format!("instructions per record, {}-record event", opts.records),
            "ir",
            counts[0].map(|c| c.per_record),
            counts[1].map(|c| c.per_record),
            0,
        );
        row(
            s,
            format!("instructions per {BATCH}-record invocation"),
            "batch_ir",
            counts[0].map(|c| c.per_invocation),
            counts[1].map(|c| c.per_invocation),
            0,
        );
        s.line(String::new());
        s.line(format!(
            "Instructions are the whole process's under `valgrind --tool=callgrind` (every \
             thread, the Runtime API client included), each count a fresh process that serves \
             one {BATCH}-record event and then: per record, the {}-record event less the \
             {BASELINE_RECORDS}-record one, ÷ {} records; per invocation, {COUNTED_INVOCATIONS} \
             more {BATCH}-record events less none, ÷ {COUNTED_INVOCATIONS}. Profiles: \
             `.local/bench/callgrind.shipped-*.out`.",
            opts.records,
            opts.records - BASELINE_RECORDS,
        ));
    }
    if !skip_count && valgrind {
        decoding(opts, s, counts[0].map(|c| c.per_record));
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    s.line(String::new());
    s.line(format!(
        "Load average after the section: {}. Goal (issue 31): at least 3× better than \
         Powertools on each row.",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    ));
}

fn bin_name(bin: &Path) -> String {
    let profile = bin
        .parent()
        .and_then(Path::file_name)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("target/{profile}/triage-lambda")
}

/// Issue 29's row: instructions per record of the records' and envelopes' decoding, the
/// hand-written visitors against the equivalent derived types ([`super::decode`]), each a
/// fresh `--once` process of this bench binary under callgrind; the difference beside a
/// shipped record's instructions (`shipped`).
fn decoding(opts: &Options, s: &mut Section, shipped: Option<f64>) {
    let Some(exe) = &opts.once_exe else {
        return;
    };
    let dir = opts.work_dir();
    let file = |n: usize| dir.join(format!("decode-event-{n}.json"));
    for n in [BASELINE_RECORDS, opts.records] {
        if let Err(e) = std::fs::write(file(n), super::pipeline::healthy_event_json(n)) {
            s.fail(format!("decoding: cannot write {}: {e}", file(n).display()));
            return;
        }
    }
    let per_record = |kind: &str| -> Result<f64, String> {
        let ir = |n: usize| {
            let args: Vec<std::ffi::OsString> =
                vec![exe.clone().into(), "--once".into(), kind.into(), file(n).into()];
            super::cost::callgrind(&args, &dir.join(format!("callgrind.decode-{kind}.{n}.out")))
        };
        let (small, big) = (ir(BASELINE_RECORDS)?, ir(opts.records)?);
        Ok(big.saturating_sub(small) as f64 / (opts.records - BASELINE_RECORDS) as f64)
    };
    let (visitors, derived) = match (per_record("visitors"), per_record("derived")) {
        (Ok(v), Ok(d)) => (v, d),
        (Err(e), _) | (_, Err(e)) => {
            s.fail(format!("decoding: {e}"));
            return;
        }
    };
    s.value("shipped.decode_visitors", visitors);
    s.value("shipped.decode_derived", derived);
    s.line(String::new());
    s.line(format!(
        "Decoding one way (issue 29): instructions per record of reading the records and \
         envelopes of a healthy {}-record event and decoding each payload into the handler's \
         type, nothing else (`--once visitors|derived`, less a {BASELINE_RECORDS}-record event, \
         under callgrind).",
        opts.records
    ));
    s.line(String::new());
    s.header(&[
        "decoding",
        "instructions/record",
        "÷ visitors",
        "difference ÷ a shipped record's instructions",
    ]);
    let share = |d: f64| shipped.map_or("n/a".into(), |r| format!("{:.1}%", d * 100.0 / r));
    s.row(&[
        "hand-written visitors: the lean record model (`read_records`), the plain envelope with its payload kept as text (`parse_for_handler`), the payload decoded from that text".into(),
        format!("{visitors:.0}"),
        "1×".into(),
        String::new(),
    ]);
    s.row(&[
        "derived types: `aws_lambda_events`' `SqsEvent` → `Incoming::from_lambda`, a derived envelope with its payload as a JSON value, the payload decoded from that value".into(),
        format!("{derived:.0}"),
        format!("{:.2}×", derived / visitors),
        share(derived - visitors),
    ]);
}
