//! The DLQ, seen by an operator: list, show, replay, purge, and SQS's own redrive.
//!
//! Reading a queue means receiving from it, so every read holds the messages it saw
//! invisible while it reads (that is how it sees the next ones) and makes them visible again
//! before it returns. Replay sends first and deletes after: a crash in between leaves a
//! duplicate, never a loss. Every batched SQS action (release, delete, send) goes through
//! [`sqs_triage::effects::sqs::Sqs`], which holds the batch caps and the rule that only entries
//! listed as successful count.
//!
//! One module per verb: `read` (a message as read, the filter, the sweep), `list` (list
//! and show), `replay`, `edit` (edit one message's body, then replay it), `purge`, `redrive`.

pub mod edit;
pub mod list;
pub mod purge;
pub mod read;
pub mod redrive;
pub mod replay;

pub use edit::{EditOptions, EditReport, EditSource, edit};
pub use list::{ErrorCount, Group, ListReport, MessageSummary, ShowReport, ShownMessage, group, list, show};
pub use purge::{PurgeOptions, PurgePlan, PurgeReport, purge, purge_with};
pub use read::{BodyJob, DlqMessage, Filter, UNRECORDED, check_eventbridge_types, read_all};
pub use redrive::{
    MoveTask, RedriveAction, RedrivePlan, RedriveReport, redrive_cancel, redrive_start,
    redrive_start_confirmed, redrive_status,
};
pub use replay::{MAX_RATE, MIN_RATE, NotMoved, ReplayOptions, ReplayReport, TargetCount, replay};
