//! Lambda's SQS event, read record by record into the processor's [`Incoming`].

use aws_lambda_events::encodings::Base64Data;
use std::collections::HashMap;

use aws_lambda_events::event::sqs::{SqsMessage, SqsMessageAttribute};
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::MessageAttributeValue;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::core::envelope::{JOB_ID_ATTRIBUTE, JOB_TYPE_ATTRIBUTE, StrVisitor, json_kind};
use crate::processor::Incoming;
use crate::processor::read_count;

/// A record of the event as the fast path reads it, straight from its text: the typed model's
/// (`SqsMessage`'s) fields, each read as that model reads it, so it rejects exactly the
/// records the typed model rejects (a field of the wrong kind, a field given twice), and
/// reads the others to the same [`Incoming`]; but only what the processor uses is kept: the
/// fields it does not use are checked, not copied, and of the system attributes only the four
/// the processor reads are kept, the receive count and timestamps as numbers.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
// The `Unused` fields are read only to be checked.
#[allow(dead_code)]
pub(crate) struct LeanMessage {
    #[serde(default)]
    message_id: Option<String>,
    #[serde(default)]
    receipt_handle: Option<String>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    md5_of_body: Option<Unused>,
    #[serde(default)]
    md5_of_message_attributes: Option<Unused>,
    #[serde(default)]
    attributes: Option<SystemAttributes>,
    #[serde(default)]
    message_attributes: Option<HashMap<String, SqsMessageAttribute>>,
    #[serde(default, rename = "eventSourceARN")]
    event_source_arn: Option<String>,
    #[serde(default)]
    event_source: Option<Unused>,
    #[serde(default)]
    aws_region: Option<Unused>,
}

impl LeanMessage {
    /// The message id as read (possibly empty).
    pub(crate) fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    /// Whether the source ARN names a FIFO queue.
    pub(crate) fn is_fifo(&self) -> bool {
        self.event_source_arn.as_deref().is_some_and(is_fifo_arn)
    }

    /// The `MessageGroupId` system attribute.
    pub(crate) fn group(&self) -> Option<&str> {
        self.attributes.as_ref().and_then(|a| a.group_id.as_deref())
    }
}

/// A string field the processor does not use: checked to be a string, not kept.
struct Unused;

impl<'de> Deserialize<'de> for Unused {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(|_: &str| Unused))
    }
}

/// Whether a source ARN names a FIFO queue.
pub(crate) fn is_fifo_arn(arn: &str) -> bool {
    arn.ends_with(".fifo")
}

/// The system attributes the processor reads. As in the typed model's map, every value must
/// be a string and the last of a name given twice counts.
#[derive(Default)]
struct SystemAttributes {
    /// `ApproximateReceiveCount`, when it reads as a count of at least 1.
    receive_count: Option<u32>,
    /// `ApproximateReceiveCount` is there but does not read as a count of at least 1.
    receive_count_unreadable: bool,
    first_received_at_ms: Option<u64>,
    sent_at_ms: Option<u64>,
    group_id: Option<String>,
}

impl<'de> Deserialize<'de> for SystemAttributes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Attributes;
        impl<'de> serde::de::Visitor<'de> for Attributes {
            type Value = SystemAttributes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SystemAttributes, A::Error> {
                let mut out = SystemAttributes::default();
                while let Some(name) = map.next_key::<SystemName>()? {
                    match name {
                        SystemName::ReceiveCount => {
                            out.receive_count = map.next_value::<Counted>()?.0;
                            out.receive_count_unreadable = out.receive_count.is_none();
                        }
                        SystemName::FirstReceived => {
                            out.first_received_at_ms = map.next_value::<Parsed<u64>>()?.0
                        }
                        SystemName::Sent => out.sent_at_ms = map.next_value::<Parsed<u64>>()?.0,
                        SystemName::Group => out.group_id = Some(map.next_value()?),
                        SystemName::Other => {
                            map.next_value::<Unused>()?;
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(Attributes)
    }
}

/// A system attribute's name, as far as the processor tells them apart.
enum SystemName {
    ReceiveCount,
    FirstReceived,
    Sent,
    Group,
    Other,
}

impl<'de> Deserialize<'de> for SystemName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(|s: &str| match s {
            "ApproximateReceiveCount" => SystemName::ReceiveCount,
            "ApproximateFirstReceiveTimestamp" => SystemName::FirstReceived,
            "SentTimestamp" => SystemName::Sent,
            "MessageGroupId" => SystemName::Group,
            _ => SystemName::Other,
        }))
    }
}

