//! Hand-computable simulations on the flat curves of [`super::scenario`]: constant load, a
//! step, an empty trace, a trace with gaps, the scale-up delay and overload recovery.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::float_cmp)]

use super::{
    compare,
    latency::LatencyModel,
    observe::OBSERVED_TTFT_QUANTILE,
    policy::{Fixed, LoopPolicy, PolicySpec},
    run::{Periodic, Policy, RunResult, SimConfig, View, run},
    scenario::{self, Flat, constant, flat_model, overload_recovery},
};
use planner_core::{
    predictor::PredictorKind,
    sla::Observation,
    state::{QueueingConfig, SlaModel},
};

fn model() -> LatencyModel<'static, Flat> {
    flat_model()
}

fn config() -> SimConfig {
    SimConfig::default()
}

fn by_name<'a>(results: &'a [RunResult], name: &str) -> &'a RunResult {
    results.iter().find(|r| r.policy == name).unwrap()
}

fn specs() -> Vec<PolicySpec> {
    vec![
        PolicySpec::Oracle,
        PolicySpec::PerfectPrediction,
        PolicySpec::Sla {
            model: SlaModel::Upstream,
            predictor: PredictorKind::Constant,
            correction: true,
            headroom: false,
        },
        PolicySpec::Sla {
            model: SlaModel::Upstream,
            predictor: PredictorKind::Kalman,
            correction: false,
            headroom: false,
        },
        PolicySpec::Sla {
            model: SlaModel::Queueing,
            predictor: PredictorKind::Constant,
            correction: true,
            headroom: false,
        },
        PolicySpec::LoadBased,
        PolicySpec::Hpa,
        PolicySpec::FixedPeak,
    ]
}

/// Records what the planner would read from Prometheus every interval, and never scales.
struct Spy(Vec<Observation>, Periodic);

impl Spy {
    fn new() -> Self {
        Self(Vec::new(), Periodic::every(config().interval_s))
    }
}

impl<C> Policy<C> for Spy {
    fn name(&self) -> String {
        "spy".into()
    }
    fn next_wake_s(&self) -> f64 {
        self.1.next_s()
    }
    fn wake(&mut self, view: &mut View<'_, C>) -> Option<(u32, u32)> {
        self.1.woke(view.now_s);
        self.0
            .push(view.frontend.take_interval(view.gauges, OBSERVED_TTFT_QUANTILE));
        None
    }
}

#[test]
fn constant_load_every_policy_holds_one_replica_each_and_meets_the_sla() {
    // 2 requests/s for 10 minutes: one prefill engine is 20 % busy, no request waits.
    let requests = constant(2.0, 0.0, 600.0);
    let results = compare(&requests, &model(), &config(), &specs(), 2);
    assert_eq!(results.len(), 8);
    for r in &results {
        let s = &r.summary;
        assert_eq!(r.initial, (1, 1), "{}", r.policy);
        assert_eq!(s.scaling_actions, 0, "{}", r.policy);
        assert_eq!((s.max_prefill, s.max_decode), (1, 1), "{}", r.policy);
        // Two GPUs for ten minutes.
        assert!(
            (s.gpu_hours - 2.0 * 600.0 / 3600.0).abs() < 1e-9,
            "{}: {}",
            r.policy,
            s.gpu_hours
        );
        assert_eq!((s.intervals, s.intervals_meeting), (10, 10), "{}", r.policy);
        assert_eq!(s.requests, 1200);
        assert_eq!(s.requests_meeting_both, 1200, "{}", r.policy);
        assert!((s.mean_ttft_ms - 100.0).abs() < 1e-6, "{}", s.mean_ttft_ms);
        assert!((s.mean_itl_ms - 10.0).abs() < 1e-6);
    }
    // Every interval's cohort: 120 arrivals, TTFT 100 ms, ITL 10 ms.
    let oracle = by_name(&results, "oracle");
    for i in &oracle.intervals {
        assert_eq!(i.arrivals, 120);
        assert!((i.ttft_ms - 100.0).abs() < 1e-6 && (i.itl_ms - 10.0).abs() < 1e-6);
        assert_eq!((i.prefill, i.decode, i.gpus), (1.0, 1.0, 2.0));
    }
}

