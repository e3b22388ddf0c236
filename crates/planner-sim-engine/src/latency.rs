//! The latency model of one deployment: how long requests wait and run, given the profile and
//! the prefill and decode engines serving. Shared by the replay ([`crate::run`]) and the
//! simulator's synthetic Dynamo frontend.
//!
//! # Model and assumptions
//!
//! Time advances in steps (the caller picks them, typically 1 s). Within a step the number of
//! engines is fixed; it changes only between steps.
//!
//! **Prefill** is a first-come-first-served queue in front of `p` engines (Dynamo's router
//! queue). An engine prefills one request at a time, and a request of `isl` tokens occupies
//! it for the profiled TTFT at that length, `prefill_ttft_ms(isl)` (the profiler measures TTFT
//! of one request alone, which is also where upstream's throughput column comes from).
//! Prompts longer than the longest profiled one take proportionally longer
//! (`ttft(max) * isl / max`) instead of being clamped. Requests start, within the step, at the
//! exact time an engine frees up (an event-exact multi-server FIFO queue), so when prefill
//! capacity is short the queue grows and shows up as TTFT growth. Prefill batching of several
//! short prompts is not modelled: short prompts are slightly pessimistic.
//!
//! **Decode** is one pool of `d` engines sharing the load evenly (the router balances it).
//! A prefilled request is admitted to decode when the pool's KV cache (`d * max_kv_tokens`)
//! has room for its context, otherwise it waits, first come first served; its first token is
//! emitted at admission, so TTFT = prefill queueing + prefill + decode admission wait. Every
//! step, all admitted requests generate tokens at the profiled ITL for the current
//! concurrency per engine (`active / d`) and mean context length (prompt plus tokens generated
//! so far), `decode_itl_ms(concurrency, context)`: the same grid the planner's correction
//! factor reads. A request finishing inside the step finishes at the exact time its last token
//! is due. KV usage grows with generated tokens; preemption is not modelled.
//!
//! **Scaling**: an added engine serves from the step it is activated in; a removed prefill
//! engine finishes the request it holds (its GPUs are released at once: the caller accounts
//! for them); removing decode engines spreads the running requests over the remaining ones.
//! KV-cache transfer between prefill and decode, network and tokenizer time are not modelled.
//!
//! **Aggregated engines** ([`Cluster::aggregated`]): the `p` prefill and `d` decode engines are
//! the same engines (the caller keeps `p = d`), each step of which carries a chunk of a prompt
//! and one token of every running request, timed as the sum of the two parts (the way
//! Dynamo's mocker times a mixed step). A prompt holds its engine for its prefill time plus
//! the decode step of every chunk (`ceil(isl / chunk_tokens)` of them, at the decode load when
//! it starts); decode tokens come `1 / (1 − ρ)` times slower, `ρ` the share of the engines'
//! time the step spent on prompt tokens (at most 0.95). The KV a prompt holds while it is
//! prefilled is not counted. [`planner_core::aggregated`] plans with the same model.

use std::collections::VecDeque;

use planner_core::{aggregated::AggregatedEngine, interpolation::PerformanceCurves, profile::Profile};

/// What the model needs beyond the performance curves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineSpec {
    /// KV-cache capacity of one decode engine, in tokens.
    pub max_kv_tokens: f64,
    /// Longest profiled prompt; longer ones take proportionally longer to prefill.
    pub max_profiled_isl: f64,
}

impl EngineSpec {
    /// Read from a profile.
    pub fn from_profile(profile: &Profile) -> Self {
        Self {
            max_kv_tokens: profile.decode.max_kv_tokens,
            max_profiled_isl: profile.prefill.isl.last().copied().unwrap_or(f64::INFINITY),
        }
    }
}

/// The profile's latencies as the model uses them.
#[derive(Clone, Copy, Debug)]
pub struct LatencyModel<'a, C> {
    /// The performance curves (an interpolated profile, or fixed curves in tests).
    pub curves: &'a C,
    /// Engine capacities.
    pub spec: EngineSpec,
}

/// Shortest ITL the model will use (s): guards against a zero or negative profile value.
const MIN_ITL_S: f64 = 1e-4;

