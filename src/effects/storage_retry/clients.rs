//! The SDK clients every call goes through: the SDK's own retries disabled (the storage retry
//! policy is the only one), connect and per-call timeouts set, so no call waits forever where
//! there is no invocation deadline.

use std::time::Duration;

use aws_config::SdkConfig;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_smithy_http_client::tls;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::runtime_components::{RuntimeComponents, RuntimeComponentsBuilder};
use aws_smithy_types::config_bag::ConfigBag;
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;

/// Longest wait for a connection to be made.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest wait for one DynamoDB call's answer (a stalled call is then retried as a timeout).
pub const DYNAMODB_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for one SQS call's answer: above the 20 s of a long-polling receive.
pub const SQS_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

fn timeouts(attempt: Duration) -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(attempt)
        .build()
}

/// An HTTPS client (the SDK's default: hyper, rustls with aws-lc, the system's root
/// certificates) for the SDK clients of one environment: [`sdk_config`](crate::runtime::env::sdk_config)
/// puts one in the configuration it loads, and every client built from that configuration
/// shares it. Clients with the same connect and read timeouts share one connector, its
/// connection pool and its trust store: the root certificates are parsed once per connector,
/// at the first request, instead of once per client built and again per connector. Its
/// connections belong to the Tokio runtime they were made on: build one per runtime.
pub fn http_client() -> SharedHttpClient {
    SharedHttpClient::new(OneTrustStore(https()))
}

/// The SDK's HTTPS client inside [`http_client`].
fn https() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
        .build_https()
}

/// Loads the system's root certificates now, on a blocking thread. The first request would
/// load them on a runtime thread, blocking for milliseconds whatever else that thread runs
/// (at a cold start: the poll for the first event).
pub async fn load_root_certificates() {
    let _ = tokio::task::spawn_blocking(|| {
        // Builds and drops one connector, which reads the certificates once per process.
        https().validate_base_client_config(
            &RuntimeComponentsBuilder::new("load_root_certificates"),
            &ConfigBag::base(),
        )
    })
    .await;
}

/// The SDK's HTTPS client without its check at client construction, which builds and drops
/// a connector (parsing the root certificates) for every SDK client: here the first request
/// builds the one connector the clients share.
#[derive(Debug)]
struct OneTrustStore(SharedHttpClient);

impl HttpClient for OneTrustStore {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        self.0.http_connector(settings, components)
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        self.0.connector_metadata()
    }
}

/// A DynamoDB client configuration from `conf` with the SDK's retries disabled (this module
/// is the only retry policy) and connect and per-call timeouts set, so no call waits forever
/// where there is no invocation deadline. Override the endpoint on it if needed, then
/// `build()`.
pub fn dynamodb_config(conf: &SdkConfig) -> aws_sdk_dynamodb::config::Builder {
    let mut b = aws_sdk_dynamodb::config::Builder::from(conf);
    if conf.http_client().is_none() {
        b.set_http_client(Some(http_client()));
    }
    b.retry_config(RetryConfig::disabled())
        .timeout_config(timeouts(DYNAMODB_ATTEMPT_TIMEOUT))
}

/// An SQS client configuration from `conf` with the SDK's retries disabled and connect and
/// per-call timeouts set.
pub fn sqs_config(conf: &SdkConfig) -> aws_sdk_sqs::config::Builder {
    let mut b = aws_sdk_sqs::config::Builder::from(conf);
    if conf.http_client().is_none() {
        b.set_http_client(Some(http_client()));
    }
    b.retry_config(RetryConfig::disabled())
        .timeout_config(timeouts(SQS_ATTEMPT_TIMEOUT))
}

/// A DynamoDB client with the SDK's retries disabled. Build it once per environment.
#[cfg(feature = "internals")]
pub fn dynamodb_client(conf: &SdkConfig) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(dynamodb_config(conf).build())
}

/// An SQS client with the SDK's retries disabled. Build it once per environment.
#[cfg(feature = "internals")]
pub fn sqs_client(conf: &SdkConfig) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::from_conf(sqs_config(conf).build())
}
