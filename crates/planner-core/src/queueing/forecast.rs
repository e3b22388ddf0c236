//! Stage 2, **forecast**: the next interval's arrivals from the policy's predictor, with the
//! prompt and output length mixes the plan is made for.

use super::{config::QueueingConfig, learn::Work};
use crate::{
    interpolation::PerformanceCurves,
    predictor::{Fallback, LoadPredictors},
    sizing::{self, LengthMoments, ServiceMoments},
    sla::Observation,
};

/// The point forecast of the next interval.
#[derive(Clone, Debug)]
pub(super) struct Forecast {
    /// Arrivals.
    pub requests: f64,
    /// Prompt-length mix.
    pub isl: LengthMoments,
    /// Output-length mix.
    pub osl: LengthMoments,
    /// Prefill time of the prompt mix.
    pub service: ServiceMoments,
    /// Predictor fallbacks used (series, why).
    pub fallbacks: Vec<(String, Fallback)>,
}

impl Forecast {
    /// The work the forecast asks of the pools (its errors are learned next interval).
    pub fn work(&self) -> Work {
        Work::of(self.requests, self.service, &self.isl, &self.osl)
    }
}

/// Feeds the interval's arrivals and mean lengths to the predictors and forecasts the next
/// interval. `lengths` are the smoothed mixes learned so far (prompt, output).
pub(super) fn forecast(
    predictors: &mut LoadPredictors,
    curves: &impl PerformanceCurves,
    observation: &Observation,
    arrivals: f64,
    lengths: (Option<LengthMoments>, Option<LengthMoments>),
    settings: &QueueingConfig,
) -> Forecast {
    // Lengths are learned only from intervals that measured them: an idle interval's NaN
    // means are no evidence of zero-length requests.
    predictors.requests.add_data_point(arrivals);
    if observation.isl.is_finite() {
        predictors.isl.add_data_point(observation.isl);
    }
    if observation.osl.is_finite() {
        predictors.osl.add_data_point(observation.osl);
    }
    let (requests, isl, osl) = predictors.predict();
    let mut fallbacks = Vec::new();
    for (series, forecast) in [("requests", &requests), ("ISL", &isl), ("OSL", &osl)] {
        if let Some(fallback) = &forecast.fallback {
            fallbacks.push((series.to_string(), fallback.clone()));
        }
    }
    // Prompt and output mixes at the forecast means.
    let isl_shape = lengths.0.unwrap_or(LengthMoments::with_scv(isl.value, 1.0));
    let osl_shape = lengths.1.unwrap_or(LengthMoments::with_scv(osl.value, 1.0));
    let isl_moments = if settings.predict_lengths && isl.value > 0.0 {
        isl_shape.rescaled(isl.value)
    } else {
        isl_shape
    };
    let osl_moments = if settings.predict_lengths && osl.value > 0.0 {
        osl_shape.rescaled(osl.value)
    } else {
        osl_shape
    };
    Forecast {
        requests: requests.value,
        service: sizing::prefill_service(curves, &isl_moments),
        isl: isl_moments,
        osl: osl_moments,
        fallbacks,
    }
}
