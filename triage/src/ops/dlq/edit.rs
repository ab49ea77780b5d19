//! `dlq edit ID`: change one DLQ message's body (in `$EDITOR`, from a file, or with an RFC 6902
//! JSON Patch), then replay the edited copy exactly as `dlq replay` would and delete the
//! original only after the send succeeded.
//!
//! The message is found and held the way every DLQ read holds what it sees (received,
//! invisible), and its hold is renewed while the editor is open (one hour at most: then the
//! message is let go and the edit refused) and while the ledger is reset and the copy sent,
//! so no other reader gets it meanwhile; it is renewed once more right before the delete, and
//! a hold lost by then means no delete (the report says the original may remain). Whatever
//! stops the edit before the send (the editor exits non-zero, an empty or
//! unchanged body, a body that is no job, a body over SQS's size limit, no target queue, a
//! send that fails) makes it visible again at once and sends nothing. The edited copy goes
//! where `dlq replay` would send the message (the checked source queue, or `--to`), with the
//! original attributes, the message's group, and a fresh attempt ledger.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::super::audit::{self, AuditEntry, AuditStatus};
use super::super::output::{Report, Table};
use super::super::{Ctx, ErrorKind, OpsError, OpsResult, is_fifo, queue_arn};
use super::read::{DlqMessage, Filter, Sweep, release};
use super::replay::{Sources, check_table, check_to, max_message_bytes, replay_copy, reset_ledgers};
use sqs_triage::clock::now_ms;
use sqs_triage::core::failure::FailureRecord;
use sqs_triage::effects::sqs::{EntryResults, Outgoing};

/// Where the edited body comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditSource {
    /// The edited body itself (`--body FILE`, `-` for stdin).
    Body(String),
    /// An RFC 6902 JSON Patch, as JSON text, applied to the body parsed as JSON (`--patch`).
    Patch(String),
    /// An editor command (`$EDITOR`, else `$VISUAL`), run by `sh -c` with the file to edit as
    /// its last argument, so a command with flags (`code --wait`) works.
    Editor(String),
}

impl EditSource {
    fn how(&self) -> &'static str {
        match self {
            EditSource::Body(_) => "body",
            EditSource::Patch(_) => "patch",
            EditSource::Editor(_) => "editor",
        }
    }
}

/// How `dlq edit` runs.
#[derive(Debug, Clone)]
pub struct EditOptions {
    /// Job id, DLQ message id or original message id, as `dlq show` takes it. It must name one
    /// DLQ message.
    pub id: String,
    /// Where the edited body comes from.
    pub source: EditSource,
    /// Target queue (URL, ARN or name) instead of the message's source queue.
    pub to: Option<String>,
    /// State table, for the fresh attempt ledger (required).
    pub table: Option<String>,
    /// Replay the body even when the edit left it unchanged.
    pub force: bool,
    /// Read at most this many DLQ messages looking for the message.
    pub max_scan: usize,
    /// How long each hold of the message lasts (renewed every third of it while the edit
    /// runs); 60 s by default.
    pub hold: Duration,
    /// The longest an editor session may keep the message held, from when it was found (1 h
    /// by default, at most 11 h): then the message is made visible again for the other
    /// readers, and the edit is refused when the editor exits (the draft is kept).
    pub max_hold: Duration,
}

/// The longest [`EditOptions::max_hold`] may be: SQS keeps a message in flight 12 h at most
/// from its receive.
const MAX_HOLD_LIMIT: Duration = Duration::from_secs(11 * 3600);

impl EditOptions {
    /// Options for `id` from `source`, with the defaults (60 s holds, one hour of editing at
    /// most, 100 000 messages read at most, no `--to`, no `--force`).
    pub fn new(id: impl Into<String>, source: EditSource) -> Self {
        Self {
            id: id.into(),
            source,
            to: None,
            table: None,
            force: false,
            max_scan: 100_000,
            hold: Duration::from_secs(60),
            max_hold: Duration::from_secs(3600),
        }
    }
}

/// What `dlq edit` did.
#[derive(Debug, Clone, Serialize)]
pub struct EditReport {
    /// The DLQ.
    pub dlq_url: String,
    /// The id asked for.
    pub id: String,
    /// How the body was edited: `editor`, `body` or `patch`.
    pub how: String,
    /// The DLQ message that was edited.
    pub original_message_id: String,
    /// The original's failure record, if it had one (for the audit trail).
    pub record: Option<FailureRecord>,
    /// False when the body was replayed unchanged (`--force`).
    pub changed: bool,
    /// The edited job's type, read from the edited body as the processor will read it.
    pub job_type: String,
    /// The edited job's id, when the body (or the `job-id` attribute) gives one.
    pub job_id: Option<String>,
    /// Size of the edited body, in bytes.
    pub body_bytes: usize,
    /// Where the edited copy was sent.
    pub target: String,
    /// The SQS message id of the edited copy.
    pub new_message_id: String,
    /// The message group the copy carries (FIFO, or a fair queue's tenant).
    pub group_id: Option<String>,
    /// The edited job's attempt ledger was reset (false for a job without an id: it gets a
    /// new message id, hence a fresh ledger, when sent).
    pub ledger_reset: bool,
    /// The original left the DLQ. When false, two copies exist: the edited one in `target`
    /// and the original, still in the DLQ (or, when `hold_lost`, maybe in another reader's
    /// hands).
    pub original_deleted: bool,
    /// The original's hold was lost before the delete (its receipt handle could no longer be
    /// trusted to delete it), so it was not deleted: it may still be in the DLQ.
    pub hold_lost: bool,
    /// Why the original could not be deleted.
    pub delete_error: Option<String>,
    /// Wall time, in milliseconds.
    pub elapsed_ms: u64,
    /// Whether the edit was audited (through an auditing context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditStatus>,
}

