//! Bad input, fuzzed: arbitrary bytes and strings through the envelope parser, and through
//! `SqsEvent` deserialization followed by the processor's reading of a record and the pure
//! decision. No input panics and every input ends in exactly one decision.
//!
//! cargo-fuzz needs a nightly toolchain, so this is proptest over raw bytes (plus
//! structure-aware generators that reach past the JSON syntax check). The corpus in
//! `tests/corpus/{envelope,sqs_event}` is replayed on every run; `PROPTEST_CASES` scales
//! the random part (CI runs the default, a few seconds).

use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use proptest::prelude::*;
use sqs_triage::core::envelope::{self, EnvelopeLimits};
use sqs_triage::core::{
    Decision, FailureClass, Gate, Inputs, JobError, Ledger, RecordFacts, RetryPolicy, StoredAttempts,
    Verdict, admit, conclude, invalid as invalid_decision,
};
use sqs_triage::processor::Incoming;
use sqs_triage::runtime::lambda::read_records;

const REGISTERED: &str = "triage.chaos";

/// What the processor does with one record up to the decision, without I/O: parse the
/// envelope, route the job type, decide before the handler and, when it runs, after it.
fn decision_for(inc: &Incoming, ledger: Ledger, outcome: &Result<(), JobError>) -> Decision {
    let parsed = envelope::parse(
        &inc.body,
        inc.job_type_attribute(),
        inc.job_id_attribute(),
        EnvelopeLimits::default(),
    );
    let invalid = match &parsed {
        Err(e) => Some(e.to_string()),
        Ok(job) if job.job_type != REGISTERED => Some(format!("no handler for job type `{}`", job.job_type)),
        Ok(_) => None,
    };
    if let Some(reason) = &invalid {
        let d = invalid_decision(reason);
        assert!(
            matches!(&d, Decision::DeadLetter { class: FailureClass::Invalid, attempts: 0, error } if error == reason),
            "an unreadable record is dead-lettered as invalid: {d:?}"
        );
        // The reason goes into the failure record: it must never be empty.
        assert!(!reason.is_empty());
        return d;
    }
    let policy = RetryPolicy::default();
    let now = 1_767_225_600_000;
    let inputs = Inputs {
        record: RecordFacts {
            receive_count: inc.receive_count,
            received_at_ms: now,
            receive_limit: None,
            expires_at_ms: None,
        },
        ledger: if inc.receive_count > 1 {
            ledger
        } else {
            Ledger::FirstDelivery
        },
        gate: Gate::Closed,
        time_left: Some(Duration::from_secs(30)),
        policy: &policy,
        now_ms: now,
    };
    let mut rng = rand::rng();
    match admit(&inputs, &mut rng) {
        Verdict::Run { attempt } => {
            assert!(attempt >= 1 && attempt <= policy.max_attempts());
            conclude(&inputs, outcome, &mut rng).decision
        }
        Verdict::Decided(d) => d,
    }
}

fn incoming(body: String, job_type: Option<String>, receive_count: u32) -> Incoming {
    let mut inc = Incoming {
        message_id: "m-1".into(),
        receipt_handle: "r-1".into(),
        body,
        receive_count,
        first_received_at_ms: None,
        sent_at_ms: None,
        group_id: None,
        attributes: Default::default(),
        from_fifo: false,
        source_arn: None,
    };
    if let Some(t) = job_type {
        inc.attributes.insert(
            envelope::JOB_TYPE_ATTRIBUTE.into(),
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value(t)
                .build()
                .unwrap(),
        );
    }
    inc
}

/// Every record of an event (if it deserializes) gets exactly one decision.
fn event_bytes(bytes: &[u8]) -> usize {
    let Ok(event) = serde_json::from_slice::<SqsEvent>(bytes) else {
        // Lambda would fail the invocation before the handler: nothing is lost, the whole
        // batch comes back.
        return 0;
    };
    let n = event.records.len();
    for record in event.records {
        let inc = Incoming::from_lambda(record);
        assert!(inc.receive_count >= 1);
        // A final decision, by its type (never "run").
        let _: Decision = decision_for(&inc, Ledger::Stored(None), &Err(JobError::transient("t")));
    }
    n
}

/// The function reads an event from its JSON text (`read_records`: each record with the typed
/// model straight from its text, a rejected one as JSON); the JSON reading
/// (`Incoming::from_lambda_json` on each record of the parsed event) is the reference. Both
/// must read every record the same way. Returns whether the bytes were an event to compare.
fn readings_agree(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let Ok(serde_json::Value::Object(mut event)) = serde_json::from_str(text) else {
        return false;
    };
    let Some(serde_json::Value::Array(records)) = event.remove("Records") else {
        return false;
    };
    let Ok(from_text) = read_records(text) else {
        // A `Records` key given twice: the function reads such an event as JSON instead.
        return false;
    };
    let from_json: Vec<_> = records.iter().map(Incoming::from_lambda_json).collect();
    assert_eq!(from_text, from_json, "{text}");
    true
}

