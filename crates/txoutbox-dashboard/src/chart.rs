//! Small inline SVG charts of the outbox's recent activity, one value a bucket (a minute, 15
//! minutes, an hour), with a value axis (0, half, the top) and a time axis (five UTC ticks). No
//! script, no style attribute (the CSP forbids inline styles): presentation attributes and
//! classes only.

use chrono::{DateTime, Utc};
use maud::{html, Markup};

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 200.0;
/// The plot's margins: room for the value labels on the left and the time labels below.
const LEFT: f64 = 80.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 34.0;

/// The buckets a chart spans: their starts (oldest first) and how a tick names one.
pub(crate) struct TimeAxis<'a> {
    pub starts: &'a [DateTime<Utc>],
    /// A chrono format for the ticks (`%H:%M`, `%a %H:%M`).
    pub format: &'a str,
}

fn plot_width() -> f64 {
    WIDTH - LEFT - RIGHT
}

fn plot_bottom() -> f64 {
    HEIGHT - BOTTOM
}

/// The y of `v` on a plot whose top is `max` (0 at the bottom).
fn y(v: f64, max: f64) -> f64 {
    if max > 0.0 {
        plot_bottom() - v / max * (plot_bottom() - TOP)
    } else {
        plot_bottom()
    }
}

/// The axes: the value labels (`label(v)` at 0, half and the top, with grid lines) and five time
/// ticks.
fn axes(max: f64, label: impl Fn(f64) -> String, time: &TimeAxis<'_>) -> Markup {
    let n = time.starts.len();
    let step = plot_width() / n.max(1) as f64;
    let mut ticks: Vec<usize> = (0..5).map(|i| i * n.saturating_sub(1) / 4).collect();
    ticks.dedup();
    html! {
        @for v in [0.0, max / 2.0, max] {
            @let at = format!("{:.1}", y(v, max));
            line class="grid" x1=(LEFT) y1=(at) x2=(WIDTH - RIGHT) y2=(at) {}
            text class="value" x=(LEFT - 6.0) y=(format!("{:.1}", y(v, max) + 7.0)) text-anchor="end" { (label(v)) }
        }
        line class="axis" x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(plot_bottom()) {}
        line class="axis" x1=(LEFT) y1=(plot_bottom()) x2=(WIDTH - RIGHT) y2=(plot_bottom()) {}
        @for i in ticks {
            @if let Some(start) = time.starts.get(i) {
                @let x = format!("{:.1}", LEFT + i as f64 * step + step / 2.0);
                line class="axis" x1=(x) y1=(plot_bottom()) x2=(x) y2=(plot_bottom() + 4.0) {}
                // The first and last labels stay inside the chart.
                @let anchor = if i == 0 { "start" } else if i + 1 == n { "end" } else { "middle" };
                text class="time" x=(x) y=(HEIGHT - 8.0) text-anchor=(anchor) { (start.format(time.format)) }
            }
        }
    }
}

/// A count's label: whole numbers; halves of odd tops with one decimal.
fn count_label(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Seconds as a label: `250 ms`, `1.5 s`, `2 min`.
fn seconds_label(v: f64) -> String {
    if v == 0.0 {
        "0".to_owned()
    } else if v < 1.0 {
        format!("{:.0} ms", v * 1000.0)
    } else if v < 120.0 {
        format!("{v:.1} s")
    } else {
        format!("{:.0} min", v / 60.0)
    }
}

/// One series of bars (counts a bucket), labelled for screen readers by `label`; `per` names
/// the bucket ("minute", "15 min", "hour").
pub(crate) fn bars(
    label: &str,
    values: &[u64],
    class: &str,
    time: &TimeAxis<'_>,
    per: &str,
) -> Markup {
    let max = values.iter().copied().max().unwrap_or(0) as f64;
    let step = plot_width() / values.len().max(1) as f64;
    let total: u64 = values.iter().sum();
    html! {
        svg class="chart" viewBox={"0 0 " (WIDTH) " " (HEIGHT)} role="img"
            aria-label={(label) ": " (total) " in all, at most " (max) " a " (per)} {
            title { (label) }
            (axes(max, count_label, time))
            @for (i, v) in values.iter().enumerate() {
                @let top = y(*v as f64, max);
                rect class=(class) x=(format!("{:.1}", LEFT + i as f64 * step + step * 0.1))
                    y=(format!("{top:.1}")) width=(format!("{:.2}", (step * 0.8).max(0.5)))
                    height=(format!("{:.1}", plot_bottom() - top)) {
                    title { (v) }
                }
            }
        }
    }
}

/// Two lines (p50, p99 latency in seconds); buckets without deliveries are gaps.
pub(crate) fn latency(
    label: &str,
    p50: &[Option<f64>],
    p99: &[Option<f64>],
    time: &TimeAxis<'_>,
) -> Markup {
    let max = p50
        .iter()
        .chain(p99)
        .flatten()
        .filter(|v| v.is_finite())
        .fold(0.0_f64, |a, b| a.max(*b));
    let step = plot_width() / p50.len().max(1) as f64;
    let x = |i: usize| LEFT + i as f64 * step + step / 2.0;
    let points = |values: &[Option<f64>]| -> Vec<String> {
        // One polyline per run of buckets with a value.
        let mut runs = vec![String::new()];
        for (i, v) in values.iter().enumerate() {
            match v {
                Some(v) if v.is_finite() => {
                    if let Some(run) = runs.last_mut() {
                        run.push_str(&format!("{:.1},{:.1} ", x(i), y(*v, max)));
                    }
                }
                _ => runs.push(String::new()),
            }
        }
        runs.retain(|r| !r.is_empty());
        runs
    };
    html! {
        svg class="chart" viewBox={"0 0 " (WIDTH) " " (HEIGHT)} role="img"
            aria-label={(label) ": at most " (seconds_label(max))} {
            title { (label) }
            (axes(max, seconds_label, time))
            @for run in points(p99) {
                polyline class="p99" fill="none" points=(run) {}
            }
            @for run in points(p50) {
                polyline class="p50" fill="none" points=(run) {}
            }
            // A lone bucket has no line: a dot shows it.
            @for (i, (a, b)) in p50.iter().zip(p99).enumerate() {
                @let cx = format!("{:.1}", x(i));
                @if let Some(v) = b.filter(|v| v.is_finite()) { circle class="p99" cx=(cx) cy=(format!("{:.1}", y(v, max))) r="2.5" {} }
                @if let Some(v) = a.filter(|v| v.is_finite()) { circle class="p50" cx=(cx) cy=(format!("{:.1}", y(v, max))) r="2.5" {} }
            }
        }
    }
}
