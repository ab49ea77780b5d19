//! Builds a processor from configuration, once per container (or worker process).

use std::collections::HashMap;
use std::sync::Arc;

use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_sqs::types::QueueAttributeName;
use tokio::time::Instant;

use super::RuntimeError;
use crate::clock::Clock;
use crate::config::{Config, QueueFacts};
use crate::core::envelope::EnvelopeLimits;
use crate::core::redrive;
use crate::effects::breaker_store::BreakerStore;
use crate::effects::calls::CallCounter;
use crate::effects::dlq::DlqLimit;
use crate::effects::ledger::AttemptLedger;
use crate::effects::queue_url::{url_names_arn, urls_name_one_queue};
use crate::effects::sqs::Sqs;
use crate::effects::storage_retry::clients::http_client;
use crate::effects::storage_retry::{StorageError, StorageRetry, dynamodb_config, sqs_config};
use crate::effects::table::{PK, SK};
use crate::processor::TICKS_AHEAD;
use crate::processor::registry::Registry;
use crate::processor::{FirstRead, Processor, ProcessorConfig};

/// How long start-up's reads (the queues' attributes, the breakers) may take in all in Lambda
/// ([`Config::startup_deadline`], which the Lambda adapter sets): within the 10 s Lambda gives
/// a function's init, and above the 7.1 s the storage retries of a throttled read take at
/// most. A read still failing by then is one that could not be made: a table or DLQ check is
/// skipped with a warning, a source queue that must be read stops the start-up.
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(8);

/// Longest wait for one try of a start-up read where start-up has a deadline (in Lambda,
/// whose credentials come from the environment): a try not answered by then is retried (on
/// another connection), so one stalled request does not take the whole deadline. As long as
/// the clients' connect timeout. Without a deadline (the worker) each try keeps the clients'
/// own timeouts, which also cover loading credentials (a `credential_process`, SSO, IMDS).
pub const STARTUP_ATTEMPT_TIMEOUT: Duration = crate::effects::storage_retry::CONNECT_TIMEOUT;

/// Loads the standard AWS configuration (`AWS_REGION`, `AWS_ENDPOINT_URL*`, credentials), with
/// one HTTPS client of its own: every SDK client built from it, and the credential providers,
/// share one trust store. Load it on the runtime that makes the calls.
pub async fn sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(http_client())
        .load()
        .await
}

/// Everything a runtime needs, built once.
#[derive(Debug, Clone)]
pub struct Environment {
    /// The processor.
    pub processor: Processor,
    /// The source queue URL.
    pub queue_url: String,
    /// Requests sent by this environment's clients, per operation.
    pub calls: CallCounter,
    /// The storage retry policy every call of this environment goes through.
    pub retry: StorageRetry,
    /// Start-up checks that could not be made or found something odd, one line each (also
    /// logged as warnings): the runtime runs, degraded or as configured.
    pub startup_warnings: Vec<String>,
    /// The source queue's visibility timeout as start-up knows it, configured
    /// (`TRIAGE_QUEUE_VISIBILITY_S`) or read: the worker receives with it instead of reading
    /// the queue again. `None`: read at the first receive.
    pub source_visibility: Option<Duration>,
}

/// A start-up check failed: the configuration cannot work. The Lambda function fails its
/// init; `triage worker` exits 2 when [`misconfigured`](Self::misconfigured), else 1.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct StartupError {
    /// The variable at fault (`TRIAGE_QUEUE_URL`, `TRIAGE_DLQ_URL` or `TRIAGE_TABLE`).
    pub var: &'static str,
    /// One line naming the variable and what to do.
    pub message: String,
    /// True when the configuration is wrong (missing resource, no access, wrong shape);
    /// false when the check failed for a reason that may pass (the service unreachable).
    pub misconfigured: bool,
}

/// Builds the processor for `registry` from `config`: the configuration's policies as the
/// registry's defaults when it follows them ([`Registry::default`]; see
/// [`Registry::configured`]), SDK clients with the SDK's own retries off (every call goes
/// through one [`StorageRetry`]), the DLQ's size limit (`TRIAGE_DLQ_MAX_BYTES`, else read with
/// the DLQ's check, else at the first DLQ send), and a check of every policy against the
/// source queue's retention period.
pub async fn build(
    config: &Config,
    registry: Registry,
    sdk: &SdkConfig,
) -> Result<Environment, RuntimeError> {
    build_with(config, registry, sqs_config(sdk), dynamodb_config(sdk)).await
}