/// A receive count, read as [`read_count`] reads it.
struct Counted(Option<u32>);

impl<'de> Deserialize<'de> for Counted {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(|s: &str| Counted(read_count(s))))
    }
}

/// A string value read as a number: `None` when it does not read as one.
struct Parsed<T>(Option<T>);

impl<'de, T: std::str::FromStr> Deserialize<'de> for Parsed<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(|s: &str| Parsed(s.parse().ok())))
    }
}

impl Incoming {
    /// Reads a record from a Lambda SQS event. An attribute without a data type or without a
    /// value (SQS never sends one; it could not be sent on to the DLQ) is left out.
    pub fn from_lambda(m: SqsMessage) -> Self {
        let attr = |name: &str| m.attributes.get(name).map(String::as_str);
        let system = SystemAttributes {
            receive_count: attr("ApproximateReceiveCount").and_then(read_count),
            first_received_at_ms: attr("ApproximateFirstReceiveTimestamp").and_then(|v| v.parse().ok()),
            sent_at_ms: attr("SentTimestamp").and_then(|v| v.parse().ok()),
            group_id: attr("MessageGroupId").map(str::to_owned),
            ..SystemAttributes::default()
        };
        Self::with_system(
            m.message_id,
            m.receipt_handle,
            m.body,
            system,
            m.message_attributes,
            m.event_source_arn,
        )
    }

    /// Reads a record the typed model read, refusing it as [`Incoming::from_lambda_json`] does.
    fn from_typed(m: SqsMessage) -> Result<Self, UnreadableRecord> {
        routable(m.message_id.as_deref(), Some(&m.message_attributes))?;
        let count = m.attributes.get("ApproximateReceiveCount");
        countable(
            m.message_id.as_deref(),
            count.is_some_and(|c| read_count(c).is_none()),
        )?;
        Ok(Self::from_lambda(m))
    }

    /// Reads a record the lean model read ([`LeanMessage`]): as [`Incoming::from_lambda`] reads
    /// the same record, refused as [`Incoming::from_lambda_json`] refuses it.
    pub(crate) fn from_lean(m: LeanMessage) -> Result<Self, UnreadableRecord> {
        routable(m.message_id.as_deref(), m.message_attributes.as_ref())?;
        let unreadable_count = m.attributes.as_ref().is_some_and(|a| a.receive_count_unreadable);
        countable(m.message_id.as_deref(), unreadable_count)?;
        Ok(Self::with_system(
            m.message_id,
            m.receipt_handle,
            m.body,
            m.attributes.unwrap_or_default(),
            m.message_attributes.unwrap_or_default(),
            m.event_source_arn,
        ))
    }

    fn with_system(
        message_id: Option<String>,
        receipt_handle: Option<String>,
        body: Option<String>,
        system: SystemAttributes,
        message_attributes: HashMap<String, SqsMessageAttribute>,
        source_arn: Option<String>,
    ) -> Self {
        let attributes = message_attributes
            .into_iter()
            .filter_map(|(name, a)| {
                let data_type = a.data_type?;
                if a.string_value.is_none() && a.binary_value.is_none() {
                    return None;
                }
                let mut b = MessageAttributeValue::builder().data_type(data_type);
                if let Some(s) = a.string_value {
                    b = b.string_value(s);
                }
                if let Some(bin) = a.binary_value {
                    b = b.binary_value(Blob::new(bin.0));
                }
                b.build().ok().map(|v| (name, v))
            })
            .collect();
        Self {
            message_id: message_id.unwrap_or_default(),
            receipt_handle: receipt_handle.unwrap_or_default(),
            body: body.unwrap_or_default(),
            receive_count: system.receive_count.unwrap_or(1),
            first_received_at_ms: system.first_received_at_ms,
            sent_at_ms: system.sent_at_ms,
            group_id: system.group_id,
            attributes,
            from_fifo: source_arn.as_deref().is_some_and(is_fifo_arn),
            source_arn,
        }
    }

