//! Rendering reports: aligned plain-text tables for people, JSON for scripts.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

/// A report that prints as text for people and as JSON for scripts.
pub trait Report: Serialize {
    /// The human rendering, ending with a newline.
    fn human(&self) -> String;

    /// When the action did not fully succeed (some selected messages were not sent, moved or
    /// deleted), one line saying so; the CLI prints it and exits with code 5.
    fn problem(&self) -> Option<String> {
        None
    }

    /// Whether the action was audited, for the actions that change state; the CLI reports an
    /// audit item that was not written as an error (exit code 7).
    fn audit(&self) -> Option<&crate::ops::audit::AuditStatus> {
        None
    }
}

/// The report as it should be printed: JSON (one document, pretty) or the human text.
pub fn render<R: Report>(report: &R, json: bool) -> String {
    if json {
        match serde_json::to_string_pretty(report) {
            Ok(s) => s + "\n",
            Err(e) => format!("{{\"error\": \"cannot serialize report: {e}\"}}\n"),
        }
    } else {
        report.human()
    }
}

/// A plain-text table: a header row and aligned columns, long cells cut with `…`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    max_width: usize,
}

impl Table {
    /// A table with these column titles; cells wider than 60 characters are cut.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
            max_width: 60,
        }
    }

    /// Sets the widest a cell may be before it is cut.
    pub(crate) fn max_width(mut self, width: usize) -> Self {
        self.max_width = width.max(4);
        self
    }

    /// Adds a row (missing cells print empty).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// The table as text, one line per row, ending with a newline.
    pub fn render(&self) -> String {
        let cut = |s: &str| -> String {
            let s = crate::ops::one_line(s);
            if s.chars().count() > self.max_width {
                let mut t: String = s.chars().take(self.max_width - 1).collect();
                t.push('…');
                t
            } else {
                s
            }
        };
        let header: Vec<String> = self.header.iter().map(|h| cut(h)).collect();
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(|c| cut(c)).collect())
            .collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for r in &rows {
            for (i, c) in r.iter().enumerate() {
                if i >= widths.len() {
                    widths.push(0);
                }
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| -> String {
            let mut out = String::new();
            for (i, w) in widths.iter().enumerate() {
                let c = cells.get(i).map(String::as_str).unwrap_or("");
                out.push_str(c);
                if i + 1 < widths.len() {
                    out.extend(std::iter::repeat_n(' ', w - c.chars().count() + 2));
                }
            }
            out.trim_end().to_owned() + "\n"
        };
        let mut out = line(&header);
        for r in &rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// A short human age: `42s`, `3m12s`, `5h04m`, `2d03h`.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// The age of an epoch-millisecond timestamp relative to `now_ms`.
pub(crate) fn age_ms(then_ms: u64, now_ms: u64) -> String {
    age(Duration::from_millis(now_ms.saturating_sub(then_ms)))
}

/// Messages above this count get a progress bar.
pub(crate) const PROGRESS_THRESHOLD: u64 = 10;

/// A progress bar on stderr for `len` items when `show` is set and the work is more than a
/// handful; a hidden bar otherwise (also hidden when stderr is not a terminal).
pub fn progress(show: bool, len: u64, verb: &str) -> ProgressBar {
    if !show || len <= PROGRESS_THRESHOLD {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let template = format!("{verb} {{bar:40.cyan/blue}} {{pos}}/{{len}} {{per_sec}} eta {{eta}} {{msg}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_cut() {
        let mut t = Table::new(["TYPE", "COUNT"]).max_width(8);
        t.row(["a", "1"]);
        t.row(["a-very-long-type", "200"]);
        let text = t.render();
        assert_eq!(text, "TYPE      COUNT\na         1\na-very-…  200\n");
    }

    #[test]
    fn ages_are_short() {
        assert_eq!(age(Duration::from_secs(42)), "42s");
        assert_eq!(age(Duration::from_secs(192)), "3m12s");
        assert_eq!(age(Duration::from_secs(5 * 3600 + 240)), "5h04m");
        assert_eq!(age(Duration::from_secs(2 * 86_400 + 3 * 3600)), "2d03h");
    }
}
