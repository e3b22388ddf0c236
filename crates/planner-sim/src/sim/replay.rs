//! The two ends of `make bench-replay`, which runs the bench's traces through NVIDIA Dynamo's
//! offline replay (its mocker engines, router and planner; `tools/replay/`):
//!
//! - `planner-sim replay-traces` writes what the replay reads: every bench run's requests
//!   (exactly those the simulator replays, rate-scaled copies included) as Mooncake JSONL, the
//!   profile as the mocker's timing tables, and a manifest with each run's targets, the
//!   replicas the simulator's oracle starts with and the fixed pool sized for its peak.
//! - `planner-sim replay-report` reads what each replay returned (per request: arrival,
//!   lengths, TTFT, mean ITL; the pools' workers over time) and scores it as `make bench`
//!   scores the simulator's runs ([`super::run::summarize`]), into a Markdown report.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use clap::Args;
use serde::{Deserialize, Serialize};

use planner_core::{
    interpolation::PerformanceModel,
    profile::{Profile, builtin_names},
    sla::{Limits, PoolLimits, SlaTargets},
};
use planner_sim_engine::mocker::MockerTables;

use super::{
    command::{Overview, OverviewCell, gpus_from_name, k_label, overview_tables, read_suite},
    latency::{EngineSpec, LatencyModel},
    policy::Oracle,
    report,
    run::{self, IntervalRecord, Outcomes, RunResult, SimConfig, Summary},
    trace,
};

/// Block size of the hash ids written (Mooncake's own: one id per 512 prompt tokens).
pub const HASH_BLOCK_TOKENS: f64 = 512.0;
/// KV-cache block size of the mocker engines (vLLM's default on the mocker).
pub const KV_BLOCK_TOKENS: u32 = 64;

/// Arguments of `planner-sim replay-traces`.
#[derive(Debug, Args)]
pub struct ReplayTracesArgs {
    /// The bench suite (`bench/suite.json`): traces and their targets.
    #[arg(long, value_name = "FILE")]
    suite: PathBuf,
    /// Built-in profile the engines are timed by and the policies plan with.
    #[arg(long, value_name = "NAME",
          value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    profile: String,
    /// Rate scales (repeatable), as for `simulate`.
    #[arg(long = "rate-scale", value_name = "K", default_value = "1")]
    rate_scales: Vec<f64>,
    /// Arrival jitter of rate-scaled copies (s), as for `simulate`.
    #[arg(long, default_value_t = 1.0)]
    jitter_s: f64,
    /// Adjustment and reporting interval (s).
    #[arg(long, default_value_t = 60.0)]
    interval_s: f64,
    /// The engines' context length (tokens): the served model's; longer prompts are refused.
    #[arg(long, default_value_t = 131_072)]
    max_model_len: u32,
    /// Keep only the first this many seconds of each trace (a short replay, for CI).
    #[arg(long, value_name = "S")]
    max_duration_s: Option<f64>,
    /// Output directory: the traces, `perf_data.npz` and `manifest.json`.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// What `replay-traces` wrote, for the harness and the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The profile.
    pub profile: String,
    /// Adjustment and reporting interval (s).
    pub interval_s: f64,
    /// GPUs per prefill and per decode engine.
    pub gpus: [u32; 2],
    /// The mocker's timing tables, relative to the manifest.
    pub perf_data: String,
    /// Engine settings of both pools, from the profile.
    pub engine: EngineSettings,
    /// Each (trace, rate scale).
    pub runs: Vec<ManifestRun>,
}

/// The mocker engines' settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// KV-cache blocks of one engine: the profile's KV capacity.
    pub num_gpu_blocks: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Tokens one forward pass may prefill: the longest profiled prompt, so that a prompt
    /// up to it is timed as the profile measured it, and a longer one in chunks of it (as
    /// the latency model extends the profile, linearly).
    pub max_num_batched_tokens: u32,
    /// Context length.
    pub max_model_len: u32,
    /// GPUs per engine (the replay's GPU-hours).
    pub tensor_parallel_size: u32,
}

/// One run of the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestRun {
    /// `trace k=K`.
    pub name: String,
    /// The trace's name.
    pub trace: String,
    /// Rate scale.
    pub k: f64,
    /// The source trace.
    pub source: String,
    /// The Mooncake JSONL the replay reads, relative to the manifest.
    pub file: String,
    /// Requests in it.
    pub requests: usize,
    /// Targets (mean TTFT and ITL, ms).
    pub ttft_ms: f64,
    /// See `ttft_ms`.
    pub itl_ms: f64,
    /// Intervals the trace spans.
    pub intervals: usize,
    /// Replicas every autoscaled policy starts with (the simulator's oracle's first interval).
    pub initial: [u32; 2],
    /// The fixed pool: the simulator's oracle's peak replicas of each pool.
    pub fixed_peak: [u32; 2],
    /// The simulator's oracle's GPU-hours on the same requests (for comparison).
    pub sim_oracle_gpu_hours: f64,
    /// The simulator's oracle's replicas (prefill, decode) interval by interval: the
    /// `oracle-schedule` policy asks for each a start-up delay ahead.
    #[serde(default)]
    pub oracle_schedule: Vec<[u32; 2]>,
    /// Dynamo's planner in `optimization_target: load`: the thresholds a user reads off the
    /// profile for this run's targets ([`DynamoLoadThresholds::for_run`]).
    pub dynamo_load: DynamoLoadThresholds,
}

/// The four thresholds Dynamo's `load` mode requires of its user (its `PlannerConfig` field
/// names). Dynamo ships no defaults for them; these follow from the targets and the profile
/// by a rule a user can apply by hand, stated in docs/replay.md.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamoLoadThresholds {
    /// One prefill worker more when any engine has this many prompt tokens queued: what one
    /// engine prefills in the TTFT target at its profiled throughput on the longest prompt.
    pub prefill_scale_up_queue_tokens: u64,
    /// One fewer when every engine has at most this many queued: a tenth of the above (the
    /// ratio of Dynamo's default `throughput` thresholds).
    pub prefill_scale_down_queue_tokens: u64,
    /// One decode worker more above this KV-cache use (%): the profile's best throughput
    /// meeting the ITL target at the run's mean context (prompt and half the output).
    pub decode_scale_up_kv_rate: f64,
    /// One fewer when every engine is below this (%): half the above, so that removing one of
    /// two workers does not land above it.
    pub decode_scale_down_kv_rate: f64,
}

impl DynamoLoadThresholds {
    /// The thresholds for targets `sla` on engines of `gpus` GPUs serving requests of mean
    /// context `context_tokens`.
    pub fn for_run(curves: &PerformanceModel, gpus: u32, sla: &SlaTargets, context_tokens: f64) -> Self {
        use planner_core::interpolation::PerformanceCurves;
        let longest = curves.max_profiled_isl().unwrap_or(f64::NAN);
        let tokens_per_s = curves.prefill_thpt_per_gpu(longest) * f64::from(gpus.max(1));
        let up = (tokens_per_s * sla.ttft_ms / 1000.0).round().max(2.0);
        let kv = curves.decode_best_point(sla.itl_ms, context_tokens).kv_usage;
        let kv_up = (kv * 100.0).clamp(2.0, 100.0);
        Self {
            prefill_scale_up_queue_tokens: up as u64,
            prefill_scale_down_queue_tokens: (up / 10.0).floor() as u64,
            decode_scale_up_kv_rate: (kv_up * 10.0).round() / 10.0,
            decode_scale_down_kv_rate: (kv_up * 5.0).round() / 10.0,
        }
    }
}

/// Replicas from a time-averaged count that is whole (the oracle's replicas serve from the
/// start of each interval).
fn whole(replicas: f64) -> u32 {
    if replicas.is_finite() && replicas > 0.0 {
        replicas.round() as u32
    } else {
        0
    }
}

