//! `dlq replay`: moves selected DLQ messages back to their source queue (or `--to`), with
//! fresh attempt ledgers. Sends first and deletes after: a crash in between leaves a
//! duplicate, never a loss.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use serde::Serialize;

use super::super::audit::{self, AuditEntry, AuditStatus};
use super::super::output::{Report, Table, progress};
use super::super::{Ctx, ErrorKind, OpsError, OpsResult, is_fifo, queue_arn, resolve_queue};
use super::list::{Group, group};
use super::read::{DlqMessage, Filter, ReadEnd, Sweep, approximate_count, delete, release, scan_limit_note};
use indicatif::ProgressBar;
use sqs_triage::clock::now_ms;
use sqs_triage::core::envelope::SQS_MAX_MESSAGE_BYTES;
use sqs_triage::effects::dlq::{group_for, original_attributes};
use sqs_triage::effects::queue_url::urls_name_one_queue;
use sqs_triage::effects::sqs::{Outgoing, Sqs, batches};

/// How `dlq replay` runs.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Which messages.
    pub filter: Filter,
    /// Target queue (URL, ARN or name) instead of each message's source queue.
    pub to: Option<String>,
    /// Move at most this many.
    pub limit: Option<usize>,
    /// Messages per second.
    pub rate: Option<f64>,
    /// Report what would move, move nothing.
    pub dry_run: bool,
    /// State table, for the fresh attempt ledgers (required unless `dry_run`).
    pub table: Option<String>,
    /// Draw a progress bar.
    pub progress: bool,
    /// Read at most this many DLQ messages.
    pub max_scan: usize,
    /// Set (e.g. on Ctrl-C) to stop after the batch in progress; what was not moved is
    /// released and reported.
    pub stop: Option<Arc<AtomicBool>>,
    /// How long each DLQ message read is held invisible; by default 60 s plus the time
    /// `rate` needs for a batch. A batch must be sent and deleted within it.
    pub hold: Option<Duration>,
}

/// Where replayed messages went.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCount {
    /// Target queue URL.
    pub queue_url: String,
    /// Messages sent there.
    pub count: usize,
}

/// A message that was selected but not moved, and why.
#[derive(Debug, Clone, Serialize)]
pub struct NotMoved {
    /// DLQ message id.
    pub message_id: String,
    /// Job id.
    pub job_id: String,
    /// Why.
    pub reason: String,
}

/// What `dlq replay` did.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// The DLQ.
    pub dlq_url: String,
    /// Nothing was moved.
    pub dry_run: bool,
    /// DLQ messages read.
    pub scanned: usize,
    /// Messages the filter (and limit) selected.
    pub selected: usize,
    /// Selected messages sent to their target (or that would be, in a dry run).
    pub moved: usize,
    /// Moved messages whose DLQ copy could not be deleted: they may run twice.
    pub delete_failed: usize,
    /// Attempt ledgers reset.
    pub ledgers_reset: usize,
    /// Sent per target queue.
    pub targets: Vec<TargetCount>,
    /// Selected messages by job type and class.
    pub groups: Vec<Group>,
    /// Selected messages that were not moved.
    pub not_moved: Vec<NotMoved>,
    /// Selected messages whose failure record names another job than their body: moved (or
    /// skipped) like the others, but only the body's job has its ledger reset.
    pub unverified: Vec<NotMoved>,
    /// Messages left in the DLQ, not selected: copies of jobs this run moved that were
    /// dead-lettered again while it ran (the same body, failed after the run started);
    /// replaying them would loop.
    pub repeated: usize,
    /// Stopped early by the operator.
    pub interrupted: bool,
    /// The DLQ was not read to the end: messages kept coming back faster than the sweep could
    /// hold them again, so messages that were in the DLQ may not have been read (nor moved).
    pub incomplete: bool,
    /// The read stopped at `--max-scan`: messages past them, if any, were not looked at.
    pub scan_limit_reached: bool,
    /// Wall time, in milliseconds.
    pub elapsed_ms: u64,
    /// The DLQ message ids sent to their target (none in a dry run); not in the JSON report,
    /// whose `moved` counts them.
    #[serde(skip)]
    pub moved_ids: Vec<String>,
    /// Whether the replay was audited (replays through an auditing context, not dry runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditStatus>,
}

impl Report for ReplayReport {
    fn human(&self) -> String {
        let verb = if self.dry_run { "would move" } else { "moved" };
        let mut out = format!(
            "{}{verb} {} of {} selected message(s) ({} read from the DLQ) in {:.1}s\n",
            if self.dry_run { "dry run: " } else { "" },
            self.moved,
            self.selected,
            self.scanned,
            self.elapsed_ms as f64 / 1000.0
        );
        if !self.targets.is_empty() {
            let mut t = Table::new(["TARGET", "COUNT"]).max_width(120);
            for c in &self.targets {
                t.row([c.queue_url.clone(), c.count.to_string()]);
            }
            out.push_str(&t.render());
        }
        if !self.groups.is_empty() {
            let mut t = Table::new(["TYPE", "CLASS", "SELECTED"]);
            for g in &self.groups {
                t.row([g.job_type.clone(), g.class.clone(), g.count.to_string()]);
            }
            out.push_str(&t.render());
        }
        if !self.dry_run {
            out.push_str(&format!("attempt ledgers reset: {}\n", self.ledgers_reset));
        }
        for n in &self.unverified {
            out.push_str(&format!(
                "unverified record: message {}: {} (only the body's job counts)\n",
                n.message_id, n.reason
            ));
        }
        for n in &self.not_moved {
            out.push_str(&format!(
                "not moved: job {} ({}): {}\n",
                n.job_id, n.message_id, n.reason
            ));
        }
        if self.repeated > 0 {
            out.push_str(&format!(
                "{} message(s) with the body of one already selected were left in the DLQ \
                 (dead-lettered again while the replay ran, or duplicates)\n",
                self.repeated
            ));
        }
        if self.delete_failed > 0 {
            out.push_str(&format!(
                "{} moved message(s) are still in the DLQ (delete failed): they may run twice\n",
                self.delete_failed
            ));
        }
        out + &scan_limit_note(self.scan_limit_reached, self.scanned)
    }

