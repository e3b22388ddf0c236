//! The decide step (pure): one interval's observation through the policy's planner, and what the
//! status should say about it. No client, no clock: the reconciler hands in what it observed.

use std::sync::Arc;

use planner_api::{CorrectionFactors, ObservedLoad, PredictedLoad};
use planner_core::{
    interpolation::PerformanceModel,
    load::{LoadConfig, LoadDecision, LoadPlanner, LoadSamples, LoadSkip},
    state::{FastSignals, Hold, IntervalMetrics, SlaDecision, SlaModel, SlaPlanner, SlaPlannerConfig},
};

use super::status::{METRICS_AVAILABLE, SCALING_LIMITED, finite, scaling_limited};
use crate::{
    controller::conditions::DesiredCondition,
    sources::prometheus::{KvReading, KvUsageSource},
};

/// A policy's planner between intervals, with what it plans with.
pub enum PlannerState {
    /// The SLA planner (modes `sla` and `observe`), its configuration and the performance
    /// model of its profile.
    Sla {
        /// Predictor histories and correction factors.
        planner: Box<SlaPlanner>,
        /// Targets, limits and predictor settings.
        config: Box<SlaPlannerConfig>,
        /// The profile's interpolated curves.
        model: Arc<PerformanceModel>,
    },
    /// The load-based planner (mode `load`).
    Load {
        /// Its state (grace periods, trend).
        planner: LoadPlanner,
        /// Thresholds and limits.
        config: LoadConfig,
        /// One aggregated worker pool (Dynamo's rule for aggregated workers).
        aggregated: bool,
    },
}

/// What the observe step read for an interval.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    /// The frontend's interval metrics (SLA planner), and the decode KV usage read.
    Sla(IntervalMetrics, Option<KvReading>),
    /// Queue and KV-cache samples (load-based planner), or why they are missing.
    Load(Result<LoadSamples, String>),
    /// The graph's frontend has counted no request yet (either planner): why, for status.
    AwaitingTraffic(String),
}

/// Where the metrics came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsOrigin {
    /// The Dynamo namespace the series are filtered by.
    pub dynamo_namespace: String,
    /// The Prometheus URL, credentials removed.
    pub url: String,
}

/// The target's replicas when a decision is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replicas {
    /// Replicas serving (available), prefill and decode.
    pub serving: (u32, u32),
    /// Replicas asked for (the spec), prefill and decode.
    pub asked: (u32, u32),
}

/// One interval's decision and its report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Replicas to run (prefill, decode), or `None` to keep the current ones.
    pub target: Option<(u32, u32)>,
    /// Conditions the interval sets (`MetricsAvailable`, `ScalingLimited`).
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

/// Runs one interval of `state`'s planner on `observed`.
pub fn decide(
    state: &mut PlannerState,
    observed: Observed,
    replicas: Replicas,
    origin: &MetricsOrigin,
) -> Decision {
    // A graph awaiting its first request: the SLA planner holds (its tick counts the interval),
    // the load planner keeps its replicas.
    let observed = match (&*state, observed) {
        (PlannerState::Sla { .. }, Observed::AwaitingTraffic(reason)) => {
            Observed::Sla(IntervalMetrics::AwaitingTraffic { reason }, None)
        }
        (_, observed) => observed,
    };
    match (state, observed) {
        (PlannerState::Load { .. }, Observed::AwaitingTraffic(reason)) => Decision {
            conditions: vec![DesiredCondition::met(
                METRICS_AVAILABLE,
                AWAITING_TRAFFIC,
                reason.clone(),
            )],
            message: format!("keeping replicas: {reason}"),
            ..Decision::default()
        },
        (
            PlannerState::Sla {
                planner,
                config,
                model,
            },
            Observed::Sla(metrics, kv),
        ) => {
            // Upstream's formulas are given the replicas serving, as Dynamo's planner reads them;
            // the queueing model those asked for, so replicas still starting are not asked for
            // twice.
            let current = match config.model {
                SlaModel::Upstream => replicas.serving,
                SlaModel::Queueing => replicas.asked,
            };
            decide_sla(planner, config, model, metrics, kv, current, origin)
        }
        (
            PlannerState::Load {
                planner,
                config,
                aggregated,
            },
            Observed::Load(samples),
        ) => decide_load(planner, config, *aggregated, samples, replicas.serving, origin),
        // The observe step reads what the state's planner needs; a mismatch keeps replicas.
        _ => Decision {
            message: "keeping replicas: the observation does not match the planner's mode".into(),
            ..Decision::default()
        },
    }
}

