//! The one DynamoDB table of shared state: its keys, its creation and its check.
//!
//! `pk`/`sk` strings, on-demand, TTL on `expires_at`. A ledger item is keyed by job id and job
//! type (`job#<id>`, `ledger#<type>`), a breaker by `breaker#<type>`. A key part too long for
//! DynamoDB's byte limits is replaced by its SHA-256, under a prefix no verbatim key can take;
//! the full values stay in the item. Every attribute and condition: `docs/state.md`.

use std::collections::HashMap;
#[cfg(feature = "internals")]
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
// Creating the table is the operator tool's (`triage setup`) and the tests'.
#[cfg(feature = "internals")]
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};
use sha2::{Digest, Sha256};

use super::storage_retry::{StorageError, StorageRetry};

/// Partition key attribute.
pub const PK: &str = "pk";
/// Sort key attribute.
pub const SK: &str = "sk";
/// TTL attribute (epoch seconds) on every item.
pub const TTL_ATTRIBUTE: &str = "expires_at";
/// Sort key of a breaker item.
pub const BREAKER_SK: &str = "state";
/// DynamoDB's longest partition key value, in bytes.
pub const PK_MAX_BYTES: usize = 2048;
/// DynamoDB's longest sort key value, in bytes.
pub const SK_MAX_BYTES: usize = 1024;
/// Partition key prefix of a ledger whose job id is kept verbatim.
pub const LEDGER_PK_PREFIX: &str = "job#";
/// Partition key prefix of a ledger whose job id is too long and is kept as a digest.
pub(crate) const LEDGER_PK_DIGEST_PREFIX: &str = "job-sha256#";
/// Sort key prefix of a ledger whose job type is kept verbatim.
pub const LEDGER_SK_PREFIX: &str = "ledger#";
/// Sort key prefix of a ledger whose job type is too long and is kept as a digest.
pub(crate) const LEDGER_SK_DIGEST_PREFIX: &str = "ledger-sha256#";

/// Partition key of a job id's attempt ledgers (one per job type, told apart by the sort
/// key): `job#<job_id>`, or `job-sha256#<hex digest>` when that would exceed
/// [`PK_MAX_BYTES`].
pub(crate) fn ledger_pk(job_id: &str) -> String {
    fitted(LEDGER_PK_PREFIX, LEDGER_PK_DIGEST_PREFIX, job_id, PK_MAX_BYTES)
}

/// Sort key of a job type's attempt ledger: `ledger#<job_type>`, or
/// `ledger-sha256#<hex digest>` when that would exceed [`SK_MAX_BYTES`].
pub(crate) fn ledger_sk(job_type: &str) -> String {
    fitted(LEDGER_SK_PREFIX, LEDGER_SK_DIGEST_PREFIX, job_type, SK_MAX_BYTES)
}

/// `prefix` + `value` when that fits in `max` bytes, else `digest_prefix` + the hex SHA-256
/// of `value`. The two prefixes differ before either ends, so a verbatim key never equals a
/// digest key.
fn fitted(prefix: &str, digest_prefix: &str, value: &str, max: usize) -> String {
    if prefix.len() + value.len() <= max {
        return format!("{prefix}{value}");
    }
    let digest = Sha256::digest(value.as_bytes());
    let mut out = String::with_capacity(digest_prefix.len() + 64);
    out.push_str(digest_prefix);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Partition key of a job type's breaker.
pub(crate) fn breaker_pk(job_type: &str) -> String {
    format!("breaker#{job_type}")
}

/// The key of the attempt ledger of job `job_id` of type `job_type`.
pub fn ledger_key(job_type: &str, job_id: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PK.to_owned(), AttributeValue::S(ledger_pk(job_id))),
        (SK.to_owned(), AttributeValue::S(ledger_sk(job_type))),
    ])
}

/// The key of a breaker item.
pub(crate) fn breaker_key(job_type: &str) -> HashMap<String, AttributeValue> {
    key(breaker_pk(job_type), BREAKER_SK)
}

fn key(pk: String, sk: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PK.to_owned(), AttributeValue::S(pk)),
        (SK.to_owned(), AttributeValue::S(sk.to_owned())),
    ])
}

