//! Several graphs sharing one GPU budget, against the same GPUs split statically: `planner-sim
//! budget` (`make bench-budget`).
//!
//! Each graph replays its own trace with its own planning loop, all stepped together. In the
//! shared run, whenever a graph's loop wakes, a round of planner-core's [`budget::arbitrate`]
//! runs over every graph: each asks, as the loop's budget membership says, for its last
//! decision (what meets its SLA) with its floor (the minimum replicas) and its SLA risk, and
//! each loop settles on what it is granted, so a graph that gives GPUs back lets another take
//! them at once and a cut is applied the moment it is made. The graphs change replicas at the
//! same instant here, so the grants themselves fit the total (the operator, whose graphs act one
//! after another, goes through [`budget::allowances`]). In a static run each graph plans alone
//! within its share (the policy's own GPU budget, as `spec.bounds.maxGpuBudget`).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::Instant,
};

use clap::Args;
use serde::Deserialize;

use planner_core::{
    budget::{self, GrantReason, Request as BudgetRequest},
    interpolation::{PerformanceCurves, PerformanceModel},
    policy::{Answer, Membership, Proposal},
    profile::{Profile, builtin_names},
    sla::{Limits, PoolLimits, SlaTargets},
};

use super::{
    build_policy,
    latency::{EngineSpec, LatencyModel},
    parallel_map,
    policy::{LoopPolicy, PolicySpec},
    report,
    run::{Policy, Replay, RunResult, SimConfig},
    trace::{self, Request},
};

/// One graph of a shared budget.
#[derive(Clone, Debug)]
pub struct Graph {
    /// Its name in tables.
    pub name: String,
    /// Its requests, sorted by arrival.
    pub requests: Vec<Request>,
    /// Its targets.
    pub sla: SlaTargets,
    /// Its priority in the budget.
    pub priority: i32,
    /// Its weight among equal priorities.
    pub weight: f64,
    /// One pool of aggregated engines instead of prefill and decode pools (its GPUs counted
    /// once, as the decode engine's).
    pub aggregated: bool,
}

/// How the GPUs are given to the graphs.
#[derive(Clone, Debug, PartialEq)]
pub enum Split {
    /// No budget: each graph takes what its planner asks for (the demand).
    Unlimited,
    /// One budget of this many GPUs, arbitrated every round.
    Shared(u64),
    /// A fixed budget per graph, in the graphs' order.
    Static(Vec<u32>),
}

/// One run of every graph under one split.
#[derive(Clone, Debug)]
pub struct SplitRun {
    /// What it is, in tables.
    pub label: String,
    /// The split.
    pub split: Split,
    /// Per graph, in the graphs' order.
    pub graphs: Vec<RunResult>,
    /// Most GPUs asked for by all graphs together at any step.
    pub peak_gpus: u64,
    /// Steps at which the graphs together asked for more GPUs than a shared budget's total.
    pub steps_over: u64,
    /// Rounds in which a graph was granted less than it asked for.
    pub cuts: u64,
}

impl SplitRun {
    /// Intervals with arrivals, and those meeting the SLA, over every graph.
    pub fn intervals(&self) -> (usize, usize) {
        self.graphs.iter().fold((0, 0), |(n, ok), r| {
            (n + r.summary.intervals, ok + r.summary.intervals_meeting)
        })
    }

    /// GPU-hours of every graph together.
    pub fn gpu_hours(&self) -> f64 {
        self.graphs.iter().map(|r| r.summary.gpu_hours).sum()
    }
}

/// Runs every graph under `split` with the policy `spec` (one instance per graph), over as
/// many intervals as the longest trace; every graph starts at its floor. A shared budget
/// arbitrates the planning loop's policies (`sla-*`, `upstream-*`, `load-based`) only.
pub fn run_split<C: PerformanceCurves>(
    graphs: &[Graph],
    model: &LatencyModel<'_, C>,
    base: &SimConfig,
    spec: PolicySpec,
    split: &Split,
    label: &str,
) -> Result<SplitRun, BudgetError> {
    let configs = graph_configs(graphs, base, split);
    if let Split::Shared(total) = split {
        let mut members = configs
            .iter()
            .zip(graphs)
            .map(|(config, graph)| {
                let mut member = spec.build_loop(config).ok_or_else(|| {
                    BudgetError::Input(format!(
                        "a shared budget arbitrates the planning loop's policies (sla-*, upstream-*, load-based), not {}",
                        spec.name()
                    ))
                })?;
                join(&mut member, graph, config);
                Ok(member)
            })
            .collect::<Result<Vec<LoopPolicy>, BudgetError>>()?;
        return Ok(run_shared(graphs, model, base, &mut members, *total, label));
    }
    let floor = base.limits.min_replicas();
    let mut policies: Vec<Box<dyn Policy<C>>> = configs
        .iter()
        .map(|config| build_policy::<C>(spec, config, floor))
        .collect();
    Ok(run_alone(graphs, model, base, &mut policies, split, label))
}

