//! Handlers per job type, each with its own policy.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::core::JobError;
use crate::core::breaker::BreakerConfig;
use crate::core::policy::RetryPolicy;

/// What a handler knows about the job it runs, besides its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobContext {
    /// The job id (envelope `id`, else the SQS message id).
    pub job_id: String,
    /// The job type.
    pub job_type: String,
    /// The SQS message id of this delivery.
    pub message_id: String,
    /// This execution's number, 1 for the first.
    pub attempt: u32,
    /// The policy's attempt limit.
    pub max_attempts: u32,
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<(), JobError>> + Send + 'static>>;
type ErasedHandler = dyn Fn(serde_json::Value, JobContext) -> BoxFuture + Send + Sync;

/// A registered job type: its handler and policies.
#[derive(Clone)]
pub struct Route {
    handler: Arc<ErasedHandler>,
    /// The retry policy for this job type.
    pub policy: RetryPolicy,
    /// The breaker settings for this job type.
    pub breaker: BreakerConfig,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("policy", &self.policy)
            .field("breaker", &self.breaker)
            .finish()
    }
}

impl Route {
    /// Runs the handler: decodes the payload (a decode failure is fatal) and calls the user's code.
    pub(crate) fn call(&self, payload: serde_json::Value, ctx: JobContext) -> BoxFuture {
        (self.handler)(payload, ctx)
    }
}

/// The job types a processor can run.
#[derive(Debug, Clone)]
pub struct Registry {
    routes: HashMap<String, Route>,
    default_policy: RetryPolicy,
    default_breaker: BreakerConfig,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new(RetryPolicy::default(), BreakerConfig::default())
    }
}

impl Registry {
    /// An empty registry; job types registered later get these policies unless they set their own.
    pub fn new(default_policy: RetryPolicy, default_breaker: BreakerConfig) -> Self {
        Self {
            routes: HashMap::new(),
            default_policy,
            default_breaker,
        }
    }

    /// Registers an async handler for `job_type` with the default policies. The payload is
    /// decoded into `P`; a payload that does not decode is a fatal failure.
    pub fn handle<P, F, Fut>(self, job_type: impl Into<String>, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(P, JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let (policy, breaker) = (self.default_policy.clone(), self.default_breaker);
        self.handle_with(job_type, policy, breaker, handler)
    }

    /// Registers an async handler with its own retry policy and breaker settings.
    pub fn handle_with<P, F, Fut>(
        mut self,
        job_type: impl Into<String>,
        policy: RetryPolicy,
        breaker: BreakerConfig,
        handler: F,
    ) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(P, JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let erased: Arc<ErasedHandler> = Arc::new(move |payload, ctx| {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                let payload: P = serde_json::from_value(payload).map_err(|e| JobError::payload_decode(&e))?;
                handler(payload, ctx).await
            })
        });
        self.routes.insert(
            job_type.into(),
            Route {
                handler: erased,
                policy,
                breaker,
            },
        );
        self
    }

    /// The route for a job type.
    pub fn route(&self, job_type: &str) -> Option<&Route> {
        self.routes.get(job_type)
    }

    /// The policy used for records that never reach a handler (invalid, unknown type).
    pub fn default_policy(&self) -> &RetryPolicy {
        &self.default_policy
    }

    /// Registered job types.
    pub fn job_types(&self) -> impl Iterator<Item = &str> {
        self.routes.keys().map(String::as_str)
    }

    /// Checks every policy against the queue's retention period (start-up validation).
    pub fn check_retention(&self, retention: std::time::Duration) -> Result<(), crate::core::PolicyError> {
        self.default_policy.check_retention(retention)?;
        self.routes.iter().try_for_each(|(job_type, r)| {
            r.policy.check_retention(retention)?;
            if r.breaker.open_for() >= retention {
                return Err(crate::core::PolicyError::BreakerOutlivesRetention {
                    job_type: job_type.clone(),
                    open_for: r.breaker.open_for(),
                    retention,
                });
            }
            Ok(())
        })
    }
}
