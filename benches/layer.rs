//! The Lambda layer's cost: a 10-record SQS batch through the layer (the extension, awslambdaric
//! and a Python handler) against the same handler run bare and under Powertools'
//! `BatchProcessor`, in one run; the layer once one record at a time and once with awslambdaric's
//! worker pool (records side by side); the cold start with and without the layer; the zips' sizes.
//!
//! ```sh
//! bash infra/layer/build.sh                 # the zips measured (release, as shipped)
//! cargo bench --bench layer                 # print the tables
//! cargo bench --bench layer -- --write-docs # also write them into docs/benchmarks.md
//! cargo bench --bench layer -- --quick      # a few invocations, the debug extension
//! ```
//!
//! Every environment talks to the project's local Runtime API (`tests/support/runtime_api.rs`)
//! and the local stack, as `tests/it/layer.rs` does.

#[path = "report/mod.rs"]
mod report;
#[path = "../tests/support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::runtime_api::{Outcome, RuntimeApi};
use triage::ops::setup::SetupReport;

const JOB_TYPE: &str = "bench.layer";
const RECORDS: usize = 10;
/// `TRIAGE_LAYER_WORKERS` of the pooled layer: one worker per record of the batch.
const WORKERS: usize = 10;

struct Opts {
    invocations: usize,
    cold_runs: usize,
    quick: bool,
    write_docs: bool,
    /// The extension measured: the x86_64 zip's, or this package's debug build with `--quick`.
    extension: PathBuf,
    root: PathBuf,
}

/// Kills the processes it holds when dropped (only the ones this bench started).
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How the function runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// awslambdaric and the handler looping over its records.
    Bare,
    /// awslambdaric and the same record work in Powertools' `BatchProcessor`.
    Powertools,
    /// The layer's extension and wrapper, then awslambdaric and the bare handler.
    Layer,
    /// The layer with `TRIAGE_LAYER_WORKERS`: awslambdaric's worker pool, records side by side.
    Pool,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Bare => "bare: awslambdaric, the handler loops and returns `batchItemFailures`",
            Kind::Powertools => "Powertools 3 `BatchProcessor` in that handler",
            Kind::Layer => "the layer: extension + wrapper + awslambdaric, one invocation per record",
            Kind::Pool => {
                "the layer, `TRIAGE_LAYER_WORKERS=10`: awslambdaric's worker pool, records side by side"
            }
        }
    }

    fn layered(self) -> bool {
        matches!(self, Kind::Layer | Kind::Pool)
    }

    /// The runtime's workers (`TRIAGE_LAYER_WORKERS`, read by the extension and the wrapper).
    fn workers(self) -> usize {
        if self == Kind::Pool { WORKERS } else { 1 }
    }
}

