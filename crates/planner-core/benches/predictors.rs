//! One planner interval's forecasting work with each predictor: add the newest observation to
//! 480 intervals of history and forecast the next one (the steady state: ARIMA is already
//! fitted and only updated, Prophet refits its 50-point window, as upstream does).
//!
//! The series is the Azure LLM inference trace 2023 (conversation), requests per 7 s, read from
//! `shared/data/traces/` beside the repository; a synthetic series stands in when it is absent.
//! ARIMA's cost depends on the order it selects, so it is also measured on the ServeGen m-large
//! 10-minute request counts in log1p mode, where it selects a larger model.
//! Targets: constant and Kalman under 50 us, ARIMA under 20 ms.
//!
//! Run: `cargo bench -p planner-operator --bench predictors`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use planner_core::predictor::{LoadPredictor, PredictorConfig, PredictorKind, warm_up_prophet};

const HISTORY: usize = 480;
const BUCKET_SECONDS: f64 = 7.0;

/// Seconds since midnight of an Azure trace timestamp such as `2023-11-16 18:17:03.9799600`.
fn seconds_of_day(timestamp: &str) -> Option<f64> {
    let time = timestamp.split(' ').nth(1)?;
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

fn azure_requests_per_bucket() -> Option<Vec<f64>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/traces/azure2023_conv.csv"
    );
    let text = std::fs::read_to_string(path).ok()?;
    let times: Vec<f64> = text
        .lines()
        .skip(1)
        .filter_map(|l| seconds_of_day(l.split(',').next()?))
        .collect();
    let start = *times.first()?;
    let mut counts = vec![0.0; HISTORY + 1];
    for t in times {
        let index = ((t - start) / BUCKET_SECONDS) as usize;
        if index <= HISTORY {
            counts[index] += 1.0;
        }
    }
    Some(counts)
}

fn servegen_requests() -> Option<Vec<f64>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/data/traces/servegen_aggregate_10min.csv"
    );
    let text = std::fs::read_to_string(path).ok()?;
    let counts: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("m-large,"))
        .filter_map(|l| l.split(',').nth(3)?.parse().ok())
        .take(HISTORY + 1)
        .collect();
    (counts.len() == HISTORY + 1).then_some(counts)
}

fn synthetic() -> Vec<f64> {
    (0..=HISTORY)
        .map(|i| {
            let x = i as f64;
            40.0 + 10.0 * (x / 30.0).sin() + 3.0 * ((x * 12.9898).sin() * 43758.5453).fract()
        })
        .collect()
}

fn bench_predictors(c: &mut Criterion) {
    let series = azure_requests_per_bucket().unwrap_or_else(|| {
        eprintln!("shared/data/traces/azure2023_conv.csv not found: using a synthetic series");
        synthetic()
    });
    let servegen = servegen_requests().unwrap_or_else(|| series.clone());
    warm_up_prophet();

    let cases = [
        ("constant", PredictorKind::Constant, false, &series),
        ("kalman", PredictorKind::Kalman, false, &series),
        ("arima", PredictorKind::Arima, false, &series),
        ("arima_log1p_servegen", PredictorKind::Arima, true, &servegen),
        ("prophet", PredictorKind::Prophet, false, &series),
    ];
    let mut group = c.benchmark_group("interval_480_points");
    for (name, kind, log1p, values) in cases {
        let (history, newest) = values.split_at(HISTORY);
        let newest = newest[0];
        let mut warmed = LoadPredictor::new(PredictorConfig {
            kind,
            log1p,
            ..PredictorConfig::default()
        });
        for v in history {
            warmed.add_data_point(*v);
        }
        // The first forecast selects and fits the ARIMA model; the interval measured is a later one.
        let first = warmed.predict_next();
        eprintln!(
            "{name}: first forecast {first:?}, ARIMA order {:?}",
            warmed.arima_order()
        );
        if matches!(kind, PredictorKind::Prophet | PredictorKind::Arima) {
            group.sample_size(20);
        }
        group.bench_function(name, |b| {
            b.iter_batched(
                || warmed.clone(),
                |mut predictor| {
                    predictor.add_data_point(black_box(newest));
                    black_box(predictor.predict_next())
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();

    let mut group = c.benchmark_group("arima_first_fit");
    group.sample_size(10);
    for (name, log1p, values) in [
        ("auto_arima_480_points", false, &series),
        ("auto_arima_480_points_log1p_servegen", true, &servegen),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let mut p = LoadPredictor::new(PredictorConfig {
                        log1p,
                        ..PredictorConfig::default()
                    });
                    for v in &values[..HISTORY] {
                        p.add_data_point(*v);
                    }
                    p
                },
                |mut predictor| black_box(predictor.predict_next()),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench_predictors);
criterion_main!(benches);
