//! The strict proxy (`support::fault_proxy::strict`) holds SQS calls to real SQS's rules where
//! moto is more lenient: each rule checked with the real SDK, through a strict proxy of the
//! test's own, with what moto then holds read from moto directly.

use crate::support;

use std::time::Duration;

use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry,
};
use support::fault_proxy::FaultProxy;

struct Strict {
    proxy: FaultProxy,
    sqs: aws_sdk_sqs::Client,
    /// moto itself, around the rules.
    moto: aws_sdk_sqs::Client,
}

async fn strict() -> Strict {
    let proxy = FaultProxy::start_strict(&support::moto_sqs_endpoint());
    let sqs = support::sqs_client_via(&proxy.url()).await;
    let moto = support::sqs_client_via(&support::moto_sqs_endpoint()).await;
    Strict { proxy, sqs, moto }
}

async fn queue(sqs: &aws_sdk_sqs::Client, prefix: &str, attrs: &[(QueueAttributeName, &str)]) -> String {
    let fifo = attrs.iter().any(|(k, _)| *k == QueueAttributeName::FifoQueue);
    let name = support::unique_name(prefix);
    let mut req = sqs
        .create_queue()
        .queue_name(if fifo { format!("{name}.fifo") } else { name });
    for (k, v) in attrs {
        req = req.attributes(k.clone(), *v);
    }
    req.send()
        .await
        .expect("create queue")
        .queue_url
        .expect("queue url")
}

async fn send(sqs: &aws_sdk_sqs::Client, url: &str, body: &str) -> String {
    sqs.send_message()
        .queue_url(url)
        .message_body(body)
        .send()
        .await
        .expect("send")
        .message_id
        .expect("message id")
}

async fn receive(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    max: i32,
    visibility: i32,
    wait: i32,
) -> Vec<aws_sdk_sqs::types::Message> {
    sqs.receive_message()
        .queue_url(url)
        .max_number_of_messages(max)
        .visibility_timeout(visibility)
        .wait_time_seconds(wait)
        .send()
        .await
        .expect("receive")
        .messages
        .unwrap_or_default()
}

/// Every message moto still holds, visible or not: read straight from moto once each is
/// visible (`read_all` with a zero visibility would hand the same one out again).
async fn moto_holds(s: &Strict, url: &str) -> u64 {
    let d = support::queue_depth(&s.moto, url).await;
    d.total()
}

#[tokio::test]
async fn an_expired_message_is_not_received_and_is_gone_upstream() {
    let s = strict().await;
    let url = queue(
        &s.sqs,
        "strict-retention",
        &[(QueueAttributeName::MessageRetentionPeriod, "60")],
    )
    .await;
    // moto holds it for SQS's longest retention; the proxy answers with the queue's own.
    let attrs = support::all_attributes(&s.sqs, &url).await;
    assert_eq!(attrs[&QueueAttributeName::MessageRetentionPeriod], "60");
    let held = send(&s.sqs, &url, "held").await;
    let got = receive(&s.sqs, &url, 1, 300, 1).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message_id(), Some(held.as_str()));
    // A caller that did not ask for SentTimestamp does not get it.
    assert!(
        got[0].attributes().is_none_or(|a| a.is_empty()),
        "{:?}",
        got[0].attributes()
    );
    let held_handle = got[0].receipt_handle().unwrap().to_string();
    send(&s.sqs, &url, "waiting").await;
    assert_eq!(moto_holds(&s, &url).await, 2);

    s.proxy.age_messages(&url, Duration::from_secs(61));

    assert!(receive(&s.sqs, &url, 10, 30, 1).await.is_empty());
    assert_eq!(s.proxy.strict_counts().get("expired"), Some(&1));
    // A message held past its retention is gone too: its visibility cannot be changed.
    let e = s
        .sqs
        .change_message_visibility()
        .queue_url(&url)
        .receipt_handle(&held_handle)
        .visibility_timeout(0)
        .send()
        .await
        .expect_err("the held message expired");
    assert_eq!(e.code(), Some("InvalidParameterValue"), "{e:?}");
    // The waiting one was deleted upstream; the held one is still in flight in moto.
    let left = receive(&s.moto, &url, 10, 0, 1).await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(moto_holds(&s, &url).await, 1);
}