#[test]
fn constant_load_the_planner_reads_the_frontend_means() {
    let requests = constant(2.0, 0.0, 600.0);
    let mut spy = Spy::new();
    run(&requests, &model(), &config(), &mut spy, Some((1, 1)));
    assert_eq!(spy.0.len(), 10);
    // Second interval: a request completes 200 ms after it arrives, so 120 complete in each
    // full interval; means are exact.
    let o = spy.0[1];
    assert_eq!(o.num_req, 120.0);
    assert_eq!((o.isl, o.osl), (1000.0, 11.0));
    assert!((o.ttft_ms - 100.0).abs() < 1e-9);
    assert!((o.itl_ms - 10.0).abs() < 1e-9);
    assert!((o.request_duration_s - 0.2).abs() < 1e-9);
}

#[test]
fn a_step_up_shows_as_ttft_growth_and_the_oracle_sizes_for_it() {
    // 2 requests/s for 5 minutes, then 25/s (one every 40 ms) for 5 minutes.
    let mut requests = constant(2.0, 0.0, 300.0);
    requests.extend(constant(25.0, 300.0, 600.0));
    let config = config();

    // One prefill engine serves 10/s: after the step the i-th request starts at 300 + 0.1 i
    // and arrived at 300 + 0.04 i, so its TTFT is 0.1 + 0.06 i s. The first post-step
    // interval holds i = 0..1500: mean 0.1 + 0.06 * 749.5 = 45.07 s; the next 135.07 s.
    let mut fixed = Fixed {
        replicas: (1, 1),
        name: "one-each".into(),
    };
    let small = run(&requests, &model(), &config, &mut fixed, None);
    assert!((small.intervals[4].ttft_ms - 100.0).abs() < 1e-6);
    assert!(
        (small.intervals[5].ttft_ms - 45_070.0).abs() < 1.0,
        "{}",
        small.intervals[5].ttft_ms
    );
    assert!(
        (small.intervals[6].ttft_ms - 135_070.0).abs() < 1.0,
        "{}",
        small.intervals[6].ttft_ms
    );
    assert_eq!(small.summary.intervals_meeting, 5);
    assert_eq!(
        small.summary.requests_unfinished, 0,
        "drained after the last interval"
    );

    let results = compare(&requests, &model(), &config, &specs(), 2);
    // The oracle: one prefill engine before the step, three after (three engines take every
    // third request, 120 ms apart: no queueing; two would fall behind by 5 requests/s).
    let oracle = by_name(&results, "oracle");
    let prefill: Vec<f64> = oracle.intervals.iter().map(|i| i.prefill).collect();
    assert_eq!(prefill, vec![1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0, 3.0]);
    assert!(oracle.intervals.iter().all(|i| i.decode == 1.0));
    assert_eq!(oracle.summary.interval_attainment(), 1.0);
    assert_eq!(oracle.summary.request_attainment(), 1.0);
    // (5 intervals * 2 GPUs + 5 * 4) * 60 s.
    assert!((oracle.summary.gpu_hours - 0.5).abs() < 1e-9);

    // Sized for the peak: 3 + 1 replicas all along, every request on time.
    let fixed = by_name(&results, "fixed-peak");
    assert!((fixed.summary.gpu_hours - 4.0 * 600.0 / 3600.0).abs() < 1e-9);
    assert_eq!(fixed.summary.request_attainment(), 1.0);

    // Perfect prediction asks for ceil(25 * 1000 / 10000) = 3 prefill replicas at t=300, but
    // they serve only from t=360: the first post-step interval misses its TTFT target.
    let perfect = by_name(&results, "perfect-prediction");
    assert_eq!(perfect.decisions.first(), Some(&(300.0, (3, 1))));
    assert_eq!(perfect.intervals[5].prefill, 3.0);
    assert_eq!(perfect.intervals[5].prefill_serving, 1.0);
    assert_eq!(perfect.intervals[6].prefill_serving, 3.0);
    assert!(perfect.intervals[5].ttft_ms > 500.0);
    assert!(perfect.summary.interval_attainment() < 1.0);

    // The SLA planner counts *completed* requests (Dynamo increments requests_total when a
    // request ends), so an overloaded prefill pool reports its own throughput, 598 requests in
    // the first post-step interval, not the demand: 598 * 1000 / 60 / 10000 < 1 replica. It
    // never scales up, and every post-step interval misses the SLA.
    let sla = by_name(&results, "upstream-constant");
    assert_eq!(sla.summary.scaling_actions, 0);
    assert_eq!(sla.summary.intervals_meeting, 5);
}

