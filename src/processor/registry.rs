//! Handlers per job type, each with its own policy.
//!
//! A job type's policies come from [`Registry::handle_with`], else [`Registry::new`]'s defaults,
//! else (for [`Registry::default`]) the `TRIAGE_*` variables read at start-up. Code wins: it is
//! the more specific statement; a variable is a deployment-wide default.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::core::JobError;
use crate::core::breaker::BreakerConfig;
use crate::core::envelope::{EventBridgeTypes, Payload};
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
    /// When the handler is stopped (epoch ms); none without a fixed deadline (a worker's moves
    /// later while the heartbeat holds the message).
    pub deadline_ms: Option<u64>,
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<(), JobError>> + Send + 'static>>;
type ErasedHandler = dyn Fn(Payload, JobContext) -> BoxFuture + Send + Sync;

/// A registered job type: its handler and policies.
#[derive(Clone)]
pub struct Route {
    handler: Arc<ErasedHandler>,
    /// The retry policy for this job type.
    pub policy: RetryPolicy,
    /// The breaker settings for this job type.
    pub breaker: BreakerConfig,
    /// Registered with [`Registry::handle`]: follows the registry's defaults.
    inherits: bool,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("policy", &self.policy)
            .field("breaker", &self.breaker)
            .field("inherits", &self.inherits)
            .finish()
    }
}

impl Route {
    /// Runs the handler: decodes the payload (a decode failure is fatal) and calls the user's code.
    pub(crate) fn call(&self, payload: Payload, ctx: JobContext) -> BoxFuture {
        (self.handler)(payload, ctx)
    }
}

/// The job types a processor can run.
#[derive(Debug, Clone)]
pub struct Registry {
    routes: HashMap<String, Arc<Route>>,
    default_policy: RetryPolicy,
    default_breaker: BreakerConfig,
    /// The defaults are the runtime configuration's (see [`Registry::default`]).
    configured_defaults: bool,
    /// Job types with a completion marker, and how long each marker lives.
    done_markers: HashMap<String, Duration>,
    /// Job types of EventBridge events by `detail-type`.
    eventbridge_types: EventBridgeTypes,
}

impl Default for Registry {
    /// An empty registry whose defaults are the runtime's configuration: the `TRIAGE_*`
    /// policy and breaker variables, applied when the runtime starts
    /// ([`lambda::run`](crate::lambda::run), [`worker::run`](crate::worker::run), or the
    /// runtimes' start-up with a [`Config`](crate::config::Config)).
    /// Until then (and for a processor built without a configuration) they are
    /// [`RetryPolicy::default`] and [`BreakerConfig::default`], the values of unset variables.
    fn default() -> Self {
        Self {
            configured_defaults: true,
            ..Self::new(RetryPolicy::default(), BreakerConfig::default())
        }
    }
}

/// The longest a completion marker lives: the attempt ledger's own lifetime (SQS's longest
/// retention and a day), the most `TRIAGE_DONE_MARKER_TTL_S` accepts.
pub const MAX_DONE_MARKER_TTL: Duration = Duration::from_secs(15 * 24 * 3600);

/// A completion marker's lifetime within 1 s and [`MAX_DONE_MARKER_TTL`].
fn marker_ttl(ttl: Duration) -> Duration {
    ttl.clamp(Duration::from_secs(1), MAX_DONE_MARKER_TTL)
}

impl Registry {
    /// An empty registry with these defaults: job types registered with [`handle`](Self::handle)
    /// get them, and so do records that never reach a handler. They win over the `TRIAGE_*`
    /// variables (which [`Registry::default`] follows).
    pub fn new(default_policy: RetryPolicy, default_breaker: BreakerConfig) -> Self {
        Self {
            routes: HashMap::new(),
            default_policy,
            default_breaker,
            configured_defaults: false,
            done_markers: HashMap::new(),
            eventbridge_types: EventBridgeTypes::new(),
        }
    }

    /// Opts `job_type` in to a completion marker living `ttl`: after a success its ledger item
    /// is replaced by a marker saying the job id is done (one batched write per batch of
    /// successes), and a later delivery of the same job type and id while the marker lives (a
    /// duplicate delivery, a producer's re-send, a rerun after a lost delete) is deleted
    /// without running the handler. Off by default: without it a success makes no write.
    /// Costs one ledger read per batch holding such a job type, first deliveries included.
    /// Wins over `TRIAGE_DONE_MARKER_TYPES` / `TRIAGE_DONE_MARKER_TTL_S` for this job type.
    /// `ttl` is kept within 1 s and 15 days.
    pub fn done_marker(mut self, job_type: impl Into<String>, ttl: Duration) -> Self {
        self.done_markers.insert(job_type.into(), marker_ttl(ttl));
        self
    }