    /// Reads one record of a Lambda SQS event given as JSON, record by record, so one odd
    /// record never fails the others.
    ///
    /// A record the typed model (`aws_lambda_events`' `SqsMessage`) reads is read with it. One
    /// it rejects is read in part: what reads is kept, and what does not is dropped with a
    /// warning that names the field (never its value): a system attribute that is not a
    /// string (an unreadable receive count reads as 1), a receipt handle or source ARN that
    /// is not a string, list values, and of a message attribute the `stringValue` or
    /// `binaryValue` that does not read (not a string, or not base64), the whole attribute
    /// when no value or no `dataType` is left. A record that is not an object, whose body is
    /// not a string, or whose `job-type` / `job-id` attribute has no readable string value
    /// (routing it would be a guess) is [`UnreadableRecord`]: it cannot be processed.
    pub fn from_lambda_json(record: &Value) -> Result<Self, UnreadableRecord> {
        if let Ok(m) = SqsMessage::deserialize(record) {
            return Self::from_typed(m);
        }
        let Value::Object(map) = record else {
            return Err(UnreadableRecord {
                message_id: None,
                reason: format!("the record is {}, not an object", json_kind(record)),
            });
        };
        let message_id = match map.get("messageId") {
            Some(Value::String(id)) if !id.is_empty() => Some(id.clone()),
            _ => None,
        };
        let unreadable = |reason: String| UnreadableRecord {
            message_id: message_id.clone(),
            reason,
        };
        let mut dropped: Vec<String> = Vec::new();
        let mut clean = Map::new();
        for key in ["messageId", "receiptHandle", "body", "eventSourceARN"] {
            match map.get(key) {
                None | Some(Value::Null) => {}
                Some(v @ Value::String(_)) => {
                    clean.insert(key.to_owned(), v.clone());
                }
                Some(other) if key == "body" => {
                    return Err(unreadable(format!(
                        "`body` is {}, not a string",
                        json_kind(other)
                    )));
                }
                Some(other) => dropped.push(format!("`{key}` is {}", json_kind(other))),
            }
        }
        match map.get("attributes") {
            None | Some(Value::Null) => {}
            Some(Value::Object(attrs)) => {
                let mut kept = Map::new();
                for (name, v) in attrs {
                    match v {
                        Value::String(_) => {
                            kept.insert(name.clone(), v.clone());
                        }
                        // A count written as another JSON value is read from its text (a
                        // number as that number); one that is no count is refused below.
                        other if name == "ApproximateReceiveCount" => {
                            kept.insert(name.clone(), Value::String(other.to_string()));
                        }
                        other => dropped.push(format!("system attribute `{name}` is {}", json_kind(other))),
                    }
                }
                clean.insert("attributes".into(), Value::Object(kept));
            }
            Some(other) => dropped.push(format!("`attributes` is {}", json_kind(other))),
        }
        match map.get("messageAttributes") {
            None | Some(Value::Null) => {}
            Some(Value::Object(attrs)) => {
                let mut kept = Map::new();
                for (name, v) in attrs {
                    let routing = name == JOB_TYPE_ATTRIBUTE || name == JOB_ID_ATTRIBUTE;
                    let (attr, problems) = clean_message_attribute(v);
                    if routing && attr.as_ref().is_none_or(|a| !a["stringValue"].is_string()) {
                        return Err(unreadable(format!(
                            "message attribute `{name}` has no readable string value ({})",
                            problems.join(", ")
                        )));
                    }
                    match attr {
                        Some(a) => {
                            if !problems.is_empty() {
                                dropped.push(format!(
                                    "message attribute `{name}`: {} (the field dropped, the attribute kept)",
                                    problems.join(", ")
                                ));
                            }
                            kept.insert(name.clone(), a);
                        }
                        None => dropped.push(format!(
                            "message attribute `{name}`: {} (the attribute dropped)",
                            problems.join(", ")
                        )),
                    }
                }
                clean.insert("messageAttributes".into(), Value::Object(kept));
            }
            Some(other) => dropped.push(format!("`messageAttributes` is {}", json_kind(other))),
        }
        let m = SqsMessage::deserialize(&Value::Object(clean))
            .map_err(|_| unreadable("the record does not read as an SQS message".into()))?;
        if !dropped.is_empty() {
            tracing::warn!(
                message_id = message_id.as_deref().unwrap_or("-"),
                dropped = %dropped.join("; "),
                "record read in part: fields that do not read were dropped"
            );
        }
        Self::from_typed(m)
    }
}

