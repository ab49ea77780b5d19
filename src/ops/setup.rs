//! `triage setup`: the queue, its DLQ and the state table, created idempotently.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use serde::Serialize;

use super::output::Report;
use super::{Ctx, ErrorKind, OpsError, OpsResult, queue_arn};
use crate::effects::storage_retry::dynamodb_client;

/// Messages are kept in the DLQ for the longest SQS allows (14 days), so an incident can be
/// investigated after a long weekend.
const DLQ_RETENTION_S: &str = "1209600";

/// The one rule between the source queue's redrive `maxReceiveCount` and the retry policy's
/// `max_attempts`: `maxReceiveCount >= RECEIVES_PER_ATTEMPT x max_attempts`. Deferrals (breaker
/// open, early arrivals) and releases before the Lambda deadline are receives too, so SQS's own
/// redrive must leave room for several receives per attempt or it moves a job to the DLQ (with
/// no failure record) before its attempts are spent. The SAM template (a `Rules` assertion) and
/// the CDK app apply the same factor; `infra/check_templates.py` checks that they agree.
pub const RECEIVES_PER_ATTEMPT: u32 = 4;

/// SQS's largest `maxReceiveCount`.
pub const MAX_RECEIVE_COUNT_LIMIT: u32 = 1000;

/// The default `maxReceiveCount` of `triage setup` when the retry policy needs no more.
pub const DEFAULT_MAX_RECEIVE_COUNT: u32 = 50;

/// The smallest `maxReceiveCount` that leaves room for `max_attempts` (see
/// [`RECEIVES_PER_ATTEMPT`]).
pub fn min_max_receive_count(max_attempts: u32) -> u32 {
    max_attempts.saturating_mul(RECEIVES_PER_ATTEMPT)
}

/// The `maxReceiveCount` setup uses when none is given: [`DEFAULT_MAX_RECEIVE_COUNT`], or the
/// rule's minimum for `max_attempts` when that is larger.
pub fn default_max_receive_count(max_attempts: u32) -> u32 {
    DEFAULT_MAX_RECEIVE_COUNT.max(min_max_receive_count(max_attempts))
}

/// Where the value of `max_attempts` came from, for the error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptsSource {
    /// `--max-attempts`.
    Flag,
    /// `TRIAGE_MAX_ATTEMPTS`.
    Env,
    /// The configuration's default.
    Default,
}

impl AttemptsSource {
    fn describe(self) -> &'static str {
        match self {
            Self::Flag => "--max-attempts",
            Self::Env => "TRIAGE_MAX_ATTEMPTS",
            Self::Default => "the default of TRIAGE_MAX_ATTEMPTS",
        }
    }
}

/// The retry policy's `max_attempts` as the worker and the Lambda function will read it: the
/// flag when given, else `TRIAGE_MAX_ATTEMPTS` (`env`, read like the configuration does), else
/// the configuration's default.
pub fn max_attempts_from(flag: Option<u32>, env: Option<&str>) -> OpsResult<(u32, AttemptsSource)> {
    if let Some(n) = flag {
        return Ok((n, AttemptsSource::Flag));
    }
    match env.map(str::trim).filter(|v| !v.is_empty()) {
        Some(v) => v.parse::<u32>().map(|n| (n, AttemptsSource::Env)).map_err(|_| {
            OpsError::usage(format!(
                "TRIAGE_MAX_ATTEMPTS={v:?} is not valid: expected a number from 1 to 1000"
            ))
        }),
        None => {
            let defaults =
                crate::config::Config::from_lookup(&|_| None).map_err(|e| OpsError::usage(e.to_string()))?;
            Ok((defaults.policy.max_attempts(), AttemptsSource::Default))
        }
    }
}

/// Checks `max_attempts` (the range the configuration accepts, and room under SQS's limit) and
/// `max_receive_count` against the rule. Usage errors name both values.
pub fn check_max_receive_count(
    max_receive_count: u32,
    max_attempts: u32,
    attempts_from: AttemptsSource,
) -> OpsResult<()> {
    let from = attempts_from.describe();
    let most_attempts = MAX_RECEIVE_COUNT_LIMIT / RECEIVES_PER_ATTEMPT;
    if !(1..=1000).contains(&max_attempts) {
        return Err(OpsError::usage(format!(
            "{from} {max_attempts} is not valid: expected a number from 1 to 1000"
        )));
    }
    if max_attempts > most_attempts {
        return Err(OpsError::usage(format!(
            "{max_attempts} attempts ({from}) need a maxReceiveCount of at least {} ({RECEIVES_PER_ATTEMPT} x {max_attempts}), above SQS's limit of {MAX_RECEIVE_COUNT_LIMIT}: use at most {most_attempts} attempts",
            min_max_receive_count(max_attempts)
        )));
    }
    if max_receive_count == 0 || max_receive_count > MAX_RECEIVE_COUNT_LIMIT {
        return Err(OpsError::usage(format!(
            "--max-receive-count {max_receive_count} is not valid: expected a number from 1 to {MAX_RECEIVE_COUNT_LIMIT}"
        )));
    }
    let least = min_max_receive_count(max_attempts);
    if max_receive_count < least {
        return Err(OpsError::usage(format!(
            "--max-receive-count {max_receive_count} leaves no room for {max_attempts} attempts ({from}): \
             it must be at least {RECEIVES_PER_ATTEMPT} x {max_attempts} = {least}, since deferrals count as receives"
        )));
    }
    Ok(())
}

