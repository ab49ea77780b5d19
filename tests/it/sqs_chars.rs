//! SQS's characters: real SQS refuses a message whose body or string attribute holds a
//! character outside `#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF`
//! (`InvalidMessageContents`); moto takes anything. These tests read back every message the
//! product wrote and check SQS's rule themselves: the failure record of a DLQ copy, a job
//! `triage send` built, and a body `dlq edit --patch` wrote.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageAttributeValue};
use serde_json::json;
use sqs_triage::core::JobError;
use sqs_triage::core::failure::{FailureClass, FailureRecord};
use sqs_triage::effects::dlq::{dlq_copy, failure_record};
use sqs_triage::processor::registry::JobContext;
use support::pipeline::{Harness, Options};
use triage::ops::Ctx;

/// A character SQS takes in a message.
fn sqs_takes(c: char) -> bool {
    matches!(c as u32, 0x9 | 0xA | 0xD | 0x20..=0xD7FF | 0xE000..=0xFFFD | 0x10000..=0x10FFFF)
}

/// Every character of a message's body and string attributes that real SQS would refuse,
/// named by where it is.
fn refused(m: &Message) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |what: &str, s: &str| {
        for c in s.chars().filter(|c| !sqs_takes(*c)) {
            out.push(format!("{what}: U+{:04X}", c as u32));
        }
    };
    check("body", m.body().unwrap_or_default());
    for (name, v) in m.message_attributes().into_iter().flatten() {
        check(&format!("attribute {name}"), v.string_value().unwrap_or_default());
    }
    out
}

/// A job type whose handler fails fatally with an error holding U+FFFE and U+FFFF.
const BAD_CHARS: &str = "test.bad-chars";
const ERROR: &str = "upstream said \u{fffe}nope\u{ffff} and \u{7f}";

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_lettered_copy_holds_only_characters_sqs_takes() {
    let h = Harness::build(Options {
        prefix: "chars-dlq",
        register: Box::new(|r, _| {
            r.handle(BAD_CHARS, |_: serde_json::Value, _: JobContext| async {
                Err::<(), _>(JobError::fatal(ERROR))
            })
        }),
        ..Options::default()
    })
    .await;
    // The producer wrote the id's U+FFFF as an escape: the body itself is one SQS takes.
    let body = r#"{"type":"test.bad-chars","id":"job-\uffff","payload":null}"#;
    assert!(body.chars().all(sqs_takes));
    let string = |v: &str| {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(v)
            .build()
            .unwrap()
    };
    // Two copies: with a few attributes, and with ten (packed into one attribute).
    for n in [1, 10] {
        let mut req = h.sqs.send_message().queue_url(&h.queue_url).message_body(body);
        for i in 0..n {
            req = req.message_attributes(format!("a{i}"), string(&format!("v{i}")));
        }
        req.send().await.unwrap();
    }
    let mut seen = 0;
    while seen < 2 {
        let (messages, _) = h.invoke_once(Duration::from_secs(2)).await.expect("both arrive");
        seen += messages.len();
    }
    let copies = h.dlq_messages().await;
    assert_eq!(copies.len(), 2, "{copies:?}");
    for m in &copies {
        assert_eq!(refused(m), Vec::<String>::new(), "SQS refuses this copy: {m:?}");
        assert_eq!(m.body(), Some(body), "the body byte for byte");
        let attrs = m.message_attributes.clone().unwrap_or_default();
        let record = failure_record(&attrs)
            .expect("a failure record")
            .expect("readable");
        assert_eq!(record.class, FailureClass::Fatal);
        assert_eq!(record.job_id, "job-\u{ffff}");
        assert_eq!(record.error, ERROR);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_triage_send_builds_holds_only_characters_sqs_takes() {
    let created = support::fresh_resources("chars-send", false).await;
    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    // Escaped in the input, as JSON writes them; the payload's raw U+FFFF is valid JSON too.
    let line = "{\"type\":\"t.\\ufffe\",\"id\":\"s-\\uffff\",\"payload\":{\"k\":\"raw \u{ffff}\"}}\n";
    let jobs = triage::ops::send::parse_jobs(line, false).unwrap();
    let r = triage::ops::send::send_jobs(&ctx, &created.queue_url, &jobs, false)
        .await
        .unwrap();
    assert_eq!(r.accepted, 1, "{r:?}");
    let sqs = support::sqs_client().await;
    let got = support::drain(&sqs, &created.queue_url, 1).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        refused(&got[0]),
        Vec::<String>::new(),
        "SQS refuses {:?}",
        got[0].body()
    );
    let v: serde_json::Value = serde_json::from_str(got[0].body().unwrap()).unwrap();
    assert_eq!(
        v,
        json!({"type": "t.\u{fffe}", "id": "s-\u{ffff}", "payload": {"k": "raw \u{ffff}"}})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_dlq_edit_patches_holds_only_characters_sqs_takes() {
    let created = support::fresh_resources("chars-edit", false).await;
    let ctx = Ctx::from_config(&support::sdk_config().await).unwrap();
    let sqs = support::sqs_client().await;
    let body = r#"{"type":"t","id":"e-\uffff","payload":{"n":1}}"#;
    let record = FailureRecord {
        class: FailureClass::Fatal,
        error: "boom".into(),
        attempts: 1,
        job_type: Some("t".into()),
        job_id: "e-\u{ffff}".into(),
        source_queue: created.queue_url.clone(),
        original_message_id: "orig-e".into(),
        first_received_at: 1,
        failed_at: sqs_triage::clock::now_ms(),
    };
    let copy = dlq_copy(body, &HashMap::new(), &record, 1 << 20).unwrap();
    let dlq_id = sqs
        .send_message()
        .queue_url(&created.dlq_url)
        .message_body(copy.body)
        .set_message_attributes(Some(copy.attributes))
        .send()
        .await
        .unwrap()
        .message_id
        .unwrap();
    let patch = r#"[{"op":"replace","path":"/payload/n","value":"two \ufffe"}]"#;
    let opts = triage::ops::dlq::EditOptions {
        table: Some(created.table.clone()),
        ..triage::ops::dlq::EditOptions::new(dlq_id, triage::ops::dlq::EditSource::Patch(patch.into()))
    };
    triage::ops::dlq::edit(&ctx, &created.dlq_url, &opts)
        .await
        .unwrap();
    let got = support::drain(&sqs, &created.queue_url, 1).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        refused(&got[0]),
        Vec::<String>::new(),
        "SQS refuses {:?}",
        got[0].body()
    );
    let v: serde_json::Value = serde_json::from_str(got[0].body().unwrap()).unwrap();
    assert_eq!(
        v,
        json!({"type": "t", "id": "e-\u{ffff}", "payload": {"n": "two \u{fffe}"}})
    );
}