/// Refuses a record whose `job-type` or `job-id` attribute is there without a string value (a
/// `Binary` one) or without a data type (such an attribute is left out of the record):
/// routing it by its body instead would be a guess.
fn routable(
    message_id: Option<&str>,
    attributes: Option<&HashMap<String, SqsMessageAttribute>>,
) -> Result<(), UnreadableRecord> {
    for name in [JOB_TYPE_ATTRIBUTE, JOB_ID_ATTRIBUTE] {
        let attribute = attributes.and_then(|a| a.get(name));
        if attribute.is_some_and(|a| a.string_value.is_none() || a.data_type.is_none()) {
            return Err(UnreadableRecord::of(
                message_id,
                format!("message attribute `{name}` has no string value"),
            ));
        }
    }
    Ok(())
}

/// Refuses a record whose `ApproximateReceiveCount` is there but does not read as a count of at
/// least 1: its deliveries could not be told apart, so its executions could not be counted
/// and nothing would bound its retries. (A record without one is a first delivery.)
fn countable(message_id: Option<&str>, unreadable_count: bool) -> Result<(), UnreadableRecord> {
    if unreadable_count {
        return Err(UnreadableRecord::of(
            message_id,
            "system attribute `ApproximateReceiveCount` does not read as a count".into(),
        ));
    }
    Ok(())
}

/// A Lambda event record that cannot be processed at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableRecord {
    /// Its message id, when a non-empty one could be read.
    pub message_id: Option<String>,
    /// Why, naming fields, never their values.
    pub reason: String,
}

impl UnreadableRecord {
    /// A record that cannot be processed, with its message id when a non-empty one was read.
    fn of(message_id: Option<&str>, reason: String) -> Self {
        Self {
            message_id: message_id.filter(|id| !id.is_empty()).map(str::to_owned),
            reason,
        }
    }
}

