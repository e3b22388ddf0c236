//! `planner-operator what-if`: a PlannerPolicy's planning loop, the one the operator runs,
//! replayed over a request trace on the simulator's engine model (planner-sim-engine), before
//! the policy is applied to a cluster. It prints what the loop would set at each check and
//! why, then the GPU-hours and the share of intervals meeting the SLA.
//!
//! Its stages, in order: read the policy, validate it with the admission webhook's rules
//! against a graph of the profile's engines, load the profile, read the trace, build the loop
//! as the operator builds it, replay, report.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{Args, ValueEnum};
use serde::Serialize;

use planner_api::{DynamoGraphDeployment, PlannerMode, PlannerPolicy};
use planner_core::{
    interpolation::{PerformanceCurves, PerformanceModel},
    policy::{Decision, Planner, PolicyLoop},
    profile::{Profile, builtin_names},
    sla::SlaTargets,
};
use planner_sim_engine::{
    latency::{EngineSpec, LatencyModel},
    policy::LoopPolicy,
    run::{self, Policy, RunResult, SimConfig, View},
    trace,
};

use crate::{
    controller::planner_policy::config,
    target::TargetGraph,
    validation::{self, Tenancy, ValidatedPolicy},
};

/// Arguments of `what-if`.
#[derive(Debug, Args)]
pub struct WhatIfArgs {
    /// The PlannerPolicy (YAML or JSON, as `kubectl apply` takes it).
    #[arg(long, value_name = "FILE")]
    pub policy: PathBuf,
    /// The request trace: Azure LLM inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`)
    /// or Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// Time from asking for a replica to it serving, on the simulated cluster (a duration:
    /// `90s`, `5m`). Default: the policy's `behavior.scaleUpDelay`, else its
    /// `behavior.expectedScaleUpDelay`, else 60s.
    #[arg(long, value_name = "DURATION")]
    pub scale_up_delay: Option<String>,
    /// A profile directory (Dynamo's profiler output, or the files of the policy's profile
    /// ConfigMap), standing in for the profile the policy names.
    #[arg(long, value_name = "DIR", conflicts_with = "profile")]
    pub profile_dir: Option<PathBuf>,
    /// A built-in profile, instead of the one the policy names.
    #[arg(long, value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    pub profile: Option<String>,
    /// GPUs per prefill engine (default: the built-in profile's `-tpN`, else 1).
    #[arg(long)]
    pub prefill_gpus: Option<u32>,
    /// GPUs per decode engine (default: the built-in profile's `-tpN`, else 1).
    #[arg(long)]
    pub decode_gpus: Option<u32>,
    /// One pool of aggregated engines instead of prefill and decode pools.
    #[arg(long)]
    pub aggregated: bool,
    /// Multiply the trace's request rate (each request becomes `k` requests, jittered).
    #[arg(long, default_value_t = 1.0)]
    pub rate_scale: f64,
    /// Arrival jitter of the rate-scaled copies (s).
    #[arg(long, default_value_t = 1.0)]
    pub jitter_s: f64,
    /// Replicas at the start, `PREFILL,DECODE` (default: the policy's minimum of each pool).
    #[arg(long, value_name = "P,D")]
    pub initial_replicas: Option<String>,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// One line per interval and per decision, then the totals.
    Table,
    /// One JSON object.
    Json,
}

/// Why `what-if` could not run: every variant is bad input (exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum WhatIfError {
    /// The policy cannot be read, or the webhook would refuse it.
    #[error("{0}")]
    Policy(String),
    /// The trace cannot be read.
    #[error("{0}")]
    Trace(String),
    /// The profile cannot be read.
    #[error("{0}")]
    Profile(String),
    /// An argument is not valid.
    #[error("{0}")]
    Argument(String),
}

