//! The replay: a trace through the latency model while a policy scales the engines, with a
//! scale-up delay, GPU accounting and SLA attainment.
//!
//! Each step (default 1 s) activates replicas whose scale-up delay has passed, adds the step's
//! arrivals, advances the [`Cluster`], feeds the graph's [`Frontend`] (what Prometheus would
//! hold) and charges the GPUs of every replica asked for (a replica costs from the moment it is
//! requested, through its start-up delay, until it is removed; removal is immediate). Then, when
//! the policy's next wake has come, the policy reads what it is entitled to through a [`View`]
//! and says what replicas to ask for.
//!
//! Attainment is judged per request (its TTFT and its mean ITL against the targets) and per
//! reporting interval, by the cohort of requests that *arrived* in it (mean TTFT and
//! token-weighted mean ITL of that cohort), so that delaying requests into the next interval
//! cannot make an interval look good. Intervals without arrivals are not counted.

use planner_core::{
    aggregated::AggregatedEngine,
    interpolation::PerformanceCurves,
    policy::Decision,
    sla::{Limits, Load, PoolLimits, SlaTargets},
    state::{QueueingConfig, QueueingPlan},
};

use crate::{
    latency::{Cluster, Job, LatencyModel, Observer, Outcome},
    observe::{Frontend, Gauges},
    trace::Request,
};

/// Slack for wake times given in floating-point seconds.
const EPSILON_S: f64 = 1e-6;

/// Settings shared by every policy of a comparison.
/// Settings shared by every policy of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Adjustment interval of the SLA planner and the reporting interval (s).
    pub interval_s: f64,
    /// Simulation step (s); intervals and periods are rounded to whole steps.
    pub step_s: f64,
    /// Time from a replica being added to it serving (s); scale-down is immediate.
    pub scale_up_delay_s: f64,
    /// Latency targets.
    pub sla: SlaTargets,
    /// Replica bounds, GPU budget and GPUs per engine.
    pub limits: Limits,
    /// After the last interval, how long requests still in flight may take to finish (s);
    /// the replicas of the last interval serve them and are not charged.
    pub drain_limit_s: f64,
    /// Settings of the SLA planner's queueing model (its scale-up delay is the one the policy
    /// measures on its replicas, as the operator does: not `scale_up_delay_s`).
    pub queueing: QueueingConfig,
    /// The scale-up delay the `sla-*` policies assume until they have measured one (a
    /// PlannerPolicy's `spec.behavior.expectedScaleUpDelay`); `None`: the operator's default.
    pub expected_scale_up_delay_s: Option<f64>,
    /// `Some` for one pool of aggregated engines: every decision's pools become that pool
    /// (the larger of the two), charged once, at the decode engine's GPUs.
    pub aggregated: Option<AggregatedEngine>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            interval_s: 60.0,
            step_s: 1.0,
            scale_up_delay_s: 60.0,
            sla: SlaTargets::new(500.0, 50.0),
            limits: Limits {
                prefill: PoolLimits::new(1, Some(64)),
                decode: PoolLimits::new(1, Some(64)),
                max_gpu_budget: None,
                prefill_gpus_per_engine: 1,
                decode_gpus_per_engine: 1,
                ratio: None,
            },
            drain_limit_s: 1800.0,
            queueing: QueueingConfig::default(),
            expected_scale_up_delay_s: None,
            aggregated: None,
        }
    }
}

impl SimConfig {
    /// Steps per interval (at least 1).
    pub fn steps_per_interval(&self) -> u64 {
        steps(self.interval_s, self.step_s)
    }

    /// The step actually used, so that an interval is a whole number of steps.
    pub fn effective_step_s(&self) -> f64 {
        self.interval_s / self.steps_per_interval() as f64
    }

    /// The replicas a decision runs: an aggregated deployment's one pool is both pools.
    pub fn pools(&self, (prefill, decode): (u32, u32)) -> (u32, u32) {
        if self.aggregated.is_some() {
            let n = prefill.max(decode);
            (n, n)
        } else {
            (prefill, decode)
        }
    }

    /// Fewest replicas per pool of the baselines (which bound both pools alike; the
    /// simulator's commands set one bound for both).
    pub fn min_replicas(&self) -> u32 {
        self.limits.prefill.min.min(self.limits.decode.min)
    }