impl Report for EditReport {
    fn audit(&self) -> Option<&AuditStatus> {
        self.audit.as_ref()
    }

    fn human(&self) -> String {
        let mut t = Table::new(["FIELD", "VALUE"]).max_width(200);
        t.row([
            "edited",
            &format!("DLQ message {} (by {})", self.original_message_id, self.how),
        ]);
        if !self.changed {
            t.row(["body", "unchanged (--force)"]);
        }
        t.row(["job type", self.job_type.as_str()]);
        t.row(["job id", self.job_id.as_deref().unwrap_or("-")]);
        t.row(["sent to", self.target.as_str()]);
        t.row(["new message id", self.new_message_id.as_str()]);
        if let Some(g) = &self.group_id {
            t.row(["group", g.as_str()]);
        }
        t.row([
            "ledger reset",
            if self.ledger_reset {
                "yes"
            } else {
                "no (job without id)"
            },
        ]);
        if let Some(r) = &self.record {
            t.row([
                "was",
                &format!(
                    "{} after {} attempt(s): {}",
                    r.class.as_str(),
                    r.attempts,
                    r.error
                ),
            ]);
        }
        let original = if self.original_deleted {
            "deleted from the DLQ".to_owned()
        } else if self.hold_lost {
            format!(
                "MAY STILL BE IN THE DLQ (not deleted: {}): two copies may exist",
                self.delete_error.as_deref().unwrap_or("its hold was lost")
            )
        } else {
            format!(
                "STILL IN THE DLQ (delete failed: {}): two copies exist",
                self.delete_error.as_deref().unwrap_or("unknown")
            )
        };
        t.row(["original", &original]);
        t.render()
    }

    fn problem(&self) -> Option<String> {
        if self.hold_lost {
            return Some(format!(
                "the edited copy was sent to {} as message {}, but the original DLQ message {} \
                 was not deleted ({}): it may still be in the DLQ, or another reader may have \
                 it now; look with `triage dlq show {}` and, if it is there, delete it with \
                 `triage dlq purge --id {} --yes`",
                self.target,
                self.new_message_id,
                self.original_message_id,
                self.delete_error.as_deref().unwrap_or("its hold was lost"),
                self.original_message_id,
                self.original_message_id
            ));
        }
        (!self.original_deleted).then(|| {
            format!(
                "the edited copy was sent to {} as message {}, but the original DLQ message {} \
                 could not be deleted ({}): two copies exist; delete the original with \
                 `triage dlq purge --id {} --yes`",
                self.target,
                self.new_message_id,
                self.original_message_id,
                self.delete_error.as_deref().unwrap_or("unknown"),
                self.original_message_id
            )
        })
    }
}

/// `dlq edit ID`: edits one DLQ message's body and replays the edited copy (see the module
/// docs). Nothing is sent and nothing deleted unless the edited body is a job that fits SQS's
/// size limit; the original is deleted only after the send succeeded.
pub async fn edit(ctx: &Ctx, dlq_url: &str, opts: &EditOptions) -> OpsResult<EditReport> {
    let started = Instant::now();
    let checked = check_edit(ctx, dlq_url, opts).await?;
    let found = find(ctx, dlq_url, checked.id, opts.hold, opts.max_scan).await?;
    let hold = MessageHold {
        ctx,
        url: dlq_url,
        handle: found.receipt_handle.clone(),
        seconds: opts.hold.as_secs().clamp(1, 43_200) as i32,
    };
    // An editor left open (an operator gone home) must not hide the message from every other
    // reader for ever: past this, the message is made visible again.
    let max_hold = opts.max_hold.min(MAX_HOLD_LIMIT);
    let held = HeldMessage {
        found: &found,
        hold: &hold,
        ends: tokio::time::Instant::now() + max_hold,
        max_hold,
    };
    let mut draft: Option<Draft> = None;
    let mut report = match send_edited(ctx, dlq_url, opts, &checked, &held, &mut draft).await {
        Ok(r) => r,
        Err(mut e) => {
            // Nothing was sent: the message goes back to the DLQ's readers at once.
            release(ctx, dlq_url, [found.receipt_handle.clone()]).await;
            e.message.push_str("; the message is back in the DLQ");
            if let Some(d) = draft.as_mut() {
                e.message.push_str(&format!(
                    "; your edit is kept in {} (pass it with --body)",
                    d.keep().display()
                ));
            }
            return Err(e);
        }
    };
    delete_original(ctx, &held, &mut report).await;
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    // The edited copy was sent: that is audited, with the original's failure record.
    report.audit = audit::record_action(ctx, edit_entry(&report)).await;
    Ok(report)
}

/// What an edit checks before it touches the DLQ.
struct EditChecks<'o> {
    id: &'o str,
    patch: Option<json_patch::Patch>,
    table: &'o str,
    dlq_arn: String,
    to: Option<String>,
}

/// The checks that need no DLQ message: the id, the new body or patch, the table, `--to`.
async fn check_edit<'o>(ctx: &Ctx, dlq_url: &str, opts: &'o EditOptions) -> OpsResult<EditChecks<'o>> {
    let id = opts.id.trim();
    if id.is_empty() {
        return Err(OpsError::usage(
            "no message id: pass a job id or DLQ message id (see `triage dlq list --messages`)",
        ));
    }
    let patch = match &opts.source {
        EditSource::Patch(text) => Some(parse_patch(text)?),
        EditSource::Body(b) if b.trim().is_empty() => {
            return Err(OpsError::usage("the new body is empty: nothing was sent"));
        }
        _ => None,
    };
    let table = opts
        .table
        .as_deref()
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| OpsError::missing_var("TRIAGE_TABLE", "--table"))?;
    let dlq_arn = queue_arn(ctx, dlq_url, "TRIAGE_DLQ_URL").await?;
    check_table(ctx, table).await?;
    let to = match &opts.to {
        Some(q) => Some(check_to(ctx, q, dlq_url, "edited").await?),
        None => None,
    };
    Ok(EditChecks {
        id,
        patch,
        table,
        dlq_arn,
        to,
    })
}

