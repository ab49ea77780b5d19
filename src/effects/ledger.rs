//! The attempt ledger: exact handler-execution counts per job, in DynamoDB.
//!
//! One item per job id (`pk = job#<id>`, `sk = ledger`). An execution is counted with one
//! conditional `UpdateItem` keyed on the delivery (its receive count): `ADD` makes racing
//! distinct deliveries each count once, and the condition
//! `attribute_not_exists(pk) OR NOT contains(deliveries, :delivery)` makes the same delivery
//! count at most once. First deliveries need no read; redeliveries are read with one
//! `BatchGetItem` per 100 ids. See `docs/state.md` for why each condition is safe.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, KeysAndAttributes, ReturnValue, WriteRequest};
use tokio::time::Instant;

use super::storage_retry::{BatchStep, StorageError, StorageRetry};
use super::table::{LEDGER_SK, PK, TTL_ATTRIBUTE, get_consistent, ledger_key, ledger_pk};
use crate::core::decision::StoredAttempts;

/// Most keys one `BatchGetItem` accepts.
pub const BATCH_GET_MAX: usize = 100;
/// Most requests one `BatchWriteItem` accepts.
pub const BATCH_WRITE_MAX: usize = 25;
/// Longest stored error text (bytes); longer texts are cut at a character boundary.
pub const LAST_ERROR_MAX: usize = 1024;
/// Default item lifetime: SQS's longest retention (14 days) plus a day, so an item outlives
/// every message that can still refer to it.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15 * 24 * 3600);

/// The answer of [`AttemptLedger::count`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// This delivery was counted; the job now has this many executions.
    New(u32),
    /// This delivery had already been counted (a duplicate report): nothing changed.
    AlreadyCounted,
}

/// A ledger item as the CLI shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerItem {
    /// The job id.
    pub job_id: String,
    /// Handler executions counted.
    pub attempts: u32,
    /// The job must not run before this (epoch ms).
    pub next_attempt_at_ms: Option<u64>,
    /// The last failure's text (at most [`LAST_ERROR_MAX`] bytes).
    pub last_error: Option<String>,
    /// The job type.
    pub job_type: Option<String>,
    /// The receive count of the last counted delivery.
    pub last_receive_count: Option<u32>,
    /// Every counted delivery, as `<message id>#<receive count>`.
    pub deliveries: Vec<String>,
    /// Last write (epoch ms).
    pub updated_at_ms: Option<u64>,
    /// When DynamoDB's TTL may remove it (epoch s).
    pub expires_at_s: Option<u64>,
}

impl LedgerItem {
    /// The part the decision needs.
    pub fn stored(&self) -> StoredAttempts {
        StoredAttempts {
            attempts: self.attempts,
            next_attempt_at_ms: self.next_attempt_at_ms,
        }
    }

    fn parse(item: &HashMap<String, AttributeValue>) -> Option<Self> {
        let pk = s(item, PK)?;
        let mut deliveries: Vec<String> = match item.get("deliveries") {
            Some(AttributeValue::Ss(v)) => v.clone(),
            _ => Vec::new(),
        };
        deliveries.sort_unstable();
        Some(Self {
            job_id: pk.strip_prefix("job#").unwrap_or(pk).to_owned(),
            attempts: n(item, "attempts").unwrap_or(0) as u32,
            next_attempt_at_ms: n(item, "next_attempt_at"),
            last_error: s(item, "last_error").map(str::to_owned),
            job_type: s(item, "job_type").map(str::to_owned),
            last_receive_count: n(item, "last_receive_count").map(|v| v as u32),
            deliveries,
            updated_at_ms: n(item, "updated_at"),
            expires_at_s: n(item, TTL_ATTRIBUTE),
        })
    }
}

fn s<'a>(item: &'a HashMap<String, AttributeValue>, k: &str) -> Option<&'a str> {
    item.get(k).and_then(|v| v.as_s().ok()).map(String::as_str)
}

fn n(item: &HashMap<String, AttributeValue>, k: &str) -> Option<u64> {
    item.get(k)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}

fn num(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// Cuts `text` to at most `max` bytes at a character boundary.
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The ids once each, in first-seen order.
fn distinct<I, S>(job_ids: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut seen = HashSet::new();
    job_ids
        .into_iter()
        .map(|s| s.as_ref().to_owned())
        .filter(|id| seen.insert(id.clone()))
        .collect()
}

/// One delivery of a message: what makes a handler execution countable exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery<'a> {
    /// The SQS message id.
    pub message_id: &'a str,
    /// Its `ApproximateReceiveCount` at this delivery.
    pub receive_count: u32,
}

/// The attempt ledger over one table.
#[derive(Debug, Clone)]
pub struct AttemptLedger {
    client: Client,
    table: String,
    retry: StorageRetry,
    ttl: Duration,
}

