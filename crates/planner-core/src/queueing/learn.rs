//! Stage 1, **learn**: what the interval that just ended teaches the planner.
//!
//! - the arrivals (the started counter, else completions plus the inflight gauge's change);
//! - the prompt and output length mixes (smoothed);
//! - the forecast errors of the work the last two ticks forecast for it (prefill seconds, the
//!   mean prefill time, decode KV demand);
//! - the first-token overhead its TTFT shows beyond the prefill model, when calm;
//! - the arrival burstiness that explains its TTFT beyond that overhead, with the rate it was
//!   learned at;
//! - the ratio of the decode pool's measured KV usage to what the model says it holds.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{
    config::{
        Context, DECODE_BOUND_KV_USAGE, DECODE_FULL_KV_USAGE, FORECAST_HORIZONS, KV_LEARN_AFTER,
        KV_LEARN_MAX_USAGE, KV_RATIO_SAMPLES, MAX_KV_SCALE, MAX_OVERHEAD_ITLS, MAX_OVERHEAD_SHARE,
        MIN_OVERHEAD_SAMPLES, OVERHEAD_AGREEMENT, OVERHEAD_SAMPLES, QueueingConfig, UNKNOWN_LENGTH_SCV,
        WHOLE_ENGINES,
    },
    stats::{log_error, median, push_bounded, quantile},
};
use crate::{
    aggregated,
    interpolation::PerformanceCurves,
    sizing::{self, DecodeModel, LengthMoments, ServiceMoments},
    sla::Observation,
};

/// What an interval asks of each pool: requests, their mean prefill time, and the decode KV
/// tokens they hold over their decode (tokens × output tokens, the ITL being common).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(super) struct Work {
    pub requests: f64,
    pub service_s: f64,
    pub service: ServiceMoments,
    pub decode: f64,
}

impl Work {
    /// `service` is [`sizing::prefill_service`] of `isl`, which callers often have already.
    pub fn of(requests: f64, service: ServiceMoments, isl: &LengthMoments, osl: &LengthMoments) -> Self {
        let requests = if requests.is_finite() {
            requests.max(0.0)
        } else {
            0.0
        };
        let osl_mean = osl.mean.max(1.0);
        let held = isl.mean.max(0.0) + osl.second.max(osl_mean * osl_mean) / (2.0 * osl_mean);
        Self {
            requests,
            service_s: service.mean_s,
            service,
            decode: requests * (osl_mean - 1.0).max(0.0) * held,
        }
    }
}

/// What one interval showed, read once from its observation.
#[derive(Clone, Copy, Debug)]
pub(super) struct Interval {
    /// Requests that arrived.
    pub arrivals: f64,
    /// The interval's prompt-length mix, when it measured one.
    pub isl: Option<LengthMoments>,
    /// Its output-length mix, when it measured one.
    pub osl: Option<LengthMoments>,
    /// The prefill time of its prompt mix.
    pub service: Option<ServiceMoments>,
    /// Prefill engines serving (the replicas asked for, when not reported).
    pub serving: f64,
    /// Decode engines serving (the replicas asked for, when not reported).
    pub decode_serving: f64,
    /// Requests waiting beyond those being prefilled, at its end.
    pub backlog: f64,
}

/// What the planner has learned from past intervals.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub(super) struct Learned {
    /// Inflight gauge at the last tick (for the arrivals fallback).
    last_inflight: Option<f64>,
    /// Backlog (requests beyond those being prefilled) at the last tick.
    last_backlog: Option<f64>,
    /// The work forecast at the last two ticks, newest first.
    forecasts: VecDeque<Work>,
    /// `ln(actual / forecast)` of the prefill work (arrivals × mean prefill time) at horizons
    /// one and two, newest last.
    errors: VecDeque<f64>,
    /// The same for the mean prefill time.
    service_errors: VecDeque<f64>,
    /// The same for the decode KV-cache demand.
    decode_errors: VecDeque<f64>,
    /// Arrival burstiness learned from observed TTFT, newest last.
    burstiness: VecDeque<f64>,
    /// The arrival rate each of `burstiness` was learned at (req/s), newest last.
    burstiness_rates: VecDeque<f64>,
    /// First-token overheads calm intervals showed, in their mean ITLs, newest last.
    overheads: VecDeque<f64>,
    /// The last interval's mean ITL (s) and the largest overhead planned (s), once known.
    overhead_basis: Option<(f64, f64)>,
    /// Prompt-length moments (smoothed).
    isl: Option<LengthMoments>,
    /// Output-length moments (smoothed).
    osl: Option<LengthMoments>,
    /// `ln(measured / modelled)` KV tokens held by the decode pool, newest last.
    kv_ratios: VecDeque<f64>,
}

