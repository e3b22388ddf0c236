//! The SLA planner's arithmetic (upstream `prefill_planner.py`, `decode_planner.py`,
//! `planner_core._apply_global_gpu_budget`): correction
//! factors, replica counts, replica bounds and the GPU budget. Pure functions.

use serde::{Deserialize, Serialize};

use super::interpolation::{DecodeOperatingPoint, PerformanceCurves};

/// One interval's frontend metrics (means over the interval, request count summed).
///
/// The first six fields are what upstream reads. The optional ones are the demand signals of
/// the queueing model: `None` when the metrics source does not have them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Requests that completed in the interval (`dynamo_frontend_requests_total`, counted when
    /// a request finishes; under overload this is capped by capacity).
    pub num_req: f64,
    /// Mean input sequence length (tokens).
    pub isl: f64,
    /// Mean output sequence length (tokens).
    pub osl: f64,
    /// Mean time to first token (ms).
    pub ttft_ms: f64,
    /// Mean inter-token latency (ms).
    pub itl_ms: f64,
    /// Mean request duration (s).
    pub request_duration_s: f64,
    /// Requests accepted in the interval (`dynamo_frontend_requests_started_total`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrivals: Option<f64>,
    /// Requests accepted and not completed, at the end of the interval
    /// (`dynamo_frontend_inflight_requests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inflight: Option<f64>,
    /// Requests waiting for or in prefill, at the end of the interval: the frontend's requests
    /// in its preprocess, prefill route and prefill dispatch stages (`dynamo_frontend_stage_requests`;
    /// on frontends without it, `dynamo_frontend_queued_requests`). Less the prefill engines
    /// serving, the prefill backlog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<f64>,
    /// `E[ISL²]` (tokens²) from the input-length histogram.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isl_second_moment: Option<f64>,
    /// `E[OSL²]` (tokens²) from the output-length histogram.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub osl_second_moment: Option<f64>,
    /// A TTFT quantile from the histogram (`histogram_quantile`): `(quantile in 0..1, ms)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_quantile_ms: Option<(f64, f64)>,
    /// Prefill engines ready to serve, averaged over the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_engines: Option<f64>,
    /// Decode engines ready to serve, averaged over the interval (the engines the KV usage
    /// is of).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_engines: Option<f64>,
    /// KV-cache usage of the decode pool (0..1), averaged over the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_kv_usage: Option<f64>,
    /// Highest KV-cache usage of the decode pool (0..1) in the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_kv_usage_peak: Option<f64>,
}

impl Observation {
    /// Upstream's six means and count, without the queueing model's signals.
    pub const fn upstream(
        num_req: f64,
        isl: f64,
        osl: f64,
        ttft_ms: f64,
        itl_ms: f64,
        request_duration_s: f64,
    ) -> Self {
        Self {
            num_req,
            isl,
            osl,
            ttft_ms,
            itl_ms,
            request_duration_s,
            arrivals: None,
            inflight: None,
            queued: None,
            isl_second_moment: None,
            osl_second_moment: None,
            ttft_quantile_ms: None,
            prefill_engines: None,
            decode_engines: None,
            decode_kv_usage: None,
            decode_kv_usage_peak: None,
        }
    }

    /// Upstream's `Metrics.is_valid()`: every mean is a number (no traffic makes them 0/0 = NaN).
    pub fn is_complete(&self) -> bool {
        [
            self.num_req,
            self.isl,
            self.osl,
            self.ttft_ms,
            self.itl_ms,
            self.request_duration_s,
        ]
        .iter()
        .all(|v| v.is_finite())
    }
}

/// Predicted load of the next interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// Requests in the interval.
    pub num_req: f64,
    /// Mean input sequence length (tokens).
    pub isl: f64,
    /// Mean output sequence length (tokens).
    pub osl: f64,
}

/// Latency targets (ms), and how close to saturation prefill may be sized.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlaTargets {
    /// Mean time to first token.
    pub ttft_ms: f64,
    /// Mean inter-token latency.
    pub itl_ms: f64,
    /// Share of a prefill engine's profiled throughput a plan may use, in (0, 1]. Upstream sizes
    /// prefill for saturation (1.0): at the predicted mean load every engine is busy all the
    /// time, so any burst queues and TTFT grows without bound. Below 1 leaves headroom.
    #[serde(default = "full_utilization")]
    pub prefill_utilization: f64,
}

fn full_utilization() -> f64 {
    1.0
}

impl SlaTargets {
    /// Latency targets with upstream's prefill sizing (full utilisation).
    pub const fn new(ttft_ms: f64, itl_ms: f64) -> Self {
        Self {
            ttft_ms,
            itl_ms,
            prefill_utilization: 1.0,
        }
    }
}

/// One pool's replica bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolLimits {
    /// Fewest replicas (upstream `min_endpoint`).
    pub min: u32,
    /// Most replicas; `None` for no limit.
    pub max: Option<u32>,
}

impl PoolLimits {
    /// Bounds of `min` to `max` replicas.
    pub const fn new(min: u32, max: Option<u32>) -> Self {
        Self { min, max }
    }
}

