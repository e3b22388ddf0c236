//! The queueing planner's settings and the fixed numbers beside them.

use serde::{Deserialize, Serialize};

use crate::{
    sizing::{LatencyTargets, PrefillQueueModel},
    sla::{Limits, SlaTargets},
};

/// What the queueing planner is given besides its settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Context<'a> {
    /// Adjustment interval (s).
    pub interval_s: f64,
    /// Latency targets.
    pub sla: &'a SlaTargets,
    /// Replica bounds and the GPU budget.
    pub limits: &'a Limits,
    /// The queueing model's settings.
    pub settings: &'a QueueingConfig,
}

/// Settings of the queueing model. `Default` gives the defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueingConfig {
    /// Aim the TTFT target at this percentile (e.g. 90) instead of the mean.
    pub ttft_percentile: Option<f64>,
    /// Aim the ITL target at this percentile instead of the mean.
    pub itl_percentile: Option<f64>,
    /// Time from asking for a replica to it serving (s): how far ahead to plan.
    pub scale_up_delay_s: f64,
    /// Quantile of the forecast's relative errors the plan provides for (0..1).
    pub forecast_quantile: f64,
    /// Quantile of the mean prefill time's forecast errors the plan provides for (0..1); the
    /// arrival rate is reduced to keep the prefill work at its own quantile.
    pub service_quantile: f64,
    /// Quantile of the decode KV demand's forecast errors the plan provides for (0..1).
    pub decode_forecast_quantile: f64,
    /// Forecast errors kept (each interval adds two: horizons one and two).
    pub forecast_errors: usize,
    /// Lowest forecast multiplier once errors are known (a multiplier below 1 corrects a
    /// forecast that runs high); used alone, at least 1, until enough errors are known.
    pub forecast_margin: f64,
    /// Quantile of the recent arrival-burstiness estimates the plan provides for (0..1).
    pub burst_quantile: f64,
    /// Arrival-burstiness estimates kept.
    pub burst_samples: usize,
    /// Plan a rate with the burstiness learned at rates up to this multiple of it (unset: all
    /// estimates). The burstiness an interval's TTFT implies grows with its rate when arrivals
    /// swing within the interval: a calm interval planned with a busy one's estimate holds
    /// engines for batches that do not come.
    pub burst_rate_ratio: Option<f64>,
    /// Fewest estimates at comparable rates to plan with; with fewer, all estimates count.
    pub burst_min_samples: usize,
    /// Largest arrival burstiness planned for.
    pub max_burstiness: f64,
    /// When the prefill engines that served a whole interval, from no backlog, missed the TTFT
    /// target, plan at least one more for a rate at least that interval's (evidence over the
    /// model: it corrects a model that underestimates the wait, as bursty arrivals make it).
    pub miss_step: bool,
    /// Model arrivals as batches (M^X/G/c) rather than a renewal process with a high SCV.
    pub batches: bool,
    /// With batches, also use the burstiness as the SCV of arrivals in the queueing term.
    pub batches_queue: bool,
    /// Take the mean ISL and OSL from the predictor (else from the recent intervals' smoothed
    /// mix; the forecast errors correct either).
    pub predict_lengths: bool,
    /// Learn the burstiness against the forecast the interval was planned with (so it also
    /// absorbs forecast error) rather than against the interval's measured load.
    pub calibrate_on_forecast: bool,
    /// Scale-down stabilisation window (s): a scale-down stops at the recommendations within it
    /// (at `stabilisation_quantile`).
    pub stabilisation_s: f64,
    /// Seconds between fast-path checks.
    pub fast_period_s: f64,
    /// How long the fast path's scale-ups for a backlog are held (s, at most the stabilisation
    /// window; they are also held while the backlog remains). Scale-ups for a surge of arrivals
    /// are held for the whole window.
    pub fast_hold_s: f64,
    /// Arrival burstiness assumed before any is learned (1: Poisson).
    pub arrival_scv: f64,
    /// Standard deviations of KV-cache demand above its mean that decode provides for.
    pub kv_sigmas: f64,
    /// Share of the KV cache plans may fill.
    pub kv_fill: f64,
    /// Correct the KV tokens a running request holds by the decode pool's observed KV usage
    /// (see [`crate::sizing::DecodeModel::kv_scale`]). On by default: the uncorrected model understates the
    /// mean where prompt and output lengths are positively correlated, which a wider KV margin
    /// (`kv_sigmas`) would otherwise have to cover at every scale.
    pub kv_correction: bool,
    /// The fast path also scales up when the queueing model, at the recent arrival rate, needs
    /// more prefill engines than are asked for.
    pub fast_sizing: bool,
    /// Rate margin of the fast path's sizing check (the recent rate times this).
    pub fast_margin: f64,
    /// Forecast multiplier until enough forecast errors are known to take their quantile.
    pub cold_margin: f64,
    /// Plan for at least this share of the last interval's arrival rate, whatever the forecast
    /// says (0: no floor).
    pub observed_floor: f64,
    /// Largest forecast multiplier (a forecast that needs more is not informative; the observed
    /// floor and the fast path cover what it misses).
    pub max_forecast_multiplier: f64,
    /// Smallest arrival burstiness learned: below 1 when intervals show shorter waits than
    /// Poisson arrivals would.
    pub min_burstiness: f64,
    /// Evidence over the model: when the last interval's arrivals came at least at the planned
    /// rate and its TTFT (ITL) stayed within this share of the target, the engines serving then
    /// are enough (0: off).
    pub evidence_slack: f64,
    /// How far the recent arrival rate may exceed the planned one (itself an upper quantile)
    /// before the fast path re-plans (0.5: 50 % above).
    pub surge_tolerance: f64,
    /// Fast-path arrival-rate samples whose median is the recent rate.
    pub fast_rate_samples: usize,
    /// Keep the fast path's rate samples across interval ticks (else each tick starts afresh).
    pub keep_fast_rates: bool,
    /// How long a surge's scale-up is held (s, at most the stabilisation window; unset: the
    /// whole window).
    pub surge_hold_s: Option<f64>,
    /// Which of the window's recommendations a scale-down stops at, as a quantile (1: the
    /// highest, as Kubernetes' HPA).
    pub stabilisation_quantile: f64,
    /// Apply the cold-start margin to the fast path's measured rate too.
    pub fast_cold_margin: bool,
    /// Decode's forecast multiplier until enough forecast errors are known (unset:
    /// `cold_margin`). Lower than prefill's by default: decode's sizing already provides
    /// `kv_sigmas` standard deviations above its mean KV demand, so the full cold margin on
    /// top counts the same uncertainty twice.
    pub decode_cold_margin: Option<f64>,
    /// Fast-path arrival-rate samples whose median, with a backlog, is the recent rate (when
    /// above the longer median of `fast_rate_samples`): a backlog is harm already.
    pub backlog_rate_samples: usize,
}