fn envelope_bytes(bytes: &[u8], job_type: Option<String>) {
    let body = String::from_utf8_lossy(bytes).into_owned();
    for outcome in [Ok(()), Err(JobError::fatal("f")), Err(JobError::transient("t"))] {
        for ledger in [
            Ledger::Stored(None),
            Ledger::Unavailable,
            Ledger::Stored(Some(StoredAttempts {
                attempts: 4,
                next_attempt_at_ms: None,
            })),
        ] {
            let _: Decision = decision_for(&incoming(body.clone(), job_type.clone(), 3), ledger, &outcome);
        }
    }
}

fn corpus(dir: &str) -> Vec<(String, Vec<u8>)> {
    let dir = crate::support::repo_root().join("tests/corpus").join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect()
}

#[test]
fn envelope_corpus_replays_without_panic() {
    let files = corpus("envelope");
    assert!(files.len() >= 20);
    for (name, bytes) in files {
        eprintln!("{name}");
        envelope_bytes(&bytes, None);
        envelope_bytes(&bytes, Some(REGISTERED.into()));
        envelope_bytes(&bytes, Some(String::new()));
    }
}

#[test]
fn sqs_event_corpus_replays_without_panic() {
    let files = corpus("sqs_event");
    assert!(files.len() >= 15);
    let mut records = 0;
    let mut compared = 0;
    for (name, bytes) in files {
        eprintln!("{name}");
        records += event_bytes(&bytes);
        compared += usize::from(readings_agree(&bytes));
    }
    assert!(compared > 5, "{compared} corpus events compared");
    assert!(
        records > 10,
        "the corpus reaches the processor ({records} records)"
    );
}

/// A JSON value of any shape, for structure-aware event generation.
fn any_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        ".{0,40}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            prop::collection::btree_map(".{0,12}", inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An envelope-like body: mostly valid JSON objects with `type`, `id` and `payload` fields
/// of any type, sometimes mangled.
fn envelope_like() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just(serde_json::json!(REGISTERED)), any_json()],
        prop::option::of(any_json()),
        any_json(),
        0usize..3,
    )
        .prop_map(|(t, id, payload, mangle)| {
            let mut o = serde_json::json!({"type": t, "payload": payload});
            if let Some(id) = id {
                o["id"] = id;
            }
            let s = o.to_string();
            match mangle {
                0 => s,
                1 => s.chars().take(s.chars().count() / 2).collect(),
                _ => format!("{s}{s}"),
            }
        })
}

/// A body SNS or EventBridge could have wrapped a job in: each field the unwrapping reads is
/// either what the service writes or a value of any shape, and the message inside is an
/// envelope-like body, a nested wrapper or anything.
fn wrapper_like() -> impl Strategy<Value = String> {
    let or_any = |good: serde_json::Value| prop_oneof![3 => Just(good), 1 => any_json()];
    let inner = prop_oneof![
        envelope_like(),
        Just(r#"{"version":"0","id":"e","detail-type":"D","source":"s","detail":{"type":"triage.chaos","payload":{}}}"#.to_owned()),
        ".{0,40}",
    ];
    let attrs = prop_oneof![
        Just(serde_json::Value::Null),
        Just(serde_json::json!({"job-type": {"Type": "String", "Value": REGISTERED}})),
        Just(
            serde_json::json!({"job-type": {"Type": "Binary", "Value": "AA=="}, "job-id": {"Type": "String"}})
        ),
        any_json(),
    ];
    let sns = (
        or_any(serde_json::json!("Notification")),
        or_any(serde_json::json!("arn:aws:sns:us-east-1:1:t")),
        or_any(serde_json::json!("m-1")),
        inner.clone().prop_map(serde_json::Value::from),
        any_json(),
        attrs,
    )
        .prop_map(|(kind, topic, id, message, any_message, attrs)| {
            let mut o =
                serde_json::json!({"Type": kind, "TopicArn": topic, "MessageId": id, "Message": message});
            if !attrs.is_null() {
                o["MessageAttributes"] = attrs;
            }
            if any_message.is_boolean() {
                o["Message"] = any_message;
            }
            o.to_string()
        });
    let eventbridge = (
        or_any(serde_json::json!("Order Placed")),
        or_any(serde_json::json!("e-1")),
        prop_oneof![
            inner.prop_map(|s| serde_json::from_str(&s).unwrap_or(serde_json::Value::String(s))),
            any_json()
        ],
        any::<bool>(),
    )
        .prop_map(|(detail_type, id, detail, drop_detail)| {
            let mut o = serde_json::json!({"version": "0", "id": id, "detail-type": detail_type,
                "source": "s", "account": "1", "time": "t", "region": "r", "resources": [], "detail": detail});
            if drop_detail {
                o.as_object_mut().unwrap().remove("detail");
            }
            o.to_string()
        });
    prop_oneof![sns, eventbridge]
}

/// An SQS event whose records have fields of any shape.
fn event_like() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        (
            prop::option::of(".{0,20}"),
            prop_oneof![envelope_like().prop_map(serde_json::Value::from), any_json()],
            prop_oneof![
                Just(serde_json::json!("1")),
                Just(serde_json::json!("7")),
                any_json()
            ],
            prop_oneof![
                Just(serde_json::json!({})),
                Just(serde_json::json!({"job-type": {"dataType": "String", "stringValue": REGISTERED}})),
                Just(serde_json::json!({"b": {"dataType": "Binary", "binaryValue": "/wD+"}})),
                any_json(),
            ],
        ),
        0..5,
    )
    .prop_map(|records| {
        let records: Vec<serde_json::Value> = records
            .into_iter()
            .map(|(id, body, count, attrs)| {
                serde_json::json!({
                    "messageId": id,
                    "receiptHandle": "r",
                    "body": body,
                    "attributes": {"ApproximateReceiveCount": count},
                    "messageAttributes": attrs,
                    "eventSource": "aws:sqs",
                })
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({ "Records": records })).unwrap()
    })
}