/// Like [`build`], with the SDK client configurations given (e.g. other endpoints). Their
/// retry settings are kept as given: use [`sqs_config`] and [`dynamodb_config`] as the base so
/// the SDK's own retries stay off.
pub async fn build_with(
    config: &Config,
    registry: Registry,
    sqs_conf: aws_sdk_sqs::config::Builder,
    ddb_conf: aws_sdk_dynamodb::config::Builder,
) -> Result<Environment, RuntimeError> {
    build_with_clock(config, registry, sqs_conf, ddb_conf, Clock::system()).await
}

/// Like [`build_with`], its ledger, breaker stores and processor reading the time from
/// `clock`.
pub async fn build_with_clock(
    config: &Config,
    registry: Registry,
    sqs_conf: aws_sdk_sqs::config::Builder,
    ddb_conf: aws_sdk_dynamodb::config::Builder,
    clock: Clock,
) -> Result<Environment, RuntimeError> {
    let registry = configured_registry(config, registry)?;
    let queue_url = Config::require(&config.queue_url, "TRIAGE_QUEUE_URL")?.to_owned();
    let dlq_url = Config::require(&config.dlq_url, "TRIAGE_DLQ_URL")?.to_owned();
    let table = Config::require(&config.table, "TRIAGE_TABLE")?.to_owned();
    let calls = CallCounter::new();
    let sqs_client = aws_sdk_sqs::Client::from_conf(sqs_conf.interceptor(calls.clone()).build());
    let ddb_client = aws_sdk_dynamodb::Client::from_conf(ddb_conf.interceptor(calls.clone()).build());
    let retry = StorageRetry::default();
    let sqs = Sqs::new(sqs_client.clone(), retry.clone());

    if urls_name_one_queue(&queue_url, &dlq_url) {
        return Err(source_as_dlq(&queue_url).into());
    }
    let breakers = breaker_stores(&registry, &ddb_client, &table, &retry, &clock);
    let names = StartupNames {
        queue_url: &queue_url,
        dlq_url: &dlq_url,
        table: &table,
    };
    let retry_of_startup = StartupRetry::new(config);
    let first_read = config
        .first_read_at_admission
        .then(|| start_first_read(config, &breakers, &ddb_client, &retry_of_startup, &table));
    let reads = startup_reads(config, &names, &sqs_client, &ddb_client, &breakers, &retry_of_startup).await;
    let mut checks = StartupChecks {
        warnings: eventbridge_warnings(&registry),
        skipped: 0,
    };
    let source = reads
        .source
        .map_err(|e| queue_error(e, "TRIAGE_QUEUE_URL", "the source queue", &queue_url))?;
    checks.check_source_queue(config, &registry, &source, &queue_url)?;
    let dlq_limit = checks.dlq_limit(config, reads.dlq, &source, &names)?;
    if let Some(table_check) = reads.table {
        checks.check_table(table_check, &table)?;
    }
    for t in registry.unrouted_done_markers() {
        checks.warnings.push(format!(
            "TRIAGE_DONE_MARKER_TYPES names `{t}`, which has no handler here: no completion marker is written for it"
        ));
    }
    for w in &checks.warnings {
        tracing::warn!(startup_check = "degraded", "{w}");
    }
    if checks.skipped > 0 {
        emit_startup_metric(checks.skipped, config.emf);
    }

    let ledger = AttemptLedger::new(ddb_client.clone(), &table, retry.clone()).with_clock(clock);
    let processor = Processor::with_shared_breakers(
        Arc::new(registry),
        sqs,
        ledger,
        breakers,
        ProcessorConfig {
            source_queue: queue_url.clone(),
            dlq_url,
            dlq_max_bytes: crate::effects::dlq::FALLBACK_MAX_MESSAGE_BYTES,
            concurrency: config.concurrency,
            limits: EnvelopeLimits::default(),
            log_payloads: config.log_payloads,
            receive_limit: source.receive_limit,
            retention: source.retention,
        },
    )
    .with_dlq_limit(dlq_limit)
    .with_heartbeat(config.heartbeat)
    .with_visibility_timeout(source.visibility);
    let processor = match first_read {
        Some(r) => processor.with_first_read(r),
        None => processor,
    };
    Ok(Environment {
        processor,
        queue_url,
        calls,
        retry,
        startup_warnings: checks.warnings,
        source_visibility: source.visibility,
    })
}

/// One breaker store per job type, each with that type's breaker settings and its own cache.
fn breaker_stores(
    registry: &Registry,
    ddb_client: &aws_sdk_dynamodb::Client,
    table: &str,
    retry: &StorageRetry,
    clock: &Clock,
) -> Arc<HashMap<String, BreakerStore>> {
    registry
        .job_types()
        .filter_map(|t| registry.route(t).map(|r| (t, r)))
        .map(|(t, r)| {
            (
                t.to_owned(),
                BreakerStore::new(ddb_client.clone(), table, retry.clone())
                    .with_config(r.breaker)
                    .with_clock(clock.clone()),
            )
        })
        .collect::<HashMap<_, _>>()
        .into()
}

