//! The queueing planner end to end: interval ticks and fast checks through [`SlaPlanner`].

use super::*;
use crate::sla::PoolLimits;
use crate::{
    interpolation::PerformanceModel,
    predictor::{PredictorConfig, PredictorKind},
    profile::Profile,
    sizing::{self, LengthMoments},
    sla::{Limits, Observation, SlaTargets},
    state::{IntervalMetrics, SlaDecision, SlaModel, SlaPlanner, SlaPlannerConfig},
};

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
        decode_kv_usage: None,
        decode_kv_usage_peak: None,
        decode_engines: None,
        num_req,
        isl: 3000.0,
        osl: 300.0,
        ttft_ms: 100.0,
        itl_ms: 20.0,
        request_duration_s: 8.0,
    }
}

fn queueing_config() -> SlaPlannerConfig {
    SlaPlannerConfig {
        model: SlaModel::Queueing,
        limits: Limits {
            prefill: PoolLimits::new(1, Some(64)),
            decode: PoolLimits::new(1, Some(64)),
            max_gpu_budget: None,
            prefill_gpus_per_engine: 1,
            decode_gpus_per_engine: 1,
            ratio: None,
        },
        ..config(PredictorKind::Constant)
    }
}

/// An interval with `arrivals` requests of 3000/300 tokens, served without queueing by
/// `engines` prefill engines.
fn seen(arrivals: f64, queued: f64, engines: f64) -> Observation {
    Observation {
        arrivals: Some(arrivals),
        inflight: Some(queued + 10.0),
        queued: Some(queued),
        isl_second_moment: Some(1.5 * 3000.0 * 3000.0),
        osl_second_moment: Some(1.5 * 300.0 * 300.0),
        ttft_quantile_ms: None,
        prefill_engines: Some(engines),
        decode_kv_usage: Some(0.3),
        ttft_ms: 150.0,
        ..observed(arrivals)
    }
}

fn tick(
    planner: &mut SlaPlanner,
    config: &SlaPlannerConfig,
    o: Observation,
    current: (u32, u32),
) -> SlaDecision {
    planner.tick(config, &model(), IntervalMetrics::Observed(o), current)
}

#[test]
fn queueing_sizes_prefill_with_queueing_and_explains_why() {
    let config = queueing_config();
    let mut planner = SlaPlanner::new(&config);
    let low = tick(&mut planner, &config, seen(600.0, 0.0, 1.0), (1, 1));
    let plan = low.queueing().cloned().unwrap();
    assert_eq!(plan.reason, ScaleReason::Forecast);
    assert!(plan.prefill_sizing.ttft_ms <= 500.0);
    assert_eq!(plan.forecast_requests, 600.0);
    // Ten times the arrivals: more prefill engines, and the explanation says so.
    let mut planner = SlaPlanner::new(&config);
    let high = tick(&mut planner, &config, seen(6000.0, 0.0, 1.0), (1, 1));
    let (p_high, _) = high.target().unwrap();
    assert!(p_high > low.target().unwrap().0, "{:?}", high.queueing());
    assert!(high.explanation().contains("prefill"), "{}", high.explanation());
    // Its predicted TTFT includes the wait: more than the bare prefill time.
    let sizing = high.queueing().cloned().unwrap().prefill_sizing;
    assert!(sizing.ttft_ms > sizing.service_ms);
}

#[test]
fn queueing_counts_arrivals_or_completions_plus_inflight_growth() {
    let config = queueing_config();
    let mut planner = SlaPlanner::new(&config);
    let mut o = seen(600.0, 0.0, 1.0);
    o.arrivals = None;
    o.inflight = Some(10.0);
    tick(&mut planner, &config, o, (1, 1));
    // 600 completed and the inflight gauge grew by 300: 900 arrived.
    o.inflight = Some(310.0);
    let d = tick(&mut planner, &config, o, (1, 1));
    assert_eq!(d.predicted.unwrap().num_req, 900.0);
}

