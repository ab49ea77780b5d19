//! Operator actions: setup, send, DLQ inspection and replay, breaker control, and the audit
//! trail of the actions that change state.
//!
//! Every action returns a report (plain data, `Serialize`) that [`output`] renders as a
//! human table or as JSON, or an [`OpsError`]: one line saying what is wrong and how to fix
//! it, with the exit code the CLI returns.

pub mod audit;
pub mod breaker;
pub mod dlq;
pub mod hints;
pub mod init;
pub mod output;
pub mod park;
pub mod send;
pub mod setup;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;

use sqs_triage::effects::breaker_store::BreakerStore;
use sqs_triage::effects::ledger::AttemptLedger;
use sqs_triage::effects::sqs::Sqs;
use sqs_triage::effects::storage_retry::{
    StorageError, StorageRetry, StorageRetryConfig, dynamodb_client, sqs_client,
};

/// How an operator action failed; decides the CLI's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad input, a missing variable or flag, or a refused confirmation (exit 2).
    Usage,
    /// A queue, table, message or job that does not exist (exit 3).
    NotFound,
    /// The endpoint cannot be reached (exit 4).
    Unreachable,
    /// Some of the selected messages were not sent, moved or deleted (exit 5).
    Incomplete,
    /// The endpoint does not implement the operation (exit 6).
    Unsupported,
    /// The action was done, but its audit item was not written (exit 7).
    NotAudited,
    /// Any other AWS or I/O failure (exit 1).
    Failed,
}

/// An operator-facing error: one line, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpsError {
    /// What kind of failure, for the exit code.
    pub kind: ErrorKind,
    /// The one-line message (no trailing newline, no `error:` prefix).
    pub message: String,
}

impl OpsError {
    /// An error of `kind` with `message`, flattened to one line.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: one_line(&message.into()),
        }
    }

    /// Bad input or configuration.
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Usage, message)
    }

    /// A required variable is not set: names the flag and the variable.
    pub fn missing_var(var: &str, flag: &str) -> Self {
        Self::usage(hints::missing_var(var, flag))
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self.kind {
            ErrorKind::Failed => 1,
            ErrorKind::Usage => 2,
            ErrorKind::NotFound => 3,
            ErrorKind::Unreachable => 4,
            ErrorKind::Incomplete => 5,
            ErrorKind::Unsupported => 6,
            ErrorKind::NotAudited => audit::NOT_AUDITED_EXIT,
        }
    }
}

impl fmt::Display for OpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpsError {}

/// Result of an operator action.
pub type OpsResult<T> = Result<T, OpsError>;

/// Collapses whitespace runs containing newlines so a message always prints as one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The AWS clients and the endpoints they talk to (for error messages).
///
/// Every call an operator command makes goes through one retry mechanism, the storage retry
/// policy ([`Ctx::storage_retry`], a few quick tries because an operator is waiting): the SDK
/// clients here have the SDK's own retries disabled. Make calls with [`Ctx::sqs_call`] /
/// [`Ctx::ddb_call`], or through the effects ([`Ctx::sqs_effects`], [`Ctx::ledger`],
/// [`Ctx::breakers`]).
#[derive(Debug, Clone)]
pub struct Ctx {
    /// SQS client (the SDK's retries disabled).
    pub sqs: aws_sdk_sqs::Client,
    /// DynamoDB client (the SDK's retries disabled).
    pub ddb: aws_sdk_dynamodb::Client,
    /// Where SQS calls go, as shown to the operator.
    pub sqs_endpoint: String,
    /// Where DynamoDB calls go, as shown to the operator.
    pub ddb_endpoint: String,
    /// True when an endpoint variable points the clients at something other than AWS.
    pub custom_endpoint: bool,
    /// The SDK configuration the clients were built from.
    pub sdk: SdkConfig,
    /// STS client (the SDK's retries disabled), for the caller's identity in audit items.
    pub sts: aws_sdk_sts::Client,
    /// The retry policy of this command's calls (clones share its budget).
    retry: StorageRetry,
    /// The state table the actions of this context are audited to ([`Ctx::audited`]).
    audit_table: Option<String>,
    /// How long audit items are kept.
    audit_retention: Duration,
    /// The caller's identity, asked of STS at most once (clones share it).
    actor: Arc<tokio::sync::OnceCell<audit::Actor>>,
}

/// Calls per operator request (the first included): a few quick tries, then a clear error.
pub(crate) const OPERATOR_MAX_ATTEMPTS: u32 = 3;

