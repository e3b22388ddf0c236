//! Replica sizing from a demand forecast with queueing: the fewest prefill engines for which
//! the predicted TTFT, queueing included, meets its target, and the fewest decode engines whose
//! KV cache holds the predicted concurrency and whose ITL meets its target. Pure functions.
//!
//! # Prefill
//!
//! Each prefill engine serves one request at a time from a shared FIFO queue; a request of
//! `isl` tokens takes the profiled `prefill_ttft(isl)` (proportionally longer past the longest
//! profiled prompt). With `c` engines, arrival rate `λ`, service time `S` (mean and SCV `cs²`
//! from the prompt-length mix, see [`prefill_service`]) and arrival burstiness `b`:
//!
//! ```text
//! TTFT(c) = o + E[S] + Wq(c) + B(c)
//! Wq(c)   = C(c, a) / (cμ − λ) · (b + cs²) / 2            (Allen–Cunneen, a = λ E[S])
//! B(c)    = (b − 1) / 2 · E[S] / c                        (batch arrivals, M^X/G/c)
//! ```
//!
//! `o` is the first-token overhead: the time from the end of a prompt's prefill to its first
//! token at the client (in a disaggregated graph the KV transfer and the decode engine's first
//! step). It does not depend on the prefill engines or their load, so more prefill engines
//! cannot buy it back; read as burstiness it would (`B` at low load is a constant too). The
//! planner learns it from calm intervals ([`implied_overhead`]).
//!
//! Real arrivals come in bursts (many requests within a second: chat front-ends, retries,
//! bucketed timestamps, fan-out); with batches of mean size-bias `b = E[X²] / E[X]` a request
//! also waits behind the rest of its batch, which takes `(b − 1) / 2 · E[S] / c` to clear and
//! shrinks as `1 / c` rather than with the Erlang C probability. `b` is learned from observed
//! TTFT by the planner ([`implied_burstiness`]); 1 gives plain M/G/c. For a percentile target
//! `p`, `Wq` is its `p`-quantile (`C · exp(−(cμ − λ) t / k) = 1 − p`, `k = (b + cs²) / 2`) and
//! `B` is scaled by `ln(1 / (1 − p))` (the batch wait taken as exponential). A backlog of `Q`
//! requests to be cleared within `D` seconds adds `Q / D` to the arrival rate.
//!
//! # Decode
//!
//! A decode engine holds every running request's KV cache (prompt plus tokens generated so
//! far) and emits a token per request every `ITL(concurrency, context)`. By Little's law the
//! pool holds `N = λ · (E[osl] − 1) · ITL` requests; a request of the running population holds
//! on average `E_w[k] = E[isl] + E[osl²] / (2 E[osl])` tokens (weighted by its decode time).
//! The number running is Poisson, so the tokens held have mean `N E_w[k]` and variance
//! `N E_w[k²]`; the pool needs `N E_w[k] + z √(N E_w[k²])` tokens of KV cache (requests that do
//! not fit wait for admission, which delays their first token), and
//! `ITL(N / d, E_w[k]) <= target` (with `N + z √N` for a percentile target).

use serde::{Deserialize, Serialize};

use super::{
    erlang::{Queue, erlang_c, erlang_c_from_b},
    interpolation::PerformanceCurves,
};

/// Mean and second moment of a length distribution (tokens).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LengthMoments {
    /// `E[x]`.
    pub mean: f64,
    /// `E[x²]`.
    pub second: f64,
}

/// Standard normal Gauss–Hermite nodes and weights (12 points).
const GH_NODES: [f64; 12] = [
    -5.500_901_704_467_748,
    -4.271_825_847_932_281,
    -3.223_709_828_770_097,
    -2.259_464_451_000_799,
    -1.340_375_197_151_617,
    -0.444_403_001_944_139,
    0.444_403_001_944_139,
    1.340_375_197_151_617,
    2.259_464_451_000_799,
    3.223_709_828_770_097,
    4.271_825_847_932_281,
    5.500_901_704_467_748,
];
const GH_WEIGHTS: [f64; 12] = [
    1.499_927_167_637_16e-7,
    4.837_184_922_590_641_5e-5,
    0.002_203_380_687_533_200_5,
    0.029_116_687_912_364_117,
    0.146_967_048_045_33,
    0.321_664_361_512_83,
    0.321_664_361_512_83,
    0.146_967_048_045_33,
    0.029_116_687_912_364_117,
    0.002_203_380_687_533_200_5,
    4.837_184_922_590_641_5e-5,
    1.499_927_167_637_16e-7,
];

impl LengthMoments {
    /// Every request the same length.
    pub fn fixed(mean: f64) -> Self {
        Self {
            mean,
            second: mean * mean,
        }
    }

    /// Moments with a given squared coefficient of variation.
    pub fn with_scv(mean: f64, scv: f64) -> Self {
        Self {
            mean,
            second: mean * mean * (1.0 + scv.max(0.0)),
        }
    }

