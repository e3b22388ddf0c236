//! The policies a replay compares. The SLA planner and the load-based planner run in the
//! planning loop the operator runs ([`PolicyLoop`], [`LoopPolicy`]); the others are baselines
//! and bounds.

use std::{collections::VecDeque, time::Duration};

use planner_core::{
    interpolation::PerformanceCurves,
    load::LoadConfig,
    policy::{
        Answer, Check, Decision, Due, Input, LoopSettings, Observed, Planner, PolicyLoop, Proposal, Replicas,
    },
    predictor::{PredictorConfig, PredictorKind},
    sla::{self, Corrections},
    state::{IntervalMetrics, QueueingPlan, SlaModel, SlaPlannerConfig},
};

use crate::{
    latency::{Cluster, Job, Observer},
    observe::OBSERVED_TTFT_QUANTILE,
    run::{Periodic, Policy, SimConfig, View, job},
};

/// Which policy to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicySpec {
    /// Knows the next interval's load and picks the fewest replicas for which the latency
    /// model meets the SLA, with no start-up delay: the lower bound on GPU cost.
    Oracle,
    /// The SLA planner's formulas (corrections 1.0) fed the actual next-interval load.
    PerfectPrediction,
    /// The SLA planner.
    Sla {
        /// Sizing model.
        model: SlaModel,
        /// Load predictor.
        predictor: PredictorKind,
        /// Whether correction factors are applied.
        correction: bool,
        /// Whether prefill is sized with headroom ([`HEADROOM_UTILIZATION`]) instead of for
        /// saturation (upstream).
        headroom: bool,
    },
    /// The load-based planner (the thresholds of Dynamo's first, load-based planner).
    LoadBased,
    /// A Kubernetes HPA on utilisation with 300 s scale-down stabilisation.
    Hpa,
    /// A fixed deployment: the oracle's peak replicas of each pool, all the time.
    FixedPeak,
}

/// `spec.sla.prefillUtilization` of the `sla-*-u70` policies.
pub const HEADROOM_UTILIZATION: f64 = 0.7;

const PREDICTORS: [PredictorKind; 4] = [
    PredictorKind::Constant,
    PredictorKind::Arima,
    PredictorKind::Kalman,
    PredictorKind::Prophet,
];

impl PolicySpec {
    /// Whether the policy plans one pool of aggregated engines (upstream's throughput formulas
    /// and the perfect prediction built on them size two pools).
    pub fn plans_aggregated(&self) -> bool {
        match self {
            Self::Oracle | Self::LoadBased | Self::Hpa | Self::FixedPeak => true,
            Self::Sla { model, .. } => *model == SlaModel::Queueing,
            Self::PerfectPrediction => false,
        }
    }

    /// The standard comparison: every policy.
    pub fn standard() -> Vec<Self> {
        let mut all = vec![Self::Oracle, Self::PerfectPrediction];
        for predictor in PREDICTORS {
            all.push(Self::Sla {
                model: SlaModel::Queueing,
                predictor,
                correction: true,
                headroom: false,
            });
        }
        for predictor in PREDICTORS {
            for correction in [true, false] {
                all.push(Self::Sla {
                    model: SlaModel::Upstream,
                    predictor,
                    correction,
                    headroom: false,
                });
            }
        }
        for predictor in PREDICTORS {
            all.push(Self::Sla {
                model: SlaModel::Upstream,
                predictor,
                correction: true,
                headroom: true,
            });
        }
        all.extend([Self::LoadBased, Self::Hpa, Self::FixedPeak]);
        all
    }

    /// Name used on the command line and in reports.
    pub fn name(&self) -> String {
        self.static_name().to_string()
    }