/// Bounds of the ratio of prefill to decode replicas (prefill replicas per decode replica).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct RatioLimits {
    /// Fewest prefill replicas per decode replica.
    pub min: Option<f64>,
    /// Most prefill replicas per decode replica.
    pub max: Option<f64>,
}

/// Replica bounds and the GPU budget.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// The prefill pool's bounds (an aggregated graph's one pool takes the decode pool's).
    pub prefill: PoolLimits,
    /// The decode pool's bounds.
    pub decode: PoolLimits,
    /// Most GPUs for both pools together; `None` for no budget (upstream `-1`).
    pub max_gpu_budget: Option<u32>,
    /// GPUs one prefill replica uses.
    pub prefill_gpus_per_engine: u32,
    /// GPUs one decode replica uses.
    pub decode_gpus_per_engine: u32,
    /// Bounds of the prefill to decode ratio, applied last ([`Limits::fit_ratio`]).
    #[serde(default)]
    pub ratio: Option<RatioLimits>,
}

/// Replicas after the bounds and the GPU budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Bounded {
    /// After the minimum and the maximum, before the GPU budget.
    pub unbudgeted: (u32, u32),
    /// After the budget too: the replicas to run.
    pub replicas: (u32, u32),
    /// Bounds and budget that changed the result, in the order applied.
    pub limits: Vec<Limit>,
}

impl Limits {
    /// One pool's bounds.
    pub const fn pool(&self, pool: Pool) -> PoolLimits {
        match pool {
            Pool::Prefill => self.prefill,
            Pool::Decode => self.decode,
        }
    }

    /// The fewest replicas of (prefill, decode).
    pub const fn min_replicas(&self) -> (u32, u32) {
        (self.prefill.min, self.decode.min)
    }

    /// The replicas to run for what the load needs (prefill, decode): each pool raised to its
    /// minimum and cut to its maximum, then both scaled to the GPU budget
    /// ([`apply_gpu_budget`]). Every planning model bounds its replicas here.
    pub fn apply(&self, needed: (u32, u32)) -> Bounded {
        let mut limits = Vec::new();
        let mut bound = |pool: Pool, needed: u32| {
            let PoolLimits { min, max } = self.pool(pool);
            let mut replicas = needed;
            if replicas < min {
                limits.push(Limit::MinReplicas { pool, needed, min });
                replicas = min;
            }
            if let Some(max) = max.filter(|&max| replicas > max) {
                limits.push(Limit::MaxReplicas {
                    pool,
                    needed: replicas,
                    max,
                });
                replicas = max;
            }
            replicas
        };
        let unbudgeted = (bound(Pool::Prefill, needed.0), bound(Pool::Decode, needed.1));
        let (prefill, decode, budget) = apply_gpu_budget(unbudgeted.0, unbudgeted.1, self);
        limits.extend(budget);
        let (replicas, ratio) = self.fit_ratio((prefill, decode));
        limits.extend(ratio);
        Bounded {
            unbudgeted,
            replicas,
            limits,
        }
    }

    /// `replicas` (prefill, decode) brought within the prefill to decode ratio: the pool the
    /// ratio wants more of is raised, within its maximum and the GPU budget; when those forbid
    /// it, the other pool is cut to the bound that fits, never below its minimum; when neither
    /// can, the replicas are kept and the limit says the ratio is not met. Zero replicas (a
    /// budget below the minimums) are left alone.
    pub fn fit_ratio(&self, replicas: (u32, u32)) -> ((u32, u32), Option<Limit>) {
        let (p, d) = replicas;
        let Some(ratio) = self.ratio.filter(|_| p > 0 && d > 0) else {
            return (replicas, None);
        };
        let (low, high) = (ratio.min.unwrap_or(0.0), ratio.max.unwrap_or(f64::INFINITY));
        // Whole replicas a ratio asks for, with room for rounding error.
        let at_least = |x: f64| (x - 1e-9).ceil().clamp(0.0, f64::from(u32::MAX)) as u32;
        let at_most = |x: f64| (x + 1e-9).floor().clamp(0.0, f64::from(u32::MAX)) as u32;
        let meets = |(p, d): (u32, u32)| {
            let r = f64::from(p) / f64::from(d);
            r >= low - 1e-9 && r <= high + 1e-9
        };
        if meets(replicas) {
            return (replicas, None);
        }
        let fits = |(p, d): (u32, u32)| {
            let within = |n: u32, pool: PoolLimits| n >= pool.min && pool.max.is_none_or(|max| n <= max);
            let gpus = u64::from(p) * u64::from(self.prefill_gpus_per_engine.max(1))
                + u64::from(d) * u64::from(self.decode_gpus_per_engine.max(1));
            within(p, self.prefill)
                && within(d, self.decode)
                && self.max_gpu_budget.is_none_or(|b| gpus <= u64::from(b))
        };
        let bound = if f64::from(p) / f64::from(d) > high {
            high
        } else {
            low
        };
        let limit = |to: (u32, u32), met: bool| Limit::Ratio {
            from: replicas,
            to,
            bound,
            met,
        };
        // Towards scale-up first: as few more decode replicas as the ratio needs (none, when
        // more prefill replicas do), prefill raised to the ratio's floor for them. Searched up
        // to the decode pool's maximum (a planner without one: 1,024).
        let decode_cap = self.decode.max.unwrap_or(1024).max(d);
        let up = (d..=decode_cap)
            .map(|d| (p.max(at_least(f64::from(d) * low)), d))
            .find(|&candidate| meets(candidate) && fits(candidate));
        // Else the bound that fits: as few fewer decode replicas as it takes, prefill cut to the
        // ratio's ceiling for them.
        let down = || {
            (self.decode.min.max(1)..=d)
                .rev()
                .map(|d| (p.min(at_most(f64::from(d) * high)), d))
                .find(|&candidate| candidate.0 > 0 && meets(candidate) && fits(candidate))
        };
        match up.or_else(down) {
            Some(to) => (to, Some(limit(to, true))),
            None => (replicas, Some(limit(replicas, false))),
        }
    }
}