    /// Whether the mean is a finite non-negative number.
    pub fn is_valid(&self) -> bool {
        self.mean.is_finite() && self.mean >= 0.0
    }

    /// Squared coefficient of variation `E[x²] / E[x]² − 1` (0 when unknown).
    pub fn scv(&self) -> f64 {
        if self.mean > 0.0 && self.second.is_finite() {
            (self.second / (self.mean * self.mean) - 1.0).clamp(0.0, 100.0)
        } else {
            0.0
        }
    }

    /// The same shape (SCV) with another mean.
    pub fn rescaled(&self, mean: f64) -> Self {
        Self::with_scv(mean, self.scv())
    }

    /// `E[x³]` of a lognormal with these moments.
    fn third(&self) -> f64 {
        let m = self.mean.max(0.0);
        m * m * m * (1.0 + self.scv()).powi(3)
    }

    /// `E[f(x)]` and `E[f(x)²]` for a lognormal `x` with these moments (12-point Gauss–Hermite).
    pub fn expectation(&self, f: impl Fn(f64) -> f64) -> (f64, f64) {
        if self.mean.is_nan() || self.mean <= 0.0 {
            let v = f(0.0);
            return (v, v * v);
        }
        let sigma2 = (1.0 + self.scv()).ln();
        let sigma = sigma2.sqrt();
        let mu = self.mean.ln() - sigma2 / 2.0;
        let (mut m1, mut m2) = (0.0, 0.0);
        // The nodes are symmetric about zero: one exponential serves a pair.
        let center = mu.exp();
        let half = GH_NODES.len() / 2;
        for (z, w) in GH_NODES[half..].iter().zip(&GH_WEIGHTS[half..]) {
            let spread = (sigma * z).exp();
            for v in [f(center / spread), f(center * spread)] {
                m1 += w * v;
                m2 += w * v * v;
            }
        }
        (m1, m2)
    }

    /// Moments from a Prometheus histogram: upper bounds (`le`, increasing, the last may be
    /// infinite), the cumulative count at each, and the exact sum and count. Within each finite
    /// bucket, values are taken uniform over a sub-range at a common relative position, the
    /// one that reproduces the exact mean (prompt-length buckets are wide and their values
    /// crowd toward one end, so plain mid-bucket uniformity overstates the spread about
    /// threefold on chat traffic); the open last bucket holds values uniform on `[lo, 2 lo]`,
    /// or what the exact sum leaves when the finite buckets cannot account for it. `None`
    /// without observations.
    pub fn from_histogram(bounds: &[f64], cumulative: &[f64], sum: f64, count: f64) -> Option<Self> {
        if count.is_nan() || count <= 0.0 || bounds.len() != cumulative.len() || !sum.is_finite() {
            return None;
        }
        let mean = sum / count;
        // (lower, upper, count) of the finite buckets; the open bucket's (lower, count).
        let mut finite: Vec<(f64, f64, f64)> = Vec::with_capacity(bounds.len());
        let (mut lo, mut below) = (0.0_f64, 0.0_f64);
        let mut open = (0.0, 0.0);
        for (&hi, &cum) in bounds.iter().zip(cumulative) {
            let n = (cum - below).max(0.0);
            below = cum.max(below);
            if hi.is_finite() {
                if n > 0.0 {
                    finite.push((lo.min(hi), hi, n));
                }
                lo = hi;
            } else {
                open = (lo.max(0.0), open.1 + n);
            }
        }
        if count > below {
            open = (lo.max(0.0), open.1 + count - below);
        }
        // Sub-range of a bucket at relative position `f` (0: crowded at the lower bound).
        let range = |lo: f64, hi: f64, f: f64| {
            let width = hi - lo;
            if f <= 0.5 {
                (lo, lo + 2.0 * f * width)
            } else {
                (lo + (2.0 * f - 1.0) * width, hi)
            }
        };
        let finite_sum = |f: f64| {
            finite
                .iter()
                .map(|&(lo, hi, n)| {
                    let (a, b) = range(lo, hi, f);
                    n * (a + b) / 2.0
                })
                .sum::<f64>()
        };
        let (open_lo, open_n) = open;
        let open_default = 1.5 * open_lo;
        let target = sum - open_n * open_default;
        let (mut f_lo, mut f_hi) = (0.0, 1.0);
        for _ in 0..50 {
            let mid = (f_lo + f_hi) / 2.0;
            if finite_sum(mid) < target {
                f_lo = mid;
            } else {
                f_hi = mid;
            }
        }
        let f = (f_lo + f_hi) / 2.0;
        let finite_second: f64 = finite
            .iter()
            .map(|&(lo, hi, n)| {
                let (a, b) = range(lo, hi, f);
                n * (a * a + a * b + b * b) / 3.0
            })
            .sum();
        let open_second = if open_n > 0.0 {
            let open_mean = ((sum - finite_sum(f)) / open_n).max(open_lo);
            // Uniform on [lo, 2 lo] has E[x²] = 7/3 lo² = 1.037 (1.5 lo)²; keep that spread.
            open_n * open_mean * open_mean * 1.037
        } else {
            0.0
        };
        Some(Self {
            mean,
            second: ((finite_second + open_second) / count).max(mean * mean),
        })
    }
}

