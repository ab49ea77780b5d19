//! The benchmark report: five measurements of sqs-triage next to their alternatives, taken in
//! one run and printed as markdown. `benches/report.rs` runs it (`cargo bench --bench report`);
//! `tests/it/bench_smoke.rs` runs it on a tiny input.

#![allow(dead_code)]

#[path = "billed.rs"]
mod billed;
#[path = "calls.rs"]
mod calls;
#[path = "cold.rs"]
mod cold;
#[path = "cost.rs"]
pub mod cost;
#[path = "decode.rs"]
mod decode;
#[path = "fleet.rs"]
mod fleet;
#[path = "herd.rs"]
mod herd;
#[path = "pipeline.rs"]
pub mod pipeline;
#[path = "shipped.rs"]
pub mod shipped;
#[path = "storm.rs"]
mod storm;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What to run, and how big.
#[derive(Debug, Clone)]
pub struct Options {
    /// Records in the per-record cost event (item 1).
    pub records: usize,
    /// Messages per workload on the local stack (item 2).
    pub messages: usize,
    /// Jobs in the retry-storm workload (item 3).
    pub jobs: usize,
    /// Jobs failing at once in the herd (item 4).
    pub herd: usize,
    /// Fleet sizes, in environments (item 6).
    pub fleet: Vec<usize>,
    /// Small repetition counts, tiny inputs, the plot under `.local/bench/`.
    pub quick: bool,
    /// The crate root.
    pub manifest_dir: PathBuf,
    /// The `triage-lambda` executable to cold-start (item 5).
    pub lambda_bin: PathBuf,
    /// Write `docs/benchmarks.md` (and the plot to `docs/img/`).
    pub write_docs: bool,
    /// Sections to leave out (`cost`, `calls`, `storm`, `herd`, `cold`, `fleet`, `billed`,
    /// `shipped`).
    pub skip: Vec<String>,
    /// The command line, for the report.
    pub command: String,
    /// This bench binary, which runs one pass with `--once` (instructions per record under
    /// valgrind); `None` where the report runs inside another binary (the tests).
    pub once_exe: Option<PathBuf>,
}

impl Options {
    /// The full run's sizes.
    pub fn full(manifest_dir: &Path, lambda_bin: &Path) -> Self {
        Self {
            records: 10_000,
            messages: 1_000,
            jobs: 1_000,
            herd: 1_000,
            fleet: vec![10, 100, 1_000],
            quick: false,
            manifest_dir: manifest_dir.to_owned(),
            lambda_bin: lambda_bin.to_owned(),
            write_docs: false,
            skip: Vec::new(),
            command: "cargo bench --bench report".into(),
            once_exe: None,
        }
    }

    /// Reads `--quick`, `--records N`, `--messages N`, `--jobs N`, `--herd N`, `--fleet a,b`,
    /// `--skip a,b`,
    /// `--write-docs`; ignores `--bench` (cargo passes it).
    pub fn parse(mut self, args: &[String]) -> Result<Self, String> {
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--bench" => {}
                "--quick" => {
                    self.quick = true;
                    self.records = 100;
                    self.messages = 50;
                    self.jobs = 100;
                    self.herd = 100;
                    self.fleet = vec![3];
                }
                "--records" => self.records = positive(it.next(), a)?,
                "--messages" => self.messages = positive(it.next(), a)?,
                "--jobs" => self.jobs = positive(it.next(), a)?,
                "--herd" => self.herd = positive(it.next(), a)?,
                "--fleet" => {
                    let v = it.next().ok_or("--fleet needs a list of sizes")?;
                    self.fleet = v
                        .split(',')
                        .map(|x| x.parse().ok().filter(|n| *n > 0))
                        .collect::<Option<Vec<usize>>>()
                        .ok_or("--fleet needs positive numbers, comma-separated")?;
                }
                "--skip" => {
                    let v = it.next().ok_or("--skip needs a list")?;
                    self.skip.extend(v.split(',').map(str::to_owned));
                }
                "--write-docs" => self.write_docs = true,
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        Ok(self)
    }