impl Limits {
    /// [`Self::apply`] for one aggregated pool (its engines' GPUs are the decode engine's):
    /// raised to the minimum, cut to the maximum, then to the budget
    /// ([`apply_single_pool_budget`]); reported as both pools, with the same replicas.
    pub fn apply_aggregated(&self, needed: u32) -> Bounded {
        let mut limits = Vec::new();
        let PoolLimits { min, max } = self.decode;
        let mut replicas = needed;
        if replicas < min {
            limits.push(Limit::MinReplicas {
                pool: Pool::Decode,
                needed,
                min,
            });
            replicas = min;
        }
        if let Some(max) = max.filter(|&max| replicas > max) {
            limits.push(Limit::MaxReplicas {
                pool: Pool::Decode,
                needed: replicas,
                max,
            });
            replicas = max;
        }
        let unbudgeted = replicas;
        let gpus = self.decode_gpus_per_engine.max(1);
        let budgeted = apply_single_pool_budget(replicas, gpus, min, self.max_gpu_budget);
        if let Some(budget) = self.max_gpu_budget.filter(|_| budgeted != replicas) {
            let needed_gpus = u64::from(replicas) * u64::from(gpus);
            limits.push(if budgeted == 0 {
                Limit::BudgetBelowMinimum {
                    budget,
                    minimum_gpus: u64::from(min) * u64::from(gpus),
                }
            } else {
                Limit::GpuBudget { needed_gpus, budget }
            });
        }
        Bounded {
            unbudgeted: (unbudgeted, unbudgeted),
            replicas: (budgeted, budgeted),
            limits,
        }
    }
}

/// Correction factors (observed / profiled latency); 1.0 means the profile matches.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Corrections {
    /// Prefill: observed TTFT / profiled TTFT at the observed ISL.
    pub prefill: f64,
    /// Decode: observed ITL / profiled ITL at the observed concurrency and context.
    pub decode: f64,
}

impl Default for Corrections {
    fn default() -> Self {
        Self {
            prefill: 1.0,
            decode: 1.0,
        }
    }
}

/// Prefill correction `observed TTFT / profiled TTFT(observed ISL)`, or `None` when it is not a
/// finite number (upstream skips the interval on the resulting exception; the caller keeps the
/// previous factor).
pub fn prefill_correction(model: &impl PerformanceCurves, observed: &Observation) -> Option<f64> {
    let expected = model.prefill_ttft_ms(observed.isl);
    let factor = observed.ttft_ms / expected;
    factor.is_finite().then_some(factor)
}

/// Decode correction `observed ITL / profiled ITL(concurrency, context)`, with the concurrency
/// from Little's law. `None` when there are no decode workers (upstream leaves the factor
/// unchanged) or the ratio is not a finite number.
pub fn decode_correction(
    model: &impl PerformanceCurves,
    observed: &Observation,
    num_decode_workers: u32,
    interval_s: f64,
) -> Option<f64> {
    if num_decode_workers == 0 {
        return None;
    }
    let concurrency =
        observed.num_req / f64::from(num_decode_workers) * observed.request_duration_s / interval_s;
    let context_length = observed.isl + observed.osl / 2.0;
    let expected = model.decode_itl_ms(concurrency, context_length);
    let factor = observed.itl_ms / expected;
    factor.is_finite().then_some(factor)
}

/// Which pool a limit applied to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pool {
    /// The prefill workers.
    Prefill,
    /// The decode workers.
    Decode,
}

impl std::fmt::Display for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        })
    }
}