/// The DLQ message being edited, its hold, and when an editor session must let it go.
struct HeldMessage<'a> {
    found: &'a DlqMessage,
    hold: &'a MessageHold<'a>,
    ends: tokio::time::Instant,
    max_hold: Duration,
}

/// The DLQ message, edited and ready to send.
struct EditedCopy {
    edited: DlqMessage,
    outgoing: Outgoing,
    changed: bool,
}

/// Everything an edit does before the delete: the target, the edited body, its checks, the
/// ledger reset and the send. An error means nothing was sent (the caller lets the message go).
async fn send_edited(
    ctx: &Ctx,
    dlq_url: &str,
    opts: &EditOptions,
    checked: &EditChecks<'_>,
    held: &HeldMessage<'_>,
    draft: &mut Option<Draft>,
) -> OpsResult<EditReport> {
    let (found, hold) = (held.found, held.hold);
    // The sweep may have taken a while: hold the message for a full period from now, and
    // learn at once if it slipped away.
    hold.renew().await.map_err(|e| {
        OpsError::new(
            ErrorKind::Failed,
            format!("the DLQ message could not be held for the edit ({e}); run the command again"),
        )
    })?;
    // Where it goes, known before anyone edits anything. A source that is not trusted is
    // a usage error; a check that could not be made keeps its kind (missing, unreachable).
    // These checks may take a while (SQS retries): the hold is renewed meanwhile.
    let target = hold
        .during(Sources::new(checked.dlq_arn.clone()).target_for(ctx, found, checked.to.as_deref()))
        .await
        .map_err(|no| OpsError::new(no.kind, format!("{}; nothing was sent", no.reason)))?;
    let max_bytes = hold.during(max_message_bytes(ctx, &target)).await;
    let (body, changed) = edited_body(opts, checked.patch.as_ref(), held, draft).await?;
    if !changed && !opts.force {
        draft.take();
        return Err(OpsError::usage(
            "the body is unchanged: nothing was sent (pass --force to replay it as it is)",
        ));
    }
    let copy = edited_copy(found, body, changed, &target, max_bytes)?;
    // A fresh attempt ledger for the job the edited body names, before the send (as
    // replay: once the job is back on its queue a worker may count a new attempt at any
    // moment, and that count must not be wiped).
    let job = copy.edited.body_job.as_ref().expect("with_body reads the job");
    let group_id = copy.outgoing.group_id.clone();
    // Still ours right before the reset and the send (whatever ran since the last renewal),
    // and for a full period from now: otherwise another reader may have the original.
    hold.renew().await.map_err(|e| {
        OpsError::new(
            ErrorKind::Failed,
            format!("the DLQ message's hold was lost before the send ({e}): nothing was sent"),
        )
    })?;
    let send = EditSend {
        dlq_url,
        id: checked.id,
        how: opts.source.how(),
        table: checked.table,
        target: &target,
        copy: &copy,
    };
    let (ledger_reset, new_message_id) = reset_and_send(ctx, hold, found, &send).await?;
    draft.take();
    Ok(EditReport {
        dlq_url: dlq_url.to_owned(),
        id: checked.id.to_owned(),
        how: opts.source.how().to_owned(),
        original_message_id: found.message_id.clone(),
        record: found.record.clone(),
        changed,
        job_type: job.job_type.clone(),
        job_id: job.id.clone(),
        body_bytes: copy.edited.body.len(),
        target,
        new_message_id,
        group_id,
        ledger_reset,
        original_deleted: false,
        hold_lost: false,
        delete_error: None,
        elapsed_ms: 0,
        audit: None,
    })
}

/// The edited body and whether it differs from the original, from `--body`, `--patch` or the
/// editor.
async fn edited_body(
    opts: &EditOptions,
    patch: Option<&json_patch::Patch>,
    held: &HeldMessage<'_>,
    draft: &mut Option<Draft>,
) -> OpsResult<(String, bool)> {
    let found = held.found;
    let edited = match &opts.source {
        EditSource::Body(b) => b.clone(),
        EditSource::Patch(_) => {
            let p = apply_patch(&found.body, patch.expect("parsed by check_edit"))?;
            return Ok((p.body, p.changed));
        }
        EditSource::Editor(cmd) => body_from_editor(cmd, held, draft).await?,
    };
    let body = trim_added_newline(&found.body, edited);
    let changed = body != found.body;
    Ok((body, changed))
}

/// Runs the editor on a draft of the body, holding the message meanwhile (up to the session's
/// limit), and returns the edited text.
async fn body_from_editor(cmd: &str, held: &HeldMessage<'_>, draft: &mut Option<Draft>) -> OpsResult<String> {
    let d = Draft::create(held.found)?;
    let path = d.path.clone();
    *draft = Some(d);
    let (edited, released) = held
        .hold
        .during_until(run_editor(cmd, &path), Some(held.ends))
        .await;
    let edited = match edited {
        Ok(text) => text,
        Err(e) => {
            // Aborted on purpose (or no editor ran): nothing to keep.
            draft.take();
            return Err(e);
        }
    };
    if released {
        return Err(OpsError::new(
            ErrorKind::Failed,
            format!(
                "the editor was open longer than {}, the longest an edit may hold a DLQ \
                 message: the message was made visible again then for the other readers, \
                 and nothing was sent",
                humantime::format_duration(held.max_hold)
            ),
        ));
    }
    // Still ours after the editor: otherwise another reader may have it now.
    held.hold.renew().await.map_err(|e| {
        OpsError::new(
            ErrorKind::Failed,
            format!("the DLQ message's hold was lost while editing ({e}): nothing was sent"),
        )
    })?;
    if edited.trim().is_empty() {
        draft.take();
        return Err(OpsError::usage(
            "the edited body is empty: edit aborted, nothing was sent",
        ));
    }
    Ok(edited)
}

