//! What the Dynamo frontend exports, as the planner reads it from Prometheus: histograms with
//! the frontend's bucket bounds, `histogram_quantile` and the second moments the queueing model
//! takes from the length histograms.

use planner_core::sizing::LengthMoments;

// Bucket bounds (`le`) of the frontend's histograms, as Dynamo 1.6.1's frontend exports them
// (`generate_log_buckets`: 0, then log-spaced bounds rounded to two significant figures; the
// `DYN_METRICS_*` variables unset), each ending in +Inf. The synthetic frontend exports the same;
// the conformance test compares both with the real frontend's exposition.

/// `dynamo_frontend_input_sequence_tokens` bucket bounds.
pub const ISL_BOUNDS: [f64; 13] = [
    0.0,
    100.0,
    210.0,
    430.0,
    870.0,
    1800.0,
    3600.0,
    7400.0,
    15000.0,
    31000.0,
    63000.0,
    130_000.0,
    f64::INFINITY,
];

/// `dynamo_frontend_output_sequence_tokens` bucket bounds.
pub const OSL_BOUNDS: [f64; 11] = [
    0.0,
    100.0,
    210.0,
    430.0,
    880.0,
    1800.0,
    3700.0,
    7600.0,
    16000.0,
    32000.0,
    f64::INFINITY,
];

/// `dynamo_frontend_time_to_first_token_seconds` bucket bounds.
pub const TTFT_BOUNDS: [f64; 19] = [
    0.0,
    0.0022,
    0.0047,
    0.01,
    0.022,
    0.047,
    0.1,
    0.22,
    0.47,
    1.0,
    2.2,
    4.7,
    10.0,
    22.0,
    48.0,
    100.0,
    220.0,
    480.0,
    f64::INFINITY,
];

/// `dynamo_frontend_inter_token_latency_seconds` bucket bounds.
pub const ITL_BOUNDS: [f64; 21] = [
    0.0,
    0.0018,
    0.0033,
    0.0059,
    0.011,
    0.02,
    0.035,
    0.064,
    0.12,
    0.21,
    0.38,
    0.69,
    1.2,
    2.3,
    4.1,
    7.4,
    13.0,
    24.0,
    44.0,
    80.0,
    f64::INFINITY,
];

/// `dynamo_frontend_request_duration_seconds` bucket bounds.
pub const DURATION_BOUNDS: [f64; 11] = [
    0.0,
    2.0,
    4.0,
    8.0,
    16.0,
    32.0,
    64.0,
    130.0,
    260.0,
    510.0,
    f64::INFINITY,
];

/// A Prometheus histogram's increase over a window.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per-bucket counts (not cumulative).
    counts: Vec<f64>,
    sum: f64,
    count: f64,
}

impl Histogram {
    /// An empty histogram over `bounds` (increasing, the last infinite).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0.0; bounds.len()],
            sum: 0.0,
            count: 0.0,
        }
    }

    /// Records one value.
    pub fn observe(&mut self, value: f64) {
        let index = self.bounds.partition_point(|le| *le < value);
        if let Some(slot) = self
            .counts
            .get_mut(index.min(self.bounds.len().saturating_sub(1)))
        {
            *slot += 1.0;
        }
        self.sum += value;
        self.count += 1.0;
    }

    /// Observations.
    pub fn count(&self) -> f64 {
        self.count
    }

    /// Sum of the observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Cumulative counts at each bound (what the `_bucket` series hold).
    pub fn cumulative(&self) -> Vec<f64> {
        let mut total = 0.0;
        self.counts
            .iter()
            .map(|c| {
                total += c;
                total
            })
            .collect()
    }

    /// Prometheus `histogram_quantile(q, ...)`: linear interpolation within the bucket holding
    /// the rank; the highest finite bound when the rank falls in the open bucket; NaN when
    /// empty.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.count.is_nan() || self.count <= 0.0 {
            return f64::NAN;
        }
        let rank = q.clamp(0.0, 1.0) * self.count;
        let cumulative = self.cumulative();
        let mut lower = 0.0;
        let mut below = 0.0;
        for (&le, &cum) in self.bounds.iter().zip(&cumulative) {
            if cum >= rank && cum > below {
                if !le.is_finite() {
                    return lower;
                }
                // Prometheus: the first bucket's lower bound is 0 when its upper bound is
                // positive.
                return lower + (le - lower) * (rank - below) / (cum - below);
            }
            below = cum;
            if le.is_finite() {
                lower = le;
            }
        }
        lower
    }

    /// Moments from the buckets and the exact sum and count.
    pub fn moments(&self) -> Option<LengthMoments> {
        LengthMoments::from_histogram(self.bounds, &self.cumulative(), self.sum, self.count)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::float_cmp)]
    use super::*;

    #[test]
    fn quantile_interpolates_like_prometheus() {
        let mut h = Histogram::new(&TTFT_BOUNDS);
        for v in [0.3, 0.3, 0.4, 0.7] {
            h.observe(v);
        }
        // 3 in (0.22, 0.47], 1 in (0.47, 1]. p50: rank 2 of the 3 in the first.
        assert!((h.quantile(0.5) - (0.22 + 0.25 * 2.0 / 3.0)).abs() < 1e-12);
        assert!((h.quantile(1.0) - 1.0).abs() < 1e-12);
        let mut open = Histogram::new(&TTFT_BOUNDS);
        open.observe(1000.0);
        assert_eq!(open.quantile(0.9), 480.0);
        assert!(Histogram::new(&TTFT_BOUNDS).quantile(0.9).is_nan());
    }

    #[test]
    fn moments_come_from_the_buckets() {
        let mut h = Histogram::new(&ISL_BOUNDS);
        for v in [600.0, 900.0, 1500.0] {
            h.observe(v);
        }
        let m = h.moments().unwrap();
        assert_eq!(m.mean, 1000.0);
        assert!(m.second > 1000.0 * 1000.0);
    }
}
