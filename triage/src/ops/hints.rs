//! What an operator should do about a failure: every piece of CLI advice, once.
//!
//! Errors from the layers below carry facts (the call, the resource, the AWS code); the
//! operator commands turn them into one line that says what to do, with these texts.

/// A DynamoDB table that does not exist.
pub(crate) fn table_missing(table: &str) -> String {
    format!("table {table} does not exist: run `triage setup` or check TRIAGE_TABLE")
}

/// A queue that does not exist; `var` is the variable or flag that named it.
pub(crate) fn queue_missing(url: &str, var: &str) -> String {
    format!("queue {url} does not exist: run `triage setup` or check {var}")
}

/// A queue that does not exist, when the call named none the operator gave.
pub(crate) const QUEUE_MISSING: &str = "queue does not exist: run `triage setup` or check the queue name";

/// A variable that is not set.
pub fn missing_var(var: &str, flag: &str) -> String {
    format!("{var} is not set: pass {flag} or export {var} (see `triage setup`)")
}

/// No region configured.
pub(crate) const NO_REGION: &str = "AWS_REGION is not set: export AWS_REGION (for the local stack: \
                             eval \"$(bash infra/local/stack.sh env)\")";

/// No credentials for `service`.
pub(crate) fn no_credentials(service: &str) -> String {
    format!(
        "no AWS credentials for {service}: export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY \
         or AWS_PROFILE (for the local stack: eval \"$(bash infra/local/stack.sh env)\")"
    )
}

/// `service` at `endpoint` cannot be reached; `custom_endpoint` when an endpoint variable
/// points somewhere else than AWS (the local stack, usually).
pub fn unreachable(service: &str, endpoint: &str, custom_endpoint: bool) -> String {
    let hint = if custom_endpoint {
        "is the local stack running (`bash infra/local/stack.sh start`)?"
    } else {
        "check the network, AWS_REGION and AWS_ENDPOINT_URL"
    };
    format!("cannot reach {service} at {endpoint}: {hint}")
}
