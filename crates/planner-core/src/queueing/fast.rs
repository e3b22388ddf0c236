//! Stage 6, the **fast path**: between intervals, every few seconds, the recent arrival rate
//! and the backlog against what the last plan provided for. It decides only whether to act and
//! at what rate; the demand, size and hold stages do the rest, as for an interval.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{
    config::{QueueingConfig, UNKNOWN_LENGTH_SCV},
    demand::{Demand, backlogged, growth},
    learn::Learned,
    plan::ScaleReason,
    stats::{median, push_bounded},
};
use crate::{
    interpolation::PerformanceCurves,
    sizing::{self, LengthMoments, MIN_BURSTINESS, ServiceMoments},
    sla::SlaTargets,
};

/// What the frontend shows between intervals (the fast path's input).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FastSignals {
    /// Seconds since the last interval's decision.
    pub elapsed_s: f64,
    /// Seconds the counts below cover.
    pub window_s: f64,
    /// Requests accepted in the window, when the counter exists.
    pub arrivals: Option<f64>,
    /// Requests completed in the window.
    pub completions: f64,
    /// Requests accepted and not completed, now.
    pub inflight: Option<f64>,
    /// Requests waiting for or in prefill, now (as [`crate::sla::Observation::queued`]).
    pub queued: Option<f64>,
    /// Prefill engines ready now.
    pub prefill_engines: f64,
    /// Decode engines ready now, when known (else those of the last interval stand in).
    #[serde(default)]
    pub decode_engines: Option<f64>,
    /// Mean ISL since the last decision (NaN without first tokens).
    pub isl: f64,
    /// `E[ISL²]` since the last decision.
    pub isl_second_moment: Option<f64>,
    /// Mean OSL since the last decision (NaN without completions).
    pub osl: f64,
    /// `E[OSL²]` since the last decision.
    pub osl_second_moment: Option<f64>,
}

/// What the last interval planned for: the fast path sizes with it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct FastBasis {
    /// The prefill arrival rate planned for (requests/s).
    pub rate: f64,
    /// Prefill service time.
    pub service: ServiceMoments,
    /// Arrival burstiness.
    pub burstiness: f64,
    /// Prompt-length mix.
    pub isl: LengthMoments,
    /// Output-length mix.
    pub osl: LengthMoments,
    /// Measured over modelled KV tokens per running request.
    pub kv_scale: f64,
    /// Decode engines serving in the interval, when known (they stand in when a check's
    /// signals carry no decode count).
    #[serde(default)]
    pub decode_serving: Option<f64>,
}

impl FastBasis {
    /// What an interval's demand planned for.
    pub fn of(demand: &Demand) -> Self {
        Self {
            rate: demand.rate,
            service: demand.service,
            burstiness: demand.burstiness,
            isl: demand.isl,
            osl: demand.osl,
            kv_scale: demand.kv_scale,
            decode_serving: Some(demand.decode_serving),
        }
    }
}

/// The fast path's memory between checks.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub(super) struct FastState {
    /// Recent arrival rates, newest last.
    rates: VecDeque<f64>,
    /// Inflight gauge at the last check.
    inflight: Option<f64>,
    /// What the last interval planned for.
    basis: Option<FastBasis>,
}

/// Why the fast path acts, and on what.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Trigger {
    /// The backlog would outlast the scale-up delay (else: arrivals surged).
    pub at_risk: bool,
    /// The median rate of the recent checks (cold-start margin included).
    pub recent: f64,
    /// The rate a backlog is judged at: the median of the last few checks, or `recent` if
    /// higher.
    pub latest: f64,
    /// Seconds the backlog would take to clear with the engines serving.
    pub drain_s: f64,
    /// What the last plan provided for.
    pub basis: FastBasis,
    /// Prefill engines serving.
    pub serving: f64,
    /// Decode engines serving (NaN when unknown).
    pub decode_serving: f64,
    /// Requests waiting beyond those being prefilled.
    pub backlog: f64,
}

impl Trigger {
    /// The rate to size for: the one that triggered, never below the plan's.
    pub fn rate(&self) -> f64 {
        if self.at_risk { self.latest } else { self.recent }.max(self.basis.rate)
    }

    /// The demand to size both pools for at that rate, with the burstiness learned at it
    /// (never below the plan's).
    pub fn demand(&self, learned: &Learned, settings: &QueueingConfig) -> Demand {
        let rate = self.rate();
        let service = self.basis.service;
        Demand {
            rate,
            decode_rate: rate,
            service,
            burstiness: learned
                .burstiness_at(settings, rate)
                .map_or(self.basis.burstiness, |b| {
                    settings.bounded_burstiness(b).max(self.basis.burstiness)
                }),
            overhead_s: learned.overhead_s(),
            serving: self.serving,
            decode_serving: self.decode_serving,
            backlog: self.backlog,
            growth: growth(rate, service.mean_s, self.serving, settings.scale_up_delay_s),
            isl: self.basis.isl,
            osl: self.basis.osl,
            kv_scale: self.basis.kv_scale,
        }
    }

