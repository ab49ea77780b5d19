//! Item 4, herd: `herd` jobs fail at the same instant; where do their first retries land? The peak
//! number in any 100 ms window, for each jitter strategy, against the limit of a perfectly
//! uniform spread over the same range. Pure computation over `Backoff::delay`.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use sqs_triage::core::{Backoff, JobError};

use super::{Options, Section, median};

const WINDOW_MS: u64 = 100;

struct Strategy {
    id: &'static str,
    name: &'static str,
    backoff: Backoff,
    /// The range the first retry's delay can take, in ms (start, width).
    range_ms: (u64, u64),
    /// Distinct delays are whole seconds.
    whole_seconds: bool,
    /// Drawn in the histogram (a strategy whose first retries are another's is not).
    plotted: bool,
}

fn strategies() -> Vec<Strategy> {
    let s = Duration::from_secs;
    vec![
        Strategy {
            id: "none",
            name: "no jitter (3 s × 2)",
            backoff: Backoff::exponential(s(3), 2.0, s(3600), Duration::ZERO),
            range_ms: (3_000, 0),
            whole_seconds: false,
            plotted: true,
        },
        Strategy {
            id: "default",
            name: "default: 3 s × 2 + uniform 0–1 s (the seed's)",
            backoff: Backoff::default(),
            range_ms: (3_000, 1_000),
            whole_seconds: false,
            plotted: true,
        },
        Strategy {
            id: "full",
            name: "full jitter: uniform 0–3 s",
            backoff: Backoff::FullJitter {
                base: s(3),
                multiplier: 2.0,
                max: s(3600),
            },
            range_ms: (0, 3_000),
            whole_seconds: false,
            plotted: true,
        },
        Strategy {
            id: "decorrelated",
            name: "decorrelated: uniform 3–9 s",
            backoff: Backoff::Decorrelated {
                base: s(3),
                max: s(3600),
            },
            range_ms: (3_000, 6_000),
            whole_seconds: false,
            plotted: true,
        },
        Strategy {
            id: "sidekiq",
            name: "Sidekiq: 15 s + rand(10) s",
            backoff: Backoff::Sidekiq,
            range_ms: (15_000, 10_000),
            whole_seconds: true,
            plotted: true,
        },
        Strategy {
            id: "sidekiq8",
            name: "Sidekiq 8: 15 s + rand(10 · 1) s",
            backoff: Backoff::Sidekiq8,
            range_ms: (15_000, 10_000),
            whole_seconds: true,
            plotted: false,
        },
    ]
}

/// First-retry times (ms after the failure) of `n` jobs.
fn landings(b: &Backoff, n: usize, seed: u64) -> Vec<u64> {
    retry_landings(b, 1, n, seed)
}

/// Times (ms after the failure) of retry `retry` of `n` jobs whose attempt failed together.
fn retry_landings(b: &Backoff, retry: u32, n: usize, seed: u64) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let err = JobError::transient("dependency down");
    let mut t: Vec<u64> = (0..n)
        .map(|_| b.delay(retry, &err, &mut rng).as_millis() as u64)
        .collect();
    t.sort_unstable();
    t
}

