//! `planner-sim bridge`: the simulator's policies (the operator's planner core behind them)
//! driven by observations from outside, one JSON line in and one out, so that another engine
//! model (Dynamo's offline replay, `tools/replay/`) can ask the very code the operator and the
//! simulator run for replicas.
//!
//! Each input line is one [`Sample`]: what a frontend and its engines showed over a short
//! window (the caller's tick, one second in the replay harness), as counters over the window
//! and gauges at its end, plus the replicas asked for and serving. The bridge keeps the
//! policy's windows as the simulator's loop does ([`super::run`]): the interval's frontend
//! metrics for the SLA planner's tick, the counts since the last check for its fast path, the
//! per-sample load metrics for the HPA and the load-based planner; it calls the policy when one
//! of its periods ends and answers the replicas to ask for. The policy measures the scale-up
//! delay on the replicas it is told about, as in the simulator and on a cluster.
//!
//! What a sample may leave out, and what the planner does without it, is in
//! `docs/replay.md`: the output-length and TTFT histograms (the planner assumes the
//! output-length spread it has seen, or exponential, and judges the TTFT by its mean), request
//! durations (only upstream's decode correction reads them; it keeps its last factor), the
//! prompt lengths of the arrivals (then no prompt mix is learnt from the window).

use std::{
    io::{BufRead, Write},
    path::PathBuf,
};

use clap::Args;
use serde::{Deserialize, Serialize};

use planner_core::{
    interpolation::PerformanceModel,
    policy::Decision,
    profile::{Profile, builtin_names},
    sla::{Limits, PoolLimits, SlaTargets},
    state::QueueingConfig,
};

use super::{
    build_policy,
    command::read_queueing_config,
    latency::{Cluster, EngineSpec, LatencyModel},
    observe::{Counts, Frontend, Gauges},
    policy::PolicySpec,
    run::{Policy, SimConfig, View},
};

/// Arguments of `planner-sim bridge`.
#[derive(Debug, Args)]
pub struct BridgeArgs {
    /// Built-in profile the policy plans with.
    #[arg(long, value_name = "NAME", required_unless_present = "profile_dir",
          value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    profile: Option<String>,
    /// Upstream profile directory instead of a built-in profile.
    #[arg(long, value_name = "DIR", conflicts_with = "profile")]
    profile_dir: Option<PathBuf>,
    /// The policy: one that decides from observations (`sla-*`, `upstream-*`, `load-based`,
    /// `hpa`); the oracle, perfect prediction and the fixed pool need the simulator.
    #[arg(long, value_name = "NAME", default_value = "sla-arima",
          value_parser = clap::builder::PossibleValuesParser::new(PolicySpec::names()))]
    policy: String,
    /// TTFT target (ms).
    #[arg(long, default_value_t = 500.0)]
    ttft_ms: f64,
    /// ITL target (ms).
    #[arg(long, default_value_t = 50.0)]
    itl_ms: f64,
    /// The SLA planner's adjustment interval (s).
    #[arg(long, default_value_t = 60.0)]
    interval_s: f64,
    /// Fewest replicas per pool.
    #[arg(long, default_value_t = 1)]
    min_replicas: u32,
    /// Most replicas per pool.
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
    /// JSON object of queueing-model settings (planner-core's `QueueingConfig` field names), as
    /// for `simulate`.
    #[arg(long, value_name = "FILE")]
    queueing_config: Option<PathBuf>,
    /// Also write, for every check, what the policy was shown (the interval's observation or
    /// the fast path's signals) and what it answered, one JSON line each.
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
}

/// One check in the `--log` file.
#[derive(Serialize)]
struct Logged<'a> {
    t_s: f64,
    check: &'a str,
    asked: (u32, u32),
    serving: (u32, u32),
    target: Option<(u32, u32)>,
    /// The planning loop's decision, with what it read (the interval's observation) and the
    /// queueing plan, when the policy runs the loop.
    #[serde(skip_serializing_if = "Option::is_none")]
    decision: Option<&'a Decision>,
}

