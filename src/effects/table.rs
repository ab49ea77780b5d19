//! The one DynamoDB table that holds shared state, and its item layout.
//!
//! String partition key `pk`, string sort key `sk`, on-demand billing, TTL on `expires_at`
//! (epoch seconds). Items (see `docs/state.md` for every attribute and condition):
//!
//! | item | `pk` | `sk` |
//! | --- | --- | --- |
//! | attempt ledger | `job#<job_id>` | `ledger` |
//! | breaker | `breaker#<job_type>` | `state` |

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TableStatus, TimeToLiveSpecification, TimeToLiveStatus,
};

use super::storage_retry::{FailureKind, StorageError, StorageRetry};

/// Partition key attribute.
pub const PK: &str = "pk";
/// Sort key attribute.
pub const SK: &str = "sk";
/// TTL attribute (epoch seconds) on every item.
pub const TTL_ATTRIBUTE: &str = "expires_at";
/// Sort key of a ledger item.
pub const LEDGER_SK: &str = "ledger";
/// Sort key of a breaker item.
pub const BREAKER_SK: &str = "state";

/// Partition key of a job's attempt ledger.
pub fn ledger_pk(job_id: &str) -> String {
    format!("job#{job_id}")
}

/// Partition key of a job type's breaker.
pub fn breaker_pk(job_type: &str) -> String {
    format!("breaker#{job_type}")
}

/// The key of a ledger item.
pub fn ledger_key(job_id: &str) -> HashMap<String, AttributeValue> {
    key(ledger_pk(job_id), LEDGER_SK)
}

/// The key of a breaker item.
pub fn breaker_key(job_type: &str) -> HashMap<String, AttributeValue> {
    key(breaker_pk(job_type), BREAKER_SK)
}

fn key(pk: String, sk: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PK.to_owned(), AttributeValue::S(pk)),
        (SK.to_owned(), AttributeValue::S(sk.to_owned())),
    ])
}

/// Reads one item with a consistent read, through `retry`, every try ending by `deadline`.
pub async fn get_consistent(
    client: &Client,
    retry: &StorageRetry,
    table: &str,
    key: HashMap<String, AttributeValue>,
    deadline: Option<tokio::time::Instant>,
) -> Result<Option<HashMap<String, AttributeValue>>, StorageError> {
    let out = retry
        .call("GetItem", deadline, || {
            client
                .get_item()
                .table_name(table)
                .set_key(Some(key.clone()))
                .consistent_read(true)
                .send()
        })
        .await
        .map_err(|e| e.with_resource(table))?;
    Ok(out.item)
}

/// Creates the table if it does not exist, waits until it is ACTIVE and enables TTL on
/// `expires_at`. Idempotent: running it on an existing table only checks and fixes TTL.
pub async fn create_table(client: &Client, name: &str) -> Result<(), StorageError> {
    create_table_with(client, &StorageRetry::default(), name, Duration::from_secs(120)).await
}

/// [`create_table`] with a given retry policy and the longest wait for ACTIVE.
pub async fn create_table_with(
    client: &Client,
    retry: &StorageRetry,
    name: &str,
    wait: Duration,
) -> Result<(), StorageError> {
    let attr = |n: &str| {
        AttributeDefinition::builder()
            .attribute_name(n)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .expect("name and type are set")
    };
    let schema = |n: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(n)
            .key_type(t)
            .build()
            .expect("name and type are set")
    };
    let created = retry
        .call("CreateTable", None, || {
            client
                .create_table()
                .table_name(name)
                .attribute_definitions(attr(PK))
                .attribute_definitions(attr(SK))
                .key_schema(schema(PK, KeyType::Hash))
                .key_schema(schema(SK, KeyType::Range))
                .billing_mode(BillingMode::PayPerRequest)
                .send()
        })
        .await;
    match created {
        Ok(_) => tracing::info!(table = name, "table created"),
        // Already there (or being created by a concurrent setup): fine, wait for it.
        Err(e) if e.code() == Some("ResourceInUseException") => {}
        Err(e) => return Err(e.with_resource(name)),
    }

    let started = tokio::time::Instant::now();
    loop {
        let d = retry
            .call("DescribeTable", None, || {
                client.describe_table().table_name(name).send()
            })
            .await
            .map_err(|e| e.with_resource(name))?;
        if d.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            break;
        }
        if started.elapsed() > wait {
            return Err(StorageError::new(
                "DescribeTable",
                None,
                format!("table did not become ACTIVE within {wait:?}"),
                FailureKind::Transient,
            )
            .with_resource(name));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let ttl = retry
        .call("DescribeTimeToLive", None, || {
            client.describe_time_to_live().table_name(name).send()
        })
        .await
        .map_err(|e| e.with_resource(name))?;
    let status = ttl
        .time_to_live_description()
        .and_then(|t| t.time_to_live_status());
    if !matches!(
        status,
        Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
    ) {
        let spec = TimeToLiveSpecification::builder()
            .attribute_name(TTL_ATTRIBUTE)
            .enabled(true)
            .build()
            .expect("name and flag are set");
        retry
            .call("UpdateTimeToLive", None, || {
                client
                    .update_time_to_live()
                    .table_name(name)
                    .time_to_live_specification(spec.clone())
                    .send()
            })
            .await
            .map_err(|e| e.with_resource(name))?;
    }
    Ok(())
}

/// Deletes the table (tests and teardown). A missing table is fine.
pub async fn delete_table(client: &Client, name: &str) -> Result<(), StorageError> {
    match StorageRetry::default()
        .call("DeleteTable", None, || {
            client.delete_table().table_name(name).send()
        })
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.with_resource(name)),
    }
}
