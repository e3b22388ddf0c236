//! The SLA planner as a state machine: feed it one interval's metrics, get a decision and the
//! reasons for it. Its state (predictor histories, correction factors, forecast errors, the
//! stabilisation window) is serializable, so the operator can persist it, and can also rebuild
//! the predictors by replaying past intervals.
//!
//! Two sizing models ([`SlaModel`]):
//!
//! - **Queueing** (default). Demand is the arrival count (requests accepted, not completed).
//!   The next interval's arrivals are forecast, then raised to an upper quantile of the
//!   predictor's recent relative errors (at horizons of one and two intervals, since a replica
//!   asked for now serves only after the scale-up delay). Prefill is the fewest engines whose
//!   predicted TTFT, queueing and the backlog to drain included, meets the target
//!   ([`super::sizing::size_prefill`], with a burst coefficient learned from observed TTFT);
//!   decode the fewest whose KV cache and ITL fit ([`super::sizing::size_decode`]).
//!   Scale-downs wait for a stabilisation window (they stop at an upper quantile of the
//!   window's recommendations) and never happen while a backlog remains. Between intervals, [`SlaPlanner::fast_check`]
//!   looks at the backlog and the arrival rate every few seconds and scales up at once when the
//!   backlog would outlast the scale-up delay.
//! - **Upstream**: Dynamo's throughput formulas ([`super::sla::plan_replicas`]) on the forecast
//!   completion count, with correction factors.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{
    interpolation::PerformanceCurves,
    predictor::{Fallback, Forecast, LoadPredictors, PredictorConfig},
    sizing::{
        self, DecodeModel, DecodeSizing, LatencyTargets, LengthMoments, PrefillQueueModel, PrefillSizing,
        ServiceMoments,
    },
    sla::{self, Corrections, Limit, Limits, Load, Observation, Pool, ReplicaPlan, SlaTargets},
    trace::TraceBucket,
};

/// Which model sizes the pools (`spec.sla.model`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SlaModel {
    /// Queueing model on arrivals, forecast quantiles, backlog, stabilisation and a fast path.
    #[default]
    Queueing,
    /// Upstream's throughput formulas on completions.
    Upstream,
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
    /// (see [`DecodeModel::kv_scale`]). On by default: the uncorrected model understates the
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
    fn queue_model(&self, burst: f64) -> PrefillQueueModel {
        PrefillQueueModel {
            arrival_scv: burst,
            batches: self.batches,
            batches_queue: self.batches_queue,
        }
    }

    fn bounded_burst(&self, burst: f64) -> f64 {
        burst.clamp(self.min_burstiness.clamp(0.0, 1.0), self.max_burstiness.max(1.0))
    }

    fn targets(&self, sla: &SlaTargets) -> LatencyTargets {
        let quantile = |p: Option<f64>| p.filter(|p| *p > 0.0 && *p < 100.0).map(|p| p / 100.0);
        LatencyTargets {
            ttft_ms: sla.ttft_ms,
            itl_ms: sla.itl_ms,
            ttft_quantile: quantile(self.ttft_percentile),
            itl_quantile: quantile(self.itl_percentile),
        }
    }
}

/// Everything the SLA planner is configured with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlaPlannerConfig {
    /// Adjustment interval (s): the prediction horizon and the metrics window.
    pub interval_s: f64,
    /// Latency targets.
    pub sla: SlaTargets,
    /// Replica bounds, GPU budget and GPUs per engine.
    pub limits: Limits,
    /// Whether correction factors are computed and applied.
    pub correction: bool,
    /// Load predictor settings.
    pub predictor: PredictorConfig,
    /// Sizing model.
    #[serde(default)]
    pub model: SlaModel,
    /// Queueing-model settings.
    #[serde(default)]
    pub queueing: QueueingConfig,
}

/// What the metrics source delivered for an interval.
#[derive(Clone, Debug, PartialEq)]
pub enum IntervalMetrics {
    /// Prometheus could not be read, or returned no series: nothing is learned or decided.
    Unavailable {
        /// Why, for status and events.
        reason: String,
    },
    /// The frontend serves the model but has counted no request yet (a new graph before its
    /// first request has no request series): nothing is learned or decided until one arrives.
    AwaitingTraffic {
        /// What was seen, for status.
        reason: String,
    },
    /// The interval's frontend metrics (means may be NaN when no request completed).
    Observed(Observation),
}

/// Why the planner keeps the current replicas this interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Hold {
    /// Metrics were missing: never scale (in particular never down) on missing data.
    MetricsUnavailable {
        /// Why.
        reason: String,
    },
    /// Means are NaN because no request completed: upstream skips such intervals.
    NoTraffic,
    /// No request has reached the frontend yet: planning starts with the first one.
    AwaitingTraffic {
        /// What was seen.
        reason: String,
    },
}

/// One interval's decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlaDecision {
    /// The metrics the decision was based on.
    pub observed: Option<Observation>,
    /// The predicted load of the next interval.
    pub predicted: Option<Load>,
    /// Predictor fallbacks used (requests, ISL, OSL), if any.
    pub fallbacks: Vec<(String, Fallback)>,
    /// Correction factors after this interval.
    pub corrections: Corrections,
    /// The replica plan, when one was made.
    pub plan: Option<ReplicaPlan>,
    /// Set when the current replicas are kept.
    pub hold: Option<Hold>,
    /// Replicas running when the decision was made.
    pub current: (u32, u32),
    /// The queueing model's plan, when it made one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queueing: Option<QueueingPlan>,
}

/// Why the queueing model chose its replicas (for status and events).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ScaleReason {
    /// Sized for the forecast (at its upper quantile), queueing included.
    Forecast,
    /// The backlog needed more prefill engines than the forecast alone: the requests waiting
    /// now and those that queue up, at the forecast rate, before a replica asked for now serves.
    Backlog {
        /// Requests waiting beyond those being prefilled.
        backlog: f64,
        /// Requests expected to queue up before new replicas serve.
        growth: f64,
    },
    /// Between intervals, the backlog would have outlasted the scale-up delay.
    FastPath {
        /// Requests waiting beyond those being prefilled.
        backlog: f64,
        /// Recent arrival rate (requests/s).
        arrival_rate: f64,
        /// Seconds the backlog would take to clear with the engines serving.
        drain_s: f64,
    },
    /// Between intervals, arrivals ran above the rate the last plan provided for.
    Surge {
        /// Recent arrival rate (requests/s).
        arrival_rate: f64,
        /// The rate the last plan provided for (requests/s).
        planned_rate: f64,
    },
    /// The prefill engines that served the last interval, from no backlog, missed the TTFT
    /// target: one more than they were, whatever the model says.
    MissedTarget {
        /// Engines that served the interval.
        engines: u32,
        /// The TTFT they gave (ms, at the target's statistic).
        ttft_ms: f64,
    },
    /// A scale-down is deferred: the stabilisation window still has a higher recommendation.
    Stabilising,
    /// A scale-down is refused while a backlog remains.
    BacklogHold {
        /// Requests waiting beyond those being prefilled.
        backlog: f64,
    },
}

impl std::fmt::Display for ScaleReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Forecast => write!(f, "sized for the forecast"),
            Self::Backlog { backlog, growth } => write!(
                f,
                "sized to drain a backlog of {backlog:.0} requests and the {growth:.0} more expected to queue before new replicas serve"
            ),
            Self::FastPath {
                backlog,
                arrival_rate,
                drain_s,
            } => {
                let drain = if drain_s.is_finite() {
                    format!("{drain_s:.0} s")
                } else {
                    "ever".to_string()
                };
                write!(
                    f,
                    "SLA at risk: {backlog:.0} requests waiting at {arrival_rate:.1} req/s would take {drain} to clear"
                )
            }
            Self::Surge {
                arrival_rate,
                planned_rate,
            } => write!(
                f,
                "arrivals at {arrival_rate:.1} req/s exceed the {planned_rate:.1} req/s planned for"
            ),
            Self::MissedTarget { engines, ttft_ms } => write!(
                f,
                "{engines} prefill engines gave a TTFT of {ttft_ms:.0} ms last interval with no backlog: one more"
            ),
            Self::Stabilising => write!(f, "scale-down deferred by the stabilisation window"),
            Self::BacklogHold { backlog } => {
                write!(f, "no scale-down while {backlog:.0} requests are waiting")
            }
        }
    }
}

/// The queueing model's plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueingPlan {
    /// Point forecast of the next interval's arrivals.
    pub forecast_requests: f64,
    /// Multiplier of the arrival forecast from its errors' upper quantile.
    pub forecast_multiplier: f64,
    /// Multiplier of the mean prefill time from its errors' upper quantile.
    pub service_multiplier: f64,
    /// Multiplier of the decode KV demand from its errors' upper quantile.
    pub decode_multiplier: f64,
    /// Arrival rate planned for (requests/s).
    pub planned_rate: f64,
    /// Arrival burstiness used.
    pub burst: f64,
    /// Requests waiting beyond those being prefilled.
    pub backlog: f64,
    /// Prompt-length moments planned for.
    pub isl: LengthMoments,
    /// Output-length moments planned for.
    pub osl: LengthMoments,
    /// Prefill sizing.
    pub prefill_sizing: PrefillSizing,
    /// Decode sizing.
    pub decode_sizing: DecodeSizing,
    /// Replicas the load asked for, before stabilisation, the backlog hold and the budget.
    pub desired: (u32, u32),
    /// Replicas to run.
    pub replicas: (u32, u32),
    /// Why.
    pub reason: ScaleReason,
    /// Bounds and budget that changed the result.
    pub limits: Vec<Limit>,
}

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
    /// Requests waiting for or in prefill, now (as [`Observation::queued`]).
    pub queued: Option<f64>,
    /// Prefill engines ready now.
    pub prefill_engines: f64,
    /// Mean ISL since the last decision (NaN without first tokens).
    pub isl: f64,
    /// `E[ISL²]` since the last decision.
    pub isl_second_moment: Option<f64>,
    /// Mean OSL since the last decision (NaN without completions).
    pub osl: f64,
    /// `E[OSL²]` since the last decision.
    pub osl_second_moment: Option<f64>,
}

impl SlaDecision {
    /// The replicas to run, or `None` to keep the current ones.
    pub fn target(&self) -> Option<(u32, u32)> {
        self.plan
            .as_ref()
            .map(|plan| (plan.prefill, plan.decode))
            .or_else(|| self.queueing.as_ref().map(|plan| plan.replicas))
    }

