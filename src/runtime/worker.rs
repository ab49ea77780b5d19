//! The long-polling worker: the Lambda adapter's pipeline for hosts outside Lambda.
//!
//! A batch's deadline follows its messages' visibility, which the heartbeat extends; a handler
//! still running at the report margin before it is stopped, so every record is settled before
//! another consumer can receive it. On SIGINT/SIGTERM the worker stops receiving, releases what
//! has not started and waits for the rest. Receive failures back off; a permanent one that lasts
//! [`Worker::with_give_up_after`] ends it. See `examples/worker.rs`.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use rand::Rng;
use tokio::sync::{OnceCell, mpsc, watch};
use tokio::time::Instant;

use super::RuntimeError;
use super::env::{Environment, build, init_tracing, install_panic_hook, sdk_config};
use crate::clock::now_ms;
use crate::config::Config;
use crate::effects::aws_errors::OVER_LIMIT;
use crate::effects::storage_retry::{FailureKind, StorageError, classify};
use crate::processor::registry::Registry;
use crate::processor::{BatchOutcome, Deadline, Incoming};

/// The shortest visibility timeout the worker receives with: a batch needs that long to
/// start, run and settle a handler within the margins it keeps — a message that arrives
/// during a long poll starts its batch's clock up to [`RECEIVE_LATENCY`] early, then the
/// default start margin (2 s), the report margin (1.5 s) and [`DELETE_MARGIN`] come off,
/// and a handler still needs time to run. A source queue with a shorter one is received
/// from with this one instead (a warning at start-up).
pub const MIN_VISIBILITY: Duration = Duration::from_secs(10);

/// Time kept between a batch's deadline and the end of its messages' visibility timeout,
/// for deleting the settled ones.
pub const DELETE_MARGIN: Duration = Duration::from_secs(1);

/// How long before its answer arrives SQS may have started a received message's visibility
/// timeout (the answer's way back): the batch's clock starts that much before the answer,
/// never before the request was sent.
pub const RECEIVE_LATENCY: Duration = Duration::from_secs(2);

/// How often, at most, an empty long poll is followed by a short poll, which SQS answers
/// `OverLimit` when the queue is at its in-flight limit (a long poll then returns nothing): an
/// idle worker makes one more receive a minute, and a full queue is named within a minute.
pub const IN_FLIGHT_PROBE_EVERY: Duration = Duration::from_secs(60);

/// First wait after a failed receive; it doubles on each further failure.
pub(crate) const RECEIVE_BACKOFF_BASE: Duration = Duration::from_secs(1);

/// Longest wait between failed receives.
pub(crate) const RECEIVE_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How long receives may fail with a permanent error before the worker exits, by default.
pub const DEFAULT_GIVE_UP_AFTER: Duration = Duration::from_secs(300);

/// How the worker polls.
#[derive(Debug, Clone, Copy)]
pub struct WorkerOptions {
    /// Long-poll wait per receive (0 to 20 s).
    pub wait: Duration,
    /// Messages per receive (1 to 10).
    pub max_messages: i32,
    /// Print EMF metric lines to stdout after each batch.
    pub emf: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            wait: Duration::from_secs(20),
            max_messages: 10,
            emf: false,
        }
    }
}

/// Why a worker stopped with an error, with the kind the CLI maps to its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerError {
    /// What kind of failure.
    pub kind: WorkerErrorKind,
    /// One line for the operator.
    pub message: String,
}

/// The kinds of [`WorkerError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerErrorKind {
    /// The worker's configuration does not allow running.
    Config,
    /// The source queue does not exist.
    NotFound,
    /// Any other failure (access denied, an answer the worker cannot use).
    Failed,
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for WorkerError {}

impl WorkerError {
    fn from_storage(e: &StorageError, context: &str) -> Self {
        Self {
            kind: if e.is_not_found() {
                WorkerErrorKind::NotFound
            } else {
                WorkerErrorKind::Failed
            },
            message: format!("{context}: {e}"),
        }
    }
}