/// What `what-if` found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The policy's name.
    pub policy: String,
    /// GPU-hours of every replica asked for over the trace's intervals.
    pub gpu_hours: f64,
    /// Share of intervals with arrivals whose arrivals met the SLA, in percent.
    pub intervals_ok_pct: f64,
    /// Intervals with arrivals.
    pub intervals: usize,
    /// Of those, intervals meeting the SLA.
    pub intervals_ok: usize,
    /// Share of intervals whose arrivals' 90th-percentile TTFT met the target (and mean ITL
    /// did), in percent.
    pub intervals_ok_p90_pct: f64,
    /// 90th-percentile TTFT over all requests (ms).
    pub p90_ttft_ms: f64,
    /// The scale-up delay of the simulated cluster (s).
    pub scale_up_delay_s: f64,
    /// Per reporting interval.
    pub per_interval: Vec<IntervalLine>,
    /// Every check that decided replicas.
    pub decisions: Vec<DecisionLine>,
}

/// One reporting interval.
#[derive(Clone, Debug, Serialize)]
pub struct IntervalLine {
    /// Its start (s).
    pub start_s: f64,
    /// Requests that arrived in it.
    pub arrivals: usize,
    /// Their mean TTFT (ms).
    pub ttft_ms: Option<f64>,
    /// Their token-weighted mean ITL (ms).
    pub itl_ms: Option<f64>,
    /// Whether they met the SLA.
    pub met: Option<bool>,
    /// Prefill replicas asked for, time-averaged.
    pub prefill: f64,
    /// Decode replicas asked for, time-averaged.
    pub decode: f64,
    /// GPUs asked for, time-averaged.
    pub gpus: f64,
}

/// One check that decided replicas.
#[derive(Clone, Debug, Serialize)]
pub struct DecisionLine {
    /// When (s).
    pub t_s: f64,
    /// `interval`, `fast` or `grant`.
    pub check: &'static str,
    /// The replicas decided (prefill, decode).
    pub target: (u32, u32),
    /// What was set (`None`: held back, as the message says).
    pub scaled_to: Option<(u32, u32)>,
    /// What limited it (`ScalingLimited`'s reason), when something did.
    pub limited: Option<&'static str>,
    /// Why, as the policy's status would say it.
    pub message: String,
}

/// Runs `what-if`; returns what it prints.
pub fn what_if(args: &WhatIfArgs) -> Result<String, WhatIfError> {
    let report = evaluate(args)?;
    Ok(match args.output {
        Output::Json => {
            serde_json::to_string_pretty(&report).map_err(|e| WhatIfError::Argument(e.to_string()))?
        }
        Output::Table => table(&report),
    })
}

/// The policy as the operator would plan it, replayed over the trace.
pub fn evaluate(args: &WhatIfArgs) -> Result<Report, WhatIfError> {
    let policy = read_policy(&args.policy)?;
    let (profile, builtin) = read_profile(&policy, args)?;
    let gpus_of = |flag: Option<u32>| {
        flag.or_else(|| builtin.as_deref().and_then(tp_of))
            .unwrap_or(1)
            .max(1)
    };
    let gpus = (gpus_of(args.prefill_gpus), gpus_of(args.decode_gpus));
    let validated = validate(&policy, gpus, args.aggregated)?;
    let requests = read_trace(&args.trace, args.rate_scale, args.jitter_s)?;
    let curves = PerformanceModel::new(&profile).map_err(|e| WhatIfError::Profile(e.to_string()))?;
    let model = LatencyModel::new(&curves, EngineSpec::from_profile(&profile));
    let delay = scale_up_delay(args, &validated)?;
    let (policy_loop, sim) = build(&policy, &validated, delay);
    let initial = initial_replicas(args, &policy)?;
    let name = policy.metadata.name.clone().unwrap_or_else(|| "policy".into());
    let mut recorded = Recorded::new(LoopPolicy::new(name.clone(), policy_loop));
    let result = run::run(&requests, &model, &sim, &mut recorded, Some(initial));
    Ok(report(
        name,
        &result,
        &recorded,
        &sim,
        policy.spec.sla.ttft_percentile,
    ))
}

