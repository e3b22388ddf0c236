//! Translation of a validated PlannerPolicy into the planner core's configuration (pure).

use planner_api::{PlannerMode, PlannerPolicySpec, PredictorKind, SlaModel, StabilizationKeeps};
use planner_core::{
    aggregated::{AggregatedEngine, DEFAULT_CHUNK_TOKENS},
    load::LoadConfig,
    policy::{Guards, LoopSettings, Membership},
    predictor::{self, KalmanConfig, PredictorConfig},
    sla::{Limits, PoolLimits, RatioLimits, SlaTargets},
    startup::planned_delay,
    state::{self, FastPath, QueueingConfig, SlaPlannerConfig, Stabilisation},
};

use crate::validation::ValidatedPolicy;

/// Most replicas of a pool whatever the metrics say, when the policy sets no maximum: garbage
/// metrics must never ask for thousands of GPUs.
pub const ABSOLUTE_MAX_REPLICAS: u32 = planner_api::limits::MAX_REPLICAS.unsigned_abs();

/// Scale-up delay assumed until one is measured (and when `spec.behavior.scaleUpDelay` is not
/// set and nothing has been measured yet).
pub use planner_core::startup::DEFAULT_SCALE_UP_DELAY;

/// The SLA planner's configuration. Its scale-up delay is the one planned before anything is
/// measured; the planning loop replaces it with the measured one at each decision.
pub fn sla_config(spec: &PlannerPolicySpec, validated: &ValidatedPolicy) -> SlaPlannerConfig {
    let interval_s = validated.interval.as_secs_f64();
    let predictor = &spec.predictor;
    let delay = planned_delay(validated.scale_up_delay, None, validated.expected_scale_up_delay);
    SlaPlannerConfig {
        interval_s,
        sla: SlaTargets {
            ttft_ms: spec.sla.ttft_ms,
            itl_ms: spec.sla.itl_ms,
            prefill_utilization: spec.sla.prefill_utilization,
        },
        limits: limits(spec, validated),
        correction: spec.correction.enabled,
        predictor: PredictorConfig {
            kind: match predictor.kind {
                PredictorKind::Constant => predictor::PredictorKind::Constant,
                PredictorKind::Arima => predictor::PredictorKind::Arima,
                PredictorKind::Kalman => predictor::PredictorKind::Kalman,
                PredictorKind::Prophet => predictor::PredictorKind::Prophet,
            },
            log1p: predictor.log1p,
            kalman: KalmanConfig {
                q_level: predictor.kalman.q_level,
                q_trend: predictor.kalman.q_trend,
                r: predictor.kalman.r,
                min_points: usize::try_from(predictor.kalman.min_points).unwrap_or(1),
            },
            prophet_window_size: usize::try_from(predictor.prophet.window_size).unwrap_or(50),
            interval_seconds: interval_s,
        },
        model: match spec.sla.model {
            SlaModel::Queueing => state::SlaModel::Queueing,
            SlaModel::Upstream => state::SlaModel::Upstream,
        },
        queueing: QueueingConfig {
            ttft_percentile: spec.sla.ttft_percentile,
            itl_percentile: spec.sla.itl_percentile,
            scale_up_delay_s: delay.delay.as_secs_f64(),
            scale_up_delay_assumed: delay.assumed,
            stabilisation: Stabilisation {
                window_s: validated.stabilization.as_secs_f64(),
                quantile: match spec.behavior.scale_down_stabilization_keeps {
                    StabilizationKeeps::Quantile => Stabilisation::default().quantile,
                    StabilizationKeeps::Highest => 1.0,
                },
            },
            fast_path: FastPath {
                period_s: if validated.fast_check_period.is_zero() {
                    f64::INFINITY
                } else {
                    validated.fast_check_period.as_secs_f64()
                },
                ..FastPath::default()
            },
            ..QueueingConfig::default()
        },
        aggregated: validated.target.aggregated.then(|| AggregatedEngine {
            chunk_tokens: validated
                .target
                .chunk_tokens
                .map_or(DEFAULT_CHUNK_TOKENS, f64::from),
        }),
    }
}

/// The bounds every planner applies to its decisions (`spec.bounds`, each pool's own first; the
/// maximum never above [`ABSOLUTE_MAX_REPLICAS`]). An aggregated graph's one pool takes the
/// decode pool's bounds, which are the shared ones (the webhook refuses per-pool bounds there).
fn limits(spec: &PlannerPolicySpec, validated: &ValidatedPolicy) -> Limits {
    let pool = |(min, max): (i32, Option<i32>)| {
        let max = max
            .and_then(|m| u32::try_from(m).ok())
            .filter(|m| *m > 0)
            .map_or(ABSOLUTE_MAX_REPLICAS, |m| m.min(ABSOLUTE_MAX_REPLICAS));
        PoolLimits::new(u32::try_from(min).unwrap_or(1), Some(max))
    };
    Limits {
        prefill: pool(spec.bounds.prefill_range()),
        decode: pool(spec.bounds.decode_range()),
        max_gpu_budget: u32::try_from(spec.bounds.max_gpu_budget).ok(),
        prefill_gpus_per_engine: validated.target.prefill.gpus,
        decode_gpus_per_engine: validated.target.decode.gpus,
        ratio: spec.bounds.prefill_to_decode_ratio.map(|r| RatioLimits {
            min: r.min,
            max: r.max,
        }),
    }
}