impl AttemptLedger {
    /// A ledger in `table`, every call through `retry`.
    pub fn new(client: Client, table: impl Into<String>, retry: StorageRetry) -> Self {
        Self {
            client,
            table: table.into(),
            retry,
            ttl: DEFAULT_TTL,
        }
    }

    /// Sets how long items live after their last write (default [`DEFAULT_TTL`]).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Reads the stored attempts of redelivered jobs: one consistent `BatchGetItem` per 100
    /// distinct ids (chunks in parallel), unprocessed keys sent again. Jobs without an item
    /// are absent from the map (no counted attempts).
    pub async fn read_many<I, S>(
        &self,
        job_ids: I,
        deadline: Option<Instant>,
    ) -> Result<HashMap<String, StoredAttempts>, StorageError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let ids = distinct(job_ids);
        let chunks = ids
            .chunks(BATCH_GET_MAX)
            .map(|c| self.read_chunk(c.to_vec(), deadline));
        let mut out = HashMap::with_capacity(ids.len());
        for part in futures::future::try_join_all(chunks).await? {
            out.extend(part);
        }
        Ok(out)
    }

    async fn read_chunk(
        &self,
        ids: Vec<String>,
        deadline: Option<Instant>,
    ) -> Result<Vec<(String, StoredAttempts)>, StorageError> {
        let result = self
            .retry
            .batch("BatchGetItem", deadline, ids, |pending| async move {
                let mut keys = KeysAndAttributes::builder().consistent_read(true);
                for id in &pending {
                    keys = keys.keys(ledger_key(id));
                }
                let keys = keys.build().expect("keys are set");
                let resp = self
                    .retry
                    .call("BatchGetItem", deadline, || {
                        self.client
                            .batch_get_item()
                            .request_items(&self.table, keys.clone())
                            .send()
                    })
                    .await
                    .map_err(|e| e.with_resource(&self.table))?;
                let mut step = BatchStep::default();
                if let Some(items) = resp.responses().and_then(|r| r.get(&self.table)) {
                    for item in items {
                        if let Some(parsed) = LedgerItem::parse(item) {
                            step.succeeded.push((parsed.job_id.clone(), parsed.stored()));
                        }
                    }
                }
                if let Some(un) = resp.unprocessed_keys().and_then(|u| u.get(&self.table)) {
                    for key in un.keys() {
                        if let Some(id) = key
                            .get(PK)
                            .and_then(|v| v.as_s().ok())
                            .and_then(|pk| pk.strip_prefix("job#"))
                        {
                            step.retry.push(id.to_owned());
                        }
                    }
                }
                Ok(step)
            })
            .await;
        match result.error {
            Some(e) => Err(e),
            None => Ok(result.succeeded),
        }
    }

    /// Counts one handler execution of delivery `receive_count` (its
    /// `ApproximateReceiveCount`). The same delivery is counted at most once; distinct
    /// deliveries are each counted once, in any order. Also stores the job type, the
    /// earliest next attempt and the last error (cut to [`LAST_ERROR_MAX`] bytes).
    pub async fn count(
        &self,
        job_id: &str,
        delivery: Delivery<'_>,
        job_type: &str,
        next_attempt_at_ms: Option<u64>,
        last_error: &str,
        deadline: Option<Instant>,
    ) -> Result<Counted, StorageError> {
        let now = now_ms();
        let receive_count = delivery.receive_count;
        // Keyed by message as well as receive count: a producer's re-send of the same job id
        // is a new message whose deliveries count too.
        let delivery = format!("{}#{}", delivery.message_id, delivery.receive_count);
        let mut set = "SET last_receive_count = :rc, job_type = :jt, last_error = :err, \
                       updated_at = :now, expires_at = :exp"
            .to_owned();
        if next_attempt_at_ms.is_some() {
            set.push_str(", next_attempt_at = :next");
        }
        let mut expr = format!("ADD attempts :one, deliveries :dset {set}");
        if next_attempt_at_ms.is_none() {
            expr.push_str(" REMOVE next_attempt_at");
        }
        let resp = self
            .retry
            .call("UpdateItem", deadline, || {
                let mut req = self
                    .client
                    .update_item()
                    .table_name(&self.table)
                    .set_key(Some(ledger_key(job_id)))
                    .update_expression(&expr)
                    .condition_expression("attribute_not_exists(pk) OR NOT contains(deliveries, :d)")
                    .expression_attribute_values(":one", num(1))
                    .expression_attribute_values(":dset", AttributeValue::Ss(vec![delivery.clone()]))
                    .expression_attribute_values(":d", AttributeValue::S(delivery.clone()))
                    .expression_attribute_values(":rc", num(u64::from(receive_count)))
                    .expression_attribute_values(":jt", AttributeValue::S(job_type.to_owned()))
                    .expression_attribute_values(
                        ":err",
                        AttributeValue::S(truncate(last_error, LAST_ERROR_MAX).to_owned()),
                    )
                    .expression_attribute_values(":now", num(now))
                    .expression_attribute_values(":exp", num(now / 1000 + self.ttl.as_secs()))
                    .return_values(ReturnValue::UpdatedNew);
                if let Some(at) = next_attempt_at_ms {
                    req = req.expression_attribute_values(":next", num(at));
                }
                req.send()
            })
            .await;
        match resp {
            Ok(out) => {
                let attempts = out.attributes().and_then(|a| n(a, "attempts")).unwrap_or(1) as u32;
                Ok(Counted::New(attempts))
            }
            Err(e) if e.is_conditional_check_failed() => Ok(Counted::AlreadyCounted),
            Err(e) => Err(e.with_resource(&self.table)),
        }
    }

    /// Deletes the ledgers of finished jobs (success of a redelivered job, dead-lettering):
    /// `BatchWriteItem` with at most 25 deletes per call, unprocessed items sent again.
    /// Deleting a missing item is not an error.
    pub async fn close<I, S>(&self, job_ids: I, deadline: Option<Instant>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let ids = distinct(job_ids);
        let chunks = ids
            .chunks(BATCH_WRITE_MAX)
            .map(|c| self.close_chunk(c.to_vec(), deadline));
        futures::future::try_join_all(chunks).await?;
        Ok(())
    }

    /// Same as [`close`](Self::close): forget jobs that are gone.
    pub async fn forget<I, S>(&self, job_ids: I, deadline: Option<Instant>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.close(job_ids, deadline).await
    }

    async fn close_chunk(&self, ids: Vec<String>, deadline: Option<Instant>) -> Result<(), StorageError> {
        let result: super::storage_retry::BatchResult<String, ()> = self
            .retry
            .batch("BatchWriteItem", deadline, ids, |pending| async move {
                let requests: Vec<WriteRequest> = pending
                    .iter()
                    .map(|id| {
                        let del = DeleteRequest::builder()
                            .set_key(Some(ledger_key(id)))
                            .build()
                            .expect("key is set");
                        WriteRequest::builder().delete_request(del).build()
                    })
                    .collect();
                let resp = self
                    .retry
                    .call("BatchWriteItem", deadline, || {
                        self.client
                            .batch_write_item()
                            .request_items(&self.table, requests.clone())
                            .send()
                    })
                    .await
                    .map_err(|e| e.with_resource(&self.table))?;
                let mut step = BatchStep::default();
                if let Some(un) = resp.unprocessed_items().and_then(|u| u.get(&self.table)) {
                    for w in un {
                        if let Some(id) = w
                            .delete_request()
                            .and_then(|d| d.key().get(PK))
                            .and_then(|v| v.as_s().ok())
                            .and_then(|pk| pk.strip_prefix("job#"))
                        {
                            step.retry.push(id.to_owned());
                        }
                    }
                }
                Ok(step)
            })
            .await;
        match result.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Removes a job's ledger so a replayed job starts with fresh attempts.
    pub async fn reset(&self, job_id: &str) -> Result<(), StorageError> {
        self.retry
            .call("DeleteItem", None, || {
                self.client
                    .delete_item()
                    .table_name(&self.table)
                    .set_key(Some(ledger_key(job_id)))
                    .send()
            })
            .await
            .map_err(|e| e.with_resource(&self.table))?;
        Ok(())
    }

    /// Reads one job's ledger (consistent read), for the CLI.
    pub async fn show(&self, job_id: &str) -> Result<Option<LedgerItem>, StorageError> {
        let item = get_consistent(&self.client, &self.retry, &self.table, ledger_key(job_id), None).await?;
        Ok(item.as_ref().and_then(LedgerItem::parse))
    }
}

