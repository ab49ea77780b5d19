//! The SDK clients every call goes through: the SDK's own retries disabled (the storage retry
//! policy is the only one), connect and per-call timeouts set, so no call waits forever where
//! there is no invocation deadline.

use std::time::Duration;

use aws_config::SdkConfig;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;

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

/// A DynamoDB client configuration from `conf` with the SDK's retries disabled (this module
/// is the only retry policy) and connect and per-call timeouts set, so no call waits forever
/// where there is no invocation deadline. Override the endpoint on it if needed, then
/// `build()`.
pub fn dynamodb_config(conf: &SdkConfig) -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::from(conf)
        .retry_config(RetryConfig::disabled())
        .timeout_config(timeouts(DYNAMODB_ATTEMPT_TIMEOUT))
}

/// An SQS client configuration from `conf` with the SDK's retries disabled and connect and
/// per-call timeouts set.
pub fn sqs_config(conf: &SdkConfig) -> aws_sdk_sqs::config::Builder {
    aws_sdk_sqs::config::Builder::from(conf)
        .retry_config(RetryConfig::disabled())
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
