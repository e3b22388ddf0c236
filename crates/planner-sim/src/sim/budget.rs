//! Several graphs sharing one GPU budget, against the same GPUs split statically: `planner-sim
//! budget` (`make bench-budget`).
//!
//! Each graph replays its own trace with its own planner, all stepped together. In the shared
//! run, every decision of any graph starts a round of planner-core's [`budget::arbitrate`]: each
//! graph asks for its last decision (what meets its SLA) with its floor (the minimum replicas),
//! and every graph is set to what it is granted, so a graph that gives GPUs back lets another take
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
    profile::{Profile, builtin_names},
    sla::{Limits, SlaTargets},
};

use super::{
    build_policy,
    latency::{EngineSpec, LatencyModel},
    parallel_map,
    policy::PolicySpec,
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
/// many intervals as the longest trace; every graph starts at its floor.
pub fn run_split<C: PerformanceCurves>(
    graphs: &[Graph],
    model: &LatencyModel<'_, C>,
    base: &SimConfig,
    spec: PolicySpec,
    split: &Split,
    label: &str,
) -> SplitRun {
    let configs = graph_configs(graphs, base, split);
    let floor = base.limits.min_replicas;
    let mut policies: Vec<_> = configs
        .iter()
        .map(|config| build_policy::<C>(spec, config, (floor, floor)))
        .collect();
    run_split_with(graphs, model, base, &mut policies, split, label)
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

/// [`run_split`] with one policy per graph, in the graphs' order, given by the caller. Each
/// policy hears of its replicas as in a single run: what it was granted, and when they serve.
pub fn run_split_with<C: PerformanceCurves>(
    graphs: &[Graph],
    model: &LatencyModel<'_, C>,
    base: &SimConfig,
    policies: &mut [Box<dyn Policy<C>>],
    split: &Split,
    label: &str,
) -> SplitRun {
    let configs = graph_configs(graphs, base, split);
    let intervals = graphs
        .iter()
        .filter_map(|g| g.requests.last())
        .map(|r| (r.arrival_s / base.interval_s).floor() as u64 + 1)
        .max()
        .unwrap_or(0);
    let floor = base.limits.min_replicas;
    let mut replays: Vec<Replay<'_, '_, C>> = graphs
        .iter()
        .zip(&configs)
        .zip(policies.iter_mut())
        .map(|((graph, config), policy)| {
            Replay::new(
                &graph.requests,
                model,
                config,
                policy.as_mut(),
                Some((floor, floor)),
                Some(intervals),
            )
        })
        .collect();
    let gpus = (
        base.limits.prefill_gpus_per_engine.max(1),
        base.limits.decode_gpus_per_engine.max(1),
    );
    let held = |replays: &[Replay<'_, '_, C>]| -> u64 {
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
    };
    // What each graph last asked for (its planner's last decision, before any cut).
    let mut wants: Vec<(u32, u32)> = replays.iter().map(Replay::target).collect();
    let total_steps = replays.iter().map(Replay::total_steps).max().unwrap_or(0);
    let (mut peak_gpus, mut steps_over, mut cuts) = (held(&replays), 0, 0);
    for k in 0..total_steps {
        let mut decided = false;
        for ((replay, policy), want) in replays.iter_mut().zip(policies.iter_mut()).zip(wants.iter_mut()) {
            if let Some(target) = replay.step(k, policy.as_mut()) {
                decided = true;
                *want = target;
                if !matches!(split, Split::Shared(_)) {
                    replay.apply(target, policy.as_mut());
                }
            }
        }
        if let (Split::Shared(total), true) = (split, decided) {
            let requests: Vec<BudgetRequest> = graphs
                .iter()
                .zip(&replays)
                .zip(&wants)
                .map(|((graph, replay), want)| request(graph, replay, *want, floor, gpus))
                .collect();
            for (((grant, replay), policy), graph) in budget::arbitrate(*total, &requests)
                .iter()
                .zip(replays.iter_mut())
                .zip(policies.iter_mut())
                .zip(graphs)
            {
                cuts += u64::from(grant.reason != GrantReason::Full);
                let (p, d) = budget::graph_replicas(graph.aggregated, &grant.replicas, replay.target());
                if (p, d) != replay.target() {
                    replay.apply((p, d), policy.as_mut());
                }
            }
        }
        let now = held(&replays);
        peak_gpus = peak_gpus.max(now);
        if let Split::Shared(total) = split {
            steps_over += u64::from(now > *total);
        }
    }
    let graphs = replays
        .into_iter()
        .zip(policies.iter())
        .map(|(replay, policy)| replay.finish(policy.as_ref()))
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

/// A graph's request for a round: its floor and its last decision per pool (one pool when
/// aggregated), its SLA risk from its last interval.
fn request<C: PerformanceCurves>(
    graph: &Graph,
    replay: &Replay<'_, '_, C>,
    want: (u32, u32),
    floor: u32,
    gpus: (u32, u32),
) -> BudgetRequest {
    let risk = replay.last_window().map_or(1.0, |w| {
        budget::sla_risk(
            Some(w.ttft_ms),
            graph.sla.ttft_ms,
            Some(w.itl_ms),
            graph.sla.itl_ms,
        )
    });
    BudgetRequest {
        member: graph.name.clone(),
        priority: graph.priority,
        weight: graph.weight,
        risk,
        pools: budget::graph_request_pools(graph.aggregated, (floor, floor), want, gpus),
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
/// printed.
pub fn run_command(args: &BudgetArgs) -> Result<String, BudgetError> {
    let started = Instant::now();
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
    if file.graphs.len() < 2 {
        return Err(input("a shared budget needs at least two graphs".into()));
    }
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
            entry.path.display(),
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
    let profile = Profile::builtin(&args.profile).map_err(|e| BudgetError::Input(e.to_string()))?;
    let model = PerformanceModel::new(&profile).map_err(|e| BudgetError::Input(e.to_string()))?;
    let latency = LatencyModel::new(&model, EngineSpec::from_profile(&profile));
    let engine_gpus = super::command::gpus_from_name(&args.profile).unwrap_or(1);
    let base = SimConfig {
        interval_s: args.interval_s,
        scale_up_delay_s: args.scale_up_delay_s,
        limits: Limits {
            min_replicas: args.min_replicas,
            max_replicas: Some(args.max_replicas.max(args.min_replicas).max(1)),
            max_gpu_budget: None,
            prefill_gpus_per_engine: engine_gpus,
            decode_gpus_per_engine: engine_gpus,
        },
        ..SimConfig::default()
    };
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let total = file.total_gpus;
    let floor_gpus = args.min_replicas * 2 * engine_gpus;

    let demand = run_split(
        &graphs,
        &latency,
        &base,
        spec,
        &Split::Unlimited,
        "no budget (demand)",
    );
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
    let mut totals = vec![total];
    totals.extend(file.sweep.iter().copied().filter(|t| *t != total));
    let jobs_list: Vec<(u64, Split, String)> = totals
        .iter()
        .flat_map(|&t| splits_at(t).map(|(split, label)| (t, split, label)))
        .collect();
    let mut all = parallel_map(&jobs_list, jobs, |(_, split, label)| {
        run_split(&graphs, &latency, &base, spec, split, label)
    });
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
        .zip(&totals)
        .map(|(runs, &t)| SweepRow::of(t, runs))
        .collect();
    let mut runs = vec![demand];
    runs.extend(all);
    if let Some(path) = &args.intervals_csv {
        let mut csv = String::from(report::INTERVALS_CSV_HEADER);
        for run in &runs {
            for ((graph, k), result) in graphs.iter().zip(&rate_scales).zip(&run.graphs) {
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
            .map_err(|e| BudgetError::Output(format!("cannot write {}: {e}", path.display())))?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let report = render(
        &graphs,
        &runs,
        &sweep,
        total,
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
        base.limits.min_replicas,
        base.limits.max_replicas.unwrap_or(0),
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