/// One window of observations: counters over the window, gauges at its end. Replicas are
/// `[prefill, decode]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    /// End of the window (s since the start; increasing).
    pub t_s: f64,
    /// Replicas asked for (serving or starting).
    pub asked: [u32; 2],
    /// Replicas serving.
    pub serving: [u32; 2],
    /// Requests accepted (`dynamo_frontend_requests_started_total`).
    pub arrivals: f64,
    /// Prompt lengths of the requests accepted (the input-length histogram); empty when unknown.
    #[serde(default)]
    pub arrival_isl: Vec<f64>,
    /// Requests completed (`dynamo_frontend_requests_total`).
    pub completed: f64,
    /// Their output lengths summed (the output-length histogram's sum).
    pub osl_sum: f64,
    /// First tokens timed, and their TTFTs summed (ms).
    pub ttft_count: f64,
    /// See `ttft_count`.
    pub ttft_sum_ms: f64,
    /// Inter-token latencies timed, and summed (ms).
    pub itl_count: f64,
    /// See `itl_count`.
    pub itl_sum_ms: f64,
    /// Requests accepted and not completed, now (`dynamo_frontend_inflight_requests`).
    #[serde(default)]
    pub inflight: Option<f64>,
    /// Requests accepted without a first token, now (`dynamo_frontend_queued_requests`).
    #[serde(default)]
    pub queued: Option<f64>,
    /// KV-cache usage of the decode pool (0..1), now.
    #[serde(default)]
    pub decode_kv_usage: Option<f64>,
    /// Share of the serving prefill engines busy in the window (0..1): the HPA's utilisation.
    #[serde(default)]
    pub prefill_busy: Option<f64>,
    /// GPU budget of both pools from now on, replacing `--max-gpu-budget` (as an operator
    /// rereads `maxGpuBudget` before each decision); absent: unchanged.
    #[serde(default)]
    pub max_gpu_budget: Option<u32>,
}

/// The answer to one sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The sample's time.
    pub t_s: f64,
    /// Which of the policy's checks ran: `interval`, `fast`, or none.
    pub check: Option<String>,
    /// Prefill replicas to ask for, when they change.
    pub prefill: Option<u32>,
    /// Decode replicas to ask for, when they change.
    pub decode: Option<u32>,
}

/// Why the bridge stopped.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The profile, the settings or a sample is not valid.
    #[error("{0}")]
    Input(String),
    /// Standard input or output failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Runs the bridge over `input` until it ends, writing one [`Answer`] line per sample.
pub fn bridge(args: &BridgeArgs, input: impl BufRead, mut output: impl Write) -> Result<usize, BridgeError> {
    let input_error = |e: String| BridgeError::Input(e);
    let profile = match (&args.profile_dir, &args.profile) {
        (Some(dir), _) => Profile::from_dir(dir),
        (None, Some(name)) => Profile::builtin(name),
        (None, None) => return Err(input_error("give --profile or --profile-dir".into())),
    }
    .map_err(|e| input_error(e.to_string()))?;
    let spec = PolicySpec::parse(&args.policy)
        .filter(|spec| {
            !matches!(
                spec,
                PolicySpec::Oracle | PolicySpec::PerfectPrediction | PolicySpec::FixedPeak
            )
        })
        .ok_or_else(|| {
            input_error(format!(
                "--policy {}: the bridge runs policies that decide from observations (sla-*, upstream-*, \
                 load-based, hpa); the oracle, perfect prediction and the fixed pool need the simulator",
                args.policy
            ))
        })?;
    for (flag, value) in [
        ("--ttft-ms", args.ttft_ms),
        ("--itl-ms", args.itl_ms),
        ("--interval-s", args.interval_s),
    ] {
        if !(value.is_finite() && value > 0.0) {
            return Err(input_error(format!(
                "{flag} must be a positive number, not {value}"
            )));
        }
    }
    let curves = PerformanceModel::new(&profile).map_err(|e| input_error(e.to_string()))?;
    let model = LatencyModel::new(&curves, EngineSpec::from_profile(&profile));
    let gpus = args
        .profile
        .as_deref()
        .and_then(|name| name.rsplit_once("-tp"))
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(1);
    let queueing = match &args.queueing_config {
        Some(path) => read_queueing_config(path).map_err(|e| input_error(e.to_string()))?,
        None => QueueingConfig::default(),
    };
    let pool_limits = PoolLimits::new(
        args.min_replicas,
        Some(args.max_replicas.max(args.min_replicas).max(1)),
    );
    let config = SimConfig {
        interval_s: args.interval_s,
        sla: SlaTargets::new(args.ttft_ms, args.itl_ms),
        limits: Limits {
            prefill: pool_limits,
            decode: pool_limits,
            max_gpu_budget: args.max_gpu_budget,
            prefill_gpus_per_engine: args.prefill_gpus.unwrap_or(gpus).max(1),
            decode_gpus_per_engine: args.decode_gpus.unwrap_or(gpus).max(1),
            ratio: None,
        },
        queueing,
        ..SimConfig::default()
    };
    let mut policy = build_policy::<PerformanceModel>(spec, &config, (1, 1));
    let mut loop_ = BridgeLoop::new(&config);
    if let Some(path) = &args.log {
        let file = std::fs::File::create(path)
            .map_err(|e| input_error(format!("cannot write {}: {e}", path.display())))?;
        loop_.log = Some(std::io::BufWriter::new(file));
    }
    let mut answered = 0;
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let sample: Sample = serde_json::from_str(&line)
            .map_err(|e| input_error(format!("sample on line {}: {e}", index + 1)))?;
        let answer = loop_
            .step(policy.as_mut(), &model, &config, &sample)
            .map_err(|e| input_error(format!("sample on line {}: {e}", index + 1)))?;
        serde_json::to_writer(&mut output, &answer).map_err(std::io::Error::from)?;
        output.write_all(b"\n")?;
        // The caller waits for each answer before its next sample.
        output.flush()?;
        answered += 1;
    }
    Ok(answered)
}

