//! `planner-operator what-if`: the loop a PlannerPolicy describes, over a trace, gives what the
//! simulator's `sla-arima` gives on the same settings; a policy the webhook would refuse and a
//! bad trace line are refused by name, with exit status 2.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::float_cmp)] // test code

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use planner_core::{
    interpolation::PerformanceModel, predictor::PredictorKind, profile::Profile, sla::SlaTargets,
};
use planner_operator::whatif::{Output, WhatIfArgs, evaluate};
use planner_sim_engine::{
    latency::{EngineSpec, LatencyModel},
    policy::{Oracle, PolicySpec},
    run::{SimConfig, run},
    trace,
};

const PROFILE: &str = "h100-llama3.3-70b-tp4";

/// A PlannerPolicy with the settings of `planner-sim simulate`'s `sla-arima`: a 60 s interval,
/// the queueing model with ARIMA, 1 to 64 replicas, no GPU budget, expecting the delay it will
/// measure.
fn policy(dir: &Path, ttft_ms: f64, delay_s: u64) -> PathBuf {
    let path = dir.join(format!("policy-{ttft_ms}-{delay_s}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: planner.dynamo.io/v1alpha1
kind: PlannerPolicy
metadata: {{name: preview, namespace: team}}
spec:
  targetRef: {{name: llm}}
  adjustmentInterval: 60s
  sla: {{ttftMs: {ttft_ms}, itlMs: 50}}
  profile: {{builtin: {PROFILE}}}
  predictor: {{kind: arima}}
  bounds: {{minReplicas: 1, maxReplicas: 64, maxGpuBudget: -1}}
  behavior: {{expectedScaleUpDelay: {delay_s}s}}
"
        ),
    )
    .unwrap();
    path
}