    fn work_dir(&self) -> PathBuf {
        self.manifest_dir.join(".local/bench")
    }

    fn rust_reps(&self) -> usize {
        if self.quick { 2 } else { 30 }
    }

    fn python_reps(&self) -> usize {
        if self.quick { 1 } else { 7 }
    }

    fn venv(&self) -> PathBuf {
        std::env::var_os("TRIAGE_VENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.manifest_dir.join(".local/venv"))
    }

    fn python(&self) -> PathBuf {
        self.venv().join("bin/python")
    }

    fn python_version(&self) -> String {
        output(
            Command::new(self.python())
                .arg("-c")
                .arg("import platform; print(platform.python_version())"),
        )
        .unwrap_or_else(|| "?".into())
    }

    fn powertools_version(&self) -> String {
        output(
            Command::new(self.python())
                .arg("-c")
                .arg("from importlib.metadata import version; print(version('aws-lambda-powertools'))"),
        )
        .unwrap_or_else(|| "?".into())
    }

    fn svg_path(&self) -> PathBuf {
        if self.write_docs {
            self.manifest_dir.join("docs/img/herd.svg")
        } else {
            self.work_dir().join("herd.svg")
        }
    }
}

/// The value of the command-line option `name`: a positive number (both benches' options).
pub fn positive(v: Option<&String>, name: &str) -> Result<usize, String> {
    v.and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{name} needs a positive number"))
}

/// The command that ran the bench `bench` with the arguments `given` (less cargo's `--bench`),
/// for the report: a profile changed from the environment (`CARGO_PROFILE_*`) changes the
/// binaries measured, so it says so.
pub fn bench_command(bench: &str, given: &[String]) -> String {
    let shown: Vec<&str> = given
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--bench")
        .collect();
    let mut profile: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("CARGO_PROFILE_"))
        .map(|(k, v)| format!("{k}={v} "))
        .collect();
    profile.sort();
    let profile = profile.concat();
    if shown.is_empty() {
        format!("{profile}cargo bench --bench {bench}")
    } else {
        format!("{profile}cargo bench --bench {bench} -- {}", shown.join(" "))
    }
}

/// The first line of a command's stdout, if it ran.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned()).filter(|s| !s.is_empty())
}

/// The median of some samples (sorted in place).
pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// One section of the report.
#[derive(Debug, Clone, Default)]
pub struct Section {
    /// Its heading.
    pub title: String,
    /// Its markdown, line by line.
    pub lines: Vec<String>,
    /// What could not be measured.
    pub failures: Vec<String>,
    /// Key numbers, for the summary and the tests.
    pub values: BTreeMap<String, f64>,
    /// Its name for `--skip` (`cost`, `calls`, ...), set by [`run`].
    pub key: String,
    /// The command and machine of the run it comes from, when that is not the page's run:
    /// `--write-docs` keeps a section this run skipped as the page had it.
    pub from: Option<(String, String)>,
}

impl Section {
    fn new(title: &str) -> Self {
        Self {
            title: title.into(),
            ..Self::default()
        }
    }

    fn line(&mut self, s: String) {
        self.lines.push(s);
    }

    fn header(&mut self, cols: &[&str]) {
        self.lines.push(format!("| {} |", cols.join(" | ")));
        self.lines
            .push(format!("|{}", cols.iter().map(|_| " --- |").collect::<String>()));
    }

    fn row(&mut self, cols: &[String]) {
        self.lines.push(format!("| {} |", cols.join(" | ")));
    }

    fn fail(&mut self, why: String) {
        self.failures.push(why);
    }

    fn value(&mut self, k: &str, v: f64) {
        self.values.insert(k.into(), v);
    }