/// The edited body as a job and as the message to send, refused when SQS would refuse it
/// (over `max_bytes`, a character SQS does not take) or when it is not a job.
fn edited_copy(
    found: &DlqMessage,
    body: String,
    changed: bool,
    target: &str,
    max_bytes: usize,
) -> OpsResult<EditedCopy> {
    let too_large = |size: usize| {
        OpsError::usage(format!(
            "the edited message is {size} bytes with its attributes, over the {max_bytes}-byte \
             limit of {target} (its MaximumMessageSize): nothing was sent"
        ))
    };
    if body.len() > max_bytes {
        return Err(too_large(body.len()));
    }
    // An operator's text is sent as written, so one SQS would refuse is refused here,
    // before the ledger is reset.
    if let Some(c) = sqs_triage::core::sqs_text::refused(&body) {
        return Err(OpsError::usage(format!(
            "the edited body holds U+{:04X}, a character SQS refuses in a message (in a JSON \
             string write it as \\u{:04x}): nothing was sent",
            c as u32, c as u32
        )));
    }
    let edited = found
        .with_body(body)
        .map_err(|why| OpsError::usage(format!("the edited body is not a job: {why}; nothing was sent")))?;
    let fifo = is_fifo(target);
    let mut outgoing =
        replay_copy(0, &edited, fifo).map_err(|why| OpsError::usage(format!("{why}; nothing was sent")))?;
    let size = outgoing.payload_bytes();
    if size > max_bytes {
        return Err(too_large(size));
    }
    // Not replay's `replay-<id>`: a replay of this message that landed minutes ago must
    // not swallow the edit. The same edit sent twice (a retry whose first try landed, or
    // the command run again) is deduplicated by a FIFO queue.
    outgoing.dedup_id = fifo.then(|| edit_dedup_id(&found.message_id, &edited.body));
    Ok(EditedCopy {
        edited,
        outgoing,
        changed,
    })
}

/// What the reset and the send of an edited copy need to know.
struct EditSend<'a> {
    dlq_url: &'a str,
    id: &'a str,
    how: &'static str,
    table: &'a str,
    target: &'a str,
    copy: &'a EditedCopy,
}

impl EditSend<'_> {
    /// The audit entry of an edit that failed at the reset or the send: what it changed (the
    /// ledger, maybe a copy) is on record.
    fn failed_entry(
        &self,
        found: &DlqMessage,
        outcome: &str,
        ledger_reset: Value,
        error: &str,
    ) -> AuditEntry {
        let job = self.copy.edited.body_job.as_ref();
        AuditEntry::new("dlq.edit", self.dlq_url)
            .count(0)
            .filter(serde_json::json!({ "id": self.id }))
            .detail(serde_json::json!({
                "how": self.how,
                "changed": self.copy.changed,
                "original_message_id": found.message_id,
                "original_record": found.record,
                "job_type": job.map(|j| &j.job_type),
                "job_id": job.and_then(|j| j.id.as_ref()),
                "to": self.target,
                "ledger_reset": ledger_reset,
            }))
            .outcome(outcome, error)
    }
}

/// Resets the edited job's attempt ledger, then sends the edited copy, the message held
/// throughout. Returns whether a ledger was reset and the copy's new message id; a failure is
/// audited.
async fn reset_and_send(
    ctx: &Ctx,
    hold: &MessageHold<'_>,
    found: &DlqMessage,
    send: &EditSend<'_>,
) -> OpsResult<(bool, String)> {
    let job = send
        .copy
        .edited
        .body_job
        .as_ref()
        .expect("with_body reads the job");
    let jobs: BTreeSet<(&str, &str)> = job
        .id
        .as_deref()
        .map(|i| (job.job_type.as_str(), i))
        .into_iter()
        .collect();
    // The message stays held through the reset and the send: a slow send (SQS retries)
    // must not outlast the hold and let another reader receive the original meanwhile.
    let reset_and_sent = hold
        .during(async {
            let reset = reset_ledgers(ctx, send.table, &jobs).await? > 0;
            let outgoing = vec![send.copy.outgoing.clone()];
            Ok::<_, OpsError>((reset, ctx.sqs_effects().send(send.target, outgoing, None).await))
        })
        .await;
    let (ledger_reset, sent) = match reset_and_sent {
        Ok(done) => done,
        Err(e) => {
            // The reset failed, maybe after it landed: nothing was sent.
            let entry = send.failed_entry(found, "not_sent", json!("unclear"), &e.message);
            return Err(audit::failed_action(ctx, entry, e).await);
        }
    };
    match sent.message_ids.get(&0).cloned() {
        Some(new_message_id) => Ok((ledger_reset, new_message_id)),
        None => {
            let (err, why, unclear) = not_sent_error(ctx, found, send, ledger_reset, &sent);
            let outcome = if unclear { "unclear" } else { "not_sent" };
            let entry = send.failed_entry(found, outcome, json!(ledger_reset), &why);
            Err(audit::failed_action(ctx, entry, err).await)
        }
    }
}