    /// Largest replica count per pool the searching policies consider.
    pub fn max_replicas(&self) -> u32 {
        self.limits
            .prefill
            .max
            .max(self.limits.decode.max)
            .unwrap_or(64)
            .max(self.min_replicas().max(1))
    }
}

fn steps(period_s: f64, step_s: f64) -> u64 {
    if !(period_s.is_finite() && step_s.is_finite() && step_s > 0.0) {
        return 1;
    }
    (period_s / step_s).round().max(1.0) as u64
}

/// What a policy may read when it wakes. Policies read what they are entitled to: the
/// planning loop the operator runs reads the frontend (as it reads Prometheus) and the
/// replicas; the HPA its utilisation and KV samples; the oracle and the perfect prediction
/// also look at the requests still to come.
pub struct View<'a, C> {
    /// Wake time (s).
    pub now_s: f64,
    /// Replicas asked for (serving or starting).
    pub asked: (u32, u32),
    /// Replicas serving.
    pub serving: (u32, u32),
    /// The frontend's gauges now.
    pub gauges: Gauges,
    /// The frontend's windows.
    pub frontend: &'a mut Frontend,
    /// Requests not yet arrived, in arrival order; `upcoming[i]` has id `first_upcoming + i`.
    pub upcoming: &'a [Request],
    /// Trace index of `upcoming[0]`.
    pub first_upcoming: usize,
    /// The deployment's state (for what-if evaluation).
    pub cluster: &'a Cluster,
    /// The latency model.
    pub model: &'a LatencyModel<'a, C>,
    /// Shared settings.
    pub config: &'a SimConfig,
}

impl<C> View<'_, C> {
    /// The actual load of the next `horizon_s` seconds (requests, mean ISL, mean OSL).
    pub fn next_load(&self, horizon_s: f64) -> Load {
        let end = self.now_s + horizon_s;
        let cohort = self.upcoming.iter().take_while(|r| r.arrival_s < end);
        let (mut n, mut isl, mut osl) = (0.0, 0.0, 0.0);
        for r in cohort {
            n += 1.0;
            isl += r.isl;
            osl += r.osl;
        }
        if n > 0.0 {
            Load {
                num_req: n,
                isl: isl / n,
                osl: osl / n,
            }
        } else {
            Load {
                num_req: 0.0,
                isl: 0.0,
                osl: 0.0,
            }
        }
    }

    /// Whether every replica asked for serves (a DGD's `Ready`).
    pub fn ready(&self) -> bool {
        self.serving.0 >= self.asked.0 && self.serving.1 >= self.asked.1
    }
}

/// A scaling policy.
pub trait Policy<C> {
    /// Name in tables and plots.
    fn name(&self) -> String;
    /// When the policy next wants to wake (s; infinite: never).
    fn next_wake_s(&self) -> f64;
    /// Wakes at `view.now_s`: the replicas to ask for from now on, or `None` to keep them.
    fn wake(&mut self, view: &mut View<'_, C>) -> Option<(u32, u32)>;
    /// The replicas asked for changed from `from` to `to` at `now_s` (what the policy decided,
    /// or what a shared budget let it have); `serving` serve now.
    fn applied(&mut self, _now_s: f64, _from: (u32, u32), _to: (u32, u32), _serving: (u32, u32)) {}
    /// Whether added replicas serve at once (only the oracle, which is a bound, not a policy
    /// one could run).
    fn ignores_scale_up_delay(&self) -> bool {
        false
    }
    /// Replicas to start with, when the policy has its own (a fixed deployment).
    fn initial(&self) -> Option<(u32, u32)> {
        None
    }
    /// The GPU budget of both pools changed (`None`: no budget), as an operator rereads
    /// `maxGpuBudget` before each decision; policies without a budget ignore it.
    fn gpu_budget_changed(&mut self, _budget: Option<u32>) {}
    /// The queueing planner's plan of the last check that made one (for logs).
    fn last_plan(&self) -> Option<&QueueingPlan> {
        None
    }
    /// The planning loop's last decision (for logs and `what-if`).
    fn last_decision(&self) -> Option<&Decision> {
        None
    }
    /// Which check the last wake ran (`interval`, `fast`), `None` when it found nothing due. A
    /// policy with one kind of decision runs an interval at every wake.
    fn last_check(&self) -> Option<&'static str> {
        Some("interval")
    }
}

