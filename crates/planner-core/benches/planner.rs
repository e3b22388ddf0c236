//! Planner-core benchmarks: profile load and interpolator build, a 10,000-case `plan` run, and
//! one full SLA planner interval per predictor on 480 intervals of history.
//!
//! `cargo bench -p planner-operator --bench planner`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // benchmark code

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use planner_core::{
    case::{CaseFile, PlanCase},
    interpolation::PerformanceModel,
    predictor::{PredictorConfig, PredictorKind},
    profile::Profile,
    sla::{Limits, Observation, PoolLimits, SlaTargets},
    state::{IntervalMetrics, QueueingConfig, SlaModel, SlaPlanner, SlaPlannerConfig},
};

const PROFILE: &str = "h100-llama3.3-70b-tp4";

fn model() -> PerformanceModel {
    PerformanceModel::new(&Profile::builtin(PROFILE).unwrap()).unwrap()
}

fn profile_load_and_grid_build(c: &mut Criterion) {
    c.bench_function("profile load + interpolator build (h100 70B TP4)", |b| {
        b.iter(|| PerformanceModel::new(&Profile::builtin(black_box(PROFILE)).unwrap()).unwrap())
    });
}

fn plan_10k_cases(c: &mut Criterion) {
    let model = model();
    let file: CaseFile = serde_json::from_str(include_str!(
        "../tests/fixtures/golden/planner-h100-llama3.3-70b-tp4.json"
    ))
    .unwrap();
    let cases: Vec<PlanCase> = file.cases.iter().cycle().take(10_000).cloned().collect();
    c.bench_function("plan: 10,000 cases", |b| {
        b.iter(|| {
            cases
                .iter()
                .map(|case| case.evaluate(&model).decode_replicas)
                .sum::<u32>()
        })
    });
}

/// A realistic series: requests per 60 s interval with a daily-like swell and noise.
fn history(n: usize) -> Vec<Observation> {
    (0..n)
        .map(|i| {
            let t = i as f64;
            let swell = 1.0 + 0.5 * (t / 40.0).sin();
            let noise = ((i * 7919) % 97) as f64 / 97.0 - 0.5;
            let requests = (600.0 * swell + 60.0 * noise).max(0.0);
            let isl = 3000.0 + 200.0 * noise;
            let osl = 300.0 + 30.0 * noise;
            let mut observation = Observation::upstream(requests, isl, osl, 180.0, 25.0, 12.0);
            observation.arrivals = Some(requests);
            observation.inflight = Some(40.0);
            observation.queued = Some(2.0);
            observation.isl_second_moment = Some(isl * isl * 1.3);
            observation.osl_second_moment = Some(osl * osl * 1.5);
            observation.ttft_quantile_ms = Some((0.9, 300.0));
            observation.prefill_engines = Some(4.0);
            observation.decode_kv_usage = Some(0.4);
            observation
        })
        .collect()
}

fn one_interval_per_predictor(c: &mut Criterion) {
    let model = model();
    let past = history(481);
    let mut group = c.benchmark_group("one SLA interval after 480 intervals");
    group.sample_size(20);
    for (sla_model, kind) in [SlaModel::Upstream, SlaModel::Queueing]
        .into_iter()
        .flat_map(|m| {
            [
                PredictorKind::Constant,
                PredictorKind::Kalman,
                PredictorKind::Arima,
                PredictorKind::Prophet,
            ]
            .map(|kind| (m, kind))
        })
    {
        let config = SlaPlannerConfig {
            interval_s: 60.0,
            sla: SlaTargets::new(500.0, 50.0),
            limits: Limits {
                prefill: PoolLimits::new(1, None),
                decode: PoolLimits::new(1, None),
                max_gpu_budget: None,
                prefill_gpus_per_engine: 4,
                decode_gpus_per_engine: 4,
                ratio: None,
            },
            correction: true,
            predictor: PredictorConfig {
                kind,
                interval_seconds: 60.0,
                ..PredictorConfig::default()
            },
            model: sla_model,
            queueing: QueueingConfig::default(),
            aggregated: None,
        };
        let mut planner = SlaPlanner::new(&config);
        planner.replay(&past[..480]);
        // Prime any fitted model so the figure is the steady-state cost of one interval.
        planner.tick(&config, &model, IntervalMetrics::Observed(past[480]), (4, 8));
        group.bench_function(format!("{sla_model:?}/{kind:?}"), |b| {
            b.iter_batched(
                || planner.clone(),
                |mut planner| planner.tick(&config, &model, IntervalMetrics::Observed(past[480]), (4, 8)),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    profile_load_and_grid_build,
    plan_10k_cases,
    one_interval_per_predictor
);
criterion_main!(benches);