    fn static_name(&self) -> &'static str {
        use PredictorKind::{Arima, Constant, Kalman, Prophet};
        match self {
            Self::Oracle => "oracle",
            Self::PerfectPrediction => "perfect-prediction",
            Self::Sla {
                model: SlaModel::Queueing,
                predictor,
                ..
            } => match predictor {
                Constant => "sla-constant",
                Arima => "sla-arima",
                Kalman => "sla-kalman",
                Prophet => "sla-prophet",
            },
            Self::Sla {
                model: SlaModel::Upstream,
                predictor,
                correction,
                headroom,
            } => match (predictor, correction, headroom) {
                (Constant, true, false) => "upstream-constant",
                (Constant, false, false) => "upstream-constant-nocorr",
                (Arima, true, false) => "upstream-arima",
                (Arima, false, false) => "upstream-arima-nocorr",
                (Kalman, true, false) => "upstream-kalman",
                (Kalman, false, false) => "upstream-kalman-nocorr",
                (Prophet, true, false) => "upstream-prophet",
                (Prophet, false, false) => "upstream-prophet-nocorr",
                (Constant, true, true) => "upstream-constant-u70",
                (Constant, false, true) => "upstream-constant-nocorr-u70",
                (Arima, true, true) => "upstream-arima-u70",
                (Arima, false, true) => "upstream-arima-nocorr-u70",
                (Kalman, true, true) => "upstream-kalman-u70",
                (Kalman, false, true) => "upstream-kalman-nocorr-u70",
                (Prophet, true, true) => "upstream-prophet-u70",
                (Prophet, false, true) => "upstream-prophet-nocorr-u70",
            },
            Self::LoadBased => "load-based",
            Self::Hpa => "hpa",
            Self::FixedPeak => "fixed-peak",
        }
    }

    /// Every accepted name.
    pub fn names() -> Vec<&'static str> {
        Self::standard().iter().map(Self::static_name).collect()
    }

    /// Parses a name (see [`Self::names`]).
    pub fn parse(name: &str) -> Option<Self> {
        Self::standard().into_iter().find(|spec| spec.name() == name)
    }

    /// Whether the policy runs the planning loop the operator runs (the SLA and load-based
    /// planners), which a shared budget can arbitrate.
    pub fn runs_the_loop(&self) -> bool {
        matches!(self, Self::Sla { .. } | Self::LoadBased)
    }

    /// The policy for `config`; `peak` sizes the fixed deployment.
    pub fn build<C: PerformanceCurves>(self, config: &SimConfig, peak: (u32, u32)) -> Box<dyn Policy<C>> {
        match self {
            Self::Oracle => Box::new(Oracle::default()),
            Self::PerfectPrediction => Box::new(PerfectPrediction::new(config)),
            Self::Sla { .. } | Self::LoadBased => Box::new(self.build_loop(config).unwrap_or_else(|| {
                // Both are loop policies.
                LoopPolicy::load_based(config)
            })),
            Self::Hpa => Box::new(Hpa::default()),
            Self::FixedPeak => Box::new(Fixed {
                replicas: peak,
                name: self.name(),
            }),
        }
    }

    /// The loop policy for `config`, when the spec is one ([`Self::runs_the_loop`]).
    pub fn build_loop(self, config: &SimConfig) -> Option<LoopPolicy> {
        match self {
            Self::Sla {
                model,
                predictor,
                correction,
                headroom,
            } => Some(LoopPolicy::sla(config, model, predictor, correction, headroom)),
            Self::LoadBased => Some(LoopPolicy::load_based(config)),
            _ => None,
        }
    }
}

/// The planning loop the operator runs ([`PolicyLoop`]: the SLA planner or the load-based
/// planner, with the operator's cadence, guards, ready gate and scale-up delay measurement),
/// woken when it says, reading the replayed frontend as the operator reads Prometheus.
pub struct LoopPolicy {
    name: String,
    policy: PolicyLoop,
    /// The decision of the last wake that made one.
    last: Option<Decision>,
    /// The queueing plan of the last check that made one.
    plan: Option<QueueingPlan>,
    /// The check the last wake ran.
    check: Option<Check>,
}

/// What the replay's frontend says of a graph before its first request.
const AWAITING: &str =
    "waiting for the first request: the frontend has counted none yet; planning starts with it";

fn at(now_s: f64) -> Duration {
    Duration::from_secs_f64(now_s.max(0.0))
}

impl LoopPolicy {
    /// The loop `policy`, named `name` in reports.
    pub fn new(name: impl Into<String>, policy: PolicyLoop) -> Self {
        Self {
            name: name.into(),
            policy,
            last: None,
            plan: None,
            check: None,
        }
    }