    fn markdown(&self) -> String {
        let mut out = format!("### {}\n\n", self.title);
        if let Some((command, machine)) = &self.from {
            let _ = write!(out, "{FROM_NOTE}`{command}`; machine: {machine}.*\n\n");
        }
        let _ = writeln!(out, "{}", self.lines.join("\n"));
        for f in &self.failures {
            let _ = writeln!(out, "\n*Not measured in this run: {f}*");
        }
        out
    }
}

/// The whole report.
#[derive(Debug, Clone)]
pub struct Report {
    /// The machine it ran on, one markdown line.
    pub machine: String,
    /// The sections, in order.
    pub sections: Vec<Section>,
}

/// The opening of the note on a section from another run than the page's.
const FROM_NOTE: &str = "*This section is from another run than the rest of the page: ";
/// The marks around each section in `docs/benchmarks.md`: the first carries the section's key
/// and, as JSON, the command and machine of its run and its values.
const SECTION_START: &str = "<!-- section ";
const SECTION_END: &str = "<!-- end of section ";

impl Report {
    /// The page's sections between their marks, for a later run to keep (see
    /// [`Report::keep_skipped`]).
    fn marked(&self, command: &str) -> String {
        let mut out = String::new();
        for s in &self.sections {
            let (c, m) = s
                .from
                .clone()
                .unwrap_or_else(|| (command.to_owned(), self.machine.clone()));
            let meta = serde_json::json!({ "command": c, "machine": m, "values": s.values });
            let _ = writeln!(
                out,
                "{SECTION_START}{} {meta} -->\n{}{SECTION_END}{} -->\n",
                s.key,
                s.markdown(),
                s.key
            );
        }
        out
    }

    /// Adds, in their order, the sections of the page `old` that `opts` skipped, as `old` has
    /// them: a run of one section regenerates the page without losing the others.
    pub fn keep_skipped(&mut self, opts: &Options, old: &str) {
        let mut kept: Vec<Section> = Vec::new();
        let mut rest = old;
        while let Some(at) = rest.find(SECTION_START) {
            rest = &rest[at + SECTION_START.len()..];
            let Some(section) = parse_block(rest) else {
                continue;
            };
            if opts.skip.contains(&section.key) && self.sections.iter().all(|s| s.key != section.key) {
                kept.push(section);
            }
        }
        for k in kept {
            let at = SECTIONS
                .iter()
                .position(|n| *n == k.key)
                .map_or(self.sections.len(), |i| {
                    self.sections
                        .iter()
                        .position(|s| SECTIONS.iter().position(|n| *n == s.key).is_none_or(|j| j > i))
                        .unwrap_or(self.sections.len())
                });
            self.sections.insert(at, k);
        }
    }