/// One execution environment.
struct Env {
    api: RuntimeApi,
    _procs: Procs,
    dir: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn python(root: &Path) -> PathBuf {
    std::env::var_os("TRIAGE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".local/venv"))
        .join("bin/python")
}

/// Starts an environment: the extension first (waiting for it to register, as Lambda does), then
/// the runtime. Returns once started, not once ready.
async fn spawn(opts: &Opts, created: &SetupReport, kind: Kind, sleep_ms: u32) -> Result<Env, String> {
    let api = RuntimeApi::start().await;
    let dir = std::env::temp_dir().join(support::unique_name("layer-bench"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let port = free_port().map_err(|e| e.to_string())?.to_string();
    let pid_file = dir.join("runtime.pid");
    let file = |name: &str| std::fs::File::create(dir.join(name)).map_err(|e| e.to_string());
    let workers = kind.workers().to_string();
    let mut procs = Procs(Vec::new());
    if kind.layered() {
        let ext = Command::new(&opts.extension)
            .env("AWS_LAMBDA_RUNTIME_API", api.address())
            .env("AWS_LAMBDA_FUNCTION_NAME", "triage-bench")
            .env("TRIAGE_QUEUE_URL", &created.queue_url)
            .env("TRIAGE_DLQ_URL", &created.dlq_url)
            .env("TRIAGE_TABLE", &created.table)
            .env("TRIAGE_JOB_TYPES", JOB_TYPE)
            .env("TRIAGE_LAYER_PORT", &port)
            .env("TRIAGE_LAYER_PID_FILE", &pid_file)
            .env("TRIAGE_LAYER_WORKERS", &workers)
            // The default, said here: with the pool every record of the batch can run at once.
            .env("TRIAGE_CONCURRENCY", RECORDS.to_string())
            .stdin(Stdio::null())
            .stdout(file("extension.out")?)
            .stderr(file("extension.log")?)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", opts.extension.display()))?;
        procs.0.push(ext);
        let registered = async {
            while api.extensions().is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), registered)
            .await
            .map_err(|_| "the extension did not register within 30 s".to_owned())?;
    }
    let module = match kind {
        Kind::Powertools => "layer_powertools.handler",
        _ => "layer_handler.handler",
    };
    let mut rt = if kind.layered() {
        let mut c = Command::new("bash");
        c.arg(opts.root.join("infra/layer/sqs-triage-wrapper"))
            .arg(python(&opts.root));
        c
    } else {
        Command::new(python(&opts.root))
    };
    rt.args(["-m", "awslambdaric", module])
        .current_dir(opts.root.join("bench"))
        .env("PYTHONPATH", opts.root.join("bench"))
        .env("AWS_LAMBDA_RUNTIME_API", api.address())
        .env("TRIAGE_LAYER_PORT", &port)
        .env("TRIAGE_LAYER_PID_FILE", &pid_file)
        .env("TRIAGE_LAYER_WORKERS", &workers)
        // Only the wrapper sets it, from TRIAGE_LAYER_WORKERS: one from the caller's shell
        // would give the bare functions a pool too.
        .env_remove("AWS_LAMBDA_MAX_CONCURRENCY")
        .env("BENCH_SLEEP_MS", sleep_ms.to_string())
        .stdin(Stdio::null())
        .stdout(file("runtime.out")?)
        .stderr(file("runtime.log")?);
    let runtime = rt.spawn().map_err(|e| format!("cannot start the runtime: {e}"))?;
    procs.0.push(runtime);
    Ok(Env {
        api,
        _procs: procs,
        dir,
    })
}

impl Env {
    fn output(&self) -> String {
        ["extension.log", "runtime.log"]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
                let tail: String = text
                    .chars()
                    .rev()
                    .take(2_000)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                format!("--- {f}\n{tail}")
            })
            .collect()
    }

    /// One invocation, checked: every record succeeded.
    async fn invoke(&self, event: &str) -> Result<(), String> {
        let out = self
            .api
            .invoke(
                event.to_owned(),
                Duration::from_secs(60),
                Duration::from_secs(60),
                Duration::ZERO,
            )
            .await;
        check(out).map_err(|e| format!("{e}\n{}", self.output()))
    }
}

fn check(out: Outcome) -> Result<(), String> {
    let body = match out {
        Outcome::Response(body) => body,
        other => return Err(format!("no batch response: {other:?}")),
    };
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    match v["batchItemFailures"].as_array() {
        Some(f) if f.is_empty() => Ok(()),
        _ => Err(format!("a record failed: {body}")),
    }
}

/// The layer reports a record that failed fatally as settled (its copy went to the DLQ), so an
/// empty `batchItemFailures` alone does not prove every record succeeded: the DLQ must be empty.
async fn none_dead_lettered(created: &SetupReport) -> Result<(), String> {
    let sqs = support::sqs_client().await;
    let depth = support::queue_depth(&sqs, &created.dlq_url).await;
    if depth.total() > 0 {
        return Err(format!(
            "{} records were dead-lettered: a record failed fatally ({depth:?})",
            depth.total()
        ));
    }
    Ok(())
}

/// A real batch of `RECORDS` jobs, received from the local stack, as Lambda's event.
async fn batch(created: &SetupReport) -> Result<String, String> {
    let sqs = support::sqs_client().await;
    for i in 0..RECORDS {
        let body = json!({"type": JOB_TYPE, "id": format!("job-{i}"), "payload": {"n": i}});
        sqs.send_message()
            .queue_url(&created.queue_url)
            .message_body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("send: {e}"))?;
    }
    let mut got = Vec::new();
    for _ in 0..20 {
        if got.len() >= RECORDS {
            break;
        }
        got.extend(support::read_all(&sqs, &created.queue_url, 3_600, 1).await);
    }
    if got.len() != RECORDS {
        return Err(format!("received {} of {RECORDS} messages", got.len()));
    }
    Ok(support::lambda_event::lambda_event_json(&got, &created.queue_url).to_string())
}

/// The nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

/// The functions of the warm table, in the order they take their turns.
const KINDS: [Kind; 4] = [Kind::Bare, Kind::Powertools, Kind::Layer, Kind::Pool];

/// Per-invocation time of each kind, for one per-record sleep: the environments start
/// together and take their invocations in turn, so each sees the same machine.
async fn warm(
    opts: &Opts,
    created: &SetupReport,
    event: &str,
    sleep_ms: u32,
) -> Result<Vec<Vec<f64>>, String> {
    let kinds = KINDS;
    let mut envs = Vec::new();
    for k in kinds {
        let env = spawn(opts, created, k, sleep_ms).await?;
        if !env.api.ready(Duration::from_secs(60)).await {
            return Err(format!("{} did not start\n{}", k.name(), env.output()));
        }
        envs.push(env);
    }
    let warmup = if opts.quick { 1 } else { 10 };
    let mut samples = vec![Vec::with_capacity(opts.invocations); kinds.len()];
    for i in 0..warmup + opts.invocations {
        for (env, s) in envs.iter().zip(samples.iter_mut()) {
            let t = Instant::now();
            env.invoke(event).await?;
            if i >= warmup {
                s.push(ms(t.elapsed()));
            }
        }
    }
    for s in &mut samples {
        s.sort_by(f64::total_cmp);
    }
    Ok(samples)
}