    /// The SLA planner with the simulator's interval, SLA, limits and queueing settings, cold
    /// started (no warm-up trace); with `headroom`, upstream's prefill is sized for
    /// [`HEADROOM_UTILIZATION`]. It measures the scale-up delay on its replicas (expecting
    /// `sim.expected_scale_up_delay_s` until then), as the operator does.
    pub fn sla(
        sim: &SimConfig,
        model: SlaModel,
        predictor: PredictorKind,
        correction: bool,
        headroom: bool,
    ) -> Self {
        let mut sla = sim.sla;
        if headroom {
            sla.prefill_utilization = HEADROOM_UTILIZATION;
        }
        let config = SlaPlannerConfig {
            interval_s: sim.interval_s,
            sla,
            limits: sim.limits,
            correction,
            predictor: PredictorConfig {
                kind: predictor,
                interval_seconds: sim.interval_s,
                ..PredictorConfig::default()
            },
            model,
            queueing: sim.queueing.clone(),
            aggregated: sim.aggregated,
        };
        let name = PolicySpec::Sla {
            model,
            predictor,
            correction,
            headroom,
        }
        .name();
        Self::with_config(name, config, sim.expected_scale_up_delay_s)
    }

    /// The SLA planner with `config`, expecting a scale-up delay of `expected_s` until it has
    /// measured one.
    pub fn with_config(name: impl Into<String>, config: SlaPlannerConfig, expected_s: Option<f64>) -> Self {
        let period = config.queueing.fast_path.period_s;
        let settings = LoopSettings {
            interval: at(config.interval_s),
            fast_period: (period.is_finite() && period > 0.0).then(|| at(period)),
            expected_scale_up_delay: expected_s.filter(|s| s.is_finite() && *s >= 0.0).map(at),
            ..LoopSettings::default()
        };
        Self::new(name, PolicyLoop::new(Planner::sla(config), settings))
    }

    /// The load-based planner with its thresholds (Dynamo's first planner's) and a 10 s interval,
    /// within the simulator's limits.
    pub fn load_based(sim: &SimConfig) -> Self {
        let config = LoadConfig {
            prefill: sim.limits.prefill,
            decode: sim.limits.decode,
            max_gpu_budget: sim.limits.max_gpu_budget,
            prefill_gpus_per_engine: sim.limits.prefill_gpus_per_engine,
            decode_gpus_per_engine: sim.limits.decode_gpus_per_engine,
            ..LoadConfig::default()
        };
        let settings = LoopSettings {
            interval: LOAD_INTERVAL,
            ..LoopSettings::default()
        };
        Self::new(
            PolicySpec::LoadBased.name(),
            PolicyLoop::new(Planner::load(config, sim.aggregated.is_some()), settings),
        )
    }

    /// Renames the policy (for reports comparing settings).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The loop.
    pub fn policy_loop(&self) -> &PolicyLoop {
        &self.policy
    }

    /// The loop, to change its settings (a shared budget's membership).
    pub fn policy_loop_mut(&mut self) -> &mut PolicyLoop {
        &mut self.policy
    }

    /// The SLA planner's configuration (`None` for the load planner).
    pub fn config(&self) -> Option<&SlaPlannerConfig> {
        match self.policy.planner() {
            Planner::Sla { config, .. } => Some(config),
            Planner::Load { .. } => None,
        }
    }

    /// The scale-up delay measured so far.
    pub fn measured_delay(&self) -> Option<Duration> {
        self.policy.measured_delay()
    }

    fn replicas<C>(view: &View<'_, C>) -> Replicas {
        Replicas {
            serving: view.serving,
            asked: view.asked,
        }
    }

    /// What the frontend shows for an interval: nothing before the first request (as a new
    /// graph's frontend has no request series), else the load samples or the frontend's
    /// metrics, whichever the planner reads. Both windows start afresh.
    fn observe_interval<C>(&self, view: &mut View<'_, C>) -> Observed {
        let quantile = self
            .policy
            .sla_targets()
            .and_then(|(_, percentile)| percentile)
            .map_or(OBSERVED_TTFT_QUANTILE, |p| p / 100.0);
        let observation = view.frontend.take_interval(view.gauges, quantile);
        let samples = view.frontend.take_samples();
        if !view.frontend.arrived_any() {
            Observed::AwaitingTraffic(AWAITING.into())
        } else if self.policy.reads_samples() {
            Observed::Samples(Ok(samples))
        } else {
            Observed::Frontend(IntervalMetrics::Observed(observation))
        }
    }