/// The policy's frontend between samples: the replay's windows, fed by samples instead of the
/// latency model; the policy wakes when it says, as in the replay.
struct BridgeLoop {
    frontend: Frontend,
    /// Whether the policy has had its wake at t=0.
    started: bool,
    last_t_s: f64,
    /// The GPU budget the policy was last given.
    budget: Option<u32>,
    /// Where every check is logged (`--log`).
    log: Option<std::io::BufWriter<std::fs::File>>,
}

impl BridgeLoop {
    fn new(config: &SimConfig) -> Self {
        Self {
            // Request durations are not observed: NaN, so that nothing reads a zero.
            frontend: Frontend::new(false),
            started: false,
            last_t_s: 0.0,
            budget: config.limits.max_gpu_budget,
            log: None,
        }
    }

    fn step(
        &mut self,
        policy: &mut dyn Policy<PerformanceModel>,
        model: &LatencyModel<'_, PerformanceModel>,
        config: &SimConfig,
        sample: &Sample,
    ) -> Result<Answer, String> {
        let t = sample.t_s;
        if !(t.is_finite() && t > self.last_t_s) {
            return Err(format!(
                "t_s must increase from sample to sample ({t} after {})",
                self.last_t_s
            ));
        }
        let counters = [
            ("arrivals", sample.arrivals),
            ("completed", sample.completed),
            ("osl_sum", sample.osl_sum),
            ("ttft_count", sample.ttft_count),
            ("ttft_sum_ms", sample.ttft_sum_ms),
            ("itl_count", sample.itl_count),
            ("itl_sum_ms", sample.itl_sum_ms),
        ];
        if let Some((name, value)) = counters.iter().find(|(_, v)| !(v.is_finite() && *v >= 0.0)) {
            return Err(format!("{name} must be a count or sum >= 0, not {value}"));
        }
        if let Some(budget) = sample.max_gpu_budget.filter(|b| Some(*b) != self.budget) {
            policy.gpu_budget_changed(Some(budget));
            self.budget = Some(budget);
        }
        let asked = (sample.asked[0], sample.asked[1]);
        let serving = (sample.serving[0], sample.serving[1]);
        if !self.started {
            // The policy starts with the graph, at t=0, before any request (as in the replay).
            self.started = true;
            self.wake(policy, model, config, (0.0, asked, serving), Gauges::default());
        }
        self.record(sample, t - self.last_t_s);
        self.last_t_s = t;
        let gauges = Gauges {
            inflight: sample.inflight.unwrap_or(f64::NAN),
            queued: sample.queued.unwrap_or(f64::NAN),
        };
        let (check, changed) = self.wake(policy, model, config, (t, asked, serving), gauges);
        Ok(Answer {
            t_s: t,
            check: check.map(str::to_string),
            prefill: changed.map(|(p, _)| p).filter(|p| *p != asked.0),
            decode: changed.map(|(_, d)| d).filter(|d| *d != asked.1),
        })
    }

    /// Wakes the policy at `t` when its next wake has come: the check it ran, and the replicas
    /// to ask for when they change.
    #[allow(clippy::type_complexity)]
    fn wake(
        &mut self,
        policy: &mut dyn Policy<PerformanceModel>,
        model: &LatencyModel<'_, PerformanceModel>,
        config: &SimConfig,
        (t, asked, serving): (f64, (u32, u32), (u32, u32)),
        gauges: Gauges,
    ) -> (Option<&'static str>, Option<(u32, u32)>) {
        if policy.next_wake_s() > t + EPSILON_S {
            return (None, None);
        }
        let cluster = Cluster::new(t, serving.0, serving.1);
        let mut view = View {
            now_s: t,
            asked,
            serving,
            gauges,
            frontend: &mut self.frontend,
            upcoming: &[],
            first_upcoming: 0,
            cluster: &cluster,
            model,
            config,
        };
        let decision = policy.wake(&mut view);
        let check = policy.last_check();
        if let Some(check) = check {
            self.log(&Logged {
                t_s: t,
                check,
                asked,
                serving,
                target: decision,
                decision: policy.last_decision(),
            });
        }
        let changed = decision.filter(|target| *target != asked);
        if let Some(target) = changed {
            // The caller asks for them now.
            policy.applied(t, asked, target, serving);
        }
        (check, changed)
    }