/// A policy's wakes every `period_s`, the first one period after the start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Periodic {
    /// Seconds between wakes (infinite: never).
    pub period_s: f64,
    next_s: f64,
}

impl Periodic {
    /// Wakes every `period_s` (never, unless it is a positive number of seconds).
    pub fn every(period_s: f64) -> Self {
        let period_s = if period_s.is_finite() && period_s > 0.0 {
            period_s
        } else {
            f64::INFINITY
        };
        Self {
            period_s,
            next_s: period_s,
        }
    }

    /// The next wake.
    pub fn next_s(&self) -> f64 {
        self.next_s
    }

    /// A wake at `now_s`: the next is the first of the cadence after it.
    pub fn woke(&mut self, now_s: f64) {
        if self.next_s <= now_s + EPSILON_S {
            let periods = ((now_s + EPSILON_S - self.next_s) / self.period_s).floor() + 1.0;
            self.next_s += periods * self.period_s;
        }
    }

    /// [`Self::woke`], the cadence resumed from `next_s` when there was one.
    pub fn woke_after(&mut self, next_s: Option<f64>, now_s: f64) {
        if let Some(next_s) = next_s {
            self.next_s = next_s;
        }
        self.woke(now_s);
    }
}

/// One reporting interval of a run.
/// One reporting interval of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct IntervalRecord {
    /// Start (s).
    pub start_s: f64,
    /// Requests that arrived in it.
    pub arrivals: usize,
    /// Their mean input length.
    pub mean_isl: f64,
    /// Their mean output length.
    pub mean_osl: f64,
    /// Prefill replicas asked for, time-averaged.
    pub prefill: f64,
    /// Decode replicas asked for, time-averaged.
    pub decode: f64,
    /// GPUs asked for, time-averaged.
    pub gpus: f64,
    /// Prefill replicas serving, time-averaged.
    pub prefill_serving: f64,
    /// Decode replicas serving, time-averaged.
    pub decode_serving: f64,
    /// Mean TTFT of the cohort (ms); NaN without arrivals, infinite when some never got one.
    pub ttft_ms: f64,
    /// Token-weighted mean ITL of the cohort (ms); NaN when it generated no second token.
    pub itl_ms: f64,
}

impl IntervalRecord {
    /// Whether the cohort met both targets (`None` without arrivals).
    pub fn meets(&self, sla: &SlaTargets) -> Option<bool> {
        (self.arrivals > 0)
            .then(|| self.ttft_ms <= sla.ttft_ms && (self.itl_ms.is_nan() || self.itl_ms <= sla.itl_ms))
    }
}

/// Aggregates of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// GPU-hours of every replica asked for over the trace's intervals.
    pub gpu_hours: f64,
    /// Intervals with arrivals.
    pub intervals: usize,
    /// Of those, intervals whose cohort met both targets.
    pub intervals_meeting: usize,
    /// Requests in the trace.
    pub requests: usize,
    /// Requests whose TTFT met the target.
    pub requests_meeting_ttft: usize,
    /// Requests whose mean ITL met the target (single-token responses count as meeting).
    pub requests_meeting_itl: usize,
    /// Requests meeting both.
    pub requests_meeting_both: usize,
    /// Requests that never completed within the drain limit.
    pub requests_unfinished: usize,
    /// Replica changes (each pool that changed in a decision counts once).
    pub scaling_actions: usize,
    /// Most prefill replicas asked for.
    pub max_prefill: u32,
    /// Most decode replicas asked for.
    pub max_decode: u32,
    /// Mean TTFT over completed requests (ms).
    pub mean_ttft_ms: f64,
    /// 90th percentile TTFT over all requests (ms; unfinished count as infinite).
    pub p90_ttft_ms: f64,
    /// 95th percentile TTFT over all requests (ms; unfinished count as infinite).
    pub p95_ttft_ms: f64,
    /// Of the intervals with arrivals, those whose cohort's 90th-percentile TTFT met the target
    /// (and whose mean ITL did).
    pub intervals_meeting_p90: usize,
    /// Token-weighted mean ITL (ms).
    pub mean_itl_ms: f64,
}

