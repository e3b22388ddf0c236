//! Replays a request trace through the latency model as time passes, at a rate scale that may
//! change while it runs (pure; the caller supplies the clock and the capacity).

use planner_core::{aggregated::AggregatedEngine, interpolation::PerformanceCurves};
use planner_sim_engine::latency::{Cluster, LatencyModel, Observer, Snapshot};

use crate::sim::trace::{Arrivals, Request};

/// The replay's state.
#[derive(Debug)]
pub struct Replay {
    arrivals: Arrivals,
    step_s: f64,
    cluster: Cluster,
    now_s: f64,
}

impl Replay {
    /// A replay of `base` (sorted, relative times) starting at time 0, stepping `step_s`.
    pub fn new(base: Vec<Request>, jitter_s: f64, looping: bool, step_s: f64) -> Self {
        Self {
            arrivals: Arrivals::new(base, jitter_s, looping),
            step_s: if step_s.is_finite() && step_s > 0.0 {
                step_s
            } else {
                1.0
            },
            cluster: Cluster::new(0.0, 0, 0),
            now_s: 0.0,
        }
    }

    /// Trace time reached.
    pub fn now_s(&self) -> f64 {
        self.now_s
    }

    /// Whether the trace is over and every request has completed (never, when looping).
    pub fn finished(&self) -> bool {
        self.arrivals.exhausted() && self.cluster.is_idle()
    }

    /// The model's state.
    pub fn snapshot(&self) -> Snapshot {
        self.cluster.snapshot()
    }

    /// The same replay on aggregated engines (`Some`), or disaggregated pools.
    pub fn aggregated(mut self, engine: Option<&AggregatedEngine>) -> Self {
        self.cluster = self.cluster.aggregated(engine);
        self
    }

    /// Advances whole steps up to `t_s` (trace time) with `prefill` and `decode` engines
    /// serving and rate scale `k`, reporting to `observer`.
    pub fn advance_to<C: PerformanceCurves>(
        &mut self,
        t_s: f64,
        k: f64,
        prefill: u32,
        decode: u32,
        model: &LatencyModel<'_, C>,
        observer: &mut impl Observer,
    ) {
        if self.cluster.prefill_engines() != prefill {
            self.cluster.set_prefill_engines(prefill);
        }
        if self.cluster.decode_engines() != decode {
            self.cluster.set_decode_engines(decode);
        }
        while self.now_s + self.step_s <= t_s + 1e-9 {
            let until = self.now_s + self.step_s;
            while let Some(job) = self.arrivals.next_before(until, k) {
                // A copy jittered into an earlier step than its original's arrival is
                // still fine: the model starts it no earlier than the current step.
                observer.arrived(&job);
                self.cluster.arrive(job);
            }
            self.cluster.advance(model, until, observer);
            self.now_s = until;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use planner_core::interpolation::DecodeOperatingPoint;
    use planner_sim_engine::latency::{EngineSpec, Job, Outcome};

    struct Flat;
    impl PerformanceCurves for Flat {
        fn prefill_ttft_ms(&self, _: f64) -> f64 {
            100.0
        }
        fn prefill_thpt_per_gpu(&self, isl: f64) -> f64 {
            isl * 10.0
        }
        fn decode_itl_ms(&self, _: f64, _: f64) -> f64 {
            10.0
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
    struct Count {
        done: usize,
        ttft_sum: f64,
    }
    impl Observer for Count {
        fn completed(&mut self, _: &Job, _: f64, outcome: &Outcome) {
            self.done += 1;
            self.ttft_sum += outcome.ttft_s;
        }
    }

    fn trace() -> Vec<Request> {
        (0..10)
            .map(|i| Request {
                arrival_s: f64::from(i),
                isl: 500.0,
                osl: 11.0,
            })
            .collect()
    }

    #[test]
    fn replays_in_steps_at_the_rate_scale_and_loops() {
        let spec = EngineSpec {
            max_kv_tokens: 1e6,
            max_profiled_isl: 1e6,
        };
        let model = LatencyModel::new(&Flat, spec);
        let mut replay = Replay::new(trace(), 0.5, false, 1.0);
        let mut count = Count::default();
        replay.advance_to(5.0, 2.0, 1, 1, &model, &mut count);
        // Arrivals at 0..4 s, two copies each within 0.5 s: all served by t=5.
        assert_eq!(count.done, 10);
        assert!((count.ttft_sum / 10.0) < 0.25);
        replay.advance_to(20.0, 1.0, 1, 1, &model, &mut count);
        assert_eq!(count.done, 15);
        assert!(replay.finished());

        let mut looping = Replay::new(trace(), 0.0, true, 1.0);
        let mut count = Count::default();
        // A loop lasts 10 s (last arrival at 9 s, plus 1 s): by 33 s, arrivals 0..=32.
        looping.advance_to(33.0, 1.0, 1, 1, &model, &mut count);
        assert_eq!(count.done, 33);
        assert!(!looping.finished());
    }

    #[test]
    fn no_capacity_queues_until_pods_are_ready() {
        let spec = EngineSpec {
            max_kv_tokens: 1e6,
            max_profiled_isl: 1e6,
        };
        let model = LatencyModel::new(&Flat, spec);
        let mut replay = Replay::new(trace(), 0.0, false, 1.0);
        let mut count = Count::default();
        replay.advance_to(10.0, 1.0, 0, 0, &model, &mut count);
        assert_eq!(count.done, 0);
        assert_eq!(replay.snapshot().prefill_queue, 10);
        replay.advance_to(12.0, 1.0, 1, 1, &model, &mut count);
        assert_eq!(count.done, 10);
    }
}
