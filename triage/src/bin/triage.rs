//! `triage`: the operator CLI and local worker. Parses arguments and wires them to
//! `triage::ops` and `sqs_triage::runtime`; every rule lives in the library.
#![forbid(unsafe_code)]

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use triage::ops::breaker::{self, Force};
use triage::ops::output::{Report, render};
use triage::ops::{self, Ctx, OpsError, OpsResult, audit, dlq, send, setup};

/// Operate sqs-triage: create queues, send jobs, inspect and replay the DLQ, run a worker.
///
/// Exit codes: 0 ok, 1 AWS or other failure, 2 bad input or configuration (or a refused
/// confirmation), 3 queue/table/message not found, 4 endpoint unreachable, 5 some selected
/// messages were not sent/moved/deleted, 6 operation not supported by the endpoint, 7 the
/// action was done but its audit item could not be written.
#[derive(Debug, Parser)]
#[command(name = "triage", version, max_term_width = 100)]
struct Cli {
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Never draw progress bars.
    #[arg(long, global = true)]
    no_progress: bool,
    /// Source queue (URL, ARN or name).
    #[arg(long, global = true, env = "TRIAGE_QUEUE_URL", value_name = "QUEUE")]
    queue_url: Option<String>,
    /// Dead-letter queue (URL, ARN or name).
    #[arg(long, global = true, env = "TRIAGE_DLQ_URL", value_name = "QUEUE")]
    dlq_url: Option<String>,
    /// State table (attempt ledgers and breakers).
    #[arg(long, global = true, env = "TRIAGE_TABLE", value_name = "NAME")]
    table: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create (idempotently) the queue, its DLQ and the state table; prints what to export.
    Setup(SetupArgs),
    /// Send one job from flags, or many as NDJSON from --file or stdin.
    Send(SendArgs),
    /// Inspect, replay, purge or redrive the dead-letter queue.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Read or force the circuit breaker of a job type.
    #[command(subcommand)]
    Breaker(BreakerCommand),
    /// Show attempt ledgers.
    #[command(subcommand)]
    Attempts(AttemptsCommand),
    /// Move a job that waits for its next retry to the DLQ now (class `parked`, with the
    /// attempts it used), without running it again.
    Park(ParkArgs),
    /// The audit trail: who replayed, purged, redrove or forced what, newest first.
    Audit(AuditArgs),
    /// Run the long-polling worker: each job POSTed to a handler over HTTP (--http URL
    /// --types a,b), or the built-in demo job type (--demo-handlers); TRIAGE_QUEUE_URL,
    /// TRIAGE_DLQ_URL, TRIAGE_TABLE from the environment; until Ctrl-C or SIGTERM.
    Worker(WorkerArgs),
    /// A local web console: the queues' depths, the DLQ grouped, each message in full, the
    /// breakers, and the same actions as the CLI behind a confirmation page (see docs/cli.md).
    Console(ConsoleArgs),
    /// Run the chaos demo against the queue, DLQ and table the environment names.
    Demo {
        /// Jobs of each kind to send.
        #[arg(long, default_value_t = 50)]
        jobs: usize,
    },
    /// Write a crate of your own: a typed handler on sqs-triage with its tests, a SAM template
    /// and a CDK app that build and deploy it (docs/deploy.md). Never overwrites anything.
    Init(InitArgs),
}

#[derive(Debug, Args)]
struct InitArgs {
    /// The crate's name, also its binary, its job type and its stack's name (lowercase
    /// letters, digits and '-').
    name: String,
    /// The folder to create it in (missing or empty; default ./NAME).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The sqs-triage checkout to depend on by path (default: the one this `triage` was built
    /// from).
    #[arg(long, value_name = "PATH_TO_SQS_TRIAGE")]
    path: Option<PathBuf>,
    /// The handler's language: rust (a crate), python or node (a handler run through the
    /// sqs-triage layer).
    #[arg(long, default_value = "rust", value_name = "RUNTIME")]
    runtime: String,
}

#[derive(Debug, Args)]
struct ConsoleArgs {
    /// Port to listen on (0: any free port; the URL is printed).
    #[arg(long, default_value_t = 8080, value_name = "PORT")]
    port: u16,
    /// Listen on this address instead of 127.0.0.1; then a token is required (--token, or one
    /// is generated and printed).
    #[arg(long, value_name = "ADDR")]
    bind: Option<std::net::IpAddr>,
    /// The token every request must carry (at least 16 letters, digits or -_.~); required with --bind,
    /// generated when absent.
    #[arg(
        long,
        env = "TRIAGE_CONSOLE_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Read at most this many DLQ messages per page or action.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    max_scan: usize,
}

#[derive(Debug, Args)]
struct AuditArgs {
    /// Items of this last period (e.g. 2h, 1d, 30d).
    #[arg(long, default_value = "1d", value_name = "DURATION", value_parser = ops::parse_duration)]
    since: Duration,
    /// Only this action and its sub-actions (e.g. dlq.purge, breaker, dlq.redrive).
    #[arg(long, value_name = "ACTION")]
    action: Option<String>,
    /// At most this many items (the newest).
    #[arg(long, default_value_t = 100, value_name = "N")]
    limit: usize,
}

