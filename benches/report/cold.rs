//! Item 5, cold start: `triage-lambda` started as a fresh process against cargo-lambda's emulated
//! Lambda runtime API (`cargo lambda watch --only-lambda-apis`), with one SQS event already
//! waiting; in the same run and the same way, alternating, two floors (`examples/bare_floor.rs`:
//! a bare `lambda_runtime` function building the same two SDK clients on the same HTTPS client
//! and trust store, without a call or with the one read a cold `triage-lambda` makes); and a
//! fresh Python interpreter importing Powertools' batch utility.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sqs_triage::clock::now_ms;
use triage::demo::chaos::CHAOS;

use super::{Options, Section, median};

/// Kills a child process when dropped (only the processes this report started).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run(opts: &Options) -> Section {
    let mut s = Section::new("5. Cold start");
    // At least 15 runs of each binary, alternating (one untimed run of each first).
    let reps = if opts.quick { 1 } else { 15 };
    s.header(&["measurement", "median", "runs"]);
    match lambda(opts, reps) {
        Ok(l) => lambda_rows(&mut s, &l, reps),
        Err(e) => {
            s.row(&[
                "`triage-lambda`: process start → first event handled".into(),
                "n/a".into(),
                "0".into(),
            ]);
            s.fail(format!("cold start not measured: {e}"));
        }
    }
    let profile = if opts.lambda_bin.components().any(|c| c.as_os_str() == "debug") {
        "debug build: smoke run only"
    } else {
        "release profile: size-tuned, LTO, 1 codegen unit, stripped"
    };
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len() as f64 / 1_048_576.0);
    match size(&opts.lambda_bin) {
        Ok(mib) => {
            s.row(&[
                format!("`triage-lambda` binary size ({profile})"),
                format!("**{mib:.1} MiB**"),
                "1".into(),
            ]);
            s.value("cold.binary_mib", mib);
            if let Ok(floor) = size(&floor_path(opts)) {
                s.row(&[
                    format!("floor binary size ({profile}; both floors are one binary)"),
                    format!("{floor:.1} MiB"),
                    "1".into(),
                ]);
                s.row(&[
                    "`triage-lambda` size / floor's (goal ≤ 1.4×)".into(),
                    format!("**{:.2}×**", mib / floor),
                    "1".into(),
                ]);
                s.value("cold.size_ratio", mib / floor);
            }
        }
        Err(e) => s.fail(format!("{}: {e}", opts.lambda_bin.display())),
    }
    match python(opts, reps) {
        Ok(p) => {
            s.row(&[
                "Python: fresh interpreter + `from aws_lambda_powertools.utilities.batch import BatchProcessor, …`".into(),
                format!("**{:.1} ms**", p.with_import_ms),
                reps.to_string(),
            ]);
            s.row(&[
                "Python: fresh interpreter alone (`python -c pass`)".into(),
                format!("{:.1} ms", p.bare_ms),
                reps.to_string(),
            ]);
            s.row(&[
                "Python: the Powertools import alone (difference of the two)".into(),
                format!("{:.1} ms", p.with_import_ms - p.bare_ms),
                reps.to_string(),
            ]);
            if let Some(ms) = p.importtime_ms {
                s.row(&[
                    "Python: `-X importtime`, cumulative for `aws_lambda_powertools.utilities.batch`".into(),
                    format!("{ms:.1} ms"),
                    "1".into(),
                ]);
            }
            s.value("cold.python_import_ms", p.with_import_ms);
        }
        Err(e) => s.fail(format!("Python import not measured: {e}")),
    }
    s
}

fn lambda_rows(s: &mut Section, l: &LambdaTimes, reps: usize) {
    let runs = reps.to_string();
    let mut row = |what: &str, value: String| s.row(&[what.into(), value, runs.clone()]);
    row(
        "`triage-lambda`: process start → first event handled (its metrics line printed)",
        format!("**{:.1} ms**", l.handled_ms),
    );
    row(
        "`triage-lambda`: process start → response accepted (`cargo lambda invoke` returned)",
        format!("{:.1} ms", l.answered_ms),
    );
    row(
        "floor (`examples/bare_floor.rs`: bare `lambda_runtime`, the same two SDK clients and HTTPS client, no call): first event handled",
        format!("{:.1} ms", l.floor_handled_ms),
    );
    row(
        "floor: response accepted",
        format!("{:.1} ms", l.floor_answered_ms),
    );
    row(
        "floor + the one read a cold `triage-lambda` makes (its breaker's, consistent `GetItem`) before its first response: first event handled",
        format!("{:.1} ms", l.read_floor_handled_ms),
    );
    row(
        "floor + that read: response accepted",
        format!("{:.1} ms", l.read_floor_answered_ms),
    );
    let ratio = l.handled_ms / l.floor_handled_ms;
    let read_ratio = l.handled_ms / l.read_floor_handled_ms;
    row(
        "`triage-lambda` / floor with the read, first event handled (goal ≤ 1.05×)",
        format!("**{read_ratio:.2}×**"),
    );
    row(
        "`triage-lambda` / floor without a call, first event handled (goal ≤ 1.35×)",
        format!("**{ratio:.2}×**"),
    );
    row(
        "`triage-lambda` / floor with the read, response accepted",
        format!("{:.2}×", l.answered_ms / l.read_floor_answered_ms),
    );
    row(
        "`triage-lambda` / floor without a call, response accepted",
        format!("{:.2}×", l.answered_ms / l.floor_answered_ms),
    );
    s.value("cold.handled_ms", l.handled_ms);
    s.value("cold.floor_ms", l.floor_handled_ms);
    s.value("cold.floor_ratio", ratio);
    s.value("cold.read_floor_ratio", read_ratio);
}