    /// The tables, as markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for s in &self.sections {
            let _ = writeln!(out, "{}", s.markdown());
        }
        out
    }

    /// The key numbers in one table: the summary `docs/benchmarks.md` opens with, which
    /// `docs/performance.md` and the README quote.
    pub fn summary(&self, opts: &Options) -> String {
        let v: BTreeMap<&str, f64> = self
            .sections
            .iter()
            .flat_map(|s| s.values.iter().map(|(k, v)| (k.as_str(), *v)))
            .collect();
        let f = |k: &str, digits: usize| v.get(k).map_or("n/a".into(), |x| format!("{x:.digits$}"));
        let secs = |k: &str| v.get(k).map_or("n/a".into(), |x| storm::human(*x));
        let mut out =
            String::from("| measurement | sqs-triage | alternatives, same run |\n| --- | --- | --- |\n");
        let mut row = |a: String, b: String, c: String| {
            let _ = writeln!(out, "| {a} | {b} | {c} |");
        };
        let ratio = |a: &str, b: &str, digits: usize| match (v.get(a), v.get(b)) {
            (Some(p), Some(r)) => format!("{:.digits$}×", p / r),
            _ => "n/a".into(),
        };
        row(
            format!(
                "Per-record CPU time, {}-record SQS event, 10% failing (healthy: all succeed, whole `Processor::process`)",
                opts.records
            ),
            format!(
                "**{} µs/record** (healthy {} µs)",
                f("cost.rust_us", 2),
                f("cost.healthy_process_us", 2)
            ),
            format!(
                "Powertools `BatchProcessor` (Python): {} µs/record (healthy {} µs), **{}** the CPU time ({})",
                f("cost.python_us", 2),
                f("cost.python_healthy_us", 2),
                ratio("cost.python_us", "cost.rust_us", 1),
                ratio("cost.python_healthy_us", "cost.healthy_process_us", 1),
            ),
        );
        row(
            "Instructions per record (callgrind), same events".into(),
            format!("**{}** (healthy {})", f("ir.rust", 0), f("ir.rust_healthy", 0)),
            format!(
                "Powertools: {} (healthy {}), **{}** as many ({})",
                f("ir.python", 0),
                f("ir.python_healthy", 0),
                ratio("ir.python", "ir.rust", 1),
                ratio("ir.python_healthy", "ir.rust_healthy", 1),
            ),
        );
        for (tag, name) in [
            ("ok", "all succeed"),
            ("transient", "10% transient"),
            ("fatal", "10% fatal"),
            ("outage", "dependency outage, breaker opens"),
            ("marker", "all succeed, completion marker on"),
        ] {
            row(
                format!("AWS calls per 1,000 messages: {name}"),
                format!("**{}**", f(&format!("calls.{tag}"), 0)),
                format!(
                    "lower bound {} per invocation, {} global; naive per-message state {}",
                    f(&format!("calls.{tag}.lower_inv"), 0),
                    f(&format!("calls.{tag}.lower"), 0),
                    f(&format!("calls.{tag}.naive"), 0)
                ),
            );
        }
        row(
            format!(
                "Retry storm, {} jobs, 10% payload bugs: bug → DLQ (median), executions",
                opts.jobs
            ),
            format!(
                "**{}**, {} executions",
                secs("storm.triage.bug_to_dlq_s"),
                f("storm.triage.executions", 0)
            ),
            format!(
                "uniform retry, same backoff: {}, {}; the seed's 4 attempts: {}, {}; Sidekiq 8: {}, {}",
                secs("storm.uniform5.bug_to_dlq_s"),
                f("storm.uniform5.executions", 0),
                secs("storm.uniform4.bug_to_dlq_s"),
                f("storm.uniform4.executions", 0),
                secs("storm.sidekiq8.bug_to_dlq_s"),
                f("storm.sidekiq8.executions", 0),
            ),
        );
        row(
            format!(
                "Herd, {} jobs failing at once: peak first retries in 100 ms (uniform limit)",
                opts.herd
            ),
            format!(
                "**{}** ({}), default 0–1 s jitter",
                f("herd.default.peak", 0),
                f("herd.default.limit", 0)
            ),
            format!(
                "no jitter {}; full jitter {} ({}); decorrelated {} ({}); Sidekiq 8 {} ({}), \
                 at its 3rd retry {} ({}) where the older formula keeps {}",
                f("herd.none.peak", 0),
                f("herd.full.peak", 0),
                f("herd.full.limit", 0),
                f("herd.decorrelated.peak", 0),
                f("herd.decorrelated.limit", 0),
                f("herd.sidekiq8.peak", 0),
                f("herd.sidekiq8.limit", 0),
                f("herd.sidekiq8.retry3.peak", 0),
                f("herd.sidekiq8.retry3.limit", 1),
                f("herd.sidekiq.retry3.peak", 0),
            ),
        );
        row(
            "Cold start: process start → first event handled; binary size".into(),
            format!(
                "**{} ms** ({}× the floor that makes the same one breaker read; {}× the floor that makes no call, {} ms: bare `lambda_runtime` + the two SDK clients, same trust store), {} MiB ({}× the floor's)",
                f("cold.handled_ms", 0),
                f("cold.read_floor_ratio", 2),
                f("cold.floor_ratio", 2),
                f("cold.floor_ms", 0),
                f("cold.binary_mib", 1),
                f("cold.size_ratio", 2)
            ),
            format!(
                "Python interpreter + Powertools batch import: {} ms (before any event)",
                f("cold.python_import_ms", 0)
            ),
        );
        if v.contains_key("billed.healthy.added_p50_ms") {
            row(
                "Added billed duration, 10-record batch, 10 ms handler, 5 ms on every AWS call: p50 (p99) minus the bare function's".into(),
                format!(
                    "healthy **{} ms** ({} ms); 1 transient + 1 fatal + 1 redelivery **{} ms** ({} ms)",
                    f("billed.healthy.added_p50_ms", 2),
                    f("billed.healthy.added_p99_ms", 2),
                    f("billed.failures.added_p50_ms", 2),
                    f("billed.failures.added_p99_ms", 2),
                ),
                format!(
                    "bare `lambda_runtime`: {} ms healthy, {} ms with failures (p50); Powertools `BatchProcessor`, records in turn: {} ms, {} ms",
                    f("billed.healthy.bare.p50_ms", 2),
                    f("billed.failures.bare.p50_ms", 2),
                    f("billed.healthy.powertools.p50_ms", 1),
                    f("billed.failures.powertools.p50_ms", 1),
                ),
            );
        }
        row(
            format!(
                "The shipped `triage-lambda`, healthy {}-record event through a local Runtime API: wall, CPU and instructions per record; per {}-record invocation",
                opts.records,
                shipped::BATCH
            ),
            format!(
                "**{} µs** wall, {} µs CPU, {} instructions; {} µs CPU, {} instructions",
                f("shipped.wall_us", 2),
                f("shipped.cpu_us", 2),
                f("shipped.ir", 0),
                f("shipped.batch_cpu_us", 0),
                f("shipped.batch_ir", 0)
            ),
            format!(
                "Powertools `BatchProcessor` under awslambdaric: {}×, {}×, {}×; {}×, {}× (Powertools ÷ sqs-triage)",
                f("shipped.wall_us.ratio", 1),
                f("shipped.cpu_us.ratio", 1),
                f("shipped.ir.ratio", 1),
                f("shipped.batch_cpu_us.ratio", 1),
                f("shipped.batch_ir.ratio", 1)
            ),
        );
        if let Some(n) = v.get("fleet.max_n") {
            row(
                format!(
                    "Fleet of {n:.0} environments, dependency outage: writes to the breaker item, peak per second"
                ),
                format!("**{}**", f("fleet.max_n.breaker_writes_peak", 0)),
                "DynamoDB's limit for one partition: 1000 write units per second".into(),
            );
        }
        out
    }

    /// Everything that could not be measured.
    pub fn failures(&self) -> Vec<String> {
        self.sections
            .iter()
            .flat_map(|s| s.failures.iter().map(move |f| format!("{}: {f}", s.title)))
            .collect()
    }
}