/// The retry policy of an operator command: a few tries per call, and no budget across calls.
/// The budget guards a fleet of functions against retry storms; one command's calls are
/// sequential and bounded per call, and a long replay through a throttled period must not
/// stop half-way because earlier batches spent a shared allowance.
fn operator_retry_config() -> StorageRetryConfig {
    StorageRetryConfig {
        max_attempts: OPERATOR_MAX_ATTEMPTS,
        budget_capacity: u32::MAX,
        ..StorageRetryConfig::default()
    }
}

impl Ctx {
    /// Loads the standard AWS configuration (`AWS_REGION`, `AWS_ENDPOINT_URL*`, credentials).
    pub async fn from_env() -> OpsResult<Self> {
        let config = aws_config::defaults(BehaviorVersion::latest()).load().await;
        Self::from_config(&config)
    }

    /// Clients from an existing SDK configuration (its retry settings are not used: the
    /// clients' retries are the storage retry policy's).
    pub fn from_config(config: &SdkConfig) -> OpsResult<Self> {
        let Some(region) = config.region() else {
            return Err(OpsError::usage(hints::NO_REGION));
        };
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let global = env("AWS_ENDPOINT_URL");
        let sqs_custom = env("AWS_ENDPOINT_URL_SQS").or_else(|| global.clone());
        let ddb_custom = env("AWS_ENDPOINT_URL_DYNAMODB").or_else(|| global.clone());
        let custom_endpoint = sqs_custom.is_some() || ddb_custom.is_some();
        let retry = StorageRetry::new(operator_retry_config()).unwrap_or_default();
        Ok(Self {
            sqs: sqs_client(config),
            ddb: dynamodb_client(config),
            sqs_endpoint: sqs_custom.unwrap_or_else(|| format!("sqs.{region}.amazonaws.com")),
            ddb_endpoint: ddb_custom.unwrap_or_else(|| format!("dynamodb.{region}.amazonaws.com")),
            custom_endpoint,
            sts: audit::sts_client(config),
            sdk: config.clone(),
            retry,
            audit_table: None,
            audit_retention: audit::DEFAULT_RETENTION,
            actor: Arc::default(),
        })
    }

    /// This context, auditing the state-changing actions made through it (replay, purge,
    /// redrive, breaker forces) to `table`, keeping each item for `retention`.
    pub fn audited(mut self, table: &str, retention: Duration) -> Self {
        self.audit_table = Some(table.to_owned());
        self.audit_retention = retention;
        self
    }

    /// The table actions are audited to, when they are.
    pub fn audit_table(&self) -> Option<&str> {
        self.audit_table.as_deref()
    }

    /// How long audit items written through this context are kept.
    pub fn audit_retention(&self) -> Duration {
        self.audit_retention
    }

    /// Who is calling, from STS `GetCallerIdentity`: asked once per context (and its
    /// clones), on the first audit item; `unknown` with the reason when STS does not answer.
    pub async fn actor(&self) -> audit::Actor {
        self.actor
            .get_or_init(|| audit::caller_identity(self))
            .await
            .clone()
    }

    /// The region SQS calls go to.
    pub(crate) fn sqs_region(&self) -> Option<String> {
        self.sqs.config().region().map(|r| r.as_ref().to_owned())
    }

    /// This context for the region `queue` (an ARN or an AWS queue URL) names, when that is
    /// not `AWS_REGION`: a queue in another region is honoured for the whole command, SQS
    /// and DynamoDB alike (a deployment's queue, DLQ and table live in one region; a table
    /// name carries none). A name, or a URL without a region (a local endpoint), keeps the
    /// context as it is.
    pub fn for_queue(&self, queue: &str, var: &str) -> OpsResult<Self> {
        let Some(region) = queue_region(queue, var)? else {
            return Ok(self.clone());
        };
        if self.sqs_region().as_deref() == Some(region.as_str()) {
            return Ok(self.clone());
        }
        let sdk = self
            .sdk
            .to_builder()
            .region(aws_config::Region::new(region))
            .build();
        let mut ctx = Self::from_config(&sdk)?;
        // Who is calling and where actions are audited do not depend on the region.
        ctx.audit_table = self.audit_table.clone();
        ctx.audit_retention = self.audit_retention;
        ctx.actor = self.actor.clone();
        Ok(ctx)
    }

    /// The storage retry policy of operator calls: the product's policy with fewer tries
    /// (`OPERATOR_MAX_ATTEMPTS`), because an operator is waiting. Clones share one budget.
    pub fn storage_retry(&self) -> StorageRetry {
        self.retry.clone()
    }

    /// The batched SQS actions (sends, deletes, visibility changes) through this context's
    /// client and retry policy.
    pub fn sqs_effects(&self) -> Sqs {
        Sqs::new(self.sqs.clone(), self.retry.clone())
    }