/// Makes `member` a member of the graphs' shared budget, as `spec.budgetRef` does.
pub fn join(member: &mut LoopPolicy, graph: &Graph, config: &SimConfig) {
    let mut settings = member.policy_loop().settings().clone();
    settings.membership = Some(Membership {
        name: "shared".into(),
        priority: graph.priority,
        weight: graph.weight,
        floor: {
            let (prefill, decode) = config.limits.min_replicas();
            (prefill.max(1), decode.max(1))
        },
        gpus: (
            config.limits.prefill_gpus_per_engine.max(1),
            config.limits.decode_gpus_per_engine.max(1),
        ),
        aggregated: graph.aggregated,
    });
    member.policy_loop_mut().set_settings(settings);
}

/// Each graph's settings under `split`: its SLA, whether it is aggregated, and its share as its
/// own GPU budget when the split is static.
fn graph_configs(graphs: &[Graph], base: &SimConfig, split: &Split) -> Vec<SimConfig> {
    graphs
        .iter()
        .enumerate()
        .map(|(g, graph)| SimConfig {
            sla: graph.sla,
            aggregated: graph.aggregated.then(|| base.aggregated.unwrap_or_default()),
            limits: Limits {
                max_gpu_budget: match split {
                    Split::Static(shares) => shares.get(g).copied(),
                    Split::Unlimited | Split::Shared(_) => None,
                },
                ..base.limits
            },
            ..base.clone()
        })
        .collect()
}

/// Intervals the graphs are replayed over together: the longest trace's.
fn intervals(graphs: &[Graph], base: &SimConfig) -> u64 {
    graphs
        .iter()
        .filter_map(|g| g.requests.last())
        .map(|r| (r.arrival_s / base.interval_s).floor() as u64 + 1)
        .max()
        .unwrap_or(0)
}

/// GPUs the graphs' pools ask for now.
fn held<C: PerformanceCurves>(replays: &[Replay<'_, '_, C>], graphs: &[Graph], gpus: (u32, u32)) -> u64 {
    replays
        .iter()
        .zip(graphs)
        .map(|(r, graph)| {
            budget::graph_request_pools(graph.aggregated, (0, 0), r.target(), gpus)
                .iter()
                .map(|p| u64::from(p.want) * u64::from(p.gpus))
                .sum::<u64>()
        })
        .sum()
}

/// Every graph on its own (no budget, or a static share as its own GPU budget), stepped
/// together.
fn run_alone<C: PerformanceCurves>(
    graphs: &[Graph],
    model: &LatencyModel<'_, C>,
    base: &SimConfig,
    policies: &mut [Box<dyn Policy<C>>],
    split: &Split,
    label: &str,
) -> SplitRun {
    let configs = graph_configs(graphs, base, split);
    let gpus = engine_gpus(base);
    let (floor, intervals) = (base.limits.min_replicas(), intervals(graphs, base));
    let mut replays = Vec::with_capacity(graphs.len());
    for ((graph, config), policy) in graphs.iter().zip(&configs).zip(policies.iter_mut()) {
        let initial = Some(floor);
        replays.push(Replay::new(
            &graph.requests,
            model,
            config,
            policy.as_mut(),
            initial,
            Some(intervals),
        ));
    }
    let mut peak_gpus = held(&replays, graphs, gpus);
    let total_steps = replays.iter().map(Replay::total_steps).max().unwrap_or(0);
    for k in 0..=total_steps {
        for (replay, policy) in replays.iter_mut().zip(policies.iter_mut()) {
            if k > 0 {
                replay.step(k - 1);
            }
            if let Some(target) = replay.wake(policy.as_mut()) {
                replay.apply(target, policy.as_mut());
            }
        }
        peak_gpus = peak_gpus.max(held(&replays, graphs, gpus));
    }
    finish(
        replays,
        policies.iter().map(|p| &**p),
        label,
        split,
        peak_gpus,
        0,
        0,
    )
}