/// The fast path between intervals: `Some` when the SLA is at risk and more replicas are needed
/// at once (never fewer). Only the queueing model has one.
pub fn decide_fast(state: &mut PlannerState, signals: &FastSignals, replicas: Replicas) -> Option<Decision> {
    let PlannerState::Sla {
        planner,
        config,
        model,
    } = state
    else {
        return None;
    };
    let tick = planner.fast_check(config, model.as_ref(), signals, replicas.asked)?;
    Some(Decision {
        target: tick.target(),
        conditions: tick
            .target()
            .is_some()
            .then(|| scaling_limited(tick.limits()))
            .into_iter()
            .collect(),
        message: tick.explanation(),
        ..Decision::default()
    })
}

/// Limits on what one decision may do, from `spec.bounds`. The replica bounds themselves
/// (`minReplicas`, `maxReplicas`, the GPU budget) are the planners' (`Limits::apply`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Guards {
    /// Most replicas one decision adds to a pool.
    pub max_step_up: Option<u32>,
    /// Most replicas one decision removes from a pool.
    pub max_step_down: Option<u32>,
    /// Whether a decision may take a pool to zero replicas.
    pub allow_zero: bool,
}

/// Applies `guards` to a decision against the replicas asked for now: a decision to zero
/// replicas (the GPU budget below both pools' minimums, as Dynamo's planner computes it) keeps
/// the replicas unless zero is allowed, and every pool stays within the step limits. Each
/// change is said in the message and `ScalingLimited`.
pub fn guard(mut decision: Decision, asked: (u32, u32), guards: &Guards) -> Decision {
    let Some(target) = decision.target else {
        return decision;
    };
    if !guards.allow_zero && (target.0 == 0 || target.1 == 0) && (asked.0 > 0 || asked.1 > 0) {
        let why = format!(
            "keeping replicas: the decision was {} prefill and {} decode replicas (the GPU budget cannot fit both pools' minimums); set spec.bounds.allowScaleToZero to allow it, or raise spec.bounds.maxGpuBudget",
            target.0, target.1
        );
        decision.target = None;
        decision.conditions.retain(|c| c.type_ != SCALING_LIMITED);
        decision.conditions.push(DesiredCondition::met(
            SCALING_LIMITED,
            "BudgetBelowMinimum",
            why.clone(),
        ));
        decision.message = why;
        return decision;
    }
    let mut notes = Vec::new();
    let mut bound = |pool: &str, want: u32, now: u32| -> u32 {
        let mut r = want;
        if let Some(up) = guards.max_step_up.filter(|&up| r > now.saturating_add(up)) {
            notes.push(format!("{pool} +{up} per decision (asked {r})"));
            r = now.saturating_add(up);
        }
        if let Some(down) = guards.max_step_down.filter(|&down| r < now.saturating_sub(down)) {
            notes.push(format!("{pool} -{down} per decision (asked {r})"));
            r = now.saturating_sub(down);
        }
        r
    };
    let guarded = (
        bound("prefill", target.0, asked.0),
        bound("decode", target.1, asked.1),
    );
    if !notes.is_empty() {
        let note = notes.join("; ");
        decision.message.push_str(&format!("; {note}"));
        decision.conditions.retain(|c| c.type_ != SCALING_LIMITED);
        decision
            .conditions
            .push(DesiredCondition::met(SCALING_LIMITED, "StepLimit", note));
        decision.target = Some(guarded);
    }
    decision
}

/// The `MetricsAvailable` reason of a graph whose frontend has counted no request yet.
pub const AWAITING_TRAFFIC: &str = "AwaitingTraffic";

