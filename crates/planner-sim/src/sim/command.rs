//! `planner-sim simulate`: replay traces through the policies, print the comparison
//! tables, write the figures and optionally a Markdown report (what `make bench` commits as
//! `bench/results.md`).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::Instant,
};

use clap::Args;
use serde::Deserialize;

use planner_core::{
    aggregated::{AggregatedEngine, DEFAULT_CHUNK_TOKENS},
    interpolation::{PerformanceCurves, PerformanceModel},
    profile::{Profile, builtin_names},
    sla::{Limits, PoolLimits, SlaTargets},
    state::QueueingConfig,
};

use super::{
    compare,
    latency::{EngineSpec, LatencyModel},
    parallel_map,
    plot::{
        Figure, Point, Tradeoff,
        tradeoff::{Panel, without_twins},
    },
    policy::PolicySpec,
    report,
    run::{RunResult, SimConfig},
    trace,
};

/// Arguments of `simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Request trace: Azure 2023 CSV or Mooncake JSONL (repeatable).
    #[arg(long, value_name = "FILE", required_unless_present = "suite")]
    trace: Vec<PathBuf>,
    /// JSON suite `{"traces": [{"path": ..., "ttft_ms": ..., "itl_ms": ...}]}`; paths are
    /// relative to the suite file, the targets override `--ttft-ms`/`--itl-ms` per trace.
    #[arg(long, value_name = "FILE")]
    suite: Option<PathBuf>,
    /// Built-in profile.
    #[arg(long, value_name = "NAME", required_unless_present = "profile_dir",
          value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    profile: Option<String>,
    /// Upstream profile directory instead of a built-in profile.
    #[arg(long, value_name = "DIR", conflicts_with = "profile")]
    profile_dir: Option<PathBuf>,
    /// Rate scale k: each request becomes k requests (repeatable; fractions allowed).
    #[arg(long = "rate-scale", value_name = "K", default_value = "1")]
    rate_scales: Vec<f64>,
    /// Policies to compare (repeatable; default all). The oracle always runs.
    #[arg(long = "policy", value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(PolicySpec::names()))]
    policies: Vec<String>,
    /// Directory for the figures.
    #[arg(long, value_name = "DIR", default_value = "sim-out")]
    out: PathBuf,
    /// Also write a Markdown report to this file (figures linked relative to it).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Do not draw figures.
    #[arg(long)]
    no_plots: bool,
    /// Planner adjustment interval and reporting interval (s).
    #[arg(long, default_value_t = 60.0)]
    interval_s: f64,
    /// Simulation step (s).
    #[arg(long, default_value_t = 1.0)]
    step_s: f64,
    /// Time from a replica being added to it serving (s; repeatable: every run at each delay).
    /// The `sla-*` policies plan with the delay they measure on their replicas.
    #[arg(long = "scale-up-delay-s", value_name = "S", default_value = "60")]
    scale_up_delays_s: Vec<f64>,
    /// Tell the `sla-*` policies each run's scale-up delay as the one to expect until they
    /// measure one (a PlannerPolicy's `spec.behavior.expectedScaleUpDelay`: a user knows
    /// roughly how long the model takes to load); they plan with the measured delay once there
    /// is one.
    #[arg(long, conflicts_with = "expected_scale_up_delay_s")]
    expect_scale_up_delay: bool,
    /// The scale-up delay the `sla-*` policies expect until they measure one, the same for
    /// every run (s; `spec.behavior.expectedScaleUpDelay`).
    #[arg(long = "expected-scale-up-delay-s", value_name = "S")]
    expected_scale_up_delay_s: Option<f64>,
    /// TTFT target (ms).
    #[arg(long, default_value_t = 500.0)]
    ttft_ms: f64,
    /// ITL target (ms).
    #[arg(long, default_value_t = 50.0)]
    itl_ms: f64,
    /// Fewest replicas per pool.
    #[arg(long, default_value_t = 1)]
    min_replicas: u32,
    /// Most replicas per pool (also the oracle's search bound).
    #[arg(long, default_value_t = 64)]
    max_replicas: u32,
    /// GPU budget of both pools (none by default).
    #[arg(long)]
    max_gpu_budget: Option<u32>,
    /// GPUs per prefill engine (default: the profile name's `-tpN`, else 1).
    #[arg(long)]
    prefill_gpus: Option<u32>,
    /// GPUs per decode engine (default: the profile name's `-tpN`, else 1).
    #[arg(long)]
    decode_gpus: Option<u32>,
    /// Arrival jitter of rate-scaled copies (s).
    #[arg(long, default_value_t = JITTER_S)]
    jitter_s: f64,
    /// Threads (default: available cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// JSON object of queueing-model settings for the `sla-*` policies (planner-core's
    /// `QueueingConfig` fields, by group: `{"margins": {"cold": 1.3}}`; unnamed ones keep their
    /// defaults), to compare settings against the defaults.
    #[arg(long, value_name = "FILE")]
    queueing_config: Option<PathBuf>,
    /// Also write every policy's per-interval records (replicas, cohort latencies, whether the
    /// interval met the SLA) to this CSV file.
    #[arg(long, value_name = "FILE")]
    intervals_csv: Option<PathBuf>,
    /// One pool of aggregated engines (chunked prefill sharing steps with decode) instead of
    /// prefill and decode pools; GPUs per engine are `--decode-gpus`'. Runs the oracle,
    /// `sla-*`, `load-based`, `hpa` and `fixed-peak` (upstream's formulas size two pools).
    #[arg(long)]
    aggregated: bool,
    /// Prompt tokens an aggregated engine's step carries (`max_num_batched_tokens`).
    #[arg(long, default_value_t = DEFAULT_CHUNK_TOKENS, requires = "aggregated")]
    chunk_tokens: f64,
    /// Append the report to `--report`'s file as a section (its headings one level down)
    /// instead of replacing the file.
    #[arg(long, requires = "report")]
    append_report: bool,
}

/// Arrival jitter of rate-scaled copies (s), by default: copies of a request do not arrive in
/// lockstep.
pub(super) const JITTER_S: f64 = 1.0;

/// Why `simulate` failed.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// A profile, trace or suite could not be read.
    #[error("{0}")]
    Input(String),
    /// A figure or the report could not be written.
    #[error("{0}")]
    Output(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Suite {
    traces: Vec<SuiteTrace>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteTrace {
    path: PathBuf,
    #[serde(default)]
    ttft_ms: Option<f64>,
    #[serde(default)]
    itl_ms: Option<f64>,
}

/// Reads a suite file: each trace's path (relative to the suite's directory) and its targets
/// (`default` for those it does not set).
pub(crate) fn read_suite(
    path: &Path,
    default: SlaTargets,
) -> Result<Vec<(PathBuf, SlaTargets)>, SimulateError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| SimulateError::Input(format!("cannot read {}: {e}", path.display())))?;
    let suite: Suite =
        serde_json::from_str(&text).map_err(|e| SimulateError::Input(format!("{}: {e}", path.display())))?;
    let base = path.parent().unwrap_or(Path::new("."));
    Ok(suite
        .traces
        .into_iter()
        .map(|t| {
            let sla = SlaTargets::new(
                t.ttft_ms.unwrap_or(default.ttft_ms),
                t.itl_ms.unwrap_or(default.itl_ms),
            );
            (base.join(t.path), sla)
        })
        .collect())
}