    /// Engines serving, prefill and decode (NaN when unknown).
    pub fn serving(&self) -> (f64, f64) {
        (self.serving, self.decode_serving)
    }

    /// How long the scale-up is held (s).
    pub fn hold_s(&self, settings: &QueueingConfig) -> f64 {
        if self.at_risk {
            settings.fast_path.backlog_hold_s
        } else {
            settings.fast_path.surge_hold_s
        }
    }

    /// Why, for status and events.
    pub fn reason(&self) -> ScaleReason {
        if self.at_risk {
            ScaleReason::FastPath {
                backlog: self.backlog,
                arrival_rate: self.latest,
                drain_s: self.drain_s,
            }
        } else {
            ScaleReason::Surge {
                arrival_rate: self.recent,
                planned_rate: self.basis.rate,
            }
        }
    }
}

impl FastState {
    /// Takes an interval's plan as the new basis. The recent rates are kept: one busy window
    /// right after an interval's decision is not a surge.
    pub fn replan(&mut self, basis: FastBasis) {
        self.basis = Some(basis);
    }

    /// Reads one check's signals: `Some` when the SLA is at risk (the backlog would outlast the
    /// scale-up delay) or arrivals run above the rate the last plan provided for. Before the
    /// first interval's plan, the lengths seen so far stand in for it. `cold` is the margin on
    /// the measured rate while forecast errors are too few to know better.
    pub fn check(
        &mut self,
        curves: &impl PerformanceCurves,
        signals: &FastSignals,
        settings: &QueueingConfig,
        sla: &SlaTargets,
        cold: f64,
    ) -> Option<Trigger> {
        let fast = &settings.fast_path;
        let window = signals.window_s.max(1e-3);
        let arrivals = match (signals.arrivals, signals.inflight, self.inflight) {
            (Some(arrivals), _, _) if arrivals.is_finite() => arrivals.max(0.0),
            (_, Some(now), Some(before)) if now.is_finite() && before.is_finite() => {
                (signals.completions + now - before).max(0.0)
            }
            _ => signals.completions.max(0.0),
        };
        self.inflight = signals.inflight.filter(|v| v.is_finite());
        push_bounded(&mut self.rates, arrivals / window, fast.rate_samples);
        // A surge needs the rate sustained over all the samples kept.
        let recent = median(self.rates.iter().copied()).unwrap_or(0.0) * cold;
        let basis = match self.basis {
            Some(basis) => basis,
            None => Self::first_basis(curves, signals)?,
        };
        let queued = signals.queued.filter(|v| v.is_finite()).unwrap_or(0.0);
        let serving = signals.prefill_engines.max(0.0);
        // Decode engines ready now, else those of the last interval: a pool's growth is limited
        // from what serves it as at the interval tick, the first check's included.
        let decode_serving = signals
            .decode_engines
            .filter(|v| v.is_finite())
            .or(basis.decode_serving)
            .map_or(f64::NAN, |v| v.max(0.0));
        let backlog = (queued - serving).max(0.0);
        let service = basis.service;
        if service.mean_s.is_nan() || service.mean_s <= 0.0 {
            return None;
        }
        // A backlog is harm already: judged on the last few samples (with three, a step shows
        // within 20 s), or the longer median if higher.
        let latest = if backlog > 0.0 {
            let last = fast.backlog_rate_samples.max(1);
            let short = median(self.rates.iter().rev().take(last).copied()).unwrap_or(0.0);
            (short * cold).max(recent)
        } else {
            recent
        };
        let spare = serving - latest * service.mean_s;
        let drain_s = if spare > 0.0 {
            backlog * service.mean_s / spare
        } else if backlog > 0.0 || latest > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        // A backlog the serving engines clear within the TTFT target puts nothing at risk (the
        // interval tick's test for holding scale-downs).
        let negligible = serving > 0.0 && !backlogged(backlog, service.mean_s, serving, sla.ttft_ms);
        let at_risk = drain_s > settings.scale_up_delay_s && !negligible;
        let surge = recent > basis.rate * (1.0 + fast.surge_tolerance.max(0.0));
        (at_risk || surge).then_some(Trigger {
            at_risk,
            recent,
            latest,
            drain_s,
            basis,
            serving,
            decode_serving,
            backlog,
        })
    }

    /// The basis before any interval's plan: the lengths seen so far, Poisson arrivals.
    fn first_basis(curves: &impl PerformanceCurves, signals: &FastSignals) -> Option<FastBasis> {
        let moments = |mean: f64, second: Option<f64>| {
            (mean.is_finite() && mean > 0.0).then(|| {
                second.filter(|v| v.is_finite()).map_or_else(
                    || LengthMoments::with_scv(mean, UNKNOWN_LENGTH_SCV),
                    |second| LengthMoments { mean, second },
                )
            })
        };
        let isl = moments(signals.isl, signals.isl_second_moment)?;
        let osl = moments(signals.osl, signals.osl_second_moment)?;
        Some(FastBasis {
            rate: 0.0,
            service: sizing::prefill_service(curves, &isl),
            burstiness: MIN_BURSTINESS,
            isl,
            osl,
            kv_scale: 1.0,
            decode_serving: None,
        })
    }
}
