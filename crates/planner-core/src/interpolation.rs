//! Performance interpolators over profiling data, matching upstream `perf_interpolation.py`:
//! a 1-D not-a-knot cubic spline for prefill (scipy `interp1d(kind="cubic")`, queries clamped to
//! the measured range), and for decode a 100x100 grid over (KV usage, context length) filled by
//! Clough-Tocher interpolation with nearest-neighbour fill outside the samples' hull (scipy
//! `griddata(method="cubic")` then `method="nearest"`).

use ndarray::Array2;
use serde::Serialize;

use super::{
    clough_tocher::{Triangulated, TriangulationError},
    profile::{
        ConfigMapEntries, DecodeProfile, MAX_DECODE_POINTS, MAX_PREFILL_POINTS, PrefillProfile, Profile,
        ProfileError,
    },
};

/// Grid resolution of the decode interpolator (upstream `resolution=100`).
pub const GRID_RESOLUTION: usize = 100;

/// Why an interpolator could not be built from a profile.
#[derive(Debug, thiserror::Error)]
pub enum InterpolationError {
    /// The prefill spline could not be fitted.
    #[error("cannot fit the prefill curve `{field}`: {reason}")]
    Spline {
        /// The curve.
        field: &'static str,
        /// The spline library's explanation.
        reason: String,
    },
    /// The decode samples cannot be triangulated.
    #[error("cannot triangulate the decode samples (x_kv_usage, y_context_length): {0}")]
    Triangulation(#[from] TriangulationError),
    /// More samples than the model is built from (the profile readers refuse them first).
    #[error("field `{field}` has {len} points, more than the limit of {max}")]
    TooManyPoints {
        /// The array's name.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Why a performance model could not be built from a ConfigMap's entries.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The entries are not a usable profile (the message names the ConfigMap, key and limit).
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The profile cannot be interpolated.
    #[error("{profile}: {error}")]
    Interpolation {
        /// The profile's source, e.g. `ConfigMap llama-profile`.
        profile: String,
        /// Why.
        error: InterpolationError,
    },
}

/// A cubic spline with not-a-knot end conditions, as scipy's `interp1d(kind="cubic")` (and
/// `CubicSpline`) build it: C2, and the third derivative continuous at the second and the
/// second-to-last knot. Built from slopes by one tridiagonal solve.
///
/// (The `ndarray-interp` crate's not-a-knot spline was evaluated first; it does not reproduce
/// cubics on unevenly spaced knots, so profiles with uneven ISL steps would drift from upstream.)
#[derive(Clone, Debug)]
struct NotAKnotSpline {
    x: Vec<f64>,
    y: Vec<f64>,
    slopes: Vec<f64>,
    /// Quadratic and cubic coefficients of each segment, computed once: evaluation is on the
    /// planner's hot path (the prompt mix's service time takes a dozen points per interval).
    c2: Vec<f64>,
    c3: Vec<f64>,
}

impl NotAKnotSpline {
    /// `x` strictly increasing, at least four points, all finite.
    fn new(x: &[f64], y: &[f64], field: &'static str) -> Result<Self, InterpolationError> {
        let n = x.len();
        if n < 4 || y.len() != n {
            return Err(InterpolationError::Spline {
                field,
                reason: format!("needs at least 4 points, has {n}"),
            });
        }
        let h: Vec<f64> = x.windows(2).map(|w| w[1] - w[0]).collect();
        let d: Vec<f64> = (0..n - 1).map(|i| (y[i + 1] - y[i]) / h[i]).collect();
        // Tridiagonal system in the slopes: lower[i] s[i-1] + diag[i] s[i] + upper[i] s[i+1] = rhs[i].
        let (mut lower, mut diag, mut upper, mut rhs) =
            (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        for i in 1..n - 1 {
            lower[i] = h[i];
            diag[i] = 2.0 * (h[i - 1] + h[i]);
            upper[i] = h[i - 1];
            rhs[i] = 3.0 * (h[i] * d[i - 1] + h[i - 1] * d[i]);
        }
        diag[0] = h[1];
        upper[0] = h[0] + h[1];
        rhs[0] = ((h[0] + 2.0 * upper[0]) * h[1] * d[0] + h[0] * h[0] * d[1]) / upper[0];
        let (a, b) = (h[n - 2], h[n - 3]);
        lower[n - 1] = a + b;
        diag[n - 1] = b;
        rhs[n - 1] = (a * a * d[n - 3] + (2.0 * (a + b) + a) * b * d[n - 2]) / (a + b);
        // Thomas algorithm.
        for i in 1..n {
            let w = lower[i] / diag[i - 1];
            diag[i] -= w * upper[i - 1];
            rhs[i] -= w * rhs[i - 1];
        }
        let mut slopes = vec![0.0; n];
        slopes[n - 1] = rhs[n - 1] / diag[n - 1];
        for i in (0..n - 1).rev() {
            slopes[i] = (rhs[i] - upper[i] * slopes[i + 1]) / diag[i];
        }
        if slopes.iter().any(|s| !s.is_finite()) {
            return Err(InterpolationError::Spline {
                field,
                reason: "the spline system is singular".into(),
            });
        }
        let (mut c2, mut c3) = (Vec::with_capacity(n - 1), Vec::with_capacity(n - 1));
        for i in 0..n - 1 {
            let (s0, s1) = (slopes[i], slopes[i + 1]);
            c2.push((3.0 * d[i] - 2.0 * s0 - s1) / h[i]);
            c3.push((s0 + s1 - 2.0 * d[i]) / (h[i] * h[i]));
        }
        Ok(Self {
            x: x.to_vec(),
            y: y.to_vec(),
            slopes,
            c2,
            c3,
        })
    }

    /// Value at `q`, which the caller keeps within `[x0, xn]`.
    fn evaluate(&self, q: f64) -> f64 {
        let last = self.x.len() - 2;
        let i = self
            .x
            .partition_point(|&knot| knot <= q)
            .saturating_sub(1)
            .min(last);
        let t = q - self.x[i];
        self.y[i] + t * (self.slopes[i] + t * (self.c2[i] + t * self.c3[i]))
    }
}

/// TTFT and throughput per GPU as functions of input length.
#[derive(Debug)]
pub struct PrefillInterpolator {
    min_isl: f64,
    max_isl: f64,
    ttft: NotAKnotSpline,
    thpt_per_gpu: NotAKnotSpline,
}

impl PrefillInterpolator {
    /// Fits both curves (the profile is validated: sorted, distinct, at least four points).
    pub fn new(profile: &PrefillProfile) -> Result<Self, InterpolationError> {
        let fit = |field: &'static str, values: &[f64]| NotAKnotSpline::new(&profile.isl, values, field);
        let min_isl = profile.isl.first().copied().unwrap_or(0.0);
        let max_isl = profile.isl.last().copied().unwrap_or(0.0);
        Ok(Self {
            min_isl,
            max_isl,
            ttft: fit("prefill_ttft", &profile.ttft_ms)?,
            thpt_per_gpu: fit("prefill_thpt_per_gpu", &profile.thpt_per_gpu)?,
        })
    }

    fn clamp(&self, isl: f64) -> f64 {
        if isl.is_nan() {
            self.min_isl
        } else {
            isl.clamp(self.min_isl, self.max_isl)
        }
    }

    /// Profiled TTFT (ms) at `isl`, clamped to the measured range.
    pub fn interpolate_ttft(&self, isl: f64) -> f64 {
        self.ttft.evaluate(self.clamp(isl))
    }

    /// Profiled prefill throughput (tokens/s per GPU) at `isl`, clamped to the measured range.
    pub fn interpolate_thpt_per_gpu(&self, isl: f64) -> f64 {
        self.thpt_per_gpu.evaluate(self.clamp(isl))
    }
}

/// The best decode operating point found for an ITL target.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DecodeOperatingPoint {
    /// Throughput per GPU (tokens/s) at that point.
    pub thpt_per_gpu: f64,
    /// Interpolated ITL (ms) there; above the target when no point meets it.
    pub itl_ms: f64,
    /// KV-cache usage (fraction) of the point.
    pub kv_usage: f64,
}

/// ITL and throughput per GPU on a grid over (KV usage, context length).
#[derive(Clone, Debug)]
pub struct DecodeInterpolator {
    max_kv_tokens: f64,
    max_context_length: f64,
    /// KV usage of each grid column, `linspace(0, 1, 100)`.
    kv_usage: Vec<f64>,
    /// `[context row, kv column]`, as upstream's meshgrid.
    itl_grid: Array2<f64>,
    thpt_grid: Array2<f64>,
}

/// numpy's `linspace(start, stop, n)`.
fn linspace(start: f64, stop: f64, n: usize) -> Vec<f64> {
    let step = (stop - start) / (n - 1) as f64;
    let mut values: Vec<f64> = (0..n).map(|i| start + i as f64 * step).collect();
    if let Some(last) = values.last_mut() {
        *last = stop;
    }
    values
}

/// numpy's `round` (half to even) followed by `clip(0, 99)`.
fn grid_index(position: f64) -> usize {
    if position.is_nan() {
        return 0;
    }
    position
        .round_ties_even()
        .clamp(0.0, (GRID_RESOLUTION - 1) as f64) as usize
}

impl DecodeInterpolator {
    /// Builds both grids.
    pub fn new(profile: &DecodeProfile) -> Result<Self, InterpolationError> {
        let points: Vec<[f64; 2]> = profile
            .kv_usage
            .iter()
            .zip(&profile.context_length)
            .map(|(&x, &y)| [x, y])
            .collect();
        let mesh = Triangulated::new(&points)?;
        let max_context_length = profile.context_length.iter().copied().fold(f64::MIN, f64::max);
        let kv_usage = linspace(0.0, 1.0, GRID_RESOLUTION);
        let context = linspace(0.0, max_context_length, GRID_RESOLUTION);
        let grid = |values: &[f64]| {
            let interpolant = mesh.interpolant(values);
            Array2::from_shape_fn((GRID_RESOLUTION, GRID_RESOLUTION), |(iy, ix)| {
                let p = [kv_usage[ix], context[iy]];
                interpolant
                    .evaluate(p)
                    .unwrap_or_else(|| mesh.nearest_value(values, p))
            })
        };
        Ok(Self {
            max_kv_tokens: profile.max_kv_tokens,
            max_context_length,
            itl_grid: grid(&profile.itl_ms),
            thpt_grid: grid(&profile.thpt_per_gpu),
            kv_usage,
        })
    }

    /// Grid cell of a concurrency (requests per engine) and context length, as upstream rounds it.
    fn index(&self, concurrency: f64, context_length: f64) -> (usize, usize) {
        let kv = concurrency * context_length / self.max_kv_tokens;
        (grid_index(kv / (1.0 / 99.0)), self.row(context_length))
    }

    fn row(&self, context_length: f64) -> usize {
        grid_index(context_length / (self.max_context_length / 99.0))
    }

    /// Profiled ITL (ms) at `concurrency` requests per engine of `context_length` tokens.
    pub fn interpolate_itl(&self, concurrency: f64, context_length: f64) -> f64 {
        let (ix, iy) = self.index(concurrency, context_length);
        self.itl_grid[[iy, ix]]
    }

    /// Profiled decode throughput (tokens/s per GPU) at `concurrency` and `context_length`.
    pub fn interpolate_thpt_per_gpu(&self, concurrency: f64, context_length: f64) -> f64 {
        let (ix, iy) = self.index(concurrency, context_length);
        self.thpt_grid[[iy, ix]]
    }

    /// The highest-KV-usage grid point whose ITL meets `itl_ms` at `context_length` (scanned
    /// from full KV usage down, since interpolated ITL need not be monotonic); the lowest point
    /// when none does.
    pub fn find_best_throughput_per_gpu(&self, itl_ms: f64, context_length: f64) -> DecodeOperatingPoint {
        let iy = self.row(context_length);
        let ix = (0..GRID_RESOLUTION)
            .rev()
            .find(|&ix| self.itl_grid[[iy, ix]] <= itl_ms)
            .unwrap_or(0);
        DecodeOperatingPoint {
            thpt_per_gpu: self.thpt_grid[[iy, ix]],
            itl_ms: self.itl_grid[[iy, ix]],
            kv_usage: self.kv_usage[ix],
        }
    }
}

/// What the planner needs to know about engine performance. Implemented by the interpolated
/// profile; tests and what-if tools can supply fixed curves.
pub trait PerformanceCurves {
    /// Profiled TTFT (ms) at an input length.
    fn prefill_ttft_ms(&self, isl: f64) -> f64;
    /// Profiled prefill throughput (tokens/s per GPU) at an input length.
    fn prefill_thpt_per_gpu(&self, isl: f64) -> f64;
    /// Profiled ITL (ms) at a concurrency (requests per engine) and context length.
    fn decode_itl_ms(&self, concurrency: f64, context_length: f64) -> f64;
    /// Best decode operating point meeting an ITL target at a context length.
    fn decode_best_point(&self, itl_ms: f64, context_length: f64) -> DecodeOperatingPoint;
    /// KV-cache capacity of one decode engine (tokens), when known.
    fn max_kv_tokens(&self) -> Option<f64> {
        None
    }
    /// Longest profiled prompt (tokens), when known: longer prompts take proportionally longer
    /// to prefill than the longest profiled one.
    fn max_profiled_isl(&self) -> Option<f64> {
        None
    }
}

/// Both interpolators of a profile, built once and shared.
#[derive(Debug)]
pub struct PerformanceModel {
    /// Prefill curves.
    pub prefill: PrefillInterpolator,
    /// Decode grids.
    pub decode: DecodeInterpolator,
}

impl PerformanceModel {
    /// Builds the interpolators of a validated profile. Profiles with more samples than the
    /// readers accept ([`MAX_PREFILL_POINTS`], [`MAX_DECODE_POINTS`]) are refused, so the cost
    /// is bounded whoever built the profile.
    pub fn new(profile: &Profile) -> Result<Self, InterpolationError> {
        let cap = |field: &'static str, len: usize, max: usize| {
            if len > max {
                Err(InterpolationError::TooManyPoints { field, len, max })
            } else {
                Ok(())
            }
        };
        cap("prefill_isl", profile.prefill.isl.len(), MAX_PREFILL_POINTS)?;
        cap("x_kv_usage", profile.decode.kv_usage.len(), MAX_DECODE_POINTS)?;
        Ok(Self {
            prefill: PrefillInterpolator::new(&profile.prefill)?,
            decode: DecodeInterpolator::new(&profile.decode)?,
        })
    }

    /// Reads a profile from a ConfigMap's entries (as [`Profile::from_config_map_entries`])
    /// and builds its model, with a bounded cost: every size the data could inflate is capped
    /// while reading (see [`crate::profile`]), and building from a profile at the caps takes
    /// well under a second on one core (about 0.2 s in a release build). CPU-bound and
    /// synchronous: async callers run it on a blocking thread. `source` names the ConfigMap
    /// in errors.
    pub fn from_config_map_entries(source: &str, entries: &ConfigMapEntries<'_>) -> Result<Self, ModelError> {
        let profile = Profile::from_config_map_entries(source, entries)?;
        Self::new(&profile).map_err(|error| ModelError::Interpolation {
            profile: source.to_string(),
            error,
        })
    }
}

impl PerformanceCurves for PerformanceModel {
    fn prefill_ttft_ms(&self, isl: f64) -> f64 {
        self.prefill.interpolate_ttft(isl)
    }

