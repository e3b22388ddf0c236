//! The policies the simulator compares. The SLA planner and the load-based planner are the
//! operator's own planner core ([`SlaPlanner`], [`LoadPlanner`]), called exactly as the
//! operator calls them; the others are baselines and bounds.

use std::{collections::VecDeque, time::Duration};

use planner_core::{
    interpolation::PerformanceCurves,
    load::{LoadConfig, LoadPlanner},
    predictor::{PredictorConfig, PredictorKind},
    sla::{self, Corrections},
    startup::{DEFAULT_SCALE_UP_DELAY, StartupTracker, planned_delay},
    state::{
        FastSignals, IntervalMetrics, QueueingConfig, QueueingPlan, SlaModel, SlaPlanner, SlaPlannerConfig,
    },
};

use super::{
    latency::{Cluster, Job, Observer},
    run::{DecisionContext, Policy, SimConfig, job},
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
}

/// The SLA planner, ticked once per adjustment interval with the interval's frontend metrics
/// (and, with the queueing model, checked every fast period in between). It plans with the
/// scale-up delay it measures on its own replicas, as the operator does on a cluster
/// ([`StartupTracker`]): the default until a scale-up has come up.
pub struct SlaPolicy {
    name: String,
    config: SlaPlannerConfig,
    planner: SlaPlanner,
    startup: StartupTracker,
    /// The scale-up delay to assume until one is measured.
    expected: Option<Duration>,
    /// The replicas asked for when last told.
    asked: Option<(u32, u32)>,
    /// The queueing plan of the last check that made one.
    plan: Option<QueueingPlan>,
}

impl SlaPolicy {
    /// A cold-started planner (no warm-up trace) with the simulator's interval, SLA, limits and
    /// queueing settings; with `headroom`, upstream's prefill is sized for
    /// [`HEADROOM_UTILIZATION`]. The scale-up delay is measured, not taken from `sim`.
    pub fn new(
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
            queueing: QueueingConfig {
                scale_up_delay_s: DEFAULT_SCALE_UP_DELAY.as_secs_f64(),
                ..sim.queueing.clone()
            },
            aggregated: sim.aggregated,
        };
        let mut policy = Self::with_config(config);
        policy.expected = sim
            .expected_scale_up_delay_s
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64);
        policy.refresh_delay();
        policy
    }

    /// A cold-started planner with the given configuration.
    pub fn with_config(config: SlaPlannerConfig) -> Self {
        let name = PolicySpec::Sla {
            model: config.model,
            predictor: config.predictor.kind,
            correction: config.correction,
            headroom: config.sla.prefill_utilization < 1.0,
        }
        .name();
        Self {
            name,
            planner: SlaPlanner::new(&config),
            config,
            startup: StartupTracker::default(),
            expected: None,
            asked: None,
            plan: None,
        }
    }

    /// The scale-up delay measured so far.
    pub fn measured_delay(&self) -> Option<Duration> {
        self.startup.delay()
    }

    /// The measured delay (else the one expected, else the default) into the planner's
    /// settings, as the operator refreshes them before each decision.
    fn refresh_delay(&mut self) {
        let planned = planned_delay(None, self.startup.delay(), self.expected);
        self.config.queueing.scale_up_delay_s = planned.delay.as_secs_f64();
        self.config.queueing.scale_up_delay_assumed = planned.assumed;
    }

    /// The planner's configuration.
    pub fn config(&self) -> &SlaPlannerConfig {
        &self.config
    }

    /// Renames the policy (for reports comparing settings).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
}

impl<C: PerformanceCurves> Policy<C> for SlaPolicy {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn period_s(&self, _: &SimConfig) -> f64 {
        self.config.interval_s
    }
    fn decide(&mut self, ctx: &DecisionContext<'_, C>) -> Option<(u32, u32)> {
        self.refresh_delay();
        // Upstream is told the replicas serving (as the operator did); the queueing model the
        // replicas asked for, so that starting replicas are not asked for twice.
        let current = match self.config.model {
            SlaModel::Upstream => ctx.serving,
            SlaModel::Queueing => ctx.target,
        };
        let decision = self.planner.tick(
            &self.config,
            ctx.model.curves,
            IntervalMetrics::Observed(ctx.window),
            current,
        );
        self.plan = decision.queueing().cloned();
        decision.target()
    }
    fn fast_period_s(&self, _: &SimConfig) -> f64 {
        match self.config.model {
            SlaModel::Upstream => f64::INFINITY,
            SlaModel::Queueing => self.config.queueing.fast_path.period_s,
        }
    }
    fn fast_decide(&mut self, ctx: &DecisionContext<'_, C>, signals: &FastSignals) -> Option<(u32, u32)> {
        self.refresh_delay();
        let decision = self
            .planner
            .fast_check(&self.config, ctx.model.curves, signals, ctx.target)?;
        self.plan = decision.queueing().cloned();
        decision.target()
    }
    fn replicas_changed(&mut self, now_s: f64, asked: (u32, u32), serving: (u32, u32)) {
        let now = Duration::from_secs_f64(now_s.max(0.0));
        if let Some(before) = self.asked.filter(|before| *before != asked) {
            self.startup.scaled(before, asked, now);
        }
        self.asked = Some(asked);
        self.startup.observe(serving, now);
    }
    fn gpu_budget_changed(&mut self, budget: Option<u32>) {
        self.config.limits.max_gpu_budget = budget;
    }
    fn last_plan(&self) -> Option<&QueueingPlan> {
        self.plan.as_ref()
    }
}

