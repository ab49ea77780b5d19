//! Per-invocation metrics, written as CloudWatch Embedded Metric Format (EMF) lines.
//!
//! One line per job type per invocation (not per message), plus one line without dimensions
//! for account-wide alarms. Dimension values come only from registered job types; anything
//! else is reported as `unregistered`, so a producer cannot blow up metric cardinality.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::core::Decision;

/// CloudWatch namespace of every metric.
pub(crate) const NAMESPACE: &str = "SqsTriage";
/// Dimension value for records whose job type is not registered (or not readable).
pub(crate) const UNREGISTERED: &str = "unregistered";

/// Counters and samples of one job type in one invocation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypeMetrics {
    /// Count per metric name (`Succeeded`, `Retried`, `DeadLetteredFatal`, ...).
    pub counts: BTreeMap<&'static str, u64>,
    /// Retry delays applied, in ms.
    pub retry_delay_ms: Vec<u64>,
    /// Handler durations, in ms.
    pub handler_ms: Vec<u64>,
}

/// Metrics of one invocation (or one worker batch).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Per job type (dimension value).
    pub by_type: BTreeMap<String, TypeMetrics>,
    /// Retries of the adapter's own SQS and DynamoDB calls during the batch (never job
    /// attempts); reported without dimensions as `StorageRetries`.
    pub storage_retries: u64,
    /// Storage calls that failed for good, retried or not (`StorageFailures`).
    pub storage_failures: u64,
}

impl Metrics {
    fn entry(&mut self, job_type: &str) -> &mut TypeMetrics {
        self.by_type.entry(job_type.to_owned()).or_default()
    }

    /// Adds `n` to a counter.
    pub fn add(&mut self, job_type: &str, name: &'static str, n: u64) {
        if n > 0 {
            *self.entry(job_type).counts.entry(name).or_default() += n;
        }
    }

    /// Records a final decision of a record.
    pub fn decision(&mut self, job_type: &str, d: &Decision) {
        let name = match d {
            Decision::Done { .. } => "Succeeded",
            Decision::Duplicate { .. } => "Duplicate",
            Decision::Retry { delay, .. } => {
                self.entry(job_type).retry_delay_ms.push(delay.as_millis() as u64);
                "Retried"
            }
            Decision::Defer { .. } => "Deferred",
            Decision::Release => "Released",
            Decision::DeadLetter { class, .. } => {
                self.add(job_type, "DeadLettered", 1);
                match class {
                    crate::core::FailureClass::Fatal => "DeadLetteredFatal",
                    crate::core::FailureClass::Exhausted => "DeadLetteredExhausted",
                    crate::core::FailureClass::Invalid => "DeadLetteredInvalid",
                    crate::core::FailureClass::Expiring => "DeadLetteredExpiring",
                    crate::core::FailureClass::Parked => "DeadLetteredParked",
                }
            }
        };
        self.add(job_type, name, 1);
    }

    /// Records a handler's run time.
    pub(crate) fn handler_duration(&mut self, job_type: &str, d: Duration) {
        self.entry(job_type).handler_ms.push(d.as_millis() as u64);
    }

    /// A counter summed over every job type.
    pub fn total(&self, name: &str) -> u64 {
        self.by_type.values().filter_map(|t| t.counts.get(name)).sum()
    }

    /// Merges another set of metrics into this one.
    pub(crate) fn merge(&mut self, other: Metrics) {
        for (ty, m) in other.by_type {
            let e = self.entry(&ty);
            for (k, v) in m.counts {
                *e.counts.entry(k).or_default() += v;
            }
            e.retry_delay_ms.extend(m.retry_delay_ms);
            e.handler_ms.extend(m.handler_ms);
        }
        self.storage_retries += other.storage_retries;
        self.storage_failures += other.storage_failures;
    }

