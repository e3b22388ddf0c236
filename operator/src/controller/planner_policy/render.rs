//! What the planning loop's decision says, as the PlannerPolicy's status and conditions show
//! it (pure): the `MetricsAvailable` and `ScalingLimited` conditions, the observed and predicted
//! load, the correction factors and the decision's message.

use planner_api::{CorrectionFactors, ObservedLoad, PredictedLoad};
use planner_core::{
    load::LoadSamples,
    policy::{Decision, MetricsState},
};

use super::status::{self, METRICS_AVAILABLE, finite};
use crate::{
    controller::conditions::DesiredCondition,
    sources::prometheus::{KvReading, KvUsageSource},
};

/// Where the metrics came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsOrigin {
    /// The Dynamo namespace the series are filtered by.
    pub dynamo_namespace: String,
    /// The Prometheus URL, credentials removed.
    pub url: String,
}

/// The `MetricsAvailable` reason of a graph whose frontend has counted no request yet.
pub const AWAITING_TRAFFIC: &str = "AwaitingTraffic";

/// A decision as the status shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rendered {
    /// Conditions the decision sets (`MetricsAvailable`, `ScalingLimited`).
    pub conditions: Vec<DesiredCondition>,
    /// What was observed.
    pub observed: Option<ObservedLoad>,
    /// What is predicted for the next interval.
    pub predicted: Option<PredictedLoad>,
    /// Correction factors after the interval.
    pub correction: Option<CorrectionFactors>,
    /// One line on why.
    pub message: String,
}

/// Renders `decision`; `kv` is the decode KV usage the observe step read.
pub fn render(decision: &Decision, origin: &MetricsOrigin, kv: Option<&KvReading>) -> Rendered {
    let mut conditions = Vec::new();
    if let Some(metrics) = &decision.metrics {
        conditions.push(metrics_condition(metrics, decision, origin, kv));
    }
    if let Some(limitation) = &decision.limitation {
        conditions.push(status::limited_condition(limitation));
    }
    let observed = decision.observed.as_ref().map(|o| ObservedLoad {
        requests: finite(o.arrivals.unwrap_or(o.num_req)),
        isl: finite(o.isl),
        osl: finite(o.osl),
        ttft_ms: finite(o.ttft_ms),
        itl_ms: finite(o.itl_ms),
        ttft_percentile_ms: o.ttft_quantile_ms.and_then(|(_, ms)| finite(ms)),
        ttft_percentile: o.ttft_quantile_ms.map(|(q, _)| (q * 100.0 * 1e6).round() / 1e6),
        decode_kv_usage: kv.and_then(|kv| kv.mean).and_then(finite),
        decode_kv_usage_source: kv.map(|kv| kv.source),
        prefill_queue: None,
    });
    Rendered {
        conditions,
        observed: observed.or_else(|| decision.samples.as_ref().and_then(load_observed)),
        predicted: decision.predicted.as_ref().map(|load| PredictedLoad {
            requests: finite(load.num_req),
            isl: finite(load.isl),
            osl: finite(load.osl),
        }),
        correction: decision.corrections.as_ref().map(|c| CorrectionFactors {
            prefill: finite(c.prefill),
            decode: finite(c.decode),
        }),
        message: decision.message.clone(),
    }
}

/// What the load planner read: the means of its samples over the interval (`None` without
/// any).
fn load_observed(samples: &LoadSamples) -> Option<ObservedLoad> {
    let mean = |values: &[f64]| {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        (!finite.is_empty()).then(|| finite.iter().sum::<f64>() / finite.len() as f64)
    };
    let kv = mean(&samples.decode_kv_usage);
    let queue = mean(&samples.prefill_queue);
    (kv.is_some() || queue.is_some()).then(|| ObservedLoad {
        decode_kv_usage: kv,
        decode_kv_usage_source: kv.map(|_| {
            if samples.decode_kv_lower_bound {
                KvUsageSource::Router
            } else {
                KvUsageSource::Engines
            }
        }),
        prefill_queue: queue,
        ..ObservedLoad::default()
    })
}