impl<'a, C: PerformanceCurves> LatencyModel<'a, C> {
    /// A model over `curves`.
    pub fn new(curves: &'a C, spec: EngineSpec) -> Self {
        Self { curves, spec }
    }

    /// Seconds one engine needs to prefill `isl` tokens.
    pub fn prefill_time_s(&self, isl: f64) -> f64 {
        let max = self.spec.max_profiled_isl;
        let ms = if isl > max && max > 0.0 {
            self.curves.prefill_ttft_ms(max) * isl / max
        } else {
            self.curves.prefill_ttft_ms(isl)
        };
        if ms.is_finite() {
            (ms / 1000.0).max(0.0)
        } else {
            0.0
        }
    }

    /// Inter-token latency (s) at `concurrency` requests per engine of `context` tokens each.
    pub fn itl_s(&self, concurrency: f64, context: f64) -> f64 {
        let ms = self.curves.decode_itl_ms(concurrency, context);
        if ms.is_finite() {
            (ms / 1000.0).max(MIN_ITL_S)
        } else {
            MIN_ITL_S
        }
    }
}

/// A request inside the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Job {
    /// Caller's identifier (the simulator uses the request's index in the trace).
    pub id: usize,
    /// Arrival time (s).
    pub arrival_s: f64,
    /// Input tokens.
    pub isl: f64,
    /// Output tokens (at least 1; the first comes from prefill).
    pub osl: f64,
}

/// How a request went, reported when it completes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// Time to first token (s).
    pub ttft_s: f64,
    /// Mean inter-token latency (s); `None` for single-token responses.
    pub mean_itl_s: Option<f64>,
    /// Arrival to last token (s).
    pub duration_s: f64,
}

/// Receives what a frontend would observe. Every method defaults to doing nothing.
pub trait Observer {
    /// `job` was accepted (the caller reports it when it hands the job to the model).
    fn arrived(&mut self, _job: &Job) {}
    /// The first token of `job` was emitted at `at_s`.
    fn first_token(&mut self, _job: &Job, _at_s: f64, _ttft_s: f64) {}
    /// `count` further tokens (fractional within a step) were emitted at `itl_s` apart, by the
    /// step ending at `at_s`, for `job`.
    fn tokens(&mut self, _job: &Job, _at_s: f64, _count: f64, _itl_s: f64) {}
    /// `job` completed at `at_s`.
    fn completed(&mut self, _job: &Job, _at_s: f64, _outcome: &Outcome) {}
}

/// An observer that ignores everything.
impl Observer for () {}

#[derive(Clone, Copy, Debug)]
struct PrefillEngine {
    free_at: f64,
    /// Prompt tokens of the request it holds (until `free_at`).
    isl: f64,
}

#[derive(Clone, Copy, Debug)]
struct Prefilled {
    job: Job,
    /// When its engine started on it.
    begin_s: f64,
    done_s: f64,
    /// Share of its engine time spent on prompt tokens (1 unless aggregated).
    prompt_share: f64,
}

/// Largest share of an aggregated engine's time the model lets prompts take from decode.
const MAX_PROMPT_SHARE: f64 = 0.95;

#[derive(Clone, Copy, Debug)]
struct Decoding {
    job: Job,
    /// When it was admitted (its first token), possibly inside the current step.
    ready_s: f64,
    ttft_s: f64,
    /// Tokens emitted so far, the first included.
    generated: f64,
    /// Sum of the ITL of every token after the first.
    itl_sum_s: f64,
}

/// An instantaneous view of the deployment, for load-based policies and gauges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Requests waiting for a prefill engine.
    pub prefill_queue: usize,
    /// Prompt tokens of the requests waiting for a prefill engine.
    pub prefill_queue_tokens: f64,
    /// Prompt tokens being prefilled, per prefill engine.
    pub prefill_active_tokens: Vec<f64>,
    /// Prefilled requests waiting for decode KV cache.
    pub decode_queue: usize,
    /// Requests decoding.
    pub decoding: usize,
    /// Decode engines.
    pub decode_engines: u32,
    /// KV tokens held by decoding requests (all engines).
    pub kv_tokens: f64,
    /// KV usage of the pool (0..; above 1 only through generated tokens).
    pub kv_usage: f64,
    /// Seconds of prefill work started since the model began (for utilisation).
    pub prefill_work_started_s: f64,
}