#[test]
fn an_empty_trace_costs_nothing_and_breaks_nothing() {
    let results = compare(&[], &model(), &config(), &PolicySpec::standard(), 2);
    assert_eq!(results.len(), 21);
    for r in &results {
        assert!(r.intervals.is_empty());
        assert_eq!(r.summary.gpu_hours, 0.0);
        assert_eq!(r.summary.requests, 0);
        assert_eq!(r.summary.interval_attainment(), 1.0);
        assert_eq!(r.summary.request_attainment(), 1.0);
        assert!(r.summary.mean_ttft_ms.is_nan());
    }
}

#[test]
fn a_trace_with_gaps_holds_replicas_through_them() {
    // Traffic in [0, 120) and [300, 420); nothing in between.
    let mut requests = constant(2.0, 0.0, 120.0);
    requests.extend(constant(2.0, 300.0, 420.0));
    let mut spy = Spy::new();
    run(&requests, &model(), &config(), &mut spy, Some((1, 1)));
    // The idle intervals (ending at 180, 240 and 300) see no completed request: NaN means,
    // which the SLA planner skips.
    for o in &spy.0[2..5] {
        assert_eq!(o.num_req, 0.0);
        assert!(!o.is_complete());
    }
    let results = compare(&requests, &model(), &config(), &specs(), 2);
    for r in &results {
        let s = &r.summary;
        // 7 intervals, 4 of them with traffic; 2 GPUs for 420 s.
        assert_eq!(r.intervals.len(), 7, "{}", r.policy);
        assert_eq!((s.intervals, s.intervals_meeting), (4, 4), "{}", r.policy);
        assert!(
            (s.gpu_hours - 2.0 * 420.0 / 3600.0).abs() < 1e-9,
            "{} {} {:?}",
            r.policy,
            s.gpu_hours,
            r.decisions
        );
        assert_eq!(s.scaling_actions, 0, "{}", r.policy);
        assert!(r.intervals[3].ttft_ms.is_nan());
    }
}

/// Asks for a number of prefill replicas every interval.
struct Ask(u32, Periodic);

impl Ask {
    fn prefill(replicas: u32) -> Self {
        Self(replicas, Periodic::every(config().interval_s))
    }
}

impl<C> Policy<C> for Ask {
    fn name(&self) -> String {
        "ask".into()
    }
    fn next_wake_s(&self) -> f64 {
        self.1.next_s()
    }
    fn wake(&mut self, view: &mut View<'_, C>) -> Option<(u32, u32)> {
        self.1.woke(view.now_s);
        Some((self.0, view.asked.1))
    }
}

#[test]
fn scale_up_costs_from_the_request_and_serves_after_the_delay() {
    let requests = constant(1.0, 0.0, 300.0);
    let config = SimConfig {
        scale_up_delay_s: 90.0,
        ..config()
    };
    let result = run(&requests, &model(), &config, &mut Ask::prefill(2), Some((1, 1)));
    let gpus: Vec<f64> = result.intervals.iter().map(|i| i.gpus).collect();
    assert_eq!(gpus, vec![2.0, 3.0, 3.0, 3.0, 3.0]);
    // Asked for at t=60, serving from t=150: half of the third interval.
    let serving: Vec<f64> = result.intervals.iter().map(|i| i.prefill_serving).collect();
    assert_eq!(serving, vec![1.0, 1.0, 1.5, 2.0, 2.0]);
    assert_eq!(result.summary.scaling_actions, 1);
    // Scale-down is immediate, for the bill and the serving engines alike.
    let down = run(&requests, &model(), &config, &mut Ask::prefill(1), Some((3, 1)));
    let gpus: Vec<f64> = down.intervals.iter().map(|i| i.gpus).collect();
    assert_eq!(gpus, vec![4.0, 2.0, 2.0, 2.0, 2.0]);
    assert_eq!(down.intervals[1].prefill_serving, 1.0);
}

fn queueing_policy(config: &SimConfig) -> LoopPolicy {
    scenario::queueing_policy(config, &config.queueing)
}

#[test]
fn overload_recovery_scales_out_fast_and_never_down_with_a_backlog() {
    // The scenario's own checks: scaled out within two intervals of a step to four times the
    // pool, TTFT back under the target by the third interval, no scale-down with a backlog.
    assert_eq!(overload_recovery(&QueueingConfig::default()), Ok(()));
    // The check can fail: a planner that waits for the whole window before acting on a surge
    // and holds nothing does not recover in time.
    let mut slow = QueueingConfig::default();
    slow.fast_path.period_s = f64::INFINITY;
    assert!(overload_recovery(&slow).is_err());
}

