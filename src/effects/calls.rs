//! Counts the AWS requests a client sends, per operation, retries included, and what they are
//! billed: DynamoDB's consumed read and write units and SQS's billed requests. The demo and the
//! benchmarks report cost per message with it; it changes nothing on the wire.
//!
//! Units come from each answer's `ConsumedCapacity` (every DynamoDB call asks for `TOTAL`).
//! An answer that carries none (a refused conditional write; any PartiQL batch on DynamoDB
//! Local) is costed from its request by DynamoDB's published rules, and counted apart as
//! computed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::operation::batch_execute_statement::BatchExecuteStatementInput;
use aws_sdk_dynamodb::operation::batch_execute_statement::BatchExecuteStatementOutput;
use aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemOutput;
use aws_sdk_dynamodb::operation::batch_write_item::BatchWriteItemOutput;
use aws_sdk_dynamodb::operation::delete_item::{DeleteItemError, DeleteItemInput, DeleteItemOutput};
use aws_sdk_dynamodb::operation::execute_statement::ExecuteStatementOutput;
use aws_sdk_dynamodb::operation::get_item::GetItemOutput;
use aws_sdk_dynamodb::operation::put_item::{PutItemError, PutItemInput, PutItemOutput};
use aws_sdk_dynamodb::operation::query::QueryOutput;
use aws_sdk_dynamodb::operation::update_item::{UpdateItemError, UpdateItemInput, UpdateItemOutput};
use aws_sdk_dynamodb::types::{AttributeValue, ConsumedCapacity};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeSerializationInterceptorContextRef,
    BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

/// SQS bills each 64 KiB of a request's payload as one request.
pub const SQS_CHUNK: usize = 64 * 1024;
/// One write unit per KB of item, one strongly consistent read unit per 4 KB.
const WRITE_UNIT: usize = 1024;

/// Capacity units one operation consumed, in all its answers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Units {
    /// Read units.
    pub read: f64,
    /// Write units.
    pub write: f64,
    /// The part of `read + write` computed from requests whose answer carried no units.
    pub computed: f64,
}

impl Units {
    fn add(&mut self, o: Units) {
        self.read += o.read;
        self.write += o.write;
        self.computed += o.computed;
    }
}

#[derive(Debug, Default)]
struct Counts {
    calls: BTreeMap<String, u64>,
    units: BTreeMap<String, Units>,
    sqs_billed: BTreeMap<String, u64>,
}

/// An SDK interceptor counting requests and their cost per `Service.Operation`. Clones share
/// the counts.
#[derive(Debug, Clone, Default)]
pub struct CallCounter {
    counts: Arc<Mutex<Counts>>,
}

impl CallCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests sent so far, by `Service.Operation`.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts.lock().map(|m| m.calls.clone()).unwrap_or_default()
    }

    /// DynamoDB capacity units consumed so far, by `DynamoDB.Operation`.
    pub fn units(&self) -> BTreeMap<String, Units> {
        self.counts.lock().map(|m| m.units.clone()).unwrap_or_default()
    }

    /// All DynamoDB capacity units consumed so far.
    pub fn units_total(&self) -> Units {
        let mut t = Units::default();
        for u in self.units().values() {
            t.add(*u);
        }
        t
    }

    /// SQS requests as billed (one per started 64 KiB of each request), by `SQS.Operation`.
    pub fn sqs_billed(&self) -> BTreeMap<String, u64> {
        self.counts.lock().map(|m| m.sqs_billed.clone()).unwrap_or_default()
    }

    /// All requests sent so far.
    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }

    /// Back to zero.
    pub fn reset(&self) {
        if let Ok(mut m) = self.counts.lock() {
            *m = Counts::default();
        }
    }
}

fn op_name(cfg: &ConfigBag) -> (String, bool, bool) {
    cfg.load::<Metadata>().map_or_else(
        || ("unknown".to_owned(), false, false),
        |m| {
            (
                format!("{}.{}", m.service(), m.name()),
                m.service() == "DynamoDB",
                m.service() == "SQS",
            )
        },
    )
}

/// What a DynamoDB request would consume by the published rules: used when its answer says
/// nothing (a refused conditional write, a PartiQL batch on DynamoDB Local).
#[derive(Debug, Clone, Copy)]
struct Estimate(Units);

impl Storable for Estimate {
    type Storer = StoreReplace<Self>;
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_serialization(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(units) = estimate(context.input()) {
            cfg.interceptor_state().store_put(Estimate(units));
        }
        Ok(())
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let (name, _, sqs) = op_name(cfg);
        let billed = context
            .request()
            .body()
            .bytes()
            .map_or(1, |b| b.len().div_ceil(SQS_CHUNK).max(1) as u64);
        if let Ok(mut m) = self.counts.lock() {
            if sqs {
                *m.sqs_billed.entry(name.clone()).or_default() += billed;
            }
            *m.calls.entry(name).or_default() += 1;
        }
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let (name, ddb, _) = op_name(cfg);
        if !ddb {
            return Ok(());
        }
        let estimated = cfg.load::<Estimate>().map(|e| e.0);
        let units = match context.output_or_error() {
            Ok(out) => answered(out, &name).or_else(|| {
                estimated.map(|u| Units {
                    computed: u.read + u.write,
                    ..u
                })
            }),
            // A refused conditional write still consumes; a throttled request does not.
            Err(e) if e.as_operation_error().is_some_and(condition_failed) => estimated.map(|u| Units {
                computed: u.read + u.write,
                ..u
            }),
            Err(_) => None,
        };
        if let (Some(u), Ok(mut m)) = (units, self.counts.lock()) {
            m.units.entry(name).or_default().add(u);
        }
        Ok(())
    }
}