    /// Opts the listed job types in to a completion marker living `ttl`, unless code already
    /// chose one for them ([`done_marker`](Self::done_marker)). The runtimes call it at
    /// start-up with `TRIAGE_DONE_MARKER_TYPES` and `TRIAGE_DONE_MARKER_TTL_S`.
    pub fn configured_done_markers(mut self, job_types: &[String], ttl: Duration) -> Self {
        for t in job_types {
            self.done_markers.entry(t.clone()).or_insert(marker_ttl(ttl));
        }
        self
    }

    /// The lifetime of `job_type`'s completion marker, when it has one.
    pub fn done_marker_ttl(&self, job_type: &str) -> Option<Duration> {
        self.done_markers.get(job_type).copied()
    }

    /// Job types with a completion marker whose type has no handler (a typo in
    /// `TRIAGE_DONE_MARKER_TYPES`, say), sorted.
    pub fn unrouted_done_markers(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .done_markers
            .keys()
            .filter(|t| !self.routes.contains_key(*t))
            .map(String::as_str)
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether the defaults follow the runtime's configuration ([`Registry::default`]) rather
    /// than values given to [`Registry::new`].
    pub fn follows_configuration(&self) -> bool {
        self.configured_defaults
    }

    /// Applies a runtime configuration's policies as the defaults, when this registry follows
    /// the configuration ([`Registry::default`]): the default policy and breaker, and those of
    /// every job type registered with [`handle`](Self::handle). Policies given to
    /// [`Registry::new`] or [`handle_with`](Self::handle_with) are kept. The runtimes call it
    /// once, at start-up.
    pub fn configured(mut self, policy: &RetryPolicy, breaker: BreakerConfig) -> Self {
        if !self.configured_defaults {
            return self;
        }
        self.default_policy = policy.clone();
        self.default_breaker = breaker;
        for route in self.routes.values_mut().filter(|r| r.inherits) {
            let route = Arc::make_mut(route);
            route.policy = policy.clone();
            route.breaker = breaker;
        }
        self
    }

    /// Registers an async handler for `job_type` with the registry's default policies (for
    /// [`Registry::default`], the `TRIAGE_*` variables). The payload is decoded into `P`; a
    /// payload that does not decode is a fatal failure.
    pub fn handle<P, F, Fut>(self, job_type: impl Into<String>, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(P, JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let (policy, breaker) = (self.default_policy.clone(), self.default_breaker);
        self.insert(job_type.into(), policy, breaker, true, handler)
    }

    /// Registers an async handler with its own retry policy and breaker settings. They win
    /// over the registry's defaults and the `TRIAGE_*` variables.
    pub fn handle_with<P, F, Fut>(
        self,
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
        self.insert(job_type.into(), policy, breaker, false, handler)
    }

    fn insert<P, F, Fut>(
        mut self,
        job_type: String,
        policy: RetryPolicy,
        breaker: BreakerConfig,
        inherits: bool,
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
                let payload: P = payload.decode().map_err(|e| JobError::payload_decode(&e))?;
                handler(payload, ctx).await
            })
        });
        self.routes.insert(
            job_type,
            Arc::new(Route {
                handler: erased,
                policy,
                breaker,
                inherits,
            }),
        );
        self
    }

    /// Runs EventBridge events whose `detail-type` is `detail_type` as `job_type`, with the
    /// event's `detail` as the payload (and the event's `id` as the job id). Without a mapping,
    /// an event whose `detail` is an envelope runs as that envelope, and any other runs as its
    /// `detail-type`, verbatim. Mappings given here win over `TRIAGE_EVENTBRIDGE_TYPES` for the
    /// detail-types they name; the runtimes check them at start-up.
    pub fn eventbridge_type(mut self, detail_type: impl Into<String>, job_type: impl Into<String>) -> Self {
        self.eventbridge_types.insert(detail_type, job_type);
        self
    }

    /// Adds a configuration's EventBridge mappings (`TRIAGE_EVENTBRIDGE_TYPES`) for the
    /// detail-types this registry does not map itself. The runtimes call it once, at start-up,
    /// whatever the registry's defaults follow: a mapping is routing, not a default policy.
    pub fn with_configured_eventbridge_types(mut self, configured: &EventBridgeTypes) -> Self {
        self.eventbridge_types = std::mem::take(&mut self.eventbridge_types).or(configured);
        self
    }

    /// Job types of EventBridge events by `detail-type`.
    pub fn eventbridge_types(&self) -> &EventBridgeTypes {
        &self.eventbridge_types
    }

    /// The route for a job type.
    pub fn route(&self, job_type: &str) -> Option<&Route> {
        self.routes.get(job_type).map(Arc::as_ref)
    }

    /// The route for a job type, shared: a record keeps its own.
    pub(crate) fn shared_route(&self, job_type: &str) -> Option<Arc<Route>> {
        self.routes.get(job_type).cloned()
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn ok(_: serde_json::Value, _: JobContext) -> Result<(), JobError> {
        Ok(())
    }

    fn configured() -> (RetryPolicy, BreakerConfig) {
        let policy = RetryPolicy::builder().max_attempts(2).build().unwrap();
        let breaker = BreakerConfig::builder()
            .open_for(Duration::from_secs(7))
            .build()
            .unwrap();
        (policy, breaker)
    }

    #[test]
    fn the_configuration_is_the_default_registrys_default_and_code_wins_over_it() {
        let (policy, breaker) = configured();
        let own = RetryPolicy::builder().max_attempts(9).build().unwrap();
        let r = Registry::default()
            .handle("inherits", ok)
            .handle_with("own", own.clone(), BreakerConfig::default(), ok)
            .configured(&policy, breaker);
        assert_eq!(r.default_policy().max_attempts(), 2);
        let inherits = r.route("inherits").unwrap();
        assert_eq!(inherits.policy.max_attempts(), 2);
        assert_eq!(inherits.breaker.open_for(), Duration::from_secs(7));
        let own_route = r.route("own").unwrap();
        assert_eq!(own_route.policy.max_attempts(), 9);
        assert_eq!(own_route.breaker.open_for(), BreakerConfig::default().open_for());
    }

    /// Routes are shared between clones of a registry; configuring one changes no other.
    #[test]
    fn configuring_a_clone_leaves_the_original_as_it_was() {
        let (policy, breaker) = configured();
        let original = Registry::default().handle("inherits", ok);
        let clone = original.clone().configured(&policy, breaker);
        assert_eq!(clone.route("inherits").unwrap().policy.max_attempts(), 2);
        assert_eq!(
            original.route("inherits").unwrap().policy.max_attempts(),
            RetryPolicy::default().max_attempts()
        );
    }

    #[test]
    fn eventbridge_mappings_in_code_win_over_the_configuration() {
        let configured = EventBridgeTypes::parse("A=env.a;B=env.b").unwrap();
        for r in [
            Registry::default(),
            Registry::new(RetryPolicy::default(), BreakerConfig::default()),
        ] {
            let r = r
                .eventbridge_type("A", "code.a")
                .with_configured_eventbridge_types(&configured);
            assert_eq!(r.eventbridge_types().get("A"), Some("code.a"));
            assert_eq!(r.eventbridge_types().get("B"), Some("env.b"));
        }
    }

    #[test]
    fn defaults_given_to_new_win_over_the_configuration() {
        let (policy, breaker) = configured();
        let mine = RetryPolicy::builder().max_attempts(4).build().unwrap();
        let r = Registry::new(mine, BreakerConfig::default())
            .handle("t", ok)
            .configured(&policy, breaker);
        assert!(!r.follows_configuration());
        assert_eq!(r.default_policy().max_attempts(), 4);
        assert_eq!(r.route("t").unwrap().policy.max_attempts(), 4);
    }

    #[test]
    fn done_markers_are_off_by_default_and_code_wins_over_the_configuration() {
        let r = Registry::default()
            .handle("a", ok)
            .handle("b", ok)
            .handle("c", ok);
        assert_eq!(r.done_marker_ttl("a"), None, "off by default");
        let r = r
            .done_marker("a", Duration::from_secs(60))
            .configured_done_markers(&["a".into(), "b".into(), "typo".into()], Duration::from_secs(600));
        assert_eq!(r.done_marker_ttl("a"), Some(Duration::from_secs(60)));
        assert_eq!(r.done_marker_ttl("b"), Some(Duration::from_secs(600)));
        assert_eq!(r.done_marker_ttl("c"), None);
        assert_eq!(r.unrouted_done_markers(), vec!["typo"]);
    }

    #[test]
    fn a_done_marker_lives_at_most_fifteen_days() {
        let r = Registry::default()
            .handle("a", ok)
            .handle("b", ok)
            .done_marker("a", Duration::MAX)
            .configured_done_markers(&["b".into()], Duration::from_secs(u64::MAX / 2));
        assert_eq!(r.done_marker_ttl("a"), Some(MAX_DONE_MARKER_TTL));
        assert_eq!(r.done_marker_ttl("b"), Some(MAX_DONE_MARKER_TTL));
        let r = Registry::default()
            .handle("a", ok)
            .done_marker("a", Duration::ZERO);
        assert_eq!(r.done_marker_ttl("a"), Some(Duration::from_secs(1)));
    }
}