/// The table's check (the first breaker read), started now and awaited at the first
/// admission: it overlaps the rest of start-up, the poll for the first event and its read.
fn start_first_read(
    config: &Config,
    breakers: &Arc<HashMap<String, BreakerStore>>,
    ddb_client: &aws_sdk_dynamodb::Client,
    retry: &StartupRetry,
    table: &str,
) -> FirstRead {
    let check = table_check(Arc::clone(breakers), ddb_client.clone(), retry.clone(), table.to_owned());
    let (table, emf) = (table.to_owned(), config.emf);
    FirstRead::start(async move { settle_table_check(check.await, &table, emf) })
}

/// The registry with the configuration's policies, done markers and EventBridge types, its
/// EventBridge mapping checked.
fn configured_registry(config: &Config, registry: Registry) -> Result<Registry, RuntimeError> {
    let registry = registry
        .configured(&config.policy, config.breaker)
        .configured_done_markers(&config.done_marker_types, config.done_marker_ttl)
        .with_configured_eventbridge_types(&config.eventbridge_types);
    registry.eventbridge_types().check().map_err(|e| {
        format!("EventBridge job types (Registry::eventbridge_type / TRIAGE_EVENTBRIDGE_TYPES): {e}")
    })?;
    Ok(registry)
}

/// One warning per EventBridge detail-type mapped to a job type without a handler.
fn eventbridge_warnings(registry: &Registry) -> Vec<String> {
    registry
        .eventbridge_types()
        .iter()
        .filter(|(_, t)| registry.route(t).is_none())
        .map(|(d, t)| {
            format!(
                "EventBridge events of detail-type `{d}` map to job type `{t}`, which has no handler: \
                 they will be dead-lettered as invalid (check TRIAGE_EVENTBRIDGE_TYPES)"
            )
        })
        .collect()
}

/// The source queue, the DLQ and the table a start-up checks.
struct StartupNames<'a> {
    queue_url: &'a str,
    dlq_url: &'a str,
    table: &'a str,
}

/// What start-up read: the source queue, the DLQ's attributes (`None`: its size configured,
/// not read) and the table's check (`None`: left running, see [`FirstRead`]).
struct StartupReads {
    source: Result<SourceQueue, StorageError>,
    dlq: Option<Result<HashMap<QueueAttributeName, String>, StorageError>>,
    table: Option<Result<(), StorageError>>,
}

/// Start-up's reads retry on a budget of their own, so a throttled start-up leaves the
/// batches' budget whole. In Lambda they end by one deadline inside the init's 10 s (a check
/// still failing then is skipped or refused as for a service that does not answer), and each
/// try is short, so a stalled request is tried again within it.
#[derive(Clone)]
struct StartupRetry {
    retry: StorageRetry,
    deadline: Option<Instant>,
}

impl StartupRetry {
    fn new(config: &Config) -> Self {
        let deadline = config.startup_deadline.map(|d| Instant::now() + d);
        let retry = match deadline {
            Some(_) => StorageRetry::default().with_attempt_timeout(STARTUP_ATTEMPT_TIMEOUT),
            None => StorageRetry::default(),
        };
        Self { retry, deadline }
    }
}

/// The table's check: the read of the breakers a first batch would make (the first 10 job
/// types'), so such a batch then reads none of them within the breaker cache's lifetime.
/// Without a job type to read, a probe.
async fn table_check(
    breakers: Arc<HashMap<String, BreakerStore>>,
    ddb_client: aws_sdk_dynamodb::Client,
    startup: StartupRetry,
    table: String,
) -> Result<(), StorageError> {
    let StartupRetry { retry, deadline } = startup;
    crate::effects::storage_retry::clients::load_root_certificates().await;
    match crate::effects::breaker_store::warm(&breakers, &retry, deadline).await {
        Ok(0) => probe_table(&ddb_client, &retry, &table, deadline).await,
        read => read.map(|_| ()),
    }
}

/// The outcome of a table check left running: one that could not be made is skipped with a
/// warning and counted, as at start-up; a misconfigured table is the start-up error.
fn settle_table_check(check: Result<(), StorageError>, table: &str, emf: bool) -> Result<(), StartupError> {
    let mut checks = StartupChecks {
        warnings: Vec::new(),
        skipped: 0,
    };
    let settled = checks.check_table(check, table);
    for w in &checks.warnings {
        tracing::warn!(startup_check = "degraded", "{w}");
    }
    if checks.skipped > 0 {
        emit_startup_metric(checks.skipped, emf);
    }
    settled
}