/// Reads one item with a consistent read, through `retry`, every try ending by `deadline`.
pub(crate) async fn get_consistent(
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
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
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
/// `expires_at`. Idempotent: an existing table is verified (key schema, TTL attribute) and
/// its TTL enabled if it is off; TTL enabled meanwhile by a concurrent caller is success.
#[cfg(feature = "internals")]
pub async fn create_table(client: &Client, name: &str) -> Result<(), TableError> {
    create_table_with(client, &StorageRetry::default(), name, Duration::from_secs(120)).await
}

/// Why [`create_table`] could not leave a usable table.
#[cfg(feature = "internals")]
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// A DynamoDB call failed after the storage retries.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The table exists in a shape the product cannot use: another key schema, or TTL on
    /// another attribute. Nothing was changed.
    #[error("{0}")]
    Misconfigured(String),
    /// DynamoDB is not done with the table yet (not ACTIVE in time, TTL being disabled).
    #[error("{0}")]
    NotReady(String),
}

/// [`create_table`] with a given retry policy and the longest wait for ACTIVE.
#[cfg(feature = "internals")]
pub async fn create_table_with(
    client: &Client,
    retry: &StorageRetry,
    name: &str,
    wait: Duration,
) -> Result<(), TableError> {
    request_table(client, retry, name).await?;
    let description = active_table(client, retry, name, wait).await?;
    check_key_schema(&description, name)?;
    enable_ttl(client, retry, name).await
}

/// Asks for the table; one already there (or being created by a concurrent caller) is fine,
/// and verified after.
#[cfg(feature = "internals")]
async fn request_table(client: &Client, retry: &StorageRetry, name: &str) -> Result<(), TableError> {
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
        // Already there (or being created by a concurrent caller): verified below.
        Err(e) if e.code() == Some("ResourceInUseException") => {}
        Err(e) => return Err(e.with_resource(name).into()),
    }
    Ok(())
}