/// The planning loop's settings: cadence, guards, scale-up delay, the shared budget it joins,
/// observe mode.
pub fn loop_settings(
    spec: &PlannerPolicySpec,
    validated: &ValidatedPolicy,
    membership: Option<Membership>,
) -> LoopSettings {
    LoopSettings {
        interval: validated.interval,
        fast_period: (!validated.fast_check_period.is_zero()).then_some(validated.fast_check_period),
        guards: guards(spec),
        scale_up_delay: validated.scale_up_delay,
        expected_scale_up_delay: validated.expected_scale_up_delay,
        membership,
        observe_only: spec.mode == PlannerMode::Observe,
    }
}

/// What one decision may do (`spec.bounds`).
pub fn guards(spec: &PlannerPolicySpec) -> Guards {
    let positive = |v: Option<i32>| v.and_then(|v| u32::try_from(v).ok()).filter(|v| *v > 0);
    Guards {
        max_step_up: positive(spec.bounds.max_scale_up_step),
        max_step_down: positive(spec.bounds.max_scale_down_step),
        allow_zero: spec.bounds.allow_scale_to_zero,
    }
}

/// The load-based planner's configuration.
pub fn load_config(spec: &PlannerPolicySpec, validated: &ValidatedPolicy) -> LoadConfig {
    let limits = limits(spec, validated);
    let load = &spec.load;
    LoadConfig {
        kv_scale_up: load.decode_kv_scale_up_threshold,
        kv_scale_down: load.decode_kv_scale_down_threshold,
        queue_scale_up: load.prefill_queue_scale_up_threshold,
        queue_scale_down: load.prefill_queue_scale_down_threshold,
        decode_grace_intervals: u32::try_from(load.decode_grace_period_intervals).unwrap_or(0),
        prefill_buffer_intervals: u32::try_from(load.prefill_queue_buffer_intervals).unwrap_or(0),
        prefill: limits.prefill,
        decode: limits.decode,
        ratio: limits.ratio,
        max_gpu_budget: limits.max_gpu_budget,
        prefill_gpus_per_engine: limits.prefill_gpus_per_engine,
        decode_gpus_per_engine: limits.decode_gpus_per_engine,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use planner_api::{DynamoGraphDeployment, PlannerPolicy};

    use super::*;
    use crate::validation;

    fn dgd() -> crate::target::TargetGraph {
        let dgd: DynamoGraphDeployment =
            serde_yaml::from_str(include_str!("../../../../config/samples/dgd-disagg.yaml")).unwrap();
        crate::target::TargetGraph::try_from(&dgd).unwrap()
    }

    fn policy(file: &str) -> PlannerPolicy {
        let text = match file {
            "sla" => include_str!("../../../../config/samples/plannerpolicy-sla.yaml"),
            _ => include_str!("../../../../config/samples/plannerpolicy-load.yaml"),
        };
        serde_yaml::from_str(text).unwrap()
    }

    #[test]
    fn configs_carry_the_spec() {
        let spec = policy("sla").spec;
        let validated =
            validation::validate(&spec, "llm", Some(&dgd()), &validation::Tenancy::default()).unwrap();
        let config = sla_config(&spec, &validated);
        assert_eq!(config.interval_s, 180.0);
        assert_eq!(config.limits.max_gpu_budget, Some(16));
        assert_eq!(config.limits.prefill, PoolLimits::new(1, Some(8)));
        // The decode pool's own minimum, the shared maximum.
        assert_eq!(config.limits.decode, PoolLimits::new(2, Some(8)));
        assert_eq!(config.predictor.kind, predictor::PredictorKind::Arima);
        assert_eq!(config.model, state::SlaModel::Queueing);
        assert_eq!(config.queueing.ttft_percentile, Some(90.0));
        // The delay the sample expects, until one is measured.
        assert_eq!(config.queueing.scale_up_delay_s, 180.0);
        assert!(!config.queueing.scale_up_delay_assumed);
        assert_eq!(config.queueing.stabilisation.window_s, 300.0);
        assert_eq!(config.queueing.stabilisation.quantile, 0.8);
        let mut highest = spec.clone();
        highest.behavior.scale_down_stabilization_keeps = StabilizationKeeps::Highest;
        assert_eq!(
            sla_config(&highest, &validated).queueing.stabilisation.quantile,
            1.0
        );
        assert_eq!(config.queueing.fast_path.period_s, 10.0);
        // The delay the spec says to expect stands in until one is measured (the loop plans
        // with the measured one once there is one).
        let mut expecting = spec.clone();
        expecting.behavior.expected_scale_up_delay = Some("5m".into());
        let validated_expecting =
            validation::validate(&expecting, "llm", Some(&dgd()), &validation::Tenancy::default()).unwrap();
        let config = sla_config(&expecting, &validated_expecting);
        assert_eq!(config.queueing.scale_up_delay_s, 300.0);
        assert!(!config.queueing.scale_up_delay_assumed);
        let settings = loop_settings(&expecting, &validated_expecting, None);
        assert_eq!(
            (
                settings.expected_scale_up_delay,
                settings.fast_period,
                settings.observe_only
            ),
            (
                Some(Duration::from_secs(300)),
                Some(Duration::from_secs(10)),
                false
            )
        );
        let load_spec = policy("load").spec;
        let load = load_config(
            &load_spec,
            &validation::validate(&load_spec, "llm", Some(&dgd()), &validation::Tenancy::default()).unwrap(),
        );
        assert_eq!((load.kv_scale_up, load.queue_scale_down), (0.9, 0.2));
        // Without a maximum, every planner stops at the absolute one.
        assert_eq!(load.decode.max, Some(ABSOLUTE_MAX_REPLICAS));
        let mut unbounded = spec.clone();
        unbounded.bounds.max_replicas = None;
        let config = sla_config(&unbounded, &validated);
        assert_eq!(config.limits.prefill.max, Some(ABSOLUTE_MAX_REPLICAS));
        assert_eq!(validated.dynamo_namespace, "llm-llama-disagg");
    }
}