/// Why a replay command failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// An input file is missing or not valid.
    #[error("{0}")]
    Input(String),
    /// An output could not be written.
    #[error("{0}")]
    Output(String),
}

#[derive(Deserialize)]
struct HashIds {
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// One line of the Mooncake JSONL the replay reads.
#[derive(Serialize)]
struct MooncakeLine<'a> {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    hash_ids: &'a [u64],
}

/// Writes the traces, the timing tables and the manifest; returns a summary line per run.
pub fn replay_traces(args: &ReplayTracesArgs) -> Result<String, ReplayError> {
    let input = |e: String| ReplayError::Input(e);
    let output =
        |path: &Path, e: String| ReplayError::Output(format!("cannot write {}: {e}", path.display()));
    let profile = Profile::builtin(&args.profile).map_err(|e| input(e.to_string()))?;
    let curves = PerformanceModel::new(&profile).map_err(|e| input(e.to_string()))?;
    let spec = EngineSpec::from_profile(&profile);
    let latency = LatencyModel::new(&curves, spec);
    let gpus = gpus_from_name(&args.profile).unwrap_or(1);
    std::fs::create_dir_all(&args.out).map_err(|e| output(&args.out, e.to_string()))?;

    let npz = args.out.join("perf_data.npz");
    let profiled_context = profile.decode.context_length.iter().copied().fold(0.0, f64::max);
    let tables = MockerTables::sample(&latency, profiled_context, f64::from(args.max_model_len));
    crate::mocker_profile::write_npz(&tables, &npz).map_err(|e| output(&npz, e))?;

    let limits = Limits {
        prefill: PoolLimits::new(1, Some(64)),
        decode: PoolLimits::new(1, Some(64)),
        max_gpu_budget: None,
        prefill_gpus_per_engine: gpus,
        decode_gpus_per_engine: gpus,
        ratio: None,
    };
    let mut runs = Vec::new();
    let mut out = String::new();
    for (path, sla) in
        read_suite(&args.suite, SlaTargets::new(500.0, 50.0)).map_err(|e| input(e.to_string()))?
    {
        let name = path
            .file_stem()
            .map_or_else(|| "trace".to_string(), |s| s.to_string_lossy().into_owned());
        let text = std::fs::read_to_string(&path)
            .map_err(|e| input(format!("cannot read {}: {e}", path.display())))?;
        let (requests, order) =
            trace::parse_ordered(&text, &path.display().to_string()).map_err(|e| input(e.to_string()))?;
        let hashes = mooncake_hashes(&text, &path)?;
        for &k in &args.rate_scales {
            let mut scaled = trace::scale_indexed(&requests, k, args.jitter_s);
            if let Some(limit) = args.max_duration_s {
                scaled.retain(|s| s.request.arrival_s < limit);
            }
            let file = format!("{name}-k{}.jsonl", k_label(k));
            let file_path = args.out.join(&file);
            write_trace(&file_path, &scaled, &order, hashes.as_deref()).map_err(|e| output(&file_path, e))?;
            let config = SimConfig {
                interval_s: args.interval_s,
                sla,
                limits,
                ..SimConfig::default()
            };
            let just_requests: Vec<trace::Request> = scaled.iter().map(|s| s.request).collect();
            let context = if just_requests.is_empty() {
                f64::NAN
            } else {
                just_requests.iter().map(|r| r.isl + r.osl / 2.0).sum::<f64>() / just_requests.len() as f64
            };
            let oracle = run::run(&just_requests, &latency, &config, &mut Oracle::default(), None);
            let run = ManifestRun {
                name: format!("{name} k={}", k_label(k)),
                trace: name.clone(),
                k,
                source: path.display().to_string(),
                file,
                requests: scaled.len(),
                ttft_ms: sla.ttft_ms,
                itl_ms: sla.itl_ms,
                intervals: oracle.intervals.len(),
                initial: [oracle.initial.0, oracle.initial.1],
                fixed_peak: [oracle.summary.max_prefill, oracle.summary.max_decode],
                sim_oracle_gpu_hours: oracle.summary.gpu_hours,
                oracle_schedule: oracle
                    .intervals
                    .iter()
                    .map(|i| [whole(i.prefill), whole(i.decode)])
                    .collect(),
                dynamo_load: DynamoLoadThresholds::for_run(&curves, gpus, &sla, context),
            };
            let _ = writeln!(
                out,
                "{}: {} requests, {} intervals, starts at {}P/{}D, fixed pool {}P/{}D",
                run.name,
                run.requests,
                run.intervals,
                run.initial[0],
                run.initial[1],
                run.fixed_peak[0],
                run.fixed_peak[1]
            );
            runs.push(run);
        }
    }
    let block = f64::from(KV_BLOCK_TOKENS);
    let manifest = Manifest {
        profile: args.profile.clone(),
        interval_s: args.interval_s,
        gpus: [gpus, gpus],
        perf_data: "perf_data.npz".into(),
        engine: EngineSettings {
            num_gpu_blocks: (profile.decode.max_kv_tokens / block).floor().max(1.0) as u32,
            block_size: KV_BLOCK_TOKENS,
            max_num_batched_tokens: ((spec.max_profiled_isl / block).ceil() * block).max(block) as u32,
            max_model_len: args.max_model_len,
            tensor_parallel_size: gpus,
        },
        runs,
    };
    let path = args.out.join("manifest.json");
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| output(&path, e.to_string()))?;
    std::fs::write(&path, text).map_err(|e| output(&path, e.to_string()))?;
    let _ = writeln!(out, "wrote {}", path.display());
    Ok(out)
}

