//! A figure against its baseline, as the tables print it: `n/a` when the baseline was not
//! measured in this run (`--modes` left it out), never `inf` or `NaN`.

use std::fmt;

/// `value / baseline`, or nothing to say when there is no baseline (or it measured 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio(Option<f64>);

impl Ratio {
    /// `value` against `baseline`; `None` (not measured) and 0 give `n/a`.
    pub fn of(value: f64, baseline: Option<f64>) -> Self {
        Ratio(
            baseline
                .filter(|b| b.is_finite() && *b > 0.0)
                .map(|b| value / b),
        )
    }

    /// The ratio, when there is one.
    pub fn value(self) -> Option<f64> {
        self.0
    }
}

/// Two decimals, or `n/a`; a width and alignment apply (`{:>8}`).
impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self.0 {
            Some(r) => format!("{r:.2}"),
            None => "n/a".to_owned(),
        };
        f.pad(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::Ratio;

    #[test]
    fn a_ratio_without_its_baseline_is_not_applicable() {
        assert_eq!(Ratio::of(10.0, Some(4.0)).to_string(), "2.50");
        assert_eq!(Ratio::of(10.0, None).to_string(), "n/a");
        assert_eq!(Ratio::of(10.0, Some(0.0)).to_string(), "n/a");
        assert_eq!(format!("{:>6}", Ratio::of(10.0, None)), "   n/a");
    }
}
