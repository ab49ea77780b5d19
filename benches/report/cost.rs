//! Item 1, per-record cost: the in-process pipeline against Powertools' `BatchProcessor`, on the same
//! event file, timed in the same run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::pipeline::{self, Tally};
use super::{Options, Section, median};

pub fn run(opts: &Options) -> Section {
    let mut s = Section::new("1. Per-record cost");
    let dir = opts.work_dir();
    let file = dir.join(format!("sqs-event-{}.json", opts.records));
    let healthy_file = dir.join(format!("sqs-event-{}-healthy.json", opts.records));
    let raw = pipeline::event_json(opts.records);
    let healthy_raw = pipeline::healthy_event_json(opts.records);
    if let Err(e) = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&file, &raw))
        .and_then(|()| std::fs::write(&healthy_file, &healthy_raw))
    {
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
    let mut mixed = Samples::with_capacity(reps);
    for _ in 0..reps {
        let t = Timer::start();
        tally = std::hint::black_box(bench.process_event(&raw, now_ms));
        mixed.push(t);
    }
    let rust = mixed.per_record(opts.records);
    let healthy = healthy(&bench, opts, healthy_raw.as_bytes(), now_ms);

    let python = powertools(opts, &file);
    let python_healthy = powertools(opts, &healthy_file);

    s.line(format!(
        "Event: {} records, {} ok, {} transient, {} fatal, {} malformed (`{}`); the healthy \
         event: {} first deliveries that all succeed (`{}`).",
        opts.records,
        mix.get("ok").unwrap_or(&0),
        mix.get("transient").unwrap_or(&0),
        mix.get("fatal").unwrap_or(&0),
        mix.get("malformed").unwrap_or(&0),
        file.strip_prefix(&opts.manifest_dir).unwrap_or(&file).display(),
        opts.records,
        healthy_file
            .strip_prefix(&opts.manifest_dir)
            .unwrap_or(&healthy_file)
            .display(),
    ));
    s.line(String::new());
    s.header(&[
        "pipeline",
        "CPU µs/record",
        "Powertools ÷ this (CPU)",
        "wall µs/record",
        "batchItemFailures",
        "runs (median)",
    ]);
    let rust_failures = describe_rust(&tally);
    s.value("cost.rust_us", rust.cpu_us);
    s.value("cost.rust_wall_us", rust.wall_us);
    let ratio = |p: &Result<Powertools, String>, us: f64| {
        p.as_ref()
            .map_or("n/a".into(), |p| format!("{:.1}×", p.cost.cpu_us / us))
    };
    s.row(&[
        "sqs-triage, 10% failing: processor without the AWS calls (deserialize, read, admit, task per record, decide, plan, batch response)".into(),
        format!("{:.2}", rust.cpu_us),
        ratio(&python, rust.cpu_us),
        format!("{:.2}", rust.wall_us),
        rust_failures,
        reps.to_string(),
    ]);
    match &healthy {
        Ok(h) => {
            s.row(&[
                "sqs-triage, healthy: `plan` alone".into(),
                format!("{:.2}", h.plan.cpu_us),
                "".into(),
                format!("{:.2}", h.plan.wall_us),
                "0".into(),
                reps.to_string(),
            ]);
            s.row(&[
                "sqs-triage, healthy: deserialize, whole `Processor::process` (task per record, spans, no AWS call), batch response".into(),
                format!("{:.2}", h.process.cpu_us),
                ratio(&python_healthy, h.process.cpu_us),
                format!("{:.2}", h.process.wall_us),
                "0".into(),
                reps.to_string(),
            ]);
            s.value("cost.healthy_plan_us", h.plan.cpu_us);
            s.value("cost.healthy_process_us", h.process.cpu_us);
        }
        Err(e) => s.fail(format!("healthy path not measured: {e}")),
    }
    for (p, what, key) in [
        (&python, "10% failing", "cost.python_us"),
        (&python_healthy, "healthy", "cost.python_healthy_us"),
    ] {
        match p {
            Ok(p) => {
                s.row(&[
                    format!(
                        "Powertools {} `BatchProcessor` (Python {}), {what}",
                        p.version, p.python
                    ),
                    format!("{:.2}", p.cost.cpu_us),
                    "1×".into(),
                    format!("{:.2}", p.cost.wall_us),
                    format!("{} (every failure)", p.failures),
                    p.runs.to_string(),
                ]);
                s.value(key, p.cost.cpu_us);
            }
            Err(e) => {
                s.row(&[
                    format!("Powertools `BatchProcessor`, {what}"),
                    "n/a".into(),
                    "n/a".into(),
                    "n/a".into(),
                    "n/a".into(),
                    "0".into(),
                ]);
                s.fail(format!("Powertools side ({what}) not measured: {e}"));
            }
        }
    }
    s.line(String::new());
    s.line(
        "CPU time is the process's (`CLOCK_PROCESS_CPUTIME_ID`; Python's `time.process_time()`), \
         per pass, median of the passes, divided by the records; wall time beside it. The \
         10%-failing row runs the real processor (read, admission, the handler in its own tokio \
         task, the decision, `plan`) and serializes the response, leaving out only the execution \
         of the plan's AWS calls. The healthy rows use the event of first deliveries that all \
         succeed: `plan` alone (on records that have run), and deserialization, the whole \
         `Processor::process` with its per-record task and tracing spans (INFO, written nowhere) \
         and the response, which makes no AWS call on that path (counted)."
            .into(),
    );
    instructions(opts, &mut s, &file, &healthy_file);
    s
}

