//! Item 1, per-record cost: the in-process pipeline against Powertools' `BatchProcessor`, on the same
//! event file, timed in the same run.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use sqs_triage::core::RetryPolicy;

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
    let policy = RetryPolicy::default();
    let mut rng = SmallRng::seed_from_u64(1);
    let now_ms = 1_700_000_000_000;
    let mut tally = pipeline::process_event(&raw, &policy, now_ms, &mut rng);
    let reps = opts.rust_reps();
    let mut secs = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        tally = std::hint::black_box(pipeline::process_event(&raw, &policy, now_ms, &mut rng));
        secs.push(t.elapsed().as_secs_f64());
    }
    let rust_us = median(&mut secs) * 1e6 / opts.records as f64;

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
                "sqs-triage (parse, classify, decide, DLQ copy, batch response)".into(),
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
                "sqs-triage (parse, classify, decide, DLQ copy, batch response)".into(),
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
    s
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