    /// Whether the decision changes the running replicas.
    pub fn changes_replicas(&self) -> bool {
        self.target().is_some_and(|target| target != self.current)
    }

    /// Bounds and budget that limited the decision.
    pub fn limits(&self) -> &[Limit] {
        match (&self.plan, &self.queueing) {
            (Some(plan), _) => plan.limits.as_slice(),
            (None, Some(plan)) => plan.limits.as_slice(),
            (None, None) => &[],
        }
    }

    /// One line saying why the decision is what it is.
    pub fn explanation(&self) -> String {
        if let Some(hold) = &self.hold {
            return match hold {
                Hold::MetricsUnavailable { reason } => {
                    format!("keeping replicas: metrics unavailable ({reason})")
                }
                Hold::NoTraffic => "keeping replicas: no request completed in the interval".to_string(),
                Hold::AwaitingTraffic { reason } => format!("keeping replicas: {reason}"),
            };
        }
        if let Some(plan) = &self.queueing {
            return queueing_explanation(plan);
        }
        let (Some(plan), Some(load)) = (&self.plan, &self.predicted) else {
            return "no decision".to_string();
        };
        let mut line = format!(
            "predicted {:.0} requests (ISL {:.0}, OSL {:.0}): {} prefill and {} decode replicas",
            load.num_req, load.isl, load.osl, plan.prefill, plan.decode
        );
        for limit in plan
            .limits
            .iter()
            .filter(|l| !matches!(l, Limit::MinReplicas { .. }))
        {
            line.push_str(&format!("; {limit}"));
        }
        // A constant series is the model's own answer, not a fallback worth reporting.
        for (series, fallback) in self
            .fallbacks
            .iter()
            .filter(|(_, f)| !matches!(f, Fallback::ConstantSeries))
        {
            line.push_str(&format!("; {series} forecast: {fallback}"));
        }
        line
    }
}

fn queueing_explanation(plan: &QueueingPlan) -> String {
    let bound = |b: sizing::Bound| match b {
        sizing::Bound::Minimum => "the minimum",
        sizing::Bound::Ttft => "TTFT",
        sizing::Bound::Itl => "ITL",
        sizing::Bound::KvCache => "KV cache",
        sizing::Bound::Maximum => "the maximum",
    };
    let mut line = format!(
        "{}: {:.2} req/s planned ({:.0} forecast x {:.2}, ISL {:.0}, OSL {:.0}): {} prefill ({}, TTFT {:.0} ms) and {} decode ({}) replicas",
        plan.reason,
        plan.planned_rate,
        plan.forecast_requests,
        plan.forecast_multiplier,
        plan.isl.mean,
        plan.osl.mean,
        plan.replicas.0,
        bound(plan.prefill_sizing.bound),
        plan.prefill_sizing.ttft_ms,
        plan.replicas.1,
        bound(plan.decode_sizing.bound),
    );
    for limit in plan
        .limits
        .iter()
        .filter(|l| !matches!(l, Limit::MinReplicas { .. }))
    {
        line.push_str(&format!("; {limit}"));
    }
    line
}

/// Forecast multipliers are capped here (and at the inverse of its square root below): a larger
/// one means the forecast is not informative.
const MAX_FORECAST_MULTIPLIER: f64 = 10.0;
/// Largest correction of the forecast mean prefill time for its bias (either way).
const MAX_SERVICE_BIAS: f64 = 2.0;
/// Forecast errors needed before their quantile is trusted over the margin alone.
const MIN_FORECAST_ERRORS: usize = 6;
/// Mean decode KV-cache usage above which an interval's TTFT is not used to learn the prefill
/// burstiness (first tokens also waited for KV-cache room).
const DECODE_BOUND_KV_USAGE: f64 = 0.9;
/// Peak decode KV-cache usage at which the cache counts as having been full within the
/// interval: its TTFT then includes admission waits whatever the mean usage (a spike of long
/// prompts can fill it for seconds in an interval whose mean is low).
const DECODE_FULL_KV_USAGE: f64 = 0.99;
/// KV-usage ratios kept (their median corrects the decode model).
const KV_RATIO_SAMPLES: usize = 10;
/// Intervals after start-up before KV usage corrects the model: until the pool has run for a
/// few intervals, the completed requests' output lengths are biased short (the long ones are
/// still running).
const KV_LEARN_AFTER: u64 = 3;
/// Largest KV correction either way.
const MAX_KV_SCALE: f64 = 4.0;
/// Mean decode KV-cache usage above which an interval's usage is not used to correct the KV
/// model (admission waits cap what a saturated pool shows).
const KV_LEARN_MAX_USAGE: f64 = 0.85;

/// The queueing model's state between intervals.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct QueueingState {
    /// Planner clock (s): advanced by the interval at each tick.
    clock_s: f64,
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
    bursts: VecDeque<f64>,
    /// The arrival rate each of `bursts` was learned at (req/s), newest last.
    #[serde(default)]
    burst_rates: VecDeque<f64>,
    /// Prompt-length moments (smoothed).
    isl: Option<LengthMoments>,
    /// Output-length moments (smoothed).
    osl: Option<LengthMoments>,
    /// Recommendations `(time, prefill, decode)` within the stabilisation window.
    desired: VecDeque<(f64, u32, u32)>,
    /// What the last tick planned for (the fast path reuses it).
    last_plan: Option<FastBasis>,
    /// Recent fast-path arrival rates, newest last.
    fast_rates: VecDeque<f64>,
    /// Inflight gauge at the last fast check.
    fast_inflight: Option<f64>,
    /// `ln(measured / modelled)` KV tokens held by the decode pool, newest last.
    #[serde(default)]
    kv_ratios: VecDeque<f64>,
    /// Planner clock when the last change of the decode replicas had taken effect (a
    /// scale-up once its replicas are ready).
    #[serde(default)]
    decode_settled_s: f64,
}

/// What an interval asks of each pool: requests, their mean prefill time, and the decode KV
/// tokens they hold over their decode (tokens × output tokens, the ITL being common).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Work {
    requests: f64,
    service_s: f64,
    service: ServiceMoments,
    decode: f64,
}

/// `ln((actual + unit) / (forecast + unit))`.
fn log_error(actual: f64, forecast: f64, unit: f64) -> f64 {
    ((actual.max(0.0) + unit) / (forecast.max(0.0) + unit)).ln()
}

