//! Helpers shared by the integration tests (each test crate uses a subset).
//!
//! The tests talk to the local stack (moto for SQS, DynamoDB Local), started with
//! `bash infra/local/stack.sh start` and configured by
//! `eval "$(bash infra/local/stack.sh env)"`.
//!
//! Every SQS call of a test goes through one strict proxy per test process
//! ([`sqs_endpoint`], [`fault_proxy::strict`]): moto is more lenient than SQS (it expires
//! nothing, honours old receipt handles, checks no characters, has no in-flight cap and forgets
//! a FIFO deduplication id once its message is deleted), and a test that passes on moto must
//! pass on SQS. The clients of [`sdk_config`] reach it; a child process reaches it when started
//! with [`strict_env`]. A [`fault_proxy::FaultProxy`] started on [`sqs_endpoint`] injects its
//! faults in front of the rules.

#![allow(dead_code)]

pub mod fault_proxy;
pub mod lambda_event;
pub mod pipeline;
pub mod runtime_api;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::retry::RetryConfig;
use aws_config::{BehaviorVersion, SdkConfig};

const NOT_RUNNING: &str = "local stack not running: run `bash infra/local/stack.sh start` and \
     `eval \"$(bash infra/local/stack.sh env)\"`, or use the README's test command";

fn required_env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!("{NOT_RUNNING} ({name} is not set)"),
    }
}

/// The repository's root, where the library package, events/, infra/ and docs/ are. These
/// tests are targets of the `triage` package (triage/), its child folder.
pub fn repo_root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the triage package is a folder of the repository")
}

/// Set in a child process of a test to its parent's strict proxy, so the child (a test
/// binary run again) uses that proxy rather than starting one in front of it.
pub const STRICT_SQS_ENV: &str = "SQS_TRIAGE_TEST_STRICT_SQS";

/// moto's own SQS endpoint (`AWS_ENDPOINT_URL_SQS`), without the strict rules: for the tests
/// of those rules, which look at what moto holds. Panics with instructions when unset.
pub fn moto_sqs_endpoint() -> String {
    required_env("AWS_ENDPOINT_URL_SQS")
}

/// The strict proxy in front of moto, one per test process, started on first use.
pub fn strict_sqs() -> &'static fault_proxy::FaultProxy {
    static STRICT: std::sync::OnceLock<fault_proxy::FaultProxy> = std::sync::OnceLock::new();
    STRICT.get_or_init(|| fault_proxy::FaultProxy::start_strict(&moto_sqs_endpoint()))
}

/// The SQS endpoint every test uses: the process's strict proxy in front of moto (see the
/// module's comment), or the parent's in a child started with [`strict_env`]. Panics with
/// instructions when the stack's variables are unset.
pub fn sqs_endpoint() -> String {
    match std::env::var(STRICT_SQS_ENV) {
        Ok(v) if !v.is_empty() => v,
        _ => strict_sqs().url(),
    }
}

/// Points a child process's SQS calls at the strict proxy ([`sqs_endpoint`]). A later
/// `.env("AWS_ENDPOINT_URL_SQS", ..)` (a test's fault proxy) still wins.
pub fn strict_env(cmd: &mut std::process::Command) -> &mut std::process::Command {
    let url = sqs_endpoint();
    cmd.env("AWS_ENDPOINT_URL_SQS", &url).env(STRICT_SQS_ENV, url)
}

/// The endpoint override behind [`sdk_config`]: SQS's endpoint is the strict proxy, every
/// other service's is read from the environment as the SDK reads it.
#[derive(Debug)]
struct StrictServiceConfig {
    sqs: String,
}

impl aws_types::service_config::LoadServiceConfig for StrictServiceConfig {
    fn load_config(&self, key: aws_types::service_config::ServiceConfigKey<'_>) -> Option<String> {
        let service = key.service_id().to_ascii_uppercase().replace(' ', "_");
        if key.env() == "AWS_ENDPOINT_URL" && service == "SQS" {
            return Some(self.sqs.clone());
        }
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        var(&format!("{}_{service}", key.env())).or_else(|| var(key.env()))
    }
}

/// DynamoDB Local's endpoint (`AWS_ENDPOINT_URL_DYNAMODB`); panics with instructions when unset.
pub fn ddb_endpoint() -> String {
    required_env("AWS_ENDPOINT_URL_DYNAMODB")
}

/// STS for the local stack: `AWS_ENDPOINT_URL_STS`, else moto's SQS endpoint (moto's server
/// answers STS too). Tests that run `triage` pass it to the child, so audited commands know
/// who is calling whether or not the shell's environment predates the variable.
pub fn sts_endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL_STS")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(sqs_endpoint)
}

/// The SDK configuration from the environment that `stack.sh env` prints (region,
/// fake credentials, per-service endpoints). Panics with instructions when the
/// stack's variables are missing.
pub async fn sdk_config() -> SdkConfig {
    let sqs = sqs_endpoint();
    ddb_endpoint();
    aws_config::defaults(BehaviorVersion::latest())
        .load()
        .await
        .into_builder()
        .service_config(StrictServiceConfig { sqs })
        .build()
}