#[test]
fn queueing_scale_down_waits_for_the_stabilisation_window_and_the_backlog() {
    // Held at the window's highest recommendation, as Kubernetes' HPA does.
    let mut config = queueing_config();
    config.queueing.stabilisation.quantile = 1.0;
    let mut planner = SlaPlanner::new(&config);
    let busy = tick(&mut planner, &config, seen(12_000.0, 0.0, 1.0), (1, 1));
    let high = busy.target().unwrap();
    assert!(high.0 > 1);
    // Load drops: what the arrivals needed is held for the 300 s window (the recommendation
    // five 60 s intervals old has left it), then released.
    let mut replicas = high;
    let mut released_after = None;
    for i in 1..=8 {
        let d = tick(
            &mut planner,
            &config,
            seen(600.0, 0.0, f64::from(replicas.0)),
            replicas,
        );
        let plan = d.queueing().cloned().unwrap();
        if plan.reason != ScaleReason::Stabilising && released_after.is_none() {
            released_after = Some(i);
            assert!(plan.replicas.0 < replicas.0);
        } else if released_after.is_none() {
            assert!(plan.replicas.0 > plan.desired.0 + 4, "{plan:?}");
        }
        replicas = d.target().unwrap();
    }
    assert_eq!(released_after, Some(5), "held for the window");
    // With a backlog nothing scales down, whatever the window says.
    let mut planner = SlaPlanner::new(&config);
    tick(&mut planner, &config, seen(600.0, 0.0, 8.0), (8, 8));
    for _ in 0..8 {
        let d = tick(&mut planner, &config, seen(600.0, 500.0, 8.0), (8, 8));
        assert_eq!(d.target(), Some((8, 8)));
    }
    let d = tick(&mut planner, &config, seen(600.0, 500.0, 8.0), (8, 8));
    assert!(matches!(
        d.queueing().cloned().unwrap().reason,
        ScaleReason::BacklogHold { .. }
    ));
}

#[test]
fn a_backlog_scale_up_is_not_held_once_the_backlog_is_gone() {
    let config = queueing_config();
    let mut planner = SlaPlanner::new(&config);
    for _ in 0..3 {
        tick(&mut planner, &config, seen(600.0, 0.0, 2.0), (2, 2));
    }
    // A backlog of 3000 requests: sized to drain it within the interval.
    let drain = tick(&mut planner, &config, seen(600.0, 3000.0, 2.0), (2, 2));
    let plan = drain.queueing().cloned().unwrap();
    assert!(
        matches!(plan.reason, ScaleReason::Backlog { .. }),
        "{:?}",
        plan.reason
    );
    let high = plan.replicas;
    assert!(high.0 > 4, "{high:?}");
    // Drained, same arrivals: back to what the arrivals need at once, not after the window.
    let after = tick(&mut planner, &config, seen(600.0, 0.0, f64::from(high.0)), high);
    let (p, _) = after.target().unwrap();
    assert!(p < high.0, "{p} vs {high:?}");
    assert!(p <= 3, "{:?}", after.queueing());
}

#[test]
fn a_backlog_scale_up_is_stabilised_when_replicas_serve_after_the_next_interval() {
    // Replicas serve 180 s after they are asked for: three intervals.
    let mut config = queueing_config();
    config.queueing.scale_up_delay_s = 180.0;
    config.queueing.stabilisation.quantile = 1.0;
    let mut planner = SlaPlanner::new(&config);
    for _ in 0..3 {
        tick(&mut planner, &config, seen(600.0, 0.0, 2.0), (2, 2));
    }
    let drain = tick(&mut planner, &config, seen(600.0, 3000.0, 2.0), (2, 2));
    let high = drain.queueing().cloned().unwrap().replicas;
    // (Up to 1.3 times the 2 engines serving: `scale_up.long_delay_factor`.)
    assert!(high.0 > 2, "{high:?}");
    // Drained: what draining asked for stays within the window, as a recommendation of the
    // arrivals would (at a 60 s delay it is released at once).
    let after = tick(&mut planner, &config, seen(600.0, 0.0, f64::from(high.0)), high);
    let plan = after.queueing().cloned().unwrap();
    assert_eq!(plan.replicas.0, high.0, "{plan:?}");
    assert_eq!(plan.reason, ScaleReason::Stabilising);
}

#[test]
fn observed_kv_usage_corrects_the_decode_model() {
    let config = queueing_config();
    // The pool holds far more KV than the model says 3000 requests a minute hold (long
    // outputs on long prompts, say): the corrected plan asks for more decode engines.
    let run = |usage: Option<f64>| {
        let mut planner = SlaPlanner::new(&config);
        let mut last = None;
        for _ in 0..8 {
            let o = Observation {
                decode_kv_usage: usage,
                ..seen(3000.0, 0.0, 4.0)
            };
            last = tick(&mut planner, &config, o, (4, 4)).target();
        }
        last.unwrap().1
    };
    // Without a usage reading, the model as it is.
    let plain = run(None);
    assert!(run(Some(0.8)) > plain, "{} vs {plain}", run(Some(0.8)));
    assert!(run(Some(0.02)) <= plain);
    // A saturated cache says nothing (admission waits cap what it shows).
    assert_eq!(run(Some(0.95)), plain);
}