/// Reads what start-up needs and is not configured, all at once, so a cold start waits for
/// the slowest read alone.
async fn startup_reads(
    config: &Config,
    names: &StartupNames<'_>,
    sqs_client: &aws_sdk_sqs::Client,
    ddb_client: &aws_sdk_dynamodb::Client,
    breakers: &Arc<HashMap<String, BreakerStore>>,
    startup: &StartupRetry,
) -> StartupReads {
    let (startup_retry, deadline) = (&startup.retry, startup.deadline);
    let attrs = |url: String, names: Vec<QueueAttributeName>| {
        let c = sqs_client.clone();
        let retry = startup_retry.clone();
        async move {
            retry
                .call("GetQueueAttributes", deadline, || {
                    c.get_queue_attributes()
                        .queue_url(&url)
                        .set_attribute_names(Some(names.clone()))
                        .send()
                })
                .await
                .map(|o| o.attributes.unwrap_or_default())
        }
    };
    // A queue is read only when what start-up needs of it is not configured (the stacks
    // configure both).
    let source_read = async {
        match config.source_queue {
            Some(facts) => Ok(SourceQueue::configured(facts)),
            None => attrs(
                names.queue_url.to_owned(),
                vec![
                    QueueAttributeName::MessageRetentionPeriod,
                    QueueAttributeName::RedrivePolicy,
                    QueueAttributeName::QueueArn,
                    QueueAttributeName::VisibilityTimeout,
                ],
            )
            .await
            .map(|a| SourceQueue::read(&a)),
        }
    };
    let dlq_read = async {
        match config.dlq_max_bytes {
            Some(_) => None,
            None => Some(
                attrs(
                    names.dlq_url.to_owned(),
                    vec![
                        QueueAttributeName::MaximumMessageSize,
                        QueueAttributeName::MessageRetentionPeriod,
                        QueueAttributeName::QueueArn,
                    ],
                )
                .await,
            ),
        }
    };
    let table_check = async {
        match config.first_read_at_admission {
            true => None,
            false => Some(
                table_check(
                    Arc::clone(breakers),
                    ddb_client.clone(),
                    startup.clone(),
                    names.table.to_owned(),
                )
                .await,
            ),
        }
    };
    let (source, dlq, table) = tokio::join!(source_read, dlq_read, table_check);
    StartupReads { source, dlq, table }
}

/// Start-up's findings so far: the warnings, and how many checks were skipped.
struct StartupChecks {
    warnings: Vec<String>,
    skipped: u64,
}

impl StartupChecks {
    /// Checks every policy against the source queue's retention, the holds against what the
    /// queue keeps, and the heartbeat against its visibility timeout.
    fn check_source_queue(
        &mut self,
        config: &Config,
        registry: &Registry,
        source: &SourceQueue,
        queue_url: &str,
    ) -> Result<(), RuntimeError> {
        if let Some(retention) = source.retention {
            registry.check_retention(retention).map_err(|e| {
                let of = if config.source_queue.is_some() {
                    " (TRIAGE_QUEUE_RETENTION_S)"
                } else {
                    ""
                };
                format!("retry policy rejected for {queue_url}{of}: {e}")
            })?;
        }
        if let (Some(retention), Some(visibility), Some(max_receive)) =
            (source.retention, source.visibility, source.receive_limit)
        {
            // A worker receives with at least its minimum visibility timeout.
            let hold = redrive::unsettled_hold(
                visibility.max(super::worker::MIN_VISIBILITY),
                config.heartbeat,
                TICKS_AHEAD,
            );
            redrive::check_holds(max_receive, hold, retention).map_err(|e| {
                let (var, of) = match config.source_queue {
                    Some(_) => (
                        "TRIAGE_QUEUE_MAX_RECEIVE",
                        " (TRIAGE_QUEUE_RETENTION_S, TRIAGE_QUEUE_VISIBILITY_S, TRIAGE_QUEUE_MAX_RECEIVE)",
                    ),
                    None => ("TRIAGE_QUEUE_URL", ""),
                };
                StartupError {
                    var,
                    message: format!(
                        "{var}: the source queue {queue_url}{of} cannot dead-letter what it keeps: {e}"
                    ),
                    misconfigured: true,
                }
            })?;
        }
        if let (Some(every), Some(v)) = (config.heartbeat, source.visibility) {
            if every >= v {
                let (of, or) = match config.source_queue {
                    Some(_) => (
                        " (TRIAGE_QUEUE_VISIBILITY_S)",
                        " (or check TRIAGE_QUEUE_VISIBILITY_S against the queue)",
                    ),
                    None => ("", ""),
                };
                self.warnings.push(format!(
                    "TRIAGE_HEARTBEAT_S ({} s) is not shorter than the source queue's visibility timeout{of} ({} s): \
                     a message may be visible again before the heartbeat's first tick extends it; lower TRIAGE_HEARTBEAT_S{or}",
                    every.as_secs(),
                    v.as_secs()
                ));
            }
        }
        Ok(())
    }