    fn problem(&self) -> Option<String> {
        if self.incomplete {
            return Some(format!(
                "the DLQ was not read to the end ({} message(s) read): messages that match may be \
                 left in it; run the command again",
                self.scanned
            ));
        }
        if self.dry_run {
            return None;
        }
        if self.interrupted {
            return Some(format!(
                "interrupted after moving {} of {} selected message(s); the rest are still in the DLQ",
                self.moved, self.selected
            ));
        }
        if self.moved < self.selected {
            return Some(format!(
                "{} of {} selected message(s) were not moved (see above); they are still in the DLQ",
                self.selected - self.moved,
                self.selected
            ));
        }
        (self.delete_failed > 0).then(|| {
            format!(
                "{} moved message(s) could not be deleted from the DLQ: run `triage dlq purge` for them",
                self.delete_failed
            )
        })
    }

    fn audit(&self) -> Option<&AuditStatus> {
        self.audit.as_ref()
    }
}

/// The slowest replay rate accepted, in messages per second (one message every 100 s).
pub const MIN_RATE: f64 = 0.01;

/// The fastest replay rate accepted, in messages per second (far above what one replay sends).
pub const MAX_RATE: f64 = 1000.0;

/// Paces sends to `rate` messages per second, starting with an empty bucket: n messages take
/// at least n / rate seconds.
struct Pacer {
    start: Instant,
    per_message: Option<Duration>,
    issued: u32,
}

impl Pacer {
    fn new(rate: Option<f64>) -> Self {
        Self {
            start: Instant::now(),
            per_message: rate.map(|r| Duration::from_secs_f64(1.0 / r)),
            issued: 0,
        }
    }

    async fn take(&mut self, n: usize) {
        let Some(per) = self.per_message else { return };
        self.issued += n as u32;
        tokio::time::sleep_until((self.start + per * self.issued).into()).await;
    }
}

pub(super) async fn check_table(ctx: &Ctx, table: &str) -> OpsResult<()> {
    ctx.ddb_call("DescribeTable", table, || {
        ctx.ddb.describe_table().table_name(table).send()
    })
    .await?;
    Ok(())
}

/// Checks the `--to` queue exists and is not the DLQ being read (`what` reads it: "replayed",
/// "edited"); returns its URL. A copy sent into its own DLQ goes back without its failure
/// record, and a replay would read it back as a new message and send it again.
pub(super) async fn check_to(ctx: &Ctx, to: &str, dlq_url: &str, what: &str) -> OpsResult<String> {
    let url = resolve_queue(ctx, to, "--to").await?;
    if urls_name_one_queue(&url, dlq_url) {
        return Err(OpsError::usage(format!(
            "--to names the DLQ being {what} ({dlq_url}): its messages go out of the DLQ; pass \
             the source queue or another queue, or leave --to out"
        )));
    }
    queue_arn(ctx, &url, "--to").await?;
    Ok(url)
}

/// The largest message `queue` takes (its `MaximumMessageSize`, body and attributes), read
/// once; SQS's largest when it cannot be read (the send then says what SQS thinks).
pub(super) async fn max_message_bytes(ctx: &Ctx, queue: &str) -> usize {
    let out = ctx
        .sqs_call("GetQueueAttributes", Some((queue, "the target queue")), || {
            ctx.sqs
                .get_queue_attributes()
                .queue_url(queue)
                .attribute_names(QueueAttributeName::MaximumMessageSize)
                .send()
        })
        .await;
    out.ok()
        .and_then(|o| o.attributes)
        .and_then(|a| a.get(&QueueAttributeName::MaximumMessageSize)?.parse().ok())
        .map_or(SQS_MAX_MESSAGE_BYTES, |n: usize| n.min(SQS_MAX_MESSAGE_BYTES))
}

/// Where a message's source queue comes from, for the messages that say why it is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceOrigin {
    /// The failure record the processor wrote.
    Record,
    /// SQS's `DeadLetterQueueSourceArn`: SQS's own redrive moved the message.
    Sqs,
}

impl SourceOrigin {
    fn who(self) -> &'static str {
        match self {
            SourceOrigin::Record => "the failure record",
            SourceOrigin::Sqs => "SQS's DeadLetterQueueSourceArn",
        }
    }
}

/// Why a message has no queue to go back to: the line, and the kind of failure for the exit
/// code. No source, or one that is not trusted, is a usage error (pass `--to`); a check that
/// could not be made keeps its own kind (a missing queue, SQS unreachable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NoTarget {
    /// What kind of failure.
    pub(super) kind: ErrorKind,
    /// The line, ending with what to do.
    pub(super) reason: String,
}