#[test]
fn kv_usage_is_of_the_decode_engines_that_served() {
    let config = queueing_config();
    // Four decode replicas asked for, `engines` of them serving through the interval (the
    // others still starting, later than the planner assumed): the usage is of those serving.
    let run = |engines: Option<f64>| {
        let mut planner = SlaPlanner::new(&config);
        let mut last = None;
        for _ in 0..8 {
            let o = Observation {
                decode_kv_usage: Some(0.8),
                decode_engines: engines,
                ..seen(3000.0, 0.0, 4.0)
            };
            last = tick(&mut planner, &config, o, (4, 4)).target();
        }
        last.unwrap().1
    };
    let plain = {
        let mut planner = SlaPlanner::new(&config);
        let mut last = None;
        for _ in 0..8 {
            let o = Observation {
                decode_kv_usage: None,
                ..seen(3000.0, 0.0, 4.0)
            };
            last = tick(&mut planner, &config, o, (4, 4)).target();
        }
        last.unwrap().1
    };
    // Without the count, or with all four serving, the usage is of the four asked for.
    let all = run(Some(4.0));
    assert_eq!(run(None), all);
    assert!(all > plain, "{all} vs {plain}");
    // Two serving hold half the tokens four would at that usage.
    let two = run(Some(2.0));
    assert!(two < all, "{two} vs {all}");
    // A count that changed through the interval says nothing.
    assert_eq!(run(Some(3.5)), plain);
}

#[test]
fn decode_has_its_own_cold_start_margin() {
    let with = |decode_cold: f64| {
        let mut config = queueing_config();
        config.queueing.margins.cold = 1.4;
        config.queueing.margins.decode_cold = decode_cold;
        // Above both cold margins, so the plan's clamp leaves them whole.
        config.queueing.margins.max_multiplier = 1.5;
        config
    };
    // The first interval: no forecast errors known yet, so both margins are the cold ones.
    let first = |config: &SlaPlannerConfig| {
        let mut planner = SlaPlanner::new(config);
        tick(&mut planner, config, seen(3000.0, 0.0, 4.0), (4, 4))
            .queueing()
            .cloned()
            .unwrap()
    };
    let shared = first(&with(1.4));
    let own = first(&with(1.1));
    assert_eq!(shared.forecast_multiplier, 1.4);
    assert_eq!(shared.decode_multiplier, 1.4);
    assert_eq!(own.forecast_multiplier, 1.4, "prefill keeps the cold margin");
    assert_eq!(own.decode_multiplier, 1.1);
    assert!(
        own.decode_sizing.replicas < shared.decode_sizing.replicas,
        "{own:?} vs {shared:?}"
    );
    assert_eq!(own.prefill_sizing.replicas, shared.prefill_sizing.replicas);
}

#[test]
fn decode_provides_for_more_kv_demand_when_replicas_serve_intervals_later() {
    let decode_at = |delay: f64| {
        let mut config = queueing_config();
        config.queueing.scale_up_delay_s = delay;
        // Far apart, so that the difference shows on the 8B model's large cache.
        config.queueing.decode_kv.sigmas = 1.0;
        config.queueing.decode_kv.long_delay_sigmas = 30.0;
        let mut planner = SlaPlanner::new(&config);
        // Long contexts: decode is sized by its KV cache.
        let long = Observation {
            isl: 12000.0,
            osl: 1500.0,
            isl_second_moment: Some(1.5 * 12000.0 * 12000.0),
            osl_second_moment: Some(1.5 * 1500.0 * 1500.0),
            ..seen(600.0, 0.0, 8.0)
        };
        let plan = tick(&mut planner, &config, long, (8, 8))
            .queueing()
            .cloned()
            .unwrap();
        assert_eq!(plan.decode_sizing.bound, sizing::Bound::KvCache, "{plan:?}");
        plan.decode_sizing.replicas
    };
    // 90 s against the 60 s interval is not long; 91 s is.
    assert_eq!(decode_at(60.0), decode_at(90.0));
    assert!(
        decode_at(91.0) > decode_at(90.0),
        "{} vs {}",
        decode_at(91.0),
        decode_at(90.0)
    );
}

