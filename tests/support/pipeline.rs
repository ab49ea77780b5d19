//! A pipeline on the local stack: fresh queue, DLQ and table, a registry whose handlers
//! record every execution, and a driver that behaves like Lambda's SQS event source mapping
//! (receive a batch, invoke the handler, delete what was not reported failed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsBatchResponse;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use sqs_triage::clock::now_ms;
use sqs_triage::config::Config;
use sqs_triage::core::breaker::BreakerConfig;
use sqs_triage::core::policy::RetryPolicy;
use sqs_triage::core::{Backoff, JobError};
use sqs_triage::effects::storage_retry::{dynamodb_config, sqs_config};
use sqs_triage::processor::registry::{JobContext, Registry};
use sqs_triage::runtime::env::{Environment, build_with};
use sqs_triage::runtime::lambda;
use triage::demo::chaos::{self, ChaosPayload};
use triage::ops::Ctx;

/// The job type whose executions the harness records.
pub const RECORDED: &str = "test.recorded";

/// Executions seen by the recording handler: (job id, attempt), in order.
pub type Log = Arc<Mutex<Vec<(String, u32)>>>;

/// A fresh stack of resources and a processor over them.
pub struct Harness {
    pub env: Environment,
    pub sqs: aws_sdk_sqs::Client,
    pub queue_url: String,
    pub dlq_url: String,
    pub table: String,
    pub log: Log,
}

/// Everything a [`Harness`] can be built with.
pub struct Options<'a> {
    /// Prefix of the queue and table names.
    pub prefix: &'a str,
    /// FIFO queues.
    pub fifo: bool,
    /// Policy of every job type.
    pub policy: RetryPolicy,
    /// Breaker settings of every job type.
    pub breaker: BreakerConfig,
    /// Changes to the configuration.
    pub tweak: Box<dyn FnOnce(Config) -> Config + 'a>,
    /// More job types (gets the execution log).
    pub register: Box<dyn FnOnce(Registry, Log) -> Registry + 'a>,
    /// SQS endpoint of the processor's client (e.g. a fault proxy).
    pub sqs_endpoint: Option<String>,
    /// DynamoDB endpoint of the processor's client (e.g. a fault proxy).
    pub ddb_endpoint: Option<String>,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Self {
            prefix: "h",
            fifo: false,
            policy: fast_policy(5),
            breaker: quiet_breaker(),
            tweak: Box::new(|c| c),
            register: Box::new(|r, _| r),
            sqs_endpoint: None,
            ddb_endpoint: None,
        }
    }
}

/// A fast policy: `attempts` in all, 1 s × 2 up to 4 s, no jitter.
pub fn fast_policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .max_attempts(attempts)
        .backoff(Backoff::exponential(
            Duration::from_secs(1),
            2.0,
            Duration::from_secs(4),
            Duration::ZERO,
        ))
        .max_delay(Duration::from_secs(4))
        .build()
        .unwrap()
}

/// A breaker that never opens in these tests unless asked to.
pub fn quiet_breaker() -> BreakerConfig {
    BreakerConfig::builder().min_executions(100_000).build().unwrap()
}

impl Harness {
    /// Creates queue, DLQ and table; registers the chaos job type (as `triage.chaos`) and a
    /// recording chaos handler (as [`RECORDED`]).
    pub async fn new(prefix: &str, fifo: bool, policy: RetryPolicy, breaker: BreakerConfig) -> Self {
        Self::with(prefix, fifo, policy, breaker, |c| c).await
    }

    /// Like [`Harness::new`], with a chance to change the configuration (e.g. the DLQ URL).
    pub async fn with(
        prefix: &str,
        fifo: bool,
        policy: RetryPolicy,
        breaker: BreakerConfig,
        tweak: impl FnOnce(Config) -> Config,
    ) -> Self {
        Self::build(Options {
            prefix,
            fifo,
            policy,
            breaker,
            tweak: Box::new(tweak),
            ..Options::default()
        })
        .await
    }

