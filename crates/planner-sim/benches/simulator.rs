//! Simulator benchmark: replay one hour of the Azure conversation trace (19,366 requests)
//! through one policy (the planning loop the operator runs), so what-if runs stay interactive (target: under 1 s). The SLA planner
//! with ARIMA (upstream's default predictor) and correction factors, and with the constant
//! predictor to show what the simulation itself costs; and the oracle, the most expensive
//! policy (it simulates every candidate replica count forward).
//!
//! `cargo bench -p planner-sim --bench simulator` (the trace is a test fixture of planner-core).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // benchmark code

use std::{hint::black_box, path::PathBuf, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use planner_core::{
    interpolation::PerformanceModel, predictor::PredictorKind, profile::Profile, sla::Limits, state::SlaModel,
};
use planner_sim::sim::{
    latency::{EngineSpec, LatencyModel},
    policy::{LoopPolicy, Oracle},
    run::{SimConfig, run},
    trace,
};

const PROFILE: &str = "h100-llama3.3-70b-tp4";

fn trace_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../planner-core/tests/fixtures/traces/azure2023_conv.csv")
}

fn replay(c: &mut Criterion) {
    let path = trace_path();
    let Ok(requests) = trace::load(&path) else {
        eprintln!("skipping the simulator benchmark: {} not found", path.display());
        return;
    };
    let profile = Profile::builtin(PROFILE).unwrap();
    let curves = PerformanceModel::new(&profile).unwrap();
    let model = LatencyModel::new(&curves, EngineSpec::from_profile(&profile));
    let config = SimConfig {
        limits: Limits {
            prefill_gpus_per_engine: 4,
            decode_gpus_per_engine: 4,
            ..SimConfig::default().limits
        },
        ..SimConfig::default()
    };
    let mut group = c.benchmark_group("replay one hour of azure2023_conv");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    for (name, sla_model, kind) in [
        ("upstream-arima", SlaModel::Upstream, PredictorKind::Arima),
        ("sla-arima", SlaModel::Queueing, PredictorKind::Arima),
        ("sla-constant", SlaModel::Queueing, PredictorKind::Constant),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut policy = LoopPolicy::sla(&config, sla_model, kind, true, false);
                black_box(
                    run(&requests, &model, &config, &mut policy, Some((1, 1)))
                        .summary
                        .gpu_hours,
                )
            })
        });
    }
    group.bench_function("oracle", |b| {
        b.iter(|| {
            black_box(
                run(&requests, &model, &config, &mut Oracle::default(), None)
                    .summary
                    .gpu_hours,
            )
        })
    });
    group.finish();
}

criterion_group!(benches, replay);
criterion_main!(benches);
