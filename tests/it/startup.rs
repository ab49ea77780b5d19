//! What start-up calls, and the DLQ's size limit without a start-up read: configured
//! (`TRIAGE_DLQ_MAX_BYTES`, as the stacks set it) or learned at the first DLQ send.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageAttributeValue, QueueAttributeName};
use serde_json::{Value, json};
use sqs_triage::config::Config;
use sqs_triage::core::JobError;
use sqs_triage::demo::chaos;
use sqs_triage::effects::dlq::{attribute_size, failure_record};
use sqs_triage::effects::storage_retry::{dynamodb_config, sqs_config};
use sqs_triage::processor::registry::{JobContext, Registry};
use sqs_triage::runtime::env::{Environment, build_with};
use sqs_triage::runtime::worker::{Worker, WorkerOptions};
use support::fault_proxy::{Fault, FaultProxy, FaultRule};

/// A job type whose handler fails fatally with an error text as long as its payload says.
const BIG_ERROR: &str = "startup.big-error";
/// The DLQ's real size in these tests: far below the 256 KiB assumed while it is unknown.
const DLQ_BYTES: usize = 2_048;

struct Rig {
    sqs: aws_sdk_sqs::Client,
    proxy: FaultProxy,
    queue_url: String,
    dlq_url: String,
    table: String,
}

/// Fresh queues and table, the DLQ taking [`DLQ_BYTES`], and a proxy in front of SQS.
async fn rig(name: &str) -> Rig {
    let created = support::fresh_resources(name, false).await;
    let sqs = support::sqs_client().await;
    sqs.set_queue_attributes()
        .queue_url(&created.dlq_url)
        .attributes(QueueAttributeName::MaximumMessageSize, DLQ_BYTES.to_string())
        .send()
        .await
        .unwrap();
    Rig {
        sqs,
        proxy: FaultProxy::start(&support::sqs_endpoint()),
        queue_url: created.queue_url,
        dlq_url: created.dlq_url,
        table: created.table,
    }
}

impl Rig {
    /// Counts (as a fault of zero delay) every `GetQueueAttributes` of the DLQ from now on.
    fn count_dlq_reads(&self) {
        self.proxy.clear_faults();
        self.proxy.add_rule(FaultRule {
            ops: Some(vec!["GetQueueAttributes".into()]),
            body_contains: Some(self.dlq_url.clone()),
            fault: Fault::Delay(Duration::ZERO),
            times: None,
        });
    }

    fn dlq_reads(&self) -> u64 {
        self.proxy.faults().get("Delay").copied().unwrap_or(0)
    }

    async fn build(&self, vars: &[(&str, &str)]) -> Environment {
        let mut all = vec![
            ("TRIAGE_QUEUE_URL", self.queue_url.as_str()),
            ("TRIAGE_DLQ_URL", self.dlq_url.as_str()),
            ("TRIAGE_TABLE", self.table.as_str()),
        ];
        all.extend_from_slice(vars);
        let config =
            Config::from_lookup(&|k| all.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned()))
                .unwrap();
        let registry = chaos::register(
            Registry::new(config.policy.clone(), config.breaker),
            config.policy.clone(),
            config.breaker,
        )
        .handle(BIG_ERROR, |p: Value, _ctx: JobContext| async move {
            let n = p["error_bytes"].as_u64().unwrap_or(10) as usize;
            Err::<(), _>(JobError::fatal("E".repeat(n)))
        });
        let sdk = support::sdk_config().await;
        build_with(
            &config,
            registry,
            sqs_config(&sdk).endpoint_url(self.proxy.url()),
            dynamodb_config(&sdk),
        )
        .await
        .unwrap()
    }

    /// Sends `body`, then one worker poll (receive, process, delete what is settled).
    async fn run(&self, env: &Environment, body: &str) {
        self.sqs
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .send()
            .await
            .unwrap();
        let worker = Worker::new(
            env.clone(),
            WorkerOptions {
                wait: Duration::from_secs(2),
                max_messages: 10,
                emf: false,
            },
        );
        worker.poll_once().await.unwrap().expect("a batch");
    }

    async fn dlq(&self) -> Vec<Message> {
        support::read_all(&self.sqs, &self.dlq_url, 300, 2).await
    }
}

fn big_error(id: &str) -> String {
    json!({"type": BIG_ERROR, "id": id, "payload": {"error_bytes": DLQ_BYTES * 4}}).to_string()
}

fn ok(id: &str) -> String {
    json!({"type": chaos::CHAOS, "id": id, "payload": {"outcome": "ok"}}).to_string()
}

