//! Load predictors: forecast next interval's request count, mean ISL and mean OSL from the
//! per-interval history, as the upstream SLA planner does (Dynamo's `planner/utils/load_predictor.py`).
//!
//! Four kinds share one front end, [`LoadPredictor`]:
//! - [`PredictorKind::Constant`]: the last observed value.
//! - [`PredictorKind::Arima`]: pmdarima-compatible `auto_arima` (stepwise Hyndman-Khandakar search
//!   by AIC, `d` by the KPSS test, exact Gaussian likelihood), fitted once and then updated with
//!   each new point, with the upstream "(0,d,0) → log1p" refit.
//! - [`PredictorKind::Kalman`]: a local-linear-trend Kalman filter.
//! - [`PredictorKind::Prophet`]: Prophet (through `augurs-prophet`) on a sliding window.
//!
//! Common behaviour, as upstream: NaN observations count as 0, and zeros are skipped until the
//! first non-zero value since the last [`LoadPredictor::reset_idle_skip`] (an idle deployment is
//! not evidence of zero demand). Below a predictor's minimum number of points, or when its model
//! fails, the forecast is the last value and [`Forecast::fallback`] says why.
//!
//! Deviation from upstream, everywhere: forecasts are clamped at 0. Upstream clamps ARIMA and
//! (since 2026-03) Prophet, but not Kalman in raw mode; a negative request count or sequence
//! length has no meaning, and two negative forecasts would multiply into a positive load.

mod arima;
mod constant;
mod kalman;
mod prophet;

use serde::{Deserialize, Serialize};

use super::trace::TraceBucket;

pub use arima::ArimaOrder;
pub use prophet::warm_up_optimizer as warm_up_prophet;

/// Which model forecasts the load (`--load-predictor` upstream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PredictorKind {
    /// Next value = last value.
    Constant,
    /// Auto-ARIMA (upstream default).
    Arima,
    /// Local linear trend Kalman filter.
    Kalman,
    /// Prophet on a sliding window.
    Prophet,
}

/// Kalman filter tuning (`--kalman-*` upstream).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KalmanConfig {
    /// Process noise of the level (floored at 1e-12).
    pub q_level: f64,
    /// Process noise of the trend (floored at 1e-12).
    pub q_trend: f64,
    /// Measurement noise (floored at 1e-9).
    pub r: f64,
    /// Observations needed before the filter's forecast is used. Upstream stores this but never
    /// checks it; here it is honoured.
    pub min_points: usize,
}

impl Default for KalmanConfig {
    fn default() -> Self {
        Self {
            q_level: 1.0,
            q_trend: 0.1,
            r: 10.0,
            min_points: 5,
        }
    }
}

/// Everything that selects and tunes a predictor. `Default` gives the upstream defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PredictorConfig {
    /// Which model.
    pub kind: PredictorKind,
    /// Model `log1p(y)` instead of `y` (ARIMA, Kalman, Prophet); forecasts are mapped back with
    /// `expm1`. Spiky, heavy-tailed load is closer to Gaussian on that scale.
    pub log1p: bool,
    /// Kalman tuning.
    pub kalman: KalmanConfig,
    /// Points Prophet is fitted on (it is refitted on every forecast, so this bounds the cost).
    pub prophet_window_size: usize,
    /// Seconds between observations (the adjustment interval); Prophet's timestamps step by it.
    pub interval_seconds: f64,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        Self {
            kind: PredictorKind::Arima,
            log1p: false,
            kalman: KalmanConfig::default(),
            prophet_window_size: 50,
            interval_seconds: 180.0,
        }
    }
}

/// One forecast, and why it is not the model's own when it is not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Forecast {
    /// The forecast for the next interval, finite and `>= 0`.
    pub value: f64,
    /// `None` when the model produced `value`.
    pub fallback: Option<Fallback>,
}

impl Forecast {
    fn model(value: f64) -> Self {
        Self {
            value,
            fallback: None,
        }
    }

    fn fallback(value: f64, why: Fallback) -> Self {
        Self {
            value,
            fallback: Some(why),
        }
    }
}