    /// Checks the DLQ against the source queue (not the same queue, the one its redrive
    /// policy names, a retention long enough) and returns its size limit.
    fn dlq_limit(
        &mut self,
        config: &Config,
        dlq: Option<Result<HashMap<QueueAttributeName, String>, StorageError>>,
        source: &SourceQueue,
        names: &StartupNames<'_>,
    ) -> Result<DlqLimit, RuntimeError> {
        let (queue_url, dlq_url) = (names.queue_url, names.dlq_url);
        let source_arn = source.arn.as_deref();
        let target = source.redrive_target.as_deref();
        let mismatched_target = |target: &str, dlq: &str| {
            format!(
                "the source queue's RedrivePolicy sends to {target}, not to TRIAGE_DLQ_URL ({dlq}): \
                 jobs SQS moves after maxReceiveCount land there without a failure record, \
                 apart from the ones dead-lettered here; point both at one queue (`triage setup` does)"
            )
        };
        match dlq {
            // The size configured: the DLQ is not read. Its identity is checked against what the
            // source queue's answer says, by the account and name in its URL.
            None => {
                if let Some(arn) = source_arn {
                    if url_names_arn(dlq_url, arn) {
                        return Err(source_as_dlq(queue_url).into());
                    }
                }
                if let Some(target) = target.filter(|t| !url_names_arn(dlq_url, t)) {
                    self.warnings.push(mismatched_target(target, dlq_url));
                }
                Ok(DlqLimit::known(
                    config
                        .dlq_max_bytes
                        .unwrap_or(crate::effects::dlq::FALLBACK_MAX_MESSAGE_BYTES),
                ))
            }
            Some(Ok(a)) => {
                if let Some(d) = a.get(&QueueAttributeName::QueueArn) {
                    // The source queue configured (not read): its URL against the DLQ's ARN.
                    if source_arn.map_or(url_names_arn(queue_url, d), |s| s == d) {
                        return Err(source_as_dlq(queue_url).into());
                    }
                    if let Some(target) = target.filter(|t| t != d) {
                        self.warnings.push(mismatched_target(target, d));
                    }
                }
                check_dlq_keeps_source(&a, source, names)?;
                Ok(
                    match a
                        .get(&QueueAttributeName::MaximumMessageSize)
                        .and_then(|v| v.parse().ok())
                    {
                        Some(bytes) => DlqLimit::known(bytes),
                        None => DlqLimit::unknown(),
                    },
                )
            }
            Some(Err(e)) if e.is_unavailable() => {
                self.skipped += 1;
                self.warnings.push(format!(
                    "cannot check the DLQ {dlq_url} (TRIAGE_DLQ_URL) at start-up ({e}): running without \
                     the check; its message size limit is read at the first DLQ send"
                ));
                Ok(DlqLimit::unknown())
            }
            Some(Err(e)) => Err(queue_error(e, "TRIAGE_DLQ_URL", "the DLQ", dlq_url).into()),
        }
    }

    /// The table's check: skipped with a warning when the table could not be reached.
    fn check_table(&mut self, table_check: Result<(), StorageError>, table: &str) -> Result<(), StartupError> {
        match table_check {
            Ok(()) => Ok(()),
            Err(e) if e.is_unavailable() => {
                self.skipped += 1;
                self.warnings.push(format!(
                    "cannot check the table {table} (TRIAGE_TABLE) at start-up ({e}): running without the check"
                ));
                Ok(())
            }
            Err(e) => Err(table_error(e, table)),
        }
    }
}

/// The DLQ must keep a message at least as long as the source queue may have kept it.
fn check_dlq_keeps_source(
    dlq: &HashMap<QueueAttributeName, String>,
    source: &SourceQueue,
    names: &StartupNames<'_>,
) -> Result<(), StartupError> {
    let dlq_retention = dlq
        .get(&QueueAttributeName::MessageRetentionPeriod)
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs);
    if let (Some(source_retention), Some(dlq_retention)) = (source.retention, dlq_retention) {
        let (queue_url, dlq_url) = (names.queue_url, names.dlq_url);
        let fifo = queue_url.trim_end_matches('/').ends_with(".fifo");
        redrive::check_dlq_retention(source_retention, dlq_retention, fifo).map_err(|e| StartupError {
            var: "TRIAGE_DLQ_URL",
            message: format!("TRIAGE_DLQ_URL: the DLQ {dlq_url} of {queue_url}: {e}"),
            misconfigured: true,
        })?;
    }
    Ok(())
}

