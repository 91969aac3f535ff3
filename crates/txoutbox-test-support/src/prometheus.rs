//! Reading a Prometheus text scrape in tests.

/// The value of the sample `series` (its name and labels exactly as rendered, e.g.
/// `txoutbox_messages_delivered_total{destination="email"}`) in `scrape`; `None` when absent.
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::sample;

    #[test]
    fn sample_finds_the_exact_series_only() {
        let scrape = "# TYPE a_total counter\n\
                      a_total{d=\"x\"} 2\n\
                      a_total{d=\"xy\"} 5\n\
                      a_total_sum 1.5\n";
        assert_eq!(sample(scrape, r#"a_total{d="x"}"#), Some(2.0));
        assert_eq!(sample(scrape, r#"a_total{d="xy"}"#), Some(5.0));
        assert_eq!(sample(scrape, "a_total_sum"), Some(1.5));
        assert_eq!(sample(scrape, "a_total"), None);
    }
}