impl Summary {
    /// Share of intervals meeting the SLA (1 when none had traffic).
    pub fn interval_attainment(&self) -> f64 {
        ratio(self.intervals_meeting, self.intervals)
    }
    /// Share of intervals whose cohort's 90th-percentile TTFT met the target.
    pub fn interval_p90_attainment(&self) -> f64 {
        ratio(self.intervals_meeting_p90, self.intervals)
    }
    /// Share of requests meeting both targets (1 for an empty trace).
    pub fn request_attainment(&self) -> f64 {
        ratio(self.requests_meeting_both, self.requests)
    }
    /// Share of requests meeting the TTFT target.
    pub fn ttft_attainment(&self) -> f64 {
        ratio(self.requests_meeting_ttft, self.requests)
    }
    /// Share of requests meeting the ITL target.
    pub fn itl_attainment(&self) -> f64 {
        ratio(self.requests_meeting_itl, self.requests)
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

/// A finished run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    /// The policy's name.
    pub policy: String,
    /// Per reporting interval.
    pub intervals: Vec<IntervalRecord>,
    /// Aggregates.
    pub summary: Summary,
    /// The replicas the policy started with.
    pub initial: (u32, u32),
    /// Decisions: time and the (prefill, decode) target after it.
    pub decisions: Vec<(f64, (u32, u32))>,
}

/// Per-request outcomes, indexed by trace position.
#[derive(Clone, Debug, Default)]
pub struct Outcomes {
    /// Time to first token (s; infinite until there is one).
    pub ttft_s: Vec<f64>,
    /// Inter-token latencies summed (s).
    pub itl_sum_s: Vec<f64>,
    /// Tokens after the first.
    pub tokens: Vec<f64>,
    /// Whether the request completed.
    pub done: Vec<bool>,
}

impl Outcomes {
    /// Outcomes of `n` requests, none served yet.
    pub fn new(n: usize) -> Self {
        Self {
            ttft_s: vec![f64::INFINITY; n],
            itl_sum_s: vec![0.0; n],
            tokens: vec![0.0; n],
            done: vec![false; n],
        }
    }
}

/// The replay's observer: the frontend's windows and per-request outcomes.
struct Recorder<'a> {
    frontend: &'a mut Frontend,
    outcomes: &'a mut Outcomes,
}

impl Observer for Recorder<'_> {
    fn first_token(&mut self, job: &Job, _at_s: f64, ttft_s: f64) {
        self.frontend.first_token(job.isl, ttft_s);
        if let Some(slot) = self.outcomes.ttft_s.get_mut(job.id) {
            *slot = ttft_s;
        }
    }

    fn tokens(&mut self, job: &Job, _at_s: f64, count: f64, itl_s: f64) {
        self.frontend.tokens(count, itl_s);
        if let (Some(sum), Some(tokens)) = (
            self.outcomes.itl_sum_s.get_mut(job.id),
            self.outcomes.tokens.get_mut(job.id),
        ) {
            *sum += count * itl_s;
            *tokens += count;
        }
    }

    fn completed(&mut self, job: &Job, _at_s: f64, outcome: &Outcome) {
        self.frontend.completed(job.osl, outcome.duration_s);
        if let Some(done) = self.outcomes.done.get_mut(job.id) {
            *done = true;
        }
    }
}

/// Replicas of one pool: the target and the scale-ups still starting.
/// Replicas of one pool: the target and the scale-ups still starting.
#[derive(Clone, Debug)]
struct PoolState {
    target: u32,
    serving: u32,
    /// Activation times of replicas starting, oldest first.
    starting: Vec<f64>,
}

impl PoolState {
    fn new(replicas: u32) -> Self {
        Self {
            target: replicas,
            serving: replicas,
            starting: Vec::new(),
        }
    }

    /// Applies a new target; returns whether it changed.
    fn set(&mut self, target: u32, now: f64, delay: f64) -> bool {
        if target == self.target {
            return false;
        }
        if target > self.target {
            for _ in self.target..target {
                self.starting.push(now + delay);
            }
        } else {
            let mut remove = self.target - target;
            // Cancel the replicas still starting first (the newest), then stop serving ones.
            while remove > 0 && self.starting.pop().is_some() {
                remove -= 1;
            }
            self.serving = self.serving.saturating_sub(remove);
        }
        self.target = target;
        true
    }