#[tokio::test]
async fn a_stale_receipt_handle_deletes_nothing_and_is_answered_as_sqs_answers() {
    let s = strict().await;
    let url = queue(&s.sqs, "strict-handle", &[]).await;
    let id = send(&s.sqs, &url, "twice received").await;
    let first = receive(&s.sqs, &url, 1, 0, 1).await;
    assert_eq!(first.len(), 1);
    let second = receive(&s.sqs, &url, 1, 300, 1).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].message_id(), Some(id.as_str()));
    let (old, latest) = (
        first[0].receipt_handle().unwrap().to_string(),
        second[0].receipt_handle().unwrap().to_string(),
    );
    assert_ne!(old, latest);

    // DeleteMessage: SQS answers success and deletes nothing.
    s.sqs
        .delete_message()
        .queue_url(&url)
        .receipt_handle(&old)
        .send()
        .await
        .expect("a stale delete succeeds");
    let batch = s
        .sqs
        .delete_message_batch()
        .queue_url(&url)
        .entries(
            DeleteMessageBatchRequestEntry::builder()
                .id("old")
                .receipt_handle(&old)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .expect("a stale batch delete succeeds");
    assert_eq!(batch.successful().len(), 1);
    assert!(batch.failed().is_empty());
    assert_eq!(
        moto_holds(&s, &url).await,
        1,
        "a stale handle deleted the message"
    );

    // ChangeMessageVisibility: refused, alone and in a batch.
    let e = s
        .sqs
        .change_message_visibility()
        .queue_url(&url)
        .receipt_handle(&old)
        .visibility_timeout(0)
        .send()
        .await
        .expect_err("a stale visibility change is refused");
    assert_eq!(e.code(), Some("InvalidParameterValue"), "{e:?}");
    assert!(
        e.message()
            .unwrap_or_default()
            .contains("not available for visibility timeout change")
    );
    let b = s
        .sqs
        .change_message_visibility_batch()
        .queue_url(&url)
        .entries(
            aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry::builder()
                .id("old")
                .receipt_handle(&old)
                .visibility_timeout(0)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert!(b.successful().is_empty());
    assert_eq!(b.failed()[0].code(), "InvalidParameterValue");
    // Still hidden: the refused change did not show it.
    assert!(receive(&s.moto, &url, 1, 0, 0).await.is_empty());

    // The latest handle deletes it.
    s.sqs
        .delete_message()
        .queue_url(&url)
        .receipt_handle(&latest)
        .send()
        .await
        .unwrap();
    assert_eq!(moto_holds(&s, &url).await, 0);
    assert_eq!(s.proxy.strict_counts().get("stale_delete"), Some(&2));
}

#[tokio::test]
async fn sends_outside_sqs_characters_or_attribute_limits_are_refused() {
    let s = strict().await;
    let url = queue(
        &s.sqs,
        "strict-send",
        &[(QueueAttributeName::MaximumMessageSize, "1024")],
    )
    .await;
    let e = s
        .sqs
        .send_message()
        .queue_url(&url)
        .message_body("job \u{FFFF}")
        .send()
        .await
        .expect_err("U+FFFF is outside SQS's characters");
    assert_eq!(e.code(), Some("InvalidMessageContents"), "{e:?}");

    let string = |v: &str| {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(v)
            .build()
            .unwrap()
    };
    let entry = |id: &str, body: &str| SendMessageBatchRequestEntry::builder().id(id).message_body(body);
    let mut eleven = entry("eleven", "ok");
    for i in 0..11 {
        eleven = eleven.message_attributes(format!("a{i}"), string("v"));
    }
    let r = s
        .sqs
        .send_message_batch()
        .queue_url(&url)
        .entries(
            entry("fine", "fine")
                .message_attributes("job-type", string("t"))
                .build()
                .unwrap(),
        )
        .entries(
            entry("fffe", "ok")
                .message_attributes("error", string("bad \u{FFFE}"))
                .build()
                .unwrap(),
        )
        .entries(eleven.build().unwrap())
        .entries(
            entry("name", "ok")
                .message_attributes("AWS.reserved", string("v"))
                .build()
                .unwrap(),
        )
        // The body fits alone; with its attribute it is past the queue's MaximumMessageSize.
        .entries(
            entry("size", &"x".repeat(1000))
                .message_attributes("padding", string(&"p".repeat(30)))
                .build()
                .unwrap(),
        )
        // Exactly at the limit, counting a Binary value's decoded bytes (base64 padding not).
        .entries(
            entry("binary", "bb")
                .message_attributes(
                    "bin",
                    MessageAttributeValue::builder()
                        .data_type("Binary")
                        .binary_value(aws_smithy_types::Blob::new(vec![0x80; 1024 - 2 - 3 - 6]))
                        .build()
                        .unwrap(),
                )
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let mut ok: Vec<_> = r.successful().iter().map(|e| e.id()).collect();
    ok.sort();
    assert_eq!(ok, ["binary", "fine"]);
    let mut failed: Vec<_> = r
        .failed()
        .iter()
        .map(|f| (f.id(), f.code(), f.sender_fault()))
        .collect();
    failed.sort();
    assert_eq!(
        failed,
        [
            ("eleven", "InvalidParameterValue", true),
            ("fffe", "InvalidMessageContents", true),
            ("name", "InvalidParameterValue", true),
            ("size", "InvalidParameterValue", true),
        ]
    );
    assert_eq!(moto_holds(&s, &url).await, 2);
}

#[tokio::test]
async fn at_the_in_flight_cap_long_polls_get_nothing_and_short_polls_over_limit() {
    let s = strict().await;
    let url = queue(&s.sqs, "strict-cap", &[]).await;
    s.proxy.set_in_flight_cap(&url, 3);
    for i in 0..5 {
        send(&s.sqs, &url, &format!("m{i}")).await;
    }
    let mut held = Vec::new();
    while held.len() < 3 {
        let got = receive(&s.sqs, &url, 10, 300, 1).await;
        assert!(
            !got.is_empty(),
            "the queue has 5 messages and room for {}",
            3 - held.len()
        );
        held.extend(got);
    }
    assert_eq!(held.len(), 3, "a receive handed out more than the room left");
    let e = s
        .sqs
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(10)
        .send()
        .await
        .expect_err("a short poll at the cap");
    assert_eq!(e.code(), Some("OverLimit"), "{e:?}");
    assert!(receive(&s.sqs, &url, 10, 300, 1).await.is_empty());
    // Deleting one makes room for one.
    s.sqs
        .delete_message()
        .queue_url(&url)
        .receipt_handle(held[0].receipt_handle().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(receive(&s.sqs, &url, 10, 300, 1).await.len(), 1);
    assert_eq!(moto_holds(&s, &url).await, 4);
}

#[tokio::test]
async fn a_fifo_resend_within_five_minutes_of_a_deleted_first_is_dropped_but_answered() {
    let s = strict().await;
    let url = queue(&s.sqs, "strict-dedup", &[(QueueAttributeName::FifoQueue, "true")]).await;
    let send_fifo = |body: &'static str| {
        s.sqs
            .send_message()
            .queue_url(&url)
            .message_body(body)
            .message_group_id("g")
            .message_deduplication_id("job-1")
            .send()
    };
    let first = send_fifo("first").await.unwrap();
    let got = receive(&s.sqs, &url, 1, 300, 1).await;
    assert_eq!(got.len(), 1);
    s.sqs
        .delete_message()
        .queue_url(&url)
        .receipt_handle(got[0].receipt_handle().unwrap())
        .send()
        .await
        .unwrap();

    let again = send_fifo("again").await.expect("a duplicate is accepted");
    assert_eq!(again.message_id(), first.message_id());
    assert_eq!(again.sequence_number(), first.sequence_number());
    let batch = s
        .sqs
        .send_message_batch()
        .queue_url(&url)
        .entries(
            SendMessageBatchRequestEntry::builder()
                .id("dup")
                .message_body("batched")
                .message_group_id("g")
                .message_deduplication_id("job-1")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(batch.successful()[0].message_id(), first.message_id().unwrap());
    assert!(
        receive(&s.moto, &url, 10, 0, 1).await.is_empty(),
        "a duplicate reached moto"
    );
    assert_eq!(s.proxy.strict_counts().get("dedup_dropped"), Some(&2));
}

/// Every other receive asking for more than one message is handed at most half of what it
/// asked for, rounded up; a receive of one message is never cut and does not count as one
/// of them.
#[tokio::test]
async fn every_other_receive_of_more_than_one_is_handed_half_of_what_it_asked() {
    let s = strict().await;
    let url = queue(&s.sqs, "strict-partial", &[]).await;
    let partial = || s.proxy.strict_counts().get("partial_receive").copied();
    let mut sent = Vec::new();
    for b in ["a", "b", "c", "d"] {
        sent.push(send(&s.sqs, &url, b).await);
    }
    // The first receive of more than one: two of the four asked for.
    let first = receive(&s.sqs, &url, 4, 300, 1).await;
    assert_eq!(first.len(), 2, "half of four");
    assert_eq!(partial(), Some(1));
    // The second: whole, the other two.
    let second = receive(&s.sqs, &url, 4, 300, 1).await;
    assert_eq!(second.len(), 2, "the other two");
    assert_eq!(partial(), Some(1));
    let mut got: Vec<&str> = first
        .iter()
        .chain(&second)
        .map(|m| m.message_id().unwrap())
        .collect();
    got.sort_unstable();
    let mut want: Vec<&str> = sent.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(got, want);
    // A receive of one is handed its one and is not counted among them.
    for b in ["e", "f", "g", "h"] {
        send(&s.sqs, &url, b).await;
    }
    assert_eq!(receive(&s.sqs, &url, 1, 300, 1).await.len(), 1);
    assert_eq!(partial(), Some(1));
    // So the next receive of more than one is the third: cut to half of the three asked for.
    assert_eq!(
        receive(&s.sqs, &url, 3, 300, 1).await.len(),
        2,
        "half of three, rounded up"
    );
    assert_eq!(partial(), Some(2));
}
