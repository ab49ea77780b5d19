//! Every row of the decision table in DESIGN.md, plus property tests over the whole input space.

use std::time::Duration;

use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use sqs_triage::core::decision::{RECEIVE_SLACK, visibility_limit};
use sqs_triage::core::{
    Backoff, Decision, DeferReason, FailureClass, Gate, Inputs, JobError, Ledger, RecordFacts, RetryPolicy,
    StoredAttempts, Verdict, admit, conclude, invalid, invalid as invalid_decision,
};

const NOW: u64 = 1_700_000_000_000;

fn facts(receive_count: u32) -> RecordFacts {
    RecordFacts {
        receive_count,
        received_at_ms: NOW,
        receive_limit: None,
        expires_at_ms: None,
    }
}

fn inputs(policy: &RetryPolicy) -> Inputs<'_> {
    Inputs {
        record: facts(1),
        ledger: Ledger::FirstDelivery,
        gate: Gate::Closed,
        time_left: None,
        policy,
        now_ms: NOW,
    }
}

/// The decision before the handler for a record that does not run.
fn skipped(i: &Inputs<'_>, rng: &mut StdRng) -> Decision {
    match admit(i, rng) {
        Verdict::Decided(d) => d,
        run => panic!("expected no run, got {run:?}"),
    }
}

/// The final decision after the handler.
fn after(i: &Inputs<'_>, outcome: &Result<(), JobError>, rng: &mut StdRng) -> Decision {
    conclude(i, outcome, rng).decision
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(42)
}

fn stored(attempts: u32, next: Option<u64>) -> Ledger {
    Ledger::Stored(Some(StoredAttempts {
        attempts,
        next_attempt_at_ms: next,
    }))
}

#[test]
fn invalid_envelope_is_dead_lettered_without_an_attempt() {
    let d = invalid("body is not JSON");
    assert_eq!(
        d,
        Decision::DeadLetter {
            class: FailureClass::Invalid,
            attempts: 0,
            error: "body is not JSON".into()
        }
    );
    assert!(d.spends_no_attempt());
}

#[test]
fn unknown_job_type_is_invalid_too() {
    assert!(matches!(
        invalid("no handler for job type `x`"),
        Decision::DeadLetter {
            class: FailureClass::Invalid,
            attempts: 0,
            ..
        }
    ));
}

#[test]
fn early_arrival_is_deferred_to_its_stored_time() {
    let p = RetryPolicy::default();
    let i = Inputs {
        record: facts(2),
        ledger: stored(1, Some(NOW + 4_200)),
        ..inputs(&p)
    };
    assert_eq!(
        skipped(&i, &mut rng()),
        Decision::Defer {
            reason: DeferReason::EarlyArrival,
            visibility: Duration::from_secs(5)
        }
    );
}

#[test]
fn arrival_on_time_runs_the_next_attempt() {
    let p = RetryPolicy::default();
    let i = Inputs {
        record: facts(2),
        ledger: stored(1, Some(NOW - 10)),
        ..inputs(&p)
    };
    assert_eq!(admit(&i, &mut rng()), Verdict::Run { attempt: 2 });
}

