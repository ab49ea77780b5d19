//! Runtimes: the Lambda adapter and the long-polling worker, both thin over the processor.

pub mod env;
pub mod http;
pub mod lambda;
pub mod layer;
pub mod worker;

/// An error that stops a runtime, already worded for the operator.
pub type RuntimeError = Box<dyn std::error::Error + Send + Sync>;