/// A worker over one environment. Clones share the environment, the visibility timeout read
/// at start-up and the drain flag.
#[derive(Debug, Clone)]
pub struct Worker {
    env: Environment,
    opts: WorkerOptions,
    batches: usize,
    give_up_after: Duration,
    visibility: Arc<OnceCell<Duration>>,
}

/// One receive's messages and when their visibility timeout ends.
struct Received {
    records: Vec<Incoming>,
    visible_until: Instant,
}

/// The `ReceiveRequestAttemptId` of a FIFO receive: kept for that receive's retries after a
/// lost answer (SQS then hands out the same messages again instead of hiding their groups
/// for a visibility timeout), replaced after a success or an answer SQS will not repeat
/// (throttling, a client error).
#[derive(Debug, Default)]
struct AttemptId(Option<String>);

impl AttemptId {
    fn current(&mut self) -> String {
        self.0
            .get_or_insert_with(|| format!("{:032x}", rand::rng().random::<u128>()))
            .clone()
    }
}

/// Permanent receive failures seen by the pollers of one `run`.
#[derive(Debug, Default)]
struct Health {
    /// Failed receives since the last success.
    failures: u32,
    /// The first permanent failure since the last success.
    failing_since: Option<Instant>,
}

/// The source queue's visibility timeout `v`, but at least [`MIN_VISIBILITY`] (warned).
fn at_least_min(url: &str, v: Duration) -> Duration {
    if v < MIN_VISIBILITY {
        tracing::warn!(
            queue = %url,
            visibility_s = v.as_secs(),
            "the source queue's visibility timeout is too short for a batch to start, run and settle a handler: the worker receives with {} s instead",
            MIN_VISIBILITY.as_secs()
        );
        return MIN_VISIBILITY;
    }
    v
}

impl Worker {
    /// A worker for `registry` with `config` (e.g. [`Config::from_env`]): builds the clients
    /// from `sdk` and checks the queues and the table once, as [`run`] does at start-up. An
    /// unusable configuration is an error before any receive. Logging and the panic hook are
    /// the caller's.
    pub async fn from_config(
        config: &Config,
        registry: Registry,
        sdk: &aws_config::SdkConfig,
    ) -> Result<Self, RuntimeError> {
        let env = build(config, registry, sdk).await?;
        let opts = WorkerOptions {
            emf: config.emf,
            ..WorkerOptions::default()
        };
        Ok(Self::new(env, opts))
    }

    /// A worker polling `env`'s source queue, one batch in flight per [`run`](Self::run),
    /// giving up after [`DEFAULT_GIVE_UP_AFTER`] of permanent receive failures.
    pub fn new(env: Environment, opts: WorkerOptions) -> Self {
        let visibility = match env.source_visibility {
            Some(v) => OnceCell::new_with(Some(at_least_min(&env.queue_url, v))),
            None => OnceCell::new(),
        };
        Self {
            env,
            opts,
            batches: 1,
            give_up_after: DEFAULT_GIVE_UP_AFTER,
            visibility: Arc::new(visibility),
        }
    }

    /// Keeps up to `n` batches in flight in [`run`](Self::run) (at least 1): each is
    /// received, processed and deleted on its own, so a slow record holds back the deletes
    /// of its own batch only, and not the next receive. Each batch runs up to the
    /// environment's concurrency records at once.
    pub fn with_batches(mut self, n: usize) -> Self {
        self.batches = n.max(1);
        self
    }

    /// Ends [`run`](Self::run) with an error once receives have failed with a permanent
    /// error (queue deleted, access denied) for this long without a success between.
    /// Throttling, server errors and timeouts are retried without limit.
    pub fn with_give_up_after(mut self, d: Duration) -> Self {
        self.give_up_after = d;
        self
    }

    /// Sets the visibility heartbeat of this worker's batches (`None`: off; docs/handlers.md).
    /// With it, a handler runs past the receive's visibility timeout while every extension
    /// succeeds, up to SQS's 12-hour limit; without it, a handler still running near the end of
    /// the visibility timeout is stopped (a transient failure).
    pub fn with_heartbeat(mut self, every: Option<Duration>) -> Self {
        self.env.processor = self.env.processor.with_heartbeat(every);
        self
    }

