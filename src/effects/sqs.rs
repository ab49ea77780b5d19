//! Batched SQS actions: visibility changes, sends and deletes, chunks in parallel, only failed
//! entries retried, each entry's fate reported back by its key.
//!
//! A batch holds at most ten entries and, for sends, at most [`BATCH_BYTES`] of payload (every
//! entry's body and message attributes); [`batches`] is the one place that splits by both. An
//! entry counts as done only when the answer lists it under `Successful`: one listed under
//! `Failed` failed (and is sent again when the failure is retryable), and one listed in
//! neither is unknown, so it is sent again and, if still unaccounted when the retries end,
//! reported failed.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Mutex;
use tokio::time::Instant;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    BatchResultErrorEntry, ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageAttributeValue, SendMessageBatchRequestEntry,
};
use futures::future::join_all;

use super::aws_errors::{CodeClass, code_class};
use super::dlq::attribute_size;
use super::storage_retry::{BatchStep, StorageError, StorageRetry};

/// SQS's limit of entries per batch call.
pub const BATCH_LIMIT: usize = 10;
/// SQS's limit on a SendMessageBatch's payload: the bodies and message attributes (name, data
/// type and value) of all its entries together, 1 MiB.
pub const BATCH_BYTES: usize = 1_048_576;

/// What happened to each entry of a batched action, by key.
#[derive(Debug, Default, Clone)]
pub struct EntryResults {
    /// Keys of entries SQS accepted (listed under `Successful`).
    pub accepted: Vec<usize>,
    /// Keys of entries that failed, with why (`CODE: message` when SQS named the entry).
    pub failed: Vec<(usize, String)>,
    /// The SQS message id of each sent entry, by key (sends only).
    pub message_ids: HashMap<usize, String>,
    /// The error code of each failed entry, by key, when there is one.
    pub codes: HashMap<usize, String>,
    /// A whole-call failure that stopped some entries, when one did (e.g. the queue does not
    /// exist): callers tell "SQS refused these entries" from "SQS was not reached".
    pub error: Option<StorageError>,
}

