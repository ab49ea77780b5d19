//! The demo: a mixed chaos workload through the worker, with a report.

/// Options of `triage demo`.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Jobs of each kind to send.
    pub jobs_per_kind: usize,
}

/// Runs the demo against the queue, DLQ and table the environment names.
pub async fn main_from_env(_opts: DemoOptions) -> Result<(), super::RuntimeError> {
    Err("the demo is not built yet".into())
}