/// Seconds one engine needs to prefill `isl` tokens: the profiled TTFT, proportionally longer
/// past the longest profiled prompt.
pub fn prefill_service_s(curves: &impl PerformanceCurves, isl: f64) -> f64 {
    let ms = match curves.max_profiled_isl() {
        Some(max) if isl > max && max > 0.0 => curves.prefill_ttft_ms(max) * isl / max,
        _ => curves.prefill_ttft_ms(isl),
    };
    if ms.is_finite() {
        (ms / 1000.0).max(0.0)
    } else {
        0.0
    }
}

/// Prefill service-time moments.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceMoments {
    /// Mean service time (s).
    pub mean_s: f64,
    /// Squared coefficient of variation.
    pub scv: f64,
}

/// Service-time moments of the prompt mix (lognormal prompt lengths with the given moments).
pub fn prefill_service(curves: &impl PerformanceCurves, isl: &LengthMoments) -> ServiceMoments {
    let (m1, m2) = isl.expectation(|x| prefill_service_s(curves, x));
    let scv = if m1 > 0.0 {
        (m2 / (m1 * m1) - 1.0).clamp(0.0, 100.0)
    } else {
        0.0
    };
    ServiceMoments { mean_s: m1, scv }
}

/// Latency targets and how they are read.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencyTargets {
    /// TTFT target (ms).
    pub ttft_ms: f64,
    /// ITL target (ms).
    pub itl_ms: f64,
    /// Aim the TTFT target at this quantile (0..1) rather than the mean.
    pub ttft_quantile: Option<f64>,
    /// Aim the ITL target at this quantile (0..1) rather than the mean.
    pub itl_quantile: Option<f64>,
}

/// Arrival burstiness of Poisson arrivals, and the least the planner plans for or learns: an
/// interval whose TTFT is shorter than Poisson arrivals explain says the model overstates the
/// wait, not that arrivals are smoother.
pub const MIN_BURSTINESS: f64 = 1.0;

/// Largest arrival burstiness the planner learns from an interval.
pub const MAX_BURSTINESS: f64 = 1000.0;

/// What limited a pool's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Bound {
    /// The minimum replicas.
    Minimum,
    /// The TTFT target (prefill).
    Ttft,
    /// The ITL target (decode).
    Itl,
    /// KV-cache capacity (decode).
    KvCache,
    /// The maximum replicas (the target is not reached).
    Maximum,
}

/// The prefill pool's size and what it is expected to achieve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefillSizing {
    /// Engines.
    pub replicas: u32,
    /// Predicted TTFT (ms) at the target's statistic (mean or quantile).
    pub ttft_ms: f64,
    /// Mean service time (ms).
    pub service_ms: f64,
    /// Offered load (busy engines needed on average), backlog drain included.
    pub offered_load: f64,
    /// What set the size.
    pub bound: Bound,
}

/// Predicted TTFT (s) with `c` engines at the target's statistic, for arrivals of burstiness
/// `burstiness` (`queue.arrival_scv` is the same `b` in the queueing term).
pub fn prefill_ttft_s(queue: &Queue, burstiness: f64, quantile: Option<f64>, c: u32) -> f64 {
    let a = queue.offered_load();
    prefill_ttft_given(queue, burstiness, quantile, c, erlang_c(c, a))
}

/// [`prefill_ttft_s`] given `C(c, a)`.
fn prefill_ttft_given(queue: &Queue, burstiness: f64, quantile: Option<f64>, c: u32, erlang: f64) -> f64 {
    let a = queue.offered_load();
    let service = queue.mean_service_s;
    if c == 0 {
        return if a > 0.0 { f64::INFINITY } else { service };
    }
    // The wait behind the rest of one's batch (M^X/G/c).
    let batch = (burstiness - 1.0).max(0.0) / 2.0 * service / f64::from(c);
    match quantile {
        Some(p) if p > 0.0 && p < 1.0 => {
            service + queue.quantile_given(c, a, erlang, p) + batch * (1.0 / (1.0 - p)).ln()
        }
        _ => service + queue.mean_wait_given(c, a, erlang) + batch,
    }
}

/// Most engines a search considers when no maximum is set.
pub const SEARCH_LIMIT: u32 = 100_000;

