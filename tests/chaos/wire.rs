//! What the product's calls came to on the wire, per message and per job: the evidence the
//! accounting needs to bound DLQ duplicates, late counts and repeated executions by the faults
//! a scenario injected, instead of taking them as they come.
//!
//! The router ([`super::router`]) logs every product call it forwards, and the local event
//! source mapping ([`super::lambda`]) logs its own receives, deletes and invocations. Each
//! event gets a number from one counter, so events are ordered across both.
//!
//! A call's outcome, seen from the router: answered by the emulator (definite), answered by
//! the fault proxy (`x-amzn-requestid: fault-proxy-…`: never forwarded, so it did not land),
//! reset (in the chaos run only the fault proxy's `Reset` closes a connection, also before
//! forwarding), or **abandoned**: the product stopped waiting (a try's time or a deadline ran
//! out, or its process died) while the call was forwarded, so it may have landed unheard.
//!
//! From the log, per job ([`Witness`]):
//! - **handed twice**: the queue handed its message to two receives in flight at once (the
//!   second asked for before the first was answered): the queue's own duplicate delivery.
//!   moto's receive checks and marks a message in two steps without a lock, so two concurrent
//!   receives can both take it; SQS's at-least-once delivery allows the same.
//! - **came back**: a delivery of its message that its previous holder did not give back. The
//!   previous receipt handle was used after the new receive (two holders at once: the
//!   visibility timeout ran out under a live holder), or its last use before it was a delete
//!   (which did not take: failed, unanswered, or made with a stale handle) or a visibility
//!   change that failed, or its holder died with it (a killed process, an invocation that
//!   timed out or failed). A message given back on purpose (a visibility change SQS accepted,
//!   or none at all from a live holder) comes back regularly.
//! - **twice**: the mapping handed its delivery to two environments at once.
//! - **short**: an invocation with a short deadline left its delivery unsettled (reported in
//!   `batchItemFailures`), so its count may not have been sent.
//! - **unsure sends**: DLQ sends naming it that may have landed without an answer.
//! - **unsure counts**: ledger writes naming it that were faulted, reset or abandoned, so the
//!   count was retried, landed late or not at all.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// The source of the events the event source mapping logs.
pub const ESM: u32 = u32::MAX;

#[derive(Debug, Default)]
pub struct WireLog {
    seq: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    receives: Vec<Receive>,
    /// Uses of each receipt handle, in the order sent.
    ops: HashMap<String, Vec<Op>>,
    /// Handles whose holder died with them (an invocation without an answer): when.
    lost_holder: HashMap<String, u64>,
    /// Sources (a process's router) killed, and when.
    kills: HashMap<u32, u64>,
    /// Message ids handed to two environments at once, and how often.
    twice: HashMap<String, u32>,
    /// Message ids an invocation with a short deadline left unsettled, and how often.
    short: HashMap<String, u32>,
    /// (queue name, job id) of each entry of a send that may have landed unanswered.
    unsure_sends: Vec<(String, Option<String>)>,
    /// Every string of each DynamoDB write that was faulted, reset or abandoned.
    unsure_writes: Vec<Vec<String>>,
    /// Tries per outcome, for the notes.
    abandoned: u64,
    /// Receives abandoned while forwarded: (sent, given up, source). Messages the emulator
    /// handed to one stay hidden for its visibility timeout, held by no one.
    abandoned_receives: Vec<(u64, u64, u32)>,
    /// Moments of the run, for the traces.
    marks: Vec<(u64, String)>,
}

#[derive(Debug, Clone)]
struct Receive {
    /// When the receive was asked for.
    sent: u64,
    /// When its answer came.
    seq: u64,
    source: u32,
    queue: String,
    message_id: String,
    handle: String,
    job: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct Op {
    seq: u64,
    delete: bool,
    ok: bool,
}

/// What a forwarded call came to.
pub enum Answer<'a> {
    /// An HTTP answer; `injected` when the fault proxy made it up.
    Http {
        status: u16,
        injected: bool,
        body: &'a [u8],
    },
    /// The connection closed without an answer before the call was forwarded.
    Reset,
}