#[test]
fn the_sla_policy_plans_with_the_scale_up_delay_it_measures() {
    // A step the pool cannot serve: the planner scales out, and the replicas it asked for serve
    // 180 s later; it measures that, as the operator does on a cluster, instead of being told.
    let mut requests = constant(2.0, 0.0, 300.0);
    requests.extend(constant(25.0, 300.0, 900.0));
    let config = SimConfig {
        scale_up_delay_s: 180.0,
        ..config()
    };
    let mut policy = queueing_policy(&config);
    assert_eq!(policy.measured_delay(), None);
    let result = run(&requests, &model(), &config, &mut policy, Some((1, 1)));
    assert!(result.summary.max_prefill >= 2, "{:?}", result.decisions);
    assert_eq!(
        policy.measured_delay(),
        Some(std::time::Duration::from_secs(180)),
        "{:?}",
        result.decisions
    );
    // Replicas that serve at once are measured as such.
    let at_once = SimConfig {
        scale_up_delay_s: 0.0,
        ..config.clone()
    };
    let mut policy = queueing_policy(&at_once);
    run(&requests, &model(), &at_once, &mut policy, Some((1, 1)));
    assert_eq!(policy.measured_delay(), Some(std::time::Duration::ZERO));
}

#[test]
fn the_sla_policy_plans_with_the_expected_delay_until_it_measures_one() {
    let mut requests = constant(2.0, 0.0, 300.0);
    requests.extend(constant(25.0, 300.0, 900.0));
    let config = SimConfig {
        scale_up_delay_s: 180.0,
        expected_scale_up_delay_s: Some(300.0),
        ..config()
    };
    let mut policy = queueing_policy(&config);
    let planned = |policy: &LoopPolicy| policy.policy_loop().planned_delay().delay.as_secs_f64();
    assert_eq!(planned(&policy), 300.0);
    run(&requests, &model(), &config, &mut policy, Some((1, 1)));
    assert_eq!(policy.measured_delay(), Some(std::time::Duration::from_secs(180)));
    assert_eq!(planned(&policy), 180.0);
    assert_eq!(policy.config().unwrap().queueing.scale_up_delay_s, 180.0);
    // Without an expectation, the default until the first measurement.
    let policy = queueing_policy(&SimConfig {
        expected_scale_up_delay_s: None,
        ..config
    });
    assert_eq!(planned(&policy), 60.0);
}

#[test]
fn queueing_planner_counts_arrivals_not_completions() {
    // The step of `a_step_up_shows_as_ttft_growth_and_the_oracle_sizes_for_it`: upstream's formulas stay put (they count
    // completions, capped by capacity); the queueing model sees the arrivals and scales.
    let mut requests = constant(2.0, 0.0, 300.0);
    requests.extend(constant(25.0, 300.0, 600.0));
    let config = config();
    let result = run(
        &requests,
        &model(),
        &config,
        &mut queueing_policy(&config),
        Some((1, 1)),
    );
    assert!(result.summary.max_prefill >= 3, "{:?}", result.decisions);
    // Within two intervals the cohort TTFT is back under the target.
    assert!(
        result.intervals[7].ttft_ms <= config.sla.ttft_ms,
        "{:?}",
        result.intervals[7]
    );
}

#[test]
fn observations_carry_arrivals_gauges_and_moments() {
    let mut requests = constant(2.0, 0.0, 120.0);
    requests.extend(constant(30.0, 120.0, 180.0));
    let mut spy = Spy::new();
    run(&requests, &model(), &config(), &mut spy, Some((1, 1)));
    let first = &spy.0[0];
    assert_eq!(first.arrivals, Some(120.0));
    assert_eq!(first.queued, Some(0.0));
    assert_eq!(first.prefill_engines, Some(1.0));
    // Every prompt is 1000 tokens, in the frontend's (870, 1800] bucket: the second moment is
    // read from the buckets, at least the squared mean and at most the bucket's bound squared.
    assert!(
        first
            .isl_second_moment
            .is_some_and(|m| (1e6 - 1.0..=1800.0 * 1800.0).contains(&m)),
        "{first:?}"
    );
    // Every TTFT is 100 ms: histogram_quantile interpolates within the bucket holding it.
    assert!(
        first
            .ttft_quantile_ms
            .is_some_and(|(q, ms)| q == 0.9 && ms > 50.0 && ms <= 250.0)
    );
    // Overloaded (30 requests/s on one engine serving 10): arrivals exceed completions and a
    // queue builds; the inflight gauge says so too.
    let overloaded = &spy.0[2];
    assert_eq!(overloaded.arrivals, Some(1800.0));
    assert!(overloaded.num_req < 700.0);
    assert!(overloaded.queued.is_some_and(|q| q > 1000.0));
    assert!(
        overloaded
            .inflight
            .is_some_and(|i| i >= overloaded.queued.unwrap_or(0.0))
    );
}