    /// The general form: every knob of [`Options`].
    pub async fn build(opts: Options<'_>) -> Self {
        let sdk = super::sdk_config().await;
        let ctx = Ctx::from_config(&sdk).unwrap();
        let created = super::fresh_resources(opts.prefix, opts.fifo).await;
        let sqs = ctx.sqs.clone();
        let mut config = Config::from_lookup(&|_| None).unwrap();
        config.queue_url = Some(created.queue_url.clone());
        config.dlq_url = Some(created.dlq_url.clone());
        config.table = Some(created.table.clone());
        let config = (opts.tweak)(config);
        let log: Log = Arc::default();
        let recorded = log.clone();
        let (policy, breaker) = (opts.policy, opts.breaker);
        let registry = chaos::register(Registry::new(policy.clone(), breaker), policy.clone(), breaker)
            .handle_with(
                RECORDED,
                policy,
                breaker,
                move |p: ChaosPayload, ctx: JobContext| {
                    recorded.lock().unwrap().push((ctx.job_id.clone(), ctx.attempt));
                    chaos::run(p, ctx)
                },
            );
        let registry = (opts.register)(registry, log.clone());
        let mut sqs_conf = sqs_config(&sdk);
        if let Some(url) = opts.sqs_endpoint {
            sqs_conf = sqs_conf.endpoint_url(url);
        }
        let mut ddb_conf = dynamodb_config(&sdk);
        if let Some(url) = opts.ddb_endpoint {
            ddb_conf = ddb_conf.endpoint_url(url);
        }
        let env = build_with(&config, registry, sqs_conf, ddb_conf).await.unwrap();
        Self {
            env,
            sqs,
            queue_url: created.queue_url,
            dlq_url: created.dlq_url,
            table: created.table,
            log,
        }
    }