    /// The environment (processor, queue, call counter).
    pub fn env(&self) -> &Environment {
        &self.env
    }

    /// The visibility timeout the worker receives with: the source queue's, configured
    /// (`TRIAGE_QUEUE_VISIBILITY_S`) or read with `GetQueueAttributes` on first use and kept,
    /// but at least [`MIN_VISIBILITY`]. Every
    /// receive asks for it explicitly, so a later change of the queue's setting does not
    /// shorten a batch under the worker. Fails when the queue cannot be read.
    pub async fn visibility_timeout(&self) -> Result<Duration, WorkerError> {
        self.visibility
            .get_or_try_init(|| self.read_visibility())
            .await
            .copied()
    }

    async fn read_visibility(&self) -> Result<Duration, WorkerError> {
        let sqs = self.env.processor.sqs();
        let url = &self.env.queue_url;
        let attrs = sqs
            .retry()
            .call("GetQueueAttributes", None, || {
                sqs.client()
                    .get_queue_attributes()
                    .queue_url(url)
                    .attribute_names(QueueAttributeName::VisibilityTimeout)
                    .send()
            })
            .await
            .map_err(|e| {
                WorkerError::from_storage(
                    &e.with_resource(url),
                    "cannot read the source queue's visibility timeout",
                )
            })?
            .attributes
            .unwrap_or_default();
        let secs = attrs
            .get(&QueueAttributeName::VisibilityTimeout)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| WorkerError {
                kind: WorkerErrorKind::Failed,
                message: format!("the source queue {url} did not report its visibility timeout"),
            })?;
        Ok(at_least_min(url, Duration::from_secs(secs)))
    }

    /// Receives one batch (long poll), processes it, deletes what is settled.
    pub async fn poll_once(&self) -> Result<Option<BatchOutcome>, RuntimeError> {
        let visibility = self.visibility_timeout().await?;
        let received = self
            .receive(visibility, self.opts.wait, &mut AttemptId::default())
            .await?;
        if received.records.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.process(received).await))
    }

    async fn receive(
        &self,
        visibility: Duration,
        wait: Duration,
        attempt: &mut AttemptId,
    ) -> Result<Received, StorageError> {
        let sqs = self.env.processor.sqs();
        let fifo = self.env.processor.is_fifo();
        let id = Mutex::new(fifo.then(|| attempt.current()));
        let sent = Mutex::new(Instant::now());
        let visibility_s = visibility.as_secs().min(43_200) as i32;
        let out = sqs
            .retry()
            .call("ReceiveMessage", None, || {
                *sent.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                let call = sqs
                    .client()
                    .receive_message()
                    .queue_url(&self.env.queue_url)
                    .max_number_of_messages(self.opts.max_messages.clamp(1, 10))
                    .wait_time_seconds(wait.as_secs().min(20) as i32)
                    .visibility_timeout(visibility_s)
                    .set_receive_request_attempt_id(id.lock().unwrap_or_else(|e| e.into_inner()).clone())
                    .message_system_attribute_names(MessageSystemAttributeName::All)
                    .message_attribute_names("All")
                    .send();
                let id = &id;
                async move {
                    let answer = call.await;
                    if let (true, Err(e)) = (fifo, &answer) {
                        // Only a lost answer may be asked for again with the same id.
                        if classify(e) != FailureKind::Transient {
                            *id.lock().unwrap_or_else(|e| e.into_inner()) =
                                Some(AttemptId::default().current());
                        }
                    }
                    answer
                }
            })
            .await;
        let arrived = Instant::now();
        let sent = *sent.lock().unwrap_or_else(|e| e.into_inner());
        let out = match out {
            Ok(out) => {
                attempt.0 = None;
                out
            }
            Err(e) => {
                attempt.0 = id.into_inner().unwrap_or_else(|e| e.into_inner());
                return Err(e.with_resource(&self.env.queue_url));
            }
        };
        let started = arrived.checked_sub(RECEIVE_LATENCY).map_or(sent, |t| t.max(sent));
        Ok(Received {
            records: out
                .messages
                .unwrap_or_default()
                .into_iter()
                .map(Incoming::from_sdk)
                .collect(),
            visible_until: started + visibility,
        })
    }

    async fn process(&self, received: Received) -> BatchOutcome {
        let sqs = self.env.processor.sqs();
        let receipts: Vec<String> = received
            .records
            .iter()
            .map(|r| r.receipt_handle.clone())
            .collect();
        // The batch's deadline follows its messages' visibility: the heartbeat moves both.
        let deadline = Deadline::visibility(received.visible_until, DELETE_MARGIN);
        let outcome = self
            .env
            .processor
            .process_within(received.records, deadline)
            .await;
        let visible_until = outcome.visible_until.unwrap_or(received.visible_until);
        let settled: Vec<(usize, String)> = outcome
            .records
            .iter()
            .enumerate()
            .filter(|(i, r)| r.settled && !outcome.deleted.contains(i))
            .map(|(i, _)| (i, receipts[i].clone()))
            .collect();
        let deleted = sqs
            .delete(&self.env.queue_url, settled, Some(visible_until))
            .await;
        for (i, why) in deleted.failed {
            tracing::warn!(message_id = %outcome.records[i].message_id, error = %why, "delete failed; the message will be seen again");
        }
        if self.opts.emf {
            for line in outcome.metrics.emf_lines(now_ms()) {
                println!("{line}");
            }
        }
        outcome
    }

    /// Polls until `shutdown` resolves, calling `on_batch` after each batch.
    ///
    /// Reads the source queue's visibility timeout first unless it is configured (an error if
    /// it cannot be read). Keeps up to [`with_batches`](Self::with_batches) batches in flight.
    /// A shutdown during a receive stops it at once (messages SQS handed to that receive
    /// come back after their visibility timeout); during a batch, the records not started
    /// are released and the running ones finish or are stopped at the batch's deadline, so
    /// `run` returns within the longer of the visibility timeout and three heartbeat ticks
    /// (the farthest an extension accepted before the shutdown reaches; no tick is sent after
    /// it), plus the delete margin. Returns an error when receives have
    /// failed with a permanent error for longer than
    /// [`with_give_up_after`](Self::with_give_up_after) (after finishing the batches in
    /// flight the same way).
    pub async fn run<F>(
        &self,
        shutdown: F,
        mut on_batch: impl FnMut(&BatchOutcome),
    ) -> Result<(), RuntimeError>
    where
        F: Future<Output = ()>,
    {
        tokio::pin!(shutdown);
        let visibility = tokio::select! {
            v = self.visibility_timeout() => v?,
            () = &mut shutdown => return Ok(()),
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let (out_tx, mut out_rx) = mpsc::unbounded_channel();
        let health = Mutex::new(Health::default());
        let pollers = futures::future::join_all((0..self.batches).map(|_| {
            let (stop, out) = (stop_rx.clone(), out_tx.clone());
            let (health, stop_tx) = (&health, &stop_tx);
            async move {
                let r = self.poll_loop(visibility, stop, health, out).await;
                if r.is_err() {
                    let _ = stop_tx.send(true);
                }
                r
            }
        }));
        drop(out_tx);
        let consume = async {
            let mut stopping = false;
            loop {
                tokio::select! {
                    () = &mut shutdown, if !stopping => {
                        stopping = true;
                        tracing::info!("stopping: releasing records not started, finishing the batches in flight");
                        let _ = stop_tx.send(true);
                    }
                    o = out_rx.recv() => match o {
                        Some(o) => on_batch(&o),
                        None => break,
                    },
                }
            }
        };
        let (results, ()) = tokio::join!(pollers, consume);
        match results.into_iter().find_map(Result::err) {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// One receive–process–delete loop of `run`.
    async fn poll_loop(
        &self,
        visibility: Duration,
        mut stop: watch::Receiver<bool>,
        health: &Mutex<Health>,
        out: mpsc::UnboundedSender<BatchOutcome>,
    ) -> Result<(), WorkerError> {
        let mut attempt = AttemptId::default();
        // At SQS's in-flight limit long polls return nothing: after an empty one, a short poll
        // (at most every IN_FLIGHT_PROBE_EVERY) tells an idle queue from a full one.
        let mut probe_at = Instant::now();
        let mut short_next = false;
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let wait = if short_next {
                probe_at = Instant::now() + IN_FLIGHT_PROBE_EVERY;
                Duration::ZERO
            } else {
                self.opts.wait
            };
            short_next = false;
            let received = tokio::select! {
                r = self.receive(visibility, wait, &mut attempt) => r,
                () = stopped(&mut stop) => return Ok(()),
            };
            let received = match received {
                Ok(r) => {
                    *health.lock().unwrap_or_else(|e| e.into_inner()) = Health::default();
                    r
                }
                Err(e) => {
                    if e.code() == Some(OVER_LIMIT) {
                        self.report_in_flight_limit();
                    }
                    let (wait, last) = self.after_failure(&e, health)?;
                    let retry_in_ms = wait.as_millis() as u64;
                    if last {
                        tracing::warn!(error = %e, retry_in_ms, "receive failed; trying once more before giving up");
                    } else {
                        tracing::warn!(error = %e, retry_in_ms, "receive failed; retrying");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(wait) => continue,
                        () = stopped(&mut stop) => return Ok(()),
                    }
                }
            };
            if received.records.is_empty() {
                short_next = !wait.is_zero() && Instant::now() >= probe_at;
                continue;
            }
            let batch = self.process(received);
            tokio::pin!(batch);
            let outcome = tokio::select! {
                o = &mut batch => o,
                () = stopped(&mut stop) => {
                    self.env.processor.drain();
                    batch.await
                }
            };
            let _ = out.send(outcome);
        }
    }

    /// Says that the source queue is at SQS's in-flight limit: a warning naming the cause, and
    /// an `InFlightLimitReached` metric with EMF on. Every job type waits meanwhile, not only
    /// the one whose retries and deferrals fill the queue.
    fn report_in_flight_limit(&self) {
        tracing::warn!(
            queue = %self.env.queue_url,
            "the source queue holds as many in-flight messages as SQS allows (OverLimit): no job of \
             any type is received until held messages are settled or come back; retries and breaker \
             deferrals are held in flight, so look for a job type that keeps failing or deferring \
             (`triage breaker status`, the Deferred and Retried metrics); receives go on with backoff"
        );
        if self.opts.emf {
            let line = serde_json::json!({
                "InFlightLimitReached": 1,
                "_aws": {
                    "Timestamp": now_ms(),
                    "CloudWatchMetrics": [{
                        "Namespace": crate::effects::metrics::NAMESPACE,
                        "Dimensions": [[]],
                        "Metrics": [{"Name": "InFlightLimitReached", "Unit": "Count"}],
                    }],
                },
            });
            super::env::print_emf(&line.to_string());
        }
    }

    /// The wait before the next receive after a failed one (and whether it is the last try
    /// before giving up), or the error that ends the worker: a permanent failure that has
    /// lasted the give-up time. The backoff grows with the failures of all the pollers of a
    /// `run`, so more batches in flight do not mean more requests to a failing queue.
    fn after_failure(
        &self,
        e: &StorageError,
        health: &Mutex<Health>,
    ) -> Result<(Duration, bool), WorkerError> {
        let now = Instant::now();
        let mut h = health.lock().unwrap_or_else(|e| e.into_inner());
        h.failures = h.failures.saturating_add(1);
        let wait = receive_backoff(h.failures, &mut rand::rng());
        if e.kind != FailureKind::Permanent {
            return Ok((wait, false));
        }
        let failing = now - *h.failing_since.get_or_insert(now);
        if failing >= self.give_up_after {
            return Err(WorkerError::from_storage(
                e,
                &format!(
                    "giving up: receives from the source queue have failed for {} s",
                    failing.as_secs()
                ),
            ));
        }
        // Try once more when the give-up time ends, so the worker exits on time.
        let left = self.give_up_after - failing;
        Ok(if wait >= left { (left, true) } else { (wait, false) })
    }
}

/// Resolves when the stop flag is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The wait after receive failure number `n` (1 for the first): capped exponential from
/// [`RECEIVE_BACKOFF_BASE`] to [`RECEIVE_BACKOFF_MAX`], with equal jitter (uniform in the
/// upper half), so workers that failed together do not come back together.
pub(crate) fn receive_backoff(n: u32, rng: &mut impl Rng) -> Duration {
    let step = RECEIVE_BACKOFF_BASE
        .saturating_mul(1u32 << n.saturating_sub(1).min(16))
        .min(RECEIVE_BACKOFF_MAX);
    let ms = step.as_millis() as u64;
    Duration::from_millis(ms / 2 + rng.random_range(0..=ms / 2))
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// How a worker process runs (the `triage worker` flags).
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Batches in flight at once (see [`Worker::with_batches`]); default 2.
    pub batches: usize,
    /// See [`Worker::with_give_up_after`]; default [`DEFAULT_GIVE_UP_AFTER`].
    pub give_up_after: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            batches: 2,
            give_up_after: DEFAULT_GIVE_UP_AFTER,
        }
    }
}