    /// The attempt ledger in `table`, through the storage retry policy.
    pub fn ledger(&self, table: &str) -> AttemptLedger {
        AttemptLedger::new(self.ddb.clone(), table, self.retry.clone())
    }

    /// The breaker store in `table`, through the storage retry policy.
    pub fn breakers(&self, table: &str) -> BreakerStore {
        BreakerStore::new(self.ddb.clone(), table, self.retry.clone())
    }

    /// Makes one SQS call under the retry policy; a failure becomes one operator line.
    /// `queue` names the queue the call is about and the variable or flag that gave it, for
    /// the "does not exist" line.
    pub async fn sqs_call<T, E, F, Fut>(
        &self,
        op: &'static str,
        queue: Option<(&str, &str)>,
        f: F,
    ) -> OpsResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        self.retry
            .call(op, None, f)
            .await
            .map_err(|e| self.sqs_storage_error(&e, queue))
    }

    /// Makes one DynamoDB call about `table` under the retry policy; a failure becomes one
    /// operator line.
    pub async fn ddb_call<T, E, F, Fut>(&self, op: &'static str, table: &str, f: F) -> OpsResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        self.retry
            .call(op, None, f)
            .await
            .map_err(|e| self.storage_error(e, table))
    }

    /// Maps a DynamoDB [`StorageError`] (from a call, the ledger or the breaker store) about
    /// `table` to one line.
    pub(crate) fn storage_error(&self, err: StorageError, table: &str) -> OpsError {
        if err.is_not_found() {
            return OpsError::new(ErrorKind::NotFound, hints::table_missing(table));
        }
        self.transport_error(&err, "DynamoDB", &self.ddb_endpoint)
            .unwrap_or_else(|| OpsError::new(ErrorKind::Failed, err.to_string()))
    }

    /// Maps an SQS [`StorageError`] to one line. `queue` names the queue the call was about
    /// and the variable or flag that gave it, for the "does not exist" line.
    pub(crate) fn sqs_storage_error(&self, err: &StorageError, queue: Option<(&str, &str)>) -> OpsError {
        if err.is_not_found() {
            let line = match queue {
                Some((url, var)) => hints::queue_missing(url, var),
                None => hints::QUEUE_MISSING.to_owned(),
            };
            return OpsError::new(ErrorKind::NotFound, line);
        }
        self.transport_error(err, "SQS", &self.sqs_endpoint)
            .unwrap_or_else(|| OpsError::new(ErrorKind::Failed, err.to_string()))
    }

    /// No answer at all: no credentials (a usage error), or the endpoint not reached.
    fn transport_error(&self, err: &StorageError, service: &str, endpoint: &str) -> Option<OpsError> {
        if err.code().is_some() || err.status.is_some() {
            return None;
        }
        if err.message.contains("credentials") {
            return Some(OpsError::usage(hints::no_credentials(service)));
        }
        err.is_unavailable().then(|| {
            OpsError::new(
                ErrorKind::Unreachable,
                hints::unreachable(service, endpoint, self.custom_endpoint),
            )
        })
    }
}

/// The region an SQS queue ARN (`arn:aws:sqs:REGION:ACCOUNT:NAME`) or AWS queue URL
/// (`https://sqs.REGION.amazonaws.com/ACCOUNT/NAME`, or the legacy
/// `https://REGION.queue.amazonaws.com/...`) names; `None` for a bare name or another URL (a
/// local endpoint). A region that is not one (`us-west-2`-like) is a usage error naming `var`.
pub(crate) fn queue_region(input: &str, var: &str) -> OpsResult<Option<String>> {
    let region = if let Some(rest) = input.strip_prefix("arn:") {
        match rest.split(':').collect::<Vec<_>>().as_slice() {
            [_, "sqs", region, _, _] => Some(*region),
            _ => None,
        }
    } else {
        let host = input
            .strip_prefix("https://")
            .or_else(|| input.strip_prefix("http://"))
            .and_then(|r| r.split('/').next())
            .unwrap_or_default();
        let labels: Vec<&str> = host.split('.').collect();
        match labels.as_slice() {
            ["sqs", region, "amazonaws", ..] => Some(*region),
            [region, "queue", "amazonaws", ..] => Some(*region),
            _ => None,
        }
    };
    let Some(region) = region else {
        return Ok(None);
    };
    let valid = !region.is_empty()
        && region.len() <= 32
        && region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && region.contains('-');
    if !valid {
        return Err(OpsError::usage(format!(
            "{input} names the region `{region}`, which is not an AWS region: check {var}"
        )));
    }
    Ok(Some(region.to_owned()))
}