struct LambdaTimes {
    handled_ms: f64,
    answered_ms: f64,
    floor_handled_ms: f64,
    floor_answered_ms: f64,
    read_floor_handled_ms: f64,
    read_floor_answered_ms: f64,
}

/// Where `cargo build --example bare_floor` puts the floor, next to `triage-lambda`.
fn floor_path(opts: &Options) -> PathBuf {
    let dir = opts.lambda_bin.parent().unwrap_or(Path::new("."));
    dir.join("examples").join("bare_floor")
}

/// Builds the floor with the profile `triage-lambda` was built with, in the same target
/// directory (cargo releases its lock while a bench runs).
fn build_floor(opts: &Options) -> Result<PathBuf, String> {
    let dir = opts.lambda_bin.parent().ok_or("triage-lambda has no directory")?;
    let target = dir.parent().ok_or("triage-lambda is not in a target directory")?;
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["build", "--quiet", "--example", "bare_floor", "--target-dir"])
        .arg(target)
        .current_dir(&opts.manifest_dir)
        .stdout(Stdio::null());
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let st = cmd
        .status()
        .map_err(|e| format!("cargo build --example bare_floor: {e}"))?;
    if !st.success() {
        return Err("cargo build --example bare_floor failed".into());
    }
    Ok(floor_path(opts))
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

fn wait_for_port(port: u16, within: Duration) -> Result<(), String> {
    let start = Instant::now();
    while start.elapsed() < within {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "cargo lambda watch did not listen on {port} within {within:?}"
    ))
}

fn lambda(opts: &Options, reps: usize) -> Result<LambdaTimes, String> {
    if !opts.lambda_bin.exists() {
        return Err(format!("{} is not built", opts.lambda_bin.display()));
    }
    let cargo_lambda = opts.venv().join("bin/cargo-lambda");
    if !cargo_lambda.exists() {
        return Err(format!("{} not found", cargo_lambda.display()));
    }
    if std::env::var_os("AWS_ENDPOINT_URL_SQS").is_none() {
        return Err("the local stack's variables are not set".into());
    }
    let floor = build_floor(opts)?;
    // The queues and table the function's configuration names, as on AWS.
    let created = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?
        .block_on(crate::support::try_fresh_resources("bench-cold", false))?;
    let event = opts.work_dir().join("cold-event.json");
    std::fs::create_dir_all(opts.work_dir()).map_err(|e| e.to_string())?;
    std::fs::write(&event, one_record_event(&created.queue_url)).map_err(|e| e.to_string())?;

    let port = free_port()?;
    let _watch = Guard(
        Command::new(&cargo_lambda)
            .args([
                "lambda",
                "watch",
                "--only-lambda-apis",
                "-A",
                "127.0.0.1",
                "-P",
                &port.to_string(),
            ])
            .current_dir(&opts.manifest_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cargo lambda watch: {e}"))?,
    );
    wait_for_port(port, Duration::from_secs(30))?;

    let (mut handled, mut answered) = (Vec::new(), Vec::new());
    let (mut floor_handled, mut floor_answered) = (Vec::new(), Vec::new());
    let (mut read_floor_handled, mut read_floor_answered) = (Vec::new(), Vec::new());
    // One untimed run of each first, so the binaries' pages are in the page cache like the
    // later runs; then the two alternate, so a slower moment of the machine hits both.
    for rep in 0..=reps {
        let (h, a) = once(
            opts,
            &opts.lambda_bin,
            &cargo_lambda,
            port,
            &event,
            &created,
            false,
        )?;
        let (fh, fa) = once(opts, &floor, &cargo_lambda, port, &event, &created, false)?;
        let (rh, ra) = once(opts, &floor, &cargo_lambda, port, &event, &created, true)?;
        if rep > 0 {
            handled.push(h);
            answered.push(a);
            floor_handled.push(fh);
            floor_answered.push(fa);
            read_floor_handled.push(rh);
            read_floor_answered.push(ra);
        }
    }
    Ok(LambdaTimes {
        handled_ms: median(&mut handled),
        answered_ms: median(&mut answered),
        floor_handled_ms: median(&mut floor_handled),
        floor_answered_ms: median(&mut floor_answered),
        read_floor_handled_ms: median(&mut read_floor_handled),
        read_floor_answered_ms: median(&mut read_floor_answered),
    })
}

fn once(
    opts: &Options,
    bin: &Path,
    cargo_lambda: &Path,
    port: u16,
    event: &PathBuf,
    created: &triage::ops::setup::SetupReport,
    // The floor with the one read a cold `triage-lambda`'s first event makes.
    with_read: bool,
) -> Result<(f64, f64), String> {
    // The event waits in the emulator before the function exists, as a cold start's does.
    let mut invoke = Guard(
        Command::new(cargo_lambda)
            .args([
                "lambda",
                "invoke",
                "-A",
                "127.0.0.1",
                "-P",
                &port.to_string(),
                "_",
                "--data-file",
            ])
            .arg(event)
            .current_dir(&opts.manifest_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cargo lambda invoke: {e}"))?,
    );
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let mut function = Guard(
        crate::support::spawn_lambda_binary(
            Command::new(bin)
                .env("AWS_LAMBDA_RUNTIME_API", format!("http://127.0.0.1:{port}/.rt"))
                .env("AWS_LAMBDA_FUNCTION_NAME", "_")
                .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
                .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
                .env("TRIAGE_QUEUE_URL", &created.queue_url)
                .env("TRIAGE_DLQ_URL", &created.dlq_url)
                // As the stacks set them: the DLQ's size (`triage setup` makes it 1 MiB) and
                // the source queue's attributes as `triage setup` made them.
                .env("TRIAGE_DLQ_MAX_BYTES", "1048576")
                // SQS's default retention (4 days), which `triage setup` keeps.
                .env("TRIAGE_QUEUE_RETENTION_S", "345600")
                .env(
                    "TRIAGE_QUEUE_VISIBILITY_S",
                    created.visibility_timeout_s.to_string(),
                )
                .env("TRIAGE_QUEUE_MAX_RECEIVE", created.max_receive_count.to_string())
                .env("TRIAGE_TABLE", &created.table)
                .envs(with_read.then_some(("FLOOR_TABLE", &created.table)))
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        )
        .map_err(|e| format!("{}: {e}", bin.display()))?,
    );
    let stdout = function.0.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut line = String::new();
        let n = BufReader::new(stdout).read_line(&mut line).unwrap_or(0);
        (n > 0).then(Instant::now)
    });
    let status = wait_with_timeout(&mut invoke.0, Duration::from_secs(30))?;
    let answered = t0.elapsed();
    let mut out = String::new();
    if let Some(mut o) = invoke.0.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut o, &mut out);
    }
    if !status || !out.contains("batchItemFailures") {
        return Err(format!("the invoke did not get a batch response: {}", out.trim()));
    }
    drop(function);
    let handled = reader
        .join()
        .ok()
        .flatten()
        .map(|t| t.duration_since(t0))
        .ok_or("the function printed nothing")?;
    Ok((handled.as_secs_f64() * 1e3, answered.as_secs_f64() * 1e3))
}