    /// Activates the replicas whose delay has passed by `now`; returns whether any did.
    fn activate(&mut self, now: f64) -> bool {
        let before = self.starting.len();
        self.starting.retain(|&at| at > now + 1e-9);
        let activated = before - self.starting.len();
        self.serving += u32::try_from(activated).unwrap_or(0);
        activated > 0
    }
}

/// Runs `requests` (sorted by arrival) through `policy`. `initial` is the replicas at t=0;
/// `None` asks the policy itself at t=0 (the oracle), falling back to the minimum.
pub fn run<C: PerformanceCurves>(
    requests: &[Request],
    model: &LatencyModel<'_, C>,
    config: &SimConfig,
    policy: &mut dyn Policy<C>,
    initial: Option<(u32, u32)>,
) -> RunResult {
    let mut replay = Replay::new(requests, model, config, policy, initial, None);
    if let Some(target) = replay.wake(policy) {
        replay.apply(target, policy);
    }
    for k in 0..replay.total_steps() {
        replay.step(k);
        if let Some(target) = replay.wake(policy) {
            replay.apply(target, policy);
        }
    }
    replay.finish(policy)
}

/// One graph's replay, step by step: [`run`] applies each decision as the policy makes it; a
/// caller that arbitrates several graphs (a shared GPU budget) steps them together and applies
/// what it grants instead.
pub struct Replay<'r, 'm, C> {
    requests: &'r [Request],
    model: &'r LatencyModel<'m, C>,
    config: &'r SimConfig,
    step: f64,
    steps_per_interval: u64,
    total_steps: u64,
    delay: f64,
    gpus: (f64, f64),
    prefill: PoolState,
    decode: PoolState,
    cluster: Cluster,
    frontend: Frontend,
    outcomes: Outcomes,
    /// Prefill work started by the engines so far (s), at the end of the last step.
    prefill_work_s: f64,
    next: usize,
    gpu_seconds: f64,
    actions: usize,
    decisions: Vec<(f64, (u32, u32))>,
    max: (u32, u32),
    records: Vec<IntervalRecord>,
    sums: (f64, f64),
    serving_sums: (f64, f64),
    initial: (u32, u32),
    /// End of the last step (s): when a decision is applied.
    now_s: f64,
}

impl<'r, 'm, C: PerformanceCurves> Replay<'r, 'm, C> {
    /// A replay of `requests` starting from `initial` replicas (`None`: the policy's own, else
    /// what it decides at t=0, else the minimum) over `intervals` reporting intervals (`None`:
    /// until the last arrival's).
    pub fn new(
        requests: &'r [Request],
        model: &'r LatencyModel<'m, C>,
        config: &'r SimConfig,
        policy: &mut dyn Policy<C>,
        initial: Option<(u32, u32)>,
        intervals: Option<u64>,
    ) -> Self {
        let step = config.effective_step_s();
        let steps_per_interval = config.steps_per_interval();
        let interval = config.interval_s;
        let last_arrival = requests.last().map(|r| r.arrival_s);
        let intervals =
            intervals.unwrap_or_else(|| last_arrival.map_or(0, |t| (t / interval).floor() as u64 + 1));
        let delay = if policy.ignores_scale_up_delay() {
            0.0
        } else {
            config.scale_up_delay_s.max(0.0)
        };
        let min = config.min_replicas();
        let initial = policy.initial().or(initial).unwrap_or_else(|| {
            let start = Cluster::new(0.0, 0, 0).aggregated(config.aggregated.as_ref());
            let mut frontend = Frontend::default();
            let mut view = View {
                now_s: 0.0,
                asked: (min, min),
                serving: (min, min),
                gauges: Gauges::default(),
                frontend: &mut frontend,
                upcoming: requests,
                first_upcoming: 0,
                cluster: &start,
                model,
                config,
            };
            policy.wake(&mut view).unwrap_or((min, min))
        });
        let initial = config.pools(initial);
        Self {
            requests,
            model,
            config,
            step,
            steps_per_interval,
            total_steps: intervals * steps_per_interval,
            delay,
            // An aggregated pool is charged once, as the decode pool.
            gpus: (
                if config.aggregated.is_some() {
                    0.0
                } else {
                    f64::from(config.limits.prefill_gpus_per_engine.max(1))
                },
                f64::from(config.limits.decode_gpus_per_engine.max(1)),
            ),
            prefill: PoolState::new(initial.0),
            decode: PoolState::new(initial.1),
            cluster: Cluster::new(0.0, initial.0, initial.1).aggregated(config.aggregated.as_ref()),
            frontend: Frontend::default(),
            outcomes: Outcomes::new(requests.len()),
            prefill_work_s: 0.0,
            next: 0,
            gpu_seconds: 0.0,
            actions: 0,
            decisions: Vec::new(),
            max: initial,
            records: Vec::with_capacity(intervals as usize),
            sums: (0.0, 0.0),
            serving_sums: (0.0, 0.0),
            initial,
            now_s: 0.0,
        }
    }