/// The item key of a ledger (`pk`, `sk`), for callers that build their own requests.
pub fn key_of(job_id: &str) -> (String, &'static str) {
    (ledger_pk(job_id), LEDGER_SK)
}

#[cfg(test)]
mod tests {
    use super::super::table::SK;
    use super::*;

    #[test]
    fn truncates_at_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("abcdef", 3), "abc");
        assert_eq!(truncate("aé", 2), "a");
        let long = "x".repeat(5000);
        assert_eq!(truncate(&long, LAST_ERROR_MAX).len(), LAST_ERROR_MAX);
    }

    #[test]
    fn parses_items() {
        let item = HashMap::from([
            (PK.to_owned(), AttributeValue::S("job#j1".into())),
            (SK.to_owned(), AttributeValue::S("ledger".into())),
            ("attempts".to_owned(), num(3)),
            ("next_attempt_at".to_owned(), num(99)),
            (
                "deliveries".to_owned(),
                AttributeValue::Ss(vec!["m#3".into(), "m#1".into()]),
            ),
        ]);
        let parsed = LedgerItem::parse(&item).unwrap();
        assert_eq!(parsed.job_id, "j1");
        assert_eq!(parsed.deliveries, vec!["m#1", "m#3"]);
        assert_eq!(
            parsed.stored(),
            StoredAttempts {
                attempts: 3,
                next_attempt_at_ms: Some(99)
            }
        );
    }
}
