//! The SLA planner as a state machine: feed it one interval's metrics, get a decision and the
//! reasons for it. Its state (predictor histories, correction factors, what the queueing model
//! learned, the stabilisation window) is serializable; after a restart the operator rebuilds
//! the predictors by replaying past intervals.
//!
//! Two sizing models ([`SlaModel`]), fixed when the planner is built:
//!
//! - **Queueing** (default): demand counted at arrival, pools sized with queueing theory for
//!   the load expected once new replicas are ready, scale-downs stabilised, and a fast path
//!   between intervals ([`crate::queueing`], whose files are its stages).
//! - **Upstream**: Dynamo's throughput formulas ([`super::sla::plan_replicas`]) on the forecast
//!   completion count, with correction factors.

use serde::{Deserialize, Serialize};

use crate::{
    aggregated::AggregatedEngine,
    interpolation::PerformanceCurves,
    predictor::{LoadPredictors, PredictorConfig},
    queueing::{Context, QueueingState},
    sla::{Corrections, Limits, Observation, SlaTargets},
    trace::TraceBucket,
    upstream,
};
pub use crate::{
    decision::{Hold, IntervalMetrics, Outcome, SlaDecision},
    queueing::{
        Burstiness, DecodeKv, FastPath, FastSignals, Margins, QueueingConfig, QueueingPlan, ScaleReason,
        Stabilisation,
    },
};

/// Which model sizes the pools (`spec.sla.model`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SlaModel {
    /// Queueing model on arrivals, forecast quantiles, backlog, stabilisation and a fast path.
    #[default]
    Queueing,
    /// Upstream's throughput formulas on completions.
    Upstream,
}

/// Everything the SLA planner is configured with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlaPlannerConfig {
    /// Adjustment interval (s): the prediction horizon and the metrics window.
    pub interval_s: f64,
    /// Latency targets.
    pub sla: SlaTargets,
    /// Replica bounds, GPU budget and GPUs per engine.
    pub limits: Limits,
    /// Whether correction factors are computed and applied (upstream model).
    pub correction: bool,
    /// Load predictor settings.
    pub predictor: PredictorConfig,
    /// Sizing model.
    #[serde(default)]
    pub model: SlaModel,
    /// Queueing-model settings.
    #[serde(default)]
    pub queueing: QueueingConfig,
    /// `Some` when the deployment is one pool of aggregated engines (the queueing model only):
    /// decisions then carry that pool's replicas as both pools'.
    #[serde(default)]
    pub aggregated: Option<AggregatedEngine>,
}

impl SlaPlannerConfig {
    fn upstream_context(&self) -> upstream::Context<'_> {
        upstream::Context {
            interval_s: self.interval_s,
            sla: &self.sla,
            limits: &self.limits,
            correction: self.correction,
        }
    }

    fn queueing_context(&self) -> Context<'_> {
        Context {
            interval_s: self.interval_s,
            sla: &self.sla,
            limits: &self.limits,
            settings: &self.queueing,
            aggregated: self.aggregated.as_ref(),
        }
    }
}

/// The model's own state.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
enum ModelState {
    /// Upstream's formulas: the correction factors.
    Upstream { corrections: Corrections },
    /// The queueing model.
    Queueing(Box<QueueingState>),
}

/// The SLA planner's state between intervals.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SlaPlanner {
    predictors: LoadPredictors,
    intervals: u64,
    model: ModelState,
}

impl SlaPlanner {
    /// A planner with empty history, neutral correction factors, for `config.model` (which
    /// the planner keeps: a policy whose model changes gets a new planner).
    pub fn new(config: &SlaPlannerConfig) -> Self {
        Self {
            predictors: LoadPredictors::new(&config.predictor),
            intervals: 0,
            model: match config.model {
                SlaModel::Upstream => ModelState::Upstream {
                    corrections: Corrections::default(),
                },
                SlaModel::Queueing => ModelState::Queueing(Box::default()),
            },
        }
    }

    /// Feeds a warm-up trace (already bucketed by the interval) to the predictors.
    pub fn warm_up(&mut self, buckets: &[TraceBucket]) {
        self.predictors.warm_up(buckets);
    }

    /// Feeds past intervals' metrics to the predictors without deciding anything, to restore
    /// the state after a restart.
    pub fn replay(&mut self, history: &[Observation]) {
        for observation in history {
            self.predictors
                .observe(observation.num_req, observation.isl, observation.osl);
        }
    }