/// The SLA planner's replica formulas with the actual load of the next interval and neutral
/// correction factors: what the planner would do with a perfect predictor.
pub struct PerfectPrediction;

impl<C: PerformanceCurves> Policy<C> for PerfectPrediction {
    fn name(&self) -> String {
        PolicySpec::PerfectPrediction.name()
    }
    fn period_s(&self, config: &SimConfig) -> f64 {
        config.interval_s
    }
    fn decide(&mut self, ctx: &DecisionContext<'_, C>) -> Option<(u32, u32)> {
        let interval = ctx.config.interval_s;
        let plan = sla::plan_replicas(
            ctx.model.curves,
            &ctx.next_load(interval),
            &ctx.config.sla,
            &Corrections::default(),
            &ctx.config.limits,
            interval,
        );
        Some((plan.prefill, plan.decode))
    }
}

/// The load-based planner of Dynamo's first planner: prefill queue per worker and decode KV usage against
/// thresholds, one replica per pool per interval. Adjustments are blocking, as upstream: no
/// decision while a scale-up is still starting.
pub struct LoadBased {
    config: LoadConfig,
    planner: LoadPlanner,
    period_s: f64,
}

impl LoadBased {
    /// Seed 001's thresholds and 10 s interval, with the simulator's limits.
    pub fn new(sim: &SimConfig) -> Self {
        Self {
            config: LoadConfig {
                min_replicas: sim.limits.min_replicas,
                max_replicas: sim.limits.max_replicas,
                max_gpu_budget: sim.limits.max_gpu_budget,
                prefill_gpus_per_engine: sim.limits.prefill_gpus_per_engine,
                decode_gpus_per_engine: sim.limits.decode_gpus_per_engine,
                ..LoadConfig::default()
            },
            planner: LoadPlanner::default(),
            period_s: 10.0,
        }
    }
}

impl<C: PerformanceCurves> Policy<C> for LoadBased {
    fn name(&self) -> String {
        PolicySpec::LoadBased.name()
    }
    fn period_s(&self, _: &SimConfig) -> f64 {
        self.period_s
    }
    fn decide(&mut self, ctx: &DecisionContext<'_, C>) -> Option<(u32, u32)> {
        if ctx.scaling_up {
            return None;
        }
        let decision = if ctx.config.aggregated.is_some() {
            // A waiting prompt will take its tokens of one engine's KV cache.
            let capacity = ctx.model.spec.max_kv_tokens;
            let per_request = if capacity > 0.0 && ctx.window.isl.is_finite() {
                ctx.window.isl / capacity
            } else {
                0.0
            };
            self.planner
                .tick_aggregated(&self.config, ctx.target.1, ctx.samples, per_request)
        } else {
            self.planner
                .tick(&self.config, ctx.target.0, ctx.target.1, ctx.samples)
        };
        Some((decision.prefill, decision.decode))
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
}

impl Default for Hpa {
    fn default() -> Self {
        Self {
            prefill_target: 0.7,
            decode_target: 0.5,
            period_s: 15.0,
            stabilisation_s: 300.0,
            history: VecDeque::new(),
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
    fn period_s(&self, _: &SimConfig) -> f64 {
        self.period_s
    }
    fn decide(&mut self, ctx: &DecisionContext<'_, C>) -> Option<(u32, u32)> {
        let (min, max) = (ctx.config.limits.min_replicas, ctx.config.max_replicas());
        let kv = &ctx.samples.decode_kv_usage;
        let kv_mean = if kv.is_empty() {
            f64::NAN
        } else {
            kv.iter().sum::<f64>() / kv.len() as f64
        };
        let p = hpa_recommend(
            ctx.serving.0,
            ctx.target.0,
            ctx.prefill_utilisation,
            self.prefill_target,
            min,
            max,
        );
        let d = hpa_recommend(ctx.serving.1, ctx.target.1, kv_mean, self.decode_target, min, max);
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
            stabilise(p, ctx.target.0, |h| h.1),
            stabilise(d, ctx.target.1, |h| h.2),
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
    fn period_s(&self, _: &SimConfig) -> f64 {
        f64::INFINITY
    }
    fn decide(&mut self, _: &DecisionContext<'_, C>) -> Option<(u32, u32)> {
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
pub struct Oracle;

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
    fn trial<C: PerformanceCurves>(ctx: &DecisionContext<'_, C>, prefill: u32, decode: u32) -> Trial {
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
    fn period_s(&self, config: &SimConfig) -> f64 {
        config.interval_s
    }
    fn ignores_scale_up_delay(&self) -> bool {
        true
    }
    fn decide(&mut self, ctx: &DecisionContext<'_, C>) -> Option<(u32, u32)> {
        let sla = ctx.config.sla;
        let (min, max) = (ctx.config.limits.min_replicas, ctx.config.max_replicas());
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