#[derive(Debug, Args)]
struct WorkerArgs {
    /// POST each job's payload to this URL (plain http://), its type, id, attempt and
    /// deadline in `x-triage-*` headers. 2xx is done; 4xx fatal except 408, 409, 425 and 429;
    /// those, 5xx, connection errors and timeouts transient; `Retry-After` honoured.
    #[arg(
        long,
        env = "TRIAGE_HTTP_URL",
        value_name = "URL",
        conflicts_with = "demo_handlers"
    )]
    http: Option<String>,
    /// The job types sent to --http (comma-separated). Any other type is dead-lettered
    /// `invalid`: each type served gets its own breaker and metrics.
    #[arg(long, env = "TRIAGE_JOB_TYPES", value_name = "TYPES", value_delimiter = ',')]
    types: Vec<String>,
    /// How long to wait for an --http answer before the attempt fails transiently.
    #[arg(long, env = "TRIAGE_HTTP_TIMEOUT", default_value = "60s", value_name = "DURATION", value_parser = ops::parse_duration)]
    http_timeout: Duration,
    /// Serve the built-in demo job type `triage.chaos`, the only handler this binary has (any
    /// other job type is dead-lettered as `invalid`): for demos and smoke tests.
    #[arg(long)]
    demo_handlers: bool,
    /// Batches in flight at once, each received, processed and deleted on its own (up to
    /// TRIAGE_CONCURRENCY records of each run at once).
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=100))]
    batches: u16,
    /// Exit (code 3 for a missing queue, else 1) once receives have failed with a permanent
    /// error, such as a deleted queue or access denied, for this long. Throttling and server
    /// errors are retried without limit.
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = ops::parse_duration)]
    give_up_after: Duration,
}

/// Why `triage worker` needs a handler, and which to give it.
const WORKER_NEEDS_DEMO_HANDLERS: &str = "`triage worker` needs handlers: pass --http URL --types a,b to POST each job to a service (TRIAGE_HTTP_URL, TRIAGE_JOB_TYPES), or --demo-handlers for the built-in demo job type `triage.chaos`. Rust handlers run in your own binary: see examples/worker.rs";