/// The most landings in any half-open window `[x, x + WINDOW_MS)` (sorted input).
fn peak(sorted: &[u64]) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..sorted.len() {
        while sorted[hi] - sorted[lo] >= WINDOW_MS {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

pub fn run(opts: &Options) -> Section {
    let mut s = Section::new("4. Herd: first retries of jobs that failed together");
    let n = opts.herd;
    let seeds: u64 = if opts.quick { 3 } else { 21 };
    s.line(format!(
        "{n} jobs fail at t = 0. Peak = most first retries landing in any {WINDOW_MS} ms window \
         (sliding), median over {seeds} seeds. Uniform-spread limit = {n} × {WINDOW_MS} ms / the \
         strategy's range, the best any spread over that range can do."
    ));
    s.line(String::new());
    s.header(&[
        "strategy",
        "range of the first retry",
        "peak / 100 ms",
        "uniform-spread limit",
        "peak ÷ limit",
    ]);
    let mut plotted = Vec::new();
    for st in strategies() {
        let mut peaks: Vec<f64> = (1..=seeds)
            .map(|seed| peak(&landings(&st.backoff, n, seed)) as f64)
            .collect();
        let p = median(&mut peaks);
        let limit = if st.range_ms.1 == 0 {
            n as f64
        } else {
            (n as f64 * WINDOW_MS as f64 / st.range_ms.1 as f64).max(1.0)
        };
        let (a, w) = (st.range_ms.0 as f64 / 1000.0, st.range_ms.1 as f64 / 1000.0);
        let range = if w == 0.0 {
            format!("exactly {a} s")
        } else if st.whole_seconds {
            format!("{a}–{} s, whole seconds", a + w - 1.0)
        } else {
            format!("{a}–{} s", a + w)
        };
        s.row(&[
            st.name.into(),
            range,
            format!("{p:.0}"),
            format!("{limit:.1}"),
            format!("{:.1}×", p / limit),
        ]);
        s.value(&format!("herd.{}.peak", st.id), p);
        s.value(&format!("herd.{}.limit", st.id), limit);
        if st.plotted {
            plotted.push((st.name, landings(&st.backoff, n, 1), limit));
        }
    }
    sidekiq_later_retries(&mut s, n, seeds);
    let svg = opts.svg_path();
    match plot(&svg, n, &plotted) {
        Ok(()) => {
            let shown = svg.strip_prefix(&opts.manifest_dir).unwrap_or(&svg);
            s.line(String::new());
            s.line(format!(
                "![first retries per 100 ms]({})",
                shown.display().to_string().replace("docs/", "")
            ));
            s.line(String::new());
            s.line(format!("Histogram (seed 1): `{}`.", shown.display()));
        }
        Err(e) => s.fail(format!("plot not written to {}: {e}", svg.display())),
    }
    s
}

/// Sidekiq's two jitters at later retries: `n` jobs whose attempt `retry` failed together.
/// For `count = retry - 1`, both spread over `10 · (count + 1)` s; the older formula lands on
/// 10 instants of it (multiples of `count + 1`), Sidekiq 8 on every whole second.
fn sidekiq_later_retries(s: &mut Section, n: usize, seeds: u64) {
    s.line(String::new());
    s.line(format!(
        "Sidekiq's two formulas agree on the first retry (`rand(10) · 1` and `rand(10 · 1)`) and \
         part from the second on. {n} jobs whose attempt failed together, peak of their next \
         retry per {WINDOW_MS} ms, median over {seeds} seeds:"
    ));
    s.line(String::new());
    s.header(&[
        "Sidekiq formula",
        "retry (count)",
        "delay range",
        "distinct instants",
        "peak / 100 ms",
        "uniform-spread limit",
        "peak ÷ limit",
    ]);
    for (id, name, backoff) in [
        (
            "sidekiq",
            "older documented: rand(10)·(count+1)",
            Backoff::Sidekiq,
        ),
        ("sidekiq8", "Sidekiq 8: rand(10·(count+1))", Backoff::Sidekiq8),
    ] {
        for retry in [1u32, 2, 3, 5, 10] {
            let count = u64::from(retry - 1);
            let lo = count.pow(4) + 15;
            let width = 10 * (count + 1);
            let instants = if matches!(backoff, Backoff::Sidekiq8) {
                width
            } else {
                10
            };
            let mut peaks: Vec<f64> = (1..=seeds)
                .map(|seed| peak(&retry_landings(&backoff, retry, n, seed)) as f64)
                .collect();
            let p = median(&mut peaks);
            let limit = (n as f64 * WINDOW_MS as f64 / (width * 1000) as f64).max(1.0);
            let top = if matches!(backoff, Backoff::Sidekiq8) {
                lo + width - 1
            } else {
                lo + 9 * (count + 1)
            };
            s.row(&[
                name.into(),
                format!("{retry} ({count})"),
                format!("{lo}–{top} s"),
                instants.to_string(),
                format!("{p:.0}"),
                format!("{limit:.1}"),
                format!("{:.1}×", p / limit),
            ]);
            s.value(&format!("herd.{id}.retry{retry}.peak"), p);
            s.value(&format!("herd.{id}.retry{retry}.limit"), limit);
        }
    }
}

/// One panel per strategy: retries per 100 ms bin over 0–26 s, the limit as a line.
fn plot(path: &Path, n: usize, series: &[(&str, Vec<u64>, f64)]) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    let bins = 260usize;
    let root = SVGBackend::new(path, (900, 170 * series.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((series.len(), 1));
    let colors = [RED, BLUE, GREEN, MAGENTA, BLACK];
    for (i, ((name, times, limit), area)) in series.iter().zip(panels.iter()).enumerate() {
        let mut counts = vec![0u32; bins];
        for &t in times {
            let b = (t / WINDOW_MS) as usize;
            if b < bins {
                counts[b] += 1;
            }
        }
        let top = f64::from(counts.iter().copied().max().unwrap_or(1))
            .max(*limit)
            .max(1.0);
        let y_max = (top * 1.15).ceil();
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{name}: peak {} per 100 ms ({n} jobs)",
                    counts.iter().max().unwrap_or(&0)
                ),
                ("sans-serif", 16),
            )
            .margin(6)
            .x_label_area_size(22)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..(bins as f64 / 10.0), 0f64..y_max)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("seconds after the failure")
            .x_labels(14)
            .y_labels(4)
            .draw()
            .map_err(|e| e.to_string())?;
        let color = colors[i % colors.len()];
        chart
            .draw_series(counts.iter().enumerate().filter(|(_, c)| **c > 0).map(|(b, c)| {
                let x = b as f64 / 10.0;
                Rectangle::new([(x, 0.0), (x + 0.1, f64::from(*c))], color.filled())
            }))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, *limit), (bins as f64 / 10.0, *limit)],
                BLACK.stroke_width(1),
            )))
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