/// Reads queueing-model settings: a JSON object whose fields override the defaults (groups
/// field by field, as [`overlay_queueing`]).
pub(crate) fn read_queueing_config(path: &Path) -> Result<QueueingConfig, SimulateError> {
    let input = |e: String| SimulateError::Input(format!("{}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| input(format!("cannot read: {e}")))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| input(e.to_string()))?;
    overlay_queueing(&QueueingConfig::default(), &value).map_err(input)
}

/// `base` with the settings `overlay` names replaced: a JSON object of `QueueingConfig`'s
/// fields, whose groups (`margins`, `burstiness`, ...) are merged field by field. A setting the
/// model does not have is an error that names it and the valid ones (a misspelt setting would
/// otherwise compare the defaults against themselves).
pub fn overlay_queueing(
    base: &QueueingConfig,
    overlay: &serde_json::Value,
) -> Result<QueueingConfig, String> {
    let mut merged = serde_json::to_value(base).map_err(|e| e.to_string())?;
    merge_settings(&mut merged, overlay, "")?;
    serde_json::from_value(merged).map_err(|e| e.to_string())
}

fn merge_settings(into: &mut serde_json::Value, from: &serde_json::Value, group: &str) -> Result<(), String> {
    let (serde_json::Value::Object(into), serde_json::Value::Object(from)) = (into, from) else {
        return Err(format!(
            "expected a JSON object of settings{}",
            if group.is_empty() {
                String::new()
            } else {
                format!(" for {}", group.trim_end_matches('.'))
            }
        ));
    };
    for (name, value) in from {
        let Some(slot) = into.get_mut(name) else {
            let mut names: Vec<String> = into.keys().map(|k| format!("{group}{k}")).collect();
            names.sort_unstable();
            return Err(format!(
                "unknown setting \"{group}{name}\"; the settings{} are: {}",
                if group.is_empty() {
                    String::new()
                } else {
                    format!(" of {}", group.trim_end_matches('.'))
                },
                names.join(", ")
            ));
        };
        if slot.is_object() {
            merge_settings(slot, value, &format!("{group}{name}."))?;
        } else {
            *slot = value.clone();
        }
    }
    Ok(())
}

/// One trace to run, with its targets.
pub(super) struct TraceJob {
    pub path: PathBuf,
    pub name: String,
    pub sla: SlaTargets,
    pub requests: Vec<trace::Request>,
}

/// One (trace, rate scale, scale-up delay) comparison.
struct Comparison {
    trace: usize,
    k: f64,
    delay_s: f64,
    requests: usize,
    results: Vec<RunResult>,
    seconds: f64,
    load: LoadShape,
}

/// How bursty a run's load is: the prompt tokens arriving per interval, at the 95th percentile
/// and at the peak, over their mean across the trace's intervals (idle ones included).
#[derive(Clone, Copy, Debug, PartialEq)]
struct LoadShape {
    p95: f64,
    peak: f64,
}

impl LoadShape {
    fn of(requests: &[trace::Request], interval_s: f64) -> Self {
        let interval_s = interval_s.max(1e-3);
        let span = requests.iter().map(|r| r.arrival_s).fold(0.0_f64, f64::max);
        let bins = ((span / interval_s).floor() as usize)
            .saturating_add(1)
            .min(1 << 20);
        let mut load = vec![0.0; bins];
        for r in requests {
            let bin = ((r.arrival_s.max(0.0) / interval_s) as usize).min(bins - 1);
            load[bin] += r.isl.max(0.0);
        }
        let mean = load.iter().sum::<f64>() / bins as f64;
        if mean <= 0.0 {
            return Self {
                p95: f64::NAN,
                peak: f64::NAN,
            };
        }
        load.sort_by(f64::total_cmp);
        let at = ((0.95 * (bins - 1) as f64).round() as usize).min(bins - 1);
        Self {
            p95: load[at] / mean,
            peak: load[bins - 1] / mean,
        }
    }
}

/// One policy's numbers in one run of the overview.
pub(crate) struct OverviewCell {
    pub(crate) policy: String,
    pub(crate) gpu_hours: f64,
    pub(crate) intervals_meeting: usize,
    /// GPU-hours relative to the oracle.
    pub(crate) ratio: f64,
    pub(crate) interval_attainment: f64,
    pub(crate) request_attainment: f64,
    /// The 90th-percentile TTFT over all requests relative to the TTFT target.
    pub(crate) p90_ratio: f64,
    /// Intervals whose cohort's 90th-percentile TTFT met the target.
    pub(crate) p90_attainment: f64,
}

impl OverviewCell {
    /// `result`'s numbers, its GPU-hours relative to `reference_gpu_hours`.
    pub(crate) fn of(result: &RunResult, reference_gpu_hours: f64, sla: &SlaTargets) -> Self {
        let summary = &result.summary;
        Self {
            policy: result.policy.clone(),
            gpu_hours: summary.gpu_hours,
            intervals_meeting: summary.intervals_meeting,
            ratio: if reference_gpu_hours > 0.0 {
                summary.gpu_hours / reference_gpu_hours
            } else {
                f64::NAN
            },
            interval_attainment: summary.interval_attainment(),
            request_attainment: summary.request_attainment(),
            p90_ratio: summary.p90_ttft_ms / sla.ttft_ms,
            p90_attainment: summary.interval_p90_attainment(),
        }
    }
}

/// Per run (name), per policy.
pub(crate) type Overview = Vec<(String, Vec<OverviewCell>)>;

/// The overview of every run at one scale-up delay, with each run's load shape and the links
/// to its trade-off figure.
struct DelayOverview {
    delay_s: f64,
    runs: Overview,
    shapes: Vec<LoadShape>,
    figure: String,
}

/// The policy the scorecard judges (the default `mode: sla` with the default predictor) and
/// the baseline it must beat.
pub(super) const SCORED: &str = "sla-arima";
pub(super) const BASELINE: &str = "hpa";
/// The scorecard's cost bar: GPU-hours within this multiple of the oracle's...
pub(super) const SCORE_COST: f64 = 1.3;
/// ...with at least this share of intervals meeting the SLA.
pub(super) const SCORE_INTERVALS: f64 = 0.95;

/// The traces of a suite (paths relative to the suite file, its targets overriding
/// `default_sla` per trace) and of `traces`, read.
pub(super) fn load_traces(
    suite: Option<&Path>,
    traces: &[PathBuf],
    default_sla: SlaTargets,
) -> Result<Vec<TraceJob>, SimulateError> {
    let mut jobs = Vec::new();
    let mut add = |path: PathBuf, sla: SlaTargets| -> Result<(), SimulateError> {
        let requests = trace::load(&path).map_err(|e| SimulateError::Input(e.to_string()))?;
        let name = path
            .file_stem()
            .map_or_else(|| "trace".to_string(), |s| s.to_string_lossy().into_owned());
        jobs.push(TraceJob {
            path,
            name,
            sla,
            requests,
        });
        Ok(())
    };
    if let Some(suite_path) = suite {
        for (path, sla) in read_suite(suite_path, default_sla)? {
            add(path, sla)?;
        }
    }
    for path in traces {
        add(path.clone(), default_sla)?;
    }
    Ok(jobs)
}

/// How the scored policy's run compares with the baseline's, and with the scorecard's bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Fewer intervals met the SLA than the baseline's.
    pub fewer: bool,
    /// More GPU-hours than the baseline's.
    pub dearer: bool,
    /// At least [`SCORE_INTERVALS`] of intervals met the SLA within [`SCORE_COST`]x the
    /// oracle's GPU-hours.
    pub meets: bool,
}

impl Verdict {
    /// `(GPU-hours, intervals meeting the SLA)` of the scored policy and of the baseline, the
    /// scored policy's share of intervals meeting it and its GPU-hours over the oracle's.
    pub fn of(scored: (f64, usize), baseline: (f64, usize), attainment: f64, ratio: f64) -> Self {
        Self {
            fewer: scored.1 < baseline.1,
            dearer: scored.0 > baseline.0,
            meets: attainment >= SCORE_INTERVALS - 1e-9 && ratio <= SCORE_COST + 1e-9,
        }
    }

    /// At least as many intervals for no more GPU-hours.
    pub fn beats(&self) -> bool {
        !self.fewer && !self.dearer
    }
}

/// GPUs per engine from a profile name ending in `-tpN`.
pub(crate) fn gpus_from_name(name: &str) -> Option<u32> {
    name.rsplit_once("-tp").and_then(|(_, n)| n.parse().ok())
}

pub(crate) fn k_label(k: f64) -> String {
    let text = format!("{k}");
    text.trim_end_matches(".0").to_string()
}

/// Runs the command; returns the text printed on standard output. Its stages: read the
/// settings, run every comparison, report.
pub fn simulate(args: &SimulateArgs) -> Result<String, SimulateError> {
    let started = Instant::now();
    let setup = Setup::read(args)?;
    let latency = LatencyModel::new(&setup.model, EngineSpec::from_profile(&setup.profile));
    let comparisons = run_comparisons(args, &setup, &latency);
    report_comparisons(args, &setup, &comparisons, started)
}

/// What `simulate` reads from its arguments.
struct Setup {
    profile: Profile,
    profile_name: String,
    model: PerformanceModel,
    traces: Vec<TraceJob>,
    specs: Vec<PolicySpec>,
    delays: Vec<f64>,
    base_config: SimConfig,
    jobs: usize,
}

impl Setup {
    /// The profile, traces, policies, delays and shared settings, checked.
    fn read(args: &SimulateArgs) -> Result<Self, SimulateError> {
        let (profile, profile_name) = match (&args.profile_dir, &args.profile) {
            (Some(dir), _) => (Profile::from_dir(dir), dir.display().to_string()),
            (None, Some(name)) => (Profile::builtin(name), name.clone()),
            (None, None) => return Err(SimulateError::Input("give --profile or --profile-dir".into())),
        };
        let profile = profile.map_err(|e| SimulateError::Input(e.to_string()))?;
        let model = PerformanceModel::new(&profile).map_err(|e| SimulateError::Input(e.to_string()))?;
        let gpus = args.profile.as_deref().and_then(gpus_from_name).unwrap_or(1);
        let limits = Limits {
            prefill: PoolLimits::new(
                args.min_replicas,
                Some(args.max_replicas.max(args.min_replicas).max(1)),
            ),
            decode: PoolLimits::new(
                args.min_replicas,
                Some(args.max_replicas.max(args.min_replicas).max(1)),
            ),
            max_gpu_budget: args.max_gpu_budget,
            prefill_gpus_per_engine: args.prefill_gpus.unwrap_or(gpus).max(1),
            decode_gpus_per_engine: args.decode_gpus.unwrap_or(gpus).max(1),
            ratio: None,
        };
        let default_sla = SlaTargets::new(args.ttft_ms, args.itl_ms);
        let traces = load_traces(args.suite.as_deref(), &args.trace, default_sla)?;
        let specs = policy_specs(args)?;
        let jobs = args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let queueing = match &args.queueing_config {
            Some(path) => read_queueing_config(path)?,
            None => QueueingConfig::default(),
        };
        let delays = scale_up_delays(args)?;
        let base_config = SimConfig {
            queueing,
            interval_s: args.interval_s,
            step_s: args.step_s,
            scale_up_delay_s: delays[0],
            sla: default_sla,
            limits,
            aggregated: args.aggregated.then_some(AggregatedEngine {
                chunk_tokens: args.chunk_tokens,
            }),
            ..SimConfig::default()
        };
        Ok(Self {
            profile,
            profile_name,
            model,
            traces,
            specs,
            delays,
            base_config,
            jobs,
        })
    }
}

/// The policies compared: the oracle first, then those named (every policy by default); with
/// `--aggregated`, those that plan one pool.
fn policy_specs(args: &SimulateArgs) -> Result<Vec<PolicySpec>, SimulateError> {
    let specs: Vec<PolicySpec> = if args.policies.is_empty() {
        PolicySpec::standard()
    } else {
        let mut specs = vec![PolicySpec::Oracle];
        specs.extend(args.policies.iter().filter_map(|n| PolicySpec::parse(n)));
        specs
    };
    if !args.aggregated {
        return Ok(specs);
    }
    if let Some(two_pools) = specs.iter().find(|s| !s.plans_aggregated())
        && !args.policies.is_empty()
    {
        return Err(SimulateError::Input(format!(
            "--aggregated: policy {} sizes two pools; the aggregated runs take oracle, sla-*, load-based, hpa and fixed-peak",
            two_pools.name()
        )));
    }
    Ok(specs.into_iter().filter(PolicySpec::plans_aggregated).collect())
}

/// The scale-up delays to run at (the default one when none is given), checked.
fn scale_up_delays(args: &SimulateArgs) -> Result<Vec<f64>, SimulateError> {
    let delays = if args.scale_up_delays_s.is_empty() {
        vec![SimConfig::default().scale_up_delay_s]
    } else {
        args.scale_up_delays_s.clone()
    };
    if let Some(bad) = delays.iter().find(|d| !(d.is_finite() && **d >= 0.0)) {
        return Err(SimulateError::Input(format!(
            "--scale-up-delay-s must be a number of seconds >= 0, not {bad}"
        )));
    }
    if let Some(bad) = args
        .expected_scale_up_delay_s
        .filter(|d| !(d.is_finite() && *d >= 0.0))
    {
        return Err(SimulateError::Input(format!(
            "--expected-scale-up-delay-s must be a number of seconds >= 0, not {bad}"
        )));
    }
    Ok(delays)
}

/// Every (trace, k, delay), in parallel, each one's policies sequentially after its oracle
/// (the runs outnumber the cores in the standard comparison).
fn run_comparisons<C: PerformanceCurves + Sync>(
    args: &SimulateArgs,
    setup: &Setup,
    latency: &LatencyModel<'_, C>,
) -> Vec<Comparison> {
    let runs: Vec<(usize, f64, f64)> = setup
        .delays
        .iter()
        .flat_map(|&delay| {
            (0..setup.traces.len()).flat_map(move |t| args.rate_scales.iter().map(move |&k| (t, k, delay)))
        })
        .collect();
    let inner_jobs = if runs.len() >= setup.jobs { 1 } else { setup.jobs };
    parallel_map(&runs, setup.jobs, |&(t, k, delay_s)| {
        let run_started = Instant::now();
        let job = &setup.traces[t];
        let requests = trace::scale(&job.requests, k, args.jitter_s);
        let config = SimConfig {
            sla: job.sla,
            scale_up_delay_s: delay_s,
            expected_scale_up_delay_s: args
                .expected_scale_up_delay_s
                .or(args.expect_scale_up_delay.then_some(delay_s)),
            ..setup.base_config.clone()
        };
        let results = compare(&requests, latency, &config, &setup.specs, inner_jobs);
        Comparison {
            trace: t,
            k,
            delay_s,
            requests: requests.len(),
            results,
            seconds: run_started.elapsed().as_secs_f64(),
            load: LoadShape::of(&requests, args.interval_s),
        }
    })
}

/// What `simulate` prints and writes: the intervals CSV, a table per run, the figures and the
/// Markdown report.
fn report_comparisons(
    args: &SimulateArgs,
    setup: &Setup,
    comparisons: &[Comparison],
    started: Instant,
) -> Result<String, SimulateError> {
    let traces = &setup.traces;
    if let Some(path) = &args.intervals_csv {
        let mut csv = String::from(report::INTERVALS_CSV_HEADER);
        for c in comparisons {
            let job = &traces[c.trace];
            report::intervals_csv(
                &mut csv,
                &job.name,
                &k_label(c.k),
                c.delay_s,
                &job.sla,
                &c.results,
            );
        }
        std::fs::write(path, csv)
            .map_err(|e| SimulateError::Output(format!("cannot write {}: {e}", path.display())))?;
    }
    let mut out = String::new();
    let mut markdown = String::new();
    // One overview per scale-up delay, in the order given; the first one's runs also get
    // figures and a section of the report each.
    let mut overviews: Vec<DelayOverview> = setup
        .delays
        .iter()
        .map(|&delay_s| DelayOverview {
            delay_s,
            runs: Vec::new(),
            shapes: Vec::new(),
            figure: String::new(),
        })
        .collect();
    for c in comparisons {
        report_run(args, setup, c, &mut out, &mut markdown, &mut overviews)?;
    }
    if !args.no_plots {
        for overview in &mut overviews {
            overview.figure = summary_figure(args, overview, &mut out)?;
        }
    }
    let total = started.elapsed().as_secs_f64();
    let _ = writeln!(out, "total: {total:.1} s on {} threads", setup.jobs);
    if let Some(report_path) = &args.report {
        let text = render_report(
            args,
            &setup.profile_name,
            &setup.base_config,
            traces,
            &overviews,
            &markdown,
            total,
            setup.jobs,
        );
        write_report(report_path, text, args.append_report)?;
        let _ = writeln!(out, "report: {}", report_path.display());
    }
    Ok(out)
}

/// One run's table, figures and report section, and its row of its delay's overview.
fn report_run(
    args: &SimulateArgs,
    setup: &Setup,
    c: &Comparison,
    out: &mut String,
    markdown: &mut String,
    overviews: &mut [DelayOverview],
) -> Result<(), SimulateError> {
    let job = &setup.traces[c.trace];
    let delay_note = if setup.delays.len() > 1 {
        format!(", scale-up delay {} s", c.delay_s)
    } else {
        String::new()
    };
    let title = format!(
        "{} at k={} ({} requests), {}, SLA TTFT {} ms / ITL {} ms{delay_note}",
        job.name,
        k_label(c.k),
        c.requests,
        setup.profile_name,
        job.sla.ttft_ms,
        job.sla.itl_ms
    );
    let _ = writeln!(
        out,
        "== {title} ({:.1} s)\n{}",
        c.seconds,
        report::text_table(&c.results)
    );
    let Some(delay_index) = setup.delays.iter().position(|d| *d == c.delay_s) else {
        return Ok(());
    };
    let overview = &mut overviews[delay_index];
    overview.shapes.push(c.load);
    if delay_index == 0 {
        let stem = format!(
            "{}{}-k{}",
            if args.aggregated { "agg-" } else { "" },
            job.name,
            k_label(c.k)
        );
        let figure_links = if args.no_plots {
            String::new()
        } else {
            run_figures(args, &title, &stem, job, c, out)?
        };
        let _ = write!(
            markdown,
            "### {} at k={}\n\n`{}`, {} requests, SLA TTFT {} ms / ITL {} ms; simulated in {:.1} s.\n\n{}\n{}",
            job.name,
            k_label(c.k),
            trace_file(&job.path),
            c.requests,
            job.sla.ttft_ms,
            job.sla.itl_ms,
            c.seconds,
            report::markdown_table(&c.results),
            figure_links
        );
    }
    let oracle = c
        .results
        .iter()
        .find(|r| r.policy == "oracle")
        .map_or(0.0, |r| r.summary.gpu_hours);
    overview.runs.push((
        format!("{} k={}", job.name, k_label(c.k)),
        c.results
            .iter()
            .map(|r| OverviewCell::of(r, oracle, &job.sla))
            .collect(),
    ));
    Ok(())
}

/// A trace as the reports name it: its file name (the path it was read from depends on where
/// the command ran).
pub(crate) fn trace_file(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The trade-off points of one run: every policy's GPU-hours over the oracle's and share of
/// intervals meeting the SLA.
fn tradeoff_points(cells: &[OverviewCell]) -> Vec<Point> {
    without_twins(
        cells
            .iter()
            .map(|c| Point {
                policy: c.policy.clone(),
                cost: c.ratio,
                met: c.interval_attainment,
            })
            .collect(),
    )
}

/// One run's timeline and trade-off figures; returns the report's links to them.
fn run_figures(
    args: &SimulateArgs,
    title: &str,
    stem: &str,
    job: &TraceJob,
    c: &Comparison,
    out: &mut String,
) -> Result<String, SimulateError> {
    let output = |e: super::plot::PlotError| SimulateError::Output(e.to_string());
    let timeline = Figure {
        title: title.to_string(),
        results: &c.results,
        sla: job.sla,
        interval_s: args.interval_s,
    };
    let (png, svg) = timeline.write(&args.out, stem).map_err(output)?;
    let oracle = c
        .results
        .iter()
        .find(|r| r.policy == "oracle")
        .map_or(0.0, |r| r.summary.gpu_hours);
    let cells: Vec<OverviewCell> = c
        .results
        .iter()
        .map(|r| OverviewCell::of(r, oracle, &job.sla))
        .collect();
    let tradeoff = Tradeoff {
        title: format!("{title}: GPU-hours against intervals meeting the SLA"),
        panels: vec![Panel {
            title: format!("{} k={}", job.name, k_label(c.k)),
            points: tradeoff_points(&cells),
        }],
        bar: Some((SCORE_COST, SCORE_INTERVALS)),
    };
    let (trade_png, trade_svg) = tradeoff
        .write(&args.out, &format!("{stem}-tradeoff"))
        .map_err(output)?;
    let _ = writeln!(
        out,
        "figures: {} {} {} {}\n",
        png.display(),
        svg.display(),
        trade_png.display(),
        trade_svg.display()
    );
    let Some(report_path) = &args.report else {
        return Ok(String::new());
    };
    let rel = |p: &Path| relative(p, report_path.parent().unwrap_or(Path::new(".")));
    Ok(format!(
        "![{stem}]({}) ![{stem}-tradeoff]({})\n\n[timeline SVG]({}), [trade-off SVG]({})\n\n",
        rel(&png),
        rel(&trade_png),
        rel(&svg),
        rel(&trade_svg)
    ))
}

/// The trade-off figure of every run at one delay (small multiples); returns the report's
/// link to it (empty without runs).
fn summary_figure(
    args: &SimulateArgs,
    overview: &DelayOverview,
    out: &mut String,
) -> Result<String, SimulateError> {
    if overview.runs.is_empty() {
        return Ok(String::new());
    }
    let kind = if args.aggregated {
        "aggregated engines"
    } else {
        "disaggregated prefill and decode"
    };
    let figure = Tradeoff {
        title: format!(
            "Every run at a {} s scale-up delay ({kind}): GPU-hours against intervals meeting the SLA",
            overview.delay_s
        ),
        panels: overview
            .runs
            .iter()
            .map(|(run, cells)| Panel {
                title: run.clone(),
                points: tradeoff_points(cells),
            })
            .collect(),
        bar: Some((SCORE_COST, SCORE_INTERVALS)),
    };
    let stem = format!(
        "{}tradeoff-{}s",
        if args.aggregated { "agg-" } else { "" },
        k_label(overview.delay_s)
    );
    let (png, svg) = figure
        .write(&args.out, &stem)
        .map_err(|e| SimulateError::Output(e.to_string()))?;
    let _ = writeln!(out, "figures: {} {}", png.display(), svg.display());
    let Some(report_path) = &args.report else {
        return Ok(String::new());
    };
    let rel = |p: &Path| relative(p, report_path.parent().unwrap_or(Path::new(".")));
    Ok(format!("![{stem}]({})\n\n[SVG]({})\n\n", rel(&png), rel(&svg)))
}

/// Writes the report (`append`: one level down, after what the file holds).
fn write_report(path: &Path, text: String, append: bool) -> Result<(), SimulateError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| SimulateError::Output(format!("cannot create {}: {e}", dir.display())))?;
    }
    let text = if append {
        let existing = std::fs::read_to_string(path)
            .map_err(|e| SimulateError::Output(format!("cannot read {}: {e}", path.display())))?;
        let section: String = text
            .lines()
            .map(|line| {
                if line.starts_with('#') {
                    format!("#{line}\n")
                } else {
                    format!("{line}\n")
                }
            })
            .collect();
        format!("{}\n{section}", existing.trim_end())
    } else {
        text
    };
    std::fs::write(path, text)
        .map_err(|e| SimulateError::Output(format!("cannot write {}: {e}", path.display())))
}