/// What start-up knows of the source queue: configured ([`QueueFacts`]) or read.
struct SourceQueue {
    retention: Option<Duration>,
    visibility: Option<Duration>,
    receive_limit: Option<u32>,
    /// Its `QueueArn`, when read.
    arn: Option<String>,
    /// Where its redrive policy sends, when read.
    redrive_target: Option<String>,
}

impl SourceQueue {
    fn configured(facts: QueueFacts) -> Self {
        Self {
            retention: Some(facts.retention),
            visibility: Some(facts.visibility),
            receive_limit: facts.max_receive,
            arn: None,
            redrive_target: None,
        }
    }

    fn read(attributes: &HashMap<QueueAttributeName, String>) -> Self {
        let secs = |name| {
            attributes
                .get(&name)
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_secs)
        };
        let redrive = attributes.get(&QueueAttributeName::RedrivePolicy);
        Self {
            retention: secs(QueueAttributeName::MessageRetentionPeriod),
            visibility: secs(QueueAttributeName::VisibilityTimeout),
            receive_limit: redrive.and_then(|p| max_receive_count(p)),
            arn: attributes.get(&QueueAttributeName::QueueArn).cloned(),
            redrive_target: redrive.and_then(|p| dead_letter_target(p)),
        }
    }
}

fn source_as_dlq(queue_url: &str) -> StartupError {
    StartupError {
        var: "TRIAGE_DLQ_URL",
        message: format!(
            "TRIAGE_DLQ_URL names the source queue {queue_url} (TRIAGE_QUEUE_URL): a dead-lettered job would \
             come back as a new delivery forever; set TRIAGE_DLQ_URL to the DLQ `triage setup` printed"
        ),
        misconfigured: true,
    }
}

/// A failed read of a queue at start-up, as a [`StartupError`] naming `var`.
fn queue_error(e: StorageError, var: &'static str, what: &str, url: &str) -> StartupError {
    let message = if e.is_not_found() {
        format!("{var}: {what} {url} does not exist: check {var} (`triage setup` prints it)")
    } else if e.is_unavailable() {
        format!("{var}: cannot reach {what} {url} at start-up: {e}")
    } else {
        format!(
            "{var}: cannot read {what} {url} ({e}): check {var} and that this role may call \
             sqs:GetQueueAttributes on it"
        )
    };
    StartupError {
        var,
        message,
        misconfigured: !e.is_unavailable(),
    }
}

/// A failed table probe at start-up (a permanent failure), as a [`StartupError`].
fn table_error(e: StorageError, table: &str) -> StartupError {
    let message = if e.is_not_found() {
        format!("TRIAGE_TABLE: table {table} does not exist: run `triage setup` or check TRIAGE_TABLE")
    } else if e.code() == Some("ValidationException") {
        format!(
            "TRIAGE_TABLE: table {table} is not a state table: its key schema is not a string `pk` \
             partition key and a string `sk` sort key ({}); create one with `triage setup`",
            e.message
        )
    } else {
        format!(
            "TRIAGE_TABLE: cannot read table {table} ({e}): check TRIAGE_TABLE and that this role may \
             call dynamodb:GetItem on it"
        )
    };
    StartupError {
        var: "TRIAGE_TABLE",
        message,
        misconfigured: true,
    }
}

/// Checks that `table` exists with the state table's key: one `GetItem` of a key no item
/// has (an eventually consistent read of half a capacity unit, an action the runtimes' role
/// already has). A missing table answers `ResourceNotFoundException`, another key schema
/// `ValidationException`.
async fn probe_table(
    client: &aws_sdk_dynamodb::Client,
    retry: &StorageRetry,
    table: &str,
    deadline: Option<Instant>,
) -> Result<(), StorageError> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let key = std::collections::HashMap::from([
        (PK.to_owned(), AttributeValue::S("triage#startup-probe".into())),
        (SK.to_owned(), AttributeValue::S("probe".into())),
    ]);
    retry
        .call("GetItem", deadline, || {
            client
                .get_item()
                .return_consumed_capacity(aws_sdk_dynamodb::types::ReturnConsumedCapacity::Total)
                .table_name(table)
                .set_key(Some(key.clone()))
                .projection_expression("#pk")
                .expression_attribute_names("#pk", PK)
                .send()
        })
        .await
        .map(|_| ())
}

