//! Prints the accepted range of every numeric `TRIAGE_*` variable as JSON, from the table the
//! configuration parser itself reads (`sqs_triage::config::limits`), with the receive rule's
//! numbers. `infra/ranges.py` generates the deployment templates' parameter ranges from it:
//! `cargo run --quiet --example config_limits`.
#![forbid(unsafe_code)]

use sqs_triage::config::limits;
use triage::ops::setup::{MAX_RECEIVE_COUNT_LIMIT, RECEIVES_PER_ATTEMPT};

fn main() {
    let out = serde_json::json!({
        "variables": limits(),
        "receives_per_attempt": RECEIVES_PER_ATTEMPT,
        "max_receive_count_limit": MAX_RECEIVE_COUNT_LIMIT,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&out).expect("plain JSON values")
    );
}