/// The hash ids of a Mooncake trace's records, in file order; `None` for another format.
fn mooncake_hashes(text: &str, path: &Path) -> Result<Option<Vec<Vec<u64>>>, ReplayError> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty()).peekable();
    if !lines.peek().is_some_and(|l| l.starts_with('{')) {
        return Ok(None);
    }
    lines
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str::<HashIds>(line)
                .map(|h| h.hash_ids)
                .map_err(|e| {
                    ReplayError::Input(format!("{}: record {}: hash_ids: {e}", path.display(), i + 1))
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Writes the replay's trace. A Mooncake request keeps its prefix hashes, shifted per copy so
/// that copies share prefixes as the originals did among themselves, not with each other; a
/// request of a trace without hashes gets fresh ones (no prefix reuse).
fn write_trace(
    path: &Path,
    scaled: &[trace::Scaled],
    order: &[usize],
    hashes: Option<&[Vec<u64>]>,
) -> Result<(), String> {
    use std::io::Write as _;
    let span = hashes
        .map(|all| all.iter().flatten().copied().max().map_or(0, |m| m + 1))
        .unwrap_or(0);
    let file = std::fs::File::create(path).map_err(|e| e.to_string())?;
    let mut writer = std::io::BufWriter::new(file);
    let mut fresh = 0u64;
    let mut ids: Vec<u64> = Vec::new();
    for s in scaled {
        ids.clear();
        match hashes.and_then(|all| order.get(s.source).and_then(|&line| all.get(line))) {
            Some(own) => ids.extend(own.iter().map(|id| id + s.copy * span)),
            None => {
                let blocks = (s.request.isl / HASH_BLOCK_TOKENS).ceil().max(1.0) as u64;
                ids.extend(fresh..fresh + blocks);
                fresh += blocks;
            }
        }
        let line = MooncakeLine {
            // Milliseconds, to the microsecond (rate-scaled copies are jittered within a second).
            timestamp: (s.request.arrival_s * 1e6).round() / 1e3,
            input_length: s.request.isl.round().max(1.0) as u64,
            output_length: s.request.osl.round().max(1.0) as u64,
            hash_ids: &ids,
        };
        serde_json::to_writer(&mut writer, &line).map_err(|e| e.to_string())?;
        writer.write_all(b"\n").map_err(|e| e.to_string())?;
    }
    writer.flush().map_err(|e| e.to_string())
}

/// Arguments of `planner-sim replay-report`.
#[derive(Debug, Args)]
pub struct ReplayReportArgs {
    /// The manifest `replay-traces` wrote.
    #[arg(long, value_name = "FILE")]
    manifest: PathBuf,
    /// Directory of the replays' results (`<run file stem>/<policy>.json`; default `results`
    /// beside the manifest).
    #[arg(long, value_name = "DIR")]
    results: Option<PathBuf>,
    /// The Markdown report to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// The command that produced the results, for the report's header.
    #[arg(long, value_name = "TEXT", default_value = "make bench-replay")]
    command: String,
    /// Also write every policy's per-interval records to this CSV file (as `simulate`'s).
    #[arg(long, value_name = "FILE")]
    intervals_csv: Option<PathBuf>,
    /// Fail unless this policy changed the replicas in every run (repeatable): a check that
    /// its decisions reached the replay.
    #[arg(long, value_name = "POLICY")]
    expect_scaling: Vec<String>,
}

/// One replay's outcome, as `tools/replay/bench_replay.py` writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayResult {
    /// Policy name in reports.
    pub policy: String,
    /// What ran it (the bridge's command, Dynamo's planner configuration).
    pub description: String,
    /// Dynamo's version (`ai-dynamo`).
    pub dynamo_version: String,
    /// Scale-up delay of the mocker engines (s).
    pub startup_s: f64,
    /// Dynamo's router (`kv_router` or `round_robin`).
    pub router: String,
    /// Wall time of the replay (s).
    pub wall_s: f64,
    /// Per request: arrival (ms), prompt and output tokens, TTFT (ms), mean ITL (ms), 1 when
    /// completed; `null` for what the replay did not measure (a TTFT never reached, the ITL of
    /// a one-token response).
    pub requests: Vec<[Option<f64>; 6]>,
    /// The pools over time: `[t_s, pool (0 prefill, 1 decode), active, starting, draining]`
    /// from t = 0, one row per change.
    pub timeline: Vec<[f64; 5]>,
}

/// The report's reference for GPU-hours and the policies its scorecard compares.
const REFERENCE: &str = "fixed-peak";
const SCORED: &str = "sla-arima";
/// The scored policy with its GPU budget set to Dynamo's default mode's mean GPUs.
const CAPPED: &str = "sla-arima-capped";
/// The simulator's oracle's schedule replayed: what meeting the SLA costs in Dynamo's engines.
const ORACLE: &str = "oracle-schedule";
/// Share of intervals above which a schedule "meets the SLA in most intervals".
const MOST: f64 = 0.5;
/// Dynamo's planner as shipped (its default mode) first, then the others compared.
const BASELINES: [&str; 4] = ["dynamo-throughput", "dynamo-latency", "dynamo-load", "hpa"];

/// Scores the replays into the report; returns the text to print.
pub fn replay_report(args: &ReplayReportArgs) -> Result<String, ReplayError> {
    let manifest: Manifest = read_json(&args.manifest)?;
    let base = args.manifest.parent().unwrap_or(Path::new("."));
    let results_dir = args.results.clone().unwrap_or_else(|| base.join("results"));
    let mut gathered = Gathered::new();
    for run in &manifest.runs {
        let dir = results_dir.join(run.file.trim_end_matches(".jsonl"));
        let replays = read_run(&dir, run, &manifest)?;
        check_run(&dir, run, &replays.results, &args.expect_scaling)?;
        gathered.add(run, &replays);
    }
    if let Some(path) = &args.intervals_csv {
        std::fs::write(path, &gathered.csv)
            .map_err(|e| ReplayError::Output(format!("cannot write {}: {e}", path.display())))?;
    }
    let md = render_report(args, &manifest, &gathered);
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| ReplayError::Output(format!("cannot create {}: {e}", dir.display())))?;
    }
    std::fs::write(&args.out, md)
        .map_err(|e| ReplayError::Output(format!("cannot write {}: {e}", args.out.display())))?;
    let mut out = gathered.out;
    let _ = writeln!(out, "report: {}", args.out.display());
    Ok(out)
}

/// Reads a JSON file; the error names it.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ReplayError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ReplayError::Input(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| ReplayError::Input(format!("{}: {e}", path.display())))
}

/// One run's replays, read and scored.
struct RunReplays {
    /// What each replay returned, in file-name order.
    replays: Vec<ReplayResult>,
    /// Each scored, in the tables' order ([`policy_rank`]).
    results: Vec<RunResult>,
    /// The policies the harness left out of the run (`<policy>.failed`), and why.
    failed: Vec<(String, String)>,
}

/// Reads the replays of `run` from `dir` (`<policy>.json`, `<policy>.failed`) and scores each.
fn read_run(dir: &Path, run: &ManifestRun, manifest: &Manifest) -> Result<RunReplays, ReplayError> {
    let all: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(Result::ok).map(|e| e.path()).collect(),
        Err(e) => return Err(ReplayError::Input(format!("cannot read {}: {e}", dir.display()))),
    };
    let mut entries: Vec<PathBuf> = all
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .cloned()
        .collect();
    entries.sort();
    let mut failed: Vec<(String, String)> = all
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "failed"))
        .map(|p| {
            let policy = p
                .file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
            let why = std::fs::read_to_string(p).unwrap_or_default().trim().to_string();
            (policy, why)
        })
        .collect();
    failed.sort();
    let mut replays = Vec::new();
    let mut results = Vec::new();
    for path in entries {
        let result: ReplayResult = read_json(&path)?;
        results.push(score(&result, run, manifest)?);
        replays.push(result);
    }
    results.sort_by_key(|r| policy_rank(&r.policy));
    Ok(RunReplays {
        replays,
        results,
        failed,
    })
}

/// Fails when the scored policy has no replay in the run, or a policy of `--expect-scaling`
/// did not run or never changed the replicas.
fn check_run(
    dir: &Path,
    run: &ManifestRun,
    results: &[RunResult],
    expect_scaling: &[String],
) -> Result<(), ReplayError> {
    if !results.iter().any(|r| r.policy == SCORED) {
        return Err(ReplayError::Input(format!(
            "{}: no `{SCORED}` replay to score",
            dir.display()
        )));
    }
    for policy in expect_scaling {
        let actions = results
            .iter()
            .find(|r| &r.policy == policy)
            .map(|r| r.summary.scaling_actions);
        if actions.is_none_or(|a| a == 0) {
            return Err(ReplayError::Input(format!(
                "{}: `{policy}` {} (--expect-scaling)",
                run.name,
                if actions.is_some() {
                    "never changed the replicas"
                } else {
                    "did not run"
                }
            )));
        }
    }
    Ok(())
}

/// What the report gathers run by run.
struct Gathered {
    /// The text printed: each run's table.
    out: String,
    /// The per-interval records of every run (`--intervals-csv`).
    csv: String,
    /// Each run's cells, for the overview tables and the scorecard.
    overview: Overview,
    /// Each run's section of the report.
    sections: String,
    /// The intervals the scored policy missed and another met.
    losses: String,
    /// The replays the harness left out, one line each.
    not_run: String,
    /// Dynamo's versions, start-up delays (in first-seen order) and routers of the replays.
    versions: BTreeMap<String, ()>,
    startups: Vec<f64>,
    routers: BTreeMap<String, ()>,
}

impl Gathered {
    fn new() -> Self {
        Self {
            out: String::new(),
            csv: String::from(report::INTERVALS_CSV_HEADER),
            overview: Vec::new(),
            sections: String::new(),
            losses: String::new(),
            not_run: String::new(),
            versions: BTreeMap::new(),
            startups: Vec::new(),
            routers: BTreeMap::new(),
        }
    }

