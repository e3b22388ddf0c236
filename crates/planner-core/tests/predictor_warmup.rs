//! Warm-up from Mooncake traces through the public API.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use planner_core::predictor::{Fallback, LoadPredictors, PredictorConfig, PredictorKind};
use planner_core::trace::{TraceError, bucketize, parse_mooncake_jsonl};

const TINY: &str = include_str!("fixtures/mooncake_tiny.jsonl");

/// A trace copied from `shared/data/` into `tests/fixtures/traces/`, so the tests need nothing
/// outside the repository.
fn shared_trace(name: &str) -> String {
    let path = format!("{}/tests/fixtures/traces/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn tiny_trace_buckets_as_upstream() {
    let records = parse_mooncake_jsonl(TINY).unwrap();
    assert_eq!(records.len(), 16);
    // 15 requests at t=0 and one at 3.052 s.
    let buckets = bucketize(&records, 180.0);
    assert_eq!(buckets.len(), 1);
    assert_eq!(buckets[0].request_count, 16.0);
    let mean_isl = records.iter().map(|r| r.input_length).sum::<f64>() / 16.0;
    assert!((buckets[0].avg_isl - mean_isl).abs() < 1e-9);

    let per_second = bucketize(&records, 1.0);
    assert_eq!(
        per_second.iter().map(|b| b.start_s).collect::<Vec<_>>(),
        vec![0.0, 3.0]
    );
    assert_eq!(per_second[1].request_count, 1.0);
    assert_eq!(per_second[1].avg_isl, 13538.0);
    assert_eq!(per_second[1].avg_osl, 71.0);
}

#[test]
fn warm_up_fills_all_three_series_and_resets_idle_skip() {
    let records = parse_mooncake_jsonl(TINY).unwrap();
    let buckets = bucketize(&records, 1.0);
    let config = PredictorConfig {
        kind: PredictorKind::Constant,
        ..PredictorConfig::default()
    };
    let mut predictors = LoadPredictors::new(&config);
    predictors.warm_up(&buckets);
    assert_eq!(predictors.requests.history(), &[15.0, 1.0]);
    assert_eq!(predictors.osl.history()[1], 71.0);
    // Live traffic starts idle: those zeros are skipped although the buffer is warm.
    predictors.observe(0.0, f64::NAN, f64::NAN);
    assert_eq!(predictors.requests.len(), 2);
    let (requests, isl, _) = predictors.predict();
    assert_eq!(requests.value, 1.0);
    assert_eq!(isl.value, 13538.0);
}

#[test]
fn warm_up_from_the_1000_request_trace_feeds_arima_and_kalman() {
    let records = parse_mooncake_jsonl(&shared_trace("mooncake_trace_1000.jsonl")).unwrap();
    assert_eq!(records.len(), 1000);
    let buckets = bucketize(&records, 5.0);
    assert!(buckets.len() > 20, "{}", buckets.len());
    let total: f64 = buckets.iter().map(|b| b.request_count).sum();
    assert_eq!(total, 1000.0);
    for kind in [PredictorKind::Arima, PredictorKind::Kalman] {
        let mut predictors = LoadPredictors::new(&PredictorConfig {
            kind,
            ..PredictorConfig::default()
        });
        predictors.warm_up(&buckets);
        let (requests, isl, osl) = predictors.predict();
        for f in [&requests, &isl, &osl] {
            assert!(f.value.is_finite() && f.value >= 0.0, "{kind:?}: {f:?}");
            assert!(
                !matches!(f.fallback, Some(Fallback::TooFewPoints { .. })),
                "{kind:?}: {f:?}"
            );
        }
    }
}

#[test]
fn bad_trace_lines_are_reported_with_line_and_field() {
    let mut text = TINY.lines().take(3).collect::<Vec<_>>().join("\n");
    text.push_str("\n{\"timestamp\": 10, \"input_length\": null, \"output_length\": 3}\n");
    let err = parse_mooncake_jsonl(&text).unwrap_err();
    assert!(
        matches!(
            err,
            TraceError::InvalidField {
                line: 4,
                field: "input_length",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with("line 4: field `input_length`"),
        "{err}"
    );
}