/// One section from its block in the page, `text` starting after [`SECTION_START`]: its key,
/// its run's command, machine and values from the first mark, its title and lines between the
/// marks (a note of an earlier keep dropped: it is written again).
fn parse_block(text: &str) -> Option<Section> {
    let (head, body) = text.split_once(" -->\n")?;
    let (key, meta) = head.split_once(' ')?;
    let meta: serde_json::Value = serde_json::from_str(meta).ok()?;
    let end = body.find(&format!("{SECTION_END}{key} -->"))?;
    let body = body[..end].trim_end();
    let (title, lines) = body.strip_prefix("### ")?.split_once('\n')?;
    let lines = lines.trim_start_matches('\n');
    let lines = match lines.strip_prefix(FROM_NOTE) {
        Some(r) => r.split_once("\n\n").map_or("", |(_, r)| r),
        None => lines,
    };
    let values = meta["values"]
        .as_object()?
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
        .collect();
    Some(Section {
        title: title.to_owned(),
        lines: lines.lines().map(str::to_owned).collect(),
        failures: Vec::new(),
        values,
        key: key.to_owned(),
        from: Some((
            meta["command"].as_str()?.to_owned(),
            meta["machine"].as_str()?.to_owned(),
        )),
    })
}

/// The sections' keys, in the page's order.
const SECTIONS: [&str; 8] = [
    "cost", "calls", "storm", "herd", "cold", "fleet", "billed", "shipped",
];