/// The fewest prefill engines in `[min, max]` meeting the TTFT target for `rate` requests/s
/// plus `backlog` requests to clear within `drain_s`, arriving with burstiness `burstiness`,
/// each first token `overhead_s` after its prefill ends (the first-token overhead `o`).
/// One pass over `c` (Erlang B is updated incrementally), so the cost is linear in the answer.
#[allow(clippy::too_many_arguments)]
pub fn size_prefill(
    service: &ServiceMoments,
    rate: f64,
    backlog: f64,
    drain_s: f64,
    burstiness: f64,
    overhead_s: f64,
    targets: &LatencyTargets,
    min: u32,
    max: u32,
) -> PrefillSizing {
    let overhead_s = if overhead_s.is_finite() {
        overhead_s.max(0.0)
    } else {
        0.0
    };
    let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
    let extra = if backlog.is_finite() && backlog > 0.0 && drain_s > 0.0 {
        backlog / drain_s
    } else {
        0.0
    };
    let queue = Queue {
        arrival_rate: rate + extra,
        mean_service_s: service.mean_s.max(0.0),
        service_scv: service.scv,
        arrival_scv: burstiness,
    };
    let a = queue.offered_load();
    // The prefill part of the TTFT meets what the overhead leaves of the target.
    let target_s = targets.ttft_ms / 1000.0 - overhead_s;
    // A target the service time alone exceeds cannot be met: aim for a wait of a fifth of it.
    let target_s = if target_s > queue.mean_service_s {
        target_s
    } else {
        queue.mean_service_s * 1.2
    };
    let max = max.max(min).min(SEARCH_LIMIT.max(min));
    let sizing = |replicas: u32, bound: Bound| PrefillSizing {
        replicas,
        ttft_ms: (overhead_s + prefill_ttft_s(&queue, burstiness, targets.ttft_quantile, replicas)) * 1000.0,
        service_ms: queue.mean_service_s * 1000.0,
        offered_load: a,
        bound,
    };
    if a <= 0.0 {
        return sizing(min, Bound::Minimum);
    }
    let mut b = 1.0;
    for c in 1..=max {
        b = a * b / (f64::from(c) + a * b);
        if c < min || f64::from(c) <= a {
            continue;
        }
        let erlang = erlang_c_from_b(c, a, b);
        if prefill_ttft_given(&queue, burstiness, targets.ttft_quantile, c, erlang) <= target_s {
            let bound = if c == min { Bound::Minimum } else { Bound::Ttft };
            return sizing(c, bound);
        }
    }
    sizing(max, Bound::Maximum)
}

/// How the decode pool is sized.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodeModel {
    /// Standard deviations of KV demand above its mean to provide for.
    pub kv_sigmas: f64,
    /// Share of the KV cache plans may fill (admission needs room for a whole prompt).
    pub kv_fill: f64,
    /// Measured over modelled KV tokens per running request (1: the model as is). Prompt and
    /// output lengths are often correlated (long prompts, short answers, or the reverse), which
    /// the independent-lengths model cannot see; the planner learns this factor from the
    /// pool's observed KV usage.
    #[serde(default = "unit")]
    pub kv_scale: f64,
}

fn unit() -> f64 {
    1.0
}

impl Default for DecodeModel {
    fn default() -> Self {
        Self {
            kv_sigmas: 2.0,
            kv_fill: 0.95,
            kv_scale: 1.0,
        }
    }
}

/// The decode pool's size and what it is expected to achieve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodeSizing {
    /// Engines.
    pub replicas: u32,
    /// Predicted ITL (ms) at the target's statistic.
    pub itl_ms: f64,
    /// Predicted requests decoding (pool).
    pub concurrency: f64,
    /// KV tokens to provide for (mean plus the margin).
    pub kv_tokens: f64,
    /// KV tokens the pool holds.
    pub kv_capacity: f64,
    /// What set the size.
    pub bound: Bound,
}

/// Standard normal quantile (Acklam's rational approximation, |error| < 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// What decode must carry for an arrival rate: the running requests (Little's law at the ITL
/// they cause) and the KV tokens they hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecodeLoad {
    /// Arrival rate (requests/s).
    pub rate: f64,
    /// Tokens decoded per request after the first.
    pub decode_tokens: f64,
    /// KV tokens a running request holds, weighted by how long it runs.
    pub kv_mean: f64,
    kv_second: f64,
    itl_z: f64,
    kv_sigmas: f64,
}

/// A decode load at one engine count.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecodePoint {
    /// ITL (ms) at the target's statistic.
    pub itl_ms: f64,
    /// Requests decoding (pool).
    pub concurrency: f64,
    /// KV tokens to provide for (mean plus the margin).
    pub kv_tokens: f64,
}

