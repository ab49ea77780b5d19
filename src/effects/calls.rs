//! Counts the AWS requests a client sends, per operation, retries included. The demo and the
//! benchmarks report AWS calls per message with it; it changes nothing on the wire.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

/// An SDK interceptor counting requests per `Service.Operation`. Clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct CallCounter {
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl CallCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests sent so far, by `Service.Operation`.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// All requests sent so far.
    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }

    /// Back to zero.
    pub fn reset(&self) {
        if let Ok(mut m) = self.counts.lock() {
            m.clear();
        }
    }
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let name = cfg.load::<Metadata>().map_or_else(
            || "unknown".to_owned(),
            |m| format!("{}.{}", m.service(), m.name()),
        );
        if let Ok(mut m) = self.counts.lock() {
            *m.entry(name).or_default() += 1;
        }
        Ok(())
    }
}