/// A bound or budget that changed what the load alone asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Limit {
    /// The pool needed fewer replicas than the minimum.
    MinReplicas {
        /// Pool.
        pool: Pool,
        /// Replicas the load needed.
        needed: u32,
        /// The minimum applied.
        min: u32,
    },
    /// The pool needed more replicas than the maximum.
    MaxReplicas {
        /// Pool.
        pool: Pool,
        /// Replicas the load needed.
        needed: u32,
        /// The maximum applied.
        max: u32,
    },
    /// Both pools needed more GPUs than the budget; they were scaled down proportionally.
    GpuBudget {
        /// GPUs needed.
        needed_gpus: u64,
        /// The budget.
        budget: u32,
    },
    /// The budget cannot fit the minimum of both pools, so upstream enforces zero replicas.
    BudgetBelowMinimum {
        /// The budget.
        budget: u32,
        /// GPUs the minimum replicas of both pools need.
        minimum_gpus: u64,
    },
    /// The prefill to decode ratio moved a pool (`met`), or could not be met within the bounds
    /// and the budget.
    Ratio {
        /// Replicas (prefill, decode) before.
        from: (u32, u32),
        /// After.
        to: (u32, u32),
        /// The ratio bound (prefill per decode replica) that applied.
        bound: f64,
        /// Whether the replicas now meet it.
        met: bool,
    },
    /// At a long scale-up delay, the pool grows at most to a multiple of its engines serving
    /// while the replicas asked for start (the queueing model's `scale_up` settings).
    ScaleUpRate {
        /// Pool.
        pool: Pool,
        /// Replicas the load needed.
        needed: u32,
        /// Replicas allowed.
        allowed: u32,
        /// Engines serving.
        serving: f64,
    },
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MinReplicas { pool, needed, min } => {
                write!(f, "{pool} raised from {needed} to the minimum of {min}")
            }
            Self::MaxReplicas { pool, needed, max } => {
                write!(
                    f,
                    "{pool} needed {needed} replicas, capped at the maximum of {max}"
                )
            }
            Self::GpuBudget { needed_gpus, budget } => {
                write!(
                    f,
                    "the load needed {needed_gpus} GPUs, scaled down to the budget of {budget}"
                )
            }
            Self::BudgetBelowMinimum { budget, minimum_gpus } => write!(
                f,
                "the GPU budget of {budget} is below the {minimum_gpus} GPUs the minimum replicas need: zero replicas"
            ),
            Self::Ratio {
                from,
                to,
                bound,
                met: true,
            } => write!(
                f,
                "{} prefill / {} decode moved to {} / {} for the prefill to decode ratio bound of {bound}",
                from.0, from.1, to.0, to.1
            ),
            Self::Ratio { from, bound, .. } => write!(
                f,
                "{} prefill / {} decode miss the prefill to decode ratio bound of {bound}: the bounds and the GPU budget allow no replicas that meet it",
                from.0, from.1
            ),
            Self::ScaleUpRate {
                pool,
                needed,
                allowed,
                serving,
            } => write!(
                f,
                "{pool} needed {needed} replicas, held at {allowed} while {serving:.1} serve (a long scale-up delay)"
            ),
        }
    }
}

/// Replicas for one interval and how they were reached.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaPlan {
    /// Profiled prefill throughput per GPU at the predicted ISL.
    pub prefill_thpt_per_gpu: f64,
    /// Decode operating point for the corrected ITL target.
    pub decode_point: DecodeOperatingPoint,
    /// Prefill tokens/s the predicted load needs (after the prefill correction).
    pub prefill_load_tokens_per_s: f64,
    /// Decode tokens/s the predicted load needs.
    pub decode_load_tokens_per_s: f64,
    /// Prefill replicas before the GPU budget (after min and max).
    pub prefill_unbudgeted: u32,
    /// Decode replicas before the GPU budget (after min and max).
    pub decode_unbudgeted: u32,
    /// Prefill replicas.
    pub prefill: u32,
    /// Decode replicas.
    pub decode: u32,
    /// Bounds and budget that changed the result, in the order applied.
    pub limits: Vec<Limit>,
}

/// `ceil` of a replica count, saturating; a NaN or negative need is no need.
fn replicas_for(need: f64) -> u32 {
    if need.is_nan() || need <= 0.0 {
        0
    } else {
        need.ceil().min(f64::from(u32::MAX)) as u32
    }
}

/// Replicas for the predicted load (upstream's `_compute_replica_requirements`), then min/max bounds and the GPU budget.
///
/// The prefill correction is used as `min(1, factor)`: queueing (factor above 1) must not
/// inflate the load, while prefix-cache hits (below 1) shrink it. The decode correction divides
/// the ITL target. Unlike upstream, `max_replicas` is supported; it applies before the budget.
pub fn plan_replicas(
    model: &impl PerformanceCurves,
    load: &Load,
    sla: &SlaTargets,
    corrections: &Corrections,
    limits: &Limits,
    interval_s: f64,
) -> ReplicaPlan {
    let prefill_thpt_per_gpu = model.prefill_thpt_per_gpu(load.isl);
    let prefill_load = load.num_req * load.isl / interval_s * corrections.prefill.min(1.0);
    // Out-of-range utilisation (not admitted by the API) falls back to upstream's sizing.
    let utilization = if sla.prefill_utilization > 0.0 && sla.prefill_utilization <= 1.0 {
        sla.prefill_utilization
    } else {
        1.0
    };
    let prefill_needed = if prefill_thpt_per_gpu > 0.0 {
        replicas_for(
            prefill_load
                / (prefill_thpt_per_gpu * utilization)
                / f64::from(limits.prefill_gpus_per_engine.max(1)),
        )
    } else {
        0
    };

    let itl_target = if corrections.decode > 0.0 {
        sla.itl_ms / corrections.decode
    } else {
        sla.itl_ms
    };
    let decode_point = model.decode_best_point(itl_target, load.isl + load.osl / 2.0);
    let decode_load = load.num_req * load.osl / interval_s;
    let decode_needed = if decode_point.thpt_per_gpu > 0.0 {
        replicas_for(
            decode_load / decode_point.thpt_per_gpu / f64::from(limits.decode_gpus_per_engine.max(1)),
        )
    } else {
        0
    };

    let bounded = limits.apply((prefill_needed, decode_needed));

    ReplicaPlan {
        prefill_thpt_per_gpu,
        decode_point,
        prefill_load_tokens_per_s: prefill_load,
        decode_load_tokens_per_s: decode_load,
        prefill_unbudgeted: bounded.unbudgeted.0,
        decode_unbudgeted: bounded.unbudgeted.1,
        prefill: bounded.replicas.0,
        decode: bounded.replicas.1,
        limits: bounded.limits,
    }
}

