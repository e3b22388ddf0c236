//! Aggregated engines: one pool whose engines prefill and decode alike, chunked prefill
//! sharing each step with the running decodes (a Dynamo graph's lone `type: worker`
//! component, and Dynamo's mocker in `--disaggregation-mode agg`).
//!
//! # The engine model, derived from the disaggregated profile
//!
//! The profiles measure prefill alone (the time of one prompt by its length) and decode alone
//! (the step time by concurrency and context). An aggregated engine's step carries both: up to
//! [`AggregatedEngine::chunk_tokens`] prompt tokens and one token of every running request. Its
//! time is the sum of the two parts, each read from its own profile (the way the mocker times
//! a mixed step). Over time, with `λ` requests/s per engine of mean prefill time `s`:
//!
//! - the engine spends a share `ρ = λ s` of its time on prompt tokens, so the steps that emit
//!   tokens come `1 / (1 − ρ)` times slower than decode alone:
//!   `ITL = itl(n, context) / (1 − ρ)`, with the `n` running requests from Little's law at
//!   that ITL (the decode pool's fixed point, [`crate::sizing::size_decode`]);
//! - a prompt's prefill takes its own time plus the decode part of every step it spans:
//!   `S = s(isl) + ceil(isl / chunk) · itl(n, context)`; TTFT is the G/G/c queue of these
//!   prefills over the pool's `c` engines, with the burstiness a prefill pool plans for
//!   ([`crate::sizing::prefill_ttft_s`]);
//! - the KV cache holds each running request's prompt and output so far, as a decode pool's.
//!
//! The pool is the fewest engines meeting TTFT, ITL and the KV cache together
//! ([`size_aggregated`]). The queueing planner's other stages (learn, forecast, demand, hold)
//! are the disaggregated planner's; the aggregated pool is reported as both pools of a plan,
//! with the same replicas.

use serde::{Deserialize, Serialize};

use crate::{
    erlang::Queue,
    interpolation::PerformanceCurves,
    sizing::{
        Bound, DecodeLoad, DecodeModel, DecodePoint, DecodeSizing, LatencyTargets, LengthMoments,
        PrefillSizing, SEARCH_LIMIT, ServiceMoments, prefill_ttft_s,
    },
};

/// How an aggregated engine batches prompts (`spec.aggregated` of a policy).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AggregatedEngine {
    /// Prompt tokens one step may carry: vLLM's and the mocker's `max_num_batched_tokens`
    /// (8192 by default in both, with chunked prefill on).
    pub chunk_tokens: f64,
}

impl Default for AggregatedEngine {
    fn default() -> Self {
        Self {
            chunk_tokens: DEFAULT_CHUNK_TOKENS,
        }
    }
}

/// The mocker's and vLLM's default `max_num_batched_tokens`.
pub const DEFAULT_CHUNK_TOKENS: f64 = 8192.0;

/// Largest share of an engine's time planned for prompts: past it the decode steps between
/// chunks stretch without bound (ITL `1 / (1 − ρ)`), so such a pool is never the answer.
const MAX_PREFILL_SHARE: f64 = 0.95;

/// A prompt's prefill time on an aggregated engine whose decode steps take `step_s`: its own
/// time plus the decode part of each chunk it spans, with the variance of its own time.
pub fn shared_service(
    service: &ServiceMoments,
    isl: &LengthMoments,
    engine: &AggregatedEngine,
    step_s: f64,
) -> ServiceMoments {
    let chunk = engine.chunk();
    let chunks = isl.expectation(|x| (x / chunk).ceil().max(1.0)).0;
    let step_s = if step_s.is_finite() { step_s.max(0.0) } else { 0.0 };
    let mean_s = service.mean_s + chunks * step_s;
    let scale = if mean_s > 0.0 {
        service.mean_s / mean_s
    } else {
        1.0
    };
    ServiceMoments {
        mean_s,
        scv: service.scv * scale * scale,
    }
}

impl AggregatedEngine {
    /// Prompt tokens a step carries (the default when the setting is not a positive number).
    pub fn chunk(&self) -> f64 {
        if self.chunk_tokens.is_finite() && self.chunk_tokens >= 1.0 {
            self.chunk_tokens
        } else {
            DEFAULT_CHUNK_TOKENS
        }
    }
}

/// What the aggregated pool is sized for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AggregatedDemand {
    /// Prompts arriving (requests/s), a backlog's drain included.
    pub prefill_rate: f64,
    /// Requests starting to decode (requests/s), with the decode margin and the drain.
    pub decode_rate: f64,
    /// Prefill time of the prompt mix on an idle engine.
    pub service: ServiceMoments,
    /// Arrival burstiness.
    pub burstiness: f64,
    /// Prompt-length mix.
    pub isl: LengthMoments,
    /// Output-length mix.
    pub osl: LengthMoments,
}

