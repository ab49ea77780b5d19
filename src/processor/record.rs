//! One SQS record, whichever runtime received it.

use std::collections::HashMap;

use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};

use crate::core::envelope::{JOB_ID_ATTRIBUTE, JOB_TYPE_ATTRIBUTE};

/// A received SQS message, as the processor needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Incoming {
    /// The SQS message id (never empty for a record the processor reports on).
    pub message_id: String,
    /// The receipt handle of this delivery.
    pub receipt_handle: String,
    /// The body, byte for byte.
    pub body: String,
    /// `ApproximateReceiveCount` (1 on the first delivery).
    pub receive_count: u32,
    /// `ApproximateFirstReceiveTimestamp` (epoch ms), if SQS sent it.
    pub first_received_at_ms: Option<u64>,
    /// `SentTimestamp` (epoch ms), if SQS sent it: the queue's retention counts from it.
    pub sent_at_ms: Option<u64>,
    /// `MessageGroupId` on FIFO queues.
    pub group_id: Option<String>,
    /// The producer's message attributes, kept for the DLQ copy.
    pub attributes: HashMap<String, MessageAttributeValue>,
    /// True when the record says it came from a FIFO queue (its event source ARN).
    pub from_fifo: bool,
    /// The queue the record says it came from (its event source ARN, Lambda's records only):
    /// checked against the source queue the processor works for.
    pub source_arn: Option<String>,
}

impl Incoming {
    /// The string value of a message attribute.
    pub(crate) fn string_attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).and_then(|a| a.string_value())
    }

    /// The `job-type` attribute.
    pub fn job_type_attribute(&self) -> Option<&str> {
        self.string_attribute(JOB_TYPE_ATTRIBUTE)
    }

    /// The `job-id` attribute.
    pub fn job_id_attribute(&self) -> Option<&str> {
        self.string_attribute(JOB_ID_ATTRIBUTE)
    }

    /// The first routing attribute (`job-type`, `job-id`) that is there without a string value
    /// (a `Binary` one): routing by the body instead would be a guess.
    pub fn unroutable_attribute(&self) -> Option<&'static str> {
        [JOB_TYPE_ATTRIBUTE, JOB_ID_ATTRIBUTE].into_iter().find(|name| {
            self.attributes
                .get(*name)
                .is_some_and(|a| a.string_value().is_none())
        })
    }

    /// Reads a message received with the SDK (the worker asks for all attributes).
    pub fn from_sdk(m: Message) -> Self {
        let sys = m.attributes.unwrap_or_default();
        let get = |k: MessageSystemAttributeName| sys.get(&k).map(String::as_str);
        Self {
            receive_count: parse_count(get(MessageSystemAttributeName::ApproximateReceiveCount)),
            first_received_at_ms: get(MessageSystemAttributeName::ApproximateFirstReceiveTimestamp)
                .and_then(|v| v.parse().ok()),
            sent_at_ms: get(MessageSystemAttributeName::SentTimestamp).and_then(|v| v.parse().ok()),
            group_id: get(MessageSystemAttributeName::MessageGroupId).map(str::to_owned),
            message_id: m.message_id.unwrap_or_default(),
            receipt_handle: m.receipt_handle.unwrap_or_default(),
            body: m.body.unwrap_or_default(),
            attributes: m.message_attributes.unwrap_or_default(),
            from_fifo: false,
            source_arn: None,
        }
    }
}

/// A missing or unreadable receive count is read as 1: the ledger read is skipped and the
/// ledger's conditional write still keeps the count exact.
pub(crate) fn parse_count(v: Option<&str>) -> u32 {
    v.and_then(read_count).unwrap_or(1)
}

/// A receive count as written: `None` unless it reads as a count of at least 1.
pub(crate) fn read_count(v: &str) -> Option<u32> {
    v.parse().ok().filter(|n| *n >= 1)
}