    /// Adds one run's replays.
    fn add(&mut self, run: &ManifestRun, replays: &RunReplays) {
        for (policy, why) in &replays.failed {
            let _ = writeln!(self.not_run, "- **{}**, `{policy}`: {why}", run.name);
        }
        for replay in &replays.replays {
            self.versions.insert(replay.dynamo_version.clone(), ());
            if !self.startups.contains(&replay.startup_s) {
                self.startups.push(replay.startup_s);
            }
            self.routers.insert(replay.router.clone(), ());
        }
        let results = &replays.results;
        let sla = SlaTargets::new(run.ttft_ms, run.itl_ms);
        let startup = replays.replays.first().map_or(f64::NAN, |r| r.startup_s);
        report::intervals_csv(&mut self.csv, &run.trace, &k_label(run.k), startup, &sla, results);
        let reference = results
            .iter()
            .find(|r| r.policy == REFERENCE)
            .map_or(f64::NAN, |r| r.summary.gpu_hours);
        let _ = writeln!(
            self.out,
            "== {} ({} requests)\n{}",
            run.name,
            run.requests,
            report::text_table_against(results, REFERENCE)
        );
        self.sections.push_str(&run_section(run, replays));
        self.losses.push_str(&lost_intervals(run, results));
        self.overview.push((
            run.name.clone(),
            results
                .iter()
                .map(|r| OverviewCell::of(r, reference, &sla))
                .collect(),
        ));
    }
}

/// A run's section: its settings, the replays' wall times and its table.
fn run_section(run: &ManifestRun, replays: &RunReplays) -> String {
    let mut walls: Vec<String> = replays
        .replays
        .iter()
        .map(|r| format!("{} {:.1} s", r.policy, r.wall_s))
        .collect();
    walls.sort();
    format!(
        "### {}\n\n`{}`, {} requests ({} intervals), SLA TTFT {} ms / ITL {} ms; autoscaled policies start at \
         {}P/{}D, `fixed-peak` runs {}P/{}D (the simulator's oracle's peak; the oracle costs {:.2} GPU-h in the \
         simulator). Replay wall time: {}.\n\n{}\n",
        run.name,
        super::command::trace_file(Path::new(&run.source)),
        run.requests,
        run.intervals,
        run.ttft_ms,
        run.itl_ms,
        run.initial[0],
        run.initial[1],
        run.fixed_peak[0],
        run.fixed_peak[1],
        run.sim_oracle_gpu_hours,
        walls.join(", "),
        report::markdown_table_against(&replays.results, REFERENCE),
    )
}

/// The Markdown report: how the replays ran, the policies, the overview, the scorecard, the
/// lost intervals and each run's section.
fn render_report(args: &ReplayReportArgs, manifest: &Manifest, gathered: &Gathered) -> String {
    let mut md = String::new();
    md.push_str(&report_header(args, manifest, gathered));
    md.push_str(&policies_text());
    if !gathered.not_run.is_empty() {
        let _ = writeln!(
            md,
            "**Replays that did not complete** (left out of their run's tables; the harness tries each again when \
             Dynamo's replay stops on its own internal check):\n\n{}",
            gathered.not_run
        );
    }
    md.push_str(&overview_tables(&gathered.overview, "", REFERENCE));
    md.push_str(&scorecard(&gathered.overview));
    if !gathered.losses.is_empty() {
        let _ = writeln!(
            md,
            "## Where `{SCORED}` misses an interval another policy meets\n\nEach interval `{SCORED}` missed while \
             `{}` or `hpa` met it: arrivals, their mean prompt length, the replicas asked for and serving \
             (time-averaged, prefill/decode) and the cohort's mean TTFT, for `{SCORED}` and the policy that met it.\n\n{}",
            BASELINES[0], gathered.losses
        );
    }
    let _ = writeln!(md, "## Runs\n\n{}", gathered.sections);
    md
}

/// The title and how the replays ran: Dynamo's version, the router, the engines, the start-up
/// delay and the command.
fn report_header(args: &ReplayReportArgs, manifest: &Manifest, gathered: &Gathered) -> String {
    let mut md = String::new();
    let version = gathered.versions.keys().cloned().collect::<Vec<_>>().join(", ");
    let router = gathered.routers.keys().cloned().collect::<Vec<_>>().join(", ");
    let startup = gathered
        .startups
        .iter()
        .map(|s| format!("{s} s"))
        .collect::<Vec<_>>()
        .join(" / ");
    let _ = writeln!(md, "# Scaling quality in NVIDIA Dynamo's offline replay\n");
    let _ = writeln!(
        md,
        "Generated by `{}` with Dynamo {version} (`ai-dynamo`, `ai-dynamo-runtime`): every bench trace replayed by \
         Dynamo's mocker engines and router (`dynamo._core.run_mocker_trace_replay`, router `{router}`), with the \
         engines timed by \
         profile `{}` (`planner-sim mocker-profile`: prefill by prompt length, decode by KV load and context), \
         {} GPUs per prefill and per decode engine, {} KV blocks of {} tokens per engine, prefill forward passes of \
         up to {} tokens, context {} tokens; new workers serve {startup} after they are asked for. Adjustment and \
         reporting interval {} s.\n",
        args.command,
        manifest.profile,
        manifest.gpus[0],
        manifest.engine.num_gpu_blocks,
        manifest.engine.block_size,
        manifest.engine.max_num_batched_tokens,
        manifest.engine.max_model_len,
        manifest.interval_s,
    );
    md
}

/// What each policy is, and what the columns mean.
fn policies_text() -> String {
    format!(
        "Policies: `{SCORED}` is this project's default (`mode: sla`, queueing model, ARIMA) and `hpa` the \
         simulator's HPA-style policy, both asked through `planner-sim bridge` (the simulator's policy code, fed \
         the replay's metrics every second); `{CAPPED}` is `{SCORED}` held to the GPU-hours `{}` spent on the \
         same run (its GPU budget set every second from what is left of them). `{ORACLE}` is the simulator's \
         oracle's replicas interval by interval, each asked for a start-up delay ahead. `dynamo-throughput` is Dynamo 1.6.1's planner in its default mode \
         (`optimization_target: throughput`), `dynamo-latency` in its latency mode and `dynamo-load` in its \
         `load` mode with thresholds read off the profile for the run's targets (one prefill worker more when an \
         engine has queued what it prefills in the TTFT target; one decode worker more above the KV use of the \
         profile's best throughput meeting the ITL target), all three run by the replay itself; its `sla` mode \
         cannot run here (its sizing is AISimulate's performance model, and `aisimulate`, which `ai-dynamo` \
         requires, is a placeholder on PyPI that downloads from NVIDIA's own index: without it every tick reports \
         `model_not_ready` and nothing scales; docs/replay.md). `fixed-peak` is a fixed pool of the simulator's \
         oracle's peak replicas. The columns are `make bench`'s: **GPU-h** counts every worker from the request \
         for it to the end of its draining, over the trace's intervals; **vs {REFERENCE}** divides by the fixed \
         pool's; **intervals OK** is the share of intervals whose arrivals met both targets on average.\n\n",
        BASELINES[0]
    )
}

/// Order in the tables: the scored policy (free, then capped), Dynamo's, the HPA, the fixed
/// pool, then others.
fn policy_rank(policy: &str) -> (usize, String) {
    let rank = [
        SCORED,
        CAPPED,
        BASELINES[0],
        BASELINES[1],
        BASELINES[2],
        BASELINES[3],
        ORACLE,
        REFERENCE,
    ]
    .iter()
    .position(|p| *p == policy)
    .unwrap_or(usize::MAX);
    (rank, policy.to_string())
}