/// Two graphs whose bursts come one after the other: 2 requests/s each, and 60/s for ten minutes
/// (six prefill engines' worth), the first from minute 10, the second from minute 25.
fn alternating_bursts() -> Vec<super::budget::Graph> {
    let burst = |from: f64| {
        let mut requests = constant(2.0, 0.0, from);
        requests.extend(constant(60.0, from, from + 600.0));
        requests.extend(constant(2.0, from + 600.0, 2400.0));
        requests
    };
    ["first", "second"]
        .into_iter()
        .zip([600.0, 1500.0])
        .map(|(name, from)| super::budget::Graph {
            name: name.into(),
            requests: burst(from),
            sla: config().sla,
            priority: 0,
            weight: 1.0,
            aggregated: false,
        })
        .collect()
}

fn queueing_constant() -> PolicySpec {
    PolicySpec::Sla {
        model: SlaModel::Queueing,
        predictor: PredictorKind::Constant,
        correction: true,
        headroom: false,
    }
}

#[test]
fn a_shared_budget_lends_one_graphs_idle_gpus_to_the_others_burst_and_never_exceeds_its_total() {
    use super::budget::{Split, run_split};
    let graphs = alternating_bursts();
    let config = config();
    // 12 GPUs: a burst needs about 8 prefill engines and a decode engine, more than half.
    let shared = run_split(
        &graphs,
        &model(),
        &config,
        queueing_constant(),
        &Split::Shared(12),
        "shared",
    )
    .unwrap();
    let split = run_split(
        &graphs,
        &model(),
        &config,
        queueing_constant(),
        &Split::Static(vec![6, 6]),
        "static",
    )
    .unwrap();
    let alone = run_split(
        &graphs,
        &model(),
        &config,
        queueing_constant(),
        &Split::Unlimited,
        "alone",
    )
    .unwrap();
    assert!(
        alone.peak_gpus > 12,
        "no contention to arbitrate: {} GPUs",
        alone.peak_gpus
    );
    assert_eq!(shared.steps_over, 0);
    assert!(shared.peak_gpus <= 12, "{}", shared.peak_gpus);
    assert!(shared.cuts > 0, "the burst was never cut");
    // Each graph's burst gets the other's idle GPUs: more intervals meet the SLA than with the
    // same GPUs split evenly.
    let (n, shared_ok) = shared.intervals();
    let (_, split_ok) = split.intervals();
    assert_eq!(n, 80);
    assert!(
        shared_ok > split_ok,
        "shared {shared_ok} of {n}, static {split_ok} of {n}"
    );
    // Both graphs gain.
    for (s, t) in shared.graphs.iter().zip(&split.graphs) {
        assert!(s.summary.intervals_meeting >= t.summary.intervals_meeting);
        assert!(
            s.summary.max_prefill > 5,
            "the burst was held to the static share"
        );
    }
}

#[test]
fn a_higher_priority_graph_takes_the_budget_first_and_the_other_keeps_its_floor() {
    use super::budget::{Split, run_split};
    let mut graphs = alternating_bursts();
    // Both burst at once; the second has priority.
    graphs[1].requests = graphs[0].requests.clone();
    graphs[1].priority = 1;
    let run = run_split(
        &graphs,
        &model(),
        &config(),
        queueing_constant(),
        &Split::Shared(12),
        "p",
    )
    .unwrap();
    assert_eq!(run.steps_over, 0);
    let (low, high) = (&run.graphs[0], &run.graphs[1]);
    assert!(
        high.summary.intervals_meeting > low.summary.intervals_meeting,
        "high {:?} low {:?}",
        (
            high.summary.intervals_meeting,
            high.summary.max_prefill,
            &high.decisions
        ),
        (
            low.summary.intervals_meeting,
            low.summary.max_prefill,
            &low.decisions
        )
    );
    // The lower priority never went below its floor, and was held near it during the burst.
    assert!(low.intervals.iter().all(|i| i.prefill >= 1.0 && i.decode >= 1.0));
    // While the higher priority bursts, the other is held at its floor; it gets its GPUs back
    // (and serves its own backlog) when the burst ends.
    for i in 11..14 {
        assert_eq!(
            (low.intervals[i].prefill, high.intervals[i].prefill),
            (1.0, 9.0),
            "minute {i}"
        );
    }
    assert!(low.summary.max_prefill > 1);
}