/// A fault proxy in front of DynamoDB Local, and a DynamoDB client (the crate's storage
/// configuration) that goes through it.
pub async fn ddb_via_proxy() -> (fault_proxy::FaultProxy, aws_sdk_dynamodb::Client) {
    let conf = sdk_config().await;
    let proxy = fault_proxy::FaultProxy::start(&ddb_endpoint());
    let client = aws_sdk_dynamodb::Client::from_conf(
        sqs_triage::effects::storage_retry::dynamodb_config(&conf)
            .endpoint_url(proxy.url())
            .build(),
    );
    (proxy, client)
}

/// Standard retry mode with `max_attempts` in all and millisecond backoffs, so tests
/// that inject faults stay fast.
pub fn fast_retry(max_attempts: u32) -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(max_attempts)
        .with_initial_backoff(Duration::from_millis(5))
        .with_max_backoff(Duration::from_millis(50))
}

/// SQS client for the local stack (endpoint from the environment), SDK default retries.
pub async fn sqs_client() -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&sdk_config().await)
}

/// DynamoDB client for the local stack (endpoint from the environment), SDK default retries.
pub async fn ddb_client() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config().await)
}

/// SQS client sending to `endpoint` (e.g. a [`fault_proxy::FaultProxy::url`]), SDK default retries.
pub async fn sqs_client_via(endpoint: &str) -> aws_sdk_sqs::Client {
    let conf = aws_sdk_sqs::config::Builder::from(&sdk_config().await)
        .endpoint_url(endpoint)
        .build();
    aws_sdk_sqs::Client::from_conf(conf)
}

/// DynamoDB client sending to `endpoint`, SDK default retries.
pub async fn ddb_client_via(endpoint: &str) -> aws_sdk_dynamodb::Client {
    let conf = aws_sdk_dynamodb::config::Builder::from(&sdk_config().await)
        .endpoint_url(endpoint)
        .build();
    aws_sdk_dynamodb::Client::from_conf(conf)
}

/// SQS client sending to `endpoint` with the given retry configuration.
pub async fn sqs_client_via_with(endpoint: &str, retry: RetryConfig) -> aws_sdk_sqs::Client {
    let conf = aws_sdk_sqs::config::Builder::from(&sdk_config().await)
        .endpoint_url(endpoint)
        .retry_config(retry)
        .build();
    aws_sdk_sqs::Client::from_conf(conf)
}

/// DynamoDB client sending to `endpoint` with the given retry configuration.
pub async fn ddb_client_via_with(endpoint: &str, retry: RetryConfig) -> aws_sdk_dynamodb::Client {
    let conf = aws_sdk_dynamodb::config::Builder::from(&sdk_config().await)
        .endpoint_url(endpoint)
        .retry_config(retry)
        .build();
    aws_sdk_dynamodb::Client::from_conf(conf)
}

/// A name unique to this test run and call: `<prefix>-<pid>-<millis>-<counter>`, valid as
/// an SQS queue name (≤ 80 chars of `[A-Za-z0-9_-]` for a short prefix) and a table name.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{prefix}-{}-{}-{n}", std::process::id(), millis % 1_000_000_000)
}

/// Spawns `cmd` (a `triage-lambda` command).
pub fn spawn_lambda_binary(cmd: &mut std::process::Command) -> std::io::Result<std::process::Child> {
    cmd.spawn()
}

/// A fresh source queue, DLQ and state table on the local stack, named after `prefix`.
pub async fn fresh_resources(prefix: &str, fifo: bool) -> triage::ops::setup::SetupReport {
    try_fresh_resources(prefix, fifo).await.unwrap()
}

/// [`fresh_resources`], with a missing stack or a refused set-up as an error (the benchmark
/// report prints it as a section it could not measure).
pub async fn try_fresh_resources(
    prefix: &str,
    fifo: bool,
) -> Result<triage::ops::setup::SetupReport, String> {
    for name in ["AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_DYNAMODB"] {
        if std::env::var(name).map_or(true, |v| v.is_empty()) {
            return Err(format!("{NOT_RUNNING} ({name} is not set)"));
        }
    }
    let ctx = triage::ops::Ctx::from_config(&sdk_config().await).map_err(|e| e.to_string())?;
    let name = unique_name(prefix);
    let opts = triage::ops::setup::SetupOptions {
        queue: name.clone(),
        dlq: format!("{name}-dlq"),
        table: name,
        fifo,
        max_receive_count: 1000,
    };
    triage::ops::setup::setup(&ctx, &opts)
        .await
        .map_err(|e| format!("setup: {e}"))
}

/// Approximate message counts of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueDepth {
    /// `ApproximateNumberOfMessages`.
    pub visible: u64,
    /// `ApproximateNumberOfMessagesNotVisible`.
    pub in_flight: u64,
    /// `ApproximateNumberOfMessagesDelayed`.
    pub delayed: u64,
}