/// One replay scored as `make bench` scores a simulated run.
pub fn score(
    result: &ReplayResult,
    run: &ManifestRun,
    manifest: &Manifest,
) -> Result<RunResult, ReplayError> {
    let interval = manifest.interval_s;
    if !(interval.is_finite() && interval > 0.0) {
        return Err(ReplayError::Input(format!(
            "interval_s must be positive, not {interval}"
        )));
    }
    let mut rows: Vec<[f64; 6]> = result
        .requests
        .iter()
        .map(|r| r.map(|v| v.unwrap_or(f64::NAN)))
        .collect();
    rows.sort_by(|a, b| a[0].total_cmp(&b[0]));
    let requests: Vec<trace::Request> = rows
        .iter()
        .map(|r| trace::Request {
            arrival_s: r[0] / 1000.0,
            isl: r[1],
            osl: r[2].max(1.0),
        })
        .collect();
    let mut outcomes = Outcomes::new(requests.len());
    for (i, r) in rows.iter().enumerate() {
        let done = r[5] >= 0.5;
        let gaps = (r[2] - 1.0).max(0.0);
        outcomes.done[i] = done;
        outcomes.ttft_s[i] = if r[3].is_finite() {
            r[3] / 1000.0
        } else {
            f64::INFINITY
        };
        if r[4].is_finite() && gaps > 0.0 {
            outcomes.itl_sum_s[i] = r[4] / 1000.0 * gaps;
            outcomes.tokens[i] = gaps;
        }
    }
    let span = requests
        .last()
        .map_or(0, |r| (r.arrival_s / interval).floor() as usize + 1);
    let gpus = [f64::from(manifest.gpus[0]), f64::from(manifest.gpus[1])];
    let pools = Pools::from_timeline(&result.timeline);
    let mut records: Vec<IntervalRecord> = (0..span)
        .map(|i| {
            let (from, to) = (i as f64 * interval, (i + 1) as f64 * interval);
            let asked = [
                pools.mean(0, from, to, Count::Asked),
                pools.mean(1, from, to, Count::Asked),
            ];
            let billed = [
                pools.mean(0, from, to, Count::Billed),
                pools.mean(1, from, to, Count::Billed),
            ];
            IntervalRecord {
                start_s: from,
                arrivals: 0,
                mean_isl: f64::NAN,
                mean_osl: f64::NAN,
                prefill: asked[0],
                decode: asked[1],
                gpus: billed[0] * gpus[0] + billed[1] * gpus[1],
                prefill_serving: pools.mean(0, from, to, Count::Serving),
                decode_serving: pools.mean(1, from, to, Count::Serving),
                ttft_ms: f64::NAN,
                itl_ms: f64::NAN,
            }
        })
        .collect();
    let config = SimConfig {
        interval_s: interval,
        sla: SlaTargets::new(run.ttft_ms, run.itl_ms),
        ..SimConfig::default()
    };
    let summary = run::summarize(&requests, &outcomes, &mut records, &config, interval);
    let gpu_hours = records.iter().map(|r| r.gpus * interval).sum::<f64>() / 3600.0;
    let (actions, max, decisions) = pools.actions();
    Ok(RunResult {
        policy: result.policy.clone(),
        intervals: records,
        summary: Summary {
            gpu_hours,
            scaling_actions: actions,
            max_prefill: max[0],
            max_decode: max[1],
            ..summary
        },
        initial: pools.initial(),
        decisions,
    })
}

#[derive(Clone, Copy)]
enum Count {
    /// Active and starting: the replicas asked for.
    Asked,
    /// Active.
    Serving,
    /// Active, starting and draining: the workers holding GPUs.
    Billed,
}

/// Each pool's workers as a step function of time.
struct Pools {
    /// Per pool: `(t_s, active, starting, draining)`, from t = 0, by time.
    steps: [Vec<(f64, f64, f64, f64)>; 2],
}

impl Pools {
    fn from_timeline(timeline: &[[f64; 5]]) -> Self {
        let mut steps: [Vec<(f64, f64, f64, f64)>; 2] = [Vec::new(), Vec::new()];
        let mut rows = timeline.to_vec();
        rows.sort_by(|a, b| a[0].total_cmp(&b[0]));
        for row in rows {
            let pool = usize::from(row[1] >= 0.5).min(1);
            let step = (row[0].max(0.0), row[2].max(0.0), row[3].max(0.0), row[4].max(0.0));
            match steps[pool].last_mut() {
                // Several changes at one instant: the last one holds.
                Some(last) if (last.0 - step.0).abs() < 1e-9 => *last = step,
                _ => steps[pool].push(step),
            }
        }
        Self { steps }
    }

    fn count(step: &(f64, f64, f64, f64), count: Count) -> f64 {
        match count {
            Count::Asked => step.1 + step.2,
            Count::Serving => step.1,
            Count::Billed => step.1 + step.2 + step.3,
        }
    }

    /// Time-average of `count` over `[from, to)`.
    fn mean(&self, pool: usize, from: f64, to: f64, count: Count) -> f64 {
        let steps = &self.steps[pool];
        let mut total = 0.0;
        for (i, step) in steps.iter().enumerate() {
            let start = step.0.max(from);
            let end = steps.get(i + 1).map_or(to, |next| next.0).min(to);
            if end > start {
                total += Self::count(step, count) * (end - start);
            }
        }
        if to > from { total / (to - from) } else { f64::NAN }
    }

    fn initial(&self) -> (u32, u32) {
        let first = |pool: usize| {
            self.steps[pool]
                .first()
                .map_or(0, |s| Self::count(s, Count::Asked).round() as u32)
        };
        (first(0), first(1))
    }

    /// Changes of the replicas asked for (per pool), the most asked for, and each change.
    fn actions(&self) -> Actions {
        let mut actions = 0;
        let mut max = [0u32; 2];
        let mut changes: Vec<(f64, usize, u32)> = Vec::new();
        for (pool, (steps, most)) in self.steps.iter().zip(max.iter_mut()).enumerate() {
            let mut last: Option<u32> = None;
            for step in steps {
                let asked = Self::count(step, Count::Asked).round() as u32;
                *most = (*most).max(asked);
                if last.is_some_and(|l| l != asked) {
                    actions += 1;
                    changes.push((step.0, pool, asked));
                }
                last = Some(asked);
            }
        }
        changes.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut now = self.initial();
        let decisions = changes
            .into_iter()
            .map(|(t, pool, asked)| {
                if pool == 0 {
                    now.0 = asked;
                } else {
                    now.1 = asked;
                }
                (t, now)
            })
            .collect();
        (actions, max, decisions)
    }
}

/// Replica changes (per pool), the most replicas asked for per pool, and each change's time
/// with the replicas asked for after it.
type Actions = (usize, [u32; 2], Vec<(f64, (u32, u32))>);

/// The scored policy against each baseline, run by run.
fn scorecard(overview: &Overview) -> String {
    let find = |cells: &[OverviewCell], name: &str| cells.iter().position(|c| c.policy == name);
    let mut md = format!(
        "## Scorecard: `{SCORED}` against Dynamo's planner and `hpa`\n\n**beats X**: meets the SLA in at least as \
         many intervals as X for no more GPU-hours (otherwise which of the two it misses). Cells: GPU-hours vs \
         `{REFERENCE}` / intervals meeting the SLA.\n\n| run | {SCORED} |"
    );
    for b in BASELINES {
        let _ = write!(md, " {b} | beats {b} |");
    }
    md.push_str("\n|---|---:|");
    for _ in BASELINES {
        md.push_str("---:|:---:|");
    }
    md.push('\n');
    let mut wins = [0usize; BASELINES.len()];
    let mut runs = 0;
    for (run, cells) in overview {
        let Some(scored) = find(cells, SCORED).map(|i| &cells[i]) else {
            continue;
        };
        runs += 1;
        let _ = write!(md, "| {run} | {} |", cell(scored));
        for (b, name) in BASELINES.iter().enumerate() {
            match find(cells, name).map(|i| &cells[i]) {
                Some(baseline) => {
                    let verdict = verdict(scored, baseline);
                    if verdict == "yes" {
                        wins[b] += 1;
                    }
                    let _ = write!(md, " {} | {verdict} |", cell(baseline));
                }
                None => md.push_str(" - | - |"),
            }
        }
        md.push('\n');
    }
    let counts: Vec<String> = BASELINES
        .iter()
        .zip(wins)
        .enumerate()
        .map(|(i, (b, w))| {
            if i == 0 {
                format!("`{b}` on {w} of {runs} runs")
            } else {
                format!("`{b}` on {w}")
            }
        })
        .collect();
    let counts = match counts.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => counts.join(""),
    };
    let _ = writeln!(md, "\n`{SCORED}` beats {counts}.\n");
    md.push_str(&same_gpus(overview));
    md.push_str(&cost_of_meeting(overview));
    md
}