/// The graphs' planning loops sharing `total` GPUs: whenever one of them wakes, a round of
/// planner-core's [`budget::arbitrate`] over every member (the others ask again for what they
/// last wanted, as the operator's members do when a round changes their grant), and each is
/// set to what the loop settles on with its grant.
fn run_shared<C: PerformanceCurves>(
    graphs: &[Graph],
    model: &LatencyModel<'_, C>,
    base: &SimConfig,
    members: &mut [LoopPolicy],
    total: u64,
    label: &str,
) -> SplitRun {
    let split = Split::Shared(total);
    let configs = graph_configs(graphs, base, &split);
    let gpus = engine_gpus(base);
    let (floor, intervals) = (base.limits.min_replicas(), intervals(graphs, base));
    let mut replays = Vec::with_capacity(graphs.len());
    for ((graph, config), member) in graphs.iter().zip(&configs).zip(members.iter_mut()) {
        let initial = Some(floor);
        replays.push(Replay::new(
            &graph.requests,
            model,
            config,
            member,
            initial,
            Some(intervals),
        ));
    }
    let (mut peak_gpus, mut steps_over, mut cuts) = (held(&replays, graphs, gpus), 0, 0);
    let total_steps = replays.iter().map(Replay::total_steps).max().unwrap_or(0);
    for k in 0..=total_steps {
        let mut proposals: Vec<Option<Proposal>> = Vec::with_capacity(graphs.len());
        for (replay, member) in replays.iter_mut().zip(members.iter_mut()) {
            if k > 0 {
                replay.step(k - 1);
            }
            let due = Policy::<C>::next_wake_s(member) <= replay.now_s() + 1e-6;
            proposals.push(if due {
                member.propose(&mut replay.view())
            } else {
                None
            });
        }
        if proposals.iter().all(Option::is_none) {
            continue;
        }
        for ((proposal, replay), member) in proposals.iter_mut().zip(&mut replays).zip(members.iter_mut()) {
            if proposal.is_none() {
                *proposal = Some(member.propose_grant(&replay.view()));
            }
        }
        let requests: Vec<BudgetRequest> = graphs
            .iter()
            .zip(&proposals)
            .filter_map(|(graph, proposal)| {
                let ask = proposal.as_ref()?.ask.clone()?;
                Some(BudgetRequest {
                    member: graph.name.clone(),
                    priority: ask.priority,
                    weight: ask.weight,
                    risk: ask.risk,
                    pools: ask.pools,
                })
            })
            .collect();
        let grants = budget::arbitrate(total, &requests);
        for (((proposal, replay), member), graph) in proposals
            .into_iter()
            .zip(&mut replays)
            .zip(members.iter_mut())
            .zip(graphs)
        {
            let Some(proposal) = proposal else { continue };
            let answer = grants
                .iter()
                .find(|g| g.member == graph.name)
                .map(|grant| Answer {
                    grant: grant.clone(),
                    allowed: grant.replicas.clone(),
                    total,
                });
            cuts += u64::from(
                answer
                    .as_ref()
                    .is_some_and(|a| a.grant.reason != GrantReason::Full),
            );
            let target = member.settle(&replay.view(), proposal, answer.as_ref());
            if let Some(target) = target {
                replay.apply(target, member);
            }
        }
        let now = held(&replays, graphs, gpus);
        peak_gpus = peak_gpus.max(now);
        steps_over += u64::from(now > total);
    }
    finish(
        replays,
        members.iter().map(|m| m as &dyn Policy<C>),
        label,
        &split,
        peak_gpus,
        steps_over,
        cuts,
    )
}

fn engine_gpus(base: &SimConfig) -> (u32, u32) {
    (
        base.limits.prefill_gpus_per_engine.max(1),
        base.limits.decode_gpus_per_engine.max(1),
    )
}

