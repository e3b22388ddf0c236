//! What a replayed graph's frontend shows a policy when it wakes, as Prometheus would answer
//! the operator: the frontend's metrics over the interval since the last one was read, the
//! request counts of the last seconds for a fast check, the load planner's samples and the
//! prefill engines' busy share. A driver feeds it (the replay from its engines, the replay
//! bridge from the samples Dynamo's replay sends) and policies read it through
//! [`crate::run::View`].

use std::collections::VecDeque;

use planner_core::{load::LoadSamples, sla::Observation, state::FastSignals};

use crate::metrics::{Histogram, ISL_BOUNDS, OSL_BOUNDS, TTFT_BOUNDS};

/// The TTFT quantile an observation carries unless a policy targets another
/// (`histogram_quantile(0.9, ...)`, as the operator reads it).
pub const OBSERVED_TTFT_QUANTILE: f64 = 0.9;

/// Longest window a fast check can ask for: counts older than this are dropped.
const HISTORY_S: f64 = 900.0;

/// Sums of what a frontend observes over a window.
#[derive(Clone, Debug)]
struct Window {
    completed: f64,
    osl_sum: f64,
    duration_sum: f64,
    first_tokens: f64,
    ttft_sum: f64,
    isl_sum: f64,
    /// Prompt lengths observed (with `isl_sum`: the input-length histogram's count).
    isl_count: f64,
    tokens: f64,
    itl_sum: f64,
    /// Requests accepted (`requests_started_total`).
    arrivals: f64,
    isl: Histogram,
    osl: Histogram,
    ttft: Histogram,
    /// Prefill and decode engine-seconds serving, and the seconds covered.
    prefill_engine_s: f64,
    decode_engine_s: f64,
    span_s: f64,
    /// Sum of the decode pool's KV-cache usage at each sample, the samples, and the highest.
    kv_usage_sum: f64,
    kv_samples: f64,
    kv_usage_peak: f64,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            completed: 0.0,
            osl_sum: 0.0,
            duration_sum: 0.0,
            first_tokens: 0.0,
            ttft_sum: 0.0,
            isl_sum: 0.0,
            isl_count: 0.0,
            tokens: 0.0,
            itl_sum: 0.0,
            arrivals: 0.0,
            isl: Histogram::new(&ISL_BOUNDS),
            osl: Histogram::new(&OSL_BOUNDS),
            ttft: Histogram::new(&TTFT_BOUNDS),
            prefill_engine_s: 0.0,
            decode_engine_s: 0.0,
            span_s: 0.0,
            kv_usage_sum: 0.0,
            kv_samples: 0.0,
            kv_usage_peak: 0.0,
        }
    }
}

/// The frontend's gauges now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gauges {
    /// Requests accepted and not completed (NaN when unknown).
    pub inflight: f64,
    /// Requests waiting for a first token (NaN when unknown).
    pub queued: f64,
}

/// Counts a driver observed over a span, for drivers that see aggregates rather than requests
/// (the replay bridge).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts<'a> {
    /// Requests accepted.
    pub arrivals: f64,
    /// Prompt lengths of those requests, when known.
    pub arrival_isl: &'a [f64],
    /// Requests completed.
    pub completed: f64,
    /// Their output lengths summed.
    pub osl_sum: f64,
    /// First tokens timed, and their TTFTs summed (s).
    pub ttft_count: f64,
    /// See `ttft_count`.
    pub ttft_sum_s: f64,
    /// Inter-token latencies timed, and summed (s).
    pub itl_count: f64,
    /// See `itl_count`.
    pub itl_sum_s: f64,
}

/// A frontend's counters since it started (what Prometheus scrapes of it).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Totals {
    /// Requests accepted.
    arrivals: f64,
    /// Requests completed.
    completions: f64,
    /// Prompt lengths observed, summed, and their count.
    isl_sum: f64,
    /// See `isl_sum`.
    isl_count: f64,
    /// Output lengths of the completed requests, summed.
    osl_sum: f64,
}

/// A replayed frontend's windows.
#[derive(Clone, Debug)]
pub struct Frontend {
    window: Window,
    /// Whether request durations are observed (the bridge's samples carry none).
    durations: bool,
    /// What the frontend counted since the start, at each mark.
    history: VecDeque<(f64, Totals)>,
    totals: Totals,
    samples: LoadSamples,
    /// Prefill work done and prefill engine-seconds serving, since the last read.
    prefill_work_s: f64,
    prefill_capacity_s: f64,
}

impl Default for Frontend {
    fn default() -> Self {
        Self::new(true)
    }
}

impl Frontend {
    /// An empty frontend; `durations`: whether request durations are observed.
    pub fn new(durations: bool) -> Self {
        Self {
            window: Window::default(),
            durations,
            history: VecDeque::from([(0.0, Totals::default())]),
            totals: Totals::default(),
            samples: LoadSamples::default(),
            prefill_work_s: 0.0,
            prefill_capacity_s: 0.0,
        }
    }