impl QueueDepth {
    /// Every message the queue holds.
    pub fn total(&self) -> u64 {
        self.visible + self.in_flight + self.delayed
    }
}

/// Every attribute of `queue_url`, in one `GetQueueAttributes`.
pub async fn all_attributes(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
) -> std::collections::HashMap<aws_sdk_sqs::types::QueueAttributeName, String> {
    sqs.get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()
}

/// The approximate counts of `queue_url`, in one `GetQueueAttributes`.
pub async fn queue_depth(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> QueueDepth {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .attribute_names(A::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap_or_default();
    let get = |k: A| attrs.get(&k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    QueueDepth {
        visible: get(A::ApproximateNumberOfMessages),
        in_flight: get(A::ApproximateNumberOfMessagesNotVisible),
        delayed: get(A::ApproximateNumberOfMessagesDelayed),
    }
}

/// SQS's own in-flight cap (about 120,000 messages per queue).
pub const SQS_IN_FLIGHT_CAP: u64 = 120_000;

/// Every message `queue_url` hands out now, with all system and message attributes, read
/// with a `visibility` timeout long enough not to be handed out twice and never deleted:
/// receives until one comes back empty after waiting `wait_s` seconds. The read holds every
/// message in flight at once, so the strict proxy's cap for the queue becomes SQS's own: a
/// small cap would end the read early at an empty long poll.
pub async fn read_all(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    visibility: i32,
    wait_s: i32,
) -> Vec<aws_sdk_sqs::types::Message> {
    if std::env::var_os(STRICT_SQS_ENV).is_none() {
        strict_sqs().set_in_flight_cap(queue_url, SQS_IN_FLIGHT_CAP);
    }
    let mut out = Vec::new();
    loop {
        let got = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(visibility)
            .wait_time_seconds(wait_s)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        if got.is_empty() {
            return out;
        }
        out.extend(got);
    }
}

/// Receives and deletes (one `DeleteMessageBatch` per receive) every message of `queue_url`,
/// in the order receives hand them out (FIFO: a group's next messages come only once the
/// previous ones are deleted), with their message attributes. Stops at the first empty
/// receive once `want` messages arrived; until then keeps receiving for up to 10 s.
pub async fn drain(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    want: usize,
) -> Vec<aws_sdk_sqs::types::Message> {
    use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    loop {
        let got = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(120)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        if got.is_empty() {
            if out.len() >= want || std::time::Instant::now() > deadline {
                return out;
            }
            continue;
        }
        let deletes = got
            .iter()
            .enumerate()
            .map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(format!("d{i}"))
                    .receipt_handle(m.receipt_handle().unwrap())
                    .build()
                    .unwrap()
            })
            .collect();
        let r = sqs
            .delete_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(deletes))
            .send()
            .await
            .unwrap();
        assert!(r.failed().is_empty(), "{:?}", r.failed());
        out.extend(got);
    }
}

/// A table built by hand with string keys (`(name, Hash)` then optionally `(name, Range)`),
/// on-demand, without TTL: for tests that need a table other than the state table
/// (`effects::table::create_table` builds that one), e.g. a plain key-value table or one with
/// the wrong key schema.
pub async fn hand_table(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    keys: &[(&str, aws_sdk_dynamodb::types::KeyType)],
) {
    use aws_sdk_dynamodb::types::{AttributeDefinition, BillingMode, KeySchemaElement, ScalarAttributeType};
    let mut req = ddb
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest);
    for (name, kind) in keys {
        req = req
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(*name)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .unwrap(),
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(*name)
                    .key_type(kind.clone())
                    .build()
                    .unwrap(),
            );
    }
    req.send().await.expect("create table");
}

/// A queue that exists now, for a runtime to start with as its DLQ (start-up refuses a DLQ
/// that does not exist), and that the test deletes afterwards with [`delete_queue`] so every
/// send to it is refused (`NonExistentQueue`).
pub async fn queue_to_delete(prefix: &str, fifo: bool) -> String {
    let name = unique_name(prefix);
    // Kept 14 days, as `triage setup` makes a DLQ: start-up refuses a DLQ no longer kept than
    // its source.
    let mut req = sqs_client().await.create_queue().attributes(
        aws_sdk_sqs::types::QueueAttributeName::MessageRetentionPeriod,
        "1209600",
    );
    if fifo {
        req = req
            .queue_name(format!("{name}.fifo"))
            .attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true");
    } else {
        req = req.queue_name(name);
    }
    req.send()
        .await
        .expect("create queue")
        .queue_url
        .expect("queue url")
}

/// Deletes a queue (see [`queue_to_delete`]).
pub async fn delete_queue(url: &str) {
    sqs_client()
        .await
        .delete_queue()
        .queue_url(url)
        .send()
        .await
        .expect("delete queue");
}