/// Stage 1: the PlannerPolicy from its file.
fn read_policy(path: &Path) -> Result<PlannerPolicy, WhatIfError> {
    let file = path.display();
    let text =
        std::fs::read_to_string(path).map_err(|e| WhatIfError::Policy(format!("cannot read {file}: {e}")))?;
    let policy: PlannerPolicy = serde_yaml::from_str(&text)
        .map_err(|e| WhatIfError::Policy(format!("{file}: not a PlannerPolicy: {e}")))?;
    Ok(policy)
}

/// Stage 2: the webhook's rules, against a graph of prefill and decode engines of `gpus` GPUs
/// each (one pool of aggregated engines with `aggregated`), named as the policy names them.
fn validate(
    policy: &PlannerPolicy,
    gpus: (u32, u32),
    aggregated: bool,
) -> Result<ValidatedPolicy, WhatIfError> {
    let spec = &policy.spec;
    let name = &spec.target_ref.name;
    let named = spec.components.as_ref();
    let prefill = named
        .and_then(|c| c.prefill.clone())
        .unwrap_or_else(|| "prefill".into());
    let decode = named
        .and_then(|c| c.decode.clone())
        .unwrap_or_else(|| "decode".into());
    let component = |name: &str, kind: &str, gpus: u32| {
        serde_json::json!({
            "name": name,
            "type": kind,
            "replicas": 1,
            "podTemplate": {"spec": {"containers": [{
                "name": "main",
                "image": "what-if",
                "args": ["--served-model-name", "what-if"],
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}},
            }]}},
        })
    };
    let components = if aggregated {
        vec![component(&decode, "worker", gpus.1)]
    } else {
        vec![
            component(&prefill, "prefill", gpus.0),
            component(&decode, "decode", gpus.1),
        ]
    };
    let dgd: DynamoGraphDeployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"components": components},
    }))
    .map_err(|e| WhatIfError::Policy(format!("cannot make a graph for {name}: {e}")))?;
    let graph =
        TargetGraph::try_from(&dgd).map_err(|e| WhatIfError::Policy(format!("cannot make a graph: {e}")))?;
    let namespace = policy
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    validation::validate(spec, &namespace, Some(&graph), &Tenancy::default())
        .map_err(|errors| WhatIfError::Policy(validation::describe(&errors)))
}

/// Stage 3: the profile: `--profile-dir` or `--profile`, else the built-in one the policy names;
/// with the built-in's name, when it is one.
fn read_profile(policy: &PlannerPolicy, args: &WhatIfArgs) -> Result<(Profile, Option<String>), WhatIfError> {
    if let Some(dir) = &args.profile_dir {
        let profile = Profile::from_dir(dir).map_err(|e| WhatIfError::Profile(e.to_string()))?;
        return Ok((profile, None));
    }
    let named = policy.spec.profile.as_ref();
    let name = match (
        &args.profile,
        named.and_then(|p| p.builtin),
        named.and_then(|p| p.config_map_ref.as_ref()),
    ) {
        (Some(name), _, _) => name.clone(),
        (None, Some(builtin), _) => builtin.name().to_string(),
        (None, None, Some(reference)) => {
            return Err(WhatIfError::Profile(format!(
                "spec.profile names ConfigMap {:?}: give --profile-dir with its files (or --profile NAME)",
                reference.name
            )));
        }
        (None, None, None) => {
            return Err(WhatIfError::Profile(
                "the policy names no profile (load mode needs none on a cluster): give --profile NAME or --profile-dir DIR for the simulated engines"
                    .into(),
            ));
        }
    };
    let profile = Profile::builtin(&name).map_err(|e| WhatIfError::Profile(e.to_string()))?;
    Ok((profile, Some(name)))
}

/// GPUs per engine a built-in profile's name carries (`-tpN`).
fn tp_of(name: &str) -> Option<u32> {
    name.rsplit_once("-tp").and_then(|(_, n)| n.parse().ok())
}

/// Stage 4: the trace, rate-scaled.
fn read_trace(path: &Path, rate_scale: f64, jitter_s: f64) -> Result<Vec<trace::Request>, WhatIfError> {
    if !(rate_scale.is_finite() && rate_scale > 0.0) {
        return Err(WhatIfError::Argument(format!(
            "--rate-scale must be a positive number, not {rate_scale}"
        )));
    }
    let requests = trace::load(path).map_err(|e| WhatIfError::Trace(e.to_string()))?;
    Ok(trace::scale(&requests, rate_scale, jitter_s))
}