/// One pass's CPU and wall time.
struct Timer {
    cpu: cpu_time::ProcessTime,
    wall: Instant,
}

impl Timer {
    fn start() -> Self {
        Self {
            cpu: cpu_time::ProcessTime::now(),
            wall: Instant::now(),
        }
    }
}

/// The passes' times.
struct Samples {
    cpu: Vec<f64>,
    wall: Vec<f64>,
}

impl Samples {
    fn with_capacity(n: usize) -> Self {
        Self {
            cpu: Vec::with_capacity(n),
            wall: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, t: Timer) {
        // Wall first: reading the CPU clock is a system call.
        self.wall.push(t.wall.elapsed().as_secs_f64());
        self.cpu.push(t.cpu.elapsed().as_secs_f64());
    }

    fn per_record(mut self, records: usize) -> PerRecord {
        PerRecord {
            cpu_us: median(&mut self.cpu) * 1e6 / records as f64,
            wall_us: median(&mut self.wall) * 1e6 / records as f64,
        }
    }
}

/// Median µs per record.
#[derive(Debug, Clone, Copy)]
pub struct PerRecord {
    pub cpu_us: f64,
    pub wall_us: f64,
}

/// Per-record figures of the healthy path.
struct Healthy {
    plan: PerRecord,
    process: PerRecord,
}

fn healthy(bench: &pipeline::Bench, opts: &Options, raw: &[u8], now_ms: u64) -> Result<Healthy, String> {
    let reps = opts.rust_reps();
    let ran = bench.run(pipeline::incoming(raw));
    let mut plan = Samples::with_capacity(reps);
    let mut process = Samples::with_capacity(reps);
    // One warm-up pass of each.
    std::hint::black_box(bench.plan(ran.clone(), now_ms));
    std::hint::black_box(bench.handle_event(raw));
    for _ in 0..reps {
        let input = ran.clone();
        let t = Timer::start();
        std::hint::black_box(bench.plan(input, now_ms));
        plan.push(t);

        let t = Timer::start();
        let tally = std::hint::black_box(bench.handle_event(raw));
        process.push(t);
        if tally.failures > 0 {
            return Err(format!("{} records not settled", tally.failures));
        }
    }
    let calls = bench.calls.total();
    if calls > 0 {
        return Err(format!("the healthy path made {calls} AWS calls"));
    }
    Ok(Healthy {
        plan: plan.per_record(opts.records),
        process: process.per_record(opts.records),
    })
}

fn describe_rust(t: &Tally) -> String {
    format!(
        "{} (transient only; {} DLQ copies built)",
        t.failures, t.dead_lettered
    )
}

pub struct Powertools {
    pub cost: PerRecord,
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
    let samples = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default()
    };
    let (mut wall, mut cpu) = (samples("seconds"), samples("cpu_seconds"));
    let records = v["records"].as_u64().unwrap_or(0);
    if wall.is_empty() || cpu.is_empty() || records == 0 {
        return Err("no timings".into());
    }
    let runs = cpu.len();
    Ok(Powertools {
        cost: PerRecord {
            cpu_us: median(&mut cpu) * 1e6 / records as f64,
            wall_us: median(&mut wall) * 1e6 / records as f64,
        },
        failures: v["failures"].as_u64().unwrap_or(0),
        runs,
        version: opts.powertools_version(),
        python: opts.python_version(),
    })
}