    /// Writes one check to the `--log` file; a failed write stops the logging, not the bridge.
    fn log(&mut self, entry: &Logged<'_>) {
        use std::io::Write as _;
        if let Some(log) = &mut self.log {
            let written = serde_json::to_writer(&mut *log, entry)
                .map_err(std::io::Error::from)
                .and_then(|()| log.write_all(b"\n"));
            if written.is_err() {
                self.log = None;
            }
        }
    }

    /// Adds one sample to the frontend's windows.
    fn record(&mut self, sample: &Sample, span_s: f64) {
        self.frontend.add(&Counts {
            arrivals: sample.arrivals,
            arrival_isl: &sample.arrival_isl,
            completed: sample.completed,
            osl_sum: sample.osl_sum,
            ttft_count: sample.ttft_count,
            ttft_sum_s: sample.ttft_sum_ms / 1000.0,
            itl_count: sample.itl_count,
            itl_sum_s: sample.itl_sum_ms / 1000.0,
        });
        let prefill = f64::from(sample.serving[0]);
        let busy = sample
            .prefill_busy
            .filter(|b| b.is_finite())
            .map(|b| b.clamp(0.0, 1.0));
        self.frontend.engines(
            (prefill, f64::from(sample.serving[1])),
            span_s,
            busy.map_or(f64::NAN, |b| b * prefill * span_s),
        );
        if let Some(usage) = sample.decode_kv_usage {
            self.frontend.kv_usage(usage);
        }
        if let Some(busy) = busy.filter(|_| prefill > 0.0) {
            self.frontend.prefill_busy(busy);
        }
        if let Some(queued) = sample.queued.filter(|q| q.is_finite()) {
            // Waiting for prefill: beyond the engines' own requests.
            self.frontend
                .prefill_queue(queued - busy.unwrap_or(1.0) * prefill);
        }
        self.frontend.mark(sample.t_s);
    }
}