/// Why the forecast is not the model's own (shown to users in status and explanations).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Fallback {
    /// Not enough history for the model: the last value is used.
    TooFewPoints {
        /// Points kept so far.
        have: usize,
        /// Points the model needs.
        need: usize,
    },
    /// Every point so far is the same value: that value is the forecast (ARIMA would say 0).
    ConstantSeries,
    /// The model could not be fitted or produced no usable number: the last value is used.
    ModelFailed {
        /// What went wrong, for people.
        reason: String,
    },
    /// ARIMA on raw values selected a `(0,d,0)` model (a random walk or white noise around a
    /// mean), so, as upstream, it was refitted on `log1p(y)` and stays on that scale. The
    /// forecast is the log-scale model's.
    Log1pSwitch {
        /// The order the raw-scale fit selected.
        raw_order: ArimaOrder,
    },
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fallback::TooFewPoints { have, need } => {
                write!(
                    f,
                    "only {have} of the {need} points the model needs: using the last value"
                )
            }
            Fallback::ConstantSeries => write!(f, "every observation is the same: using that value"),
            Fallback::ModelFailed { reason } => write!(f, "model failed ({reason}): using the last value"),
            Fallback::Log1pSwitch { raw_order } => write!(
                f,
                "ARIMA on raw values collapsed to {raw_order}: modelling log1p(load) instead"
            ),
        }
    }
}

/// Most points any predictor keeps. Upstream keeps the whole history for ARIMA, so its per
/// interval cost and the persisted state grow without bound; 1440 intervals is three days at
/// the default 180 s, far more than the models use in practice (ARIMA orders are at most 5).
pub const MAX_HISTORY_POINTS: usize = 1440;

/// One predicted series (request count, ISL or OSL).
///
/// `Clone + Serialize + Deserialize` so the operator can persist and restore it. What is
/// serialized is the kept history, the idle-skip flag and the small model state (ARIMA's order,
/// scale and parameters; the Kalman filter's 2-vector and 2x2 covariance); fitted Prophet models
/// are rebuilt from the history on demand.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadPredictor {
    config: PredictorConfig,
    /// Accepted observations (NaN → 0, leading zeros dropped), oldest first, at most
    /// [`MAX_HISTORY_POINTS`] (and `prophet_window_size` for Prophet).
    history: Vec<f64>,
    /// Whether a non-zero value has been seen since the last idle-skip reset.
    seen_nonzero: bool,
    model: ModelState,
}

/// Per-kind state beyond the history.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum ModelState {
    Constant,
    Arima(arima::ArimaState),
    Kalman(kalman::KalmanState),
    Prophet(prophet::ProphetState),
}

impl LoadPredictor {
    /// A predictor with no history.
    pub fn new(config: PredictorConfig) -> Self {
        let model = match config.kind {
            PredictorKind::Constant => ModelState::Constant,
            PredictorKind::Arima => ModelState::Arima(arima::ArimaState::new(config.log1p)),
            PredictorKind::Kalman => ModelState::Kalman(kalman::KalmanState::new(&config.kalman)),
            PredictorKind::Prophet => ModelState::Prophet(prophet::ProphetState::default()),
        };
        Self {
            config,
            history: Vec::new(),
            seen_nonzero: false,
            model,
        }
    }

    /// The configuration this predictor was built with.
    pub fn config(&self) -> &PredictorConfig {
        &self.config
    }

    /// Record one interval's observation. NaN counts as 0 (an interval without traffic has
    /// `0/0` averages); zeros before the first non-zero value since the last
    /// [`reset_idle_skip`](Self::reset_idle_skip) are dropped.
    pub fn add_data_point(&mut self, value: f64) {
        let value = if value.is_nan() { 0.0 } else { value };
        if value == 0.0 && !self.seen_nonzero {
            return;
        }
        if value != 0.0 {
            self.seen_nonzero = true;
        }
        self.history.push(value);
        let keep = match self.config.kind {
            PredictorKind::Prophet => self.config.prophet_window_size.clamp(1, MAX_HISTORY_POINTS),
            _ => MAX_HISTORY_POINTS,
        };
        if self.history.len() > keep {
            let excess = self.history.len() - keep;
            self.history.drain(..excess);
        }
        match &mut self.model {
            ModelState::Constant => {}
            ModelState::Arima(state) => state.observe(value),
            ModelState::Kalman(state) => state.observe(value, &self.config),
            ModelState::Prophet(state) => state.observe(),
        }
    }