#[test]
fn a_constant_first_token_overhead_is_learned_as_overhead_not_bursts() {
    let config = queueing_config();
    let isl = LengthMoments {
        mean: 3000.0,
        second: 1.5 * 3000.0 * 3000.0,
    };
    let service = sizing::prefill_service(&model(), &isl);
    // Two engines 30 % busy with Poisson arrivals; every first token comes a fixed 100 ms
    // after its prefill (a KV transfer and the decode engine's first step).
    let rate = 0.6 / service.mean_s;
    let overhead_s = 0.1;
    let poisson = |engines: u32| {
        let queue = crate::erlang::Queue {
            arrival_rate: rate,
            mean_service_s: service.mean_s,
            service_scv: service.scv,
            arrival_scv: 1.0,
        };
        sizing::prefill_ttft_s(&queue, 1.0, None, engines)
    };
    // One engine would meet the target with that overhead; burstiness that explained the same
    // TTFT on two engines would not (its batch wait doubles on one).
    assert!(poisson(1) + overhead_s < 0.45, "{}", poisson(1));
    // (Two decode steps of 50 ms: the first token's step and the one under way.)
    let calm = Observation {
        ttft_ms: (poisson(2) + overhead_s) * 1000.0,
        itl_ms: 50.0,
        ..seen(rate * 60.0, 0.0, 2.0)
    };
    let mut planner = SlaPlanner::new(&config);
    let mut plan = None;
    for _ in 0..12 {
        plan = tick(&mut planner, &config, calm, (2, 2)).queueing().cloned();
    }
    let plan = plan.unwrap();
    // The TTFT beyond the model with Poisson arrivals is the overhead, not a burst: one
    // engine is enough.
    assert_eq!(plan.prefill_sizing.replicas, 1, "{plan:?}");
    assert_eq!(plan.burstiness, sizing::MIN_BURSTINESS, "{plan:?}");
    let predicted = plan.prefill_sizing.ttft_ms / 1000.0;
    assert!(
        (predicted - (poisson(1) + overhead_s)).abs() < 0.01,
        "{predicted} {}",
        poisson(1)
    );
    // An excess that swings from interval to interval (10 to 110 ms) is burst wait, however
    // calm: no overhead, and the bursts are planned for.
    let mut planner = SlaPlanner::new(&config);
    let mut plan = None;
    for i in 0..12 {
        let swinging = Observation {
            ttft_ms: (poisson(2) + if i % 2 == 0 { 0.01 } else { 0.11 }) * 1000.0,
            ..calm
        };
        plan = tick(&mut planner, &config, swinging, (2, 2)).queueing().cloned();
    }
    let plan = plan.unwrap();
    assert_eq!(plan.overhead_ms, 0.0, "{plan:?}");
    assert!(plan.burstiness > 2.0, "{plan:?}");
}

#[test]
fn a_decode_cache_that_filled_teaches_no_prefill_burstiness() {
    let config = queueing_config();
    // Four engines serve a steady load, then one interval's first tokens come slowly.
    let burst_after = |peak: Option<f64>| {
        let mut planner = SlaPlanner::new(&config);
        for _ in 0..4 {
            tick(&mut planner, &config, seen(600.0, 0.0, 4.0), (4, 4));
        }
        let before = tick(&mut planner, &config, seen(600.0, 0.0, 4.0), (4, 4))
            .queueing()
            .cloned()
            .unwrap()
            .burstiness;
        let slow = Observation {
            ttft_ms: 1500.0,
            decode_kv_usage: Some(0.5),
            decode_kv_usage_peak: peak,
            ..seen(600.0, 0.0, 4.0)
        };
        let after = tick(&mut planner, &config, slow, (4, 4))
            .queueing()
            .cloned()
            .unwrap()
            .burstiness;
        (before, after)
    };
    // With room in the cache throughout, the wait was the prefill queue's: bursts.
    let (before, roomy) = burst_after(Some(0.8));
    assert!(roomy > before, "{roomy} vs {before}");
    assert_eq!(burst_after(None).1, roomy, "no peak read: the mean alone decides");
    // The cache filled at some point (its mean is low): first tokens also waited for room.
    let (before, full) = burst_after(Some(1.0));
    assert_eq!(full, before);
}

#[test]
fn a_surge_the_pool_can_absorb_does_not_scale() {
    let config = queueing_config();
    let mut planner = SlaPlanner::new(&config);
    for _ in 0..8 {
        tick(&mut planner, &config, seen(600.0, 0.0, 8.0), (8, 8));
    }
    // Twice the planned rate, but eight engines serve it well within the target.
    let calm = FastSignals {
        elapsed_s: 10.0,
        window_s: 10.0,
        arrivals: Some(200.0),
        completions: 200.0,
        inflight: Some(20.0),
        queued: Some(1.0),
        prefill_engines: 8.0,
        decode_engines: None,
        isl: 3000.0,
        isl_second_moment: None,
        osl: 300.0,
        osl_second_moment: None,
    };
    for i in 0..3 {
        let signals = FastSignals {
            elapsed_s: 10.0 + 10.0 * f64::from(i),
            ..calm
        };
        assert!(planner.fast_check(&config, &model(), &signals, (8, 8)).is_none());
    }
}

