//! The bench binary's report on a tiny input: it completes and prints every table. No timing
//! is asserted. The AWS-calls section runs when the local stack's variables are set (the
//! README's test command sets them); Python and cargo-lambda parts are reported as not
//! measured when the project venv is missing.

#[path = "../../benches/report/mod.rs"]
mod report;

use std::path::Path;

#[test]
fn the_report_runs_on_a_tiny_input_and_prints_every_table() {
    let opts = report::Options::full(
        crate::support::repo_root(),
        Path::new(env!("CARGO_BIN_EXE_triage-lambda")),
    )
    .parse(&[
        "--quick".into(),
        "--records".into(),
        "100".into(),
        "--messages".into(),
        "50".into(),
    ])
    .unwrap();
    let r = report::run(&opts);
    let md = format!("{}\n{}", r.summary(&opts), r.markdown());
    println!("{md}");
    for f in r.failures() {
        println!("not measured: {f}");
    }
    for header in [
        "| measurement | sqs-triage | alternatives, same run |",
        "| pipeline | CPU µs/record | Powertools ÷ this (CPU) |",
        "| workload | sqs-triage calls |",
        "| policy | executions | on bugs |",
        "| strategy | range of the first retry | peak / 100 ms |",
        "| measurement | median | runs |",
    ] {
        assert!(md.contains(header), "missing table header `{header}`:\n{md}");
    }
    // The added billed duration runs three functions on the local stack: its table, when it ran.
    if let Some(billed) = r.sections.iter().find(|s| s.title.starts_with("8.")) {
        if billed.failures.is_empty() {
            assert!(md.contains("| workload | function | p50 | p99 |"), "{md}");
            assert!(billed.values.contains_key("billed.failures.added_p50_ms"), "{md}");
        }
    }
    // `docs/benchmarks.md` opens with the summary, then says how the run was made.
    let doc = report::document(&opts, &r);
    let at = |h: &str| doc.find(h).unwrap_or_else(|| panic!("no `{h}` in the document"));
    assert!(at("## Summary") < at("## Command and machine"), "{doc}");
    assert!(at("## Command and machine") < at("## Results"), "{doc}");
    assert!(doc.contains(&r.summary(&opts)), "{doc}");
    let title = |t: &str| r.sections.iter().find(|s| s.title.starts_with(t)).unwrap();
    // The pure sections never depend on the machine's tools.
    for t in ["3.", "4."] {
        assert!(title(t).failures.is_empty(), "{:?}", title(t).failures);
    }
    assert!(
        title("1.").values.contains_key("cost.rust_us")
            || title("1.").lines.iter().any(|l| l.contains("sqs-triage"))
    );
    if std::env::var_os("AWS_ENDPOINT_URL_SQS").is_some() {
        assert!(title("2.").failures.is_empty(), "{:?}", title("2.").failures);
        // The fleet's outage writes to the breaker item until it opens, and every
        // environment then sees it open.
        let fleet = title("6.");
        assert!(fleet.failures.is_empty(), "{:?}", fleet.failures);
        assert!(
            fleet.values["fleet.3.breaker_writes"] >= 1.0,
            "{:?}",
            fleet.values
        );
        assert!(fleet.values.contains_key("fleet.3.open_s"), "{:?}", fleet.values);
        assert!(md.contains("| environments | steady: invocations/s |"), "{md}");
    }
}