#[derive(Debug, Subcommand)]
enum BreakerCommand {
    /// The breaker of one job type, or of every job type with stored state.
    Status {
        /// Job type (all when absent).
        job_type: Option<String>,
    },
    /// Force the breaker open: until `close`, or for a period with --for.
    Open {
        /// Job type.
        job_type: String,
        /// Open for this long (e.g. 10m), then half-open as usual.
        #[arg(long = "for", value_name = "DURATION", value_parser = ops::parse_duration)]
        for_: Option<Duration>,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Force the breaker closed (in-flight probes become stale).
    Close {
        /// Job type.
        job_type: String,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Reset the breaker to a fresh closed state (failure counts cleared).
    Reset {
        /// Job type.
        job_type: String,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

#[derive(Debug, Subcommand)]
enum AttemptsCommand {
    /// The attempt ledger of one job (ledgers are kept per job type and job id).
    Show {
        /// Job id (the envelope `id`, else the SQS message id).
        job_id: String,
        /// Job type. Without it, the id's ledger under whichever type has one; an error
        /// naming the types when several job types share the id.
        #[arg(long = "type", value_name = "TYPE")]
        job_type: Option<String>,
    },
}

#[derive(Debug, Args)]
struct ParkArgs {
    /// Job id (the envelope `id`, else the SQS message id).
    job_id: String,
    /// Job type; needed only when several job types have a ledger for this id.
    #[arg(long = "type", value_name = "TYPE")]
    job_type: Option<String>,
    /// Why, kept on the ledger and in the failure record.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

#[derive(Debug, Args)]
struct SetupArgs {
    /// Source queue name (`.fifo` is added for FIFO queues).
    #[arg(long, value_name = "NAME")]
    queue: String,
    /// Dead-letter queue name.
    #[arg(long, value_name = "NAME")]
    dlq: String,
    /// Create FIFO queues.
    #[arg(long)]
    fifo: bool,
    /// SQS's own redrive after this many receives: a safety net for crashes the handler
    /// cannot catch. At least 4 x the retry policy's attempts, since deferrals count as
    /// receives [default: 50, or 4 x the attempts when that is more]
    #[arg(long, value_name = "N")]
    max_receive_count: Option<u32>,
    /// The retry policy's attempts the consumers will run with (TRIAGE_MAX_ATTEMPTS), to check
    /// --max-receive-count against [default: TRIAGE_MAX_ATTEMPTS, else 5]
    #[arg(long, value_name = "N")]
    max_attempts: Option<u32>,
    /// The source queue's visibility timeout (0-43200). Lambda: at least 6 x the function
    /// timeout; worker: above the longest handler timeout [default: keep the queue's own;
    /// 30 for a new queue]
    #[arg(long, value_name = "SECONDS")]
    visibility_timeout: Option<u32>,
    /// When the DLQ's redrive-allow policy is denyAll, replace it with byQueue listing this
    /// queue (without it setup refuses such a DLQ)
    #[arg(long)]
    replace_deny_all: bool,
}

#[derive(Debug, Args)]
struct SendArgs {
    /// Job type (one job from flags).
    #[arg(long = "type", value_name = "TYPE", conflicts_with = "file")]
    job_type: Option<String>,
    /// Payload, as JSON (quote strings: '"text"').
    #[arg(long, value_name = "JSON", requires = "job_type")]
    payload: Option<String>,
    /// Job id.
    #[arg(long, value_name = "ID", requires = "job_type")]
    id: Option<String>,
    /// Delivery delay in seconds (standard queues, 0-900).
    #[arg(long, value_name = "SECONDS", requires = "job_type")]
    delay: Option<u32>,
    /// Message group (required for FIFO queues).
    #[arg(long, value_name = "GROUP", requires = "job_type")]
    group: Option<String>,
    /// NDJSON file of jobs, one {"type","payload","id","delay","group"} object per line
    /// (`-` for stdin). Without --type or --file, jobs are read from stdin.
    #[arg(long, short = 'f', value_name = "PATH")]
    file: Option<PathBuf>,
    /// Write the lines that were not sent (rejected, unconfirmed or skipped) to this file,
    /// byte for byte and in order, to send again with --file; written empty when every line
    /// was sent. May be the input file itself.
    #[arg(long, value_name = "PATH")]
    unsent: Option<PathBuf>,
}

#[derive(Debug, Args, Clone, Default)]
struct FilterArgs {
    /// Only this job type (repeatable).
    #[arg(long = "type", value_name = "TYPE")]
    job_type: Vec<String>,
    /// Only this failure class (repeatable).
    #[arg(long, value_name = "CLASS", value_parser = ["fatal", "exhausted", "invalid", "expiring", "parked", "unrecorded"])]
    class: Vec<String>,
    /// Only messages whose error text contains this (case-insensitive).
    #[arg(long, value_name = "TEXT")]
    error: Option<String>,
    /// Only failures at least this old (e.g. 30m, 2h, 1d).
    #[arg(long, value_name = "AGE", value_parser = ops::parse_duration)]
    older_than: Option<Duration>,
    /// Only failures at most this old.
    #[arg(long, value_name = "AGE", value_parser = ops::parse_duration)]
    newer_than: Option<Duration>,
    /// Only this job id or message id (repeatable).
    #[arg(long, value_name = "ID")]
    id: Vec<String>,
    /// Read at most this many DLQ messages.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    max_scan: usize,
}

impl FilterArgs {
    fn filter(&self) -> dlq::Filter {
        dlq::Filter {
            job_types: self.job_type.clone(),
            classes: self.class.clone(),
            error_contains: self.error.clone(),
            older_than: self.older_than,
            newer_than: self.newer_than,
            ids: self.id.clone(),
        }
    }
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// What is in the DLQ, grouped by job type and failure class (removes nothing).
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Also list every message.
        #[arg(long)]
        messages: bool,
    },
    /// One DLQ message in full, by job id or message id (removes nothing).
    Show {
        /// Job id, DLQ message id or original message id.
        id: String,
        /// Read at most this many DLQ messages.
        #[arg(long, default_value_t = 100_000, value_name = "N")]
        max_scan: usize,
    },
    /// Move DLQ messages back to their source queue (or --to), with a fresh attempt ledger.
    Replay {
        #[command(flatten)]
        filter: FilterArgs,
        /// Send to this queue instead of each message's source queue.
        #[arg(long, value_name = "QUEUE")]
        to: Option<String>,
        /// Move at most this many messages.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// At most this many messages per second (0.01 to 1000).
        #[arg(long, value_name = "PER_SECOND")]
        rate: Option<f64>,
        /// Show what would move; move nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Edit one DLQ message's body (in $EDITOR, else $VISUAL; or --body / --patch), then
    /// replay the edited copy as `replay` would and delete the original once it is sent.
    Edit {
        /// Job id, DLQ message id or original message id (as `show` takes it); it must name
        /// one DLQ message.
        id: String,
        /// Take the new body from this file (`-` for stdin) instead of an editor.
        #[arg(long, value_name = "FILE", conflicts_with = "patch")]
        body: Option<PathBuf>,
        /// Apply this RFC 6902 JSON Patch to the body parsed as JSON, e.g.
        /// '[{"op":"replace","path":"/payload/n","value":2}]'.
        #[arg(long, value_name = "JSON-PATCH")]
        patch: Option<String>,
        /// Send to this queue instead of the message's source queue.
        #[arg(long, value_name = "QUEUE")]
        to: Option<String>,
        /// Replay the body even when the edit left it unchanged.
        #[arg(long)]
        force: bool,
        /// Read at most this many DLQ messages looking for it.
        #[arg(long, default_value_t = 100_000, value_name = "N")]
        max_scan: usize,
    },
    /// Delete selected DLQ messages (asks first unless --yes).
    Purge {
        #[command(flatten)]
        filter: FilterArgs,
        /// Delete at most this many messages.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Server-side move with SQS StartMessageMoveTask (asks first unless --yes; not on moto:
    /// use `replay` there).
    Redrive(RedriveArgs),
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
struct RedriveArgs {
    #[command(subcommand)]
    action: Option<RedriveAction>,
    /// Destination queue instead of each message's original source.
    #[arg(long, value_name = "QUEUE")]
    to: Option<String>,
    /// At most this many messages per second (1-500).
    #[arg(long, value_name = "PER_SECOND")]
    rate: Option<i32>,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    yes: bool,
}

#[derive(Debug, Subcommand)]
enum RedriveAction {
    /// The DLQ's recent move tasks.
    Status,
    /// Cancel a running move task (the DLQ's running one when no handle is given).
    Cancel {
        /// Task handle from `status`.
        handle: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_error(e),
    };
    // Operator commands never panic by design; if one does, say so in one line. The worker
    // and the demo run handlers whose panics the processor catches per record: they install
    // the runtime's hook (`runtime::env::install_panic_hook`, masked messages through tracing)
    // when they start.
    if !matches!(cli.command, Command::Worker(_) | Command::Demo { .. }) {
        set_panic_hook();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn set_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "error: internal error{at}: {} (please report it)",
            ops::one_line(&msg)
        );
    }));
}

/// Clap's help and version go to stdout as usual; its errors become one line.
fn clap_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        _ => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("error: bad arguments").trim();
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("error: {} (see `triage --help`)", ops::one_line(first));
            ExitCode::from(2)
        }
    }
}

fn nonempty(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn require<'a>(v: &'a Option<String>, var: &str, flag: &str) -> OpsResult<&'a str> {
    nonempty(v).ok_or_else(|| OpsError::missing_var(var, flag))
}