impl DecodeLoad {
    pub(crate) fn new(
        rate: f64,
        isl: &LengthMoments,
        osl: &LengthMoments,
        model: &DecodeModel,
        targets: &LatencyTargets,
    ) -> Self {
        let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
        let osl_mean = osl.mean.max(1.0);
        let isl_mean = isl.mean.max(0.0);
        let scale = if model.kv_scale.is_finite() && model.kv_scale > 0.0 {
            model.kv_scale
        } else {
            1.0
        };
        Self {
            rate,
            decode_tokens: (osl_mean - 1.0).max(0.0),
            kv_mean: scale * (isl_mean + osl.second.max(osl_mean * osl_mean) / (2.0 * osl_mean)),
            kv_second: scale
                * scale
                * (isl.second.max(isl_mean * isl_mean)
                    + isl_mean * osl.second.max(osl_mean * osl_mean) / osl_mean
                    + osl.third() / (3.0 * osl_mean)),
            itl_z: targets
                .itl_quantile
                .filter(|p| *p > 0.0 && *p < 1.0)
                .map_or(0.0, normal_quantile),
            kv_sigmas: model.kv_sigmas.max(0.0),
        }
    }

    /// The load on `d` engines whose decode steps are stretched by `stretch` (1: decode
    /// alone; an aggregated engine's steps also carry prefill chunks).
    pub(crate) fn at(&self, curves: &impl PerformanceCurves, d: u32, stretch: f64) -> DecodePoint {
        let engines = f64::from(d.max(1));
        // Little's law with the ITL at the resulting concurrency (a few fixed-point steps).
        let mut itl_s = curves.decode_itl_ms(1.0, self.kv_mean) / 1000.0 * stretch;
        let mut n = 0.0;
        for _ in 0..4 {
            n = self.rate * self.decode_tokens * itl_s.max(1e-4);
            let at = curves.decode_itl_ms(n / engines, self.kv_mean) / 1000.0 * stretch;
            // A fixed point reached: further steps would repeat it exactly.
            if !at.is_finite() || at == itl_s {
                break;
            }
            itl_s = at;
        }
        let n_hi = n + self.itl_z * n.sqrt();
        DecodePoint {
            itl_ms: curves.decode_itl_ms(n_hi / engines, self.kv_mean) * stretch,
            concurrency: n,
            kv_tokens: n * self.kv_mean + self.kv_sigmas * (n * self.kv_second).sqrt(),
        }
    }

    /// No fewer engines than the KV cache needs at the fastest ITL (a lower bound: the
    /// concurrency only grows as ITL does), within `[min.max(1), max]`.
    pub(crate) fn kv_lower_bound(
        &self,
        curves: &impl PerformanceCurves,
        fill: f64,
        min: u32,
        max: u32,
    ) -> u32 {
        curves
            .max_kv_tokens()
            .filter(|v| *v > 0.0 && v.is_finite())
            .map_or(min.max(1), |c| {
                let itl_s = curves.decode_itl_ms(0.0, self.kv_mean) / 1000.0;
                let n = self.rate * self.decode_tokens * itl_s.max(1e-4);
                let lower = (n * self.kv_mean / (c * fill)).floor();
                if lower.is_finite() {
                    (lower.min(f64::from(max)) as u32).max(min.max(1))
                } else {
                    min.max(1)
                }
            })
    }
}

/// The fewest decode engines in `[min, max]` whose KV cache holds the predicted running
/// requests and whose ITL meets the target, for `rate` requests/s.
#[allow(clippy::too_many_arguments)]
pub fn size_decode(
    curves: &impl PerformanceCurves,
    rate: f64,
    isl: &LengthMoments,
    osl: &LengthMoments,
    model: &DecodeModel,
    targets: &LatencyTargets,
    min: u32,
    max: u32,
) -> DecodeSizing {
    let load = DecodeLoad::new(rate, isl, osl, model, targets);
    let max = max.max(min);
    let capacity_per_engine = curves.max_kv_tokens().filter(|v| *v > 0.0 && v.is_finite());
    let sizing_given = |d: u32, at: DecodePoint, bound: Bound| DecodeSizing {
        replicas: d,
        itl_ms: at.itl_ms,
        concurrency: at.concurrency,
        kv_tokens: at.kv_tokens,
        kv_capacity: capacity_per_engine.map_or(f64::INFINITY, |c| c * f64::from(d)),
        bound,
    };
    let sizing = |d: u32, bound: Bound| sizing_given(d, load.at(curves, d, 1.0), bound);
    if load.rate <= 0.0 || load.decode_tokens <= 0.0 {
        return sizing(min, Bound::Minimum);
    }
    let fill = model.kv_fill.clamp(0.05, 1.0);
    let max = max.min(SEARCH_LIMIT.max(min));
    let start = load.kv_lower_bound(curves, fill, min, max);
    // Each evaluation interpolates the ITL grid six times: the one before is kept for the bound.
    let mut below: Option<DecodePoint> = None;
    for d in start..=max {
        let at = load.at(curves, d, 1.0);
        let kv_ok = capacity_per_engine.is_none_or(|c| at.kv_tokens <= c * f64::from(d) * fill);
        let itl_ok = at.itl_ms.is_nan() || at.itl_ms <= targets.itl_ms;
        if kv_ok && itl_ok {
            let bound = if d == min {
                Bound::Minimum
            } else {
                let kv_below = below.unwrap_or_else(|| load.at(curves, d - 1, 1.0)).kv_tokens;
                if capacity_per_engine.is_some_and(|c| kv_below > c * f64::from(d - 1) * fill) {
                    Bound::KvCache
                } else {
                    Bound::Itl
                }
            };
            return sizing_given(d, at, bound);
        }
        below = Some(at);
    }
    sizing(max, Bound::Maximum)
}

