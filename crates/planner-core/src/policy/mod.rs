//! The planning loop: what a policy does between two reads of the world, written once for
//! every driver. The operator's PlannerPolicy reconciler, the simulator's replay, the replay
//! bridge into Dynamo's engines, the multi-graph budget run and `planner-operator what-if` all
//! drive this loop and keep only their I/O: they read the clock, the target's replicas and the
//! metrics the loop asks for, run a shared budget's rounds, and carry out what it decides. So
//! the benchmarks score the loop the operator runs.
//!
//! Times are [`Duration`]s since any fixed origin the driver keeps: the loop reads no clock.
//!
//! A wake runs these stages, in this order:
//!
//! 1. **due** ([`PolicyLoop::due`], [`schedule`]): given the time and the replicas asked for
//!    and serving, what is due: an adjustment interval (read the last `window` of metrics), a
//!    fast check (rates over the last `window`), or nothing until [`PolicyLoop::next_wake`].
//!    The replicas also time the scale-up delay ([`StartupTracker`]) and the engines that
//!    served through the interval.
//! 2. **decide** ([`PolicyLoop::decide`], [`planner`], [`guard`]): the planner on what the
//!    driver read, then the step and zero guards; for a shared budget's member, what it asks
//!    for in a round ([`Proposal::ask`], [`member`]).
//! 3. **settle** ([`PolicyLoop::settle`]): the budget's answer cuts the decision, the ready gate
//!    holds a scale-up the target cannot start yet, observe mode applies nothing: the
//!    [`Decision`] with what to scale to and why ([`report`]).
//! 4. **actuated** ([`PolicyLoop::actuated`]): what the driver changed, for the scale-up delay.

pub mod guard;
pub mod member;
pub mod planner;
pub mod report;
pub mod schedule;
#[cfg(test)]
mod tests;

use std::{collections::VecDeque, time::Duration};

use crate::{
    budget,
    interpolation::PerformanceCurves,
    load::LoadConfig,
    sla::{Observation, SlaTargets},
    startup::{PlannedDelay, StartupTracker, planned_delay},
    state::{FastSignals, SlaModel, SlaPlannerConfig},
};

use self::schedule::Schedule;
pub use self::{
    guard::{Guards, NOT_READY},
    member::{Answer, MemberAsk, Membership},
    planner::{Observed, Planner, Replicas},
    report::{Check, Decision, GrantReport, LimitReason, Limitation, MetricsState},
    schedule::{Due, MIN_FAST_WINDOW},
};

/// The share of intervals meeting the SLA is counted over this much time.
pub const ATTAINMENT_WINDOW: Duration = Duration::from_secs(3600);
/// Intervals remembered for the share (an hour of 1 s intervals).
const ATTAINMENT_CAP: usize = 3600;

/// What the loop is configured with besides its planner's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopSettings {
    /// The adjustment interval.
    pub interval: Duration,
    /// Time between fast checks (`None`: no fast path); only the queueing model has one.
    pub fast_period: Option<Duration>,
    /// Step limits and the zero guard.
    pub guards: Guards,
    /// The scale-up delay the policy sets (`spec.behavior.scaleUpDelay`): never measured.
    pub scale_up_delay: Option<Duration>,
    /// The delay to expect until one is measured (`spec.behavior.expectedScaleUpDelay`).
    pub expected_scale_up_delay: Option<Duration>,
    /// The shared GPU budget it plans in.
    pub membership: Option<Membership>,
    /// Decide and report, never change replicas (mode `observe`).
    pub observe_only: bool,
}

impl Default for LoopSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            fast_period: None,
            guards: Guards::default(),
            scale_up_delay: None,
            expected_scale_up_delay: None,
            membership: None,
            observe_only: false,
        }
    }
}

/// What the driver read for a wake.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// For a due interval.
    Interval(Observed),
    /// For a due fast check: the signals over its window, `None` when they could not be read
    /// (the check then waits for the next one).
    Fast(Option<FastSignals>),
    /// A shared budget's member woken between decisions (its grant may have changed).
    Grant,
}

/// A decision before the shared budget's round.
#[derive(Clone, Debug, PartialEq)]
pub struct Proposal {
    /// The planner's decision after the guards.
    pub decision: Decision,
    /// What the member asks for in the round (`None` outside a shared budget).
    pub ask: Option<MemberAsk>,
}