/// The disaggregated GPU budget (upstream's `_apply_global_gpu_budget`): scale both pools by `budget / total`
/// (floor), keep the prefill share within what leaves the decode minimum room, give decode the
/// rest, but no more than decode asked for; zero replicas when the budget cannot fit both
/// minimums.
pub fn apply_gpu_budget(prefill: u32, decode: u32, limits: &Limits) -> (u32, u32, Option<Limit>) {
    let Some(budget) = limits.max_gpu_budget else {
        return (prefill, decode, None);
    };
    let (p_gpus, d_gpus) = (
        u64::from(limits.prefill_gpus_per_engine.max(1)),
        u64::from(limits.decode_gpus_per_engine.max(1)),
    );
    let total = u64::from(prefill) * p_gpus + u64::from(decode) * d_gpus;
    let budget_gpus = u64::from(budget);
    if total <= budget_gpus {
        return (prefill, decode, None);
    }
    let (p_min, d_min) = (u64::from(limits.prefill.min), u64::from(limits.decode.min));
    let minimum_gpus = p_min * p_gpus + d_min * d_gpus;
    if budget_gpus < minimum_gpus {
        return (0, 0, Some(Limit::BudgetBelowMinimum { budget, minimum_gpus }));
    }
    let scale = f64::from(budget) / total as f64;
    let max_prefill = (budget_gpus - d_min * d_gpus) / p_gpus;
    let scaled_prefill = (f64::from(prefill) * scale).floor() as u64;
    let new_prefill = p_min.max(max_prefill.min(scaled_prefill));
    // Upstream gives decode all the GPUs prefill leaves, which can exceed what decode needs
    // (by up to one prefill engine's worth); never give a pool more than it asked for.
    let new_decode = d_min
        .max((budget_gpus - new_prefill * p_gpus) / d_gpus)
        .min(u64::from(decode).max(d_min));
    (
        u32::try_from(new_prefill).unwrap_or(u32::MAX),
        u32::try_from(new_decode).unwrap_or(u32::MAX),
        Some(Limit::GpuBudget {
            needed_gpus: total,
            budget,
        }),
    )
}