fn condition_failed(e: &aws_smithy_runtime_api::client::interceptors::context::Error) -> bool {
    e.downcast_ref::<PutItemError>()
        .is_some_and(PutItemError::is_conditional_check_failed_exception)
        || e.downcast_ref::<UpdateItemError>()
            .is_some_and(UpdateItemError::is_conditional_check_failed_exception)
        || e.downcast_ref::<DeleteItemError>()
            .is_some_and(DeleteItemError::is_conditional_check_failed_exception)
}

/// The units an answer reports, if it reports any.
fn answered(out: &aws_smithy_runtime_api::client::interceptors::context::Output, name: &str) -> Option<Units> {
    let one = |c: Option<&ConsumedCapacity>| c.map(std::slice::from_ref).unwrap_or_default().to_vec();
    let reported: Vec<ConsumedCapacity> = if let Some(o) = out.downcast_ref::<GetItemOutput>() {
        one(o.consumed_capacity())
    } else if let Some(o) = out.downcast_ref::<PutItemOutput>() {
        one(o.consumed_capacity())
    } else if let Some(o) = out.downcast_ref::<UpdateItemOutput>() {
        one(o.consumed_capacity())
    } else if let Some(o) = out.downcast_ref::<DeleteItemOutput>() {
        one(o.consumed_capacity())
    } else if let Some(o) = out.downcast_ref::<QueryOutput>() {
        one(o.consumed_capacity())
    } else if let Some(o) = out.downcast_ref::<ExecuteStatementOutput>() {
        one(o.consumed_capacity())
    } else if let Some(o) = out.downcast_ref::<BatchGetItemOutput>() {
        o.consumed_capacity().to_vec()
    } else if let Some(o) = out.downcast_ref::<BatchWriteItemOutput>() {
        o.consumed_capacity().to_vec()
    } else if let Some(o) = out.downcast_ref::<BatchExecuteStatementOutput>() {
        o.consumed_capacity().to_vec()
    } else {
        Vec::new()
    };
    if reported.is_empty() {
        return None;
    }
    // DynamoDB Local reports only the total; the operation says which kind it is.
    let reads = matches!(
        name.rsplit('.').next(),
        Some("GetItem" | "BatchGetItem" | "Query" | "Scan" | "ExecuteStatement")
    );
    let mut u = Units::default();
    for c in &reported {
        match (c.read_capacity_units(), c.write_capacity_units()) {
            (None, None) if reads => u.read += c.capacity_units().unwrap_or(0.0),
            (None, None) => u.write += c.capacity_units().unwrap_or(0.0),
            (r, w) => {
                u.read += r.unwrap_or(0.0);
                u.write += w.unwrap_or(0.0);
            }
        }
    }
    Some(u)
}

/// Write units by the published rule: one per started KB, at least one.
fn write_units(bytes: usize) -> f64 {
    bytes.div_ceil(WRITE_UNIT).max(1) as f64
}

/// The units a write request consumes by DynamoDB's rules, from what it carries. An update's
/// units follow the larger of the item before and after, which the request does not show: the
/// figure counts the attributes it names, exact while the stored item stays under 1 KB.
fn estimate(input: &aws_smithy_runtime_api::client::interceptors::context::Input) -> Option<Units> {
    let write = |w: f64| Units { write: w, ..Units::default() };
    if let Some(i) = input.downcast_ref::<BatchExecuteStatementInput>() {
        let mut u = Units::default();
        for s in i.statements() {
            let bytes = s.statement().len() + s.parameters().iter().map(value_size).sum::<usize>();
            if s.statement().trim_start().to_ascii_uppercase().starts_with("SELECT") {
                u.read += bytes.div_ceil(4 * WRITE_UNIT).max(1) as f64;
            } else {
                u.write += write_units(bytes);
            }
        }
        return Some(u);
    }
    if let Some(i) = input.downcast_ref::<PutItemInput>() {
        return Some(write(write_units(i.item().map_or(0, item_size))));
    }
    if let Some(i) = input.downcast_ref::<UpdateItemInput>() {
        let bytes = i.key().map_or(0, item_size)
            + i.update_expression().map_or(0, str::len)
            + i.expression_attribute_values()
                .map_or(0, |v| v.values().map(value_size).sum());
        return Some(write(write_units(bytes)));
    }
    if let Some(i) = input.downcast_ref::<DeleteItemInput>() {
        return Some(write(write_units(i.key().map_or(0, item_size))));
    }
    None
}

fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

/// An attribute value's size by DynamoDB's item-size rules.
fn value_size(v: &AttributeValue) -> usize {
    let number = |n: &str| (n.chars().filter(char::is_ascii_digit).count().div_ceil(2) + 1).min(21);
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => number(n),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
        AttributeValue::Ns(v) => v.iter().map(|n| number(n)).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(v) => 3 + v.iter().map(|x| 1 + value_size(x)).sum::<usize>(),
        AttributeValue::M(m) => 3 + m.iter().map(|(k, x)| 1 + k.len() + value_size(x)).sum::<usize>(),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_sizes_follow_the_published_rules() {
        let item = HashMap::from([
            ("pk".to_owned(), AttributeValue::S("job".into())),
            ("n".to_owned(), AttributeValue::N("12345".into())),
            ("ok".to_owned(), AttributeValue::Bool(true)),
        ]);
        // "pk" + "job" = 5, "n" + 5 digits → 1 + 4 = 5, "ok" + 1 = 3.
        assert_eq!(item_size(&item), 13);
        assert_eq!(write_units(0), 1.0);
        assert_eq!(write_units(1024), 1.0);
        assert_eq!(write_units(1025), 2.0);
    }
}