/// Records in the baseline events of the instruction counts: what a run costs besides its
/// records (start-up, one-time initialisation) is the count on this event, subtracted.
const BASELINE_RECORDS: usize = 100;

/// Functions shown from each profile.
const PROFILE_TOP: usize = 12;

/// Instructions per record under `valgrind --tool=callgrind`: each side runs once on the event
/// and once on a baseline event of [`BASELINE_RECORDS`] records of the same mix, in a fresh
/// process; the difference divided by the difference in records. Then the top of the
/// sqs-triage profiles.
fn instructions(opts: &Options, s: &mut Section, file: &Path, healthy_file: &Path) {
    s.line(String::new());
    let Some(exe) = &opts.once_exe else {
        s.line(
            "*Instructions per record: counted only by `cargo bench --bench report` (this run \
             cannot start the bench binary).*"
                .into(),
        );
        return;
    };
    if opts.quick || opts.records <= BASELINE_RECORDS {
        s.line(format!(
            "*Instructions per record: not counted with `--quick` or {BASELINE_RECORDS} records or fewer.*"
        ));
        return;
    }
    if super::output(Command::new("valgrind").arg("--version")).is_none() {
        s.fail("instructions per record: `valgrind` not found (Debian: `apt-get install valgrind`)".into());
        return;
    }
    let dir = opts.work_dir();
    let base = dir.join(format!("sqs-event-{BASELINE_RECORDS}.json"));
    let healthy_base = dir.join(format!("sqs-event-{BASELINE_RECORDS}-healthy.json"));
    if let Err(e) = std::fs::write(&base, pipeline::event_json(BASELINE_RECORDS))
        .and_then(|()| std::fs::write(&healthy_base, pipeline::healthy_event_json(BASELINE_RECORDS)))
    {
        s.fail(format!(
            "instructions per record: cannot write {}: {e}",
            base.display()
        ));
        return;
    }
    let script = opts.manifest_dir.join("bench/powertools_batch.py");
    let python = opts.python();
    let rust = |kind: &'static str| {
        move |f: &Path| -> Vec<std::ffi::OsString> {
            vec![exe.clone().into(), "--once".into(), kind.into(), f.into()]
        }
    };
    let py = |f: &Path| -> Vec<std::ffi::OsString> {
        vec![
            python.clone().into(),
            script.clone().into(),
            f.into(),
            "--once".into(),
        ]
    };
    type Args<'a> = Box<dyn Fn(&Path) -> Vec<std::ffi::OsString> + 'a>;
    /// One pipeline counted: its row, its profile's name, its summary key, its command, its
    /// small and big events, and the Powertools run (index) it is compared with.
    struct Run<'a> {
        what: &'static str,
        name: &'static str,
        key: &'static str,
        args: Args<'a>,
        small: &'a Path,
        big: &'a Path,
        compare: Option<usize>,
    }
    let runs: [Run; 6] = [
        Run {
            what: "sqs-triage, 10% failing: processor without the AWS calls",
            name: "triage-mixed",
            key: "ir.rust",
            args: Box::new(rust("event")),
            small: &base,
            big: file,
            compare: Some(2),
        },
        Run {
            what: "sqs-triage, healthy: deserialize, whole `Processor::process`, batch response",
            name: "triage-healthy",
            key: "ir.rust_healthy",
            args: Box::new(rust("process")),
            small: &healthy_base,
            big: healthy_file,
            compare: Some(3),
        },
        Run {
            what: "Powertools `BatchProcessor`, 10% failing",
            name: "powertools-mixed",
            key: "ir.python",
            args: Box::new(py),
            small: &base,
            big: file,
            compare: None,
        },
        Run {
            what: "Powertools `BatchProcessor`, healthy",
            name: "powertools-healthy",
            key: "ir.python_healthy",
            args: Box::new(py),
            small: &healthy_base,
            big: healthy_file,
            compare: None,
        },
        Run {
            what: "floor, healthy: `lambda_runtime`'s own pass over the event, handing it on as JSON text \
             (`Box<RawValue>`, what a handler taking the text gets; `triage-lambda` takes the bytes before it), no handler",
            name: "floor-raw",
            key: "ir.floor_raw",
            args: Box::new(rust("raw")),
            small: &healthy_base,
            big: healthy_file,
            compare: Some(3),
        },
        Run {
            what: "floor, healthy: `lambda_runtime`'s pass into `aws_lambda_events`' typed `SqsEvent` \
             (what a typed Rust handler takes), no handler",
            name: "floor-typed",
            key: "ir.floor_typed",
            args: Box::new(rust("typed")),
            small: &healthy_base,
            big: healthy_file,
            compare: Some(3),
        },
    ];
    let mut counted: Vec<Result<(u64, u64, PathBuf), String>> = Vec::new();
    for Run {
        name,
        args,
        small,
        big,
        ..
    } in &runs
    {
        let one = |f: &Path, n: usize| {
            let out = dir.join(format!("callgrind.{name}.{n}.out"));
            callgrind(&args(f), &out).map(|ir| (ir, out))
        };
        counted.push(
            one(small, BASELINE_RECORDS)
                .and_then(|(b, _)| one(big, opts.records).map(|(f, out)| (b, f, out))),
        );
    }
    let extra = (opts.records - BASELINE_RECORDS) as f64;
    let per = |c: &Result<(u64, u64, PathBuf), String>| {
        c.as_ref()
            .ok()
            .map(|(b, f, _)| f.saturating_sub(*b) as f64 / extra)
    };
    s.line(format!(
        "Instructions (`valgrind --tool=callgrind`, Ir), each a fresh process running the \
         pipeline once on the event and once on a {BASELINE_RECORDS}-record event of the same \
         kind: (Ir of the event − Ir of the small one) ÷ {} records, so start-up and one-time \
         costs cancel out. The figure does not move with the machine's load.",
        opts.records - BASELINE_RECORDS
    ));
    s.line(String::new());
    s.header(&[
        "pipeline",
        "instructions/record",
        "Powertools ÷ this",
        "Ir, whole event",
        &format!("Ir, {BASELINE_RECORDS} records"),
    ]);
    for (
        Run {
            what, key, compare, ..
        },
        c,
    ) in runs.iter().zip(&counted)
    {
        let ratio = match (per(c), compare.map(|k| per(&counted[k]))) {
            (Some(r), Some(Some(p))) => format!("{:.1}×", p / r),
            (Some(_), None) => "1×".into(),
            _ => "n/a".into(),
        };
        match c {
            Ok((b, f, _)) => {
                let v = per(c).unwrap_or(f64::NAN);
                s.value(key, v);
                s.row(&[
                    (*what).into(),
                    format!("{v:.0}"),
                    ratio,
                    thousands(*f),
                    thousands(*b),
                ]);
            }
            Err(e) => {
                s.row(&[
                    (*what).into(),
                    "n/a".into(),
                    "n/a".into(),
                    "n/a".into(),
                    "n/a".into(),
                ]);
                s.fail(format!("instructions of {what}: {e}"));
            }
        }
    }
    if let (Some(py), Some(raw), Some(typed)) = (per(&counted[3]), per(&counted[4]), per(&counted[5])) {
        let budget = py / 5.0;
        s.line(String::new());
        s.line(format!(
            "A healthy record at 5× fewer instructions than Powertools' would have {budget:.0} \
             to spend. `lambda_runtime`'s own deserialization of the event, before any handler \
             code runs, takes {raw:.0} of them when it hands the event on as text ({:.0}% of \
             that budget), and {typed:.0} when it builds the typed `SqsEvent` ({:.0}%): the \
             floor rows, which run only that deserialization (`serde_path_to_error` over \
             `serde_json`, as `lambda_runtime` 1.5 does) on the same events.",
            raw * 100.0 / budget,
            typed * 100.0 / budget,
        ));
    }
    for (i, title) in [(0, "10% failing"), (1, "healthy")] {
        let Ok((_, total, out)) = &counted[i] else {
            continue;
        };
        match top_functions(out, PROFILE_TOP) {
            Ok(top) if top.iter().all(|(_, f)| f.starts_with("0x")) => s.line(format!(
                "\n*The profile of {title} has no function names: the bench profile strips \
                 symbols (run with `CARGO_PROFILE_BENCH_STRIP=false` for them).*"
            )),
            Ok(top) => {
                s.line(String::new());
                s.line(format!(
                    "Where sqs-triage's instructions go, {title} ({} records, start-up included): \
                     the top {PROFILE_TOP} functions by their own instructions (`callgrind_annotate {}`; \
                     inlined code counts in its caller).",
                    opts.records,
                    out.strip_prefix(&opts.manifest_dir).unwrap_or(out).display()
                ));
                s.line(String::new());
                s.header(&["function", "Ir", "share", "per record"]);
                for (ir, f) in top {
                    s.row(&[
                        format!("`{f}`"),
                        thousands(ir),
                        format!("{:.1}%", ir as f64 * 100.0 / *total as f64),
                        format!("{:.0}", ir as f64 / opts.records as f64),
                    ]);
                }
            }
            Err(e) => s.fail(format!("profile of {title}: {e}")),
        }
    }
    if let Ok((_, _, out)) = &counted[1] {
        match inclusive(out) {
            Ok(by_name) => {
                let pass = by_name.get(PASS).copied();
                s.line(String::new());
                s.line(format!(
                    "Where a healthy record's instructions go, stage by stage: each stage the \
                     instructions of its functions and of all they call, per record of the {} \
                     (`callgrind_annotate --inclusive=yes {}`); a stage whose functions were \
                     inlined reads n/a.",
                    opts.records,
                    out.strip_prefix(&opts.manifest_dir).unwrap_or(out).display()
                ));
                s.line(String::new());
                s.header(&["stage", "instructions/record", "share of the pass"]);
                for (what, v) in stages(&by_name, opts.records) {
                    let share = match (v, pass) {
                        (Some(v), Some(p)) if p > 0 => {
                            format!("{:.0}%", v * opts.records as f64 * 100.0 / p as f64)
                        }
                        _ => "n/a".into(),
                    };
                    s.row(&[what.into(), v.map_or("n/a".into(), |v| format!("{v:.0}")), share]);
                }
            }
            Err(e) => s.fail(format!("stages of the healthy pass: {e}")),
        }
    }
}

