//! Behaviour of each predictor on series with known answers, and the serde round trip.
//! Parity with the Python libraries is in `parity.rs`.

use super::*;

fn config(kind: PredictorKind) -> PredictorConfig {
    PredictorConfig {
        kind,
        ..PredictorConfig::default()
    }
}

fn feed(predictor: &mut LoadPredictor, values: &[f64]) {
    for v in values {
        predictor.add_data_point(*v);
    }
}

/// Deterministic noise in [-1, 1] (no RNG dependency, same on every platform).
fn noise(i: usize) -> f64 {
    let x = ((i as u64)
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        >> 11) as f64;
    2.0 * (x / (1u64 << 53) as f64) - 1.0
}

fn trend(n: usize) -> Vec<f64> {
    (0..n).map(|i| 100.0 + 5.0 * i as f64 + 2.0 * noise(i)).collect()
}

fn seasonal(n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| 200.0 + 50.0 * (2.0 * std::f64::consts::PI * i as f64 / 12.0).sin() + 5.0 * noise(i))
        .collect()
}

#[test]
fn defaults_are_upstreams() {
    let c = PredictorConfig::default();
    assert_eq!(c.kind, PredictorKind::Arima);
    assert!(!c.log1p);
    assert_eq!(
        c.kalman,
        KalmanConfig {
            q_level: 1.0,
            q_trend: 0.1,
            r: 10.0,
            min_points: 5
        }
    );
    assert_eq!(c.prophet_window_size, 50);
    assert_eq!(c.interval_seconds, 180.0);
}

#[test]
fn empty_predictor_forecasts_zero() {
    for kind in [
        PredictorKind::Constant,
        PredictorKind::Arima,
        PredictorKind::Kalman,
        PredictorKind::Prophet,
    ] {
        let mut p = LoadPredictor::new(config(kind));
        let f = p.predict_next();
        assert_eq!(f.value, 0.0, "{kind:?}");
        assert!(
            matches!(f.fallback, Some(Fallback::TooFewPoints { have: 0, .. })),
            "{kind:?}: {f:?}"
        );
        assert!(p.is_empty());
        assert_eq!(p.last_value(), 0.0);
    }
}

#[test]
fn leading_zeros_and_nan_are_skipped_until_traffic() {
    for kind in [
        PredictorKind::Constant,
        PredictorKind::Arima,
        PredictorKind::Kalman,
        PredictorKind::Prophet,
    ] {
        let mut p = LoadPredictor::new(config(kind));
        feed(&mut p, &[0.0, f64::NAN, 0.0]);
        assert!(p.is_empty(), "{kind:?}");
        feed(&mut p, &[7.0, 0.0, f64::NAN, 3.0]);
        // After the first non-zero value zeros count, and NaN is a zero.
        assert_eq!(p.history(), &[7.0, 0.0, 0.0, 3.0], "{kind:?}");
        p.reset_idle_skip();
        feed(&mut p, &[0.0, 0.0, 4.0]);
        assert_eq!(p.history(), &[7.0, 0.0, 0.0, 3.0, 4.0], "{kind:?}");
        assert_eq!(p.len(), 5);
    }
}

#[test]
fn constant_predictor_returns_last_value() {
    let mut p = LoadPredictor::new(config(PredictorKind::Constant));
    feed(&mut p, &[3.0, 9.0, 4.0]);
    assert_eq!(
        p.predict_next(),
        Forecast {
            value: 4.0,
            fallback: None
        }
    );
    p.add_data_point(f64::NAN);
    assert_eq!(p.predict_next().value, 0.0);
}

#[test]
fn constant_series_forecasts_the_constant() {
    for kind in [
        PredictorKind::Constant,
        PredictorKind::Arima,
        PredictorKind::Kalman,
    ] {
        let mut p = LoadPredictor::new(config(kind));
        feed(&mut p, &[42.0; 30]);
        let f = p.predict_next();
        assert!((f.value - 42.0).abs() < 1e-6, "{kind:?}: {f:?}");
    }
    let mut arima = LoadPredictor::new(config(PredictorKind::Arima));
    feed(&mut arima, &[42.0; 30]);
    assert_eq!(arima.predict_next().fallback, Some(Fallback::ConstantSeries));
}