#[test]
fn open_breaker_defers_to_the_end_of_the_open_period_plus_jitter() {
    let p = RetryPolicy::builder()
        .defer_jitter(Duration::from_secs(3))
        .build()
        .unwrap();
    let i = Inputs {
        gate: Gate::Open {
            until_ms: NOW + 20_000,
        },
        ..inputs(&p)
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut r = rng();
    for _ in 0..200 {
        match skipped(&i, &mut r) {
            Decision::Defer {
                reason: DeferReason::BreakerOpen,
                visibility,
            } => {
                assert!(visibility >= Duration::from_secs(20) && visibility <= Duration::from_secs(23));
                seen.insert(visibility);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(seen.len() > 1, "jitter must spread deferrals: {seen:?}");
}

/// A job deferred again and again by an open breaker spreads its returns wider each time
/// (its receives that did not run: the receive count less one less its executions), up to the
/// policy's max delay, so the jobs an outage holds back do not all land on the next opening.
#[test]
fn repeated_deferrals_spread_wider_each_time_up_to_the_max_delay() {
    let p = RetryPolicy::builder()
        .defer_jitter(Duration::from_secs(3))
        .max_delay(Duration::from_secs(60))
        .build()
        .unwrap();
    let widest = |receive_count: u32, ledger: Ledger| {
        let i = Inputs {
            record: facts(receive_count),
            ledger,
            gate: Gate::Open {
                until_ms: NOW + 20_000,
            },
            ..inputs(&p)
        };
        let mut r = rng();
        (0..400)
            .map(|_| match skipped(&i, &mut r) {
                Decision::Defer { visibility, .. } => visibility,
                other => panic!("unexpected {other:?}"),
            })
            .max()
            .unwrap()
    };
    let s = Duration::from_secs;
    // First receive: the policy's 3 s of jitter.
    assert!(widest(1, Ledger::FirstDelivery) <= s(23));
    // The third receive of a job that never ran: two idle receives, up to 12 s.
    let third = widest(3, Ledger::Stored(None));
    assert!(third > s(27) && third <= s(32), "{third:?}");
    // The third receive of a job that ran twice: no idle receive.
    assert!(widest(3, stored(2, None)) <= s(23));
    // Many idle receives: the window stops at the max delay.
    let many = widest(14, Ledger::Stored(None));
    assert!(many > s(70) && many <= s(80), "{many:?}");
    // Half-open with every slot taken spreads the same way.
    let i = Inputs {
        record: facts(5),
        ledger: Ledger::Stored(None),
        gate: Gate::ProbeBusy {
            until_ms: NOW + 20_000,
        },
        ..inputs(&p)
    };
    let mut r = rng();
    let busy = (0..400)
        .map(|_| match skipped(&i, &mut r) {
            Decision::Defer { visibility, .. } => visibility,
            other => panic!("unexpected {other:?}"),
        })
        .max()
        .unwrap();
    assert!(busy > s(60) && busy <= s(68), "{busy:?}");
}

#[test]
fn half_open_without_a_slot_defers_until_the_probe_can_be_known() {
    let p = RetryPolicy::default();
    let i = Inputs {
        gate: Gate::ProbeBusy {
            until_ms: NOW + 20_000,
        },
        ..inputs(&p)
    };
    match skipped(&i, &mut rng()) {
        Decision::Defer {
            reason: DeferReason::ProbeBusy,
            visibility,
        } => assert!(
            visibility >= Duration::from_secs(20) && visibility <= Duration::from_secs(23),
            "{visibility:?}"
        ),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn on_the_last_receive_nothing_is_left_for_the_redrive_to_move_unrecorded() {
    let p = RetryPolicy::default();
    let last = RecordFacts {
        receive_count: 8,
        received_at_ms: NOW,
        receive_limit: Some(8),
        expires_at_ms: None,
    };
    let outage = Inputs {
        record: last,
        gate: Gate::Open {
            until_ms: NOW + 30_000,
        },
        ..inputs(&p)
    };
    let failed = Err(JobError::transient("timeout"));
    let retried = Inputs {
        record: last,
        ..inputs(&p)
    };
    let late = Inputs {
        record: last,
        time_left: Some(Duration::ZERO),
        ..inputs(&p)
    };
    let decisions = [
        (skipped(&outage, &mut rng()), 0),
        (after(&retried, &failed, &mut rng()), 1),
        (skipped(&late, &mut rng()), 0),
    ];
    for (d, attempts) in decisions {
        match d {
            Decision::DeadLetter {
                class: FailureClass::Expiring,
                attempts: a,
                error,
            } => {
                assert_eq!(a, attempts);
                assert!(error.contains("maxReceiveCount 8"), "{error}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // One receive earlier, the same inputs leave the message in its queue.
    let earlier = Inputs {
        record: RecordFacts {
            receive_count: 7,
            ..last
        },
        ..outage
    };
    assert!(matches!(skipped(&earlier, &mut rng()), Decision::Defer { .. }));
    // A success on the last receive is a success.
    let ok = Ok(());
    let done = Inputs {
        record: last,
        ..inputs(&p)
    };
    assert!(matches!(after(&done, &ok, &mut rng()), Decision::Done { .. }));
}

#[test]
fn nothing_waits_past_the_queues_retention() {
    let p = RetryPolicy::default();
    let expiring = RecordFacts {
        receive_count: 3,
        received_at_ms: NOW,
        receive_limit: None,
        expires_at_ms: Some(NOW + 20_000),
    };
    // A breaker open for 12 h: deferred only until the retention's end, not past it.
    let open = Inputs {
        record: expiring,
        gate: Gate::Open {
            until_ms: NOW + 12 * 3_600_000,
        },
        ..inputs(&p)
    };
    match skipped(&open, &mut rng()) {
        Decision::Defer { visibility, .. } => assert_eq!(visibility, Duration::from_secs(20)),
        other => panic!("unexpected {other:?}"),
    }
    // A retry whose backoff ends after the retention comes back earlier instead.
    let failed = Err(JobError::retry_after(Duration::from_secs(600), "slow down"));
    let late_retry = Inputs {
        record: expiring,
        ..inputs(&p)
    };
    match after(&late_retry, &failed, &mut rng()) {
        Decision::Retry {
            visibility,
            next_attempt_at_ms,
            ..
        } => {
            assert_eq!(visibility, Duration::from_secs(20));
            assert_eq!(next_attempt_at_ms, NOW + 20_000);
        }
        other => panic!("unexpected {other:?}"),
    }
    // A retry longer than SQS's 12-hour visibility limit: its visibility is already cut, but
    // its stored time must also come before the retention's end, or its early arrival would
    // be deferred past it.
    let long = RetryPolicy::builder()
        .max_delay(Duration::from_secs(20 * 3600))
        .backoff(Backoff::exponential(
            Duration::from_secs(20 * 3600),
            2.0,
            Duration::from_secs(20 * 3600),
            Duration::ZERO,
        ))
        .build()
        .unwrap();
    let transient = Err(JobError::transient("down"));
    let in_a_day = Inputs {
        record: RecordFacts {
            expires_at_ms: Some(NOW + 19 * 3_600_000),
            ..expiring
        },
        ..inputs(&long)
    };
    match after(&in_a_day, &transient, &mut rng()) {
        Decision::Retry {
            next_attempt_at_ms,
            visibility,
            ..
        } => {
            assert!(next_attempt_at_ms <= NOW + 19 * 3_600_000, "{next_attempt_at_ms}");
            assert!(visibility <= Duration::from_secs(12 * 3600));
        }
        other => panic!("unexpected {other:?}"),
    }
    // With less than a second left, it is dead-lettered with a record rather than dropped.
    let gone = Inputs {
        record: RecordFacts {
            expires_at_ms: Some(NOW + 900),
            ..expiring
        },
        ..open
    };
    match skipped(&gone, &mut rng()) {
        Decision::DeadLetter {
            class: FailureClass::Expiring,
            attempts: 0,
            error,
        } => assert!(error.contains("retention"), "{error}"),
        other => panic!("unexpected {other:?}"),
    }
    // A deferral that ends in time is untouched.
    let soon = Inputs {
        gate: Gate::Open {
            until_ms: NOW + 5_000,
        },
        ..open
    };
    assert!(matches!(
        skipped(&soon, &mut rng()),
        Decision::Defer { visibility, .. } if visibility >= Duration::from_secs(5) && visibility <= Duration::from_secs(20)
    ));
}

#[test]
fn half_open_without_a_slot_defers_at_least_a_second() {
    let p = RetryPolicy::default();
    let i = Inputs {
        gate: Gate::ProbeBusy { until_ms: NOW },
        ..inputs(&p)
    };
    match skipped(&i, &mut rng()) {
        Decision::Defer {
            reason: DeferReason::ProbeBusy,
            visibility,
        } => {
            assert!(
                visibility >= Duration::from_secs(1) && visibility <= Duration::from_secs(4),
                "{visibility:?}"
            )
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn half_open_with_a_permit_runs() {
    let p = RetryPolicy::default();
    let i = Inputs {
        gate: Gate::Probe,
        ..inputs(&p)
    };
    assert_eq!(admit(&i, &mut rng()), Verdict::Run { attempt: 1 });
}

#[test]
fn too_little_time_left_releases() {
    let p = RetryPolicy::builder()
        .start_margin(Duration::from_secs(2))
        .build()
        .unwrap();
    let i = Inputs {
        time_left: Some(Duration::from_millis(1_999)),
        ..inputs(&p)
    };
    assert_eq!(skipped(&i, &mut rng()), Decision::Release);
    let i = Inputs {
        time_left: Some(Duration::from_secs(2)),
        ..inputs(&p)
    };
    assert_eq!(admit(&i, &mut rng()), Verdict::Run { attempt: 1 });
}

#[test]
fn success_is_done() {
    let p = RetryPolicy::default();
    let ok = Ok(());
    let i = Inputs {
        record: facts(3),
        ledger: stored(2, None),
        ..inputs(&p)
    };
    assert_eq!(after(&i, &ok, &mut rng()), Decision::Done { attempts: 3 });
}

#[test]
fn fatal_failure_goes_to_the_dlq_at_once() {
    let p = RetryPolicy::default();
    for err in [
        JobError::fatal("card declined"),
        JobError::panic(&"boom"),
        JobError::payload_decode(&serde_json::from_str::<u8>("x").unwrap_err()),
    ] {
        let out = Err(err.clone());
        let d = after(&inputs(&p), &out, &mut rng());
        assert_eq!(
            d,
            Decision::DeadLetter {
                class: FailureClass::Fatal,
                attempts: 1,
                error: err.message().to_owned()
            }
        );
    }
}

#[test]
fn a_job_types_rules_can_make_an_error_fatal() {
    let p = RetryPolicy::builder()
        .rules(sqs_triage::Rules::new().fatal_code("CardDeclined"))
        .build()
        .unwrap();
    let out = Err(sqs_triage::effects::from_aws_code(
        Some("CardDeclined"),
        "declined",
    ));
    assert!(matches!(
        after(&inputs(&p), &out, &mut rng()),
        Decision::DeadLetter {
            class: FailureClass::Fatal,
            ..
        }
    ));
}

#[test]
fn transient_failure_with_attempts_left_retries_after_backoff() {
    let p = RetryPolicy::default();
    let out = Err(JobError::transient("timeout"));
    match after(&inputs(&p), &out, &mut rng()) {
        Decision::Retry {
            attempts,
            delay,
            visibility,
            next_attempt_at_ms,
            error,
        } => {
            assert_eq!(attempts, 1);
            assert!(
                delay >= Duration::from_secs(3) && delay < Duration::from_secs(4),
                "{delay:?}"
            );
            assert_eq!(visibility, Duration::from_secs(4), "rounded up to whole seconds");
            assert_eq!(next_attempt_at_ms, NOW + delay.as_millis() as u64);
            assert_eq!(error, "timeout");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn retry_after_is_honoured_and_clamped() {
    let p = RetryPolicy::builder()
        .max_delay(Duration::from_secs(60))
        .build()
        .unwrap();
    for (asked, got) in [(7, 7), (600, 60)] {
        let out = Err(JobError::retry_after(Duration::from_secs(asked), "throttled"));
        match after(&inputs(&p), &out, &mut rng()) {
            Decision::Retry {
                delay, visibility, ..
            } => {
                assert_eq!(delay, Duration::from_secs(got));
                assert_eq!(visibility, Duration::from_secs(got));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn transient_failure_without_attempts_left_is_exhausted() {
    let p = RetryPolicy::default();
    let out = Err(JobError::transient("still down"));
    let i = Inputs {
        record: facts(5),
        ledger: stored(4, Some(NOW - 1)),
        ..inputs(&p)
    };
    assert_eq!(
        after(&i, &out, &mut rng()),
        Decision::DeadLetter {
            class: FailureClass::Exhausted,
            attempts: 5,
            error: "still down".into()
        }
    );
}

#[test]
fn a_job_already_out_of_attempts_is_dead_lettered_without_running() {
    let p = RetryPolicy::default();
    let i = Inputs {
        record: facts(7),
        ledger: stored(5, None),
        ..inputs(&p)
    };
    assert!(matches!(
        skipped(&i, &mut rng()),
        Decision::DeadLetter {
            class: FailureClass::Exhausted,
            attempts: 5,
            ..
        }
    ));
}

#[test]
fn ledger_outage_falls_back_to_the_receive_count() {
    let p = RetryPolicy::default();
    let i = Inputs {
        record: facts(3),
        ledger: Ledger::Unavailable,
        ..inputs(&p)
    };
    assert_eq!(admit(&i, &mut rng()), Verdict::Run { attempt: 3 });
    let i = Inputs {
        record: facts(6),
        ledger: Ledger::Unavailable,
        ..inputs(&p)
    };
    assert!(matches!(
        skipped(&i, &mut rng()),
        Decision::DeadLetter {
            class: FailureClass::Exhausted,
            ..
        }
    ));
}

#[test]
fn long_delays_are_applied_in_steps_within_the_12_hour_limit() {
    let p = RetryPolicy::builder()
        .max_delay(Duration::from_secs(2 * 24 * 3600))
        .build()
        .unwrap();
    let out = Err(JobError::retry_after(
        Duration::from_secs(30 * 3600),
        "come back tomorrow",
    ));
    let i = Inputs {
        now_ms: NOW + 3_600_000,
        ..inputs(&p)
    };
    match after(&i, &out, &mut rng()) {
        Decision::Retry {
            delay,
            visibility,
            next_attempt_at_ms,
            ..
        } => {
            assert_eq!(delay, Duration::from_secs(30 * 3600));
            let limit = Duration::from_secs(11 * 3600) - RECEIVE_SLACK;
            assert_eq!(visibility, limit);
            assert_eq!(next_attempt_at_ms, NOW + 3_600_000 + 30 * 3_600_000);
        }
        other => panic!("unexpected {other:?}"),
    }
    // Back early on the next receive: deferred again for the rest, without an attempt.
    let i = Inputs {
        record: RecordFacts {
            receive_count: 2,
            received_at_ms: NOW + 12 * 3_600_000,
            receive_limit: None,
            expires_at_ms: None,
        },
        ledger: stored(1, Some(NOW + 31 * 3_600_000)),
        now_ms: NOW + 12 * 3_600_000,
        ..inputs(&p)
    };
    match skipped(&i, &mut rng()) {
        Decision::Defer {
            reason: DeferReason::EarlyArrival,
            visibility,
        } => {
            assert_eq!(visibility, Duration::from_secs(12 * 3600) - RECEIVE_SLACK)
        }
        other => panic!("unexpected {other:?}"),
    }
}

fn any_policy() -> impl Strategy<Value = RetryPolicy> {
    (
        1u32..30,
        0u64..10_000,
        1.0f64..5.0,
        1u64..100_000,
        0u64..5_000,
        0usize..6,
    )
        .prop_map(|(attempts, base, mult, max_s, jitter, kind)| {
            let max = Duration::from_secs(max_s);
            let backoff = match kind {
                0 => Backoff::exponential(
                    Duration::from_millis(base),
                    mult,
                    max,
                    Duration::from_millis(jitter),
                ),
                1 => Backoff::FullJitter {
                    base: Duration::from_millis(base),
                    multiplier: mult,
                    max,
                },
                2 => Backoff::Decorrelated {
                    base: Duration::from_millis(base),
                    max,
                },
                3 => Backoff::Sidekiq,
                4 => Backoff::Sidekiq8,
                _ => Backoff::Custom(std::sync::Arc::new(|n, _| {
                    Duration::from_secs(u64::from(n) * 1000)
                })),
            };
            RetryPolicy::builder()
                .max_attempts(attempts)
                .backoff(backoff)
                .max_delay(max)
                .build()
                .unwrap()
        })
}

fn any_outcome() -> impl Strategy<Value = Option<Result<(), JobError>>> {
    prop_oneof![
        Just(None),
        Just(Some(Ok(()))),
        Just(Some(Err(JobError::fatal("f")))),
        Just(Some(Err(JobError::transient("t")))),
        (0u64..200_000).prop_map(|s| Some(Err(JobError::retry_after(Duration::from_secs(s), "r")))),
    ]
}

fn any_gate() -> impl Strategy<Value = Gate> {
    prop_oneof![
        Just(Gate::Closed),
        Just(Gate::Probe),
        (0u64..100_000).prop_map(|d| Gate::ProbeBusy { until_ms: NOW + d }),
        (0u64..100_000_000).prop_map(|d| Gate::Open { until_ms: NOW + d }),
    ]
}

fn any_ledger() -> impl Strategy<Value = Ledger> {
    prop_oneof![
        Just(Ledger::FirstDelivery),
        Just(Ledger::Unavailable),
        Just(Ledger::Stored(None)),
        (any::<u32>(), proptest::option::of(0u64..200_000_000))
            .prop_map(|(a, n)| stored(a, n.map(|n| NOW - 100_000_000 + n))),
        (0u64..100_000_000).prop_map(|d| Ledger::Done { at_ms: NOW - d }),
        (any::<u32>(), 0u64..100_000_000).prop_map(|(attempts, d)| Ledger::Parked {
            attempts,
            at_ms: NOW - d
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn every_input_gets_exactly_one_sane_decision(
        policy in any_policy(),
        outcome in any_outcome(),
        gate in any_gate(),
        ledger in any_ledger(),
        receive_count in 1u32..u32::MAX,
        since_receive_ms in 0u64..(13 * 3_600_000),
        time_left_ms in proptest::option::of(0u64..900_000),
        invalid in proptest::option::of("[a-z ]{1,20}"),
        seed in any::<u64>(),
    ) {
        let record = RecordFacts { receive_count, received_at_ms: NOW - since_receive_ms, receive_limit: None, expires_at_ms: None };
        let i = Inputs {
            record,
            ledger,
            gate,
            time_left: time_left_ms.map(Duration::from_millis),
            policy: &policy,
            now_ms: NOW,
        };
        let limit = visibility_limit(record, NOW);
        // An unreadable record is dead-lettered at once, as invalid, without an attempt.
        if let Some(reason) = &invalid {
            prop_assert_eq!(
                invalid_decision(reason),
                Decision::DeadLetter { class: FailureClass::Invalid, attempts: 0, error: reason.clone() }
            );
        }
        let d = match &outcome {
            None => match admit(&i, &mut StdRng::seed_from_u64(seed)) {
                Verdict::Run { attempt } => {
                    prop_assert!(attempt >= 1 && attempt <= policy.max_attempts());
                    // Never past an open breaker or a busy half-open one.
                    let blocked = matches!(gate, Gate::Open { .. } | Gate::ProbeBusy { .. });
                    prop_assert!(!blocked);
                    // Deterministic for the same random draws.
                    prop_assert_eq!(admit(&i, &mut StdRng::seed_from_u64(seed)), Verdict::Run { attempt });
                    return Ok(());
                }
                Verdict::Decided(d) => {
                    // Before the handler nothing is spent, whatever the decision.
                    let unspent = d.spends_no_attempt() || matches!(d, Decision::DeadLetter { .. });
                    prop_assert!(unspent);
                    let finished = matches!(d, Decision::Done { .. } | Decision::Retry { .. });
                    prop_assert!(!finished);
                    d
                }
            },
            Some(o) => {
                let s = conclude(&i, o, &mut StdRng::seed_from_u64(seed));
                // The classified kind comes with the decision: none for a success.
                prop_assert_eq!(s.error.is_none(), o.is_ok());
                let unrun = matches!(s.decision, Decision::Defer { .. } | Decision::Release);
                prop_assert!(!unrun);
                s.decision
            }
        };
        // Deterministic for the same random draws.
        let again = match &outcome {
            None => match admit(&i, &mut StdRng::seed_from_u64(seed)) {
                Verdict::Decided(d) => d,
                run => {
                    prop_assert!(false, "the same draws gave another verdict: {:?}", run);
                    return Ok(());
                }
            },
            Some(o) => conclude(&i, o, &mut StdRng::seed_from_u64(seed)).decision,
        };
        prop_assert_eq!(&d, &again);
        match &d {
            Decision::Retry { delay, visibility, attempts, .. } => {
                prop_assert!(*delay <= policy.max_delay());
                prop_assert!(*visibility <= limit);
                prop_assert!(*visibility <= Duration::from_secs(12 * 3600));
                prop_assert!(*attempts < policy.max_attempts());
            }
            Decision::Defer { visibility, .. } => prop_assert!(*visibility <= limit),
            Decision::Release | Decision::Duplicate { .. } => prop_assert!(outcome.is_none()),
            Decision::DeadLetter { class: FailureClass::Invalid, attempts, .. } => prop_assert_eq!(*attempts, 0),
            Decision::DeadLetter { class: FailureClass::Parked, .. } => prop_assert!(outcome.is_none()),
            Decision::DeadLetter { attempts, .. } | Decision::Done { attempts } => {
                prop_assert!(*attempts >= 1 || outcome.is_none())
            }
        }
    }

    #[test]
    fn capped_base_never_decreases_and_jitter_stays_in_its_window(
        base_ms in 1u64..60_000,
        mult in 1.0f64..4.0,
        max_s in 1u64..86_400,
        jitter_ms in 0u64..10_000,
        seed in any::<u64>(),
    ) {
        let max = Duration::from_secs(max_s);
        let zero_jitter = Backoff::exponential(Duration::from_millis(base_ms), mult, max, Duration::ZERO);
        let b = Backoff::exponential(Duration::from_millis(base_ms), mult, max, Duration::from_millis(jitter_ms));
        let err = JobError::transient("x");
        let mut r = StdRng::seed_from_u64(seed);
        let mut prev = Duration::ZERO;
        for n in (0..64).chain([1_000, 1_000_000, u32::MAX - 1, u32::MAX]) {
            let capped = zero_jitter.delay(n, &err, &mut r);
            prop_assert!(capped >= prev, "n={} {:?} < {:?}", n, capped, prev);
            prop_assert!(capped <= max);
            prev = capped;
            let d = b.delay(n, &err, &mut r);
            prop_assert!(d >= capped && d <= max);
            prop_assert!(d - capped < Duration::from_millis(jitter_ms.max(1)));
        }
    }

    #[test]
    fn no_strategy_panics_at_extreme_attempt_numbers(n in prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()], seed in any::<u64>()) {
        let err = JobError::transient("x");
        let mut r = StdRng::seed_from_u64(seed);
        for b in [
            Backoff::default(),
            Backoff::FullJitter { base: Duration::from_secs(1), multiplier: 2.0, max: Duration::from_secs(3600) },
            Backoff::Decorrelated { base: Duration::from_secs(1), max: Duration::from_secs(3600) },
            Backoff::Sidekiq,
            Backoff::Sidekiq8,
        ] {
            let _ = b.delay(n, &err, &mut r);
            let _ = b.worst_case(n);
        }
        let p = RetryPolicy::default();
        prop_assert!(p.retry_delay(n, &err, &mut r) <= p.max_delay());
    }
}

#[test]
fn a_breaker_open_longer_than_the_retention_is_refused_at_start_up() {
    use sqs_triage::core::breaker::BreakerConfig;
    use sqs_triage::processor::registry::{JobContext, Registry};
    let long = BreakerConfig::builder()
        .open_for(Duration::from_secs(2 * 3600))
        .build()
        .unwrap();
    let registry = Registry::default().handle_with(
        "t",
        RetryPolicy::default(),
        long,
        |_: serde_json::Value, _: JobContext| async { Ok(()) },
    );
    let refused = registry.check_retention(Duration::from_secs(3600)).unwrap_err();
    assert!(refused.to_string().contains("TRIAGE_BREAKER_OPEN_S"), "{refused}");
    assert!(
        registry
            .check_retention(Duration::from_secs(4 * 24 * 3600))
            .is_ok()
    );
}
