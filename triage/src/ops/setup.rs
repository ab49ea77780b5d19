//! `triage setup`: the queue, its DLQ and the state table, created idempotently.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use serde::Serialize;

use super::output::Report;
use super::{Ctx, ErrorKind, OpsError, OpsResult};

/// Messages are kept in the DLQ for the longest SQS allows (14 days), so an incident can be
/// investigated after a long weekend.
const DLQ_RETENTION: Duration = Duration::from_secs(1_209_600);

/// Both queues take SQS's largest message (1 MiB), as the SAM and CDK stacks make them: the DLQ
/// is never smaller than its source, so every dead-lettered copy (the body and its failure
/// record) fits. Setup sets it on queues made before, at SQS's old 256 KiB default, too.
const MAX_MESSAGE_SIZE: &str = "1048576";

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
pub(crate) fn min_max_receive_count(max_attempts: u32) -> u32 {
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
            let defaults = sqs_triage::config::Config::from_lookup(&|_| None)
                .map_err(|e| OpsError::usage(e.to_string()))?;
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

/// What `triage setup` may change beyond creating what is missing.
#[derive(Debug, Clone, Default)]
pub struct SetupFlags {
    /// `--visibility-timeout`: the source queue's visibility timeout in seconds (0 to
    /// 43,200). `None` keeps the queue's own (SQS's default of 30 s for a new queue).
    pub visibility_timeout: Option<u32>,
    /// `--replace-deny-all`: when the DLQ's redrive-allow policy is `denyAll`, replace it with
    /// `byQueue` listing this source. Without it setup refuses such a DLQ.
    pub replace_deny_all: bool,
}

/// SQS's longest visibility timeout (12 hours).
pub(crate) const MAX_VISIBILITY_TIMEOUT_S: u32 = 43_200;

/// SQS's most source queues in a `byQueue` redrive-allow policy.
pub const MAX_REDRIVE_SOURCES: usize = 10;

/// How long setup waits after writing the DLQ's redrive-allow policy before reading it back
/// once more, so a concurrent setup's write (read before this one's, written after) shows.
const ALLOW_SETTLE: Duration = Duration::from_secs(1);

/// Writes of the redrive-allow policy setup makes before giving up on a DLQ whose policy
/// keeps changing under it.
const ALLOW_ROUNDS: u32 = 5;

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
    /// The source queue's visibility timeout, in seconds, as set or found.
    pub visibility_timeout_s: u32,
}

