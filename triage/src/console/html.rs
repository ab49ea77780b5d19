//! HTML building blocks: escaping, the page frame, tables, and the arrivals chart.
//!
//! Every piece of text that comes from a queue, a table or a request goes through [`esc`]
//! before it is written into a page; nothing is ever written unescaped into an attribute or
//! an element, and the pages carry no inline script or style (the Content-Security-Policy
//! forbids both).

use std::collections::BTreeMap;
use std::fmt::Write;

/// Text escaped for HTML element content and double-quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A query-string component, percent-encoded.
pub fn q(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A query string (`a=1&b=2`, already percent-encoded), from pairs.
pub fn query<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

/// A whole page: the navigation, a heading and `body` (already HTML).
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>{t} · triage console</title>\
<link rel=\"stylesheet\" href=\"/assets/console.css\">\
<script src=\"/assets/console.js\" defer></script></head>\
<body><nav><strong>triage console</strong> <a href=\"/\">Overview</a> <a href=\"/dlq\">DLQ</a> \
<a href=\"/park\">Park a job</a> <a href=\"/audit\">Audit trail</a></nav>\
<main><h1>{t}</h1>\n{body}</main></body></html>\n",
        t = esc(title),
    )
}

/// A table from a header and rows of cells that are already HTML.
pub fn table(id: &str, header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("<table id=\"{}\"><thead><tr>", esc(id));
    for h in header {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for r in rows {
        out.push_str("<tr>");
        for c in r {
            let _ = write!(out, "<td>{c}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// Text shown preformatted (escaped).
pub fn pre(id: &str, text: &str) -> String {
    format!("<pre id=\"{}\">{}</pre>", esc(id), esc(text))
}

/// A body as shown: pretty JSON when it parses as JSON, else the text as it is.
pub fn pretty_body(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| body.to_owned())
}

/// A hidden form field.
pub fn hidden(name: &str, value: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
        esc(name),
        esc(value)
    )
}

/// A seconds count as a short age (`42s`, `5m`, `3h`, `2d`).
pub fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// The DLQ's arrivals over time, one colour per job type, as an inline SVG of stacked bars:
/// `arrivals` are (job type, failure time in epoch ms). The time axis runs from the oldest
/// failure to `now_ms` in `buckets` equal steps.
pub fn arrivals_chart(arrivals: &[(String, u64)], now_ms: u64, buckets: usize) -> String {
    if arrivals.is_empty() {
        return "<p id=\"chart-empty\">No DLQ messages: nothing to chart.</p>".into();
    }
    let buckets = buckets.max(1);
    let oldest = arrivals
        .iter()
        .map(|(_, t)| *t)
        .min()
        .unwrap_or(now_ms)
        .min(now_ms);
    // At least one minute wide, so a burst of failures still spreads over a readable axis.
    let span = now_ms.saturating_sub(oldest).max(60_000);
    let start = now_ms.saturating_sub(span);
    let step = span.div_ceil(buckets as u64).max(1);
    let mut types: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (t, at) in arrivals {
        let i = ((at.saturating_sub(start)) / step).min(buckets as u64 - 1) as usize;
        types.entry(t.as_str()).or_insert_with(|| vec![0; buckets])[i] += 1;
    }
    let totals: Vec<u64> = (0..buckets).map(|i| types.values().map(|v| v[i]).sum()).collect();
    let max = totals.iter().copied().max().unwrap_or(1).max(1);
    let (w, h, left, bottom, top) = (720.0_f64, 220.0_f64, 40.0_f64, 30.0_f64, 10.0_f64);
    let plot_h = h - bottom - top;
    let bar_w = (w - left - 10.0) / buckets as f64;
    let mut svg = format!(
        "<svg id=\"arrivals-chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h}\" \
width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"DLQ arrivals over time per job type\">"
    );
    let _ = write!(
        svg,
        "<line x1=\"{left}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"#888\"/>\
<text x=\"{tx}\" y=\"{ty}\" font-size=\"11\" text-anchor=\"end\" fill=\"#444\">{max}</text>\
<text x=\"{tx}\" y=\"{y}\" font-size=\"11\" text-anchor=\"end\" fill=\"#444\">0</text>",
        y = h - bottom,
        x2 = w - 10.0,
        tx = left - 4.0,
        ty = top + 10.0,
    );
    let mut base = vec![0u64; buckets];
    for (n, (t, counts)) in types.iter().enumerate() {
        let colour = PALETTE[n % PALETTE.len()];
        for (i, &c) in counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let y0 = h - bottom - (base[i] as f64 / max as f64) * plot_h;
            let bh = (c as f64 / max as f64) * plot_h;
            let _ = write!(
                svg,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\"><title>{}: {c}</title></rect>",
                left + i as f64 * bar_w + 1.0,
                y0 - bh,
                (bar_w - 2.0).max(1.0),
                bh,
                esc(t)
            );
            base[i] += c;
        }
    }
    let _ = write!(
        svg,
        "<text x=\"{left}\" y=\"{y}\" font-size=\"11\" fill=\"#444\">{}</text>\
<text x=\"{x}\" y=\"{y}\" font-size=\"11\" text-anchor=\"end\" fill=\"#444\">now</text></svg>",
        esc(&format!("{} ago", age(span / 1000))),
        y = h - 10.0,
        x = w - 10.0,
    );
    let mut legend = String::from("<ul class=\"legend\">");
    for (n, (t, counts)) in types.iter().enumerate() {
        let _ = write!(
            legend,
            "<li><svg width=\"12\" height=\"12\"><rect width=\"12\" height=\"12\" fill=\"{}\"/></svg> {} ({})</li>",
            PALETTE[n % PALETTE.len()],
            esc(t),
            counts.iter().sum::<u64>()
        );
    }
    legend.push_str("</ul>");
    format!(
        "<figure>{svg}<figcaption>DLQ arrivals per job type, by failure time, in {buckets} steps of {}{legend}</figcaption></figure>",
        esc(&age(step / 1000))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        assert_eq!(q("a b&c=d"), "a+b%26c%3Dd");
    }

    #[test]
    fn the_chart_counts_every_arrival_and_escapes_job_types() {
        let now = 10_000_000;
        let arrivals = vec![
            ("<b>x</b>".to_owned(), now - 50_000),
            ("<b>x</b>".to_owned(), now - 1_000),
            ("email".to_owned(), now - 30_000),
        ];
        let svg = arrivals_chart(&arrivals, now, 12);
        assert!(svg.contains("&lt;b&gt;x&lt;/b&gt; (2)"), "{svg}");
        assert!(svg.contains("email (1)"), "{svg}");
        assert!(!svg.contains("<b>"), "{svg}");
        assert_eq!(svg.matches("<rect x=").count(), 3, "{svg}");
        assert!(arrivals_chart(&[], now, 12).contains("nothing to chart"));
    }
}