/// Prints one EMF line counting the start-up checks that could not be made, in the Lambda
/// runtime (whose stdout CloudWatch reads) and in a worker with `TRIAGE_EMF` on.
fn emit_startup_metric(skipped: u64, emf: bool) {
    let lambda = std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some();
    if !(lambda || emf) {
        return;
    }
    let line = serde_json::json!({
        "StartupChecksSkipped": skipped,
        "_aws": {
            "Timestamp": crate::clock::now_ms(),
            "CloudWatchMetrics": [{
                "Namespace": crate::effects::metrics::NAMESPACE,
                "Dimensions": [[]],
                "Metrics": [{"Name": "StartupChecksSkipped", "Unit": "Count"}],
            }],
        },
    });
    print_emf(&line.to_string());
}

/// The `deadLetterTargetArn` of a queue's `RedrivePolicy`.
fn dead_letter_target(policy: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(policy).ok()?;
    v.get("deadLetterTargetArn")?.as_str().map(str::to_owned)
}

/// The `maxReceiveCount` of a queue's `RedrivePolicy` (SQS writes it as a number or a
/// string).
fn max_receive_count(policy: &str) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(policy).ok()?;
    match v.get("maxReceiveCount")? {
        serde_json::Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Sets up `tracing` the way Lambda's advanced logging controls expect, as
/// `lambda_runtime`'s own subscriber reads them: JSON lines when `AWS_LAMBDA_LOG_FORMAT=JSON`,
/// text otherwise; the level from `AWS_LAMBDA_LOG_LEVEL` when set (the function's log level
/// setting: `TRACE` to `ERROR`, `FATAL` read as `ERROR`), else `RUST_LOG` (any `EnvFilter`
/// directives), else `info`. Unlike that subscriber, text carries colour codes only when
/// stderr is a terminal: CloudWatch, files and pipes show them as garbage. Lines go to
/// stderr, keeping stdout for EMF metric lines.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let lambda_level = std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .ok()
        .and_then(|v| lambda_log_level(&v));
    let filter = match lambda_level {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = if json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder.with_target(false).try_init()
    };
}

/// Prints one EMF metric line to stdout. Under Lambda's JSON log format
/// (`AWS_LAMBDA_LOG_FORMAT=JSON`) the line carries a `level` that Lambda's application log
/// level filter keeps, and the RFC 3339 `timestamp` without which Lambda ignores the level:
/// Lambda files a JSON line without both as INFO and drops it when the function's log level
/// (`AWS_LAMBDA_LOG_LEVEL`) is WARN or above, which would lose the metrics (and the alarms and
/// dashboard that read them). The level is INFO, or the function's log level when that is
/// higher.
pub(crate) fn print_emf(line: &str) {
    static LEVEL: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    let level = LEVEL.get_or_init(|| {
        emf_level(
            std::env::var("AWS_LAMBDA_LOG_FORMAT").ok().as_deref(),
            std::env::var("AWS_LAMBDA_LOG_LEVEL").ok().as_deref(),
        )
    });
    match level.and_then(|l| leveled(line, l, std::time::SystemTime::now())) {
        Some(leveled) => println!("{leveled}"),
        None => println!("{line}"),
    }
}

/// `line` (a JSON object) with `level` and an RFC 3339 `timestamp` of `now` put first; `None`
/// when it is not a JSON object with at least one key.
fn leveled(line: &str, level: &str, now: std::time::SystemTime) -> Option<String> {
    let rest = line.strip_prefix('{')?;
    if !rest.trim_start().starts_with('"') {
        return None;
    }
    let timestamp = aws_smithy_types::DateTime::from(now)
        .fmt(aws_smithy_types::date_time::Format::DateTime)
        .ok()?;
    Some(format!(
        "{{\"level\":\"{level}\",\"timestamp\":\"{timestamp}\",{rest}"
    ))
}

/// The `level` of EMF lines for a log format and an `AWS_LAMBDA_LOG_LEVEL` (see [`print_emf`]):
/// none outside the JSON format, else INFO or the function's level when higher.
fn emf_level(format: Option<&str>, level: Option<&str>) -> Option<&'static str> {
    if !format.is_some_and(|f| f.trim().eq_ignore_ascii_case("json")) {
        return None;
    }
    Some(match level.map(|l| l.trim().to_ascii_uppercase()).as_deref() {
        Some("WARN") => "WARN",
        Some("ERROR") => "ERROR",
        Some("FATAL") => "FATAL",
        _ => "INFO",
    })
}

/// The `tracing` level of an `AWS_LAMBDA_LOG_LEVEL` value (Lambda's application log levels).
fn lambda_log_level(v: &str) -> Option<&'static str> {
    Some(match v.trim().to_ascii_uppercase().as_str() {
        "TRACE" => "trace",
        "DEBUG" => "debug",
        "INFO" => "info",
        "WARN" => "warn",
        "ERROR" | "FATAL" => "error",
        _ => return None,
    })
}

