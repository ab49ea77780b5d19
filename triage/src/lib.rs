//! The sqs-triage operator tool, as a library the `triage` and `triage-lambda` binaries run:
//! operator actions ([`ops`]), the web console ([`console`]) and the demo ([`demo`]).
//!
//! A Lambda function depends on the `sqs-triage` library alone; this crate holds what only an
//! operator's machine needs (clap, axum, indicatif, json-patch, humantime), so no function
//! builds it. Its API serves the binaries, the tests and the benchmarks, and may change in
//! any release.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod console;
pub mod demo;
pub mod ops;