impl Work {
    /// `service` is [`sizing::prefill_service`] of `isl`, which callers often have already.
    fn of(requests: f64, service: ServiceMoments, isl: &LengthMoments, osl: &LengthMoments) -> Self {
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

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct FastBasis {
    rate: f64,
    service: ServiceMoments,
    burst: f64,
    isl: LengthMoments,
    osl: LengthMoments,
    #[serde(default = "one")]
    kv_scale: f64,
}

fn one() -> f64 {
    1.0
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

/// The `q`-quantile (0..1) of `values` (linear between order statistics); `None` when empty.
fn quantile(values: impl Iterator<Item = f64>, q: f64) -> Option<f64> {
    // The windows are short (tens of values): a stack buffer spares an allocation per call.
    let mut stack = [0.0; 64];
    let mut heap = Vec::new();
    let mut len = 0;
    for value in values.filter(|v| v.is_finite()) {
        if len < stack.len() {
            stack[len] = value;
        } else {
            if heap.is_empty() {
                heap.extend_from_slice(&stack);
            }
            heap.push(value);
        }
        len += 1;
    }
    let values = if heap.is_empty() {
        &mut stack[..len]
    } else {
        &mut heap[..]
    };
    if values.is_empty() {
        return None;
    }
    let position = q.clamp(0.0, 1.0) * (values.len() - 1) as f64;
    let below = (position.floor() as usize).min(values.len() - 1);
    let weight = position - below as f64;
    // Two order statistics, found by selection rather than a full sort (this runs several
    // times per interval for every policy).
    let (_, lower, rest) = values.select_nth_unstable_by(below, f64::total_cmp);
    let lower = *lower;
    let upper = rest.iter().copied().min_by(f64::total_cmp).unwrap_or(lower);
    Some(lower * (1.0 - weight) + upper * weight)
}

/// The burstiness to plan arrivals at `rate` with: the quantile of the estimates learned at
/// rates up to `burst_rate_ratio` times it when there are enough of them, else of all.
fn burst_at(q: &QueueingState, settings: &QueueingConfig, rate: f64) -> Option<f64> {
    let all = || quantile(q.bursts.iter().copied(), settings.burst_quantile);
    let Some(ratio) = settings.burst_rate_ratio.filter(|r| r.is_finite() && *r > 0.0) else {
        return all();
    };
    // Newest last in both: pair them from the end (state from before rates were kept has
    // fewer rates than estimates).
    let comparable = q
        .bursts
        .iter()
        .rev()
        .zip(q.burst_rates.iter().rev())
        .filter(|(_, learned_at)| **learned_at <= rate * ratio)
        .map(|(burst, _)| *burst);
    if comparable.clone().count() >= settings.burst_min_samples.max(1) {
        quantile(comparable, settings.burst_quantile)
    } else {
        all()
    }
}

fn push_bounded(queue: &mut VecDeque<f64>, value: f64, keep: usize) {
    queue.push_back(value);
    while queue.len() > keep.max(1) {
        queue.pop_front();
    }
}

/// The SLA planner's state between intervals.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SlaPlanner {
    predictors: LoadPredictors,
    corrections: Corrections,
    intervals: u64,
    #[serde(default)]
    queueing: QueueingState,
}

impl SlaPlanner {
    /// A planner with empty history and neutral correction factors.
    pub fn new(config: &SlaPlannerConfig) -> Self {
        Self {
            predictors: LoadPredictors::new(&config.predictor),
            corrections: Corrections::default(),
            intervals: 0,
            queueing: QueueingState::default(),
        }
    }

    /// Feeds a warm-up trace (already bucketed by the interval) to the predictors.
    pub fn warm_up(&mut self, buckets: &[TraceBucket]) {
        self.predictors.warm_up(buckets);
    }

    /// Feeds past intervals' metrics to the predictors without deciding anything, to restore
    /// the state after a restart.
    pub fn replay(&mut self, history: &[Observation]) {
        for observation in history {
            self.predictors
                .observe(observation.num_req, observation.isl, observation.osl);
        }
    }

    /// Current correction factors.
    pub fn corrections(&self) -> Corrections {
        self.corrections
    }

    /// Intervals decided since the planner was created.
    pub fn intervals(&self) -> u64 {
        self.intervals
    }

    /// Runs one interval: learn from the metrics, predict the next interval, size both pools.
    /// `current` is the replicas asked for (serving or starting).
    pub fn tick(
        &mut self,
        config: &SlaPlannerConfig,
        model: &impl PerformanceCurves,
        metrics: IntervalMetrics,
        current: (u32, u32),
    ) -> SlaDecision {
        self.intervals += 1;
        let mut decision = SlaDecision {
            observed: None,
            predicted: None,
            fallbacks: Vec::new(),
            corrections: self.corrections,
            plan: None,
            hold: None,
            current,
            queueing: None,
        };
        if config.model == SlaModel::Queueing {
            self.queueing.clock_s += config.interval_s;
        }
        let observation = match metrics {
            IntervalMetrics::Unavailable { reason } => {
                decision.hold = Some(Hold::MetricsUnavailable { reason });
                return decision;
            }
            IntervalMetrics::AwaitingTraffic { reason } => {
                decision.hold = Some(Hold::AwaitingTraffic { reason });
                return decision;
            }
            IntervalMetrics::Observed(observation) => observation,
        };
        decision.observed = Some(observation);
        if config.model == SlaModel::Queueing {
            self.tick_queueing(config, model, &observation, current, &mut decision);
            return decision;
        }
        // As upstream: the predictors learn every interval (NaN counts as 0), but no scaling
        // happens on an interval whose means are NaN.
        self.predictors
            .observe(observation.num_req, observation.isl, observation.osl);
        if !observation.is_complete() {
            decision.hold = Some(Hold::NoTraffic);
            return decision;
        }
        if config.correction {
            if let Some(factor) = sla::prefill_correction(model, &observation) {
                self.corrections.prefill = factor;
            }
            if let Some(factor) = sla::decode_correction(model, &observation, current.1, config.interval_s) {
                self.corrections.decode = factor;
            }
        }
        decision.corrections = self.corrections;
        let (requests, isl, osl) = self.predictors.predict();
        for (series, forecast) in [("requests", &requests), ("ISL", &isl), ("OSL", &osl)] {
            if let Forecast {
                fallback: Some(fallback),
                ..
            } = forecast
            {
                decision.fallbacks.push((series.to_string(), fallback.clone()));
            }
        }
        let load = Load {
            num_req: requests.value,
            isl: isl.value,
            osl: osl.value,
        };
        let corrections = if config.correction {
            self.corrections
        } else {
            Corrections::default()
        };
        decision.plan = Some(sla::plan_replicas(
            model,
            &load,
            &config.sla,
            &corrections,
            &config.limits,
            config.interval_s,
        ));
        decision.predicted = Some(load);
        decision
    }

    /// Arrivals of an interval: the started counter, else completions plus the change in the
    /// inflight gauge, else completions.
    fn arrivals(&self, observation: &Observation) -> f64 {
        let completions = if observation.num_req.is_finite() {
            observation.num_req.max(0.0)
        } else {
            0.0
        };
        match (
            observation.arrivals,
            observation.inflight,
            self.queueing.last_inflight,
        ) {
            (Some(arrivals), _, _) if arrivals.is_finite() => arrivals.max(0.0),
            (_, Some(now), Some(before)) if now.is_finite() && before.is_finite() => {
                (completions + now - before).max(0.0)
            }
            _ => completions,
        }
    }

    fn tick_queueing(
        &mut self,
        config: &SlaPlannerConfig,
        model: &impl PerformanceCurves,
        observation: &Observation,
        current: (u32, u32),
        decision: &mut SlaDecision,
    ) {
        let settings = &config.queueing;
        let interval = config.interval_s.max(1e-3);
        let arrivals = self.arrivals(observation);
        let q = &mut self.queueing;
        q.last_inflight = observation.inflight.filter(|v| v.is_finite());

        // The interval's length mixes: its means with its histograms' second moments (or the
        // shapes seen so far).
        let measured = |mean: f64, second: Option<f64>, seen: Option<LengthMoments>| {
            (mean.is_finite() && mean > 0.0).then(|| {
                second.filter(|v| v.is_finite()).map_or_else(
                    || LengthMoments::with_scv(mean, seen.map_or(1.0, |m| m.scv())),
                    |second| LengthMoments {
                        mean,
                        second: second.max(mean * mean),
                    },
                )
            })
        };
        let observed_isl = measured(observation.isl, observation.isl_second_moment, q.isl);
        let observed_osl = measured(observation.osl, observation.osl_second_moment, q.osl);

        // Forecast errors: the work this interval brought (prefill seconds, decode KV demand)
        // against what the forecasts of the last two ticks said it would.
        // The prefill time of the measured mix: used by the errors and the burstiness below.
        let observed_service = observed_isl.map(|moments| sizing::prefill_service(model, &moments));
        if let (Some(isl_now), Some(osl_now)) = (observed_isl.or(q.isl), observed_osl.or(q.osl)) {
            let service = observed_service.unwrap_or_else(|| sizing::prefill_service(model, &isl_now));
            let work = Work::of(arrivals, service, &isl_now, &osl_now);
            // A forecast of no traffic (an idle spell) is not scored: traffic resuming is not
            // evidence of how far off the next busy interval's forecast will be, and the fast
            // path reacts to it.
            for forecast in q.forecasts.iter().filter(|f| f.requests >= 1.0) {
                let prefill = log_error(
                    work.requests * work.service_s,
                    forecast.requests * forecast.service_s,
                    forecast.service_s.max(1e-3),
                );
                push_bounded(&mut q.errors, prefill, settings.forecast_errors);
                if observed_isl.is_some() {
                    let service = log_error(work.service_s, forecast.service_s, 1e-3);
                    push_bounded(&mut q.service_errors, service, settings.forecast_errors);
                }
                let unit = (forecast.decode.max(work.decode) * 1e-3).max(1.0);
                let decode = log_error(work.decode, forecast.decode, unit);
                push_bounded(&mut q.decode_errors, decode, settings.forecast_errors);
            }
        }

        // Engines that served the whole interval, from no backlog, and still missed the TTFT
        // target (set below): too few for arrivals at that rate.
        let mut missed_with = None;
        if let (Some(moments), Some(observed_service)) = (observed_isl, observed_service) {
            // Arrival burstiness: when the interval began without a backlog and the prefill
            // engines did not change, the TTFT beyond the M/G/c wait is burst wait.
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
            if let (Some(engines), Some(_), Some(before)) = (serving, backlog_now, q.last_backlog)
                && (engines - engines.round()).abs() < 0.05
                && before <= engines
                && !decode_bound
                && observation.ttft_ms.is_finite()
            {
                let ttft_seen = match (
                    settings.targets(&config.sla).ttft_quantile,
                    observation.ttft_quantile_ms,
                ) {
                    (Some(p), Some((at, ms))) if (at - p).abs() < 1e-6 => ms,
                    _ => observation.ttft_ms,
                };
                if ttft_seen > config.sla.ttft_ms {
                    missed_with = Some((engines.round() as u32, ttft_seen));
                }
                let measured = (observed_service, arrivals / interval);
                let (service, rate) = if settings.calibrate_on_forecast {
                    q.forecasts
                        .front()
                        .map_or(measured, |f| (f.service, f.requests / interval))
                } else {
                    measured
                };
                if let Some(kappa) = sizing::implied_arrival_scv(
                    &service,
                    rate,
                    &settings.queue_model(settings.arrival_scv),
                    engines.round() as u32,
                    observation.ttft_ms / 1000.0,
                    settings.min_burstiness,
                ) {
                    push_bounded(&mut q.bursts, kappa, settings.burst_samples);
                    push_bounded(&mut q.burst_rates, rate, settings.burst_samples);
                }
            }
            q.isl = Some(blend(q.isl, moments));
        }
        if let Some(moments) = observed_osl {
            q.osl = Some(blend(q.osl, moments));
        }
        // The decode pool's KV usage against what the model says the interval's arrivals hold
        // (Little's law over the same engines): the ratio corrects the tokens per running
        // request. Only while the decode replicas were settled for the whole interval and the
        // cache was not saturated (admission waits cap what a full cache shows).
        if settings.kv_correction
            && self.intervals > KV_LEARN_AFTER
            && q.decode_settled_s <= q.clock_s - interval + 1e-6
            && current.1 >= 1
            && let (Some(usage), Some(capacity), Some(isl_now), Some(osl_now)) = (
                observation.decode_kv_usage,
                model.max_kv_tokens(),
                observed_isl,
                observed_osl,
            )
            && usage.is_finite()
            && usage > 0.0
            && usage < KV_LEARN_MAX_USAGE
            && capacity.is_finite()
            && capacity > 0.0
        {
            let modelled = sizing::size_decode(
                model,
                arrivals / interval,
                &isl_now,
                &osl_now,
                &DecodeModel {
                    kv_sigmas: 0.0,
                    kv_fill: 1.0,
                    kv_scale: 1.0,
                },
                &settings.targets(&config.sla),
                current.1,
                current.1,
            );
            let measured = usage * capacity * f64::from(current.1);
            // At least one request's worth of prompt tokens held on average, for a ratio worth
            // taking.
            if modelled.kv_tokens.is_finite() && modelled.kv_tokens > isl_now.mean.max(1.0) {
                push_bounded(
                    &mut q.kv_ratios,
                    (measured / modelled.kv_tokens).ln(),
                    KV_RATIO_SAMPLES,
                );
            }
        }
        let kv_scale = quantile(q.kv_ratios.iter().copied(), 0.5)
            .map_or(1.0, f64::exp)
            .clamp(1.0 / MAX_KV_SCALE, MAX_KV_SCALE);

        // Lengths are learned only from intervals that measured them: an idle interval's NaN
        // means are no evidence of zero-length requests.
        self.predictors.requests.add_data_point(arrivals);
        if observation.isl.is_finite() {
            self.predictors.isl.add_data_point(observation.isl);
        }
        if observation.osl.is_finite() {
            self.predictors.osl.add_data_point(observation.osl);
        }
        let (requests, isl, osl) = self.predictors.predict();
        for (series, forecast) in [("requests", &requests), ("ISL", &isl), ("OSL", &osl)] {
            if let Some(fallback) = &forecast.fallback {
                decision.fallbacks.push((series.to_string(), fallback.clone()));
            }
        }
        let q = &mut self.queueing;

        // Prompt and output mixes at the forecast means.
        let isl_shape = q.isl.unwrap_or(LengthMoments::with_scv(isl.value, 1.0));
        let osl_shape = q.osl.unwrap_or(LengthMoments::with_scv(osl.value, 1.0));
        let isl_moments = if settings.predict_lengths && isl.value > 0.0 {
            isl_shape.rescaled(isl.value)
        } else {
            isl_shape
        };
        let osl_moments = if settings.predict_lengths && osl.value > 0.0 {
            osl_shape.rescaled(osl.value)
        } else {
            osl_shape
        };
        let point_service = sizing::prefill_service(model, &isl_moments);
        q.forecasts.push_front(Work::of(
            requests.value,
            point_service,
            &isl_moments,
            &osl_moments,
        ));
        q.forecasts.truncate(2);

        // Upper quantiles of the recent relative errors, as multipliers of the forecast work.
        let margin = settings.forecast_margin.max(0.0);
        let multiplier_of = |errors: &VecDeque<f64>, q: f64, cold: f64| {
            let from_errors = quantile(errors.iter().copied(), q).map(f64::exp);
            match from_errors {
                Some(m) if errors.len() >= MIN_FORECAST_ERRORS => m.max(margin),
                _ => margin.max(cold).max(1.0),
            }
            .clamp(
                1.0 / MAX_FORECAST_MULTIPLIER.sqrt(),
                settings
                    .max_forecast_multiplier
                    .clamp(1.0, MAX_FORECAST_MULTIPLIER),
            )
        };
        // The prefill work (arrivals × mean prefill time) at its upper quantile; the mean
        // prefill time itself corrected for the forecast's bias (its median error), the rate
        // carrying the rest.
        let work_multiplier = multiplier_of(&q.errors, settings.forecast_quantile, settings.cold_margin);
        let service_multiplier = if q.service_errors.len() >= MIN_FORECAST_ERRORS {
            quantile(q.service_errors.iter().copied(), settings.service_quantile)
                .map_or(1.0, f64::exp)
                .clamp(1.0 / MAX_SERVICE_BIAS, MAX_SERVICE_BIAS)
        } else {
            1.0
        };
        let multiplier = work_multiplier / service_multiplier;
        let decode_multiplier = multiplier_of(
            &q.decode_errors,
            settings.decode_forecast_quantile,
            settings.decode_cold_margin.unwrap_or(settings.cold_margin),
        );
        let service = ServiceMoments {
            mean_s: point_service.mean_s * service_multiplier,
            ..point_service
        };
        let floor = arrivals / interval * settings.observed_floor.max(0.0);
        let rate = (requests.value * multiplier / interval).max(floor);
        let decode_rate = (requests.value * decode_multiplier / interval).max(floor);
        let burst = settings.bounded_burst(burst_at(q, settings, rate).unwrap_or(settings.arrival_scv));

        // The backlog at the end of the interval, and what it grows to before a replica asked
        // for now can serve.
        let serving = observation
            .prefill_engines
            .filter(|c| c.is_finite())
            .unwrap_or(f64::from(current.0));
        let backlog = observation
            .queued
            .map_or(0.0, |queued| (queued - serving).max(0.0));
        q.last_backlog = observation.queued.map(|_| backlog);
        let growth = if service.mean_s > 0.0 {
            (rate * service.mean_s - serving).max(0.0) / service.mean_s * settings.scale_up_delay_s
        } else {
            0.0
        };

        let targets = settings.targets(&config.sla);
        let (min, max) = bounds(&config.limits);
        let queue_model = settings.queue_model(burst);
        let prefill = sizing::size_prefill(
            &service,
            rate,
            backlog + growth,
            interval,
            &queue_model,
            &targets,
            min,
            max,
        );
        let without_backlog = if backlog + growth > 0.0 {
            sizing::size_prefill(&service, rate, 0.0, interval, &queue_model, &targets, min, max)
        } else {
            prefill
        };

        let decode_model = DecodeModel {
            kv_sigmas: settings.kv_sigmas,
            kv_fill: settings.kv_fill,
            kv_scale,
        };
        // Draining the prefill backlog feeds decode faster than arrivals do.
        let drain_rate = (backlog + growth) / interval;
        let decode = sizing::size_decode(
            model,
            decode_rate + drain_rate,
            &isl_moments,
            &osl_moments,
            &decode_model,
            &targets,
            min,
            max,
        );
        q.last_plan = Some(FastBasis {
            rate,
            service,
            burst,
            isl: isl_moments,
            osl: osl_moments,
            kv_scale,
        });
        if !settings.keep_fast_rates {
            q.fast_rates.clear();
        }

        let mut desired = (prefill.replicas, decode.replicas);
        // What the last interval showed: a pool that served at least the planned rate within
        // the target (with slack) needs no more engines than it had.
        let slack = settings.evidence_slack;
        let observed_rate = arrivals / interval;
        if slack > 0.0 && observed_rate > 0.0 && backlog <= 0.0 {
            let ttft_seen = match (targets.ttft_quantile, observation.ttft_quantile_ms) {
                (Some(p), Some((at, ms))) if (at - p).abs() < 1e-6 => ms,
                _ => observation.ttft_ms,
            };
            if rate <= observed_rate
                && ttft_seen.is_finite()
                && ttft_seen <= slack * config.sla.ttft_ms
                && serving >= 1.0
            {
                desired.0 = desired.0.min((serving.round() as u32).max(min));
            }
            let kv_ok = observation
                .decode_kv_usage
                .is_some_and(|u| u <= slack * settings.kv_fill);
            if decode_rate <= observed_rate
                && kv_ok
                && observation.itl_ms.is_finite()
                && observation.itl_ms <= slack * config.sla.itl_ms
                && current.1 >= 1
            {
                desired.1 = desired.1.min(current.1.max(min));
            }
        }
        let now = q.clock_s;
        // A backlog is what the prefill engines serving would take longer than the TTFT target
        // to clear: no pool scales down while one remains.
        let backlogged = backlogged(backlog, service.mean_s, serving, config.sla.ttft_ms);
        // What the arrivals alone need (no backlog to drain), for the stabilisation window.
        let decode_sustained = if drain_rate > 0.0 {
            sizing::size_decode(
                model,
                decode_rate,
                &isl_moments,
                &osl_moments,
                &decode_model,
                &targets,
                min,
                max,
            )
            .replicas
        } else {
            decode.replicas
        };
        let mut sustained = (
            desired.0.min(without_backlog.replicas.max(min)),
            desired.1.min(decode_sustained),
        );
        // Evidence over the model, upwards: the engines that missed the target last interval are
        // too few for a plan at least that interval's rate; one more is held like any plan.
        let mut missed = None;
        if settings.miss_step
            && let Some((engines, ttft_ms)) = missed_with
            && rate >= observed_rate
        {
            let floor = engines.saturating_add(1).min(max);
            if floor > desired.0 {
                missed = Some(ScaleReason::MissedTarget { engines, ttft_ms });
            }
            desired.0 = desired.0.max(floor);
            sustained.0 = sustained.0.max(floor);
        }
        let (replicas, held) = stabilise(q, settings, now, desired, sustained, current, backlogged);
        let reason = if held && backlogged {
            ScaleReason::BacklogHold { backlog }
        } else if held {
            ScaleReason::Stabilising
        } else if let Some(reason) = missed {
            reason
        } else if prefill.replicas > without_backlog.replicas {
            ScaleReason::Backlog { backlog, growth }
        } else {
            ScaleReason::Forecast
        };
        let (replicas, limits) = finish(replicas, &config.limits);
        if replicas.1 != current.1 {
            let delay = if replicas.1 > current.1 {
                settings.scale_up_delay_s.max(0.0)
            } else {
                0.0
            };
            q.decode_settled_s = now + delay;
        }
        decision.predicted = Some(Load {
            num_req: requests.value,
            isl: isl_moments.mean,
            osl: osl_moments.mean,
        });
        decision.queueing = Some(QueueingPlan {
            forecast_requests: requests.value,
            forecast_multiplier: multiplier,
            service_multiplier,
            decode_multiplier,
            planned_rate: rate,
            burst,
            backlog,
            isl: isl_moments,
            osl: osl_moments,
            prefill_sizing: prefill,
            decode_sizing: decode,
            desired,
            replicas,
            reason,
            limits,
        });
    }

    /// The fast path, between intervals (every [`QueueingConfig::fast_period_s`]). Scales up at
    /// once, never down, when
    /// - the backlog would still be there once a replica asked for now is ready (or arrivals
    ///   exceed what the prefill engines serve), or
    /// - arrivals run above the rate the last plan provided for,
    ///
    /// sizing both pools for the recent arrival rate (the median of the last checks, kept across ticks) plus
    /// the backlog. `None` when nothing needs to change or the model is not the queueing one.
    /// Before the first interval's decision, the lengths seen so far stand in for the plan.
    /// `current` is the replicas asked for.
    pub fn fast_check(
        &mut self,
        config: &SlaPlannerConfig,
        model: &impl PerformanceCurves,
        signals: &FastSignals,
        current: (u32, u32),
    ) -> Option<SlaDecision> {
        if config.model != SlaModel::Queueing {
            return None;
        }
        let settings = &config.queueing;
        let q = &mut self.queueing;
        let window = signals.window_s.max(1e-3);
        let arrivals = match (signals.arrivals, signals.inflight, q.fast_inflight) {
            (Some(arrivals), _, _) if arrivals.is_finite() => arrivals.max(0.0),
            (_, Some(now), Some(before)) if now.is_finite() && before.is_finite() => {
                (signals.completions + now - before).max(0.0)
            }
            _ => signals.completions.max(0.0),
        };
        q.fast_inflight = signals.inflight.filter(|v| v.is_finite());
        push_bounded(&mut q.fast_rates, arrivals / window, settings.fast_rate_samples);
        // Until forecast errors are known, the recent rate gets the cold-start margin too.
        let cold = if settings.fast_cold_margin && q.errors.len() < MIN_FORECAST_ERRORS {
            settings.cold_margin.max(1.0)
        } else {
            1.0
        };
        // A surge needs the rate sustained over all the samples kept.
        let recent = quantile(q.fast_rates.iter().copied(), 0.5).unwrap_or(0.0) * cold;
        let basis = match q.last_plan {
            Some(basis) => basis,
            None => {
                let moments = |mean: f64, second: Option<f64>| {
                    (mean.is_finite() && mean > 0.0).then(|| LengthMoments {
                        mean,
                        second: second.filter(|v| v.is_finite()).unwrap_or(2.0 * mean * mean),
                    })
                };
                let isl = moments(signals.isl, signals.isl_second_moment)?;
                let osl = moments(signals.osl, signals.osl_second_moment)?;
                FastBasis {
                    rate: 0.0,
                    service: sizing::prefill_service(model, &isl),
                    burst: settings.arrival_scv.max(1.0),
                    isl,
                    osl,
                    kv_scale: 1.0,
                }
            }
        };
        let queued = signals.queued.filter(|v| v.is_finite()).unwrap_or(0.0);
        let serving = signals.prefill_engines.max(0.0);
        let backlog = (queued - serving).max(0.0);
        let service = basis.service;
        if service.mean_s.is_nan() || service.mean_s <= 0.0 {
            return None;
        }
        // A backlog is harm already: judged on the last few samples (with three, a step shows
        // within 20 s), or the longer median if higher.
        let latest = if backlog > 0.0 {
            let last = settings.backlog_rate_samples.max(1);
            let short = quantile(q.fast_rates.iter().rev().take(last).copied(), 0.5).unwrap_or(0.0);
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
        let targets = settings.targets(&config.sla);
        let (min, max) = bounds(&config.limits);
        let queue_model = settings.queue_model(basis.burst);
        let interval = config.interval_s.max(1e-3);
        // The engines the recent rate needs, with the queue wait, against those asked for.
        let short = settings.fast_sizing
            && sizing::size_prefill(
                &service,
                latest * settings.fast_margin,
                backlog,
                interval,
                &queue_model,
                &targets,
                min,
                max,
            )
            .replicas
                > current.0;
        // A backlog the serving engines clear within the TTFT target puts nothing at risk (the
        // interval tick's test for holding scale-downs).
        let negligible = serving > 0.0 && !backlogged(backlog, service.mean_s, serving, config.sla.ttft_ms);
        let at_risk = drain_s > settings.scale_up_delay_s && !negligible || short;
        let surge = recent > basis.rate * (1.0 + settings.surge_tolerance.max(0.0));
        if !at_risk && !surge {
            return None;
        }
        let rate = if at_risk { latest } else { recent }.max(basis.rate);
        let growth = (rate * service.mean_s - serving).max(0.0) / service.mean_s * settings.scale_up_delay_s;
        // The burstiness learned at this rate, never below the plan's.
        let queue_model = settings.queue_model(
            burst_at(q, settings, rate).map_or(basis.burst, |b| settings.bounded_burst(b).max(basis.burst)),
        );
        let prefill = sizing::size_prefill(
            &service,
            rate,
            backlog + growth,
            interval,
            &queue_model,
            &targets,
            min,
            max,
        );
        let decode_model = DecodeModel {
            kv_sigmas: settings.kv_sigmas,
            kv_fill: settings.kv_fill,
            kv_scale: basis.kv_scale,
        };
        let decode = sizing::size_decode(
            model,
            rate + (backlog + growth) / interval,
            &basis.isl,
            &basis.osl,
            &decode_model,
            &targets,
            min,
            max,
        );
        let desired = (prefill.replicas.max(current.0), decode.replicas.max(current.1));
        let (replicas, limits) = finish(desired, &config.limits);
        if replicas.0 <= current.0 && replicas.1 <= current.1 {
            return None;
        }
        let replicas = (replicas.0.max(current.0), replicas.1.max(current.1));
        // The stabilisation window keeps a surge's scale-up; a backlog's for `fast_hold_s`.
        let now = q.clock_s + signals.elapsed_s.max(0.0);
        let window = settings.stabilisation_s.max(0.0);
        let held_from = if at_risk {
            now - window + settings.fast_hold_s.clamp(0.0, window)
        } else {
            now - window + settings.surge_hold_s.unwrap_or(window).clamp(0.0, window)
        };
        q.desired.push_back((held_from, replicas.0, replicas.1));
        if replicas.1 > current.1 {
            q.decode_settled_s = now + settings.scale_up_delay_s.max(0.0);
        }
        let reason = if at_risk {
            ScaleReason::FastPath {
                backlog,
                arrival_rate: latest,
                drain_s,
            }
        } else {
            ScaleReason::Surge {
                arrival_rate: recent,
                planned_rate: basis.rate,
            }
        };
        Some(SlaDecision {
            observed: None,
            predicted: Some(Load {
                num_req: rate * interval,
                isl: basis.isl.mean,
                osl: basis.osl.mean,
            }),
            fallbacks: Vec::new(),
            corrections: self.corrections,
            plan: None,
            hold: None,
            current,
            queueing: Some(QueueingPlan {
                forecast_requests: recent * interval,
                forecast_multiplier: 1.0,
                service_multiplier: 1.0,
                decode_multiplier: 1.0,
                planned_rate: rate,
                burst: basis.burst,
                backlog,
                isl: basis.isl,
                osl: basis.osl,
                prefill_sizing: prefill,
                decode_sizing: decode,
                desired: (prefill.replicas, decode.replicas),
                replicas,
                reason,
                limits,
            }),
        })
    }
}

/// Whether `backlog` requests waiting beyond the `serving` prefill engines take those engines
/// longer than the TTFT target to clear (any backlog does when none serve).
fn backlogged(backlog: f64, service_s: f64, serving: f64, ttft_ms: f64) -> bool {
    if serving > 0.0 {
        backlog * service_s / serving > ttft_ms / 1000.0
    } else {
        backlog > 0.0
    }
}

/// The replica range the searches use.
fn bounds(limits: &Limits) -> (u32, u32) {
    let min = limits.min_replicas;
    let max = limits.max_replicas.unwrap_or(sizing::SEARCH_LIMIT).max(min);
    (min, max)
}

/// Applies the stabilisation window and the backlog hold; returns the replicas and whether a
/// scale-down was held back.
fn stabilise(
    q: &mut QueueingState,
    settings: &QueueingConfig,
    now: f64,
    desired: (u32, u32),
    sustained: (u32, u32),
    current: (u32, u32),
    backlogged: bool,
) -> ((u32, u32), bool) {
    // A planner that has just started has seen no load yet to justify a scale-down: the
    // replicas it found count as recommended.
    if q.desired.is_empty() {
        q.desired.push_back((now, current.0, current.1));
    }
    // The window remembers what the arrivals need; what draining a backlog needs on top is
    // held only while the backlog lasts (below), not for the whole window after it cleared.
    q.desired
        .push_back((now, sustained.0.min(desired.0), sustained.1.min(desired.1)));
    let window = settings.stabilisation_s.max(0.0);
    // The window is (now − window, now], as Kubernetes keeps recommendations newer than the
    // cutoff: a recommendation made a full window ago no longer holds.
    q.desired.retain(|(t, _, _)| *t > now - window + 1e-9);
    let of_window = |pool: fn(&(f64, u32, u32)) -> u32| {
        quantile(
            q.desired.iter().map(|r| f64::from(pool(r))),
            settings.stabilisation_quantile,
        )
        .map_or(0, |v| v.ceil() as u32)
    };
    let highest = (of_window(|r| r.1), of_window(|r| r.2));
    let hold = |want: u32, current: u32, highest: u32| {
        if want >= current {
            want
        } else if backlogged {
            current
        } else {
            highest.max(want).min(current)
        }
    };
    let replicas = (
        hold(desired.0, current.0, highest.0),
        hold(desired.1, current.1, highest.1),
    );
    (replicas, replicas.0 > desired.0 || replicas.1 > desired.1)
}

/// Min/max bounds and the GPU budget; records which applied.
fn finish(replicas: (u32, u32), limits: &Limits) -> ((u32, u32), Vec<Limit>) {
    let mut applied = Vec::new();
    let mut bound = |pool: Pool, needed: u32| {
        let mut r = needed;
        if r < limits.min_replicas {
            applied.push(Limit::MinReplicas {
                pool,
                needed,
                min: limits.min_replicas,
            });
            r = limits.min_replicas;
        }
        if let Some(max) = limits.max_replicas.filter(|&max| r > max) {
            applied.push(Limit::MaxReplicas { pool, needed: r, max });
            r = max;
        }
        r
    };
    let p = bound(Pool::Prefill, replicas.0);
    let d = bound(Pool::Decode, replicas.1);
    let (p, d, budget) = sla::apply_gpu_budget(p, d, limits);
    applied.extend(budget);
    ((p, d), applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{interpolation::PerformanceModel, predictor::PredictorKind, profile::Profile};

    fn model() -> PerformanceModel {
        PerformanceModel::new(&Profile::builtin("h200-llama3.1-8b-tp1").unwrap()).unwrap()
    }

    fn config(kind: PredictorKind) -> SlaPlannerConfig {
        SlaPlannerConfig {
            interval_s: 60.0,
            sla: SlaTargets::new(500.0, 50.0),
            limits: Limits {
                min_replicas: 1,
                max_replicas: None,
                max_gpu_budget: Some(8),
                prefill_gpus_per_engine: 1,
                decode_gpus_per_engine: 1,
            },
            correction: true,
            predictor: PredictorConfig {
                kind,
                interval_seconds: 60.0,
                ..PredictorConfig::default()
            },
            model: SlaModel::Upstream,
            queueing: QueueingConfig::default(),
        }
    }

    fn observed(num_req: f64) -> Observation {
        Observation {
            arrivals: None,
            inflight: None,
            queued: None,
            isl_second_moment: None,
            osl_second_moment: None,
            ttft_quantile_ms: None,
            prefill_engines: None,
            decode_kv_usage: None,
            decode_kv_usage_peak: None,
            num_req,
            isl: 3000.0,
            osl: 300.0,
            ttft_ms: 100.0,
            itl_ms: 20.0,
            request_duration_s: 8.0,
        }
    }

    #[test]
    fn missing_metrics_hold_and_teach_nothing() {
        let config = config(PredictorKind::Constant);
        let mut planner = SlaPlanner::new(&config);
        let decision = planner.tick(
            &config,
            &model(),
            IntervalMetrics::Unavailable {
                reason: "timeout".into(),
            },
            (3, 4),
        );
        assert_eq!(decision.target(), None);
        assert!(!decision.changes_replicas());
        assert!(decision.explanation().contains("metrics unavailable (timeout)"));
        assert_eq!(planner.corrections(), Corrections::default());
    }

    #[test]
    fn a_graph_awaiting_its_first_request_holds_and_learns_nothing() {
        for model_kind in [SlaModel::Upstream, SlaModel::Queueing] {
            let config = SlaPlannerConfig {
                model: model_kind,
                ..config(PredictorKind::Constant)
            };
            let mut waited = SlaPlanner::new(&config);
            for _ in 0..3 {
                let decision = waited.tick(
                    &config,
                    &model(),
                    IntervalMetrics::AwaitingTraffic {
                        reason: "waiting for the first request".into(),
                    },
                    (2, 2),
                );
                assert_eq!(decision.target(), None, "{model_kind:?}");
                assert!(matches!(decision.hold, Some(Hold::AwaitingTraffic { .. })));
                assert_eq!(
                    decision.explanation(),
                    "keeping replicas: waiting for the first request"
                );
            }
            // The first interval with traffic plans as a new planner's first one does.
            let mut fresh = SlaPlanner::new(&config);
            let first = |planner: &mut SlaPlanner| {
                planner
                    .tick(
                        &config,
                        &model(),
                        IntervalMetrics::Observed(observed(600.0)),
                        (2, 2),
                    )
                    .target()
            };
            assert!(first(&mut fresh).is_some(), "{model_kind:?}");
            assert_eq!(first(&mut waited), first(&mut fresh), "{model_kind:?}");
        }
    }

    #[test]
    fn an_interval_without_completed_requests_holds_but_feeds_the_predictors() {
        let config = config(PredictorKind::Constant);
        let mut planner = SlaPlanner::new(&config);
        planner.tick(
            &config,
            &model(),
            IntervalMetrics::Observed(observed(6000.0)),
            (1, 1),
        );
        let idle = Observation {
            ttft_ms: f64::NAN,
            itl_ms: f64::NAN,
            ..observed(0.0)
        };
        let decision = planner.tick(&config, &model(), IntervalMetrics::Observed(idle), (2, 2));
        assert_eq!(decision.hold, Some(Hold::NoTraffic));
        assert_eq!(decision.target(), None);
    }

    #[test]
    fn load_drives_replicas_and_the_explanation_says_why() {
        let config = config(PredictorKind::Constant);
        let mut planner = SlaPlanner::new(&config);
        let low = planner.tick(
            &config,
            &model(),
            IntervalMetrics::Observed(observed(60.0)),
            (1, 1),
        );
        assert_eq!(low.target(), Some((1, 1)));
        let high = planner.tick(
            &config,
            &model(),
            IntervalMetrics::Observed(observed(30_000.0)),
            (1, 1),
        );
        let (prefill, decode) = high.target().unwrap();
        assert!(prefill + decode <= 8, "budget respected: {prefill}/{decode}");
        assert!(prefill > 1 || decode > 1);
        let line = high.explanation();
        assert!(
            line.contains("predicted 30000 requests") && line.contains("decode replicas"),
            "{line}"
        );
        assert_eq!(planner.intervals(), 2);
    }

    #[test]
    fn state_survives_serialization_and_replay_restores_predictions() {
        let config = config(PredictorKind::Kalman);
        let mut planner = SlaPlanner::new(&config);
        let history: Vec<Observation> = (0..20).map(|i| observed(100.0 + 10.0 * f64::from(i))).collect();
        planner.replay(&history);
        let restored: SlaPlanner = serde_json::from_str(&serde_json::to_string(&planner).unwrap()).unwrap();
        let (mut a, mut b) = (planner.clone(), restored);
        let next = IntervalMetrics::Observed(observed(300.0));
        let from_original = a.tick(&config, &model(), next.clone(), (1, 1));
        let from_restored = b.tick(&config, &model(), next, (1, 1));
        assert_eq!(from_original.predicted, from_restored.predicted);
        // The trend learnt from the replayed history shows in the forecast.
        assert!(from_original.predicted.unwrap().num_req > 300.0);
    }

    fn queueing_config() -> SlaPlannerConfig {
        SlaPlannerConfig {
            model: SlaModel::Queueing,
            limits: Limits {
                min_replicas: 1,
                max_replicas: Some(64),
                max_gpu_budget: None,
                prefill_gpus_per_engine: 1,
                decode_gpus_per_engine: 1,
            },
            ..config(PredictorKind::Constant)
        }
    }

    /// An interval with `arrivals` requests of 3000/300 tokens, served without queueing by
    /// `engines` prefill engines.
    fn seen(arrivals: f64, queued: f64, engines: f64) -> Observation {
        Observation {
            arrivals: Some(arrivals),
            inflight: Some(queued + 10.0),
            queued: Some(queued),
            isl_second_moment: Some(1.5 * 3000.0 * 3000.0),
            osl_second_moment: Some(1.5 * 300.0 * 300.0),
            ttft_quantile_ms: None,
            prefill_engines: Some(engines),
            decode_kv_usage: Some(0.3),
            ttft_ms: 150.0,
            ..observed(arrivals)
        }
    }

    fn tick(
        planner: &mut SlaPlanner,
        config: &SlaPlannerConfig,
        o: Observation,
        current: (u32, u32),
    ) -> SlaDecision {
        planner.tick(config, &model(), IntervalMetrics::Observed(o), current)
    }

    #[test]
    fn queueing_sizes_prefill_with_queueing_and_explains_why() {
        let config = queueing_config();
        let mut planner = SlaPlanner::new(&config);
        let low = tick(&mut planner, &config, seen(600.0, 0.0, 1.0), (1, 1));
        let plan = low.queueing.clone().unwrap();
        assert_eq!(plan.reason, ScaleReason::Forecast);
        assert!(plan.prefill_sizing.ttft_ms <= 500.0);
        assert_eq!(plan.forecast_requests, 600.0);
        // Ten times the arrivals: more prefill engines, and the explanation says so.
        let mut planner = SlaPlanner::new(&config);
        let high = tick(&mut planner, &config, seen(6000.0, 0.0, 1.0), (1, 1));
        let (p_high, _) = high.target().unwrap();
        assert!(p_high > low.target().unwrap().0, "{:?}", high.queueing);
        assert!(high.explanation().contains("prefill"), "{}", high.explanation());
        // Its predicted TTFT includes the wait: more than the bare prefill time.
        let sizing = high.queueing.unwrap().prefill_sizing;
        assert!(sizing.ttft_ms > sizing.service_ms);
    }

    #[test]
    fn queueing_counts_arrivals_or_completions_plus_inflight_growth() {
        let config = queueing_config();
        let mut planner = SlaPlanner::new(&config);
        let mut o = seen(600.0, 0.0, 1.0);
        o.arrivals = None;
        o.inflight = Some(10.0);
        tick(&mut planner, &config, o, (1, 1));
        // 600 completed and the inflight gauge grew by 300: 900 arrived.
        o.inflight = Some(310.0);
        let d = tick(&mut planner, &config, o, (1, 1));
        assert_eq!(d.predicted.unwrap().num_req, 900.0);
    }

    #[test]
    fn queueing_scale_down_waits_for_the_stabilisation_window_and_the_backlog() {
        // Held at the window's highest recommendation, as Kubernetes' HPA does.
        let config = SlaPlannerConfig {
            queueing: QueueingConfig {
                stabilisation_quantile: 1.0,
                ..QueueingConfig::default()
            },
            ..queueing_config()
        };
        let mut planner = SlaPlanner::new(&config);
        let busy = tick(&mut planner, &config, seen(12_000.0, 0.0, 1.0), (1, 1));
        let high = busy.target().unwrap();
        assert!(high.0 > 1);
        // Load drops: what the arrivals needed is held for the 300 s window (the recommendation
        // five 60 s intervals old has left it), then released.
        let mut replicas = high;
        let mut released_after = None;
        for i in 1..=8 {
            let d = tick(
                &mut planner,
                &config,
                seen(600.0, 0.0, f64::from(replicas.0)),
                replicas,
            );
            let plan = d.queueing.clone().unwrap();
            if plan.reason != ScaleReason::Stabilising && released_after.is_none() {
                released_after = Some(i);
                assert!(plan.replicas.0 < replicas.0);
            } else if released_after.is_none() {
                assert!(plan.replicas.0 > plan.desired.0 + 4, "{plan:?}");
            }
            replicas = d.target().unwrap();
        }
        assert_eq!(released_after, Some(5), "held for the window");
        // With a backlog nothing scales down, whatever the window says.
        let mut planner = SlaPlanner::new(&config);
        tick(&mut planner, &config, seen(600.0, 0.0, 8.0), (8, 8));
        for _ in 0..8 {
            let d = tick(&mut planner, &config, seen(600.0, 500.0, 8.0), (8, 8));
            assert_eq!(d.target(), Some((8, 8)));
        }
        let d = tick(&mut planner, &config, seen(600.0, 500.0, 8.0), (8, 8));
        assert!(matches!(
            d.queueing.unwrap().reason,
            ScaleReason::BacklogHold { .. }
        ));
    }

    #[test]
    fn a_backlog_scale_up_is_not_held_once_the_backlog_is_gone() {
        let config = queueing_config();
        let mut planner = SlaPlanner::new(&config);
        for _ in 0..3 {
            tick(&mut planner, &config, seen(600.0, 0.0, 2.0), (2, 2));
        }
        // A backlog of 3000 requests: sized to drain it within the interval.
        let drain = tick(&mut planner, &config, seen(600.0, 3000.0, 2.0), (2, 2));
        let plan = drain.queueing.unwrap();
        assert!(
            matches!(plan.reason, ScaleReason::Backlog { .. }),
            "{:?}",
            plan.reason
        );
        let high = plan.replicas;
        assert!(high.0 > 4, "{high:?}");
        // Drained, same arrivals: back to what the arrivals need at once, not after the window.
        let after = tick(&mut planner, &config, seen(600.0, 0.0, f64::from(high.0)), high);
        let (p, _) = after.target().unwrap();
        assert!(p < high.0, "{p} vs {high:?}");
        assert!(p <= 3, "{:?}", after.queueing);
    }

    #[test]
    fn observed_kv_usage_corrects_the_decode_model_when_enabled() {
        let on = SlaPlannerConfig {
            queueing: QueueingConfig {
                kv_correction: true,
                ..QueueingConfig::default()
            },
            ..queueing_config()
        };
        let off = SlaPlannerConfig {
            queueing: QueueingConfig {
                kv_correction: false,
                ..QueueingConfig::default()
            },
            ..queueing_config()
        };
        // The pool holds far more KV than the model says 3000 requests a minute hold (long
        // outputs on long prompts, say): the corrected plan asks for more decode engines.
        let run = |config: &SlaPlannerConfig, usage: f64| {
            let mut planner = SlaPlanner::new(config);
            let mut last = None;
            for _ in 0..8 {
                let o = Observation {
                    decode_kv_usage: Some(usage),
                    ..seen(3000.0, 0.0, 4.0)
                };
                last = tick(&mut planner, config, o, (4, 4)).target();
            }
            last.unwrap().1
        };
        let plain = run(&off, 0.8);
        assert_eq!(run(&off, 0.1), plain, "off: usage is not read");
        assert!(run(&on, 0.8) > plain, "{} vs {plain}", run(&on, 0.8));
        assert!(run(&on, 0.02) <= plain);
        // A saturated cache says nothing (admission waits cap what it shows).
        assert_eq!(run(&on, 0.95), plain);
    }

    #[test]
    fn decode_has_its_own_cold_start_margin() {
        let with = |decode_cold_margin: Option<f64>| SlaPlannerConfig {
            queueing: QueueingConfig {
                cold_margin: 1.4,
                decode_cold_margin,
                ..QueueingConfig::default()
            },
            ..queueing_config()
        };
        // The first interval: no forecast errors known yet, so both margins are the cold ones.
        let first = |config: &SlaPlannerConfig| {
            let mut planner = SlaPlanner::new(config);
            tick(&mut planner, config, seen(3000.0, 0.0, 4.0), (4, 4))
                .queueing
                .unwrap()
        };
        let shared = first(&with(None));
        let own = first(&with(Some(1.1)));
        assert_eq!(shared.forecast_multiplier, 1.4);
        assert_eq!(shared.decode_multiplier, 1.4);
        assert_eq!(own.forecast_multiplier, 1.4, "prefill keeps the cold margin");
        assert_eq!(own.decode_multiplier, 1.1);
        assert!(
            own.decode_sizing.replicas < shared.decode_sizing.replicas,
            "{own:?} vs {shared:?}"
        );
        assert_eq!(own.prefill_sizing.replicas, shared.prefill_sizing.replicas);
    }

    #[test]
    fn a_pool_that_missed_the_target_from_no_backlog_gets_one_more_engine() {
        let mut config = queueing_config();
        // Arrivals pinned to Poisson: only the observed miss can add an engine.
        config.queueing.max_burstiness = 1.0;
        // A planner that has seen four calm intervals served by `engines`.
        let warmed = |miss_step: bool, engines: u32| {
            let config = SlaPlannerConfig {
                queueing: QueueingConfig {
                    miss_step,
                    ..config.queueing.clone()
                },
                ..config.clone()
            };
            let mut planner = SlaPlanner::new(&config);
            for _ in 0..4 {
                tick(
                    &mut planner,
                    &config,
                    seen(600.0, 0.0, f64::from(engines)),
                    (engines, 1),
                );
            }
            (planner, config)
        };
        let plan = |miss_step: bool, engines: u32, last: Observation| {
            let (mut planner, config) = warmed(miss_step, engines);
            tick(&mut planner, &config, last, (engines, 1)).queueing.unwrap()
        };
        // The engines the model asks for at this load, served within the target.
        let engines = plan(true, 4, seen(600.0, 0.0, 4.0)).desired.0;
        let met = plan(true, engines, seen(600.0, 0.0, f64::from(engines)));
        assert_eq!(met.desired.0, engines, "{met:?}");
        // The same interval missing the TTFT target with those engines, from no backlog.
        let missed = Observation {
            ttft_ms: 1500.0,
            ..seen(600.0, 0.0, f64::from(engines))
        };
        assert_eq!(plan(false, engines, missed).desired.0, engines);
        let stepped = plan(true, engines, missed);
        assert_eq!(stepped.desired.0, engines + 1, "{stepped:?}");
        assert_eq!(
            stepped.reason,
            ScaleReason::MissedTarget {
                engines,
                ttft_ms: 1500.0
            }
        );
        assert!(
            stepped
                .reason
                .to_string()
                .contains("prefill engines gave a TTFT of 1500 ms last interval with no backlog: one more"),
            "{}",
            stepped.reason
        );
        // Held by the stabilisation window like any plan: a calm interval next does not undo it.
        let (mut planner, stepped_config) = warmed(true, engines);
        let up = tick(&mut planner, &stepped_config, missed, (engines, 1))
            .target()
            .unwrap();
        assert_eq!(up.0, engines + 1);
        let next = tick(
            &mut planner,
            &stepped_config,
            seen(600.0, 0.0, f64::from(engines + 1)),
            up,
        );
        assert_eq!(next.target().unwrap().0, engines + 1);
    }

    #[test]
    fn a_decode_cache_that_filled_teaches_no_prefill_burstiness() {
        let config = queueing_config();
        // Four engines serve a steady load, then one interval's first tokens come slowly.
        let burst_after = |peak: Option<f64>| {
            let mut planner = SlaPlanner::new(&config);
            for _ in 0..4 {
                tick(&mut planner, &config, seen(600.0, 0.0, 4.0), (4, 4));
            }
            let before = tick(&mut planner, &config, seen(600.0, 0.0, 4.0), (4, 4))
                .queueing
                .unwrap()
                .burst;
            let slow = Observation {
                ttft_ms: 1500.0,
                decode_kv_usage: Some(0.5),
                decode_kv_usage_peak: peak,
                ..seen(600.0, 0.0, 4.0)
            };
            let after = tick(&mut planner, &config, slow, (4, 4)).queueing.unwrap().burst;
            (before, after)
        };
        // With room in the cache throughout, the wait was the prefill queue's: bursts.
        let (before, roomy) = burst_after(Some(0.8));
        assert!(roomy > before, "{roomy} vs {before}");
        assert_eq!(burst_after(None).1, roomy, "no peak read: the mean alone decides");
        // The cache filled at some point (its mean is low): first tokens also waited for room.
        let (before, full) = burst_after(Some(1.0));
        assert_eq!(full, before);
    }

    #[test]
    fn a_surge_the_pool_can_absorb_does_not_scale() {
        let config = queueing_config();
        let mut planner = SlaPlanner::new(&config);
        for _ in 0..8 {
            tick(&mut planner, &config, seen(600.0, 0.0, 8.0), (8, 8));
        }
        // Twice the planned rate, but eight engines serve it well within the target.
        let calm = FastSignals {
            elapsed_s: 10.0,
            window_s: 10.0,
            arrivals: Some(200.0),
            completions: 200.0,
            inflight: Some(20.0),
            queued: Some(1.0),
            prefill_engines: 8.0,
            isl: 3000.0,
            isl_second_moment: None,
            osl: 300.0,
            osl_second_moment: None,
        };
        for i in 0..3 {
            let signals = FastSignals {
                elapsed_s: 10.0 + 10.0 * f64::from(i),
                ..calm
            };
            assert!(planner.fast_check(&config, &model(), &signals, (8, 8)).is_none());
        }
    }

    #[test]
    fn fast_check_scales_up_on_overload_never_down() {
        let upstream = config(PredictorKind::Constant);
        let config = queueing_config();
        let mut planner = SlaPlanner::new(&config);
        tick(&mut planner, &config, seen(600.0, 0.0, 2.0), (2, 2));
        let calm = FastSignals {
            elapsed_s: 10.0,
            window_s: 10.0,
            arrivals: Some(100.0),
            completions: 100.0,
            inflight: Some(20.0),
            queued: Some(1.0),
            prefill_engines: 2.0,
            isl: 3000.0,
            isl_second_moment: None,
            osl: 300.0,
            osl_second_moment: None,
        };
        assert!(planner.fast_check(&config, &model(), &calm, (2, 2)).is_none());
        // Lighter than planned: still nothing (never down).
        let light = FastSignals {
            arrivals: Some(10.0),
            ..calm
        };
        assert!(planner.fast_check(&config, &model(), &light, (2, 2)).is_none());
        // Four times the arrivals and a queue building: up at once, with the reason.
        let mut up = None;
        for i in 0..3 {
            let surge = FastSignals {
                elapsed_s: 20.0 + 10.0 * f64::from(i),
                arrivals: Some(2000.0),
                queued: Some(3000.0),
                ..calm
            };
            up = up.or(planner.fast_check(&config, &model(), &surge, (2, 2)));
        }
        let up = up.unwrap();
        let (p, d) = up.target().unwrap();
        assert!(p > 2 && d >= 2, "{p}/{d}");
        let reason = up.queueing.unwrap().reason;
        assert!(matches!(
            reason,
            ScaleReason::FastPath { .. } | ScaleReason::Surge { .. }
        ));
        // The upstream model has no fast path.
        let mut old = SlaPlanner::new(&upstream);
        assert!(old.fast_check(&upstream, &model(), &calm, (2, 2)).is_none());
    }

    #[test]
    fn percentile_targets_need_at_least_the_mean_targets_replicas() {
        let config = queueing_config();
        let p95 = SlaPlannerConfig {
            queueing: QueueingConfig {
                ttft_percentile: Some(95.0),
                ..QueueingConfig::default()
            },
            ..queueing_config()
        };
        let mean = tick(
            &mut SlaPlanner::new(&config),
            &config,
            seen(9000.0, 0.0, 1.0),
            (1, 1),
        );
        let tail = tick(&mut SlaPlanner::new(&p95), &p95, seen(9000.0, 0.0, 1.0), (1, 1));
        assert!(tail.target().unwrap().0 >= mean.target().unwrap().0);
    }

    #[test]
    fn quantiles_interpolate_between_order_statistics_of_finite_values() {
        let sorted_quantile = |values: &[f64], q: f64| {
            let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
            v.sort_by(f64::total_cmp);
            let position = q * (v.len() - 1) as f64;
            let below = position.floor() as usize;
            let above = (below + 1).min(v.len() - 1);
            v[below] + (v[above] - v[below]) * (position - below as f64)
        };
        assert_eq!(quantile(std::iter::empty(), 0.5), None);
        assert_eq!(quantile([f64::NAN, f64::INFINITY].into_iter(), 0.5), None);
        assert_eq!(quantile([1.0, 3.0].into_iter(), 0.5), Some(2.0));
        assert_eq!(quantile([5.0, f64::NAN, 1.0, 3.0].into_iter(), 1.0), Some(5.0));
        // Past the stack buffer's 64 values too.
        for n in [1_usize, 20, 63, 64, 65, 200] {
            let values: Vec<f64> = (0..n).map(|i| ((i * 7919) % 101) as f64 - 50.0).collect();
            for q in [0.0, 0.1, 0.5, 0.7, 0.95, 1.0] {
                let got = quantile(values.iter().copied(), q).unwrap();
                assert!(
                    (got - sorted_quantile(&values, q)).abs() < 1e-9,
                    "n {n} q {q}: {got}"
                );
            }
        }
    }

    #[test]
    fn queueing_state_survives_serialization() {
        let config = queueing_config();
        let mut planner = SlaPlanner::new(&config);
        for i in 0..10 {
            tick(
                &mut planner,
                &config,
                seen(600.0 + 50.0 * f64::from(i), 0.0, 1.0),
                (1, 1),
            );
        }
        let restored: SlaPlanner = serde_json::from_str(&serde_json::to_string(&planner).unwrap()).unwrap();
        let (mut a, mut b) = (planner, restored);
        let x = tick(&mut a, &config, seen(1200.0, 0.0, 1.0), (1, 1));
        let y = tick(&mut b, &config, seen(1200.0, 0.0, 1.0), (1, 1));
        assert_eq!(x.target(), y.target());
        assert_eq!(
            x.queueing.map(|q| q.planned_rate),
            y.queueing.map(|q| q.planned_rate)
        );
        // A state persisted before the queueing model existed still loads.
        let mut old: serde_json::Value = serde_json::to_value(&a).unwrap();
        old.as_object_mut().unwrap().remove("queueing");
        assert!(serde_json::from_value::<SlaPlanner>(old).is_ok());
    }

    /// A planner warmed on a steady 10 requests/s, with the replicas its ticks asked for.
    fn steady(settings: QueueingConfig) -> (SlaPlanner, SlaPlannerConfig, (u32, u32)) {
        let config = SlaPlannerConfig {
            queueing: settings,
            ..queueing_config()
        };
        let mut planner = SlaPlanner::new(&config);
        let replicas = ticks_at(&mut planner, &config, 600.0, (1, 1), 8);
        (planner, config, replicas)
    }

    /// `ticks` intervals of `arrivals` requests each, served without a backlog by the replicas
    /// the ticks ask for.
    fn ticks_at(
        planner: &mut SlaPlanner,
        config: &SlaPlannerConfig,
        arrivals: f64,
        mut replicas: (u32, u32),
        ticks: usize,
    ) -> (u32, u32) {
        for _ in 0..ticks {
            let observed = seen(arrivals, 0.0, f64::from(replicas.0));
            replicas = tick(planner, config, observed, replicas)
                .target()
                .unwrap_or(replicas);
        }
        replicas
    }

    fn window(elapsed_s: f64, arrivals: f64, engines: u32) -> FastSignals {
        FastSignals {
            elapsed_s,
            window_s: 10.0,
            arrivals: Some(arrivals),
            completions: arrivals,
            inflight: Some(20.0),
            queued: Some(0.0),
            prefill_engines: f64::from(engines),
            isl: 3000.0,
            isl_second_moment: None,
            osl: 300.0,
            osl_second_moment: None,
        }
    }

    #[test]
    fn a_busy_window_right_after_a_tick_is_judged_with_the_windows_before_it() {
        // Three calm windows at the planned 10 requests/s, then the tick, then one window at 2.5
        // times the rate.
        let busy_after_tick = |keep_fast_rates: bool| {
            let (mut planner, config, replicas) = steady(QueueingConfig {
                keep_fast_rates,
                fast_rate_samples: 3,
                ..QueueingConfig::default()
            });
            for i in 1..=3 {
                let calm = window(10.0 * f64::from(i), 100.0, replicas.0);
                assert!(planner.fast_check(&config, &model(), &calm, replicas).is_none());
            }
            tick(
                &mut planner,
                &config,
                seen(600.0, 0.0, f64::from(replicas.0)),
                replicas,
            );
            let busy = window(10.0, 250.0, replicas.0);
            planner.fast_check(&config, &model(), &busy, replicas)
        };
        // The median of the last three is still calm.
        assert!(busy_after_tick(true).is_none());
        // Forgetting the windows at each tick makes the same window a surge on its own.
        let up = busy_after_tick(false).expect("a surge");
        assert!(matches!(up.queueing.unwrap().reason, ScaleReason::Surge { .. }));
    }

    #[test]
    fn a_surge_is_held_for_its_hold_time_not_the_whole_window() {
        for (hold, kept) in [(Some(60.0), false), (None, true)] {
            let (mut planner, config, calm) = steady(QueueingConfig {
                surge_hold_s: hold,
                keep_fast_rates: true,
                fast_rate_samples: 3,
                stabilisation_quantile: 1.0,
                ..QueueingConfig::default()
            });
            // A minute of twice the planned rate, all prompts served at once (no backlog).
            let mut up = calm;
            for i in 1..=5 {
                let busy = window(10.0 * f64::from(i), 250.0, up.0);
                if let Some(decision) = planner.fast_check(&config, &model(), &busy, up) {
                    assert!(matches!(
                        decision.queueing.as_ref().unwrap().reason,
                        ScaleReason::Surge { .. }
                    ));
                    up = decision.target().unwrap();
                }
            }
            assert!(up.0 > calm.0, "{up:?} over {calm:?}");
            // Calm again: the first tick still has the surge's minute in its window; the next
            // one, 60 s after the surge, lets it go unless surges are held for the window.
            let replicas = ticks_at(&mut planner, &config, 600.0, up, 2);
            assert_eq!(
                replicas.0 == up.0,
                kept,
                "hold {hold:?}: {replicas:?} after {up:?}, calm {calm:?}"
            );
        }
    }

    #[test]
    fn the_stabilisation_quantile_lets_one_outlier_recommendation_go() {
        let state = || QueueingState {
            desired: [(0.0, 5, 4), (60.0, 9, 6), (120.0, 5, 4), (180.0, 5, 4)]
                .into_iter()
                .collect(),
            ..QueueingState::default()
        };
        let highest = QueueingConfig {
            stabilisation_quantile: 1.0,
            ..QueueingConfig::default()
        };
        let (replicas, held) = stabilise(&mut state(), &highest, 240.0, (5, 4), (5, 4), (9, 6), false);
        assert_eq!((replicas, held), ((9, 6), true));
        // The upper quartile of [5, 5, 5, 5, 9] is 5.
        let quartile = QueueingConfig {
            stabilisation_quantile: 0.75,
            ..highest
        };
        let (replicas, held) = stabilise(&mut state(), &quartile, 240.0, (5, 4), (5, 4), (9, 6), false);
        assert_eq!((replicas, held), ((5, 4), false));
        // Two high recommendations of five are not an outlier.
        let mut twice = state();
        twice.desired[2] = (120.0, 8, 6);
        let (replicas, _) = stabilise(&mut twice, &quartile, 240.0, (5, 4), (5, 4), (9, 6), false);
        assert_eq!(replicas, (8, 6));
        // A backlog holds whatever the window says.
        let (replicas, _) = stabilise(&mut state(), &quartile, 240.0, (5, 4), (5, 4), (9, 6), true);
        assert_eq!(replicas, (9, 6));
    }

    #[test]
    fn burstiness_is_planned_from_estimates_learned_at_comparable_rates() {
        let settings = QueueingConfig::default();
        assert_eq!(settings.burst_rate_ratio, Some(2.5));
        assert_eq!(settings.burst_min_samples, 5);
        // Five calm intervals (2 requests/s) implied a burstiness of 1.5; then five busy ones
        // (40 requests/s), 12.
        let mut q = QueueingState::default();
        for (burst, rate) in [(1.5, 2.0); 5].into_iter().chain([(12.0, 40.0); 5]) {
            q.bursts.push_back(burst);
            q.burst_rates.push_back(rate);
        }
        let all = quantile(q.bursts.iter().copied(), settings.burst_quantile);
        assert!(all.is_some_and(|b| b > 10.0), "{all:?}");
        // A calm plan takes the calm estimates; one within 2.5x of the busy rate takes all.
        assert_eq!(burst_at(&q, &settings, 3.0), Some(1.5));
        assert_eq!(burst_at(&q, &settings, 16.0), all);
        // Too few comparable estimates, or no ratio: all of them.
        let strict = QueueingConfig {
            burst_min_samples: 6,
            ..settings.clone()
        };
        assert_eq!(burst_at(&q, &strict, 3.0), all);
        let unset = QueueingConfig {
            burst_rate_ratio: None,
            ..settings.clone()
        };
        assert_eq!(burst_at(&q, &unset, 3.0), all);
        // State saved before rates were kept has fewer rates than estimates: the rates belong
        // to the newest estimates.
        let mut older = q.clone();
        older.burst_rates.drain(..5);
        assert_eq!(burst_at(&older, &settings, 16.0), Some(12.0));
        assert_eq!(burst_at(&older, &settings, 3.0), all);
    }

    #[test]
    fn a_backlog_the_engines_clear_within_the_target_puts_nothing_at_risk() {
        // Settled at 50 requests/s.
        let config = queueing_config();
        let mut planner = SlaPlanner::new(&config);
        let replicas = ticks_at(&mut planner, &config, 3000.0, (1, 1), 8);
        // Two engines are asked for and serve, slower than requests arrive: a backlog would
        // never drain.
        let service = sizing::prefill_service(&model(), &LengthMoments::with_scv(3000.0, 0.5)).mean_s;
        assert!(
            replicas.0 > 2 && 50.0 * service > 2.0,
            "{replicas:?}, {service} s"
        );
        let two = (2, replicas.1);
        let with_waiting = |waiting: f64| FastSignals {
            queued: Some(2.0 + waiting),
            prefill_engines: 2.0,
            ..window(10.0, 500.0, 2)
        };
        // Fewer waiting than the engines clear within the 500 ms target: no action.
        let few = (2.0 * 0.5 / service).floor() - 1.0;
        assert!(few >= 1.0);
        let mut unmoved = planner.clone();
        let held = unmoved.fast_check(&config, &model(), &with_waiting(few), two);
        assert!(held.is_none(), "{:?}", held.map(|d| d.explanation()));
        // More than that: at risk, scaled up at once.
        let up = planner.fast_check(&config, &model(), &with_waiting(few + 10.0), two);
        let plan = up.and_then(|d| d.queueing).unwrap();
        assert!(
            matches!(plan.reason, ScaleReason::FastPath { .. }),
            "{:?}",
            plan.reason
        );
        assert!(plan.replicas.0 > 2);
    }
}