fn print<R: Report>(report: &R, json: bool) -> ExitCode {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(render(report, json).as_bytes());
    let _ = out.flush();
    // An action that changed state and was not audited says so: after the action's own
    // problem (exit 5, which wins), or alone (exit 7).
    let audit = report.audit();
    if let Some(w) = audit.and_then(|a| a.warning()) {
        eprintln!("warning: {w}");
    }
    let not_audited = audit.and_then(|a| a.problem());
    let code = |kind| ExitCode::from(OpsError::new(kind, "").exit_code());
    match (report.problem(), not_audited) {
        (Some(p), a) => {
            eprintln!("error: {p}");
            if let Some(a) = a {
                eprintln!("error: {a}");
            }
            code(ops::ErrorKind::Incomplete)
        }
        (None, Some(a)) => {
            eprintln!("error: {a}");
            code(ops::ErrorKind::NotAudited)
        }
        (None, None) => ExitCode::SUCCESS,
    }
}

/// The state table an audited command records its action in, and the retention: checked
/// before anything is changed. Every action that changes state is audited, so it needs the
/// table even when it does not otherwise use it (purge, redrive).
fn audit_table(cli: &Cli) -> OpsResult<(&str, Duration)> {
    let table = require(&cli.table, "TRIAGE_TABLE", "--table").map_err(|e| {
        OpsError::usage(format!(
            "{e} (the action is recorded in the state table's audit trail)"
        ))
    })?;
    Ok((table, audit::retention_from_env()?))
}

