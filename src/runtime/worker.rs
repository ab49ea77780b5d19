//! The long-polling worker: the same pipeline as the Lambda adapter, for local development
//! and for hosts outside Lambda. It deletes what is settled, leaves the rest (their
//! visibility already set by the processor), and on SIGINT/SIGTERM finishes the records in
//! flight and releases the ones not started.

use std::future::Future;
use std::time::Duration;

use aws_sdk_sqs::types::MessageSystemAttributeName;

use super::RuntimeError;
use super::env::{Environment, build, init_tracing, install_panic_hook, sdk_config};
use crate::config::Config;
use crate::processor::registry::Registry;
use crate::processor::{BatchOutcome, Incoming, now_ms};

/// How the worker polls.
#[derive(Debug, Clone, Copy)]
pub struct WorkerOptions {
    /// Long-poll wait per receive (0 to 20 s).
    pub wait: Duration,
    /// Messages per receive (1 to 10).
    pub max_messages: i32,
    /// Print EMF metric lines to stdout after each batch.
    pub emf: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            wait: Duration::from_secs(20),
            max_messages: 10,
            emf: false,
        }
    }
}

/// A worker over one environment.
#[derive(Debug, Clone)]
pub struct Worker {
    env: Environment,
    opts: WorkerOptions,
}

impl Worker {
    /// A worker polling `env`'s source queue.
    pub fn new(env: Environment, opts: WorkerOptions) -> Self {
        Self { env, opts }
    }

    /// The environment (processor, queue, call counter).
    pub fn env(&self) -> &Environment {
        &self.env
    }

    /// Receives one batch (long poll), processes it, deletes what is settled.
    pub async fn poll_once(&self) -> Result<Option<BatchOutcome>, RuntimeError> {
        let records = self.receive().await?;
        if records.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.process(records).await))
    }

    async fn receive(&self) -> Result<Vec<Incoming>, RuntimeError> {
        let sqs = self.env.processor.sqs();
        let out = sqs
            .retry()
            .call("ReceiveMessage", None, || {
                sqs.client()
                    .receive_message()
                    .queue_url(&self.env.queue_url)
                    .max_number_of_messages(self.opts.max_messages.clamp(1, 10))
                    .wait_time_seconds(self.opts.wait.as_secs().min(20) as i32)
                    .message_system_attribute_names(MessageSystemAttributeName::All)
                    .message_attribute_names("All")
                    .send()
            })
            .await?;
        Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .map(Incoming::from_sdk)
            .collect())
    }

    async fn process(&self, records: Vec<Incoming>) -> BatchOutcome {
        let sqs = self.env.processor.sqs();
        let receipts: Vec<String> = records.iter().map(|r| r.receipt_handle.clone()).collect();
        let outcome = self.env.processor.process(records, None).await;
        let settled: Vec<(usize, String)> = outcome
            .records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.settled)
            .map(|(i, _)| (i, receipts[i].clone()))
            .collect();
        let deleted = sqs.delete(&self.env.queue_url, settled, None).await;
        for (i, why) in deleted.failed {
            tracing::warn!(message_id = %outcome.records[i].message_id, error = %why, "delete failed; the message will be seen again");
        }
        if self.opts.emf {
            for line in outcome.metrics.emf_lines(now_ms()) {
                println!("{line}");
            }
        }
        outcome
    }

    /// Polls until `shutdown` resolves, calling `on_batch` after each batch. A shutdown during
    /// a receive stops at once (messages SQS handed to that receive come back after their
    /// visibility timeout); during a batch, the running records finish and the rest are
    /// released.
    pub async fn run<F>(
        &self,
        shutdown: F,
        mut on_batch: impl FnMut(&BatchOutcome),
    ) -> Result<(), RuntimeError>
    where
        F: Future<Output = ()>,
    {
        tokio::pin!(shutdown);
        loop {
            let received = tokio::select! {
                r = self.receive() => r,
                () = &mut shutdown => return Ok(()),
            };
            let records = match received {
                Ok(r) if r.is_empty() => continue,
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "receive failed; polling again");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        () = &mut shutdown => return Ok(()),
                    }
                }
            };
            let batch = self.process(records);
            tokio::pin!(batch);
            let (outcome, stopping) = tokio::select! {
                o = &mut batch => (o, false),
                () = &mut shutdown => {
                    self.env.processor.drain();
                    (batch.await, true)
                }
            };
            on_batch(&outcome);
            if stopping {
                return Ok(());
            }
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Runs the worker with configuration from the environment until SIGINT/SIGTERM.
pub async fn main_from_env() -> Result<(), RuntimeError> {
    init_tracing();
    let config = Config::from_env()?;
    install_panic_hook(config.log_payloads);
    let sdk = sdk_config().await;
    let registry = super::chaos::register_recording(
        Registry::new(config.policy.clone(), config.breaker),
        config.policy.clone(),
        config.breaker,
        super::chaos::Recorder::from_env(&sdk),
    );
    let env = build(&config, registry, &sdk).await?;
    let emf = std::env::var("TRIAGE_EMF").is_ok_and(|v| v == "1" || v == "true");
    let worker = Worker::new(
        env,
        WorkerOptions {
            emf,
            ..WorkerOptions::default()
        },
    );
    tracing::info!(queue = %worker.env.queue_url, "worker started");
    worker.run(shutdown_signal(), |_| {}).await?;
    tracing::info!("worker stopped");
    Ok(())
}