impl std::fmt::Display for UnreadableRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// One message attribute of a record the typed model rejected: the fields that read (as the
/// typed model reads them), and what was dropped. `None` when nothing usable is left.
fn clean_message_attribute(v: &Value) -> (Option<Value>, Vec<String>) {
    let Value::Object(a) = v else {
        return (None, vec![format!("it is {}, not an object", json_kind(v))]);
    };
    let mut problems = Vec::new();
    let mut clean = Map::new();
    for key in ["stringValue", "binaryValue"] {
        let Some(value) = a.get(key).filter(|v| !v.is_null()) else {
            continue;
        };
        let reads = match key {
            "stringValue" => value.is_string(),
            _ => Base64Data::deserialize(value).is_ok(),
        };
        if reads {
            clean.insert(key.to_owned(), value.clone());
        } else if value.is_string() {
            problems.push(format!("`{key}` is not base64"));
        } else {
            problems.push(format!("`{key}` is {}", json_kind(value)));
        }
    }
    match a.get("dataType") {
        Some(t @ Value::String(_)) => {
            clean.insert("dataType".into(), t.clone());
        }
        other => {
            problems.push(format!("`dataType` is {}", other.map_or("missing", json_kind)));
            return (None, problems);
        }
    }
    if clean.len() == 1 {
        problems.push("no readable value".into());
        return (None, problems);
    }
    (Some(Value::Object(clean)), problems)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn record() -> Value {
        json!({
            "messageId": "m1",
            "receiptHandle": "rh",
            "body": "{}",
            "attributes": {"ApproximateReceiveCount": "3", "MessageGroupId": "g"},
            "messageAttributes": {
                "job-type": {"dataType": "String", "stringValue": "t"},
                "bin": {"dataType": "Binary", "binaryValue": "/wD+"}
            },
            "eventSourceARN": "arn:aws:sqs:us-east-1:1:q.fifo"
        })
    }

    /// A routing attribute that would not reach the processor as a string is refused on every
    /// reading, never routed by the body.
    #[test]
    fn a_routing_attribute_without_a_string_value_or_a_data_type_is_refused() {
        for attribute in [
            json!({"dataType": "Binary", "binaryValue": "/wD+"}),
            json!({"stringValue": "attr.type"}),
            json!({"dataType": "String", "stringValue": 7}),
        ] {
            for name in ["job-type", "job-id"] {
                let mut r = record();
                r["body"] = json!(r#"{"type":"body.type"}"#);
                r["messageAttributes"] = json!({ name: attribute.clone() });
                let e = Incoming::from_lambda_json(&r).expect_err("refused");
                assert!(e.reason.contains(name), "{e}");
                let lean = serde_json::from_str::<LeanMessage>(&r.to_string())
                    .ok()
                    .map(Incoming::from_lean);
                assert!(lean.is_none_or(|l| l.is_err()), "{attribute}");
            }
        }
    }

    /// The lean model reads a record exactly when the typed model does, and to the same record.
    #[test]
    fn the_lean_model_reads_what_the_typed_model_reads() {
        let texts = [
            record().to_string(),
            r#"{"messageId":"m","attributes":{"ApproximateReceiveCount":"2","ApproximateReceiveCount":"x"}}"#.into(),
            r#"{"messageId":"m","attributes":{"ApproximateReceiveCount":"0","SentTimestamp":"12","SentTimestamp":"13"}}"#.into(),
            r#"{"messageId":"m","attributes":{"ApproximateReceiveCount":"4294967296","ApproximateFirstReceiveTimestamp":"-1"}}"#.into(),
            r#"{"messageId":"m","attributes":{"Other":5}}"#.into(),
            r#"{"messageId":"m","attributes":{"MessageGroupId":null}}"#.into(),
            r#"{"messageId":"m","attributes":null,"messageAttributes":null,"eventSourceARN":null}"#.into(),
            r#"{"messageId":"m","attributes":[]}"#.into(),
            r#"{"messageId":"m","md5OfBody":5}"#.into(),
            r#"{"messageId":"m","md5OfBody":null,"awsRegion":"x","eventSource":"aws:sqs"}"#.into(),
            r#"{"messageId":"m","md5OfMessageAttributes":"\ud800"}"#.into(),
            r#"{"messageId":"m","awsRegion":{}}"#.into(),
            r#"{"messageId":"m","eventSource":"a","eventSource":"b"}"#.into(),
            r#"{"messageId":"m","messageId":"n"}"#.into(),
            r#"{"messageId":"m","eventSourceARN":"arn:q.fifo","other":{"deep":[1,2,{"x":null}]}}"#.into(),
            r#"{"messageId":"m","eventSourceARN":7}"#.into(),
            r#"{"messageId":"m","attributes":{"MessageGroupId":"g1","MessageGroupId":"g2"}}"#.into(),
            r#"{"body":"x","messageAttributes":{"a":{"dataType":"String"}}}"#.into(),
            r#"{}"#.into(),
        ];
        for t in texts {
            let lean = serde_json::from_str::<LeanMessage>(&t)
                .ok()
                .map(Incoming::from_lean);
            let typed = serde_json::from_str::<SqsMessage>(&t)
                .ok()
                .map(Incoming::from_typed);
            assert_eq!(lean, typed, "{t}");
        }
    }

    #[test]
    fn a_record_the_typed_model_reads_is_read_with_it() {
        let r = record();
        let typed: SqsMessage = serde_json::from_value(r.clone()).unwrap();
        assert_eq!(
            Incoming::from_lambda_json(&r).unwrap(),
            Incoming::from_lambda(typed)
        );
    }

    #[test]
    fn odd_fields_are_dropped_and_the_rest_kept() {
        let mut r = record();
        r["messageAttributes"]["n"] =
            json!({"dataType": "Number", "stringValue": "100", "binaryValue": "not base64!"});
        r["messageAttributes"]["gone"] = json!({"dataType": "Binary", "binaryValue": 5});
        r["messageAttributes"]["notype"] = json!({"stringValue": "x"});
        r["attributes"]["SentTimestamp"] = json!(17);
        r["eventSourceARN"] = json!(["x"]);
        let inc = Incoming::from_lambda_json(&r).unwrap();
        assert_eq!(inc.message_id, "m1");
        assert_eq!(inc.body, "{}");
        assert_eq!(inc.receive_count, 3);
        assert_eq!(inc.group_id.as_deref(), Some("g"));
        assert!(!inc.from_fifo);
        assert_eq!(inc.job_type_attribute(), Some("t"));
        assert_eq!(inc.string_attribute("n"), Some("100"));
        assert_eq!(inc.attributes["n"].binary_value(), None);
        assert_eq!(
            inc.attributes["bin"].binary_value().map(|b| b.as_ref()),
            Some(&[0xff, 0, 0xfe][..])
        );
        let mut names: Vec<&str> = inc.attributes.keys().map(String::as_str).collect();
        names.sort();
        assert_eq!(names, ["bin", "job-type", "n"]);
    }

    #[test]
    fn a_record_that_cannot_be_processed_says_so_with_its_id_when_it_has_one() {
        let mut r = record();
        r["body"] = json!(17);
        let e = Incoming::from_lambda_json(&r).unwrap_err();
        assert_eq!(e.message_id.as_deref(), Some("m1"));
        assert!(e.reason.contains("`body` is a number"), "{e}");

        let mut r = record();
        r["messageAttributes"]["job-id"] = json!({"dataType": "String", "stringValue": {"a": 1}});
        let e = Incoming::from_lambda_json(&r).unwrap_err();
        assert_eq!(e.message_id.as_deref(), Some("m1"));
        assert!(e.reason.contains("`job-id`"), "{e}");

        let mut r = record();
        r["messageId"] = json!(5);
        r["body"] = json!(null);
        r["attributes"] = json!("x");
        let inc = Incoming::from_lambda_json(&r).unwrap();
        assert_eq!(
            (inc.message_id.as_str(), inc.body.as_str(), inc.receive_count),
            ("", "", 1)
        );

        for odd in [json!(5), json!("m"), json!(null), json!([record()])] {
            assert_eq!(
                Incoming::from_lambda_json(&odd).unwrap_err().message_id,
                None,
                "{odd}"
            );
        }
        let mut r = record();
        r["messageId"] = json!("");
        r["body"] = json!(false);
        assert_eq!(Incoming::from_lambda_json(&r).unwrap_err().message_id, None);
    }

    #[test]
    fn an_attribute_without_a_value_is_left_out() {
        let mut r = record();
        r["messageAttributes"]["empty"] = json!({"dataType": "String"});
        let inc = Incoming::from_lambda_json(&r).unwrap();
        assert!(!inc.attributes.contains_key("empty"));
    }
}