/// An hour of bursty Mooncake-format requests: a calm base with two bursts of long prompts.
fn bursty_trace(dir: &Path) -> PathBuf {
    let path = dir.join("bursty.jsonl");
    let mut text = String::new();
    let mut t_ms = 0u64;
    let mut i = 0u64;
    while t_ms < 3_600_000 {
        let minute = t_ms / 60_000;
        let burst = (15..20).contains(&minute) || (40..43).contains(&minute);
        let gap = if burst { 120 } else { 700 };
        let isl = 4000 + (i * 7919) % 9000;
        let osl = 100 + (i * 104_729) % 400;
        writeln!(
            text,
            "{{\"timestamp\": {t_ms}, \"input_length\": {isl}, \"output_length\": {osl}}}"
        )
        .unwrap();
        t_ms += gap + (i * 31) % 200;
        i += 1;
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// `sla-arima` as `planner-sim simulate` runs it, from the oracle's replicas: its GPU-hours
/// and intervals meeting the SLA, and those replicas.
fn simulate(trace: &Path, ttft_ms: f64, delay_s: f64) -> (f64, usize, usize, (u32, u32)) {
    let profile = Profile::builtin(PROFILE).unwrap();
    let curves = PerformanceModel::new(&profile).unwrap();
    let latency = LatencyModel::new(&curves, EngineSpec::from_profile(&profile));
    let requests = trace::scale(&trace::load(trace).unwrap(), 1.0, 1.0);
    let mut config = SimConfig {
        scale_up_delay_s: delay_s,
        expected_scale_up_delay_s: Some(delay_s),
        sla: SlaTargets::new(ttft_ms, 50.0),
        ..SimConfig::default()
    };
    config.limits.prefill_gpus_per_engine = 4;
    config.limits.decode_gpus_per_engine = 4;
    let oracle = run(&requests, &latency, &config, &mut Oracle::default(), None);
    let spec = PolicySpec::Sla {
        model: planner_core::state::SlaModel::Queueing,
        predictor: PredictorKind::Arima,
        correction: true,
        headroom: false,
    };
    let mut policy = spec.build(&config, (1, 1));
    let result = run(
        &requests,
        &latency,
        &config,
        policy.as_mut(),
        Some(oracle.initial),
    );
    (
        result.summary.gpu_hours,
        result.summary.intervals,
        result.summary.intervals_meeting,
        oracle.initial,
    )
}

fn args(policy: PathBuf, trace: PathBuf, delay_s: u64, initial: (u32, u32)) -> WhatIfArgs {
    WhatIfArgs {
        policy,
        trace,
        scale_up_delay: Some(format!("{delay_s}s")),
        profile_dir: None,
        profile: None,
        prefill_gpus: None,
        decode_gpus: None,
        aggregated: false,
        rate_scale: 1.0,
        jitter_s: 1.0,
        initial_replicas: Some(format!("{},{}", initial.0, initial.1)),
        output: Output::Json,
    }
}

#[test]
fn what_if_gives_what_the_simulators_sla_arima_gives_on_the_same_settings() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut traces = vec![
        (bursty_trace(dir.path()), 500.0),
        (
            root.join("../crates/planner-core/tests/fixtures/mooncake_tiny.jsonl"),
            2000.0,
        ),
    ];
    // The benchmark's traces, where the repository's neighbour holds them.
    for (name, ttft) in [
        ("azure2023_code.csv", 500.0),
        ("mooncake_conversation_trace.jsonl", 2000.0),
    ] {
        let path = root.join("../../shared/data/traces").join(name);
        if path.exists() {
            traces.push((path, ttft));
        }
    }
    for (trace, ttft_ms) in &traces {
        for delay_s in [60, 180] {
            let (gpu_hours, intervals, meeting, initial) = simulate(trace, *ttft_ms, delay_s as f64);
            let report = evaluate(&args(
                policy(dir.path(), *ttft_ms, delay_s),
                trace.clone(),
                delay_s,
                initial,
            ))
            .unwrap();
            let at = format!("{} at {delay_s} s", trace.display());
            assert_eq!(report.gpu_hours, gpu_hours, "{at}");
            assert_eq!(
                (report.intervals, report.intervals_ok),
                (intervals, meeting),
                "{at}"
            );
            assert!(report.intervals > 0, "{at}");
        }
    }
}

fn what_if(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_planner-operator"))
        .arg("what-if")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn what_if_prints_each_decision_and_the_totals() {
    let dir = tempfile::tempdir().unwrap();
    let trace = bursty_trace(dir.path());
    let policy = policy(dir.path(), 500.0, 60);
    let output = what_if(&[
        "--policy",
        policy.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("interval set "), "{text}");
    assert!(
        text.contains("GPU-hours;") && text.contains("intervals met the SLA"),
        "{text}"
    );
    let json = what_if(&[
        "--policy",
        policy.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--output",
        "json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(report["gpu_hours"].as_f64().unwrap() > 0.0);
    let pct = report["intervals_ok_pct"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&pct), "{pct}");
    assert!(!report["decisions"].as_array().unwrap().is_empty());
    assert_eq!(report["per_interval"].as_array().unwrap().len(), 60);
}

#[test]
fn a_policy_the_webhook_refuses_and_a_bad_trace_line_exit_2_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let trace = bursty_trace(dir.path());
    let good = policy(dir.path(), 500.0, 60);
    let refused = dir.path().join("refused.yaml");
    let text = std::fs::read_to_string(&good)
        .unwrap()
        .replace("adjustmentInterval: 60s", "adjustmentInterval: 48h");
    std::fs::write(&refused, text).unwrap();
    let output = what_if(&[
        "--policy",
        refused.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("spec.adjustmentInterval"), "{stderr}");

    let bad_trace = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad_trace,
        "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 10}\n{\"timestamp\": 5, \"output_length\": 10}\n",
    )
    .unwrap();
    let output = what_if(&[
        "--policy",
        good.to_str().unwrap(),
        "--trace",
        bad_trace.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("line 2") && stderr.contains("input_length"),
        "{stderr}"
    );
}