#[test]
fn fast_check_scales_up_on_overload_never_down() {
    let upstream = config(PredictorKind::Constant);
    let config = queueing_config();
    let mut planner = SlaPlanner::new(&config);
    tick(&mut planner, &config, seen(600.0, 0.0, 2.0), (2, 2));
    let calm = FastSignals {
        elapsed_s: 10.0,
        window_s: 10.0,
        arrivals: Some(100.0),
        completions: 100.0,
        inflight: Some(20.0),
        queued: Some(1.0),
        prefill_engines: 2.0,
        decode_engines: None,
        isl: 3000.0,
        isl_second_moment: None,
        osl: 300.0,
        osl_second_moment: None,
    };
    assert!(planner.fast_check(&config, &model(), &calm, (2, 2)).is_none());
    // Lighter than planned: still nothing (never down).
    let light = FastSignals {
        arrivals: Some(10.0),
        ..calm
    };
    assert!(planner.fast_check(&config, &model(), &light, (2, 2)).is_none());
    // Four times the arrivals and a queue building: up at once, with the reason.
    let mut up = None;
    for i in 0..3 {
        let surge = FastSignals {
            elapsed_s: 20.0 + 10.0 * f64::from(i),
            arrivals: Some(2000.0),
            queued: Some(3000.0),
            ..calm
        };
        up = up.or(planner.fast_check(&config, &model(), &surge, (2, 2)));
    }
    let up = up.unwrap();
    let (p, d) = up.target().unwrap();
    assert!(p > 2 && d >= 2, "{p}/{d}");
    let reason = up.queueing().cloned().unwrap().reason;
    assert!(matches!(
        reason,
        ScaleReason::FastPath { .. } | ScaleReason::Surge { .. }
    ));
    // The upstream model has no fast path.
    let mut old = SlaPlanner::new(&upstream);
    assert!(old.fast_check(&upstream, &model(), &calm, (2, 2)).is_none());
}

#[test]
fn percentile_targets_need_at_least_the_mean_targets_replicas() {
    let config = queueing_config();
    let mut p95 = queueing_config();
    p95.queueing.ttft_percentile = Some(95.0);
    let mean = tick(
        &mut SlaPlanner::new(&config),
        &config,
        seen(9000.0, 0.0, 1.0),
        (1, 1),
    );
    let tail = tick(&mut SlaPlanner::new(&p95), &p95, seen(9000.0, 0.0, 1.0), (1, 1));
    assert!(tail.target().unwrap().0 >= mean.target().unwrap().0);
}

#[test]
fn queueing_state_survives_serialization() {
    let config = queueing_config();
    let mut planner = SlaPlanner::new(&config);
    for i in 0..10 {
        tick(
            &mut planner,
            &config,
            seen(600.0 + 50.0 * f64::from(i), 0.0, 1.0),
            (1, 1),
        );
    }
    let restored: SlaPlanner = serde_json::from_str(&serde_json::to_string(&planner).unwrap()).unwrap();
    let (mut a, mut b) = (planner, restored);
    let x = tick(&mut a, &config, seen(1200.0, 0.0, 1.0), (1, 1));
    let y = tick(&mut b, &config, seen(1200.0, 0.0, 1.0), (1, 1));
    assert_eq!(x.target(), y.target());
    assert_eq!(
        x.queueing().map(|q| q.planned_rate),
        y.queueing().map(|q| q.planned_rate)
    );
}

/// A planner warmed on a steady 10 requests/s, with the replicas its ticks asked for.
fn steady(settings: QueueingConfig) -> (SlaPlanner, SlaPlannerConfig, (u32, u32)) {
    let config = SlaPlannerConfig {
        queueing: settings,
        ..queueing_config()
    };
    let mut planner = SlaPlanner::new(&config);
    let replicas = ticks_at(&mut planner, &config, 600.0, (1, 1), 8);
    (planner, config, replicas)
}

/// `ticks` intervals of `arrivals` requests each, served without a backlog by the replicas
/// the ticks ask for.
fn ticks_at(
    planner: &mut SlaPlanner,
    config: &SlaPlannerConfig,
    arrivals: f64,
    mut replicas: (u32, u32),
    ticks: usize,
) -> (u32, u32) {
    for _ in 0..ticks {
        let observed = seen(arrivals, 0.0, f64::from(replicas.0));
        replicas = tick(planner, config, observed, replicas)
            .target()
            .unwrap_or(replicas);
    }
    replicas
}

fn window(elapsed_s: f64, arrivals: f64, engines: u32) -> FastSignals {
    FastSignals {
        elapsed_s,
        window_s: 10.0,
        arrivals: Some(arrivals),
        completions: arrivals,
        inflight: Some(20.0),
        queued: Some(0.0),
        prefill_engines: f64::from(engines),
        decode_engines: None,
        isl: 3000.0,
        isl_second_moment: None,
        osl: 300.0,
        osl_second_moment: None,
    }
}

#[test]
fn a_busy_window_right_after_a_tick_is_judged_with_the_windows_before_it() {
    // Three calm windows at the planned 10 requests/s (or none), then the tick, then one
    // window at 2.5 times the rate.
    let busy_after_tick = |calm_windows: u32| {
        let mut settings = QueueingConfig::default();
        settings.fast_path.rate_samples = 3;
        let (mut planner, config, replicas) = steady(settings);
        for i in 1..=calm_windows {
            let calm = window(10.0 * f64::from(i), 100.0, replicas.0);
            assert!(planner.fast_check(&config, &model(), &calm, replicas).is_none());
        }
        tick(
            &mut planner,
            &config,
            seen(600.0, 0.0, f64::from(replicas.0)),
            replicas,
        );
        let busy = window(10.0, 250.0, replicas.0);
        planner.fast_check(&config, &model(), &busy, replicas)
    };
    // The median of the last three, kept across the tick, is still calm.
    assert!(busy_after_tick(3).is_none());
    // The same window on its own is a surge.
    let up = busy_after_tick(0).expect("a surge");
    assert!(matches!(
        up.queueing().cloned().unwrap().reason,
        ScaleReason::Surge { .. }
    ));
}