/// What meeting the SLA costs in Dynamo's engines: the simulator's oracle's schedule replayed,
/// against `dynamo-throughput`'s GPU-hours, run by run.
fn cost_of_meeting(overview: &Overview) -> String {
    let dynamo = BASELINES[0];
    if !overview
        .iter()
        .any(|(_, cells)| find_cell(cells, ORACLE).is_some())
    {
        return String::new();
    }
    let mut md = format!(
        "## What meeting the SLA costs in Dynamo's engines\n\n`{ORACLE}` replays the simulator's oracle's \
         replicas interval by interval (sized by this project's latency model for the arrivals each interval \
         actually brings), each interval's asked for a start-up delay ahead and released when the interval ends. \
         It is not a lower bound in Dynamo's engines (its sizes come from another engine model), but where it \
         meets the SLA in most intervals (over {:.0} %) it shows what that costs there; where it costs more \
         GPU-hours than `{dynamo}`, `{dynamo}`'s GPU-hours buy a schedule that misses the SLA. Cells: GPU-hours vs \
         `{REFERENCE}` / intervals meeting the SLA.\n\n| run | {ORACLE} | {SCORED} | {dynamo} | `{ORACLE}` \
         GPU-hours / `{dynamo}`'s | reading |\n|---|---:|---:|---:|---:|---|\n",
        MOST * 100.0
    );
    let mut dearer = Vec::new();
    let mut runs = 0;
    for (run, cells) in overview {
        let (Some(oracle), Some(baseline)) = (find_cell(cells, ORACLE), find_cell(cells, dynamo)) else {
            continue;
        };
        runs += 1;
        let ratio = oracle.gpu_hours / baseline.gpu_hours;
        let reading = if oracle.interval_attainment <= MOST {
            format!(
                "the oracle's sizes fall short in these engines ({:.0} % of intervals): no evidence",
                oracle.interval_attainment * 100.0
            )
        } else if oracle.gpu_hours > baseline.gpu_hours {
            dearer.push(run.clone());
            format!(
                "meeting {:.0} % costs {ratio:.2}x `{dynamo}`'s GPU-hours, which meet {:.0} %",
                oracle.interval_attainment * 100.0,
                baseline.interval_attainment * 100.0
            )
        } else {
            format!(
                "meeting {:.0} % fits in `{dynamo}`'s GPU-hours",
                oracle.interval_attainment * 100.0
            )
        };
        let _ = writeln!(
            md,
            "| {run} | {} | {} | {} | {ratio:.2} | {reading} |",
            cell(oracle),
            find_cell(cells, SCORED).map_or_else(|| "-".into(), cell),
            cell(baseline)
        );
    }
    let list = if dearer.is_empty() {
        "none".to_string()
    } else {
        dearer.join(", ")
    };
    let _ = writeln!(
        md,
        "\nRuns where a schedule meeting the SLA in most intervals costs more GPU-hours than `{dynamo}`: {} of \
         {runs} ({list}).\n",
        dearer.len()
    );
    md
}

/// The cell of `policy` in one run of the overview.
fn find_cell<'a>(cells: &'a [OverviewCell], policy: &str) -> Option<&'a OverviewCell> {
    cells.iter().find(|c| c.policy == policy)
}

/// A cell of the scorecards: GPU-hours against the reference / intervals meeting the SLA.
fn cell(c: &OverviewCell) -> String {
    format!("{:.2}x / {:.0}%", c.ratio, c.interval_attainment * 100.0)
}

/// Whether `scored` beats `baseline` (as many intervals for no more GPU-hours), or which of
/// the two it misses.
fn verdict(scored: &OverviewCell, baseline: &OverviewCell) -> &'static str {
    let fewer = scored.intervals_meeting < baseline.intervals_meeting;
    let dearer = scored.gpu_hours > baseline.gpu_hours;
    match (fewer, dearer) {
        (false, false) => "yes",
        (true, false) => "no: fewer intervals",
        (false, true) => "no: more GPU-hours",
        (true, true) => "no: both",
    }
}

/// GPU-hours per interval meeting the SLA, or a dash when none does.
fn per_interval_met(c: &OverviewCell) -> String {
    if c.intervals_meeting == 0 {
        "- (0 met)".into()
    } else {
        format!("{:.2}", c.gpu_hours / c.intervals_meeting as f64)
    }
}

/// What the strict scorecard leaves out: what each policy pays per interval it meets, and
/// the scored policy held to Dynamo's default mode's GPU-hours through its own GPU budget.
fn same_gpus(overview: &Overview) -> String {
    let dynamo = BASELINES[0];
    let mut md = format!(
        "## At the same GPU-hours: `{CAPPED}` against `{dynamo}`\n\nA policy that saves GPU-hours by missing the SLA \
         loses nothing in the strict rule above. Here, per run: each policy's **GPU-hours per interval meeting the \
         SLA**, and `{CAPPED}`, the same default policy held to the GPU-hours `{dynamo}` spent on that run: its GPU \
         budget (`maxGpuBudget`) is set every second to one engine per pool plus the whole engines that what is \
         left of those GPU-hours pays for over the next 5 minutes, so it may spend on a burst what it saved in a \
         calm spell: how many intervals it meets with no more GPU-hours than `{dynamo}`. Cells of `{CAPPED}`: GPU-hours vs `{REFERENCE}` / \
         intervals.\n\n| run | {SCORED} | {CAPPED} |"
    );
    for b in BASELINES {
        let _ = write!(md, " {b} |");
    }
    let _ = writeln!(md, " `{CAPPED}` / `{dynamo}` | `{CAPPED}` beats `{dynamo}` |");
    md.push_str("|---|---:|---:|");
    for _ in BASELINES {
        md.push_str("---:|");
    }
    md.push_str("---:|:---:|\n");
    let mut meets = Vec::new();
    let mut capped_wins = Vec::new();
    let mut runs = 0;
    for (run, cells) in overview {
        let Some(scored) = find_cell(cells, SCORED) else {
            continue;
        };
        runs += 1;
        let capped = find_cell(cells, CAPPED);
        let baseline = find_cell(cells, dynamo);
        let _ = write!(
            md,
            "| {run} | {} | {} |",
            per_interval_met(scored),
            capped.map_or_else(|| "-".into(), per_interval_met)
        );
        for b in BASELINES {
            let _ = write!(
                md,
                " {} |",
                find_cell(cells, b).map_or_else(|| "-".into(), per_interval_met)
            );
        }
        match (capped, baseline) {
            (Some(c), Some(d)) => {
                let v = verdict(c, d);
                if v == "yes" {
                    capped_wins.push(run.clone());
                }
                let _ = writeln!(md, " {} against {} | {v} |", cell(c), cell(d));
            }
            _ => md.push_str(" - | - |\n"),
        }
        if baseline.is_some_and(|d| verdict(scored, d) == "yes") {
            meets.push(run.clone());
        }
    }
    let list = |runs: &[String]| {
        if runs.is_empty() {
            "none".to_string()
        } else {
            runs.join(", ")
        }
    };
    let _ = writeln!(
        md,
        "\nAs many intervals as `{dynamo}` (Dynamo's planner as shipped) for no more GPU-hours: `{SCORED}` on {} of \
         {runs} runs ({}); held to `{dynamo}`'s GPU-hours, `{CAPPED}` on {} ({}).\n",
        meets.len(),
        list(&meets),
        capped_wins.len(),
        list(&capped_wins)
    );
    md
}