/// The deployment's state: queues, engines and running requests. Plain data, cheap to clone
/// (the oracle tries candidate replica counts on clones).
#[derive(Clone, Debug)]
pub struct Cluster {
    now_s: f64,
    prefill_queue: VecDeque<Job>,
    prefill_engines: Vec<PrefillEngine>,
    prefilling: Vec<Prefilled>,
    decode_engines: u32,
    decode_queue: VecDeque<Prefilled>,
    decoding: Vec<Decoding>,
    kv_tokens: f64,
    /// KV capacity of one decode engine, remembered from the last step (for snapshots).
    kv_capacity_per_engine: f64,
    prefill_work_started_s: f64,
    /// Prompt tokens per step when the engines are aggregated.
    chunk_tokens: Option<f64>,
}

impl Cluster {
    /// The same deployment with aggregated engines (`Some`), or disaggregated pools.
    pub fn aggregated(mut self, engine: Option<&AggregatedEngine>) -> Self {
        self.chunk_tokens = engine.map(AggregatedEngine::chunk);
        self
    }

    /// An idle deployment at time `now_s`.
    pub fn new(now_s: f64, prefill_engines: u32, decode_engines: u32) -> Self {
        let mut cluster = Self {
            now_s,
            prefill_queue: VecDeque::new(),
            prefill_engines: Vec::new(),
            prefilling: Vec::new(),
            decode_engines,
            decode_queue: VecDeque::new(),
            decoding: Vec::new(),
            kv_tokens: 0.0,
            kv_capacity_per_engine: 0.0,
            prefill_work_started_s: 0.0,
            chunk_tokens: None,
        };
        cluster.set_prefill_engines(prefill_engines);
        cluster
    }

    /// The model's clock (end of the last step).
    pub fn now_s(&self) -> f64 {
        self.now_s
    }

    /// Prefill engines serving.
    pub fn prefill_engines(&self) -> u32 {
        u32::try_from(self.prefill_engines.len()).unwrap_or(u32::MAX)
    }

    /// Decode engines serving.
    pub fn decode_engines(&self) -> u32 {
        self.decode_engines
    }

    /// Whether no request is queued or running.
    pub fn is_idle(&self) -> bool {
        self.prefill_queue.is_empty()
            && self.prefilling.is_empty()
            && self.decode_queue.is_empty()
            && self.decoding.is_empty()
    }

    /// Requests inside the model (queued or running).
    pub fn in_flight(&self) -> usize {
        self.prefill_queue.len() + self.prefilling.len() + self.decode_queue.len() + self.decoding.len()
    }

    /// How many requests have not had their first token yet (the frontend's queued gauge).
    pub fn waiting_for_first_token_count(&self) -> usize {
        self.prefill_queue.len() + self.prefilling.len() + self.decode_queue.len()
    }

    /// How many requests wait for or are in prefill (what the frontend's prefill stages count:
    /// a request waiting for decode after its prefill is not among them).
    pub fn prefill_pending_count(&self) -> usize {
        self.prefill_queue.len() + self.prefilling.len()
    }

    /// Requests that have not had their first token yet (queued for prefill, prefilling, or
    /// waiting for decode).
    pub fn waiting_for_first_token(&self) -> Vec<Job> {
        self.prefill_queue
            .iter()
            .copied()
            .chain(self.prefilling.iter().map(|p| p.job))
            .chain(self.decode_queue.iter().map(|p| p.job))
            .collect()
    }

    /// Requests inside the model whose id is below `id`.
    pub fn in_flight_before(&self, id: usize) -> usize {
        self.prefill_queue.iter().filter(|j| j.id < id).count()
            + self.prefilling.iter().filter(|p| p.job.id < id).count()
            + self.decode_queue.iter().filter(|p| p.job.id < id).count()
            + self.decoding.iter().filter(|d| d.job.id < id).count()
    }

