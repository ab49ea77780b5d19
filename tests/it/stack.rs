//! Proves the local stack is real: SQS (moto) and DynamoDB (DynamoDB Local) answer
//! the Rust SDK. Needs `bash infra/local/stack.sh start` and
//! `eval "$(bash infra/local/stack.sh env)"`.

use crate::support;

use aws_sdk_dynamodb::types::{AttributeValue, KeyType};

#[tokio::test]
async fn sqs_queue_send_and_receive() {
    let sqs = support::sqs_client().await;
    let name = support::unique_name("stack-test");
    let url = sqs
        .create_queue()
        .queue_name(&name)
        .send()
        .await
        .expect("create queue")
        .queue_url
        .expect("queue url");

    let sent = sqs
        .send_message()
        .queue_url(&url)
        .message_body(r#"{"type":"stack.check","payload":{"n":1}}"#)
        .send()
        .await
        .expect("send message");
    let sent_id = sent.message_id.expect("message id");

    let received = sqs
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .send()
        .await
        .expect("receive message");
    let messages = received.messages.unwrap_or_default();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(messages[0].message_id.as_deref(), Some(sent_id.as_str()));
    assert_eq!(
        messages[0].body.as_deref(),
        Some(r#"{"type":"stack.check","payload":{"n":1}}"#)
    );

    sqs.delete_message()
        .queue_url(&url)
        .receipt_handle(messages[0].receipt_handle.clone().expect("receipt handle"))
        .send()
        .await
        .expect("delete message");
    sqs.delete_queue()
        .queue_url(&url)
        .send()
        .await
        .expect("delete queue");
}

#[tokio::test]
async fn dynamodb_table_put_and_get() {
    let ddb = support::ddb_client().await;
    let table = support::unique_name("stack-test");
    support::hand_table(&ddb, &table, &[("pk", KeyType::Hash)]).await;

    ddb.put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("job-1".into()))
        .item("attempts", AttributeValue::N("2".into()))
        .send()
        .await
        .expect("put item");

    let got = ddb
        .get_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("job-1".into()))
        .consistent_read(true)
        .send()
        .await
        .expect("get item");
    let item = got.item.expect("item present");
    assert_eq!(item.get("attempts"), Some(&AttributeValue::N("2".into())));

    ddb.delete_table()
        .table_name(&table)
        .send()
        .await
        .expect("delete table");
}