/// Whether the decode pool's KV usage may correct the model this interval, and its size.
#[derive(Clone, Copy, Debug)]
pub(super) struct KvLearning {
    /// Intervals decided since the planner started (this one included).
    pub intervals: u64,
    /// The decode replicas had settled before the interval began.
    pub settled: bool,
    /// Decode replicas asked for.
    pub decode: u32,
}

/// Blends new moments into smoothed ones (equal weight to the past and the new interval).
fn blend(old: Option<LengthMoments>, new: LengthMoments) -> LengthMoments {
    match old {
        Some(old) if old.is_valid() => LengthMoments {
            mean: (old.mean + new.mean) / 2.0,
            second: (old.second + new.second) / 2.0,
        },
        _ => new,
    }
}

impl Learned {
    /// Reads an interval's observation: its arrivals, length mixes and backlog. `asked` is the
    /// replicas asked for, prefill and decode (the serving engines when none are reported).
    pub fn read(
        &mut self,
        curves: &impl PerformanceCurves,
        observation: &Observation,
        asked: (u32, u32),
    ) -> Interval {
        let arrivals = self.arrivals(observation);
        self.last_inflight = observation.inflight.filter(|v| v.is_finite());
        // The interval's length mixes: its means with its histograms' second moments (or the
        // shapes seen so far).
        let measured = |mean: f64, second: Option<f64>, seen: Option<LengthMoments>| {
            (mean.is_finite() && mean > 0.0).then(|| {
                second.filter(|v| v.is_finite()).map_or_else(
                    || LengthMoments::with_scv(mean, seen.map_or(UNKNOWN_LENGTH_SCV, |m| m.scv())),
                    |second| LengthMoments {
                        mean,
                        second: second.max(mean * mean),
                    },
                )
            })
        };
        let isl = measured(observation.isl, observation.isl_second_moment, self.isl);
        let osl = measured(observation.osl, observation.osl_second_moment, self.osl);
        let serving = observation
            .prefill_engines
            .filter(|c| c.is_finite())
            .unwrap_or(f64::from(asked.0));
        let decode_serving = observation
            .decode_engines
            .filter(|c| c.is_finite())
            .unwrap_or(f64::from(asked.1));
        Interval {
            arrivals,
            isl,
            osl,
            // The prefill time of the measured mix: used by the errors and the burstiness.
            service: isl.map(|moments| sizing::prefill_service(curves, &moments)),
            serving,
            decode_serving,
            backlog: observation
                .queued
                .map_or(0.0, |queued| (queued - serving).max(0.0)),
        }
    }

    /// Arrivals of an interval: the started counter, else completions plus the change in the
    /// inflight gauge, else completions.
    fn arrivals(&self, observation: &Observation) -> f64 {
        let completions = if observation.num_req.is_finite() {
            observation.num_req.max(0.0)
        } else {
            0.0
        };
        match (observation.arrivals, observation.inflight, self.last_inflight) {
            (Some(arrivals), _, _) if arrivals.is_finite() => arrivals.max(0.0),
            (_, Some(now), Some(before)) if now.is_finite() && before.is_finite() => {
                (completions + now - before).max(0.0)
            }
            _ => completions,
        }
    }

