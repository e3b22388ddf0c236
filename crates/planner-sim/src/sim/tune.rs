//! `planner-sim tune`: the search the queueing planner's defaults come from, on the benchmark's
//! runs (`bench/suite.json` at k=1 and k=4, the `h100-llama3.3-70b-tp4` profile).
//!
//! Each candidate is a setting of the tuned knobs ([`SPACE`], a grid around each default) and
//! is scored on every run with the planner as `sla-arima`, against `hpa` and the oracle (which
//! do not depend on it and run once), and on the overload recovery of
//! [`super::scenario::overload_recovery`]. Scores compare, in order: recovery passed, runs
//! beating `hpa`, runs meeting 95 % of intervals within 1.3x the oracle's GPU-hours (the
//! scorecard of `bench/results.md`), then the mean of the runs' GPU-hours over the oracle's,
//! lower first. The procedure is deterministic: the defaults and `--samples` settings drawn
//! from the grid with `--seed`, then steepest-ascent hill climbing from the best of them over
//! every one-knob change, until no change scores higher (ties keep the incumbent). The report
//! prints each stage and, around the winner, what every other value of every knob scores:
//! the measurements each default's reason cites.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    time::Instant,
};

use clap::Args;

use planner_core::{
    interpolation::{PerformanceCurves, PerformanceModel},
    predictor::PredictorKind,
    profile::{Profile, builtin_names},
    sla::SlaTargets,
    state::{QueueingConfig, SlaModel},
};

use super::{
    command::{
        BASELINE, SCORE_COST, SCORE_INTERVALS, SCORED, SimulateError, Verdict, gpus_from_name, k_label,
        load_traces, overlay_queueing,
    },
    latency::{EngineSpec, LatencyModel},
    parallel_map,
    policy::{Hpa, LoopPolicy, Oracle},
    run::{SimConfig, Summary, run},
    scenario::overload_recovery,
    trace::{self, Request, splitmix64},
};

/// Arguments of `tune`.
#[derive(Debug, Args)]
pub struct TuneArgs {
    /// Suite of traces (as `simulate --suite`; paths relative to the file).
    #[arg(long, value_name = "FILE", default_value = "bench/suite.json")]
    suite: PathBuf,
    /// Built-in profile.
    #[arg(long, value_name = "NAME", default_value = "h100-llama3.3-70b-tp4",
          value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    profile: String,
    /// Rate scales k (repeatable).
    #[arg(long = "rate-scale", value_name = "K", default_values_t = [1.0, 4.0])]
    rate_scales: Vec<f64>,
    /// Arrival jitter of rate-scaled copies (s; the benchmark's by default).
    #[arg(long, default_value_t = super::command::JITTER_S)]
    jitter_s: f64,
    /// Scale-up delay of the runs (s, repeatable: every run at each delay, scored together;
    /// default the simulator's 60 s). The planner measures it, as in `simulate`.
    #[arg(long = "scale-up-delay-s", value_name = "S")]
    scale_up_delays_s: Vec<f64>,
    /// Tell the planner each run's scale-up delay as the one to expect until it measures one
    /// (as `simulate --expect-scale-up-delay`).
    #[arg(long)]
    expect_scale_up_delay: bool,
    /// Settings drawn at random from the grid before hill climbing (each costs one simulation
    /// of every run).
    #[arg(long, default_value_t = 48)]
    samples: usize,
    /// Seed of the draw.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Most hill-climbing rounds (each tries every one-knob change of the best so far).
    #[arg(long, default_value_t = 8)]
    rounds: usize,
    /// Tune only this knob (repeatable, `group.field` as in the report; default: all); the
    /// others stay at their defaults.
    #[arg(long = "knob", value_name = "SETTING")]
    knobs: Vec<String>,
    /// Threads (default: available cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Also write the report to this file.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
}

/// A tuned setting: its path in `QueueingConfig` (`group.field`) and the values searched.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    /// `group.field`.
    pub path: &'static str,
    /// Values searched, increasing; the default is one of them.
    pub values: &'static [f64],
    /// A count (written as an integer).
    pub count: bool,
}

const fn knob(path: &'static str, values: &'static [f64]) -> Knob {
    Knob {
        path,
        values,
        count: false,
    }
}

const fn count(path: &'static str, values: &'static [f64]) -> Knob {
    Knob {
        path,
        values,
        count: true,
    }
}