fn finish<'p, C: PerformanceCurves + 'p>(
    replays: Vec<Replay<'_, '_, C>>,
    policies: impl Iterator<Item = &'p dyn Policy<C>>,
    label: &str,
    split: &Split,
    peak_gpus: u64,
    steps_over: u64,
    cuts: u64,
) -> SplitRun {
    let graphs = replays
        .into_iter()
        .zip(policies)
        .map(|(replay, policy)| replay.finish(policy))
        .collect();
    SplitRun {
        label: label.to_string(),
        split: split.clone(),
        graphs,
        peak_gpus,
        steps_over,
        cuts,
    }
}

/// `total` GPUs split in proportion to `demand` (rounded down), in whole engines of
/// `engine_gpus`; each share at least `floor_gpus`.
pub fn proportional_shares(total: u64, demand: &[f64], engine_gpus: u32, floor_gpus: u32) -> Vec<u32> {
    let sum: f64 = demand.iter().filter(|d| d.is_finite() && **d > 0.0).sum();
    let engine = u64::from(engine_gpus.max(1));
    demand
        .iter()
        .map(|d| {
            let share = if sum > 0.0 && d.is_finite() && *d > 0.0 {
                (total as f64 * d / sum).floor() as u64
            } else {
                total / demand.len().max(1) as u64
            };
            let share = share / engine * engine;
            u32::try_from(share).unwrap_or(u32::MAX).max(floor_gpus)
        })
        .collect()
}

