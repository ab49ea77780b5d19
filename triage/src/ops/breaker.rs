//! `triage breaker` and `triage attempts`: read and force breaker state, show a job's
//! attempt ledger. Forcing goes through [`BreakerStore`](sqs_triage::effects::breaker_store::BreakerStore),
//! so it is a conditional write like any other, and every force is audited (one item in the
//! state table, see [`super::audit`]) when the context audits.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;

use super::audit::{self, AuditEntry, AuditStatus};
use super::output::{Report, Table, age_ms};
use super::{Ctx, OpsError, OpsResult};
use sqs_triage::clock::now_ms;
use sqs_triage::core::breaker::{BreakerState, Phase};
use sqs_triage::effects::table::{BREAKER_SK, PK, SK};

/// One breaker as shown.
#[derive(Debug, Clone, Serialize)]
pub struct BreakerView {
    /// Job type.
    pub job_type: String,
    /// `closed`, `open` or `half_open`, as of now.
    pub phase: String,
    /// Opened by an operator, until closed by one.
    pub forced: bool,
    /// End of the open period (epoch ms), when open and not forced.
    pub open_until_ms: Option<u64>,
    /// Transient failures in the current window.
    pub failures: u32,
    /// Executions reported into the current window, failures included: the failure rate's
    /// denominator.
    pub executions: u32,
    /// Probe successes in this half-open period.
    pub probe_successes: u32,
    /// Probe leases held.
    pub probes_in_flight: usize,
    /// Phase changes so far.
    pub generation: u64,
    /// Writes so far (0: never written, a fresh closed breaker).
    pub version: u64,
}

impl BreakerView {
    fn of(job_type: &str, s: &BreakerState) -> Self {
        Self {
            job_type: job_type.to_owned(),
            phase: s.phase.as_str().to_owned(),
            forced: s.forced,
            open_until_ms: (s.phase == Phase::Open && !s.forced).then_some(s.open_until_ms),
            failures: s.failures,
            executions: s.executions,
            probe_successes: s.probe_successes,
            probes_in_flight: s.leases.len(),
            generation: s.generation,
            version: s.version,
        }
    }
}

/// What `breaker status|open|close|reset` prints.
#[derive(Debug, Clone, Serialize)]
pub struct BreakerReport {
    /// `status`, `open`, `close` or `reset`.
    pub action: String,
    /// The table.
    pub table: String,
    /// The breakers (for a force: the state written).
    pub breakers: Vec<BreakerView>,
    /// Whether the force was audited (forces through an auditing context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditStatus>,
}

impl Report for BreakerReport {
    fn human(&self) -> String {
        let now = now_ms();
        let mut out = String::new();
        if self.action != "status" {
            for b in &self.breakers {
                out.push_str(&format!(
                    "breaker {} forced {}: now {}\n",
                    b.job_type, self.action, b.phase
                ));
            }
        }
        if self.breakers.is_empty() {
            return format!("no breaker state in {} (every job type is closed)\n", self.table);
        }
        let mut t = Table::new(["TYPE", "PHASE", "UNTIL", "FAILED/RAN", "PROBES", "GENERATION"]);
        for b in &self.breakers {
            let until = match (b.forced, b.open_until_ms) {
                (true, _) => "forced (until closed)".to_owned(),
                (false, Some(t)) if t > now => format!("in {}", age_ms(now, t)),
                _ => "-".to_owned(),
            };
            t.row([
                b.job_type.clone(),
                b.phase.clone(),
                until,
                format!("{}/{}", b.failures, b.executions),
                b.probes_in_flight.to_string(),
                b.generation.to_string(),
            ]);
        }
        out.push_str(&t.render());
        out
    }

    fn audit(&self) -> Option<&AuditStatus> {
        self.audit.as_ref()
    }
}

