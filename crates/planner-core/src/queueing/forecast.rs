//! Stage 2, **forecast**: the next interval's arrivals from the policy's predictor, with the
//! prompt and output length mixes the plan is made for.

use super::{config::UNKNOWN_LENGTH_SCV, learn::Work};
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
/// interval's arrivals. The plan keeps the length mixes learned so far (prompt, output),
/// smoothed over the recent intervals (the forecast errors correct the prefill time); the
/// predicted mean lengths stand in until a mix is known.
pub(super) fn forecast(
    predictors: &mut LoadPredictors,
    curves: &impl PerformanceCurves,
    observation: &Observation,
    arrivals: f64,
    lengths: (Option<LengthMoments>, Option<LengthMoments>),
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
    let isl = lengths
        .0
        .unwrap_or(LengthMoments::with_scv(isl.value, UNKNOWN_LENGTH_SCV));
    let osl = lengths
        .1
        .unwrap_or(LengthMoments::with_scv(osl.value, UNKNOWN_LENGTH_SCV));
    Forecast {
        requests: requests.value,
        service: sizing::prefill_service(curves, &isl),
        isl,
        osl,
        fallbacks,
    }
}