    /// Sets the prefill engines serving from now on. New engines are idle; removed ones are
    /// those that free up first (idle ones), and finish the request they hold.
    pub fn set_prefill_engines(&mut self, engines: u32) {
        let engines = engines as usize;
        if engines > self.prefill_engines.len() {
            let now = self.now_s;
            self.prefill_engines.resize(
                engines,
                PrefillEngine {
                    free_at: now,
                    isl: 0.0,
                },
            );
        } else if engines < self.prefill_engines.len() {
            self.prefill_engines
                .sort_by(|a, b| b.free_at.total_cmp(&a.free_at));
            self.prefill_engines.truncate(engines);
        }
    }

    /// Sets the decode engines serving from now on.
    pub fn set_decode_engines(&mut self, engines: u32) {
        self.decode_engines = engines;
    }

    /// A request arrives (its `arrival_s` must not be before the current step's start, and the
    /// caller adds requests in arrival order).
    pub fn arrive(&mut self, job: Job) {
        self.prefill_queue.push_back(job);
    }

    /// The current state.
    pub fn snapshot(&self) -> Snapshot {
        let capacity = f64::from(self.decode_engines) * self.kv_capacity_per_engine;
        Snapshot {
            prefill_queue: self.prefill_queue.len(),
            prefill_queue_tokens: self.prefill_queue.iter().fold(0.0, |sum, j| sum + j.isl),
            prefill_active_tokens: self
                .prefill_engines
                .iter()
                .map(|e| if e.free_at > self.now_s { e.isl } else { 0.0 })
                .collect(),
            decode_queue: self.decode_queue.len(),
            decoding: self.decoding.len(),
            decode_engines: self.decode_engines,
            kv_tokens: self.kv_tokens,
            kv_usage: if capacity > 0.0 {
                self.kv_tokens / capacity
            } else {
                0.0
            },
            prefill_work_started_s: self.prefill_work_started_s,
        }
    }

    /// Advances the model from [`Self::now_s`] to `until_s` (one step), reporting what a
    /// frontend observes to `observer`. Requests must have been added with [`Self::arrive`].
    pub fn advance<C: PerformanceCurves>(
        &mut self,
        model: &LatencyModel<'_, C>,
        until_s: f64,
        observer: &mut impl Observer,
    ) {
        let start = self.now_s;
        if until_s <= start {
            return;
        }
        self.kv_capacity_per_engine = model.spec.max_kv_tokens;
        self.start_prefills(model, start, until_s);
        let decode_stretch = self.decode_stretch(start, until_s);
        self.finish_prefills(until_s);
        self.admit_to_decode(model, start, observer);
        self.decode(model, (start, until_s), decode_stretch, observer);
        self.now_s = until_s;
    }