impl NoTarget {
    fn usage(reason: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Usage,
            reason: reason.into(),
        }
    }

    fn failed(e: OpsError) -> Self {
        // An unreachable SQS is not fixed by another queue: only the other failures say
        // `--to`.
        let reason = match e.kind {
            ErrorKind::Unreachable => e.message,
            _ => format!("{e}; pass --to QUEUE"),
        };
        Self { kind: e.kind, reason }
    }
}

/// Checks that `source` (a failure record's source queue, or the queue SQS says it
/// dead-lettered the message from) sends its dead letters to the DLQ `dlq_arn` (its
/// RedrivePolicy's `deadLetterTargetArn`); returns its URL. A record is only trusted to name
/// a queue that feeds this DLQ: anything else could be a producer's forgery pointing at any
/// queue the operator can write to. SQS's attribute gets the same check: the queue may have
/// been pointed at another DLQ since, and then this DLQ is not where its failures belong.
async fn verified_source(
    ctx: &Ctx,
    source: &str,
    origin: SourceOrigin,
    dlq_arn: &str,
) -> Result<String, NoTarget> {
    let who = origin.who();
    let url = resolve_queue(ctx, source, who).await.map_err(NoTarget::failed)?;
    let out = ctx
        .sqs_call("GetQueueAttributes", Some((&url, who)), || {
            ctx.sqs
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(QueueAttributeName::RedrivePolicy)
                .send()
        })
        .await
        .map_err(NoTarget::failed)?;
    let target = out
        .attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::RedrivePolicy))
        .and_then(|p| serde_json::from_str::<serde_json::Value>(&p).ok())
        .and_then(|p| p["deadLetterTargetArn"].as_str().map(str::to_owned));
    match target {
        Some(arn) if arn == dlq_arn => Ok(url),
        Some(arn) => Err(NoTarget::usage(format!(
            "{who} names source queue {url}, whose dead-letter queue is {arn}, not this DLQ: \
             the source is not trusted; pass --to QUEUE"
        ))),
        None => Err(NoTarget::usage(format!(
            "{who} names source queue {url}, which has no redrive policy naming this DLQ as \
             its dead-letter queue: the source is not trusted; pass --to QUEUE"
        ))),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Not selected, or selected but not moved: made visible again at the end.
    Held,
    /// Sent to its target and deleted from the DLQ.
    Moved,
    /// Sent to its target, but the DLQ delete failed: delete again if seen again.
    MovedUndeleted,
}

/// `dlq replay`: moves selected DLQ messages back to their source queue (or `--to`).
///
/// Without `--to`, a message goes back to its failure record's source queue (a message SQS
/// dead-lettered itself, without a record: the queue its `DeadLetterQueueSourceArn` names)
/// only when that queue's RedrivePolicy names this DLQ (checked once per queue); otherwise it stays and is
/// reported. The job whose ledger is reset is the one the body names (read as the processor
/// reads it), never the record's; a record that disagrees with its body is reported as
/// unverified.
pub async fn replay(ctx: &Ctx, dlq_url: &str, opts: &ReplayOptions) -> OpsResult<ReplayReport> {
    let checks = check_replay(ctx, dlq_url, opts).await?;
    let started = Instant::now();
    let mut run = ReplayRun::new(ctx, dlq_url, opts, checks.table, checks.to).await;
    let mut st = ReplayState::new(Sources::new(checks.dlq_arn), run.hold, is_fifo(dlq_url));
    let mut sweep = Sweep::new(ctx, dlq_url, run.hold, opts.max_scan);
    let moved = run.sweep_and_move(&mut st, &mut sweep).await;
    let end = sweep.end();
    let (incomplete, scan_limit_reached) = (end == ReadEnd::CutShort, end == ReadEnd::ScanLimit);
    run.bar.finish_and_clear();
    // Everything not moved goes back to visible, whatever happened above.
    let held: Vec<String> = st
        .fates
        .iter()
        .filter(|(_, f)| **f == Fate::Held)
        .filter_map(|(id, _)| st.handles.get(id).cloned())
        .collect();
    release(ctx, dlq_url, held).await;
    // What was moved is audited, also when an error stopped the replay part-way.
    let audit = match opts.dry_run {
        true => None,
        false => {
            audit::record_action(
                ctx,
                replay_entry(dlq_url, opts, &st, incomplete, moved.as_ref().err()),
            )
            .await
        }
    };
    if let Err(e) = moved {
        return Err(audit::error_with_status(e, audit.as_ref()));
    }
    let mut report = st.into_report(dlq_url, opts.dry_run, started, audit);
    report.interrupted = run.stopped();
    report.incomplete = incomplete;
    report.scan_limit_reached = scan_limit_reached;
    Ok(report)
}

/// What a replay checks before it touches the DLQ: its options, the table, the DLQ and `--to`.
struct ReplayChecks {
    table: Option<String>,
    dlq_arn: String,
    to: Option<String>,
}