    /// Current correction factors (neutral for the queueing model, which has none).
    pub fn corrections(&self) -> Corrections {
        match &self.model {
            ModelState::Upstream { corrections } => *corrections,
            ModelState::Queueing(_) => Corrections::default(),
        }
    }

    /// Intervals decided since the planner was created.
    pub fn intervals(&self) -> u64 {
        self.intervals
    }

    /// Runs one interval: learn from the metrics, predict the next interval, size both pools.
    /// `current` is the replicas asked for (serving or starting).
    pub fn tick(
        &mut self,
        config: &SlaPlannerConfig,
        model: &impl PerformanceCurves,
        metrics: IntervalMetrics,
        current: (u32, u32),
    ) -> SlaDecision {
        self.intervals += 1;
        if let ModelState::Queueing(queueing) = &mut self.model {
            queueing.advance(config.interval_s);
        }
        let mut decision = SlaDecision {
            observed: None,
            predicted: None,
            fallbacks: Vec::new(),
            corrections: self.corrections(),
            current,
            outcome: Outcome::Hold(Hold::NoTraffic),
        };
        let observation = match metrics {
            IntervalMetrics::Unavailable { reason } => {
                decision.outcome = Outcome::Hold(Hold::MetricsUnavailable { reason });
                return decision;
            }
            IntervalMetrics::AwaitingTraffic { reason } => {
                decision.outcome = Outcome::Hold(Hold::AwaitingTraffic { reason });
                return decision;
            }
            IntervalMetrics::Observed(observation) => observation,
        };
        decision.observed = Some(observation);
        match &mut self.model {
            ModelState::Queueing(queueing) => {
                let decided = queueing.tick(
                    config.queueing_context(),
                    &mut self.predictors,
                    model,
                    &observation,
                    current,
                    self.intervals,
                );
                decision.predicted = Some(decided.predicted);
                decision.fallbacks = decided.fallbacks;
                decision.outcome = Outcome::Queueing(decided.plan);
            }
            ModelState::Upstream { corrections } => {
                upstream::tick(
                    &mut self.predictors,
                    corrections,
                    config.upstream_context(),
                    model,
                    &observation,
                    &mut decision,
                );
            }
        }
        decision
    }