    /// Prefill: hands queued requests, in order, to the engine that frees up first, while one
    /// frees up before `until_s`.
    fn start_prefills<C: PerformanceCurves>(
        &mut self,
        model: &LatencyModel<'_, C>,
        start: f64,
        until_s: f64,
    ) {
        // An aggregated engine's prompt also pays the decode step of each chunk.
        let ride_along_s = match self.chunk_tokens {
            Some(_) if !self.decoding.is_empty() && self.decode_engines > 0 => {
                let active = self.decoding.len() as f64;
                model.itl_s(active / f64::from(self.decode_engines), self.kv_tokens / active)
            }
            _ => 0.0,
        };
        while let Some(job) = self.prefill_queue.front().copied() {
            let Some((index, engine)) = self
                .prefill_engines
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.free_at.total_cmp(&b.1.free_at))
            else {
                break;
            };
            let begin = engine.free_at.max(job.arrival_s).max(start);
            if begin >= until_s {
                break;
            }
            let prompt_s = model.prefill_time_s(job.isl);
            let chunks = self
                .chunk_tokens
                .map_or(0.0, |chunk| (job.isl / chunk).ceil().max(1.0));
            let service = prompt_s + chunks * ride_along_s;
            self.prefill_engines[index] = PrefillEngine {
                free_at: begin + service,
                isl: job.isl,
            };
            self.prefill_work_started_s += service;
            self.prefilling.push(Prefilled {
                job,
                begin_s: begin,
                done_s: begin + service,
                prompt_share: if service > 0.0 { prompt_s / service } else { 1.0 },
            });
            self.prefill_queue.pop_front();
        }
    }

    /// Aggregated engines: how much slower decode tokens come for the share of the engines'
    /// time this step spends on prompt tokens (1 for a disaggregated deployment).
    fn decode_stretch(&self, start: f64, until_s: f64) -> f64 {
        match self.chunk_tokens {
            Some(_) if self.decode_engines > 0 => {
                let prompt_s: f64 = self
                    .prefilling
                    .iter()
                    .map(|p| (p.done_s.min(until_s) - p.begin_s.max(start)).max(0.0) * p.prompt_share)
                    .sum();
                let share = prompt_s / (f64::from(self.decode_engines) * (until_s - start));
                1.0 / (1.0 - share.clamp(0.0, MAX_PROMPT_SHARE))
            }
            _ => 1.0,
        }
    }

    /// Requests whose prefill ends before `until_s` line up for decode, in the order they end.
    fn finish_prefills(&mut self, until_s: f64) {
        let mut finished: Vec<Prefilled> = Vec::new();
        self.prefilling.retain(|p| {
            if p.done_s < until_s {
                finished.push(*p);
                false
            } else {
                true
            }
        });
        finished.sort_by(|a, b| a.done_s.total_cmp(&b.done_s));
        self.decode_queue.extend(finished);
    }

    /// Admission to decode while the pool's KV cache has room (an empty pool always admits, so
    /// a prompt longer than the cache cannot block the queue forever): the first token.
    fn admit_to_decode<C: PerformanceCurves>(
        &mut self,
        model: &LatencyModel<'_, C>,
        start: f64,
        observer: &mut impl Observer,
    ) {
        let capacity = f64::from(self.decode_engines) * model.spec.max_kv_tokens;
        while let Some(next) = self.decode_queue.front().copied() {
            if self.decode_engines == 0 {
                break;
            }
            let need = next.job.isl + 1.0;
            if !self.decoding.is_empty() && self.kv_tokens + need > capacity {
                break;
            }
            self.decode_queue.pop_front();
            let ready = next.done_s.max(start);
            let ttft = ready - next.job.arrival_s;
            observer.first_token(&next.job, ready, ttft);
            if next.job.osl <= 1.0 {
                observer.completed(
                    &next.job,
                    ready,
                    &Outcome {
                        ttft_s: ttft,
                        mean_itl_s: None,
                        duration_s: ttft,
                    },
                );
                continue;
            }
            self.kv_tokens += need;
            self.decoding.push(Decoding {
                job: next.job,
                ready_s: ready,
                ttft_s: ttft,
                generated: 1.0,
                itl_sum_s: 0.0,
            });
        }
    }

    /// Decode: every running request advances at the ITL of the pool's current load (times
    /// `stretch`), those reaching their output length complete.
    fn decode<C: PerformanceCurves>(
        &mut self,
        model: &LatencyModel<'_, C>,
        (start, until_s): (f64, f64),
        stretch: f64,
        observer: &mut impl Observer,
    ) {
        if self.decoding.is_empty() || self.decode_engines == 0 {
            return;
        }
        let active = self.decoding.len() as f64;
        let concurrency = active / f64::from(self.decode_engines);
        let context = self.kv_tokens / active;
        let itl = model.itl_s(concurrency, context) * stretch;
        let mut kv_tokens = 0.0;
        self.decoding.retain_mut(|r| {
            let from = r.ready_s.max(start);
            let available = until_s - from;
            let remaining = r.job.osl - r.generated;
            let possible = available / itl;
            if possible >= remaining {
                let at = from + remaining * itl;
                r.itl_sum_s += remaining * itl;
                observer.tokens(&r.job, at, remaining, itl);
                let tokens_after_first = r.job.osl - 1.0;
                observer.completed(
                    &r.job,
                    at,
                    &Outcome {
                        ttft_s: r.ttft_s,
                        mean_itl_s: Some(r.itl_sum_s / tokens_after_first),
                        duration_s: at - r.job.arrival_s,
                    },
                );
                false
            } else {
                if possible > 0.0 {
                    r.generated += possible;
                    r.itl_sum_s += possible * itl;
                    observer.tokens(&r.job, until_s, possible, itl);
                }
                kv_tokens += r.job.isl + r.generated;
                true
            }
        });
        self.kv_tokens = kv_tokens;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::float_cmp)]
    use super::*;
    use planner_core::interpolation::DecodeOperatingPoint;

    /// Prefill takes 100 ms per 1000 tokens; ITL is 10 ms plus 1 ms per concurrent request.
    pub(crate) struct Linear;

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
    }

    #[derive(Default)]
    struct Log {
        ttft: Vec<(usize, f64)>,
        done: Vec<(usize, f64, Outcome)>,
        tokens: f64,
    }

    impl Observer for Log {
        fn first_token(&mut self, job: &Job, _: f64, ttft: f64) {
            self.ttft.push((job.id, ttft));
        }
        fn tokens(&mut self, _: &Job, _: f64, count: f64, _: f64) {
            self.tokens += count;
        }
        fn completed(&mut self, job: &Job, at: f64, outcome: &Outcome) {
            self.done.push((job.id, at, *outcome));
        }
    }

    fn spec() -> EngineSpec {
        EngineSpec {
            max_kv_tokens: 1e6,
            max_profiled_isl: 8000.0,
        }
    }

    fn job(id: usize, arrival_s: f64, isl: f64, osl: f64) -> Job {
        Job {
            id,
            arrival_s,
            isl,
            osl,
        }
    }

    fn run(cluster: &mut Cluster, jobs: &[Job], until: f64, log: &mut Log) {
        let model = LatencyModel::new(&Linear, spec());
        for j in jobs {
            cluster.arrive(*j);
        }
        let mut t = cluster.now_s();
        while t < until {
            t += 1.0;
            cluster.advance(&model, t, log);
        }
    }

    #[test]
    fn one_request_alone_gets_the_profiled_latencies() {
        let mut cluster = Cluster::new(0.0, 1, 1);
        let mut log = Log::default();
        // 2000 tokens: 200 ms of prefill; 101 tokens: 100 gaps of 11 ms (1 request per engine).
        run(&mut cluster, &[job(0, 0.5, 2000.0, 101.0)], 3.0, &mut log);
        assert_eq!(log.ttft.len(), 1);
        assert!((log.ttft[0].1 - 0.2).abs() < 1e-12);
        let (id, at, outcome) = log.done[0];
        assert_eq!(id, 0);
        assert!((at - (0.5 + 0.2 + 100.0 * 0.011)).abs() < 1e-9, "{at}");
        assert!((outcome.mean_itl_s.unwrap() - 0.011).abs() < 1e-12);
        assert!((log.tokens - 100.0).abs() < 1e-9);
        assert!(cluster.is_idle());
    }

    #[test]
    fn prefill_queue_is_fifo_over_engines() {
        // Four 1000-token prompts (100 ms each) at t=0 on two engines: 0.1, 0.1, 0.2, 0.2.
        let mut cluster = Cluster::new(0.0, 2, 4);
        let mut log = Log::default();
        let jobs: Vec<Job> = (0..4).map(|i| job(i, 0.0, 1000.0, 1.0)).collect();
        run(&mut cluster, &jobs, 1.0, &mut log);
        let ttfts: Vec<f64> = log.ttft.iter().map(|t| (t.1 * 1e9).round() / 1e9).collect();
        assert_eq!(ttfts, vec![0.1, 0.1, 0.2, 0.2]);
        // Single-token responses complete at their first token, without an ITL.
        assert!(log.done.iter().all(|d| d.2.mean_itl_s.is_none()));
    }

    #[test]
    fn queueing_carries_across_steps_and_new_engines_take_work() {
        // 30 prompts of 1250 tokens (0.125 s each) at t=0 on one engine would need 3.75 s.
        // In the first second 8 start (the 8th ends exactly at 1 s); from t=1 a second engine
        // halves what is left: 22 prompts, 11 each, done at 1 + 11 * 0.125 = 2.375 s.
        let model = LatencyModel::new(&Linear, spec());
        let mut cluster = Cluster::new(0.0, 1, 1);
        let mut log = Log::default();
        for i in 0..30 {
            cluster.arrive(job(i, 0.0, 1250.0, 1.0));
        }
        cluster.advance(&model, 1.0, &mut log);
        assert_eq!(log.ttft.len(), 7);
        assert_eq!(cluster.snapshot().prefill_queue, 22);
        cluster.set_prefill_engines(2);
        cluster.advance(&model, 2.0, &mut log);
        cluster.advance(&model, 3.0, &mut log);
        assert_eq!(log.ttft.len(), 30);
        assert_eq!(log.ttft.last().unwrap().1, 2.375);
    }

    #[test]
    fn kv_cache_full_delays_the_first_token() {
        let model = LatencyModel::new(
            &Linear,
            EngineSpec {
                max_kv_tokens: 1500.0,
                max_profiled_isl: 8000.0,
            },
        );
        let mut cluster = Cluster::new(0.0, 2, 1);
        let mut log = Log::default();
        // Two 1000-token prompts: only one fits in the 1500-token cache until the first ends.
        cluster.arrive(job(0, 0.0, 1000.0, 11.0));
        cluster.arrive(job(1, 0.0, 1000.0, 11.0));
        for t in 1..=3 {
            cluster.advance(&model, f64::from(t), &mut log);
        }
        assert_eq!(log.ttft[0], (0, 0.1));
        assert_eq!(
            log.ttft[1],
            (1, 1.0),
            "admitted at the next step, when the cache has room"
        );
    }

    #[test]
    fn long_prompts_scale_linearly_past_the_profile() {
        let model = LatencyModel::new(&Linear, spec());
        assert_eq!(model.prefill_time_s(8000.0), 0.8);
        assert_eq!(model.prefill_time_s(16_000.0), 1.6);
        assert_eq!(model.itl_s(4.0, 100.0), 0.014);
    }

    #[test]
    fn no_engines_means_waiting_not_failing() {
        let model = LatencyModel::new(&Linear, spec());
        let mut cluster = Cluster::new(0.0, 0, 0);
        cluster.arrive(job(0, 0.0, 100.0, 5.0));
        cluster.advance(&model, 1.0, &mut ());
        assert_eq!(cluster.snapshot().prefill_queue, 1);
        assert_eq!(cluster.prefill_pending_count(), 1);
        cluster.set_prefill_engines(1);
        cluster.advance(&model, 2.0, &mut ());
        assert_eq!(cluster.snapshot().decode_queue, 1);
        // Prefilled, waiting for decode: no first token yet, but no prefill work either.
        assert_eq!(cluster.waiting_for_first_token_count(), 1);
        assert_eq!(cluster.prefill_pending_count(), 0);
        cluster.set_decode_engines(1);
        let mut log = Log::default();
        cluster.advance(&model, 3.0, &mut log);
        assert_eq!(log.ttft, vec![(0, 2.0)]);
        assert_eq!(log.done.len(), 1);
    }

    #[test]
    fn aggregated_engines_share_steps_between_prompts_and_decode() {
        let model = LatencyModel::new(&Linear, spec());
        let engine = AggregatedEngine { chunk_tokens: 1000.0 };
        // One engine decoding one request (ITL 11 ms alone), then a 2000-token prompt (200 ms
        // of prefill, two chunks) arrives.
        let run = |aggregated: Option<&AggregatedEngine>| {
            let mut cluster = Cluster::new(0.0, 1, 1).aggregated(aggregated);
            let mut log = Log::default();
            cluster.arrive(job(0, 0.0, 10.0, 1000.0));
            cluster.advance(&model, 1.0, &mut log);
            cluster.arrive(job(1, 1.0, 2000.0, 2.0));
            cluster.advance(&model, 2.0, &mut log);
            let ttft = log.ttft.iter().find(|(id, _)| *id == 1).unwrap().1;
            (ttft, log.tokens)
        };
        let (ttft_split, tokens_split) = run(None);
        let (ttft_agg, tokens_agg) = run(Some(&engine));
        // Disaggregated: the prompt alone, 200 ms.
        assert!((ttft_split - 0.2).abs() < 1e-9, "{ttft_split}");
        // Aggregated: plus the decode step of each of its two chunks (11 ms each).
        assert!((ttft_agg - (0.2 + 2.0 * 0.011)).abs() < 1e-9, "{ttft_agg}");
        // And the running request decoded fewer tokens in the second it shared: its engine
        // spent 200 ms of it on the prompt.
        assert!(tokens_agg < tokens_split - 10.0, "{tokens_agg} vs {tokens_split}");
    }
}