fn metrics_condition(
    metrics: &MetricsState,
    decision: &Decision,
    origin: &MetricsOrigin,
    kv: Option<&KvReading>,
) -> DesiredCondition {
    let reason = metrics.reason();
    match metrics {
        MetricsState::Unavailable { reason: why } => DesiredCondition::unmet(METRICS_AVAILABLE, reason, why),
        MetricsState::NoTraffic => DesiredCondition::met(
            METRICS_AVAILABLE,
            reason,
            "no request completed in the last interval",
        ),
        MetricsState::AwaitingTraffic { reason: why } => {
            DesiredCondition::met(METRICS_AVAILABLE, reason, why)
        }
        MetricsState::NoSamples => DesiredCondition::unmet(
            METRICS_AVAILABLE,
            reason,
            format!(
                "no queue or KV-cache samples for {} in the last interval",
                origin.dynamo_namespace
            ),
        ),
        MetricsState::Observed => match &decision.samples {
            Some(samples) => DesiredCondition::met(
                METRICS_AVAILABLE,
                reason,
                if samples.decode_kv_lower_bound {
                    "load metrics sampled; decode KV usage from the KV router's estimate (no engine exports one for the graph): prompt blocks only, a lower bound decode is not scaled down on"
                } else {
                    "load metrics sampled; decode KV usage from the engines"
                },
            ),
            None => DesiredCondition::met(
                METRICS_AVAILABLE,
                reason,
                format!(
                    "frontend metrics of {} from {}; {}",
                    origin.dynamo_namespace,
                    origin.url,
                    kv_note(kv)
                ),
            ),
        },
    }
}