/// What one engine count achieves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AggregatedPoint {
    /// Share of each engine's time spent on prompt tokens.
    pub prefill_share: f64,
    /// TTFT (s) at the target's statistic.
    pub ttft_s: f64,
    /// A prompt's prefill time with the decode steps it shares (s).
    pub service_s: f64,
    /// Busy engines the prefills need on average.
    pub offered_load: f64,
    /// ITL (ms) at the target's statistic.
    pub itl_ms: f64,
    /// Requests decoding (pool).
    pub concurrency: f64,
    /// KV tokens to provide for.
    pub kv_tokens: f64,
}

/// The aggregated pool's size, as a prefill and a decode sizing with the same replicas.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AggregatedSizing {
    /// TTFT side.
    pub prefill: PrefillSizing,
    /// ITL and KV side.
    pub decode: DecodeSizing,
}

/// The model of one demand, evaluated engine count by engine count.
struct Model<'a, C> {
    curves: &'a C,
    demand: &'a AggregatedDemand,
    engine: &'a AggregatedEngine,
    decode: DecodeLoad,
    targets: &'a LatencyTargets,
    capacity_per_engine: Option<f64>,
    fill: f64,
}

impl<C: PerformanceCurves> Model<'_, C> {
    fn at(&self, c: u32) -> AggregatedPoint {
        let engines = f64::from(c.max(1));
        let d = self.demand;
        let rate = if d.prefill_rate.is_finite() {
            d.prefill_rate.max(0.0)
        } else {
            0.0
        };
        let share = rate * d.service.mean_s.max(0.0) / engines;
        if share >= MAX_PREFILL_SHARE {
            return AggregatedPoint {
                prefill_share: share,
                ttft_s: f64::INFINITY,
                service_s: d.service.mean_s,
                offered_load: share * engines,
                itl_ms: f64::INFINITY,
                concurrency: f64::INFINITY,
                kv_tokens: f64::INFINITY,
            };
        }
        let DecodePoint {
            itl_ms,
            concurrency,
            kv_tokens,
        } = self.decode.at(self.curves, c, 1.0 / (1.0 - share));
        // The decode part of a step the prompt shares, at the pool's mean concurrency.
        let step_s = self
            .curves
            .decode_itl_ms(concurrency / engines, self.decode.kv_mean)
            / 1000.0;
        let shared = shared_service(&d.service, &d.isl, self.engine, step_s);
        let service_s = shared.mean_s;
        let queue = Queue {
            arrival_rate: rate,
            mean_service_s: service_s,
            service_scv: shared.scv,
            arrival_scv: d.burstiness,
        };
        AggregatedPoint {
            prefill_share: share,
            ttft_s: prefill_ttft_s(&queue, d.burstiness, self.targets.ttft_quantile, c),
            service_s,
            offered_load: queue.offered_load(),
            itl_ms,
            concurrency,
            kv_tokens,
        }
    }

    /// Which target `c` engines miss, if any (TTFT first, as a prefill pool is checked).
    fn misses(&self, c: u32, at: &AggregatedPoint) -> Option<Bound> {
        // A target the service time alone exceeds cannot be met: aim for a wait of a fifth of it.
        let ttft_target_s = (self.targets.ttft_ms / 1000.0).max(at.service_s * 1.2);
        if at.prefill_share >= MAX_PREFILL_SHARE || at.ttft_s.is_nan() || at.ttft_s > ttft_target_s {
            return Some(Bound::Ttft);
        }
        if self
            .capacity_per_engine
            .is_some_and(|cap| at.kv_tokens.is_nan() || at.kv_tokens > cap * f64::from(c) * self.fill)
        {
            return Some(Bound::KvCache);
        }
        if at.itl_ms > self.targets.itl_ms {
            return Some(Bound::Itl);
        }
        None
    }

    fn sizing(&self, c: u32, at: &AggregatedPoint, bound: Bound) -> AggregatedSizing {
        AggregatedSizing {
            prefill: PrefillSizing {
                replicas: c,
                ttft_ms: at.ttft_s * 1000.0,
                service_ms: at.service_s * 1000.0,
                offered_load: at.offered_load,
                bound,
            },
            decode: DecodeSizing {
                replicas: c,
                itl_ms: at.itl_ms,
                concurrency: at.concurrency,
                kv_tokens: at.kv_tokens,
                kv_capacity: self
                    .capacity_per_engine
                    .map_or(f64::INFINITY, |cap| cap * f64::from(c)),
                bound,
            },
        }
    }
}

