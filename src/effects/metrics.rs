//! Per-invocation metrics, written as CloudWatch Embedded Metric Format (EMF) lines.
//!
//! One line per job type per invocation (not per message; more only when a job type has more
//! than 100 metrics), plus one line without dimensions for account-wide alarms. Sampled metrics
//! go out as EMF's `Values`/`Counts`, at most 100 distinct values per document (rounded to 7
//! significant bits past that), so every line is a valid EMF document whatever the batch size.
//! Dimension values come only from registered job types; anything else is reported as
//! `unregistered`, so a producer cannot blow up metric cardinality.

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

/// Distinct values a metric may carry in one EMF document (the specification's limit).
pub(crate) const MAX_VALUES: usize = 100;
/// Metric definitions one EMF directive may hold (the specification's limit).
pub(crate) const MAX_METRICS: usize = 100;
/// Longest CloudWatch dimension value.
const MAX_DIMENSION_VALUE: usize = 1024;
/// Significant bits a sample keeps when its metric has more than [`MAX_VALUES`] distinct values
/// in an invocation: a bucket's value is within 2^-7 (0.8%) of every sample in it.
const KEPT_BITS: u32 = 7;

impl Metrics {
    /// Runs `f` on the metrics of `job_type`, allocating its name only the first time.
    fn with_type(&mut self, job_type: &str, f: impl FnOnce(&mut TypeMetrics)) {
        match self.by_type.get_mut(job_type) {
            Some(m) => f(m),
            None => f(self.by_type.entry(job_type.to_owned()).or_default()),
        }
    }

    /// Adds `n` to a counter.
    pub fn add(&mut self, job_type: &str, name: &'static str, n: u64) {
        if n > 0 {
            self.with_type(job_type, |m| *m.counts.entry(name).or_default() += n);
        }
    }