/// The tuned knobs and the grid searched for each (the policy's own settings, the percentile
/// targets, the scale-up delay, the window and the check period, are not tuned).
pub const SPACE: &[Knob] = &[
    knob("margins.forecast_quantile", &[0.5, 0.6, 0.7, 0.8, 0.9]),
    knob("margins.service_quantile", &[0.5, 0.7, 0.8, 0.9, 0.95]),
    knob("margins.decode_quantile", &[0.7, 0.75, 0.8, 0.85, 0.9, 0.95]),
    count("margins.errors_kept", &[10.0, 20.0, 30.0]),
    knob("margins.cold", &[1.2, 1.3, 1.4, 1.5, 1.6]),
    knob("margins.decode_cold", &[1.0, 1.1, 1.2, 1.3]),
    knob("margins.max_multiplier", &[1.25, 1.5, 2.0, 3.0]),
    knob("burstiness.quantile", &[0.5, 0.6, 0.7, 0.8, 0.9]),
    count("burstiness.kept", &[10.0, 20.0, 30.0]),
    knob("burstiness.rate_ratio", &[1.5, 2.0, 2.5, 3.0, 3.5, 4.0]),
    count("burstiness.min_comparable", &[3.0, 4.0, 5.0, 6.0, 8.0]),
    knob("burstiness.max", &[10.0, 30.0, 100.0]),
    knob("decode_kv.sigmas", &[1.0, 1.5, 1.75, 2.0, 2.5]),
    knob("decode_kv.fill", &[0.9, 0.95, 1.0]),
    knob("stabilisation.quantile", &[0.6, 0.75, 0.8, 0.9, 1.0]),
    count("fast_path.rate_samples", &[4.0, 6.0, 8.0, 10.0, 12.0]),
    count("fast_path.backlog_rate_samples", &[1.0, 2.0, 3.0, 5.0]),
    knob("fast_path.surge_tolerance", &[0.3, 0.4, 0.5, 0.75, 1.0]),
    knob("fast_path.backlog_hold_s", &[30.0, 60.0, 90.0, 120.0]),
    knob("fast_path.surge_hold_s", &[0.0, 30.0, 60.0, 120.0, 300.0]),
    // Used at long scale-up delays only: a search at 60 s cannot tell its values apart.
    knob("decode_kv.long_delay_sigmas", &[1.5, 1.75, 2.0, 2.25, 2.5]),
    knob(
        "scale_up.long_delay_factor",
        &[1.2, 1.25, 1.3, 1.33, 1.4, 1.5, 2.0],
    ),
];

/// A point of the grid: one value index per knob.
type Point = Vec<usize>;

/// How the search goes.
#[derive(Clone, Copy, Debug)]
pub struct Procedure<'a> {
    /// The knobs and their grids.
    pub space: &'a [Knob],
    /// Random settings drawn.
    pub samples: usize,
    /// Seed of the draw.
    pub seed: u64,
    /// Most hill-climbing rounds.
    pub rounds: usize,
}

/// One benchmark run: a trace at a rate scale, with what does not depend on the settings.
struct Run {
    name: String,
    requests: Vec<Request>,
    config: SimConfig,
    initial: (u32, u32),
    oracle: Summary,
    hpa: Summary,
}

/// A candidate's score.
#[derive(Clone, Debug, PartialEq)]
pub struct Score {
    /// The overload recovery passed (else why not).
    pub recovery: Result<(), String>,
    /// Per run: GPU-hours over the oracle's, share of intervals meeting the SLA, and the
    /// verdict against `hpa`.
    pub runs: Vec<(f64, f64, Verdict)>,
}

impl Score {
    /// Runs on which it beats `hpa`.
    pub fn beats(&self) -> usize {
        self.runs.iter().filter(|(_, _, v)| v.beats()).count()
    }

    /// Runs meeting the scorecard's bar.
    pub fn meets(&self) -> usize {
        self.runs.iter().filter(|(_, _, v)| v.meets).count()
    }

    /// Mean GPU-hours over the oracle's.
    pub fn cost(&self) -> f64 {
        self.runs.iter().map(|(ratio, _, _)| ratio).sum::<f64>() / self.runs.len().max(1) as f64
    }