/// Runs `args` under callgrind, its profile written to `out`; returns the instructions counted.
pub(super) fn callgrind(args: &[std::ffi::OsString], out: &Path) -> Result<u64, String> {
    let run = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .args(args)
        .output()
        .map_err(|e| format!("cannot run valgrind: {e}"))?;
    if !run.status.success() {
        return Err(format!(
            "{} failed under valgrind: {}",
            Path::new(&args[0]).display(),
            String::from_utf8_lossy(&run.stderr).lines().last().unwrap_or("")
        ));
    }
    let profile = std::fs::read_to_string(out).map_err(|e| format!("cannot read {}: {e}", out.display()))?;
    profile
        .lines()
        .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no totals in {}", out.display()))
}

/// The `n` functions with the most instructions of their own in a callgrind profile.
fn top_functions(out: &Path, n: usize) -> Result<Vec<(u64, String)>, String> {
    let text =
        super::output(Command::new("callgrind_annotate").arg(out)).ok_or("callgrind_annotate did not run")?;
    let top: Vec<(u64, String)> = annotated(&text)
        .into_iter()
        .take(n)
        .map(|(ir, mut function)| {
            if function.chars().count() > 110 {
                function = function.chars().take(110).collect::<String>() + "…";
            }
            (ir, function.replace('|', "\\|").replace('`', "'"))
        })
        .collect();
    if top.is_empty() {
        return Err(format!("no functions in {}", out.display()));
    }
    Ok(top)
}