/// A product call in flight through the router: logged when it ends (or as abandoned when
/// the router stops waiting for it because the product went away).
pub struct Call {
    log: Arc<WireLog>,
    seq: u64,
    source: u32,
    req: Req,
    done: bool,
}

enum Req {
    Receive {
        queue: String,
    },
    Handles {
        delete: bool,
        entries: Vec<(Option<String>, String)>,
    },
    Send {
        queue: String,
        entries: Vec<(Option<String>, Option<String>)>,
    },
    Write {
        strings: Vec<String>,
    },
    Other,
}

/// Per job, the events that can explain a DLQ duplicate, a late count or a repeated execution.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Witness {
    pub handed_twice: u32,
    pub came_back: u32,
    /// Of `came_back`, the returns whose previous holder may have closed the job's ledger
    /// first (it deleted the message, or died holding it): the next delivery may start
    /// again from attempt 1.
    pub came_back_closed: u32,
    pub twice: u32,
    pub short: u32,
    pub unsure_sends: u32,
    pub unsure_counts: u32,
}

fn queue_name(url: &str) -> String {
    url.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(url)
        .to_owned()
}

/// The job id of a `triage.chaos` body (`{"type":…,"id":…,…}`), if it has one.
fn job_of(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    v.get("id")?.as_str().map(str::to_owned)
}

fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
        Value::Object(o) => o.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

fn ids(answer: &Value, key: &str) -> HashSet<String> {
    answer
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("Id")?.as_str().map(str::to_owned))
        .collect()
}

fn entries(req: &Value) -> Vec<Value> {
    req.get("Entries")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key)?.as_str().map(str::to_owned)
}

const DDB_WRITES: [&str; 8] = [
    "BatchExecuteStatement",
    "ExecuteStatement",
    "ExecuteTransaction",
    "UpdateItem",
    "PutItem",
    "DeleteItem",
    "BatchWriteItem",
    "TransactWriteItems",
];

impl WireLog {
    pub fn new() -> Arc<WireLog> {
        Arc::new(WireLog::default())
    }

    /// The next event number.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call the router is about to forward: `target` is its `X-Amz-Target`.
    pub fn begin(self: &Arc<Self>, source: u32, target: &str, body: &[u8]) -> Call {
        let (service, op) = target.rsplit_once('.').unwrap_or(("", target));
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let queue = || text(&v, "QueueUrl").map(|u| queue_name(&u)).unwrap_or_default();
        let handle = || text(&v, "ReceiptHandle").unwrap_or_default();
        let req = if service.starts_with("DynamoDB") {
            if DDB_WRITES.contains(&op) {
                let mut out = Vec::new();
                strings(&v, &mut out);
                Req::Write { strings: out }
            } else {
                Req::Other
            }
        } else {
            match op {
                "ReceiveMessage" => Req::Receive { queue: queue() },
                "DeleteMessage" | "ChangeMessageVisibility" => Req::Handles {
                    delete: op == "DeleteMessage",
                    entries: vec![(None, handle())],
                },
                "DeleteMessageBatch" | "ChangeMessageVisibilityBatch" => Req::Handles {
                    delete: op == "DeleteMessageBatch",
                    entries: entries(&v)
                        .iter()
                        .map(|e| (text(e, "Id"), text(e, "ReceiptHandle").unwrap_or_default()))
                        .collect(),
                },
                "SendMessage" => Req::Send {
                    queue: queue(),
                    entries: vec![(None, text(&v, "MessageBody").and_then(|b| job_of(&b)))],
                },
                "SendMessageBatch" => Req::Send {
                    queue: queue(),
                    entries: entries(&v)
                        .iter()
                        .map(|e| (text(e, "Id"), text(e, "MessageBody").and_then(|b| job_of(&b))))
                        .collect(),
                },
                _ => Req::Other,
            }
        };
        Call {
            log: self.clone(),
            seq: self.next_seq(),
            source,
            req,
            done: false,
        }
    }