#[test]
fn a_surge_is_held_for_its_hold_time_not_the_whole_window() {
    for (hold, kept) in [(60.0, false), (300.0, true)] {
        let mut settings = QueueingConfig::default();
        settings.fast_path.surge_hold_s = hold;
        settings.fast_path.rate_samples = 3;
        settings.stabilisation.quantile = 1.0;
        let (mut planner, config, calm) = steady(settings);
        // A minute of twice the planned rate, all prompts served at once (no backlog).
        let mut up = calm;
        for i in 1..=5 {
            let busy = window(10.0 * f64::from(i), 250.0, up.0);
            if let Some(decision) = planner.fast_check(&config, &model(), &busy, up) {
                assert!(matches!(
                    decision.queueing().unwrap().reason,
                    ScaleReason::Surge { .. }
                ));
                up = decision.target().unwrap();
            }
        }
        assert!(up.0 > calm.0, "{up:?} over {calm:?}");
        // Calm again: the first tick still has the surge's minute in its window; the next
        // one, 60 s after the surge, lets it go unless surges are held for the window.
        let replicas = ticks_at(&mut planner, &config, 600.0, up, 2);
        assert_eq!(
            replicas.0 == up.0,
            kept,
            "hold {hold}: {replicas:?} after {up:?}, calm {calm:?}"
        );
    }
}

#[test]
fn a_backlog_the_engines_clear_within_the_target_puts_nothing_at_risk() {
    // Settled at 50 requests/s.
    let config = queueing_config();
    let mut planner = SlaPlanner::new(&config);
    let replicas = ticks_at(&mut planner, &config, 3000.0, (1, 1), 8);
    // Two engines are asked for and serve, slower than requests arrive: a backlog would
    // never drain.
    let service = sizing::prefill_service(&model(), &LengthMoments::with_scv(3000.0, 0.5)).mean_s;
    assert!(
        replicas.0 > 2 && 50.0 * service > 2.0,
        "{replicas:?}, {service} s"
    );
    let two = (2, replicas.1);
    let with_waiting = |waiting: f64| FastSignals {
        queued: Some(2.0 + waiting),
        prefill_engines: 2.0,
        ..window(10.0, 500.0, 2)
    };
    // Fewer waiting than the engines clear within the 500 ms target: no action.
    let few = (2.0 * 0.5 / service).floor() - 1.0;
    assert!(few >= 1.0);
    let mut unmoved = planner.clone();
    let held = unmoved.fast_check(&config, &model(), &with_waiting(few), two);
    assert!(held.is_none(), "{:?}", held.map(|d| d.explanation()));
    // More than that: at risk, scaled up at once.
    let up = planner.fast_check(&config, &model(), &with_waiting(few + 10.0), two);
    let plan = up.and_then(|d| d.queueing().cloned()).unwrap();
    assert!(
        matches!(plan.reason, ScaleReason::FastPath { .. }),
        "{:?}",
        plan.reason
    );
    assert!(plan.replicas.0 > 2);
}

fn aggregated_config() -> SlaPlannerConfig {
    SlaPlannerConfig {
        aggregated: Some(crate::aggregated::AggregatedEngine::default()),
        limits: Limits {
            max_gpu_budget: Some(12),
            ..queueing_config().limits
        },
        ..queueing_config()
    }
}

#[test]
fn an_aggregated_pool_is_sized_for_both_targets_and_reported_as_both_pools() {
    let config = SlaPlannerConfig {
        limits: queueing_config().limits,
        ..aggregated_config()
    };
    let mut planner = SlaPlanner::new(&config);
    let low = tick(&mut planner, &config, seen(600.0, 0.0, 1.0), (1, 1));
    let plan = low.queueing().cloned().unwrap();
    assert_eq!(plan.replicas.0, plan.replicas.1);
    assert_eq!(plan.prefill_sizing.replicas, plan.decode_sizing.replicas);
    assert!(
        plan.prefill_sizing.ttft_ms <= 500.0 && plan.decode_sizing.itl_ms <= 50.0,
        "{plan:?}"
    );
    // An aggregated engine does both jobs: at least as many as the larger disaggregated pool.
    let mut disaggregated = SlaPlanner::new(&queueing_config());
    let split = tick(
        &mut disaggregated,
        &queueing_config(),
        seen(6000.0, 0.0, 1.0),
        (1, 1),
    );
    let (p, d) = split.target().unwrap();
    let mut planner = SlaPlanner::new(&config);
    let high = tick(&mut planner, &config, seen(6000.0, 0.0, 1.0), (1, 1));
    let (a, b) = high.target().unwrap();
    assert_eq!(a, b);
    assert!(a > plan.replicas.1, "{:?}", high.queueing());
    assert!(a >= p.max(d), "{a} vs {p}/{d}");
    // Its message counts workers, not a prefill and a decode pool.
    let line = high.explanation();
    assert!(
        line.contains(&format!("{a} workers serving prefill and decode")),
        "{line}"
    );
    assert!(!line.contains("decode replicas"), "{line}");
    let split_line = split.explanation();
    assert!(split_line.contains(&format!("{p} prefill (")), "{split_line}");
}

