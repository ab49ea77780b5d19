//! Builds a processor from configuration, once per container (or worker process).

use std::sync::Arc;

use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_sqs::types::QueueAttributeName;

use super::RuntimeError;
use crate::config::Config;
use crate::core::envelope::EnvelopeLimits;
use crate::effects::breaker_store::BreakerStore;
use crate::effects::calls::CallCounter;
use crate::effects::ledger::AttemptLedger;
use crate::effects::sqs::Sqs;
use crate::effects::storage_retry::{StorageRetry, dynamodb_config, sqs_config};
use crate::processor::registry::Registry;
use crate::processor::{Processor, ProcessorConfig};

/// The DLQ size assumed when the queue's own limit cannot be read.
const FALLBACK_MAX_MESSAGE_BYTES: usize = 262_144;

/// Loads the standard AWS configuration (`AWS_REGION`, `AWS_ENDPOINT_URL*`, credentials).
pub async fn sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest()).load().await
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
}

/// Builds the processor for `registry` from `config`: SDK clients with the SDK's own retries
/// off (every call goes through one [`StorageRetry`]), the DLQ's size limit, and a check of
/// every policy against the source queue's retention period.
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
    let queue_url = Config::require(&config.queue_url, "TRIAGE_QUEUE_URL")?.to_owned();
    let dlq_url = Config::require(&config.dlq_url, "TRIAGE_DLQ_URL")?.to_owned();
    let table = Config::require(&config.table, "TRIAGE_TABLE")?.to_owned();
    let calls = CallCounter::new();
    let sqs_client = aws_sdk_sqs::Client::from_conf(sqs_conf.interceptor(calls.clone()).build());
    let ddb_client = aws_sdk_dynamodb::Client::from_conf(ddb_conf.interceptor(calls.clone()).build());
    let retry = StorageRetry::default();
    let sqs = Sqs::new(sqs_client.clone(), retry.clone());

    let attrs = |url: String, names: Vec<QueueAttributeName>| {
        let c = sqs_client.clone();
        let retry = retry.clone();
        async move {
            retry
                .call("GetQueueAttributes", None, || {
                    c.get_queue_attributes()
                        .queue_url(&url)
                        .set_attribute_names(Some(names.clone()))
                        .send()
                })
                .await
                .map(|o| o.attributes.unwrap_or_default())
        }
    };
    let (source, dlq) = tokio::join!(
        attrs(
            queue_url.clone(),
            vec![
                QueueAttributeName::MessageRetentionPeriod,
                QueueAttributeName::RedrivePolicy
            ]
        ),
        attrs(dlq_url.clone(), vec![QueueAttributeName::MaximumMessageSize]),
    );
    let source =
        source.map_err(|e| format!("cannot read the source queue {queue_url} (TRIAGE_QUEUE_URL): {e}"))?;
    let retention = source
        .get(&QueueAttributeName::MessageRetentionPeriod)
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs);
    if let Some(retention) = retention {
        registry
            .check_retention(retention)
            .map_err(|e| format!("retry policy rejected for {queue_url}: {e}"))?;
    }
    let receive_limit = source
        .get(&QueueAttributeName::RedrivePolicy)
        .and_then(|p| max_receive_count(p));
    let dlq_max_bytes = match dlq {
        Ok(a) => a
            .get(&QueueAttributeName::MaximumMessageSize)
            .and_then(|v| v.parse().ok())
            .unwrap_or(FALLBACK_MAX_MESSAGE_BYTES),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the DLQ's size limit; assuming {FALLBACK_MAX_MESSAGE_BYTES} bytes");
            FALLBACK_MAX_MESSAGE_BYTES
        }
    };

    let ledger = AttemptLedger::new(ddb_client.clone(), &table, retry.clone());
    // One store per job type, each with that type's breaker settings and its own cache.
    let breakers = registry
        .job_types()
        .filter_map(|t| registry.route(t).map(|r| (t, r)))
        .map(|(t, r)| {
            (
                t.to_owned(),
                BreakerStore::new(ddb_client.clone(), &table, retry.clone()).with_config(r.breaker),
            )
        })
        .collect();
    let processor = Processor::new(
        Arc::new(registry),
        sqs,
        ledger,
        breakers,
        ProcessorConfig {
            source_queue: queue_url.clone(),
            dlq_url,
            dlq_max_bytes,
            concurrency: config.concurrency,
            limits: EnvelopeLimits::default(),
            log_payloads: config.log_payloads,
            receive_limit,
            retention,
        },
    );
    Ok(Environment {
        processor,
        queue_url,
        calls,
        retry,
    })
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

/// Sets up `tracing`: JSON lines when `AWS_LAMBDA_LOG_FORMAT=JSON`, text otherwise; the
/// level from `RUST_LOG` (default `info`).
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
    use super::panic_text;

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