/// The fewest aggregated engines in `[min, max]` meeting the TTFT and ITL targets with the
/// KV cache holding the running requests.
pub fn size_aggregated(
    curves: &impl PerformanceCurves,
    engine: &AggregatedEngine,
    demand: &AggregatedDemand,
    decode: &DecodeModel,
    targets: &LatencyTargets,
    min: u32,
    max: u32,
) -> AggregatedSizing {
    let model = Model {
        curves,
        demand,
        engine,
        decode: DecodeLoad::new(demand.decode_rate, &demand.isl, &demand.osl, decode, targets),
        targets,
        capacity_per_engine: curves.max_kv_tokens().filter(|v| *v > 0.0 && v.is_finite()),
        fill: decode.kv_fill.clamp(0.05, 1.0),
    };
    let max = max.max(min).min(SEARCH_LIMIT.max(min));
    let busy = |rate: f64| rate.is_finite() && rate > 0.0;
    let idle = !busy(demand.prefill_rate) && !busy(demand.decode_rate);
    if idle {
        return model.sizing(min, &model.at(min), Bound::Minimum);
    }
    // No fewer engines than the prompts' work alone needs, nor than the KV cache does.
    let work = demand.prefill_rate * demand.service.mean_s.max(0.0) / MAX_PREFILL_SHARE;
    let by_work = if work.is_finite() {
        work.floor().min(f64::from(max)) as u32
    } else {
        max
    };
    let start = model
        .decode
        .kv_lower_bound(curves, model.fill, min, max)
        .max(by_work)
        .max(min.max(1));
    let mut missed = None;
    for c in start..=max {
        let at = model.at(c);
        match model.misses(c, &at) {
            None => {
                let bound = if c == min {
                    Bound::Minimum
                } else {
                    // What the engine count below missed (the search may have started above it).
                    missed
                        .or_else(|| model.misses(c - 1, &model.at(c - 1)))
                        .unwrap_or(Bound::Minimum)
                };
                return model.sizing(c, &at, bound);
            }
            Some(bound) => missed = Some(bound),
        }
    }
    model.sizing(max, &model.at(max), Bound::Maximum)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::float_cmp)]
    use super::*;
    use crate::{
        interpolation::{DecodeOperatingPoint, PerformanceModel},
        profile::Profile,
        sizing::{prefill_service, size_decode, size_prefill},
    };

    /// Prefill 100 ms per 1000 tokens; ITL 10 ms + 1 ms per request per engine; 100k KV tokens.
    struct Linear;

    impl PerformanceCurves for Linear {
        fn prefill_ttft_ms(&self, isl: f64) -> f64 {
            isl / 10.0
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
    }

    fn targets(ttft_ms: f64, itl_ms: f64) -> LatencyTargets {
        LatencyTargets {
            ttft_ms,
            itl_ms,
            ttft_quantile: None,
            itl_quantile: None,
        }
    }

    fn demand(curves: &impl PerformanceCurves, rate: f64, isl: f64, osl: f64) -> AggregatedDemand {
        let isl = LengthMoments::fixed(isl);
        AggregatedDemand {
            prefill_rate: rate,
            decode_rate: rate,
            service: prefill_service(curves, &isl),
            burstiness: 1.0,
            isl,
            osl: LengthMoments::fixed(osl),
        }
    }

    #[test]
    fn a_step_shares_prefill_and_decode() {
        // 2 req/s of 1000-token prompts (100 ms each) on 1 engine: 20 % of its time on prompts,
        // so decode steps come 1.25x slower than decode alone, and each prompt also waits for
        // the one decode step it shares.
        let d = demand(&Linear, 2.0, 1000.0, 101.0);
        let model = Model {
            curves: &Linear,
            demand: &d,
            engine: &AggregatedEngine::default(),
            decode: DecodeLoad::new(2.0, &d.isl, &d.osl, &DecodeModel::default(), &targets(1e9, 1e9)),
            targets: &targets(1e9, 1e9),
            capacity_per_engine: None,
            fill: 1.0,
        };
        let at = model.at(1);
        assert!((at.prefill_share - 0.2).abs() < 1e-12);
        // n = 2 req/s * 100 tokens * ITL, ITL = (10 + n) ms * 1.25: n = 2.5 + 0.25 n.
        let n = 2.5 / 0.75;
        assert!((at.concurrency - n).abs() < 0.05, "{}", at.concurrency);
        assert!((at.itl_ms - (10.0 + n) * 1.25).abs() < 0.1, "{}", at.itl_ms);
        // Service: 100 ms of prompt plus one decode step at that concurrency.
        assert!((at.service_s - (0.1 + (10.0 + at.concurrency) / 1000.0)).abs() < 1e-9);
        assert!(at.ttft_s > at.service_s);
    }

    #[test]
    fn the_pool_meets_both_targets_with_the_fewest_engines() {
        let d = demand(&Linear, 20.0, 1000.0, 101.0);
        let t = targets(300.0, 25.0);
        let sizing = size_aggregated(
            &Linear,
            &AggregatedEngine::default(),
            &d,
            &DecodeModel::default(),
            &t,
            1,
            64,
        );
        let c = sizing.decode.replicas;
        assert_eq!(sizing.prefill.replicas, c);
        assert!(
            sizing.prefill.ttft_ms <= 300.0 && sizing.decode.itl_ms <= 25.0,
            "{sizing:?}"
        );
        let model_below = size_aggregated(
            &Linear,
            &AggregatedEngine::default(),
            &d,
            &DecodeModel::default(),
            &t,
            c - 1,
            c - 1,
        );
        assert!(
            model_below.prefill.ttft_ms > 300.0 || model_below.decode.itl_ms > 25.0,
            "{model_below:?}"
        );
        // An aggregated engine does both jobs: it needs at least as many engines as either
        // disaggregated pool, and fewer than both together here.
        let prefill = size_prefill(&d.service, 20.0, 0.0, 60.0, 1.0, 0.0, &t, 1, 64).replicas;
        let decode = size_decode(&Linear, 20.0, &d.isl, &d.osl, &DecodeModel::default(), &t, 1, 64).replicas;
        assert!(c >= prefill.max(decode), "{c} vs {prefill}/{decode}");
        assert!(c <= prefill + decode + 1, "{c} vs {prefill}/{decode}");
    }

    #[test]
    fn the_binding_target_is_reported() {
        // Long prompts and loose ITL: TTFT binds.
        let d = demand(&Linear, 20.0, 4000.0, 11.0);
        let s = size_aggregated(
            &Linear,
            &AggregatedEngine::default(),
            &d,
            &DecodeModel::default(),
            &targets(1000.0, 1000.0),
            1,
            64,
        );
        assert_eq!(s.prefill.bound, Bound::Ttft);
        // Short prompts, long answers, tight ITL: ITL binds.
        let d = demand(&Linear, 20.0, 100.0, 500.0);
        let s = size_aggregated(
            &Linear,
            &AggregatedEngine::default(),
            &d,
            &DecodeModel::default(),
            &targets(10_000.0, 15.0),
            1,
            64,
        );
        assert_eq!(s.decode.bound, Bound::Itl);
        // No load: the minimum.
        let d = demand(&Linear, 0.0, 100.0, 500.0);
        let s = size_aggregated(
            &Linear,
            &AggregatedEngine::default(),
            &d,
            &DecodeModel::default(),
            &targets(100.0, 15.0),
            2,
            64,
        );
        assert_eq!((s.decode.replicas, s.decode.bound), (2, Bound::Minimum));
    }

    #[test]
    fn smaller_chunks_cost_prompts_more_decode_steps() {
        let d = demand(&Linear, 20.0, 8000.0, 101.0);
        let t = targets(1e9, 1e9);
        let at = |chunk: f64| {
            size_aggregated(
                &Linear,
                &AggregatedEngine { chunk_tokens: chunk },
                &d,
                &DecodeModel::default(),
                &t,
                40,
                40,
            )
            .prefill
            .service_ms
        };
        assert!(
            at(1000.0) > at(8192.0) + 5.0 * 10.0,
            "{} vs {}",
            at(1000.0),
            at(8192.0)
        );
    }

    #[test]
    fn a_real_profile_sizes_more_engines_as_load_grows() {
        let curves = PerformanceModel::new(&Profile::builtin("h200-llama3.1-8b-tp1").unwrap()).unwrap();
        let t = targets(500.0, 30.0);
        let mut last = 0;
        for rate in [1.0, 5.0, 20.0, 50.0] {
            let d = demand(&curves, rate, 3000.0, 300.0);
            let s = size_aggregated(
                &curves,
                &AggregatedEngine::default(),
                &d,
                &DecodeModel::default(),
                &t,
                1,
                512,
            );
            assert!(s.decode.replicas >= last, "{rate}: {s:?}");
            assert_ne!(s.decode.bound, Bound::Maximum, "{rate}: {s:?}");
            last = s.decode.replicas;
        }
        assert!(last > 1);
    }
}
