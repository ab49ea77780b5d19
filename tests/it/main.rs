//! The integration tests, one test binary: a module per area, sharing `tests/support`. One
//! binary links the AWS SDK once instead of once per file. Run one area with
//! `cargo test --test it edge_breaker::` (the name filter is the module path).
//!
//! Most tests need the local stack (`bash infra/local/stack.sh start`, then
//! `eval "$(bash infra/local/stack.sh env)"`). The tests share one process and run in
//! parallel threads: none may change process-wide state (environment variables, the current
//! directory, the global `tracing` subscriber, the panic hook); a test that needs such a
//! setting passes it to the child process it starts. A check of what the crate logs runs in a
//! child process of this binary (`hostile`: `tracing` caches per process whether a log line
//! has a listener). The chaos run stays a binary of its own (`tests/chaos`): it sets the panic
//! hook and loads the emulators for minutes; cargo runs it as its own process, never beside
//! these tests.

#[path = "../support/mod.rs"]
mod support;

mod audit;
mod bench_smoke;
mod breaker;
mod cli;
mod console;
mod decision;
mod demo;
mod dlq_edit;
mod dlq_source;
mod edge_breaker;
mod edge_lambda;
mod edge_ledger;
mod edge_processor;
mod edge_send;
mod edge_setup;
mod edge_sqs;
mod edge_worker;
mod fanout;
mod fault_proxy;
mod fuzz;
mod heartbeat;
mod heartbeat_limits;
mod hostile;
mod http_dispatch;
mod in_flight;
mod incident;
mod init;
mod lambda_events;
mod layer;
mod ledger;
mod ledger_facts;
mod library_env;
mod pipeline;
mod promises;
mod retention;
mod sqs_chars;
mod stack;
mod startup;
mod state_pipeline;
mod storage_retry;
mod strict_sqs;
mod worker;
