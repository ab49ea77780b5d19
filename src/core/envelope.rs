//! The job envelope: what a producer puts on the queue.
//!
//! A body `{"type": "...", "payload": <any JSON>, "id": "..."}`, or any body with the job type in
//! the `job-type` message attribute (the whole body is then the payload). SNS notifications and
//! EventBridge events are unwrapped into the same job ([`parse_with`]; `docs/producers.md`).
//! The rule: a JSON object with a `type` field is always an envelope, and a `job-type` attribute
//! keeps the whole body, so a wrapper is read only where nothing else could be a job.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use thiserror::Error;

/// Message attribute that names the job type for bodies that are not envelopes.
pub const JOB_TYPE_ATTRIBUTE: &str = "job-type";
/// Message attribute that carries the job id for bodies that are not envelopes.
pub const JOB_ID_ATTRIBUTE: &str = "job-id";
/// SQS's maximum message size (1 MiB since August 2025).
pub const SQS_MAX_MESSAGE_BYTES: usize = 1_048_576;
/// Longest accepted job type; job types become metric dimensions and key parts.
pub const MAX_JOB_TYPE_LEN: usize = 256;
/// Longest accepted job id; it becomes a DynamoDB key (2 KiB at most) with a prefix.
pub const MAX_JOB_ID_LEN: usize = 512;

/// A job, as read from one record: its payload a JSON value ([`parse_with`]) or, as the
/// processor reads it, a [`Payload`] ([`parse_for_handler`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Job<P = Value> {
    /// Which handler runs it.
    pub job_type: String,
    /// The producer's job id, if it gave one. Without it the SQS message id identifies the job.
    pub id: Option<String>,
    /// The handler's input.
    pub payload: P,
}

/// A job's payload on its way to the handler: a JSON value, or the payload's JSON text as the
/// body holds it, decoded straight into the handler's type (no JSON tree in between).
#[derive(Debug, Clone)]
pub enum Payload {
    /// A JSON value.
    Value(Value),
    /// The payload's text, known to read as JSON as the body's parse reads it.
    Text(Box<RawValue>),
}

impl Default for Payload {
    fn default() -> Self {
        Self::Value(Value::Null)
    }
}

impl Payload {
    /// Decodes the payload into `P`: a text payload as `serde_json::from_str` decodes it, and
    /// when that fails, from its JSON value, whose error is the one returned; a value payload
    /// from the value. A payload that decodes from its JSON value therefore decodes from its
    /// text too. The text decodes a few shapes the value does not (a struct variant written as
    /// an array, an adjacently tagged enum whose content comes before its tag); where two keys
    /// name one entry of a map (an alias) the later in the text wins; a type that keeps the text
    /// (`Box<RawValue>`) or the order of keys gets them as written. Numbers the value would
    /// hold as floats and keys given twice are never in a text payload ([`parse_for_handler`]).
    pub fn decode<P: DeserializeOwned>(self) -> Result<P, serde_json::Error> {
        match self {
            Self::Value(v) => serde_json::from_value(v),
            Self::Text(raw) => serde_json::from_str(raw.get())
                .or_else(|_| serde_json::from_str::<Value>(raw.get()).and_then(serde_json::from_value)),
        }
    }

    /// The payload as a JSON value.
    #[cfg(any(test, feature = "internals"))]
    pub fn into_value(self) -> Value {
        match self {
            Self::Value(v) => v,
            Self::Text(raw) => serde_json::from_str(raw.get()).unwrap_or(Value::Null),
        }
    }
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
    /// A `job-type` or `job-id` message attribute without a string value (a `Binary` one):
    /// routing by the body instead would be a guess.
    #[error("message attribute `{0}` has no string value")]
    AttributeNotString(&'static str),
    /// An SNS notification or EventBridge event that cannot be unwrapped (a field missing or
    /// of the wrong kind, an SNS message that is no notification).
    #[error("{wrapper} {problem}")]
    BadWrapper {
        /// Which wrapper.
        wrapper: Wrapper,
        /// What is wrong with it.
        problem: String,
    },
    /// The job inside an SNS notification or EventBridge event is not valid.
    #[error("{wrapper}: {error}")]
    Wrapped {
        /// Which wrapper.
        wrapper: Wrapper,
        /// What is wrong with the job inside.
        error: Box<EnvelopeError>,
    },
}

/// A service's JSON around a producer's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrapper {
    /// An SNS notification (SNS → SQS with raw message delivery off).
    Sns,
    /// An EventBridge event (an EventBridge rule with an SQS target).
    EventBridge,
}

impl std::fmt::Display for Wrapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sns => "SNS notification",
            Self::EventBridge => "EventBridge event",
        })
    }
}

/// Job types of EventBridge events by `detail-type`: an event whose `detail-type` is listed
/// runs as the listed job type with its `detail` as the payload. Set with
/// `TRIAGE_EVENTBRIDGE_TYPES` or [`Registry::eventbridge_type`](crate::processor::registry::Registry::eventbridge_type).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventBridgeTypes(BTreeMap<String, String>);

impl EventBridgeTypes {
    /// No mapping: every event's job type is its envelope's or its `detail-type`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `detail_type` to `job_type`, replacing an earlier mapping of that `detail_type`.
    pub fn insert(&mut self, detail_type: impl Into<String>, job_type: impl Into<String>) {
        self.0.insert(detail_type.into(), job_type.into());
    }