/// An SQS event as text, with what a JSON value cannot carry: FIFO attributes, a key given
/// twice in a record, escapes, and records written as JSON arrays.
fn event_text_like() -> impl Strategy<Value = Vec<u8>> {
    let record = (
        prop::option::of("[a-z0-9]{0,6}"),
        prop_oneof![Just(None), Just(Some("g1")), Just(Some("g2"))],
        any::<bool>(),
        prop_oneof![
            Just(r#""{\"type\":\"t\",\"id\":\"\u00e9\"}""#),
            Just(r#""\ud83d\ude00""#),
            Just(r#"{"not":"a string"}"#),
            Just(r#""plain""#),
        ],
        prop_oneof![Just(""), Just(r#","body":"second""#), Just(r#","messageId":"other""#)],
        any::<bool>(),
    )
        .prop_map(|(id, group, fifo, body, dup, array)| {
            if array {
                let id = id.map_or("null".to_owned(), |i| format!("{i:?}"));
                return format!(r#"[{id},"rh",{body},null,null,{{"MessageGroupId":"g1"}},{{}},"arn:aws:sqs:us-east-1:1:q.fifo"]"#);
            }
            let mut attrs = serde_json::json!({"ApproximateReceiveCount": "2"});
            if let Some(g) = group {
                attrs["MessageGroupId"] = serde_json::json!(g);
            }
            let arn = if fifo { "arn:aws:sqs:us-east-1:1:q.fifo" } else { "arn:aws:sqs:us-east-1:1:q" };
            let id = id.map_or("null".to_owned(), |i| format!("{i:?}"));
            format!(
                r#"{{"messageId":{id},"receiptHandle":"rh","body":{body},"attributes":{attrs},"messageAttributes":{{}},"eventSourceARN":"{arn}"{dup}}}"#
            )
        });
    prop::collection::vec(record, 0..6)
        .prop_map(|records| format!(r#"{{"Records":[{}]}}"#, records.join(",")).into_bytes())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn envelope_parser_takes_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512),
                                       job_type in prop::option::of(".{0,8}")) {
        envelope_bytes(&bytes, job_type);
    }

    #[test]
    fn envelope_parser_takes_any_envelope_shape(body in envelope_like()) {
        envelope_bytes(body.as_bytes(), None);
    }

    #[test]
    fn envelope_parser_takes_any_sns_or_eventbridge_shape(body in wrapper_like()) {
        envelope_bytes(body.as_bytes(), None);
        let mapped = envelope::EventBridgeTypes::parse("Order Placed=triage.chaos").unwrap();
        let _ = envelope::parse_with(&body, None, None, EnvelopeLimits::default(), &mapped);
    }

    #[test]
    fn sqs_event_takes_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        event_bytes(&bytes);
    }

    #[test]
    fn the_text_reading_agrees_with_the_json_reading(bytes in event_text_like()) {
        prop_assert!(readings_agree(&bytes), "{}", String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn sqs_event_takes_any_record_shape(bytes in event_like()) {
        event_bytes(&bytes);
        prop_assert!(readings_agree(&bytes));
    }
}