/// nproc, CPU model, memory, load, toolchain.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
        .map_or("?".into(), |kib| format!("{:.1} GiB", kib / 1024.0 / 1024.0));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    let rustc = output(Command::new("rustc").arg("-V")).unwrap_or_else(|| "rustc ?".into());
    format!(
        "{cpus} CPUs ({model}), {mem_gib} RAM, {} {}, load average {load} at the start, {rustc}",
        std::env::consts::OS,
        std::env::consts::ARCH,
    )
}

/// Runs every section not skipped. Progress goes to stderr.
pub fn run(opts: &Options) -> Report {
    let machine = machine();
    let on = |name: &str| !opts.skip.iter().any(|s| s == name);
    let mut sections = Vec::new();
    let step = |name: &str| eprintln!("report: {name}…");
    let keyed = |key: &str, mut s: Section| {
        s.key = key.to_owned();
        s
    };
    if on("cost") {
        step("per-record cost");
        sections.push(keyed("cost", cost::run(opts)));
    }
    if on("calls") {
        step("AWS calls on the local stack");
        sections.push(keyed("calls", calls::run(opts)));
    }
    if on("storm") {
        step("retry storm");
        sections.push(keyed("storm", storm::run(opts)));
    }
    if on("herd") {
        step("herd");
        sections.push(keyed("herd", herd::run(opts)));
    }
    if on("cold") {
        step("cold start");
        sections.push(keyed("cold", cold::run(opts)));
    }
    if on("fleet") {
        step("fleet");
        sections.push(keyed("fleet", fleet::run(opts)));
    }
    if on("billed") {
        step("added billed duration");
        sections.push(keyed("billed", billed::run(opts)));
    }
    if on("shipped") {
        step("the shipped binary, end to end");
        sections.push(keyed("shipped", shipped::run(opts)));
    }
    Report { machine, sections }
}

/// The whole `docs/benchmarks.md`.
pub fn document(opts: &Options, report: &Report) -> String {
    let mut out = String::new();
    // The page opens with what a reader can stop after: the summary table, then how it ran.
    let _ = writeln!(
        out,
        "# Benchmarks\n\n\
         Each row of the summary below compares sqs-triage with an alternative. Every ratio \
         compares two things measured in the same run on the same machine. The results then \
         give each measurement in full, and the last section says what each number assumes. \
         What the numbers show, in prose: [performance.md](performance.md). Generated by the \
         bench binary `benches/report.rs`; do not edit by hand.\n"
    );
    let _ = writeln!(out, "## Summary\n\n{}", report.summary(opts));
    let _ = writeln!(
        out,
        "## Command and machine\n\n\
         Command (from the crate root, local stack running):\n\n\
         ```sh\n\
         bash infra/local/stack.sh start && eval \"$(bash infra/local/stack.sh env)\"\n\
         {}\n\
         ```\n\n\
         Machine: {}.\n",
        opts.command, report.machine
    );
    let _ = writeln!(out, "## Results\n");
    out.push_str(&report.marked(&opts.command));
    let _ = writeln!(out, "{}", METHOD);
    out
}

/// What each number means and assumes.
const METHOD: &str = include_str!("method.md");

/// Where `cargo bench --bench layer -- --write-docs` writes its section in
/// `docs/benchmarks.md`; the report's own `--write-docs` keeps what is between the marks.
const LAYER_START: &str =
    "<!-- The layer's section: `cargo bench --bench layer -- --write-docs` writes it. -->";