#[test]
fn an_aggregated_pool_is_bounded_by_the_budget_once_and_scales_down_after_the_window() {
    let config = aggregated_config();
    let mut planner = SlaPlanner::new(&config);
    // Far more than 12 engines' worth: the budget counts the pool's GPUs once.
    let busy = tick(&mut planner, &config, seen(60_000.0, 0.0, 1.0), (1, 1));
    let plan = busy.queueing().cloned().unwrap();
    assert_eq!(plan.replicas, (12, 12), "{plan:?}");
    assert!(plan.desired.1 > 12);
    assert!(
        plan.limits
            .iter()
            .any(|l| matches!(l, crate::sla::Limit::GpuBudget { .. }))
    );
    // Quiet again: held by the stabilisation window first, down once it has passed.
    let mut now = (12, 12);
    let mut replicas = Vec::new();
    for _ in 0..15 {
        let d = tick(&mut planner, &config, seen(600.0, 0.0, f64::from(now.0)), now);
        now = d.target().unwrap();
        assert_eq!(now.0, now.1);
        replicas.push(now.1);
    }
    assert_eq!(replicas[0], 12, "{replicas:?}");
    assert!(*replicas.last().unwrap() < 12, "{replicas:?}");
}

#[test]
fn an_aggregated_pool_reads_the_decode_steps_its_prompts_share_as_service_not_bursts() {
    // The same slow first tokens on four engines, read by a disaggregated planner and by an
    // aggregated one whose steps take 60 ms of decode (the interval's ITL): the aggregated
    // planner counts the decode part of each step a prompt spans as its service time, so it
    // learns less burstiness from the same TTFT.
    let learned = |config: &SlaPlannerConfig| {
        let mut planner = SlaPlanner::new(config);
        let mut last = 0.0;
        for _ in 0..5 {
            let slow = Observation {
                ttft_ms: 400.0,
                itl_ms: 60.0,
                ..seen(600.0, 0.0, 4.0)
            };
            last = tick(&mut planner, config, slow, (4, 4))
                .queueing()
                .cloned()
                .unwrap()
                .burstiness;
        }
        last
    };
    let config = queueing_config();
    let split = learned(&config);
    let aggregated = learned(&SlaPlannerConfig {
        aggregated: Some(crate::aggregated::AggregatedEngine::default()),
        ..config
    });
    assert!(split > 1.0, "{split}");
    assert!(aggregated < split, "{aggregated} vs {split}");
}

#[test]
fn an_assumed_delay_does_not_limit_a_pools_growth() {
    // A 10 s interval and the built-in 60 s delay, nothing measured or expected yet: the delay
    // is long against the interval, but only assumed, so the first surge is not held to 1.3
    // times the engines serving.
    let mut config = queueing_config();
    config.interval_s = 10.0;
    config.predictor.interval_seconds = 10.0;
    config.queueing.scale_up_delay_s = 60.0;
    let surge = |assumed: bool| {
        let mut config = config.clone();
        config.queueing.scale_up_delay_assumed = assumed;
        let mut planner = SlaPlanner::new(&config);
        for _ in 0..3 {
            tick(&mut planner, &config, seen(100.0, 0.0, 2.0), (2, 2));
        }
        tick(&mut planner, &config, seen(1000.0, 0.0, 2.0), (2, 2))
            .queueing()
            .cloned()
            .unwrap()
    };
    let known = surge(false);
    assert_eq!(known.replicas.0, 3, "{known:?}");
    let assumed = surge(true);
    assert!(assumed.replicas.0 > 3, "{assumed:?}");
    assert!(
        !assumed
            .limits
            .iter()
            .any(|l| matches!(l, crate::sla::Limit::ScaleUpRate { .. })),
        "{:?}",
        assumed.limits
    );
}

