//! Hand-computable workloads, and the overload recovery the queueing planner must pass with any
//! settings it ships (its tests and `planner-sim tune` check it).
//!
//! The curves are flat so every number can be worked out on paper: prefill takes 100 ms per
//! request on one engine (10 requests/s per engine), every output token after the first takes
//! 10 ms, whatever the load.

use planner_core::{
    interpolation::{DecodeOperatingPoint, PerformanceCurves},
    predictor::PredictorKind,
    state::{QueueingConfig, SlaModel},
};

use super::{
    latency::{EngineSpec, LatencyModel},
    policy::LoopPolicy,
    run::{Policy, SimConfig, View, run},
    trace::Request,
};

/// Flat curves, consistent with the planner's formulas: prefill throughput is `isl / 0.1 s`
/// per GPU, decode delivers 1000 tokens/s per GPU (10 requests at 10 ms).
pub struct Flat;

impl PerformanceCurves for Flat {
    fn prefill_ttft_ms(&self, _: f64) -> f64 {
        100.0
    }
    fn prefill_thpt_per_gpu(&self, isl: f64) -> f64 {
        isl / 0.1
    }
    fn decode_itl_ms(&self, _: f64, _: f64) -> f64 {
        10.0
    }
    fn decode_best_point(&self, itl_ms: f64, _: f64) -> DecodeOperatingPoint {
        DecodeOperatingPoint {
            thpt_per_gpu: 1000.0,
            itl_ms: itl_ms.min(10.0),
            kv_usage: 0.5,
        }
    }
}

/// Engines of the flat model: KV cache and prompts never limit.
pub const FLAT_SPEC: EngineSpec = EngineSpec {
    max_kv_tokens: 1e7,
    max_profiled_isl: 1e6,
};

/// The latency model of the flat curves.
pub fn flat_model() -> LatencyModel<'static, Flat> {
    LatencyModel::new(&Flat, FLAT_SPEC)
}

/// `rate` requests/s of 1000 prompt and 11 output tokens (100 ms TTFT, 10 gaps of 10 ms),
/// evenly spaced over `[from, to)`.
pub fn constant(rate: f64, from: f64, to: f64) -> Vec<Request> {
    let n = ((to - from) * rate).round() as usize;
    (0..n)
        .map(|i| Request {
            arrival_s: from + i as f64 / rate,
            isl: 1000.0,
            osl: 11.0,
        })
        .collect()
}

/// A change of replicas: time, replicas before and after, requests waiting beyond the
/// prefill engines.
pub type Change = (f64, (u32, u32), (u32, u32), f64);

/// Wraps a policy and records, for each change of replicas, the target before it and the
/// requests waiting for or in prefill beyond those the prefill engines hold.
pub struct Watch<P> {
    /// The policy watched.
    pub inner: P,
    /// Its changes, in order.
    pub changes: Vec<Change>,
}

impl<C: PerformanceCurves, P: Policy<C>> Policy<C> for Watch<P> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn next_wake_s(&self) -> f64 {
        self.inner.next_wake_s()
    }
    fn wake(&mut self, view: &mut View<'_, C>) -> Option<(u32, u32)> {
        let decision = self.inner.wake(view);
        if let Some(target) = decision.filter(|t| *t != view.asked) {
            let waiting = view.cluster.prefill_pending_count() as f64;
            let backlog = (waiting - f64::from(view.cluster.prefill_engines())).max(0.0);
            self.changes.push((view.now_s, view.asked, target, backlog));
        }
        decision
    }
    fn applied(&mut self, now_s: f64, from: (u32, u32), to: (u32, u32), serving: (u32, u32)) {
        self.inner.applied(now_s, from, to, serving);
    }
}

/// The queueing planner with ARIMA (`sla-arima`) and these settings.
pub fn queueing_policy(config: &SimConfig, settings: &QueueingConfig) -> LoopPolicy {
    let config = SimConfig {
        queueing: settings.clone(),
        ..config.clone()
    };
    LoopPolicy::sla(&config, SlaModel::Queueing, PredictorKind::Arima, true, false)
}

/// Overload recovery: 8 requests/s settle the planner on its own pool; at t=300 arrivals step
/// to four times what that pool can serve (10 requests/s per prefill engine). `Ok` when the
/// planner scales out within two intervals of the step to enough prefill engines, TTFT is back
/// under the target by the third interval after it and stays there, and no pool scaled down
/// while a backlog remained; otherwise the first of these that failed.
pub fn overload_recovery(settings: &QueueingConfig) -> Result<(), String> {
    let config = SimConfig::default();
    let base = constant(8.0, 0.0, 300.0);
    let settled = run(
        &base,
        &flat_model(),
        &config,
        &mut queueing_policy(&config, settings),
        Some((1, 1)),
    );
    let pool = settled.intervals.last().map_or(1.0, |i| i.prefill_serving);
    if pool < 1.0 {
        return Err(format!("{pool} prefill engines serve before the step"));
    }
    let step = 4.0 * pool * 10.0;
    let mut requests = base.clone();
    requests.extend(constant(step, 300.0, 900.0));
    let mut watch = Watch {
        inner: queueing_policy(&config, settings),
        changes: Vec::new(),
    };
    let result = run(&requests, &flat_model(), &config, &mut watch, Some((1, 1)));

    // The first three intervals behave exactly as without the step.
    if result.intervals.get(..4) != settled.intervals.get(..4) {
        return Err("the intervals before the step differ from the run without it".into());
    }
    // Scaled out within two intervals of the step (the fast path acts within seconds) ...
    let first_out = watch
        .changes
        .iter()
        .find(|(t, before, after, _)| *t > 300.0 && after.0 > before.0)
        .map(|c| c.0);
    if !first_out.is_some_and(|t| t <= 420.0) {
        return Err(format!("no prefill scale-out by 420 s: {:?}", watch.changes));
    }
    // ... to enough prefill engines for the new rate.
    let serving = result.intervals.get(7).map_or(0.0, |i| i.prefill_serving);
    if serving * 10.0 <= step {
        return Err(format!(
            "{serving} prefill engines serve the third interval after the step, for {step} requests/s"
        ));
    }
    // TTFT back under the target by the third interval after the step, and from then on.
    if let Some(late) = result
        .intervals
        .iter()
        .skip(7)
        .find(|record| record.ttft_ms.is_nan() || record.ttft_ms > config.sla.ttft_ms)
    {
        return Err(format!(
            "TTFT {:.0} ms in the interval from {} s, over the {} ms target",
            late.ttft_ms, late.start_s, config.sla.ttft_ms
        ));
    }
    // No scale-down while a backlog remained (more waiting than the engines clear within the
    // TTFT target: 0.1 s each).
    for (t, before, after, backlog) in &watch.changes {
        if after.0 < before.0 || after.1 < before.1 {
            let engines = f64::from(before.0.min(after.0).max(1));
            if backlog * 0.1 / engines > 0.5 {
                return Err(format!("scale-down at {t} s with {backlog} requests waiting"));
            }
        }
    }
    Ok(())
}