/// Job types that have a breaker item (a Scan on `pk` prefix `breaker#`).
async fn breaker_types(ctx: &Ctx, table: &str) -> OpsResult<Vec<String>> {
    let mut types = Vec::new();
    let mut start: Option<std::collections::HashMap<String, AttributeValue>> = None;
    loop {
        let out = ctx
            .ddb_call("Scan", table, || {
                ctx.ddb
                    .scan()
                    .table_name(table)
                    .filter_expression("begins_with(#pk, :p) AND #sk = :s")
                    .expression_attribute_names("#pk", PK)
                    .expression_attribute_names("#sk", SK)
                    .expression_attribute_values(":p", AttributeValue::S("breaker#".into()))
                    .expression_attribute_values(":s", AttributeValue::S(BREAKER_SK.into()))
                    .projection_expression("#pk")
                    .set_exclusive_start_key(start.clone())
                    .send()
            })
            .await?;
        for item in out.items.unwrap_or_default() {
            if let Some(t) = item
                .get(PK)
                .and_then(|v| v.as_s().ok())
                .and_then(|pk| pk.strip_prefix("breaker#"))
            {
                types.push(t.to_owned());
            }
        }
        match out.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => break,
        }
    }
    types.sort();
    Ok(types)
}

/// `breaker status [TYPE]`: one job type, or every job type with a stored breaker.
pub async fn status(ctx: &Ctx, table: &str, job_type: Option<&str>) -> OpsResult<BreakerReport> {
    let types = match job_type {
        Some(t) => vec![t.to_owned()],
        None => breaker_types(ctx, table).await?,
    };
    let store = ctx.breakers(table);
    let now = now_ms();
    let mut breakers = Vec::new();
    for t in types {
        let s = store
            .status(&t, now)
            .await
            .map_err(|e| ctx.storage_error(e, table))?;
        breakers.push(BreakerView::of(&t, &s));
    }
    Ok(BreakerReport {
        action: "status".into(),
        table: table.to_owned(),
        breakers,
        audit: None,
    })
}

/// An operator's force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Force {
    /// Open until closed, or for a period.
    Open(Option<Duration>),
    /// Close now.
    Close,
    /// Back to a fresh closed breaker.
    Reset,
}

impl Force {
    /// `open`, `close` or `reset`.
    pub fn name(self) -> &'static str {
        match self {
            Force::Open(_) => "open",
            Force::Close => "close",
            Force::Reset => "reset",
        }
    }
}

/// `breaker open|close|reset TYPE`: a conditional write through the breaker store, then one
/// audit item (`breaker.open`, `breaker.close` or `breaker.reset`, target the job type) when
/// the context audits.
pub async fn force(ctx: &Ctx, table: &str, job_type: &str, what: Force) -> OpsResult<BreakerReport> {
    if job_type.trim().is_empty() {
        return Err(OpsError::usage("the job type must not be empty"));
    }
    let store = ctx.breakers(table);
    let now = now_ms();
    let before = store
        .status(job_type, now)
        .await
        .map_err(|e| ctx.storage_error(e, table))?;
    let forced = match what {
        Force::Open(period) => store.force_open(job_type, period, now).await,
        Force::Close => store.force_close(job_type).await,
        Force::Reset => store.reset(job_type).await,
    };
    let after = match forced {
        Ok(after) => after,
        Err(e) => {
            // A write without a clear answer may have landed: audited as unclear.
            let unclear = e.uncertain && e.op == "PutItem";
            let err = ctx.storage_error(e, table);
            if !unclear {
                return Err(err);
            }
            let mut detail = serde_json::json!({ "from": before.phase.as_str() });
            if let Force::Open(Some(period)) = what {
                detail["for"] = humantime::format_duration(period).to_string().into();
            }
            let entry = AuditEntry::new(format!("breaker.{}", what.name()), job_type)
                .detail(detail)
                .outcome("unclear", &err.message);
            return Err(audit::failed_action(ctx, entry, err).await);
        }
    };
    let mut detail = serde_json::json!({
        "from": before.phase.as_str(),
        "to": after.phase.as_str(),
        "generation": after.generation,
        "version": after.version,
    });
    if let Force::Open(Some(period)) = what {
        detail["for"] = humantime::format_duration(period).to_string().into();
    }
    let entry = AuditEntry::new(format!("breaker.{}", what.name()), job_type).detail(detail);
    Ok(BreakerReport {
        action: what.name().into(),
        table: table.to_owned(),
        breakers: vec![BreakerView::of(job_type, &after)],
        audit: audit::record_action(ctx, entry).await,
    })
}