/// The functions of `callgrind_annotate`'s listing with their instructions, in its order.
fn annotated(text: &str) -> Vec<(u64, String)> {
    let mut listed = Vec::new();
    for l in text.lines() {
        let l = l.trim_start();
        let Some((count, rest)) = l.split_once(' ') else {
            continue;
        };
        let Ok(ir) = count.replace(',', "").parse::<u64>() else {
            continue;
        };
        // `(12.34%)  file:function [object]`
        let rest = rest.trim_start();
        let rest = rest.split_once(')').map_or(rest, |(_, r)| r).trim();
        if rest.starts_with("PROGRAM TOTALS") {
            continue;
        }
        let rest = rest.split_once(" [").map_or(rest, |(f, _)| f);
        let function = rest.split_once(':').map_or(rest, |(_, f)| f);
        listed.push((ir, function.to_owned()));
    }
    listed
}

/// The healthy pass whose stages [`STAGES`] are.
const PASS: &str = "report::report::pipeline::Bench::handle_event";

/// What of [`PASS`] no stage of [`STAGES`] names.
const REST: &str = "the rest: routing, the tasks' scheduling, the batch's stream, `execute` (reports, metrics), the response, freeing";

/// The stages of the healthy pass, each the inclusive instructions of the functions named
/// (`-` before a name: less that one's), per record.
const STAGES: [(&str, &[&str]); 6] = [
    (
        "the event's bytes checked as UTF-8 text (`triage-lambda` takes them before `lambda_runtime`'s own pass)",
        &[
            "report::report::pipeline::incoming",
            "-sqs_triage::runtime::lambda::read_records",
        ],
    ),
    (
        "records read from that text (`read_records`: the lean typed model)",
        &["sqs_triage::runtime::lambda::read_records"],
    ),
    (
        "envelope parsed (`parse_for_handler`)",
        &["sqs_triage::core::envelope::parse_for_handler"],
    ),
    (
        "admission, the handler's task started and awaited, the decision (`run_one`)",
        &["sqs_triage::processor::run::<impl sqs_triage::processor::Processor>::run_one::{{closure}}"],
    ),
    (
        "the handler, in its task: its payload decoded, the job run",
        &["sqs_triage::processor::registry::Registry::insert::{{closure}}::{{closure}}"],
    ),
    (
        "`plan`",
        &["sqs_triage::processor::plan::<impl sqs_triage::processor::Processor>::plan"],
    ),
];