    /// Whether it scores strictly higher than `other`.
    pub fn better_than(&self, other: &Self) -> bool {
        let key = |s: &Self| (s.recovery.is_ok(), s.beats(), s.meets());
        match key(self).cmp(&key(other)) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => self.cost() < other.cost(),
        }
    }

    fn cells(&self) -> String {
        format!(
            "{} | {} | {} | {:.4}x",
            if self.recovery.is_ok() { "yes" } else { "no" },
            self.beats(),
            self.meets(),
            self.cost()
        )
    }
}

/// What the search found.
pub struct Outcome {
    /// The winner's settings.
    pub winner: QueueingConfig,
    /// Whether the winner is the defaults.
    pub is_default: bool,
    /// The report (Markdown).
    pub report: String,
}

/// The grid point of the defaults; `Err` names a knob whose default is not in its grid.
pub fn default_point(space: &[Knob]) -> Result<Point, String> {
    let defaults = serde_json::to_value(QueueingConfig::default()).map_err(|e| e.to_string())?;
    space
        .iter()
        .map(|knob| {
            let value = knob
                .path
                .split('.')
                .try_fold(&defaults, |v, key| v.get(key))
                .and_then(serde_json::Value::as_f64)
                .ok_or_else(|| format!("{} is not a setting", knob.path))?;
            knob.values
                .iter()
                .position(|v| (v - value).abs() < 1e-12)
                .ok_or_else(|| format!("the default {} = {value} is not in its grid", knob.path))
        })
        .collect()
}

/// The settings at a grid point.
pub fn settings_at(space: &[Knob], point: &[usize]) -> Result<QueueingConfig, String> {
    let mut overlay = serde_json::Map::new();
    for (knob, &i) in space.iter().zip(point) {
        let value = knob.values.get(i).copied().unwrap_or(f64::NAN);
        let value = if knob.count {
            serde_json::Value::from(value as u64)
        } else {
            serde_json::Value::from(value)
        };
        let (group, field) = knob.path.split_once('.').unwrap_or(("", knob.path));
        let entry = overlay
            .entry(group.to_string())
            .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
        if let serde_json::Value::Object(fields) = entry {
            fields.insert(field.to_string(), value);
        }
    }
    overlay_queueing(&QueueingConfig::default(), &serde_json::Value::Object(overlay))
}

/// Runs the command; returns the report printed on standard output.
pub fn tune(args: &TuneArgs) -> Result<String, SimulateError> {
    let profile = Profile::builtin(&args.profile).map_err(|e| SimulateError::Input(e.to_string()))?;
    let model = PerformanceModel::new(&profile).map_err(|e| SimulateError::Input(e.to_string()))?;
    let gpus = gpus_from_name(&args.profile).unwrap_or(1);
    let config = SimConfig {
        limits: planner_core::sla::Limits {
            prefill_gpus_per_engine: gpus,
            decode_gpus_per_engine: gpus,
            ..SimConfig::default().limits
        },
        ..SimConfig::default()
    };
    let defaults = SimConfig::default();
    let traces = load_traces(Some(&args.suite), &[], defaults.sla)?;
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let space: Vec<Knob> = if args.knobs.is_empty() {
        SPACE.to_vec()
    } else {
        args.knobs
            .iter()
            .map(|name| {
                SPACE.iter().find(|k| k.path == name).copied().ok_or_else(|| {
                    let names: Vec<&str> = SPACE.iter().map(|k| k.path).collect();
                    SimulateError::Input(format!(
                        "--knob {name}: not a tuned setting; they are: {}",
                        names.join(", ")
                    ))
                })
            })
            .collect::<Result<_, _>>()?
    };
    let procedure = Procedure {
        space: &space,
        samples: args.samples,
        seed: args.seed,
        rounds: args.rounds,
    };
    let started = Instant::now();
    let latency = LatencyModel::new(&model, EngineSpec::from_profile(&profile));
    let delays = if args.scale_up_delays_s.is_empty() {
        vec![config.scale_up_delay_s]
    } else {
        args.scale_up_delays_s.clone()
    };
    if let Some(bad) = delays.iter().find(|d| !d.is_finite() || **d < 0.0) {
        return Err(SimulateError::Input(format!(
            "--scale-up-delay-s {bad}: a delay is a finite number of seconds, at least 0"
        )));
    }
    let scaled: Vec<(String, SlaTargets, Vec<Request>)> = traces
        .iter()
        .flat_map(|t| {
            args.rate_scales.iter().map(move |&k| {
                (
                    format!("{} k={}", t.name, k_label(k)),
                    t.sla,
                    trace::scale(&t.requests, k, args.jitter_s),
                )
            })
        })
        .collect();
    // Every run at each delay; a run's name carries its delay when there are several.
    let several = delays.len() > 1;
    let runs: Vec<TuneRun> = delays
        .iter()
        .flat_map(|&delay_s| {
            scaled.iter().map(move |(name, sla, requests)| TuneRun {
                name: if several {
                    format!("{name} at {delay_s:.0} s")
                } else {
                    name.clone()
                },
                sla: *sla,
                requests: requests.clone(),
                scale_up_delay_s: delay_s,
                expected_scale_up_delay_s: args.expect_scale_up_delay.then_some(delay_s),
            })
        })
        .collect();
    let outcome = search(&runs, &latency, &config, procedure, jobs).map_err(SimulateError::Input)?;
    let mut text = format!(
        "# `planner-sim tune`\n\n`planner-sim tune --suite {} --profile {} {}--jitter-s {} {}{}--samples {} --seed {} --rounds {}`: {} runs, {:.0} s on {jobs} threads.\n\n{}",
        args.suite.display(),
        args.profile,
        args.rate_scales
            .iter()
            .map(|k| format!("--rate-scale {} ", k_label(*k)))
            .collect::<String>(),
        args.jitter_s,
        args.scale_up_delays_s
            .iter()
            .map(|d| format!("--scale-up-delay-s {d} "))
            .chain(
                args.expect_scale_up_delay
                    .then(|| "--expect-scale-up-delay ".to_string())
            )
            .collect::<String>(),
        args.knobs
            .iter()
            .map(|k| format!("--knob {k} "))
            .collect::<String>(),
        args.samples,
        args.seed,
        args.rounds,
        runs.len(),
        started.elapsed().as_secs_f64(),
        outcome.report
    );
    if let Some(path) = &args.report {
        write_report(path, &text)?;
        let _ = writeln!(text, "report: {}", path.display());
    }
    Ok(text)
}

