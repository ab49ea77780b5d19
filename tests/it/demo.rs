//! `triage demo`, as the quickstart runs it (`infra/local/demo.sh`): its report, and nothing of
//! the panics its `panic` jobs cause on purpose.

use crate::support;

use std::process::{Command, Stdio};

/// With `RUST_BACKTRACE=1` (as many Rust developers have it) and the quickstart's
/// `RUST_LOG=error`, the demo prints its report and no panic: no backtrace, no panic line. The
/// report says how many deliberate panics there were instead.
#[test]
fn the_demo_prints_its_report_and_no_handler_panic() {
    support::sqs_endpoint();
    let out = Command::new(env!("CARGO_BIN_EXE_triage"))
        .args(["demo", "--jobs", "3"])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LOG", "error")
        .env("NO_COLOR", "1")
        .env_remove("TRIAGE_LOG_PAYLOADS")
        .stdin(Stdio::null())
        .output()
        .expect("triage demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}\n--- stderr ---\n{stderr}");
    assert!(out.status.success(), "{all}");
    assert!(stdout.contains("## Final outcome per kind"), "{all}");
    assert!(
        stdout.contains("| panic | dead_lettered_fatal | 3 | 3 |"),
        "{all}"
    );
    for needle in ["stack backtrace", "panicked", "chaos: panic", "rust_begin_unwind"] {
        assert!(!all.contains(needle), "`{needle}` printed:\n{all}");
    }
    assert!(
        stdout.contains("3 handler panic(s) on purpose"),
        "the report does not count the deliberate panics:\n{all}"
    );
}