    /// Learns from the interval read by [`Self::read`].
    pub fn learn(
        &mut self,
        curves: &impl PerformanceCurves,
        observation: &Observation,
        seen: &Interval,
        ctx: Context<'_>,
        kv: KvLearning,
    ) {
        let settings = ctx.settings;
        let interval_s = ctx.interval_s.max(1e-3);
        self.learn_errors(curves, seen, settings);
        if let (Some(moments), Some(service)) = (seen.isl, seen.service) {
            let rate = seen.arrivals / interval_s;
            // Aggregated engines: the queue is of prompts that also pay the decode part of each
            // step they span (the observed ITL without the prompts' share of the steps).
            let service = match ctx.aggregated {
                Some(engine) => {
                    let engines = observation.prefill_engines.filter(|c| *c >= 1.0).unwrap_or(1.0);
                    let share = (rate * service.mean_s / engines).clamp(0.0, 0.95);
                    let step_s = observation.itl_ms / 1000.0 * (1.0 - share);
                    aggregated::shared_service(&service, &moments, engine, step_s)
                }
                None => service,
            };
            // Aggregated engines give the first token at the end of the prefill step.
            let itl_s = observation.itl_ms / 1000.0;
            if ctx.aggregated.is_none() && itl_s.is_finite() && itl_s > 0.0 {
                self.overhead_basis = Some((itl_s, ctx.sla.ttft_ms / 1000.0 * MAX_OVERHEAD_SHARE));
            }
            self.learn_burstiness(observation, rate, service, settings, ctx.aggregated.is_none());
            self.isl = Some(blend(self.isl, moments));
        }
        if let Some(moments) = seen.osl {
            self.osl = Some(blend(self.osl, moments));
        }
        self.learn_kv(curves, observation, seen, ctx, kv);
        self.last_backlog = observation.queued.map(|_| seen.backlog);
    }

    /// Forecast errors: the work this interval brought (prefill seconds, decode KV demand)
    /// against what the forecasts of the last two ticks said it would.
    fn learn_errors(&mut self, curves: &impl PerformanceCurves, seen: &Interval, settings: &QueueingConfig) {
        let (Some(isl_now), Some(osl_now)) = (seen.isl.or(self.isl), seen.osl.or(self.osl)) else {
            return;
        };
        let service = seen
            .service
            .unwrap_or_else(|| sizing::prefill_service(curves, &isl_now));
        let work = Work::of(seen.arrivals, service, &isl_now, &osl_now);
        // A forecast of no traffic (an idle spell) is not scored: traffic resuming is not
        // evidence of how far off the next busy interval's forecast will be, and the fast
        // path reacts to it.
        for forecast in self.forecasts.iter().filter(|f| f.requests >= 1.0) {
            let prefill = log_error(
                work.requests * work.service_s,
                forecast.requests * forecast.service_s,
                forecast.service_s.max(1e-3),
            );
            push_bounded(&mut self.errors, prefill, settings.margins.errors_kept);
            if seen.isl.is_some() {
                let service = log_error(work.service_s, forecast.service_s, 1e-3);
                push_bounded(&mut self.service_errors, service, settings.margins.errors_kept);
            }
            let unit = (forecast.decode.max(work.decode) * 1e-3).max(1.0);
            let decode = log_error(work.decode, forecast.decode, unit);
            push_bounded(&mut self.decode_errors, decode, settings.margins.errors_kept);
        }
    }