/// Checks the options, then that the DLQ, the table and the `--to` queue exist, so a replay
/// fails before it touches the DLQ.
async fn check_replay(ctx: &Ctx, dlq_url: &str, opts: &ReplayOptions) -> OpsResult<ReplayChecks> {
    opts.filter.validate()?;
    if let Some(r) = opts.rate {
        if !(r.is_finite() && (MIN_RATE..=MAX_RATE).contains(&r)) {
            return Err(OpsError::usage(format!(
                "--rate must be a positive number of messages per second, from {MIN_RATE} to {MAX_RATE}: `{r}` is not"
            )));
        }
    }
    if opts.limit == Some(0) {
        return Err(OpsError::usage("--limit must be at least 1"));
    }
    let table = match (&opts.table, opts.dry_run) {
        (Some(t), _) => Some(t.clone()),
        (None, true) => None,
        (None, false) => return Err(OpsError::missing_var("TRIAGE_TABLE", "--table")),
    };
    let dlq_arn = queue_arn(ctx, dlq_url, "TRIAGE_DLQ_URL").await?;
    if let (Some(t), false) = (&table, opts.dry_run) {
        check_table(ctx, t).await?;
    }
    let to = match &opts.to {
        Some(q) => Some(check_to(ctx, q, dlq_url, "replayed").await?),
        None => None,
    };
    Ok(ReplayChecks { table, dlq_arn, to })
}

/// One replay's settings and pacing, for the steps of its sweep.
struct ReplayRun<'a> {
    ctx: &'a Ctx,
    dlq_url: &'a str,
    opts: &'a ReplayOptions,
    to: Option<String>,
    table: Option<String>,
    started_ms: u64,
    /// Batches as large as the rate allows, so pacing stays smooth at low rates.
    batch_size: usize,
    /// A batch must be sent and deleted before its hold expires.
    hold: Duration,
    bar: ProgressBar,
    sqs: Sqs,
    pacer: Pacer,
}

impl<'a> ReplayRun<'a> {
    async fn new(
        ctx: &'a Ctx,
        dlq_url: &'a str,
        opts: &'a ReplayOptions,
        table: Option<String>,
        to: Option<String>,
    ) -> ReplayRun<'a> {
        let started_ms = now_ms();
        let batch_size = opts.rate.map_or(10, |r| (r.floor() as usize).clamp(1, 10));
        let hold = opts.hold.unwrap_or_else(|| {
            Duration::from_secs(60)
                + opts
                    .rate
                    .map_or(Duration::ZERO, |r| Duration::from_secs_f64(20.0 / r))
        });
        let estimate = approximate_count(ctx, dlq_url).await.unwrap_or(0);
        let bar_len = opts.limit.map_or(estimate, |l| estimate.min(l as u64));
        let bar = progress(
            opts.progress,
            bar_len,
            if opts.dry_run { "reading" } else { "replaying" },
        );
        ReplayRun {
            ctx,
            dlq_url,
            opts,
            to,
            table,
            started_ms,
            batch_size,
            hold,
            bar,
            sqs: ctx.sqs_effects(),
            pacer: Pacer::new(opts.rate),
        }
    }

    fn stopped(&self) -> bool {
        self.opts.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst))
    }

    /// Reads the DLQ and moves what the filter selects, until the limit, a stop, or the end.
    async fn sweep_and_move(&mut self, st: &mut ReplayState, sweep: &mut Sweep<'_>) -> OpsResult<()> {
        let (ctx, dlq_url) = (self.ctx, self.dlq_url);
        // Whether a message new to this run was read since the FIFO blockers were last released.
        let mut read_since_release = true;
        loop {
            if self.opts.limit.is_some_and(|l| st.selected.len() >= l) || self.stopped() {
                break;
            }
            // A receive's hold starts before its answer comes.
            let asked = Instant::now();
            let Some((new, again)) = sweep.next().await? else {
                // On a FIFO DLQ a held message the filter did not select hides the rest of its
                // group: released, its group's later messages come with it in the next
                // receives. Until a read after a release brings nothing new.
                if st.ordered && !st.blockers.is_empty() && read_since_release && !sweep.cut_short() {
                    let handles = st.blockers.iter().filter_map(|id| st.handles.get(id).cloned());
                    release(ctx, dlq_url, handles.collect::<Vec<_>>()).await;
                    read_since_release = false;
                    sweep.resume();
                    continue;
                }
                break;
            };
            read_since_release |= !new.is_empty();
            st.scanned += new.len();
            st.seen_again(ctx, dlq_url, again, asked).await;
            let chosen = st.choose(new, self.opts, asked, self.started_ms);
            for (target, ms) in self.by_target(st, chosen).await {
                self.move_to(st, target, ms).await?;
            }
        }
        Ok(())
    }

    /// The chosen messages by target queue, in DLQ order within each; a message with no
    /// target, or behind a stopped FIFO group, is reported not moved.
    async fn by_target(
        &self,
        st: &mut ReplayState,
        chosen: Vec<DlqMessage>,
    ) -> BTreeMap<String, Vec<DlqMessage>> {
        let mut by_target: BTreeMap<String, Vec<DlqMessage>> = BTreeMap::new();
        for m in chosen {
            if let Some(why) = st.behind_stopped_group(&m) {
                self.bar.inc(1);
                st.not_moved(&m, why);
                continue;
            }
            match st.sources.target_for(self.ctx, &m, self.to.as_deref()).await {
                Ok(url) => by_target.entry(url).or_default().push(m),
                Err(no) => {
                    self.bar.inc(1);
                    st.not_moved(&m, no.reason);
                }
            }
        }
        by_target
    }

    /// Moves messages `ms` to `target` in paced batches (a dry run only counts them).
    async fn move_to(&mut self, st: &mut ReplayState, target: String, ms: Vec<DlqMessage>) -> OpsResult<()> {
        let refused = st.not_moved.len();
        let outgoing = st.copies(self.ctx, &target, &ms).await;
        self.bar.inc((st.not_moved.len() - refused) as u64);
        if self.opts.dry_run {
            st.moved_bodies
                .extend(outgoing.iter().map(|o| body_hash(&ms[o.key].body)));
            st.moved += outgoing.len();
            self.bar.inc(outgoing.len() as u64);
            *st.targets.entry(target).or_default() += outgoing.len();
            return Ok(());
        }
        // The copies come before any message already refused in their group. A send
        // refused from here on stops its group for the later batches: group -> the
        // refused message.
        let mut send_stopped: HashMap<String, String> = HashMap::new();
        for batch in batches(outgoing, self.batch_size) {
            if self.stopped() {
                break;
            }
            let batch = self.not_overtaking(st, batch, &ms, &send_stopped);
            if batch.is_empty() {
                continue;
            }
            let n = batch.len();
            self.pacer.take(n).await;
            let keys: Vec<usize> = batch.iter().map(|o| o.key).collect();
            st.move_batch(
                self.ctx,
                &self.sqs,
                self.dlq_url,
                &target,
                self.table.as_deref(),
                &ms,
                batch,
            )
            .await?;
            st.note_sent(keys.into_iter().map(|k| &ms[k]), &mut send_stopped);
            self.bar.inc(n as u64);
        }
        Ok(())
    }

    /// The copies of `batch` that may go: on a FIFO DLQ, a send refused in an earlier batch
    /// stops its group, and its later messages are reported not moved.
    fn not_overtaking(
        &self,
        st: &mut ReplayState,
        batch: Vec<Outgoing>,
        ms: &[DlqMessage],
        send_stopped: &HashMap<String, String>,
    ) -> Vec<Outgoing> {
        let mut go = Vec::new();
        for o in batch {
            let m = &ms[o.key];
            let stopper = m
                .group_id
                .as_ref()
                .filter(|_| st.ordered)
                .and_then(|g| Some((g, send_stopped.get(g)?)));
            match stopper {
                Some((g, first)) => {
                    self.bar.inc(1);
                    let why = overtaking(first, g);
                    st.not_moved(m, why);
                }
                None => go.push(o),
            }
        }
        go
    }
}