async fn run(cli: Cli) -> OpsResult<ExitCode> {
    let json = cli.json;
    let progress = !cli.json && !cli.no_progress;
    match &cli.command {
        Command::Setup(a) => run_setup(&cli, a, json).await,
        Command::Send(a) => run_send(&cli, a, json, progress).await,
        Command::Dlq(cmd) => run_dlq(&cli, cmd, json, progress).await,
        Command::Breaker(cmd) => run_breaker(&cli, cmd, json).await,
        Command::Attempts(AttemptsCommand::Show { job_id, job_type }) => {
            let table = require(&cli.table, "TRIAGE_TABLE", "--table")?;
            let ctx = Ctx::from_env().await?;
            let r = breaker::attempts(&ctx, table, job_type.as_deref(), job_id).await?;
            Ok(print(&r, json))
        }
        Command::Park(a) => run_park(&cli, a, json).await,
        Command::Audit(a) => {
            let table = require(&cli.table, "TRIAGE_TABLE", "--table")?;
            let ctx = Ctx::from_env().await?;
            let r = audit::list(&ctx, table, a.since, a.action.as_deref(), a.limit).await?;
            Ok(print(&r, json))
        }
        Command::Worker(a) => run_worker(a).await,
        Command::Console(a) => run_console(&cli, a).await,
        Command::Init(a) => {
            let report = ops::init::init(&ops::init::InitOptions {
                name: a.name.clone(),
                dir: a.dir.clone(),
                sqs_triage: a.path.clone(),
                runtime: a.runtime.parse()?,
            })?;
            Ok(print(&report, json))
        }
        Command::Demo { jobs } => {
            let opts = triage::demo::workload::DemoOptions { jobs_per_kind: *jobs };
            triage::demo::workload::main_from_env(opts)
                .await
                .map_err(runtime_error)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `setup`: the queue, its DLQ and the state table, made idempotently.
async fn run_setup(cli: &Cli, a: &SetupArgs, json: bool) -> OpsResult<ExitCode> {
    let table = require(&cli.table, "TRIAGE_TABLE", "--table")?;
    let env_attempts = std::env::var("TRIAGE_MAX_ATTEMPTS").ok();
    let (attempts, from) = setup::max_attempts_from(a.max_attempts, env_attempts.as_deref())?;
    let max_receive_count = a
        .max_receive_count
        .unwrap_or_else(|| setup::default_max_receive_count(attempts));
    setup::check_max_receive_count(max_receive_count, attempts, from)?;
    let ctx = Ctx::from_env().await?;
    let report = setup::setup_with(
        &ctx,
        &setup::SetupOptions {
            queue: a.queue.clone(),
            dlq: a.dlq.clone(),
            table: table.to_owned(),
            fifo: a.fifo,
            max_receive_count,
        },
        &setup::SetupFlags {
            visibility_timeout: a.visibility_timeout,
            replace_deny_all: a.replace_deny_all,
        },
    )
    .await?;
    Ok(print(&report, json))
}

/// `send`: the jobs read from the input, sent; `--unsent` says what is left to send.
async fn run_send(cli: &Cli, a: &SendArgs, json: bool, progress: bool) -> OpsResult<ExitCode> {
    let queue = require(&cli.queue_url, "TRIAGE_QUEUE_URL", "--queue-url")?;
    let fifo = ops::is_fifo(queue);
    let jobs = read_jobs(a, fifo)?;
    let unsent = a.unsent.as_deref();
    // Once the input is good, `--unsent` always says what is left to send.
    let all_unsent = |e: OpsError| match unsent {
        Some(path) => match send::write_unsent(path, &send::all_text(&jobs)) {
            Ok(()) => e,
            Err(w) => OpsError::new(e.kind, format!("{e}; {w}")),
        },
        None => e,
    };
    let ctx = Ctx::from_env()
        .await
        .and_then(|c| c.for_queue(queue, "TRIAGE_QUEUE_URL"))
        .map_err(all_unsent)?;
    let url = ops::resolve_queue(&ctx, queue, "TRIAGE_QUEUE_URL")
        .await
        .map_err(all_unsent)?;
    let mut report = send::send_jobs(&ctx, &url, &jobs, progress)
        .await
        .map_err(all_unsent)?;
    let mut write_error = None;
    if let Some(path) = unsent {
        match send::write_unsent(path, &send::unsent_text(&jobs, &report)) {
            Ok(()) => report.unsent_file = Some(path.display().to_string()),
            Err(e) => write_error = Some(e),
        }
    }
    let code = print(&report, json);
    match write_error {
        Some(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(e.exit_code()))
        }
        None => Ok(code),
    }
}

/// `dlq ...`: the checks every DLQ command makes (confirmation, the audit table), then the
/// command.
async fn run_dlq(cli: &Cli, cmd: &DlqCommand, json: bool, progress: bool) -> OpsResult<ExitCode> {
    let dlq_arg = require(&cli.dlq_url, "TRIAGE_DLQ_URL", "--dlq-url")?;
    // DLQ messages are read as the consumers read them, EventBridge mapping included.
    dlq::check_eventbridge_types()?;
    match cmd {
        DlqCommand::Purge { yes, .. } => can_confirm(*yes, "purge")?,
        DlqCommand::Redrive(RedriveArgs {
            action: None, yes, ..
        }) => can_confirm(*yes, "redrive")?,
        _ => {}
    }
    let audited = match cmd {
        DlqCommand::Replay { dry_run, .. } => !dry_run,
        DlqCommand::Purge { .. } | DlqCommand::Edit { .. } => true,
        DlqCommand::Redrive(a) => !matches!(a.action, Some(RedriveAction::Status)),
        DlqCommand::List { .. } | DlqCommand::Show { .. } => false,
    };
    let trail = audited.then(|| audit_table(cli)).transpose()?;
    let mut ctx = Ctx::from_env().await?.for_queue(dlq_arg, "TRIAGE_DLQ_URL")?;
    if let Some((table, retention)) = trail {
        // Replay checks its table itself; purge and redrive use it only to audit.
        if !matches!(cmd, DlqCommand::Replay { .. }) {
            audit::check_table(&ctx, table).await?;
        }
        ctx = ctx.audited(table, retention);
        // Who is asking is known before the action, so the audit item follows it at once.
        ctx.actor().await;
    }
    let dlq_url = ops::resolve_queue(&ctx, dlq_arg, "TRIAGE_DLQ_URL").await?;
    dispatch_dlq(cli, cmd, &ctx, &dlq_url, json, progress).await
}

/// `breaker ...`: a breaker's status, or a forced state after a confirmation.
async fn run_breaker(cli: &Cli, cmd: &BreakerCommand, json: bool) -> OpsResult<ExitCode> {
    let table = require(&cli.table, "TRIAGE_TABLE", "--table")?;
    let (job_type, what, yes) = match cmd {
        BreakerCommand::Status { job_type } => {
            let ctx = Ctx::from_env().await?;
            let r = breaker::status(&ctx, table, job_type.as_deref()).await?;
            return Ok(print(&r, json));
        }
        BreakerCommand::Open { job_type, for_, yes } => (job_type, Force::Open(*for_), *yes),
        BreakerCommand::Close { job_type, yes } => (job_type, Force::Close, *yes),
        BreakerCommand::Reset { job_type, yes } => (job_type, Force::Reset, *yes),
    };
    let (_, retention) = audit_table(cli)?;
    can_confirm(yes, "force a breaker")?;
    let question = format!(
        "force the breaker of {job_type} {} for every consumer? [y/N] ",
        what.name()
    );
    if !confirmed(yes, &question) {
        return Err(OpsError::usage("cancelled: the breaker was not changed"));
    }
    let ctx = Ctx::from_env().await?.audited(table, retention);
    ctx.actor().await;
    let r = breaker::force(&ctx, table, job_type, what).await?;
    Ok(print(&r, json))
}

/// `park`: a job parked, audited, with who parked it.
async fn run_park(cli: &Cli, a: &ParkArgs, json: bool) -> OpsResult<ExitCode> {
    let (table, retention) = audit_table(cli)?;
    let ctx = Ctx::from_env().await?.audited(table, retention);
    ctx.actor().await;
    let by = ["USER", "USERNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()));
    let opts = ops::park::ParkOptions {
        job_id: a.job_id.clone(),
        job_type: a.job_type.clone(),
        by,
        reason: a.reason.clone(),
    };
    let r = ops::park::park(&ctx, table, &opts).await?;
    Ok(print(&r, json))
}

/// `worker`: a long-running worker, with HTTP dispatch or the demo handlers.
async fn run_worker(a: &WorkerArgs) -> OpsResult<ExitCode> {
    let opts = sqs_triage::runtime::worker::RunOptions {
        batches: usize::from(a.batches),
        give_up_after: a.give_up_after,
    };
    match &a.http {
        Some(url) => {
            let types: Vec<&str> = a
                .types
                .iter()
                .map(|t| t.trim())
                .filter(|t| !t.is_empty())
                .collect();
            if types.is_empty() {
                return Err(OpsError::usage(
                    "--http needs the job types it serves: --types a,b (or TRIAGE_JOB_TYPES)",
                ));
            }
            let dispatch = sqs_triage::HttpDispatch::new(url, a.http_timeout)
                .map_err(|e| OpsError::usage(e.to_string()))?;
            let registry = dispatch.register(sqs_triage::Registry::default(), &types);
            sqs_triage::worker::run_with(registry, opts)
                .await
                .map_err(runtime_error)?;
        }
        None if a.demo_handlers => triage::demo::run_worker(opts).await.map_err(runtime_error)?,
        None => return Err(OpsError::usage(WORKER_NEEDS_DEMO_HANDLERS)),
    }
    Ok(ExitCode::SUCCESS)
}

async fn dispatch_dlq(
    cli: &Cli,
    cmd: &DlqCommand,
    ctx: &Ctx,
    dlq_url: &str,
    json: bool,
    progress: bool,
) -> OpsResult<ExitCode> {
    match cmd {
        DlqCommand::List { filter, messages } => {
            let r = dlq::list(ctx, dlq_url, &filter.filter(), *messages, filter.max_scan).await?;
            Ok(print(&r, json))
        }
        DlqCommand::Show { id, max_scan } => {
            let r = dlq::show(ctx, dlq_url, id, *max_scan).await?;
            Ok(print(&r, json))
        }
        DlqCommand::Replay {
            filter,
            to,
            limit,
            rate,
            dry_run,
        } => {
            let opts = dlq::ReplayOptions {
                filter: filter.filter(),
                to: to.clone(),
                limit: *limit,
                rate: *rate,
                dry_run: *dry_run,
                table: nonempty(&cli.table).map(str::to_owned),
                progress,
                max_scan: filter.max_scan,
                stop: Some(stop_on_ctrl_c()),
                hold: None,
            };
            let r = dlq::replay(ctx, dlq_url, &opts).await?;
            Ok(print(&r, json))
        }
        DlqCommand::Edit {
            id,
            body,
            patch,
            to,
            force,
            max_scan,
        } => {
            let opts = dlq::EditOptions {
                to: to.clone(),
                table: nonempty(&cli.table).map(str::to_owned),
                force: *force,
                max_scan: *max_scan,
                ..dlq::EditOptions::new(id.clone(), edit_source(body.as_deref(), patch.as_deref())?)
            };
            let r = dlq::edit(ctx, dlq_url, &opts).await?;
            Ok(print(&r, json))
        }
        DlqCommand::Purge { filter, limit, yes } => {
            let interrupt = PurgeInterrupt::arm();
            let opts = dlq::PurgeOptions {
                filter: filter.filter(),
                limit: *limit,
                max_scan: filter.max_scan,
                stop: Some(interrupt.stop.clone()),
                ..dlq::PurgeOptions::default()
            };
            let r = dlq::purge_with(ctx, dlq_url, &opts, |plan| {
                interrupt.enter(PurgeInterrupt::ASKING);
                let yes = confirmed(*yes, &plan.question());
                // After a no, the selection is given back: a further Ctrl-C waits for that.
                if yes {
                    interrupt.enter(PurgeInterrupt::ANSWERED);
                }
                yes
            })
            .await?;
            Ok(print(&r, json))
        }
        DlqCommand::Redrive(a) => {
            let r = match &a.action {
                None => {
                    dlq::redrive_start_confirmed(ctx, dlq_url, a.to.as_deref(), a.rate, |plan| {
                        confirmed(a.yes, &plan.question())
                    })
                    .await?
                }
                Some(RedriveAction::Status) => dlq::redrive_status(ctx, dlq_url).await?,
                Some(RedriveAction::Cancel { handle }) => {
                    dlq::redrive_cancel(ctx, dlq_url, handle.as_deref()).await?
                }
            };
            Ok(print(&r, json))
        }
    }
}

/// `triage console`: checks the queues and the table, binds, prints the URL, serves until
/// Ctrl-C or SIGTERM.
async fn run_console(cli: &Cli, a: &ConsoleArgs) -> OpsResult<ExitCode> {
    use triage::console;
    let queue = require(&cli.queue_url, "TRIAGE_QUEUE_URL", "--queue-url")?;
    let dlq_arg = require(&cli.dlq_url, "TRIAGE_DLQ_URL", "--dlq-url")?;
    let (table, retention) = audit_table(cli)?;
    dlq::check_eventbridge_types()?;
    let token = match (nonempty(&a.token), a.bind) {
        (Some(t), _) => {
            console::check_token(t)?;
            Some(t.to_owned())
        }
        (None, Some(_)) => Some(console::random_token()),
        (None, None) => None,
    };
    let ctx = Ctx::from_env()
        .await?
        .for_queue(dlq_arg, "TRIAGE_DLQ_URL")?
        .audited(table, retention);
    let queue_url = ops::resolve_queue(&ctx, queue, "TRIAGE_QUEUE_URL").await?;
    let dlq_url = ops::resolve_queue(&ctx, dlq_arg, "TRIAGE_DLQ_URL").await?;
    audit::check_table(&ctx, table).await?;
    ctx.actor().await;
    let ip = a
        .bind
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    let listener = tokio::net::TcpListener::bind((ip, a.port))
        .await
        .map_err(|e| OpsError::usage(format!("cannot listen on {ip} port {}: {e}", a.port)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| OpsError::new(ops::ErrorKind::Failed, format!("no local address: {e}")))?;
    let opts = console::ConsoleOptions {
        queue_url,
        dlq_url,
        table: table.to_owned(),
        token: token.clone(),
        allowed_hosts: console::ConsoleOptions::hosts_for(addr),
        max_scan: a.max_scan,
        local_user: ["USER", "USERNAME"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty())),
        port: addr.port(),
    };
    let shown = if addr.ip().is_unspecified() {
        format!("http://<this host>:{}/", addr.port())
    } else {
        format!("http://{addr}/")
    };
    let url = match &token {
        Some(t) => format!("{shown}?token={t}"),
        None => shown,
    };
    println!("triage console: {url}");
    eprintln!("serving until Ctrl-C; every action is audited to {table}");
    let _ = std::io::stdout().flush();
    let shutdown = async {
        #[cfg(unix)]
        {
            let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => return std::future::pending().await,
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    };
    console::serve(listener, ctx, opts, shutdown)
        .await
        .map_err(|e| OpsError::new(ops::ErrorKind::Failed, format!("the console stopped: {e}")))?;
    Ok(ExitCode::SUCCESS)
}

/// Where `dlq edit` takes the new body from: `--body FILE` (`-` for stdin), `--patch`, else
/// the editor `$EDITOR` names, else `$VISUAL`.
fn edit_source(body: Option<&std::path::Path>, patch: Option<&str>) -> OpsResult<dlq::EditSource> {
    if let Some(p) = patch {
        return Ok(dlq::EditSource::Patch(p.to_owned()));
    }
    if let Some(path) = body {
        let text = if path.as_os_str() == "-" {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| OpsError::usage(format!("cannot read the new body from stdin: {e}")))?;
            s
        } else {
            std::fs::read_to_string(path).map_err(|e| {
                OpsError::usage(format!("cannot read the new body from {}: {e}", path.display()))
            })?
        };
        return Ok(dlq::EditSource::Body(text));
    }
    ["EDITOR", "VISUAL"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|e| !e.trim().is_empty()))
        .map(dlq::EditSource::Editor)
        .ok_or_else(|| {
            OpsError::usage(
                "no editor: set $EDITOR (or $VISUAL), or pass the new body with --body FILE or a JSON Patch with --patch",
            )
        })
}

/// A runtime's error as one line: configuration problems (a bad variable, or a start-up
/// check that found a queue or table missing, unreadable or the wrong shape) exit 2, a
/// missing source queue (the worker's) 3, the rest 1.
fn runtime_error(e: sqs_triage::runtime::RuntimeError) -> OpsError {
    use sqs_triage::runtime::worker::{WorkerError, WorkerErrorKind};
    let misconfigured = e
        .downcast_ref::<sqs_triage::runtime::env::StartupError>()
        .is_some_and(|s| s.misconfigured);
    if misconfigured || e.downcast_ref::<sqs_triage::config::ConfigError>().is_some() {
        return OpsError::usage(e.to_string());
    }
    let kind = match e.downcast_ref::<WorkerError>().map(|w| w.kind) {
        Some(WorkerErrorKind::Config) => ops::ErrorKind::Usage,
        Some(WorkerErrorKind::NotFound) => ops::ErrorKind::NotFound,
        _ => ops::ErrorKind::Failed,
    };
    OpsError::new(kind, e.to_string())
}

/// A flag set by the first Ctrl-C (the replay then stops after its batch in progress and
/// releases the rest); a second Ctrl-C exits at once.
fn stop_on_ctrl_c() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            set.store(true, Ordering::SeqCst);
            eprintln!("interrupted: finishing the batch in progress (Ctrl-C again to quit now)");
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
    flag
}

/// Ctrl-C during `dlq purge`. While the DLQ is read, the first one stops the read (what was
/// read is made visible again, nothing is deleted) and a second quits at once; while the
/// question waits, the question's own handler takes it (as a no), and after a no, the
/// selection is given back whatever comes; after a yes it quits at once.
struct PurgeInterrupt {
    stop: Arc<AtomicBool>,
    phase: Arc<AtomicU8>,
}

impl PurgeInterrupt {
    const READING: u8 = 0;
    const ASKING: u8 = 1;
    const ANSWERED: u8 = 2;

    fn arm() -> Self {
        let (stop, phase) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU8::new(Self::READING)),
        );
        let (set, at) = (stop.clone(), phase.clone());
        tokio::spawn(async move {
            while tokio::signal::ctrl_c().await.is_ok() {
                match at.load(Ordering::SeqCst) {
                    Self::ASKING => {}
                    Self::READING if !set.swap(true, Ordering::SeqCst) => eprintln!(
                        "interrupted: stopping the read, making what was read visible again (Ctrl-C again to quit now)"
                    ),
                    _ => std::process::exit(130),
                }
            }
        });
        Self { stop, phase }
    }

    fn enter(&self, phase: u8) {
        self.phase.store(phase, Ordering::SeqCst);
    }
}