#[test]
fn at_a_long_delay_a_pool_grows_to_a_multiple_of_its_engines_serving() {
    // Replicas serve 300 s after they are asked for: five intervals.
    let mut config = queueing_config();
    config.queueing.scale_up_delay_s = 300.0;
    let factor = config.queueing.scale_up.long_delay_factor;
    assert_eq!(factor, 1.3);
    let mut planner = SlaPlanner::new(&config);
    for _ in 0..3 {
        tick(&mut planner, &config, seen(600.0, 0.0, 2.0), (2, 2));
    }
    // Ten times the arrivals on the 2 prefill engines serving: the load asks for more, the
    // pool is asked for ceil(2 x 1.3) = 3, and the plan says why.
    let surge = tick(&mut planner, &config, seen(6000.0, 0.0, 2.0), (2, 2));
    let plan = surge.queueing().cloned().unwrap();
    assert!(plan.desired.0 > 4, "{plan:?}");
    assert_eq!(plan.replicas.0, 3, "{plan:?}");
    assert!(
        plan.limits.iter().any(|l| matches!(
            l,
            crate::sla::Limit::ScaleUpRate {
                pool: crate::sla::Pool::Prefill,
                allowed: 3,
                ..
            }
        )),
        "{:?}",
        plan.limits
    );
    assert!(
        surge.explanation().contains("held at 3"),
        "{}",
        surge.explanation()
    );
    // Still 2 serving: the asks do not compound while the replicas start.
    let decode = plan.replicas.1;
    let waiting = tick(&mut planner, &config, seen(6000.0, 0.0, 2.0), (3, decode));
    assert_eq!(waiting.target().map(|t| t.0), Some(3));
    // Between intervals too.
    let mut fast = None;
    for i in 0..3 {
        let busy = FastSignals {
            queued: Some(500.0),
            ..window(10.0 + 10.0 * f64::from(i), 1000.0, 2)
        };
        fast = fast.or(planner.fast_check(&config, &model(), &busy, (3, decode)));
    }
    assert!(fast.and_then(|f| f.target()).is_none_or(|t| t.0 == 3));
    // Once they serve, the next step: ceil(3 x 1.3) = 4.
    let served = tick(&mut planner, &config, seen(6000.0, 0.0, 3.0), (3, decode));
    assert_eq!(served.target().map(|t| t.0), Some(4));

    // At a 60 s delay, or without the limit, the same surge is asked for at once.
    for config in [
        queueing_config(),
        SlaPlannerConfig {
            queueing: QueueingConfig {
                scale_up: ScaleUp {
                    long_delay_factor: 1.0,
                },
                ..config.queueing.clone()
            },
            ..config.clone()
        },
    ] {
        let mut planner = SlaPlanner::new(&config);
        for _ in 0..3 {
            tick(&mut planner, &config, seen(600.0, 0.0, 2.0), (2, 2));
        }
        let surge = tick(&mut planner, &config, seen(6000.0, 0.0, 2.0), (2, 2));
        let plan = surge.queueing().cloned().unwrap();
        assert_eq!(plan.replicas.0, plan.desired.0, "{plan:?}");
    }
}

#[test]
fn before_the_first_interval_the_fast_path_grows_decode_from_its_engines_serving() {
    // A planner that has not yet decided an interval, replicas serving 300 s after they are
    // asked for, and a surge on 2 prefill engines and 1 decode engine from the first check.
    let mut config = queueing_config();
    config.queueing.scale_up_delay_s = 300.0;
    let surge = |decode_engines| {
        let mut planner = SlaPlanner::new(&config);
        let mut fast = None;
        for i in 0..3 {
            let busy = FastSignals {
                decode_engines,
                ..window(10.0 + 10.0 * f64::from(i), 1000.0, 2)
            };
            fast = fast.or(planner.fast_check(&config, &model(), &busy, (2, 1)));
        }
        fast.and_then(|f| f.queueing().cloned()).unwrap()
    };
    // Decode is asked for at most ceil(1 x 1.3) = 2, as at an interval tick, and the plan says
    // why.
    let plan = surge(Some(1.0));
    assert!(plan.desired.1 > 2, "{plan:?}");
    assert_eq!(plan.replicas.1, 2, "{plan:?}");
    assert!(
        plan.limits.iter().any(|l| matches!(
            l,
            crate::sla::Limit::ScaleUpRate {
                pool: crate::sla::Pool::Decode,
                allowed: 2,
                ..
            }
        )),
        "{:?}",
        plan.limits
    );
    // Without a decode count (and no interval's to stand in), decode is not limited.
    let unknown = surge(None);
    assert_eq!(unknown.replicas.1, unknown.desired.1, "{unknown:?}");
}

#[test]
fn the_scale_up_limit_never_takes_replicas_away_and_lets_an_idle_pool_start() {
    let limit = ScaleUp::default();
    assert_eq!(limit.limit(10.0, 4), Some(13));
    // Never fewer than asked for.
    assert_eq!(limit.limit(2.0, 8), Some(8));
    // A pool with nothing serving may still ask for one.
    assert_eq!(limit.limit(0.0, 0), Some(1));
    // Unknown engines, or a factor of 1 or less: no limit.
    assert_eq!(limit.limit(f64::NAN, 4), None);
    assert_eq!(
        ScaleUp {
            long_delay_factor: 1.0
        }
        .limit(10.0, 4),
        None
    );
}