/// Why a message of FIFO group `group` is not moved after message `first` of the group was not.
fn overtaking(first: &str, group: &str) -> String {
    format!(
        "not attempted: message {first} of FIFO group {group} was not moved, and this one must not overtake it"
    )
}

/// How far the clock of whatever dead-letters a job (its failure record's `failed_at`, else
/// SQS's `SentTimestamp`) may run behind this machine's: a copy dead-lettered again counts as
/// such from this long before the replay started.
const CLOCK_SLACK_MS: u64 = 60_000;

/// A body's hash, to tell a body moved before in a run.
fn body_hash(body: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    h.finish()
}

/// The message replay sends for DLQ message `m`: the body byte for byte and the original
/// attributes (unpacked when the processor packed them).
pub(super) fn replay_copy(key: usize, m: &DlqMessage, fifo: bool) -> Result<Outgoing, String> {
    let attributes = original_attributes(&m.attributes).map_err(|e| e.to_string())?;
    Ok(Outgoing {
        key,
        body: m.body.clone(),
        attributes,
        // A fresh deduplication id per DLQ message: the original one may still be inside
        // SQS's 5-minute window, and a repeated replay of the same DLQ message (after a crash
        // between send and delete) is then deduplicated.
        // The message's group goes back with it: a FIFO group, or a fair queue's tenant on a
        // standard queue.
        group_id: group_for(fifo, m.group_id.as_deref(), || m.body_job_id().to_owned()),
        dedup_id: fifo.then(|| format!("replay-{}", m.message_id)),
        delay_seconds: None,
    })
}

struct ReplayState {
    fates: HashMap<String, Fate>,
    handles: HashMap<String, String>,
    /// How long a receive or a renewal holds a message.
    hold: Duration,
    /// Until when each message's latest receipt handle surely holds it: a handle whose hold
    /// ran out may be another reader's message by now, and SQS answers a delete with it as a
    /// success without deleting anything.
    held_until: HashMap<String, Instant>,
    selected: Vec<DlqMessage>,
    moved: usize,
    delete_failed: usize,
    ledgers_reset: usize,
    targets: BTreeMap<String, usize>,
    not_moved: Vec<NotMoved>,
    unverified: Vec<NotMoved>,
    sources: Sources,
    scanned: usize,
    /// Each target's largest message (its `MaximumMessageSize`), read once.
    max_bytes: HashMap<String, usize>,
    /// The DLQ is FIFO: its message groups are kept in order.
    ordered: bool,
    /// FIFO groups with a message not moved, and that message's id.
    stopped_groups: HashMap<String, String>,
    /// The bodies moved so far (hashed): a message with one of them that failed after the
    /// replay started is a copy dead-lettered again, and is not selected.
    moved_bodies: HashSet<u64>,
    repeated: usize,
    /// On a FIFO DLQ, held messages the filter did not select: each keeps the later messages
    /// of its group from being received while it is held.
    blockers: HashSet<String>,
}

/// The queues DLQ messages go back to, each source checked once.
pub(super) struct Sources {
    cache: HashMap<String, Result<String, NoTarget>>,
    dlq_arn: String,
}

impl Sources {
    /// For the DLQ whose ARN is `dlq_arn`.
    pub(super) fn new(dlq_arn: String) -> Self {
        Self {
            cache: HashMap::new(),
            dlq_arn,
        }
    }