impl EntryResults {
    fn absorb(&mut self, other: EntryResults) {
        self.accepted.extend(other.accepted);
        self.failed.extend(other.failed);
        self.message_ids.extend(other.message_ids);
        self.codes.extend(other.codes);
        if self.error.is_none() {
            self.error = other.error;
        }
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

impl Outgoing {
    /// Bytes this message counts toward a batch's [`BATCH_BYTES`]: its body and every
    /// attribute's name, data type and value.
    pub fn payload_bytes(&self) -> usize {
        self.body.len()
            + self
                .attributes
                .iter()
                .map(|(k, v)| attribute_size(k, v))
                .sum::<usize>()
    }
}

/// Splits messages, in order, into batches of at most `max_entries` (1 to 10) entries and
/// [`BATCH_BYTES`] of payload. A message larger than the cap on its own is a batch of its own
/// (SQS then refuses it, and only it).
pub fn batches(messages: Vec<Outgoing>, max_entries: usize) -> Vec<Vec<Outgoing>> {
    split(messages, max_entries, BATCH_BYTES, Outgoing::payload_bytes)
}

/// Greedy split in order by entry count and summed size.
fn split<T>(items: Vec<T>, max_entries: usize, max_bytes: usize, size: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let max_entries = max_entries.clamp(1, BATCH_LIMIT);
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let n = size(&item);
        let full = out
            .last()
            .is_none_or(|b| b.len() >= max_entries || bytes + n > max_bytes);
        if full {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += n;
        out.last_mut().expect("a batch was just pushed").push(item);
    }
    out
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

/// Worth sending again: by the code table when it knows the code (throttling and server
/// faults are, refusals and conflicts are not), else when SQS says it was not the sender's
/// fault.
fn retryable(e: &BatchResultErrorEntry) -> bool {
    match code_class(e.code()) {
        Some(CodeClass::Throttling | CodeClass::ServerFault) => true,
        Some(CodeClass::Refused | CodeClass::Conflict) => false,
        None => !e.sender_fault(),
    }
}

/// One batch call's answer: the ids listed under `Successful` (with the message id, for sends)
/// and the entries listed under `Failed`.
struct Answer {
    successful: Vec<(String, Option<String>)>,
    failed: Vec<BatchResultErrorEntry>,
}

impl Answer {
    /// The answer of a call whose successful entries carry only their ids.
    fn of_ids<'a>(successful: impl Iterator<Item = &'a str>, failed: &[BatchResultErrorEntry]) -> Self {
        Self {
            successful: successful.map(|id| (id.to_owned(), None)).collect(),
            failed: failed.to_vec(),
        }
    }
}

/// Sorts a chunk's entries by the answer: listed as successful means accepted; listed as
/// failed means failed (sent again when retryable); listed in neither means unknown, and it is
/// sent again.
fn sort<E>(
    pending: Vec<E>,
    key: impl Fn(&E) -> usize,
    answer: &Answer,
    codes: &Mutex<HashMap<usize, String>>,
) -> BatchStep<E, (usize, Option<String>)> {
    let failed: HashMap<&str, &BatchResultErrorEntry> = answer.failed.iter().map(|f| (f.id(), f)).collect();
    let ok: HashMap<&str, &Option<String>> =
        answer.successful.iter().map(|(id, m)| (id.as_str(), m)).collect();
    let mut step = BatchStep::default();
    for e in pending {
        let k = key(&e);
        let id = entry_id(k);
        match (failed.get(id.as_str()), ok.get(id.as_str())) {
            (Some(f), _) if retryable(f) => step.retry.push(e),
            (Some(f), _) => {
                codes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(k, f.code().to_owned());
                let why = format!("{}: {}", f.code(), f.message().unwrap_or("rejected"));
                step.failed.push((e, why));
            }
            (None, Some(message_id)) => step.succeeded.push((k, (*message_id).clone())),
            (None, None) => step.retry.push(e),
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

    /// Runs one batched action over every chunk: in parallel, or one after another when
    /// `in_order` (sends to a FIFO queue, whose order across calls is the order of the calls).
    async fn batched<E, F, Fut>(
        &self,
        op: &'static str,
        deadline: Option<Instant>,
        chunks: Vec<Vec<E>>,
        key: fn(&E) -> usize,
        call: F,
        in_order: bool,
    ) -> EntryResults
    where
        E: Clone,
        F: Fn(Vec<E>) -> Fut + Clone,
        Fut: Future<Output = Result<Answer, StorageError>>,
    {
        let run = |chunk: Vec<E>| {
            let call = call.clone();
            async move {
                let codes = Mutex::new(HashMap::new());
                // A failure of the call itself (not of entries the answer named or left out).
                let whole: Mutex<Option<StorageError>> = Mutex::new(None);
                let r = self
                    .retry
                    .batch(op, deadline, chunk, |pending: Vec<E>| {
                        let call = call.clone();
                        let (codes, whole) = (&codes, &whole);
                        async move {
                            let answer = call(pending.clone()).await.inspect_err(|e| {
                                *whole.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
                            })?;
                            Ok(sort(pending, key, &answer, codes))
                        }
                    })
                    .await;
                let mut codes = codes.into_inner().unwrap_or_else(|p| p.into_inner());
                let whole = whole.into_inner().unwrap_or_else(|p| p.into_inner());
                let failed: Vec<(usize, String)> =
                    r.failed.into_iter().map(|(e, why)| (key(&e), why)).collect();
                if let Some(code) = whole.as_ref().and_then(|e| e.code()) {
                    for (k, _) in &failed {
                        codes.entry(*k).or_insert_with(|| code.to_owned());
                    }
                }
                let failed_keys: HashSet<usize> = failed.iter().map(|(k, _)| *k).collect();
                codes.retain(|k, _| failed_keys.contains(k));
                let mut out = EntryResults {
                    failed,
                    codes,
                    error: whole,
                    ..EntryResults::default()
                };
                for (k, message_id) in r.succeeded {
                    out.accepted.push(k);
                    if let Some(m) = message_id {
                        out.message_ids.insert(k, m);
                    }
                }
                out
            }
        };
        let chunks = chunks.into_iter().filter(|c| !c.is_empty());
        let results = if in_order {
            let mut results = Vec::new();
            for chunk in chunks {
                results.push(run(chunk).await);
            }
            results
        } else {
            join_all(chunks.map(run)).await
        };
        let mut out = EntryResults::default();
        results.into_iter().for_each(|r| out.absorb(r));
        out
    }

    /// Ten entries a chunk.
    fn tens<E>(entries: Vec<E>) -> Vec<Vec<E>> {
        split(entries, BATCH_LIMIT, usize::MAX, |_| 0)
    }

    /// Changes the visibility of received messages: `(key, receipt handle, seconds)`.
    #[cfg(any(test, feature = "internals"))]
    pub async fn change_visibility(
        &self,
        queue_url: &str,
        entries: Vec<(usize, String, i32)>,
        deadline: Option<Instant>,
    ) -> EntryResults {
        let entries = entries.into_iter().map(|(k, r, s)| (k, r, s, None)).collect();
        self.change_visibility_by(queue_url, entries, deadline).await
    }

    /// Changes the visibility of received messages: `(key, receipt handle, seconds, by)`. An
    /// entry with `by` makes its message visible again by then at the latest: each try
    /// sends the seconds left until `by`, rounded down, when fewer (a try retried after
    /// throttling lands later than the first). SQS counts from when it takes the call, so
    /// only the try's time on the wire can pass `by`.
    pub(crate) async fn change_visibility_by(
        &self,
        queue_url: &str,
        entries: Vec<(usize, String, i32, Option<Instant>)>,
        deadline: Option<Instant>,
    ) -> EntryResults {
        let call = |pending: Vec<(usize, String, i32, Option<Instant>)>| async move {
            let batch = || -> Vec<_> {
                let now = Instant::now();
                pending
                    .iter()
                    .map(|(k, receipt, secs, by)| {
                        let left = by.map_or(*secs, |by| {
                            by.saturating_duration_since(now).as_secs().min(i32::MAX as u64) as i32
                        });
                        ChangeMessageVisibilityBatchRequestEntry::builder()
                            .id(entry_id(*k))
                            .receipt_handle(receipt)
                            .visibility_timeout((*secs).min(left))
                            .build()
                            .expect("id and receipt handle are set")
                    })
                    .collect()
            };
            let out = self
                .retry
                .call("ChangeMessageVisibilityBatch", deadline, || {
                    self.client
                        .change_message_visibility_batch()
                        .queue_url(queue_url)
                        .set_entries(Some(batch()))
                        .send()
                })
                .await?;
            Ok(Answer::of_ids(out.successful().iter().map(|s| s.id()), out.failed()))
        };
        self.batched(
            "ChangeMessageVisibilityBatch",
            deadline,
            Self::tens(entries),
            |e| e.0,
            call,
            false,
        )
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
            Ok(Answer::of_ids(out.successful().iter().map(|s| s.id()), out.failed()))
        };
        self.batched(
            "DeleteMessageBatch",
            deadline,
            Self::tens(entries),
            |e| e.0,
            call,
            false,
        )
        .await
    }

    /// Sends messages, in batches of at most ten entries and [`BATCH_BYTES`] (see [`batches`]),
    /// in parallel — one after another to a FIFO queue, so the order of `entries` holds, and
    /// once an entry of a message group is not sent, no later entry of that group is (it is
    /// reported failed with code `GroupStopped`). Keys must be distinct.
    pub async fn send(
        &self,
        queue_url: &str,
        entries: Vec<Outgoing>,
        deadline: Option<Instant>,
    ) -> EntryResults {
        if !queue_url.ends_with(".fifo") {
            return self
                .send_batches(queue_url, batches(entries, BATCH_LIMIT), deadline, false)
                .await;
        }
        let mut out = EntryResults::default();
        let mut stopped: HashSet<String> = HashSet::new();
        for batch in batches(entries, BATCH_LIMIT) {
            let (held, go): (Vec<Outgoing>, Vec<Outgoing>) = batch
                .into_iter()
                .partition(|m| m.group_id.as_ref().is_some_and(|g| stopped.contains(g)));
            for m in held {
                out.failed.push((
                    m.key,
                    "GroupStopped: an earlier message of its group was not sent".into(),
                ));
                out.codes.insert(m.key, "GroupStopped".into());
            }
            let groups: HashMap<usize, String> = go
                .iter()
                .filter_map(|m| m.group_id.clone().map(|g| (m.key, g)))
                .collect();
            let sent = self.send_batches(queue_url, vec![go], deadline, true).await;
            stopped.extend(sent.failed.iter().filter_map(|(k, _)| groups.get(k).cloned()));
            out.absorb(sent);
        }
        out
    }

    async fn send_batches(
        &self,
        queue_url: &str,
        chunks: Vec<Vec<Outgoing>>,
        deadline: Option<Instant>,
        in_order: bool,
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
            Ok(Answer {
                successful: out
                    .successful()
                    .iter()
                    .map(|s| (s.id().to_owned(), Some(s.message_id().to_owned())))
                    .collect(),
                failed: out.failed().to_vec(),
            })
        };
        self.batched("SendMessageBatch", deadline, chunks, |m| m.key, call, in_order)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(key: usize, body_bytes: usize, attr_bytes: usize) -> Outgoing {
        let mut attributes = HashMap::new();
        if attr_bytes > 0 {
            // name "a" (1) + "String" (6) + value
            let v = MessageAttributeValue::builder()
                .data_type("String")
                .string_value("v".repeat(attr_bytes - 7))
                .build()
                .unwrap();
            attributes.insert("a".to_owned(), v);
        }
        Outgoing {
            key,
            body: "b".repeat(body_bytes),
            attributes,
            group_id: None,
            dedup_id: None,
            delay_seconds: None,
        }
    }

    fn keys(b: &[Vec<Outgoing>]) -> Vec<Vec<usize>> {
        b.iter().map(|c| c.iter().map(|m| m.key).collect()).collect()
    }

    #[test]
    fn batches_split_by_entries_and_by_bytes_in_order() {
        let small: Vec<_> = (0..25).map(|k| msg(k, 10, 0)).collect();
        assert_eq!(
            batches(small, 10).iter().map(Vec::len).collect::<Vec<_>>(),
            vec![10, 10, 5]
        );
        let big: Vec<_> = (0..10).map(|k| msg(k, 110_000, 0)).collect();
        let b = batches(big, 10);
        assert_eq!(keys(&b), vec![(0..9).collect::<Vec<_>>(), vec![9]]);
        for c in &b {
            assert!(c.iter().map(Outgoing::payload_bytes).sum::<usize>() <= BATCH_BYTES);
        }
        // Attributes count: 10 × (100,000 + 6,000) is over the cap, bodies alone are not.
        let attrs: Vec<_> = (0..10).map(|k| msg(k, 100_000, 6_000)).collect();
        assert_eq!(batches(attrs, 10).len(), 2);
        // Exactly at the cap fits.
        let exact: Vec<_> = (0..2).map(|k| msg(k, BATCH_BYTES / 2, 0)).collect();
        assert_eq!(batches(exact, 10).len(), 1);
        // Fewer entries per batch when asked.
        let few: Vec<_> = (0..5).map(|k| msg(k, 1, 0)).collect();
        assert_eq!(keys(&batches(few, 2)), vec![vec![0, 1], vec![2, 3], vec![4]]);
    }

    #[test]
    fn an_entry_over_the_cap_is_a_batch_of_its_own() {
        let ms = vec![msg(0, 10, 0), msg(1, BATCH_BYTES + 1, 0), msg(2, 10, 0)];
        assert_eq!(keys(&batches(ms, 10)), vec![vec![0], vec![1], vec![2]]);
        assert!(batches(Vec::new(), 10).is_empty());
    }

    fn error(id: &str, code: &str, sender_fault: bool) -> BatchResultErrorEntry {
        BatchResultErrorEntry::builder()
            .id(id)
            .code(code)
            .sender_fault(sender_fault)
            .message("m")
            .build()
            .unwrap()
    }

    /// The code table decides before SQS's `SenderFault` flag: an entry refused with a code no
    /// retry can fix is not sent again even when the flag says "not your fault", and a server
    /// fault is sent again even when the flag blames the sender (the storage policy already
    /// read the same codes this way for whole calls).
    #[test]
    fn entry_codes_in_the_table_decide_before_the_sender_fault_flag() {
        assert!(!retryable(&error("e", "AccessDenied", false)));
        assert!(!retryable(&error(
            "e",
            "AWS.SimpleQueueService.NonExistentQueue",
            false
        )));
        assert!(retryable(&error("e", "InternalError", true)));
        assert!(retryable(&error("e", "ServiceUnavailable", true)));
    }

    #[test]
    fn only_entries_listed_as_successful_are_accepted() {
        let codes = Mutex::new(HashMap::new());
        let answer = Answer {
            successful: vec![("e0".into(), Some("m0".into()))],
            failed: vec![
                error("e1", "InvalidParameterValue", true),
                error("e2", "InternalError", false),
            ],
        };
        let step = sort(vec![0usize, 1, 2, 3], |k| *k, &answer, &codes);
        assert_eq!(step.succeeded, vec![(0, Some("m0".to_owned()))]);
        assert!(retryable(&error("e", "ThrottlingException", true)));
        assert!(retryable(&error("e", "SomethingNew", false)));
        assert!(!retryable(&error("e", "SomethingNew", true)));
        assert_eq!(step.failed.len(), 1);
        assert_eq!(step.failed[0].0, 1);
        assert!(step.failed[0].1.starts_with("InvalidParameterValue: "));
        assert_eq!(
            step.retry,
            vec![2, 3],
            "retryable and unaccounted entries go again"
        );
        assert_eq!(
            codes.lock().unwrap().get(&1).map(String::as_str),
            Some("InvalidParameterValue")
        );

        let empty = Answer {
            successful: Vec::new(),
            failed: Vec::new(),
        };
        let step = sort(vec![0usize, 1], |k| *k, &empty, &Mutex::new(HashMap::new()));
        assert!(step.succeeded.is_empty());
        assert_eq!(step.retry, vec![0, 1]);
    }
}