fn size_of(m: &Message) -> usize {
    let attrs: std::collections::HashMap<String, MessageAttributeValue> =
        m.message_attributes().cloned().unwrap_or_default();
    m.body().unwrap().len() + attrs.iter().map(|(k, v)| attribute_size(k, v)).sum::<usize>()
}

/// The copy of a big error: in the DLQ, within its real limit, with its record cut to fit.
fn assert_fits(copies: &[Message]) {
    assert_eq!(copies.len(), 1, "one copy");
    let copy = &copies[0];
    assert!(size_of(copy) <= DLQ_BYTES, "{} > {DLQ_BYTES}", size_of(copy));
    let attrs = copy.message_attributes().cloned().unwrap_or_default();
    let record = failure_record(&attrs)
        .expect("a failure record")
        .expect("it parses");
    assert!(record.error.ends_with("[truncated]"), "{}", record.error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_dlq_size_configured_start_up_reads_nothing_from_the_dlq() {
    let r = rig("start-conf").await;
    r.count_dlq_reads();
    let env = r.build(&[("TRIAGE_DLQ_MAX_BYTES", &DLQ_BYTES.to_string())]).await;
    assert_eq!(r.dlq_reads(), 0, "no DLQ read at start-up");
    // What start-up still calls: the source queue's attributes (retention, visibility timeout,
    // redrive policy) and the table probe.
    assert_eq!(
        env.calls.snapshot(),
        BTreeMap::from([
            ("DynamoDB.GetItem".to_owned(), 1),
            ("SQS.GetQueueAttributes".to_owned(), 1),
        ]),
    );
    assert!(env.startup_warnings.is_empty(), "{:?}", env.startup_warnings);

    // The configured limit sizes the copies, and no read happens at the first DLQ send either.
    r.run(&env, &big_error("conf-1")).await;
    assert_fits(&r.dlq().await);
    assert_eq!(r.dlq_reads(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dlq_size_is_learned_at_the_first_dlq_send_when_start_up_could_not_read_it() {
    let r = rig("start-lazy").await;
    r.proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(r.dlq_url.clone()),
        fault: Fault::Throttle,
        times: None,
    });
    let env = r.build(&[]).await;
    assert!(
        env.startup_warnings
            .iter()
            .any(|w| w.contains("TRIAGE_DLQ_URL") && w.contains("first DLQ send")),
        "{:?}",
        env.startup_warnings
    );
    r.count_dlq_reads();

    // A batch with nothing for the DLQ reads nothing.
    r.run(&env, &ok("lazy-ok")).await;
    assert_eq!(r.dlq_reads(), 0, "no read before a DLQ send");
    // The first copy is sized for the DLQ's real limit (the fallback, 256 KiB, is more than
    // the DLQ takes: sized for it, the copy would be refused).
    r.run(&env, &big_error("lazy-1")).await;
    assert_fits(&r.dlq().await);
    assert_eq!(r.dlq_reads(), 1, "read once, at the first DLQ send");
    // And kept.
    r.run(&env, &big_error("lazy-2")).await;
    assert_fits(&r.dlq().await);
    assert_eq!(r.dlq_reads(), 1, "kept");
}

/// A DLQ that never answers the size read at the first DLQ send: the read ends with the
/// batch's settle deadline, the copy is sized for the fallback, and the batch still settles
/// before its deadline instead of running into the function's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_dlq_size_read_still_settles_the_batch_by_its_deadline() {
    let r = rig("start-stall").await;
    r.proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(r.dlq_url.clone()),
        fault: Fault::Throttle,
        times: None,
    });
    let env = r.build(&[]).await;
    r.proxy.clear_faults();
    r.proxy.add_rule(FaultRule {
        ops: Some(vec!["GetQueueAttributes".into()]),
        body_contains: Some(r.dlq_url.clone()),
        fault: Fault::Delay(Duration::from_secs(120)),
        times: None,
    });
    r.sqs
        .send_message()
        .queue_url(&r.queue_url)
        .message_body(big_error("stall-1"))
        .send()
        .await
        .unwrap();
    let batch = r
        .sqs
        .receive_message()
        .queue_url(&r.queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(2)
        .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(batch.len(), 1);
    let records = batch
        .into_iter()
        .map(sqs_triage::processor::Incoming::from_sdk)
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    // The guard is far past the deadline and far short of the stalled read: only a read
    // without the batch's deadline reaches it.
    let outcome = tokio::time::timeout(
        Duration::from_secs(40),
        env.processor.process(records, Some(deadline)),
    )
    .await
    .expect("the batch settled while the DLQ's size read was stalled");
    assert_eq!(outcome.records.len(), 1);
}