#[test]
fn arima_needs_five_points() {
    let mut p = LoadPredictor::new(config(PredictorKind::Arima));
    feed(&mut p, &[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(
        p.predict_next(),
        Forecast::fallback(4.0, Fallback::TooFewPoints { have: 4, need: 5 })
    );
}

#[test]
fn arima_follows_a_linear_trend() {
    let y = trend(60);
    let mut p = LoadPredictor::new(config(PredictorKind::Arima));
    feed(&mut p, &y[..59]);
    let f = p.predict_next();
    let expected = 100.0 + 5.0 * 59.0;
    assert!((f.value - expected).abs() < 8.0, "{f:?} vs {expected}");
    let (order, _) = p.arima_order().unwrap();
    assert_eq!(order.d, 1, "a trend needs one difference: {order}");
}

#[test]
fn arima_extrapolates_a_perfect_line_as_upstream() {
    // pmdarima picks (0,1,0) with drift on the raw line, so upstream refits on log1p, where it
    // picks (3,2,0) and forecasts 100.0004 for 10 + 3t at t = 30.
    let y: Vec<f64> = (0..30).map(|i| 10.0 + 3.0 * f64::from(i)).collect();
    let mut p = LoadPredictor::new(config(PredictorKind::Arima));
    feed(&mut p, &y);
    let f = p.predict_next();
    assert!((f.value - 100.0).abs() < 0.05, "{f:?}");
    assert_eq!(
        f.fallback,
        Some(Fallback::Log1pSwitch {
            raw_order: ArimaOrder { p: 0, d: 1, q: 0 }
        })
    );
}

#[test]
fn arima_tracks_a_noisy_seasonal_series() {
    let y = seasonal(120);
    let mut p = LoadPredictor::new(config(PredictorKind::Arima));
    // Warm start on 96 points, then step through the rest.
    feed(&mut p, &y[..96]);
    let mut errors = Vec::new();
    for actual in &y[96..120] {
        let f = p.predict_next();
        assert!(f.value.is_finite() && f.value >= 0.0);
        errors.push((f.value - actual).abs());
        p.add_data_point(*actual);
    }
    let mae = errors.iter().sum::<f64>() / errors.len() as f64;
    // The naive forecast's error is ~26 here (amplitude 50, period 12); ARIMA must beat it.
    let naive: f64 = (96..120).map(|i| (y[i] - y[i - 1]).abs()).sum::<f64>() / 24.0;
    assert!(mae < naive, "ARIMA MAE {mae} vs naive {naive}");
}

#[test]
fn arima_repeated_predict_is_stable() {
    let y = seasonal(40);
    let mut p = LoadPredictor::new(config(PredictorKind::Arima));
    feed(&mut p, &y);
    let a = p.predict_next();
    let b = p.predict_next();
    assert_eq!(a, b);
}

#[test]
fn arima_log1p_forecasts_are_non_negative() {
    let mut p = LoadPredictor::new(PredictorConfig {
        log1p: true,
        ..config(PredictorKind::Arima)
    });
    feed(&mut p, &[50.0, 20.0, 5.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    let f = p.predict_next();
    assert!(f.value >= 0.0 && f.value.is_finite(), "{f:?}");
}

#[test]
fn kalman_honours_min_points() {
    let mut p = LoadPredictor::new(config(PredictorKind::Kalman));
    feed(&mut p, &[10.0, 12.0, 14.0, 16.0]);
    assert_eq!(
        p.predict_next(),
        Forecast::fallback(16.0, Fallback::TooFewPoints { have: 4, need: 5 })
    );
    p.add_data_point(18.0);
    let f = p.predict_next();
    assert!(f.fallback.is_none());
    assert!(f.value > 18.0 && f.value < 22.0, "{f:?}");
}

#[test]
fn kalman_follows_a_linear_trend() {
    let y: Vec<f64> = (0..50).map(|i| 10.0 + 3.0 * f64::from(i)).collect();
    let mut p = LoadPredictor::new(config(PredictorKind::Kalman));
    feed(&mut p, &y);
    let f = p.predict_next();
    assert!((f.value - 160.0).abs() < 0.5, "{f:?}");
}

#[test]
fn kalman_does_not_advance_twice_per_interval() {
    let mut a = LoadPredictor::new(config(PredictorKind::Kalman));
    let mut b = LoadPredictor::new(config(PredictorKind::Kalman));
    let y = seasonal(30);
    for v in &y {
        a.add_data_point(*v);
        b.add_data_point(*v);
        // `a` is asked three times per interval, `b` once.
        let fa = [a.predict_next(), a.predict_next(), a.predict_next()];
        let fb = b.predict_next();
        assert!(fa.iter().all(|f| *f == fb));
    }
}

#[test]
fn kalman_log1p_is_non_negative_on_a_collapse() {
    let mut p = LoadPredictor::new(PredictorConfig {
        log1p: true,
        ..config(PredictorKind::Kalman)
    });
    feed(&mut p, &[1000.0, 500.0, 100.0, 10.0, 1.0, 0.0, 0.0]);
    let f = p.predict_next();
    assert!(f.value >= 0.0, "{f:?}");
    // Raw mode would extrapolate below zero; the forecast is clamped.
    let mut raw = LoadPredictor::new(config(PredictorKind::Kalman));
    feed(&mut raw, &[1000.0, 500.0, 100.0, 10.0, 1.0, 0.0, 0.0]);
    assert!(raw.predict_next().value >= 0.0);
}

#[test]
fn prophet_window_is_bounded() {
    let mut p = LoadPredictor::new(PredictorConfig {
        prophet_window_size: 10,
        ..config(PredictorKind::Prophet)
    });
    feed(&mut p, &trend(25));
    assert_eq!(p.len(), 10);
    assert_eq!(p.history()[9], trend(25)[24]);
}

#[cfg(feature = "prophet")]
#[test]
fn prophet_follows_a_noisy_trend() {
    let y = trend(40);
    let mut p = LoadPredictor::new(config(PredictorKind::Prophet));
    feed(&mut p, &y);
    let f = p.predict_next();
    assert!(f.fallback.is_none(), "{f:?}");
    let expected = 100.0 + 5.0 * 40.0;
    assert!((f.value - expected).abs() < 10.0, "{f:?} vs {expected}");
}

#[cfg(feature = "prophet")]
#[test]
fn prophet_optimizer_failure_falls_back_to_the_last_value() {
    // A perfectly smooth sine is known to make Stan's line search fail; whatever the optimizer
    // does, the forecast is usable and a failure is reported as such.
    let y: Vec<f64> = (0..50)
        .map(|i| 100.0 + 20.0 * (f64::from(i) / 5.0).sin())
        .collect();
    let mut p = LoadPredictor::new(config(PredictorKind::Prophet));
    feed(&mut p, &y);
    let f = p.predict_next();
    assert!(f.value.is_finite() && f.value >= 0.0, "{f:?}");
    if let Some(fallback) = &f.fallback {
        assert!(matches!(fallback, Fallback::ModelFailed { .. }), "{fallback:?}");
        assert_eq!(f.value, y[49]);
    }
}

#[test]
fn predictors_round_trip_through_serde_and_predict_the_same() {
    for kind in [
        PredictorKind::Constant,
        PredictorKind::Arima,
        PredictorKind::Kalman,
        PredictorKind::Prophet,
    ] {
        let y = seasonal(60);
        let mut original = LoadPredictor::new(config(kind));
        feed(&mut original, &y[..50]);
        original.predict_next();
        feed(&mut original, &y[50..]);
        let json = serde_json::to_string(&original).unwrap();
        let mut restored: LoadPredictor = serde_json::from_str(&json).unwrap();
        assert_eq!(restored.history(), original.history(), "{kind:?}");
        assert_eq!(restored.predict_next(), original.predict_next(), "{kind:?}");
    }
}

#[test]
fn fallback_messages_read_well() {
    assert_eq!(
        Fallback::TooFewPoints { have: 2, need: 5 }.to_string(),
        "only 2 of the 5 points the model needs: using the last value"
    );
    assert_eq!(
        Fallback::Log1pSwitch {
            raw_order: ArimaOrder { p: 0, d: 1, q: 0 }
        }
        .to_string(),
        "ARIMA on raw values collapsed to (0,1,0): modelling log1p(load) instead"
    );
    assert!(
        Fallback::ModelFailed {
            reason: "boom".into()
        }
        .to_string()
        .contains("boom")
    );
    assert!(Fallback::ConstantSeries.to_string().contains("same"));
}

#[test]
fn load_predictors_feed_three_series() {
    let mut all = LoadPredictors::new(&config(PredictorKind::Constant));
    all.observe(10.0, 3000.0, f64::NAN);
    all.observe(12.0, 2000.0, 150.0);
    let (r, i, o) = all.predict();
    assert_eq!((r.value, i.value, o.value), (12.0, 2000.0, 150.0));
    // The OSL NaN came before any traffic on that series: skipped.
    assert_eq!(all.osl.len(), 1);
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            8 => 0.0..1e5_f64,
            1 => Just(0.0),
            1 => Just(f64::NAN),
            1 => -10.0..0.0_f64,
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Whatever comes in, every predictor returns a finite, non-negative forecast and
        /// never panics.
        #[test]
        fn forecasts_are_finite_and_non_negative(
            values in prop::collection::vec(value(), 0..40),
            log1p in any::<bool>(),
        ) {
            for kind in [PredictorKind::Constant, PredictorKind::Arima, PredictorKind::Kalman] {
                let mut p = LoadPredictor::new(PredictorConfig { log1p, ..config(kind) });
                for v in &values {
                    p.add_data_point(*v);
                    let f = p.predict_next();
                    prop_assert!(f.value.is_finite() && f.value >= 0.0, "{:?} {:?}", kind, f);
                }
            }
        }
    }
}