/// Runs `registry` as a worker process: configuration from the environment, read once (the
/// same `TRIAGE_*` variables as the Lambda adapter, whose policies are a
/// [`Registry::default`]'s defaults; `TRIAGE_EMF=true` prints EMF metric lines), until
/// SIGINT/SIGTERM. An invalid variable ends it with an error before the first receive. The
/// worker counterpart of [`crate::runtime::lambda::run`].
pub async fn run(registry: Registry) -> Result<(), RuntimeError> {
    run_with(registry, RunOptions::default()).await
}

/// Like [`run`], with options.
pub async fn run_with(registry: Registry, opts: RunOptions) -> Result<(), RuntimeError> {
    init_tracing();
    let config = Config::from_env()?;
    install_panic_hook(config.log_payloads);
    let sdk = sdk_config().await;
    serve(&config, registry, &sdk, opts).await
}

async fn serve(
    config: &Config,
    registry: Registry,
    sdk: &aws_config::SdkConfig,
    opts: RunOptions,
) -> Result<(), RuntimeError> {
    let worker = Worker::from_config(config, registry, sdk)
        .await?
        .with_batches(opts.batches)
        .with_give_up_after(opts.give_up_after);
    let visibility = worker.visibility_timeout().await?;
    tracing::info!(
        queue = %worker.env.queue_url,
        visibility_s = visibility.as_secs(),
        heartbeat_s = worker.env.processor.heartbeat().map_or(0, |d| d.as_secs()),
        batches = worker.batches,
        "worker started"
    );
    worker.run(shutdown_signal(), |_| {}).await?;
    tracing::info!("worker stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    #[test]
    fn receive_backoff_doubles_with_jitter_up_to_its_cap() {
        let mut rng = SmallRng::seed_from_u64(7);
        for n in 1..40 {
            let step = (RECEIVE_BACKOFF_BASE * 2u32.pow(n.min(16) - 1)).min(RECEIVE_BACKOFF_MAX);
            let d = receive_backoff(n, &mut rng);
            assert!(
                d >= step / 2 && d <= step,
                "n={n}: {d:?} not in the upper half of {step:?}"
            );
        }
    }

    #[test]
    fn attempt_ids_are_kept_until_replaced() {
        let mut a = AttemptId::default();
        let first = a.current();
        assert_eq!(first.len(), 32);
        assert_eq!(a.current(), first);
        a.0 = None;
        assert_ne!(a.current(), first);
    }
}