fn write_report(path: &Path, text: &str) -> Result<(), SimulateError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| SimulateError::Output(format!("cannot create {}: {e}", dir.display())))?;
    }
    std::fs::write(path, text)
        .map_err(|e| SimulateError::Output(format!("cannot write {}: {e}", path.display())))
}

/// A run to tune on: a trace at a rate scale, its targets and the scale-up delay it runs with.
#[derive(Clone, Debug)]
pub struct TuneRun {
    /// Trace, rate scale (and delay, when several are tuned on).
    pub name: String,
    /// Latency targets.
    pub sla: SlaTargets,
    /// The requests.
    pub requests: Vec<Request>,
    /// Seconds from asking for a replica to it serving.
    pub scale_up_delay_s: f64,
    /// The delay the planner expects until it measures one (`None`: the default).
    pub expected_scale_up_delay_s: Option<f64>,
}

/// The search on `runs`, with `config`'s interval and limits.
pub fn search<C: PerformanceCurves + Sync>(
    runs: &[TuneRun],
    latency: &LatencyModel<'_, C>,
    config: &SimConfig,
    procedure: Procedure<'_>,
    jobs: usize,
) -> Result<Outcome, String> {
    let space = procedure.space;
    let start = default_point(space)?;
    // What does not depend on the settings: the oracle (the reference, and everyone's
    // starting replicas) and hpa.
    let runs: Vec<Run> = parallel_map(runs, jobs, |tune_run| {
        let TuneRun {
            name,
            sla,
            requests,
            scale_up_delay_s,
            expected_scale_up_delay_s,
        } = tune_run;
        let config = SimConfig {
            sla: *sla,
            scale_up_delay_s: *scale_up_delay_s,
            expected_scale_up_delay_s: *expected_scale_up_delay_s,
            ..config.clone()
        };
        let oracle = run(requests, latency, &config, &mut Oracle::default(), None);
        let hpa = run(
            requests,
            latency,
            &config,
            &mut Hpa::default(),
            Some(oracle.initial),
        );
        Run {
            name: name.clone(),
            requests: requests.clone(),
            initial: oracle.initial,
            oracle: oracle.summary,
            hpa: hpa.summary,
            config,
        }
    });
    let mut scores: BTreeMap<Point, Score> = BTreeMap::new();
    let evaluate = |scores: &mut BTreeMap<Point, Score>, points: &[Point]| -> Result<(), String> {
        let fresh: Vec<Point> = points
            .iter()
            .filter(|p| !scores.contains_key(*p))
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let settings: Vec<QueueingConfig> = fresh
            .iter()
            .map(|p| settings_at(space, p))
            .collect::<Result<_, _>>()?;
        for (point, score) in fresh.into_iter().zip(score_all(&runs, latency, &settings, jobs)) {
            scores.insert(point, score);
        }
        Ok(())
    };

    // 1. The defaults and the random draw.
    let mut drawn = vec![start.clone()];
    drawn.extend((0..procedure.samples).map(|i| draw(space, procedure.seed, i as u64)));
    evaluate(&mut scores, &drawn)?;
    let mut best = drawn[0].clone();
    for point in &drawn {
        if scores[point].better_than(&scores[&best]) {
            best = point.clone();
        }
    }
    let mut report = String::new();
    report_space(&mut report, space, &start);
    report_draw(&mut report, space, &start, &drawn, &scores, procedure);

    // 2. Steepest-ascent hill climbing over one-knob changes.
    let _ = writeln!(
        report,
        "## Hill climbing\n\nFrom the best of the draw; each round tries every one-knob change and takes the best that scores higher.\n\n| round | change | recovery | beats {BASELINE} | {:.0} % / {SCORE_COST}x | mean vs oracle |\n|---:|---|:---:|---:|---:|---:|",
        SCORE_INTERVALS * 100.0
    );
    let _ = writeln!(
        report,
        "| 0 | {} | {} |",
        describe(space, &start, &best),
        scores[&best].cells()
    );
    let mut converged = false;
    for round in 1..=procedure.rounds {
        let neighbours = neighbours(space, &best);
        evaluate(&mut scores, &neighbours)?;
        let mut next = best.clone();
        for point in &neighbours {
            if scores[point].better_than(&scores[&next]) {
                next = point.clone();
            }
        }
        if next == best {
            converged = true;
            let _ = writeln!(report, "| {round} | none scores higher | | | | |");
            break;
        }
        let _ = writeln!(
            report,
            "| {round} | {} | {} |",
            describe(space, &best, &next),
            scores[&next].cells()
        );
        best = next;
    }
    if !converged {
        // The sensitivity table needs every neighbour of the winner.
        evaluate(&mut scores, &neighbours(space, &best))?;
    }
    let is_default = best == start;
    let _ = writeln!(
        report,
        "\n## Winner\n\n{}{}\n",
        if is_default {
            "The winner is the defaults".to_string()
        } else {
            format!(
                "The winner differs from the defaults: {}",
                describe(space, &start, &best)
            )
        },
        if converged {
            ": no one-knob change scores higher."
        } else {
            ", after the last round allowed (not a local optimum yet)."
        }
    );
    report_winner(&mut report, &runs, &scores[&best]);
    report_sensitivity(&mut report, space, &best, &scores);
    Ok(Outcome {
        winner: settings_at(space, &best)?,
        is_default,
        report,
    })
}