/// The error of an edited copy SQS did not take, why it was not taken, and whether SQS's
/// answer was unclear (a copy may have landed).
fn not_sent_error(
    ctx: &Ctx,
    found: &DlqMessage,
    send: &EditSend<'_>,
    ledger_reset: bool,
    sent: &EntryResults,
) -> (OpsError, String, bool) {
    let (target, job) = (
        send.target,
        send.copy
            .edited
            .body_job
            .as_ref()
            .expect("with_body reads the job"),
    );
    let why = sent
        .failed
        .first()
        .map(|(_, why)| why.clone())
        .unwrap_or_else(|| "no answer".into());
    // A missing queue (3) or an unreachable SQS (4) says so; anything else is a
    // message not sent (5), as for `replay`.
    let kind = match &sent.error {
        Some(e) => match ctx.sqs_storage_error(e, Some((target, "the target queue"))).kind {
            ErrorKind::Failed => ErrorKind::Incomplete,
            k => k,
        },
        None => ErrorKind::Incomplete,
    };
    // No answer (a 5xx, a timeout, an entry SQS did not mention) may hide a copy that
    // landed; a refusal does not.
    let unclear = match &sent.error {
        Some(e) => e.status.is_none_or(|s| s >= 500),
        None => !sent.codes.contains_key(&0),
    };
    let maybe = if unclear {
        " (SQS gave no clear answer, so it may have stored it: look at the target before \
         editing again; on a FIFO queue the same edit run again within 5 minutes is \
         stored once)"
    } else {
        ""
    };
    // The ledger was reset before the send: say so, it is not undone.
    let ledger = match job.id.as_deref() {
        Some(jid) if ledger_reset => {
            let other = match found.body_job.as_ref() {
                Some(o) if o.job_type == job.job_type && o.id.as_deref() == Some(jid) => "",
                _ => ", the edited body's job, not the original's",
            };
            format!(
                "; the attempt ledger of job `{jid}` (type `{}`{other}) was reset before \
                 the send, as `replay` does, and stays reset: its attempts count from 0 \
                 when it next runs",
                job.job_type
            )
        }
        _ => String::new(),
    };
    let err = OpsError::new(
        kind,
        format!("the edited copy was not sent to {target} ({why}){maybe}: nothing was deleted{ledger}"),
    );
    (err, why, unclear)
}

/// Deletes the original once the copy was sent, only while the message is still ours: a
/// receipt handle whose hold ran out may be accepted by SQS without deleting anything (or
/// remove a message another reader now works on), so a hold that cannot be renewed right
/// before the delete means no delete, and a report that says the original may remain.
async fn delete_original(ctx: &Ctx, held: &HeldMessage<'_>, report: &mut EditReport) {
    match held.hold.renew().await {
        Ok(()) => {
            let deleted = ctx
                .sqs_effects()
                .delete(held.hold.url, vec![(0, held.found.receipt_handle.clone())], None)
                .await;
            report.original_deleted = deleted.accepted.contains(&0);
            report.delete_error = (!report.original_deleted).then(|| {
                deleted
                    .failed
                    .first()
                    .map(|(_, why)| why.clone())
                    .unwrap_or_else(|| "no answer".into())
            });
        }
        Err(e) => {
            report.hold_lost = true;
            report.delete_error = Some(format!(
                "its hold could not be renewed after the send ({e}), so its receipt handle was not trusted to delete it"
            ));
        }
    }
}

/// The audit entry of an edit: `dlq.edit` on the DLQ, one message, the original's record.
fn edit_entry(r: &EditReport) -> AuditEntry {
    AuditEntry::new("dlq.edit", r.dlq_url.as_str())
        .count(1)
        .filter(serde_json::json!({ "id": r.id }))
        .detail(serde_json::json!({
            "how": r.how,
            "changed": r.changed,
            "original_message_id": r.original_message_id,
            "original_record": r.record,
            "job_type": r.job_type,
            "job_id": r.job_id,
            "to": r.target,
            "new_message_id": r.new_message_id,
            "original_deleted": r.original_deleted,
            "hold_lost": r.hold_lost,
            "delete_error": r.delete_error,
        }))
}

/// Finds the one DLQ message `id` names and holds it; every other message the search saw is
/// made visible again. Not found, or more than one, is an error (and nothing stays held).
async fn find(ctx: &Ctx, dlq_url: &str, id: &str, hold: Duration, max_scan: usize) -> OpsResult<DlqMessage> {
    let filter = Filter {
        ids: vec![id.to_owned()],
        ..Filter::default()
    };
    let mut sweep = Sweep::new(ctx, dlq_url, hold, max_scan);
    // Latest receipt handle of everything seen, and the matches as last received.
    let mut held: HashMap<String, String> = HashMap::new();
    let mut matches: HashMap<String, DlqMessage> = HashMap::new();
    let now = now_ms();
    let swept = async {
        while let Some((new, again)) = sweep.next().await? {
            for m in new.into_iter().chain(again) {
                held.insert(m.message_id.clone(), m.receipt_handle.clone());
                if filter.matches(&m, now) {
                    matches.insert(m.message_id.clone(), m);
                }
            }
            // A DLQ message id names one message: no need to read further.
            if matches.contains_key(id) {
                break;
            }
        }
        Ok::<_, OpsError>(())
    }
    .await;
    let one = match (&swept, matches.len()) {
        (Ok(()), 1) => matches.values().next().cloned(),
        _ => None,
    };
    let keep = one.as_ref().map(|m| m.message_id.as_str());
    let others: Vec<String> = held
        .iter()
        .filter(|(mid, _)| Some(mid.as_str()) != keep)
        .map(|(_, h)| h.clone())
        .collect();
    release(ctx, dlq_url, others).await;
    swept?;
    if let Some(m) = one {
        return Ok(m);
    }
    if matches.is_empty() {
        let why = match sweep.end().note(held.len()) {
            Some(note) => format!(" ({note})"),
            None => ", or another reader holds it right now (another edit, a replay, a purge \
                       waiting for its confirmation): see `triage dlq list --messages`, or try \
                       again when that reader is done"
                .to_owned(),
        };
        return Err(OpsError::new(
            ErrorKind::NotFound,
            format!("no DLQ message with job id or message id `{id}` in {dlq_url}{why}"),
        ));
    }
    let mut ids: Vec<&str> = matches.keys().map(String::as_str).collect();
    ids.sort_unstable();
    Err(OpsError::usage(format!(
        "`{id}` names {} DLQ messages ({}): pass the DLQ message id of the one to edit",
        ids.len(),
        ids.join(", ")
    )))
}

