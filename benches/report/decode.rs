//! Issue 29's question, measured: the records and envelopes of a healthy event decoded as the
//! processor decodes them (hand-written visitors: the lean record model, the plain envelope
//! with its payload kept as text) and by the equivalent derived serde types
//! (`aws_lambda_events`' `SqsEvent`, a derived envelope with its payload as a JSON value).
//! Both end with the handler's payload type decoded; nothing else runs.

use serde::Deserialize;
use serde_json::Value;
use sqs_triage::core::envelope::{EnvelopeLimits, EventBridgeTypes, parse_for_handler};
use sqs_triage::processor::Incoming;
use sqs_triage::runtime::lambda::read_records;

/// The handler's payload type of the generated event (as `pipeline.rs`'s).
#[derive(Deserialize)]
#[allow(dead_code)]
struct Email {
    to: String,
    template: String,
    #[serde(default)]
    outcome: Option<String>,
}

/// The envelope as a derived type reads it: the payload as a JSON value, decoded from it.
#[derive(Deserialize)]
#[allow(dead_code)]
struct Envelope {
    #[serde(rename = "type")]
    job_type: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    payload: Value,
}

/// The visitors' way: [`read_records`], then [`parse_for_handler`] and the payload decoded
/// from its text. Returns the records decoded.
pub fn visitors(event: &str) -> Result<usize, String> {
    let eventbridge = EventBridgeTypes::default();
    let mut n = 0;
    for r in read_records(event).map_err(|e| e.to_string())? {
        let inc = r.map_err(|e| format!("{e:?}"))?;
        let job = parse_for_handler(
            &inc.body,
            inc.job_type_attribute(),
            inc.job_id_attribute(),
            EnvelopeLimits::default(),
            &eventbridge,
        )
        .map_err(|e| e.to_string())?;
        let email: Email = job.payload.decode().map_err(|e| e.to_string())?;
        std::hint::black_box((&inc, &job.job_type, &job.id, email));
        n += 1;
    }
    Ok(n)
}

/// The derived way: the typed `SqsEvent`, each record into [`Incoming`], its envelope into
/// the derived [`Envelope`] and the payload decoded from that JSON value.
pub fn derived(event: &str) -> Result<usize, String> {
    let e: aws_lambda_events::event::sqs::SqsEvent =
        serde_json::from_str(event).map_err(|e| e.to_string())?;
    let mut n = 0;
    for m in e.records {
        let inc = Incoming::from_lambda(m);
        let env: Envelope = serde_json::from_str(&inc.body).map_err(|e| e.to_string())?;
        let email: Email = serde_json::from_value(env.payload).map_err(|e| e.to_string())?;
        std::hint::black_box((&inc, &env.job_type, &env.id, email));
        n += 1;
    }
    Ok(n)
}
