//! The cost of building a performance model from a profile at the size caps, on the layouts
//! that make triangulation and point location slowest: prints the build time of each (no timing
//! assertion; run with `--release --nocapture` for the figures).
//!
//! `cargo test -p planner-core --release --test bounded_build -- --nocapture`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Instant;

use planner_core::{
    interpolation::PerformanceModel,
    profile::{DecodeProfile, MAX_DECODE_POINTS, MAX_PREFILL_POINTS, PrefillProfile, Profile},
};

/// A deterministic generator in [0, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1_u64 << 53) as f64
    }
}

fn prefill(points: usize) -> PrefillProfile {
    let isl: Vec<f64> = (0..points).map(|i| 100.0 + 16.0 * i as f64).collect();
    PrefillProfile {
        ttft_ms: isl.iter().map(|x| 10.0 + x / 100.0).collect(),
        thpt_per_gpu: isl.iter().map(|x| 1000.0 + x).collect(),
        isl,
    }
}

fn decode(points: Vec<[f64; 2]>) -> DecodeProfile {
    DecodeProfile {
        itl_ms: points.iter().map(|p| 5.0 + 10.0 * p[0] + p[1] / 1000.0).collect(),
        thpt_per_gpu: points.iter().map(|p| 100.0 + 900.0 * p[0]).collect(),
        kv_usage: points.iter().map(|p| p[0]).collect(),
        context_length: points.iter().map(|p| p[1]).collect(),
        max_kv_tokens: 1_000_000.0,
    }
}

/// Decode sample layouts of `n` points.
fn layouts(n: usize) -> Vec<(&'static str, Vec<[f64; 2]>)> {
    let mut random = Lcg(42);
    let side = (n as f64).sqrt() as usize;
    vec![
        (
            "uniform random",
            (0..n)
                .map(|_| [random.next(), 100.0 + 16_000.0 * random.next()])
                .collect(),
        ),
        (
            // As profilers sweep: kv usage = concurrency x context / capacity, so each
            // concurrency lies on a ray from the origin (near-collinear points, slivers).
            "sweep rays",
            (0..n)
                .map(|i| {
                    let (concurrency, row) = ((i % side + 1) as f64, (i / side + 1) as f64);
                    let context = 100.0 * row;
                    [
                        concurrency * context / (side as f64 * 100.0 * side as f64),
                        context,
                    ]
                })
                .collect(),
        ),
        (
            // Convex position: long thin triangles across the whole hull.
            "parabola",
            (0..n)
                .map(|i| {
                    let x = i as f64 / n as f64;
                    [x, 100.0 + 16_000.0 * x * x]
                })
                .collect(),
        ),
        (
            // Two lines: every triangle spans the gap between them.
            "two lines",
            (0..n)
                .map(|i| {
                    let x = (i / 2) as f64 / (n / 2) as f64 + 1e-7 * (i % 2) as f64;
                    [x, if i % 2 == 0 { 100.0 } else { 16_000.0 }]
                })
                .collect(),
        ),
        (
            // Half the samples zigzag along a hull edge by far less than rounding matters
            // (all slivers, peeled off one by one from the hull inwards), half inside.
            "sliver hull",
            (0..n)
                .map(|i| {
                    if i % 2 == 0 {
                        let x = i as f64 / n as f64;
                        [x, 100.0 + 15_900.0 * x + 1e-9 * ((i / 2) % 2) as f64]
                    } else {
                        let x = random.next();
                        [x, 100.0 + 15_900.0 * x * random.next()]
                    }
                })
                .collect(),
        ),
        (
            // Nearly every sample zigzags along one line, a few lie off it: nearly every
            // triangle is a sliver reachable from the hull.
            "sliver band",
            (0..n)
                .map(|i| {
                    let x = i as f64 / n as f64;
                    if i % 1000 == 500 {
                        [x, 100.0 + 15_900.0 * x - 5_000.0]
                    } else {
                        [x, 100.0 + 15_900.0 * x + 1e-9 * (i % 2) as f64]
                    }
                })
                .collect(),
        ),
        (
            // A tiny cluster: nearly every grid cell is outside the hull (nearest fill).
            "tiny cluster",
            (0..n)
                .map(|_| [0.5 + 1e-4 * random.next(), 1000.0 + random.next()])
                .collect(),
        ),
    ]
}

#[test]
fn a_model_at_the_caps_builds_in_bounded_time() {
    let mut slowest = (0.0_f64, "");
    for (name, points) in layouts(MAX_DECODE_POINTS) {
        let profile = Profile {
            prefill: prefill(MAX_PREFILL_POINTS),
            decode: decode(points),
        };
        let started = Instant::now();
        let model = PerformanceModel::new(&profile);
        let seconds = started.elapsed().as_secs_f64();
        assert!(model.is_ok(), "{name}: {:?}", model.err());
        println!(
            "build of a {MAX_PREFILL_POINTS}-point prefill and {MAX_DECODE_POINTS}-point decode profile ({name}): {:.3} s",
            seconds
        );
        if seconds > slowest.0 {
            slowest = (seconds, name);
        }
    }
    println!("slowest: {} ({:.3} s)", slowest.1, slowest.0);
}

#[test]
fn more_points_than_the_caps_are_refused() {
    let too_many = Profile {
        prefill: prefill(10),
        decode: decode(
            (0..=MAX_DECODE_POINTS)
                .map(|i| [i as f64 / 1e4, 100.0 + (i % 97) as f64])
                .collect(),
        ),
    };
    let error = PerformanceModel::new(&too_many).unwrap_err().to_string();
    assert!(
        error.contains("x_kv_usage") && error.contains(&MAX_DECODE_POINTS.to_string()),
        "{error}"
    );
}
