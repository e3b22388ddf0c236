//! The ARIMA predictor, as upstream drives pmdarima:
//!
//! - fewer than 5 points: the last value; all points equal: that value (pmdarima would say 0);
//! - the first forecast with enough points runs `auto_arima` on the whole history (in log1p
//!   space when asked), and the selected model is kept from then on;
//! - if raw values were asked for and the search picked `(0,d,0)` (a random walk or noise
//!   around a mean: the series looked unpredictable), it is refitted on `log1p(y)` and the
//!   predictor stays in log space for good (upstream's "collapse" fallback, reported as
//!   [`Fallback::Log1pSwitch`]);
//! - afterwards each forecast first "updates" the model with the points seen since the last one,
//!   as pmdarima's `ARIMA.update` does: the same order is re-estimated on the whole history,
//!   starting from the current parameters, for `max(5, new_points / 10)` optimizer iterations;
//! - any failure: the last value.
//!
//! The order is therefore chosen once, on whatever history exists at the first forecast (5
//! points in a cold start, the warm-up trace otherwise); that is upstream behaviour, kept for
//! parity.
//!
//! The estimation itself (`model`, `search`, `lbfgs`) reproduces pmdarima 2.1.1 on statsmodels:
//! no Rust crate implements pmdarima's variant of auto-ARIMA (the ones that exist follow R's
//! `forecast::auto.arima` or use other estimators; see the README's design notes).

mod lbfgs;
mod linalg;
mod model;
mod search;

use serde::{Deserialize, Serialize};

use super::{Fallback, Forecast};
use model::{FitOptions, FittedArima};

/// Fewest points upstream fits ARIMA on.
const MIN_POINTS: usize = 5;
/// pmdarima's `update` iterations for one new point: `max(5, n_new // 10)`.
const UPDATE_MIN_ITERATIONS: usize = 5;

/// Why estimation failed (shown in [`Fallback::ModelFailed`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum ArimaError {
    #[error("no observations")]
    TooShort,
    #[error("model order too large")]
    OrderTooLarge,
    #[error("numerical failure: {0}")]
    Numerical(&'static str),
    #[error("no candidate ARIMA model could be fitted")]
    NoViableModel,
}

/// A non-seasonal ARIMA order `(p, d, q)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArimaOrder {
    /// Autoregressive order.
    pub p: usize,
    /// Differencing order.
    pub d: usize,
    /// Moving-average order.
    pub q: usize,
}

impl std::fmt::Display for ArimaOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({},{},{})", self.p, self.d, self.q)
    }
}

/// The selected model and the scale it works on.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SelectedModel {
    fitted: FittedArima,
    /// Modelling `log1p(y)` rather than `y`.
    log_scale: bool,
    /// Set when raw mode collapsed to this order and the model was refitted on log1p.
    switched_from: Option<ArimaOrder>,
}

/// ARIMA predictor state beyond the history: the selected model (small: an order and at most a
/// dozen parameters, so it is persisted and a restored predictor forecasts exactly as the
/// original) and how many points arrived since it was last estimated.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct ArimaState {
    requested_log1p: bool,
    #[serde(default)]
    selected: Option<SelectedModel>,
    #[serde(default)]
    pending: usize,
}

fn to_model_scale(history: &[f64], log_scale: bool) -> Vec<f64> {
    history
        .iter()
        .map(|v| if log_scale { v.max(0.0).ln_1p() } else { v.max(0.0) })
        .collect()
}

fn order_of(fitted: &FittedArima) -> ArimaOrder {
    ArimaOrder {
        p: fitted.spec.p,
        d: fitted.spec.d,
        q: fitted.spec.q,
    }
}

impl ArimaState {
    pub(super) fn new(log1p: bool) -> Self {
        Self {
            requested_log1p: log1p,
            selected: None,
            pending: 0,
        }
    }

    pub(super) fn observe(&mut self, _value: f64) {
        self.pending += 1;
    }

    /// The selected order and whether it works on log1p, once a model exists.
    pub(super) fn selected_order(&self) -> Option<(ArimaOrder, bool)> {
        self.selected.as_ref().map(|s| (order_of(&s.fitted), s.log_scale))
    }

    pub(super) fn predict(&mut self, history: &[f64]) -> Forecast {
        let last = history.last().copied().unwrap_or(0.0).max(0.0);
        if history.len() < MIN_POINTS {
            return Forecast::fallback(
                last,
                Fallback::TooFewPoints {
                    have: history.len(),
                    need: MIN_POINTS,
                },
            );
        }
        if search::is_constant(history) {
            return Forecast::fallback(history[0].max(0.0), Fallback::ConstantSeries);
        }
        match self.estimate_and_forecast(history) {
            Ok(forecast) => forecast,
            Err(error) => {
                self.pending = 0;
                Forecast::fallback(
                    last,
                    Fallback::ModelFailed {
                        reason: format!("ARIMA: {error}"),
                    },
                )
            }
        }
    }

    fn estimate_and_forecast(&mut self, history: &[f64]) -> Result<Forecast, ArimaError> {
        match &mut self.selected {
            None => {
                let raw = !self.requested_log1p;
                let first = search::auto_arima(&to_model_scale(history, !raw))?;
                let collapsed = first.spec.p == 0 && first.spec.q == 0;
                let selected = if raw && collapsed {
                    match search::auto_arima(&to_model_scale(history, true)) {
                        Ok(log_fit) => SelectedModel {
                            fitted: log_fit,
                            log_scale: true,
                            switched_from: Some(order_of(&first)),
                        },
                        // Upstream keeps the raw model when the log refit fails.
                        Err(_) => SelectedModel {
                            fitted: first,
                            log_scale: false,
                            switched_from: None,
                        },
                    }
                } else {
                    SelectedModel {
                        fitted: first,
                        log_scale: !raw,
                        switched_from: None,
                    }
                };
                self.selected = Some(selected);
            }
            Some(selected) if self.pending > 0 => {
                let y = to_model_scale(history, selected.log_scale);
                let iterations = UPDATE_MIN_ITERATIONS.max(self.pending / 10);
                selected.fitted = model::fit(
                    &selected.fitted.spec,
                    &y,
                    Some(&selected.fitted.params),
                    FitOptions {
                        max_iterations: iterations,
                    },
                )?;
            }
            Some(_) => {}
        }
        self.pending = 0;
        let Some(selected) = &self.selected else {
            return Err(ArimaError::NoViableModel);
        };
        let y = to_model_scale(history, selected.log_scale);
        let raw_forecast = model::forecast(&selected.fitted, &y)?;
        let value = if selected.log_scale {
            raw_forecast.exp_m1().max(0.0)
        } else {
            raw_forecast.max(0.0)
        };
        Ok(match selected.switched_from {
            Some(raw_order) => Forecast::fallback(value, Fallback::Log1pSwitch { raw_order }),
            None => Forecast::model(value),
        })
    }
}

/// Test access to the estimation internals, for the parity tests against pmdarima.
#[cfg(test)]
pub(crate) mod testing {
    pub(crate) use super::model::{ArimaSpec, FittedArima};

    pub(crate) fn auto_arima(y: &[f64]) -> Result<FittedArima, super::ArimaError> {
        super::search::auto_arima(y)
    }

    pub(crate) fn forecast(fitted: &FittedArima, y: &[f64]) -> Result<f64, super::ArimaError> {
        super::model::forecast(fitted, y)
    }

    pub(crate) fn loglike(spec: &ArimaSpec, params: &[f64], y: &[f64]) -> Result<f64, super::ArimaError> {
        Ok(super::model::filter(spec, params, y)?.loglike)
    }
}