/// What the status says of the decode KV usage read.
fn kv_note(kv: Option<&KvReading>) -> &'static str {
    match kv.map(|kv| kv.source) {
        Some(KvUsageSource::Engines) => "decode KV usage from the engines",
        Some(KvUsageSource::Router) => {
            "decode KV usage from the KV router's estimate (no engine exports one for the graph): prompt blocks only, a lower bound the planner does not learn from"
        }
        None => "no decode KV usage (no engine or KV router exports one for the graph)",
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use planner_core::{
        interpolation::PerformanceModel,
        load::{LoadConfig, LoadSamples},
        policy::{Input, LoopSettings, Observed, Planner, PolicyLoop, Replicas},
        predictor::{PredictorConfig, PredictorKind},
        profile::Profile,
        sla::{Limits, Observation, PoolLimits, SlaTargets},
        state::{IntervalMetrics, QueueingConfig, SlaModel, SlaPlannerConfig},
    };

    use super::*;
    use crate::controller::planner_policy::status::{READY, SCALING_LIMITED};

    fn origin() -> MetricsOrigin {
        MetricsOrigin {
            dynamo_namespace: "llm-llama".into(),
            url: "http://prometheus:9090".into(),
        }
    }

    fn model() -> PerformanceModel {
        PerformanceModel::new(&Profile::builtin("h200-llama3.1-8b-tp1").unwrap()).unwrap()
    }

    fn sla(model: SlaModel) -> Planner {
        Planner::sla(SlaPlannerConfig {
            interval_s: 60.0,
            sla: SlaTargets::new(500.0, 50.0),
            limits: Limits {
                prefill: PoolLimits::new(1, Some(3)),
                decode: PoolLimits::new(1, Some(3)),
                max_gpu_budget: None,
                prefill_gpus_per_engine: 1,
                decode_gpus_per_engine: 1,
                ratio: None,
            },
            correction: true,
            predictor: PredictorConfig {
                kind: PredictorKind::Constant,
                interval_seconds: 60.0,
                ..PredictorConfig::default()
            },
            model,
            queueing: QueueingConfig::default(),
            aggregated: None,
        })
    }

    /// One interval of a new loop of `planner` on `observed`, rendered.
    fn interval(planner: Planner, observed: Observed, kv: Option<KvReading>) -> (Decision, Rendered) {
        let mut policy = PolicyLoop::new(planner, LoopSettings::default());
        let at = Replicas {
            serving: (1, 1),
            asked: (1, 1),
        };
        policy.due(Duration::ZERO, at);
        let proposal = policy.decide(Duration::ZERO, Input::Interval(observed), at, Some(&model()));
        let decision = policy.settle(Duration::ZERO, proposal, None, at, None);
        let rendered = render(&decision, &origin(), kv.as_ref());
        (decision, rendered)
    }

    fn observed(num_req: f64) -> Observation {
        Observation::upstream(num_req, 3000.0, 300.0, 100.0, 20.0, 8.0)
    }

    fn condition<'a>(rendered: &'a Rendered, type_: &str) -> &'a DesiredCondition {
        rendered.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn missing_metrics_keep_replicas_and_say_why() {
        let (decision, rendered) = interval(
            sla(SlaModel::Upstream),
            Observed::Frontend(IntervalMetrics::Unavailable {
                reason: "Prometheus at http://prometheus:9090 did not answer".into(),
            }),
            None,
        );
        assert_eq!(decision.target, None);
        assert_eq!(
            rendered.conditions,
            [DesiredCondition::unmet(
                METRICS_AVAILABLE,
                "MetricsUnavailable",
                "Prometheus at http://prometheus:9090 did not answer"
            )]
        );
        assert!(
            rendered
                .message
                .starts_with("keeping replicas: metrics unavailable")
        );
        assert_eq!(rendered.observed, None);
    }

    #[test]
    fn a_busy_interval_reports_the_limit_and_where_the_metrics_came_from() {
        let (decision, rendered) = interval(
            sla(SlaModel::Upstream),
            Observed::Frontend(IntervalMetrics::Observed(observed(60_000.0))),
            None,
        );
        assert_eq!(decision.target, Some((3, 3)));
        let limited = condition(&rendered, SCALING_LIMITED);
        assert_eq!((limited.status, limited.reason.as_str()), ("True", "MaxReplicas"));
        assert_eq!(
            condition(&rendered, METRICS_AVAILABLE).message,
            "frontend metrics of llm-llama from http://prometheus:9090; no decode KV usage (no engine or KV router exports one for the graph)"
        );
        assert_eq!(rendered.observed.unwrap().requests, Some(60_000.0));
        assert_eq!(rendered.predicted.unwrap().requests, Some(60_000.0));
    }

    #[test]
    fn status_says_where_the_decode_kv_usage_came_from() {
        for (source, note) in [
            (KvUsageSource::Engines, "decode KV usage from the engines"),
            (
                KvUsageSource::Router,
                "decode KV usage from the KV router's estimate",
            ),
        ] {
            let kv = KvReading {
                source,
                mean: Some(0.25),
                peak: Some(0.5),
            };
            let (_, rendered) = interval(
                sla(SlaModel::Upstream),
                Observed::Frontend(IntervalMetrics::Observed(observed(600.0))),
                Some(kv),
            );
            let observed = rendered.observed.clone().unwrap();
            assert_eq!(
                (observed.decode_kv_usage, observed.decode_kv_usage_source),
                (Some(0.25), Some(source))
            );
            let available = condition(&rendered, METRICS_AVAILABLE);
            assert!(available.message.contains(note), "{}", available.message);
        }
    }

    #[test]
    fn a_graph_awaiting_its_first_request_is_ready_and_holds() {
        let reason = "waiting for the first request: the frontend of llm-llama serves llama and has counted none yet; planning starts with it";
        for planner in [
            sla(SlaModel::Upstream),
            sla(SlaModel::Queueing),
            Planner::load(LoadConfig::default(), false),
        ] {
            let (decision, rendered) = interval(planner, Observed::AwaitingTraffic(reason.into()), None);
            assert_eq!(decision.target, None);
            assert_eq!(
                rendered.conditions,
                [DesiredCondition::met(METRICS_AVAILABLE, AWAITING_TRAFFIC, reason)]
            );
            assert_eq!(rendered.message, format!("keeping replicas: {reason}"));
            // Ready, with no failing condition (so no Warning Event).
            let status = status::next(
                None,
                Some(1),
                &status::Outcome {
                    conditions: rendered.conditions.clone(),
                    message: rendered.message.clone(),
                    ..Default::default()
                },
                k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap(),
            );
            let ready = crate::controller::conditions::find(&status.conditions, READY).unwrap();
            assert_eq!(ready.status, "True");
        }
    }

    #[test]
    fn load_mode_without_samples_says_so_and_keeps_replicas() {
        let (decision, rendered) = interval(
            Planner::load(LoadConfig::default(), false),
            Observed::Samples(Ok(LoadSamples::default())),
            None,
        );
        assert_eq!(decision.target, None);
        let available = condition(&rendered, METRICS_AVAILABLE);
        assert_eq!(
            (available.status, available.reason.as_str()),
            ("False", "NoSamples")
        );
        assert!(available.message.contains("llm-llama"), "{}", available.message);
    }

    fn load_samples(queue: &[f64], kv: &[f64], lower_bound: bool) -> Observed {
        Observed::Samples(Ok(LoadSamples {
            prefill_queue: queue.to_vec(),
            decode_kv_usage: kv.to_vec(),
            decode_kv_lower_bound: lower_bound,
            prefill_busy: Vec::new(),
        }))
    }

    #[test]
    fn load_mode_reports_its_samples_and_what_each_pool_did() {
        let (decision, rendered) = interval(
            Planner::load(LoadConfig::default(), false),
            load_samples(&[0.2, 0.4], &[0.94, 0.96], false),
            None,
        );
        assert_eq!(decision.target, Some((1, 2)));
        let observed = rendered.observed.clone().unwrap();
        assert!(
            (observed.prefill_queue.unwrap() - 0.3).abs() < 1e-9,
            "{observed:?}"
        );
        assert!(
            (observed.decode_kv_usage.unwrap() - 0.95).abs() < 1e-9,
            "{observed:?}"
        );
        assert_eq!(observed.decode_kv_usage_source, Some(KvUsageSource::Engines));
        // It reads no frontend request figures, and says none.
        assert_eq!(
            (observed.requests, observed.ttft_ms, observed.itl_ms),
            (None, None, None)
        );
        assert_eq!(rendered.correction, None);
        assert_eq!(
            rendered.message,
            "load mode: prefill 1 kept (queue 0.30 per engine, within 0.20 to 0.50); decode 1 -> 2 (KV usage 95% above 90%)"
        );
        let limited = condition(&rendered, SCALING_LIMITED);
        assert_eq!(
            (limited.status, limited.reason.as_str()),
            ("False", "WithinBounds")
        );
    }

    #[test]
    fn load_mode_says_what_it_kept_at_a_bound_and_is_limited() {
        let config = LoadConfig {
            prefill: PoolLimits::new(1, Some(1)),
            decode: PoolLimits::new(1, Some(1)),
            ..LoadConfig::default()
        };
        let (decision, rendered) = interval(
            Planner::load(config, false),
            load_samples(&[0.0], &[0.97], true),
            None,
        );
        assert_eq!(decision.target, Some((1, 1)));
        assert_eq!(
            rendered.message,
            "load mode: prefill 1 kept (queue 0.00 per engine below 0.20: at minReplicas 1); decode 1 kept (KV usage 97% above 90%: at maxReplicas 1)"
        );
        let limited = condition(&rendered, SCALING_LIMITED);
        assert_eq!((limited.status, limited.reason.as_str()), ("True", "MaxReplicas"));
        assert_eq!(limited.message, "decode needs more than maxReplicas 1");
        // The KV router's estimate, said so.
        let observed = rendered.observed.unwrap();
        assert_eq!(observed.decode_kv_usage_source, Some(KvUsageSource::Router));
    }

    #[test]
    fn only_upstreams_formulas_report_correction_factors() {
        let busy = || Observed::Frontend(IntervalMetrics::Observed(observed(600.0)));
        let (_, upstream) = interval(sla(SlaModel::Upstream), busy(), None);
        assert!(upstream.correction.is_some());
        let (_, queueing) = interval(sla(SlaModel::Queueing), busy(), None);
        assert_eq!(queueing.correction, None);
        assert!(sla(SlaModel::Upstream).uses_corrections());
        assert!(!sla(SlaModel::Queueing).uses_corrections());
        assert!(!Planner::load(LoadConfig::default(), false).uses_corrections());
    }
}