/// Scores every setting on every run and on the overload recovery.
fn score_all<C: PerformanceCurves + Sync>(
    runs: &[Run],
    latency: &LatencyModel<'_, C>,
    settings: &[QueueingConfig],
    jobs: usize,
) -> Vec<Score> {
    // One task per (setting, run), plus the recovery per setting (run index `runs.len()`).
    let tasks: Vec<(usize, usize)> = (0..settings.len())
        .flat_map(|s| (0..=runs.len()).map(move |r| (s, r)))
        .collect();
    let done = parallel_map(&tasks, jobs, |&(s, r)| {
        let Some(run_) = runs.get(r) else {
            return Task::Recovery(overload_recovery(&settings[s]));
        };
        let config = SimConfig {
            queueing: settings[s].clone(),
            ..run_.config.clone()
        };
        let mut policy = LoopPolicy::sla(&config, SlaModel::Queueing, PredictorKind::Arima, true, false);
        let result = run(&run_.requests, latency, &config, &mut policy, Some(run_.initial));
        let ratio = if run_.oracle.gpu_hours > 0.0 {
            result.summary.gpu_hours / run_.oracle.gpu_hours
        } else {
            f64::NAN
        };
        let attainment = result.summary.interval_attainment();
        Task::Run((
            ratio,
            attainment,
            Verdict::of(
                (result.summary.gpu_hours, result.summary.intervals_meeting),
                (run_.hpa.gpu_hours, run_.hpa.intervals_meeting),
                attainment,
                ratio,
            ),
        ))
    });
    let mut scores: Vec<Score> = settings
        .iter()
        .map(|_| Score {
            recovery: Err("not run".into()),
            runs: Vec::new(),
        })
        .collect();
    for (&(s, _), task) in tasks.iter().zip(done) {
        match task {
            Task::Recovery(recovery) => scores[s].recovery = recovery,
            Task::Run(run_) => scores[s].runs.push(run_),
        }
    }
    scores
}

