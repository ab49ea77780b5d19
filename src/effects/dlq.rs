//! The DLQ copy of a message: the body byte for byte, its attributes, and the failure record.
//!
//! The rule: nothing of the original is lost within SQS's limits. Ten attributes already used
//! are packed into `triage-attributes` so the record still fits; the record's error text is cut
//! to the size limit, never the body; the message group travels. `docs/guarantees.md` states
//! what replay restores.

use std::collections::HashMap;

#[cfg(any(test, feature = "internals"))]
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::MessageAttributeValue;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::core::failure::{FAILURE_ATTRIBUTE, FailureRecord};
use crate::core::sqs_text;

/// Attribute holding the original attributes when they had to be packed.
pub const PACKED_ATTRIBUTE: &str = "triage-attributes";
/// SQS's limit on message attributes per message.
pub const MAX_ATTRIBUTES: usize = 10;

/// True for the attribute names the DLQ copy reserves for itself.
pub(crate) fn is_reserved(name: &str) -> bool {
    name == FAILURE_ATTRIBUTE || name == PACKED_ATTRIBUTE
}

fn without_reserved(
    attrs: &HashMap<String, MessageAttributeValue>,
) -> HashMap<String, MessageAttributeValue> {
    attrs
        .iter()
        .filter(|(k, _)| !is_reserved(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The `MessageGroupId` of a copy of a message (its DLQ copy, or a replayed copy) sent to
/// a FIFO queue (`fifo`) or a standard one: on a FIFO queue the message's group, else `fallback()` (a FIFO queue needs
/// one); on a standard queue the message's group when it has one (a fair queue's tenant, kept
/// so the copy counts against the same tenant), else none.
pub fn group_for(fifo: bool, group: Option<&str>, fallback: impl FnOnce() -> String) -> Option<String> {
    match group {
        Some(g) => Some(g.to_owned()),
        None if fifo => Some(fallback()),
        None => None,
    }
}

/// A message ready to send to the DLQ.
#[derive(Debug, Clone, PartialEq)]
pub struct DlqCopy {
    /// The original body.
    pub body: String,
    /// The original attributes plus the failure record.
    pub attributes: HashMap<String, MessageAttributeValue>,
}

/// Why a DLQ copy could not be made. The record then stays in its source queue.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DlqCopyError {
    /// Body and attributes leave no room for even a minimal failure record.
    #[error(
        "message is {used} bytes with its attributes; no failure record fits under the DLQ's {limit}-byte limit"
    )]
    NoRoom {
        /// Bytes used by body and original attributes.
        used: usize,
        /// The DLQ's maximum message size.
        limit: usize,
    },
    /// An attribute could not be packed or unpacked.
    #[error("message attribute `{0}` is malformed")]
    BadAttribute(String),
}

#[derive(Serialize, Deserialize)]
struct PackedValue {
    data_type: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    string: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    binary_b64: Option<String>,
}

/// Bytes an attribute counts toward the message size: name, data type and value.
pub fn attribute_size(name: &str, v: &MessageAttributeValue) -> usize {
    name.len()
        + v.data_type().len()
        + v.string_value().map_or(0, str::len)
        + v.binary_value().map_or(0, |b| b.as_ref().len())
}

fn string_attr(value: String) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .expect("data type is set")
}

fn pack(attrs: &HashMap<String, MessageAttributeValue>) -> Result<String, DlqCopyError> {
    let packed: HashMap<&str, PackedValue> = attrs
        .iter()
        .map(|(k, v)| {
            (
                k.as_str(),
                PackedValue {
                    data_type: v.data_type().to_owned(),
                    string: v.string_value().map(str::to_owned),
                    binary_b64: v
                        .binary_value()
                        .map(|b| aws_smithy_types::base64::encode(b.as_ref())),
                },
            )
        })
        .collect();
    serde_json::to_string(&packed)
        .map(sqs_text::json)
        .map_err(|_| DlqCopyError::BadAttribute(PACKED_ATTRIBUTE.into()))
}

/// The DLQ message size assumed while the DLQ's own limit cannot be read (SQS's default).
pub const FALLBACK_MAX_MESSAGE_BYTES: usize = 262_144;