/// The hold on the DLQ message being edited: renewed to a full period on demand, and every
/// third of a period while something runs.
struct MessageHold<'a> {
    ctx: &'a Ctx,
    url: &'a str,
    handle: String,
    seconds: i32,
}

impl MessageHold<'_> {
    /// Makes the message invisible for a full period from now (one `ChangeMessageVisibility`).
    async fn renew(&self) -> OpsResult<()> {
        self.ctx
            .sqs_call(
                "ChangeMessageVisibility",
                Some((self.url, "TRIAGE_DLQ_URL")),
                || {
                    self.ctx
                        .sqs
                        .change_message_visibility()
                        .queue_url(self.url)
                        .receipt_handle(&self.handle)
                        .visibility_timeout(self.seconds)
                        .send()
                },
            )
            .await
            .map(|_| ())
    }

    /// Runs `work`, renewing the hold every third of a period until it ends. A renewal that
    /// fails is tried again at the next tick; the caller renews once more afterwards to learn
    /// whether the message is still held.
    async fn during<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        self.during_until(work, None).await.0
    }

    /// [`MessageHold::during`], except that at `until` the renewals stop and the message is made
    /// visible again at once, while `work` goes on. Returns `work`'s output and whether the
    /// message was let go that way.
    async fn during_until<T>(
        &self,
        work: impl std::future::Future<Output = T>,
        until: Option<tokio::time::Instant>,
    ) -> (T, bool) {
        let period = Duration::from_secs(self.seconds as u64) / 3;
        let period = period.max(Duration::from_millis(500));
        let released = std::sync::atomic::AtomicBool::new(false);
        let keep = async {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            let end = async {
                match until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(end);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let _ = self.renew().await;
                    }
                    () = &mut end => break,
                }
            }
            // Past `until` the message is not ours to use any more, even if the work ends
            // while the release is still on its way.
            released.store(true, std::sync::atomic::Ordering::SeqCst);
            release(self.ctx, self.url, [self.handle.clone()]).await;
            std::future::pending::<std::convert::Infallible>().await
        };
        tokio::pin!(work);
        let out = tokio::select! {
            out = &mut work => out,
            never = keep => match never {},
        };
        (out, released.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// The file an editor edits: the body, private to the user (mode 0600), removed when the
/// edit is sent or abandoned, kept when the edited body is refused so the work is not lost.
struct Draft {
    path: PathBuf,
    kept: bool,
}

impl Draft {
    fn create(m: &DlqMessage) -> OpsResult<Self> {
        let safe: String = m
            .message_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(64)
            .collect();
        let ext = if serde_json::from_str::<serde_json::Value>(&m.body).is_ok() {
            "json"
        } else {
            "txt"
        };
        let path = std::env::temp_dir().join(format!(
            "triage-edit-{safe}-{}-{}.{ext}",
            std::process::id(),
            now_ms()
        ));
        let mut open = std::fs::OpenOptions::new();
        open.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            open.mode(0o600);
        }
        let write = |path: &Path| -> std::io::Result<()> {
            use std::io::Write;
            let mut f = open.open(path)?;
            f.write_all(m.body.as_bytes())?;
            f.sync_all()
        };
        write(&path).map_err(|e| {
            OpsError::new(
                ErrorKind::Failed,
                format!("cannot write the body to {} for the editor: {e}", path.display()),
            )
        })?;
        Ok(Self { path, kept: false })
    }

    /// Keeps the file (the caller tells the operator where).
    fn keep(&mut self) -> &Path {
        self.kept = true;
        &self.path
    }
}