/// The intervals the scored policy missed while `dynamo-throughput` or `hpa` met them.
fn lost_intervals(run: &ManifestRun, results: &[RunResult]) -> String {
    let sla = SlaTargets::new(run.ttft_ms, run.itl_ms);
    let Some(scored) = results.iter().find(|r| r.policy == SCORED) else {
        return String::new();
    };
    let mut md = String::new();
    for other in results
        .iter()
        .filter(|r| r.policy == BASELINES[0] || r.policy == "hpa")
    {
        let lost: Vec<(&IntervalRecord, &IntervalRecord)> = scored
            .intervals
            .iter()
            .zip(&other.intervals)
            .filter(|(a, b)| a.meets(&sla) == Some(false) && b.meets(&sla) == Some(true))
            .collect();
        if lost.is_empty() {
            continue;
        }
        let _ = writeln!(
            md,
            "**{}**, {} interval(s) `{}` met:\n\n| start s | arrivals | mean ISL | {SCORED} asked / serving | TTFT ms | {} asked / serving | TTFT ms |\n|---:|---:|---:|---:|---:|---:|---:|",
            run.name,
            lost.len(),
            other.policy,
            other.policy
        );
        for (a, b) in lost {
            let _ = writeln!(
                md,
                "| {:.0} | {} | {:.0} | {:.1}/{:.1} / {:.1}/{:.1} | {:.0} | {:.1}/{:.1} / {:.1}/{:.1} | {:.0} |",
                a.start_s,
                a.arrivals,
                a.mean_isl,
                a.prefill,
                a.decode,
                a.prefill_serving,
                a.decode_serving,
                a.ttft_ms,
                b.prefill,
                b.decode,
                b.prefill_serving,
                b.decode_serving,
                b.ttft_ms
            );
        }
        md.push('\n');
    }
    md
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn manifest() -> (Manifest, ManifestRun) {
        let run = ManifestRun {
            name: "t k=1".into(),
            trace: "t".into(),
            k: 1.0,
            source: "t.jsonl".into(),
            file: "t-k1.jsonl".into(),
            requests: 3,
            ttft_ms: 500.0,
            itl_ms: 50.0,
            intervals: 2,
            initial: [1, 1],
            fixed_peak: [2, 1],
            sim_oracle_gpu_hours: 0.1,
            oracle_schedule: vec![[1, 1], [2, 1]],
            dynamo_load: DynamoLoadThresholds {
                prefill_scale_up_queue_tokens: 4000,
                prefill_scale_down_queue_tokens: 400,
                decode_scale_up_kv_rate: 80.0,
                decode_scale_down_kv_rate: 40.0,
            },
        };
        let manifest = Manifest {
            profile: "h100-llama3.3-70b-tp4".into(),
            interval_s: 60.0,
            gpus: [4, 4],
            perf_data: "perf_data.npz".into(),
            engine: EngineSettings {
                num_gpu_blocks: 3502,
                block_size: 64,
                max_num_batched_tokens: 16384,
                max_model_len: 131_072,
                tensor_parallel_size: 4,
            },
            runs: vec![run.clone()],
        };
        (manifest, run)
    }

    #[test]
    fn a_replay_is_scored_as_the_simulator_scores_a_run() {
        let (manifest, run) = manifest();
        let result = ReplayResult {
            policy: "sla-arima".into(),
            description: "bridge".into(),
            dynamo_version: "1.6.1".into(),
            startup_s: 60.0,
            router: "kv_router".into(),
            wall_s: 1.0,
            requests: vec![
                // Two in the first minute: one fast (11 tokens, 20 ms apart), one slow.
                [
                    Some(1000.0),
                    Some(1000.0),
                    Some(11.0),
                    Some(200.0),
                    Some(20.0),
                    Some(1.0),
                ],
                [
                    Some(2000.0),
                    Some(1000.0),
                    Some(1.0),
                    Some(1200.0),
                    None,
                    Some(1.0),
                ],
                // One in the second minute that never finished.
                [Some(61_000.0), Some(1000.0), Some(5.0), None, None, Some(0.0)],
            ],
            timeline: vec![
                [0.0, 0.0, 1.0, 0.0, 0.0],
                [0.0, 1.0, 1.0, 0.0, 0.0],
                // A prefill worker asked for at 30 s serves at 90 s; one drains 100-110 s.
                [30.0, 0.0, 1.0, 1.0, 0.0],
                [90.0, 0.0, 2.0, 0.0, 0.0],
                [100.0, 0.0, 1.0, 0.0, 1.0],
                [110.0, 0.0, 1.0, 0.0, 0.0],
            ],
        };
        let scored = score(&result, &run, &manifest).unwrap();
        assert_eq!(scored.intervals.len(), 2);
        let first = &scored.intervals[0];
        assert_eq!(first.arrivals, 2);
        assert!((first.ttft_ms - 700.0).abs() < 1e-9, "{first:?}");
        assert!((first.itl_ms - 20.0).abs() < 1e-9, "{first:?}");
        assert!(
            (first.prefill - 1.5).abs() < 1e-9 && first.prefill_serving == 1.0,
            "{first:?}"
        );
        // Billed: prefill 1.5 and decode 1 worker in the first minute.
        assert!((first.gpus - 10.0).abs() < 1e-9, "{first:?}");
        let second = &scored.intervals[1];
        // Asked: 2 to 100 s, then 1; billed: 2 to 110 s (one draining from 100 s), then 1.
        assert!(
            (second.prefill - (40.0 * 2.0 + 20.0) / 60.0).abs() < 1e-9,
            "{second:?}"
        );
        assert!(
            (second.gpus - 4.0 * ((50.0 * 2.0 + 10.0) / 60.0 + 1.0)).abs() < 1e-9,
            "{second:?}"
        );
        let s = &scored.summary;
        assert_eq!((s.intervals, s.intervals_meeting), (2, 0));
        assert_eq!(s.requests_unfinished, 1);
        assert_eq!(s.requests_meeting_both, 1);
        assert!((s.gpu_hours - (first.gpus + second.gpus) * 60.0 / 3600.0).abs() < 1e-12);
        assert_eq!(s.scaling_actions, 2);
        assert_eq!((s.max_prefill, s.max_decode), (2, 1));
        assert_eq!(scored.initial, (1, 1));
        assert_eq!(scored.decisions, vec![(30.0, (2, 1)), (100.0, (1, 1))]);
    }

    #[test]
    fn the_scorecard_compares_with_dynamo_and_lists_lost_intervals() {
        let (manifest, run) = manifest();
        let dir = tempfile::tempdir().unwrap();
        let results = dir.path().join("results").join("t-k1");
        std::fs::create_dir_all(&results).unwrap();
        let ok = [1000.0, 1000.0, 2.0, 100.0, 10.0, 1.0].map(Some);
        let slow = [1000.0, 1000.0, 2.0, 900.0, 10.0, 1.0].map(Some);
        let write = |policy: &str, workers: f64, request: [Option<f64>; 6]| {
            let result = ReplayResult {
                policy: policy.into(),
                description: policy.into(),
                dynamo_version: "1.6.1".into(),
                startup_s: 60.0,
                router: "kv_router".into(),
                wall_s: 0.5,
                requests: vec![request, [70_000.0, 1000.0, 2.0, 100.0, 10.0, 1.0].map(Some)],
                timeline: vec![[0.0, 0.0, workers, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0, 0.0]],
            };
            std::fs::write(
                results.join(format!("{policy}.json")),
                serde_json::to_string(&result).unwrap(),
            )
            .unwrap();
        };
        write(SCORED, 1.0, slow);
        // Held to dynamo-throughput's 2 prefill workers, it meets both intervals.
        write(CAPPED, 2.0, ok);
        write("dynamo-throughput", 2.0, ok);
        write("hpa", 3.0, ok);
        write(REFERENCE, 2.0, ok);
        // The oracle's schedule meets both intervals with one prefill worker more than Dynamo.
        write(ORACLE, 3.0, ok);
        std::fs::write(
            results.join("dynamo-latency.failed"),
            "Dynamo's replay stopped on each of 5 attempts: replay invariant violated\n",
        )
        .unwrap();
        let manifest_path = dir.path().join("manifest.json");
        std::fs::write(&manifest_path, serde_json::to_string(&manifest).unwrap()).unwrap();
        let out = dir.path().join("replay.md");
        let args = ReplayReportArgs {
            manifest: manifest_path,
            results: None,
            out: out.clone(),
            command: "make bench-replay".into(),
            intervals_csv: None,
            expect_scaling: Vec::new(),
        };
        replay_report(&args).unwrap();
        let md = std::fs::read_to_string(&out).unwrap();
        // No policy of this run changed the replicas.
        let strict = ReplayReportArgs {
            expect_scaling: vec![SCORED.into()],
            ..args
        };
        let error = replay_report(&strict).unwrap_err().to_string();
        assert!(
            error.contains("`sla-arima` never changed the replicas"),
            "{error}"
        );
        assert!(
            md.contains("Generated by `make bench-replay` with Dynamo 1.6.1"),
            "{md}"
        );
        assert!(md.contains("new workers serve 60 s after"), "{md}");
        assert!(
            md.contains("- **t k=1**, `dynamo-latency`: Dynamo's replay stopped on each of 5 attempts: replay invariant violated"),
            "{md}"
        );
        assert!(
            md.contains(
                "| t k=1 | 0.67x / 50% | 1.00x / 100% | no: fewer intervals | - | - | - | - | 1.33x / 100% | no: fewer intervals |"
            ),
            "{md}"
        );
        assert!(md.contains("`sla-arima` beats `dynamo-throughput` on 0 of 1 runs, `dynamo-latency` on 0, `dynamo-load` on 0 and `hpa` on 0."), "{md}");
        // GPU-hours per interval met: 8 GPUs for 2 minutes over the 1 interval met, 12 over 2,
        // 16 over 2.
        assert!(
            md.contains(
                "| t k=1 | 0.27 | 0.20 | 0.20 | - | - | 0.27 | 1.00x / 100% against 1.00x / 100% | yes |"
            ),
            "{md}"
        );
        assert!(
            md.contains("`sla-arima` on 0 of 1 runs (none); held to `dynamo-throughput`'s GPU-hours, `sla-arima-capped` on 1 (t k=1)."),
            "{md}"
        );
        assert!(
            md.contains(
                "| t k=1 | 1.33x / 100% | 0.67x / 50% | 1.00x / 100% | 1.33 | meeting 100 % costs 1.33x `dynamo-throughput`'s GPU-hours, which meet 100 % |"
            ),
            "{md}"
        );
        assert!(
            md.contains("costs more GPU-hours than `dynamo-throughput`: 1 of 1 (t k=1)."),
            "{md}"
        );
        assert!(
            md.contains("**t k=1**, 1 interval(s) `dynamo-throughput` met"),
            "{md}"
        );
        assert!(
            md.contains("| 0 | 1 | 1000 | 1.0/1.0 / 1.0/1.0 | 900 | 2.0/1.0 / 2.0/1.0 | 100 |"),
            "{md}"
        );
        assert!(md.contains("| policy | GPU-h | vs fixed-peak |"), "{md}");
        let _ = run;
    }

    #[test]
    fn dynamo_load_thresholds_follow_the_targets_and_the_profile() {
        use planner_core::interpolation::PerformanceCurves;
        let profile = Profile::builtin("h100-llama3.3-70b-tp4").unwrap();
        let curves = PerformanceModel::new(&profile).unwrap();
        let longest = curves.max_profiled_isl().unwrap();
        let per_s = curves.prefill_thpt_per_gpu(longest) * 4.0;
        let tight = DynamoLoadThresholds::for_run(&curves, 4, &SlaTargets::new(500.0, 50.0), 3000.0);
        let loose = DynamoLoadThresholds::for_run(&curves, 4, &SlaTargets::new(2000.0, 50.0), 3000.0);
        // What one engine prefills in the TTFT target; scale down at a tenth of it.
        assert_eq!(tight.prefill_scale_up_queue_tokens, (per_s * 0.5).round() as u64);
        assert_eq!(loose.prefill_scale_up_queue_tokens, (per_s * 2.0).round() as u64);
        assert_eq!(
            tight.prefill_scale_down_queue_tokens,
            tight.prefill_scale_up_queue_tokens / 10
        );
        // The KV use of the best decode point meeting the ITL target; down at half of it. A
        // tighter ITL target scales decode earlier.
        let best = curves.decode_best_point(50.0, 3000.0).kv_usage * 100.0;
        assert!(
            (tight.decode_scale_up_kv_rate - best).abs() < 0.051,
            "{tight:?} {best}"
        );
        assert!(
            (tight.decode_scale_down_kv_rate * 2.0 - tight.decode_scale_up_kv_rate).abs() < 0.11,
            "{tight:?}"
        );
        let strict = DynamoLoadThresholds::for_run(&curves, 4, &SlaTargets::new(500.0, 15.0), 3000.0);
        assert!(
            strict.decode_scale_up_kv_rate < tight.decode_scale_up_kv_rate,
            "{strict:?} {tight:?}"
        );
    }

    #[test]
    fn traces_keep_the_simulator_requests_and_shift_prefix_hashes_per_copy() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("m.jsonl");
        std::fs::write(
            &source,
            "{\"timestamp\": 2000, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\
             {\"timestamp\": 0, \"input_length\": 600, \"output_length\": 0, \"hash_ids\": [0, 2]}\n",
        )
        .unwrap();
        let (requests, order) =
            trace::parse_ordered(&std::fs::read_to_string(&source).unwrap(), "m").unwrap();
        assert_eq!(order, vec![1, 0]);
        let hashes = mooncake_hashes(&std::fs::read_to_string(&source).unwrap(), &source).unwrap();
        let scaled = trace::scale_indexed(&requests, 2.0, 1.0);
        let out = dir.path().join("out.jsonl");
        write_trace(&out, &scaled, &order, hashes.as_deref()).unwrap();
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        let plain = trace::scale(&requests, 2.0, 1.0);
        for (line, request) in lines.iter().zip(&plain) {
            assert!((line["timestamp"].as_f64().unwrap() - request.arrival_s * 1000.0).abs() < 1e-3);
            assert_eq!(line["input_length"].as_f64().unwrap(), request.isl);
            assert_eq!(line["output_length"].as_f64().unwrap(), request.osl);
        }
        // The first request of the file (2 s) keeps [0, 1] in its first copy, [3, 4] in its
        // second (ids span 0..=2); the 0 s one likewise [0, 2] and [3, 5].
        let ids = |i: usize| -> Vec<u64> {
            lines[i]["hash_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect()
        };
        let mut early: Vec<Vec<u64>> = vec![ids(0), ids(1)];
        early.sort();
        assert_eq!(early, vec![vec![0, 2], vec![3, 5]]);
        let mut late: Vec<Vec<u64>> = vec![ids(2), ids(3)];
        late.sort();
        assert_eq!(late, vec![vec![0, 1], vec![3, 4]]);
        // A trace without hashes gets fresh ones, a block per 512 prompt tokens.
        write_trace(&out, &scaled, &order, None).unwrap();
        let first: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(&out).unwrap().lines().next().unwrap()).unwrap();
        assert_eq!(first["hash_ids"], serde_json::json!([0, 1]));
    }
}