    /// Steps in the replay.
    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    /// Replicas asked for now (prefill, decode).
    pub fn target(&self) -> (u32, u32) {
        (self.prefill.target, self.decode.target)
    }

    /// Replicas serving now (prefill, decode).
    pub fn serving(&self) -> (u32, u32) {
        (self.prefill.serving, self.decode.serving)
    }

    /// The end of the last step (s).
    pub fn now_s(&self) -> f64 {
        self.now_s
    }

    /// What `policy` reads when it wakes now.
    pub fn view(&mut self) -> View<'_, C> {
        View {
            now_s: self.now_s,
            asked: (self.prefill.target, self.decode.target),
            serving: (self.prefill.serving, self.decode.serving),
            gauges: Gauges {
                inflight: self.cluster.in_flight() as f64,
                queued: self.cluster.prefill_pending_count() as f64,
            },
            frontend: &mut self.frontend,
            upcoming: &self.requests[self.next..],
            first_upcoming: self.next,
            cluster: &self.cluster,
            model: self.model,
            config: self.config,
        }
    }

    /// Wakes `policy` when its next wake has come: the replicas it decided (as the
    /// deployment's pools), for the caller to [`Self::apply`] (or to arbitrate first).
    pub fn wake(&mut self, policy: &mut dyn Policy<C>) -> Option<(u32, u32)> {
        if policy.next_wake_s() > self.now_s + EPSILON_S {
            return None;
        }
        // Replicas whose start-up ends now serve when the policy looks.
        if self.prefill.activate(self.now_s) {
            self.cluster.set_prefill_engines(self.prefill.serving);
        }
        if self.decode.activate(self.now_s) {
            self.cluster.set_decode_engines(self.decode.serving);
        }
        let pools = self.config;
        let mut view = self.view();
        policy.wake(&mut view).map(|r| pools.pools(r))
    }

    /// Runs step `k`: activations, arrivals, the engines' progress, the frontend's windows and
    /// the GPU accounting.
    pub fn step(&mut self, k: u64) {
        let step = self.step;
        let t0 = k as f64 * step;
        let t1 = (k + 1) as f64 * step;
        self.now_s = t1;
        if self.prefill.activate(t0) {
            self.cluster.set_prefill_engines(self.prefill.serving);
        }
        if self.decode.activate(t0) {
            self.cluster.set_decode_engines(self.decode.serving);
        }
        while let Some(r) = self.requests.get(self.next).filter(|r| r.arrival_s < t1) {
            self.cluster.arrive(job(self.next, r));
            self.frontend.arrived();
            self.next += 1;
        }
        let engines = (
            f64::from(self.cluster.prefill_engines()),
            f64::from(self.cluster.decode_engines()),
        );
        let mut recorder = Recorder {
            frontend: &mut self.frontend,
            outcomes: &mut self.outcomes,
        };
        self.cluster.advance(self.model, t1, &mut recorder);
        let snapshot = self.cluster.snapshot();
        let work = snapshot.prefill_work_started_s - self.prefill_work_s;
        self.prefill_work_s = snapshot.prefill_work_started_s;
        self.frontend.engines(engines, step, work);
        self.frontend.kv_usage(snapshot.kv_usage);
        self.frontend.prefill_queue(snapshot.prefill_queue as f64);
        // As the operator reads it: requests in prefill, at most one per engine, over the engines.
        let active = snapshot
            .prefill_active_tokens
            .iter()
            .filter(|t| **t > 0.0)
            .count();
        if !snapshot.prefill_active_tokens.is_empty() {
            self.frontend
                .prefill_busy(active as f64 / snapshot.prefill_active_tokens.len() as f64);
        }
        self.frontend.mark(t1);
        let (p_gpus, d_gpus) = self.gpus;
        self.gpu_seconds +=
            (f64::from(self.prefill.target) * p_gpus + f64::from(self.decode.target) * d_gpus) * step;
        self.sums.0 += f64::from(self.prefill.target) * step;
        self.sums.1 += f64::from(self.decode.target) * step;
        self.serving_sums.0 += f64::from(self.cluster.prefill_engines()) * step;
        self.serving_sums.1 += f64::from(self.cluster.decode_engines()) * step;
        if (k + 1).is_multiple_of(self.steps_per_interval) {
            let span = self.steps_per_interval as f64 * step;
            self.records.push(IntervalRecord {
                start_s: t1 - span,
                arrivals: 0,
                mean_isl: f64::NAN,
                mean_osl: f64::NAN,
                prefill: self.sums.0 / span,
                decode: self.sums.1 / span,
                gpus: (self.sums.0 * p_gpus + self.sums.1 * d_gpus) / span,
                prefill_serving: self.serving_sums.0 / span,
                decode_serving: self.serving_sums.1 / span,
                ttft_ms: f64::NAN,
                itl_ms: f64::NAN,
            });
            self.sums = (0.0, 0.0);
            self.serving_sums = (0.0, 0.0);
        }
    }

    /// Asks for `(prefill, decode)` replicas from the end of the last step on: added replicas
    /// serve after the scale-up delay, removed ones stop at once. `policy` hears of the change
    /// (what it asked for may have been cut).
    pub fn apply(&mut self, replicas: (u32, u32), policy: &mut dyn Policy<C>) {
        let (p, d) = self.config.pools(replicas);
        let t1 = self.now_s;
        let from = self.target();
        let changed_p = self.prefill.set(p, t1, self.delay);
        let changed_d = self.decode.set(d, t1, self.delay);
        // An aggregated pool's one change is counted once.
        let aggregated = self.config.aggregated.is_some();
        self.actions += usize::from(changed_p && !aggregated) + usize::from(changed_d);
        // Scale-downs are immediate; a zero delay activates at once as well.
        if self.prefill.activate(t1) || changed_p {
            self.cluster.set_prefill_engines(self.prefill.serving);
        }
        if self.decode.activate(t1) || changed_d {
            self.cluster.set_decode_engines(self.decode.serving);
        }
        if changed_p || changed_d {
            self.decisions.push((t1, (p, d)));
            self.max = (self.max.0.max(p), self.max.1.max(d));
            policy.applied(t1, from, (p, d), self.serving());
        }
    }

    /// Drains what is still in flight (the last replicas serve it, not charged, no decisions)
    /// and summarises the run.
    pub fn finish(mut self, policy: &dyn Policy<C>) -> RunResult {
        let step = self.step;
        let mut t = self.total_steps as f64 * step;
        let drain_end = t + self.config.drain_limit_s.max(0.0);
        let mut recorder = Recorder {
            frontend: &mut self.frontend,
            outcomes: &mut self.outcomes,
        };
        while !self.cluster.is_idle() && t < drain_end {
            t += step;
            if self.prefill.activate(t - step) {
                self.cluster.set_prefill_engines(self.prefill.serving);
            }
            if self.decode.activate(t - step) {
                self.cluster.set_decode_engines(self.decode.serving);
            }
            self.cluster.advance(self.model, t, &mut recorder);
        }

        let summary = summarize(
            self.requests,
            &self.outcomes,
            &mut self.records,
            self.config,
            self.config.interval_s,
        );
        RunResult {
            policy: policy.name(),
            intervals: self.records,
            summary: Summary {
                gpu_hours: self.gpu_seconds / 3600.0,
                scaling_actions: self.actions,
                max_prefill: self.max.0,
                max_decode: self.max.1,
                ..summary
            },
            initial: self.initial,
            decisions: self.decisions,
        }
    }
}