    /// The job type `detail_type` maps to.
    pub fn get(&self, detail_type: &str) -> Option<&str> {
        self.0.get(detail_type).map(String::as_str)
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The mappings, `(detail_type, job_type)`, by `detail_type`.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(d, t)| (d.as_str(), t.as_str()))
    }

    /// Adds `other`'s mappings of the detail-types this one does not map.
    pub fn or(mut self, other: &Self) -> Self {
        for (d, t) in other.iter() {
            self.0.entry(d.to_owned()).or_insert_with(|| t.to_owned());
        }
        self
    }

    /// Checks every mapping: a detail-type is 1 to 256 characters, not only whitespace, and a job
    /// type is what an envelope's `type` may be.
    pub fn check(&self) -> Result<(), String> {
        for (d, t) in self.iter() {
            check_type(d).map_err(|_| {
                format!("detail-type {d:?} must be 1 to {MAX_JOB_TYPE_LEN} characters, not only whitespace")
            })?;
            check_type(t).map_err(|e| format!("`{d}` maps to {t:?}: {e}"))?;
        }
        Ok(())
    }

    /// Reads `TRIAGE_EVENTBRIDGE_TYPES`: `Detail Type=job.type` pairs separated by `;`
    /// (blanks around names ignored, the job type after the last `=`), or a JSON object
    /// `{"Detail Type": "job.type", …}` for names that hold `;` or `=`. A detail-type listed twice
    /// is an error.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut out = Self::new();
        let mut add = |d: String, t: String| {
            if out.0.contains_key(&d) {
                return Err(format!("detail-type `{d}` is listed twice"));
            }
            out.0.insert(d, t);
            Ok(())
        };
        let spec = spec.trim();
        if spec.starts_with('{') {
            let Value::Object(map) =
                serde_json::from_str(spec).map_err(|e| format!("not a JSON object: {e}"))?
            else {
                return Err("not a JSON object".into());
            };
            for (d, t) in map {
                let Value::String(t) = t else {
                    return Err(format!("`{d}` maps to {}, not a string", json_kind(&t)));
                };
                add(d, t)?;
            }
        } else {
            for pair in spec.split(';').filter(|p| !p.trim().is_empty()) {
                let Some((d, t)) = pair.rsplit_once('=') else {
                    return Err(format!("`{}` is not `Detail Type=job.type`", pair.trim()));
                };
                add(d.trim().to_owned(), t.trim().to_owned())?;
            }
        }
        out.check()?;
        Ok(out)
    }
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

/// Reads a job from a record body and its `job-type` / `job-id` attributes, unwrapping SNS
/// notifications and EventBridge events (with no [`EventBridgeTypes`] mapping: see
/// [`parse_with`]).
#[cfg(any(test, feature = "internals"))]
pub fn parse(
    body: &str,
    type_attribute: Option<&str>,
    id_attribute: Option<&str>,
    limits: EnvelopeLimits,
) -> Result<Job, EnvelopeError> {
    parse_with(
        body,
        type_attribute,
        id_attribute,
        limits,
        &EventBridgeTypes::default(),
    )
}

/// Reads a job from a record body and its `job-type` / `job-id` attributes; EventBridge events'
/// job types by `eventbridge` (see the [module documentation](self) for the rules).
pub fn parse_with(
    body: &str,
    type_attribute: Option<&str>,
    id_attribute: Option<&str>,
    limits: EnvelopeLimits,
    eventbridge: &EventBridgeTypes,
) -> Result<Job, EnvelopeError> {
    if body.len() > limits.max_body_bytes {
        return Err(EnvelopeError::TooLarge {
            size: body.len(),
            limit: limits.max_body_bytes,
        });
    }
    read(body, type_attribute, id_attribute, eventbridge, Nesting::Top)
}

/// Reads a job for its handler: the job [`parse_with`] reads, the same job or the same error,
/// but the payload of a plain envelope (an object whose `type` is a string, no field given
/// twice, its payload nested at most [`TEXT_PAYLOAD_DEPTH`] deep) is kept as its text
/// ([`Payload::Text`]) rather than read into a JSON value; every other body is read by
/// `parse_with` ([`Payload::Value`]).
pub fn parse_for_handler(
    body: &str,
    type_attribute: Option<&str>,
    id_attribute: Option<&str>,
    limits: EnvelopeLimits,
    eventbridge: &EventBridgeTypes,
) -> Result<Job<Payload>, EnvelopeError> {
    if type_attribute.is_none() && body.len() <= limits.max_body_bytes {
        if let Some(job) = plain(body, id_attribute) {
            return job;
        }
    }
    parse_with(body, type_attribute, id_attribute, limits, eventbridge).map(|j| Job {
        job_type: j.job_type,
        id: j.id,
        payload: Payload::Value(j.payload),
    })
}

/// The deepest payload kept as text: deeper ones are read by [`parse_with`], which applies
/// the JSON parser's depth limit to the whole body.
pub const TEXT_PAYLOAD_DEPTH: usize = 64;

/// The fields of a plain envelope. Every other field is read as the body's parse reads it
/// ([`Checked`]) and dropped; a field given twice is not a plain envelope.
struct Plain<'a> {
    job_type: String,
    id: Option<String>,
    payload: Option<&'a RawValue>,
}

/// A plain envelope's field names.
enum Field {
    Type,
    Id,
    Payload,
    /// [`RAW_VALUE_KEY`].
    RawValue,
    Other,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(|v: &str| match v {
            "type" => Field::Type,
            "id" => Field::Id,
            "payload" => Field::Payload,
            RAW_VALUE_KEY => Field::RawValue,
            _ => Field::Other,
        }))
    }
}

/// Reads a string without keeping it: `f` takes what it needs.
pub(crate) struct StrVisitor<F>(pub(crate) F);

impl<'de, T, F: FnOnce(&str) -> T> Visitor<'de> for StrVisitor<F> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
        Ok((self.0)(v))
    }
}

impl<'de> Deserialize<'de> for Plain<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Plain<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an envelope")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Plain<'de>, A::Error> {
                use serde::de::Error;
                let (mut job_type, mut id, mut payload) = (None, None, None);
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::Type if job_type.is_none() => job_type = Some(map.next_value::<String>()?),
                        Field::Id if id.is_none() => id = Some(map.next_value::<Option<String>>()?),
                        Field::Payload if payload.is_none() => {
                            payload = Some(map.next_value::<Option<&'de RawValue>>()?)
                        }
                        Field::Other => map.next_value_seed(Checked {
                            depth: TEXT_PAYLOAD_DEPTH,
                            strict: false,
                        })?,
                        Field::RawValue => return Err(A::Error::custom("the raw-value key")),
                        _ => return Err(A::Error::custom("a field given twice")),
                    }
                }
                Ok(Plain {
                    job_type: job_type.ok_or_else(|| A::Error::missing_field("type"))?,
                    id: id.flatten(),
                    payload: payload.flatten(),
                })
            }
        }
        d.deserialize_map(Fields)
    }
}