impl Default for QueueingConfig {
    fn default() -> Self {
        Self {
            ttft_percentile: None,
            itl_percentile: None,
            scale_up_delay_s: 60.0,
            forecast_quantile: 0.7,
            decode_forecast_quantile: 0.85,
            service_quantile: 0.9,
            forecast_errors: 20,
            forecast_margin: 0.0,
            burst_quantile: 0.8,
            burst_samples: 20,
            burst_rate_ratio: Some(2.5),
            burst_min_samples: 5,
            max_burstiness: 30.0,
            miss_step: false,
            batches: true,
            batches_queue: true,
            calibrate_on_forecast: false,
            predict_lengths: false,
            stabilisation_s: 300.0,
            fast_period_s: 10.0,
            fast_hold_s: 60.0,
            arrival_scv: 1.0,
            kv_sigmas: 1.75,
            kv_fill: 0.95,
            kv_correction: true,
            fast_sizing: false,
            fast_margin: 1.0,
            cold_margin: 1.4,
            observed_floor: 1.0,
            evidence_slack: 0.0,
            min_burstiness: 1.0,
            max_forecast_multiplier: 1.5,
            surge_tolerance: 0.5,
            fast_rate_samples: 8,
            keep_fast_rates: true,
            surge_hold_s: Some(60.0),
            stabilisation_quantile: 0.8,
            fast_cold_margin: true,
            decode_cold_margin: Some(1.1),
            backlog_rate_samples: 3,
        }
    }
}

impl QueueingConfig {
    pub(super) fn queue_model(&self, burst: f64) -> PrefillQueueModel {
        PrefillQueueModel {
            arrival_scv: burst,
            batches: self.batches,
            batches_queue: self.batches_queue,
        }
    }

    pub(super) fn bounded_burst(&self, burst: f64) -> f64 {
        burst.clamp(self.min_burstiness.clamp(0.0, 1.0), self.max_burstiness.max(1.0))
    }

    pub(super) fn targets(&self, sla: &SlaTargets) -> LatencyTargets {
        let quantile = |p: Option<f64>| p.filter(|p| *p > 0.0 && *p < 100.0).map(|p| p / 100.0);
        LatencyTargets {
            ttft_ms: sla.ttft_ms,
            itl_ms: sla.itl_ms,
            ttft_quantile: quantile(self.ttft_percentile),
            itl_quantile: quantile(self.itl_percentile),
        }
    }
}

/// Forecast multipliers are capped here (and at the inverse of its square root below): a larger
/// one means the forecast is not informative.
pub(super) const MAX_FORECAST_MULTIPLIER: f64 = 10.0;
/// Largest correction of the forecast mean prefill time for its bias (either way).
pub(super) const MAX_SERVICE_BIAS: f64 = 2.0;
/// Forecast errors needed before their quantile is trusted over the margin alone.
pub(super) const MIN_FORECAST_ERRORS: usize = 6;
/// Mean decode KV-cache usage above which an interval's TTFT is not used to learn the prefill
/// burstiness (first tokens also waited for KV-cache room).
pub(super) const DECODE_BOUND_KV_USAGE: f64 = 0.9;
/// Peak decode KV-cache usage at which the cache counts as having been full within the
/// interval: its TTFT then includes admission waits whatever the mean usage (a spike of long
/// prompts can fill it for seconds in an interval whose mean is low).
pub(super) const DECODE_FULL_KV_USAGE: f64 = 0.99;
/// KV-usage ratios kept (their median corrects the decode model).
pub(super) const KV_RATIO_SAMPLES: usize = 10;
/// Intervals after start-up before KV usage corrects the model: until the pool has run for a
/// few intervals, the completed requests' output lengths are biased short (the long ones are
/// still running).
pub(super) const KV_LEARN_AFTER: u64 = 3;
/// Largest KV correction either way.
pub(super) const MAX_KV_SCALE: f64 = 4.0;
/// Mean decode KV-cache usage above which an interval's usage is not used to correct the KV
/// model (admission waits cap what a saturated pool shows).
pub(super) const KV_LEARN_MAX_USAGE: f64 = 0.85;