/// The simulated cluster's scale-up delay.
fn scale_up_delay(args: &WhatIfArgs, validated: &ValidatedPolicy) -> Result<Duration, WhatIfError> {
    match &args.scale_up_delay {
        Some(text) => planner_api::duration::parse_duration(text)
            .map_err(|e| WhatIfError::Argument(format!("--scale-up-delay {text:?}: {e}"))),
        None => Ok(validated
            .scale_up_delay
            .or(validated.expected_scale_up_delay)
            .unwrap_or(planner_core::startup::DEFAULT_SCALE_UP_DELAY)),
    }
}

/// The replicas at the start.
fn initial_replicas(args: &WhatIfArgs, policy: &PlannerPolicy) -> Result<(u32, u32), WhatIfError> {
    let min = |(min, _): (i32, Option<i32>)| u32::try_from(min.max(1)).unwrap_or(1);
    let bounds = &policy.spec.bounds;
    let Some(text) = &args.initial_replicas else {
        return Ok((min(bounds.prefill_range()), min(bounds.decode_range())));
    };
    let parsed = text
        .split_once(',')
        .and_then(|(p, d)| Some((p.trim().parse().ok()?, d.trim().parse().ok()?)));
    parsed.ok_or_else(|| {
        WhatIfError::Argument(format!(
            "--initial-replicas {text:?}: expected PREFILL,DECODE (two whole numbers)"
        ))
    })
}

/// Stage 5: the planning loop as the operator builds it for the policy (without a warm-up
/// trace or Prometheus history: it starts cold), and the replay's settings.
pub fn build(
    policy: &PlannerPolicy,
    validated: &ValidatedPolicy,
    delay: Duration,
) -> (PolicyLoop, SimConfig) {
    let spec = &policy.spec;
    let settings = config::loop_settings(spec, validated, None);
    let (planner, limits, aggregated) = match spec.mode {
        PlannerMode::Load => {
            let load = config::load_config(spec, validated);
            (
                Planner::load(load, validated.target.aggregated),
                load.limits(),
                validated.target.aggregated.then(Default::default),
            )
        }
        PlannerMode::Sla | PlannerMode::Observe => {
            let sla = config::sla_config(spec, validated);
            let (limits, aggregated) = (sla.limits, sla.aggregated);
            (Planner::sla(sla), limits, aggregated)
        }
    };
    let sim = SimConfig {
        interval_s: validated.interval.as_secs_f64(),
        scale_up_delay_s: delay.as_secs_f64(),
        sla: SlaTargets::new(spec.sla.ttft_ms, spec.sla.itl_ms),
        limits,
        aggregated,
        ..SimConfig::default()
    };
    (PolicyLoop::new(planner, settings), sim)
}

/// A loop policy whose decisions are kept, with when they were made.
struct Recorded {
    inner: LoopPolicy,
    decisions: Vec<(f64, Decision)>,
}

impl Recorded {
    fn new(inner: LoopPolicy) -> Self {
        Self {
            inner,
            decisions: Vec::new(),
        }
    }
}

impl<C: PerformanceCurves> Policy<C> for Recorded {
    fn name(&self) -> String {
        Policy::<C>::name(&self.inner)
    }
    fn next_wake_s(&self) -> f64 {
        Policy::<C>::next_wake_s(&self.inner)
    }
    fn wake(&mut self, view: &mut View<'_, C>) -> Option<(u32, u32)> {
        let target = self.inner.wake(view);
        if let Some(decision) = Policy::<C>::last_decision(&self.inner)
            && Policy::<C>::last_check(&self.inner).is_some()
            && decision.target.is_some()
        {
            self.decisions.push((view.now_s, decision.clone()));
        }
        target
    }
    fn applied(&mut self, now_s: f64, from: (u32, u32), to: (u32, u32), serving: (u32, u32)) {
        Policy::<C>::applied(&mut self.inner, now_s, from, to, serving);
    }
}