    fn prefill_thpt_per_gpu(&self, isl: f64) -> f64 {
        self.prefill.interpolate_thpt_per_gpu(isl)
    }

    fn decode_itl_ms(&self, concurrency: f64, context_length: f64) -> f64 {
        self.decode.interpolate_itl(concurrency, context_length)
    }

    fn decode_best_point(&self, itl_ms: f64, context_length: f64) -> DecodeOperatingPoint {
        self.decode.find_best_throughput_per_gpu(itl_ms, context_length)
    }

    fn max_kv_tokens(&self) -> Option<f64> {
        Some(self.decode.max_kv_tokens)
    }

    fn max_profiled_isl(&self) -> Option<f64> {
        Some(self.prefill.max_isl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cubic(x: f64) -> f64 {
        0.5 * x.powi(3) - 2.0 * x * x + x + 7.0
    }

    #[test]
    fn not_a_knot_spline_reproduces_a_cubic_and_clamps() {
        let isl = vec![1.0, 2.0, 4.0, 5.0, 8.0];
        let profile = PrefillProfile {
            ttft_ms: isl.iter().map(|&x| cubic(x)).collect(),
            thpt_per_gpu: isl.iter().map(|&x| 2.0 * x).collect(),
            isl,
        };
        let interpolator = PrefillInterpolator::new(&profile).unwrap();
        // A not-a-knot cubic spline reproduces any cubic exactly.
        for x in [1.5, 3.3, 6.7] {
            assert!(
                (interpolator.interpolate_ttft(x) - cubic(x)).abs() < 1e-9,
                "{x}: {} vs {}",
                interpolator.interpolate_ttft(x),
                cubic(x)
            );
        }
        assert!((interpolator.interpolate_thpt_per_gpu(3.0) - 6.0).abs() < 1e-9);
        // No extrapolation: queries are clamped to the measured range.
        assert!((interpolator.interpolate_ttft(100.0) - cubic(8.0)).abs() < 1e-9);
        assert!((interpolator.interpolate_ttft(0.0) - cubic(1.0)).abs() < 1e-9);
    }

    #[test]
    fn matches_scipy_on_uneven_knots() {
        // scipy 1.17: interp1d([1, 2, 3, 4, 5], sin(x), kind="cubic")([1.5, 3.3]) and
        // interp1d([100, 400, 1500, 4000, 9000, 16000], ttft)(...) below.
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        let spline = NotAKnotSpline::new(&x, &x.map(f64::sin), "t").unwrap();
        assert!((spline.evaluate(1.5) - 1.022162).abs() < 1e-6);
        assert!((spline.evaluate(3.3) - -0.15042145).abs() < 1e-6);
        let isl = [100.0, 400.0, 1500.0, 4000.0, 9000.0, 16000.0];
        let ttft = [20.0, 25.0, 41.0, 90.0, 210.0, 380.0];
        let spline = NotAKnotSpline::new(&isl, &ttft, "t").unwrap();
        for (q, expected) in [
            (250.0, 22.577_770_9),
            (3000.0, 68.374_453_16),
            (12000.0, 285.036_644_32),
        ] {
            assert!(
                (spline.evaluate(q) - expected).abs() < 1e-6,
                "{q}: {}",
                spline.evaluate(q)
            );
        }
    }

    #[test]
    fn four_points_are_enough() {
        let isl = vec![1.0, 2.0, 3.0, 4.0];
        let profile = PrefillProfile {
            ttft_ms: isl.iter().map(|&x| cubic(x)).collect(),
            thpt_per_gpu: vec![1.0; 4],
            isl,
        };
        let interpolator = PrefillInterpolator::new(&profile).unwrap();
        assert!((interpolator.interpolate_ttft(2.5) - cubic(2.5)).abs() < 1e-9);
    }

    #[test]
    fn linspace_matches_numpy() {
        let values = linspace(0.0, 1.0, 100);
        assert_eq!(values[0], 0.0);
        assert_eq!(values[99], 1.0);
        assert!((values[50] - 50.0 / 99.0).abs() < 1e-15);
    }

    #[test]
    fn grid_index_rounds_half_to_even_and_clips() {
        assert_eq!(grid_index(2.5), 2);
        assert_eq!(grid_index(3.5), 4);
        assert_eq!(grid_index(-4.0), 0);
        assert_eq!(grid_index(250.0), 99);
        assert_eq!(grid_index(f64::NAN), 0);
    }

    #[test]
    fn decode_grids_match_scipy() {
        // Cells sampled from scipy's griddata grids by tools/reference/decode_grid.py.
        let reference: serde_json::Value =
            serde_json::from_str(include_str!("../tests/fixtures/scipy-decode-grids.json")).unwrap();
        for (name, cells) in reference["profiles"].as_object().unwrap() {
            // The data as published: scipy ran on it, without the built-in throughput correction.
            let published = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../config/profiles")
                .join(name);
            let profile = Profile::from_dir(&published).unwrap();
            let decode = DecodeInterpolator::new(&profile.decode).unwrap();
            for cell in cells.as_array().unwrap() {
                let (iy, ix) = (
                    cell["iy"].as_u64().unwrap() as usize,
                    cell["ix"].as_u64().unwrap() as usize,
                );
                for (grid, key) in [(&decode.itl_grid, "itl"), (&decode.thpt_grid, "thpt")] {
                    let expected = cell[key].as_f64().unwrap();
                    let actual = grid[[iy, ix]];
                    let tolerance = 1e-9 * expected.abs().max(1.0);
                    assert!(
                        (actual - expected).abs() <= tolerance,
                        "{name} {key}[{iy},{ix}]: {actual} != scipy {expected}"
                    );
                }
            }
        }
    }

    #[test]
    fn find_best_scans_from_full_kv_usage_down() {
        let profile = crate::profile::Profile::builtin("h200-llama3.1-8b-tp1").unwrap();
        let decode = DecodeInterpolator::new(&profile.decode).unwrap();
        let context = 3000.0 + 150.0 / 2.0;
        let generous = decode.find_best_throughput_per_gpu(1000.0, context);
        assert_eq!(generous.kv_usage, 1.0);
        let tight = decode.find_best_throughput_per_gpu(10.0, context);
        assert!(tight.itl_ms <= 10.0 && tight.kv_usage < 1.0);
        assert!(tight.thpt_per_gpu < generous.thpt_per_gpu);
        // Impossible targets return the lowest-usage point, whose ITL is above the target.
        let impossible = decode.find_best_throughput_per_gpu(0.1, context);
        assert_eq!(impossible.kv_usage, 0.0);
        assert!(impossible.itl_ms > 0.1);
    }
}