/// The latency model's job for request `id`.
pub fn job(id: usize, r: &Request) -> Job {
    Job {
        id,
        arrival_s: r.arrival_s,
        isl: r.isl,
        osl: r.osl,
    }
}

/// Fills the cohort statistics of `records` and computes the request-level aggregates.
pub fn summarize(
    requests: &[Request],
    outcomes: &Outcomes,
    records: &mut [IntervalRecord],
    config: &SimConfig,
    interval: f64,
) -> Summary {
    let sla = &config.sla;
    #[derive(Default, Clone, Copy)]
    struct Cohort {
        n: usize,
        isl: f64,
        osl: f64,
        ttft: f64,
        itl_sum: f64,
        tokens: f64,
    }
    let mut cohorts = vec![Cohort::default(); records.len()];
    let mut cohort_ttfts: Vec<Vec<f64>> = vec![Vec::new(); records.len()];
    let (mut meet_ttft, mut meet_itl, mut meet_both, mut unfinished) = (0, 0, 0, 0);
    let (mut ttft_sum, mut ttft_n, mut itl_sum, mut tokens) = (0.0, 0.0, 0.0, 0.0);
    let mut ttfts = Vec::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        let ttft = outcomes.ttft_s[i];
        let ok_ttft = ttft * 1000.0 <= sla.ttft_ms;
        let mean_itl = if outcomes.tokens[i] > 0.0 {
            outcomes.itl_sum_s[i] / outcomes.tokens[i]
        } else {
            0.0
        };
        let ok_itl = outcomes.done[i] && mean_itl * 1000.0 <= sla.itl_ms;
        meet_ttft += usize::from(ok_ttft);
        meet_itl += usize::from(ok_itl);
        meet_both += usize::from(ok_ttft && ok_itl);
        unfinished += usize::from(!outcomes.done[i]);
        if ttft.is_finite() {
            ttft_sum += ttft;
            ttft_n += 1.0;
        }
        ttfts.push(ttft);
        itl_sum += outcomes.itl_sum_s[i];
        tokens += outcomes.tokens[i];
        let index = (r.arrival_s / interval).floor() as usize;
        if let Some(list) = cohort_ttfts.get_mut(index) {
            list.push(ttft);
        }
        if let Some(c) = cohorts.get_mut(index) {
            c.n += 1;
            c.isl += r.isl;
            c.osl += r.osl;
            c.ttft += ttft;
            c.itl_sum += outcomes.itl_sum_s[i];
            c.tokens += outcomes.tokens[i];
        }
    }
    for (record, c) in records.iter_mut().zip(&cohorts) {
        record.arrivals = c.n;
        if c.n > 0 {
            let n = c.n as f64;
            record.mean_isl = c.isl / n;
            record.mean_osl = c.osl / n;
            record.ttft_ms = c.ttft / n * 1000.0;
            record.itl_ms = c.itl_sum / c.tokens * 1000.0;
        }
    }
    let intervals = records.iter().filter(|r| r.arrivals > 0).count();
    let intervals_meeting = records.iter().filter(|r| r.meets(sla) == Some(true)).count();
    let mut intervals_meeting_p90 = 0;
    for (r, list) in records.iter().zip(cohort_ttfts.iter_mut()) {
        if r.arrivals > 0
            && (r.itl_ms.is_nan() || r.itl_ms <= sla.itl_ms)
            && nearest_rank(list, 0.9) * 1000.0 <= sla.ttft_ms
        {
            intervals_meeting_p90 += 1;
        }
    }
    let p90 = nearest_rank(&mut ttfts, 0.9) * 1000.0;
    let p95 = nearest_rank(&mut ttfts, 0.95) * 1000.0;
    Summary {
        gpu_hours: 0.0,
        intervals,
        intervals_meeting,
        requests: requests.len(),
        requests_meeting_ttft: meet_ttft,
        requests_meeting_itl: meet_itl,
        requests_meeting_both: meet_both,
        requests_unfinished: unfinished,
        scaling_actions: 0,
        max_prefill: 0,
        max_decode: 0,
        mean_ttft_ms: if ttft_n > 0.0 {
            ttft_sum / ttft_n * 1000.0
        } else {
            f64::NAN
        },
        p90_ttft_ms: p90,
        p95_ttft_ms: p95,
        intervals_meeting_p90,
        mean_itl_ms: if tokens > 0.0 {
            itl_sum / tokens * 1000.0
        } else {
            f64::NAN
        },
    }
}

/// Nearest-rank `q`-quantile (sorts `values`); NaN when empty.
fn nearest_rank(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}