    /// Records a final decision of a record.
    pub fn decision(&mut self, job_type: &str, d: &Decision) {
        let name = match d {
            Decision::Done { .. } => "Succeeded",
            Decision::Duplicate { .. } => "Duplicate",
            Decision::Retry { delay, .. } => {
                let ms = delay.as_millis() as u64;
                self.with_type(job_type, |m| m.retry_delay_ms.push(ms));
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
        let ms = d.as_millis() as u64;
        self.with_type(job_type, |m| m.handler_ms.push(ms));
    }

    /// A counter summed over every job type.
    pub fn total(&self, name: &str) -> u64 {
        self.by_type.values().filter_map(|t| t.counts.get(name)).sum()
    }

    /// Merges another set of metrics into this one.
    pub(crate) fn merge(&mut self, other: Metrics) {
        for (ty, m) in other.by_type {
            let e = self.by_type.entry(ty).or_default();
            for (k, v) in m.counts {
                *e.counts.entry(k).or_default() += v;
            }
            e.retry_delay_ms.extend(m.retry_delay_ms);
            e.handler_ms.extend(m.handler_ms);
        }
        self.storage_retries += other.storage_retries;
        self.storage_failures += other.storage_failures;
    }

    /// The EMF lines for these metrics at `timestamp_ms`: per job type, one line (more only
    /// when a sampled metric needs them, see [`distribution`]), then one line without
    /// dimensions. Every line is a valid EMF document whatever the batch: samples are sent as
    /// `{"Values": [...], "Counts": [...]}` with at most 100 distinct values, a directive
    /// names at most 100 metrics, and a job type is written as a valid dimension value.
    pub fn emf_lines(&self, timestamp_ms: u64) -> Vec<String> {
        let mut lines = Vec::new();
        let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (ty, m) in &self.by_type {
            // The metrics of this job type, each with the documents it spreads over: a counter
            // is one number; a sampled metric is one Values/Counts part per document.
            let mut parts: Vec<(&str, &str, Vec<Value>)> = Vec::new();
            for (name, v) in &m.counts {
                if *v > 0 {
                    parts.push((name, "Count", vec![json!(v)]));
                    *totals.entry(name).or_default() += v;
                }
            }
            for (name, samples) in [
                ("RetryDelay", &m.retry_delay_ms),
                ("HandlerDuration", &m.handler_ms),
            ] {
                if !samples.is_empty() {
                    let chunks = distribution(samples)
                        .chunks(MAX_VALUES)
                        .map(|c| {
                            let (values, counts): (Vec<u64>, Vec<u64>) = c.iter().copied().unzip();
                            json!({"Values": values, "Counts": counts})
                        })
                        .collect();
                    parts.push((name, "Milliseconds", chunks));
                }
            }
            let ty = dimension_value(ty);
            let rounds = parts.iter().map(|p| p.2.len()).max().unwrap_or(0);
            for round in 0..rounds {
                let here: Vec<_> = parts
                    .iter()
                    .filter_map(|(name, unit, chunks)| chunks.get(round).map(|c| (*name, *unit, c)))
                    .collect();
                for doc in here.chunks(MAX_METRICS) {
                    let mut root = Map::new();
                    let mut defs = Vec::with_capacity(doc.len());
                    for (name, unit, value) in doc {
                        defs.push(json!({"Name": name, "Unit": unit}));
                        root.insert((*name).to_owned(), (*value).clone());
                    }
                    root.insert("JobType".into(), Value::String(ty.clone().into_owned()));
                    root.insert("_aws".into(), aws_block(timestamp_ms, vec!["JobType"], defs));
                    lines.push(Value::Object(root).to_string());
                }
            }
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

/// The samples of one metric as (value, count) pairs in increasing value order. With at most
/// [`MAX_VALUES`] distinct values the values are exact (one document). With more, each sample
/// is rounded to [`KEPT_BITS`] significant bits — values up to 127 stay exact, larger ones
/// move by at most 0.8% — so percentiles computed by CloudWatch stay within 0.8% of the exact
/// ones; the pairs then spread over as many documents as needed, 100 per document (at most
/// 64 pairs per doubling of the value: every value from 1 ms to 10 s fits in 6 documents, and
/// every value a Lambda invocation can measure, up to 15 minutes, in 10).
pub(crate) fn distribution(samples: &[u64]) -> Vec<(u64, u64)> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let distinct = 1 + sorted.windows(2).filter(|w| w[0] != w[1]).count();
    if distinct <= MAX_VALUES {
        run_lengths(sorted.into_iter())
    } else {
        // Rounding keeps the order, so the rounded samples are sorted too.
        run_lengths(sorted.into_iter().map(round_to_bucket))
    }
}

/// The middle of `v`'s bucket: the buckets of values with more than [`KEPT_BITS`] bits are
/// `2^shift` wide, so the middle is within `2^(shift-1) <= v / 2^KEPT_BITS` of `v`.
fn round_to_bucket(v: u64) -> u64 {
    let bits = u64::BITS - v.leading_zeros();
    if bits <= KEPT_BITS {
        return v;
    }
    let shift = bits - KEPT_BITS;
    ((v >> shift) << shift) + (1 << (shift - 1))
}

fn run_lengths(sorted: impl Iterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for v in sorted {
        match out.last_mut() {
            Some((last, n)) if *last == v => *n += 1,
            _ => out.push((v, 1)),
        }
    }
    out
}

/// `job_type` as a CloudWatch dimension value (ASCII without control characters, not blank,
/// at most 1024 characters): unchanged when it already is one and holds no `%`; otherwise
/// every byte outside printable ASCII, and `%`, is written `%XX` (so two job types never share
/// a value unless cut), a blank name becomes `(blank)`, and the result is cut to 1024
/// characters.
pub(crate) fn dimension_value(job_type: &str) -> std::borrow::Cow<'_, str> {
    let printable = |b: u8| (0x20..0x7f).contains(&b);
    if !job_type.trim().is_empty()
        && job_type.len() <= MAX_DIMENSION_VALUE
        && job_type.bytes().all(|b| printable(b) && b != b'%')
    {
        return job_type.into();
    }
    let mut out = String::with_capacity(job_type.len().min(MAX_DIMENSION_VALUE));
    for b in job_type.bytes() {
        if printable(b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.trim().is_empty() {
        out = "(blank)".to_owned();
    }
    out.truncate(MAX_DIMENSION_VALUE);
    out.into()
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
        assert_eq!(v["RetryDelay"], json!({"Values": [3_400], "Counts": [1]}));
        assert_eq!(v["HandlerDuration"], json!({"Values": [12], "Counts": [1]}));
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Namespace"], NAMESPACE);
        let total: Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(total["DeadLettered"], 1);
        assert_eq!(total["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([[]]));
        assert!(
            total.get("StorageRetries").is_none(),
            "zero counters are left out"
        );
    }

    /// What CloudWatch requires of one EMF line: a JSON object of at most 256 KiB whose
    /// directives name at most 100 metrics each (no name twice), dimension sets of at most 30
    /// keys whose values are valid dimension values (ASCII without control characters, not
    /// blank, at most 1024 characters), and, for each metric, a number, or `Values` (at most
    /// 100 numbers) with as many positive `Counts`. Returns the line parsed.
    pub(crate) fn check_emf(line: &str) -> Value {
        assert!(line.len() <= 256 * 1024, "a line of {} bytes", line.len());
        assert!(!line.contains('\n'), "one document per line");
        let v: Value = serde_json::from_str(line).expect("a line is JSON");
        let root = v.as_object().expect("a line is an object");
        let directives = v["_aws"]["CloudWatchMetrics"].as_array().expect("directives");
        assert!(v["_aws"]["Timestamp"].is_u64(), "a timestamp");
        assert!(!directives.is_empty());
        for d in directives {
            assert_eq!(d["Namespace"], NAMESPACE);
            for set in d["Dimensions"].as_array().expect("dimension sets") {
                let set = set.as_array().expect("a dimension set");
                assert!(set.len() <= 30, "{} dimensions in a set", set.len());
                for key in set {
                    let value = root[key.as_str().expect("a dimension key")]
                        .as_str()
                        .expect("a dimension's value is a string");
                    assert!(
                        !value.trim().is_empty()
                            && value.len() <= 1024
                            && value.bytes().all(|b| (0x20..0x7f).contains(&b)),
                        "an invalid dimension value {value:?}"
                    );
                }
            }
            let defs = d["Metrics"].as_array().expect("metric definitions");
            assert!(defs.len() <= 100, "{} metrics in a directive", defs.len());
            let mut names = std::collections::BTreeSet::new();
            for def in defs {
                let name = def["Name"].as_str().expect("a metric name");
                assert!(names.insert(name), "{name} defined twice");
                let value = &root[name];
                if value.is_number() {
                    continue;
                }
                if let Some(values) = value.as_array() {
                    assert!(values.len() <= 100, "{name} has {} values", values.len());
                    assert!(values.iter().all(Value::is_number));
                    continue;
                }
                let values = value["Values"].as_array().unwrap_or_else(|| {
                    panic!(
                        "{name} is neither a number nor Values/Counts: {} bytes",
                        value.to_string().len()
                    )
                });
                let counts = value["Counts"].as_array().expect("Counts beside Values");
                assert!(values.len() <= 100, "{name} has {} values", values.len());
                assert_eq!(
                    values.len(),
                    counts.len(),
                    "{name}: Values and Counts differ in length"
                );
                assert!(values.iter().all(Value::is_number));
                assert!(counts.iter().all(|c| c.as_u64().is_some_and(|c| c > 0)));
            }
        }
        v
    }

    /// Per (job type, metric): the number of samples and their sum, over every line.
    fn totals(lines: &[String]) -> BTreeMap<(String, String), (u64, f64)> {
        let mut out = BTreeMap::new();
        for line in lines {
            let v = check_emf(line);
            let ty = v["JobType"].as_str().unwrap_or("").to_owned();
            for def in v["_aws"]["CloudWatchMetrics"][0]["Metrics"].as_array().unwrap() {
                let name = def["Name"].as_str().unwrap().to_owned();
                let e: &mut (u64, f64) = out.entry((ty.clone(), name.clone())).or_default();
                let value = &v[&name];
                if let Some(n) = value.as_f64() {
                    e.0 += 1;
                    e.1 += n;
                } else if let Some(values) = value.as_array() {
                    e.0 += values.len() as u64;
                    e.1 += values.iter().filter_map(Value::as_f64).sum::<f64>();
                } else {
                    for (x, c) in value["Values"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .zip(value["Counts"].as_array().unwrap())
                    {
                        e.0 += c.as_u64().unwrap();
                        e.1 += x.as_f64().unwrap() * c.as_f64().unwrap();
                    }
                }
            }
        }
        out
    }

    #[test]
    fn a_batch_of_ten_thousand_stays_within_emf_limits() {
        let mut m = Metrics::default();
        for i in 0..10_000u64 {
            m.decision("email", &Decision::Done { attempts: 1 });
            m.handler_duration("email", Duration::from_millis(i));
        }
        let lines = m.emf_lines(1_000);
        let t = totals(&lines);
        let (n, sum) = t[&("email".to_owned(), "HandlerDuration".to_owned())];
        assert_eq!(n, 10_000);
        let exact = (0..10_000u64).sum::<u64>() as f64;
        assert!((sum - exact).abs() <= exact / 128.0, "sum {sum} vs {exact}");
        assert_eq!(t[&("email".to_owned(), "Succeeded".to_owned())], (1, 10_000.0));
    }

    #[test]
    fn up_to_a_hundred_distinct_values_are_exact_and_more_are_rounded_within_a_128th() {
        let mut samples: Vec<u64> = (0..100).map(|i| i * 1_000 + 7).collect();
        samples.extend_from_slice(&samples.clone());
        let d = distribution(&samples);
        assert_eq!(d.len(), 100);
        assert!(d.iter().zip(0..).all(|(&(v, n), i)| v == i * 1_000 + 7 && n == 2));

        let samples: Vec<u64> = (0..5_000).chain([u64::MAX, u64::MAX - 1]).collect();
        let d = distribution(&samples);
        assert_eq!(d.iter().map(|p| p.1).sum::<u64>(), samples.len() as u64);
        assert!(
            d.windows(2).all(|w| w[0].0 < w[1].0),
            "increasing, distinct values"
        );
        for &s in &samples {
            let r = round_to_bucket(s);
            assert!(r.abs_diff(s) <= s / 128, "{s} -> {r}");
            assert!(d.iter().any(|p| p.0 == r));
        }
        assert!(
            (0..128).all(|v| round_to_bucket(v) == v),
            "small values stay exact"
        );
    }

    #[test]
    fn more_than_a_hundred_metrics_spread_over_documents() {
        let mut m = Metrics::default();
        for i in 0..250 {
            let name: &'static str = Box::leak(format!("Counter{i}").into_boxed_str());
            m.add("t", name, i + 1);
        }
        m.handler_duration("t", Duration::from_millis(5));
        let lines = m.emf_lines(0);
        assert_eq!(lines.len(), 3);
        let t = totals(&lines);
        assert_eq!(t.len(), 251);
        assert_eq!(t[&("t".to_owned(), "Counter249".to_owned())], (1, 250.0));
    }

    #[test]
    fn the_documents_a_distribution_needs_are_as_documented() {
        let docs = |hi: u64| {
            distribution(&(1..=hi).collect::<Vec<_>>())
                .len()
                .div_ceil(MAX_VALUES)
        };
        assert_eq!(docs(10_000), 6);
        assert!(docs(900_000) <= 10, "{}", docs(900_000));
    }

    #[test]
    fn job_types_are_written_as_valid_dimension_values() {
        assert_eq!(dimension_value("billing.charge"), "billing.charge");
        assert_eq!(dimension_value("é-mail\t%"), "%C3%A9-mail%09%25");
        // Two job types never share a value: a literal `%XX` is escaped too.
        assert_ne!(dimension_value("é"), dimension_value("%C3%A9"));
        assert_eq!(dimension_value("100%"), "100%25");
        assert_eq!(dimension_value(""), "(blank)");
        assert_eq!(dimension_value("   "), "(blank)");
        assert_eq!(dimension_value(&"x".repeat(3_000)).len(), 1024);
        let mut m = Metrics::default();
        for ty in ["", " ", "ünïcode", "ctl\u{1}", &"y".repeat(2_000)] {
            m.decision(ty, &Decision::Done { attempts: 1 });
        }
        for line in m.emf_lines(0) {
            check_emf(&line);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any number of samples over any number of job types: every line obeys EMF's limits,
        /// and the lines add back up to the counters and to the samples (their number exactly,
        /// their sum within the rounding's 1/128).
        #[test]
        fn every_batch_makes_valid_emf_lines(
            records in proptest::collection::vec(
                (0usize..150, 0u64..4, proptest::prelude::any::<u64>(), 0u32..40),
                0..3_000,
            ),
            big in proptest::collection::vec(0u64..10_000_000, 0..12_000),
        ) {
            let mut m = Metrics::default();
            let mut expected: BTreeMap<(String, String), (u64, f64)> = BTreeMap::new();
            let mut sample = |m: &mut Metrics, ty: &str, name: &str, ms: u64| {
                if name == "HandlerDuration" {
                    m.handler_duration(ty, Duration::from_millis(ms));
                } else {
                    m.decision(ty, &Decision::Retry {
                        attempts: 1,
                        delay: Duration::from_millis(ms),
                        visibility: Duration::from_secs(1),
                        next_attempt_at_ms: 0,
                        error: "t".into(),
                    });
                }
                let e = expected.entry((ty.to_owned(), name.to_owned())).or_default();
                e.0 += 1;
                e.1 += ms as f64;
            };
            for &(ty, kind, raw, bits) in &records {
                let ty = format!("type-{ty}");
                // Durations of every magnitude, from 0 to 2^40 ms.
                let ms = raw >> (24 + bits);
                match kind {
                    0 => sample(&mut m, &ty, "HandlerDuration", ms),
                    1 => sample(&mut m, &ty, "RetryDelay", ms),
                    2 => m.decision(&ty, &Decision::Done { attempts: 1 }),
                    _ => m.add(&ty, "BreakerOpened", 1),
                }
            }
            for &ms in &big {
                sample(&mut m, "bulk", "HandlerDuration", ms);
            }
            let got = totals(&m.emf_lines(1_000));
            for (ty, tm) in &m.by_type {
                for (name, n) in &tm.counts {
                    proptest::prop_assert_eq!(got[&(ty.clone(), (*name).to_owned())], (1, *n as f64));
                }
            }
            for (key, (n, sum)) in &expected {
                let (got_n, got_sum) = got[key];
                proptest::prop_assert_eq!(got_n, *n, "{:?}", key);
                proptest::prop_assert!((got_sum - sum).abs() <= sum / 128.0 + 1e-6 * sum, "{:?}: {} vs {}", key, got_sum, sum);
            }
        }
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
