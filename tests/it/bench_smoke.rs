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
        // The same runs, billed: units summed from DynamoDB's answers (a retried job is
        // counted and its ledger deleted, so the transient workload writes).
        assert!(
            md.contains("| workload | read units | write units (computed) |"),
            "{md}"
        );
        let calls = &title("2.").values;
        assert!(calls["units.transient.write"] >= 1.0, "{calls:?}");
        assert!(calls["units.ok.read"] >= 1.0, "{calls:?}");
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

/// A section of the given key with one line and one value.
fn section(key: &str, title: &str, value: f64) -> report::Section {
    report::Section {
        title: title.into(),
        lines: vec![
            format!("| {key} | {value} |"),
            String::new(),
            format!("{key} said."),
        ],
        values: [(format!("{key}.x"), value)].into_iter().collect(),
        key: key.into(),
        ..report::Section::default()
    }
}

#[test]
fn a_section_a_run_skips_stays_on_the_page_marked_with_its_own_run() {
    let root = crate::support::repo_root();
    let bin = Path::new(env!("CARGO_BIN_EXE_triage-lambda"));
    let mut all = report::Options::full(root, bin);
    all.command = "the first run".into();
    let first = report::Report {
        machine: "machine one".into(),
        sections: vec![
            section("cost", "1. Cost", 1.0),
            section("storm", "3. Storm", 2.0),
            section("herd", "4. Herd", 3.0),
        ],
    };
    let page = report::document(&all, &first);

    let later_opts = report::Options::full(root, bin)
        .parse(&["--skip".into(), "storm".into()])
        .unwrap();
    let later_run = |page: &str| {
        let mut r = report::Report {
            machine: "machine two".into(),
            sections: vec![section("cost", "1. Cost", 5.0), section("herd", "4. Herd", 6.0)],
        };
        r.keep_skipped(&later_opts, page);
        r
    };
    let later = later_run(&page);
    let keys: Vec<&str> = later.sections.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["cost", "storm", "herd"]);
    let storm = &later.sections[1];
    assert_eq!(storm.title, "3. Storm");
    assert_eq!(storm.lines, first.sections[1].lines);
    assert_eq!(storm.values, first.sections[1].values);
    assert_eq!(
        storm.from,
        Some(("the first run".to_owned(), "machine one".to_owned()))
    );
    // The sections this run made are its own, not the page's.
    assert_eq!(later.sections[0].values["cost.x"], 5.0);
    assert!(later.sections[0].from.is_none());

    // The page says where the kept section comes from, and a third run keeps it unchanged.
    let page2 = report::document(&later_opts, &later);
    assert_eq!(
        page2.matches("`the first run`; machine: machine one").count(),
        1,
        "{page2}"
    );
    let third = later_run(&page2);
    assert_eq!(third.sections[1].lines, first.sections[1].lines);
    assert_eq!(third.sections[1].from, storm.from);
    assert_eq!(report::document(&later_opts, &third), page2);
}
