//! Producers behind SNS and EventBridge, through `triage-lambda` on the local stack: a job
//! inside an SNS notification (raw message delivery off) or an EventBridge event runs as that
//! job, and a dead-lettered one reaches the DLQ as SQS delivered it, wrapper and all, byte for
//! byte.

use crate::edge_lambda::{Lambda, failures, record, response};
use crate::support;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use sqs_triage::core::failure::{FailureClass, FailureRecord};
use sqs_triage::effects::dlq::failure_record;

const SNS_ID: &str = "0b4c1e5a-51a3-5b5e-9bd8-6b1f0c2d3e4f";
const EVENT_ID: &str = "3e1d7f0a-8a1c-4b7e-b1c4-2c9d6e5f4a3b";

/// An SNS notification as SNS writes it to an SQS subscriber: spaced `" : "` separators, one
/// field a line, the message as an escaped JSON string.
fn sns(message_id: &str, message: &str, attributes: Option<Value>) -> String {
    let attributes = attributes
        .map(|a| format!(",\n  \"MessageAttributes\" : {a}"))
        .unwrap_or_default();
    format!(
        "{{\n  \"Type\" : \"Notification\",\n  \"MessageId\" : \"{message_id}\",\n  \
         \"TopicArn\" : \"arn:aws:sns:us-east-1:000000000000:orders\",\n  \
         \"Message\" : {message},\n  \"Timestamp\" : \"2026-01-01T00:00:01.000Z\",\n  \
         \"SignatureVersion\" : \"1\",\n  \"Signature\" : \"EXAMPLEpH+DcEwjAPg8O9mY8dReBSwksfg2S7WKQcikcNKWLQjwu6A4VbeS0QHVCkhRS7fUQvi2egU3N858fiTDN6bkkOxYDVrY0Ad8L10Hs3zH81mtnPk5uvvolIC1CXGu43obcgFxeL3khZl8IKvO61GWB6jI9b5+gLPoBc1Q=\",\n  \
         \"SigningCertURL\" : \"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0000000000000000000000.pem\",\n  \
         \"UnsubscribeURL\" : \"https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=arn:aws:sns:us-east-1:000000000000:orders:1\"{attributes}\n}}",
        message = json!(message),
    )
}

/// An EventBridge event as a rule with an SQS target delivers it.
fn event(id: &str, detail_type: &str, detail: Value) -> String {
    format!(
        "{{\"version\":\"0\",\"id\":\"{id}\",\"detail-type\":{dt},\"source\":\"com.example.orders\",\
         \"account\":\"000000000000\",\"time\":\"2026-01-01T00:00:02Z\",\"region\":\"us-east-1\",\
         \"resources\":[],\"detail\":{detail}}}",
        dt = json!(detail_type),
    )
}

