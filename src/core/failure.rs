//! The failure record that travels with a dead-lettered message, in its `triage-failure`
//! message attribute.

use serde::{Deserialize, Serialize};

use crate::core::sqs_text;

/// Name of the message attribute holding the failure record.
pub const FAILURE_ATTRIBUTE: &str = "triage-failure";

/// Why a message is in the DLQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureClass {
    /// The handler failed in a way no retry can fix.
    Fatal,
    /// The handler failed transiently on every allowed attempt.
    Exhausted,
    /// The message is not a runnable job (bad envelope, unknown job type). Never executed.
    Invalid,
    /// The queue would not deliver it again in time: its last receive before SQS's redrive
    /// (`maxReceiveCount`) came while it was waiting (deferred, released or between
    /// retries), so it is dead-lettered with a record instead of being moved without one.
    Expiring,
    /// An operator parked it (`triage park`) while it waited for its next retry: moved to the
    /// DLQ at its next delivery without running, with the attempts it had used.
    Parked,
}

impl FailureClass {
    /// The lowercase name used in records, metrics and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fatal => "fatal",
            Self::Exhausted => "exhausted",
            Self::Invalid => "invalid",
            Self::Expiring => "expiring",
            Self::Parked => "parked",
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a human needs to act on a dead-lettered job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// Why it is here.
    pub class: FailureClass,
    /// The last error, truncated to fit SQS's limits.
    pub error: String,
    /// Handler executions so far (0 for `invalid`; for `parked`, the attempts used before the
    /// park).
    pub attempts: u32,
    /// The job type, if the envelope named one.
    pub job_type: Option<String>,
    /// The job id (envelope `id`, else the original message id).
    pub job_id: String,
    /// The queue the message came from (its URL or ARN), for replay.
    pub source_queue: String,
    /// The SQS message id of the failed delivery.
    pub original_message_id: String,
    /// When SQS first handed the message out (epoch ms).
    pub first_received_at: u64,
    /// When it was dead-lettered (epoch ms).
    pub failed_at: u64,
}

impl FailureRecord {
    /// The record as compact JSON in characters SQS takes ([`sqs_text::json`]: a job id or an
    /// error text holding U+FFFE or U+FFFF would have the copy refused), with the error text
    /// cut (on a character boundary, marked with `…[truncated]` when the mark fits too) so the
    /// whole record is at most `max_bytes`. Returns `None` only when even an empty error text
    /// does not fit.
    pub fn to_json_within(&self, max_bytes: usize) -> Option<String> {
        let to_json = |r: &FailureRecord| serde_json::to_string(r).ok().map(sqs_text::json);
        let full = to_json(self)?;
        if full.len() <= max_bytes {
            return Some(full);
        }
        let mut cut = self.clone();
        cut.error.clear();
        let empty_len = to_json(&cut)?.len();
        if empty_len > max_bytes {
            return None;
        }
        const MARK: &str = "…[truncated]";
        let chars: Vec<(usize, char)> = self.error.char_indices().collect();
        let prefix = |n: usize| &self.error[..chars.get(n).map_or(self.error.len(), |(i, _)| *i)];
        // The record with the longest prefix of the error that fits followed by `mark`.
        // Escaping can grow the text, so the length is searched, not computed.
        let mut longest = |mark: &str| {
            let (mut lo, mut hi) = (0usize, chars.len());
            let fits = |cut: &mut FailureRecord, n: usize| {
                cut.error = format!("{}{mark}", prefix(n));
                to_json(cut).filter(|j| j.len() <= max_bytes)
            };
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                match fits(&mut cut, mid) {
                    Some(_) => lo = mid,
                    None => hi = mid - 1,
                }
            }
            fits(&mut cut, lo)
        };
        // No room for the mark: the error cut without it (at worst empty).
        longest(MARK).or_else(|| longest(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(error: &str) -> FailureRecord {
        FailureRecord {
            class: FailureClass::Fatal,
            error: error.to_owned(),
            attempts: 1,
            job_type: Some("t".into()),
            job_id: "j".into(),
            source_queue: "q".into(),
            original_message_id: "m".into(),
            first_received_at: 1,
            failed_at: 2,
        }
    }

    #[test]
    fn serializes_with_lowercase_class() {
        let json = record("boom").to_json_within(10_000).unwrap();
        assert!(json.contains(r#""class":"fatal""#), "{json}");
        let back: FailureRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, record("boom"));
    }

    #[test]
    fn a_record_holds_only_characters_sqs_takes_and_reads_back_the_same() {
        let mut r = record(&"bad \u{fffe}\u{ffff}".repeat(300));
        r.job_id = "j-\u{ffff}".into();
        for max in [100_000, 400] {
            let json = r.to_json_within(max).unwrap();
            assert!(json.len() <= max, "{} > {max}", json.len());
            assert_eq!(sqs_text::refused(&json), None, "{json}");
            let back: FailureRecord = serde_json::from_str(&json).unwrap();
            assert_eq!(back.job_id, r.job_id);
            assert!(r.error.starts_with(back.error.trim_end_matches("…[truncated]")));
        }
    }

    #[test]
    fn long_errors_are_truncated_to_fit() {
        let r = record(&"é\"".repeat(5_000));
        let json = r.to_json_within(1_000).unwrap();
        assert!(json.len() <= 1_000);
        let back: FailureRecord = serde_json::from_str(&json).unwrap();
        assert!(back.error.ends_with("…[truncated]"));
        assert!(
            back.error.len() > 500,
            "cut far more than needed: {}",
            back.error.len()
        );
        assert_eq!(r.to_json_within(50), None);
    }
}