impl Drop for Draft {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Runs `cmd` on `path` (through `sh -c`, so `$EDITOR` may carry flags) with the terminal,
/// and returns the edited text. A non-zero exit aborts the edit. Ctrl-C reaches the editor
/// (same process group); this process ignores it meanwhile, so the abort path still runs.
async fn run_editor(cmd: &str, path: &Path) -> OpsResult<String> {
    #[cfg(unix)]
    let _sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cmd} \"$@\""))
        .arg("sh")
        .arg(path)
        .status()
        .await
        .map_err(|e| OpsError::usage(format!("cannot run the editor `{cmd}`: {e}")))?;
    if !status.success() {
        let how = status.code().map_or_else(
            || "was stopped by a signal".to_owned(),
            |c| format!("exited with {c}"),
        );
        return Err(OpsError::usage(format!(
            "the editor `{cmd}` {how}: edit aborted, nothing was sent"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| {
        OpsError::new(
            ErrorKind::Failed,
            format!("cannot read the edited body back from {}: {e}", path.display()),
        )
    })?;
    String::from_utf8(bytes)
        .map_err(|_| OpsError::usage("the edited body is not UTF-8 text (SQS bodies are): nothing was sent"))
}

/// Drops the one final newline an editor or a file adds, when the original body had none.
fn trim_added_newline(original: &str, mut edited: String) -> String {
    if !original.ends_with('\n') && edited.ends_with('\n') {
        edited.pop();
        if !original.ends_with('\r') && edited.ends_with('\r') {
            edited.pop();
        }
    }
    edited
}

/// Reads `--patch`: an RFC 6902 JSON Patch (an array of operations), whose values it carries
/// exactly (no key twice, no number a 64-bit reading would change).
fn parse_patch(text: &str) -> OpsResult<json_patch::Patch> {
    let patch = serde_json::from_str(text).map_err(|e| {
        OpsError::usage(format!(
            "--patch is not an RFC 6902 JSON Patch ({e}): pass an array of operations, e.g. \
             '[{{\"op\": \"replace\", \"path\": \"/payload/n\", \"value\": 2}}]'"
        ))
    })?;
    if let Some(why) = not_exact(text) {
        return Err(OpsError::usage(format!(
            "--patch cannot be applied exactly: it {why}; put that value in the body with --body FILE or in $EDITOR"
        )));
    }
    Ok(patch)
}

/// A body after `--patch`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Patched {
    /// The patched body (compact JSON, keys sorted), or the original byte for byte when the
    /// patch left its value as it was.
    body: String,
    /// The patch changed the body's value (not merely its bytes).
    changed: bool,
}

/// Applies `patch` to `body` parsed as JSON. The result is compact JSON with its keys sorted;
/// a patch that leaves the value as it was (`[]`, or a value replaced by itself) leaves the
/// body unchanged, byte for byte. Refused when writing the body back would change something
/// the patch did not touch: a number JSON's 64-bit reading cannot carry exactly, or a key
/// given twice.
fn apply_patch(body: &str, patch: &json_patch::Patch) -> OpsResult<Patched> {
    let original: serde_json::Value = serde_json::from_str(body).map_err(|e| {
        OpsError::usage(format!(
            "the body is not JSON ({e}), so a JSON Patch cannot apply to it: edit it with --body or in $EDITOR; nothing was sent"
        ))
    })?;
    let mut doc = original.clone();
    json_patch::patch(&mut doc, patch).map_err(|e| {
        OpsError::usage(format!(
            "--patch does not apply to the body: {e}; nothing was sent"
        ))
    })?;
    if doc == original {
        return Ok(Patched {
            body: body.to_owned(),
            changed: false,
        });
    }
    if let Some(why) = not_exact(body) {
        return Err(OpsError::usage(format!(
            "--patch would change what it does not touch: the body {why}, and a patched body is \
             written back from its parsed value; edit it with --body FILE or in $EDITOR, which \
             keep every byte you leave alone; nothing was sent"
        )));
    }
    let body = serde_json::to_string(&doc)
        .map(sqs_triage::core::sqs_text::json)
        .map_err(|e| OpsError::new(ErrorKind::Failed, format!("cannot write the patched body: {e}")))?;
    Ok(Patched { body, changed: true })
}

/// Why `text` (valid JSON) would not come back the same value after being parsed into a
/// `serde_json::Value` and written back, if it would not: a key given twice in one object
/// (only the last would stay), or a number whose written form is not the same number (an
/// integer beyond 64 bits, a decimal with more digits than a 64-bit float holds). Numbers
/// that only change their spelling (`1.50` → `1.5`, `1e2` → `100.0`) are the same number.
fn not_exact(text: &str) -> Option<String> {
    if let Err(e) = serde_json::from_str::<Unique>(text) {
        return Some(format!("is not JSON whose keys are unique ({e})"));
    }
    for literal in number_literals(text) {
        let written = match serde_json::from_str::<serde_json::Number>(literal) {
            Ok(n) => n.to_string(),
            Err(_) => return Some(format!("holds the number `{literal}`, which cannot be read")),
        };
        let same = matches!((decimal(literal), decimal(&written)), (Some(a), Some(b)) if a == b);
        if !same {
            return Some(format!(
                "holds the number `{literal}`, which would be written back as `{written}`"
            ));
        }
    }
    None
}

/// The number literals of JSON text, in order (those inside strings skipped).
fn number_literals(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len() && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    i += 1;
                }
                out.push(&text[start..i]);
            }
            _ => i += 1,
        }
    }
    out
}

/// A JSON number literal as an exact decimal: (negative, significant digits, exponent), zero
/// as `(false, "", 0)`. `None` when it is not a number literal.
fn decimal(literal: &str) -> Option<(bool, String, i64)> {
    let (negative, rest) = match literal.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, literal),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mut exp = exp.checked_sub(i64::try_from(frac.len()).ok()?)?;
    let digits = digits.trim_start_matches('0');
    let trimmed = digits.trim_end_matches('0');
    exp = exp.checked_add(i64::try_from(digits.len() - trimmed.len()).ok()?)?;
    if trimmed.is_empty() {
        return Some((false, String::new(), 0));
    }
    Some((negative, trimmed.to_owned(), exp))
}

/// Any JSON value, refused when an object gives one key twice (`serde_json::Value` would keep
/// the last silently).
struct Unique;

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        while seq.next_element::<Unique>()?.is_some() {}
        Ok(Unique)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key `{key}` is given twice"
                )));
            }
            map.next_value::<Unique>()?;
            seen.insert(key);
        }
        Ok(Unique)
    }
}

