//! Small inline SVG charts of the last hour, one value a minute. No script, no style attribute
//! (the CSP forbids inline styles): presentation attributes and classes only.

use maud::{html, Markup};

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 120.0;

fn scale(max: f64) -> f64 {
    if max > 0.0 {
        (HEIGHT - 10.0) / max
    } else {
        0.0
    }
}

/// One series of bars (per-minute counts), labelled for screen readers by `label`.
pub(crate) fn bars(label: &str, values: &[u64], class: &str) -> Markup {
    let max = values.iter().copied().max().unwrap_or(0) as f64;
    let k = scale(max);
    let step = WIDTH / values.len().max(1) as f64;
    let total: u64 = values.iter().sum();
    html! {
        svg class="chart" viewBox={"0 0 " (WIDTH) " " (HEIGHT)} role="img"
            aria-label={(label) ": " (total) " in the last hour, at most " (max) " a minute"} {
            title { (label) }
            line class="axis" x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) {}
            @for (i, v) in values.iter().enumerate() {
                @let h = *v as f64 * k;
                rect class=(class) x=(format!("{:.1}", i as f64 * step + 1.0))
                    y=(format!("{:.1}", HEIGHT - h)) width=(format!("{:.1}", (step - 2.0).max(1.0)))
                    height=(format!("{:.1}", h)) {
                    title { (v) }
                }
            }
            text class="max" x="4" y="12" { "max " (max) "/min" }
        }
    }
}

/// Two lines (p50, p99 latency in seconds); minutes without deliveries are gaps.
pub(crate) fn latency(label: &str, p50: &[Option<f64>], p99: &[Option<f64>]) -> Markup {
    let max = p50
        .iter()
        .chain(p99)
        .flatten()
        .fold(0.0_f64, |a, b| a.max(*b));
    let k = scale(max);
    let step = WIDTH / p50.len().max(1) as f64;
    let points = |values: &[Option<f64>]| -> Vec<String> {
        // One polyline per run of minutes with a value.
        let mut runs = vec![String::new()];
        for (i, v) in values.iter().enumerate() {
            match v {
                Some(v) => {
                    if let Some(run) = runs.last_mut() {
                        run.push_str(&format!(
                            "{:.1},{:.1} ",
                            i as f64 * step + step / 2.0,
                            HEIGHT - v * k
                        ));
                    }
                }
                None => runs.push(String::new()),
            }
        }
        runs.retain(|r| !r.is_empty());
        runs
    };
    html! {
        svg class="chart" viewBox={"0 0 " (WIDTH) " " (HEIGHT)} role="img"
            aria-label={(label) ": at most " (format!("{max:.3}")) " s"} {
            title { (label) }
            line class="axis" x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) {}
            @for run in points(p99) {
                polyline class="p99" fill="none" points=(run) {}
            }
            @for run in points(p50) {
                polyline class="p50" fill="none" points=(run) {}
            }
            // A lone minute has no line: a dot shows it.
            @for (i, (a, b)) in p50.iter().zip(p99).enumerate() {
                @let x = format!("{:.1}", i as f64 * step + step / 2.0);
                @if let Some(v) = b { circle class="p99" cx=(x) cy=(format!("{:.1}", HEIGHT - v * k)) r="2.5" {} }
                @if let Some(v) = a { circle class="p50" cx=(x) cy=(format!("{:.1}", HEIGHT - v * k)) r="2.5" {} }
            }
            text class="max" x="4" y="12" { "max " (format!("{max:.3}")) " s" }
        }
    }
}
