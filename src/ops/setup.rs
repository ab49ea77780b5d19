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
    /// as receives, so it must sit well above the retry policy's attempts.
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
    if opts.max_receive_count == 0 || opts.max_receive_count > 1000 {
        return Err(OpsError::usage("--max-receive-count must be between 1 and 1000"));
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