/// What to create.
#[derive(Debug, Clone)]
pub struct SetupOptions {
    /// Source queue name (`.fifo` is appended for FIFO queues when missing).
    pub queue: String,
    /// DLQ name.
    pub dlq: String,
    /// State table name.
    pub table: String,
    /// Create FIFO queues.
    pub fifo: bool,
    /// The SQS redrive policy's `maxReceiveCount` on the source queue. Only a safety net for
    /// crashes the handler cannot catch: deferrals (breaker open, early arrivals) also count
    /// as receives, so it must sit well above the retry policy's attempts. [`setup`] checks
    /// only SQS's range; callers that know the policy check [`check_max_receive_count`] first.
    pub max_receive_count: u32,
}

/// What exists after setup.
#[derive(Debug, Clone, Serialize)]
pub struct SetupReport {
    /// Source queue URL (export as `TRIAGE_QUEUE_URL`).
    pub queue_url: String,
    /// DLQ URL (export as `TRIAGE_DLQ_URL`).
    pub dlq_url: String,
    /// Source queue ARN.
    pub queue_arn: String,
    /// DLQ ARN.
    pub dlq_arn: String,
    /// State table name (export as `TRIAGE_TABLE`).
    pub table: String,
    /// Whether the queues are FIFO.
    pub fifo: bool,
    /// The safety-net `maxReceiveCount`.
    pub max_receive_count: u32,
}

impl Report for SetupReport {
    fn human(&self) -> String {
        format!(
            "queue  {}\ndlq    {}\ntable  {}\n\nexport TRIAGE_QUEUE_URL={}\nexport TRIAGE_DLQ_URL={}\nexport TRIAGE_TABLE={}\n",
            self.queue_url, self.dlq_url, self.table, self.queue_url, self.dlq_url, self.table
        )
    }
}

fn check_queue_name(name: &str) -> OpsResult<()> {
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    let ok = !base.is_empty()
        && name.len() <= 80
        && base
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(OpsError::usage(format!(
            "`{name}` is not a valid queue name: use 1-80 letters, digits, `-` or `_` (FIFO names end in `.fifo`)"
        )))
    }
}

fn check_table_name(name: &str) -> OpsResult<()> {
    let ok = (3..=255).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(OpsError::usage(format!(
            "`{name}` is not a valid table name: use 3-255 letters, digits, `-`, `_` or `.`"
        )))
    }
}

/// Creates (or finds) the DLQ, the source queue with its redrive policy, the DLQ's
/// redrive-allow policy and the state table.
pub async fn setup(ctx: &Ctx, opts: &SetupOptions) -> OpsResult<SetupReport> {
    let fifo = opts.fifo || opts.queue.ends_with(".fifo") || opts.dlq.ends_with(".fifo");
    let with_suffix = |n: &str| {
        if fifo && !n.ends_with(".fifo") {
            format!("{n}.fifo")
        } else {
            n.to_owned()
        }
    };
    let queue = with_suffix(&opts.queue);
    let dlq = with_suffix(&opts.dlq);
    check_queue_name(&queue)?;
    check_queue_name(&dlq)?;
    check_table_name(&opts.table)?;
    if queue == dlq {
        return Err(OpsError::usage("--queue and --dlq must name different queues"));
    }
    if opts.max_receive_count == 0 || opts.max_receive_count > MAX_RECEIVE_COUNT_LIMIT {
        return Err(OpsError::usage(format!(
            "--max-receive-count {} is not valid: expected a number from 1 to {MAX_RECEIVE_COUNT_LIMIT}",
            opts.max_receive_count
        )));
    }

    let dlq_url = create_queue(ctx, &dlq, fifo).await?;
    let dlq_arn = queue_arn(ctx, &dlq_url, "--dlq").await?;
    set_attributes(
        ctx,
        &dlq_url,
        [(
            QueueAttributeName::MessageRetentionPeriod,
            DLQ_RETENTION_S.to_owned(),
        )],
    )
    .await?;
    let queue_url = create_queue(ctx, &queue, fifo).await?;
    let queue_arn = queue_arn(ctx, &queue_url, "--queue").await?;
    let redrive = serde_json::json!({
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": opts.max_receive_count.to_string(),
    });
    set_attributes(
        ctx,
        &queue_url,
        [(QueueAttributeName::RedrivePolicy, redrive.to_string())],
    )
    .await?;
    let allow = redrive_allow_policy(ctx, &dlq_url, &queue_arn).await?;
    set_attributes(ctx, &dlq_url, [(QueueAttributeName::RedriveAllowPolicy, allow)]).await?;

    create_table(ctx, &opts.table).await?;

    Ok(SetupReport {
        queue_url,
        dlq_url,
        queue_arn,
        dlq_arn,
        table: opts.table.clone(),
        fifo,
        max_receive_count: opts.max_receive_count,
    })
}