/// Installs the process's panic hook, in place of Rust's default one (which prints the panic
/// message, and so whatever payload value a handler put in it, to stderr). A panic is logged
/// through `tracing` at error level with its location and thread, and its message cut to
/// 256 characters with every quoted span masked, as error texts are (the processor still
/// turns a handler's panic into a fatal failure of that record alone). With `log_payloads`
/// (`TRIAGE_LOG_PAYLOADS=true`) the message is logged in full. Before `tracing` is set up
/// the same line goes to stderr.
pub fn install_panic_hook(log_payloads: bool) {
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("non-string panic payload");
        let message = panic_text(text, log_payloads);
        let location = info
            .location()
            .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
            .unwrap_or_else(|| "unknown".into());
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        if tracing::dispatcher::has_been_set() {
            tracing::error!(location = %location, thread, panic = %message, "panicked");
        } else {
            eprintln!("panicked at {location} (thread {thread}): {message}");
        }
    }));
}

/// A panic message as logged. `{:?}` output escapes the quotes nested in a quoted value
/// (`Error("invalid type: string \"x\"")`); they are read as part of the outer quoted span,
/// so the whole span is masked.
fn panic_text(text: &str, log_payloads: bool) -> String {
    if log_payloads {
        return text.to_owned();
    }
    crate::processor::loggable(&text.replace("\\\"", "\u{2033}"), false)
}

#[cfg(test)]
mod panic_tests {
    use super::{emf_level, lambda_log_level, leveled, panic_text};

    #[test]
    fn emf_lines_carry_a_level_lambdas_filter_keeps_under_the_json_format() {
        assert_eq!(emf_level(None, Some("ERROR")), None);
        assert_eq!(emf_level(Some("Text"), Some("ERROR")), None);
        assert_eq!(emf_level(Some("JSON"), None), Some("INFO"));
        assert_eq!(emf_level(Some("json"), Some("debug")), Some("INFO"));
        assert_eq!(emf_level(Some("JSON"), Some("INFO")), Some("INFO"));
        assert_eq!(emf_level(Some("JSON"), Some("warn")), Some("WARN"));
        assert_eq!(emf_level(Some("JSON"), Some("ERROR")), Some("ERROR"));
        assert_eq!(emf_level(Some("JSON"), Some("FATAL")), Some("FATAL"));
    }

    #[test]
    fn a_leveled_emf_line_keeps_its_keys_and_gets_an_rfc3339_timestamp() {
        use aws_smithy_types::DateTime;
        use aws_smithy_types::date_time::Format;
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_796_157_693_683);
        let line = r#"{"A":1,"_aws":{"Timestamp":1796157693683}}"#;
        let out = leveled(line, "WARN", now).expect("an object line");
        let v: serde_json::Value = serde_json::from_str(&out).expect("still JSON");
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["A"], 1);
        assert_eq!(v["_aws"]["Timestamp"], 1_796_157_693_683u64);
        let ts = v["timestamp"].as_str().expect("a timestamp");
        let parsed = DateTime::from_str(ts, Format::DateTime).expect("RFC 3339");
        assert_eq!(parsed.to_millis().ok(), Some(1_796_157_693_683));
        assert_eq!(leveled("{}", "INFO", now), None);
        assert_eq!(leveled("not json", "INFO", now), None);
    }

    #[test]
    fn lambda_log_levels_map_to_tracing_levels() {
        assert_eq!(lambda_log_level("WARN"), Some("warn"));
        assert_eq!(lambda_log_level("fatal"), Some("error"));
        assert_eq!(lambda_log_level(" debug "), Some("debug"));
        assert_eq!(lambda_log_level(""), None);
        assert_eq!(lambda_log_level("loud"), None);
    }

    #[test]
    fn panic_messages_are_masked_and_cut_unless_payloads_are_logged() {
        // `panic!("{payload:?}")` and `.unwrap()` on a decode error.
        let debug = format!("bad job: {:?}", "s3cr3t");
        let unwrap = format!(
            "called `Result::unwrap()` on an `Err` value: {:?}",
            serde_json::from_str::<u32>("\"s3cr3t\"").unwrap_err()
        );
        for text in [debug.as_str(), unwrap.as_str()] {
            let masked = panic_text(text, false);
            assert!(!masked.contains("s3cr3t"), "{text} -> {masked}");
            assert_eq!(panic_text(text, true), text);
        }
        assert_eq!(panic_text(&debug, false), "bad job: \"…\"");
        let long = "x".repeat(1_000);
        assert_eq!(panic_text(&long, false).chars().count(), 256);
        assert_eq!(panic_text(&long, true), long);
    }
}