/// `path` relative to `base` when it lies under it, else as given.
fn relative(path: &Path, base: &Path) -> String {
    let shown = path.strip_prefix(base).unwrap_or(path);
    shown.display().to_string()
}

#[allow(clippy::too_many_arguments)]
fn render_report(
    args: &SimulateArgs,
    profile: &str,
    config: &SimConfig,
    traces: &[TraceJob],
    overviews: &[DelayOverview],
    sections: &str,
    seconds: f64,
    jobs: usize,
) -> String {
    let mut md = String::new();
    let limits = &config.limits;
    let others: Vec<String> = overviews
        .iter()
        .skip(1)
        .map(|o| format!("{} s", o.delay_s))
        .collect();
    let other_delays = if others.is_empty() {
        String::new()
    } else {
        let told = match (args.expected_scale_up_delay_s, args.expect_scale_up_delay) {
            (Some(expected), _) => {
                format!(
                    "told to expect {expected} s until they measure one (`--expected-scale-up-delay-s`), "
                )
            }
            (None, true) => {
                "told to expect each run's delay until they measure one (`--expect-scale-up-delay`: a \
                 PlannerPolicy's `spec.behavior.expectedScaleUpDelay`), "
                    .to_string()
            }
            (None, false) => String::new(),
        };
        format!(
            "; the overview and the scorecard are repeated below at {} (the `sla-*` policies, {told}plan with \
             the delay they measure on their replicas, as the operator does on a cluster)",
            others.join(" and ")
        )
    };
    if config.aggregated.is_some() {
        let _ = writeln!(md, "# Aggregated engines\n");
        let _ = writeln!(
            md,
            "The same traces with one pool of aggregated engines (prefill in chunks of {} tokens sharing each \
             step with decode, GPUs per engine as decode's; `planner-sim simulate --aggregated`); the prefill and \
             decode columns are that one pool. Policies: the oracle, the SLA planner (`sla-*`, its queueing \
             model sizing the one pool for TTFT and ITL together), the load-based planner (Dynamo's rule for \
             aggregated workers), `hpa` (the larger of its two recommendations) and `fixed-peak`.\n",
            config.aggregated.map_or(DEFAULT_CHUNK_TOKENS, |a| a.chunk_tokens)
        );
    } else {
        let _ = writeln!(md, "# Scaling-quality benchmark\n");
    }
    let _ = writeln!(
        md,
        "Generated by `make bench` (`planner-sim simulate`, release build) in {seconds:.0} s on {jobs} threads. \
         Profile `{profile}` with {} GPU(s) per prefill and {} per decode engine; adjustment and reporting \
         interval {} s; scale-up delay {} s (scale-down immediate){other_delays}; replicas {}..{} per pool{}; \
         simulation step {} s; rate-scaled copies jittered by up to {} s.\n",
        limits.prefill_gpus_per_engine,
        limits.decode_gpus_per_engine,
        config.interval_s,
        config.scale_up_delay_s,
        limits.prefill.min,
        limits.prefill.max.unwrap_or(0),
        limits
            .max_gpu_budget
            .map_or(", no GPU budget".to_string(), |b| format!(", GPU budget {b}")),
        config.step_s,
        args.jitter_s,
    );
    let _ = writeln!(md, "SLA per trace (mean TTFT / mean ITL):\n");
    for t in traces {
        let _ = writeln!(md, "- `{}`: {} ms / {} ms", t.name, t.sla.ttft_ms, t.sla.itl_ms);
    }
    let _ = writeln!(
        md,
        "\nHow to read the tables: **GPU-h** counts every replica asked for, from the request through its \
         start-up delay to its removal. **vs oracle** divides by the oracle's GPU-hours (the oracle knows the next \
         interval's load and picks the fewest replicas for which the simulator's latency model meets the SLA, \
         with no start-up delay: the lower bound). **intervals OK**: share of intervals with arrivals whose \
         arrivals met both targets on average (mean TTFT, token-weighted mean ITL). **requests OK**: share of \
         requests whose own TTFT and mean ITL both met the targets (TTFT OK and ITL OK separately). \
         **actions**: replica changes (per pool). **max P/D**: most prefill/decode replicas asked for. Every \
         policy starts with the oracle's first-interval replicas. `sla-*` is the SLA planner's queueing model \
         (the default) with each predictor; `upstream-*` is upstream's throughput formulas (`spec.sla.model: \
         upstream`). `perfect-prediction` is upstream's formulas (corrections 1.0) fed the actual next-interval \
         load; the gap between it and the oracle is what those formulas and the profile cost, the gap between \
         it and `upstream-*` is what prediction costs. **p90 intervals OK**: share of intervals whose arrivals' \
         90th-percentile TTFT met the target (and mean ITL did); **p90 TTFT**: over all requests.\n"
    );
    if let Some(first) = overviews.first() {
        md.push_str(&scorecard(&first.runs, &first.shapes, ""));
        md.push_str(&first.figure);
        md.push_str(&overview_tables(&first.runs, "", "oracle"));
    }
    for other in overviews.iter().skip(1) {
        let _ = writeln!(
            md,
            "## At a {} s scale-up delay\n\nThe same runs with replicas serving {} s after they are asked for.\n",
            other.delay_s, other.delay_s
        );
        md.push_str(&scorecard(&other.runs, &other.shapes, "#"));
        md.push_str(&other.figure);
        md.push_str(&overview_tables(&other.runs, "#", "oracle"));
    }
    let _ = writeln!(md, "## Runs\n\n{sections}");
    md
}