/// The budget of a single pool (prefill-only, decode-only or aggregated deployments):
/// `max(min, floor(budget / gpus))` when over budget, zero when the minimum does not fit.
pub fn apply_single_pool_budget(
    replicas: u32,
    gpus_per_engine: u32,
    min_replicas: u32,
    budget: Option<u32>,
) -> u32 {
    let Some(budget) = budget else { return replicas };
    let gpus = u64::from(gpus_per_engine.max(1));
    if u64::from(replicas) * gpus <= u64::from(budget) {
        return replicas;
    }
    if u64::from(budget) < u64::from(min_replicas) * gpus {
        return 0;
    }
    min_replicas.max(u32::try_from(u64::from(budget) / gpus).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Fixed curves, as upstream's `test_replica_calculation.py` mocks the interpolators.
    struct FixedCurves {
        prefill_thpt: f64,
        decode_thpt: f64,
    }

    impl PerformanceCurves for FixedCurves {
        fn prefill_ttft_ms(&self, _: f64) -> f64 {
            80.0
        }
        fn prefill_thpt_per_gpu(&self, _: f64) -> f64 {
            self.prefill_thpt
        }
        fn decode_itl_ms(&self, _: f64, _: f64) -> f64 {
            10.0
        }
        fn decode_best_point(&self, itl_ms: f64, _: f64) -> DecodeOperatingPoint {
            DecodeOperatingPoint {
                thpt_per_gpu: self.decode_thpt,
                itl_ms: itl_ms.min(0.01),
                kv_usage: 0.5,
            }
        }
    }

    const UPSTREAM_SLA: SlaTargets = SlaTargets {
        prefill_utilization: 1.0,
        ttft_ms: 80.0,
        itl_ms: 10.0,
    };

    fn upstream_plan(
        num_req: f64,
        curves: &FixedCurves,
        corrections: Corrections,
        limits: &Limits,
    ) -> (u32, u32) {
        let load = Load {
            num_req,
            isl: 3000.0,
            osl: 150.0,
        };
        let plan = plan_replicas(curves, &load, &UPSTREAM_SLA, &corrections, limits, 60.0);
        (plan.prefill, plan.decode)
    }

    fn upstream_curves() -> FixedCurves {
        FixedCurves {
            prefill_thpt: 40000.0,
            decode_thpt: 10000.0,
        }
    }

    #[test]
    fn upstream_scenario_formulas_and_load_levels() {
        let limits = limits(1, Some(10), 1, 1);
        assert_eq!(
            upstream_plan(10.0, &upstream_curves(), Corrections::default(), &limits),
            (1, 1)
        );
        let slow_decode = FixedCurves {
            prefill_thpt: 40000.0,
            decode_thpt: 1000.0,
        };
        assert_eq!(
            upstream_plan(500.0, &slow_decode, Corrections::default(), &limits),
            (1, 2)
        );
    }

    #[test]
    fn upstream_scenario_budget_and_minimum() {
        let (p, d) = upstream_plan(
            50.0,
            &FixedCurves {
                prefill_thpt: 1000.0,
                decode_thpt: 100.0,
            },
            Corrections::default(),
            &limits(1, Some(3), 1, 1),
        );
        assert!(p + d <= 3 && p >= 1 && d >= 1, "{p}/{d}");
        assert_eq!(
            upstream_plan(
                0.001,
                &upstream_curves(),
                Corrections::default(),
                &limits(1, Some(10), 1, 1)
            ),
            (1, 1)
        );
    }

    #[test]
    fn upstream_scenario_prefill_correction_is_clamped_to_one() {
        let curves = FixedCurves {
            prefill_thpt: 1000.0,
            decode_thpt: 10000.0,
        };
        let limits = limits(1, None, 1, 1);
        let clamped = upstream_plan(
            100.0,
            &curves,
            Corrections {
                prefill: 2.5,
                decode: 1.0,
            },
            &limits,
        );
        assert_eq!(
            clamped,
            upstream_plan(100.0, &curves, Corrections::default(), &limits)
        );
        // A factor below one shrinks the load: 100*3000/60 = 5000 tok/s needs 5 replicas, 2.5 at 0.5.
        assert_eq!(clamped.0, 5);
        assert_eq!(
            upstream_plan(
                100.0,
                &curves,
                Corrections {
                    prefill: 0.5,
                    decode: 1.0
                },
                &limits
            )
            .0,
            3
        );
    }

    #[test]
    fn upstream_scenario_non_positive_decode_correction_uses_the_raw_target() {
        let curves = upstream_curves();
        let load = Load {
            num_req: 10.0,
            isl: 3000.0,
            osl: 150.0,
        };
        for factor in [0.0, -1.0] {
            let plan = plan_replicas(
                &curves,
                &load,
                &UPSTREAM_SLA,
                &Corrections {
                    prefill: 1.0,
                    decode: factor,
                },
                &limits(1, None, 1, 1),
                60.0,
            );
            assert_eq!(plan.decode_point.itl_ms, 0.01);
            assert_eq!(plan.decode, 1);
        }
    }

    #[test]
    fn upstream_scenario_multi_gpu_engines() {
        assert_eq!(
            upstream_plan(
                20.0,
                &upstream_curves(),
                Corrections::default(),
                &limits(1, Some(10), 2, 4)
            ),
            (1, 1)
        );
        // 1000 tok/s of prefill on 2-GPU engines at 100 tok/s/GPU: 5 engines.
        let slow = FixedCurves {
            prefill_thpt: 100.0,
            decode_thpt: 10.0,
        };
        let plan = plan_replicas(
            &slow,
            &Load {
                num_req: 20.0,
                isl: 3000.0,
                osl: 150.0,
            },
            &UPSTREAM_SLA,
            &Corrections::default(),
            &limits(1, None, 2, 4),
            60.0,
        );
        assert_eq!((plan.prefill, plan.decode), (5, 2));
    }

    #[test]
    fn prefill_utilization_leaves_headroom_and_bad_values_fall_back() {
        // 1000 tok/s of prefill on 2-GPU engines at 100 tok/s/GPU: 5 engines at saturation,
        // 1000 / (200 x 0.5) = 10 at half utilisation, ceil(1000 / 140) = 8 at 0.7. Decode is
        // not affected.
        let slow = FixedCurves {
            prefill_thpt: 100.0,
            decode_thpt: 10.0,
        };
        let load = Load {
            num_req: 20.0,
            isl: 3000.0,
            osl: 150.0,
        };
        let plan_at = |utilization: f64| {
            let sla = SlaTargets {
                prefill_utilization: utilization,
                ..UPSTREAM_SLA
            };
            let plan = plan_replicas(
                &slow,
                &load,
                &sla,
                &Corrections::default(),
                &limits(1, None, 2, 4),
                60.0,
            );
            (plan.prefill, plan.decode)
        };
        assert_eq!(plan_at(1.0), (5, 2));
        assert_eq!(plan_at(0.5), (10, 2));
        assert_eq!(plan_at(0.7), (8, 2));
        for bad in [0.0, -1.0, 1.5, f64::NAN] {
            assert_eq!(plan_at(bad), (5, 2), "utilisation {bad}");
        }
    }

    #[test]
    fn upstream_scenario_complex_budget() {
        let curves = FixedCurves {
            prefill_thpt: 10000.0,
            decode_thpt: 1000.0,
        };
        let (p, d) = upstream_plan(100.0, &curves, Corrections::default(), &limits(1, Some(5), 2, 2));
        assert!(2 * p + 2 * d <= 5, "{p}/{d}");
        assert!(p >= 1 && d >= 1, "{p}/{d}");
    }

    #[test]
    fn max_replicas_caps_before_the_budget() {
        let curves = FixedCurves {
            prefill_thpt: 100.0,
            decode_thpt: 100.0,
        };
        let mut bounded = limits(1, None, 1, 1);
        bounded.prefill.max = Some(3);
        bounded.decode.max = Some(3);
        let plan = plan_replicas(
            &curves,
            &Load {
                num_req: 100.0,
                isl: 3000.0,
                osl: 150.0,
            },
            &UPSTREAM_SLA,
            &Corrections::default(),
            &bounded,
            60.0,
        );
        assert_eq!((plan.prefill, plan.decode), (3, 3));
        assert!(matches!(
            plan.limits[0],
            Limit::MaxReplicas {
                pool: Pool::Prefill,
                max: 3,
                ..
            }
        ));
    }

    fn h200() -> &'static crate::interpolation::PerformanceModel {
        static MODEL: std::sync::OnceLock<crate::interpolation::PerformanceModel> =
            std::sync::OnceLock::new();
        MODEL.get_or_init(|| {
            let profile = crate::profile::Profile::builtin("h200-llama3.1-8b-tp1").unwrap();
            crate::interpolation::PerformanceModel::new(&profile).unwrap()
        })
    }

    proptest! {
        #[test]
        fn replicas_are_monotone_in_load(
            num_req in 0.0f64..50_000.0,
            extra in 0.0f64..50_000.0,
            isl in 100.0f64..16_000.0,
            osl in 10.0f64..2_000.0,
            itl in 5.0f64..100.0,
        ) {
            let limits = limits(1, None, 1, 1);
            let sla = SlaTargets::new(500.0, itl);
            let low = plan_replicas(h200(), &Load { num_req, isl, osl }, &sla, &Corrections::default(), &limits, 180.0);
            let high = plan_replicas(h200(), &Load { num_req: num_req + extra, isl, osl }, &sla, &Corrections::default(), &limits, 180.0);
            prop_assert!(high.prefill >= low.prefill && high.decode >= low.decode);
        }

        #[test]
        fn replicas_respect_minimum_maximum_and_budget(
            num_req in 0.0f64..100_000.0,
            isl in 1.0f64..20_000.0,
            osl in 1.0f64..4_000.0,
            min in (1u32..4, 1u32..4),
            max in (4u32..64, 4u32..64),
            budget in proptest::option::of(1u32..128),
            p_gpus in 1u32..8,
            d_gpus in 1u32..8,
            p_corr in 0.0f64..3.0,
            d_corr in -1.0f64..3.0,
            ratio in proptest::option::of((proptest::option::of(0.1f64..2.0), proptest::option::of(0.0f64..4.0))),
        ) {
            // A maximum of the ratio at least its minimum, as the webhook requires.
            let ratio = ratio.map(|(min, spread)| RatioLimits { min, max: spread.map(|s| min.unwrap_or(0.1) + s) });
            // Each pool has bounds of its own.
            let limits = Limits { prefill: PoolLimits::new(min.0, Some(max.0)), decode: PoolLimits::new(min.1, Some(max.1)), max_gpu_budget: budget, prefill_gpus_per_engine: p_gpus, decode_gpus_per_engine: d_gpus, ratio };
            let plan = plan_replicas(h200(), &Load { num_req, isl, osl }, &SlaTargets::new(500.0, 20.0), &Corrections { prefill: p_corr, decode: d_corr }, &limits, 60.0);
            let gpus = u64::from(plan.prefill * p_gpus + plan.decode * d_gpus);
            let at_least_min = plan.prefill >= min.0 && plan.decode >= min.1;
            match budget {
                Some(b) if u64::from(b) < u64::from(min.0 * p_gpus + min.1 * d_gpus) => prop_assert_eq!((plan.prefill, plan.decode), (0, 0)),
                Some(b) => {
                    prop_assert!(gpus <= u64::from(b), "{} GPUs over the budget of {}", gpus, b);
                    prop_assert!(at_least_min);
                }
                None => prop_assert!(at_least_min),
            }
            prop_assert!(plan.prefill <= max.0 && plan.decode <= max.1);
            // The ratio is met, unless the limits say it could not be.
            if let Some(ratio) = ratio.filter(|_| plan.prefill > 0 && plan.decode > 0) {
                let now = f64::from(plan.prefill) / f64::from(plan.decode);
                let met = ratio.min.is_none_or(|m| now >= m - 1e-9) && ratio.max.is_none_or(|m| now <= m + 1e-9);
                let unmet = plan.limits.iter().any(|l| matches!(l, Limit::Ratio { met: false, .. }));
                prop_assert!(met || unmet, "{} / {} misses {:?}: {:?}", plan.prefill, plan.decode, ratio, plan.limits);
            }
        }
    }

    fn limits(min: u32, budget: Option<u32>, p_gpus: u32, d_gpus: u32) -> Limits {
        Limits {
            prefill: PoolLimits::new(min, None),
            decode: PoolLimits::new(min, None),
            max_gpu_budget: budget,
            prefill_gpus_per_engine: p_gpus,
            decode_gpus_per_engine: d_gpus,
            ratio: None,
        }
    }

    #[test]
    fn the_ratio_raises_the_pool_it_wants_more_of_or_cuts_the_other_within_the_budget() {
        let ratio = |min: Option<f64>, max: Option<f64>, budget: Option<u32>| Limits {
            ratio: Some(RatioLimits { min, max }),
            ..limits(1, budget, 1, 1)
        };
        // At most 3 prefill per decode: decode raised, towards scale-up.
        let (to, limit) = ratio(None, Some(3.0), None).fit_ratio((9, 1));
        assert_eq!(to, (9, 3));
        assert!(matches!(limit, Some(Limit::Ratio { met: true, .. })), "{limit:?}");
        // The budget forbids it: prefill cut to the bound that fits.
        assert_eq!(ratio(None, Some(3.0), Some(10)).fit_ratio((9, 1)).0, (3, 1));
        // At least one prefill per two decode.
        assert_eq!(ratio(Some(0.5), None, None).fit_ratio((1, 4)).0, (2, 4));
        assert_eq!(ratio(Some(0.5), None, Some(5)).fit_ratio((1, 4)).0, (1, 2));
        // Within the bounds: nothing moves, nothing is said.
        assert_eq!(
            ratio(Some(0.5), Some(3.0), None).fit_ratio((3, 2)),
            ((3, 2), None)
        );
        // Neither way fits (prefill's minimum 5, decode's maximum 1): kept, and said.
        let stuck = Limits {
            prefill: PoolLimits::new(5, None),
            decode: PoolLimits::new(1, Some(1)),
            ..ratio(None, Some(3.0), None)
        };
        let (to, limit) = stuck.fit_ratio((5, 1));
        assert_eq!(to, (5, 1));
        assert!(
            matches!(limit, Some(Limit::Ratio { met: false, .. })),
            "{limit:?}"
        );
        assert!(
            limit
                .unwrap()
                .to_string()
                .contains("allow no replicas that meet it")
        );
        // Zero replicas (a budget below the minimums) are left alone.
        assert_eq!(ratio(None, Some(3.0), None).fit_ratio((0, 0)), ((0, 0), None));
        // Applied last by every planner's bounds.
        assert_eq!(ratio(None, Some(2.0), None).apply((6, 1)).replicas, (6, 3));
    }

    #[test]
    fn budget_examples_from_upstream() {
        let (p, d, _) = apply_gpu_budget(6, 6, &limits(1, Some(8), 1, 1));
        assert_eq!((p, d), (4, 4));
        let (p, d, limit) = apply_gpu_budget(3, 5, &limits(1, Some(8), 2, 2));
        assert_eq!((p, d), (1, 3));
        assert_eq!(
            limit,
            Some(Limit::GpuBudget {
                needed_gpus: 16,
                budget: 8
            })
        );
    }

    #[test]
    fn budget_never_gives_decode_more_than_it_needs() {
        // Upstream would give decode floor((9 - 3*2) / 1) = 3 replicas; it asked for 2.
        let (p, d, _) = apply_gpu_budget(4, 2, &limits(1, Some(9), 2, 1));
        assert_eq!((p, d), (3, 2));
    }

    #[test]
    fn budget_below_minimum_enforces_zero() {
        let (p, d, limit) = apply_gpu_budget(2, 2, &limits(2, Some(3), 1, 1));
        assert_eq!((p, d), (0, 0));
        assert_eq!(
            limit,
            Some(Limit::BudgetBelowMinimum {
                budget: 3,
                minimum_gpus: 4
            })
        );
    }

    #[test]
    fn no_budget_and_within_budget_change_nothing() {
        assert_eq!(apply_gpu_budget(50, 70, &limits(1, None, 8, 8)), (50, 70, None));
        assert_eq!(apply_gpu_budget(2, 3, &limits(1, Some(5), 1, 1)), (2, 3, None));
    }

    #[test]
    fn single_pool_budget() {
        assert_eq!(apply_single_pool_budget(10, 2, 1, Some(8)), 4);
        assert_eq!(apply_single_pool_budget(3, 2, 1, Some(8)), 3);
        assert_eq!(apply_single_pool_budget(3, 4, 3, Some(8)), 0);
        assert_eq!(apply_single_pool_budget(3, 4, 1, None), 3);
    }

    #[test]
    fn replicas_for_saturates_and_ignores_nan() {
        assert_eq!(replicas_for(f64::NAN), 0);
        assert_eq!(replicas_for(-3.0), 0);
        assert_eq!(replicas_for(2.0000001), 3);
        assert_eq!(replicas_for(1e30), u32::MAX);
    }

    #[test]
    fn observation_completeness() {
        let mut observation = Observation::upstream(10.0, 3000.0, 150.0, 80.0, 10.0, 100.0);
        assert!(observation.is_complete());
        observation.ttft_ms = f64::NAN;
        assert!(!observation.is_complete());
    }
}