    /// First-token overhead and arrival burstiness: when the interval began without a backlog
    /// and the prefill engines did not change, a calm interval's TTFT beyond the M/G/c model
    /// with Poisson arrivals is the overhead (in the interval's ITLs, when `overhead`; more
    /// than [`MAX_OVERHEAD_ITLS`] is a burst's wait), and the TTFT beyond the overhead and the
    /// M/G/c wait is burst wait. `rate` is the interval's arrival rate.
    fn learn_burstiness(
        &mut self,
        observation: &Observation,
        rate: f64,
        service: ServiceMoments,
        settings: &QueueingConfig,
        overhead: bool,
    ) {
        let serving = observation.prefill_engines.filter(|c| c.is_finite() && *c >= 1.0);
        let backlog_now = observation
            .queued
            .zip(serving)
            .map(|(queued, c)| (queued - c).max(0.0));
        // A full KV cache delays first tokens too (admission waits): not a prefill wait.
        let decode_bound = observation
            .decode_kv_usage
            .is_some_and(|usage| usage >= DECODE_BOUND_KV_USAGE)
            || observation
                .decode_kv_usage_peak
                .is_some_and(|peak| peak >= DECODE_FULL_KV_USAGE);
        let (Some(engines), Some(_), Some(before)) = (serving, backlog_now, self.last_backlog) else {
            return;
        };
        let unchanged = (engines - engines.round()).abs() < WHOLE_ENGINES
            && before <= engines
            && !decode_bound
            && observation.ttft_ms.is_finite();
        if !unchanged {
            return;
        }
        let engines = engines.round() as u32;
        let ttft_s = observation.ttft_ms / 1000.0;
        let itl_s = observation.itl_ms / 1000.0;
        if let Some(o) = sizing::implied_overhead(&service, rate, engines, ttft_s)
            .filter(|_| overhead && itl_s.is_finite() && itl_s > 0.0)
        {
            let itls = o / itl_s;
            if itls <= MAX_OVERHEAD_ITLS {
                push_bounded(&mut self.overheads, itls, OVERHEAD_SAMPLES);
            }
        }
        if let Some(burstiness) =
            sizing::implied_burstiness(&service, rate, engines, ttft_s, self.overhead_s())
        {
            let kept = settings.burstiness.kept;
            push_bounded(&mut self.burstiness, burstiness, kept);
            push_bounded(&mut self.burstiness_rates, rate, kept);
        }
    }

    /// The decode pool's KV usage against what the model says the interval's arrivals hold
    /// (Little's law over the same engines): the ratio corrects the tokens per running
    /// request. Only while the decode replicas were settled for the whole interval and the
    /// cache was not saturated (admission waits cap what a full cache shows).
    fn learn_kv(
        &mut self,
        curves: &impl PerformanceCurves,
        observation: &Observation,
        seen: &Interval,
        ctx: Context<'_>,
        kv: KvLearning,
    ) {
        // The engines the usage is of: once the replicas asked for have settled (by the
        // scale-up delay the planner assumes), those that served when reported, if they did
        // not change through the interval (an assumed delay shorter than the real one would
        // otherwise count replicas still starting), else those asked for.
        let engines = match observation.decode_engines.filter(|e| e.is_finite()) {
            Some(engines) => ((engines - engines.round()).abs() < 0.05).then(|| engines.round() as u32),
            None => Some(kv.decode),
        };
        let steady = kv.intervals > KV_LEARN_AFTER && kv.settled;
        let Some(engines) = engines.filter(|e| steady && *e >= 1) else {
            return;
        };
        let (Some(usage), Some(capacity), Some(isl_now), Some(osl_now)) = (
            observation.decode_kv_usage,
            curves.max_kv_tokens(),
            seen.isl,
            seen.osl,
        ) else {
            return;
        };
        let readable = usage.is_finite()
            && usage > 0.0
            && usage < KV_LEARN_MAX_USAGE
            && capacity.is_finite()
            && capacity > 0.0;
        if !readable {
            return;
        }
        let modelled = sizing::size_decode(
            curves,
            seen.arrivals / ctx.interval_s.max(1e-3),
            &isl_now,
            &osl_now,
            &DecodeModel {
                kv_sigmas: 0.0,
                kv_fill: 1.0,
                kv_scale: 1.0,
            },
            &ctx.settings.targets(ctx.sla),
            engines,
            engines,
        );
        let measured = usage * capacity * f64::from(engines);
        // At least one request's worth of prompt tokens held on average, for a ratio worth
        // taking.
        if modelled.kv_tokens.is_finite() && modelled.kv_tokens > isl_now.mean.max(1.0) {
            push_bounded(
                &mut self.kv_ratios,
                (measured / modelled.kv_tokens).ln(),
                KV_RATIO_SAMPLES,
            );
        }
    }

    /// Remembers the work forecast for the next interval (its errors are learned then).
    pub fn remember_forecast(&mut self, work: Work) {
        self.forecasts.push_front(work);
        self.forecasts.truncate(FORECAST_HORIZONS);
    }

