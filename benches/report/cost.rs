//! Item 1, per-record cost: the in-process pipeline against Powertools' `BatchProcessor`, on the same
//! event file, timed in the same run.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::pipeline::{self, Tally};
use super::{Options, Section, median};

pub fn run(opts: &Options) -> Section {
    let mut s = Section::new("1. Per-record cost");
    let dir = opts.work_dir();
    let file = dir.join(format!("sqs-event-{}.json", opts.records));
    let raw = pipeline::event_json(opts.records);
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, &raw)) {
        s.fail(format!("cannot write {}: {e}", file.display()));
        return s;
    }
    let raw = raw.into_bytes();
    let mix = pipeline::mix(opts.records);

    // Rust: one warm-up pass, then the median of `reps` passes.
    let bench = pipeline::Bench::new();
    let now_ms = 1_700_000_000_000;
    let mut tally = bench.process_event(&raw, now_ms);
    let reps = opts.rust_reps();
    let mut secs = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        tally = std::hint::black_box(bench.process_event(&raw, now_ms));
        secs.push(t.elapsed().as_secs_f64());
    }
    let rust_us = median(&mut secs) * 1e6 / opts.records as f64;
    let healthy = healthy(&bench, opts, now_ms);

    let python = powertools(opts, &file);

    s.line(format!(
        "Event: {} records, {} ok, {} transient, {} fatal, {} malformed (`{}`).",
        opts.records,
        mix.get("ok").unwrap_or(&0),
        mix.get("transient").unwrap_or(&0),
        mix.get("fatal").unwrap_or(&0),
        mix.get("malformed").unwrap_or(&0),
        file.strip_prefix(&opts.manifest_dir).unwrap_or(&file).display(),
    ));
    s.line(String::new());
    s.header(&[
        "pipeline",
        "µs/record",
        "relative",
        "batchItemFailures",
        "runs (median)",
    ]);
    let rust_failures = describe_rust(&tally);
    s.value("cost.rust_us", rust_us);
    match &python {
        Ok(p) => {
            s.row(&[
                "sqs-triage processor without the AWS calls (read, admit, task per record, decide, plan, batch response)".into(),
                format!("{rust_us:.2}"),
                "1×".into(),
                rust_failures,
                reps.to_string(),
            ]);
            s.row(&[
                format!("Powertools {} `BatchProcessor` (Python {})", p.version, p.python),
                format!("{:.2}", p.us_per_record),
                format!("{:.1}×", p.us_per_record / rust_us),
                format!("{} (every failure)", p.failures),
                p.runs.to_string(),
            ]);
            s.value("cost.python_us", p.us_per_record);
        }
        Err(e) => {
            s.row(&[
                "sqs-triage processor without the AWS calls (read, admit, task per record, decide, plan, batch response)".into(),
                format!("{rust_us:.2}"),
                "1×".into(),
                rust_failures,
                reps.to_string(),
            ]);
            s.row(&[
                "Powertools `BatchProcessor`".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "0".into(),
            ]);
            s.fail(format!("Powertools side not measured: {e}"));
        }
    }
    match healthy {
        Ok(h) => {
            for (what, us, key) in [
                (
                    "sqs-triage, healthy batch: `plan` alone",
                    h.plan_us,
                    "cost.healthy_plan_us",
                ),
                (
                    "sqs-triage, healthy batch: whole `Processor::process` (task per record, spans, no AWS call)",
                    h.process_us,
                    "cost.healthy_process_us",
                ),
            ] {
                s.row(&[
                    what.into(),
                    format!("{us:.2}"),
                    format!("{:.2}×", us / rust_us),
                    "0".into(),
                    reps.to_string(),
                ]);
                s.value(key, us);
            }
        }
        Err(e) => s.fail(format!("healthy path not measured: {e}")),
    }
    s.line(String::new());
    s.line(
        "The event rows run the real processor (read, admission, the handler in its own tokio task, \
         the decision, `plan`) and serialize the response, leaving out only the execution of the \
         plan's AWS calls. The healthy rows use an event of first deliveries that all succeed \
         (deserialized outside the timing): `plan` alone, and the whole `Processor::process` \
         with its per-record task and tracing spans (INFO, written nowhere), which makes no AWS \
         call on that path (counted)."
            .into(),
    );
    s
}

/// Per-record figures of the healthy path.
struct Healthy {
    plan_us: f64,
    process_us: f64,
}

fn healthy(bench: &pipeline::Bench, opts: &Options, now_ms: u64) -> Result<Healthy, String> {
    let raw = pipeline::healthy_event_json(opts.records).into_bytes();
    let reps = opts.rust_reps();
    let ran = bench.run(pipeline::incoming(&raw));
    let mut plan_secs = Vec::with_capacity(reps);
    let mut process_secs = Vec::with_capacity(reps);
    // One warm-up pass of each.
    std::hint::black_box(bench.plan(ran.clone(), now_ms));
    std::hint::black_box(bench.process(pipeline::incoming(&raw)));
    for _ in 0..reps {
        let input = ran.clone();
        let t = Instant::now();
        std::hint::black_box(bench.plan(input, now_ms));
        plan_secs.push(t.elapsed().as_secs_f64());

        let records = pipeline::incoming(&raw);
        let t = Instant::now();
        let outcome = std::hint::black_box(bench.process(records));
        process_secs.push(t.elapsed().as_secs_f64());
        if !outcome.failures().is_empty() {
            return Err(format!("{} records not settled", outcome.failures().len()));
        }
    }
    let calls = bench.calls.total();
    if calls > 0 {
        return Err(format!("the healthy path made {calls} AWS calls"));
    }
    Ok(Healthy {
        plan_us: median(&mut plan_secs) * 1e6 / opts.records as f64,
        process_us: median(&mut process_secs) * 1e6 / opts.records as f64,
    })
}

fn describe_rust(t: &Tally) -> String {
    format!(
        "{} (transient only; {} DLQ copies built)",
        t.failures, t.dead_lettered
    )
}

pub struct Powertools {
    pub us_per_record: f64,
    pub failures: u64,
    pub runs: usize,
    pub version: String,
    pub python: String,
}

fn powertools(opts: &Options, file: &Path) -> Result<Powertools, String> {
    let python = opts.python();
    if !python.exists() {
        return Err(format!(
            "{} not found (run `bash infra/local/stack.sh start`)",
            python.display()
        ));
    }
    let script = opts.manifest_dir.join("bench/powertools_batch.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(file)
        .args(["--iterations", &opts.python_reps().to_string()])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("unreadable output of {}: {e}", script.display()))?;
    let mut secs: Vec<f64> = v["seconds"]
        .as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
        .unwrap_or_default();
    let records = v["records"].as_u64().unwrap_or(0);
    if secs.is_empty() || records == 0 {
        return Err("no timings".into());
    }
    let runs = secs.len();
    Ok(Powertools {
        us_per_record: median(&mut secs) * 1e6 / records as f64,
        failures: v["failures"].as_u64().unwrap_or(0),
        runs,
        version: opts.powertools_version(),
        python: opts.python_version(),
    })
}