impl Report for SetupReport {
    fn human(&self) -> String {
        format!(
            "queue  {} (visibility timeout {} s)\ndlq    {}\ntable  {}\n\nexport TRIAGE_QUEUE_URL={}\nexport TRIAGE_DLQ_URL={}\nexport TRIAGE_TABLE={}\n",
            self.queue_url,
            self.visibility_timeout_s,
            self.dlq_url,
            self.table,
            self.queue_url,
            self.dlq_url,
            self.table
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
/// redrive-allow policy and the state table, with the default [`SetupFlags`].
pub async fn setup(ctx: &Ctx, opts: &SetupOptions) -> OpsResult<SetupReport> {
    setup_with(ctx, opts, &SetupFlags::default()).await
}

/// [`setup`] with `flags`. Whatever exists is verified, never silently accepted or
/// overwritten: a table with another key schema or with TTL on another attribute, a DLQ
/// whose redrive-allow policy is `denyAll` (unless [`SetupFlags::replace_deny_all`]) or
/// already lists [`MAX_REDRIVE_SOURCES`] other sources are refused with a usage error (exit
/// 2), and nothing is changed then. The table is checked first, and the DLQ's policy before
/// the source queue is created. Two setups at once (same table and DLQ) both succeed.
pub async fn setup_with(ctx: &Ctx, opts: &SetupOptions, flags: &SetupFlags) -> OpsResult<SetupReport> {
    let (queue, dlq, fifo) = checked_names(opts, flags)?;
    create_table(ctx, &opts.table).await?;
    let (dlq_url, dlq_arn, allow) = prepare_dlq(ctx, &dlq, &queue, fifo, flags).await?;
    let queue_url = create_queue(ctx, &queue, fifo).await?;
    let mut queue_attrs = queue_attributes(
        ctx,
        &queue_url,
        &[
            QueueAttributeName::QueueArn,
            QueueAttributeName::VisibilityTimeout,
            QueueAttributeName::MessageRetentionPeriod,
        ],
        "--queue",
    )
    .await?;
    let queue_arn = queue_attrs.remove(&QueueAttributeName::QueueArn).ok_or_else(|| {
        OpsError::new(
            ErrorKind::Failed,
            format!("queue {queue_url} has no QueueArn attribute"),
        )
    })?;
    let visibility_timeout_s = match flags.visibility_timeout {
        Some(v) => v,
        None => queue_attrs
            .remove(&QueueAttributeName::VisibilityTimeout)
            .and_then(|v| v.parse().ok())
            .unwrap_or(30),
    };
    let retention = queue_attrs
        .remove(&QueueAttributeName::MessageRetentionPeriod)
        .and_then(|v| v.parse().ok())
        .map_or(SQS_DEFAULT_RETENTION, Duration::from_secs);
    check_redrive(
        &queue,
        opts.max_receive_count,
        visibility_timeout_s,
        retention,
        fifo,
    )?;
    // SQS accepts a RedrivePolicy only to a DLQ that allows the source: the DLQ's policy first.
    allow_source(ctx, &dlq_url, &dlq, allow, &queue_arn, flags.replace_deny_all).await?;

    let redrive = serde_json::json!({
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": opts.max_receive_count.to_string(),
    });
    let mut source = vec![
        (QueueAttributeName::RedrivePolicy, redrive.to_string()),
        (
            QueueAttributeName::MaximumMessageSize,
            MAX_MESSAGE_SIZE.to_owned(),
        ),
    ];
    if let Some(v) = flags.visibility_timeout {
        source.push((QueueAttributeName::VisibilityTimeout, v.to_string()));
    }
    set_attributes(ctx, &queue_url, source).await?;

    Ok(SetupReport {
        queue_url,
        dlq_url,
        queue_arn,
        dlq_arn,
        table: opts.table.clone(),
        fifo,
        max_receive_count: opts.max_receive_count,
        visibility_timeout_s,
    })
}

/// The queue and DLQ names (with `.fifo` when either is FIFO) and whether they are FIFO, once
/// every name and number is checked.
fn checked_names(opts: &SetupOptions, flags: &SetupFlags) -> OpsResult<(String, String, bool)> {
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
    if let Some(v) = flags.visibility_timeout.filter(|v| *v > MAX_VISIBILITY_TIMEOUT_S) {
        return Err(OpsError::usage(format!(
            "--visibility-timeout {v} is not valid: expected 0 to {MAX_VISIBILITY_TIMEOUT_S} seconds (12 hours)"
        )));
    }
    Ok((queue, dlq, fifo))
}

/// Creates the DLQ (or verifies it) and checks that its redrive-allow policy can take the
/// source queue, before the source exists; returns its URL, its ARN and that policy.
async fn prepare_dlq(
    ctx: &Ctx,
    dlq: &str,
    queue: &str,
    fifo: bool,
    flags: &SetupFlags,
) -> OpsResult<(String, String, Option<String>)> {
    let dlq_url = create_queue(ctx, dlq, fifo).await?;
    let mut dlq_attrs = queue_attributes(ctx, &dlq_url, &[QueueAttributeName::All], "--dlq").await?;
    let dlq_arn = dlq_attrs.remove(&QueueAttributeName::QueueArn).ok_or_else(|| {
        OpsError::new(
            ErrorKind::Failed,
            format!("queue {dlq_url} has no QueueArn attribute"),
        )
    })?;
    let allow = dlq_attrs.remove(&QueueAttributeName::RedriveAllowPolicy);
    // Setup creates the source next to the DLQ (same account and region): its ARN is known
    // before it exists, so a DLQ that would refuse it is reported before anything is created.
    let planned_arn = sibling_arn(&dlq_arn, queue);
    plan_allow(allow.as_deref(), &planned_arn, dlq, flags.replace_deny_all)?;
    set_attributes(
        ctx,
        &dlq_url,
        [
            (
                QueueAttributeName::MessageRetentionPeriod,
                DLQ_RETENTION.as_secs().to_string(),
            ),
            (
                QueueAttributeName::MaximumMessageSize,
                MAX_MESSAGE_SIZE.to_owned(),
            ),
        ],
    )
    .await?;
    Ok((dlq_url, dlq_arn, allow))
}

/// SQS's retention of a queue made without one (4 days).
const SQS_DEFAULT_RETENTION: Duration = Duration::from_secs(345_600);

/// Refuses (usage error) a redrive that the source queue's retention would outrun
/// ([`sqs_triage::core::redrive`]): `max_receive_count` unsettled holds of the visibility timeout
/// (or of the worker's default heartbeat's reach) within three quarters of `retention`, and,
/// on a standard queue, a DLQ (kept [`DLQ_RETENTION`]) a day longer than its source.
pub(crate) fn check_redrive(
    queue: &str,
    max_receive_count: u32,
    visibility_timeout_s: u32,
    retention: Duration,
    fifo: bool,
) -> OpsResult<()> {
    use sqs_triage::core::redrive::{check_dlq_retention, check_holds, unsettled_hold};
    use sqs_triage::processor::{DEFAULT_HEARTBEAT, TICKS_AHEAD};
    let hold = unsettled_hold(
        Duration::from_secs(visibility_timeout_s.into()),
        Some(DEFAULT_HEARTBEAT),
        TICKS_AHEAD,
    );
    check_holds(max_receive_count, hold, retention).map_err(|e| {
        OpsError::usage(format!(
            "--max-receive-count {max_receive_count} with the visibility timeout of {queue} ({visibility_timeout_s} s, \
             --visibility-timeout): {e}"
        ))
    })?;
    check_dlq_retention(retention, DLQ_RETENTION, fifo)
        .map_err(|e| OpsError::usage(format!("the source queue {queue}: {e}")))
}

async fn create_queue(ctx: &Ctx, name: &str, fifo: bool) -> OpsResult<String> {
    // Only the attributes that cannot change after creation go here; everything else is set
    // afterwards, so re-running setup on an existing queue never trips QueueNameExists.
    let out = ctx
        .storage_retry()
        .call("CreateQueue", None, || {
            let mut req = ctx.sqs.create_queue().queue_name(name);
            if fifo {
                req = req.attributes(QueueAttributeName::FifoQueue, "true");
            }
            req.send()
        })
        .await
        .map_err(|e| {
            // The SDK's `QueueNameExists`, by its code on the wire.
            if e.code() == Some("QueueAlreadyExists") {
                OpsError::usage(format!(
                    "queue {name} exists with other attributes (FIFO or not): pick another name or delete it"
                ))
            } else {
                ctx.sqs_storage_error(&e, None)
            }
        })?;
    out.queue_url.ok_or_else(|| {
        OpsError::new(
            ErrorKind::Failed,
            format!("CreateQueue returned no URL for {name}"),
        )
    })
}

async fn queue_attributes(
    ctx: &Ctx,
    url: &str,
    names: &[QueueAttributeName],
    var: &str,
) -> OpsResult<HashMap<QueueAttributeName, String>> {
    let out = ctx
        .sqs_call("GetQueueAttributes", Some((url, var)), || {
            ctx.sqs
                .get_queue_attributes()
                .queue_url(url)
                .set_attribute_names(Some(names.to_vec()))
                .send()
        })
        .await?;
    Ok(out.attributes.unwrap_or_default())
}

async fn set_attributes(
    ctx: &Ctx,
    url: &str,
    attrs: impl IntoIterator<Item = (QueueAttributeName, String)>,
) -> OpsResult<()> {
    let attrs: HashMap<_, _> = attrs.into_iter().collect();
    ctx.sqs_call("SetQueueAttributes", Some((url, "--queue/--dlq")), || {
        ctx.sqs
            .set_queue_attributes()
            .queue_url(url)
            .set_attributes(Some(attrs.clone()))
            .send()
    })
    .await?;
    Ok(())
}

/// The ARN of queue `name` in the account and region of the queue whose ARN is `arn`.
fn sibling_arn(arn: &str, name: &str) -> String {
    match arn.rsplit_once(':') {
        Some((prefix, _)) => format!("{prefix}:{name}"),
        None => name.to_owned(),
    }
}

/// The redrive-allow policy the DLQ needs so that `source_arn` may use it: `None` when the
/// policy `current` already allows it (`allowAll`, or `byQueue` listing it), else the policy
/// to write (the sources listed so far plus this one). Refuses (usage error) a `denyAll`
/// policy unless `replace_deny_all`, a `byQueue` policy that already lists
/// [`MAX_REDRIVE_SOURCES`] other sources (evicting one would break its queue's redrive),
/// and a permission it does not know.
pub(crate) fn plan_allow(
    current: Option<&str>,
    source_arn: &str,
    dlq: &str,
    replace_deny_all: bool,
) -> OpsResult<Option<String>> {
    let by_queue = |sources: Vec<String>| {
        Some(serde_json::json!({"redrivePermission": "byQueue", "sourceQueueArns": sources}).to_string())
    };
    let Some(policy) = current
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
    else {
        return Ok(by_queue(vec![source_arn.to_owned()]));
    };
    match policy["redrivePermission"].as_str() {
        None => Ok(by_queue(vec![source_arn.to_owned()])),
        Some("allowAll") => Ok(None),
        Some("denyAll") if replace_deny_all => Ok(by_queue(vec![source_arn.to_owned()])),
        Some("denyAll") => Err(OpsError::usage(format!(
            "DLQ {dlq} refuses every source queue (its redrive-allow policy is denyAll): pass \
             --replace-deny-all to allow this source (byQueue), or pick another --dlq"
        ))),
        Some("byQueue") => {
            let mut sources: Vec<String> = policy["sourceQueueArns"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            if sources.iter().any(|s| s == source_arn) {
                return Ok(None);
            }
            if sources.len() >= MAX_REDRIVE_SOURCES {
                return Err(OpsError::usage(format!(
                    "DLQ {dlq} already allows {} source queues (byQueue), SQS's limit of {MAX_REDRIVE_SOURCES}: \
                     setup will not remove one; set its redrive-allow policy to allowAll, remove a source \
                     that no longer uses it, or pick another --dlq",
                    sources.len()
                )));
            }
            sources.push(source_arn.to_owned());
            Ok(by_queue(sources))
        }
        Some(other) => Err(OpsError::usage(format!(
            "DLQ {dlq} has a redrive-allow policy setup does not know (redrivePermission {other:?}): \
             set it to allowAll or byQueue, or pick another --dlq"
        ))),
    }
}

/// Makes the DLQ's redrive-allow policy allow `source_arn`, starting from `current`, and
/// checks it held: SQS has no conditional write, so a concurrent setup that read the policy
/// before this one wrote it can write it back without this source. After each write the
/// policy is read back, and once more after [`ALLOW_SETTLE`]; a read without this source
/// adds it again (keeping whatever else is listed), up to [`ALLOW_ROUNDS`] writes. An
/// endpoint that never reports the attribute (moto) cannot be checked: one write then.
async fn allow_source(
    ctx: &Ctx,
    dlq_url: &str,
    dlq: &str,
    mut current: Option<String>,
    source_arn: &str,
    replace_deny_all: bool,
) -> OpsResult<()> {
    let mut writes = 0;
    let mut settled = true;
    loop {
        match plan_allow(current.as_deref(), source_arn, dlq, replace_deny_all)? {
            None if settled => return Ok(()),
            None => {
                tokio::time::sleep(ALLOW_SETTLE).await;
                settled = true;
            }
            Some(policy) => {
                if writes == ALLOW_ROUNDS {
                    return Err(OpsError::new(
                        ErrorKind::Failed,
                        format!(
                            "the redrive-allow policy of DLQ {dlq} kept changing under this setup \
                             ({ALLOW_ROUNDS} writes): run setup again once other setups are done"
                        ),
                    ));
                }
                set_attributes(ctx, dlq_url, [(QueueAttributeName::RedriveAllowPolicy, policy)]).await?;
                writes += 1;
                settled = false;
            }
        }
        // `All`, not the one name: moto rejects RedriveAllowPolicy as a name.
        current = queue_attributes(ctx, dlq_url, &[QueueAttributeName::All], "--dlq")
            .await?
            .remove(&QueueAttributeName::RedriveAllowPolicy);
        if current.is_none() {
            // Written, yet not reported: the endpoint does not return the attribute.
            tracing::debug!(
                dlq,
                "the endpoint does not report RedriveAllowPolicy; not verified"
            );
            return Ok(());
        }
    }
}

/// Creates the state table (string `pk`/`sk`, on-demand, TTL on `expires_at`) unless it
/// exists, waits until it is active, and verifies what it finds: another key schema, or TTL
/// on another attribute (or being disabled), is refused. TTL enabled meanwhile by a
/// concurrent setup ("already enabled") is success.
pub async fn create_table(ctx: &Ctx, table: &str) -> OpsResult<()> {
    use sqs_triage::effects::table::{TableError, create_table_with};
    match create_table_with(&ctx.ddb, &ctx.storage_retry(), table, Duration::from_secs(120)).await {
        Ok(()) => Ok(()),
        Err(TableError::Misconfigured(why)) => Err(OpsError::usage(format!("{why}; pick another --table"))),
        Err(TableError::NotReady(why)) => Err(OpsError::new(
            ErrorKind::Failed,
            format!("{why}: run setup again later"),
        )),
        Err(TableError::Storage(e)) => Err(ctx.storage_error(e, table)),
    }
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
    fn the_redrive_allow_policy_is_verified_not_overwritten() {
        let ours = "arn:aws:sqs:us-east-1:1:q";
        let sources = |p: &str| -> Vec<String> {
            let v: serde_json::Value = serde_json::from_str(p).unwrap();
            assert_eq!(v["redrivePermission"], "byQueue");
            serde_json::from_value(v["sourceQueueArns"].clone()).unwrap()
        };
        // Absent or unreadable: this source alone.
        assert_eq!(
            sources(&plan_allow(None, ours, "d", false).unwrap().unwrap()),
            [ours]
        );
        assert_eq!(
            sources(&plan_allow(Some("{"), ours, "d", false).unwrap().unwrap()),
            [ours]
        );
        // allowAll already allows it; byQueue listing it too.
        assert_eq!(
            plan_allow(Some(r#"{"redrivePermission":"allowAll"}"#), ours, "d", false).unwrap(),
            None
        );
        let listed = format!(r#"{{"redrivePermission":"byQueue","sourceQueueArns":["a","{ours}"]}}"#);
        assert_eq!(plan_allow(Some(&listed), ours, "d", false).unwrap(), None);
        // Others are kept.
        let others = r#"{"redrivePermission":"byQueue","sourceQueueArns":["a","b"]}"#;
        assert_eq!(
            sources(&plan_allow(Some(others), ours, "d", false).unwrap().unwrap()),
            ["a", "b", ours]
        );
        // denyAll only with the flag.
        let deny = r#"{"redrivePermission":"denyAll"}"#;
        let e = plan_allow(Some(deny), ours, "d", false).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.message.contains("--replace-deny-all"), "{e}");
        assert_eq!(
            sources(&plan_allow(Some(deny), ours, "d", true).unwrap().unwrap()),
            [ours]
        );
        // Ten others: no eviction.
        let ten: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
        let full = serde_json::json!({"redrivePermission": "byQueue", "sourceQueueArns": ten}).to_string();
        let e = plan_allow(Some(&full), ours, "d", false).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let nine =
            serde_json::json!({"redrivePermission": "byQueue", "sourceQueueArns": &ten[..9]}).to_string();
        assert_eq!(
            sources(&plan_allow(Some(&nine), ours, "d", false).unwrap().unwrap()).len(),
            10
        );
        assert!(plan_allow(Some(r#"{"redrivePermission":"maybe"}"#), ours, "d", false).is_err());
        assert_eq!(
            sibling_arn("arn:aws:sqs:eu-west-1:1:dlq", "jobs"),
            "arn:aws:sqs:eu-west-1:1:jobs"
        );
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