    /// Executions of one job so far.
    pub fn executions(&self, job_id: &str) -> Vec<u32> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(j, _)| j == job_id)
            .map(|(_, a)| *a)
            .collect()
    }

    /// Sends raw bodies (with an optional FIFO group each).
    pub async fn send_raw(&self, bodies: &[(&str, Option<&str>)]) {
        for (i, (body, group)) in bodies.iter().enumerate() {
            let mut req = self
                .sqs
                .send_message()
                .queue_url(&self.queue_url)
                .message_body(*body);
            if let Some(g) = group {
                req = req
                    .message_group_id(*g)
                    .message_deduplication_id(format!("d{i}-{}", now_ms()));
            }
            req.send().await.unwrap();
        }
    }

    /// Sends envelopes of the recording job type: (job id, chaos payload).
    pub async fn send_jobs(&self, jobs: &[(&str, Value)]) {
        let bodies: Vec<String> = jobs
            .iter()
            .map(|(id, p)| json!({"type": RECORDED, "id": id, "payload": p}).to_string())
            .collect();
        let refs: Vec<(&str, Option<&str>)> = bodies.iter().map(|b| (b.as_str(), None)).collect();
        self.send_raw(&refs).await;
    }

    /// Receives up to 10 messages (waiting up to `wait`), as the event source mapping does.
    pub async fn receive(&self, queue_url: &str, wait: Duration) -> Vec<Message> {
        self.sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait.as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default()
    }

    /// One event source mapping poll: receive a batch, invoke the Lambda handler with it,
    /// delete every record not in `batchItemFailures`. Returns the messages and the response.
    pub async fn invoke_once(&self, wait: Duration) -> Option<(Vec<Message>, SqsBatchResponse)> {
        let messages = self.receive(&self.queue_url, wait).await;
        if messages.is_empty() {
            return None;
        }
        let response = self
            .invoke_with(&messages, Duration::from_secs(60))
            .await
            .expect("handler answered");
        self.delete_settled(&messages, &response).await;
        Some((messages, response))
    }

    /// Receives from the source queue until `n` messages are in hand, as an event source
    /// mapping's batching window gathers a batch: SQS may hand out fewer per receive than it
    /// holds. Panics when fewer than `n` arrive within 30 s, or more.
    pub async fn receive_n(&self, n: usize) -> Vec<Message> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut messages = Vec::new();
        while messages.len() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "only {} of {n} messages arrived",
                messages.len()
            );
            messages.extend(self.receive(&self.queue_url, Duration::from_secs(1)).await);
        }
        assert_eq!(messages.len(), n, "more messages than the {n} expected");
        messages
    }

    /// One event source mapping poll of a gathered batch: [`Harness::receive_n`], then the
    /// handler invoked with those `n` messages and the settled ones deleted.
    pub async fn invoke_gathered(&self, n: usize) -> (Vec<Message>, SqsBatchResponse) {
        let messages = self.receive_n(n).await;
        let response = self
            .invoke_with(&messages, Duration::from_secs(60))
            .await
            .expect("handler answered");
        self.delete_settled(&messages, &response).await;
        (messages, response)
    }

    /// Deletes the messages a batch response did not report failed, as the event source
    /// mapping does. Returns the ids it reported failed.
    pub async fn delete_settled<'a>(
        &self,
        messages: &[Message],
        response: &'a SqsBatchResponse,
    ) -> Vec<&'a str> {
        let failed = failed_ids(response);
        for m in messages
            .iter()
            .filter(|m| !failed.contains(&m.message_id().unwrap()))
        {
            self.sqs
                .delete_message()
                .queue_url(&self.queue_url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
        failed
    }

    /// One event source mapping poll through another environment over the same resources:
    /// the messages given, `time_left` before the deadline, settled ones deleted.
    pub async fn invoke_env(
        &self,
        env: &Environment,
        messages: &[Message],
        time_left: Duration,
    ) -> SqsBatchResponse {
        let response = invoke(env, messages, &self.queue_url, time_left)
            .await
            .expect("handler answered");
        self.delete_settled(messages, &response).await;
        response
    }

    /// Sets the source queue's redrive policy to its DLQ with `max_receive_count` (an
    /// environment reads it at start-up: build one after this).
    pub async fn set_redrive(&self, max_receive_count: u32) {
        let dlq_arn = self
            .sqs
            .get_queue_attributes()
            .queue_url(&self.dlq_url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn]
            .clone();
        self.sqs
            .set_queue_attributes()
            .queue_url(&self.queue_url)
            .attributes(
                aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy,
                json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count}).to_string(),
            )
            .send()
            .await
            .unwrap();
    }

    /// Invokes the Lambda handler with these messages and `time_left` before the deadline.
    pub async fn invoke_with(
        &self,
        messages: &[Message],
        time_left: Duration,
    ) -> Result<SqsBatchResponse, String> {
        invoke(&self.env, messages, &self.queue_url, time_left).await
    }

    /// Makes received messages visible again at once (visibility 0), as a consumer that gives
    /// them back does.
    pub async fn release<'a>(&self, queue_url: &str, messages: impl IntoIterator<Item = &'a Message>) {
        for m in messages {
            self.sqs
                .change_message_visibility()
                .queue_url(queue_url)
                .receipt_handle(m.receipt_handle().unwrap())
                .visibility_timeout(0)
                .send()
                .await
                .unwrap();
        }
    }

    /// Approximate visible + in-flight + delayed messages in a queue.
    pub async fn depth(&self, queue_url: &str) -> u64 {
        super::queue_depth(&self.sqs, queue_url).await.total()
    }

    /// Reads every DLQ message, then makes them visible again: receives, holding what it got,
    /// until a receive comes back empty after waiting a second. SQS may hand out fewer messages
    /// per receive than the queue holds; held messages cannot come back to be read twice.
    pub async fn dlq_messages(&self) -> Vec<Message> {
        let mut all: HashMap<String, Message> = HashMap::new();
        loop {
            let batch = self
                .sqs
                .receive_message()
                .queue_url(&self.dlq_url)
                .max_number_of_messages(10)
                .visibility_timeout(60)
                .wait_time_seconds(1)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .unwrap()
                .messages
                .unwrap_or_default();
            if batch.is_empty() {
                break;
            }
            for m in batch {
                all.insert(m.message_id().unwrap().to_owned(), m);
            }
        }
        self.release(&self.dlq_url, all.values()).await;
        all.into_values().collect()
    }
}

pub use super::lambda_event::lambda_event;

/// Invokes the Lambda handler of `env` with these messages and `time_left` before the deadline.
pub async fn invoke(
    env: &Environment,
    messages: &[Message],
    queue_url: &str,
    time_left: Duration,
) -> Result<SqsBatchResponse, String> {
    let event = lambda_event(messages, queue_url);
    let mut context = Context::default();
    context.deadline = now_ms() + time_left.as_millis() as u64;
    lambda::handle(&env.processor, LambdaEvent::new(event, context))
        .await
        .map_err(|e| e.to_string())
}

/// The message ids a batch response reports failed.
pub fn failed_ids(response: &SqsBatchResponse) -> Vec<&str> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect()
}

/// A handler error for tests that need one.
pub fn transient(msg: &str) -> JobError {
    JobError::transient(msg.to_owned())
}