/// Arguments of `budget`.
#[derive(Debug, Args)]
pub struct BudgetArgs {
    /// JSON file `{"total_gpus": N, "sweep": [N, ...], "policy": "sla-arima", "graphs": [{"name",
    /// "path", "rate_scale", "ttft_ms", "itl_ms", "priority", "weight"}]}`: the table per graph
    /// is at `total_gpus`, the sweep compares all graphs together at each total; paths are
    /// relative to it.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Built-in profile.
    #[arg(long, value_name = "NAME",
          value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    profile: String,
    /// Write the Markdown report to this file.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Planner adjustment interval and reporting interval (s).
    #[arg(long, default_value_t = 60.0)]
    interval_s: f64,
    /// Time from a replica being added to it serving (s).
    #[arg(long, default_value_t = 60.0)]
    scale_up_delay_s: f64,
    /// Fewest replicas per pool.
    #[arg(long, default_value_t = 1)]
    min_replicas: u32,
    /// Most replicas per pool.
    #[arg(long, default_value_t = 64)]
    max_replicas: u32,
    /// Arrival jitter of rate-scaled copies (s).
    #[arg(long, default_value_t = 1.0)]
    jitter_s: f64,
    /// Threads (default: available cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Also write every split's per-interval records per graph to this CSV file (the `policy`
    /// column names the split, the `k` column the graph's rate scale).
    #[arg(long, value_name = "FILE")]
    intervals_csv: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetFile {
    total_gpus: u64,
    /// Further totals at which the shared budget and the static splits are compared (a table of
    /// all graphs together per total).
    #[serde(default)]
    sweep: Vec<u64>,
    #[serde(default = "default_policy")]
    policy: String,
    graphs: Vec<GraphEntry>,
}

fn default_policy() -> String {
    "sla-arima".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphEntry {
    name: String,
    path: PathBuf,
    #[serde(default = "one")]
    rate_scale: f64,
    ttft_ms: f64,
    itl_ms: f64,
    #[serde(default)]
    priority: i32,
    #[serde(default = "one")]
    weight: f64,
    /// One pool of aggregated engines.
    #[serde(default)]
    aggregated: bool,
}

fn one() -> f64 {
    1.0
}

/// Why `budget` failed.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    /// The configuration, a trace or the profile could not be read.
    #[error("{0}")]
    Input(String),
    /// The report could not be written.
    #[error("{0}")]
    Output(String),
    /// The shared budget was exceeded: a bug, never a result.
    #[error("the shared budget of {total} GPUs was exceeded at {steps} steps (peak {peak} GPUs)")]
    Exceeded {
        /// The budget.
        total: u64,
        /// Steps over it.
        steps: u64,
        /// Most GPUs asked for.
        peak: u64,
    },
}

/// Runs `budget`: the graphs with no budget (their demand), sharing the total, and with the
/// total split statically (evenly, and in proportion to each graph's demand); returns the text
/// printed. Its stages: read the graphs, run every split, report.
pub fn run_command(args: &BudgetArgs) -> Result<String, BudgetError> {
    let started = Instant::now();
    let (file, spec) = read_config(args)?;
    let (graphs, sources, rate_scales) = read_graphs(args, &file)?;
    let profile = Profile::builtin(&args.profile).map_err(|e| BudgetError::Input(e.to_string()))?;
    let model = PerformanceModel::new(&profile).map_err(|e| BudgetError::Input(e.to_string()))?;
    let latency = LatencyModel::new(&model, EngineSpec::from_profile(&profile));
    let engine_gpus = super::command::gpus_from_name(&args.profile).unwrap_or(1);
    let base = SimConfig {
        interval_s: args.interval_s,
        scale_up_delay_s: args.scale_up_delay_s,
        limits: Limits {
            prefill: PoolLimits::new(
                args.min_replicas,
                Some(args.max_replicas.max(args.min_replicas).max(1)),
            ),
            decode: PoolLimits::new(
                args.min_replicas,
                Some(args.max_replicas.max(args.min_replicas).max(1)),
            ),
            max_gpu_budget: None,
            prefill_gpus_per_engine: engine_gpus,
            decode_gpus_per_engine: engine_gpus,
            ratio: None,
        },
        ..SimConfig::default()
    };
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let mut totals = vec![file.total_gpus];
    totals.extend(file.sweep.iter().copied().filter(|t| *t != file.total_gpus));
    let (runs, sweep) = run_splits(&graphs, &latency, &base, spec, &totals, jobs)?;
    if let Some(path) = &args.intervals_csv {
        write_intervals_csv(path, &graphs, &rate_scales, &runs, &base)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let report = render(
        &graphs,
        &runs,
        &sweep,
        file.total_gpus,
        &file.policy,
        &args.profile,
        &sources,
        &base,
        seconds,
        jobs,
    );
    let mut out = report.clone();
    if let Some(path) = &args.report {
        std::fs::write(path, &report)
            .map_err(|e| BudgetError::Output(format!("cannot write {}: {e}", path.display())))?;
        let _ = writeln!(out, "report: {}", path.display());
    }
    Ok(out)
}

/// The configuration file and its policy, checked.
fn read_config(args: &BudgetArgs) -> Result<(BudgetFile, PolicySpec), BudgetError> {
    let input = |e: String| BudgetError::Input(format!("{}: {e}", args.config.display()));
    let text = std::fs::read_to_string(&args.config).map_err(|e| input(format!("cannot read: {e}")))?;
    let file: BudgetFile = serde_json::from_str(&text).map_err(|e| input(e.to_string()))?;
    let spec = PolicySpec::parse(&file.policy).ok_or_else(|| {
        input(format!(
            "unknown policy {:?}; allowed: {}",
            file.policy,
            PolicySpec::names().join(", ")
        ))
    })?;
    if !spec.runs_the_loop() {
        return Err(input(format!(
            "policy {:?}: a shared budget arbitrates the planning loop's policies (sla-*, upstream-*, load-based)",
            file.policy
        )));
    }
    if file.graphs.len() < 2 {
        return Err(input("a shared budget needs at least two graphs".into()));
    }
    Ok((file, spec))
}

/// The graphs (their traces, rate-scaled), how the report names their sources, and their rate
/// scales.
type ReadGraphs = (Vec<Graph>, Vec<String>, Vec<String>);

/// Reads the graphs of the configuration file.
fn read_graphs(args: &BudgetArgs, file: &BudgetFile) -> Result<ReadGraphs, BudgetError> {
    let base_dir = args.config.parent().unwrap_or(Path::new("."));
    let mut graphs = Vec::new();
    let mut sources = Vec::new();
    let mut rate_scales = Vec::new();
    for entry in &file.graphs {
        rate_scales.push(super::command::k_label(entry.rate_scale));
        let path = base_dir.join(&entry.path);
        let requests = trace::load(&path).map_err(|e| BudgetError::Input(e.to_string()))?;
        graphs.push(Graph {
            name: entry.name.clone(),
            requests: trace::scale(&requests, entry.rate_scale, args.jitter_s),
            sla: SlaTargets::new(entry.ttft_ms, entry.itl_ms),
            priority: entry.priority,
            weight: entry.weight,
            aggregated: entry.aggregated,
        });
        sources.push(format!(
            "`{}` ({}) at k={}, SLA {} ms / {} ms, priority {}, weight {}{}",
            entry.name,
            super::command::trace_file(&entry.path),
            entry.rate_scale,
            entry.ttft_ms,
            entry.itl_ms,
            entry.priority,
            entry.weight,
            if entry.aggregated {
                ", one pool of aggregated engines"
            } else {
                ""
            }
        ));
    }
    Ok((graphs, sources, rate_scales))
}

/// The demand run, then at each total the shared budget and the two static splits (even, and
/// by demand), in parallel; the runs (demand first) and the sweep's rows.
fn run_splits<C: PerformanceCurves + Sync>(
    graphs: &[Graph],
    latency: &LatencyModel<'_, C>,
    base: &SimConfig,
    spec: PolicySpec,
    totals: &[u64],
    jobs: usize,
) -> Result<(Vec<SplitRun>, Vec<SweepRow>), BudgetError> {
    let engine_gpus = base.limits.prefill_gpus_per_engine;
    let (prefill_floor, decode_floor) = base.limits.min_replicas();
    let floor_gpus = (prefill_floor + decode_floor) * engine_gpus;
    let demand = run_split(
        graphs,
        latency,
        base,
        spec,
        &Split::Unlimited,
        "no budget (demand)",
    )?;
    let demand_gpus: Vec<f64> = demand.graphs.iter().map(|r| r.summary.gpu_hours).collect();
    let splits_at = |total: u64| {
        let even =
            u32::try_from(total / graphs.len() as u64 / u64::from(engine_gpus) * u64::from(engine_gpus))
                .unwrap_or(u32::MAX);
        [
            (Split::Shared(total), "shared budget".to_string()),
            (
                Split::Static(vec![even; graphs.len()]),
                "static, split evenly".to_string(),
            ),
            (
                Split::Static(proportional_shares(total, &demand_gpus, engine_gpus, floor_gpus)),
                "static, split by demand".to_string(),
            ),
        ]
    };
    let jobs_list: Vec<(u64, Split, String)> = totals
        .iter()
        .flat_map(|&t| splits_at(t).map(|(split, label)| (t, split, label)))
        .collect();
    let mut all = parallel_map(&jobs_list, jobs, |(_, split, label)| {
        run_split(graphs, latency, base, spec, split, label)
    })
    .into_iter()
    .collect::<Result<Vec<SplitRun>, BudgetError>>()?;
    for run in &all {
        if let Split::Shared(t) = run.split
            && run.steps_over > 0
        {
            return Err(BudgetError::Exceeded {
                total: t,
                steps: run.steps_over,
                peak: run.peak_gpus,
            });
        }
    }
    let rest = all.split_off(3.min(all.len()));
    let sweep: Vec<SweepRow> = std::iter::once(&all[..])
        .chain(rest.chunks(3))
        .zip(totals)
        .map(|(runs, &t)| SweepRow::of(t, runs))
        .collect();
    let mut runs = vec![demand];
    runs.extend(all);
    Ok((runs, sweep))
}

/// Every split's per-interval records per graph (the `policy` column names the split).
fn write_intervals_csv(
    path: &Path,
    graphs: &[Graph],
    rate_scales: &[String],
    runs: &[SplitRun],
    base: &SimConfig,
) -> Result<(), BudgetError> {
    let mut csv = String::from(report::INTERVALS_CSV_HEADER);
    for run in runs {
        for ((graph, k), result) in graphs.iter().zip(rate_scales).zip(&run.graphs) {
            let mut named = result.clone();
            named.policy = run.label.clone();
            report::intervals_csv(
                &mut csv,
                &graph.name,
                k,
                base.scale_up_delay_s,
                &graph.sla,
                std::slice::from_ref(&named),
            );
        }
    }
    std::fs::write(path, csv)
        .map_err(|e| BudgetError::Output(format!("cannot write {}: {e}", path.display())))
}

/// All graphs together under the shared budget and the two static splits of one total.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepRow {
    /// The total.
    pub total: u64,
    /// Per split (shared, even, by demand): intervals meeting the SLA, GPU-hours, most GPUs
    /// held at once.
    pub splits: Vec<(usize, f64, u64)>,
    /// Intervals with arrivals (the same in every split).
    pub intervals: usize,
}

impl SweepRow {
    fn of(total: u64, runs: &[SplitRun]) -> Self {
        Self {
            total,
            splits: runs
                .iter()
                .map(|r| (r.intervals().1, r.gpu_hours(), r.peak_gpus))
                .collect(),
            intervals: runs.first().map_or(0, |r| r.intervals().0),
        }
    }

