//! Every golden case of `tests/fixtures/golden/` (upstream's planner on upstream's data) through the planner
//! core: replica counts equal in at least 99% of each file's cases, throughputs within 1%.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;

use planner_core::{
    case::{CaseFile, PlanResult},
    interpolation::PerformanceModel,
    profile::Profile,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Expected {
    prefill_thpt_per_gpu: f64,
    decode_thpt_per_gpu: f64,
    prefill_replicas_unbudgeted: u32,
    decode_replicas_unbudgeted: u32,
    prefill_replicas: u32,
    decode_replicas: u32,
    prefill_correction: Option<f64>,
    decode_correction: Option<f64>,
}

#[derive(Deserialize)]
struct GoldenCase {
    id: String,
    expected: Expected,
}

#[derive(Deserialize)]
struct GoldenFile {
    cases: Vec<GoldenCase>,
}

fn relative_error(actual: f64, expected: f64) -> f64 {
    if expected == 0.0 {
        actual.abs()
    } else {
        ((actual - expected) / expected).abs()
    }
}

fn check(file: &str) -> (usize, usize, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/golden")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let inputs: CaseFile = serde_json::from_str(&text).unwrap();
    let golden: GoldenFile = serde_json::from_str(&text).unwrap();
    let profile_name = inputs.profile.clone().unwrap();
    // Upstream's algorithm on upstream's data: the files as published, without the built-in
    // profiles' throughput correction (see `planner::profile::Builtin::throughput_scale`).
    let published = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../config/profiles")
        .join(&profile_name);
    let model = PerformanceModel::new(&Profile::from_dir(&published).unwrap()).unwrap();
    let mut replica_mismatches = 0;
    let mut report = Vec::new();
    for (case, golden) in inputs.cases.iter().zip(&golden.cases) {
        assert_eq!(case.id, golden.id);
        let actual: PlanResult = case.evaluate(&model);
        let e = &golden.expected;
        let replicas_match = (
            actual.prefill_replicas_unbudgeted,
            actual.decode_replicas_unbudgeted,
            actual.prefill_replicas,
            actual.decode_replicas,
        ) == (
            e.prefill_replicas_unbudgeted,
            e.decode_replicas_unbudgeted,
            e.prefill_replicas,
            e.decode_replicas,
        );
        let thpt_ok = relative_error(actual.prefill_thpt_per_gpu, e.prefill_thpt_per_gpu) <= 0.01
            && relative_error(actual.decode_thpt_per_gpu, e.decode_thpt_per_gpu) <= 0.01;
        let corrections_ok = [
            (actual.prefill_correction, e.prefill_correction),
            (actual.decode_correction, e.decode_correction),
        ]
        .iter()
        .all(|(a, e)| match (a, e) {
            (Some(a), Some(e)) => relative_error(*a, *e) <= 0.01,
            (None, None) => true,
            _ => false,
        });
        if !replicas_match {
            replica_mismatches += 1;
        }
        if !replicas_match || !thpt_ok || !corrections_ok {
            report.push(format!(
                "{}: inputs {}\n  expected thpt p={:.3} d={:.3} corr p={:?} d={:?} replicas {}/{} -> {}/{}\n  actual   thpt p={:.3} d={:.3} corr p={:?} d={:?} replicas {}/{} -> {}/{}",
                case.id,
                serde_json::to_string(case).unwrap(),
                e.prefill_thpt_per_gpu, e.decode_thpt_per_gpu, e.prefill_correction, e.decode_correction,
                e.prefill_replicas_unbudgeted, e.decode_replicas_unbudgeted, e.prefill_replicas, e.decode_replicas,
                actual.prefill_thpt_per_gpu, actual.decode_thpt_per_gpu, actual.prefill_correction, actual.decode_correction,
                actual.prefill_replicas_unbudgeted, actual.decode_replicas_unbudgeted, actual.prefill_replicas, actual.decode_replicas,
            ));
            if !thpt_ok || !corrections_ok {
                report.push("  ^ throughput or correction off by more than 1%".into());
            }
        }
    }
    (inputs.cases.len(), replica_mismatches, report)
}

fn assert_golden(file: &str) {
    let (cases, mismatches, report) = check(file);
    for line in &report {
        println!("{line}");
    }
    let match_rate = (cases - mismatches) as f64 / cases as f64;
    println!(
        "{file}: {} of {cases} cases with identical replicas ({:.1}%)",
        cases - mismatches,
        match_rate * 100.0
    );
    assert!(
        match_rate >= 0.99,
        "{file}: replica counts match in {:.1}% of cases, need 99%",
        match_rate * 100.0
    );
    assert!(
        !report.iter().any(|l| l.contains("off by more than 1%")),
        "{file}: throughputs or corrections differ by more than 1%:\n{}",
        report.join("\n")
    );
}

#[test]
fn golden_h200_llama_8b_tp1() {
    assert_golden("planner-h200-llama3.1-8b-tp1.json");
}

#[test]
fn golden_h100_llama_70b_tp4() {
    assert_golden("planner-h100-llama3.3-70b-tp4.json");
}
