//! Distributions of measurements: a leaf every figure of a run is summarised with.

use serde::Serialize;

/// Summary of a set of measurements (milliseconds unless said otherwise).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Dist {
    pub n: usize,
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Dist {
    /// Nearest-rank percentiles of `values`.
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let k = ((p / 100.0) * v.len() as f64).ceil() as usize;
            v[k.clamp(1, v.len()) - 1]
        };
        Self {
            n: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: rank(50.0),
            p95: rank(95.0),
            p99: rank(99.0),
            max: v[v.len() - 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let d = Dist::of(&v);
        assert_eq!(
            (d.n, d.p50, d.p95, d.p99, d.max),
            (100, 50.0, 95.0, 99.0, 100.0)
        );
        assert_eq!(d.mean, 50.5);
        let one = Dist::of(&[7.0]);
        assert_eq!((one.p50, one.p99, one.max), (7.0, 7.0, 7.0));
        assert_eq!(Dist::of(&[]).n, 0);
    }
}