    /// The queue a message goes back to: `--to`, else the record's source queue, else the
    /// queue SQS says it dead-lettered the message from (`DeadLetterQueueSourceArn`), once
    /// that queue's redrive policy is checked to name this DLQ (once per queue URL or ARN).
    pub(super) async fn target_for(
        &mut self,
        ctx: &Ctx,
        m: &DlqMessage,
        to: Option<&str>,
    ) -> Result<String, NoTarget> {
        if let Some(to) = to {
            return Ok(to.to_owned());
        }
        let (source, origin) = match (&m.record, &m.source_arn) {
            (Some(r), _) => (r.source_queue.clone(), SourceOrigin::Record),
            (None, Some(arn)) => (arn.clone(), SourceOrigin::Sqs),
            (None, None) => {
                return Err(NoTarget::usage(
                    "no failure record and no DeadLetterQueueSourceArn from SQS, so no source queue: pass --to QUEUE",
                ));
            }
        };
        if let Some(r) = self.cache.get(&source) {
            return r.clone();
        }
        let r = verified_source(ctx, &source, origin, &self.dlq_arn).await;
        self.cache.insert(source, r.clone());
        r
    }
}

/// Deletes the attempt ledgers of `jobs` (type, id), batched; returns how many.
pub(super) async fn reset_ledgers(ctx: &Ctx, table: &str, jobs: &BTreeSet<(&str, &str)>) -> OpsResult<usize> {
    if jobs.is_empty() {
        return Ok(0);
    }
    ctx.ledger(table)
        .forget(jobs, None)
        .await
        .map_err(|e| ctx.storage_error(e, table))?;
    Ok(jobs.len())
}

impl ReplayState {
    fn new(sources: Sources, hold: Duration, ordered: bool) -> Self {
        Self {
            fates: HashMap::new(),
            handles: HashMap::new(),
            hold,
            held_until: HashMap::new(),
            selected: Vec::new(),
            moved: 0,
            delete_failed: 0,
            ledgers_reset: 0,
            targets: BTreeMap::new(),
            not_moved: Vec::new(),
            unverified: Vec::new(),
            sources,
            scanned: 0,
            max_bytes: HashMap::new(),
            ordered,
            stopped_groups: HashMap::new(),
            moved_bodies: HashSet::new(),
            repeated: 0,
            blockers: HashSet::new(),
        }
    }

    /// Takes the messages received again (asked for at `asked`): their new handles, and
    /// moved messages whose DLQ delete failed are deleted again, in one batched call.
    async fn seen_again(&mut self, ctx: &Ctx, dlq_url: &str, again: Vec<DlqMessage>, asked: Instant) {
        let mut redelete: Vec<(String, String)> = Vec::new();
        for m in again {
            match self.fates.get(&m.message_id) {
                Some(Fate::MovedUndeleted) => redelete.push((m.message_id, m.receipt_handle)),
                _ => {
                    self.held_until.insert(m.message_id.clone(), asked + self.hold);
                    self.handles.insert(m.message_id, m.receipt_handle);
                }
            }
        }
        let failed = delete(ctx, dlq_url, &redelete).await;
        for (id, _) in redelete.into_iter().filter(|(id, _)| !failed.contains(id)) {
            self.fates.insert(id, Fate::Moved);
            self.delete_failed = self.delete_failed.saturating_sub(1);
        }
    }

    /// Takes the messages new to this run and returns those selected (within the limit, not a
    /// copy this run moved that failed again); on a FIFO DLQ the unselected ones of a group
    /// are noted as blockers.
    fn choose(
        &mut self,
        new: Vec<DlqMessage>,
        opts: &ReplayOptions,
        asked: Instant,
        started_ms: u64,
    ) -> Vec<DlqMessage> {
        let now = now_ms();
        let mut chosen = Vec::new();
        for m in new {
            let room = opts.limit.is_none_or(|l| self.selected.len() < l);
            self.fates.insert(m.message_id.clone(), Fate::Held);
            self.handles
                .insert(m.message_id.clone(), m.receipt_handle.clone());
            self.held_until.insert(m.message_id.clone(), asked + self.hold);
            let matches = opts.filter.matches(&m, now);
            if room
                && matches
                && m.failed_at_ms().saturating_add(CLOCK_SLACK_MS) >= started_ms
                && self.moved_bodies.contains(&body_hash(&m.body))
            {
                self.repeated += 1;
                continue;
            }
            if room && !matches && self.ordered && m.group_id.is_some() {
                self.blockers.insert(m.message_id.clone());
            }
            if room && matches {
                if let Some(reason) = m.record_mismatch() {
                    self.unverified.push(NotMoved {
                        message_id: m.message_id.clone(),
                        job_id: m.body_job_id().to_owned(),
                        reason,
                    });
                }
                self.selected.push(m.clone());
                chosen.push(m);
            }
        }
        chosen
    }