    /// Stages 1 and 2 at a wake: what is due, and the planner on what the frontend shows;
    /// `None` when nothing is due.
    pub fn propose<C: PerformanceCurves>(&mut self, view: &mut View<'_, C>) -> Option<Proposal> {
        let now = at(view.now_s);
        let replicas = Self::replicas(view);
        self.check = None;
        let input = match self.policy.due(now, replicas) {
            Due::Idle => return None,
            Due::Interval { .. } => Input::Interval(self.observe_interval(view)),
            Due::Fast { window } => Input::Fast(Some(view.frontend.fast_signals(
                view.now_s,
                window.as_secs_f64(),
                view.gauges,
            ))),
        };
        Some(self.policy.decide(now, input, replicas, Some(view.model.curves)))
    }

    /// A shared budget's member between its own checks, when a round may have changed its
    /// grant: it asks again for what it last wanted.
    pub fn propose_grant<C: PerformanceCurves>(&mut self, view: &View<'_, C>) -> Proposal {
        self.policy
            .decide::<C>(at(view.now_s), Input::Grant, Self::replicas(view), None)
    }

    /// Stage 3: the decision with the budget's `answer` (for a member), the replicas to ask
    /// for now.
    pub fn settle<C>(
        &mut self,
        view: &View<'_, C>,
        proposal: Proposal,
        answer: Option<&Answer>,
    ) -> Option<(u32, u32)> {
        let decision = self.policy.settle(
            at(view.now_s),
            proposal,
            answer,
            Self::replicas(view),
            Some(view.ready()),
        );
        if decision.plan.is_some() {
            self.plan.clone_from(&decision.plan);
        }
        self.check = Some(decision.check);
        let scale_to = decision.scale_to;
        self.last = Some(decision);
        scale_to
    }
}

/// The load-based planner's interval in the simulator: the thresholds of Dynamo's first planner
/// were tuned at this cadence.
pub const LOAD_INTERVAL: Duration = Duration::from_secs(10);

impl<C: PerformanceCurves> Policy<C> for LoopPolicy {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn next_wake_s(&self) -> f64 {
        self.policy.next_wake().map_or(0.0, |t| t.as_secs_f64())
    }
    fn wake(&mut self, view: &mut View<'_, C>) -> Option<(u32, u32)> {
        let proposal = self.propose(view)?;
        self.settle(view, proposal, None)
    }
    fn applied(&mut self, now_s: f64, from: (u32, u32), to: (u32, u32), serving: (u32, u32)) {
        self.policy.actuated(at(now_s), from, to);
        // The operator reconciles again once its status is written, and sees them then.
        self.policy.observe(at(now_s), Replicas { serving, asked: to });
    }
    fn gpu_budget_changed(&mut self, budget: Option<u32>) {
        if let Some(mut config) = self.config().cloned() {
            config.limits.max_gpu_budget = budget;
            self.policy.set_sla_config(config);
        } else if let Planner::Load {
            config, aggregated, ..
        } = self.policy.planner()
        {
            let (mut config, aggregated) = (*config, *aggregated);
            config.max_gpu_budget = budget;
            self.policy.set_load_config(config, aggregated);
        }
    }
    fn last_plan(&self) -> Option<&QueueingPlan> {
        self.plan.as_ref()
    }
    fn last_decision(&self) -> Option<&Decision> {
        self.last.as_ref()
    }
    fn last_check(&self) -> Option<&'static str> {
        self.check.map(Check::as_str)
    }
}

/// The SLA planner's replica formulas with the actual load of the next interval and neutral
/// correction factors: what the planner would do with a perfect predictor.
pub struct PerfectPrediction {
    wakes: Periodic,
}

impl PerfectPrediction {
    /// Deciding every interval of `sim`.
    pub fn new(sim: &SimConfig) -> Self {
        Self {
            wakes: Periodic::every(sim.interval_s),
        }
    }
}

impl<C: PerformanceCurves> Policy<C> for PerfectPrediction {
    fn name(&self) -> String {
        PolicySpec::PerfectPrediction.name()
    }
    fn next_wake_s(&self) -> f64 {
        self.wakes.next_s()
    }
    fn wake(&mut self, view: &mut View<'_, C>) -> Option<(u32, u32)> {
        self.wakes.woke(view.now_s);
        let interval = view.config.interval_s;
        let plan = sla::plan_replicas(
            view.model.curves,
            &view.next_load(interval),
            &view.config.sla,
            &Corrections::default(),
            &view.config.limits,
            interval,
        );
        Some((plan.prefill, plan.decode))
    }
}