// The one confirmation of destructive commands (purge, redrive, breaker forces): first
// `can_confirm` before anything is asked of AWS, then `confirmed` with the question.

/// A destructive command without --yes needs someone to answer: refuses when stdin is not a
/// terminal.
fn can_confirm(yes: bool, what: &str) -> OpsResult<()> {
    if !yes && !std::io::stdin().is_terminal() {
        return Err(OpsError::usage(format!(
            "refusing to {what} without confirmation in a non-interactive shell: pass --yes"
        )));
    }
    Ok(())
}

/// True with --yes; otherwise asks `question` on stderr and reads one line from stdin:
/// anything but y/yes is a no, and so is Ctrl-C while the question waits, so that the command
/// undoes what it prepared (a purge makes its selection visible again). A Ctrl-C after the
/// answer quits at once, as it would without the question.
fn confirmed(yes: bool, question: &str) -> bool {
    if yes {
        return true;
    }
    let (answers, answer) = std::sync::mpsc::channel::<Option<String>>();
    let (armed_tx, armed) = std::sync::mpsc::channel::<()>();
    let interrupt = answers.clone();
    tokio::spawn(async move {
        let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
        // Polled once before the question is shown: that installs the handler.
        let early = tokio::select! {
            biased;
            r = &mut ctrl_c => Some(r),
            _ = std::future::ready(()) => None,
        };
        let _ = armed_tx.send(());
        let caught = match early {
            Some(r) => r.is_ok(),
            None => ctrl_c.await.is_ok(),
        };
        if caught && interrupt.send(None).is_err() {
            std::process::exit(130);
        }
    });
    // Until the handler is installed (at once, on a worker thread), Ctrl-C ends the command.
    let _ = armed.recv_timeout(Duration::from_secs(1));
    eprint!("{question}");
    let _ = std::io::stderr().flush();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = std::io::stdin().read_line(&mut line).ok().map(|_| line);
        let _ = answers.send(read);
    });
    match answer.recv() {
        Ok(Some(line)) => matches!(line.trim().to_lowercase().as_str(), "y" | "yes"),
        _ => {
            eprintln!();
            false
        }
    }
}