/// What `attempts show JOB_ID [--type TYPE]` prints.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptsReport {
    /// The job id.
    pub job_id: String,
    /// Whether a ledger exists. None means no counted attempt is stored: the job never
    /// failed, finished, or was replayed (a fresh ledger).
    pub found: bool,
    /// Handler executions counted.
    pub attempts: u32,
    /// The counted deliveries (`<message id>#<receive count>`).
    pub deliveries: Vec<String>,
    /// The job must not run before this (epoch ms).
    pub next_attempt_at_ms: Option<u64>,
    /// The last failure.
    pub last_error: Option<String>,
    /// The job type.
    pub job_type: Option<String>,
    /// Last write (epoch ms).
    pub updated_at_ms: Option<u64>,
}

impl Report for AttemptsReport {
    fn human(&self) -> String {
        if !self.found {
            let of_type = match &self.job_type {
                Some(t) => format!(" of type {t}"),
                None => " (any job type)".to_owned(),
            };
            return format!(
                "job {}{of_type}: no attempt ledger (no counted failure: it never failed, finished, or was replayed)\n",
                self.job_id
            );
        }
        let now = now_ms();
        let mut t = Table::new(["FIELD", "VALUE"]).max_width(200);
        t.row(["job id", self.job_id.as_str()]);
        t.row(["job type", self.job_type.as_deref().unwrap_or("-")]);
        t.row(["attempts".to_owned(), self.attempts.to_string()]);
        let deliveries = &self.deliveries;
        t.row(["deliveries counted".to_owned(), deliveries.join(", ")]);
        t.row([
            "next attempt".to_owned(),
            match self.next_attempt_at_ms {
                Some(at) if at > now => format!("in {}", age_ms(now, at)),
                Some(_) => "due".to_owned(),
                None => "-".to_owned(),
            },
        ]);
        t.row(["last error", self.last_error.as_deref().unwrap_or("-")]);
        t.row([
            "updated".to_owned(),
            self.updated_at_ms
                .map(|u| format!("{} ago", age_ms(u, now)))
                .unwrap_or_else(|| "-".into()),
        ]);
        t.render()
    }
}

/// `attempts show JOB_ID [--type TYPE]`: the job's attempt ledger. Ledgers are kept per job
/// type and job id; without `job_type` every type's ledger of this id is looked up (one
/// query), and more than one is a usage error that names the types, so a script never reads
/// another job's counts.
pub async fn attempts(
    ctx: &Ctx,
    table: &str,
    job_type: Option<&str>,
    job_id: &str,
) -> OpsResult<AttemptsReport> {
    let ledger = ctx.ledger(table);
    let item = match job_type {
        Some(t) => ledger
            .show(t, job_id)
            .await
            .map_err(|e| ctx.storage_error(e, table))?,
        None => {
            let mut all = ledger
                .show_all_types(job_id)
                .await
                .map_err(|e| ctx.storage_error(e, table))?;
            if all.len() > 1 {
                let types: Vec<String> = all
                    .iter()
                    .map(|i| i.job_type.clone().unwrap_or_else(|| "-".into()))
                    .collect();
                return Err(OpsError::usage(format!(
                    "job {job_id} has attempt ledgers under {} job types ({}): pass --type",
                    types.len(),
                    types.join(", ")
                )));
            }
            all.pop()
        }
    };
    Ok(match item {
        Some(i) => AttemptsReport {
            job_id: job_id.to_owned(),
            found: true,
            attempts: i.attempts,
            deliveries: i.deliveries,
            next_attempt_at_ms: i.next_attempt_at_ms,
            last_error: i.last_error,
            job_type: i.job_type.or_else(|| job_type.map(str::to_owned)),
            updated_at_ms: i.updated_at_ms,
        },
        None => AttemptsReport {
            job_id: job_id.to_owned(),
            found: false,
            attempts: 0,
            deliveries: Vec::new(),
            next_attempt_at_ms: None,
            last_error: None,
            job_type: job_type.map(str::to_owned),
            updated_at_ms: None,
        },
    })
}