async fn create_queue(ctx: &Ctx, name: &str, fifo: bool) -> OpsResult<String> {
    // Only the attributes that cannot change after creation go here; everything else is set
    // afterwards, so re-running setup on an existing queue never trips QueueNameExists.
    let mut req = ctx.sqs.create_queue().queue_name(name);
    if fifo {
        req = req.attributes(QueueAttributeName::FifoQueue, "true");
    }
    let out = req.send().await.map_err(|e| {
        if e.as_service_error().is_some_and(|s| s.is_queue_name_exists()) {
            OpsError::usage(format!(
                "queue {name} exists with other attributes (FIFO or not): pick another name or delete it"
            ))
        } else {
            ctx.sqs_error("CreateQueue", e, None)
        }
    })?;
    out.queue_url.ok_or_else(|| {
        OpsError::new(
            ErrorKind::Failed,
            format!("CreateQueue returned no URL for {name}"),
        )
    })
}

async fn set_attributes(
    ctx: &Ctx,
    url: &str,
    attrs: impl IntoIterator<Item = (QueueAttributeName, String)>,
) -> OpsResult<()> {
    let attrs: HashMap<_, _> = attrs.into_iter().collect();
    ctx.sqs
        .set_queue_attributes()
        .queue_url(url)
        .set_attributes(Some(attrs))
        .send()
        .await
        .map_err(|e| ctx.sqs_error("SetQueueAttributes", e, Some((url, "--queue/--dlq"))))?;
    Ok(())
}

/// The DLQ's redrive-allow policy with `source_arn` added, keeping sources other setups added.
async fn redrive_allow_policy(ctx: &Ctx, dlq_url: &str, source_arn: &str) -> OpsResult<String> {
    let out = ctx
        .sqs
        .get_queue_attributes()
        .queue_url(dlq_url)
        // `All` rather than the one name: moto rejects RedriveAllowPolicy as a name.
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .map_err(|e| ctx.sqs_error("GetQueueAttributes", e, Some((dlq_url, "--dlq"))))?;
    let existing = out
        .attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::RedriveAllowPolicy))
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
    let mut sources: Vec<String> = existing
        .as_ref()
        .filter(|p| p["redrivePermission"] == "byQueue")
        .and_then(|p| p["sourceQueueArns"].as_array())
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    if !sources.iter().any(|s| s == source_arn) {
        sources.push(source_arn.to_owned());
    }
    // SQS allows at most 10 source ARNs in a byQueue policy; keep the newest.
    let skip = sources.len().saturating_sub(10);
    let sources: Vec<String> = sources.into_iter().skip(skip).collect();
    Ok(serde_json::json!({"redrivePermission": "byQueue", "sourceQueueArns": sources}).to_string())
}

/// Creates the state table (string `pk`/`sk`, on-demand, TTL on `expires_at`) unless it
/// exists, and waits until it is active.
pub async fn create_table(ctx: &Ctx, table: &str) -> OpsResult<()> {
    let client = dynamodb_client(&ctx.sdk);
    crate::effects::table::create_table_with(&client, &ctx.storage_retry(), table, Duration::from_secs(120))
        .await
        .map_err(|e| ctx.storage_error(e, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receive_count_leaves_four_receives_per_attempt() {
        assert_eq!(min_max_receive_count(5), 20);
        assert_eq!(default_max_receive_count(5), 50);
        assert_eq!(default_max_receive_count(30), 120);
        check_max_receive_count(20, 5, AttemptsSource::Default).unwrap();
        check_max_receive_count(1000, 250, AttemptsSource::Flag).unwrap();
        let e = check_max_receive_count(19, 5, AttemptsSource::Default).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string().contains("--max-receive-count 19") && e.to_string().contains("4 x 5 = 20"),
            "{e}"
        );
        let e = check_max_receive_count(1000, 251, AttemptsSource::Env).unwrap_err();
        assert!(
            e.to_string().contains("TRIAGE_MAX_ATTEMPTS") && e.to_string().contains("at most 250"),
            "{e}"
        );
        assert!(check_max_receive_count(1001, 1, AttemptsSource::Flag).is_err());
        assert!(check_max_receive_count(0, 1, AttemptsSource::Flag).is_err());
        assert!(check_max_receive_count(100, 0, AttemptsSource::Flag).is_err());
    }

    #[test]
    fn attempts_come_from_the_flag_then_the_variable_then_the_default() {
        assert_eq!(
            max_attempts_from(Some(7), Some("9")).unwrap(),
            (7, AttemptsSource::Flag)
        );
        assert_eq!(
            max_attempts_from(None, Some(" 9 ")).unwrap(),
            (9, AttemptsSource::Env)
        );
        assert_eq!(
            max_attempts_from(None, Some("")).unwrap(),
            (5, AttemptsSource::Default)
        );
        assert_eq!(
            max_attempts_from(None, None).unwrap(),
            (5, AttemptsSource::Default)
        );
        let e = max_attempts_from(None, Some("many")).unwrap_err();
        assert!(e.to_string().contains("TRIAGE_MAX_ATTEMPTS=\"many\""), "{e}");
    }
}
