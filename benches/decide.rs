//! Per-record cost of the pure core: envelope parse, classification and decision, over a
//! 10,000-record batch with a 10% failure mix (5% transient, 3% fatal, 2% malformed); and the
//! same mix as a Lambda SQS event, from its JSON bytes through the real processor (without
//! the plan's AWS calls) to the serialized batch response (the Rust side of
//! `cargo bench --bench report`'s comparison with Powertools).

#[allow(dead_code)]
#[path = "report/pipeline.rs"]
mod pipeline;

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use sqs_triage::core::envelope::{self, EnvelopeLimits};
use sqs_triage::core::{
    Decision, Gate, Inputs, JobError, Ledger, RecordFacts, RetryPolicy, Verdict, admit, conclude, invalid,
};

const RECORDS: usize = 10_000;

fn bodies() -> Vec<(String, Result<(), JobError>)> {
    (0..RECORDS)
        .map(|i| match i % 100 {
            0..=4 => (
                format!(r#"{{"type":"email.send","id":"job-{i}","payload":{{"to":"user{i}@example.com","template":"welcome"}}}}"#),
                Err(JobError::transient("smtp timeout")),
            ),
            5..=7 => (
                format!(r#"{{"type":"email.send","id":"job-{i}","payload":{{"to":null}}}}"#),
                Err(JobError::fatal("recipient missing")),
            ),
            8..=9 => (format!("{{not json {i}"), Ok(())),
            _ => (
                format!(r#"{{"type":"email.send","id":"job-{i}","payload":{{"to":"user{i}@example.com","template":"welcome"}}}}"#),
                Ok(()),
            ),
        })
        .collect()
}

fn per_record(c: &mut Criterion) {
    let batch = bodies();
    let policy = RetryPolicy::default();
    let mut rng = SmallRng::seed_from_u64(1);
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Elements(RECORDS as u64));
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("parse+classify+decide 10k records", |b| {
        b.iter(|| {
            let mut failures = 0usize;
            for (body, outcome) in &batch {
                let job = envelope::parse(body, None, None, EnvelopeLimits::default());
                if job.is_err() {
                    black_box(invalid("invalid envelope"));
                    continue;
                }
                let inputs = Inputs {
                    record: RecordFacts {
                        receive_count: 1,
                        received_at_ms: 1_700_000_000_000,
                        receive_limit: None,
                        expires_at_ms: None,
                    },
                    ledger: Ledger::FirstDelivery,
                    gate: Gate::Closed,
                    time_left: Some(Duration::from_secs(30)),
                    policy: &policy,
                    now_ms: 1_700_000_000_000,
                };
                let d = match admit(&inputs, &mut rng) {
                    Verdict::Run { .. } => conclude(&inputs, outcome, &mut rng).decision,
                    Verdict::Decided(d) => d,
                };
                failures += usize::from(matches!(d, Decision::Retry { .. }));
            }
            black_box(failures)
        })
    });
    g.finish();
}

fn event_to_response(c: &mut Criterion) {
    let raw = pipeline::event_json(RECORDS).into_bytes();
    let bench = pipeline::Bench::new();
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Elements(RECORDS as u64));
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("SqsEvent JSON to batch response 10k records", |b| {
        b.iter(|| black_box(bench.process_event(&raw, 1_700_000_000_000)))
    });
    g.finish();
}

criterion_group!(benches, per_record, event_to_response);
criterion_main!(benches);