/// A Kubernetes HorizontalPodAutoscaler per pool, as its controller computes replicas:
/// `ceil(ready * metric / target)` every 15 s, no change within a 10 % tolerance, scale-up at
/// most to `max(2 * current, current + 4)` per period, and scale-down to the highest
/// recommendation of the last 300 s (the default stabilisation window). Metrics: prefill
/// utilisation (busy share of the prefill engines, like GPU utilisation) and decode KV-cache
/// usage, both averaged over the period.
pub struct Hpa {
    /// Target prefill utilisation.
    pub prefill_target: f64,
    /// Target decode KV-cache usage.
    pub decode_target: f64,
    /// Seconds between evaluations.
    pub period_s: f64,
    /// Scale-down stabilisation window (s).
    pub stabilisation_s: f64,
    history: VecDeque<(f64, u32, u32)>,
    next_s: Option<f64>,
}

impl Default for Hpa {
    fn default() -> Self {
        Self {
            prefill_target: 0.7,
            decode_target: 0.5,
            period_s: 15.0,
            stabilisation_s: 300.0,
            history: VecDeque::new(),
            next_s: None,
        }
    }
}

const HPA_TOLERANCE: f64 = 0.1;

fn hpa_recommend(ready: u32, current: u32, metric: f64, target: f64, min: u32, max: u32) -> u32 {
    if ready == 0 || !metric.is_finite() || target <= 0.0 {
        return current;
    }
    let ratio = metric / target;
    if (ratio - 1.0).abs() <= HPA_TOLERANCE {
        return current;
    }
    let desired = (f64::from(ready) * ratio).ceil().min(f64::from(u32::MAX)) as u32;
    let up_limit = current.saturating_mul(2).max(current.saturating_add(4));
    desired.min(up_limit).clamp(min, max)
}

impl<C> Policy<C> for Hpa {
    fn name(&self) -> String {
        PolicySpec::Hpa.name()
    }
    fn next_wake_s(&self) -> f64 {
        self.next_s.unwrap_or(self.period_s)
    }
    fn wake(&mut self, ctx: &mut View<'_, C>) -> Option<(u32, u32)> {
        let mut wakes = Periodic::every(self.period_s);
        wakes.woke_after(self.next_s, ctx.now_s);
        self.next_s = Some(wakes.next_s());
        let (min, max) = (ctx.config.min_replicas(), ctx.config.max_replicas());
        let samples = ctx.frontend.take_samples();
        let utilisation = ctx.frontend.take_utilisation();
        let kv = &samples.decode_kv_usage;
        let kv_mean = if kv.is_empty() {
            f64::NAN
        } else {
            kv.iter().sum::<f64>() / kv.len() as f64
        };
        let p = hpa_recommend(
            ctx.serving.0,
            ctx.asked.0,
            utilisation,
            self.prefill_target,
            min,
            max,
        );
        let d = hpa_recommend(ctx.serving.1, ctx.asked.1, kv_mean, self.decode_target, min, max);
        self.history.push_back((ctx.now_s, p, d));
        while self
            .history
            .front()
            .is_some_and(|(t, _, _)| *t < ctx.now_s - self.stabilisation_s)
        {
            self.history.pop_front();
        }
        let stabilise = |desired: u32, current: u32, pick: fn(&(f64, u32, u32)) -> u32| {
            if desired >= current {
                desired
            } else {
                let highest = self.history.iter().map(pick).max().unwrap_or(desired);
                highest.min(current)
            }
        };
        Some((
            stabilise(p, ctx.asked.0, |h| h.1),
            stabilise(d, ctx.asked.1, |h| h.2),
        ))
    }
}

/// A fixed deployment.
pub struct Fixed {
    /// Replicas (prefill, decode).
    pub replicas: (u32, u32),
    /// Name in reports.
    pub name: String,
}

impl<C> Policy<C> for Fixed {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn next_wake_s(&self) -> f64 {
        f64::INFINITY
    }
    fn wake(&mut self, _: &mut View<'_, C>) -> Option<(u32, u32)> {
        None
    }
    fn initial(&self) -> Option<(u32, u32)> {
        Some(self.replicas)
    }
}