/// Stage 7: what the replay came to.
fn report(
    policy: String,
    result: &RunResult,
    recorded: &Recorded,
    sim: &SimConfig,
    ttft_percentile: Option<f64>,
) -> Report {
    let summary = &result.summary;
    let pct = |n: usize| {
        if summary.intervals == 0 {
            100.0
        } else {
            100.0 * n as f64 / summary.intervals as f64
        }
    };
    // A 90th-percentile TTFT target is judged on the intervals' 90th percentile.
    let judged_at_p90 = ttft_percentile.is_some_and(|p| (p - 90.0).abs() < 1e-9);
    let intervals_ok = if judged_at_p90 {
        summary.intervals_meeting_p90
    } else {
        summary.intervals_meeting
    };
    let finite = |v: f64| v.is_finite().then_some(v);
    Report {
        policy,
        gpu_hours: summary.gpu_hours,
        intervals_ok_pct: pct(intervals_ok),
        intervals: summary.intervals,
        intervals_ok,
        intervals_ok_p90_pct: pct(summary.intervals_meeting_p90),
        p90_ttft_ms: summary.p90_ttft_ms,
        scale_up_delay_s: sim.scale_up_delay_s,
        per_interval: result
            .intervals
            .iter()
            .map(|i| IntervalLine {
                start_s: i.start_s,
                arrivals: i.arrivals,
                ttft_ms: finite(i.ttft_ms),
                itl_ms: finite(i.itl_ms),
                met: i.meets(&sim.sla),
                prefill: i.prefill,
                decode: i.decode,
                gpus: i.gpus,
            })
            .collect(),
        decisions: recorded
            .decisions
            .iter()
            .filter_map(|(t, d)| {
                Some(DecisionLine {
                    t_s: *t,
                    check: d.check.as_str(),
                    target: d.target?,
                    scaled_to: d.scale_to,
                    limited: d
                        .limitation
                        .as_ref()
                        .filter(|l| l.limited())
                        .map(|l| l.reason.as_str()),
                    message: d.message.clone(),
                })
            })
            .collect(),
    }
}

/// The report as text: the intervals with the decisions made in each, then the totals.
fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>7}  {:>8}  {:>9}  {:>7}  {:>4}  {:>7}  {:>6}  {:>5}",
        "t", "arrivals", "TTFT ms", "ITL ms", "met", "prefill", "decode", "GPUs"
    );
    let mut decisions = report.decisions.iter().peekable();
    for (n, interval) in report.per_interval.iter().enumerate() {
        let end = report
            .per_interval
            .get(n + 1)
            .map_or(f64::INFINITY, |next| next.start_s);
        let number =
            |v: Option<f64>, digits: usize| v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"));
        let _ = writeln!(
            out,
            "{:>6.0}s  {:>8}  {:>9}  {:>7}  {:>4}  {:>7.1}  {:>6.1}  {:>5.1}",
            interval.start_s,
            interval.arrivals,
            number(interval.ttft_ms, 0),
            number(interval.itl_ms, 1),
            interval.met.map_or("-", |m| if m { "yes" } else { "no" }),
            interval.prefill,
            interval.decode,
            interval.gpus
        );
        while let Some(decision) = decisions.next_if(|d| d.t_s < end) {
            let set = match decision.scaled_to {
                Some((p, d)) => format!("set {p}/{d}"),
                None => format!("keep ({}/{} decided)", decision.target.0, decision.target.1),
            };
            let _ = writeln!(
                out,
                "         {:>6.0}s {:<8} {set}: {}",
                decision.t_s, decision.check, decision.message
            );
        }
    }
    let _ = writeln!(
        out,
        "\n{}: {:.2} GPU-hours; {} of {} intervals met the SLA ({:.1} %); p90 TTFT {:.0} ms; scale-up delay {:.0} s",
        report.policy,
        report.gpu_hours,
        report.intervals_ok,
        report.intervals,
        report.intervals_ok_pct,
        report.p90_ttft_ms,
        report.scale_up_delay_s
    );
    out
}