/// The table's description once it is ACTIVE, waiting `wait` at most.
#[cfg(feature = "internals")]
async fn active_table(
    client: &Client,
    retry: &StorageRetry,
    name: &str,
    wait: Duration,
) -> Result<aws_sdk_dynamodb::types::TableDescription, TableError> {
    let started = tokio::time::Instant::now();
    loop {
        let d = retry
            .call("DescribeTable", None, || {
                client.describe_table().table_name(name).send()
            })
            .await
            .map_err(|e| e.with_resource(name))?;
        if let Some(t) = d.table.filter(|t| t.table_status() == Some(&TableStatus::Active)) {
            return Ok(t);
        }
        if started.elapsed() > wait {
            return Err(TableError::NotReady(format!(
                "table {name} did not become ACTIVE within {} s",
                wait.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The table must have the product's keys: a string partition key `pk` and sort key `sk`.
#[cfg(feature = "internals")]
fn check_key_schema(description: &aws_sdk_dynamodb::types::TableDescription, name: &str) -> Result<(), TableError> {
    let keys: Vec<(String, String)> = description
        .key_schema()
        .iter()
        .map(|k| (k.attribute_name().to_owned(), k.key_type().as_str().to_owned()))
        .collect();
    let type_of = |n: &str| {
        description
            .attribute_definitions()
            .iter()
            .find(|a| a.attribute_name() == n)
            .map(|a| a.attribute_type().as_str().to_owned())
    };
    let expected = [
        (PK.to_owned(), "HASH".to_owned()),
        (SK.to_owned(), "RANGE".to_owned()),
    ];
    let typed = type_of(PK).as_deref() == Some("S") && type_of(SK).as_deref() == Some("S");
    if keys != expected || !typed {
        let found: Vec<String> = keys
            .iter()
            .map(|(n, t)| format!("{n} {t} {}", type_of(n).unwrap_or_default()))
            .collect();
        return Err(TableError::Misconfigured(format!(
            "table {name} exists with another key schema ({}): the state table needs a string `{PK}` \
             partition key and a string `{SK}` sort key",
            found.join(", ")
        )));
    }
    Ok(())
}

/// Enables TTL on the product's attribute, unless it is (being) enabled already; TTL on
/// another attribute, or being disabled, is an error.
#[cfg(feature = "internals")]
async fn enable_ttl(client: &Client, retry: &StorageRetry, name: &str) -> Result<(), TableError> {
    let ttl = || async {
        retry
            .call("DescribeTimeToLive", None, || {
                client.describe_time_to_live().table_name(name).send()
            })
            .await
            .map_err(|e| e.with_resource(name))
            .map(|o| {
                let d = o.time_to_live_description;
                (
                    d.as_ref().and_then(|d| d.time_to_live_status().cloned()),
                    d.and_then(|d| d.attribute_name),
                )
            })
    };
    let (status, attribute) = ttl().await?;
    if ttl_enabled(name, status, attribute)? {
        return Ok(());
    }
    let spec = TimeToLiveSpecification::builder()
        .attribute_name(TTL_ATTRIBUTE)
        .enabled(true)
        .build()
        .expect("name and flag are set");
    let updated = retry
        .call("UpdateTimeToLive", None, || {
            client
                .update_time_to_live()
                .table_name(name)
                .time_to_live_specification(spec.clone())
                .send()
        })
        .await;
    match updated {
        Ok(_) => Ok(()),
        // A concurrent caller enabled TTL since the describe: read what it is now.
        Err(e) if e.code() == Some("ValidationException") => {
            let (status, attribute) = ttl().await?;
            if ttl_enabled(name, status, attribute)? {
                Ok(())
            } else {
                Err(e.with_resource(name).into())
            }
        }
        Err(e) => Err(e.with_resource(name).into()),
    }
}

/// `Ok(true)`: TTL is (being) enabled on our attribute.
#[cfg(feature = "internals")]
fn ttl_enabled(name: &str, status: Option<TimeToLiveStatus>, attribute: Option<String>) -> Result<bool, TableError> {
    match status {
        Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling) => match attribute.as_deref() {
            Some(TTL_ATTRIBUTE) | None => Ok(true),
            Some(other) => Err(TableError::Misconfigured(format!(
                "table {name} has TTL on `{other}`, not `{TTL_ATTRIBUTE}`: its ledgers and breakers \
                 would never expire (a table has one TTL attribute)"
            ))),
        },
        Some(TimeToLiveStatus::Disabling) => Err(TableError::NotReady(format!(
            "TTL of table {name} is being disabled; DynamoDB allows enabling it again only once \
             that is done (up to an hour)"
        ))),
        _ => Ok(false),
    }
}

/// Deletes the table (tests and teardown). A missing table is fine.
#[cfg(feature = "internals")]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::envelope::{MAX_JOB_ID_LEN, MAX_JOB_TYPE_LEN};

    #[test]
    fn ledger_keys_fit_whatever_the_characters() {
        // Four bytes per character: the most UTF-8 spends.
        let id = "🦀".repeat(MAX_JOB_ID_LEN);
        let ty = "🦀".repeat(MAX_JOB_TYPE_LEN);
        assert!(ledger_pk(&id).len() <= PK_MAX_BYTES);
        assert!(ledger_sk(&ty).len() <= SK_MAX_BYTES);
        assert!(ledger_pk(&id).starts_with(LEDGER_PK_DIGEST_PREFIX));
        assert!(ledger_sk(&ty).starts_with(LEDGER_SK_DIGEST_PREFIX));
        assert_eq!(ledger_pk(&id).len(), LEDGER_PK_DIGEST_PREFIX.len() + 64);
        // Short ones stay readable.
        assert_eq!(ledger_pk("order-42"), "job#order-42");
        assert_eq!(ledger_sk("billing.charge"), "ledger#billing.charge");
    }

    #[test]
    fn verbatim_up_to_the_limit_digest_beyond() {
        let fits = "x".repeat(PK_MAX_BYTES - LEDGER_PK_PREFIX.len());
        assert_eq!(ledger_pk(&fits), format!("job#{fits}"));
        assert_eq!(ledger_pk(&fits).len(), PK_MAX_BYTES);
        let over = format!("{fits}x");
        assert!(ledger_pk(&over).starts_with(LEDGER_PK_DIGEST_PREFIX));
        let fits = "y".repeat(SK_MAX_BYTES - LEDGER_SK_PREFIX.len());
        assert_eq!(ledger_sk(&fits).len(), SK_MAX_BYTES);
        assert!(ledger_sk(&format!("{fits}y")).starts_with(LEDGER_SK_DIGEST_PREFIX));
        // Distinct long values get distinct digests; equal ones the same.
        assert_ne!(ledger_pk(&format!("{over}a")), ledger_pk(&format!("{over}b")));
        assert_eq!(ledger_pk(&over), ledger_pk(&over.clone()));
    }

    #[test]
    fn a_verbatim_key_never_equals_a_digest_key() {
        // An id that looks like a digest stays under the verbatim prefix.
        let long = "z".repeat(3000);
        let digest = ledger_pk(&long);
        let hex = digest.strip_prefix(LEDGER_PK_DIGEST_PREFIX).unwrap();
        assert_ne!(ledger_pk(&format!("sha256#{hex}")), digest);
        assert_ne!(ledger_pk(&digest), digest);
        let sk = ledger_sk(&"t".repeat(2000));
        assert_ne!(ledger_sk(&sk), sk);
        // The breaker's keys live under another prefix.
        assert!(!breaker_pk("x").starts_with(LEDGER_PK_PREFIX));
        assert!(!breaker_pk("x").starts_with(LEDGER_PK_DIGEST_PREFIX));
    }
}
