//! Batched SQS actions: visibility changes, sends and deletes, ten entries a call, chunks in
//! parallel, only failed entries retried, each entry's fate reported back by its key.

use std::collections::HashMap;
use std::future::Future;
use tokio::time::Instant;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    BatchResultErrorEntry, ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageAttributeValue, SendMessageBatchRequestEntry,
};
use futures::future::join_all;

use super::storage_retry::{BatchStep, StorageError, StorageRetry};
use crate::core::error::is_throttling_code;

/// SQS's limit of entries per batch call.
pub const BATCH_LIMIT: usize = 10;

/// What happened to each entry of a batched action, by key.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EntryResults {
    /// Keys of entries SQS accepted.
    pub accepted: Vec<usize>,
    /// Keys of entries that failed, with why.
    pub failed: Vec<(usize, String)>,
}

impl EntryResults {
    fn absorb(&mut self, other: EntryResults) {
        self.accepted.extend(other.accepted);
        self.failed.extend(other.failed);
    }
}

/// A message to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// The caller's key for this entry.
    pub key: usize,
    /// The body.
    pub body: String,
    /// Message attributes.
    pub attributes: HashMap<String, MessageAttributeValue>,
    /// FIFO message group.
    pub group_id: Option<String>,
    /// FIFO deduplication id.
    pub dedup_id: Option<String>,
    /// Delivery delay in seconds (standard queues).
    pub delay_seconds: Option<i32>,
}

/// The SQS side of the effects.
#[derive(Debug, Clone)]
pub struct Sqs {
    client: Client,
    retry: StorageRetry,
}

fn entry_id(key: usize) -> String {
    format!("e{key}")
}

/// Worth sending again: throttled or not the sender's fault.
fn retryable(e: &BatchResultErrorEntry) -> bool {
    is_throttling_code(e.code()) || !e.sender_fault()
}

/// Sorts a chunk's entries by the response's failed list: absent means accepted.
fn sort<E>(
    pending: Vec<E>,
    key: impl Fn(&E) -> usize,
    failed: &[BatchResultErrorEntry],
) -> BatchStep<E, usize> {
    let by_id: HashMap<&str, &BatchResultErrorEntry> = failed.iter().map(|f| (f.id(), f)).collect();
    let mut step = BatchStep::default();
    for e in pending {
        let k = key(&e);
        match by_id.get(entry_id(k).as_str()) {
            None => step.succeeded.push(k),
            Some(f) if retryable(f) => step.retry.push(e),
            Some(f) => {
                let why = format!("{}: {}", f.code(), f.message().unwrap_or("rejected"));
                step.failed.push((e, why));
            }
        }
    }
    step
}

impl Sqs {
    /// SQS actions through `retry`.
    pub fn new(client: Client, retry: StorageRetry) -> Self {
        Self { client, retry }
    }

    /// The SDK client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The storage retry policy these actions go through.
    pub fn retry(&self) -> &StorageRetry {
        &self.retry
    }

    /// Runs one batched action over every entry, ten a call, chunks in parallel.
    async fn batched<E, F, Fut>(
        &self,
        op: &'static str,
        deadline: Option<Instant>,
        entries: Vec<E>,
        key: fn(&E) -> usize,
        call: F,
    ) -> EntryResults
    where
        E: Clone,
        F: Fn(Vec<E>) -> Fut + Clone,
        Fut: Future<Output = Result<Vec<BatchResultErrorEntry>, StorageError>>,
    {
        let mut chunks = Vec::new();
        let mut it = entries.into_iter().peekable();
        while it.peek().is_some() {
            chunks.push(it.by_ref().take(BATCH_LIMIT).collect::<Vec<_>>());
        }
        let results = join_all(chunks.into_iter().map(|chunk| {
            let call = call.clone();
            async move {
                let r = self
                    .retry
                    .batch(op, deadline, chunk, |pending: Vec<E>| {
                        let call = call.clone();
                        async move {
                            let failed = call(pending.clone()).await?;
                            Ok(sort(pending, key, &failed))
                        }
                    })
                    .await;
                EntryResults {
                    accepted: r.succeeded,
                    failed: r.failed.into_iter().map(|(e, why)| (key(&e), why)).collect(),
                }
            }
        }))
        .await;
        let mut out = EntryResults::default();
        results.into_iter().for_each(|r| out.absorb(r));
        out
    }

    /// Sets the visibility timeout of received messages: `(key, receipt handle, seconds)`.
    pub async fn change_visibility(
        &self,
        queue_url: &str,
        entries: Vec<(usize, String, i32)>,
        deadline: Option<Instant>,
    ) -> EntryResults {
        let call = |pending: Vec<(usize, String, i32)>| async move {
            let batch: Vec<_> = pending
                .iter()
                .map(|(k, receipt, secs)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(entry_id(*k))
                        .receipt_handle(receipt)
                        .visibility_timeout(*secs)
                        .build()
                        .expect("id and receipt handle are set")
                })
                .collect();
            let out = self
                .retry
                .call("ChangeMessageVisibilityBatch", deadline, || {
                    self.client
                        .change_message_visibility_batch()
                        .queue_url(queue_url)
                        .set_entries(Some(batch.clone()))
                        .send()
                })
                .await?;
            Ok(out.failed().to_vec())
        };
        self.batched("ChangeMessageVisibilityBatch", deadline, entries, |e| e.0, call)
            .await
    }

    /// Deletes received messages: `(key, receipt handle)`.
    pub async fn delete(
        &self,
        queue_url: &str,
        entries: Vec<(usize, String)>,
        deadline: Option<Instant>,
    ) -> EntryResults {
        let call = |pending: Vec<(usize, String)>| async move {
            let batch: Vec<_> = pending
                .iter()
                .map(|(k, receipt)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(entry_id(*k))
                        .receipt_handle(receipt)
                        .build()
                        .expect("id and receipt handle are set")
                })
                .collect();
            let out = self
                .retry
                .call("DeleteMessageBatch", deadline, || {
                    self.client
                        .delete_message_batch()
                        .queue_url(queue_url)
                        .set_entries(Some(batch.clone()))
                        .send()
                })
                .await?;
            Ok(out.failed().to_vec())
        };
        self.batched("DeleteMessageBatch", deadline, entries, |e| e.0, call)
            .await
    }

    /// Sends messages.
    pub async fn send(
        &self,
        queue_url: &str,
        entries: Vec<Outgoing>,
        deadline: Option<Instant>,
    ) -> EntryResults {
        let call = |pending: Vec<Outgoing>| async move {
            let batch: Vec<_> = pending
                .iter()
                .map(|m| {
                    SendMessageBatchRequestEntry::builder()
                        .id(entry_id(m.key))
                        .message_body(&m.body)
                        .set_message_attributes((!m.attributes.is_empty()).then(|| m.attributes.clone()))
                        .set_message_group_id(m.group_id.clone())
                        .set_message_deduplication_id(m.dedup_id.clone())
                        .set_delay_seconds(m.delay_seconds)
                        .build()
                        .expect("id and body are set")
                })
                .collect();
            let out = self
                .retry
                .call("SendMessageBatch", deadline, || {
                    self.client
                        .send_message_batch()
                        .queue_url(queue_url)
                        .set_entries(Some(batch.clone()))
                        .send()
                })
                .await?;
            Ok(out.failed().to_vec())
        };
        self.batched("SendMessageBatch", deadline, entries, |m| m.key, call)
            .await
    }
}