/// Every function's inclusive instructions in a callgrind profile, by name.
fn inclusive(out: &Path) -> Result<HashMap<String, u64>, String> {
    let text = super::output(Command::new("callgrind_annotate").arg("--inclusive=yes").arg(out))
        .ok_or("callgrind_annotate did not run")?;
    Ok(annotated(&text).into_iter().map(|(ir, f)| (f, ir)).collect())
}

/// The stages' instructions per record of a healthy pass over `records` records, [`REST`]
/// last: `None` for a stage whose functions are not all in the profile (inlined).
fn stages(by_name: &HashMap<String, u64>, records: usize) -> Vec<(&'static str, Option<f64>)> {
    let ir = |names: &[&str]| -> Option<i64> {
        names.iter().try_fold(0i64, |sum, n| {
            let (sign, name) = n.strip_prefix('-').map_or((1, *n), |m| (-1, m));
            by_name.get(name).map(|ir| sum + sign * *ir as i64)
        })
    };
    let per_record = |ir: Option<i64>| ir.map(|ir| ir.max(0) as f64 / records as f64);
    let mut out: Vec<(&'static str, Option<f64>)> = Vec::new();
    let mut named = Some(0i64);
    for (what, names) in STAGES {
        let stage = ir(names);
        named = named.zip(stage).map(|(a, b)| a + b);
        out.push((what, per_record(stage)));
    }
    let rest = ir(&[PASS]).zip(named).map(|(pass, named)| pass - named);
    out.push((REST, per_record(rest)));
    out
}

/// 1234567 as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `--once event|process|raw|typed|visitors|derived FILE`: one pass over the event file in this process, for
/// `valgrind`. `event`: the 10%-failing pipeline without AWS calls
/// ([`pipeline::Bench::process_event`]); `process`: the whole processor
/// ([`pipeline::Bench::handle_event`]), which must make no AWS call; `raw` and `typed`: only
/// `lambda_runtime`'s deserialization of the event, into JSON text or the typed `SqsEvent`
/// ([`floor`]); `visitors` and `derived`: the records and envelopes decoded the two ways of
/// [`super::decode`].
pub fn once(args: &[String]) -> Result<Tally, String> {
    let [kind, file] = args else {
        return Err("usage: --once event|process|raw|typed|visitors|derived FILE".into());
    };
    let raw = std::fs::read(file).map_err(|e| format!("cannot read {file}: {e}"))?;
    let bench = pipeline::Bench::with_patience(std::time::Duration::from_secs(3_600));
    let tally = match kind.as_str() {
        "event" => bench.process_event(&raw, 1_700_000_000_000),
        "process" => bench.handle_event(&raw),
        "raw" => floor::<Box<serde_json::value::RawValue>>(&raw, |_| 0)?,
        "typed" => floor::<aws_lambda_events::event::sqs::SqsEvent>(&raw, |e| e.records.len())?,
        "visitors" | "derived" => {
            let text = std::str::from_utf8(&raw).map_err(|e| format!("{file}: {e}"))?;
            let decode = if kind == "visitors" {
                super::decode::visitors
            } else {
                super::decode::derived
            };
            Tally {
                records: decode(text)?,
                ..Tally::default()
            }
        }
        other => return Err(format!("unknown pass `{other}`")),
    };
    match bench.calls.total() {
        0 => Ok(tally),
        n => Err(format!("{n} AWS calls")),
    }
}

/// What `lambda_runtime` does with an event before a handler taking `T` runs: deserializes it
/// from the body's bytes through `serde_path_to_error` (its `deserializer::deserialize`). The
/// tally's records are what `count` reads of the result (0 for text, which is not read);
/// nothing else is done with it.
fn floor<T: serde::de::DeserializeOwned>(raw: &[u8], count: impl Fn(&T) -> usize) -> Result<Tally, String> {
    let event: T = serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(raw))
        .map_err(|e| format!("not an event: {e}"))?;
    let event = std::hint::black_box(event);
    Ok(Tally {
        records: count(&event),
        ..Tally::default()
    })
}