    /// After a batch was sent: what moved, by its body; what did not (refused) stops its
    /// group in `send_stopped`.
    fn note_sent<'m>(
        &mut self,
        sent: impl Iterator<Item = &'m DlqMessage>,
        send_stopped: &mut HashMap<String, String>,
    ) {
        for m in sent {
            match self.fates.get(&m.message_id) {
                Some(Fate::Moved | Fate::MovedUndeleted) => {
                    self.moved_bodies.insert(body_hash(&m.body));
                }
                _ => {
                    if let Some(g) = &m.group_id {
                        send_stopped
                            .entry(g.clone())
                            .or_insert_with(|| m.message_id.clone());
                    }
                }
            }
        }
    }

    /// The report of a replay that ran to its end (its `interrupted`, `incomplete` and
    /// `scan_limit_reached` are for the caller to set).
    fn into_report(
        self,
        dlq_url: &str,
        dry_run: bool,
        started: Instant,
        audit: Option<AuditStatus>,
    ) -> ReplayReport {
        let now = now_ms();
        let mut moved_ids: Vec<String> = self
            .fates
            .iter()
            .filter(|(_, f)| matches!(f, Fate::Moved | Fate::MovedUndeleted))
            .map(|(id, _)| id.clone())
            .collect();
        moved_ids.sort();
        ReplayReport {
            dlq_url: dlq_url.to_owned(),
            dry_run,
            scanned: self.scanned,
            selected: self.selected.len(),
            moved: self.moved,
            delete_failed: self.delete_failed,
            ledgers_reset: self.ledgers_reset,
            targets: self
                .targets
                .into_iter()
                .map(|(queue_url, count)| TargetCount { queue_url, count })
                .collect(),
            groups: group(&self.selected, now),
            not_moved: self.not_moved,
            unverified: self.unverified,
            repeated: self.repeated,
            interrupted: false,
            incomplete: false,
            scan_limit_reached: false,
            elapsed_ms: started.elapsed().as_millis() as u64,
            moved_ids,
            audit,
        }
    }

    /// Reports `m` as not moved, and why. On a FIFO DLQ this stops its message group: the
    /// later messages of the group are not moved either, so the group keeps its order.
    fn not_moved(&mut self, m: &DlqMessage, reason: String) {
        if let (true, Some(g)) = (self.ordered, &m.group_id) {
            self.stopped_groups
                .entry(g.clone())
                .or_insert_with(|| m.message_id.clone());
        }
        self.not_moved.push(NotMoved {
            message_id: m.message_id.clone(),
            job_id: m.body_job_id().to_owned(),
            reason,
        });
    }

    /// Why `m` must not be moved, when an earlier message of its FIFO group was not: moved,
    /// it would overtake that message on the target queue.
    fn behind_stopped_group(&self, m: &DlqMessage) -> Option<String> {
        if !self.ordered {
            return None;
        }
        let g = m.group_id.as_ref()?;
        Some(overtaking(self.stopped_groups.get(g)?, g))
    }

    /// The copies of `ms` to send to `target`, keyed by their index in `ms`; the messages
    /// that cannot be sent are reported not moved, with why. A dry run makes the same checks,
    /// so what it says would move is what a replay moves (SQS permitting).
    async fn copies(&mut self, ctx: &Ctx, target: &str, ms: &[DlqMessage]) -> Vec<Outgoing> {
        let fifo = is_fifo(target);
        let max_bytes = match self.max_bytes.get(target) {
            Some(n) => *n,
            None => {
                let n = max_message_bytes(ctx, target).await;
                self.max_bytes.insert(target.to_owned(), n);
                n
            }
        };
        let mut outgoing = Vec::new();
        for (key, m) in ms.iter().enumerate() {
            if let Some(why) = self.behind_stopped_group(m) {
                self.not_moved(m, why);
                continue;
            }
            match replay_copy(key, m, fifo) {
                Ok(o) if o.payload_bytes() > max_bytes => {
                    let size = o.payload_bytes();
                    self.not_moved(
                        m,
                        format!(
                            "the message is {size} bytes with its attributes, over the \
                             {max_bytes}-byte limit of {target} (its MaximumMessageSize)"
                        ),
                    );
                }
                Ok(o) => outgoing.push(o),
                Err(reason) => self.not_moved(m, reason),
            }
        }
        outgoing
    }

    /// Resets the ledgers of the batch's jobs, sends the batch to `target`, then deletes what
    /// SQS accepted. `ms` are the DLQ messages the batch's keys index.
    #[allow(clippy::too_many_arguments)]
    async fn move_batch(
        &mut self,
        ctx: &Ctx,
        sqs: &Sqs,
        dlq_url: &str,
        target: &str,
        table: Option<&str>,
        ms: &[DlqMessage],
        batch: Vec<Outgoing>,
    ) -> OpsResult<()> {
        // Each message must still be ours when its copy is sent: one whose hold is over, or
        // nearly, is held again first, and one SQS will not hold again (another reader may
        // have it) is not sent.
        let stale: Vec<(String, String)> = batch
            .iter()
            .filter_map(|o| ms.get(o.key))
            .filter(|m| !self.holds(&m.message_id))
            .map(|m| (m.message_id.clone(), self.handle_of(m)))
            .collect();
        renew(ctx, dlq_url, &stale, self.hold, &mut self.held_until).await;
        let (batch, lost): (Vec<Outgoing>, Vec<Outgoing>) = batch
            .into_iter()
            .partition(|o| ms.get(o.key).is_some_and(|m| self.holds(&m.message_id)));
        for o in lost {
            if let Some(m) = ms.get(o.key) {
                self.not_moved(
                    m,
                    "not sent: its hold ran out and SQS would not hold it again (another reader may have it)"
                        .into(),
                );
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        let held: Vec<(String, String)> = batch
            .iter()
            .filter_map(|o| ms.get(o.key))
            .map(|m| (m.message_id.clone(), self.handle_of(m)))
            .collect();
        // Reset before sending: once the job is back on its queue a worker may count a new
        // attempt at any moment, and that count must not be wiped. The job is the one its body
        // names, as the processor will read it (type and id); a job without an id gets a new
        // message id, hence a fresh ledger, when it is sent again.
        let jobs: BTreeSet<(&str, &str)> = batch
            .iter()
            .filter_map(|o| ms.get(o.key).and_then(|m| m.body_job.as_ref()))
            .filter_map(|j| j.id.as_deref().map(|id| (j.job_type.as_str(), id)))
            .collect();
        // The messages stay held through the reset and the send, which have no deadline (SQS
        // retries): a slow send must not outlast the hold and let another reader receive one.
        let work = async {
            let reset = match table {
                Some(table) => reset_ledgers(ctx, table, &jobs).await?,
                None => 0,
            };
            Ok::<_, OpsError>((reset, sqs.send(target, batch, None).await))
        };
        let (reset, sent) = holding(ctx, dlq_url, &held, self.hold, &mut self.held_until, work).await?;
        self.ledgers_reset += reset;
        for (k, why) in &sent.failed {
            if let Some(m) = ms.get(*k) {
                self.not_moved(m, why.clone());
            }
        }
        let accepted: Vec<(String, String)> = sent
            .accepted
            .iter()
            .filter_map(|k| ms.get(*k))
            .map(|m| (m.message_id.clone(), self.handle_of(m)))
            .collect();
        self.moved += accepted.len();
        *self.targets.entry(target.to_owned()).or_default() += accepted.len();
        for (id, _) in &accepted {
            self.fates.insert(id.clone(), Fate::Moved);
        }
        // Deleted only with a handle that still holds its message: one whose hold is over is
        // renewed first, and one SQS will not hold again is not used (SQS would answer the
        // delete as a success and delete nothing while another reader has the message).
        let stale: Vec<(String, String)> = accepted
            .iter()
            .filter(|(id, _)| !self.holds(id))
            .cloned()
            .collect();
        renew(ctx, dlq_url, &stale, self.hold, &mut self.held_until).await;
        let (ours, lost): (Vec<_>, Vec<_>) = accepted.into_iter().partition(|(id, _)| self.holds(id));
        let failed = delete(ctx, dlq_url, &ours).await;
        self.delete_failed += failed.len() + lost.len();
        for id in failed.into_iter().chain(lost.into_iter().map(|(id, _)| id)) {
            self.fates.insert(id, Fate::MovedUndeleted);
        }
        Ok(())
    }

    /// Whether the latest receipt handle of message `id` holds it for a while yet.
    fn holds(&self, id: &str) -> bool {
        let margin = (self.hold / 4).min(Duration::from_secs(30));
        self.held_until
            .get(id)
            .is_some_and(|until| Instant::now() + margin < *until)
    }

    /// The latest receipt handle of `m`.
    fn handle_of(&self, m: &DlqMessage) -> String {
        self.handles
            .get(&m.message_id)
            .cloned()
            .unwrap_or_else(|| m.receipt_handle.clone())
    }
}

/// Holds the messages `held` (message id, receipt handle) for `hold` from now, in batched
/// calls; the end of each hold SQS granted goes into `until`.
async fn renew(
    ctx: &Ctx,
    url: &str,
    held: &[(String, String)],
    hold: Duration,
    until: &mut HashMap<String, Instant>,
) {
    if held.is_empty() {
        return;
    }
    let asked = Instant::now();
    let secs = i32::try_from(hold.as_secs().clamp(1, 43_200)).unwrap_or(43_200);
    let entries = held
        .iter()
        .enumerate()
        .map(|(k, (_, h))| (k, h.clone(), secs))
        .collect();
    let r = ctx.sqs_effects().change_visibility(url, entries, None).await;
    for k in r.accepted {
        if let Some((id, _)) = held.get(k) {
            until.insert(id.clone(), asked + hold);
        }
    }
}

/// Runs `work` while renewing the holds of `held` every third of `hold`; a renewal refused is
/// tried again at the next tick, and `until` says what was granted.
async fn holding<T>(
    ctx: &Ctx,
    url: &str,
    held: &[(String, String)],
    hold: Duration,
    until: &mut HashMap<String, Instant>,
    work: impl std::future::Future<Output = T>,
) -> T {
    let period = (hold / 3).max(Duration::from_millis(500));
    let granted = tokio::sync::Mutex::new(HashMap::new());
    let keep = async {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tick.tick().await;
            let mut g = granted.lock().await;
            renew(ctx, url, held, hold, &mut g).await;
        }
    };
    tokio::pin!(work);
    let out = tokio::select! {
        out = &mut work => out,
        never = keep => match never {},
    };
    until.extend(granted.into_inner());
    out
}

/// The audit entry of a replay: `dlq.replay` on the DLQ, the count moved.
fn replay_entry(
    dlq_url: &str,
    opts: &ReplayOptions,
    st: &ReplayState,
    incomplete: bool,
    error: Option<&OpsError>,
) -> AuditEntry {
    AuditEntry::new("dlq.replay", dlq_url)
        .count(st.moved as u64)
        .filter(audit::filter_json(&opts.filter, opts.limit, opts.max_scan))
        .detail(serde_json::json!({
            "to": opts.to,
            "rate": opts.rate,
            "targets": st.targets,
            "selected": st.selected.len(),
            "not_moved": st.not_moved.len(),
            "delete_failed": st.delete_failed,
            "ledgers_reset": st.ledgers_reset,
            "repeated": st.repeated,
            "interrupted": opts.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)),
            "incomplete": incomplete,
            "error": error.map(|e| e.message.clone()),
        }))
}