fn read_jobs(a: &SendArgs, fifo: bool) -> OpsResult<Vec<send::Job>> {
    if let Some(job_type) = &a.job_type {
        let payload = match &a.payload {
            None => send::Payload::default(),
            Some(p) => send::Payload::parse(p).map_err(|e| {
                OpsError::usage(format!(
                    "--payload is not valid JSON ({e}): pass JSON, e.g. --payload '{{\"n\": 1}}' or --payload '\"text\"'"
                ))
            })?,
        };
        let spec = send::JobSpec {
            job_type: job_type.clone(),
            payload,
            id: a.id.clone(),
            delay: a.delay,
            group: a.group.clone(),
        };
        spec.validate(fifo).map_err(OpsError::usage)?;
        return Ok(vec![send::Job::from_spec(spec)]);
    }
    let text = match a.file.as_deref() {
        Some(p) if p.as_os_str() != "-" => std::fs::read_to_string(p)
            .map_err(|e| OpsError::usage(format!("cannot read {}: {e}", p.display())))?,
        _ => {
            if a.file.is_none() && std::io::stdin().is_terminal() {
                return Err(OpsError::usage(
                    "nothing to send: pass --type TYPE [--payload JSON], or NDJSON with --file PATH or on stdin",
                ));
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| OpsError::usage(format!("cannot read stdin: {e}")))?;
            s
        }
    };
    send::parse_jobs(&text, fifo)
}