/// Reports one SLA planner tick, with the decode KV usage read.
fn report_tick(tick: &SlaDecision, kv: Option<&KvReading>, origin: &MetricsOrigin) -> Decision {
    let mut decision = Decision {
        message: tick.explanation(),
        ..Decision::default()
    };
    decision.conditions.push(match tick.hold() {
        Some(Hold::MetricsUnavailable { reason }) => {
            DesiredCondition::unmet(METRICS_AVAILABLE, "MetricsUnavailable", reason.clone())
        }
        Some(Hold::NoTraffic) => DesiredCondition::met(
            METRICS_AVAILABLE,
            "NoTraffic",
            "no request completed in the last interval",
        ),
        Some(Hold::AwaitingTraffic { reason }) => {
            DesiredCondition::met(METRICS_AVAILABLE, AWAITING_TRAFFIC, reason.clone())
        }
        None => DesiredCondition::met(
            METRICS_AVAILABLE,
            "Observed",
            format!(
                "frontend metrics of {} from {}; {}",
                origin.dynamo_namespace,
                origin.url,
                kv_note(kv)
            ),
        ),
    });
    if tick.target().is_some() {
        decision.conditions.push(scaling_limited(tick.limits()));
    }
    decision.observed = tick.observed.as_ref().map(|o| ObservedLoad {
        requests: finite(o.arrivals.unwrap_or(o.num_req)),
        isl: finite(o.isl),
        osl: finite(o.osl),
        ttft_ms: finite(o.ttft_ms),
        itl_ms: finite(o.itl_ms),
        decode_kv_usage: kv.and_then(|kv| kv.mean).and_then(finite),
        decode_kv_usage_source: kv.map(|kv| kv.source),
    });
    decision.predicted = tick.predicted.as_ref().map(|load| PredictedLoad {
        requests: finite(load.num_req),
        isl: finite(load.isl),
        osl: finite(load.osl),
    });
    decision.correction = Some(CorrectionFactors {
        prefill: finite(tick.corrections.prefill),
        decode: finite(tick.corrections.decode),
    });
    decision.target = tick.target();
    decision
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

fn decide_sla(
    planner: &mut SlaPlanner,
    config: &SlaPlannerConfig,
    model: &PerformanceModel,
    metrics: IntervalMetrics,
    kv: Option<KvReading>,
    current: (u32, u32),
    origin: &MetricsOrigin,
) -> Decision {
    let tick = planner.tick(config, model, metrics, current);
    report_tick(&tick, kv.as_ref(), origin)
}

fn decide_load(
    planner: &mut LoadPlanner,
    config: &LoadConfig,
    aggregated: bool,
    samples: Result<LoadSamples, String>,
    current: (u32, u32),
    origin: &MetricsOrigin,
) -> Decision {
    let samples = match samples {
        Ok(samples) => samples,
        Err(reason) => {
            return Decision {
                conditions: vec![DesiredCondition::unmet(
                    METRICS_AVAILABLE,
                    "MetricsUnavailable",
                    reason.clone(),
                )],
                message: format!("keeping replicas: metrics unavailable ({reason})"),
                ..Decision::default()
            };
        }
    };
    // Dynamo's rule also counts an aggregated pool's waiting prompts as the KV they will take;
    // load mode reads no prompt lengths, so the operator's rule reads the engines' KV usage.
    let tick: LoadDecision = if aggregated {
        planner.tick_aggregated(config, current.1, &samples, 0.0)
    } else {
        planner.tick(config, current.0, current.1, &samples)
    };
    let condition = if tick.skipped == Some(LoadSkip::NoSamples) {
        DesiredCondition::unmet(
            METRICS_AVAILABLE,
            "NoSamples",
            format!(
                "no queue or KV-cache samples for {} in the last interval",
                origin.dynamo_namespace
            ),
        )
    } else {
        DesiredCondition::met(
            METRICS_AVAILABLE,
            "Observed",
            if samples.decode_kv_lower_bound {
                "load metrics sampled; decode KV usage from the KV router's estimate (no engine exports one for the graph): prompt blocks only, a lower bound decode is not scaled down on"
            } else {
                "load metrics sampled; decode KV usage from the engines"
            },
        )
    };
    Decision {
        target: tick.skipped.is_none().then_some((tick.prefill, tick.decode)),
        conditions: vec![condition],
        message: format!(
            "load mode: prefill {:?}, decode {:?}{}",
            tick.prefill_reason,
            tick.decode_reason,
            tick.skipped
                .as_ref()
                .map(|s| format!(" (skipped: {s:?})"))
                .unwrap_or_default()
        ),
        ..Decision::default()
    }
}

#[cfg(test)]
mod tests {
    use planner_core::{
        predictor::{PredictorConfig, PredictorKind},
        profile::Profile,
        sla::{Limits, Observation, SlaTargets},
        state::QueueingConfig,
    };

    use super::*;

    fn origin() -> MetricsOrigin {
        MetricsOrigin {
            dynamo_namespace: "llm-llama".into(),
            url: "http://prometheus:9090".into(),
        }
    }

    fn both(n: u32) -> Replicas {
        Replicas {
            serving: (n, n),
            asked: (n, n),
        }
    }

    fn sla_state() -> PlannerState {
        sla_state_with(SlaModel::Upstream)
    }

    fn sla_state_with(model_kind: SlaModel) -> PlannerState {
        let config = SlaPlannerConfig {
            interval_s: 60.0,
            sla: SlaTargets::new(500.0, 50.0),
            limits: Limits {
                min_replicas: 1,
                max_replicas: Some(3),
                max_gpu_budget: None,
                prefill_gpus_per_engine: 1,
                decode_gpus_per_engine: 1,
            },
            correction: true,
            predictor: PredictorConfig {
                kind: PredictorKind::Constant,
                interval_seconds: 60.0,
                ..PredictorConfig::default()
            },
            model: model_kind,
            queueing: QueueingConfig::default(),
            aggregated: None,
        };
        let profile = Profile::builtin("h200-llama3.1-8b-tp1").unwrap();
        PlannerState::Sla {
            planner: Box::new(SlaPlanner::new(&config)),
            config: Box::new(config),
            model: Arc::new(PerformanceModel::new(&profile).unwrap()),
        }
    }

    fn observed(num_req: f64) -> Observation {
        Observation::upstream(num_req, 3000.0, 300.0, 100.0, 20.0, 8.0)
    }

    #[test]
    fn missing_metrics_keep_replicas_and_say_why() {
        let mut state = sla_state();
        let decision = decide(
            &mut state,
            Observed::Sla(
                IntervalMetrics::Unavailable {
                    reason: "Prometheus at http://prometheus:9090 did not answer".into(),
                },
                None,
            ),
            both(2),
            &origin(),
        );
        assert_eq!(decision.target, None);
        assert_eq!(
            decision.conditions,
            [DesiredCondition::unmet(
                METRICS_AVAILABLE,
                "MetricsUnavailable",
                "Prometheus at http://prometheus:9090 did not answer"
            )]
        );
        assert!(
            decision
                .message
                .starts_with("keeping replicas: metrics unavailable")
        );
        assert_eq!(decision.observed, None);
    }

    #[test]
    fn a_busy_interval_scales_within_the_maximum_and_reports_the_limit() {
        let mut state = sla_state();
        let decision = decide(
            &mut state,
            Observed::Sla(IntervalMetrics::Observed(observed(60_000.0)), None),
            both(1),
            &origin(),
        );
        assert_eq!(decision.target, Some((3, 3)));
        let limited = decision
            .conditions
            .iter()
            .find(|c| c.type_ == super::super::status::SCALING_LIMITED)
            .unwrap();
        assert_eq!((limited.status, limited.reason.as_str()), ("True", "MaxReplicas"));
        assert!(
            decision.conditions.iter().any(|c| c.type_ == METRICS_AVAILABLE
                && c.status == "True"
                && c.message
                    == "frontend metrics of llm-llama from http://prometheus:9090; no decode KV usage (no engine or KV router exports one for the graph)"),
            "{:?}",
            decision.conditions
        );
        assert_eq!(decision.observed.unwrap().requests, Some(60_000.0));
        assert_eq!(decision.predicted.unwrap().requests, Some(60_000.0));
        assert!(
            decision.message.contains("capped at the maximum of 3"),
            "{}",
            decision.message
        );
    }

    #[test]
    fn an_idle_interval_holds_without_failing_the_metrics() {
        let mut state = sla_state();
        let idle = Observation {
            ttft_ms: f64::NAN,
            itl_ms: f64::NAN,
            ..observed(0.0)
        };
        let decision = decide(
            &mut state,
            Observed::Sla(IntervalMetrics::Observed(idle), None),
            both(1),
            &origin(),
        );
        assert_eq!(decision.target, None);
        assert_eq!(decision.conditions[0].reason, "NoTraffic");
        assert_eq!(decision.conditions[0].status, "True");
        // NaN means are not written to status.
        assert_eq!(decision.observed.unwrap().ttft_ms, None);
    }

    #[test]
    fn load_mode_without_samples_keeps_replicas() {
        let mut state = PlannerState::Load {
            aggregated: false,
            planner: LoadPlanner::default(),
            config: LoadConfig::default(),
        };
        let decision = decide(
            &mut state,
            Observed::Load(Err("no answer".into())),
            both(2),
            &origin(),
        );
        assert_eq!(decision.target, None);
        assert_eq!(decision.conditions[0].reason, "MetricsUnavailable");
        let decision = decide(
            &mut state,
            Observed::Load(Ok(LoadSamples::default())),
            both(2),
            &origin(),
        );
        assert_eq!(decision.target, None);
        assert_eq!(decision.conditions[0].reason, "NoSamples");
        assert!(decision.conditions[0].message.contains("llm-llama"));
    }

    #[test]
    fn load_mode_moves_an_aggregated_pool_as_one_by_its_kv_usage() {
        let mut state = PlannerState::Load {
            aggregated: true,
            planner: LoadPlanner::default(),
            config: LoadConfig::default(),
        };
        // No prefill queue series (aggregated workers have none): the KV usage decides.
        let busy = LoadSamples {
            prefill_queue: Vec::new(),
            decode_kv_usage: vec![0.95, 0.97],
            ..LoadSamples::default()
        };
        let decision = decide(&mut state, Observed::Load(Ok(busy)), both(2), &origin());
        assert_eq!(decision.target, Some((3, 3)));
        let mut state = PlannerState::Load {
            aggregated: true,
            planner: LoadPlanner::default(),
            config: LoadConfig::default(),
        };
        let idle = LoadSamples {
            prefill_queue: Vec::new(),
            decode_kv_usage: vec![0.05],
            ..LoadSamples::default()
        };
        let decision = decide(&mut state, Observed::Load(Ok(idle)), both(3), &origin());
        assert_eq!(decision.target, Some((2, 2)));
    }

    #[test]
    fn a_graph_awaiting_its_first_request_is_ready_and_holds() {
        let reason = "waiting for the first request: the frontend of llm-llama serves llama and has counted none yet; planning starts with it";
        for mut state in [
            sla_state(),
            sla_state_with(SlaModel::Queueing),
            PlannerState::Load {
                aggregated: false,
                planner: LoadPlanner::default(),
                config: LoadConfig::default(),
            },
        ] {
            let decision = decide(
                &mut state,
                Observed::AwaitingTraffic(reason.into()),
                both(2),
                &origin(),
            );
            assert_eq!(decision.target, None);
            assert_eq!(
                decision.conditions,
                [DesiredCondition::met(METRICS_AVAILABLE, AWAITING_TRAFFIC, reason)]
            );
            assert_eq!(decision.message, format!("keeping replicas: {reason}"));
            // Ready, with no failing condition (so no Warning Event).
            let status = super::super::status::next(
                None,
                Some(1),
                &super::super::status::Outcome {
                    conditions: decision.conditions.clone(),
                    message: decision.message.clone(),
                    ..Default::default()
                },
                k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap(),
            );
            let ready =
                crate::controller::conditions::find(&status.conditions, super::super::status::READY).unwrap();
            assert_eq!(ready.status, "True");
        }
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
            let mut state = sla_state();
            let decision = decide(
                &mut state,
                Observed::Sla(
                    IntervalMetrics::Observed(observed(600.0)),
                    Some(KvReading {
                        source,
                        mean: Some(0.25),
                        peak: Some(0.5),
                    }),
                ),
                both(1),
                &origin(),
            );
            let observed = decision.observed.unwrap();
            assert_eq!(
                (observed.decode_kv_usage, observed.decode_kv_usage_source),
                (Some(0.25), Some(source))
            );
            let available = decision
                .conditions
                .iter()
                .find(|c| c.type_ == METRICS_AVAILABLE)
                .unwrap();
            assert!(available.message.contains(note), "{}", available.message);
        }
    }

    #[test]
    fn a_mismatched_observation_changes_nothing() {
        let mut state = sla_state();
        let decision = decide(
            &mut state,
            Observed::Load(Ok(LoadSamples::default())),
            both(1),
            &origin(),
        );
        assert_eq!(decision.target, None);
    }

    #[test]
    fn the_queueing_model_plans_on_arrivals_and_asked_replicas() {
        let mut state = sla_state_with(SlaModel::Queueing);
        // 600 requests accepted, only 60 completed: the pool is overloaded.
        let mut overloaded = observed(60.0);
        overloaded.arrivals = Some(600.0);
        overloaded.inflight = Some(540.0);
        overloaded.queued = Some(500.0);
        let replicas = Replicas {
            serving: (1, 1),
            asked: (1, 1),
        };
        let decision = decide(
            &mut state,
            Observed::Sla(IntervalMetrics::Observed(overloaded), None),
            replicas,
            &origin(),
        );
        let (prefill, decode) = decision.target.unwrap();
        assert!(prefill > 1 && decode >= 1, "{prefill}/{decode}");
        // The status reports the demand (requests accepted), not the completions.
        assert_eq!(decision.observed.unwrap().requests, Some(600.0));
        assert!(decision.message.contains("req/s planned"), "{}", decision.message);
    }

    #[test]
    fn the_queueing_model_reports_the_maximum_that_limited_it() {
        let mut state = sla_state_with(SlaModel::Queueing);
        // Far more arrivals than three engines of each pool serve.
        let mut flooded = observed(60.0);
        flooded.arrivals = Some(60_000.0);
        flooded.inflight = Some(5_000.0);
        flooded.queued = Some(4_000.0);
        let decision = decide(
            &mut state,
            Observed::Sla(IntervalMetrics::Observed(flooded), None),
            both(1),
            &origin(),
        );
        assert_eq!(decision.target, Some((3, 3)));
        let limited = decision
            .conditions
            .iter()
            .find(|c| c.type_ == super::super::status::SCALING_LIMITED)
            .unwrap();
        assert_eq!((limited.status, limited.reason.as_str()), ("True", "MaxReplicas"));
        assert!(
            decision.message.contains("capped at the maximum of 3"),
            "{}",
            decision.message
        );
    }

    #[test]
    fn the_fast_path_scales_up_on_a_backlog_and_never_down() {
        let mut state = sla_state_with(SlaModel::Queueing);
        let mut calm = observed(60.0);
        calm.arrivals = Some(60.0);
        calm.inflight = Some(2.0);
        calm.queued = Some(0.0);
        let replicas = Replicas {
            serving: (2, 2),
            asked: (2, 2),
        };
        decide(
            &mut state,
            Observed::Sla(IntervalMetrics::Observed(calm), None),
            replicas,
            &origin(),
        );
        let quiet = FastSignals {
            elapsed_s: 10.0,
            window_s: 10.0,
            arrivals: Some(10.0),
            completions: 10.0,
            inflight: Some(2.0),
            queued: Some(0.0),
            prefill_engines: 2.0,
            decode_engines: Some(1.0),
            isl: f64::NAN,
            isl_second_moment: None,
            osl: f64::NAN,
            osl_second_moment: None,
        };
        assert_eq!(decide_fast(&mut state, &quiet, replicas), None);
        let flooded = FastSignals {
            elapsed_s: 20.0,
            arrivals: Some(400.0),
            inflight: Some(900.0),
            queued: Some(800.0),
            ..quiet
        };
        let decision = decide_fast(&mut state, &flooded, replicas).unwrap();
        let (prefill, decode) = decision.target.unwrap();
        assert!(prefill > 2 && decode >= 2, "{prefill}/{decode}");
        assert!(
            decision.message.contains("requests waiting") || decision.message.contains("exceed"),
            "{}",
            decision.message
        );
    }

    fn wanting(target: (u32, u32)) -> Decision {
        Decision {
            target: Some(target),
            message: "sized for the forecast".into(),
            ..Decision::default()
        }
    }

    #[test]
    fn zero_replicas_are_held_unless_allowed() {
        let held = guard(wanting((0, 0)), (2, 2), &Guards::default());
        assert_eq!(held.target, None);
        assert!(held.message.contains("allowScaleToZero"), "{}", held.message);
        assert_eq!(held.conditions[0].reason, "BudgetBelowMinimum");
        let allowed = Guards {
            allow_zero: true,
            ..Guards::default()
        };
        assert_eq!(guard(wanting((0, 0)), (2, 2), &allowed).target, Some((0, 0)));
    }

    #[test]
    fn steps_are_limited() {
        let stepped = Guards {
            max_step_up: Some(4),
            max_step_down: Some(1),
            ..Guards::default()
        };
        let up = guard(wanting((20, 1)), (2, 5), &stepped);
        assert_eq!(up.target, Some((6, 4)));
        assert_eq!(up.conditions[0].reason, "StepLimit");
        // Within the limits nothing changes.
        assert_eq!(guard(wanting((3, 4)), (2, 5), &stepped), wanting((3, 4)));
    }
}