    /// A request accepted.
    pub fn arrived(&mut self) {
        self.window.arrivals += 1.0;
        self.totals.arrivals += 1.0;
    }

    /// A request's first token, `ttft_s` after it arrived.
    pub fn first_token(&mut self, isl: f64, ttft_s: f64) {
        let w = &mut self.window;
        w.first_tokens += 1.0;
        w.ttft_sum += ttft_s;
        w.isl_sum += isl;
        w.isl_count += 1.0;
        w.isl.observe(isl);
        w.ttft.observe(ttft_s);
        self.totals.isl_sum += isl;
        self.totals.isl_count += 1.0;
    }

    /// `count` tokens after the first, each `itl_s` after the one before.
    pub fn tokens(&mut self, count: f64, itl_s: f64) {
        self.window.tokens += count;
        self.window.itl_sum += count * itl_s;
    }

    /// A request completed after `osl` tokens, `duration_s` after it arrived.
    pub fn completed(&mut self, osl: f64, duration_s: f64) {
        let w = &mut self.window;
        w.completed += 1.0;
        w.osl_sum += osl;
        w.osl.observe(osl);
        w.duration_sum += duration_s;
        self.totals.completions += 1.0;
        self.totals.osl_sum += osl;
    }

    /// Counts observed in aggregate (only the prompt lengths listed are observed one by one).
    pub fn add(&mut self, counts: &Counts<'_>) {
        let w = &mut self.window;
        w.arrivals += counts.arrivals;
        self.totals.arrivals += counts.arrivals;
        for &isl in counts.arrival_isl.iter().filter(|v| v.is_finite() && **v >= 0.0) {
            w.isl_sum += isl;
            w.isl_count += 1.0;
            w.isl.observe(isl);
            self.totals.isl_sum += isl;
            self.totals.isl_count += 1.0;
        }
        w.completed += counts.completed;
        self.totals.completions += counts.completed;
        w.osl_sum += counts.osl_sum;
        self.totals.osl_sum += counts.osl_sum;
        w.first_tokens += counts.ttft_count;
        w.ttft_sum += counts.ttft_sum_s;
        w.tokens += counts.itl_count;
        w.itl_sum += counts.itl_sum_s;
    }

    /// `prefill` and `decode` engines served for `span_s`, doing `prefill_work_s` of prefill
    /// (NaN when unknown: the span does not count in the busy share).
    pub fn engines(&mut self, (prefill, decode): (f64, f64), span_s: f64, prefill_work_s: f64) {
        let w = &mut self.window;
        w.prefill_engine_s += prefill * span_s;
        w.decode_engine_s += decode * span_s;
        w.span_s += span_s;
        if prefill_work_s.is_finite() {
            self.prefill_work_s += prefill_work_s.max(0.0);
            self.prefill_capacity_s += prefill * span_s;
        }
    }

    /// A sample of the decode pool's KV-cache usage (0..1).
    pub fn kv_usage(&mut self, usage: f64) {
        if usage.is_finite() {
            let w = &mut self.window;
            w.kv_usage_sum += usage;
            w.kv_samples += 1.0;
            w.kv_usage_peak = w.kv_usage_peak.max(usage);
            self.samples.decode_kv_usage.push(usage);
        }
    }

    /// A sample of the prefill requests waiting for an engine.
    pub fn prefill_queue(&mut self, waiting: f64) {
        if waiting.is_finite() {
            self.samples.prefill_queue.push(waiting.max(0.0));
        }
    }

    /// A sample of the share of prefill engines busy (0..1).
    pub fn prefill_busy(&mut self, share: f64) {
        if share.is_finite() {
            self.samples.prefill_busy.push(share.clamp(0.0, 1.0));
        }
    }

    /// Marks time `t_s`: the counts so far are what a window starting at `t_s` leaves out.
    pub fn mark(&mut self, t_s: f64) {
        self.history.push_back((t_s, self.totals));
        while self.history.get(1).is_some_and(|(t, _)| *t < t_s - HISTORY_S) {
            self.history.pop_front();
        }
    }

    /// Whether the frontend has accepted any request since it started.
    pub fn arrived_any(&self) -> bool {
        self.totals.arrivals > 0.0
    }