impl Proposal {
    /// Nothing to carry out or ask for: a check between intervals that found nothing at risk.
    pub fn is_idle(&self) -> bool {
        self.decision.check != Check::Interval && self.decision.target.is_none() && self.ask.is_none()
    }
}

/// Engines serving through an interval, averaged over the wakes that saw them.
#[derive(Clone, Debug, Default, PartialEq)]
struct EngineTime {
    last: Option<(Duration, (u32, u32))>,
    integral: (f64, f64),
    span_s: f64,
}

impl EngineTime {
    fn record(&mut self, now: Duration, serving: (u32, u32)) {
        if let Some((then, before)) = self.last {
            let dt = now.saturating_sub(then).as_secs_f64();
            self.integral.0 += dt * (f64::from(before.0) + f64::from(serving.0)) / 2.0;
            self.integral.1 += dt * (f64::from(before.1) + f64::from(serving.1)) / 2.0;
            self.span_s += dt;
        }
        self.last = Some((now, serving));
    }

    /// The average since the last call (the engines serving now without a span), and a new
    /// span from now.
    fn take(&mut self, serving: (u32, u32)) -> (f64, f64) {
        let average = if self.span_s > 0.0 {
            (self.integral.0 / self.span_s, self.integral.1 / self.span_s)
        } else {
            (f64::from(serving.0), f64::from(serving.1))
        };
        self.integral = (0.0, 0.0);
        self.span_s = 0.0;
        average
    }
}

/// One policy's planning loop.
#[derive(Clone, Debug)]
pub struct PolicyLoop {
    planner: Planner,
    settings: LoopSettings,
    schedule: Schedule,
    startup: StartupTracker,
    /// The replicas asked for, as last seen or set.
    asked: Option<(u32, u32)>,
    engines: EngineTime,
    /// A budget member's last decision before any cut: what it asks for between decisions.
    want: Option<(u32, u32)>,
    /// The SLA risk of the last interval observed (1 until one is).
    risk: f64,
    /// Recent intervals: when, and whether they met the SLA.
    attainment: VecDeque<(Duration, bool)>,
}

impl PolicyLoop {
    /// A loop for `planner`, nothing due yet run: its first wake runs an interval.
    pub fn new(planner: Planner, settings: LoopSettings) -> Self {
        Self {
            planner,
            settings,
            schedule: Schedule::default(),
            startup: StartupTracker::default(),
            asked: None,
            engines: EngineTime::default(),
            want: None,
            risk: 1.0,
            attainment: VecDeque::new(),
        }
    }

    /// The planner.
    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    /// The settings.
    pub fn settings(&self) -> &LoopSettings {
        &self.settings
    }

    /// New settings that keep the loop's state (bounds, targets, a budget, the delay to expect).
    pub fn set_settings(&mut self, settings: LoopSettings) {
        self.settings = settings;
    }

    /// New SLA planner settings that keep its state; `false` (nothing changed) when the planner
    /// is not an SLA planner of the same sizing model, which needs a new loop.
    pub fn set_sla_config(&mut self, new: SlaPlannerConfig) -> bool {
        match &mut self.planner {
            Planner::Sla { config, .. } if config.model == new.model => {
                **config = new;
                true
            }
            _ => false,
        }
    }

    /// New load planner settings that keep its state; `false` when the planner is not one.
    pub fn set_load_config(&mut self, new: LoadConfig, aggregated_now: bool) -> bool {
        match &mut self.planner {
            Planner::Load {
                config, aggregated, ..
            } => {
                *config = new;
                *aggregated = aggregated_now;
                true
            }
            Planner::Sla { .. } => false,
        }
    }

    /// When the loop next has something due (`None`: at once).
    pub fn next_wake(&self) -> Option<Duration> {
        self.schedule.next_wake()
    }

    /// Whether an interval reads load samples (else the frontend's metrics).
    pub fn reads_samples(&self) -> bool {
        self.planner.reads_samples()
    }

    fn fast_period(&self) -> Option<Duration> {
        self.settings
            .fast_period
            .filter(|period| !period.is_zero() && self.planner.has_fast_path())
    }

    /// The scale-up delay planned with: the one set, else measured, else expected, else the
    /// default.
    pub fn planned_delay(&self) -> PlannedDelay {
        planned_delay(
            self.settings.scale_up_delay,
            self.startup.delay(),
            self.settings.expected_scale_up_delay,
        )
    }