const LAYER_END: &str = "<!-- The end of the layer's section. -->";
/// The heading the layer's section goes before.
const METHOD_HEADING: &str = "## What each number means and assumes";

/// The layer's section of `doc`, marks included, if it has one.
pub fn layer_block(doc: &str) -> Option<&str> {
    let a = doc.find(LAYER_START)?;
    let b = a + doc[a..].find(LAYER_END)? + LAYER_END.len();
    Some(&doc[a..b])
}

/// `doc` with `block` (marks included) as its layer section: in place of the one it has,
/// else before the method's heading, else at the end.
fn put_layer_block(doc: &str, block: &str) -> String {
    if let Some(old) = layer_block(doc) {
        return doc.replacen(old, block, 1);
    }
    match doc.find(METHOD_HEADING) {
        Some(at) => format!("{}{block}\n\n{}", &doc[..at], &doc[at..]),
        None => format!("{}\n{block}\n", doc.trim_end()),
    }
}

/// `doc` with the layer bench's markdown `section` in it.
pub fn with_layer_section(doc: &str, section: &str) -> String {
    put_layer_block(
        doc,
        &format!("{LAYER_START}\n\n{}\n\n{LAYER_END}", section.trim_end()),
    )
}

/// The report's new document `new`, keeping the layer section the old one `old` had.
pub fn keep_layer_section(old: &str, new: String) -> String {
    match layer_block(old) {
        Some(block) => put_layer_block(&new, block),
        None => new,
    }
}

/// Rewrites `docs/benchmarks.md` under `root` as `page` makes it from the page there (empty
/// where there is none): how each bench's `--write-docs` writes; the page's path.
pub fn rewrite_page(root: &Path, page: impl FnOnce(&str) -> String) -> Result<PathBuf, String> {
    let path = root.join("docs/benchmarks.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, page(&old)).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

// Runs where this file is part of a test binary (tests/it/bench_smoke.rs includes it), not in
// the benches, which have no test harness.
#[cfg(test)]
mod tests {
    /// As `cargo bench --bench layer -- --write-docs` writes: its section goes before the
    /// method's heading, a later run's replaces it in place, and the report's page keeps it.
    #[test]
    fn the_layer_bench_writes_its_section_before_the_method_and_then_in_place() {
        let (start, end, method) = (super::LAYER_START, super::LAYER_END, super::METHOD_HEADING);
        let root = std::env::temp_dir().join(format!("bench-page-{}", std::process::id()));
        std::fs::create_dir_all(root.join("docs")).unwrap();
        let page = format!("# Benchmarks\n\n## Results\n\n{method}\n\nThe assumptions.\n");
        std::fs::write(root.join("docs/benchmarks.md"), &page).unwrap();
        let write = |md: &str| super::rewrite_page(&root, |doc| super::with_layer_section(doc, md)).unwrap();
        let path = write("## 7. The layer\n\n| first |\n");
        let first = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            first,
            format!(
                "# Benchmarks\n\n## Results\n\n{start}\n\n## 7. The layer\n\n| first |\n\n\
                 {end}\n\n{method}\n\nThe assumptions.\n"
            )
        );
        write("## 7. The layer\n\n| second |\n");
        let second = std::fs::read_to_string(&path).unwrap();
        assert_eq!(second, first.replace("| first |", "| second |"));
        let kept = super::keep_layer_section(&second, page);
        assert_eq!(super::layer_block(&kept), super::layer_block(&second));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_bench_s_command_shows_its_arguments_but_cargo_s() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let quick = super::bench_command("layer", &args(&["--bench", "--quick"]));
        assert!(quick.ends_with("cargo bench --bench layer -- --quick"), "{quick}");
        let plain = super::bench_command("report", &args(&["--bench"]));
        assert!(plain.ends_with("cargo bench --bench report"), "{plain}");
    }
}