    /// The frontend's metrics since the last call (the operator's interval query), with the
    /// gauges now and the TTFT at `quantile`; starts the next interval.
    pub fn take_interval(&mut self, gauges: Gauges, quantile: f64) -> Observation {
        let w = std::mem::take(&mut self.window);
        let ttft_quantile = (w.ttft.count() > 0.0).then(|| (quantile, w.ttft.quantile(quantile) * 1000.0));
        let finite = |v: f64| v.is_finite().then_some(v);
        Observation {
            num_req: w.completed,
            isl: w.isl_sum / w.isl_count,
            osl: w.osl_sum / w.completed,
            ttft_ms: w.ttft_sum / w.first_tokens * 1000.0,
            itl_ms: w.itl_sum / w.tokens * 1000.0,
            request_duration_s: if self.durations {
                w.duration_sum / w.completed
            } else {
                f64::NAN
            },
            arrivals: Some(w.arrivals),
            inflight: finite(gauges.inflight),
            queued: finite(gauges.queued),
            isl_second_moment: w.isl.moments().map(|m| m.second),
            osl_second_moment: w.osl.moments().map(|m| m.second),
            ttft_quantile_ms: ttft_quantile,
            prefill_engines: (w.span_s > 0.0).then(|| w.prefill_engine_s / w.span_s),
            decode_engines: (w.span_s > 0.0).then(|| w.decode_engine_s / w.span_s),
            decode_kv_usage: (w.kv_samples > 0.0).then(|| w.kv_usage_sum / w.kv_samples),
            decode_kv_usage_peak: (w.kv_samples > 0.0).then_some(w.kv_usage_peak),
        }
    }

    /// The counts of the last `window_s` before `now_s` (from the latest mark at or before its
    /// start) and the gauges now: what the operator's fast check reads, the window's mean prompt
    /// and output lengths included (NaN without first tokens or completions in it; no second
    /// moments, which the fast read does not take).
    pub fn fast_signals(&self, now_s: f64, window_s: f64, gauges: Gauges) -> FastSignals {
        let start = now_s - window_s;
        let (since, then) = self
            .history
            .iter()
            .rev()
            .find(|(t, _)| *t <= start + 1e-9)
            .or_else(|| self.history.front())
            .copied()
            .unwrap_or_default();
        let now = self.totals;
        let finite = |v: f64| v.is_finite().then_some(v);
        let mean = |sum: f64, count: f64| if count > 0.0 { sum / count } else { f64::NAN };
        let completions = now.completions - then.completions;
        FastSignals {
            elapsed_s: 0.0,
            window_s: (now_s - since).max(0.0),
            arrivals: Some(now.arrivals - then.arrivals),
            completions,
            inflight: finite(gauges.inflight),
            queued: finite(gauges.queued),
            prefill_engines: 0.0,
            decode_engines: None,
            isl: mean(now.isl_sum - then.isl_sum, now.isl_count - then.isl_count),
            isl_second_moment: None,
            osl: mean(now.osl_sum - then.osl_sum, completions),
            osl_second_moment: None,
        }
    }

    /// The load planner's samples since the last call.
    pub fn take_samples(&mut self) -> LoadSamples {
        std::mem::take(&mut self.samples)
    }

    /// The prefill engines' busy share since the last call (NaN without engines serving).
    pub fn take_utilisation(&mut self) -> f64 {
        let share = if self.prefill_capacity_s > 0.0 {
            (self.prefill_work_s / self.prefill_capacity_s).min(1.0)
        } else {
            f64::NAN
        };
        self.prefill_work_s = 0.0;
        self.prefill_capacity_s = 0.0;
        share
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_fast_window_counts_from_the_mark_at_its_start() {
        let mut frontend = Frontend::default();
        for t in 1..=30 {
            frontend.arrived();
            if t % 2 == 0 {
                frontend.completed(100.0, 1.0);
            }
            frontend.mark(f64::from(t));
        }
        let signals = frontend.fast_signals(30.0, 20.0, Gauges::default());
        assert_eq!(
            (signals.window_s, signals.arrivals, signals.completions),
            (20.0, Some(20.0), 10.0)
        );
        // Before a whole window has passed, the window is what there is.
        let early = frontend.fast_signals(30.0, 60.0, Gauges::default());
        assert_eq!((early.window_s, early.arrivals), (30.0, Some(30.0)));
        // Reading the interval does not reset the fast counts.
        let interval = frontend.take_interval(Gauges::default(), 0.9);
        assert_eq!((interval.num_req, interval.arrivals), (15.0, Some(30.0)));
        assert_eq!(
            frontend.fast_signals(30.0, 20.0, Gauges::default()).arrivals,
            Some(20.0)
        );
    }

    #[test]
    fn the_interval_carries_the_quantile_asked_for_and_starts_afresh() {
        let mut frontend = Frontend::default();
        for i in 0..100 {
            frontend.arrived();
            frontend.first_token(1000.0, f64::from(i) / 100.0);
        }
        let observation = frontend.take_interval(Gauges::default(), 0.5);
        let (q, value) = observation.ttft_quantile_ms.unwrap();
        assert_eq!(q, 0.5);
        assert!(value > 0.0 && value < observation.ttft_ms * 2.0, "{value}");
        assert_eq!(frontend.take_interval(Gauges::default(), 0.9).arrivals, Some(0.0));
        assert!(frontend.arrived_any());
    }
}