/// A body read as a plain envelope, when it is one (`None`: it is not, or not surely; the
/// general reading decides).
fn plain(body: &str, id_attribute: Option<&str>) -> Option<Result<Job<Payload>, EnvelopeError>> {
    let p: Plain<'_> = serde_json::from_str(body).ok()?;
    let payload = match p.payload {
        None => Payload::Value(Value::Null),
        Some(raw) => {
            // Skipping a value checks less than reading it (escapes, numbers' range, depth):
            // the payload must read as the body's parse would read it, and decode from its
            // text as from its JSON value.
            let checked = Checked {
                depth: TEXT_PAYLOAD_DEPTH,
                strict: true,
            };
            checked
                .deserialize(&mut serde_json::Deserializer::from_str(raw.get()))
                .ok()?;
            Payload::Text(raw.to_owned())
        }
    };
    // Checked as `envelope` checks an envelope.
    let job = check_type(&p.job_type)
        .and_then(|_| job_id(p.id, id_attribute))
        .map(|id| Job {
            job_type: p.job_type,
            id,
            payload,
        });
    Some(job)
}

/// The key by which serde_json's parser tells a raw value inside a JSON text (its
/// `raw_value` feature): a JSON value reads an object that holds it otherwise than as an
/// object, so a body holding it anywhere is left to the general reading.
const RAW_VALUE_KEY: &str = "$serde_json::private::RawValue";

/// Reads a JSON value as the parser reads it into a `Value`, keeping nothing. It fails past
/// its depth and on the parser's raw-value key; strict (a payload to be decoded from its
/// text), it also fails on any number a JSON value holds as a float (a fraction, an exponent,
/// an integer past 64 bits, `-0`: a type reading the text could read such an integer where
/// the float fails) and on a key given twice in an object (a JSON value keeps the last; a
/// type reading the text may refuse it, or read it otherwise).
#[derive(Clone, Copy)]
struct Checked {
    depth: usize,
    strict: bool,
}

impl Checked {
    fn deeper<E: serde::de::Error>(self) -> Result<Self, E> {
        match self.depth {
            0 => Err(E::custom("nested too deep")),
            n => Ok(Self { depth: n - 1, ..self }),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Checked {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        match self.strict {
            true => Err(E::custom("a number held as a float")),
            false => Ok(()),
        }
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        use serde::de::Error;
        let inner = self.deeper()?;
        let mut keys: Vec<Cow<'de, str>> = Vec::new();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if key == RAW_VALUE_KEY {
                return Err(A::Error::custom("the raw-value key"));
            }
            map.next_value_seed(inner)?;
            if self.strict {
                keys.push(key);
            }
        }
        keys.sort_unstable();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            return Err(A::Error::custom("a key given twice"));
        }
        Ok(())
    }
}

/// An object's key as read: borrowed from the text unless it had escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Which wrappers a body may still be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nesting {
    /// The SQS body: SNS or EventBridge.
    Top,
    /// An SNS notification's message: EventBridge (an EventBridge rule with an SNS target).
    InSns,
}

fn read(
    body: &str,
    type_attribute: Option<&str>,
    id_attribute: Option<&str>,
    eventbridge: &EventBridgeTypes,
    nesting: Nesting,
) -> Result<Job, EnvelopeError> {
    if let Some(job_type) = type_attribute {
        let payload = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
        return Ok(Job {
            job_type: check_type(job_type)?.to_owned(),
            id: id_attribute.map(check_id).transpose()?.map(str::to_owned),
            payload,
        });
    }
    let value: Value = serde_json::from_str(body).map_err(|e| EnvelopeError::NotJson(e.to_string()))?;
    let Value::Object(map) = value else {
        return Err(EnvelopeError::NotObject(json_kind(&value)));
    };
    // An object with a `type` field is an envelope, whatever else it holds: a wrapper is only
    // ever recognised in a body that could not be a job without unwrapping.
    if !map.contains_key("type") {
        if nesting == Nesting::Top && is_sns(&map) {
            return sns(map, eventbridge);
        }
        if is_eventbridge(&map) {
            return self::eventbridge(map, eventbridge);
        }
    }
    envelope(map, id_attribute)
}

/// The envelope an object is, `id_attribute` standing in for a missing `id`.
fn envelope(mut map: Map<String, Value>, id_attribute: Option<&str>) -> Result<Job, EnvelopeError> {
    let job_type = match map.remove("type") {
        None | Some(Value::Null) => return Err(EnvelopeError::MissingType),
        Some(Value::String(s)) => {
            check_type(&s)?;
            s
        }
        Some(other) => return Err(EnvelopeError::TypeNotString(json_kind(&other))),
    };
    let id = match map.remove("id") {
        None | Some(Value::Null) => job_id(None, id_attribute)?,
        Some(Value::String(s)) => job_id(Some(s), id_attribute)?,
        Some(other) => return Err(EnvelopeError::IdNotString(json_kind(&other))),
    };
    let payload = map.remove("payload").unwrap_or(Value::Null);
    Ok(Job {
        job_type,
        id,
        payload,
    })
}

/// An envelope's job id, checked: its own, else `id_attribute`'s.
fn job_id(id: Option<String>, id_attribute: Option<&str>) -> Result<Option<String>, EnvelopeError> {
    match id {
        Some(id) => {
            check_id(&id)?;
            Ok(Some(id))
        }
        None => Ok(id_attribute.map(check_id).transpose()?.map(str::to_owned)),
    }
}

/// SNS's JSON around a message: `Type` and `TopicArn` strings, `Type` one SNS sends to an SQS
/// subscriber.
fn is_sns(map: &Map<String, Value>) -> bool {
    let kind = map.get("Type").and_then(Value::as_str);
    matches!(
        kind,
        Some("Notification" | "SubscriptionConfirmation" | "UnsubscribeConfirmation")
    ) && map.get("TopicArn").and_then(Value::as_str).is_some()
}

/// EventBridge's JSON around an event: its `detail-type` and `source` fields.
fn is_eventbridge(map: &Map<String, Value>) -> bool {
    map.contains_key("detail-type") && map.contains_key("source")
}

fn bad(wrapper: Wrapper, problem: impl Into<String>) -> EnvelopeError {
    EnvelopeError::BadWrapper {
        wrapper,
        problem: problem.into(),
    }
}

fn wrapped(wrapper: Wrapper) -> impl Fn(EnvelopeError) -> EnvelopeError {
    move |e| match e {
        // An EventBridge event inside an SNS notification names itself.
        e @ (EnvelopeError::BadWrapper { .. } | EnvelopeError::Wrapped { .. }) => e,
        e => EnvelopeError::Wrapped {
            wrapper,
            error: Box::new(e),
        },
    }
}

/// A wrapper's string field, required.
fn string_field(map: &mut Map<String, Value>, wrapper: Wrapper, name: &str) -> Result<String, EnvelopeError> {
    match map.remove(name) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(bad(wrapper, format!("has no `{name}`"))),
        Some(other) => Err(bad(
            wrapper,
            format!("`{name}` is {}, not a string", json_kind(&other)),
        )),
    }
}