    /// The fast path, between intervals (every [`FastPath::period_s`]): `Some`
    /// when the SLA is at risk or arrivals surged and more replicas are needed at once (never
    /// fewer). `None` when nothing needs to change or the model is upstream's, which has none.
    /// `current` is the replicas asked for.
    pub fn fast_check(
        &mut self,
        config: &SlaPlannerConfig,
        model: &impl PerformanceCurves,
        signals: &FastSignals,
        current: (u32, u32),
    ) -> Option<SlaDecision> {
        let ModelState::Queueing(queueing) = &mut self.model else {
            return None;
        };
        let decided = queueing.fast_check(config.queueing_context(), model, signals, current)?;
        Some(SlaDecision {
            observed: None,
            predicted: Some(decided.predicted),
            fallbacks: decided.fallbacks,
            corrections: Corrections::default(),
            current,
            outcome: Outcome::Queueing(decided.plan),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sla::PoolLimits;
    use crate::{interpolation::PerformanceModel, predictor::PredictorKind, profile::Profile};

    fn model() -> PerformanceModel {
        PerformanceModel::new(&Profile::builtin("h200-llama3.1-8b-tp1").unwrap()).unwrap()
    }

    fn config(kind: PredictorKind) -> SlaPlannerConfig {
        SlaPlannerConfig {
            interval_s: 60.0,
            sla: SlaTargets::new(500.0, 50.0),
            limits: Limits {
                prefill: PoolLimits::new(1, None),
                decode: PoolLimits::new(1, None),
                max_gpu_budget: Some(8),
                prefill_gpus_per_engine: 1,
                decode_gpus_per_engine: 1,
                ratio: None,
            },
            correction: true,
            predictor: PredictorConfig {
                kind,
                interval_seconds: 60.0,
                ..PredictorConfig::default()
            },
            model: SlaModel::Upstream,
            queueing: QueueingConfig::default(),
            aggregated: None,
        }
    }

    fn observed(num_req: f64) -> Observation {
        Observation {
            arrivals: None,
            inflight: None,
            queued: None,
            isl_second_moment: None,
            osl_second_moment: None,
            ttft_quantile_ms: None,
            prefill_engines: None,
            decode_engines: None,
            decode_kv_usage: None,
            decode_kv_usage_peak: None,
            num_req,
            isl: 3000.0,
            osl: 300.0,
            ttft_ms: 100.0,
            itl_ms: 20.0,
            request_duration_s: 8.0,
        }
    }

    #[test]
    fn a_graph_awaiting_its_first_request_holds_and_learns_nothing() {
        for model_kind in [SlaModel::Upstream, SlaModel::Queueing] {
            let config = SlaPlannerConfig {
                model: model_kind,
                ..config(PredictorKind::Constant)
            };
            let mut waited = SlaPlanner::new(&config);
            for _ in 0..3 {
                let decision = waited.tick(
                    &config,
                    &model(),
                    IntervalMetrics::AwaitingTraffic {
                        reason: "waiting for the first request".into(),
                    },
                    (2, 2),
                );
                assert_eq!(decision.target(), None, "{model_kind:?}");
                assert!(matches!(decision.hold(), Some(Hold::AwaitingTraffic { .. })));
                assert_eq!(
                    decision.explanation(),
                    "keeping replicas: waiting for the first request"
                );
            }
            // The first interval with traffic plans as a new planner's first one does.
            let mut fresh = SlaPlanner::new(&config);
            let first = |planner: &mut SlaPlanner| {
                planner
                    .tick(
                        &config,
                        &model(),
                        IntervalMetrics::Observed(observed(600.0)),
                        (2, 2),
                    )
                    .target()
            };
            assert!(first(&mut fresh).is_some(), "{model_kind:?}");
            assert_eq!(first(&mut waited), first(&mut fresh), "{model_kind:?}");
        }
    }

    #[test]
    fn missing_metrics_hold_and_teach_nothing() {
        let config = config(PredictorKind::Constant);
        let mut planner = SlaPlanner::new(&config);
        let decision = planner.tick(
            &config,
            &model(),
            IntervalMetrics::Unavailable {
                reason: "timeout".into(),
            },
            (3, 4),
        );
        assert_eq!(decision.target(), None);
        assert!(!decision.changes_replicas());
        assert!(decision.explanation().contains("metrics unavailable (timeout)"));
        assert_eq!(planner.corrections(), Corrections::default());
    }

    #[test]
    fn an_interval_without_completed_requests_holds_but_feeds_the_predictors() {
        let config = config(PredictorKind::Constant);
        let mut planner = SlaPlanner::new(&config);
        planner.tick(
            &config,
            &model(),
            IntervalMetrics::Observed(observed(6000.0)),
            (1, 1),
        );
        let idle = Observation {
            ttft_ms: f64::NAN,
            itl_ms: f64::NAN,
            ..observed(0.0)
        };
        let decision = planner.tick(&config, &model(), IntervalMetrics::Observed(idle), (2, 2));
        assert_eq!(decision.hold(), Some(&Hold::NoTraffic));
        assert_eq!(decision.target(), None);
    }

    #[test]
    fn load_drives_replicas_and_the_explanation_says_why() {
        let config = config(PredictorKind::Constant);
        let mut planner = SlaPlanner::new(&config);
        let low = planner.tick(
            &config,
            &model(),
            IntervalMetrics::Observed(observed(60.0)),
            (1, 1),
        );
        assert_eq!(low.target(), Some((1, 1)));
        let high = planner.tick(
            &config,
            &model(),
            IntervalMetrics::Observed(observed(30_000.0)),
            (1, 1),
        );
        let (prefill, decode) = high.target().unwrap();
        assert!(prefill + decode <= 8, "budget respected: {prefill}/{decode}");
        assert!(prefill > 1 || decode > 1);
        let line = high.explanation();
        assert!(
            line.contains("predicted 30000 requests") && line.contains("decode replicas"),
            "{line}"
        );
        assert_eq!(planner.intervals(), 2);
    }

    #[test]
    fn state_survives_serialization_and_replay_restores_predictions() {
        let config = config(PredictorKind::Kalman);
        let mut planner = SlaPlanner::new(&config);
        let history: Vec<Observation> = (0..20).map(|i| observed(100.0 + 10.0 * f64::from(i))).collect();
        planner.replay(&history);
        let restored: SlaPlanner = serde_json::from_str(&serde_json::to_string(&planner).unwrap()).unwrap();
        let (mut a, mut b) = (planner.clone(), restored);
        let next = IntervalMetrics::Observed(observed(300.0));
        let from_original = a.tick(&config, &model(), next.clone(), (1, 1));
        let from_restored = b.tick(&config, &model(), next, (1, 1));
        assert_eq!(from_original.predicted, from_restored.predicted);
        // The trend learnt from the replayed history shows in the forecast.
        assert!(from_original.predicted.unwrap().num_req > 300.0);
    }
}