enum Task {
    Run((f64, f64, Verdict)),
    Recovery(Result<(), String>),
}

/// Sample `i` of the draw: each knob's value by a hash of the seed, the sample and the knob.
fn draw(space: &[Knob], seed: u64, i: u64) -> Point {
    space
        .iter()
        .enumerate()
        .map(|(j, knob)| {
            let h = splitmix64(splitmix64(seed.wrapping_mul(0x9E37_79B9).wrapping_add(i)) ^ j as u64);
            (h % knob.values.len().max(1) as u64) as usize
        })
        .collect()
}

/// Every one-knob change of `point`, knob by knob, values in grid order.
fn neighbours(space: &[Knob], point: &[usize]) -> Vec<Point> {
    let mut all = Vec::new();
    for (j, knob) in space.iter().enumerate() {
        for v in 0..knob.values.len() {
            if v != point[j] {
                let mut next = point.to_vec();
                next[j] = v;
                all.push(next);
            }
        }
    }
    all
}

/// The knobs where `to` differs from `from`, as `path a -> b`.
fn describe(space: &[Knob], from: &[usize], to: &[usize]) -> String {
    let changes: Vec<String> = space
        .iter()
        .zip(from.iter().zip(to))
        .filter(|(_, (a, b))| a != b)
        .map(|(knob, (&a, &b))| format!("`{}` {} -> {}", knob.path, knob.values[a], knob.values[b]))
        .collect();
    if changes.is_empty() {
        "the defaults".to_string()
    } else {
        changes.join(", ")
    }
}

fn report_space(report: &mut String, space: &[Knob], start: &[usize]) {
    let _ = writeln!(
        report,
        "## Settings searched\n\nScore, in order: the overload recovery passes, runs where `{SCORED}` beats `{BASELINE}` (as many intervals meeting the SLA for no more GPU-hours), runs meeting {:.0} % of intervals within {SCORE_COST}x the oracle's GPU-hours, then the mean GPU-hours over the oracle's (lower). Defaults in bold.\n\n| setting | values |\n|---|---|",
        SCORE_INTERVALS * 100.0
    );
    for (knob, &d) in space.iter().zip(start) {
        let values: Vec<String> = knob
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if i == d {
                    format!("**{v}**")
                } else {
                    format!("{v}")
                }
            })
            .collect();
        let _ = writeln!(report, "| `{}` | {} |", knob.path, values.join(", "));
    }
    let _ = writeln!(report);
}

