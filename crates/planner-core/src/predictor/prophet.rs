//! Prophet on a sliding window (upstream `ProphetPredictor`), through `augurs-prophet` with its
//! Stan model compiled to WebAssembly (`wasmstan`): no cmdstan binary to ship.
//!
//! As upstream: only the last `prophet_window_size` points are kept, fewer than 5 give the last
//! value, and a default Prophet model is fitted on every forecast (the window bounds the cost).
//! The optimizer is L-BFGS with 10,000 iterations. Python `prophet` 1.2.1 uses Newton below 100
//! points, but Stan's Newton optimizer relies on C++ exceptions to reject steps, and in the
//! WebAssembly build an exception aborts the run; so small windows are fitted by L-BFGS here,
//! which lands on the same optimum up to the optimizer's tolerance. Uncertainty intervals are
//! not drawn (only `yhat` is used).
//!
//! Fixed upstream bug: observation `k` is stamped `2024-01-01 + k * interval_seconds` and the
//! forecast is for the next step, `+ interval_seconds`. Upstream (before 2026-03-24) asked for
//! `+ 1 s` after the last point's step count, i.e. a point almost at the start of the window
//! in seconds; the timestamps here step by the interval throughout.
//!
//! Deviation: the forecast is clamped at 0 in raw mode too (as upstream does since 2026-03).

#[cfg(feature = "prophet")]
use std::sync::OnceLock;

#[cfg(feature = "prophet")]
use augurs_prophet::wasmstan::WasmstanOptimizer;
#[cfg(feature = "prophet")]
use augurs_prophet::{
    Algorithm, PredictionData, Prophet, ProphetOptions, TrainingData, optimizer::OptimizeOpts,
};
use serde::{Deserialize, Serialize};

use super::{Fallback, Forecast, PredictorConfig};

/// Fewest points upstream fits Prophet on.
const MIN_POINTS: usize = 5;
/// 2024-01-01T00:00:00Z, upstream's first timestamp.
#[cfg(feature = "prophet")]
const START_TIMESTAMP: i64 = 1_704_067_200;
/// Python prophet's optimizer iteration limit.
#[cfg(feature = "prophet")]
const OPTIMIZER_ITERATIONS: u32 = 10_000;

/// The process-wide optimizer. Building it compiles the WebAssembly module (about 0.5 s), so it
/// is built once, on first use, and cloned (cheaply) for each fit. `Err` holds why it could not
/// be built; Prophet forecasts then fall back to the last value.
#[cfg(feature = "prophet")]
fn shared_optimizer() -> Result<WasmstanOptimizer, String> {
    static OPTIMIZER: OnceLock<Result<WasmstanOptimizer, String>> = OnceLock::new();
    OPTIMIZER
        .get_or_init(|| {
            // `WasmstanOptimizer::new` panics if the module embedded in augurs-prophet is
            // invalid (a packaging bug); a planner must not die of it.
            std::panic::catch_unwind(WasmstanOptimizer::new)
                .map_err(|_| "the embedded Prophet WebAssembly model could not be loaded".to_string())
        })
        .clone()
}

/// Build the shared optimizer now rather than on the first Prophet forecast (the operator calls
/// this at start-up when Prophet is configured, so the first interval is not 0.5 s late).
/// `false` when it cannot be built, or this build has no Prophet backend.
pub fn warm_up_optimizer() -> bool {
    #[cfg(feature = "prophet")]
    return shared_optimizer().is_ok();
    #[cfg(not(feature = "prophet"))]
    false
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct ProphetState {
    /// Points accepted since creation (upstream `curr_step`): the newest kept point has step
    /// `steps - 1`, which fixes its timestamp.
    steps: u64,
}

#[cfg(feature = "prophet")]
fn interval_seconds(config: &PredictorConfig) -> i64 {
    if config.interval_seconds.is_finite() && config.interval_seconds >= 1.0 {
        config.interval_seconds.round() as i64
    } else {
        1
    }
}

#[cfg(feature = "prophet")]
fn timestamp(step: u64, interval: i64) -> i64 {
    START_TIMESTAMP.saturating_add(i64::try_from(step).unwrap_or(i64::MAX).saturating_mul(interval))
}

/// The first line of an error (optimizer errors carry a WebAssembly backtrace that is no use
/// in a status message).
#[cfg(feature = "prophet")]
fn first_line(context: &str, error: &dyn std::fmt::Display) -> String {
    let text = error.to_string();
    format!("{context}: {}", text.lines().next().unwrap_or_default())
}

impl ProphetState {
    pub(super) fn observe(&mut self) {
        self.steps += 1;
    }

    pub(super) fn predict(&mut self, config: &PredictorConfig, window: &[f64]) -> Forecast {
        let last = window.last().copied().unwrap_or(0.0);
        if window.len() < MIN_POINTS {
            return Forecast::fallback(
                last,
                Fallback::TooFewPoints {
                    have: window.len(),
                    need: MIN_POINTS,
                },
            );
        }
        match self.fit_and_forecast(config, window) {
            Ok(yhat) => {
                let value = if config.log1p {
                    yhat.exp_m1().max(0.0)
                } else {
                    yhat
                };
                Forecast::model(value)
            }
            Err(reason) => Forecast::fallback(last, Fallback::ModelFailed { reason }),
        }
    }

    /// Without the `prophet` feature there is no Stan backend: every forecast falls back.
    #[cfg(not(feature = "prophet"))]
    fn fit_and_forecast(&self, _: &PredictorConfig, _: &[f64]) -> Result<f64, String> {
        Err("this build has no Prophet backend (planner-core's `prophet` feature)".into())
    }

    #[cfg(feature = "prophet")]
    fn fit_and_forecast(&self, config: &PredictorConfig, window: &[f64]) -> Result<f64, String> {
        let optimizer = shared_optimizer()?;
        let interval = interval_seconds(config);
        let first_step = self.steps.saturating_sub(window.len() as u64);
        let ds: Vec<i64> = (0..window.len() as u64)
            .map(|k| timestamp(first_step + k, interval))
            .collect();
        let y: Vec<f64> = window
            .iter()
            .map(|v| if config.log1p { v.max(0.0).ln_1p() } else { *v })
            .collect();
        let options = ProphetOptions {
            uncertainty_samples: 0,
            ..ProphetOptions::default()
        };
        let data = TrainingData::new(ds, y).map_err(|e| first_line("Prophet data", &e))?;
        let mut model = Prophet::new(options, optimizer);
        let opts = OptimizeOpts {
            algorithm: Some(Algorithm::Lbfgs),
            iter: Some(OPTIMIZER_ITERATIONS),
            ..Default::default()
        };
        model.fit(data, opts).map_err(|e| first_line("Prophet fit", &e))?;
        let future = PredictionData::new(vec![timestamp(self.steps, interval)]);
        let predictions = model
            .predict(future)
            .map_err(|e| first_line("Prophet predict", &e))?;
        predictions
            .yhat
            .point
            .first()
            .copied()
            .ok_or_else(|| "Prophet returned no forecast".to_string())
    }
}
