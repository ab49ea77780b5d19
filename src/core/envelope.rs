//! The job envelope: what a producer puts on the queue.
//!
//! Either a JSON body `{"type": "...", "payload": <any JSON>, "id": "optional job id"}`, or any
//! body at all with the job type in the message attribute `job-type` (and optionally the job id
//! in `job-id`). In the second form the whole body is the payload: parsed as JSON when it is
//! JSON, else carried as a JSON string.

use serde_json::Value;
use thiserror::Error;

/// Message attribute that names the job type for bodies that are not envelopes.
pub const JOB_TYPE_ATTRIBUTE: &str = "job-type";
/// Message attribute that carries the job id for bodies that are not envelopes.
pub(crate) const JOB_ID_ATTRIBUTE: &str = "job-id";
/// SQS's maximum message size (1 MiB since August 2025).
pub const SQS_MAX_MESSAGE_BYTES: usize = 1_048_576;
/// Longest accepted job type; job types become metric dimensions and key parts.
pub const MAX_JOB_TYPE_LEN: usize = 256;
/// Longest accepted job id; it becomes a DynamoDB key (2 KiB at most) with a prefix.
pub const MAX_JOB_ID_LEN: usize = 512;

/// A job, as read from one record.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Which handler runs it.
    pub job_type: String,
    /// The producer's job id, if it gave one. Without it the SQS message id identifies the job.
    pub id: Option<String>,
    /// The handler's input.
    pub payload: Value,
}

/// Every way a body can fail to be a job. Each one dead-letters the record as `invalid`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvelopeError {
    /// The body is larger than the configured limit.
    #[error("body is {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        /// Body size in bytes.
        size: usize,
        /// The limit in force.
        limit: usize,
    },
    /// No `job-type` attribute and the body is not JSON.
    #[error("body is not JSON and has no `job-type` attribute: {0}")]
    NotJson(String),
    /// The body is JSON but not an object.
    #[error("body is JSON but not an object (found {0})")]
    NotObject(&'static str),
    /// The object has no `type` field.
    #[error("envelope has no `type` field and there is no `job-type` attribute")]
    MissingType,
    /// `type` is present but not a string.
    #[error("envelope `type` is {0}, not a string")]
    TypeNotString(&'static str),
    /// `type` is empty or too long.
    #[error("job type must be 1 to {MAX_JOB_TYPE_LEN} characters (got {0})")]
    BadTypeLength(usize),
    /// `id` is present but not a string.
    #[error("envelope `id` is {0}, not a string")]
    IdNotString(&'static str),
    /// `id` is empty or too long.
    #[error("job id must be 1 to {MAX_JOB_ID_LEN} characters (got {0})")]
    BadIdLength(usize),
}

/// Limits applied while reading an envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvelopeLimits {
    /// Largest body accepted, in bytes.
    pub max_body_bytes: usize,
}

impl Default for EnvelopeLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: SQS_MAX_MESSAGE_BYTES,
        }
    }
}

/// Reads a job from a record body and its `job-type` / `job-id` attributes.
pub fn parse(
    body: &str,
    type_attribute: Option<&str>,
    id_attribute: Option<&str>,
    limits: EnvelopeLimits,
) -> Result<Job, EnvelopeError> {
    if body.len() > limits.max_body_bytes {
        return Err(EnvelopeError::TooLarge {
            size: body.len(),
            limit: limits.max_body_bytes,
        });
    }
    if let Some(job_type) = type_attribute {
        let payload = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
        return Ok(Job {
            job_type: check_type(job_type)?.to_owned(),
            id: id_attribute.map(check_id).transpose()?.map(str::to_owned),
            payload,
        });
    }
    let value: Value = serde_json::from_str(body).map_err(|e| EnvelopeError::NotJson(e.to_string()))?;
    let Value::Object(mut map) = value else {
        return Err(EnvelopeError::NotObject(json_kind(&value)));
    };
    let job_type = match map.remove("type") {
        None | Some(Value::Null) => return Err(EnvelopeError::MissingType),
        Some(Value::String(s)) => {
            check_type(&s)?;
            s
        }
        Some(other) => return Err(EnvelopeError::TypeNotString(json_kind(&other))),
    };
    let id = match map.remove("id") {
        None | Some(Value::Null) => id_attribute.map(check_id).transpose()?.map(str::to_owned),
        Some(Value::String(s)) => {
            check_id(&s)?;
            Some(s)
        }
        Some(other) => return Err(EnvelopeError::IdNotString(json_kind(&other))),
    };
    let payload = map.remove("payload").unwrap_or(Value::Null);
    Ok(Job {
        job_type,
        id,
        payload,
    })
}