/// Slack for wake times given in floating-point seconds.
const EPSILON_S: f64 = 1e-6;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args(policy: &str) -> BridgeArgs {
        BridgeArgs {
            profile: Some("h100-llama3.3-70b-tp4".into()),
            profile_dir: None,
            policy: policy.into(),
            ttft_ms: 2000.0,
            itl_ms: 50.0,
            interval_s: 60.0,
            min_replicas: 1,
            max_replicas: 64,
            max_gpu_budget: None,
            prefill_gpus: None,
            decode_gpus: None,
            queueing_config: None,
            log: None,
        }
    }

    /// One second of `rate` requests/s of 12k-token prompts on `replicas` engines, the TTFT
    /// they saw and the queue they left.
    fn second(t: f64, rate: f64, replicas: (u32, u32), ttft_ms: f64, queued: f64) -> Sample {
        Sample {
            t_s: t,
            asked: [replicas.0, replicas.1],
            serving: [replicas.0, replicas.1],
            arrivals: rate,
            arrival_isl: vec![12_000.0; rate as usize],
            completed: rate,
            osl_sum: rate * 300.0,
            ttft_count: rate,
            ttft_sum_ms: rate * ttft_ms,
            itl_count: rate,
            itl_sum_ms: rate * 20.0,
            inflight: Some(queued + 10.0),
            queued: Some(queued),
            decode_kv_usage: Some(0.3),
            prefill_busy: Some(1.0),
            max_gpu_budget: None,
        }
    }

    fn run(policy: &str, samples: &[Sample]) -> Vec<Answer> {
        let input: String = samples
            .iter()
            .map(|s| serde_json::to_string(s).unwrap() + "\n")
            .collect();
        let mut output = Vec::new();
        let n = bridge(&args(policy), input.as_bytes(), &mut output).unwrap();
        assert_eq!(n, samples.len());
        String::from_utf8(output)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn the_sla_planner_scales_out_of_an_overload_it_is_shown() {
        // Three calm minutes at 1 request/s on 2 prefill engines, then 8 requests/s (each
        // engine prefills about one 12k prompt a second) with a queue that grows and TTFT
        // far past the target.
        let mut samples: Vec<Sample> = (1..=180)
            .map(|t| second(f64::from(t), 1.0, (2, 1), 900.0, 0.0))
            .collect();
        samples.extend(
            (181..=240).map(|t| second(f64::from(t), 8.0, (2, 1), 20_000.0, f64::from(t - 180) * 6.0)),
        );
        let answers = run("sla-arima", &samples);
        assert_eq!(answers.len(), samples.len());
        // An interval check each minute, fast checks every 10 s in between.
        let checks = |kind: &str| {
            answers
                .iter()
                .filter(|a| a.check.as_deref() == Some(kind))
                .count()
        };
        // The policy starts with the graph at t=0 (before the first sample): intervals at 60,
        // 120 and 180 s, fast checks every 10 s from 10 s on.
        assert_eq!(checks("interval"), 4);
        assert_eq!(checks("fast"), 20);
        assert_eq!(answers[59].check.as_deref(), Some("interval"));
        assert!(
            answers[..180].iter().all(|a| a.prefill.is_none_or(|p| p <= 2)),
            "{answers:?}"
        );
        let out = answers[180..]
            .iter()
            .find_map(|a| a.prefill)
            .expect("a scale-out within the overloaded minute");
        assert!(out >= 6, "{out}: {answers:?}");
    }

    #[test]
    fn a_gpu_budget_in_a_sample_bounds_the_next_decisions() {
        // The overload of the test above, with and without a budget of 16 GPUs (four 4-GPU
        // engines) from the overloaded minute on.
        let mut samples: Vec<Sample> = (1..=180)
            .map(|t| second(f64::from(t), 1.0, (2, 1), 900.0, 0.0))
            .collect();
        samples.extend(
            (181..=240).map(|t| second(f64::from(t), 8.0, (2, 1), 20_000.0, f64::from(t - 180) * 6.0)),
        );
        let gpus = |answers: &[Answer]| {
            answers[180..]
                .iter()
                .filter(|a| a.prefill.is_some() || a.decode.is_some())
                .map(|a| 4 * (a.prefill.unwrap_or(2) + a.decode.unwrap_or(1)))
                .collect::<Vec<u32>>()
        };
        let free = gpus(&run("sla-arima", &samples));
        assert!(free.iter().any(|g| *g > 16), "{free:?}");
        samples[180].max_gpu_budget = Some(16);
        let capped = gpus(&run("sla-arima", &samples));
        assert!(
            !capped.is_empty() && capped.iter().all(|g| *g <= 16),
            "{capped:?}"
        );
    }

    #[test]
    fn the_hpa_follows_prefill_utilisation() {
        let mut samples: Vec<Sample> = (1..=15)
            .map(|t| second(f64::from(t), 1.0, (4, 1), 500.0, 0.0))
            .collect();
        for s in &mut samples {
            s.prefill_busy = Some(0.35);
            s.decode_kv_usage = Some(0.5);
        }
        let answers = run("hpa", &samples);
        // Half its 70 % target: half the engines.
        assert_eq!(answers[14].check.as_deref(), Some("interval"));
        assert_eq!((answers[14].prefill, answers[14].decode), (Some(2), None));
    }

    #[test]
    fn bad_samples_and_policies_are_refused_by_name() {
        let mut output = Vec::new();
        let error = bridge(&args("oracle"), "".as_bytes(), &mut output)
            .unwrap_err()
            .to_string();
        assert!(error.contains("--policy oracle"), "{error}");
        let good = serde_json::to_string(&second(2.0, 1.0, (1, 1), 100.0, 0.0)).unwrap();
        let earlier = serde_json::to_string(&second(1.0, 1.0, (1, 1), 100.0, 0.0)).unwrap();
        let input = format!("{good}\n{earlier}\n");
        let error = bridge(&args("sla-arima"), input.as_bytes(), &mut output)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("line 2") && error.contains("t_s must increase"),
            "{error}"
        );
        let input = good.replace("\"arrivals\":1.0", "\"arrivals\":-1.0");
        let error = bridge(&args("sla-arima"), input.as_bytes(), &mut output)
            .unwrap_err()
            .to_string();
        assert!(error.contains("arrivals must be"), "{error}");
        let error = bridge(
            &args("sla-arima"),
            "{\"t_s\": 1, \"bogus\": 2}".as_bytes(),
            &mut output,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("line 1") && error.contains("bogus"), "{error}");
    }
}