/// Highest prefill utilisation (offered load per engine) of an interval whose TTFT teaches the
/// first-token overhead: at most half busy, the model's queueing wait with Poisson arrivals is
/// a small part of the TTFT, so what it leaves unexplained is mostly the constant overhead.
pub const OVERHEAD_MAX_UTILISATION: f64 = 0.5;

/// The first-token overhead `o` an observed mean TTFT shows with `engines` engines at `rate`
/// requests/s: the TTFT beyond the prefill model's with Poisson arrivals (`b` = 1). `None`
/// unless the engines were at most [`OVERHEAD_MAX_UTILISATION`] busy; negative when the model
/// overstates the wait.
pub fn implied_overhead(service: &ServiceMoments, rate: f64, engines: u32, ttft_s: f64) -> Option<f64> {
    let queue = Queue {
        arrival_rate: rate,
        mean_service_s: service.mean_s,
        service_scv: service.scv,
        arrival_scv: MIN_BURSTINESS,
    };
    let a = queue.offered_load();
    let calm = a > 0.0 && engines > 0 && a <= OVERHEAD_MAX_UTILISATION * f64::from(engines);
    if !calm || !ttft_s.is_finite() {
        return None;
    }
    Some(ttft_s - prefill_ttft_s(&queue, MIN_BURSTINESS, None, engines))
}

