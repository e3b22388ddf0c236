//! One planner interval described as data: the case format of the golden files (`tests/fixtures/golden/`) and of
//! `planner-operator plan --cases FILE`, and its evaluation with the planner core.

use serde::{Deserialize, Serialize};

use super::{
    interpolation::PerformanceCurves,
    sla::{self, Corrections, Limits, Load, Observation, PoolLimits, SlaTargets},
};

/// A file of cases.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct CaseFile {
    /// Profile the cases were computed for (informational).
    #[serde(default)]
    pub profile: Option<String>,
    /// The cases.
    pub cases: Vec<PlanCase>,
}

/// Last interval's metrics, from which the correction factors are computed.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct CaseObservation {
    /// Mean TTFT (ms).
    pub ttft_ms: f64,
    /// Mean ITL (ms).
    pub itl_ms: f64,
    /// Mean ISL (tokens).
    pub isl: f64,
    /// Mean OSL (tokens).
    pub osl: f64,
    /// Requests in the interval.
    pub num_req: f64,
    /// Decode workers serving during the interval.
    pub num_decode_workers: u32,
    /// Mean request duration (s).
    pub request_duration_s: f64,
}

/// One planner interval's inputs.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct PlanCase {
    /// Case id, echoed in the result.
    pub id: String,
    /// Adjustment interval (s).
    pub interval_s: f64,
    /// Predicted requests in the next interval.
    pub num_req: f64,
    /// Predicted mean ISL.
    pub isl: f64,
    /// Predicted mean OSL.
    pub osl: f64,
    /// TTFT target (ms).
    pub ttft_ms: f64,
    /// ITL target (ms).
    pub itl_ms: f64,
    /// GPUs per prefill engine.
    pub prefill_gpus_per_engine: u32,
    /// GPUs per decode engine.
    pub decode_gpus_per_engine: u32,
    /// Minimum replicas per pool.
    pub min_replicas: u32,
    /// GPU budget, -1 for none.
    pub max_gpu_budget: i64,
    /// Metrics the correction factors are computed from.
    #[serde(default)]
    pub observed: Option<CaseObservation>,
    /// Prefill correction given directly.
    #[serde(default)]
    pub prefill_correction: Option<f64>,
    /// Decode correction given directly.
    #[serde(default)]
    pub decode_correction: Option<f64>,
}

/// The planner's answer for one case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanResult {
    /// The case id.
    pub id: String,
    /// Profiled prefill throughput per GPU at the predicted ISL.
    pub prefill_thpt_per_gpu: f64,
    /// Decode throughput per GPU at the chosen operating point.
    pub decode_thpt_per_gpu: f64,
    /// Prefill replicas before the GPU budget.
    pub prefill_replicas_unbudgeted: u32,
    /// Decode replicas before the GPU budget.
    pub decode_replicas_unbudgeted: u32,
    /// Prefill replicas.
    pub prefill_replicas: u32,
    /// Decode replicas.
    pub decode_replicas: u32,
    /// Prefill correction, when computed from observations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_correction: Option<f64>,
    /// Decode correction, when computed from observations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_correction: Option<f64>,
}

impl PlanCase {
    /// Runs the case through the planner core.
    pub fn evaluate(&self, model: &impl PerformanceCurves) -> PlanResult {
        let mut corrections = Corrections {
            prefill: self.prefill_correction.unwrap_or(1.0),
            decode: self.decode_correction.unwrap_or(1.0),
        };
        let mut computed = (None, None);
        if let Some(observed) = &self.observed {
            let observation = Observation::upstream(
                observed.num_req,
                observed.isl,
                observed.osl,
                observed.ttft_ms,
                observed.itl_ms,
                observed.request_duration_s,
            );
            if let Some(factor) = sla::prefill_correction(model, &observation) {
                corrections.prefill = factor;
            }
            if let Some(factor) =
                sla::decode_correction(model, &observation, observed.num_decode_workers, self.interval_s)
            {
                corrections.decode = factor;
            }
            computed = (Some(corrections.prefill), Some(corrections.decode));
        }
        let limits = Limits {
            prefill: PoolLimits::new(self.min_replicas, None),
            decode: PoolLimits::new(self.min_replicas, None),
            max_gpu_budget: u32::try_from(self.max_gpu_budget).ok(),
            prefill_gpus_per_engine: self.prefill_gpus_per_engine,
            decode_gpus_per_engine: self.decode_gpus_per_engine,
            ratio: None,
        };
        let plan = sla::plan_replicas(
            model,
            &Load {
                num_req: self.num_req,
                isl: self.isl,
                osl: self.osl,
            },
            &SlaTargets::new(self.ttft_ms, self.itl_ms),
            &corrections,
            &limits,
            self.interval_s,
        );
        PlanResult {
            id: self.id.clone(),
            prefill_thpt_per_gpu: plan.prefill_thpt_per_gpu,
            decode_thpt_per_gpu: plan.decode_point.thpt_per_gpu,
            prefill_replicas_unbudgeted: plan.prefill_unbudgeted,
            decode_replicas_unbudgeted: plan.decode_unbudgeted,
            prefill_replicas: plan.prefill,
            decode_replicas: plan.decode,
            prefill_correction: computed.0,
            decode_correction: computed.1,
        }
    }
}