fn check_type(t: &str) -> Result<&str, EnvelopeError> {
    let n = t.chars().count();
    if n == 0 || n > MAX_JOB_TYPE_LEN || t.trim().is_empty() {
        return Err(EnvelopeError::BadTypeLength(n));
    }
    Ok(t)
}

fn check_id(id: &str) -> Result<&str, EnvelopeError> {
    let n = id.chars().count();
    if n == 0 || n > MAX_JOB_ID_LEN {
        return Err(EnvelopeError::BadIdLength(n));
    }
    Ok(id)
}

/// A JSON value's kind, as error texts name it ("an object", "a string", …).
pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(body: &str) -> Result<Job, EnvelopeError> {
        parse(body, None, None, EnvelopeLimits::default())
    }

    #[test]
    fn reads_a_full_envelope() {
        let job = p(r#"{"type":"email.send","payload":{"to":"a@b"},"id":"j-1"}"#).unwrap();
        assert_eq!(job.job_type, "email.send");
        assert_eq!(job.id.as_deref(), Some("j-1"));
        assert_eq!(job.payload, json!({"to": "a@b"}));
    }

    #[test]
    fn payload_and_id_are_optional() {
        let job = p(r#"{"type":"t"}"#).unwrap();
        assert_eq!(job.payload, Value::Null);
        assert_eq!(job.id, None);
    }

    #[test]
    fn attribute_form_takes_any_body() {
        let lim = EnvelopeLimits::default();
        let job = parse("plain text", Some("legacy.import"), Some("k"), lim).unwrap();
        assert_eq!(job.job_type, "legacy.import");
        assert_eq!(job.payload, Value::String("plain text".into()));
        assert_eq!(job.id.as_deref(), Some("k"));
        let job = parse(r#"{"a":1}"#, Some("t"), None, lim).unwrap();
        assert_eq!(job.payload, json!({"a": 1}));
    }

    #[test]
    fn every_bad_shape_has_its_own_error() {
        assert!(matches!(p("not json"), Err(EnvelopeError::NotJson(_))));
        assert_eq!(p("[1]"), Err(EnvelopeError::NotObject("an array")));
        assert_eq!(p("{}"), Err(EnvelopeError::MissingType));
        assert_eq!(p(r#"{"type":null}"#), Err(EnvelopeError::MissingType));
        assert_eq!(p(r#"{"type":7}"#), Err(EnvelopeError::TypeNotString("a number")));
        assert_eq!(p(r#"{"type":""}"#), Err(EnvelopeError::BadTypeLength(0)));
        assert_eq!(
            p(r#"{"type":"t","id":5}"#),
            Err(EnvelopeError::IdNotString("a number"))
        );
        assert_eq!(p(r#"{"type":"t","id":""}"#), Err(EnvelopeError::BadIdLength(0)));
        let long = "x".repeat(MAX_JOB_TYPE_LEN + 1);
        assert_eq!(
            p(&format!(r#"{{"type":"{long}"}}"#)),
            Err(EnvelopeError::BadTypeLength(MAX_JOB_TYPE_LEN + 1))
        );
    }

    #[test]
    fn size_limit_is_checked_first() {
        let lim = EnvelopeLimits { max_body_bytes: 10 };
        assert_eq!(
            parse(r#"{"type":"long"}"#, None, None, lim),
            Err(EnvelopeError::TooLarge { size: 15, limit: 10 })
        );
        assert!(
            parse(
                r#"{"type":"t"}"#,
                None,
                None,
                EnvelopeLimits { max_body_bytes: 12 }
            )
            .is_ok()
        );
    }
}