/// The DLQ's message size limit (`MaximumMessageSize`), which every DLQ copy fits: given by
/// configuration (`TRIAGE_DLQ_MAX_BYTES`, which the stacks set from the DLQ they make), or
/// learned from the DLQ itself at the first batch that dead-letters anything, and kept for
/// the process's life. Start-up needs no call for it. Clones share what was learned.
#[derive(Debug, Clone)]
pub struct DlqLimit {
    bytes: std::sync::Arc<std::sync::OnceLock<usize>>,
}

impl DlqLimit {
    /// A limit known from configuration.
    pub fn known(bytes: usize) -> Self {
        let limit = Self::unknown();
        let _ = limit.bytes.set(bytes);
        limit
    }

    /// A limit to be read from the DLQ at its first use ([`learn`](Self::learn)).
    pub fn unknown() -> Self {
        Self {
            bytes: std::sync::Arc::default(),
        }
    }

    /// The limit, once known.
    pub fn get(&self) -> Option<usize> {
        self.bytes.get().copied()
    }

    /// The limit: known, or read now from `dlq_url` (`GetQueueAttributes`, through the
    /// storage retries, every try ending by `deadline`) and kept. A read that fails is not
    /// kept: this batch's copies are sized for [`FALLBACK_MAX_MESSAGE_BYTES`] (logged as a
    /// warning) and the next batch reads again.
    pub async fn learn(
        &self,
        sqs: &crate::effects::sqs::Sqs,
        dlq_url: &str,
        deadline: Option<tokio::time::Instant>,
    ) -> usize {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        if let Some(b) = self.get() {
            return b;
        }
        let read = sqs
            .retry()
            .call("GetQueueAttributes", deadline, || {
                sqs.client()
                    .get_queue_attributes()
                    .queue_url(dlq_url)
                    .attribute_names(A::MaximumMessageSize)
                    .send()
            })
            .await;
        let bytes = match read {
            Ok(out) => out
                .attributes
                .as_ref()
                .and_then(|a| a.get(&A::MaximumMessageSize))
                .and_then(|v| v.parse::<usize>().ok()),
            Err(e) => {
                tracing::warn!(
                    dlq = dlq_url,
                    error = %e,
                    "cannot read the DLQ's MaximumMessageSize: sizing this batch's copies for {FALLBACK_MAX_MESSAGE_BYTES} bytes \
                     (set TRIAGE_DLQ_MAX_BYTES to the DLQ's size to need no read)"
                );
                return FALLBACK_MAX_MESSAGE_BYTES;
            }
        };
        // A queue always answers its MaximumMessageSize; SQS's default if it did not.
        *self
            .bytes
            .get_or_init(|| bytes.unwrap_or(FALLBACK_MAX_MESSAGE_BYTES))
    }
}

/// Builds the DLQ copy of a message, fitting the record into `max_message_bytes`. A
/// producer's own `triage-failure` or `triage-attributes` is dropped, never carried.
pub fn dlq_copy(
    body: &str,
    original: &HashMap<String, MessageAttributeValue>,
    record: &FailureRecord,
    max_message_bytes: usize,
) -> Result<DlqCopy, DlqCopyError> {
    let mut attributes = without_reserved(original);
    if attributes.len() >= MAX_ATTRIBUTES {
        let packed = pack(&attributes)?;
        attributes = HashMap::from([(PACKED_ATTRIBUTE.to_owned(), string_attr(packed))]);
    }
    let used = body.len()
        + attributes
            .iter()
            .map(|(k, v)| attribute_size(k, v))
            .sum::<usize>();
    let overhead = FAILURE_ATTRIBUTE.len() + "String".len();
    let room = max_message_bytes.saturating_sub(used + overhead);
    let json = record.to_json_within(room).ok_or(DlqCopyError::NoRoom {
        used,
        limit: max_message_bytes,
    })?;
    attributes.insert(FAILURE_ATTRIBUTE.to_owned(), string_attr(json));
    Ok(DlqCopy {
        body: body.to_owned(),
        attributes,
    })
}

/// The failure record a DLQ message carries, if any.
#[cfg(any(test, feature = "internals"))]
pub fn failure_record(
    attrs: &HashMap<String, MessageAttributeValue>,
) -> Option<Result<FailureRecord, String>> {
    let raw = attrs.get(FAILURE_ATTRIBUTE)?.string_value()?;
    Some(serde_json::from_str(raw).map_err(|e| format!("`{FAILURE_ATTRIBUTE}` is not a failure record: {e}")))
}