    /// The scale-up delay measured on the target so far.
    pub fn measured_delay(&self) -> Option<Duration> {
        self.startup.delay()
    }

    /// Stage 1: what is due at `now`, with the target's `replicas` (which also time the
    /// scale-up delay and the engines serving through the interval).
    pub fn due(&mut self, now: Duration, replicas: Replicas) -> Due {
        self.observe(now, replicas);
        let fast_period = self.fast_period();
        self.schedule.due(now, self.settings.interval, fast_period)
    }

    /// The target's replicas at `now`, between wakes too (a driver that sees them change): they
    /// time the scale-up delay and the engines serving through the interval.
    pub fn observe(&mut self, now: Duration, replicas: Replicas) {
        if let Some(before) = self.asked.filter(|before| *before != replicas.asked) {
            // Changed by someone else, or by a change the loop was not told of.
            self.startup.scaled(before, replicas.asked, now);
        }
        self.asked = Some(replicas.asked);
        self.startup.observe(replicas.serving, now);
        self.engines.record(now, replicas.serving);
    }

    /// Stage 2: the planner on what the driver read, then the guards; a member's request.
    pub fn decide<C: PerformanceCurves>(
        &mut self,
        now: Duration,
        input: Input,
        replicas: Replicas,
        model: Option<&C>,
    ) -> Proposal {
        let delay = self.planned_delay();
        if let Planner::Sla { config, .. } = &mut self.planner {
            config.queueing.scale_up_delay_s = delay.delay.as_secs_f64();
            config.queueing.scale_up_delay_assumed = delay.assumed;
        }
        let mut decision = match input {
            Input::Interval(observed) => {
                let observed = self.with_engines(observed, replicas.serving);
                let mut decision = self.planner.interval(observed, replicas, model);
                self.remember_interval(now, &mut decision);
                decision
            }
            Input::Fast(signals) => signals
                .and_then(|mut signals| {
                    signals.elapsed_s = self.schedule.since_interval(now).as_secs_f64();
                    signals.prefill_engines = f64::from(replicas.serving.0);
                    signals.decode_engines = Some(f64::from(replicas.serving.1));
                    self.planner.fast(&signals, replicas, model)
                })
                .unwrap_or_else(|| Decision::keep(Check::Fast)),
            Input::Grant => Decision::keep(Check::Grant),
        };
        guard::guard(&mut decision, replicas.asked, &self.settings.guards);
        decision.scale_up_delay_s = Some((delay.delay.as_secs_f64(), delay.source));
        let ask = self.settings.membership.clone().map(|membership| {
            let want = match decision.target {
                Some(target) => target,
                None if decision.check == Check::Interval => replicas.asked,
                None => self.want.unwrap_or(replicas.asked),
            };
            self.want = Some(want);
            if let Some(risk) = self.risk_of(&decision) {
                self.risk = risk;
            }
            membership.ask(want, self.risk)
        });
        Proposal { decision, ask }
    }

    /// Stage 3: the budget's `answer` (for a member), the ready gate (`ready`: whether the
    /// target is Ready, `None` when the driver has no notion of it) and observe mode: the
    /// decision to carry out.
    pub fn settle(
        &mut self,
        now: Duration,
        proposal: Proposal,
        answer: Option<&Answer>,
        replicas: Replicas,
        ready: Option<bool>,
    ) -> Decision {
        let mut decision = proposal.decision;
        if let (Some(membership), Some(answer)) = (&self.settings.membership, answer) {
            member::granted(&mut decision, membership, answer, replicas.asked);
        }
        let Some(target) = decision.target else {
            return decision;
        };
        if self.settings.observe_only {
            decision.message.push_str(" (observe mode: not applied)");
            decision.deferred = Some("observe mode: not applied".into());
            return decision;
        }
        if target == replicas.asked {
            return decision;
        }
        let delay = self.planned_delay().delay;
        let counts_starting = self.planner.has_fast_path();
        if guard::gate_open(
            ready,
            counts_starting,
            (&self.startup, delay),
            replicas.asked,
            target,
            now,
        ) {
            decision.scale_to = Some(target);
        } else {
            decision.note(NOT_READY);
            decision.deferred = Some(NOT_READY.into());
        }
        decision
    }