    /// Intervals the shared budget met over the better of the static splits.
    pub fn gain(&self) -> i64 {
        let shared = self.splits.first().map_or(0, |s| s.0);
        let best_static = self.splits.iter().skip(1).map(|s| s.0).max().unwrap_or(0);
        shared as i64 - best_static as i64
    }
}

fn split_note(split: &Split) -> String {
    match split {
        Split::Unlimited => "each graph alone, no GPU budget".into(),
        Split::Shared(total) => format!("one budget of {total} GPUs, arbitrated every round"),
        Split::Static(shares) => format!(
            "per-graph budgets of {} GPUs",
            shares
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" / ")
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn render(
    graphs: &[Graph],
    runs: &[SplitRun],
    sweep: &[SweepRow],
    total: u64,
    policy: &str,
    profile: &str,
    sources: &[String],
    base: &SimConfig,
    seconds: f64,
    jobs: usize,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# One GPU budget shared by several graphs\n");
    let _ = writeln!(
        md,
        "Generated by `make bench-budget` (`planner-sim budget`, release build) in {seconds:.0} s on {jobs} threads. \
         Policy `{policy}` for every graph, profile `{profile}` ({} GPUs per prefill and per decode engine), \
         interval {} s, scale-up delay {} s, {}..{} replicas per pool; every graph starts at its floor and runs \
         as long as the longest trace. Graphs:\n",
        base.limits.prefill_gpus_per_engine,
        base.interval_s,
        base.scale_up_delay_s,
        base.limits.prefill.min,
        base.limits.prefill.max.unwrap_or(0),
    );
    for source in sources {
        let _ = writeln!(md, "- {source}");
    }
    let _ = writeln!(
        md,
        "\nEach cell: intervals meeting the SLA (of those with arrivals) / requests meeting it / GPU-hours. \
         **all graphs**: the intervals of every graph together, the GPU-hours of all, and the most GPUs they \
         held at once.\n"
    );
    let _ = write!(md, "| split | ");
    for g in graphs {
        let _ = write!(md, "{} | ", g.name);
    }
    let _ = writeln!(md, "all graphs |");
    let _ = writeln!(md, "|---|{}---:|", "---:|".repeat(graphs.len()));
    for run in runs {
        let _ = write!(md, "| {} | ", run.label);
        for r in &run.graphs {
            let s = &r.summary;
            let _ = write!(
                md,
                "{}/{} ({:.0}%) / {:.0}% / {:.1} | ",
                s.intervals_meeting,
                s.intervals,
                100.0 * s.interval_attainment(),
                100.0 * s.request_attainment(),
                s.gpu_hours
            );
        }
        let (n, ok) = run.intervals();
        let _ = writeln!(
            md,
            "{ok}/{n} ({:.0}%) / {:.1} GPU-h / peak {} GPUs |",
            100.0 * ok as f64 / n.max(1) as f64,
            run.gpu_hours(),
            run.peak_gpus
        );
    }
    let _ = writeln!(md);
    for run in runs {
        let _ = writeln!(md, "- **{}**: {}.", run.label, split_note(&run.split));
    }
    let shared = runs.iter().find(|r| matches!(r.split, Split::Shared(_)));
    if let Some(shared) = shared {
        let (_, shared_ok) = shared.intervals();
        let _ = writeln!(
            md,
            "\nThe shared budget of {total} GPUs was never exceeded (peak {} GPUs held; {} grants cut \
             below what a graph asked for).",
            shared.peak_gpus, shared.cuts
        );
        for other in runs.iter().filter(|r| matches!(r.split, Split::Static(_))) {
            let (_, ok) = other.intervals();
            let _ = writeln!(
                md,
                "Shared against {}: {shared_ok} intervals meeting the SLA against {ok} ({:+}), {:.1} GPU-hours against {:.1}.",
                other.label,
                shared_ok as i64 - ok as i64,
                shared.gpu_hours(),
                other.gpu_hours()
            );
        }
    }
    if sweep.len() > 1 {
        let _ = writeln!(
            md,
            "\n## At other totals\n\nAll graphs together ({} intervals with arrivals): intervals meeting the SLA / \
             GPU-hours / most GPUs held at once, and the shared budget's intervals over the better static split.\n",
            sweep.first().map_or(0, |r| r.intervals)
        );
        let _ = writeln!(
            md,
            "| total GPUs | shared budget | static, split evenly | static, split by demand | shared vs best static |"
        );
        let _ = writeln!(md, "|---:|---:|---:|---:|---:|");
        let mut rows: Vec<&SweepRow> = sweep.iter().collect();
        rows.sort_by_key(|r| r.total);
        for row in rows {
            let _ = write!(md, "| {} | ", row.total);
            for (ok, hours, peak) in &row.splits {
                let _ = write!(md, "{ok} / {hours:.1} / {peak} | ");
            }
            let _ = writeln!(md, "{:+} |", row.gain());
        }
        let (shared, best): (usize, usize) = sweep.iter().fold((0, 0), |(s, b), r| {
            let shared = r.splits.first().map_or(0, |x| x.0);
            (s + shared, b + (shared as i64 - r.gain()).max(0) as usize)
        });
        let _ = writeln!(
            md,
            "\nOver the {} totals: {shared} intervals meeting the SLA with the shared budget, {best} with the better \
             static split at each total.",
            sweep.len()
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget_with(config: &str, extra: &[&str]) -> Result<String, BudgetError> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: BudgetArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("budget.json");
        std::fs::write(&file, config).unwrap();
        let mut argv = vec![
            "budget",
            "--config",
            file.to_str().unwrap(),
            "--profile",
            "h100-llama3.3-70b-tp4",
            "--jobs",
            "1",
        ];
        argv.extend_from_slice(extra);
        let cli = <Cli as clap::Parser>::try_parse_from(argv).unwrap();
        run_command(&cli.args)
    }

    #[test]
    fn the_command_tables_each_graph_and_every_total_of_the_sweep() {
        let trace = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../planner-core/tests/fixtures/mooncake_tiny.jsonl"
        );
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("intervals.csv");
        let config = format!(
            r#"{{"total_gpus": 24, "sweep": [16, 24, 32], "graphs": [
                {{"name": "one", "path": "{trace}", "ttft_ms": 2000, "itl_ms": 50}},
                {{"name": "two", "path": "{trace}", "rate_scale": 2, "ttft_ms": 2000, "itl_ms": 50, "priority": 1}}]}}"#
        );
        let text = budget_with(&config, &["--intervals-csv", csv.to_str().unwrap()]).unwrap();
        assert!(text.contains("| split | one | two | all graphs |"), "{text}");
        for row in [
            "no budget (demand)",
            "shared budget",
            "static, split evenly",
            "static, split by demand",
        ] {
            assert!(text.contains(&format!("| {row} | ")), "{row}: {text}");
        }
        // The main total once, the others in order.
        let totals: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("| "))
            .filter_map(|l| l.split(" | ").next())
            .filter(|t| t.parse::<u64>().is_ok())
            .collect();
        assert_eq!(totals, ["16", "24", "32"], "{text}");
        assert!(text.contains("Over the 3 totals: "), "{text}");
        // Four splits of two graphs, each over the same intervals, one row per interval.
        let rows = std::fs::read_to_string(&csv).unwrap();
        let per_split: Vec<usize> = ["no budget (demand)", "shared budget"]
            .iter()
            .map(|s| rows.lines().filter(|l| l.contains(&format!(",{s},"))).count())
            .collect();
        assert!(per_split[0] > 0 && per_split[0] == per_split[1], "{per_split:?}");
        assert!(rows.starts_with(report::INTERVALS_CSV_HEADER));
        // One graph is no shared budget.
        let one = format!(
            r#"{{"total_gpus": 8, "graphs": [{{"name": "one", "path": "{trace}", "ttft_ms": 1, "itl_ms": 1}}]}}"#
        );
        let error = budget_with(&one, &[]).unwrap_err().to_string();
        assert!(error.contains("at least two graphs"), "{error}");
    }

    #[test]
    fn the_sweep_compares_the_shared_budget_with_the_better_static_split() {
        let row = SweepRow {
            total: 10,
            splits: vec![(7, 1.0, 10), (5, 1.0, 8), (8, 1.0, 10)],
            intervals: 10,
        };
        assert_eq!(row.gain(), -1);
        let row = SweepRow {
            splits: vec![(9, 1.0, 10), (5, 1.0, 8), (8, 1.0, 10)],
            ..row
        };
        assert_eq!(row.gain(), 1);
    }
}