    /// Messages a source received from `queue_url` with a receive asked for at `sent`:
    /// (message id, receipt handle, body).
    pub fn received<'a>(
        &self,
        source: u32,
        queue_url: &str,
        sent: u64,
        messages: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
    ) {
        let seq = self.next_seq();
        let queue = queue_name(queue_url);
        let mut inner = self.lock();
        for (message_id, handle, body) in messages {
            inner.receives.push(Receive {
                sent,
                seq,
                source,
                queue: queue.clone(),
                message_id: message_id.to_owned(),
                handle: handle.to_owned(),
                job: job_of(body),
            });
        }
    }

    /// Deletes the event source mapping sent at `seq`: (receipt handle, accepted).
    pub fn deleted(&self, seq: u64, entries: impl IntoIterator<Item = (String, bool)>) {
        let mut inner = self.lock();
        for (handle, ok) in entries {
            inner.ops.entry(handle).or_default().push(Op {
                seq,
                delete: true,
                ok,
            });
        }
    }

    /// Deliveries handed to two environments at once (message ids).
    pub fn twice<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.lock();
        for id in ids {
            *inner.twice.entry(id.to_owned()).or_default() += 1;
        }
    }

    /// Deliveries an invocation with a short deadline left unsettled (message ids).
    pub fn short<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.lock();
        for id in ids {
            *inner.short.entry(id.to_owned()).or_default() += 1;
        }
    }

    /// Receipt handles whose holder died with them (an invocation without an answer).
    pub fn holder_lost<'a>(&self, handles: impl IntoIterator<Item = &'a str>) {
        let seq = self.next_seq();
        let mut inner = self.lock();
        for h in handles {
            inner.lost_holder.insert(h.to_owned(), seq);
        }
    }

    /// A moment of the run, shown in [`trace`](Self::trace)s.
    pub fn mark(&self, what: &str) {
        let seq = self.next_seq();
        self.lock().marks.push((seq, what.to_owned()));
    }

    /// The deliveries of `job`'s messages, the uses of each receipt handle and the run's
    /// moments, in order: for the notes of a job the accounting cannot explain.
    pub fn trace(&self, job: &str) -> String {
        let inner = self.lock();
        let mut events: Vec<(u64, String)> = inner.marks.clone();
        for r in inner.receives.iter().filter(|r| r.job.as_deref() == Some(job)) {
            events.push((r.seq, format!("received by {} (asked #{})", r.source, r.sent)));
            for o in inner.ops.get(&r.handle).into_iter().flatten() {
                let what = if o.delete { "delete" } else { "visibility" };
                events.push((
                    o.seq,
                    format!("{what} of #{} {}", r.seq, if o.ok { "ok" } else { "failed" }),
                ));
            }
        }
        let first = events.iter().map(|e| e.0).min().unwrap_or(0);
        for (sent, gone, source) in inner.abandoned_receives.iter().filter(|a| a.1 >= first) {
            events.push((*gone, format!("receive #{sent} by {source} abandoned")));
        }
        events.sort();
        events
            .iter()
            .map(|(seq, what)| format!("#{seq} {what}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The process behind `source`'s router was killed (log it once the process is gone).
    pub fn killed(&self, source: u32) {
        let seq = self.next_seq();
        self.lock().kills.insert(source, seq);
    }

    /// Per job of the messages of queue `queue_url`, the events that can explain its
    /// duplicates (DLQ `dlq_name`); ledger writes naming `spare` (the oracle's table) are not
    /// the product's.
    pub fn witnesses(&self, queue_url: &str, dlq_name: &str, spare: &str) -> HashMap<String, Witness> {
        let queue = queue_name(queue_url);
        let inner = self.lock();
        let mut out: HashMap<String, Witness> = HashMap::new();
        let mut by_message: HashMap<&str, Vec<&Receive>> = HashMap::new();
        for r in inner.receives.iter().filter(|r| r.queue == queue) {
            by_message.entry(&r.message_id).or_default().push(r);
        }
        let mut job_of_message: HashMap<&str, &str> = HashMap::new();
        for (message_id, mut deliveries) in by_message {
            deliveries.sort_by_key(|r| r.seq);
            let Some(job) = deliveries.iter().find_map(|r| r.job.as_deref()) else {
                continue;
            };
            job_of_message.insert(message_id, job);
            let w = out.entry(job.to_owned()).or_default();
            for pair in deliveries.windows(2) {
                let (prev, next) = (pair[0], pair[1]);
                if next.sent < prev.seq && !inner.given_back(prev, next) {
                    // Asked for before the previous receive was answered, and not given back
                    // in between: the queue handed the message to two receives at once.
                    w.handed_twice += 1;
                } else if inner.came_back(prev, next) {
                    w.came_back += 1;
                    w.came_back_closed += u32::from(inner.may_have_closed(prev, next));
                }
            }
        }
        for (id, n) in &inner.twice {
            if let Some(job) = job_of_message.get(id.as_str()) {
                out.entry((*job).to_owned()).or_default().twice += n;
            }
        }
        for (id, n) in &inner.short {
            if let Some(job) = job_of_message.get(id.as_str()) {
                out.entry((*job).to_owned()).or_default().short += n;
            }
        }
        for (q, job) in &inner.unsure_sends {
            if let (true, Some(job)) = (q == dlq_name, job) {
                out.entry(job.clone()).or_default().unsure_sends += 1;
            }
        }
        let jobs: HashSet<&str> = job_of_message.values().copied().collect();
        for strings in &inner.unsure_writes {
            if strings.iter().any(|s| s.contains(spare)) {
                continue;
            }
            let named: HashSet<&str> = strings
                .iter()
                .filter_map(|s| jobs.get(s.as_str()).copied())
                .collect();
            for job in named {
                out.entry(job.to_owned()).or_default().unsure_counts += 1;
            }
        }
        out
    }

    /// One line of totals for the notes.
    pub fn summary(&self, w: &HashMap<String, Witness>) -> String {
        let sum = |f: fn(&Witness) -> u32| w.values().map(f).sum::<u32>();
        format!(
            "on the wire: {} handed to two receives at once, {} deliveries came back not given back ({} after a possible close), {} delivered twice, {} left unsettled by a \
             short deadline, {} DLQ copies sent without an answer, {} ledger writes faulted or unanswered \
             (per job named); {} product calls abandoned",
            sum(|w| w.handed_twice),
            sum(|w| w.came_back),
            sum(|w| w.came_back_closed),
            sum(|w| w.twice),
            sum(|w| w.short),
            sum(|w| w.unsure_sends),
            sum(|w| w.unsure_counts),
            self.lock().abandoned,
        )
    }
}

impl Inner {
    /// Whether `prev`'s holder gave the message back (a visibility change SQS accepted) before
    /// `next` was answered.
    fn given_back(&self, prev: &Receive, next: &Receive) -> bool {
        let ops = self.ops.get(&prev.handle).map_or(&[][..], Vec::as_slice);
        ops.iter()
            .filter(|o| o.seq < next.seq)
            .max_by_key(|o| o.seq)
            .is_some_and(|o| !o.delete && o.ok)
    }

    /// Whether delivery `next` of a message came back without `prev`'s holder giving it back.
    fn came_back(&self, prev: &Receive, next: &Receive) -> bool {
        let ops = self.ops.get(&prev.handle).map_or(&[][..], Vec::as_slice);
        // The old handle used after the new receive: two holders at once.
        let overlapped = ops.iter().any(|o| o.seq > next.seq);
        // Its last use before: a delete that did not take, or a visibility change refused.
        let last = ops.iter().filter(|o| o.seq < next.seq).max_by_key(|o| o.seq);
        let not_given_back = last.is_some_and(|o| o.delete || !o.ok);
        overlapped || not_given_back || self.died(prev, next)
    }

    /// Whether `prev`'s holder died holding the message before `next` was answered: killed
    /// or lost with it, and not having given it back (an accepted visibility change) first.
    fn died(&self, prev: &Receive, next: &Receive) -> bool {
        let lost = self
            .lost_holder
            .get(&prev.handle)
            .copied()
            .filter(|&at| at < next.seq);
        let killed = self
            .kills
            .get(&prev.source)
            .copied()
            .filter(|&at| prev.seq < at && at < next.seq);
        let Some(at) = lost.into_iter().chain(killed).min() else {
            return false;
        };
        let ops = self.ops.get(&prev.handle).map_or(&[][..], Vec::as_slice);
        let given_back = ops
            .iter()
            .filter(|o| o.seq < at)
            .max_by_key(|o| o.seq)
            .is_some_and(|o| !o.delete && o.ok);
        !given_back
    }

    /// Whether `prev`'s holder may have closed the job's ledger (a success's marker, or the
    /// forget after an accepted DLQ copy) before `next` read it: it deleted the message at
    /// some point, or died holding it.
    fn may_have_closed(&self, prev: &Receive, next: &Receive) -> bool {
        let ops = self.ops.get(&prev.handle).map_or(&[][..], Vec::as_slice);
        ops.iter().any(|o| o.delete) || self.died(prev, next)
    }
}

impl Call {
    /// The call's answer.
    pub fn answered(mut self, answer: Answer<'_>) {
        self.settle(Some(answer));
    }

    fn settle(&mut self, answer: Option<Answer<'_>>) {
        self.done = true;
        let log = self.log.clone();
        // Answered by the emulator with a 2xx; may have landed unheard; the 2xx answer (a
        // receive's messages are taken from any 2xx: the strict proxy answers some itself).
        let (landed_for_sure, maybe_landed, json) = match &answer {
            None => (false, true, Value::Null),
            Some(Answer::Reset) => (false, false, Value::Null),
            Some(Answer::Http {
                status,
                injected,
                body,
            }) => {
                let ok = (200..300).contains(status);
                let json = if ok {
                    serde_json::from_slice(body).unwrap_or(Value::Null)
                } else {
                    Value::Null
                };
                (ok && !injected, *status >= 500 && !injected, json)
            }
        };
        // A receive counts from when its answer passed, after every use sent before it.
        let received_at = log.next_seq();
        let mut inner = log.lock();
        if answer.is_none() {
            inner.abandoned += 1;
            if matches!(self.req, Req::Receive { .. }) {
                inner
                    .abandoned_receives
                    .push((self.seq, received_at, self.source));
            }
        }
        match std::mem::replace(&mut self.req, Req::Other) {
            Req::Receive { queue } => {
                for m in json
                    .get("Messages")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let (Some(message_id), Some(handle)) = (text(m, "MessageId"), text(m, "ReceiptHandle"))
                    else {
                        continue;
                    };
                    inner.receives.push(Receive {
                        sent: self.seq,
                        seq: received_at,
                        source: self.source,
                        queue: queue.clone(),
                        message_id,
                        handle,
                        job: text(m, "Body").and_then(|b| job_of(&b)),
                    });
                }
            }
            Req::Handles { delete, entries } => {
                let accepted = ids(&json, "Successful");
                for (id, handle) in entries {
                    let ok = landed_for_sure && id.as_ref().is_none_or(|id| accepted.contains(id));
                    inner.ops.entry(handle).or_default().push(Op {
                        seq: self.seq,
                        delete,
                        ok,
                    });
                }
            }
            Req::Send { queue, entries } => {
                let (accepted, failed) = (ids(&json, "Successful"), ids(&json, "Failed"));
                for (id, job) in entries {
                    // An entry a 2xx answer lists nowhere is sent again: it may have landed.
                    let unlisted = landed_for_sure
                        && id
                            .as_ref()
                            .is_some_and(|id| !accepted.contains(id) && !failed.contains(id));
                    if maybe_landed || unlisted {
                        inner.unsure_sends.push((queue.clone(), job));
                    }
                }
            }
            Req::Write { strings } => {
                // Faulted, reset or unanswered: retried, landed unheard, or not at all. A write
                // the emulator answered (a 4xx refusal included) is settled.
                let injected = matches!(answer, Some(Answer::Http { injected: true, .. }));
                if answer.is_none() || matches!(answer, Some(Answer::Reset)) || injected || maybe_landed {
                    inner.unsure_writes.push(strings);
                }
            }
            _ => {}
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.done {
            // The router stopped waiting: the product gave the call up while it was forwarded.
            self.settle(None);
        }
    }
}