/// True when `attrs` are shaped as [`dlq_copy`] packs them: `triage-attributes` and
/// `triage-failure`, nothing else.
#[cfg(any(test, feature = "internals"))]
pub(crate) fn is_packed(attrs: &HashMap<String, MessageAttributeValue>) -> bool {
    attrs.len() == 2 && attrs.contains_key(PACKED_ATTRIBUTE) && attrs.contains_key(FAILURE_ATTRIBUTE)
}

/// The attributes to send back on replay: the original ones, unpacked if the processor packed
/// them, without the reserved ones. `triage-attributes` is unpacked only from a message shaped
/// as [`dlq_copy`] packs it; anywhere else (a producer set it, and SQS's own redrive moved the
/// message) it is dropped with `triage-failure` and the other attributes are kept.
#[cfg(any(test, feature = "internals"))]
pub fn original_attributes(
    attrs: &HashMap<String, MessageAttributeValue>,
) -> Result<HashMap<String, MessageAttributeValue>, DlqCopyError> {
    let packed = is_packed(attrs)
        .then(|| attrs.get(PACKED_ATTRIBUTE).and_then(|v| v.string_value()))
        .flatten();
    if let Some(packed) = packed {
        let bad = || DlqCopyError::BadAttribute(PACKED_ATTRIBUTE.into());
        let map: HashMap<String, PackedValue> = serde_json::from_str(packed).map_err(|_| bad())?;
        return map
            .into_iter()
            .filter(|(k, _)| !is_reserved(k))
            .map(|(k, p)| {
                // SQS would refuse such a value: only a forged packing can hold one.
                if [Some(&k), Some(&p.data_type), p.string.as_ref()]
                    .into_iter()
                    .flatten()
                    .any(|s| sqs_text::refused(s).is_some())
                {
                    return Err(bad());
                }
                let mut b = MessageAttributeValue::builder().data_type(p.data_type);
                if let Some(s) = p.string {
                    b = b.string_value(s);
                }
                if let Some(bin) = p.binary_b64 {
                    b = b.binary_value(Blob::new(
                        aws_smithy_types::base64::decode(bin).map_err(|_| bad())?,
                    ));
                }
                Ok((k, b.build().map_err(|_| bad())?))
            })
            .collect();
    }
    Ok(without_reserved(attrs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::FailureClass;

    fn record(error: &str) -> FailureRecord {
        FailureRecord {
            class: FailureClass::Fatal,
            error: error.into(),
            attempts: 1,
            job_type: Some("t".into()),
            job_id: "j".into(),
            source_queue: "http://q".into(),
            original_message_id: "m".into(),
            first_received_at: 1,
            failed_at: 2,
        }
    }

    fn attrs(n: usize) -> HashMap<String, MessageAttributeValue> {
        (0..n)
            .map(|i| {
                let v = if i % 2 == 0 {
                    string_attr(format!("v{i}"))
                } else {
                    MessageAttributeValue::builder()
                        .data_type("Binary")
                        .binary_value(Blob::new(vec![0xff, 0x00, i as u8]))
                        .build()
                        .unwrap()
                };
                (format!("a{i}"), v)
            })
            .collect()
    }

    fn size(c: &DlqCopy) -> usize {
        c.body.len()
            + c.attributes
                .iter()
                .map(|(k, v)| attribute_size(k, v))
                .sum::<usize>()
    }

    #[test]
    fn the_group_travels_to_fifo_and_fair_queues_alike() {
        let fallback = || "f".to_owned();
        assert_eq!(group_for(true, Some("g"), fallback).as_deref(), Some("g"));
        assert_eq!(group_for(true, None, fallback).as_deref(), Some("f"));
        assert_eq!(
            group_for(false, Some("tenant"), fallback).as_deref(),
            Some("tenant")
        );
        assert_eq!(group_for(false, None, fallback), None);
    }

    #[test]
    fn keeps_body_and_attributes_and_adds_the_record() {
        let original = attrs(3);
        let c = dlq_copy("{\"type\":\"t\"}", &original, &record("boom"), 1 << 20).unwrap();
        assert_eq!(c.body, "{\"type\":\"t\"}");
        assert_eq!(c.attributes.len(), 4);
        assert_eq!(failure_record(&c.attributes).unwrap().unwrap(), record("boom"));
        assert_eq!(original_attributes(&c.attributes).unwrap(), original);
    }

    #[test]
    fn ten_attributes_are_packed_and_come_back_unchanged() {
        let original = attrs(10);
        let c = dlq_copy("body", &original, &record("boom"), 1 << 20).unwrap();
        assert_eq!(c.attributes.len(), 2);
        assert!(c.attributes.contains_key(PACKED_ATTRIBUTE));
        assert_eq!(original_attributes(&c.attributes).unwrap(), original);
    }

    #[test]
    fn the_error_text_is_cut_to_fit_never_the_body() {
        let limit = 4_096;
        let body = "b".repeat(3_000);
        let c = dlq_copy(&body, &attrs(2), &record(&"e".repeat(10_000)), limit).unwrap();
        assert_eq!(c.body, body);
        assert!(size(&c) <= limit, "{} > {limit}", size(&c));
        let r = failure_record(&c.attributes).unwrap().unwrap();
        assert!(r.error.ends_with("[truncated]"));
    }

    #[test]
    fn a_body_at_the_limit_is_an_error_not_a_loss() {
        let err = dlq_copy(&"b".repeat(1_000), &HashMap::new(), &record("x"), 1_000).unwrap_err();
        assert!(matches!(err, DlqCopyError::NoRoom { .. }));
    }

    #[test]
    fn a_producers_reserved_attributes_are_dropped_from_the_copy() {
        let mut original = attrs(3);
        original.insert(
            PACKED_ATTRIBUTE.into(),
            string_attr("{\"a0\":{\"data_type\":\"String\",\"string\":\"evil\"}}".into()),
        );
        original.insert(FAILURE_ATTRIBUTE.into(), string_attr("{}".into()));
        let c = dlq_copy("body", &original, &record("boom"), 1 << 20).unwrap();
        assert_eq!(c.attributes.len(), 4);
        assert_eq!(failure_record(&c.attributes).unwrap().unwrap(), record("boom"));
        assert_eq!(original_attributes(&c.attributes).unwrap(), attrs(3));

        // Ten real attributes plus a forged packed one: the ten are packed, the forgery dropped.
        let mut ten = attrs(10);
        ten.insert(PACKED_ATTRIBUTE.into(), string_attr("{}".into()));
        let c = dlq_copy("body", &ten, &record("boom"), 1 << 20).unwrap();
        assert!(is_packed(&c.attributes));
        assert_eq!(original_attributes(&c.attributes).unwrap(), attrs(10));
    }

    #[test]
    fn packed_values_hold_only_characters_sqs_takes() {
        let mut original = attrs(10);
        original.insert("a0".into(), string_attr("x".into()));
        let c = dlq_copy("body", &original, &record("boom"), 1 << 20).unwrap();
        assert_eq!(
            sqs_text::refused(c.attributes[PACKED_ATTRIBUTE].string_value().unwrap()),
            None
        );
        // A packing that decodes to a value SQS refuses is not the processor's: a replay would
        // be refused, so it is unreadable here.
        let mut forged = c.attributes.clone();
        forged.insert(
            PACKED_ATTRIBUTE.into(),
            string_attr(r#"{"a0":{"data_type":"String","string":"x￿"}}"#.into()),
        );
        assert_eq!(
            original_attributes(&forged),
            Err(DlqCopyError::BadAttribute(PACKED_ATTRIBUTE.into()))
        );
    }

    #[test]
    fn only_the_processors_shape_is_unpacked() {
        let forged = "{\"tenant\":{\"data_type\":\"String\",\"string\":\"evil\"}}".to_owned();
        // Moved by SQS's redrive: the producer's own attributes, one of them reserved.
        let mut moved = attrs(2);
        moved.insert(PACKED_ATTRIBUTE.into(), string_attr(forged.clone()));
        assert_eq!(original_attributes(&moved).unwrap(), attrs(2));
        // With a forged record too, but with other attributes: still not the packed shape.
        moved.insert(FAILURE_ATTRIBUTE.into(), string_attr("{}".into()));
        assert!(!is_packed(&moved));
        assert_eq!(original_attributes(&moved).unwrap(), attrs(2));
        // Only the packed attribute: dropped, nothing unpacked.
        let alone = HashMap::from([(PACKED_ATTRIBUTE.to_owned(), string_attr(forged))]);
        assert!(original_attributes(&alone).unwrap().is_empty());
    }
}