/// A wrapper's id, as a job id.
fn wrapper_id(map: &mut Map<String, Value>, wrapper: Wrapper, name: &str) -> Result<String, EnvelopeError> {
    let id = string_field(map, wrapper, name)?;
    check_id(&id).map_err(wrapped(wrapper))?;
    Ok(id)
}

/// An SNS notification: its `Message` read with its `job-type` / `job-id` message attributes,
/// as SNS would deliver it raw; the `MessageId` is the job id unless the message names one.
fn sns(mut map: Map<String, Value>, eventbridge: &EventBridgeTypes) -> Result<Job, EnvelopeError> {
    let w = Wrapper::Sns;
    let kind = string_field(&mut map, w, "Type")?;
    if kind != "Notification" {
        let hint = if kind == "SubscriptionConfirmation" {
            ": confirm the subscription with its SubscribeURL (or `aws sns confirm-subscription`)"
        } else {
            ""
        };
        return Err(bad(
            w,
            format!("is of `Type` {kind}, not Notification: it holds no job{hint}"),
        ));
    }
    let message = match map.remove("Message") {
        Some(Value::String(s)) => s,
        None | Some(Value::Null) => return Err(bad(w, "has no `Message`")),
        Some(other) => {
            return Err(bad(
                w,
                format!("`Message` is {}, not a string", json_kind(&other)),
            ));
        }
    };
    let message_id = wrapper_id(&mut map, w, "MessageId")?;
    let attributes = match map.remove("MessageAttributes") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(a)) => a,
        Some(other) => {
            return Err(bad(
                w,
                format!("`MessageAttributes` is {}, not an object", json_kind(&other)),
            ));
        }
    };
    let attribute = |name: &str| -> Result<Option<&str>, EnvelopeError> {
        let Some(a) = attributes.get(name) else {
            return Ok(None);
        };
        match (
            a.get("Type").and_then(Value::as_str),
            a.get("Value").and_then(Value::as_str),
        ) {
            (Some(t), _) if !has_string_value(t) => Err(bad(
                w,
                format!("message attribute `{name}` is of Type {t}, which has no string value"),
            )),
            (Some(_), Some(v)) => Ok(Some(v)),
            _ => Err(bad(
                w,
                format!("message attribute `{name}` has no string `Type` and `Value`"),
            )),
        }
    };
    let job_type = attribute(JOB_TYPE_ATTRIBUTE)?;
    let job_id = attribute(JOB_ID_ATTRIBUTE)?;
    let mut job = read(&message, job_type, job_id, eventbridge, Nesting::InSns).map_err(wrapped(w))?;
    job.id.get_or_insert(message_id);
    Ok(job)
}

/// Whether an SNS attribute of data type `t` has a string value, as the same attribute on an
/// SQS message does: `String` and `Number` (a custom type after a dot too, and SNS's
/// `String.Array`); raw delivery would route the job by that value, so the notification does.
fn has_string_value(t: &str) -> bool {
    let base = t.split_once('.').map_or(t, |(b, _)| b);
    matches!(base, "String" | "Number")
}

/// An EventBridge event: its `detail-type` mapped, else its `detail` when that is an envelope,
/// else its `detail-type` as it is; the event's `id` is the job id unless an envelope names one.
fn eventbridge(mut map: Map<String, Value>, types: &EventBridgeTypes) -> Result<Job, EnvelopeError> {
    let w = Wrapper::EventBridge;
    let detail_type = string_field(&mut map, w, "detail-type")?;
    string_field(&mut map, w, "source")?;
    let id = wrapper_id(&mut map, w, "id")?;
    let detail = match map.remove("detail") {
        None => return Err(bad(w, "has no `detail`")),
        Some(d) => d,
    };
    let mapped = types.get(&detail_type);
    let job = match detail {
        Value::Object(d) if mapped.is_none() && is_envelope(&d) => envelope(d, None).map_err(wrapped(w))?,
        detail => {
            let job_type = mapped.unwrap_or(&detail_type);
            check_type(job_type).map_err(|e| match mapped {
                Some(_) => bad(w, format!("`detail-type` maps to a bad job type: {e}")),
                None => bad(
                    w,
                    format!("`detail-type` cannot be a job type ({e}): map it with TRIAGE_EVENTBRIDGE_TYPES"),
                ),
            })?;
            Job {
                job_type: job_type.to_owned(),
                id: None,
                payload: detail,
            }
        }
    };
    Ok(Job {
        id: job.id.or(Some(id)),
        ..job
    })
}