/// The FIFO deduplication id of an edited copy: one per DLQ message and edited body.
fn edit_dedup_id(message_id: &str, body: &str) -> String {
    let mut h = Sha256::new();
    h.update(message_id.as_bytes());
    h.update([0]);
    h.update(body.as_bytes());
    let hex: String = h.finalize().iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("edit-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_newline_the_original_lacked_is_dropped() {
        assert_eq!(trim_added_newline("{}", "{\"a\":1}\n".into()), "{\"a\":1}");
        assert_eq!(trim_added_newline("{}", "{}\r\n".into()), "{}");
        assert_eq!(trim_added_newline("{}", "{}\n\n".into()), "{}\n");
        assert_eq!(trim_added_newline("line\n", "line\n".into()), "line\n");
        assert_eq!(trim_added_newline("{}", "{}".into()), "{}");
    }

    #[test]
    fn a_patch_applies_to_a_json_body_or_is_refused() {
        let p = parse_patch(r#"[{"op": "replace", "path": "/payload/n", "value": 2}]"#).unwrap();
        let out = apply_patch(r#"{"type": "t", "payload": {"n": 1}}"#, &p).unwrap();
        assert!(out.changed);
        let v: serde_json::Value = serde_json::from_str(&out.body).unwrap();
        assert_eq!(v, serde_json::json!({"type": "t", "payload": {"n": 2}}));
        assert_eq!(apply_patch("not json", &p).unwrap_err().kind, ErrorKind::Usage);
        let missing = parse_patch(r#"[{"op": "remove", "path": "/nope"}]"#).unwrap();
        let e = apply_patch("{}", &missing).unwrap_err();
        assert!(e.message.contains("does not apply"), "{e}");
        assert!(
            parse_patch(r#"{"op": "add"}"#).is_err(),
            "an object is not a patch"
        );
        assert!(parse_patch(r#"[{"op": "frobnicate", "path": "/a"}]"#).is_err());
    }

    fn replace_n() -> json_patch::Patch {
        parse_patch(r#"[{"op": "replace", "path": "/payload/n", "value": 2}]"#).unwrap()
    }

    #[test]
    fn a_patch_never_changes_a_number_it_does_not_touch() {
        for (body, number) in [
            (
                r#"{"type": "t", "payload": {"n": 1, "big": 123456789012345678901234}}"#,
                "123456789012345678901234",
            ),
            (
                r#"{"type": "t", "payload": {"n": 1, "price": 19.99999999999999999}}"#,
                "19.99999999999999999",
            ),
            (
                r#"{"type": "t", "payload": {"n": 1, "ids": [-18446744073709551617]}}"#,
                "-18446744073709551617",
            ),
            (r#"{"type": "t", "payload": {"n": 1, "tiny": 1e-400}}"#, "1e-400"),
        ] {
            let e = apply_patch(body, &replace_n()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Usage, "{body}: {e}");
            assert!(
                e.message.contains(number) && e.message.contains("--body"),
                "{body}: {e}"
            );
        }
        // Numbers that only change their spelling, integers within 64 bits, and digits inside
        // strings are carried exactly.
        let body = r#"{"type": "t", "payload": {"n": 1, "a": 1.50, "b": 1e2, "c": -0.0, "d": 18446744073709551615, "e": -9223372036854775808, "f": 0.1, "s": "123456789012345678901234 \" 19.99999999999999999"}}"#;
        let out = apply_patch(body, &replace_n()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out.body).unwrap();
        assert_eq!(v["payload"]["n"], 2);
        assert_eq!(v["payload"]["d"], u64::MAX);
        assert_eq!(v["payload"]["f"], 0.1);
        assert_eq!(
            v["payload"]["s"],
            "123456789012345678901234 \" 19.99999999999999999"
        );
    }

    #[test]
    fn a_patch_refuses_a_body_with_a_key_given_twice() {
        let e = apply_patch(
            r#"{"type": "t", "payload": {"n": 1, "k": 1, "k": 2}}"#,
            &replace_n(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Usage);
        assert!(e.message.contains("`k` is given twice"), "{e}");
        // The same key in two objects is no duplicate; an escaped spelling of a key is.
        assert!(
            apply_patch(
                r#"{"type": "t", "k": 1, "payload": {"n": 1, "k": 2}}"#,
                &replace_n()
            )
            .is_ok()
        );
        assert!(
            apply_patch(
                r#"{"type": "t", "payload": {"n": 1, "k": 1, "\u006b": 2}}"#,
                &replace_n()
            )
            .is_err()
        );
    }

    #[test]
    fn a_patch_whose_own_values_would_change_is_refused() {
        let e = parse_patch(r#"[{"op": "add", "path": "/payload/x", "value": 123456789012345678901234}]"#)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Usage);
        assert!(e.message.contains("123456789012345678901234"), "{e}");
        assert!(parse_patch(r#"[{"op": "add", "path": "/payload/x", "value": {"a": 1, "a": 2}}]"#).is_err());
        assert!(parse_patch(r#"[{"op": "add", "path": "/payload/x", "value": 2.5}]"#).is_ok());
    }

    #[test]
    fn a_patch_that_changes_no_value_leaves_the_body_as_it_was() {
        let pretty = "{\n  \"type\": \"t\",\n  \"payload\": {\"n\": 2, \"big\": 123456789012345678901234}\n}";
        for patch in ["[]", r#"[{"op": "replace", "path": "/payload/n", "value": 2}]"#] {
            let out = apply_patch(pretty, &parse_patch(patch).unwrap()).unwrap();
            assert_eq!(
                out,
                Patched {
                    body: pretty.to_owned(),
                    changed: false
                },
                "{patch}"
            );
        }
    }

    #[test]
    fn a_decimal_is_compared_by_value_not_spelling() {
        let d = |s| decimal(s).unwrap();
        assert_eq!(d("1.50"), d("1.5"));
        assert_eq!(d("1e2"), d("100.0"));
        assert_eq!(d("100"), d("1E+2"));
        assert_eq!(d("0.000"), d("-0.0"));
        assert_ne!(d("19.99999999999999999"), d("20.0"));
        assert_ne!(d("-1"), d("1"));
        assert_eq!(decimal("1e99999999999999999999"), None);
        assert_eq!(
            number_literals(r#"{"a\"1": [1, -2.5e3], "b": "3"}"#),
            ["1", "-2.5e3"]
        );
    }

    #[test]
    fn the_dedup_id_is_one_per_message_and_body() {
        let a = edit_dedup_id("m-1", "{}");
        assert_eq!(a, edit_dedup_id("m-1", "{}"), "a retry is deduplicated");
        assert_ne!(a, edit_dedup_id("m-1", "{\"a\":1}"), "another edit is not");
        assert_ne!(a, edit_dedup_id("m-2", "{}"));
        assert!(a.len() <= 128);
    }
}
