//! The long-polling worker.

/// Runs the worker with configuration from the environment until SIGINT/SIGTERM.
pub async fn main_from_env() -> Result<(), super::RuntimeError> {
    Err("the worker is not built yet".into())
}