/// An EventBridge `detail` that is a job envelope: a string `type` and a `payload`.
fn is_envelope(detail: &Map<String, Value>) -> bool {
    detail.get("type").is_some_and(Value::is_string) && detail.contains_key("payload")
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
    use std::collections::HashMap;

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

    const TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:jobs";

    /// An SNS notification as SNS delivers it to an SQS subscriber with raw delivery off.
    fn sns_body(message: &str, attributes: Value) -> String {
        let mut n = json!({
            "Type": "Notification",
            "MessageId": "5f2b7a9e-0000-4000-8000-000000000001",
            "TopicArn": TOPIC,
            "Subject": "ignored",
            "Message": message,
            "Timestamp": "2026-01-01T00:00:00.000Z",
            "SignatureVersion": "1",
            "Signature": "EXAMPLE==",
            "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem",
            "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
        });
        if !attributes.is_null() {
            n["MessageAttributes"] = attributes;
        }
        n.to_string()
    }

    fn sns_attrs(pairs: &[(&str, &str)]) -> Value {
        Value::Object(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), json!({"Type": "String", "Value": v})))
                .collect(),
        )
    }

    /// An EventBridge event as a rule delivers it to an SQS target.
    fn event(detail_type: &str, detail: Value) -> Value {
        json!({
            "version": "0",
            "id": "7bf73129-1428-4cd3-a780-95db273d1602",
            "detail-type": detail_type,
            "source": "com.example.orders",
            "account": "123456789012",
            "time": "2026-01-01T00:00:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": detail,
        })
    }

    fn eb(body: &Value, types: &EventBridgeTypes) -> Result<Job, EnvelopeError> {
        parse_with(&body.to_string(), None, None, EnvelopeLimits::default(), types)
    }

    fn types(spec: &str) -> EventBridgeTypes {
        EventBridgeTypes::parse(spec).unwrap()
    }

    fn bad_wrapper(e: Result<Job, EnvelopeError>) -> (Wrapper, String) {
        match e {
            Err(EnvelopeError::BadWrapper { wrapper, problem }) => (wrapper, problem),
            other => panic!("expected a bad wrapper, got {other:?}"),
        }
    }

    #[test]
    fn an_sns_notification_carries_an_envelope_and_its_message_id_is_the_fallback_id() {
        let inner = r#"{"type":"email.send","payload":{"to":"a@b"},"id":"j-1"}"#;
        let job = p(&sns_body(inner, Value::Null)).unwrap();
        assert_eq!(job, p(inner).unwrap());
        let job = p(&sns_body(r#"{"type":"email.send","payload":1}"#, Value::Null)).unwrap();
        assert_eq!(job.job_type, "email.send");
        assert_eq!(job.payload, json!(1));
        assert_eq!(job.id.as_deref(), Some("5f2b7a9e-0000-4000-8000-000000000001"));
    }

    #[test]
    fn an_sns_notification_reads_as_the_same_message_delivered_raw() {
        // Raw delivery on: the message is the body and SNS's attributes are SQS attributes.
        let lim = EnvelopeLimits::default();
        let cases = [
            ("plain text", vec![("job-type", "legacy.import"), ("job-id", "k")]),
            (r#"{"a":1}"#, vec![("job-type", "t")]),
            // The attribute wins over an envelope, as it does on an SQS message.
            (r#"{"type":"other","payload":2}"#, vec![("job-type", "t")]),
            (r#"{"type":"t","payload":2}"#, vec![("job-id", "from-attr")]),
        ];
        for (message, attrs) in cases {
            let get = |n: &str| attrs.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
            let raw = parse(message, get("job-type"), get("job-id"), lim).unwrap();
            let wrapped = p(&sns_body(message, sns_attrs(&attrs))).unwrap();
            let expected = Job {
                id: raw
                    .id
                    .clone()
                    .or(Some("5f2b7a9e-0000-4000-8000-000000000001".into())),
                ..raw
            };
            assert_eq!(wrapped, expected, "{message}");
        }
    }

    #[test]
    fn an_sns_number_attribute_reads_as_the_same_attribute_delivered_raw() {
        // Raw delivery puts a Number attribute on the SQS message with its string value, which
        // routes the job: the notification's Number attribute routes it the same way.
        let lim = EnvelopeLimits::default();
        let typed = |pairs: &[(&str, &str, &str)]| {
            Value::Object(
                pairs
                    .iter()
                    .map(|(k, t, v)| (k.to_string(), json!({"Type": t, "Value": v})))
                    .collect(),
            )
        };
        for (id_type, type_type) in [
            ("Number", "String"),
            ("Number.int", "String"),
            ("String", "Number"),
            ("String.Array", "String"),
        ] {
            let attrs = typed(&[("job-id", id_type, "42"), ("job-type", type_type, "7")]);
            let wrapped = p(&sns_body(r#"{"a":1}"#, attrs)).unwrap();
            let raw = parse(r#"{"a":1}"#, Some("7"), Some("42"), lim).unwrap();
            assert_eq!(wrapped, raw, "{id_type} / {type_type}");
        }
        // Only a Binary attribute has no string value, on SQS as in SNS.
        for t in ["Binary", "Binary.png"] {
            let attrs = typed(&[("job-id", t, "dA==")]);
            assert_eq!(
                bad_wrapper(p(&sns_body(r#"{"type":"t"}"#, attrs))).1,
                format!("message attribute `job-id` is of Type {t}, which has no string value")
            );
        }
    }

    #[test]
    fn a_malformed_sns_notification_is_invalid_with_a_clear_error() {
        let mut n: Value = serde_json::from_str(&sns_body("{}", Value::Null)).unwrap();
        n["Message"] = json!({"type": "t"});
        assert_eq!(
            bad_wrapper(p(&n.to_string())),
            (Wrapper::Sns, "`Message` is an object, not a string".into())
        );
        n.as_object_mut().unwrap().remove("Message");
        assert_eq!(bad_wrapper(p(&n.to_string())).1, "has no `Message`");
        let mut n: Value = serde_json::from_str(&sns_body(r#"{"type":"t"}"#, Value::Null)).unwrap();
        n.as_object_mut().unwrap().remove("MessageId");
        assert_eq!(bad_wrapper(p(&n.to_string())).1, "has no `MessageId`");
        n["MessageId"] = json!("x".repeat(MAX_JOB_ID_LEN + 1));
        assert_eq!(
            p(&n.to_string()),
            Err(EnvelopeError::Wrapped {
                wrapper: Wrapper::Sns,
                error: Box::new(EnvelopeError::BadIdLength(MAX_JOB_ID_LEN + 1))
            })
        );
        let binary = json!({"job-type": {"Type": "Binary", "Value": "dA=="}});
        assert_eq!(
            bad_wrapper(p(&sns_body("x", binary))).1,
            "message attribute `job-type` is of Type Binary, which has no string value"
        );
        let no_value = json!({"job-type": {"Type": "String"}});
        assert!(
            bad_wrapper(p(&sns_body("x", no_value)))
                .1
                .contains("no string `Type` and `Value`")
        );
        assert_eq!(
            bad_wrapper(p(&sns_body("x", json!(["job-type"])))).1,
            "`MessageAttributes` is an array, not an object"
        );
        // A message that is no job: the error names the notification and what is missing.
        let e = p(&sns_body("hello", Value::Null)).unwrap_err();
        assert!(
            matches!(&e, EnvelopeError::Wrapped { wrapper: Wrapper::Sns, error } if matches!(**error, EnvelopeError::NotJson(_)))
        );
        assert!(
            e.to_string().starts_with("SNS notification: body is not JSON"),
            "{e}"
        );
        // The unwrapped values meet the envelope's limits.
        let long = "x".repeat(MAX_JOB_TYPE_LEN + 1);
        assert_eq!(
            p(&sns_body("x", sns_attrs(&[("job-type", &long)]))),
            Err(EnvelopeError::Wrapped {
                wrapper: Wrapper::Sns,
                error: Box::new(EnvelopeError::BadTypeLength(MAX_JOB_TYPE_LEN + 1))
            })
        );
    }

    #[test]
    fn an_sns_subscription_confirmation_is_no_job() {
        let mut n: Value =
            serde_json::from_str(&sns_body("You have chosen to subscribe", Value::Null)).unwrap();
        n["Type"] = json!("SubscriptionConfirmation");
        n["SubscribeURL"] = json!("https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription");
        let (w, problem) = bad_wrapper(p(&n.to_string()));
        assert_eq!(w, Wrapper::Sns);
        assert!(
            problem.starts_with(
                "is of `Type` SubscriptionConfirmation, not Notification: it holds no job: confirm"
            ),
            "{problem}"
        );
    }

    #[test]
    fn an_eventbridge_event_is_mapped_else_its_detail_envelope_else_its_detail_type() {
        let none = EventBridgeTypes::new();
        let order = json!({"order": 7});
        // Mapped: the detail is the payload, the event id the job id.
        let job = eb(
            &event("Order Placed", order.clone()),
            &types("Order Placed=billing.charge"),
        )
        .unwrap();
        assert_eq!(
            job,
            Job {
                job_type: "billing.charge".into(),
                id: Some("7bf73129-1428-4cd3-a780-95db273d1602".into()),
                payload: order.clone(),
            }
        );
        // Not mapped: the detail-type as it is.
        let job = eb(&event("Order Placed", order.clone()), &none).unwrap();
        assert_eq!(job.job_type, "Order Placed");
        assert_eq!(job.payload, order);
        // A detail that is an envelope, with and without its own id.
        let env = json!({"type": "email.send", "payload": {"to": "a@b"}, "id": "j-9"});
        let job = eb(&event("Job", env), &none).unwrap();
        assert_eq!(
            (job.job_type.as_str(), job.id.as_deref()),
            ("email.send", Some("j-9"))
        );
        assert_eq!(job.payload, json!({"to": "a@b"}));
        let job = eb(
            &event("Job", json!({"type": "email.send", "payload": null})),
            &none,
        )
        .unwrap();
        assert_eq!(job.id.as_deref(), Some("7bf73129-1428-4cd3-a780-95db273d1602"));
        // An ordinary detail with a `type` field is no envelope without a `payload`.
        let job = eb(&event("Order Placed", json!({"type": "premium"})), &none).unwrap();
        assert_eq!(job.job_type, "Order Placed");
        assert_eq!(job.payload, json!({"type": "premium"}));
        // A mapping wins over a detail that looks like an envelope.
        let looks = json!({"type": "premium", "payload": 1});
        let job = eb(
            &event("Order Placed", looks.clone()),
            &types("Order Placed=billing.charge"),
        )
        .unwrap();
        assert_eq!(job.job_type, "billing.charge");
        assert_eq!(job.payload, looks);
    }

    #[test]
    fn a_malformed_eventbridge_event_is_invalid_with_a_clear_error() {
        let none = EventBridgeTypes::new();
        let mut e = event("Order Placed", json!({}));
        e.as_object_mut().unwrap().remove("detail");
        assert_eq!(
            bad_wrapper(eb(&e, &none)),
            (Wrapper::EventBridge, "has no `detail`".into())
        );
        let mut e = event("Order Placed", json!({}));
        e["id"] = json!(5);
        assert_eq!(bad_wrapper(eb(&e, &none)).1, "`id` is a number, not a string");
        let mut e = event("Order Placed", json!({}));
        e["detail-type"] = json!(null);
        assert_eq!(bad_wrapper(eb(&e, &none)).1, "has no `detail-type`");
        let long = "x".repeat(MAX_JOB_TYPE_LEN + 1);
        let problem = bad_wrapper(eb(&event(&long, json!({})), &none)).1;
        assert!(problem.contains("cannot be a job type") && problem.contains("TRIAGE_EVENTBRIDGE_TYPES"));
        let e = eb(&event("Job", json!({"type": "t", "payload": 1, "id": 7})), &none).unwrap_err();
        assert_eq!(
            e.to_string(),
            "EventBridge event: envelope `id` is a number, not a string"
        );
    }

    #[test]
    fn an_envelope_or_a_job_type_attribute_is_never_read_as_a_wrapper() {
        // A `type` field makes the body an envelope, whatever wrapper fields it also carries.
        let mut n: Value = serde_json::from_str(&sns_body(r#"{"type":"inner"}"#, Value::Null)).unwrap();
        n["type"] = json!("outer");
        n["payload"] = json!(1);
        let job = p(&n.to_string()).unwrap();
        assert_eq!((job.job_type.as_str(), job.id), ("outer", None));
        n["type"] = json!(null);
        assert_eq!(p(&n.to_string()), Err(EnvelopeError::MissingType));
        let mut e = event("Order Placed", json!({}));
        e["type"] = json!("outer");
        assert_eq!(p(&e.to_string()).unwrap().job_type, "outer");
        // The SQS `job-type` attribute keeps the whole wrapper as the payload.
        let lim = EnvelopeLimits::default();
        let body = sns_body(r#"{"type":"inner"}"#, Value::Null);
        let job = parse(&body, Some("sns.audit"), None, lim).unwrap();
        assert_eq!(job.job_type, "sns.audit");
        assert_eq!(job.payload, serde_json::from_str::<Value>(&body).unwrap());
        // Near misses are not wrappers: their errors are the envelope's.
        let near = [
            json!({"Type": "Notification", "Message": "{\"type\":\"t\"}"}),
            json!({"Type": "Notice", "TopicArn": TOPIC, "Message": "{\"type\":\"t\"}"}),
            json!({"Type": "Notification", "TopicArn": 5, "Message": "{\"type\":\"t\"}"}),
            json!({"detail-type": "X", "detail": {}}),
            json!({"source": "x", "detail": {}}),
        ];
        for body in near {
            assert_eq!(p(&body.to_string()), Err(EnvelopeError::MissingType), "{body}");
        }
    }

    #[test]
    fn wrappers_nest_once_eventbridge_inside_sns() {
        let none = EventBridgeTypes::new();
        let inner = event("Job", json!({"type": "email.send", "payload": 1}));
        let job = parse_with(
            &sns_body(&inner.to_string(), Value::Null),
            None,
            None,
            EnvelopeLimits::default(),
            &none,
        )
        .unwrap();
        assert_eq!(job.job_type, "email.send");
        assert_eq!(job.id.as_deref(), Some("7bf73129-1428-4cd3-a780-95db273d1602"));
        // An SNS notification inside one is not unwrapped again.
        let twice = sns_body(&sns_body(r#"{"type":"t"}"#, Value::Null), Value::Null);
        assert_eq!(
            p(&twice),
            Err(EnvelopeError::Wrapped {
                wrapper: Wrapper::Sns,
                error: Box::new(EnvelopeError::MissingType)
            })
        );
    }

    #[test]
    fn eventbridge_types_read_pairs_or_json_and_refuse_what_they_cannot_use() {
        let t = types(" Order Placed = billing.charge ;Refund=billing.refund;");
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            [("Order Placed", "billing.charge"), ("Refund", "billing.refund")]
        );
        let t = types(r#"{"a=b;c": "x.y"}"#);
        assert_eq!(t.get("a=b;c"), Some("x.y"));
        assert!(types("").is_empty());
        let err = |s: &str| EventBridgeTypes::parse(s).unwrap_err();
        assert_eq!(
            err("Order Placed"),
            "`Order Placed` is not `Detail Type=job.type`"
        );
        assert_eq!(err("A=x;A=y"), "detail-type `A` is listed twice");
        assert!(
            err("A=").starts_with("`A` maps to \"\": job type must be"),
            "{}",
            err("A=")
        );
        assert!(err("=x").starts_with("detail-type \"\" must be"));
        assert_eq!(err(r#"{"A": 1}"#), "`A` maps to a number, not a string");
        assert!(err("{nope").starts_with("not a JSON object"));
        // Code's mappings win over the configuration's.
        let code = types("A=code");
        let merged = code.or(&types("A=env;B=env"));
        assert_eq!(merged.get("A"), Some("code"));
        assert_eq!(merged.get("B"), Some("env"));
    }

    /// The handler's reading of a body as the general reading has it: the job (its payload as
    /// a JSON value) or the error.
    fn for_handler(body: &str, id_attribute: Option<&str>) -> Result<Job, EnvelopeError> {
        parse_for_handler(
            body,
            None,
            id_attribute,
            EnvelopeLimits::default(),
            &EventBridgeTypes::new(),
        )
        .map(|j| Job {
            job_type: j.job_type,
            id: j.id,
            payload: j.payload.into_value(),
        })
    }

    fn general(body: &str, id_attribute: Option<&str>) -> Result<Job, EnvelopeError> {
        parse_with(
            body,
            None,
            id_attribute,
            EnvelopeLimits::default(),
            &EventBridgeTypes::new(),
        )
    }

    fn nested(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn the_handlers_reading_is_the_general_reading() {
        let deep = |d: usize| format!(r#"{{"type":"t","payload":{}}}"#, nested(d));
        let bodies = [
            r#"{"type":"t","id":"j","payload":{"to":"a@b","n":[1,2.5,-3,null,true]}}"#.to_owned(),
            r#" {"payload":{"a":"\u00e9\n"},"type":"t"}"#.into(),
            r#"{"type":"t"}"#.into(),
            r#"{"type":"t","payload":null,"id":null}"#.into(),
            r#"{"type":"t","type":"u","payload":1}"#.into(),
            r#"{"type":"t","payload":1,"payload":2}"#.into(),
            r#"{"type":null,"payload":1}"#.into(),
            r#"{"type":5}"#.into(),
            r#"{"type":""}"#.into(),
            r#"{"type":"t","id":7}"#.into(),
            r#"{"type":"t","id":""}"#.into(),
            r#"{"type":"t","payload":"\ud800"}"#.into(),
            r#"{"type":"t","payload":{"k":"\udc00x"}}"#.into(),
            r#"{"type":"t","payload":[1e400]}"#.into(),
            r#"{"type":"t","payload":-1e-400}"#.into(),
            r#"{"type":"t","payload":{"\ud800":1}}"#.into(),
            r#"{"typ\u0065":"t","payload":2}"#.into(),
            r#"{"type":"t","payload":1} x"#.into(),
            r#"{"type":"t","payload":1"#.into(),
            r#"["t",null,1]"#.into(),
            r#"{"Type":"Notification","TopicArn":"a","Message":"{}","MessageId":"m","type":"t"}"#.into(),
            r#"{"detail-type":"d","source":"s","detail":{"type":"x","payload":1},"id":"e"}"#.into(),
            format!(r#"{{"type":"{}"}}"#, "x".repeat(MAX_JOB_TYPE_LEN + 1)),
            deep(TEXT_PAYLOAD_DEPTH),
            deep(TEXT_PAYLOAD_DEPTH + 1),
            deep(126),
            deep(127),
            deep(1_000),
        ];
        for body in &bodies {
            for id_attribute in [None, Some("attr-id"), Some("")] {
                assert_eq!(
                    for_handler(body, id_attribute),
                    general(body, id_attribute),
                    "{body} / {id_attribute:?}"
                );
            }
        }
        // The plain envelopes keep their payload as text; the others are read as JSON.
        let text = |body: &str| {
            matches!(
                parse_for_handler(
                    body,
                    None,
                    None,
                    EnvelopeLimits::default(),
                    &EventBridgeTypes::new()
                ),
                Ok(Job {
                    payload: Payload::Text(_),
                    ..
                })
            )
        };
        assert!(text(&bodies[1]) && text(&deep(TEXT_PAYLOAD_DEPTH)));
        assert!(text(
            r#"{"type":"t","id":"j","payload":{"to":"a@b","n":[1,-3,null,true]}}"#
        ));
        // No payload, a lone surrogate, too deep, a float.
        assert!(!text(&bodies[2]) && !text(&bodies[11]) && !text(&deep(TEXT_PAYLOAD_DEPTH + 1)));
        assert!(!text(&bodies[0]));
    }

    #[test]
    fn a_text_payload_decodes_as_its_json_value_does() {
        #[derive(Debug, PartialEq, serde::Deserialize)]
        struct Email {
            to: String,
        }
        let text = |t: &str| Payload::Text(RawValue::from_string(t.to_owned()).unwrap());
        let value = |t: &str| Payload::Value(serde_json::from_str(t).unwrap());
        for t in [
            r#"{"to":"a"}"#,
            r#"{"to":"a","to":"b"}"#,
            r#"{"to":"a","cc":[1,{"x":null}]}"#,
        ] {
            assert_eq!(
                text(t).decode::<Email>().unwrap(),
                value(t).decode::<Email>().unwrap(),
                "{t}"
            );
            assert_eq!(
                text(t).decode::<Value>().unwrap(),
                value(t).decode::<Value>().unwrap(),
                "{t}"
            );
        }
        for t in [r#"{"to":5}"#, r#"{"cc":1}"#, "[1]", "null"] {
            assert_eq!(
                text(t).decode::<Email>().unwrap_err().to_string(),
                value(t).decode::<Email>().unwrap_err().to_string(),
                "{t}"
            );
        }
    }

    /// What decoding through the handler's reading gives, against decoding the general
    /// reading's JSON value: the same value or the same error text.
    fn decodes_alike<P>(body: &str)
    where
        P: DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let fast = parse_for_handler(
            body,
            None,
            None,
            EnvelopeLimits::default(),
            &EventBridgeTypes::new(),
        )
        .map(|j| j.payload.decode::<P>().map_err(|e| e.to_string()));
        let general =
            general(body, None).map(|j| serde_json::from_value::<P>(j.payload).map_err(|e| e.to_string()));
        assert_eq!(fast, general, "{body}");
    }

    #[test]
    fn payloads_a_json_value_would_read_otherwise_decode_from_that_value() {
        // Integers past 64 bits and `-0`: a JSON value holds them as floats.
        decodes_alike::<u128>(r#"{"type":"t","payload":18446744073709551616}"#);
        decodes_alike::<i128>(r#"{"type":"t","payload":-9223372036854775809}"#);
        decodes_alike::<i128>(r#"{"type":"t","payload":-0}"#);
        decodes_alike::<f64>(r#"{"type":"t","payload":1.5e3}"#);
        #[derive(Debug, PartialEq, serde::Deserialize)]
        struct Wide {
            n: u128,
        }
        decodes_alike::<Wide>(r#"{"type":"t","payload":{"n":340282366920938463463374607431768211455}}"#);
        // A key given twice: the value keeps the last, and an untagged enum's first variant
        // reads it.
        #[derive(Debug, PartialEq, serde::Deserialize)]
        #[serde(untagged)]
        enum Either {
            Typed { to: String },
            Any(Value),
        }
        decodes_alike::<Either>(r#"{"type":"t","payload":{"to":"a","to":"b"}}"#);
        decodes_alike::<Either>(r#"{"type":"t","payload":{"to":"a"}}"#);
        decodes_alike::<Either>(r#"{"type":"t","payload":[{"x":{"y":1,"y":2}}]}"#);
        // The parser's raw-value key, in the payload or anywhere in the body.
        for body in [
            r#"{"type":"t","x":{"$serde_json::private::RawValue":"not json"}}"#,
            r#"{"type":"t","payload":{"$serde_json::private::RawValue":"1","b":2}}"#,
            r#"{"type":"t","payload":{"$serde_json::private::RawValue":"[1,2]"}}"#,
            r#"{"$serde_json::private::RawValue":"1","type":"t"}"#,
            r#"{"$serde_json::private::RawValue":"{\"type\":\"t\"}"}"#,
        ] {
            assert_eq!(for_handler(body, None), general(body, None), "{body}");
            decodes_alike::<HashMap<String, Value>>(body);
            decodes_alike::<Value>(body);
        }
    }

    /// The few shapes a payload's text decodes and its JSON value did not: what
    /// `docs/handlers.md` says of them holds.
    #[test]
    fn a_text_payload_decodes_the_shapes_serde_json_reads_from_text() {
        #[derive(Debug, PartialEq, serde::Deserialize)]
        enum Shape {
            Point { x: u8, y: u8 },
        }
        #[derive(Debug, PartialEq, serde::Deserialize)]
        #[serde(tag = "kind", content = "value")]
        enum Msg {
            Stop(()),
        }
        let decode = |body: &str| {
            parse_for_handler(
                body,
                None,
                None,
                EnvelopeLimits::default(),
                &EventBridgeTypes::new(),
            )
            .unwrap()
            .payload
        };
        let array = r#"{"type":"t","payload":{"Point":[1,2]}}"#;
        assert!(serde_json::from_value::<Shape>(general(array, None).unwrap().payload).is_err());
        assert_eq!(
            decode(array).decode::<Shape>().unwrap(),
            Shape::Point { x: 1, y: 2 }
        );
        let content_first = r#"{"type":"t","payload":{"value":{},"kind":"Stop"}}"#;
        assert!(serde_json::from_value::<Msg>(general(content_first, None).unwrap().payload).is_err());
        assert_eq!(decode(content_first).decode::<Msg>().unwrap(), Msg::Stop(()));
    }

    proptest::proptest! {
        /// Bodies made of envelope fields, given in any order, any number of times, with odd
        /// values: the handler's reading is the general reading.
        #[test]
        fn the_handlers_reading_is_the_general_reading_on_odd_bodies(
            fields in proptest::collection::vec(
                (
                    proptest::sample::select(vec!["type", "id", "payload", "typ\\u0065", "other"]),
                    proptest::sample::select(vec![
                        "\"t\"", "\"\"", "null", "1", "1e400", "\"\\ud800\"", "[1,{\"a\":[]}]",
                        "{\"to\":\"x\",\"to\":\"y\"}", "{}", "true", "\"\\u00e9\"",
                    ]),
                ),
                0..6,
            ),
            space in proptest::sample::select(vec!["", " ", "\n", "\u{a0}"]),
        ) {
            let inner: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            let body = format!("{space}{{{}}}", inner.join(","));
            proptest::prop_assert_eq!(for_handler(&body, None), general(&body, None), "{}", body);
        }
    }

    proptest::proptest! {
        /// Whatever wrapper fields an envelope also holds, it is read as that envelope.
        #[test]
        fn an_envelope_with_wrapper_fields_stays_that_envelope(
            job_type in "[a-z.]{1,20}",
            extra in proptest::sample::subsequence(
                vec!["Type", "TopicArn", "Message", "MessageId", "MessageAttributes",
                     "detail-type", "source", "detail", "version", "account"],
                0..=10,
            ),
        ) {
            let mut body = json!({"type": job_type, "payload": {"k": 1}});
            for k in extra {
                body[k] = match k {
                    "Type" => json!("Notification"),
                    "MessageAttributes" => sns_attrs(&[("job-type", "other")]),
                    "detail" => json!({"type": "other", "payload": 2}),
                    _ => json!("arn:aws:sns:us-east-1:1:t"),
                };
            }
            let types = types("arn:aws:sns:us-east-1:1:t=mapped");
            let job = parse_with(&body.to_string(), None, None, EnvelopeLimits::default(), &types).unwrap();
            proptest::prop_assert_eq!(job.job_type, job_type);
            proptest::prop_assert_eq!(job.payload, json!({"k": 1}));
        }
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