/// The oracle: for each interval, the fewest replicas of each pool for which the latency
/// model, run forward on a copy of the deployment with the interval's actual arrivals, meets
/// both targets. Its replicas serve at once (no start-up delay): it is the lower bound on GPU
/// cost, not a policy one could deploy.
///
/// Judged on the requests that arrive in the interval plus those already waiting for their
/// first token, followed until they complete (at most one more interval, with the same
/// replicas and the later arrivals competing): mean TTFT and token-weighted mean ITL (tokens of
/// requests already decoding count too). Prefill is sized first with decode at the maximum,
/// then decode with that prefill; each by binary search, assuming latency falls as replicas
/// grow. When even the maximum cannot meet a target (prompts too long for the TTFT target,
/// say), the target becomes 5 % above what the maximum achieves: the fewest replicas that do
/// about as well as is possible.
#[derive(Clone, Copy, Debug, Default)]
pub struct Oracle {
    next_s: Option<f64>,
}

/// What one candidate achieved.
#[derive(Clone, Copy, Debug)]
struct Trial {
    ttft_ms: f64,
    itl_ms: f64,
}

struct TrialObserver {
    /// Watched ids: `[lo, hi)`; `ttft[i - lo]` is NaN when not watched, infinite until known.
    lo: usize,
    ttft: Vec<f64>,
    tokens: f64,
    itl_sum: f64,
    hi: usize,
}

impl Observer for TrialObserver {
    fn first_token(&mut self, job: &Job, _: f64, ttft_s: f64) {
        if let Some(slot) = job.id.checked_sub(self.lo).and_then(|i| self.ttft.get_mut(i))
            && !slot.is_nan()
        {
            *slot = ttft_s;
        }
    }
    fn tokens(&mut self, job: &Job, _: f64, count: f64, itl_s: f64) {
        if job.id < self.hi {
            self.tokens += count;
            self.itl_sum += count * itl_s;
        }
    }
}

impl Oracle {
    fn trial<C: PerformanceCurves>(ctx: &View<'_, C>, prefill: u32, decode: u32) -> Trial {
        let interval = ctx.config.interval_s;
        let step = ctx.config.effective_step_s();
        let end = ctx.now_s + interval;
        let cohort = ctx.upcoming.iter().take_while(|r| r.arrival_s < end).count();
        let hi = ctx.first_upcoming + cohort;
        let waiting = ctx.cluster.waiting_for_first_token();
        let lo = waiting
            .iter()
            .map(|j| j.id)
            .min()
            .unwrap_or(ctx.first_upcoming)
            .min(ctx.first_upcoming);
        let mut ttft = vec![f64::NAN; hi - lo];
        for j in &waiting {
            if let Some(slot) = ttft.get_mut(j.id - lo) {
                *slot = f64::INFINITY;
            }
        }
        for slot in ttft.iter_mut().skip(ctx.first_upcoming - lo) {
            *slot = f64::INFINITY;
        }
        let mut observer = TrialObserver {
            lo,
            ttft,
            tokens: 0.0,
            itl_sum: 0.0,
            hi,
        };
        let mut cluster: Cluster = ctx.cluster.clone();
        cluster.set_prefill_engines(prefill);
        cluster.set_decode_engines(decode);
        let mut next = 0usize;
        let mut t = ctx.now_s;
        let limit = end + interval;
        let mut k = 0u64;
        while t < limit - 1e-9 {
            k += 1;
            let t1 = ctx.now_s + k as f64 * step;
            while let Some(r) = ctx.upcoming.get(next).filter(|r| r.arrival_s < t1) {
                cluster.arrive(job(ctx.first_upcoming + next, r));
                next += 1;
            }
            cluster.advance(ctx.model, t1, &mut observer);
            t = t1;
            if t >= end && observer.ttft.iter().all(|v| !v.is_infinite()) && cluster.in_flight_before(hi) == 0
            {
                break;
            }
        }
        let mut sum = 0.0;
        let mut n = 0.0;
        for (i, v) in observer.ttft.iter().enumerate() {
            if v.is_nan() {
                continue;
            }
            let id = lo + i;
            let arrival = if id >= ctx.first_upcoming {
                ctx.upcoming
                    .get(id - ctx.first_upcoming)
                    .map_or(t, |r| r.arrival_s)
            } else {
                waiting.iter().find(|j| j.id == id).map_or(t, |j| j.arrival_s)
            };
            // A request still without its first token counts with what it has waited so far.
            sum += if v.is_infinite() { t - arrival } else { *v };
            n += 1.0;
        }
        Trial {
            ttft_ms: if n > 0.0 { sum / n * 1000.0 } else { 0.0 },
            itl_ms: if observer.tokens > 0.0 {
                observer.itl_sum / observer.tokens * 1000.0
            } else {
                0.0
            },
        }
    }