/// The arrival burstiness `b` that explains an observed mean TTFT with `engines` engines at
/// `rate` requests/s, first tokens `overhead_s` after their prefill: the model's mean wait is
/// linear in `b`, so it is solved for directly. `None` when the observation cannot tell (no
/// load, an unstable queue, or a wait the model cannot attribute to arrivals); within
/// [`MIN_BURSTINESS`] and [`MAX_BURSTINESS`].
pub fn implied_burstiness(
    service: &ServiceMoments,
    rate: f64,
    engines: u32,
    ttft_s: f64,
    overhead_s: f64,
) -> Option<f64> {
    let queue = Queue {
        arrival_rate: rate,
        mean_service_s: service.mean_s,
        service_scv: service.scv,
        arrival_scv: 0.0,
    };
    let a = queue.offered_load();
    if a.is_nan() || a <= 0.0 || engines == 0 || f64::from(engines) <= a || !ttft_s.is_finite() {
        return None;
    }
    let c = f64::from(engines);
    let overhead_s = if overhead_s.is_finite() { overhead_s } else { 0.0 };
    let wait = (ttft_s - overhead_s.max(0.0) - service.mean_s).max(0.0);
    // Wq = alpha (b + cs²) + beta (b − 1): the queueing term and the batch wait.
    let alpha = erlang_c(engines, a) * service.mean_s / (c - a) / 2.0;
    let beta = service.mean_s / c / 2.0;
    if alpha + beta < 1e-12 {
        return None;
    }
    let b = (wait - alpha * service.scv.max(0.0) + beta) / (alpha + beta);
    Some(b.clamp(MIN_BURSTINESS, MAX_BURSTINESS))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::float_cmp)]
    use super::*;
    use crate::interpolation::DecodeOperatingPoint;

    /// Prefill 100 ms per 1000 tokens; ITL 10 ms + 1 ms per request per engine; 100k KV tokens.
    struct Linear;

    impl PerformanceCurves for Linear {
        fn prefill_ttft_ms(&self, isl: f64) -> f64 {
            isl.min(8000.0) / 10.0
        }
        fn prefill_thpt_per_gpu(&self, _: f64) -> f64 {
            10_000.0
        }
        fn decode_itl_ms(&self, concurrency: f64, _: f64) -> f64 {
            10.0 + concurrency
        }
        fn decode_best_point(&self, itl_ms: f64, _: f64) -> DecodeOperatingPoint {
            DecodeOperatingPoint {
                thpt_per_gpu: 1000.0,
                itl_ms,
                kv_usage: 0.5,
            }
        }
        fn max_kv_tokens(&self) -> Option<f64> {
            Some(100_000.0)
        }
        fn max_profiled_isl(&self) -> Option<f64> {
            Some(8000.0)
        }
    }

    fn targets(ttft_ms: f64, itl_ms: f64) -> LatencyTargets {
        LatencyTargets {
            ttft_ms,
            itl_ms,
            ttft_quantile: None,
            itl_quantile: None,
        }
    }

    #[test]
    fn lognormal_quadrature_reproduces_the_moments() {
        let m = LengthMoments::with_scv(2000.0, 1.5);
        let (m1, m2) = m.expectation(|x| x);
        assert!((m1 / 2000.0 - 1.0).abs() < 1e-6, "{m1}");
        assert!((m2 / m.second - 1.0).abs() < 1e-3, "{m2}");
        let fixed = LengthMoments::fixed(1000.0);
        assert_eq!(fixed.scv(), 0.0);
        let (m1, _) = fixed.expectation(|x| 2.0 * x);
        assert!((m1 - 2000.0).abs() < 1e-6);
    }

    #[test]
    fn histogram_moments() {
        // 10 values in (0, 100] and 10 in (100, 200] with the mid-bucket mean: uniform over
        // each bucket, E[x²] = (10·10000/3 + 10·70000/3)/20.
        let bounds = [100.0, 200.0, f64::INFINITY];
        let m = LengthMoments::from_histogram(&bounds, &[10.0, 20.0, 20.0], 2000.0, 20.0).unwrap();
        assert_eq!(m.mean, 100.0);
        assert!((m.second - 40_000.0 / 3.0).abs() < 1e-3, "{}", m.second);
        // Values crowded at the buckets' lower bounds: little spread within buckets.
        let m = LengthMoments::from_histogram(&bounds, &[10.0, 20.0, 20.0], 1010.0, 20.0).unwrap();
        assert!(
            (m.second - (10.0 * 0.0 + 10.0 * 10_000.0) / 20.0).abs() / m.second < 0.05,
            "{m:?}"
        );
        // An open last bucket takes what the sum leaves.
        let m =
            LengthMoments::from_histogram(&bounds, &[10.0, 10.0, 20.0], 500.0 + 10.0 * 1000.0, 20.0).unwrap();
        // (ten values near 950 once the first bucket's ten sit at its top)
        assert!(m.second > 0.9 * 10.0 * 950.0 * 950.0 / 20.0, "{m:?}");
        assert_eq!(
            LengthMoments::from_histogram(&bounds, &[0.0, 0.0, 0.0], 0.0, 0.0),
            None
        );
    }

    #[test]
    fn service_time_extends_past_the_profile() {
        assert_eq!(prefill_service_s(&Linear, 4000.0), 0.4);
        assert_eq!(prefill_service_s(&Linear, 16_000.0), 1.6);
        let s = prefill_service(&Linear, &LengthMoments::fixed(2000.0));
        assert!((s.mean_s - 0.2).abs() < 1e-9);
        assert!(s.scv < 1e-9);
    }

    #[test]
    fn prefill_meets_the_target_with_the_fewest_engines() {
        let service = ServiceMoments {
            mean_s: 0.2,
            scv: 1.0,
        };
        let poisson = MIN_BURSTINESS;
        // 20 req/s at 0.2 s: a = 4; M/M/c needs the wait within 300 ms.
        let plan = size_prefill(
            &service,
            20.0,
            0.0,
            60.0,
            poisson,
            0.0,
            &targets(500.0, 50.0),
            1,
            64,
        );
        assert!(plan.replicas >= 5);
        assert!(plan.ttft_ms <= 500.0);
        let queue = Queue {
            arrival_rate: 20.0,
            mean_service_s: 0.2,
            service_scv: 1.0,
            arrival_scv: 1.0,
        };
        assert!(prefill_ttft_s(&queue, poisson, None, plan.replicas - 1) > 0.5);
        assert_eq!(plan.bound, Bound::Ttft);
        // A backlog to drain and bursty arrivals both need more.
        let drained = size_prefill(
            &service,
            20.0,
            600.0,
            60.0,
            poisson,
            0.0,
            &targets(500.0, 50.0),
            1,
            64,
        );
        assert!(drained.replicas >= plan.replicas + 2, "{drained:?}");
        let burst = size_prefill(&service, 20.0, 0.0, 60.0, 5.0, 0.0, &targets(500.0, 50.0), 1, 64);
        assert!(burst.replicas > plan.replicas);
        // The batch wait shrinks as 1 / c: with burstiness 5, 0.2 s · 4 / 2 / c on top of the
        // Allen–Cunneen wait at arrival SCV 5.
        let bursty_queue = Queue {
            arrival_scv: 5.0,
            ..queue
        };
        let at = |c: u32| {
            prefill_ttft_s(&bursty_queue, 5.0, None, c) - prefill_ttft_s(&bursty_queue, 1.0, None, c)
        };
        assert!((at(8) - 0.4 / 8.0).abs() < 1e-12 && (at(16) - 0.4 / 16.0).abs() < 1e-12);
        // A percentile target needs at least as many.
        let p90 = LatencyTargets {
            ttft_quantile: Some(0.9),
            ..targets(500.0, 50.0)
        };
        assert!(size_prefill(&service, 20.0, 0.0, 60.0, poisson, 0.0, &p90, 1, 64).replicas >= plan.replicas);
        // No load: the minimum; the maximum caps.
        assert_eq!(
            size_prefill(
                &service,
                0.0,
                0.0,
                60.0,
                poisson,
                0.0,
                &targets(500.0, 50.0),
                2,
                64
            )
            .replicas,
            2
        );
        let capped = size_prefill(
            &service,
            1000.0,
            0.0,
            60.0,
            poisson,
            0.0,
            &targets(500.0, 50.0),
            1,
            8,
        );
        assert_eq!((capped.replicas, capped.bound), (8, Bound::Maximum));
    }

    #[test]
    fn decode_is_sized_on_kv_cache_and_itl() {
        // 2 req/s of 10k-token prompts and 101 output tokens: ~100 tokens at ~10+ ms, about
        // 2-3 requests running holding 10k tokens each, fits one engine.
        let isl = LengthMoments::fixed(10_000.0);
        let osl = LengthMoments::fixed(101.0);
        let model = DecodeModel::default();
        let small = size_decode(&Linear, 2.0, &isl, &osl, &model, &targets(500.0, 50.0), 1, 64);
        assert_eq!(small.replicas, 1);
        // 40 req/s: ~50 running, 500k tokens: KV-bound.
        let big = size_decode(&Linear, 40.0, &isl, &osl, &model, &targets(500.0, 50.0), 1, 64);
        assert!(big.replicas >= 6, "{big:?}");
        assert_eq!(big.bound, Bound::KvCache);
        assert!(big.kv_tokens <= big.kv_capacity);
        // A tight ITL target is the limit with short prompts.
        let short = LengthMoments::fixed(100.0);
        let tight = size_decode(&Linear, 40.0, &short, &osl, &model, &targets(500.0, 15.0), 1, 64);
        assert_eq!(tight.bound, Bound::Itl);
        assert!(tight.itl_ms <= 15.0);
    }

    #[test]
    fn kv_scale_multiplies_the_tokens_each_running_request_holds() {
        let isl = LengthMoments::fixed(10_000.0);
        let osl = LengthMoments::fixed(101.0);
        let t = targets(500.0, 50.0);
        let model = |kv_scale: f64| DecodeModel {
            kv_sigmas: 0.0,
            kv_fill: 1.0,
            kv_scale,
        };
        let size = |kv_scale: f64| size_decode(&Linear, 40.0, &isl, &osl, &model(kv_scale), &t, 1, 64);
        let (plain, double, half) = (size(1.0), size(2.0), size(0.5));
        assert_eq!(plain.bound, Bound::KvCache);
        // On the same engines, twice the tokens per request is twice the KV demand.
        let at = |kv_scale: f64| size_decode(&Linear, 40.0, &isl, &osl, &model(kv_scale), &t, 8, 8).kv_tokens;
        assert!((at(2.0) / at(1.0) - 2.0).abs() < 1e-9);
        // More engines for more tokens, fewer for fewer (not proportionally: more engines also
        // run faster, so fewer requests are running).
        assert!(
            double.replicas > plain.replicas + plain.replicas / 3,
            "{double:?} {plain:?}"
        );
        assert!(half.replicas < plain.replicas, "{half:?} {plain:?}");
        // A meaningless factor is ignored.
        assert_eq!(size(f64::NAN).replicas, plain.replicas);
        assert_eq!(size(0.0).replicas, plain.replicas);
    }

    #[test]
    fn arrival_burstiness_inverts_the_prediction() {
        let service = ServiceMoments {
            mean_s: 0.2,
            scv: 1.0,
        };
        let queue = Queue {
            arrival_rate: 10.0,
            mean_service_s: 0.2,
            service_scv: 1.0,
            arrival_scv: 3.0,
        };
        let ttft = prefill_ttft_s(&queue, 3.0, None, 4);
        let b = implied_burstiness(&service, 10.0, 4, ttft, 0.0).unwrap();
        assert!((b - 3.0).abs() < 1e-9, "{b}");
        assert_eq!(implied_burstiness(&service, 0.0, 4, 1.0, 0.0), None);
        assert_eq!(implied_burstiness(&service, 100.0, 4, 1.0, 0.0), None);
        // Faster than the model with Poisson arrivals: no less than Poisson.
        assert_eq!(
            implied_burstiness(&service, 10.0, 4, 0.2, 0.0),
            Some(MIN_BURSTINESS)
        );
    }

    #[test]
    fn normal_quantiles() {
        assert!(normal_quantile(0.5).abs() < 1e-9);
        assert!((normal_quantile(0.95) - 1.644_853_627).abs() < 1e-6);
        assert!((normal_quantile(0.1) + 1.281_551_566).abs() < 1e-6);
    }
}