#[test]
fn an_aggregated_graph_shares_a_budget_with_its_one_pool_counted_once() {
    use super::budget::{Split, run_split};
    // The first burst is an aggregated graph's: one pool, each engine one GPU (the decode
    // engine's), counted once; the second a disaggregated graph's.
    let mut graphs = alternating_bursts();
    graphs[0].aggregated = true;
    let shared = run_split(
        &graphs,
        &model(),
        &config(),
        queueing_constant(),
        &Split::Shared(12),
        "shared",
    )
    .unwrap();
    let alone = run_split(
        &graphs,
        &model(),
        &config(),
        queueing_constant(),
        &Split::Unlimited,
        "alone",
    )
    .unwrap();
    assert!(alone.peak_gpus > 12, "no contention: {} GPUs", alone.peak_gpus);
    assert_eq!(shared.steps_over, 0);
    assert!(shared.peak_gpus <= 12, "{}", shared.peak_gpus);
    assert!(shared.cuts > 0, "never cut");
    let (aggregated, disaggregated) = (&shared.graphs[0], &shared.graphs[1]);
    for i in &aggregated.intervals {
        assert_eq!((i.prefill, i.gpus), (i.decode, i.decode), "at {}", i.start_s);
    }
    for i in &disaggregated.intervals {
        assert!((i.gpus - (i.prefill + i.decode)).abs() < 1e-9, "at {}", i.start_s);
    }
    // Each burst takes more than half the budget: the other graph's idle GPUs.
    assert!(aggregated.summary.max_decode > 6, "{:?}", aggregated.summary);
    assert!(
        disaggregated.summary.max_prefill + disaggregated.summary.max_decode > 6,
        "{:?}",
        disaggregated.summary
    );
}

#[test]
fn proportional_shares_are_whole_engines_and_fit_the_total() {
    let shares = super::budget::proportional_shares(112, &[30.0, 20.0, 50.0], 4, 8);
    assert_eq!(shares, [32, 20, 56]);
    assert!(shares.iter().sum::<u32>() <= 112);
    assert_eq!(super::budget::proportional_shares(16, &[0.0, 1.0], 4, 8), [8, 16]);
}

#[test]
fn an_aggregated_run_plans_one_pool_and_charges_it_once() {
    let config = SimConfig {
        aggregated: Some(planner_core::aggregated::AggregatedEngine::default()),
        ..config()
    };
    // A step from 2 to 25 requests/s: one pool grows, every policy keeps both pools equal.
    let mut requests = constant(2.0, 0.0, 600.0);
    requests.extend(constant(25.0, 600.0, 1200.0));
    let specs = [
        PolicySpec::Oracle,
        PolicySpec::Sla {
            model: SlaModel::Queueing,
            predictor: PredictorKind::Constant,
            correction: true,
            headroom: false,
        },
        PolicySpec::LoadBased,
        PolicySpec::Hpa,
        PolicySpec::FixedPeak,
    ];
    let results = compare(&requests, &model(), &config, &specs, 2);
    for r in &results {
        assert_eq!(r.summary.max_prefill, r.summary.max_decode, "{}", r.policy);
        for i in &r.intervals {
            assert_eq!(i.prefill, i.decode, "{} at {}", r.policy, i.start_s);
            // One GPU per decode engine, none for the prefill "pool" (the same engines).
            assert_eq!(i.gpus, i.decode, "{} at {}", r.policy, i.start_s);
        }
    }
    let sla = by_name(&results, "sla-constant");
    let oracle = by_name(&results, "oracle");
    assert!(oracle.summary.max_decode > 1);
    assert!(
        sla.summary.max_decode >= oracle.summary.max_decode,
        "{:?}",
        sla.summary
    );
    assert!(sla.summary.interval_attainment() >= 0.8, "{:?}", sla.summary);
}