    /// Smallest `n` in `[lo, hi]` with `ok(n)`, given `ok(hi)`.
    fn smallest(mut lo: u32, mut hi: u32, mut ok: impl FnMut(u32) -> bool) -> u32 {
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if ok(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        hi
    }
}

/// Relaxes a target the maximum cannot meet to 5 % above what the maximum achieves.
fn achievable(target: f64, at_max: f64) -> f64 {
    if at_max <= target {
        target
    } else {
        at_max * 1.05 + 1e-6
    }
}

impl<C: PerformanceCurves> Policy<C> for Oracle {
    fn name(&self) -> String {
        PolicySpec::Oracle.name()
    }
    fn next_wake_s(&self) -> f64 {
        // The first decision is the replay's starting replicas, at t=0.
        self.next_s.unwrap_or(0.0)
    }
    fn ignores_scale_up_delay(&self) -> bool {
        true
    }
    fn wake(&mut self, ctx: &mut View<'_, C>) -> Option<(u32, u32)> {
        let interval = ctx.config.interval_s;
        self.next_s = Some((ctx.now_s / interval + 1e-9).floor() * interval + interval);
        let sla = ctx.config.sla;
        let (min, max) = (ctx.config.min_replicas(), ctx.config.max_replicas());
        let at_max = Self::trial(ctx, max, max);
        if ctx.config.aggregated.is_some() {
            // One pool: the fewest engines meeting both targets (or what the most achieve).
            let ttft_target = achievable(sla.ttft_ms, at_max.ttft_ms);
            let itl_target = achievable(sla.itl_ms, at_max.itl_ms);
            let n = Self::smallest(min, max, |n| {
                let trial = Self::trial(ctx, n, n);
                trial.ttft_ms <= ttft_target && trial.itl_ms <= itl_target
            });
            let n = sla::apply_single_pool_budget(
                n,
                ctx.config.limits.decode_gpus_per_engine,
                min,
                ctx.config.limits.max_gpu_budget,
            );
            return Some((n, n));
        }
        let ttft_target = achievable(sla.ttft_ms, at_max.ttft_ms);
        let prefill = Self::smallest(min, max, |p| Self::trial(ctx, p, max).ttft_ms <= ttft_target);
        let with_prefill = Self::trial(ctx, prefill, max);
        let ttft_target = ttft_target.max(with_prefill.ttft_ms);
        let itl_target = achievable(sla.itl_ms, with_prefill.itl_ms);
        let decode = Self::smallest(min, max, |d| {
            let trial = Self::trial(ctx, prefill, d);
            trial.ttft_ms <= ttft_target && trial.itl_ms <= itl_target
        });
        let (p, d, _) = sla::apply_gpu_budget(prefill, decode, &ctx.config.limits);
        Some((p, d))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_round_trip() {
        let names = PolicySpec::names();
        assert_eq!(names.len(), 21);
        assert!(names.contains(&"sla-arima"));
        assert!(names.contains(&"upstream-arima-nocorr"));
        assert!(names.contains(&"upstream-kalman-u70"));
        for name in names {
            assert_eq!(PolicySpec::parse(name).unwrap().name(), name);
        }
        assert_eq!(PolicySpec::parse("magic"), None);
    }

    #[test]
    fn hpa_recommendation_follows_the_kubernetes_formula() {
        // 4 ready at 100 % of a 70 % target: ceil(4 / 0.7) = 6.
        assert_eq!(hpa_recommend(4, 4, 1.0, 0.7, 1, 64), 6);
        // Within the 10 % tolerance: unchanged.
        assert_eq!(hpa_recommend(4, 4, 0.75, 0.7, 1, 64), 4);
        // Scale-up is limited to max(2x, +4) per period.
        assert_eq!(hpa_recommend(1, 1, 10.0, 0.5, 1, 64), 5);
        // Down to the minimum.
        assert_eq!(hpa_recommend(4, 4, 0.0, 0.7, 1, 64), 1);
        assert_eq!(hpa_recommend(0, 3, 1.0, 0.7, 1, 64), 3);
    }

    #[test]
    fn binary_search_finds_the_smallest() {
        assert_eq!(Oracle::smallest(1, 64, |n| n >= 17), 17);
        assert_eq!(Oracle::smallest(1, 64, |_| true), 1);
        assert_eq!(Oracle::smallest(3, 3, |_| false), 3);
    }
}