fn report_draw(
    report: &mut String,
    space: &[Knob],
    start: &[usize],
    drawn: &[Point],
    scores: &BTreeMap<Point, Score>,
    procedure: Procedure<'_>,
) {
    let mut ranked: Vec<&Point> = drawn.iter().collect();
    // Best first; the sort is stable, so equal scores keep the draw's order.
    ranked.sort_by(|a, b| {
        if scores[*a].better_than(&scores[*b]) {
            std::cmp::Ordering::Less
        } else if scores[*b].better_than(&scores[*a]) {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    });
    let passing = drawn
        .iter()
        .skip(1)
        .filter(|p| scores[*p].recovery.is_ok())
        .count();
    let _ = writeln!(
        report,
        "## Random draw\n\nThe defaults and {} settings drawn from the grid (seed {}); {passing} of the drawn pass the overload recovery. The best ten:\n\n| rank | recovery | beats {BASELINE} | {:.0} % / {SCORE_COST}x | mean vs oracle | settings |\n|---:|:---:|---:|---:|---:|---|",
        procedure.samples,
        procedure.seed,
        SCORE_INTERVALS * 100.0
    );
    for (rank, point) in ranked.iter().take(10).enumerate() {
        let _ = writeln!(
            report,
            "| {} | {} | {} |",
            rank + 1,
            scores[*point].cells(),
            if point.as_slice() == start {
                "the defaults".to_string()
            } else {
                format!(
                    "{} knobs changed",
                    describe(space, start, point).matches(" -> ").count()
                )
            }
        );
    }
    let _ = writeln!(report);
}

fn report_winner(report: &mut String, runs: &[Run], score: &Score) {
    let _ = writeln!(
        report,
        "Overload recovery: {}.\n\n| run | {SCORED} | {BASELINE} | beats {BASELINE} | {:.0} % / {SCORE_COST}x |\n|---|---:|---:|:---:|:---:|",
        match &score.recovery {
            Ok(()) => "passed".to_string(),
            Err(why) => format!("failed ({why})"),
        },
        SCORE_INTERVALS * 100.0
    );
    for (run_, (ratio, attainment, verdict)) in runs.iter().zip(&score.runs) {
        let hpa_ratio = run_.hpa.gpu_hours / run_.oracle.gpu_hours;
        let yes = |b: bool| if b { "yes" } else { "no" };
        let _ = writeln!(
            report,
            "| {} | {ratio:.3}x / {:.0}% | {hpa_ratio:.3}x / {:.0}% | {} | {} |",
            run_.name,
            attainment * 100.0,
            run_.hpa.interval_attainment() * 100.0,
            yes(verdict.beats()),
            yes(verdict.meets)
        );
    }
    let _ = writeln!(report);
}

fn report_sensitivity(report: &mut String, space: &[Knob], best: &[usize], scores: &BTreeMap<Point, Score>) {
    let winner = &scores[best];
    let _ = writeln!(
        report,
        "## Each setting around the winner\n\nEvery other value of each knob, the others at the winner's: what each default's reason cites.\n\n| setting | value | recovery | beats {BASELINE} | {:.0} % / {SCORE_COST}x | mean vs oracle |\n|---|---:|:---:|---:|---:|---:|",
        SCORE_INTERVALS * 100.0
    );
    for (j, knob) in space.iter().enumerate() {
        for (v, value) in knob.values.iter().enumerate() {
            let mut point = best.to_vec();
            point[j] = v;
            let Some(score) = scores.get(&point) else { continue };
            let value = if v == best[j] {
                format!("**{value}**")
            } else {
                format!("{value}")
            };
            let _ = writeln!(report, "| `{}` | {value} | {} |", knob.path, score.cells());
        }
    }
    let _ = writeln!(
        report,
        "\nThe winner: {} (mean {:.4}x).",
        winner.cells().replace(" | ", ", "),
        winner.cost()
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sim::scenario::{Flat, constant, flat_model};

    #[test]
    fn every_default_is_in_its_grid_and_points_give_the_settings() {
        let start = default_point(SPACE).unwrap();
        assert_eq!(settings_at(SPACE, &start).unwrap(), QueueingConfig::default());
        let mut other = start.clone();
        other[0] = 0;
        let settings = settings_at(SPACE, &other).unwrap();
        assert_eq!(settings.margins.forecast_quantile, SPACE[0].values[0]);
        assert_eq!(
            default_point(&[knob("margins.cold", &[1.0, 2.0])]).unwrap_err(),
            "the default margins.cold = 1.4 is not in its grid"
        );
        assert!(default_point(&[knob("margins.colder", &[1.4])]).is_err());
    }

    #[test]
    fn the_draw_is_deterministic_and_covers_the_grid() {
        let a: Vec<Point> = (0..50).map(|i| draw(SPACE, 1, i)).collect();
        let b: Vec<Point> = (0..50).map(|i| draw(SPACE, 1, i)).collect();
        assert_eq!(a, b);
        assert_ne!(a, (0..50).map(|i| draw(SPACE, 2, i)).collect::<Vec<_>>());
        for (j, knob) in SPACE.iter().enumerate() {
            let seen: std::collections::BTreeSet<usize> = a.iter().map(|p| p[j]).collect();
            assert_eq!(seen.len(), knob.values.len(), "{}", knob.path);
        }
    }

    fn tune_with(extra: &[&str]) -> Result<String, SimulateError> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: TuneArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let suite = dir.path().join("suite.json");
        let trace = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../planner-core/tests/fixtures/mooncake_tiny.jsonl"
        );
        std::fs::write(
            &suite,
            format!(r#"{{"traces": [{{"path": "{trace}", "ttft_ms": 2000, "itl_ms": 50}}]}}"#),
        )
        .unwrap();
        let mut argv = vec![
            "tune",
            "--suite",
            suite.to_str().unwrap(),
            "--rate-scale",
            "1",
            "--jobs",
            "2",
        ];
        argv.extend_from_slice(extra);
        let cli = <Cli as clap::Parser>::try_parse_from(argv).unwrap();
        tune(&cli.args)
    }

    #[test]
    fn the_command_reports_each_stage_on_a_tiny_suite_and_names_bad_knobs() {
        let text = tune_with(&["--knob", "margins.cold", "--samples", "1", "--rounds", "2"]).unwrap();
        assert!(
            text.contains("--knob margins.cold --samples 1 --seed 1 --rounds 2`: 1 runs"),
            "{text}"
        );
        // One knob searched, all its values scored around the winner.
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("| `margins.cold` |"))
                .count(),
            1 + 5,
            "{text}"
        );
        assert!(text.contains("| mooncake_tiny k=1 |"), "{text}");
        let error = tune_with(&["--knob", "margins.colder"]).unwrap_err().to_string();
        assert!(
            error.contains("not a tuned setting") && error.contains("margins.cold,"),
            "{error}"
        );
    }

    #[test]
    fn the_command_scores_every_run_at_each_delay_and_refuses_a_negative_one() {
        let text = tune_with(&[
            "--scale-up-delay-s",
            "60",
            "--scale-up-delay-s",
            "180",
            "--knob",
            "margins.cold",
            "--samples",
            "0",
            "--rounds",
            "1",
        ])
        .unwrap();
        assert!(
            text.contains("--scale-up-delay-s 60 --scale-up-delay-s 180 --knob margins.cold")
                && text.contains(": 2 runs"),
            "{text}"
        );
        for delay in ["60", "180"] {
            assert!(
                text.contains(&format!("| mooncake_tiny k=1 at {delay} s |")),
                "{text}"
            );
        }
        let error = tune_with(&["--scale-up-delay-s=-1"]).unwrap_err().to_string();
        assert!(error.contains("--scale-up-delay-s -1"), "{error}");
    }

    /// A step load on the flat curves, where a larger cold-start margin only costs GPUs and a
    /// smaller stabilisation quantile lets pools go sooner.
    #[test]
    fn the_search_climbs_to_a_local_optimum_and_reports_it() {
        let space = [
            knob("margins.cold", &[1.3, 1.4, 2.0]),
            knob("stabilisation.quantile", &[0.8, 1.0]),
        ];
        let mut requests = constant(2.0, 0.0, 300.0);
        requests.extend(constant(6.0, 300.0, 600.0));
        let runs = vec![TuneRun {
            name: "step".to_string(),
            sla: SlaTargets::new(500.0, 50.0),
            requests,
            scale_up_delay_s: 60.0,
            expected_scale_up_delay_s: None,
        }];
        let procedure = Procedure {
            space: &space,
            samples: 2,
            seed: 7,
            rounds: 3,
        };
        let latency = flat_model();
        let outcome = search::<Flat>(&runs, &latency, &SimConfig::default(), procedure, 2).unwrap();
        for section in [
            "## Settings searched",
            "## Random draw",
            "## Hill climbing",
            "## Winner",
            "## Each setting around the winner",
        ] {
            assert!(outcome.report.contains(section), "{}", outcome.report);
        }
        // Every one-knob change of the winner is scored, and none scores higher.
        assert!(
            outcome.report.contains("no one-knob change scores higher"),
            "{}",
            outcome.report
        );
        let rows = outcome
            .report
            .lines()
            .filter(|l| l.starts_with("| `margins.cold` |") || l.starts_with("| `stabilisation.quantile` |"))
            .count();
        assert_eq!(rows, 2 + 5, "{}", outcome.report);
        // The same search gives the same report.
        let again = search::<Flat>(&runs, &latency, &SimConfig::default(), procedure, 1).unwrap();
        assert_eq!(again.report, outcome.report);
        assert_eq!(again.winner, outcome.winner);
    }
}