fn chaos(id: &str, outcome: &str) -> String {
    json!({"type": "triage.chaos", "payload": {"outcome": outcome}, "id": id}).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_inside_sns_notifications_and_eventbridge_events_run_and_dead_letter_byte_for_byte() {
    let created = support::fresh_resources("fanout", false).await;
    let lambda = Lambda::start(
        &created,
        &[(
            "TRIAGE_EVENTBRIDGE_TYPES",
            "Chaos Requested=triage.chaos;Refund Requested=billing.refund",
        )],
    )
    .await;

    let chaos_attr = json!({"job-type": {"Type": "String", "Value": "triage.chaos"}});
    let bodies: Vec<(&str, String)> = vec![
        // Runs and succeeds: neither reported nor dead-lettered.
        ("sns-ok", sns(SNS_ID, &chaos("sns-ok-1", "ok"), None)),
        // Runs and fails transiently: reported, retried.
        (
            "sns-attr-transient",
            sns(
                "0b4c1e5a-0000-4000-8000-000000000002",
                r#"{"outcome":"transient"}"#,
                Some(chaos_attr.clone()),
            ),
        ),
        // Runs and fails fatally: dead-lettered, the job id the inner envelope's.
        (
            "sns-fatal",
            sns(
                "0b4c1e5a-0000-4000-8000-000000000003",
                &chaos("sns-fatal-1", "fatal"),
                None,
            ),
        ),
        // The job type from SNS's attribute, the job id the notification's MessageId.
        (
            "sns-attr-fatal",
            sns(
                SNS_ID,
                r#"{"outcome":"fatal","note":"caf\u00e9"}"#,
                Some(chaos_attr),
            ),
        ),
        // Mapped detail-type: fatal, the job id the event's.
        (
            "eb-mapped-fatal",
            event(EVENT_ID, "Chaos Requested", json!({"outcome": "fatal"})),
        ),
        // An envelope as the detail: transient.
        (
            "eb-envelope-transient",
            event(
                "3e1d7f0a-0000-4000-8000-000000000002",
                "Job",
                json!({"type": "triage.chaos", "payload": {"outcome": "transient"}}),
            ),
        ),
        // Unmapped detail-type without a handler: invalid.
        (
            "eb-unmapped",
            event(
                "3e1d7f0a-0000-4000-8000-000000000003",
                "Order Placed",
                json!({"order": 7}),
            ),
        ),
        // A notification whose Message is not a string: invalid.
        (
            "sns-malformed",
            sns(SNS_ID, "x", None).replace(r#""Message" : "x""#, r#""Message" : {"type":"triage.chaos"}"#),
        ),
    ];
    assert!(bodies[7].1.contains(r#""Message" : {"type""#));
    let records: Vec<Value> = bodies.iter().map(|(id, body)| record(id, body)).collect();
    let v = response(lambda.invoke(&json!({ "Records": records })).await);
    assert_eq!(
        failures(&v),
        BTreeSet::from([
            "sns-attr-transient".to_owned(),
            "eb-envelope-transient".to_owned()
        ]),
        "{v}\n{}",
        lambda.output()
    );

    let sqs = support::sqs_client().await;
    let dlq: BTreeMap<String, (String, FailureRecord)> = support::read_all(&sqs, &created.dlq_url, 120, 1)
        .await
        .into_iter()
        .map(|m| {
            let attrs = m.message_attributes.clone().unwrap_or_default();
            let rec = failure_record(&attrs)
                .expect("a failure record")
                .expect("readable");
            (rec.original_message_id.clone(), (m.body.unwrap_or_default(), rec))
        })
        .collect();
    let expect: [(&str, FailureClass, Option<&str>, &str); 5] = [
        (
            "sns-fatal",
            FailureClass::Fatal,
            Some("triage.chaos"),
            "sns-fatal-1",
        ),
        (
            "sns-attr-fatal",
            FailureClass::Fatal,
            Some("triage.chaos"),
            SNS_ID,
        ),
        (
            "eb-mapped-fatal",
            FailureClass::Fatal,
            Some("triage.chaos"),
            EVENT_ID,
        ),
        (
            "eb-unmapped",
            FailureClass::Invalid,
            Some("Order Placed"),
            "3e1d7f0a-0000-4000-8000-000000000003",
        ),
        ("sns-malformed", FailureClass::Invalid, None, "sns-malformed"),
    ];
    assert_eq!(
        dlq.keys().cloned().collect::<BTreeSet<_>>(),
        expect.iter().map(|e| e.0.to_owned()).collect::<BTreeSet<_>>(),
        "DLQ copies"
    );
    let sent: BTreeMap<&str, &str> = bodies.iter().map(|(id, b)| (*id, b.as_str())).collect();
    for (id, class, job_type, job_id) in expect {
        let (body, rec) = &dlq[id];
        // The wrapper SQS delivered, not the message inside it.
        assert_eq!(body.as_bytes(), sent[id].as_bytes(), "{id}: DLQ body");
        assert_eq!(rec.class, class, "{id}: {rec:?}");
        assert_eq!(rec.job_type.as_deref(), job_type, "{id}: {rec:?}");
        assert_eq!(rec.job_id, job_id, "{id}: {rec:?}");
        assert_eq!(
            rec.attempts,
            u32::from(class == FailureClass::Fatal),
            "{id}: {rec:?}"
        );
    }
    assert_eq!(
        dlq["eb-unmapped"].1.error,
        "no handler for job type `Order Placed`"
    );
    // A mapping to a job type without a handler is named at start-up.
    let output = lambda.output();
    assert!(
        output.contains(
            "detail-type `Refund Requested` map to job type `billing.refund`, which has no handler"
        ),
        "{output}"
    );
    assert_eq!(
        dlq["sns-malformed"].1.error,
        "SNS notification `Message` is an object, not a string"
    );
}

#[test]
fn a_bad_eventbridge_mapping_stops_the_lambda_binary_at_start_up() {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_triage-lambda"));
    cmd.env("AWS_LAMBDA_FUNCTION_NAME", "triage-local")
        .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
        .env("TRIAGE_QUEUE_URL", "http://127.0.0.1:9/000000000000/q")
        .env("TRIAGE_DLQ_URL", "http://127.0.0.1:9/000000000000/dlq")
        .env("TRIAGE_TABLE", "t")
        .env(
            "TRIAGE_EVENTBRIDGE_TYPES",
            "Chaos Requested=triage.chaos;Order Placed",
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("triage-lambda starts");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("TRIAGE_EVENTBRIDGE_TYPES=")
            && stderr.contains("`Order Placed` is not `Detail Type=job.type`"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_registry_mapping_to_an_impossible_job_type_is_refused_at_start_up() {
    use sqs_triage::config::Config;
    use sqs_triage::processor::registry::Registry;
    let config = Config::from_lookup(&|_| None).unwrap();
    let registry = Registry::default().eventbridge_type("Order Placed", " ");
    let e = sqs_triage::runtime::env::build_with(
        &config,
        registry,
        aws_sdk_sqs::config::Builder::new(),
        aws_sdk_dynamodb::config::Builder::new(),
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string().starts_with("EventBridge job types (Registry::eventbridge_type / TRIAGE_EVENTBRIDGE_TYPES): `Order Placed` maps to \" \": job type must be"),
        "{e}"
    );
}

/// A `Number` `job-id` attribute routes the job whether SNS delivers it raw (an SQS message
/// attribute) or inside its notification: both run, neither is dead-lettered.
#[tokio::test(flavor = "multi_thread")]
async fn a_number_job_id_attribute_routes_the_job_raw_or_inside_an_sns_notification() {
    use aws_sdk_sqs::types::MessageAttributeValue;
    use std::time::Duration;
    use support::pipeline::{Harness, RECORDED, fast_policy, quiet_breaker};
    let h = Harness::new("fanout-number", false, fast_policy(3), quiet_breaker()).await;
    let attr = |t: &str, v: &str| {
        MessageAttributeValue::builder()
            .data_type(t)
            .string_value(v)
            .build()
            .unwrap()
    };
    h.sqs
        .send_message()
        .queue_url(&h.queue_url)
        .message_body(r#"{"outcome":"ok"}"#)
        .message_attributes("job-type", attr("String", RECORDED))
        .message_attributes("job-id", attr("Number", "42"))
        .send()
        .await
        .unwrap();
    let attributes = json!({
        "job-type": {"Type": "String", "Value": RECORDED},
        "job-id": {"Type": "Number", "Value": "43"},
    });
    h.send_raw(&[(&sns(SNS_ID, r#"{"outcome":"ok"}"#, Some(attributes)), None)])
        .await;
    let mut seen = 0;
    while seen < 2 {
        let (messages, response) = h
            .invoke_once(Duration::from_secs(2))
            .await
            .expect("both messages arrive");
        assert!(response.batch_item_failures.is_empty(), "{response:?}");
        seen += messages.len();
    }
    assert_eq!(h.executions("42"), [1], "the raw message");
    assert_eq!(h.executions("43"), [1], "the SNS notification");
    let dlq = h.dlq_messages().await;
    assert!(
        dlq.is_empty(),
        "dead-lettered: {:?}",
        dlq.iter().map(|m| m.message_attributes()).collect::<Vec<_>>()
    );
}
