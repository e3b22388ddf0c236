use crate::sla::PoolLimits;
use std::time::Duration;

use super::*;
use crate::{
    budget::{Contender, Grant, GrantReason},
    interpolation::PerformanceModel,
    load::LoadSamples,
    predictor::{PredictorConfig, PredictorKind},
    profile::Profile,
    sla::{Limits, Observation},
    state::{IntervalMetrics, QueueingConfig, SlaModel, SlaPlannerConfig},
};

fn s(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

fn model() -> PerformanceModel {
    PerformanceModel::new(&Profile::builtin("h200-llama3.1-8b-tp1").unwrap()).unwrap()
}

fn sla_config(model: SlaModel, max: u32) -> SlaPlannerConfig {
    SlaPlannerConfig {
        interval_s: 60.0,
        sla: SlaTargets::new(500.0, 50.0),
        limits: Limits {
            prefill: PoolLimits::new(1, Some(max)),
            decode: PoolLimits::new(1, Some(max)),
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
    }
}

fn observed(num_req: f64) -> Observation {
    Observation::upstream(num_req, 3000.0, 300.0, 100.0, 20.0, 8.0)
}

fn replicas(asked: (u32, u32), serving: (u32, u32)) -> Replicas {
    Replicas { serving, asked }
}

fn both(n: u32) -> Replicas {
    replicas((n, n), (n, n))
}

/// Runs a due interval at `now` on `observation` and settles it without a budget.
fn interval(
    policy: &mut PolicyLoop,
    now: Duration,
    metrics: IntervalMetrics,
    at: Replicas,
    ready: Option<bool>,
) -> Decision {
    assert!(matches!(policy.due(now, at), Due::Interval { .. }), "at {now:?}");
    let proposal = policy.decide(
        now,
        Input::Interval(Observed::Frontend(metrics)),
        at,
        Some(&model()),
    );
    policy.settle(now, proposal, None, at, ready)
}

#[test]
fn a_busy_interval_scales_within_the_maximum_and_says_what_limited_it() {
    let mut policy = PolicyLoop::new(
        Planner::sla(sla_config(SlaModel::Upstream, 3)),
        LoopSettings::default(),
    );
    let decision = interval(
        &mut policy,
        s(0),
        IntervalMetrics::Observed(observed(60_000.0)),
        both(1),
        None,
    );
    assert_eq!(decision.target, Some((3, 3)));
    assert_eq!(decision.scale_to, Some((3, 3)));
    assert_eq!(decision.metrics, Some(MetricsState::Observed));
    let limitation = decision.limitation.unwrap();
    assert_eq!(limitation.reason, LimitReason::MaxReplicas);
    assert!(
        decision.message.contains("capped at the maximum of 3"),
        "{}",
        decision.message
    );
}

#[test]
fn missing_metrics_keep_the_replicas_and_say_why() {
    let mut policy = PolicyLoop::new(
        Planner::sla(sla_config(SlaModel::Queueing, 8)),
        LoopSettings::default(),
    );
    let decision = interval(
        &mut policy,
        s(0),
        IntervalMetrics::Unavailable {
            reason: "Prometheus did not answer".into(),
        },
        both(4),
        None,
    );
    assert_eq!((decision.target, decision.scale_to), (None, None));
    assert_eq!(
        decision.metrics,
        Some(MetricsState::Unavailable {
            reason: "Prometheus did not answer".into()
        })
    );
    assert!(
        decision
            .message
            .starts_with("keeping replicas: metrics unavailable")
    );
    assert_eq!(decision.limitation, None);
}

#[test]
fn step_limits_cut_a_decision_and_say_so() {
    let settings = LoopSettings {
        guards: Guards {
            max_step_up: Some(1),
            max_step_down: None,
            allow_zero: false,
        },
        ..LoopSettings::default()
    };
    let mut policy = PolicyLoop::new(Planner::sla(sla_config(SlaModel::Upstream, 8)), settings);
    let decision = interval(
        &mut policy,
        s(0),
        IntervalMetrics::Observed(observed(60_000.0)),
        both(1),
        None,
    );
    assert_eq!(decision.scale_to, Some((2, 2)));
    let limitation = decision.limitation.unwrap();
    assert_eq!(limitation.reason, LimitReason::StepLimit);
    assert_eq!(
        limitation.message,
        "prefill +1 per decision (asked 8); decode +1 per decision (asked 8)"
    );
}

#[test]
fn a_decision_to_zero_keeps_the_replicas_unless_zero_is_allowed() {
    let mut decision = Decision::keep(Check::Interval);
    decision.target = Some((0, 0));
    let mut kept = decision.clone();
    guard::guard(&mut kept, (2, 2), &Guards::default());
    assert_eq!(kept.target, None);
    assert_eq!(kept.limitation.unwrap().reason, LimitReason::BudgetBelowMinimum);
    let mut allowed = decision;
    guard::guard(
        &mut allowed,
        (2, 2),
        &Guards {
            allow_zero: true,
            ..Guards::default()
        },
    );
    assert_eq!(allowed.target, Some((0, 0)));
}

#[test]
fn a_scale_up_waits_for_a_stuck_target_only_when_its_last_one_is_overdue() {
    // The queueing model counts replicas still starting: a scale-up goes through while the
    // target is not Ready, until the last one has taken twice the delay planned with.
    let settings = LoopSettings {
        expected_scale_up_delay: Some(s(100)),
        ..LoopSettings::default()
    };
    let mut policy = PolicyLoop::new(Planner::sla(sla_config(SlaModel::Queueing, 16)), settings);
    policy.due(s(0), both(1));
    policy.actuated(s(0), (1, 1), (3, 1));
    let starting = replicas((3, 1), (1, 1));
    assert!(guard::gate_open(
        Some(false),
        true,
        (&policy.startup, s(100)),
        (3, 1),
        (4, 1),
        s(150)
    ));
    assert!(!guard::gate_open(
        Some(false),
        true,
        (&policy.startup, s(100)),
        (3, 1),
        (4, 1),
        s(201)
    ));
    // Upstream's rule (no replicas counted as starting) holds every scale-up until Ready...
    assert!(!guard::gate_open(
        Some(false),
        false,
        (&policy.startup, s(100)),
        (3, 1),
        (4, 1),
        s(10)
    ));
    // ... and never a scale-down.
    assert!(guard::gate_open(
        Some(false),
        false,
        (&policy.startup, s(100)),
        (3, 1),
        (2, 1),
        s(10)
    ));
    // Without a notion of readiness nothing is held.
    assert!(guard::gate_open(
        None,
        false,
        (&policy.startup, s(100)),
        (3, 1),
        (4, 1),
        s(500)
    ));
    let mut held = Decision::keep(Check::Interval);
    held.target = Some((5, 1));
    let decision = policy.settle(
        s(300),
        Proposal {
            decision: held,
            ask: None,
        },
        None,
        starting,
        Some(false),
    );
    assert_eq!(decision.scale_to, None);
    assert_eq!(decision.deferred.as_deref(), Some(NOT_READY));
    assert!(decision.message.ends_with(NOT_READY), "{}", decision.message);
}

#[test]
fn observe_mode_decides_and_applies_nothing() {
    let settings = LoopSettings {
        observe_only: true,
        ..LoopSettings::default()
    };
    let mut policy = PolicyLoop::new(Planner::sla(sla_config(SlaModel::Upstream, 8)), settings);
    let decision = interval(
        &mut policy,
        s(0),
        IntervalMetrics::Observed(observed(60_000.0)),
        both(1),
        None,
    );
    assert!(decision.target.is_some());
    assert_eq!(decision.scale_to, None);
    assert!(decision.message.ends_with(" (observe mode: not applied)"));
}

#[test]
fn the_scale_up_delay_is_measured_at_the_wakes_and_planned_with() {
    let settings = LoopSettings {
        fast_period: Some(s(10)),
        ..LoopSettings::default()
    };
    let mut policy = PolicyLoop::new(Planner::sla(sla_config(SlaModel::Queueing, 8)), settings);
    assert_eq!(
        policy.planned_delay().delay,
        crate::startup::DEFAULT_SCALE_UP_DELAY
    );
    assert!(policy.planned_delay().assumed);
    policy.due(s(0), both(1));
    policy.actuated(s(0), (1, 1), (2, 1));
    for t in (10..=80).step_by(10) {
        let serving = if t >= 80 { (2, 1) } else { (1, 1) };
        policy.due(s(t), replicas((2, 1), serving));
    }
    assert_eq!(policy.measured_delay(), Some(s(80)));
    assert!(!policy.planned_delay().assumed);
    // A change made outside the loop is timed too.
    policy.due(s(100), replicas((4, 1), (2, 1)));
    policy.due(s(130), replicas((4, 1), (4, 1)));
    assert_eq!(policy.measured_delay(), Some(s(55)));
}

#[test]
fn the_interval_reads_the_engines_that_served_through_it() {
    let settings = LoopSettings {
        fast_period: Some(s(10)),
        ..LoopSettings::default()
    };
    let mut policy = PolicyLoop::new(Planner::sla(sla_config(SlaModel::Queueing, 8)), settings);
    interval(
        &mut policy,
        s(0),
        IntervalMetrics::Observed(observed(60.0)),
        both(2),
        None,
    );
    // Four engines seen from 30 s on (two at 20 s): between the wakes that saw the change the
    // count is taken to change evenly, so the interval averaged (20·2 + 10·3 + 30·4)/60.
    for t in (10..60).step_by(10) {
        let n = if t >= 30 { 4 } else { 2 };
        policy.due(s(t), both(n));
    }
    let decision = interval(
        &mut policy,
        s(60),
        IntervalMetrics::Observed(observed(60.0)),
        both(4),
        None,
    );
    let observed = decision.observed.unwrap();
    assert_eq!(observed.prefill_engines, Some(190.0 / 60.0));
    assert_eq!(observed.decode_engines, Some(190.0 / 60.0));
}

#[test]
fn fast_checks_are_told_the_time_since_the_interval_and_the_engines_serving() {
    let settings = LoopSettings {
        fast_period: Some(s(10)),
        ..LoopSettings::default()
    };
    let mut policy = PolicyLoop::new(Planner::sla(sla_config(SlaModel::Queueing, 8)), settings);
    interval(
        &mut policy,
        s(0),
        IntervalMetrics::Observed(observed(60.0)),
        both(1),
        None,
    );
    assert_eq!(
        policy.due(s(10), both(1)),
        Due::Fast {
            window: MIN_FAST_WINDOW
        }
    );
    // A surge the interval did not plan for: more replicas at once.
    let signals = FastSignals {
        elapsed_s: f64::NAN,
        window_s: 20.0,
        arrivals: Some(2000.0),
        completions: 100.0,
        inflight: Some(400.0),
        queued: Some(300.0),
        prefill_engines: f64::NAN,
        decode_engines: None,
        isl: f64::NAN,
        isl_second_moment: None,
        osl: f64::NAN,
        osl_second_moment: None,
    };
    let proposal = policy.decide(s(10), Input::Fast(Some(signals)), both(1), Some(&model()));
    assert_eq!(proposal.decision.check, Check::Fast);
    let plan = proposal.decision.plan.clone().expect("a fast plan");
    assert!(proposal.decision.target.is_some_and(|t| t.0 > 1), "{plan:?}");
    // Signals that could not be read decide nothing.
    assert_eq!(
        policy.due(s(20), both(1)),
        Due::Fast {
            window: MIN_FAST_WINDOW
        }
    );
    let idle = policy.decide(s(20), Input::Fast(None), both(1), Some(&model()));
    assert!(idle.is_idle());
}

#[test]
fn the_share_of_intervals_meeting_the_sla_covers_the_last_hour() {
    let mut policy = PolicyLoop::new(
        Planner::sla(sla_config(SlaModel::Upstream, 8)),
        LoopSettings::default(),
    );
    let slow = Observation {
        ttft_ms: 900.0,
        ..observed(60.0)
    };
    let mut t = 0;
    for met in [true, false, true, true] {
        let observation = if met { observed(60.0) } else { slow };
        let decision = interval(
            &mut policy,
            s(t),
            IntervalMetrics::Observed(observation),
            both(1),
            None,
        );
        assert_eq!(decision.sla_met, Some(met));
        t += 60;
    }
    assert_eq!(policy.attainment(s(t)), Some(0.75));
    // An hour on, only what is younger counts.
    assert_eq!(policy.attainment(s(3600 + 120)), Some(1.0));
    assert_eq!(policy.attainment(s(3600 * 3)), None);
    // A percentile target is judged on that percentile.
    let targets = SlaTargets::new(500.0, 50.0);
    let tail = Observation {
        ttft_quantile_ms: Some((0.9, 800.0)),
        ..observed(60.0)
    };
    assert_eq!(sla_met(&tail, &targets, None), Some(true));
    assert_eq!(sla_met(&tail, &targets, Some(90.0)), Some(false));
}

fn membership() -> Membership {
    Membership {
        name: "gpus".into(),
        priority: 0,
        weight: 1.0,
        floor: (1, 1),
        gpus: (4, 4),
        aggregated: false,
    }
}

fn answer(reason: GrantReason, granted: [u32; 2], allowed: [u32; 2]) -> Answer {
    Answer {
        grant: Grant {
            member: "team/steady".into(),
            replicas: granted.to_vec(),
            gpus: u64::from(granted[0] + granted[1]) * 4,
            floor_gpus: 8,
            asked_gpus: 24,
            reason,
            contenders: vec![Contender {
                member: "team/burst".into(),
                priority: 10,
                gpus: 16,
            }],
        },
        allowed: allowed.to_vec(),
        total: 32,
    }
}

#[test]
fn a_member_asks_for_its_decision_and_is_cut_to_its_grant() {
    let settings = LoopSettings {
        membership: Some(membership()),
        ..LoopSettings::default()
    };
    let mut policy = PolicyLoop::new(Planner::sla(sla_config(SlaModel::Upstream, 8)), settings);
    let at = both(1);
    policy.due(s(0), at);
    let proposal = policy.decide(
        s(0),
        Input::Interval(Observed::Frontend(IntervalMetrics::Observed(observed(60_000.0)))),
        at,
        Some(&model()),
    );
    let ask = proposal.ask.clone().unwrap();
    assert_eq!(ask.pools.iter().map(|p| p.want).collect::<Vec<_>>(), [8, 8]);
    assert_eq!(ask.pools.iter().map(|p| p.floor).collect::<Vec<_>>(), [1, 1]);
    let decision = policy.settle(
        s(0),
        proposal,
        Some(&answer(GrantReason::Cut, [3, 2], [3, 2])),
        at,
        None,
    );
    assert_eq!(decision.scale_to, Some((3, 2)));
    assert_eq!(decision.limitation.unwrap().reason, LimitReason::SharedBudget);
    let grant = decision.grant.unwrap();
    assert_eq!((grant.granted_gpus, grant.reason), (20, GrantReason::Cut));
    // Between decisions it asks again for what it last wanted.
    let between = policy.decide(s(10), Input::Grant, replicas((3, 2), (3, 2)), Some(&model()));
    assert_eq!(
        between
            .ask
            .unwrap()
            .pools
            .iter()
            .map(|p| p.want)
            .collect::<Vec<_>>(),
        [8, 8]
    );
    // A member whose floor is unfunded keeps its floor.
    let mut floor = Decision::keep(Check::Grant);
    member::granted(
        &mut floor,
        &membership(),
        &answer(GrantReason::FloorUnfunded, [0, 0], [0, 0]),
        (2, 2),
    );
    assert_eq!(floor.target, Some((1, 1)));
}

#[test]
fn the_load_planner_holds_on_missing_samples_and_plans_on_samples() {
    let config = crate::load::LoadConfig {
        max_gpu_budget: None,
        ..crate::load::LoadConfig::default()
    };
    let mut policy = PolicyLoop::new(Planner::load(config, false), LoopSettings::default());
    assert!(policy.reads_samples());
    let at = both(2);
    policy.due(s(0), at);
    let missing = policy.decide::<PerformanceModel>(
        s(0),
        Input::Interval(Observed::Samples(Err("Prometheus did not answer".into()))),
        at,
        None,
    );
    assert_eq!(missing.decision.target, None);
    assert!(!missing.decision.metrics.unwrap().available());
    policy.due(s(60), at);
    let busy = LoadSamples {
        prefill_queue: vec![10.0; 6],
        decode_kv_usage: vec![0.95; 6],
        decode_kv_lower_bound: false,
        prefill_busy: Vec::new(),
    };
    let proposal =
        policy.decide::<PerformanceModel>(s(60), Input::Interval(Observed::Samples(Ok(busy))), at, None);
    assert_eq!(proposal.decision.target, Some((3, 3)));
    assert_eq!(
        proposal.decision.message,
        "load mode: prefill 2 -> 3 (queue 5.00 per engine above 0.50); decode 2 -> 3 (KV usage 95% above 90%)"
    );
}
