//! The SLA planner as a state machine: feed it one interval's metrics, get a decision and the
//! reasons for it. Its state (predictor histories, correction factors) is serializable, so the
//! operator can persist it, and can also rebuild it by replaying past intervals.

use serde::{Deserialize, Serialize};

use super::{
    interpolation::PerformanceCurves,
    predictor::{Fallback, Forecast, LoadPredictors, PredictorConfig},
    sla::{self, Corrections, Limit, Limits, Load, Observation, ReplicaPlan, SlaTargets},
    trace::TraceBucket,
};

/// Everything the SLA planner is configured with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlaPlannerConfig {
    /// Adjustment interval (s): the prediction horizon and the metrics window.
    pub interval_s: f64,
    /// Latency targets.
    pub sla: SlaTargets,
    /// Replica bounds, GPU budget and GPUs per engine.
    pub limits: Limits,
    /// Whether correction factors are computed and applied.
    pub correction: bool,
    /// Load predictor settings.
    pub predictor: PredictorConfig,
}

/// What the metrics source delivered for an interval.
#[derive(Clone, Debug, PartialEq)]
pub enum IntervalMetrics {
    /// Prometheus could not be read, or returned no series: nothing is learned or decided.
    Unavailable {
        /// Why, for status and events.
        reason: String,
    },
    /// The interval's frontend metrics (means may be NaN when no request completed).
    Observed(Observation),
}

/// Why the planner keeps the current replicas this interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Hold {
    /// Metrics were missing: never scale (in particular never down) on missing data.
    MetricsUnavailable {
        /// Why.
        reason: String,
    },
    /// Means are NaN because no request completed: upstream skips such intervals.
    NoTraffic,
}

/// One interval's decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlaDecision {
    /// The metrics the decision was based on.
    pub observed: Option<Observation>,
    /// The predicted load of the next interval.
    pub predicted: Option<Load>,
    /// Predictor fallbacks used (requests, ISL, OSL), if any.
    pub fallbacks: Vec<(String, Fallback)>,
    /// Correction factors after this interval.
    pub corrections: Corrections,
    /// The replica plan, when one was made.
    pub plan: Option<ReplicaPlan>,
    /// Set when the current replicas are kept.
    pub hold: Option<Hold>,
    /// Replicas running when the decision was made.
    pub current: (u32, u32),
}

impl SlaDecision {
    /// The replicas to run, or `None` to keep the current ones.
    pub fn target(&self) -> Option<(u32, u32)> {
        self.plan.as_ref().map(|plan| (plan.prefill, plan.decode))
    }

    /// Whether the decision changes the running replicas.
    pub fn changes_replicas(&self) -> bool {
        self.target().is_some_and(|target| target != self.current)
    }

    /// Bounds and budget that limited the decision.
    pub fn limits(&self) -> &[Limit] {
        self.plan.as_ref().map_or(&[], |plan| plan.limits.as_slice())
    }

    /// One line saying why the decision is what it is.
    pub fn explanation(&self) -> String {
        if let Some(hold) = &self.hold {
            return match hold {
                Hold::MetricsUnavailable { reason } => {
                    format!("keeping replicas: metrics unavailable ({reason})")
                }
                Hold::NoTraffic => "keeping replicas: no request completed in the interval".to_string(),
            };
        }
        let (Some(plan), Some(load)) = (&self.plan, &self.predicted) else {
            return "no decision".to_string();
        };
        let mut line = format!(
            "predicted {:.0} requests (ISL {:.0}, OSL {:.0}): {} prefill and {} decode replicas",
            load.num_req, load.isl, load.osl, plan.prefill, plan.decode
        );
        for limit in plan
            .limits
            .iter()
            .filter(|l| !matches!(l, Limit::MinReplicas { .. }))
        {
            line.push_str(&format!("; {limit}"));
        }
        // A constant series is the model's own answer, not a fallback worth reporting.
        for (series, fallback) in self
            .fallbacks
            .iter()
            .filter(|(_, f)| !matches!(f, Fallback::ConstantSeries))
        {
            line.push_str(&format!("; {series} forecast: {fallback}"));
        }
        line
    }
}

/// The SLA planner's state between intervals.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SlaPlanner {
    predictors: LoadPredictors,
    corrections: Corrections,
    intervals: u64,
}

impl SlaPlanner {
    /// A planner with empty history and neutral correction factors.
    pub fn new(config: &SlaPlannerConfig) -> Self {
        Self {
            predictors: LoadPredictors::new(&config.predictor),
            corrections: Corrections::default(),
            intervals: 0,
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

    /// Current correction factors.
    pub fn corrections(&self) -> Corrections {
        self.corrections
    }

    /// Intervals decided since the planner was created.
    pub fn intervals(&self) -> u64 {
        self.intervals
    }

    /// Runs one interval: learn from the metrics, predict the next interval, size both pools.
    pub fn tick(
        &mut self,
        config: &SlaPlannerConfig,
        model: &impl PerformanceCurves,
        metrics: IntervalMetrics,
        current: (u32, u32),
    ) -> SlaDecision {
        self.intervals += 1;
        let mut decision = SlaDecision {
            observed: None,
            predicted: None,
            fallbacks: Vec::new(),
            corrections: self.corrections,
            plan: None,
            hold: None,
            current,
        };
        let observation = match metrics {
            IntervalMetrics::Unavailable { reason } => {
                decision.hold = Some(Hold::MetricsUnavailable { reason });
                return decision;
            }
            IntervalMetrics::Observed(observation) => observation,
        };
        decision.observed = Some(observation);
        // As upstream: the predictors learn every interval (NaN counts as 0), but no scaling
        // happens on an interval whose means are NaN.
        self.predictors
            .observe(observation.num_req, observation.isl, observation.osl);
        if !observation.is_complete() {
            decision.hold = Some(Hold::NoTraffic);
            return decision;
        }
        if config.correction {
            if let Some(factor) = sla::prefill_correction(model, &observation) {
                self.corrections.prefill = factor;
            }
            if let Some(factor) = sla::decode_correction(model, &observation, current.1, config.interval_s) {
                self.corrections.decode = factor;
            }
        }
        decision.corrections = self.corrections;
        let (requests, isl, osl) = self.predictors.predict();
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
        let corrections = if config.correction {
            self.corrections
        } else {
            Corrections::default()
        };
        decision.plan = Some(sla::plan_replicas(
            model,
            &load,
            &config.sla,
            &corrections,
            &config.limits,
            config.interval_s,
        ));
        decision.predicted = Some(load);
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{interpolation::PerformanceModel, predictor::PredictorKind, profile::Profile};

    fn model() -> PerformanceModel {
        PerformanceModel::new(&Profile::builtin("h200-llama3.1-8b-tp1").unwrap()).unwrap()
    }

    fn config(kind: PredictorKind) -> SlaPlannerConfig {
        SlaPlannerConfig {
            interval_s: 60.0,
            sla: SlaTargets::new(500.0, 50.0),
            limits: Limits {
                min_replicas: 1,
                max_replicas: None,
                max_gpu_budget: Some(8),
                prefill_gpus_per_engine: 1,
                decode_gpus_per_engine: 1,
            },
            correction: true,
            predictor: PredictorConfig {
                kind,
                interval_seconds: 60.0,
                ..PredictorConfig::default()
            },
        }
    }

    fn observed(num_req: f64) -> Observation {
        Observation {
            num_req,
            isl: 3000.0,
            osl: 300.0,
            ttft_ms: 100.0,
            itl_ms: 20.0,
            request_duration_s: 8.0,
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
        assert_eq!(decision.hold, Some(Hold::NoTraffic));
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