    /// Forecast the next interval. Never panics; any model failure falls back to the last value.
    /// Calling it twice without a new observation gives the same answer (the Kalman filter is
    /// not advanced twice, the ARIMA model is not updated twice).
    pub fn predict_next(&mut self) -> Forecast {
        let last = self.last_value();
        let forecast = match &mut self.model {
            ModelState::Constant => constant::predict(&self.history),
            ModelState::Arima(state) => state.predict(&self.history),
            ModelState::Kalman(state) => state.predict(&self.config, self.history.len(), last),
            ModelState::Prophet(state) => state.predict(&self.config, &self.history),
        };
        sanitize(forecast, last)
    }

    /// Start skipping leading zeros again (called after warm-up, so that the idle period right
    /// after deployment does not drag a pre-warmed forecast down).
    pub fn reset_idle_skip(&mut self) {
        self.seen_nonzero = false;
    }

    /// The newest kept observation, 0 when there is none.
    pub fn last_value(&self) -> f64 {
        self.history.last().copied().unwrap_or(0.0)
    }

    /// Number of kept observations.
    pub fn len(&self) -> usize {
        self.history.len()
    }

    /// Whether no observation has been kept yet.
    pub fn is_empty(&self) -> bool {
        self.history.is_empty()
    }

    /// The kept observations, oldest first.
    pub fn history(&self) -> &[f64] {
        &self.history
    }

    /// For ARIMA once a model has been selected: its order and whether it models `log1p(y)`
    /// (for explanations).
    pub fn arima_order(&self) -> Option<(ArimaOrder, bool)> {
        match &self.model {
            ModelState::Arima(state) => state.selected_order(),
            _ => None,
        }
    }
}

/// Last line of defence: a forecast is finite and non-negative whatever the model did.
fn sanitize(forecast: Forecast, last: f64) -> Forecast {
    if forecast.value.is_finite() {
        return Forecast {
            value: forecast.value.max(0.0),
            ..forecast
        };
    }
    let fallback_value = if last.is_finite() { last.max(0.0) } else { 0.0 };
    Forecast::fallback(
        fallback_value,
        Fallback::ModelFailed {
            reason: format!("non-finite forecast {}", forecast.value),
        },
    )
}

/// The three series the planner predicts, fed the same observations.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadPredictors {
    /// Requests per interval.
    pub requests: LoadPredictor,
    /// Mean input sequence length.
    pub isl: LoadPredictor,
    /// Mean output sequence length.
    pub osl: LoadPredictor,
}

impl LoadPredictors {
    /// Three empty predictors of the configured kind.
    pub fn new(config: &PredictorConfig) -> Self {
        Self {
            requests: LoadPredictor::new(config.clone()),
            isl: LoadPredictor::new(config.clone()),
            osl: LoadPredictor::new(config.clone()),
        }
    }

    /// Record one interval's observed request count, mean ISL and mean OSL.
    pub fn observe(&mut self, requests: f64, isl: f64, osl: f64) {
        self.requests.add_data_point(requests);
        self.isl.add_data_point(isl);
        self.osl.add_data_point(osl);
    }

    /// Forecast `(requests, isl, osl)` for the next interval.
    pub fn predict(&mut self) -> (Forecast, Forecast, Forecast) {
        (
            self.requests.predict_next(),
            self.isl.predict_next(),
            self.osl.predict_next(),
        )
    }

    /// Pre-load history from a bucketed trace (upstream `--load-predictor-warmup-trace`), then
    /// reset the idle skip so that the live deployment's initial zeros are still dropped.
    pub fn warm_up(&mut self, buckets: &[TraceBucket]) {
        for bucket in buckets {
            self.observe(bucket.request_count, bucket.avg_isl, bucket.avg_osl);
        }
        self.requests.reset_idle_skip();
        self.isl.reset_idle_skip();
        self.osl.reset_idle_skip();
    }
}

#[cfg(test)]
mod parity;
#[cfg(test)]
mod tests;