/// The overview and tail tables of one set of runs; `deeper` is prepended to their headings.
/// A policy whose cells equal an earlier policy's in every run is shown once (said under the
/// table).
pub(crate) fn overview_tables(overview: &Overview, deeper: &str, reference: &str) -> String {
    let mut md = String::new();
    let Some((_, first)) = overview.first() else {
        return md;
    };
    type Table = (String, fn(&OverviewCell) -> String);
    let tables: [Table; 2] = [
        (
            format!(
                "## Overview: GPU-hours vs {reference} / intervals meeting the SLA / requests meeting it\n"
            ),
            |c| {
                format!(
                    "{} / {} / {}",
                    report::ratio(c.ratio),
                    report::share(c.interval_attainment),
                    report::share(c.request_attainment)
                )
            },
        ),
        (
            "## Tail: 90th-percentile TTFT of all requests / TTFT target, and intervals whose \
             arrivals' 90th-percentile TTFT met the target (and whose mean ITL did)\n\n\
             `inf`: more than a tenth of the run's requests never got a first token before the \
             run ended.\n"
                .to_string(),
            |c| {
                let ratio = if c.p90_ratio.is_finite() {
                    format!("{:.2}x", c.p90_ratio)
                } else {
                    "inf".into()
                };
                format!("{ratio} / {}", report::share(c.p90_attainment))
            },
        ),
    ];
    for (title, cell) in tables {
        let _ = writeln!(md, "{deeper}{title}");
        let _ = write!(md, "| policy |");
        for (run, _) in overview {
            let _ = write!(md, " {run} |");
        }
        let _ = write!(md, "\n|---|");
        for _ in overview {
            let _ = write!(md, "---:|");
        }
        md.push('\n');
        let rows: Vec<(String, Vec<String>)> = first
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let cells = overview
                    .iter()
                    .map(|(_, cells)| cells.get(i).map_or_else(String::new, cell))
                    .collect();
                (row.policy.clone(), cells)
            })
            .collect();
        let (kept, same) = report::collapse(rows);
        for (policy, cells) in kept {
            let _ = writeln!(md, "| {policy} | {} |", cells.join(" | "));
        }
        md.push_str(&report::same_note(&same));
        md.push('\n');
    }
    md
}

