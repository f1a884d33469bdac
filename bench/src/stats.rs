//! Min / median / max over rounds, and ratios between cases of the same round.

pub use conformance::flood::median;

/// Min, median and max of a set of measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// Largest.
    pub max: f64,
    /// How many values.
    pub n: usize,
}

impl Spread {
    /// The spread of `values`; `None` when empty.
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        let median = median(&mut v);
        Some(Spread {
            min: v[0],
            median,
            max: v[v.len() - 1],
            n: v.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
        let s = Spread::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((s.min, s.median, s.max, s.n), (1.0, 3.0, 5.0, 3));
    }
}
