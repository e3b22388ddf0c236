//! Upstream's planning model (`spec.sla.model: upstream`): Dynamo's throughput formulas
//! ([`crate::sla::plan_replicas`]) on the forecast completion count, with correction factors.

use crate::{
    decision::{Hold, Outcome, SlaDecision},
    interpolation::PerformanceCurves,
    predictor::{Forecast, LoadPredictors},
    sla::{self, Corrections, Limits, Load, Observation, SlaTargets},
};

/// What upstream's formulas are given besides the observation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Context<'a> {
    /// Adjustment interval (s).
    pub interval_s: f64,
    /// Latency targets.
    pub sla: &'a SlaTargets,
    /// Replica bounds and the GPU budget.
    pub limits: &'a Limits,
    /// Whether correction factors are computed and applied.
    pub correction: bool,
}

/// Upstream's interval: the predictors learn every interval (NaN counts as 0), but no scaling
/// happens on an interval whose means are NaN.
pub(crate) fn tick(
    predictors: &mut LoadPredictors,
    corrections: &mut Corrections,
    config: Context<'_>,
    model: &impl PerformanceCurves,
    observation: &Observation,
    decision: &mut SlaDecision,
) {
    predictors.observe(observation.num_req, observation.isl, observation.osl);
    if !observation.is_complete() {
        decision.outcome = Outcome::Hold(Hold::NoTraffic);
        return;
    }
    if config.correction {
        if let Some(factor) = sla::prefill_correction(model, observation) {
            corrections.prefill = factor;
        }
        if let Some(factor) =
            sla::decode_correction(model, observation, decision.current.1, config.interval_s)
        {
            corrections.decode = factor;
        }
    }
    decision.corrections = *corrections;
    let (requests, isl, osl) = predictors.predict();
    for (series, forecast) in [("requests", &requests), ("ISL", &isl), ("OSL", &osl)] {
        if let Forecast {
            fallback: Some(fallback),
            ..
        } = forecast
        {
            decision.fallbacks.push((series.to_string(), fallback.clone()));
        }
    }
    let load = Load {
        num_req: requests.value,
        isl: isl.value,
        osl: osl.value,
    };
    let applied = if config.correction {
        *corrections
    } else {
        Corrections::default()
    };
    decision.outcome = Outcome::Upstream(sla::plan_replicas(
        model,
        &load,
        config.sla,
        &applied,
        config.limits,
        config.interval_s,
    ));
    decision.predicted = Some(load);
}