/// A queue URL from a URL, an ARN or a bare name (resolved with GetQueueUrl). An ARN's
/// account is passed to GetQueueUrl. An ARN or URL in another region than `ctx`'s SQS
/// client is refused with a usage error: [`Ctx::for_queue`] makes a context for that region
/// (the CLI does so for `TRIAGE_QUEUE_URL` and `TRIAGE_DLQ_URL`), and a queue elsewhere in
/// the same command (`--to`) must be in that region.
pub async fn resolve_queue(ctx: &Ctx, input: &str, var: &str) -> OpsResult<String> {
    if let Some(region) = queue_region(input, var)? {
        let ours = ctx.sqs_region();
        if ours.as_deref() != Some(region.as_str()) {
            return Err(OpsError::usage(format!(
                "{input} is in region {region}, but this command's SQS calls go to {}: \
                 pass a queue in that region in {var}, or run the command with AWS_REGION={region}",
                ours.as_deref().unwrap_or("no region")
            )));
        }
    }
    if input.starts_with("http://") || input.starts_with("https://") {
        return Ok(input.to_owned());
    }
    let (name, owner) = match input.strip_prefix("arn:") {
        Some(rest) => {
            // arn:aws:sqs:region:account:name
            let parts: Vec<&str> = rest.split(':').collect();
            match parts.as_slice() {
                [_, "sqs", _, account, name] => (name.to_string(), Some(account.to_string())),
                _ => {
                    return Err(OpsError::usage(format!(
                        "{input} is not an SQS queue ARN: pass a queue URL, ARN or name in {var}"
                    )));
                }
            }
        }
        None => (input.to_owned(), None),
    };
    let out = ctx
        .sqs_call("GetQueueUrl", Some((input, var)), || {
            ctx.sqs
                .get_queue_url()
                .queue_name(&name)
                .set_queue_owner_aws_account_id(owner.clone())
                .send()
        })
        .await?;
    out.queue_url.ok_or_else(|| {
        OpsError::new(
            ErrorKind::Failed,
            format!("GetQueueUrl returned no URL for {input}"),
        )
    })
}

/// A queue's ARN (GetQueueAttributes).
pub(crate) async fn queue_arn(ctx: &Ctx, url: &str, var: &str) -> OpsResult<String> {
    let out = ctx
        .sqs_call("GetQueueAttributes", Some((url, var)), || {
            ctx.sqs
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
                .send()
        })
        .await?;
    out.attributes
        .and_then(|mut a| a.remove(&aws_sdk_sqs::types::QueueAttributeName::QueueArn))
        .ok_or_else(|| {
            OpsError::new(
                ErrorKind::Failed,
                format!("queue {url} has no QueueArn attribute"),
            )
        })
}

/// True for a FIFO queue URL, name or ARN.
pub fn is_fifo(queue: &str) -> bool {
    queue.ends_with(".fifo")
}

/// Parses a duration such as `90s`, `15m`, `2h`, `3d`, `1h30m`, `250ms` or a bare number of
/// seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s).map_err(|_| format!("`{s}` is not a duration (try 30s, 15m, 2h, 1d)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_command_has_no_retry_budget_to_run_out_of() {
        let retry = StorageRetry::new(operator_retry_config()).unwrap();
        // A replay of thousands of batches through throttling: far more retries than the
        // functions' budget (100) holds, and never a refusal.
        for _ in 0..10_000 {
            assert!(retry.budget().withdraw());
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5m3").is_err());
    }

    #[test]
    fn queue_regions_come_from_arns_and_aws_urls() {
        let r = |s: &str| queue_region(s, "V").unwrap();
        assert_eq!(r("arn:aws:sqs:us-west-2:123:jobs").as_deref(), Some("us-west-2"));
        assert_eq!(
            r("arn:aws-cn:sqs:cn-north-1:123:jobs").as_deref(),
            Some("cn-north-1")
        );
        assert_eq!(
            r("https://sqs.eu-west-1.amazonaws.com/123/jobs").as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(
            r("https://ap-south-1.queue.amazonaws.com/123/jobs").as_deref(),
            Some("ap-south-1")
        );
        assert_eq!(r("http://127.0.0.1:45660/123/jobs"), None);
        assert_eq!(r("jobs"), None);
        assert_eq!(r("arn:aws:sns:us-west-2:123:topic"), None);
        let e = queue_region("arn:aws:sqs:not a region:123:jobs", "TRIAGE_QUEUE_URL").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.message.contains("TRIAGE_QUEUE_URL"), "{e}");
        assert!(queue_region("arn:aws:sqs::123:jobs", "V").is_err());
    }

    #[test]
    fn messages_are_one_line() {
        let e = OpsError::usage("a\n  b\tc");
        assert_eq!(e.message, "a b c");
        assert_eq!(e.exit_code(), 2);
    }
}