/// Process start → first response accepted, with and without the layer, alternating.
async fn cold(opts: &Opts, created: &SetupReport, event: &str) -> Result<[Vec<f64>; 2], String> {
    let mut out = [Vec::new(), Vec::new()];
    // One untimed pair first: the files both read (Python's, the handler's) are then in the
    // page cache for every timed run, as for the first timed one.
    for run in 0..=opts.cold_runs {
        for (i, kind) in [Kind::Bare, Kind::Layer].into_iter().enumerate() {
            let t = Instant::now();
            let env = spawn(opts, created, kind, 0).await?;
            env.invoke(event).await?;
            if run > 0 {
                out[i].push(ms(t.elapsed()));
            }
        }
    }
    for s in &mut out {
        s.sort_by(f64::total_cmp);
    }
    Ok(out)
}

fn parse(root: &Path, args: &[String]) -> Result<Opts, String> {
    let mut opts = Opts {
        invocations: 200,
        cold_runs: 15,
        quick: false,
        write_docs: false,
        extension: PathBuf::new(),
        root: root.to_owned(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" => {}
            "--quick" => {
                opts.quick = true;
                opts.invocations = 5;
                opts.cold_runs = 1;
            }
            "--invocations" => opts.invocations = report::positive(it.next(), a)?,
            "--cold-runs" => opts.cold_runs = report::positive(it.next(), a)?,
            "--write-docs" => opts.write_docs = true,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if opts.write_docs && opts.quick {
        return Err("--write-docs needs the full run (no --quick)".into());
    }
    Ok(opts)
}

/// The x86_64 zip's extension, unpacked into the bench's work folder.
fn unpack_extension(root: &Path, zip: &Path) -> Result<PathBuf, String> {
    let dir = root.join(".local/bench/layer-x86_64");
    let _ = std::fs::remove_dir_all(&dir);
    let status = Command::new("python3")
        .args([
            "-c",
            "import os, sys, zipfile\n\
             z = zipfile.ZipFile(sys.argv[1])\n\
             p = z.extract('extensions/sqs-triage-extension', sys.argv[2])\n\
             os.chmod(p, 0o755)",
        ])
        .arg(zip)
        .arg(&dir)
        .status()
        .map_err(|e| format!("python3: {e}"))?;
    if !status.success() {
        return Err(format!("cannot unpack the extension from {}", zip.display()));
    }
    Ok(dir.join("extensions/sqs-triage-extension"))
}

fn zip_path(root: &Path, arch: &str) -> PathBuf {
    std::env::var_os("LAYER_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".local/layer"))
        .join(format!("sqs-triage-layer-{arch}.zip"))
}

fn row(out: &mut String, cols: &[String]) {
    let _ = writeln!(out, "| {} |", cols.join(" | "));
}

async fn run(opts: &Opts, command: &str) -> Result<String, String> {
    let machine = report::machine();
    let created = support::try_fresh_resources("layer-bench", false)
        .await
        .map_err(|e| format!("the local stack: {e}"))?;
    let event = batch(&created).await?;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 7. The layer: a Python function's batch through the extension\n\n\
         Command: `{command}`. Machine: {machine}. Extension: {}.\n",
        if opts.quick {
            "the debug build (--quick)".to_owned()
        } else {
            "the x86_64 layer zip's (`cargo lambda build --release`, the profile that ships)".to_owned()
        }
    );
    let _ = writeln!(
        md,
        "Per-invocation time of one {RECORDS}-record SQS batch, {} invocations each, taken in \
         turn across the four functions (after {} warm-up invocations each). The handler parses \
         each record's body, then sleeps as the column says. With `TRIAGE_LAYER_WORKERS={WORKERS}` \
         the wrapper sets `AWS_LAMBDA_MAX_CONCURRENCY`, awslambdaric forks that many workers, and \
         the extension hands out up to `min(TRIAGE_CONCURRENCY, workers)` = {} records at once.\n",
        opts.invocations,
        if opts.quick { 1 } else { 10 },
        RECORDS.min(WORKERS)
    );
    md.push_str("| function | per record | p50 | p99 | p50 ÷ bare | p99 ÷ bare |\n| --- | --- | --- | --- | --- | --- |\n");
    let mut per_record = Vec::new();
    for sleep in [0u32, 10] {
        eprintln!("layer bench: {RECORDS}-record batches, {sleep} ms per record…");
        let s = warm(opts, &created, &event, sleep).await?;
        none_dead_lettered(&created).await?;
        let (b50, b99) = (percentile(&s[0], 0.5), percentile(&s[0], 0.99));
        per_record.push((sleep, (percentile(&s[2], 0.5) - b50) / RECORDS as f64));
        for (k, xs) in KINDS.iter().zip(&s) {
            let (p50, p99) = (percentile(xs, 0.5), percentile(xs, 0.99));
            let bold = |x: String| if k.layered() { format!("**{x}**") } else { x };
            row(
                &mut md,
                &[
                    k.name().into(),
                    if sleep == 0 {
                        "~nothing".into()
                    } else {
                        format!("{sleep} ms sleep")
                    },
                    format!("{p50:.2} ms"),
                    format!("{p99:.2} ms"),
                    bold(format!("{:.2}×", p50 / b50)),
                    format!("{:.2}×", p99 / b99),
                ],
            );
        }
    }
    let _ = writeln!(
        md,
        "\nThe layer's cost per record, (p50 with the layer − bare p50) ÷ {RECORDS}: {}.",
        per_record
            .iter()
            .map(|(sleep, c)| format!("**{c:.2} ms** with a {sleep} ms handler"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    eprintln!("layer bench: cold starts…");
    let [bare, layer] = cold(opts, &created, &event).await?;
    let _ = writeln!(
        md,
        "\nCold start: the first process started → the first batch response accepted, one \
         {RECORDS}-record event already waiting, {} runs of each, alternating, after one untimed \
         pair. With the layer the extension starts first and the runtime once it has \
         registered, as in Lambda.\n",
        opts.cold_runs
    );
    md.push_str("| function | median | p90 | min | runs |\n| --- | --- | --- | --- | --- |\n");
    for (name, xs) in [
        ("Python, bare handler (awslambdaric)", &bare),
        ("Python, same handler, with the layer", &layer),
    ] {
        row(
            &mut md,
            &[
                name.into(),
                format!("{:.1} ms", percentile(xs, 0.5)),
                format!("{:.1} ms", percentile(xs, 0.9)),
                format!("{:.1} ms", xs[0]),
                xs.len().to_string(),
            ],
        );
    }
    row(
        &mut md,
        &[
            "with the layer ÷ bare (median)".into(),
            format!("**{:.2}×**", percentile(&layer, 0.5) / percentile(&bare, 0.5)),
            String::new(),
            String::new(),
            String::new(),
        ],
    );
    md.push_str("\n| layer zip | bytes | extension unpacked |\n| --- | --- | --- |\n");
    for arch in ["arm64", "x86_64"] {
        let zip = zip_path(&opts.root, arch);
        let Ok(meta) = std::fs::metadata(&zip) else {
            row(&mut md, &[arch.into(), "not built".into(), String::new()]);
            continue;
        };
        let unpacked = report::output(Command::new("python3").arg("-c").arg(
            "import sys, zipfile; print(zipfile.ZipFile(sys.argv[1]).getinfo('extensions/sqs-triage-extension').file_size)",
        ).arg(&zip));
        row(
            &mut md,
            &[
                format!("`{}`", zip.file_name().unwrap_or_default().to_string_lossy()),
                format!("{} ({:.1} MiB)", meta.len(), meta.len() as f64 / 1_048_576.0),
                unpacked.map_or("?".into(), |b| {
                    let b: f64 = b.parse().unwrap_or(f64::NAN);
                    format!("{:.1} MiB", b / 1_048_576.0)
                }),
            ],
        );
    }
    Ok(md)
}

fn main() -> ExitCode {
    let given: Vec<String> = std::env::args().skip(1).collect();
    // `cargo test --all-targets` runs bench binaries without `--bench`: nothing to measure then.
    if !given.iter().any(|a| a == "--bench") {
        eprintln!("layer bench: run it with `cargo bench --bench layer`");
        return ExitCode::SUCCESS;
    }
    let root = support::repo_root();
    let mut opts = match parse(root, &given) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    opts.extension = if opts.quick {
        PathBuf::from(env!("CARGO_BIN_EXE_sqs-triage-extension"))
    } else {
        let zip = zip_path(root, "x86_64");
        if !zip.exists() {
            eprintln!(
                "error: no layer zip at {} (bash infra/layer/build.sh; or --quick for the debug build)",
                zip.display()
            );
            return ExitCode::FAILURE;
        }
        match unpack_extension(root, &zip) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    // A profile changed from the environment changes this harness (not the zip's extension).
    let command = report::bench_command("layer", &given);
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let md = match rt.block_on(run(&opts, &command)) {
        Ok(md) => md,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{md}");
    if opts.write_docs {
        match report::rewrite_page(root, |doc| report::with_layer_section(doc, &md)) {
            Ok(path) => eprintln!("layer bench: wrote its section into {}", path.display()),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
