//! Local-linear-trend Kalman filter (upstream `KalmanPredictor`, filterpy semantics).
//!
//! State `[level, trend]`, `F = [[1, 1], [0, 1]]`, `H = [1, 0]`, `P0 = 1000 I`,
//! `Q = diag(q_level, q_trend)`, `R = r`. The first observation sets the level (the covariance
//! stays at `P0`); each later one is a predict step (unless a forecast already advanced the
//! filter for this interval) and a Joseph-form update, exactly as filterpy computes it. A
//! forecast is the predicted level, cached so that asking twice does not advance the filter
//! twice.
//!
//! Deviation from upstream: `min_points` is honoured (upstream stores `kalman_min_points` and
//! never checks it, so it forecasts from the first point); below it the forecast is the last
//! value. The filter itself runs from the first point either way, so the forecasts from
//! `min_points` on are upstream's.

use serde::{Deserialize, Serialize};

use super::{Fallback, Forecast, KalmanConfig, PredictorConfig};

const INITIAL_VARIANCE: f64 = 1000.0;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct KalmanState {
    initialized: bool,
    /// `[level, trend]`.
    state: [f64; 2],
    covariance: [[f64; 2]; 2],
    /// The predicted level when the filter has already been advanced for the coming interval.
    cached_level: Option<f64>,
}

fn noise(config: &KalmanConfig) -> (f64, f64, f64) {
    (
        config.q_level.max(1e-12),
        config.q_trend.max(1e-12),
        config.r.max(1e-9),
    )
}

impl KalmanState {
    pub(super) fn new(_config: &KalmanConfig) -> Self {
        Self {
            initialized: false,
            state: [0.0, 0.0],
            covariance: [[INITIAL_VARIANCE, 0.0], [0.0, INITIAL_VARIANCE]],
            cached_level: None,
        }
    }

    /// filterpy `predict()`: `x = F x`, `P = F P F' + Q`.
    fn advance(&mut self, config: &KalmanConfig) {
        let (q_level, q_trend, _) = noise(config);
        let [level, trend] = self.state;
        self.state = [level + trend, trend];
        let [[p00, p01], [p10, p11]] = self.covariance;
        // F P = [[p00 + p10, p01 + p11], [p10, p11]]; (F P) F' adds the second column to the first.
        let a00 = p00 + p10;
        let a01 = p01 + p11;
        self.covariance = [[a00 + a01 + q_level, a01], [p10 + p11, p11 + q_trend]];
    }

    /// filterpy `update(z)` with its Joseph-form covariance update.
    fn correct(&mut self, z: f64, config: &KalmanConfig) {
        let (_, _, r) = noise(config);
        let [[p00, p01], [p10, p11]] = self.covariance;
        let innovation = z - self.state[0];
        // filterpy multiplies by the inverse of S rather than dividing; kept for bit parity.
        let s_inverse = 1.0 / (p00 + r);
        let k0 = p00 * s_inverse;
        let k1 = p10 * s_inverse;
        self.state = [self.state[0] + k0 * innovation, self.state[1] + k1 * innovation];
        // I - K H = [[1 - k0, 0], [-k1, 1]].
        let (i00, i10) = (1.0 - k0, -k1);
        // A = (I - K H) P.
        let a00 = i00 * p00;
        let a01 = i00 * p01;
        let a10 = i10 * p00 + p10;
        let a11 = i10 * p01 + p11;
        // A (I - K H)' + K R K'.
        self.covariance = [
            [a00 * i00 + k0 * r * k0, a00 * i10 + a01 + k0 * r * k1],
            [a10 * i00 + k1 * r * k0, a10 * i10 + a11 + k1 * r * k1],
        ];
    }

    pub(super) fn observe(&mut self, value: f64, config: &PredictorConfig) {
        let z = if config.log1p {
            value.max(0.0).ln_1p()
        } else {
            value
        };
        if !self.initialized {
            self.state = [z, 0.0];
            self.initialized = true;
        } else {
            if self.cached_level.is_none() {
                self.advance(&config.kalman);
            }
            self.correct(z, &config.kalman);
        }
        self.cached_level = None;
    }

    pub(super) fn predict(&mut self, config: &PredictorConfig, have: usize, last: f64) -> Forecast {
        let need = config.kalman.min_points.max(1);
        if !self.initialized || have < need {
            return Forecast::fallback(last, Fallback::TooFewPoints { have, need });
        }
        let level = match self.cached_level {
            Some(level) => level,
            None => {
                self.advance(&config.kalman);
                let level = self.state[0];
                self.cached_level = Some(level);
                level
            }
        };
        Forecast::model(if config.log1p {
            level.exp_m1().max(0.0)
        } else {
            level
        })
    }
}