fn wait_with_timeout(child: &mut Child, within: Duration) -> Result<bool, String> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(st.success());
        }
        if start.elapsed() > within {
            return Err(format!("no answer within {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn one_record_event(queue_url: &str) -> String {
    let name = queue_url.rsplit('/').next().unwrap_or("jobs");
    let now = now_ms();
    json!({"Records": [{
        "messageId": "00000000-0000-4000-8000-000000000001",
        "receiptHandle": "AQEBcold",
        "body": json!({"type": CHAOS, "id": "cold-1", "payload": {"outcome": "ok"}}).to_string(),
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": now.to_string(),
            "SenderId": "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": now.to_string(),
        },
        "messageAttributes": {},
        "md5OfBody": "00000000000000000000000000000000",
        "eventSource": "aws:sqs",
        "eventSourceARN": format!("arn:aws:sqs:us-east-1:123456789012:{name}"),
        "awsRegion": "us-east-1",
    }]})
    .to_string()
}

struct PythonTimes {
    with_import_ms: f64,
    bare_ms: f64,
    importtime_ms: Option<f64>,
}

const IMPORT: &str =
    "from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response";

fn python(opts: &Options, reps: usize) -> Result<PythonTimes, String> {
    let py = opts.python();
    if !py.exists() {
        return Err(format!("{} not found", py.display()));
    }
    let time = |code: &str| -> Result<f64, String> {
        let t = Instant::now();
        let st = Command::new(&py)
            .args(["-c", code])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| e.to_string())?;
        if !st.success() {
            return Err(format!("`python -c \"{code}\"` failed"));
        }
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    // Warm the page cache and the bytecode cache once, as a warm container image would have.
    time(IMPORT)?;
    let mut with = Vec::new();
    let mut bare = Vec::new();
    for _ in 0..reps {
        with.push(time(IMPORT)?);
        bare.push(time("pass")?);
    }
    let importtime_ms = Command::new(&py)
        .args(["-X", "importtime", "-c", IMPORT])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stderr).lines().find_map(|l| {
                let mut parts = l.strip_prefix("import time:")?.split('|');
                let _self_us = parts.next()?;
                let cumulative: f64 = parts.next()?.trim().parse().ok()?;
                (parts.next()?.trim() == "aws_lambda_powertools.utilities.batch").then_some(cumulative / 1e3)
            })
        });
    Ok(PythonTimes {
        with_import_ms: median(&mut with),
        bare_ms: median(&mut bare),
        importtime_ms,
    })
}