    /// The smoothed prompt and output length mixes, once measured.
    pub fn lengths(&self) -> (Option<LengthMoments>, Option<LengthMoments>) {
        (self.isl, self.osl)
    }

    /// Forecast errors known: prefill work, mean prefill time, decode KV demand.
    pub fn errors(&self) -> (&VecDeque<f64>, &VecDeque<f64>, &VecDeque<f64>) {
        (&self.errors, &self.service_errors, &self.decode_errors)
    }

    /// The first-token overhead (s) to plan with: the median of the recent calm intervals', in
    /// ITLs, times the last interval's ITL (at most a share of the TTFT target), once
    /// [`MIN_OVERHEAD_SAMPLES`] agree (their upper quartile within [`OVERHEAD_AGREEMENT`] times
    /// the lower); else 0.
    pub fn overhead_s(&self) -> f64 {
        let Some((itl_s, cap_s)) = self.overhead_basis else {
            return 0.0;
        };
        if self.overheads.len() < MIN_OVERHEAD_SAMPLES {
            return 0.0;
        }
        let at = |q: f64| quantile(self.overheads.iter().copied(), q).unwrap_or(0.0);
        let (low, high) = (at(0.25), at(0.75));
        if low > 0.0 && high <= low * OVERHEAD_AGREEMENT {
            (at(0.5) * itl_s).clamp(0.0, cap_s)
        } else {
            0.0
        }
    }

    /// The measured over modelled KV tokens per running request (the median of the recent
    /// ratios), 1 until one is known.
    pub fn kv_scale(&self) -> f64 {
        median(self.kv_ratios.iter().copied())
            .map_or(1.0, f64::exp)
            .clamp(1.0 / MAX_KV_SCALE, MAX_KV_SCALE)
    }

    /// The burstiness to plan arrivals at `rate` with: the quantile of the estimates learned at
    /// rates up to `rate_ratio` times it when there are enough of them, else of all; `None`
    /// before any is learned.
    pub fn burstiness_at(&self, settings: &QueueingConfig, rate: f64) -> Option<f64> {
        let settings = &settings.burstiness;
        let all = || quantile(self.burstiness.iter().copied(), settings.quantile);
        // Newest last in both: pair them from the end.
        let comparable = self
            .burstiness
            .iter()
            .rev()
            .zip(self.burstiness_rates.iter().rev())
            .filter(|(_, learned_at)| **learned_at <= rate * settings.rate_ratio)
            .map(|(burstiness, _)| *burstiness);
        if comparable.clone().count() >= settings.min_comparable.max(1) {
            quantile(comparable, settings.quantile)
        } else {
            all()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burstiness_is_planned_from_estimates_learned_at_comparable_rates() {
        let settings = QueueingConfig::default();
        assert_eq!(settings.burstiness.rate_ratio, 2.5);
        assert_eq!(settings.burstiness.min_comparable, 5);
        // Five calm intervals (2 requests/s) implied a burstiness of 1.5; then five busy ones
        // (40 requests/s), 12.
        let mut learned = Learned::default();
        for (burstiness, rate) in [(1.5, 2.0); 5].into_iter().chain([(12.0, 40.0); 5]) {
            learned.burstiness.push_back(burstiness);
            learned.burstiness_rates.push_back(rate);
        }
        let all = quantile(learned.burstiness.iter().copied(), settings.burstiness.quantile);
        assert!(all.is_some_and(|b| b > 10.0), "{all:?}");
        // A calm plan takes the calm estimates; one within 2.5x of the busy rate takes all.
        assert_eq!(learned.burstiness_at(&settings, 3.0), Some(1.5));
        assert_eq!(learned.burstiness_at(&settings, 16.0), all);
        // Too few comparable estimates: all of them.
        let mut strict = settings.clone();
        strict.burstiness.min_comparable = 6;
        assert_eq!(learned.burstiness_at(&strict, 3.0), all);
        assert_eq!(Learned::default().burstiness_at(&settings, 3.0), None);
    }
}