    /// The EMF lines for these metrics at `timestamp_ms`.
    pub fn emf_lines(&self, timestamp_ms: u64) -> Vec<String> {
        let mut lines = Vec::new();
        let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (ty, m) in &self.by_type {
            let mut root = Map::new();
            let mut defs = Vec::new();
            for (name, v) in &m.counts {
                defs.push(json!({"Name": name, "Unit": "Count"}));
                root.insert((*name).to_owned(), json!(v));
                *totals.entry(name).or_default() += v;
            }
            for (name, samples) in [
                ("RetryDelay", &m.retry_delay_ms),
                ("HandlerDuration", &m.handler_ms),
            ] {
                if !samples.is_empty() {
                    defs.push(json!({"Name": name, "Unit": "Milliseconds"}));
                    root.insert(name.to_owned(), json!(samples));
                }
            }
            if defs.is_empty() {
                continue;
            }
            root.insert("JobType".into(), Value::String(ty.clone()));
            root.insert("_aws".into(), aws_block(timestamp_ms, vec!["JobType"], defs));
            lines.push(Value::Object(root).to_string());
        }
        // Account-wide totals of what alarms watch, and the adapter's own storage retries,
        // without dimensions.
        let alarmed: Vec<_> = totals
            .into_iter()
            .filter(|(k, _)| ["DeadLettered", "BreakerOpened"].contains(k))
            .chain([
                ("StorageRetries", self.storage_retries),
                ("StorageFailures", self.storage_failures),
            ])
            .filter(|(_, v)| *v > 0)
            .collect();
        if !alarmed.is_empty() {
            let mut root = Map::new();
            let defs = alarmed
                .iter()
                .map(|(k, _)| json!({"Name": k, "Unit": "Count"}))
                .collect();
            for (k, v) in &alarmed {
                root.insert((*k).to_owned(), json!(v));
            }
            root.insert("_aws".into(), aws_block(timestamp_ms, vec![], defs));
            lines.push(Value::Object(root).to_string());
        }
        lines
    }
}

fn aws_block(timestamp_ms: u64, dims: Vec<&str>, defs: Vec<Value>) -> Value {
    json!({
        "Timestamp": timestamp_ms,
        "CloudWatchMetrics": [{"Namespace": NAMESPACE, "Dimensions": [dims], "Metrics": defs}],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::FailureClass;

    #[test]
    fn emf_lines_carry_counts_per_type_and_alarm_totals() {
        let mut m = Metrics::default();
        m.decision("email", &Decision::Done { attempts: 1 });
        m.decision(
            "email",
            &Decision::DeadLetter {
                class: FailureClass::Fatal,
                attempts: 1,
                error: "x".into(),
            },
        );
        m.decision(
            "email",
            &Decision::Retry {
                attempts: 1,
                delay: Duration::from_millis(3_400),
                visibility: Duration::from_secs(4),
                next_attempt_at_ms: 0,
                error: "t".into(),
            },
        );
        m.handler_duration("email", Duration::from_millis(12));
        let lines = m.emf_lines(1_000);
        assert_eq!(lines.len(), 2);
        let v: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(v["JobType"], "email");
        assert_eq!(v["Succeeded"], 1);
        assert_eq!(v["DeadLetteredFatal"], 1);
        assert_eq!(v["RetryDelay"], json!([3_400]));
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Namespace"], NAMESPACE);
        let total: Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(total["DeadLettered"], 1);
        assert_eq!(total["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([[]]));
        assert!(
            total.get("StorageRetries").is_none(),
            "zero counters are left out"
        );
    }

    #[test]
    fn storage_retries_go_to_the_line_without_dimensions() {
        let mut m = Metrics {
            storage_retries: 3,
            ..Metrics::default()
        };
        m.merge(Metrics {
            storage_retries: 2,
            storage_failures: 1,
            ..Metrics::default()
        });
        let lines = m.emf_lines(1_000);
        assert_eq!(lines.len(), 1);
        let v: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(v["StorageRetries"], 5);
        assert_eq!(v["StorageFailures"], 1);
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([[]]));
        let names: Vec<&str> = v["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["Name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["StorageRetries", "StorageFailures"]);
    }
}