    /// Stage 4: the driver changed the replicas asked for from `from` to `to` at `now`.
    pub fn actuated(&mut self, now: Duration, from: (u32, u32), to: (u32, u32)) {
        self.startup.scaled(from, to, now);
        self.asked = Some(to);
    }

    /// Share of the intervals of the last [`ATTAINMENT_WINDOW`] that met the SLA (`None`
    /// before one with traffic).
    pub fn attainment(&self, now: Duration) -> Option<f64> {
        let (intervals, met) = self.attainment_counts(now);
        (intervals > 0).then(|| met as f64 / intervals as f64)
    }

    /// The intervals with traffic of the last [`ATTAINMENT_WINDOW`], and those that met the SLA.
    pub fn attainment_counts(&self, now: Duration) -> (usize, usize) {
        self.attainment
            .iter()
            .filter(|(at, _)| now.saturating_sub(*at) <= ATTAINMENT_WINDOW)
            .fold((0, 0), |(n, met), (_, ok)| (n + 1, met + usize::from(*ok)))
    }

    /// Whether the planner applies correction factors (only then does a decision carry them).
    pub fn uses_corrections(&self) -> bool {
        self.planner.uses_corrections()
    }

    /// The SLA targets the SLA planner plans for (`None` for the load planner, which has none).
    pub fn sla_targets(&self) -> Option<(SlaTargets, Option<f64>)> {
        match &self.planner {
            Planner::Sla { config, .. } => Some((config.sla, config.queueing.ttft_percentile)),
            Planner::Load { .. } => None,
        }
    }

    /// The interval's observation with the engines that served through it, as the loop saw
    /// them at its wakes.
    fn with_engines(&mut self, observed: Observed, serving: (u32, u32)) -> Observed {
        let (prefill, decode) = self.engines.take(serving);
        match observed {
            Observed::Frontend(crate::state::IntervalMetrics::Observed(mut observation)) => {
                observation.prefill_engines = Some(prefill);
                observation.decode_engines = Some(decode);
                Observed::Frontend(crate::state::IntervalMetrics::Observed(observation))
            }
            other => other,
        }
    }

    /// Records whether the interval met the SLA, in the decision and the attainment window.
    fn remember_interval(&mut self, now: Duration, decision: &mut Decision) {
        let met = match (&decision.observed, self.sla_targets()) {
            (Some(observation), Some((targets, percentile))) => sla_met(observation, &targets, percentile),
            _ => None,
        };
        decision.sla_met = met;
        if let Some(met) = met {
            while self
                .attainment
                .front()
                .is_some_and(|(at, _)| now.saturating_sub(*at) > ATTAINMENT_WINDOW)
                || self.attainment.len() >= ATTAINMENT_CAP
            {
                self.attainment.pop_front();
            }
            self.attainment.push_back((now, met));
        }
    }

    /// The SLA risk of the interval a decision observed; `None` when it observed nothing.
    fn risk_of(&self, decision: &Decision) -> Option<f64> {
        let (targets, _) = self.sla_targets()?;
        decision.observed.as_ref().map(|o| {
            budget::sla_risk(
                o.ttft_ms.is_finite().then_some(o.ttft_ms),
                targets.ttft_ms,
                o.itl_ms.is_finite().then_some(o.itl_ms),
                targets.itl_ms,
            )
        })
    }
}

/// Whether an interval's observation met the targets: its TTFT (at the percentile the policy
/// targets, when it sets one and the observation carries that quantile; else the mean) and its
/// mean ITL. `None` without first tokens.
pub fn sla_met(
    observation: &Observation,
    targets: &SlaTargets,
    ttft_percentile: Option<f64>,
) -> Option<bool> {
    let ttft = match (ttft_percentile, observation.ttft_quantile_ms) {
        (Some(p), Some((q, value))) if (q - p / 100.0).abs() < 1e-6 && value.is_finite() => value,
        _ => observation.ttft_ms,
    };
    if !ttft.is_finite() {
        return None;
    }
    let itl_ok = !observation.itl_ms.is_finite() || observation.itl_ms <= targets.itl_ms;
    Some(ttft <= targets.ttft_ms && itl_ok)
}

/// Whether the SLA planner plans with the queueing model (which counts replicas still starting
/// and has a fast path).
pub fn is_queueing(config: &SlaPlannerConfig) -> bool {
    config.model == SlaModel::Queueing
}