/// The default policy against the baseline and the oracle, run by run; empty when either
/// policy did not run.
fn scorecard(overview: &Overview, shapes: &[LoadShape], deeper: &str) -> String {
    let find = |cells: &[OverviewCell], name: &str| cells.iter().position(|c| c.policy == name);
    let Some((_, first)) = overview.first() else {
        return String::new();
    };
    if find(first, SCORED).is_none() || find(first, BASELINE).is_none() {
        return String::new();
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{deeper}## Scorecard: `{SCORED}` (the default `mode: sla`) against `{BASELINE}` and the oracle\n\n\
         **beats {BASELINE}**: meets the SLA in at least as many intervals as `{BASELINE}` for no more \
         GPU-hours (otherwise which of the two it misses). **{:.0} % / {SCORE_COST}x**: meets it in at least \
         {:.0} % of intervals with at most {SCORE_COST}x the oracle's GPU-hours. **prompt load p95 / peak**: \
         the prompt tokens arriving per interval at the 95th percentile and at the peak, over their mean \
         across the trace: the burstier the load, the more a policy without foresight pays or misses.\n",
        SCORE_INTERVALS * 100.0,
        SCORE_INTERVALS * 100.0,
    );
    let _ = writeln!(
        md,
        "| run | {SCORED} | {BASELINE} | beats {BASELINE} | {:.0} % / {SCORE_COST}x | prompt load p95 / peak |\n\
         |---|---:|---:|:---:|:---:|---:|",
        SCORE_INTERVALS * 100.0
    );
    let (mut beats, mut good, mut runs) = (0, 0, 0);
    for ((run, cells), shape) in overview.iter().zip(shapes) {
        let (Some(scored), Some(baseline)) = (
            find(cells, SCORED).map(|i| &cells[i]),
            find(cells, BASELINE).map(|i| &cells[i]),
        ) else {
            continue;
        };
        runs += 1;
        let Verdict { fewer, dearer, meets } = Verdict::of(
            (scored.gpu_hours, scored.intervals_meeting),
            (baseline.gpu_hours, baseline.intervals_meeting),
            scored.interval_attainment,
            scored.ratio,
        );
        let verdict = match (fewer, dearer) {
            (false, false) => {
                beats += 1;
                "yes".to_string()
            }
            (true, false) => "no: fewer intervals".to_string(),
            (false, true) => "no: more GPU-hours".to_string(),
            (true, true) => "no: both".to_string(),
        };
        if meets {
            good += 1;
        }
        let cell = |c: &OverviewCell| {
            format!(
                "{} / {}",
                report::ratio(c.ratio),
                report::share(c.interval_attainment)
            )
        };
        let _ = writeln!(
            md,
            "| {run} | {} | {} | {verdict} | {} | {:.1}x / {:.1}x |",
            cell(scored),
            cell(baseline),
            if meets { "yes" } else { "no" },
            shape.p95,
            shape.peak,
        );
    }
    let _ = writeln!(
        md,
        "\n`{SCORED}` beats `{BASELINE}` on {beats} of {runs} runs and meets {:.0} % / {SCORE_COST}x on {good} \
         of {runs}.\n",
        SCORE_INTERVALS * 100.0
    );
    md
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(gpus_from_name("h100-llama3.3-70b-tp4"), Some(4));
        assert_eq!(gpus_from_name("custom"), None);
        assert_eq!(k_label(4.0), "4");
        assert_eq!(k_label(1.5), "1.5");
        assert_eq!(relative(Path::new("bench/a.png"), Path::new("bench")), "a.png");
    }

    /// `simulate` as the command line would call it.
    fn simulate_with(extra: &[&str]) -> Result<String, SimulateError> {
        let trace = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../planner-core/tests/fixtures/mooncake_tiny.jsonl"
        );
        simulate_trace(trace, extra)
    }

    /// `simulate` of `trace` as the command line would call it.
    fn simulate_trace(trace: &str, extra: &[&str]) -> Result<String, SimulateError> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: SimulateArgs,
        }
        let mut argv = vec![
            "simulate",
            "--trace",
            trace,
            "--profile",
            "h100-llama3.3-70b-tp4",
            "--no-plots",
            "--jobs",
            "1",
            "--ttft-ms",
            "2000",
        ];
        argv.extend_from_slice(extra);
        let cli = <Cli as clap::Parser>::try_parse_from(argv).unwrap();
        simulate(&cli.args)
    }

    #[test]
    fn aggregated_runs_append_their_own_section_and_refuse_two_pool_policies() {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("results.md");
        let report_arg = report.to_str().unwrap();
        simulate_with(&["--policy", "hpa", "--report", report_arg]).unwrap();
        let disaggregated = std::fs::read_to_string(&report).unwrap();
        let out = simulate_with(&[
            "--aggregated",
            "--policy",
            "sla-arima",
            "--policy",
            "hpa",
            "--report",
            report_arg,
            "--append-report",
        ])
        .unwrap();
        assert!(out.contains("sla-arima"), "{out}");
        let both = std::fs::read_to_string(&report).unwrap();
        // What was there stays as it was; the aggregated runs follow one heading level down.
        assert!(both.starts_with(disaggregated.trim_end()), "{both}");
        let section = &both[disaggregated.trim_end().len()..];
        assert!(section.contains("\n## Aggregated engines\n"), "{section}");
        assert!(section.contains("\n### Overview"), "{section}");
        assert!(!section.contains("\n# "), "{section}");
        let error = simulate_with(&["--aggregated", "--policy", "upstream-arima"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("upstream-arima sizes two pools"), "{error}");
    }

    #[test]
    fn queueing_settings_override_the_defaults_and_unknown_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.json");
        std::fs::write(
            &path,
            r#"{"stabilisation": {"window_s": 120}, "decode_kv": {"sigmas": 1.0}}"#,
        )
        .unwrap();
        let read = read_queueing_config(&path).unwrap();
        let defaults = QueueingConfig::default();
        assert_eq!(read.stabilisation.window_s, 120.0);
        assert_eq!(read.stabilisation.quantile, defaults.stabilisation.quantile);
        assert_eq!(read.decode_kv.sigmas, 1.0);
        assert_eq!(read.margins, defaults.margins);

        std::fs::write(&path, r#"{"stabilisation": {"window": 120}}"#).unwrap();
        let error = read_queueing_config(&path).unwrap_err().to_string();
        assert!(
            error.contains("unknown setting \"stabilisation.window\""),
            "{error}"
        );
        assert!(error.contains("stabilisation.window_s"), "{error}");
        std::fs::write(&path, r#"{"kv_sigmas": 1.0}"#).unwrap();
        let error = read_queueing_config(&path).unwrap_err().to_string();
        assert!(error.contains("decode_kv, fast_path"), "{error}");
        std::fs::write(&path, "[1]").unwrap();
        let error = read_queueing_config(&path).unwrap_err().to_string();
        assert!(error.contains("expected a JSON object"), "{error}");
        std::fs::write(&path, r#"{"margins": 2}"#).unwrap();
        let error = read_queueing_config(&path).unwrap_err().to_string();
        assert!(error.contains("for margins"), "{error}");
        std::fs::write(&path, r#"{"decode_kv": {"sigmas": "many"}}"#).unwrap();
        assert!(read_queueing_config(&path).is_err());
    }

    #[test]
    fn the_intervals_csv_has_a_row_per_policy_and_interval_and_settings_reach_the_planner() {
        let dir = tempfile::tempdir().unwrap();
        let csv_path = dir.path().join("intervals.csv");
        let csv_arg = csv_path.to_str().unwrap();
        let run = |settings: Option<&str>| {
            let mut extra = vec!["--policy", "sla-arima", "--intervals-csv", csv_arg];
            let settings_path = dir.path().join("q.json");
            if let Some(settings) = settings {
                std::fs::write(&settings_path, settings).unwrap();
                extra.extend(["--queueing-config", settings_path.to_str().unwrap()]);
            }
            simulate_with(&extra).unwrap();
            std::fs::read_to_string(&csv_path).unwrap()
        };
        let defaults = run(None);
        let mut lines = defaults.lines();
        assert_eq!(
            lines.next().unwrap(),
            "trace,k,policy,start_s,arrivals,mean_isl,mean_osl,prefill,decode,prefill_serving,decode_serving,gpus,ttft_ms,itl_ms,meets,delay_s"
        );
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        let of = |policy: &str| rows.iter().filter(|r| r[2] == policy).count();
        assert!(of("oracle") >= 1, "{defaults}");
        assert_eq!(of("oracle"), of("sla-arima"), "{defaults}");
        assert!(
            rows.iter()
                .all(|r| r.len() == 16 && r[0] == "mooncake_tiny" && r[1] == "1" && r[15] == "60")
        );
        // The tiny trace's requests all arrive in the first interval, which met the SLA.
        assert_eq!(rows[0][4].parse::<usize>().unwrap(), 16, "{defaults}");
        assert_eq!(rows[0][14], "1", "{defaults}");
        // A decode pool sized for ten standard deviations of KV demand is larger: the settings
        // reach the planner (which plans from its first interval with requests: here, on five
        // minutes of two 8k-token prompts a second).
        let trace = dir.path().join("steady.jsonl");
        let lines: String = (0..600)
            .map(|i| {
                format!(
                    "{{\"timestamp\": {}, \"input_length\": 8000, \"output_length\": 300}}\n",
                    i * 500
                )
            })
            .collect();
        std::fs::write(&trace, lines).unwrap();
        let run = |settings: Option<&str>| {
            let mut extra = vec!["--policy", "sla-arima", "--intervals-csv", csv_arg];
            let settings_path = dir.path().join("q.json");
            if let Some(settings) = settings {
                std::fs::write(&settings_path, settings).unwrap();
                extra.extend(["--queueing-config", settings_path.to_str().unwrap()]);
            }
            simulate_trace(trace.to_str().unwrap(), &extra).unwrap();
            std::fs::read_to_string(&csv_path).unwrap()
        };
        let defaults = run(None);
        let wide = run(Some(r#"{"decode_kv": {"sigmas": 10.0}}"#));
        let decode = |csv: &str| -> f64 {
            csv.lines()
                .skip(1)
                .filter(|l| l.split(',').nth(2) == Some("sla-arima"))
                .map(|l| l.split(',').nth(8).unwrap().parse::<f64>().unwrap())
                .sum()
        };
        assert!(decode(&wide) > decode(&defaults), "{defaults}\n{wide}");
    }

    #[test]
    fn every_delay_gets_its_overview_and_scorecard() {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("report.md");
        let csv = dir.path().join("intervals.csv");
        let (report_arg, csv_arg) = (report.to_str().unwrap(), csv.to_str().unwrap());
        let out = simulate_with(&[
            "--policy",
            "sla-arima",
            "--policy",
            "hpa",
            "--scale-up-delay-s",
            "60",
            "--scale-up-delay-s",
            "300",
            "--report",
            report_arg,
            "--intervals-csv",
            csv_arg,
        ])
        .unwrap();
        assert!(out.contains("scale-up delay 300 s"), "{out}");
        let md = std::fs::read_to_string(&report).unwrap();
        assert!(
            md.contains("scale-up delay 60 s (scale-down immediate); the overview"),
            "{md}"
        );
        assert!(md.contains("## At a 300 s scale-up delay"), "{md}");
        assert_eq!(md.matches("## Scorecard").count(), 2, "{md}");
        assert_eq!(md.matches("### Scorecard").count(), 1, "{md}");
        // One detailed section per run, at the first delay only.
        assert_eq!(md.matches("### mooncake_tiny at k=1").count(), 1, "{md}");
        let rows = std::fs::read_to_string(&csv).unwrap();
        let delays: std::collections::BTreeSet<&str> = rows
            .lines()
            .skip(1)
            .filter_map(|l| l.rsplit(',').next())
            .collect();
        assert_eq!(delays.into_iter().collect::<Vec<_>>(), ["300", "60"]);
        assert!(simulate_with(&["--scale-up-delay-s=-1"]).is_err());
    }

    fn request(arrival_s: f64, isl: f64) -> trace::Request {
        trace::Request {
            arrival_s,
            isl,
            osl: 1.0,
        }
    }

    #[test]
    fn load_shape_counts_idle_intervals_in_the_mean() {
        // Four 60 s intervals carrying 100, 0, 100 and 600 prompt tokens: mean 200.
        let requests = [
            request(10.0, 100.0),
            request(130.0, 60.0),
            request(170.0, 40.0),
            request(185.0, 600.0),
        ];
        let shape = LoadShape::of(&requests, 60.0);
        assert!((shape.peak - 3.0).abs() < 1e-12, "{shape:?}");
        assert!((shape.p95 - 3.0).abs() < 1e-12, "{shape:?}");
        assert!(LoadShape::of(&[], 60.0).peak.is_nan());
    }

    fn cell(policy: &str, gpu_hours: f64, intervals_meeting: usize, of: usize) -> OverviewCell {
        OverviewCell {
            policy: policy.into(),
            gpu_hours,
            intervals_meeting,
            ratio: gpu_hours / 10.0,
            interval_attainment: intervals_meeting as f64 / of as f64,
            request_attainment: 1.0,
            p90_ratio: 1.0,
            p90_attainment: 1.0,
        }
    }

    #[test]
    fn the_scorecard_says_which_bar_each_run_misses() {
        let shape = LoadShape { p95: 2.8, peak: 4.3 };
        let overview: Overview = vec![
            // Fewer GPU-hours and as many intervals: beats; 1.2x and 96 %: meets.
            (
                "a k=1".into(),
                vec![
                    cell("oracle", 10.0, 50, 50),
                    cell(SCORED, 12.0, 48, 50),
                    cell(BASELINE, 13.0, 48, 50),
                ],
            ),
            // Cheaper but fewer intervals.
            (
                "b k=1".into(),
                vec![
                    cell("oracle", 10.0, 50, 50),
                    cell(SCORED, 12.0, 40, 50),
                    cell(BASELINE, 13.0, 45, 50),
                ],
            ),
            // As many intervals, dearer, and past 1.3x.
            (
                "c k=1".into(),
                vec![
                    cell("oracle", 10.0, 50, 50),
                    cell(SCORED, 14.0, 45, 50),
                    cell(BASELINE, 13.0, 45, 50),
                ],
            ),
        ];
        let md = scorecard(&overview, &[shape; 3], "");
        assert!(
            md.contains("| a k=1 | 1.20x / 96% | 1.30x / 96% | yes | yes | 2.8x / 4.3x |"),
            "{md}"
        );
        assert!(
            md.contains("| b k=1 | 1.20x / 80% | 1.30x / 90% | no: fewer intervals | no |"),
            "{md}"
        );
        assert!(
            md.contains("| c k=1 | 1.40x / 90% | 1.30x / 90% | no: more GPU-hours | no |"),
            "{md}"
        );
        assert!(
            md.contains("beats `hpa` on 1 of 3 runs and meets 95 % / 1.3x on 1 of 3."),
            "{md}"
        );
        // Without both policies there is nothing to judge.
        let partial: Overview = vec![("a k=1".into(), vec![cell("oracle", 10.0, 50, 50)])];
        assert!(scorecard(&partial, &[shape], "").is_empty());
    }
}
